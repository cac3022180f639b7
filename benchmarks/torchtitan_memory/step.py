"""One configuration measured in this process (the worker of benchmarks/measure_memory_torchtitan.py): the
fake process group, torchtitan's own Trainer config and parallelised model on the meta device, materialised
under FakeTensorMode, and the training step run inside the memory tracker as Trainer.train_step runs it
(that script's docstring: Method). torch and torchtitan are imported when measure() runs, after the patches."""

from __future__ import annotations

import importlib
import time
from types import SimpleNamespace

from torchtitan_memory.configs import GIB, PRESETS
from torchtitan_memory.patches import make_tracker_class, patch_torchtitan


def _snapshot_gib(snap: dict) -> dict:
    (dev_snap,) = snap.values()
    return {getattr(k, "value", str(k)): v / GIB for k, v in dev_snap.items()}


def _trainer_config(c: dict):
    """torchtitan's own Trainer config for the preset, set to the configuration's layout (layers cut)."""
    from torchtitan.components.loss import CrossEntropyLoss
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    from torchtitan.models.common.config_utils import decoder_vocab_size

    preset = PRESETS[c["model"]]
    registry = importlib.import_module(f"torchtitan.models.{preset.get('registry', 'llama3')}.config_registry")
    cfg = getattr(registry, preset["config_fn"])()              # torchtitan's own Trainer config
    cfg.training.local_batch_size = c["mb"]
    cfg.training.seq_len = c["seq"]
    cfg.training.global_batch_size = -1                          # = local batch x dp: no accumulation
    cfg.parallelism.data_parallel_shard_degree = c["dp"]
    cfg.parallelism.data_parallel_replicate_degree = 1
    cfg.parallelism.tensor_parallel_degree = c["tp"]
    cfg.parallelism.enable_sequence_parallel = True
    cfg.parallelism.expert_parallel_degree = c.get("ep", 1)
    cfg.parallelism.spmd_backend = "partial_dtensor"            # 2.
    cfg.compile.enable = False
    ac = {"none": None, "selective": SelectiveAC.Config(), "full": FullAC.Config()}
    cfg.activation_checkpoint = ac[c["recompute"]]
    if c["loss"] == "ce":
        cfg.loss = CrossEntropyLoss.Config(global_vocab_size=decoder_vocab_size(cfg.model_spec))
    mc = cfg.model_spec.model
    if c["layers"] is not None:
        mc.layers = mc.layers[: c["layers"]]
    return cfg


def _build_model(cfg, world: int):
    """The meshes (outside fake mode, as estimation.py), the model on the meta device, parallelised by
    torchtitan's own parallelize function; (model, parallel dims, parameters before sharding)."""
    import torch
    import torchtitan
    import torchtitan.distributed.utils as tt_du
    from torchtitan.distributed import ParallelDims

    mc = cfg.model_spec.model
    pdims = ParallelDims.from_config(cfg.parallelism, world)
    pdims.build_mesh()                                            # outside fake mode, as estimation.py
    tt_du.set_spmd_backend(cfg.parallelism.spmd_backend)
    mc.update_from_config(config=cfg)
    with torch.device("meta"), torchtitan.tools.utils.set_default_dtype(torch.float32):
        model = mc.build()
    n_params = sum(p.numel() for p in model.parameters())
    model = cfg.model_spec.parallelize_fn(
        model, parallel_dims=pdims, training=cfg.training, parallelism=cfg.parallelism,
        compile_config=cfg.compile, ac_config=cfg.activation_checkpoint, dump_folder="/tmp/measure_tt")
    return model, pdims, n_params


def _prepare_step(cfg, c: dict, model, pdims) -> SimpleNamespace:
    """Under FakeTensorMode: the model materialised, loss, optimizers and one batch (the step's inputs)."""
    import torch
    import torchtitan.distributed.utils as tt_du

    model.to_empty(device="cpu")          # init_weights skipped under fake mode (estimation.py)
    model.train()
    loss_fn = cfg.loss.build(compile_config=cfg.compile)
    chunked = hasattr(loss_fn, "set_lm_head")
    if chunked:
        loss_fn.set_lm_head(model.lm_head)
        model._skip_lm_head = True
    optimizers = cfg.optimizer.build(model_parts=[model])
    train_context = tt_du.get_spmd_context(parallel_dims=pdims, spmd_typechecking=False)
    vocab, mb, seq = PRESETS[c["model"]]["vocab_size"], c["mb"], c["seq"]
    inputs = torch.randint(0, vocab, (mb, seq))
    labels = torch.randint(0, vocab, (mb, seq))
    positions = torch.arange(seq).unsqueeze(0).expand(mb, seq).contiguous()   # one document each
    masks = model.get_attention_masks(positions=positions)                     # block-causal BlockMask
    global_valid_tokens = (labels != -100).sum() * c["dp"]
    return SimpleNamespace(model=model, loss_fn=loss_fn, chunked=chunked, optimizers=optimizers,
                           train_context=train_context, inputs=inputs, labels=labels, positions=positions,
                           masks=masks, global_valid_tokens=global_valid_tokens)


def _steady_state(s: SimpleNamespace) -> None:
    """Steady state before the measured step: AdamW's state exists (torchtitan's init_optim_state, the
    zero-lr step it runs before a checkpoint load) and so do the sharded fp32 gradients that
    zero_grad(set_to_none=False) keeps from the previous step."""
    import torch
    from torchtitan.components.optimizer.utils import init_optim_state

    for opt in s.optimizers.optimizers:
        init_optim_state(opt)
    for p in s.model.parameters():
        p.grad = torch.zeros_like(p)


def _train_step(s: SimpleNamespace, tracker, cfg) -> None:
    """One training step as Trainer.train_step runs it (chunked loss: each chunk's backward inside the loss)."""
    import spmd_types as spmd
    import torchtitan.distributed.utils as tt_du

    s.optimizers.zero_grad(set_to_none=cfg.training.disable_cuda_graphs)
    with s.train_context():
        pred = s.model(s.inputs, attention_masks=s.masks, positions=s.positions)
        tracker.in_loss = True
        if s.chunked:
            loss, _ = s.loss_fn(pred, s.labels, s.global_valid_tokens, positions=s.positions)
        else:
            loss, _ = s.loss_fn(pred, s.labels, s.global_valid_tokens)
        tracker.in_loss = False
        del pred
        with spmd.no_typecheck():
            loss.backward()
    tt_du.clip_grad_norm_([p for p in s.model.parameters()], cfg.training.max_norm, foreach=True,
                          pp_mesh=None, ep_enabled=False)
    s.optimizers.step()
    del loss


def _tracked_steps(s: SimpleNamespace, tracker_class, cfg, two_steps: bool) -> list[dict]:
    """The measured step inside the tracker, after the steady state; --two-steps instead tracks a first step
    from scratch and then the second one (estimation.py's loop). Per step: peak by category, phase, s^2."""
    if not two_steps:
        _steady_state(s)
    tracker = tracker_class(mod=s.model, optm=s.optimizers.optimizers[0])
    tracker.track_inputs((s.inputs, s.labels))
    steps = []
    with tracker:
        for step in range(2 if two_steps else 1):
            t1 = time.time()
            if step == 1:
                tracker.reset_mod_stats()
                tracker.reset_peak()
            _train_step(s, tracker, cfg)
            peak = _snapshot_gib(tracker.get_tracker_snapshot("peak"))
            steps.append(dict(peak=peak, phase=tracker.peak_phase, s2_bytes=tracker.s2_bytes,
                              s2_shape=tracker.s2_shape, seconds=time.time() - t1))
    return steps


def _held_bytes(s: SimpleNamespace) -> tuple[int, int]:
    """Bytes of AdamW's state and of the sharded (local) parameters after the step."""
    import torch

    opt_bytes = 0
    for opt in s.optimizers.optimizers:
        for state in opt.state.values():
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    v = v.to_local() if hasattr(v, "to_local") else v
                    opt_bytes += v.numel() * v.element_size()
    local_param_bytes = 0
    for p in s.model.parameters():
        lp = p.to_local() if hasattr(p, "to_local") else p
        local_param_bytes += lp.numel() * lp.element_size()
    return opt_bytes, local_param_bytes


def measure(c: dict, two_steps: bool = False) -> dict:
    """One configuration in this process: returns the row's measured numbers."""
    prop_flag = patch_torchtitan()         # first: torchtitan modules imported later see device_type "cpu"
    import torch
    torch.set_num_threads(1)               # fake tensors compute nothing; 2 jobs on 2 cores must not contend
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    world = c["dp"] * c["tp"]
    t0 = time.time()
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    cfg = _trainer_config(c)
    n_layers = len(cfg.model_spec.model.layers)
    model, pdims, n_params = _build_model(cfg, world)
    tracker_class = make_tracker_class(prop_flag, c["seq"])
    with FakeTensorMode(allow_non_fake_inputs=True):
        s = _prepare_step(cfg, c, model, pdims)
        steps = _tracked_steps(s, tracker_class, cfg, two_steps)
        opt_bytes, local_param_bytes = _held_bytes(s)
    dist.destroy_process_group()
    return dict(config=c, n_layers=n_layers, n_params=n_params, steps=steps, opt_state_gib=opt_bytes / GIB,
                local_param_gib=local_param_bytes / GIB, torchtitan=_version("torchtitan"),
                torch=torch.__version__, seconds=time.time() - t0)


def _version(dist_name: str) -> str:
    from importlib.metadata import version
    return version(dist_name)
