/* test_fetchwatch (unit): statistics parsing on real librdkafka 2.0.2
 * documents and the stall judgement over a timeline, without a broker. */
#include "dev/broker.h"
#include "conf/conf.h"
#include "loop/fetchwatch.h"
#include "testlib.h"
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

static json_t *load(const char *rel)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", th_src(), rel);
    json_error_t e;
    json_t *root = json_load_file(path, 0, &e);
    cr_assert(root, "%s: %s", path, e.text);
    return root;
}

typedef struct {
    int n;
    idem_fetchwatch_part_t p5;
    int saw_internal;
} collect_t;

static void collect(void *opaque, const idem_fetchwatch_part_t *p)
{
    collect_t *c = opaque;
    c->n++;
    if (p->partition < 0)
        c->saw_internal = 1;
    if (!strcmp(p->topic, "payments") && p->partition == 5)
        c->p5 = *p;
}

Test(fetchwatch, parses_a_real_statistics_document)
{
    json_t *b = load(DOC_B);
    collect_t c = {0};
    cr_assert_eq(idem_fetchwatch_parse(b, collect, &c), 64);
    cr_expect_eq(c.n, 64);
    cr_expect_not(c.saw_internal, "the internal \"-1\" partition is skipped");
    cr_expect_str_eq(c.p5.fetch_state, "active");
    cr_expect_eq(c.p5.next_offset, 1);
    cr_expect_eq(c.p5.app_offset, 1);
    cr_expect_eq(c.p5.hi_offset, 314);
    cr_expect_eq(c.p5.ls_offset, 314);
    cr_expect_eq(c.p5.fetchq_cnt, 0);
    cr_expect_eq(c.p5.consumer_lag, -1, "never committed: -1");
    json_decref(b);

    json_t *bad = json_pack("{s:[]}", "topics");
    cr_expect_eq(idem_fetchwatch_parse(bad, collect, &c), -1);
    json_decref(bad);
}

static char *render(idem_metrics_t *m)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    idem_metrics_render(m, f);
    fclose(f);
    return buf;
}

Test(fetchwatch, finds_the_partition_a_real_consumer_did_not_fetch)
{
    json_t *a = load(DOC_A), *b = load(DOC_B);
    idem_metrics_t *m = idem_metrics_new();
    member_t mb = {0, -1, 1, 0, 0};
    idem_fetchwatch_t *fw =
        idem_fetchwatch_new(1000, NULL, m, member, &mb, NULL);
    cr_expect_eq(idem_fetchwatch_stats(fw, a, 0), 0);
    cr_expect_eq(idem_fetchwatch_stalls(fw), 0);
    /* 2 s later: 63 partitions moved; payments/5 did not, has nothing
     * queued and is 313 behind. */
    idem_fetchwatch_stats(fw, b, 2000);
    cr_expect_eq(idem_fetchwatch_stalls(fw), 1);
    cr_expect_eq(idem_fetchwatch_repairs(fw), 1);
    cr_expect_null(idem_fetchwatch_not_ready(fw), "one repair first");
    char *t = render(m);
    cr_expect(strstr(t, "\nidemproc_partition_stalled{topic=\"payments\","
                        "partition=\"5\"} 1\n"),
              "%s", t);
    cr_expect(strstr(t, "\nidemproc_partition_stalled{topic=\"payments\","
                        "partition=\"6\"} 0\n"),
              "%s", t);
    cr_expect(strstr(t, "\nidemproc_partition_stalls_total 1\n"), "%s", t);
    cr_expect(strstr(t, "\nidemproc_partition_stall_repairs_total 1\n"), "%s",
              t);
    free(t);
    idem_fetchwatch_destroy(fw);

    /* The same documents, but the member paused everything itself (an
     * outage): nothing is stalled. */
    mb.paused_all = 1;
    fw = idem_fetchwatch_new(1000, NULL, NULL, member, &mb, NULL);
    idem_fetchwatch_stats(fw, a, 0);
    idem_fetchwatch_stats(fw, b, 2000);
    cr_expect_eq(idem_fetchwatch_stalls(fw), 0);
    idem_fetchwatch_destroy(fw);

    /* Or payments/5 is not the member's (revoked meanwhile). */
    mb.paused_all = 0;
    mb.not_held = 5;
    fw = idem_fetchwatch_new(1000, NULL, NULL, member, &mb, NULL);
    idem_fetchwatch_stats(fw, a, 0);
    idem_fetchwatch_stats(fw, b, 2000);
    cr_expect_eq(idem_fetchwatch_stalls(fw), 0);
    idem_fetchwatch_destroy(fw);

    /* Too early: under fetch.stall.ms nothing is said. */
    mb.not_held = -1;
    fw = idem_fetchwatch_new(5000, NULL, NULL, member, &mb, NULL);
    idem_fetchwatch_stats(fw, a, 0);
    idem_fetchwatch_stats(fw, b, 2000);
    cr_expect_eq(idem_fetchwatch_stalls(fw), 0);
    idem_fetchwatch_destroy(fw);
    idem_metrics_destroy(m);
    json_decref(a);
    json_decref(b);
}

Test(fetchwatch, repair_then_not_ready_then_ready_again)
{
    idem_metrics_t *m = idem_metrics_new();
    member_t mb = {0, -1, 40, 0, 0};
    idem_fetchwatch_t *fw =
        idem_fetchwatch_new(1000, NULL, m, member, &mb, NULL);
    feed(fw, "active", 40, 100, 0, 0);
    feed(fw, "active", 40, 100, 0, 500);
    cr_expect_eq(idem_fetchwatch_stalls(fw), 0);
    feed(fw, "active", 40, 100, 0, 1000); /* 1 s without a move */
    cr_expect_eq(idem_fetchwatch_stalls(fw), 1);
    cr_expect_eq(idem_fetchwatch_repairs(fw), 1);
    /* The repair is judged only fetch.stall.ms later. */
    cr_expect_eq(feed(fw, "active", 40, 100, 0, 1500), 0);
    cr_expect_eq(idem_fetchwatch_repairs(fw), 1);
    cr_expect_eq(feed(fw, "active", 40, 100, 0, 2000), 1);
    cr_expect_eq(idem_fetchwatch_repairs(fw), 2);
    const char *why = idem_fetchwatch_not_ready(fw);
    cr_assert_not_null(why);
    cr_expect_str_eq(why, "partition payments/3 not fetched (fetch_state "
                          "active, lag 60)");
    cr_expect_eq(idem_fetchwatch_stalls(fw), 1, "one stall, two repairs");
    /* Repaired again every fetch.stall.ms while it lasts. */
    feed(fw, "active", 40, 100, 0, 3000);
    cr_expect_eq(idem_fetchwatch_repairs(fw), 3);
    cr_expect_eq(idem_fetchwatch_reassigns(fw), 2,
                 "resume and seek first, then assign again");
    /* It moves: ready, gauge 0. */
    cr_expect_eq(feed(fw, "active", 55, 100, 0, 3500), 1);
    cr_expect_null(idem_fetchwatch_not_ready(fw));
    char *t = render(m);
    cr_expect(strstr(t, "partition=\"3\"} 0\n"), "%s", t);
    free(t);
    /* Caught up and idle: no lag, no stall however long. */
    feed(fw, "active", 100, 100, 0, 4000);
    feed(fw, "active", 100, 100, 0, 60000);
    cr_expect_eq(idem_fetchwatch_stalls(fw), 1);
    /* Records queued and handed over as the member takes them: busy,
     * not starved. */
    feed(fw, "active", 120, 300, 50, 61000);
    feed(fw, "active", 150, 300, 50, 90000);
    cr_expect_eq(idem_fetchwatch_stalls(fw), 1);
    /* Caught up with records queued (fetchq_cnt is the consumer's one
     * queue, on every partition): not a stall however long. */
    feed(fw, "active", 300, 300, 20, 91000);
    feed(fw, "active", 300, 300, 20, 120000);
    cr_expect_eq(idem_fetchwatch_stalls(fw), 1);
    /* Fetched up to 400 but never handed over past 350: stalled, also
     * when caught up with the watermark. */
    feed_app(fw, "active", 400, 350, 400, 50, 1, 121000);
    feed_app(fw, "active", 400, 350, 400, 50, 1, 121500);
    cr_expect_eq(idem_fetchwatch_stalls(fw), 1);
    feed_app(fw, "active", 400, 350, 400, 50, 1, 122000);
    cr_expect_eq(idem_fetchwatch_stalls(fw), 2);
    idem_fetchwatch_destroy(fw);
    idem_metrics_destroy(m);
}

Test(fetchwatch, a_stale_watermark_is_corrected_by_the_broker_answer)
{
    /* Paused before its first fetch: the statistics keep the old high
     * watermark (40 = next_offset), so it looks caught up however many
     * records arrive, until the broker says its end is 90. */
    member_t mb = {0, -1, 40, 0, 0};
    idem_fetchwatch_t *fw =
        idem_fetchwatch_new(1000, NULL, NULL, member, &mb, NULL);
    feed(fw, "active", 40, 40, 0, 0);
    feed(fw, "active", 40, 40, 0, 5000);
    cr_expect_eq(idem_fetchwatch_stalls(fw), 0);
    idem_fetchwatch_end_seen(fw, "payments", 3, 90);
    /* Caught up until 5000: the stall is counted from there. */
    feed(fw, "active", 40, 40, 0, 5500);
    cr_expect_eq(idem_fetchwatch_stalls(fw), 0, "lag 50 for 0.5 s only");
    feed(fw, "active", 40, 40, 0, 6000);
    cr_expect_eq(idem_fetchwatch_stalls(fw), 1, "lag 50 for 1 s");
    feed(fw, "active", 40, 40, 0, 7000);
    cr_expect_str_eq(idem_fetchwatch_not_ready(fw),
                     "partition payments/3 not fetched (fetch_state active, "
                     "lag 50)");
    /* Fetched again: the answer is forgotten with the stall. */
    feed(fw, "active", 90, 90, 0, 7500);
    cr_expect_null(idem_fetchwatch_not_ready(fw));
    feed(fw, "active", 90, 90, 0, 9500);
    cr_expect_eq(idem_fetchwatch_stalls(fw), 1);
    idem_fetchwatch_destroy(fw);
}

Test(fetchwatch, a_fetch_that_never_started_counts_without_a_watermark)
{
    /* The lost fetch start: assigned, fetch_state "none", no watermark
     * known (-1001), so no lag either. */
    member_t mb = {0, -1, -1, 0, 0};
    idem_fetchwatch_t *fw =
        idem_fetchwatch_new(1000, NULL, NULL, member, &mb, NULL);
    feed(fw, "none", 0, -1001, 0, 0);
    feed(fw, "none", 0, -1001, 0, 999);
    cr_expect_eq(idem_fetchwatch_stalls(fw), 0);
    feed(fw, "none", 0, -1001, 0, 1000);
    cr_expect_eq(idem_fetchwatch_stalls(fw), 1);
    cr_expect_eq(idem_fetchwatch_reassigns(fw), 1,
                 "no seek of a fetch that "
                 "never started");
    feed(fw, "none", 0, -1001, 0, 2000);
    cr_expect_str_eq(idem_fetchwatch_not_ready(fw),
                     "partition payments/3 not fetched (fetch_state none, "
                     "lag -1)");
    /* Gone from the document while the member holds it (assigned again
     * by the repair): still stalled. */
    json_t *empty = json_pack("{s:{}}", "topics");
    idem_fetchwatch_stats(fw, empty, 2500);
    cr_expect_not_null(idem_fetchwatch_not_ready(fw));
    /* Revoked: gone from the document and the member, gone from the
     * watch. */
    mb.not_held = 3;
    cr_expect_eq(idem_fetchwatch_stats(fw, empty, 3000), 1);
    cr_expect_null(idem_fetchwatch_not_ready(fw));
    json_decref(empty);
    idem_fetchwatch_destroy(fw);
}

Test(fetchwatch, records_queued_on_every_caught_up_partition_are_no_stall)
{
    /* A busy member: librdkafka reports the consumer queue's count (81)
     * as every partition's fetchq_cnt; four partitions caught up and
     * idle for a minute are not stalled. */
    member_t mb = {0, -1, 40, 0, 0};
    idem_fetchwatch_t *fw =
        idem_fetchwatch_new(1000, NULL, NULL, member, &mb, NULL);
    for (int64_t now = 0; now <= 60000; now += 500) {
        json_t *parts = json_object();
        for (int i = 0; i < 4; i++) {
            char id[8];
            snprintf(id, sizeof(id), "%d", i);
            json_object_set_new(parts, id,
                                part_obj("active", 40, 40, 40, 81, 1));
        }
        json_t *d = json_pack("{s:{s:{s:o}}}", "topics", "payments",
                              "partitions", parts);
        idem_fetchwatch_stats(fw, d, now);
        json_decref(d);
    }
    cr_expect_eq(idem_fetchwatch_stalls(fw), 0);
    cr_expect_eq(idem_fetchwatch_repairs(fw), 0);
    cr_expect_null(idem_fetchwatch_not_ready(fw));
    idem_fetchwatch_destroy(fw);
}

Test(fetchwatch, no_reassign_before_the_redis_position_is_read)
{
    /* A fetch that never started needs the heavy repair (assign again),
     * which would start it at a position not known yet: none is made
     * until the member read its Redis position. */
    member_t mb = {0, -1, -1, 0, 1};
    idem_fetchwatch_t *fw =
        idem_fetchwatch_new(1000, NULL, NULL, member, &mb, NULL);
    feed(fw, "none", 0, -1001, 0, 0);
    feed(fw, "none", 0, -1001, 0, 1000);
    cr_expect_eq(idem_fetchwatch_stalls(fw), 1);
    cr_expect_eq(idem_fetchwatch_repairs(fw), 0);
    cr_expect_eq(idem_fetchwatch_reassigns(fw), 0);
    /* Read: repaired at the next turn. */
    mb.unchecked = 0;
    feed(fw, "none", 0, -1001, 0, 2000);
    cr_expect_eq(idem_fetchwatch_repairs(fw), 1);
    cr_expect_eq(idem_fetchwatch_reassigns(fw), 1);
    idem_fetchwatch_destroy(fw);
}

Test(fetchwatch, nothing_judged_while_closing_or_without_a_leader)
{
    member_t mb = {0, -1, 40, 0, 0};
    idem_fetchwatch_t *fw =
        idem_fetchwatch_new(1000, NULL, NULL, member, &mb, NULL);
    /* Leader unknown (-1): librdkafka waits for metadata; no stall. */
    feed_app(fw, "active", 40, 40, 100, 0, -1, 0);
    feed_app(fw, "active", 40, 40, 100, 0, -1, 5000);
    cr_expect_eq(idem_fetchwatch_stalls(fw), 0);
    /* Leader known again: counted from there. */
    feed_app(fw, "active", 40, 40, 100, 0, 1, 5500);
    cr_expect_eq(idem_fetchwatch_stalls(fw), 0);
    feed_app(fw, "active", 40, 40, 100, 0, 1, 6500);
    cr_expect_eq(idem_fetchwatch_stalls(fw), 1);
    cr_expect_eq(idem_fetchwatch_repairs(fw), 1);
    /* Closing: no document is judged, no repair made. */
    idem_fetchwatch_closing(fw);
    cr_expect_eq(feed(fw, "active", 40, 100, 0, 8000), 0);
    cr_expect_eq(feed(fw, "active", 40, 100, 0, 20000), 0);
    cr_expect_eq(idem_fetchwatch_repairs(fw), 1);
    cr_expect_null(idem_fetchwatch_not_ready(fw));
    idem_fetchwatch_stop(fw);
    idem_fetchwatch_stop(fw); /* twice is fine */
    idem_fetchwatch_destroy(fw);
}

Test(fetchwatch, a_refused_assign_is_assigned_again_until_taken)
{
    /* A fetch that never started gets the heavy repair: out of the
     * assignment and back in. The assign back is refused twice
     * (dev.fault.fetch.assign.fail=2): the member is not ready at once, and
     * the partition, out of the assignment and so in no document (it is
     * not "desired" any more), is assigned again every fetch.stall.ms
     * until librdkafka takes it; never unassigned again on the way. */
    member_t mb = {0, -1, 40, 0, 0};
    idem_fetchwatch_t *fw =
        idem_fetchwatch_new(1000, NULL, NULL, member, &mb, NULL);
    idem_fetchwatch_fault_assign(fw, 2);
    feed(fw, "none", 0, -1001, 0, 0);
    cr_expect_eq(feed(fw, "none", 0, -1001, 0, 1000), 1);
    cr_expect_eq(idem_fetchwatch_reassigns(fw), 1);
    cr_expect_str_eq(idem_fetchwatch_not_ready(fw),
                     "partition payments/3 not fetched (fetch_state none, "
                     "lag -1)",
                     "not ready at once: the partition left the assignment");
    json_t *empty = json_pack("{s:{}}", "topics");
    idem_fetchwatch_stats(fw, empty, 1500);
    cr_expect_eq(idem_fetchwatch_repairs(fw), 1, "again only after 1 s");
    idem_fetchwatch_stats(fw, empty, 2000);
    cr_expect_eq(idem_fetchwatch_repairs(fw), 2, "assigned again, refused");
    cr_expect_not_null(idem_fetchwatch_not_ready(fw));
    idem_fetchwatch_stats(fw, empty, 3000);
    cr_expect_eq(idem_fetchwatch_repairs(fw), 3, "assigned again, taken");
    cr_expect_eq(idem_fetchwatch_reassigns(fw), 3);
    /* Taken: no more assigns while it is away, and ready once it moves. */
    idem_fetchwatch_stats(fw, empty, 4000);
    idem_fetchwatch_stats(fw, empty, 5000);
    cr_expect_eq(idem_fetchwatch_repairs(fw), 3);
    cr_expect_eq(feed(fw, "active", 40, 100, 0, 5500), 1);
    cr_expect_null(idem_fetchwatch_not_ready(fw));
    cr_expect_eq(idem_fetchwatch_stalls(fw), 1);

    /* Refused again, and the partition still in the documents: judged
     * there, it is assigned again the same way. */
    idem_fetchwatch_fault_assign(fw, 1);
    feed(fw, "none", 0, -1001, 0, 6000);
    feed(fw, "none", 0, -1001, 0, 7000);
    cr_expect_eq(idem_fetchwatch_repairs(fw), 4);
    cr_expect_not_null(idem_fetchwatch_not_ready(fw));
    feed(fw, "none", 0, -1001, 0, 8000);
    cr_expect_eq(idem_fetchwatch_repairs(fw), 5);
    cr_expect_eq(idem_fetchwatch_reassigns(fw), 5);
    /* Revoked while out: gone from the watch, nothing assigned. */
    idem_fetchwatch_fault_assign(fw, 1);
    feed(fw, "none", 0, -1001, 0, 9000);
    cr_expect_eq(idem_fetchwatch_repairs(fw), 6);
    mb.not_held = 3;
    idem_fetchwatch_stats(fw, empty, 10000);
    idem_fetchwatch_stats(fw, empty, 11000);
    cr_expect_eq(idem_fetchwatch_repairs(fw), 6);
    cr_expect_null(idem_fetchwatch_not_ready(fw));
    json_decref(empty);
    idem_fetchwatch_destroy(fw);
}

/* A partition out of the assignment after a refused assign, revoked and
 * given back to this member at once (before a statistics document showed
 * it gone): the rebalance makes the watch forget it, so it is judged like
 * any new partition (stall_ms from its first document), not assigned
 * again on an old "out" that librdkafka would refuse. */
Test(fetchwatch, a_rebalance_forgets_what_the_old_assignment_left)
{
    member_t mb = {0, -1, 40, 0, 0};
    idem_fetchwatch_t *fw =
        idem_fetchwatch_new(1000, NULL, NULL, member, &mb, NULL);
    idem_fetchwatch_fault_assign(fw, 1);
    feed(fw, "none", 0, -1001, 0, 0);
    cr_expect_eq(feed(fw, "none", 0, -1001, 0, 1000), 1);
    cr_expect_eq(idem_fetchwatch_repairs(fw), 1);
    cr_expect_not_null(idem_fetchwatch_not_ready(fw), "out: not ready");

    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, "payments", 3);
    idem_fetchwatch_forget(fw, l); /* revoked */
    idem_fetchwatch_forget(fw, l); /* and assigned again */
    rd_kafka_topic_partition_list_destroy(l);
    json_t *empty = json_pack("{s:{}}", "topics");
    idem_fetchwatch_stats(fw, empty, 2500);
    cr_expect_eq(idem_fetchwatch_repairs(fw), 1, "no assign on an old out");
    cr_expect_null(idem_fetchwatch_not_ready(fw), "the old stall is gone");
    /* The new assignment's first document starts its own clock. */
    cr_expect_eq(feed(fw, "none", 0, -1001, 0, 3000), 0);
    cr_expect_eq(idem_fetchwatch_repairs(fw), 1);
    cr_expect_eq(feed(fw, "active", 40, 100, 0, 3500), 0);
    cr_expect_null(idem_fetchwatch_not_ready(fw));
    idem_fetchwatch_forget(NULL, NULL); /* no watch: a no-op */
    json_decref(empty);
    idem_fetchwatch_destroy(fw);
}

Test(fetchwatch, fault_values)
{
    char e[256];
    cr_expect_eq(idem_fetchwatch_fault_check("", e, sizeof(e)), 0);
    cr_expect_eq(idem_fetchwatch_fault_check(NULL, e, sizeof(e)), 0);
    cr_expect_eq(idem_fetchwatch_fault_check("payments:3", e, sizeof(e)), 0);
    cr_expect_eq(idem_fetchwatch_fault_check("payments:3:5", e, sizeof(e)), 0);
    const char *bad[] = {"payments", ":3",   "payments:", "p:x", "p:3:0",
                         "p:3:101",  "p:-1", "p:3:2:1",   NULL};
    for (int i = 0; bad[i]; i++) {
        cr_expect_eq(idem_fetchwatch_fault_check(bad[i], e, sizeof(e)), -1,
                     "%s", bad[i]);
        cr_expect(strstr(e, "dev.fault.fetch.pause: "), "%s", e);
    }
}

/* What judging one 64-partition document costs (printed, not asserted:
 * speed belongs to make bench). */
Test(fetchwatch, parse_cost_of_a_64_partition_document)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", th_src(), DOC_B);
    size_t len;
    char *text = th_slurp(path, &len);
    cr_assert(text);
    member_t mb = {0, -1, 1, 0, 0};
    idem_metrics_t *m = idem_metrics_new();
    idem_fetchwatch_t *fw =
        idem_fetchwatch_new(1000, NULL, m, member, &mb, NULL);
    int rounds = 50;
    int64_t t0 = idem_now_us();
    for (int i = 0; i < rounds; i++)
        json_decref(json_loadb(text, len, 0, NULL));
    int64_t parse_us = idem_now_us() - t0;
    t0 = idem_now_us();
    for (int i = 0; i < rounds; i++) {
        json_t *root = json_loadb(text, len, 0, NULL);
        cr_assert(root);
        idem_metrics_stats_doc(m, root);
        idem_fetchwatch_stats(fw, root, i * 10);
        json_decref(root);
    }
    int64_t t1 = idem_now_us();
    cr_log_info("one %zu-byte document: parse %.0f us; parse, lag gauges "
                "and watch %.0f us",
                len, (double)parse_us / rounds, (double)(t1 - t0) / rounds);
    cr_expect_eq(mb.calls, 64 * rounds);
    idem_fetchwatch_destroy(fw);
    idem_metrics_destroy(m);
    free(text);
}

/* ------------------------------------- with a real consumer, in-process */

#define HEARTBEAT_API 12 /* Kafka protocol ApiKey of Heartbeat */
