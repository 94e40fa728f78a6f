/* expect: what the processor will make of records that `produce --input`
 * sends, judged by the processor's own envelope parser: the expectation
 * file `verify` compares with (README, "The expectation file"). */
#ifndef IDEM_EXPECT_H
#define IDEM_EXPECT_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

typedef struct idem_expect_s idem_expect_t;

/* A tally for records judged against message.max.bytes = max_bytes. The
 * caller frees it with idem_expect_destroy(). */
idem_expect_t *idem_expect_new(size_t max_bytes);

/* Adds one record value (borrowed; sent without a message_id or
 * idempotency_key header other than the value's own): poison by reason,
 * else a duplicate of an earlier identity (redelivery when its message_id
 * is the one that applied it, resend otherwise), else applied to the
 * ledger. */
void idem_expect_add(idem_expect_t *e, const void *value, size_t len);

/* The expectation so far, in the shape idem_gen_expect() has:
 * {"sent","unique","duplicates":{"redelivery","resend"},"poison":{<every
 * reason>},"ledger":{CUR:{user: minor units}},"applied"}. New reference. */
json_t *idem_expect_json(const idem_expect_t *e);

/* Writes doc (borrowed) as indented JSON with sorted keys to the file at
 * path ("-" = stdout). Returns 0, or -1 with errstr naming the file. */
int idem_expect_write(json_t *doc, const char *path, char *errstr,
                      size_t errstr_size);

/* NULL is a no-op. */
void idem_expect_destroy(idem_expect_t *e);

#endif
