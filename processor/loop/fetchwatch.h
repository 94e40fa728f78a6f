/* fetchwatch: notices a partition that is assigned, not paused by the
 * member, behind its high watermark, and yet not fetched (librdkafka
 * statistics), says so, repairs it once and then reports not ready. */
#ifndef IDEM_FETCHWATCH_H
#define IDEM_FETCHWATCH_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <librdkafka/rdkafka.h>

#include "obs/metrics.h"

/* One partition of a statistics document (librdkafka STATISTICS.md,
 * topics.<t>.partitions.<p>). Offsets are -1 where librdkafka has none
 * (it writes -1001 for "invalid"). */
typedef struct {
    const char *topic; /* borrowed from the document */
    int32_t partition;
    char fetch_state[16]; /* "none", "stopping", "stopped", "offset-query",
                             "offset-wait", "active" ("?" when absent) */
    int64_t fetchq_cnt;   /* records fetched, not yet polled */
    int64_t next_offset;  /* the fetcher's next offset */
    int64_t app_offset;   /* last record given to the member + 1 */
    int64_t hi_offset;    /* high watermark */
    int64_t ls_offset;    /* last stable offset */
    int64_t consumer_lag; /* end minus the committed offset */
    int32_t leader;       /* broker id of the leader; -1: unknown (0 when
                             the document does not say) */
} idem_fetchwatch_part_t;

/* Calls fn(opaque, part) for each partition the consumer wants (desired,
 * a real partition id) in a librdkafka statistics document (root,
 * borrowed). Returns how many, or -1 when root is not a statistics
 * document (no "topics" object). */
int idem_fetchwatch_parse(const json_t *root,
                          void (*fn)(void *opaque,
                                     const idem_fetchwatch_part_t *part),
                          void *opaque);

/* What the member says about one partition. */
typedef struct {
    int held;         /* assigned to the member (offsets table) */
    int paused;       /* paused by the member: outage, full hands, a retry
                         partition waiting for its head record */
    int64_t position; /* the next offset the member expects: what a repair
                         seeks or assigns to (-1: unknown; no seek, and an
                         assign at the committed offset) */
    int checked;      /* the member read the partition's position in Redis
                         since it was assigned: 0 rules out a repair that
                         assigns it again */
} idem_fetchwatch_member_t;

/* Fills *out for topic/partition; fires inside idem_fetchwatch_stats. */
typedef void idem_fetchwatch_member_cb(void *opaque, const char *topic,
                                       int32_t partition,
                                       idem_fetchwatch_member_t *out);

typedef struct idem_fetchwatch_s idem_fetchwatch_t;

/* A watch that calls a partition stalled after stall_ms without fetching
 * (fetch.stall.ms; > 0). rk (borrowed; NULL in unit tests: repairs are
 * counted, not made) is the consumer the repairs go to; m (borrowed, may
 * be NULL) gets the metrics; member tells the member's view of a
 * partition. fault: the dev.fault.fetch.pause value ("TOPIC:PARTITION[:TIMES]",
 * NULL or "" for none; checked by idem_fetchwatch_fault_check). Returns
 * a watch the caller frees with idem_fetchwatch_destroy. */
idem_fetchwatch_t *idem_fetchwatch_new(int64_t stall_ms, rd_kafka_t *rk,
                                       idem_metrics_t *m,
                                       idem_fetchwatch_member_cb *member,
                                       void *opaque, const char *fault);
void idem_fetchwatch_destroy(idem_fetchwatch_t *fw); /* NULL is a no-op */

/* The member is leaving (rd_kafka_consumer_close serves the statistics
 * callback too): from now on documents are not judged and nothing is
 * repaired. NULL is a no-op. */
void idem_fetchwatch_closing(idem_fetchwatch_t *fw);

/* As idem_fetchwatch_closing, and the watch's query thread (which uses
 * the consumer) is stopped and joined: call it before rd_kafka_destroy,
 * and free the watch after. NULL is a no-op. */
void idem_fetchwatch_stop(idem_fetchwatch_t *fw);

/* Judges one statistics document (root, borrowed) taken at now_ms
 * (idem_now_ms clock). A partition held and not paused by the member,
 * whose leader is known, whose next and app offsets did not move for
 * stall_ms, and that is either not caught up (fetch_state not "active",
 * or behind its end: last stable offset, else high watermark; the
 * statistics' value is only as fresh as the last fetch response, so a
 * partition caught up and idle for stall_ms has its high watermark asked
 * of the broker by the watch's thread, when it has a consumer) or holds
 * fetched records back (app_offset below next_offset), is stalled:
 * logged (warn), counted and repaired: resumed and sought to the
 * member's position the first time; when its fetch never started and
 * every later time, resumed and assigned again at that position
 * (cooperative assignment; with eager, not repaired: not ready, restart
 * the member). A partition that left the assignment in such a repair and
 * was refused the assign back makes the member not ready at once and is
 * assigned again every stall_ms (present in the document or not) until
 * librdkafka takes it or the member lets it go. Still stalled stall_ms
 * after a repair, it makes the member not ready and is repaired again
 * every stall_ms. No repair while the
 * member is closing or librdkafka says the assignment is lost. A
 * partition that moves again is logged and clears it all. Returns 1 when
 * readiness or its reason may have changed (the caller asks
 * idem_fetchwatch_not_ready again), else 0. */
int idem_fetchwatch_stats(idem_fetchwatch_t *fw, const json_t *root,
                          int64_t now_ms);

/* The broker said the partition's end (high watermark) is `end`: used
 * from the next document on, while the partition does not move. What
 * the watch's own thread learns (rd_kafka_query_watermark_offsets, for
 * a partition that looked caught up for fetch.stall.ms) is handed over
 * this way after a document was judged, so the fetcher had a whole
 * statistics period to fetch what was there. Processing thread only. */
void idem_fetchwatch_end_seen(idem_fetchwatch_t *fw, const char *topic,
                              int32_t partition, int64_t end);

/* NULL when no partition stayed stalled after a repair; else a reason
 * ("partition payments/3 not fetched (fetch_state active, lag 812)") in
 * the watch's own buffer, valid until the next _stats call. */
const char *idem_fetchwatch_not_ready(const idem_fetchwatch_t *fw);

/* Counters, for tests: stalls found, repairs made, and how many of those
 * assigned the partition again (the rest resumed and sought). */
uint64_t idem_fetchwatch_stalls(const idem_fetchwatch_t *fw);
uint64_t idem_fetchwatch_repairs(const idem_fetchwatch_t *fw);
uint64_t idem_fetchwatch_reassigns(const idem_fetchwatch_t *fw);

/* Watermark queries the watch's thread started and finished (answered,
 * failed or timed out), for tests: after idem_fetchwatch_stop both are
 * equal, the consumer is no longer used. */
void idem_fetchwatch_queries(idem_fetchwatch_t *fw, uint64_t *started,
                             uint64_t *done);

/* dev.fault.fetch.assign.fail (development only): the next `times` assigns
 * of the heavy repair (after the partition left the assignment) are
 * refused as librdkafka may refuse one, logged and not made; also without
 * a consumer (unit tests). */
/* The group moved parts (assigned, revoked or lost; borrowed): what the
 * watch knew of them (a stall, a partition a repair left out of the
 * assignment) belongs to the old assignment and is forgotten. Loop
 * thread, like the statistics. NULL fw is a no-op. */
void idem_fetchwatch_forget(idem_fetchwatch_t *fw,
                            const rd_kafka_topic_partition_list_t *parts);

void idem_fetchwatch_fault_assign(idem_fetchwatch_t *fw, int times);

/* Checks a dev.fault.fetch.pause value: "TOPIC:PARTITION" or
 * "TOPIC:PARTITION:TIMES" (TIMES 1..100). The fault pauses that partition
 * inside librdkafka once its fetch started (app_offset known), and drops
 * the first TIMES-1 repairs (as librdkafka dropped the fetch start in
 * its issue #5591), so the last one is needed. Returns 0, or -1 with
 * "dev.fault.fetch.pause: ..." in errstr. */
int idem_fetchwatch_fault_check(const char *value, char *errstr,
                                size_t errstr_size);

#endif
