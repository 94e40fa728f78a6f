# lib.sh: the shell helpers of the scripts under tests/ (chaos, the demos,
# the benchmarks, member_cpu, first_hour), sourced, never run:
#
#   LIB_NAME=demo            # the prefix of every line printed here
#   . "$(dirname "$0")/lib.sh"
#   lib_init demo            # DIR (a temp dir), the EXIT/HUP/INT/TERM traps
#
# Sourcing only defines functions and defaults; nothing starts and no trap
# is set before lib_init. Needs bash >= 5 (EPOCHREALTIME, /dev/tcp, {fd}
# redirections). The clock, /proc and /metrics are read by bash itself, so
# a polling loop forks no program (the machine has 2 cores to share).
#
# Settings (shell variables, before or after sourcing):
#   LIB_NAME      message prefix ("demo", "chaos", ...)
#   LIB_CONTEXT   added after FAILED / INCONCLUSIVE, e.g. " (CHAOS_SEED=7)"
#   LIB_SAY_FD    where say writes (1, the default, or 2)
#   LIB_KEEP      non-empty: the exit keeps DIR (logs) and says where
#   LIB_KEEP_FAILED  non-empty: so does an exit with a status other than 0
#   LIB_GRACE     seconds each process gets after SIGTERM at exit (10)
#   LIB_PORT_LO, LIB_PORT_HI  free_port's range, LO..HI-1 (20000..31999:
#                 below the kernel's ephemeral range)
#
# State it keeps: DIR, PID (name -> pid of every process started with
# spawn), BOOT (broker_start), REDIS_PORT (redis_start), PGBIN, PGPORT,
# DSN, PSQL, PG_UP (pg_require, pg_start).

LIB_NAME=${LIB_NAME:-${0##*/}}
LIB_CONTEXT=${LIB_CONTEXT:-}
declare -A PID=() # name -> pid of every process started with spawn
LIB_ORDER=()      # the names in the order they were started
declare -A LIB_TAKEN=() # ports free_port handed out
PG_UP=0

# now_us / now_ms: the wall clock in microseconds / milliseconds.
now_us() { local t=${EPOCHREALTIME//[.,]/}; echo "$((10#$t))"; }
now_ms() { local t=${EPOCHREALTIME//[.,]/}; echo "$((10#$t / 1000))"; }

# say MSG...: "NAME: MSG" on LIB_SAY_FD; with LIB_T0_MS set, the time
# since then goes first ("NAME: [  120 ms] MSG").
say() {
    if [[ -n ${LIB_T0_MS:-} ]]; then
        printf '%s: [%5d ms] %s\n' "$LIB_NAME" "$(($(now_ms) - LIB_T0_MS))" "$*"
    else
        printf '%s: %s\n' "$LIB_NAME" "$*"
    fi >&"${LIB_SAY_FD:-1}"
}

# die MSG...: "NAME: FAILED<context>: MSG" on stderr, exit 1.
die() {
    echo "$LIB_NAME: FAILED$LIB_CONTEXT: $*" >&2
    exit 1
}

# alive PID: the process exists and is not a zombie (a child that died but
# was not waited for yet).
alive() {
    local st
    # (read, not $(<file): under set -e a failing $(<file) exits bash)
    { read -r st <"/proc/$1/stat"; } 2>/dev/null || return 1
    st=${st##*) }
    [[ ${st:0:1} != Z ]]
}

# port_free PORT: nothing listens on 127.0.0.1:PORT (a connect is refused)
# and ss, when present, lists no socket bound to it.
port_free() {
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 1; fi
    if command -v ss >/dev/null && ss -Htan "( sport = :$1 )" 2>/dev/null | grep -q .; then
        return 1
    fi
    return 0
}

# free_port [VAR]: a free port in LIB_PORT_LO..LIB_PORT_HI-1, never one
# handed out before: into VAR, or on stdout without VAR (in a $(...) the
# record of ports handed out is lost with the subshell, so prefer VAR).
free_port() {
    local p i lo=${LIB_PORT_LO:-20000} hi=${LIB_PORT_HI:-32000}
    for ((i = 0; i < 200; i++)); do
        p=$((lo + RANDOM % (hi - lo)))
        [[ -z ${LIB_TAKEN[$p]:-} ]] && port_free "$p" || continue
        LIB_TAKEN[$p]=1
        if [[ -n ${1:-} ]]; then printf -v "$1" '%s' "$p"; else echo "$p"; fi
        return 0
    done
    die "no free TCP port found"
}

# lib_init TEMPNAME: DIR=a new temp dir idemproc-TEMPNAME.XXXXXX, and the
# traps: lib_cleanup on exit, a message and 129/130/143 on a signal.
lib_init() {
    DIR=$(mktemp -d "${TMPDIR:-/tmp}/idemproc-$1.XXXXXX")
    trap lib_cleanup EXIT
    trap 'exit 129' HUP
    trap 'echo "$LIB_NAME: interrupted" >&2; exit 130' INT
    trap 'echo "$LIB_NAME: terminated" >&2; exit 143' TERM
}

# lib_cleanup: the EXIT trap. Stops every process started with spawn, the
# last started first (members before the broker they commit to), each with
# SIGTERM and LIB_GRACE seconds before SIGKILL; stops PostgreSQL; removes
# DIR unless it is to be kept. Exits with the script's status.
lib_cleanup() {
    local rc=$? i name
    set +e
    trap - EXIT HUP INT TERM
    for ((i = ${#LIB_ORDER[@]} - 1; i >= 0; i--)); do
        name=${LIB_ORDER[i]}
        [[ -n ${PID[$name]:-} ]] && stop "$name" TERM "${LIB_GRACE:-10}"
    done
    ((PG_UP)) && as_pg "$PGBIN/pg_ctl" -D "$DIR/pg" -m immediate stop >/dev/null 2>&1
    if [[ -n ${DIR:-} ]]; then
        if [[ -n ${LIB_KEEP:-} || (-n ${LIB_KEEP_FAILED:-} && $rc -ne 0) ]]; then
            echo "$LIB_NAME: logs kept in $DIR" >&2
        else
            rm -rf "$DIR"
        fi
    fi
    exit "$rc"
}

# spawn NAME OUT ERR CMD...: CMD in the background in its own process group
# (a Ctrl-C reaches only this script, whose cleanup then stops it with
# exactly one SIGTERM), stdin from /dev/null, stdout and stderr appended to
# OUT and ERR (the same file or not); PID[NAME] is its pid.
spawn() {
    local name=$1 out=$2 err=$3
    shift 3
    set -m
    if [[ $out == "$err" ]]; then
        "$@" </dev/null >>"$out" 2>&1 &
    else
        "$@" </dev/null >>"$out" 2>>"$err" &
    fi
    PID[$name]=$!
    set +m
    LIB_ORDER+=("$name")
}

# stop NAME SIGNAL GRACE_S: signal a process started with spawn (SIGNAL -:
# it was signalled already), wait up to GRACE_S for it, then SIGKILL it
# (saying so). Returns its exit status.
stop() {
    local name=$1 sig=$2 grace=$3 pid rc=0 i err
    pid=${PID[$name]:-}
    [[ -n $pid ]] || return 0
    # (stderr off while it dies: bash reports a job killed by a signal,
    # which is what we want here, with a "Killed" line)
    exec {err}>&2 2>/dev/null
    [[ $sig == - ]] || kill "-$sig" "$pid" 2>/dev/null || true
    for ((i = 0; i < grace * 20; i++)); do
        alive "$pid" || break
        sleep 0.05
    done
    if alive "$pid"; then
        echo "$LIB_NAME: $name (pid $pid) still running after ${grace}s: SIGKILL" >&"$err"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || rc=$?
    exec 2>&"$err" {err}>&-
    unset "PID[$name]"
    return "$rc"
}

# wait_for TIMEOUT_S NAME CMD...: runs CMD every 0.05 s until it succeeds
# (0) or TIMEOUT_S passed or the process NAME (started with spawn; - for
# none) is no longer alive (1).
wait_for() {
    local timeout=$1 name=$2 i
    shift 2
    for ((i = 0; i < timeout * 20; i++)); do
        "$@" && return 0
        [[ $name == - ]] || alive "${PID[$name]:-0}" || break
        sleep 0.05
    done
    "$@"
}

# broker_start ARG...: `$BIN broker ARG...` as process "broker" (stdout to
# DIR/broker.out, stderr to DIR/broker.log); BOOT = its bootstrap line.
broker_start() {
    spawn broker "$DIR/broker.out" "$DIR/broker.log" "$BIN" broker "$@"
    BOOT=
    wait_for 10 broker lib_read_boot || true
    [[ -n $BOOT ]] || { cat "$DIR/broker.log" >&2; die "broker printed no bootstrap"; }
}
lib_read_boot() { [[ -s $DIR/broker.out ]] && IFS= read -r BOOT <"$DIR/broker.out" && [[ -n $BOOT ]]; }

# broker_check PID LOG: returns 0 while the embedded broker PID is alive.
# Once it is dead: when LOG shows it died of one of librdkafka's own
# mock-cluster assertions (2.0.2's mock group coordinator has some, e.g. a
# JoinGroup of a member whose previous JoinGroup is still unanswered), the
# run says nothing about idemproc: "INCONCLUSIVE" and exit 3, so that a
# caller may run again; any other death is a failure (die, exit 1).
broker_check() {
    local why
    [[ -n $1 ]] && alive "$1" && return 0
    why=$(grep -m1 'rdkafka_mock.*Assertion' "$2" 2>/dev/null || true)
    tail -n 5 "$2" >&2 2>/dev/null
    if [[ -n $why ]]; then
        echo "$LIB_NAME: INCONCLUSIVE$LIB_CONTEXT: the embedded broker" \
            "(librdkafka's mock cluster) aborted on its own assertion: $why" >&2
        exit 3
    fi
    die "the embedded broker exited"
}

# redis_start [ARG...]: redis-server as process "redis" in DIR, on
# 127.0.0.1:REDIS_PORT (a free port when REDIS_PORT is empty, tried up to 5
# times; the same port on a restart), no RDB, no AOF unless ARG says
# --appendonly; log DIR/redis.log. Dies when it does not answer PING.
redis_start() {
    local try tries=1 aof=(--appendonly no)
    [[ " $* " == *" --appendonly "* ]] && aof=()
    [[ -n ${REDIS_PORT:-} ]] || tries=5
    for ((try = 0; try < tries; try++)); do
        ((tries == 1)) || free_port REDIS_PORT
        spawn redis "$DIR/redis.log" "$DIR/redis.log" redis-server --bind 127.0.0.1 \
            --port "$REDIS_PORT" --dir "$DIR" --save "" --daemonize no "${aof[@]}" "$@"
        wait_for 10 redis lib_redis_pong && return 0
        stop redis TERM 5 || true
    done
    tail -n 5 "$DIR/redis.log" >&2
    die "redis-server did not start on port $REDIS_PORT"
}
lib_redis_pong() { [[ $(redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null) == PONG ]]; }

# rcli ARG...: redis-cli against the Redis of redis_start.
rcli() { redis-cli -h 127.0.0.1 -p "$REDIS_PORT" "$@"; }
# keys_bytes PREFIX: MEMORY USAGE summed over the ledger and position keys
# under PREFIX (what is not a dedup mark; the benches' bytes per mark).
keys_bytes() {
    local k sum=0 b
    while IFS= read -r k; do
        [[ -n $k ]] || continue
        b=$(rcli memory usage "$k" samples 0)
        sum=$((sum + ${b:-0}))
    done < <(rcli --scan --pattern "$1ledger:*"
        rcli --scan --pattern "$1pos:*")
    echo "$sum"
}

# member_props FILE GROUP TOPIC [KEY=VALUE...]: an `idemproc run`
# configuration for the broker BOOT and the Redis REDIS_PORT: TOPIC in,
# TOPIC.dlq for dead letters, the test settings of the mock cluster.
member_props() {
    local file=$1 group=$2 topic=$3 kv
    shift 3
    {
        echo "kafka.bootstrap.servers=$BOOT"
        echo "group.id=$group"
        echo "input.topics=$topic"
        echo "dlq.topic=$topic.dlq"
        echo "redis.url=redis://127.0.0.1:$REDIS_PORT/0"
        echo "message.max.bytes=4096"
        echo "kafka.fetch.wait.max.ms=10"
        echo "kafka.session.timeout.ms=6000"
        echo "log.level=warn"
        for kv in "$@"; do echo "$kv"; done
    } >"$file"
}

# lib_metrics_open PORT: connects to 127.0.0.1:PORT and asks for /metrics;
# the answer is then read from fd LIB_FD (close it with exec {LIB_FD}<&-).
# 1 when nothing answers.
lib_metrics_open() {
    { exec {LIB_FD}<>"/dev/tcp/127.0.0.1/$1"; } 2>/dev/null || return 1
    printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' >&"$LIB_FD"
}

# metrics PORT: the /metrics body of the process on PORT (nothing when it
# does not answer; status 0 either way, so it can feed a pipeline).
metrics() {
    local line body=0
    lib_metrics_open "$1" || return 0
    while IFS= read -r -t 3 line <&"$LIB_FD" || [[ -n $line ]]; do
        line=${line%$'\r'}
        if ((body)); then printf '%s\n' "$line"; elif [[ -z $line ]]; then body=1; fi
    done
    exec {LIB_FD}<&-
}

# metric PORT SERIES: the value of one sample (name and labels exactly as
# printed, e.g. 'idemproc_records_total{outcome="processed"}'); 0 when the
# series is absent or nothing answers.
metric() {
    local line v=0
    lib_metrics_open "$1" || { echo 0; return; }
    while IFS= read -r -t 3 line <&"$LIB_FD"; do
        [[ $line == "$2 "* ]] && { v=${line##* }; break; }
    done
    exec {LIB_FD}<&-
    echo "$v"
}

# metric_sum PORT [NAME]: the sum of the samples of counter NAME over all
# its labels (idemproc_records_total: every record handled); 0 when
# nothing answers.
metric_sum() {
    local line sum=0 name=${2:-idemproc_records_total}
    lib_metrics_open "$1" || { echo 0; return; }
    while IFS= read -r -t 3 line <&"$LIB_FD"; do
        [[ $line == "$name{"* ]] && sum=$((sum + ${line##* }))
    done
    exec {LIB_FD}<&-
    echo "$sum"
}

# cpu_ticks PID: utime + stime of the process (all its threads) in clock
# ticks. Fields after the ")" of comm: state is 0, utime 11, stime 12.
cpu_ticks() {
    local stat
    { read -r stat <"/proc/$1/stat"; } 2>/dev/null || { echo 0; return; }
    local -a f=(${stat##*) })
    echo "$((f[11] + f[12]))"
}

# vm_hwm_kb PID: the peak resident set size in KiB.
vm_hwm_kb() { awk '/^VmHWM:/ { print $2 }' "/proc/$1/status"; }

# expect_num FILE KEY: the first number KEY has in a `produce --expect`
# file (pretty-printed JSON); ? when there is none.
expect_num() {
    grep -o "\"$2\": *[0-9]*" "$1" | head -n 1 | grep -o '[0-9]*$' || echo '?'
}

# as_pg CMD...: PostgreSQL refuses to run as root; run as its user then.
as_pg() { if [[ $(id -u) == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi; }

# pg_require: PGBIN = the PostgreSQL server binaries (PG_BINDIR, else the
# newest /usr/lib/postgresql/*/bin); exit 2 when there are none.
pg_require() {
    PGBIN=${PG_BINDIR:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}
    [[ -x $PGBIN/initdb ]] || {
        echo "$LIB_NAME: no PostgreSQL server binaries (make deps installs postgresql)" >&2
        exit 2
    }
}

# pg_start [-c NAME=VALUE...]: a private PostgreSQL in DIR/pg (initdb,
# trust authentication, 127.0.0.1 only) on a free port, stopped at exit;
# the arguments go to the server. Sets PGPORT, DSN and PSQL (an array:
# "${PSQL[@]}" -c SQL prints bare values).
pg_start() {
    [[ $(id -u) == 0 ]] && chown postgres "$DIR"
    free_port PGPORT
    as_pg "$PGBIN/initdb" -D "$DIR/pg" -U postgres -A trust -E UTF8 --locale=C \
        >"$DIR/initdb.log" 2>&1 || { cat "$DIR/initdb.log" >&2; die "initdb"; }
    printf 'local all all trust\nhost all all 127.0.0.1/32 trust\n' >"$DIR/pg/pg_hba.conf"
    as_pg "$PGBIN/pg_ctl" -D "$DIR/pg" -l "$DIR/pg/server.log" -w -t 60 \
        -o "-p $PGPORT -k $DIR -c listen_addresses=127.0.0.1 $*" start >/dev/null ||
        die "postgres did not start"
    PG_UP=1
    DSN="host=127.0.0.1 port=$PGPORT user=postgres dbname=postgres"
    PSQL=(psql -X -q -A -t -v ON_ERROR_STOP=1 "$DSN")
}
