"""Benchmark workload (a): JSON and regular expressions in two threads."""
import json
import re
import threading

WORD = re.compile(r"[a-z]+(\d+)")


def work(seed: int) -> int:
    total = 0
    for round_ in range(60):
        doc = {"items": [{"id": i, "name": f"item{seed}{i}", "tags": ["a", "b", str(i)]}
                         for i in range(2000)]}
        text = json.dumps(doc)
        back = json.loads(text)
        total += sum(int(m.group(1)) for m in WORD.finditer(text[:20000]))
        total += len(back["items"])
    return total


threads = [threading.Thread(target=work, args=(s,)) for s in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
