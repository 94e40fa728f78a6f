/* handler: the registry of effects and the helpers every handler shares
 * (handler.h). */
#include "effect/handler.h"
#include "base/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* One line per handler, in the order `help config` lists them. Each slot
 * is its own line so that handlers added on different branches merge
 * without a conflict. */
/* clang-format off */
static const idem_handler_ops_t *const registry[] = {
    &idem_handler_ledger,
    &idem_handler_forward,
    &idem_handler_script,
    &idem_handler_webhook,
    &idem_handler_plugin,
};
/* clang-format on */

#define REGISTRY_CNT (sizeof(registry) / sizeof(registry[0]))

const idem_handler_ops_t *idem_handler_at(size_t i)
{
    size_t k = 0;
    for (size_t j = 0; j < REGISTRY_CNT; j++)
        if (registry[j] && k++ == i)
            return registry[j];
    return NULL;
}

const idem_handler_ops_t *idem_handler_find(const char *value, const char **arg,
                                            char *errstr, size_t errstr_size)
{
    const char *colon = strchr(value, ':');
    size_t name_len = colon ? (size_t)(colon - value) : strlen(value);
    const idem_handler_ops_t *h = NULL;
    for (size_t i = 0; (h = idem_handler_at(i)); i++)
        if (strlen(h->name) == name_len && !memcmp(h->name, value, name_len))
            break;
    if (!h) {
        char names[256] = "";
        size_t at = 0;
        const idem_handler_ops_t *k;
        for (size_t i = 0; (k = idem_handler_at(i)) && at < sizeof(names); i++)
            at += (size_t)snprintf(names + at, sizeof(names) - at, "%s%s%s",
                                   i ? ", " : "", k->name,
                                   k->takes_arg ? ":ARG" : "");
        snprintf(errstr, errstr_size,
                 "handler: unknown handler \"%s\" (known: %s)", value, names);
        return NULL;
    }
    if (h->takes_arg && (!colon || !colon[1])) {
        snprintf(errstr, errstr_size, "handler: \"%s\" needs %s:ARG", value,
                 h->name);
        return NULL;
    }
    if (!h->takes_arg && colon) {
        snprintf(errstr, errstr_size,
                 "handler: \"%s\": %s takes no \":...\" argument", value,
                 h->name);
        return NULL;
    }
    if (arg)
        *arg = colon ? colon + 1 : "";
    return h;
}

const idem_handler_ops_t *idem_handler_key(const char *key,
                                           const idem_conf_key_t **decl)
{
    const idem_handler_ops_t *h;
    for (size_t i = 0; (h = idem_handler_at(i)); i++) {
        for (const idem_conf_key_t *k = h->keys; k && k->name; k++)
            if (!strcmp(k->name, key)) {
                if (decl)
                    *decl = k;
                return h;
            }
        if (h->key_prefix &&
            !strncmp(key, h->key_prefix, strlen(h->key_prefix)) &&
            key[strlen(h->key_prefix)]) {
            if (decl)
                *decl = NULL;
            return h;
        }
    }
    return NULL;
}

void idem_result_set(idem_result_t *res, idem_record_t *rec,
                     idem_result_kind_t kind, const char *fmt, ...)
{
    res->rec = rec;
    res->kind = kind;
    res->retry_after_ms = 0;
    res->prior_mid_len = 0;
    res->prior_mid[0] = '\0';
    res->detail[0] = '\0';
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(res->detail, sizeof(res->detail), fmt, ap);
        va_end(ap);
    }
}

const char *idem_result_kind2str(idem_result_kind_t k)
{
    static const char *const names[] = {"done",   "duplicate", "busy",
                                        "reject", "retry",     "outage"};
    return (unsigned)k < sizeof(names) / sizeof(names[0]) ? names[k] : "?";
}
