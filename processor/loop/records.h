/* records: the records in hand, in the order they were polled. An index of
 * pointers (the records themselves never move: a handler may hold them);
 * a removed record leaves a hole, and holes are closed only when they
 * outnumber the records, not on every turn (tests/unit/test_records.c). */
#ifndef IDEM_RECORDS_H
#define IDEM_RECORDS_H

#include <stddef.h>

typedef struct {
    void **v;    /* slots [0, end): a record or NULL (a hole) */
    size_t end;  /* slots in use */
    size_t live; /* records (end minus holes) */
    size_t cap;
    size_t mark; /* a slot the caller remembers (idem_records_set_mark):
                    moved with its records when holes are closed */
} idem_records_t;

/* An empty index with room for `cap` records (it grows when needed). */
void idem_records_init(idem_records_t *r, size_t cap);

/* Frees the index, not the records. */
void idem_records_term(idem_records_t *r);

/* Appends a record (borrowed: the caller owns it). */
void idem_records_push(idem_records_t *r, void *rec);

/* The first record at slot *i or later, with *i moved past it; NULL at
 * the end. Iterate: `for (size_t i = 0; (x = idem_records_next(r, &i));)`.
 * Records may be removed (idem_records_remove_if) only between loops.
 * Inline: the loop walks every record in hand several times a turn. */
static inline void *idem_records_next(const idem_records_t *r, size_t *i)
{
    while (*i < r->end) {
        void *rec = r->v[(*i)++];
        if (rec)
            return rec;
    }
    return NULL;
}

/* The slot remembered by idem_records_set_mark (0 at first): every
 * record pushed since is at it or after it, also after holes were
 * closed. */
static inline size_t idem_records_mark(const idem_records_t *r)
{
    return r->mark;
}

/* Remembers the end: the next record pushed is at the mark. */
static inline void idem_records_set_mark(idem_records_t *r)
{
    r->mark = r->end;
}

/* Removes every record for which drop(rec, ctx) returns 1 (drop may free
 * it); the others keep their order. Returns how many were removed. */
size_t idem_records_remove_if(idem_records_t *r,
                              int (*drop)(void *rec, void *ctx), void *ctx);

#endif
