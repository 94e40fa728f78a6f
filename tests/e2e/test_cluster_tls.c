/* test_cluster_tls: ledger members over TLS on a real Redis Cluster of 3
 * primaries and 3 replicas (tls-port on every node, tls-cluster yes: the
 * cluster bus and the slot map's ports are TLS; tls-replication yes),
 * the client side from redis.url's rediss:// scheme and the test CA
 * (redis.tls.ca.file), with redis.wait.replicas=1 after the partition
 * chunks: traffic with duplicates and poison, a primary owning tags
 * kill -9'd mid-stream, its replica promoted, the killed node back as a
 * replica, and `verify` (over TLS too) exact. The same seeds with the
 * plain scheme are refused: check-config --connect fails naming a node,
 * and a member never applies anything (not ready, naming the outage). */
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

static void cluster_tls_fini(void)
{
    th_stack_cleanup();
    th_cluster_stop(&clu);
}

TestSuite(cluster_tls, .fini = cluster_tls_fini);

#define PARTS 6

static char nodes_prop[512], ca_prop[600], listen_prop[64];

/* Cluster mode over TLS (scheme "rediss" or, to see it refused, "redis"),
 * the seeds the nodes' TLS ports. */
static const char *const *tls_props(const char *scheme)
{
    static char url_prop[64];
    snprintf(nodes_prop, sizeof(nodes_prop), "redis.cluster.nodes=%s",
             clu.tls_seeds);
    snprintf(ca_prop, sizeof(ca_prop), "redis.tls.ca.file=%s", clu.tls_ca);
    snprintf(url_prop, sizeof(url_prop), "redis.url=%s://127.0.0.1:1/0",
             scheme);
    snprintf(listen_prop, sizeof(listen_prop), "http.listen=127.0.0.1:%d",
             th_free_port());
    static const char *props[12];
    int n = 0;
    props[n++] = "handler=ledger";
    props[n++] = "dedup.scope=partition";
    props[n++] = "batch.max.messages=50";
    props[n++] = "redis.wait.replicas=1";
    props[n++] = nodes_prop;
    props[n++] = url_prop;
    if (!strcmp(scheme, "rediss"))
        props[n++] = ca_prop;
    props[n] = NULL;
    return props;
}

/* Sum over the live primaries of the sharded ledger:applied counters
 * (read on the nodes' plain ports). */
static long cluster_applied(void)
{
    long sum = 0;
    for (int i = 0; i < clu.n; i++) {
        if (!th_cluster_is_primary(&clu, i))
            continue;
        char *keys = th_cluster_cmd(&clu, i, "KEYS idemproc:ledger:applied*");
        for (char *k = keys ? strtok(keys, "\n") : NULL; k;
             k = strtok(NULL, "\n")) {
            char *v = th_cluster_cmd(&clu, i, "GET %s", k);
            sum += v ? atol(v) : 0;
            free(v);
        }
        free(keys);
    }
    return sum;
}

static int tag_slot(int p)
{
    char *out =
        th_cluster_cmd(&clu, 0, "CLUSTER KEYSLOT {test-group:payments:%d}", p);
    int slot = out ? atoi(out) : -1;
    free(out);
    return slot;
}

static pthread_t producer;
static atomic_int produced; /* 1 once the producer ended, 2 + rc */

static void *produce_main(void *arg)
{
    (void)arg;
    const char *traffic[] = {"--count",
                             "16000",
                             "--duplicates",
                             "0.1",
                             "--poison",
                             "0.01",
                             "--too-large-bytes",
                             "5000",
                             "--seed",
                             "31",
                             "--rate",
                             "2000",
                             NULL};
    int rc = th_stack_produce(&stk, traffic);
    atomic_store(&produced, 2 + rc);
    return NULL;
}

Test(cluster_tls, members_over_tls_through_a_failover_exact, .timeout = 300)
{
    cr_assert_eq(th_cluster_start_tls(&clu, 3, 1), 0,
                 "TLS cluster did not start");
    cr_assert_eq(th_stack_start(&stk, PARTS, tls_props("rediss")), 0);
    atomic_init(&produced, 0);
    cr_assert_eq(pthread_create(&producer, NULL, produce_main, NULL), 0);
    pid_t m1 = th_stack_member(&stk, "m1", NULL);
    pid_t m2 = th_stack_member(&stk, "m2", NULL);
    int waited = 0;
    while (cluster_applied() < 500 && waited < 90000) {
        usleep(50 * 1000);
        waited += 50;
    }
    cr_assert_geq(cluster_applied(), 500, "members never got going:\n%s\n%s",
                  th_stack_member_log(&stk, "m1"),
                  th_stack_member_log(&stk, "m2"));

    int victim = th_cluster_owner(&clu, tag_slot(0));
    cr_assert_geq(victim, 0);
    int replica = th_cluster_replica_of(&clu, victim);
    cr_assert_geq(replica, 0);
    th_cluster_kill(&clu, victim);
    cr_assert_eq(th_cluster_wait_ok(&clu, 30000), 0, "no failover");
    cr_assert_eq(th_cluster_owner(&clu, tag_slot(0)), replica);
    cr_assert_eq(atomic_load(&produced), 0,
                 "the traffic ended before the failover: nothing tested");
    /* Back as a replica (over TLS: tls-replication), so the promoted
     * node's WAIT 1 is answered again. */
    cr_assert_eq(th_cluster_restart(&clu, victim), 0);
    cr_assert_eq(th_cluster_wait_ok(&clu, 60000), 0,
                 "the cluster not ok after the node came back as a replica");

    pthread_join(producer, NULL);
    cr_assert_eq(atomic_load(&produced), 2, "the producer failed");
    long unique = th_stack_expect_unique(&stk);
    TH_ASSERT_VERIFIED(&stk, 1, NULL, 180000);
    cr_expect_eq(cluster_applied(), unique);
    /* Nothing of it on the stack's own (plain) Redis. */
    cr_expect_eq(th_stack_applied(&stk), 0);
    cr_expect_eq(th_stop(m1, 15000), 0);
    cr_expect_eq(th_stop(m2, 15000), 0);
    th_stack_stop(&stk);
    th_cluster_stop(&clu);
}

/* The TLS ports with the plain scheme: refused, never applied. */
Test(cluster_tls, plain_scheme_on_tls_ports_refused, .timeout = 180)
{
    cr_assert_eq(th_cluster_start_tls(&clu, 3, 0), 0,
                 "TLS cluster did not start");
    cr_assert_eq(th_stack_start(&stk, 2, tls_props("redis")), 0);
    char *argv[] = {(char *)th_bin(), "check-config", "-c",
                    stk.conf,         "--connect",    NULL};
    char *out = NULL, *err = NULL;
    int rc = th_run(argv, &out, &err, 60000);
    cr_expect_neq(rc, 0, "check-config --connect passed:\n%s\n%s",
                  out ? out : "", err ? err : "");
    char tport[32];
    snprintf(tport, sizeof(tport), "127.0.0.1:%d", clu.tls_port[0]);
    cr_expect(strstr(err ? err : "", tport) || strstr(out ? out : "", tport),
              "the refusal does not name %s:\n%s\n%s", tport, out ? out : "",
              err ? err : "");
    free(out);
    free(err);

    const char *traffic[] = {"--count", "200", "--seed", "3", NULL};
    cr_assert_eq(th_stack_produce(&stk, traffic), 0);
    int port = atoi(strchr(listen_prop, ':') + 1);
    const char *more[] = {listen_prop, NULL};
    pid_t m = th_stack_member(&stk, "m1", more);
    char *body = NULL;
    cr_expect_eq(th_wait_unready(port, "redis", 60000, &body), 503,
                 "not unready for redis: %s\n%s", body ? body : "",
                 th_stack_member_log(&stk, "m1"));
    free(body);
    cr_expect_eq(cluster_applied(), 0);
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
    th_cluster_stop(&clu);
}
