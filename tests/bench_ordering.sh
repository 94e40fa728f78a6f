#!/usr/bin/env bash
# bench_ordering.sh BIN: the shape Confluent's Parallel Consumer publishes
# (10,000 records over 1,000 keys in one partition, a service answering in
# a uniform 0-5 ms) through handler=webhook with ordering=key, partition
# and none, in one run on one embedded broker and one private Redis
# (docs/design.md, "Order per key"). The service is tests/ordersink (C,
# thread per connection): it reports the time from its first request to
# its last answer, the order violations it saw (a record of a key arriving
# before the previous one of that key was answered), and its own CPU.
# Each mode gets its own group, an empty Redis and a fresh service; a mode
# fails the bench unless the service applied every identity once.
#
# BENCH_ORDERING_COUNT (10000), BENCH_ORDERING_KEYS (1000),
# BENCH_ORDERING_MODES ("key partition none"), BENCH_ORDERING_PROPS (more
# member properties, e.g. webhook.max.inflight=64). Output: the lines on
# stderr and BENCH_OUT/ordering.json. Run alone: BENCH_ONLY=ordering make
# bench, or tests/bench.sh BIN ordering.
set -euo pipefail

BIN=${1:-build/idemproc}
SRC=$(cd "$(dirname "$0")/.." && pwd)
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
SINK=$(dirname "$BIN")/ordersink
OUT=${BENCH_OUT:-$(dirname "$BIN")/bench}
COUNT=${BENCH_ORDERING_COUNT:-10000}
KEYS=${BENCH_ORDERING_KEYS:-1000}
read -r -a MODES <<<"${BENCH_ORDERING_MODES:-key partition none}"
[[ -x $SINK ]] || { echo "bench-ordering: $SINK missing (make build/ordersink)" >&2; exit 2; }
mkdir -p "$OUT"
LIB_NAME=bench-ordering LIB_SAY_FD=2 LIB_KEEP=${BENCH_KEEP:-} LIB_GRACE=30
. "$SRC/tests/lib.sh"
lib_init bench-ordering

broker_start --topic ord:1 --topic ord.dlq:1
redis_start

# The records: keys drawn at random (seeded) from k-0..k-(KEYS-1), each
# value a JSON object with its own idempotency key and its sequence.
awk -v n="$COUNT" -v k="$KEYS" 'BEGIN { srand(26)
    for (i = 0; i < n; i++) {
        key = "k-" int(rand() * k)
        printf "%s\t{\"idempotency_key\":\"ord-%d\",\"seq\":%d}\n", key, i, i
    } }' >"$DIR/ord.lines"
"$BIN" produce -b "$BOOT" -t ord --input "$DIR/ord.lines" --key-delimiter '\t' \
    --add-message-id=stable 2>"$DIR/produce.log" ||
    die "produce failed: $(tail -3 "$DIR/produce.log")"
say "workload: $COUNT records, $KEYS keys, one partition; service 0-5 ms uniform"

# stat NAME: one field of the service's GET /stats.
sink_stats() { curl -s --max-time 5 "${URL%/hook}/stats"; }

: >"$DIR/ordering.jsonl"
declare -A SPAN
for mode in "${MODES[@]}"; do
    rcli flushdb >/dev/null
    spawn "sink-$mode" "$DIR/sink-$mode.out" "$DIR/sink-$mode.log" "$SINK" \
        --delay-min-ms "${BENCH_ORDERING_DELAY_MIN_MS:-0}" --delay-max-ms "${BENCH_ORDERING_DELAY_MAX_MS:-5}" --seed 26
    wait_for 5 "sink-$mode" test -s "$DIR/sink-$mode.out" || true
    URL=$(head -n 1 "$DIR/sink-$mode.out")
    [[ $URL == http://* ]] || die "ordersink printed no URL"
    free_port MPORT
    member_props "$DIR/$mode.properties" "bench-ordering-$mode" ord \
        handler=webhook "webhook.url=$URL" "ordering=$mode" ${BENCH_ORDERING_PROPS:-}
    spawn "member-$mode" "$DIR/member-$mode.log" "$DIR/member-$mode.log" \
        "$BIN" run -c "$DIR/$mode.properties" --set "http.listen=127.0.0.1:$MPORT"
    deadline=$(($(now_us) + 300000000))
    applied=0
    while (($(now_us) < deadline)); do
        alive "${PID[member-$mode]}" || { tail -5 "$DIR/member-$mode.log" >&2; die "$mode: the member exited"; }
        applied=$(sink_stats | jq -r '.applied // 0')
        ((applied >= COUNT)) && break
        sleep 0.2
    done
    ((applied >= COUNT)) || die "$mode: the service applied $applied of $COUNT in 300 s"
    S=$(sink_stats)
    PROCESSED=$(metric "$MPORT" 'idemproc_records_total{outcome="processed"}')
    stop "member-$mode" TERM 60 || die "$mode: the member exited with $? on SIGTERM"
    stop "sink-$mode" TERM 10 || true
    span=$(jq -r .span_us <<<"$S")
    viol=$(jq -r .violations <<<"$S")
    cpu=$(jq -r .cpu_us <<<"$S")
    reqs=$(jq -r .requests <<<"$S")
    SPAN[$mode]=$span
    jq -c --arg mode "$mode" --argjson processed "${PROCESSED:-0}" \
        '. + {mode: $mode, processed: $processed}' <<<"$S" >>"$DIR/ordering.jsonl"
    say "ordering=$mode: $(awk -v u="$span" 'BEGIN { printf "%.3f", u / 1e6 }') s first request to last answer," \
        "$viol order violations, $reqs requests, service CPU $((cpu / 1000)) ms," \
        "member processed ${PROCESSED:-?}"
done
jq -s '{rows: .}' "$DIR/ordering.jsonl" >"$OUT/ordering.json"
if [[ -n ${SPAN[key]:-} && -n ${SPAN[partition]:-} && ${SPAN[key]} -gt 0 ]]; then
    say "key is $(awk -v k="${SPAN[key]}" -v p="${SPAN[partition]}" 'BEGIN { printf "%.1f", p / k }')x partition" \
        "(goal: >= 8x, and key under 2.06 s: Parallel Consumer's published KEY time)"
fi
