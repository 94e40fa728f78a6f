/* test_posval: a position's cluster and record fingerprint: its text in
 * Redis, older values, and the judgement against what Kafka says now. */
#include "obs/metrics.h"
#include "redis/posval.h"

#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdio.h>
#include <string.h>

static idem_posval_t val(const char *cluster, int64_t rec, int64_t ts,
                         uint64_t hash)
{
    idem_posval_t v;
    idem_posval_init(&v, cluster);
    v.rec.offset = rec;
    v.rec.timestamp = ts;
    v.rec.hash = hash;
    return v;
}

Test(posval, format_and_parse_round_trip)
{
    idem_posval_t v = val("mockCluster15622c67cb0c", 41, 1796145566000,
                          0x00ab0000000000cdULL);
    char buf[256];
    cr_assert_gt(idem_posval_format(buf, sizeof(buf), 42, &v), 0);
    cr_expect_str_eq(buf, "42 mockCluster15622c67cb0c 41 1796145566000 "
                          "00ab0000000000cd");
    int64_t off = -1;
    idem_posval_t back;
    cr_assert_eq(idem_posval_parse(buf, strlen(buf), &off, &back), 0);
    cr_expect_eq(off, 42);
    cr_expect_str_eq(back.cluster, v.cluster);
    cr_expect_eq(back.rec.offset, 41);
    cr_expect_eq(back.rec.timestamp, 1796145566000);
    cr_expect_eq(back.rec.hash, v.rec.hash);

    /* No record (a first position before anything was read), no cluster;
     * a record without a timestamp. */
    idem_posval_t none = val(NULL, -1, -1, 0);
    cr_assert_gt(idem_posval_format(buf, sizeof(buf), 7, &none), 0);
    cr_expect_str_eq(buf, "7 - -");
    cr_assert_eq(idem_posval_parse(buf, strlen(buf), &off, &back), 0);
    cr_expect_eq(off, 7);
    cr_expect_str_eq(back.cluster, "");
    cr_expect_eq(back.rec.offset, -1);
    idem_posval_t nots = val("c", 0, -1, 1);
    cr_assert_gt(idem_posval_format(buf, sizeof(buf), 1, &nots), 0);
    cr_assert_eq(idem_posval_parse(buf, strlen(buf), &off, &back), 0);
    cr_expect_eq(back.rec.timestamp, -1);
    cr_expect_eq(back.rec.offset, 0);

    cr_expect_eq(idem_posval_format(buf, 8, 42, &v), 0, "does not fit");
}

Test(posval, an_older_value_is_the_offset_alone)
{
    int64_t off;
    idem_posval_t v;
    cr_assert_eq(idem_posval_parse("1234", 4, &off, &v), 0);
    cr_expect_eq(off, 1234);
    cr_expect_str_eq(v.cluster, "");
    cr_expect_eq(v.rec.offset, -1);
}

typedef struct {
    char text[64];
} bad_value_t;

ParameterizedTestParameters(posval, unreadable_values)
{
    static bad_value_t bad[] = {
        {""},
        {"x"},
        {"-5"},
        {"12 "},
        {"12 c"},
        {"12 c 5"},
        {"12 c 5 6"},
        {"12 c 5 6 123"},
        {"12 c 5 6 00000000000000zz"},
        {"12 c -3 6 0000000000000001"},
        {"12 c 5 6 0000000000000001 more"},
        {"99999999999999999999"},
        {"12  - -"},
    };
    return cr_make_param_array(bad_value_t, bad, sizeof(bad) / sizeof(bad[0]));
}

ParameterizedTest(bad_value_t *c, posval, unreadable_values)
{
    int64_t off;
    idem_posval_t v;
    cr_expect_eq(idem_posval_parse(c->text, strlen(c->text), &off, &v), -1,
                 "read \"%s\"", c->text);
}

Test(posval, hash_tells_key_value_and_their_boundary_apart)
{
    uint64_t h = idem_posval_hash("ORD-1", 5, "{\"amount\":1}", 12);
    cr_expect_eq(h, idem_posval_hash("ORD-1", 5, "{\"amount\":1}", 12));
    cr_expect_neq(h, idem_posval_hash("ORD-1", 5, "{\"amount\":2}", 12));
    cr_expect_neq(h, idem_posval_hash("ORD-2", 5, "{\"amount\":1}", 12));
    cr_expect_neq(idem_posval_hash("ab", 2, "c", 1),
                  idem_posval_hash("a", 1, "bc", 2));
    cr_expect_eq(idem_posval_hash(NULL, 0, NULL, 0),
                 idem_posval_hash("", 0, "", 0));
    /* Every length up to two words differs from its neighbour. */
    char buf[24] = "0123456789abcdefghijklm";
    for (size_t n = 1; n < sizeof(buf); n++)
        cr_expect_neq(idem_posval_hash(NULL, 0, buf, n),
                      idem_posval_hash(NULL, 0, buf, n - 1));
}

static idem_posval_now_t now_read(const char *cluster, int64_t low,
                                  int64_t high, int64_t got, int64_t ts,
                                  uint64_t hash)
{
    idem_posval_now_t n = {.cluster = cluster, .low = low, .high = high};
    n.found = got >= 0;
    n.got.offset = got;
    n.got.timestamp = ts;
    n.got.hash = hash;
    return n;
}

Test(posval, judged_against_what_kafka_holds_now)
{
    idem_posval_t v = val("A", 99, 5000, 77);
    idem_posval_now_t same = now_read("A", 0, 150, 99, 5000, 77);
    cr_expect_eq(idem_posval_judge(100, &v, &same), IDEM_POSVAL_USE);
    /* Another cluster: whatever the records say. */
    idem_posval_now_t other = now_read("B", 0, 150, 99, 5000, 77);
    cr_expect_eq(idem_posval_judge(100, &v, &other), IDEM_POSVAL_CLUSTER);
    /* The topic recreated with more records: offset 99 is another record. */
    idem_posval_now_t again = now_read("A", 0, 500, 99, 6000, 12);
    cr_expect_eq(idem_posval_judge(100, &v, &again), IDEM_POSVAL_RECORD);
    idem_posval_now_t samets = now_read("A", 0, 500, 99, 5000, 12);
    cr_expect_eq(idem_posval_judge(100, &v, &samets), IDEM_POSVAL_RECORD);
    /* Compacted away: the next record came instead; not the one. */
    idem_posval_now_t next = now_read("A", 0, 500, 101, 5000, 77);
    cr_expect_eq(idem_posval_judge(100, &v, &next), IDEM_POSVAL_RECORD);
    /* Fewer records than the position. */
    idem_posval_now_t short_ = now_read("A", 0, 60, -1, 0, 0);
    cr_expect_eq(idem_posval_judge(100, &v, &short_), IDEM_POSVAL_PAST_END);
    /* The position at the end, its record gone with a shorter topic. */
    idem_posval_now_t at_end = now_read("A", 0, 99, -1, 0, 0);
    cr_expect_eq(idem_posval_judge(99, &v, &at_end), IDEM_POSVAL_PAST_END);
    /* Retention removed the record: cannot be told, used in range. */
    idem_posval_now_t gone = now_read("A", 120, 150, -1, 0, 0);
    cr_expect_eq(idem_posval_judge(100, &v, &gone), IDEM_POSVAL_USE);
    /* Not read for another reason: not used. */
    idem_posval_now_t unread = now_read("A", 0, 150, -1, 0, 0);
    cr_expect_eq(idem_posval_judge(100, &v, &unread), IDEM_POSVAL_RECORD);
}

Test(posval, older_values_are_judged_by_cluster_and_end)
{
    idem_posval_t legacy = val(NULL, -1, -1, 0);
    idem_posval_now_t n = now_read("A", 0, 150, -1, 0, 0);
    cr_expect_eq(idem_posval_judge(150, &legacy, &n), IDEM_POSVAL_USE);
    cr_expect_eq(idem_posval_judge(151, &legacy, &n), IDEM_POSVAL_PAST_END);
    idem_posval_t first = val("A", -1, -1, 0);
    idem_posval_now_t b = now_read("B", 0, 150, -1, 0, 0);
    cr_expect_eq(idem_posval_judge(10, &first, &b), IDEM_POSVAL_CLUSTER);
    /* Nothing known about the cluster now: judged by the records. */
    idem_posval_t v = val("A", 9, 1, 2);
    idem_posval_now_t unknown = now_read(NULL, 0, 150, 9, 1, 2);
    cr_expect_eq(idem_posval_judge(10, &v, &unknown), IDEM_POSVAL_USE);
}

Test(posval, verdict_names)
{
    cr_expect_str_eq(idem_posval_verdict2str(IDEM_POSVAL_USE), "use");
    cr_expect_str_eq(idem_posval_verdict2str(IDEM_POSVAL_PAST_END), "past-end");
}

/* The loop counts a mismatch by its verdict's name, and the metric drops
 * a name it does not know: every verdict but USE must be a reason label. */
Test(posval, every_mismatch_verdict_is_a_metric_reason)
{
    idem_posval_verdict_t v[] = {IDEM_POSVAL_CLUSTER, IDEM_POSVAL_RECORD,
                                 IDEM_POSVAL_PAST_END};
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        const char *why = idem_posval_verdict2str(v[i]);
        int known = 0;
        for (int j = 0; idem_metrics_mismatch_reasons[j]; j++)
            known |= !strcmp(why, idem_metrics_mismatch_reasons[j]);
        cr_expect(known, "verdict \"%s\" is no reason label", why);
    }
}
