"""The parts of benchmarks/measure_memory_mcore.py (peak per-GPU memory of Megatron-Core's own training step,
measured on a CPU under fake tensors; that file's docstring: set-up, method, patches), one responsibility each:

    configs.py   the shapes, C(...), CONFIGS and the held-out batches FRESH .. FRESH5, PIPELINE (pure data)
    patches.py   what megatron-core 0.16.1 + torch 2.13.0 need on a CPU under fake tensors (_patch)
    step.py      measure(): one configuration in this process (imports torch and megatron when it runs)
    rows.py      _row and write_toml: a result as a row of data/memory_measured_megatron-core*.toml (pure)

Imports run one way: step -> configs; rows -> configs. Used by benchmarks/measure_memory_mcore.py and
benchmarks/draw_memory_batch.py (configs only), with benchmarks/ on sys.path:

    import sys; sys.path.insert(0, "benchmarks")
    from mcore_memory.configs import CONFIGS
"""
