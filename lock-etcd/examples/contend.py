#!/usr/bin/env python3
"""Merge contend outputs (acquired_us released_us waited_us per line, one file per process)."""
import sys
ev = []
for i, f in enumerate(sys.argv[1:]):
    for line in open(f):
        p = line.split()
        if len(p) != 3: continue
        a, r, w = map(int, p)
        ev.append((a, r, w, i))
ev.sort()
# skip the first 0.5 s as warm-up
t0 = ev[0][0] + 500_000
ev = [e for e in ev if e[0] >= t0]
hand = []
for prev, cur in zip(ev, ev[1:]):
    if cur[3] != prev[3]:
        hand.append((cur[0] - prev[1]) / 1000)
waits = sorted(e[2] / 1000 for e in ev)
hand.sort()
def pct(xs, q): return xs[min(len(xs) - 1, int(q * len(xs)))]
secs = (ev[-1][0] - ev[0][0]) / 1e6
print(f"cs={len(ev)} cs/s={len(ev)/secs:.0f} handoffs={len(hand)} p50={pct(hand,.5):.2f} p99={pct(hand,.99):.2f} max={hand[-1]:.1f} >=50ms={sum(h>=50 for h in hand)} longest_wait={waits[-1]:.1f} waits>=50={sum(w>=50 for w in waits)}")
