/* rec: one record in hand, as the loop's parts see it (the records in
 * hand are an index of these, records.h), and the fate of its dead-letter
 * or retry-topic write. */
#ifndef IDEM_REC_H
#define IDEM_REC_H

#include <stdint.h>

#include <librdkafka/rdkafka.h>

#include "effect/handler.h"
#include "input/envelope.h"
#include "loop/deadletter.h"

typedef enum { REC_PENDING = 0, REC_DONE } rec_state_t;

/* One consumed record and what we know about it. Allocated one by one:
 * its address is stable while it is in hand (the handler keeps pointers
 * to view). */
typedef struct rec_s {
    idem_record_t view;      /* what the handler sees; view.loop = this */
    rd_kafka_message_t *msg; /* owned; destroyed when the record leaves */
    int64_t polled_us;
    rec_state_t state;
    int parsed;
    int poison; /* 1: goes to the DLQ with `reason` */
    idem_reason_t reason;
    int attempts;             /* handler attempts (retry.max.attempts) */
    int sent;                 /* with the handler, result not collected yet */
    int store_sent;           /* a request that may have applied it failed
                                 (a failed submit, an OUTAGE result): its done
                                 mark with its own message id then means
                                 processed, not a duplicate */
    int64_t retry_at_ms;      /* not before this (busy lease, backoff) */
    ticket_t *dlq;            /* DLQ (or retry topic) write in flight or
                                 just reported */
    int tier;                 /* 0: from an input topic; k: from retry tier k */
    int prior_attempts;       /* failed attempts before this copy
                                 (retry.attempt) */
    int to_tier;              /* > 0: goes to that retry tier (retry.topics) */
    int64_t retry_after_ms;   /* the handler's least delay for that copy */
    int dlq_drop_value;       /* the DLQ refused the value: send it without */
    struct rec_s *next_spare; /* in the pipeline's spares (released) */
    /* The large parts last: a reused record is cleared up to here (the
     * envelope is cleared when it is read, the error when it is set). */
    char error[IDEM_RESULT_DETAIL_MAX];
    idem_envelope_t env;
} rec_t;

#endif
