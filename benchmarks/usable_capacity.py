"""What a GPU's memory_gb means against the model's bytes, and the p_fit figures if it meant the bytes a run can use
(issue 24). Nothing here changes the model: it prints, and runs a benchmark under the other reading.

Run: python benchmarks/usable_capacity.py                   the presets' memory_gb against the usable bytes
     python benchmarks/usable_capacity.py BENCHMARK [ARGS]  BENCHMARK (e.g. benchmarks/hardware_accuracy.py) with every
                                                            GPU cluster's memory_gb read as USABLE_GB (deterministic)

tuner predicts a peak in GB of 1e9 bytes (tensors' bytes / 1e9 plus the cluster's fixed reserve) and compares it with
the cluster file's memory_gb, the vendor's figure: "80 GB" for an H100 or A100, "180 GB" for a B200. Those figures are
binary: an H100 80GB holds 81,559 MiB by nvidia-smi (85.52 GB) and an A100 80GB 81,920 MiB (modal-labs/modal-client
#2797, the nvidia-smi totals of its fleet), and what a process can allocate -- the total capacity PyTorch's CUDA
out-of-memory message states, cudaMemGetInfo's total -- is just under the nameplate in GiB (TOTAL_CAPACITY_GIB, each
with its source). The model's 80 GB is then 5 GB (6 %) short of the 84.9 GB an H100 run can allocate, while its
reserve (3 GB: context, NCCL buffers, workspaces) is already charged inside the prediction.

USABLE_GB reads a preset's memory_gb as GiB times the stated fraction of its own GPU where a source states one, else
the smallest fraction of any GPU below (marked ESTIMATE). The local CPU clusters keep theirs.
"""

from __future__ import annotations

import dataclasses
import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from tuner.cluster_spec import ClusterSpec  # noqa: E402
from tuner.presets import presets  # noqa: E402
from tuner.specs import load_cluster  # noqa: E402

GIB = 2 ** 30 / 1e9
#: nameplate GB -> (the total capacity a PyTorch process sees, GiB; where it is printed)
TOTAL_CAPACITY_GIB = {
    ("h100", 80.0): (79.11, "vllm-project/vllm #27508: 'GPU 0 has a total capacity of 79.11 GiB' (H100 80GB)"),
    ("a100", 80.0): (79.15, "benchmarks/data/allocator_published.toml: SpeechGPT #49 and PRO OOM messages, A100 80GB"),
    ("a100", 40.0): (39.39, "benchmarks/data/allocator_published.toml: OpenChat OOM message, A100 40GB (pico-train 39.56)"),
    ("gh200", 96.0): (94.88, "benchmarks/data/allocator_published.toml: LitGPT OOM message, GH200 (no preset)"),
    ("b200", 180.0): (178.35, "pytorch/ao #4002: cudaDeviceProp total global memory 178.35 of a B200 (nvidia-smi "
                              "183,359 MiB, NVIDIA/TensorRT-LLM #10278)"),
}
LOCAL = ("local", "local-slurm")
#: the smallest stated fraction, for the presets whose GPU no source above states
LEAST = min(cap / nameplate for (_, nameplate), (cap, _) in TOTAL_CAPACITY_GIB.items())


def usable_gb(cluster) -> tuple[float, str]:
    """(the bytes a run on this cluster's GPU can allocate, GB of 1e9; where that comes from)."""
    for (gpu, nameplate), (cap, source) in TOTAL_CAPACITY_GIB.items():
        if cluster.name.startswith(gpu) and cluster.memory_gb == nameplate:
            return cap * GIB, source
    return cluster.memory_gb * GIB * LEAST, f"ESTIMATE: {cluster.memory_gb:g} GiB x {LEAST:.4f}"


def table() -> None:
    print(f"{'cluster':14s} {'memory_gb':>9s} {'usable GB':>9s}  source")
    for name in presets("clusters"):
        c = load_cluster(name)
        if c.name in LOCAL:
            continue
        gb, source = usable_gb(c)
        print(f"{c.name:14s} {c.memory_gb:9.1f} {gb:9.2f}  {source}")


def run_under_usable(script: str, args: list[str]) -> None:
    """Runs `script` with every GPU cluster's memory_gb read as usable_gb (ClusterSpec.from_dict: every reader)."""
    original = ClusterSpec.__dict__["from_dict"].__func__

    def read(cls, d, *a, **k):
        c = original(cls, d, *a, **k)
        return c if c.name in LOCAL else dataclasses.replace(c, memory_gb=usable_gb(c)[0])

    ClusterSpec.from_dict = classmethod(read)
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    if len(sys.argv) > 1 and not Path(sys.argv[1]).is_file():
        print(f"usage: python benchmarks/usable_capacity.py [BENCHMARK [ARGS]]: no file {sys.argv[1]!r} "
              "(e.g. benchmarks/hardware_accuracy.py)", file=sys.stderr)
        sys.exit(2)
    if len(sys.argv) > 1:
        run_under_usable(sys.argv[1], sys.argv[2:])
    else:
        table()
