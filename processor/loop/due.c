/* due: which records in hand may go to the handler now, by the ordering
 * an external effect keeps (due.h). */
#include "loop/due.h"
#include "base/util.h"

#include <stdlib.h>
#include <string.h>

const char *idem_ordering2str(idem_ordering_t o)
{
    switch (o) {
    case IDEM_ORDERING_KEY:
        return "key";
    case IDEM_ORDERING_PARTITION:
        return "partition";
    case IDEM_ORDERING_NONE:
        return "none";
    }
    return "?";
}

/* FNV-1a, continued from h. */
static uint64_t fnv(uint64_t h, const void *p, size_t len)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < len; i++)
        h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

#define FNV_INIT 1469598103934665603ULL

void idem_due_init(idem_due_t *d, idem_ordering_t ordering,
                   int one_per_identity)
{
    memset(d, 0, sizeof(*d));
    d->ordering = ordering;
    d->one_per_identity = one_per_identity;
}

void idem_due_term(idem_due_t *d)
{
    free(d->ids);
    free(d->grp);
    memset(d, 0, sizeof(*d));
}

/* ------------------------------------------------- identities in flight */

static size_t id_home(const idem_due_t *d, const rec_t *r)
{
    return (size_t)fnv(FNV_INIT, r->env.identity, r->env.identity_len) &
           (d->ids_size - 1);
}

/* 1 when a record with r's identity is in the set. */
static int id_has(const idem_due_t *d, const rec_t *r)
{
    if (!d->ids_cnt)
        return 0;
    for (size_t i = id_home(d, r); d->ids[i]; i = (i + 1) & (d->ids_size - 1))
        if (d->ids[i]->env.identity_len == r->env.identity_len &&
            !memcmp(d->ids[i]->env.identity, r->env.identity,
                    r->env.identity_len))
            return 1;
    return 0;
}

static void id_put(idem_due_t *d, rec_t *r)
{
    size_t i = id_home(d, r);
    while (d->ids[i])
        i = (i + 1) & (d->ids_size - 1);
    d->ids[i] = r;
    d->ids_cnt++;
}

static void id_add(idem_due_t *d, rec_t *r)
{
    if (2 * (d->ids_cnt + 1) > d->ids_size) {
        rec_t **old = d->ids;
        size_t old_size = d->ids_size;
        d->ids_size = old_size ? 2 * old_size : 64;
        d->ids = idem_xcalloc(d->ids_size, sizeof(*d->ids));
        d->ids_cnt = 0;
        for (size_t i = 0; i < old_size; i++)
            if (old[i])
                id_put(d, old[i]);
        free(old);
    }
    id_put(d, r);
}

/* Removes r itself (not another record of its identity); the probe
 * sequences stay whole by shifting the records after it back. */
static void id_del(idem_due_t *d, const rec_t *r)
{
    if (!d->ids_cnt)
        return;
    size_t mask = d->ids_size - 1, i = id_home(d, r);
    for (; d->ids[i] != r; i = (i + 1) & mask)
        if (!d->ids[i])
            return;
    d->ids[i] = NULL;
    d->ids_cnt--;
    for (size_t j = (i + 1) & mask; d->ids[j]; j = (j + 1) & mask) {
        size_t k = id_home(d, d->ids[j]);
        /* d->ids[j] may move to the hole at i unless its home lies
         * cyclically in (i, j]. */
        int stays = i <= j ? (k > i && k <= j) : (k > i || k <= j);
        if (!stays) {
            d->ids[i] = d->ids[j];
            d->ids[j] = NULL;
            i = j;
        }
    }
}

void idem_due_sent(idem_due_t *d, rec_t *r)
{
    if (d->one_per_identity)
        id_add(d, r);
}

void idem_due_back(idem_due_t *d, rec_t *r)
{
    id_del(d, r);
}

void idem_due_forget(idem_due_t *d)
{
    if (d->ids)
        memset(d->ids, 0, d->ids_size * sizeof(*d->ids));
    d->ids_cnt = 0;
}

/* ------------------------------------------------------- groups of a pass */

/* A new pass over `live` records: every group is unseen. */
static void pass_begin(idem_due_t *d, size_t live)
{
    size_t need = 64;
    while (need < 2 * live + 2)
        need *= 2;
    if (d->grp_size < need) {
        free(d->grp);
        d->grp = idem_xcalloc(need, sizeof(*d->grp));
        d->grp_size = need;
        d->gen = 0;
    }
    if (++d->gen == 0) { /* wrapped: slots of 2^32 passes ago look seen */
        memset(d->grp, 0, d->grp_size * sizeof(*d->grp));
        d->gen = 1;
    }
}

/* Whether a and b are in one group: one partition, and by_key one key
 * (records without a key: one group of their partition). */
static int group_same(const rec_t *a, const rec_t *b, int by_key)
{
    if (a->view.partition != b->view.partition ||
        (a->view.topic != b->view.topic &&
         strcmp(a->view.topic, b->view.topic)))
        return 0;
    if (!by_key)
        return 1;
    if (!a->view.key || !b->view.key)
        return !a->view.key && !b->view.key;
    return a->view.key_len == b->view.key_len &&
           !memcmp(a->view.key, b->view.key, a->view.key_len);
}

/* r's group in this pass; *fresh 1 when r is the first met of it. */
static idem_due_group_t *group_meet(idem_due_t *d, const rec_t *r, int by_key,
                                    int *fresh)
{
    uint64_t h = fnv(FNV_INIT, &r->view.partition, sizeof(r->view.partition));
    if (by_key) {
        unsigned char has = r->view.key != NULL;
        h = fnv(h, &has, 1);
        if (has)
            h = fnv(h, r->view.key, r->view.key_len);
    }
    size_t mask = d->grp_size - 1;
    for (size_t i = (size_t)h & mask;; i = (i + 1) & mask) {
        idem_due_group_t *g = &d->grp[i];
        if (g->gen != d->gen) {
            g->gen = d->gen;
            g->first = r;
            g->count = 0;
            *fresh = 1;
            return g;
        }
        if (group_same(g->first, r, by_key)) {
            *fresh = 0;
            return g;
        }
    }
}

/* ------------------------------------------------------------- a pass */

size_t idem_due_select(idem_due_t *d, const idem_records_t *recs,
                       idem_offsets_t *offs, int64_t now, size_t max,
                       rec_t **out)
{
    size_t n = 0;
    int grouped = d->ordering != IDEM_ORDERING_NONE;
    int by_key = d->ordering == IDEM_ORDERING_KEY;
    if (grouped)
        pass_begin(d, recs->live);
    else
        for (size_t i = 0; i < offs->cnt; i++)
            offs->v[i].waiting = 0;
    rec_t *r;
    for (size_t i = 0; n < max && (r = idem_records_next(recs, &i));) {
        if (r->state == REC_DONE || r->to_tier)
            continue; /* finished, or its key released (a retry topic) */
        if (grouped) {
            int fresh;
            group_meet(d, r, by_key, &fresh);
            if (!fresh)
                continue; /* behind an unfinished record of its group */
            /* The group's head: while it is with the handler, waits for
             * its retry time, for its dead letter, or for its identity
             * elsewhere in hand, the group waits. */
            if (r->poison || r->sent || r->retry_at_ms > now ||
                (d->one_per_identity && id_has(d, r)))
                continue;
        } else {
            if (r->poison || r->sent)
                continue;
            idem_part_t *pt =
                idem_offsets_find(offs, r->view.topic, r->view.partition);
            if (pt && pt->waiting)
                continue;
            if (r->retry_at_ms > now || (d->one_per_identity && id_has(d, r))) {
                if (pt)
                    pt->waiting = 1;
                continue;
            }
        }
        if (d->one_per_identity)
            id_add(d, r); /* picked: a later record of its identity waits */
        out[n++] = r;
    }
    if (d->one_per_identity)
        for (size_t i = 0; i < n; i++)
            id_del(d, out[i]); /* in the set again once sent */
    return n;
}

size_t idem_due_key_holds(idem_due_t *d, const idem_records_t *recs,
                          idem_offsets_t *offs, int64_t now, size_t bound)
{
    /* Per partition: blocked counts the waiting records, waiting is set
     * once one of them may start (scratch of this walk). */
    for (size_t i = 0; i < offs->cnt; i++) {
        offs->v[i].blocked = 0;
        offs->v[i].waiting = 0;
    }
    int by_key = d->ordering == IDEM_ORDERING_KEY;
    if (d->ordering != IDEM_ORDERING_NONE && recs->live >= bound) {
        pass_begin(d, recs->live);
        rec_t *r;
        for (size_t i = 0; (r = idem_records_next(recs, &i));) {
            if (r->state == REC_DONE || r->to_tier)
                continue;
            int fresh;
            group_meet(d, r, by_key, &fresh);
            if (r->sent)
                continue; /* with the handler: not waiting in hand */
            idem_part_t *pt =
                idem_offsets_find(offs, r->view.topic, r->view.partition);
            if (!pt)
                continue;
            pt->blocked++;
            if (fresh && r->parsed && !r->poison && r->retry_at_ms <= now &&
                !(d->one_per_identity && id_has(d, r)))
                pt->waiting = 1; /* a head that may start */
            else if (!r->parsed)
                pt->waiting = 1; /* not judged yet: no reason to hold */
        }
    }
    size_t held = 0;
    for (size_t i = 0; i < offs->cnt; i++) {
        idem_part_t *pt = &offs->v[i];
        pt->key_hold = !pt->waiting && bound && (size_t)pt->blocked >= bound;
        held += (size_t)pt->key_hold;
        pt->blocked = 0;
        pt->waiting = 0;
    }
    return held;
}

void idem_due_census(idem_due_t *d, const idem_records_t *recs,
                     size_t *keys_waiting, size_t *depth_hwm)
{
    int by_key = d->ordering != IDEM_ORDERING_PARTITION;
    size_t waiting = 0;
    pass_begin(d, recs->live);
    rec_t *r;
    for (size_t i = 0; (r = idem_records_next(recs, &i));) {
        if (r->state == REC_DONE || r->to_tier)
            continue;
        int fresh;
        idem_due_group_t *g = group_meet(d, r, by_key, &fresh);
        if (++g->count == 2)
            waiting++;
        if (g->count > d->depth_hwm)
            d->depth_hwm = g->count;
    }
    *keys_waiting = waiting;
    *depth_hwm = d->depth_hwm;
}
