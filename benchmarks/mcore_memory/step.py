"""measure(): one Megatron-Core configuration's training step in this process, under fake tensors on a fake process
group (benchmarks/measure_memory_mcore.py's docstring: the method). Imports torch and megatron when it runs; the
patches (mcore_memory.patches._patch) must be installed first."""

from __future__ import annotations

import copy
import time
import traceback

from mcore_memory.configs import _rank_of


def measure(c, redirect_mode):
    import megatron.core.pipeline_parallel.schedules as schedules
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode

    _init_parallel(c)
    cfg = _transformer_config(c)
    spec = _layer_spec(c)
    Tracker = _tracker_class()
    counts = {"fwd": 0, "bwd": 0, "max_in_flight": 0, "p2p_ops": 0}
    orig_backward_step, orig_batch_p2p = _install_counters(counts, schedules, dist)

    t0 = time.time()
    with redirect_mode(), FakeTensorMode(allow_non_fake_inputs=True):
        mt = Tracker()
        with mt:
            gpts, cast, n_params, models, opt = _build(c, cfg, spec, mt)
            after_init = _warm_step(mt, models, opt)
            fb, fb_peak, peak = _iteration(c, cfg, models, opt, mt, counts)

    schedules.backward_step = orig_backward_step
    dist.batch_isend_irecv = orig_batch_p2p
    dev = next(iter(peak))
    cats = lambda snap: _categories(snap, dev)
    return dict(peak=cats(peak), fb_peak=cats(fb_peak), after_init=cats(after_init), n_params=n_params,
                fwd=counts["fwd"], bwd=counts["bwd"], max_in_flight=counts["max_in_flight"],
                p2p_ops=counts["p2p_ops"], schedule=fb.__name__, seconds=time.time() - t0, cast=cast)


def _init_parallel(c):
    """The fake process group and Megatron's parallel state for the measured rank."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    tp, pp, cp, dp, ep = c["tp"], c["pp"], c["cp"], c["dp"], c["ep"]
    world = tp * pp * cp * dp
    rank = _rank_of(c)
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    vp = c.get("vp", 1)
    parallel_state.initialize_model_parallel(tp, pp, virtual_pipeline_model_parallel_size=vp if vp > 1 else None,
                                             context_parallel_size=cp, expert_model_parallel_size=ep,
                                             create_gloo_process_groups=False)
    assert parallel_state.get_pipeline_model_parallel_rank() == c["stage"], "wrong rank for the stage"
    model_parallel_cuda_manual_seed(1234)


def _transformer_config(c):
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer import TransformerConfig

    tp, pp, cp, dp, ep = c["tp"], c["pp"], c["cp"], c["dp"], c["ep"]
    vp = c.get("vp", 1)
    moe = c.get("num_experts", 0) > 0
    norm = "RMSNorm" if c["normalization"] == "rmsnorm" else "LayerNorm"
    kw = {}
    if c["recompute"] == "full":
        kw.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    elif c["recompute"] == "selective":
        kw.update(recompute_granularity="selective")
    if moe:
        kw.update(num_moe_experts=c["num_experts"], moe_router_topk=c["moe_router_topk"],
                  moe_ffn_hidden_size=c["moe_ffn_hidden_size"], moe_token_dispatcher_type="alltoall",
                  moe_grouped_gemm=False, moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=1e-2,
                  moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True,
                  expert_model_parallel_size=ep)
    swiglu = c["ffn_type"] == "swiglu"
    cfg = TransformerConfig(
        num_layers=c["num_layers"], hidden_size=c["hidden_size"], num_attention_heads=c["num_attention_heads"],
        num_query_groups=c["num_query_groups"], ffn_hidden_size=c["ffn_hidden_size"],
        gated_linear_unit=swiglu, activation_func=F.silu if swiglu else F.gelu, normalization=norm,
        add_bias_linear=c["add_bias_linear"], hidden_dropout=c["dropout"], attention_dropout=c["dropout"],
        bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, context_parallel_size=cp,
        virtual_pipeline_model_parallel_size=vp if vp > 1 else None, sequence_parallel=c["sequence_parallel"],
        # Megatron-LM's defaults where they run without CUDA: fused bias+SwiGLU / bias+GeLU (autograd
        # Functions that save only their input), bias-dropout-add; CUDA-only kernels off: the masked-softmax
        # kernel (local attention), TE's fused RoPE, gradient-accumulation fusion, persistent LayerNorm.
        bias_activation_fusion=True, bias_dropout_fusion=True,
        masked_softmax_fusion=False, apply_rope_fusion=False, gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        deallocate_pipeline_outputs=True,     # as Megatron-LM sets it
        **kw)
    return cfg


def _layer_spec(c):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    cp = c["cp"]
    norm = "RMSNorm" if c["normalization"] == "rmsnorm" else "LayerNorm"
    spec = get_gpt_layer_local_spec(num_experts=c.get("num_experts") or None, moe_grouped_gemm=False,
                                    normalization=norm)
    if c["attention"] == "flash-standin":
        spec = copy.deepcopy(spec)
        spec.submodules.self_attention.submodules.core_attention = _flash_standin_class()
    elif cp > 1:
        raise ValueError("Megatron-Core's local DotProductAttention has no context parallelism")
    return spec


def _install_counters(counts, schedules, dist):
    """Count the schedule's backward steps and p2p ops; returns the originals to put back."""
    orig_backward_step = schedules.backward_step

    def counting_backward_step(*a, **k):
        counts["bwd"] += 1
        return orig_backward_step(*a, **k)

    schedules.backward_step = counting_backward_step
    orig_batch_p2p = dist.batch_isend_irecv

    def counting_batch_p2p(ops):
        counts["p2p_ops"] += len(ops)
        return orig_batch_p2p(ops)

    dist.batch_isend_irecv = counting_batch_p2p
    return orig_backward_step, orig_batch_p2p


def _build(c, cfg, spec, mt):
    """The model chunks, their DDP wrappers and the optimizer, built under the tracker, model states tagged."""
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    gpts, cast = _model_chunks(c, cfg, spec, GPTModel, parallel_state)
    n_params = sum(p.numel() for gpt in gpts for p in gpt.parameters())
    ddp_cfg = DistributedDataParallelConfig(grad_reduce_in_fp32=True,
                                            use_distributed_optimizer=c["distributed_optimizer"])
    # one DDP per virtual stage, bucketing only the first's (Megatron-LM's training.get_model)
    models = [DistributedDataParallel(cfg, ddp_cfg, gpt, disable_bucketing=i > 0) for i, gpt in enumerate(gpts)]
    opt = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", bf16=True, use_distributed_optimizer=c["distributed_optimizer"],
                        lr=1e-4, weight_decay=0.1, clip_grad=1.0),
        models, use_gloo_process_groups=False)
    _tag_model_states(mt, gpts, models, opt)
    return gpts, cast, n_params, models, opt


def _tag_model_states(mt, gpts, models, opt):
    """Categorise what construction allocated: bf16 params, the fp32 grad buffers, fp32 main params."""
    from torch.distributed._tools.mem_tracker import _MemRefType

    for gpt, model in zip(gpts, models):
        for p in gpt.parameters():
            mt.tag(p, _MemRefType.PARAM)
        for buf in list(model.buffers) + list(model.expert_parallel_buffers):
            mt.tag(buf.grad_data, _MemRefType.GRAD)
            if buf.param_data is not None:
                mt.tag(buf.param_data, _MemRefType.PARAM)
    for sub in getattr(opt, "chained_optimizers", [opt]):
        groups = getattr(sub, "shard_fp32_from_float16_groups", None) or \
            getattr(sub, "fp32_from_float16_groups", [])
        for g in groups:
            for t in g:
                if t is not None:
                    mt.tag(t, _MemRefType.OPT)
    mt.retag_all(_MemRefType.ACT, _MemRefType.OTH)


def _warm_step(mt, models, opt):
    """Steady state: Adam's moments exist before the measured iteration (one step on zero gradients)."""
    from torch.distributed._tools.mem_tracker import _MemRefType

    for model in models:
        model.zero_grad_buffer()
    opt.zero_grad()
    opt.step()
    mt.retag_all(_MemRefType.ACT, _MemRefType.OTH)
    after_init = mt.get_tracker_snapshot()
    for model in models:
        model.zero_grad_buffer()
    opt.zero_grad()
    mt.reset_peak()
    return after_init


def _iteration(c, cfg, models, opt, mt, counts):
    """One training iteration through Megatron-Core's schedule, then optimizer.step(); the peaks after each."""
    import torch
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.pipeline_parallel import get_forward_backward_func

    s, b, m, V = c["seq_length"], c["micro_batch"], c["num_microbatches"], c["vocab_size"]
    s_local, vp = s // c["cp"], c.get("vp", 1)
    cfg.finalize_model_grads_func = finalize_model_grads
    cfg.no_sync_func = [model.no_sync for model in models] if vp > 1 else models[0].no_sync
    cfg.grad_scale_func = opt.scale_loss

    def forward_step(data_iterator, mdl):
        counts["fwd"] += 1
        counts["max_in_flight"] = max(counts["max_in_flight"], counts["fwd"] - counts["bwd"])
        tokens = torch.randint(0, V, (b, s_local), device="cuda")
        position_ids = torch.arange(s_local, device="cuda").unsqueeze(0).expand(b, s_local)
        labels = torch.randint(0, V, (b, s_local), device="cuda")
        loss_mask = torch.ones(b, s_local, dtype=torch.float, device="cuda")
        out = mdl(tokens, position_ids, None, labels=labels)

        def loss_func(output_tensor):
            losses = output_tensor.float().view(-1)
            loss = torch.sum(losses * loss_mask.view(-1)) / loss_mask.sum()
            return loss, {"lm loss": loss.detach()}

        return out, loss_func

    fb = get_forward_backward_func()
    # seq_length is the full sequence: the schedule divides it by cp (and tp with SP) for p2p shapes
    fb(forward_step_func=forward_step, data_iterator=[None] * vp if vp > 1 else None, model=models,
       num_microbatches=m,
       seq_length=s, micro_batch_size=b, forward_only=False)
    fb_peak = mt.get_tracker_snapshot("peak")
    opt.step()
    peak = mt.get_tracker_snapshot("peak")
    return fb, fb_peak, peak


def _categories(snap, dev):
    from torch.distributed._tools.mem_tracker import _MemRefType

    d = snap.get(dev, {})
    g = lambda t: d.get(t, 0)
    return dict(parameters=g(_MemRefType.PARAM), gradients=g(_MemRefType.GRAD), optimizer=g(_MemRefType.OPT),
                activations=g(_MemRefType.ACT), temp=g(_MemRefType.TEMP),
                other=g(_MemRefType.OTH) + g(_MemRefType.BUFFER), total=d.get("Total", 0))


def _model_chunks(c, cfg, spec, GPTModel, parallel_state):
    """The GPTModel of each virtual pipeline stage this rank holds (one without interleaving), cast to bf16 as
    Megatron-LM's Float16Module does (module.bfloat16() cannot swap fake parameters, so in place: e.g. the learned
    position table is built fp32), and the names cast."""
    import torch
    vp, gpts, cast = c.get("vp", 1), [], []
    for i in range(vp):
        at = dict(ignore_virtual=False, vp_stage=i) if vp > 1 else {}
        gpt = GPTModel(cfg, spec, vocab_size=c["vocab_size"], max_sequence_length=c["seq_length"],
                       pre_process=parallel_state.is_pipeline_first_stage(**at),
                       post_process=parallel_state.is_pipeline_last_stage(**at),
                       share_embeddings_and_output_weights=c["tie_embeddings"],
                       position_embedding_type="rope" if c["position_embedding"] == "rope" else "learned_absolute",
                       rotary_base=int(c.get("rope_theta", 10000)), **({"vp_stage": i} if vp > 1 else {}))
        for name, prm in gpt.named_parameters():
            if prm.dtype.is_floating_point and prm.dtype != torch.bfloat16:
                prm.data = prm.data.to(torch.bfloat16)
                cast.append(name)
        for mod in gpt.modules():
            for bname, buf in list(mod._buffers.items()):
                if buf is not None and buf.dtype.is_floating_point and buf.dtype != torch.bfloat16:
                    mod._buffers[bname] = buf.to(torch.bfloat16)
                    cast.append(bname)
        gpts.append(gpt)
    return gpts, cast


def _child(c, redirect_mode, conn):
    try:
        conn.send(("ok", measure(c, redirect_mode)))
    except BaseException as e:  # report every failure to the parent
        tb = traceback.format_exc()
        conn.send(("err", f"{type(e).__name__}: {e}".splitlines()[0][:300], tb))
    finally:
        conn.close()


def _tracker_class():
    import weakref

    from torch.distributed._tools.mem_tracker import MemTracker

    class Tracker(MemTracker):
        """MemTracker with its per-module snapshots off (see the docstring); AC detection kept."""

        def _pre_fw_hook(self, module, inputs):
            if self._mod_tracker.is_bw and self._ac_mod is None:
                self._ac_mod = weakref.ref(module)
                self._in_ac = True

        def _post_fw_hook(self, module, inputs, outputs):
            if self._mod_tracker.is_bw and self._ac_mod is not None and self._ac_mod() is module:
                self._ac_mod = None
                self._in_ac = False

        def _pre_bw_hook(self, module, args):
            pass

        def _post_bw_hook(self, module, args):
            pass

        def tag(self, tensor, reftype):
            self._update_and_maybe_create_winfos(tensor, reftype)

        def retag_all(self, old, new):
            from torch.distributed._tools.mem_tracker import _UpdateType
            for winfo, _ in list(self._WINFO.values()):
                if winfo.reftype == old:
                    winfo.reftype = new
                    self._update_snap(_UpdateType.REF, winfo, old_reftype=old)

        def reset_peak(self):
            snap = self.get_tracker_snapshot()
            self._peak_mem_snap = snap
            self._peak_mem = {dev: s["Total"] for dev, s in snap.items()}

    return Tracker


def _flash_standin_class():
    """A core-attention module with FlashAttention's memory footprint (see the docstring)."""
    import torch
    from megatron.core import parallel_state
    from megatron.core.transformer.module import MegatronModule

    class _FlashFn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, cp):
            sq, b, heads, hn = q.shape
            out = q.new_empty(sq, b, heads * hn)
            lse = torch.empty(b, heads, sq, dtype=torch.float32, device=q.device)
            if cp > 1:      # ring attention: the next two K/V chunks in flight while one is computed on
                bufs = [torch.empty_like(k), torch.empty_like(v), torch.empty_like(k), torch.empty_like(v)]
                del bufs
            ctx.cp = cp
            ctx.save_for_backward(q, k, v, out, lse)
            return out

        @staticmethod
        def backward(ctx, dout):
            q, k, v, out, lse = ctx.saved_tensors
            if ctx.cp > 1:  # ring backward: K/V chunks and their dK/dV accumulators travel the ring
                bufs = [torch.empty_like(k), torch.empty_like(v), torch.empty_like(k), torch.empty_like(v)]
                del bufs
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), None

    class FlashStandinAttention(MegatronModule):
        def __init__(self, config, layer_number, attn_mask_type, attention_type, attention_dropout=None,
                     softmax_scale=None, cp_comm_type=None, pg_collection=None):
            super().__init__(config=config)
            self.cp = config.context_parallel_size

        def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                    packed_seq_params=None):
            return _FlashFn.apply(query, key, value, self.cp)

    del parallel_state
    return FlashStandinAttention
