"""The parts of benchmarks/measure_memory_mds.py (peak per-GPU memory of Megatron-DeepSpeed's own training step,
measured on a CPU under fake tensors; that file's docstring: set-up, method, patches), one responsibility each:

    configs.py   C(...), the grid, CONFIGS and the held-out FRESH (pure data)
    rows.py      a configuration as tuner reads it (its row keys, layout, workload, launch files) and a result as a row
                 of data/memory_measured_megatron-deepspeed*.toml
    patches.py   what Megatron-DeepSpeed f4157bea + DeepSpeed 0.19.8 + torch 2.13.0 need on a CPU under fake tensors
    step.py      one configuration's step, run as its own process (imports torch, deepspeed and megatron)

Used by benchmarks/measure_memory_mds.py and benchmarks/draw_memory_batch.py --mds, with benchmarks/ on sys.path.
"""
