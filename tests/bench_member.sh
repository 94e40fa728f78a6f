#!/usr/bin/env bash
# bench_member.sh BIN: the member's rows of `make bench` for the dedup state
# (issue 24; docs/design.md, "Dedup state layout"): members under
# dedup.scope=global (today's default) and dedup.scope=partition against
# the classic per-message design, and the assignment-time load of a
# partition of 1M marks. A row of `make bench` ("member"; alone: make bench
# BENCH_ONLY=member).
#
# Its own embedded broker and redis-server. Workload as the throughput
# rows of tests/bench.sh: BENCH_COUNT (300,000) payments plus 10%
# duplicates and 1% poison (330,000 records) on 64 partitions, produced
# once. For each persistence mode of BENCH_MEMBER_MODES ("none aof": no
# persistence, then AOF with appendfsync everysec), BENCH_REPS (3)
# repetitions, interleaved, of each row of BENCH_MEMBER_ROWS (all of):
#
#   today      the reference of issue 24's goal ("one member >= 2x
#              today's records/s"): one member as main ran when the issue
#              was filed, dedup.scope=global with the 12 MiB prefetch then
#              the default (kafka.queued.max.messages.kbytes=12288)
#   global     one `idemproc run` member, dedup.scope=global (ledger), with
#              today's defaults (the same prefetch queue as partition)
#   partition  one member, dedup.scope=partition, dedup.memory.max =
#              BENCH_MEMBER_MEMORY_MAX (64 MiB)
#   bound      partition with member.memory.max = BENCH_MEMBER_BOUND (the
#              least the start check accepts for dedup.memory.max and the
#              32 MiB prefetch queue: 64 + 2 x 32 + 7.8 + 32 MiB), the
#              same run as partition: its rate against partition's, its
#              peak RSS against the bound, its pauses
#   two        two members of one group, dedup.scope=partition
#   classic    tests/bench/classic (SET NX EX, HINCRBY, a synchronous
#              commit per record), time-boxed to BENCH_CLASSIC_SECONDS (3)
#   load       tests/bench/partload_bench: 1,000,000 marks (BENCH_LOAD_MARKS)
#              written into one partition by the chunk script, then loaded
#              as a new owner does (epoch INCR, GETRANGE pieces, the table),
#              3 times; every load must hold every mark
#
# Every member run has its own group on an emptied Redis and must be
# exact (`idemproc verify --dlq`), else the bench fails. Per member run:
# records/s (first outcome to last, polled every 0.1 s), member CPU µs per
# record (utime + stime), Redis CPU µs per record (/proc of redis-server),
# Redis bytes per mark (used_memory growth minus ledger and position keys,
# over the payments applied), peak RSS (VmHWM, the larger member's), and
# under partition the tables' bytes and marks (idemproc_dedup_table_bytes,
# idemproc_dedup_table_marks, summed over the members, read before they
# stop) against dedup.memory.max, and the member's peak RSS against it.
# Prints min / median / max, the ratios of one partition member's median
# rate to the today and global rows (the goal: >= 2x today, >= 100,000/s)
# and writes BENCH_OUT/member.json. Needs bash >= 5, kcat, redis-server/redis-cli, jq.
set -euo pipefail

BIN=${1:-build/idemproc}
SRC=$(cd "$(dirname "$0")/.." && pwd)
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
TOOLS=$(dirname "$BIN")/bench
OUT=${BENCH_OUT:-$TOOLS}
REPS=${BENCH_REPS:-3}
COUNT=${BENCH_COUNT:-300000}
PARTITIONS=64
MODES=(${BENCH_MEMBER_MODES:-none aof})
ROWS=(${BENCH_MEMBER_ROWS:-today global partition bound two classic load})
MEMORY_MAX=${BENCH_MEMBER_MEMORY_MAX:-67108864}
BOUND=${BENCH_MEMBER_BOUND:-$((MEMORY_MAX + 2 * 32768 * 1024 + 4 * 1000 * 2048 + 32 * 1048576))}
CLASSIC_SECONDS=${BENCH_CLASSIC_SECONDS:-3}
LOAD_MARKS=${BENCH_LOAD_MARKS:-1000000}
LIB_NAME=bench-member LIB_SAY_FD=2 LIB_KEEP=${BENCH_KEEP:-} LIB_GRACE=30
. "$SRC/tests/lib.sh"
for t in classic partload_bench; do
    [[ -x $TOOLS/$t ]] || { echo "bench-member: $TOOLS/$t missing (make bench builds it)" >&2; exit 2; }
done
want() {
    local r
    for r in "${ROWS[@]}"; do [[ $r == "$1" ]] && return 0; done
    return 1
}
mkdir -p "$OUT"
lib_init bench-member
TICK_US=$((1000000 / $(getconf CLK_TCK)))

broker_start --topic "payments:$PARTITIONS" --topic payments.dlq:4
"$BIN" produce -b "$BOOT" -t payments --count "$COUNT" --duplicates 0.1 --poison 0.01 \
    --too-large-bytes 5000 --currencies EUR,USD,TRY --users 3000 --seed 7 \
    --expect "$DIR/expect.json" 2>"$DIR/produce.log" ||
    die "produce failed: $(tail -3 "$DIR/produce.log")"
SENT=$(expect_num "$DIR/expect.json" sent)
UNIQUE=$(expect_num "$DIR/expect.json" unique)
say "workload: $SENT records, $UNIQUE payments applied, $PARTITIONS partitions"

used_memory() { rcli info memory | tr -d '\r' | awk -F: '/^used_memory:/ { print $2 }'; }
per() { awk -v a="$1" -v b="$2" -v s="${3:-1}" 'BEGIN { printf "%.2f", b ? a * s / b : 0 }'; }
: >"$DIR/rows.jsonl"
# emit MODE ROW REP key=value...: one repetition's figures.
emit() {
    local mode=$1 row=$2 rep=$3 kv k v json
    shift 3
    json="{\"mode\":\"$mode\",\"row\":\"$row\",\"rep\":$rep"
    for kv in "$@"; do
        k=${kv%%=*} v=${kv#*=}
        if [[ $v =~ ^-?[0-9]+(\.[0-9]+)?$ ]]; then json+=",\"$k\":$v"; else json+=",\"$k\":\"$v\""; fi
    done
    echo "$json}" >>"$DIR/rows.jsonl"
}

# members MODE ROW REP N [KEY=VALUE...]: N members of a new group process
# the whole topic; emits the run's figures; dies unless verify says exact.
members() {
    local mode=$1 row=$2 rep=$3 n=$4 i name
    shift 4
    local conf=$DIR/$mode-$row-$rep.properties
    member_props "$conf" "member-$mode-$row-$rep" payments "$@"
    rcli flushdb >/dev/null
    local c0 m0 ports=() pids=() names=() cpu0=()
    c0=$(cpu_ticks "$RPID") m0=$(used_memory)
    for ((i = 0; i < n; i++)); do
        name=$mode-$row-$rep-$i
        free_port "ports[$i]"
        spawn "$name" "$DIR/$name.log" "$DIR/$name.log" "$BIN" run -c "$conf" \
            --set "http.listen=127.0.0.1:${ports[i]}" --set "member.id=$name"
        names+=("$name") pids+=("${PID[$name]}") cpu0+=(0)
    done
    local deadline=$(($(now_us) + 180000000)) first=0 done_us=0 prev t k
    prev=$(now_us)
    while :; do
        k=0
        for i in "${!ports[@]}"; do k=$((k + $(metric_sum "${ports[i]}"))); done
        t=$(now_us)
        if ((k == 0)); then
            for i in "${!pids[@]}"; do cpu0[i]=$(cpu_ticks "${pids[i]}"); done
        elif ((first == 0)); then
            first=$(((prev + t) / 2))
        fi
        ((k < SENT)) || { done_us=$(((prev + t) / 2)); break; }
        ((t < deadline)) || { tail -5 "$DIR/${names[0]}.log" >&2; die "$row run $rep: $k of $SENT records"; }
        for name in "${names[@]}"; do
            alive "${PID[$name]}" || { tail -5 "$DIR/$name.log" >&2; die "$name exited"; }
        done
        prev=$t
        sleep 0.1
    done
    local ticks=0 rss=0 h tb=0 tm=0 max=0 mmax=0 pauses=0
    for i in "${!pids[@]}"; do
        ticks=$((ticks + $(cpu_ticks "${pids[i]}") - cpu0[i]))
        h=$(vm_hwm_kb "${pids[i]}")
        ((h > rss)) && rss=$h
        tb=$((tb + $(metric "${ports[i]}" idemproc_dedup_table_bytes)))
        tm=$((tm + $(metric "${ports[i]}" idemproc_dedup_table_marks)))
        max=$(metric "${ports[i]}" idemproc_dedup_memory_max_bytes)
        mmax=$(metric "${ports[i]}" idemproc_member_memory_max_bytes)
        pauses=$((pauses + $(metric "${ports[i]}" idemproc_member_memory_pauses_total)))
    done
    for name in "${names[@]}"; do kill -TERM "${PID[$name]}"; done
    for name in "${names[@]}"; do stop "$name" - 60 || die "$name exited with $? on SIGTERM"; done
    local c1 m1 other
    c1=$(cpu_ticks "$RPID") m1=$(used_memory)
    other=$(keys_bytes "idemproc:")
    "$BIN" verify -c "$conf" --expect "$DIR/expect.json" --dlq >"$DIR/$mode-$row-$rep.verify" 2>&1 &&
        grep -q 'ledger exact' "$DIR/$mode-$row-$rep.verify" ||
        { cat "$DIR/$mode-$row-$rep.verify" >&2; die "$mode $row run $rep: verify is not exact"; }
    local us=$((done_us - first)) extra=()
    if ((tm > 0)); then
        extra=(table_bytes="$tb" table_marks="$tm" memory_max="$max"
            table_b_per_mark="$(per "$tb" "$tm")"
            table_of_max_pct="$(per "$tb" "$max" 100)"
            rss_of_max_pct="$(per $((rss * 1024)) "$max" 100)")
    fi
    if ((mmax > 0)); then
        extra+=(member_memory_max="$mmax" memory_pauses="$pauses"
            rss_of_member_max_pct="$(per $((rss * 1024)) "$mmax" 100)")
    fi
    emit "$mode" "$row" "$rep" rate=$((SENT * 1000000 / us)) \
        member_cpu_us="$(per $((ticks * TICK_US)) "$SENT")" \
        redis_cpu_us="$(per $(((c1 - c0) * TICK_US)) "$SENT")" \
        redis_b_per_mark="$(awk -v b="$((m1 - m0 - other))" -v n="$UNIQUE" 'BEGIN { printf "%.1f", b / n }')" \
        rss_mib="$(awk -v k="$rss" 'BEGIN { printf "%.1f", k / 1024 }')" \
        "${extra[@]}" verify=exact
    say "$mode $row run $rep: $((SENT * 1000000 / us)) records/s, RSS $((rss / 1024)) MiB${tm:+, table $tm marks in $tb B}, verify exact"
}

classic() {
    local mode=$1 rep=$2 line c0 c1
    rcli flushdb >/dev/null
    c0=$(cpu_ticks "$RPID")
    line=$("$TOOLS/classic" -b "$BOOT" -t payments -g "member-classic-$mode-$rep" \
        -r "127.0.0.1:$REDIS_PORT" --seconds "$CLASSIC_SECONDS" \
        -X fetch.wait.max.ms=10 -X session.timeout.ms=6000 2>"$DIR/classic-$mode-$rep.log") ||
        die "classic failed: $(tail -3 "$DIR/classic-$mode-$rep.log")"
    c1=$(cpu_ticks "$RPID")
    local n rate
    read -r _ _ n _ _ _ _ _ _ _ _ _ rate <<<"$line"
    ((n > 0)) || die "classic handled no record: $line"
    emit "$mode" classic "$rep" rate="$rate" records="$n" \
        redis_cpu_us="$(per $(((c1 - c0) * TICK_US)) "$n")"
    say "$mode classic run $rep: $line"
}

load() {
    local mode=$1 conf=$DIR/load-$1.properties line
    member_props "$conf" "member-load-$mode" partload dedup.scope=partition
    rcli flushdb >/dev/null
    line=$("$TOOLS/partload_bench" -c "$conf" --marks "$LOAD_MARKS" --reps "$REPS" \
        2>"$DIR/load-$mode.log") || die "partload_bench failed: $(tail -3 "$DIR/load-$mode.log")"
    local marks chunks seed lmin lmed lmax pieces tbytes bpm
    read -r _ _ marks _ chunks _ seed _ lmin lmed lmax _ pieces _ tbytes _ bpm <<<"$line"
    emit "$mode" load 1 marks="$marks" chunks="$chunks" seed_s="$seed" load_ms_min="$lmin" \
        load_ms="$lmed" load_ms_max="$lmax" pieces="$pieces" table_b_per_mark="$bpm" verify=exact
    say "$mode load: $line"
}

for mode in "${MODES[@]}"; do
    case $mode in
    none) redis_start ;;
    aof) redis_start --appendonly yes --appendfsync everysec ;;
    *) die "BENCH_MEMBER_MODES: unknown mode $mode (none, aof)" ;;
    esac
    RPID=${PID[redis]}
    for ((rep = 1; rep <= REPS; rep++)); do
        ! want today || members "$mode" today "$rep" 1 dedup.scope=global kafka.queued.max.messages.kbytes=12288
        ! want global || members "$mode" global "$rep" 1 dedup.scope=global
        ! want partition || members "$mode" partition "$rep" 1 dedup.scope=partition "dedup.memory.max=$MEMORY_MAX"
        ! want bound || members "$mode" bound "$rep" 1 dedup.scope=partition "dedup.memory.max=$MEMORY_MAX" \
            "member.memory.max=$BOUND"
        ! want two || members "$mode" two "$rep" 2 dedup.scope=partition "dedup.memory.max=$MEMORY_MAX"
        ! want classic || classic "$mode" "$rep"
    done
    ! want load || load "$mode"
    stop redis TERM 30 || true
done

jq -s --argjson sent "$SENT" --argjson unique "$UNIQUE" --argjson reps "$REPS" '
    def stats: sort as $s | {min: $s[0], median: $s[($s | length - 1) / 2 | floor], max: $s[-1]};
    def ratio($a; $b): if $a == null or $b == null or $b == 0 then null
                       else ($a / $b * 100 | round) / 100 end;
    (group_by(.mode + "/" + .row) | map(. as $g | {key: ($g[0].mode + "/" + $g[0].row), value:
        ([$g[] | keys_unsorted[]] | unique - ["mode", "row", "rep"]
         | map(. as $k | {key: $k, value: ([$g[] | .[$k] | select(. != null)]
               | if all(type == "number") then stats else .[0] end)})
         | from_entries)}) | from_entries) as $rows
    | {workload: {records: $sent, unique: $unique, partitions: 64, duplicates: 0.1,
                  poison: 0.01, repetitions: $reps},
       rows: $rows,
       ratios: ([$rows | keys[] | split("/")[0]] | unique | map(. as $m | {key: $m, value: {
           partition_over_today: ratio($rows[$m + "/partition"].rate.median; $rows[$m + "/today"].rate.median),
           partition_over_global: ratio($rows[$m + "/partition"].rate.median; $rows[$m + "/global"].rate.median),
           partition_rate: $rows[$m + "/partition"].rate.median,
           partition_rss_of_memory_max_pct: $rows[$m + "/partition"].rss_of_max_pct.median,
           bound_over_partition: ratio($rows[$m + "/bound"].rate.median; $rows[$m + "/partition"].rate.median),
           bound_rss_of_member_max_pct: $rows[$m + "/bound"].rss_of_member_max_pct.max,
           bound_pauses: $rows[$m + "/bound"].memory_pauses.max,
           two_over_partition: ratio($rows[$m + "/two"].rate.median; $rows[$m + "/partition"].rate.median),
           partition_over_classic: ratio($rows[$m + "/partition"].rate.median; $rows[$m + "/classic"].rate.median),
           rss_mib_over_global: (if $rows[$m + "/partition"].rss_mib and $rows[$m + "/global"].rss_mib
               then (($rows[$m + "/partition"].rss_mib.median - $rows[$m + "/global"].rss_mib.median) * 100 | round) / 100
               else null end),
           rss_b_per_mark_over_global: (if $rows[$m + "/partition"].rss_mib and $rows[$m + "/global"].rss_mib
               then (($rows[$m + "/partition"].rss_mib.median - $rows[$m + "/global"].rss_mib.median)
                     * 1048576 / $unique * 10 | round) / 10 else null end)}}) | from_entries),
       goals: {partition_over_today: 2, partition_rate: 100000}}' \
    "$DIR/rows.jsonl" >"$OUT/member.json"

echo "member rows ($SENT records, $UNIQUE applied, $PARTITIONS partitions; min / median / max of $REPS; every member run verified exact)"
jq -r '
    def s: if . == null then "-" elif type == "object" then "\(.min) / \(.median) / \(.max)" else tostring end;
    def m: if . == null then "-" elif type == "object" then .median | tostring else tostring end;
    .rows | to_entries[] | select(.key | endswith("/load") | not) | [.key,
        (.value.rate | s), (.value.member_cpu_us | m), (.value.redis_cpu_us | m),
        (.value.redis_b_per_mark | m), (.value.rss_mib | m), (.value.table_b_per_mark | m),
        (if .value.table_of_max_pct then "\(.value.table_of_max_pct.median)% of \(.value.memory_max.median)" else "-" end)]
    | @tsv' "$OUT/member.json" |
    awk -F'\t' 'BEGIN { printf "%-16s %-28s %7s %7s %7s %7s %12s %s\n", "persist/row", "records/s", "member", "Redis", "Redis", "RSS", "member B/mark", "tables of"
                        printf "%-16s %-28s %7s %7s %7s %7s %12s %s\n", "", "", "us/rec", "CPU us", "B/mark", "MiB", "(tables)", "dedup.memory.max" }
        { printf "%-16s %-28s %7s %7s %7s %7s %12s %s\n", $1, $2, $3, $4, $5, $6, $7, $8 }'
jq -r '
    (.rows | to_entries[] | select(.key | endswith("/load")) | .value as $v |
        "\(.key): \($v.marks.median) marks (\($v.chunks.median) chunks, \($v.pieces.median) GETRANGE pieces) loaded into a new owner table in \($v.load_ms_min.median) / \($v.load_ms.median) / \($v.load_ms_max.median) ms (min / median / max), \($v.table_b_per_mark.median) B/mark; every mark found"),
    (.ratios | to_entries[] | "\(.key): one partition member \(.value.partition_rate // "-")/s: / today (global, 12 MiB prefetch) \(.value.partition_over_today // "-")x (goal >= 2x, >= 100,000/s: \(if .value.partition_over_today == null then "-" elif .value.partition_over_today >= 2 and .value.partition_rate >= 100000 then "met" else "NOT met" end)), / global with the same queue \(.value.partition_over_global // "-")x (\(if .value.partition_over_global == null then "-" elif .value.partition_over_global >= 2 then "2x met" else "under 2x" end)); peak RSS \(.value.partition_rss_of_memory_max_pct // "-")% of dedup.memory.max; two / one member \(.value.two_over_partition // "-")x, partition / classic \(.value.partition_over_classic // "-")x; RSS over global \(.value.rss_mib_over_global // "-") MiB = \(.value.rss_b_per_mark_over_global // "-") B per mark held; with member.memory.max: rate / partition \(.value.bound_over_partition // "-")x, highest peak RSS \(.value.bound_rss_of_member_max_pct // "-")% of the bound, pauses \(.value.bound_pauses // "-")")' \
    "$OUT/member.json"
