/* dlq: the dead-letter producer: poison records with their original key,
 * bytes and headers plus dlq.* headers that say why (DESIGN.md section 7),
 * through an idempotent producer (acks=all). */
#ifndef IDEM_DLQ_H
#define IDEM_DLQ_H

#include <stddef.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

#include "conf.h"
#include "outcome.h"

typedef struct idem_dlq_s idem_dlq_t;

/* Delivery outcome of one DLQ write, stored where `*state` points (the
 * caller's record): 1 acknowledged, -1 failed; untouched until known. */
typedef struct {
    volatile int *state;
} idem_dlq_ticket_t;

/* A new DLQ producer for conf (borrowed). Returns NULL with errstr. */
idem_dlq_t *idem_dlq_new(const idem_conf_t *conf, char *errstr,
                         size_t errstr_size);
void idem_dlq_destroy(idem_dlq_t *d); /* flushes up to 5 s; NULL no-op */

/* Queues the dead-letter copy of `msg` (borrowed) with reason, error text
 * and attempts. *state (borrowed, must live until idem_dlq_flush returns)
 * becomes 1 when the broker acknowledged the write, -1 when it failed.
 * Returns 0, or -1 when it could not even be queued (errstr; *state set to
 * -1). */
int idem_dlq_send(idem_dlq_t *d, const rd_kafka_message_t *msg,
                  idem_reason_t reason, const char *error, int attempts,
                  volatile int *state, char *errstr, size_t errstr_size);

/* Waits up to timeout_ms for every queued write's delivery report.
 * Returns the number still outstanding (0 = all reported). */
int idem_dlq_flush(idem_dlq_t *d, int timeout_ms);

/* The producer handle (for polling from the main loop). Borrowed. */
rd_kafka_t *idem_dlq_handle(idem_dlq_t *d);

#endif
