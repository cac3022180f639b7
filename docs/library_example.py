# %% [markdown]
# # tuner from Python: a notebook
#
# Cells in the `# %%` format: open this file in Jupyter (with jupytext) or VS Code and run it cell by
# cell, or run it whole with `python docs/library_example.py`. The test suite runs it
# (tests/test_library.py), in a scratch directory, so every cell here works as written.
#
# It tunes Llama 3 70B on 8 nodes of H100 (Megatron-Core) with the simulator, then with a trainer
# of our own written as a Python function, and looks at the results with pandas.

# %%
import logging

import tuner

logging.basicConfig(format="%(name)s: %(message)s")
logging.getLogger("tuner").setLevel(logging.INFO)     # tuner's notes (warm start, resumed trials)

STORE = "sqlite:///notebook.db"                       # any SQLAlchemy URL; PostgreSQL works the same

# %% [markdown]
# ## A study on the simulator
# Keyword arguments are `tuner search`'s options. Nothing runs until `optimize()`.

# %%
study = tuner.create_study("llama70b-h100", storage=STORE, model="llama3-70b", nodes=8, cluster="h100",
                           budget=12, load_if_exists=True)
outcome = study.optimize()
print(outcome.ran, "trials ran; stopped by", outcome.reason)
best = study.best()
print("recommended:", best.layout.key(), f"{best.samples_per_second:.3g} samples/s, MFU {100 * best.mfu:.1f} %")

# %%
df = study.trials_dataframe()
df[["trial", "layout_key", "status", "samples_per_second", "mfu", "peak_memory_gb"]].head()

# %%
# Which layout choices go with speed: mean MFU per tensor-parallel degree and recompute mode.
ok = df[df.status == "ok"]
print(ok.groupby(["tp", "recompute"]).mfu.mean().unstack())

# %% [markdown]
# ## Running more of it
# `n_trials` runs that many more; the study continues where it stopped.

# %%
outcome = study.optimize(n_trials=4)
print(len(study.trials), "trials stored; recommended", study.best().layout.key())

# %% [markdown]
# ## Your own trainer as a function
# A runner may be a function of the trial: it gets the layout and the workload and returns samples/s,
# a result dict, or raises (an exception is the trial's failure, and an out-of-memory message makes it
# an OOM). Here a stand-in for a real short training run: it prefers little tensor parallelism and
# runs out of memory without it.

# %%
def short_run(trial):
    lay = trial.layout
    if lay.tp * lay.pp < 8:
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    step_s = 30.0 * (1 + 0.15 * lay.tp) * (1 + 0.05 * lay.pp) / lay.micro_batch ** 0.3
    return {"status": "ok", "step_time_s": step_s, "peak_memory_gb": 60.0}


mine = tuner.create_study("llama70b-mine", storage=STORE, runner=short_run, model="llama3-70b", nodes=8,
                          cluster="h100", budget=8, load_if_exists=True)
mine.optimize()
print(mine.best().layout.key(), "|", mine.trials_dataframe().status.value_counts().to_dict())

# %% [markdown]
# The study stores its runner's name (`short_run`). `tuner resume llama70b-mine` refuses to continue it
# with another runner; from Python, hand the function back:

# %%
again = tuner.load_study("llama70b-mine", storage=STORE, runner=short_run)
again.optimize(n_trials=2)
print(len(again.trials), "trials")

# %% [markdown]
# ## The settings as a file
# `config()` is the study.toml that `tuner search --config` reads (the CLI's `tuner config NAME`).

# %%
print(study.config())
