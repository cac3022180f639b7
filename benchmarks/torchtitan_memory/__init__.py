"""The parts of benchmarks/measure_memory_torchtitan.py (peak per-GPU memory of torchtitan's own training step,
measured on a CPU under fake tensors; that file's docstring: set-up, method, patches), one responsibility each:

    configs.py   PRESETS, CONFIGS and the fresh held-out batches FRESH .. FRESH4 (pure data)
    patches.py   what torchtitan 0.3.0 + torch 2.13.0 need on a CPU under fake tensors, and MeasureTracker
    step.py      measure(): one configuration in this process (imports torch and torchtitan when it runs)
    rows.py      to_row and write_toml: a result as a row of data/memory_measured_torchtitan*.toml (pure)

Imports run one way: step -> patches, configs; rows -> configs. Used by benchmarks/measure_memory_torchtitan.py
and benchmarks/draw_memory_batch.py (configs only), with benchmarks/ on sys.path:

    import sys; sys.path.insert(0, "benchmarks")
    from torchtitan_memory.configs import CONFIGS
"""
