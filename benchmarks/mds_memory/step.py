"""One Megatron-DeepSpeed configuration's training step, one rank, under fake tensors on a fake process group
(benchmarks/measure_memory_mds.py's docstring: the method). Run as its own process (Megatron's global arguments and
process groups are set once per process):

    python benchmarks/mds_memory/step.py '{"argv": [...], "world": W, "rank": R, "vocab": V, "mds_dir": DIR}'

prints one line `RESULT {json}`: the peak of allocated bytes over the second of two iterations, the forward/backward
part of it, what was allocated between the iterations, the rank's parameters and the engine that ran."""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]


def _setup(spec):
    os.environ.update(DS_ACCELERATOR="cpu", LOCAL_RANK="0", RANK=str(spec["rank"]), WORLD_SIZE=str(spec["world"]),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT="29555")
    sys.path[:0] = [spec["mds_dir"], str(BENCH.parent), str(BENCH)]
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from mds_memory.patches import patch_megatron, patch_torch_deepspeed, stub_modules
    stub_modules(torch)
    redirect = patch_torch_deepspeed(torch)
    dist.init_process_group("fake", store=FakeStore(), rank=spec["rank"], world_size=spec["world"])
    patch_megatron(torch, spec["vocab"])
    return torch, redirect


def _megatron_args(argv):
    """Megatron-DeepSpeed's own argument parsing, global state and parallel groups, as initialize_megatron sets them
    (its CUDA-only fused-kernel compilation and the dataset helper's build left out)."""
    sys.argv = ["pretrain_gpt.py", *argv]
    import megatron.initialize as init
    from megatron.arguments import parse_args, validate_args
    from megatron.global_vars import set_global_variables
    from megatron.training import _create_ds_config_dict
    args = parse_args(None, False)
    validate_args(args, {})
    set_global_variables(args)
    init._initialize_distributed()
    init._set_random_seed(args.seed, args.data_parallel_random_init)
    args.deepspeed_config_dict = _create_ds_config_dict()
    return args


def _total(mt) -> tuple[float, float]:
    """(peak, current) allocated bytes of the tracker's one device."""
    peak, now = mt.get_tracker_snapshot("peak"), mt.get_tracker_snapshot()
    dev = next(d for d in peak if d.type == "cpu")
    return peak[dev]["Total"], now[dev]["Total"]


def measure(spec) -> dict:
    torch, redirect = _setup(spec)
    args = _megatron_args(spec["argv"])
    import pretrain_gpt
    from megatron.arguments import core_transformer_config_from_args
    from megatron.core.enums import ModelType
    from megatron.training import setup_model_and_optimizer, train_step
    from torch._subclasses.fake_tensor import FakeTensorMode

    from mcore_memory.step import _tracker_class
    from mds_memory.patches import patch_pipeline_metas, whole_batch_under_sequence_parallelism
    whole_batch_under_sequence_parallelism(pretrain_gpt)
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    patch_pipeline_metas(torch, fake_mode)
    t0, seen = time.time(), {}
    with redirect(), fake_mode:
        mt = _tracker_class()()
        # no module tracking: its per-module gradient hooks (register_multi_grad_hook) keep every micro-batch's
        # received input and its gradient alive on a later pipeline stage, which the pipeline engine frees
        mt._mod_tracker.__enter__ = mt._mod_tracker.__exit__ = lambda *a: None
        mt.__enter__()
        model, opt, sched = setup_model_and_optimizer(pretrain_gpt.model_provider, ModelType.encoder_or_decoder)
        config = core_transformer_config_from_args(args)
        batches = iter(lambda: {"text": torch.zeros(args.micro_batch_size, args.seq_length + 1, dtype=torch.int64)},
                       None)
        engine = model[0]
        take_step = engine._take_model_step

        def _step(*a, **k):       # the forward/backward peak: what the iteration reached before the optimizer step
            seen["fb_peak"] = _total(mt)[0]
            return take_step(*a, **k)

        engine._take_model_step = _step
        train_step(pretrain_gpt.forward_step, batches, model, opt, sched, config)     # Adam's states exist after it
        seen["between"] = _total(mt)[1]
        mt.reset_peak()
        train_step(pretrain_gpt.forward_step, batches, model, opt, sched, config)
        peak = _total(mt)[0]
        mt.__exit__(None, None, None)
    n_params = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in engine.module.parameters())
    return dict(peak=peak, fb_peak=seen["fb_peak"], between=seen["between"], n_params=n_params,
                engine=f"{type(engine).__name__} with {type(engine.optimizer).__name__}",
                seconds=time.time() - t0, argv=spec["argv"])


if __name__ == "__main__":
    print("RESULT " + json.dumps(measure(json.loads(sys.argv[1]))), flush=True)
