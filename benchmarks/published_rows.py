"""The rows every accuracy benchmark reads, one configuration one row: the data files (`PUBLISHED`, `MEASURED`,
`HARDWARE`), a row's configuration (`CONFIG_KEYS`, `split_key`), the dedup across files (`distinct`) and the held-out
split by a hash of the configuration (`held_out`, `held_out_lines`). benchmarks/published.py re-exports every name
here (its docstring states the rules); what saw which row is benchmarks/seen.py's.
"""

from __future__ import annotations

import hashlib
import statistics
import tomllib
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
PUBLISHED = ("llama_published.toml", "framework_published.toml", "moe_published.toml")
MEASURED = ("memory_measured_megatron-core.toml", "memory_measured_torchtitan.toml",
            "memory_measured_torchtitan_fresh.toml", "memory_measured_torchtitan_fresh2.toml",
            "memory_measured_torchtitan_fresh3.toml", "memory_measured_megatron-core_fresh.toml",
            "memory_measured_torchtitan_fresh4.toml", "memory_measured_megatron-core_fresh2.toml",
            "memory_measured_megatron-core_fresh3.toml", "memory_measured_megatron-core_fresh4.toml",
            "memory_measured_megatron-core_fresh5.toml", "memory_measured_torchtitan_rows.toml",
            "memory_measured_megatron-deepspeed.toml", "memory_measured_megatron-deepspeed_fresh.toml")
#: Published runs on the machines of issue 26 (benchmarks/hardware_accuracy.py): split by the same rule and
#: listed in held_out.txt, but kept out of `published()`, whose rows the memory and framework fits read.
HARDWARE = ("hardware_published.toml",)
HELD_OUT_FILE = DATA / "held_out.txt"
SHAPE_KEYS = ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size",
              "vocab_size", "num_experts", "moe_router_topk", "moe_ffn_hidden_size")
CONFIG_KEYS = ("framework", "model", "cluster", "gpus", "precision", "seq_length", "global_batch", "micro_batch",
               "tp", "pp", "cp", "vp", "ep", "etp", "sequence_parallel", "recompute", "zero_stage",
               "moe_capacity_factor")


#: A published Megatron-Core row whose source leaves the gradient dtype unstated is predicted as every NVIDIA
#: recipe that states it ran (42 of 42 rows: bf16, --grad-reduce-in-bf16); a measured row ran the script's.
UNSTATED_GRAD_REDUCE = "bf16"


def grad_reduce(row: dict) -> str | None:
    """The gradient dtype to predict a row with (None: the framework's default)."""
    gr = row.get("grad_reduce", "unstated")
    if gr != "unstated":
        return gr
    if row.get("framework") == "megatron-core" and "peak_allocated_gib" not in row:
        return UNSTATED_GRAD_REDUCE
    return None


def zero_stage(row: dict) -> int:
    """The row's ZeRO stage: stated, or 1 with the distributed optimizer (0 without, 1 when unstated)."""
    if "zero_stage" in row:
        return int(row["zero_stage"])
    return 0 if row.get("distributed_optimizer") is False else 1


def split_key(row: dict) -> str:
    """The configuration of a row as one string: what ran, not where it was read (nor which pipeline stage
    of it was measured: both stages of one run fall on the same side of the split)."""
    parts = [f"{k}={row.get(k, '')}" for k in CONFIG_KEYS if k != "zero_stage"]
    parts.append(f"zero_stage={zero_stage(row)}")
    if row.get("model") == "custom" or "num_layers" in row:
        parts += [f"{k}={row.get(k, '')}" for k in SHAPE_KEYS]
    return "|".join(parts)


def loss_of(row: dict) -> str | None:
    """A torchtitan memory measurement's loss: torchtitan 0.3.0's default ChunkedLossWrapper or the un-chunked
    CrossEntropyLoss (its note says which); None for any other row."""
    note = row.get("note", "")
    return "chunked" if "ChunkedLossWrapper" in note else "un-chunked" if "un-chunked" in note else None


#: A row of a model no preset holds (model = "custom") states its shape in these keys (ModelSpec's), named by shape_name;
#: head_dim only where a head is not hidden / heads wide (Qwen3-32B: 64 heads of 128 over hidden 5,120). It is not in
#: SHAPE_KEYS: the split key of every row written before it stays as it was.
ROW_MODEL_KEYS = ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size",
                  "vocab_size", "ffn_type", "position_embedding", "normalization", "add_bias_linear", "tie_embeddings",
                  "head_dim")


def custom_model(row: dict):
    """The ModelSpec of a model = "custom" row: its stated shape at its sequence length."""
    from tuner.specs import ModelSpec
    return ModelSpec.from_dict({"name": row["shape_name"], "seq_length": row["seq_length"],
                                **{k: row[k] for k in ROW_MODEL_KEYS if k in row}}, f"row {row['shape_name']}")


def config_key(row: dict) -> str:
    """One distinct row: the configuration, and the stage, attention kernel and loss of a memory measurement
    (a chunked and an un-chunked loss are two measurements of different code, never one median)."""
    loss = loss_of(row)
    return (split_key(row) + "".join(f"|{k}={row[k]}" for k in ("stage", "attention") if k in row)
            + (f"|loss={loss}" if loss else ""))


def held_out(row: dict) -> bool:
    """Whether the row's configuration is in the held-out third: a hash of the configuration only."""
    return int(hashlib.sha256(split_key(row).encode()).hexdigest()[:8], 16) % 3 == 0


def _load(names) -> list[dict]:
    rows = []
    for name in names:
        path = DATA / name
        if not path.exists():
            continue
        with open(path, "rb") as f:
            rows += [{**r, "file": name} for r in tomllib.load(f).get("row", [])]
    return rows


def _merge(group: list[dict]) -> dict:
    """One distinct configuration from its measurements: the first row's fields, the median of the stated
    throughputs and peaks, every source and release, and how many measurements it has."""
    out = dict(group[0])
    for k in ("tokens_per_s_per_gpu", "peak_memory_gib", "peak_allocated_gib", "step_time_s"):
        vals = [r[k] for r in group if r.get(k)]
        if vals:
            out[k] = statistics.median(vals)
    out["sources"] = sorted({r["source"] for r in group})
    out["releases"] = sorted({r.get("release", "") for r in group})
    out["files"] = sorted({r["file"] for r in group})
    out["measurements"] = len(group)
    return out


def distinct(rows: list[dict]) -> list[dict]:
    """One row per configuration (first-seen order)."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(config_key(r), []).append(r)
    return [_merge(g) for g in groups.values()]


def published() -> list[dict]:
    """The distinct published configurations (all three files)."""
    return distinct(_load(PUBLISHED))


def measured() -> list[dict]:
    """The distinct configurations measured over the frameworks' own code (fake tensors)."""
    return distinct(_load(MEASURED))


def hardware() -> list[dict]:
    """The distinct configurations of the new machines' published runs (HARDWARE)."""
    return distinct(_load(HARDWARE))


def held_out_lines() -> list[str]:
    return sorted({split_key(r) for r in published() + measured() + hardware() if held_out(r)})


# Row predicates that benchmarks/seen.py's choices share. The older splits hashed source lines; the rows they called
# "tuning" are named by those rules (_legacy_third): a row seen under them is never held out.
def _legacy_third(row: dict, keys: tuple) -> bool:
    key = "|".join(str(row.get(k)) for k in keys)
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % 3 == 0


_LEGACY = ("source", "model", "gpus", "precision", "seq_length", "global_batch", "micro_batch", "tp", "pp", "cp", "vp", "recompute", "zero_stage")
_LEGACY_MOE = ("source", "model", "gpus", "precision", "seq_length", "global_batch", "micro_batch", "tp", "pp", "cp", "vp", "ep", "recompute")


def _any_source(row: dict, pred) -> bool:
    return any(pred({**row, "source": s}) for s in row.get("sources", [row.get("source")]))


def _bucket_moved(r: dict) -> bool:
    """A row whose default gradient bucket the dp x cp rule (tuner/perfmodel/buckets.py, review of issue 26) sized
    otherwise than the dp rule before it: context parallel, a distributed or no optimizer sharding (ZeRO <= 1) and a
    dp x cp group (GPUs / (tp x pp as ran)) over 40, where 1M x dp x cp passes the 40M floor."""
    pp = int(r.get("ran_pp", r.get("pp", 1)) or 1)
    return (int(r.get("cp", 1) or 1) > 1 and zero_stage(r) <= 1
            and int(r.get("gpus", 0)) // (int(r.get("tp", 1) or 1) * pp) > 40)


def mb_tables_read(r: dict) -> bool:
    """A row of the Megatron-Bridge performance-summary tables issue 26's fifteenth session read (benchmarks/seen.py
    HARDWARE_SEEN): every row of the 25.11 release's, and the Llama 3 rows of 26.02 - 26.06's."""
    rel, llama = r.get("releases") or [r.get("release", "")], str(r.get("model", "")).startswith("llama3")
    later = tuple(f"Megatron-Bridge {v} " for v in ("26.02", "26.02.01", "26.04", "26.04.01", "26.06"))
    return any(x.startswith("Megatron-Bridge 25.11 ") or (llama and x.startswith(later)) for x in rel)
