#!/usr/bin/env bash
# demo_outbox.sh BIN: database -> relay -> processor -> verify, for
# `make demo-outbox`.
#
# A private PostgreSQL (initdb in a temp dir), the embedded broker, a private
# redis-server, one `idemproc run` member (ledger handler) and two
# `idemproc outbox` relays. A "service" (psql) commits 2,000 transactions of
# 5 payments each into the outbox table and rolls every 10th back; halfway
# through, one relay is killed with SIGKILL and started again. When every
# committed row is published, the expectation is computed from the
# committed rows themselves (SQL) and `idemproc verify` must say exact:
# every committed payment applied once, no rolled-back one, through the
# crash. Prints what the relays and the processor counted.
#
# Everything lives in a temp dir (kept with DEMO_KEEP=1), removed on exit;
# every process started here is stopped on exit, Ctrl-C or failure. Needs
# bash >= 5, PostgreSQL server binaries (PG_BINDIR), psql, redis-server.
set -euo pipefail

BIN=${1:-build/idemproc}
TXS=${DEMO_OUTBOX_TXS:-2000}
PARTITIONS=8
SRC=$(cd "$(dirname "$0")/.." && pwd)
LIB_NAME=demo-outbox LIB_KEEP=${DEMO_KEEP:-} LIB_GRACE=15
. "$(dirname "$0")/lib.sh"
[[ -x $BIN ]] || { echo "demo-outbox: $BIN is not an executable (run make first)" >&2; exit 2; }
pg_require
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")

lib_init demo-outbox
LIB_T0_MS=$(now_ms) # say: the time since the start

# --- PostgreSQL ------------------------------------------------------------
pg_start
"${PSQL[@]}" -f "$SRC/config/sql/outbox.sql" 2>/dev/null
say "PostgreSQL on 127.0.0.1:$PGPORT, outbox table created (config/sql/outbox.sql)"

# --- broker, redis ---------------------------------------------------------
broker_start --topic "payments:$PARTITIONS" --topic payments.dlq:2
redis_start
say "broker $BOOT, redis 127.0.0.1:$REDIS_PORT"

# --- processor and relays ----------------------------------------------------
free_port MPORT
cat >"$DIR/run.properties" <<PROPS
kafka.bootstrap.servers=$BOOT
group.id=outbox-demo
input.topics=payments
dlq.topic=payments.dlq
redis.url=redis://127.0.0.1:$REDIS_PORT/0
kafka.fetch.wait.max.ms=10
kafka.session.timeout.ms=6000
http.listen=127.0.0.1:$MPORT
log.level=warn
PROPS
spawn member "$DIR/member.log" "$DIR/member.log" "$BIN" run -c "$DIR/run.properties"
declare -A RPORTS=()
relay_start() {
    local name=$1
    [[ -n ${RPORTS[$name]:-} ]] || free_port "RPORTS[$name]"
    cat >"$DIR/$name.properties" <<PROPS
kafka.bootstrap.servers=$BOOT
outbox.dsn=$DSN
outbox.topic=payments
outbox.batch.max=500
member.id=$name
http.listen=127.0.0.1:${RPORTS[$name]}
log.level=warn
PROPS
    spawn "$name" "$DIR/$name.log" "$DIR/$name.log" "$BIN" outbox -c "$DIR/$name.properties"
}
relay_start relay-1
relay_start relay-2
say "processor (ledger handler) and two relays started"

# --- the service's transactions -----------------------------------------------
# Payments of 7 users in EUR and USD; every 10th transaction rolls back.
service() { # FROM TO
    "${PSQL[@]}" -c "DO \$\$ BEGIN FOR t IN $1..$2 LOOP
      INSERT INTO idemproc_outbox (key, value, idempotency_key)
      SELECT 'ORD-' || (t * 5 + j), jsonb_build_object(
          'idempotency_key', 'payment-ORD-' || (t * 5 + j), 'event_type', 'payment',
          'order_id', 'ORD-' || (t * 5 + j), 'user_id', 'user-' || ((t * 5 + j) % 7),
          'amount', ((t * 5 + j) % 9000) / 100.0 + 0.01,
          'currency', CASE WHEN j % 2 = 0 THEN 'EUR' ELSE 'USD' END),
        'payment-ORD-' || (t * 5 + j)
      FROM generate_series(0, 4) j;
      IF t % 10 = 9 THEN ROLLBACK; ELSE COMMIT; END IF;
    END LOOP; END \$\$"
}
HALF=$((TXS / 2))
service 0 $((HALF - 1)) &
SERVICE=$!
sleep 0.3
stop relay-1 KILL 5 || true
say "relay-1 killed with SIGKILL while the service commits and the relays publish"
wait "$SERVICE" || die "the service's transactions failed"
say "service committed $HALF transactions (every 10th rolled back)"
service "$HALF" $((TXS - 1))
relay_start relay-1
say "service committed the other $((TXS - HALF)) transactions; relay-1 restarted"

UNPUB="SELECT count(*) FROM idemproc_outbox WHERE published_at IS NULL AND error IS NULL"
for _ in $(seq 600); do [[ $("${PSQL[@]}" -c "$UNPUB") == 0 ]] && break; sleep 0.1; done
[[ $("${PSQL[@]}" -c "$UNPUB") == 0 ]] || die "rows left unpublished"
COMMITTED=$("${PSQL[@]}" -c "SELECT count(*) FROM idemproc_outbox")
say "all $COMMITTED committed rows published"

# --- verify: the expectation comes from the committed rows ----------------------
"${PSQL[@]}" -c "SELECT jsonb_build_object(
    'ledger', (SELECT jsonb_object_agg(cur, users) FROM (
        SELECT cur, jsonb_object_agg(u, cents) users FROM (
            SELECT value->>'currency' cur, value->>'user_id' u,
                   sum(((value->>'amount')::numeric * 100)::bigint) cents
            FROM idemproc_outbox GROUP BY 1, 2) per_user GROUP BY cur) per_cur),
    'applied', count(*)) FROM idemproc_outbox" >"$DIR/expect.json"
ok=0
for _ in $(seq 120); do
    if "$BIN" verify -c "$DIR/run.properties" --expect "$DIR/expect.json" >"$DIR/verify.out" 2>&1; then ok=1; break; fi
    sleep 0.5
done
sed 's/^/demo-outbox: /' "$DIR/verify.out"
((ok)) || die "verify did not say exact"

pub=0
for name in relay-1 relay-2; do pub=$((pub + $(metric "${RPORTS[$name]}" idemproc_outbox_published_total))); done
red=$(metric "$MPORT" 'idemproc_duplicates_total{kind="redelivery"}')
proc=$(metric "$MPORT" 'idemproc_records_total{outcome="processed"}')
stop relay-1 TERM 15 || die "relay-1 did not stop cleanly"
stop relay-2 TERM 15 || die "relay-2 did not stop cleanly"
stop member TERM 15 || die "the member did not stop cleanly"
say "rows committed $COMMITTED, rolled back $((TXS * 5 - COMMITTED)); published by the relays now running $pub"
say "processor: applied $proc, skipped $red redeliveries (same message_id: published again after the crash)"
say "exact: every committed row applied once, no rolled-back row, through a relay crash"
