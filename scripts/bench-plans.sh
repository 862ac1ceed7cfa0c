#!/usr/bin/env bash
# Benchmarks of the static planners through `allocview plan` (issue 5's targets):
#  1. the 11 minimalloc "challenging" instances at capacity 1,048,576: greedy-by-size's height
#     as a ratio to the capacity, and how long `search` takes to fit each;
#  2. greedy-by-size on 100,000 synthetic buffers (seeded), the time of the planner alone;
#  3. the torchvision CNN plans: greedy-by-size against the max-live lower bound.
#
# Usage: scripts/bench-plans.sh [ALLOCVIEW]   (default: target/release/allocview if present,
# else target/debug/allocview; the script says which). Needs python3 for the JSON.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=${1:-}
if [[ -z $bin ]]; then
    if [[ -x target/release/allocview ]]; then bin=target/release/allocview; else bin=target/debug/allocview; fi
fi
[[ -x $bin ]] || { echo "no allocview binary at $bin (cargo build -p allocview)" >&2; exit 1; }
echo "binary: $bin ($(stat -c %y "$bin" | cut -d. -f1))"
budget=${SEARCH_BUDGET_S:-120}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo
echo "== minimalloc challenging instances, capacity 1,048,576 (search budget ${budget} s)"
printf '%-6s %8s %10s %10s %8s %9s %6s %10s\n' file buffers max-live greedy g/cap search fits 'published'
declare -A published=([A]=4910 [B]=3661 [C]=637 [D]=2674 [E]=3717 [F]=5358 [G]=1181 [H]=1808 [I]=3908 [J]=883 [K]=628)
for f in sim/tests/data/minimalloc/[A-K].1048576.csv; do
    name=$(basename "$f" .1048576.csv)
    "$bin" plan "$f" --capacity 1048576 --planner greedy-by-size,search --time-budget "$budget" \
        --json --out "$work/$name.csv" 2>/dev/null >"$work/$name.json"
    python3 - "$work/$name.json" "$name" "${published[$name]}" <<'EOF'
import json, sys
v = json.load(open(sys.argv[1]))
p = {x["name"]: x for x in v["planners"]}
g, s = p["greedy-by-size"], p["search"]
print(f'{sys.argv[2]:<6} {v["buffers"]:>8} {v["lower_bound_bytes"]:>10} {g["total_bytes"]:>10} '
      f'{g["total_bytes"] / v["capacity_bytes"]:>8.3f} {s["seconds"]:>8.3f}s {str(s["fits"]):>6} '
      f'{int(sys.argv[3]) / 1000:>9.3f}s')
EOF
done

echo
echo "== greedy-by-size on 100,000 buffers (two seeded shapes; the planner's own time)"
python3 - "$work" <<'EOF'
import random, sys
rng = random.Random(5)
# trace-like (the recipe of sim/tests/planners_vectors.rs): a start every two time units, 90%
# short-lived (up to 200 units), 9% medium (up to 20,000), 1% long (up to 200,000); sizes
# 16 B << 0..16 plus up to as much again. About a thousand buffers live at any time.
with open(f"{sys.argv[1]}/trace-like.csv", "w") as f:
    f.write("id,lower,upper,size\n")
    for i in range(100_000):
        lo = 2 * i + rng.randrange(2)
        r = rng.randrange(100)
        life = 1 + rng.randrange(200 if r < 90 else 20_000 if r < 99 else 200_000)
        size = 16 << rng.randrange(17)
        f.write(f"{i},{lo},{lo + life},{size + rng.randrange(size)}\n")
# wide: starts uniform over 1e6 units, lifetimes log-uniform 1..1e5, sizes log-uniform 16 B to
# 1 MiB: about 870 live on average, but the long-lived ones overlap thousands of others.
with open(f"{sys.argv[1]}/wide.csv", "w") as f:
    f.write("id,lower,upper,size\n")
    for i in range(100_000):
        lo = rng.randrange(1_000_000)
        life = int(10 ** rng.uniform(0, 5))
        size = 16 * int(10 ** rng.uniform(0, 4.8))
        f.write(f"{i},{lo},{lo + life},{size}\n")
EOF
for shape in trace-like wide; do
    for run in 1 2 3; do
        "$bin" plan "$work/$shape.csv" --planner greedy-by-size,pushdown --json 2>/dev/null >"$work/100k.json"
        python3 - "$work/100k.json" "$shape" <<'EOF'
import json, sys
v = json.load(open(sys.argv[1]))
for p in v["planners"]:
    print(f'{sys.argv[2]:<11} {p["name"]:<16} {p["seconds"]:.3f} s  total {p["total_bytes"]:,} B  '
          f'bound {v["lower_bound_bytes"]:,} B  ratio {p["ratio_to_lower_bound"]:.4f}')
EOF
    done
done

echo
echo "== CNN plans (sample-traces/plans): greedy-by-size against the max-live bound"
printf '%-20s %8s %12s %12s %8s %12s %12s %6s\n' model buffers max-live greedy ratio pushdown search proven
for f in sample-traces/plans/*.csv; do
    "$bin" plan "$f" --planner greedy-by-size,pushdown,search --time-budget 30 --json 2>/dev/null >"$work/cnn.json"
    python3 - "$work/cnn.json" <<'EOF'
import json, sys
v = json.load(open(sys.argv[1]))
p = {x["name"]: x for x in v["planners"]}
g, d, s = p["greedy-by-size"], p["pushdown"], p["search"]
name = v["file"].rsplit("/", 1)[-1].removesuffix(".csv")
print(f'{name:<20} {v["buffers"]:>8} {v["lower_bound_bytes"]:>12,} {g["total_bytes"]:>12,} '
      f'{g["ratio_to_lower_bound"]:>8.4f} {d["total_bytes"]:>12,} {s["total_bytes"]:>12,} '
      f'{str(s["proven_optimal"]):>6}')
EOF
done
