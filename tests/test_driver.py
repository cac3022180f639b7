"""Driver behaviour beyond the CLI: multi-fidelity early stopping with a real command runner."""

import sys
from pathlib import Path

from tuner.driver import Driver
from tuner.executors import make_executor
from tuner.runners import make_runner
from tuner.search import make_searcher
from tuner.space import SearchSpace
from tuner.specs import make_workload
from tuner.store import StudyRecord, open_store
from tuner.trial import Status

TRAINER = Path(__file__).parent / "fixtures" / "progress_trainer.py"


def test_clearly_worse_trial_is_stopped_after_warmup(tmp_path):
    w = make_workload("tiny", 1, "local")      # 2 "GPUs"
    sp = SearchSpace.from_dict({"dimensions": {"tp": [1, 2], "pp": [1], "micro_batch": [1], "zero_stage": [0],
                                               "activation_checkpointing": [False]}})
    store = open_store(f"sqlite:///{tmp_path / 'd.db'}")
    store.create_study(StudyRecord(name="es", workload=w.as_dict(), space={}, searcher="grid", runner="command"))
    runner = make_runner("command", command=f"{sys.executable} {TRAINER}", results_dir=tmp_path, trial_timeout=60)
    runner.poll_interval = 0.1
    d = Driver(store=store, study="es", workload=w, runner=runner, executor=make_executor("thread", 1),
               searcher=make_searcher("grid", sp.enumerate_layouts(w)), budget=5, results_dir=tmp_path,
               early_stop=0.5, prune=False)
    out = d.run()
    assert out.reason == "exhausted" and out.ran == 2
    by_tp = {t.layout.tp: t for t in store.trials("es")}
    assert by_tp[1].status == Status.OK and by_tp[1].samples_per_second == 10.0
    slow = by_tp[2]
    assert slow.status == Status.STOPPED and "stopped early" in slow.message
    assert slow.samples_per_second == 1.0                   # the partial measurement is kept
    lines = (Path(slow.log_path) / "progress.jsonl").read_text().splitlines()
    assert 2 <= len(lines) < 12                             # stopped after warm-up, before the end
