"""A search over several node counts (`tuner search --nodes 32,64`, issue 27 item 6): linked studies.

One study per node count, named GROUP-32n, GROUP-64n, each a whole study as any other (its own workload,
trials, lease, budget and report), so that `tuner best`, `tuner scale`, `tuner trials` and `tuner report`
read them as they read any study. Each member's settings carry `linked` (every member's name, in the order
they run) and `group` (GROUP). What links them:

- they are created together: every member is checked (tuner.study.check) before any is stored;
- they run one after another, `budget` trials each (a few per count measure the curve's shape);
- the guided searcher of each learns from the other members' measured trials (study.searcher_for reads
  them: study.linked_history): the model's correction learned at 32 nodes is its prior at 64. A simulated trial is the
  model's own prediction, so with the simulator there is nothing to carry over (correction.warm_start_records
  leaves such trials out, as --warm-start does); other searchers do not read history;
- `tuner resume GROUP` continues every member in order (`members`); `tuner resume GROUP-64n` one of them.

`curve` is the measured shape: per node count the fastest trial, its per-GPU rate over the first count's.
"""

from __future__ import annotations

import dataclasses

from tuner.errors import UsageError
from tuner.store import StudyRecord


def member_name(group: str, nodes: int) -> str:
    return f"{group}-{nodes}n"


def records(build, group: str, counts: tuple[int, ...], taken: set[str]) -> list[StudyRecord]:
    """The members of `group`, one per node count: `build(nodes, name)` makes each study record (as a single
    `tuner search` would), linked here. UsageError when a name is taken (nothing is stored)."""
    names = [member_name(group, n) for n in counts]
    for name in [group, *names]:
        if name in taken:
            raise UsageError(f"study '{name}' exists: continue it with `tuner resume {name}` (a multi-node search: "
                             f"`tuner resume {group}`), or pick another name with --study")
    out = []
    for name, n in zip(names, counts):
        rec = build(n, name)
        out.append(dataclasses.replace(rec, settings={**rec.settings, "linked": names, "group": group}))
    return out


def create(store, recs: list[StudyRecord]) -> list[StudyRecord]:
    """Check every member, then store them all (a count where nothing fits refuses the whole search)."""
    from tuner import study as studies
    for rec in recs:
        try:
            studies.check(rec)
        except UsageError as exc:
            raise UsageError(f"at {rec.nodes} node(s): {exc}") from None
    for rec in recs:
        store.create_study(rec)
    return [store.get_study(rec.name) for rec in recs]


def names(store) -> set[str]:
    """Every group's name: no single study may take one (`tuner resume NAME` would no longer reach the group)."""
    return {g for st in store.list_studies() if (g := (st.settings or {}).get("group"))}


def members(store, name: str) -> list[StudyRecord]:
    """The members of group `name` in the order they run ([] when `name` is no group)."""
    found = [st for st in store.list_studies() if (st.settings or {}).get("group") == name]
    if not found:
        return []
    order = found[0].settings.get("linked") or []
    return sorted(found, key=lambda st: order.index(st.name) if st.name in order else len(order))


def curve(store, recs: list[StudyRecord]) -> list[dict]:
    """Per member: its node count, fastest trial (layout, samples/s, MFU), whether it was measured (not
    simulated), and per-GPU efficiency against the first member that has a trial."""
    from tuner import study as studies
    from tuner.correction import simulated
    rows, base = [], None
    for rec in recs:
        fast = studies.fastest(store, rec.name)
        t = fast[0] if fast else None
        per_gpu = t.samples_per_second / (rec.nodes * rec.workload["cluster"]["gpus_per_node"]) if t else None
        base = base if base is not None or per_gpu is None else per_gpu
        rows.append({"nodes": rec.nodes, "study": rec.name, "trials": len(store.trials(rec.name)),
                     "layout": t.layout.key() if t else None, "trial": t.number if t else None,
                     "samples_per_second": t.samples_per_second if t else None, "mfu": t.mfu if t else None,
                     "efficiency": per_gpu / base if per_gpu is not None else None,
                     "measured": bool(t) and not simulated(t, {rec.name: rec})})
    return rows
