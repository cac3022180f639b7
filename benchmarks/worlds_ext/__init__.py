"""Benchmark worlds that share none of tuner's model formulas (issue 30): measured kernel speeds, an
op-by-op memory account with the caching allocator, and the pipeline simulated op by op.

Nothing here imports tuner.perfmodel, tuner.correction, tuner.metrics or tuner.best, nor the other
benchmark worlds (indep_worlds, indep_modern); it reads tuner.specs (model and cluster sizes, datasheet
numbers), tuner.layout and tuner.space (what a layout is and which ones the framework runs).

    geometry.py     what a layout cuts: GEMM shapes, tensors, parameters per GPU and stage
    tables.py       OpenXLA's measured GEMM and collective speeds (data/, extract_xla.py), interpolated
    compute.py      a layer's forward / backward seconds from those speeds and FlashAttention's curve
    network.py      collectives: measured in a node, hierarchical across nodes
    memory_acct.py  saved tensors op by op, in-flight micro-batches per framework, states, allocator
    schedule.py     1F1B / interleaved 1F1B simulated op by op (host cost, straggler, jitter)
    step.py         a step: chunk times, the simulated pipeline, DP / ZeRO / FSDP, optimizer
    families.py     the five families, their workloads and drawn ranges
    world.py        World (truth, optimum, runner) and draw_world

Used by benchmarks/ext_search.py and tests/test_ext_worlds.py:

    import sys; sys.path.insert(0, "benchmarks")
    from worlds_ext import FAMILIES, WORKLOADS, draw_world
    world = draw_world("pipeline-host", 0, seed=7)     # 1T on 128 Frontier nodes, Megatron-DeepSpeed
    layout, samples_per_s = world.optimum()
"""

from worlds_ext.families import FAMILIES, WORKLOADS, draw_physics
from worlds_ext.world import ExtRunner, World, draw_world, evaluate

__all__ = ["FAMILIES", "WORKLOADS", "draw_physics", "World", "ExtRunner", "draw_world", "evaluate"]
