"""Run one trial: train the GPT of trial.json with its layout on DeepSpeed and write the result JSON.

Launch one process per rank (tp*pp*dp of them), e.g.
    torchrun --standalone --nproc_per_node 2 -m tuner.runners.harness.train
    deepspeed --num_gpus 2 --module tuner.runners.harness.train
Device: CUDA when available (nccl, bf16), else CPU (gloo, fp32, DS_ACCELERATOR=cpu).

Environment:
    TUNER_TRIAL_JSON      path of trial.json (required): {"layout": {...}, "model": {...},
                          "global_batch", "cluster", "nodes", "gpus", "study", "trial"}
    TUNER_RESULT_JSON     where the result goes (default: result.json in the trial directory)
    TUNER_TRIAL_DIR       trial directory: progress.jsonl is appended there (default: cwd)
    TUNER_WARMUP_STEPS    untimed iterations first (default 1)
    TUNER_STEPS           timed iterations (default 3)
    TUNER_SEED            seed of weights and synthetic data (default 1234)
    TUNER_PEAK_TFLOPS     per-device peak for peak_fraction (default: the cluster preset's, if any)
    TUNER_DTYPE           fp32 / bf16 / fp16 (default: bf16 on CUDA, fp32 on CPU; TUNER_PRECISION is the
                          study's GEMM precision, bf16 or fp8, which the harness refuses unless bf16)
    TUNER_OPTIMIZER       adam (default: the rendered config's Adam) or sgd (plain SGD, lr 0.1, no
                          clipping: the parallelism tests use it, as its losses expose gradient scale)
    TUNER_LR              overrides the optimizer's learning rate
    TUNER_TORCH_ADAM      1: PyTorch's Adam on GPUs too, not DeepSpeed's FusedAdam (which DeepSpeed compiles
                          at first use, needing a CUDA compiler that matches torch's CUDA)
    TUNER_MEMORY_LIMIT_GB caps this process's address space growth (RLIMIT_AS) before the model
                          is built, so an oversized layout fails as `oom` on CPU (default: none)
    TUNER_COLLECTIVE_TIMEOUT_S  timeout of a stuck collective, so a failure never hangs (default 600)
    TUNER_CPU_ALLOCATED   0: a CPU rank's peak_memory_gb is its resident peak, not its tensors' (default 1; the
                          resident peak also without a warm-up step, whose profiling would be timed)
    TUNER_MOE_AUX_LOSS_COEFF    MoE models: the load-balancing loss coefficient (default 0.01; 0: none)

Result JSON (written by rank 0 on success, by the first failing rank otherwise):
    status ok|oom|failed, tflops_per_gpu (Megatron count, with the layout's recompute), model_tflops_per_gpu (c
    = 3), peak_fraction (when a peak is known), samples_per_second, tokens_per_second, peak_memory_gb (max over
    ranks: the tensors' allocated peak, on CPU over the set-up and first step, allocated.py), on CPU host_rss_gb
    (the resident peak), on a GPU peak_reserved_gb and rank 0's device_used_gb / reserved_now_gb after the timed
    steps (the device's total - free: context and NCCL buffers included), message, losses (one per iteration, warm-up
    included), step_times, samples (really processed in the timed steps), startup_s (process start to end of the
    first iteration), device, precision, world_size, ds_config, recompute, sequence_parallel (in effect: tp >
    1), rank0 (what rank 0's layers did: layers, layer_runs and attention_core_runs counting recomputes,
    residual_tokens = sequence positions held between layers, parameters held; for an MoE model also moe_layers,
    local_experts, expert_rows = (token, expert) rows its experts ran, rows_sent_to_other_ranks, aux_loss).
TFLOPS count an MoE model's active parameters (tuner.perfmodel.flops). The layout's expert_parallel and
expert_tensor_parallel split the MoE layers (moe.py); the world size stays tp*pp*dp.
The process exits 0 on `ok` and 1 otherwise (so the launcher tears down the other ranks).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch

from tuner.layout import Layout
from tuner.perfmodel.flops import megatron_flops
from tuner.render.dsconfig import render_ds_config
from tuner.runners.harness.allocated import CpuAllocated, host_rss_gb
from tuner.runners.harness.support import layout_refusal, model_refusal
from tuner.specs import ClusterSpec, ModelSpec, Workload
from tuner.trial import looks_oom


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def synthetic_batch(step: int, global_batch: int, seq: int, vocab: int, seed: int) -> torch.Tensor:
    """Token ids [global_batch, seq + 1] of iteration `step`: the same for every layout of a seed.
    Zipf-like unigram distribution, so the loss has something to learn."""
    gen = torch.Generator().manual_seed(seed * 7919 + step)
    probs = 1.0 / (torch.arange(vocab, dtype=torch.float64) + 10.0)
    return torch.multinomial(probs.expand(global_batch, vocab), seq + 1, replacement=True, generator=gen)


def micro_batches(step, layout, par, spec, global_batch, seed, device):
    """This replica's micro-batches of iteration `step` as (tokens, labels) on `device`."""
    data = synthetic_batch(step, global_batch, spec.seq_length, spec.vocab_size, seed)
    mb = layout.micro_batch
    per_replica = global_batch // layout.dp
    mine = data[par.dp_rank * per_replica:(par.dp_rank + 1) * per_replica]
    for j in range(per_replica // mb):
        chunk = mine[j * mb:(j + 1) * mb].to(device)
        yield chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()


def classify(exc: BaseException) -> str:
    """'oom' where `exc` says this rank ran out of its device's memory, else 'failed'. NCCL's ncclSystemError (a
    system call or library call NCCL made failed: nccl.h) is 'failed' even where its last error says "Cannot allocate
    memory": that ENOMEM is the host's -- ibv_reg_mr over the locked-memory limit, ibv_create_cq out of RDMA resources
    (NVIDIA/nccl#563, deepseek-ai/DeepEP#143) --, not the layout's; NCCL's own cudaMalloc failing is
    ncclUnhandledCudaError "Cuda failure 2 'out of memory'", an OOM."""
    if isinstance(exc, torch.OutOfMemoryError):
        return "oom"
    host = not torch.cuda.is_available()     # CPU ranks: the host's memory is the device's (tuner.trial.looks_oom)
    if isinstance(exc, MemoryError):
        return "oom" if host else "failed"
    lost = any(w in str(exc) for w in ("without exception set", "without setting an exception"))   # CPython's wordings
    if isinstance(exc, SystemError) and lost and resource.getrlimit(resource.RLIMIT_AS)[0] != resource.RLIM_INFINITY:
        return "oom"      # under the address-space cap a C extension's failed allocation can surface so
    return "oom" if looks_oom(str(exc), host) and "ncclSystemError" not in str(exc) else "failed"


def write_json(path: Path, data: dict, exclusive: bool = False) -> None:
    """Write `data`; with exclusive, only if nobody wrote it first (the first failure wins)."""
    text = json.dumps(data, indent=2, default=str)
    if exclusive:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return
    tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def peak_memory_gb(device: torch.device, cpu_peak_gb: float | None = None) -> float:
    """The tensors' allocated peak: the CUDA allocator's, or on CPU `cpu_peak_gb` (allocated.CpuAllocated; the
    process's resident peak where none was read)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    return host_rss_gb() if cpu_peak_gb is None else cpu_peak_gb


def device_used_gb(device: torch.device) -> dict:
    """After the timed steps on a GPU: what the whole device holds (total - free, the CUDA context and NCCL's buffers
    included: what tuner's memory_reserved_gb stands for beyond PyTorch's reserved bytes) and PyTorch's reserved bytes
    at that moment, GB of 1e9 bytes; nothing off a GPU."""
    if device.type != "cuda":
        return {}
    free, total = torch.cuda.mem_get_info(device)
    return {"device_used_gb": (total - free) / 1e9, "reserved_now_gb": torch.cuda.memory_reserved(device) / 1e9}


def peak_reserved_gb(device: torch.device) -> float:
    """The caching allocator's reserved peak (its own fragmentation included); 0 off a GPU (none read)."""
    return torch.cuda.max_memory_reserved(device) / 1e9 if device.type == "cuda" else 0.0


def cap_memory(limit_gb: float) -> None:
    """Let the address space grow by at most limit_gb from here (CPU OOM classification)."""
    with open("/proc/self/statm") as f:
        vm_bytes = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    cap = vm_bytes + int(limit_gb * 1e9)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def peak_tflops(trial: dict) -> float | None:
    if os.environ.get("TUNER_PEAK_TFLOPS"):
        return float(os.environ["TUNER_PEAK_TFLOPS"])
    try:
        from tuner.specs import load_cluster
        return load_cluster(str(trial.get("cluster"))).peak_tflops
    except Exception:
        return None


def workload_of(trial: dict, spec: ModelSpec, world: int) -> Workload:
    """The workload the config renderer needs; the cluster is a placeholder carrying its name."""
    cluster = ClusterSpec(name=str(trial.get("cluster", "local")), gpus_per_node=world, peak_tflops=1.0,
                          memory_gb=1.0, hbm_bandwidth_gbps=1.0, intra_node_bandwidth_gbps=1.0,
                          inter_node_bandwidth_gbps=1.0)
    gb = trial.get("global_batch") or spec.global_batch
    return Workload(spec, cluster, 1, int(gb))


def ds_config(layout: Layout, workload: Workload, precision: str, device: torch.device) -> dict:
    """The rendered DeepSpeed config with the harness's optimizer choices (TUNER_OPTIMIZER, TUNER_LR)."""
    config = render_ds_config(layout, workload, precision=precision)
    if os.environ.get("TUNER_OPTIMIZER", "adam").lower() == "sgd":
        # For proofs of parallelism: the update is linear in the gradient, so a gradient that is
        # wrong by any factor shows in the losses (Adam's normalised first steps would hide it).
        config["optimizer"] = {"type": "SGD", "params": {"lr": 0.1}}
        config["gradient_clipping"] = 0.0
        config["zero_allow_untested_optimizer"] = True
    elif device.type == "cpu" or os.environ.get("TUNER_TORCH_ADAM") == "1":
        config["optimizer"]["params"]["torch_adam"] = True   # FusedAdam is a CUDA kernel DeepSpeed builds at first use
    if os.environ.get("TUNER_LR"):
        config["optimizer"]["params"]["lr"] = float(os.environ["TUNER_LR"])
    return config


@dataclass
class Run:
    """One rank's trial: what it trains, how, and its engine."""
    layout: Layout
    spec: ModelSpec
    workload: Workload
    config: dict
    recompute: str
    par: object          # topology.Parallel
    module: torch.nn.Module
    engine: object       # deepspeed engine


def set_up(trial: dict, device: torch.device, precision: str) -> Run:
    """Check the trial, build the process groups, the model and the DeepSpeed engine."""
    import deepspeed
    import torch.distributed as dist

    from tuner.runners.harness import model as gpt, topology

    layout = Layout.from_dict(trial["layout"])
    spec = ModelSpec.from_dict(trial["model"], "trial.json model")
    refusal = layout_refusal(layout, spec.num_layers, trial.get("precision", "bf16"), model=spec) or model_refusal(spec)
    if refusal:
        raise ValueError(refusal)
    workload = workload_of(trial, spec, dist.get_world_size())
    config = ds_config(layout, workload, precision, device)
    par = topology.build(layout.tp, layout.pp, layout.dp, gpt.sequence_parallel_of(layout),
                         ep=layout.expert_parallel, etp=layout.expert_tensor_parallel, experts=spec.is_moe)
    if spec.is_moe:
        from tuner.runners.harness.moe import AuxLossAutoScaler, aux_loss_coeff
        if precision == "fp16" and aux_loss_coeff() > 0:
            raise ValueError("the MoE load-balancing loss's gradient skips fp16 loss scaling: use TUNER_DTYPE "
                             "bf16 or fp32, or TUNER_MOE_AUX_LOSS_COEFF=0")
        AuxLossAutoScaler.scale = 1.0 / config["gradient_accumulation_steps"]   # as DeepSpeed scales the LM loss
    if os.environ.get("TUNER_MEMORY_LIMIT_GB"):
        cap_memory(float(os.environ["TUNER_MEMORY_LIMIT_GB"]))
    recompute = gpt.recompute_mode(layout)
    module = gpt.build_model(spec, _env_int("TUNER_SEED", 1234), recompute)
    engine, _, _, _ = deepspeed.initialize(model=module, config=config,
                                           mpu=None if layout.pp > 1 else par.grid,
                                           model_parameters=[p for p in module.parameters() if p.requires_grad])
    return Run(layout, spec, workload, config, recompute, par, module, engine)


def one_step(run: Run, batches, device: torch.device) -> tuple[float, int]:
    """One iteration over this replica's micro-batches: (the replicas' mean loss, samples this rank fed)."""
    import torch.distributed as dist
    n_samples = 0

    def counted(it):
        nonlocal n_samples
        for tokens, labels in it:
            n_samples += tokens.shape[0]
            yield tokens, labels

    if run.layout.pp > 1:
        return float(run.engine.train_batch(data_iter=counted(batches))), n_samples
    total, count = 0.0, 0
    for tokens, labels in counted(batches):
        micro_loss = run.engine(tokens, labels)
        run.engine.backward(micro_loss)
        run.engine.step()
        total, count = total + float(micro_loss.detach()), count + 1
    t = torch.tensor([total / count], dtype=torch.float64, device=device)
    if run.layout.dp > 1:
        dist.all_reduce(t, group=run.par.dp_group)
    return float(t) / run.layout.dp, n_samples


def train(trial: dict, device: torch.device, precision: str, progress: Path, t_start: float) -> dict:
    import torch.distributed as dist

    warmup, steps = _env_int("TUNER_WARMUP_STEPS", 1), _env_int("TUNER_STEPS", 3)
    counter = CpuAllocated()                  # a CPU rank's tensor bytes, set-up and first step (allocated.py), which
    if device.type == "cpu" and warmup and os.environ.get("TUNER_CPU_ALLOCATED", "1") != "0":   # is never timed
        counter.start()
    run = set_up(trial, device, precision)
    layout, spec, world = run.layout, run.spec, dist.get_world_size()
    seed = _env_int("TUNER_SEED", 1234)
    counts_samples = run.par.first_stage and run.par.tp_rank == 0
    losses, grad_norms, step_times, samples, startup_s, t_timed = [], [], [], 0, None, time.perf_counter()
    cpu_peak_gb = None

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier()

    sync()
    for step in range(warmup + steps):
        if step == warmup:
            sync()
            t_timed = time.perf_counter()
        t0 = time.perf_counter()
        batches = micro_batches(step, layout, run.par, spec, run.workload.global_batch, seed, device)
        loss, n_samples = one_step(run, batches, device)
        dt = time.perf_counter() - t0
        cpu_peak_gb = counter.stop_gb() if step == 0 else cpu_peak_gb
        norm = run.engine.get_global_grad_norm()
        losses.append(loss)
        grad_norms.append(None if norm is None else float(norm))
        step_times.append(dt)
        startup_s = time.time() - t_start if startup_s is None else startup_s
        if step >= warmup and counts_samples:
            samples += n_samples
        if dist.get_rank() == 0:
            step_samples = n_samples * layout.dp   # rank 0 counts its replica's real samples
            with open(progress, "a") as f:
                f.write(json.dumps({"step": step + 1, "warmup": step < warmup, "loss": loss, "step_time": dt,
                                    "elapsed": time.time() - t_start, "samples_per_second": step_samples / dt,
                                    "tflops_per_gpu": megatron_flops(spec, step_samples, run.recompute)
                                    / (dt * world * 1e12)}) + "\n")
    sync()
    timed = time.perf_counter() - t_timed
    result = summary(run, samples, timed, device, precision, world, cpu_peak_gb)
    result.update(losses=losses, grad_norms=grad_norms, step_times=step_times, timed_steps=steps,
                  warmup_steps=warmup, startup_s=startup_s)
    peak = peak_tflops(trial)
    if peak:
        result["peak_fraction"] = result["tflops_per_gpu"] / peak
    return result


def summary(run: Run, samples: int, timed: float, device: torch.device, precision: str, world: int,
            cpu_peak_gb: float | None = None) -> dict:
    """The result of the timed steps: samples summed and peak memory maxed over the ranks."""
    import torch.distributed as dist

    from tuner.runners.harness import model as gpt

    stats = torch.tensor([float(samples), peak_memory_gb(device, cpu_peak_gb), peak_reserved_gb(device)
                          if device.type == "cuda" else host_rss_gb()], dtype=torch.float64,
                         device=device)
    summed = stats.clone()
    dist.all_reduce(summed)
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    real_samples, spec = int(summed[0]), run.spec
    return {"status": "ok",
            "tflops_per_gpu": megatron_flops(spec, real_samples, run.recompute) / (timed * world * 1e12),
            "model_tflops_per_gpu": megatron_flops(spec, real_samples, False) / (timed * world * 1e12),
            "samples_per_second": real_samples / timed,
            "tokens_per_second": real_samples * spec.seq_length / timed,
            "peak_memory_gb": float(stats[1]),
            **({"peak_reserved_gb": float(stats[2])} if device.type == "cuda" else {"host_rss_gb": float(stats[2])}),
            **device_used_gb(device),
            "message": "", "samples": real_samples,
            "device": str(device), "precision": precision, "world_size": world,
            "layout": run.layout.as_dict(), "ds_config": run.config, "recompute": run.recompute,
            "sequence_parallel": run.par.sequence_parallel and run.par.tp > 1, "rank0": gpt.activity(run.module)}


def main() -> int:
    t_start = time.time()
    try:
        import psutil
        t_start = psutil.Process().create_time()
    except Exception:
        pass
    trial_dir = Path(os.environ.get("TUNER_TRIAL_DIR") or os.getcwd())
    result_path = Path(os.environ.get("TUNER_RESULT_JSON") or trial_dir / "result.json")
    rank = int(os.environ.get("RANK", "0"))
    on_cuda = torch.cuda.is_available()
    if not on_cuda:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    # A launcher may bind each rank to its own devices (srun --gpu-bind): wrap the local rank.
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local % torch.cuda.device_count()) if on_cuda else torch.device("cpu")
    precision = os.environ.get("TUNER_DTYPE") or ("bf16" if on_cuda else "fp32")
    initialized = False
    try:
        trial = json.loads(Path(os.environ["TUNER_TRIAL_JSON"]).read_text())
        if on_cuda:
            torch.cuda.set_device(device)
        import deepspeed
        import torch.distributed as dist
        deepspeed.init_distributed(dist_backend="nccl" if on_cuda else "gloo", verbose=False,
                                   timeout=timedelta(seconds=_env_int("TUNER_COLLECTIVE_TIMEOUT_S", 600)))
        initialized = True
        result = train(trial, device, precision, trial_dir / "progress.jsonl", t_start)
        if dist.get_rank() == 0:
            write_json(result_path, result)
        code = 0
    except BaseException as exc:   # a trial's failure is a result, never a hang
        if isinstance(exc, KeyboardInterrupt):
            raise
        status = classify(exc)
        message = f"{type(exc).__name__}: {exc}".strip()
        print(f"[rank {rank}] trial {status}: {message}\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        # its device on every result: a failure on CPU cores (a node without CUDA) is not a GPU cluster's
        # (tuner.runners.slurm_results.cpu_run)
        write_json(result_path, {"status": status, "message": message[-2000:], "rank": rank, "device": str(device)},
                   exclusive=True)
        code = 1
    if initialized:
        try:
            import torch.distributed as dist
            if code == 0:
                dist.barrier()
            dist.destroy_process_group()
        except Exception:
            pass
    return code


if __name__ == "__main__":
    sys.exit(main())
