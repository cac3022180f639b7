"""Model, cluster and workload specs, loaded from TOML with unknown keys rejected.

A spec is named by a preset name (`gpt-175b`, alias `175b`; `frontier`) or by a path to a TOML file,
found as tuner.presets says. Pure apart from reading those files.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from tuner.architecture import MLA_KEYS, MOE_KEYS, ArchitectureSizes, check_moe
from tuner import hf_config
from tuner.errors import SpecError, UsageError
from tuner.frameworks import NAMES as FRAMEWORK_NAMES, grad_reduces as framework_grad_reduces
from tuner.precision import PRECISIONS, refusal as precision_refusal
from tuner.presets import find_spec_file, read_toml
from tuner.cluster_spec import (CLUSTER_KEYS, RETIRED_CLUSTER_KEYS, ClusterSpec, cluster_framework,  # noqa: F401
                                load_cluster)
from tuner.spec_keys import ALLOW_ZERO, MAX_INT, check_keys as _check  # noqa: F401  (names specs always had)


# key -> (type, default); a default of ... means required.
MODEL_KEYS: dict[str, tuple[type, Any]] = {
    "name": (str, ...),
    "num_layers": (int, ...),
    "hidden_size": (int, ...),
    "num_attention_heads": (int, ...),
    "seq_length": (int, ...),
    "vocab_size": (int, ...),
    "ffn_hidden_size": (int, None),              # the real inner width of the FFN (4h for gelu when absent)
    "rope_theta": (float, None),                 # RoPE base (Llama 3: 500000; none: the framework's 10000)
    "global_batch": (int, None),
    # Architecture (defaults: the GPT-3-style model of the Frontier study and the GPT presets).
    "num_query_groups": (int, None),             # key/value heads (GQA; 1 = MQA); default num_attention_heads
    "ffn_type": (str, "gelu"),                   # "gelu": h->f->h, two matrices; "swiglu": h->f twice (gate, up), f->h
    "position_embedding": (str, "learned"),      # "learned": an s x h table on the first stage; "rope": no parameters
    "tie_embeddings": (bool, True),              # LM head shares the word embedding; false: its own V x h matrix
    "normalization": (str, "layernorm"),         # "layernorm" (weight and bias) | "rmsnorm" (weight only)
    "add_bias_linear": (bool, True),             # biases on the linear layers (GPT: yes; Llama: none)
    "head_dim": (int, None),                     # width of one attention head (Megatron --kv-channels); default
                                                 # hidden_size / num_attention_heads (Qwen3: 128 at h 2048, 32 heads)
    "qk_layernorm": (bool, False),               # RMSNorm on each head's query and key (Qwen3)
    # Multi-latent attention (DeepSeek-V2/V3; Megatron-Core --multi-latent-attention and its MLA flags)
    "multi_latent_attention": (bool, False),
    "q_lora_rank": (int, None),                  # query down-projection rank (none: a full h x a*(qk+rope) query)
    "kv_lora_rank": (int, None),                 # the compressed key/value latent's width
    "qk_head_dim": (int, None),                  # per-head query/key width without the rotary part
    "qk_pos_emb_head_dim": (int, None),          # per-head rotary width (its key part is shared by all heads)
    "v_head_dim": (int, None),                   # per-head value width
    # Mixture of experts (Megatron-Core's names in brackets). num_experts 0: a dense model.
    "num_experts": (int, 0),                     # routed experts per MoE layer (--num-experts)
    "moe_top_k": (int, None),                    # routed experts per token (--moe-router-topk); needed with experts
    "num_shared_experts": (int, 0),              # experts every token goes through (x moe_ffn_hidden_size:
                                                 # --moe-shared-expert-intermediate-size)
    "moe_ffn_hidden_size": (int, None),          # one expert's FFN width (--moe-ffn-hidden-size); default ffn_hidden_size
    "moe_layer_freq": (int, 1),                  # every k-th layer (after the first dense ones) is MoE (--moe-layer-freq)
    "moe_first_dense_layers": (int, 0),          # dense layers before the first MoE layer (DeepSeek-V3: 3)
    "moe_capacity_factor": (float, None),        # expert capacity / fair share, tokens over it dropped
                                                 # (--moe-expert-capacity-factor); none: dropless
    "moe_router_score_function": (str, "softmax"),  # "softmax" | "sigmoid" (DeepSeek-V3)
    "moe_router_num_groups": (int, None),        # group-limited routing: expert groups (DeepSeek-V3 n_group 8)
    "moe_router_group_topk": (int, None),        # groups a token may use (DeepSeek-V3 topk_group 4)
    "moe_router_topk_scaling_factor": (float, None),  # routed weights' scale (DeepSeek-V3 2.5)
    "moe_router_expert_bias": (bool, False),     # aux-loss-free balancing: a per-expert routing bias (DeepSeek-V3)
    # Multi-token prediction (DeepSeek-V3's num_nextn_predict_layers; Megatron-Core --mtp-num-layers): modules after
    # the last layer, on the last pipeline stage, each one more layer of the last layer's kind, an h x 2h projection,
    # the LM head and loss again. 0 (the default, and the DeepSeek-V3 preset's, as NVIDIA's "w/o MTP" runs): none.
    "mtp_num_layers": (int, 0),
}
# Allowed values of the model's string keys other than the name.
MODEL_CHOICES: dict[str, tuple[str, ...]] = {
    "ffn_type": ("gelu", "swiglu"),
    "position_embedding": ("learned", "rope"),
    "normalization": ("layernorm", "rmsnorm"),
    "moe_router_score_function": ("softmax", "sigmoid"),
}

@dataclass(frozen=True)
class ModelSpec(ArchitectureSizes):
    """A decoder-only transformer. Notation: L layers, h hidden, a heads, g query groups (key/value
    heads), d = h/a the head size, kv = g*d the width of K and of V, f the FFN inner width, V vocabulary,
    s sequence. One layer holds Q and O (h x h each), K and V (h x kv each), and the FFN: gelu h x f and
    f x h; swiglu h x f twice (gate and up, one fused fc1 of width 2f in Megatron) and f x h. Its
    sizes (weights, parameters, MoE and MLA widths) are tuner.architecture.ArchitectureSizes."""

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    seq_length: int
    vocab_size: int
    ffn_hidden_size: int = 0
    global_batch: int | None = None
    num_query_groups: int = 0
    ffn_type: str = "gelu"
    position_embedding: str = "learned"
    tie_embeddings: bool = True
    normalization: str = "layernorm"
    add_bias_linear: bool = True
    rope_theta: float | None = None
    head_dim: int = 0                       # 0: hidden_size / num_attention_heads
    qk_layernorm: bool = False
    multi_latent_attention: bool = False
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_head_dim: int | None = None
    qk_pos_emb_head_dim: int | None = None
    v_head_dim: int | None = None
    num_experts: int = 0                    # 0: dense
    moe_top_k: int = 0
    num_shared_experts: int = 0
    moe_ffn_hidden_size: int = 0            # 0: ffn_hidden_size
    moe_layer_freq: int = 1
    moe_first_dense_layers: int = 0
    moe_capacity_factor: float | None = None   # None: dropless
    moe_router_score_function: str = "softmax"
    moe_router_num_groups: int | None = None
    moe_router_group_topk: int | None = None
    moe_router_topk_scaling_factor: float | None = None
    moe_router_expert_bias: bool = False
    mtp_num_layers: int = 0                 # multi-token prediction modules on the last stage

    def __post_init__(self):
        if not self.ffn_hidden_size:
            if self.ffn_type != "gelu":
                raise SpecError(f"model '{self.name}': ffn_type \"{self.ffn_type}\" needs ffn_hidden_size "
                                "(the real inner width, e.g. 14336 for Llama 3 8B)")
            object.__setattr__(self, "ffn_hidden_size", 4 * self.hidden_size)
        if not self.num_query_groups:
            object.__setattr__(self, "num_query_groups", self.num_attention_heads)
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.num_experts and not self.moe_ffn_hidden_size:
            object.__setattr__(self, "moe_ffn_hidden_size", self.ffn_hidden_size)

    def as_dict(self) -> dict:
        """Every key; those of later architectures (head_dim, MLA, MoE) only away from their defaults,
        so a dense model's stored form is what it was before they existed."""
        d = asdict(self)
        for k in LATER_KEYS:
            if d[k] == _DATACLASS_DEFAULTS[k] or (k == "head_dim" and d[k] == self.hidden_size // self.num_attention_heads) \
                    or (k == "moe_ffn_hidden_size" and not self.is_moe):
                del d[k]
        return d

    @classmethod
    def from_dict(cls, data: dict, where: str = "model") -> "ModelSpec":
        d = _check("model", where, data, MODEL_KEYS)
        check_moe(d, data, where, MODEL_KEYS)
        for k, allowed in MODEL_CHOICES.items():
            if d[k] not in allowed:
                raise SpecError(f"{where}: model key '{k}' must be one of {', '.join(map(repr, allowed))}, "
                                f"got {d[k][:200]!r}")
        if d["hidden_size"] % d["num_attention_heads"]:
            raise SpecError(f"{where}: hidden_size {d['hidden_size']} is not divisible by "
                            f"num_attention_heads {d['num_attention_heads']}")
        if d["num_query_groups"] is not None and d["num_attention_heads"] % d["num_query_groups"]:
            raise SpecError(f"{where}: num_query_groups {d['num_query_groups']} must divide num_attention_heads "
                            f"{d['num_attention_heads']} (each key/value head serves the same number of query heads)")
        if d["ffn_type"] != "gelu" and d["ffn_hidden_size"] is None:
            raise SpecError(f"{where}: ffn_type \"{d['ffn_type']}\" needs ffn_hidden_size, the real inner width "
                            "(e.g. 14336 for Llama 3 8B); only gelu defaults it to 4 * hidden_size")
        return cls(**{**d, "ffn_hidden_size": d["ffn_hidden_size"] or 0, "num_query_groups": d["num_query_groups"] or 0,
                      "head_dim": d["head_dim"] or 0, "moe_top_k": d["moe_top_k"] or 0,
                      "moe_ffn_hidden_size": d["moe_ffn_hidden_size"] or 0})


#: Model keys added with MoE and MLA: ModelSpec.as_dict leaves them out at their defaults.
LATER_KEYS = ("head_dim", "qk_layernorm", "multi_latent_attention", *MLA_KEYS, "q_lora_rank", "num_experts",
              *MOE_KEYS, "moe_router_score_function", "moe_router_expert_bias", "mtp_num_layers")
_DATACLASS_DEFAULTS = {f.name: f.default for f in fields(ModelSpec)}


#: bf16, fp8, mxfp8, nvfp4 (tuner.precision: what each needs of the cluster and the framework)
PRECISIONS = PRECISIONS
GRAD_REDUCES = ("fp32", "bf16")    # the dtype gradients accumulate and reduce in (tuner.frameworks grad_reduces)
OPTIMIZER_MOMENTS = ("fp32", "bf16")   # Adam's two moments (bf16: Megatron-Core's precision-aware optimizer)


@dataclass(frozen=True)
class Workload:
    """What a study tunes for: a model on `nodes` nodes of a cluster at a global batch, in a precision
    (bf16, or fp8: the layers' GEMMs at the cluster's FP8 rate, the rest in bf16; MFU is stated
    against the bf16 peak either way, as published tables do), trained by a framework
    (tuner.frameworks: which layouts exist, their memory and their overlaps)."""

    model: ModelSpec
    cluster: ClusterSpec
    nodes: int
    global_batch: int
    precision: str = "bf16"
    framework: str = ""
    grad_reduce: str = ""     # fp32 | bf16; "" = the framework's default (tuner.frameworks grad_reduces[0])
    optimizer_moments: str = ""   # fp32 | bf16; "" = fp32 (bf16: --use-precision-aware-optimizer, Megatron-Core only)
    ddp_bucket_size: int = 0  # Megatron-Core's --ddp-bucket-size (elements) a run set; 0: its default (launch's)

    def __post_init__(self):
        if not self.framework:
            object.__setattr__(self, "framework", self.cluster.framework)
        object.__setattr__(self, "cluster", self.cluster.for_nodes(self.nodes))   # the domain this job gets

    @property
    def gpus(self) -> int:
        return self.nodes * self.cluster.gpus_per_node

    @property
    def gradient_dtype(self) -> str:
        """The dtype gradients accumulate and reduce in: `grad_reduce`, or the framework's default."""
        return self.grad_reduce or framework_grad_reduces(self.framework)[0]

    def as_dict(self) -> dict:
        return {"model": self.model.as_dict(), "cluster": self.cluster.as_dict(),
                "nodes": self.nodes, "global_batch": self.global_batch, "precision": self.precision,
                "framework": self.framework, "grad_reduce": self.grad_reduce,
                **({"optimizer_moments": self.optimizer_moments} if self.optimizer_moments else {}),
                **({"ddp_bucket_size": self.ddp_bucket_size} if self.ddp_bucket_size else {})}

    @classmethod
    def from_dict(cls, d: dict) -> "Workload":
        """A stored workload; one stored before frameworks existed runs on its cluster's (comm_overlap: Megatron-Core)."""
        return cls(ModelSpec.from_dict(d["model"]), ClusterSpec.from_dict(d["cluster"]),
                   int(d["nodes"]), int(d["global_batch"]), d.get("precision") or "bf16", d.get("framework") or "",
                   d.get("grad_reduce") or "", d.get("optimizer_moments") or "",
                   int(d.get("ddp_bucket_size") or 0))


#: The settings a stored workload is matched on beside its model, cluster, nodes and global batch (`tuner
#: best`: speeds and peaks in another precision or with other optimizer moments do not compare), each with
#: what a workload that leaves it out (or was stored before it existed) ran with.
STORED_SETTINGS = {"precision": "bf16", "optimizer_moments": "fp32"}


def stored_setting(workload: dict | None, key: str) -> str:
    """Setting `key` (one of STORED_SETTINGS) of a stored workload, its default where left out."""
    return (workload or {}).get(key) or STORED_SETTINGS[key]


def stored_framework(workload: dict | None) -> str:
    """The framework of a stored workload (one stored before frameworks: its cluster's stack)."""
    w = workload or {}
    return w.get("framework") or cluster_framework(w.get("cluster") or {})


def load_model(name: str, seq_length: int | None = None) -> ModelSpec:
    """A preset, a model TOML, or a Hugging Face config.json / its folder (tuner.hf_config); at `seq_length`
    tokens when given (the model's name then says so: with_seq_length)."""
    if hf_config.is_hf_source(name):
        path = hf_config.config_path(name)
        return ModelSpec.from_dict(hf_config.model_keys(hf_config.read_config(path), str(path), seq_length), str(path))
    path = find_spec_file("models", name)
    return with_seq_length(ModelSpec.from_dict(read_toml(path), str(path)), seq_length)


def with_seq_length(m: ModelSpec, seq_length: int | None) -> ModelSpec:
    """`m` trained at `seq_length` tokens (None: its own). Its name carries a length other than its own
    (llama3-8b-s4096), so a study, `best` and the correction never take one length's trials for another's."""
    if seq_length is None or seq_length == m.seq_length:
        return m
    if not 1 <= seq_length <= MAX_INT:
        raise UsageError(f"--seq-length must be between 1 and {MAX_INT} (got {seq_length})")
    base = re.sub(r"-s\d+$", "", m.name)
    return replace(m, name=f"{base}-s{seq_length}", seq_length=seq_length)


def make_workload(model: str | ModelSpec, nodes: int, cluster: str | ClusterSpec = "frontier",
                  global_batch: int | None = None, precision: str = "bf16", framework: str | None = None,
                  grad_reduce: str | None = None, seq_length: int | None = None,
                  optimizer_moments: str | None = None, ddp_bucket_size: int = 0) -> Workload:
    if isinstance(model, str):
        _needs_training_choices(model, seq_length, global_batch)
    m = load_model(model, seq_length) if isinstance(model, str) else with_seq_length(model, seq_length)
    c = load_cluster(cluster) if isinstance(cluster, str) else cluster
    if nodes is None:
        raise UsageError("missing option --nodes: the number of nodes to tune for")
    if nodes < 1:
        raise UsageError(f"--nodes must be >= 1 (got {nodes})")
    gb = global_batch if global_batch is not None else m.global_batch
    if gb is None:
        raise UsageError(f"model '{m.name}' has no default global batch: pass --global-batch")
    if gb < 1:
        raise UsageError(f"--global-batch must be >= 1 (got {gb})")
    if gb > MAX_INT:
        raise UsageError(f"--global-batch must be at most {MAX_INT} (got {gb})")
    if nodes * c.gpus_per_node > MAX_INT:
        raise UsageError(f"{nodes} nodes x {c.gpus_per_node} GPUs is more than {MAX_INT} GPUs: use fewer --nodes")
    if framework is not None and framework not in FRAMEWORK_NAMES:
        raise UsageError(f"--framework must be one of {', '.join(FRAMEWORK_NAMES)} (got {framework!r})")
    fw = framework or c.framework
    why = precision_refusal(precision, c, fw)
    if why:
        raise UsageError(why)
    if grad_reduce and grad_reduce not in framework_grad_reduces(fw):
        raise UsageError(f"--grad-reduce {grad_reduce} is not something {fw} does: it reduces gradients in "
                         f"{' or '.join(framework_grad_reduces(fw))}; leave --grad-reduce out")
    if optimizer_moments not in (None, *OPTIMIZER_MOMENTS):
        raise UsageError(f"--optimizer-moments must be one of {', '.join(OPTIMIZER_MOMENTS)} "
                         f"(got {optimizer_moments!r})")
    if optimizer_moments == "bf16" and fw != "megatron-core":
        raise UsageError(f"--optimizer-moments bf16 is Megatron-Core's precision-aware optimizer; {fw} keeps Adam's "
                         "moments in fp32: leave --optimizer-moments out, or --framework megatron-core")
    return Workload(m, c, nodes, gb, precision, fw, grad_reduce or "",
                    "" if optimizer_moments in (None, "fp32") else optimizer_moments, ddp_bucket_size)


def _needs_training_choices(model: str, seq_length: int | None, global_batch: int | None) -> None:
    """A Hugging Face config names neither the sequence length nor the batch it is trained at: both
    missing ones in one line, before anything else is checked."""
    if not hf_config.is_hf_source(model):
        return
    missing = [flag for flag, v in (("--seq-length", seq_length), ("--global-batch", global_batch)) if v is None]
    if missing:
        raise UsageError(f"--model {model} is a Hugging Face config, which names no training sequence length or "
                         f"global batch: pass {' and '.join(missing)} (e.g. --seq-length 4096 --global-batch 512)")
