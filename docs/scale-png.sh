#!/usr/bin/env bash
# Regenerate docs/scale-time.png and docs/scale-pareto.png: two figures of the README's `tuner scale` example
# (GPT-3 175B on Frontier and on H100, 16 to 512 nodes, 300B tokens), as `--out` writes them.
# Usage, from the repository root with tuner installed: bash docs/scale-png.sh   (writes only those two files;
# reads no store: the model's predictions alone).
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
TUNER_DB="sqlite:///$work/none.db" tuner scale --model 175b --cluster frontier,h100 --nodes 16:512 --tokens 3e11 \
    --price frontier=1.8,h100=2.5 --deadline 30 --out "$work/scale" >"$work/scale.log" 2>&1 \
    || { cat "$work/scale.log" >&2; exit 1; }
cp "$work/scale/time_vs_nodes.png" docs/scale-time.png
cp "$work/scale/pareto.png" docs/scale-pareto.png
echo "wrote docs/scale-time.png and docs/scale-pareto.png"
