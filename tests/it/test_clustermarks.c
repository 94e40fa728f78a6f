/* test_clustermarks (it): the external handlers' claim and mark
 * (idem_store_claim, idem_store_mark_done) on a real Redis Cluster of 3
 * primaries and 3 replicas: each identity's mark key on its own slot,
 * found on the primary that owns that slot; lease, done mark and the
 * verdicts as on one Redis; a call across a slot half migrated; WAIT on
 * every primary after the marks, counted per node. */
#include "conf/conf.h"
#include "fixture_redisconn.h"
#include "harness_cluster.h"
#include "redis/cluster.h"
#include "redis/store.h"
#include "redis/storeread.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static th_cluster_t clu;
static idem_conf_t *conf;
static idem_store_t *store;

#define N 200

static idem_envelope_t envs[N];
static const idem_envelope_t *ep[N];
static idem_store_result_t res[N];

static void fini(void)
{
    idem_store_destroy(store);
    store = NULL;
    idem_conf_destroy(conf);
    conf = NULL;
    th_cluster_stop(&clu);
}

TestSuite(clustermarks, .fini = fini, .timeout = 120);

/* A store for handler=forward on the cluster (more: one more key=value,
 * or NULL), and N records with identities id-0..id-199. */
static void start(const char *more)
{
    quiet();
    cr_assert_eq(th_cluster_start(&clu, 3, 1), 0, "cluster did not start");
    char np[512], err[512] = "";
    snprintf(np, sizeof(np), "redis.cluster.nodes=%s", clu.seeds);
    char *sets[] = {np,
                    "group.id=g",
                    "handler=forward",
                    "output.topic=o",
                    "input.topics=t",
                    "dlq.topic=d",
                    "kafka.bootstrap.servers=127.0.0.1:1",
                    (char *)more};
    conf = idem_conf_load(NULL, NULL, sets, more ? 8 : 7, err, sizeof(err));
    cr_assert(conf, "%s", err);
    store = idem_store_new(conf, NULL);
    cr_assert(idem_store_cluster(store));
    for (size_t i = 0; i < N; i++) {
        memset(&envs[i], 0, sizeof(envs[i]));
        envs[i].identity_len = (size_t)snprintf(
            envs[i].identity, sizeof(envs[i].identity), "id-%zu", i);
        envs[i].message_id_len = (size_t)snprintf(
            envs[i].message_id, sizeof(envs[i].message_id), "m-%zu", i);
        ep[i] = &envs[i];
    }
}

/* The node index that holds key (EXISTS on every primary); -1 none, -2
 * more than one. */
static int key_home(const char *key)
{
    int home = -1;
    for (int i = 0; i < clu.n; i++) {
        if (!th_cluster_is_primary(&clu, i))
            continue;
        char *v = th_cluster_cmd(&clu, i, "EXISTS %s", key);
        int here = v && atoi(v) == 1;
        free(v);
        if (here)
            home = home == -1 ? i : -2;
    }
    return home;
}

/* Keys of slot on node i (CLUSTER COUNTKEYSINSLOT: no redirection). */
static int slot_keys(int i, int slot)
{
    char *v = th_cluster_cmd(&clu, i, "CLUSTER COUNTKEYSINSLOT %d", slot);
    int n = v ? atoi(v) : -1;
    free(v);
    return n;
}

static char *get_key(const char *key)
{
    int owner = th_cluster_owner(&clu, idem_cluster_keyslot(key, strlen(key)));
    cr_assert_geq(owner, 0);
    return th_cluster_cmd(&clu, owner, "GET %s", key);
}

static void count_done(const idem_storeread_mark_t *m, void *opaque)
{
    *(long *)opaque += m->done;
}

Test(clustermarks, claim_and_mark_each_identity_on_its_own_slot)
{
    start(NULL);
    char err[512] = "";
    cr_assert_eq(
        idem_store_claim(store, "lease:a:1", ep, N, res, err, sizeof(err)), 0,
        "%s", err);
    for (size_t i = 0; i < N; i++)
        cr_assert_eq(res[i].mark, IDEM_MARK_NEW, "record %zu: %d", i,
                     res[i].mark);
    /* Every mark key lives on the primary of its own slot, and the
     * identities spread over all three primaries. */
    int per_node[TH_CLUSTER_MAX] = {0};
    for (size_t i = 0; i < N; i++) {
        char key[300];
        snprintf(key, sizeof(key), "idemproc:dedup:g:%.200s", envs[i].identity);
        int slot = idem_cluster_keyslot(key, strlen(key));
        int home = key_home(key);
        cr_assert_eq(home, th_cluster_owner(&clu, slot), "%s on node %d", key,
                     home);
        per_node[home]++;
        char *v = get_key(key);
        char want[300];
        snprintf(want, sizeof(want), "lease:a:1:%.200s", envs[i].message_id);
        cr_assert_str_eq(v ? v : "(nil)", want);
        free(v);
    }
    int nodes = 0;
    for (int i = 0; i < clu.n; i++)
        nodes += per_node[i] > 0;
    cr_expect_eq(nodes, 3, "the marks landed on %d primaries", nodes);
    /* Another member is told each is leased; the same member again at a
     * later epoch takes its own lease. */
    cr_assert_eq(
        idem_store_claim(store, "lease:b:1", ep, N, res, err, sizeof(err)), 0,
        "%s", err);
    for (size_t i = 0; i < N; i++)
        cr_assert_eq(res[i].mark, IDEM_MARK_BUSY);
    cr_assert_eq(
        idem_store_claim(store, "lease:a:2", ep, N, res, err, sizeof(err)), 0,
        "%s", err);
    for (size_t i = 0; i < N; i++)
        cr_assert_eq(res[i].mark, IDEM_MARK_NEW);
    /* Marked: done marks, and a new claim sees duplicates with the
     * message id of the first. Another owner's mark is "lost". */
    cr_assert_eq(
        idem_store_mark_done(store, "lease:b:1", ep, 10, res, err, sizeof(err)),
        0, "%s", err);
    for (size_t i = 0; i < 10; i++)
        cr_assert_eq(res[i].mark, IDEM_MARK_LOST);
    cr_assert_eq(
        idem_store_mark_done(store, "lease:a:2", ep, N, res, err, sizeof(err)),
        0, "%s", err);
    for (size_t i = 0; i < N; i++)
        cr_assert_eq(res[i].mark, IDEM_MARK_NEW);
    cr_assert_eq(
        idem_store_claim(store, "lease:b:1", ep, N, res, err, sizeof(err)), 0,
        "%s", err);
    for (size_t i = 0; i < N; i++) {
        cr_assert_eq(res[i].mark, IDEM_MARK_DONE);
        cr_assert_str_eq(res[i].prior_mid, envs[i].message_id);
    }
    char *v = get_key("idemproc:dedup:g:id-7");
    cr_expect_str_eq(v ? v : "(nil)", "done:m-7");
    free(v);
    /* verify's reader finds every done mark, over every primary. */
    idem_storeread_t *rd = idem_storeread_new(conf);
    long done = 0;
    cr_assert_eq(
        idem_storeread_marks(rd, "g", count_done, &done, err, sizeof(err)), 0,
        "%s", err);
    idem_storeread_destroy(rd);
    cr_expect_eq(done, N);
}

/* Two records of one identity in one claim: the second is "again", as on
 * one Redis (one identity's records go in one call, whatever the slot
 * order). */
Test(clustermarks, same_identity_twice_in_a_call_is_again)
{
    start(NULL);
    envs[150] = envs[3];
    envs[150].message_id_len = (size_t)snprintf(
        envs[150].message_id, sizeof(envs[150].message_id), "m-again");
    char err[512] = "";
    cr_assert_eq(
        idem_store_claim(store, "lease:a:1", ep, N, res, err, sizeof(err)), 0,
        "%s", err);
    cr_expect_eq(res[3].mark, IDEM_MARK_NEW);
    cr_expect_eq(res[150].mark, IDEM_MARK_AGAIN);
}

/* A slot half migrated (MIGRATING on its owner, IMPORTING elsewhere, its
 * key already moved): the claim follows ASK to the key, the mark too; a
 * key of that slot not moved yet is served where it is. */
Test(clustermarks, slot_half_migrated_follows_ask)
{
    start(NULL);
    char err[512] = "";
    cr_assert_eq(
        idem_store_claim(store, "lease:a:1", ep, N, res, err, sizeof(err)), 0,
        "%s", err);
    const char *key = "idemproc:dedup:g:id-0";
    int slot = idem_cluster_keyslot(key, strlen(key));
    int from = th_cluster_owner(&clu, slot), to = -1;
    for (int i = 0; i < clu.n && to < 0; i++)
        if (i != from && th_cluster_is_primary(&clu, i))
            to = i;
    cr_assert_geq(to, 0);
    cr_assert_eq(th_cluster_migrate_begin(&clu, slot, from, to), 0);
    cr_assert_eq(th_cluster_migrate_keys(&clu, slot, from, to, 100), 1);
    cr_assert_eq(slot_keys(from, slot), 0);
    cr_assert_eq(slot_keys(to, slot), 1);
    cr_assert_eq(
        idem_store_mark_done(store, "lease:a:1", ep, N, res, err, sizeof(err)),
        0, "%s", err);
    for (size_t i = 0; i < N; i++)
        cr_assert_eq(res[i].mark, IDEM_MARK_NEW);
    cr_expect_eq(slot_keys(from, slot), 0);
    cr_expect_eq(slot_keys(to, slot), 1);
    cr_assert_eq(th_cluster_migrate_end(&clu, slot, from, to), 0);
    char *v = th_cluster_cmd(&clu, to, "GET %s", key);
    cr_expect_str_eq(v ? v : "(nil)", "done:m-0");
    free(v);
    cr_assert_eq(
        idem_store_claim(store, "lease:b:1", ep, N, res, err, sizeof(err)), 0,
        "%s", err);
    for (size_t i = 0; i < N; i++)
        cr_assert_eq(res[i].mark, IDEM_MARK_DONE);
}

/* redis.wait.replicas after the marks: one replica per primary
 * acknowledges 1; asking 2 is an outage naming a node and the class. */
Test(clustermarks, wait_on_every_primary_counted_per_node)
{
    start("redis.wait.replicas=1");
    char err[512] = "";
    cr_assert_eq(
        idem_store_claim(store, "lease:a:1", ep, N, res, err, sizeof(err)), 0,
        "%s", err);
    cr_assert_eq(
        idem_store_mark_done(store, "lease:a:1", ep, N, res, err, sizeof(err)),
        0, "%s", err);
    idem_store_destroy(store);
    idem_conf_destroy(conf);
    char np[512];
    snprintf(np, sizeof(np), "redis.cluster.nodes=%s", clu.seeds);
    char *sets[] = {np,
                    "group.id=g",
                    "handler=forward",
                    "output.topic=o",
                    "input.topics=t",
                    "dlq.topic=d",
                    "kafka.bootstrap.servers=127.0.0.1:1",
                    "redis.wait.replicas=2",
                    "redis.wait.timeout.ms=100"};
    conf = idem_conf_load(NULL, NULL, sets, 9, err, sizeof(err));
    cr_assert(conf, "%s", err);
    store = idem_store_new(conf, NULL);
    cr_assert_eq(
        idem_store_claim(store, "lease:a:2", ep, N, res, err, sizeof(err)), 0,
        "%s", err);
    err[0] = '\0';
    cr_assert_eq(
        idem_store_mark_done(store, "lease:a:2", ep, N, res, err, sizeof(err)),
        -1);
    cr_expect(strstr(err, "WAIT") && strstr(err, "1 of 2 replicas") &&
                  strstr(err, "127.0.0.1:"),
              "%s", err);
}
