#!/usr/bin/env bash
# chaos_cluster.sh BIN: `make chaos` on a Redis Cluster, for `make
# chaos-cluster` (or CHAOS_CLUSTER=1 make chaos).
#
# A real Redis Cluster of 3 primaries and 3 replicas (redis-server
# --cluster-enabled yes, AOF with appendfsync always, cluster-node-timeout
# 1 s) on free 127.0.0.1 ports in a temp dir, an embedded 3-broker Kafka,
# and members with handler=ledger, dedup.scope=partition and
# redis.cluster.nodes (in about half the runs the first seed is a closed
# port). Traffic from `idemproc produce` with duplicates and every poison
# reason. While it flows, one Redis fault at a time (the next one once the
# cluster is ok again), every 3-8 s:
#
#   kill -9 of a primary: its replica takes over; the node is restarted
#     2-8 s later and comes back as a replica;
#   SIGSTOP of a primary for 0.5-4.5 s (beyond cluster-node-timeout in most
#     runs: a failover happens under the frozen primary, which wakes up as
#     a primary that is not one any more);
#   redis-cli --cluster reshard of slots that hold at least a third of the
#     partitions' tags (the tool moves a source's lowest slots: the
#     cheapest counts that reach the tags, as tests/e2e/test_cluster_run.c
#     picks them), to one target primary, in the background;
#   CLUSTER FAILOVER on a replica (a planned switch);
#   a lost tail: a replica SIGSTOPped for 1-3 s while its primary takes
#     writes, then the primary kill -9'd and the replica woken: it is
#     promoted without the writes it missed (restart of the node as above);
#
# and, on their own clock every 2-6 s, member faults: kill -9 (restarted
# 0.2-1.2 s later), SIGSTOP for 1-9 s (beyond session.timeout.ms=6000
# sometimes: the member is fenced out of the group and wakes up), a
# restart (SIGTERM, then start). Then everything is up again and `idemproc
# verify --dlq` must say exact. Prints a table as chaos.sh does.
#
#   CHAOS_SEED     seed of everything random here (printed; default: random)
#   CHAOS_RECORDS  unique payments + poison records (default 40000)
#   CHAOS_SECONDS  how long the chaos lasts (default 180)
#   CHAOS_SETTLE   seconds allowed afterwards to verify exact (default 420)
#   CHAOS_MEMBERS  number of members, 2 or 3 (default 3)
#   CHAOS_KEEP     keep the temp dir (logs, fault log) when set
#   CHAOS_PROPS    extra member properties, one per line (e.g.
#                  redis.wait.replicas=1)
#   CHAOS_KEYLESS  1: also records without a Kafka key (default 0: cluster
#                  mode dead-letters them until the global marks are
#                  sharded, and the expectation would say applied; see
#                  docs/testing.md)
#
# Exit 0 only when exact; 3 when the embedded broker aborted on one of its
# own assertions (inconclusive, see broker_check in tests/lib.sh).
set -euo pipefail

BIN=${1:-build/idemproc}
SEED=${CHAOS_SEED:-$((($(date +%s%N) / 1000) % 1000000))}
RECORDS=${CHAOS_RECORDS:-40000}
DURATION=${CHAOS_SECONDS:-180}
SETTLE=${CHAOS_SETTLE:-420}
NMEMBERS=${CHAOS_MEMBERS:-3}
KEYLESS=${CHAOS_KEYLESS:-0}
GROUP=chaos
TOPIC=payments
PARTITIONS=24 # the mock keeps ~5 MiB per partition: 44k x ~430 B / 24
DLQ_PARTITIONS=4
NODE_TIMEOUT=1000

[[ -x $BIN ]] || { echo "chaos-cluster: $BIN is not an executable (run make first)" >&2; exit 2; }
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
for tool in redis-server redis-cli; do
    command -v "$tool" >/dev/null || { echo "chaos-cluster: $tool not found (make deps)" >&2; exit 2; }
done
((NMEMBERS >= 2 && NMEMBERS <= 3)) || { echo "chaos-cluster: CHAOS_MEMBERS is 2 or 3" >&2; exit 2; }
[[ $KEYLESS == 0 || $KEYLESS == 1 ]] || { echo "chaos-cluster: CHAOS_KEYLESS is 0 or 1" >&2; exit 2; }
echo "chaos-cluster: CHAOS_SEED=$SEED CHAOS_RECORDS=$RECORDS CHAOS_SECONDS=$DURATION" \
    "CHAOS_MEMBERS=$NMEMBERS CHAOS_KEYLESS=$KEYLESS (replay: CHAOS_SEED=$SEED" \
    "CHAOS_RECORDS=$RECORDS CHAOS_SECONDS=$DURATION CHAOS_MEMBERS=$NMEMBERS" \
    "CHAOS_KEYLESS=$KEYLESS make chaos-cluster)"

LIB_NAME=chaos-cluster LIB_CONTEXT=" (CHAOS_SEED=$SEED)" LIB_KEEP=${CHAOS_KEEP:-} LIB_KEEP_FAILED=1
. "$(dirname "$0")/lib.sh"
lib_init chaos-cluster
# A process left stopped (SIGSTOP) would sit out lib_cleanup's SIGTERM
# grace: every one gets SIGCONT first (errexit off: a failed run must still
# reach the cleanup).
cont_all() { local n; for n in "${!PID[@]}"; do kill -CONT "${PID[$n]}" 2>/dev/null || true; done; }
trap 'rc=$?; set +e; cont_all; (exit $rc); lib_cleanup' EXIT
T0=$(now_ms)

# rnd N: R = a number in 0..N-1 from the seeded generator (chaos.sh's).
S=$((SEED * 2654435761 + 1))
rnd() {
    S=$(((S * 6364136223846793005 + 1442695040888963407) & 0x7fffffffffffffff))
    R=$(((S >> 20) % $1))
}

# The fault log: one line per fault with its time since the chaos began.
FLOG=$DIR/faults.log
flog() { printf '+%6d ms %s\n' "$(($(now_ms) - T_CHAOS0))" "$*" >>"$FLOG"; }
T_CHAOS0=$T0

# --- the cluster ---------------------------------------------------------------
# Node i (0..5) runs in DIR/node<i> on NPORT[i] (its bus port, +10000, free
# too); NSTATE[i]: up, killed, stopped.
NNODES=6
declare -a NPORT=() NSTATE=()
for ((i = 0; i < NNODES; i++)); do
    while :; do
        free_port np; p=$np
        if port_free $((p + 10000)) && [[ -z ${LIB_TAKEN[$((p + 10000))]:-} ]]; then
            LIB_TAKEN[$((p + 10000))]=1
            break
        fi
    done
    NPORT[i]=$p
    mkdir -p "$DIR/node$i"
done
ncli() { local i=$1; shift; redis-cli -h 127.0.0.1 -p "${NPORT[i]}" "$@"; }
node_pong() { [[ $(ncli "$1" ping 2>/dev/null) == PONG ]]; }
node_start() {
    local i=$1
    spawn "node$i" "$DIR/node$i/redis.log" "$DIR/node$i/redis.log" redis-server \
        --bind 127.0.0.1 --port "${NPORT[i]}" --dir "$DIR/node$i" --save "" \
        --daemonize no --appendonly yes --appendfsync always \
        --cluster-enabled yes --cluster-config-file nodes.conf \
        --cluster-node-timeout "$NODE_TIMEOUT" --cluster-replica-validity-factor 0
    wait_for 10 "node$i" node_pong "$i" || {
        tail -n 5 "$DIR/node$i/redis.log" >&2
        die "redis node $i did not start on port ${NPORT[i]}"
    }
    NSTATE[i]=up
    return 0
}
for ((i = 0; i < NNODES; i++)); do node_start "$i"; done
addrs=()
for ((i = 0; i < NNODES; i++)); do addrs+=("127.0.0.1:${NPORT[i]}"); done
redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes \
    >"$DIR/cluster-create.log" 2>&1 || { cat "$DIR/cluster-create.log" >&2; die "redis-cli --cluster create"; }
SEEDS=$(IFS=,; echo "${addrs[*]}")

# node_of_port PORT: I = the node index listening there (-1: none).
node_of_port() {
    local k
    I=-1
    for ((k = 0; k < NNODES; k++)); do [[ ${NPORT[k]} == "$1" ]] && { I=$k; return 0; }; done
    return 0
}
# role I: ROLE of node I ("master", "slave", "" when it does not answer).
role() { [[ ${NSTATE[$1]} == up ]] && ncli "$1" role 2>/dev/null | head -n 1 || true; }

# A live node's CLUSTER NODES, reduced to "<owner port> <slot ranges...>"
# per primary not failing, sorted: the slot map as that node sees it.
slot_map() {
    ncli "$1" cluster nodes 2>/dev/null | awk '
        $3 ~ /master/ && $3 !~ /fail/ {
            split($2, a, "[:@]"); s = a[2]
            for (k = 9; k <= NF; k++) if ($k !~ /^\[/) s = s " " $k
            print s
        }' | sort
}
# cluster_ok: every live node says cluster_state:ok, sees the same slot map,
# all 16384 slots are served by a live node, and no slot is half moved.
cluster_ok() {
    local i first='' m
    for ((i = 0; i < NNODES; i++)); do
        [[ ${NSTATE[i]} == up ]] || continue
        ncli "$i" cluster info 2>/dev/null | grep -q '^cluster_state:ok' || return 1
        m=$(slot_map "$i") || return 1
        if [[ -z $first ]]; then first=$m; elif [[ $m != "$first" ]]; then return 1; fi
    done
    [[ -n $first ]] || return 1
    # Every owner is a live node; the ranges cover 16384 slots.
    local port n=0 r
    while read -r port rest; do
        node_of_port "$port"
        ((I >= 0)) && [[ ${NSTATE[I]} == up ]] || return 1
        for r in $rest; do
            if [[ $r == *-* ]]; then n=$((n + ${r#*-} - ${r%-*} + 1)); else n=$((n + 1)); fi
        done
    done <<<"$first"
    ((n == 16384)) || return 1
    # No slot migrating or importing (a [slot->-id] / [slot-<-id] field).
    for ((i = 0; i < NNODES; i++)); do
        [[ ${NSTATE[i]} == up ]] || continue
        ncli "$i" cluster nodes 2>/dev/null | grep -q '\[' && return 1
    done
    return 0
}
wait_for 60 - cluster_ok || die "the cluster did not come up (see $DIR/cluster-create.log)"
# Replicas attached (ROLE of 3 nodes says slave, connected).
replicas_connected() {
    local i n=0
    for ((i = 0; i < NNODES; i++)); do
        [[ ${NSTATE[i]} == up ]] || continue
        ncli "$i" role 2>/dev/null | tr '\n' ' ' | grep -q '^slave .* connected ' && n=$((n + 1))
    done
    ((n == 3))
}
wait_for 60 - replicas_connected || die "the replicas did not attach"

# The slot of each partition's hash tag (as the processor names it).
declare -a TAG_SLOT=()
for ((p = 0; p < PARTITIONS; p++)); do
    TAG_SLOT[p]=$(ncli 0 cluster keyslot "{$GROUP:$TOPIC:$p}")
done

# --- broker ----------------------------------------------------------------
broker_start --brokers 3 --topic "$TOPIC:$PARTITIONS" --topic "$TOPIC.dlq:$DLQ_PARTITIONS"

# --- members ---------------------------------------------------------------
rnd 2
DEAD_SEED=$R
NODES_PROP=$SEEDS
if ((DEAD_SEED)); then
    free_port dport; dead=$dport
    NODES_PROP="127.0.0.1:$dead,$SEEDS"
fi
INPUTS=$TOPIC
CONF=$DIR/idemproc.properties
cat >"$CONF" <<EOF
# written by tests/chaos_cluster.sh
kafka.bootstrap.servers=$BOOT
group.id=$GROUP
input.topics=$INPUTS
dlq.topic=$TOPIC.dlq
redis.cluster.nodes=$NODES_PROP
dedup.scope=partition
handler=ledger
message.max.bytes=4096
kafka.fetch.wait.max.ms=10
kafka.session.timeout.ms=6000
kafka.heartbeat.interval.ms=500
batch.max.wait.ms=10
commit.interval.ms=200
log.format=text
log.level=warn
EOF
if [[ -n ${CHAOS_PROPS:-} ]]; then printf '%s\n' "$CHAOS_PROPS" >>"$CONF"; fi
echo "chaos-cluster: redis cluster 3+3 on $SEEDS (AOF always, node timeout ${NODE_TIMEOUT} ms)," \
    "first seed $( ((DEAD_SEED)) && echo "127.0.0.1:$dead (closed)" || echo "up");" \
    "broker $BOOT ($TOPIC:$PARTITIONS); $NMEMBERS members; dir $DIR"

MEMBERS=()
for ((k = 1; k <= NMEMBERS; k++)); do MEMBERS+=("m$k"); done
declare -A HTTP_PORT=() MSTATE=()
for m in "${MEMBERS[@]}"; do free_port "HTTP_PORT[$m]"; done
member_start() {
    spawn "$1" "$DIR/$1.log" "$DIR/$1.log" "$BIN" run -c "$CONF" --set "member.id=$1" \
        --set "http.listen=127.0.0.1:${HTTP_PORT[$1]}"
    MSTATE[$1]=up
    return 0
}

# Counters of members that were killed are lost with them; each member is
# scraped right before it is killed or stopped, its last scrape added here.
declare -A SUM=()
scrape_add() {
    local k v
    while read -r k v; do SUM[$k]=$((${SUM[$k]:-0} + ${v%.*})); done < <(
        metrics "$1" | awk '
            /^idemproc_(records|duplicates|rebalances)_total\{/ { print $1, $2 }
            /^idemproc_redis_cluster_[a-z_]*_total[{ ]/ { sub(/\{.*/, "", $1); print $1, $2 }
            /^idemproc_redis_position_behind_total / { print $1, $2 }')
    return 0
}
for m in "${MEMBERS[@]}"; do member_start "$m"; done

# --- traffic: spread over most of the chaos --------------------------------
total_msgs=$((RECORDS + RECORDS / 10))
rate=$((total_msgs * 10 / (DURATION * 8) + 1))
spawn produce "$DIR/produce.log" "$DIR/produce.log" "$BIN" produce -b "$BOOT" -t "$TOPIC" \
    --count "$RECORDS" --duplicates 0.1 --poison 0.01 --seed "$SEED" --too-large-bytes 5000 \
    --currencies EUR,USD,TRY --users 1000 --rate "$rate" --expect "$DIR/expect.json" \
    -X message.timeout.ms=900000
EXPECT=$DIR/expect.json
PRODUCERS=(produce)
if [[ $KEYLESS == 1 ]]; then
    # Payments without a Kafka key (an empty key before the tab), in the
    # generator's format, then a tenth as many duplicates: half the same
    # line (a redelivery), half a new message_id (a resend).
    KL=$DIR/keyless.jsonl
    nkl=$((RECORDS / 20))
    curs=(EUR USD TRY)
    declare -a kl_line=()
    for ((k = 1; k <= nkl; k++)); do
        rnd 1000; u=$((R + 1))
        rnd 99999; c=$((R + 1))
        rnd 3; cur=${curs[R]}
        body=$(printf '"event_type":"payment.captured","created_at":"2024-06-01T00:00:00Z","version":1,"order_id":"KL-%d","user_id":"user-%d","amount":%d.%02d,"currency":"%s"}' \
            "$k" "$u" $((c / 100)) $((c % 100)) "$cur")
        kl_line[k]=$body
        printf '\t{"message_id":"kl-%d","idempotency_key":"payment-KL-%d",%s\n' "$k" "$k" "$body"
    done >"$KL"
    for ((k = 1; k <= nkl / 10; k++)); do
        rnd "$nkl"; j=$((R + 1))
        if ((k % 2)); then
            printf '\t{"message_id":"kl-%d","idempotency_key":"payment-KL-%d",%s\n' "$j" "$j" "${kl_line[j]}"
        else
            printf '\t{"message_id":"kl-%d-r%d","idempotency_key":"payment-KL-%d",%s\n' "$j" "$k" "$j" "${kl_line[j]}"
        fi
    done >>"$KL"
    spawn produce_kl "$DIR/produce_kl.log" "$DIR/produce_kl.log" "$BIN" produce -c "$CONF" \
        -t "$TOPIC" --input "$KL" --key-delimiter '\t' --rate $((rate / 20 + 1)) \
        --expect "$DIR/expect_keyless.json" -X message.timeout.ms=900000
    PRODUCERS+=(produce_kl)
fi

# --- the Redis faults ----------------------------------------------------------
# primaries: P = the live nodes whose ROLE says master.
primaries() {
    local i
    P=()
    for ((i = 0; i < NNODES; i++)); do [[ $(role "$i") == master ]] && P+=("$i"); done
    return 0
}
# replica_of N: I = a live node replicating node N, connected (-1: none).
replica_of() {
    local i r
    I=-1
    for ((i = 0; i < NNODES; i++)); do
        [[ ${NSTATE[i]} == up && $i != "$1" ]] || continue
        r=$(ncli "$i" role 2>/dev/null | tr '\n' ' ')
        [[ $r == "slave 127.0.0.1 ${NPORT[$1]} connected "* ]] && { I=$i; return 0; }
    done
    return 0
}
node_id() { ncli "$1" cluster myid; }

# The reshard plan: target T (a random primary); for each other primary,
# how many of its lowest slots to move (TAKE[src]) so that at least a
# third of the tags move: greedily the source whose next tag (in slot
# order) costs the fewest slots.
plan_reshard() {
    local i p view
    primaries
    ((${#P[@]} >= 2)) || return 1
    rnd ${#P[@]}; TARGET=${P[R]}
    view=$(ncli "$TARGET" cluster nodes 2>/dev/null) || return 1
    # owner port and cost (the owner's slots <= the tag's slot) per tag
    local -a owner=() cost=()
    while read -r p port c; do owner[p]=$port; cost[p]=$c; done < <(
        awk -v tags="${TAG_SLOT[*]}" '
            BEGIN { nt = split(tags, t, " ") }
            $3 ~ /master/ && $3 !~ /fail/ {
                split($2, a, "[:@]")
                for (k = 9; k <= NF; k++) {
                    if ($k ~ /^\[/) continue
                    lo = $k; hi = $k
                    if ($k ~ /-/) { split($k, r, "-"); lo = r[1]; hi = r[2] }
                    for (s = lo; s <= hi; s++) own[s] = a[2]
                }
            }
            END {
                for (j = 1; j <= nt; j++) {
                    o = own[t[j]]; c = 0
                    for (s = 0; s <= t[j]; s++) c += own[s] == o
                    print j - 1, o, c
                }
            }' <<<"$view")
    local need=$(((PARTITIONS + 2) / 3)) moved=0 best bestc src tport
    declare -gA TAKE=()
    tport=${NPORT[TARGET]}
    while ((moved < need)); do
        best=-1 bestc=0
        for ((p = 0; p < PARTITIONS; p++)); do
            [[ ${owner[p]} != "$tport" ]] || continue
            node_of_port "${owner[p]}"
            ((cost[p] > ${TAKE[$I]:-0})) || continue
            if ((best < 0 || cost[p] < bestc)); then best=$p bestc=${cost[p]}; fi
        done
        ((best >= 0)) || break
        node_of_port "${owner[best]}"
        TAKE[$I]=$bestc
        moved=0
        for ((p = 0; p < PARTITIONS; p++)); do
            node_of_port "${owner[p]}"
            ((I >= 0 && cost[p] <= ${TAKE[$I]:-0})) && moved=$((moved + 1))
        done
    done
    PLAN_TAGS=$moved
    ((moved >= need))
}
# reshard_run TARGET SRC:N...: the tool, one source after the other (a
# background job: its output goes to DIR/reshard.log).
reshard_run() {
    local target=$1 tid sid src n
    shift
    tid=$(node_id "$target")
    for a in "$@"; do
        src=${a%:*} n=${a#*:}
        sid=$(node_id "$src")
        echo "reshard: $n slots from node $src ($sid) to node $target ($tid)"
        redis-cli --cluster reshard "127.0.0.1:${NPORT[src]}" --cluster-from "$sid" \
            --cluster-to "$tid" --cluster-slots "$n" --cluster-yes >"$DIR/reshard.last" 2>&1 || {
            tail -n 20 "$DIR/reshard.last"
            echo "reshard: FAILED"
            return 1
        }
        tail -n 1 "$DIR/reshard.last"
        # the next source only when the map agrees again
        for ((w = 0; w < 600; w++)); do cluster_ok && break; sleep 0.1; done
    done
    echo "reshard: done"
}
# tags_owned_by N: how many tags node N serves now.
tags_moved_to() {
    local p n=0 view
    view=$(slot_map "$1")
    for ((p = 0; p < PARTITIONS; p++)); do
        awk -v s="${TAG_SLOT[p]}" -v port="${NPORT[$1]}" '
            $1 == port { for (k = 2; k <= NF; k++) { lo = $k; hi = $k
                if ($k ~ /-/) { split($k, r, "-"); lo = r[1]; hi = r[2] }
                if (s + 0 >= lo + 0 && s + 0 <= hi + 0) found = 1 } }
            END { exit !found }' <<<"$view" && n=$((n + 1))
    done
    echo "$n"
}

KILLS=0 STOPS=0 LAGS=0 RESHARDS=0 RESHARD_FAILS=0 MANUAL_FO=0 MKILLS=0 MSTOPS=0 MRESTARTS=0
RESHARD_TAGS=0
REDIS_BUSY='' # what the current Redis fault waits for: restart, cont, reshard, failover, settle
busy_until=0 busy_node=-1 busy_role=''
rnd 3000; next_redis=$(($(now_ms) + 5000 + R))
rnd 3000; next_member=$(($(now_ms) + 2000 + R))
declare -A MRESUME=()
T_CHAOS0=$(now_ms)
chaos_end=$((T_CHAOS0 + DURATION * 1000))

redis_fault() {
    local now=$1 v r
    primaries
    rnd 5
    case $R in
    4)
        # A lost tail: the replica is stopped for 1-3 s while its primary
        # takes writes, then the primary is kill -9'd and the replica woken:
        # it is promoted without what it missed.
        local cand=()
        for v in "${P[@]}"; do replica_of "$v"; ((I >= 0)) && cand+=("$v"); done
        ((${#cand[@]})) || return 0
        rnd ${#cand[@]}; v=${cand[R]}
        replica_of "$v"; r=$I
        kill -STOP "${PID[node$r]}"
        NSTATE[r]=stopped
        rnd 2000; busy_until=$((now + 1000 + R))
        REDIS_BUSY=lag busy_node=$v busy_role=$r
        flog "redis: SIGSTOP replica node $r of primary node $v for $((busy_until - now)) ms, then kill -9 of the primary"
        ;;
    0 | 1)
        # a primary with a live replica: kill -9, or SIGSTOP
        local cand=()
        for v in "${P[@]}"; do replica_of "$v"; ((I >= 0)) && cand+=("$v"); done
        ((${#cand[@]})) || return 0
        rnd ${#cand[@]}; v=${cand[R]}
        replica_of "$v"; r=$I
        rnd 2
        if ((R == 0)); then
            scrape_all
            kill -KILL "${PID[node$v]}" 2>/dev/null || true
            stop "node$v" - 5 || true
            NSTATE[v]=killed
            KILLS=$((KILLS + 1))
            rnd 6000; busy_until=$((now + 2000 + R))
            REDIS_BUSY=restart busy_node=$v
            flog "redis: kill -9 primary node $v (port ${NPORT[v]}; replica node $r)"
        else
            kill -STOP "${PID[node$v]}"
            NSTATE[v]=stopped
            STOPS=$((STOPS + 1))
            rnd 4000; busy_until=$((now + 500 + R))
            REDIS_BUSY=cont busy_node=$v busy_role=$r
            flog "redis: SIGSTOP primary node $v (port ${NPORT[v]}) for $((busy_until - now)) ms (replica node $r)"
        fi
        ;;
    2)
        cluster_ok || return 0
        plan_reshard || { flog "redis: no reshard plan"; return 0; }
        local args=() src
        for src in "${!TAKE[@]}"; do args+=("$src:${TAKE[$src]}"); done
        flog "redis: reshard to node $TARGET: ${args[*]} (source:lowest slots; $PLAN_TAGS tags)"
        RESHARD_TAGS=$((RESHARD_TAGS + PLAN_TAGS))
        RESHARDS=$((RESHARDS + 1))
        spawn reshard "$DIR/reshard.log" "$DIR/reshard.log" reshard_run "$TARGET" "${args[@]}"
        REDIS_BUSY=reshard
        ;;
    3)
        # CLUSTER FAILOVER on a connected replica
        local reps=()
        for v in "${P[@]}"; do replica_of "$v"; ((I >= 0)) && reps+=("$I"); done
        ((${#reps[@]})) || return 0
        rnd ${#reps[@]}; r=${reps[R]}
        flog "redis: CLUSTER FAILOVER on replica node $r: $(ncli "$r" cluster failover 2>&1)"
        MANUAL_FO=$((MANUAL_FO + 1))
        REDIS_BUSY=failover busy_node=$r busy_until=$((now + 30000))
        ;;
    esac
    return 0
}

# redis_step NOW: moves the current Redis fault on; when it is over the
# next one is scheduled 3-8 s later.
redis_step() {
    local now=$1 done=0
    case $REDIS_BUSY in
    restart)
        if ((now >= busy_until)); then
            node_start "$busy_node"
            flog "redis: node $busy_node restarted"
            REDIS_BUSY=settle busy_until=$((now + 60000))
        fi
        ;;
    lag)
        if ((now >= busy_until)); then
            scrape_all
            kill -KILL "${PID[node$busy_node]}" 2>/dev/null || true
            stop "node$busy_node" - 5 || true
            NSTATE[busy_node]=killed
            kill -CONT "${PID[node$busy_role]}"
            NSTATE[busy_role]=up
            LAGS=$((LAGS + 1))
            flog "redis: kill -9 primary node $busy_node, SIGCONT of its lagging replica node $busy_role"
            rnd 6000; busy_until=$((now + 2000 + R))
            REDIS_BUSY=restart
        fi
        ;;
    cont)
        if ((now >= busy_until)); then
            kill -CONT "${PID[node$busy_node]}"
            NSTATE[busy_node]=up
            flog "redis: SIGCONT node $busy_node (replica node $busy_role says $(role "$busy_role"))"
            REDIS_BUSY=settle busy_until=$((now + 60000))
        fi
        ;;
    reshard)
        if ! alive "${PID[reshard]}"; then
            local rc=0
            wait "${PID[reshard]}" || rc=$?
            unset "PID[reshard]"
            if ((rc)); then
                RESHARD_FAILS=$((RESHARD_FAILS + 1))
                flog "redis: reshard FAILED (exit $rc, see reshard.log); redis-cli --cluster fix"
                redis-cli --cluster fix "127.0.0.1:${NPORT[${P[0]}]}" --cluster-yes \
                    >>"$DIR/reshard.log" 2>&1 || true
            else
                flog "redis: reshard done: node $TARGET now serves $(tags_moved_to "$TARGET") tags"
            fi
            REDIS_BUSY=settle busy_until=$((now + 60000))
        fi
        ;;
    failover)
        if [[ $(role "$busy_node") == master ]]; then
            flog "redis: node $busy_node is a primary"
            REDIS_BUSY=settle busy_until=$((now + 60000))
        elif ((now >= busy_until)); then
            flog "redis: node $busy_node did not become a primary within 30 s"
            REDIS_BUSY=settle busy_until=$((now + 60000))
        fi
        ;;
    settle)
        if cluster_ok && replicas_connected; then
            done=1
        elif ((now >= busy_until)); then
            flog "redis: the cluster is not ok 60 s after the last fault"
            die "the cluster did not recover from a fault (see $FLOG)"
        fi
        ;;
    *) done=1 ;;
    esac
    if ((done)) && [[ -n $REDIS_BUSY ]]; then
        [[ $REDIS_BUSY == settle ]] && flog "redis: cluster ok"
        REDIS_BUSY=''
        rnd 5000; next_redis=$((now + 3000 + R))
    fi
    return 0
}

scrape_all() { local m; for m in "${MEMBERS[@]}"; do [[ ${MSTATE[$m]} == up ]] && scrape_add "${HTTP_PORT[$m]}"; done; return 0; }

member_fault() {
    local now=$1 m
    rnd ${#MEMBERS[@]}; m=${MEMBERS[R]}
    [[ ${MSTATE[$m]} == up ]] || return 0
    rnd 4
    case $R in
    0 | 1)
        scrape_add "${HTTP_PORT[$m]}"
        stop "$m" KILL 5 || true
        MSTATE[$m]=down
        MKILLS=$((MKILLS + 1))
        rnd 1000; MRESUME[$m]=$((now + 200 + R))
        flog "member $m: kill -9"
        ;;
    2)
        scrape_add "${HTTP_PORT[$m]}"
        kill -STOP "${PID[$m]}"
        MSTATE[$m]=stopped
        MSTOPS=$((MSTOPS + 1))
        rnd 8000; MRESUME[$m]=$((now + 1000 + R))
        flog "member $m: SIGSTOP for $((MRESUME[$m] - now)) ms"
        ;;
    3)
        scrape_add "${HTTP_PORT[$m]}"
        local rc=0
        stop "$m" TERM 30 || rc=$?
        MRESTARTS=$((MRESTARTS + 1))
        flog "member $m: SIGTERM (exit $rc), started again"
        ((rc == 0)) || { tail -n 20 "$DIR/$m.log" >&2; die "member $m exited $rc on SIGTERM"; }
        member_start "$m"
        ;;
    esac
    return 0
}
member_resume() {
    local m=$1
    if [[ ${MSTATE[$m]} == down ]]; then
        member_start "$m"
        flog "member $m: started again"
    else
        kill -CONT "${PID[$m]}"
        MSTATE[$m]=up
        flog "member $m: SIGCONT"
    fi
    unset "MRESUME[$m]"
    return 0
}

# --- chaos -----------------------------------------------------------------------
flog "chaos: begins (seed $SEED)"
while :; do
    now=$(now_ms)
    producing=0
    for pr in "${PRODUCERS[@]}"; do
        [[ -n ${PID[$pr]:-} ]] || continue
        if alive "${PID[$pr]}"; then producing=1; continue; fi
        rc=0
        wait "${PID[$pr]}" || rc=$?
        unset "PID[$pr]"
        ((rc == 0)) || { cat "$DIR/$pr.log" >&2; die "$pr failed (exit $rc)"; }
        flog "$pr: done"
    done
    ((now >= chaos_end && !producing)) && break
    if ((now < chaos_end)); then
        if [[ -z $REDIS_BUSY ]] && ((now >= next_redis)); then redis_fault "$now"; fi
        if ((now >= next_member)); then
            member_fault "$now"
            rnd 4000; next_member=$((now + 2000 + R))
        fi
    fi
    [[ -n $REDIS_BUSY ]] && redis_step "$now"
    for m in "${!MRESUME[@]}"; do ((now >= ${MRESUME[$m]})) && member_resume "$m"; done
    broker_check "${PID[broker]:-}" "$DIR/broker.log"
    for m in "${MEMBERS[@]}"; do
        if [[ ${MSTATE[$m]} == up && -n ${PID[$m]:-} ]] && ! alive "${PID[$m]}"; then
            rc=0
            wait "${PID[$m]}" || rc=$?
            unset "PID[$m]"
            tail -n 20 "$DIR/$m.log" >&2
            die "member $m exited with $rc on its own"
        fi
    done
    sleep 0.1
done
T_CHAOS=$(now_ms)
flog "chaos: ends"

# --- settle: every node and member up, the Redis fault finished -------------
for m in "${!MRESUME[@]}"; do member_resume "$m"; done
while [[ -n $REDIS_BUSY ]]; do
    now=$(now_ms)
    # a pending restart or SIGCONT happens now
    ((busy_until > now)) && [[ $REDIS_BUSY == restart || $REDIS_BUSY == cont || $REDIS_BUSY == lag ]] && busy_until=$now
    redis_step "$now"
    sleep 0.1
done
wait_for 60 - cluster_ok || die "the cluster is not ok after the chaos"
if [[ $KEYLESS == 1 ]]; then
    # One expectation: the keyless one's counts and balances added.
    jq -s '.[1] as $b | .[0]
        | .applied += $b.applied | .unique += $b.unique | .sent += $b.sent
        | .duplicates |= with_entries(.value += ($b.duplicates[.key] // 0))
        | .poison |= with_entries(.value += ($b.poison[.key] // 0))
        | .ledger = reduce ($b.ledger | to_entries[]) as $c (.ledger;
            reduce ($c.value | to_entries[]) as $u (.; .[$c.key][$u.key] += $u.value))' \
        "$DIR/expect.json" "$DIR/expect_keyless.json" >"$DIR/expect_all.json" ||
        die "could not merge the expectations"
    EXPECT=$DIR/expect_all.json
fi
SENT=$(expect_num "$EXPECT" sent)
WANT_APPLIED=$(expect_num "$EXPECT" applied)

# applied_sum: the sharded <prefix>ledger:applied{...} counters summed over
# the primaries.
applied_sum() {
    local i k sum=0 v
    primaries
    for i in "${P[@]}"; do
        while IFS= read -r k; do
            [[ -n $k ]] || continue
            v=$(ncli "$i" get "$k" 2>/dev/null)
            sum=$((sum + ${v:-0}))
        done < <(ncli "$i" --scan --pattern 'idemproc:ledger:applied*' 2>/dev/null)
    done
    echo "$sum"
}
progress() {
    local m a=0 l=0 r=0 body
    for m in "${MEMBERS[@]}"; do
        body=$(metrics "${HTTP_PORT[$m]}" || true)
        a=$((a + $(awk '/^idemproc_assigned_partitions / { s += $2 } END { print int(s) }' <<<"$body")))
        l=$((l + $(awk '/^idemproc_consumer_lag_records[{ ]/ { s += $2 } END { print int(s) }' <<<"$body")))
        r=$((r + $(awk '/^idemproc_ready / { s += $2 } END { print int(s) }' <<<"$body")))
    done
    echo "chaos-cluster: +$((($(now_ms) - T_CHAOS) / 1000))s after the chaos: applied" \
        "$(applied_sum) of $WANT_APPLIED; partitions assigned $a; consumer lag $l; members ready $r"
}
VERIFY_OUT='(not run)'
verified=0
deadline=$((T_CHAOS + SETTLE * 1000))
last_progress=0
while (($(now_ms) < deadline)); do
    sleep 3
    broker_check "${PID[broker]:-}" "$DIR/broker.log"
    if (($(now_ms) - last_progress >= 20000)); then
        progress
        last_progress=$(now_ms)
    fi
    if VERIFY_OUT=$("$BIN" verify -c "$CONF" --expect "$EXPECT" --dlq \
        --timeout-ms 15000 2>&1); then
        verified=1
        break
    fi
done
((verified)) || progress
T_VERIFIED=$(now_ms)
APPLIED=$(applied_sum)
scrape_all
printf '%s\n' "$VERIFY_OUT" >"$DIR/verify.out"

lost=$((WANT_APPLIED > APPLIED ? WANT_APPLIED - APPLIED : 0))
doubled=$((APPLIED > WANT_APPLIED ? APPLIED - WANT_APPLIED : 0))
s() { echo "${SUM[$1]:-0}"; }
echo "chaos-cluster: ---------------------------------------------------------------"
printf 'chaos-cluster: %-39s %s\n' \
    "seed" "$SEED" \
    "members; first seed node" "$NMEMBERS; $( ((DEAD_SEED)) && echo down || echo up)" \
    "records sent (incl. duplicates)" "$SENT" \
    "applied (expected)" "$APPLIED ($WANT_APPLIED)" \
    "primary kill -9 (node back as replica)" "$KILLS" \
    "primary SIGSTOP (a failover under it)" "$STOPS" \
    "replica SIGSTOP, then primary kill -9" "$LAGS" \
    "reshards (failed; tags moved)" "$RESHARDS ($RESHARD_FAILS; $RESHARD_TAGS)" \
    "CLUSTER FAILOVER on a replica" "$MANUAL_FO" \
    "member kill -9 / SIGSTOP / restart" "$MKILLS / $MSTOPS / $MRESTARTS" \
    "records handled, all incarnations" "$(($(s 'idemproc_records_total{outcome="processed"}') + $(s 'idemproc_records_total{outcome="duplicate"}') + $(s 'idemproc_records_total{outcome="dlq"}')))" \
    "redeliveries / resends absorbed (>=)" "$(s 'idemproc_duplicates_total{kind="redelivery"}') / $(s 'idemproc_duplicates_total{kind="resend"}')" \
    "rebalances (assign events)" "$(s 'idemproc_rebalances_total{event="assign"}')" \
    "MOVED / ASK / TRYAGAIN / CLUSTERDOWN" "$(s idemproc_redis_cluster_moved_total) / $(s idemproc_redis_cluster_ask_total) / $(s idemproc_redis_cluster_tryagain_total) / $(s idemproc_redis_cluster_clusterdown_total)" \
    "slot map reads; connection errors" "$(s idemproc_redis_cluster_slot_map_refreshes_total); $(s idemproc_redis_cluster_connection_errors_total)" \
    "positions behind (rewinds)" "$(s idemproc_redis_position_behind_total)" \
    "rewinds logged (rewound, back in time)" "$(cat "$DIR"/m*.log | grep -c 'rewound to the position\|went back in time' || true)" \
    "chaos / settle seconds" "$(((T_CHAOS - T_CHAOS0) / 1000)) / $(((T_VERIFIED - T_CHAOS) / 1000))" \
    "lost" "$lost" \
    "doubled" "$doubled"
printf '%s\n' "$VERIFY_OUT" | sed 's/^/chaos-cluster: /'
# The dead letters by reason (what verify's first differences may not show).
"$BIN" dlq stats -c "$CONF" 2>&1 | sed 's/^/chaos-cluster: /' || true
((verified)) || die "verify did not say exact within ${SETTLE}s of the end of the chaos (fault log: $FLOG)"
grep -q 'ledger exact' <<<"$VERIFY_OUT" && grep -q 'dlq exact' <<<"$VERIFY_OUT" ||
    die "verify passed without 'ledger exact' and 'dlq exact'"
((lost == 0 && doubled == 0)) || die "lost $lost, doubled $doubled"
for m in "${MEMBERS[@]}"; do stop "$m" TERM 15 || true; done
echo "chaos-cluster: OK, exact, in $((($(now_ms) - T0) / 1000)) s"
