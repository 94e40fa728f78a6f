/* verify: compares what the processor left in Redis (and the DLQ) with the
 * expectations `produce --expect` wrote. */
#ifndef IDEM_VERIFY_H
#define IDEM_VERIFY_H

#include <stddef.h>
#include <stdio.h>

#include <jansson.h>

#include "conf/conf.h"

/* Reads and checks an expectation file (the format `produce --expect`
 * writes; README, "The expectation file"): a JSON object with a "ledger"
 * object {CURRENCY: {user: minor units}}, an integer "applied" and
 * optionally "poison" {reason: count}. Returns a new reference, or NULL
 * with errstr naming the file and what is wrong (missing, not JSON with
 * line and column, a member of the wrong type). */
json_t *idem_verify_expect_load(const char *path, char *errstr,
                                size_t errstr_size);

/* Compares `expect` (borrowed, from idem_verify_expect_load) with the
 * ledger and the applied counter in Redis (handler=forward: with what
 * output.topic rebuilds) and, with with_dlq, with the DLQ topic read to its
 * end (distinct original records by dlq.reason, only this group's). Writes
 * a readable report to out: one line per difference (at most 20 shown,
 * then a count), notes on partitions that lost records, and a summary.
 * Returns 0 on an exact match, 1 on a mismatch, -1 when it could not
 * compare (errstr). */
int idem_verify(const idem_conf_t *conf, json_t *expect, int with_dlq,
                int timeout_ms, FILE *out, char *errstr, size_t errstr_size);

#endif
