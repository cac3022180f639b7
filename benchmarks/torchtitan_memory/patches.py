"""What torchtitan 0.3.0 + torch 2.13.0 need to run on a CPU under fake tensors, and the memory tracker the
step runs in: the patches 1-6 that benchmarks/measure_memory_torchtitan.py's docstring lists, each with its
reason (patch_torchtitan: 1, 3, 5, 6 and the flag for 4b; make_tracker_class's MeasureTracker: 4a-4c).
Imported inside the measuring subprocess only (torch and torchtitan are imported when called)."""

from __future__ import annotations


def patch_torchtitan():
    """The patches measure_memory_torchtitan.py's docstring lists (1, 3, 5, 6 and the DTensor propagation
    flag for 4b)."""
    import threading

    import torch
    import torch.nn.attention.flex_attention as flex_mod
    import torchtitan.tools.utils as tt_utils

    # 1. no accelerator: torchtitan falls back to "cuda"; meshes and tensors live on the CPU
    tt_utils.device_type = "cpu"
    import torchtitan.components.metrics as tt_metrics
    import torchtitan.distributed.parallel_dims as tt_pd
    import torchtitan.distributed.utils as tt_du
    import torchtitan.models.common.token_dispatcher as tt_td
    for mod in (tt_pd, tt_du, tt_metrics, tt_td):
        mod.device_type = "cpu"

    # 3. FlexAttention: uncompiled HOP (fake kernel under FakeTensorMode), block mask uncompiled
    import torchtitan.models.common.attention as tt_attn
    tt_attn.FlexAttention._compiled_flex_attn = flex_mod.flex_attention
    tt_attn._compiled_create_block_mask = flex_mod.create_block_mask
    flex_mod._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True
    flex_mod._validate_device = lambda *a, **k: None

    # 4b. mark DTensor's sharding propagation (global-shape fake ops, not memory)
    from torch.distributed.tensor._sharding_prop import ShardingPropagator
    flag = threading.local()
    orig = ShardingPropagator._propagate_tensor_meta_non_cached

    def propagate(self, op_schema):
        flag.depth = getattr(flag, "depth", 0) + 1
        try:
            return orig(self, op_schema)
        finally:
            flag.depth -= 1

    ShardingPropagator._propagate_tensor_meta_non_cached = propagate

    # 6. speed only: DTensor caches sharding propagation except when "tracing", which it takes any
    # active FakeTensorMode to be (symbolic shapes); every shape here is static, so the cache is valid
    import torch.distributed.tensor._sharding_prop as sharding_prop
    from torch._dynamo.external_utils import is_compiling
    from torch.fx.experimental.proxy_tensor import get_proxy_mode
    sharding_prop._are_we_tracing = lambda: is_compiling() or get_proxy_mode() is not None
    torch.autograd.set_multithreading_enabled(False)      # 5.
    return flag


def make_tracker_class(prop_flag, seq):
    import torch
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.utils._pytree import tree_leaves

    class MeasureTracker(FSDPMemTracker):
        supports_higher_order_operators = True             # 4a. flex_attention passes through

        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.in_loss = False
            self.peak_phase = ""
            self.s2_bytes = 0          # largest (b, heads, s, s)-like tensor (attention scores)
            self.s2_shape = None

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if getattr(prop_flag, "depth", 0):               # 4b. sharding propagation: not memory
                return func(*args, **(kwargs or {}))
            res = super().__torch_dispatch__(func, types, args, kwargs)
            if res is not NotImplemented:
                for t in tree_leaves(res):
                    if isinstance(t, torch.Tensor) and t.dim() >= 4 and t.shape[-1] == seq and t.shape[-2] == seq:
                        b = t.numel() * t.element_size()
                        if b > self.s2_bytes:
                            self.s2_bytes, self.s2_shape = b, (tuple(t.shape), str(t.dtype), str(func))
            return res

        def _fsdp_state_pre_forward(self, fsdp_mod, orig):  # 4c. repeated calls of a non-root unit
            inner = super()._fsdp_state_pre_forward(fsdp_mod, orig)

            def wrapper(*a, **k):
                if fsdp_mod is not self._root_mod and fsdp_mod in self.memory_tracking and not self._mod_tracker.is_bw:
                    self.memory_tracking.pop(fsdp_mod)
                return inner(*a, **k)

            return wrapper

        def _update_peak_stats(self, peak_state):
            before = dict(self._peak_mem)
            super()._update_peak_stats(peak_state)
            if self._peak_mem != before:
                if self._in_opt:
                    phase = "optimizer step"
                elif self.in_loss:
                    phase = "chunked loss (lm_head forward + backward per chunk)"
                elif self._mod_tracker.is_bw:
                    phase = "backward" + (" (recompute)" if self._in_ac else "")
                else:
                    phase = "forward"
                mods = [p for p in self._mod_tracker.parents if p != "Global"]
                deepest = max(mods, key=lambda p: (p.count("."), len(p))) if mods else ""
                self.peak_phase = f"{phase}{' in ' + deepest if deepest else ''}"

        def reset_peak(self):
            self._peak_mem_snap = self.get_tracker_snapshot()
            self._peak_mem = {dev: snap["Total"] for dev, snap in self._peak_mem_snap.items()}
            self.peak_phase, self.s2_bytes, self.s2_shape = "", 0, None

    return MeasureTracker

