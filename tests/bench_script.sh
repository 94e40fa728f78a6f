#!/usr/bin/env bash
# bench_script.sh BIN [VARIANT...]: the script handler against the ledger,
# a row of `make bench` (issue 9: the script handler within 20% of the
# ledger's rate).
#
# One embedded broker and one private redis-server; BENCH_SCRIPT_COUNT
# payments (default 100,000) with 10% duplicates and no poison on 16
# partitions, produced once. Then one member per variant reads the whole
# topic (a group and a redis.prefix of its own), in turn, on the same
# broker and Redis:
#   ledger   handler=ledger
#   fields   handler=script, the ledger's effect in Lua on script.fields
#            (/user_id, /amount, /currency taken from the JSON the member
#            already parsed) with the aggregated counters: idem.hincrby of
#            the balance, idem.incrby of the count (summed per chunk, as
#            the ledger's own script does)
#   call     the same effect with plain redis.call: HINCRBY and INCR per
#            record
#   decode   the plain effect decoding rec.value with cjson
# (all four when none is named). Each must end exact (`verify` against the
# expectation; the Lua effects write the ledger's keys). Per variant: records
# per second from the first finished record to the last, and Redis's own
# time for the dedup scripts per record (INFO commandstats, evalsha usec /
# records). The verdict compares fields (the documented fast path) with the
# ledger. BENCH_SCRIPT_ROUNDS=N runs the variants N times (best rate kept).
# Needs bash >= 5, redis-server/redis-cli.
set -euo pipefail

BIN=${1:-build/idemproc}
COUNT=${BENCH_SCRIPT_COUNT:-100000}
ROUNDS=${BENCH_SCRIPT_ROUNDS:-1}
PARTITIONS=16
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
VARIANTS=("${@:2}")
((${#VARIANTS[@]})) || VARIANTS=(ledger fields call decode)
DIR=$(mktemp -d "${TMPDIR:-/tmp}/idemproc-bench-script.XXXXXX")
PIDS=()
cleanup() {
    local rc=$? p
    set +e
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
    [[ -n ${BENCH_KEEP:-} ]] && echo "bench-script: kept $DIR" >&2 || rm -rf "$DIR"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

now_us() { local t=${EPOCHREALTIME//[.,]/}; echo "$((10#$t))"; }
free_port() {
    local p
    for _ in $(seq 200); do
        p=$((20000 + RANDOM % 12000))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            echo "$p"
            return
        fi
    done
    echo "bench-script: no free port" >&2
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

"$BIN" broker --topic "payments:$PARTITIONS" --topic payments.dlq:1 \
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
RPID=${PIDS[-1]}
rcli() { redis-cli -p "$RPORT" "$@"; }
# cpu_us PID: CPU time (user + system) the process used so far, in us.
cpu_us() {
    local f
    read -r -a f <"/proc/$1/stat"
    # fields 14 and 15 (utime, stime) in clock ticks; the name (field 2)
    # has no spaces here
    echo $(((f[13] + f[14]) * 1000000 / $(getconf CLK_TCK)))
}

"$BIN" produce -b "$BOOT" -t payments --count "$COUNT" --duplicates 0.1 \
    --poison 0 --users 1000 --currencies EUR,USD,TRY --seed 11 \
    --expect "$DIR/expect.json" 2>"$DIR/produce.log"
SENT=$(awk -F'[:,]' '/"sent"/ { gsub(/ /, "", $2); print $2 }' "$DIR/expect.json")

# The ledger's effect in Lua, three ways; PREFIX is the variant's
# redis.prefix.
lua_fields() {
    cat <<LUA
local BAL, APPLIED = '$1ledger:', '$1ledger:applied'
function effect(rec)
  local f = rec.fields
  idem.hincrby(BAL .. f['/currency'], f['/user_id'],
    math.floor(f['/amount'] * 100 + 0.5))
  idem.incrby(APPLIED, 1)
end
LUA
}
lua_call() {
    cat <<LUA
local BAL, APPLIED = '$1ledger:', '$1ledger:applied'
function effect(rec)
  local f = rec.fields
  redis.call('HINCRBY', BAL .. f['/currency'], f['/user_id'],
    math.floor(f['/amount'] * 100 + 0.5))
  redis.call('INCR', APPLIED)
end
LUA
}
lua_decode() {
    cat <<LUA
local BAL, APPLIED = '$1ledger:', '$1ledger:applied'
function effect(rec)
  local ev = cjson.decode(rec.value)
  redis.call('HINCRBY', BAL .. ev.currency, ev.user_id,
    math.floor(ev.amount * 100 + 0.5))
  redis.call('INCR', APPLIED)
end
LUA
}

declare -A BEST REDIS_US
# run_variant NAME ROUND: one member with that variant over the whole topic.
run_variant() {
    local v=$1 round=$2 prefix="b$2$1:" hport props
    hport=$(free_port)
    props=$DIR/$v.$round.properties
    cat >"$props" <<PROPS
kafka.bootstrap.servers=$BOOT
group.id=bench-$v-$round
input.topics=payments
dlq.topic=payments.dlq
redis.url=redis://127.0.0.1:$RPORT/0
redis.prefix=$prefix
kafka.fetch.wait.max.ms=10
kafka.session.timeout.ms=6000
http.listen=127.0.0.1:$hport
log.level=warn
PROPS
    case $v in
    ledger) ;;
    fields | call)
        "lua_$v" "$prefix" >"$DIR/$v.$round.lua"
        printf 'handler=script\nscript.file=%s\nscript.fields=/user_id,/amount,/currency\n' \
            "$DIR/$v.$round.lua" >>"$props"
        ;;
    decode)
        lua_decode "$prefix" >"$DIR/$v.$round.lua"
        printf 'handler=script\nscript.file=%s\n' "$DIR/$v.$round.lua" >>"$props"
        ;;
    *) echo "bench-script: unknown variant $v" >&2; exit 2 ;;
    esac
    rcli config resetstat >/dev/null
    local rcpu0 rcpu1 mcpu
    rcpu0=$(cpu_us "$RPID")
    "$BIN" run -c "$props" 2>"$DIR/$v.$round.log" &
    local member=$! first=0 done_at=0 n t
    PIDS+=("$member")
    local deadline=$(($(now_us) + 300000000))
    while (($(now_us) < deadline)); do
        n=$(metric_sum "$hport")
        t=$(now_us)
        if ((n > 0 && first == 0)); then first=$t; fi
        if ((n >= SENT)); then done_at=$t; break; fi
        sleep 0.2
    done
    ((done_at)) || { echo "bench-script: $v did not finish ($n of $SENT)" >&2; tail "$DIR/$v.$round.log" >&2; exit 1; }
    rcli info commandstats | tr -d "\r" | grep -v "^#" >"$DIR/$v.$round.cmdstats"
    rcpu1=$(cpu_us "$RPID")
    mcpu=$(cpu_us "$member")
    local usec
    usec=$(rcli info commandstats | tr -d '\r' |
        sed -n 's/^cmdstat_evalsha:calls=[0-9]*,usec=\([0-9]*\),.*/\1/p')
    "$BIN" verify -c "$props" --expect "$DIR/expect.json" >"$DIR/$v.$round.verify" ||
        { echo "bench-script: $v not exact" >&2; cat "$DIR/$v.$round.verify" >&2; exit 1; }
    kill -TERM "$member"
    wait "$member" || true
    local r=$((SENT * 1000000 / (done_at - first)))
    local us10=$((${usec:-0} * 10 / SENT))
    local m10=$((mcpu * 10 / SENT)) r10=$(((rcpu1 - rcpu0) * 10 / SENT))
    printf 'bench-script: round %s %-7s %8s records/s  redis %s.%s us/record (evalsha); cpu us/record: member %s.%s, redis %s.%s\n' \
        "$round" "$v" "$r" "$((us10 / 10))" "$((us10 % 10))" \
        "$((m10 / 10))" "$((m10 % 10))" "$((r10 / 10))" "$((r10 % 10))"
    if ((r > ${BEST[$v]:-0})); then BEST[$v]=$r REDIS_US[$v]="$((us10 / 10)).$((us10 % 10))"; fi
}

printf 'bench-script: %s records (%s partitions, 10%% duplicates), one member per variant, in turn\n' \
    "$SENT" "$PARTITIONS"
for ((round = 1; round <= ROUNDS; round++)); do
    for v in "${VARIANTS[@]}"; do run_variant "$v" "$round"; done
done
for v in "${VARIANTS[@]}"; do
    printf 'bench-script: best    %-7s %8s records/s  redis %s us/record, exact\n' \
        "$v" "${BEST[$v]}" "${REDIS_US[$v]}"
done
if [[ -n ${BEST[ledger]:-} && -n ${BEST[fields]:-} ]]; then
    printf 'bench-script: script (fields) at %s%% of the ledger (bar: 80%%)\n' \
        "$((BEST[fields] * 100 / BEST[ledger]))"
fi
