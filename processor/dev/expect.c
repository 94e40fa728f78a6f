/* expect: what the processor will make of records that `produce --input`
 * sends, judged by the processor's own envelope parser: the expectation
 * file `verify` compares with (README, "The expectation file"). */
#include "dev/expect.h"
#include "input/envelope.h"
#include "base/outcome.h"
#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct idem_expect_s {
    size_t max_bytes;
    json_t *ledger;  /* {currency: {user: minor units}} */
    json_t *applier; /* identity -> message_id of the record that applied it */
    int64_t sent, unique;
    int64_t dup[IDEM_DUP_CNT];
    int64_t poison[IDEM_REASON_CNT];
};

idem_expect_t *idem_expect_new(size_t max_bytes)
{
    idem_expect_t *e = idem_xcalloc(1, sizeof(*e));
    e->max_bytes = max_bytes;
    e->ledger = json_object();
    e->applier = json_object();
    return e;
}

void idem_expect_add(idem_expect_t *e, const void *value, size_t len)
{
    idem_envelope_t env;
    idem_reason_t reason;
    char err[256];
    e->sent++;
    if (idem_envelope_parse(value, len, NULL, 1, e->max_bytes, &env, &reason,
                            err, sizeof(err))) {
        e->poison[reason]++;
        return;
    }
    json_t *prior = json_object_get(e->applier, env.identity);
    if (prior) {
        int same = !strcmp(json_string_value(prior), env.message_id);
        e->dup[same ? IDEM_DUP_REDELIVERY : IDEM_DUP_RESEND]++;
        return;
    }
    json_object_set_new(e->applier, env.identity, json_string(env.message_id));
    e->unique++;
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
    return json_pack("{sI sI so so sO sI}", "sent", (json_int_t)e->sent,
                     "unique", (json_int_t)e->unique, "duplicates", dups,
                     "poison", poison, "ledger", e->ledger, "applied",
                     (json_int_t)e->unique);
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
    free(e);
}
