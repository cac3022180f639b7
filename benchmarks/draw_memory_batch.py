"""Draw a batch of torchtitan memory configurations no choice has seen (issue 24: held-out p_fit reliability).

Run: python benchmarks/draw_memory_batch.py [--seed N] [--chunked 8] [--ce 4] [--batch fresh4]
     python benchmarks/draw_memory_batch.py --mcore [--seed N] [--per-mode 8] [--batch fresh5]   (Megatron-Core: MCORE_GRID)
     python benchmarks/draw_memory_batch.py --mds [--seed N] [--per-mode 8]     (Megatron-DeepSpeed: mds_memory GRID)

Without --seed a seed is drawn from os.urandom and printed. The rule (the one FRESH2 of
benchmarks/measure_memory_torchtitan.py was drawn by, written down here so that a batch can be re-drawn from its
seed): the grid model {Llama 3 8B with all 32 layers, the Llama 3 70B shape built with 8 or 16 layers} x sequence
{2048, 4096, 8192} x tp {1, 2, 4, 8} x micro-batch {1, 2} x dp {8, 16, 64} x recompute {none, selective, full} x
loss {torchtitan's default chunked CE, the un-chunked CE}, less every configuration measured before the batch
(`EARLIER`: FRESH3 was drawn outside CONFIGS, FRESH and FRESH2; FRESH4 outside FRESH3 too), keeping those benchmarks/published.held_out puts in the held-out third; per recompute mode `--chunked`
chunked and `--ce` un-chunked ones, drawn with random.Random(seed).sample from the grid in its fixed order.
Prints the `_c(...)` lines to paste into benchmarks/torchtitan_memory/configs.py (the configurations
benchmarks/measure_memory_torchtitan.py measures), which is committed before any is measured.
"""

from __future__ import annotations

import itertools
import os
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from torchtitan_memory.configs import CONFIGS, FRESH, FRESH2, FRESH3, PRESETS, _c  # noqa: E402
from published import held_out  # noqa: E402

MODELS = (("llama3-8b", None), ("llama3-70b", 8), ("llama3-70b", 16))
GRID = dict(seq=(2048, 4096, 8192), tp=(1, 2, 4, 8), mb=(1, 2), dp=(8, 16, 64))
MODES = ("none", "selective", "full")


def split_row(c: dict) -> dict:
    """The keys published.split_key reads, as torchtitan_memory/rows.py's to_row writes them for `c`."""
    p = PRESETS[c["model"]]
    layers = c["layers"] or p["num_layers"]
    return {"framework": "torchtitan", "model": c["model"] if layers == p["num_layers"] else "custom",
            "num_layers": layers, **{k: p[k] for k in ("hidden_size", "num_attention_heads", "num_query_groups",
                                                        "ffn_hidden_size", "vocab_size")},
            "gpus": c["dp"] * c["tp"], "precision": "bf16", "seq_length": c["seq"], "global_batch": c["mb"] * c["dp"],
            "micro_batch": c["mb"], "tp": c["tp"], "pp": 1, "cp": 1, "vp": 1, "sequence_parallel": c["tp"] > 1,
            "recompute": c["recompute"], "zero_stage": 3}


#: what each batch was drawn from outside: every configuration measured before it
EARLIER = {"fresh3": CONFIGS + FRESH + FRESH2, "fresh4": CONFIGS + FRESH + FRESH2 + FRESH3}


def candidates(mode: str, loss: str, batch: str = "fresh4") -> list[dict]:
    taken = [dict(c) for c in EARLIER[batch]]
    out = []
    for (model, layers), seq, tp, mb, dp in itertools.product(MODELS, *GRID.values()):
        c = _c(model, layers, seq, dp, tp, mb, mode, loss=loss)
        if c not in taken and held_out(split_row(c)):
            out.append(c)
    return out


def draw(seed: int, chunked: int, ce: int, batch: str = "fresh4") -> list[dict]:
    rng = random.Random(seed)
    return [c for mode in MODES for loss, k in (("chunked", chunked), ("ce", ce))
            for c in rng.sample(candidates(mode, loss, batch), k)]


# Megatron-Core (--mcore): benchmarks/mcore_memory/configs.py's C(...) over the grid shape {Llama 3 8B with all 32
# layers, the Llama 3 70B and GPT 22B shapes built with 8 layers} x sequence {2048, 4096, 8192} x tp {1, 2, 4, 8} x
# pp {1, 2 (its first and its last stage)} x dp {4, 16} x micro-batch {1, 2} x micro-batches {2, 4}, the
# distributed optimizer, sequence parallelism with tp > 1 and the FlashAttention stand-in, less every configuration
# measured before the batch (FRESH was drawn outside CONFIGS; FRESH2, issue 24 round 5, outside CONFIGS, FRESH and
# PIPELINE too; FRESH3, issue 24 round 8, outside FRESH2 too and outside every configuration of those and every one a
# memory choice has seen: `mcore_draw`; FRESH4 outside FRESH3 too, FRESH5 outside FRESH4 too), keeping the held-out third; `--per-mode` per
# recompute mode, `--batch fresh2` for FRESH2's rule.
MCORE_SHAPES = (("llama3-8b", None), ("llama3-70b", 8), ("gpt-22b", 8))
MCORE_GRID = dict(seq=(2048, 4096, 8192), tp=(1, 2, 4, 8), pp=((1, 0), (2, 0), (2, -1)), dp=(4, 16), mb=(1, 2),
                  m=(2, 4))


def mcore_split_row(c: dict) -> dict:
    """The keys published.split_key reads, as mcore_memory.rows._row writes them for `c` (a dense C(...))."""
    full = c["num_layers"] == MCORE_FULL_LAYERS[c["shape"]]
    return {"framework": "megatron-core", "model": c["shape"] if full else "custom",
            **{k: c[k] for k in ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups",
                                 "ffn_hidden_size", "vocab_size", "seq_length", "tp", "pp", "cp", "micro_batch",
                                 "sequence_parallel", "recompute")},
            "gpus": c["tp"] * c["cp"] * c["pp"] * c["dp"], "vp": 1, "precision": "bf16",
            "global_batch": c["micro_batch"] * c["num_microbatches"] * c["dp"],
            "zero_stage": 1 if c["distributed_optimizer"] else 0}


MCORE_FULL_LAYERS = {"llama3-8b": 32, "llama3-70b": 80, "gpt-22b": 48, "gpt-175b": 96, "mixtral-8x7b": 32}


def mcore_earlier(batch: str) -> list[dict]:
    """What each Megatron-Core batch was drawn from outside: every configuration measured before it."""
    from mcore_memory.configs import CONFIGS as MCORE_CONFIGS, FRESH as MCORE_FRESH, FRESH2 as MCORE_FRESH2, PIPELINE
    from mcore_memory.configs import FRESH3 as MCORE_FRESH3, FRESH4 as MCORE_FRESH4
    return {"fresh2": MCORE_CONFIGS + MCORE_FRESH + PIPELINE,
            "fresh3": MCORE_CONFIGS + MCORE_FRESH + MCORE_FRESH2 + PIPELINE,
            "fresh4": MCORE_CONFIGS + MCORE_FRESH + MCORE_FRESH2 + MCORE_FRESH3 + PIPELINE,
            "fresh5": MCORE_CONFIGS + MCORE_FRESH + MCORE_FRESH2 + MCORE_FRESH3 + MCORE_FRESH4 + PIPELINE}[batch]


def mcore_draw(seed: int, per_mode: int, batch: str = "fresh5") -> list[dict]:
    """FRESH2's rule left out earlier measurements; FRESH3's, FRESH4's and FRESH5's (issue 24 rounds 8-9) leave out earlier
    configurations (published.split_key: another stage of a measured configuration is that configuration) and every
    configuration a memory choice has seen (published._seen_configurations)."""
    from mcore_memory.configs import C
    from published import _seen_configurations, split_key
    earlier = mcore_earlier(batch)
    taken = set() if batch == "fresh2" else ({split_key(mcore_split_row(c)) for c in earlier}
                                             | _seen_configurations("memory"))
    rng, out = random.Random(seed), []
    for mode in MODES:
        grid = [C(shape, layers=layers, tp=tp, pp=pp, dp=dp, mb=mb, m=m, seq=seq, recompute=mode, stage=stage)
                for (shape, layers), seq, tp, (pp, stage), dp, mb, m in itertools.product(MCORE_SHAPES,
                                                                                           *MCORE_GRID.values())]
        grid = [c for c in grid if c not in earlier and held_out(mcore_split_row(c))
                and split_key(mcore_split_row(c)) not in taken]
        out += rng.sample(grid, per_mode)
    return out


# Megatron-DeepSpeed (--mds, issue 30 round 33): benchmarks/mds_memory/configs.py's C(...) over MODELS x GRID (its first
# stage and, with pp > 1, its last; 2 x pp micro-batches), the layouts tuner runs (tuner.layout.why_invalid: Megatron-
# DeepSpeed's refusals included) whose predicted peak lies within NEAR_CAPACITY of the GCD's memory, seen by no memory
# choice; `--per-mode` per recompute mode from the two thirds published.held_out leaves in (CONFIGS: the rows a choice
# may read) and as many from the held-out third (FRESH).
def mds_candidates(mode: str, held: bool) -> list[dict]:
    from mds_memory.configs import C, GRID, MODELS, NEAR_CAPACITY
    from mds_memory.rows import layout_workload, predicted_gb, split_row
    from published import _seen_configurations, split_key
    from tuner.layout import why_invalid
    taken, out = _seen_configurations("memory"), []
    for model, tp, pp, dp, mb, zero in itertools.product(MODELS, *(GRID[k] for k in ("tp", "pp", "dp", "mb", "zero"))):
        for stage in ((0, pp - 1) if pp > 1 else (0,)):
            c = C(model, tp=tp, pp=pp, dp=dp, mb=mb, zero=zero, recompute=mode, stage=stage)
            row = split_row(c)
            if held_out(row) != held or split_key(row) in taken:
                continue
            lay, wl = layout_workload(c)
            if why_invalid(lay, wl):
                continue
            lo, hi = (f * wl.cluster.memory_gb for f in NEAR_CAPACITY)
            if lo <= predicted_gb(c) <= hi:
                out.append(c)
    return out


def mds_draw(seed: int, per_mode: int) -> tuple[list[dict], list[dict]]:
    """(CONFIGS, FRESH): per recompute mode, `per_mode` configurations of each side of the split."""
    rng = random.Random(seed)
    return tuple([c for mode in MODES for c in rng.sample(mds_candidates(mode, held), per_mode)]
                 for held in (False, True))


def _print_mds(seed: int, per_mode: int) -> None:
    configs, fresh = mds_draw(seed, per_mode)
    for name, batch in (("CONFIGS", configs), ("FRESH", fresh)):
        print(f"# seed {seed}: {name}, {len(batch)} Megatron-DeepSpeed configurations")
        for c in batch:
            stage = f", stage={c['stage'] - c['pp']}" if c["pp"] > 1 and c["stage"] else ""
            print(f'    C("{c["model"]}", tp={c["tp"]}, pp={c["pp"]}, dp={c["dp"]}, mb={c["micro_batch"]}, '
                  f'zero={c["zero_stage"]}, recompute="{c["recompute"]}"{stage}),')


def main() -> None:
    argv = sys.argv[1:]     # each --option's value is the word after it (--mcore takes none)
    args = {a: v for a, v in zip(argv, argv[1:]) if a.startswith("--") and not v.startswith("--")}
    seed = int(args["--seed"]) if "--seed" in args else int.from_bytes(os.urandom(4), "little")
    if "--mds" in sys.argv:
        return _print_mds(seed, int(args.get("--per-mode", 8)))
    if "--mcore" in sys.argv:
        batch = mcore_draw(seed, int(args.get("--per-mode", 8)), args.get("--batch", "fresh5"))
        print(f"# seed {seed}: {len(batch)} Megatron-Core configurations")
        for c in batch:
            layers = "" if c["num_layers"] == MCORE_FULL_LAYERS[c["shape"]] else f"layers={c['num_layers']}, "
            stage = f", stage={c['stage'] - c['pp']}" if c["pp"] > 1 and c["stage"] else ""
            print(f'    C("{c["shape"]}", {layers}tp={c["tp"]}, pp={c["pp"]}, dp={c["dp"]}, mb={c["micro_batch"]}, '
                  f'm={c["num_microbatches"]}, seq={c["seq_length"]}, recompute="{c["recompute"]}"{stage}),')
        return
    batch = draw(seed, int(args.get("--chunked", 8)), int(args.get("--ce", 4)), args.get("--batch", "fresh4"))
    print(f"# seed {seed}: {len(batch)} configurations")
    for c in batch:
        loss = ', loss="ce"' if c["loss"] == "ce" else ""
        print(f'    _c("{c["model"]}", {c["layers"]}, {c["seq"]}, {c["dp"]}, {c["tp"]}, {c["mb"]}, '
              f'"{c["recompute"]}"{loss}),')


if __name__ == "__main__":
    main()
