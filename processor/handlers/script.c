/* script: handler=script, exactly-once effects the user writes in Lua
 * (script.file), run inside the dedup script in Redis so the user's writes
 * and the dedup mark commit together, as the ledger's do (handler.h,
 * IDEM_EFFECT_IN_REDIS; docs/design.md, "The script handler"). */
#include "effect/handler.h"
#include "base/log.h"
#include "handlers/luascript.h"
#include "base/util.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const idem_conf_key_t script_keys[] = {
    {.name = "script.file",
     .type = IDEM_KEY_STR,
     .required = 1,
     .doc = "Lua file defining function effect(rec), run for each new record "
            "inside the dedup script in Redis"},
    {.name = "script.fields",
     .type = IDEM_KEY_STR,
     .doc =
         "comma list of JSON Pointers (e.g. /sku,/qty) whose values idemproc "
         "takes from the JSON it already parsed: the effect reads "
         "rec.fields['/sku'] instead of decoding rec.value"},
    {.name = NULL},
};

typedef struct {
    idem_store_t *store;
    idem_luascript_t *lua;
    int script; /* the store's number for it */
    idem_luascript_scratch_t scratch;
    /* The request in flight: its records, in submit order. */
    idem_record_t **recs;
    size_t n, cap;
    int sent;
    /* Its results once read (drain reads them; collect hands them out). */
    idem_store_result_t *res;
    idem_result_t *ready;
    size_t ready_n;
} script_t;

/* The store's `args` callback: one record's arguments, in scratch that
 * stays valid until the next submit. */
static size_t script_args(const void *rec, const char **argv, size_t *argvlen,
                          void *opaque)
{
    script_t *h = opaque;
    return idem_luascript_args(h->lua, rec, &h->scratch, argv, argvlen);
}

static int script_validate(const idem_conf_t *conf, const char *arg,
                           char *errstr, size_t errstr_size)
{
    (void)arg;
    const char *path = idem_conf_str(conf, "script.file");
    if (!path || !*path) {
        snprintf(errstr, errstr_size,
                 "script.file: required when handler=script");
        return -1;
    }
    const char *fields = idem_conf_str(conf, "script.fields");
    if (fields && *fields && conf->envelope_format != IDEM_ENVELOPE_JSON) {
        snprintf(errstr, errstr_size,
                 "script.fields: needs envelope.format=json (with bytes the "
                 "value is not parsed)");
        return -1;
    }
    idem_luascript_t *lua =
        idem_luascript_load(path, fields, errstr, errstr_size);
    idem_luascript_destroy(lua);
    return lua ? 0 : -1;
}

static void script_stop(void *hp);

static void *script_start(const idem_handler_ctx_t *ctx, char *errstr,
                          size_t errstr_size)
{
    script_t *h = idem_xcalloc(1, sizeof(*h));
    h->store = ctx->store;
    h->lua = idem_luascript_load(idem_conf_str(ctx->conf, "script.file"),
                                 idem_conf_str(ctx->conf, "script.fields"),
                                 errstr, errstr_size);
    if (!h->lua) {
        script_stop(h);
        return NULL;
    }
    const char *src = idem_luascript_source(h->lua);
    h->script = idem_store_script_register(h->store, src, strlen(src),
                                           idem_luascript_rec_args(h->lua),
                                           script_args, h, errstr, errstr_size);
    if (h->script < 0) {
        script_stop(h);
        return NULL;
    }
    idem_log_kv(IDEM_LOG_INFO, "script handler ready", "script.file",
                idem_luascript_path(h->lua), NULL);
    return h;
}

static int script_submit(void *hp, idem_record_t *const *recs, size_t n,
                         const idem_store_pos_t *pos, size_t npos, char *errstr,
                         size_t errstr_size)
{
    script_t *h = hp;
    if (h->sent || h->ready_n) {
        snprintf(errstr, errstr_size, "script: a request is still in flight");
        return -1;
    }
    idem_luascript_scratch_reset(&h->scratch);
    if (idem_store_script_send(h->store, h->script, (const void *const *)recs,
                               n, pos, npos, errstr, errstr_size)) {
        /* A compile error Redis reports names the composed script's
         * lines: say which line of the file it means. */
        char where[1024];
        idem_luascript_where(h->lua, errstr, strlen(errstr), where,
                             sizeof(where));
        snprintf(errstr, errstr_size, "%s", where);
        return -1;
    }
    if (h->cap < n) {
        h->cap = n;
        h->recs = idem_xrealloc(h->recs, n * sizeof(*h->recs));
        h->res = idem_xrealloc(h->res, n * sizeof(*h->res));
        h->ready = idem_xrealloc(h->ready, n * sizeof(*h->ready));
    }
    memcpy(h->recs, recs, n * sizeof(*recs));
    h->n = n;
    h->sent = 1;
    return 0;
}

/* A rejection: by the effect (`return false, "reason"`), or a Lua runtime
 * error, which is logged as well. */
static void reject(idem_result_t *out, idem_record_t *rec, const char *detail)
{
    idem_result_set(out, rec, IDEM_RESULT_REJECT, "%s", detail);
    size_t pl = strlen(IDEM_LUASCRIPT_ERROR_PREFIX);
    if (strncmp(detail, IDEM_LUASCRIPT_ERROR_PREFIX, pl))
        return;
    char part[16], off[24];
    snprintf(part, sizeof(part), "%" PRId32, rec->partition);
    snprintf(off, sizeof(off), "%" PRId64, rec->offset);
    idem_log_kv(IDEM_LOG_WARN,
                "script effect failed: the record is dead-lettered", "error",
                detail + pl, "topic", rec->topic, "partition", part, "offset",
                off, NULL);
}

/* Reads the replies of the request in flight into h->ready. */
static void script_finish(script_t *h)
{
    char err[512];
    int rc = idem_store_script_recv(h->store, h->n, h->res, err, sizeof(err));
    for (size_t i = 0; i < h->n; i++) {
        idem_result_t *out = &h->ready[i];
        idem_record_t *rec = h->recs[i];
        const idem_store_result_t *r = &h->res[i];
        if (rc) {
            idem_result_set(out, rec, IDEM_RESULT_OUTAGE, "%s", err);
            continue;
        }
        switch (r->mark) {
        case IDEM_MARK_NEW:
            idem_result_set(out, rec, IDEM_RESULT_DONE, NULL);
            break;
        case IDEM_MARK_DONE:
            idem_result_set(out, rec, IDEM_RESULT_DUPLICATE, NULL);
            out->prior_mid_len = strlen(r->prior_mid);
            memcpy(out->prior_mid, r->prior_mid, out->prior_mid_len + 1);
            break;
        case IDEM_MARK_REJECT:
            reject(out, rec, r->detail);
            break;
        default: /* another handler's lease on this identity */
            idem_result_set(out, rec, IDEM_RESULT_BUSY, "%s", r->detail);
            break;
        }
    }
    h->ready_n = h->n;
    h->sent = 0;
}

static size_t script_collect(void *hp, idem_result_t *out, size_t max,
                             int timeout_ms)
{
    (void)timeout_ms; /* the replies come in one read */
    script_t *h = hp;
    if (h->sent)
        script_finish(h);
    size_t n = h->ready_n < max ? h->ready_n : max;
    memcpy(out, h->ready, n * sizeof(*out));
    memmove(h->ready, h->ready + n, (h->ready_n - n) * sizeof(*out));
    h->ready_n -= n;
    if (!h->ready_n)
        h->n = 0;
    return n;
}

static size_t script_inflight(void *hp)
{
    script_t *h = hp;
    return h->sent ? h->n : h->ready_n;
}

/* The effects run in Redis as one script per chunk: nothing to abandon,
 * only the replies to read. */
static void script_drain(void *hp, int64_t deadline_ms)
{
    (void)deadline_ms;
    script_t *h = hp;
    if (h->sent)
        script_finish(h);
}

static void script_stop(void *hp)
{
    script_t *h = hp;
    if (!h)
        return;
    idem_luascript_destroy(h->lua);
    idem_luascript_scratch_term(&h->scratch);
    free(h->recs);
    free(h->res);
    free(h->ready);
    free(h);
}

const idem_handler_ops_t idem_handler_script = {
    .api_version = IDEM_HANDLER_API_VERSION,
    .name = "script",
    .effect = IDEM_EFFECT_IN_REDIS,
    .doc = "your Lua function effect(rec) (script.file), run inside the "
           "dedup script: its Redis writes and the dedup mark commit together",
    .keys = script_keys,
    .fields_key = "script.fields",
    .validate = script_validate,
    .start = script_start,
    .submit = script_submit,
    .collect = script_collect,
    .inflight = script_inflight,
    .drain = script_drain,
    .stop = script_stop,
};
