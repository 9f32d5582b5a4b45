#!/usr/bin/env python3
"""The lane plan of scripts/test.sh, from `cargo test --no-run --message-format=json`.

Usage: test-lanes.py CRATES < cargo's JSON messages
CRATES: a file of "LANE<TAB>DIR" lines, the backend crates (scripts/lib/backends.py crates).
Prints one line per test binary, "LANE<TAB>PACKAGE DIR<TAB>EXECUTABLE": the lane of the
backend crate that built it, or "shared" for the crates that stop no server.
"""
import json
import os
import sys

with open(sys.argv[1]) as crates:
    LANES = {root: lane for lane, root in (line.rstrip("\n").split("\t") for line in crates)}

for line in sys.stdin:
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
        continue
    if not msg["profile"]["test"]:
        continue
    root = os.path.dirname(msg["manifest_path"])
    print(LANES.get(root, "shared"), root, msg["executable"], sep="\t")
