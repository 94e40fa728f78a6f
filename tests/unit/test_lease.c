/* test_lease: an external effect's lease life (NEW, DONE, AGAIN, leased
 * elsewhere, LOST) against a fake store of our own behind the lease seam
 * (loop/lease.h), and how a claim keeps each partition's order. */
#include "loop/lease.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

/* The fake store: one mark per identity, free, leased to an owner, or
 * done with the message id of the record that made it. */
#define FAKE_MAX 16
typedef struct {
    struct {
        char id[32];
        int state; /* 0 free, 1 leased, 2 done */
        char owner[64];
        char mid[32];
    } mark[FAKE_MAX];
    size_t cnt;
    int down;   /* 1: every call fails (an outage) */
    int claims; /* calls made */
} fake_t;

static int fake_find(fake_t *f, const idem_envelope_t *e)
{
    for (size_t i = 0; i < f->cnt; i++)
        if (strlen(f->mark[i].id) == e->identity_len &&
            !memcmp(f->mark[i].id, e->identity, e->identity_len))
            return (int)i;
    cr_assert_lt(f->cnt, FAKE_MAX);
    snprintf(f->mark[f->cnt].id, sizeof(f->mark[0].id), "%.*s",
             (int)e->identity_len, e->identity);
    return (int)f->cnt++;
}

static int fake_claim(void *ctx, const char *owner,
                      const idem_envelope_t *const *env, size_t n,
                      idem_store_result_t *res, char *errstr,
                      size_t errstr_size)
{
    fake_t *f = ctx;
    f->claims++;
    if (f->down) {
        snprintf(errstr, errstr_size, "redis: connection refused");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        memset(&res[i], 0, sizeof(res[i]));
        int again = 0;
        for (size_t j = 0; j < i && !again; j++)
            again = env[j]->identity_len == env[i]->identity_len &&
                    !memcmp(env[j]->identity, env[i]->identity,
                            env[i]->identity_len);
        int k = fake_find(f, env[i]);
        if (again) {
            res[i].mark = IDEM_MARK_AGAIN;
        } else if (f->mark[k].state == 2) {
            res[i].mark = IDEM_MARK_DONE;
            res[i].prior_mid_len = strlen(f->mark[k].mid);
            memcpy(res[i].prior_mid, f->mark[k].mid, res[i].prior_mid_len);
        } else if (f->mark[k].state == 1 && strcmp(f->mark[k].owner, owner)) {
            res[i].mark = IDEM_MARK_BUSY;
        } else {
            f->mark[k].state = 1;
            snprintf(f->mark[k].owner, sizeof(f->mark[k].owner), "%s", owner);
            res[i].mark = IDEM_MARK_NEW;
        }
    }
    return 0;
}

static int fake_mark(void *ctx, const char *owner,
                     const idem_envelope_t *const *env, size_t n,
                     idem_store_result_t *res, char *errstr, size_t errstr_size)
{
    fake_t *f = ctx;
    if (f->down) {
        snprintf(errstr, errstr_size, "redis: connection refused");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        memset(&res[i], 0, sizeof(res[i]));
        int k = fake_find(f, env[i]);
        if (f->mark[k].state == 1 && strcmp(f->mark[k].owner, owner)) {
            res[i].mark = IDEM_MARK_LOST;
            snprintf(res[i].detail, sizeof(res[i].detail), "%s",
                     f->mark[k].owner);
            continue;
        }
        f->mark[k].state = 2;
        snprintf(f->mark[k].mid, sizeof(f->mark[k].mid), "%.*s",
                 (int)env[i]->message_id_len, env[i]->message_id);
        res[i].mark = IDEM_MARK_NEW;
    }
    return 0;
}

static fake_t fake;
static idem_lease_store_t st;
static idem_offsets_t offs;
static idem_envelope_t envs[8];

static void setup(void)
{
    memset(&fake, 0, sizeof(fake));
    st = (idem_lease_store_t){fake_claim, fake_mark, &fake};
    idem_offsets_init(&offs);
    idem_offsets_add(&offs, "t", 0);
    idem_offsets_add(&offs, "t", 1);
}

static void teardown(void)
{
    idem_offsets_term(&offs);
}

TestSuite(lease, .init = setup, .fini = teardown);

static const idem_envelope_t *env(size_t i, const char *id, const char *mid)
{
    memset(&envs[i], 0, sizeof(envs[i]));
    envs[i].identity_len = strlen(id);
    memcpy(envs[i].identity, id, envs[i].identity_len);
    envs[i].message_id_len = strlen(mid);
    memcpy(envs[i].message_id, mid, envs[i].message_id_len);
    return &envs[i];
}

static idem_part_t *part(int32_t p)
{
    return idem_offsets_find(&offs, "t", p);
}

Test(lease, new_then_done_then_duplicate)
{
    const idem_envelope_t *e[] = {env(0, "k1", "m1")};
    idem_part_t *pt[] = {part(0)};
    idem_store_result_t res[1];
    idem_lease_verdict_t v[1];
    char err[128];
    cr_assert_eq(
        idem_lease_claim(&st, "lease:a:1", e, pt, 1, res, v, err, sizeof(err)),
        0);
    cr_expect_eq(v[0], IDEM_LEASE_GO, "%s", idem_lease_verdict2str(v[0]));
    /* The effect ran: the lease becomes the done mark. */
    cr_assert_eq(idem_lease_mark(&st, "lease:a:1", e, 1, res, err, sizeof(err)),
                 0);
    cr_expect_eq(res[0].mark, IDEM_MARK_NEW);
    /* Delivered again (any owner): a duplicate naming the first message. */
    e[0] = env(0, "k1", "m2");
    cr_assert_eq(
        idem_lease_claim(&st, "lease:b:1", e, pt, 1, res, v, err, sizeof(err)),
        0);
    cr_expect_eq(v[0], IDEM_LEASE_DUPLICATE);
    cr_expect_eq(res[0].prior_mid_len, 2);
    cr_expect(!memcmp(res[0].prior_mid, "m1", 2));
    cr_expect(!pt[0]->waiting, "a duplicate holds nothing back");
}

Test(lease, own_lease_is_claimed_again_another_owner_waits)
{
    const idem_envelope_t *e[] = {env(0, "k1", "m1")};
    idem_part_t *pt[] = {part(0)};
    idem_store_result_t res[1];
    idem_lease_verdict_t v[1];
    char err[128];
    idem_lease_claim(&st, "lease:a:1", e, pt, 1, res, v, err, sizeof(err));
    cr_assert_eq(v[0], IDEM_LEASE_GO);
    /* The same owner (a record dropped and read again): its own again. */
    idem_lease_claim(&st, "lease:a:1", e, pt, 1, res, v, err, sizeof(err));
    cr_expect_eq(v[0], IDEM_LEASE_GO);
    /* Another member (or this one after a rebalance: a new epoch) waits. */
    idem_lease_claim(&st, "lease:a:2", e, pt, 1, res, v, err, sizeof(err));
    cr_expect_eq(v[0], IDEM_LEASE_LEASED);
    cr_expect(pt[0]->waiting);
}

Test(lease, mark_after_takeover_is_lost)
{
    const idem_envelope_t *e[] = {env(0, "k1", "m1")};
    idem_part_t *pt[] = {part(0)};
    idem_store_result_t res[1];
    idem_lease_verdict_t v[1];
    char err[128];
    idem_lease_claim(&st, "lease:a:1", e, pt, 1, res, v, err, sizeof(err));
    /* The lease expired and another owner claimed it meanwhile. */
    fake.mark[0].state = 0;
    idem_lease_claim(&st, "lease:b:1", e, pt, 1, res, v, err, sizeof(err));
    cr_assert_eq(v[0], IDEM_LEASE_GO);
    cr_assert_eq(idem_lease_mark(&st, "lease:a:1", e, 1, res, err, sizeof(err)),
                 0);
    cr_expect_eq(res[0].mark, IDEM_MARK_LOST);
    cr_expect_str_eq(res[0].detail, "lease:b:1");
    cr_expect_eq(fake.mark[0].state, 1, "the holder's lease is untouched");
}

Test(lease, again_and_leased_hold_back_their_partition_only)
{
    /* Partition 0: k1, k1 again, k3. Partition 1: k4 (leased elsewhere),
     * k5. Partition 0's k3 and partition 1's k5 wait for next time. */
    fake.mark[0].state = 1;
    snprintf(fake.mark[0].id, sizeof(fake.mark[0].id), "k4");
    snprintf(fake.mark[0].owner, sizeof(fake.mark[0].owner), "lease:x:1");
    fake.cnt = 1;
    const idem_envelope_t *e[] = {env(0, "k1", "m1"), env(1, "k1", "m2"),
                                  env(2, "k4", "m4"), env(3, "k3", "m3"),
                                  env(4, "k5", "m5"), env(5, "k6", "m6")};
    idem_part_t *pt[] = {part(0), part(0), part(1), part(0), part(1), NULL};
    idem_store_result_t res[6];
    idem_lease_verdict_t v[6];
    char err[128];
    cr_assert_eq(
        idem_lease_claim(&st, "lease:a:1", e, pt, 6, res, v, err, sizeof(err)),
        0);
    idem_lease_verdict_t want[] = {IDEM_LEASE_GO,     IDEM_LEASE_AGAIN,
                                   IDEM_LEASE_LEASED, IDEM_LEASE_BEHIND,
                                   IDEM_LEASE_BEHIND, IDEM_LEASE_GO};
    for (size_t i = 0; i < 6; i++)
        cr_expect_eq(v[i], want[i], "record %zu: %s, want %s", i,
                     idem_lease_verdict2str(v[i]),
                     idem_lease_verdict2str(want[i]));
    cr_expect(part(0)->waiting);
    cr_expect(part(1)->waiting);
    /* Next pass, k1 finished: the flags of the last pass are gone. */
    const idem_envelope_t *e2[] = {env(0, "k3", "m3")};
    idem_part_t *pt2[] = {part(0)};
    idem_lease_claim(&st, "lease:a:1", e2, pt2, 1, res, v, err, sizeof(err));
    cr_expect_eq(v[0], IDEM_LEASE_GO);
    cr_expect(!part(0)->waiting);
}

Test(lease, outage_says_nothing)
{
    fake.down = 1;
    const idem_envelope_t *e[] = {env(0, "k1", "m1")};
    idem_part_t *pt[] = {part(0)};
    idem_store_result_t res[1];
    idem_lease_verdict_t v[1] = {IDEM_LEASE_BEHIND};
    char err[128] = "";
    cr_expect_eq(
        idem_lease_claim(&st, "lease:a:1", e, pt, 1, res, v, err, sizeof(err)),
        -1);
    cr_expect_str_eq(err, "redis: connection refused");
    cr_expect_eq(v[0], IDEM_LEASE_BEHIND, "no verdict on an outage");
    cr_expect_eq(idem_lease_mark(&st, "lease:a:1", e, 1, res, err, sizeof(err)),
                 -1);
}
