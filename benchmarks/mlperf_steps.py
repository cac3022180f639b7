"""MLPerf Training v5.1's Llama 3.1 8B runs read twice from their own result logs: the training step and the
validation step (the forward pass alone, same layout and global batch, no optimizer, no gradient sync), against
tuner's forward pass and its train / forward ratio. What a step pays beyond its forward and backward shows as
`extra` = train - ratio x validation, measured, with no model term in it but the ratio.

    python benchmarks/mlperf_steps.py DIR

DIR: a clone of github.com/mlcommons/training_results_v5.1 (a work tree, or its git directory: files are read
with `git show HEAD:PATH` where DIR has no work tree). The rows are benchmarks/data/hardware_published.toml's
8B rows from that repository (one per configuration); each row's `source` names its result files. A log line
is mlperf_common's `tracked_stats`: `train_step_time` (per-step, every 32nd step logged) and
`validation_step_time` (every validation step; the first of each validation pass, which pays the pass's set-up,
is left out). Per file the median, per row the median over files (min-max over files printed).

The model's forward of a step: each component of `time_breakdown` (no recompute in these rows) at its forward
share, GEMMs 1 / (1 + 2 x the backward GEMM factor), attention 1 / (1 + FLASH_BACKWARD_FLOPS), element-wise
1 / (1 + BACKWARD_TRAFFIC), as tuner.perfmodel.compute builds them; `ratio` is the model's train / forward.
Nothing is fitted; the script changes no row and no constant.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import reading  # noqa: E402  (one reading of a row: its model, machine, layout)
from tuner.perfmodel import predict  # noqa: E402
from tuner.perfmodel.compute import BACKWARD_TRAFFIC, FLASH_BACKWARD_FLOPS, shape_of  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "hardware_published.toml"
REPO = "training_results_v5.1"


class Logs:
    """The result files of one checkout: a work tree, or a git directory read with `git show`."""

    def __init__(self, root: Path):
        self.root, self.bare = root, not (root / "NVIDIA").is_dir()

    def listing(self, folder: str) -> list[str]:
        if not self.bare:
            return sorted(str(p.relative_to(self.root)) for p in (self.root / folder).glob("result_*.txt"))
        out = subprocess.run(["git", "-C", str(self.root), "ls-tree", "--name-only", "HEAD", folder + "/"],
                             capture_output=True, text=True, check=True).stdout.split()
        return sorted(p for p in out if Path(p).name.startswith("result_"))

    def text(self, path: str) -> str:
        if not self.bare:
            return (self.root / path).read_text()
        return subprocess.run(["git", "-C", str(self.root), "show", f"HEAD:{path}"], capture_output=True, text=True,
                              check=True).stdout


def step_times(text: str) -> tuple[list[float], list[float]]:
    """(training, validation) step seconds of one result file (a validation pass's first step left out)."""
    train, val = [], []
    for line in text.splitlines():
        if "tracked_stats" not in line:
            continue
        rec = json.loads(line.split(":::MLLOG ", 1)[1])
        value, step = rec["value"], rec["metadata"].get("step", 0)
        if "train_step_time" in value and "reduced_train_loss" in value:
            train.append(value["train_step_time"])
        if "validation_step_time" in value and int(step) % 16:     # 16 steps a pass (1,024 samples); 0: set-up
            val.append(value["validation_step_time"])
    return train, val


def model_forward(row: dict) -> tuple[float, float, float]:
    """(the model's step, its forward, its compute) in seconds, for a row without recompute."""
    lay, w = reading.layout_of(row), reading.workload_of(row)
    pr, sh = predict(lay, w), shape_of(lay, w)
    b = pr.time_breakdown
    fwd = (b["gemm"] / (1.0 + 2.0 * sh.backward_gemm) + b["attention"] / (1.0 + FLASH_BACKWARD_FLOPS)
           + b["elementwise"] / (1.0 + BACKWARD_TRAFFIC))
    return pr.step_time_s, fwd, b["gemm"] + b["attention"] + b["elementwise"]


def rows() -> list[dict]:
    with open(DATA, "rb") as f:
        got = [r for r in tomllib.load(f)["row"] if REPO in r["source"] and r["model"] == "llama3-8b"]
    out, keys = [], set()
    for r in got:
        key = (r["cluster"], r["gpus"], r["precision"], r["tp"], r["cp"], r["micro_batch"], r["global_batch"])
        if key not in keys and r.get("recompute", "none") == "none":
            keys.add(key)
            out.append(r)
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: python benchmarks/mlperf_steps.py DIR  (DIR: a clone of mlcommons/training_results_v5.1)",
              file=sys.stderr)
        return 2
    logs = Logs(Path(argv[0]))
    print(f"{'machine':7s} {'gpus':>4s} {'prec':5s} {'layout':16s} {'train':>7s} {'val (min-max)':>22s} "
          f"{'model fwd':>9s} {'val/fwd':>7s} {'ratio':>5s} {'extra':>7s} {'model non-compute':>17s}")
    for r in rows():
        folder = re.search(REPO + r" (\S+)/result_\*\.txt", r["source"])
        files = logs.listing(folder.group(1)) if folder else []
        per_file = [step_times(logs.text(p)) for p in files]
        trains = [statistics.median(t) for t, _ in per_file if t]
        vals = [statistics.median(v) for _, v in per_file if v]
        lay = f"tp{r['tp']} cp{r['cp']} mb{r['micro_batch']} gb{r['global_batch']}"
        if not trains or not vals:
            print(f"{r['cluster']:7s} {r['gpus']:4d} {r['precision']:5s} {lay:16s} no training and validation "
                  f"steps in {len(files)} result file(s)")
            continue
        step, fwd, comp = model_forward(r)
        tr, va = statistics.median(trains), statistics.median(vals)
        ratio = comp / fwd
        print(f"{r['cluster']:7s} {r['gpus']:4d} {r['precision']:5s} {lay:16s} {tr * 1e3:5.1f}ms "
              f"{va * 1e3:5.1f} ({min(vals) * 1e3:5.1f}-{max(vals) * 1e3:5.1f})ms {fwd * 1e3:7.1f}ms "
              f"{va / fwd:6.2f}x {ratio:5.2f} {(tr - ratio * va) * 1e3:5.1f}ms {(step - comp) * 1e3:15.1f}ms")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
