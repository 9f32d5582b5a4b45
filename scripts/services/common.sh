# Shared machinery of scripts/services.sh (sourced by it, never run alone): the registry of the
# server families, logging, pid files, spawning and waiting, packages, libfaketime, the test TLS
# material, stopping, and the locks between runs.
#
# A server family is one file scripts/services/FAMILY.sh (FAMILY: its name, lower case), read in
# the order of the file names. Its header comment (up to the first line that is not a comment)
# is printed by the usage text: it lists the family's servers, ports and groups. At its top level
# it registers what it has:
#   add_servers RANK NAME...       its servers (names unique across the families)
#   add_group RANK GROUP [MODE...] a replicated group that `failover GROUP` fails over; MODE: a
#                                  failover mode besides in-sync that the group supports
#   failover_mode MODE NOTE        such a mode, for the messages ("lagging" "Redis groups")
#   launch_in_background NAME...   servers whose first launch is slow (initdb): launched first and
#                                  in the background while the others start
#   stop_one_at_a_time NAME...     servers that `stop` stops one after the other, last
#   add_check RANK CONFIG KEY=VALUE...
#                                  a configuration of scripts/fault-check.sh (`distlock check`
#                                  under faults) on its servers; `services.sh checks` lists
#                                  them. KEYs: group (required: the configurations of a group
#                                  share a server and run one after the other), url (required;
#                                  @VAR: the value of the export line VAR, {out}: the check's
#                                  output folder), ttl (default 1s), duration (default: the
#                                  check's), faults (all, host: no proxy, clock: wall clock
#                                  steps alone, or a list), restart (the services.sh arguments
#                                  of the restart fault), clock (the clock file of the clock
#                                  fault; @VAR or {out} as url), after (configurations of other
#                                  groups to wait for), runner (host-clock: the checker and its
#                                  workers run under libfaketime on the clock file)
# A family with servers defines functions FAMILY_HOOK that the driver calls; required:
#   FAMILY_port NAME               the port that identifies server NAME (its client port)
#   FAMILY_comm NAME               its expected /proc/PID/comm
#   FAMILY_launch NAME             prepare its data dir and config, spawn it (both idempotent on
#                                  an existing data dir)
#   FAMILY_probe NAME              one readiness probe, no waiting
#   FAMILY_env                     its export lines, each by env_line RANK FORMAT ARGS...
# optional:
#   FAMILY_ports NAME              its other ports (checked for foreign listeners before a start)
#   FAMILY_post_ready NAME         work after the first successful probe (idempotent; retried
#                                  until the readiness deadline while it fails)
#   FAMILY_stop_signal NAME        its stop signal (default TERM)
#   FAMILY_after_crash NAME        clean up after a SIGKILL (stale lock files)
#   FAMILY_clock_file NAME         the clock file of a server under libfaketime (default
#                                  clock/NAME.rc of the state dir)
#   FAMILY_clock_preload NAME      libraries to preload ahead of libfaketime
#   FAMILY_packages                need_package RANK PACKAGE for each missing Debian package
#   FAMILY_installed               die when a package is still missing after apt-get install
#   FAMILY_cleanup                 remove what it keeps outside the state dir (`stop`, once every
#                                  server is gone)
#   FAMILY_settle NAME...          after a start of NAME... (any families'), once all answer:
#                                  form its replicated topologies and wait until they are healthy
#   FAMILY_topology                one line per member of its replicated topologies: its role
#   FAMILY_leader GROUP            the server leading GROUP now, or nothing (required with groups)
#   FAMILY_failover_victim GROUP   the server that `failover` kills (default: the leader)
#   FAMILY_failover_kill GROUP NAME MODE   kill NAME (default crash_one NAME; MODE as resolved)
#   FAMILY_failover_successor GROUP NAME   the server that took over from NAME, or nothing
#                                  (default: the leader, when it is not NAME)
#   FAMILY_failover_done GROUP NAME NEW    after the takeover, before NAME is started again
#
# RANK orders merged lists (the servers in `status` and `start`, the export lines of `env`, the
# groups, the missing packages): lower first, equal ranks in the order of registration. The
# ranks in use keep the order of the single script these files came from: servers and export
# lines 100.. plain, 200.. TLS, 300.. under libfaketime; the next family takes free ranks.

# shellcheck shell=bash

HOST=127.0.0.1

# --------------------------------------------------------------------------------------------
# Family registry

FAMILIES=() # in the order they were read
FAMILY=""   # the family file being read
RANK_SEQ=0
declare -A SERVER_FAMILY=() GROUP_FAMILY=() GROUP_MODES=() FAILOVER_MODE_NOTE=()
declare -A BACKGROUND_LAUNCH=() SERIAL_STOP=()
SERVER_SLOTS=() GROUP_SLOTS=() ENV_SLOTS=() PACKAGE_SLOTS=() FAILOVER_MODES=() CHECK_SLOTS=()

# ranked ARRAY RANK VALUE: VALUE into the sparse ARRAY at the index of RANK (bash lists a sparse
# array in index order, so nothing is sorted).
ranked() {
  local -n slots=$1
  RANK_SEQ=$((RANK_SEQ + 1))
  slots[$(($2 * 1000 + RANK_SEQ))]=$3
}

begin_family() {
  FAMILY=${1##*/}
  FAMILY=${FAMILY%.sh}
  FAMILIES+=("$FAMILY")
}

end_family() {
  local h name
  for name in "${!SERVER_FAMILY[@]}"; do
    [[ ${SERVER_FAMILY[$name]} == "$FAMILY" ]] || continue
    for h in port comm launch probe env; do
      has_hook "$FAMILY" "$h" || die "scripts/services/$FAMILY.sh defines no ${FAMILY}_$h"
    done
    break
  done
  if ((${#GROUP_SLOTS[@]})) && ! has_hook "$FAMILY" leader; then
    local g
    for g in "${GROUP_SLOTS[@]}"; do
      [[ ${GROUP_FAMILY[$g]} != "$FAMILY" ]] ||
        die "scripts/services/$FAMILY.sh has group $g but no ${FAMILY}_leader"
    done
  fi
  FAMILY=""
}

add_servers() {
  local rank=$1 name
  shift
  for name in "$@"; do
    [[ -z ${SERVER_FAMILY[$name]:-} ]] || die "server $name registered twice"
    SERVER_FAMILY[$name]=$FAMILY
    ranked SERVER_SLOTS "$rank" "$name"
  done
}

add_group() {
  local rank=$1 group=$2
  shift 2
  GROUP_FAMILY[$group]=$FAMILY
  GROUP_MODES[$group]="in-sync${*:+ $*}"
  ranked GROUP_SLOTS "$rank" "$group"
}

failover_mode() {
  FAILOVER_MODES+=("$1")
  FAILOVER_MODE_NOTE[$1]=$2
}

launch_in_background() {
  local name
  for name in "$@"; do BACKGROUND_LAUNCH[$name]=1; done
}

stop_one_at_a_time() {
  local name
  for name in "$@"; do SERIAL_STOP[$name]=1; done
}

# env_line RANK FORMAT ARGS...: the export line `export FORMAT` (printf) at RANK.
env_line() {
  local rank=$1 fmt=$2 line
  shift 2
  # shellcheck disable=SC2059  # the format is the caller's
  printf -v line "export $fmt" "$@"
  ranked ENV_SLOTS "$rank" "$line"
}

need_package() { ranked PACKAGE_SLOTS "$1" "$2"; }

# add_check RANK CONFIG KEY=VALUE... (see the top): the line `services.sh checks` prints,
# CONFIG|group|url|ttl|duration|faults|restart|clock|after|runner.
add_check() {
  local rank=$1 config=$2 kv key line
  shift 2
  local -A f=([ttl]=1s [faults]=all)
  for kv in "$@"; do
    key=${kv%%=*}
    case $key in
      group | url | ttl | duration | faults | restart | clock | after | runner) ;;
      *) die "scripts/services/$FAMILY.sh: check $config: unknown key $key" ;;
    esac
    f[$key]=${kv#*=}
  done
  [[ -n ${f[group]:-} && -n ${f[url]:-} ]] ||
    die "scripts/services/$FAMILY.sh: check $config needs a group and a url"
  line="$config|${f[group]}|${f[url]}|${f[ttl]}|${f[duration]:-}|${f[faults]}|${f[restart]:-}"
  line+="|${f[clock]:-}|${f[after]:-}|${f[runner]:-}"
  ranked CHECK_SLOTS "$rank" "$line"
}

# has_hook FAMILY HOOK: whether FAMILY defines FAMILY_HOOK.
has_hook() { declare -F "$1_$2" >/dev/null; }

# hook HOOK NAME ARGS...: FAMILY_HOOK NAME ARGS... of the family of server NAME.
hook() {
  local h=$1 name=$2
  shift 2
  "${SERVER_FAMILY[$name]}_$h" "$name" "$@"
}

# server_has HOOK NAME: whether the family of server NAME defines HOOK.
server_has() { has_hook "${SERVER_FAMILY[$2]}" "$1"; }

# join SEPARATOR WORDS...
join() {
  local sep=$1 out="" w
  shift
  for w in "$@"; do out+="${out:+$sep}$w"; done
  printf '%s\n' "$out"
}

# --------------------------------------------------------------------------------------------
# Logging, names, ports

log() { printf 'services: %s\n' "$*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}

now_ms() {
  local s
  s=$(date +%s%N)
  printf '%s\n' "$((s / 1000000))"
}

is_server() { [[ -n ${SERVER_FAMILY[$1]:-} ]]; }

# Index (0..) of a numbered member NAME-N of a cluster or an ensemble.
member_index() { printf '%s\n' "$((${1##*-} - 1))"; }

# The port that identifies a server (client port).
server_port() { hook port "$1"; }

# Every port a server listens on (checked for foreign listeners before starting).
server_ports() {
  server_port "$1"
  if server_has ports "$1"; then hook ports "$1"; fi
}

# Expected /proc/PID/comm of a server process.
server_comm() { hook comm "$1"; }

launch() { hook launch "$1"; }

# One readiness probe, no waiting.
probe() { hook probe "$1"; }

# Work after the first successful probe (idempotent).
post_ready() {
  if server_has post_ready "$1"; then hook post_ready "$1"; fi
}

data_dir() { printf '%s\n' "$STATE/data/$1"; }
log_file() { printf '%s\n' "$STATE/logs/$1.log"; }
pid_file() { printf '%s\n' "$STATE/run/$1.pid"; }

state_hash() { printf '%s' "$STATE" | md5sum | cut -c1-10; }

# --------------------------------------------------------------------------------------------
# Processes

# Process state letter from /proc/PID/stat, or empty when there is no such process.
proc_state() {
  local stat rest
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  rest=${stat##*) }
  printf '%s\n' "${rest%% *}"
}

# Alive = exists and is neither a zombie nor dead.
pid_alive() {
  local st
  st=$(proc_state "$1")
  [[ -n $st && $st != Z && $st != X ]]
}

recorded_pid() {
  local f pid
  f=$(pid_file "$1")
  [[ -f $f ]] || return 1
  pid=$(<"$f")
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  printf '%s\n' "$pid"
}

# True when the recorded process of server $1 is alive and is the expected program.
is_running() {
  local pid comm
  pid=$(recorded_pid "$1") || return 1
  pid_alive "$pid" || return 1
  comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
  [[ $comm == "$(server_comm "$1")" ]]
}

# Start "$@" in the background as server $1: new session, stdin /dev/null, stdout+stderr to the
# server's log, every other inherited file descriptor closed (so neither a caller's pipe nor our
# lock is held by the server). The subshell execs (no fork anywhere), so $! is the server's pid.
spawn() {
  local name=$1 logf pidf
  shift
  logf=$(log_file "$name")
  pidf=$(pid_file "$name")
  printf '=== %s services.sh: %s\n' "$(date '+%F %T')" "$*" >>"$logf"
  (
    cd /
    for fd in /proc/"$BASHPID"/fd/*; do
      fd=${fd##*/}
      if ((fd > 2)); then
        eval "exec ${fd}>&-" 2>/dev/null || true
      fi
    done
    exec setsid "$@" </dev/null >>"$logf" 2>&1
  ) &
  printf '%s\n' "$!" >"$pidf"
}

port_open() {
  timeout 2 bash -c "exec 3<>/dev/tcp/$HOST/$1" 2>/dev/null
}

# Pids (other than ours) whose command line mentions $1: a hint for a foreign listener.
port_users() {
  local f pid cmd out=""
  for f in /proc/[0-9]*/cmdline; do
    pid=${f#/proc/}
    pid=${pid%/cmdline}
    [[ $pid == "$$" ]] && continue
    cmd=$(tr '\0' ' ' <"$f" 2>/dev/null) || continue
    [[ $cmd == *"$1"* ]] && out+="${out:+ }$pid"
  done
  printf '%s\n' "$out"
}

# Fails when one of the server's ports already has a listener (one we did not record).
check_ports_free() {
  local port hint
  while read -r port; do
    if port_open "$port"; then
      hint=$(port_users "$port")
      log "port $port (needed by $1) is already in use by a process not recorded in $STATE/run" \
        "(candidate pids: ${hint:-unknown}; a previous state dir may have been deleted, e.g. by" \
        "cargo clean, while its servers ran: stop those processes by pid)"
      return 1
    fi
  done < <(server_ports "$1")
}

# --------------------------------------------------------------------------------------------
# Packages

# Installs (as root) the Debian packages the families' FAMILY_packages name as missing.
ensure_packages() {
  local missing=() pkg fam p dup
  PACKAGE_SLOTS=()
  for fam in "${FAMILIES[@]}"; do
    if has_hook "$fam" packages; then "${fam}_packages"; fi
  done
  # Every family with a server under libfaketime needs it.
  [[ -n $(faketime_lib) ]] || need_package 190 libfaketime
  for pkg in "${PACKAGE_SLOTS[@]}"; do
    dup=0
    for p in "${missing[@]}"; do [[ $p == "$pkg" ]] && dup=1; done
    ((dup)) || missing+=("$pkg")
  done
  ((${#missing[@]} == 0)) && return 0

  if ((EUID != 0)); then
    log "missing packages: ${missing[*]}; install them with:"
    printf '  sudo apt-get update && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends %s\n' \
      "${missing[*]}" >&2
    exit 1
  fi
  log "installing: ${missing[*]}"
  local t0
  t0=$(now_ms)
  apt-get -q -o DPkg::Lock::Timeout=300 update >&2
  DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=300 install -y \
    --no-install-recommends "${missing[@]}" >&2
  log "installed in $(($(now_ms) - t0)) ms"
  for fam in "${FAMILIES[@]}"; do
    if has_hook "$fam" installed; then "${fam}_installed"; fi
  done
  [[ -n $(faketime_lib) ]] || die "libfaketimeMT.so.1 still missing after apt-get install"
}

# need_commands CMD...: dies when a command is still missing after apt-get install.
need_commands() {
  local pkg
  for pkg in "$@"; do
    command -v "$pkg" >/dev/null || die "$pkg still missing after apt-get install"
  done
}

# --------------------------------------------------------------------------------------------
# Servers whose wall clock steps (libfaketime)

# The first existing file of the arguments (globs), or nothing.
first_file() {
  local f
  for f in "$@"; do
    [[ -f $f ]] && {
      printf '%s\n' "$f"
      return 0
    }
  done
  return 0
}

# libfaketime's thread-safe build: the plain one parses the clock file in several threads at
# once, and a JVM (ZooKeeper) died of it within a minute of steps (an assertion in strtod).
faketime_lib() { first_file /usr/lib/*/faketime/libfaketimeMT.so.1; }

# The file whose first line is the clock offset of server $1 (FAKETIME_TIMESTAMP_FILE): the
# family's FAMILY_clock_file, else clock/NAME.rc of the state dir.
clock_file() {
  if server_has clock_file "$1"; then
    hook clock_file "$1"
  else
    printf '%s/clock/%s.rc\n' "$STATE" "$1"
  fi
}

# clock_env NAME: the `env` arguments that run server NAME on the clock of its clock file,
# made "+0" (no offset) when missing (`stop` removes it; restart-one keeps it).
# FAKETIME_NO_CACHE: the file is read at every clock read, so a step takes effect at once; the
# monotonic clocks stay true (only the wall clock steps). FAKETIME_FORCE_MONOTONIC_FIX=0:
# libfaketime 0.9.10 turns its pthread_cond_timedwait "monotonic fix" on by itself on this
# glibc, and every timed wait of a JVM then returns at once: zookeeper-clock spun on 0.9 of a
# core for as long as it ran (measured: 93% CPU with the fix, 5% without, the same 8 s). The
# monotonic clocks are not faked here, so their waits need no fix. A family's
# FAMILY_clock_preload puts libraries ahead of libfaketime (Redis: glibc's malloc).
clock_env() {
  local file preload
  file=$(clock_file "$1")
  preload=$(faketime_lib)
  [[ -n $preload ]] || die "$1: libfaketimeMT.so.1 is missing (apt-get install libfaketime)"
  if server_has clock_preload "$1"; then
    local first
    first=$(hook clock_preload "$1") || exit 1
    preload="$first $preload"
  fi
  mkdir -p "$(dirname "$file")"
  # Kept across restart-one, as a machine's clock is: a restart during a step stays stepped.
  [[ -f $file ]] || printf '+0\n' >"$file"
  chmod 644 "$file"
  printf '%s\n' "LD_PRELOAD=$preload" "FAKETIME_TIMESTAMP_FILE=$file" FAKETIME_NO_CACHE=1 \
    FAKETIME_DONT_FAKE_MONOTONIC=1 DONT_FAKE_MONOTONIC=1 FAKETIME_FORCE_MONOTONIC_FIX=0
}

# Whether server $1's process runs with libfaketime loaded (its steps would otherwise change
# nothing, and a clock check would pass for the wrong reason).
clock_loaded() {
  local pid
  pid=$(recorded_pid "$1") || return 1
  if ! grep -q libfaketime "/proc/$pid/maps" 2>/dev/null; then
    log "$1: libfaketime is not loaded in pid $pid"
    return 1
  fi
}

# --------------------------------------------------------------------------------------------
# Test certificates and the TLS users' password, made once per state dir (removed by `stop`) and
# never committed: a CA, a server certificate for 127.0.0.1 and localhost, a client certificate,
# and a second CA that signed nothing here (a client trusting it must refuse the server).

tls_dir() { printf '%s\n' "$STATE/conf/tls"; }

tls_material() {
  local d
  d=$(tls_dir)
  [[ -s $d/password && -s $d/client.pem ]] && return 0
  mkdir -p "$d" "$STATE/logs"
  (
    cd "$d"
    openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj '/CN=distlock test CA' \
      -keyout ca.key -out ca.pem
    openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj '/CN=distlock other CA' \
      -keyout other-ca.key -out other-ca.pem
    openssl req -newkey rsa:2048 -nodes -subj '/CN=127.0.0.1' -keyout server.key -out server.csr
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >server.ext
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 30 \
      -extfile server.ext -out server.pem
    openssl req -newkey rsa:2048 -nodes -subj '/CN=distlock_tls' -keyout client.key -out client.csr
    printf 'extendedKeyUsage=clientAuth\n' >client.ext
    openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 30 \
      -extfile client.ext -out client.pem
    chmod 600 ./*.key
    openssl rand -hex 16 >password
  ) >>"$STATE/logs/tls.log" 2>&1 || die "tls: generating test certificates failed, see $STATE/logs/tls.log"
}

tls_password() { cat "$(tls_dir)/password"; }

# --------------------------------------------------------------------------------------------
# Readiness

# Waits until server $1 answers; on failure prints why and the tail of its log.
wait_ready() {
  local name=$1 t0 deadline pid
  t0=$(now_ms)
  deadline=$((t0 + READY_TIMEOUT * 1000))
  local reason
  while :; do
    if probe "$name"; then
      # The setup can fail while a just-restarted server is still settling (etcd-tls refused
      # root's password once, 2026-11-26, right after a restart): tried again until the deadline.
      if post_ready "$name"; then
        log "$name ready ($(($(now_ms) - t0)) ms)"
        return 0
      fi
      reason="$name answers but its setup (users, database distlock) failed"
    else
      reason="$name did not answer within ${READY_TIMEOUT} s"
    fi
    pid=$(recorded_pid "$name" || true)
    if [[ -z $pid ]] || ! pid_alive "$pid"; then
      reason="$name: process ${pid:-?} exited before answering"
      break
    fi
    if (($(now_ms) > deadline)); then
      break
    fi
    sleep 0.05
  done
  log "---- last lines of $(log_file "$name") ----"
  tail -n 30 "$(log_file "$name")" >&2 || true
  log "----"
  # Which part of the probe fails (a family's `diagnose` hook: a line of its own).
  if server_has diagnose "$name"; then reason+=" ($(hook diagnose "$name" 2>&1 | tr '\n' ' '))"; fi
  # Last, where a caller that keeps only the tail of this output sees it.
  log "$reason"
  return 1
}

# --------------------------------------------------------------------------------------------
# Stop

stop_signal() {
  if server_has stop_signal "$1"; then
    hook stop_signal "$1"
  else
    printf 'TERM\n'
  fi
}

# Sends the stop signal to server $1 if its recorded process is alive; prints its pid.
signal_server() {
  local name=$1 signal=${2:-} pid
  pid=$(recorded_pid "$name") || return 0
  if is_running "$name"; then
    kill -s "${signal:-$(stop_signal "$name")}" "$pid" 2>/dev/null || true
    printf '%s\n' "$pid"
  elif pid_alive "$pid"; then
    log "$name: pid $pid is now $(cat "/proc/$pid/comm" 2>/dev/null || echo '?'), not ours: left alone"
  fi
}

# Waits until pid $2 of server $1 is gone; SIGKILL after STOP_TIMEOUT.
wait_gone() {
  local name=$1 pid=$2 deadline t0
  t0=$(now_ms)
  deadline=$((t0 + STOP_TIMEOUT * 1000))
  while pid_alive "$pid"; do
    if (($(now_ms) > deadline)); then
      log "$name (pid $pid) still running after ${STOP_TIMEOUT} s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      deadline=$(($(now_ms) + 10000))
      while pid_alive "$pid"; do
        (($(now_ms) > deadline)) && die "$name (pid $pid) survives SIGKILL"
        sleep 0.05
      done
      break
    fi
    sleep 0.05
  done
  if (($(now_ms) - t0 > 1000)); then
    log "$name took $(($(now_ms) - t0)) ms to stop"
  fi
  rm -f "$(pid_file "$name")"
}

stop_one() {
  local name=$1 pid t0
  t0=$(now_ms)
  pid=$(signal_server "$name")
  if [[ -n $pid ]]; then
    wait_gone "$name" "$pid"
    log "$name stopped ($(($(now_ms) - t0)) ms, data kept)"
  else
    rm -f "$(pid_file "$name")"
    log "$name was not running"
  fi
}

# kill -9, as a crash of its machine would: the server and every process of its session (spawn
# makes it a session leader; PostgreSQL's backends would otherwise outlive their postmaster),
# no shutdown, no flush; the data dir stays for start-one. Returns once every one of them is
# dead (a zombie at most: reaping is up to pid 1 and can take a second); then the family's
# FAMILY_after_crash (PostgreSQL: its stale lock files).
crash_one() {
  local name=$1 pid deadline
  pid=$(signal_server "$name" KILL)
  if [[ -n $pid ]]; then
    kill -KILL -- "-$pid" 2>/dev/null || true
    deadline=$(($(now_ms) + 10000))
    while ps -eo sid=,stat= | awk -v sid="$pid" '$1 == sid && $2 !~ /^Z/ { found = 1 } END { exit !found }'; do
      (($(now_ms) > deadline)) && die "$name (session $pid) survives SIGKILL"
      sleep 0.02
    done
    # A multi-threaded server (the JVM) shows as a zombie while its other threads still exit
    # and hold its sockets: wait until its ports are closed too.
    local port
    while read -r port; do
      while port_open "$port"; do
        (($(now_ms) > deadline)) && die "$name still listens on $port after SIGKILL"
        sleep 0.02
      done
    done < <(server_ports "$name")
    if server_has after_crash "$name"; then hook after_crash "$name"; fi
    rm -f "$(pid_file "$name")"
    log "$name killed (SIGKILL, data kept)"
  else
    rm -f "$(pid_file "$name")"
    log "$name was not running"
  fi
}

# --------------------------------------------------------------------------------------------
# Other state dirs (another checkout, e.g. CI's fresh clone while a developer's servers still run)

REGISTRY=/tmp/distlock-services.d

register_state() {
  { mkdir -p "$REGISTRY" && printf '%s\n' "$STATE" >"$REGISTRY/$(state_hash)"; } 2>/dev/null || true
}

unregister_state() { rm -f "$REGISTRY/$(state_hash)" 2>/dev/null || true; }

# Servers of other registered state dirs hold our fixed ports: stop them when
# DISTLOCK_SERVICES_TAKEOVER=1 (scripts/test.sh sets it under CI=true), otherwise fail with the
# command that stops them.
check_other_instances() {
  local f other name busy
  for f in "$REGISTRY"/*; do
    [[ -f $f ]] || continue
    other=$(<"$f")
    [[ $other != "$STATE" ]] || continue
    busy=""
    for name in "${ALL_SERVERS[@]}"; do
      if STATE=$other is_running "$name"; then busy+="${busy:+ }$name"; fi
    done
    if [[ -z $busy ]]; then
      rm -f "$f"
      continue
    fi
    if [[ ${DISTLOCK_SERVICES_TAKEOVER:-0} == 1 ]]; then
      log "servers of another state dir $other are running ($busy): stopping them (takeover)"
      DISTLOCK_SERVICES_DIR=$other "$0" stop || return 1
    else
      log "servers of another state dir $other hold the fixed ports ($busy); stop them with:"
      log "  DISTLOCK_SERVICES_DIR=$other $0 stop    (or set DISTLOCK_SERVICES_TAKEOVER=1)"
      return 1
    fi
  done
}

prepare_state() {
  mkdir -p "$STATE/data" "$STATE/logs" "$STATE/run" "$STATE/conf"
  # Traversable, so the postgres user can reach data/postgres.
  chmod 755 "$STATE" "$STATE/data" 2>/dev/null || true
}

# lock_state [TARGET]: the state lock on fd 9, exclusive (start, stop, start-one, stop-one,
# kill-one). With a TARGET (restart-one NAME, failover GROUP), shared, and TARGET's own lock
# exclusive on fd 8: the restarts of different servers run at once. They used to queue on the
# one lock, a failover holding it while it waited for a new leader and the old one's start (CI,
# 2026-11-30, 23 checks on 2 cores: a restart waited 10-100 s, and zookeeper's and
# zookeeper-auth's passed the checker's 120 s).
lock_state() {
  local target=${1:-}
  mkdir -p "$STATE/run"
  exec 9>"$STATE/.lock"
  if [[ -z $target ]]; then
    flock -w 600 9 || die "another services.sh holds $STATE/.lock"
    return
  fi
  flock -s -w 600 9 || die "another services.sh holds $STATE/.lock"
  exec 8>"$STATE/run/$target.lock"
  flock -w 600 8 || die "another services.sh holds $STATE/run/$target.lock"
}
