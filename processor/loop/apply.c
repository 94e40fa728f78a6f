/* apply: the one effect protocol of the loop; claim -> effect -> mark
 * around an external handler (apply.h). */
#include "loop/apply.h"
#include "base/log.h"
#include "base/util.h"
#include "redis/rediskeys.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void scratch_reserve(idem_apply_t *a, size_t n)
{
    if (a->cap >= n)
        return;
    a->cap = n;
    a->envs = idem_xrealloc(a->envs, n * sizeof(*a->envs));
    a->done_at = idem_xrealloc(a->done_at, n * sizeof(*a->done_at));
    a->res = idem_xrealloc(a->res, n * sizeof(*a->res));
    a->verdict = idem_xrealloc(a->verdict, n * sizeof(*a->verdict));
    free(a->noparts);
    a->noparts = idem_xcalloc(n, sizeof(*a->noparts));
}

int idem_apply_start(idem_apply_t *a, const idem_handler_ops_t *ops,
                     const idem_handler_ctx_t *ctx, idem_lease_store_t lease,
                     int64_t lease_ms, char *errstr, size_t errstr_size)
{
    memset(a, 0, sizeof(*a));
    a->ops = ops;
    /* The one place that reads the kind of effect. */
    a->leased = ops->effect == IDEM_EFFECT_EXTERNAL;
    a->lease = lease;
    a->lease_ms = lease_ms;
    a->ordering = IDEM_ORDERING_NONE;
    if (a->leased && !ops->keeps_order)
        a->ordering =
            ctx->conf ? (idem_ordering_t)idem_conf_int(ctx->conf, "ordering")
                      : IDEM_ORDERING_KEY;
    idem_handler_ctx_t c = *ctx;
    if (a->leased)
        c.store = NULL; /* an external effect never touches Redis */
    if (!(a->h = ops->start(&c, errstr, errstr_size)))
        return -1;
    a->ps_store = ctx->store;
    /* An effect the store frames (handler=ledger) runs under the group's
     * dedup layout key whatever dedup.scope wants (loop/partscope.h). */
    if (!a->leased && ctx->conf && ctx->store &&
        (ctx->conf->dedup_scope == IDEM_DEDUP_SCOPE_PARTITION ||
         idem_store_effect(ctx->store, NULL, NULL, NULL)) &&
        !(a->ps =
              idem_partscope_new(ctx->store, ctx->conf, errstr, errstr_size))) {
        ops->stop(a->h);
        a->h = NULL;
        return -1;
    }
    return 0;
}

void idem_apply_partition_drop(idem_apply_t *a, const char *topic,
                               int32_t partition)
{
    idem_partscope_drop(a->ps, topic, partition);
}

void idem_apply_partition_reset(idem_apply_t *a, const char *topic,
                                int32_t partition)
{
    idem_partscope_reset(a->ps, topic, partition);
}

size_t idem_apply_table_bytes(const idem_apply_t *a)
{
    return idem_partscope_bytes(a->ps);
}

void idem_apply_table_gauges(const idem_apply_t *a, idem_metrics_t *m,
                             int64_t max_bytes)
{
    if (a->ps && m) {
        idem_metrics_dedup_table_set(m, (int64_t)idem_partscope_bytes(a->ps),
                                     (int64_t)idem_partscope_marks(a->ps),
                                     max_bytes);
        uint64_t chunk = 0, global = 0;
        idem_partscope_layout_refusals(a->ps, &chunk, &global);
        idem_metrics_dedup_layout_refusals_set(m, chunk, global);
        uint64_t behind = idem_partscope_behind_take(a->ps);
        if (behind)
            idem_metrics_redis_behind_add(m, behind);
    }
}

void idem_apply_partition_counter(idem_apply_t *a, idem_partscope_count_fn fn,
                                  void *opaque)
{
    if (a->ps)
        idem_partscope_counter(a->ps, fn, opaque);
}

/* Under dedup.scope=partition: partition-path records answered by their
 * chunks (in now[]), the rest to the handler's global script. */
static int submit_partscope(idem_apply_t *a, idem_record_t **recs,
                            idem_part_t *const *part, size_t n,
                            const idem_store_pos_t *pos, size_t npos,
                            size_t *taken, idem_result_t *now, size_t *nnow,
                            char *errstr, size_t errstr_size)
{
    size_t rest, nrpos;
    const idem_store_pos_t *rpos;
    if (idem_partscope_submit(a->ps, recs, part, n, pos, npos, now, nnow, &rest,
                              &rpos, &nrpos, errstr, errstr_size))
        return -1;
    if (!rest) {
        /* No request for the handler: the positions no chunk carried are
         * written on their own. */
        if (nrpos && idem_store_positions_save(a->ps_store, rpos, nrpos, errstr,
                                               errstr_size))
            return -1;
        return 0; /* the loop takes them as saved (nothing taken) */
    }
    if (a->ops->submit(a->h, recs, rest, rpos, nrpos, errstr, errstr_size))
        return -1;
    *taken = rest;
    a->inflight += rest;
    return 0;
}

size_t idem_apply_room(const idem_apply_t *a)
{
    if (!a->leased)
        return a->inflight ? 0 : SIZE_MAX; /* one request at a time */
    return a->ops->room ? a->ops->room(a->h) : SIZE_MAX;
}

int idem_apply_one_per_identity(const idem_apply_t *a)
{
    return a->leased;
}

idem_ordering_t idem_apply_ordering(const idem_apply_t *a)
{
    return a->ordering;
}

int idem_apply_takes_positions(const idem_apply_t *a)
{
    return !a->leased;
}

int idem_apply_submit(idem_apply_t *a, const char *owner, idem_record_t **recs,
                      idem_part_t *const *part, size_t n,
                      const idem_store_pos_t *pos, size_t npos, size_t *taken,
                      idem_result_t *now, size_t *nnow, char *errstr,
                      size_t errstr_size)
{
    *taken = *nnow = 0;
    if (!n)
        return 0;
    if (a->ps)
        return submit_partscope(a, recs, part, n, pos, npos, taken, now, nnow,
                                errstr, errstr_size);
    if (!a->leased) {
        if (a->ops->submit(a->h, recs, n, pos, npos, errstr, errstr_size))
            return -1;
        *taken = n;
        a->inflight += n;
        return 0;
    }
    /* Claim first: duplicates and records leased elsewhere never reach
     * the handler; records behind a deferred one of their partition wait,
     * so effects keep each partition's order (lease.c). */
    scratch_reserve(a, n);
    for (size_t i = 0; i < n; i++)
        a->envs[i] = recs[i]->env;
    /* By key or partition the pass took one record per group: a record
     * that cannot go now holds back its group through its own result, and
     * must not hold back the other keys of its partition. */
    idem_part_t *const *by =
        a->ordering == IDEM_ORDERING_NONE ? part : a->noparts;
    if (idem_lease_claim(&a->lease, owner, a->envs, by, n, a->res, a->verdict,
                         errstr, errstr_size))
        return -1;
    size_t go = 0;
    for (size_t i = 0; i < n; i++) {
        idem_record_t *rec = recs[i];
        const idem_store_result_t *s = &a->res[i];
        switch (a->verdict[i]) {
        case IDEM_LEASE_GO:
            recs[go++] = rec;
            break;
        case IDEM_LEASE_DUPLICATE: {
            idem_result_t *r = &now[(*nnow)++];
            idem_result_set(r, rec, IDEM_RESULT_DUPLICATE, NULL);
            memcpy(r->prior_mid, s->prior_mid, s->prior_mid_len);
            r->prior_mid[s->prior_mid_len] = '\0';
            r->prior_mid_len = s->prior_mid_len;
            break;
        }
        case IDEM_LEASE_LEASED: { /* wait: the lease expires if dead */
            idem_result_t *r = &now[(*nnow)++];
            idem_result_set(r, rec, IDEM_RESULT_BUSY, "%s", s->detail);
            r->retry_after_ms = a->lease_ms / 4 + 50;
            break;
        }
        case IDEM_LEASE_AGAIN:  /* due again once the first one is done */
        case IDEM_LEASE_BEHIND: /* next pass */
            break;
        }
    }
    if (!go)
        return 0;
    if (a->ops->submit(a->h, recs, go, NULL, 0, errstr, errstr_size))
        return -1;
    *taken = go;
    a->inflight += go;
    return 0;
}

size_t idem_apply_collect(idem_apply_t *a, const char *owner,
                          idem_result_t *out, size_t max, int timeout_ms)
{
    if (!a->inflight)
        return 0;
    size_t n = a->ops->collect(a->h, out, max, timeout_ms);
    a->inflight -= n < a->inflight ? n : a->inflight;
    /* A failed request may be the global script's LAYOUT refusal: the
     * layout key is read again before the records go again. */
    for (size_t i = 0; a->ps && i < n; i++)
        if (out[i].kind == IDEM_RESULT_OUTAGE) {
            idem_partscope_layout_recheck(a->ps);
            break;
        }
    if (!a->leased || !n)
        return n;
    scratch_reserve(a, n);
    size_t done = 0;
    for (size_t i = 0; i < n; i++)
        if (out[i].kind == IDEM_RESULT_DONE) {
            a->done_at[done] = i;
            a->envs[done++] = out[i].rec->env;
        }
    if (!done)
        return n;
    char e[512];
    if (idem_lease_mark(&a->lease, owner, a->envs, done, a->res, e,
                        sizeof(e))) {
        /* Not marked: the lease expires and the effect is done again (at
         * least once); nothing is lost. */
        for (size_t i = 0; i < done; i++) {
            idem_result_t *r = &out[a->done_at[i]];
            idem_result_set(r, r->rec, IDEM_RESULT_OUTAGE, "%s", e);
        }
        return n;
    }
    for (size_t i = 0; i < done; i++)
        if (a->res[i].mark == IDEM_MARK_LOST)
            idem_log_kv(IDEM_LOG_WARN,
                        "lease taken over before mark; effect may be "
                        "duplicated",
                        "message_id", a->envs[i]->message_id, "holder",
                        a->res[i].detail, NULL);
    return n;
}

void idem_apply_drain(idem_apply_t *a, int64_t deadline_ms)
{
    a->ops->drain(a->h, deadline_ms);
}

size_t idem_apply_handler_inflight(const idem_apply_t *a)
{
    return a->ops->inflight(a->h);
}

void idem_apply_forget(idem_apply_t *a)
{
    a->inflight = 0;
}

int idem_apply_fatal(idem_apply_t *a, char *errstr, size_t errstr_size)
{
    return a->ops->fatal ? a->ops->fatal(a->h, errstr, errstr_size) : 0;
}

void idem_apply_stop(idem_apply_t *a)
{
    idem_partscope_destroy(a->ps);
    a->ps = NULL;
    if (a->h)
        a->ops->stop(a->h);
    a->h = NULL;
    free(a->envs);
    free(a->done_at);
    free(a->res);
    free(a->verdict);
    free(a->noparts);
    a->noparts = NULL;
    a->envs = NULL;
    a->done_at = NULL;
    a->res = NULL;
    a->verdict = NULL;
    a->cap = 0;
}
