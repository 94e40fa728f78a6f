/* fixture_webhook: helpers the webhook tests of more than one tier share
 * (static inline: each test file takes what it uses). */
#ifndef IDEM_FIXTURE_WEBHOOK_H
#define IDEM_FIXTURE_WEBHOOK_H

#include "conf/conf.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

/* A conf with handler=webhook and the given "key=value" sets. */
static inline idem_conf_t *conf_with(const char *const sets[])
{
    idem_conf_t *conf = idem_conf_new();
    char err[512];
    cr_assert_eq(idem_conf_set(conf, "handler", "webhook", err, sizeof(err)), 0,
                 "%s", err);
    for (size_t i = 0; sets && sets[i]; i++) {
        char kv[1024];
        snprintf(kv, sizeof(kv), "%s", sets[i]);
        char *eq = strchr(kv, '=');
        cr_assert(eq);
        *eq = '\0';
        cr_assert_eq(idem_conf_set(conf, kv, eq + 1, err, sizeof(err)), 0,
                     "%s: %s", sets[i], err);
    }
    return conf;
}

#endif
