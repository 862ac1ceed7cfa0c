#!/usr/bin/env bash
# Issue 42: the cost of sampled stacks (`record --stack-sample SIZE`) against `--no-stacks` and
# against a stack per allocation, on the workloads of scripts/bench-stacks.sh: multi-threaded
# Python (scripts/stacks-workload.py, PYTHONMALLOC=malloc) and C++ (scripts/stacks-workload.cpp,
# -O2). Runs are interleaved (untraced, no stacks, sampled, full; then again) so that a busy
# machine slows every mode alike; each mode's median and best wall seconds are printed, and
# the ratios of the medians to `--no-stacks`'s.
#
# Two measures: "tracer" is the traced program's own run with the tracer preloaded as `record`
# sets it (what production pays while it runs); "record" is `allocview record` as a whole
# (the run, then the conversion left when it ends and the symbolization, done by this
# allocview: a debug build makes that part slower, the tracer is optimised in every build).
#
# usage: scripts/bench-stack-sample.sh [RUNS] [SIZE_BYTES] [PY_ITEMS_PER_THREAD] [CPP_ROUNDS]
#        (defaults 7, 524288, 200000, 2000)
# env:   ALLOCVIEW=path/to/allocview (default: target/release/allocview, else target/debug)
#        PYTHON=python interpreter (default /usr/bin/python3, else python3)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS="${1:-7}"
SAMPLE="${2:-524288}"
PY_N="${3:-200000}"
CPP_N="${4:-2000}"
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
PYTHON="${PYTHON:-}"
if [ -z "$PYTHON" ]; then
  if [ -x /usr/bin/python3 ]; then PYTHON=/usr/bin/python3; else PYTHON="$(command -v python3)"; fi
fi

W="$(mktemp -d)"
trap 'rm -rf "$W"' EXIT
g++ -O2 -pthread -o "$W/cw" scripts/stacks-workload.cpp

echo "allocview: $ALLOCVIEW"
echo "tracer:    $TRACER"
echo "python:    $PYTHON ($("$PYTHON" --version 2>&1))"
echo "machine:   $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "runs:      $RUNS each, interleaved; sample interval $SAMPLE bytes"

# One timed run of "$@": appends "label wall" to $W/times.
one() {
  local label="$1"; shift
  { TIMEFORMAT='%3R'; time "$@" >/dev/null 2>&1; } 2> "$W/t" || { echo "failed: $*" >&2; exit 1; }
  echo "$label $(tail -1 "$W/t")" >> "$W/times"
  rm -rf "$W"/spool.* "$W"/rec*.avt "$W"/.allocview-spool*
}

tracer() {
  local stacks="$1" sample="$2"; shift 2
  env LD_PRELOAD="$TRACER" ALLOCVIEW_SPOOL="$W/spool" ALLOCVIEW_STACKS="$stacks" \
    ALLOCVIEW_STACK_SAMPLE="$sample" "$@"
}

run_workload() {
  local name="$1"; shift
  : > "$W/times"
  for _ in $(seq "$RUNS"); do
    one untraced "$@"
    one "tracer_no_stacks" tracer 0 0 "$@"
    one "tracer_sampled" tracer 1 "$SAMPLE" "$@"
    one "tracer_full_stacks" tracer 1 0 "$@"
    one "record_no_stacks" "$ALLOCVIEW" record --no-stacks -o "$W/rec.avt" -- "$@"
    one "record_sampled" "$ALLOCVIEW" record --stack-sample "$SAMPLE" -o "$W/rec.avt" -- "$@"
    one "record_full_stacks" "$ALLOCVIEW" record -o "$W/rec.avt" -- "$@"
  done
  echo
  echo "== $name: $*"
  awk '
    { t[$1] = t[$1] " " $2; order[$1] = NR }
    function med(s,   a, n, i, j, x) {
      n = split(s, a, " ")
      for (i = 2; i <= n; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > x + 0; j--) a[j + 1] = a[j]; a[j + 1] = x }
      best = a[1]
      return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    END {
      printf "%-20s %9s %9s %12s\n", "mode", "median_s", "best_s", "median/none"
      split("untraced tracer_no_stacks tracer_sampled tracer_full_stacks record_no_stacks record_sampled record_full_stacks", modes, " ")
      for (k = 1; k <= 7; k++) { m[modes[k]] = med(t[modes[k]]); b[modes[k]] = best }
      for (k = 1; k <= 7; k++) {
        mode = modes[k]; base = (mode ~ /^record/) ? m["record_no_stacks"] : m["tracer_no_stacks"]
        printf "%-20s %9.3f %9.3f %12s\n", mode, m[mode], b[mode], (mode == "untraced") ? "" : sprintf("%.2f", m[mode] / base)
      }
    }' "$W/times"
}

export PYTHONMALLOC=malloc
run_workload "Python, 4 threads" "$PYTHON" scripts/stacks-workload.py "$PY_N" 4
unset PYTHONMALLOC
run_workload "C++, -O2, 1 worker thread" "$W/cw" "$CPP_N" 1
