#!/usr/bin/env bash
# Issue 13: the cost of call stacks in `allocview record`, against heaptrack, on the same
# workloads in one run: a multi-threaded Python program (scripts/stacks-workload.py, with
# PYTHONMALLOC=malloc) and a C++ program (scripts/stacks-workload.cpp, -O2: no frame
# pointers). For each: untraced; heaptrack (its whole run: the preloaded recorder and
# heaptrack_interpret, which runs beside the program); allocview's tracer alone, with and
# without stacks (the program's own run, LD_PRELOAD as `record` sets it); and `allocview
# record` as a whole, with and without stacks (the run, then the spool's conversion and the
# symbolization). Best of 3, wall and CPU seconds (user + system, children included);
# slowdown = wall / untraced wall.
#
# usage: scripts/bench-stacks.sh [PY_ITEMS_PER_THREAD] [CPP_ROUNDS]   (defaults 200000, 2000)
# env:   ALLOCVIEW=path/to/allocview (default: target/release/allocview from
#        `cargo build --profile bench -p allocview`, else target/debug/allocview)
#        PYTHON=python interpreter (default /usr/bin/python3, else python3)
set -euo pipefail
cd "$(dirname "$0")/.."
PY_N="${1:-200000}"
CPP_N="${2:-2000}"
ALLOCVIEW="${ALLOCVIEW:-}"
if [ -z "$ALLOCVIEW" ]; then
  for p in target/release/allocview target/debug/allocview; do
    if [ -x "$p" ]; then ALLOCVIEW="$p"; break; fi
  done
fi
[ -x "$ALLOCVIEW" ] || { echo "build allocview first (cargo build --profile bench -p allocview)"; exit 1; }
profile_dir="$(dirname "$ALLOCVIEW")"
TRACER="$(ls -t "$profile_dir"/build/allocview-*/out/liballocview_tracer.so 2>/dev/null | head -1)"
[ -f "$TRACER" ] || { echo "no tracer next to $ALLOCVIEW"; exit 1; }
command -v heaptrack >/dev/null || { echo "apt-get install -y heaptrack"; exit 1; }
PYTHON="${PYTHON:-}"
if [ -z "$PYTHON" ]; then
  if [ -x /usr/bin/python3 ]; then PYTHON=/usr/bin/python3; else PYTHON="$(command -v python3)"; fi
fi

W="$(mktemp -d)"
trap 'rm -rf "$W"' EXIT
g++ -O2 -pthread -o "$W/cw" scripts/stacks-workload.cpp

# best of 3: prints "wall cpu" in seconds
best3() {
  local best_wall=999999 best_cpu=999999
  for _ in 1 2 3; do
    { TIMEFORMAT='%3R %3U %3S'; time "$@" >/dev/null 2>&1; } 2> "$W/t" || { echo "failed: $*" >&2; exit 1; }
    read -r wall user sys < "$W/t"
    best_wall=$(echo "$wall $best_wall" | awk '{print ($1<$2)?$1:$2}')
    best_cpu=$(echo "$user $sys $best_cpu" | awk '{c=$1+$2; print (c<$3)?c:$3}')
    rm -rf "$W"/spool.* "$W"/ht.* "$W"/rec*.avt "$W"/.allocview-spool*
  done
  echo "$best_wall $best_cpu"
}

echo "allocview: $ALLOCVIEW"
echo "tracer:    $TRACER"
echo "python:    $PYTHON ($("$PYTHON" --version 2>&1))"
echo "heaptrack: $(heaptrack --version 2>&1 | head -1)"
echo "machine:   $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"

run_workload() {
  local name="$1"; shift
  echo
  echo "== $name: $*"
  printf '%-34s %8s %8s %9s\n' run wall_s cpu_s slowdown
  read -r bw bc < <(best3 "$@")
  printf '%-34s %8s %8s %9s\n' untraced "$bw" "$bc" 1.00
  row() {
    local label="$1"; shift
    read -r w c < <(best3 "$@")
    printf '%-34s %8s %8s %9.2f\n' "$label" "$w" "$c" "$(echo "$w $bw" | awk '{print $1/$2}')"
    echo "$label $w $c" >> "$W/rows"
  }
  : > "$W/rows"
  row "heaptrack (whole run)" heaptrack -o "$W/ht" "$@"
  row "allocview tracer, stacks" env LD_PRELOAD="$TRACER" ALLOCVIEW_SPOOL="$W/spool" ALLOCVIEW_STACKS=1 "$@"
  row "allocview tracer, no stacks" env LD_PRELOAD="$TRACER" ALLOCVIEW_SPOOL="$W/spool" "$@"
  row "allocview record (whole)" "$ALLOCVIEW" record -o "$W/rec.avt" -- "$@"
  row "allocview record --no-stacks" "$ALLOCVIEW" record --no-stacks -o "$W/rec.avt" -- "$@"
  local ht tr rec htc trc recc
  ht=$(awk '/^heaptrack/ {print $(NF-1)}' "$W/rows")
  tr=$(awk '/tracer, stacks/ {print $(NF-1)}' "$W/rows")
  rec=$(awk '/record \(whole\)/ {print $(NF-1)}' "$W/rows")
  htc=$(awk '/^heaptrack/ {print $NF}' "$W/rows")
  trc=$(awk '/tracer, stacks/ {print $NF}' "$W/rows")
  recc=$(awk '/record \(whole\)/ {print $NF}' "$W/rows")
  # The slowdowns' ratio is the times' ratio (same untraced run).
  echo "slowdown / heaptrack's (target <= 0.50), wall: tracer with stacks $(echo "$tr $ht" | awk '{printf "%.2f", $1/$2}'), record whole $(echo "$rec $ht" | awk '{printf "%.2f", $1/$2}'); cpu: tracer with stacks $(echo "$trc $htc" | awk '{printf "%.2f", $1/$2}'), record whole $(echo "$recc $htc" | awk '{printf "%.2f", $1/$2}')"
}

export PYTHONMALLOC=malloc
run_workload "Python, 4 threads" "$PYTHON" scripts/stacks-workload.py "$PY_N" 4
unset PYTHONMALLOC
run_workload "C++, -O2, 1 worker thread" "$W/cw" "$CPP_N" 1
