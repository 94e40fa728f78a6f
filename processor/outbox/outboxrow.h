/* outboxrow: what the columns of an outbox row become in its Kafka
 * record: the topic name check and the headers, with the rules for rows
 * the relay cannot publish faithfully (they fail with a reason). No
 * database, no broker: unit-tested on their own. */
#ifndef IDEM_OUTBOXROW_H
#define IDEM_OUTBOXROW_H

#include <librdkafka/rdkafka.h>
#include <stddef.h>

/* Kafka's rule for a topic name: 1 to 249 of [a-zA-Z0-9._-], neither "."
 * nor "..". 0, or -1 with errstr naming the rule broken. */
int idem_outboxrow_topic_check(const char *topic, char *errstr,
                               size_t errstr_size);

/* The record headers of a row: json is its headers column as text (NULL:
 * SQL NULL), mid and ikey its message_id and idempotency_key columns
 * (NULL: SQL NULL); all borrowed. The row's own headers first (a JSON
 * object; string values as they are, null as a header without a value,
 * other values as compact JSON text), then message_id and
 * idempotency_key, each once: a header of that name may repeat its
 * column, or stand in for a NULL idempotency_key, never differ. JSON
 * null for the whole column is no headers. Returns NULL with errstr when
 * the column is not JSON or not an object, a header conflicts with an
 * identity column or is not a string, the row has no message_id, or its
 * idempotency_key is empty. Caller owns the result
 * (rd_kafka_headers_destroy, or producev takes it). */
rd_kafka_headers_t *idem_outboxrow_headers(const char *json, const char *mid,
                                           const char *ikey, char *errstr,
                                           size_t errstr_size);

/* Replaces, in place, every byte of s that is not part of a well-formed
 * UTF-8 sequence with '?'. An error text that quotes a row's data cut at
 * a byte count may end inside a character, and PostgreSQL refuses such
 * text: the row's error could never be written and its batch would be
 * retried forever. Returns s. */
char *idem_outboxrow_utf8_clean(char *s);

#endif
