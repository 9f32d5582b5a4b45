#!/usr/bin/env bash
# `distlock check` on every backend configuration of the test servers, of every lock kind the
# backend offers (exclusive, shared, rw-mix, upgradeable, permits:2, election, multi; see `distlock check
# --help`), with every fault that applies: pauses, crashes, client partitions and server
# restarts (kill -9, then a restart on the same data directory, through
# `scripts/services.sh restart-one`), every acquisition with a lock-delay of half the ttl.
#
# Usage: scripts/fault-check.sh [CONFIG...]    (default: every configuration)
#   CONFIG: a configuration the server families of scripts/services/ declare (`add_check`;
#   `scripts/services.sh checks` lists them, with their group, URL, ttl, duration, faults and
#   restart command). The *_clock configurations step the wall clock of a server run under
#   libfaketime (the clock fault, `--clock-file`), forward and back by 1.5-3 ttls;
#   sqlite_clock, whose leases end on the clock of the processes that share the file, runs
#   distlock itself (checker and workers) under libfaketime: the host's clock stepping.
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
# DISTLOCK_CHECK_JOBS (default 8): how many groups run at once. DISTLOCK_CHECK_DURATION (per kind; default: the configuration's, else 8s; etcd's is 12s,
# its smallest ttl being 2 s, Sentinel's and Cluster's 30s, run with a ttl of 6 s: a fault
# lasts up to 3 ttls and must heal before the run ends), DISTLOCK_CHECK_WORKERS (default
# 4) and DISTLOCK_CHECK_KINDS (a comma list; default every kind the backend offers) change the
# runs. Faults overlap (`--overlap`): a new one every 0.5-1.5 s, healed or not.
set -euo pipefail

REPO=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
SERVICES=$REPO/scripts/services.sh
OUT=${DISTLOCK_CHECK_OUT:-${CARGO_TARGET_DIR:-$REPO/target}/fault-check}
KINDS=${DISTLOCK_CHECK_KINDS:-}
WORKERS=${DISTLOCK_CHECK_WORKERS:-4}
# A configuration's faults: all, host (the faults that need no proxy between a worker and its
# servers: Sentinel and Cluster clients reach the addresses the servers announce), clock (on
# the servers run under libfaketime: steps of their wall clock alone, 1-2 per kind; mixed with
# other faults, some kinds of an 8 s run got none) or a list.
declare -A FAULT_SETS=(
  [all]=pause,crash,partition,restart,ambiguous,starve,lossy
  [host]=pause,crash,restart,starve
  [clock]=clock
)

# config -> "group|URL|ttl|duration|faults|services.sh arguments of the restart fault|clock
# file|configurations of other groups to wait for|runner", from `services.sh checks` (see
# scripts/services/common.sh, add_check). A group's configurations share a server and run one
# after the other. The replicated topologies' restart fault is a failover: `services.sh
# failover GROUP` kills the leader (master), waits until another member leads and starts the
# old one again.
declare -A RUNS=()
ORDER=()
# resolve FIELD: @VAR is the value of the export line VAR, {out} the output folder.
resolve() {
  local v=$1
  if [[ $v == @* ]]; then
    v=${v#@}
    if [[ -z ${!v:-} ]]; then
      echo "fault-check.sh: $v is not set: start the servers (scripts/services.sh start) and" \
        "eval their export lines first" >&2
      exit 2
    fi
    v=${!v}
  fi
  printf '%s\n' "${v//\{out\}/$OUT}"
}
checks=$("$SERVICES" checks)
while IFS='|' read -r config group url ttl duration faults server clock after runner; do
  url=$(resolve "$url")
  clock=$(resolve "$clock")
  duration=${DISTLOCK_CHECK_DURATION:-${duration:-8s}}
  faults=${FAULT_SETS[$faults]:-$faults}
  RUNS[$config]="$group|$url|$ttl|$duration|$faults|$server|$clock|$after|$runner"
  ORDER+=("$config")
done <<<"$checks"

for config in "$@"; do
  if [[ -z ${RUNS[$config]:-} ]]; then
    echo "fault-check.sh: unknown configuration $config (one of: ${ORDER[*]})" >&2
    exit 2
  fi
done
if (($#)); then
  ORDER=("$@")
fi

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

# One run: the check's output to CONFIG.log, its exit status to CONFIG.status, its table row
# (from the JSON report) to CONFIG.row.
run_one() {
  local config=$1 group url ttl duration faults server clock after runner dep status=0 args
  local run=() t0
  IFS='|' read -r group url ttl duration faults server clock after runner <<<"${RUNS[$config]}"
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
  # Every acquisition asks for a lock-delay of half the ttl: a crashed holder's name stays
  # taken for it, which the `lock-delay` rule judges.
  if [[ $ttl =~ ^([0-9]+)s$ ]]; then
    args+=(--lock-delay "$((BASH_REMATCH[1] * 500))ms")
  fi
  if [[ -n $server ]]; then
    args+=(--restart-cmd "$SERVICES $server")
  fi
  if [[ -n $clock ]]; then
    args+=(--clock-file "$clock")
  fi
  if [[ $runner == host-clock ]]; then
    # The leases' clock is the processes' own (SQLite): run them all on the clock file's.
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
# The longest groups first (by the sum of their configurations' durations; a group another
# waits for ranks with that one): started in the families' order, Sentinel's and Cluster's
# (30 s a kind, about 255 s each) got slots only after 14 others and ended the check at 382 s
# (CI, 2026-12-01), where the slots' total work was about 2,480 s (310 s on 8 slots).
declare -A WEIGHT=()
for config in "${ORDER[@]}"; do
  IFS='|' read -r group _ _ duration _ <<<"${RUNS[$config]}"
  case $duration in
    *ms) secs=1 ;;
    *s) secs=${duration%s} ;;
    *m) secs=$((${duration%m} * 60)) ;;
    *) secs=8 ;;
  esac
  [[ $secs =~ ^[0-9]+$ ]] || secs=8
  WEIGHT[$group]=$((${WEIGHT[$group]:-0} + secs))
done
for config in "${ORDER[@]}"; do
  IFS='|' read -r group _ _ _ _ _ _ after _ <<<"${RUNS[$config]}"
  for dep in $after; do
    [[ -n ${RUNS[$dep]:-} ]] || continue
    dep_group=${RUNS[$dep]%%|*}
    if ((WEIGHT[$dep_group] < WEIGHT[$group])); then WEIGHT[$dep_group]=${WEIGHT[$group]}; fi
  done
done
mapfile -t GROUP_ORDER < <(
  for i in "${!GROUP_ORDER[@]}"; do
    printf '%s %s %s\n' "${WEIGHT[${GROUP_ORDER[i]}]}" "$i" "${GROUP_ORDER[i]}"
  done | sort -k1,1nr -k2,2n | cut -d' ' -f3
)
echo "==> fault-check.sh: groups, longest first: ${GROUP_ORDER[*]}" >&2
# At most JOBS groups at once (DISTLOCK_CHECK_JOBS, default 8): with all 23 at once on a
# 2-core machine about a third slower than usual (2026-11-29, load average 38), server
# restarts took over the checker's 120 s and postgres and redlock3 failed to run. A group
# that waits for another's configuration (`after`) takes a slot while it waits; the other
# gets one when any group ends, so two slots are enough.
JOBS=${DISTLOCK_CHECK_JOBS:-8}
if ! [[ $JOBS =~ ^[0-9]+$ ]] || ((JOBS < 2)); then
  echo "fault-check.sh: DISTLOCK_CHECK_JOBS must be a number of at least 2, not '$JOBS'" >&2
  exit 2
fi
pids=()
running=0
for group in "${GROUP_ORDER[@]}"; do
  if ((running >= JOBS)); then
    wait -n || true
    running=$((running - 1))
  fi
  (
    for config in ${GROUPS_OF[$group]}; do
      run_one "$config"
    done
  ) &
  pids+=("$!")
  running=$((running + 1))
done
for pid in "${pids[@]}"; do
  # A group that `wait -n` reaped already is no longer a child: nothing to wait for.
  wait "$pid" 2>/dev/null || true
done

rc=0
failed=()
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
    failed+=("$config")
  fi
done
if ((rc)); then
  # Last, so that a log cut to its tail still names them, with the reason of each.
  for config in "${failed[@]}"; do
    echo "==> fault-check.sh: FAILED $config: $(grep -m 1 -iE 'violation|error|failed' \
      "$OUT/$config.log" 2>/dev/null | cut -c 1-300)" >&2
  done
fi
exit "$rc"
