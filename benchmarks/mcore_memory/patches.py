"""What Megatron-Core 0.16.1 + torch 2.13.0 need to run on fake CPU tensors (benchmarks/measure_memory_mcore.py's
docstring says what is patched and why): _patch() and the stand-ins it installs. Nothing in megatron-core's files is
edited; torch and megatron are imported when _patch() runs."""

from __future__ import annotations

import contextlib
import warnings


def _patch():
    """Make Megatron-Core run on fake CPU tensors (see the module docstring). Returns the device redirect mode."""
    import torch
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.overrides import TorchFunctionMode

    warnings.filterwarnings("ignore")
    cpu = torch.device("cpu")
    _patch_cuda(torch, cpu)
    _patch_fake_values(torch, dist, FakeTensor)
    _patch_dropout_adam(torch)
    _import_megatron(torch)
    _patch_megatron(torch)
    return _redirect_mode(torch, cpu, FakeTensor, TorchFunctionMode)


def _patch_cuda(torch, cpu):
    torch.cuda.current_device = lambda: cpu
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.manual_seed = lambda *a, **k: None
    torch.cuda.manual_seed_all = lambda *a, **k: None
    torch.cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()
    torch.cuda.set_rng_state = lambda *a, **k: None

    class _Stream:                      # CUDA streams / events: no-ops
        def __init__(self, *a, **k):
            pass

        def __getattr__(self, name):
            return lambda *a, **k: None

        def __eq__(self, other):
            return True

        def __hash__(self):
            return 0

    _the_stream = _Stream()
    torch.cuda.Stream = _Stream
    torch.cuda.Event = _Stream
    torch.cuda.current_stream = lambda *a, **k: _the_stream
    torch.cuda.default_stream = lambda *a, **k: _the_stream
    torch.cuda.stream = lambda *a, **k: contextlib.nullcontext()


def _patch_fake_values(torch, dist, FakeTensor):
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    def _item(self):
        for attr in ("_mc_value", "constant"):
            const = getattr(self, attr, None)
            if const is not None:
                with unset_fake_temporarily():
                    return const.item()
        return 1.0

    FakeTensor.item = _item

    def _tolist(self):
        const = getattr(self, "_mc_value", None)
        if const is None:
            const = getattr(self, "constant", None)
        if const is None:
            raise RuntimeError(f"tolist() of a data-dependent fake tensor {tuple(self.shape)} {self.dtype}")
        with unset_fake_temporarily():
            return const.tolist()

    FakeTensor.tolist = _tolist

    def _all_gather_object(object_list, obj, group=None):
        for i in range(len(object_list)):
            object_list[i] = obj

    dist.all_gather_object = _all_gather_object


def _patch_dropout_adam(torch):
    import torch.nn.functional as F
    cpu_dropout = F.dropout

    def _dropout(input, p=0.5, training=True, inplace=False):
        # CUDA's out-of-place dropout is the fused native_dropout (saves a 1-byte bool mask); on a CPU build
        # F.dropout multiplies by a noise tensor of the input's dtype (2 bytes, bf16) instead.
        if training and not inplace and 0.0 < p < 1.0 and isinstance(input, torch.Tensor):
            return torch.native_dropout(input, p, True)[0]
        return cpu_dropout(input, p, training, inplace)

    F.dropout = _dropout

    class _FusedAdamW(torch.optim.AdamW):
        def __init__(self, *a, **k):
            k.setdefault("fused", True)
            super().__init__(*a, **k)

    class _FusedAdam(torch.optim.Adam):
        def __init__(self, *a, **k):
            k.setdefault("fused", True)
            super().__init__(*a, **k)

    torch.optim.AdamW, torch.optim.Adam = _FusedAdamW, _FusedAdam


def _import_megatron(torch):
    # Megatron-Core's jit_fuser is torch.compile: import its modules with an identity decorator instead, so
    # that the fused-activation autograd Functions (bias_swiglu_impl / bias_gelu_impl) run eagerly.
    real_compile = torch.compile

    def _no_compile(fn=None, *a, **k):
        return fn if callable(fn) else (lambda f: f)

    torch.compile = _no_compile
    try:
        import megatron.core.jit  # noqa: F401  (binds jit_fuser to the identity)
        import megatron.core.models.gpt  # noqa: F401
        import megatron.core.fusions.fused_bias_dropout  # noqa: F401
        import megatron.core.fusions.fused_bias_gelu  # noqa: F401
        import megatron.core.fusions.fused_bias_swiglu  # noqa: F401
        import megatron.core.transformer.moe.moe_layer  # noqa: F401
        import megatron.core.transformer.moe.token_dispatcher  # noqa: F401
        import megatron.core.transformer.moe.router  # noqa: F401
        import megatron.core.transformer.moe.experts  # noqa: F401
        import megatron.core.optimizer  # noqa: F401
        import megatron.core.distributed  # noqa: F401
        import megatron.core.pipeline_parallel  # noqa: F401
    finally:
        torch.compile = real_compile

    import megatron.core.transformer.moe.moe_utils as mmoe
    if not hasattr(mmoe, "te_general_gemm"):    # referenced unguarded in RouterGatingLinearFunction without TE
        mmoe.te_general_gemm = None


def _patch_megatron(torch):
    import megatron.core.distributed.param_and_grad_buffer as mpgb
    import megatron.core.optimizer.clip_grads as mclip
    import megatron.core.optimizer.optimizer as mopt
    import megatron.core.tensor_parallel.random as mrand

    mrand._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mrand._set_cuda_rng_state = lambda *a, **k: None

    class _Handle:
        def wait(self):
            pass

    @contextlib.contextmanager
    def _no_coalescing(*a, **k):
        yield _Handle()

    mpgb._coalescing_manager = _no_coalescing

    def _l2norm(chunk, noop, tensor_lists, per_tensor, *a):
        norms = [torch.norm(t) for lst in tensor_lists for t in lst]
        return (torch.stack(norms).norm().reshape(1) if norms else torch.zeros(1)), None

    def _scale(chunk, noop, tensor_lists, scale):
        for src, dst in zip(tensor_lists[0], tensor_lists[1]):
            if src is not dst:
                dst.copy_(src)
            dst.mul_(scale)

    import megatron.core.transformer.torch_norm as mnorm
    mnorm.WrappedTorchNorm.__new__ = staticmethod(_norm_new())
    _fused_activation_kernels()

    mclip.l2_norm_impl = _l2norm
    mclip.multi_tensor_scale_impl = _scale
    mopt.multi_tensor_scale_impl = _scale


def _redirect_mode(torch, cpu, FakeTensor, TorchFunctionMode):
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    def _is_cuda(d):
        if isinstance(d, str):
            return d.startswith("cuda")
        if isinstance(d, torch.device):
            return d.type == "cuda"
        return isinstance(d, int) and not isinstance(d, bool)

    from torch.utils._pytree import tree_flatten, tree_map

    _FACTORIES = {torch.full, torch.arange, torch.zeros, torch.ones, torch.tensor}

    def _value_of(x):
        return getattr(x, "_mc_value", None) if isinstance(x, FakeTensor) else x

    def _carry_value(func, args, kwargs, res):
        """Small integer tensors (MoE token counts / split sizes under drop-and-pad, which are static) carry
        their real value along (computed on real tensors next to the fake ones), so that .tolist() / .item()
        on them give the real numbers."""
        if not isinstance(res, FakeTensor) or res.dtype.is_floating_point or res.numel() > 65536:
            return
        leaves = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
        if not leaves and func not in _FACTORIES:
            return
        if any(_value_of(x) is None for x in leaves):
            return
        real_args, real_kwargs = tree_map(_value_of, (args, kwargs))
        if "device" in real_kwargs:
            real_kwargs = dict(real_kwargs, device=cpu)
        with unset_fake_temporarily():
            try:
                real = func(*real_args, **real_kwargs)
            except Exception:
                return
        if isinstance(real, torch.Tensor) and real.shape == res.shape:
            res._mc_value = real

    class CudaToCpu(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if "device" in kwargs and _is_cuda(kwargs["device"]):
                kwargs = dict(kwargs, device=cpu)
            if kwargs.get("pin_memory"):
                kwargs = dict(kwargs, pin_memory=False)
            if func is torch.Tensor.cuda or func is torch.Tensor.pin_memory:
                return args[0]
            if func is torch.Tensor.to:
                args = tuple(cpu if i > 0 and not isinstance(a, (torch.Tensor, torch.dtype)) and _is_cuda(a) else a
                             for i, a in enumerate(args))
            if func is torch.Tensor.type and len(args) == 1 and not kwargs:
                name = func(*args)
                return name if name.startswith("torch.cuda.") else name.replace("torch.", "torch.cuda.", 1)
            res = func(*args, **kwargs)
            if isinstance(res, FakeTensor):
                _carry_value(func, args, kwargs, res)
            return res

    return CudaToCpu


def _fused_activation_kernels():
    """Give Megatron-Core's fused bias-GeLU / bias-SwiGLU kernels the footprint they have on a GPU.

    megatron-core 0.16.1 megatron/core/fusions/fused_bias_gelu.py and fused_bias_swiglu.py: GeLUFunction /
    BiasSwiGLUFunction / SwiGLUFunction save only their input (and the bias) and call ``jit_fuser`` functions
    (``torch.compile``: one fused element-wise kernel each) -- ``bias_gelu`` / ``swiglu`` / ``bias_swiglu``
    return one tensor of the output's shape, ``bias_gelu_back`` / ``swiglu_back`` / ``bias_swiglu_back`` one
    tensor of the input's shape, and nothing else is allocated. Run eagerly (torch.compile cannot trace under
    FakeTensorMode) they allocate every element-wise intermediate (about seven FFN-wide tensors in a GeLU
    backward). Under fake tensors only shapes and dtypes matter, so each is replaced by the one allocation the
    fused kernel makes; the autograd Functions around them (what is saved for backward) are Megatron's own.
    """
    import torch
    import megatron.core.fusions.fused_bias_gelu as mgelu
    import megatron.core.fusions.fused_bias_swiglu as mswiglu

    def _dtype(y, others):
        dtype = y.dtype
        for t in others:
            dtype = torch.promote_types(dtype, t.dtype)
        return dtype

    def _like(y, *others):
        return y.new_empty(y.shape, dtype=_dtype(y, others))

    def _half(y, *others):
        return y.new_empty((*y.shape[:-1], y.shape[-1] // 2), dtype=_dtype(y, others))

    mgelu.bias_gelu = lambda bias, y: _like(y, bias)
    mgelu.bias_gelu_back = lambda g, bias, y: _like(y, g, bias)
    mswiglu.swiglu = lambda y: _half(y)
    mswiglu.bias_swiglu = lambda y, bias: _half(y, bias)
    mswiglu.swiglu_back = lambda g, y: _like(y, g)
    mswiglu.bias_swiglu_back = lambda g, y, bias: _like(y, g, bias)


def _norm_new():
    """Replacement for megatron.core.transformer.torch_norm.WrappedTorchNorm.__new__ (see the docstring)."""
    import torch

    class _RMSNormFn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, eps):
            rstd = torch.empty(x.shape[:-1] + (1,), dtype=torch.float32, device=x.device)
            ctx.save_for_backward(x, weight, rstd)
            return torch.empty_like(x)

        @staticmethod
        def backward(ctx, dy):
            x, weight, rstd = ctx.saved_tensors
            return torch.empty_like(x), torch.empty_like(weight), None

    class FusedRMSNormStandin(torch.nn.Module):
        def __init__(self, hidden_size, eps, dtype):
            super().__init__()
            self.eps = eps
            self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=dtype))

        def forward(self, x):
            return _RMSNormFn.apply(x, self.weight, self.eps)

    def __new__(cls, config, hidden_size, eps=1e-5, persist_layer_norm=False, zero_centered_gamma=False,
                normalization="LayerNorm"):
        if config.normalization == "RMSNorm":
            norm = FusedRMSNormStandin(hidden_size, eps, config.params_dtype)
        else:
            norm = torch.nn.LayerNorm(hidden_size, eps=eps, dtype=config.params_dtype)
        for p in norm.parameters():      # as Megatron's FusedLayerNorm / TENorm mark them
            setattr(p, "sequence_parallel", config.sequence_parallel)
        return norm

    return __new__
