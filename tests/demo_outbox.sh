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
PGBIN=${PG_BINDIR:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}
[[ -x $BIN ]] || { echo "demo-outbox: $BIN is not an executable (run make first)" >&2; exit 2; }
[[ -x $PGBIN/initdb ]] || { echo "demo-outbox: no PostgreSQL server binaries (make deps installs postgresql)" >&2; exit 2; }
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")

DIR=$(mktemp -d "${TMPDIR:-/tmp}/idemproc-demo-outbox.XXXXXX")
declare -A PID=()
PG_UP=0
as_pg() { if [[ $(id -u) == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi; }
now_ms() { local t=${EPOCHREALTIME//[.,]/}; echo "$((10#$t / 1000))"; }
T0=$(now_ms)
say() { printf 'demo-outbox: [%5d ms] %s\n' "$(($(now_ms) - T0))" "$*"; }

stop() { # NAME SIGNAL: signal, wait up to 15 s, then SIGKILL
    local pid=${PID[$1]:-} i rc=0
    [[ -n $pid ]] || return 0
    kill "-$2" "$pid" 2>/dev/null || true
    for ((i = 0; i < 150; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || rc=$?
    unset "PID[$1]"
    return "$rc"
}
cleanup() {
    local rc=$? name
    set +e
    trap - EXIT INT TERM
    for name in "${!PID[@]}"; do stop "$name" TERM; done
    ((PG_UP)) && as_pg "$PGBIN/pg_ctl" -D "$DIR/pg" -m immediate stop >/dev/null 2>&1
    if [[ -n ${DEMO_KEEP:-} ]]; then echo "demo-outbox: logs kept in $DIR" >&2; else rm -rf "$DIR"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
die() { echo "demo-outbox: FAILED: $*" >&2; exit 1; }
free_port() {
    local p
    for _ in $(seq 200); do
        p=$((20000 + RANDOM % 12000))
        (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
    done
    die "no free port"
}
# metric PORT NAME: one sample of a /metrics body, 0 when absent.
metric() {
    local line v=0
    { exec 3<>"/dev/tcp/127.0.0.1/$1"; } 2>/dev/null || { echo 0; return; }
    printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3
    while IFS= read -r line <&3; do [[ $line == "$2 "* ]] && v=${line##* }; done
    exec 3<&-
    echo "$v"
}
spawn() { # NAME LOG CMD...
    local name=$1 log=$2
    shift 2
    "$@" </dev/null >"$log" 2>&1 &
    PID[$name]=$!
}

# --- PostgreSQL ------------------------------------------------------------
[[ $(id -u) == 0 ]] && chown postgres "$DIR"
PGPORT=$(free_port)
as_pg "$PGBIN/initdb" -D "$DIR/pg" -U postgres -A trust -E UTF8 --locale=C >"$DIR/initdb.log" 2>&1 ||
    { cat "$DIR/initdb.log" >&2; die "initdb"; }
printf 'local all all trust\nhost all all 127.0.0.1/32 trust\n' >"$DIR/pg/pg_hba.conf"
as_pg "$PGBIN/pg_ctl" -D "$DIR/pg" -l "$DIR/pg/server.log" -w -t 60 \
    -o "-p $PGPORT -k $DIR -c listen_addresses=127.0.0.1" start >/dev/null || die "postgres did not start"
PG_UP=1
DSN="host=127.0.0.1 port=$PGPORT user=postgres dbname=postgres"
PSQL=(psql -X -q -A -t -v ON_ERROR_STOP=1 "$DSN")
"${PSQL[@]}" -f "$SRC/config/sql/outbox.sql" 2>/dev/null
say "PostgreSQL on 127.0.0.1:$PGPORT, outbox table created (config/sql/outbox.sql)"

# --- broker, redis ---------------------------------------------------------
spawn broker "$DIR/broker.log" "$BIN" broker --topic "payments:$PARTITIONS" --topic payments.dlq:2
for _ in $(seq 100); do BOOT=$(head -n 1 "$DIR/broker.log" 2>/dev/null || true); [[ $BOOT == *:* ]] && break; sleep 0.05; done
[[ $BOOT == *:* ]] || die "broker printed no bootstrap"
RPORT=$(free_port)
spawn redis "$DIR/redis.log" redis-server --bind 127.0.0.1 --port "$RPORT" --dir "$DIR" --save '' --appendonly no
for _ in $(seq 100); do redis-cli -p "$RPORT" ping >/dev/null 2>&1 && break; sleep 0.05; done
say "broker $BOOT, redis 127.0.0.1:$RPORT"

# --- processor and relays ----------------------------------------------------
MPORT=$(free_port)
cat >"$DIR/run.properties" <<PROPS
kafka.bootstrap.servers=$BOOT
group.id=outbox-demo
input.topics=payments
dlq.topic=payments.dlq
redis.url=redis://127.0.0.1:$RPORT/0
kafka.fetch.wait.max.ms=10
kafka.session.timeout.ms=6000
http.listen=127.0.0.1:$MPORT
log.level=warn
PROPS
spawn member "$DIR/member.log" "$BIN" run -c "$DIR/run.properties"
declare -A RPORTS=()
relay_start() {
    local name=$1
    RPORTS[$name]=${RPORTS[$name]:-$(free_port)}
    cat >"$DIR/$name.properties" <<PROPS
kafka.bootstrap.servers=$BOOT
outbox.dsn=$DSN
outbox.topic=payments
outbox.batch.max=500
member.id=$name
http.listen=127.0.0.1:${RPORTS[$name]}
log.level=warn
PROPS
    spawn "$name" "$DIR/$name.log" "$BIN" outbox -c "$DIR/$name.properties"
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
kill -KILL "${PID[relay-1]}"
{ wait "${PID[relay-1]}"; } 2>/dev/null || true
unset "PID[relay-1]"
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
stop relay-1 TERM || die "relay-1 did not stop cleanly"
stop relay-2 TERM || die "relay-2 did not stop cleanly"
stop member TERM || die "the member did not stop cleanly"
say "rows committed $COMMITTED, rolled back $((TXS * 5 - COMMITTED)); published by the relays now running $pub"
say "processor: applied $proc, skipped $red redeliveries (same message_id: published again after the crash)"
say "exact: every committed row applied once, no rolled-back row, through a relay crash"
