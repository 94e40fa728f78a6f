/* effects: the records in hand on their way to the handler and back:
 * reading them (envelope), what is due, claiming and submitting, results
 * into outcomes (marking external effects done), retries, and dead
 * letters (effects.h). */
#include "loop/effects.h"
#include "loop/due.h"
#include "loop/flow.h"
#include "loop/retryloop.h"
#include "base/log.h"
#include "base/util.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ outcomes */

static void rec_finish(idem_effects_t *fx, rec_t *r, idem_outcome_t o)
{
    r->state = REC_DONE;
    idem_metrics_acc_outcome_add(fx->acc, o, 1);
    idem_metrics_acc_latency_observe(
        fx->acc, (double)(fx->clock_us - r->polled_us) / 1e6);
    /* Produce-to-effect (the bench's latency): the record's CreateTime has
     * millisecond resolution, so this overstates by up to 1 ms. */
    if (o == IDEM_OUTCOME_PROCESSED && r->view.timestamp > 0) {
        int64_t created_us = r->view.timestamp * 1000 - fx->wall_offset_us;
        idem_metrics_acc_effect_latency_observe(
            fx->acc, (double)(fx->clock_us - created_us) / 1e6);
        idem_metrics_acc_fetch_latency_observe(
            fx->acc, (double)(r->polled_us - created_us) / 1e6);
    }
    idem_progress_count(fx->progress, 1);
}

/* A done mark existed. The same message_id means Kafka (or the producer)
 * delivered the very same message again; a new message_id (or none) with a
 * known identity is a client that sent the operation again. A record whose
 * earlier store call failed after it may have run counts as processed. */
static void rec_duplicate(idem_effects_t *fx, rec_t *r, const char *prior_mid,
                          size_t prior_mid_len)
{
    int same = r->env.message_id_len > 0 &&
               prior_mid_len == r->env.message_id_len &&
               !memcmp(prior_mid, r->env.message_id, prior_mid_len);
    if (same && r->store_sent) {
        rec_finish(fx, r, IDEM_OUTCOME_PROCESSED);
        return;
    }
    idem_metrics_duplicate_add(fx->m,
                               same ? IDEM_DUP_REDELIVERY : IDEM_DUP_RESEND, 1);
    rec_finish(fx, r, IDEM_OUTCOME_DUPLICATE);
    if (idem_log_enabled(IDEM_LOG_DEBUG)) {
        char off[24];
        snprintf(off, sizeof(off), "%" PRId64, r->view.offset);
        idem_log_kv(IDEM_LOG_DEBUG, "duplicate", "topic", r->view.topic,
                    "offset", off, "message_id", r->env.message_id, "kind",
                    same ? "redelivery" : "resend", NULL);
    }
}

static void rec_poison(idem_effects_t *fx, rec_t *r, idem_reason_t reason,
                       const char *error)
{
    fx->dlq_due = 1;
    r->poison = 1;
    r->reason = reason;
    snprintf(r->error, sizeof(r->error), "%s", error);
}

/* A retriable handler error: back off with jitter (at least `after_ms`),
 * or give up. */
static void rec_retry(idem_effects_t *fx, rec_t *r, const char *error,
                      int64_t after_ms)
{
    r->attempts++;
    if (fx->rt) {
        /* Retry topics: no waiting here; the next tier's copy is retried
         * later (retryloop.c), after the last tier it is dead. */
        if (!idem_retrytopics_next(fx->rt, r->view.topic)) {
            char e[IDEM_RESULT_DETAIL_MAX];
            snprintf(e, sizeof(e),
                     "gave up after %d attempts (last of retry.topics): "
                     "%.540s",
                     r->prior_attempts + r->attempts, error);
            rec_poison(fx, r, IDEM_REASON_MAX_RETRIES, e);
            return;
        }
        idem_metrics_retry_add(fx->m, 1);
        r->to_tier = r->tier + 1;
        fx->dlq_due = 1;
        r->retry_after_ms = after_ms;
        snprintf(r->error, sizeof(r->error), "%s", error);
        return;
    }
    if (r->attempts >= fx->conf->retry_max_attempts) {
        char e[IDEM_RESULT_DETAIL_MAX];
        snprintf(e, sizeof(e), "gave up after %d attempts: %.560s", r->attempts,
                 error);
        rec_poison(fx, r, IDEM_REASON_MAX_RETRIES, e);
        return;
    }
    idem_metrics_retry_add(fx->m, 1);
    int64_t d = idem_backoff_jitter(
        idem_backoff_ms(r->attempts, fx->conf->retry_backoff_initial_ms,
                        fx->conf->retry_backoff_max_ms),
        rand());
    if (d < after_ms)
        d = after_ms;
    r->retry_at_ms = idem_now_ms() + d;
    fx->retry_waiting = 1;
}

/* --------------------------------------------------------- the handler */

static void scratch_reserve(idem_effects_t *fx)
{
    if (fx->scratch_cap >= fx->recs->live)
        return;
    /* Kept across batches: a fresh allocation per batch would be an mmap
     * and page faults every time. */
    fx->scratch_cap = fx->recs->live > fx->cap ? fx->recs->live : fx->cap;
    fx->rs = idem_xrealloc(fx->rs, fx->scratch_cap * sizeof(*fx->rs));
    fx->views = idem_xrealloc(fx->views, fx->scratch_cap * sizeof(*fx->views));
    fx->hres = idem_xrealloc(fx->hres, fx->scratch_cap * sizeof(*fx->hres));
    fx->parts = idem_xrealloc(fx->parts, fx->scratch_cap * sizeof(*fx->parts));
}

/* The scheduler, set up once the handler is known. */
static idem_due_t *due_state(idem_effects_t *fx)
{
    if (!fx->due_ready) {
        idem_due_init(&fx->due, idem_apply_ordering(fx->apply),
                      idem_apply_one_per_identity(fx->apply));
        fx->due_ready = 1;
    }
    return &fx->due;
}

/* Collects into fx->rs the first `max` records that may start now
 * (due.c: by key, partition or as due). */
static size_t due_records(idem_effects_t *fx, int64_t now, size_t max)
{
    scratch_reserve(fx);
    return idem_due_select(due_state(fx), fx->recs, fx->offs, now, max, fx->rs);
}

/* How often the ordering gauges are taken (a walk over the records in
 * hand). */
#define CENSUS_INTERVAL_US 100000

/* The ordering gauges of an external effect: records in flight, keys
 * waiting, the deepest key (obs/metrics.h), at most every
 * CENSUS_INTERVAL_US. */
static void ordering_census(idem_effects_t *fx)
{
    if (!fx->m || !idem_apply_one_per_identity(fx->apply) ||
        fx->clock_us - fx->census_us < CENSUS_INTERVAL_US)
        return;
    fx->census_us = fx->clock_us;
    size_t waiting, hwm;
    idem_due_census(due_state(fx), fx->recs, &waiting, &hwm);
    idem_metrics_ordering_set(fx->m, (int64_t)fx->inflight, (int64_t)waiting,
                              (int64_t)hwm);
}

/* How often at most the key holds are judged (a walk over the records in
 * hand once there are hold_bound of them). */
#define HOLDS_INTERVAL_US 1000

/* Judges which partitions wait behind busy keys (due.h), after a feed:
 * the loop pauses their fetch. By key or partition only. */
static void key_holds(idem_effects_t *fx)
{
    /* A hold ends as soon as it may (each feed while one lasts); one
     * starts once new records came in (a poll's batch: the hands do not
     * fill between two walks), else within HOLDS_INTERVAL_US. */
    if (!fx->hold_bound || due_state(fx)->ordering == IDEM_ORDERING_NONE ||
        (!fx->key_holds && (fx->recs->live < fx->hold_bound ||
                            (fx->parsed_n == fx->holds_parsed_n &&
                             fx->clock_us - fx->holds_us < HOLDS_INTERVAL_US))))
        return;
    fx->holds_us = fx->clock_us;
    fx->holds_parsed_n = fx->parsed_n;
    fx->key_holds = idem_due_key_holds(&fx->due, fx->recs, fx->offs,
                                       idem_now_ms(), fx->hold_bound);
}

/* Turns results res[n] into outcomes. `answer`: they are what the effect
 * answered (collected), not what a claim knew at once; an answer that is
 * no outage says the effect's service (or Redis) answers, and a store
 * handler's request, answered, stores the positions it carried unless it
 * failed. Returns 0, or -1 (outage: errstr). */
static int results_apply(idem_effects_t *fx, const idem_result_t *res, size_t n,
                         int answer, char *errstr, size_t errstr_size)
{
    int rc = 0;
    int64_t now = idem_now_ms();
    for (size_t i = 0; i < n; i++, res++) {
        rec_t *r = res->rec->loop;
        if (r->sent)
            idem_due_back(due_state(fx), r);
        r->sent = 0;
        fx->inflight--;
        if (answer && res->kind != IDEM_RESULT_OUTAGE)
            fx->answered = 1;
        switch (res->kind) {
        case IDEM_RESULT_DONE:
            idem_rejectguard_ok(&fx->rejects);
            rec_finish(fx, r, IDEM_OUTCOME_PROCESSED);
            break;
        case IDEM_RESULT_DUPLICATE:
            idem_rejectguard_ok(&fx->rejects);
            rec_duplicate(fx, r, res->prior_mid, res->prior_mid_len);
            break;
        case IDEM_RESULT_BUSY: /* a lease elsewhere: it ends or expires */
            r->retry_at_ms =
                now + (res->retry_after_ms > 0 ? res->retry_after_ms
                                               : fx->conf->dedup_lease_ms / 4);
            fx->retry_waiting = 1;
            break;
        case IDEM_RESULT_REJECT:
            if (!idem_rejectguard_reject(&fx->rejects)) {
                rec_poison(fx, r, IDEM_REASON_HANDLER_REJECTED, res->detail);
                break;
            }
            /* Too many in a row: a broken effect, held back as an outage
             * (paused, not ready, tried again) instead of a DLQ blast. */
            r->store_sent = 1; /* as an outage: its mark, if any, says */
            if (!rc)
                idem_rejectguard_reason(&fx->rejects, res->detail, errstr,
                                        errstr_size);
            rc = -1;
            break;
        case IDEM_RESULT_RETRY:
            rec_retry(fx, r, res->detail, res->retry_after_ms);
            break;
        case IDEM_RESULT_OUTAGE:
            r->store_sent = 1; /* it may have run: its mark says */
            if (!rc)
                snprintf(errstr, errstr_size, "%.500s", res->detail);
            rc = -1;
            break;
        }
    }
    if (answer && n) {
        /* The request is answered: the positions it carried (if any) are
         * stored unless it failed. */
        for (size_t i = 0; i < fx->offs->cnt; i++) {
            idem_part_t *pt = &fx->offs->v[i];
            if (rc == 0 && pt->saving >= 0)
                pt->saved = pt->saving;
            pt->saving = -1;
        }
    }
    return rc;
}

/* Hands rs[n] to the effect (apply.h), with the positions due when it
 * takes them; what a claim answered at once is applied now. Returns 0, or
 * -1 (outage, errstr). */
static int handler_submit(idem_effects_t *fx, size_t n, char *errstr,
                          size_t errstr_size)
{
    size_t npos = idem_apply_takes_positions(fx->apply)
                      ? idem_positions_due(fx->positions, fx->offs, NULL)
                      : 0;
    const idem_store_pos_t *pos = fx->positions->pos; /* after: it may grow */
    for (size_t i = 0; i < n; i++) {
        fx->views[i] = &fx->rs[i]->view;
        fx->parts[i] = idem_offsets_find(fx->offs, fx->rs[i]->view.topic,
                                         fx->rs[i]->view.partition);
    }
    fx->clock_us = idem_now_us();
    size_t taken, nnow;
    int rc =
        idem_apply_submit(fx->apply, fx->owner, fx->views, fx->parts, n, pos,
                          npos, &taken, fx->hres, &nnow, errstr, errstr_size);
    fx->inflight += taken + nnow;
    char e[8];
    results_apply(fx, fx->hres, nnow, 0, e, sizeof(e)); /* never an outage */
    if (rc) {
        /* Not taken; a request that failed may have run: marks say. */
        for (size_t i = 0; i < n; i++)
            if (fx->rs[i]->state != REC_DONE)
                fx->rs[i]->store_sent = 1;
        return -1;
    }
    for (size_t i = 0; i < npos; i++) {
        idem_part_t *pt =
            idem_offsets_find(fx->offs, pos[i].topic, pos[i].partition);
        /* Nothing taken (dedup.scope=partition answered every record at
         * once): the positions were written before submit returned. */
        if (taken)
            pt->saving = pos[i].offset;
        else
            pt->saved = pos[i].offset;
    }
    for (size_t i = 0; i < taken; i++) {
        rec_t *r = fx->views[i]->loop;
        r->sent = 1;
        idem_due_sent(due_state(fx), r);
    }
    if (taken)
        idem_metrics_batch_observe(fx->m, (double)taken);
    return 0;
}

/* Collects what the handler finished (waiting up to timeout_ms for the
 * first) and applies it. Returns 0 or -1 (outage: errstr). */
int idem_effects_collect(idem_effects_t *fx, int timeout_ms, char *errstr,
                         size_t errstr_size)
{
    if (!fx->inflight)
        return 0;
    scratch_reserve(fx);
    size_t n = idem_apply_collect(fx->apply, fx->owner, fx->hres,
                                  fx->scratch_cap, timeout_ms);
    fx->clock_us = idem_now_us();
    return results_apply(fx, fx->hres, n, 1, errstr, errstr_size);
}

/* Finishes or abandons everything with the handler until deadline_ms:
 * afterwards no record is with it. */
void idem_effects_settle(idem_effects_t *fx, int64_t deadline_ms)
{
    char errstr[512];
    if (!fx->inflight)
        return;
    idem_apply_drain(fx->apply, deadline_ms);
    idem_effects_collect(fx, 0, errstr, sizeof(errstr));
    if (fx->inflight) {
        /* Abandoned by the drain (their leases expire unmarked), as the
         * contract allows; only a handler that still counts records in
         * flight broke it. */
        size_t kept = idem_apply_handler_inflight(fx->apply);
        char n[24];
        snprintf(n, sizeof(n), "%zu", kept ? kept : fx->inflight);
        if (kept)
            idem_log_kv(IDEM_LOG_ERROR, "handler kept records after drain",
                        "handler", fx->apply->ops->name, "records", n, NULL);
        else
            idem_log_kv(IDEM_LOG_WARN,
                        "drain deadline: effects abandoned, their records "
                        "are repeated by the partition's next owner",
                        "handler", fx->apply->ops->name, "records", n, NULL);
        rec_t *r;
        for (size_t i = 0; (r = idem_records_next(fx->recs, &i));)
            r->sent = 0;
        idem_due_forget(due_state(fx));
        fx->inflight = 0;
        idem_apply_forget(fx->apply);
    }
}

/* Gives the handler what is due, no more than it can start now (a lease
 * must not run out while its record waits in the handler's queue; a store
 * handler takes one request at a time); nothing while draining (a drain
 * starts no new effect: what it would start is abandoned at the deadline,
 * and the partition's next owner repeats it). Returns 0 or -1 (outage:
 * errstr). */
int idem_effects_feed(idem_effects_t *fx, char *errstr, size_t errstr_size)
{
    if (fx->draining)
        return 0;
    ordering_census(fx);
    size_t room = idem_apply_room(fx->apply);
    int rc = 0;
    if (room) {
        /* The first in poll order: partitions (and keys) keep their
         * order. */
        size_t n = due_records(fx, idem_now_ms(), room);
        if (n && idem_positions_first(fx->positions, fx->offs, fx->recs, fx->rs,
                                      n, errstr, errstr_size))
            return -1;
        rc = n ? handler_submit(fx, n, errstr, errstr_size) : 0;
    }
    key_holds(fx);
    return rc;
}

/* ------------------------------------------------------ the batch cycle */

/* Reads new records by the envelope rules and fills their views. */
void idem_effects_parse(idem_effects_t *fx)
{
    rec_t *r;
    /* New records are pushed at the end: only the slots from the mark on
     * hold unparsed ones (the records in hand are not walked again). */
    size_t i = idem_records_mark(fx->recs);
    idem_records_set_mark(fx->recs);
    while ((r = idem_records_next(fx->recs, &i))) {
        if (r->parsed)
            continue;
        r->parsed = 1;
        fx->parsed_n++;
        /* The headers are parsed only when the envelope or the handler
         * reads them (most records carry their identity in the value). */
        const rd_kafka_headers_t *h = NULL;
        idem_reason_t reason;
        char err[256];
        if (idem_envelope_read_msg(fx->rules, r->msg, &h, &r->env, &reason, err,
                                   sizeof(err))) {
            rec_poison(fx, r, reason, err);
            continue;
        }
        rd_kafka_headers_t *all;
        if (!h && !fx->apply->ops->ignores_headers &&
            !rd_kafka_message_headers(r->msg, &all))
            h = all;
        idem_record_t *v = &r->view;
        v->identity = r->env.identity;
        v->identity_len = r->env.identity_len;
        v->message_id = r->env.message_id;
        v->message_id_len = r->env.message_id_len;
        v->value_is_object = r->env.json_object;
        v->headers = h;
        v->env = &r->env;
    }
}

/* Queues every poison record that has no DLQ write yet, and every record
 * bound for a retry topic that has no write yet. A dead letter of a
 * record out of a retry topic says where the first input record was and
 * counts every attempt. Returns 0, or -1 when the producer refused to
 * queue (infrastructure). */
int idem_effects_dlq_queue(idem_effects_t *fx, char *errstr, size_t errstr_size)
{
    if (!fx->dlq_due)
        return 0;
    fx->dlq_due = 0;
    rec_t *r;
    for (size_t i = 0; (r = idem_records_next(fx->recs, &i));) {
        if (r->state == REC_DONE || (!r->poison && !r->to_tier) || r->dlq)
            continue;
        ticket_t *t = idem_deadletter_ticket_new();
        int rc;
        if (r->poison) {
            idem_retry_info_t from, *fromp = NULL;
            if (r->tier > 0) {
                rd_kafka_headers_t *h;
                if (rd_kafka_message_headers(r->msg, &h))
                    h = NULL;
                if (idem_retrytopic_info_read(h, &from) == 0)
                    fromp = &from;
            }
            rc = idem_dlq_send(fx->dlq, r->msg, fromp, r->reason, r->error,
                               r->prior_attempts +
                                   (r->attempts ? r->attempts : 1),
                               r->dlq_drop_value, t, errstr, errstr_size);
        } else {
            rc =
                idem_retryloop_send(fx->rt, fx->dlq, r, t, errstr, errstr_size);
        }
        if (rc) {
            free(t);
            fx->dlq_due = 1; /* this one and the rest: next time */
            return -1;
        }
        r->dlq = t;
        fx->tickets++;
    }
    return 0;
}

/* Finishes poison records whose DLQ write was acknowledged; a failed write
 * is queued again later (the DLQ is at-least-once: verify counts distinct
 * originals). Returns -1 when a write failed (infrastructure). */
int idem_effects_dlq_collect(idem_effects_t *fx, char *errstr,
                             size_t errstr_size)
{
    idem_dlq_poll(fx->dlq);
    fx->clock_us = idem_now_us();
    int failed = 0;
    rec_t *r;
    for (size_t i = 0; fx->tickets && (r = idem_records_next(fx->recs, &i));) {
        if (!r->dlq || r->dlq->state == 0)
            continue;
        ticket_t *t = r->dlq;
        r->dlq = NULL;
        fx->tickets--;
        fx->dlq_due = 1; /* unless finished below: written again */
        switch (idem_deadletter_after(t, r->poison, r->to_tier)) {
        case IDEM_DL_PENDING: /* not reached: state checked above */
            break;
        case IDEM_DL_RETRY_SENT:
            idem_retryloop_sent(r, fx->m);
            idem_progress_count(fx->progress, 1);
            break;
        case IDEM_DL_RETRY_REFUSED: {
            /* The retry topic will never take it: dead instead. */
            char e[IDEM_RESULT_DETAIL_MAX];
            snprintf(e, sizeof(e),
                     "retry topic refused the record (%s): %.500s",
                     rd_kafka_err2str(t->err), r->error);
            rec_poison(fx, r, IDEM_REASON_MAX_RETRIES, e);
            break;
        }
        case IDEM_DL_DEAD:
            idem_metrics_dlq_add(fx->m, r->reason, 1);
            rec_finish(fx, r, IDEM_OUTCOME_DLQ);
            if (idem_log_enabled(IDEM_LOG_INFO)) {
                char part[16], off[24];
                snprintf(part, sizeof(part), "%" PRId32, r->msg->partition);
                snprintf(off, sizeof(off), "%" PRId64, r->msg->offset);
                idem_log_kv(IDEM_LOG_INFO, "dead-lettered", "topic",
                            rd_kafka_topic_name(r->msg->rkt), "partition", part,
                            "offset", off, "reason", idem_reason2str(r->reason),
                            "error", r->error, NULL);
            }
            break;
        case IDEM_DL_DROP_VALUE:
            /* The broker will never take this value: send the dead letter
             * without it rather than hold the partition forever. */
            r->dlq_drop_value = 1;
            break;
        case IDEM_DL_FAILED:
            if (!failed) {
                failed = 1;
                snprintf(errstr, errstr_size, "%s: write to %s failed: %s",
                         r->poison ? "dlq" : "retry",
                         r->poison
                             ? fx->conf->dlq_topic
                             : idem_retrytopics_next(fx->rt, r->view.topic),
                         rd_kafka_err2str(t->err));
            }
            break;
        }
        free(t);
    }
    return failed ? -1 : 0;
}

/* Earliest retry time of a waiting record, or 0 when none waits. A copy
 * from a retry topic may wait minutes: for it this says "soon" at the
 * latest, so the loop (paused with full hands) keeps working on the rest
 * of its hands meanwhile. */
int64_t idem_effects_next_retry(idem_effects_t *fx)
{
    int64_t t = 0;
    if (!fx->retry_waiting)
        return 0;
    int64_t soon = fx->rt ? idem_now_ms() + RETRY_COPY_RECHECK_MS : 0;
    rec_t *r;
    for (size_t i = 0; (r = idem_records_next(fx->recs, &i));) {
        if (r->state == REC_DONE || !r->retry_at_ms)
            continue;
        int64_t at =
            r->tier > 0 && r->retry_at_ms > soon ? soon : r->retry_at_ms;
        if (t == 0 || at < t)
            t = at;
    }
    if (t == 0)
        fx->retry_waiting = 0;
    return t;
}

void idem_effects_term(idem_effects_t *fx)
{
    idem_due_term(&fx->due);
    fx->due_ready = 0;
    free(fx->rs);
    free(fx->views);
    free(fx->hres);
    free(fx->parts);
    fx->rs = NULL;
    fx->views = NULL;
    fx->hres = NULL;
    fx->parts = NULL;
    fx->scratch_cap = 0;
}
