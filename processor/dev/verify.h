/* verify: compares what the processor left in Redis, on its output topic
 * and in the DLQ with the expectation file (dev/expect.h). */
#ifndef IDEM_VERIFY_H
#define IDEM_VERIFY_H

#include <stddef.h>
#include <stdio.h>

#include <jansson.h>

#include "conf/conf.h"

/* What the handler's effect leaves to read back (the caller fills it from
 * the handler's ops, effect/handler.h: verify names no handler). */
typedef struct {
    int balances;       /* payments added to balances in Redis, with the
                           applied counter (the handler needs payments) */
    const char *output; /* the topic each applied record is written to
                           (ops->output), or NULL */
} idem_verify_effect_t;

/* Compares `expect` (borrowed, from idem_expect_load, dev/expect.h) with
 * what took effect, per `effect`: the dedup marks of group.id (every
 * handler but a ledger run without "identities": each listed identity
 * done, no other), the ledger hashes and applied counter (balances),
 * the output topic read to its end (each identity once, values as sent
 * where the expectation lists them; with a "ledger", its distinct
 * records rebuild it), the "redis" values (any handler: script's) and,
 * with with_dlq, the DLQ topic read to its end (distinct original records
 * by dlq.reason, only this group's). Writes a readable report to out: one
 * line per difference (at most 20 shown, then a count), notes on
 * partitions that lost records, and a summary. Returns 0 on an exact
 * match, 1 on a mismatch, -1 when it could not compare (errstr). */
int idem_verify(const idem_conf_t *conf, const idem_verify_effect_t *effect,
                json_t *expect, int with_dlq, int timeout_ms, FILE *out,
                char *errstr, size_t errstr_size);

#endif
