/* test_due: which records in hand go to the handler, and that a record
 * that is not due holds back the rest of its partition only. */
#include "loop/due.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

static idem_offsets_t offs;
static idem_records_t recs;
static rec_t *rs[16];
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
    cr_assert_lt(nrs, 16);
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

/* The offsets selected, as "p:o p:o ...". */
static const char *selected(int one_per_identity, int64_t now)
{
    static char buf[256];
    rec_t *out[16];
    size_t n = idem_due_select(&recs, &offs, one_per_identity, now, out);
    buf[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(buf);
        snprintf(buf + len, sizeof(buf) - len, "%s%d:%d", i ? " " : "",
                 (int)out[i]->view.partition, (int)out[i]->view.offset);
    }
    return buf;
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
