#!/usr/bin/env bash
# bench_state.sh BIN: what today's dedup state costs Redis and a member, the
# "before" numbers of a new state layout (docs/design.md, "Dedup state
# layout"); a row of `make bench` (alone: make bench BENCH_ONLY=state).
#
# Its own embedded broker and redis-server. Workload: BENCH_COUNT (300,000)
# payments plus 10% duplicates (330,000 records) on 64 partitions, no
# poison. Each figure is measured BENCH_REPS (3) times, without persistence
# and then with AOF (appendfsync everysec), each run on an emptied Redis,
# and the ledger checked exact by `idemproc verify` after it:
#
#   ledger    tests/bench/redisalone: the ledger script through idemproc's
#             own store code (marks and effect), two connections
#   effect    redisalone --effect-only: the same chunks' HINCRBYs in Lua,
#             no marks (repeated identities left out by the driver)
#   member    one `idemproc run` member (ledger handler) on the same Redis
#   partition redisalone --partition: the partition layout's chunk script
#             (dedup.scope=partition: marks held by the driver; each
#             request's chunks, one per partition, in one script call that
#             checks epochs and positions, applies the effect, APPENDs the
#             marks to each partition's window key and writes the
#             positions), one connection
#
# BENCH_STATE_ROWS (all of: ledger effect partition member) picks rows,
# e.g. BENCH_STATE_ROWS="effect partition" to compare the chunk script with
# the effect alone in one run.
#
# Per run: Redis CPU µs per record (utime + stime of the redis-server
# process from /proc/PID/stat, over the topic's records), Redis bytes per
# dedup mark (used_memory growth minus the ledger and position keys, over
# the marks written; every row but the effect alone, so the partition
# row's includes APPEND's spare room and the epoch keys), for the member its records/s
# (from the first outcome seen to the last, polled every 0.1 s) and peak
# RSS (VmHWM). Prints medians (min / median / max) and writes
# BENCH_OUT/state.json. Needs bash >= 5, redis-server/redis-cli, jq.
set -euo pipefail

BIN=${1:-build/idemproc}
SRC=$(cd "$(dirname "$0")/.." && pwd)
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
TOOLS=$(dirname "$BIN")/bench
OUT=${BENCH_OUT:-$TOOLS}
REPS=${BENCH_REPS:-3}
COUNT=${BENCH_COUNT:-300000}
PARTITIONS=64
ROWS=" ${BENCH_STATE_ROWS:-ledger effect partition member} "
row_on() { [[ $ROWS == *" $1 "* ]]; }
LIB_NAME=bench-state LIB_SAY_FD=2 LIB_KEEP=${BENCH_KEEP:-} LIB_GRACE=30
. "$SRC/tests/lib.sh"
[[ -x $TOOLS/redisalone ]] || { echo "bench-state: $TOOLS/redisalone missing (make bench builds it)" >&2; exit 2; }
mkdir -p "$OUT"
lib_init bench-state
TICK_US=$((1000000 / $(getconf CLK_TCK)))

broker_start --topic "payments:$PARTITIONS" --topic payments.dlq:4
"$BIN" produce -b "$BOOT" -t payments --count "$COUNT" --duplicates 0.1 \
    --currencies EUR,USD,TRY --users 3000 --seed 7 --expect "$DIR/expect.json" \
    2>"$DIR/produce.log" || die "produce failed: $(tail -3 "$DIR/produce.log")"
SENT=$(expect_num "$DIR/expect.json" sent)
UNIQUE=$(expect_num "$DIR/expect.json" unique)
say "workload: $SENT records, $UNIQUE unique, $PARTITIONS partitions"

used_memory() { rcli info memory | tr -d '\r' | awk -F: '/^used_memory:/ { print $2 }'; }
# us_per NUM_TICKS: Redis CPU µs per topic record.
us_per() { awk -v t="$1" -v k="$TICK_US" -v n="$SENT" 'BEGIN { printf "%.2f", t * k / n }'; }
b_per() { awk -v b="$1" -v n="$UNIQUE" 'BEGIN { printf "%.1f", b / n }'; }
: >"$DIR/rows.jsonl"
emit() { echo "$1" >>"$DIR/rows.jsonl"; }
verify_exact() {
    "$BIN" verify -c "$1" --expect "$DIR/expect.json" >"$2" 2>&1 && grep -q 'ledger exact' "$2" ||
        { cat "$2" >&2; die "$3: verify is not exact"; }
}

# driver MODE ROW REP [ARG...]: one redisalone run.
driver() {
    local mode=$1 row=$2 rep=$3 conf line c0 c1 m0 m1 other applied
    shift 3
    conf=$DIR/$mode-$row-$rep.properties
    member_props "$conf" "state-$mode-$row-$rep" payments
    rcli flushdb >/dev/null
    c0=$(cpu_ticks "$RPID") m0=$(used_memory)
    line=$("$TOOLS/redisalone" -c "$conf" --connections 2 "$@" 2>"$DIR/$mode-$row-$rep.log") ||
        die "redisalone $row failed: $(tail -3 "$DIR/$mode-$row-$rep.log")"
    c1=$(cpu_ticks "$RPID") m1=$(used_memory)
    other=$(keys_bytes "idemproc:")
    read -r _ _ _ _ _ _ applied _ _ _ _ _ _ _ _ _ _ <<<"$line"
    ((applied == UNIQUE)) || die "$row run $rep: applied $applied of $UNIQUE"
    verify_exact "$conf" "$DIR/$mode-$row-$rep.verify" "$row run $rep"
    local bpm=null # the effect alone writes no marks
    [[ $row == effect ]] || bpm=$(b_per $((m1 - m0 - other)))
    emit "{\"mode\":\"$mode\",\"row\":\"$row\",\"rep\":$rep,\"redis_us\":$(us_per $((c1 - c0))),\"bytes_per_mark\":$bpm}"
    say "$mode $row run $rep: $line"
}

# member_run MODE REP: one member processes the whole topic.
member_run() {
    local mode=$1 rep=$2 conf port name c0 c1 m0 m1 other t0 us rss n
    conf=$DIR/$mode-member-$rep.properties
    name=$mode-member-$rep
    member_props "$conf" "state-$name" payments "member.id=$name"
    rcli flushdb >/dev/null
    free_port port
    c0=$(cpu_ticks "$RPID") m0=$(used_memory) t0=$(now_us)
    spawn "$name" "$DIR/$name.log" "$DIR/$name.log" "$BIN" run -c "$conf" \
        --set "http.listen=127.0.0.1:$port"
    local deadline=$(($(now_us) + 180000000)) first=0
    while n=$(metric_sum "$port") && ((n < SENT)); do
        (($(now_us) < deadline)) || { tail -5 "$DIR/$name.log" >&2; die "$name did not finish ($n of $SENT)"; }
        alive "${PID[$name]}" || { tail -5 "$DIR/$name.log" >&2; die "$name exited"; }
        ((first || n == 0)) || first=$(now_us)
        sleep 0.1
    done
    ((first)) || first=$t0
    us=$(($(now_us) - first))
    rss=$(vm_hwm_kb "${PID[$name]}")
    stop "$name" TERM 60 || die "$name exited with $? on SIGTERM"
    c1=$(cpu_ticks "$RPID") m1=$(used_memory)
    other=$(keys_bytes "idemproc:")
    verify_exact "$conf" "$DIR/$name.verify" "$name"
    emit "{\"mode\":\"$mode\",\"row\":\"member\",\"rep\":$rep,\"redis_us\":$(us_per $((c1 - c0))),\"bytes_per_mark\":$(b_per $((m1 - m0 - other))),\"rate\":$((SENT * 1000000 / us)),\"rss_mib\":$(awk -v k="$rss" 'BEGIN { printf "%.1f", k / 1024 }')}"
    say "$mode member run $rep: $((SENT * 1000000 / us)) records/s (first to last outcome), RSS $((rss / 1024)) MiB"
}

for mode in none aof; do
    if [[ $mode == aof ]]; then
        redis_start --appendonly yes --appendfsync everysec
    else
        redis_start
    fi
    RPID=${PID[redis]}
    for ((rep = 1; rep <= REPS; rep++)); do
        row_on ledger && driver "$mode" ledger "$rep"
        row_on effect && driver "$mode" effect "$rep" --effect-only
        row_on partition && driver "$mode" partition "$rep" --partition
        row_on member && member_run "$mode" "$rep"
    done
    stop redis TERM 30 || true
done

jq -s --argjson sent "$SENT" --argjson unique "$UNIQUE" '
    def stats(f): [.[] | f | select(. != null)] | sort
        | if length == 0 then null else {min: .[0], median: .[(length - 1) / 2 | floor], max: .[-1]} end;
    {workload: {records: $sent, unique: $unique, partitions: 64, duplicates: 0.1},
     rows: (group_by(.mode + "/" + .row) | map({key: (.[0].mode + "/" + .[0].row),
        value: {redis_us: stats(.redis_us), bytes_per_mark: stats(.bytes_per_mark),
                rate: stats(.rate), rss_mib: stats(.rss_mib)}}) | from_entries)}' \
    "$DIR/rows.jsonl" >"$OUT/state.json"
echo "dedup state, today's layout and the partition layout ($SENT records, $UNIQUE unique, $PARTITIONS partitions; min / median / max of $REPS)"
jq -r '.rows | to_entries[] | [.key,
    (.value | [.redis_us, .bytes_per_mark, .rate, .rss_mib]
        | map(if . == null then "-" else "\(.min) / \(.median) / \(.max)" end))[]] | @tsv' "$OUT/state.json" |
    awk -F'\t' 'BEGIN { printf "%-14s %-22s %-22s %-26s %s\n", "persist/row", "Redis us/record", "Redis B/mark", "records/s", "RSS MiB" }
        { printf "%-14s %-22s %-22s %-26s %s\n", $1, $2, $3, $4, $5 }'
