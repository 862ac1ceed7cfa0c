#!/usr/bin/env bash
# Runs one fuzz target for a while: scripts/fuzz.sh TARGET SECONDS [extra libFuzzer flags].
# One process (libFuzzer's fork mode with one job, which keeps going after a crash, a timeout
# or an out-of-memory and saves each input in fuzz/artifacts/TARGET/), niced, under a 2 GiB
# RSS limit and 10 s an input. Needs nightly and cargo-fuzz (`cargo install cargo-fuzz`);
# builds the corpus first (scripts/fuzz-corpus.sh). The log is fuzz/logs/TARGET.log; its last
# lines are libFuzzer's final statistics.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
target="$1"; seconds="$2"; shift 2
[ -d "$root/fuzz/corpus/$target" ] || bash "$root/scripts/fuzz-corpus.sh" > /dev/null
mkdir -p "$root/fuzz/artifacts/$target" "$root/fuzz/logs"
max_len=65536
[ "$target" = pickle ] && max_len=131072
cd "$root/fuzz"
nice -n 10 cargo +nightly fuzz run --sanitizer none --debug-assertions --release "$target" \
    "corpus/$target" -- \
    -fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
    -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=2048 -timeout=10 \
    -max_len="$max_len" -print_final_stats=1 \
    -artifact_prefix="artifacts/$target/" "$@" 2>&1 | tee "logs/$target.log" | tail -n 25
