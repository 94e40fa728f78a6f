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
#   CHAOS_PROPS    extra member properties, one per line (e.g.
#                  kafka.partition.assignment.strategy=cooperative-sticky)
#
# The same seed gives the same traffic, fault schedule and kill sequence
# (the exact instants still depend on the machine). Exit 0 only when exact;
# 3 when the embedded broker aborted on one of its own assertions (the run
# is inconclusive, see broker_check in tests/lib.sh).
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

LIB_NAME=chaos LIB_CONTEXT=" (CHAOS_SEED=$SEED)" LIB_KEEP=${CHAOS_KEEP:-} LIB_KEEP_FAILED=1
. "$(dirname "$0")/lib.sh"
lib_init chaos
T0=$(now_ms)

# rnd N: R = a number in 0..N-1 from the seeded generator (a 64-bit LCG of
# our own, so nothing else that uses $RANDOM disturbs the sequence).
S=$((SEED * 2654435761 + 1))
rnd() {
    S=$(((S * 6364136223846793005 + 1442695040888963407) & 0x7fffffffffffffff))
    R=$(((S >> 20) % $1))
}

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
broker_start --brokers 3 \
    --topic "payments:$PARTITIONS" --topic "payments.dlq:$DLQ_PARTITIONS" --faults "$FAULTS"
T_BROKER=$(now_ms)

# --- redis (AOF, fsync on every write: a kill -9 loses nothing acknowledged;
# a restart comes back on the same port, from the AOF)
free_port REDIS_PORT
aof_redis_start() { redis_start --appendonly yes --appendfsync always; }
aof_redis_start
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
if [[ -n ${CHAOS_PROPS:-} ]]; then printf '%s\n' "$CHAOS_PROPS" >>"$CONF"; fi
declare -A HTTP_PORT=()
for m in "${MEMBERS[@]}"; do free_port "HTTP_PORT[$m]"; done
member_start() {
    spawn "$1" "$DIR/$1.log" "$DIR/$1.log" "$BIN" run -c "$CONF" --set "member.id=$1" \
        --set "http.listen=127.0.0.1:${HTTP_PORT[$1]}"
}
for m in "${MEMBERS[@]}"; do member_start "$m"; done

# --- traffic: spread over most of the chaos -----------------------------------
total_msgs=$((RECORDS + RECORDS / 10))
rate=$((total_msgs * 10 / (DURATION * 8) + 1))
spawn produce "$DIR/produce.log" "$DIR/produce.log" "$BIN" produce -b "$BOOT" -t payments --count "$RECORDS" \
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
        aof_redis_start
        redis_up_at=0
    fi
    broker_check "${PID[broker]:-}" "$DIR/broker.log"
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
((redis_up_at)) && aof_redis_start
for m in "${!RESTART_AT[@]}"; do member_start "$m"; unset "RESTART_AT[$m]"; done
SENT=$(expect_num "$DIR/expect.json" sent)
WANT_APPLIED=$(expect_num "$DIR/expect.json" applied)
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
    broker_check "${PID[broker]:-}" "$DIR/broker.log"
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
    "dedup layout (layout since from)" "$(redis-cli -h 127.0.0.1 -p "$REDIS_PORT" hmget idemproc:layout:chaos layout since from 2>/dev/null | tr '\n' ' ')" \
    "partition window keys" "$(redis-cli -h 127.0.0.1 -p "$REDIS_PORT" --scan --pattern 'idemproc:st{*}:w*' 2>/dev/null | wc -l)" \
    "lost" "$lost" \
    "doubled" "$doubled"
printf '%s\n' "$VERIFY_OUT" | sed 's/^/chaos: /'
((verified)) || die "verify did not say exact within ${SETTLE}s of the end of the chaos"
grep -q 'ledger exact' <<<"$VERIFY_OUT" && grep -q 'dlq exact' <<<"$VERIFY_OUT" ||
    die "verify passed without 'ledger exact' and 'dlq exact'"
((lost == 0 && doubled == 0)) || die "lost $lost, doubled $doubled"
for m in "${MEMBERS[@]}"; do stop "$m" TERM 15 || true; done
echo "chaos: OK, exact, in $((($(now_ms) - T0) / 1000)) s"
