/* due: which records in hand may go to the handler now (due.h). */
#include "loop/due.h"
#include "base/util.h"

#include <stdlib.h>
#include <string.h>

/* FNV-1a of an identity, for the in-flight identity set. */
static uint64_t id_hash(const char *id, size_t len)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)id[i]) * 1099511628211ULL;
    return h;
}

/* The identities with an external handler or picked for it: an external
 * effect may run only once at a time per identity, since the claim script
 * re-claims this member's own leases (also across the chunks of one claim
 * call, whose `seen` table covers one chunk only). An open-addressing
 * table of `size` slots (a power of two). */
typedef struct {
    rec_t **slot;
    size_t size;
} id_set_t;

static void id_set_init(id_set_t *s, size_t n)
{
    for (s->size = 16; s->size < n * 2; s->size *= 2)
        ;
    s->slot = idem_xcalloc(s->size, sizeof(*s->slot));
}

/* Adds r's identity; returns 0 when it was new, 1 when it was there. */
static int id_set_add(id_set_t *s, rec_t *r)
{
    size_t i =
        (size_t)id_hash(r->env.identity, r->env.identity_len) & (s->size - 1);
    for (; s->slot[i]; i = (i + 1) & (s->size - 1))
        if (s->slot[i]->env.identity_len == r->env.identity_len &&
            !memcmp(s->slot[i]->env.identity, r->env.identity,
                    r->env.identity_len))
            return 1;
    s->slot[i] = r;
    return 0;
}

size_t idem_due_select(const idem_records_t *recs, idem_offsets_t *offs,
                       int one_per_identity, int64_t now, rec_t **out)
{
    for (size_t i = 0; i < offs->cnt; i++)
        offs->v[i].waiting = 0;
    id_set_t ids = {NULL, 0};
    rec_t *r;
    if (one_per_identity) {
        id_set_init(&ids, recs->live);
        for (size_t i = 0; (r = idem_records_next(recs, &i));)
            if (r->sent)
                id_set_add(&ids, r);
    }
    size_t n = 0;
    for (size_t i = 0; (r = idem_records_next(recs, &i));) {
        if (r->state == REC_DONE || r->poison || r->sent || r->to_tier)
            continue;
        idem_part_t *pt =
            idem_offsets_find(offs, r->view.topic, r->view.partition);
        if (pt && pt->waiting)
            continue;
        if (r->retry_at_ms > now || (ids.slot && id_set_add(&ids, r))) {
            if (pt)
                pt->waiting = 1;
            continue;
        }
        out[n++] = r;
    }
    free(ids.slot);
    return n;
}
