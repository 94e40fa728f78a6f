/* ledger: handler=ledger, payments applied in Redis. The effect (HINCRBY
 * of the user's balance) and the dedup mark are one Lua script (store.c),
 * so no crash can separate them; one pipelined request in flight. */
#include "effect/handler.h"
#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    idem_store_t *store;
    idem_record_t **recs; /* the request in flight */
    const idem_envelope_t **envs;
    idem_store_result_t *res;
    size_t n, cap;
} ledger_t;

static void *ledger_start(const idem_handler_ctx_t *ctx, char *errstr,
                          size_t errstr_size)
{
    if (!ctx->store) {
        snprintf(errstr, errstr_size, "ledger: no Redis store");
        return NULL;
    }
    ledger_t *l = idem_xcalloc(1, sizeof(*l));
    l->store = ctx->store;
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
        l->envs = idem_xrealloc(l->envs, n * sizeof(*l->envs));
        l->res = idem_xrealloc(l->res, n * sizeof(*l->res));
    }
    for (size_t i = 0; i < n; i++) {
        l->recs[i] = recs[i];
        l->envs[i] = recs[i]->env;
    }
    if (idem_store_ledger_send(l->store, l->envs, n, pos, npos, errstr,
                               errstr_size))
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
        idem_store_ledger_recv(l->store, l->n, l->res, errstr, sizeof(errstr));
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
    free(l->envs);
    free(l->res);
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
