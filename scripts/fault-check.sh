#!/usr/bin/env bash
# `distlock check` on every backend configuration of the test servers, of every lock kind the
# backend offers (exclusive, shared, rw-mix, permits:2, election, multi; see `distlock check
# --help`), with every fault that applies: pauses, crashes, client partitions and server
# restarts (kill -9, then a restart on the same data directory, through
# `scripts/services.sh restart-one`).
#
# Usage: scripts/fault-check.sh [CONFIG...]    (default: every configuration)
#   CONFIG: sqlite postgres postgres_tls mysql mysql_tls redis redis_fair redis_tls redlock3
#           redlock5 redis_sentinel redis_cluster etcd etcd_cluster etcd_tls zk zk_auth zk_tls
#           zk_ensemble redis_clock postgres_clock zk_clock mysql_clock redlock_clock
#           sqlite_clock pgbouncer_session mysql_wait_timeout
#   The *_clock configurations step the wall clock of a server run under libfaketime (the
#   clock fault, `--clock-file`), forward and back by 1.5-3 ttls; sqlite_clock, whose leases
#   end on the clock of the processes that share the file, runs distlock itself (checker
#   and workers) under libfaketime: the host's clock stepping.
#
# Needs the servers of scripts/services.sh (their export lines in the environment, as
# scripts/test.sh sets them) and builds the distlock command with every backend. Writes, per
# configuration, target/fault-check/CONFIG.{md,json,svg,log} (DISTLOCK_CHECK_OUT: another
# folder), then prints the "Verified under
# faults" table of the README, a row per configuration and kind. Configurations that share no
# server run at the same time (the
# runs mostly wait: holds, pauses, partitions); those that share one (a restart of it would
# hit the other) run one after the other. Exit status: 1 if any run found a violation of its
# backend's declared guarantee (or failed to run).
#
# DISTLOCK_CHECK_DURATION (per kind; default 8s, 12s for etcd, whose smallest ttl is 2 s, 30s
# for Sentinel and Cluster, run with a ttl of 6 s: a fault lasts up to 3 ttls and must heal
# before the run ends), DISTLOCK_CHECK_WORKERS (default
# 4) and DISTLOCK_CHECK_KINDS (a comma list; default every kind the backend offers) change the
# runs. Faults overlap (`--overlap`): a new one every 0.5-1.5 s, healed or not.
set -euo pipefail

REPO=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
SERVICES=$REPO/scripts/services.sh
OUT=${DISTLOCK_CHECK_OUT:-${CARGO_TARGET_DIR:-$REPO/target}/fault-check}
DURATION=${DISTLOCK_CHECK_DURATION:-8s}
ETCD_DURATION=${DISTLOCK_CHECK_DURATION:-12s}
# Sentinel and Cluster run with a ttl of 6 s, longer than their failover (2.3-4.5 s here), so
# that a holder still passes its check when a promoted replica that missed its lock serves
# (with 1 s its lease has run out by then, and a lagging failover loses nothing visible).
FAILOVER_DURATION=${DISTLOCK_CHECK_DURATION:-30s}
KINDS=${DISTLOCK_CHECK_KINDS:-}
WORKERS=${DISTLOCK_CHECK_WORKERS:-4}
ALL_FAULTS=pause,crash,partition,restart,ambiguous,starve,lossy
# The faults that need no proxy between a worker and its servers.
HOST_FAULTS=pause,crash,restart,starve
# On the servers run under libfaketime: steps of their wall clock alone (1-2 per kind; mixed
# with other faults, some kinds of an 8 s run got none).
CLOCK_FAULTS=clock

for var in DISTLOCK_TEST_POSTGRES_URL DISTLOCK_TEST_MYSQL_URL DISTLOCK_TEST_POSTGRES_TLS_URL \
  DISTLOCK_TEST_MYSQL_TLS_URL DISTLOCK_TEST_REDIS_TLS_URL DISTLOCK_TEST_ETCD_TLS_URL \
  DISTLOCK_TEST_ZK_AUTH_URL DISTLOCK_TEST_ZK_TLS_URL DISTLOCK_TEST_ZK_ENSEMBLE_CONNECT \
  DISTLOCK_TEST_REDIS_SENTINEL_URL DISTLOCK_TEST_REDIS_CLUSTER_URL \
  DISTLOCK_TEST_REDIS_CLOCK_FILE DISTLOCK_TEST_POSTGRES_CLOCK_URL DISTLOCK_TEST_POSTGRES_CLOCK_FILE \
  DISTLOCK_TEST_ZK_CLOCK_URL DISTLOCK_TEST_ZK_CLOCK_FILE DISTLOCK_TEST_REDIS_CLOCK_URL \
  DISTLOCK_TEST_PGBOUNCER_SESSION_URL DISTLOCK_TEST_MYSQL_WAIT_TIMEOUT_URL \
  DISTLOCK_TEST_MYSQL_CLOCK_URL DISTLOCK_TEST_MYSQL_CLOCK_FILE; do
  if [[ -z ${!var:-} ]]; then
    echo "fault-check.sh: $var is not set: start the servers (scripts/services.sh start) and" \
      "eval their export lines first" >&2
    exit 2
  fi
done

# DISTLOCK_CHECK_BIN: a distlock binary to run instead of building one (scripts/soak.sh runs
# a copy, so that a rebuild during a long soak cannot pull the binary from under its workers).
if [[ -n ${DISTLOCK_CHECK_BIN:-} ]]; then
  DISTLOCK=$DISTLOCK_CHECK_BIN
else
  cargo build --quiet -p distlock-cli --features all-backends
  DISTLOCK=${CARGO_TARGET_DIR:-$REPO/target}/debug/distlock
fi
mkdir -p "$OUT"
rm -f "$OUT"/*.md "$OUT"/*.json "$OUT"/*.svg "$OUT"/*.log "$OUT"/*.row "$OUT"/*.status \
  "$OUT"/*.db*

R=127.0.0.1
# config -> "group|URL|ttl|duration|faults|services.sh arguments of the restart fault". A group's
# configurations share a server and run one after the other. The replicated topologies' restart
# fault is a failover: `services.sh failover GROUP` kills the leader (master), waits until
# another member leads and starts the old one again; on Sentinel and Cluster, half of them
# with the master's replicas lagging (`either`), the failover that loses a lock. Sentinel and
# Cluster clients reach the addresses the servers announce, past the workers' proxies: no
# partition, ambiguous or lossy faults. A seventh field, the clock file, is the clock fault's
# (`--clock-file`); an eighth, configurations of other groups to wait for (their servers
# overlap, their restarts do not: Redlock of 3 uses 16380-16382, the single master 16379
# alone, and Redlock of 5 all five, after both).
declare -A RUNS=(
  [sqlite]="sqlite|sqlite://$OUT/check.db|1s|$DURATION|pause,crash,starve|"
  [postgres]="postgres|$DISTLOCK_TEST_POSTGRES_URL|1s|$DURATION|$ALL_FAULTS|restart-one postgres"
  [postgres_tls]="postgres|$DISTLOCK_TEST_POSTGRES_TLS_URL|1s|$DURATION|$ALL_FAULTS|restart-one postgres"
  [mysql]="mariadb|$DISTLOCK_TEST_MYSQL_URL|1s|$DURATION|$ALL_FAULTS|restart-one mariadb"
  [mysql_tls]="mariadb|$DISTLOCK_TEST_MYSQL_TLS_URL|1s|$DURATION|$ALL_FAULTS|restart-one mariadb"
  [redis]="redis|redis://$R:16379|1s|$DURATION|$ALL_FAULTS|restart-one redis-16379"
  [redis_fair]="redis|redis://$R:16379?fair=true|1s|$DURATION|$ALL_FAULTS|restart-one redis-16379"
  [redlock3]="redlock3|redlock://$R:16380,$R:16381,$R:16382|1s|$DURATION|$ALL_FAULTS|restart-one redis-16380"
  [redlock5]="redis|redlock://$R:16379,$R:16380,$R:16381,$R:16382,$R:16383|1s|$DURATION|$ALL_FAULTS|restart-one redis-16382||redlock3"
  [redis_tls]="redis-tls|$DISTLOCK_TEST_REDIS_TLS_URL|1s|$DURATION|$ALL_FAULTS|restart-one redis-tls-16390"
  [etcd]="etcd|etcd://$R:12379|2s|$ETCD_DURATION|$ALL_FAULTS|restart-one etcd"
  [etcd_cluster]="etcd-cluster|etcd://$R:12381,$R:12382,$R:12383|2s|$ETCD_DURATION|$ALL_FAULTS|failover etcd-cluster"
  [etcd_tls]="etcd-tls|$DISTLOCK_TEST_ETCD_TLS_URL|2s|$ETCD_DURATION|$ALL_FAULTS|restart-one etcd-tls"
  [zk]="zookeeper|zk://$R:12181|1s|$DURATION|$ALL_FAULTS|restart-one zookeeper"
  [zk_auth]="zookeeper-auth|$DISTLOCK_TEST_ZK_AUTH_URL|1s|$DURATION|$ALL_FAULTS|restart-one zookeeper-auth"
  [zk_ensemble]="zk-ensemble|zk://$DISTLOCK_TEST_ZK_ENSEMBLE_CONNECT|1s|$DURATION|$ALL_FAULTS|failover zk-ensemble"
  [redis_sentinel]="redis-sentinel|$DISTLOCK_TEST_REDIS_SENTINEL_URL|6s|$FAILOVER_DURATION|$HOST_FAULTS|failover redis-sentinel either"
  [redis_cluster]="redis-cluster|$DISTLOCK_TEST_REDIS_CLUSTER_URL|6s|$FAILOVER_DURATION|$HOST_FAULTS|failover redis-cluster either"
  [zk_tls]="zookeeper-auth|$DISTLOCK_TEST_ZK_TLS_URL|1s|$DURATION|$ALL_FAULTS|restart-one zookeeper-auth"
  [redis_clock]="redis-clock|$DISTLOCK_TEST_REDIS_CLOCK_URL|1s|$DURATION|$CLOCK_FAULTS||$DISTLOCK_TEST_REDIS_CLOCK_FILE"
  [postgres_clock]="postgres-clock|$DISTLOCK_TEST_POSTGRES_CLOCK_URL|1s|$DURATION|$CLOCK_FAULTS||$DISTLOCK_TEST_POSTGRES_CLOCK_FILE"
  # PostgreSQL through PgBouncer (session pooling), its restart PgBouncer's; in the postgres
  # group, whose restarts would hit it. A MariaDB closing connections idle for 2 s.
  [pgbouncer_session]="postgres|$DISTLOCK_TEST_PGBOUNCER_SESSION_URL|1s|$DURATION|$ALL_FAULTS|restart-one pgbouncer-session"
  [mysql_wait_timeout]="mariadb-wait-timeout|$DISTLOCK_TEST_MYSQL_WAIT_TIMEOUT_URL|1s|$DURATION|$ALL_FAULTS|restart-one mariadb-wait-timeout"
  [zk_clock]="zookeeper-clock|$DISTLOCK_TEST_ZK_CLOCK_URL|1s|$DURATION|$CLOCK_FAULTS||$DISTLOCK_TEST_ZK_CLOCK_FILE"
  [mysql_clock]="mariadb-clock|$DISTLOCK_TEST_MYSQL_CLOCK_URL|1s|$DURATION|$CLOCK_FAULTS||$DISTLOCK_TEST_MYSQL_CLOCK_FILE"
  # Redlock with one master of three on the stepping clock (the two others are never
  # restarted by any configuration): a step costs that master's vote alone.
  [redlock_clock]="redis-clock|redlock://$R:16420,$R:16381,$R:16383|1s|$DURATION|$CLOCK_FAULTS||$DISTLOCK_TEST_REDIS_CLOCK_FILE"
  [sqlite_clock]="sqlite-clock|sqlite://$OUT/check-clock.db|1s|$DURATION|$CLOCK_FAULTS||$OUT/sqlite-clock.rc"
)
ORDER=(sqlite postgres postgres_tls mysql mysql_tls redis redis_fair redis_tls redlock3 redlock5
  redis_sentinel redis_cluster etcd etcd_cluster etcd_tls zk zk_auth zk_tls zk_ensemble
  redis_clock postgres_clock zk_clock mysql_clock redlock_clock sqlite_clock pgbouncer_session
  mysql_wait_timeout)
if (($#)); then
  ORDER=("$@")
fi
for config in "${ORDER[@]}"; do
  if [[ -z ${RUNS[$config]:-} ]]; then
    echo "fault-check.sh: unknown configuration $config (one of: ${ORDER[*]})" >&2
    exit 2
  fi
done

# One run: the check's output to CONFIG.log, its exit status to CONFIG.status, its table row
# (from the JSON report) to CONFIG.row.
run_one() {
  local config=$1 group url ttl duration faults server clock after dep status=0 args run=() t0
  IFS='|' read -r group url ttl duration faults server clock after <<<"${RUNS[$config]}"
  for dep in $after; do
    if [[ " ${ORDER[*]} " == *" $dep "* ]]; then
      while [[ ! -e $OUT/$dep.status ]]; do sleep 1; done
    fi
  done
  args=(check --url "$url" --ttl "$ttl" --duration "$duration" --workers "$WORKERS"
    --nemesis "$faults" --overlap --json "$OUT/$config.json" --markdown "$OUT/$config.md"
    --svg "$OUT/$config.svg")
  if [[ -n $KINDS ]]; then
    args+=(--kind "$KINDS")
  fi
  if [[ -n $server ]]; then
    args+=(--restart-cmd "$SERVICES $server")
  fi
  if [[ -n $clock ]]; then
    args+=(--clock-file "$clock")
  fi
  if [[ $config == sqlite_clock ]]; then
    # SQLite's "server" clock is the processes' own: run them all on the clock file's.
    printf '+0\n' >"$clock"
    run=(env "LD_PRELOAD=$(ls /usr/lib/*/faketime/libfaketimeMT.so.1 | head -n 1)"
      "FAKETIME_TIMESTAMP_FILE=$clock" FAKETIME_NO_CACHE=1 FAKETIME_DONT_FAKE_MONOTONIC=1
      DONT_FAKE_MONOTONIC=1)
  fi
  t0=$SECONDS
  "${run[@]}" "$DISTLOCK" "${args[@]}" >"$OUT/$config.log" 2>&1 || status=$?
  echo "$status" >"$OUT/$config.status"
  echo "==> fault-check.sh: $config exit $status in $((SECONDS - t0)) s" >&2
  if [[ -s $OUT/$config.json ]]; then
    python3 "$REPO/scripts/lib/check-row.py" "$OUT/$config.json" "$config" >"$OUT/$config.row"
  fi
}

# Each group in a subshell of its own, its configurations one after the other.
declare -A GROUPS_OF=()
GROUP_ORDER=()
for config in "${ORDER[@]}"; do
  group=${RUNS[$config]%%|*}
  if [[ -z ${GROUPS_OF[$group]:-} ]]; then
    GROUP_ORDER+=("$group")
  fi
  GROUPS_OF[$group]+="$config "
done
pids=()
for group in "${GROUP_ORDER[@]}"; do
  (
    for config in ${GROUPS_OF[$group]}; do
      run_one "$config"
    done
  ) &
  pids+=("$!")
done
for pid in "${pids[@]}"; do
  wait "$pid" || true
done

rc=0
echo
echo "| configuration | kind | guarantee | faults injected | acquired / attempts | fenced accesses accepted | late accesses only the fence stopped | holders stopped by their local deadline | violations | expected findings | longest stall | acquire after healing |"
echo "|---|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|"
for config in "${ORDER[@]}"; do
  status=$(cat "$OUT/$config.status" 2>/dev/null || echo missing)
  if [[ -s $OUT/$config.row ]]; then
    cat "$OUT/$config.row"
  else
    echo "| $config | | no report (exit $status) | | | | | | | | | |"
  fi
  if [[ $status != 0 ]]; then
    echo "==> fault-check.sh: $config FAILED (exit $status); its output:" >&2
    sed 's/^/    /' "$OUT/$config.log" >&2 || true
    rc=1
  fi
done
exit "$rc"
