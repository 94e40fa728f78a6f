/* test_webhook (unit): the handler's configuration check names the key. */
#include "effect/handler.h"
#include "testlib.h"
#include "fixture_webhook.h"

#include <criterion/criterion.h>
#include <hiredis.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

TestSuite(webhook);

Test(webhook, validate_names_the_key)
{
    char err[512];
    idem_conf_t *conf = conf_with(NULL);
    cr_assert_eq(idem_handler_webhook.validate(conf, "", err, sizeof(err)), -1);
    cr_assert(strstr(err, "webhook.url"), "%s", err);
    idem_conf_destroy(conf);
    conf = conf_with((const char *[]){"webhook.url=gopher://x/", NULL});
    cr_assert_eq(idem_handler_webhook.validate(conf, "", err, sizeof(err)), -1);
    cr_assert(strstr(err, "unsupported scheme \"gopher\""), "%s", err);
    idem_conf_destroy(conf);
    conf = conf_with((const char *[]){"webhook.url=http://127.0.0.1:1/",
                                      "webhook.headers=Authorization Bearer",
                                      NULL});
    cr_assert_eq(idem_handler_webhook.validate(conf, "", err, sizeof(err)), -1);
    cr_assert(strstr(err, "webhook.headers"), "%s", err);
    /* The secret never appears in the message. */
    idem_conf_destroy(conf);
    char e2[512];
    idem_conf_t *c2 = idem_conf_new();
    cr_assert_eq(idem_conf_set(c2, "webhook.max.inflight", "0", e2, sizeof(e2)),
                 -1);
    cr_assert(strstr(e2, "webhook.max.inflight"), "%s", e2);
    idem_conf_destroy(c2);
}

/* ------------------------------------------------ members through the loop */

/* Appends one JSON line to fp. */
#define LINE(fp, ...) fprintf((fp), __VA_ARGS__), fputc('\n', (fp))
