#!/usr/bin/env bash
# bench_cluster.sh BIN: the `cluster` row of `make bench` (issue 25; docs/
# design.md, "Redis Cluster mode"): two members (dedup.scope=partition,
# handler=ledger) on a 3-primary Redis Cluster against the same two on one
# Redis, in the same run. Alone: make bench BENCH_ONLY=cluster.
#
# Its own embedded broker, one redis-server and three cluster-enabled
# redis-servers joined by redis-cli --cluster create (no replicas: the
# row measures the primaries' work; no persistence on any). Workload as
# the member rows: BENCH_CLUSTER_COUNT (200,000) payments plus 10%
# duplicates and 1% poison on 64 partitions, produced to a topic of the
# run's own once both members hold their partitions. BENCH_REPS (3)
# repetitions, interleaved, of each row (BENCH_CLUSTER_ROWS, all three by
# default):
#
#   one            two members of one group on the single Redis
#   cluster        two members of one group with redis.cluster.nodes
#   cluster_lp128  the same with the nodes' hash-max-listpack-entries at
#                  128 for the run (CONFIG SET, put back after it; the
#                  server's default here is 512): the ledger's balances are
#                  sharded per partition, so each hash holds a 64th of the
#                  users and spends far longer in the listpack encoding,
#                  where HINCRBY scans the hash (docs/design.md, "Redis
#                  Cluster mode")
#
# Every run has its own group on emptied Redis servers and must be exact
# (`idemproc verify --dlq`, which sums the cluster's shards), else the
# bench fails. Per run: records/s (first outcome to last, polled every
# 0.1 s), Redis CPU per node (utime + stime from /proc/<pid>/stat of each
# redis-server, in µs per record handled by the group) and their sum. On 2
# shared cores the members and the three nodes compete for the CPU, so
# throughput cannot show the scaling; the per-node work can. The paper
# estimate: one core per primary spends the summed µs per record on the
# records of its own partitions, so a primary carries about
# 1,000,000 / (summed µs per record) records/s and N primaries N times
# that (while partitions spread evenly over them). Prints min / median /
# max and writes BENCH_OUT/cluster.json. Needs bash >= 5, redis-server,
# redis-cli, jq.
set -euo pipefail

BIN=${1:-build/idemproc}
SRC=$(cd "$(dirname "$0")/.." && pwd)
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
TOOLS=$(dirname "$BIN")/bench
OUT=${BENCH_OUT:-$TOOLS}
REPS=${BENCH_REPS:-3}
read -r -a ROWS <<<"${BENCH_CLUSTER_ROWS:-one cluster cluster_lp128}"
COUNT=${BENCH_CLUSTER_COUNT:-200000}
PARTITIONS=64
NODES=3
LIB_NAME=bench-cluster LIB_SAY_FD=2 LIB_KEEP=${BENCH_KEEP:-} LIB_GRACE=30
. "$SRC/tests/lib.sh"
mkdir -p "$OUT"
lib_init bench-cluster
TICK_US=$((1000000 / $(getconf CLK_TCK)))
# The machine's load when the row starts and ends (1-minute average): on
# shared cores the rates depend on it, so the output says it.
LOAD_START=$(cut -d' ' -f1 /proc/loadavg)

# One topic per run, produced once both members hold their partitions
# (the group's first rebalance is not timed).
TOPICS=()
for ((rep = 1; rep <= REPS; rep++)); do
    for row in "${ROWS[@]}"; do
        TOPICS+=(--topic "pay-$row-$rep:$PARTITIONS" --topic "pay-$row-$rep.dlq:4")
    done
done
broker_start "${TOPICS[@]}"
SENT=0 UNIQUE=0
# produce TOPIC: the workload into TOPIC in the background (PID[produce]);
# produced TOPIC: once it ended, SENT and UNIQUE from its expect file.
produce() {
    spawn produce "$DIR/$1.produce.log" "$DIR/$1.produce.log" "$BIN" produce -b "$BOOT" \
        -t "$1" --count "$COUNT" --duplicates 0.1 --poison 0.01 --too-large-bytes 5000 \
        --currencies EUR,USD,TRY --users 3000 --seed 7 --expect "$DIR/$1.expect.json"
}
produced() {
    [[ -n ${PID[produce]:-} ]] || return 0
    alive "${PID[produce]}" && return 1
    stop produce - 5 || die "produce failed: $(tail -3 "$DIR/$1.produce.log")"
    SENT=$(expect_num "$DIR/$1.expect.json" sent)
    UNIQUE=$(expect_num "$DIR/$1.expect.json" unique)
}

redis_start
# The cluster's nodes: a free port whose bus port (+10000) is free too.
NPORT=() NPID=() SEEDS=""
for ((i = 0; i < NODES; i++)); do
    for ((try = 0; try < 20; try++)); do
        free_port np
        port_free $((np + 10000)) && break
    done
    mkdir -p "$DIR/node$i"
    spawn "node$i" "$DIR/node$i.log" "$DIR/node$i.log" redis-server --bind 127.0.0.1 \
        --port "$np" --dir "$DIR/node$i" --save "" --appendonly no --daemonize no \
        --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 5000
    NPORT+=("$np") NPID+=("${PID[node$i]}")
    SEEDS+="${SEEDS:+,}127.0.0.1:$np"
    node_pong() { [[ $(redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null) == PONG ]]; }
    wait_for 10 "node$i" node_pong "$np" || die "cluster node $i did not start"
done
redis-cli --cluster create $(printf '127.0.0.1:%s ' "${NPORT[@]}") --cluster-replicas 0 \
    --cluster-yes >"$DIR/create.log" 2>&1 || { tail -5 "$DIR/create.log" >&2; die "redis-cli --cluster create failed"; }
cluster_ok() {
    local p
    for p in "${NPORT[@]}"; do
        redis-cli -h 127.0.0.1 -p "$p" cluster info | grep -q '^cluster_state:ok' || return 1
    done
}
wait_for 30 - cluster_ok || die "the cluster did not reach cluster_state:ok"
say "cluster: $NODES primaries on ${NPORT[*]}"

# Where a row's Redis time goes: INFO commandstats of the servers the row
# uses (the single Redis, or the three nodes), reset when the first record
# is seen and read when the last is done. stats_read ROW SENT prints, per
# command, cmd_<name>_calls (calls per 1,000 records) and cmd_<name>_us
# (µs of the command's own time per record), summed over the servers;
# EVALSHA's time includes the commands its script calls (also counted
# under their own names). Redis CPU outside any command (reading and
# parsing requests, writing replies, the event loop, cluster bus) is the
# CPU figure less EVALSHA and the other top-level commands.
stats_ports() { if [[ $1 == cluster* ]]; then echo "${NPORT[@]}"; else echo "$REDIS_PORT"; fi; }
stats_reset() {
    local p
    for p in "$REDIS_PORT" "${NPORT[@]}"; do redis-cli -h 127.0.0.1 -p "$p" config resetstat >/dev/null; done
}
stats_read() {
    local p
    for p in $(stats_ports "$1"); do redis-cli -h 127.0.0.1 -p "$p" info commandstats; done |
        awk -F'[:,=]' -v n="$2" '/^cmdstat_/ { c = substr($1, 9); gsub(/[^a-z_]/, "_", c)
                calls[c] += $3; usec[c] += $5 }
            END { for (c in calls) printf "cmd_%s_calls=%.2f cmd_%s_us=%.3f ", c, n ? calls[c] * 1000 / n : 0, c, n ? usec[c] / n : 0 }'
}

# ledger_kib ROW: MEMORY USAGE of the ledger's keys on the row's servers,
# KiB (what the listpack setting trades against CPU).
ledger_kib() {
    local p k sum=0
    for p in $(stats_ports "$1"); do
        while IFS= read -r k; do
            sum=$((sum + $(redis-cli -h 127.0.0.1 -p "$p" memory usage "$k")))
        done < <(redis-cli -h 127.0.0.1 -p "$p" --scan --pattern '*ledger:*')
    done
    echo $((sum / 1024))
}

per() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b ? a / b : 0 }'; }
: >"$DIR/rows.jsonl"
emit() {
    local row=$1 rep=$2 kv k v json
    shift 2
    json="{\"row\":\"$row\",\"rep\":$rep"
    for kv in "$@"; do
        k=${kv%%=*} v=${kv#*=}
        json+=",\"$k\":$v"
    done
    echo "$json}" >>"$DIR/rows.jsonl"
}

# run ROW REP: two members of a new group process the whole topic; emits
# the run's figures; dies unless verify says exact.
run() {
    local row=$1 rep=$2 i name pids=() ports=() names=()
    local conf=$DIR/$row-$rep.properties
    local extra=(dedup.scope=partition handler=ledger)
    [[ $row == cluster* ]] && extra+=("redis.cluster.nodes=$SEEDS")
    local topic=pay-$row-$rep
    member_props "$conf" "cluster-bench-$row-$rep" "$topic" "${extra[@]}"
    rcli flushall >/dev/null
    local p
    for p in "${NPORT[@]}"; do
        redis-cli -h 127.0.0.1 -p "$p" flushall >/dev/null
        redis-cli -h 127.0.0.1 -p "$p" config set hash-max-listpack-entries \
            "$([[ $row == cluster_lp128 ]] && echo 128 || echo "$LISTPACK")" >/dev/null
    done
    local r0 n0=()
    r0=$(cpu_ticks "$RPID")
    for i in "${!NPID[@]}"; do n0[i]=$(cpu_ticks "${NPID[i]}"); done
    stats_reset
    for ((i = 0; i < 2; i++)); do
        name=$row-$rep-$i
        free_port "ports[$i]"
        spawn "$name" "$DIR/$name.log" "$DIR/$name.log" "$BIN" run -c "$conf" \
            --set "http.listen=127.0.0.1:${ports[i]}" --set "member.id=$name"
        names+=("$name") pids+=("${PID[$name]}")
    done
    local held a b
    held() {
        a=$(metric "${ports[0]}" idemproc_assigned_partitions)
        b=$(metric "${ports[1]}" idemproc_assigned_partitions)
        ((a > 0 && b > 0 && a + b == PARTITIONS))
    }
    wait_for 60 "${names[0]}" held || die "$row run $rep: the members never shared the partitions"
    SENT=0
    produce "$topic"
    local deadline=$(($(now_us) + 240000000)) first=0 done_us=0 prev t k
    prev=$(now_us)
    while :; do
        k=0
        for i in "${!ports[@]}"; do k=$((k + $(metric_sum "${ports[i]}"))); done
        t=$(now_us)
        if ((k == 0)); then
            r0=$(cpu_ticks "$RPID")
            for i in "${!NPID[@]}"; do n0[i]=$(cpu_ticks "${NPID[i]}"); done
            stats_reset
        elif ((first == 0)); then
            first=$(((prev + t) / 2))
        fi
        produced "$topic" && ((SENT > 0 && k >= SENT)) && { done_us=$(((prev + t) / 2)); break; }
        ((t < deadline)) || { tail -5 "$DIR/${names[0]}.log" >&2; die "$row run $rep: $k of $SENT records"; }
        for name in "${names[@]}"; do
            alive "${PID[$name]}" || { tail -5 "$DIR/$name.log" >&2; die "$name exited"; }
        done
        prev=$t
        sleep 0.1
    done
    local r1 n1=() sum=0 nodes=() us_node
    r1=$(cpu_ticks "$RPID")
    for i in "${!NPID[@]}"; do n1[i]=$(cpu_ticks "${NPID[i]}"); done
    local cmds kib
    cmds=$(stats_read "$row" "$SENT")
    kib=$(ledger_kib "$row")
    for name in "${names[@]}"; do kill -TERM "${PID[$name]}"; done
    for name in "${names[@]}"; do stop "$name" - 60 || die "$name exited with $? on SIGTERM"; done
    "$BIN" verify -c "$conf" --expect "$DIR/$topic.expect.json" --dlq >"$DIR/$row-$rep.verify" 2>&1 &&
        grep -q 'ledger exact' "$DIR/$row-$rep.verify" ||
        { cat "$DIR/$row-$rep.verify" >&2; die "$row run $rep: verify is not exact"; }
    local us=$((done_us - first)) one_us
    one_us=$(per $(((r1 - r0) * TICK_US)) "$SENT")
    if [[ $row == cluster* ]]; then
        for i in "${!NPID[@]}"; do
            us_node=$(per $(((n1[i] - n0[i]) * TICK_US)) "$SENT")
            nodes+=("node${i}_cpu_us=$us_node")
            sum=$((sum + n1[i] - n0[i]))
        done
        emit "$row" "$rep" rate=$((SENT * 1000000 / us)) "${nodes[@]}" \
            redis_cpu_us="$(per $((sum * TICK_US)) "$SENT")" single_redis_cpu_us="$one_us" ledger_kib="$kib" $cmds
    else
        emit one "$rep" rate=$((SENT * 1000000 / us)) redis_cpu_us="$one_us" ledger_kib="$kib" $cmds
    fi
    say "$row run $rep: $((SENT * 1000000 / us)) records/s, verify exact"
}

RPID=${PID[redis]}
LISTPACK=$(redis-cli -h 127.0.0.1 -p "${NPORT[0]}" config get hash-max-listpack-entries | tail -1)
for ((rep = 1; rep <= REPS; rep++)); do
    for row in "${ROWS[@]}"; do run "$row" "$rep"; done
done

# The chunk script alone (build/bench/chunkcost_bench, on the single Redis,
# emptied): the same chunks in one Redis's call shape and in a cluster
# primary's, interleaved, BENCH_REPS each; its lines go to chunkcost.txt.
# Variants: name, then chunkcost_bench's arguments, then the server's
# hash-max-listpack-entries for it ("-": the default).
CHUNK_VARIANTS=(
    "one, 15 a partition (960 a call)|--shape one --per-chunk 15|-"
    "cluster, 15 a call|--shape cluster --per-chunk 15|-"
    "cluster, 120 a call|--shape cluster --per-chunk 120|-"
    "cluster, 120 a call, no EXISTS|--shape cluster --per-chunk 120 --no-exists|-"
    "cluster, 120 a call, listpack 128|--shape cluster --per-chunk 120|128"
    "one, listpack 128|--shape one --per-chunk 15|128"
)
: >"$DIR/chunkcost.txt"
if [[ -x $TOOLS/chunkcost_bench ]]; then
    for ((rep = 1; rep <= REPS; rep++)); do
        for v in "${CHUNK_VARIANTS[@]}"; do
            IFS='|' read -r vname vargs vlp <<<"$v"
            rcli config set hash-max-listpack-entries "$([[ $vlp == - ]] && echo "$LISTPACK" || echo "$vlp")" >/dev/null
            line=$("$TOOLS/chunkcost_bench" --port "$REDIS_PORT" --records "$COUNT" $vargs) ||
                die "chunkcost_bench $vargs failed"
            echo "$vname|$line" >>"$DIR/chunkcost.txt"
        done
    done
    rcli config set hash-max-listpack-entries "$LISTPACK" >/dev/null
fi

LOAD_END=$(cut -d' ' -f1 /proc/loadavg)
jq -s --argjson sent "$SENT" --argjson unique "$UNIQUE" --argjson reps "$REPS" --argjson nodes "$NODES" \
    --argjson load_start "$LOAD_START" --argjson load_end "$LOAD_END" --argjson listpack "$LISTPACK" \
    --rawfile chunk "$DIR/chunkcost.txt" '
    def stats: sort as $s | {min: $s[0], median: $s[($s | length - 1) / 2 | floor], max: $s[-1]};
    def ratio(a; b): if b then ((a / b * 100 | round) / 100) else null end;
    (group_by(.row) | map(. as $g | {key: $g[0].row, value:
        ([$g[] | keys_unsorted[]] | unique - ["row", "rep"]
         | map(. as $k | {key: $k, value: ([$g[] | .[$k] | select(. != null)] | stats)})
         | from_entries)}) | from_entries) as $rows
    | ($chunk | split("\n") | map(select(length > 0) | index("|") as $i | {variant: .[:$i], f: (.[$i + 1:] | split(" "))}
        | {variant, cpu: (.f[(.f | index("cpu_us_per_record")) + 1] | tonumber),
           script: (.f[(.f | index("script_us_per_record")) + 1] | tonumber),
           per_call: (.f[(.f | index("records_per_call")) + 1] | tonumber),
           hincrby: ([.f[] | select(startswith("hincrby=")) | split("/")[1] | tonumber] | first // 0)})
        | group_by(.variant) | map({variant: .[0].variant, records_per_call: .[0].per_call,
            cpu_us: ([.[].cpu] | stats), hincrby_us: ([.[].hincrby] | stats), script_us: ([.[].script] | stats)})) as $chunks
    | {workload: {records: $sent, unique: $unique, partitions: 64, duplicates: 0.1,
                  poison: 0.01, repetitions: $reps, members: 2, primaries: $nodes,
                  hash_max_listpack_entries: $listpack},
       load_average: {start: $load_start, end: $load_end},
       rows: $rows,
       chunk_script: $chunks,
       estimate: ({one_redis_records_per_s: (1000000 / $rows.one.redis_cpu_us.median | floor)} +
           ([$rows | to_entries[] | select(.key | startswith("cluster")) | .key as $k | .value as $v |
             {key: $k, value: {
               per_primary_records_per_s: (1000000 / $v.redis_cpu_us.median | floor),
               cluster_records_per_s: ($nodes * 1000000 / $v.redis_cpu_us.median | floor),
               cpu_over_one: ratio($v.redis_cpu_us.median; $rows.one.redis_cpu_us.median),
               rate_over_one: ratio($v.rate.median; $rows.one.rate.median)}}] | from_entries))}' \
    "$DIR/rows.jsonl" >"$OUT/cluster.json"

echo "cluster rows ($SENT records, $UNIQUE applied, $PARTITIONS partitions, two members; min / median / max of $REPS; every run verified exact; the servers' hash-max-listpack-entries $LISTPACK unless the row says; load average $LOAD_START at the start, $LOAD_END at the end)"
jq -r '
    def s: "\(.min) / \(.median) / \(.max)";
    .rows | to_entries[] | .key as $k | .value as $v |
        "\($k): \($v.rate | s) records/s; Redis CPU µs per record: \($v.redis_cpu_us | s)" +
        (if ($k | startswith("cluster")) then " summed over the nodes (" +
            ([$v | to_entries[] | select(.key | test("^node")) | "\(.key | sub("_cpu_us"; "")) \(.value.median)"] | join(", ")) +
            "; the single Redis meanwhile \($v.single_redis_cpu_us.median))" else "" end) +
        "; ledger keys \($v.ledger_kib.median) KiB"' "$OUT/cluster.json"
jq -r '.estimate | "paper estimate (one core per Redis): one Redis \(.one_redis_records_per_s) records/s" +
    ([to_entries[] | select(.value | type == "object") |
      "; \(.key): a primary \(.value.per_primary_records_per_s) records/s, \(.value.cluster_records_per_s) for the 3 primaries, CPU per record \(.value.cpu_over_one)x one Redis, measured records/s \(.value.rate_over_one)x (2 shared cores)"] | join(""))' "$OUT/cluster.json"
echo "where the Redis time goes (medians of INFO commandstats summed over each row's servers: calls per 1,000 records / µs per record; command times are wall clock, so on shared cores they include time the server waited for a core; EVALSHA includes the commands its script calls)"
jq -r '
    .rows as $r | ($r | keys) as $rows
    | ([$r[]] | map(keys) | add | unique | map(select(test("^cmd_.*_us$")) | sub("^cmd_"; "") | sub("_us$"; ""))) as $cmds
    | (["command"] + $rows),
      ($cmds[] as $c | [$c] + [$rows[] as $k | "\($r[$k]["cmd_\($c)_calls"].median // 0) / \($r[$k]["cmd_\($c)_us"].median // 0)"]
                     | select(any(.[1:][]; test(" / 0(\\.00[0-4])?$") | not))),
      (["Redis CPU µs/record"] + [$rows[] as $k | "\($r[$k].redis_cpu_us.median)"])
    | @tsv' "$OUT/cluster.json" | column -t -s $'\t'
if [[ -s $DIR/chunkcost.txt ]]; then
    echo "the chunk script alone on one server (chunkcost_bench, $COUNT records, 64 partitions, 3000 users; medians of $REPS; µs per record)"
    jq -r '(["variant", "records a call", "Redis CPU", "HINCRBY", "script (Lua)"]),
        (.chunk_script[] | [.variant, .records_per_call, .cpu_us.median, .hincrby_us.median, .script_us.median]) | @tsv' \
        "$OUT/cluster.json" | column -t -s $'\t'
fi
