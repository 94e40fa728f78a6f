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
#include "redis/partstate.h"
#include "redis/store.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
