/* store: the Redis side of exactly-once: connection, the dedup/ledger/lease
 * Lua scripts (loaded once, called with EVALSHA, pipelined per batch) and
 * the reads verify needs. A redisReply never leaves this module. */
#ifndef IDEM_STORE_H
#define IDEM_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "conf.h"
#include "envelope.h"
#include "metrics.h"

typedef struct idem_store_s idem_store_t;

/* What a script said about one record. */
typedef enum {
    IDEM_MARK_NEW = 0, /* applied (ledger), claimed (claim), marked (mark) */
    IDEM_MARK_DONE,    /* already done: a duplicate; prior_mid filled */
    IDEM_MARK_BUSY,    /* leased by someone else (or earlier in the batch) */
    IDEM_MARK_REJECT,  /* the effect was refused (error in `detail`) */
    IDEM_MARK_LOST,    /* mark: our lease was taken over by another owner */
    IDEM_MARK_AGAIN,   /* claim: same identity as an earlier record of this
                          call; ask again once that one is finished */
} idem_mark_t;

typedef struct {
    idem_mark_t mark;
    char prior_mid[IDEM_ENVELOPE_ID_MAX + 1]; /* message_id of the done mark */
    size_t prior_mid_len;                     /* its bytes (NULs are data) */
    char detail[128];
} idem_store_result_t;

/* A new store for conf (borrowed; must outlive the store). m may be NULL.
 * Does not connect: the first call connects. Never NULL. */
idem_store_t *idem_store_new(const idem_conf_t *conf, idem_metrics_t *m);
void idem_store_destroy(idem_store_t *s); /* NULL is a no-op */

/* Connects (AUTH, SELECT, SCRIPT LOAD) if not connected. Returns 0, or -1
 * with errstr; every error here is retriable (infrastructure). */
int idem_store_connect(idem_store_t *s, char *errstr, size_t errstr_size);

/* Drops the connection (after an error); the next call reconnects. */
void idem_store_disconnect(idem_store_t *s);

/* Ledger handler: for each of the n envelopes (borrowed), atomically
 * check the dedup mark, apply the ledger increment and set the done mark
 * (one script per chunk, chunks pipelined in one round trip). Fills
 * results[n]. Returns 0, or -1 (retriable; nothing about the batch is
 * known, but every record is either fully applied or untouched). */
int idem_store_ledger_apply(idem_store_t *s, const idem_envelope_t *const *env,
                            size_t n, idem_store_result_t *results,
                            char *errstr, size_t errstr_size);

/* The ledger call in two halves, so the caller can work while Redis runs
 * the script: _send writes the whole pipelined request, _recv reads its
 * replies into results[n] (n as sent). One request in flight at a time.
 * Same results and failures as idem_store_ledger_apply; after a failed
 * _recv some chunks may have been applied, which their marks reveal when
 * the caller sends them again. */
int idem_store_ledger_send(idem_store_t *s, const idem_envelope_t *const *env,
                           size_t n, char *errstr, size_t errstr_size);
int idem_store_ledger_recv(idem_store_t *s, size_t n,
                           idem_store_result_t *results, char *errstr,
                           size_t errstr_size);

/* Forward handler, step 1: claim each record with a lease
 * "lease:<owner>:<message_id>" for dedup.lease.ms, unless already done
 * (IDEM_MARK_DONE), leased by another owner (IDEM_MARK_BUSY) or claimed
 * by an earlier record of this call (IDEM_MARK_AGAIN). A lease of the same
 * owner is re-claimed. */
int idem_store_claim(idem_store_t *s, const char *owner,
                     const idem_envelope_t *const *env, size_t n,
                     idem_store_result_t *results, char *errstr,
                     size_t errstr_size);

/* Forward handler, step 3 (after the effect was acknowledged): turns our
 * lease into the done mark. IDEM_MARK_NEW when marked (or the lease had
 * expired unclaimed, or it was already done), IDEM_MARK_LOST when another
 * owner holds the lease now (fenced). */
int idem_store_mark_done(idem_store_t *s, const char *owner,
                         const idem_envelope_t *const *env, size_t n,
                         idem_store_result_t *results, char *errstr,
                         size_t errstr_size);

/* verify: calls cb(currency, user_id, minor, opaque) for every ledger
 * field of every currency hash under the prefix. Returns 0 or -1. */
int idem_store_ledger_scan(idem_store_t *s,
                           void (*cb)(const char *currency, const char *user_id,
                                      int64_t minor, void *opaque),
                           void *opaque, char *errstr, size_t errstr_size);

/* verify: the value of <prefix>ledger:applied (0 when absent). */
int idem_store_applied_get(idem_store_t *s, int64_t *applied, char *errstr,
                           size_t errstr_size);

#endif
