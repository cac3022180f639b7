"""Real DeepSpeed trials on CPU ranks, their tensors' allocated peak against tuner's memory account -- no GPU needed.

    python benchmarks/harness_cpu_memory.py run --out DIR [--set first|second] [--trial-timeout 300]
runs LAYOUTS of the `small` preset (6.9 M parameters; --set second: SECOND, of llama3-tiny) in bf16 on 1-2 CPU
ranks through the harness, as the local runner launches a trial (torchrun, the command-runner protocol's trial.json
and TUNER_* variables; harness_gpu.launch), and appends each result to DIR/harness_cpu.jsonl. A CPU rank's
peak_memory_gb is its tensors' allocated peak (tuner/runners/harness/allocated.py), what max_memory_allocated is on a
GPU: DeepSpeed's engine, ZeRO optimizers and pipeline engine allocate the same tensors on CPU as on a GPU, so the rows
test the account's DeepSpeed terms at dp > 1 and pp > 1, which one GPU (harness_gpu.py) cannot. What differs from a
GPU run: PyTorch's Adam, not FusedAdam (at ZeRO 0 DeepSpeed then wraps it otherwise: the ZeRO-0 rows do not test
step_copy_bytes), and no caching allocator.
    python benchmarks/harness_cpu_memory.py compare [FILE ...]    (default: data/harness_measured_cpu.jsonl; the second
    set, held out of the bucket's choice: data/harness_measured_cpu_second.jsonl)
prints each row's allocated peak against the prediction less the `local` cluster's reserve (its ratio and the
excess in GB). Rows are measurements only; nothing here is chosen on them. What saw which rows: the first set led to
DeepSpeed's gradient-reduction bucket in the account (10765a5; its bytes are DeepSpeed's code, no constant fitted),
reverted (docs/issue30.md round 27); the second was measured after that change and committed before it was
compared.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from harness_gpu import launch, machine, run_or_compare  # noqa: E402
from tuner.layout import Layout  # noqa: E402
from tuner.perfmodel import predict  # noqa: E402
from tuner.specs import Workload, load_cluster, load_model  # noqa: E402
from tuner.trial import TrialSpec  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "harness_measured_cpu.jsonl"
FRAMEWORK = "megatron-deepspeed"      # the harness: Megatron-style layers on DeepSpeed's engine
# (tp, pp, dp, micro-batch, ZeRO stage, recompute): every ZeRO stage at dp 1 and 2, tp 2, pp 2 at ZeRO 0 and 1.
LAYOUTS = [
    (1, 1, 2, 2, 0, "none"), (1, 1, 2, 2, 1, "none"), (1, 1, 2, 2, 2, "none"), (1, 1, 2, 2, 3, "none"),
    (1, 1, 1, 2, 0, "none"), (1, 1, 1, 2, 1, "none"), (1, 1, 1, 2, 2, "full"), (1, 1, 2, 4, 1, "full"),
    (2, 1, 1, 2, 0, "none"), (2, 1, 1, 2, 1, "none"), (1, 2, 1, 2, 0, "none"), (1, 2, 1, 2, 1, "none"),
]
# The second set, measured after DeepSpeed's bucket entered the account (10765a5) and committed before it was compared:
# Llama 3's architecture (GQA, SwiGLU, RoPE, RMSNorm, an untied head), other micro-batches and recompute modes.
SECOND = [
    (1, 1, 2, 1, 1, "selective"), (1, 1, 2, 4, 2, "none"), (1, 1, 2, 2, 3, "full"), (2, 1, 1, 2, 2, "none"),
    (1, 2, 1, 1, 1, "full"), (1, 2, 1, 4, 0, "selective"), (2, 1, 1, 4, 3, "selective"), (1, 1, 1, 4, 1, "none"),
]
SETS = {"first": ("small", 8, LAYOUTS), "second": ("llama3-tiny", 16, SECOND)}


def workload_of(model: str, global_batch: int, gpus: int) -> Workload:
    """The row's workload: the `local` cluster as one node of the trial's ranks."""
    one_node = dataclasses.replace(load_cluster("local"), gpus_per_node=gpus)
    return Workload(load_model(model), one_node, 1, global_batch, framework=FRAMEWORK)


def layout_of(t: tuple) -> Layout:
    tp, pp, dp, mb, zero, rc = t
    return Layout(tp=tp, pp=pp, dp=dp, micro_batch=mb, zero_stage=zero, recompute=rc, sequence_parallel=tp > 1)


def run_one(model: str, global_batch: int, t: tuple, number: int, base: Path, timeout: float) -> dict:
    lay = layout_of(t)
    w = workload_of(model, global_batch, lay.gpus)
    d = base / f"{number:02d}-{lay.key()}"
    d.mkdir(parents=True)
    spec = TrialSpec("harness-cpu", number, lay, w, d)
    (d / "trial.json").write_text(json.dumps(spec.as_json(), indent=2))
    env = {**os.environ, **spec.env(d / "result.json"), "TUNER_WARMUP_STEPS": "1", "TUNER_STEPS": "1",
           "TUNER_DTYPE": "bf16", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT),
           "CUDA_VISIBLE_DEVICES": "", "DS_ACCELERATOR": "cpu"}     # CPU ranks on a GPU machine too, as local.py
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(lay.gpus),
            "-m", "tuner.runners.harness.train"]
    t0 = time.time()
    tail, code = launch(argv, env, d, timeout)
    res = d / "result.json"
    result = json.loads(res.read_text()) if res.exists() else {"status": "failed", "message": tail}
    for k in ("ds_config", "layout", "losses", "grad_norms", "step_times", "rank0"):
        result.pop(k, None)
    return {"model": model, "global_batch": global_batch, "layout": lay.as_dict(), "key": lay.key(),
            "wall_s": round(time.time() - t0, 1), "exit": code, **result}


def cmd_run(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dest, info, base = out / "harness_cpu.jsonl", machine(), Path(tempfile.mkdtemp(prefix="harness-cpu-"))
    model, global_batch, layouts = SETS[args.set]
    for i, t in enumerate(layouts):
        row = {**run_one(model, global_batch, t, i, base, args.trial_timeout), "machine": info,
               "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        with open(dest, "a") as f:
            f.write(json.dumps(row, default=str) + "\n")
        print(f"{i:2d} {row['key']:32s} {row.get('status')} {row['wall_s']} s allocated {row.get('peak_memory_gb')} "
              f"resident {row.get('host_rss_gb')}", flush=True)
    return 0


def cmd_compare(args) -> int:
    rows = [json.loads(x) for f in (args.files or [DATA]) for x in Path(f).read_text().splitlines() if x]
    ok = [r for r in rows if r.get("status") == "ok"]
    print(f"{len(rows)} rows, {len(ok)} ok (bf16, DeepSpeed {rows[0]['machine'].get('deepspeed')})")
    print(f"{'model':12s} {'layout':32s} {'allocated GB':>12s} {'pred less reserve':>17s} {'ratio':>7s} "
          f"{'excess GB':>9s} {'resident GB':>11s}")
    logs = []
    for r in ok:
        lay = Layout.from_dict(r["layout"])
        w = workload_of(r["model"], r["global_batch"], lay.gpus)
        want = predict(lay, w).memory_gb - w.cluster.memory_reserved_gb
        logs.append(math.log(r["peak_memory_gb"] / want))
        print(f"{r['model']:12s} {r['key']:32s} {r['peak_memory_gb']:12.4f} {want:17.4f} "
              f"{r['peak_memory_gb'] / want:7.3f} {r['peak_memory_gb'] - want:9.4f} "
              f"{r.get('host_rss_gb', math.nan):11.4f}")
    if logs:
        print(f"allocated / predicted less the reserve: median |log| {statistics.median(map(abs, logs)):.3f}, "
              f"worst {max(map(abs, logs)):.3f} on {len(logs)} rows")
    return 0


def main(argv=None) -> int:
    return run_or_compare(argv, __doc__, SETS, 300.0, cmd_run, cmd_compare)


if __name__ == "__main__":
    sys.exit(main())
