#!/usr/bin/env bash
# Traces larger than memory: `stats` and `compare --policy bfc` on a big binary trace, peak RSS
# (from /usr/bin/time -v) and wall time of each. Makes the trace first when FILE does not
# exist (scripts/make-big-trace.py --events EVENTS, default 2,000,000,000: about 2.6 GB on disk).
# usage: scripts/bench-big-trace.sh FILE [ALLOCVIEW_BINARY]
# Each command runs once, niced: on two shared cores a 2-billion-event replay takes minutes.
set -euo pipefail
trace=$1
bin=${2:-target/release/allocview}
events=${EVENTS:-2000000000}
here=$(dirname "$0")

if [ ! -e "$trace" ]; then
  df -h "$(dirname "$trace")"
  nice -n 10 python3 "$here/make-big-trace.py" --events "$events" --out "$trace" --allocview "$bin"
fi
ls -l "$trace"

measure() {
  local name=$1; shift
  local tmp; tmp=$(mktemp)
  nice -n 10 /usr/bin/time -v "$@" >"$tmp.out" 2>"$tmp"
  local wall rss
  wall=$(grep 'Elapsed (wall' "$tmp" | awk '{print $NF}')
  rss=$(grep 'Maximum resident' "$tmp" | awk '{print $NF}')
  printf '%-28s wall %10s   peak RSS %8.1f MiB\n' "$name" "$wall" "$(echo "$rss / 1024" | bc -l)"
  cat "$tmp.out"
  rm -f "$tmp" "$tmp.out"
}

measure "stats" "$bin" stats "$trace"
measure "compare --policy bfc" "$bin" compare --policy bfc "$trace"
