#!/usr/bin/env bash
# The long fault soak (not part of CI): scripts/fault-check.sh on every configuration, every
# kind the backend offers and every fault, overlapping, for DISTLOCK_SOAK_PER_KIND per kind
# (default 5m: 30 minutes per configuration of six kinds). Starts the servers itself unless
# their export lines are already in the environment, runs a copy of a freshly built binary,
# and writes the results table (the README's "Verified under faults") to
# target/soak/table.md, each run's reports in target/soak/runs.
#
# Usage: scripts/soak.sh [CONFIG...]    (the configurations of scripts/fault-check.sh)
# The configurations that share no server run at the same time: the whole soak takes about
# as long as its busiest groups (Redis and PostgreSQL: 3 configurations, 18 kind runs, about
# 1.5 hours at 5m).
set -euo pipefail

REPO=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${CARGO_TARGET_DIR:-$REPO/target}/soak
PER_KIND=${DISTLOCK_SOAK_PER_KIND:-5m}

if [[ -z ${DISTLOCK_TEST_POSTGRES_URL:-} ]]; then
  eval "$("$REPO/scripts/services.sh" start)"
fi
# The commit the binary is built from (the checkout may move on while the soak runs).
commit=$(git -C "$REPO" rev-parse --short HEAD)
cargo build --quiet -p distlock-cli --features all-backends
mkdir -p "$OUT"
cp "${CARGO_TARGET_DIR:-$REPO/target}/debug/distlock" "$OUT/distlock"
started=$(date +%s)
rc=0
DISTLOCK_CHECK_BIN=$OUT/distlock DISTLOCK_CHECK_OUT=$OUT/runs DISTLOCK_CHECK_DURATION=$PER_KIND \
  "$REPO/scripts/fault-check.sh" "$@" >"$OUT/table.md" || rc=$?
took=$(($(date +%s) - started))
{
  echo
  echo "soak: $PER_KIND per kind, $commit, $((took / 60)) min," \
    "exit $rc"
} >>"$OUT/table.md"
cat "$OUT/table.md"
exit "$rc"
