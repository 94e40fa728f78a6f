/* test_wake (unit): waiting on a descriptor: readable ends the wait,
 * nothing is a timeout. */
#include "conf/conf.h"
#include "input/envelope.h"
#include "testlib.h"
#include "redis/store.h"
#include "loop/wake.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WAIT_LONG_MS 10000 /* "until it happens": far beyond any real wait */

Test(wake, a_readable_descriptor_ends_the_wait)
{
    idem_wake_t w;
    char err[256];
    cr_assert_eq(idem_wake_init(&w, err, sizeof(err)), 0, "%s", err);
    int p[2];
    cr_assert_eq(pipe(p), 0);
    cr_expect_eq(idem_wake_wait(&w, p[0], 0), 0, "nothing to read yet");
    cr_assert_eq(write(p[1], "x", 1), 1);
    cr_expect_eq(idem_wake_wait(&w, p[0], WAIT_LONG_MS), IDEM_WAKE_FD);
    close(p[1]); /* and a closed one too: its reader must not sleep */
    char c;
    cr_assert_eq(read(p[0], &c, 1), 1);
    cr_expect_eq(idem_wake_wait(&w, p[0], WAIT_LONG_MS), IDEM_WAKE_FD);
    close(p[0]);
    idem_wake_term(&w);
    idem_wake_term(&w); /* twice is harmless */
}

Test(wake, nothing_happening_is_a_timeout)
{
    idem_wake_t w;
    char err[256];
    cr_assert_eq(idem_wake_init(&w, err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(idem_wake_wait(&w, -1, 10), 0);
    idem_wake_term(&w);
}

#define PAY "{\"user_id\":\"u1\",\"amount\":1,\"currency\":\"EUR\"}"
