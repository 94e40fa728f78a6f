/* gpos: the positions of the global path in Redis Cluster mode (docs/
 * design.md, "Redis Cluster mode", "The global path's positions"). A
 * partition's records that take the global path (no key, dlq replays,
 * retry copies) are applied on a bucket's slot, often on another primary
 * than the partition's position: that primary may lose a tail (a failover
 * to a replica that missed writes) that the position's primary kept. Each
 * bucket call writes, per partition, the highest offset it applied (its
 * "last", kept as a maximum) and the lowest ("at"); the partition's
 * position hash records, per bucket it used, the last offset the bucket
 * acknowledged. This module is the judgement of one such pair and the
 * names of the fields; no Redis here (tests/unit/test_gpos.c). */
#ifndef IDEM_GPOS_H
#define IDEM_GPOS_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    IDEM_GPOS_KEPT = 0, /* the bucket holds what the partition recorded */
    IDEM_GPOS_BEHIND,   /* the bucket lost records of the partition: read
                           again from the rewind offset */
    IDEM_GPOS_GONE,     /* the bucket holds nothing of the partition while
                           the partition recorded it: how far back is not
                           known (the rules of a lost position apply) */
} idem_gpos_verdict_t;

/* Judges one bucket for one partition: `recorded`, the last offset the
 * partition's position hash says the bucket acknowledged; `last` and `at`,
 * the bucket's own fields (-1: absent). On BEHIND, *rewind gets the
 * offset to read again from: the bucket's `at` (the lowest record of the
 * last call it kept; every record of the partition below it that went
 * through the bucket was written before that call), never past `pos`, the
 * partition's position (-1: none). */
idem_gpos_verdict_t idem_gpos_judge(int64_t recorded, int64_t last, int64_t at,
                                    int64_t pos, int64_t *rewind);

/* How often a partition's finished prefix is written to the buckets it
 * used as their `at` (the touch, idem_gpos_touch_due), in ms. */
#define IDEM_GPOS_TOUCH_MS 10000

/* Whether to touch one bucket of a partition now: write `finished` (the
 * partition's finished prefix: every record below it is finished) as the
 * bucket's `at`. `touched` is the last value this member wrote there (-1:
 * none), `touched_ms` when (monotonic ms, -1: never), `acked` the last
 * offset the member saw the bucket acknowledge for the partition (-1: the
 * partition never used the bucket: nothing to touch). Due when the prefix
 * moved past what was written and, unless `force` (revoke, shutdown), a
 * period passed since the last touch. 1 or 0. */
int idem_gpos_touch_due(int64_t finished, int64_t touched, int64_t touched_ms,
                        int64_t acked, int64_t now_ms, int force);

/* Whether a rewind to a bucket's `at` written at `at_ms` (wall clock ms,
 * -1: not known) reaches back further than the dedup window
 * (ttl_seconds) at now_ms: records read again from there may have marks
 * that expired, so they would be applied again. 1 or 0. */
int idem_gpos_stale(int64_t at_ms, int64_t now_ms, int64_t ttl_seconds);

/* "kept", "behind", "gone". */
const char *idem_gpos_verdict2str(idem_gpos_verdict_t v);

/* The bucket of a position-hash field "<topic>:<partition>:g<NN>" whose
 * position field is base[blen] ("<topic>:<partition>"), or -1 when the
 * field is another one. */
int idem_gpos_record_bucket(const char *field, size_t len, const char *base,
                            size_t blen);

#endif
