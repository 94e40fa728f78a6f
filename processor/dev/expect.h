/* expect: the expectation file `verify` compares with (README, "The
 * expectation file"): what the processor will make of the records that
 * `produce --input` sends, judged by the processor's own envelope reader
 * with the config's envelope.*, and the loading and checking of the file. */
#ifndef IDEM_EXPECT_H
#define IDEM_EXPECT_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "input/envelope.h"

typedef struct idem_expect_s idem_expect_t;

/* What an expectation holds besides the counts. */
#define IDEM_EXPECT_LEDGER 0x1 /* "ledger": balances (rules need payments) */
#define IDEM_EXPECT_OUTPUT                                                     \
    0x2 /* "output": each identity's value as sent                             \
           (forward leaves values unchanged) */

/* A tally of records judged by `rules` (borrowed: the config's
 * envelope.format, .identity, .message.id and message.max.bytes, with
 * payments required when flags has IDEM_EXPECT_LEDGER; must outlive the
 * tally). The caller frees it with idem_expect_destroy(). */
idem_expect_t *idem_expect_new(const idem_envelope_rules_t *rules, int flags);

/* Adds one record as it is sent (all borrowed): value, Kafka key (NULL:
 * none) and the message_id and idempotency_key headers (NULL: none).
 * Poison by reason, else a duplicate of an earlier identity (redelivery
 * when its message id is the one that applied it, resend otherwise), else
 * applied. */
void idem_expect_add(idem_expect_t *e, const void *value, size_t len,
                     const void *key, size_t key_len,
                     const char *hdr_message_id,
                     const char *hdr_idempotency_key);

/* The expectation so far: {"sent","unique","duplicates":{"redelivery",
 * "resend"},"poison":{<every reason>},"applied","identities":[...]}, with
 * "ledger" {CUR:{user: minor units}} and "output" {identity: value} as the
 * flags asked (identities and values that are not UTF-8 are left out of
 * the lists). New reference. */
json_t *idem_expect_json(const idem_expect_t *e);

/* Writes doc (borrowed) as indented JSON with sorted keys to the file at
 * path ("-" = stdout). Returns 0, or -1 with errstr naming the file. */
int idem_expect_write(json_t *doc, const char *path, char *errstr,
                      size_t errstr_size);

/* Reads and checks an expectation file: a JSON object with an integer
 * "applied" and optionally "poison" {reason: count}, "ledger" {CURRENCY:
 * {user: minor units}}, "identities" [string...], "output" {identity:
 * string}, "redis" {key: value or {field: value}} (a value is a string, a
 * number or null). Returns a new reference, or NULL with errstr naming the
 * file and what is wrong (missing, not JSON with line and column, a member
 * of the wrong type). */
json_t *idem_expect_load(const char *path, char *errstr, size_t errstr_size);

/* NULL is a no-op. */
void idem_expect_destroy(idem_expect_t *e);

#endif
