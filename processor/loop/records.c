/* records: the records in hand, an index with lazily closed holes
 * (records.h). */
#include "loop/records.h"
#include "base/util.h"

#include <stdlib.h>
#include <string.h>

void idem_records_init(idem_records_t *r, size_t cap)
{
    memset(r, 0, sizeof(*r));
    r->cap = cap ? cap : 16;
    r->v = idem_xcalloc(r->cap, sizeof(*r->v));
}

void idem_records_term(idem_records_t *r)
{
    free(r->v);
    memset(r, 0, sizeof(*r));
}

/* Closes the holes, keeping the order. */
static void compact(idem_records_t *r)
{
    size_t keep = 0, mark = 0;
    for (size_t i = 0; i < r->end; i++) {
        if (i == r->mark)
            mark = keep;
        if (r->v[i])
            r->v[keep++] = r->v[i];
    }
    r->mark = r->mark >= r->end ? keep : mark;
    r->end = keep;
}

void idem_records_push(idem_records_t *r, void *rec)
{
    if (r->end == r->cap) {
        if (r->live < r->end) {
            compact(r);
        } else {
            r->cap *= 2;
            r->v = idem_xrealloc(r->v, r->cap * sizeof(*r->v));
        }
    }
    r->v[r->end++] = rec;
    r->live++;
}

size_t idem_records_remove_if(idem_records_t *r,
                              int (*drop)(void *rec, void *ctx), void *ctx)
{
    size_t removed = 0;
    for (size_t i = 0; i < r->end; i++) {
        if (r->v[i] && drop(r->v[i], ctx)) {
            r->v[i] = NULL;
            removed++;
        }
    }
    r->live -= removed;
    /* Trailing holes cost nothing to drop; the rest wait until they
     * outnumber the records. */
    while (r->end && !r->v[r->end - 1])
        r->end--;
    if (r->mark > r->end)
        r->mark = r->end;
    if (r->end - r->live > r->live)
        compact(r);
    return removed;
}
