#!/usr/bin/env python3
"""flaps-check.py REPORT.json: checks a `qpath lab flaps --json` report (tests/vm/run.sh flaps).

Prints the numbers issue #4 asks for and exits 0 only with zero I/O errors, zero verify
failures, every written block read back, at least two outages all run without a failed
flap command, both paths used, reconnected at least once and usable at the end.
"""
import json
import sys

v = json.load(open(sys.argv[1]))
w, r, ver, outs = v["write"], v["read_back"], v["verify"], v["outages"]
written = next(g for g in v["goals"] if g["what"] == "blocks read back / blocks written")["baseline"]
print("  flaps: %d writes, %d reads back; errors %d + %d; verify failures %d of %d checked (%d written)"
      % (w["ios"], r["ios"], w["errors"], r["errors"], ver["failures"], ver["checked"], written))
print("  worst completion writing %.0f us (p99.99 %.0f us), reading back %.0f us (p99.99 %.0f us)"
      % (w["lat_us"]["max"], w["lat_us"]["p99.99"], r["lat_us"]["max"], r["lat_us"]["p99.99"]))
print("  per path: %s; failovers %d; reconnects: %s"
      % (", ".join("%s %d" % (p["traddr"], p["ios"]) for p in v["paths"]), v["failovers"],
         ", ".join("%s %d" % (c["traddr"], c["reconnects"]) for c in v["controllers"])))
print("  outages %d: noticed %d, back %d, flap command errors %d"
      % (len(outs), sum(o["noticed_after_ms"] is not None for o in outs),
         sum(o["back_after_ms"] is not None for o in outs), sum(o["error"] is not None for o in outs)))
ok = (w["errors"] == 0 and r["errors"] == 0 and ver["failures"] == 0 and ver["checked"] > 0
      and ver["checked"] == written and len(outs) >= 2 and all(o["error"] is None for o in outs)
      and all(c["reconnects"] >= 1 for c in v["controllers"]) and v["recovered_at_end"]
      and all(p["ios"] > 0 for p in v["paths"]))
sys.exit(0 if ok else 1)
