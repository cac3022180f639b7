"""The application layer for studies: create, run, resume and join one. Every front end calls this.

The one place that turns a stored study record into workload + space + searcher + runner + executor +
driver, and that owns a study's state changes (running, done, interrupted). The CLI parses options,
calls these and renders what they return; benchmarks, tests and notebooks call the same functions:

    from tuner import study
    from tuner.store import open_store
    store = open_store("sqlite:///results/tuner.db")
    rec = study.create(store, study.new_record("my-study", make_workload("175b", 16), load_space(), budget=20))
    result = study.run(store, rec)          # result.outcome, result.searcher.confidence, ...
    study.fastest(store, "my-study")        # the recommended trial

Messages a user should see (a warm start's evidence, leftovers cancelled on resume) are logged to
`logging.getLogger("tuner.study")` (the CLI prints the "tuner" logger's INFO and above on stderr).
The documented facade for notebooks and workflows is tuner.api (tuner.create_study / load_study).
"""

from __future__ import annotations

import logging
import random
import re
from dataclasses import dataclass
from pathlib import Path

from tuner import lease
from tuner.best import history, require_fit
from tuner.driver import Driver, Outcome
from tuner.errors import UsageError
from tuner.executors import make_executor
from tuner.predicted import predictions
from tuner.report import ok_trials
from tuner.runners import DEFAULT_TRIAL_TIMEOUT_S, RUNNERS, TrialRunner, make_runner
from tuner.runners.registry import as_runner, lookup, unavailable
from tuner.search import make_searcher
from tuner.search import STUDY_DEFAULTS
from tuner.space import SearchSpace, valid_layouts
from tuner.space_offload import unoffered_twins
from tuner.specs import Workload
from tuner.store import StudyRecord
from tuner.trial import Status

log = logging.getLogger(__name__)

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")
ADJECTIVES = ("brisk", "calm", "eager", "keen", "lucid", "nimble", "quiet", "rapid", "steady", "swift", "vivid")
NOUNS = ("otter", "falcon", "lynx", "heron", "marten", "orca", "puffin", "raven", "tapir", "wren", "yak")


def check_study_name(name: str) -> str:
    if not NAME_RE.match(name) or ".." in name:
        raise UsageError(f"study name {name!r} is not allowed: use letters, digits, '.', '_' and '-' "
                         "(at most 80, starting with a letter or digit)")
    return name


def generated_name(model: str, nodes: int, taken: set[str]) -> str:
    rng = random.Random()
    while True:
        name = f"{model}-{nodes}n-{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}-{rng.randint(100, 999)}"
        if name not in taken:
            return name


@dataclass
class Result:
    outcome: Outcome
    searcher: object            # its `confidence` and `stop_reason` say why a guided study stopped


def new_record(name: str, workload: Workload, space: SearchSpace, *, searcher: str = "guided", runner: str = "sim",
               **settings) -> StudyRecord:
    """A study record with the CLI's defaults for every setting not given (budget, seed, parallel, ...)."""
    base = {"seed": 0, "budget": 50, "parallel": 1, "time_limit": None, "prune": True, "executor": "thread",
            "results_dir": "results", "early_stop": None, "warm_start": False,
            "stop_threshold": STUDY_DEFAULTS["stop_threshold"], "no_stop": False, "keep_going": False,
            "executor_options": {}, "runner_options": {}}
    return StudyRecord(name=name, workload=workload.as_dict(), space=space.as_record(), searcher=searcher,
                       runner=runner, settings={**base, **settings})


def _uses_harness(rec: StudyRecord) -> bool:
    """Whether the study's trials run the bundled harness (local runner, Slurm template "harness")."""
    return rec.runner == "local" or (rec.runner == "slurm" and
                                     rec.settings.get("runner_options", {}).get("template", "harness") == "harness")


def harness_refusal(rec: StudyRecord, workload: Workload) -> str | None:
    """Why the bundled harness cannot train this study's model as specified (it would run something else)."""
    from tuner.runners.harness.support import model_refusal

    refusal = model_refusal(workload.model) if _uses_harness(rec) else None
    if refusal:
        return f"{refusal}; use --runner command with your own trainer, or --runner slurm --template megatron"
    template = rec.settings.get("runner_options", {}).get("template")
    if _uses_harness(rec) and workload.model.is_moe and workload.framework == "megatron-core":
        return None         # the harness's MoE layer is Megatron-Core's (router, dropless all-to-all, groups)
    if _uses_harness(rec) and workload.model.is_moe:
        return (f"the bundled harness trains a mixture of experts as Megatron-Core does, not as "
                f"{workload.framework}: add --framework megatron-core")
    if (_uses_harness(rec) or template == "megatron") and workload.framework != "megatron-deepspeed":
        trainer = "the bundled harness" if _uses_harness(rec) else "Slurm's megatron template"
        return (f"{trainer} trains as Megatron-DeepSpeed does, not as {workload.framework}: use --framework "
                f"megatron-deepspeed, or --runner command with a {workload.framework} trainer")
    return None


def framework_model_refusal(workload: Workload) -> str | None:
    """Why the study's framework cannot build its model at all (torchtitan builds only its registered
    model flavors: tuner.render.torchtitan.flavor), or None."""
    if workload.framework == "torchtitan":
        from tuner.render.torchtitan import flavor
        try:
            flavor(workload.model)
        except UsageError as exc:
            return str(exc)
    return None


def trainer_refusal(rec: StudyRecord, layout, workload: Workload) -> str | None:
    """Why the study's trainer cannot run `layout` as it is (the harness: no virtual stages, no context
    parallelism, no FP8; Slurm's megatron template: Megatron-DeepSpeed's limits), or None. The simulator,
    a user's --command and Slurm's command template run every layout of the study's framework."""
    if _uses_harness(rec):
        from tuner.runners.harness.support import layout_refusal
        return layout_refusal(layout, workload.model.num_layers, workload.precision, model=workload.model)
    if rec.runner == "slurm" and rec.settings.get("runner_options", {}).get("template") == "megatron":
        from tuner.render import megatron
        return megatron.refusal(layout, workload)
    return None


def runnable_layouts(rec: StudyRecord, workload: Workload, space: SearchSpace) -> list:
    """The space's valid layouts that the study's trainer can run; UsageError naming why when none is."""
    layouts = valid_layouts(space, workload)
    kept = [lay for lay in layouts if not trainer_refusal(rec, lay, workload)]
    if not kept:
        raise UsageError(trainer_refusal(rec, layouts[0], workload))
    return kept


def create(store, rec: StudyRecord, runner: TrialRunner | None = None) -> StudyRecord:
    """Check everything a study needs before storing it: valid layouts that fit, runner options, the
    Ray address. Raises UsageError (nothing stored) or StudyExists. `runner`: the study's runner when
    it is not one tuner can build by its name (a Python object, tuner.runners.registry)."""
    check(rec, runner)
    store.create_study(rec)
    return store.get_study(rec.name)


def check(rec: StudyRecord, runner: TrialRunner | None = None) -> None:
    """What `create` checks before it stores `rec` (UsageError naming the fix); stores nothing."""
    workload, space = Workload.from_dict(rec.workload), SearchSpace.from_record(rec.space)
    refusal = framework_model_refusal(workload)
    if refusal:                                   # before any trial: its answer could never be launched
        raise UsageError(refusal)
    layouts = runnable_layouts(rec, workload, space)
    s = rec.settings
    runner_for(rec, workload, runner)             # bad runner input fails before anything is stored
    check_program(rec)
    refusal = harness_refusal(rec, workload)
    if refusal:
        raise UsageError(refusal)
    if s.get("prune", True):                      # a study that could only prune would be a dead one
        require_fit(predictions(layouts, workload), workload, space)
    if s.get("executor") == "ray" and (s.get("executor_options") or {}).get("address"):
        from tuner.executors.ray import check_address
        check_address(s["executor_options"]["address"])


def check_program(rec: StudyRecord, ray_address: str | None = None) -> None:
    """UsageError where the command runner's program is not found or not executable on this machine, which runs its
    trials (a typo would fail every trial). Not where a Ray cluster's workers run them (`ray_address` or the study's
    own), nor for Slurm: the program lives on the cluster."""
    s = rec.settings
    remote = ray_address or (s.get("executor") == "ray" and (s.get("executor_options") or {}).get("address"))
    if rec.runner != "command" or remote:
        return
    from tuner.runners.program import program_refusal
    refusal = program_refusal(s.get("runner_options", {}).get("command") or "", Path.cwd())
    if refusal:
        raise UsageError(refusal)


def runner_for(rec: StudyRecord, workload: Workload, given: TrialRunner | None = None):
    """The runner of a study: `given` (which must carry the study's runner name: measurements of two
    runners do not mix), else the one its stored name and options build (built in, registered in
    this process or an installed entry point), else UsageError saying how to continue the study."""
    opts, s = rec.settings.get("runner_options", {}), rec.settings
    name, results_dir = rec.runner, Path(s.get("results_dir", "results"))
    if given is not None:
        if given.name != name:
            raise UsageError(f"study '{rec.name}' is run by runner '{name}', not '{given.name}': measurements of "
                             "two runners do not mix; create another study (--warm-start reuses this one's)")
        return given
    if name not in RUNNERS:
        found = lookup(name)
        if found is None:
            raise unavailable(name, rec.name)
        return as_runner(found, name, opts)
    if name == "sim":
        return make_runner("sim", noise=opts.get("noise", 0.0), delay=opts.get("sim_delay", 0.0), seed=s.get("seed", 0))
    common = {"trial_timeout": opts.get("trial_timeout") or DEFAULT_TRIAL_TIMEOUT_S, "results_dir": results_dir}
    if name == "command":
        if not opts.get("command"):
            raise UsageError("--runner command needs --command \"CMD ...\" (the training command to run per trial)")
        return make_runner("command", command=opts["command"], **common)
    if name == "local":
        gpus = opts.get("gpus") or workload.gpus
        from tuner.runners.local import device_for          # loaded as make_runner loads the local runner
        return make_runner("local", gpus=gpus, device=device_for(workload.cluster, gpus), **common)
    if name == "slurm":
        # node failures: the driver retries a retryable result once, so the runner does not resubmit too
        return make_runner("slurm", cluster=workload.cluster, template=opts.get("template") or "harness",
                           node_fail_retries=0, **common)
    return make_runner(name)


def searcher_for(store, rec: StudyRecord, workload: Workload, candidates: list):
    """The study's searcher; guided with the study defaults, its stop rule and any warm start."""
    s, options = rec.settings, {}
    if rec.searcher == "guided":
        options.update(STUDY_DEFAULTS)
        threshold = s.get("stop_threshold", STUDY_DEFAULTS["stop_threshold"])
        options["stop_threshold"] = None if s.get("no_stop") or not threshold else threshold   # 0: an old "never"
        if s.get("warm_start"):
            options["history"], options["history_studies"] = _warm_start(store, rec, workload)
        if s.get("linked"):                       # a multi-node search: the other counts' trials (tuner.study_group)
            records, linked = linked_history(store, rec, workload, skip=options.get("history_studies", {}))
            options["history"] = [*options.get("history", []), *records]
            options["history_studies"] = {**options.get("history_studies", {}), **linked}
        options["reserve"] = [t for t in unoffered_twins(SearchSpace.from_record(rec.space), candidates, workload)
                              if not trainer_refusal(rec, t, workload)]                # tuner.search.reserve
        known = [*candidates, *options["reserve"]]
        options["predictions"] = dict(zip(known, predictions(known, workload)))   # `check`'s, kept
    return make_searcher(rec.searcher, candidates, seed=s.get("seed", 0), workload=workload,
                         parallel=s.get("parallel", 1), **options)


def linked_history(store, rec: StudyRecord, workload, skip: dict | None = None) -> tuple[list, dict]:
    """The trials of `rec`'s linked studies (not its own, nor those already in `skip`) and their records,
    as --warm-start hands them to the guided searcher."""
    from tuner.correction import warm_start_records
    names = [n for n in rec.settings.get("linked", []) if n != rec.name and n not in (skip or {})]
    known = set(store.study_names())
    linked = {n: store.get_study(n) for n in names if n in known}
    trials = [t for n in linked for t in store.trials(n)]
    ev = warm_start_records(trials, workload, linked).evidence
    sim = (f" ({ev['simulated_trials']} simulated trial(s) left out: the model's own prediction)"
           if ev.get("simulated_trials") else "")
    if ev["trials"]:
        log.info("%s: %d measured trial(s) of the linked studies at %s node(s) correct the model%s", rec.name,
                 ev["trials"], ", ".join(map(str, ev["node_counts"])), sim)
    elif trials:
        log.info("%s: no measured trial of the linked studies to learn from%s", rec.name, sim)
    return trials, linked


def _warm_start(store, rec: StudyRecord, workload: Workload) -> tuple[list, dict]:
    """The stored trials of other studies a --warm-start reads, and what it says of them: measurements of
    this model, cluster and framework only (correction.warm_start_records leaves simulated trials and other
    frameworks' out; the study's own trials, simulated or not, are its searcher's to learn from)."""
    from tuner.correction import warm_start_records
    records, studies = history(store, workload.model.name, workload.cluster.name, exclude=rec.name)
    ev = warm_start_records(records, workload, studies).evidence
    left = [f"{n} {what} left out" for n, what in ((ev.get("simulated_trials", 0), "simulated trial(s)"),
                                                   (ev.get("other_framework_trials", 0), "trial(s) of other frameworks"))
            if n]
    if not ev.get("trials"):
        log.warning("--warm-start found no stored trials of %s on %s measured with %s%s: starting cold",
                    workload.model.name, workload.cluster.name, workload.framework,
                    f" ({', '.join(left)})" if left else "")
        return [], {}
    log.info("warm start from %d trial(s) of %d studies at node counts %s (measured with %s%s)", ev["trials"],
             len(ev["studies"]), ", ".join(map(str, ev.get("node_counts", []))), workload.framework,
             f"; {', '.join(left)}" if left else "")
    return records, studies


def run(store, rec: StudyRecord, *, budget: int | None = None, resumed: bool = False, lease_mode: str = "run",
        keep_going: bool = False, on_progress=None, runner: TrialRunner | None = None,
        time_limit: float | None = None) -> Result:
    """Run `rec` to its budget (or `budget`), its searcher's stop, the space's end or its time limit
    (or `time_limit` seconds from now)."""
    s = rec.settings
    workload, space = Workload.from_dict(rec.workload), SearchSpace.from_record(rec.space)
    candidates = runnable_layouts(rec, workload, space)
    runner = runner_for(rec, workload, runner)
    if resumed:                                   # no orphan jobs or processes from a dead driver
        gone = runner.cancel_study_jobs(rec.name)
        if gone:
            what = "Slurm job(s)" if rec.runner == "slurm" else "trial(s) whose processes were still running"
            log.warning("stopped %d %s left by the stopped driver: %s", len(gone), what, ", ".join(map(str, gone)))
    searcher = searcher_for(store, rec, workload, candidates)
    executor = make_executor(s.get("executor", "thread"), s.get("parallel", 1), **s.get("executor_options", {}))
    driver = Driver(store=store, study=rec.name, workload=workload, searcher=searcher, runner=runner,
                    executor=executor, budget=budget or s["budget"], parallel=s.get("parallel", 1),
                    time_limit=time_limit or s.get("time_limit"), prune=s.get("prune", True),
                    results_dir=Path(s.get("results_dir", "results")), on_progress=on_progress,
                    early_stop=s.get("early_stop"), lease_mode=lease_mode,
                    keep_going=keep_going or s.get("keep_going", False))
    store.set_study_state(rec.name, "running")
    try:
        outcome = driver.run()
    finally:
        executor.shutdown()
    if not lease.holders(store.get_study(rec.name).settings):      # the last driver out marks it done
        store.set_study_state(rec.name, "done")
    return Result(outcome, searcher)


def resume(store, name: str, *, budget: int | None = None, mode: str = "run", ray_address: str | None = None,
           keep_going: bool = False, on_progress=None, runner: TrialRunner | None = None,
           time_limit: float | None = None) -> Result:
    """Continue a study: take its lease atomically (mode run | join | force), re-run what a dead driver
    left running (not with join: those are another live driver's), raise its budget, run it. A study
    whose runner this process cannot build is refused before anything changes."""
    rec = store.get_study(name)
    runner = runner_for(rec, Workload.from_dict(rec.workload), runner)
    check_program(rec, ray_address)
    store.modify_study_settings(name, lambda st: lease.take(st, name, mode))   # one driver gets in
    if mode != "join":
        n = store.mark_interrupted(name)
        if n:
            log.warning("%d trial(s) left running by a stopped driver will run again", n)
    if ray_address:
        from tuner.executors.ray import check_address
        check_address(ray_address)
        store.update_study_settings(name, {"executor": "ray", "executor_options": {"address": ray_address}})
    if budget:
        store.update_study_settings(name, {"budget": budget})
    return run(store, store.get_study(name), resumed=mode != "join", lease_mode=mode, keep_going=keep_going,
               on_progress=on_progress, runner=runner, time_limit=time_limit)


def fastest(store, name: str, k: int = 1) -> list:
    """The k fastest successful trials of a study (highest MFU) that its framework runs: the recommendation
    first."""
    from tuner.frameworks import runnable
    workload = Workload.from_dict(store.get_study(name).workload)
    return runnable(ok_trials(store.trials(name, [Status.OK])), workload)[:k]
