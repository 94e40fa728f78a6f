/* ledger: handler=ledger, payments applied in Redis. The effect (HINCRBY
 * of the user's balance) and the dedup mark are one Lua script
 * (ledger.lua, embedded at build), so no crash can separate them; one
 * pipelined request in flight. */
#include "effect/handler.h"
#include "base/util.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ledger.lua, as the build embeds it (Makefile: LUA_SRCS): the effect
 * function, which the store composes into its dedup scripts. */
extern const char idem_ledger_lua[];
extern const size_t idem_ledger_lua_len;

/* Arguments per record: identity, message_id, currency, user_id, amount. */
#define LEDGER_ARGS 5

/* Amount texts kept for the records of one partition chunk: at least the
 * largest chunk (loop/partscope.c's CHUNK_MAX). */
#define LEDGER_RING 1024

typedef struct {
    idem_store_t *store;
    int script;           /* idem_store_script_register's number */
    idem_record_t **recs; /* the request in flight */
    idem_store_result_t *res;
    char (*nums)[24]; /* amounts as text, one per record of a send */
    size_t nums_next; /* the next of nums the args function fills */
    int in_submit;    /* 1: the args function fills nums, else ring */
    char (*ring)[24]; /* amounts of a partition chunk (redis/partstate.c
                         formats each chunk before the next): reused */
    size_t ring_next;
    size_t n, cap;
} ledger_t;

/* The store's per-record arguments (idem_store_args_fn): rec is an
 * idem_record_t; the amount's text lives in l->nums until the send
 * returns. */
static size_t ledger_args(const void *rec, const char **argv, size_t *argvlen,
                          void *opaque)
{
    ledger_t *l = opaque;
    const idem_envelope_t *env = ((const idem_record_t *)rec)->env;
    argv[0] = env->identity;
    argvlen[0] = env->identity_len; /* byte strings: NULs are data */
    argv[1] = env->message_id;
    argvlen[1] = env->message_id_len;
    argv[2] = env->currency;
    argvlen[2] = strlen(env->currency);
    argv[3] = env->user_id;
    argvlen[3] = strlen(env->user_id);
    /* As "%" PRId64 would print it, without the cost of printf. */
    char *num, *e;
    if (l->in_submit) {
        num = l->nums[l->nums_next++];
    } else {
        /* A partition chunk's record (dedup.scope=partition): its text
         * lives until the chunk is formatted, LEDGER_RING records later. */
        if (!l->ring)
            l->ring = idem_xcalloc(LEDGER_RING, sizeof(*l->ring));
        num = l->ring[l->ring_next++ % LEDGER_RING];
    }
    e = num;
    int64_t v = env->amount_minor;
    if (v < 0)
        *e++ = '-';
    e = idem_put_u64(e, v < 0 ? 0 - (uint64_t)v : (uint64_t)v);
    argv[4] = num;
    argvlen[4] = (size_t)(e - num);
    return LEDGER_ARGS;
}

/* Where a record was read (idem_store_where_fn): the store's global path
 * in cluster mode keeps, per partition, what each bucket applied. */
static void ledger_where(const void *rec, const char **topic,
                         int32_t *partition, int64_t *offset)
{
    const idem_record_t *r = rec;
    *topic = r->topic;
    *partition = r->partition;
    *offset = r->offset;
}

static void *ledger_start(const idem_handler_ctx_t *ctx, char *errstr,
                          size_t errstr_size)
{
    if (!ctx->store) {
        snprintf(errstr, errstr_size, "ledger: no Redis store");
        return NULL;
    }
    ledger_t *l = idem_xcalloc(1, sizeof(*l));
    l->store = ctx->store;
    l->script = idem_store_effect_register(l->store, idem_ledger_lua,
                                           idem_ledger_lua_len, LEDGER_ARGS,
                                           ledger_args, l, errstr, errstr_size);
    if (l->script < 0) {
        free(l);
        return NULL;
    }
    idem_store_effect_where(l->store, ledger_where);
    return l;
}

static int ledger_submit(void *h, idem_record_t *const *recs, size_t n,
                         const idem_store_pos_t *pos, size_t npos, char *errstr,
                         size_t errstr_size)
{
    ledger_t *l = h;
    if (l->n) {
        snprintf(errstr, errstr_size, "ledger: a request is in flight");
        return -1;
    }
    if (l->cap < n) {
        l->cap = n;
        l->recs = idem_xrealloc(l->recs, n * sizeof(*l->recs));
        l->res = idem_xrealloc(l->res, n * sizeof(*l->res));
        l->nums = idem_xrealloc(l->nums, n * sizeof(*l->nums));
    }
    memcpy(l->recs, recs, n * sizeof(*recs));
    l->nums_next = 0;
    l->in_submit = 1;
    int rc =
        idem_store_script_send(l->store, l->script, (const void *const *)recs,
                               n, pos, npos, errstr, errstr_size);
    l->in_submit = 0;
    if (rc)
        return -1;
    l->n = n;
    return 0;
}

/* Reads the reply of the request in flight (Redis answers within
 * milliseconds; timeout_ms is not needed). */
static size_t ledger_collect(void *h, idem_result_t *out, size_t max,
                             int timeout_ms)
{
    (void)timeout_ms;
    ledger_t *l = h;
    if (!l->n || max < l->n)
        return 0;
    char errstr[512];
    int rc =
        idem_store_script_recv(l->store, l->n, l->res, errstr, sizeof(errstr));
    for (size_t i = 0; i < l->n; i++) {
        idem_result_t *r = &out[i];
        const idem_store_result_t *s = &l->res[i];
        if (rc) {
            idem_result_set(r, l->recs[i], IDEM_RESULT_OUTAGE, "%s", errstr);
            continue;
        }
        switch (s->mark) {
        case IDEM_MARK_NEW:
            idem_result_set(r, l->recs[i], IDEM_RESULT_DONE, NULL);
            break;
        case IDEM_MARK_DONE:
            idem_result_set(r, l->recs[i], IDEM_RESULT_DUPLICATE, NULL);
            memcpy(r->prior_mid, s->prior_mid, s->prior_mid_len);
            r->prior_mid[s->prior_mid_len] = '\0';
            r->prior_mid_len = s->prior_mid_len;
            break;
        case IDEM_MARK_REJECT:
            idem_result_set(r, l->recs[i], IDEM_RESULT_REJECT, "%s", s->detail);
            break;
        default: /* a forward-handler lease on this identity */
            idem_result_set(r, l->recs[i], IDEM_RESULT_BUSY, "%s", s->detail);
            break;
        }
    }
    size_t n = l->n;
    l->n = 0;
    return n;
}

static size_t ledger_inflight(void *h)
{
    return ((ledger_t *)h)->n;
}

/* The reply comes on the connection anyway: collect reads it. */
static void ledger_drain(void *h, int64_t deadline_ms)
{
    (void)h;
    (void)deadline_ms;
}

static void ledger_stop(void *h)
{
    ledger_t *l = h;
    if (!l)
        return;
    free(l->recs);
    free(l->res);
    free(l->nums);
    free(l->ring);
    free(l);
}

const idem_handler_ops_t idem_handler_ledger = {
    .api_version = IDEM_HANDLER_API_VERSION,
    .name = "ledger",
    .effect = IDEM_EFFECT_IN_REDIS,
    .needs_payment = 1,
    .ignores_headers = 1,
    .doc = "payments (user_id, amount, currency) added to balances in Redis "
           "in the dedup script, exactly once",
    .start = ledger_start,
    .submit = ledger_submit,
    .collect = ledger_collect,
    .inflight = ledger_inflight,
    .drain = ledger_drain,
    .stop = ledger_stop,
};
