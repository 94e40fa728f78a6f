/* rebalance: applying what the group coordinator decided (assign, revoke,
 * lost) to the consumer, for either protocol, and pausing and resuming
 * input; every librdkafka return value is checked and logged here (the
 * way librdkafka's own consumer example does), so the loop only decides
 * what to do. */
#ifndef IDEM_REBALANCE_H
#define IDEM_REBALANCE_H

#include <stddef.h>

#include <librdkafka/rdkafka.h>

/* 1 when the group uses the cooperative (incremental) protocol. */
int idem_rebalance_cooperative(rd_kafka_t *rk);

/* Takes `parts` (borrowed) into the assignment: incrementally
 * (cooperative) or as the whole assignment (eager). Returns 0, or -1 with
 * librdkafka's error in errstr (logged). */
int idem_rebalance_assign(rd_kafka_t *rk,
                          const rd_kafka_topic_partition_list_t *parts,
                          char *errstr, size_t errstr_size);

/* Gives `parts` up (revoked or lost): incrementally, or the whole
 * assignment. Incrementally, a partition librdkafka does not hold (the
 * fetch watch took it out and could not assign it back) is logged and
 * left out, as librdkafka would refuse the whole call for it. Returns 0,
 * or -1 with errstr (logged). */
int idem_rebalance_unassign(rd_kafka_t *rk,
                            const rd_kafka_topic_partition_list_t *parts,
                            char *errstr, size_t errstr_size);

/* Pauses (pause=1) or resumes `parts`. A partition librdkafka refuses
 * (no longer assigned) is logged, not an error. Returns how many failed. */
int idem_rebalance_pause(rd_kafka_t *rk, rd_kafka_topic_partition_list_t *parts,
                         int pause);

/* Sets the pause state of `parts` BEFORE they are assigned (pause=1 paused,
 * 0 fetching). librdkafka keeps a partition's pause across unassign and
 * assign, so a new assignment must set it; but a pause or resume issued
 * after assign races with the fetch start librdkafka's main thread issues
 * once the committed offsets arrive: each takes a version from the
 * partition's counter, and a start that reaches the partition after a
 * pause/resume with a newer version is dropped as outdated, leaving the
 * partition assigned and never fetched (no error, no log). Before assign
 * no start is pending, so the order is the program's. Returns, when
 * pausing, the partitions librdkafka does not know yet (they cannot be
 * paused before assign; the caller pauses them after it), else NULL; the
 * caller destroys the list. */
rd_kafka_topic_partition_list_t *idem_rebalance_pause_preset(
    rd_kafka_t *rk, const rd_kafka_topic_partition_list_t *parts, int pause);

#endif
