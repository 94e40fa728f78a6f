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
DIR=$(mktemp -d "${TMPDIR:-/tmp}/idemproc-mcpu.XXXXXX")
PIDS=()
cleanup() {
    local rc=$? p
    set +e
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
    [[ -n ${MC_KEEP:-} ]] && echo "mcpu: kept $DIR" >&2 || rm -rf "$DIR"
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
    echo "mcpu: no free port" >&2
    exit 1
}
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
# cpu_ticks PID: utime + stime in clock ticks.
cpu_ticks() {
    local s
    s=$(<"/proc/$1/stat")
    s=${s##*) }
    read -r -a f <<<"$s"
    echo "$((f[11] + f[12]))"
}
hwm_kib() { awk '/^VmHWM/ { print $2 }' "/proc/$1/status"; }

"$BIN" broker --topic "payments:$PARTITIONS" --topic payments.dlq:4 \
    >"$DIR/broker.out" 2>"$DIR/broker.log" &
PIDS+=($!)
for _ in $(seq 100); do [[ -s $DIR/broker.out ]] && break; sleep 0.05; done
BOOT=$(head -n 1 "$DIR/broker.out")
RPORT=$(free_port)
redis-server --port "$RPORT" --bind 127.0.0.1 --dir "$DIR" --save '' \
    --appendonly no >"$DIR/redis.log" 2>&1 &
REDIS=$!
PIDS+=("$REDIS")
for _ in $(seq 100); do
    redis-cli -p "$RPORT" ping >/dev/null 2>&1 && break
    sleep 0.05
done
"$BIN" produce -b "$BOOT" -t payments --count "$COUNT" --duplicates 0.1 \
    --poison 0.01 --too-large-bytes 5000 --seed 7 --expect "$DIR/expect.json" \
    2>"$DIR/produce.log"
SENT=$(awk -F'[:,]' '/"sent"/ { gsub(/ /, "", $2); print $2 }' "$DIR/expect.json")

HZ=$(getconf CLK_TCK)
MPIDS=() HPORTS=()
for ((m = 1; m <= MEMBERS; m++)); do
    HPORT=$(free_port)
    HPORTS+=("$HPORT")
    {
        echo "kafka.bootstrap.servers=$BOOT"
        echo "group.id=idemproc-mcpu"
        echo "input.topics=payments"
        echo "dlq.topic=payments.dlq"
        echo "redis.url=redis://127.0.0.1:$RPORT/0"
        echo "message.max.bytes=4096"
        echo "kafka.fetch.wait.max.ms=10"
        echo "kafka.session.timeout.ms=6000"
        echo "http.listen=127.0.0.1:$HPORT"
        echo "log.level=warn"
        for kv in ${MC_PROPS:-}; do echo "$kv"; done
    } >"$DIR/m$m.properties"
done
# All members join before any record is handled: otherwise the first one
# takes everything while the others join.
redis-cli -p "$RPORT" config resetstat >/dev/null
R0=$(cpu_ticks "$REDIS")
for ((m = 1; m <= MEMBERS; m++)); do
    if [[ $m == 1 && -n ${MC_PERF:-} ]]; then
        perf record -g -o "$MC_PERF" -- "$BIN" run -c "$DIR/m$m.properties" \
            2>"$DIR/m$m.log" &
    else
        "$BIN" run -c "$DIR/m$m.properties" 2>"$DIR/m$m.log" &
    fi
    PIDS+=($!)
    MPIDS+=($!)
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
((done_at)) || { echo "mcpu: not finished ($n of $SENT)" >&2; exit 1; }
R1=$(cpu_ticks "$REDIS")
for ((m = 1; m <= MEMBERS; m++)); do
    pid=${MPIDS[m - 1]}
    c=$(cpu_ticks "$pid")
    h=$(metric_sum "${HPORTS[m - 1]}")
    printf 'mcpu: member %d: %d records, cpu %d.%02d s, %s us/record, peak RSS %d MiB\n' \
        "$m" "$h" "$((c / HZ))" "$((c % HZ * 100 / HZ))" \
        "$(awk -v c="$c" -v hz="$HZ" -v n="$h" 'BEGIN { printf "%.2f", c / hz * 1e6 / (n ? n : 1) }')" \
        "$(($(hwm_kib "$pid") / 1024))"
done
printf 'mcpu: %d records, %d partitions, %d member(s): %d records/s first to last; redis cpu %s us/record\n' \
    "$SENT" "$PARTITIONS" "$MEMBERS" "$((SENT * 1000000 / (done_at - first > 0 ? done_at - first : 1)))" \
    "$(awk -v c="$((R1 - R0))" -v hz="$HZ" -v n="$SENT" 'BEGIN { printf "%.2f", c / hz * 1e6 / n }')"
"$BIN" verify -c "$DIR/m1.properties" --expect "$DIR/expect.json" --dlq \
    >"$DIR/verify.out" || { cat "$DIR/verify.out" >&2; exit 1; }
sed 's/^/mcpu: /' "$DIR/verify.out"
for pid in "${MPIDS[@]}"; do kill -TERM "$pid"; done
if [[ -n ${MC_PERF:-} ]]; then wait "${PIDS[-$MEMBERS]}" || true; fi
