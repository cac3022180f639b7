"""The layers' weights as TransformerEngine quantizes them for FP8 / MXFP8 / NVFP4 training (issue 24): the copy it
caches beside each bf16 weight, or, under Megatron-Core's --fp8-param-gather (tuner.frameworks
Framework.quantized_params, which `tuner launch` writes), the weight itself with no bf16 copy, gathered in those bytes
too (Megatron-FSDP's gathered layers: tuner.perfmodel.memory._states_gb). Pure; sizes in bytes unless a name says GB. tuner.perfmodel.memory charges it; benchmarks/reading reads published runs that ran otherwise.
"""

from __future__ import annotations

from tuner.layout import Layout, stage_candidates
from tuner.specs import ModelSpec, Workload

#: Bytes per parameter of a layer weight as TransformerEngine quantizes it for training (module/linear.py @ d0067d0da
#: sets both usages of the weight quantizer when gradients are on): the copy it caches beside a bf16 weight across
#: micro-batches, or the weight itself under Megatron-Core's --fp8-param-gather (Framework.quantized_params). Per-tensor
#: FP8 keeps its data alone where non-TN FP8 GEMMs run (Blackwell: utils.py is_non_tn_fp8_gemm_supported) and a
#: transpose beside it elsewhere (Hopper, ROCm: quantized_weight_bytes doubles it; tensor/utils.py
#: post_all_gather_processing pre-creates it after each parameter all-gather); MXFP8 row- and column-wise data with an
#: E8M0 scale per 32; NVFP4 both 4-bit copies with an E4M3 scale per 16 (tensor/nvfp4_tensor.py get_scale_shape).
QUANTIZED_WEIGHT_BYTES = {"fp8": 1.0, "mxfp8": 2.0 + 2.0 / 32, "nvfp4": 1.0 + 2.0 / 16}


def quantized_weight_bytes(precision: str, cluster) -> float:
    """QUANTIZED_WEIGHT_BYTES of `precision` on `cluster`: per-tensor FP8's transpose doubles it off Blackwell."""
    per = QUANTIZED_WEIGHT_BYTES.get(precision, 1.0)
    return per if precision != "fp8" or (cluster.block_scaled and cluster.software == "cuda") else 2.0 * per


def outside_layer_params(model: ModelSpec, layout: Layout, stage: int) -> float:
    """A stage's parameters that no TransformerEngine linear holds, so none is quantized or copied: the word embedding
    and the learned position table on the first stage, the LM head (tuner.perfmodel.memory.stage_params' rule) on the
    last (Megatron-Core's output layer is tensor_parallel.ColumnParallelLinear unless an MXFP8 output projection is
    asked for, gpt_model.py lines 272-276 at d98e8a64dd; FP8 runs inside the transformer block's quantization context
    alone, transformer_block.py line 354); the norms' few are left with the layers."""
    n = model.vocab_size * model.hidden_size / layout.tp * ((stage == 0) + (stage == layout.pp - 1 and (
        layout.pp > 1 or not model.tie_embeddings)))
    return n + (model.seq_length * model.hidden_size if stage == 0 and model.position_embedding == "learned" else 0.0)


def quantized_weights(states: dict, workload: Workload, outside_gb: float, alone: bool) -> None:
    """Set a stage's `fp8_weights` (GB): its layers' weights as TransformerEngine quantizes them
    (quantized_weight_bytes), sharded as the bf16 `weights`; with `alone` (--fp8-param-gather) they replace the
    layers' bf16 weights, so `weights` keeps only the `outside_gb` no linear holds (outside_layer_params)."""
    layers = max(0.0, states["weights"] - outside_gb)
    states["fp8_weights"] = layers / 2.0 * quantized_weight_bytes(workload.precision, workload.cluster)
    if alone:
        states["weights"] -= layers


def layer_gather_bytes(fw, layout: Layout, workload: Workload) -> float:
    """Bytes per parameter in which a layer's weights are all-gathered: one under --fp8-param-gather with per-tensor FP8
    (Framework.quantized_params; the uint8 buffers of gather_bytes' sources, and Megatron-FSDP's: megatron_fsdp/
    param_and_grad_buffer.py at d98e8a64dd keeps a "float8" parameter group in a torch.uint8 buffer, lines 995-997 and
    2631-2632, and all-gathers that buffer), else bf16's two."""
    fp8 = workload.precision == "fp8" and fw.quantized_params(layout, workload)
    return QUANTIZED_WEIGHT_BYTES["fp8"] if fp8 else 2.0


def gather_bytes(fw, layout: Layout, workload: Workload, params: float, experts: bool = False) -> float:
    """Bytes per parameter of Megatron-Core's parameter all-gather (the distributed optimizer's) over `params` of a
    stage's dense parameters (`experts`: its routed experts'). Under --fp8-param-gather (Framework.quantized_params)
    a per-tensor FP8 weight is gathered as its FP8 data, one byte: Megatron-Core keeps those weights in a torch.uint8
    parameter buffer (megatron/core/distributed/distributed_data_parallel.py lines 226-233 at core_v0.14.0; the same
    in param_and_grad_buffer.py group_params_for_buffers at d98e8a64dd), and TransformerEngine makes the transpose
    after the gather (tensor/utils.py post_all_gather_processing). NeMo's own distributed Adam does the same with
    FP8 parameters (nemo/core/optim/distributed_adam.py at v2.0.0.rc0.beta: param_sync_dtype torch.uint8). The
    word embedding, position table and LM head (outside_layer_params, the most of any stage) stay bf16. MXFP8 is
    gathered in bf16 (Megatron-Bridge's reuse_grad_buf_for_mxfp8_param_ag quantizes after the gather) and NVFP4's
    fp4_param_gather is not read: 2 bytes, as every other run."""
    q = layer_gather_bytes(fw, layout, workload)
    if q == 2.0 or params <= 0 or experts:
        return q
    outside = min(params, max(outside_layer_params(workload.model, layout, s)
                              for s in stage_candidates(layout, workload.model)))
    return (2.0 * outside + q * (params - outside)) / params
