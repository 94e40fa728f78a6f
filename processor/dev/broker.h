/* broker: an in-memory development Kafka (librdkafka's mock cluster) that
 * tests and `idemproc broker` start in-process. */
#ifndef IDEM_BROKER_H
#define IDEM_BROKER_H

#include <stddef.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

typedef struct idem_broker_s idem_broker_t;

/* Starts a mock cluster of broker_cnt (1..32) brokers listening on random
 * ports of 127.0.0.1; its threads serve until idem_broker_destroy(). State is
 * in memory only. Returns the handle, or NULL with errstr filled. */
idem_broker_t *idem_broker_new(int broker_cnt, char *errstr,
                               size_t errstr_size);

/* Creates `topic` with `partitions` partitions (replication factor
 * min(3, brokers)). Topics that clients use without creating them first are
 * auto-created with 4 partitions. Returns 0, or -1 with errstr (e.g. the
 * topic exists). */
int idem_broker_topic_create(idem_broker_t *broker, const char *topic,
                             int32_t partitions, char *errstr,
                             size_t errstr_size);

/* Parses "NAME:PARTITIONS" (PARTITIONS 1..10000) into name (size bytes) and
 * *partitions. Returns 0, or -1 with errstr naming the spec. */
int idem_broker_topic_spec_parse(const char *spec, char *name, size_t size,
                                 int32_t *partitions, char *errstr,
                                 size_t errstr_size);

/* The bootstrap servers ("127.0.0.1:P1,127.0.0.1:P2,..."), borrowed: valid
 * until idem_broker_destroy(). */
const char *idem_broker_bootstraps(const idem_broker_t *broker);

/* The underlying mock cluster (borrowed), for fault injection. */
rd_kafka_mock_cluster_t *idem_broker_mock(idem_broker_t *broker);

/* Stops the brokers and frees everything (all data is lost). NULL is a
 * no-op. */
void idem_broker_destroy(idem_broker_t *broker);

#endif
