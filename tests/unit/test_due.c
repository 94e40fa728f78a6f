/* test_due: which records in hand go to the handler: by key (a record
 * starts after the previous one of its key finished, keys run side by
 * side, a retry holds back its key only, keyless records go by
 * partition), by partition (one at a time), or as due (a record that is
 * not due holds back the rest of its partition only). */
#include "loop/due.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

static idem_offsets_t offs;
static idem_records_t recs;
static rec_t *rs[512];
static size_t nrs;

static void setup(void)
{
    idem_offsets_init(&offs);
    idem_offsets_add(&offs, "t", 0);
    idem_offsets_add(&offs, "t", 1);
    idem_records_init(&recs, 4);
    nrs = 0;
}

static void teardown(void)
{
    for (size_t i = 0; i < nrs; i++)
        free(rs[i]);
    idem_records_term(&recs);
    idem_offsets_term(&offs);
}

TestSuite(due, .init = setup, .fini = teardown);

/* A parsed record of partition `part` at `offset` with identity `id`. */
static rec_t *rec(int32_t part, int64_t offset, const char *id)
{
    cr_assert_lt(nrs, 512);
    rec_t *r = calloc(1, sizeof(*r));
    r->view.topic = "t";
    r->view.partition = part;
    r->view.offset = offset;
    r->env.identity_len = strlen(id);
    memcpy(r->env.identity, id, r->env.identity_len);
    r->parsed = 1;
    rs[nrs++] = r;
    idem_records_push(&recs, r);
    return r;
}

/* A record of key `key` (NULL: none); the key bytes are borrowed. */
static rec_t *reck(int32_t part, int64_t offset, const char *id,
                   const char *key)
{
    rec_t *r = rec(part, offset, id);
    r->view.key = key;
    r->view.key_len = key ? strlen(key) : 0;
    return r;
}

/* The offsets a pass by `ordering` picks (at most max), as "p:o p:o ...";
 * the records marked sent are with the handler. */
static const char *pick(idem_ordering_t ordering, int one_per_identity,
                        int64_t now, size_t max)
{
    static char buf[1024];
    rec_t *out[512];
    idem_due_t d;
    idem_due_init(&d, ordering, one_per_identity);
    rec_t *r;
    for (size_t i = 0; (r = idem_records_next(&recs, &i));)
        if (r->sent)
            idem_due_sent(&d, r);
    size_t n = idem_due_select(&d, &recs, &offs, now, max, out);
    idem_due_term(&d);
    buf[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(buf);
        snprintf(buf + len, sizeof(buf) - len, "%s%d:%d", i ? " " : "",
                 (int)out[i]->view.partition, (int)out[i]->view.offset);
    }
    return buf;
}

/* The offsets selected as due (ordering=none), as "p:o p:o ...". */
static const char *selected(int one_per_identity, int64_t now)
{
    return pick(IDEM_ORDERING_NONE, one_per_identity, now, 512);
}

Test(due, all_due_in_poll_order)
{
    rec(0, 5, "a");
    rec(1, 7, "b");
    rec(0, 6, "c");
    cr_expect_str_eq(selected(0, 1000), "0:5 1:7 0:6");
}

Test(due, finished_poison_sent_and_retry_bound_are_skipped)
{
    rec(0, 1, "a")->state = REC_DONE;
    rec(0, 2, "b")->poison = 1;
    rec(0, 3, "c")->sent = 1;
    rec(0, 4, "d")->to_tier = 1;
    rec(0, 5, "e");
    cr_expect_str_eq(selected(0, 1000), "0:5");
}

Test(due, retry_time_holds_back_its_partition_only)
{
    rec(0, 5, "a")->retry_at_ms = 2000;
    rec(1, 7, "b");
    rec(0, 6, "c");
    rec(1, 8, "d");
    cr_expect_str_eq(selected(0, 1000), "1:7 1:8");
    cr_expect(idem_offsets_find(&offs, "t", 0)->waiting);
    cr_expect(!idem_offsets_find(&offs, "t", 1)->waiting);
    /* Due now: the partition goes on in order, the flag is cleared. */
    cr_expect_str_eq(selected(0, 2000), "0:5 1:7 0:6 1:8");
    cr_expect(!idem_offsets_find(&offs, "t", 0)->waiting);
}

Test(due, identity_with_the_handler_holds_back_an_external_effect)
{
    rec(0, 5, "k")->sent = 1; /* with the handler */
    rec(0, 6, "k");           /* same identity: waits, and 0:7 behind it */
    rec(0, 7, "x");
    rec(1, 8, "y");
    rec(1, 9, "y"); /* picked just before in this pass */
    rec(1, 10, "z");
    cr_expect_str_eq(selected(1, 1000), "1:8");
    /* An in-Redis effect takes them all (its script orders identities). */
    cr_expect_str_eq(selected(0, 1000), "0:6 0:7 1:8 1:9 1:10");
}

Test(due, record_of_a_partition_not_held_goes_alone)
{
    rec(9, 1, "a")->retry_at_ms = 2000;
    rec(9, 2, "b");
    cr_expect_str_eq(selected(0, 1000), "9:2");
}

/* ------------------------------------------------------------ by key */

Test(due, by_key_the_first_of_each_key_in_poll_order)
{
    reck(0, 1, "a", "k1");
    reck(0, 2, "b", "k2");
    reck(0, 3, "c", "k1");
    reck(0, 4, "d", NULL);
    reck(0, 5, "e", "k2");
    reck(0, 6, "f", NULL);
    reck(0, 7, "g", "k3");
    cr_expect_str_eq(pick(IDEM_ORDERING_KEY, 1, 1000, 512), "0:1 0:2 0:4 0:7");
    /* By partition: one record of a partition at a time. */
    cr_expect_str_eq(pick(IDEM_ORDERING_PARTITION, 1, 1000, 512), "0:1");
    /* As due: everything, in poll order. */
    cr_expect_str_eq(pick(IDEM_ORDERING_NONE, 1, 1000, 512),
                     "0:1 0:2 0:3 0:4 0:5 0:6 0:7");
}

Test(due, by_key_a_record_with_the_handler_holds_back_its_key_only)
{
    reck(0, 1, "a", "k1")->sent = 1;
    reck(0, 2, "b", "k1");
    reck(0, 3, "c", "k2");
    reck(0, 4, "d", "k1");
    cr_expect_str_eq(pick(IDEM_ORDERING_KEY, 1, 1000, 512), "0:3");
    /* Finished: the next of its key starts (not the one after). */
    rs[0]->sent = 0;
    rs[0]->state = REC_DONE;
    cr_expect_str_eq(pick(IDEM_ORDERING_KEY, 1, 1000, 512), "0:2 0:3");
    cr_expect_str_eq(pick(IDEM_ORDERING_PARTITION, 1, 1000, 512), "0:2");
}

Test(due, by_key_a_retry_holds_back_its_key_only)
{
    reck(0, 1, "a", "k1")->retry_at_ms = 2000; /* waits for its retry */
    reck(0, 2, "b", "k1");
    reck(0, 3, "c", "k2");
    reck(0, 4, "d", "k2");
    cr_expect_str_eq(pick(IDEM_ORDERING_KEY, 1, 1000, 512), "0:3");
    /* As due, the retry holds back its whole partition (today's rule). */
    cr_expect_str_eq(pick(IDEM_ORDERING_NONE, 1, 1000, 512), "");
    /* By partition too. */
    cr_expect_str_eq(pick(IDEM_ORDERING_PARTITION, 1, 1000, 512), "");
    /* Its time came: it goes first, its key's next waits for it. */
    cr_expect_str_eq(pick(IDEM_ORDERING_KEY, 1, 2000, 512), "0:1 0:3");
}

Test(due, by_key_a_dead_letter_holds_back_its_key_a_retry_topic_releases_it)
{
    reck(0, 1, "a", "k1")->poison = 1; /* its dead letter is not written */
    reck(0, 2, "b", "k1");
    reck(0, 3, "c", "k2")->to_tier = 1; /* bound for a retry topic */
    reck(0, 4, "d", "k2");
    cr_expect_str_eq(pick(IDEM_ORDERING_KEY, 1, 1000, 512), "0:4");
    rs[0]->state = REC_DONE; /* dead-lettered */
    cr_expect_str_eq(pick(IDEM_ORDERING_KEY, 1, 1000, 512), "0:2 0:4");
}

Test(due, by_key_one_key_in_two_partitions_is_two_groups)
{
    reck(0, 1, "a", "k1")->sent = 1;
    reck(1, 1, "b", "k1");
    reck(0, 2, "c", "k1");
    cr_expect_str_eq(pick(IDEM_ORDERING_KEY, 1, 1000, 512), "1:1");
}

Test(due, by_key_keyless_records_go_one_at_a_time_per_partition)
{
    reck(0, 1, "a", NULL)->sent = 1;
    reck(0, 2, "b", NULL);
    reck(1, 3, "c", NULL);
    reck(0, 4, "d", "k1"); /* a key of its own: not behind them */
    reck(0, 5, "e", "");   /* an empty key is a key, not none */
    cr_expect_str_eq(pick(IDEM_ORDERING_KEY, 1, 1000, 512), "1:3 0:4 0:5");
}

Test(due, by_key_an_identity_with_the_handler_holds_back_the_other_key)
{
    reck(0, 1, "x", "k1")->sent = 1;
    reck(0, 2, "x", "k2"); /* a resend under another key */
    reck(0, 3, "y", "k2");
    reck(0, 4, "z", "k3");
    reck(0, 5, "z", "k4"); /* picked just before in this pass */
    cr_expect_str_eq(pick(IDEM_ORDERING_KEY, 1, 1000, 512), "0:4");
}

Test(due, a_pass_stops_at_max_and_keys_run_side_by_side)
{
    static char keys[300][8];
    for (int i = 0; i < 300; i++) {
        snprintf(keys[i], sizeof(keys[i]), "k%d", i % 100);
        char id[16];
        snprintf(id, sizeof(id), "id%d", i);
        reck(0, i, id, keys[i]);
    }
    cr_expect_str_eq(pick(IDEM_ORDERING_KEY, 1, 1000, 3), "0:0 0:1 0:2");
    /* Every key's first, all 100 of them, and nothing behind them. */
    const char *all = pick(IDEM_ORDERING_KEY, 1, 1000, 512);
    size_t n = 0;
    for (const char *p = all; *p; p++)
        n += *p == ' ';
    cr_expect_eq(n + 1, 100);
    cr_expect(strstr(all, "0:99") && !strstr(all, "0:100"));
}

Test(due, identities_back_from_the_handler_may_go_again)
{
    /* Many identities in and out of the set: a removal must not lose
     * another identity's place in its probe sequence. */
    idem_due_t d;
    idem_due_init(&d, IDEM_ORDERING_KEY, 1);
    static char ids[400][8];
    for (int i = 0; i < 400; i++) {
        snprintf(ids[i], sizeof(ids[i]), "i%d", i);
        rec(0, i, ids[i])->view.key = NULL;
        idem_due_sent(&d, rs[i]);
    }
    for (int i = 0; i < 400; i += 2) {
        idem_due_back(&d, rs[i]);
        rs[i]->state = REC_DONE;
    }
    /* Records again for every identity: only the ones back may go. */
    for (int i = 0; i < 100; i++) {
        rec_t *r = rec(1, i, ids[i]);
        r->view.key = ids[i]; /* a key each: no group holds them back */
        r->view.key_len = strlen(ids[i]);
    }
    rec_t *out[512];
    size_t n = idem_due_select(&d, &recs, &offs, 1000, 512, out);
    cr_expect_eq(n, 50);
    for (size_t i = 0; i < n; i++)
        cr_expect_eq(out[i]->view.offset % 2, 0, "offset %d went",
                     (int)out[i]->view.offset);
    idem_due_forget(&d);
    cr_expect_eq(idem_due_select(&d, &recs, &offs, 1000, 512, out), 100);
    idem_due_term(&d);
}

Test(due, census_counts_keys_waiting_and_the_deepest_key)
{
    reck(0, 1, "a", "k1")->sent = 1;
    reck(0, 2, "b", "k1");
    reck(0, 3, "c", "k1");
    reck(0, 4, "d", "k2");
    reck(0, 5, "e", "k2");
    reck(0, 6, "f", "k3");
    reck(0, 7, "g", "k4")->state = REC_DONE;
    reck(0, 8, "h", "k4");
    idem_due_t d;
    idem_due_init(&d, IDEM_ORDERING_KEY, 1);
    size_t waiting, hwm;
    idem_due_census(&d, &recs, &waiting, &hwm);
    cr_expect_eq(waiting, 2); /* k1 and k2 */
    cr_expect_eq(hwm, 3);
    rs[0]->state = rs[1]->state = REC_DONE;
    idem_due_census(&d, &recs, &waiting, &hwm);
    cr_expect_eq(waiting, 1);
    cr_expect_eq(hwm, 3, "a high-water mark stays");
    idem_due_term(&d);
}

/* The partitions that hold behind busy keys (bound `bound`), as "p p ..."
 * and their count; the records marked sent are with the handler. */
static const char *holds(idem_ordering_t ordering, int64_t now, size_t bound,
                         size_t *n)
{
    static char buf[64];
    idem_due_t d;
    idem_due_init(&d, ordering, 1);
    rec_t *r;
    for (size_t i = 0; (r = idem_records_next(&recs, &i));)
        if (r->sent)
            idem_due_sent(&d, r);
    *n = idem_due_key_holds(&d, &recs, &offs, now, bound);
    idem_due_term(&d);
    buf[0] = '\0';
    for (size_t i = 0; i < offs.cnt; i++) {
        cr_expect_eq(offs.v[i].blocked, 0, "scratch left set");
        cr_expect_eq(offs.v[i].waiting, 0, "scratch left set");
        if (offs.v[i].key_hold) {
            size_t len = strlen(buf);
            snprintf(buf + len, sizeof(buf) - len, "%s%d", len ? " " : "",
                     (int)offs.v[i].partition);
        }
    }
    return buf;
}

Test(due, a_partition_holds_when_its_records_all_wait_behind_busy_keys)
{
    size_t n;
    /* Partition 0: one hot key, its head with the handler, 3 waiting;
     * partition 1: two keys, each head with the handler, one waiting. */
    reck(0, 1, "a1", "hot")->sent = 1;
    reck(1, 1, "b1", "x")->sent = 1;
    reck(0, 2, "a2", "hot");
    reck(1, 2, "b2", "y")->sent = 1;
    reck(0, 3, "a3", "hot");
    reck(0, 4, "a4", "hot");
    reck(1, 3, "b3", "x");
    cr_expect_str_eq(holds(IDEM_ORDERING_KEY, 1000, 3, &n), "0");
    cr_expect_eq(n, 1);
    /* Below the bound nothing holds; at 2, both partitions do. */
    cr_expect_str_eq(holds(IDEM_ORDERING_KEY, 1000, 4, &n), "");
    cr_expect_eq(n, 0);
    cr_expect_str_eq(holds(IDEM_ORDERING_KEY, 1000, 1, &n), "0 1");
    cr_expect_eq(n, 2);
    /* Bound 0: never. */
    cr_expect_str_eq(holds(IDEM_ORDERING_KEY, 1000, 0, &n), "");
    /* As ordering=none nothing waits behind a key. */
    cr_expect_str_eq(holds(IDEM_ORDERING_NONE, 1000, 1, &n), "");
    cr_expect_eq(n, 0);
}

Test(due, a_hold_ends_as_soon_as_one_record_of_the_partition_may_start)
{
    size_t n;
    rec_t *head = reck(0, 1, "a1", "hot");
    head->sent = 1;
    reck(0, 2, "a2", "hot");
    reck(0, 3, "a3", "hot");
    rec_t *other = reck(0, 4, "c1", "cold");
    other->sent = 1;
    cr_expect_str_eq(holds(IDEM_ORDERING_KEY, 1000, 2, &n), "0");
    /* The cold key's next record may start: no hold. */
    reck(0, 5, "c2", "cold");
    other->state = REC_DONE;
    other->sent = 0;
    cr_expect_str_eq(holds(IDEM_ORDERING_KEY, 1000, 2, &n), "");
    /* The hot key's head finished: its next may start. */
    rs[nrs - 1]->sent = 1;
    cr_expect_str_eq(holds(IDEM_ORDERING_KEY, 1000, 2, &n), "0");
    head->state = REC_DONE;
    head->sent = 0;
    cr_expect_str_eq(holds(IDEM_ORDERING_KEY, 1000, 2, &n), "");
}

Test(due, a_head_waiting_for_its_retry_or_dead_letter_holds_by_partition)
{
    size_t n;
    reck(1, 1, "a1", "k")->retry_at_ms = 5000; /* an in-place retry */
    reck(1, 2, "a2", "k");
    reck(1, 3, "a3", "j");
    /* By key the other key may start; by partition nothing may. */
    cr_expect_str_eq(holds(IDEM_ORDERING_KEY, 1000, 2, &n), "");
    cr_expect_str_eq(holds(IDEM_ORDERING_PARTITION, 1000, 2, &n), "1");
    /* Once due, the head may start. */
    cr_expect_str_eq(holds(IDEM_ORDERING_PARTITION, 6000, 2, &n), "");
    /* A poison head (its dead letter in flight) holds likewise. */
    rs[0]->retry_at_ms = 0;
    rs[0]->poison = 1;
    cr_expect_str_eq(holds(IDEM_ORDERING_PARTITION, 6000, 2, &n), "1");
    /* A record sent to a retry topic released its key. */
    rs[0]->to_tier = 1;
    cr_expect_str_eq(holds(IDEM_ORDERING_PARTITION, 6000, 2, &n), "");
}

Test(due, an_unparsed_record_or_an_identity_with_the_handler)
{
    size_t n;
    reck(0, 1, "same", "a")->sent = 1;
    reck(0, 2, "same", "b"); /* its identity is with the handler */
    reck(0, 3, "x", "a");
    cr_expect_str_eq(holds(IDEM_ORDERING_KEY, 1000, 2, &n), "0");
    rec_t *r = reck(0, 4, "y", "c");
    r->parsed = 0; /* not read yet: no reason to hold */
    cr_expect_str_eq(holds(IDEM_ORDERING_KEY, 1000, 2, &n), "");
}
