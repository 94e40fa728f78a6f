/* test_clusterwait (it): redis.wait.replicas after the partition chunks
 * on a real 3+3 Redis Cluster (redis/partstate.c, chunks_cluster_wait):
 * one request's chunks on the three primaries pass WAIT 1 while every
 * replica runs; with one replica stopped (SIGSTOP), that primary's chunk
 * alone fails naming the node (it was applied there, but not on N
 * replicas), the other two stand, and the failed chunk sent again is
 * refused by its position: nothing is applied twice. */
#include "conf/conf.h"
#include "fixture_redisconn.h"
#include "harness_cluster.h"
#include "partrig.h"
#include "redis/cluster.h"
#include "redis/partstate.h"
#include "redis/store.h"

#include <criterion/criterion.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static th_cluster_t clu;
static idem_conf_t *conf;
static idem_store_t *store;
static idem_partstate_t *ps;
static pid_t stopped; /* a replica under SIGSTOP, 0 for none */

static void fini(void)
{
    if (stopped > 0)
        kill(stopped, SIGCONT);
    stopped = 0;
    idem_partstate_destroy(ps);
    ps = NULL;
    idem_store_destroy(store);
    store = NULL;
    idem_conf_destroy(conf);
    conf = NULL;
    th_cluster_stop(&clu);
}

TestSuite(clusterwait, .fini = fini, .timeout = 180);

static const th_trec_t first[] = {
    {"id-1", "m-1", "EUR", "u1", "150"},
    {"id-2", "m-2", "EUR", "u2", "200"},
    {"id-3", "m-3", "USD", "u1", "-25"},
};

static const th_trec_t second[] = {
    {"id-4", "m-4", "EUR", "u1", "10"},
    {"id-5", "m-5", "EUR", "u2", "7"},
    {"id-6", "m-6", "USD", "u2", "1"},
};

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

/* 1 when node i's INFO replication lists a replica in state online. */
static int replica_online(int i)
{
    char *s = th_cluster_cmd(&clu, i, "INFO replication");
    int on = s && strstr(s, "state=online") != NULL;
    free(s);
    return on;
}

/* The ledger's EUR shard of user u of partition p on node i, as text
 * (caller frees). */
static char *eur_of(int i, int32_t p, const char *u)
{
    return th_cluster_cmd(&clu, i,
                          "HGET idemproc:ledger:EUR{g:t:%" PRId32 "} %s", p, u);
}

typedef struct {
    int32_t part[3];
    int64_t epoch[3];
    int node[3];
    idem_partstate_chunk_t ch[3];
    idem_partstate_result_t res[3][3], *rp[3];
    const void *recs[3][3];
    uint8_t marks[3][3][16];
    idem_store_pos_t pos[3];
    int64_t windows[3];
    int rcs[3];
} request_t;

/* One chunk per partition of q (records recs[3], marks seeded from seed),
 * each from position expect to expect + 3. */
static void request_fill(request_t *q, const th_trec_t *recs, int seed,
                         int64_t expect)
{
    for (int i = 0; i < 3; i++) {
        for (int r = 0; r < 3; r++) {
            q->recs[i][r] = &recs[r];
            th_mark_of(q->marks[i][r], seed + 100 * i + r);
        }
        q->pos[i] = (idem_store_pos_t){
            .topic = "t", .partition = q->part[i], .offset = expect + 3};
        idem_posval_init(&q->pos[i].val, "c1");
        q->ch[i] =
            (idem_partstate_chunk_t){.topic = "t",
                                     .partition = q->part[i],
                                     .epoch = q->epoch[i],
                                     .expect_offset = expect,
                                     .newpos = &q->pos[i],
                                     .recs = q->recs[i],
                                     .marks = (const uint8_t(*)[16])q->marks[i],
                                     .n = 3};
        q->rp[i] = q->res[i];
    }
}

Test(clusterwait, wait_passes_then_a_short_node_fails_its_chunk_alone)
{
    quiet();
    cr_assert_eq(th_cluster_start(&clu, 3, 1), 0, "cluster did not start");
    /* Every primary with its replica online before the first WAIT. */
    int primary[3], replica[3], np = 0;
    for (int i = 0; i < clu.n && np < 3; i++)
        if (th_cluster_is_primary(&clu, i))
            primary[np++] = i;
    cr_assert_eq(np, 3);
    for (int k = 0; k < 3; k++) {
        int ok = 0;
        for (int t = 0; t < 300 && !ok; t++) {
            ok = replica_online(primary[k]);
            if (!ok)
                usleep(100 * 1000);
        }
        cr_assert(ok, "node %d has no replica online", primary[k]);
        replica[k] = th_cluster_replica_of(&clu, primary[k]);
        cr_assert_geq(replica[k], 0);
    }
    char np_[512], err[512] = "";
    snprintf(np_, sizeof(np_), "redis.cluster.nodes=%s", clu.seeds);
    char *sets[] = {np_,
                    "group.id=g",
                    "handler=ledger",
                    "dedup.scope=partition",
                    "input.topics=t",
                    "dlq.topic=d",
                    "kafka.bootstrap.servers=127.0.0.1:1",
                    "dedup.ttl.seconds=86400",
                    "redis.wait.replicas=1",
                    "redis.wait.timeout.ms=500"};
    conf = idem_conf_load(NULL, NULL, sets, sizeof(sets) / sizeof(sets[0]), err,
                          sizeof(err));
    cr_assert(conf, "%s", err);
    th_partrig_start(conf, &store, &ps);

    request_t q;
    memset(&q, 0, sizeof(q));
    for (int k = 0; k < 3; k++) {
        q.node[k] = primary[k];
        q.part[k] = part_on(primary[k], q.part, (size_t)k);
        cr_assert_eq(idem_partstate_epoch_bump(ps, "t", q.part[k], &q.epoch[k],
                                               err, sizeof(err)),
                     0, "%s", err);
        th_partrig_first_position(store, q.part[k], 0);
    }
    /* Every replica runs: WAIT 1 passes on each node. */
    request_fill(&q, first, 1, 0);
    int rc = idem_partstate_chunks(ps, q.ch, 3, q.rp, q.windows, q.rcs, err,
                                   sizeof(err));
    cr_assert_eq(rc, 0, "%s", err);
    for (int k = 0; k < 3; k++) {
        cr_assert_eq(q.rcs[k], 0, "chunk on node %d: %d (%s)", q.node[k],
                     q.rcs[k], err);
        for (int r = 0; r < 3; r++)
            cr_expect_eq(q.res[k][r].outcome, IDEM_PARTSTATE_APPLIED);
    }

    /* The second primary's replica stopped: its WAIT comes back short. */
    int shortk = 1;
    stopped = clu.node[replica[shortk]].pid;
    cr_assert_eq(kill(stopped, SIGSTOP), 0);
    request_fill(&q, second, 10, 3);
    rc = idem_partstate_chunks(ps, q.ch, 3, q.rp, q.windows, q.rcs, err,
                               sizeof(err));
    cr_assert_eq(rc, 0, "the request failed whole: %s", err);
    cr_assert_eq(q.rcs[shortk], IDEM_PARTSTATE_OUTAGE,
                 "chunk on the node with its replica stopped: %d",
                 q.rcs[shortk]);
    char addr[32];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d",
             clu.node[primary[shortk]].port);
    cr_expect(strstr(err, addr), "the error does not name %s: %s", addr, err);
    cr_expect(strstr(err, "0 of 1 replicas"), "%s", err);
    for (int k = 0; k < 3; k++) {
        if (k == shortk)
            continue;
        cr_expect_eq(q.rcs[k], 0, "chunk on node %d: %d", q.node[k], q.rcs[k]);
        char *v = eur_of(q.node[k], q.part[k], "u1");
        cr_expect_str_eq(v ? v : "", "160", "partition %" PRId32, q.part[k]);
        free(v);
    }
    /* The short node's chunk was applied on its primary; sent again (the
     * records' retry), its position refuses it: applied once. */
    cr_assert_eq(kill(stopped, SIGCONT), 0);
    stopped = 0;
    rc = idem_partstate_chunks(ps, &q.ch[shortk], 1, &q.rp[shortk],
                               &q.windows[shortk], &q.rcs[shortk], err,
                               sizeof(err));
    cr_assert_eq(rc, 0, "%s", err);
    cr_expect_eq(q.rcs[shortk], IDEM_PARTSTATE_POSITION, "%d (%s)",
                 q.rcs[shortk], err);
    char *v = eur_of(q.node[shortk], q.part[shortk], "u1");
    cr_expect_str_eq(v ? v : "", "160", "applied twice or not at all");
    free(v);
}
