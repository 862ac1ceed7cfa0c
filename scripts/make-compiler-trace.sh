#!/usr/bin/env bash
# A 25-million-event malloc trace of GCC's cc1plus compiling a template-heavy C++ file
# (generated here: 300 class templates over std::map, std::unordered_map, std::vector and
# std::string, each instantiated three times), recorded without stacks. The biggest of the
# traces `record` writes (one per process: g++, cc1plus, as) is cc1plus's.
#
#   bash scripts/make-compiler-trace.sh OUT_DIR [ALLOCVIEW]
set -euo pipefail
out="${1:?usage: make-compiler-trace.sh OUT_DIR [ALLOCVIEW]}"
allocview="${2:-target/release/allocview}"
mkdir -p "$out"
python3 - "$out/big.cpp" <<'PY'
import sys
lines = ["#include <bits/stdc++.h>"]
for i in range(300):
    lines.append(f"""
template<typename T> struct S{i} {{ std::map<T, std::vector<std::string>> m; std::unordered_map<std::string, T> u;
  void add(T k, const std::string& s) {{ m[k].push_back(s); u[s] = k; std::sort(m[k].begin(), m[k].end()); }}
  size_t f() const {{ size_t n = 0; for (auto& [k, v] : m) n += v.size() + std::accumulate(v.begin(), v.end(), std::string()).size(); return n; }}
}};
size_t use{i}() {{ S{i}<long> a; S{i}<double> b; S{i}<std::string> c; a.add({i}, "x"); b.add({i}.5, "y"); c.add("z", "w"); return a.f() + b.f() + c.f(); }}""")
open(sys.argv[1], "w").write("\n".join(lines))
PY
"$allocview" record --no-stacks -o "$out/cc.avt" -- g++ -O2 -c "$out/big.cpp" -o /dev/null
ls -S "$out"/cc.*.avt | head -1
