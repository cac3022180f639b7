"""A torchtitan TOML job file from a layout. Pure: returns text, no I/O.

Section and key names are torchtitan's TOML job format, checked against pytorch/torchtitan at
238fa9953e4a (2026-02-23; torchtitan/config/job_config.py and torchtitan/models/llama3/train_configs/*.toml),
the last commit before torchtitan replaced TOML job files with Python configs (#2386, 9810191bbb03). Run it
with that torchtitan (or a release that reads TOML, e.g. v0.2.x):
`python -m torchtitan.train --job.config_file torchtitan.toml`. tests/test_launch_frameworks.py keeps the
keys (TORCHTITAN_KEYS, with the line of each) and fails on a key that is not in it.

Mapping: tp -> tensor_parallel_degree, pp -> pipeline_parallel_degree, dp -> data_parallel_shard_degree
(FSDP2: parameters, gradients and optimizer states all sharded, i.e. ZeRO-3-like whatever the layout's
zero_stage). torchtitan builds its model from a registered flavor, not from numbers in the file: only
models whose shape matches a flavor are rendered; any other model is refused. fp16 is refused
(torchtitan's mixed_precision_param is bfloat16 or float32).
"""

from __future__ import annotations

from tuner.errors import UsageError
from tuner.layout import Layout
from tuner.render.dsconfig import ADAM_PARAMS, GRADIENT_CLIPPING, check_batch
from tuner.specs import ModelSpec, Workload

# torchtitan/models/llama3/__init__.py at 238fa9953e4a: flavor -> (dim, n_layers, n_heads, n_kv_heads)
LLAMA3_FLAVORS = {"8B": (4096, 32, 32, 8), "70B": (8192, 80, 64, 8), "405B": (16384, 126, 128, 8)}
MIXED_PRECISION = {"bf16": "bfloat16"}


def flavor(m: ModelSpec) -> tuple[str, str]:
    """(model name, flavor) of torchtitan's registered model with m's shape, or UsageError."""
    shape = (m.hidden_size, m.num_layers, m.num_attention_heads, m.num_query_groups)
    for name, s in LLAMA3_FLAVORS.items():
        if s == shape and m.ffn_type == "swiglu" and m.position_embedding == "rope":
            return "llama3", name
    raise UsageError(f"--framework torchtitan cannot describe model '{m.name}': torchtitan builds a registered "
                     f"model flavor and none (llama3 {', '.join(LLAMA3_FLAVORS)}) has its architecture; use "
                     "--framework megatron-core or megatron-deepspeed")


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


def job_sections(layout: Layout, workload: Workload, *, precision: str = "bf16",
                 iterations: int = 10) -> dict[str, dict]:
    """{section: {key: value}} of the job file. UsageError for fp16 or a model torchtitan has no flavor of."""
    if precision not in MIXED_PRECISION:
        raise UsageError(f"--framework torchtitan trains in bf16 only (mixed_precision_param bfloat16), got {precision}")
    check_batch(layout, workload)
    m, gb = workload.model, workload.global_batch
    name, flav = flavor(m)
    # With PP, local_batch_size is the rank's batch per step, split into microbatches of the layout's size.
    local = gb // layout.dp if layout.pp > 1 else layout.micro_batch
    parallelism = {"data_parallel_replicate_degree": 1, "data_parallel_shard_degree": layout.dp,
                   "tensor_parallel_degree": layout.tp, "pipeline_parallel_degree": layout.pp,
                   "context_parallel_degree": 1}
    if layout.pp > 1:
        parallelism["pipeline_parallel_microbatch_size"] = layout.micro_batch
    return {
        "job": {"dump_folder": "./outputs", "description": f"tuner launch: {m.name}, {layout.key()}"},
        "metrics": {"log_freq": 1},
        "model": {"name": name, "flavor": flav},
        "optimizer": {"name": "AdamW", "lr": ADAM_PARAMS["lr"], "beta1": ADAM_PARAMS["betas"][0],
                      "beta2": ADAM_PARAMS["betas"][1], "eps": ADAM_PARAMS["eps"],
                      "weight_decay": ADAM_PARAMS["weight_decay"]},
        "training": {"local_batch_size": local, "global_batch_size": gb, "seq_len": m.seq_length,
                     "max_norm": GRADIENT_CLIPPING, "steps": iterations,
                     "mixed_precision_param": MIXED_PRECISION[precision]},
        "parallelism": parallelism,
        "activation_checkpoint": {"mode": layout.recompute if layout.recompute != "selective" else "selective"},
    }


def render_job(layout: Layout, workload: Workload, *, precision: str = "bf16", iterations: int = 10) -> str:
    """The TOML job file text."""
    sections = job_sections(layout, workload, precision=precision, iterations=iterations)
    lines = [f"# torchtitan job file written by `tuner launch --framework torchtitan` ({workload.nodes} x "
             f"{workload.cluster.name}, {workload.gpus} GPUs)",
             "# Format: torchtitan's TOML job config (job_config.py at 238fa9953e4a, before #2386).",
             "# dp is FSDP's data_parallel_shard_degree: parameters, gradients and optimizer states are all",
             "# sharded over it (ZeRO-3-like), whatever ZeRO stage the layout was measured with.",
             f"# global batch {workload.global_batch} = local batch x gradient accumulation x dp {layout.dp}"]
    for section, keys in sections.items():
        lines += ["", f"[{section}]", *(f"{k} = {_toml(v)}" for k, v in keys.items())]
    return "\n".join(lines) + "\n"
