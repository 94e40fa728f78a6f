/* handler plugin: effects from a shared object (handler=plugin:PATH.so),
 * adapting the public plugin interface (idemproc/plugin.h) to the loop's
 * handler interface (handler.h). The loop claims, the plugin effects, the
 * loop marks: an external effect, at least once. */
#include "effect/handler.h"
#include "base/log.h"
#include "effect/plugin.h"
#include "base/util.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEY_PREFIX "plugin."

/* A record as the plugin sees it. `pub` comes first: the pointer the
 * plugin hands back in a result is the wrapper's. */
typedef struct {
    idemproc_record_t pub;
    idem_record_t *rec;
    idemproc_header_t *hdrs;
} prec_t;

/* What the host table's functions reach through `opaque`. */
typedef struct {
    const idem_conf_t *conf;
    const idemproc_plugin_t *table;
} host_ctx_t;

typedef struct {
    idem_plugin_t *pl;
    const idemproc_plugin_t *t;
    void *state; /* the plugin's */
    host_ctx_t hctx;
    idemproc_host_t host; /* lives as long as the plugin's state */
    /* Submitted, no result collected from the plugin yet: a set of wrapper
     * pointers (open addressing, linear probing; live_cap a power of two
     * or 0), so a result finds its record in O(1) without reading through
     * the pointer the plugin handed back. */
    prec_t **live;
    size_t live_cnt, live_cap;
    idem_result_t *pending; /* results kept by drain for the next collect */
    size_t pending_cnt, pending_cap;
    idemproc_result_t *tmp; /* scratch for the plugin's collect */
    size_t tmp_cap;
    const idemproc_record_t **subs; /* scratch for submit */
    size_t subs_cap;
} plugin_handler_t;

/* The plugin's declaration of key `name` (without "plugin."), or NULL. */
static const idemproc_key_t *key_decl(const idemproc_plugin_t *t,
                                      const char *name)
{
    for (const idemproc_key_t *k = t->keys; k && k->name; k++)
        if (!strcmp(k->name, name))
            return k;
    return NULL;
}

/* The value plugin.<name> was set to last, or NULL. */
static const char *key_set(const idem_conf_t *conf, const char *name)
{
    const char *v = NULL;
    size_t plen = strlen(KEY_PREFIX);
    for (size_t i = 0; i < conf->hkeys_cnt; i++) {
        const char *k = conf->hkeys[i].name;
        if (!strncmp(k, KEY_PREFIX, plen) && !strcmp(k + plen, name))
            v = conf->hkeys[i].value;
    }
    return v;
}

/* idemproc_host_t.config: a declared key's value, else its default. */
static const char *host_config(void *opaque, const char *name)
{
    const host_ctx_t *hc = opaque;
    if (!name)
        return NULL;
    const idemproc_key_t *k = key_decl(hc->table, name);
    if (!k) {
        idem_log_kv(IDEM_LOG_WARN, "plugin asked for a key it does not declare",
                    "plugin", hc->table->name, "key", name, NULL);
        return NULL;
    }
    const char *v = key_set(hc->conf, name);
    return v ? v : k->def;
}

/* idemproc_host_t.log: through our logger, with the plugin's name. */
static void host_log(void *opaque, int level, const char *message)
{
    const host_ctx_t *hc = opaque;
    idem_log_level_t l = level <= IDEMPROC_LOG_ERROR  ? IDEM_LOG_ERROR
                         : level == IDEMPROC_LOG_WARN ? IDEM_LOG_WARN
                         : level == IDEMPROC_LOG_INFO ? IDEM_LOG_INFO
                                                      : IDEM_LOG_DEBUG;
    idem_log_kv(l, message ? message : "", "plugin", hc->table->name, NULL);
}

static void host_init(idemproc_host_t *host, host_ctx_t *hc)
{
    memset(host, 0, sizeof(*host));
    host->abi_version = IDEMPROC_PLUGIN_ABI_VERSION;
    host->opaque = hc;
    host->config = host_config;
    host->log = host_log;
}

/* Every plugin.* key set must be one the plugin declares, and every key it
 * requires must be set. Returns 0 or -1 with errstr. */
static int keys_check(const idem_conf_t *conf, const idemproc_plugin_t *t,
                      char *errstr, size_t errstr_size)
{
    size_t plen = strlen(KEY_PREFIX);
    for (size_t i = 0; i < conf->hkeys_cnt; i++) {
        const char *k = conf->hkeys[i].name;
        if (strncmp(k, KEY_PREFIX, plen) || key_decl(t, k + plen))
            continue;
        char known[256] = "";
        size_t at = 0;
        for (const idemproc_key_t *d = t->keys;
             d && d->name && at < sizeof(known); d++)
            at += (size_t)snprintf(known + at, sizeof(known) - at, "%s%s%s",
                                   at ? ", " : "", KEY_PREFIX, d->name);
        snprintf(errstr, errstr_size, "%s: not a key of plugin %s (%s%s)", k,
                 t->name, at ? "its keys: " : "it declares no keys", known);
        return -1;
    }
    for (const idemproc_key_t *d = t->keys; d && d->name; d++)
        if (d->required && !key_set(conf, d->name) && !d->def) {
            snprintf(errstr, errstr_size, "%s%s: required by plugin %s (%s)",
                     KEY_PREFIX, d->name, t->name, d->doc ? d->doc : "");
            return -1;
        }
    return 0;
}

static int plugin_validate(const idem_conf_t *conf, const char *arg,
                           char *errstr, size_t errstr_size)
{
    idem_plugin_t *pl = idem_plugin_open(arg, errstr, errstr_size);
    if (!pl)
        return -1;
    const idemproc_plugin_t *t = idem_plugin_table(pl);
    int rc = keys_check(conf, t, errstr, errstr_size);
    if (rc == 0 && t->validate) {
        host_ctx_t hc = {conf, t};
        idemproc_host_t host;
        host_init(&host, &hc);
        char perr[512] = "";
        if (t->validate(&host, perr, sizeof(perr))) {
            snprintf(errstr, errstr_size, "plugin %s: %s", t->name,
                     *perr ? perr : "validate failed (no reason given)");
            rc = -1;
        }
    }
    idem_plugin_close(pl);
    return rc;
}

static void *plugin_start(const idem_handler_ctx_t *ctx, char *errstr,
                          size_t errstr_size)
{
    idem_plugin_t *pl = idem_plugin_open(ctx->arg, errstr, errstr_size);
    if (!pl)
        return NULL;
    plugin_handler_t *h = idem_xcalloc(1, sizeof(*h));
    h->pl = pl;
    h->t = idem_plugin_table(pl);
    h->hctx.conf = ctx->conf;
    h->hctx.table = h->t;
    host_init(&h->host, &h->hctx);
    char perr[512] = "";
    h->state = h->t->start(&h->host, perr, sizeof(perr));
    if (!h->state) {
        snprintf(errstr, errstr_size, "plugin %s: start: %s", h->t->name,
                 *perr ? perr : "failed (no reason given)");
        idem_plugin_close(pl);
        free(h);
        return NULL;
    }
    idem_log_kv(IDEM_LOG_INFO, "plugin started", "plugin", h->t->name, "path",
                idem_plugin_path(pl), NULL);
    return h;
}

static prec_t *prec_new(idem_record_t *r)
{
    prec_t *p = idem_xcalloc(1, sizeof(*p));
    p->rec = r;
    idemproc_record_t *o = &p->pub;
    o->topic = r->topic;
    o->partition = r->partition;
    o->offset = r->offset;
    o->timestamp = r->timestamp;
    o->key = r->key;
    o->key_len = r->key_len;
    o->value = r->value;
    o->value_len = r->value_len;
    o->identity = r->identity;
    o->identity_len = r->identity_len;
    o->message_id = r->message_id;
    o->message_id_len = r->message_id_len;
    size_t cnt = 0;
    const char *name;
    const void *val;
    size_t size;
    while (r->headers &&
           !rd_kafka_header_get_all(r->headers, cnt, &name, &val, &size))
        cnt++;
    if (cnt) {
        p->hdrs = idem_xcalloc(cnt, sizeof(*p->hdrs));
        for (size_t i = 0; i < cnt; i++) {
            rd_kafka_header_get_all(r->headers, i, &name, &val, &size);
            p->hdrs[i].name = name;
            p->hdrs[i].value = val;
            p->hdrs[i].value_len = val ? size : 0;
        }
    }
    o->headers = p->hdrs;
    o->header_cnt = cnt;
    return p;
}

static void prec_free(prec_t *p)
{
    if (!p)
        return;
    free(p->hdrs);
    free(p);
}

static size_t ptr_hash(const void *ptr)
{
    uint64_t x = (uint64_t)(uintptr_t)ptr;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x;
}

static void live_put(plugin_handler_t *h, prec_t *p)
{
    size_t mask = h->live_cap - 1, i = ptr_hash(p) & mask;
    while (h->live[i])
        i = (i + 1) & mask;
    h->live[i] = p;
    h->live_cnt++;
}

/* Room for `more` wrappers at a load of at most one half. */
static void live_reserve(plugin_handler_t *h, size_t more)
{
    if ((h->live_cnt + more) * 2 <= h->live_cap)
        return;
    size_t cap = h->live_cap ? h->live_cap : 64;
    while ((h->live_cnt + more) * 2 > cap)
        cap *= 2;
    prec_t **old = h->live;
    size_t old_cap = h->live_cap;
    h->live = idem_xcalloc(cap, sizeof(*h->live));
    h->live_cap = cap;
    h->live_cnt = 0;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i])
            live_put(h, old[i]);
    free(old);
}

/* Takes the wrapper the plugin returned out of the live set. NULL when it
 * is not one of ours (a record never submitted, or reported twice). Only
 * pointer values are compared: a bad one from the plugin is never read. */
static prec_t *live_take(plugin_handler_t *h, const idemproc_record_t *rec)
{
    if (!h->live_cnt)
        return NULL;
    size_t mask = h->live_cap - 1, i = ptr_hash(rec) & mask;
    for (; h->live[i]; i = (i + 1) & mask)
        if ((const void *)h->live[i] == (const void *)rec)
            break;
    prec_t *p = h->live[i];
    if (!p)
        return NULL;
    /* Backward-shift deletion: later entries of the probe run move up so
     * that no lookup stops early at the hole. */
    for (size_t j = i;;) {
        j = (j + 1) & mask;
        if (!h->live[j])
            break;
        size_t home = ptr_hash(h->live[j]) & mask;
        int stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
            h->live[i] = h->live[j];
            i = j;
        }
    }
    h->live[i] = NULL;
    h->live_cnt--;
    return p;
}

/* Frees every wrapper still in the live set and empties it. */
static void live_clear(plugin_handler_t *h)
{
    for (size_t i = 0; i < h->live_cap; i++) {
        prec_free(h->live[i]);
        h->live[i] = NULL;
    }
    h->live_cnt = 0;
}

static int plugin_submit(void *hv, idem_record_t *const *recs, size_t n,
                         const idem_store_pos_t *pos, size_t npos, char *errstr,
                         size_t errstr_size)
{
    plugin_handler_t *h = hv;
    (void)pos;
    (void)npos; /* an external effect: positions are the loop's */
    live_reserve(h, n);
    if (n > h->subs_cap) {
        h->subs_cap = n * 2;
        h->subs = idem_xrealloc(h->subs, h->subs_cap * sizeof(*h->subs));
    }
    for (size_t i = 0; i < n; i++) {
        prec_t *p = prec_new(recs[i]);
        live_put(h, p);
        h->subs[i] = &p->pub;
    }
    char perr[512] = "";
    if (h->t->submit(h->state, h->subs, n, perr, sizeof(perr))) {
        for (size_t i = 0; i < n; i++)
            prec_free(live_take(h, h->subs[i]));
        snprintf(errstr, errstr_size, "plugin %s: %s", h->t->name,
                 *perr ? perr : "submit failed (no reason given)");
        return -1;
    }
    return 0;
}

/* Turns the plugin's result into the loop's. Returns 0, or -1 when the
 * result names no record of ours (logged, ignored). */
static int result_convert(plugin_handler_t *h, const idemproc_result_t *in,
                          idem_result_t *out)
{
    prec_t *p = live_take(h, in->rec);
    if (!p) {
        idem_log_kv(IDEM_LOG_ERROR,
                    "plugin reported a record it was not given (or one it "
                    "reported already); ignored",
                    "plugin", h->t->name, NULL);
        return -1;
    }
    idem_record_t *r = p->rec;
    prec_free(p);
    /* The plugin's detail may lack its NUL: copy what fits. */
    char detail[sizeof(in->detail) + 1];
    memcpy(detail, in->detail, sizeof(in->detail));
    detail[sizeof(in->detail)] = '\0';
    switch (in->status) {
    case IDEMPROC_DONE:
        idem_result_set(out, r, IDEM_RESULT_DONE, NULL);
        break;
    case IDEMPROC_REJECT:
        idem_result_set(out, r, IDEM_RESULT_REJECT, "%s",
                        *detail ? detail : "rejected by the plugin");
        break;
    case IDEMPROC_RETRY:
        idem_result_set(out, r, IDEM_RESULT_RETRY, "%s",
                        *detail ? detail : "the plugin asked for a retry");
        out->retry_after_ms = in->retry_after_ms > 0 ? in->retry_after_ms : 0;
        break;
    case IDEMPROC_OUTAGE:
        idem_result_set(out, r, IDEM_RESULT_OUTAGE, "plugin %s: %s", h->t->name,
                        *detail ? detail : "its service is down");
        break;
    default:
        /* A plugin bug, not an outage: retried, then max-retries. */
        idem_result_set(out, r, IDEM_RESULT_RETRY,
                        "plugin %s returned unknown status %d", h->t->name,
                        (int)in->status);
        break;
    }
    return 0;
}

/* Asks the plugin for up to `max` results, converted into out[]. */
static size_t collect_from_plugin(plugin_handler_t *h, idem_result_t *out,
                                  size_t max, int timeout_ms)
{
    if (!max)
        return 0;
    if (max > h->tmp_cap) {
        h->tmp_cap = max;
        h->tmp = idem_xrealloc(h->tmp, h->tmp_cap * sizeof(*h->tmp));
    }
    size_t got = h->t->collect(h->state, h->tmp, max, timeout_ms);
    if (got > max) { /* a plugin bug; the rest are past our buffer */
        idem_log_kv(IDEM_LOG_ERROR, "plugin collect overran its buffer",
                    "plugin", h->t->name, NULL);
        got = max;
    }
    size_t k = 0;
    for (size_t i = 0; i < got; i++)
        if (result_convert(h, &h->tmp[i], &out[k]) == 0)
            k++;
    return k;
}

static size_t plugin_collect(void *hv, idem_result_t *out, size_t max,
                             int timeout_ms)
{
    plugin_handler_t *h = hv;
    size_t k = 0;
    while (k < max && h->pending_cnt) {
        out[k++] = h->pending[0];
        memmove(h->pending, h->pending + 1,
                --h->pending_cnt * sizeof(*h->pending));
    }
    if (k < max && h->live_cnt)
        k += collect_from_plugin(h, out + k, max - k, k ? 0 : timeout_ms);
    return k;
}

static size_t plugin_inflight(void *hv)
{
    plugin_handler_t *h = hv;
    return h->live_cnt + h->pending_cnt;
}

/* The plugin's room, or no limit when it has no room op. */
static size_t plugin_room(void *hv)
{
    plugin_handler_t *h = hv;
    return h->t->room ? h->t->room(h->state) : SIZE_MAX;
}

static void plugin_drain(void *hv, int64_t deadline_ms)
{
    plugin_handler_t *h = hv;
    int64_t left = deadline_ms - idem_now_ms();
    h->t->drain(h->state, left > 0 ? (int)(left > 600000 ? 600000 : left) : 0);
    /* Keep what finished for the loop's next collect. */
    while (h->live_cnt) {
        size_t room = h->live_cnt;
        if (h->pending_cnt + room > h->pending_cap) {
            h->pending_cap = (h->pending_cnt + room) * 2;
            h->pending =
                idem_xrealloc(h->pending, h->pending_cap * sizeof(*h->pending));
        }
        size_t got =
            collect_from_plugin(h, h->pending + h->pending_cnt, room, 0);
        if (!got)
            break;
        h->pending_cnt += got;
    }
    if (h->live_cnt) {
        char cnt[32];
        snprintf(cnt, sizeof(cnt), "%zu", h->live_cnt);
        idem_log_kv(IDEM_LOG_WARN,
                    "plugin drain left records unfinished; their leases "
                    "expire and they are done again",
                    "plugin", h->t->name, "records", cnt, NULL);
    }
    /* The plugin holds no record pointer after drain (plugin.h). */
    live_clear(h);
}

static void plugin_stop(void *hv)
{
    plugin_handler_t *h = hv;
    if (!h)
        return;
    h->t->stop(h->state);
    live_clear(h);
    free(h->live);
    free(h->pending);
    free(h->tmp);
    free(h->subs);
    idem_plugin_close(h->pl);
    free(h);
}

const idem_handler_ops_t idem_handler_plugin = {
    .api_version = IDEM_HANDLER_API_VERSION,
    .name = "plugin",
    .takes_arg = 1,
    .effect = IDEM_EFFECT_EXTERNAL,
    .needs_payment = 0,
    .doc = "effects from a shared object: handler=plugin:PATH.so "
           "(idemproc/plugin.h), at least once",
    .keys = NULL,
    .key_prefix = KEY_PREFIX,
    .validate = plugin_validate,
    .start = plugin_start,
    .submit = plugin_submit,
    .collect = plugin_collect,
    .inflight = plugin_inflight,
    .room = plugin_room,
    .drain = plugin_drain,
    .stop = plugin_stop,
};
