/* kafka: what the processor's librdkafka clients share: setting
 * properties with our error text, creating a client, the settings of its
 * idempotent writers (DLQ, forward output), the kafka.* properties it
 * manages, their fatal errors, and check-config's reachability check. */
#ifndef IDEM_KAFKA_H
#define IDEM_KAFKA_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <librdkafka/rdkafka.h>

#include "conf/conf.h"

/* The kafka folder's configuration keys and checks (kafkakeys.c). */
extern const idem_conf_module_t idem_kafka_conf;

/* Sets one property; returns 0, or -1 with "kafka.<name>: <librdkafka's
 * text>" in errstr. kc is borrowed. */
int idem_kafka_set(rd_kafka_conf_t *kc, const char *name, const char *value,
                   char *errstr, size_t errstr_size);

/* When librdkafka property `name` is one idemproc always sets itself
 * (group.id, enable.auto.commit, acks, ...), what the user should do
 * instead, as a short phrase (static); NULL for every other property. */
const char *idem_kafka_managed(const char *name);

/* Whether the user passed kafka.<name> (so our default must not win). */
int idem_kafka_user_set(const idem_conf_t *conf, const char *name);

/* A configuration for one of the processor's writers: message.max.bytes
 * max_bytes unless kafka.message.max.bytes is set, then every kafka.*
 * property, then what exactly-once needs and the user may not change
 * (enable.idempotence, acks=all, linger.ms 5, message.timeout.ms 15 s),
 * and the log callback. No error callback: librdkafka then logs errors
 * itself, and a fatal one is read with idem_kafka_fatal. Returns a conf
 * the caller hands to idem_kafka_new, or NULL with errstr. */
rd_kafka_conf_t *idem_kafka_writer_conf(const idem_conf_t *conf,
                                        int64_t max_bytes, char *errstr,
                                        size_t errstr_size);

/* rd_kafka_new that takes kc in every case (librdkafka gives it back on
 * failure). Returns NULL with "<who>: <reason>" in errstr. */
rd_kafka_t *idem_kafka_new(rd_kafka_type_t type, rd_kafka_conf_t *kc,
                           const char *who, char *errstr, size_t errstr_size);

/* Returns 1 and "<who>: <reason>" in buf when the idempotent producer rk
 * hit a fatal error (it can no longer guarantee order and no duplicates:
 * the process must stop), 0 while healthy. */
int idem_kafka_fatal(rd_kafka_t *rk, const char *who, char *buf, size_t size);

/* check-config --connect: asks conf's brokers (with every kafka.*
 * setting, security included) for metadata within timeout_ms, and prints
 * to out how many brokers answered and whether the input, DLQ and (forward)
 * output topics exist (the outbox scope: outbox.topic, if set); a missing
 * input topic is an error (the member would consume nothing), a missing
 * topic it writes is only reported; so is a retry topic missing or with
 * fewer partitions than its input (idem_retrytopics_check_md). Returns 0,
 * or -1 with errstr naming the bootstrap servers when none answered, the
 * first missing input topic or the retry topic. */
int idem_kafka_check(const idem_conf_t *conf, int timeout_ms, FILE *out,
                     char *errstr, size_t errstr_size);

/* The partition count of `topic` from rk's brokers (rk borrowed, any
 * client), from the metadata of all topics, so asking never creates a
 * topic where the cluster auto-creates them. Returns the count, 0 when the
 * topic does not exist, or -1 with errstr when no broker answered within
 * timeout_ms. */
int idem_kafka_partition_count(rd_kafka_t *rk, const char *topic,
                               int timeout_ms, char *errstr,
                               size_t errstr_size);

#endif
