/* test_util: the small helpers of base/util.c that other modules rely on
 * for exact bytes. */
#include "base/util.h"

#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

Test(util, put_u64_writes_decimal_without_nul)
{
    const uint64_t cases[] = {
        0, 7, 10, 99, 12345, UINT32_MAX, (uint64_t)INT64_MAX + 1, UINT64_MAX};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char got[32], want[32];
        memset(got, 'x', sizeof(got));
        char *end = idem_put_u64(got, cases[i]);
        snprintf(want, sizeof(want), "%" PRIu64, cases[i]);
        cr_assert_eq((size_t)(end - got), strlen(want), "%s", want);
        cr_expect_eq(memcmp(got, want, strlen(want)), 0, "%s", want);
        cr_expect_eq(*end, 'x', "wrote past the number");
    }
}
