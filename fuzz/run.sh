#!/usr/bin/env bash
# Bounded fuzzing run of every cargo-fuzz target, for CI and for local use.
#
#   fuzz/run.sh [SECONDS_PER_TARGET]      (default 20)
#
# Each target starts from its committed seeds (fuzz/corpus/<target>/), copied to a scratch corpus
# under fuzz/target/ so that what a run discovers never lands in the repository. Exits non-zero when
# any target crashes (panic, failed assertion, timeout, out of memory), after printing the input that
# did it and how to reproduce it. The last line is always `fuzz: <n> passed, <m> failed`.
#
# Environment: FUZZ_TIMEOUT (seconds one input may take, default 25), FUZZ_RSS_MB (default 2048).
set -uo pipefail

secs="${1:-20}"
if ! [[ "$secs" =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: fuzz/run.sh [SECONDS_PER_TARGET]   (a whole number of seconds, default 20)" >&2
    exit 2
fi
timeout_s="${FUZZ_TIMEOUT:-25}"
rss_mb="${FUZZ_RSS_MB:-2048}"
# No AddressSanitizer: every target is safe Rust, where ASan finds nothing a panic does not, and
# it costs the build minutes and each input time. The same flag for build, run and fmt, or each
# rebuilds.
san=(--sanitizer none)

# Run from the repository root, where `cargo fuzz` finds fuzz/.
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
scratch_root=fuzz/target/run
mkdir -p "$scratch_root"

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "fuzz: the nightly toolchain is missing; install it with" \
        "\`rustup toolchain install nightly --component rust-src\`" >&2
    echo "fuzz: 0 passed, 0 failed"
    exit 2
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz (cargo install cargo-fuzz --locked)"
    if ! cargo install cargo-fuzz --locked >"$scratch_root/install-cargo-fuzz.log" 2>&1; then
        tail -n 30 "$scratch_root/install-cargo-fuzz.log" >&2
        echo "fuzz: could not install cargo-fuzz" >&2
        echo "fuzz: 0 passed, 0 failed"
        exit 2
    fi
fi

mapfile -t targets < <(cargo +nightly fuzz list)
if [ "${#targets[@]}" -eq 0 ]; then
    echo "fuzz: no fuzz targets found" >&2
    echo "fuzz: 0 passed, 0 failed"
    exit 2
fi

# One build for all targets (the first one also builds the agent's eBPF object: minutes).
echo "fuzz: building ${#targets[@]} targets (${targets[*]})"
build_log="$scratch_root/build.log"
if ! cargo +nightly fuzz build "${san[@]}" >"$build_log" 2>&1; then
    # Leave out the build script's replayed progress lines (`warning: <crate>@<version>: ...`).
    grep -v -E '^warning: [^ ]+@[^ ]+: ' "$build_log" | grep -E -A 12 '^error|panicked' |
        head -n 80 >&2
    echo "fuzz: build failed (full log: $build_log)" >&2
    echo "fuzz: 0 passed, ${#targets[@]} failed"
    exit 1
fi

# The numbers of libFuzzer's last status line and final stats, in one line.
summarize() {
    local log="$1" status execs rate
    status="$(grep -E '^#[0-9]+.*(cov|ft): ' "$log" | tail -n 1)"
    execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)"
    rate="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)"
    local cov ft corp
    cov="$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$status")"
    ft="$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$status")"
    corp="$(sed -n 's/.* corp: \([^ ]*\).*/\1/p' <<<"$status")"
    echo "${execs:-?} execs (${rate:-?}/s), cov ${cov:-?}, ft ${ft:-?}, corpus ${corp:-?}"
}

passed=0
failed=0
for target in "${targets[@]}"; do
    seeds="fuzz/corpus/$target"
    work="$scratch_root/corpus/$target"
    log="$scratch_root/$target.log"
    mkdir -p "$seeds" "$work" "fuzz/artifacts/$target"
    cp -rf "$seeds"/. "$work"/
    dict=()
    if [ -f "fuzz/dict/$target.dict" ]; then
        dict=("-dict=fuzz/dict/$target.dict")
    fi
    marker="$scratch_root/$target.started"
    touch "$marker"
    echo "fuzz: $target: ${secs}s from $(find "$seeds" -type f | wc -l) seeds"
    cargo +nightly fuzz run "${san[@]}" "$target" "$work" -- \
        -max_total_time="$secs" -rss_limit_mb="$rss_mb" -timeout="$timeout_s" \
        -print_final_stats=1 "${dict[@]}" >"$log" 2>&1
    rc=$?
    if [ "$rc" -eq 0 ]; then
        passed=$((passed + 1))
        echo "fuzz: $target: ok: $(summarize "$log")"
        continue
    fi
    failed=$((failed + 1))
    echo "fuzz: $target: FAILED (exit $rc): $(summarize "$log")"
    # What libFuzzer said about the crash (the panic message and backtrace come first).
    grep -E -A 1 "panicked at" "$log" | head -n 6
    grep -E "^==[0-9]+==|^SUMMARY|ERROR: libFuzzer|timeout after|out-of-memory" "$log" | head -n 10
    crash="$(sed -n 's/.*Test unit written to \([^ ]*\).*/\1/p' "$log" | tail -n 1)"
    if [ -z "$crash" ]; then
        crash="$(find "fuzz/artifacts/$target" -type f -newer "$marker" | head -n 1)"
    fi
    if [ -n "$crash" ] && [ -f "$crash" ]; then
        echo "fuzz: $target: crashing input: $crash"
        echo "fuzz: $target: the input, as the target sees it (cargo fuzz fmt):"
        cargo +nightly fuzz fmt "${san[@]}" "$target" "$crash" 2>&1 | tail -n 40
        echo "fuzz: $target: the same bytes as characters (od -c, first 1 KiB):"
        head -c 1024 "$crash" | od -An -c | head -n 40
        echo "fuzz: $target: reproduce with: cargo +nightly fuzz run --sanitizer none $target $crash"
    else
        echo "fuzz: $target: no crashing input was written; last lines of $log:"
        tail -n 40 "$log"
    fi
    echo "fuzz: $target: full log: $log"
done

echo "fuzz: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
