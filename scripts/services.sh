#!/usr/bin/env bash
# Throw-away test servers for distlock, on 127.0.0.1 with fixed ports (the variables are a fixed
# contract, listed in README.md, "Contributing"). No Docker, no systemd: plain processes from
# Debian packages.
#
# Usage:
#   scripts/services.sh start            install missing packages (as root), start every server,
#                                        wait until each answers, print the export lines
#   scripts/services.sh stop             stop every recorded server, wait until it is gone,
#                                        remove all data dirs, pid files and generated config
#                                        (log files are kept for post-mortems, truncated by the
#                                        next cold start)
#   scripts/services.sh status           one line per server: running / stopped (exit 1 if any
#                                        server is not running and answering)
#   scripts/services.sh env              print the export lines only (starts nothing)
#   scripts/services.sh stop-one NAME    stop one server, KEEP its data dir (fault injection)
#   scripts/services.sh start-one NAME   (re)start one server on its existing data dir, wait ready
#   scripts/services.sh restart-one NAME crash one server (SIGKILL) and start it again on its data
#                                        dir, wait ready (the restart fault of `distlock check`)
#   scripts/services.sh kill-one NAME    crash one server (SIGKILL, no shutdown), KEEP its data
#                                        dir and do not restart it (failover tests; start-one
#                                        brings it back)
#   scripts/services.sh topology         one line per server of the replicated topologies: its
#                                        current role (Redis Cluster, Sentinel, ZooKeeper ensemble)
#   scripts/services.sh failover GROUP [MODE]
#                                        kill -9 the leader of a replicated group (redis-sentinel:
#                                        the master the Sentinels name; redis-cluster: the master
#                                        holding a live lease, else the first master;
#                                        etcd-cluster, zk-ensemble: the leader), wait until
#                                        another member leads (at most 30 s), then start the old
#                                        one again on its data (it rejoins as a follower); the
#                                        failover fault of `distlock check`. MODE (Redis only):
#                                        in-sync (the default), lagging (the master's replicas
#                                        stopped and 32 MB put on its replication link first, so
#                                        the promoted replica misses the last 0.6 s of writes) or
#                                        either (one of the two at random)
#
# Only the export lines go to stdout, everything else to stderr, so this works:
#   exports=$(scripts/services.sh start) && eval "$exports"
#
# NAME is one of:
#   redis-16379 .. redis-16383   5 independent Redis masters (no persistence: a restart is empty)
#   redis-tls-16390 .. 16392     3 Redis masters over TLS only (client certificate optional), the
#                                default user off, ACL user distlock with the TLS password
#   redis-cluster-17001 .. 17006 a Redis Cluster: 3 masters + 3 replicas (cluster bus = port +
#                                10000, node timeout 2 s, formed by `redis-cli --cluster create`
#                                once all six answer; no persistence; full coverage not required)
#   redis-repl-16400 .. 16402    Sentinel-managed replication: 16400 starts as the master, 16401
#                                and 16402 as its replicas (no persistence; their config files
#                                live in their data dirs, so a role the Sentinels rewrite
#                                survives a restart)
#   redis-sentinel-16410 .. 16412  3 Sentinels monitoring master name `distlock` (quorum 2,
#                                down-after 1 s, failover-timeout 4 s)
#   etcd                         single etcd member, client 12379, peer 12380
#   etcd-tls                     single etcd member, client 12479 over TLS with client
#                                certificates required (--client-cert-auth), peer 12480 (plain);
#                                auth enabled, user root with the TLS password, auth tokens
#                                expire after 10 s idle (--auth-token-ttl, so tests see refreshes)
#   etcd-cluster-1..3            3-member etcd cluster, client 12381..12383, peer 12391..12393
#   zookeeper                    standalone ZooKeeper 12181 (tickTime 200, session 400..60000 ms)
#   zookeeper-auth               standalone ZooKeeper for digest auth (user distlock, the TLS
#                                password; nodes under ACLs), plain 12182 and TLS 12183
#                                (secureClientPort, Netty, PEM key store; client cert optional);
#                                also SASL DIGEST-MD5 (SASLAuthenticationProvider, JAAS file
#                                conf/zk-auth-jaas.conf: user distlock with the TLS password)
#   zk-ensemble-1 .. 3           a 3-server ZooKeeper ensemble: client 12191..12193, quorum
#                                12281..12283, election 12291..12293 (tickTime 200)
#   postgres                     PostgreSQL 15 on 15432, database distlock, user postgres, trust;
#                                TLS (ssl=on), user distlock_tls with a password, over TLS only
#   mariadb                      MariaDB on 13306, database distlock, root without password;
#                                TLS, user distlock_tls with a password, REQUIRE SSL
#   pgbouncer-session            PgBouncer on 15440 in front of `postgres` (database distlock,
#                                user postgres; auth_type trust, its user list written at start-up
#                                in conf/), pool_mode=session: a server session per client
#   pgbouncer-tx                 the same on 15441 with pool_mode=transaction (distlock refuses it
#                                at connect; lock-sql/tests/poolers.rs checks that it does)
#   mariadb-wait-timeout         MariaDB on 13307 (database distlock, root without password, no
#                                TLS) that closes every connection idle for 2 s (--wait-timeout=2)
#   redis-clock-16420            a Redis master (no persistence) whose wall clock steps: run
#                                under libfaketime (LD_PRELOAD of its thread-safe libfaketimeMT,
#                                FAKETIME_NO_CACHE, the monotonic clocks left alone), its offset
#                                read from clock/redis-clock-16420.rc at every clock read ("+0"
#                                at a cold start; write e.g. "+3" or "-2.5", seconds, to step it;
#                                `distlock check --faults clock --clock-file FILE` does;
#                                DISTLOCK_TEST_REDIS_CLOCK_FILE names it). glibc's malloc is preloaded ahead of libfaketime: Debian's
#                                Redis uses jemalloc, whose start-up reads the clock before
#                                libfaketime is ready and hangs otherwise (wolfcw/libfaketime#130)
#   postgres-clock               PostgreSQL 15 on 15433 under libfaketime the same way (database
#                                distlock, user postgres, trust), its offset in faketime.rc of
#                                its base directory (DISTLOCK_TEST_POSTGRES_CLOCK_FILE)
#   zookeeper-clock              standalone ZooKeeper 12184 under libfaketime the same way (as
#                                `zookeeper` otherwise), its offset in clock/zookeeper-clock.rc
#   mariadb-clock                MariaDB on 13308 under libfaketime the same way (database
#                                distlock, root without password, no TLS), its offset in
#                                clock/mariadb-clock.rc
# The TLS users' password (also etcd-tls's root password) and the certificates (a CA, the
# server's, a client's, and a second CA that signed nothing) are made at start-up in conf/tls
# (openssl), never committed.
#
# State lives in ${DISTLOCK_SERVICES_DIR:-<repo>/target/services}:
#   data/NAME/     data dir of each server      logs/NAME.log   stdout+stderr of each server
#   run/NAME.pid   pid of each server process   conf/zoo.cfg    generated ZooKeeper config
#                                               conf/zoo-auth.cfg  the zookeeper-auth one
#                                               conf/zk-auth-jaas.conf  its SASL users
# `cargo clean` deletes target/services: stop the servers first (otherwise their pid files are
# gone and `start` reports the leftover processes holding the ports, with candidate pids).
# `start` is idempotent: a server whose recorded process is alive is left alone (it is only waited
# for). A data dir left by `stop-one` (or a crash) is reused by `start` / `start-one`.
# PostgreSQL refuses to run as root, so (when run as root) initdb and the server run as the
# `postgres` user on data/postgres/ (chowned to postgres, mode 700). If the postgres user cannot
# reach that directory (e.g. the repo is under /root) or the socket path would be too long, the
# PostgreSQL directory is /tmp/distlock-pg-<hash of state dir> instead (recorded in
# run/postgres.base and removed by `stop`).
# `stop` and `stop-one` signal only the pids recorded in run/*.pid, and only when the process
# still is the expected program (/proc/PID/comm); they wait on /proc/PID/stat (a zombie counts
# as gone), escalating to SIGKILL after DISTLOCK_SERVICES_STOP_TIMEOUT (default 30) seconds. The
# etcd cluster members are stopped one at a time (all at once, the leader spends ~7 s trying to
# hand over leadership).
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

PG_BIN=/usr/lib/postgresql/15/bin
ZK_JAR=/usr/share/java/zookeeper.jar
# ZooKeeper serves TLS only through its Netty connection factory (Debian libnetty-java).
NETTY_JARS=(buffer codec common handler resolver transport transport-native-epoll
  transport-native-unix-common)
SLF4J_SIMPLE_JAR=/usr/share/java/slf4j-simple.jar
HOST=127.0.0.1

REDIS_PORTS=(16379 16380 16381 16382 16383)
REDIS_TLS_PORTS=(16390 16391 16392)
ETCD_CLIENT_PORT=12379
ETCD_PEER_PORT=12380
ETCD_TLS_CLIENT_PORT=12479
ETCD_TLS_PEER_PORT=12480
ETCD_TLS_TOKEN_TTL=10
CLUSTER_CLIENT_PORTS=(12381 12382 12383)
CLUSTER_PEER_PORTS=(12391 12392 12393)
REDIS_CLUSTER_PORTS=(17001 17002 17003 17004 17005 17006)
REDIS_CLUSTER_NODE_TIMEOUT=2000
REDIS_REPL_PORTS=(16400 16401 16402)
REDIS_SENTINEL_PORTS=(16410 16411 16412)
SENTINEL_MASTER=distlock
ZK_ENSEMBLE_CLIENT_PORTS=(12191 12192 12193)
ZK_ENSEMBLE_QUORUM_PORTS=(12281 12282 12283)
ZK_ENSEMBLE_ELECTION_PORTS=(12291 12292 12293)
ZK_PORT=12181
ZK_AUTH_PORT=12182
ZK_AUTH_TLS_PORT=12183
PG_PORT=15432
PGBOUNCER_SESSION_PORT=15440
PGBOUNCER_TX_PORT=15441
MARIADB_WAIT_TIMEOUT_PORT=13307
MARIADB_PORT=13306
REDIS_CLOCK_PORT=16420
PG_CLOCK_PORT=15433
ZK_CLOCK_PORT=12184
MARIADB_CLOCK_PORT=13308

ALL_SERVERS=(
  redis-16379 redis-16380 redis-16381 redis-16382 redis-16383
  redis-tls-16390 redis-tls-16391 redis-tls-16392
  redis-cluster-17001 redis-cluster-17002 redis-cluster-17003
  redis-cluster-17004 redis-cluster-17005 redis-cluster-17006
  redis-repl-16400 redis-repl-16401 redis-repl-16402
  redis-sentinel-16410 redis-sentinel-16411 redis-sentinel-16412
  etcd etcd-tls etcd-cluster-1 etcd-cluster-2 etcd-cluster-3
  zookeeper zookeeper-auth zk-ensemble-1 zk-ensemble-2 zk-ensemble-3 postgres mariadb
  pgbouncer-session pgbouncer-tx mariadb-wait-timeout
  "redis-clock-$REDIS_CLOCK_PORT" postgres-clock zookeeper-clock mariadb-clock
)

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

is_server() {
  local s
  for s in "${ALL_SERVERS[@]}"; do
    [[ $s == "$1" ]] && return 0
  done
  return 1
}

# Index (0..2) of an etcd cluster member or a ZooKeeper ensemble server.
member_index() {
  local n=${1#etcd-cluster-}
  n=${n#zk-ensemble-}
  printf '%s\n' "$((n - 1))"
}

# The port of a Redis server (the number its name ends with).
redis_port() { printf '%s\n' "${1##*-}"; }

# The port that identifies a server (client port).
server_port() {
  case $1 in
    redis-*) redis_port "$1" ;;
    etcd) printf '%s\n' "$ETCD_CLIENT_PORT" ;;
    etcd-tls) printf '%s\n' "$ETCD_TLS_CLIENT_PORT" ;;
    etcd-cluster-*) printf '%s\n' "${CLUSTER_CLIENT_PORTS[$(member_index "$1")]}" ;;
    zookeeper) printf '%s\n' "$ZK_PORT" ;;
    zookeeper-clock) printf '%s\n' "$ZK_CLOCK_PORT" ;;
    zookeeper-auth) printf '%s\n' "$ZK_AUTH_PORT" ;;
    zk-ensemble-*) printf '%s\n' "${ZK_ENSEMBLE_CLIENT_PORTS[$(member_index "$1")]}" ;;
    postgres) printf '%s\n' "$PG_PORT" ;;
    postgres-clock) printf '%s\n' "$PG_CLOCK_PORT" ;;
    mariadb) printf '%s\n' "$MARIADB_PORT" ;;
    pgbouncer-session) printf '%s\n' "$PGBOUNCER_SESSION_PORT" ;;
    pgbouncer-tx) printf '%s\n' "$PGBOUNCER_TX_PORT" ;;
    mariadb-wait-timeout) printf '%s\n' "$MARIADB_WAIT_TIMEOUT_PORT" ;;
    mariadb-clock) printf '%s\n' "$MARIADB_CLOCK_PORT" ;;
  esac
}

# Every port a server listens on (checked for foreign listeners before starting).
server_ports() {
  server_port "$1"
  case $1 in
    etcd) printf '%s\n' "$ETCD_PEER_PORT" ;;
    etcd-tls) printf '%s\n' "$ETCD_TLS_PEER_PORT" ;;
    etcd-cluster-*) printf '%s\n' "${CLUSTER_PEER_PORTS[$(member_index "$1")]}" ;;
    zookeeper-auth) printf '%s\n' "$ZK_AUTH_TLS_PORT" ;;
    redis-cluster-*) printf '%s\n' "$(($(redis_port "$1") + 10000))" ;;
    zk-ensemble-*)
      printf '%s\n' "${ZK_ENSEMBLE_QUORUM_PORTS[$(member_index "$1")]}" \
        "${ZK_ENSEMBLE_ELECTION_PORTS[$(member_index "$1")]}"
      ;;
  esac
}

# Expected /proc/PID/comm of a server process.
server_comm() {
  case $1 in
    redis-*) printf 'redis-server\n' ;;
    etcd | etcd-tls | etcd-cluster-*) printf 'etcd\n' ;;
    zookeeper | zookeeper-auth | zookeeper-clock | zk-ensemble-*) printf 'java\n' ;;
    postgres | postgres-clock) printf 'postgres\n' ;;
    mariadb | mariadb-wait-timeout | mariadb-clock) printf 'mariadbd\n' ;;
    pgbouncer-*) printf 'pgbouncer\n' ;;
  esac
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

ensure_packages() {
  local missing=() pkg
  add() {
    local p
    for p in "${missing[@]}"; do [[ $p == "$1" ]] && return 0; done
    missing+=("$1")
  }
  command -v redis-server >/dev/null || add redis-server
  command -v redis-cli >/dev/null || add redis-tools
  command -v etcd >/dev/null || add etcd-server
  command -v etcdctl >/dev/null || add etcd-client
  [[ -f $ZK_JAR ]] || add zookeeper
  command -v java >/dev/null || add zookeeper
  [[ -f /usr/share/java/netty-handler.jar ]] || add libnetty-java
  command -v mariadbd >/dev/null || add mariadb-server
  command -v mariadb-install-db >/dev/null || add mariadb-server
  command -v mariadb >/dev/null || add mariadb-client
  command -v pgbouncer >/dev/null || add pgbouncer
  command -v protoc >/dev/null || add protobuf-compiler
  # etcd-client's build needs the well-known types (google/protobuf/*.proto) besides protoc.
  [[ -f /usr/include/google/protobuf/descriptor.proto ]] || add libprotobuf-dev
  [[ -x $PG_BIN/postgres && -x $PG_BIN/initdb && -x $PG_BIN/psql ]] || add postgresql-15
  [[ -n $(faketime_lib) ]] || add libfaketime
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
  for pkg in redis-server etcd etcdctl mariadbd protoc pgbouncer; do
    command -v "$pkg" >/dev/null || die "$pkg still missing after apt-get install"
  done
  [[ -f $ZK_JAR ]] || die "$ZK_JAR still missing after apt-get install"
  [[ -n $(faketime_lib) ]] || die "libfaketimeMT.so.1 still missing after apt-get install"
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

# The file whose first line is the clock offset of server $1 (FAKETIME_TIMESTAMP_FILE).
# PostgreSQL's lies in its base directory, which its user can always read.
clock_file() {
  case $1 in
    postgres-clock) printf '%s/faketime.rc\n' "$(pg_base postgres-clock)" ;;
    *) printf '%s/clock/%s.rc\n' "$STATE" "$1" ;;
  esac
}

# clock_env NAME: the `env` arguments that run server NAME on the clock of its clock file,
# made "+0" (no offset) when missing (`stop` removes it; restart-one keeps it).
# FAKETIME_NO_CACHE: the file is read at every clock read, so a step takes effect at once; the
# monotonic clocks stay true (only the wall clock steps). Redis (jemalloc) also gets glibc's
# malloc ahead of libfaketime: jemalloc reads the clock while it initializes, libfaketime's own
# start-up then allocates, and the two wait on each other forever (wolfcw/libfaketime#130); with
# glibc's malloc first, nothing of libfaketime enters jemalloc.
clock_env() {
  local file preload
  file=$(clock_file "$1")
  preload=$(faketime_lib)
  [[ -n $preload ]] || die "$1: libfaketimeMT.so.1 is missing (apt-get install libfaketime)"
  if [[ $1 == redis-* ]]; then
    local malloc
    malloc=$(first_file /lib/*/libc_malloc_debug.so.0 /usr/lib/*/libc_malloc_debug.so.0)
    [[ -n $malloc ]] || die "$1: glibc's libc_malloc_debug.so.0 is missing"
    preload="$malloc $preload"
  fi
  mkdir -p "$(dirname "$file")"
  # Kept across restart-one, as a machine's clock is: a restart during a step stays stepped.
  [[ -f $file ]] || printf '+0\n' >"$file"
  chmod 644 "$file"
  printf '%s\n' "LD_PRELOAD=$preload" "FAKETIME_TIMESTAMP_FILE=$file" FAKETIME_NO_CACHE=1 \
    FAKETIME_DONT_FAKE_MONOTONIC=1 DONT_FAKE_MONOTONIC=1
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
# PostgreSQL placement

# Directory holding PostgreSQL's data dir (data/) and its unix socket; owned by postgres.
pg_base() {
  local name=${1:-postgres}
  local rec="$STATE/run/$name.base"
  if [[ -f $rec ]]; then
    cat "$rec"
  else
    data_dir "$name"
  fi
}

# pg_prepare_base [NAME]: chooses (first time) and prepares NAME's pg_base (postgres, or
# postgres-clock); prints it.
pg_prepare_base() {
  local name=${1:-postgres}
  local rec="$STATE/run/$name.base" base
  if [[ -f $rec ]]; then
    base=$(<"$rec")
  else
    base=$(data_dir "$name")
    local sock="$base/.s.PGSQL.$(server_port "$name")"
    if ((${#sock} > 100)) || ! pg_dir_usable "$base"; then
      base="/tmp/distlock-pg-$(state_hash)${name#postgres}"
      log "$name: using $base (the state dir is not usable by the postgres user or too long)"
      pg_dir_usable "$base" || die "$name: cannot prepare $base for the postgres user"
    fi
    printf '%s\n' "$base" >"$rec"
  fi
  mkdir -p "$base"
  if ((EUID == 0)); then
    chown postgres:postgres "$base"
  fi
  chmod 700 "$base"
  printf '%s\n' "$base"
}

# Creates $1 owned by postgres and checks that the postgres user can write in it.
pg_dir_usable() {
  mkdir -p "$1" || return 1
  ((EUID == 0)) || return 0
  chown postgres:postgres "$1" && chmod 700 "$1" || return 1
  runuser -u postgres -- test -w "$1" -a -x "$1" 2>/dev/null
}

pg_run() {
  if ((EUID == 0)); then
    (cd / && runuser -u postgres -- "$@")
  else
    "$@"
  fi
}

# --------------------------------------------------------------------------------------------
# Per-server preparation and launch (both idempotent on an existing data dir)

etcd_token() {
  local f="$STATE/data/$1.token"
  if [[ ! -s $f ]]; then
    printf 'distlock-%s-%s-%s\n' "$1" "$(date +%s%N)" "$$" >"$f"
  fi
  cat "$f"
}

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

zoo_cfg() {
  case $1 in
    zookeeper) printf '%s\n' "$STATE/conf/zoo.cfg" ;;
    zookeeper-auth) printf '%s\n' "$STATE/conf/zoo-auth.cfg" ;;
    zookeeper-clock) printf '%s\n' "$STATE/conf/zoo-clock.cfg" ;;
    zk-ensemble-*) printf '%s\n' "$STATE/conf/zoo-$1.cfg" ;;
  esac
}

# write_zoo_cfg NAME: the config of server NAME (zookeeper or zookeeper-auth).
write_zoo_cfg() {
  local name=$1 cfg
  cfg=$(zoo_cfg "$name")
  mkdir -p "$STATE/conf"
  cat >"$cfg" <<EOF
# generated by scripts/services.sh
dataDir=$(data_dir "$name")
clientPort=$(server_port "$name")
clientPortAddress=$HOST
tickTime=200
minSessionTimeout=400
maxSessionTimeout=60000
maxClientCnxns=0
4lw.commands.whitelist=ruok,srvr,stat,mntr
admin.enableServer=false
preAllocSize=4096
EOF
  if [[ $name == zk-ensemble-* ]]; then
    # A quorum peer: its id in data/NAME/myid, the three servers in the config.
    local j
    printf '%s\n' "$(($(member_index "$name") + 1))" >"$(data_dir "$name")/myid"
    printf 'initLimit=50\nsyncLimit=10\n' >>"$cfg"
    for j in 0 1 2; do
      printf 'server.%s=%s:%s:%s\n' "$((j + 1))" "$HOST" "${ZK_ENSEMBLE_QUORUM_PORTS[j]}" \
        "${ZK_ENSEMBLE_ELECTION_PORTS[j]}" >>"$cfg"
    done
  fi
  if [[ $name == zookeeper-auth ]]; then
    # TLS on the secure port: the PEM key store holds the server's key and certificate.
    local d
    d=$(tls_dir)
    cat "$d/server.key" "$d/server.pem" >"$STATE/conf/zk-auth-keystore.pem"
    chmod 600 "$STATE/conf/zk-auth-keystore.pem"
    cat >>"$cfg" <<EOF
secureClientPort=$ZK_AUTH_TLS_PORT
secureClientPortAddress=$HOST
serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory
ssl.keyStore.location=$STATE/conf/zk-auth-keystore.pem
ssl.keyStore.type=PEM
ssl.trustStore.location=$d/ca.pem
ssl.trustStore.type=PEM
ssl.clientAuth=want
authProvider.1=org.apache.zookeeper.server.auth.SASLAuthenticationProvider
EOF
    # SASL DIGEST-MD5: user distlock with the TLS password, in a JAAS file (not on the command
    # line, where ps shows it).
    (
      umask 077
      printf 'Server {\n  org.apache.zookeeper.server.auth.DigestLoginModule required\n  user_distlock="%s";\n};\n' \
        "$(tls_password)" >"$(zk_jaas)"
    )
    chmod 600 "$(zk_jaas)"
  fi
}

# zk_jaas: the JAAS file of zookeeper-auth (its SASL users).
zk_jaas() { printf '%s\n' "$STATE/conf/zk-auth-jaas.conf"; }

launch() {
  local name=$1 dir
  dir=$(data_dir "$name")
  case $name in
    redis-tls-*)
      # The ACL users live in a config file (not on the command line, where ps shows them).
      local conf t
      tls_material
      t=$(tls_dir)
      mkdir -p "$dir" "$STATE/conf"
      conf="$STATE/conf/$name.conf"
      (
        umask 077
        printf 'user default off\nuser distlock on >%s ~* &* +@all\n' "$(tls_password)" >"$conf"
      )
      spawn "$name" redis-server "$conf" --port 0 --tls-port "$(server_port "$name")" \
        --bind "$HOST" --save '' --appendonly no --daemonize no --dir "$dir" \
        --tls-cert-file "$t/server.pem" --tls-key-file "$t/server.key" \
        --tls-ca-cert-file "$t/ca.pem" --tls-auth-clients optional
      ;;
    redis-cluster-*)
      # nodes.conf (the node's id, epoch and view of the cluster) stays in the data dir, so a
      # restarted node rejoins as itself.
      mkdir -p "$dir"
      spawn "$name" redis-server --port "$(redis_port "$name")" --bind "$HOST" --save '' \
        --appendonly no --daemonize no --dir "$dir" --cluster-enabled yes \
        --cluster-config-file nodes.conf --cluster-node-timeout "$REDIS_CLUSTER_NODE_TIMEOUT" \
        --cluster-require-full-coverage no
      ;;
    redis-repl-* | redis-sentinel-*)
      # Both rewrite their config file (a Sentinel records the topology it learns, a data
      # node the role a Sentinel gave it): written once, kept across restarts.
      local conf="$dir/redis.conf" port
      port=$(redis_port "$name")
      mkdir -p "$dir"
      if [[ ! -f $conf ]]; then
        if [[ $name == redis-sentinel-* ]]; then
          printf '%s\n' "port $port" "bind $HOST" "dir $dir" \
            "sentinel monitor $SENTINEL_MASTER $HOST ${REDIS_REPL_PORTS[0]} 2" \
            "sentinel down-after-milliseconds $SENTINEL_MASTER 1000" \
            "sentinel failover-timeout $SENTINEL_MASTER 4000" \
            "sentinel parallel-syncs $SENTINEL_MASTER 2" >"$conf"
        else
          printf '%s\n' "port $port" "bind $HOST" "dir $dir" 'save ""' "appendonly no" >"$conf"
          if [[ $port != "${REDIS_REPL_PORTS[0]}" ]]; then
            printf 'replicaof %s %s\n' "$HOST" "${REDIS_REPL_PORTS[0]}" >>"$conf"
          fi
        fi
      fi
      if [[ $name == redis-sentinel-* ]]; then
        spawn "$name" redis-server "$conf" --sentinel
      else
        spawn "$name" redis-server "$conf"
      fi
      ;;
    redis-clock-*)
      local envs
      local -a clock
      mkdir -p "$dir"
      envs=$(clock_env "$name")
      mapfile -t clock <<<"$envs"
      spawn "$name" env "${clock[@]}" redis-server --port "$(redis_port "$name")" \
        --bind "$HOST" --save '' --appendonly no --daemonize no --dir "$dir"
      ;;
    redis-*)
      mkdir -p "$dir"
      spawn "$name" redis-server --port "${name#redis-}" --bind "$HOST" --save '' \
        --appendonly no --daemonize no --dir "$dir"
      ;;
    etcd)
      mkdir -p "$dir"
      chmod 700 "$dir"
      spawn "$name" etcd --name etcd-single --data-dir "$dir" --logger zap \
        --listen-client-urls "http://$HOST:$ETCD_CLIENT_PORT" \
        --advertise-client-urls "http://$HOST:$ETCD_CLIENT_PORT" \
        --listen-peer-urls "http://$HOST:$ETCD_PEER_PORT" \
        --initial-advertise-peer-urls "http://$HOST:$ETCD_PEER_PORT" \
        --initial-cluster "etcd-single=http://$HOST:$ETCD_PEER_PORT" \
        --initial-cluster-token "$(etcd_token etcd)" --initial-cluster-state new
      ;;
    etcd-tls)
      mkdir -p "$dir"
      chmod 700 "$dir"
      tls_material
      spawn "$name" etcd --name etcd-tls --data-dir "$dir" --logger zap \
        --listen-client-urls "https://$HOST:$ETCD_TLS_CLIENT_PORT" \
        --advertise-client-urls "https://$HOST:$ETCD_TLS_CLIENT_PORT" \
        --cert-file "$(tls_dir)/server.pem" --key-file "$(tls_dir)/server.key" \
        --client-cert-auth --trusted-ca-file "$(tls_dir)/ca.pem" \
        --auth-token simple --auth-token-ttl "$ETCD_TLS_TOKEN_TTL" \
        --listen-peer-urls "http://$HOST:$ETCD_TLS_PEER_PORT" \
        --initial-advertise-peer-urls "http://$HOST:$ETCD_TLS_PEER_PORT" \
        --initial-cluster "etcd-tls=http://$HOST:$ETCD_TLS_PEER_PORT" \
        --initial-cluster-token "$(etcd_token etcd-tls)" --initial-cluster-state new
      ;;
    etcd-cluster-*)
      local i initial="" j
      i=$(member_index "$name")
      for j in 0 1 2; do
        initial+="${initial:+,}etcd-cluster-$((j + 1))=http://$HOST:${CLUSTER_PEER_PORTS[j]}"
      done
      mkdir -p "$dir"
      chmod 700 "$dir"
      spawn "$name" etcd --name "$name" --data-dir "$dir" --logger zap \
        --listen-client-urls "http://$HOST:${CLUSTER_CLIENT_PORTS[i]}" \
        --advertise-client-urls "http://$HOST:${CLUSTER_CLIENT_PORTS[i]}" \
        --listen-peer-urls "http://$HOST:${CLUSTER_PEER_PORTS[i]}" \
        --initial-advertise-peer-urls "http://$HOST:${CLUSTER_PEER_PORTS[i]}" \
        --initial-cluster "$initial" \
        --initial-cluster-token "$(etcd_token etcd-cluster)" --initial-cluster-state new
      ;;
    zookeeper | zookeeper-auth | zookeeper-clock | zk-ensemble-*)
      local cp="/etc/zookeeper/conf:$ZK_JAR:$SLF4J_SIMPLE_JAR" jar
      local -a extra=() clock=()
      if [[ $name == zookeeper-clock ]]; then
        local envs
        envs=$(clock_env "$name")
        mapfile -t clock <<<"$envs"
        clock=(env "${clock[@]}")
      fi
      local main=org.apache.zookeeper.server.ZooKeeperServerMain
      [[ $name == zk-ensemble-* ]] && main=org.apache.zookeeper.server.quorum.QuorumPeerMain
      mkdir -p "$dir"
      if [[ $name == zookeeper-auth ]]; then
        tls_material
        for jar in "${NETTY_JARS[@]}"; do cp+=":/usr/share/java/netty-$jar.jar"; done
        extra+=("-Djava.security.auth.login.config=$(zk_jaas)")
      fi
      write_zoo_cfg "$name"
      [[ -f $SLF4J_SIMPLE_JAR ]] || log "$name: $SLF4J_SIMPLE_JAR missing, its log stays empty"
      spawn "$name" ${clock[@]+"${clock[@]}"} java -Xmx256m -XX:+UseSerialGC -Djava.net.preferIPv4Stack=true \
        -Dzookeeper.admin.enableServer=false -Dorg.slf4j.simpleLogger.showDateTime=true \
        '-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd HH:mm:ss.SSS' ${extra[@]+"${extra[@]}"} \
        -cp "$cp" "$main" "$(zoo_cfg "$name")"
      ;;
    postgres | postgres-clock)
      local base pgdata
      base=$(pg_prepare_base "$name")
      pgdata="$base/data"
      if [[ ! -f $base/.initialized ]]; then
        rm -rf "$pgdata"
        pg_run "$PG_BIN/initdb" -D "$pgdata" -A trust -U postgres -E UTF8 --locale=C.UTF-8 \
          --no-sync >>"$(log_file "$name")" 2>&1 ||
          die "$name: initdb failed, see $(log_file "$name")"
        # The TLS user only over TLS and with its password; everyone else as before.
        printf '%s\n' 'local all all trust' \
          "hostssl all distlock_tls $HOST/32 scram-sha-256" \
          "host all distlock_tls $HOST/32 reject" \
          "host all all $HOST/32 trust" >"$pgdata/pg_hba.conf"
        touch "$base/.initialized"
      fi
      tls_material
      # The server's key must belong to the server's user, mode 600.
      mkdir -p "$base/tls"
      cp "$(tls_dir)/server.pem" "$(tls_dir)/server.key" "$(tls_dir)/ca.pem" "$base/tls/"
      if ((EUID == 0)); then chown -R postgres:postgres "$base/tls"; fi
      chmod 600 "$base/tls/server.key"
      local cmd=("$PG_BIN/postgres" -D "$pgdata" -c "listen_addresses=$HOST"
        -p "$(server_port "$name")"
        -c "unix_socket_directories=$base" -c dynamic_shared_memory_type=mmap -c fsync=on
        -c max_connections=200 -c ssl=on -c "ssl_cert_file=$base/tls/server.pem"
        -c "ssl_key_file=$base/tls/server.key" -c "ssl_ca_file=$base/tls/ca.pem")
      if [[ $name == postgres-clock ]]; then
        local envs
        local -a clock
        envs=$(clock_env "$name")
        mapfile -t clock <<<"$envs"
        cmd=(env "${clock[@]}" "${cmd[@]}")
      fi
      if ((EUID == 0)); then
        spawn "$name" setpriv --reuid=postgres --regid=postgres --init-groups -- "${cmd[@]}"
      else
        spawn "$name" "${cmd[@]}"
      fi
      ;;
    mariadb)
      local sock="$dir/mysqld.sock" user=()
      ((${#sock} <= 100)) || sock="/tmp/distlock-mariadb-$(state_hash).sock"
      ((EUID == 0)) && user=(--user=root)
      if [[ ! -f $dir/.distlock-initialized ]]; then
        rm -rf "$dir"
        mkdir -p "$dir"
        mariadb-install-db --no-defaults --datadir="$dir" --auth-root-authentication-method=normal \
          "${user[@]}" --skip-test-db >>"$(log_file mariadb)" 2>&1 ||
          die "mariadb: mariadb-install-db failed, see $(log_file mariadb)"
        touch "$dir/.distlock-initialized"
      fi
      tls_material
      spawn "$name" mariadbd --no-defaults "${user[@]}" --datadir="$dir" --port="$MARIADB_PORT" \
        --bind-address="$HOST" --socket="$sock" --pid-file="$STATE/run/mariadbd.pid" \
        --skip-name-resolve --max-connections=300 --character-set-server=utf8mb4 \
        --collation-server=utf8mb4_unicode_ci --ssl-ca="$(tls_dir)/ca.pem" \
        --ssl-cert="$(tls_dir)/server.pem" --ssl-key="$(tls_dir)/server.key"
      ;;
    mariadb-wait-timeout | mariadb-clock)
      # As mariadb without TLS: closing every connection idle for 2 s, or on a wall clock
      # that steps.
      local sock="$dir/mysqld.sock" user=() port=$MARIADB_WAIT_TIMEOUT_PORT extra=(--wait-timeout=2)
      if [[ $name == mariadb-clock ]]; then
        local envs
        local -a clock
        envs=$(clock_env "$name")
        mapfile -t clock <<<"$envs"
        port=$MARIADB_CLOCK_PORT
        extra=()
      fi
      ((${#sock} <= 100)) || sock="/tmp/distlock-$name-$(state_hash).sock"
      ((EUID == 0)) && user=(--user=root)
      if [[ ! -f $dir/.distlock-initialized ]]; then
        rm -rf "$dir"
        mkdir -p "$dir"
        mariadb-install-db --no-defaults --datadir="$dir" --auth-root-authentication-method=normal \
          "${user[@]}" --skip-test-db >>"$(log_file "$name")" 2>&1 ||
          die "$name: mariadb-install-db failed, see $(log_file "$name")"
        touch "$dir/.distlock-initialized"
      fi
      spawn "$name" ${clock[@]+env "${clock[@]}"} mariadbd --no-defaults "${user[@]}" \
        --datadir="$dir" --port="$port" --bind-address="$HOST" --socket="$sock" \
        --pid-file="$STATE/run/$name-mariadbd.pid" --skip-name-resolve --max-connections=300 \
        --character-set-server=utf8mb4 --collation-server=utf8mb4_unicode_ci "${extra[@]}"
      ;;
    pgbouncer-*)
      # It refuses to run as root: as root, it reads its (root-only) files, then becomes the
      # postgres user.
      local user=()
      ((EUID == 0)) && user=(-u postgres)
      mkdir -p "$dir"
      write_pgbouncer_conf "$name"
      spawn "$name" pgbouncer "${user[@]}" "$STATE/conf/$name.ini"
      ;;
  esac
}

# write_pgbouncer_conf NAME: conf/NAME.ini, PgBouncer in front of `postgres` in the pool mode
# its name says (pgbouncer-session, pgbouncer-tx), and the user list it trusts (user postgres,
# no password: PostgreSQL trusts it on loopback). sqlx sends extra_float_digits at start-up,
# which PgBouncer refuses unless told to ignore it. Logs go to stderr (the server's log), without
# a line per connection.
write_pgbouncer_conf() {
  local name=$1 mode=session
  [[ $1 == pgbouncer-tx ]] && mode=transaction
  (
    umask 077
    printf '"postgres" ""\n' >"$STATE/conf/pgbouncer-users.txt"
    printf '%s\n' '[databases]' "distlock = host=$HOST port=$PG_PORT dbname=distlock" \
      '[pgbouncer]' "listen_addr = $HOST" "listen_port = $(server_port "$name")" \
      'unix_socket_dir =' 'auth_type = trust' "auth_file = $STATE/conf/pgbouncer-users.txt" \
      "pool_mode = $mode" 'max_client_conn = 1000' 'default_pool_size = 80' \
      'ignore_startup_parameters = extra_float_digits' 'server_login_retry = 1' \
      'query_wait_timeout = 30' 'log_connections = 0' 'log_disconnections = 0' \
      'logfile =' 'pidfile =' >"$STATE/conf/$name.ini"
  )
}

# --------------------------------------------------------------------------------------------
# Readiness

# zk_srvr [PORT]: the answer to the `srvr` four-letter word (plain port).
zk_srvr() {
  timeout 2 bash -c "exec 3<>/dev/tcp/$HOST/${1:-$ZK_PORT} && printf srvr >&3 && cat <&3" \
    2>/dev/null
}

# mariadb_sql SQL [DATABASE]
mariadb_sql() {
  mariadb --no-defaults --protocol=tcp -h"$HOST" -P"$MARIADB_PORT" -uroot --connect-timeout=2 \
    -e "$1" ${2:+"$2"}
}

# mariadb_wait_timeout_sql SQL [OPTIONS...]: the same against mariadb-wait-timeout (or, with
# MARIADB_WAIT_TIMEOUT_PORT set to its port, mariadb-clock).
mariadb_wait_timeout_sql() {
  local sql=$1
  shift
  mariadb --no-defaults --protocol=tcp -h"$HOST" -P"$MARIADB_WAIT_TIMEOUT_PORT" -uroot \
    --connect-timeout=2 -e "$sql" "$@"
}

# etcdctl against etcd-tls with the test CA and the client certificate; "$@" are its arguments.
etcd_tls_ctl() {
  local d
  d=$(tls_dir)
  ETCDCTL_API=3 timeout 10 etcdctl --endpoints="https://$HOST:$ETCD_TLS_CLIENT_PORT" \
    --cacert="$d/ca.pem" --cert="$d/client.pem" --key="$d/client.key" \
    --dial-timeout=2s --command-timeout=5s "$@"
}

pg_sql() {
  "$PG_BIN/psql" -X -q -h "$HOST" -p "$PG_PORT" -U postgres -d "$1" -tAc "$2"
}

# One readiness probe, no waiting.
probe() {
  case $1 in
    redis-tls-*)
      [[ $(REDISCLI_AUTH=$(tls_password) timeout 2 redis-cli --tls --cacert "$(tls_dir)/ca.pem" \
        -h "$HOST" -p "$(server_port "$1")" --user distlock --no-auth-warning ping 2>/dev/null) == PONG ]]
      ;;
    redis-cluster-*)
      # Alone (before the cluster is formed) or a member of a healthy cluster.
      local info
      info=$(timeout 2 redis-cli -h "$HOST" -p "$(redis_port "$1")" cluster info 2>/dev/null) &&
        [[ $info == *cluster_state:ok* || $info == *cluster_known_nodes:1$'\r'* ]]
      ;;
    redis-sentinel-*)
      [[ -n $(timeout 2 redis-cli -h "$HOST" -p "$(redis_port "$1")" \
        sentinel get-master-addr-by-name "$SENTINEL_MASTER" 2>/dev/null) ]]
      ;;
    redis-*) [[ $(timeout 2 redis-cli -h "$HOST" -p "$(redis_port "$1")" ping 2>/dev/null) == PONG ]] ;;
    etcd-tls) etcd_tls_ctl endpoint health >/dev/null 2>&1 ;;
    etcd | etcd-cluster-*)
      ETCDCTL_API=3 timeout 5 etcdctl --endpoints="http://$HOST:$(server_port "$1")" \
        --dial-timeout=1s --command-timeout=2s endpoint health >/dev/null 2>&1
      ;;
    zookeeper) zk_srvr | grep -q '^Mode:' ;;
    zookeeper-clock) zk_srvr "$ZK_CLOCK_PORT" | grep -q '^Mode:' ;;
    # A quorum peer serves (and answers with its mode) once the ensemble has a leader.
    zk-ensemble-*) zk_srvr "$(server_port "$1")" | grep -qE '^Mode: (leader|follower)' ;;
    zookeeper-auth)
      zk_srvr "$ZK_AUTH_PORT" | grep -q '^Mode:' &&
        # The secure port completes a verified TLS handshake.
        timeout 3 openssl s_client -connect "$HOST:$ZK_AUTH_TLS_PORT" -CAfile "$(tls_dir)/ca.pem" \
          -verify_return_error </dev/null >/dev/null 2>&1
      ;;
    postgres) "$PG_BIN/pg_isready" -q -h "$HOST" -p "$PG_PORT" -t 2 ;;
    postgres-clock) "$PG_BIN/pg_isready" -q -h "$HOST" -p "$PG_CLOCK_PORT" -t 2 ;;
    mariadb) mariadb_sql 'select 1' >/dev/null 2>&1 ;;
    mariadb-wait-timeout) mariadb_wait_timeout_sql 'select 1' >/dev/null 2>&1 ;;
    mariadb-clock) MARIADB_WAIT_TIMEOUT_PORT=$MARIADB_CLOCK_PORT mariadb_wait_timeout_sql 'select 1' >/dev/null 2>&1 ;;
    # Through to PostgreSQL: a query that PgBouncer passes on.
    pgbouncer-*)
      [[ $(PGCONNECT_TIMEOUT=2 timeout 5 "$PG_BIN/psql" -X -q -h "$HOST" -p "$(server_port "$1")" \
        -U postgres -d distlock -tAc 'SELECT 1' 2>/dev/null) == 1 ]]
      ;;
  esac
}

# Work after the first successful probe (idempotent).
post_ready() {
  case $1 in
    postgres)
      if [[ $(pg_sql postgres "SELECT 1 FROM pg_database WHERE datname = 'distlock'") != 1 ]]; then
        pg_sql postgres 'CREATE DATABASE distlock' >&2
      fi
      # The TLS user (its password made at start-up) owns a schema of its own, first on its
      # search path.
      if [[ $(pg_sql distlock "SELECT 1 FROM pg_roles WHERE rolname = 'distlock_tls'") != 1 ]]; then
        pg_sql distlock 'CREATE ROLE distlock_tls LOGIN' >&2
      fi
      pg_sql distlock "ALTER ROLE distlock_tls PASSWORD '$(tls_password)'" >&2 &&
        pg_sql distlock 'CREATE SCHEMA IF NOT EXISTS distlock_tls AUTHORIZATION distlock_tls' >&2 &&
        [[ $(pg_sql distlock 'SELECT 1') == 1 ]]
      ;;
    postgres-clock)
      local psql=("$PG_BIN/psql" -X -q -h "$HOST" -p "$PG_CLOCK_PORT" -U postgres -tA)
      if [[ $("${psql[@]}" -d postgres -c "SELECT 1 FROM pg_database WHERE datname = 'distlock'") != 1 ]]; then
        "${psql[@]}" -d postgres -c 'CREATE DATABASE distlock' >&2
      fi
      [[ $("${psql[@]}" -d distlock -c 'SELECT 1') == 1 ]] && clock_loaded "$1"
      ;;
    redis-clock-* | zookeeper-clock) clock_loaded "$1" ;;
    etcd-tls)
      # Auth on, user root with the TLS password. Idempotent: with auth already on, root's
      # password is checked; otherwise root is made (or its password reset) and auth enabled
      # (etcdctl gives root the root role). The password goes through stdin, not argv.
      if etcd_tls_ctl --user="root:$(tls_password)" user get root >/dev/null 2>&1; then
        return 0
      fi
      if ! etcd_tls_ctl user get root >/dev/null 2>&1; then
        etcd_tls_ctl user add root --interactive=false <<<"$(tls_password)" >&2 || return 1
      fi
      etcd_tls_ctl user passwd root --interactive=false <<<"$(tls_password)" >&2 &&
        etcd_tls_ctl auth enable >&2 &&
        etcd_tls_ctl --user="root:$(tls_password)" user get root >/dev/null
      ;;
    mariadb)
      mariadb_sql "CREATE DATABASE IF NOT EXISTS distlock;
        CREATE USER IF NOT EXISTS 'distlock_tls'@'$HOST';
        ALTER USER 'distlock_tls'@'$HOST' IDENTIFIED BY '$(tls_password)' REQUIRE SSL;
        GRANT ALL ON distlock.* TO 'distlock_tls'@'$HOST';" >&2 &&
        mariadb_sql 'SELECT 1' distlock >/dev/null
      ;;
    mariadb-wait-timeout)
      mariadb_wait_timeout_sql 'CREATE DATABASE IF NOT EXISTS distlock' >&2 &&
        [[ $(mariadb_wait_timeout_sql 'SELECT @@global.wait_timeout' -N distlock) == 2 ]]
      ;;
    mariadb-clock)
      MARIADB_WAIT_TIMEOUT_PORT=$MARIADB_CLOCK_PORT \
        mariadb_wait_timeout_sql 'CREATE DATABASE IF NOT EXISTS distlock' >&2 && clock_loaded "$1"
      ;;
  esac
}

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
  # Last, where a caller that keeps only the tail of this output sees it.
  log "$reason"
  return 1
}

# --------------------------------------------------------------------------------------------
# Stop

stop_signal() {
  case $1 in
    postgres | postgres-clock) printf 'INT\n' ;; # fast shutdown (TERM would wait for clients)
    *) printf 'TERM\n' ;;
  esac
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
# dead (a zombie at most: reaping is up to pid 1 and can take a second). PostgreSQL refuses to
# start while the pid in its lock files (postmaster.pid, the socket's .lock) exists, and a
# zombie does: those stale files go.
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
    if [[ $name == postgres || $name == postgres-clock ]]; then
      rm -f "$(pg_base "$name")/data/postmaster.pid" "$(pg_base "$name")"/.s.PGSQL.*.lock
    fi
    rm -f "$(pid_file "$name")"
    log "$name killed (SIGKILL, data kept)"
  else
    rm -f "$(pid_file "$name")"
    log "$name was not running"
  fi
}

stop_all() {
  local name pid t0 names=() pids=()
  t0=$(now_ms)
  for name in "${ALL_SERVERS[@]}"; do
    [[ $name == etcd-cluster-* ]] && continue
    pid=$(signal_server "$name")
    if [[ -n $pid ]]; then
      names+=("$name")
      pids+=("$pid")
    fi
  done
  # Cluster members one at a time, while the others shut down.
  for name in etcd-cluster-1 etcd-cluster-2 etcd-cluster-3; do
    pid=$(signal_server "$name")
    [[ -n $pid ]] && wait_gone "$name" "$pid"
  done
  local i
  for i in "${!names[@]}"; do
    wait_gone "${names[i]}" "${pids[i]}"
  done
  rm -rf "$STATE/data" "$STATE/conf" "$STATE/run" "$STATE/clock" "/tmp/distlock-pg-$(state_hash)" \
    "/tmp/distlock-pg-$(state_hash)-clock" "/tmp/distlock-mariadb-$(state_hash).sock"
  unregister_state
  log "stopped everything in $(($(now_ms) - t0)) ms; data removed (logs kept in $STATE/logs)"
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

# --------------------------------------------------------------------------------------------
# Start

prepare_state() {
  mkdir -p "$STATE/data" "$STATE/logs" "$STATE/run" "$STATE/conf"
  # Traversable, so the postgres user can reach data/postgres.
  chmod 755 "$STATE" "$STATE/data" 2>/dev/null || true
}

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
  for n in "$@"; do [[ $n == postgres* || $n == mariadb ]] && ordered+=("$n"); done
  for n in "$@"; do [[ $n == postgres* || $n == mariadb ]] || ordered+=("$n"); done
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
    case $name in
      postgres | postgres-clock | mariadb)
        # initdb / install-db take ~1 s: run them in parallel with everything else.
        launch "$name" &
        bg_names+=("$name")
        bg_pids+=("$!")
        ;;
      *) launch "$name" ;;
    esac
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

# --------------------------------------------------------------------------------------------
# Replicated topologies: formed once every member answers, and waited for until healthy

# redis_at PORT ARGS...: redis-cli against a loopback port (empty when it does not answer).
redis_at() {
  local port=$1
  shift
  { timeout 2 redis-cli -h "$HOST" -p "$port" "$@" 2>/dev/null || true; } | tr -d '\r'
}

# info_field TEXT FIELD: the value of `FIELD:value` in an INFO-style answer.
info_field() { sed -n "s/^$2:\(.*\)$/\1/p" <<<"$1" | head -n 1; }

# Forms the Redis Cluster when all six nodes are still alone; then waits until every running
# node reports a healthy cluster and every running replica is in sync with its master.
redis_cluster_settle() {
  local p addrs=() alone=1 t0 deadline info running=()
  for p in "${REDIS_CLUSTER_PORTS[@]}"; do
    is_running "redis-cluster-$p" || continue
    running+=("$p")
    addrs+=("$HOST:$p")
    [[ $(info_field "$(redis_at "$p" cluster info)" cluster_known_nodes) == 1 ]] || alone=0
  done
  ((${#running[@]})) || return 0
  if ((alone)); then
    ((${#running[@]} == ${#REDIS_CLUSTER_PORTS[@]})) || {
      log "redis-cluster: only ${#running[@]} of ${#REDIS_CLUSTER_PORTS[@]} nodes run, cannot form the cluster"
      return 1
    }
    redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes \
      >>"$(log_file redis-cluster-create)" 2>&1 || {
      log "redis-cluster: 'redis-cli --cluster create' failed, see $(log_file redis-cluster-create)"
      return 1
    }
  fi
  t0=$(now_ms)
  deadline=$((t0 + READY_TIMEOUT * 1000))
  for p in "${running[@]}"; do
    while :; do
      info=$(redis_at "$p" cluster info)
      if [[ $(info_field "$info" cluster_state) == ok &&
        $(info_field "$info" cluster_known_nodes) == "${#REDIS_CLUSTER_PORTS[@]}" ]]; then
        info=$(redis_at "$p" info replication)
        [[ $(info_field "$info" role) == master ||
          $(info_field "$info" master_link_status) == up ]] && break
      fi
      if (($(now_ms) > deadline)); then
        log "redis-cluster: node $p not healthy within ${READY_TIMEOUT} s: $(tr '\n' ' ' <<<"$info")"
        return 1
      fi
      sleep 0.1
    done
  done
  log "redis-cluster healthy ($(($(now_ms) - t0)) ms)"
}

# Waits until every running Sentinel knows the other running ones and the master's running
# replicas, and those replicas are in sync.
redis_sentinel_settle() {
  local p s sentinels=0 replicas=0 t0 deadline master info
  for p in "${REDIS_SENTINEL_PORTS[@]}"; do is_running "redis-sentinel-$p" && sentinels=$((sentinels + 1)); done
  ((sentinels)) || return 0
  for p in "${REDIS_REPL_PORTS[@]}"; do is_running "redis-repl-$p" && replicas=$((replicas + 1)); done
  replicas=$((replicas - 1))
  t0=$(now_ms)
  deadline=$((t0 + READY_TIMEOUT * 1000))
  for p in "${REDIS_SENTINEL_PORTS[@]}"; do
    is_running "redis-sentinel-$p" || continue
    while :; do
      info=$(redis_at "$p" sentinel master "$SENTINEL_MASTER" | paste -d: - -)
      master=$(info_field "$info" port)
      s=$(redis_at "$master" info replication)
      if [[ $(info_field "$info" num-other-sentinels) -ge $((sentinels - 1)) &&
        $(info_field "$info" flags) == master &&
        $(info_field "$s" role) == master &&
        $(info_field "$s" connected_slaves) -ge $replicas ]]; then
        break
      fi
      if (($(now_ms) > deadline)); then
        log "redis-sentinel: $p not settled within ${READY_TIMEOUT} s: $(tr '\n' ' ' <<<"$info")"
        return 1
      fi
      sleep 0.1
    done
  done
  log "redis-sentinel settled: master on ${master:-?} ($(($(now_ms) - t0)) ms)"
}

settle_topologies() {
  local n cluster=0 sentinel=0
  for n in "$@"; do
    case $n in
      redis-cluster-*) cluster=1 ;;
      redis-repl-* | redis-sentinel-*) sentinel=1 ;;
    esac
  done
  if ((cluster)); then redis_cluster_settle || return 1; fi
  if ((sentinel)); then redis_sentinel_settle || return 1; fi
}

# One line per member of the replicated topologies: its role now.
topology() {
  local p info n
  for p in "${REDIS_CLUSTER_PORTS[@]}"; do
    info=$(redis_at "$p" info replication)
    printf 'redis-cluster-%s %s\n' "$p" "$(info_field "$info" role || true)"
  done
  for p in "${REDIS_REPL_PORTS[@]}"; do
    info=$(redis_at "$p" info replication)
    printf 'redis-repl-%s %s\n' "$p" "$(info_field "$info" role || true)"
  done
  for p in "${REDIS_SENTINEL_PORTS[@]}"; do
    printf 'redis-sentinel-%s master %s\n' "$p" \
      "$(redis_at "$p" sentinel get-master-addr-by-name "$SENTINEL_MASTER" | paste -sd: -)"
  done
  for n in 1 2 3; do
    printf 'zk-ensemble-%s %s\n' "$n" \
      "$({ zk_srvr "${ZK_ENSEMBLE_CLIENT_PORTS[n - 1]}" || true; } | sed -n 's/^Mode: //p')"
  done
}

# leader_of GROUP: the server name of the group's current leader (empty if none answers).
leader_of() {
  local port n
  case $1 in
    redis-sentinel)
      for port in "${REDIS_SENTINEL_PORTS[@]}"; do
        port=$(redis_at "$port" sentinel get-master-addr-by-name "$SENTINEL_MASTER" | sed -n 2p)
        if [[ -n $port ]]; then
          # The Sentinels may still name a dead master: only a serving master leads.
          if [[ $(info_field "$(redis_at "$port" info replication)" role) == master ]]; then
            printf 'redis-repl-%s\n' "$port"
          fi
          return 0
        fi
      done
      ;;
    redis-cluster)
      for port in "${REDIS_CLUSTER_PORTS[@]}"; do
        if [[ $(info_field "$(redis_at "$port" info replication)" role) == master ]]; then
          printf 'redis-cluster-%s\n' "$port"
          return
        fi
      done
      ;;
    etcd-cluster)
      for n in 1 2 3; do
        if ETCDCTL_API=3 timeout 3 etcdctl --endpoints="http://$HOST:${CLUSTER_CLIENT_PORTS[n - 1]}" \
          endpoint status -w simple 2>/dev/null | awk -F', ' '$5 == "true" { found = 1 } END { exit !found }'; then
          printf 'etcd-cluster-%s\n' "$n"
          return
        fi
      done
      ;;
    zk-ensemble)
      for n in 1 2 3; do
        if zk_srvr "${ZK_ENSEMBLE_CLIENT_PORTS[n - 1]}" | grep -q '^Mode: leader'; then
          printf 'zk-ensemble-%s\n' "$n"
          return
        fi
      done
      ;;
    *) die "failover: unknown group $1 (redis-sentinel, redis-cluster, etcd-cluster, zk-ensemble)" ;;
  esac
}

# failover GROUP: see the usage above. For redis-cluster, the killed master is the first one
# found (its slots' locks fail over; the others' do not), and its successor is the replica that
# takes its place.
failover() {
  local group=$1 mode=${2:-in-sync} old new="" t0 deadline replicas="" port stopped=() filler=""
  t0=$(now_ms)
  if [[ $mode == either ]]; then
    mode=$( ((RANDOM % 2)) && echo lagging || echo in-sync)
  fi
  case $mode:$group in
    in-sync:* | lagging:redis-sentinel | lagging:redis-cluster) ;;
    *) die "failover: mode $mode is not one of in-sync, lagging (Redis groups), either" ;;
  esac
  if [[ $group == redis-cluster ]]; then
    port=$(cluster_lease_master)
    old=${port:+redis-cluster-$port}
  else
    old=$(leader_of "$group")
  fi
  [[ -n $old ]] || die "failover: $group has no leader to kill"
  if [[ $group == redis-* ]]; then
    replicas=$(redis_at "$(redis_port "$old")" info replication |
      sed -n 's/^slave[0-9]*:ip=[^,]*,port=\([0-9]*\).*/\1/p')
  fi
  if [[ $mode == lagging ]]; then
    for port in $replicas; do
      signal_server "${old%-*}-$port" STOP >/dev/null
      stopped+=("${old%-*}-$port")
    done
    filler=$(filler_key "$(redis_port "$old")")
    fill_replication_link "$(redis_port "$old")" "$filler"
    # What the master is asked now (grants, renewals) reaches no replica: a renewal every
    # ttl/3 of a 1 s ttl, and the first lease granted after the fill, die with it.
    sleep 0.6
  fi
  crash_one "$old"
  for port in "${stopped[@]}"; do
    signal_server "$port" CONT >/dev/null
  done
  deadline=$((t0 + 30000))
  while [[ -z $new ]] && (($(now_ms) < deadline)); do
    if [[ $group == redis-cluster ]]; then
      for port in $replicas; do
        if [[ $(info_field "$(redis_at "$port" info replication)" role) == master ]]; then
          new=redis-cluster-$port
        fi
      done
    else
      new=$(leader_of "$group")
      [[ $new != "$old" ]] || new=""
    fi
    [[ -n $new ]] || sleep 0.1
  done
  [[ -n $new ]] || log "failover: no new leader of $group within 30 s"
  log "failover ($mode): $old killed, $group led by ${new:-nobody} after $(($(now_ms) - t0)) ms"
  if [[ -n $filler && -n $new ]]; then
    # Part of the filler may have reached the replicas before they stopped.
    redis_at "$(redis_port "$new")" del "$filler" >/dev/null
  fi
  start_servers "$old"
}

# The port of the Redis Cluster master that holds a live lease (a lock key, `distlock:{..}:l:`,
# with a ttl: a lock held now), else of the first master: the failover of `distlock check`
# then hits the lock it checks.
cluster_lease_master() {
  local port key pttl first=""
  for port in "${REDIS_CLUSTER_PORTS[@]}"; do
    [[ $(info_field "$(redis_at "$port" info replication)" role) == master ]] || continue
    first=${first:-$port}
    while read -r key; do
      pttl=$(redis_at "$port" pttl "$key" </dev/null)
      if [[ $pttl =~ ^[0-9]+$ ]]; then
        printf '%s\n' "$port"
        return
      fi
    done < <(redis_at "$port" --scan --pattern 'distlock:{*}:l:*' | head -n 100)
  done
  [[ -z $first ]] || printf '%s\n' "$first"
}

# filler_key PORT: a key the Redis server on PORT serves (in a Cluster: in one of its slots).
filler_key() {
  local port=$1 range lo hi i slot
  range=$(redis_at "$port" cluster nodes | awk '$3 ~ /myself/ { print $9 }')
  if [[ -z $range ]]; then
    printf 'distlock-failover-filler\n'
    return
  fi
  lo=${range%-*}
  hi=${range#*-}
  for ((i = 0; i < 1000; i++)); do
    slot=$(redis_at "$port" cluster keyslot "distlock-failover-filler-$i")
    if ((slot >= lo && slot <= hi)); then
      printf 'distlock-failover-filler-%s\n' "$i"
      return
    fi
  done
  die "failover: no filler key in the slots $range of $port"
}

# fill_replication_link PORT KEY: 32 MB written to the master on PORT while its replicas are
# stopped: more than the loopback socket buffers hold, so the rest of its replication stream
# waits in the master's memory and dies with it. (A stopped replica alone is no lag: what the
# master sent is in the replica's socket buffer and is applied once it runs again.)
fill_replication_link() {
  local port=$1 key=$2 i
  for i in 1 2 3 4; do
    head -c 8388608 /dev/zero | tr '\0' x |
      { timeout 10 redis-cli -h "$HOST" -p "$port" -x set "$key" >/dev/null 2>&1 || true; }
  done
}

print_env() {
  local urls="" p
  for p in "${REDIS_PORTS[@]}"; do urls+="${urls:+,}redis://$HOST:$p"; done
  printf 'export DISTLOCK_TEST_REDIS_URLS=%s\n' "$urls"
  printf 'export DISTLOCK_TEST_ETCD_ENDPOINTS=http://%s:%s\n' "$HOST" "$ETCD_CLIENT_PORT"
  urls=""
  for p in "${CLUSTER_CLIENT_PORTS[@]}"; do urls+="${urls:+,}http://$HOST:$p"; done
  printf 'export DISTLOCK_TEST_ETCD_CLUSTER_ENDPOINTS=%s\n' "$urls"
  printf 'export DISTLOCK_TEST_ZK_CONNECT=%s:%s\n' "$HOST" "$ZK_PORT"
  urls=""
  for p in "${ZK_ENSEMBLE_CLIENT_PORTS[@]}"; do urls+="${urls:+,}$HOST:$p"; done
  printf 'export DISTLOCK_TEST_ZK_ENSEMBLE_CONNECT=%s\n' "$urls"
  urls=""
  for p in "${REDIS_CLUSTER_PORTS[@]}"; do urls+="${urls:+,}$HOST:$p"; done
  printf 'export DISTLOCK_TEST_REDIS_CLUSTER_URL=redis+cluster://%s\n' "$urls"
  urls=""
  for p in "${REDIS_SENTINEL_PORTS[@]}"; do urls+="${urls:+,}$HOST:$p"; done
  printf 'export DISTLOCK_TEST_REDIS_SENTINEL_URL=redis+sentinel://%s/%s\n' "$urls" "$SENTINEL_MASTER"
  printf 'export DISTLOCK_TEST_POSTGRES_URL=postgres://postgres@%s:%s/distlock?sslmode=disable\n' \
    "$HOST" "$PG_PORT"
  printf 'export DISTLOCK_TEST_MYSQL_URL=mysql://root@%s:%s/distlock?ssl-mode=disabled\n' \
    "$HOST" "$MARIADB_PORT"
  # PostgreSQL through PgBouncer, session and transaction pooling; MariaDB closing idle
  # connections after 2 s.
  printf 'export DISTLOCK_TEST_PGBOUNCER_SESSION_URL=postgres://postgres@%s:%s/distlock?sslmode=disable\n' \
    "$HOST" "$PGBOUNCER_SESSION_PORT"
  printf 'export DISTLOCK_TEST_PGBOUNCER_TX_URL=postgres://postgres@%s:%s/distlock?sslmode=disable\n' \
    "$HOST" "$PGBOUNCER_TX_PORT"
  printf 'export DISTLOCK_TEST_MYSQL_WAIT_TIMEOUT_URL=mysql://root@%s:%s/distlock?ssl-mode=disabled\n' \
    "$HOST" "$MARIADB_WAIT_TIMEOUT_PORT"
  # The same servers over verified TLS, as a password user made at start-up.
  tls_material
  local ca pass
  ca=$(tls_dir)/ca.pem
  pass=$(tls_password)
  printf 'export DISTLOCK_TEST_POSTGRES_TLS_URL=%q\n' \
    "postgres://distlock_tls:$pass@$HOST:$PG_PORT/distlock?sslmode=verify-full&sslrootcert=$ca"
  printf 'export DISTLOCK_TEST_MYSQL_TLS_URL=%q\n' \
    "mysql://distlock_tls:$pass@$HOST:$MARIADB_PORT/distlock?ssl-mode=verify_identity&ssl-ca=$ca"
  local tls_query="ca=$ca&cert=$(tls_dir)/client.pem&key=$(tls_dir)/client.key"
  printf 'export DISTLOCK_TEST_REDIS_TLS_URL=%q\n' \
    "rediss://distlock:$pass@$HOST:${REDIS_TLS_PORTS[0]}?$tls_query"
  urls=""
  for p in "${REDIS_TLS_PORTS[@]}"; do urls+="${urls:+,}$HOST:$p"; done
  printf 'export DISTLOCK_TEST_REDLOCK_TLS_URL=%q\n' "redlocks://distlock:$pass@$urls?$tls_query"
  printf 'export DISTLOCK_TEST_ETCD_TLS_URL=%q\n' \
    "etcds://root:$pass@$HOST:$ETCD_TLS_CLIENT_PORT?$tls_query"
  # ZooKeeper with digest credentials (any user:password pair authenticates; the nodes it
  # creates belong to that identity), and the same over TLS to the secure port.
  printf 'export DISTLOCK_TEST_ZK_AUTH_URL=%q\n' "zk://distlock:$pass@$HOST:$ZK_AUTH_PORT"
  printf 'export DISTLOCK_TEST_ZK_TLS_URL=%q\n' \
    "zks://distlock:$pass@$HOST:$ZK_AUTH_TLS_PORT?ca=$ca"
  # The same server with SASL DIGEST-MD5 (only user distlock, from its JAAS file).
  printf 'export DISTLOCK_TEST_ZK_SASL_URL=%q\n' \
    "zk://distlock:$pass@$HOST:$ZK_AUTH_PORT?auth=sasl"
  # The servers whose wall clock steps, and the file each reads its offset from.
  printf 'export DISTLOCK_TEST_REDIS_CLOCK_URL=redis://%s:%s\n' "$HOST" "$REDIS_CLOCK_PORT"
  printf 'export DISTLOCK_TEST_REDIS_CLOCK_FILE=%q\n' "$(clock_file "redis-clock-$REDIS_CLOCK_PORT")"
  printf 'export DISTLOCK_TEST_POSTGRES_CLOCK_URL=postgres://postgres@%s:%s/distlock?sslmode=disable\n' \
    "$HOST" "$PG_CLOCK_PORT"
  printf 'export DISTLOCK_TEST_POSTGRES_CLOCK_FILE=%q\n' "$(clock_file postgres-clock)"
  printf 'export DISTLOCK_TEST_ZK_CLOCK_URL=zk://%s:%s\n' "$HOST" "$ZK_CLOCK_PORT"
  printf 'export DISTLOCK_TEST_ZK_CLOCK_FILE=%q\n' "$(clock_file zookeeper-clock)"
  printf 'export DISTLOCK_TEST_MYSQL_CLOCK_URL=mysql://root@%s:%s/distlock?ssl-mode=disabled\n' \
    "$HOST" "$MARIADB_CLOCK_PORT"
  printf 'export DISTLOCK_TEST_MYSQL_CLOCK_FILE=%q\n' "$(clock_file mariadb-clock)"
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

lock_state() {
  mkdir -p "$STATE"
  exec 9>"$STATE/.lock"
  flock -w 600 9 || die "another services.sh holds $STATE/.lock"
}

usage() {
  sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2
  exit 2
}

main() {
  local action=${1:-}
  case $action in
    start)
      lock_state
      start_servers "${ALL_SERVERS[@]}"
      print_env
      ;;
    stop)
      lock_state
      stop_all
      ;;
    status) status ;;
    env) print_env ;;
    topology) topology ;;
    failover)
      [[ $# -eq 2 || $# -eq 3 ]] || {
        log "failover needs one GROUP (redis-sentinel, redis-cluster, etcd-cluster, zk-ensemble)" \
          "and at most one MODE (in-sync, lagging, either)"
        exit 2
      }
      lock_state
      failover "$2" "${3:-}"
      ;;
    start-one | stop-one | restart-one | kill-one)
      if [[ $# -ne 2 ]] || ! is_server "$2"; then
        log "$action needs one NAME of: ${ALL_SERVERS[*]}"
        exit 2
      fi
      lock_state
      case $action in
        start-one) start_servers "$2" ;;
        stop-one) stop_one "$2" ;;
        kill-one) crash_one "$2" ;;
        restart-one)
          crash_one "$2"
          UNLOCK_BEFORE_READY=1 start_servers "$2"
          ;;
      esac
      ;;
    *) usage ;;
  esac
}

main "$@"
