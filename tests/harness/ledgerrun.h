/* ledgerrun: the ledger handler (handlers/ledger.c) driven through its ops
 * on a store the test owns, for it tests that apply payments in a real
 * Redis without a loop. */
#ifndef TH_LEDGERRUN_H
#define TH_LEDGERRUN_H

#include <stddef.h>

#include "conf/conf.h"
#include "input/envelope.h"
#include "redis/store.h"

typedef struct th_ledger_s th_ledger_t;

/* Starts the handler on s (borrowed; before s connects: the handler
 * registers its script). Asserts that it starts. */
th_ledger_t *th_ledger_start(const idem_conf_t *conf, idem_store_t *s);

/* Sends envs[n] (borrowed until _recv) as one request. 0, or -1 (errstr). */
int th_ledger_send(th_ledger_t *l, const idem_envelope_t *const *envs, size_t n,
                   char *errstr, size_t errstr_size);

/* Reads the request's results into res[n] as the store says them:
 * IDEM_MARK_NEW (applied), _DONE with prior_mid, _BUSY, _REJECT with
 * detail. 0, or -1 with errstr (an outage). */
int th_ledger_recv(th_ledger_t *l, idem_store_result_t *res, char *errstr,
                   size_t errstr_size);

/* _send then _recv. */
int th_ledger_apply(th_ledger_t *l, const idem_envelope_t *const *envs,
                    size_t n, idem_store_result_t *res, char *errstr,
                    size_t errstr_size);

void th_ledger_stop(th_ledger_t *l);

#endif
