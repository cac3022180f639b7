"""Chaos benchmark (issue 8): inflict the faults, print what survived.

    python benchmarks/chaos.py [--kills 10] [--bad-inputs 60]

- kills survived: the driver (`--sim-delay 0.05 --parallel 2`, random searcher) SIGKILLed at random
  points, resumed after each; trials lost / duplicates / re-measured must be 0 and the final best must
  equal an uninterrupted run with the same seed;
- orphan processes: command trials that hang (a child and a grandchild in its own session) killed at
  --trial-timeout, and the driver interrupted (SIGINT) while they run: processes left must be 0;
  a driver killed with SIGKILL cannot clean up: what it leaves is printed separately;
- orphan Slurm jobs: a Slurm-runner search interrupted with SIGINT while its job is queued or running,
  then `squeue` for the study's jobs (skipped without Slurm);
- bad inputs: the hypothesis generators of tests/test_fuzz.py through predict, plan and search; the
  share of invalid inputs that got a clean one-line error with exit status 2 (and, for search, an
  unchanged store).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from tuner.store import open_store  # noqa: E402
from tuner.trial import Status  # noqa: E402

import test_chaos as chaos  # noqa: E402  (the same helpers the tests use)

PY = sys.executable


def kills(work: Path, n: int, seed: int) -> dict:
    budget = 50
    base_db = f"sqlite:///{work / 'base.db'}"
    r = chaos.tuner_run(["search", *chaos.KILL_SEARCH, "--budget", str(budget), "--study", "base"], work, base_db)
    assert r.returncode == 0, r.stderr
    with open_store(base_db) as s:
        baseline = s.trials("base")
    got = chaos.kill_and_resume(work, "chaos", kills=n, budget=budget, rng=random.Random(seed), max_wait=0.1)
    trials = got["trials"]
    keys = [t.layout.key() for t in trials]
    ran = [t for t in trials if t.status != Status.PRUNED]
    same_best = (chaos.best_of(trials).layout == chaos.best_of(baseline).layout
                 and chaos.best_of(trials).peak_fraction == chaos.best_of(baseline).peak_fraction)
    return {"survived": got["survived"], "lost": len(got["lost"]), "remeasured": len(got["remeasured"]),
            "duplicates": len(keys) - len(set(keys)), "budget_ok": len(ran) == budget,
            "same_layouts": sorted(t.layout.key() for t in ran)
            == sorted(t.layout.key() for t in baseline if t.status != Status.PRUNED),
            "same_best": same_best, "final_rc": got["final"].returncode}


def _wait_for(pred, timeout=60.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False


def _reap(marker: str) -> int:
    left = chaos.procs_with(marker)
    for p in left:
        try:
            p.kill()
        except Exception:
            pass
    return len(left)


def orphans(work: Path) -> dict:
    tiny = [*chaos.TINY, "--runner", "command"]
    db = f"sqlite:///{work / 'orphans.db'}"
    out = {}
    # 1. hung trials killed at --trial-timeout
    m = f"chaos-bench-{uuid.uuid4().hex[:8]}"
    r = chaos.tuner_run(["search", *tiny, "--budget", "2", "--parallel", "2", "--study", "hang", "--trial-timeout",
                         "1.5", "--command", f"{PY} {chaos.CHAOS / 'hang_tree.py'} {m}"], work, db)
    time.sleep(0.3)
    out["timeout"] = _reap(m)
    with open_store(db) as s:
        out["timeout_status"] = sorted({t.status.value for t in s.trials("hang")})
    # 2. Ctrl-C (SIGINT) of the driver while trials hang
    m = f"chaos-bench-{uuid.uuid4().hex[:8]}"
    p = chaos.tuner_proc(["search", *tiny, "--budget", "2", "--parallel", "2", "--study", "int",
                          "--command", f"{PY} {chaos.CHAOS / 'hang_tree.py'} {m}"], work, db)
    _wait_for(lambda: len(list((work / "results/trials/int").glob("*/spawned"))) == 2)
    time.sleep(0.6)
    p.send_signal(signal.SIGINT)
    p.communicate(timeout=60)
    time.sleep(0.3)
    out["sigint"] = _reap(m)
    out["sigint_rc"] = p.returncode
    # 3. SIGKILL of the driver: it cannot clean up; count what is left, then `tuner resume` must reap it
    m = f"chaos-bench-{uuid.uuid4().hex[:8]}"
    p = chaos.tuner_proc(["search", *tiny, "--budget", "1", "--study", "kill9", "--trial-timeout", "3",
                          "--command", f"{PY} {chaos.CHAOS / 'hang_tree.py'} {m}"], work, db)
    _wait_for(lambda: len(list((work / "results/trials/kill9").glob("*/spawned"))) == 1)
    time.sleep(0.3)
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=60)
    time.sleep(0.3)
    out["sigkill_left"] = len(chaos.procs_with(m))
    r = chaos.tuner_proc(["resume", "kill9"], work, db)   # reaps the leftovers, reruns the trial (times out)
    r.communicate(timeout=120)
    time.sleep(0.3)
    out["after_resume"] = _reap(m)
    return out


def slurm_orphans(work: Path) -> str:
    if shutil.which("sinfo") is None or subprocess.run(["sinfo", "-h"], capture_output=True, timeout=20).returncode:
        return "skipped: no Slurm"
    study = f"chaos-slurm-{uuid.uuid4().hex[:6]}"
    db = f"sqlite:///{work / 'slurm.db'}"
    p = chaos.tuner_proc(["search", "--model", "tiny", "--nodes", "1", "--cluster", "local-slurm", "--runner",
                          "slurm", "--searcher", "grid", "--budget", "2", "--study", study], work, db)
    submitted = _wait_for(lambda: any((work / "results/trials" / study).glob("*/job_id")), timeout=90)
    ids = sorted({f.read_text().strip() for f in (work / "results/trials" / study).glob("*/job_id")})
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    time.sleep(2)
    q = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True, timeout=30).stdout
    mine = [line for line in q.splitlines() if f"tuner-{study}-" in line or line.split()[:1] in [[i] for i in ids]]
    if mine:   # clean up what the driver left
        subprocess.run(["scancel", *[line.split()[0] for line in mine]], capture_output=True, timeout=30)
    if not submitted:
        return f"inconclusive: no job was submitted within 90 s (driver exit {p.returncode}: {err.strip()[-200:]})"
    return f"{len(mine)} (job(s) {', '.join(ids)} submitted, driver SIGINT -> exit {p.returncode})"


class _Tally:
    """What bad_inputs counts: runs tried, invalid ones, invalid ones with a clean error, unclean examples."""

    def __init__(self) -> None:
        self.tried = self.invalid = self.clean = 0
        self.bad: list[str] = []

    def judge(self, args, code, out, err, before=None, after=None):
        self.tried += 1
        lines = err.strip().splitlines()
        ok_error = (code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and before == after)
        if code != 0:
            self.invalid += 1
            self.clean += ok_error
        if code != 0 and not ok_error or "Traceback" in err or "internal error" in err:
            if len(self.bad) < 5:
                self.bad.append(f"{args[0]} -> {code}: {err.strip()[-160:]!r}" + ("" if before == after else
                                                                                 f" (store {before} -> {after})"))


def _fuzzed_commands(fuzz, cfg, work: Path, db: str, judge) -> tuple:
    """predict, plan and search run on tests/test_fuzz.py's generated inputs, each run judged."""
    from hypothesis import given, strategies as st

    counter = iter(range(10**9))

    @cfg
    @given(files=fuzz.spec_files(), nodes=fuzz.node_counts, tp=fuzz.cli_ints, pp=fuzz.cli_ints, mb=fuzz.cli_ints)
    def predict(files, nodes, tp, pp, mb):
        args = ["predict", "--model", fuzz.write(work, "m.toml", files[0]), "--cluster",
                fuzz.write(work, "c.toml", files[1]), "--nodes", str(nodes), "--tp", str(tp), "--pp", str(pp),
                "--micro-batch", str(mb)]
        judge(args, *fuzz.run_cli(*args))

    @cfg
    @given(files=fuzz.spec_files(), nodes=fuzz.node_counts, gb=st.none() | fuzz.cli_ints)
    def plan(files, nodes, gb):
        args = ["plan", "--model", fuzz.write(work, "m.toml", files[0]), "--cluster",
                fuzz.write(work, "c.toml", files[1]), "--nodes", str(nodes)]
        args += ["--global-batch", str(gb)] if gb is not None else []
        judge(args, *fuzz.run_cli(*args))

    @cfg
    @given(files=fuzz.spec_files(), nodes=st.one_of(st.integers(-1, 4), st.just(10**6)), gb=st.none() | fuzz.cli_ints)
    def search(files, nodes, gb):
        before = fuzz.counts(db)
        args = ["search", "--model", fuzz.write(work, "m.toml", files[0]), "--cluster",
                fuzz.write(work, "c.toml", files[1]), "--nodes", str(nodes), "--budget", "3", "--db", db,
                "--study", f"fuzz-{next(counter)}", "--searcher", "random"]
        args += ["--global-batch", str(gb)] if gb is not None else []
        code, out, err = fuzz.run_cli(*args)
        after = fuzz.counts(db)
        judge(args, code, out, err, before if code else None, after if code else None)

    return predict, plan, search


def bad_inputs(n: int) -> tuple[int, int, int, list[str]]:
    """(tried, invalid, invalid with a clean error, examples of unclean ones)."""
    os.environ["TUNER_FUZZ_EXAMPLES"] = str(n)
    import test_fuzz as fuzz
    from hypothesis import settings, HealthCheck

    tally = _Tally()
    cfg = settings(max_examples=n, deadline=None, derandomize=True, database=None,
                   suppress_health_check=list(HealthCheck))
    work = Path(tempfile.mkdtemp(prefix="tuner-chaos-fuzz-"))
    db = f"sqlite:///{work / 'fuzz.db'}"
    commands = _fuzzed_commands(fuzz, cfg, work, db, tally.judge)
    old = os.getcwd()
    os.chdir(work)
    try:
        for run in commands:
            run()
    finally:
        os.chdir(old)
        shutil.rmtree(work, ignore_errors=True)
    return tally.tried, tally.invalid, tally.clean, tally.bad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--bad-inputs", type=int, default=60, help="examples per command (predict, plan, search)")
    ap.add_argument("--seed", type=int, default=8)
    a = ap.parse_args()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tuner-chaos-") as d:
        work = Path(d)
        k = kills(work, a.kills, a.seed)
        o = orphans(work)
        s = slurm_orphans(work)
    tried, invalid, clean, bad = bad_inputs(a.bad_inputs)
    print(f"kills survived:          {k['survived']} of {a.kills} (final resume exit {k['final_rc']})")
    print(f"trials lost:             {k['lost']}")
    print(f"finished trials re-run:  {k['remeasured']}")
    print(f"duplicates:              {k['duplicates']}")
    print(f"budget respected:        {'yes' if k['budget_ok'] else 'NO'}")
    print(f"same layouts as uninterrupted run: {'yes' if k['same_layouts'] else 'NO'}; "
          f"same best: {'yes' if k['same_best'] else 'NO'}")
    print(f"orphan processes:        {o['timeout'] + o['sigint']} (hung trials at --trial-timeout: {o['timeout']}, "
          f"status {'/'.join(o['timeout_status'])}; driver SIGINT: {o['sigint']}, exit {o['sigint_rc']})")
    print(f"  after SIGKILL of the driver itself (uncatchable): {o['sigkill_left']} process(es) left running; "
          f"after `tuner resume`: {o['after_resume']}")
    print(f"orphan Slurm jobs:       {s}")
    share = 100.0 * clean / invalid if invalid else 100.0
    print(f"bad inputs tried:        {tried} ({invalid} invalid, {tried - invalid} valid)")
    print(f"clean errors:            {clean} of {invalid} invalid = {share:.1f} %")
    for b in bad:
        print(f"  not clean: {b}")
    print(f"took {time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    main()
