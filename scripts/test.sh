#!/usr/bin/env bash
# The project's test command (CI runs it through .ci/run).
#
# Starts every test server (scripts/services.sh start; installs the Debian packages on first use,
# including protoc, which the etcd-client build needs), exports their addresses with
# DISTLOCK_TEST_REQUIRE=all (a missing backend fails instead of skipping), then runs:
#   cargo fmt --all -- --check
#   cargo clippy --workspace --all-targets --all-features -- -D warnings
#   cargo clippy -p distlock-sql --no-default-features --features F --all-targets (each database alone)
#   cargo clippy -p distlock -p distlock-cli --no-default-features [--features F] --all-targets
#     (no backend, then each backend alone, both packages in one pass; and distlock with only
#     `blocking`)
#   cargo +RUST_VERSION check --workspace --all-features --all-targets (the declared
#     rust-version; the toolchain is installed with rustup on first use)
#   RUSTDOCFLAGS=-Dwarnings cargo doc --workspace --all-features --no-deps
#   cargo publish --workspace --dry-run --allow-dirty (packages every crate without
#     publish = false and builds each one from its .crate file, the other workspace crates
#     served by a local overlay registry; in target/publish-dry-run; needs the crates.io index;
#     about 2.5 min cold, 50 s with the third-party crates already built)
#   cargo test --workspace --all-features --no-run, then --doc, then the test binaries as
#     lanes (run_lanes below): the binaries of the crates that stop no server first, then the
#     backend crates' conformance suites, then their other binaries: Redis's alone, then
#     etcd's, ZooKeeper's and SQL's at once (each stops and starts only its own servers)
#   scripts/fault-check.sh (`distlock check` on every configuration under faults)
# The steps from the per-feature lints to the publish dry run need no server: they run in the
# background, at the lowest priority, while the test binaries run (see start_background).
# Every step runs even when an earlier one failed (so one run reports everything); the script
# exits with the exit code of the first failing step (or of the server start-up), 0 otherwise.
# The servers are stopped on exit, also on failure or interruption, unless all of them were
# already running before this script started (a developer's `scripts/services.sh start`): then
# they are left running (set DISTLOCK_TEST_STOP_SERVICES=1 to stop them anyway).
# Extra arguments are passed to `cargo test` (e.g. scripts/test.sh -- --nocapture).
# DISTLOCK_TEST_STEPS=test,fault-check (a comma list of the step names the summary prints) runs
# only those steps, for a developer; CI runs them all.
#
# Build cache: under CI=true, when CARGO_TARGET_DIR is not set, every build goes to a target
# dir that outlives the clone (DISTLOCK_CI_CACHE, default ~/.cache/distlock-ci/target), as a CI
# cache would: a fresh clone then rebuilds only the workspace's own crates (cargo's
# fingerprints decide, as in any target dir), not the ~400 third-party ones. A cold cache only
# costs time; the cache is emptied first when it has grown past DISTLOCK_CI_CACHE_MAX_GB
# (default 30) or less than 15 GB are free on its disk. Builds there are not incremental.
set -euo pipefail

cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.."
REPO=$(pwd -P)

if ! command -v cargo >/dev/null 2>&1; then
  for dir in "${CARGO_HOME:-$HOME/.cargo}/bin" "$HOME/.cargo/bin" /usr/local/cargo/bin; do
    if [[ -x $dir/cargo ]]; then
      PATH="$dir:$PATH"
      break
    fi
  done
  export PATH
fi
command -v cargo >/dev/null 2>&1 || {
  echo "test.sh: cargo not found (looked on PATH, ~/.cargo/bin, /usr/local/cargo/bin)" >&2
  exit 127
}

SERVICES="$REPO/scripts/services.sh"
# In CI (a fresh clone on the developer's machine) stop servers a developer left running.
if [[ ${CI:-} == true || ${CI:-} == 1 ]]; then
  export DISTLOCK_SERVICES_TAKEOVER=${DISTLOCK_SERVICES_TAKEOVER:-1}
  if [[ -z ${CARGO_TARGET_DIR:-} ]]; then
    cache=${DISTLOCK_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/distlock-ci}
    mkdir -p "$cache/target"
    used_gb=$(($(du -sk "$cache/target" | cut -f1) / 1024 / 1024))
    free_gb=$(($(df -Pk "$cache" | awk 'NR == 2 { print $4 }') / 1024 / 1024))
    if ((used_gb > ${DISTLOCK_CI_CACHE_MAX_GB:-30} || free_gb < 15)); then
      echo "==> test.sh: build cache $cache/target holds ${used_gb} GB, ${free_gb} GB free: emptying it" >&2
      rm -rf "$cache/target"
      mkdir -p "$cache/target"
    fi
    export CARGO_TARGET_DIR=$cache/target
    # No incremental artifacts: they double the cache and CI rebuilds each crate once.
    export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
    echo "==> test.sh: build cache $CARGO_TARGET_DIR (${used_gb} GB)" >&2
  fi
fi
services_started=0

# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ -n ${background_pid:-} ]]; then
    kill "$background_pid" 2>/dev/null || true
  fi
  [[ -z ${BACKGROUND:-} ]] || rm -rf "$BACKGROUND"
  if ((services_started)); then
    "$SERVICES" stop || echo "test.sh: stopping the servers failed" >&2
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

now_ms() {
  local s
  s=$(date +%s%N)
  printf '%s\n' "$((s / 1000000))"
}

fmt_ms() { printf '%d.%01ds' "$(($1 / 1000))" "$((($1 % 1000) / 100))"; }

first_rc=0
summary=()

# skipped NAME: whether DISTLOCK_TEST_STEPS leaves step NAME out (and then records it so).
skipped() {
  if [[ -n ${DISTLOCK_TEST_STEPS:-} && ,$DISTLOCK_TEST_STEPS, != *,"$1",* ]]; then
    echo "==> test.sh: $1 skipped (DISTLOCK_TEST_STEPS=$DISTLOCK_TEST_STEPS)" >&2
    summary+=("$1 skipped")
    return 0
  fi
  return 1
}

# record_step NAME RC MS: prints and records the outcome of a finished step.
record_step() {
  local name=$1 rc=$2 took
  took=$(fmt_ms "$3")
  if (($2 == 0)); then
    echo "==> test.sh: $name ok ($took)" >&2
    summary+=("$name ok $took")
  else
    echo "==> test.sh: $name FAILED with exit code $rc ($took)" >&2
    summary+=("$name FAILED(rc=$rc) $took")
    ((first_rc != 0)) || first_rc=$rc
  fi
}

# run_step NAME COMMAND... : runs the command, records its time and exit code, never exits.
run_step() {
  local name=$1 t0 rc=0
  shift
  skipped "$name" && return
  echo "==> test.sh: $name: $*" >&2
  t0=$(now_ms)
  "$@" || rc=$?
  record_step "$name" "$rc" "$(($(now_ms) - t0))"
}

# The static checks that need no server (lints per feature, the rust-version build, docs, the
# publish dry run) run in the background while the tests run, which mostly wait on ttls and
# servers (the lanes used about half of the 2 CPUs): at the lowest CPU and I/O priority
# (nice 19, ionice idle), one after another, each one's output kept in a file and printed,
# with its outcome, by finish_background once the tests are done. They share cargo's target
# dir with nothing else then: the tests run prebuilt binaries.
BACKGROUND=$(mktemp -d)
background_steps=()
# background_step NAME COMMAND...: queues a background step (see start_background).
background_step() {
  skipped "$1" && return
  background_steps+=("$1")
  printf '%q ' "$@" >>"$BACKGROUND/queue"
  printf '\n' >>"$BACKGROUND/queue"
}
# start_background: runs the queued steps one after another in a background subshell.
start_background() {
  [[ -s $BACKGROUND/queue ]] || return 0
  (
    renice -n 19 -p "$BASHPID" >/dev/null
    ionice -c 3 -p "$BASHPID" 2>/dev/null || true
    while read -r line; do
      eval "set -- $line"
      name=$1
      shift
      t0=$(now_ms)
      rc=0
      { echo "==> test.sh: $name (in the background): $*"; "$@"; } >"$BACKGROUND/$name.log" 2>&1 || rc=$?
      echo "$rc $(($(now_ms) - t0))" >"$BACKGROUND/$name.rc"
    done <"$BACKGROUND/queue"
  ) &
  background_pid=$!
}
# finish_background: waits for the background steps, prints their output and outcomes.
finish_background() {
  local name result
  [[ -n ${background_pid:-} ]] || return 0
  wait "$background_pid" || true
  for name in "${background_steps[@]}"; do
    cat "$BACKGROUND/$name.log" >&2
    result=$(cat "$BACKGROUND/$name.rc" 2>/dev/null || echo "1 0")
    record_step "$name" "${result% *}" "${result#* }"
  done
}

echo "==> test.sh: $(cargo --version), $(rustc --version)" >&2

t0=$(now_ms)
if "$SERVICES" status >/dev/null 2>&1 && [[ ${DISTLOCK_TEST_STOP_SERVICES:-0} != 1 ]]; then
  echo "==> test.sh: all servers already running: using them and leaving them running" >&2
else
  services_started=1
fi
exports=$("$SERVICES" start) || {
  rc=$?
  echo "==> test.sh: starting the test servers FAILED with exit code $rc" >&2
  exit "$rc"
}
eval "$exports"
echo "==> test.sh: servers ready ($(fmt_ms "$(($(now_ms) - t0))")):" >&2
while IFS= read -r line; do printf '    %s\n' "$line"; done <<<"$exports" >&2
export DISTLOCK_TEST_REQUIRE=all
# The conformance configurations that differ from another only in how they connect (TLS,
# authentication) run the cases that depend on the connection (conformance-tests'
# TRANSPORT_CASES: 14 of 51); scripts/soak.sh runs them in full (DISTLOCK_TEST_VARIANTS=full
# here does too).
export DISTLOCK_TEST_VARIANTS=${DISTLOCK_TEST_VARIANTS:-transport}

# zk_clock start|stop: ZooKeeper under libfaketime (zookeeper-clock) keeps a CPU busy while it
# runs: with libfaketime's monotonic fix, which Debian's glibc gets, the JVM's timed waits
# return at once and spin (wolfcw/libfaketime#425); without it (FAKETIME_FORCE_MONOTONIC_FIX=0)
# they end early on a forward step, and ZooKeeper expired sessions at the step, which a real
# clock step does not do. So when this script started the servers, that one runs only while a
# step uses it: the shared lane (distlock-cli's clock test) and the fault check.
zk_clock() {
  ((services_started)) || return 0
  "$SERVICES" "$1-one" zookeeper-clock >/dev/null ||
    echo "==> test.sh: $1-one zookeeper-clock failed" >&2
}
zk_clock stop

run_step fmt cargo fmt --all -- --check
run_step clippy cargo clippy --workspace --all-targets --all-features -- -D warnings
# Each database of distlock-sql is a cargo feature that must build (and lint) alone.
lint_sql_features() {
  local feature
  for feature in postgres mysql sqlite; do
    cargo clippy -p distlock-sql --no-default-features --features "$feature" --all-targets -- -D warnings || return
  done
}
background_step clippy-sql-features lint_sql_features
# The facade and the CLI with no backend and with each backend alone: the "feature off" paths
# (a URL whose backend is not compiled in, tests gated on a feature) must build and lint.
# Both packages in one invocation per feature: the CLI's build checks the facade with the same
# feature anyway (it enables only `distlock/<feature>`), so one pass lints both.
# The backend features are distlock-cli's `all-backends` (scripts/lib/backends.py).
lint_each_feature() {
  local feature features
  features=$(cargo metadata --no-deps --format-version 1 |
    python3 "$REPO/scripts/lib/backends.py" features) || return
  cargo clippy -p distlock -p distlock-cli --no-default-features --all-targets -- -D warnings ||
    return
  for feature in $features; do
    cargo clippy -p distlock -p distlock-cli --no-default-features --features "$feature" \
      --all-targets -- -D warnings || return
  done
  # The facade's feature that is not a backend: distlock::blocking alone.
  cargo clippy -p distlock --no-default-features --features blocking --all-targets -- -D warnings
}
background_step clippy-each-feature lint_each_feature
# The declared rust-version (workspace Cargo.toml) builds everything, tests included. The
# toolchain is installed on first use (rustup, minimal profile); own target dir.
check_rust_version() {
  local version
  version=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
  [[ -n $version ]] || { echo "test.sh: no rust-version in Cargo.toml" >&2; return 1; }
  if ! rustup run "$version" rustc --version >/dev/null 2>&1; then
    rustup toolchain install "$version" --profile minimal || return
  fi
  CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$REPO/target}/rust-version \
    cargo "+$version" check --workspace --all-features --all-targets
}
background_step rust-version check_rust_version
background_step doc env RUSTDOCFLAGS=-Dwarnings cargo doc --workspace --all-features --no-deps
# What crates.io would get: packaging errors (files outside a package, missing readme or license
# files) and crates that only build inside the workspace. --allow-dirty: a developer's working
# tree is packaged as it is. The overlay registry serves our crates under their unchanged
# versions, and cargo takes a registry crate for immutable: a second run would reuse the first
# run's unpacked sources (CARGO_HOME/registry/src/-HASH/, the nameless registries are the local
# overlays) and build artifacts, i.e. verify against stale code. So the step has a target dir of
# its own and first forgets our crates there (`cargo clean --workspace` matches every source of
# a member's name) and in the unpacked sources (every published crate is named distlock*);
# third-party builds stay cached.
publish_dry_run() {
  local dir=${CARGO_TARGET_DIR:-$REPO/target}/publish-dry-run
  rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/distlock*-[0-9]* "$dir/package"
  cargo clean --quiet --target-dir "$dir" --workspace || return
  CARGO_TARGET_DIR=$dir cargo publish --workspace --dry-run --allow-dirty
}
background_step publish-dry-run publish_dry_run
# The workspace's tests. With arguments, plain `cargo test --workspace --all-features ARGS`.
# Without, cargo builds every test binary once (step test-build, `--no-run`), the doctests run
# (step doctest), then the binaries run in lanes (step test) as cargo would run them (from
# their package's directory), each binary's time in its lane's output (printed when the lane
# ends, with the lane's time):
#   1. the binaries of the crates that stop no server (lane "shared": the CLI's tests use the
#      Redis and SQL servers that the backend crates' fault cases stop), two at a time
#      (DISTLOCK_TEST_SHARED_WORKERS), each worker taking the next binary when its last one
#      ends: one after another they took 232 s of a CI run's 1,091 s of tests, mostly waiting
#      (the CLI's bench, clock and overlap tests: 45, 33 and 32 s). The CLI's bench binary
#      runs first, alone (POOL_ALONE): its hold scenario counts the requests of the whole
#      Redis server, and another binary's beside it made 50 locks look like 42.6 requests
#      per renewal tick where batching makes 1 (CI, 2026-12-01);
#   2. the conformance binaries of the backend crates, in groups (CONFORMANCE_GROUPS), one
#      group after another, the binaries of a group at once: Redis's with SQL's, then etcd's,
#      ZooKeeper's and NATS's (a backend named in no group runs in a last one); then their
#      other binaries, all lanes at once. Each backend's tests stop and start only its own
#      servers and mostly wait out ttls; within a conformance binary the disruptive cases run
#      alone (conformance-tests' `Turns`), and the case holding many locks
#      (`many_locks_stay_held`) runs alone on the machine: no case of any binary beside it
#      (`machine_turn`). Before that turn, that case was the one that failed whenever
#      binaries ran at once: on etcd, NATS, ZooKeeper and MariaDB with four at once
#      (renewals starved, locks lost), on zk_tls and NATS with ZooKeeper's and NATS's
#      together, on etcd beside SQL's cases (2026-11-30: 500 of 10,000 locks, ConnectionLost);
#      so the binaries ran one after another (the history of this file), about 1,300 s.
#      DISTLOCK_TEST_PARALLEL_LANES=0 runs every lane one after another.
PLAN=$BACKGROUND/plan
# The binaries (name prefixes) of a pooled lane that run alone (see run_pool).
POOL_ALONE="bench-"
# The groups of conformance lanes, separated by `;` (DISTLOCK_TEST_LANE_GROUPS).
CONFORMANCE_GROUPS=${DISTLOCK_TEST_LANE_GROUPS:-redis sql;etcd zookeeper nats}
# build_tests: builds every test binary, their lanes in $PLAN (scripts/lib/test-lanes.py; a
# lane per backend crate, scripts/lib/backends.py).
build_tests() {
  cargo metadata --no-deps --format-version 1 |
    python3 "$REPO/scripts/lib/backends.py" crates >"$BACKGROUND/crates" || return
  cargo test --workspace --all-features --no-run --message-format=json-render-diagnostics |
    python3 "$REPO/scripts/lib/test-lanes.py" "$BACKGROUND/crates" >"$PLAN.new" &&
    mv "$PLAN.new" "$PLAN"
}
# run_lanes: the test binaries of $PLAN (built first when the test-build step was left out).
run_lanes() {
  local plan lanes_dir rc=0
  [[ -s $PLAN ]] || build_tests || return
  plan=$(<"$PLAN")
  lanes_dir=$(mktemp -d)
  # run_binary LANE ROOT EXE LOG: one test binary, as cargo runs it (from its package's
  # directory), its output and time appended to LOG; returns its exit status.
  run_binary() {
    local lane=$1 root=$2 exe=$3 log=$4 name args=() b0 brc=0
    name=${exe##*/}
    echo "---- $lane: $name" >>"$log"
    # The conformance suites mostly wait out ttls, and their disruptive cases run alone
    # (conformance-tests' `Turns`): more test threads than cores overlap the waits.
    [[ $name != conformance-* ]] || args=(--test-threads="${DISTLOCK_CONFORMANCE_THREADS:-6}")
    b0=$(now_ms)
    (cd "$root" && CARGO_MANIFEST_DIR=$root "$exe" "${args[@]}") >>"$log" 2>&1 || brc=$?
    echo "---- $lane: $name: exit $brc in $(fmt_ms "$(($(now_ms) - b0))")" >>"$log"
    return "$brc"
  }
  # run_lane LANE PART: the binaries of LANE, PART = all, conformance or other (not
  # conformance), one after another; output and time in $lanes_dir/LANE-PART.{log,rc}.
  run_lane() {
    local lane=$1 part=$2 t0 lane_rc=0 l root exe name brc
    t0=$(now_ms)
    : >"$lanes_dir/$lane-$part.log"
    while IFS=$'\t' read -r l root exe; do
      [[ $l == "$lane" ]] || continue
      name=${exe##*/}
      case $part in
        conformance) [[ $name == conformance-* ]] || continue ;;
        other) [[ $name != conformance-* ]] || continue ;;
      esac
      brc=0
      run_binary "$lane" "$root" "$exe" "$lanes_dir/$lane-$part.log" || brc=$?
      ((brc == 0)) || lane_rc=$brc
    done <<<"$plan"
    echo "$lane_rc $(fmt_ms "$(($(now_ms) - t0))")" >"$lanes_dir/$lane-$part.rc"
  }
  # run_pool LANE WORKERS: the binaries of LANE (all of them), WORKERS at a time: each worker
  # takes the next binary of the plan when its last one ends. Output as run_lane's, each
  # worker's binaries together. The binaries named in POOL_ALONE run first, one after
  # another, with no other beside them.
  run_pool() {
    local lane=$1 workers=$2 t0 w pids=() lane_rc=0 wrc l root exe brc
    t0=$(now_ms)
    : >"$lanes_dir/$lane.queue"
    : >"$lanes_dir/$lane-alone.log"
    while IFS=$'\t' read -r l root exe; do
      [[ $l == "$lane" ]] || continue
      local alone=0 prefix
      for prefix in $POOL_ALONE; do [[ ${exe##*/} != "$prefix"* ]] || alone=1; done
      if ((alone)); then
        brc=0
        run_binary "$lane" "$root" "$exe" "$lanes_dir/$lane-alone.log" || brc=$?
        ((brc == 0)) || lane_rc=$brc
      else
        printf '%s\t%s\t%s\n' "$l" "$root" "$exe" >>"$lanes_dir/$lane.queue"
      fi
    done <<<"$plan"
    [[ ${DISTLOCK_TEST_PARALLEL_LANES:-1} == 1 ]] || workers=1
    echo 1 >"$lanes_dir/$lane.next"
    for ((w = 1; w <= workers; w++)); do
      (
        local n line root exe worker_rc=0 brc
        : >"$lanes_dir/$lane-worker$w.log"
        while :; do
          n=$(flock "$lanes_dir/$lane.next" bash -c \
            'n=$(<"$1"); echo $((n + 1)) >"$1"; echo "$n"' _ "$lanes_dir/$lane.next")
          line=$(sed -n "${n}p" "$lanes_dir/$lane.queue")
          [[ -n $line ]] || break
          IFS=$'\t' read -r _ root exe <<<"$line"
          brc=0
          run_binary "$lane" "$root" "$exe" "$lanes_dir/$lane-worker$w.log" || brc=$?
          ((brc == 0)) || worker_rc=$brc
        done
        exit "$worker_rc"
      ) &
      pids+=("$!")
    done
    for w in "${pids[@]}"; do
      wrc=0
      wait "$w" || wrc=$?
      ((wrc == 0)) || lane_rc=$wrc
    done
    cat "$lanes_dir/$lane-alone.log" "$lanes_dir/$lane"-worker*.log >"$lanes_dir/$lane-all.log"
    echo "$lane_rc $(fmt_ms "$(($(now_ms) - t0))")" >"$lanes_dir/$lane-all.rc"
  }
  show_lane() {
    local lane=$1 part=$2 result
    result=$(cat "$lanes_dir/$lane-$part.rc")
    cat "$lanes_dir/$lane-$part.log" >&2
    echo "==> test.sh: lane $lane ($part): exit ${result% *} in ${result#* }" >&2
    [[ ${result% *} == 0 ]] || rc=1
  }
  # run_group PART LANE...: PART of the LANEs at once (one after another with
  # DISTLOCK_TEST_PARALLEL_LANES=0), then their output.
  run_group() {
    local part=$1 lane pids=()
    shift
    for lane in "$@"; do
      if [[ ${DISTLOCK_TEST_PARALLEL_LANES:-1} == 1 ]]; then
        run_lane "$lane" "$part" &
        pids+=("$!")
      else
        run_lane "$lane" "$part"
      fi
    done
    wait "${pids[@]}" || true
    for lane in "$@"; do show_lane "$lane" "$part"; done
  }
  local t0
  zk_clock start
  run_pool shared "${DISTLOCK_TEST_SHARED_WORKERS:-2}"
  show_lane shared all
  zk_clock stop
  t0=$(now_ms)
  # The conformance binaries, group after group (CONFORMANCE_GROUPS); the backends named in
  # no group last, at once.
  local backends others=() lane group groups
  backends=$(cut -f1 "$BACKGROUND/crates")
  IFS=';' read -r -a groups <<<"$CONFORMANCE_GROUPS"
  for lane in $backends; do
    [[ " ${groups[*]} " == *" $lane "* ]] || others+=("$lane")
  done
  for group in "${groups[@]}"; do
    local members=()
    for lane in $group; do
      # Only the backends this build has.
      [[ $'\n'$backends$'\n' == *$'\n'$lane$'\n'* ]] && members+=("$lane")
    done
    ((${#members[@]} == 0)) || run_group conformance "${members[@]}"
  done
  ((${#others[@]} == 0)) || run_group conformance "${others[@]}"
  echo "==> test.sh: backend binaries (conformance): $(fmt_ms "$(($(now_ms) - t0))")" >&2
  t0=$(now_ms)
  # shellcheck disable=SC2086  # one lane per word
  run_group other $backends
  echo "==> test.sh: backend binaries (other): $(fmt_ms "$(($(now_ms) - t0))")" >&2
  # The failing cases' messages, printed again just before the summary: a long run's log is
  # read from its end, and the failures sections are far from it.
  # Three lines after each: an assert_eq!'s message, left and right. The logs read leave out
  # a pool's `LANE-all.log`, the copy of its workers' logs (read too, each failure came twice).
  local logs=() log
  for log in "$lanes_dir"/*.log; do
    [[ $log == *-all.log ]] || logs+=("$log")
  done
  grep -h -A3 ' panicked at ' "${logs[@]}" 2>/dev/null | grep -v '^--$' |
    head -n 160 >"$BACKGROUND/failures" || true
  # Then each failed binary's last 12 lines and exit line: the names of its failing cases, or
  # the last words of one that failed without a panic (a crash, an abort, an `Err` returned).
  # A CI run failed so, and its printed tail named no test (2026-12-07).
  awk '/^---- [^ ]+: [^ ]+: exit [0-9]+ in / {
         if ($5 != 0) { for (i = (n > 12 ? n - 12 : 0); i < n; i++) print b[i % 12]; print }
         n = 0; next
       }
       /^---- [^ ]+: [^ ]+$/ { n = 0; next }
       { b[n % 12] = $0; n++ }' "${logs[@]}" 2>/dev/null |
    head -n 200 >>"$BACKGROUND/failures" || true
  rm -rf "$lanes_dir"
  return "$rc"
}

if (($#)); then
  zk_clock start
  run_step test cargo test --workspace --all-features "$@"
  start_background
else
  run_step test-build build_tests
  run_step doctest cargo test --workspace --all-features --doc
  start_background
  run_step test run_lanes
fi
finish_background
# `distlock check` on every configuration, every fault (see scripts/fault-check.sh).
fault_check() {
  zk_clock start
  "$REPO/scripts/fault-check.sh"
}
run_step fault-check fault_check

if [[ -s $BACKGROUND/failures ]]; then
  echo "==> test.sh: the failing tests' messages, then the failed binaries' ends:" >&2
  cat "$BACKGROUND/failures" >&2
fi
echo "==> test.sh summary: ${summary[*]}" >&2
exit "$first_rc"
