#!/usr/bin/env bash
# A second RabbitMQ broker, version 4.0 (Debian 13's rabbitmq-server), beside the system 3.10 one.
#
#   scripts/rabbitmq4.sh start     bootstrap the chroot if needed, start the broker, wait until it answers
#   scripts/rabbitmq4.sh stop      stop the broker (and its epmd)
#   scripts/rabbitmq4.sh restart   stop, start, and wait until AMQP and the management API answer again
#                                  (the fault suite's "RabbitMQ restart"; exits non-zero if it does not
#                                  come back within SWITCHYARD_RABBITMQ4_WAIT seconds, default 90)
#   scripts/rabbitmq4.sh restart --kill   the same, but SIGKILL the node instead of a clean stop (a crash)
#   scripts/rabbitmq4.sh status    "answering" (exit 0) or "down" (exit 3), with the version
#   scripts/rabbitmq4.sh ctl ARGS  rabbitmqctl ARGS against this node (e.g. ctl list_queues)
#   scripts/rabbitmq4.sh dead-lettering   "running" (exit 0) or "stranded" (exit 4): whether the node's
#                                  at-least-once dead-letter supervisor (rabbit_fifo_dlx_sup) is alive;
#                                  once it has stopped (rabbitmq-server#16652) no at-least-once quorum
#                                  queue can start until the node restarts
# Measured here: a start takes about 5 s, a restart 5-7 s (with --kill about 5 s), a stop about 2 s.
# All of start/stop/restart serialize on DIR.lock, so a restart never races a start.
#
# Point a client at it:
#   SWITCHYARD_AMQP_URL=amqp://guest:guest@127.0.0.1:5673/%2F
#   SWITCHYARD_MANAGEMENT_URL=http://guest:guest@127.0.0.1:15673
#
# The broker runs from a Debian 13 (trixie) chroot made once with `debootstrap --variant=minbase`
# plus `apt-get install rabbitmq-server` (45-65 s here; log: DIR.log), kept OUTSIDE the repository
# in $SWITCHYARD_RABBITMQ4_DIR (default /var/lib/switchyard/rabbitmq4) and reused while it is complete
# (marker file DIR/.switchyard-complete). Everything binds to 127.0.0.1 on its own ports, so it never
# meets the system node: AMQP 5673, management 15673, epmd 4370, distribution 25673, CLI tools
# 35690-35700, node name rabbit4@localhost. guest/guest works from loopback. Needs root (chroot).
# Node log: DIR/var/log/rabbitmq/ and DIR/var/log/rabbitmq/console.log.
set -euo pipefail

SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
HOST=127.0.0.1
DIR="$(realpath -m "${SWITCHYARD_RABBITMQ4_DIR:-/var/lib/switchyard/rabbitmq4}")"
AMQP_PORT="${SWITCHYARD_RABBITMQ4_PORT:-5673}"
MGMT_PORT="${SWITCHYARD_RABBITMQ4_MGMT_PORT:-15673}"
EPMD_PORT="${SWITCHYARD_RABBITMQ4_EPMD_PORT:-4370}"
DIST_PORT=$((AMQP_PORT + 20000))
NODE=rabbit4@localhost
MIRROR="${SWITCHYARD_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
WAIT="${SWITCHYARD_RABBITMQ4_WAIT:-90}"
MARKER="$DIR/.switchyard-complete"
LOG="$DIR.log"

NAME=rabbitmq4
# shellcheck source=scripts/lib.sh
. "$(dirname "$SELF")/lib.sh"
overview() { curl -fsS -m 2 -u guest:guest "http://$HOST:$MGMT_PORT/api/overview" 2>/dev/null; }
answering() { listening "$AMQP_PORT" && overview >/dev/null; }
version() { overview | sed -n 's/.*"rabbitmq_version":"\([^"]*\)".*/\1/p'; }

# Unmount everything below $1 (deepest first): a killed debootstrap or start can leave /proc mounted.
unmount_below() {
    local m
    awk -v d="$1" '$2 == d || index($2, d "/") == 1 {print $2}' /proc/mounts | sort -r | while read -r m; do
        umount -l "$m" 2>/dev/null || true
    done
}

# ------------------------------------------------------------------ bootstrap
bootstrap() {
    [ -f "$MARKER" ] && return 0
    [ "$(id -u)" = 0 ] || die "the RabbitMQ 4 chroot $DIR is missing and creating it needs root (debootstrap, chroot)."
    local partial="$DIR.partial" started=$SECONDS
    mkdir -p "$(dirname "$DIR")"
    [ -e "$DIR" ] && die "$DIR exists but is incomplete (no $MARKER). Remove it (rm -rf --one-file-system $DIR) and rerun."
    if ! command -v debootstrap >/dev/null 2>&1; then
        say "installing debootstrap (apt-get)"
        { DEBIAN_FRONTEND=noninteractive apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y \
            --no-install-recommends debootstrap; } >>"$LOG" 2>&1 || die "apt-get install debootstrap failed; see $LOG"
    fi
    if [ -e "$partial" ]; then
        say "removing the leftover of an interrupted bootstrap: $partial"
        unmount_below "$partial"
        rm -rf --one-file-system "$partial"
    fi
    say "bootstrapping Debian 13 (trixie) into $partial from $MIRROR (once; about a minute; log: $LOG)"
    echo "=== $(date -Is) debootstrap --variant=minbase trixie $partial $MIRROR" >>"$LOG"
    if ! timeout 600 debootstrap --variant=minbase trixie "$partial" "$MIRROR" >>"$LOG" 2>&1; then
        unmount_below "$partial"
        die "debootstrap failed or took over 10 minutes; last lines of $LOG:
$(tail -n 5 "$LOG")
  Check that $MIRROR is reachable (or set SWITCHYARD_DEBIAN_MIRROR to a Debian mirror) and that
  debootstrap knows trixie (/usr/share/debootstrap/scripts/trixie; else install a newer debootstrap),
  then rerun: the partial tree $partial is removed and rebuilt."
    fi
    say "debootstrap done after $((SECONDS - started)) s; installing rabbitmq-server in the chroot"
    # policy-rc.d: the package's postinst must not start a node on the default port 5672.
    if ! timeout 600 chroot "$partial" /bin/sh -c 'printf "#!/bin/sh\nexit 101\n" >/usr/sbin/policy-rc.d &&
            chmod +x /usr/sbin/policy-rc.d && DEBIAN_FRONTEND=noninteractive apt-get install -y \
            --no-install-recommends rabbitmq-server && apt-get clean' >>"$LOG" 2>&1; then
        unmount_below "$partial"
        die "apt-get install rabbitmq-server in the chroot failed or took over 10 minutes; last lines of $LOG:
$(tail -n 5 "$LOG")
  Rerun to retry from scratch (the partial tree $partial is rebuilt)."
    fi
    unmount_below "$partial"
    chroot "$partial" dpkg-query -W -f '${Version}\n' rabbitmq-server >"$partial/.switchyard-complete"
    mv "$partial" "$DIR"
    say "chroot ready after $((SECONDS - started)) s: rabbitmq-server $(cat "$MARKER") in $DIR"
}

# Config files in the chroot are owned by this script: rewritten at every start.
configure() {
    cat >"$DIR/etc/rabbitmq/rabbitmq.conf" <<EOF
# Written by scripts/rabbitmq4.sh at every start; edit the script, not this file.
listeners.tcp.local = $HOST:$AMQP_PORT
management.tcp.ip = $HOST
management.tcp.port = $MGMT_PORT
loopback_users.guest = true
EOF
    cat >"$DIR/etc/rabbitmq/rabbitmq-env.conf" <<EOF
# Written by scripts/rabbitmq4.sh at every start; edit the script, not this file.
NODENAME=$NODE
DIST_PORT=$DIST_PORT
CTL_DIST_PORT_MIN=35690
CTL_DIST_PORT_MAX=35700
ERL_EPMD_PORT=$EPMD_PORT
ERL_EPMD_ADDRESS=$HOST
SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
CTL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
EOF
    echo "[rabbitmq_management]." >"$DIR/etc/rabbitmq/enabled_plugins"
    [ -e "$DIR/dev/null" ] || die "$DIR/dev/null is missing (debootstrap could not create device nodes?)"
    mountpoint -q "$DIR/proc" || mount -t proc proc "$DIR/proc" || die "could not mount /proc in $DIR"
}

# in_chroot COMMAND...: run a RabbitMQ tool as the chroot's rabbitmq user, with a clean environment.
in_chroot() {
    local ids
    ids="$(awk -F: '$1 == "rabbitmq" {print $3 ":" $4}' "$DIR/etc/passwd")"
    env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/var/lib/rabbitmq LANG=C.UTF-8 \
        chroot --userspec="$ids" "$DIR" /bin/sh -c 'cd /var/lib/rabbitmq && exec "$@"' sh "$@"
}

ctl() { in_chroot /usr/lib/rabbitmq/bin/rabbitmqctl "$@"; }

# The Erlang VMs whose root directory is this chroot: this node's and the cluster's
# (scripts/rabbitmq-cluster.sh runs its three nodes from the same chroot).
chroot_pids() {
    local pid
    for pid in $(pgrep -x beam.smp); do
        [ "$(readlink "/proc/$pid/root" 2>/dev/null)" = "$DIR" ] && echo "$pid"
    done
    return 0
}

# The node's Erlang VM: the one of the chroot's whose environment names no node (the cluster's nodes
# are started with RABBITMQ_NODENAME; this one reads its name from rabbitmq-env.conf). A restart
# --kill must never take a cluster node instead.
node_pid() {
    local pid
    for pid in $(chroot_pids); do
        tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -q '^RABBITMQ_NODENAME=' || { echo "$pid"; return 0; }
    done
    return 1
}

# ---------------------------------------------------------------- start/stop
start() {
    if answering; then
        say "already answering on $HOST:$AMQP_PORT (RabbitMQ $(version))"
        return 0
    fi
    listening "$AMQP_PORT" && die "something else listens on $HOST:$AMQP_PORT; stop it or set SWITCHYARD_RABBITMQ4_PORT."
    bootstrap
    [ "$(id -u)" = 0 ] || die "starting the RabbitMQ 4 broker needs root (chroot)."
    configure
    local started=$SECONDS
    echo "=== $(date -Is) starting $NODE" >>"$DIR/var/log/rabbitmq/console.log"
    # Detached from this shell's session and its lock descriptors (8, 9: scripts/services.sh, ./dev).
    (
        exec 7>&- 8>&- 9>&- </dev/null >>"$DIR/var/log/rabbitmq/console.log" 2>&1
        setsid -f "$SELF" _server
    )
    if ! wait_for "$WAIT" answering; then
        die "RabbitMQ 4 did not answer on $HOST:$AMQP_PORT and $HOST:$MGMT_PORT within $WAIT s; see
  $DIR/var/log/rabbitmq/console.log and $DIR/var/log/rabbitmq/$NODE.log"
    fi
    say "started RabbitMQ $(version) on $HOST:$AMQP_PORT (management $HOST:$MGMT_PORT) in $((SECONDS - started)) s"
}

stop() {
    local kill_it=${1:-} pid
    [ -f "$MARKER" ] || { say "no chroot at $DIR: nothing to stop"; return 0; }
    pid="$(node_pid || true)"
    if [ -n "$pid" ]; then
        if [ "$kill_it" = --kill ]; then
            kill -KILL "$pid" 2>/dev/null || true
        else
            ctl stop >/dev/null 2>&1 || kill -TERM "$pid" 2>/dev/null || true
        fi
        wait_for 30 bash -c "! kill -0 $pid 2>/dev/null" || kill -KILL "$pid" 2>/dev/null || true
        wait_for 10 bash -c "! kill -0 $pid 2>/dev/null" || die "node pid $pid did not exit"
    fi
    # The node's own epmd (port $EPMD_PORT, not the system's 4369).
    in_chroot /usr/bin/epmd -port "$EPMD_PORT" -kill >/dev/null 2>&1 || true
    wait_for 10 bash -c "! (exec 3<>/dev/tcp/$HOST/$AMQP_PORT) 2>/dev/null" || die "$HOST:$AMQP_PORT still listens after the stop"
    if [ "$kill_it" != --kill ] && [ -z "$(chroot_pids)" ]; then  # (the cluster's nodes use it too)
        unmount_below "$DIR/proc"
    fi
    say "stopped${pid:+ (pid $pid${kill_it:+, SIGKILL})}"
}

main() {
    local action="${1:-status}"
    [ $# -gt 0 ] && shift
    case "$action" in
    start | stop | restart)
        [ "$(id -u)" = 0 ] || die "$action needs root (the broker runs in a chroot)."
        command -v curl >/dev/null 2>&1 || die "curl is required (apt-get install curl)."
        mkdir -p "$(dirname "$DIR")"
        # One start/stop/bootstrap at a time; the daemon does not inherit this descriptor.
        exec 7>"$DIR.lock"
        flock -w 900 7 || die "another scripts/rabbitmq4.sh has held $DIR.lock for 15 minutes; is one stuck?"
        ;;
    esac
    case "$action" in
    start) start ;;
    stop) stop ;;
    restart)
        [ "${1:-}" = "" ] || [ "$1" = --kill ] || die "usage: scripts/rabbitmq4.sh restart [--kill]"
        stop "${1:-}"
        start
        ;;
    _server) in_chroot /usr/lib/rabbitmq/bin/rabbitmq-server ;;  # used by start, in its own session
    status)
        if answering; then
            echo "rabbitmq4 $HOST:$AMQP_PORT answering (RabbitMQ $(version), management $HOST:$MGMT_PORT)"
        else
            echo "rabbitmq4 $HOST:$AMQP_PORT down"
            return 3
        fi
        ;;
    ctl) ctl "$@" ;;
    dead-lettering)
        case "$(ctl eval 'is_pid(whereis(rabbit_fifo_dlx_sup)).' 2>/dev/null)" in
        true) echo running ;;
        false) echo stranded; return 4 ;;
        *) die "could not ask the node (is it answering? scripts/rabbitmq4.sh status)" ;;
        esac
        ;;
    *) die "usage: scripts/rabbitmq4.sh start|stop|restart [--kill]|status|ctl ARGS|dead-lettering" ;;
    esac
}

# Sourced by scripts/rabbitmq-cluster.sh for the chroot and its tools; run, it is this broker.
[ "${BASH_SOURCE[0]}" != "$0" ] || main "$@"
