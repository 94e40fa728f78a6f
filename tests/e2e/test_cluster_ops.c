/* test_cluster_ops: the operations side of Redis Cluster mode
 * (redis.cluster.nodes) on a real cluster started by the tests: the
 * members' heartbeats and effect fingerprints live on the cluster (so a
 * member with other settings is noticed there); a primary and its replica
 * killed (CLUSTERDOWN for their slots) pause the member, /readyz names the
 * node, the per-node metrics count it, nothing is dead-lettered, and the
 * member resumes exact once both are back. */
#include "harness.h"
#include "harness_cluster.h"

#include <criterion/criterion.h>
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
