#!/usr/bin/env bash
# gpushare: idempotent setup of a fresh machine (Debian bookworm, root, kernel with BTF).
# Quiet when everything is already in place; one line per thing it installs.
# Usage: scripts/setup.sh [--check]   (--check: exit 1 if something is missing, install nothing)
set -euo pipefail

CHECK_ONLY=0
[[ "${1:-}" == "--check" ]] && CHECK_ONLY=1
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
missing=()
say() { echo "gpushare setup: $*" >&2; }

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi

# 1. nightly toolchain + rust-src (the eBPF crate is built with -Z build-std=core)
if ! rustup toolchain list | grep -q '^nightly'; then missing+=("rust nightly toolchain"); fi
if ! rustup component list --toolchain nightly --installed 2>/dev/null | grep -q '^rust-src'; then
  missing+=("rust-src for nightly")
fi

# 2. llvm-N-dev matching the nightly's LLVM major, bpf-linker built against it
LLVM_MAJOR=""
if rustup toolchain list | grep -q '^nightly'; then
  LLVM_MAJOR="$(rustc +nightly -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')"
fi
APT_PKGS=()
[[ -n "$LLVM_MAJOR" ]] && APT_PKGS+=("llvm-${LLVM_MAJOR}-dev" "libpolly-${LLVM_MAJOR}-dev")
# tests: C ABI check (gcc), the image test's C++ library (g++), the package's strip and objdump (binutils), python venv, prometheus/promtool, docker engine, busybox for container images
APT_PKGS+=(gcc g++ binutils python3-venv prometheus docker.io busybox-static systemd jq)
apt_missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || apt_missing+=("$p")
done
((${#apt_missing[@]})) && missing+=("apt: ${apt_missing[*]}")

bpf_linker_ok=0
if command -v bpf-linker >/dev/null 2>&1 && [[ -n "$LLVM_MAJOR" ]]; then
  # cargo records the features bpf-linker was installed with; llvm-N must match the nightly's LLVM.
  if python3 - "$LLVM_MAJOR" <<'PY' 2>/dev/null; then bpf_linker_ok=1; fi
import json, os, sys
d = json.load(open(os.path.join(os.environ.get("CARGO_HOME", os.path.expanduser("~/.cargo")), ".crates2.json")))
ok = any(k.startswith("bpf-linker ") and "llvm-" + sys.argv[1] in v.get("features", [])
         for k, v in d.get("installs", {}).items())
sys.exit(0 if ok else 1)
PY
fi
((bpf_linker_ok)) || missing+=("bpf-linker for LLVM ${LLVM_MAJOR:-?}")

tracefs_ok=1
mountpoint -q /sys/kernel/tracing 2>/dev/null || tracefs_ok=0
((tracefs_ok)) || missing+=("tracefs mount")

# The project-local venv: Python NVML clients, and NVIDIA's headers for the ABI checks of the
# mocks (nvml.h from nvidia-nvml-dev, cuda.h from nvidia-cuda-runtime), copied to fixed paths.
VENV="$ROOT/target/pyenv"
venv_missing=()
if ! [[ -x "$VENV/bin/python" ]] || ! "$VENV/bin/python" -c 'import pynvml, nvitop' 2>/dev/null; then
  venv_missing+=(nvidia-ml-py nvitop)
fi
[[ -f "$VENV/nvml-header/nvml.h" ]] || venv_missing+=(nvidia-nvml-dev)
[[ -f "$VENV/cuda-header/cuda.h" && -f "$VENV/cuda-header/cudaTypedefs.h" ]] || venv_missing+=(nvidia-cuda-runtime)
((${#venv_missing[@]})) && missing+=("python venv: ${venv_missing[*]}")

if ((${#missing[@]} == 0)); then exit 0; fi
if ((CHECK_ONLY)); then
  printf 'gpushare setup: missing: %s\n' "${missing[@]}" >&2
  exit 1
fi

if ! rustup toolchain list | grep -q '^nightly'; then
  say "installing rust nightly toolchain"; rustup toolchain install nightly --profile minimal >/dev/null
  LLVM_MAJOR="$(rustc +nightly -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')"
fi
if ! rustup component list --toolchain nightly --installed | grep -q '^rust-src'; then
  say "installing rust-src for nightly"; rustup component add rust-src --toolchain nightly >/dev/null 2>&1
fi
if ((${#apt_missing[@]})); then
  say "installing apt packages: ${apt_missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq >/dev/null
  $SUDO apt-get install -y -qq --no-install-recommends "${apt_missing[@]}" >/dev/null
  # Debian starts prometheus as a service on install; tests start their own.
  $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
if ((bpf_linker_ok == 0)); then
  say "building bpf-linker against LLVM ${LLVM_MAJOR} (about a minute)"
  LLVM_PREFIX="/usr/lib/llvm-${LLVM_MAJOR}" cargo install --quiet --force bpf-linker \
    --no-default-features --features "llvm-${LLVM_MAJOR}" >/dev/null
fi
if ((tracefs_ok == 0)); then
  say "mounting tracefs at /sys/kernel/tracing"
  $SUDO mount -t tracefs nodev /sys/kernel/tracing
fi
if ((${#venv_missing[@]})); then
  say "installing into the python venv at target/pyenv: ${venv_missing[*]}"
  mkdir -p "$ROOT/target"
  [[ -x "$VENV/bin/python" ]] || python3 -m venv "$VENV"
  # `python -m pip`, not `bin/pip`: a venv copied from another checkout keeps that checkout's
  # path in its scripts' shebangs, and its bin/pip would install there.
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${venv_missing[@]}"
  # copy_header FILE DIR PACKAGE: the header the package installed under include/, to $VENV/DIR/.
  copy_header() {
    local hdr
    hdr="$(find "$VENV/lib" -path "*/include/$1" | head -n1)"
    [[ -n "$hdr" ]] || { say "$3 did not ship $1"; exit 1; }
    mkdir -p "$VENV/$2" && cp "$hdr" "$VENV/$2/$1"
  }
  copy_header nvml.h nvml-header nvidia-nvml-dev
  copy_header cuda.h cuda-header nvidia-cuda-runtime
  copy_header cudaTypedefs.h cuda-header nvidia-cuda-runtime
fi
exit 0
