/* apply: the one effect protocol the loop speaks, whatever handler runs.
 * The loop hands over due records and gets one result each (DONE,
 * DUPLICATE, BUSY, REJECT, RETRY, OUTAGE: handler.h), the way a handler
 * whose effect and dedup mark are one store script answers. An external
 * effect (forward, webhook, plugin) gets claim -> effect -> mark around it
 * here, with the lease life of lease.c, as hiredis's adapters wrap an
 * event loop: the loop never asks which kind of effect it runs, only what
 * the protocol offers (room, one record per identity at a time, whether
 * positions ride along). */
#ifndef IDEM_APPLY_H
#define IDEM_APPLY_H

#include <stddef.h>
#include <stdint.h>

#include "effect/handler.h"
#include "loop/due.h"
#include "loop/lease.h"
#include "loop/offsets.h"
#include "loop/partscope.h"

typedef struct {
    const idem_handler_ops_t *ops; /* the handler (borrowed, static) */
    void *h;                       /* its state (start -> stop) */
    int leased;               /* 1: claim -> effect -> mark here (an external
                                 effect); 0: the handler's own request marks */
    idem_lease_store_t lease; /* the marks of a leased effect */
    int64_t lease_ms;         /* dedup.lease.ms */
    idem_ordering_t ordering; /* what a pass may start (due.h): `ordering`
                                 for an external effect that does not keep
                                 order itself, else none */
    size_t inflight;          /* records with the handler, not collected */
    size_t cap;               /* scratch size */
    const idem_envelope_t **envs;  /* scratch: envelopes claimed or marked */
    size_t *done_at;               /* scratch: the results to mark */
    idem_store_result_t *res;      /* scratch: what the store said */
    idem_lease_verdict_t *verdict; /* scratch: what a claim said */
    idem_part_t **noparts;         /* scratch: all NULL (key, partition) */
    idem_partscope_t *ps;   /* dedup.scope=partition (in-Redis effect): the
                               partition path; NULL: the handler takes all */
    idem_store_t *ps_store; /* the store it writes positions to (borrowed) */
} idem_apply_t;

/* Starts ops's handler with ctx (borrowed: lives until stop). A leased
 * (external) handler gets ctx->store NULL and its marks go through `lease`
 * (borrowed seam) for dedup.lease.ms `lease_ms`; unless it keeps order
 * itself (ops->keeps_order) its records start by ctx->conf's `ordering`
 * (key without a conf). Returns 0, or -1 with errstr (the handler cannot
 * start). */
int idem_apply_start(idem_apply_t *a, const idem_handler_ops_t *ops,
                     const idem_handler_ctx_t *ctx, idem_lease_store_t lease,
                     int64_t lease_ms, char *errstr, size_t errstr_size);

/* How many records may be submitted now: the handler's room for an
 * external effect, none while a store handler's request is in flight
 * (one request at a time), else no limit (SIZE_MAX). */
size_t idem_apply_room(const idem_apply_t *a);

/* 1 when at most one record per identity may be with the handler at a
 * time (a lease is claimed per identity: the claim re-claims this
 * member's own lease), 0 when one request may hold an identity twice
 * (the store script orders them). */
int idem_apply_one_per_identity(const idem_apply_t *a);

/* Which records a pass may start (due.h): ordering=key, partition or
 * none for an external effect that does not keep order itself; none for
 * the others (forward writes a partition in order; a store handler's one
 * request applies its records in poll order). */
idem_ordering_t idem_apply_ordering(const idem_apply_t *a);

/* 1 when submit writes the positions it is given with the effects, in the
 * same request (stored once that request's results come without an
 * OUTAGE); 0: the loop saves them itself. */
int idem_apply_takes_positions(const idem_apply_t *a);

/* Submits recs[n] (due, in poll order; part[i] the partition of record i
 * or NULL) as `owner` (the lease owner, "lease:<member>:<epoch>"), with
 * pos[npos] when takes_positions. On return recs[0..*taken) are with the
 * handler (their results come through collect), now[0..*nnow) are results
 * known at once (room for n: a claim found a DUPLICATE, or a lease held
 * elsewhere: BUSY with retry_after_ms), and the other records were not
 * taken (an identity already claimed in this call, or behind such a
 * record in its partition: due again next pass). By key or partition a
 * pass holds one record per group, so a record leased elsewhere holds
 * back only its group (its BUSY result's retry time), not its partition.
 * Returns 0, or -1 with errstr (an outage: nothing taken; now[] still holds
 * what a claim said). */
int idem_apply_submit(idem_apply_t *a, const char *owner, idem_record_t **recs,
                      idem_part_t *const *part, size_t n,
                      const idem_store_pos_t *pos, size_t npos, size_t *taken,
                      idem_result_t *now, size_t *nnow, char *errstr,
                      size_t errstr_size);

/* Moves the results ready now into out[] (room for max >= inflight),
 * waiting at most timeout_ms for the first. A leased effect's DONE
 * records are marked done first; when the mark fails they come back as
 * OUTAGE (not marked: the lease expires and the effect is done again). A
 * lease taken over before the mark is logged (the effect may be done
 * twice) and counts as DONE. Returns how many it wrote. */
size_t idem_apply_collect(idem_apply_t *a, const char *owner,
                          idem_result_t *out, size_t max, int timeout_ms);

/* The handler's drain (handler.h); afterwards collect what finished. */
void idem_apply_drain(idem_apply_t *a, int64_t deadline_ms);

/* Records the handler itself still counts in flight (0 after a drain and
 * a collect, unless it broke the contract). */
size_t idem_apply_handler_inflight(const idem_apply_t *a);

/* Forgets what a drain abandoned: nothing is in flight any more. */
void idem_apply_forget(idem_apply_t *a);

/* The handler's fatal (handler.h): 1 with errstr, else 0. */
int idem_apply_fatal(idem_apply_t *a, char *errstr, size_t errstr_size);

/* Under dedup.scope=partition: the partition's table goes (revoked,
 * lost), or is loaded again before its next chunk (rewound, reset). No-ops
 * otherwise. */
void idem_apply_partition_drop(idem_apply_t *a, const char *topic,
                               int32_t partition);
void idem_apply_partition_reset(idem_apply_t *a, const char *topic,
                                int32_t partition);

/* Bytes of the partition tables (0 under dedup.scope=global). */
size_t idem_apply_table_bytes(const idem_apply_t *a);

/* Under dedup.scope=partition, the tables' bytes and marks into the
 * gauges (obs/metrics.h); a no-op otherwise. */
void idem_apply_table_gauges(const idem_apply_t *a, idem_metrics_t *m,
                             int64_t max_bytes);

/* Under dedup.scope=partition, how an input topic's partition count is
 * asked of Kafka (partscope.h); a no-op otherwise. */
void idem_apply_partition_counter(idem_apply_t *a, idem_partscope_count_fn fn,
                                  void *opaque);

/* Stops the handler and frees the scratch. Safe on a zeroed struct. */
void idem_apply_stop(idem_apply_t *a);

#endif
