#!/usr/bin/env bash
# /metrics render time before and after a change, measured side by side in one run.
#
# Runs two builds of benches/metrics_render.rs in alternating rounds and prints every round's
# medians and the median of each over the rounds: the base's render (a base without the scrape
# cache encodes everything on every scrape, so that is its per-scrape cost) and the head's cold
# render, render after 1 % of the rows changed, and unchanged re-scrape, in both text formats, at
# 1,000 workloads / 10,000 processes / 8 GPUs (the bench's first part: no per-process series).
# Build each with `cargo bench -p gpushare-agent --bench metrics_render --no-run` in its own
# checkout (cargo prints the executable's path).
#
# Usage: scripts/bench-metrics-ab.sh BASE_BENCH_BIN HEAD_BENCH_BIN [ROUNDS (default 6)]
set -euo pipefail

BASE="${1:?usage: scripts/bench-metrics-ab.sh BASE_BENCH_BIN HEAD_BENCH_BIN [ROUNDS]}"
HEAD="${2:?usage: scripts/bench-metrics-ab.sh BASE_BENCH_BIN HEAD_BENCH_BIN [ROUNDS]}"
ROUNDS="${3:-6}"

# The medians (ms) of one run of a bench binary, one `FORMAT/MODE VALUE` per line, without the
# per-process-series part.
figures() {
  "$1" --bench 2>/dev/null | awk '
    !/process-metrics/ && /^\/metrics \(/ {
      fmt = ($0 ~ /openmetrics/) ? "om" : "prom"
      mode = "render"
      if ($0 ~ /: cold /) mode = "cold"
      else if ($0 ~ /: 1 % of rows changed /) mode = "changed"
      else if ($0 ~ /: unchanged /) mode = "unchanged"
      for (i = 1; i <= NF; i++) if ($i == "median") print fmt "/" mode, $(i + 1)
    }'
}
median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

declare -A all
keys=(prom/render prom/cold prom/changed prom/unchanged om/render om/cold om/changed om/unchanged)
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%5s' round
for k in "${keys[@]}"; do printf ' %13s' "$k"; done
echo "   (ms; render: base, the others: head)"
for r in $(seq 1 "$ROUNDS"); do
  # Alternate which goes first, so neither always runs on a warmer machine.
  if ((r % 2)); then
    out="$(figures "$BASE"; figures "$HEAD")"
  else
    out="$(figures "$HEAD"; figures "$BASE")"
  fi
  printf '%5d' "$r"
  for k in "${keys[@]}"; do
    v="$(awk -v k="$k" '$1 == k { print $2 }' <<<"$out" | head -1)"
    all[$k]+="${v:--} "
    printf ' %13s' "${v:--}"
  done
  echo
done
printf '%5s' median
for k in "${keys[@]}"; do
  printf ' %13s' "$(tr ' ' '\n' <<<"${all[$k]}" | grep -v -e '^$' -e '^-$' | median)"
done
echo
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
