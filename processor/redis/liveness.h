/* liveness: which members of a group are running, kept in Redis by the
 * members themselves, for `idemproc offsets reset` to refuse while any is.
 * librdkafka 2.0.2's mock cluster answers neither ListGroups nor
 * DescribeGroups (rd_kafka_list_groups returns "Required feature not
 * supported by broker"), so the broker cannot be asked there; a real broker
 * is asked as well (cmd_offsets.c). Each member writes its id into the
 * sorted set <prefix>members:<group.id> with its expiry as the score, in
 * Redis's own clock (TIME inside the script, so no two clocks are compared),
 * every second from a thread of its own, and removes it when it stops; a
 * member killed without a word drops out with its Kafka session
 * (idem_liveness_ttl_ms): when the broker drops it from the group too. */
#ifndef IDEM_LIVENESS_H
#define IDEM_LIVENESS_H

#include <stddef.h>
#include <stdint.h>

#include "conf/conf.h"
#include "obs/metrics.h"

#define IDEM_LIVENESS_BEAT_MS    1000 /* how often a member writes its entry */
#define IDEM_LIVENESS_TTL_MIN_MS 3000 /* an entry outlives three beats */
/* librdkafka's session.timeout.ms when kafka.session.timeout.ms is unset. */
#define IDEM_LIVENESS_SESSION_DEFAULT_MS 45000

/* How long conf's member's entry lasts unrenewed: its Kafka session
 * (kafka.session.timeout.ms, else librdkafka's 45 s), the time a member
 * that stopped beating (killed, frozen, cut off) may still hold its
 * partitions and commit; at least IDEM_LIVENESS_TTL_MIN_MS. Shorter, a
 * frozen member would drop out of the list while it still owns
 * partitions (an offsets reset would then run under it); longer, a
 * killed member would block a layout switch and a reset after Kafka
 * itself gave its partitions away. */
int64_t idem_liveness_ttl_ms(const idem_conf_t *conf);

typedef struct idem_liveness_s idem_liveness_t;

/* Starts the heartbeat of conf->member_id in conf->group_id's set: a
 * thread with its own connection (idem_redisconn_open), which writes at
 * once and then every IDEM_LIVENESS_BEAT_MS. A failed write (Redis down) is
 * logged once per outage and tried again at the next beat. conf is borrowed
 * and must outlive the heartbeat. NULL with errstr only when the thread
 * cannot be started.
 *
 * Each beat also publishes `fingerprint` (copied; "key=value" lines: what
 * defines the member's effect, built by the caller) in the hash
 * <prefix>memberconf:<group.id>, field member id, and reads the other live
 * members' back: the number whose fingerprint differs goes to
 * idemproc_group_config_mismatch (metrics may be NULL), and a warning
 * naming both members and the differing keys is logged whenever the set
 * of mismatches changes. A warning, not a refusal: a rolling change of
 * settings passes through this state.
 *
 * With dedup.scope=partition, each beat also switches the group's dedup
 * layout key to partition once every live member's fingerprint supports
 * the key and wants partition (redis/layout.h: idem_layout_decide, then
 * a compare and set from global). */
idem_liveness_t *idem_liveness_start(const idem_conf_t *conf,
                                     const char *fingerprint,
                                     idem_metrics_t *metrics, char *errstr,
                                     size_t errstr_size);

/* The keys whose values differ between fingerprints `mine` and `theirs`
 * ("key=value" lines; a key in only one counts), comma-separated into buf
 * in the order met (mine's first). Returns how many. */
int idem_liveness_fp_diff(const char *mine, const char *theirs, char *buf,
                          size_t size);

/* Stops the thread and removes the member's entry (one try). NULL is a
 * no-op. */
void idem_liveness_stop(idem_liveness_t *l);

/* One live member: its id and how long its entry lasts unrenewed. */
typedef struct {
    char *member;          /* owned by the list */
    int64_t expires_in_ms; /* by Redis's clock */
} idem_liveness_member_t;

/* Reads the live members of conf->group_id (entries not expired) into a
 * new array *out of *n (caller frees with idem_liveness_list_free). Returns
 * 0, or -1 with errstr (Redis unreachable: retriable). */
int idem_liveness_list(const idem_conf_t *conf, idem_liveness_member_t **out,
                       size_t *n, char *errstr, size_t errstr_size);
void idem_liveness_list_free(idem_liveness_member_t *v, size_t n);

/* The fingerprints the live members m[n] published (the hash
 * <prefix>memberconf:<group.id>, in cluster mode
 * <prefix>memberconf{<group.id>}): a new array *fps of n strings, "" for a
 * member that published none (caller frees each and the array, also on
 * failure). 0, or -1 with errstr (Redis unreachable: retriable). */
int idem_liveness_fingerprints(const idem_conf_t *conf,
                               const idem_liveness_member_t *m, size_t n,
                               char ***fps, char *errstr, size_t errstr_size);

#endif
