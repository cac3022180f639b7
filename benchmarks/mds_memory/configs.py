"""Megatron-DeepSpeed memory measurement's configurations (pure data): C(...), the grid they are drawn from, CONFIGS
(the rows a memory choice may read) and FRESH (held out), with the data file each is written to
(benchmarks/measure_memory_mds.py)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "benchmarks" / "data" / "memory_measured_megatron-deepspeed.toml"
FRESH_OUT = REPO / "benchmarks" / "data" / "memory_measured_megatron-deepspeed_fresh.toml"
GiB = float(2 ** 30)
#: The Megatron-DeepSpeed the rows measure (microsoft/Megatron-DeepSpeed; `--mds-dir` points at a checkout of it).
MDS_COMMIT = "f4157bea"
CLUSTER = "frontier"        # the study's machine: 64 GB MI250X GCDs; what `tuner launch` writes for it is measured

# ----------------------------------------------------------------------------------- the grid
#: The study's GPT shapes and two Llama 2 (RoPE, SwiGLU, RMSNorm, untied; 70B with GQA), every layer built, at the
#: preset's sequence, in bf16, as `tuner launch` writes them for Frontier (tuner.render.megatron).
MODELS = ("gpt-22b", "gpt-175b", "gpt-1t", "llama2-7b", "llama2-70b")
GRID = dict(tp=(1, 2, 4, 8), pp=(1, 2, 4, 8, 16, 32), dp=(1, 2, 4, 8), mb=(1, 2, 4), zero=(0, 1, 2, 3),
            recompute=("none", "selective", "full"))
#: a drawn layout's predicted peak must lie within these multiples of the GCD's 64 GB: the layouts p_fit decides on
NEAR_CAPACITY = (0.3, 1.5)


def C(model, *, tp=1, pp=1, dp=1, mb=1, m=None, zero=1, recompute="none", stage=0):
    """One configuration: a model preset and a layout; `m` micro-batches per iteration (default: 2 x pp, so that a
    first stage reaches 1F1B's steady state), `stage` the pipeline stage measured (negative: from the last)."""
    m = m or max(2, 2 * pp)
    return dict(model=model, tp=tp, pp=pp, dp=dp, micro_batch=mb, num_microbatches=m, zero_stage=zero,
                recompute=recompute, stage=stage if stage >= 0 else pp + stage)


def rank_of(c) -> int:
    """The measured rank: tensor- and data-parallel rank 0 of its stage (Megatron's and DeepSpeed's grids both put
    the pipeline outermost: rank = stage x tp x dp + dp rank x tp + tp rank)."""
    return c["stage"] * c["tp"] * c["dp"]


def label(c) -> str:
    return (f"{c['model']} tp{c['tp']} pp{c['pp']} dp{c['dp']} mb{c['micro_batch']} m{c['num_microbatches']} "
            f"z{c['zero_stage']} rc={c['recompute']} stage{c['stage']}")


#: (issue 30 round 33) drawn by `benchmarks/draw_memory_batch.py --mds --seed 946865456` (the seed from os.urandom),
#: committed before any row was measured: CONFIGS from the two thirds published.held_out leaves in (the rows a memory
#: choice may read), FRESH from the held-out third (read by no choice), 8 per recompute mode each.
CONFIGS = [
    C("llama2-70b", tp=4, pp=2, dp=4, mb=1, zero=1, recompute="none"),
    C("llama2-7b", tp=2, pp=4, dp=4, mb=4, zero=0, recompute="none"),
    C("llama2-7b", tp=1, pp=2, dp=1, mb=2, zero=1, recompute="none"),
    C("gpt-175b", tp=8, pp=8, dp=1, mb=2, zero=1, recompute="none"),
    C("llama2-70b", tp=1, pp=16, dp=4, mb=2, zero=0, recompute="none", stage=-1),
    C("llama2-70b", tp=4, pp=4, dp=4, mb=2, zero=0, recompute="none", stage=-1),
    C("gpt-175b", tp=8, pp=4, dp=4, mb=2, zero=0, recompute="none", stage=-1),
    C("llama2-70b", tp=1, pp=16, dp=8, mb=4, zero=1, recompute="none", stage=-1),
    C("gpt-175b", tp=2, pp=32, dp=1, mb=2, zero=1, recompute="selective", stage=-1),
    C("gpt-175b", tp=8, pp=8, dp=2, mb=2, zero=1, recompute="selective", stage=-1),
    C("llama2-70b", tp=4, pp=8, dp=2, mb=2, zero=0, recompute="selective"),
    C("gpt-175b", tp=4, pp=8, dp=8, mb=4, zero=0, recompute="selective", stage=-1),
    C("llama2-70b", tp=1, pp=16, dp=2, mb=2, zero=1, recompute="selective", stage=-1),
    C("gpt-175b", tp=8, pp=32, dp=2, mb=4, zero=1, recompute="selective"),
    C("llama2-7b", tp=2, pp=2, dp=1, mb=1, zero=1, recompute="selective", stage=-1),
    C("llama2-7b", tp=4, pp=1, dp=8, mb=4, zero=2, recompute="selective"),
    C("gpt-175b", tp=4, pp=8, dp=8, mb=2, zero=0, recompute="full"),
    C("llama2-7b", tp=4, pp=1, dp=8, mb=2, zero=0, recompute="full"),
    C("gpt-22b", tp=4, pp=4, dp=1, mb=2, zero=0, recompute="full", stage=-1),
    C("gpt-22b", tp=8, pp=1, dp=1, mb=2, zero=1, recompute="full"),
    C("llama2-70b", tp=2, pp=8, dp=8, mb=4, zero=0, recompute="full"),
    C("gpt-175b", tp=1, pp=32, dp=8, mb=4, zero=0, recompute="full", stage=-1),
    C("gpt-1t", tp=8, pp=16, dp=2, mb=1, zero=1, recompute="full"),
    C("llama2-7b", tp=1, pp=4, dp=2, mb=2, zero=0, recompute="full", stage=-1),
]
FRESH = [
    C("gpt-1t", tp=4, pp=16, dp=8, mb=1, zero=1, recompute="none", stage=-1),
    C("llama2-70b", tp=4, pp=4, dp=1, mb=1, zero=1, recompute="none", stage=-1),
    C("llama2-7b", tp=2, pp=8, dp=2, mb=4, zero=1, recompute="none"),
    C("gpt-22b", tp=2, pp=4, dp=1, mb=2, zero=0, recompute="none", stage=-1),
    C("gpt-22b", tp=4, pp=1, dp=8, mb=1, zero=2, recompute="none"),
    C("gpt-175b", tp=8, pp=4, dp=8, mb=4, zero=0, recompute="none", stage=-1),
    C("llama2-7b", tp=2, pp=2, dp=1, mb=2, zero=1, recompute="none"),
    C("llama2-7b", tp=2, pp=32, dp=1, mb=4, zero=0, recompute="none"),
    C("llama2-7b", tp=1, pp=32, dp=1, mb=2, zero=1, recompute="selective"),
    C("llama2-70b", tp=8, pp=2, dp=2, mb=2, zero=0, recompute="selective"),
    C("llama2-7b", tp=2, pp=2, dp=8, mb=4, zero=0, recompute="selective"),
    C("gpt-22b", tp=4, pp=2, dp=2, mb=2, zero=0, recompute="selective"),
    C("gpt-22b", tp=2, pp=4, dp=1, mb=4, zero=0, recompute="selective"),
    C("llama2-7b", tp=1, pp=2, dp=1, mb=2, zero=1, recompute="selective"),
    C("llama2-7b", tp=1, pp=1, dp=2, mb=2, zero=3, recompute="selective"),
    C("gpt-175b", tp=4, pp=16, dp=2, mb=4, zero=0, recompute="selective", stage=-1),
    C("gpt-22b", tp=4, pp=1, dp=8, mb=1, zero=2, recompute="full"),
    C("gpt-175b", tp=1, pp=32, dp=1, mb=2, zero=1, recompute="full", stage=-1),
    C("gpt-22b", tp=2, pp=1, dp=4, mb=1, zero=2, recompute="full"),
    C("gpt-22b", tp=8, pp=1, dp=2, mb=2, zero=1, recompute="full"),
    C("llama2-7b", tp=4, pp=1, dp=8, mb=1, zero=0, recompute="full"),
    C("gpt-22b", tp=8, pp=1, dp=2, mb=1, zero=0, recompute="full"),
    C("gpt-175b", tp=4, pp=4, dp=8, mb=2, zero=1, recompute="full", stage=-1),
    C("gpt-22b", tp=1, pp=2, dp=4, mb=4, zero=1, recompute="full", stage=-1),
]
