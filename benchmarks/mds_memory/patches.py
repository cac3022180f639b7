"""What Megatron-DeepSpeed (f4157bea) on DeepSpeed 0.19.8 + torch 2.13.0 need to run one rank's training step on fake
CPU tensors (benchmarks/measure_memory_mds.py's docstring says what is patched and why). Nothing in Megatron-DeepSpeed's
or DeepSpeed's files is edited; torch, deepspeed and megatron are imported when these run."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

#: packages pretrain_gpt.py imports for tokenizers, vision models and loggers the step never calls
STUBBED = ("transformers", "regex", "sentencepiece", "tiktoken", "torchvision", "PIL", "wandb", "tensorboard")
#: modules Megatron-DeepSpeed imports that DeepSpeed 0.19.8 no longer has (compression is used by its KD options only)
STUBBED_FULL = ("deepspeed.compression.compress",)


class _Anything(type):
    """A stand-in class whose every attribute is another stand-in class (PIL.Image.Image and the like)."""

    def __getattr__(cls, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Anything(attr, (), {"__init__": lambda self, *a, **k: None})


class _StubModule(types.ModuleType):
    __path__: list = []

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Anything(attr, (), {"__init__": lambda self, *a, **k: None})


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in STUBBED or name in STUBBED_FULL:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return _StubModule(spec.name)

    def exec_module(self, module):
        pass


def stub_modules(torch) -> None:
    """The unused imports stubbed, and `flash_attn` as FlashAttention-2's memory footprint: its varlen function
    returns a bf16 output and saves q, k, v, the output and the fp32 log-sum-exp (heads x tokens) for backward,
    where it allocates dq, dk, dv; no s x s tensor, no dropout mask (the kernel regenerates it)."""
    sys.meta_path.insert(0, _StubFinder())

    class _Flash(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            out = torch.empty_like(q)
            lse = torch.empty(q.shape[1], q.shape[0], dtype=torch.float32, device=q.device)
            ctx.save_for_backward(q, k, v, out, lse)
            return out

        @staticmethod
        def backward(ctx, dout):
            q, k, v, _, _ = ctx.saved_tensors
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    def flash_attn_varlen_func(q, k, v, *args, **kwargs):
        return _Flash.apply(q, k, v)

    flash, iface = types.ModuleType("flash_attn"), types.ModuleType("flash_attn.flash_attn_interface")
    iface.flash_attn_varlen_func, iface.flash_attn_unpadded_func, flash.flash_attn_interface = \
        flash_attn_varlen_func, None, iface
    sys.modules.update({"flash_attn": flash, "flash_attn.flash_attn_interface": iface})


def patch_torch_deepspeed(torch):
    """Fake-tensor values, device moves and DeepSpeed's data-dependent checks (see the script's docstring); returns the
    device-redirect TorchFunctionMode class."""
    import torch.distributed as dist
    import torch.nn as nn
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.overrides import TorchFunctionMode

    from mcore_memory.patches import _patch_cuda, _patch_dropout_adam, _patch_fake_values, _redirect_mode
    cpu = torch.device("cpu")
    _patch_cuda(torch, cpu)
    _patch_fake_values(torch, dist, FakeTensor)
    _patch_dropout_adam(torch)
    FakeTensor.__bool__ = lambda self: False            # only DeepSpeed's inf / nan checks ask a tensor's truth
    FakeTensor.__format__ = lambda self, spec: format(1.0, spec)     # the engine's loss log line
    module_to = nn.Module.to

    def _to(self, *a, **k):             # a device-only move of fake parameters (all on the CPU): nothing to do
        if any(isinstance(x, torch.dtype) for x in a) or "dtype" in k:
            return module_to(self, *a, **k)
        return self

    nn.Module.to, nn.Module.cuda = _to, lambda self, *a, **k: self
    torch.jit.script = lambda fn=None, *a, **k: fn     # TorchScript cannot compile the patched dropout: run eagerly
    import deepspeed.runtime.engine as ds_engine
    from deepspeed.runtime.zero import stage3, stage_1_and_2
    ds_engine.FusedAdam = torch.optim.Adam      # the fused in-place Adam above is what apex's FusedAdam is on a GPU: at
    #                                             ZeRO 0 the plain engine wraps it in FP16_Optimizer, not the unfused one
    stage_1_and_2.DeepSpeedZeroOptimizer.has_overflow = lambda self, *a, **k: False
    stage3.DeepSpeedZeroOptimizer_Stage3.has_overflow = lambda self, *a, **k: False
    return _redirect_mode(torch, cpu, FakeTensor, TorchFunctionMode)


def patch_megatron(torch, vocab_size: int) -> None:
    """Megatron-DeepSpeed's pieces that need a GPU build or data: the tokenizer (only its padded vocabulary and end of
    document are read), the FlashAttention op builder (none on CPU: flash_attn's function is used, as on a GPU
    build without the builder), apex's gradient-accumulation-fusion check (its use in backward is commented out in
    this Megatron-DeepSpeed: the flag is inert), the tensor-parallel broadcast of the batch (tp rank 0's batch), the
    fused bias-GeLU's scripted element-wise functions (GeLUFunction, Megatron's --bias-gelu-fusion default, saves its
    input and bias; what the functions allocate is one tensor each), the rotary table's cache (_rotary_table_fix)."""
    import megatron.core.tensor_parallel as tpmod
    import megatron.core.tensor_parallel.layers as tp_layers
    import megatron.global_vars as gv
    import megatron.model.transformer as transformer

    def _tokenizer(args):
        from megatron.tokenizer.tokenizer import _vocab_size_with_padding
        args.padded_vocab_size = _vocab_size_with_padding(vocab_size, args)
        gv._GLOBAL_TOKENIZER = types.SimpleNamespace(eod=0, vocab_size=vocab_size)
        return gv._GLOBAL_TOKENIZER

    class _NoBuilder:
        def load(self):
            raise TypeError("no FlashAttention op builder on a CPU build")

    import megatron.model.fused_bias_gelu as gelu
    gelu.bias_gelu = lambda bias, y: torch.empty_like(y)            # one fused kernel's output each (on a GPU the
    gelu.bias_gelu_back = lambda g, bias, y: torch.empty_like(y)    # scripted functions fuse; eagerly every
    gv._build_tokenizer = _tokenizer                                # element-wise step would allocate)
    _rotary_table_fix()
    _layer_norm_kwargs(torch)
    transformer.FlashAttentionBuilder = _NoBuilder
    tp_layers._grad_accum_fusion_available = True
    tpmod.broadcast_data = lambda keys, data, datatype: {k: data[k] for k in keys}


def _layer_norm_kwargs(torch) -> None:
    """On a GPU build megatron.model.LayerNorm is Megatron's MixedFusedLayerNorm, which GPTModelPipe's final norm is
    built with (sequence_parallel=...); on a CPU build it is torch.nn.LayerNorm, which refuses that argument. The
    native LayerNorm kernel keeps what the fused one keeps (its input, fp32 mean and rstd): the same class, taking
    Megatron's arguments."""
    import megatron.model as mmodel
    import megatron.model.gpt_model as gpt_model

    class LayerNorm(torch.nn.LayerNorm):
        def __init__(self, normalized_shape, eps=1e-5, no_persist_layer_norm=True, sequence_parallel=False,
                     apply_layernorm_1p=False, mem_efficient_ln=False, **kwargs):
            super().__init__(normalized_shape, eps=eps, **kwargs)
            for p in self.parameters():
                setattr(p, "sequence_parallel", sequence_parallel)

    mmodel.LayerNorm = gpt_model.LayerNorm = LayerNorm


def _rotary_table_fix() -> None:
    """Megatron-DeepSpeed f4157bea's update_rotary_pos_emb (GPTModelPipe with RoPE: the table cached in args) calls
    .to() on the [cos, sin] list its RotaryEmbedding now returns, and fails on any device; moved element-wise here
    (the table is 2 x sequence x head width fp32: a few MB)."""
    import megatron.utils as mutils
    from megatron import get_args
    from megatron.model.rotary_pos_embedding import RotaryEmbedding

    def update_rotary_pos_emb(seq_length):
        args = get_args()
        dim = args.hidden_size // args.num_attention_heads if args.kv_channels is None else args.kv_channels
        dim = int(dim * args.rotary_percent) if args.rotary_percent < 1.0 else dim
        args.rotary_pos_emb = [t.to("cpu") for t in RotaryEmbedding(dim, theta=args.rope_theta)(seq_length)]

    mutils.update_rotary_pos_emb = update_rotary_pos_emb


def whole_batch_under_sequence_parallelism(pretrain_gpt) -> None:
    """Without the pipeline engine (--no-pipeline-parallel), f4157bea's get_batch cuts the tokens by tensor-parallel
    rank under Megatron's sequence parallelism and the embedding scatters the sequence again, so the logits keep
    s / tp^2 of it and the loss fails on the labels (s): the configuration cannot run there. Measured as Megatron's
    sequence parallelism means it (and Megatron-DeepSpeed's pipeline path runs it): the whole sequence into the
    embedding, scattered once. Each row it touches says so."""
    from megatron import get_args
    get_batch = pretrain_gpt.get_batch

    def _get_batch(data_iterator):
        args = get_args()
        sp, args.sequence_parallel = args.sequence_parallel, False
        try:
            return get_batch(data_iterator)
        finally:
            args.sequence_parallel = sp

    pretrain_gpt.get_batch = _get_batch


def _recv_activation_buffers(torch):
    """A later pipeline stage learns the shapes of the activations it will receive from the stage before it by p2p
    (DeepSpeed's _recv_tensor_meta), which the fake process group does not carry. GPTModelPipe sends one tensor, the
    hidden state (sequence / tp under sequence parallelism, micro-batch, hidden; bf16), partitioned over the tensor-
    parallel group where tp > 1 (its partition meta, then this rank's part): the same buffers, allocated as DeepSpeed
    allocates them."""
    from deepspeed.runtime.pipe.engine import PipelineEngine
    from deepspeed.runtime.utils import PartitionedTensor
    from megatron import get_args

    def _recv_tensor_meta(self, send_stage):
        args = get_args()
        seq = args.seq_length // (args.tensor_model_parallel_size if args.sequence_parallel else 1)
        hidden = torch.empty(seq, args.micro_batch_size, args.hidden_size, dtype=torch.bfloat16)
        if not self.is_pipe_partitioned:
            return self._allocate_or_extend_buffers(0, list(hidden.shape), hidden.dtype)
        part = PartitionedTensor(tensor=hidden, group=self.grid.get_slice_parallel_group())
        sent = (part.to_meta(), part.data())
        return tuple(self._allocate_or_extend_buffers(i, list(t.shape), t.dtype) for i, t in enumerate(sent))

    PipelineEngine._recv_tensor_meta = _recv_tensor_meta


def patch_pipeline_metas(torch, fake_mode) -> None:
    """DeepSpeed's pipeline engine partitions a stage's output over the tensor-parallel group and sends its shape as a
    small int64 tensor (PartitionedTensor.to_meta / from_meta) that it reads back with .tolist(): torch.LongTensor
    builds carry their real values, and the meta of a received gradient (the fake p2p receives nothing) is the one
    this stage's output sent -- the same shape over the same group."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from deepspeed.runtime.utils import PartitionedTensor
    long_tensor = torch.LongTensor

    def _long_tensor(*a, **k):
        with unset_fake_temporarily():
            real = long_tensor(*a, **k)
        fake = fake_mode.from_tensor(real)
        fake._mc_value = real
        return fake

    last, from_meta, to_meta = [], PartitionedTensor.from_meta.__func__, PartitionedTensor.to_meta

    def _to_meta(self):
        last[:] = [to_meta(self)]
        return last[0]

    def _from_meta(cls, meta, local_part, group, device="cpu"):
        return from_meta(cls, last[0], local_part, group, device)

    torch.LongTensor = _long_tensor
    PartitionedTensor.to_meta, PartitionedTensor.from_meta = _to_meta, classmethod(_from_meta)
    _recv_activation_buffers(torch)
