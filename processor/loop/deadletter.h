/* deadletter: the life of one record's dead-letter (or retry-topic)
 * write: its ticket, the delivery report, and what the loop does once the
 * report came (tests/unit/test_deadletter.c). No producer here: the loop
 * sends (kafka/dlq.h) and asks. */
#ifndef IDEM_DEADLETTER_H
#define IDEM_DEADLETTER_H

#include <librdkafka/rdkafka.h>

/* The fate of one asynchronous write, owned by whoever is last: the
 * record frees it once it read the result; a record dropped before the
 * report marks it orphan and the report frees it. */
typedef struct {
    int state; /* 0 in flight, 1 acknowledged, -1 failed */
    rd_kafka_resp_err_t err;
    int orphan;
} ticket_t;

/* A ticket in flight; the caller frees it with free() once reported, or
 * lets it go with idem_deadletter_release. */
ticket_t *idem_deadletter_ticket_new(void);

/* The delivery report (idem_dlq_report_cb's signature, opaque = the
 * ticket): fires in idem_dlq_poll or idem_dlq_flush on the processing
 * thread. Frees an orphaned ticket. */
void idem_deadletter_report(void *opaque, rd_kafka_resp_err_t err);

/* The record lets its ticket go: freed now when reported, else orphaned
 * (the report frees it). */
void idem_deadletter_release(ticket_t *t);

/* What a reported write means for its record. */
typedef enum {
    IDEM_DL_PENDING = 0,   /* no report yet */
    IDEM_DL_DEAD,          /* the dead letter is acknowledged: outcome dlq */
    IDEM_DL_RETRY_SENT,    /* the retry-topic copy is acknowledged: done
                              here, the copy gets the outcome */
    IDEM_DL_RETRY_REFUSED, /* the retry topic never takes it (too large):
                              dead-lettered as max-retries instead */
    IDEM_DL_DROP_VALUE,    /* the DLQ never takes the value: written again
                              without it */
    IDEM_DL_FAILED,        /* the write failed (infrastructure): written
                              again later, never committed past */
} idem_deadletter_step_t;

/* The step for a record with ticket t, bound for the DLQ (`poison`) or for
 * a retry tier (`to_tier` > 0, not poison). */
idem_deadletter_step_t idem_deadletter_after(const ticket_t *t, int poison,
                                             int to_tier);

const char *idem_deadletter_step2str(idem_deadletter_step_t s);

#endif
