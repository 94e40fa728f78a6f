#!/usr/bin/env bash
# bench.sh BIN [ROW...]: throughput of one member against a reference
# measured in the same run, for `make bench` (rows: ledger, webhook; all
# when none is named, e.g. `tests/bench.sh build/idemproc webhook`).
#
# One embedded broker and one private redis-server; 200,000 payments with
# 10% duplicates and 1% poison. The reference is kcat reading the same topic
# from the beginning (what the broker and the machine can deliver at all);
# then one `idemproc run` member (ledger handler) processes it, timed from
# its first finished record to its last, and verify must say exact. Prints
# both rates and their ratio. Needs bash >= 5, kcat, redis-server/redis-cli.
#
# webhook row: 50,000 records (BENCH_WEBHOOK_COUNT) with 10% duplicates to
# one member with handler=webhook (default settings; more with
# BENCH_WEBHOOK_PROPS="k=v lines"), against the tests' HTTP server
# (build/hooksink, next to BIN) answering every request after 5 ms. The
# issue's bar: >= 5,000 records/s. The member must end with every unique
# record processed and the service must have acknowledged at least that
# many requests.
set -euo pipefail

BIN=${1:-build/idemproc}
# BENCH_ONLY=outbox (or the one row "outbox"): only the outbox relay's rows
# (tests/bench_outbox.sh), without the broker and Redis of the others.
if [[ ${BENCH_ONLY:-} == outbox || "${*:2}" == outbox ]]; then
    exec "$(dirname "$0")/bench_outbox.sh" "$BIN"
fi
COUNT=${BENCH_COUNT:-200000}
PARTITIONS=32 # the mock keeps ~5 MiB per partition: 220k x ~430 B

BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
ROWS=("${@:2}")
((${#ROWS[@]})) || ROWS=(ledger webhook outbox)
want() {
    local r
    for r in "${ROWS[@]}"; do [[ $r == "$1" ]] && return 0; done
    return 1
}
DIR=$(mktemp -d "${TMPDIR:-/tmp}/idemproc-bench.XXXXXX")
PIDS=()
cleanup() {
    local rc=$? p
    set +e
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
    [[ -n ${BENCH_KEEP:-} ]] && echo "bench: kept $DIR" >&2 || rm -rf "$DIR"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

now_us() { local t=${EPOCHREALTIME//[.,]/}; echo "$((10#$t))"; }
rate() { echo "$(($1 * 1000000 / ($2 > 0 ? $2 : 1)))"; }
free_port() {
    local p
    for _ in $(seq 200); do
        p=$((20000 + RANDOM % 12000))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            echo "$p"
            return
        fi
    done
    echo "bench: no free port" >&2
    exit 1
}
# metric_sum PORT: the sum of idemproc_records_total over outcomes, read
# with bash alone (no fork per poll: the machine has 2 cores to share).
metric_sum() {
    local line sum=0
    { exec 3<>"/dev/tcp/127.0.0.1/$1"; } 2>/dev/null || { echo 0; return; }
    printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3
    while IFS= read -r line <&3; do
        [[ $line == idemproc_records_total\{* ]] && sum=$((sum + ${line##* }))
    done
    exec 3<&-
    echo "$sum"
}

"$BIN" broker --topic "payments:$PARTITIONS" --topic payments.dlq:4 \
    --topic hooks:16 --topic hooks.dlq:1 \
    >"$DIR/broker.out" 2>"$DIR/broker.log" &
PIDS+=($!)
for _ in $(seq 100); do [[ -s $DIR/broker.out ]] && break; sleep 0.05; done
BOOT=$(head -n 1 "$DIR/broker.out")
RPORT=$(free_port)
redis-server --port "$RPORT" --bind 127.0.0.1 --dir "$DIR" --save '' \
    --appendonly no >"$DIR/redis.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do
    redis-cli -p "$RPORT" ping >/dev/null 2>&1 && break
    sleep 0.05
done

# The ledger row (not indented, to keep its history readable).
if want ledger; then
"$BIN" produce -b "$BOOT" -t payments --count "$COUNT" --duplicates 0.1 \
    --poison 0.01 --too-large-bytes 5000 --seed 7 --expect "$DIR/expect.json" \
    2>"$DIR/produce.log"
SENT=$(awk -F'[:,]' '/"sent"/ { gsub(/ /, "", $2); print $2 }' "$DIR/expect.json")

# Reference: a plain consumer reading everything, in this same run.
t0=$(now_us)
READ=$(kcat -C -b "$BOOT" -t payments -o beginning -e -q \
    -X fetch.wait.max.ms=10 -f '%o\n' | wc -l)
KCAT_US=$(($(now_us) - t0))
[[ $READ == "$SENT" ]] || { echo "bench: kcat read $READ of $SENT" >&2; exit 1; }

HPORT=$(free_port)
cat >"$DIR/bench.properties" <<PROPS
kafka.bootstrap.servers=$BOOT
group.id=idemproc-bench
input.topics=payments
dlq.topic=payments.dlq
redis.url=redis://127.0.0.1:$RPORT/0
message.max.bytes=4096
kafka.fetch.wait.max.ms=10
kafka.session.timeout.ms=6000
http.listen=127.0.0.1:$HPORT
log.level=warn
PROPS
"$BIN" run -c "$DIR/bench.properties" 2>"$DIR/member.log" &
MEMBER=$!
PIDS+=("$MEMBER")
first=0
done_at=0
deadline=$(($(now_us) + 120000000))
TS=() NS=() # samples: time (us) and records handled
while (($(now_us) < deadline)); do
    n=$(metric_sum "$HPORT")
    t=$(now_us)
    TS+=("$t") NS+=("$n")
    if ((n > 0 && first == 0)); then first=$t; fi
    if ((n >= SENT)); then done_at=$t; break; fi
    sleep 0.5 # bash reads /metrics line by line: keep its CPU small
done
# Best rate over any window of at least one second (warm fetching, no
# start-up or tail), next to the whole-run average.
best=0
for ((i = 0; i < ${#TS[@]}; i++)); do
    for ((j = i + 1; j < ${#TS[@]}; j++)); do
        if ((TS[j] - TS[i] >= 1000000)); then
            r=$(((NS[j] - NS[i]) * 1000000 / (TS[j] - TS[i])))
            ((r > best)) && best=$r
            break
        fi
    done
done
((done_at)) || { echo "bench: the member did not finish" >&2; tail "$DIR/member.log" >&2; exit 1; }
IDEM_US=$((done_at - first))
"$BIN" verify -c "$DIR/bench.properties" --expect "$DIR/expect.json" --dlq \
    >"$DIR/verify.out" || { cat "$DIR/verify.out" >&2; exit 1; }
kill -TERM "$MEMBER"
wait "$MEMBER"

K=$(rate "$SENT" "$KCAT_US")
I=$(rate "$SENT" "$IDEM_US")
printf 'bench: %s records (%s partitions), one member, ledger handler\n' "$SENT" "$PARTITIONS"
printf 'bench: reference  kcat read-only      %8s msgs/s\n' "$K"
printf 'bench: idemproc   dedup+ledger+DLQ    %8s msgs/s  (%s%% of the reference; first to last record)\n' \
    "$I" "$((I * 100 / (K > 0 ? K : 1)))"
printf 'bench: idemproc   best 1 s window     %8s msgs/s\n' "$best"
sed 's/^/bench: /' "$DIR/verify.out"
fi

# rate_of PORT TARGET LOG: polls the member's /metrics until TARGET records
# are finished (2 min at most); prints "first-to-last-rate best-1s-rate".
rate_of() {
    local port=$1 target=$2 log=$3 first=0 done_at=0 n t i j r best=0
    local deadline=$(($(now_us) + 120000000))
    local -a ts=() ns=()
    while (($(now_us) < deadline)); do
        n=$(metric_sum "$port")
        t=$(now_us)
        ts+=("$t") ns+=("$n")
        if ((n > 0 && first == 0)); then first=$t; fi
        if ((n >= target)); then done_at=$t; break; fi
        sleep 0.5
    done
    ((done_at)) || { echo "bench: the member did not finish ($n of $target)" >&2; tail "$log" >&2; return 1; }
    for ((i = 0; i < ${#ts[@]}; i++)); do
        for ((j = i + 1; j < ${#ts[@]}; j++)); do
            if ((ts[j] - ts[i] >= 1000000)); then
                r=$(((ns[j] - ns[i]) * 1000000 / (ts[j] - ts[i])))
                ((r > best)) && best=$r
                break
            fi
        done
    done
    echo "$(rate "$target" "$((done_at - first))") $best"
}

# metric PORT SERIES: one sample's value from the member's /metrics.
metric() {
    local line
    { exec 3<>"/dev/tcp/127.0.0.1/$1"; } 2>/dev/null || { echo 0; return; }
    printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3
    while IFS= read -r line <&3; do
        [[ $line == "$2 "* ]] && { echo "${line##* }"; exec 3<&-; return; }
    done
    exec 3<&-
    echo 0
}

if want webhook; then
    WCOUNT=${BENCH_WEBHOOK_COUNT:-50000}
    SINK=$(dirname "$BIN")/hooksink
    [[ -x $SINK ]] || { echo "bench: $SINK missing (make build/hooksink)" >&2; exit 1; }
    "$SINK" --delay-ms 5 --record >"$DIR/sink.out" 2>"$DIR/sink.log" &
    SINK_PID=$!
    PIDS+=("$SINK_PID")
    for _ in $(seq 100); do [[ -s $DIR/sink.out ]] && break; sleep 0.05; done
    URL=$(head -n 1 "$DIR/sink.out")
    "$BIN" produce -b "$BOOT" -t hooks --count "$WCOUNT" --duplicates 0.1 \
        --poison 0 --seed 9 --expect "$DIR/hooks.expect.json" \
        2>"$DIR/hooks.produce.log"
    WSENT=$(awk -F'[:,]' '/"sent"/ { gsub(/ /, "", $2); print $2 }' "$DIR/hooks.expect.json")
    WUNIQUE=$(awk -F'[:,]' '/"unique"/ { gsub(/ /, "", $2); print $2 }' "$DIR/hooks.expect.json")
    WPORT=$(free_port)
    cat >"$DIR/hooks.properties" <<PROPS
kafka.bootstrap.servers=$BOOT
group.id=idemproc-bench-webhook
input.topics=hooks
dlq.topic=hooks.dlq
redis.url=redis://127.0.0.1:$RPORT/0
redis.prefix=hooks:
handler=webhook
webhook.url=$URL
kafka.fetch.wait.max.ms=10
kafka.session.timeout.ms=6000
http.listen=127.0.0.1:$WPORT
log.level=warn
${BENCH_WEBHOOK_PROPS:-}
PROPS
    "$BIN" run -c "$DIR/hooks.properties" 2>"$DIR/hooks.member.log" &
    WMEMBER=$!
    PIDS+=("$WMEMBER")
    read -r W WBEST < <(rate_of "$WPORT" "$WSENT" "$DIR/hooks.member.log")
    PROCESSED=$(metric "$WPORT" 'idemproc_records_total{outcome="processed"}')
    DUPS=$(metric "$WPORT" 'idemproc_records_total{outcome="duplicate"}')
    kill -TERM "$WMEMBER"
    wait "$WMEMBER" || true
    kill -TERM "$SINK_PID"
    wait "$SINK_PID" || true
    ACKED=$(sed -n 's/.*, \([0-9]*\) answered 2xx.*/\1/p' "$DIR/sink.log")
    printf 'bench: %s records (16 partitions, %s unique), one member, webhook handler, service answers in 5 ms\n' "$WSENT" "$WUNIQUE"
    printf 'bench: idemproc   dedup+webhook       %8s msgs/s  (first to last record; bar: 5000)\n' "$W"
    printf 'bench: idemproc   best 1 s window     %8s msgs/s\n' "$WBEST"
    printf 'bench: webhook    processed %s, duplicates %s, requests acknowledged %s\n' \
        "$PROCESSED" "$DUPS" "${ACKED:-?}"
    ((PROCESSED == WUNIQUE)) || { echo "bench: processed $PROCESSED, expected $WUNIQUE" >&2; exit 1; }
    ((${ACKED:-0} >= WUNIQUE)) || { echo "bench: the service acknowledged ${ACKED:-0} < $WUNIQUE" >&2; exit 1; }
fi

# The outbox relay's rows (PostgreSQL -> Kafka).
if want outbox; then
    "$(dirname "$0")/bench_outbox.sh" "$BIN"
fi
