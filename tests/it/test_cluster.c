/* test_cluster (it): the Redis Cluster client against a real 3+3 cluster
 * (redis-server --cluster-enabled, redis-cli --cluster create): key slots
 * as the server computes them, a seed list whose first node is down, a
 * slot migrated mid-stream (MOVED and ASK followed, every INCR exact), a
 * primary killed with kill -9 and its replica promoted (idempotent writes
 * resent, the sum exact), and CLUSTERDOWN reported as an outage. */
#include "conf/conf.h"
#include "fixture_redisconn.h"
#include "harness_cluster.h"
#include "redis/cluster.h"

#include <criterion/criterion.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static th_cluster_t clu;
static idem_conf_t *conf;

static void setup(void)
{
    quiet();
    char errstr[512];
    conf = conf_load(NULL, errstr, sizeof(errstr));
    cr_assert(conf, "%s", errstr);
}

static void teardown(void)
{
    th_cluster_stop(&clu);
    idem_conf_destroy(conf);
    conf = NULL;
}

TestSuite(cluster, .init = setup, .fini = teardown, .timeout = 180);

static idem_cluster_t *client(const char *seeds)
{
    idem_cluster_err_t err;
    idem_cluster_t *cl = idem_cluster_new(conf, seeds, &err);
    cr_assert(cl, "cluster client: %s", err.str);
    return cl;
}

/* The counters of every node the client knows, added up. */
static idem_cluster_node_stats_t totals(const idem_cluster_t *cl)
{
    idem_cluster_node_stats_t t = {0}, s;
    for (size_t i = 0; i < idem_cluster_node_count(cl); i++) {
        idem_cluster_node_stats(cl, i, &s);
        t.requests += s.requests;
        t.moved += s.moved;
        t.ask += s.ask;
        t.tryagain += s.tryagain;
        t.clusterdown += s.clusterdown;
        t.conn_errors += s.conn_errors;
        t.timeouts += s.timeouts;
    }
    return t;
}

/* A live node's index for a "127.0.0.1:port" address. */
static int node_of_addr(const char *addr)
{
    const char *colon = addr ? strrchr(addr, ':') : NULL;
    for (int i = 0; colon && i < clu.n; i++)
        if (clu.node[i].port == atoi(colon + 1))
            return i;
    return -1;
}

static long long int_reply(redisReply *r)
{
    cr_assert(r);
    long long v = r->type == REDIS_REPLY_INTEGER  ? r->integer
                  : r->type == REDIS_REPLY_STRING ? atoll(r->str)
                                                  : -999;
    freeReplyObject(r);
    return v;
}

static long long get_int(idem_cluster_t *cl, const char *key)
{
    const char *argv[] = {"GET", key};
    idem_cluster_err_t err;
    redisReply *r =
        idem_cluster_command(cl, key, strlen(key), 2, argv, NULL, &err);
    cr_assert(r, "GET %s: %s", key, err.str);
    return int_reply(r);
}

static int slot_of_str(const char *key)
{
    return idem_cluster_keyslot(key, strlen(key));
}

/* ---- slots, seeds --------------------------------------------------- */

/* The client's slot of a key is the server's (CLUSTER KEYSLOT), tags and
 * odd braces included; the first seed is down and is skipped; every
 * command lands on the slot's primary (no redirection in a stable map). */
Test(cluster, slots_as_server_first_seed_down)
{
    cr_assert_eq(th_cluster_start(&clu, 3, 1), 0, "cluster did not start");
    char seeds[256];
    snprintf(seeds, sizeof(seeds), "127.0.0.1:%d,%s", th_free_port(),
             clu.seeds);
    idem_cluster_t *cl = client(seeds);
    const char *fmt[] = {"k%d",  "{t%d}:marks", "x{%d}y{z}",
                         "{}%d", "{{%d}}",      "a{b%d"};
    for (int i = 0; i < 300; i++) {
        char key[64];
        snprintf(key, sizeof(key), fmt[i % 6], i);
        char *out = th_cluster_cmd(&clu, 1, "CLUSTER KEYSLOT %s", key);
        cr_assert(out);
        cr_assert_eq(idem_cluster_keyslot(key, strlen(key)), atoi(out),
                     "slot of %s", key);
        free(out);
        const char *argv[] = {"SET", key, "1"};
        idem_cluster_err_t err;
        redisReply *r =
            idem_cluster_command(cl, key, strlen(key), 3, argv, NULL, &err);
        cr_assert(r, "SET %s: %s", key, err.str);
        cr_assert_eq(r->type, REDIS_REPLY_STATUS, "SET %s: %s", key, r->str);
        freeReplyObject(r);
    }
    idem_cluster_node_stats_t t = totals(cl);
    cr_assert_eq(t.moved + t.ask, 0);
    cr_assert_eq(t.requests, 300 + 1); /* the SETs and one CLUSTER SLOTS */
    /* The dead seed was tried and counted. */
    idem_cluster_node_stats_t s0;
    cr_assert_str_eq(idem_cluster_node_stats(cl, 0, &s0), strtok(seeds, ","));
    cr_assert_eq(s0.conn_errors, 1);
    /* A key that is not in the slot named (on another node) is refused by
     * the server with MOVED for its own slot: returned as the answer, not
     * followed, not an outage. */
    const char *here = idem_cluster_slot_node(cl, slot_of_str("{t0}:marks"));
    char other[32] = "";
    for (int i = 0; !other[0]; i++) {
        char kk[32];
        snprintf(kk, sizeof(kk), "other%d", i);
        if (strcmp(idem_cluster_slot_node(cl, slot_of_str(kk)), here))
            snprintf(other, sizeof(other), "%s", kk);
    }
    const char *bad[] = {"INCR", other};
    idem_cluster_err_t err;
    redisReply *r =
        idem_cluster_command(cl, "{t0}:marks", 10, 2, bad, NULL, &err);
    cr_assert(r, "%s", err.str);
    cr_assert_eq(r->type, REDIS_REPLY_ERROR);
    char moved[32];
    snprintf(moved, sizeof(moved), "MOVED %d ", slot_of_str(other));
    cr_assert(!strncmp(r->str, moved, strlen(moved)), "%s", r->str);
    freeReplyObject(r);
    idem_cluster_destroy(cl);
}

/* ---- a slot migrated mid-stream -------------------------------------- */

#define TAGS         32
#define KEYS_PER_TAG 4

/* One round: for every tag, one pipeline of an INCR on each of its keys;
 * counts what it sent in expected[]. */
static void incr_round(idem_cluster_t *cl, long long expected[][KEYS_PER_TAG])
{
    for (int t = 0; t < TAGS; t++) {
        char keys[KEYS_PER_TAG][32];
        const char *argv[KEYS_PER_TAG][2];
        idem_cluster_cmd_t cmds[KEYS_PER_TAG];
        redisReply *replies[KEYS_PER_TAG] = {0};
        for (int k = 0; k < KEYS_PER_TAG; k++) {
            snprintf(keys[k], sizeof(keys[k]), "{t%d}:k%d", t, k);
            argv[k][0] = "INCR";
            argv[k][1] = keys[k];
            cmds[k] = (idem_cluster_cmd_t){.argc = 2, .argv = argv[k]};
        }
        idem_cluster_err_t err;
        int rc = idem_cluster_pipeline(cl, keys[0], strlen(keys[0]), cmds,
                                       KEYS_PER_TAG, replies, &err);
        cr_assert_eq(rc, 0, "tag %d: %s", t, err.str);
        for (int k = 0; k < KEYS_PER_TAG; k++) {
            expected[t][k]++;
            /* Each INCR answered once: its answer is the count so far. */
            cr_assert_eq(int_reply(replies[k]), expected[t][k], "%s", keys[k]);
        }
    }
}

Test(cluster, migration_moved_and_ask_exact)
{
    cr_assert_eq(th_cluster_start(&clu, 3, 1), 0, "cluster did not start");
    idem_cluster_t *cl = client(clu.seeds);
    static long long expected[TAGS][KEYS_PER_TAG];
    memset(expected, 0, sizeof(expected));
    int slot = idem_cluster_keyslot("{t0}", 4);
    int from = th_cluster_owner(&clu, slot);
    cr_assert_geq(from, 0);
    int to = -1;
    for (int s = 0; s < IDEM_CLUSTER_SLOTS && to < 0; s += 1000) {
        int o = th_cluster_owner(&clu, s);
        if (o >= 0 && o != from)
            to = o;
    }
    cr_assert_geq(to, 0);
    incr_round(cl, expected);
    incr_round(cl, expected);
    cr_assert_eq(th_cluster_migrate_begin(&clu, slot, from, to), 0);
    incr_round(cl, expected);
    /* Half the slot's keys move, one at a time, with traffic between:
     * the moved keys are answered with ASK, the others where they are. */
    for (int step = 0; step < KEYS_PER_TAG / 2; step++) {
        cr_assert_eq(th_cluster_migrate_keys(&clu, slot, from, to, 1), 1);
        incr_round(cl, expected);
    }
    uint64_t ask_mid = totals(cl).ask;
    cr_assert_gt(ask_mid, 0, "no ASK while the slot was half moved");
    cr_assert_eq(totals(cl).moved, 0);
    cr_assert_geq(th_cluster_migrate_keys(&clu, slot, from, to, 100), 1);
    incr_round(cl, expected);
    cr_assert_eq(th_cluster_migrate_end(&clu, slot, from, to), 0);
    /* The client's map still names the old owner: MOVED, once. */
    incr_round(cl, expected);
    incr_round(cl, expected);
    idem_cluster_node_stats_t t = totals(cl);
    cr_assert_gt(t.moved, 0, "no MOVED after the slot changed owner");
    cr_assert_eq(node_of_addr(idem_cluster_slot_node(cl, slot)), to);
    /* Every key's value is its INCRs, and the sum is exact. */
    long long sum = 0, want = 0;
    for (int tg = 0; tg < TAGS; tg++)
        for (int k = 0; k < KEYS_PER_TAG; k++) {
            char key[32];
            snprintf(key, sizeof(key), "{t%d}:k%d", tg, k);
            long long v = get_int(cl, key);
            cr_assert_eq(v, expected[tg][k], "%s", key);
            sum += v;
            want += expected[tg][k];
        }
    cr_assert_eq(sum, want);
    cr_assert_eq(sum, 8LL * TAGS * KEYS_PER_TAG);
    fprintf(stderr,
            "cluster migration: %lld INCRs exact; moved %" PRIu64
            ", ask %" PRIu64 ", refreshes %" PRIu64 "\n",
            sum, t.moved, t.ask, idem_cluster_refreshes(cl));
    idem_cluster_destroy(cl);
}

/* ---- a primary killed, its replica promoted --------------------------- */

/* The idempotent write: a sequence number applied once per tag (the way
 * the marks make a resend harmless). */
static const char apply_once_lua[] =
    "if redis.call('SADD', KEYS[2], ARGV[1]) == 1 then "
    "return redis.call('INCR', KEYS[1]) end return -1";

#define OPS_PER_BATCH 8

typedef struct {
    atomic_int round;
    atomic_int killed;
    int kill_at;
    int victim;
} killer_t;

static void *killer_main(void *arg)
{
    killer_t *k = arg;
    while (atomic_load(&k->round) < k->kill_at)
        usleep(1000);
    th_cluster_kill(&clu, k->victim);
    atomic_store(&k->killed, 1);
    return NULL;
}

typedef struct {
    int outages;
    int outage_on_victim;
    idem_cluster_errclass_t classes_seen[8];
} outages_t;

/* One batch for tag t: OPS_PER_BATCH scripts, resent whole until every
 * script answered. Until the kill, a WAIT 1 follows and must say that a
 * replica has them (a write a killed primary never replicated is lost
 * with it: the lost-tail case, not this test's); after it, the promoted
 * replica has no replica of its own to wait for. */
static void apply_batch(idem_cluster_t *cl, int t, long long seq0, outages_t *o,
                        const char *victim_addr, atomic_int *killed)
{
    char sum[32], seen[32], seqs[OPS_PER_BATCH][24];
    snprintf(sum, sizeof(sum), "{f%d}:sum", t);
    snprintf(seen, sizeof(seen), "{f%d}:seen", t);
    const char *argv[OPS_PER_BATCH + 1][6];
    idem_cluster_cmd_t cmds[OPS_PER_BATCH + 1];
    for (int i = 0; i < OPS_PER_BATCH; i++) {
        snprintf(seqs[i], sizeof(seqs[i]), "%lld", seq0 + i);
        const char *a[] = {"EVAL", apply_once_lua, "2", sum, seen, seqs[i]};
        memcpy(argv[i], a, sizeof(a));
        cmds[i] = (idem_cluster_cmd_t){.argc = 6, .argv = argv[i]};
    }
    const char *wait[] = {"WAIT", "1", "1000"};
    cmds[OPS_PER_BATCH] = (idem_cluster_cmd_t){.argc = 3, .argv = wait};
    for (int attempt = 0;; attempt++) {
        cr_assert_lt(attempt, 600, "tag %d never written", t);
        int use_wait = killed && !atomic_load(killed);
        size_t n = OPS_PER_BATCH + (use_wait ? 1 : 0);
        redisReply *replies[OPS_PER_BATCH + 1] = {0};
        idem_cluster_err_t err;
        int rc =
            idem_cluster_pipeline(cl, sum, strlen(sum), cmds, n, replies, &err);
        long long acked = -1;
        if (rc == 0) {
            for (int i = 0; i < OPS_PER_BATCH; i++)
                cr_assert_neq(replies[i]->type, REDIS_REPLY_ERROR, "%s",
                              replies[i]->str);
            acked = use_wait ? replies[OPS_PER_BATCH]->integer : 1;
        } else {
            o->outages++;
            o->classes_seen[err.cls & 7] = err.cls;
            if (victim_addr && !strcmp(err.node, victim_addr))
                o->outage_on_victim++;
            cr_assert(err.node[0], "an outage names no node: %s", err.str);
        }
        for (int i = 0; i <= OPS_PER_BATCH; i++)
            if (replies[i])
                freeReplyObject(replies[i]);
        if (acked >= 1)
            return;
        usleep(50 * 1000); /* the caller's backoff */
    }
}

static void check_exact(idem_cluster_t *cl, int tags, long long per_tag)
{
    for (int t = 0; t < tags; t++) {
        char sum[32], seen[32];
        snprintf(sum, sizeof(sum), "{f%d}:sum", t);
        snprintf(seen, sizeof(seen), "{f%d}:seen", t);
        cr_assert_eq(get_int(cl, sum), per_tag, "%s", sum);
        const char *argv[] = {"SCARD", seen};
        idem_cluster_err_t err;
        redisReply *r =
            idem_cluster_command(cl, seen, strlen(seen), 2, argv, NULL, &err);
        cr_assert(r, "%s", err.str);
        cr_assert_eq(int_reply(r), per_tag, "%s", seen);
    }
}

#define FTAGS 24

Test(cluster, failover_resend_exact)
{
    cr_assert_eq(th_cluster_start(&clu, 3, 1), 0, "cluster did not start");
    idem_cluster_t *cl = client(clu.seeds);
    int slot = idem_cluster_keyslot("f0", 2);
    killer_t k = {.kill_at = 5};
    k.victim = th_cluster_owner(&clu, slot);
    cr_assert_geq(k.victim, 0);
    int replica = th_cluster_replica_of(&clu, k.victim);
    cr_assert_geq(replica, 0);
    char victim_addr[64];
    snprintf(victim_addr, sizeof(victim_addr), "127.0.0.1:%d",
             clu.node[k.victim].port);
    atomic_init(&k.round, 0);
    atomic_init(&k.killed, 0);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, killer_main, &k), 0);
    outages_t o = {0};
    const int rounds = 30;
    for (int r = 0; r < rounds; r++) {
        atomic_store(&k.round, r);
        for (int t = 0; t < FTAGS; t++)
            apply_batch(cl, t, (long long)r * OPS_PER_BATCH, &o, victim_addr,
                        &k.killed);
    }
    pthread_join(th, NULL);
    cr_assert_gt(o.outages, 0, "the kill was never noticed");
    cr_assert_gt(o.outage_on_victim, 0, "no outage named the killed node");
    cr_assert_eq(node_of_addr(idem_cluster_slot_node(cl, slot)), replica,
                 "the client does not follow the promoted replica");
    cr_assert_gt(idem_cluster_refreshes(cl), 1);
    check_exact(cl, FTAGS, (long long)rounds * OPS_PER_BATCH);

    /* The killed node comes back as a replica of the promoted one; the
     * writes go on, still exact. */
    cr_assert_eq(th_cluster_restart(&clu, k.victim), 0);
    cr_assert_eq(th_cluster_wait_ok(&clu, 30000), 0);
    for (int r = rounds; r < rounds + 5; r++)
        for (int t = 0; t < FTAGS; t++)
            apply_batch(cl, t, (long long)r * OPS_PER_BATCH, &o, NULL, NULL);
    check_exact(cl, FTAGS, (long long)(rounds + 5) * OPS_PER_BATCH);
    cr_assert_eq(th_cluster_replica_of(&clu, replica), k.victim);
    fprintf(stderr,
            "cluster failover: %d outages (%d on the killed node), "
            "refreshes %" PRIu64 ", all %d writes exact\n",
            o.outages, o.outage_on_victim, idem_cluster_refreshes(cl),
            FTAGS * (rounds + 5) * OPS_PER_BATCH);
    idem_cluster_destroy(cl);
}

/* ---- CLUSTERDOWN ------------------------------------------------------ */

Test(cluster, clusterdown_is_an_outage)
{
    cr_assert_eq(th_cluster_start(&clu, 3, 1), 0, "cluster did not start");
    idem_cluster_t *cl = client(clu.seeds);
    /* A primary and its replica die: its slots have no one, and the
     * cluster (cluster-require-full-coverage) refuses every command. */
    int dead_slot = idem_cluster_keyslot("d", 1);
    int dead = th_cluster_owner(&clu, dead_slot);
    int dead_replica = th_cluster_replica_of(&clu, dead);
    cr_assert_geq(dead_replica, 0);
    int live_slot = -1, live = -1;
    for (int s = 0; s < IDEM_CLUSTER_SLOTS && live < 0; s += 997) {
        int own = th_cluster_owner(&clu, s);
        if (own >= 0 && own != dead) {
            live = own;
            live_slot = s;
        }
    }
    cr_assert_geq(live, 0);
    char live_key[32] = "";
    for (int i = 0; i < 100000 && !live_key[0]; i++) {
        char kk[32];
        snprintf(kk, sizeof(kk), "live%d", i);
        if (idem_cluster_keyslot(kk, strlen(kk)) == live_slot)
            snprintf(live_key, sizeof(live_key), "%s", kk);
    }
    cr_assert(live_key[0]);
    th_cluster_kill(&clu, dead_replica);
    th_cluster_kill(&clu, dead);
    int down = 0;
    for (int i = 0; i < 300 && !down; i++) {
        down = !strcmp(th_cluster_state(&clu, live), "fail");
        if (!down)
            usleep(100 * 1000);
    }
    cr_assert(down, "the cluster never said fail");

    const char *argv[] = {"SET", live_key, "1"};
    idem_cluster_err_t err;
    redisReply *r = idem_cluster_command(cl, live_key, strlen(live_key), 3,
                                         argv, NULL, &err);
    cr_assert_null(r);
    cr_assert_eq(err.cls, IDEM_CLUSTER_ERR_CLUSTERDOWN, "%s", err.str);
    cr_assert_str_eq(err.code, "CLUSTERDOWN");
    cr_assert_eq(node_of_addr(err.node), live, "%s", err.str);

    const char *argv2[] = {"SET", "d", "1"};
    r = idem_cluster_command(cl, "d", 1, 3, argv2, NULL, &err);
    cr_assert_null(r);
    cr_assert_eq(err.cls, IDEM_CLUSTER_ERR_CONNECTION, "%s", err.str);
    cr_assert_eq(node_of_addr(err.node), dead, "%s", err.str);
    cr_assert(strstr(err.str, err.node), "%s", err.str);
    cr_assert_gt(totals(cl).clusterdown, 0);
    cr_assert_gt(totals(cl).conn_errors, 0);
    idem_cluster_destroy(cl);
}

/* ---- TRYAGAIN --------------------------------------------------------- */

typedef struct {
    int slot, from, to, moved;
} finisher_t;

static void *finish_migration(void *arg)
{
    finisher_t *f = arg;
    usleep(100 * 1000);
    f->moved = th_cluster_migrate_keys(&clu, f->slot, f->from, f->to, 100);
    return NULL;
}

static redisReply *mget_ab(idem_cluster_t *cl, idem_cluster_err_t *err)
{
    const char *argv[] = {"MGET", "{m}:a", "{m}:b"};
    return idem_cluster_command(cl, "{m}:a", 5, 3, argv, NULL, err);
}

/* A command on two keys of a slot whose keys are split by a migration is
 * told TRYAGAIN: the client backs off and sends it again; while the split
 * lasts that is an outage after the last round, and once the keys have
 * all moved it is followed (ASK) and answered. */
Test(cluster, tryagain_backs_off_and_resends)
{
    cr_assert_eq(th_cluster_start(&clu, 3, 1), 0, "cluster did not start");
    idem_cluster_t *cl = client(clu.seeds);
    const char *set[] = {"MSET", "{m}:a", "1", "{m}:b", "2"};
    idem_cluster_err_t err;
    redisReply *r = idem_cluster_command(cl, "{m}", 3, 5, set, NULL, &err);
    cr_assert(r, "%s", err.str);
    freeReplyObject(r);
    finisher_t f = {.slot = slot_of_str("{m}"), .to = -1};
    f.from = th_cluster_owner(&clu, f.slot);
    for (int s = 0; s < IDEM_CLUSTER_SLOTS && f.to < 0; s += 1000) {
        int o = th_cluster_owner(&clu, s);
        if (o >= 0 && o != f.from)
            f.to = o;
    }
    cr_assert_geq(f.to, 0);
    cr_assert_eq(th_cluster_migrate_begin(&clu, f.slot, f.from, f.to), 0);
    cr_assert_eq(th_cluster_migrate_keys(&clu, f.slot, f.from, f.to, 1), 1);

    r = mget_ab(cl, &err);
    cr_assert_null(r, "answered while the keys were split");
    cr_assert_eq(err.cls, IDEM_CLUSTER_ERR_REDIRECTS, "%s", err.str);
    uint64_t tries = totals(cl).tryagain;
    cr_assert_geq(tries, 2, "TRYAGAIN not resent");

    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, finish_migration, &f), 0);
    r = mget_ab(cl, &err);
    pthread_join(th, NULL);
    cr_assert_eq(f.moved, 1);
    cr_assert(r, "%s", err.str);
    cr_assert_eq(r->type, REDIS_REPLY_ARRAY);
    cr_assert_eq(r->elements, 2);
    cr_assert_str_eq(r->element[0]->str, "1");
    cr_assert_str_eq(r->element[1]->str, "2");
    freeReplyObject(r);
    cr_assert_gt(totals(cl).ask, 0, "the moved keys were not asked for");
    cr_assert_eq(th_cluster_migrate_end(&clu, f.slot, f.from, f.to), 0);
    idem_cluster_destroy(cl);
}

/* ---- redis-cli --cluster reshard, mid-stream -------------------------- */

/* redis-cli moves 2000 slots (and the keys in them) from one primary to
 * another while a writer's INCR pipelines go on: every INCR answered once
 * with the count so far, the sum exact, and the client follows the slots
 * that moved. */
Test(cluster, reshard_by_redis_cli_exact)
{
    cr_assert_eq(th_cluster_start(&clu, 3, 1), 0, "cluster did not start");
    idem_cluster_t *cl = client(clu.seeds);
    static long long expected[TAGS][KEYS_PER_TAG];
    memset(expected, 0, sizeof(expected));
    int from = th_cluster_owner(&clu, 0), to = -1;
    for (int s = 0; s < IDEM_CLUSTER_SLOTS && to < 0; s += 1000) {
        int o = th_cluster_owner(&clu, s);
        if (o >= 0 && o != from)
            to = o;
    }
    cr_assert(from >= 0 && to >= 0);
    char *fid = th_cluster_cmd(&clu, from, "CLUSTER MYID");
    char *tid = th_cluster_cmd(&clu, to, "CLUSTER MYID");
    cr_assert(fid && tid);
    char addr[32];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", clu.node[from].port);
    int owner_before[TAGS];
    for (int t = 0; t < TAGS; t++) {
        char tag[16];
        snprintf(tag, sizeof(tag), "t%d", t);
        owner_before[t] = th_cluster_owner(&clu, slot_of_str(tag));
    }
    incr_round(cl, expected);
    char *argv[] = {"/usr/bin/redis-cli",
                    "--cluster",
                    "reshard",
                    addr,
                    "--cluster-from",
                    fid,
                    "--cluster-to",
                    tid,
                    "--cluster-slots",
                    "2000",
                    "--cluster-yes",
                    "--cluster-pipeline",
                    "10",
                    NULL};
    pid_t pid = th_spawn(argv, NULL, NULL, NULL);
    cr_assert_gt(pid, 0);
    int rounds = 1, rc = -1;
    while ((rc = th_wait(pid, 0)) < 0) {
        cr_assert_lt(rounds, 100000, "reshard never ended");
        incr_round(cl, expected);
        rounds++;
    }
    cr_assert_eq(rc, 0, "redis-cli --cluster reshard failed");
    incr_round(cl, expected);
    rounds++;
    cr_assert_eq(th_cluster_wait_ok(&clu, 30000), 0);
    int moved_tags = 0;
    for (int t = 0; t < TAGS; t++) {
        char tag[16];
        snprintf(tag, sizeof(tag), "t%d", t);
        int now = th_cluster_owner(&clu, slot_of_str(tag));
        if (now != owner_before[t]) {
            moved_tags++;
            cr_assert_eq(now, to);
        }
    }
    cr_assert_gt(moved_tags, 0, "no tag's slot moved");
    long long sum = 0;
    for (int t = 0; t < TAGS; t++)
        for (int k = 0; k < KEYS_PER_TAG; k++) {
            char key[32];
            snprintf(key, sizeof(key), "{t%d}:k%d", t, k);
            cr_assert_eq(get_int(cl, key), expected[t][k], "%s", key);
            sum += expected[t][k];
        }
    cr_assert_eq(sum, (long long)rounds * TAGS * KEYS_PER_TAG);
    idem_cluster_node_stats_t st = totals(cl);
    cr_assert_gt(st.moved, 0);
    fprintf(stderr,
            "cluster reshard: %d rounds while 2000 slots moved (%d of %d "
            "tags), %lld INCRs exact; moved %" PRIu64 ", ask %" PRIu64
            ", tryagain %" PRIu64 ", refreshes %" PRIu64 "\n",
            rounds, moved_tags, TAGS, sum, st.moved, st.ask, st.tryagain,
            idem_cluster_refreshes(cl));
    free(fid);
    free(tid);
    idem_cluster_destroy(cl);
}

/* ---- AUTH through redisconn ------------------------------------------- */

/* The nodes want a password: the client sends redis.password through the
 * single-Redis connection code to every primary it uses; a wrong one is
 * refused with the reply's code and the node, never the password. */
Test(cluster, auth_through_redisconn)
{
    cr_assert_eq(th_cluster_start_auth(&clu, 3, 1, "s3cret-cluster"), 0,
                 "cluster did not start");
    char errstr[512];
    const char *wrong[] = {"redis.password=not-it", NULL};
    idem_conf_t *bad = conf_load(wrong, errstr, sizeof(errstr));
    cr_assert(bad, "%s", errstr);
    idem_cluster_err_t err;
    idem_cluster_t *cl = idem_cluster_new(bad, clu.seeds, &err);
    cr_assert_null(cl);
    cr_assert_eq(err.cls, IDEM_CLUSTER_ERR_SLOTS, "%s", err.str);
    cr_assert_str_eq(err.code, "WRONGPASS", "%s", err.str);
    cr_assert_geq(node_of_addr(err.node), 0, "%s", err.str);
    cr_assert_null(strstr(err.str, "not-it"), "%s", err.str);
    idem_conf_destroy(bad);

    const char *right[] = {"redis.password=s3cret-cluster", NULL};
    idem_conf_t *good = conf_load(right, errstr, sizeof(errstr));
    cr_assert(good, "%s", errstr);
    cl = idem_cluster_new(good, clu.seeds, &err);
    cr_assert(cl, "%s", err.str);
    /* Keys on every primary: one connection each, all authenticated. */
    int seen[TH_CLUSTER_MAX] = {0}, primaries = 0;
    for (int i = 0; i < 200 && primaries < 3; i++) {
        char key[16];
        snprintf(key, sizeof(key), "a%d", i);
        const char *argv[] = {"SET", key, "v"};
        redisReply *r =
            idem_cluster_command(cl, key, strlen(key), 3, argv, NULL, &err);
        cr_assert(r, "%s", err.str);
        cr_assert_eq(r->type, REDIS_REPLY_STATUS, "%s", r->str);
        freeReplyObject(r);
        int n = node_of_addr(idem_cluster_slot_node(cl, slot_of_str(key)));
        cr_assert_geq(n, 0);
        if (!seen[n]++)
            primaries++;
    }
    cr_assert_eq(primaries, 3);
    idem_cluster_destroy(cl);
    idem_conf_destroy(good);
}

/* ---- one request across the primaries -------------------------------- */

/* A tag ("{t<n>}") whose slot node i owns. */
static void tag_on(int i, char *tag, size_t size)
{
    for (int n = 0; n < 100000; n++) {
        snprintf(tag, size, "{t%d}", n);
        if (th_cluster_owner(&clu, slot_of_str(tag)) == i)
            return;
    }
    cr_assert_fail("no tag on node %d", i);
}

typedef struct {
    char key_b[48], key_c[48], list_a[48];
    atomic_int seen; /* node b's and c's SETs ran before a's reply came */
} blocker_t;

/* Waits (at most 10 s) until the commands for nodes b and c have run,
 * then releases node a's BLPOP. */
static void *release_a(void *arg)
{
    blocker_t *b = arg;
    for (int waited = 0; waited < 10000 && !b->seen; waited += 10) {
        char *vb = th_cluster_cmd(&clu, 1, "GET %s", b->key_b);
        char *vc = th_cluster_cmd(&clu, 2, "GET %s", b->key_c);
        if (vb && vc && !strcmp(vb, "1") && !strcmp(vc, "1"))
            b->seen = 1;
        free(vb);
        free(vc);
        if (!b->seen)
            usleep(10 * 1000);
    }
    free(th_cluster_cmd(&clu, 0, "RPUSH %s go", b->list_a));
    return NULL;
}

/* idem_cluster_pipeline_slots writes every node's pipeline before it
 * reads any reply: node a's first command blocks (BLPOP) until a thread
 * has seen node b's and c's commands run, which a client that reads a's
 * replies before writing to b would never let happen (the thread gives
 * up after 10 s). One request per command on its node. Then node c is
 * killed: its command alone fails, naming it; a's and b's are answered. */
Test(cluster, slots_pipeline_writes_every_node_before_reading)
{
    cr_assert_eq(th_cluster_start(&clu, 3, 0), 0, "cluster did not start");
    for (int i = 0; i < 3; i++)
        free(th_cluster_cmd(&clu, i,
                            "CONFIG SET cluster-require-full-coverage no"));
    char ta[32], tb[32], tc[32];
    tag_on(0, ta, sizeof(ta));
    tag_on(1, tb, sizeof(tb));
    tag_on(2, tc, sizeof(tc));
    blocker_t bl = {0};
    snprintf(bl.list_a, sizeof(bl.list_a), "%slist", ta);
    snprintf(bl.key_b, sizeof(bl.key_b), "%sk", tb);
    snprintf(bl.key_c, sizeof(bl.key_c), "%sk", tc);
    /* Seeds in node order: the client reads node 0 (a) first. */
    idem_cluster_t *cl = client(clu.seeds);
    const char *blpop[] = {"BLPOP", bl.list_a, "5"};
    const char *setb[] = {"SET", bl.key_b, "1"};
    const char *setc[] = {"SET", bl.key_c, "1"};
    idem_cluster_cmd_t cmds[3] = {{.argc = 3, .argv = blpop},
                                  {.argc = 3, .argv = setb},
                                  {.argc = 3, .argv = setc}};
    int slots[3] = {slot_of_str(bl.list_a), slot_of_str(bl.key_b),
                    slot_of_str(bl.key_c)};
    redisReply *rep[3] = {NULL, NULL, NULL};
    idem_cluster_err_t errs[3], first;
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, release_a, &bl), 0);
    int rc = idem_cluster_pipeline_slots(cl, cmds, slots, 3, rep, errs, &first);
    pthread_join(th, NULL);
    cr_assert_eq(rc, 0, "%s", first.str);
    cr_expect(bl.seen, "node b's and c's commands waited for node a's reply");
    cr_assert_eq(rep[0]->type, REDIS_REPLY_ARRAY, "BLPOP timed out");
    cr_expect_str_eq(rep[0]->element[1]->str, "go");
    for (int i = 0; i < 3; i++) {
        freeReplyObject(rep[i]);
        rep[i] = NULL;
    }
    for (size_t i = 0; i < idem_cluster_node_count(cl); i++) {
        idem_cluster_node_stats_t st;
        const char *addr = idem_cluster_node_stats(cl, i, &st);
        cr_expect_leq(st.requests, 2, "%s: %" PRIu64 " requests", addr,
                      st.requests); /* CLUSTER SLOTS on a seed, one command */
    }

    th_cluster_kill(&clu, 2);
    const char *seta[] = {"SET", bl.list_a, "2"};
    const char *setb2[] = {"SET", bl.key_b, "2"};
    const char *setc2[] = {"SET", bl.key_c, "2"};
    idem_cluster_cmd_t again[3] = {{.argc = 3, .argv = setc2},
                                   {.argc = 3, .argv = seta},
                                   {.argc = 3, .argv = setb2}};
    int slots2[3] = {slots[2], slots[0], slots[1]};
    rc = idem_cluster_pipeline_slots(cl, again, slots2, 3, rep, errs, &first);
    cr_assert_eq(rc, -1, "a command to a dead node was answered");
    char dead[32];
    snprintf(dead, sizeof(dead), "127.0.0.1:%d", clu.node[2].port);
    cr_expect(!rep[0], "the dead node's command has a reply");
    cr_expect_eq(errs[0].cls, IDEM_CLUSTER_ERR_CONNECTION, "%s", errs[0].str);
    cr_expect_str_eq(errs[0].node, dead);
    cr_expect_str_eq(first.node, dead);
    for (int i = 1; i < 3; i++) {
        cr_assert(rep[i], "command %d: %s", i, errs[i].str);
        cr_expect_eq(rep[i]->type, REDIS_REPLY_STATUS);
        cr_expect_eq(errs[i].cls, IDEM_CLUSTER_ERR_NONE);
        freeReplyObject(rep[i]);
    }
    char *v = th_cluster_cmd(&clu, 1, "GET %s", bl.key_b);
    cr_expect_str_eq(v ? v : "", "2");
    free(v);
    idem_cluster_destroy(cl);
}
