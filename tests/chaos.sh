#!/usr/bin/env bash
# chaos.sh BIN: everything going wrong at once, for `make chaos`.
#
# Three consumer-group members on an embedded 3-broker cluster and a private
# redis-server (AOF, appendfsync always), with generated traffic holding
# both kinds of duplicates and every poison reason. While the traffic flows:
# a random member is SIGKILLed every 2-5 s and restarted, Redis is killed
# with SIGKILL every 8-20 s and restarted from its AOF, and the broker runs
# a fault schedule (brokers down and up, added round-trip time, request
# errors, leader and coordinator moves). Then the chaos stops, every member
# is up again, and `idemproc verify --dlq` must say exact. Prints a table:
# records, kills, faults, redeliveries, lost 0, doubled 0.
#
#   CHAOS_SEED     seed of everything random here (printed; default: random)
#   CHAOS_RECORDS  unique payments + poison records (default 300000)
#   CHAOS_SECONDS  how long the chaos lasts (default 300)
#   CHAOS_SETTLE   seconds allowed afterwards to verify exact (default 600)
#   CHAOS_KEEP     keep the temp dir (logs, schedule) when set
#
# The same seed gives the same traffic, fault schedule and kill sequence
# (the exact instants still depend on the machine). Exit 0 only when exact;
# 3 when the embedded broker aborted on one of its own assertions (the run
# is inconclusive, see broker_check).
set -euo pipefail

BIN=${1:-build/idemproc}
SEED=${CHAOS_SEED:-$((($(date +%s%N) / 1000) % 1000000))}
RECORDS=${CHAOS_RECORDS:-300000}
DURATION=${CHAOS_SECONDS:-300}
SETTLE=${CHAOS_SETTLE:-600}
MEMBERS=(chaos-1 chaos-2 chaos-3)
PARTITIONS=64 # the mock keeps ~5 MiB per partition: 330k x ~430 B
DLQ_PARTITIONS=8

[[ -x $BIN ]] || { echo "chaos: $BIN is not an executable (run make first)" >&2; exit 2; }
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
for tool in redis-server redis-cli; do
    command -v "$tool" >/dev/null || { echo "chaos: $tool not found (make deps)" >&2; exit 2; }
done
echo "chaos: CHAOS_SEED=$SEED CHAOS_RECORDS=$RECORDS CHAOS_SECONDS=$DURATION" \
    "(replay: CHAOS_SEED=$SEED CHAOS_RECORDS=$RECORDS CHAOS_SECONDS=$DURATION make chaos)"

DIR=$(mktemp -d "${TMPDIR:-/tmp}/idemproc-chaos.XXXXXX")
declare -A PID=() # name -> pid of every process started here

now_ms() { local t=${EPOCHREALTIME//[.,]/}; echo "$((10#$t / 1000))"; }
T0=$(now_ms)

# rnd N: R = a number in 0..N-1 from the seeded generator (a 64-bit LCG of
# our own, so nothing else that uses $RANDOM disturbs the sequence).
S=$((SEED * 2654435761 + 1))
rnd() {
    S=$(((S * 6364136223846793005 + 1442695040888963407) & 0x7fffffffffffffff))
    R=$(((S >> 20) % $1))
}

alive() {
    local st
    { read -r st <"/proc/$1/stat"; } 2>/dev/null || return 1
    st=${st##*) }
    [[ ${st:0:1} != Z ]]
}

# stop NAME SIGNAL GRACE_S: signal a process started here, wait up to
# GRACE_S, then SIGKILL. Returns its exit status.
stop() {
    local name=$1 sig=$2 grace=$3 pid rc=0 i
    pid=${PID[$name]:-}
    [[ -n $pid ]] || return 0
    # (stderr off while the process dies: bash reports a job killed by a
    # signal, which is what we want here, with a "Killed" line)
    exec 3>&2 2>/dev/null
    kill "-$sig" "$pid" 2>/dev/null || true
    for ((i = 0; i < grace * 20; i++)); do
        alive "$pid" || break
        sleep 0.05
    done
    alive "$pid" && kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null || rc=$?
    exec 2>&3 3>&-
    unset "PID[$name]"
    return "$rc"
}

cleanup() {
    local rc=$? name
    set +e
    trap - EXIT HUP INT TERM
    for name in "${!PID[@]}"; do stop "$name" TERM 10; done
    if [[ -n ${CHAOS_KEEP:-} || $rc -ne 0 ]]; then
        echo "chaos: logs kept in $DIR" >&2
    else
        rm -rf "$DIR"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 129' HUP
trap 'echo "chaos: interrupted" >&2; exit 130' INT
trap 'echo "chaos: terminated" >&2; exit 143' TERM

# spawn NAME OUT CMD...: CMD in the background in its own process group,
# stdin from /dev/null, stdout and stderr appended to OUT.
spawn() {
    local name=$1 out=$2
    shift 2
    set -m
    "$@" </dev/null >>"$out" 2>&1 &
    PID[$name]=$!
    set +m
}

die() {
    echo "chaos: FAILED (CHAOS_SEED=$SEED): $*" >&2
    exit 1
}

# broker_check: the embedded broker must stay up. When it died of one of
# librdkafka's own mock-cluster assertions (2.0.2's mock group coordinator
# has some, e.g. a JoinGroup of a member whose previous JoinGroup is still
# unanswered), the run says nothing about idemproc: exit 3, "inconclusive",
# so a caller may run again; any other death of the broker is a failure.
broker_check() {
    [[ -n ${PID[broker]:-} ]] && alive "${PID[broker]}" && return 0
    local why
    why=$(grep -m1 'rdkafka_mock.*Assertion' "$DIR/broker.log" || true)
    tail -n 5 "$DIR/broker.log" >&2
    if [[ -n $why ]]; then
        echo "chaos: INCONCLUSIVE (CHAOS_SEED=$SEED): the embedded broker" \
            "(librdkafka's mock cluster) aborted on its own assertion: $why" >&2
        exit 3
    fi
    die "the embedded broker exited"
}

port_free() {
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 1; fi
    if command -v ss >/dev/null && ss -Htan "( sport = :$1 )" 2>/dev/null | grep -q .; then
        return 1
    fi
    return 0
}
declare -A TAKEN=()
free_port() {
    local p i
    for ((i = 0; i < 200; i++)); do
        p=$((20000 + RANDOM % 12000))
        [[ -z ${TAKEN[$p]:-} ]] && port_free "$p" && { TAKEN[$p]=1; echo "$p"; return 0; }
    done
    die "no free TCP port found"
}

# metrics PORT: the /metrics body of a member (empty when it does not answer).
metrics() (
    exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
    printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' >&3
    body=0
    while IFS= read -r -t 2 line <&3 || [[ -n $line ]]; do
        line=${line%$'\r'}
        if ((body)); then printf '%s\n' "$line"; elif [[ -z $line ]]; then body=1; fi
    done
) 2>/dev/null

# Counters of members that were killed are lost with them; each member is
# scraped right before it is killed, and its last scrape is added here.
declare -A SUM=()
scrape_add() {
    local k v
    while read -r k v; do SUM[$k]=$((${SUM[$k]:-0} + ${v%.*})); done < <(
        metrics "$1" | awk '/^idemproc_(records|duplicates|rebalances)_total\{/ { print $1, $2 }')
}

# --- the fault schedule ----------------------------------------------------
# One fault every 3-8 s over the chaos, at most one broker down at a time;
# every broker is up and without added rtt when the chaos ends.
FAULTS=$DIR/faults.txt
{
    echo "# chaos fault schedule, CHAOS_SEED=$SEED"
    t=3000
    end=$((DURATION * 1000))
    apis=(Produce Fetch OffsetCommit Heartbeat JoinGroup SyncGroup Metadata FindCoordinator)
    errs=(NOT_LEADER_FOR_PARTITION REQUEST_TIMED_OUT NOT_COORDINATOR COORDINATOR_NOT_AVAILABLE
        COORDINATOR_LOAD_IN_PROGRESS REBALANCE_IN_PROGRESS LEADER_NOT_AVAILABLE)
    while ((t < end)); do
        rnd 3; b=$((R + 1))
        rnd 6
        case $R in
        0)
            rnd 3000; d=$((1000 + R))
            echo "+${t}ms broker $b down"
            echo "+$((t + d))ms broker $b up"
            t=$((t + d))
            ;;
        1)
            rnd 250; ms=$((50 + R))
            rnd 3000; d=$((1000 + R))
            echo "+${t}ms rtt $b ${ms}ms"
            echo "+$((t + d))ms rtt $b 0"
            t=$((t + d))
            ;;
        2 | 3)
            rnd ${#apis[@]}; api=${apis[$R]}
            rnd ${#errs[@]}; err=${errs[$R]}
            # Produce only with errors the idempotent producer retries.
            [[ $api == Produce ]] && err=NOT_LEADER_FOR_PARTITION
            rnd 5
            echo "+${t}ms error $api $err $((R + 1))"
            ;;
        4)
            rnd $PARTITIONS
            echo "+${t}ms leader payments $R $b"
            ;;
        5)
            echo "+${t}ms coordinator group chaos $b"
            ;;
        esac
        rnd 5000
        t=$((t + 3000 + R))
    done
    for b in 1 2 3; do echo "+$((end + 500))ms broker $b up"; echo "+$((end + 500))ms rtt $b 0"; done
} >"$FAULTS"
FAULT_CNT=$(grep -c '^+' "$FAULTS")

# --- broker ----------------------------------------------------------------
spawn broker "$DIR/broker.log" "$BIN" broker --brokers 3 \
    --topic "payments:$PARTITIONS" --topic "payments.dlq:$DLQ_PARTITIONS" --faults "$FAULTS"
BOOT=
for ((i = 0; i < 100; i++)); do
    BOOT=$(grep -m1 '^127\.0\.0\.1:' "$DIR/broker.log" || true)
    [[ -n $BOOT ]] && break
    alive "${PID[broker]}" || break
    sleep 0.1
done
[[ -n $BOOT ]] || { cat "$DIR/broker.log" >&2; die "broker printed no bootstrap"; }
T_BROKER=$(now_ms)

# --- redis (AOF, fsync on every write: a kill -9 loses nothing acknowledged)
REDIS_PORT=$(free_port)
redis_start() {
    spawn redis "$DIR/redis.log" redis-server --bind 127.0.0.1 --port "$REDIS_PORT" \
        --dir "$DIR" --save "" --appendonly yes --appendfsync always --daemonize no
    local i
    for ((i = 0; i < 100; i++)); do
        [[ $(redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null) == PONG ]] && return 0
        alive "${PID[redis]}" || break
        sleep 0.1
    done
    tail -n 5 "$DIR/redis.log" >&2
    die "redis-server did not start on port $REDIS_PORT"
}
redis_start
echo "chaos: broker $BOOT (3 brokers; payments:$PARTITIONS, payments.dlq:$DLQ_PARTITIONS)," \
    "redis 127.0.0.1:$REDIS_PORT (AOF, appendfsync always), $FAULT_CNT faults scheduled, dir $DIR"

# --- members ---------------------------------------------------------------
CONF=$DIR/idemproc.properties
cat >"$CONF" <<EOF
# written by tests/chaos.sh
kafka.bootstrap.servers=$BOOT
group.id=chaos
input.topics=payments
dlq.topic=payments.dlq
redis.url=redis://127.0.0.1:$REDIS_PORT/0
message.max.bytes=4096
kafka.fetch.wait.max.ms=10
kafka.session.timeout.ms=6000
kafka.heartbeat.interval.ms=500
# refresh topic metadata often: an injected Metadata error must not leave a
# member with a stale view of the topic for librdkafka's default 5 minutes
kafka.topic.metadata.refresh.interval.ms=5000
batch.max.wait.ms=10
commit.interval.ms=200
log.format=text
log.level=warn
EOF
declare -A HTTP_PORT=()
for m in "${MEMBERS[@]}"; do HTTP_PORT[$m]=$(free_port); done
member_start() {
    spawn "$1" "$DIR/$1.log" "$BIN" run -c "$CONF" --set "member.id=$1" \
        --set "http.listen=127.0.0.1:${HTTP_PORT[$1]}"
}
for m in "${MEMBERS[@]}"; do member_start "$m"; done

# --- traffic: spread over most of the chaos -----------------------------------
total_msgs=$((RECORDS + RECORDS / 10))
rate=$((total_msgs * 10 / (DURATION * 8) + 1))
spawn produce "$DIR/produce.log" "$BIN" produce -b "$BOOT" -t payments --count "$RECORDS" \
    --duplicates 0.1 --poison 0.01 --seed "$SEED" --too-large-bytes 5000 \
    --currencies EUR,USD,TRY --users 1000 --rate "$rate" --expect "$DIR/expect.json" \
    -X message.timeout.ms=900000

# --- chaos ---------------------------------------------------------------------
KILLS=0 REDIS_KILLS=0
declare -A RESTART_AT=()
rnd 3000; next_kill=$(($(now_ms) + 2000 + R))
rnd 12000; next_redis=$(($(now_ms) + 8000 + R))
redis_up_at=0
chaos_end=$((T_BROKER + DURATION * 1000))
while :; do
    now=$(now_ms)
    produce_done=0
    if [[ -n ${PID[produce]:-} ]] && ! alive "${PID[produce]}"; then
        rc=0
        wait "${PID[produce]}" || rc=$?
        unset "PID[produce]"
        ((rc == 0)) || { cat "$DIR/produce.log" >&2; die "produce failed (exit $rc)"; }
    fi
    [[ -z ${PID[produce]:-} ]] && produce_done=1
    ((now >= chaos_end && produce_done)) && break
    if ((now >= next_kill)); then
        rnd ${#MEMBERS[@]}; m=${MEMBERS[$R]}
        if [[ -n ${PID[$m]:-} ]]; then
            scrape_add "${HTTP_PORT[$m]}"
            stop "$m" KILL 5 || true
            KILLS=$((KILLS + 1))
            rnd 1000; RESTART_AT[$m]=$((now + 200 + R))
        fi
        rnd 3000; next_kill=$((now + 2000 + R))
    fi
    for m in "${!RESTART_AT[@]}"; do
        if ((now >= ${RESTART_AT[$m]})); then
            member_start "$m"
            unset "RESTART_AT[$m]"
        fi
    done
    if ((now >= next_redis && redis_up_at == 0)); then
        stop redis KILL 5 || true
        REDIS_KILLS=$((REDIS_KILLS + 1))
        rnd 1500; redis_up_at=$((now + 500 + R))
        rnd 12000; next_redis=$((now + 8000 + R))
    fi
    if ((redis_up_at && now >= redis_up_at)); then
        redis_start
        redis_up_at=0
    fi
    broker_check
    for m in "${MEMBERS[@]}"; do
        # A member that exited by itself (not killed here) is a failure.
        if [[ -n ${PID[$m]:-} ]] && ! alive "${PID[$m]}"; then
            rc=0
            wait "${PID[$m]}" || rc=$?
            unset "PID[$m]"
            tail -n 20 "$DIR/$m.log" >&2
            die "member $m exited with $rc on its own"
        fi
    done
    sleep 0.05
done
T_CHAOS=$(now_ms)

# --- settle: everything up, then verify must say exact ----------------------
((redis_up_at)) && redis_start
for m in "${!RESTART_AT[@]}"; do member_start "$m"; unset "RESTART_AT[$m]"; done
SENT=$(grep -o '"sent": *[0-9]*' "$DIR/expect.json" | grep -o '[0-9]*$')
WANT_APPLIED=$(grep -o '"applied": *[0-9]*' "$DIR/expect.json" | grep -o '[0-9]*$')
# progress: one line on where the group stands (applied so far, and from
# the members: partitions assigned, consumer lag, ready), which tells a
# group still catching up (lag > 0, or fewer than all partitions assigned)
# from records skipped (lag 0, all assigned, applied short).
progress() {
    local m a=0 l=0 r=0 body
    for m in "${MEMBERS[@]}"; do
        body=$(metrics "${HTTP_PORT[$m]}" || true)
        a=$((a + $(awk '/^idemproc_assigned_partitions / { s += $2 } END { print int(s) }' <<<"$body")))
        l=$((l + $(awk '/^idemproc_consumer_lag_records[{ ]/ { s += $2 } END { print int(s) }' <<<"$body")))
        r=$((r + $(awk '/^idemproc_ready / { s += $2 } END { print int(s) }' <<<"$body")))
    done
    echo "chaos: +$((($(now_ms) - T_CHAOS) / 1000))s after the chaos: applied" \
        "$(redis-cli -h 127.0.0.1 -p "$REDIS_PORT" get idemproc:ledger:applied 2>/dev/null)" \
        "of $WANT_APPLIED; partitions assigned $a of $PARTITIONS; consumer lag $l; members ready $r"
}
VERIFY_OUT='(not run)'
verified=0
deadline=$((T_CHAOS + SETTLE * 1000))
last_progress=0
while (($(now_ms) < deadline)); do
    sleep 3
    broker_check
    if (($(now_ms) - last_progress >= 20000)); then
        progress
        last_progress=$(now_ms)
    fi
    if VERIFY_OUT=$("$BIN" verify -c "$CONF" --expect "$DIR/expect.json" --dlq \
        --timeout-ms 15000 2>&1); then
        verified=1
        break
    fi
done
((verified)) || progress
T_VERIFIED=$(now_ms)
APPLIED=$(redis-cli -h 127.0.0.1 -p "$REDIS_PORT" get idemproc:ledger:applied 2>/dev/null || echo 0)
APPLIED=${APPLIED:-0}
for m in "${MEMBERS[@]}"; do [[ -n ${PID[$m]:-} ]] && scrape_add "${HTTP_PORT[$m]}"; done
FAULTS_APPLIED=$(grep -c 'idemproc broker: fault +' "$DIR/broker.log" || true)
FAULTS_FAILED=$(grep -c 'idemproc broker: fault .* failed' "$DIR/broker.log" || true)

lost=$((WANT_APPLIED > APPLIED ? WANT_APPLIED - APPLIED : 0))
doubled=$((APPLIED > WANT_APPLIED ? APPLIED - WANT_APPLIED : 0))
s() { echo "${SUM[$1]:-0}"; }
echo "chaos: ---------------------------------------------------------------"
printf 'chaos: %-34s %s\n' \
    "seed" "$SEED" \
    "records sent (incl. duplicates)" "$SENT" \
    "applied (expected)" "$APPLIED ($WANT_APPLIED)" \
    "member SIGKILLs" "$KILLS" \
    "redis kill -9 + AOF restarts" "$REDIS_KILLS" \
    "broker faults applied (failed)" "$FAULTS_APPLIED ($FAULTS_FAILED)" \
    "records handled, all incarnations" "$(($(s 'idemproc_records_total{outcome="processed"}') + $(s 'idemproc_records_total{outcome="duplicate"}') + $(s 'idemproc_records_total{outcome="dlq"}')))" \
    "redeliveries absorbed (at least)" "$(s 'idemproc_duplicates_total{kind="redelivery"}')" \
    "resends absorbed (at least)" "$(s 'idemproc_duplicates_total{kind="resend"}')" \
    "rebalances (assign events)" "$(s 'idemproc_rebalances_total{event="assign"}')" \
    "chaos / settle seconds" "$(((T_CHAOS - T_BROKER) / 1000)) / $(((T_VERIFIED - T_CHAOS) / 1000))" \
    "lost" "$lost" \
    "doubled" "$doubled"
printf '%s\n' "$VERIFY_OUT" | sed 's/^/chaos: /'
((verified)) || die "verify did not say exact within ${SETTLE}s of the end of the chaos"
grep -q 'ledger exact' <<<"$VERIFY_OUT" && grep -q 'dlq exact' <<<"$VERIFY_OUT" ||
    die "verify passed without 'ledger exact' and 'dlq exact'"
((lost == 0 && doubled == 0)) || die "lost $lost, doubled $doubled"
for m in "${MEMBERS[@]}"; do stop "$m" TERM 15 || true; done
echo "chaos: OK, exact, in $((($(now_ms) - T0) / 1000)) s"
