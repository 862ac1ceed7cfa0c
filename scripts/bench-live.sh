#!/usr/bin/env bash
# Issue 42: what watching a run live costs the recorded program. The workloads of
# scripts/bench-stacks.sh, made longer (a live view is for runs that last), each recorded
# three ways, interleaved, ROUNDS times:
#   record        allocview record (no viewer)
#   record --live allocview record --live, the terminal explorer in tmux following the run
#   record --gui  allocview record --gui, the desktop explorer in Xvfb following the run
# For each: the program's own duration (its first to last event, from the trace: what the
# viewer might slow down), the wall time until the trace is written, the CPU seconds of the
# recording without a viewer (allocview record and the program), and the viewer's own CPU
# seconds and peak resident memory (the explorer's process; its `record` child is the same
# recording as the first).
#
# usage: scripts/bench-live.sh [ROUNDS] [PY_ITEMS_PER_THREAD] [CPP_ROUNDS] [JSON_ITEMS]
#        (defaults 3, 1500000, 12000, 100000)
# env:   ALLOCVIEW (default target/release/allocview), PYTHON (default /usr/bin/python3),
#        ONLY=python, ONLY=c++ or ONLY=json for one workload
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${1:-3}"
PY_N="${2:-1500000}"
CPP_N="${3:-12000}"
JSON_N="${4:-100000}"
ALLOCVIEW="$(realpath "${ALLOCVIEW:-target/release/allocview}")"
[ -x "$ALLOCVIEW" ] || { echo "build allocview first (cargo build --release -p allocview)"; exit 1; }
PYTHON="${PYTHON:-/usr/bin/python3}"
for t in tmux xvfb-run g++; do command -v $t >/dev/null || { echo "needs $t"; exit 1; }; done

W="$(mktemp -d)"
trap 'tmux kill-session -t bench-live 2>/dev/null || true; rm -rf "$W"' EXIT
g++ -O2 -pthread -o "$W/cw" scripts/stacks-workload.cpp

# The viewer's own CPU seconds (user + system) and peak resident MiB, "cpu_s mib", read with
# shell builtins (no process started: see `watched`).
viewer_figures() {
  local stat line hwm=0
  read -r -a stat < "/proc/$1/stat"
  while read -r line; do
    case "$line" in VmHWM:*) read -r _ hwm _ <<< "$line" ;; esac
  done < "/proc/$1/status"
  echo "$(( (stat[13] + stat[14]) / 100 )).$(printf '%02d' $(( (stat[13] + stat[14]) % 100 ))) $(( hwm / 1024 ))"
}

# Whether the log $1 says the recording has ended (shell builtins only).
recorded() {
  local line
  [ -f "$1" ] || return 1
  while IFS= read -r line; do
    case "$line" in "recorded "*) return 0 ;; esac
  done < "$1"
  return 1
}

# The program's duration in the trace, in seconds.
duration() {
  "$ALLOCVIEW" stats "$1" --json | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["duration_s"])'
}

# record without a viewer: prints "program_s wall_s record_cpu_s viewer_cpu_s".
plain() {
  local out="$W/plain.avt"
  rm -f "$out"
  { TIMEFORMAT='%3R %3U %3S'; time "$ALLOCVIEW" record -o "$out" -- "$@" >/dev/null 2>&1; } 2> "$W/t"
  read -r wall user sys < "$W/t"
  echo "$(duration "$out") $wall $(echo "$user $sys" | awk '{print $1+$2}') - -"
}

# record --live / --gui: the explorer follows until the recording has ended, then quits.
watched() {
  local mode="$1"; shift
  local out="$W/live.avt"
  rm -f "$out" "$out.log"
  local start end cmd
  start=$(date +%s.%N)
  if [ "$mode" = live ]; then
    cmd="exec $ALLOCVIEW record --live -o $out -- $*"
    tmux new-session -d -s bench-live -x 200 -y 50 "$cmd"
    sleep 0.3
    viewer=$(tmux list-panes -t bench-live -F '#{pane_pid}')
  else
    xvfb-run -a -s "-screen 0 1600x1000x24" "$ALLOCVIEW" record --gui -o "$out" -- "$@" \
      > /dev/null 2>&1 &
    local xvfb=$!
    sleep 1
    viewer=$(pgrep -f "^$ALLOCVIEW record --gui -o $out" | head -1)
  fi
  # The recording is the viewer's child `allocview record`; it has ended when the log says so.
  # Looked at with shell builtins and one `sleep` a tenth of a second: a poll that started
  # grep and awk every 50 ms cost the watched runs a tenth of a core that `record` alone
  # was not charged.
  until recorded "$out.log"; do
    sleep 0.1
  done
  end=$(date +%s.%N)
  local figures
  figures=$(viewer_figures "$viewer")
  if [ "$mode" = live ]; then
    tmux send-keys -t bench-live q
    while tmux has-session -t bench-live 2>/dev/null; do sleep 0.05; done
  else
    kill "$viewer" 2>/dev/null || true
    wait "$xvfb" 2>/dev/null || true
  fi
  echo "$(duration "$out") $(echo "$end $start" | awk '{printf "%.3f", $1-$2}') - $figures"
}

echo "allocview: $ALLOCVIEW"
echo "python:    $PYTHON ($("$PYTHON" --version 2>&1))"
echo "machine:   $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
bench() {
  local name="$1"; shift
  echo
  echo "== $name: $*"
  local f='%-16s %10s %8s %12s %12s %15s\n'
  printf "$f" mode program_s wall_s record_cpu_s viewer_cpu_s viewer_peak_mib
  for _ in $(seq "$ROUNDS"); do
    printf "$f" record $(plain "$@")
    printf "$f" "record --live" $(watched live "$@")
    printf "$f" "record --gui" $(watched gui "$@")
  done
}
# Set here, not through `env`: `env` would exec the interpreter, a second process image with a
# trace of its own.
export PYTHONMALLOC=malloc
case "${ONLY:-all}" in python | all) bench python "$PYTHON" scripts/stacks-workload.py "$PY_N" 2 ;; esac
case "${ONLY:-all}" in c++ | all) bench c++ "$W/cw" "$CPP_N" ;; esac
# Not one the explorer's settings were tuned on: bench-record.sh's JSON and regex threads.
case "${ONLY:-all}" in json | all) bench json "$PYTHON" scripts/json-regex-workload.py "$JSON_N" 2 ;; esac
