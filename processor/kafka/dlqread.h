/* dlqread: reads the DLQ topic once, from each partition's earliest stored
 * offset (or a checkpoint) to its end as of the start, for `idemproc dlq`.
 * Without a group it never joins or commits anything, so it cannot move
 * the processor's offsets. */
#ifndef IDEM_DLQREAD_H
#define IDEM_DLQREAD_H

#include <stddef.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

#include "conf/conf.h"

typedef struct idem_dlqread_s idem_dlqread_t;

/* One DLQ partition as of the start of the read. */
typedef struct {
    int32_t partition;
    int64_t low;   /* earliest offset still stored: `low` records are gone */
    int64_t high;  /* end as of the start: the read stops here */
    int64_t start; /* where this read begins (>= low) */
} idem_dlqread_part_t;

/* A reader of conf->dlq_topic (conf borrowed, must outlive the reader).
 * group NULL: no consumer group at all. With a group (replay's
 * --checkpoint), each partition starts at the group's committed offset
 * when it has one. from_offset >= 0 starts every partition there instead
 * (clamped to [low, high]). Returns NULL with errstr when the topic's
 * metadata or watermarks cannot be read within timeout_ms. */
idem_dlqread_t *idem_dlqread_new(const idem_conf_t *conf, const char *group,
                                 int64_t from_offset, int timeout_ms,
                                 char *errstr, size_t errstr_size);
void idem_dlqread_destroy(idem_dlqread_t *r);

/* The partitions, in partition order (borrowed from r). */
const idem_dlqread_part_t *idem_dlqread_parts(const idem_dlqread_t *r,
                                              size_t *cnt);

/* The next dead letter, in offset order within a partition. Returns 1 with
 * *msg (caller destroys it with rd_kafka_message_destroy), 0 when every
 * partition reached its end, -1 with errstr on a consumer error or when
 * nothing arrived for timeout_ms. */
int idem_dlqread_next(idem_dlqread_t *r, rd_kafka_message_t **msg,
                      int timeout_ms, char *errstr, size_t errstr_size);

/* Commits `next` (the offset to continue from) for the partition at index
 * i of idem_dlqread_parts, synchronously, for the reader's group. Returns 0
 * or -1 with errstr (also when the reader has no group). */
int idem_dlqread_commit(idem_dlqread_t *r, size_t i, int64_t next, char *errstr,
                        size_t errstr_size);

#endif
