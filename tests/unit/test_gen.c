/* test_gen: the traffic generator: determinism, poison of every reason,
 * duplicates of both kinds and placements, and its expectations. */
#include "conf/conf.h"
#include "input/envelope.h"
#include "dev/expect.h"
#include "dev/gen.h"
#include "testlib.h"
#include "base/outcome.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A generated record with its own copies of the borrowed bytes. */
typedef struct {
    idem_gen_record_t rec;
    char *key, *value, *mid, *ikey;
} rec_copy_t;

static char *dupn(const char *s, size_t n)
{
    if (!s)
        return NULL;
    char *d = malloc(n + 1);
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

/* Runs a generator to its end; returns the records (count in *n). */
static rec_copy_t *gen_all(const idem_gen_opts_t *o, size_t *n, json_t **expect)
{
    char err[256];
    idem_gen_t *g = idem_gen_new(o, err, sizeof(err));
    cr_assert(g, "%s", err);
    size_t cap = 1024, cnt = 0;
    rec_copy_t *all = malloc(cap * sizeof(*all));
    idem_gen_record_t r;
    while (idem_gen_next(g, &r)) {
        if (cnt == cap)
            all = realloc(all, (cap *= 2) * sizeof(*all));
        all[cnt].rec = r;
        all[cnt].key = dupn(r.key, r.key_len);
        all[cnt].value = dupn(r.value, r.value_len);
        all[cnt].mid = r.hdr_message_id ? strdup(r.hdr_message_id) : NULL;
        all[cnt].ikey =
            r.hdr_idempotency_key ? strdup(r.hdr_idempotency_key) : NULL;
        cnt++;
    }
    cr_assert_eq((int64_t)cnt, idem_gen_total(g));
    if (expect)
        *expect = idem_gen_expect(g);
    idem_gen_destroy(g);
    *n = cnt;
    return all;
}

static void free_all(rec_copy_t *all, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(all[i].key);
        free(all[i].value);
        free(all[i].mid);
        free(all[i].ikey);
    }
    free(all);
}

/* The raw text of "amount" in value (the first occurrence), into buf. */
static int amount_text(const char *value, char *buf, size_t size)
{
    const char *a = strstr(value, "\"amount\":");
    if (!a)
        return -1;
    a += 9;
    size_t n = strcspn(a, ",}");
    if (n >= size)
        return -1;
    memcpy(buf, a, n);
    buf[n] = '\0';
    return 0;
}

/* "D+.DD" with no sign: the generator's only amount form for payments. */
static int amount_is_two_decimals(const char *t)
{
    size_t i = 0;
    while (t[i] >= '0' && t[i] <= '9')
        i++;
    return i > 0 && t[i] == '.' && t[i + 1] >= '0' && t[i + 1] <= '9' &&
           t[i + 2] >= '0' && t[i + 2] <= '9' && t[i + 3] == '\0';
}

/* What the processor makes of a generated record (th_classify): -1 for a
 * valid payment (its currency, user and cents filled), else the reason. */
static int classify(const char *value, size_t len, const char *hdr_mid,
                    const char *hdr_ikey, size_t max_bytes, char *cur,
                    char *user, long long *cents)
{
    idem_envelope_t env;
    int r = th_classify(value, len, hdr_mid, hdr_ikey, max_bytes, &env);
    if (r < 0) {
        snprintf(cur, 8, "%s", env.currency);
        snprintf(user, IDEM_ENVELOPE_ID_MAX + 1, "%s", env.user_id);
        *cents = env.amount_minor;
    }
    return r;
}

static idem_gen_opts_t opts_with(uint64_t seed, int64_t count, double dups,
                                 double poison)
{
    idem_gen_opts_t o;
    idem_gen_opts_init(&o);
    o.seed = seed;
    o.count = count;
    o.duplicates = dups;
    o.poison = poison;
    o.currencies = "TRY,EUR,USD";
    o.users = 50;
    o.too_large_bytes = 4096;
    return o;
}

Test(gen, same_seed_same_bytes_other_seed_other_bytes)
{
    idem_gen_opts_t o = opts_with(7, 3000, 0.2, 0.1);
    size_t n1, n2, n3;
    rec_copy_t *a = gen_all(&o, &n1, NULL);
    rec_copy_t *b = gen_all(&o, &n2, NULL);
    o.seed = 8;
    rec_copy_t *c = gen_all(&o, &n3, NULL);
    cr_assert_eq(n1, n2);
    size_t differ = 0;
    for (size_t i = 0; i < n1; i++) {
        cr_assert_eq(a[i].rec.value_len, b[i].rec.value_len, "record %zu", i);
        cr_assert(!memcmp(a[i].value, b[i].value, a[i].rec.value_len),
                  "record %zu differs", i);
        cr_assert_str_eq(a[i].key, b[i].key);
        cr_assert_eq(!a[i].mid, !b[i].mid);
        if (a[i].mid)
            cr_assert_str_eq(a[i].mid, b[i].mid);
        if (i < n3 && (a[i].rec.value_len != c[i].rec.value_len ||
                       memcmp(a[i].value, c[i].value, a[i].rec.value_len)))
            differ++;
    }
    cr_expect_gt(differ, n1 * 9 / 10, "another seed changes the records");
    free_all(a, n1);
    free_all(b, n2);
    free_all(c, n3);
}

Test(gen, every_poison_reason_and_flavour_and_processor_agrees)
{
    idem_gen_opts_t o = opts_with(3, 2000, 0.1, 0.2);
    size_t n;
    rec_copy_t *all = gen_all(&o, &n, NULL);
    int seen[IDEM_REASON_CNT][8] = {{0}};
    for (size_t i = 0; i < n; i++) {
        rec_copy_t *r = &all[i];
        char cur[8], user[IDEM_ENVELOPE_ID_MAX + 1];
        long long cents;
        int got = classify(r->value, r->rec.value_len, r->mid, r->ikey, 4095,
                           cur, user, &cents);
        cr_assert(r->key && r->rec.key_len > 0, "every record has a key");
        if (r->rec.kind != IDEM_GEN_POISON) {
            cr_assert_eq(got, -1, "record %zu should be valid: %s", i,
                         r->value);
            continue;
        }
        cr_assert_eq(got, r->rec.reason, "record %zu (%s, variant %d): %s", i,
                     idem_reason2str(r->rec.reason), r->rec.variant, r->value);
        seen[r->rec.reason][r->rec.variant]++;
        if (r->rec.reason == IDEM_REASON_NO_IDENTITY)
            cr_assert(!r->mid && !r->ikey, "no-identity has no headers");
        else
            cr_assert(r->mid && r->ikey, "poison keeps its headers");
        if (r->rec.reason == IDEM_REASON_TOO_LARGE)
            cr_assert_eq(r->rec.value_len, 4096);
    }
    cr_assert(seen[IDEM_REASON_TOO_LARGE][0]);
    cr_assert(seen[IDEM_REASON_NOT_JSON][0] && seen[IDEM_REASON_NOT_JSON][1],
              "truncated and invalid UTF-8");
    for (int v = 0; v < 3; v++)
        cr_assert(seen[IDEM_REASON_NOT_OBJECT][v], "not-object %d", v);
    cr_assert(seen[IDEM_REASON_NO_IDENTITY][0]);
    for (int v = 0; v < 6; v++)
        cr_assert(seen[IDEM_REASON_INVALID_FIELD][v], "invalid-field %d", v);
    free_all(all, n);
}

Test(gen, duplicates_of_both_kinds_adjacent_and_far)
{
    idem_gen_opts_t o = opts_with(11, 5000, 0.1, 0.05);
    size_t n;
    rec_copy_t *all = gen_all(&o, &n, NULL);
    int adjacent[IDEM_DUP_CNT] = {0}, far[IDEM_DUP_CNT] = {0};
    for (size_t i = 0; i < n; i++) {
        rec_copy_t *d = &all[i];
        if (d->rec.kind != IDEM_GEN_DUPLICATE)
            continue;
        cr_assert_eq(d->rec.index, (int64_t)i);
        cr_assert(d->rec.original_index >= 0 &&
                  d->rec.original_index < (int64_t)i);
        rec_copy_t *orig = &all[d->rec.original_index];
        cr_assert_eq(orig->rec.kind, IDEM_GEN_PAYMENT,
                     "only valid payments are duplicated");
        int64_t dist = (int64_t)i - d->rec.original_index;
        if (dist == 1)
            adjacent[d->rec.dup_kind]++;
        if (dist >= 200)
            far[d->rec.dup_kind]++;
        cr_assert_str_eq(d->key, orig->key);
        cr_assert_str_eq(d->ikey, orig->ikey);
        if (d->rec.dup_kind == IDEM_DUP_REDELIVERY) {
            cr_assert_str_eq(d->value, orig->value, "byte-identical");
            cr_assert_str_eq(d->mid, orig->mid);
        } else {
            cr_assert_str_neq(d->mid, orig->mid, "a resend has a new id");
            /* Same payload: equal once the message_id is swapped back. */
            char *v = strdup(d->value);
            char *at = strstr(v, d->mid);
            cr_assert(at && strstr(d->value, d->mid) != NULL);
            memcpy(at, orig->mid, 36);
            cr_assert_str_eq(v, orig->value);
            free(v);
        }
    }
    for (int k = 0; k < IDEM_DUP_CNT; k++) {
        cr_expect_gt(adjacent[k], 0, "%s adjacent", idem_dup_kind2str(k));
        cr_expect_gt(far[k], 0, "%s far", idem_dup_kind2str(k));
    }
    free_all(all, n);
}

Test(gen, expect_counts_and_ledger_match_a_recomputation)
{
    idem_gen_opts_t o = opts_with(5, 3000, 0.3, 0.15);
    size_t n;
    json_t *e;
    rec_copy_t *all = gen_all(&o, &n, &e);
    json_t *ledger = json_object(), *keys = json_object();
    long long reasons[IDEM_REASON_CNT] = {0}, unique = 0;
    for (size_t i = 0; i < n; i++) {
        char cur[8], user[IDEM_ENVELOPE_ID_MAX + 1];
        long long cents;
        int r = classify(all[i].value, all[i].rec.value_len, all[i].mid,
                         all[i].ikey, 4095, cur, user, &cents);
        if (r >= 0) {
            reasons[r]++;
            continue;
        }
        if (json_object_get(keys, all[i].ikey))
            continue; /* the ledger applies a payment once */
        json_object_set_new(keys, all[i].ikey, json_true());
        unique++;
        json_t *c = json_object_get(ledger, cur);
        if (!c)
            json_object_set_new(ledger, cur, c = json_object());
        json_t *s = json_object_get(c, user);
        json_object_set_new(
            c, user, json_integer((s ? json_integer_value(s) : 0) + cents));
    }
    json_int_t sent = json_integer_value(json_object_get(e, "sent"));
    json_int_t uniq = json_integer_value(json_object_get(e, "unique"));
    json_t *d = json_object_get(e, "duplicates");
    json_t *p = json_object_get(e, "poison");
    json_int_t red = json_integer_value(json_object_get(d, "redelivery"));
    json_int_t res = json_integer_value(json_object_get(d, "resend"));
    json_int_t poison = 0;
    for (int r = 0; r < IDEM_REASON_CNT; r++) {
        json_t *v = json_object_get(p, idem_reason2str(r));
        cr_assert(json_is_integer(v), "poison.%s", idem_reason2str(r));
        cr_expect_eq(json_integer_value(v), reasons[r], "poison.%s",
                     idem_reason2str(r));
        poison += json_integer_value(v);
    }
    cr_assert_eq(sent, (json_int_t)n);
    cr_assert_eq(sent, uniq + red + res + poison);
    cr_assert_eq(uniq, unique);
    cr_assert_eq(json_integer_value(json_object_get(e, "applied")), uniq);
    cr_assert_eq(uniq, 3000 - 450);
    cr_assert_eq(red + res, 900);
    cr_assert_eq(red, res);
    cr_assert(json_equal(json_object_get(e, "ledger"), ledger),
              "ledger differs from the recomputation");
    cr_assert_eq(json_integer_value(json_object_get(p, "handler-rejected")), 0);
    json_decref(ledger);
    json_decref(keys);
    json_decref(e);
    free_all(all, n);
}

Test(gen, amounts_always_have_exactly_two_decimals)
{
    idem_gen_opts_t o = opts_with(9, 4000, 0.1, 0);
    size_t n;
    rec_copy_t *all = gen_all(&o, &n, NULL);
    int small = 0;
    for (size_t i = 0; i < n; i++) {
        char at[64];
        cr_assert(!amount_text(all[i].value, at, sizeof(at)));
        cr_assert(amount_is_two_decimals(at), "amount \"%s\"", at);
        if (!strncmp(at, "0.", 2))
            small++;
    }
    cr_expect_gt(small, 0, "amounts below 1.00 keep the leading 0");
    free_all(all, n);
}

Test(gen, expect_file_shape)
{
    idem_gen_opts_t o = opts_with(1, 100, 0.1, 0.1);
    char err[256];
    idem_gen_t *g = idem_gen_new(&o, err, sizeof(err));
    idem_gen_record_t r;
    while (idem_gen_next(g, &r))
        ;
    char *buf = NULL;
    size_t len = 0;
    FILE *fp = open_memstream(&buf, &len);
    cr_assert(!idem_gen_expect_fwrite(g, fp, err, sizeof(err)));
    fclose(fp);
    json_error_t je;
    json_t *e = json_loads(buf, 0, &je);
    cr_assert(e, "%s", je.text);
    const char *keys[] = {"sent",   "unique", "duplicates",
                          "poison", "ledger", "applied"};
    cr_assert_eq(json_object_size(e), 6);
    for (size_t i = 0; i < 6; i++)
        cr_assert(json_object_get(e, keys[i]), "%s", keys[i]);
    cr_assert_eq(json_object_size(json_object_get(e, "poison")), 7);
    cr_assert_eq(json_object_size(json_object_get(e, "duplicates")), 2);
    json_decref(e);
    free(buf);
    idem_gen_destroy(g);
}

Test(gen, bad_options_and_defaults)
{
    char err[256];
    idem_gen_opts_t o;
    idem_gen_opts_init(&o);
    idem_conf_t *conf = idem_conf_new();
    cr_assert_eq(o.too_large_bytes, conf->message_max_bytes + 1,
                 "too-large is one byte over the processor's default");
    idem_conf_destroy(conf);
    o.poison = 1.5;
    cr_assert_null(idem_gen_new(&o, err, sizeof(err)));
    cr_assert(strstr(err, "--poison"), "%s", err);
    idem_gen_opts_init(&o);
    o.currencies = "EUR,eur";
    cr_assert_null(idem_gen_new(&o, err, sizeof(err)));
    cr_assert(strstr(err, "--currencies"), "%s", err);
    cr_assert(idem_gen_currencies_check("TRY,EUR,USD", err, sizeof(err)) == 0);
    cr_assert(idem_gen_currencies_check("EURO", err, sizeof(err)) < 0);
    cr_assert(idem_gen_currencies_check("", err, sizeof(err)) < 0);
    idem_gen_destroy(NULL);
}

Test(gen, all_poison_means_no_duplicates)
{
    idem_gen_opts_t o = opts_with(2, 50, 0.5, 1.0);
    size_t n;
    json_t *e;
    rec_copy_t *all = gen_all(&o, &n, &e);
    cr_assert_eq(n, 50);
    cr_assert_eq(json_integer_value(json_object_get(e, "unique")), 0);
    json_decref(e);
    free_all(all, n);
}

/* A directory given as --expect: said "DIR:1:0: not JSON ... near end of
 * file", as if the file were empty. */
Test(gen, expect_load_of_a_directory_says_so)
{
    char *dir = th_tmpdir();
    char errstr[512] = "";
    json_t *e = idem_expect_load(dir, errstr, sizeof(errstr));
    cr_expect_null(e);
    cr_expect(strstr(errstr, "cannot read: Is a directory"), "%s", errstr);
    cr_expect_null(strstr(errstr, "not JSON"), "%s", errstr);
    json_decref(e);
    th_rmrf(dir);
    free(dir);
}
