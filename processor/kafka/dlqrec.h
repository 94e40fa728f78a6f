/* dlqrec: one dead letter as `idemproc dlq` sees it: decoding its dlq.*
 * headers, the filters of inspect and replay, times (RFC 3339 or "2h"),
 * its JSON and text lines, stats over many, and the headers of a replay.
 * No broker or Redis needed: the unit tests use it directly. */
#ifndef IDEM_DLQREC_H
#define IDEM_DLQREC_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <librdkafka/rdkafka.h>

/* A decoded dead letter. Strings are owned by the record (NULL when the
 * header is missing); key, value and headers are borrowed from the message
 * it was decoded from and live as long as that message. */
typedef struct {
    const char *dlq_topic; /* borrowed */
    int32_t partition;     /* in the DLQ */
    int64_t offset;        /* in the DLQ */
    int64_t timestamp;     /* of the DLQ record, ms; -1 unknown */
    char *reason, *error, *orig_topic, *group, *failed_at, *replayed_from;
    int32_t orig_partition; /* -1 when missing */
    int64_t orig_offset;    /* -1 when missing */
    int64_t orig_timestamp; /* -1 when missing */
    int attempts;           /* 0 when missing */
    int replay_count;       /* dlq.replay.count, 0 when missing */
    int64_t failed_at_ms;   /* dlq.failed.at parsed; -1 when missing/bad */
    int64_t value_dropped;  /* dlq.value.dropped, -1 when absent */
    const void *key;
    size_t key_len;
    const void *value;
    size_t value_len;
    const rd_kafka_headers_t *headers; /* may be NULL */
    /* The dedup identity as the processor reads it (envelope.*), set by
     * the caller after decoding (borrowed; NULL: not known). When the
     * record has none, identity_error says why (borrowed). Printed by
     * inspect. */
    const char *identity;
    size_t identity_len;
    const char *identity_error;
} idem_dlqrec_t;

/* Decodes a dead letter read from `dlq_topic` (borrowed, must outlive r).
 * Never fails: a missing or malformed header leaves its field unset. The
 * caller releases r with idem_dlqrec_clear. */
void idem_dlqrec_decode(idem_dlqrec_t *r, const char *dlq_topic,
                        int32_t partition, int64_t offset, int64_t timestamp,
                        const void *key, size_t key_len, const void *value,
                        size_t value_len, const rd_kafka_headers_t *headers);
void idem_dlqrec_clear(idem_dlqrec_t *r);

/* Selection shared by inspect, stats and replay. NULL strings and the
 * INT64_MIN/INT64_MAX bounds select everything. */
typedef struct {
    const char *reason; /* dlq.reason equals */
    const char *topic;  /* dlq.original.topic equals */
    const char *group;  /* dlq.group equals (a DLQ shared by groups) */
    const char *key;    /* the record key equals */
    const char *grep;   /* substring of the value */
    int64_t since_ms;   /* dlq.failed.at >= since (wall ms) */
    int64_t until_ms;   /* dlq.failed.at < until */
} idem_dlqfilter_t;

void idem_dlqfilter_init(idem_dlqfilter_t *f);

/* 1 when r passes every filter. A record without a readable dlq.failed.at
 * fails any time filter. */
int idem_dlqfilter_match(const idem_dlqfilter_t *f, const idem_dlqrec_t *r);

/* Parses a point in time: RFC 3339 ("2026-11-30T16:00:00Z",
 * "2026-11-30T17:00:00.250+01:00", a plain date "2026-11-30" = midnight
 * UTC) or a duration ago relative to now_ms ("90s", "15m", "2h", "7d",
 * "500ms"). Returns 0 with *out in wall ms, or -1 with errstr. */
int idem_dlqtime_parse(const char *s, int64_t now_ms, int64_t *out,
                       char *errstr, size_t errstr_size);

/* Output of inspect: one line per record. max_bytes bounds the value shown
 * (-1 = all); a cut value ends on a UTF-8 character boundary and the line
 * says how long the value really was. Text cuts every field (key, header
 * names and values, identity, dlq.* texts) so, and writes control
 * characters and bytes that are not well-formed UTF-8 as \xNN; JSON keeps
 * headers and key whole. Both show the identity (when set)
 * and the record's original headers, in their order: every header but the
 * dlq.* and kafka_dlt-* ones the DLQ added (those are shown decoded). In
 * JSON "headers" is a list of [name, value] pairs (a header may repeat; a
 * value that is not UTF-8 is {"hex": ...}, a null value null). */
void idem_dlqrec_print_json(const idem_dlqrec_t *r, long max_bytes, FILE *out);
void idem_dlqrec_print_text(const idem_dlqrec_t *r, long max_bytes, FILE *out);

/* Counts for `dlq stats`. */
typedef struct idem_dlqstats_s idem_dlqstats_t;

idem_dlqstats_t *idem_dlqstats_new(void);
void idem_dlqstats_destroy(idem_dlqstats_t *s);
/* Counts one dead letter (borrowed). */
void idem_dlqstats_add(idem_dlqstats_t *s, const idem_dlqrec_t *r);
/* Notes a DLQ partition's bounds as of the start of the read: low is its
 * earliest offset still stored, so `low` dead letters are gone. */
void idem_dlqstats_partition(idem_dlqstats_t *s, int32_t partition, int64_t low,
                             int64_t high);
/* The report: a table for people or one JSON object. */
void idem_dlqstats_print(idem_dlqstats_t *s, const char *dlq_topic, FILE *out);
void idem_dlqstats_print_json(idem_dlqstats_t *s, const char *dlq_topic,
                              FILE *out);

/* The headers of a replay of r: every header of the dead letter except the
 * dlq.* and kafka_dlt-* ones it gained in the DLQ, plus
 * dlq.replayed.from=<dlq topic>/<partition>/<offset> and
 * dlq.replay.count=<r->replay_count + 1>. Caller owns the result (hand it
 * to rd_kafka_producev or destroy it). */
rd_kafka_headers_t *idem_dlqrec_replay_headers(const idem_dlqrec_t *r);

/* Why r cannot be replayed (into buf) or NULL when it can: a record
 * replayed replay_max times already, one whose value was dropped, one
 * without dlq.original.topic when no target topic is given. */
const char *idem_dlqrec_refusal(const idem_dlqrec_t *r, int64_t replay_max,
                                int has_target, char *buf, size_t size);

#endif
