/* due: which records in hand may go to the handler now. No broker, no
 * Redis, no handler: the records (rec.h) and their partitions (offsets.h)
 * only (tests/unit/test_due.c). */
#ifndef IDEM_DUE_H
#define IDEM_DUE_H

#include <stddef.h>
#include <stdint.h>

#include "loop/offsets.h"
#include "loop/rec.h"
#include "loop/records.h"

/* Collects into out[] (room for recs->live) the records that are parsed
 * well, unfinished, not with the handler, not bound for a retry tier, and
 * due at `now` (idem_now_ms), in poll order. A record waiting for its
 * retry time holds back the later records of its partition (the
 * partition's `waiting` is set), so effects keep the partition's order;
 * with `one_per_identity` (an external effect: the claim script re-claims
 * this member's own leases) so does a record whose identity is with the
 * handler or picked earlier. Returns how many. */
size_t idem_due_select(const idem_records_t *recs, idem_offsets_t *offs,
                       int one_per_identity, int64_t now, rec_t **out);

#endif
