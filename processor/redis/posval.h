/* posval: what a partition's position in Redis carries besides its offset
 * (docs/design.md, "Positions in Redis"): the Kafka cluster it was written
 * for and a fingerprint of one record the member read there (timestamp, a
 * hash of key and value), so that a position of another cluster or of an
 * earlier incarnation of the topic is never used to skip records. Its text
 * form in the positions hash, and the judgement of a position against what
 * Kafka says now. No Redis and no broker here (tests/unit). */
#ifndef IDEM_POSVAL_H
#define IDEM_POSVAL_H

#include <stddef.h>
#include <stdint.h>

#define IDEM_POSVAL_CLUSTER_MAX 64 /* a cluster id and its NUL */

/* One record the position vouches for: the last finished record below the
 * position, or for a first position the record at it. */
typedef struct {
    int64_t offset;    /* -1: no record known */
    int64_t timestamp; /* the record's timestamp (ms), -1 when it has none */
    uint64_t hash;     /* idem_posval_hash of its key and value */
} idem_posval_rec_t;

typedef struct {
    char cluster[IDEM_POSVAL_CLUSTER_MAX]; /* "": not known (an older
                                              value, or no cluster id) */
    idem_posval_rec_t rec;
} idem_posval_t;

/* The record's fingerprint hash: 64 bits over the key's length and bytes
 * and the value's length and bytes (NULL with length 0 for none). A key of
 * NULL and an empty key hash alike. */
uint64_t idem_posval_hash(const void *key, size_t key_len, const void *value,
                          size_t value_len);

/* A value without a record: cluster (borrowed, NULL or "" for unknown). */
void idem_posval_init(idem_posval_t *v, const char *cluster);

/* Writes "<offset> <cluster|-> <rec offset> <timestamp> <hash hex>" (or
 * "<offset> <cluster|-> -" without a record) into buf, NUL-terminated.
 * Returns the length, or 0 when it does not fit. */
size_t idem_posval_format(char *buf, size_t size, int64_t offset,
                          const idem_posval_t *v);

/* Reads a value written by _format, or an older plain "<offset>" (then
 * v->cluster is "" and v->rec.offset -1). Returns 0, or -1 when the text is
 * none of these (the position is then unknown). */
int idem_posval_parse(const char *text, size_t len, int64_t *offset,
                      idem_posval_t *v);

/* What Kafka says now about the position's partition. */
typedef struct {
    const char *cluster;   /* the cluster connected to (NULL/"": unknown) */
    int64_t low, high;     /* its watermarks; -1 when not known */
    int found;             /* a record at or after v->rec.offset was read */
    idem_posval_rec_t got; /* that record (its offset may be higher: the
                              one asked for was compacted away) */
} idem_posval_now_t;

typedef enum {
    IDEM_POSVAL_USE = 0,  /* nothing says it belongs elsewhere */
    IDEM_POSVAL_CLUSTER,  /* written for another Kafka cluster */
    IDEM_POSVAL_RECORD,   /* the record it vouches for is another one: an
                             earlier incarnation of the topic */
    IDEM_POSVAL_PAST_END, /* beyond the partition's end, or its record is */
} idem_posval_verdict_t;

/* Judges the position `offset` with value v against now. A record below
 * the partition's start (retention removed it) cannot be compared: the
 * position is used when it lies within the watermarks. A value without a
 * record (an older one) is judged by its cluster and the end only. */
idem_posval_verdict_t idem_posval_judge(int64_t offset, const idem_posval_t *v,
                                        const idem_posval_now_t *now);

/* "use", "cluster", "record", "past-end" (the metric's reason label). */
const char *idem_posval_verdict2str(idem_posval_verdict_t verdict);

#endif
