"""The sizes a model spec derives from its keys: widths, weights and parameters of its dense and
mixture-of-experts layers (docs/reference/formulas.md; Megatron-Core's GPT layer, its MoE layer and
multi-latent attention), computed once per spec: the performance model reads them on every prediction.
And the checks of the MoE and MLA keys. Pure.

Notation: L layers, h hidden, a heads, g query groups (key/value heads), d the head size (h/a unless
head_dim says otherwise), kv = g*d the width of K and of V, f the FFN inner width, V vocabulary, s sequence;
E routed experts of width f_e, top_k of them per token. ModelSpec (tuner.specs) mixes these in.
"""

from __future__ import annotations

from functools import cached_property

from tuner.errors import SpecError

#: MoE keys that need num_experts > 0.
MOE_KEYS = ("moe_top_k", "num_shared_experts", "moe_ffn_hidden_size", "moe_layer_freq", "moe_first_dense_layers",
            "moe_capacity_factor", "moe_router_num_groups", "moe_router_group_topk", "moe_router_topk_scaling_factor")
#: Multi-latent attention's widths (all needed with multi_latent_attention, q_lora_rank optional).
MLA_KEYS = ("kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")


class ArchitectureSizes:
    """Derived sizes of a tuner.specs.ModelSpec (which supplies the keys as attributes)."""

    @cached_property
    def head_size(self) -> int:
        """d: hidden_size / num_attention_heads, or the model's head_dim."""
        return self.head_dim

    # ---- mixture of experts (Megatron-Core's MoE layer: a router h x E, E routed experts of width
    # moe_ffn_hidden_size of which moe_top_k run per token, and shared experts every token runs)
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @cached_property
    def moe_layer_pattern(self) -> tuple[bool, ...]:
        """Per layer, whether it is an MoE layer: after moe_first_dense_layers dense layers, every
        moe_layer_freq-th layer (layer i - first with (i - first) % freq == 0; Megatron-Core's integer
        --moe-layer-freq N is the same with no dense layers first: gpt_layer_specs.py, i % N == 0)."""
        first, freq = self.moe_first_dense_layers, self.moe_layer_freq
        return tuple(self.is_moe and i >= first and (i - first) % freq == 0 for i in range(self.num_layers))

    @cached_property
    def num_moe_layers(self) -> int:
        return sum(self.moe_layer_pattern)

    @cached_property
    def kv_size(self) -> int:
        """Width of K and of V: num_query_groups x head size (= h for multi-head attention)."""
        return self.num_query_groups * self.head_size

    # Widths (per token, all heads) of the attention's tensors. Standard attention: Q a*d, K and V kv,
    # the output (the projection's input) a*d (= h unless head_dim says otherwise). Multi-latent
    # attention (DeepSeek-V3) up-projects its latents to per-head Q and K of qk_head_dim +
    # qk_pos_emb_head_dim and V of v_head_dim: a*192, a*192 and a*128, much wider than h.
    @cached_property
    def q_width(self) -> int:
        if self.multi_latent_attention:
            return self.num_attention_heads * (self.qk_head_dim + self.qk_pos_emb_head_dim)
        return self.num_attention_heads * self.head_size

    @cached_property
    def k_width(self) -> int:
        return self.q_width if self.multi_latent_attention else self.kv_size

    @cached_property
    def v_width(self) -> int:
        return self.num_attention_heads * self.v_head_dim if self.multi_latent_attention else self.kv_size

    @cached_property
    def o_width(self) -> int:
        return self.v_width if self.multi_latent_attention else self.q_width

    @cached_property
    def attention_core_width(self) -> float:
        """(Q width + output width) / 2: the score product does 2*s*q and the value product 2*s*o FLOPs per
        token, 4*s*h together for standard attention with a*d = h."""
        return (self.q_width + self.o_width) / 2

    @cached_property
    def ffn_matrices(self) -> int:
        """Weight matrices of the FFN: 2 (gelu: fc1, fc2), 3 (swiglu: gate, up, down)."""
        return 3 if self.ffn_type == "swiglu" else 2

    @cached_property
    def qkv_weights(self) -> int:
        """The weights that make Q, K and V: h x (q + 2kv); with MLA the down-projections to the query
        latent (h x q_lora_rank; none without it) and to the key/value latent plus the shared rotary key
        (h x (kv_lora_rank + rope)), and the up-projections from them (q_lora x a*(qk + rope),
        kv_lora x a*(qk + v))."""
        h = self.hidden_size
        if not self.multi_latent_attention:
            return h * (self.q_width + 2 * self.kv_size)
        a, q_lora, kv_lora = self.num_attention_heads, self.q_lora_rank, self.kv_lora_rank
        q = h * q_lora + q_lora * self.q_width if q_lora else h * self.q_width
        return q + h * (kv_lora + self.qk_pos_emb_head_dim) + kv_lora * a * (self.qk_head_dim + self.v_head_dim)

    @cached_property
    def attention_weights(self) -> int:
        """Q, K, V and output projection weights of one layer: 2h^2 + 2h*kv (4h^2 multi-head) when a*d = h."""
        return self.qkv_weights + self.o_width * self.hidden_size

    @cached_property
    def ffn_weights(self) -> int:
        """FFN weights of one dense layer: 2hf (gelu) or 3hf (swiglu)."""
        return self.ffn_matrices * self.hidden_size * self.ffn_hidden_size

    @cached_property
    def attention_biases_split(self) -> int:
        """QKV biases (split across tensor-parallel ranks)."""
        return self.q_width + self.k_width + self.v_width if self.add_bias_linear else 0

    @cached_property
    def layer_biases_split(self) -> int:
        """Biases split across tensor-parallel ranks: QKV (h + 2kv) and fc1 (f, 2f for swiglu)."""
        if not self.add_bias_linear:
            return 0
        return self.attention_biases_split + (self.ffn_matrices - 1) * self.ffn_hidden_size

    @cached_property
    def layer_biases_replicated(self) -> int:
        """Biases every tensor-parallel rank keeps whole: attention projection and fc2 (h each)."""
        return 2 * self.hidden_size if self.add_bias_linear else 0

    @cached_property
    def norm_params(self) -> int:
        """Parameters of one normalization: 2h (LayerNorm weight and bias) or h (RMSNorm weight)."""
        return (2 if self.normalization == "layernorm" else 1) * self.hidden_size

    @cached_property
    def layer_norm_params(self) -> int:
        """A layer's normalizations: its two of width h, the per-head query and key norms (qk_layernorm:
        2d) and MLA's norms of its latents (q_lora_rank + kv_lora_rank)."""
        n = 2 * self.norm_params + (2 * self.head_size if self.qk_layernorm else 0)
        if self.multi_latent_attention:
            n += (self.q_lora_rank or 0) + self.kv_lora_rank
        return n

    @cached_property
    def layer_parameters(self) -> int:
        """One dense layer: weights, biases and its normalizations."""
        return (self.attention_weights + self.ffn_weights + self.layer_biases_split
                + self.layer_biases_replicated + self.layer_norm_params)

    # ---- MoE layers: the attention of a dense layer, then a router (h x E), num_experts routed experts
    # and the shared experts (one FFN num_shared_experts x moe_ffn_hidden_size wide, as Megatron-Core's
    # --moe-shared-expert-intermediate-size builds it)
    def ffn_parameters(self, width: int) -> int:
        """An FFN `width` wide: its matrices (h x width, width x h) and their biases when the model has them."""
        bias = (self.ffn_matrices - 1) * width + self.hidden_size if self.add_bias_linear and width else 0
        return self.ffn_matrices * self.hidden_size * width + bias

    @cached_property
    def expert_parameters(self) -> int:
        """One routed expert."""
        return self.ffn_parameters(self.moe_ffn_hidden_size)

    @cached_property
    def shared_expert_width(self) -> int:
        return self.num_shared_experts * self.moe_ffn_hidden_size

    @cached_property
    def shared_expert_parameters(self) -> int:
        return self.ffn_parameters(self.shared_expert_width)

    @cached_property
    def router_parameters(self) -> int:
        return self.hidden_size * self.num_experts

    @cached_property
    def moe_dense_parameters(self) -> int:
        """An MoE layer's parameters outside the routed experts: attention, router, shared experts, norms."""
        attn_bias = self.attention_biases_split + self.hidden_size if self.add_bias_linear else 0
        return (self.attention_weights + attn_bias + self.layer_norm_params + self.router_parameters
                + self.shared_expert_parameters)

    @cached_property
    def moe_layer_parameters(self) -> int:
        return self.moe_dense_parameters + self.num_experts * self.expert_parameters

    @cached_property
    def moe_layer_active_parameters(self) -> int:
        """The parameters one token uses in an MoE layer: all but the routed experts it is not sent to."""
        return self.moe_dense_parameters + self.moe_top_k * self.expert_parameters

    @cached_property
    def embedding_parameters(self) -> int:
        """Word embedding V*h, plus the learned position table s*h."""
        h = self.hidden_size
        return self.vocab_size * h + (self.seq_length * h if self.position_embedding == "learned" else 0)

    @cached_property
    def output_parameters(self) -> int:
        """The final normalization, and the LM head's V*h matrix when it is not tied to the embedding."""
        return self.norm_params + (0 if self.tie_embeddings else self.vocab_size * self.hidden_size)

    @cached_property
    def num_parameters(self) -> int:
        """Dense layers + MoE layers + embeddings + final norm [+ untied LM head]. GPT (f = 4h, tied,
        learned positions, biases, LayerNorm): L(12h^2 + 13h) + Vh + sh + 2h, as Narayanan et al. (SC21)
        count it. An MoE model's total: every routed expert counted (Mixtral 8x7B: 46.7B)."""
        dense = self.num_layers - self.num_moe_layers
        return (dense * self.layer_parameters + self.num_moe_layers * self.moe_layer_parameters
                + self.embedding_parameters + self.output_parameters)

    @cached_property
    def active_parameters(self) -> int:
        """The parameters one token uses: as num_parameters with top_k routed experts per MoE layer
        (Mixtral 8x7B: 12.9B; DeepSeek-V3: 37B); num_parameters for a dense model."""
        dense = self.num_layers - self.num_moe_layers
        return (dense * self.layer_parameters + self.num_moe_layers * self.moe_layer_active_parameters
                + self.embedding_parameters + self.output_parameters)

    @cached_property
    def gemm_weights_per_token(self) -> int:
        """Weights every token multiplies in the layers' GEMMs (attention, dense FFNs, router, the top_k
        routed and the shared experts; biases and norms left out): 2x this is the layers' forward GEMM
        FLOPs per token. L * (attention + FFN weights) for a dense model."""
        dense = self.num_layers - self.num_moe_layers
        moe = (self.attention_weights + self.router_parameters + self.moe_top_k * self.ffn_matrices
               * self.hidden_size * self.moe_ffn_hidden_size + self.ffn_matrices * self.hidden_size
               * self.shared_expert_width)
        return dense * (self.attention_weights + self.ffn_weights) + self.num_moe_layers * moe


def check_moe(d: dict, data: dict, where: str, model_keys: dict) -> None:
    """The MoE and MLA keys of a checked model `d` (`data`: as given) agree with each other."""
    E, k = d["num_experts"], d["moe_top_k"]
    if not E:
        given = [key for key in MOE_KEYS if data.get(key) not in (None, model_keys[key][1])]
        if given:
            raise SpecError(f"{where}: model key(s) {', '.join(given)} describe experts: set num_experts (routed "
                            "experts per MoE layer), or remove them for a dense model")
    elif k is None or k > E:
        raise SpecError(f"{where}: num_experts {E} needs moe_top_k, the routed experts per token (1 to {E}), "
                        f"got {k}")
    if d["moe_first_dense_layers"] >= d["num_layers"]:
        raise SpecError(f"{where}: moe_first_dense_layers {d['moe_first_dense_layers']} leaves no MoE layer of "
                        f"{d['num_layers']}")
    groups, gk = d["moe_router_num_groups"], d["moe_router_group_topk"]
    if (groups is None) != (gk is None):
        raise SpecError(f"{where}: group-limited routing needs both moe_router_num_groups and moe_router_group_topk")
    if groups is not None and (E % groups or gk > groups):
        raise SpecError(f"{where}: moe_router_num_groups {groups} must divide num_experts {E} and be >= "
                        f"moe_router_group_topk {gk}")
    if d["multi_latent_attention"]:
        missing = [key for key in MLA_KEYS if d[key] is None]
        if missing:
            raise SpecError(f"{where}: multi_latent_attention needs {', '.join(missing)} (DeepSeek-V3: kv_lora_rank "
                            "512, qk_head_dim 128, qk_pos_emb_head_dim 64, v_head_dim 128)")
    else:
        given = [key for key in (*MLA_KEYS, "q_lora_rank") if d[key] is not None]
        if given:
            raise SpecError(f"{where}: model key(s) {', '.join(given)} describe multi-latent attention: set "
                            "multi_latent_attention = true, or remove them")
