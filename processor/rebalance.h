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
 * assignment. Returns 0, or -1 with errstr (logged). */
int idem_rebalance_unassign(rd_kafka_t *rk,
                            const rd_kafka_topic_partition_list_t *parts,
                            char *errstr, size_t errstr_size);

/* Pauses (pause=1) or resumes `parts`. A partition librdkafka refuses
 * (no longer assigned) is logged, not an error. Returns how many failed. */
int idem_rebalance_pause(rd_kafka_t *rk, rd_kafka_topic_partition_list_t *parts,
                         int pause);

#endif
