/* partrig: the partition layout's Redis side driven without a loop, for
 * the it tests of the chunk script (test_partstate, test_layout,
 * test_clusterchunk): test records with the ledger's five arguments, their
 * marks, a store and partstate with the ledger's effect, one chunk of one
 * partition, a first position, and a command's reply as text. */
#ifndef TH_PARTRIG_H
#define TH_PARTRIG_H

#include <hiredis.h>
#include <stddef.h>
#include <stdint.h>

#include "conf/conf.h"
#include "redis/partstate.h"
#include "redis/store.h"

/* A test record: identity, message id, currency, user, amount. */
typedef struct {
    const char *id, *mid, *cur, *user, *amt;
} th_trec_t;

/* The ledger's five arguments of a th_trec_t (idem_store_args_fn). */
size_t th_trec_args(const void *rec, const char **argv, size_t *argvlen,
                    void *opaque);

/* A mark: byte i is seed * 31 + i, the last four the message id's digest
 * (the "moved" bit clear). */
void th_mark_of(uint8_t m[16], int seed);

/* A store on conf with the ledger's effect (records: th_trec_t) and its
 * partstate; asserts (Criterion) that both start. */
void th_partrig_start(const idem_conf_t *conf, idem_store_t **store,
                      idem_partstate_t **ps);

/* One chunk of t:<part>: n records of recs, marks seeded from seed0 (record
 * i: seed0 + i), the owner epoch, the offset the stored position must
 * hold, and the new position's offset (-1: leave it). *window (may be
 * NULL) gets the window Redis answered. idem_partstate_chunk's value. */
int th_partrig_chunk(idem_partstate_t *ps, int32_t part, int64_t epoch,
                     int64_t expect, int64_t newoff, const th_trec_t *recs,
                     size_t n, int seed0, idem_partstate_result_t *res,
                     int64_t *window, char *err, size_t errsz);

/* Writes the first position of t:<part> (offset off), as the loop does
 * before its first effect; asserts that it is written. */
void th_partrig_first_position(idem_store_t *store, int32_t part, int64_t off);

/* The reply of a command (format fmt with up to two string arguments) on
 * cli as text: "" for nil, an integer as its digits. The text lives until
 * four more calls; asserts that Redis answered. */
char *th_reply_text(redisContext *cli, const char *fmt, const char *a,
                    const char *b);

#endif
