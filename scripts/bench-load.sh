#!/usr/bin/env bash
# Load benchmark: `zcat FILE > /dev/null` against allocview's loader on the same file, in one run.
# Prints wall times, their ratio, and the loader's peak RSS per event.
# usage: scripts/bench-load.sh TRACE.gz [ALLOCVIEW_BINARY]
set -euo pipefail
trace=$1
bin=${2:-target/release/allocview}
runs=${RUNS:-3}

best() { sort -g | head -1; }

zcat_s=$(for _ in $(seq "$runs"); do
  /usr/bin/time -f %e zcat "$trace" 2>&1 >/dev/null | tail -1
done | best)

tmp=$(mktemp)
load_s=$(for _ in $(seq "$runs"); do
  /usr/bin/time -v "$bin" stats --json "$trace" >"$tmp.json" 2>"$tmp"
  grep -o '"load_seconds":[0-9.e-]*' "$tmp.json" | cut -d: -f2
done | best)
wall_s=$(grep 'Elapsed (wall' "$tmp" | awk '{print $NF}')
rss_kb=$(grep 'Maximum resident' "$tmp" | awk '{print $NF}')
events=$(grep -o '"events":[0-9]*' "$tmp.json" | head -1 | cut -d: -f2)
rm -f "$tmp" "$tmp.json"

python3 - "$trace" "$zcat_s" "$load_s" "$wall_s" "$rss_kb" "$events" <<'PY'
import sys
trace, zcat_s, load_s, wall, rss_kb, events = sys.argv[1:]
zcat_s, load_s, rss, events = float(zcat_s), float(load_s), int(rss_kb) * 1024, int(events)
print(f"{trace}: {events:,} events")
print(f"  zcat > /dev/null        {zcat_s:8.3f} s  (best of runs)")
print(f"  allocview load          {load_s:8.3f} s  (best of runs; whole stats command: {wall})")
print(f"  load / zcat             {load_s / zcat_s:8.3f}")
print(f"  peak RSS                {rss / 2**20:8.1f} MiB = {rss / events:.1f} bytes/event")
PY
