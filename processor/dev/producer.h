/* producer: an idempotent librdkafka producer (acks=all,
 * enable.idempotence=true) that counts delivery reports. */
#ifndef IDEM_PRODUCER_H
#define IDEM_PRODUCER_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct idem_producer_s idem_producer_t;

/* Delivery accounting; every enqueued message ends as acked or failed. */
typedef struct {
    int64_t enqueued;      /* accepted by librdkafka */
    int64_t acked;         /* delivery report without error */
    int64_t failed;        /* delivery report with an error, or refused */
    char first_error[256]; /* the first failure's reason ("" = none) */
} idem_producer_stats_t;

/* A producer for `topic` on `bootstrap`. `props` are "name=value" librdkafka
 * properties (borrowed; applied after our defaults, so they win, except
 * that idempotence and acks=all cannot be turned off: `produce` refuses
 * -X for them). max_value_bytes is
 * the largest value the caller will send: message.max.bytes is raised to
 * fit it unless props set it. When dump is not NULL the effective librdkafka
 * configuration is printed there, secrets masked. Returns NULL with errstr
 * (naming the property) on a bad property. librdkafka logs at warning and
 * above go to idem_log, served by idem_producer_poll(). */
idem_producer_t *idem_producer_new(const char *bootstrap, const char *topic,
                                   char *const *props, size_t prop_cnt,
                                   size_t max_value_bytes, FILE *dump,
                                   char *errstr, size_t errstr_size);

/* Waits up to timeout_ms for any broker to answer a metadata request (no
 * topic is named, so none is auto-created). Returns 0, or -1 with
 * librdkafka's reason in errstr. */
int idem_producer_wait_broker(idem_producer_t *p, int timeout_ms, char *errstr,
                              size_t errstr_size);

/* Enqueues one message (key, value and header values are copied; key and
 * headers may be NULL). When librdkafka's queue is full it serves delivery
 * reports and retries, forever: the queue drains as messages are delivered
 * or time out (message.timeout.ms). Returns 0, or -1 when librdkafka refused
 * the message for good (counted as failed; errstr says why). */
int idem_producer_send(idem_producer_t *p, const void *key, size_t key_len,
                       const void *value, size_t value_len,
                       const char *hdr_message_id,
                       const char *hdr_idempotency_key, char *errstr,
                       size_t errstr_size);

/* As idem_producer_send, but librdkafka reads the value in place instead
 * of copying it: value (borrowed) must stay valid and unchanged until
 * idem_producer_flush() returns (a file mapped for the whole run). One
 * copy and a smaller allocation a message less. */
int idem_producer_send_kept(idem_producer_t *p, const void *key, size_t key_len,
                            const void *value, size_t value_len,
                            const char *hdr_message_id,
                            const char *hdr_idempotency_key, char *errstr,
                            size_t errstr_size);

/* From now on, takes the time of each send and of its delivery report for
 * idem_producer_ack_quantile_ms(). Off by default: two clock reads a
 * message are a noticeable share of sending at full speed. */
void idem_producer_ack_latency_on(idem_producer_t *p);

/* Serves delivery reports and logs for up to timeout_ms. */
void idem_producer_poll(idem_producer_t *p, int timeout_ms);

/* Waits until every enqueued message has a delivery report. When *abort
 * becomes set (may be NULL) the messages still queued are purged and fail
 * with "purged". Returns the number of messages still undelivered (0). */
int idem_producer_flush(idem_producer_t *p, volatile int *abort);

/* Copies the delivery accounting into *stats. */
void idem_producer_stats(const idem_producer_t *p,
                         idem_producer_stats_t *stats);

/* Acknowledgement latency: of the messages acknowledged so far (sent after
 * idem_producer_ack_latency_on()), the
 * smallest whole millisecond L such that a fraction q (0..1] of them took
 * at most L ms from being enqueued (their CreateTime) to their delivery
 * report being served, by this host's wall clock.
 * That span holds linger.ms, the produce request and the broker's append
 * and acknowledgement. Values past IDEM_PRODUCER_ACK_MS_MAX count as that
 * bound. Returns -1 when nothing was acknowledged. */
#define IDEM_PRODUCER_ACK_MS_MAX 10000
int64_t idem_producer_ack_quantile_ms(const idem_producer_t *p, double q);

/* Messages enqueued whose delivery report has not been served yet. */
int64_t idem_producer_inflight(const idem_producer_t *p);

/* Flushes nothing: destroys the handle (undelivered messages are lost).
 * NULL is a no-op. */
void idem_producer_destroy(idem_producer_t *p);

#endif
