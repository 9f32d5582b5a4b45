# postgres: PostgreSQL 15 (Debian's postgresql-15).
#   postgres                     PostgreSQL 15 on 15432, database distlock, user postgres, trust;
#                                TLS (ssl=on), user distlock_tls with a password, over TLS only
#   postgres-clock               PostgreSQL 15 on 15433 under libfaketime the same way as
#                                redis-clock-16420 (database distlock, user postgres, trust), its
#                                offset in faketime.rc of its base directory
#                                (DISTLOCK_TEST_POSTGRES_CLOCK_FILE)
# PostgreSQL refuses to run as root, so (when run as root) initdb and the server run as the
# `postgres` user on data/postgres/ (chowned to postgres, mode 700). If the postgres user cannot
# reach that directory (e.g. the repo is under /root) or the socket path would be too long, the
# PostgreSQL directory is /tmp/distlock-pg-<hash of state dir> instead (recorded in
# run/postgres.base and removed by `stop`). Stopped with SIGINT (fast shutdown).

# shellcheck shell=bash

PG_BIN=/usr/lib/postgresql/15/bin
PG_PORT=15432
PG_CLOCK_PORT=15433

add_servers 130 postgres
add_servers 310 postgres-clock

# The fault-check configurations.
add_check 20 postgres group=postgres url=@DISTLOCK_TEST_POSTGRES_URL restart="restart-one postgres"
add_check 20 postgres_tls group=postgres url=@DISTLOCK_TEST_POSTGRES_TLS_URL \
  restart="restart-one postgres"
add_check 71 postgres_clock group=postgres-clock url=@DISTLOCK_TEST_POSTGRES_CLOCK_URL \
  faults=clock clock=@DISTLOCK_TEST_POSTGRES_CLOCK_FILE
# initdb takes ~1 s: launched first, in parallel with everything else.
launch_in_background postgres postgres-clock

postgres_port() {
  case $1 in
    postgres) printf '%s\n' "$PG_PORT" ;;
    postgres-clock) printf '%s\n' "$PG_CLOCK_PORT" ;;
  esac
}

postgres_comm() { printf 'postgres\n'; }

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

# The clock file of postgres-clock lies in its base directory, which its user can always read.
postgres_clock_file() { printf '%s/faketime.rc\n' "$(pg_base postgres-clock)"; }

postgres_launch() {
  local name=$1 base pgdata
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
    -c max_connections=500 -c ssl=on -c "ssl_cert_file=$base/tls/server.pem"
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
}

pg_sql() {
  "$PG_BIN/psql" -X -q -h "$HOST" -p "$PG_PORT" -U postgres -d "$1" -tAc "$2"
}

postgres_probe() {
  case $1 in
    postgres) "$PG_BIN/pg_isready" -q -h "$HOST" -p "$PG_PORT" -t 2 ;;
    postgres-clock) "$PG_BIN/pg_isready" -q -h "$HOST" -p "$PG_CLOCK_PORT" -t 2 ;;
  esac
}

postgres_post_ready() {
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
  esac
}

# Fast shutdown (TERM would wait for clients).
postgres_stop_signal() { printf 'INT\n'; }

# PostgreSQL refuses to start while the pid in its lock files (postmaster.pid, the socket's
# .lock) exists, and a zombie does: after a kill -9, those stale files go.
postgres_after_crash() {
  rm -f "$(pg_base "$1")/data/postmaster.pid" "$(pg_base "$1")"/.s.PGSQL.*.lock
}

postgres_cleanup() {
  rm -rf "/tmp/distlock-pg-$(state_hash)" "/tmp/distlock-pg-$(state_hash)-clock"
}

postgres_env() {
  env_line 130 'DISTLOCK_TEST_POSTGRES_URL=postgres://postgres@%s:%s/distlock?sslmode=disable' \
    "$HOST" "$PG_PORT"
  # The same server over verified TLS, as the password user made at start-up.
  env_line 200 'DISTLOCK_TEST_POSTGRES_TLS_URL=%q' \
    "postgres://distlock_tls:$(tls_password)@$HOST:$PG_PORT/distlock?sslmode=verify-full&sslrootcert=$(tls_dir)/ca.pem"
  # The server whose wall clock steps, and the file it reads its offset from.
  env_line 310 'DISTLOCK_TEST_POSTGRES_CLOCK_URL=postgres://postgres@%s:%s/distlock?sslmode=disable' \
    "$HOST" "$PG_CLOCK_PORT"
  env_line 310 'DISTLOCK_TEST_POSTGRES_CLOCK_FILE=%q' "$(clock_file postgres-clock)"
}

postgres_packages() {
  [[ -x $PG_BIN/postgres && -x $PG_BIN/initdb && -x $PG_BIN/psql ]] || need_package 170 postgresql-15
}
