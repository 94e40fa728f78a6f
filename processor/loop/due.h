/* due: which records in hand may go to the handler now, by the ordering
 * an external effect keeps (ordering=key|partition|none). No broker, no
 * Redis, no handler: the records (rec.h) and their partitions (offsets.h)
 * only (tests/unit/test_due.c). */
#ifndef IDEM_DUE_H
#define IDEM_DUE_H

#include <stddef.h>
#include <stdint.h>

#include "loop/offsets.h"
#include "loop/rec.h"
#include "loop/records.h"

/* The values of the `ordering` key, in its enum's order. */
typedef enum {
    IDEM_ORDERING_KEY = 0,   /* a record starts after the previous record of
                                its Kafka key (in its partition) finished;
                                records without a key: one group per
                                partition */
    IDEM_ORDERING_PARTITION, /* one record of a partition at a time */
    IDEM_ORDERING_NONE,      /* as due, in poll order; a record waiting for
                                its retry time holds back its partition */
} idem_ordering_t;

const char *idem_ordering2str(idem_ordering_t o);

/* One group (a key, or a partition) met in a pass: `gen` marks the pass. */
typedef struct {
    const rec_t *first; /* the group's first record met: its name */
    uint32_t gen;
    uint32_t count; /* unfinished records met (census) */
} idem_due_group_t;

/* The scheduler's state, kept across passes so a pass allocates nothing
 * (embedded: _init/_term). */
typedef struct {
    idem_ordering_t ordering;
    int one_per_identity; /* an external effect: the claim script re-claims
                             this member's own leases, so one record per
                             identity may be with the handler at a time */
    rec_t **ids;          /* the records with the handler (and those picked
                             in the pass under way), by identity: open
                             addressing, linear probing */
    size_t ids_size, ids_cnt;
    idem_due_group_t *grp; /* the groups of a pass, by key or partition */
    size_t grp_size;
    uint32_t gen;
    size_t depth_hwm; /* census: most unfinished records of one group */
} idem_due_t;

void idem_due_init(idem_due_t *d, idem_ordering_t ordering,
                   int one_per_identity);
void idem_due_term(idem_due_t *d);

/* r went to the handler / its result came back / nothing is with the
 * handler any more (a drain abandoned it all). Borrowed: r stays the
 * loop's; it must come back (or be forgotten) before it is freed. */
void idem_due_sent(idem_due_t *d, rec_t *r);
void idem_due_back(idem_due_t *d, rec_t *r);
void idem_due_forget(idem_due_t *d);

/* Collects into out[] (room for `max`) the first `max` records, in poll
 * order, that may go to the handler at `now` (idem_now_ms): parsed well,
 * unfinished, not with the handler, not bound for a retry tier, due, and
 *   key:       the first unfinished record of its group (key, partition),
 *              the group's earlier ones all finished (done, duplicate or
 *              dead-lettered; a record sent to a retry topic no longer
 *              counts); a record with the handler, waiting for its retry
 *              time or for its dead letter holds back its group only;
 *   partition: the same with the partition as the group;
 *   none:      a record waiting for its retry time holds back the later
 *              records of its partition (its `waiting` is set).
 * With one_per_identity a record whose identity is with the handler or
 * picked earlier in the pass is not picked (and, by key or partition,
 * holds back its group). Returns how many. */
size_t idem_due_select(idem_due_t *d, const idem_records_t *recs,
                       idem_offsets_t *offs, int64_t now, size_t max,
                       rec_t **out);

/* Whether each partition's fetch should pause behind busy keys (by key
 * or partition; none: never), into its key_hold: a walk over every record
 * in hand after a pass. A partition holds when at least `bound` of its
 * unfinished records wait, not with the handler, and none of them may
 * start (each is behind an unfinished record of its group, or is a head
 * that waits: sent, poison, its retry time, its identity with the
 * handler); it stops holding as soon as one may start or fewer than
 * `bound` wait. Returns how many partitions hold. */
size_t idem_due_key_holds(idem_due_t *d, const idem_records_t *recs,
                          idem_offsets_t *offs, int64_t now, size_t bound);

/* A walk over every record in hand, grouped by the ordering's group (by
 * key for none): *keys_waiting gets the groups holding more than one
 * unfinished record (the later ones wait, by key or partition), and the
 * high-water mark of one group's unfinished records is raised (returned
 * in *depth_hwm). */
void idem_due_census(idem_due_t *d, const idem_records_t *recs,
                     size_t *keys_waiting, size_t *depth_hwm);

#endif
