#!/usr/bin/env bash
# Benchmarks for `allocview record` (issue 8), all in one run on this machine:
#  1. the slowdown of a workload that does nothing but allocate (scripts/alloc-workload.c),
#     untraced, under allocview's tracer, and under a mutex-and-write()-per-call interposer
#     (scripts/naive-interposer.c); CPU seconds (user+sys, best of 3) and wall seconds;
#     single-threaded (the tracer's cheap mode: no per-call clock read) and with 4 threads
#     sharing the same total work (every event then also reads the TSC for its order key);
#  2. reading the recording: `allocview stats` on the binary trace against `heaptrack_print`
#     on heaptrack's recording of the same workload (wall seconds, best of 3), and file sizes;
#  2b. `record` end to end against the untraced wall time, and heaptrack, on two Python
#     threads doing JSON and regex work (scripts/json-regex-workload.py: issue 16's workload);
#  3. the cost of the tracer's clock thread in an idle program: CPU seconds of `sleep 10`,
#     untraced and under the tracer.
# `record` runs with --no-stacks here (issue 8's figures); scripts/bench-stacks.sh measures
# call stacks against heaptrack.
#
# usage: scripts/bench-record.sh [ITERATIONS] [SLOWDOWN_ITERATIONS]
#        (defaults 2800000, i.e. 5.6 million events, for part 2, and 20000000 for part 1; times
#        come from bash's `time`, to the millisecond)
# env:   ALLOCVIEW=path/to/allocview (default: target/bench/allocview, else target/debug/...)
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-2800000}"
NS="${2:-20000000}"
ALLOCVIEW="${ALLOCVIEW:-}"
if [ -z "$ALLOCVIEW" ]; then
  for p in target/bench/allocview target/release/allocview target/debug/allocview; do
    if [ -x "$p" ]; then ALLOCVIEW="$p"; break; fi
  done
fi
[ -x "$ALLOCVIEW" ] || { echo "build allocview first (cargo build --profile bench -p allocview)"; exit 1; }
profile_dir="$(dirname "$ALLOCVIEW")"
TRACER="$(ls -t "$profile_dir"/build/allocview-*/out/liballocview_tracer.so 2>/dev/null | head -1)"
[ -f "$TRACER" ] || { echo "no tracer next to $ALLOCVIEW"; exit 1; }
command -v heaptrack >/dev/null || { echo "apt-get install -y heaptrack"; exit 1; }

W="$(mktemp -d)"
trap 'rm -rf "$W"' EXIT
cc -O2 -pthread -o "$W/wl" scripts/alloc-workload.c
cc -O2 -shared -fPIC -o "$W/naive.so" scripts/naive-interposer.c -ldl -pthread

# best of 3: prints "wall cpu" in seconds (CPU: user + system of the command and its children)
best3() {
  local best_wall=999999 best_cpu=999999
  for _ in 1 2 3; do
    { TIMEFORMAT='%3R %3U %3S'; time "$@" >/dev/null 2>&1; } 2> "$W/t" || { echo "failed: $*" >&2; exit 1; }
    read -r wall user sys < "$W/t"
    best_wall=$(echo "$wall $best_wall" | awk '{print ($1<$2)?$1:$2}')
    best_cpu=$(echo "$user $sys $best_cpu" | awk '{c=$1+$2; print (c<$3)?c:$3}')
    rm -f "$W"/spool.* "$W/naive.txt"
  done
  echo "$best_wall $best_cpu"
}

echo "allocview: $ALLOCVIEW"
echo "tracer:    $TRACER"
echo "machine:   $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "== 1. slowdown, $NS iterations ($((2 * NS)) events) per mode, single thread"
printf '%-8s %-28s %9s %9s %8s %8s\n' mode run wall_s cpu_s x_cpu x_wall
for mode in pairs mixed; do
  read -r bw bc < <(best3 "$W/wl" "$mode" "$NS")
  printf '%-8s %-28s %9s %9s %8s %8s\n' "$mode" untraced "$bw" "$bc" 1.00 1.00
  read -r w c < <(best3 env LD_PRELOAD="$TRACER" ALLOCVIEW_SPOOL="$W/spool" "$W/wl" "$mode" "$NS")
  printf '%-8s %-28s %9s %9s %8.2f %8.2f\n' "$mode" "allocview tracer" "$w" "$c" "$(echo "$c $bc" | awk '{print $1/$2}')" "$(echo "$w $bw" | awk '{print $1/$2}')"
  read -r w c < <(best3 "$ALLOCVIEW" record --no-stacks -o "$W/rec.avt" -- "$W/wl" "$mode" "$NS")
  printf '%-8s %-28s %9s %9s %8.2f %8.2f\n' "$mode" "allocview record (all)" "$w" "$c" "$(echo "$c $bc" | awk '{print $1/$2}')" "$(echo "$w $bw" | awk '{print $1/$2}')"
  read -r w c < <(best3 env LD_PRELOAD="$W/naive.so" NAIVE_TRACE_OUT="$W/naive.txt" "$W/wl" "$mode" "$NS")
  printf '%-8s %-28s %9s %9s %8.2f %8.2f\n' "$mode" "mutex+write() interposer" "$w" "$c" "$(echo "$c $bc" | awk '{print $1/$2}')" "$(echo "$w $bw" | awk '{print $1/$2}')"
done

echo
echo "== 1b. slowdown, 4 threads x $((NS / 4)) iterations ($((2 * NS)) events in all) per mode"
printf '%-8s %-28s %9s %9s %8s %8s\n' mode run wall_s cpu_s x_cpu x_wall
for mode in pairs mixed; do
  read -r bw bc < <(best3 "$W/wl" "$mode" "$((NS / 4))" 4)
  printf '%-8s %-28s %9s %9s %8s %8s\n' "$mode" untraced "$bw" "$bc" 1.00 1.00
  read -r w c < <(best3 env LD_PRELOAD="$TRACER" ALLOCVIEW_SPOOL="$W/spool" "$W/wl" "$mode" "$((NS / 4))" 4)
  printf '%-8s %-28s %9s %9s %8.2f %8.2f\n' "$mode" "allocview tracer" "$w" "$c" "$(echo "$c $bc" | awk '{print $1/$2}')" "$(echo "$w $bw" | awk '{print $1/$2}')"
  read -r w c < <(best3 "$ALLOCVIEW" record --no-stacks -o "$W/rec.avt" -- "$W/wl" "$mode" "$((NS / 4))" 4)
  printf '%-8s %-28s %9s %9s %8.2f %8.2f\n' "$mode" "allocview record (all)" "$w" "$c" "$(echo "$c $bc" | awk '{print $1/$2}')" "$(echo "$w $bw" | awk '{print $1/$2}')"
  read -r w c < <(best3 env LD_PRELOAD="$W/naive.so" NAIVE_TRACE_OUT="$W/naive.txt" "$W/wl" "$mode" "$((NS / 4))" 4)
  printf '%-8s %-28s %9s %9s %8.2f %8.2f\n' "$mode" "mutex+write() interposer" "$w" "$c" "$(echo "$c $bc" | awk '{print $1/$2}')" "$(echo "$w $bw" | awk '{print $1/$2}')"
done

echo
echo "== 2. reading the recording of: alloc-workload mixed $N"
"$ALLOCVIEW" record --no-stacks -o "$W/mixed.avt" -- "$W/wl" mixed "$N" >/dev/null
"$ALLOCVIEW" convert "$W/mixed.avt" "$W/mixed.trace.gz" 2>/dev/null
(cd "$W" && heaptrack -o "$W/ht" "$W/wl" mixed "$N" >/dev/null 2>&1)
HT="$(ls "$W"/ht.* | head -1)"
printf '%-44s %12s\n' file bytes
printf '%-44s %12s\n' "allocview binary (.avt)" "$(stat -c %s "$W/mixed.avt")"
printf '%-44s %12s\n' "libtracemalloc text, gzip" "$(stat -c %s "$W/mixed.trace.gz")"
printf '%-44s %12s\n' "heaptrack ($(basename "$HT"))" "$(stat -c %s "$HT")"
read -r w_av _ < <(best3 "$ALLOCVIEW" stats "$W/mixed.avt")
read -r w_txt _ < <(best3 "$ALLOCVIEW" stats "$W/mixed.trace.gz")
read -r w_zcat _ < <(best3 sh -c "zcat '$W/mixed.trace.gz' > /dev/null")
read -r w_ht _ < <(best3 heaptrack_print "$HT")
echo
printf '%-44s %9s\n' "reader" wall_s
printf '%-44s %9s\n' "allocview stats (binary)" "$w_av"
printf '%-44s %9s\n' "allocview stats (text gzip)" "$w_txt"
printf '%-44s %9s\n' "zcat of the text gzip" "$w_zcat"
printf '%-44s %9s\n' "heaptrack_print (heaptrack's recording)" "$w_ht"
echo "load_seconds of the binary: $("$ALLOCVIEW" stats --json "$W/mixed.avt" | sed 's/.*"load_seconds":\([0-9.e-]*\).*/\1/')"

echo
echo "== 2b. record end to end (program start to trace written): two Python threads doing JSON"
echo "   and regex work (scripts/json-regex-workload.py, PYTHONMALLOC=malloc, about 5.6 million"
echo "   events); issue 16's target: at most 2x the untraced wall time"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x /usr/bin/python3 ]; then PY=/usr/bin/python3; else PY="$(command -v python3)"; fi
fi
export PYTHONMALLOC=malloc
printf '%-36s %9s %9s %8s\n' run wall_s cpu_s x_wall
read -r bw bc < <(best3 "$PY" scripts/json-regex-workload.py)
printf '%-36s %9s %9s %8s\n' untraced "$bw" "$bc" 1.00
for row in "allocview record --no-stacks|$ALLOCVIEW record --no-stacks -o $W/rec.avt --" \
           "allocview record (stacks)|$ALLOCVIEW record -o $W/rec.avt --" \
           "heaptrack (whole run)|heaptrack -o $W/htj"; do
  label="${row%%|*}"
  # shellcheck disable=SC2086
  read -r w c < <(best3 ${row#*|} "$PY" scripts/json-regex-workload.py)
  rm -f "$W"/htj.*
  printf '%-36s %9s %9s %8.2f\n' "$label" "$w" "$c" "$(echo "$w $bw" | awk '{print $1/$2}')"
done
unset PYTHONMALLOC

echo
echo "== 3. idle: sleep 10 (the tracer's clock thread wakes every millisecond)"
{ TIMEFORMAT='%3U %3S'; time sleep 10; } 2> "$W/t"
read -r u s < "$W/t"
printf '%-44s %9s\n' "untraced, cpu_s" "$(echo "$u $s" | awk '{print $1+$2}')"
{ TIMEFORMAT='%3U %3S'; time env LD_PRELOAD="$TRACER" ALLOCVIEW_SPOOL="$W/idle" sleep 10; } 2> "$W/t"
read -r u s < "$W/t"
printf '%-44s %9s\n' "under the tracer, cpu_s" "$(echo "$u $s" | awk '{print $1+$2}')"
