#!/usr/bin/env bash
# A three-node RabbitMQ 4.0 cluster (Amazon MQ's CLUSTER_MULTI_AZ, locally), from the chroot of
# scripts/rabbitmq4.sh, beside the single 4.0 node and the system 3.10 one.
#
#   scripts/rabbitmq-cluster.sh start            a fresh cluster: three nodes started, nodes 2 and 3
#                                                joined to node 1, waits until every node answers
#   scripts/rabbitmq-cluster.sh stop             stop the three nodes (and the cluster's epmd)
#   scripts/rabbitmq-cluster.sh status           "answering" with the running nodes (exit 0) or "down" (3)
#   scripts/rabbitmq-cluster.sh kill N           SIGKILL node N (1-3): a crash; its data is kept
#   scripts/rabbitmq-cluster.sh stop-node N      a clean stop of node N
#   scripts/rabbitmq-cluster.sh start-node N     start node N again (it rejoins with its data) and
#                                                wait until it answers and the cluster lists it running
#   scripts/rabbitmq-cluster.sh ctl N ARGS       rabbitmqctl ARGS against node N
#   scripts/rabbitmq-cluster.sh urls             the AMQP and management URLs of the three nodes, as
#                                                SWITCHYARD_AMQP_URL=... and SWITCHYARD_MANAGEMENT_URL=...
#   scripts/rabbitmq-cluster.sh dead-lettering   "running" (0) or "stranded on NODE..." (4): each running
#                                                node's at-least-once dead-letter supervisor
#
# Ports (base SWITCHYARD_RABBITMQ_CLUSTER_PORT, default 5680; node N = 1..3 uses base+N-1): AMQP
# 5680-5682, management 15680-15682, distribution 25680-25682, the cluster's own epmd on
# SWITCHYARD_RABBITMQ_CLUSTER_EPMD_PORT (default 4371). Node names syc<base>n<N>@localhost. All on
# 127.0.0.1; guest/guest from loopback. A second cluster on other ports (a test's own) only needs
# another base and epmd port. Data: DIR/var/lib/rabbitmq/cluster-<base>/n<N> (wiped by start, kept
# by kill/start-node). Logs: DIR/var/log/rabbitmq/cluster-<base>/. Needs root (chroot).
set -euo pipefail

CLUSTER_SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
# shellcheck source=scripts/rabbitmq4.sh
. "$(dirname "$CLUSTER_SELF")/rabbitmq4.sh"
NAME=rabbitmq-cluster
BASE="${SWITCHYARD_RABBITMQ_CLUSTER_PORT:-5680}"
CLUSTER_EPMD="${SWITCHYARD_RABBITMQ_CLUSTER_EPMD_PORT:-4371}"
NODES=(1 2 3)
REL_DATA="/var/lib/rabbitmq/cluster-$BASE"
REL_LOGS="/var/log/rabbitmq/cluster-$BASE"

amqp_port() { echo $((BASE + $1 - 1)); }
mgmt_port() { echo $((BASE + 10000 + $1 - 1)); }
node_name() { echo "syc${BASE}n$1@localhost"; }

# node_env N: the environment that makes the chroot's tools speak for node N.
node_env() {
    echo "RABBITMQ_NODENAME=$(node_name "$1")"
    echo "RABBITMQ_NODE_PORT=$(amqp_port "$1")"
    echo "RABBITMQ_DIST_PORT=$(($(amqp_port "$1") + 20000))"
    echo "ERL_EPMD_PORT=$CLUSTER_EPMD"
    echo "ERL_EPMD_ADDRESS=$HOST"
    echo "RABBITMQ_CONFIG_FILE=$REL_DATA/n$1.conf"
    echo "RABBITMQ_CONF_ENV_FILE=$REL_DATA/n$1-env.conf"
    echo "RABBITMQ_ENABLED_PLUGINS_FILE=$REL_DATA/enabled_plugins"
    echo "RABBITMQ_MNESIA_BASE=$REL_DATA/n$1"
    echo "RABBITMQ_LOG_BASE=$REL_LOGS"
    echo "RABBITMQ_PID_FILE=$REL_DATA/n$1.pid"
    echo "RABBITMQ_CTL_DIST_PORT_MIN=35701"
    echo "RABBITMQ_CTL_DIST_PORT_MAX=35720"
    echo "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}"
    echo "RABBITMQ_CTL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}"
}

# in_node N COMMAND...: a RabbitMQ tool in the chroot, as rabbitmq, for node N.
in_node() {
    local n=$1 ids
    shift
    ids="$(awk -F: '$1 == "rabbitmq" {print $3 ":" $4}' "$DIR/etc/passwd")"
    local envs=()
    mapfile -t envs < <(node_env "$n")
    env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/var/lib/rabbitmq LANG=C.UTF-8 "${envs[@]}" \
        chroot --userspec="$ids" "$DIR" /bin/sh -c 'cd /var/lib/rabbitmq && exec "$@"' sh "$@"
}

nctl() {
    local n=$1
    shift
    in_node "$n" /usr/lib/rabbitmq/bin/rabbitmqctl -n "$(node_name "$n")" "$@"
}

node_overview() { curl -fsS -m 2 -u guest:guest "http://$HOST:$(mgmt_port "$1")/api/overview" 2>/dev/null; }
node_answering() { listening "$(amqp_port "$1")" && node_overview "$1" >/dev/null; }
all_answering() {
    local n
    for n in "${NODES[@]}"; do node_answering "$n" || return 1; done
}

# running_nodes: the nodes the cluster reports running (through any node that answers).
running_nodes() {
    local n
    for n in "${NODES[@]}"; do
        if node_answering "$n"; then
            curl -fsS -m 3 -u guest:guest "http://$HOST:$(mgmt_port "$n")/api/nodes?columns=name,running" 2>/dev/null |
                python3 -c 'import json, sys; print("\n".join(sorted(n["name"] for n in json.load(sys.stdin) if n.get("running"))))'
            return "${PIPESTATUS[0]}"
        fi
    done
    return 1
}
cluster_has() { running_nodes | grep -qx "$(node_name "$1")"; }
cluster_complete() { [ "$(running_nodes | wc -l)" = "${#NODES[@]}" ]; }

# node_pid N: the Erlang VM of node N (its command line names the node).
node_pid_of() {
    local pid name
    name="$(node_name "$1")"
    for pid in $(pgrep -x beam.smp); do
        [ "$(readlink "/proc/$pid/root" 2>/dev/null)" = "$DIR" ] || continue
        # 4.0 names the node at run time (not on the command line): its environment says which
        { tr '\0' ' ' <"/proc/$pid/cmdline"; echo; tr '\0' '\n' <"/proc/$pid/environ"; } 2>/dev/null |
            grep -q -- "-sname $name \|-name $name \|^RABBITMQ_NODENAME=$name\$" && { echo "$pid"; return 0; }
    done
    return 1
}

write_node_config() {
    local n=$1
    mkdir -p "$DIR$REL_DATA" "$DIR$REL_LOGS"
    cat >"$DIR$REL_DATA/n$n.conf" <<EOF
# Written by scripts/rabbitmq-cluster.sh at every start; edit the script, not this file.
listeners.tcp.local = $HOST:$(amqp_port "$n")
management.tcp.ip = $HOST
management.tcp.port = $(mgmt_port "$n")
loopback_users.guest = true
cluster_partition_handling = pause_minority
EOF
    : >"$DIR$REL_DATA/n$n-env.conf"
    echo "[rabbitmq_management]." >"$DIR$REL_DATA/enabled_plugins"
    chown -R "$(awk -F: '$1 == "rabbitmq" {print $3 ":" $4}' "$DIR/etc/passwd")" "$DIR$REL_DATA" "$DIR$REL_LOGS"
}

start_node() {
    local n=$1
    write_node_config "$n"
    mountpoint -q "$DIR/proc" || mount -t proc proc "$DIR/proc" || die "could not mount /proc in $DIR"
    echo "=== $(date -Is) starting $(node_name "$n")" >>"$DIR$REL_LOGS/console-n$n.log"
    (
        exec 7>&- 8>&- 9>&- </dev/null >>"$DIR$REL_LOGS/console-n$n.log" 2>&1
        setsid -f "$CLUSTER_SELF" _server "$n"
    )
}

wait_node() {
    wait_for "$WAIT" node_answering "$1" ||
        die "node $1 ($(node_name "$1")) did not answer on $HOST:$(amqp_port "$1") within $WAIT s; see $DIR$REL_LOGS/"
}

stop_one() {
    local n=$1 how=${2:-clean} pid
    pid="$(node_pid_of "$n" || true)"
    [ -n "$pid" ] || return 0
    if [ "$how" = kill ]; then
        kill -KILL "$pid" 2>/dev/null || true
    else
        nctl "$n" stop >/dev/null 2>&1 || kill -TERM "$pid" 2>/dev/null || true
    fi
    wait_for 30 bash -c "! kill -0 $pid 2>/dev/null" || kill -KILL "$pid" 2>/dev/null || true
    wait_for 10 bash -c "! kill -0 $pid 2>/dev/null" || die "node $n (pid $pid) did not exit"
    wait_for 10 bash -c "! (exec 3<>/dev/tcp/$HOST/$(amqp_port "$n")) 2>/dev/null" || die "$HOST:$(amqp_port "$n") still listens after node $n stopped"
}

cluster_start() {
    if all_answering && cluster_complete; then
        say "already answering on $HOST:$(amqp_port 1)-$(amqp_port 3) (nodes: $(running_nodes | tr '\n' ' '))"
        return 0
    fi
    local n started=$SECONDS
    for n in "${NODES[@]}"; do
        listening "$(amqp_port "$n")" && ! node_pid_of "$n" >/dev/null &&
            die "something else listens on $HOST:$(amqp_port "$n"); stop it or set SWITCHYARD_RABBITMQ_CLUSTER_PORT."
    done
    bootstrap
    cluster_stop quiet
    rm -rf "${DIR:?}$REL_DATA"
    for n in "${NODES[@]}"; do start_node "$n"; done
    for n in "${NODES[@]}"; do wait_node "$n"; done
    for n in "${NODES[@]:1}"; do
        { nctl "$n" stop_app && nctl "$n" join_cluster "$(node_name 1)" && nctl "$n" start_app; } >>"$DIR$REL_LOGS/join.log" 2>&1 ||
            die "node $n could not join $(node_name 1); see $DIR$REL_LOGS/join.log"
    done
    wait_for "$WAIT" cluster_complete || die "the cluster did not list three running nodes within $WAIT s (running: $(running_nodes | tr '\n' ' '))"
    for n in "${NODES[@]}"; do wait_node "$n"; done
    say "started a 3-node RabbitMQ $(node_overview 1 | sed -n 's/.*"rabbitmq_version":"\([^"]*\)".*/\1/p') cluster on $HOST:$(amqp_port 1)-$(amqp_port 3) (management $(mgmt_port 1)-$(mgmt_port 3)) in $((SECONDS - started)) s"
}

cluster_stop() {
    local n quiet=${1:-}
    [ -f "$MARKER" ] || { say "no chroot at $DIR: nothing to stop"; return 0; }
    # Stopped in reverse, so node 1 (the one the others joined) is the last to leave.
    for n in 3 2 1; do stop_one "$n"; done
    in_node 1 /usr/bin/epmd -port "$CLUSTER_EPMD" -kill >/dev/null 2>&1 || true
    [ -n "$quiet" ] || say "stopped the cluster on $HOST:$(amqp_port 1)-$(amqp_port 3)"
}

check_n() { [[ "${1:-}" =~ ^[123]$ ]] || die "name a node: 1, 2 or 3"; }

urls() {
    local n amqp=() mgmt=()
    for n in "${NODES[@]}"; do
        amqp+=("amqp://guest:guest@$HOST:$(amqp_port "$n")/%2F")
        mgmt+=("http://guest:guest@$HOST:$(mgmt_port "$n")")
    done
    (IFS=,; echo "SWITCHYARD_AMQP_URL=${amqp[*]}"; echo "SWITCHYARD_MANAGEMENT_URL=${mgmt[*]}")
}

cluster_main() {
    local action="${1:-status}"
    [ $# -gt 0 ] && shift
    case "$action" in
    start | stop | kill | stop-node | start-node)
        [ "$(id -u)" = 0 ] || die "$action needs root (the nodes run in a chroot)."
        command -v curl >/dev/null 2>&1 || die "curl is required (apt-get install curl)."
        mkdir -p "$(dirname "$DIR")"
        exec 7>"$DIR.cluster-$BASE.lock"
        flock -w 900 7 || die "another scripts/rabbitmq-cluster.sh has held its lock for 15 minutes; is one stuck?"
        ;;
    esac
    case "$action" in
    start) cluster_start ;;
    stop) cluster_stop ;;
    kill) check_n "${1:-}"; stop_one "$1" kill; say "killed node $1 ($(node_name "$1"))" ;;
    stop-node) check_n "${1:-}"; stop_one "$1"; say "stopped node $1 ($(node_name "$1"))" ;;
    start-node)
        check_n "${1:-}"
        node_answering "$1" && { say "node $1 already answering"; return 0; }
        start_node "$1"
        wait_node "$1"
        wait_for "$WAIT" cluster_has "$1" || die "node $1 answers but the cluster does not list it running"
        say "node $1 ($(node_name "$1")) running again"
        ;;
    _server) in_node "$1" /usr/lib/rabbitmq/bin/rabbitmq-server ;;
    status)
        local running
        if running="$(running_nodes)"; then
            echo "rabbitmq-cluster $HOST:$(amqp_port 1)-$(amqp_port 3) answering (running: $(echo "$running" | tr '\n' ' '))"
        else
            echo "rabbitmq-cluster $HOST:$(amqp_port 1)-$(amqp_port 3) down"
            return 3
        fi
        ;;
    ctl) check_n "${1:-}"; local n=$1; shift; nctl "$n" "$@" ;;
    urls) urls ;;
    dead-lettering)
        local n stranded=() asked=0
        for n in "${NODES[@]}"; do
            node_answering "$n" || continue
            asked=$((asked + 1))
            case "$(nctl "$n" eval 'is_pid(whereis(rabbit_fifo_dlx_sup)).' 2>/dev/null)" in
            true) ;;
            false) stranded+=("$(node_name "$n")") ;;
            *) die "could not ask node $n" ;;
            esac
        done
        [ "$asked" -gt 0 ] || die "no node answers (scripts/rabbitmq-cluster.sh status)"
        if [ ${#stranded[@]} = 0 ]; then echo running; else echo "stranded on ${stranded[*]}"; return 4; fi
        ;;
    *) die "usage: scripts/rabbitmq-cluster.sh start|stop|status|kill N|stop-node N|start-node N|ctl N ARGS|urls|dead-lettering" ;;
    esac
}

cluster_main "$@"
