#!/usr/bin/env bash
# The in-process agent step before and after a change, measured side by side in one run.
#
# Builds benches/scale.rs at BASE (in a git worktree under target/bench-ab/) and at the working tree,
# each into a target directory of its own (cargo keys a workspace's packages by their path inside
# the workspace, so two checkouts sharing one would take each other's build-script output), gives
# both the working tree's optimised mock NVML, then runs the two bench binaries in alternating
# rounds over the `step` part at one size and prints every round, the median of each binary's
# round medians, and their ratio. Root (the bench makes cgroups and processes).
#
# Usage: scripts/bench-step-ab.sh BASE_REV [ROUNDS (default 6)] [PROCESSES (default 1000)]
# With BENCH_AB_BASE_BIN and BENCH_AB_HEAD_BIN set (bench executables already built, each in a
# target/release/deps/ beside an optimised mock), nothing is built and BASE_REV only names the base.
# A head bench with the "1% changed" column prints it too (the steps with 1% of the processes'
# usage changed before each; a base without it prints "-").
set -euo pipefail

BASE="${1:?usage: scripts/bench-step-ab.sh BASE_REV [ROUNDS] [PROCESSES]}"
ROUNDS="${2:-6}"
PROCS="${3:-1000}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
T="$ROOT/target/bench-ab"
WT="$T/base-src"

if [[ $(id -u) -ne 0 ]]; then
  echo "bench-step-ab: needs root (the bench makes cgroups and processes)" >&2
  exit 1
fi
base_rev="$(git -C "$ROOT" rev-parse --verify "$BASE^{commit}")"

# The bench executable cargo builds in DIR, into the target directory TARGET.
bench_bin() {
  (cd "$1" && CARGO_TARGET_DIR="$2" cargo bench -q -p gpushare-agent --bench scale --no-run --message-format=json) |
    jq -r 'select(.reason == "compiler-artifact" and .target.name == "scale" and .executable != null) | .executable' |
    tail -1
}
if [[ -n "${BENCH_AB_BASE_BIN:-}" && -n "${BENCH_AB_HEAD_BIN:-}" ]]; then
  B_BIN="$BENCH_AB_BASE_BIN"
  H_BIN="$BENCH_AB_HEAD_BIN"
else
  if [[ -d "$WT" ]]; then
    git -C "$WT" checkout -q --detach "$base_rev"
  else
    mkdir -p "$T"
    git -C "$ROOT" worktree add -q --detach "$WT" "$base_rev"
  fi
  echo "bench-step-ab: building the bench at ${base_rev:0:10} (base) and at the working tree" >&2
  before="$(bench_bin "$WT" "$T/base")"
  after="$(bench_bin "$ROOT" "$T/head")"
  (cd "$ROOT" && CARGO_TARGET_DIR="$T/head" cargo build -q --release -p gpushare-fake-nvml)
  # One mock for both: the bench loads target/release/libgpushare_fake_nvml.so beside its binary.
  cp "$T/head/release/libgpushare_fake_nvml.so" "$T/base/release/libgpushare_fake_nvml.so"
  cp "$before" "$T/base/release/deps/scale-ab"
  cp "$after" "$T/head/release/deps/scale-ab"
  B_BIN="$T/base/release/deps/scale-ab"
  H_BIN="$T/head/release/deps/scale-ab"
fi

# One round: the step median (ms) at PROCS processes, and the "1% changed" median ("-" without).
round() {
  GPUSHARE_BENCH_STEP_PROCS="$PROCS" "$1" step --bench 2>/dev/null |
    awk -v n="$PROCS" '$1 == n { print $3, ($5 == "" ? "-" : $5) }'
}
median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

echo "round  base (ms)  head (ms)  head, 1% changed (ms)   at $PROCS processes, $((PROCS / 5)) workloads, 8 GPUs; load $(cut -d' ' -f1-3 /proc/loadavg)"
b_all=()
h_all=()
c_all=()
for r in $(seq 1 "$ROUNDS"); do
  # Alternate which goes first, so neither always runs on a warmer machine.
  if ((r % 2)); then
    b="$(round "$B_BIN")"
    h="$(round "$H_BIN")"
  else
    h="$(round "$H_BIN")"
    b="$(round "$B_BIN")"
  fi
  read -r b _ <<<"$b"
  read -r h c <<<"$h"
  printf '%5d %10s %10s %22s\n' "$r" "$b" "$h" "$c"
  b_all+=("$b")
  h_all+=("$h")
  c_all+=("$c")
done
bm="$(printf '%s\n' "${b_all[@]}" | median)"
hm="$(printf '%s\n' "${h_all[@]}" | median)"
cm="$(printf '%s\n' "${c_all[@]}" | median)"
printf 'median %9s %10s %22s   head/base = %s; load %s\n' "$bm" "$hm" "$cm" "$(awk -v a="$hm" -v b="$bm" 'BEGIN { printf "%.3f", a / b }')" "$(cut -d' ' -f1-3 /proc/loadavg)"
