#!/usr/bin/env bash
# Speed of the context models of `allocview predict` (issue 14's target: at least 10 million
# calls a second for order-8 on one core). For each shared malloc trace (and any extra files
# given), runs `predict --model order-8,order-4 --json` and prints the calls per CPU second of
# learning (the split's training pass), predicting (the frozen model on the held-out part,
# with top-1, top-3, label and log-loss) and online (predict, then learn, every call).
#
# Usage: scripts/bench-predict.sh [ALLOCVIEW] [EXTRA_TRACE...]   (default binary:
# target/release/allocview, from `cargo build --profile bench -p allocview`, if present).
# Needs python3 for the JSON and ../shared beside the repository for the shared traces.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=${1:-}
if [[ -z $bin ]]; then
    if [[ -x target/release/allocview ]]; then bin=target/release/allocview; else bin=target/debug/allocview; fi
else
    shift
fi
[[ -x $bin ]] || { echo "no allocview binary at $bin (cargo build --profile bench -p allocview)" >&2; exit 1; }
echo "binary: $bin ($(stat -c %y "$bin" | cut -d. -f1))"

traces=()
for t in find_usr_include xz_T2_8KiB_blocks git_log_p_gitui python311_json_re_sqlite; do
    f=../shared/data/traces/$t.trace.gz
    [[ -f $f ]] && traces+=("$f")
done
traces+=("$@")
[[ ${#traces[@]} -gt 0 ]] || { echo "no traces (../shared/data/traces missing)" >&2; exit 1; }

printf '%-34s %-8s %12s %12s %12s %12s\n' trace model calls train/s predict/s online/s
for f in "${traces[@]}"; do
    "$bin" predict "$f" --model order-8,order-4 --json 2>/dev/null | python3 -c '
import json, sys
v = json.load(sys.stdin)
name = sys.argv[1].rsplit("/", 1)[-1]
m = lambda x: "-" if x is None else f"{x / 1e6:.1f} M"
for r in v["models"]:
    speeds = [m(r[k]) for k in ("train_events_per_s", "predict_events_per_s", "online_events_per_s")]
    calls = "{:,}".format(v["events"])
    print("%-34s %-8s %12s %12s %12s %12s" % (name[:34], r["name"], calls, *speeds))
' "$f"
done
