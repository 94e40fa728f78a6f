/* metrics: the process's Prometheus metrics; updated by the processing
 * thread, rendered by the HTTP thread. Every function is thread-safe but
 * those of an accumulator (idem_metrics_acc_t), which is one thread's. */
#ifndef IDEM_METRICS_H
#define IDEM_METRICS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/outcome.h"

typedef struct idem_metrics_s idem_metrics_t;

idem_metrics_t *idem_metrics_new(void);
void idem_metrics_destroy(idem_metrics_t *m); /* NULL is a no-op */

/* Counters (idemproc_records_total{outcome}, idemproc_duplicates_total{kind},
 * idemproc_dlq_records_total{reason}, idemproc_retries_total,
 * idemproc_redis_errors_total{class}, idemproc_commits_total{result},
 * idemproc_rebalances_total{event},
 * idemproc_redis_position_behind_total). */
void idem_metrics_outcome_add(idem_metrics_t *m, idem_outcome_t o, uint64_t n);
void idem_metrics_duplicate_add(idem_metrics_t *m, idem_dup_kind_t k,
                                uint64_t n);
void idem_metrics_dlq_add(idem_metrics_t *m, idem_reason_t r, uint64_t n);
void idem_metrics_retry_add(idem_metrics_t *m, uint64_t n);
/* cls: one of idem_metrics_redis_classes (borrowed); anything else is
 * counted as "other". */
void idem_metrics_redis_error_add(idem_metrics_t *m, const char *cls,
                                  uint64_t n);
/* Redis held a partition's position behind Kafka's committed offset: it
 * went back in time (lost writes, a lagging replica promoted). */
void idem_metrics_redis_behind_add(idem_metrics_t *m, uint64_t n);
/* Kafka's committed offset of a partition was moved by another tool, not
 * by a member or `idemproc offsets reset`, and Redis's position differs
 * (idemproc_kafka_offset_moved_total). */
void idem_metrics_kafka_moved_add(idem_metrics_t *m, uint64_t n);
/* result: "ok" (a rewrite the member waited for ended ok), "failed" (it
 * ended with an error) or "refused" (BGREWRITEAOF refused); others are
 * ignored (idemproc_redis_aof_rewrites_total{result}). */
void idem_metrics_redis_aof_rewrite_add(idem_metrics_t *m, const char *result);
/* A position in Redis not used (idemproc_position_mismatch_total{reason}):
 * reason one of idem_metrics_mismatch_reasons (borrowed). */
extern const char *const idem_metrics_mismatch_reasons[];
void idem_metrics_position_mismatch_add(idem_metrics_t *m, const char *reason);
/* ok: 1 for a successful commit, 0 for a failed one. Also records the time
 * of the last successful commit (idemproc_last_commit_timestamp_seconds). */
void idem_metrics_commit_add(idem_metrics_t *m, int ok);
/* event: "assign", "revoke" or "lost" (borrowed). */
void idem_metrics_rebalance_add(idem_metrics_t *m, const char *event);

/* Histograms (seconds for latencies, records for batch size). */
void idem_metrics_latency_observe(idem_metrics_t *m, double seconds);
/* Record timestamp (ms since the epoch, the producer's clock) to now (this
 * host's clock) for a processed record: what `make bench` reports as the
 * produce-to-effect latency. Negative values (clock skew) land in the
 * first bucket. */
void idem_metrics_effect_latency_observe(idem_metrics_t *m, double seconds);
/* The same for the moment the loop polled the record: the producer, the
 * broker and the fetch, without the member's own time. */
void idem_metrics_fetch_latency_observe(idem_metrics_t *m, double seconds);
void idem_metrics_batch_observe(idem_metrics_t *m, double records);
void idem_metrics_redis_observe(idem_metrics_t *m, double seconds);

/* The per-record figures of one thread, without locks or atomics: the
 * processing loop counts each finished record here and merges once per
 * turn of the loop, so a record costs no lock. An accumulator belongs to
 * the thread that uses it; only _merge touches m. What is not merged yet
 * is invisible to every reader of m (/metrics, the _get functions): merge
 * before anything must see it complete. */
typedef struct idem_metrics_acc_s idem_metrics_acc_t;

/* m is borrowed and must outlive the accumulator. Never fails (aborts
 * when out of memory, as idem_metrics_new does). */
idem_metrics_acc_t *idem_metrics_acc_new(idem_metrics_t *m);
/* Merges what is left, then frees a. NULL is a no-op. */
void idem_metrics_acc_destroy(idem_metrics_acc_t *a);
/* The same meaning as idem_metrics_outcome_add and the _observe functions
 * of the same names (NaN dropped, unknown outcomes ignored), held in a
 * until the next merge. */
void idem_metrics_acc_outcome_add(idem_metrics_acc_t *a, idem_outcome_t o,
                                  uint64_t n);
void idem_metrics_acc_latency_observe(idem_metrics_acc_t *a, double seconds);
void idem_metrics_acc_effect_latency_observe(idem_metrics_acc_t *a,
                                             double seconds);
void idem_metrics_acc_fetch_latency_observe(idem_metrics_acc_t *a,
                                            double seconds);
/* Adds what a holds to m and empties a: each histogram under its lock in
 * one step (a scrape sees all of it or none, _count always equal to the
 * +Inf bucket), each outcome with one atomic add. Nothing held: nothing
 * is touched. */
void idem_metrics_acc_merge(idem_metrics_acc_t *a);

/* Gauges. */
void idem_metrics_assigned_set(idem_metrics_t *m, int64_t partitions);
void idem_metrics_paused_set(idem_metrics_t *m, int64_t partitions);
void idem_metrics_inflight_set(idem_metrics_t *m, int64_t records);
/* idemproc_redis_eviction_allowed: 1 while redis.allow.eviction=true lets
 * the member run against an evicting maxmemory-policy. */
void idem_metrics_redis_eviction_set(idem_metrics_t *m, int allowed);
/* idemproc_group_config_mismatch: how many other live members of the
 * group publish effect-defining settings unlike this member's
 * (redis/liveness.h). */
void idem_metrics_group_config_mismatch_set(idem_metrics_t *m, int64_t members);

/* The labels of idemproc_redis_errors_total, NULL-terminated. */
extern const char *const idem_metrics_redis_classes[];

/* The webhook handler's series, rendered once _webhook_enable was called
 * (so a member of another handler shows none): responses by class
 * (idemproc_webhook_requests_total{class}, classes in
 * idem_metrics_webhook_classes; anything else counts as "error") and the
 * request latency histogram (idemproc_webhook_latency_seconds). */
extern const char *const idem_metrics_webhook_classes[];
void idem_metrics_webhook_enable(idem_metrics_t *m);
void idem_metrics_webhook_request_add(idem_metrics_t *m, const char *cls);
void idem_metrics_webhook_latency_observe(idem_metrics_t *m, double seconds);
uint64_t idem_metrics_webhook_request_get(idem_metrics_t *m, const char *cls);

/* The script handler's request that Redis refused to end (SCRIPT KILL
 * answered UNKILLABLE: the effect wrote, then ran past
 * script.timeout.ms): idemproc_script_unkillable_total counts them (always
 * rendered); while one is in flight,
 * idemproc_script_unkillable_offset{topic,partition,records} is the offset
 * of its first record (records: how many the request holds; with 1 the
 * series names the record itself). One series at most, so no label per
 * record piles up. topic borrowed, copied. */
void idem_metrics_script_unkillable_set(idem_metrics_t *m, const char *topic,
                                        int32_t partition, int64_t offset,
                                        size_t records);
/* The request ended (Redis restarted, or the script finished). */
void idem_metrics_script_unkillable_clear(idem_metrics_t *m);
uint64_t idem_metrics_script_unkillable_get(idem_metrics_t *m);

/* Retry topics (retry.topics): rendered once _retry_tiers_enable was
 * called with the tiers' labels (borrowed, copied; at most 8, each up to
 * 15 characters, e.g. "5s"): records written to each tier
 * (idemproc_retry_topic_records_total{tier}) and retry partitions paused
 * until their head record is due (idemproc_retry_partitions_waiting). */
void idem_metrics_retry_tiers_enable(idem_metrics_t *m,
                                     const char *const labels[], size_t n);
/* tier: 1..n as enabled; others are ignored. */
void idem_metrics_retry_topic_add(idem_metrics_t *m, int tier, uint64_t n);
uint64_t idem_metrics_retry_topic_get(idem_metrics_t *m, int tier);
void idem_metrics_retry_waiting_set(idem_metrics_t *m, int64_t partitions);

/* An external effect's scheduling (ordering=): records with the handler,
 * keys with records held back behind an earlier one of theirs, and the
 * deepest per-key queue seen. The three gauges are rendered from the
 * first call on. */
void idem_metrics_ordering_set(idem_metrics_t *m, int64_t inflight,
                               int64_t keys_waiting, int64_t depth_hwm);
/* Partitions paused now because their records in hand all wait behind
 * busy keys (a rise counts into the holds' total). */
void idem_metrics_key_holds_set(idem_metrics_t *m, int64_t partitions);

/* dedup.scope=partition: bytes and marks the member's partition tables
 * hold, and dedup.memory.max. Rendered from the first call on. */
void idem_metrics_dedup_table_set(idem_metrics_t *m, int64_t bytes,
                                  int64_t marks, int64_t max_bytes);
/* member.memory.max (bytes) and whether fetching is paused because the
 * member's RSS passed it (a rise counts into the pauses' total). Rendered
 * from the first call on (only with a bound set). */
void idem_metrics_member_memory_set(idem_metrics_t *m, int64_t max_bytes,
                                    int paused);
/* The dedup layout key's refusals the member met since start (totals, from
 * loop/partscope.c): partition chunks refused with LAYOUT, and failed
 * global script requests after which the key was found changed. Rendered
 * with the tables' gauges. */
void idem_metrics_dedup_layout_refusals_set(idem_metrics_t *m, uint64_t chunk,
                                            uint64_t global);

/* Redis Cluster mode: one node's counters of the store's cluster client
 * (redis/cluster.h's idem_cluster_node_stats_t, copied field by field). */
typedef struct {
    const char *node; /* "host:port", borrowed for the call */
    uint64_t requests, moved, ask, tryagain, clusterdown, conn_errors, timeouts;
} idem_metrics_cluster_node_t;

/* Replaces the snapshot of the cluster client's counters (n nodes, copied)
 * and its slot-map reads: rendered as idemproc_redis_cluster_*_total{node}
 * and idemproc_redis_cluster_slot_map_refreshes_total from the first call
 * on (nothing is rendered outside cluster mode). */
void idem_metrics_cluster_set(idem_metrics_t *m,
                              const idem_metrics_cluster_node_t *nodes,
                              size_t n, uint64_t refreshes);

/* Readiness (idemproc_ready and /readyz). reason is borrowed and copied;
 * NULL or "" when ready. */
void idem_metrics_ready_set(idem_metrics_t *m, int ready, const char *reason);
/* Returns 1 when ready; copies the not-ready reason into reason. */
int idem_metrics_ready_get(idem_metrics_t *m, char *reason, size_t reason_size);

/* Liveness: the processing loop calls this every iteration; /healthz
 * compares the last call with health.stall.ms. */
void idem_metrics_heartbeat(idem_metrics_t *m);
int64_t idem_metrics_heartbeat_age_ms(idem_metrics_t *m);

/* Consumer lag: parses a librdkafka statistics JSON document (borrowed; the
 * stats_cb payload) and replaces
 * idemproc_consumer_lag_records{topic,partition}.
 * Returns 0, or -1 when the document cannot be parsed. */
int idem_metrics_stats_json(idem_metrics_t *m, const char *json, size_t len);

/* The fetch watch (fetchwatch.h): idemproc_partition_stalled{topic,
 * partition} is replaced by v[0..n) (borrowed, copied): 1 for a partition
 * assigned, not paused by the member and not fetched for fetch.stall.ms,
 * 0 for the others; idemproc_partition_stalls_total counts the stalls
 * found, idemproc_partition_stall_repairs_total the repairs made; all
 * rendered once _stall_enable was called (a relay shows none). */
typedef struct {
    const char *topic;
    int32_t partition;
    int stalled;
} idem_metrics_stall_t;
void idem_metrics_stalled_set(idem_metrics_t *m, const idem_metrics_stall_t *v,
                              size_t n);
void idem_metrics_stall_enable(idem_metrics_t *m);
void idem_metrics_stall_add(idem_metrics_t *m);
void idem_metrics_stall_repair_add(idem_metrics_t *m);

/* Consumer lag from a parsed statistics document (root, borrowed): what
 * idem_metrics_stats_json does after parsing. Returns 0, or -1 when root
 * is not an object. */
struct json_t;
int idem_metrics_stats_doc(idem_metrics_t *m, const struct json_t *root);

/* Calls fn for each partition object of a statistics document (root,
 * borrowed) whose name is a partition id (librdkafka's "-1", the
 * unassigned partition, is skipped), with its topic's name. Returns the
 * number of calls, or -1 when root has no "topics" object. */
int idem_stats_partitions(const struct json_t *root,
                          void (*fn)(void *opaque, const char *topic,
                                     int32_t partition,
                                     const struct json_t *part),
                          void *opaque);

/* Reads a counter back (tests, progress log, demo summary). */
uint64_t idem_metrics_outcome_get(idem_metrics_t *m, idem_outcome_t o);
uint64_t idem_metrics_duplicate_get(idem_metrics_t *m, idem_dup_kind_t k);
uint64_t idem_metrics_dlq_get(idem_metrics_t *m, idem_reason_t r);
/* Sum of the lag gauges; -1 when no statistics arrived yet. */
int64_t idem_metrics_lag_total(idem_metrics_t *m);

/* A command's own metrics, appended to the rendering (e.g. the outbox
 * relay's idemproc_outbox_*). Fires on the HTTP thread; must be
 * thread-safe. */
typedef void idem_metrics_render_cb(void *opaque, FILE *out);

/* Installs cb (NULL removes it). Call before the HTTP server starts;
 * opaque is borrowed and must outlive m's rendering. */
void idem_metrics_set_extra(idem_metrics_t *m, idem_metrics_render_cb *cb,
                            void *opaque);

/* The member's consumer group and id (borrowed, copied; call before the
 * HTTP server starts): rendered as idemproc_member_info{group,member} 1,
 * an info metric joined in queries (`* on(instance) group_left(group)
 * idemproc_member_info`) rather than a label on every series. Not called:
 * no idemproc_member_info. */
void idem_metrics_member_set(idem_metrics_t *m, const char *group,
                             const char *member);

/* Writes the Prometheus text format (0.0.4) of every metric, including
 * idemproc_build_info{version}, idemproc_member_info when set and the
 * process_* metrics (procstat.h). */
void idem_metrics_render(idem_metrics_t *m, FILE *out);

/* Records a heartbeat as having happened at mono_ms (idem_now_ms() clock).
 * idem_metrics_heartbeat() is this with the current time; tests use it to
 * fake a stalled loop without sleeping. */
void idem_metrics_heartbeat_at(idem_metrics_t *m, int64_t mono_ms);

/* Writes value to out escaped as a Prometheus label value (backslash,
 * double quote and line feed), without the surrounding quotes. */
void idem_metrics_escape_label(const char *value, FILE *out);

#endif
