# redis: Redis (Debian's redis-server, redis-tools); a server's port is the number its name ends
# with. Failover groups redis-sentinel (kills the master the Sentinels name) and redis-cluster
# (kills the master holding a live lease, else the first master), both also in MODE lagging: the
# master's replicas stopped and 32 MB put on its replication link first, so the promoted replica
# misses the last 0.6 s of writes.
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
#   redis-clock-16420            a Redis master (no persistence) whose wall clock steps: run
#                                under libfaketime (LD_PRELOAD of its thread-safe libfaketimeMT,
#                                FAKETIME_NO_CACHE, the monotonic clocks left alone), its offset
#                                read from clock/redis-clock-16420.rc at every clock read ("+0"
#                                at a cold start; write e.g. "+3" or "-2.5", seconds, to step it;
#                                `distlock check --faults clock --clock-file FILE` does;
#                                DISTLOCK_TEST_REDIS_CLOCK_FILE names it). glibc's malloc is
#                                preloaded ahead of libfaketime: Debian's Redis uses jemalloc,
#                                whose start-up reads the clock before libfaketime is ready and
#                                hangs otherwise (wolfcw/libfaketime#130)

# shellcheck shell=bash

REDIS_PORTS=(16379 16380 16381 16382 16383)
REDIS_TLS_PORTS=(16390 16391 16392)
REDIS_CLUSTER_PORTS=(17001 17002 17003 17004 17005 17006)
REDIS_CLUSTER_NODE_TIMEOUT=2000
REDIS_REPL_PORTS=(16400 16401 16402)
REDIS_SENTINEL_PORTS=(16410 16411 16412)
SENTINEL_MASTER=distlock
REDIS_CLOCK_PORT=16420

add_servers 100 redis-16379 redis-16380 redis-16381 redis-16382 redis-16383 \
  redis-tls-16390 redis-tls-16391 redis-tls-16392 \
  redis-cluster-17001 redis-cluster-17002 redis-cluster-17003 \
  redis-cluster-17004 redis-cluster-17005 redis-cluster-17006 \
  redis-repl-16400 redis-repl-16401 redis-repl-16402 \
  redis-sentinel-16410 redis-sentinel-16411 redis-sentinel-16412
add_servers 300 "redis-clock-$REDIS_CLOCK_PORT"
add_group 100 redis-sentinel lagging
add_group 100 redis-cluster lagging
failover_mode lagging "Redis groups"

# The fault-check configurations. Redlock of 3 uses 16380-16382, the single master 16379
# alone, Redlock of 5 all five (after Redlock of 3: their servers overlap, their restarts must
# not). Sentinel and Cluster run with a ttl of 6 s, longer than their failover (2.3-4.5 s
# here), so that a holder still passes its check when a promoted replica that missed its lock
# serves; their clients reach the addresses the servers announce, past the workers' proxies:
# host faults only; half of their failovers with the master's replicas lagging (`either`).
add_check 40 redis group=redis url="redis://$HOST:16379" restart="restart-one redis-16379"
add_check 40 redis_fair group=redis url="redis://$HOST:16379?fair=true" \
  restart="restart-one redis-16379"
add_check 40 redis_tls group=redis-tls url=@DISTLOCK_TEST_REDIS_TLS_URL \
  restart="restart-one redis-tls-16390"
add_check 40 redlock3 group=redlock3 url="redlock://$HOST:16380,$HOST:16381,$HOST:16382" \
  restart="restart-one redis-16380"
add_check 40 redlock5 group=redis after=redlock3 \
  url="redlock://$HOST:16379,$HOST:16380,$HOST:16381,$HOST:16382,$HOST:16383" \
  restart="restart-one redis-16382"
add_check 40 redis_sentinel group=redis-sentinel url=@DISTLOCK_TEST_REDIS_SENTINEL_URL ttl=6s \
  duration=30s faults=host restart="failover redis-sentinel either"
add_check 40 redis_cluster group=redis-cluster url=@DISTLOCK_TEST_REDIS_CLUSTER_URL ttl=6s \
  duration=30s faults=host restart="failover redis-cluster either"
add_check 70 redis_clock group=redis-clock url=@DISTLOCK_TEST_REDIS_CLOCK_URL faults=clock \
  clock=@DISTLOCK_TEST_REDIS_CLOCK_FILE
# One master of three on the stepping clock (the two others are never restarted by any
# configuration): a step costs that master's vote alone.
add_check 74 redlock_clock group=redis-clock faults=clock clock=@DISTLOCK_TEST_REDIS_CLOCK_FILE \
  url="redlock://$HOST:$REDIS_CLOCK_PORT,$HOST:16381,$HOST:16383"

# The port of a Redis server (the number its name ends with).
redis_port() { printf '%s\n' "${1##*-}"; }

redis_ports() {
  case $1 in
    redis-cluster-*) printf '%s\n' "$(($(redis_port "$1") + 10000))" ;;
  esac
}

redis_comm() { printf 'redis-server\n'; }

redis_launch() {
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
  esac
}

# Redis (jemalloc) gets glibc's malloc ahead of libfaketime: jemalloc reads the clock while it
# initializes, libfaketime's own start-up then allocates, and the two wait on each other forever
# (wolfcw/libfaketime#130); with glibc's malloc first, nothing of libfaketime enters jemalloc.
redis_clock_preload() {
  local malloc
  malloc=$(first_file /lib/*/libc_malloc_debug.so.0 /usr/lib/*/libc_malloc_debug.so.0)
  [[ -n $malloc ]] || die "$1: glibc's libc_malloc_debug.so.0 is missing"
  printf '%s\n' "$malloc"
}

redis_probe() {
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
  esac
}

redis_post_ready() {
  case $1 in
    redis-clock-*) clock_loaded "$1" ;;
  esac
}

redis_env() {
  local urls="" p
  for p in "${REDIS_PORTS[@]}"; do urls+="${urls:+,}redis://$HOST:$p"; done
  env_line 100 'DISTLOCK_TEST_REDIS_URLS=%s' "$urls"
  urls=""
  for p in "${REDIS_CLUSTER_PORTS[@]}"; do urls+="${urls:+,}$HOST:$p"; done
  env_line 125 'DISTLOCK_TEST_REDIS_CLUSTER_URL=redis+cluster://%s' "$urls"
  urls=""
  for p in "${REDIS_SENTINEL_PORTS[@]}"; do urls+="${urls:+,}$HOST:$p"; done
  env_line 125 'DISTLOCK_TEST_REDIS_SENTINEL_URL=redis+sentinel://%s/%s' "$urls" "$SENTINEL_MASTER"
  # The same over verified TLS, as the ACL user made at start-up.
  local pass tls_query
  pass=$(tls_password)
  tls_query="ca=$(tls_dir)/ca.pem&cert=$(tls_dir)/client.pem&key=$(tls_dir)/client.key"
  env_line 220 'DISTLOCK_TEST_REDIS_TLS_URL=%q' \
    "rediss://distlock:$pass@$HOST:${REDIS_TLS_PORTS[0]}?$tls_query"
  urls=""
  for p in "${REDIS_TLS_PORTS[@]}"; do urls+="${urls:+,}$HOST:$p"; done
  env_line 220 'DISTLOCK_TEST_REDLOCK_TLS_URL=%q' "redlocks://distlock:$pass@$urls?$tls_query"
  # The server whose wall clock steps, and the file it reads its offset from.
  env_line 300 'DISTLOCK_TEST_REDIS_CLOCK_URL=redis://%s:%s' "$HOST" "$REDIS_CLOCK_PORT"
  env_line 300 'DISTLOCK_TEST_REDIS_CLOCK_FILE=%q' "$(clock_file "redis-clock-$REDIS_CLOCK_PORT")"
}

redis_packages() {
  command -v redis-server >/dev/null || need_package 100 redis-server
  command -v redis-cli >/dev/null || need_package 100 redis-tools
}

redis_installed() { need_commands redis-server; }

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

redis_settle() {
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

redis_topology() {
  local p info
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
}

# --------------------------------------------------------------------------------------------
# Failover

redis_leader() {
  local port
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
  esac
}

# For redis-cluster, the killed master is the one holding a live lease, else the first one
# found (its slots' locks fail over; the others' do not), and its successor is the replica that
# takes its place.
redis_failover_victim() {
  local port
  if [[ $1 == redis-cluster ]]; then
    port=$(cluster_lease_master)
    printf '%s\n' "${port:+redis-cluster-$port}"
  else
    redis_leader "$1"
  fi
}

# Between the hooks of one failover: the old master's replicas (ports) and the filler key.
REDIS_FAILOVER_REPLICAS=""
REDIS_FAILOVER_FILLER=""

redis_failover_kill() {
  local old=$2 mode=$3 port stopped=()
  REDIS_FAILOVER_REPLICAS=$(redis_at "$(redis_port "$old")" info replication |
    sed -n 's/^slave[0-9]*:ip=[^,]*,port=\([0-9]*\).*/\1/p')
  if [[ $mode == lagging ]]; then
    for port in $REDIS_FAILOVER_REPLICAS; do
      signal_server "${old%-*}-$port" STOP >/dev/null
      stopped+=("${old%-*}-$port")
    done
    REDIS_FAILOVER_FILLER=$(filler_key "$(redis_port "$old")")
    fill_replication_link "$(redis_port "$old")" "$REDIS_FAILOVER_FILLER"
    # What the master is asked now (grants, renewals) reaches no replica: a renewal every
    # ttl/3 of a 1 s ttl, and the first lease granted after the fill, die with it.
    sleep 0.6
  fi
  crash_one "$old"
  for port in "${stopped[@]}"; do
    signal_server "$port" CONT >/dev/null
  done
}

redis_failover_successor() {
  local group=$1 old=$2 port new=""
  if [[ $group == redis-cluster ]]; then
    for port in $REDIS_FAILOVER_REPLICAS; do
      if [[ $(info_field "$(redis_at "$port" info replication)" role) == master ]]; then
        new=redis-cluster-$port
      fi
    done
  else
    new=$(redis_leader "$group")
    [[ $new != "$old" ]] || new=""
  fi
  [[ -z $new ]] || printf '%s\n' "$new"
}

redis_failover_done() {
  local new=$3
  if [[ -n $REDIS_FAILOVER_FILLER && -n $new ]]; then
    # Part of the filler may have reached the replicas before they stopped.
    redis_at "$(redis_port "$new")" del "$REDIS_FAILOVER_FILLER" >/dev/null
  fi
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
