#!/usr/bin/env bash
# demo.sh BIN: the whole pipeline on one machine, for `make demo`.
#
# An embedded broker (idemproc broker) and a private redis-server, two
# consumer-group members, and once their group has formed 100,000 generated
# payments with 10% duplicates and 1% poison, consumed while they are
# produced; then `idemproc verify --dlq` as the judge: the ledger in
# Redis and the dead-letter topic must match what the producer promised.
# Prints the throughput and the outcome counts; exit 0 only when verify says
# exact and both members shut down cleanly (exit 0) on SIGTERM.
#
# Everything lives in a private temp dir (logs included) that is removed on
# exit (kept when DEMO_KEEP is set); every process started here is stopped on exit, Ctrl-C or failure.
# Needs bash >= 5 (EPOCHREALTIME, /dev/tcp) and redis-server/redis-cli; no
# curl, jq or python.
set -euo pipefail

BIN=${1:-build/idemproc}
COUNT=${DEMO_COUNT:-100000} # unique payments + poison records
PARTITIONS=24         # the mock keeps ~5 MiB per partition: 110k x ~430 B
DEADLINE_S=${DEMO_DEADLINE_S:-90} # for the group to consume everything
MEMBERS=(demo-1 demo-2)

if [[ ! -x $BIN ]]; then
    echo "demo: $BIN is not an executable (run make first)" >&2
    exit 2
fi
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
for tool in redis-server redis-cli; do
    command -v "$tool" >/dev/null || {
        echo "demo: $tool not found (make deps installs redis-server and redis-tools)" >&2
        exit 2
    }
done

LIB_NAME=demo LIB_KEEP=${DEMO_KEEP:-} LIB_GRACE=12
. "$(dirname "$0")/lib.sh"
lib_init demo
T0=$(now_us)

# secs US: microseconds as seconds with 2 decimals.
secs() { printf '%d.%02d' "$(($1 / 1000000))" "$(($1 % 1000000 / 10000))"; }

# tail_logs: the last lines of every member's log, for a failure report.
tail_logs() {
    local m
    for m in "${MEMBERS[@]}"; do
        echo "--- $m log (last 15 lines) ---" >&2
        tail -n 15 "$DIR/$m.log" >&2 2>/dev/null || true
    done
}

# all_metrics: the counters of every member, summed by series:
# lines "idemproc_records_total{outcome="processed"} 49594".
all_metrics() {
    local m
    for m in "${MEMBERS[@]}"; do metrics "${HTTP_PORT[$m]}" || true; done |
        awk '/^idemproc_(records|duplicates|dlq_records|rebalances|commits)_total\{/ { v[$1] += $2 }
             END { for (k in v) print k, v[k] }'
}

# get SERIES: a value out of the all_metrics output in $SNAP.
get() { awk -v k="$1" '$1 == k { print $2; f = 1 } END { if (!f) print 0 }' <<<"$SNAP"; }

# expect KEY: a count out of the pretty-printed expect file.
expect() { expect_num "$DIR/expect.json" "$1"; }

# --- broker, redis -------------------------------------------------------
broker_start --topic "payments:$PARTITIONS" --topic payments.dlq:4
redis_start

echo "demo: broker $BOOT (payments:$PARTITIONS, payments.dlq:4), redis 127.0.0.1:$REDIS_PORT, dir $DIR"

# --- processors ----------------------------------------------------------
CONF=$DIR/idemproc.properties
cat >"$CONF" <<EOF
# written by tests/demo.sh
kafka.bootstrap.servers=$BOOT
group.id=idemproc-demo
input.topics=payments
dlq.topic=payments.dlq
redis.url=redis://127.0.0.1:$REDIS_PORT/0
# produce --too-large-bytes 5000: those records must be too large here
message.max.bytes=4096
# the mock broker answers empty fetches only after fetch.wait.max.ms
kafka.fetch.wait.max.ms=10
kafka.session.timeout.ms=6000
# learn of a rebalance soon: the mock rejects commits while one is pending,
# so records handled until the member notices are consumed again elsewhere
kafka.heartbeat.interval.ms=500
batch.max.wait.ms=10
commit.interval.ms=200
log.format=text
log.level=warn
EOF

declare -A HTTP_PORT=()
for m in "${MEMBERS[@]}"; do free_port "HTTP_PORT[$m]"; done
T_START=$(now_us)
for m in "${MEMBERS[@]}"; do
    spawn "$m" "$DIR/$m.log" "$DIR/$m.log" "$BIN" run -c "$CONF" \
        --set "member.id=$m" --set "http.listen=127.0.0.1:${HTTP_PORT[$m]}"
done

# Let the group form before traffic arrives: the members join one after the
# other, and a rebalance while records flow makes the mock reject commits
# (records get consumed twice; dedup absorbs them, but the demo shows the
# steady state). Settled = every partition assigned and no rebalance for
# 1.5 s.
settled=0 last_reb='' stable_since=$T_START
while ((settled == 0)); do
    now=$(now_us)
    ((now < T_START + DEADLINE_S * 1000000)) || { tail_logs; die "the group did not form"; }
    SNAP=$(for m in "${MEMBERS[@]}"; do metrics "${HTTP_PORT[$m]}" || true; done |
        awk '/^idemproc_assigned_partitions / { a += $2 }
             /^idemproc_rebalances_total\{/ { r += $2 }
             END { print a + 0, r + 0 }')
    read -r assigned reb <<<"$SNAP"
    if [[ $reb != "$last_reb" ]]; then last_reb=$reb stable_since=$now; fi
    if ((assigned == PARTITIONS && now - stable_since >= 1500000)); then settled=1; fi
    sleep 0.1
done
T_JOINED=$(now_us)

# --- traffic (the members consume while it is produced) ------------------
if ! "$BIN" produce -b "$BOOT" -t payments --count "$COUNT" --duplicates 0.1 \
    --poison 0.01 --seed 42 --expect "$DIR/expect.json" --too-large-bytes 5000 \
    --currencies EUR,USD,TRY --users 1000 >"$DIR/produce.log" 2>&1; then
    cat "$DIR/produce.log" >&2
    die "produce failed"
fi
grep '^produce:' "$DIR/produce.log" | sed 's/^/demo: /' || true
SENT=$(expect sent)


# Wait: poll the members' /metrics every 0.1 s (cheap; it also timestamps
# the first record handled), and run verify, the authority, once the members
# have handled as many records as were sent; also when their count has not
# moved for 2 s, and at least every 10 s, in case the metrics are off. (No
# verify while records flow: it would take CPU from the members and blur the
# first-record timestamp.)
T_FIRST='' T_DONE='' T_VERIFIED='' VERIFY_OUT='(verify not run yet)'
last_verify=$T_JOINED last_change=$T_JOINED last_total=0 total=0
deadline=$((T_START + DEADLINE_S * 1000000))
while :; do
    now=$(now_us)
    for m in "${MEMBERS[@]}"; do
        alive "${PID[$m]}" || {
            rc=0
            wait "${PID[$m]}" || rc=$?
            unset "PID[$m]"
            tail_logs
            die "member $m exited with $rc while consuming"
        }
    done
    SNAP=$(all_metrics)
    total=$(awk '$1 ~ /^idemproc_records_total\{/ { s += $2 } END { print s + 0 }' <<<"$SNAP")
    if [[ -z $T_FIRST ]] && ((total > 0)); then T_FIRST=$now; fi
    if [[ -z $T_DONE ]] && ((total >= SENT)); then T_DONE=$now; fi
    if ((total != last_total)); then last_total=$total last_change=$now; fi
    if ((total >= SENT || now - last_verify >= 10000000 ||
        (total > 0 && now - last_change >= 2000000 && now - last_verify >= 2000000))); then
        last_verify=$now
        if VERIFY_OUT=$("$BIN" verify -c "$CONF" --expect "$DIR/expect.json" --dlq \
            --timeout-ms 10000 2>&1); then
            T_VERIFIED=$(now_us)
            break
        fi
    fi
    if ((now > deadline)); then
        echo "demo: last verify output:" >&2
        printf '%s\n' "$VERIFY_OUT" >&2
        echo "demo: members handled $total of $SENT records" >&2
        tail_logs
        die "the group did not consume everything within ${DEADLINE_S}s"
    fi
    if ((total >= SENT)); then sleep 0.5; else sleep 0.1; fi
done
SNAP=$(all_metrics)
total=$(awk '$1 ~ /^idemproc_records_total\{/ { s += $2 } END { print s + 0 }' <<<"$SNAP")
: "${T_FIRST:=$T_JOINED}" "${T_DONE:=$T_VERIFIED}"

# --- summary -------------------------------------------------------------
span=$((T_VERIFIED - T_FIRST))
((span > 0)) || span=1
rate=$((total * 1000000 / span))
proc=$(get 'idemproc_records_total{outcome="processed"}')
dups=$(get 'idemproc_records_total{outcome="duplicate"}')
dlqs=$(get 'idemproc_records_total{outcome="dlq"}')

# cmp GOT WANT: "" when equal, else a visible note.
cmp() { if [[ $1 == "$2" ]]; then echo ""; else echo " (expected $2)"; fi; }

handled=$((T_DONE - T_FIRST))
((handled > 0)) || handled=1
echo "demo: ${#MEMBERS[@]} members handled $total records (sent $SENT): $rate msgs/s" \
    "($(secs "$span") s from the first record handled to verify exact)"
echo "demo:   group formed in $(secs $((T_JOINED - T_START))) s; first record handled $(secs $((T_FIRST - T_JOINED))) s after;" \
    "all handled $(secs "$handled") s after it ($((total * 1000000 / handled)) msgs/s without verify)"
printf 'demo:   processed   %6s%s\n' "$proc" "$(cmp "$proc" "$(expect applied)")"
line=""
for k in redelivery resend; do
    v=$(get "idemproc_duplicates_total{kind=\"$k\"}")
    line+=" $k $v$(cmp "$v" "$(expect "$k")"),"
done
printf 'demo:   duplicates  %6s %s\n' "$dups" "${line%,}"
line=""
for k in too-large not-json not-object no-identity invalid-field handler-rejected max-retries; do
    v=$(get "idemproc_dlq_records_total{reason=\"$k\"}")
    w=$(expect "$k")
    [[ $v == 0 && $w == 0 ]] && continue
    line+=" $k $v$(cmp "$v" "$w"),"
done
printf 'demo:   dlq         %6s %s\n' "$dlqs" "${line%,}"
extra=$((total - SENT))
printf 'demo:   group       rebalances: assign %s, revoke %s, lost %s; commits ok %s, failed %s\n' \
    "$(get 'idemproc_rebalances_total{event="assign"}')" \
    "$(get 'idemproc_rebalances_total{event="revoke"}')" \
    "$(get 'idemproc_rebalances_total{event="lost"}')" \
    "$(get 'idemproc_commits_total{result="ok"}')" \
    "$(get 'idemproc_commits_total{result="error"}')"
if ((extra > 0)); then
    echo "demo:   note: $extra records were consumed again (handed over in a rebalance" \
        "before their offsets were committed); dedup absorbed them"
fi
printf '%s\n' "$VERIFY_OUT" | grep -E '^verify: (ledger|dlq) exact' | sed 's/^/demo: /'
if ! grep -q 'ledger exact' <<<"$VERIFY_OUT" || ! grep -q 'dlq exact' <<<"$VERIFY_OUT"; then
    die "verify passed without 'ledger exact' and 'dlq exact': $VERIFY_OUT"
fi
# The partitions are sized so that the broker keeps every record.
if grep -q 'dropped its' "$DIR/broker.log"; then
    die "the broker dropped records: $(grep 'dropped its' "$DIR/broker.log" | head -3)"
fi

# --- shutdown ------------------------------------------------------------
# One SIGTERM each, at once (a second signal makes a member exit at once,
# without committing).
for m in "${MEMBERS[@]}"; do kill -TERM "${PID[$m]}"; done
T_TERM=$(now_us)
bad=0
for m in "${MEMBERS[@]}"; do
    rc=0
    stop "$m" - 15 || rc=$?
    echo "demo: $m stopped on SIGTERM: exit $rc after $(secs $(($(now_us) - T_TERM))) s"
    ((rc == 0)) || bad=1
done
((bad == 0)) || { tail_logs; die "a member did not exit 0 on SIGTERM"; }
stop broker TERM 10 || die "broker did not exit 0 on SIGTERM"
stop redis TERM 10 || true
echo "demo: OK in $(secs $(($(now_us) - T0))) s"
