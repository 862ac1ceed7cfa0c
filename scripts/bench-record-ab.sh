#!/usr/bin/env bash
# `allocview record` as a whole (the user's wait: the run, the conversion left at its end, the
# symbolization) with two builds side by side, on the workloads of scripts/bench-stacks.sh
# (multi-threaded Python, PYTHONMALLOC=malloc; C++ -O2) and one nobody tuned on
# (scripts/json-regex-workload.py). Runs alternate A, B, A, B... so that a busy machine slows
# both alike; each build's median and best wall seconds are printed, with B's median over A's.
# Used for changes to the conversion (the stacks written and symbolized while the program
# runs, issue 42): the tracer is the same in both.
#
# usage: scripts/bench-record-ab.sh ALLOCVIEW_A ALLOCVIEW_B [RUNS]   (default 7)
# env:   PYTHON=python interpreter (default /usr/bin/python3, else python3); ONLY=python|c++|json
set -euo pipefail
cd "$(dirname "$0")/.."
A="$1"; B="$2"; RUNS="${3:-7}"
[ -x "$A" ] && [ -x "$B" ] || { echo "usage: $0 ALLOCVIEW_A ALLOCVIEW_B [RUNS]"; exit 1; }
PYTHON="${PYTHON:-}"
if [ -z "$PYTHON" ]; then
  if [ -x /usr/bin/python3 ]; then PYTHON=/usr/bin/python3; else PYTHON="$(command -v python3)"; fi
fi
W="$(mktemp -d)"
trap 'rm -rf "$W"' EXIT
g++ -O2 -pthread -o "$W/cw" scripts/stacks-workload.cpp

echo "A:       $A"
echo "B:       $B"
echo "python:  $PYTHON ($("$PYTHON" --version 2>&1))"
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "runs:    $RUNS each, alternating"

bench() {
  local name="$1"; shift
  : > "$W/times"
  for _ in $(seq "$RUNS"); do
    for build in A B; do
      local bin="$A"; [ "$build" = B ] && bin="$B"
      { TIMEFORMAT='%3R'; time "$bin" record -o "$W/rec.avt" -- "$@" >/dev/null 2>&1; } 2> "$W/t" \
        || { echo "failed: $bin record -- $*" >&2; exit 1; }
      echo "$build $(tail -1 "$W/t")" >> "$W/times"
      rm -rf "$W"/rec*.avt "$W"/.allocview-*
    done
  done
  stat() { awk -v b="$1" '$1==b {print $2}' "$W/times" | sort -n | awk '{a[NR]=$1} END {printf "%.3f %.3f", a[int((NR+1)/2)], a[1]}'; }
  read -r ma ba <<< "$(stat A)"
  read -r mb bb <<< "$(stat B)"
  printf "%-22s A median %6.3f s (best %6.3f)  B median %6.3f s (best %6.3f)  B/A %.2f\n" \
    "$name" "$ma" "$ba" "$mb" "$bb" "$(echo "$mb $ma" | awk '{print $1/$2}')"
}

case "${ONLY:-all}" in python | all) PYTHONMALLOC=malloc bench "Python, 4 threads" "$PYTHON" scripts/stacks-workload.py 200000 4 ;; esac
case "${ONLY:-all}" in c++ | all) bench "C++, 1 worker thread" "$W/cw" 2000 1 ;; esac
case "${ONLY:-all}" in json | all) bench "json-regex (untuned)" "$PYTHON" scripts/json-regex-workload.py 100000 2 ;; esac
