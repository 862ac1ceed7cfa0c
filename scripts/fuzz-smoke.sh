#!/usr/bin/env bash
# CI's short fuzzing smoke (docs/src/internals/fuzzing.md): builds every fuzz target (cargo-fuzz, nightly),
# seeds the corpora (scripts/fuzz-corpus.sh) and runs libFuzzer on each target for SECONDS
# (default 6), under the campaign's limits: 2 GiB RSS, 10 s an input, debug assertions on.
# The first crash, timeout or out-of-memory fails the script and leaves the input in a
# temporary directory it names. New corpus entries go to that directory too, so the seeds stay
# as committed. FUZZ_TARGET_DIR sets cargo's target directory (CI keeps it between runs).
#
# usage: scripts/fuzz-smoke.sh [SECONDS]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
seconds="${1:-6}"
cd "$root/fuzz"
flags=(--sanitizer none --debug-assertions --release)
if [ -n "${FUZZ_TARGET_DIR:-}" ]; then flags+=(--target-dir "$FUZZ_TARGET_DIR"); fi
cargo +nightly fuzz build "${flags[@]}"
bash "$root/scripts/fuzz-corpus.sh" > /dev/null
work="$(mktemp -d)"
printf '%-16s %12s %8s %8s\n' target executions edges corpus
for target in $(cargo +nightly fuzz list); do
    max_len=65536
    [ "$target" = pickle ] && max_len=131072
    mkdir -p "$work/$target"
    if ! cargo +nightly fuzz run "${flags[@]}" "$target" "$work/$target" "corpus/$target" -- \
        -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=2048 -timeout=10 \
        -max_len="$max_len" -print_final_stats=1 -artifact_prefix="$work/$target/" \
        > "$work/$target.log" 2>&1; then
        tail -n 40 "$work/$target.log"
        echo "fuzz target $target failed: its input and log are in $work/$target/" >&2
        exit 1
    fi
    stat() { sed -n "s/^stat::$1: *//p" "$work/$target.log" | tail -n 1; }
    edges="$(grep -o 'cov: [0-9]*' "$work/$target.log" | tail -n 1 | cut -d' ' -f2)"
    # A target that ran no input (a build that links no fuzzer, a harness that returns early)
    # would otherwise pass in silence.
    units="$(stat number_of_executed_units)"
    if [ "${units:-0}" -lt 1 ]; then
        tail -n 40 "$work/$target.log"
        echo "fuzz target $target executed no input: see $work/$target.log" >&2
        exit 1
    fi
    printf '%-16s %12s %8s %8s\n' "$target" "$units" "${edges:-?}" \
        "$(find "$work/$target" "corpus/$target" -type f | wc -l)"
done
rm -rf "$work"
