# etcd: etcd v3 (Debian's etcd-server, etcd-client). Failover group etcd-cluster (kills the
# leader). `stop` stops the cluster members one at a time (all at once, the leader spends ~7 s
# trying to hand over leadership).
#   etcd                         single etcd member, client 12379, peer 12380
#   etcd-tls                     single etcd member, client 12479 over TLS with client
#                                certificates required (--client-cert-auth), peer 12480 (plain);
#                                auth enabled, user root with the TLS password, auth tokens
#                                expire after 10 s idle (--auth-token-ttl, so tests see refreshes)
#   etcd-cluster-1..3            3-member etcd cluster, client 12381..12383, peer 12391..12393

# shellcheck shell=bash

ETCD_CLIENT_PORT=12379
ETCD_PEER_PORT=12380
ETCD_TLS_CLIENT_PORT=12479
ETCD_TLS_PEER_PORT=12480
ETCD_TLS_TOKEN_TTL=10
CLUSTER_CLIENT_PORTS=(12381 12382 12383)
CLUSTER_PEER_PORTS=(12391 12392 12393)

add_servers 110 etcd etcd-tls etcd-cluster-1 etcd-cluster-2 etcd-cluster-3
add_group 110 etcd-cluster
stop_one_at_a_time etcd-cluster-1 etcd-cluster-2 etcd-cluster-3

# The fault-check configurations: a ttl of 2 s (etcd's smallest lease), so 12 s per kind.
add_check 50 etcd group=etcd url="etcd://$HOST:$ETCD_CLIENT_PORT" ttl=2s duration=12s \
  restart="restart-one etcd"
add_check 50 etcd_cluster group=etcd-cluster ttl=2s duration=12s restart="failover etcd-cluster" \
  url="etcd://$(join , "${CLUSTER_CLIENT_PORTS[@]/#/$HOST:}")"
add_check 50 etcd_tls group=etcd-tls url=@DISTLOCK_TEST_ETCD_TLS_URL ttl=2s duration=12s \
  restart="restart-one etcd-tls"

etcd_port() {
  case $1 in
    etcd) printf '%s\n' "$ETCD_CLIENT_PORT" ;;
    etcd-tls) printf '%s\n' "$ETCD_TLS_CLIENT_PORT" ;;
    etcd-cluster-*) printf '%s\n' "${CLUSTER_CLIENT_PORTS[$(member_index "$1")]}" ;;
  esac
}

etcd_ports() {
  case $1 in
    etcd) printf '%s\n' "$ETCD_PEER_PORT" ;;
    etcd-tls) printf '%s\n' "$ETCD_TLS_PEER_PORT" ;;
    etcd-cluster-*) printf '%s\n' "${CLUSTER_PEER_PORTS[$(member_index "$1")]}" ;;
  esac
}

etcd_comm() { printf 'etcd\n'; }

etcd_token() {
  local f="$STATE/data/$1.token"
  if [[ ! -s $f ]]; then
    printf 'distlock-%s-%s-%s\n' "$1" "$(date +%s%N)" "$$" >"$f"
  fi
  cat "$f"
}

etcd_launch() {
  local name=$1 dir
  dir=$(data_dir "$name")
  case $name in
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
  esac
}

# etcdctl against etcd-tls with the test CA and the client certificate; "$@" are its arguments.
etcd_tls_ctl() {
  local d
  d=$(tls_dir)
  ETCDCTL_API=3 timeout 10 etcdctl --endpoints="https://$HOST:$ETCD_TLS_CLIENT_PORT" \
    --cacert="$d/ca.pem" --cert="$d/client.pem" --key="$d/client.key" \
    --dial-timeout=2s --command-timeout=5s "$@"
}

etcd_probe() {
  case $1 in
    etcd-tls) etcd_tls_ctl endpoint health >/dev/null 2>&1 ;;
    etcd | etcd-cluster-*)
      ETCDCTL_API=3 timeout 5 etcdctl --endpoints="http://$HOST:$(server_port "$1")" \
        --dial-timeout=1s --command-timeout=2s endpoint health >/dev/null 2>&1
      ;;
  esac
}

etcd_post_ready() {
  case $1 in
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
  esac
}

etcd_env() {
  local urls="" p
  env_line 110 'DISTLOCK_TEST_ETCD_ENDPOINTS=http://%s:%s' "$HOST" "$ETCD_CLIENT_PORT"
  for p in "${CLUSTER_CLIENT_PORTS[@]}"; do urls+="${urls:+,}http://$HOST:$p"; done
  env_line 110 'DISTLOCK_TEST_ETCD_CLUSTER_ENDPOINTS=%s' "$urls"
  # etcd-tls over verified TLS with the client certificate, as root.
  local d
  d=$(tls_dir)
  env_line 230 'DISTLOCK_TEST_ETCD_TLS_URL=%q' \
    "etcds://root:$(tls_password)@$HOST:$ETCD_TLS_CLIENT_PORT?ca=$d/ca.pem&cert=$d/client.pem&key=$d/client.key"
}

etcd_packages() {
  command -v etcd >/dev/null || need_package 110 etcd-server
  command -v etcdctl >/dev/null || need_package 110 etcd-client
  # etcd-client's build (the Rust crate) needs protoc and the well-known types
  # (google/protobuf/*.proto).
  command -v protoc >/dev/null || need_package 165 protobuf-compiler
  [[ -f /usr/include/google/protobuf/descriptor.proto ]] || need_package 165 libprotobuf-dev
}

etcd_installed() { need_commands etcd etcdctl protoc; }

etcd_leader() {
  local n
  case $1 in
    etcd-cluster)
      for n in 1 2 3; do
        if ETCDCTL_API=3 timeout 3 etcdctl --endpoints="http://$HOST:${CLUSTER_CLIENT_PORTS[n - 1]}" \
          endpoint status -w simple 2>/dev/null | awk -F', ' '$5 == "true" { found = 1 } END { exit !found }'; then
          printf 'etcd-cluster-%s\n' "$n"
          return
        fi
      done
      ;;
  esac
}
