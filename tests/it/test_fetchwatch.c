/* test_fetchwatch (it): the watch with a real consumer of the in-process
 * mock cluster: no repair while the assignment is lost, the stop waits for
 * a query in flight, a revoke with one partition left out. */
#include "dev/broker.h"
#include "conf/conf.h"
#include "loop/fetchwatch.h"
#include "harness.h"
#include "fixture_fetchwatch.h"
#include "obs/metrics.h"
#include "loop/pipeline.h"
#include "loop/rebalance.h"
#include "base/util.h"

#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Two statistics documents of one consumer (librdkafka 2.0.2, mock
 * cluster, statistics.interval.ms=500), 2 s apart, 64 partitions of
 * payments behind their high watermark (314 each): every partition is
 * fetched and consumed, except payments/5, which was paused inside
 * librdkafka after its first record (next_offset stays 1, nothing
 * queued in b). */
#define DOC_A "tests/data/fetchwatch/stats-2.0.2-64p-a.json"
#define DOC_B "tests/data/fetchwatch/stats-2.0.2-64p-b.json"

/* ------------------------------------- with a real consumer, in-process */

#define HEARTBEAT_API 12 /* Kafka protocol ApiKey of Heartbeat */

/* What the test consumer's rebalance callback saw. */
typedef struct {
    volatile int assigned; /* partitions held */
    int lost;              /* revocations of a lost assignment */
} rebalance_seen_t;

/* Rebalance callback of the test consumer (either protocol, as the
 * member applies them): fires in rd_kafka_consumer_poll and
 * rd_kafka_consumer_close. */
static void test_rebalance(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                           rd_kafka_topic_partition_list_t *parts, void *opaque)
{
    rebalance_seen_t *seen = opaque;
    char e[512];
    if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
        idem_rebalance_assign(rk, parts, e, sizeof(e));
        seen->assigned += parts->cnt;
        return;
    }
    if (rd_kafka_assignment_lost(rk))
        seen->lost++;
    idem_rebalance_unassign(rk, parts, e, sizeof(e));
    seen->assigned -= parts->cnt;
}

/* A consumer of payments in group `group` on broker b with the given
 * partition.assignment.strategy, polled until it holds its partitions
 * (heartbeats every 100 ms). Caller closes and destroys it. */
static rd_kafka_t *test_consumer(idem_broker_t *b, const char *group,
                                 const char *strategy, rebalance_seen_t *seen)
{
    char err[512];
    rd_kafka_conf_t *kc = rd_kafka_conf_new();
    const char *props[][2] = {
        {"bootstrap.servers", idem_broker_bootstraps(b)},
        {"group.id", group},
        {"partition.assignment.strategy", strategy},
        {"heartbeat.interval.ms", "100"},
        {"enable.auto.commit", "false"},
        {"log_level", "3"},
    };
    for (size_t i = 0; i < sizeof(props) / sizeof(props[0]); i++)
        cr_assert_eq(
            rd_kafka_conf_set(kc, props[i][0], props[i][1], err, sizeof(err)),
            RD_KAFKA_CONF_OK, "%s", err);
    rd_kafka_conf_set_rebalance_cb(kc, test_rebalance);
    rd_kafka_conf_set_opaque(kc, seen);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, kc, err, sizeof(err));
    cr_assert(rk, "%s", err);
    rd_kafka_poll_set_consumer(rk);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, "payments", RD_KAFKA_PARTITION_UA);
    cr_assert_eq(rd_kafka_subscribe(rk, l), 0);
    rd_kafka_topic_partition_list_destroy(l);
    for (int t = 0; t < 300 && !seen->assigned; t++) {
        rd_kafka_message_t *msg = rd_kafka_consumer_poll(rk, 100);
        if (msg)
            rd_kafka_message_destroy(msg);
    }
    cr_assert_gt(seen->assigned, 0, "never assigned");
    return rk;
}

/* An in-process broker with payments:4, for the real-consumer tests.
 * Caller destroys it. */
static idem_broker_t *test_broker(void)
{
    char err[256];
    idem_broker_t *b = idem_broker_new(1, err, sizeof(err));
    cr_assert(b, "%s", err);
    cr_assert_eq(idem_broker_topic_create(b, "payments", 4, err, sizeof(err)),
                 0, "%s", err);
    return b;
}

TestSuite(fetchwatch_rk, .timeout = 90);

Test(fetchwatch_rk, no_repair_while_the_assignment_is_lost)
{
    idem_broker_t *b = test_broker();
    rebalance_seen_t seen = {0, 0};
    rd_kafka_t *rk = test_consumer(b, "fetchwatch-lost", "range", &seen);
    member_t mb = {0, -1, -1, 0, 0}; /* position unknown: resume, no seek */

    /* Control: with the assignment in place the stall is repaired. */
    idem_fetchwatch_t *fw =
        idem_fetchwatch_new(1000, rk, NULL, member, &mb, NULL);
    feed(fw, "active", 40, 100, 0, 0);
    feed(fw, "active", 40, 100, 0, 1000);
    cr_expect_eq(idem_fetchwatch_repairs(fw), 1);
    idem_fetchwatch_destroy(fw);

    /* The coordinator forgets the member: the next heartbeat says so,
     * librdkafka marks the assignment lost and queues the rebalance that
     * takes it away, which waits for the next poll. No poll until the
     * watch judged. */
    rd_kafka_mock_push_request_errors(idem_broker_mock(b), HEARTBEAT_API, 1,
                                      RD_KAFKA_RESP_ERR_UNKNOWN_MEMBER_ID);
    for (int t = 0; t < 1500 && !rd_kafka_assignment_lost(rk); t++)
        usleep(10000);
    cr_assert(rd_kafka_assignment_lost(rk), "assignment never lost");
    fw = idem_fetchwatch_new(1000, rk, NULL, member, &mb, NULL);
    for (int64_t now = 0; now <= 5000; now += 500)
        feed(fw, "active", 40, 100, 0, now);
    cr_expect(rd_kafka_assignment_lost(rk), "still lost while judged");
    cr_expect_eq(idem_fetchwatch_repairs(fw), 0, "repaired a lost partition");
    cr_expect_null(idem_fetchwatch_not_ready(fw));

    /* The rebalance callback takes the partitions away. */
    for (int t = 0; t < 300 && !seen.lost; t++) {
        rd_kafka_message_t *msg = rd_kafka_consumer_poll(rk, 100);
        if (msg)
            rd_kafka_message_destroy(msg);
    }
    cr_expect_eq(seen.lost, 1);
    idem_fetchwatch_destroy(fw);
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    idem_broker_destroy(b);
}

Test(fetchwatch_rk, stop_waits_for_a_watermark_query_in_flight)
{
    /* The pipeline stops the watch before rd_kafka_destroy because the
     * watch's thread may be inside rd_kafka_query_watermark_offsets on
     * that consumer: stop must return only when it is out. A broker that
     * answers every request after 3 s keeps a query in flight (it times
     * out after 2 s). */
    idem_broker_t *b = test_broker();
    rebalance_seen_t seen = {0, 0};
    rd_kafka_t *rk = test_consumer(b, "fetchwatch-stop", "range", &seen);
    member_t mb = {0, -1, 40, 0, 0};
    idem_fetchwatch_t *fw =
        idem_fetchwatch_new(1000, rk, NULL, member, &mb, NULL);
    rd_kafka_mock_broker_set_rtt(idem_broker_mock(b), 1, 3000);
    /* Caught up and quiet for fetch.stall.ms: its end is asked. */
    feed(fw, "active", 40, 40, 0, 1000);
    feed(fw, "active", 40, 40, 0, 2000);
    feed(fw, "active", 40, 40, 0, 3000);
    uint64_t started = 0, done = 0;
    for (int t = 0; t < 1000 && !started; t++) {
        usleep(10000);
        idem_fetchwatch_queries(fw, &started, &done);
    }
    cr_assert_eq(started, 1, "no watermark query started");
    cr_assert_eq(done, 0, "the query did not wait for the slow broker");
    idem_fetchwatch_stop(fw);
    idem_fetchwatch_queries(fw, &started, &done);
    cr_expect_eq(done, started, "stop returned with a query in flight");
    rd_kafka_mock_broker_set_rtt(idem_broker_mock(b), 1, 0);
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk); /* what the pipeline does next */
    idem_fetchwatch_destroy(fw);
    idem_broker_destroy(b);
}

Test(fetchwatch_rk, a_revoke_gives_up_what_is_held_when_one_partition_is_out)
{
    /* A repair whose assign back was refused leaves a partition out of
     * librdkafka's assignment that the member still holds. The member's
     * next revoke names it, and librdkafka refuses an incremental unassign
     * naming a partition it does not hold, the whole call: the other
     * partitions would stay assigned behind the member's back. */
    char err[512];
    idem_broker_t *b = test_broker();
    rebalance_seen_t seen = {0, 0};
    rd_kafka_t *rk =
        test_consumer(b, "fetchwatch-out", "cooperative-sticky", &seen);
    cr_assert_eq(seen.assigned, 4);
    rd_kafka_topic_partition_list_t *out = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(out, "payments", 3);
    rd_kafka_error_t *ke = rd_kafka_incremental_unassign(rk, out);
    cr_assert_null(ke, "%s", ke ? rd_kafka_error_string(ke) : "");
    rd_kafka_topic_partition_list_destroy(out);

    rd_kafka_topic_partition_list_t *all = rd_kafka_topic_partition_list_new(4);
    for (int32_t i = 0; i < 4; i++)
        rd_kafka_topic_partition_list_add(all, "payments", i);
    cr_expect_eq(idem_rebalance_unassign(rk, all, err, sizeof(err)), 0, "%s",
                 err);
    rd_kafka_topic_partition_list_destroy(all);
    rd_kafka_topic_partition_list_t *now = NULL;
    cr_assert_eq(rd_kafka_assignment(rk, &now), 0);
    cr_expect_eq(now->cnt, 0, "%d partitions still assigned", now->cnt);
    rd_kafka_topic_partition_list_destroy(now);
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    idem_broker_destroy(b);
}
