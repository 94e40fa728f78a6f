/* lease: the life of an external effect's dedup mark (claim a lease, the
 * effect, turn the lease into the done mark), against the store through a
 * seam of our own: the loop plugs in Redis (idem_lease_store_redis), the
 * unit tests a fake (tests/unit/test_lease.c). No handler here: the loop
 * hands the claimed records to it and reports what finished. */
#ifndef IDEM_LEASE_H
#define IDEM_LEASE_H

#include <stddef.h>

#include "input/envelope.h"
#include "loop/offsets.h"
#include "redis/store.h"

/* The store's side of a lease. Both calls fill results[n] (idem_store.h's
 * meanings) and return 0, or -1 with errstr when the store did not answer
 * (an outage: nothing may be assumed about the records). */
typedef struct {
    int (*claim)(void *ctx, const char *owner,
                 const idem_envelope_t *const *env, size_t n,
                 idem_store_result_t *results, char *errstr,
                 size_t errstr_size);
    int (*mark_done)(void *ctx, const char *owner,
                     const idem_envelope_t *const *env, size_t n,
                     idem_store_result_t *results, char *errstr,
                     size_t errstr_size);
    void *ctx; /* borrowed */
} idem_lease_store_t;

/* The seam over a real store (borrowed; it outlives the seam). */
idem_lease_store_t idem_lease_store_redis(idem_store_t *s);

/* What the loop does with one record after a claim. */
typedef enum {
    IDEM_LEASE_GO = 0,    /* leased to us: hand it to the handler */
    IDEM_LEASE_DUPLICATE, /* done before: results[i].prior_mid says by whom */
    IDEM_LEASE_AGAIN,     /* an earlier record of this call has the same
                             identity: due again once that one finished */
    IDEM_LEASE_LEASED,    /* another owner holds the lease: wait (it expires
                             when that owner died) */
    IDEM_LEASE_BEHIND,    /* behind an AGAIN or LEASED record of its
                             partition: not now, to keep the partition's
                             order (our claim is taken again next time) */
} idem_lease_verdict_t;

const char *idem_lease_verdict2str(idem_lease_verdict_t v);

/* Claims env[n] (due records in poll order; part[i] the partition of
 * record i, or NULL when not held) for `owner`, and judges each into
 * verdict[n]. A partition with an AGAIN or LEASED record gets waiting = 1
 * and its later records are BEHIND (their store results are not read).
 * Clears `waiting` of the partitions in part[] first. Returns 0, or -1
 * with errstr (outage: no verdict). */
int idem_lease_claim(const idem_lease_store_t *st, const char *owner,
                     const idem_envelope_t *const *env,
                     idem_part_t *const *part, size_t n,
                     idem_store_result_t *results,
                     idem_lease_verdict_t *verdict, char *errstr,
                     size_t errstr_size);

/* Turns the leases of env[n] (their effects done) into done marks.
 * results[i].mark is IDEM_MARK_LOST when another owner took the lease over
 * before (the effect may then be done twice: logged by the caller), else
 * IDEM_MARK_NEW. Returns 0, or -1 with errstr: nothing marked, the leases
 * expire and the effects are done again (at least once, nothing lost). */
int idem_lease_mark(const idem_lease_store_t *st, const char *owner,
                    const idem_envelope_t *const *env, size_t n,
                    idem_store_result_t *results, char *errstr,
                    size_t errstr_size);

#endif
