#!/usr/bin/env bash
# LocalStack (community runtime, no Docker, no auth token) for Switchyard, on 127.0.0.1:4566.
#
#   scripts/localstack.sh start    use what answers on 127.0.0.1:4566, else install (once) and start it
#   scripts/localstack.sh stop     stop the LocalStack this script started (.local/localstack.pid)
#   scripts/localstack.sh status   answering or not (exit 3 when down)
#
# It runs from its own virtualenv (its pins clash with the project's), built from
# scripts/localstack-requirements.txt: localstack-core 4.13.1 (the newest that runs on Python 3.11)
# and every transitive dependency pinned. As root the virtualenv is kept outside the checkout, like
# the RabbitMQ 4.0 chroot, in /var/lib/switchyard/localstack-venv-<hash of the pins>, so every clone
# on the machine reuses one install (about 80 s) until the pins change; otherwise in
# .local/localstack-venv. State, config and LocalStack's own HOME live under .local/localstack/.
# Log: .local/logs/localstack.log.
#
# Settings: SWITCHYARD_LOCALSTACK_WAIT (seconds to wait for readiness, default 60),
# SWITCHYARD_LOCALSTACK_VENV (where the virtualenv is).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="$ROOT/.local"
LOGS="$STATE/logs"
REQS="$ROOT/scripts/localstack-requirements.txt"
if [ -n "${SWITCHYARD_LOCALSTACK_VENV:-}" ]; then
    VENV="$SWITCHYARD_LOCALSTACK_VENV"
elif [ "$(id -u)" = 0 ]; then
    VENV="/var/lib/switchyard/localstack-venv-$(sha256sum "$REQS" | cut -c1-16)"
else
    VENV="$STATE/localstack-venv"
fi
DATA="$STATE/localstack"
PIDF="$STATE/localstack.pid"
LOG="$LOGS/localstack.log"
STAMP="$VENV/.switchyard-requirements.sha256"
HOST=127.0.0.1
PORT=4566
WAIT="${SWITCHYARD_LOCALSTACK_WAIT:-60}"

NAME=localstack
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"

health() { curl -fsS -m 2 "http://$HOST:$PORT/_localstack/health" 2>/dev/null; }
answering() { health | grep -q '"services"'; }
version() { health | sed -n 's/.*"version": *"\([^"]*\)".*/\1/p'; }

find_python() {
    local cand
    for cand in "${SWITCHYARD_PYTHON:-}" python3.11 python3; do
        [ -n "$cand" ] && command -v "$cand" >/dev/null 2>&1 || continue
        "$cand" -c 'import sys; sys.exit(0 if sys.version_info[:2] >= (3, 11) else 1)' 2>/dev/null &&
            { command -v "$cand"; return 0; }
    done
    return 1
}

# Build (or rebuild, when the pins changed) the virtualenv. Idempotent; quick when up to date.
install() {
    local want have="" base started=$SECONDS
    mkdir -p "$(dirname "$VENV")"
    # One install at a time per virtualenv (two clones may start LocalStack at once).
    exec 6>"$VENV.lock"
    flock -w 600 6 || die "another install has held $VENV.lock for 10 minutes; is one stuck?"
    want="$(sha256sum "$REQS" | cut -d' ' -f1)"
    [ -f "$STAMP" ] && have="$(cat "$STAMP")"
    if [ "$want" = "$have" ] && [ -x "$VENV/bin/python" ]; then
        exec 6>&-
        return 0
    fi
    base="$(find_python)" || die "Python 3.11+ is needed for LocalStack's virtualenv (set SWITCHYARD_PYTHON)."
    say "installing LocalStack into $VENV from $(basename "$REQS") (once; log: $LOG)"
    [ -x "$VENV/bin/python" ] || "$base" -m venv "$VENV" || die "could not create $VENV (python3-venv missing?)"
    if ! "$VENV/bin/python" -m pip install --disable-pip-version-check --no-input -q -r "$REQS" >>"$LOG" 2>&1; then
        die "pip install -r $REQS failed; last lines of $LOG:
$(tail -n 5 "$LOG")"
    fi
    echo "$want" >"$STAMP"
    exec 6>&-  # the daemon started next must not hold the lock
    say "installed in $((SECONDS - started)) s"
}

start() {
    mkdir -p "$LOGS"
    if answering; then
        say "already answering on $HOST:$PORT (LocalStack $(version))"
        return 0
    fi
    timeout 1 bash -c "exec 3<>/dev/tcp/$HOST/$PORT" 2>/dev/null &&
        die "something else listens on $HOST:$PORT and is not LocalStack (/_localstack/health)."
    install
    mkdir -p "$DATA/home" "$DATA/fs" "$DATA/config"
    local started=$SECONDS pid
    echo "=== $(date -Is) starting LocalStack on $HOST:$PORT" >>"$LOG"
    rm -f "$PIDF"
    # These machines carry Docker's marker file: OVERRIDE_IN_DOCKER=0 or LocalStack thinks it runs in
    # a container. The default gateway server ignores the listen host; hypercorn honours it.
    # Detached from this shell's session and its lock descriptors (8, 9: scripts/services.sh, ./dev).
    (
        cd "$DATA"
        exec 8>&- 9>&- </dev/null >>"$LOG" 2>&1
        env GATEWAY_LISTEN="$HOST:$PORT" LOCALSTACK_HOST="$HOST:$PORT" GATEWAY_SERVER=hypercorn \
            OVERRIDE_IN_DOCKER=0 DNS_ADDRESS=0 DISABLE_EVENTS=1 SKIP_SSL_CERT_DOWNLOAD=1 \
            HOME="$DATA/home" FILESYSTEM_ROOT="$DATA/fs" CONFIG_DIR="$DATA/config" \
            setsid bash -c 'echo $$ >"$0"; exec "$@"' "$PIDF" "$VENV/bin/python" -m localstack.runtime.main &
    )
    local deadline=$((SECONDS + WAIT))
    until answering; do
        pid="$(cat "$PIDF" 2>/dev/null || true)"
        if [ -n "$pid" ] && ! alive "$pid"; then
            die "LocalStack exited while starting; last lines of $LOG:
$(tail -n 5 "$LOG")"
        fi
        [ "$SECONDS" -ge "$deadline" ] && die "LocalStack did not answer on $HOST:$PORT within $WAIT s; see $LOG"
        sleep 0.3
    done
    say "started LocalStack $(version) on $HOST:$PORT in $((SECONDS - started)) s (pid $(cat "$PIDF"))"
}

stop() {
    local pid
    if [ ! -s "$PIDF" ]; then
        say "not started by this script (no $PIDF): left alone"
        return 0
    fi
    pid="$(cat "$PIDF")"
    if ! alive "$pid" || ! tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "localstack.runtime.main"; then
        rm -f "$PIDF"
        say "not running (removed stale $PIDF)"
        return 0
    fi
    kill -TERM "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + 20))
    while alive "$pid" && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.2; done
    alive "$pid" && kill -KILL "$pid" 2>/dev/null || true
    rm -f "$PIDF"
    say "stopped (pid $pid)"
}

main() {
    command -v curl >/dev/null 2>&1 || die "curl is required (apt-get install curl)."
    case "${1:-status}" in
    start) start ;;
    stop) stop ;;
    install) mkdir -p "$LOGS" && install ;;
    status)
        if answering; then
            echo "localstack $HOST:$PORT answering (LocalStack $(version))"
        else
            echo "localstack $HOST:$PORT down"
            return 3
        fi
        ;;
    *) die "usage: scripts/localstack.sh start|stop|status|install" ;;
    esac
}

main "$@"
