"""Simulated trials are not measurements (issue 24, item 4), re-measured through the CLI a user runs.

Run: python benchmarks/simulated_studies.py [--model 175b] [--budget 8]

In a fresh store, `tuner best --format json` answers for node counts nobody measured and for other frameworks
(96 nodes for megatron-deepspeed, megatron-core and torchtitan; 64 nodes for the two frameworks not simulated
there; 128 for the two not simulated there). Then two simulator studies run (`tuner search --runner sim`:
megatron-deepspeed at 64 nodes, megatron-core at 128), and the same answers are asked again. Printed: how many
answers are byte-identical apart from the evidence's count of simulated trials left out and its note (which
say that they were left out), and any line that differs. No seed: the simulator and `best` are deterministic.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

TUNER = [sys.executable, "-m", "tuner"]
SIMULATED = (("megatron-deepspeed", 64), ("megatron-core", 128))
ASKED = [("megatron-deepspeed", 96), ("megatron-core", 96), ("torchtitan", 96), ("megatron-core", 64),
         ("torchtitan", 64), ("megatron-deepspeed", 128), ("torchtitan", 128)]
EVIDENCE_OF_SIMULATION = ('"simulated_trials"', '"note"')


def tuner(*args: str) -> str:
    return subprocess.run(TUNER + list(args), capture_output=True, text=True, check=True).stdout


def answers(model: str, db: str) -> list[list[str]]:
    """Each asked answer's JSON lines, less the evidence lines that count and name the simulated trials."""
    out = []
    for fw, nodes in ASKED:
        text = tuner("best", "--model", model, "--nodes", str(nodes), "--framework", fw, "--db", db, "--format", "json")
        out.append([ln for ln in text.splitlines() if not ln.strip().startswith(EVIDENCE_OF_SIMULATION)])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="175b")
    ap.add_argument("--budget", type=int, default=8)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = f"sqlite:///{Path(tmp) / 'sim.db'}"
        tuner("db", "upgrade", "--db", db)
        before = answers(a.model, db)
        for fw, nodes in SIMULATED:
            tuner("search", "--model", a.model, "--nodes", str(nodes), "--runner", "sim", "--budget", str(a.budget),
                  "--framework", fw, "--db", db, "--study", f"sim-{fw}-{nodes}")
        after = answers(a.model, db)
        left_out = tuner("best", "--model", a.model, "--nodes", "96", "--db", db, "--format", "json")
    same = sum(b == c for b, c in zip(before, after))
    sims = ", ".join(f"{fw} at {n} nodes" for fw, n in SIMULATED)
    print(f"{a.model}: simulator studies ({sims}; budget {a.budget} each), then `tuner best` for unmeasured node "
          f"counts and other frameworks: {same} of {len(ASKED)} answers identical (layout, speed, interval, memory, "
          f"p_fit, basis), apart from the evidence's count of simulated trials left out")
    print("  " + next((ln.strip() for ln in left_out.splitlines() if '"simulated_trials"' in ln), "no count printed"))
    for (fw, nodes), b, c in zip(ASKED, before, after):
        if b != c:
            diff = [f"- {x}" for x in b if x not in c][:5] + [f"+ {x}" for x in c if x not in b][:5]
            print(f"  DIFFERS: {fw} at {nodes} nodes\n    " + "\n    ".join(diff))


if __name__ == "__main__":
    main()
