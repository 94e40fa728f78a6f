/* test_apply: the loop's one effect protocol (loop/apply.h): an external
 * handler wrapped in claim -> effect -> mark against a fake store seam,
 * and a store handler passed through with its positions; both fakes are
 * our own (a handler ops table, the lease seam). */
#include "loop/apply.h"

#include "fake_lease.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* The fake handler: keeps what it was given; collect answers each with
 * `answer` (DONE unless set). */
#define H_MAX 8
typedef struct {
    idem_record_t *got[H_MAX];
    size_t n;
    size_t npos; /* positions the last submit carried */
    int refuse;  /* 1: submit fails (outage) */
    int started; /* start saw a store: 1, none: 0 */
    int stopped;
    idem_result_kind_t answer;
} fake_handler_t;

static fake_handler_t fh;
static fake_lease_t fs;
static idem_lease_store_t fs_st;

static void *h_start(const idem_handler_ctx_t *ctx, char *errstr,
                     size_t errstr_size)
{
    (void)errstr;
    (void)errstr_size;
    fh.started = ctx->store != NULL;
    return &fh;
}

static int h_submit(void *h, idem_record_t *const *recs, size_t n,
                    const idem_store_pos_t *pos, size_t npos, char *errstr,
                    size_t errstr_size)
{
    (void)pos;
    fake_handler_t *f = h;
    if (f->refuse) {
        snprintf(errstr, errstr_size, "down");
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        f->got[f->n++] = recs[i];
    f->npos = npos;
    return 0;
}

static size_t h_collect(void *h, idem_result_t *out, size_t max, int timeout_ms)
{
    (void)timeout_ms;
    fake_handler_t *f = h;
    size_t n = f->n < max ? f->n : max;
    for (size_t i = 0; i < n; i++)
        idem_result_set(&out[i], f->got[i], f->answer, NULL);
    f->n = 0;
    return n;
}

static size_t h_inflight(void *h)
{
    return ((fake_handler_t *)h)->n;
}

static size_t h_room(void *h)
{
    (void)h;
    return 3;
}

static void h_drain(void *h, int64_t deadline_ms)
{
    (void)h;
    (void)deadline_ms;
}

static void h_stop(void *h)
{
    ((fake_handler_t *)h)->stopped = 1;
}

static const idem_handler_ops_t external_ops = {
    .api_version = IDEM_HANDLER_API_VERSION,
    .name = "fake-external",
    .effect = IDEM_EFFECT_EXTERNAL,
    .start = h_start,
    .submit = h_submit,
    .collect = h_collect,
    .inflight = h_inflight,
    .room = h_room,
    .drain = h_drain,
    .stop = h_stop,
};

static const idem_handler_ops_t store_ops = {
    .api_version = IDEM_HANDLER_API_VERSION,
    .name = "fake-store",
    .effect = IDEM_EFFECT_IN_REDIS,
    .start = h_start,
    .submit = h_submit,
    .collect = h_collect,
    .inflight = h_inflight,
    .drain = h_drain,
    .stop = h_stop,
};

static idem_offsets_t offs;
static idem_envelope_t envs[H_MAX];
static idem_record_t recs[H_MAX];
static idem_apply_t a;

static void setup(void)
{
    memset(&fh, 0, sizeof(fh));
    fs_st = fake_lease_init(&fs);
    memset(&a, 0, sizeof(a));
    fh.answer = IDEM_RESULT_DONE;
    idem_offsets_init(&offs);
    idem_offsets_add(&offs, "t", 0);
}

static void teardown(void)
{
    idem_apply_stop(&a);
    idem_offsets_term(&offs);
}

TestSuite(apply, .init = setup, .fini = teardown);

static void start(const idem_handler_ops_t *ops)
{
    char err[128];
    int store; /* any non-NULL pointer stands for the store */
    idem_handler_ctx_t ctx = {.store = (idem_store_t *)&store};
    cr_assert_eq(idem_apply_start(&a, ops, &ctx, fs_st, 4000, err, sizeof(err)),
                 0, "%s", err);
}

static idem_record_t *rec(size_t i, const char *id, const char *mid)
{
    memset(&envs[i], 0, sizeof(envs[i]));
    envs[i].identity_len = strlen(id);
    memcpy(envs[i].identity, id, envs[i].identity_len);
    envs[i].message_id_len = strlen(mid);
    memcpy(envs[i].message_id, mid, envs[i].message_id_len);
    memset(&recs[i], 0, sizeof(recs[i]));
    recs[i].topic = "t";
    recs[i].offset = (int64_t)i;
    recs[i].env = &envs[i];
    return &recs[i];
}

Test(apply, external_claims_runs_and_marks)
{
    start(&external_ops);
    cr_expect_eq(fh.started, 0, "an external effect never sees the store");
    cr_expect_eq(idem_apply_room(&a), 3, "the handler's room");
    cr_expect(idem_apply_one_per_identity(&a));
    cr_expect(!idem_apply_takes_positions(&a));
    idem_record_t *r[] = {rec(0, "k1", "m1"), rec(1, "k2", "m2")};
    idem_part_t *pt[] = {idem_offsets_find(&offs, "t", 0), NULL};
    pt[1] = pt[0];
    idem_result_t now[2], out[4];
    size_t taken, nnow;
    char err[128];
    cr_assert_eq(idem_apply_submit(&a, "lease:a:1", r, pt, 2, NULL, 0, &taken,
                                   now, &nnow, err, sizeof(err)),
                 0, "%s", err);
    cr_expect_eq(taken, 2);
    cr_expect_eq(nnow, 0);
    cr_expect_eq(fs.mark[0].state, 1, "leased before the effect");
    cr_assert_eq(idem_apply_collect(&a, "lease:a:1", out, 4, 0), 2);
    cr_expect_eq(out[0].kind, IDEM_RESULT_DONE);
    cr_expect_eq(out[1].kind, IDEM_RESULT_DONE);
    cr_expect_eq(fs.mark[0].state, 2, "marked done after the effect");
    cr_expect_eq(fs.mark[1].state, 2);
    /* Delivered again: answered at once, the handler never sees it. */
    idem_record_t *again[] = {rec(2, "k1", "m9")};
    cr_assert_eq(idem_apply_submit(&a, "lease:b:1", again, pt, 1, NULL, 0,
                                   &taken, now, &nnow, err, sizeof(err)),
                 0);
    cr_expect_eq(taken, 0);
    cr_assert_eq(nnow, 1);
    cr_expect_eq(now[0].kind, IDEM_RESULT_DUPLICATE);
    cr_expect_eq(now[0].rec, &recs[2]);
    cr_expect_eq(now[0].prior_mid_len, 2);
    cr_expect(!memcmp(now[0].prior_mid, "m1", 2));
    cr_expect_eq(fh.n, 0);
}

Test(apply, leased_elsewhere_is_busy_again_waits_behind_is_not_taken)
{
    start(&external_ops);
    a.ordering = IDEM_ORDERING_NONE; /* as due: a partition waits whole */
    /* k1 leased by another member. */
    fake_lease_hold(&fs, "k1", "lease:b:7");
    idem_offsets_add(&offs, "t", 1);
    idem_part_t *p0 = idem_offsets_find(&offs, "t", 0);
    idem_part_t *p1 = idem_offsets_find(&offs, "t", 1);
    /* p1: k2, k2 again (AGAIN), k3 behind it. p0: k1 (leased). */
    idem_record_t *r[] = {rec(0, "k2", "m2"), rec(1, "k2", "m2b"),
                          rec(2, "k3", "m3"), rec(3, "k1", "m1")};
    idem_part_t *pt[] = {p1, p1, p1, p0};
    idem_result_t now[4];
    size_t taken, nnow;
    char err[128];
    cr_assert_eq(idem_apply_submit(&a, "lease:a:1", r, pt, 4, NULL, 0, &taken,
                                   now, &nnow, err, sizeof(err)),
                 0);
    cr_assert_eq(taken, 1);
    cr_expect_eq(r[0], &recs[0], "the one taken first");
    cr_assert_eq(nnow, 1);
    cr_expect_eq(now[0].rec, &recs[3]);
    cr_expect_eq(now[0].kind, IDEM_RESULT_BUSY);
    cr_expect_eq(now[0].retry_after_ms, 4000 / 4 + 50,
                 "asked again after a quarter lease");
    cr_expect_str_eq(now[0].detail, "lease:b:7");
    cr_expect_eq(fh.n, 1, "AGAIN and BEHIND are not taken: due again");
}

/* By key (the default) a pass holds one record per key, and a record that
 * cannot go now holds back only its own key: k3 goes though k2's second
 * record, before it in its partition, waits. */
Test(apply, by_key_a_record_that_waits_holds_back_no_other_key)
{
    start(&external_ops);
    /* k1 leased by another member. */
    fake_lease_hold(&fs, "k1", "lease:b:7");
    idem_offsets_add(&offs, "t", 1);
    idem_part_t *p0 = idem_offsets_find(&offs, "t", 0);
    idem_part_t *p1 = idem_offsets_find(&offs, "t", 1);
    /* p1: k2, k2 again (AGAIN), k3 behind it. p0: k1 (leased). */
    idem_record_t *r[] = {rec(0, "k2", "m2"), rec(1, "k2", "m2b"),
                          rec(2, "k3", "m3"), rec(3, "k1", "m1")};
    idem_part_t *pt[] = {p1, p1, p1, p0};
    idem_result_t now[4];
    size_t taken, nnow;
    char err[128];
    cr_assert_eq(idem_apply_submit(&a, "lease:a:1", r, pt, 4, NULL, 0, &taken,
                                   now, &nnow, err, sizeof(err)),
                 0);
    cr_expect_eq(idem_apply_ordering(&a), IDEM_ORDERING_KEY);
    cr_assert_eq(taken, 2);
    cr_expect_eq(r[0], &recs[0], "the one taken first");
    cr_expect_eq(r[1], &recs[2], "k3: not behind k2's second");
    cr_assert_eq(nnow, 1);
    cr_expect_eq(now[0].rec, &recs[3]);
    cr_expect_eq(now[0].kind, IDEM_RESULT_BUSY);
    cr_expect_eq(now[0].retry_after_ms, 4000 / 4 + 50,
                 "asked again after a quarter lease");
    cr_expect_str_eq(now[0].detail, "lease:b:7");
    cr_expect_eq(fh.n, 2, "AGAIN is not taken: due again");
}

Test(apply, a_failed_mark_is_an_outage_and_stays_unmarked)
{
    start(&external_ops);
    idem_record_t *r[] = {rec(0, "k1", "m1")};
    idem_part_t *pt[] = {idem_offsets_find(&offs, "t", 0)};
    idem_result_t now[1], out[1];
    size_t taken, nnow;
    char err[128];
    cr_assert_eq(idem_apply_submit(&a, "lease:a:1", r, pt, 1, NULL, 0, &taken,
                                   now, &nnow, err, sizeof(err)),
                 0);
    fs.down = 1;
    cr_assert_eq(idem_apply_collect(&a, "lease:a:1", out, 1, 0), 1);
    cr_expect_eq(out[0].kind, IDEM_RESULT_OUTAGE);
    cr_expect_str_eq(out[0].detail, "redis: connection refused");
    cr_expect_eq(fs.mark[0].state, 1, "the lease expires, not marked");
    /* A claim that fails takes nothing. */
    cr_assert_eq(idem_apply_submit(&a, "lease:a:1", r, pt, 1, NULL, 0, &taken,
                                   now, &nnow, err, sizeof(err)),
                 -1);
    cr_expect_eq(taken, 0);
    cr_expect_eq(fh.n, 0);
}

Test(apply, only_done_results_are_marked)
{
    start(&external_ops);
    fh.answer = IDEM_RESULT_RETRY;
    idem_record_t *r[] = {rec(0, "k1", "m1")};
    idem_part_t *pt[] = {idem_offsets_find(&offs, "t", 0)};
    idem_result_t now[1], out[1];
    size_t taken, nnow;
    char err[128];
    idem_apply_submit(&a, "lease:a:1", r, pt, 1, NULL, 0, &taken, now, &nnow,
                      err, sizeof(err));
    cr_assert_eq(idem_apply_collect(&a, "lease:a:1", out, 1, 0), 1);
    cr_expect_eq(out[0].kind, IDEM_RESULT_RETRY);
    cr_expect_eq(fs.marks, 0);
    cr_expect_eq(fs.mark[0].state, 1);
}

Test(apply, store_handler_gets_everything_and_the_positions)
{
    start(&store_ops);
    cr_expect_eq(fh.started, 1, "a store handler gets the store");
    cr_expect(!idem_apply_one_per_identity(&a));
    cr_expect(idem_apply_takes_positions(&a));
    cr_expect_eq(idem_apply_room(&a), SIZE_MAX);
    idem_record_t *r[] = {rec(0, "k1", "m1"), rec(1, "k1", "m1")};
    idem_store_pos_t pos[1] = {{.topic = "t", .partition = 0, .offset = 7}};
    idem_result_t now[2], out[2];
    size_t taken, nnow;
    char err[128];
    cr_assert_eq(idem_apply_submit(&a, "lease:a:1", r, NULL, 2, pos, 1, &taken,
                                   now, &nnow, err, sizeof(err)),
                 0);
    cr_expect_eq(taken, 2, "both, the same identity too");
    cr_expect_eq(nnow, 0);
    cr_expect_eq(fh.npos, 1);
    cr_expect_eq(idem_apply_room(&a), 0, "one request at a time");
    cr_assert_eq(idem_apply_collect(&a, "lease:a:1", out, 2, 0), 2);
    cr_expect_eq(fs.marks, 0, "its own request marks");
    cr_expect_eq(fs.cnt, 0, "nothing claimed");
    cr_expect_eq(idem_apply_room(&a), SIZE_MAX);
    idem_apply_stop(&a);
    cr_expect(fh.stopped);
}

/* ordering= holds back only what the handler does not order itself: a
 * store handler's one request applies its records in poll order, and a
 * handler that keeps order (forward: one producer) gets them as due. */
Test(apply, ordering_by_key_for_external_effects_only)
{
    start(&external_ops);
    cr_expect_eq(idem_apply_ordering(&a), IDEM_ORDERING_KEY, "the default");
    idem_apply_stop(&a);
    start(&store_ops);
    cr_expect_eq(idem_apply_ordering(&a), IDEM_ORDERING_NONE);
    idem_apply_stop(&a);
    static idem_handler_ops_t keeps; /* outlives the test: teardown stops it */
    keeps = external_ops;
    keeps.keeps_order = 1;
    start(&keeps);
    cr_expect_eq(idem_apply_ordering(&a), IDEM_ORDERING_NONE);
}
