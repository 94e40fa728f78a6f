/* fetchwatch: statistics parsing on real librdkafka 2.0.2 documents and
 * the stall judgement over a timeline, without a broker. */
#include "dev/broker.h"
#include "conf/conf.h"
#include "loop/fetchwatch.h"
#include "harness.h"
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

/* The member's view in the tests: every partition held and fetching
 * unless listed. */
typedef struct {
    int paused_all;
    int32_t not_held; /* -1: none */
    int64_t position;
    int calls;
    int unchecked; /* Redis's positions not read yet */
} member_t;

static void member(void *opaque, const char *topic, int32_t partition,
                   idem_fetchwatch_member_t *out)
{
    (void)topic;
    member_t *mb = opaque;
    mb->calls++;
    out->held = partition != mb->not_held;
    out->paused = mb->paused_all;
    out->position = mb->position;
    out->checked = !mb->unchecked;
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

/* One partition object. */
static json_t *part_obj(const char *state, int64_t next, int64_t app,
                        int64_t hi, int64_t q, int leader)
{
    return json_pack("{s:b,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:i}", "desired", 1,
                     "fetch_state", state, "next_offset", (json_int_t)next,
                     "app_offset", (json_int_t)app, "hi_offset", (json_int_t)hi,
                     "ls_offset", (json_int_t)hi, "fetchq_cnt", (json_int_t)q,
                     "consumer_lag", (json_int_t)-1, "leader", leader);
}

/* payments/3 alone, app_offset and leader given. */
static int feed_app(idem_fetchwatch_t *fw, const char *state, int64_t next,
                    int64_t app, int64_t hi, int64_t q, int leader, int64_t now)
{
    json_t *d =
        json_pack("{s:{s:{s:{s:o}}}}", "topics", "payments", "partitions", "3",
                  part_obj(state, next, app, hi, q, leader));
    int rc = idem_fetchwatch_stats(fw, d, now);
    json_decref(d);
    return rc;
}

/* payments/3 alone, everything fetched handed over (app = next). */
static int feed(idem_fetchwatch_t *fw, const char *state, int64_t next,
                int64_t hi, int64_t q, int64_t now)
{
    return feed_app(fw, state, next, next, hi, q, 1, now);
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
     * (fault.fetch.assign.fail=2): the member is not ready at once, and
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
        cr_expect(strstr(e, "fault.fetch.pause: "), "%s", e);
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

/* ------------------------------------------------ with a broker and Redis */

static th_stack_t stk;

TestSuite(fetchwatch_run, .fini = th_stack_cleanup);

/* rd_kafka_destroy of a consumer that was not closed closes it, and the
 * close serves what waits in the consumer queue, statistics included
 * (design.md, "When not to repair"). A pipeline made and destroyed
 * without a poll in between has statistics waiting, so its destroy serves
 * a statistics callback: the lag gauges prove it was served, and the
 * watch it would judge with must not be freed yet or must no longer be
 * reachable (AddressSanitizer reports the use otherwise; run this under
 * make SAN=address). */
Test(fetchwatch_run, statistics_served_by_destroy_skip_the_watch, .timeout = 60)
{
    cr_assert_eq(th_stack_start(&stk, 2, NULL), 0);
    char *sets[] = {"stats.interval.ms=10", "fetch.stall.ms=1000",
                    "http.listen=", NULL};
    char err[512];
    idem_conf_t *conf =
        idem_conf_load(stk.conf, NULL, sets, 3, err, sizeof(err));
    cr_assert(conf, "%s", err);
    idem_metrics_t *m = idem_metrics_new();
    idem_pipeline_t *p = idem_pipeline_new(conf, m, err, sizeof(err));
    cr_assert(p, "%s", err);
    /* 50 statistics periods: documents are queued (nothing polls). */
    usleep(500000);
    cr_assert_eq(idem_metrics_lag_total(m), -1, "served before destroy");
    idem_pipeline_destroy(p);
    cr_expect_geq(idem_metrics_lag_total(m), 0,
                  "no statistics callback was served by the destroy");
    idem_metrics_destroy(m);
    idem_conf_destroy(conf);
    th_stack_stop(&stk);
}

typedef struct {
    th_stack_t *s;
    int rc;
    volatile int done;
} produce_job_t;

static void *produce_thread(void *arg)
{
    produce_job_t *j = arg;
    const char *args[] = {"--count", "6000",         "--rate", "1500", "--seed",
                          "31",      "--duplicates", "0.05",   NULL};
    j->rc = th_stack_produce(j->s, args);
    j->done = 1;
    return NULL;
}

static double metric_of(int port, const char *series)
{
    char *body = NULL;
    double v = -2;
    if (th_http_get(port, "/metrics", &body) == 200)
        v = th_metric(body, series);
    free(body);
    return v;
}

/* Starts member `name` of stk with metrics and probes on a free port
 * (*port), statistics every 200 ms, fetch.stall.ms=1500 and `fault`
 * (--set values, NULL-terminated, may be NULL), and waits until it is
 * ready. Returns its pid. */
static pid_t watched_member(const char *name, const char *const fault[],
                            int *port)
{
    *port = th_free_port();
    char listen[64];
    snprintf(listen, sizeof(listen), "http.listen=127.0.0.1:%d", *port);
    const char *sets[8] = {listen, "stats.interval.ms=200",
                           "fetch.stall.ms=1500"};
    size_t n = 3;
    for (size_t i = 0; fault && fault[i] && n < 7; i++)
        sets[n++] = fault[i];
    sets[n] = NULL;
    pid_t pid = th_stack_member(&stk, name, sets);
    for (int t = 0; t < 600 && th_http_get(*port, "/readyz", NULL) != 200; t++)
        usleep(100000);
    cr_assert_eq(th_http_get(*port, "/readyz", NULL), 200, "%s never ready",
                 name);
    return pid;
}

typedef struct {
    char strategy[32]; /* partition.assignment.strategy */
    int times;         /* fault.fetch.pause TIMES */
    int assign_fail;   /* fault.fetch.assign.fail */
} stall_case_t;

/* A partition paused inside librdkafka behind the member's back while
 * records keep arriving (fault.fetch.pause). With TIMES=1 the first
 * repair (resume, seek) brings it back. With TIMES=3 the first two are
 * dropped: the member reports not ready after the second; with
 * cooperative assignment the third (resume, assign the partition again)
 * brings it back; with eager assignment the watch does not assign again
 * (only the whole assignment could be): the member stays not ready and
 * says to restart it, and a restarted member fetches the partition.
 * With TIMES=2 and cooperative assignment, the second repair takes the
 * partition out of the assignment and its assign back is refused
 * (fault.fetch.assign.fail=1): not ready at once, and the third repair
 * assigns it again. Either way the stall is logged and counted, and the
 * ledger ends exact. */
ParameterizedTestParameters(fetchwatch_run, stalled_partition_is_repaired)
{
    static stall_case_t cases[] = {{"range", 1, 0},
                                   {"range", 3, 0},
                                   {"cooperative-sticky", 3, 0},
                                   {"cooperative-sticky", 2, 1}};
    return cr_make_param_array(stall_case_t, cases, 4);
}

ParameterizedTest(stall_case_t *c, fetchwatch_run,
                  stalled_partition_is_repaired, .timeout = 180)
{
    int eager_restart = c->times > 1 && strcmp(c->strategy, "range") == 0;
    int repairs = eager_restart ? c->times - 1 : c->times + c->assign_fail;
    char strat[96];
    snprintf(strat, sizeof(strat), "kafka.partition.assignment.strategy=%s",
             c->strategy);
    const char *props[] = {strat, NULL};
    cr_assert_eq(th_stack_start(&stk, 4, props), 0);
    char pause[64], refuse[64];
    snprintf(pause, sizeof(pause), "fault.fetch.pause=payments:2:%d", c->times);
    snprintf(refuse, sizeof(refuse), "fault.fetch.assign.fail=%d",
             c->assign_fail);
    const char *fault[] = {pause, refuse, NULL};
    int port;
    pid_t m = watched_member("m", fault, &port);

    produce_job_t job = {&stk, -1, 0};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, produce_thread, &job), 0);
    const char *g2 = "idemproc_partition_stalled{topic=\"payments\","
                     "partition=\"2\"}";
    char path[600];
    snprintf(path, sizeof(path), "%s/m.log", stk.dir);
    int saw_stalled = 0, saw_unready = 0, back = 0;
    for (int t = 0; t < 900 && !back; t++) {
        if (metric_of(port, g2) == 1)
            saw_stalled = 1;
        int st = th_http_get(port, "/readyz", NULL);
        if (st == 503)
            saw_unready = 1;
        if (eager_restart) {
            /* Stays stalled and not ready: what the operator sees. */
            char *l = th_slurp(path, NULL);
            back = job.done && saw_stalled && st == 503 && l &&
                   strstr(l, "eager assignment, not repaired in place") &&
                   metric_of(port, g2) == 1;
            free(l);
        } else {
            back = job.done && saw_stalled && st == 200 &&
                   metric_of(port, g2) == 0 &&
                   metric_of(port, "idemproc_partition_stall_repairs_total") ==
                       repairs;
        }
        usleep(100000);
    }
    pthread_join(th, NULL);
    cr_assert_eq(job.rc, 0, "produce failed");
    char *log = th_slurp(path, NULL);
    cr_assert(log);
    cr_expect(saw_stalled, "idemproc_partition_stalled never showed 1");
    if (c->times > 1)
        cr_expect(saw_unready, "/readyz never said 503");
    cr_assert(back, "never %s:\n%s",
              eager_restart ? "not ready with the partition stalled"
                            : "ready again with the partition fetched",
              log);
    free(log);
    cr_expect_eq(metric_of(port, "idemproc_partition_stalls_total"), 1);
    cr_expect_eq(metric_of(port, "idemproc_partition_stall_repairs_total"),
                 repairs);
    pid_t m2 = -1;
    if (eager_restart) {
        /* The operator restarts the member (no fault this time). */
        cr_expect_eq(th_stop(m, 15000), 0);
        int port2;
        m2 = watched_member("m2", NULL, &port2);
    }
    TH_ASSERT_VERIFIED(&stk, 0, NULL, 60000);
    if (eager_restart)
        cr_expect_eq(th_stop(m2, 15000), 0);
    else
        cr_expect_eq(th_stop(m, 15000), 0);

    log = th_slurp(path, NULL);
    cr_assert(log);
    const char *said_eager[] = {
        "fault: partition paused behind the member's back",
        "partition assigned but not fetched: resuming it",
        "partition still not fetched after a repair: not ready",
        "stalled partition: eager assignment, not repaired in place: "
        "restart the member",
        NULL};
    const char *said[] = {
        "fault: partition paused behind the member's back",
        "partition assigned but not fetched: resuming it",
        c->times > 1 ? "partition still not fetched after a repair: not ready"
                     : "stalled partition: resumed and sought",
        c->times > 1 ? "stalled partition: resumed and assigned again"
                     : "stalled partition fetched again",
        "stalled partition fetched again",
        NULL};
    const char *said_refused[] = {
        "fault: partition paused behind the member's back",
        "fault: repair dropped",
        "partition still not fetched after a repair: not ready",
        "fault: assign refused",
        "stalled partition: resumed and assigned again",
        "stalled partition fetched again",
        NULL};
    const char **want = eager_restart    ? said_eager
                        : c->assign_fail ? said_refused
                                         : said;
    for (int i = 0; want[i]; i++)
        cr_expect(strstr(log, want[i]), "not logged: %s\n%s", want[i], log);
    if (eager_restart)
        cr_expect_not(strstr(log, "resumed and assigned again"), "%s", log);
    cr_expect(strstr(log, "\"partition\":\"2\""), "%s", log);
    free(log);
    th_stack_stop(&stk);
}
