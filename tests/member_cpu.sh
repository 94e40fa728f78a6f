#!/usr/bin/env bash
# member_cpu.sh BIN: a member's CPU time per record and peak RSS, for
# working on the processing loop's cost (make bench has the full table).
#
# One embedded broker (MC_PARTITIONS, 64), one private redis-server;
# MC_COUNT (300,000) payments plus 10% duplicates and 1% poison are produced
# first, then MC_MEMBERS (1) `idemproc run` members (ledger handler, default
# settings) read them all. Prints, per member, its CPU time (utime + stime
# from /proc, start-up included) divided by the records it handled, its
# peak RSS (VmHWM), the rate from the first record handled to the last of
# all members, and Redis's CPU time per record; verify must say exact.
# MC_PERF=FILE records the (first) member with `perf record -g` into FILE.
# MC_PROPS="k=v ..." adds properties to the members' configuration.
set -euo pipefail

BIN=${1:-build/idemproc}
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
COUNT=${MC_COUNT:-300000}
PARTITIONS=${MC_PARTITIONS:-64}
MEMBERS=${MC_MEMBERS:-1}
LIB_NAME=mcpu LIB_KEEP=${MC_KEEP:-}
. "$(dirname "$0")/lib.sh"
lib_init mcpu

broker_start --topic "payments:$PARTITIONS" --topic payments.dlq:4
redis_start
"$BIN" produce -b "$BOOT" -t payments --count "$COUNT" --duplicates 0.1 \
    --poison 0.01 --too-large-bytes 5000 --seed 7 --expect "$DIR/expect.json" \
    2>"$DIR/produce.log"
SENT=$(expect_num "$DIR/expect.json" sent)

HZ=$(getconf CLK_TCK)
MPIDS=() HPORTS=()
for ((m = 1; m <= MEMBERS; m++)); do
    free_port HPORT
    HPORTS+=("$HPORT")
    # shellcheck disable=SC2086 # MC_PROPS: k=v words
    member_props "$DIR/m$m.properties" idemproc-mcpu payments \
        "http.listen=127.0.0.1:$HPORT" ${MC_PROPS:-}
done
# All members join before any record is handled: otherwise the first one
# takes everything while the others join.
redis-cli -p "$REDIS_PORT" config resetstat >/dev/null
R0=$(cpu_ticks "${PID[redis]}")
for ((m = 1; m <= MEMBERS; m++)); do
    if [[ $m == 1 && -n ${MC_PERF:-} ]]; then
        spawn "m$m" /dev/null "$DIR/m$m.log" \
            perf record -g -o "$MC_PERF" -- "$BIN" run -c "$DIR/m$m.properties"
    else
        spawn "m$m" /dev/null "$DIR/m$m.log" "$BIN" run -c "$DIR/m$m.properties"
    fi
    MPIDS+=("${PID[m$m]}")
done
sleep 0.5
# With perf, the member is perf's child.
if [[ -n ${MC_PERF:-} ]]; then
    MPIDS[0]=$(pgrep -P "${MPIDS[0]}" | head -n 1)
fi
first=0 done_at=0
deadline=$(($(now_us) + 180000000))
while (($(now_us) < deadline)); do
    n=0
    for h in "${HPORTS[@]}"; do n=$((n + $(metric_sum "$h"))); done
    t=$(now_us)
    if ((n > 0 && first == 0)); then first=$t; fi
    if ((n >= SENT)); then done_at=$t; break; fi
    sleep 0.2
done
((done_at)) || die "not finished ($n of $SENT)"
R1=$(cpu_ticks "${PID[redis]}")
for ((m = 1; m <= MEMBERS; m++)); do
    pid=${MPIDS[m - 1]}
    c=$(cpu_ticks "$pid")
    h=$(metric_sum "${HPORTS[m - 1]}")
    printf 'mcpu: member %d: %d records, cpu %d.%02d s, %s us/record, peak RSS %d MiB\n' \
        "$m" "$h" "$((c / HZ))" "$((c % HZ * 100 / HZ))" \
        "$(awk -v c="$c" -v hz="$HZ" -v n="$h" 'BEGIN { printf "%.2f", c / hz * 1e6 / (n ? n : 1) }')" \
        "$(($(vm_hwm_kb "$pid") / 1024))"
done
printf 'mcpu: %d records, %d partitions, %d member(s): %d records/s first to last; redis cpu %s us/record\n' \
    "$SENT" "$PARTITIONS" "$MEMBERS" "$((SENT * 1000000 / (done_at - first > 0 ? done_at - first : 1)))" \
    "$(awk -v c="$((R1 - R0))" -v hz="$HZ" -v n="$SENT" 'BEGIN { printf "%.2f", c / hz * 1e6 / n }')"
"$BIN" verify -c "$DIR/m1.properties" --expect "$DIR/expect.json" --dlq \
    >"$DIR/verify.out" || { cat "$DIR/verify.out" >&2; exit 1; }
sed 's/^/mcpu: /' "$DIR/verify.out"
for pid in "${MPIDS[@]}"; do kill -TERM "$pid"; done
if [[ -n ${MC_PERF:-} ]]; then wait "${PID[m1]}" || true; fi
