#!/usr/bin/env bash
# gpushare real-GPU smoke test. For a machine with an NVIDIA GPU, its driver and PyTorch, and no network.
# Runs the already-built agent against the real libnvidia-ml (and libcuda for the suspend step) and checks,
# with PyTorch processes in fresh cgroups:
#   1. attribution: the agent's memory for a process equals nvidia-smi's;
#   2. freeze: a CUDA process over its quota is frozen, and a neighbour in its own cgroup can still allocate
#      within its quota meanwhile (the memory each holds is printed);
#   3. suspend: a process over its quota is suspended (CUDA checkpoint), NVML shows its memory released, it is
#      resumed by a release, and its tensor's contents are intact (the time each took is printed);
#   4. image: the agent inside the image of `cargo xtask image` loads the host's real libnvidia-ml
#      (mounted where the NVIDIA container runtime puts it, with the device nodes) and lists the
#      same GPUs as nvidia-smi. Skipped (said so, not failed) without a Docker engine or the archive.
# Finishes within 3 minutes; prints PASS/FAIL lines; exits 1 if any check failed.
#
# Usage: scripts/gpu-smoke.sh [path/to/gpushare-agent]   (default: target/release, then target/debug)
#   GPUSHARE_SMOKE_MIB   allocation of each process, MiB (default 1024)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
AGENT="${1:-}"
[[ -z "$AGENT" && -x "$ROOT/target/release/gpushare-agent" ]] && AGENT="$ROOT/target/release/gpushare-agent"
[[ -z "$AGENT" && -x "$ROOT/target/debug/gpushare-agent" ]] && AGENT="$ROOT/target/debug/gpushare-agent"
ALLOC_MIB="${GPUSHARE_SMOKE_MIB:-1024}"
QUOTA_MIB=$((ALLOC_MIB / 2))
WORK="$(mktemp -d /tmp/gpushare-smoke.XXXXXX)"
LOG="$WORK/agent.log"
PORT=$((19400 + RANDOM % 500))
SOCK="$WORK/agent.sock"
FAILS=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
info() { echo "----- $*"; }
now_ms() { date +%s%3N; }

AGENT_PID=""; PIDS=(); CGS=(); IMAGE_CONTAINER=""
cleanup() {
  [[ -n "$IMAGE_CONTAINER" ]] && docker rm -f "$IMAGE_CONTAINER" >/dev/null 2>&1
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  [[ -n "$AGENT_PID" ]] && kill -TERM "$AGENT_PID" 2>/dev/null && wait "$AGENT_PID" 2>/dev/null
  for cg in "${CGS[@]}"; do
    [[ -d "$cg" ]] || continue
    echo 0 > "$cg/cgroup.freeze" 2>/dev/null; echo 1 > "$cg/cgroup.kill" 2>/dev/null; sleep 0.3; rmdir "$cg" 2>/dev/null
  done
}
trap cleanup EXIT
# Hard limit: 175 s for everything.
( sleep 175; echo "FAIL: smoke test timed out"; kill -TERM $$ ) 2>/dev/null &
WATCHDOG=$!

[[ $(id -u) -eq 0 ]] || { fail "must run as root (eBPF, cgroups)"; exit 1; }
[[ -n "$AGENT" && -x "$AGENT" ]] || { fail "no agent binary (build with: cargo build --release -p gpushare-agent)"; exit 1; }
command -v nvidia-smi >/dev/null && pass "nvidia-smi present" || fail "nvidia-smi not found"
python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null \
  && pass "PyTorch sees CUDA" || { fail "PyTorch with CUDA not importable"; exit 1; }

info "nvidia-smi before"
nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used,driver_version --format=csv,noheader 2>&1 | sed 's/^/  /'

if mountpoint -q /sys/fs/cgroup/unified; then V2=/sys/fs/cgroup/unified; else V2=/sys/fs/cgroup; fi
mkcg() { local cg="$V2/gpushare-smoke-$$-$1"; mkdir -p "$cg" && CGS+=("$cg") && echo "$cg"; }
CG_A=$(mkcg attrib) && CG_F=$(mkcg frozen) && CG_N=$(mkcg neighbour) && CG_S=$(mkcg suspend) \
  && pass "created cgroups under $V2" || { fail "cannot create cgroups under $V2"; exit 1; }
rel() { echo "${1#$V2}"; }

cat >"$WORK/quotas.toml" <<TOML
[[quota]]
cgroup = "$(rel "$CG_F")"
gpu_memory = "${QUOTA_MIB}MiB"
grace = "0s"
ladder = [ { action = "freeze" } ]

[[quota]]
cgroup = "$(rel "$CG_N")"
gpu_memory = "$((ALLOC_MIB * 4))MiB"

[[quota]]
cgroup = "$(rel "$CG_S")"
gpu_memory = "${QUOTA_MIB}MiB"
grace = "2s"
ladder = [ { action = "suspend" } ]
TOML

info "starting agent: $AGENT"
RUST_LOG=info,gpushare_agent=debug "$AGENT" --interval 500ms --quotas "$WORK/quotas.toml" \
  --runtime-quotas "$WORK/runtime" --state-dir "$WORK/state" --socket "$SOCK" --listen "127.0.0.1:$PORT" >"$LOG" 2>&1 &
AGENT_PID=$!
for _ in $(seq 1 60); do grep -q "agent running" "$LOG" && break; sleep 0.5; done
grep -q "eBPF programs loaded and attached" "$LOG" && pass "eBPF programs loaded" || fail "eBPF programs not loaded (see $LOG)"
grep -q "NVML ready" "$LOG" && pass "NVML: $(grep -o 'NVML ready.*' "$LOG" | head -1)" || fail "NVML not ready: $(grep -o 'no NVIDIA driver.*' "$LOG" | head -1)"
if grep -q "CUDA checkpoint API available" "$LOG"; then
  pass "$(grep -o 'CUDA checkpoint API available.*' "$LOG" | head -1)"; SUSPEND=1
else
  fail "suspend unavailable: $(grep -o 'suspend is unavailable.*' "$LOG" | head -1) (needs driver r570+)"; SUSPEND=0
fi

# The agent's view of one workload (or of the GPU): "used state suspended_bytes" from /api/v1/state
# (served on the root-only local socket only).
state_of() {
  "$AGENT" status --json --socket "$SOCK" 2>/dev/null | python3 -c '
import json, sys
cg = sys.argv[1]
try:
    s = json.load(sys.stdin)
except ValueError:
    s = {"workloads": []}
rows = [w for w in s["workloads"] if w["workload"] == "cgroup://" + cg and w["gpu_uuid"] == "all"]
print("%s %s %s" % (rows[0]["used_bytes"], rows[0]["state"], rows[0].get("suspended_bytes", 0)) if rows else "0 absent 0")
' "$1"
}
wait_state() { # cgroup state seconds -> 0 when reached
  local deadline=$(( $(date +%s) + $3 ))
  while (( $(date +%s) < deadline )); do
    [[ "$(state_of "$1" | awk '{print $2}')" == "$2" ]] && return 0
    sleep 0.2
  done
  return 1
}
smi_mib() { nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null | awk -F', ' -v p="$1" '$1==p {print $2}' | head -1; }
gpu_used_mib() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 2>/dev/null | head -1; }

# A PyTorch process in a cgroup: allocates ALLOC_MIB filled with a known pattern, says "allocated <pid>",
# then waits for <work>/check.<name> and reports whether the contents are intact.
cat >"$WORK/alloc.py" <<'PY'
import os, sys, time, torch
name, mib = sys.argv[1], int(sys.argv[2])
n = mib * 1024 * 1024 // 4
x = torch.arange(n, dtype=torch.int32, device="cuda:0")
torch.cuda.synchronize()
want = int(x.sum().item())
print("allocated", os.getpid(), flush=True)
while not os.path.exists(os.path.join(os.path.dirname(sys.argv[0]), "check." + name)):
    time.sleep(0.1)
got = int(x.sum().item())
print("intact" if got == want else f"CORRUPT {got} != {want}", flush=True)
time.sleep(60)
PY
start_py() { # name cgroup: sets PY to its pid; 1 when it did not allocate
  ( echo 0 > "$2/cgroup.procs" && exec python3 "$WORK/alloc.py" "$1" "$ALLOC_MIB" ) >"$WORK/py.$1" 2>&1 &
  PY=$!; PIDS+=("$PY")
  for _ in $(seq 1 120); do grep -q allocated "$WORK/py.$1" && break; sleep 0.25; done
  grep -q allocated "$WORK/py.$1" && pass "python $1 allocated ${ALLOC_MIB} MiB (pid $PY)" && return 0
  fail "python $1 did not allocate: $(tail -3 "$WORK/py.$1")"; return 1
}

info "1. attribution: ${ALLOC_MIB} MiB in $(rel "$CG_A")"
start_py attrib "$CG_A"; PA=$PY
sleep 2
AG_MIB=$(( $(state_of "$(rel "$CG_A")" | awk '{print $1}') / 1048576 ))
SMI=$(smi_mib "$PA")
echo "  agent: ${AG_MIB} MiB   nvidia-smi: ${SMI:-?} MiB   requested: ${ALLOC_MIB} MiB"
[[ -n "$SMI" && "$AG_MIB" -eq "$SMI" ]] && pass "agent memory equals nvidia-smi's" || fail "agent ${AG_MIB} MiB vs nvidia-smi ${SMI:-?} MiB"
grep -qE "GPU task $PA \(.*\) opened an nvidia device" "$LOG" && pass "open event seen for pid $PA" || fail "no open event for pid $PA"
kill -9 "$PA"; sleep 1

info "2. freeze: ${ALLOC_MIB} MiB over a ${QUOTA_MIB} MiB quota in $(rel "$CG_F"); a neighbour allocates meanwhile"
T0=$(now_ms)
start_py frozen "$CG_F"; PF=$PY
if wait_state "$(rel "$CG_F")" frozen 20 && grep -q "frozen 1" "$CG_F/cgroup.events"; then
  pass "over quota: frozen ($(( $(now_ms) - T0 )) ms after the process started allocating)"
else
  fail "not frozen: $(state_of "$(rel "$CG_F")")"
fi
start_py neighbour "$CG_N" && pass "the neighbour allocated while the offender is frozen"; PN=$PY
echo "  offender holds $(smi_mib "$PF") MiB (frozen), neighbour holds $(smi_mib "$PN") MiB (running)"
[[ "$(state_of "$(rel "$CG_N")" | awk '{print $2}')" == ok ]] && pass "neighbour state ok" || fail "neighbour state $(state_of "$(rel "$CG_N")")"
kill -9 "$PF" "$PN" 2>/dev/null; sleep 1

if [[ $SUSPEND -eq 1 ]]; then
  info "3. suspend: ${ALLOC_MIB} MiB over a ${QUOTA_MIB} MiB quota in $(rel "$CG_S")"
  start_py suspend "$CG_S"; PS=$PY
  BEFORE=$(gpu_used_mib)
  T0=$(now_ms)
  if wait_state "$(rel "$CG_S")" suspended 60; then
    pass "suspended in $(( $(now_ms) - T0 - 2000 )) ms after its 2 s grace ($(grep -o 'moved to host memory in [^ ]*' "$LOG" | tail -1))"
  else
    fail "not suspended: $(state_of "$(rel "$CG_S")"); $(grep -E 'suspend|lock|checkpoint' "$LOG" | tail -3)"
  fi
  sleep 1
  AFTER=$(gpu_used_mib)
  echo "  GPU memory used: ${BEFORE} MiB before, ${AFTER} MiB suspended; nvidia-smi for pid $PS: '$(smi_mib "$PS")'"
  [[ -z "$(smi_mib "$PS")" ]] && pass "NVML no longer lists the suspended process" || fail "NVML still lists pid $PS"
  (( BEFORE - AFTER >= ALLOC_MIB * 9 / 10 )) && pass "its memory is free for the neighbours ($((BEFORE - AFTER)) MiB)" \
    || fail "only $((BEFORE - AFTER)) MiB released"
  T0=$(now_ms)
  "$AGENT" release "cgroup://$(rel "$CG_S")" --socket "$SOCK" && pass "released"
  for _ in $(seq 1 200); do [[ -n "$(smi_mib "$PS")" ]] && ! grep -q "frozen 1" "$CG_S/cgroup.events" && break; sleep 0.1; done
  [[ -n "$(smi_mib "$PS")" ]] && pass "resumed in $(( $(now_ms) - T0 )) ms: NVML lists it again ($(smi_mib "$PS") MiB)" || fail "not resumed"
  touch "$WORK/check.suspend"
  for _ in $(seq 1 100); do grep -qE "intact|CORRUPT" "$WORK/py.suspend" && break; sleep 0.1; done
  grep -q intact "$WORK/py.suspend" && pass "the tensor's contents are intact after suspend and resume" \
    || fail "tensor check: $(tail -2 "$WORK/py.suspend")"
  kill -9 "$PS" 2>/dev/null
fi

curl_metrics() { python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$PORT/metrics', timeout=5).read().decode())"; }
info "metrics"
curl_metrics | grep -E "^gpushare_(suspend|resume)_duration_seconds_(sum|count)|^gpushare_suspend_fallthroughs|^gpushare_enforcement_latency_seconds_(sum|count)|^gpushare_gpu_isolation_backend" | sed 's/^/  /'
kill -TERM "$AGENT_PID"; wait "$AGENT_PID"; RC=$?; AGENT_PID=""
[[ $RC -eq 0 ]] && pass "agent stopped cleanly on SIGTERM" || fail "agent exit status $RC"
# 4. The image (not run where this script was written: no GPU there; kept simple on purpose).
VERSION="$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$ROOT/Cargo.toml")"
IMAGE_TAR="$ROOT/target/image/gpushare-agent-$VERSION.tar"
info "4. image: the host's libnvidia-ml inside $(basename "$IMAGE_TAR")"
NVML_LIB="$(ldconfig -p | awk '/libnvidia-ml\.so\.1 .*x86-64/ {print $NF; exit}')"
if ! command -v docker >/dev/null || ! docker info >/dev/null 2>&1; then
  echo "  SKIPPED: no Docker engine answers (start dockerd to run this step)"
elif [[ ! -f "$IMAGE_TAR" ]]; then
  echo "  SKIPPED: no image archive (build it: cargo xtask image)"
elif [[ -z "$NVML_LIB" ]]; then
  fail "libnvidia-ml.so.1 is not in the loader cache (ldconfig -p)"
else
  REF="$(docker load -q -i "$IMAGE_TAR" | sed -n 's/^Loaded image: //p')"
  IPORT=$((PORT + 1))
  DEVS=(); for d in /dev/nvidia*; do [[ -c "$d" ]] && DEVS+=(--device "$d"); done
  mkdir -p "$WORK/image-state" "$WORK/image-run"
  IMAGE_CONTAINER="gpushare-smoke-image-$$"
  # The DaemonSet's security settings; host network only to reach the agent from here.
  docker run -d --name "$IMAGE_CONTAINER" --network host --pid host --user 0 --read-only \
    --cap-drop ALL --cap-add SYS_ADMIN --cap-add SYS_PTRACE --cap-add DAC_READ_SEARCH --cap-add KILL \
    --security-opt seccomp=unconfined "${DEVS[@]}" \
    -v "$(readlink -f "$NVML_LIB"):/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1:ro" \
    -v /sys/fs/cgroup:/sys/fs/cgroup -v /sys/kernel/tracing:/sys/kernel/tracing:ro \
    -v "$WORK/image-state:/var/lib/gpushare" -v "$WORK/image-run:/run/gpushare" \
    "$REF" --listen "127.0.0.1:$IPORT" >/dev/null || fail "docker run $REF"
  for _ in $(seq 1 60); do docker logs "$IMAGE_CONTAINER" 2>&1 | grep -q "NVML ready" && break; sleep 0.5; done
  READY="$(docker logs "$IMAGE_CONTAINER" 2>&1 | grep -o 'NVML ready: driver [^,]*, [0-9]* GPU(s)' | head -1)"
  if [[ -n "$READY" ]]; then
    pass "in the image ($REF): $READY"
    GPUS_IN="$("$AGENT" status --json --socket "$WORK/image-run/agent.sock" 2>/dev/null | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["gpus"]))' 2>/dev/null)"
    GPUS_SMI="$(nvidia-smi -L | grep -c '^GPU ')"
    [[ "$GPUS_IN" == "$GPUS_SMI" ]] && pass "the agent in the image lists $GPUS_IN GPU(s), as nvidia-smi does" \
      || fail "the agent in the image lists '${GPUS_IN}' GPU(s), nvidia-smi $GPUS_SMI"
  else
    fail "the agent in the image did not load NVML: $(docker logs "$IMAGE_CONTAINER" 2>&1 | tail -5)"
  fi
  docker stop -t 10 "$IMAGE_CONTAINER" >/dev/null
  [[ "$(docker inspect -f '{{.State.ExitCode}}' "$IMAGE_CONTAINER")" == 0 ]] && pass "the agent in the image stopped cleanly" \
    || fail "the agent in the image exited $(docker inspect -f '{{.State.ExitCode}}' "$IMAGE_CONTAINER")"
  docker rm -f "$IMAGE_CONTAINER" >/dev/null; IMAGE_CONTAINER=""
fi

kill "$WATCHDOG" 2>/dev/null
echo "agent log: $LOG"
if [[ $FAILS -eq 0 ]]; then echo "RESULT: PASS"; else echo "RESULT: FAIL ($FAILS checks failed)"; exit 1; fi
