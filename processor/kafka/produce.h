/* produce: the one way idemproc's writers hand a message to librdkafka
 * (produce, the outbox relay, forward's output, the DLQ and retry copies,
 * dlq replay): rd_kafka_producev, and
 * when librdkafka's queue is full, serving delivery reports until there is
 * room. The envelope's two headers are built here too. */
#ifndef IDEM_KAFKA_PRODUCE_H
#define IDEM_KAFKA_PRODUCE_H

#include <stddef.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

/* One message. Exactly one of rkt and topic is set. */
typedef struct {
    rd_kafka_topic_t *rkt; /* a topic handle the caller keeps */
    const char *topic;     /* or a topic by name */
    int partitioned;       /* 1: to `partition`; 0: librdkafka's partitioner */
    int32_t partition;
    int msgflags;    /* RD_KAFKA_MSG_F_COPY, RD_KAFKA_MSG_F_FREE, or 0: the
                      * value is read in place until its delivery report */
    const void *key; /* NULL = no key */
    size_t key_len;
    void *value; /* NULL = no value */
    size_t value_len;
    rd_kafka_headers_t *headers; /* NULL = none */
    void *opaque;                /* the delivery report's msg->_private */
} idem_kafka_msg_t;

/* Enqueues m on rk. While librdkafka answers that its queue is full,
 * serves delivery reports (rd_kafka_poll for up to poll_ms, on the
 * caller's thread, so the caller's delivery-report callback runs) and
 * tries again: the queue drains as messages are delivered or time out
 * (message.timeout.ms), so this returns. Returns 0 (the headers, and the
 * value with RD_KAFKA_MSG_F_FREE, belong to librdkafka now), or
 * librdkafka's refusal (they are still the caller's). */
rd_kafka_resp_err_t idem_kafka_produce(rd_kafka_t *rk,
                                       const idem_kafka_msg_t *m, int poll_ms);

/* The envelope's headers (DESIGN: a consumer dedups without parsing the
 * value): message_id and idempotency_key, each only when not NULL.
 * Returns a new list (librdkafka's: 4 allocations for both, the least its
 * API allows), or NULL when both are NULL. */
rd_kafka_headers_t *idem_kafka_envelope_headers(const char *message_id,
                                                const char *idempotency_key);

#endif
