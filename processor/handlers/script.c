/* script: handler=script, exactly-once effects the user writes in Lua
 * (script.file), run inside the dedup script in Redis so the user's writes
 * and the dedup mark commit together, as the ledger's do (handler.h,
 * IDEM_EFFECT_IN_REDIS; docs/design.md, "The script handler"). */
#include "effect/handler.h"
#include "base/log.h"
#include "handlers/luascript.h"
#include "base/util.h"
#include "redis/rediskeys.h"
#include "redis/scriptkill.h"

#include <inttypes.h>
#include <poll.h>
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
    {.name = "script.timeout.ms",
     .type = IDEM_KEY_INT,
     .def = "4000",
     .min = 0,
     .max = 600000,
     .doc = "a request whose effects run longer is ended with SCRIPT KILL "
            "(Redis reads it at its busy threshold, 5 s by default: keep "
            "this below) and narrowed down to the record that hangs, which "
            "is dead-lettered; 0: never"},
    {.name = NULL},
};

/* How long SCRIPT KILL may wait for Redis's answer beyond script.timeout.ms
 * (Redis reads it only once the script passed its busy threshold). */
#define KILL_WAIT_MS 10000

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
    /* A request that does not finish (script.timeout.ms). */
    int64_t timeout_ms;        /* 0: no limit */
    idem_scriptkill_t *killer; /* its own connection; NULL without a limit */
    idem_metrics_t *metrics;   /* may be NULL (unit tests) */
    int64_t sent_at_ms;
    int killed;         /* the request in flight was ended with SCRIPT KILL */
    int unkillable;     /* Redis refused to end it (it wrote): said once */
    size_t narrow_left; /* records of a hung request not yet through
                           again: while not 0, each request holds one
                           record (its own script), so the record that
                           hangs is found and can be ended */
    size_t cur;         /* one a request: the index of the record in flight
                           (its replies go to res[0]) */
    int draining;       /* one a request: start no further record */
    int one;            /* the request in flight goes one record a request */
    int framed;         /* dedup.scope=partition: the store frames the effect */
    int in_submit;      /* framed: the args callback serves a whole send */
} script_t;

/* The store's `args` callback: one record's arguments, in scratch that
 * stays valid until the next submit. */
static size_t script_args(const void *rec, const char **argv, size_t *argvlen,
                          void *opaque)
{
    script_t *h = opaque;
    if (!h->framed)
        return idem_luascript_args(h->lua, rec, &h->scratch, argv, argvlen);
    /* The store's framing: identity and message id for the marks, then
     * the record as the driver reads it (identity first again). A
     * partition chunk copies each record's arguments before asking for the
     * next (redis/partstate.c), so its scratch is reused. */
    const idem_record_t *r = rec;
    if (!h->in_submit)
        idem_luascript_scratch_reset(&h->scratch);
    argv[0] = r->identity;
    argvlen[0] = r->identity_len;
    argv[1] = r->message_id_len ? r->message_id : "";
    argvlen[1] = r->message_id_len;
    return 2 +
           idem_luascript_args(h->lua, r, &h->scratch, argv + 2, argvlen + 2);
}

/* Where a record was read (idem_store_where_fn): the store's global path
 * in cluster mode keeps, per partition, what each bucket applied. */
static void script_where(const void *rec, const char **topic,
                         int32_t *partition, int64_t *offset)
{
    const idem_record_t *r = rec;
    *topic = r->topic;
    *partition = r->partition;
    *offset = r->offset;
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
    if (!lua)
        return -1;
    /* Redis Cluster mode: keys named literally outside the chunk's slot
     * are found here rather than dead-lettering every record. */
    if (conf->redis_cluster_nodes && *conf->redis_cluster_nodes)
        return idem_luascript_cluster_check(path, errstr, errstr_size);
    return 0;
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
    /* dedup.scope=partition: the store frames the effect, as the
     * ledger's, for the partition chunks and the records that take the
     * global path (docs/design.md, "The script handler under
     * dedup.scope=partition"); else the driver frames it itself. */
    h->framed =
        ctx->conf && ctx->conf->dedup_scope == IDEM_DEDUP_SCOPE_PARTITION;
    if (h->framed) {
        const char *eff = idem_luascript_effect(h->lua);
        h->script = idem_store_effect_register(
            h->store, eff, strlen(eff), 2 + idem_luascript_rec_args(h->lua),
            script_args, h, errstr, errstr_size);
        idem_store_effect_where(h->store, script_where);
    } else {
        const char *src = idem_luascript_source(h->lua);
        h->script = idem_store_script_register(
            h->store, src, strlen(src), idem_luascript_rec_args(h->lua),
            script_args, h, errstr, errstr_size);
    }
    if (h->script < 0) {
        script_stop(h);
        return NULL;
    }
    h->metrics = ctx->metrics;
    h->timeout_ms = idem_conf_int(ctx->conf, "script.timeout.ms");
    if (h->timeout_ms > 0)
        h->killer = idem_scriptkill_new(ctx->conf);
    idem_log_kv(IDEM_LOG_INFO, "script handler ready", "script.file",
                idem_luascript_path(h->lua), NULL);
    return h;
}

/* The request Redis could not end is over (it answered, or another
 * starts): its alert series goes. */
static void unkillable_over(script_t *h)
{
    if (h->unkillable && h->metrics)
        idem_metrics_script_unkillable_clear(h->metrics);
    h->unkillable = 0;
}

/* Sends recs[0..n) (with the positions, if any) as one request, the
 * replies to come in order; on a refusal errstr names the file's line. */
static int send_request(script_t *h, idem_record_t *const *recs, size_t n,
                        const idem_store_pos_t *pos, size_t npos, char *errstr,
                        size_t errstr_size)
{
    idem_luascript_scratch_reset(&h->scratch);
    h->in_submit = 1;
    int rc =
        idem_store_script_send(h->store, h->script, (const void *const *)recs,
                               n, pos, npos, errstr, errstr_size);
    h->in_submit = 0;
    if (rc) {
        /* A compile error Redis reports names the composed script's
         * lines: say which line of the file it means. */
        char where[1024];
        idem_luascript_where(h->lua, errstr, strlen(errstr), where,
                             sizeof(where));
        snprintf(errstr, errstr_size, "%s", where);
        return -1;
    }
    h->sent = n;
    h->sent_at_ms = idem_now_ms();
    h->killed = 0;
    unkillable_over(h);
    return 0;
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
    if (h->cap < n) {
        h->cap = n;
        h->recs = idem_xrealloc(h->recs, n * sizeof(*h->recs));
        h->res = idem_xrealloc(h->res, n * sizeof(*h->res));
        h->ready = idem_xrealloc(h->ready, n * sizeof(*h->ready));
    }
    /* After a request hung, its records go one a request (each its own
     * script), so the one that hangs is found and, if it wrote nothing
     * yet, ended alone; the loop sees one long request. */
    h->cur = 0;
    h->draining = 0;
    h->one = h->narrow_left != 0;
    if (send_request(h, recs, h->one ? 1 : n, pos, npos, errstr, errstr_size))
        return -1;
    memcpy(h->recs, recs, n * sizeof(*recs));
    h->n = n;
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

/* "topic/partition@offset" of rec into buf. */
static const char *rec_name(const idem_record_t *rec, char *buf, size_t size)
{
    snprintf(buf, size, "%s/%" PRId32 "@%" PRId64, rec->topic, rec->partition,
             rec->offset);
    return buf;
}

/* The result of one record from its store reply. */
static void result_of(idem_result_t *out, idem_record_t *rec,
                      const idem_store_result_t *r)
{
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

/* One a request: reads the reply of record h->cur and starts the next
 * record, or ends the request (h->ready_n = h->n). A record that hung is
 * dead-lettered; an outage ends the request with the rest as outages. */
static void finish_one(script_t *h)
{
    char err[512];
    size_t i = h->cur;
    idem_record_t *rec = h->recs[i];
    int rc = idem_store_script_recv(h->store, 1, h->res, err, sizeof(err));
    int hung = rc && (h->killed || h->unkillable);
    h->sent = 0;
    unkillable_over(h);
    if (hung) {
        char name[300];
        idem_result_set(&h->ready[i], rec, IDEM_RESULT_REJECT,
                        "script.timeout.ms: the effect did not finish within "
                        "%lld ms; %s",
                        (long long)h->timeout_ms,
                        h->killed ? "ended with SCRIPT KILL, nothing it wrote "
                                    "stays"
                                  : "it wrote first, so Redis could not end "
                                    "it until it was restarted");
        idem_log_kv(IDEM_LOG_ERROR,
                    "script effect did not finish: the record is "
                    "dead-lettered",
                    "record", rec_name(rec, name, sizeof(name)), NULL);
    } else if (rc) {
        for (size_t k = i; k < h->n; k++)
            idem_result_set(&h->ready[k], h->recs[k], IDEM_RESULT_OUTAGE, "%s",
                            err);
        h->ready_n = h->n;
        return;
    } else {
        result_of(&h->ready[i], rec, &h->res[0]);
    }
    if (h->narrow_left)
        h->narrow_left--;
    if (++h->cur < h->n && !h->draining &&
        send_request(h, &h->recs[h->cur], 1, NULL, 0, err, sizeof(err)) == 0)
        return;
    for (size_t k = h->cur; k < h->n; k++) /* draining, or Redis refused */
        idem_result_set(&h->ready[k], h->recs[k], IDEM_RESULT_OUTAGE,
                        "script: %s", h->draining ? "shutting down" : err);
    h->ready_n = h->n;
}

/* Reads the replies of the request in flight into h->ready. */
static void script_finish(script_t *h)
{
    if (h->one) {
        finish_one(h);
        return;
    }
    char err[512];
    size_t sent = h->sent;
    int rc = idem_store_script_recv(h->store, sent, h->res, err, sizeof(err));
    int hung = rc && (h->killed || h->unkillable);
    h->sent = 0;
    h->ready_n = h->n;
    unkillable_over(h);
    if (hung) {
        /* A request of many hung: its records go again, one a request
         * (an outage now, not counted; the marks tell what ran). */
        h->narrow_left = sent;
        char cnt[24];
        snprintf(cnt, sizeof(cnt), "%zu", sent);
        idem_log_kv(IDEM_LOG_WARN,
                    "script effects did not finish: trying the request's "
                    "records one a request",
                    "records", cnt, "error", err, NULL);
        for (size_t i = 0; i < h->n; i++)
            idem_result_set(&h->ready[i], h->recs[i], IDEM_RESULT_OUTAGE,
                            "script: an effect did not finish within "
                            "script.timeout.ms; its record is being found");
        return;
    }
    for (size_t i = 0; i < h->n; i++) {
        if (rc)
            idem_result_set(&h->ready[i], h->recs[i], IDEM_RESULT_OUTAGE, "%s",
                            err);
        else
            result_of(&h->ready[i], h->recs[i], &h->res[i]);
    }
}

/* Whether the request in flight may be read without waiting past
 * script.timeout.ms; ends it with SCRIPT KILL once that passed. Returns 1
 * when its replies can be read now. */
static int reply_due(script_t *h, int timeout_ms)
{
    if (!h->killer || h->killed)
        return 1;
    int fd = idem_store_reply_fd(h->store);
    if (fd < 0)
        return 1;
    int64_t left = h->sent_at_ms + h->timeout_ms - idem_now_ms();
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int wait = left <= 0 ? 0 : left < timeout_ms ? (int)left : timeout_ms;
    if (poll(&pfd, 1, wait < 0 ? 0 : wait) != 0)
        return 1; /* readable (or an error: recv says which) */
    if (idem_now_ms() - h->sent_at_ms < h->timeout_ms)
        return 0;
    if (h->unkillable)
        return 0; /* nothing to do but wait (or an operator) */
    char err[512], first[300], last[300];
    idem_scriptkill_result_t k =
        idem_scriptkill_run(h->killer, KILL_WAIT_MS, err, sizeof(err));
    rec_name(h->recs[h->cur], first, sizeof(first));
    rec_name(h->recs[h->cur + h->sent - 1], last, sizeof(last));
    switch (k) {
    case IDEM_SCRIPTKILL_KILLED:
        h->killed = 1;
        return 1;
    case IDEM_SCRIPTKILL_UNKILLABLE:
        /* The request wrote before it hung (an earlier record of its
         * chunk, or the record itself): Redis ends it only with the
         * server (SHUTDOWN NOSAVE), so every client waits until an
         * operator acts. Named here so they know which record; once Redis
         * is back its records go one a request (script_finish). */
        h->unkillable = 1;
        if (h->metrics)
            idem_metrics_script_unkillable_set(
                h->metrics, h->recs[h->cur]->topic, h->recs[h->cur]->partition,
                h->recs[h->cur]->offset, h->sent);
        idem_log_kv(IDEM_LOG_ERROR,
                    h->sent == 1
                        ? "script effect did not finish and Redis cannot end "
                          "it (it wrote): Redis is blocked until SHUTDOWN "
                          "NOSAVE, then the record is dead-lettered"
                        : "script effect did not finish and Redis cannot end "
                          "it (it wrote): Redis is blocked until SHUTDOWN "
                          "NOSAVE; the record is among these",
                    "first", first, "last", last, "error", err, NULL);
        return 0;
    case IDEM_SCRIPTKILL_NOT_BUSY:
        return 1; /* it just ended */
    default:
        idem_log_kv(IDEM_LOG_WARN, "script did not finish; SCRIPT KILL failed",
                    "first", first, "error", err, NULL);
        h->sent_at_ms = idem_now_ms(); /* try again after another limit */
        return 0;
    }
}

static size_t script_collect(void *hp, idem_result_t *out, size_t max,
                             int timeout_ms)
{
    script_t *h = hp;
    if (h->sent && !reply_due(h, timeout_ms))
        return 0;
    if (h->sent)
        script_finish(h);
    size_t n = h->ready_n < max ? h->ready_n : max;
    memcpy(out, h->ready, n * sizeof(*out));
    memmove(h->ready, h->ready + n, (h->ready_n - n) * sizeof(*out));
    h->ready_n -= n;
    if (!h->ready_n && !h->sent)
        h->n = 0;
    return n;
}

static size_t script_inflight(void *hp)
{
    script_t *h = hp;
    return h->sent ? h->n : h->ready_n;
}

/* Whether the reply of the request in flight can be read, waiting up to
 * wait_ms for it. */
static int reply_ready(script_t *h, int wait_ms)
{
    int fd = idem_store_reply_fd(h->store);
    if (fd < 0)
        return 1; /* no connection: recv says so at once */
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    return poll(&pfd, 1, wait_ms < 0 ? 0 : wait_ms) != 0;
}

/* The drain's deadline passed with a request in flight: its connection
 * is dropped (its reply with it) and its records not yet answered are
 * outages. Redis may still finish the script: its effects and marks
 * commit together, so whoever runs the records next finds them done. */
static void drain_abandon(script_t *h)
{
    char cnt[24];
    snprintf(cnt, sizeof(cnt), "%zu", h->n - h->cur);
    idem_log_kv(IDEM_LOG_WARN,
                "script drain deadline: the request in flight is abandoned "
                "(if Redis still runs it, its effects and marks land "
                "together)",
                "records", cnt, NULL);
    idem_store_disconnect(h->store);
    for (size_t k = h->cur; k < h->n; k++)
        idem_result_set(&h->ready[k], h->recs[k], IDEM_RESULT_OUTAGE,
                        "script: drain deadline: request abandoned");
    h->sent = 0;
    h->ready_n = h->n;
    unkillable_over(h);
}

/* The effects run in Redis as one script per chunk: the replies are read
 * until deadline_ms (a script past script.timeout.ms is ended as in
 * collect); what is still in flight then is abandoned. */
static void script_drain(void *hp, int64_t deadline_ms)
{
    script_t *h = hp;
    h->draining = 1; /* one a request: no further record */
    while (h->sent) {
        int64_t left = deadline_ms - idem_now_ms();
        if (left <= 0) {
            drain_abandon(h);
            break;
        }
        int wait = left < 100 ? (int)left : 100;
        int due = reply_ready(h, wait);
        if (!due && h->killer && !h->killed)
            due = reply_due(h, 0);
        if (due)
            script_finish(h);
    }
}

static void script_stop(void *hp)
{
    script_t *h = hp;
    if (!h)
        return;
    unkillable_over(h);
    idem_luascript_destroy(h->lua);
    idem_scriptkill_destroy(h->killer);
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
