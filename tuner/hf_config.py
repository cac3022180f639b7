"""A Hugging Face `config.json` (or the folder holding one) as tuner's model keys (tuner.specs MODEL_KEYS).

`--model ./Meta-Llama-3-8B/` or `--model path/config.json` reads the architecture the checkpoint was
saved with. Mapped (transformers' model_type): llama (Llama 1, 2, 3, 3.1), mistral, mixtral, qwen2 (Qwen2
and Qwen2.5), qwen3, qwen3_moe, deepseek_v3 (and deepseek_v2, the same layer with softmax routing). Any
other architecture, or one of these with a key tuner cannot model (a sliding window shorter than the
sequence, an MoE layer pattern other than "every layer after the first dense ones", a gated activation
other than SiLU), is refused with the keys it lacks or that stop it: one line, exit 2.

The training sequence length is not in a config (max_position_embeddings is the longest the positions
reach, not what one trains at): `--seq-length` gives it, and the model's name carries it (`-s4096`), so
trials of one sequence length never answer for another. A config names no global batch either.

Approximated: Qwen2's bias on the query/key/value projections (h + 2*kv numbers per layer, under 0.01 %
of the parameters) is not counted (tuner's add_bias_linear is every linear layer's bias or none), and
DeepSeek-V3's multi-token-prediction layer is left out, as the shipped preset does. Pure.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from tuner.errors import SpecError, UsageError

CONFIG_NAME = "config.json"
#: The dense decoder's keys every mapped architecture has (transformers' names).
DENSE_REQUIRED = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")


def is_hf_source(name: str) -> bool:
    """Whether --model NAME names a Hugging Face config: a .json file, a folder holding config.json, or a
    path to a folder (which then must hold one). A bare name that is also a folder here without a config
    stays a preset name."""
    p = Path(name)
    return name.endswith(".json") or (p.is_dir() and ((p / CONFIG_NAME).is_file() or "/" in name))


def config_path(name: str) -> Path:
    p = Path(name)
    if p.is_dir():
        p = p / CONFIG_NAME
        if not p.is_file():
            raise SpecError(f"--model {name}: the folder holds no {CONFIG_NAME} (a Hugging Face model folder has "
                            "one); give a preset name, a model TOML, or a config.json")
    elif not p.is_file():
        raise SpecError(f"--model {name}: no such file")
    return p


def read_config(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: not a JSON Hugging Face config: {exc}") from None
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: a Hugging Face config is a JSON object, got {type(data).__name__}")
    return data


def model_name(path: Path, seq_length: int) -> str:
    """The folder's name (or the file's stem), lower case, in the characters study names allow, and the
    sequence length it is trained at: meta-llama-3-8b-s8192."""
    stem = path.parent.name if path.name == CONFIG_NAME else path.stem
    stem = re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).strip("-._")[:40] or "hf-model"
    return f"{stem}-s{seq_length}"


def _lacks(cfg: dict, keys) -> list[str]:
    return [k for k in keys if cfg.get(k) is None]


def _refuse(where: str, cfg: dict, why: str) -> SpecError:
    arch = ", ".join(cfg.get("architectures") or []) or "a config that names no architecture"
    return SpecError(f"{where}: {arch} (model_type {cfg.get('model_type')!r}) {why}; or write a model TOML "
                     "(keys as in workloads/models/llama3-8b.toml)")


def _dense(cfg: dict, where: str, seq_length: int) -> dict:
    """The keys every mapped decoder shares: RMSNorm, RoPE, a SiLU-gated MLP (SwiGLU), GQA."""
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise _refuse(where, cfg, f"has hidden_act {act!r}: tuner maps the SiLU-gated MLP (SwiGLU) only")
    window = cfg.get("sliding_window")
    if window and cfg.get("use_sliding_window", True) and window < seq_length:
        raise _refuse(where, cfg, f"attends within sliding_window {window} < --seq-length {seq_length}: tuner "
                                  f"models full causal attention; use --seq-length {window} or less")
    bias = bool(cfg.get("attention_bias", False) or cfg.get("mlp_bias", False))
    out = {"num_layers": cfg["num_hidden_layers"], "hidden_size": cfg["hidden_size"],
           "num_attention_heads": cfg["num_attention_heads"], "vocab_size": cfg["vocab_size"],
           "num_query_groups": cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
           "ffn_type": "swiglu", "ffn_hidden_size": cfg["intermediate_size"], "position_embedding": "rope",
           "rope_theta": float(cfg.get("rope_theta", 10000.0)), "normalization": "rmsnorm",
           "tie_embeddings": bool(cfg.get("tie_word_embeddings", False)), "add_bias_linear": bias}
    if cfg.get("head_dim") and cfg["head_dim"] != cfg["hidden_size"] // cfg["num_attention_heads"]:
        out["head_dim"] = cfg["head_dim"]
    return out


def _mixtral(cfg: dict, where: str) -> dict:
    lacking = _lacks(cfg, ("num_local_experts", "num_experts_per_tok"))
    if lacking:
        raise _refuse(where, cfg, f"lacks {', '.join(lacking)}")
    return {"num_experts": cfg["num_local_experts"], "moe_top_k": cfg["num_experts_per_tok"],
            "moe_ffn_hidden_size": cfg["intermediate_size"]}      # each expert is a Mistral FFN


def _qwen3_moe(cfg: dict, where: str) -> dict:
    lacking = _lacks(cfg, ("num_experts", "num_experts_per_tok", "moe_intermediate_size"))
    if lacking:
        raise _refuse(where, cfg, f"lacks {', '.join(lacking)}")
    step, dense = cfg.get("decoder_sparse_step", 1), sorted(cfg.get("mlp_only_layers") or [])
    if step != 1 or dense != list(range(len(dense))):
        raise _refuse(where, cfg, f"has decoder_sparse_step {step} / mlp_only_layers {dense}: tuner maps MoE "
                                  "layers that follow a run of dense first layers (decoder_sparse_step 1)")
    return {"num_experts": cfg["num_experts"], "moe_top_k": cfg["num_experts_per_tok"],
            "moe_ffn_hidden_size": cfg["moe_intermediate_size"], "moe_first_dense_layers": len(dense)}


def _qwen3(cfg: dict, where: str) -> dict:
    return {"qk_layernorm": True, "head_dim": cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]}


def _deepseek(cfg: dict, where: str) -> dict:
    """Multi-latent attention, dense first layers, then routed and shared experts (DeepSeek-V2/V3)."""
    lacking = _lacks(cfg, ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_routed_experts",
                           "num_experts_per_tok", "moe_intermediate_size"))
    if lacking:
        raise _refuse(where, cfg, f"lacks {', '.join(lacking)}")
    if cfg.get("moe_layer_freq", 1) != 1:
        raise _refuse(where, cfg, f"has moe_layer_freq {cfg['moe_layer_freq']}: tuner maps every layer after "
                                  "first_k_dense_replace as MoE (moe_layer_freq 1)")
    out = {"multi_latent_attention": True, "q_lora_rank": cfg.get("q_lora_rank"), "kv_lora_rank": cfg["kv_lora_rank"],
           "qk_head_dim": cfg["qk_nope_head_dim"], "qk_pos_emb_head_dim": cfg["qk_rope_head_dim"],
           "v_head_dim": cfg["v_head_dim"], "num_experts": cfg["n_routed_experts"],
           "moe_top_k": cfg["num_experts_per_tok"], "num_shared_experts": cfg.get("n_shared_experts") or 0,
           "moe_ffn_hidden_size": cfg["moe_intermediate_size"],
           "moe_first_dense_layers": cfg.get("first_k_dense_replace") or 0,
           "moe_router_score_function": cfg.get("scoring_func", "softmax"),
           "moe_router_expert_bias": cfg.get("topk_method") == "noaux_tc"}       # V3's aux-loss-free bias
    if cfg.get("n_group") and cfg.get("topk_group") and cfg["n_group"] > 1:
        out.update(moe_router_num_groups=cfg["n_group"], moe_router_group_topk=cfg["topk_group"])
    if cfg.get("routed_scaling_factor") not in (None, 1.0):
        out["moe_router_topk_scaling_factor"] = float(cfg["routed_scaling_factor"])
    return out


#: model_type -> what it adds to the dense decoder. Qwen2's QKV bias is not counted (the module's note).
FAMILIES = {"llama": None, "mistral": None, "qwen2": None, "mixtral": _mixtral, "qwen3": _qwen3,
            "qwen3_moe": lambda cfg, where: {**_qwen3(cfg, where), **_qwen3_moe(cfg, where)},
            "deepseek_v3": _deepseek, "deepseek_v2": _deepseek}


def model_keys(cfg: dict, where: str, seq_length: int | None) -> dict:
    """tuner's model keys (tuner.specs MODEL_KEYS, the name included) of Hugging Face config `cfg`."""
    family = cfg.get("model_type")
    lacking = _lacks(cfg, DENSE_REQUIRED)
    if family not in FAMILIES:
        why = f"is not an architecture tuner maps ({', '.join(FAMILIES)})"
        raise _refuse(where, cfg, why + (f"; it lacks {', '.join(lacking)}" if lacking else ""))
    if lacking:
        raise _refuse(where, cfg, f"lacks {', '.join(lacking)}")
    if seq_length is None:
        raise UsageError(f"{where}: a Hugging Face config names no training sequence length: pass --seq-length "
                         f"(its positions reach {cfg.get('max_position_embeddings', '?')} tokens)")
    keys = _dense(cfg, where, seq_length)
    extra = FAMILIES[family]
    if extra is not None:
        keys.update(extra(cfg, where))
    if family.startswith("deepseek"):
        keys.pop("head_dim", None)           # its attention's widths are MLA's (qk/v head dims), not head_dim
    return {"name": model_name(Path(where), seq_length), **keys, "seq_length": seq_length}
