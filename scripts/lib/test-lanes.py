#!/usr/bin/env python3
"""The lane plan of scripts/test.sh, from `cargo test --no-run --message-format=json`.

Reads cargo's JSON messages on stdin and prints one line per test binary,
"LANE<TAB>PACKAGE DIR<TAB>EXECUTABLE": the lane is the backend whose crate built it
(redis, etcd, zookeeper, sql), or "shared" for the crates that stop no server.
"""
import json
import os
import sys

LANES = {"lock-redis": "redis", "lock-etcd": "etcd", "lock-zk": "zookeeper", "lock-sql": "sql"}

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
    lane = LANES.get(os.path.basename(root), "shared")
    print(lane, root, msg["executable"], sep="\t")
