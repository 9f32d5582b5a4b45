#!/usr/bin/env bash
# Regenerates the README's growth charts (issue 22): `distlock bench --scenario hold` and
# `--scenario clients` on every URL given, release build, charts in docs/charts/
# (hold-cost.svg, clients-latency.svg, clients-primitives.svg), the Markdown tables in
# docs/charts/growth.md, and the README snippet printed at the end.
#
#   scripts/growth-charts.sh URL...        e.g. redis://127.0.0.1:16379 postgres://... etcd://...
#
# Settings (environment), defaults as `distlock bench`'s except the hold ttl:
#   HOLD_TTL=6s            lease of each held lock; renewal tick = a third; window = 3 x ttl
#   HOLD_COUNTS=1,10,100,1000,10000
#   CLIENT_COUNTS=4,16,64
#   KINDS=mutex,rw,semaphore  the primitives of hold and clients (--growth-kinds)
#   DURATION=5s            clients: measured window per C
#   OUT=docs/charts        where the charts go
#   BIN=path/to/distlock   measure with this binary instead of building the release one
#                          (the server counts are the same; a debug build's CPU % is higher)
# With the defaults each URL takes about (1 + 5 x 3) x 3 x HOLD_TTL for hold (an idle window,
# then one window per K and primitive) plus 3 x 3 x DURATION for clients: ~6 min per URL at
# HOLD_TTL=6s.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -eq 0 ]; then
  sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
HOLD_TTL=${HOLD_TTL:-6s}
HOLD_COUNTS=${HOLD_COUNTS:-1,10,100,1000,10000}
CLIENT_COUNTS=${CLIENT_COUNTS:-4,16,64}
KINDS=${KINDS:-mutex,rw,semaphore}
DURATION=${DURATION:-5s}
OUT=${OUT:-docs/charts}

if [ -n "${BIN:-}" ]; then
  bin=$BIN
else
  cargo build --release -p distlock-cli --features all-backends >&2
  target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
  bin="$target_dir/release/distlock"
fi
urls=()
for url in "$@"; do urls+=(--url "$url"); done
mkdir -p "$OUT"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

run() { # run SCENARIO: one bench run, its Markdown in $tmp/SCENARIO.md
  "$bin" bench "${urls[@]}" --scenario "$1" \
    --hold-ttl "$HOLD_TTL" --hold-counts "$HOLD_COUNTS" \
    --client-counts "$CLIENT_COUNTS" --duration "$DURATION" --growth-kinds "$KINDS" \
    --json "$tmp/$1.json" --charts "$tmp/$1-charts" >"$tmp/$1.md"
}
build="release build"
[ -n "${BIN:-}" ] && build="binary $BIN"
status=0
run hold || status=$?
run clients || status=$?
cp "$tmp/hold-charts/hold-cost.svg" "$OUT/hold-cost.svg" 2>/dev/null || true
for chart in clients-latency clients-primitives; do
  cp "$tmp/clients-charts/$chart.svg" "$OUT/$chart.svg" 2>/dev/null || true
done
command="${BIN:+BIN=$BIN }HOLD_TTL=$HOLD_TTL HOLD_COUNTS=$HOLD_COUNTS CLIENT_COUNTS=$CLIENT_COUNTS KINDS=$KINDS DURATION=$DURATION scripts/growth-charts.sh $*"
{
  echo "<!-- made by: $command ($(date -u +%Y-%m-%d)) -->"
  cat "$tmp/hold.md" "$tmp/clients.md"
} >"$OUT/growth.md"

cat <<MD
![The cost of holding K locks: server requests per renewal tick, client CPU, heap bytes per guard]($OUT/hold-cost.svg)

![C clients on one name: handoff p50 and p99, longest wait]($OUT/clients-latency.svg)

![C clients on one name, every primitive: acquisitions per second, acquire wait p99, holders in use]($OUT/clients-primitives.svg)

Made by \`$command\` ($build; tables in [$OUT/growth.md]($OUT/growth.md)).
MD
exit "$status"
