#!/usr/bin/env bash
# bench_outbox.sh BIN: the outbox relay's speed, a row of `make bench`
# (alone: make bench BENCH_ONLY=outbox).
#
# A private PostgreSQL (initdb in a temp dir, default durability: fsync on)
# and the embedded broker. Throughput: BENCH_OUTBOX_ROWS rows of ~250 bytes
# are committed first, then one `idemproc outbox` relay publishes them all;
# rows/s from its first published row to its last. Latency: pgbench then
# commits transactions of 10 rows at half that rate (capped at what the
# machine sustains) for BENCH_OUTBOX_SECONDS while the relay sleeps on
# LISTEN/NOTIFY. The relay's histograms give the p50/p99 bucket bounds:
# idemproc_outbox_commit_latency_seconds (the inserting transaction's
# commit -> broker acknowledgement; the server runs with
# track_commit_timestamp=on) and idemproc_outbox_publish_latency_seconds
# (row insert -> acknowledgement, which adds pgbench's own commit, an
# fsync). BENCH_OUTBOX_EXTRA adds relay properties (outbox.after=delete). Needs bash >= 5, PostgreSQL server binaries, psql and pgbench.
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
first=0 done_at=0
deadline=$(($(now_us) + 300000000))
while (($(now_us) < deadline)); do
    n=$(metric "$HPORT" idemproc_outbox_published_total)
    t=$(now_us)
    ((n > 0 && first == 0)) && first=$t
    ((n >= ROWS)) && { done_at=$t; break; }
    sleep 0.2
done
((done_at)) || { tail "$DIR/relay.log" >&2; die "the relay did not finish"; }
RATE=$((ROWS * 1000000 / (done_at - first > 0 ? done_at - first : 1)))

# Latency at half that rate: pgbench commits ROWS_PER_TX rows a transaction.
# The throughput phase left ROWS dead index entries behind; autovacuum
# (tuned in outbox.sql) removes them in a running system, here we do.
"${PSQL[@]}" -c "VACUUM idemproc_outbox"
ROWS_PER_TX=${BENCH_OUTBOX_ROWS_PER_TX:-50}
LAT_RATE=$((RATE / 2))
# What pgbench can insert on a shared 2-core machine is the other limit.
((LAT_RATE > ${BENCH_OUTBOX_LAT_MAX:-25000})) && LAT_RATE=${BENCH_OUTBOX_LAT_MAX:-25000}
TPS=$((LAT_RATE / ROWS_PER_TX))
cat >"$DIR/insert.sql" <<'SQL'
\set r random(1, 1000000000)
INSERT INTO idemproc_outbox (key, value, idempotency_key)
  SELECT 'L-' || :r || '-' || g, jsonb_build_object('idempotency_key', 'payment-L-' || :r || '-' || g,
    'event_type', 'payment', 'order_id', 'L-' || :r || '-' || g, 'user_id', 'user-' || (:r % 1000),
    'amount', 12.34, 'currency', 'EUR', 'version', 1), 'payment-L-' || :r || '-' || g
  FROM generate_series(1, :rows_per_tx) g;
SQL
before=$(buckets "$HPORT")
cbefore=$(buckets "$HPORT" commit)
pgbench -n -h 127.0.0.1 -p "$PGPORT" -U postgres -c 4 -j 2 -R "$TPS" -D rows_per_tx="$ROWS_PER_TX" \
    -T "$SECONDS_LAT" -f "$DIR/insert.sql" postgres >"$DIR/pgbench.out" 2>&1
target=$((ROWS + $(awk '/number of transactions actually processed/ { print $6 }' "$DIR/pgbench.out" | cut -d/ -f1) * ROWS_PER_TX))
for _ in $(seq 300); do
    (($(metric "$HPORT" idemproc_outbox_published_total) >= target)) && break
    sleep 0.1
done
after=$(buckets "$HPORT")
cafter=$(buckets "$HPORT" commit)
# quantile Q [commit]: upper bound of the p-quantile's bucket, from the
# cumulative bucket differences of the latency phase.
quantile() {
    local b=$before a=$after
    [[ ${2:-} == commit ]] && { b=$cbefore; a=$cafter; }
    paste -d' ' <(echo "$b") <(echo "$a") | awk -v q="$1" '
        { le[NR] = $1; c[NR] = $4 - $2 } END {
            total = c[NR]; if (total == 0) { print "n/a"; exit }
            for (i = 1; i <= NR; i++) if (c[i] >= q * total) { print le[i]; exit } }'
}
ACHIEVED=$(awk -v n="$ROWS_PER_TX" '/^tps = / { printf "%d", $3 * n; exit }' "$DIR/pgbench.out")
stop relay TERM 15

printf 'bench: outbox relay  %s rows of ~%s bytes, batch %s, PostgreSQL fsync on\n' "$ROWS" "$BYTES" "$BATCH"
printf 'bench: outbox relay  publish rate        %8s rows/s (first to last row, one relay)\n' "$RATE"
printf 'bench: outbox relay  latency at %s rows/s (target %s): p50 <= %ss, p99 <= %ss (commit -> ack), p50 <= %ss, p99 <= %ss (insert -> ack), LISTEN/NOTIFY\n' \
    "${ACHIEVED:-?}" "$((TPS * ROWS_PER_TX))" "$(quantile 0.5 commit)" "$(quantile 0.99 commit)" \
    "$(quantile 0.5)" "$(quantile 0.99)"
