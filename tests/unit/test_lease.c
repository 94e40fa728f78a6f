/* test_lease: an external effect's lease life (NEW, DONE, AGAIN, leased
 * elsewhere, LOST) against a fake store of our own behind the lease seam
 * (loop/lease.h), and how a claim keeps each partition's order. */
#include "loop/lease.h"

#include "fake_lease.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

static fake_lease_t fake;
static idem_lease_store_t st;
static idem_offsets_t offs;
static idem_envelope_t envs[8];

static void setup(void)
{
    st = fake_lease_init(&fake);
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
