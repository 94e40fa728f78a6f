/* outbox: the transactional outbox relay: claims committed rows of a
 * PostgreSQL outbox table, publishes them with the idempotent producer and
 * marks (or deletes) them in the transaction that claimed them. */
#ifndef IDEM_OUTBOX_H
#define IDEM_OUTBOX_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "conf/conf.h"
#include "obs/metrics.h"

typedef struct idem_outbox_s idem_outbox_t;

/* A relay for conf's outbox.* keys (conf and m borrowed; both must outlive
 * the relay). Creates the producer; the database is connected by
 * idem_outbox_run (a database that is down at start is waited for). Adds
 * the idemproc_outbox_* metrics to m's rendering. Returns NULL with errstr
 * when the producer cannot be created. */
idem_outbox_t *idem_outbox_new(const idem_conf_t *conf, idem_metrics_t *m,
                               char *errstr, size_t errstr_size);

/* The relay loop: until *stop becomes set, claim a batch (the key buckets
 * of the first outbox.batch.max unpublished rows, each tried once with
 * pg_try_advisory_xact_lock, then the first outbox.batch.max unpublished
 * rows of the buckets held, in id order, FOR UPDATE), publish it, wait for
 * every delivery report, then mark the delivered rows and the rows the
 * broker can never take (column error) and commit, in the same write as
 * the next claim (libpq pipeline mode). Sleeps on LISTEN/NOTIFY,
 * outbox.poll.ms at most, when a claim finds nothing. Database or Kafka
 * down: not ready, back off, retry; nothing is marked that was not
 * acknowledged. A stop request lets the batch in hand finish (publish,
 * mark, commit). Returns 0 after a stop, -1 with errstr on a fatal error
 * (the idempotent producer failed). */
int idem_outbox_run(idem_outbox_t *o, volatile int *stop, char *errstr,
                    size_t errstr_size);

/* check-config --for outbox --connect: connects to outbox.dsn (within
 * timeout_ms, rounded up to seconds) and checks outbox.table as the relay
 * does at start (it exists, has every column, a text key), printing what
 * it found to out. 0, or -1 with errstr (the DSN is never in it). */
int idem_outbox_check(const idem_conf_t *conf, int timeout_ms, FILE *out,
                      char *errstr, size_t errstr_size);

/* The claim statement for `table` into buf (size bytes), with $1 =
 * outbox.batch.max: tries the key buckets of the first $1 unpublished rows
 * (pg_try_advisory_xact_lock) and returns `blocked` (how many another
 * relay held) followed by the first $1 unpublished rows of the buckets
 * held, in id order, FOR UPDATE: id, topic, key, value (text, or bytea
 * when value_is_bytea), headers, message_id, idempotency_key, created_at
 * and the commit time (NULL unless commit_ts) in microseconds. One row of
 * NULLs after blocked when nothing was claimed. The relay prepares it;
 * tests check its plans. 0, or -1 when it does not fit in size. */
int idem_outbox_sql_claim(char *buf, size_t size, const char *table,
                          int value_is_bytea, int commit_ts);

/* Flushes and destroys the producer, closes the database. NULL: no-op. */
void idem_outbox_destroy(idem_outbox_t *o);

/* Counters, for tests and the final log line. */
uint64_t idem_outbox_published(idem_outbox_t *o);
uint64_t idem_outbox_failed(idem_outbox_t *o);

/* Whether the error code of a delivery report or of produce() means the
 * broker will never take this record (too large, invalid), as opposed to
 * an outage worth retrying. */
int idem_outbox_err_is_permanent(int rd_kafka_resp_err);

#endif
