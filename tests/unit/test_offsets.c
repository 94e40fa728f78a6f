/* test_offsets: finished prefixes with gaps, commit lists and positions
 * due, without a broker. */
#include "loop/offsets.h"

#include <criterion/criterion.h>
#include <string.h>

/* Feeds records (offset, finished) of one partition in poll order. */
static void advance(idem_offsets_t *o, idem_part_t *pt, const int64_t *off,
                    const int *fin, size_t n)
{
    idem_offsets_advance_begin(o);
    for (size_t i = 0; i < n; i++)
        idem_offsets_advance_rec(pt, off[i], fin[i]);
}

Test(offsets, prefix_stops_at_the_first_unfinished_record)
{
    idem_offsets_t o;
    idem_offsets_init(&o);
    idem_part_t *pt = idem_offsets_add(&o, "t", 0);
    cr_expect_eq(pt->next_offset, -1);
    /* 5 6 done, 7 not, 8 done: the prefix ends at 7. */
    int64_t off[] = {5, 6, 7, 8};
    int fin[] = {1, 1, 0, 1};
    advance(&o, pt, off, fin, 4);
    cr_expect_eq(pt->next_offset, 7);
    cr_expect(idem_offsets_below(pt, 6));
    cr_expect(!idem_offsets_below(pt, 7));
    cr_expect(!idem_offsets_below(pt, 8)); /* finished, but behind a gap */
    /* 7 finishes: over 8 too. */
    int64_t off2[] = {7, 8};
    int fin2[] = {1, 1};
    advance(&o, pt, off2, fin2, 2);
    cr_expect_eq(pt->next_offset, 9);
    /* Offsets with holes (compacted topics, transactions) are fine: the
     * prefix is over the records in hand, not over numbers. */
    int64_t off3[] = {20, 35, 36};
    int fin3[] = {1, 1, 0};
    advance(&o, pt, off3, fin3, 3);
    cr_expect_eq(pt->next_offset, 36);
    /* Nothing in hand: nothing moves. */
    advance(&o, pt, NULL, NULL, 0);
    cr_expect_eq(pt->next_offset, 36);
    idem_offsets_term(&o);
}

Test(offsets, partitions_advance_independently)
{
    idem_offsets_t o;
    idem_offsets_init(&o);
    idem_part_t *a = idem_offsets_add(&o, "t", 0);
    idem_offsets_add(&o, "t", 1);
    idem_offsets_add(&o, "u", 0);
    cr_expect_eq(idem_offsets_add(&o, "t", 0), a, "added twice");
    cr_expect_eq(o.cnt, 3);
    idem_offsets_advance_begin(&o);
    /* Interleaved poll order: t/0 blocked at 1, t/1 goes on. */
    idem_offsets_advance_rec(idem_offsets_find(&o, "t", 0), 0, 1);
    idem_offsets_advance_rec(idem_offsets_find(&o, "t", 1), 0, 1);
    idem_offsets_advance_rec(idem_offsets_find(&o, "t", 0), 1, 0);
    idem_offsets_advance_rec(idem_offsets_find(&o, "t", 1), 1, 1);
    idem_offsets_advance_rec(idem_offsets_find(&o, "t", 0), 2, 1);
    cr_expect_eq(idem_offsets_find(&o, "t", 0)->next_offset, 1);
    cr_expect_eq(idem_offsets_find(&o, "t", 1)->next_offset, 2);
    cr_expect_eq(idem_offsets_find(&o, "u", 0)->next_offset, -1);
    idem_offsets_remove(&o, "t", 0);
    cr_expect_null(idem_offsets_find(&o, "t", 0));
    cr_expect_eq(idem_offsets_find(&o, "t", 1)->next_offset, 2);
    idem_offsets_remove(&o, "nope", 9); /* not held: nothing */
    cr_expect_eq(o.cnt, 2);
    idem_offsets_term(&o);
}

/* Positions go to Redis when the prefix moved past what Redis holds; the
 * commit list holds what Redis acknowledged and Kafka has not. */
Test(offsets, positions_due_and_commit_list)
{
    idem_offsets_t o;
    idem_offsets_init(&o);
    idem_part_t *a = idem_offsets_add(&o, "t", 0);
    idem_part_t *b = idem_offsets_add(&o, "t", 1);
    idem_store_pos_t pos[2];
    cr_expect_eq(idem_offsets_positions_due(&o, NULL, NULL, pos), 0);
    cr_expect_null(idem_offsets_commit_list(&o, NULL, 0));
    a->next_offset = 10;
    b->next_offset = 4;
    b->saved = 4; /* Redis has it already */
    cr_assert_eq(idem_offsets_positions_due(&o, NULL, NULL, pos), 1);
    cr_expect_eq(pos[0].partition, 0);
    cr_expect_eq(pos[0].offset, 10);
    a->saved = 10;
    rd_kafka_topic_partition_list_t *l = idem_offsets_commit_list(&o, NULL, 0);
    cr_assert(l);
    cr_expect_eq(l->cnt, 2);
    rd_kafka_topic_partition_list_destroy(l);
    a->committed = 10;
    b->committed = 4;
    cr_expect_null(idem_offsets_commit_list(&o, NULL, 0));
    /* After a failed commit everything is sent again. */
    l = idem_offsets_commit_list(&o, NULL, 1);
    cr_assert(l);
    cr_expect_eq(l->cnt, 2);
    rd_kafka_topic_partition_list_destroy(l);
    /* A subset (a revoke) limits both. */
    a->next_offset = 12;
    b->next_offset = 6;
    rd_kafka_topic_partition_list_t *sub = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(sub, "t", 1);
    cr_assert_eq(idem_offsets_positions_due(&o, sub, NULL, pos), 1);
    cr_expect_eq(pos[0].partition, 1);
    cr_expect_eq(pos[0].offset, 6);
    rd_kafka_topic_partition_list_destroy(sub);
    idem_offsets_term(&o);
}

/* A due position carries the cluster id and the record just below it (the
 * one that moved the prefix there), never a record at or past it. */
Test(offsets, positions_carry_cluster_and_record)
{
    idem_offsets_t o;
    idem_offsets_init(&o);
    idem_part_t *a = idem_offsets_add(&o, "t", 0);
    cr_expect_eq(a->start, -1);
    cr_expect_eq(a->fp.offset, -1);
    a->next_offset = 10;
    a->fp.offset = 9;
    a->fp.timestamp = 1234;
    a->fp.hash = 0xabcdef;
    idem_store_pos_t pos[1];
    cr_assert_eq(idem_offsets_positions_due(&o, NULL, "C1", pos), 1);
    cr_expect_str_eq(pos[0].val.cluster, "C1");
    cr_expect_eq(pos[0].val.rec.offset, 9);
    cr_expect_eq(pos[0].val.rec.timestamp, 1234);
    cr_expect_eq(pos[0].val.rec.hash, 0xabcdef);
    /* A record not below the position (a rewind moved it back): none. */
    a->next_offset = 5;
    cr_assert_eq(idem_offsets_positions_due(&o, NULL, NULL, pos), 1);
    cr_expect_str_eq(pos[0].val.cluster, "");
    cr_expect_eq(pos[0].val.rec.offset, -1);
    idem_offsets_term(&o);
}

/* The partition found last is tried first: lookups stay right after
 * partitions come and go (the remembered slot moved or gone), and a topic
 * is matched by its bytes, not only by the pointer the table holds. */
Test(offsets, find_after_add_and_remove)
{
    idem_offsets_t o;
    idem_offsets_init(&o);
    for (int32_t p = 0; p < 40; p++)
        idem_offsets_add(&o, p % 2 ? "b" : "a", p);
    char a[] = "a";
    cr_expect_eq(idem_offsets_find(&o, a, 38)->partition, 38);
    cr_expect_null(idem_offsets_find(&o, "b", 38));
    cr_expect_eq(idem_offsets_find(&o, "b", 39)->partition, 39);
    idem_offsets_remove(&o, "b", 39); /* the remembered slot is gone */
    cr_expect_null(idem_offsets_find(&o, "b", 39));
    cr_expect_eq(idem_offsets_find(&o, "a", 2)->partition, 2);
    idem_offsets_remove(&o, "a", 2); /* the last one moves into its slot */
    cr_expect_null(idem_offsets_find(&o, "a", 2));
    idem_part_t *pt = idem_offsets_find(&o, "a", 38);
    cr_assert_not_null(pt);
    cr_expect_str_eq(pt->topic, "a");
    cr_expect_eq(pt->partition, 38);
    for (int32_t p = 0; p < 38; p++) {
        pt = idem_offsets_find(&o, p % 2 ? "b" : "a", p);
        if (p == 2) {
            cr_expect_null(pt);
            continue;
        }
        cr_assert_not_null(pt, "%d", p);
        cr_expect_eq(pt->partition, p);
        cr_expect_str_eq(pt->topic, p % 2 ? "b" : "a");
    }
    idem_offsets_term(&o);
}

/* The one-walk form (advance_take) lets go of exactly the records the two
 * walks (advance_rec for all, then below) let go of, and leaves the same
 * prefixes, for every mix of finished records over two partitions. */
Test(offsets, advance_take_matches_advance_then_below)
{
    /* Poll order: t/0 and t/1 interleaved, offsets ascending each. */
    const int part[] = {0, 1, 0, 0, 1, 1, 0, 1};
    const int64_t off[] = {3, 10, 4, 6, 11, 14, 7, 15};
    const size_t n = sizeof(off) / sizeof(off[0]);
    for (unsigned mask = 0; mask < 1u << n; mask++) {
        idem_offsets_t a, b;
        idem_offsets_init(&a);
        idem_offsets_init(&b);
        idem_part_t *pa[2] = {idem_offsets_add(&a, "t", 0),
                              idem_offsets_add(&a, "t", 1)};
        idem_part_t *pb[2] = {idem_offsets_add(&b, "t", 0),
                              idem_offsets_add(&b, "t", 1)};
        /* An earlier prefix above some records in hand. */
        pa[0]->next_offset = pb[0]->next_offset = 5;
        idem_offsets_advance_begin(&a);
        for (size_t i = 0; i < n; i++)
            idem_offsets_advance_rec(pa[part[i]], off[i], mask >> i & 1);
        idem_offsets_advance_begin(&b);
        for (size_t i = 0; i < n; i++) {
            int fin = mask >> i & 1;
            int two = fin && idem_offsets_below(pa[part[i]], off[i]);
            int one = idem_offsets_advance_take(pb[part[i]], off[i], fin);
            cr_assert_eq(one, two, "mask %x record %zu", mask, i);
        }
        for (int k = 0; k < 2; k++)
            cr_assert_eq(pa[k]->next_offset, pb[k]->next_offset, "mask %x",
                         mask);
        cr_assert(!idem_offsets_advance_take(NULL, 1, 1), "not held");
        idem_offsets_term(&a);
        idem_offsets_term(&b);
    }
}

/* The rewind decision, one row per case (rewind_decide). */
typedef struct {
    const char *why;
    int checked;
    int64_t saved, committed, start; /* the partition as the member knew it */
    int64_t redis, hold;
    int reconnected, other_server;
    int behind;
    int64_t rewind;
    int forget;
} rewind_case_t;

Test(offsets, rewind_decide)
{
    static const rewind_case_t cases[] = {
        {"first look: redis behind what is in hand wins", 0, -1, -1, -1, 40, 50,
         0, 0, 0, 40, 0},
        {"first look: redis ahead of what is in hand: no seek (marks say)", 0,
         -1, -1, -1, 40, 30, 0, 0, 0, -1, 0},
        {"first look: nothing consumed yet: start at redis", 0, -1, -1, -1, 40,
         -1, 0, 0, 0, 40, 0},
        {"first look: redis at what is in hand: no seek", 0, -1, -1, -1, 40, 40,
         0, 0, 0, -1, 0},
        {"first look: redis behind kafka's commit: said, and read from redis",
         0, -1, 50, -1, 40, 45, 0, 0, 1, 40, 0},
        {"reconnect, same server, redis holds what it acknowledged", 1, 60, -1,
         10, 60, 70, 1, 0, 0, -1, 0},
        {"reconnect, same server, redis lost acknowledged writes", 1, 60, -1,
         10, 50, 70, 1, 0, 1, 50, 0},
        {"reconnect to another server: back to its position", 1, 60, -1, 10, 60,
         70, 1, 1, 0, 60, 0},
        {"another server ahead of what is in hand: no seek", 1, 60, -1, 10, 80,
         70, 1, 1, 0, -1, 0},
        {"position gone after a reconnect: back to the assignment's start", 1,
         60, -1, 10, -1, 70, 1, 0, 1, 10, 1},
        {"position gone, start not before what is held: forget only", 1, 60, -1,
         70, -1, 70, 1, 0, 1, -1, 1},
        {"position gone without a reconnect (first look): nothing", 0, -1, -1,
         -1, -1, 70, 0, 0, 0, -1, 0},
        {"position gone, never acknowledged one: nothing", 1, -1, -1, -1, -1,
         70, 1, 0, 0, -1, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const rewind_case_t *c = &cases[i];
        idem_part_t pt = {.checked = c->checked,
                          .saved = c->saved,
                          .committed = c->committed,
                          .start = c->start,
                          .next_offset = -1,
                          .saving = -1};
        idem_offsets_rewind_t d = idem_offsets_rewind_decide(
            &pt, c->redis, c->hold, c->reconnected, c->other_server);
        cr_expect_eq(d.behind, c->behind, "%s: behind %d", c->why, d.behind);
        cr_expect_eq(d.rewind, c->rewind, "%s: rewind %lld", c->why,
                     (long long)d.rewind);
        cr_expect_eq(d.forget, c->forget, "%s: forget %d", c->why, d.forget);
    }
}
