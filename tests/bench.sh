#!/usr/bin/env bash
# bench.sh BIN [ROW...]: `make bench`, idemproc measured side by side with
# its references, all in one run on one embedded broker and one private
# redis-server (docs/design.md, "Throughput"). Rows (all when none is named):
#
#   kcat       kcat reading the topic from the beginning: the fetch ceiling
#   classic    tests/bench/classic: the classic per-message design (SET NX
#              EX, HINCRBY, synchronous commit per record), time-boxed to
#              BENCH_CLASSIC_SECONDS (3) per repetition (it is far slower)
#   redis      tests/bench/redisalone: the valid records' ledger chunks sent
#              by idemproc's own store code straight to Redis over two
#              connections (what Redis can do for the same work)
#   idemproc1  `idemproc run`, one member (ledger handler, bench settings)
#   idemproc2  the same with two members in one group
#   latency    produce timestamp -> effect (idemproc_effect_latency_seconds)
#              with one member while `produce --rate` sends for
#              BENCH_LATENCY_SECONDS (4) at half of idemproc1's median rate
#              (BENCH_LATENCY_RATE overrides), split into stages (produce's
#              acknowledgement, CreateTime -> poll, poll -> outcome) with
#              the CPU of every process; the member fetches with
#              fetch.wait.max.ms=BENCH_LATENCY_FETCH_WAIT_MS (2: the mock
#              broker holds an empty fetch that long even when data
#              arrives); BENCH_LATENCY_PRODUCE_ARGS adds produce options
#   produce    `idemproc produce` against `kcat -P` for BENCH_PRODUCE_COUNT
#              (1,000,000) records, the same keys and values, and against
#              `kcat -P -H` carrying two headers as produce does; `produce
#              --input --no-envelope-headers` sends what kcat -P sends
#   webhook    one member, handler=webhook, a service answering in 5 ms
#   outbox     the outbox relay's rows (tests/bench_outbox.sh)
#   member     the dedup state's member rows (tests/bench_member.sh, its own
#              broker and Redis): one member under dedup.scope=global and
#              under partition, two members (partition), the classic
#              design, without persistence and with AOF everysec; member
#              RSS and bytes per mark; the load of a partition of 1M marks
#   cluster    two members on a 3-primary Redis Cluster against the same two
#              on one Redis (tests/bench_cluster.sh, its own broker, Redis
#              and cluster): records/s, Redis CPU per node and per record,
#              the paper estimate of records/s per primary
#   script     not by default: handler=script against the ledger on their own
#              broker and Redis (tests/bench_script.sh; its own lines, not in
#              the table)
#
# Workload of the throughput rows: BENCH_COUNT (300,000) payments and poison
# plus 10% duplicates (330,000 records), 1% poison, on 64 partitions (the
# mock keeps ~5 MiB a partition: ~2.3 MB each here), produced once. Each row
# runs BENCH_REPS (3) times; the table shows min / median / max. Every
# idemproc run gets its own group and an empty Redis (FLUSHDB before), and
# `idemproc verify` must say exact after it, else the bench fails; so must
# the Redis-alone ledger. Per idemproc row: member CPU per record (utime +
# stime from /proc, from its last sample before the first record to the
# last record), Redis per record (INFO commandstats: usec of the script
# commands, which include the commands they call; and INFO cpu), Redis
# bytes per dedup mark (used_memory growth minus the ledger and position
# keys, over the marks written) and peak RSS (VmHWM).
#
# Output: the table on stdout, BENCH_OUT (next to BIN: build/bench) gets
# results.json and records_per_s.png (gnuplot). BENCH_KEEP=1 keeps the
# temp dir. Needs bash >= 5, kcat, redis-server/redis-cli, jq, gnuplot.
set -euo pipefail

BIN=${1:-build/idemproc}
# BENCH_ONLY=outbox (or the one row "outbox"): only the outbox relay's rows
# (tests/bench_outbox.sh), without the broker and Redis of the others.
if [[ ${BENCH_ONLY:-} == outbox || "${*:2}" == outbox ]]; then
    exec "$(dirname "$0")/bench_outbox.sh" "$BIN"
fi
# BENCH_ONLY=ordering (or the one row "ordering"): tests/bench_ordering.sh alone.
[[ ${BENCH_ONLY:-} == ordering || "${*:2}" == ordering ]] && exec "$(dirname "$0")/bench_ordering.sh" "$BIN"
# BENCH_ONLY=state (or the one row "state"): the dedup state's baseline (tests/bench_state.sh).
# BENCH_ONLY=member: only the member rows (tests/bench_member.sh).
[[ ${BENCH_ONLY:-} != member ]] || exec "$(dirname "$0")/bench_member.sh" "$BIN"
# BENCH_ONLY=cluster (or the one row "cluster"): tests/bench_cluster.sh alone.
[[ ${BENCH_ONLY:-} != cluster && "${*:2}" != cluster ]] || exec "$(dirname "$0")/bench_cluster.sh" "$BIN"
[[ ${BENCH_ONLY:-} != state && "${*:2}" != state ]] || exec "$(dirname "$0")/bench_state.sh" "$BIN"
SRC=$(cd "$(dirname "$0")/.." && pwd)
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
TOOLS=$(dirname "$BIN")/bench
OUT=${BENCH_OUT:-$TOOLS}
REPS=${BENCH_REPS:-3}
COUNT=${BENCH_COUNT:-300000}
PARTITIONS=64
CLASSIC_SECONDS=${BENCH_CLASSIC_SECONDS:-3}
PRODUCE_COUNT=${BENCH_PRODUCE_COUNT:-1000000}
LAT_SECONDS=${BENCH_LATENCY_SECONDS:-4}
WORKLOAD=(--duplicates 0.1 --poison 0.01 --too-large-bytes 5000
    --currencies EUR,USD,TRY --users 3000)

ROWS=("${@:2}")
((${#ROWS[@]})) || ROWS=(kcat classic redis idemproc1 idemproc2 latency produce webhook outbox member cluster)
want() {
    local r
    for r in "${ROWS[@]}"; do [[ $r == "$1" ]] && return 0; done
    return 1
}
for t in classic redisalone; do
    [[ -x $TOOLS/$t ]] || { echo "bench: $TOOLS/$t missing (make bench builds it)" >&2; exit 2; }
done
mkdir -p "$OUT"
LIB_NAME=bench LIB_SAY_FD=2 LIB_KEEP=${BENCH_KEEP:-} LIB_GRACE=30
. "$SRC/tests/lib.sh"
lib_init bench
TICK_US=$((1000000 / $(getconf CLK_TCK)))

# redis_snap: "script_usec used_memory cpu_us" of the private Redis:
# script_usec sums INFO commandstats usec of EVAL/EVALSHA/FCALL and their
# _ro forms, which include the commands a script calls (those are counted
# again under their own names, so they are left out here).
redis_snap() {
    rcli info all | tr -d '\r' | awk -F'[:,=]' '
        /^cmdstat_(eval|evalsha|eval_ro|evalsha_ro|fcall|fcall_ro):/ { u += $5 }
        /^used_memory:/ { m = $2 }
        /^used_cpu_sys:/ { c += $2 } /^used_cpu_user:/ { c += $2 }
        END { printf "%d %d %d\n", u, m, c * 1000000 }'
}
# emit ROW REP key=value...: one repetition's figures (numbers stay numbers).
emit() {
    local row=$1 rep=$2 kv k v json
    shift 2
    json="{\"row\":\"$row\",\"rep\":$rep"
    for kv in "$@"; do
        k=${kv%%=*} v=${kv#*=}
        if [[ $v =~ ^-?[0-9]+(\.[0-9]+)?$ ]]; then json+=",\"$k\":$v"; else json+=",\"$k\":\"$v\""; fi
    done
    echo "$json}" >>"$DIR/rows.jsonl"
}
: >"$DIR/rows.jsonl"
: >"$DIR/row_seconds"
# row_done NAME T0: how long a row took (results.json "row_seconds").
row_done() { echo "$1 $((($(now_us) - $2) / 1000000))" >>"$DIR/row_seconds"; }
LOAD_START=$(cut -d' ' -f1 /proc/loadavg)
T_BENCH=$(now_us)

# --- one broker, one Redis ------------------------------------------------
# A topic per latency repetition: each one's member reads only its traffic.
LATENCY_TOPICS=()
for ((rep = 1; rep <= REPS; rep++)); do
    LATENCY_TOPICS+=(--topic "latency$rep:$PARTITIONS" --topic "latency$rep.dlq:4")
done
broker_start --topic "payments:$PARTITIONS" --topic payments.dlq:4 "${LATENCY_TOPICS[@]}" \
    --topic p1m:128 --topic p1mi:128 --topic p1mk:128 --topic p1mh:128 --topic p1mb:128 --topic hooks:16 --topic hooks.dlq:1
redis_start

# --- the workload ---------------------------------------------------------
THROUGHPUT_ROWS=0
for r in kcat classic redis idemproc1 idemproc2; do want "$r" && THROUGHPUT_ROWS=1; done
if ((THROUGHPUT_ROWS)); then
    t0=$(now_us)
    "$BIN" produce -b "$BOOT" -t payments --count "$COUNT" "${WORKLOAD[@]}" \
        --seed 7 --expect "$DIR/expect.json" 2>"$DIR/produce.log" ||
        die "produce failed: $(tail -3 "$DIR/produce.log")"
    SENT=$(expect_num "$DIR/expect.json" sent)
    UNIQUE=$(expect_num "$DIR/expect.json" unique)
    BYTES=$(kcat -C -b "$BOOT" -t payments -p 0 -o beginning -e -q -f '%S\n' |
        awk '{ s += $1; n++ } END { printf "%d", n ? s / n : 0 }')
    say "workload: $SENT records ($UNIQUE unique payments applied, $((SENT - UNIQUE)) duplicates and poison), $PARTITIONS partitions, ~$BYTES B values, produced in $((($(now_us) - t0) / 1000)) ms"
fi

# wait_members TARGET PORT...: polls the members' /metrics every 0.1 s
# until they finished TARGET records (120 s at most). Sets FIRST_US (the
# first record: midway between the last sample without one and the first
# with one), DONE_US (likewise for the last) and CPU0[i] (member i's CPU
# ticks at the last sample before the first record; needs MPIDS set).
wait_members() {
    local target=$1 n p t prev_t i
    shift
    local deadline=$(($(now_us) + 120000000))
    FIRST_US=0 DONE_US=0 prev_t=$(now_us)
    CPU0=()
    while (($(now_us) < deadline)); do
        n=0
        for p in "$@"; do n=$((n + $(metric_sum "$p"))); done
        t=$(now_us)
        if ((n == 0)); then
            for i in "${!MPIDS[@]}"; do CPU0[i]=$(cpu_ticks "${MPIDS[i]}"); done
        elif ((FIRST_US == 0)); then
            FIRST_US=$(((prev_t + t) / 2))
        fi
        if ((n >= target)); then
            DONE_US=$(((prev_t + t) / 2))
            return 0
        fi
        prev_t=$t
        sleep 0.1
    done
    say "the members did not finish ($n of $target records)"
    return 1
}

# member NAME CONF PORT [ARG...]: `idemproc run -c CONF ARG...` as process
# NAME, /metrics on 127.0.0.1:PORT, output in DIR/NAME.log; MPIDS += its pid.
member() {
    local name=$1 conf=$2 port=$3
    shift 3
    spawn "$name" "$DIR/$name.log" "$DIR/$name.log" "$BIN" run -c "$conf" \
        --set "http.listen=127.0.0.1:$port" "$@"
    MPIDS+=("${PID[$name]}")
}
# members_stop NAME...: SIGTERM to every one at once, then each must exit 0.
members_stop() {
    local name
    for name; do kill -TERM "${PID[$name]}"; done
    for name; do stop "$name" - 60 || die "$name exited with $? on SIGTERM"; done
}

# idemproc_run ROW REP MEMBERS: MEMBERS members of a new group process the
# whole `payments` topic; emits the repetition's figures, fails unless
# verify says exact.
idemproc_run() {
    local row=$1 rep=$2 members=$3 i names
    local conf=$DIR/$row-$rep.properties
    member_props "$conf" "bench-$row-$rep" payments
    rcli flushdb >/dev/null
    read -r u0 m0 c0 < <(redis_snap)
    MPIDS=() MPORTS=() names=()
    for ((i = 0; i < members; i++)); do
        free_port "MPORTS[$i]"
        names+=("$row-$rep-$i")
        member "$row-$rep-$i" "$conf" "${MPORTS[i]}" --set "member.id=$row-$rep-$i"
    done
    wait_members "$SENT" "${MPORTS[@]}" || { tail -5 "$DIR/$row-$rep-0.log" >&2; exit 1; }
    local ticks=0 rss=0 revokes=0 h
    for i in "${!MPIDS[@]}"; do
        ticks=$((ticks + $(cpu_ticks "${MPIDS[i]}") - CPU0[i]))
        h=$(vm_hwm_kb "${MPIDS[i]}")
        ((h > rss)) && rss=$h
        revokes=$((revokes + $(metric "${MPORTS[i]}" 'idemproc_rebalances_total{event="revoke"}')))
    done
    members_stop "${names[@]}"
    read -r u1 m1 c1 < <(redis_snap)
    local other
    other=$(keys_bytes "idemproc:")
    "$BIN" verify -c "$conf" --expect "$DIR/expect.json" --dlq >"$DIR/$row-$rep.verify" 2>&1 ||
        { cat "$DIR/$row-$rep.verify" >&2; die "$row run $rep: verify is not exact"; }
    grep -q 'ledger exact' "$DIR/$row-$rep.verify" || die "$row run $rep: verify did not say exact"
    local us=$((DONE_US - FIRST_US))
    emit "$row" "$rep" rate=$((SENT * 1000000 / us)) seconds="$(awk -v u="$us" 'BEGIN { printf "%.3f", u / 1e6 }')" \
        member_cpu_us="$(awk -v t="$ticks" -v k="$TICK_US" -v n="$SENT" 'BEGIN { printf "%.2f", t * k / n }')" \
        redis_us="$(awk -v u="$((u1 - u0))" -v n="$SENT" 'BEGIN { printf "%.2f", u / n }')" \
        redis_cpu_us="$(awk -v u="$((c1 - c0))" -v n="$SENT" 'BEGIN { printf "%.2f", u / n }')" \
        bytes_per_mark="$(awk -v b="$((m1 - m0 - other))" -v n="$UNIQUE" 'BEGIN { printf "%.1f", b / n }')" \
        rss_mib="$(awk -v k="$rss" 'BEGIN { printf "%.1f", k / 1024 }')" \
        revokes="$revokes" verify=exact
    say "$row run $rep: $((SENT * 1000000 / us)) records/s, verify exact"
}

# --- rows ------------------------------------------------------------------
if want kcat; then
    T_ROW=$(now_us)
    for ((rep = 1; rep <= REPS; rep++)); do
        t0=$(now_us)
        READ=$(kcat -C -b "$BOOT" -t payments -o beginning -e -q \
            -X fetch.wait.max.ms=10 -f '%o\n' | wc -l)
        us=$(($(now_us) - t0))
        [[ $READ == "$SENT" ]] || die "kcat read $READ of $SENT"
        emit kcat "$rep" rate=$((SENT * 1000000 / us))
    done
    row_done kcat "$T_ROW"
fi

if want classic; then
    T_ROW=$(now_us)
    for ((rep = 1; rep <= REPS; rep++)); do
        rcli flushdb >/dev/null
        read -r u0 m0 c0 < <(redis_snap)
        line=$("$TOOLS/classic" -b "$BOOT" -t payments -g "bench-classic-$rep" \
            -r "127.0.0.1:$REDIS_PORT" --seconds "$CLASSIC_SECONDS" \
            -X fetch.wait.max.ms=10 -X session.timeout.ms=6000 2>"$DIR/classic-$rep.log") ||
            die "classic failed: $(tail -3 "$DIR/classic-$rep.log")"
        read -r u1 m1 c1 < <(redis_snap)
        read -r _ _ n _ new _ dups _ poison _ secs _ rate <<<"$line"
        ((n > 0)) || die "classic handled no record: $line"
        emit classic "$rep" rate="$rate" records="$n" seconds="$secs" \
            redis_cpu_us="$(awk -v u="$((c1 - c0))" -v n="$n" 'BEGIN { printf "%.2f", u / n }')"
        say "classic run $rep: $line"
    done
    row_done classic "$T_ROW"
fi

if want redis; then
    T_ROW=$(now_us)
    for ((rep = 1; rep <= REPS; rep++)); do
        conf=$DIR/redis-$rep.properties
        member_props "$conf" "bench-redis-$rep" payments
        rcli flushdb >/dev/null
        read -r u0 m0 c0 < <(redis_snap)
        line=$("$TOOLS/redisalone" -c "$conf" --connections 2 2>"$DIR/redis-$rep.log") ||
            die "redisalone failed: $(tail -3 "$DIR/redis-$rep.log")"
        read -r u1 m1 c1 < <(redis_snap)
        other=$(keys_bytes "idemproc:")
        "$BIN" verify -c "$conf" --expect "$DIR/expect.json" >"$DIR/redis-$rep.verify" 2>&1 ||
            { cat "$DIR/redis-$rep.verify" >&2; die "Redis alone run $rep: verify is not exact"; }
        read -r _ _ n _ sent _ applied _ _ _ _ _ _ _ secs _ rate <<<"$line"
        ((applied == UNIQUE)) || die "Redis alone applied $applied of $UNIQUE"
        emit redis "$rep" rate="$rate" seconds="$secs" \
            redis_us="$(awk -v u="$((u1 - u0))" -v n="$n" 'BEGIN { printf "%.2f", u / n }')" \
            redis_cpu_us="$(awk -v u="$((c1 - c0))" -v n="$n" 'BEGIN { printf "%.2f", u / n }')" \
            bytes_per_mark="$(awk -v b="$((m1 - m0 - other))" -v n="$UNIQUE" 'BEGIN { printf "%.1f", b / n }')" \
            verify=exact
        say "redis alone run $rep: $line"
    done
    row_done redis "$T_ROW"
fi

if want idemproc1; then
    T_ROW=$(now_us)
    for ((rep = 1; rep <= REPS; rep++)); do idemproc_run idemproc1 "$rep" 1; done
    row_done idemproc1 "$T_ROW"
fi
if want idemproc2; then
    T_ROW=$(now_us)
    for ((rep = 1; rep <= REPS; rep++)); do idemproc_run idemproc2 "$rep" 2; done
    row_done idemproc2 "$T_ROW"
fi

# median ROW KEY: the median of a key over a row's repetitions ("" if none).
median() {
    jq -rs --arg r "$1" --arg k "$2" '[.[] | select(.row == $r) | .[$k] | numbers] | sort
        | if length == 0 then "" else .[(length - 1) / 2 | floor] end' "$DIR/rows.jsonl"
}

# quantile Q BEFORE AFTER: the upper bound of the bucket holding quantile Q
# of the observations between two snapshots of "le count" lines.
quantile() {
    paste -d' ' <(echo "$2") <(echo "$3") | awk -v q="$1" '
        { le[NR] = $1; c[NR] = $4 - $2 } END {
            total = c[NR]; if (total == 0) { print "n/a"; exit }
            for (i = 1; i <= NR; i++) if (c[i] >= q * total) { print le[i]; exit } }'
}
# child_cpu_ms VAR: VAR = user + system CPU of this shell's finished
# children, in ms (the builtin `times` must run in this shell, not in a
# $(...) subshell, whose children are its own).
child_cpu_ms() {
    times >"$DIR/times"
    printf -v "$1" '%s' "$(awk 'NR == 2 { t = 0; for (i = 1; i <= 2; i++) {
        split($i, a, /[ms]/); t += a[1] * 60000 + a[2] * 1000 } printf "%d", t }' "$DIR/times")"
}
# buckets PORT NAME: the "le count" lines of histogram NAME on PORT.
buckets() {
    metrics "$1" | sed -n "s/^$2_bucket{le=\"\([^\"]*\)\"} \(.*\)/\1 \2/p"
}
# stage_snap PORT: the histograms the latency row splits a record's time
# with, one after the other, separated by "--" lines: 1 effect (CreateTime
# -> effect), 2 fetch (CreateTime -> poll), 3 processing (poll -> outcome),
# 4 Redis round trip, 5 batch size (records).
stage_snap() {
    local h
    for h in idemproc_effect_latency_seconds idemproc_fetch_latency_seconds \
        idemproc_processing_latency_seconds idemproc_redis_roundtrip_seconds \
        idemproc_batch_size_records; do
        buckets "$1" "$h"
        echo --
    done
}
# stage_ms Q N BEFORE AFTER [SCALE]: quantile Q of histogram N (as in
# stage_snap) between two snapshots, times SCALE (1000: seconds to ms), as
# its bucket's upper bound.
stage_ms() {
    local b a s
    b=$(awk -v n="$2" '/^--$/ { i++; next } i + 1 == n' <<<"$3")
    a=$(awk -v n="$2" '/^--$/ { i++; next } i + 1 == n' <<<"$4")
    s=$(quantile "$1" "$b" "$a")
    [[ $s == n/a || $s == +Inf ]] && { echo "$s"; return; }
    awk -v s="$s" -v k="${5:-1000}" 'BEGIN { printf "%g", s * k }'
}

LAT_RATE=${BENCH_LATENCY_RATE:-}
# The member's fetch.wait.max.ms in the latency row: 2 ms, not the 10 ms
# of the other rows. librdkafka's mock broker answers a fetch that finds no
# data only after the whole fetch.wait.max.ms, even when data arrives
# meanwhile, so every record that lands during such a wait waits for the
# rest of it; a real broker answers as soon as fetch.min.bytes (1) is there.
# The member's own default (librdkafka's 500 ms) is right on a real broker.
LAT_FETCH_WAIT=${BENCH_LATENCY_FETCH_WAIT_MS:-2}
if want latency && [[ -z $LAT_RATE ]]; then
    m=$(median idemproc1 rate)
    [[ -n $m ]] && LAT_RATE=$((m / 2))
fi
if want latency && [[ -z $LAT_RATE ]]; then
    say "latency: skipped (no idemproc1 rate to halve; set BENCH_LATENCY_RATE)"
    emit latency 0 note="not measured: no idemproc1 rate to halve"
elif want latency; then
    T_ROW=$(now_us)
    # Unique payments so that, with 10% duplicates, LAT_SECONDS of traffic.
    LCOUNT=$((LAT_RATE * LAT_SECONDS * 10 / 11))
    for ((rep = 1; rep <= REPS; rep++)); do
        conf=$DIR/latency-$rep.properties
        member_props "$conf" "bench-latency-$rep" "latency$rep" \
            "kafka.fetch.wait.max.ms=$LAT_FETCH_WAIT"
        rcli flushdb >/dev/null
        free_port "MPORTS[0]"
        MPIDS=()
        member "latency-$rep" "$conf" "${MPORTS[0]}"
        # Wait for the partitions, then 1 s without a rebalance.
        settled=0 stable_since=$(now_us) last=''
        deadline=$(($(now_us) + 60000000))
        while ((settled == 0)); do
            (($(now_us) < deadline)) || die "latency: the member got no partitions"
            snap=$(metrics "${MPORTS[0]}" | awk '/^idemproc_assigned_partitions / { a = $2 }
                /^idemproc_rebalances_total\{/ { r += $2 } END { print a + 0, r + 0 }')
            read -r assigned reb <<<"$snap"
            [[ $reb != "$last" ]] && { last=$reb; stable_since=$(now_us); }
            ((assigned == PARTITIONS && $(now_us) - stable_since >= 1000000)) && settled=1
            sleep 0.1
        done
        before=$(stage_snap "${MPORTS[0]}")
        # CPU of every process in the run (is half rate really light?).
        read -r _ _ rc0 < <(redis_snap)
        mt0=$(cpu_ticks "${MPIDS[0]}") bt0=$(cpu_ticks "${PID[broker]}")
        child_cpu_ms pc0
        lt0=$(now_us)
        # shellcheck disable=SC2086 # BENCH_LATENCY_PRODUCE_ARGS: words
        "$BIN" produce -b "$BOOT" -t "latency$rep" --count "$LCOUNT" "${WORKLOAD[@]}" \
            --seed $((100 + rep)) --rate "$LAT_RATE" --expect "$DIR/latency-$rep.expect.json" \
            ${BENCH_LATENCY_PRODUCE_ARGS:-} 2>"$DIR/latency-$rep.produce.log" ||
            die "latency: produce failed: $(tail -2 "$DIR/latency-$rep.produce.log")"
        child_cpu_ms pc1
        LSENT=$(expect_num "$DIR/latency-$rep.expect.json" sent)
        # The rate produce reached from its first send to its last, and its
        # acknowledgement latency (CreateTime -> delivery report).
        read -r achieved ack50 ack99 < <(sed -n 's/^produce: send rate \([0-9]*\) msgs\/s.* p50 \([0-9-]*\) ms, p99 \([0-9-]*\) ms.*/\1 \2 \3/p' \
            "$DIR/latency-$rep.produce.log" | tail -1)
        share=$(awk -v a="${achieved:-0}" -v t="$LAT_RATE" 'BEGIN { printf "%.1f", a * 100 / t }')
        wait_members "$LSENT" "${MPORTS[0]}" || exit 1
        after=$(stage_snap "${MPORTS[0]}")
        read -r _ _ rc1 < <(redis_snap)
        mt1=$(cpu_ticks "${MPIDS[0]}") bt1=$(cpu_ticks "${PID[broker]}")
        lt1=$(now_us)
        # µs of CPU per record sent: member, broker, Redis, producer; and
        # all four as a share of the machine over the run.
        read -r cm cb cr cp busy < <(awk -v n="$LSENT" -v k="$TICK_US" \
            -v m="$((mt1 - mt0))" -v b="$((bt1 - bt0))" -v r="$((rc1 - rc0))" \
            -v p="$(((pc1 - pc0) * 1000))" -v w="$((lt1 - lt0))" -v c="$(nproc)" \
            'BEGIN { printf "%.2f %.2f %.2f %.2f %.0f\n", m * k / n, b * k / n, r / n, p / n,
                     (m * k + b * k + r + p) * 100 / (w * c) }')
        members_stop "latency-$rep"
        "$BIN" verify -c "$conf" --expect "$DIR/latency-$rep.expect.json" --dlq \
            >"$DIR/latency-$rep.verify" 2>&1 ||
            { cat "$DIR/latency-$rep.verify" >&2; die "latency run $rep: verify is not exact"; }
        p50=$(stage_ms 0.5 1 "$before" "$after") p99=$(stage_ms 0.99 1 "$before" "$after")
        f50=$(stage_ms 0.5 2 "$before" "$after") f99=$(stage_ms 0.99 2 "$before" "$after")
        m50=$(stage_ms 0.5 3 "$before" "$after") m99=$(stage_ms 0.99 3 "$before" "$after")
        r50=$(stage_ms 0.5 4 "$before" "$after") r99=$(stage_ms 0.99 4 "$before" "$after")
        b50=$(stage_ms 0.5 5 "$before" "$after" 1) b99=$(stage_ms 0.99 5 "$before" "$after" 1)
        reached=yes note=''
        awk -v s="$share" 'BEGIN { exit !(s < 95) }' && reached=no note=': rate NOT reached'
        emit latency "$rep" target_rate="$LAT_RATE" produced_rate="${achieved:-0}" \
            produced_share_pct="$share" rate_reached="$reached" \
            fetch_wait_ms="$LAT_FETCH_WAIT" \
            p50_ms="$p50" p99_ms="$p99" ack_p50_ms="${ack50:--}" ack_p99_ms="${ack99:--}" \
            fetch_p50_ms="$f50" fetch_p99_ms="$f99" member_p50_ms="$m50" member_p99_ms="$m99" \
            redis_p50_ms="$r50" redis_p99_ms="$r99" batch_p50="$b50" batch_p99="$b99" \
            cpu_us_member="$cm" cpu_us_broker="$cb" cpu_us_redis="$cr" cpu_us_produce="$cp" \
            cpu_busy_pct="$busy" verify=exact
        say "latency run $rep: at $LAT_RATE records/s (produce sent at ${achieved:-?}/s, $share%$note): p50 <= $p50 ms, p99 <= $p99 ms; stages p50/p99: CreateTime -> acknowledged ${ack50:-?}/${ack99:-?} ms, CreateTime -> poll $f50/$f99 ms, poll -> outcome $m50/$m99 ms (Redis round trip $r50/$r99 ms, batches of $b50/$b99 records); CPU us/record: member $cm, broker $cb, Redis $cr, produce $cp ($busy% of the CPUs)"
    done
    row_done latency "$T_ROW"
fi

if want produce; then
    T_ROW=$(now_us)
    # Three producers of the same keys and values, each to its own topic:
    # `produce` generating them; `produce --input` and `kcat -P` sending
    # the very same file, the first repetition's records read back with
    # kcat as KEY<TAB>VALUE lines (no poison here: its values may hold
    # newlines). Each is timed as a whole process; its CPU (this shell's
    # `times`) and the broker's (/proc) over the records give the CPU per
    # record. The order turns from one repetition to the next, so no
    # producer always runs first or last.
    # produce_one WHAT: runs producer WHAT, sets P_US, P_CPU_MS, P_BROKER_TICKS.
    produce_one() {
        local what=$1 t0 c0 c1 b0
        child_cpu_ms c0
        b0=$(cpu_ticks "${PID[broker]}")
        t0=$(now_us)
        case $what in
        gen)
            "$BIN" produce -b "$BOOT" -t p1m --count "$PRODUCE_COUNT" --duplicates 0 \
                --poison 0 --currencies EUR,USD,TRY --users 3000 --seed 11 \
                2>"$DIR/p1m-$rep.log" || die "produce of $PRODUCE_COUNT failed: $(tail -2 "$DIR/p1m-$rep.log")"
            ;;
        input)
            "$BIN" produce -b "$BOOT" -t p1mi --input "$DIR/p1m.lines" --key-delimiter '\t' \
                2>"$DIR/p1mi-$rep.log" || die "produce --input failed: $(tail -2 "$DIR/p1mi-$rep.log")"
            ;;
        bare)
            # The very records kcat -P sends: key and value, no headers.
            "$BIN" produce -b "$BOOT" -t p1mb --input "$DIR/p1m.lines" --key-delimiter '\t' \
                --no-envelope-headers 2>"$DIR/p1mb-$rep.log" ||
                die "produce --input --no-envelope-headers failed: $(tail -2 "$DIR/p1mb-$rep.log")"
            ;;
        kcat)
            kcat -P -b "$BOOT" -t p1mk -K '\t' -X enable.idempotence=true -X acks=all \
                -l "$DIR/p1m.lines" 2>"$DIR/kcatp-$rep.log" || die "kcat -P failed"
            ;;
        kcath)
            # kcat -P carrying two headers as produce does (the envelope's
            # message_id and idempotency_key), of the same lengths; kcat
            # can only send the same two on every record.
            kcat -P -b "$BOOT" -t p1mh -K '\t' -X enable.idempotence=true -X acks=all \
                -H message_id=51d3ab94-77c5-412e-8594-b8de4877ae6d \
                -H idempotency_key=payment-ORD-3FA014-00247379 \
                -l "$DIR/p1m.lines" 2>"$DIR/kcath-$rep.log" || die "kcat -P -H failed"
            ;;
        esac
        P_US=$(($(now_us) - t0))
        P_BROKER_TICKS=$(($(cpu_ticks "${PID[broker]}") - b0))
        child_cpu_ms c1
        P_CPU_MS=$((c1 - c0))
    }
    # per_rec MS_OR_US FACTOR: µs per produced record.
    per_rec() { awk -v v="$1" -v f="$2" -v n="$PRODUCE_COUNT" 'BEGIN { printf "%.2f", v * f / n }'; }
    ORDERS=("gen input bare kcat kcath" "kcath kcat bare input gen" "input kcath gen kcat bare")
    for ((rep = 1; rep <= REPS; rep++)); do
        declare -A RATE=() CPU=() BCPU=()
        for what in ${ORDERS[(rep - 1) % 3]}; do
            produce_one "$what"
            RATE[$what]=$((PRODUCE_COUNT * 1000000 / P_US))
            CPU[$what]=$(per_rec "$P_CPU_MS" 1000)
            BCPU[$what]=$(per_rec "$P_BROKER_TICKS" "$TICK_US")
            if [[ $what == gen && ! -s $DIR/p1m.lines ]]; then
                kcat -C -b "$BOOT" -t p1m -o beginning -e -q -f '%k\t%s\n' >"$DIR/p1m.lines"
                LINES=$(wc -l <"$DIR/p1m.lines")
                ((LINES == PRODUCE_COUNT)) || die "read back $LINES of $PRODUCE_COUNT records"
            fi
        done
        load=$(cut -d' ' -f1 /proc/loadavg)
        emit produce "$rep" rate="${RATE[gen]}" kcat_rate="${RATE[kcat]}" \
            cpu_us="${CPU[gen]}" broker_cpu_us="${BCPU[gen]}" \
            kcat_cpu_us="${CPU[kcat]}" kcat_broker_cpu_us="${BCPU[kcat]}" \
            kcath_rate="${RATE[kcath]}" kcath_cpu_us="${CPU[kcath]}" \
            kcath_broker_cpu_us="${BCPU[kcath]}" load="$load"
        emit produce_input "$rep" rate="${RATE[input]}" \
            cpu_us="${CPU[input]}" broker_cpu_us="${BCPU[input]}" \
            bare_rate="${RATE[bare]}" bare_cpu_us="${CPU[bare]}" \
            bare_broker_cpu_us="${BCPU[bare]}" load="$load"
        say "produce run $rep (${ORDERS[(rep - 1) % 3]}; load $load): produce ${RATE[gen]}/s, produce --input ${RATE[input]}/s, --no-envelope-headers ${RATE[bare]}/s, kcat -P ${RATE[kcat]}/s, kcat -P -H (two headers) ${RATE[kcath]}/s; CPU us/record producer ${CPU[gen]} / ${CPU[input]} / ${CPU[bare]} / ${CPU[kcat]} / ${CPU[kcath]}, broker ${BCPU[gen]} / ${BCPU[input]} / ${BCPU[bare]} / ${BCPU[kcat]} / ${BCPU[kcath]}"
    done
    rm -f "$DIR/p1m.lines"
    row_done produce "$T_ROW"
fi

if want webhook; then
    T_ROW=$(now_us)
    WCOUNT=${BENCH_WEBHOOK_COUNT:-50000}
    SINK=$(dirname "$BIN")/hooksink
    [[ -x $SINK ]] || die "$SINK missing (make build/hooksink)"
    spawn sink "$DIR/sink.out" "$DIR/sink.log" "$SINK" --delay-ms 5 --record
    wait_for 5 sink test -s "$DIR/sink.out" || true
    URL=$(head -n 1 "$DIR/sink.out")
    "$BIN" produce -b "$BOOT" -t hooks --count "$WCOUNT" --duplicates 0.1 \
        --poison 0 --seed 9 --expect "$DIR/hooks.expect.json" \
        2>"$DIR/hooks.produce.log"
    WSENT=$(expect_num "$DIR/hooks.expect.json" sent)
    WUNIQUE=$(expect_num "$DIR/hooks.expect.json" unique)
    free_port WPORT
    member_props "$DIR/hooks.properties" idemproc-bench-webhook hooks "redis.prefix=hooks:" \
        handler=webhook "webhook.url=$URL" ${BENCH_WEBHOOK_PROPS:-}
    MPIDS=()
    member hooks.member "$DIR/hooks.properties" "$WPORT"
    wait_members "$WSENT" "$WPORT" || { tail "$DIR/hooks.member.log" >&2; exit 1; }
    W=$((WSENT * 1000000 / (DONE_US - FIRST_US)))
    PROCESSED=$(metric "$WPORT" 'idemproc_records_total{outcome="processed"}')
    DUPS=$(metric "$WPORT" 'idemproc_records_total{outcome="duplicate"}')
    stop hooks.member TERM 60 || true
    stop sink TERM 10 || true
    ACKED=$(sed -n 's/.*, \([0-9]*\) answered 2xx.*/\1/p' "$DIR/sink.log")
    ((PROCESSED == WUNIQUE)) || die "webhook: processed $PROCESSED, expected $WUNIQUE"
    ((${ACKED:-0} >= WUNIQUE)) || die "webhook: the service acknowledged ${ACKED:-0} < $WUNIQUE"
    emit webhook 1 rate="$W" records="$WSENT" processed="$PROCESSED" \
        duplicates="$DUPS" acknowledged="${ACKED:-0}"
    say "webhook: $W records/s ($WSENT records, service answering in 5 ms)"
    row_done webhook "$T_ROW"
fi

if want script; then
    "$SRC/tests/bench_script.sh" "$BIN" >&2
fi

if want outbox; then
    T_ROW=$(now_us)
    "$SRC/tests/bench_outbox.sh" "$BIN" | tee "$DIR/outbox.out" >&2
    orate=$(sed -n 's/.*publish rate *\([0-9]*\) rows\/s.*/\1/p' "$DIR/outbox.out")
    # Two latency readings: at half the 50,000 rows/s goal and at half the
    # measured rate; p99 commit -> ack of each in ms (a bucket bound).
    olat_goal=$(sed -n 's/^bench: outbox relay  latency at half the goal: //p' "$DIR/outbox.out")
    olat_half=$(sed -n 's/^bench: outbox relay  latency at half the measured rate: //p' "$DIR/outbox.out")
    p99ms() { sed -n 's/.*commit -> ack p50 <= [^,]*, p99 <= \([0-9.]*\)s.*/\1/p' <<<"$1" | awk '{ print $1 * 1000 }'; }
    emit outbox 1 rate="${orate:-0}" latency_goal="${olat_goal:-}" latency_half="${olat_half:-}" \
        p99_ms_goal="$(p99ms "$olat_goal")" p99_ms_half="$(p99ms "$olat_half")"
    row_done outbox "$T_ROW"
fi

if want member; then
    T_ROW=$(now_us)
    # its own broker and Redis (AOF rows need a Redis of their own); its
    # figures land in member.json and results.json's "member"
    BENCH_OUT=$OUT "$SRC/tests/bench_member.sh" "$BIN" | tee "$DIR/member.out" >&2
    row_done member "$T_ROW"
fi

if want cluster; then
    T_ROW=$(now_us)
    # its own broker, Redis and cluster; its figures land in cluster.json
    BENCH_OUT=$OUT "$SRC/tests/bench_cluster.sh" "$BIN" | tee "$DIR/cluster.out" >&2
    row_done cluster "$T_ROW"
fi

# --- results.json, the table, the chart ------------------------------------
T_END=$(now_us)
jq -s --arg commit "$(git -C "$SRC" rev-parse --short HEAD 2>/dev/null || echo unknown)" \
    --arg date "$(date -u +%Y-%m-%dT%H:%M:%SZ)" --argjson cpus "$(nproc)" \
    --arg load_start "$LOAD_START" --arg load_end "$(cut -d' ' -f1 /proc/loadavg)" \
    --argjson seconds "$(((T_END - T_BENCH) / 1000000))" \
    --argjson sent "${SENT:-0}" --argjson unique "${UNIQUE:-0}" --argjson bytes "${BYTES:-0}" \
    --argjson partitions "$PARTITIONS" --argjson reps "$REPS" \
    --argjson produce_count "$PRODUCE_COUNT" \
    --argjson row_seconds "$(jq -Rn '[inputs | split(" ") | {key: .[0], value: (.[1] | tonumber)}]
        | from_entries' "$DIR/row_seconds")" '
    def stats: sort as $s | {min: $s[0], median: $s[($s | length - 1) / 2 | floor],
                             max: $s[-1], runs: .};
    def ratio($a; $b): if $a == null or $b == null or $b == 0 then null
                       else ($a / $b * 100 | round) / 100 end;
    (group_by(.row) | map(. as $reps | {key: $reps[0].row, value:
        ([$reps[] | keys_unsorted[]] | unique - ["row", "rep"]
         | map(. as $k | {key: $k, value: ([$reps[] | .[$k] | select(. != null)]
               | if all(type == "number") then stats else . end)})
         | from_entries)}) | from_entries) as $rows
    | {date: $date, commit: $commit,
       machine: {cpus: $cpus, load_start: $load_start, load_end: $load_end,
                 note: "broker, Redis, producers and members share these CPUs"},
       seconds: $seconds, row_seconds: $row_seconds,
       workload: {records: $sent, unique_payments: $unique, partitions: $partitions,
                  duplicates: 0.1, poison: 0.01, mean_value_bytes: $bytes,
                  produce_records: $produce_count,
                  repetitions: $reps},
       rows: $rows,
       ratios: {idemproc1_over_classic: ratio($rows.idemproc1.rate.median; $rows.classic.rate.median),
                idemproc2_over_classic: ratio($rows.idemproc2.rate.median; $rows.classic.rate.median),
                idemproc1_over_redis_alone: ratio($rows.idemproc1.rate.median; $rows.redis.rate.median),
                idemproc2_over_redis_alone: ratio($rows.idemproc2.rate.median; $rows.redis.rate.median),
                idemproc1_over_kcat: ratio($rows.idemproc1.rate.median; $rows.kcat.rate.median),
                produce_over_kcat_p: ratio($rows.produce.rate.median; $rows.produce.kcat_rate.median),
                produce_input_over_kcat_p: ratio($rows.produce_input.rate.median; $rows.produce.kcat_rate.median),
                produce_input_over_kcat_p_headers: ratio($rows.produce_input.rate.median; $rows.produce.kcath_rate.median),
                produce_input_bare_over_kcat_p: ratio($rows.produce_input.bare_rate.median; $rows.produce.kcat_rate.median)},
       goals: {over_classic: 100, over_redis_alone: 0.8, member_cpu_us: 2.5,
               redis_us: 2.5, bytes_per_mark: 40, rss_mib: 64, p99_ms: 20}}
    ' "$DIR/rows.jsonl" >"$OUT/results.json"
if want member && [[ -s $OUT/member.json ]]; then
    jq --slurpfile m "$OUT/member.json" '.member = $m[0]' "$OUT/results.json" >"$OUT/results.json.new"
    mv "$OUT/results.json.new" "$OUT/results.json"
fi
if want cluster && [[ -s $OUT/cluster.json ]]; then
    jq --slurpfile m "$OUT/cluster.json" '.cluster = $m[0]' "$OUT/results.json" >"$OUT/results.json.new"
    mv "$OUT/results.json.new" "$OUT/results.json"
fi

# The table: one line per row, min / median / max of records/s and the
# medians of the per-record figures ("-": not measured for this row).
jq -r '
    def n: if . == null then "-" else (round | tostring) as $s | ($s | length) as $l
        | [range(0; $l) | $s[.:. + 1] + (if . < $l - 1 and ($l - . - 1) % 3 == 0
                                           then "," else "" end)] | join("") end;
    def m($r; $k): $r[$k].median | if . == null then "-" else tostring end;
    def title: {kcat: "kcat read-only (fetch ceiling)",
                classic: "classic per-message (C, hiredis)",
                redis: "Redis alone (same chunks, 2 conns)",
                idemproc1: "idemproc, 1 member",
                idemproc2: "idemproc, 2 members",
                produce: "idemproc produce (vs kcat -P)",
                produce_input: "idemproc produce --input (same file)",
                webhook: "idemproc webhook (5 ms service)",
                outbox: "outbox relay (PostgreSQL)"}[.] // .;
    .rows as $rows
    | ["kcat", "classic", "redis", "idemproc1", "idemproc2", "produce", "produce_input", "webhook", "outbox"][]
    | select($rows[.] != null) as $k | $rows[$k] as $r
    | [($k | title), "\($r.rate.min | n) / \($r.rate.median | n) / \($r.rate.max | n)",
       m($r; "member_cpu_us"), m($r; "redis_us"), m($r; "redis_cpu_us"),
       m($r; "bytes_per_mark"), m($r; "rss_mib")] | @tsv' "$OUT/results.json" >"$DIR/table.tsv"
{
    printf '%-36s %-30s %8s %8s %8s %7s %7s\n' "row" "records/s min / median / max" \
        "member" "Redis" "Redis" "B per" "peak"
    printf '%-36s %-30s %8s %8s %8s %7s %7s\n' "" "" "us/rec" "us/rec" "CPU" "mark" "RSS MiB"
    while IFS=$'\t' read -r a b c d e f g; do
        printf '%-36s %-30s %8s %8s %8s %7s %7s\n' "$a" "$b" "$c" "$d" "$e" "$f" "$g"
    done <"$DIR/table.tsv"
    jq -r '
        def x: if . == null then "n/a" else "\(.)x" end;
        def stats3: if type == "object" then "\(.min) / \(.median) / \(.max)"
                    elif type == "array" then map(tostring) | join(" / ") else tostring end;
        .rows as $r |
        (if $r.produce then "kcat -P, the same \(.workload.produce_records) records: \($r.produce.kcat_rate.min) / \($r.produce.kcat_rate.median) / \($r.produce.kcat_rate.max) records/s (produce / kcat -P = \(.ratios.produce_over_kcat_p | x); produce --input / kcat -P = \(.ratios.produce_input_over_kcat_p | x), goal >= 0.8x)",
            "kcat -P -H with the two headers produce sends: \($r.produce.kcath_rate.min) / \($r.produce.kcath_rate.median) / \($r.produce.kcath_rate.max) records/s (produce --input / kcat -P -H = \(.ratios.produce_input_over_kcat_p_headers | x)); CPU us/record producer / broker \($r.produce.kcath_cpu_us.median) / \($r.produce.kcath_broker_cpu_us.median)",
            "produce --input --no-envelope-headers (the records kcat -P sends): \($r.produce_input.bare_rate.min) / \($r.produce_input.bare_rate.median) / \($r.produce_input.bare_rate.max) records/s (/ kcat -P = \(.ratios.produce_input_bare_over_kcat_p | x)); CPU us/record producer / broker \($r.produce_input.bare_cpu_us.median) / \($r.produce_input.bare_broker_cpu_us.median)",
            "  CPU us/record (median), producer / embedded broker: produce \($r.produce.cpu_us.median) / \($r.produce.broker_cpu_us.median), produce --input \($r.produce_input.cpu_us.median) / \($r.produce_input.broker_cpu_us.median), kcat -P \($r.produce.kcat_cpu_us.median) / \($r.produce.kcat_broker_cpu_us.median)" else empty end),
        (if $r.idemproc1 and $r.classic then "idemproc / classic: 1 member \(.ratios.idemproc1_over_classic | x), 2 members \(.ratios.idemproc2_over_classic | x) (goal >= 100x)" else empty end),
        (if $r.idemproc1 and $r.redis then "idemproc / Redis alone: 1 member \(.ratios.idemproc1_over_redis_alone | x), 2 members \(.ratios.idemproc2_over_redis_alone | x) (goal >= 0.8x)" else empty end),
        (if $r.latency.p99_ms then "latency produce -> effect at \($r.latency.target_rate.median) records/s (produce sent at \($r.latency.produced_rate.min)-\($r.latency.produced_rate.max)/s; rate reached: \($r.latency.rate_reached | join(" "))): p50 <= \($r.latency.p50_ms | stats3) ms, p99 <= \($r.latency.p99_ms | stats3) ms (bucket bounds; goal p99 <= 20 ms)",
            "  stages p99 (min / median / max): CreateTime -> produce acknowledged \($r.latency.ack_p99_ms | stats3) ms, CreateTime -> poll \($r.latency.fetch_p99_ms | stats3) ms, poll -> outcome \($r.latency.member_p99_ms | stats3) ms (member fetch.wait.max.ms=\($r.latency.fetch_wait_ms.median): the mock broker holds an empty fetch that long)",
            "  CPU us/record (median): member \($r.latency.cpu_us_member.median), Redis \($r.latency.cpu_us_redis.median), embedded broker \($r.latency.cpu_us_broker.median), produce \($r.latency.cpu_us_produce.median); all four \($r.latency.cpu_busy_pct.median)% of the CPUs" elif $r.latency then "latency: \($r.latency.note | if type == "array" then .[0] else . end)" else empty end),
        (if $r.outbox then "outbox latency at half the goal (issue 13: p99 <= 50 ms): \($r.outbox.latency_goal[0] // "-")" else empty end),
        (if $r.outbox then "outbox latency at half the measured rate: \($r.outbox.latency_half[0] // "-")" else empty end),
        "goals (medians): member <= 2.5 us/rec: \($r.idemproc1.member_cpu_us.median // "-"); Redis <= 2.5 us/rec: \($r.idemproc1.redis_us.median // "-"); <= 40 B/mark: \($r.idemproc1.bytes_per_mark.median // "-"); RSS <= 64 MiB: \($r.idemproc1.rss_mib.median // "-")",
        "\(.workload.records) records (\(.workload.unique_payments) applied), \(.workload.partitions) partitions, \(.workload.repetitions) repetitions, \(.seconds) s; \(.machine.cpus) CPUs shared by every process, load \(.machine.load_start) -> \(.machine.load_end); commit \(.commit)"
        ' "$OUT/results.json"
    [[ ! -s ${DIR}/member.out ]] || cat "$DIR/member.out"
} | tee "$OUT/table.txt" | sed 's/^/bench: /'

# The chart: records/s per row (median, min-max bars), log scale.
jq -r '.rows as $r | ["kcat", "classic", "redis", "idemproc1", "idemproc2", "produce", "produce_input", "webhook", "outbox"][]
    | select($r[.].rate != null) as $k
    | {kcat: "kcat -C", classic: "classic", redis: "Redis alone", idemproc1: "idemproc x1",
       idemproc2: "idemproc x2", produce: "produce", produce_input: "produce --input",
       webhook: "webhook", outbox: "outbox"}[$k] as $t
    | "\"\($t)\" \($r[$k].rate.median) \($r[$k].rate.min) \($r[$k].rate.max)",
      (if $k == "produce" then "\"kcat -P\" \($r[$k].kcat_rate.median) \($r[$k].kcat_rate.min) \($r[$k].kcat_rate.max)",
          "\"kcat -P -H\" \($r[$k].kcath_rate.median) \($r[$k].kcath_rate.min) \($r[$k].kcath_rate.max)" else empty end)' \
    "$OUT/results.json" >"$DIR/chart.dat"
if [[ -s $DIR/chart.dat ]]; then
    gnuplot <<GP || die "gnuplot failed"
set terminal pngcairo size 1000,560 font "sans,10"
set output "$OUT/records_per_s.png"
set title "make bench: records/s per row (median; bars: min-max of $REPS runs), $(nproc) shared CPUs"
set logscale y
set yrange [100:*]
set ylabel "records/s (log scale)"
set style fill solid 0.6 border -1
set boxwidth 0.6
set offsets 0.6, 0.6, 0, 0
set grid ytics
unset key
plot "$DIR/chart.dat" using 0:2:3:4:(0.3):xtic(1) with boxerrorbars lc rgb "#4477aa", \
     "" using 0:2:(sprintf("%d", \$2)) with labels offset 0,1 notitle
GP
fi
say "results: $OUT/results.json, $OUT/table.txt, $OUT/records_per_s.png"
# With no row named, the ordering bench too (its own broker and Redis).
[[ -n ${2:-} ]] || "$SRC/tests/bench_ordering.sh" "$BIN"
