#!/usr/bin/env python3
"""The README's "Verified under faults" rows of one `distlock check --json` report.

Usage: check-row.py REPORT.json CONFIG   (prints a Markdown table row per kind)
"""
import json
import sys

report = json.load(open(sys.argv[1]))
for run in report["runs"]:
    stats, findings = run["verdict"]["stats"], run["verdict"]["findings"]
    faults = ", ".join(f"{k} {v}" for k, v in stats["faults"].items()) or "none"
    violations = sum(1 for f in findings if f["judgement"] == "violation")
    expected = len(findings) - violations
    final = stats.get("final_acquire")
    final = f"{final / 1e6:.0f} ms" if final is not None else "failed"
    print(f"| {sys.argv[2]} | {run['kind']} | {report['params']['guarantee']} | {faults} | "
          f"{stats['acquired']} / {stats['acquisitions']} | {stats['writes_accepted']} | "
          f"{stats['writes_rejected']} | {stats['checks_refused']} | {violations} | "
          f"{expected} | {stats['longest_gap'] / 1e6:.0f} ms | {final} |")
