#!/usr/bin/env bash
# `distlock check` on every backend configuration of the test servers, with every fault that
# applies: pauses, crashes, client partitions and server restarts (kill -9, then a restart on
# the same data directory, through `scripts/services.sh restart-one`).
#
# Usage: scripts/fault-check.sh [CONFIG...]    (default: every configuration)
#   CONFIG: sqlite postgres mysql redis redlock3 etcd etcd_cluster zk
#
# Needs the servers of scripts/services.sh (their export lines in the environment, as
# scripts/test.sh sets them) and builds the distlock command with every backend. Writes, per
# configuration, target/fault-check/CONFIG.{md,json,svg}, then prints the "Verified under
# faults" table of the README. Exit status: 1 if any run found a violation of its backend's
# declared guarantee (or failed to run).
#
# DISTLOCK_CHECK_DURATION (default 15s; 20s for etcd, whose smallest ttl is 2 s) and
# DISTLOCK_CHECK_WORKERS (default 4) change the runs.
set -euo pipefail

REPO=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
SERVICES=$REPO/scripts/services.sh
OUT=${CARGO_TARGET_DIR:-$REPO/target}/fault-check
DURATION=${DISTLOCK_CHECK_DURATION:-15s}
WORKERS=${DISTLOCK_CHECK_WORKERS:-4}

for var in DISTLOCK_TEST_POSTGRES_URL DISTLOCK_TEST_MYSQL_URL; do
  if [[ -z ${!var:-} ]]; then
    echo "fault-check.sh: $var is not set: start the servers (scripts/services.sh start) and" \
      "eval their export lines first" >&2
    exit 2
  fi
done

cargo build --quiet -p distlock-cli --features all-backends
DISTLOCK=${CARGO_TARGET_DIR:-$REPO/target}/debug/distlock
mkdir -p "$OUT"
rm -f "$OUT"/*.md "$OUT"/*.json "$OUT"/*.svg "$OUT"/*.db*

# config -> "URL|ttl|duration|faults|server to restart"
declare -A RUNS=(
  [sqlite]="sqlite://$OUT/check.db|1s|$DURATION|pause,crash|"
  [postgres]="$DISTLOCK_TEST_POSTGRES_URL|1s|$DURATION|pause,crash,partition,restart|postgres"
  [mysql]="$DISTLOCK_TEST_MYSQL_URL|1s|$DURATION|pause,crash,partition,restart|mariadb"
  [redis]="redis://127.0.0.1:16379|1s|$DURATION|pause,crash,partition,restart|redis-16379"
  [redlock3]="redlock://127.0.0.1:16379,127.0.0.1:16380,127.0.0.1:16381|1s|$DURATION|pause,crash,partition,restart|redis-16380"
  [etcd]="etcd://127.0.0.1:12379|2s|${DISTLOCK_CHECK_DURATION:-20s}|pause,crash,partition,restart|etcd"
  [etcd_cluster]="etcd://127.0.0.1:12381,127.0.0.1:12382,127.0.0.1:12383|2s|${DISTLOCK_CHECK_DURATION:-20s}|pause,crash,partition,restart|etcd-cluster-2"
  [zk]="zk://127.0.0.1:12181|1s|$DURATION|pause,crash,partition,restart|zookeeper"
)
ORDER=(sqlite postgres mysql redis redlock3 etcd etcd_cluster zk)
if (($#)); then
  ORDER=("$@")
fi

rc=0
rows=()
for config in "${ORDER[@]}"; do
  if [[ -z ${RUNS[$config]:-} ]]; then
    echo "fault-check.sh: unknown configuration $config (one of: ${!RUNS[*]})" >&2
    exit 2
  fi
  IFS='|' read -r url ttl duration faults server <<<"${RUNS[$config]}"
  args=(check --url "$url" --ttl "$ttl" --duration "$duration" --workers "$WORKERS"
    --nemesis "$faults" --json "$OUT/$config.json" --markdown "$OUT/$config.md"
    --svg "$OUT/$config.svg")
  if [[ -n $server ]]; then
    args+=(--restart-cmd "$SERVICES restart-one $server")
  fi
  echo "==> fault-check.sh: $config" >&2
  status=0
  "$DISTLOCK" "${args[@]}" >&2 || status=$?
  if ((status != 0)); then
    echo "==> fault-check.sh: $config FAILED (exit $status)" >&2
    ((rc != 0)) || rc=1
  fi
  if [[ -s $OUT/$config.json ]]; then
    rows+=("$(python3 - "$OUT/$config.json" "$config" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
stats, findings = report["verdict"]["stats"], report["verdict"]["findings"]
faults = ", ".join(f"{k} {v}" for k, v in stats["faults"].items()) or "none"
violations = sum(1 for f in findings if f["judgement"] == "violation")
expected = len(findings) - violations
final = stats.get("final_acquire")
final = f"{final / 1e6:.0f} ms" if final is not None else "failed"
print(f"| {sys.argv[2]} | {report['params']['guarantee']} | {faults} | "
      f"{stats['acquired']} / {stats['acquisitions']} | {stats['writes_accepted']} | "
      f"{stats['writes_rejected']} | {stats['checks_refused']} | {violations} | {expected} | "
      f"{stats['longest_gap'] / 1e6:.0f} ms | {final} |")
PY
)")
  fi
done

echo
echo "| configuration | guarantee | faults injected | acquired / attempts | fenced writes accepted | late writes only the fence stopped | holders stopped by their local deadline | violations | expected findings | longest stall | acquire after healing |"
echo "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|"
printf '%s\n' "${rows[@]}"
exit "$rc"
