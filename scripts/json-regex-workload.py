"""Two Python threads doing JSON and regex work, for scripts/bench-record.sh's end-to-end
`record` figures (issue 16). Run it with PYTHONMALLOC=malloc so that every object
allocation goes through malloc."""
import json
import re
import sys
import threading

WORD = re.compile(r"[a-z]+(\d+)")


def work(n, seed):
    total = 0
    for i in range(n):
        doc = {"id": i + seed, "name": "item%d" % i, "tags": ["a%d" % (i % 7), "b"],
               "nested": {"x": i * 3, "y": [1, 2, 3]}}
        text = json.dumps(doc)
        back = json.loads(text)
        total += sum(int(m.group(1)) for m in WORD.finditer(back["name"] + " " + text))
    return total


n = int(sys.argv[1]) if len(sys.argv) > 1 else 14000
threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
ts = [threading.Thread(target=work, args=(n, t)) for t in range(threads)]
for t in ts:
    t.start()
for t in ts:
    t.join()
