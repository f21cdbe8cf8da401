#!/usr/bin/env python3
"""10,000 result records for timing `netgap report`: every record of the
given results files, repeated under a label per repeat (so each repeat is
a run of its own: dozens of series per test, split into many plots), until
10,000. Usage:

    python3 bench/report-10k.py tests/fixtures/report/*.jsonl > 10k.jsonl
    time target/release/netgap report 10k.jsonl -o 10k.html
"""
import json, sys
src = []
for f in sys.argv[1:]:
    src += [json.loads(l) for l in open(f) if l.strip()]
out = []
i = 0
while len(out) < 10000:
    for r in src:
        if len(out) >= 10000: break
        r = dict(r)
        st = dict(r.get("stack") or {"transport": r["transport"], "mode": r["mode"], "options": [], "path": {}})
        st["label"] = "run %d" % i
        r["stack"] = st
        out.append(r)
    i += 1
for r in out: print(json.dumps(r))
