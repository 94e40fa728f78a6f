/* test_cluster_external: two members with the forward handler (an
 * external effect: claim -> produce to the output topic -> mark) against
 * a real Redis Cluster of 3 primaries and 3 replicas (seed list whose
 * first node is down), traffic with duplicates and poison; each
 * identity's mark key is on its own slot. `verify` exact: every expected
 * identity once on the output topic and one done mark each, summed over
 * every primary; while a third of all slots (and the marks in them) is
 * resharded mid-stream, and while a primary is kill -9'd, its replica
 * promoted and the node back as a replica, with redis.wait.replicas=1
 * (WAIT on every primary after the marks). */
#include "harness.h"
#include "harness_cluster.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static th_stack_t stk;
static th_cluster_t clu;

static void cluster_fini(void)
{
    th_stack_cleanup();
    th_cluster_stop(&clu);
}

TestSuite(cluster_external, .fini = cluster_fini);

#define PARTS 6

static char nodes_prop[512];

/* Forward on the cluster, more (NULL or one key=value) added. */
static const char *const *forward_props(const char *more)
{
    int dead = th_free_port();
    snprintf(nodes_prop, sizeof(nodes_prop),
             "redis.cluster.nodes=127.0.0.1:%d,%s", dead, clu.seeds);
    static const char *props[8];
    props[0] = "handler=forward";
    props[1] = "output.topic=payments.out";
    props[2] = "dedup.lease.ms=3000";
    props[3] = "batch.max.messages=50";
    props[4] = nodes_prop;
    props[5] = more;
    props[6] = NULL;
    return props;
}

/* Done and lease marks of group test-group over the live primaries. */
static long marks_on(int i)
{
    char *keys = th_cluster_cmd(&clu, i, "KEYS idemproc:dedup:test-group:*");
    long n = 0;
    for (char *k = keys ? strtok(keys, "\n") : NULL; k; k = strtok(NULL, "\n"))
        n++;
    free(keys);
    return n;
}

static long marks_total(void)
{
    long sum = 0;
    for (int i = 0; i < clu.n; i++)
        if (th_cluster_is_primary(&clu, i))
            sum += marks_on(i);
    return sum;
}

static pthread_t producer;
static char traffic_count[16] = "12000";
static atomic_int produced; /* 1 once the producer ended, 2 + rc */

static void *produce_main(void *arg)
{
    (void)arg;
    const char *traffic[] = {"--count",
                             traffic_count,
                             "--duplicates",
                             "0.1",
                             "--poison",
                             "0.01",
                             "--too-large-bytes",
                             "5000",
                             "--seed",
                             "41",
                             "--rate",
                             "2000",
                             NULL};
    int rc = th_stack_produce(&stk, traffic);
    atomic_store(&produced, 2 + rc);
    return NULL;
}

static void start_all(const char *more, pid_t *m1, pid_t *m2)
{
    cr_assert_eq(th_cluster_start(&clu, 3, 1), 0, "cluster did not start");
    cr_assert_eq(th_stack_start(&stk, PARTS, forward_props(more)), 0);
    atomic_init(&produced, 0);
    cr_assert_eq(pthread_create(&producer, NULL, produce_main, NULL), 0);
    *m1 = th_stack_member(&stk, "m1", NULL);
    *m2 = th_stack_member(&stk, "m2", NULL);
    int t = 0;
    while (th_topic_size(stk.broker.bootstrap, "payments.out") < 500 &&
           t++ < 900)
        usleep(100 * 1000);
    cr_assert_lt(t, 900, "members never got going:\n%s\n%s",
                 th_stack_member_log(&stk, "m1"),
                 th_stack_member_log(&stk, "m2"));
}

static void assert_mid_stream(const char *what)
{
    cr_assert_eq(atomic_load(&produced), 0,
                 "the traffic ended before the %s: nothing tested", what);
}

/* verify exact (output and marks), one mark per expected identity on the
 * cluster, none on the stack's own Redis, and no mark lost to a lease
 * taken over (a record marked by two owners). */
static void end_exact(pid_t m1, pid_t m2)
{
    pthread_join(producer, NULL);
    cr_assert_eq(atomic_load(&produced), 2, "the producer failed");
    long unique = th_stack_expect_unique(&stk);
    TH_ASSERT_VERIFIED(&stk, 1, NULL, 180000);
    cr_expect_geq(marks_total(), unique);
    cr_expect_eq(th_stop(m1, 15000), 0);
    cr_expect_eq(th_stop(m2, 15000), 0);
    const char *names[] = {"m1", "m2"};
    for (int i = 0; i < 2; i++) {
        char *log = th_stack_member_log(&stk, names[i]);
        cr_expect(!strstr(log, "lease taken over before mark"),
                  "%s marked a record another owner held:\n%s", names[i], log);
        free(log);
    }
    th_stack_stop(&stk);
    th_cluster_stop(&clu);
}

Test(cluster_external, forward_reshard_a_third_of_the_slots_mid_stream_exact,
     .timeout = 300)
{
    pid_t m1, m2;
    snprintf(traffic_count, sizeof(traffic_count), "24000");
    start_all(NULL, &m1, &m2);
    /* Half the slots of two primaries go to the third: a third of all
     * slots, with the marks in them, while the members claim and mark. */
    int prim[3], np = 0;
    for (int i = 0; i < clu.n && np < 3; i++)
        if (th_cluster_is_primary(&clu, i))
            prim[np++] = i;
    cr_assert_eq(np, 3);
    long target_before = marks_on(prim[2]);
    for (int j = 0; j < 2; j++) {
        cr_assert_eq(th_cluster_reshard(&clu, prim[j], prim[2], 2731), 0);
        cr_assert_eq(th_cluster_wait_ok(&clu, 30000), 0);
    }
    assert_mid_stream("reshard");
    cr_assert_gt(marks_on(prim[2]), target_before,
                 "no mark moved to the target");
    end_exact(m1, m2);
}

Test(cluster_external, forward_primary_killed_replica_promoted_wait_exact,
     .timeout = 300)
{
    pid_t m1, m2;
    start_all("redis.wait.replicas=1", &m1, &m2);
    int victim = -1;
    for (int i = 0; i < clu.n && victim < 0; i++)
        if (th_cluster_is_primary(&clu, i) && marks_on(i) > 0)
            victim = i;
    cr_assert_geq(victim, 0);
    int replica = th_cluster_replica_of(&clu, victim);
    cr_assert_geq(replica, 0);
    th_cluster_kill(&clu, victim);
    cr_assert_eq(th_cluster_wait_ok(&clu, 30000), 0, "no failover");
    cr_assert(th_cluster_is_primary(&clu, replica));
    assert_mid_stream("failover");
    cr_assert_eq(th_cluster_restart(&clu, victim), 0);
    cr_assert_eq(th_cluster_wait_ok(&clu, 30000), 0);
    end_exact(m1, m2);
}
