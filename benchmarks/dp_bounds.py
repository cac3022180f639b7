"""What data-parallel traffic at scale could account for on Blackwell: the in-split rows of B200 / GB200 (and B300 /
GB300 beside them) under one candidate at a time (issue 26). A diagnostic: nothing here is part of the model, no
constant is chosen from it, and held-out rows are dropped before any row is predicted (in_split_rows.in_split).

Run: python benchmarks/dp_bounds.py [--busbw]   (deterministic, a few CPU seconds; no seed)

Prints, per candidate, the median signed error of the MLPerf Llama 3.1 8B rows (each row), of the data-parallel-only
dense rows and of every in-split row, by machine. --busbw prints the bus bandwidth the model gives a ring
reduce-scatter on 8-GPU H100 nodes (h100.toml) by node count, beside NVIDIA/nccl#1229's measured figures.

Candidates (what the model charges today: tuner/perfmodel/__init__.py _gradient_sync, comm.dp_time; since issue 26's
sm_count in b200.toml / gb200.toml, the SMs NCCL's kernels hold while the collectives hide, comm.sm_share, at
comm.NCCL_CTAS = 16, as on the Hopper files):
  no-sm     B200 and GB200 without sm_count: no SM share charged (the model before).
  sm8       the share at 8 CTAs: what NVIDIA's MLPerf v5.1 Llama 3.1 8B configs give the dp / dp_cp communicators
            (conf/nccl/custom_communicator_cta.yaml max_ctas 8; NCCL_MIN_CTAS=16 for the others).
  buckets   Megatron-Core's buckets at the bucket_size each MLPerf Training v5.1 Llama 3.1 8B row's config set
            (MLPERF_BUCKETS: the rows whose config chain was read) where the model takes the default max(40M, 1M x dp x
            cp): more or fewer buckets, each paying NCCL's ring latency (bucket_latency). Other rows as they stand.
            Since issue 26's fifteenth session the rows carry it (ran_bucket_size -> Workload.ddp_bucket_size, which
            wins over the default): the candidate now moves only a workload that states none.
  dp-off    a bound: the gradient reduce-scatter and the parameter all-gather hidden under no compute.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import in_split_rows  # noqa: E402
from in_split_rows import patched  # noqa: E402  (a candidate's account in place of the model's)
import reading  # noqa: E402
import tuner.perfmodel as perfmodel  # noqa: E402
from tuner.perfmodel import buckets, comm  # noqa: E402

MACHINES = ("b200", "gb200", "b300", "gb300")
#: bucket_size (elements) of the MLPerf Training v5.1 Llama 3.1 8B configs (mlcommons/training_results_v5.1 @ 441d65f4):
#: NVIDIA's, Dell's and Nebius's config_common_8b.sh export BUCKET_SIZE=768000000; University-of-Florida's copy (under
#: llama31_405b/implementations/b200_nemo) sets none, so conf/custom.yaml's default 134217728 holds. Keyed by the
#: submitter's directory as a row's `source` names it.
MLPERF_BUCKETS = {"training_results_v5.1 NVIDIA/": 768_000_000.0, "training_results_v5.1 Dell/": 768_000_000.0,
                  "training_results_v5.1 Nebius/": 768_000_000.0,
                  "training_results_v5.1 University-of-Florida/": 134_217_728.0}
CANDIDATES = ("no-sm", "sm8", "buckets", "dp-off")
#: coreweave/nccl-tests @ cb86553 README.md 'Expected Performance', GB200, NCCL 2.26.2: all_reduce_perf bus bandwidth,
#: GB/s, at 0.5 / 1 / 2 / 4 / 8 / 16 GB on one NVL72 rack (72 GPUs; no 16 GB row), 2 racks (144) and 20 racks (1,440).
COREWEAVE_GB200 = {1: (586, 681, 758, 839, 835, None), 2: (494, 596, 680, 743, 793, 810),
                   20: (151, 219, 287, 346, 381, 406)}
#: NVIDIA/nccl#1229 (H100, 8 GPUs a node): reduce-scatter bus bandwidth, GB/s, at 4 / 8 / 16 / 32 / 64 / 128 nodes
#: ("Linear decline, just like 360,345,320,300,280,260"; message size not stated).
NCCL_1229 = {4: 360, 8: 345, 16: 320, 32: 300, 64: 280, 128: 260}


def _no_sm(name):
    c = _LOAD(name)
    return dataclasses.replace(c, sm_count=None) if c.name in ("b200", "gb200") else c


_LOAD = reading.load_cluster


def _no_dp(workload, exchange):
    return frozenset(_OVERLAPS(workload, exchange)) - {"dp"}


_OVERLAPS = perfmodel.overlaps_of


def bucket_as_ran(row: dict) -> float | None:
    """The bucket size a row's MLPerf config set (MLPERF_BUCKETS), None where it was not read."""
    if row.get("model") != "llama3-8b":
        return None
    return next((v for k, v in MLPERF_BUCKETS.items() if f"{k}" in row.get("source", "")), None)


def candidate(stack: ExitStack, name: str, row: dict | None = None) -> None:
    if name == "no-sm":
        stack.enter_context(patched(reading, "load_cluster", _no_sm))
    elif name == "sm8":
        stack.enter_context(patched(comm, "NCCL_CTAS", 8))
    elif name == "buckets" and row is not None and (size := bucket_as_ran(row)):
        stack.enter_context(patched(buckets, "default_bucket_size", lambda dp: size))
    elif name == "dp-off":
        stack.enter_context(patched(perfmodel, "overlaps_of", _no_dp))


def report(done: list) -> None:
    mlperf = [(r, e) for r, e in done if r["model"] == "llama3-8b" and "MLPerf" in r["release"]]
    for r, e in sorted(mlperf, key=lambda x: (x[0]["cluster"], x[0]["gpus"])):
        print(f"  {r['cluster']:6s} 8B MLPerf {r['precision']:5s} {r['gpus']:4d} {e['layout'][:36]:36s} "
              f"{100 * e['error']:+6.1f} %")
    for fam in (("b200", "gb200"), ("b300", "gb300")):
        dense = [e["error"] for r, e in done if r["cluster"] in fam and r.get("ep", 1) == 1
                 and r["tp"] == r["cp"] == r.get("ran_pp", r["pp"]) == 1
                 and not any(w in " ".join(r["releases"]) for w in ("torchtitan", "torchao"))]
        if dense:
            print(f"  {' + '.join(fam):14s} data-parallel-only dense rows {len(dense):3d}  "
                  f"{100 * statistics.median(dense):+6.1f} %")
    for fam in MACHINES:
        errs = [e["error"] for r, e in done if r["cluster"] == fam]
        if errs:
            print(f"  {fam:6s} every in-split row {len(errs):3d}  {100 * statistics.median(errs):+6.1f} %")


def busbw() -> None:
    """The model's ring reduce-scatter bus bandwidth on h100.toml by node count (comm.dp_time's charge: the NIC-bound
    ring at network_efficiency plus latency_us a step), beside nccl#1229's measurement."""
    cl = reading.load_cluster("h100")
    print("\n== ring reduce-scatter bus bandwidth, 8-GPU H100 nodes (GB/s), the model as one collective "
          "(comm.reduce_scatter_time) | as a later bucket (its bandwidth term + comm.nccl_ring_latency), at 256 MB / "
          "1 GB / 8 GB | nccl#1229")
    for nodes, measured in NCCL_1229.items():
        g = 8 * nodes
        bw = comm.group_bandwidth(cl, g, 1)
        one, later = [], []
        for n in (256e6, 1e9, 8e9):
            moved = (g - 1) / g * n
            one.append(moved / comm.reduce_scatter_time(n, g, bw, cl) / 1e9)
            later.append(moved / (moved / (bw * 1e9 * cl.network_efficiency) + comm.nccl_ring_latency(g, nodes)) / 1e9)
        print(f"  {nodes:4d} nodes  " + " ".join(f"{f:4.0f}" for f in one) + "  | "
              + " ".join(f"{f:4.0f}" for f in later) + f"  | {measured}")


def busbw_gb200() -> None:
    """The model's ring all-reduce bus bandwidth on gb200.toml by racks (comm.allreduce_time over the group's
    comm.group_bandwidth, one collective), beside CoreWeave's measured all_reduce_perf."""
    cl = reading.load_cluster("gb200")
    print("\n== all-reduce bus bandwidth, GB200 NVL72 racks (GB/s), the model as one collective at 0.5 / 1 / 2 / 4 / 8 / 16 GB"
          " | coreweave/nccl-tests")
    for racks, measured in COREWEAVE_GB200.items():
        g = 72 * racks
        bw = comm.group_bandwidth(cl, g, 1)
        model = [2 * (g - 1) / g * n / comm.allreduce_time(n, g, bw, cl) / 1e9 for n in (0.5, 1, 2, 4, 8, 16)
                 for n in [n * 2 ** 30]]
        print(f"  {racks:3d} racks  " + " ".join(f"{f:4.0f}" for f in model) + "  | "
              + " ".join("   -" if f is None else f"{f:4d}" for f in measured))


def main(argv: list[str]) -> None:
    rows = in_split_rows.in_split(MACHINES)
    for name in (None, *CANDIDATES):
        print(f"\n######## {name or 'the model as it stands'}")
        done = []
        for r in rows:
            with ExitStack() as stack:
                candidate(stack, name, r)
                e = in_split_rows.evaluate(r)
            if e is not None:
                done.append((r, e))
        report(done)
    if "--busbw" in argv:
        busbw()
        busbw_gb200()


if __name__ == "__main__":
    if any(a not in ("--busbw",) for a in sys.argv[1:]):
        print("usage: python benchmarks/dp_bounds.py [--busbw]", file=sys.stderr)
        sys.exit(2)
    main(sys.argv[1:])
