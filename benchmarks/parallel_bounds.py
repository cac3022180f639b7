"""What model parallelism's communication could account for on Blackwell: the in-split dense rows by parallel dimension
(in_split_rows.py --split) under one candidate at a time (issue 26). A diagnostic: nothing here is part of the model,
no constant is chosen from it, and held-out rows are dropped before any row is predicted (in_split_rows.in_split).

Run: python benchmarks/parallel_bounds.py   (deterministic, a few CPU seconds; no seed)

Candidates (each with what the model charges today, tuner/perfmodel):
  tp-cost   Transformer Engine's userbuffers TP overlap's own cost on a GEMM curve measured without it, on B300 /
            GB300 too: each GEMM chunked and beside communication kernels that hold SMs, as Megatron-Bridge's B200
            settings give them (USERBUFFERS; the 405B recipes of B200, GB200, B300 and GB300 all take these, NVFP4
            runs turn the overlap off), out of the machine's SMs (148 where a file states none). The model charges it
            on b200 / gb200 (tp_overlap_gemm_cost with sm_count, tuner.perfmodel.tp_overlap.gemm_cost_seconds) since
            issue 26's twelfth session; this candidate adds it where the model does not (B300 / GB300, no sm_count).
  nvlink    every NVLink group of B200 / GB200 at the all_reduce bus bandwidth one GB200 tray measured (663 GB/s of
            900 at 8 GB, NVLINK_TRAY_EFFICIENCY) where the files charge network_efficiency 0.8 (720): a bound, since
            groups across trays measured more (856-896 GB/s on 2 trays with NVLink SHARP, the same README).
  tp-off    a bound: every TP collective shown (no overlap credited).
  cp-off    a bound: the context-parallel ring hidden under no attention.
  p2p-off   a bound: pipeline p2p not overlapped with the compute of other chunks (Megatron-Core's overlap_p2p_comm).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import h100_gap  # noqa: E402  (Transformer Engine's TP-overlap account)
import in_split_rows  # noqa: E402
from in_split_rows import patched  # noqa: E402  (a candidate's account in place of the model's)
from tuner.perfmodel import comm, compute, stages, tp_overlap  # noqa: E402

#: Megatron-Bridge's TP-overlap settings for B200, which the model charges on b200 / gb200 (tuner.perfmodel.tp_overlap,
#: the files' tp_overlap_gemm_cost); H100's 70B settings are h100_gap.TP_OVERLAP.
USERBUFFERS = tp_overlap.BLACKWELL_USERBUFFERS
SMS = 148                   # ESTIMATE where a file states no sm_count (B300 / GB300): a B200's SMs as CUDA reports them
#: nccl-tests all_reduce_perf on one GB200 tray (4 GPUs, NCCL 2.27), oci-ai-incubations/oci-gpu-quickstarts @ da17d54d
#: nvidia/GB200/README-GB200.md lines 180-202: busbw 657.3 GB/s at 4 GB, 663.3 at 8 GB = 0.737 of NVLink 5's 900.
NVLINK_TRAY_EFFICIENCY = 663.3 / 900.0
MACHINES = ("b200", "gb200", "b300", "gb300")


def tp_cost_seconds(model, cluster, shape: compute.Shape) -> float:
    """A dense layer's GEMM seconds per micro-batch under USERBUFFERS: h100_gap.tp_overlap_seconds' account with these
    settings, out of the machine's SMs (its file's sm_count; SMS where it states none)."""
    return h100_gap.tp_overlap_seconds(model, cluster, shape, USERBUFFERS, cluster.sm_count or SMS)


def candidate(name: str):
    """The context in which `name`'s account replaces the model's (CANDIDATES)."""
    if name == "tp-cost":
        layer_times = compute.layer_times

        def times(model, cl, shape):
            out = layer_times(model, cl, shape)
            if (shape.sp and shape.t > 1 and cl.name in MACHINES and cl.software == "cuda"
                    and not (cl.tp_overlap_gemm_cost and cl.sm_count)):     # the model charges it there itself
                out = {**out, "gemm": tp_cost_seconds(model, cl, shape)}
            return out
        return patched(compute, "layer_times", times)
    if name == "nvlink":
        def bw(cluster, gbps):
            tray = gbps == cluster.intra_node_bandwidth_gbps and cluster.name in ("b200", "gb200")
            return gbps * comm.GB * (NVLINK_TRAY_EFFICIENCY if tray else cluster.network_efficiency)
        return patched(comm, "_bw_bytes", bw)
    if name == "tp-off":
        return patched(tp_overlap, "exposed_seconds", lambda *a, **k: math.inf)
    if name == "cp-off":
        layer_comm = stages.layer_comm
        return patched(stages, "layer_comm", lambda layout, w, sh, attention_s: layer_comm(layout, w, sh, 0.0))
    if name == "p2p-off":
        overlaps_of = stages.overlaps_of
        return patched(stages, "overlaps_of", lambda w, ex: frozenset(overlaps_of(w, ex)) - {"p2p"})
    raise ValueError(name)


CANDIDATES = ("tp-cost", "nvlink", "tp-off", "cp-off", "p2p-off")


def main() -> None:
    rows = in_split_rows.in_split(MACHINES)
    for name in (None, *CANDIDATES):
        print(f"\n######## {name or 'the model as it stands'}")
        with (candidate(name) if name else patched(sys, "argv", sys.argv)):
            done = [(r, e) for r in rows if (e := in_split_rows.evaluate(r)) is not None]
        in_split_rows.split(done)


if __name__ == "__main__":
    if sys.argv[1:]:
        print("usage: python benchmarks/parallel_bounds.py   (no arguments)", file=sys.stderr)
        sys.exit(2)
    main()
