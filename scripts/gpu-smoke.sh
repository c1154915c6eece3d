#!/usr/bin/env bash
# gpushare real-GPU smoke test. For a machine with an NVIDIA GPU, its driver and PyTorch, and no network.
# Runs the already-built agent against the real libnvidia-ml, starts a python process that allocates a known
# amount of GPU memory inside a fresh cgroup, and prints what the agent saw next to what nvidia-smi reports.
# Finishes within 3 minutes; prints PASS/FAIL lines; exits 1 if any check failed.
#
# Usage: scripts/gpu-smoke.sh [path/to/gpushare-agent]   (default: target/release, then target/debug)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
AGENT="${1:-}"
[[ -z "$AGENT" && -x "$ROOT/target/release/gpushare-agent" ]] && AGENT="$ROOT/target/release/gpushare-agent"
[[ -z "$AGENT" && -x "$ROOT/target/debug/gpushare-agent" ]] && AGENT="$ROOT/target/debug/gpushare-agent"
ALLOC_MIB="${GPUSHARE_SMOKE_MIB:-1024}"
WORK="$(mktemp -d /tmp/gpushare-smoke.XXXXXX)"
LOG="$WORK/agent.log"
FAILS=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
info() { echo "----- $*"; }

AGENT_PID=""; PY_PID=""; CG=""
cleanup() {
  [[ -n "$PY_PID" ]] && kill "$PY_PID" 2>/dev/null
  [[ -n "$AGENT_PID" ]] && kill -INT "$AGENT_PID" 2>/dev/null && wait "$AGENT_PID" 2>/dev/null
  [[ -n "$CG" && -d "$CG" ]] && { echo 1 > "$CG/cgroup.kill" 2>/dev/null; sleep 0.5; rmdir "$CG" 2>/dev/null; }
}
trap cleanup EXIT
# Hard limit: 170 s for everything.
( sleep 170; echo "FAIL: smoke test timed out"; kill -TERM $$ ) 2>/dev/null &
WATCHDOG=$!

[[ $(id -u) -eq 0 ]] || { fail "must run as root (eBPF, cgroups)"; exit 1; }
[[ -n "$AGENT" && -x "$AGENT" ]] || { fail "no agent binary (build with: cargo build --release -p gpushare-agent)"; exit 1; }
command -v nvidia-smi >/dev/null && pass "nvidia-smi present" || fail "nvidia-smi not found"
python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null \
  && pass "PyTorch sees CUDA" || { fail "PyTorch with CUDA not importable"; exit 1; }

info "nvidia-smi before"
nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used --format=csv,noheader 2>&1 | sed 's/^/  /'

# cgroup v2 root: hybrid or pure v2.
if mountpoint -q /sys/fs/cgroup/unified; then V2=/sys/fs/cgroup/unified; else V2=/sys/fs/cgroup; fi
CG="$V2/gpushare-smoke-$$"
mkdir -p "$CG" && pass "created cgroup ${CG#$V2}" || { fail "cannot create cgroup under $V2"; exit 1; }

info "starting agent: $AGENT"
RUST_LOG=gpushare_agent=debug "$AGENT" --interval 500ms >"$LOG" 2>&1 &
AGENT_PID=$!
for _ in $(seq 1 60); do grep -q "agent running" "$LOG" && break; sleep 0.5; done
grep -q "eBPF programs loaded and attached" "$LOG" && pass "eBPF programs loaded" || fail "eBPF programs not loaded (see $LOG)"
grep -q "NVML ready" "$LOG" && pass "NVML: $(grep -o 'NVML ready.*' "$LOG" | head -1)" || fail "NVML not ready: $(grep -o 'no NVIDIA driver.*' "$LOG" | head -1)"

info "starting python in the cgroup, allocating ${ALLOC_MIB} MiB"
cat >"$WORK/alloc.py" <<PY
import os, sys, time, torch
x = torch.empty(${ALLOC_MIB} * 1024 * 1024, dtype=torch.uint8, device="cuda:0")
torch.cuda.synchronize()
print("allocated", os.getpid(), flush=True)
time.sleep(30)
PY
( echo 0 > "$CG/cgroup.procs" && exec python3 "$WORK/alloc.py" ) >"$WORK/py.out" 2>&1 &
PY_PID=$!
for _ in $(seq 1 120); do grep -q allocated "$WORK/py.out" && break; sleep 0.5; done
grep -q allocated "$WORK/py.out" && pass "python allocated (pid $PY_PID)" || { fail "python did not allocate: $(tail -3 "$WORK/py.out")"; exit 1; }
sleep 3

info "nvidia-smi per process"
SMI=$(nvidia-smi --query-compute-apps=pid,used_memory,gpu_uuid --format=csv,noheader,nounits 2>&1)
echo "$SMI" | sed 's/^/  /'
SMI_MIB=$(echo "$SMI" | awk -F', ' -v p="$PY_PID" '$1==p {print $2}' | head -1)

info "what the agent saw for pid $PY_PID"
grep -E "GPU task $PY_PID |pid $PY_PID " "$LOG" | tail -5 | sed 's/^/  /'
grep -qE "GPU task $PY_PID \(.*\) opened an nvidia device: cgroup ${CG#$V2}" "$LOG" \
  && pass "open event attributed pid $PY_PID to cgroup ${CG#$V2}" || fail "no open event for pid $PY_PID in ${CG#$V2}"
grep -q "GPU task $PY_PID issued an allocation ioctl" "$LOG" \
  && pass "allocation ioctl events seen for pid $PY_PID" || fail "no allocation ioctl event for pid $PY_PID"
AG_BYTES=$(grep -oE "pid $PY_PID comm [^ ]+ used [0-9]+ bytes cgroup ${CG#$V2}" "$LOG" | tail -1 | awk '{print $6}')
if [[ -n "$AG_BYTES" ]]; then
  AG_MIB=$((AG_BYTES / 1048576))
  echo "  agent: ${AG_MIB} MiB   nvidia-smi: ${SMI_MIB:-?} MiB   requested: ${ALLOC_MIB} MiB"
  [[ -n "$SMI_MIB" && "$AG_MIB" -eq "$SMI_MIB" ]] && pass "agent memory equals nvidia-smi's" || fail "agent ${AG_MIB} MiB vs nvidia-smi ${SMI_MIB:-?} MiB"
  [[ "$AG_MIB" -ge "$ALLOC_MIB" ]] && pass "agent memory >= requested" || fail "agent memory below the allocation"
else
  fail "agent sampled no memory for pid $PY_PID in cgroup ${CG#$V2}"
fi

kill "$PY_PID" 2>/dev/null; wait "$PY_PID" 2>/dev/null; sleep 1
grep -q "GPU task $PY_PID exited" "$LOG" && pass "exit of pid $PY_PID seen" || fail "exit of pid $PY_PID not seen"
PY_PID=""
kill -INT "$AGENT_PID"; wait "$AGENT_PID"; RC=$?; AGENT_PID=""
[[ $RC -eq 0 ]] && pass "agent stopped cleanly on SIGINT" || fail "agent exit status $RC"
kill "$WATCHDOG" 2>/dev/null
echo "agent log: $LOG"
if [[ $FAILS -eq 0 ]]; then echo "RESULT: PASS"; else echo "RESULT: FAIL ($FAILS checks failed)"; exit 1; fi
