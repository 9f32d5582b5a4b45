#!/usr/bin/env bash
# The long fault soak (not part of CI): scripts/fault-check.sh on every configuration, every
# kind the backend offers and every fault, overlapping, for DISTLOCK_SOAK_PER_KIND per kind
# (default 5m: 30 minutes per configuration of six kinds). Starts the servers itself unless
# their export lines are already in the environment, runs a copy of a freshly built binary,
# and writes the results table (the README's "Verified under faults") to
# target/soak/table.md, each run's reports in target/soak/runs.
#
# First, unless DISTLOCK_SOAK_CONFORMANCE=0: the full conformance suites of the transport
# variants (the TLS and authentication configurations, which scripts/test.sh runs on the
# cases that depend on the connection only).
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
rc=0
if [[ ${DISTLOCK_SOAK_CONFORMANCE:-1} != 0 ]]; then
  export DISTLOCK_TEST_REQUIRE=all DISTLOCK_TEST_VARIANTS=full
  # package: the transport variants among its conformance configurations.
  for spec in distlock-redis:redis_tls distlock-etcd:etcd_tls distlock-nats:nats_tls \
    distlock-sql:postgres_tls,mysql_tls distlock-zookeeper:zk_auth,zk_tls; do
    package=${spec%%:*}
    IFS=, read -r -a configs <<<"${spec#*:}"
    filters=()
    for config in "${configs[@]}"; do filters+=("$config::"); done
    echo "==> soak.sh: conformance of ${configs[*]} in full" >&2
    cargo test --quiet -p "$package" --all-features --test conformance -- \
      --test-threads=6 "${filters[@]}" >&2 || rc=1
  done
fi
# The commit the binary is built from (the checkout may move on while the soak runs).
commit=$(git -C "$REPO" rev-parse --short HEAD)
cargo build --quiet -p distlock-cli --features all-backends
mkdir -p "$OUT"
cp "${CARGO_TARGET_DIR:-$REPO/target}/debug/distlock" "$OUT/distlock"
started=$(date +%s)
DISTLOCK_CHECK_BIN=$OUT/distlock DISTLOCK_CHECK_OUT=$OUT/runs DISTLOCK_CHECK_DURATION=$PER_KIND \
  "$REPO/scripts/fault-check.sh" "$@" >"$OUT/table.md" || faults=$?
((rc != 0)) || rc=${faults:-0}
took=$(($(date +%s) - started))
{
  echo
  echo "soak: $PER_KIND per kind, $commit, $((took / 60)) min," \
    "exit $rc"
} >>"$OUT/table.md"
cat "$OUT/table.md"
exit "$rc"
