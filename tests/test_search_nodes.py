"""`tuner search --nodes 32,64` (issue 27 item 6): linked studies, one per node count, that share what the guided
searcher learns, resume as a group, and answer `tuner best` / `tuner scale` at their counts."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

WORLD = Path(__file__).parent / "fixtures" / "perturbed_world.py"
# a measured world the model gets wrong (GEMMs 20 % slower than the cluster file says): the command runner's
# trials are measurements, not the model's own prediction
MEASURED = ["--runner", "command", "--command",
            f"{shlex.quote(sys.executable)} {WORLD} --perturb '{json.dumps({'matmul_efficiency': 0.8, 'seed': 3})}'"]


@pytest.mark.parametrize("nodes", ["2,abc", "0,4", "4:2", "2,,4", ""])
def test_a_bad_node_list_is_one_line_exit_2_and_stores_nothing(tuner, nodes):
    code, out, err = tuner("search", "--model", "22b", "--nodes", nodes, "--budget", "2")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"error: Invalid value for '--nodes': {nodes!r}: give one count")
    assert "Traceback" not in err
    assert not Path("tuner.db").exists()                          # checked before the store is opened


def test_a_study_toml_or_the_library_takes_one_count_and_says_where_several_go():
    import tuner as lib
    from tuner.errors import UsageError
    with pytest.raises(UsageError, match=r"^nodes = 4,8: a study runs at one node count; .*`tuner search --nodes 32,64`"):
        lib.create_study(model="22b", nodes="4,8")


def test_a_count_where_nothing_fits_refuses_the_whole_search_before_anything_is_stored(tuner):
    code, out, err = tuner("search", "--model", "llama3-70b", "--cluster", "h100", "--nodes", "1,8", "--study", "big")
    assert code == 2 and err.startswith("error: at 1 node(s): none of") and "--nodes 4" in err
    code, out, _ = tuner("resume", "big-8n")
    assert code == 2                                            # the 8-node member was not stored either


def test_one_linked_study_per_count_with_its_budget_a_curve_and_best_at_each_count(tuner):
    code, out, err = tuner("search", "--model", "22b", "--nodes", "2,4", "--budget", "3", "--study", "g",
                           "--format", "json")
    assert code == 0, err
    got = json.loads(out)
    assert got["group"] == "g" and [s["study"] for s in got["studies"]] == ["g-2n", "g-4n"]
    assert [s["ran"] for s in got["studies"]] == [3, 3]
    curve = {r["nodes"]: r for r in got["curve"]}
    assert curve[2]["efficiency"] == 1.0 and 0.5 < curve[4]["efficiency"] < 1.2
    assert not curve[2]["measured"] and not curve[4]["measured"]          # the simulator: the model's own
    # the members are ordinary studies: best at each count answers with the member's fastest trial
    code, out, err = tuner("best", "--model", "22b", "--nodes", "4", "--format", "json")
    assert code == 0, err
    answer = json.loads(out)
    assert (answer["study"], answer["trial"]) == ("g-4n", curve[4]["trial"]) and answer["simulated"]
    # the settings say what links them; `tuner resume GROUP` raises every member's budget and runs it
    code, out, err = tuner("resume", "g", "--budget", "4", "--format", "json")
    assert code == 0, err
    assert [s["ran"] for s in json.loads(out)["studies"]] == [1, 1]
    assert [r["trials"] for r in json.loads(out)["curve"]] == [4, 4]
    code, _, err = tuner("search", "--model", "22b", "--nodes", "2,4", "--study", "g")
    assert code == 2 and "`tuner resume g`" in err


def test_measured_trials_carry_over_and_scale_answers_with_them(tuner):
    code, out, err = tuner("search", "--model", "22b", "--nodes", "2,4", "--budget", "2", "--study", "m", *MEASURED)
    assert code == 0, err
    assert "m-4n: 2 measured trial(s) of the linked studies at 2 node(s) correct the model" in err
    from tuner import study as studies
    from tuner.specs import Workload
    from tuner.store import open_store
    with open_store(tuner.db) as store:
        rec = store.get_study("m-4n")
        w = Workload.from_dict(rec.workload)
        searcher = studies.searcher_for(store, rec, w, studies.runnable_layouts(rec, w, studies.SearchSpace.from_record(rec.space)))
        assert len(searcher.history.y) == 2                  # the 2-node member's measurements, as its prior
        alone = studies.searcher_for(store, studies.new_record("x", w, studies.SearchSpace.from_record(rec.space)),
                                     w, searcher.candidates)
        assert len(alone.history.y) == 0
    code, out, err = tuner("scale", "--model", "22b", "--nodes", "2,4,8", "--tokens", "1e11", "--jobs", "1",
                           "--format", "json")
    assert code == 0, err
    rows = {r["nodes"]: r for r in json.loads(out)}
    assert rows[2]["measured"] and rows[4]["measured"] and not rows[8]["measured"]
    assert "measured: study m-4n" in rows[4]["source"]
    assert "corrected by measurements" in rows[8]["source"]


def test_an_interrupted_group_names_the_group_to_resume_and_resume_runs_the_counts_left(tuner, monkeypatch):
    from tuner import study as studies
    from tuner.driver import Interrupted
    real = studies.run

    def ctrl_c_at_4(store, rec, **kw):
        if rec.name.endswith("-4n"):
            raise Interrupted(f"interrupted: 0 running trial(s) marked interrupted; continue with `tuner resume {rec.name}`")
        return real(store, rec, **kw)

    monkeypatch.setattr(studies, "run", ctrl_c_at_4)
    code, out, err = tuner("search", "--model", "22b", "--nodes", "2,4", "--budget", "2", "--study", "i")
    assert code == 130 and "the whole multi-node search: `tuner resume i`" in err
    monkeypatch.setattr(studies, "run", real)
    code, out, err = tuner("resume", "i", "--format", "json")
    assert code == 0, err
    assert [(s["study"], s["ran"]) for s in json.loads(out)["studies"]] == [("i-2n", 0), ("i-4n", 2)]


@pytest.mark.parametrize("signum", [15])       # SIGTERM; Ctrl-C (None) takes the same path
def test_a_signal_between_two_counts_names_the_group_to_resume(tuner, monkeypatch, signum):
    """Ctrl-C or SIGTERM while a count is set up (outside its driver's loop: the searcher reading the other counts'
    trials, the candidates) still says how to continue the whole search, with the signal's exit status."""
    from tuner import study as studies
    from tuner.cli import Terminated
    real = studies.run

    def signal_at_4(store, rec, **kw):
        if rec.name.endswith("-4n"):
            raise Terminated(signum) if signum else KeyboardInterrupt()
        return real(store, rec, **kw)

    monkeypatch.setattr(studies, "run", signal_at_4)
    code, out, err = tuner("search", "--model", "22b", "--nodes", "2,4", "--budget", "1", "--study", "j")
    assert code == (128 + signum if signum else 130)
    assert err.strip().splitlines()[-1].endswith("continue the multi-node search with `tuner resume j`")
    monkeypatch.setattr(studies, "run", real)
    code, out, err = tuner("resume", "j", "--format", "json")
    assert code == 0, err
    assert [(s["study"], s["ran"]) for s in json.loads(out)["studies"]] == [("j-2n", 0), ("j-4n", 1)]


def test_a_single_study_cannot_take_a_groups_name(tuner):
    """`tuner resume g` continues group g: a later `tuner search --study g` at one count would take the name over."""
    code, _, err = tuner("search", "--model", "22b", "--nodes", "2,4", "--budget", "1", "--study", "g")
    assert code == 0, err
    code, out, err = tuner("search", "--model", "22b", "--nodes", "8", "--budget", "1", "--study", "g")
    assert code == 2 and out == "" and err == "error: study 'g' exists: continue it with `tuner resume g`, or pick " \
                                               "another name with --study\n"
    code, out, err = tuner("resume", "g", "--budget", "2", "--format", "json")
    assert code == 0, err
    assert [s["study"] for s in json.loads(out)["studies"]] == ["g-2n", "g-4n"]
