/* handler: the interface every effect implements (ledger, forward, script,
 * webhook, plugin) and the registry the loop, `help config`, `check-config`
 * and the README table read. The loop never asks which handler it runs.
 *
 * How the loop drives a handler (one thread, the consumer's; nothing here
 * needs a lock, and no op may block for long: the loop keeps polling Kafka
 * so the group membership stays alive):
 *
 *   validate(conf, arg)         check-config and run, before anything starts
 *   start(ctx)                  once, after the store and metrics exist
 *   loop:  room()               how many it can start now (may be NULL)
 *          submit(batch)        records that are due, non-blocking
 *          collect(results)     what finished since, non-blocking
 *   drain(deadline)             revoke and shutdown: finish or abandon
 *   stop()                      once, at the end
 *
 * Two kinds of effect, declared by the handler (ops->effect), decide who
 * sets the dedup mark. The loop itself never reads ops->effect: its effect
 * adapter (loop/apply.c) does, and gives the loop one protocol for both.
 *
 * IDEM_EFFECT_IN_REDIS (ledger, script): the effect runs inside the dedup
 *   script in Redis, so effect and mark commit together. The handler gets
 *   every due record (new and duplicate alike) and reports DONE (applied
 *   now), DUPLICATE (a done mark existed; prior message id given), BUSY (an
 *   external handler's lease on the identity), REJECT or OUTAGE. It talks
 *   to Redis through ctx->store (idem_store_script_*), one request in flight
 *   at a time, and writes the positions `pos` the loop hands to submit in
 *   the same request, after the effects (docs/design.md, "Positions in
 *   Redis").
 *
 * IDEM_EFFECT_EXTERNAL (forward, webhook, plugin): the adapter claims each
 *   record with a lease in Redis first (duplicates and records leased
 *   elsewhere never reach the handler), submits the claimed ones, and turns
 *   the lease into the done mark after the handler reports DONE. A crash
 *   between effect and mark leaves a lease that expires: the effect may be
 *   repeated (at least once), never lost. These handlers never touch Redis
 *   (ctx->store is NULL for them) and never see `pos` (npos is 0).
 *
 * Records: the loop owns every idem_record_t. A record passed to submit
 * stays valid, at the same address, until the loop has collected its one
 * result, or until drain returns (after which the handler must hold no
 * record pointer). Each submitted record gets exactly one result unless
 * drain abandons it. Records of one partition are submitted in offset
 * order; a handler that keeps several in flight may finish them in any
 * order (the loop commits only the contiguous finished prefix), but should
 * apply a partition's effects in submit order where order is observable
 * (forward writes them in order).
 *
 * Results (idem_result_t.kind) and what the loop does with them:
 *   DONE       finished: counted as processed (external: marked done first)
 *   DUPLICATE  finished: counted as a redelivery (same message id as the
 *              prior mark) or a resend (a different one, or none known)
 *   BUSY       tried again after dedup.lease.ms / 4, not counted
 *   REJECT     dead-lettered as handler-rejected, `detail` in dlq.error
 *   RETRY      tried again after retry_after_ms (0: the loop's backoff,
 *              retry.backoff.*), counted against retry.max.attempts, then
 *              dead-lettered as max-retries with `detail`
 *   OUTAGE     infrastructure down (`detail` says what): the record is
 *              tried again, not counted; the loop pauses input, reports not
 *              ready with `detail` and backs off until an attempt succeeds
 *
 * Config keys: a handler declares its keys in ops->keys (idem_conf_key_t,
 * conf.h), named "<handler>.<key>" (webhook.url, script.file); the conf
 * accepts, validates (type, range, enum) and stores them like the table's
 * own keys, `help config`, `check-config` and the README table list them
 * from here, and the handler reads them with idem_conf_str/idem_conf_int
 * (conf.h). A key marked required is required only when its handler runs.
 * Cross-key checks go in validate.
 *
 * Metrics: ctx->metrics (metrics.h) is the process's registry; the loop
 * already counts outcomes, duplicates, retries, dead letters, latency and
 * batch sizes for every handler, so a handler adds only its own (webhook:
 * requests by status class, request latency). */
#ifndef IDEM_HANDLER_H
#define IDEM_HANDLER_H

#include <stddef.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

#include "conf/conf.h"
#include "input/envelope.h"
#include "obs/metrics.h"
#include "redis/store.h"

/* Bumped on any incompatible change of the structs below. */
#define IDEM_HANDLER_API_VERSION 2

/* One consumed record as a handler sees it (all borrowed from the loop;
 * see "Records" above for how long). Byte strings have lengths: identity,
 * message id, key and value may hold NUL bytes, which are data. */
typedef struct idem_record_s {
    const char *topic;
    int32_t partition;
    int64_t offset;
    int64_t timestamp; /* ms since the epoch; -1 when the record has none */
    const void *key;   /* NULL when the record has no key */
    size_t key_len;
    const void *value; /* NULL for a null value (envelope.format=bytes) */
    size_t value_len;
    const char *identity; /* dedup identity (envelope.identity), never empty */
    size_t identity_len;
    const char *message_id; /* envelope.message.id; message_id_len 0: none */
    size_t message_id_len;
    int value_is_object; /* 1: value is a JSON object envelope.format=json
                            parsed (forward adds processed_at only then) */
    const rd_kafka_headers_t *headers; /* may be NULL; name -> value with
                                          rd_kafka_header_get_all */
    const idem_envelope_t *env;    /* parsed envelope: payment fields set when
                                      the handler declares needs_payment */
    const rd_kafka_message_t *msg; /* the consumed message itself */
    void *loop;                    /* the loop's; handlers leave it alone */
} idem_record_t;

typedef enum {
    IDEM_RESULT_DONE = 0,
    IDEM_RESULT_DUPLICATE,
    IDEM_RESULT_BUSY,
    IDEM_RESULT_REJECT,
    IDEM_RESULT_RETRY,
    IDEM_RESULT_OUTAGE,
} idem_result_kind_t;

/* Longest detail kept: a webhook's status line and the first 512 bytes of
 * the response body fit. */
#define IDEM_RESULT_DETAIL_MAX 640

/* What became of one submitted record. */
typedef struct {
    idem_record_t *rec; /* the record, as submitted */
    idem_result_kind_t kind;
    int64_t retry_after_ms; /* RETRY: wait at least this long (Retry-After);
                               0: the loop's backoff */
    char prior_mid[IDEM_ENVELOPE_ID_MAX + 1]; /* DUPLICATE: message id of the
                                                 done mark (bytes) */
    size_t prior_mid_len;                     /* 0: unknown */
    char detail[IDEM_RESULT_DETAIL_MAX];      /* REJECT/RETRY/OUTAGE: why,
                                                 NUL-terminated, one line */
} idem_result_t;

typedef enum {
    IDEM_EFFECT_IN_REDIS = 0, /* effect and mark in one Redis script */
    IDEM_EFFECT_EXTERNAL,     /* lease -> effect -> mark, by the loop */
} idem_effect_kind_t;

/* What start gets (borrowed; lives until stop returns). */
typedef struct {
    const idem_conf_t *conf;
    const char *arg;     /* the text after "<name>:" in handler= ("" if none):
                            plugin:PATH.so gives "PATH.so" */
    idem_store_t *store; /* IDEM_EFFECT_IN_REDIS only (else NULL): the loop's
                            Redis connection, shared; one request in flight */
    idem_metrics_t *metrics; /* may be NULL (unit tests) */
    const char *member_id;   /* conf->member_id, for logs */
} idem_handler_ctx_t;

typedef struct idem_handler_ops_s {
    int api_version;  /* IDEM_HANDLER_API_VERSION */
    const char *name; /* handler=<name>, or handler=<name>:<arg> */
    int takes_arg;    /* 1: "<name>:<arg>" is required (plugin) */
    idem_effect_kind_t effect;
    int needs_payment;   /* the envelope must hold user_id, amount, currency
                            (ledger); else any value passes (per
                            envelope.format) */
    int ignores_headers; /* 1: never reads idem_record_t.headers (then NULL
                            unless the envelope needed them), so the loop
                            does not parse them (ledger) */
    const char *doc;     /* one line for `help config` and the README */
    const idem_conf_key_t *keys; /* its keys, ending with {NULL}; may be NULL */
    const char *fields_key; /* NULL, or one of its keys holding a comma list
                               of JSON Pointers (script.fields): the loop
                               extracts those values from each record's
                               JSON value into rec->env->fields (envelope.h,
                               idem_envelope_rules_fields) */
    const char *key_prefix; /* NULL, or a prefix ("plugin.") under which the
                               conf accepts any key as text for this handler
                               (keys only known at run time); its validate
                               rejects the ones it does not know. Read them
                               with idem_conf_str. */

    /* Cross-key checks of a configuration (no network, no files beyond
     * reading its own, e.g. compiling script.file): check-config and run
     * call it when this handler is selected. May be NULL. Returns 0, or -1
     * with errstr naming the key and the problem ("script.file: x.lua:3:
     * unexpected symbol near 'end'"); run then exits 2. */
    int (*validate)(const idem_conf_t *conf, const char *arg, char *errstr,
                    size_t errstr_size);

    /* Creates the handler's state. Returns it (never NULL on success; a
     * handler without state returns any non-NULL pointer), or NULL with
     * errstr: the handler cannot run (fatal: `run` logs "cannot start" and
     * exits 1; configuration errors belong in validate, exit 2). */
    void *(*start)(const idem_handler_ctx_t *ctx, char *errstr,
                   size_t errstr_size);

    /* Hands over recs[n] (n >= 1), returns at once. The handler keeps the
     * pointers (see "Records"); results come through collect. pos[npos]
     * (borrowed, this call only) are positions an IN_REDIS handler writes
     * in the same request after the effects (idem_store_script_send); the
     * loop counts them stored once the request's results were collected
     * without an OUTAGE. The loop calls submit for an IN_REDIS handler
     * only while inflight() is 0. Returns 0 (all taken), or -1 with errstr
     * when none was taken because the infrastructure is down (outage: the
     * loop backs off and submits them again). */
    int (*submit)(void *h, idem_record_t *const *recs, size_t n,
                  const idem_store_pos_t *pos, size_t npos, char *errstr,
                  size_t errstr_size);

    /* Moves the results ready now into out[] (room for `max`, which the
     * loop makes at least inflight()), waiting at most timeout_ms for the
     * first one (0: do not wait; the loop passes 0 while it has other work
     * and a short wait when idle). Returns how many it wrote. An IN_REDIS
     * handler returns all results of its request in one call; when that
     * request failed as a whole, each of its records gets OUTAGE (and, if
     * it may have been applied, a later submit finds its mark). */
    size_t (*collect)(void *h, idem_result_t *out, size_t max, int timeout_ms);

    /* Records submitted whose result was not collected yet. */
    size_t (*inflight)(void *h);

    /* How many more records the handler can start now (not merely queue):
     * the loop claims and submits at most that many per pass, so a record
     * leased for an external effect starts at once instead of waiting in
     * the handler's queue while its lease (dedup.lease.ms) runs out
     * (webhook: webhook.max.inflight minus the requests in flight or
     * queued). 0: none now (the loop collects and asks again). May be NULL:
     * no limit. An IN_REDIS handler leaves it NULL (one request at a time,
     * nothing leased). */
    size_t (*room)(void *h);

    /* Revoke and shutdown: finish what is in flight, waiting until
     * deadline_ms (idem_now_ms clock) at most, then abandon the rest (an
     * external effect may still happen; its lease expires unmarked, so it
     * is done again by whoever owns the partition next). Results of what
     * finished stay collectable; after drain (and a collect), the handler
     * holds no record pointer and inflight() is 0. */
    void (*drain)(void *h, int64_t deadline_ms);

    /* 1 with the reason in errstr when the handler can never work again
     * (a producer's fatal error): the loop stops and `run` exits 1. Else
     * 0. Called every loop turn; may be NULL. */
    int (*fatal)(void *h, char *errstr, size_t errstr_size);

    /* Frees the state (after drain). NULL-safe. */
    void (*stop)(void *h);

    /* Where the effect of this configuration can be read back as records,
     * for verify and `produce --expect` (which never ask which handler
     * runs): the topic each applied record is written to, key and value
     * (borrowed from conf), with *as_sent 1 when the value goes unchanged
     * (forward: output.topic; 0 with forward.processed.at), or NULL when
     * the effect is not a topic. May be NULL: not a topic. */
    const char *(*output)(const idem_conf_t *conf, int *as_sent);

    /* 1: the handler applies a partition's effects in submit order itself
     * (forward: one idempotent producer writes them in order), so
     * `ordering` holds nothing back for it; 0 (webhook, plugin): the
     * loop's effect adapter starts a key's records one after the other
     * (ordering=key, the default; loop/due.h). */
    int keeps_order;
} idem_handler_ops_t;

/* The handlers this build knows. The registry is the array in handler.c:
 * one line per handler; each handler's file is processor/handlers/<name>.c
 * with its tests in tests/<tier>/test_<name>.c. */
extern const idem_handler_ops_t idem_handler_ledger;
extern const idem_handler_ops_t idem_handler_forward;
extern const idem_handler_ops_t idem_handler_script;
extern const idem_handler_ops_t idem_handler_webhook;
extern const idem_handler_ops_t idem_handler_plugin;

/* The i-th registered handler (0, 1, ...), NULL past the last. */
const idem_handler_ops_t *idem_handler_at(size_t i);

/* The handler a `handler=` value names: "<name>" or "<name>:<arg>" (the
 * arg, borrowed from `value`, in *arg; "" when none). Returns NULL with
 * errstr listing the known names when none matches, or when a handler
 * that takes an arg got none (or the reverse). */
const idem_handler_ops_t *idem_handler_find(const char *value, const char **arg,
                                            char *errstr, size_t errstr_size);

/* The handler that owns config key `key` ("webhook.url" -> webhook's
 * declaration), or NULL. *decl gets the key's declaration. */
const idem_handler_ops_t *idem_handler_key(const char *key,
                                           const idem_conf_key_t **decl);

/* The loop's side of results, for handlers that want to fill one. */
void idem_result_set(idem_result_t *res, idem_record_t *rec,
                     idem_result_kind_t kind, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

const char *idem_result_kind2str(idem_result_kind_t k);

#endif
