/* gen: deterministic payment test traffic (valid payments, duplicates of
 * both kinds, poison of every reason) and the expectations it implies. */
#ifndef IDEM_GEN_H
#define IDEM_GEN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

typedef struct idem_gen_s idem_gen_t;

#define IDEM_GEN_CURRENCIES_MAX 64

/* Generator options; idem_gen_opts_init() fills the defaults. */
typedef struct {
    uint64_t seed; /* same seed + options => byte-identical records */
    int64_t count; /* primary records: unique payments + poison (1..1e9) */
    int64_t users; /* user_id is user-1 .. user-<users> (1..1e9) */
    const char *currencies;  /* comma list of 3 upper-case letters; borrowed */
    double duplicates;       /* 0..1: extra records = round(count * F) copies
                                of earlier valid payments */
    double poison;           /* 0..1: poison = round(count * F) of count */
    int64_t too_large_bytes; /* value size of too-large poison; default is
                                the processor's message.max.bytes + 1 */
} idem_gen_opts_t;

typedef enum {
    IDEM_GEN_PAYMENT = 0, /* a unique valid payment (the ledger applies it) */
    IDEM_GEN_DUPLICATE,   /* a copy of an earlier payment (dup_kind says how) */
    IDEM_GEN_POISON,      /* can never succeed (reason says why) */
} idem_gen_kind_t;

/* One generated record. Every pointer is borrowed from the generator and
 * valid until the next idem_gen_next() or idem_gen_destroy(). */
typedef struct {
    const char *key; /* Kafka key (an order_id); never NULL */
    size_t key_len;
    const char *value; /* bytes, not NUL-terminated for our purposes */
    size_t value_len;
    const char *hdr_message_id;      /* header value, NULL = no header */
    const char *hdr_idempotency_key; /* header value, NULL = no header */
    idem_gen_kind_t kind;
    int dup_kind;           /* idem_dup_kind_t when kind == DUPLICATE */
    int reason;             /* idem_reason_t when kind == POISON */
    int variant;            /* which flavour of the reason (0..) */
    int64_t index;          /* position in the stream, from 0 */
    int64_t original_index; /* DUPLICATE: index of the original payment */
} idem_gen_record_t;

/* Fills the defaults: seed 1, count 1000, users 100, currencies "EUR", no
 * duplicates or poison, too_large_bytes = message.max.bytes default + 1. */
void idem_gen_opts_init(idem_gen_opts_t *opts);

/* Parses and checks a currency list ("TRY,EUR,USD": 3 upper-case letters
 * each, at most IDEM_GEN_CURRENCIES_MAX). Returns 0 or -1 with errstr. */
int idem_gen_currencies_check(const char *list, char *errstr,
                              size_t errstr_size);

/* A generator for opts (copied; the currencies string too). Returns NULL
 * with errstr naming the option when an option is out of range. The caller
 * frees it with idem_gen_destroy(). */
idem_gen_t *idem_gen_new(const idem_gen_opts_t *opts, char *errstr,
                         size_t errstr_size);

/* Number of records the generator emits in all (count + duplicates). */
int64_t idem_gen_total(const idem_gen_t *gen);

/* Produces the next record into *rec. Returns 1, or 0 when the stream is
 * over (rec untouched). */
int idem_gen_next(idem_gen_t *gen, idem_gen_record_t *rec);

/* The expectations for the records emitted so far, in the shape `verify`
 * reads: {"sent","unique","duplicates":{"redelivery","resend"},
 * "poison":{<every reason>},"ledger":{CUR:{user:minor units}},"applied"}.
 * Returns a new reference (caller json_decref()s). */
json_t *idem_gen_expect(const idem_gen_t *gen);

/* Writes idem_gen_expect() as indented JSON with sorted keys to fp, or to
 * the file at path ("-" = stdout). Return 0, or -1 with errstr. */
int idem_gen_expect_fwrite(const idem_gen_t *gen, FILE *fp, char *errstr,
                           size_t errstr_size);
int idem_gen_expect_write(const idem_gen_t *gen, const char *path, char *errstr,
                          size_t errstr_size);

/* Frees the generator; NULL is a no-op. */
void idem_gen_destroy(idem_gen_t *gen);

#endif
