#!/usr/bin/env python3
"""bench-check.py REPORT.json JOBS: a `qpath bench --output-format=json` report passes when it
holds exactly JOBS jobs, each with error 0, some data written, and at least as much read back
as written (verify=... reads every written block back and checks it)."""
import json
import sys

report, want = sys.argv[1], int(sys.argv[2])
doc = json.load(open(report))
bad = 0
for j in doc["jobs"]:
    w, r = j["write"]["io_bytes"], j["read"]["io_bytes"]
    ok = j["error"] == 0 and w > 0 and r >= w
    bad += not ok
    print("  job %s: error=%s written=%d read back=%d %s" % (j["jobname"], j["error"], w, r, "ok" if ok else "BAD"))
if len(doc["jobs"]) != want:
    print("  %d jobs in the report, expected %d" % (len(doc["jobs"]), want))
    bad += 1
sys.exit(1 if bad else 0)
