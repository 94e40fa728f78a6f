/* test_clusterchunk (it): one partition chunk (the store and partstate
 * path a member takes) against a real 3-primary Redis Cluster while its
 * partition's slot is half migrated (MIGRATING on its owner, IMPORTING on
 * another primary, some of its keys already moved): the chunk writes
 * nothing on either node and is an outage; once the migration ends, the
 * same chunk sent again is applied once. Two halves: an undeclared key
 * moved (the ledger's applied counter, written after the balances: the
 * script's EXISTS read of it fails before any write) and a declared key
 * moved (the positions hash: Redis answers TRYAGAIN before the script
 * runs; the client waits it out, then reports an outage). */
#include "conf/conf.h"
#include "fixture_redisconn.h"
#include "harness_cluster.h"
#include "partrig.h"
#include "redis/cluster.h"
#include "redis/partstate.h"
#include "redis/store.h"

#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static th_cluster_t clu;
static idem_conf_t *conf;
static idem_store_t *store;
static idem_partstate_t *ps;

typedef th_trec_t trec_t;

static void fini(void)
{
    idem_partstate_destroy(ps);
    ps = NULL;
    idem_store_destroy(store);
    store = NULL;
    idem_conf_destroy(conf);
    conf = NULL;
    th_cluster_stop(&clu);
}

TestSuite(clusterchunk, .fini = fini, .timeout = 120);

#define TAG "{g:t:0}"

static const trec_t first[] = {
    {"id-1", "m-1", "EUR", "u1", "150"},
    {"id-2", "m-2", "EUR", "u2", "200"},
    {"id-3", "m-3", "USD", "u1", "-25"},
};

static const trec_t second[] = {
    {"id-4", "m-4", "EUR", "u1", "10"},
    {"id-5", "m-5", "USD", "u2", "7"},
};

/* Runs a chunk of t:part (records recs[n], marks seeded from seed0) from
 * position expect to expect + n. */
static int chunk_of(int32_t part, int64_t epoch, int64_t expect,
                    const trec_t *recs, size_t n, int seed0,
                    idem_partstate_result_t *res, char *err, size_t errsz)
{
    return th_partrig_chunk(ps, part, epoch, expect, expect + (int64_t)n, recs,
                            n, seed0, res, NULL, err, errsz);
}

static int chunk(int64_t epoch, int64_t expect, const trec_t *recs, size_t n,
                 int seed0, idem_partstate_result_t *res, char *err,
                 size_t errsz)
{
    return chunk_of(0, epoch, expect, recs, n, seed0, res, err, errsz);
}

/* A store with the ledger's effect and the partition layout on the
 * cluster at `nodes` (more configuration in more[], NULL-ended). */
static void store_on(const char *nodes, const char *const *more)
{
    char np[512], err[512] = "";
    snprintf(np, sizeof(np), "redis.cluster.nodes=%s", nodes);
    char *sets[16] = {np,
                      "group.id=g",
                      "handler=ledger",
                      "dedup.scope=partition",
                      "input.topics=t",
                      "dlq.topic=d",
                      "kafka.bootstrap.servers=127.0.0.1:1",
                      "dedup.ttl.seconds=86400"};
    size_t n = 8;
    for (; more && more[n - 8] && n < 16; n++)
        sets[n] = (char *)more[n - 8];
    conf = idem_conf_load(NULL, NULL, sets, n, err, sizeof(err));
    cr_assert(conf, "%s", err);
    th_partrig_start(conf, &store, &ps);
    cr_assert(idem_store_cluster(store));
}

/* Partition part's epoch bumped and its first position (0) written. */
static int64_t partition_begin(int32_t part)
{
    char err[512] = "";
    int64_t epoch = 0;
    cr_assert_eq(
        idem_partstate_epoch_bump(ps, "t", part, &epoch, err, sizeof(err)), 0,
        "%s", err);
    idem_store_pos_t pos = {.topic = "t", .partition = part, .offset = 0};
    idem_posval_init(&pos.val, "c1");
    cr_assert_eq(idem_store_positions_save(store, &pos, 1, err, sizeof(err)), 0,
                 "%s", err);
    return epoch;
}

/* The cluster, a store on it with the ledger's effect, partition t:0's
 * epoch, its first position and a first chunk applied (so its slot holds
 * the epoch, the positions hash, a window key and the ledger shards).
 * The epoch in *epoch; the slot's owner in *from, another primary in *to. */
static void start(int64_t *epoch, int *slot, int *from, int *to)
{
    quiet();
    cr_assert_eq(th_cluster_start(&clu, 3, 0), 0, "cluster did not start");
    store_on(clu.seeds, NULL);
    *epoch = partition_begin(0);
    char err[512] = "";
    idem_partstate_result_t res[3];
    cr_assert_eq(chunk(*epoch, 0, first, 3, 1, res, err, sizeof(err)), 0, "%s",
                 err);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(res[i].outcome, IDEM_PARTSTATE_APPLIED);

    char *s = th_cluster_cmd(&clu, 0, "CLUSTER KEYSLOT %s", TAG);
    cr_assert(s);
    *slot = atoi(s);
    free(s);
    *from = th_cluster_owner(&clu, *slot);
    cr_assert_geq(*from, 0);
    *to = (*from + 1) % 3;
    char *n = th_cluster_cmd(&clu, *from, "CLUSTER COUNTKEYSINSLOT %d", *slot);
    cr_assert(n);
    /* epoch, positions, one window, EUR and USD shards, applied */
    cr_assert_geq(atoi(n), 6, "keys in the slot: %s", n);
    free(n);
}

/* Everything node i holds in slot: each key with its type and value (a
 * string by its length and, when short, its bytes; a hash by its fields),
 * one a line. Caller frees. */
static char *slot_dump(int i, int slot)
{
    char *keys = th_cluster_cmd(&clu, i, "CLUSTER GETKEYSINSLOT %d 1000", slot);
    cr_assert(keys);
    size_t cap = 4096, len = 0;
    char *out = calloc(1, cap);
    char *save = NULL;
    for (char *k = strtok_r(keys, "\n", &save); k;
         k = strtok_r(NULL, "\n", &save)) {
        char *type = th_cluster_cmd(&clu, i, "TYPE %s", k);
        char *v = NULL;
        if (type && !strcmp(type, "hash"))
            v = th_cluster_cmd(&clu, i, "HGETALL %s", k);
        else if (type && !strcmp(type, "string")) {
            char *l = th_cluster_cmd(&clu, i, "STRLEN %s", k);
            v = l && atoi(l) < 40 ? th_cluster_cmd(&clu, i, "GET %s", k) : NULL;
            if (!v) {
                v = l;
                l = NULL;
            }
            free(l);
        }
        size_t need =
            strlen(k) + (type ? strlen(type) : 0) + (v ? strlen(v) : 0) + 8;
        if (len + need >= cap) {
            cap = (len + need) * 2;
            out = realloc(out, cap);
        }
        len += (size_t)snprintf(out + len, cap - len, "%s %s %s\n", k,
                                type ? type : "?", v ? v : "");
        free(type);
        free(v);
    }
    free(keys);
    return out;
}

/* The half-migrated slot: the chunk is an outage, and neither node's
 * part of the slot changed; then the migration ends and the same chunk
 * is applied once. */
static void chunk_waits_for_the_migration(int64_t epoch, int slot, int from,
                                          int to)
{
    char *before_from = slot_dump(from, slot), *before_to = slot_dump(to, slot);
    cr_assert_neq(strlen(before_to), 0, "no key of the slot moved");
    char err[512] = "";
    idem_partstate_result_t res[2];
    int rc = chunk(epoch, 3, second, 2, 10, res, err, sizeof(err));
    cr_assert_eq(rc, -1, "a chunk on a half-moved slot answered %d", rc);
    cr_log_info("the chunk's outage: %s", err);
    char *after_from = slot_dump(from, slot), *after_to = slot_dump(to, slot);
    cr_expect_str_eq(after_from, before_from, "the migrating node was written");
    cr_expect_str_eq(after_to, before_to, "the importing node was written");
    free(before_from);
    free(before_to);
    free(after_from);
    free(after_to);

    int k;
    while ((k = th_cluster_migrate_keys(&clu, slot, from, to, 10)) > 0)
        ;
    cr_assert_eq(k, 0);
    cr_assert_eq(th_cluster_migrate_end(&clu, slot, from, to), 0);
    cr_assert_eq(th_cluster_owner(&clu, slot), to);

    rc = chunk(epoch, 3, second, 2, 10, res, err, sizeof(err));
    cr_assert_eq(rc, 0, "after the migration: %d %s", rc, err);
    for (int i = 0; i < 2; i++)
        cr_expect_eq(res[i].outcome, IDEM_PARTSTATE_APPLIED);
    /* Sent once more (as after a lost reply): refused by its position. */
    rc = chunk(epoch, 3, second, 2, 10, res, err, sizeof(err));
    cr_expect_eq(rc, IDEM_PARTSTATE_POSITION, "%d %s", rc, err);

    /* Applied once, all on the new owner. */
    char *v = th_cluster_cmd(&clu, to, "HGET idemproc:ledger:EUR" TAG " u1");
    cr_expect_str_eq(v ? v : "", "160");
    free(v);
    v = th_cluster_cmd(&clu, to, "HGET idemproc:ledger:EUR" TAG " u2");
    cr_expect_str_eq(v ? v : "", "200");
    free(v);
    v = th_cluster_cmd(&clu, to, "HGET idemproc:ledger:USD" TAG " u2");
    cr_expect_str_eq(v ? v : "", "7");
    free(v);
    v = th_cluster_cmd(&clu, to, "GET idemproc:ledger:applied" TAG);
    cr_expect_str_eq(v ? v : "", "5");
    free(v);
    v = th_cluster_cmd(&clu, from, "CLUSTER COUNTKEYSINSLOT %d", slot);
    cr_expect_str_eq(v ? v : "", "0");
    free(v);
}

/* Slot half moved with `key` (NULL: the partition's window key) already
 * on the importing node; with
 * layout_key set, the chunk's declared layout-slot key (never written by
 * idemproc) is created first, so every declared key is on the migrating
 * node and Redis runs the script there. */
static void half_moved(const char *key, int layout_key)
{
    int64_t epoch;
    int slot, from, to;
    start(&epoch, &slot, &from, &to);
    if (layout_key) {
        char *o = th_cluster_cmd(&clu, from, "SET idemproc:st" TAG ":layout x");
        cr_assert_str_eq(o ? o : "", "OK");
        free(o);
    }
    char *window = NULL;
    if (!key) { /* the window key the first chunk wrote */
        window = th_cluster_cmd(&clu, from, "KEYS idemproc:st" TAG ":w*");
        cr_assert(window && *window && !strchr(window, '\n'), "%s",
                  window ? window : "no window key");
        key = window;
    }
    cr_assert_eq(th_cluster_migrate_begin(&clu, slot, from, to), 0);
    char *m = th_cluster_cmd(&clu, from, "MIGRATE 127.0.0.1 %d %s 0 5000",
                             clu.node[to].port, key);
    free(window);
    cr_assert_str_eq(m ? m : "", "OK");
    free(m);
    chunk_waits_for_the_migration(epoch, slot, from, to);
}

/* The ledger's applied counter (not in the script's KEYS) moved: the
 * chunk's declared layout-slot key does not exist, so Redis answers
 * TRYAGAIN (keys of a migrating slot only partly there) before the
 * script runs: the chunk waits, then is an outage. */
Test(clusterchunk, undeclared_key_moved_writes_nothing_then_applies_once)
{
    half_moved("idemproc:ledger:applied" TAG, 0);
}

/* The positions hash (in the script's KEYS) moved: TRYAGAIN as well. */
Test(clusterchunk, declared_key_moved_writes_nothing_then_applies_once)
{
    half_moved("idemproc:pos" TAG, 0);
}

/* The second rule: were every declared key still on the migrating node,
 * Redis would run the script there; the applied counter, written after
 * the balances, is gone: the script's EXISTS read of it fails before its
 * first write (without that read, the balances are written and the
 * counter's INCRBY fails: a double effect at the retry). */
Test(clusterchunk, script_run_on_half_moved_slot_reads_before_writing)
{
    half_moved("idemproc:ledger:applied" TAG, 1);
}

/* The same with the window key moved: the STRLEN that finds the open part
 * of the window is that key's read before the first write (without it,
 * the balances are written and the marks' APPEND fails). */
Test(clusterchunk, script_run_on_half_moved_slot_reads_the_window_key)
{
    half_moved(NULL, 1);
}

/* TLS: every node serves clients on a tls-port, the cluster bus and the
 * replication over TLS (tls-cluster, tls-replication); the seeds name
 * only TLS ports and the store reads the slot map over TLS (a node's
 * plain port in the map would fail the handshake). Chunks of nine
 * partitions, spread over the three primaries, apply once; sent again
 * they are refused by their position; the applied counters, summed over
 * the primaries through the store (as verify reads them), are exact. */
Test(clusterchunk, store_over_tls_exact, .timeout = 120)
{
    quiet();
    cr_assert_eq(th_cluster_start_tls(&clu, 3, 1), 0, "cluster did not start");
    char ca[600];
    snprintf(ca, sizeof(ca), "redis.tls.ca.file=%s", clu.tls_ca);
    const char *more[] = {"redis.url=rediss://127.0.0.1:1/0", ca, NULL};
    store_on(clu.tls_seeds, more);
    char err[512] = "";
    int used[TH_CLUSTER_MAX] = {0};
    for (int32_t p = 0; p < 9; p++) {
        int64_t epoch = partition_begin(p);
        idem_partstate_result_t res[3];
        int rc =
            chunk_of(p, epoch, 0, first, 3, 100 * p, res, err, sizeof(err));
        cr_assert_eq(rc, 0, "partition %d: %d %s", p, rc, err);
        for (int i = 0; i < 3; i++)
            cr_expect_eq(res[i].outcome, IDEM_PARTSTATE_APPLIED);
        rc = chunk_of(p, epoch, 0, first, 3, 100 * p, res, err, sizeof(err));
        cr_expect_eq(rc, IDEM_PARTSTATE_POSITION, "partition %d: %d %s", p, rc,
                     err);
        /* The shard on its primary, read on the plain port. */
        char *slot = th_cluster_cmd(&clu, 0, "CLUSTER KEYSLOT {g:t:%d}", p);
        cr_assert(slot);
        int owner = th_cluster_owner(&clu, atoi(slot));
        free(slot);
        cr_assert(owner >= 0 && owner < clu.n);
        char *v = th_cluster_cmd(&clu, owner,
                                 "GET idemproc:ledger:applied{g:t:%d}", p);
        cr_expect_str_eq(v ? v : "", "3", "partition %d", p);
        free(v);
        used[owner] = 1;
    }
    int primaries = 0;
    for (int i = 0; i < clu.n; i++)
        primaries += used[i];
    cr_expect_eq(primaries, 3, "the nine tags on %d primaries", primaries);
    int64_t applied = -1;
    cr_assert_eq(idem_store_applied_get(store, &applied, err, sizeof(err)), 0,
                 "%s", err);
    cr_expect_eq(applied, 27);
    /* The replicas attached over TLS (tls-replication) and hold the shards. */
    for (int i = 0; i < clu.n; i++) {
        char *role = th_cluster_cmd(&clu, i, "ROLE");
        int replica = role && !strncmp(role, "slave\n", 6);
        free(role);
        if (!replica)
            continue;
        char *info = th_cluster_cmd(&clu, i, "INFO replication");
        cr_expect(info && strstr(info, "master_link_status:up"), "%s",
                  info ? info : "no answer");
        free(info);
    }
}

/* ---- a request across the primaries; per-node checks ----------------- */

/* A partition of topic t whose tag's slot node i owns (not in avoid[0..n)). */
static int32_t part_on(int node, const int32_t *avoid, size_t n)
{
    for (int32_t p = 0; p < 4096; p++) {
        char tag[64];
        snprintf(tag, sizeof(tag), "{g:t:%" PRId32 "}", p);
        int taken = 0;
        for (size_t k = 0; k < n; k++)
            taken |= avoid[k] == p;
        if (!taken && th_cluster_owner(
                          &clu, idem_cluster_keyslot(tag, strlen(tag))) == node)
            return p;
    }
    cr_assert_fail("no partition on node %d", node);
    return -1;
}

/* An integer field of node i's INFO (section sec); -1 when absent. */
static long long info_int(int i, const char *sec, const char *field)
{
    char *s = th_cluster_cmd(&clu, i, "INFO %s", sec);
    cr_assert(s, "node %d did not answer INFO", i);
    char pat[64];
    snprintf(pat, sizeof(pat), "%s:", field);
    const char *f = strstr(s, pat);
    long long v = f ? atoll(f + strlen(pat)) : -1;
    free(s);
    return v;
}

/* The ledger's EUR shard of user u of partition p on node i, as text. */
static char *eur_of(int i, int32_t p, const char *u)
{
    return th_cluster_cmd(&clu, i,
                          "HGET idemproc:ledger:EUR{g:t:%" PRId32 "} %s", p, u);
}

/* Chunks of three partitions on the three primaries in one request; the
 * first one's primary is down (no replica): its chunk alone is an outage,
 * naming the node, and the other two apply (before, the request stopped
 * at the first failed chunk and sent nothing after it). */
Test(clusterchunk, one_node_down_fails_its_chunk_alone)
{
    quiet();
    cr_assert_eq(th_cluster_start(&clu, 3, 0), 0, "cluster did not start");
    /* The live nodes keep serving their slots while one is down. */
    for (int i = 0; i < 3; i++)
        free(th_cluster_cmd(&clu, i,
                            "CONFIG SET cluster-require-full-coverage no"));
    store_on(clu.seeds, NULL);
    int32_t part[3];
    int64_t epoch[3];
    for (int i = 0; i < 3; i++) {
        part[i] = part_on(i, part, (size_t)i);
        epoch[i] = partition_begin(part[i]);
    }
    /* Not the home node (the layout key's: every store call routes
     * there first). */
    const char *lk = "idemproc:layout:g";
    int home = th_cluster_owner(&clu, idem_cluster_keyslot(lk, strlen(lk)));
    int dead = home == 0 ? 1 : 0;
    th_cluster_kill(&clu, dead);
    idem_partstate_chunk_t ch[3];
    idem_partstate_result_t res[3][3], *rp[3];
    const void *recs[3];
    uint8_t marks[3][3][16];
    idem_store_pos_t pos[3];
    /* The dead node's chunk first in the request. */
    int order[3] = {dead, dead == 0 ? 1 : 0, 2};
    int32_t opart[3];
    int64_t oepoch[3];
    for (int i = 0; i < 3; i++) {
        opart[i] = part[order[i]];
        oepoch[i] = epoch[order[i]];
    }
    memcpy(part, opart, sizeof(part));
    memcpy(epoch, oepoch, sizeof(epoch));
    for (int i = 0; i < 3; i++) {
        for (int r = 0; r < 3; r++) {
            recs[r] = &first[r];
            th_mark_of(marks[i][r], 100 * i + r);
        }
        pos[i] =
            (idem_store_pos_t){.topic = "t", .partition = part[i], .offset = 3};
        idem_posval_init(&pos[i].val, "c1");
        ch[i] =
            (idem_partstate_chunk_t){.topic = "t",
                                     .partition = part[i],
                                     .epoch = epoch[i],
                                     .expect_offset = 0,
                                     .newpos = &pos[i],
                                     .recs = recs,
                                     .marks = (const uint8_t(*)[16])marks[i],
                                     .n = 3};
        rp[i] = res[i];
    }
    int64_t windows[3];
    int rcs[3];
    char err[512] = "";
    int rc =
        idem_partstate_chunks(ps, ch, 3, rp, windows, rcs, err, sizeof(err));
    cr_assert_eq(rc, 0, "the request failed whole: %s", err);
    cr_assert_eq(rcs[0], IDEM_PARTSTATE_OUTAGE, "chunk on the dead node: %d",
                 rcs[0]);
    char addr[32];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", clu.node[dead].port);
    cr_expect(strstr(err, addr), "the outage does not name %s: %s", addr, err);
    for (int i = 1; i < 3; i++) {
        cr_assert_eq(rcs[i], 0, "chunk on node %d: %d (%s)", order[i], rcs[i],
                     err);
        for (int r = 0; r < 3; r++)
            cr_expect_eq(res[i][r].outcome, IDEM_PARTSTATE_APPLIED);
        char *v = eur_of(order[i], part[i], "u1");
        cr_expect_str_eq(v ? v : "", "150", "partition %" PRId32, part[i]);
        free(v);
    }
    /* Sent again, the applied chunks are refused by their position. */
    rc = idem_partstate_chunks(ps, &ch[1], 2, &rp[1], &windows[1], &rcs[1], err,
                               sizeof(err));
    cr_assert_eq(rc, 0, "%s", err);
    cr_expect_eq(rcs[1], IDEM_PARTSTATE_POSITION);
    cr_expect_eq(rcs[2], IDEM_PARTSTATE_POSITION);
}

static const char *const aof_args[] = {"--appendonly", "yes", "--appendfsync",
                                       "always", NULL};

/* A member's store (the guards run sets) on the cluster. */
static void member_store_on(const char *nodes)
{
    store_on(nodes, NULL);
    idem_store_guard_eviction(store);
    idem_store_guard_aof(store);
}

/* With AOF on every primary: the member rewrites each primary's AOF
 * before its first write there; a primary killed and restarted from its
 * AOF (a new run_id) is rewritten again before the member's next write
 * to it (before, cluster nodes skipped the gate). */
Test(clusterchunk, aof_rewrite_on_each_primary_before_its_first_write,
     .timeout = 180)
{
    quiet();
    cr_assert_eq(th_cluster_start_args(&clu, 3, 0, aof_args), 0,
                 "cluster did not start");
    for (int i = 0; i < 3; i++)
        free(th_cluster_cmd(&clu, i,
                            "CONFIG SET cluster-require-full-coverage no"));
    long long before[3];
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(info_int(i, "persistence", "aof_enabled"), 1);
        before[i] = info_int(i, "persistence", "aof_rewrites");
    }
    member_store_on(clu.seeds);
    int32_t part[3];
    int64_t epoch[3];
    for (int i = 0; i < 3; i++) {
        part[i] = part_on(i, part, (size_t)i);
        epoch[i] = partition_begin(part[i]);
    }
    for (int i = 0; i < 3; i++)
        cr_expect_gt(info_int(i, "persistence", "aof_rewrites"), before[i],
                     "node %d: no AOF rewrite before the member's writes", i);

    /* Node 1 killed and restarted from its AOF: a new server. */
    char *old_run = th_cluster_cmd(&clu, 1, "INFO server");
    cr_assert(old_run);
    th_cluster_kill(&clu, 1);
    cr_assert_eq(th_cluster_restart(&clu, 1), 0, "node 1 did not restart");
    cr_assert_eq(th_cluster_wait_ok(&clu, 30000), 0, "cluster not ok");
    long long after_load = info_int(1, "persistence", "aof_rewrites");
    char *v = eur_of(1, part[1], "u1");
    cr_assert(v);
    free(v);
    free(old_run);

    char err[512] = "";
    idem_partstate_result_t res[3];
    int rc = -1;
    /* The first call may meet the dead connection: resent once by the
     * client; an outage is retried as the loop would. */
    for (int tries = 0; tries < 20 && rc; tries++) {
        rc = chunk_of(part[1], epoch[1], 0, first, 3, 1, res, err, sizeof(err));
        if (rc)
            usleep(100 * 1000);
    }
    cr_assert_eq(rc, 0, "chunk after the restart: %s", err);
    cr_expect_gt(info_int(1, "persistence", "aof_rewrites"), after_load,
                 "the restarted node was written without an AOF rewrite");
    char *s = th_cluster_cmd(&clu, 1, "INFO persistence");
    cr_expect(s && strstr(s, "aof_last_bgrewrite_status:ok"), "%s", s);
    free(s);
    v = eur_of(1, part[1], "u1");
    cr_expect_str_eq(v ? v : "", "150");
    free(v);
}

/* An evicting maxmemory-policy on one primary: the member is refused
 * when it first connects there, with a message naming that node; the
 * others are not refused for it. */
Test(clusterchunk, evicting_primary_is_refused_naming_it)
{
    quiet();
    cr_assert_eq(th_cluster_start(&clu, 3, 0), 0, "cluster did not start");
    member_store_on(clu.seeds);
    int32_t part[3];
    for (int i = 0; i < 3; i++)
        part[i] = part_on(i, part, (size_t)i);
    /* Every node met once, all noeviction. */
    for (int i = 0; i < 3; i++)
        partition_begin(part[i]);
    char err[512] = "";
    cr_assert_eq(idem_store_check(store, 0, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(idem_store_refused(store, err, sizeof(err)), 0);

    /* The periodic check reads every primary, not one. */
    free(th_cluster_cmd(&clu, 2, "CONFIG SET maxmemory-policy allkeys-lru"));
    cr_assert_eq(idem_store_check(store, 0, err, sizeof(err)), -1,
                 "an evicting primary passed the check");
    cr_assert_eq(idem_store_refused(store, err, sizeof(err)), 1);
    char node[32];
    snprintf(node, sizeof(node), "127.0.0.1:%d", clu.node[2].port);
    cr_expect(strstr(err, node), "the refusal does not name %s: %s", node, err);
    cr_expect(strstr(err, "allkeys-lru"), "%s", err);

    /* A new member: refused when it first connects to that node. */
    idem_partstate_destroy(ps);
    idem_store_destroy(store);
    idem_conf_destroy(conf);
    member_store_on(clu.seeds);
    int64_t epoch = 0;
    err[0] = '\0';
    cr_assert_eq(
        idem_partstate_epoch_bump(ps, "t", part[2], &epoch, err, sizeof(err)),
        -1, "an evicting primary was written to");
    cr_assert_eq(idem_store_refused(store, err, sizeof(err)), 1, "%s", err);
    cr_expect(strstr(err, node), "the refusal does not name %s: %s", node, err);
}

static int count_marks(const uint8_t *marks, size_t n, int64_t window,
                       void *opaque)
{
    (void)marks;
    (void)window;
    *(size_t *)opaque += n;
    return 0;
}

static int load_of(int32_t part, size_t *marks, char *err, size_t errsz)
{
    *marks = 0;
    size_t pieces = 0;
    return idem_partstate_load(ps, "t", part, 0, count_marks, marks, &pieces,
                               err, errsz);
}

/* The group's hash key lives on its own node (no tag). Lost with that
 * node while a partition's marks live on elsewhere, a member that starts
 * then makes a new key: the partition's copy of the old key (written at
 * its first load) refuses the load, naming both keys, instead of a table
 * that finds none of the marks (each record applied again). A partition
 * that was never loaded takes the new key; restoring the group's key from
 * the copy lets the partition load, every mark found. */
Test(clusterchunk, lost_group_key_refuses_the_partitions_marked_with_the_old)
{
    quiet();
    cr_assert_eq(th_cluster_start(&clu, 3, 0), 0, "cluster did not start");
    store_on(clu.seeds, NULL);
    char err[512] = "";
    uint8_t k1[16], k2[16];
    cr_assert_eq(idem_partstate_hashkey(ps, k1, err, sizeof(err)), 0, "%s",
                 err);
    const char *gkey = "idemproc:dedupkey:g";
    int gnode =
        th_cluster_owner(&clu, idem_cluster_keyslot(gkey, strlen(gkey)));
    int32_t pa = part_on((gnode + 1) % 3, NULL, 0);
    int32_t pb = part_on((gnode + 2) % 3, &pa, 1);
    int64_t epoch = partition_begin(pa);
    size_t marks = 0;
    cr_assert_eq(load_of(pa, &marks, err, sizeof(err)), 0, "%s", err);
    idem_partstate_result_t res[3];
    cr_assert_eq(chunk_of(pa, epoch, 0, first, 3, 1, res, err, sizeof(err)), 0,
                 "%s", err);

    /* The group's key lost (its node kept nothing), a new member. */
    free(th_cluster_cmd(&clu, gnode, "DEL %s", gkey));
    idem_partstate_destroy(ps);
    idem_store_destroy(store);
    idem_conf_destroy(conf);
    store_on(clu.seeds, NULL);
    cr_assert_eq(idem_partstate_hashkey(ps, k2, err, sizeof(err)), 0, "%s",
                 err);
    cr_assert(memcmp(k1, k2, 16), "a new random key equals the old one");
    err[0] = '\0';
    cr_assert_eq(load_of(pa, &marks, err, sizeof(err)), -1,
                 "partition %d loaded with a key its marks were not made with",
                 (int)pa);
    cr_expect(strstr(err, "holds another hash key"), "%s", err);
    cr_expect(strstr(err, gkey), "%s", err);
    partition_begin(pb);
    cr_assert_eq(load_of(pb, &marks, err, sizeof(err)), 0, "%s", err);

    /* The operator restores the group's key from the partition's copy. */
    char copy[128];
    snprintf(copy, sizeof(copy), "idemproc:st{g:t:%d}:hashkey", (int)pa);
    free(th_cluster_cmd(&clu, gnode, "DEL %s", gkey));
    int cnode =
        th_cluster_owner(&clu, idem_cluster_keyslot(copy, strlen(copy)));
    redisContext *c = redisConnect("127.0.0.1", clu.node[cnode].port);
    cr_assert(c && !c->err);
    redisReply *r = redisCommand(c, "GET %s", copy);
    cr_assert(r && r->type == REDIS_REPLY_STRING && r->len == 16);
    cr_expect_eq(memcmp(r->str, k1, 16), 0, "the copy is not the old key");
    redisFree(c);
    c = redisConnect("127.0.0.1", clu.node[gnode].port);
    cr_assert(c && !c->err);
    redisReply *w = redisCommand(c, "SET %s %b", gkey, r->str, (size_t)16);
    cr_assert(w && w->type == REDIS_REPLY_STATUS, "SET of the group's key");
    freeReplyObject(w);
    freeReplyObject(r);
    redisFree(c);
    idem_partstate_destroy(ps);
    idem_store_destroy(store);
    idem_conf_destroy(conf);
    store_on(clu.seeds, NULL);
    cr_assert_eq(idem_partstate_hashkey(ps, k2, err, sizeof(err)), 0, "%s",
                 err);
    cr_assert_eq(memcmp(k1, k2, 16), 0);
    cr_assert_eq(load_of(pa, &marks, err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(marks, 3, "marks found after the restore: %zu", marks);
}
