/* test_parttables (unit): the member's partition tables: the path a record
 * takes, marks keyed by the group's key, duplicates inside a chunk, moved
 * marks sent to the global path, a refused increment settled as moved, a
 * window Redis chose, reset and drop, expiry and the memory bound. */
#include "loop/parttables.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

static const uint8_t key1[16] = "0123456789abcdef";
static const uint8_t key2[16] = "fedcba9876543210";

static idem_mark_t16 mark(const idem_parttables_t *t, const char *id,
                          const char *mid)
{
    idem_mark_t16 m;
    idem_parttables_mark(t, id, strlen(id), mid, strlen(mid), &m);
    return m;
}

Test(parttables, only_keyed_input_records_take_the_partition_path)
{
    cr_expect_eq(idem_parttables_path(0, 0, 5), IDEM_PART_PATH_PARTITION);
    cr_expect_eq(idem_parttables_path(1, 0, 5), IDEM_PART_PATH_GLOBAL);
    cr_expect_eq(idem_parttables_path(0, 1, 5), IDEM_PART_PATH_GLOBAL);
    cr_expect_eq(idem_parttables_path(0, 0, 0), IDEM_PART_PATH_GLOBAL);
}

Test(parttables, marks_are_keyed_and_carry_the_message_id_digest)
{
    idem_parttables_t *a = idem_parttables_new(key1, 1 << 20);
    idem_parttables_t *b = idem_parttables_new(key2, 1 << 20);
    idem_mark_t16 m1 = mark(a, "id-1", "m-1"), m2 = mark(a, "id-1", "m-2");
    idem_mark_t16 m3 = mark(b, "id-1", "m-1");
    cr_expect_arr_eq(m1.b, m2.b, 12, "same identity, same hash");
    cr_expect_arr_neq(m1.b + 12, m2.b + 12, 4, "other message id");
    cr_expect_arr_neq(m1.b, m3.b, 12, "another group's key");
    cr_expect_eq(m1.b[12] & 0x80, 0);
    cr_expect(!idem_mark_moved(&m1));
    /* identities are byte strings: a NUL is data */
    idem_mark_t16 n1, n2;
    idem_parttables_mark(a, "a\0b", 3, "m", 1, &n1);
    idem_parttables_mark(a, "a\0c", 3, "m", 1, &n2);
    cr_expect_arr_neq(n1.b, n2.b, 12);
    idem_parttables_destroy(a);
    idem_parttables_destroy(b);
}

Test(parttables, lookup_answers_duplicates_and_moved_marks)
{
    idem_parttables_t *t = idem_parttables_new(key1, 1 << 20);
    idem_mark_t16 m = mark(t, "id-1", "m-1"), again = mark(t, "id-1", "m-9");
    cr_expect_eq(idem_parttables_take(t, "in", 0, &m, 7, NULL),
                 IDEM_PART_NOT_READY);
    cr_assert_eq(idem_parttables_assign(t, "in", 0, 3), 0);
    cr_expect_eq(idem_parttables_take(t, "in", 0, &m, 7, NULL),
                 IDEM_PART_NOT_READY, "not loaded yet");
    /* a moved mark loaded from Redis */
    idem_mark_t16 mv = mark(t, "id-2", "m-2");
    mv.b[12] = 0x80;
    mv.b[13] = mv.b[14] = mv.b[15] = 0;
    cr_assert_eq(idem_parttables_load(t, "in", 0, mv.b, 1, 6), 0);
    idem_parttables_loaded(t, "in", 0);
    int64_t epoch = 0;
    cr_expect(idem_parttables_ready(t, "in", 0, &epoch));
    cr_expect_eq(epoch, 3);
    cr_expect_eq(idem_parttables_take(t, "in", 0, &m, 7, NULL), IDEM_PART_NEW);
    /* the same identity later in the same chunk: a duplicate of the first,
     * whose message id digest it reports */
    uint32_t prior = 0;
    cr_expect_eq(idem_parttables_take(t, "in", 0, &again, 7, &prior),
                 IDEM_PART_DUPLICATE);
    cr_expect_eq(prior, (uint32_t)m.b[12] << 24 | (uint32_t)m.b[13] << 16 |
                            (uint32_t)m.b[14] << 8 | m.b[15]);
    idem_mark_t16 id2 = mark(t, "id-2", "m-3");
    cr_expect_eq(idem_parttables_take(t, "in", 0, &id2, 7, NULL),
                 IDEM_PART_MOVED);
    /* another partition's table is another table */
    cr_expect_eq(idem_parttables_take(t, "in", 1, &m, 7, NULL),
                 IDEM_PART_NOT_READY);
    idem_parttables_destroy(t);
}

Test(parttables, settle_moves_a_refused_mark_and_a_window)
{
    idem_parttables_t *t = idem_parttables_new(key1, 1 << 20);
    cr_assert_eq(idem_parttables_assign(t, "in", 0, 1), 0);
    idem_parttables_loaded(t, "in", 0);
    idem_mark_t16 a = mark(t, "a", "1"), b = mark(t, "b", "2");
    cr_assert_eq(idem_parttables_take(t, "in", 0, &a, 10, NULL), IDEM_PART_NEW);
    cr_assert_eq(idem_parttables_take(t, "in", 0, &b, 10, NULL), IDEM_PART_NEW);
    /* Redis answered window 11; a's increment was refused */
    cr_assert_eq(idem_parttables_settle(t, "in", 0, &a, 10, 11, 1), 0);
    cr_assert_eq(idem_parttables_settle(t, "in", 0, &b, 10, 11, 0), 0);
    cr_expect_eq(idem_parttables_count(t, "in", 0), 2);
    idem_mark_t16 a2 = mark(t, "a", "3");
    cr_expect_eq(idem_parttables_take(t, "in", 0, &a2, 11, NULL),
                 IDEM_PART_MOVED, "a refused record's copy goes global");
    /* b now lives in window 11: expiring window 10 keeps it */
    idem_parttables_expire(t, 11);
    cr_expect_eq(idem_parttables_count(t, "in", 0), 2);
    idem_parttables_expire(t, 12);
    cr_expect_eq(idem_parttables_count(t, "in", 0), 0);
    idem_parttables_destroy(t);
}

Test(parttables, reset_empties_and_drop_forgets)
{
    idem_parttables_t *t = idem_parttables_new(key1, 1 << 20);
    cr_assert_eq(idem_parttables_assign(t, "in", 0, 1), 0);
    cr_assert_eq(idem_parttables_assign(t, "in", 1, 1), 0);
    idem_parttables_loaded(t, "in", 0);
    idem_parttables_loaded(t, "in", 1);
    idem_mark_t16 a = mark(t, "a", "1");
    cr_assert_eq(idem_parttables_take(t, "in", 0, &a, 1, NULL), IDEM_PART_NEW);
    idem_parttables_reset(t, "in", 0);
    cr_expect(!idem_parttables_ready(t, "in", 0, NULL));
    cr_expect_eq(idem_parttables_count(t, "in", 0), 0);
    cr_expect(idem_parttables_ready(t, "in", 1, NULL));
    idem_parttables_drop(t, "in", 1);
    cr_expect(!idem_parttables_ready(t, "in", 1, NULL));
    /* a re-assignment starts from an empty, unloaded table */
    idem_parttables_loaded(t, "in", 0);
    cr_assert_eq(idem_parttables_take(t, "in", 0, &a, 1, NULL), IDEM_PART_NEW);
    cr_assert_eq(idem_parttables_assign(t, "in", 0, 2), 0);
    cr_expect_eq(idem_parttables_count(t, "in", 0), 0);
    cr_expect(!idem_parttables_ready(t, "in", 0, NULL));
    idem_parttables_destroy(t);
}

Test(parttables, window_alive_until_its_end_plus_ttl)
{
    /* window 8 s, TTL 64 s: window w lives until (w + 1) * 8 + 64 */
    cr_expect_eq(idem_parttables_min_window(1000, 8, 64), 117);
    /* window 116 ends at 117 * 8 + 64 = 1000: gone at 1000 */
    cr_expect_eq(idem_parttables_min_window(999, 8, 64), 116);
    cr_expect_eq(idem_parttables_min_window(10, 8, 64), -7);
}

Test(parttables, memory_bound_is_reached_never_evicted)
{
    enum { N = 20000 };
    static uint8_t marks[N * 16];
    idem_parttables_t *t = idem_parttables_new(key1, 64 * 1024);
    cr_assert_eq(idem_parttables_assign(t, "in", 0, 1), 0);
    for (int i = 0; i < N; i++) {
        idem_mark_t16 m;
        char id[16];
        snprintf(id, sizeof(id), "i%d", i);
        idem_parttables_mark(t, id, strlen(id), "m", 1, &m);
        memcpy(marks + 16 * i, m.b, 16);
    }
    cr_expect(!idem_parttables_full(t));
    /* 20,000 marks need more than 64 KiB: the load says the partition can
     * never fit */
    cr_expect_eq(idem_parttables_load(t, "in", 0, marks, N, 1), -2);
    cr_expect(idem_parttables_full(t));
    cr_expect_eq(idem_parttables_count(t, "in", 0), N, "nothing evicted");
    idem_parttables_drop(t, "in", 0);
    cr_expect(!idem_parttables_full(t));
    idem_parttables_destroy(t);
}

Test(parttables, a_changed_input_partition_count_holds_the_topic)
{
    cr_expect_eq(idem_parttables_count_verdict(-1, 4), IDEM_PART_COUNT_RECORD);
    cr_expect_eq(idem_parttables_count_verdict(4, 4), IDEM_PART_COUNT_SAME);
    /* partitions added (or a topic made again with fewer): keys moved */
    cr_expect_eq(idem_parttables_count_verdict(4, 6), IDEM_PART_COUNT_CHANGED);
    cr_expect_eq(idem_parttables_count_verdict(6, 4), IDEM_PART_COUNT_CHANGED);
    /* Kafka did not answer: never taken as a count to record */
    cr_expect_eq(idem_parttables_count_verdict(-1, 0), IDEM_PART_COUNT_UNKNOWN);
    cr_expect_eq(idem_parttables_count_verdict(4, -1), IDEM_PART_COUNT_UNKNOWN);
}

/* The lookup is indexed by topic, then partition number: each (topic,
 * partition) is its own table, whatever the order of assignment, with
 * sparse and growing partition numbers, and the totals cover every topic. */
Test(parttables, partitions_of_several_topics_are_kept_apart)
{
    static const char *const topics[] = {"in", "in.retry1", "other"};
    static const int32_t nums[] = {40, 0, 7, 1023, 8, 3};
    idem_parttables_t *t = idem_parttables_new(key1, 1 << 30);
    for (size_t k = 0; k < 3; k++)
        for (size_t i = 0; i < 6; i++) {
            cr_assert_eq(idem_parttables_assign(t, topics[k], nums[i],
                                                (int64_t)(10 * k + i)),
                         0);
            idem_parttables_loaded(t, topics[k], nums[i]);
        }
    cr_expect(!idem_parttables_ready(t, "in", 1, NULL), "never assigned");
    cr_expect(!idem_parttables_ready(t, "in", 1024, NULL), "past the last");
    cr_expect(!idem_parttables_ready(t, "in", -1, NULL));
    cr_expect(!idem_parttables_ready(t, "i", 0, NULL), "a prefix is not it");
    cr_expect_eq(idem_parttables_assign(t, "in", -1, 1), -1);
    /* identity "x" taken in every table once: new each time */
    idem_mark_t16 x = mark(t, "x", "1");
    for (size_t k = 0; k < 3; k++)
        for (size_t i = 0; i < 6; i++) {
            int64_t epoch = -1;
            cr_assert(idem_parttables_ready(t, topics[k], nums[i], &epoch));
            cr_expect_eq(epoch, (int64_t)(10 * k + i), "%s/%d", topics[k],
                         nums[i]);
            cr_expect_eq(
                idem_parttables_take(t, topics[k], nums[i], &x, 1, NULL),
                IDEM_PART_NEW, "%s/%d", topics[k], nums[i]);
        }
    cr_expect_eq(idem_parttables_marks(t), 18);
    size_t all = idem_parttables_bytes(t);
    /* dropping one leaves its neighbours and the other topics' alone */
    idem_parttables_drop(t, "in.retry1", 1023);
    idem_parttables_drop(t, "in.retry1", 1023); /* twice: no-op */
    cr_expect(!idem_parttables_ready(t, "in.retry1", 1023, NULL));
    cr_expect_eq(idem_parttables_count(t, "in", 1023), 1);
    cr_expect_eq(idem_parttables_count(t, "other", 1023), 1);
    cr_expect_eq(idem_parttables_take(t, "in.retry1", 8, &x, 1, NULL),
                 IDEM_PART_DUPLICATE);
    cr_expect_eq(idem_parttables_marks(t), 17);
    cr_expect_lt(idem_parttables_bytes(t), all);
    /* a dropped partition assigned again starts empty and unloaded */
    cr_assert_eq(idem_parttables_assign(t, "in.retry1", 1023, 99), 0);
    cr_expect(!idem_parttables_ready(t, "in.retry1", 1023, NULL));
    cr_expect_eq(idem_parttables_count(t, "in.retry1", 1023), 0);
    /* expiry reaches every topic's tables */
    idem_parttables_expire(t, 2);
    cr_expect_eq(idem_parttables_marks(t), 0);
    idem_parttables_destroy(t);
}
