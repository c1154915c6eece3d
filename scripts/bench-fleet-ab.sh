#!/usr/bin/env bash
# The fleet bench (gpushare-agent/benches/fleet.rs) against the agent of BASE_REV and against the
# working tree, side by side in one run: requests per node at a rollout and at rest, bytes
# served, the view latency after a change and after dropped watches, and the Event writes of a
# node whose workloads all turn bad at once.
#
# The base gets the working tree's bench and fake API server (the gpushare-fake-kube crate, a
# dev-dependency of the agent): a base from before issue 43 had neither (the bench keeps to what the
# polling agent had: `kube::api::connect`, `spawn_watcher`, `KubeWatch::current`,
# `kube::events::spawn_poster`). A base from before the crate gets it beside its agent, named in
# the agent's dev-dependencies (a path dependency inside the workspace is a member of it).
# Each side is built in a target directory of its own under target/bench-fleet-ab/ (cargo keys a
# workspace's packages by their path, so two checkouts sharing one would take each other's
# build-script output). No root, no GPU.
#
# Usage: scripts/bench-fleet-ab.sh BASE_REV [NODES (default 50)] [REST_SECS (default 20)]
# The polling agent before the watches is 98b307e. With BENCH_AB_BASE_BIN and BENCH_AB_HEAD_BIN
# set (fleet bench executables already built), nothing is built and BASE_REV only names the base.
set -euo pipefail

BASE="${1:?usage: scripts/bench-fleet-ab.sh BASE_REV [NODES] [REST_SECS]}"
NODES="${2:-50}"
REST="${3:-20}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
T="$ROOT/target/bench-fleet-ab"
WT="$T/base-src"
base_rev="$(git -C "$ROOT" rev-parse --verify "$BASE^{commit}")"

# The bench executable cargo builds in DIR, into the target directory TARGET.
bench_bin() {
  (cd "$1" && CARGO_TARGET_DIR="$2" cargo bench -q -p gpushare-agent --bench fleet --no-run --message-format=json) |
    jq -r 'select(.reason == "compiler-artifact" and .target.name == "fleet" and .executable != null) | .executable' |
    tail -1
}
if [[ -n "${BENCH_AB_BASE_BIN:-}" && -n "${BENCH_AB_HEAD_BIN:-}" ]]; then
  B_BIN="$BENCH_AB_BASE_BIN"
  H_BIN="$BENCH_AB_HEAD_BIN"
else
  if [[ -d "$WT" ]]; then
    git -C "$WT" checkout -q -f --detach "$base_rev"
  else
    mkdir -p "$T"
    git -C "$ROOT" worktree add -q --detach "$WT" "$base_rev"
  fi
  cp "$ROOT/gpushare-agent/benches/fleet.rs" "$WT/gpushare-agent/benches/fleet.rs"
  rm -rf "$WT/gpushare-fake-kube"
  cp -R "$ROOT/gpushare-fake-kube" "$WT/gpushare-fake-kube"
  if ! grep -q '^gpushare-fake-kube = ' "$WT/gpushare-agent/Cargo.toml"; then
    sed -i '/^\[dev-dependencies\]$/a gpushare-fake-kube = { path = "../gpushare-fake-kube" }' \
      "$WT/gpushare-agent/Cargo.toml"
  fi
  if ! grep -q '^name = "fleet"' "$WT/gpushare-agent/Cargo.toml"; then
    printf '\n[[bench]]\nname = "fleet"\nharness = false\n' >>"$WT/gpushare-agent/Cargo.toml"
  fi
  echo "bench-fleet-ab: building the fleet bench against ${base_rev:0:10} (base) and the working tree" >&2
  B_BIN="$(bench_bin "$WT" "$T/base")"
  H_BIN="$(bench_bin "$ROOT" "$T/head")"
fi

run() {
  GPUSHARE_BENCH_QUICK=0 GPUSHARE_BENCH_FLEET_N="$NODES" GPUSHARE_BENCH_FLEET_REST_SECS="$REST" "$1"
}
echo "== base ${base_rev:0:10}: $NODES nodes, ${REST} s at rest =="
base_out="$(run "$B_BIN")"
echo "$base_out"
echo
echo "== head (working tree): $NODES nodes, ${REST} s at rest =="
head_out="$(run "$H_BIN")"
echo "$head_out"
echo

# One figure of each part, base | head.
fig() { # OUTPUT PART_PREFIX SED_EXPRESSION
  grep -m1 "^$2" <<<"$1" | sed -E "$3" || true
}
row() { # LABEL PART SED
  printf '| %s | %s | %s |\n' "$1" "$(fig "$base_out" "$2" "$3")" "$(fig "$head_out" "$2" "$3")"
}
echo "| figure (per node unless said) | base ${base_rev:0:10} | head |"
echo "|---|---:|---:|"
row "start: requests (lists, claim GETs, watches)" "   per node" 's/^ *per node: ([0-9.]+) lists, ([0-9.]+) claim GETs, ([0-9.]+) watches.*/\1 + \2 + \3/'
row "start: KiB served" "   per node" 's/.* ([0-9.]+) KiB served.*/\1/'
row "at rest: requests an hour" "2. " 's/.*= ([0-9.]+) per node per hour.*/\1/'
row "a change to every node's view: median / slowest" "3. " 's/.*median ([^,]+), slowest (.*)/\1 \/ \2/'
row "watches dropped, a change: median / slowest" "4. " 's/.*median ([^,]+), slowest (.*)/\1 \/ \2/'
row "watches dropped and 410: median / slowest" "5. " 's/.*median ([^,]+), slowest (.*)/\1 \/ \2/'
row "100 workloads bad for 10 steps: Event writes" "6. " 's/.*: ([0-9]+) Event writes.*/\1/'
