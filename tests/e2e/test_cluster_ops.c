/* test_cluster_ops: the operations side of Redis Cluster mode
 * (redis.cluster.nodes) on a real cluster started by the tests: the
 * members' heartbeats and effect fingerprints live on the cluster (so a
 * member with other settings is noticed there); a primary and its replica
 * killed (their slots have no primary) pause the member, /readyz names
 * the dead primary, the per-node metrics count it, nothing is dead-lettered,
 * and the member resumes exact once both are back. */
#include "harness.h"
#include "harness_cluster.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* At file scope (see test_pipeline.c): the suite's .fini needs them. */
static th_stack_t stk;
static th_cluster_t clu;

static void ops_fini(void)
{
    th_stack_cleanup();
    th_cluster_stop(&clu);
}

TestSuite(cluster_ops, .fini = ops_fini);

static char nodes_prop[512];

static const char *const *cluster_props(void)
{
    snprintf(nodes_prop, sizeof(nodes_prop), "redis.cluster.nodes=%s",
             clu.seeds);
    static const char *props[8];
    props[0] = "dedup.scope=partition";
    props[1] = "handler=ledger";
    props[2] = "batch.max.messages=50";
    props[3] = nodes_prop;
    props[4] = NULL;
    return props;
}

/* The node that serves `key`'s slot. */
static int key_owner(const char *key)
{
    char *out = th_cluster_cmd(&clu, 0, "CLUSTER KEYSLOT %s", key);
    int slot = out ? atoi(out) : -1;
    free(out);
    cr_assert_geq(slot, 0);
    return th_cluster_owner(&clu, slot);
}

/* An integer reply of `cmd` on node i, -1 when none. */
static long node_int(int i, const char *cmd, const char *key)
{
    char *out = th_cluster_cmd(&clu, i, "%s %s", cmd, key);
    long v = out ? strtol(out, NULL, 10) : -1;
    free(out);
    return v;
}

/* The value of the series (name and labels exactly) on port's /metrics,
 * -1 when absent. */
static long scrape(int port, const char *series)
{
    char *body = NULL;
    long v = -1;
    if (th_http_get(port, "/metrics", &body) == 200 && body) {
        size_t l = strlen(series);
        for (const char *p = body; (p = strstr(p, series)); p++)
            if ((p == body || p[-1] == '\n') && p[l] == ' ') {
                v = strtol(p + l + 1, NULL, 10);
                break;
            }
    }
    free(body);
    return v;
}

static long wait_scrape(int port, const char *series, long want, int timeout_ms)
{
    long v = -1;
    for (int waited = 0; waited < timeout_ms; waited += 100) {
        if ((v = scrape(port, series)) == want)
            break;
        usleep(100 * 1000);
    }
    return v;
}

static void listen_set(char *buf, size_t size, int *port)
{
    *port = th_free_port();
    snprintf(buf, size, "http.listen=127.0.0.1:%d", *port);
}

Test(cluster_ops, heartbeats_and_fingerprints_live_on_the_cluster,
     .timeout = 180)
{
    cr_assert_eq(th_cluster_start(&clu, 3, 0), 0, "cluster did not start");
    cr_assert_eq(th_stack_start(&stk, 3, cluster_props()), 0);
    char l1[64], l2[64];
    int p1, p2;
    listen_set(l1, sizeof(l1), &p1);
    listen_set(l2, sizeof(l2), &p2);
    const char *const s1[] = {l1, NULL};
    /* Another identity source: a different effect-defining setting. */
    const char *const s2[] = {l2, "envelope.identity=value:/meta/event_id",
                              NULL};
    pid_t m1 = th_stack_member(&stk, "m1", s1);
    pid_t m2 = th_stack_member(&stk, "m2", s2);
    const char *gauge = "idemproc_group_config_mismatch";
    cr_expect_eq(wait_scrape(p1, gauge, 1, 60000), 1, "m1:\n%s",
                 th_stack_member_log(&stk, "m1"));
    cr_expect_eq(wait_scrape(p2, gauge, 1, 60000), 1, "m2:\n%s",
                 th_stack_member_log(&stk, "m2"));
    /* Both entries are on the node of the group's tag, nothing on the
     * stack's own Redis (redis.url is not used in cluster mode). */
    int owner = key_owner("idemproc:members{test-group}");
    cr_assert_geq(owner, 0);
    cr_expect_eq(node_int(owner, "ZCARD", "idemproc:members{test-group}"), 2);
    cr_expect_eq(node_int(owner, "HLEN", "idemproc:memberconf{test-group}"), 2);
    const char *const ex[] = {"EXISTS", "idemproc:members:test-group", NULL};
    char *out = th_redis_cli(&stk.redis, ex);
    cr_expect_str_eq(out ? out : "?", "0", "a heartbeat went to redis.url");
    free(out);
    cr_expect_eq(th_stack_log_count(&stk, "m1",
                                    "member heartbeat in redis "
                                    "failed"),
                 0, "%s", th_stack_member_log(&stk, "m1"));
    /* A member that stops removes its entry. */
    cr_expect_eq(th_stop(m2, 15000), 0);
    cr_expect_eq(node_int(owner, "ZCARD", "idemproc:members{test-group}"), 1);
    cr_expect_eq(th_stop(m1, 15000), 0);
    th_stack_stop(&stk);
    th_cluster_stop(&clu);
}

/* The slot of partition p's tag, as the cluster computes it. */
static int tag_slot(int p)
{
    char *out =
        th_cluster_cmd(&clu, 0, "CLUSTER KEYSLOT {test-group:payments:%d}", p);
    int slot = out ? atoi(out) : -1;
    free(out);
    return slot;
}

static pthread_t producer;
static atomic_int produced; /* 0 while running, 2 + rc once ended */

static void *produce_main(void *arg)
{
    (void)arg;
    const char *traffic[] = {"--count", "8000",   "--duplicates",
                             "0.1",     "--seed", "26",
                             "--rate",  "1000",   NULL};
    atomic_store(&produced, 2 + th_stack_produce(&stk, traffic));
    return NULL;
}

/* The primary owning partition 0's tag and its replica killed mid-stream,
 * then restarted: with a snapshot each (`snapshot`), or empty. */
static void down_then_back(int snapshot)
{
    cr_assert_eq(th_cluster_start(&clu, 3, 1), 0, "cluster did not start");
    cr_assert_eq(th_stack_start(&stk, 9, cluster_props()), 0);
    char l1[64];
    int port;
    listen_set(l1, sizeof(l1), &port);
    const char *const s1[] = {l1, NULL};
    atomic_init(&produced, 0);
    cr_assert_eq(pthread_create(&producer, NULL, produce_main, NULL), 0);
    pid_t m1 = th_stack_member(&stk, "m1", s1);
    int victim = th_cluster_owner(&clu, tag_slot(0));
    cr_assert_geq(victim, 0);
    /* The case this test is for: the group's hash key is lost too. */
    if (!snapshot)
        cr_assert_eq(key_owner("idemproc:dedupkey:test-group"), victim,
                     "the group's dedup key is not on the victim");
    int replica = th_cluster_replica_of(&clu, victim);
    cr_assert_geq(replica, 0);
    char node[64];
    snprintf(node, sizeof(node), "127.0.0.1:%d", clu.node[victim].port);
    char series[160];
    snprintf(series, sizeof(series),
             "idemproc_redis_cluster_requests_total{node=\"%s\"}", node);
    /* Going: the victim has served the member's requests. */
    for (int w = 0; w < 60000 && scrape(port, series) <= 0; w += 100)
        usleep(100 * 1000);
    cr_assert_gt(scrape(port, series), 0, "m1 never wrote to %s:\n%s", node,
                 th_stack_member_log(&stk, "m1"));
    /* The nodes run without persistence (harness_cluster): with a
     * snapshot each, they come back with their state as of it (what the
     * member wrote after it is a lost tail, rewound); without, empty. */
    for (int k = 0; snapshot && k < 2; k++) {
        char *ok = th_cluster_cmd(&clu, k ? victim : replica, "SAVE");
        cr_assert(ok && !strcmp(ok, "OK"), "SAVE: %s", ok ? ok : "no reply");
        free(ok);
    }
    th_cluster_kill(&clu, replica);
    th_cluster_kill(&clu, victim);
    cr_assert_eq(atomic_load(&produced), 0,
                 "the traffic ended before the outage: nothing tested");
    /* The member pauses; /readyz names the dead primary. */
    char *body = NULL;
    int st = th_wait_unready(port, node, 60000, &body);
    cr_expect_eq(st, 503, "readyz: %d %s", st, body ? body : "");
    cr_expect(body && strstr(body, node), "readyz does not name %s: %s", node,
              body ? body : "");
    free(body);
    /* The member's chunks go to the dead primary (the map the live nodes
     * give still names it): counted as its connection errors. (CLUSTERDOWN
     * comes from the live nodes only to commands routed there.) */
    snprintf(series, sizeof(series),
             "idemproc_redis_cluster_connection_errors_total{node=\"%s\"}",
             node);
    cr_expect_gt(scrape(port, series), 0, "%s", series);
    /* Both back: the member resumes; nothing was dead-lettered. */
    cr_assert_eq(th_cluster_restart(&clu, victim), 0);
    cr_assert_eq(th_cluster_restart(&clu, replica), 0);
    cr_assert_eq(th_cluster_wait_ok(&clu, 60000), 0, "cluster not ok");
    pthread_join(producer, NULL);
    cr_assert_eq(atomic_load(&produced), 2, "the producer failed");
    TH_ASSERT_VERIFIED(&stk, 1, NULL, 180000);
    if (!snapshot)
        cr_expect_gt(th_stack_log_count(&stk, "m1",
                                        "redis lost the position of a "
                                        "partition"),
                     0, "the lost positions were not noticed");
    cr_expect_eq(th_topic_size(stk.broker.bootstrap, "payments.dlq"), 0);
    int ready = 0;
    for (int w = 0; w < 30000 && !ready; w += 100) {
        char *b = NULL;
        ready = th_http_get(port, "/readyz", &b) == 200;
        free(b);
        if (!ready)
            usleep(100 * 1000);
    }
    cr_expect(ready, "m1 not ready again");
    /* promtool accepts the scrape with the per-node series. */
    char *scr = NULL;
    cr_assert_eq(th_http_get(port, "/metrics", &scr), 200);
    char path[600];
    snprintf(path, sizeof(path), "%s/scrape.txt", stk.dir);
    th_write_file(path, scr);
    free(scr);
    char cmd[800];
    snprintf(cmd, sizeof(cmd), "promtool check metrics < %s", path);
    char *argv[] = {"/bin/sh", "-c", cmd, NULL};
    char *out = NULL, *err = NULL;
    cr_expect_eq(th_run(argv, &out, &err, 30000), 0, "%s%s", out, err);
    free(out);
    free(err);
    cr_expect_eq(th_stop(m1, 15000), 0);
    th_stack_stop(&stk);
    th_cluster_stop(&clu);
}

Test(cluster_ops, primary_and_replica_down_pause_name_the_node_then_exact,
     .timeout = 300)
{
    down_then_back(1);
}

/* Both come back empty: the partitions of that node lost everything, and
 * the group's dedup hash key (<prefix>dedupkey:<group>, a key of its own
 * slot) may have been on it. The member writes back the key it holds, so
 * the marks on the live nodes are still found: the records it reads again
 * there (their positions lag their effects by a request) are duplicates,
 * and the lost partitions are read again from the first position of the
 * assignment. Before that, a fresh key was written: 56 balances too high. */
Test(cluster_ops, primary_and_replica_back_empty_never_apply_twice,
     .timeout = 300)
{
    down_then_back(0);
}
