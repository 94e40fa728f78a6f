/* verify: compares what the processor left in Redis (and the DLQ) with the
 * expectations `produce --expect` wrote. */
#ifndef IDEM_VERIFY_H
#define IDEM_VERIFY_H

#include <stddef.h>
#include <stdio.h>

#include "conf.h"

/* Reads the expect file at expect_path, the ledger and the applied counter
 * from Redis and, with with_dlq, the DLQ topic to its end (distinct original
 * records by dlq.reason, only this group's). Writes a readable report to
 * out: one line per difference (at most 20 shown, then a count) and a
 * summary. Returns 0 on an exact match, 1 on a mismatch, -1 when it could
 * not compare (errstr). */
int idem_verify(const idem_conf_t *conf, const char *expect_path, int with_dlq,
                int timeout_ms, FILE *out, char *errstr, size_t errstr_size);

#endif
