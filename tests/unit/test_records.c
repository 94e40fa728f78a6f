/* test_records: the index of records in hand keeps poll order, never
 * moves a record, and closes holes lazily. */
#include "loop/records.h"

#include <criterion/criterion.h>

static int drop_even(void *rec, void *ctx)
{
    (void)ctx;
    return *(int *)rec % 2 == 0;
}

static int drop_listed(void *rec, void *ctx)
{
    const int *max = ctx;
    return *(int *)rec < *max;
}

Test(records, order_kept_holes_skipped_and_closed_lazily)
{
    int vals[100];
    idem_records_t r;
    idem_records_init(&r, 4);
    for (int i = 0; i < 100; i++) {
        vals[i] = i;
        idem_records_push(&r, &vals[i]); /* grows past 4 */
    }
    cr_expect_eq(r.live, 100);
    cr_expect_eq(idem_records_remove_if(&r, drop_even, NULL), 50);
    cr_expect_eq(r.live, 50);
    /* 50 holes among 50 records: not closed yet. */
    cr_expect_eq(r.end, 100);
    int *x, expect = 1, seen = 0;
    for (size_t i = 0; (x = idem_records_next(&r, &i));) {
        cr_expect_eq(*x, expect, "order");
        cr_expect_eq(x, &vals[expect], "a record never moves");
        expect += 2;
        seen++;
    }
    cr_expect_eq(seen, 50);
    /* Once holes outnumber records, they are closed. */
    int below = 60;
    cr_expect_eq(idem_records_remove_if(&r, drop_listed, &below), 30);
    cr_expect_eq(r.live, 20);
    cr_expect_eq(r.end, 20);
    size_t i = 0;
    cr_expect_eq(*(int *)idem_records_next(&r, &i), 61);
    /* A full index with holes closes them instead of growing. */
    idem_records_term(&r);
    idem_records_init(&r, 4);
    for (int k = 0; k < 4; k++)
        idem_records_push(&r, &vals[k]);
    int one = 1;
    idem_records_remove_if(&r, drop_listed, &one); /* drops vals[0] */
    idem_records_push(&r, &vals[4]);
    cr_expect_eq(r.cap, 4);
    cr_expect_eq(r.live, 4);
    i = 0;
    cr_expect_eq(*(int *)idem_records_next(&r, &i), 1);
    int all = 1000;
    cr_expect_eq(idem_records_remove_if(&r, drop_listed, &all), 4);
    cr_expect_eq(r.end, 0);
    i = 0;
    cr_expect_null(idem_records_next(&r, &i));
    idem_records_term(&r);
}

/* The mark stays in front of the records pushed after it, also when holes
 * before or after it are closed. */
Test(records, mark_follows_closed_holes)
{
    int vals[64];
    idem_records_t r;
    idem_records_init(&r, 8);
    for (int i = 0; i < 8; i++) {
        vals[i] = i;
        idem_records_push(&r, &vals[i]);
    }
    cr_expect_eq(idem_records_mark(&r), 0);
    idem_records_set_mark(&r);
    /* Holes before the mark, closed when a push finds the index full. */
    int max = 6;
    cr_expect_eq(idem_records_remove_if(&r, drop_listed, &max), 6);
    for (int i = 8; i < 12; i++) {
        vals[i] = i;
        idem_records_push(&r, &vals[i]);
    }
    int *x, expect = 8;
    for (size_t i = idem_records_mark(&r); (x = idem_records_next(&r, &i));)
        cr_expect_eq(*x, expect++, "from the mark: only the new ones");
    cr_expect_eq(expect, 12);
    /* Everything removed: the mark is at the (empty) end. */
    idem_records_set_mark(&r);
    max = 100;
    idem_records_remove_if(&r, drop_listed, &max);
    cr_expect_eq(r.live, 0);
    cr_expect_eq(idem_records_mark(&r), r.end);
    vals[12] = 12;
    idem_records_push(&r, &vals[12]);
    size_t i = idem_records_mark(&r);
    cr_expect_eq(idem_records_next(&r, &i), &vals[12]);
    idem_records_term(&r);
}
