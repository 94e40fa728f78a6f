/* dlq: the dead-letter producer: poison records with their original key,
 * bytes and headers plus dlq.* headers that say why (README.md, "Dead
 * letters"), through an idempotent producer (acks=all). */
#ifndef IDEM_DLQ_H
#define IDEM_DLQ_H

#include <stddef.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

#include "conf/conf.h"
#include "base/outcome.h"
#include "kafka/retrytopic.h"

typedef struct idem_dlq_s idem_dlq_t;

/* Called once per DLQ write with its delivery result (err 0 = the broker
 * acknowledged it) and the opaque given to idem_dlq_send. Fires inside
 * rd_kafka_poll/flush of the DLQ producer (idem_dlq_poll, idem_dlq_flush,
 * idem_dlq_destroy), on the calling thread. */
typedef void idem_dlq_report_cb(void *opaque, rd_kafka_resp_err_t err);

/* A new DLQ producer for conf (borrowed). Returns NULL with errstr. */
idem_dlq_t *idem_dlq_new(const idem_conf_t *conf, idem_dlq_report_cb *report,
                         char *errstr, size_t errstr_size);
/* Purges what is not acknowledged (its reports still fire) and destroys
 * the producer. NULL is a no-op. */
void idem_dlq_destroy(idem_dlq_t *d);

/* Queues the dead-letter copy of `msg` (borrowed) with reason, error text
 * and attempts; its dlq.original.* say where `from` (borrowed) says when
 * not NULL (a record out of a retry topic: the first input record), else
 * where msg came from. The retry.* headers (retrytopic.h) are not copied;
 * `report` gets `opaque` back with the result. A value the producer or the
 * broker can never accept (too large) would block the partition forever, so
 * with drop_value (or when the producer refuses the size at once) the copy
 * carries no value and a header dlq.value.dropped=<original length>; the
 * original stays in its topic at dlq.original.offset. dlq.headers.format
 * chooses the dlq.* headers, the Spring ones (idem_dlq_spring_headers) or both;
 * dlq.value.dropped is always written. Returns 0, or -1 when it could not even
 * be queued (errstr; no report follows). */
int idem_dlq_send(idem_dlq_t *d, const rd_kafka_message_t *msg,
                  const idem_retry_info_t *from, idem_reason_t reason,
                  const char *error, int attempts, int drop_value, void *opaque,
                  char *errstr, size_t errstr_size);

/* Queues a copy of `msg` (borrowed: its key and value) to `partition` of
 * `topic` (RD_KAFKA_PARTITION_UA: where its key hashes) with headers `h`,
 * which it takes over (also on failure), through the same idempotent
 * producer: a retry topic's copy (retrytopic.h). `report` gets `opaque`
 * back with the result. A partition the producer already knows the topic
 * lacks is replaced by RD_KAFKA_PARTITION_UA (logged).
 * Returns 0, or -1 when it could not be queued (errstr; no report
 * follows). */
int idem_dlq_send_to(idem_dlq_t *d, const char *topic, int32_t partition,
                     const rd_kafka_message_t *msg, rd_kafka_headers_t *h,
                     void *opaque, char *errstr, size_t errstr_size);

/* What kafka_dlt-exception-fqcn says: this prefix and the dlq.reason. */
#define IDEM_DLQ_SPRING_FQCN_PREFIX "idemproc."

/* Adds to h (borrowed) the headers Spring for Apache Kafka's
 * DeadLetterPublishingRecoverer writes (KafkaHeaders.DLT_*), with its
 * encodings: topic, timestamp type, group, exception class and message as
 * UTF-8; partition as a 4-byte and offset and timestamp as 8-byte
 * big-endian integers (Java's ByteBuffer.putInt/putLong). The exception
 * class is IDEM_DLQ_SPRING_FQCN_PREFIX + reason; the stack trace is the
 * one line "<class>: <message>". */
void idem_dlq_spring_headers(rd_kafka_headers_t *h, const char *topic,
                             int32_t partition, int64_t offset,
                             int64_t timestamp,
                             rd_kafka_timestamp_type_t tstype,
                             const char *group, const char *reason,
                             const char *error);
/* Where a dead letter came from (all borrowed). */
typedef struct {
    const char *topic;
    int32_t partition;
    int64_t offset;
    int64_t timestamp; /* the original record's, ms since the epoch */
    const char *group;
    int64_t failed_at_ms;             /* wall clock of the failure */
    rd_kafka_timestamp_type_t tstype; /* for kafka_dlt-* headers */
    int format; /* idem_dlq_headers_format_t; 0: dlq.* only */
} idem_dlq_origin_t;

/* 1 when `name` is a header idem_dlq_headers_new writes itself (and so
 * replaces when the record already carries it). */
int idem_dlq_header_is_own(const char *name);

/* The dead letter's headers: a copy of `orig` (borrowed, may be NULL)
 * without the headers this function writes (idem_dlq_header_is_own),
 * followed by the dlq.* and/or kafka_dlt-* headers of o->format
 * (README.md, "Dead letters"). `error` may
 * hold any bytes up to its NUL. Returns new headers the caller destroys or
 * hands to the producer. */
rd_kafka_headers_t *idem_dlq_headers_new(const rd_kafka_headers_t *orig,
                                         const idem_dlq_origin_t *o,
                                         idem_reason_t reason,
                                         const char *error, int attempts);

/* Returns 1 with the producer's fatal error in buf, 0 while healthy.
 * After one, no write can be trusted: the process must stop. */
int idem_dlq_fatal(idem_dlq_t *d, char *buf, size_t size);

/* The producer's main queue, where its delivery reports arrive (a new
 * reference: the caller destroys it with rd_kafka_queue_destroy, before
 * idem_dlq_destroy). For waiting on it together with other things
 * (wake.h). */
rd_kafka_queue_t *idem_dlq_queue(idem_dlq_t *d);

/* Serves delivery reports without waiting. */
void idem_dlq_poll(idem_dlq_t *d);

/* Serves delivery reports, waiting up to timeout_ms for the first. */
void idem_dlq_wait(idem_dlq_t *d, int timeout_ms);

/* Waits up to timeout_ms for every queued write's delivery report.
 * Returns the number still outstanding (0 = all reported). */
int idem_dlq_flush(idem_dlq_t *d, int timeout_ms);

#endif
