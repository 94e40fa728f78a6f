/* test_inputs (it): identities that differ after a NUL byte both apply, in
 * a real Redis. */
#include "conf/conf.h"
#include "input/envelope.h"
#include "harness.h"
#include "fixture_inputs.h"
#include "ledgerrun.h"
#include "redis/store.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The bug's effect, against a real Redis: two different operations whose
 * identities differ only after a NUL were one identity, the second skipped
 * as a redelivery. Both must apply; the same bytes again are a duplicate
 * whose message_id is recognised byte for byte. */
Test(inputs, identities_differing_after_a_nul_both_apply, .timeout = 60)
{
    th_redis_t r;
    cr_assert_eq(th_redis_start(&r), 0);
    char err[512] = "";
    idem_conf_t *conf = th_ledger_conf(&r);
    idem_store_t *s = idem_store_new(conf, NULL);
    th_ledger_t *l = th_ledger_start(conf, s);

    idem_envelope_t e[4];
    cr_assert_eq(parse_with_header("idempotency_key", "\0A", 2, &e[0]), 0);
    cr_assert_eq(parse_with_header("idempotency_key", "\0B", 2, &e[1]), 0);
    cr_assert_eq(parse_with_header("message_id", "ab\0x1", 5, &e[2]), 0);
    cr_assert_eq(parse_with_header("message_id", "ab\0x2", 5, &e[3]), 0);
    const idem_envelope_t *envs[4] = {&e[0], &e[1], &e[2], &e[3]};
    idem_store_result_t res[4];
    int rc = th_ledger_apply(l, envs, 4, res, err, sizeof(err));
    cr_assert_eq(rc, 0, "%s", err);
    for (int i = 0; i < 4; i++)
        cr_expect_eq(res[i].mark, IDEM_MARK_NEW, "record %d: mark %d", i,
                     (int)res[i].mark);
    const char *get[] = {"hget", "idemproc:ledger:EUR", "u1", NULL};
    char *bal = th_redis_cli(&r, get);
    cr_expect_str_eq(bal, "500");
    free(bal);

    /* The same message again: done, and its message_id comes back whole. */
    rc = th_ledger_apply(l, envs + 2, 1, res, err, sizeof(err));
    cr_assert_eq(rc, 0, "%s", err);
    cr_expect_eq(res[0].mark, IDEM_MARK_DONE);
    cr_expect_eq(res[0].prior_mid_len, 5);
    cr_expect_eq(memcmp(res[0].prior_mid, "ab\0x1", 5), 0);

    th_ledger_stop(l);
    idem_store_destroy(s);
    idem_conf_destroy(conf);
    th_redis_stop(&r);
}
