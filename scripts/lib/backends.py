#!/usr/bin/env python3
"""The workspace's backends, read from `cargo metadata --no-deps --format-version 1` on stdin.

Usage: backends.py features   the cargo features of distlock-cli's `all-backends`, one per line
       backends.py crates     "LANE<TAB>DIR" per backend crate: the facade's optional
                              dependencies, LANE their package name without "distlock-"

So scripts/test.sh names no backend: a new backend crate, once a dependency of the facade
and in `all-backends`, gets its lane of tests and its lints alone.
"""
import json
import os
import sys

metadata = json.load(sys.stdin)
packages = {p["name"]: p for p in metadata["packages"]}
if sys.argv[1:] == ["features"]:
    for feature in packages["distlock-cli"]["features"]["all-backends"]:
        print(feature)
elif sys.argv[1:] == ["crates"]:
    for dep in packages["distlock"]["dependencies"]:
        if dep.get("optional") and dep["name"] in packages and dep["name"] != "distlock-bench":
            root = os.path.dirname(packages[dep["name"]]["manifest_path"])
            print(dep["name"].removeprefix("distlock-"), root, sep="\t")
else:
    sys.exit(f"usage: {sys.argv[0]} features|crates")
