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
LIB_NAME=bench-script LIB_KEEP=${BENCH_KEEP:-} LIB_GRACE=30
. "$(dirname "$0")/lib.sh"
lib_init bench-script
TICK_US=$((1000000 / $(getconf CLK_TCK)))
broker_start --topic "payments:$PARTITIONS" --topic payments.dlq:1
redis_start

"$BIN" produce -b "$BOOT" -t payments --count "$COUNT" --duplicates 0.1 \
    --poison 0 --users 1000 --currencies EUR,USD,TRY --seed 11 \
    --expect "$DIR/expect.json" 2>"$DIR/produce.log"
SENT=$(expect_num "$DIR/expect.json" sent)

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
    free_port hport
    props=$DIR/$v.$round.properties
    member_props "$props" "bench-$v-$round" payments "redis.prefix=$prefix" \
        "http.listen=127.0.0.1:$hport"
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
    *) say "unknown variant $v" >&2; exit 2 ;;
    esac
    rcli config resetstat >/dev/null
    local rcpu0 rcpu1 mcpu
    rcpu0=$(cpu_ticks "${PID[redis]}")
    spawn "$v.$round" "$DIR/$v.$round.log" "$DIR/$v.$round.log" "$BIN" run -c "$props"
    local first=0 done_at=0 n t
    local deadline=$(($(now_us) + 300000000))
    while (($(now_us) < deadline)); do
        n=$(metric_sum "$hport")
        t=$(now_us)
        if ((n > 0 && first == 0)); then first=$t; fi
        if ((n >= SENT)); then done_at=$t; break; fi
        sleep 0.2
    done
    ((done_at)) || { tail "$DIR/$v.$round.log" >&2; die "$v did not finish ($n of $SENT)"; }
    rcli info commandstats | tr -d "\r" | grep -v "^#" >"$DIR/$v.$round.cmdstats"
    rcpu1=$(cpu_ticks "${PID[redis]}")
    mcpu=$(($(cpu_ticks "${PID[$v.$round]}") * TICK_US))
    local usec
    usec=$(rcli info commandstats | tr -d '\r' |
        sed -n 's/^cmdstat_evalsha:calls=[0-9]*,usec=\([0-9]*\),.*/\1/p')
    "$BIN" verify -c "$props" --expect "$DIR/expect.json" >"$DIR/$v.$round.verify" ||
        { cat "$DIR/$v.$round.verify" >&2; die "$v not exact"; }
    stop "$v.$round" TERM 60 || true
    local r=$((SENT * 1000000 / (done_at - first)))
    local us10=$((${usec:-0} * 10 / SENT))
    local m10=$((mcpu * 10 / SENT)) r10=$(((rcpu1 - rcpu0) * TICK_US * 10 / SENT))
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
