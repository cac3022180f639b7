"""The training stacks a layout runs on, each declared once: what it can run, how it holds memory, what
it overlaps, and which files launch it. Pure: no I/O.

A study, a prediction and a launch are for one framework (`Workload.framework`); a cluster preset names
the stack its users run by default (`framework` in the cluster file: frontier megatron-deepspeed, as in
the Frontier study; h100/h200 megatron-core). Every rule below is a sentence a user sees (exit 2), and
`tuner.layout.why_invalid` asks `refusal` for every layout, so searches, plans and `best` propose only
layouts the framework runs, and `launch` renders them for that framework and no other.

- megatron-deepspeed (microsoft/deepspeedai Megatron-DeepSpeed; DeepSpeed's engine): TP (+SP), PP with
  DeepSpeed's 1F1B pipeline engine, DP with ZeRO 0-3 (2 and 3 only without a pipeline: the pipeline
  engine refuses them), full or selective recompute; no context parallelism, no interleaved schedule,
  pipeline splits even or DeepSpeed's balanced one (tuner.pipeline_split), FP8 only in its Transformer
  Engine model (pp 1, no GQA). No
  communication overlap. Gradients kept in the training dtype (2 bytes).
- megatron-core (NVIDIA Megatron-LM / NeMo / Megatron-Bridge): TP (+SP), CP, PP with the interleaved
  schedule and every pipeline split, the distributed optimizer (ZeRO-1), Megatron-FSDP (zero_stage 2:
  --data-parallel-sharding-strategy optim_grads, 3: optim_grads_params; without pipelining), FP8; its overlaps (--tp-comm-overlap with SP,
  --overlap-p2p-comm, --overlap-grad-reduce, --overlap-param-gather). Gradients accumulate in fp32
  (`accumulate_allreduce_grads_in_fp32`, forced on with bf16): 2 + 4 + 12/d bytes per parameter with the
  distributed optimizer (Megatron-LM docs: 6 + 12/d), 18 without.
- torchtitan (FSDP2): data parallelism is always FSDP (zero_stage 3: fp32 parameters, gradients and Adam
  states sharded over dp*cp, 16/d bytes), TP always with sequence parallelism, PP (1F1B, interleaved),
  CP, float8. FSDP gathers each layer's bf16 parameters before its forward and again before its
  backward, and reduce-scatters its gradients in fp32, overlapped with the neighbouring layer's compute
  (implicit prefetch); with pipeline parallelism a stage keeps its gathered parameters from forward to
  backward (reshard_after_forward off: torchtitan's default with PP). Its TP collectives and pipeline
  p2p are not overlapped (async TP is an opt-in that needs torch.compile).
Mixture of experts (issue 20): Megatron-Core runs any ep/etp the layout rules allow (tp > 1 with sequence
parallelism) and overlaps the all-to-all where --overlap-moe-expert-parallel-comm may run (`ep_overlap`);
torchtitan runs etp 1 or tp with ep > 1 (ParallelDims) and splits experts over TP without EP; Megatron-
DeepSpeed's MoE is DeepSpeed-MoE (top-1/2 capacity gating, experts as wide as the FFN), which tuner neither
models nor launches, so it refuses MoE models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from tuner.errors import UsageError
from tuner.offload import offload_refusal
from tuner.pipeline_split import accounting_split
from tuner.recompute_modes import recompute_modules

if TYPE_CHECKING:
    from tuner.layout import Layout
    from tuner.specs import Workload

NAMES = ("megatron-deepspeed", "megatron-core", "torchtitan")
#: The dtypes each stack accumulates and reduces gradients in (first: its default, a workload's
#: `grad_reduce`). Megatron-DeepSpeed keeps them in the training dtype. Megatron-LM forces fp32 with bf16
#: (arguments.py: accumulate_allreduce_grads_in_fp32) unless --grad-reduce-in-bf16, which NVIDIA's NeMo /
#: Megatron-Bridge performance recipes set (DDPConfig grad_reduce_in_fp32=False). torchtitan's FSDP2 keeps
#: fp32 sharded gradients (its reduce dtype only changes the collective's buffer).
GRAD_REDUCES = {"megatron-deepspeed": ("bf16",), "megatron-core": ("fp32", "bf16"), "torchtitan": ("fp32",)}

#: Each stack's rank order, innermost (fastest-varying) first: which groups hold consecutive GPUs and so stay
#: inside a node or an NVLink domain (tuner.perfmodel.comm places groups by it). Megatron-Core:
#: parallel_state.initialize_model_parallel order="tp-cp-ep-dp-pp" (megatron/core/parallel_state.py line 617
#: @ d98e8a64ddf3), its MoE layers regrouping each stage as etp-ep-edp; torchtitan: ParallelDims' mesh
#: ("pp", "dp_replicate", "dp_shard", "cp", "tp"), outermost first (torchtitan/distributed/parallel_dims.py
#: line 309 @ b5bcd76c66d0), its expert mesh ep innermost after etp; Megatron-DeepSpeed: DeepSpeed's
#: PipeModelDataParallelTopology axes ['pipe', 'data', 'model'], outermost first (deepspeed/runtime/pipe/
#: topology.py line 248 @ edaa72212672). One order for all three: TP, then CP, then DP, then PP.
RANK_ORDER = {"megatron-deepspeed": ("tp", "dp", "pp"), "megatron-core": ("tp", "cp", "dp", "pp"),
              "torchtitan": ("tp", "cp", "dp", "pp")}


def grad_reduces(name: str) -> tuple[str, ...]:
    return GRAD_REDUCES.get(name, ("fp32",))


#: The PyTorch caching allocator's share of a GPU run beyond the bytes its tensors allocate (issue 24 round 4), which a
#: fake-tensor measurement (each framework's memory_sd) cannot see: log(reserved / allocated) at a CUDA out-of-memory
#: error (after the allocator released what it could), from published messages of training runs with the default
#: allocator (benchmarks/data/allocator_published.toml; chosen by benchmarks/allocator_share.py on the rows it does not
#: hold out). ALLOCATOR_SD: the interquartile range / 1.349 (heavy-tailed: most below 0.01, a few fragmented runs at
#: 0.39-0.61); ALLOCATOR_TAIL_*: the share of those rows beyond +3 sd (2 of 11) and their root mean square, read only
#: after an OOM (tuner.oom_evidence.fit_given_oom). ALLOCATOR_BIAS: 0 on top of the cluster's fixed reserve, which holds
#: the median share of an 80 GB GPU's allocated bytes plus the median memory outside the allocator (CUDA context, NCCL).
ALLOCATOR_SD = 0.0495
ALLOCATOR_TAIL_WEIGHT, ALLOCATOR_TAIL_SD = 2 / 11, 0.5092
ALLOCATOR_BIAS = 0.0
ALLOCATOR_N = 11
ALLOCATOR_SOURCES = "published CUDA out-of-memory messages of training runs"


@dataclass(frozen=True)
class Framework:
    name: str
    title: str
    overlaps: frozenset         # "tp": TP collectives under the GEMMs (with SP); "p2p": pipeline p2p under
                                # the interleaved schedule; "dp": DP/ZeRO collectives under compute; "ep": the
                                # MoE all-to-all under another micro-batch's compute (where `ep_overlap` holds)
    fsdp: bool                  # FSDP2: everything sharded, per-layer gather / reduce-scatter
    memory_sd: float            # log-sd of (true peak / predicted peak) for this stack (see FRAMEWORKS)
    memory_bias: float          # mean of log(true peak / predicted peak) for this stack
    selective: str              # what recompute "selective" is: "core-attention" (Megatron) or "op" (per-op SAC)
    attention: str              # the attention: "fused" (Transformer Engine / cuDNN; FlashAttention on ROCm) or
                                # "sdpa" (torchtitan's; its kernel per model and GPU: compute.attention_kernel)
    compiled: str               # when element-wise kernels are fused: "always" (TE) or "fp8" (torch.compile,
                                # which `tuner launch` switches on with float8; eager otherwise)
    files: tuple[str, ...]      # what `tuner launch` writes
    zero_stages: tuple[int, ...]  # the ZeRO stages it has (first: what `predict` assumes when none is given)
    sp_with_tp: bool            # its tensor parallelism always shards the sequence
    refuse: Callable            # (layout, workload) -> one-line reason or None
    sp_with_moe_tp: bool = False  # it runs an MoE model with tp > 1 only with sequence parallelism
    moe_probs_in_experts: bool = False  # routing probabilities scale the experts' activation (Megatron-Core >= 0.13),
                                        # so the combine keeps no input for their gradient (tuner.perfmodel.moe)
    frees_pipeline_outputs: bool = False  # a stage's output tensor is freed once sent to the next stage (Megatron-Core's
                                          # deallocate_pipeline_outputs; tuner.perfmodel.memory.stage_activation_bytes)
    megatron_loss: bool = False   # its last stage peaks at Megatron-Core's unfused vocab-parallel loss or a layer's backward
                                  # (tuner.perfmodel.memory.megatron_phases); else the account's fp32 logits on top
    sp_gather_buffer: bool = False  # sequence parallelism gathers into a kept s*b*h buffer (memory.sp_gather_bytes)
    fp8_params: bool = False    # FP8 / MXFP8 layer weights held as TransformerEngine's quantized tensors alone where
                                # it runs a sharded optimizer (--fp8-param-gather; `quantized_params`)
    memory_n: int = 0           # the measurements memory_errors were chosen on (0: assumed)
    memory_errors: tuple = ()   # seen rows' log errors about memory_bias: p_fit's atoms (fit.ERROR_QUANTILES; (): normal)
    memory_sources: str = ""    # where those measurements come from (every one with Adam's moments in fp32)
    deepspeed_step: bool = False  # DeepSpeed's engine steps the optimizer: its gradient copies (memory.step_copy_bytes)

    def memory_note(self, workload: "Workload | None" = None) -> str:
        """Where the memory error behind p_fit comes from, as every output states it; for a workload whose Adam
        moments are bf16, that the error was measured with fp32 moments only."""
        moments = getattr(workload, "optimizer_moments", None) or "fp32"
        spread = (f"bias {self.memory_bias:+.4f}, errors {self.memory_errors[0]:+.4f} to {self.memory_errors[-1]:+.4f} in "
                  f"log on allocated bytes (their {len(self.memory_errors)} quantiles)" if self.memory_errors else
                  f"bias {self.memory_bias:+.4f}, sd {self.memory_sd:.4f} in log on allocated bytes")
        allocator = (f"; the caching allocator's share measured on {ALLOCATOR_N} {ALLOCATOR_SOURCES}: sd "
                     f"{ALLOCATOR_SD:.4f}" + (f", bias {ALLOCATOR_BIAS:+.4f}" if ALLOCATOR_BIAS else
                                              ", its median inside the cluster's reserve"))
        if self.memory_n:
            runs = f"{self.memory_n} runs" if moments == "fp32" else f"{self.memory_n} fp32-moment runs, none bf16"
            return f"{self.name}'s memory error measured on {runs} ({self.memory_sources}): {spread}{allocator}"
        return f"{self.name}'s memory error ASSUMED, not measured: {spread}{allocator}"

    def grad_bytes(self, workload: "Workload") -> float:
        """Bytes per parameter of the gradient buffer: 4 where the workload reduces gradients in fp32."""
        return 4.0 if workload.gradient_dtype == "fp32" else 2.0

    def needs_sp(self, model) -> bool:
        """Whether tp > 1 needs sequence parallelism for `model` here (what `predict` assumes when not told)."""
        return self.sp_with_tp or (self.sp_with_moe_tp and model.is_moe)

    def refusal(self, layout: "Layout", workload: "Workload") -> str | None:
        """Why this framework cannot run `layout` on `workload` (a sentence), or None. It never reads the micro-batch:
        tuner.space asks it once per cut and ZeRO / recompute / offload choice (tests/test_plan_speed.py checks it)."""
        if workload.model.mtp_num_layers and self.name != "megatron-core":
            return (f"{self.name} has no multi-token prediction (model '{workload.model.name}': mtp_num_layers "
                    f"{workload.model.mtp_num_layers}); use --framework megatron-core (--mtp-num-layers), or a model "
                    "without it (mtp_num_layers = 0)")
        return offload_refusal(self.name, layout, workload) or self.refuse(layout, workload)

    def fused(self, precision: str) -> bool:
        """Whether element-wise kernels run fused: always (TE), or torch.compile with a low precision."""
        return self.compiled == "always" or (self.compiled == "fp8" and precision in ("fp8", "mxfp8", "nvfp4"))

    def quantized_params(self, layout: "Layout", workload: "Workload") -> bool:
        """Whether the layers' weights are TransformerEngine's FP8 / MXFP8 tensors alone (no bf16 copy): Megatron-Core's
        --fp8-param-gather, which `tuner launch` writes where Megatron-LM allows it, as NVIDIA's FP8 recipes set it
        (Megatron-Bridge's and NeMo 2's fp8_param_gather = True): with the distributed optimizer or Megatron-FSDP
        (zero_stage >= 1; arguments.py lines 1095-1097 at d98e8a64dd refuse it otherwise). NVFP4's --fp4-param-gather
        is not written (Megatron-Bridge sets it from v0.5.0 only). tuner.perfmodel.memory charges what this says."""
        return self.fp8_params and workload.precision in ("fp8", "mxfp8") and layout.zero_stage >= 1

    def ep_overlap(self, layout: "Layout", model=None) -> bool:
        """Whether the MoE token all-to-all runs under compute: Megatron-Core's
        --overlap-moe-expert-parallel-comm (the 1F1B schedule overlaps one micro-batch's dispatch and
        combine with another's forward/backward), which transformer_config.py allows only with ep > 1,
        without full recompute, with pp > 1 only with the interleaved schedule, and with at most one MTP
        module (line 3046 at d98e8a64dd: "MTP supports at most one layer"; `model`: the workload's). With tp or
        cp > 1 it runs as NVIDIA's published runs do: with more than one CUDA connection
        (tuner.render.mcore.launch_env)."""
        return ("ep" in self.overlaps and layout.expert_parallel > 1 and layout.recompute != "full"
                and "moe" not in recompute_modules(layout.recompute)          # line 3032: not with moe recomputed
                and (layout.pp == 1 or layout.virtual_pipeline > 1)
                and (model is None or model.mtp_num_layers <= 1))


def split_refusal(name: str, layout, model) -> str | None:
    """Why framework `name` cannot cut the model's layers as the layout's pipeline_split does (None: it can).
    Megatron-Core writes any split (--pipeline-model-parallel-layout), torchtitan too (module_fqns_per_model_part);
    Megatron-DeepSpeed's GPTModelPipe hands DeepSpeed's PipelineModule partition_method "type:transformer"
    (megatron/model/gpt_model.py line 463 at 4efb479d5317), which balances the transformer layers itself:
    equal stages or the balanced split, nothing else."""
    if name != "megatron-deepspeed":
        return None
    me = name
    if accounting_split(layout, model.num_layers):
        return (f"{me} cannot split {model.num_layers} layers over pp {layout.pp} as Megatron-Core's embedding- and "
                "loss-aware split: DeepSpeed's PipelineModule balances the layers itself (partition_method "
                "type:transformer); use --pipeline-split balanced, or --framework megatron-core")
    if layout.pipeline_split not in ("auto", "balanced"):
        return (f"{me} cannot run pipeline_split {layout.pipeline_split}: DeepSpeed's PipelineModule, as "
                "GPTModelPipe builds it, only balances the transformer layers (partition_method type:transformer); "
                "use --pipeline-split balanced, or --framework megatron-core")
    return None


def _megatron_deepspeed(layout, workload) -> str | None:
    cp, vp, m, me = layout.context_parallel, layout.virtual_pipeline, workload.model, "megatron-deepspeed"
    if m.is_moe:
        return (f"{me} cannot run the mixture-of-experts model '{m.name}' here: its MoE is DeepSpeed-MoE (--num-experts "
                "list, --topk, capacity-bound gating, experts as wide as the dense FFN), which tuner neither models nor "
                "launches; use --framework megatron-core or torchtitan")
    if layout.pp > 1 and layout.zero_stage >= 2:
        return (f"ZeRO-{layout.zero_stage} with pp={layout.pp} is refused by DeepSpeed's pipeline engine "
                f"({me}: use zero_stage 0 or 1 with pipeline parallelism)")
    if cp > 1:
        return (f"{me} cannot run context_parallel {cp}: Megatron-DeepSpeed has no context parallelism "
                "(--ds-sequence-parallel-size is DeepSpeed Ulysses, a different split); use --framework megatron-core")
    if vp > 1:
        return (f"{me} cannot run virtual_pipeline {vp}: DeepSpeed's pipeline engine has no interleaved "
                "schedule; use --framework megatron-core")
    reason = split_refusal("megatron-deepspeed", layout, m) or recompute_refusal("megatron-deepspeed", layout, workload)
    if reason:
        return reason
    if workload.precision == "fp8" and layout.pp > 1:
        return (f"{me} cannot run fp8 with pp {layout.pp}: its FP8 (Transformer Engine layers) is built only "
                "without DeepSpeed's pipeline (pp 1); use --framework megatron-core")
    if workload.precision == "fp8" and m.num_query_groups < m.num_attention_heads:
        return (f"{me} cannot run fp8 for '{m.name}': its Transformer Engine layer refuses grouped-query "
                "attention; use --framework megatron-core")
    return None


#: The fields of a layout's cut (tp, sp, cp, pp, vp, split, ep, etp) each framework's refusal reads, beside the ZeRO
#: stage and recompute mode (and never the micro-batch or dp): tuner.space asks a refusal once per these values of a
#: cut, not once per cut (DeepSeek-V3 on 128 H100 nodes: 9,414 cuts, 45 tp / sp / pp: 720 probes, not 150,624). One not
#: named here: asked per cut. tests/test_plan_speed.py checks each refusal answers the same whatever else changes.
REFUSAL_READS: dict[str, tuple[str, ...]] = {
    "megatron-core": ("tp", "sequence_parallel", "pp"),
    "torchtitan": ("tp", "sequence_parallel", "expert_parallel", "expert_tensor_parallel"),
    "megatron-deepspeed": ("context_parallel", "pp", "virtual_pipeline", "pipeline_split"),
}


def recompute_refusal(name: str, layout, workload) -> str | None:
    """Why framework `name` cannot run the layout's recompute mode. Megatron-Core's module sets
    (--recompute-modules, transformer_config.py line 560 at d98e8a64ddf3): moe_act needs the MoE layers'
    grouped GEMM (line 1966: an MoE model, which `launch` runs with --moe-grouped-gemm), mla_up_proj
    multi-latent attention (line 1971), and moe_act / layernorm refuse FP8's delayed scaling, the recipe
    `launch` writes (line 2004). Megatron-DeepSpeed and torchtitan have none, full and selective only."""
    mode, m = layout.recompute, workload.model
    if mode in ("none", "selective", "full"):
        return None
    if name != "megatron-core":
        return (f"{name} cannot run recompute {mode}: Megatron-Core's --recompute-modules has no counterpart there "
                "(its recompute is none, selective or full); use one of those, or --framework megatron-core")
    mods = recompute_modules(mode)
    if mods & {"moe_act", "moe"} and not m.is_moe:
        return f"recompute {mode} recomputes the MoE layer or its activation: '{m.name}' has no experts; use none or selective"
    if "mla_up_proj" in mods and not m.multi_latent_attention:
        return (f"recompute {mode} recomputes MLA's up-projection (mla_up_proj): '{m.name}' has no multi-latent "
                "attention; use none, selective or full")
    if workload.precision == "fp8" and mods & {"moe_act", "layernorm"}:
        return (f"megatron-core refuses recompute {mode} (moe_act / layernorm) with FP8's delayed scaling, the recipe "
                "`launch` writes (transformer_config.py line 2004); use mla_up, selective or full")
    return None


def megatron_fsdp(layout, workload) -> bool:
    """Whether the layout runs Megatron-Core's Megatron-FSDP (--use-megatron-fsdp): zero_stage 2 shards the
    gradients and optimizer states (--data-parallel-sharding-strategy optim_grads), 3 the parameters too
    (optim_grads_params); megatron/training/arguments.py line 3190 at d98e8a64ddf3. Its collectives run layer
    by layer under the neighbouring layer's compute, like FSDP2's (tuner.perfmodel.fsdp_time)."""
    return workload.framework == "megatron-core" and layout.zero_stage >= 2


def _megatron_core(layout, workload) -> str | None:
    if layout.zero_stage not in FRAMEWORKS["megatron-core"].zero_stages:
        return (f"megatron-core cannot run zero_stage {layout.zero_stage}: its ZeRO stages are 0, the distributed "
                "optimizer (1) and Megatron-FSDP (2, 3); use one of them, or --framework torchtitan (FSDP)")
    reason = recompute_refusal("megatron-core", layout, workload)
    if reason:
        return reason
    if workload.optimizer_moments == "bf16" and layout.zero_stage != 1:
        return (f"megatron-core keeps Adam's moments in bf16 (--use-precision-aware-optimizer) only with the "
                "distributed optimizer, zero_stage 1 (megatron/core/optimizer/__init__.py line 1057 at d98e8a64dd: "
                f"\"only supported with distributed optimizer\"), not zero_stage {layout.zero_stage}; use zero_stage 1")
    if layout.zero_stage >= 2 and layout.pp > 1:
        return (f"megatron-core runs Megatron-FSDP (zero_stage {layout.zero_stage}) here without pipelining: NVIDIA's "
                "Megatron-FSDP runs and tests are pp 1 (examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh, "
                "tests/functional_tests/test_cases/moe/deepseek_proxy_fsdp_*) and Megatron-FSDP 2 refuses pp > 1 "
                "(megatron/core/distributed/fsdp/mcore_fsdp_adapter.py line 629); use pp 1, or zero_stage 0 or 1")
    if workload.model.is_moe and layout.tp > 1 and not layout.sequence_parallel:   # sp_with_moe_tp
        return (f"megatron-core runs the mixture-of-experts model '{workload.model.name}' with tp {layout.tp} only "
                "with sequence_parallel on (model_parallel_config.py with expert parallelism: \"sequence "
                "parallelism must be used\"; tuner models the token dispatch on sequence-split tokens): "
                "add --sequence-parallel")
    return None


def _torchtitan(layout, workload) -> str | None:
    reason = recompute_refusal("torchtitan", layout, workload)
    if reason:
        return reason
    if layout.zero_stage not in FRAMEWORKS["torchtitan"].zero_stages:
        return (f"torchtitan shards parameters, gradients and optimizer states with FSDP2 (zero_stage 3), "
                f"not zero_stage {layout.zero_stage}; use zero_stage 3, or --framework megatron-core")
    if layout.tp > 1 and not layout.sequence_parallel:      # FRAMEWORKS["torchtitan"].sp_with_tp
        return ("torchtitan's tensor parallelism always shards the norms over the sequence: tp > 1 needs "
                "sequence_parallel on (--sequence-parallel)")
    ep, etp, tp = layout.expert_parallel, layout.expert_tensor_parallel, layout.tp
    if workload.model.is_moe and ep == 1 and etp != tp:
        return (f"torchtitan without expert parallelism splits the experts over the TP group: with ep 1, "
                f"expert_tensor_parallel must equal tp ({tp}), got {etp}")
    if layout.context_parallel > 1 and workload.model.multi_latent_attention:    # its deepseek_v3 flavors run flex
        return "torchtitan's DeepSeek-V3 runs FlexAttention, which its context parallelism refuses; use cp 1 or --framework megatron-core"
    if workload.precision == "mxfp8" and tp > 1:
        return ("torchtitan runs mxfp8 with tp 1 only: \"TP not yet supported with torch.compile for mxfp8\" "
                "(components/quantization/mx.py line 50); use tp 1, --precision fp8, or --framework megatron-core")
    if ep > 1 and etp not in (1, tp):
        return (f"torchtitan runs expert_tensor_parallel 1 or tp ({tp}) only (ParallelDims: \"Currently we only "
                f"support ETP=TP or ETP=1\"), got {etp}")
    return None


# memory_bias, memory_sd: the centre and scale of log(allocated peak / predicted peak less the reserve), the account's
# error against the bytes tensors allocate (tuner.perfmodel account_sd spreads the scale over the layout's memory
# components; on a GPU, memory_prior_sd adds the caching allocator's share, ALLOCATOR_SD above). Chosen by
# benchmarks/memory_accuracy.py --fit (issue 24 round 4) on the fake-tensor rows some memory choice had already seen
# (published.SEEN), robustly: the median error and 1.4826 x the median absolute deviation of the standardised errors.
# The errors are a tight bulk with a few far rows (torchtitan: 4 of 113 beyond 0.04, full recompute at small peaks),
# so a normal fitted by maximum likelihood is pulled wide by the far rows and is under-confident in every middle
# bin (its first choice, bias -0.0005 and sd 0.0070, failed three bins on FRESH3's 36 rows, printed as held out).
# memory_errors (issue 24 round 9): what p_fit states instead of a normal where the account was measured -- the seen
# fake-tensor rows' log errors about memory_bias as ERROR_QUANTILES equally likely atoms (tuner/perfmodel/fit.py
# error_quantiles; benchmarks/memory_accuracy.py --fit prints them), convolved with the allocator's share on a GPU.
# Chosen on every row some memory choice had seen (published.SEEN): Megatron-Core's 146 dense configurations
# (CONFIGS, FRESH, FRESH2, FRESH3, FRESH4), torchtitan's 120 (CONFIGS, FRESH, FRESH2, FRESH3 and the 7 FRESH4
# configurations another of whose rows a choice saw); memory_bias / memory_sd stay as chosen before (memory_sd is the
# memory correction's prior scale). Megatron-Core's FRESH5 was drawn with the rule's registration and never read by it.
# memory_n counts the rows chosen on. The fresh batches drawn before the choice (measure_memory_torchtitan.py
# FRESH4; measure_memory_mcore.py FRESH4 for Megatron-Core's fourth choice) are never read by it. No fit: ASSUMED, and
# every output says so.
# - megatron-core: 122 dense configurations of Megatron-Core 0.16.1's own training step measured under fake tensors
#   with a FlashAttention-like kernel (allocated bytes, benchmarks/measure_memory_mcore.py: CONFIGS, FRESH, FRESH2 and
#   FRESH3): bias +0.00028, sd 0.00027, chosen again (issue 24 round 8, second pass) after full recompute's recomputed
#   output (tuner.perfmodel.layer_backward), the harness's RoPE and dropout-free Llama were read as the rows ran; before:
#   +0.0027 / 0.0037 (98 rows), +0.0049 / 0.0060 (74, issue 24 round 5), +0.0205 / 0.0140 (50), +0.020 / 0.02. MoE
#   layouts use the dense constants (their 5 measured configurations: +0.0010, 0.0012; too few to tell apart).
# - torchtitan: 113 dense configurations of torchtitan 0.3.0's own Llama 3 under FSDP2 (and TP) measured the same
#   way (benchmarks/measure_memory_torchtitan.py; its lists in benchmarks/torchtitan_memory/configs.py: CONFIGS, FRESH,
#   FRESH2, FRESH3): bias +0.0008, sd 0.00115 (was 0.0 and 0.02; FRESH2's 24 rows' median error was 0.002).
# - megatron-deepspeed: 11 GPT configurations of Megatron-DeepSpeed f4157bea's own step on DeepSpeed 0.19.8, measured
#   the same way (benchmarks/measure_memory_mds.py, its CONFIGS): median +0.0184, sd 0.0229 (issue 30 round 33, after
#   deepspeed_states); bias and atoms moved 0.0085 together (p_fit unchanged) so that the stated peak is a GPU run's
#   median, the errors being skewed. FRESH measured after. Llama unmeasured (f4157bea runs no RoPE / GQA). Was 0.11.
_COMMON = ("launch.sbatch", "layout.json")
FRAMEWORKS: dict[str, Framework] = {
    "megatron-deepspeed": Framework(
        name="megatron-deepspeed", title="Megatron-DeepSpeed", overlaps=frozenset(), fsdp=False,
        memory_sd=0.0229, memory_bias=0.0269, memory_n=11,      # the errors' skew: centred on a GPU run's median
        memory_errors=(-0.03013, -0.02884, -0.02884, -0.01532, -0.01491, -0.01491, -0.01217, -0.00855, -0.00855,
                       -0.00523, +0.00762, +0.00762, +0.01406, +0.04642, +0.04642, +0.06867),
        memory_sources="Megatron-DeepSpeed f4157bea's step on DeepSpeed 0.19.8 under fake tensors, 11 configurations",
        selective="core-attention", attention="fused", compiled="always",
        files=("ds_config.json", "megatron_args.txt", *_COMMON), zero_stages=(1, 0, 2, 3), sp_with_tp=False,
        refuse=_megatron_deepspeed, deepspeed_step=True),
    "megatron-core": Framework(
        name="megatron-core", title="Megatron-Core (Megatron-LM, NeMo)", overlaps=frozenset({"tp", "p2p", "dp", "ep"}),
        fsdp=False, memory_sd=0.00027, memory_bias=0.00028, memory_n=146,
        memory_errors=(-0.00054, -0.00023, -0.00021, -0.00018, -0.00015, -0.00011, -0.00006, -0.00003, +0.00003,
                       +0.00008, +0.00015, +0.00023, +0.00029, +0.00089, +0.00203, +0.00902),
        memory_sources="Megatron-Core 0.16.1's training step under fake tensors, 146 configurations",
        selective="core-attention", attention="fused",
        compiled="always", files=("megatron_args.txt", *_COMMON), zero_stages=(1, 0, 2, 3), sp_with_tp=False,
        sp_with_moe_tp=True, moe_probs_in_experts=True, frees_pipeline_outputs=True, megatron_loss=True,
        sp_gather_buffer=True, fp8_params=True, refuse=_megatron_core),
    "torchtitan": Framework(
        name="torchtitan", title="torchtitan (FSDP2)", overlaps=frozenset({"dp"}), fsdp=True,
        memory_sd=0.00115, memory_bias=0.0008, memory_n=120,
        memory_errors=(-0.01143, -0.00507, -0.00386, -0.00139, -0.00074, -0.00044, -0.00031, -0.00009, +0.00003,
                       +0.00024, +0.00042, +0.00068, +0.00087, +0.00124, +0.00208, +0.00573),
        memory_sources="torchtitan 0.3.0's Llama 3 with FSDP2 under fake tensors, 120 configurations",
        selective="op", attention="sdpa", compiled="fp8",
        files=("torchtitan.toml", *_COMMON), zero_stages=(3,), sp_with_tp=True, refuse=_torchtitan),
}


def get(name: str) -> Framework:
    """The framework called `name`; UsageError naming the choices."""
    try:
        return FRAMEWORKS[name]
    except KeyError:
        raise UsageError(f"unknown framework {name!r}; frameworks: {', '.join(NAMES)}") from None


def of(workload: "Workload") -> Framework:
    return get(workload.framework)


def runnable(trials, workload: "Workload") -> list:
    """The trials (anything with a `layout`) whose layout the workload's framework runs: a study stored
    before frameworks existed may hold layouts its framework refuses (it is read as its cluster's stack)."""
    fw = of(workload)
    return [t for t in trials if fw.refusal(t.layout, workload) is None]
