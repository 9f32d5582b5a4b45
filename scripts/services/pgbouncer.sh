# pgbouncer: PgBouncer (Debian's pgbouncer) in front of the `postgres` server of postgres.sh.
#   pgbouncer-session            PgBouncer on 15440 in front of `postgres` (database distlock,
#                                user postgres; auth_type trust, its user list written at start-up
#                                in conf/), pool_mode=session: a server session per client
#   pgbouncer-tx                 the same on 15441 with pool_mode=transaction (distlock refuses it
#                                at connect; lock-sql/tests/poolers.rs checks that it does)

# shellcheck shell=bash

PGBOUNCER_SESSION_PORT=15440
PGBOUNCER_TX_PORT=15441

add_servers 150 pgbouncer-session pgbouncer-tx

# The fault-check configuration: PostgreSQL through session pooling, the restart PgBouncer's;
# in the postgres group, whose restarts would hit it.
add_check 80 pgbouncer_session group=postgres url=@DISTLOCK_TEST_PGBOUNCER_SESSION_URL \
  restart="restart-one pgbouncer-session"

pgbouncer_port() {
  case $1 in
    pgbouncer-session) printf '%s\n' "$PGBOUNCER_SESSION_PORT" ;;
    pgbouncer-tx) printf '%s\n' "$PGBOUNCER_TX_PORT" ;;
  esac
}

pgbouncer_comm() { printf 'pgbouncer\n'; }

pgbouncer_launch() {
  local name=$1 dir
  dir=$(data_dir "$name")
  # It refuses to run as root: as root, it reads its (root-only) files, then becomes the
  # postgres user.
  local user=()
  ((EUID == 0)) && user=(-u postgres)
  mkdir -p "$dir"
  write_pgbouncer_conf "$name"
  spawn "$name" pgbouncer "${user[@]}" "$STATE/conf/$name.ini"
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
      "pool_mode = $mode" 'max_client_conn = 1000' 'default_pool_size = 200' \
      'ignore_startup_parameters = extra_float_digits' 'server_login_retry = 1' \
      'query_wait_timeout = 30' 'log_connections = 0' 'log_disconnections = 0' \
      'logfile =' 'pidfile =' >"$STATE/conf/$name.ini"
  )
}

# Through to PostgreSQL: a query that PgBouncer passes on.
pgbouncer_probe() {
  [[ $(PGCONNECT_TIMEOUT=2 timeout 5 "$PG_BIN/psql" -X -q -h "$HOST" -p "$(server_port "$1")" \
    -U postgres -d distlock -tAc 'SELECT 1' 2>/dev/null) == 1 ]]
}

pgbouncer_env() {
  # PostgreSQL through PgBouncer, session and transaction pooling.
  env_line 150 'DISTLOCK_TEST_PGBOUNCER_SESSION_URL=postgres://postgres@%s:%s/distlock?sslmode=disable' \
    "$HOST" "$PGBOUNCER_SESSION_PORT"
  env_line 150 'DISTLOCK_TEST_PGBOUNCER_TX_URL=postgres://postgres@%s:%s/distlock?sslmode=disable' \
    "$HOST" "$PGBOUNCER_TX_PORT"
}

pgbouncer_packages() { command -v pgbouncer >/dev/null || need_package 160 pgbouncer; }

pgbouncer_installed() { need_commands pgbouncer; }
