/* handlerkeys: the `handler` key and each registered handler's keys as
 * configuration modules (conf.h): a handler's keys count (required keys,
 * its validate) only when it is the one selected. */
#include "effect/handler.h"
#include "effect/handlerkeys.h"

#include <stdio.h>
#include <string.h>

/* clang-format off */
static const idem_conf_key_t handler_keys[] = {
    IDEM_CONF_STR("handler", handler, "ledger", 0, NULL,
        "the effect: a registered handler, NAME or NAME:ARG (see the handler keys below; ledger: payments into Redis; forward: copy to output.topic)"),
    {.name = NULL},
};
/* clang-format on */

/* The handler conf selects, with its arg; NULL with errstr. */
static const idem_handler_ops_t *selected(const idem_conf_t *conf,
                                          const char **arg, char *errstr,
                                          size_t errstr_size)
{
    return conf->handler
               ? idem_handler_find(conf->handler, arg, errstr, errstr_size)
               : NULL;
}

/* The handler must exist, and the records must be what it reads. */
static int handler_conf_check(const idem_conf_module_t *m, idem_conf_t *conf,
                              char *errstr, size_t errstr_size)
{
    (void)m;
    const char *arg;
    const idem_handler_ops_t *h = selected(conf, &arg, errstr, errstr_size);
    if (!h)
        return -1;
    if (h->needs_payment && conf->envelope_format != IDEM_ENVELOPE_JSON) {
        snprintf(errstr, errstr_size,
                 "envelope.format: handler=%s reads payment fields from a "
                 "JSON value; bytes is not possible with it",
                 h->name);
        return -1;
    }
    return 0;
}

const idem_conf_module_t idem_handler_conf = {
    .name = "handler",
    .doc = "which effect runs",
    .keys = handler_keys,
    .check = handler_conf_check,
};

static int one_active(const idem_conf_module_t *m, const idem_conf_t *conf)
{
    char errstr[256];
    return selected(conf, NULL, errstr, sizeof(errstr)) == m->owner;
}

static int one_check(const idem_conf_module_t *m, idem_conf_t *conf,
                     char *errstr, size_t errstr_size)
{
    const idem_handler_ops_t *h = m->owner;
    const char *arg = "";
    if (!selected(conf, &arg, errstr, errstr_size))
        return -1;
    return h->validate ? h->validate(conf, arg, errstr, errstr_size) : 0;
}

/* One module per registered handler, made on first use from its ops (a
 * static initializer cannot read another object's members). The
 * configuration is read on the main thread before any other starts. */
#define HANDLERS_MAX 16

const idem_conf_module_t *idem_handler_conf_at(size_t i)
{
    static idem_conf_module_t mods[HANDLERS_MAX];
    static char names[HANDLERS_MAX][64];
    static size_t cnt;
    static int made;
    if (!made) {
        const idem_handler_ops_t *h;
        for (size_t j = 0; j < HANDLERS_MAX && (h = idem_handler_at(j)); j++) {
            snprintf(names[j], sizeof(names[j]), "handler=%s%s", h->name,
                     h->takes_arg ? ":ARG" : "");
            mods[j] = (idem_conf_module_t){.name = names[j],
                                           .doc = h->doc,
                                           .keys = h->keys,
                                           .key_prefix = h->key_prefix,
                                           .active = one_active,
                                           .check = one_check,
                                           .owner = h};
            cnt = j + 1;
        }
        made = 1;
    }
    return i < cnt ? &mods[i] : NULL;
}
