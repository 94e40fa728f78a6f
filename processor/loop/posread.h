/* posread: reads back the records that positions in Redis vouch for
 * (redis/posval.h), with a consumer of its own that belongs to no group:
 * each partition's watermarks and the record at the offset asked for, so
 * the loop can tell a position of this topic from one of an earlier
 * incarnation, or one past the partition's end. */
#ifndef IDEM_POSREAD_H
#define IDEM_POSREAD_H

#include <stddef.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

#include "conf/conf.h"
#include "redis/posval.h"

typedef struct idem_posread_s idem_posread_t;

/* A reader with conf's kafka.* properties (conf borrowed; must outlive
 * it). Connects lazily. NULL with errstr when librdkafka refuses the
 * properties. */
idem_posread_t *idem_posread_new(const idem_conf_t *conf, char *errstr,
                                 size_t errstr_size);
void idem_posread_destroy(idem_posread_t *r); /* NULL is a no-op */

/* One partition to look at. */
typedef struct {
    const char *topic; /* borrowed */
    int32_t partition;
    int64_t rec_offset;    /* the record to read; -1: the watermarks only */
    idem_posval_now_t now; /* out: watermarks, and the record found at or
                              after rec_offset (now.found); now.cluster is
                              left as the caller set it */
} idem_posread_item_t;

/* The fingerprint of m (borrowed) into *out: its offset, its timestamp (-1
 * when it has none) and idem_posval_hash of its key and value. The loop
 * takes the record a position vouches for with it, and the reader the
 * record it reads back, so the two always compare alike. */
void idem_posread_fingerprint(const rd_kafka_message_t *m,
                              idem_posval_rec_t *out);

/* Fills items[n].now within timeout_ms. A record below the low watermark
 * or at/after the high one is not read (now.found 0). Returns 0, or -1 with
 * errstr when Kafka did not answer in time for every item (retriable: the
 * caller asks again later). */
int idem_posread_read(idem_posread_t *r, idem_posread_item_t *items, size_t n,
                      int timeout_ms, char *errstr, size_t errstr_size);

#endif
