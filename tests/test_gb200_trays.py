"""D. Baisya's torchtitan runs on 8 GB200 (benchmarks/data/hardware_published.toml, issue 26): the post does not say
whether its two 4-GPU trays share one NVLink domain, so the rows keep gb200.toml's NVL72 domain. Whatever the answer, no
tensor- or context-parallel group of any of its layouts leaves a tray (torchtitan's mesh (pp, batch, cp, tp), tp
innermost, tp x cp <= 4): the question moves only the FSDP collectives and the pipeline boundary that cross trays."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import published  # noqa: E402
import reading  # noqa: E402
from tuner.perfmodel import comm, predict  # noqa: E402


def _baisya() -> list[dict]:
    rows = [r for r in published.hardware() if any("daddyofadoggy/blog" in s for s in r["sources"])]
    assert len(rows) == 15 and sum(r["measurements"] for r in rows) == 17
    return rows


def test_tp_and_cp_stay_inside_a_tray_whatever_the_nvlink_domain():
    moved = 0
    for r in _baisya():
        assert "machine" not in r and r["cluster"] == "gb200", r["note"][:60]
        lay, w = reading.layout_of(r), reading.workload_of(r)
        assert lay.tp * lay.context_parallel <= w.cluster.gpus_per_node
        trays = dataclasses.replace(w, cluster=dataclasses.replace(w.cluster, scale_up_domain_gpus=w.cluster.gpus_per_node))
        groups = ((lay.tp, 1), (lay.context_parallel, lay.tp))      # TP, then CP tp apart (tuner's RANK_ORDER)
        assert all(comm.group_bandwidth(w.cluster, n, k) == comm.group_bandwidth(trays.cluster, n, k)
                   == w.cluster.intra_node_bandwidth_gbps for n, k in groups if n > 1), lay.key()
        rack, apart = predict(lay, w).time_breakdown, predict(lay, trays).time_breakdown
        assert rack.get("tp_comm", 0.0) == apart.get("tp_comm", 0.0), lay.key()
        moved += rack != apart
    assert moved == 15     # every row has FSDP or pipeline traffic between the trays, which the domain does move
