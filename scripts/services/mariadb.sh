# mariadb: MariaDB (Debian's mariadb-server, mariadb-client).
#   mariadb                      MariaDB on 13306, database distlock, root without password;
#                                TLS, user distlock_tls with a password, REQUIRE SSL
#   mariadb-wait-timeout         MariaDB on 13307 (database distlock, root without password, no
#                                TLS) that closes every connection idle for 2 s (--wait-timeout=2)
#   mariadb-clock                MariaDB on 13308 under libfaketime the same way as
#                                redis-clock-16420 (database distlock, root without password, no
#                                TLS), its offset in clock/mariadb-clock.rc

# shellcheck shell=bash

MARIADB_PORT=13306
MARIADB_WAIT_TIMEOUT_PORT=13307
MARIADB_CLOCK_PORT=13308

add_servers 140 mariadb
add_servers 160 mariadb-wait-timeout
add_servers 330 mariadb-clock

# The fault-check configurations (the one of mariadb-wait-timeout: a server closing connections
# idle for 2 s).
add_check 30 mysql group=mariadb url=@DISTLOCK_TEST_MYSQL_URL restart="restart-one mariadb"
add_check 30 mysql_tls group=mariadb url=@DISTLOCK_TEST_MYSQL_TLS_URL restart="restart-one mariadb"
add_check 73 mysql_clock group=mariadb-clock url=@DISTLOCK_TEST_MYSQL_CLOCK_URL faults=clock \
  clock=@DISTLOCK_TEST_MYSQL_CLOCK_FILE
add_check 81 mysql_wait_timeout group=mariadb-wait-timeout \
  url=@DISTLOCK_TEST_MYSQL_WAIT_TIMEOUT_URL restart="restart-one mariadb-wait-timeout"
# mariadb-install-db takes ~1 s: launched first, in parallel with everything else.
launch_in_background mariadb

mariadb_port() {
  case $1 in
    mariadb) printf '%s\n' "$MARIADB_PORT" ;;
    mariadb-wait-timeout) printf '%s\n' "$MARIADB_WAIT_TIMEOUT_PORT" ;;
    mariadb-clock) printf '%s\n' "$MARIADB_CLOCK_PORT" ;;
  esac
}

mariadb_comm() { printf 'mariadbd\n'; }

# mariadb_tmp DATADIR: a temporary directory of the instance's own (made if missing). With the
# default /tmp, the three instances' bootstraps run at once share it: one failed with "Could not
# remove temporary table '/tmp/#sql-temptable-...'" and "Unknown table
# 'mysql.tmp_user_nopasswd,mysql.tmp_user_socket'" (CI, 2026-11-29).
mariadb_tmp() {
  mkdir -p "$1.tmp"
  printf '%s\n' "$1.tmp"
}

mariadb_launch() {
  local name=$1 dir
  dir=$(data_dir "$name")
  case $name in
    mariadb)
      local sock="$dir/mysqld.sock" user=()
      ((${#sock} <= 100)) || sock="/tmp/distlock-mariadb-$(state_hash).sock"
      ((EUID == 0)) && user=(--user=root)
      if [[ ! -f $dir/.distlock-initialized ]]; then
        rm -rf "$dir"
        mkdir -p "$dir"
        mariadb-install-db --no-defaults --datadir="$dir" --tmpdir="$(mariadb_tmp "$dir")" \
          --auth-root-authentication-method=normal "${user[@]}" --skip-test-db \
          >>"$(log_file mariadb)" 2>&1 ||
          die "mariadb: mariadb-install-db failed, see $(log_file mariadb)"
        touch "$dir/.distlock-initialized"
      fi
      tls_material
      spawn "$name" mariadbd --no-defaults "${user[@]}" --datadir="$dir" \
        --tmpdir="$(mariadb_tmp "$dir")" --port="$MARIADB_PORT" \
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
        mariadb-install-db --no-defaults --datadir="$dir" --tmpdir="$(mariadb_tmp "$dir")" \
          --auth-root-authentication-method=normal "${user[@]}" --skip-test-db \
          >>"$(log_file "$name")" 2>&1 ||
          die "$name: mariadb-install-db failed, see $(log_file "$name")"
        touch "$dir/.distlock-initialized"
      fi
      spawn "$name" ${clock[@]+env "${clock[@]}"} mariadbd --no-defaults "${user[@]}" \
        --datadir="$dir" --tmpdir="$(mariadb_tmp "$dir")" --port="$port" --bind-address="$HOST" \
        --socket="$sock" \
        --pid-file="$STATE/run/$name-mariadbd.pid" --skip-name-resolve --max-connections=300 \
        --character-set-server=utf8mb4 --collation-server=utf8mb4_unicode_ci "${extra[@]}"
      ;;
  esac
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

mariadb_probe() {
  case $1 in
    mariadb) mariadb_sql 'select 1' >/dev/null 2>&1 ;;
    mariadb-wait-timeout) mariadb_wait_timeout_sql 'select 1' >/dev/null 2>&1 ;;
    mariadb-clock) MARIADB_WAIT_TIMEOUT_PORT=$MARIADB_CLOCK_PORT mariadb_wait_timeout_sql 'select 1' >/dev/null 2>&1 ;;
  esac
}

mariadb_post_ready() {
  case $1 in
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

mariadb_cleanup() { rm -rf "/tmp/distlock-mariadb-$(state_hash).sock"; }

mariadb_env() {
  env_line 140 'DISTLOCK_TEST_MYSQL_URL=mysql://root@%s:%s/distlock?ssl-mode=disabled' \
    "$HOST" "$MARIADB_PORT"
  # MariaDB closing idle connections after 2 s.
  env_line 160 'DISTLOCK_TEST_MYSQL_WAIT_TIMEOUT_URL=mysql://root@%s:%s/distlock?ssl-mode=disabled' \
    "$HOST" "$MARIADB_WAIT_TIMEOUT_PORT"
  # The same server over verified TLS, as the password user made at start-up.
  local pass
  pass=$(tls_password)
  env_line 210 'DISTLOCK_TEST_MYSQL_TLS_URL=%q' \
    "mysql://distlock_tls:$pass@$HOST:$MARIADB_PORT/distlock?ssl-mode=verify_identity&ssl-ca=$(tls_dir)/ca.pem"
  # The server whose wall clock steps, and the file it reads its offset from.
  env_line 330 'DISTLOCK_TEST_MYSQL_CLOCK_URL=mysql://root@%s:%s/distlock?ssl-mode=disabled' \
    "$HOST" "$MARIADB_CLOCK_PORT"
  env_line 330 'DISTLOCK_TEST_MYSQL_CLOCK_FILE=%q' "$(clock_file mariadb-clock)"
}

mariadb_packages() {
  command -v mariadbd >/dev/null || need_package 140 mariadb-server
  command -v mariadb-install-db >/dev/null || need_package 140 mariadb-server
  command -v mariadb >/dev/null || need_package 140 mariadb-client
}

mariadb_installed() { need_commands mariadbd; }
