#!/usr/bin/env bash
# bench_outbox.sh BIN: the outbox relay's speed, a row of `make bench`
# (alone: make bench BENCH_ONLY=outbox).
#
# A private PostgreSQL (initdb in a temp dir, default durability: fsync on)
# and the embedded broker. Throughput: BENCH_OUTBOX_ROWS rows of ~250 bytes
# are committed first, then one `idemproc outbox` relay publishes them all;
# rows/s from its first published row to its last. Latency, two phases of
# BENCH_OUTBOX_SECONDS each while the relay sleeps on LISTEN/NOTIFY:
# pgbench commits transactions of 50 rows at half the goal
# (BENCH_OUTBOX_GOAL_RATE, 50,000 rows/s: issue 13's reading), then at
# half the measured rate. The relay's histograms give the p50/p99 bucket
# bounds: idemproc_outbox_commit_latency_seconds (the inserting
# transaction's commit -> broker acknowledgement; the server runs with
# track_commit_timestamp=on) and idemproc_outbox_publish_latency_seconds
# (row insert -> acknowledgement, which adds pgbench's own commit, an
# fsync). Each phase's line also says the rate pgbench reached and how far
# it fell behind its own schedule (on a loaded machine pgbench, not the
# relay, is often what cannot keep up). CPU microseconds a row of the
# relay, its PostgreSQL session and the broker (/proc/PID/stat) for the
# backlog and each phase. BENCH_OUTBOX_EXTRA adds relay properties
# (outbox.after=delete). Needs bash >= 5, PostgreSQL server binaries, psql
# and pgbench.
set -euo pipefail

BIN=${1:-build/idemproc}
ROWS=${BENCH_OUTBOX_ROWS:-200000}
SECONDS_LAT=${BENCH_OUTBOX_SECONDS:-10}
BATCH=${BENCH_OUTBOX_BATCH:-5000}
PARTITIONS=32 # the mock keeps ~5 MiB per partition: 200k x ~400 B
SRC=$(cd "$(dirname "$0")/.." && pwd)
LIB_NAME=bench-outbox LIB_KEEP=${BENCH_KEEP:-}
. "$(dirname "$0")/lib.sh"
pg_require

BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
lib_init bench-outbox
# buckets PORT [HIST]: "le count" lines of a latency histogram
# (cumulative); HIST publish (insert -> ack, default) or commit.
buckets() {
    metrics "$1" | sed -n "s/^idemproc_outbox_${2:-publish}_latency_seconds_bucket{le=\"\([^\"]*\)\"} \(.*\)/\1 \2/p"
}

pg_start -c shared_buffers=128MB -c max_wal_size=2GB -c track_commit_timestamp=on
"${PSQL[@]}" -f "$SRC/config/sql/outbox.sql"

broker_start --topic "payments:$PARTITIONS"

# ~250-byte payment envelopes, committed before the relay starts.
"${PSQL[@]}" -c "INSERT INTO idemproc_outbox (key, value, idempotency_key)
  SELECT 'ORD-' || n, jsonb_build_object('idempotency_key', 'payment-ORD-' || n,
    'event_type', 'payment', 'order_id', 'ORD-' || n, 'user_id', 'user-' || (n % 1000),
    'amount', (n % 10000) / 100.0, 'currency', 'EUR', 'version', 1),
    'payment-ORD-' || n
  FROM generate_series(1, $ROWS) n"
"${PSQL[@]}" -c "VACUUM ANALYZE idemproc_outbox"
BYTES=$("${PSQL[@]}" -c "SELECT round(avg(octet_length(value::text) + octet_length(key)
  + octet_length(idempotency_key) + 36)) FROM idemproc_outbox")

free_port HPORT
cat >"$DIR/outbox.properties" <<PROPS
kafka.bootstrap.servers=$BOOT
outbox.dsn=$DSN
outbox.topic=payments
outbox.batch.max=$BATCH
http.listen=127.0.0.1:$HPORT
log.level=${BENCH_OUTBOX_LOG:-warn}
${BENCH_OUTBOX_EXTRA:-}
PROPS
spawn relay /dev/null "$DIR/relay.log" "$BIN" outbox -c "$DIR/outbox.properties"
# cpu_now: "relay session broker" CPU ticks. BACKEND, the relay's
# PostgreSQL session, is found by its application_name once it published.
BACKEND=
cpu_now() {
    echo "$(cpu_ticks "${PID[relay]}") $(cpu_ticks "${BACKEND:-0}") $(cpu_ticks "${PID[broker]}")"
}
# cpu_per_row BEFORE AFTER ROWS: CPU microseconds a row of each (clock
# ticks of 10 ms: about +-0.1 us a row over 100,000 rows).
cpu_per_row() {
    awk -v a="$1" -v b="$2" -v rows="$3" -v hz="$(getconf CLK_TCK)" 'BEGIN {
        split(a, x, " "); split(b, y, " "); if (rows < 1) rows = 1; f = 1e6 / hz / rows
        printf "relay %.1f, its PostgreSQL session %.1f, broker %.1f",
            (y[1] - x[1]) * f, (y[2] - x[2]) * f, (y[3] - x[3]) * f }'
}
first=0 done_at=0
deadline=$(($(now_us) + 300000000))
while (($(now_us) < deadline)); do
    n=$(metric "$HPORT" idemproc_outbox_published_total)
    t=$(now_us)
    if ((n > 0 && first == 0)); then
        first=$t
        BACKEND=$("${PSQL[@]}" -c "SELECT pid FROM pg_stat_activity
            WHERE application_name = 'idemproc-outbox' LIMIT 1")
        cpu0=$(cpu_now)
    fi
    ((n >= ROWS)) && { done_at=$t; break; }
    sleep 0.2
done
((done_at)) || { tail "$DIR/relay.log" >&2; die "the relay did not finish"; }
CPU_THROUGHPUT=$(cpu_per_row "$cpu0" "$(cpu_now)" "$n")
RATE=$((ROWS * 1000000 / (done_at - first > 0 ? done_at - first : 1)))

# Latency: pgbench commits ROWS_PER_TX rows a transaction at a fixed rate
# (-R) for SECONDS_LAT while the relay sleeps on LISTEN/NOTIFY. Issue 13
# asks for p99 <= 50 ms "at half that rate", that rate being the 50,000
# rows/s goal: the first phase runs at 25,000 rows/s
# (BENCH_OUTBOX_GOAL_RATE / 2). The second runs at half the rate measured
# above, the other reading (stricter when the relay beats the goal).
cat >"$DIR/insert.sql" <<'SQL'
\set r random(1, 1000000000)
INSERT INTO idemproc_outbox (key, value, idempotency_key)
  SELECT 'L-' || :r || '-' || g, jsonb_build_object('idempotency_key', 'payment-L-' || :r || '-' || g,
    'event_type', 'payment', 'order_id', 'L-' || :r || '-' || g, 'user_id', 'user-' || (:r % 1000),
    'amount', 12.34, 'currency', 'EUR', 'version', 1), 'payment-L-' || :r || '-' || g
  FROM generate_series(1, :rows_per_tx) g;
SQL
ROWS_PER_TX=${BENCH_OUTBOX_ROWS_PER_TX:-50}
GOAL_RATE=${BENCH_OUTBOX_GOAL_RATE:-50000}
# quantile Q BEFORE AFTER: upper bound of the p-quantile's bucket, from the
# cumulative bucket differences of a latency phase.
quantile() {
    paste -d' ' <(echo "$2") <(echo "$3") | awk -v q="$1" '
        { le[NR] = $1; c[NR] = $4 - $2 } END {
            total = c[NR]; if (total == 0) { print "n/a"; exit }
            for (i = 1; i <= NR; i++) if (c[i] >= q * total) { print le[i]; exit } }'
}
# latency_phase NAME RATE: runs pgbench at RATE rows/s and prints the
# phase's two lines, labelled NAME.
latency_phase() {
    local name=$1 rate=$2 tps before cbefore after cafter cpu0 n0 target lag reached
    # The previous phase left dead index entries behind; autovacuum (tuned
    # in outbox.sql) removes them in a running system, here we do.
    "${PSQL[@]}" -c "VACUUM idemproc_outbox"
    tps=$((rate / ROWS_PER_TX))
    ((tps > 0)) || tps=1
    before=$(buckets "$HPORT")
    cbefore=$(buckets "$HPORT" commit)
    cpu0=$(cpu_now)
    n0=$(metric "$HPORT" idemproc_outbox_published_total)
    pgbench -n -h 127.0.0.1 -p "$PGPORT" -U postgres -c 4 -j 2 -R "$tps" -D rows_per_tx="$ROWS_PER_TX" \
        -T "$SECONDS_LAT" -f "$DIR/insert.sql" postgres >"$DIR/pgbench-$name.out" 2>&1 ||
        { cat "$DIR/pgbench-$name.out" >&2; die "pgbench failed"; }
    target=$((n0 + $(awk '/number of transactions actually processed/ { print $6 }' "$DIR/pgbench-$name.out" | cut -d/ -f1) * ROWS_PER_TX))
    for _ in $(seq 300); do
        (($(metric "$HPORT" idemproc_outbox_published_total) >= target)) && break
        sleep 0.1
    done
    after=$(buckets "$HPORT")
    cafter=$(buckets "$HPORT" commit)
    reached=$(awk -v n="$ROWS_PER_TX" '/^tps = / { printf "%d", $3 * n; exit }' "$DIR/pgbench-$name.out")
    lag=$(awk '/rate limit schedule lag/ { print $6 " ms avg, " $8 " ms max" }' "$DIR/pgbench-$name.out" | tr -d '()')
    printf 'bench: outbox relay  latency at %s: %s rows/s asked, %s reached (pgbench behind its schedule by %s): commit -> ack p50 <= %ss, p99 <= %ss; insert -> ack p50 <= %ss, p99 <= %ss; LISTEN/NOTIFY\n' \
        "$name" "$((tps * ROWS_PER_TX))" "${reached:-?}" "${lag:-?}" \
        "$(quantile 0.5 "$cbefore" "$cafter")" "$(quantile 0.99 "$cbefore" "$cafter")" \
        "$(quantile 0.5 "$before" "$after")" "$(quantile 0.99 "$before" "$after")" >>"$DIR/latency.out"
    printf 'bench: outbox relay  CPU us a row at %s: %s\n' "$name" \
        "$(cpu_per_row "$cpu0" "$(cpu_now)" $(($(metric "$HPORT" idemproc_outbox_published_total) - n0)))" >>"$DIR/latency.out"
}
: >"$DIR/latency.out"
latency_phase "half the goal" $((GOAL_RATE / 2))
latency_phase "half the measured rate" $((RATE / 2))
stop relay TERM 15

printf 'bench: outbox relay  %s rows of ~%s bytes, batch %s, PostgreSQL fsync on\n' "$ROWS" "$BYTES" "$BATCH"
printf 'bench: outbox relay  publish rate        %8s rows/s (first to last row, one relay)\n' "$RATE"
printf 'bench: outbox relay  CPU us a row while publishing the backlog: %s\n' "$CPU_THROUGHPUT"
cat "$DIR/latency.out"
