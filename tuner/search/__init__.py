"""Searchers behind one ask/tell interface (see base.py for the contract).

`make_searcher(name, candidates, seed=..., workload=..., parallel=...)` builds one by name. A searcher
module registers itself with `register(name, factory)`; the heavy ones import DeepHyper or Optuna only
when built, so `import tuner.search` stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Callable

from tuner.errors import UsageError
from tuner.search.base import BaseSearcher, Searcher, objective

if TYPE_CHECKING:
    from tuner.layout import Layout
    from tuner.specs import Workload

__all__ = ["STUDY_DEFAULTS", "SEARCHERS", "Searcher", "BaseSearcher", "make_searcher", "register", "objective"]

#: The stop rule of a study (guided): stop once P(some layout beats the recommended one by more than
#: stop_threshold) < stop_probability (99 % confident), after at least min_trials successes. 0.01, not
#: 0.05: benchmarks/stop_calibration.py's figures for both are in docs/commands/search.md (issue 30).
STUDY_DEFAULTS = {"stop_threshold": 0.03, "stop_probability": 0.01, "min_trials": 8}

# name -> "module:Class" (imported on use) or a factory callable (registered at run time)
_REGISTRY: dict[str, str | Callable[..., Searcher]] = {
    "guided": "tuner.search.guided:GuidedSearcher",
    "cbo": "tuner.search.cbo:CBOSearcher",
    "tpe": "tuner.search.tpe:TPESearcher",
    "random": "tuner.search.rand:RandomSearcher",
    "grid": "tuner.search.grid:GridSearcher",
}
SEARCHERS: tuple[str, ...] = tuple(_REGISTRY)


def register(name: str, factory: str | Callable[..., Searcher]) -> None:
    """Add a searcher: `factory(candidates, seed=, workload=, parallel=)` or "module:Class"."""
    global SEARCHERS
    _REGISTRY[name] = factory
    SEARCHERS = tuple(_REGISTRY)


def make_searcher(name: str, candidates: list["Layout"], *, seed: int = 0, workload: "Workload | None" = None,
                  parallel: int = 1, **options) -> Searcher:
    """The searcher `name` over `candidates` (every valid layout of the space; with `workload`, one ZeRO stage of
    each layout whose data-parallel and expert-dp groups are 1 where the framework runs every stage alike there:
    tuner.space.one_zero_stage_where_unsharded, so a study given a raw list spends no trial on a stage that shards
    nothing). `options` are
    searcher-specific (guided: history, history_studies, stop_threshold, predictions: a dict layout -> the model's
    prediction where the caller has it, tuner.predicted); others ignore them."""
    factory = _REGISTRY.get(name)
    if factory is None:
        raise UsageError(f"unknown searcher '{name}'; searchers: {', '.join(_REGISTRY)}")
    if isinstance(factory, str):
        module, cls = factory.split(":")
        factory = getattr(importlib.import_module(module), cls)
    candidates = list(candidates)
    if workload is not None:       # one ZeRO stage where none shards anything: the others are the same run
        from tuner.space import one_zero_stage_where_unsharded
        candidates = one_zero_stage_where_unsharded(candidates, workload)
    return factory(candidates, seed=seed, workload=workload, parallel=parallel, **options)
