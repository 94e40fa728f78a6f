/* test_cluster_run: two members with the ledger handler against a real
 * Redis Cluster of 3 primaries and 3 replicas (redis.cluster.nodes, whose
 * first seed is down), traffic with duplicates and poison, `verify` exact
 * (it sums the balances sharded by partition over every primary): while
 * the slots of a third of the partitions' tags are migrated mid-stream,
 * and while a primary owning tags is kill -9'd, its replica promoted, and
 * the killed node comes back as a replica. */
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

static void cluster_fini(void)
{
    th_stack_cleanup();
    th_cluster_stop(&clu);
}

TestSuite(cluster_run, .fini = cluster_fini);

#define PARTS 9

/* The properties of cluster mode: seeds whose first is a closed port. */
static char nodes_prop[512];

static const char *const *cluster_props(void)
{
    int dead = th_free_port();
    snprintf(nodes_prop, sizeof(nodes_prop),
             "redis.cluster.nodes=127.0.0.1:%d,%s", dead, clu.seeds);
    static const char *props[8];
    props[0] = "dedup.scope=partition";
    props[1] = "handler=ledger";
    props[2] = "batch.max.messages=50";
    props[3] = nodes_prop;
    props[4] = NULL;
    return props;
}

/* Sum over the live primaries of the sharded <prefix>ledger:applied{...}
 * counters: what th_stack_applied reads on a single Redis. */
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

static int wait_cluster_applied(long n, int timeout_ms)
{
    for (int waited = 0; waited < timeout_ms; waited += 50) {
        if (cluster_applied() >= n)
            return 0;
        usleep(50 * 1000);
    }
    return -1;
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

/* Keys under the partitions' tags on the cluster: the layout was written
 * sharded (chunk windows, positions, ledger shards). */
static long sharded_keys(const char *pattern)
{
    long n = 0;
    for (int i = 0; i < clu.n; i++) {
        if (!th_cluster_is_primary(&clu, i))
            continue;
        char *keys = th_cluster_cmd(&clu, i, "KEYS %s", pattern);
        for (char *k = keys ? strtok(keys, "\n") : NULL; k;
             k = strtok(NULL, "\n"))
            n++;
        free(keys);
    }
    return n;
}

/* The traffic, produced at a fixed rate by a thread while the test
 * reshards or kills: 2,000 records/s, for about 6 s (12,000) unless the
 * test asks for more. */
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
                             "25",
                             "--rate",
                             "2000",
                             NULL};
    int rc = th_stack_produce(&stk, traffic);
    atomic_store(&produced, 2 + rc);
    return NULL;
}

static void start_all(pid_t *m1, pid_t *m2)
{
    cr_assert_eq(th_cluster_start(&clu, 3, 1), 0, "cluster did not start");
    cr_assert_eq(th_stack_start(&stk, PARTS, cluster_props()), 0);
    atomic_init(&produced, 0);
    cr_assert_eq(pthread_create(&producer, NULL, produce_main, NULL), 0);
    *m1 = th_stack_member(&stk, "m1", NULL);
    *m2 = th_stack_member(&stk, "m2", NULL);
    cr_assert_eq(
        wait_cluster_applied(500, 90000), 0, "members never got going:\n%s\n%s",
        th_stack_member_log(&stk, "m1"), th_stack_member_log(&stk, "m2"));
}

/* The producer still runs: what the test did happened mid-stream. */
static void assert_mid_stream(const char *what)
{
    cr_assert_eq(atomic_load(&produced), 0,
                 "the traffic ended before the %s: nothing tested", what);
}

static void end_exact(pid_t m1, pid_t m2)
{
    pthread_join(producer, NULL);
    cr_assert_eq(atomic_load(&produced), 2, "the producer failed");
    long unique = th_stack_expect_unique(&stk);
    TH_ASSERT_VERIFIED(&stk, 1, NULL, 180000);
    cr_expect_eq(cluster_applied(), unique);
    cr_expect_gt(sharded_keys("idemproc:ledger:*{test-group:payments:*}"), 0);
    cr_expect_gt(sharded_keys("idemproc:pos{test-group:payments:*}"), 0);
    /* Nothing of the single-Redis layout on the stack's own Redis. */
    cr_expect_eq(th_stack_applied(&stk), 0);
    cr_expect_eq(th_stop(m1, 15000), 0);
    cr_expect_eq(th_stop(m2, 15000), 0);
    th_stack_stop(&stk);
    th_cluster_stop(&clu);
}

/* The plan for redis-cli --cluster reshard, which moves the lowest slots
 * of a source: for each primary, how many of its tags to move (its tags
 * in slot order; moving the m-th costs every slot of that primary up to
 * it), the cheapest plan that moves at least a third of the tags and
 * leaves one primary untouched as the target. */
static void plan_reshard(int *take, int *target)
{
    int slot[PARTS], owner[PARTS], cost[PARTS];
    for (int p = 0; p < PARTS; p++) {
        slot[p] = tag_slot(p);
        cr_assert_geq(slot[p], 0);
        owner[p] = th_cluster_owner(&clu, slot[p]);
        cr_assert_geq(owner[p], 0);
        cost[p] = th_cluster_slots_upto(&clu, owner[p], slot[p]);
        cr_assert_gt(cost[p], 0);
    }
    int best = -1;
    int m[TH_CLUSTER_MAX] = {0};
    /* Every choice of m[i] in 0..tags of i, as a mixed-radix counter. */
    for (;;) {
        int tags = 0, total = 0, free_primary = -1;
        for (int i = 0; i < clu.n; i++) {
            if (!th_cluster_is_primary(&clu, i))
                continue;
            if (m[i] == 0) {
                free_primary = i;
                continue;
            }
            /* The m[i]-th cheapest tag of i and the tags under it. */
            int c = 0, n = 0;
            for (int p = 0; p < PARTS; p++)
                if (owner[p] == i) {
                    int rank = 0;
                    for (int q = 0; q < PARTS; q++)
                        rank += owner[q] == i && cost[q] <= cost[p];
                    if (rank <= m[i] && cost[p] > c)
                        c = cost[p];
                    n += rank <= m[i];
                }
            tags += n;
            total += c;
        }
        if (free_primary >= 0 && tags * 3 >= PARTS &&
            (best < 0 || total < best)) {
            best = total;
            memcpy(take, m, sizeof(m));
            *target = free_primary;
        }
        int i = 0;
        for (; i < clu.n; i++) {
            int have = 0;
            for (int p = 0; p < PARTS; p++)
                have += owner[p] == i;
            if (m[i] < have) {
                m[i]++;
                break;
            }
            m[i] = 0;
        }
        if (i == clu.n)
            break;
    }
    cr_assert_geq(best, 0, "no reshard plan moves a third of the tags");
    /* take[i] becomes the slot count: the cost of its m-th tag. */
    for (int i = 0; i < clu.n; i++) {
        int c = 0;
        for (int p = 0; p < PARTS && take[i]; p++)
            if (owner[p] == i) {
                int rank = 0;
                for (int q = 0; q < PARTS; q++)
                    rank += owner[q] == i && cost[q] <= cost[p];
                if (rank <= take[i] && cost[p] > c)
                    c = cost[p];
            }
        take[i] = c;
    }
}

Test(cluster_run, reshard_a_third_of_the_tags_mid_stream_exact, .timeout = 300)
{
    pid_t m1, m2;
    /* About 10 s: the tool's runs and one slot key by key fit in it. */
    snprintf(traffic_count, sizeof(traffic_count), "20000");
    start_all(&m1, &m2);
    /* redis-cli --cluster reshard moves, while the members write, slots
     * that hold at least a third of the partitions' tags. */
    int before[PARTS];
    for (int p = 0; p < PARTS; p++)
        before[p] = th_cluster_owner(&clu, tag_slot(p));
    int take[TH_CLUSTER_MAX] = {0}, target = -1;
    plan_reshard(take, &target);
    for (int i = 0; i < clu.n; i++) {
        if (!take[i])
            continue;
        cr_assert_eq(th_cluster_reshard(&clu, i, target, take[i]), 0);
        cr_assert_eq(th_cluster_wait_ok(&clu, 30000), 0);
    }
    int moved_tags = 0, other = -1;
    for (int p = 0; p < PARTS; p++) {
        int now = th_cluster_owner(&clu, tag_slot(p));
        cr_assert_geq(now, 0);
        if (now != before[p]) {
            cr_assert_eq(now, target);
            moved_tags++;
        } else if (other < 0 && now != target) {
            other = p;
        }
    }
    cr_assert_geq(moved_tags * 3, PARTS, "the reshard moved %d tags' slots",
                  moved_tags);
    assert_mid_stream("reshard");
    /* Then one more tag's slot key by key, half moved for a while:
     * scripts meet ASK, TRYAGAIN and keys already gone. */
    cr_assert_geq(other, 0);
    int slot = tag_slot(other), from = th_cluster_owner(&clu, slot);
    cr_assert_eq(th_cluster_migrate_begin(&clu, slot, from, target), 0);
    int k, keys = 0;
    while ((k = th_cluster_migrate_keys(&clu, slot, from, target, 1)) > 0) {
        keys += k;
        usleep(100 * 1000);
    }
    cr_assert_geq(k, 0);
    cr_assert_gt(keys, 0, "no key of partition %d's tag was moved", other);
    cr_assert_eq(th_cluster_migrate_end(&clu, slot, from, target), 0);
    cr_assert_eq(th_cluster_owner(&clu, slot), target);
    assert_mid_stream("migration");
    end_exact(m1, m2);
}

Test(cluster_run, primary_killed_replica_promoted_node_back_exact,
     .timeout = 300)
{
    pid_t m1, m2;
    start_all(&m1, &m2);
    int victim = th_cluster_owner(&clu, tag_slot(0));
    cr_assert_geq(victim, 0);
    int replica = th_cluster_replica_of(&clu, victim);
    cr_assert_geq(replica, 0);
    th_cluster_kill(&clu, victim);
    cr_assert_eq(th_cluster_wait_ok(&clu, 30000), 0, "no failover");
    cr_assert_eq(th_cluster_owner(&clu, tag_slot(0)), replica);
    assert_mid_stream("failover");
    cr_assert_eq(th_cluster_restart(&clu, victim), 0);
    cr_assert_eq(th_cluster_wait_ok(&clu, 30000), 0);
    end_exact(m1, m2);
}
