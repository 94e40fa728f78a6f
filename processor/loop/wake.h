/* wake: one wait for whichever comes first: something on one of a few
 * librdkafka queues (the consumer's records and callbacks, the DLQ
 * producer's delivery reports) or one descriptor (the reply of the Redis
 * request in flight). The loop then neither sleeps past an event nor
 * spins. librdkafka writes a byte to a pipe when such a queue gets
 * something (rd_kafka_queue_io_event_enable); the wait polls that pipe
 * together with the descriptor. */
#ifndef IDEM_WAKE_H
#define IDEM_WAKE_H

#include <stddef.h>

#include <librdkafka/rdkafka.h>

#define IDEM_WAKE_QUEUES_MAX 4

typedef struct {
    rd_kafka_queue_t *q[IDEM_WAKE_QUEUES_MAX]; /* owned references */
    size_t cnt;
    int fd[2]; /* the pipe librdkafka writes to (fd[1]) */
} idem_wake_t;

/* What ended a wait: a bit mask, 0 when the timeout passed. */
#define IDEM_WAKE_FD 1 /* the descriptor is readable (or closed) */
/* Queue i (in the order of idem_wake_add) got something: 2 << i. */

/* Opens the pipe. Returns 0, or -1 with errstr (w is then terminated). */
int idem_wake_init(idem_wake_t *w, char *errstr, size_t errstr_size);

/* Takes ownership of q (from rd_kafka_queue_get_consumer or _get_main;
 * the queue is destroyed by idem_wake_term, which must come before
 * rd_kafka_destroy of its client). Returns its bit (2 << i), or 0 when
 * IDEM_WAKE_QUEUES_MAX queues are hooked already or q is NULL (q is then
 * destroyed). */
int idem_wake_add(idem_wake_t *w, rd_kafka_queue_t *q);

/* Unhooks and releases the queues and closes the pipe. A w that was
 * terminated already, or whose fds are -1, is a no-op. */
void idem_wake_term(idem_wake_t *w);

/* Waits up to timeout_ms (>= 0) until fd is readable or a queue gets
 * something; fd < 0: only the queues. Returns the bits of what happened
 * (0: the timeout passed, or a signal). librdkafka writes once per
 * arrival after its queue was last served (polled), so serve the queues
 * (rd_kafka_consumer_poll with timeout 0 until NULL, rd_kafka_poll)
 * before waiting, or what arrived meanwhile may not wake the wait. A
 * queue's bit may be set although it was served since: poll it, find
 * nothing, wait again. */
int idem_wake_wait(idem_wake_t *w, int fd, int timeout_ms);

#endif
