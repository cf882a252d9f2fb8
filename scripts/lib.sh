# Helpers shared by scripts/services.sh, scripts/rabbitmq4.sh and scripts/localstack.sh (sourced).
# The sourcing script sets NAME (its prefix in messages) and HOST first.

die() {
    echo "$NAME: error: $*" >&2
    exit 1
}
say() { echo "$NAME: $*" >&2; }

# listening PORT: something accepts TCP connections on $HOST:PORT.
listening() { timeout 1 bash -c "exec 3<>/dev/tcp/$HOST/$1" >/dev/null 2>&1; }

# wait_for SECONDS CHECK [ARGS...]: poll every 0.2 s until CHECK succeeds; 1 if time runs out.
wait_for() {
    local deadline=$((SECONDS + $1))
    shift
    until "$@"; do
        [ "$SECONDS" -ge "$deadline" ] && return 1
        sleep 0.2
    done
}

# alive PID: the process exists.
alive() { [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null; }
