/* expect: the expectation file (expect.h): predicting it from the records
 * `produce --input` sends, writing and loading it. */
#include "dev/expect.h"
#include "input/envelope.h"
#include "kafka/produce.h"
#include "base/outcome.h"
#include "base/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct idem_expect_s {
    const idem_envelope_rules_t *rules;
    int flags;       /* IDEM_EXPECT_* */
    json_t *ledger;  /* {currency: {user: minor units}} */
    json_t *applier; /* identity -> message_id of the record that applied it */
    json_t *ids;     /* the applied identities, in order */
    json_t *output;  /* identity -> value (IDEM_EXPECT_OUTPUT) */
    int64_t sent, unique;
    int64_t dup[IDEM_DUP_CNT];
    int64_t poison[IDEM_REASON_CNT];
};

idem_expect_t *idem_expect_new(const idem_envelope_rules_t *rules, int flags)
{
    idem_expect_t *e = idem_xcalloc(1, sizeof(*e));
    e->rules = rules;
    e->flags = flags;
    e->ledger = json_object();
    e->applier = json_object();
    e->ids = json_array();
    e->output = json_object();
    return e;
}

void idem_expect_add(idem_expect_t *e, const void *value, size_t len,
                     const void *key, size_t key_len,
                     const char *hdr_message_id,
                     const char *hdr_idempotency_key)
{
    idem_envelope_t env = {.fields =
                               NULL}; /* no fields asked: read leaves them */
    idem_reason_t reason;
    char err[256];
    e->sent++;
    rd_kafka_headers_t *h =
        idem_kafka_envelope_headers(hdr_message_id, hdr_idempotency_key);
    int bad = idem_envelope_read(e->rules, value, len, h, key, key_len, &env,
                                 &reason, err, sizeof(err));
    if (h)
        rd_kafka_headers_destroy(h);
    if (bad) {
        e->poison[reason]++;
        return;
    }
    idem_envelope_term(&env);
    json_t *prior =
        json_object_getn(e->applier, env.identity, env.identity_len);
    if (prior) {
        /* Without a message id every duplicate is a resend, as the
         * member counts it. */
        int same = env.message_id_len && json_is_string(prior) &&
                   json_string_length(prior) == env.message_id_len &&
                   !memcmp(json_string_value(prior), env.message_id,
                           env.message_id_len);
        e->dup[same ? IDEM_DUP_REDELIVERY : IDEM_DUP_RESEND]++;
        return;
    }
    json_t *mid = json_stringn(env.message_id, env.message_id_len);
    json_object_setn_new(e->applier, env.identity, env.identity_len,
                         mid ? mid : json_null());
    e->unique++;
    json_t *id = json_stringn(env.identity, env.identity_len);
    if (id)
        json_array_append_new(e->ids, id);
    if (id && (e->flags & IDEM_EXPECT_OUTPUT)) {
        json_t *v = json_stringn(value ? value : "", value ? len : 0);
        if (v)
            json_object_setn_new(e->output, env.identity, env.identity_len, v);
    }
    if (!(e->flags & IDEM_EXPECT_LEDGER))
        return;
    json_t *cur = json_object_get(e->ledger, env.currency);
    if (!cur) {
        cur = json_object();
        json_object_set_new(e->ledger, env.currency, cur);
    }
    json_t *v = json_object_get(cur, env.user_id);
    json_object_set_new(
        cur, env.user_id,
        json_integer((v ? json_integer_value(v) : 0) + env.amount_minor));
}

json_t *idem_expect_json(const idem_expect_t *e)
{
    json_t *dups = json_object();
    for (int k = 0; k < IDEM_DUP_CNT; k++)
        json_object_set_new(dups, idem_dup_kind2str(k),
                            json_integer(e->dup[k]));
    json_t *poison = json_object();
    for (int r = 0; r < IDEM_REASON_CNT; r++)
        json_object_set_new(poison, idem_reason2str(r),
                            json_integer(e->poison[r]));
    json_t *doc =
        json_pack("{sI sI so so sI sO}", "sent", (json_int_t)e->sent, "unique",
                  (json_int_t)e->unique, "duplicates", dups, "poison", poison,
                  "applied", (json_int_t)e->unique, "identities", e->ids);
    if (e->flags & IDEM_EXPECT_LEDGER)
        json_object_set(doc, "ledger", e->ledger);
    if (e->flags & IDEM_EXPECT_OUTPUT)
        json_object_set(doc, "output", e->output);
    return doc;
}

int idem_expect_write(json_t *doc, const char *path, char *errstr,
                      size_t errstr_size)
{
    int to_stdout = !strcmp(path, "-");
    FILE *fp = to_stdout ? stdout : fopen(path, "w");
    if (!fp) {
        snprintf(errstr, errstr_size, "--expect: cannot write \"%s\": %m",
                 path);
        return -1;
    }
    int bad = json_dumpf(doc, fp, JSON_INDENT(2) | JSON_SORT_KEYS) ||
              fputc('\n', fp) == EOF || fflush(fp);
    if (!to_stdout && fclose(fp))
        bad = 1;
    if (bad) {
        snprintf(errstr, errstr_size, "--expect: cannot write \"%s\": %m",
                 path);
        return -1;
    }
    return 0;
}

void idem_expect_destroy(idem_expect_t *e)
{
    if (!e)
        return;
    json_decref(e->ledger);
    json_decref(e->applier);
    json_decref(e->ids);
    json_decref(e->output);
    free(e);
}

/* Checks that `obj` maps names to integers; -1 with errstr naming the
 * member otherwise. */
static int expect_int_map(const char *path, const char *what, json_t *obj,
                          char *errstr, size_t errstr_size)
{
    const char *k;
    json_t *v;
    json_object_foreach(obj, k, v)
    {
        if (!json_is_integer(v)) {
            snprintf(errstr, errstr_size,
                     "--expect %s: %s \"%s\" must be an integer", path, what,
                     k);
            return -1;
        }
    }
    return 0;
}

static int is_redis_value(json_t *v)
{
    return json_is_string(v) || json_is_number(v) || json_is_null(v);
}

/* The members of an expectation beyond the counts: NULL when they are
 * well formed, else what is wrong (written to buf). */
static const char *expect_members_bad(json_t *e, char *buf, size_t size)
{
    json_t *ids = json_object_get(e, "identities");
    json_t *output = json_object_get(e, "output");
    json_t *redis = json_object_get(e, "redis");
    json_t *v, *fv;
    size_t i;
    const char *k, *f;
    if (ids && !json_is_array(ids))
        return "\"identities\" must be an array of strings";
    json_array_foreach(ids, i, v)
    {
        if (!json_is_string(v)) {
            snprintf(buf, size, "identities[%zu] must be a string", i);
            return buf;
        }
    }
    if (output && !json_is_object(output))
        return "\"output\" must be an object of identity: value";
    json_object_foreach(output, k, v)
    {
        if (!json_is_string(v)) {
            snprintf(buf, size, "output \"%.200s\" must be a string", k);
            return buf;
        }
    }
    if (redis && !json_is_object(redis))
        return "\"redis\" must be an object of key: value or key: {field: "
               "value}";
    json_object_foreach(redis, k, v)
    {
        if (is_redis_value(v))
            continue;
        if (!json_is_object(v)) {
            snprintf(buf, size,
                     "redis \"%.200s\" must be a string, a number, null or an "
                     "object of field: value",
                     k);
            return buf;
        }
        json_object_foreach(v, f, fv)
        {
            if (!is_redis_value(fv)) {
                snprintf(buf, size,
                         "redis \"%.200s\" field \"%.200s\" must be a string, "
                         "a number or null",
                         k, f);
                return buf;
            }
        }
    }
    return NULL;
}

json_t *idem_expect_load(const char *path, char *errstr, size_t errstr_size)
{
    FILE *fp = fopen(path, "r");
    if (!fp) {
        snprintf(errstr, errstr_size, "--expect %s: cannot open: %s", path,
                 strerror(errno));
        return NULL;
    }
    /* fopen opens a directory for reading; json_loadf would then call it
     * an empty file ("not JSON ... near end of file"). */
    struct stat st;
    if (fstat(fileno(fp), &st) == 0 && S_ISDIR(st.st_mode)) {
        fclose(fp);
        snprintf(errstr, errstr_size, "--expect %s: cannot read: %s", path,
                 strerror(EISDIR));
        return NULL;
    }
    json_error_t jerr;
    json_t *e = json_loadf(fp, 0, &jerr);
    fclose(fp);
    if (!e) {
        snprintf(errstr, errstr_size,
                 "--expect %s:%d:%d: not JSON: %s (write it with 'idemproc "
                 "produce --expect')",
                 path, jerr.line, jerr.column, jerr.text);
        return NULL;
    }
    json_t *ledger = json_object_get(e, "ledger");
    json_t *applied = json_object_get(e, "applied");
    json_t *poison = json_object_get(e, "poison");
    const char *missing =
        !json_is_object(e)                  ? "a JSON object"
        : !json_is_integer(applied)         ? "an integer \"applied\""
        : ledger && !json_is_object(ledger) ? "\"ledger\" as an object"
        : poison && !json_is_object(poison) ? "\"poison\" as an object"
                                            : NULL;
    if (missing) {
        snprintf(errstr, errstr_size,
                 "--expect %s: needs %s (README, \"The expectation file\")",
                 path, missing);
        json_decref(e);
        return NULL;
    }
    /* A misspelt member ("dlq" for "poison") would check nothing. */
    static const char *const known[] = {"sent",   "unique",  "duplicates",
                                        "poison", "applied", "identities",
                                        "ledger", "output",  "redis"};
    const char *mk;
    json_t *mv;
    json_object_foreach(e, mk, mv)
    {
        size_t i = 0;
        while (i < sizeof(known) / sizeof(known[0]) && strcmp(known[i], mk))
            i++;
        if (i == sizeof(known) / sizeof(known[0])) {
            snprintf(errstr, errstr_size,
                     "--expect %s: unknown member \"%.100s\" (known: sent, "
                     "unique, duplicates, poison, applied, identities, "
                     "ledger, output, redis)",
                     path, mk);
            json_decref(e);
            return NULL;
        }
    }
    if (json_integer_value(applied) < 0) {
        snprintf(errstr, errstr_size,
                 "--expect %s: \"applied\" must not be negative", path);
        json_decref(e);
        return NULL;
    }
    const char *cur;
    json_t *users;
    json_object_foreach(ledger, cur, users)
    {
        if (!json_is_object(users)) {
            snprintf(errstr, errstr_size,
                     "--expect %s: ledger \"%s\" must be an object of "
                     "user: minor units",
                     path, cur);
            json_decref(e);
            return NULL;
        }
        char what[64];
        snprintf(what, sizeof(what), "ledger %.16s user", cur);
        if (expect_int_map(path, what, users, errstr, errstr_size)) {
            json_decref(e);
            return NULL;
        }
    }
    if (poison &&
        expect_int_map(path, "poison reason", poison, errstr, errstr_size)) {
        json_decref(e);
        return NULL;
    }
    const char *pr;
    json_t *pc;
    json_object_foreach(poison, pr, pc)
    {
        const char *why = idem_reason_parse(pr) < 0    ? "is not a DLQ reason"
                          : json_integer_value(pc) < 0 ? "must not be negative"
                                                       : NULL;
        if (why) {
            snprintf(errstr, errstr_size, "--expect %s: poison \"%.100s\" %s",
                     path, pr, why);
            json_decref(e);
            return NULL;
        }
    }
    char buf[512];
    const char *bad = expect_members_bad(e, buf, sizeof(buf));
    if (bad) {
        snprintf(errstr, errstr_size,
                 "--expect %s: %s (README, \"The expectation file\")", path,
                 bad);
        json_decref(e);
        return NULL;
    }
    return e;
}
