"""tuner: search for the fastest parallel layout of a large-model training run.

The library's facade (tuner.api), documented in docs/library.md:

    import tuner
    study = tuner.create_study(model="175b", nodes=16, budget=20)
    study.optimize()
    study.best()
    tuner.scale(model="175b", cluster="frontier", nodes="16:512", tokens=3e11).dataframe()
"""

import logging

__version__ = "0.1.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())   # a library logs; the application shows it

_FACADE = ("create_study", "load_study", "Study", "register_runner", "unregister_runner", "runner_names",
           "TrialSpec", "TrialResult", "TrialRunner", "Status", "Layout")
#: The model's answers (tuner.planning): what `tuner predict`, `plan`, `best` and `scale` print, as objects.
_PLANNING = ("predict", "plan", "best", "scale")
__all__ = list(_FACADE) + list(_PLANNING)


def __getattr__(name):
    """The facade, imported on first use (`import tuner` stays cheap for the CLI)."""
    if name in _FACADE:
        from tuner import api
        return getattr(api, name)
    if name in _PLANNING:
        return answer(name)
    raise AttributeError(f"module 'tuner' has no attribute {name!r}")


def answer(name: str):
    """The library's `name` of _PLANNING (tuner.planning): also what calling the module tuner.best calls."""
    from tuner import planning
    return getattr(planning, name)
