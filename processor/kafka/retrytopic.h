/* retrytopic: non-blocking retries through delay topics (retry.topics):
 * parsing the delays, naming the topics (<input>.retry.<delay>), the
 * retry.* headers a copy carries and reading them back, and which topic
 * of a member's subscription is which tier. No broker and no Redis here:
 * the loop (effects.c, pipeline.c) writes and reads the records
 * (tests/unit/test_retrytopic.c). */
#ifndef IDEM_RETRYTOPIC_H
#define IDEM_RETRYTOPIC_H

#include <stddef.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

/* Most tiers retry.topics may name. */
#define IDEM_RETRY_TIERS_MAX 8

/* Longest delay of one tier: a week. */
#define IDEM_RETRY_DELAY_MAX_MS (7LL * 24 * 3600 * 1000)

/* Parses retry.topics, a comma list of delays, each digits with a unit
 * ms, s, m or h ("200ms,5s,1m"), strictly ascending, each within 1 ms and
 * IDEM_RETRY_DELAY_MAX_MS, at most IDEM_RETRY_TIERS_MAX. An empty (or
 * blank) spec is 0 tiers: blocking retries. Fills delays_ms[] (room for
 * IDEM_RETRY_TIERS_MAX) and *n. Returns 0, or -1 with errstr naming
 * retry.topics and the offending item. */
int idem_retrytopic_parse(const char *spec, int64_t *delays_ms, size_t *n,
                          char *errstr, size_t errstr_size);

/* The delay as a topic name part, in the largest unit that divides it
 * (60000 -> "1m", 1500 -> "1500ms"), into buf. Returns buf. */
const char *idem_retrytopic_label(int64_t ms, char *buf, size_t size);

/* "<input>.retry.<label>" into buf. Returns buf (truncated when small). */
const char *idem_retrytopic_name(const char *input, int64_t ms, char *buf,
                                 size_t size);

/* Headers a copy in a retry topic carries (besides the original's). */
#define IDEM_RETRY_H_ATTEMPT   "retry.attempt" /* failed attempts so far */
#define IDEM_RETRY_H_DUE_AT    "retry.due.at"  /* ms since the epoch */
#define IDEM_RETRY_H_ERROR     "retry.error"   /* why the last one failed */
#define IDEM_RETRY_H_TOPIC     "retry.original.topic"
#define IDEM_RETRY_H_PARTITION "retry.original.partition"
#define IDEM_RETRY_H_OFFSET    "retry.original.offset"
#define IDEM_RETRY_H_TIMESTAMP "retry.original.timestamp"

/* 1 when `name` is one of the headers above. */
int idem_retrytopic_header_is_own(const char *name);

/* Removes the headers above from h (borrowed). */
void idem_retrytopic_headers_strip(rd_kafka_headers_t *h);

/* Where a record first came from and how often it failed. */
typedef struct {
    char topic[256]; /* the input topic ("" when unknown) */
    int32_t partition;
    int64_t offset;
    int64_t timestamp; /* the original record's, ms since the epoch; -1 */
    int attempts;      /* handler attempts that failed before this copy */
    int64_t due_ms;    /* wall clock ms the copy is due; -1 when unknown */
} idem_retry_info_t;

/* Reads the retry.* headers of h (borrowed, may be NULL) into *info;
 * missing or malformed ones are left at "unknown" (topic "", numbers -1,
 * attempts 0). Returns 0 when the original coordinates were all there and
 * well formed, else -1. */
int idem_retrytopic_info_read(const rd_kafka_headers_t *h,
                              idem_retry_info_t *info);

/* The headers of a copy for a retry topic: `orig` (borrowed, may be NULL)
 * without the retry.* headers, then retry.attempt = attempts,
 * retry.due.at = due_ms, retry.error = error (any bytes up to its NUL)
 * and the original coordinates from *origin. Returns new headers the
 * caller destroys or hands to the producer. */
rd_kafka_headers_t *idem_retrytopic_headers_new(const rd_kafka_headers_t *orig,
                                                const idem_retry_info_t *origin,
                                                int attempts, int64_t due_ms,
                                                const char *error);

/* The retry topics of a member: every input topic times every tier. */
typedef struct idem_retrytopics_s idem_retrytopics_t;

/* For input_topics (comma list, no regex entries) and delays_ms[n]
 * (n >= 1). Never NULL. */
idem_retrytopics_t *idem_retrytopics_new(const char *input_topics,
                                         const int64_t *delays_ms, size_t n);
void idem_retrytopics_destroy(idem_retrytopics_t *rt); /* NULL: no-op */

/* How many retry topics (inputs times tiers), and the i-th name
 * (borrowed), input by input, tiers ascending. */
size_t idem_retrytopics_count(const idem_retrytopics_t *rt);
const char *idem_retrytopics_at(const idem_retrytopics_t *rt, size_t i);

/* The tier of `topic`: 1 for the first retry topic of an input, ... ; 0
 * when it is not a retry topic (an input topic). rt may be NULL (0). */
int idem_retrytopics_tier(const idem_retrytopics_t *rt, const char *topic);

/* The topic of tier `tier` (1..n) for the input `input` (borrowed), or
 * NULL when input is not one of the inputs or tier is out of range. */
const char *idem_retrytopics_topic(const idem_retrytopics_t *rt,
                                   const char *input, int tier);

/* Where a record that failed in `topic` (an input or a retry topic) goes
 * next: the next tier's topic (borrowed), or NULL after the last tier or
 * for a topic that is neither. */
const char *idem_retrytopics_next(const idem_retrytopics_t *rt,
                                  const char *topic);

/* Whether every retry topic has at least its input topic's partition
 * count in md (borrowed; metadata of all topics): a copy goes to the
 * partition number of the record it copies (idem_retryloop_send), so a
 * retry topic with fewer partitions could not take it. An input topic
 * missing from md is not checked (nothing of it can be consumed). Returns
 * 0, or -1 with errstr naming the retry topic and both counts, or the
 * missing retry topic and the count to create it with. */
int idem_retrytopics_check_md(const idem_retrytopics_t *rt,
                              const rd_kafka_metadata_t *md, char *errstr,
                              size_t errstr_size);

/* idem_retrytopics_check_md on the metadata of all topics that rk
 * (borrowed, any client) gets from its brokers within timeout_ms. When
 * none answers in that time the check cannot be made: logged as a
 * warning, and 0 (the member starts; a copy to a missing partition then
 * fails and is dead-lettered). Returns 0, or -1 with errstr. */
int idem_retrytopics_check(const idem_retrytopics_t *rt, rd_kafka_t *rk,
                           int timeout_ms, char *errstr, size_t errstr_size);

/* The delay of tier `tier` (1..n), 0 when out of range; and n. */
int64_t idem_retrytopics_delay(const idem_retrytopics_t *rt, int tier);
size_t idem_retrytopics_tiers(const idem_retrytopics_t *rt);

#endif
