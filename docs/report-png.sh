#!/usr/bin/env bash
# Regenerate docs/report.png: the README's `tuner report` example (a 200-trial simulator study of GPT-175B
# on 64 Frontier nodes), rendered whole by headless chromium at 1200 px wide.
# Usage, from the repository root with tuner installed: bash docs/report-png.sh   (needs Debian's chromium;
# writes only docs/report.png; the study goes to a temporary store).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v chromium >/dev/null || { echo "report-png.sh: chromium is not installed (apt-get install chromium)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
db="sqlite:///$work/tuner.db"
tuner search --model 175b --nodes 64 --budget 200 --searcher random --noise 0.08 --study frontier-175b-64n \
    --db "$db" >"$work/search.log" 2>&1 || { cat "$work/search.log" >&2; exit 1; }
tuner report frontier-175b-64n --out "$work/report" --db "$db" 2>/dev/null
shot() {
    chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$work/profile" \
        --virtual-time-budget=10000 --window-size="1200,$1" "${@:2}" 2>/dev/null
}
# the page's whole height first (a copy of it that writes its height into the DOM), then the screenshot
sed 's|</body>|<script>addEventListener("load", () => document.body.dataset.h = document.documentElement.scrollHeight)</script></body>|' \
    "$work/report/index.html" > "$work/probe.html"
height=$(shot 1000 --dump-dom "file://$work/probe.html" | grep -o 'data-h="[0-9]*"' | grep -o '[0-9]*')
shot "$height" --screenshot="$PWD/docs/report.png" "file://$work/report/index.html"
echo "wrote docs/report.png (1200 x $height)"
