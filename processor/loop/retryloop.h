/* retryloop: the loop's side of retry topics (retry.topics, retrytopic.h):
 * when a record arriving from a retry topic is due (its partition is held
 * meanwhile: nothing more of it is fetched), when a held partition may go
 * on, and the copy of a record failing retriably for the next tier. No
 * consumer here: the loop pauses and resumes what this says
 * (tests/unit/test_retryloop.c). */
#ifndef IDEM_RETRYLOOP_H
#define IDEM_RETRYLOOP_H

#include <stddef.h>
#include <stdint.h>

#include "kafka/dlq.h"
#include "kafka/retrytopic.h"
#include "loop/offsets.h"
#include "loop/rec.h"
#include "obs/metrics.h"

/* The longest Retry-After honoured (the webhook's own cap): a plugin's
 * far-off retry_after_ms must not park a record for days. */
#define IDEM_RETRY_AFTER_MAX_MS 300000

/* A record r just polled from retry partition pt (tier pt->retry_tier),
 * with its headers h (borrowed, may be NULL): sets its tier and prior
 * attempts, and when retry.due.at (else its tier's delay after its
 * timestamp) is ahead of wall_ms, its retry_at_ms (now_ms clock, capped at
 * the tier's delay plus IDEM_RETRY_AFTER_MAX_MS) and pt->hold_until_ms.
 * Returns 1 when the record waits and pt was not held before: the caller
 * pauses pt (unless all input is paused); else 0. */
int idem_retryloop_arrived(const idem_retrytopics_t *rt, rec_t *r,
                           idem_part_t *pt, const rd_kafka_headers_t *h,
                           int64_t now_ms, int64_t wall_ms);

/* Whether held partition pt is due at `now` (its hold is cleared then):
 * the caller resumes it (unless all input is paused). */
int idem_retryloop_release(idem_part_t *pt, int64_t now);

/* How many partitions of offs are held (the retry_waiting gauge). */
size_t idem_retryloop_held(const idem_offsets_t *offs);

/* Queues the copy of r for its next tier (r->to_tier) on dlq (borrowed)
 * with ticket t, to the partition number the record first came from (not
 * where its key hashes). Its headers keep where the record first came
 * from.
 * Returns 0, or -1 when the producer refused to queue it (infrastructure:
 * errstr). */
int idem_retryloop_send(const idem_retrytopics_t *rt, idem_dlq_t *dlq, rec_t *r,
                        ticket_t *t, char *errstr, size_t errstr_size);

/* The copy of r is acknowledged in its retry topic: r is finished here
 * (no outcome: the copy gets one when it is processed); counted in m
 * (borrowed). */
void idem_retryloop_sent(rec_t *r, idem_metrics_t *m);

#endif
