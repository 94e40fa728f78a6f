/* test_produce: `idemproc produce` against `idemproc broker`, read back with
 * kcat (an independent client) and compared with the generator and with
 * --expect. */
#include "dev/gen.h"
#include "input/envelope.h"
#include "harness.h"
#include "base/util.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int count_lines(const char *s)
{
    int n = 0;
    for (; s && *s; s++)
        n += *s == '\n';
    return n;
}

/* Everything in `topic` as "key\theaders\tvalue" lines (kcat's format). */
static char *kcat_read(const char *bootstrap, const char *topic)
{
    char *argv[] = {"/usr/bin/kcat",
                    "-C",
                    "-b",
                    (char *)bootstrap,
                    "-t",
                    (char *)topic,
                    "-e",
                    "-o",
                    "beginning",
                    "-q",
                    "-X",
                    "fetch.wait.max.ms=10",
                    "-f",
                    "%k\t%h\t%s\n",
                    NULL};
    char *out = NULL;
    int rc = th_run(argv, &out, NULL, 60000);
    cr_assert_eq(rc, 0, "kcat exit %d", rc);
    return out;
}

/* Splits text into its lines (modified in place), sorted. */
static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static char **lines_sorted(char *text, size_t *n)
{
    size_t cap = 16, cnt = 0;
    char **v = malloc(cap * sizeof(*v));
    for (char *p = text, *nl; p && *p; p = nl + 1) {
        nl = strchr(p, '\n');
        if (!nl)
            break;
        *nl = '\0';
        if (cnt == cap)
            v = realloc(v, (cap *= 2) * sizeof(*v));
        v[cnt++] = p;
    }
    qsort(v, cnt, sizeof(*v), cmp_str);
    *n = cnt;
    return v;
}

/* What the processor makes of a value read back (th_classify): 1 for a
 * valid payment with its currency, user, cents and identity filled. */
static int valid_payment(const char *value, size_t max_bytes, char *cur,
                         char *user, long long *cents, char *ikey)
{
    idem_envelope_t env;
    if (th_classify(value, strlen(value), NULL, NULL, max_bytes, &env) >= 0)
        return 0;
    snprintf(cur, 8, "%s", env.currency);
    snprintf(user, IDEM_ENVELOPE_ID_MAX + 1, "%s", env.user_id);
    snprintf(ikey, IDEM_ENVELOPE_ID_MAX + 1, "%s", env.identity);
    *cents = env.amount_minor;
    return 1;
}

Test(produce, generated_traffic_round_trips_through_the_broker)
{
    th_broker_t b;
    const char *extra[] = {"--topic", "pay:8", NULL};
    cr_assert_eq(th_broker_start(&b, extra), 0);
    char *dir = th_tmpdir();
    char expect_path[512];
    snprintf(expect_path, sizeof(expect_path), "%s/expect.json", dir);
    char *argv[] = {(char *)th_bin(),
                    "produce",
                    "-b",
                    b.bootstrap,
                    "-t",
                    "pay",
                    "--count",
                    "1500",
                    "--duplicates",
                    "0.2",
                    "--poison",
                    "0.1",
                    "--too-large-bytes",
                    "4096",
                    "--seed",
                    "42",
                    "--users",
                    "20",
                    "--currencies",
                    "TRY,EUR,USD",
                    "--expect",
                    expect_path,
                    NULL};
    char *out = NULL, *err = NULL;
    int rc = th_run(argv, &out, &err, 120000);
    cr_assert_eq(rc, 0, "produce exit %d: %s", rc, err);
    cr_expect(strstr(err, "sent 1800, acked 1800, failed 0"), "%s", err);
    cr_expect_eq(count_lines(err), 1, "one summary line: %s", err);
    cr_expect_str_empty(out);

    /* What kcat read equals what the generator makes, record for record. */
    char *got = kcat_read(b.bootstrap, "pay");
    idem_gen_opts_t o;
    idem_gen_opts_init(&o);
    o.count = 1500;
    o.duplicates = 0.2;
    o.poison = 0.1;
    o.too_large_bytes = 4096;
    o.seed = 42;
    o.users = 20;
    o.currencies = "TRY,EUR,USD";
    char gerr[256];
    idem_gen_t *g = idem_gen_new(&o, gerr, sizeof(gerr));
    char *want = NULL;
    size_t want_len = 0;
    FILE *fp = open_memstream(&want, &want_len);
    idem_gen_record_t r;
    while (idem_gen_next(g, &r)) {
        fprintf(fp, "%.*s\t", (int)r.key_len, r.key);
        if (r.hdr_message_id)
            fprintf(fp, "message_id=%s,idempotency_key=%s", r.hdr_message_id,
                    r.hdr_idempotency_key);
        fprintf(fp, "\t%.*s\n", (int)r.value_len, r.value);
    }
    fclose(fp);
    json_t *gen_expect = idem_gen_expect(g);
    idem_gen_destroy(g);
    size_t ng, nw;
    char **gl = lines_sorted(got, &ng);
    char **wl = lines_sorted(want, &nw);
    cr_assert_eq(ng, 1800, "kcat read %zu records", ng);
    cr_assert_eq(ng, nw);
    for (size_t i = 0; i < ng; i++)
        cr_assert_str_eq(gl[i], wl[i], "record %zu", i);

    /* --expect: the generator's expectations, and a ledger recomputed from
     * what the independent client read. */
    json_error_t je;
    json_t *e = json_load_file(expect_path, 0, &je);
    cr_assert(e, "%s", je.text);
    cr_assert(json_equal(e, gen_expect));
    cr_assert_eq(json_integer_value(json_object_get(e, "sent")), 1800);
    json_t *ledger = json_object(), *seen = json_object();
    long long unique = 0;
    for (size_t i = 0; i < ng; i++) {
        char *value = strchr(strchr(gl[i], '\t') + 1, '\t') + 1;
        char cur[8], user[IDEM_ENVELOPE_ID_MAX + 1],
            ikey[IDEM_ENVELOPE_ID_MAX + 1];
        long long cents;
        if (!valid_payment(value, 4095, cur, user, &cents, ikey) ||
            json_object_get(seen, ikey))
            continue;
        json_object_set_new(seen, ikey, json_true());
        unique++;
        json_t *c = json_object_get(ledger, cur);
        if (!c)
            json_object_set_new(ledger, cur, c = json_object());
        json_t *s = json_object_get(c, user);
        json_object_set_new(
            c, user, json_integer((s ? json_integer_value(s) : 0) + cents));
    }
    cr_assert_eq(json_integer_value(json_object_get(e, "unique")), unique);
    cr_assert_eq(json_integer_value(json_object_get(e, "applied")), unique);
    cr_assert(json_equal(json_object_get(e, "ledger"), ledger),
              "ledger differs from what kcat read");

    json_decref(ledger);
    json_decref(seen);
    json_decref(e);
    json_decref(gen_expect);
    free(gl);
    free(wl);
    free(got);
    free(want);
    free(out);
    free(err);
    th_rmrf(dir);
    free(dir);
    th_broker_stop(&b);
}

Test(produce, input_lines_with_added_message_id)
{
    th_broker_t b;
    cr_assert_eq(th_broker_start(&b, NULL), 0);
    char *dir = th_tmpdir();
    char path[512];
    snprintf(path, sizeof(path), "%s/in.jsonl", dir);
    FILE *fp = fopen(path, "w");
    fputs("{\"order_id\":\"A-1\",\"amount\":12.30}\n"
          "{\"message_id\":\"m-2\",\"idempotency_key\":\"k-2\"}\n"
          "this is not json\n"
          "\n"
          "{\"idempotency_key\":\"k-4\",\"user_id\":\"u\"}\n",
          fp);
    fclose(fp);
    char *argv[] = {(char *)th_bin(),
                    "produce",
                    "-b",
                    b.bootstrap,
                    "-t",
                    "in",
                    "--input",
                    path,
                    "--add-message-id",
                    NULL};
    char *out = NULL, *err = NULL;
    int rc = th_run(argv, &out, &err, 60000);
    cr_assert_eq(rc, 0, "%s", err);
    cr_expect(strstr(err, "sent 4, acked 4"), "%s", err);
    cr_expect(strstr(err, "not-json lines 1"), "%s", err);

    char *got = kcat_read(b.bootstrap, "in");
    size_t n;
    char **l = lines_sorted(got, &n);
    cr_assert_eq(n, 4, "%s", got);
    int a1 = 0, m2 = 0, k4 = 0, raw = 0;
    for (size_t i = 0; i < n; i++) {
        char *t1 = strchr(l[i], '\t'), *t2 = t1 ? strchr(t1 + 1, '\t') : NULL;
        cr_assert(t2, "%s", l[i]);
        *t1 = *t2 = '\0';
        const char *key = l[i], *hdrs = t1 + 1, *value = t2 + 1;
        if (!strcmp(value, "this is not json")) {
            raw++;
            cr_expect_str_empty(key);
            cr_expect_str_empty(hdrs);
            continue;
        }
        json_t *d = json_loads(value, 0, NULL);
        cr_assert(json_is_object(d), "%s", value);
        const char *mid = json_string_value(json_object_get(d, "message_id"));
        cr_assert(mid, "every object has a message_id: %s", value);
        char want_hdr[256];
        snprintf(want_hdr, sizeof(want_hdr), "message_id=%s", mid);
        cr_expect(!strncmp(hdrs, want_hdr, strlen(want_hdr)), "%s vs %s", hdrs,
                  want_hdr);
        if (!strcmp(key, "A-1")) {
            a1++;
            cr_expect_eq(strlen(mid), 36, "a UUID: %s", mid);
            /* the original bytes are kept: 12.30 stays 12.30 */
            cr_expect(strstr(value, "\"amount\":12.30}"), "%s", value);
        } else if (!strcmp(key, "m-2")) {
            m2++;
            cr_expect_str_eq(hdrs, "message_id=m-2,idempotency_key=k-2");
            cr_expect_str_eq(value,
                             "{\"message_id\":\"m-2\",\"idempotency_key\":"
                             "\"k-2\"}");
        } else {
            k4++; /* no order_id: the key is the added message_id */
            cr_expect_str_eq(key, mid);
            cr_expect(strstr(hdrs, "idempotency_key=k-4"), "%s", hdrs);
        }
        json_decref(d);
    }
    cr_expect(a1 == 1 && m2 == 1 && k4 == 1 && raw == 1);
    free(l);
    free(got);
    free(out);
    free(err);
    th_rmrf(dir);
    free(dir);
    th_broker_stop(&b);
}

/* --key-delimiter reads kcat -P -K's format: the key before the
 * delimiter, the value after it (with its ids as headers); a line without
 * the delimiter is keyed from its JSON. */
Test(produce, input_key_delimiter_as_kcat)
{
    th_broker_t b;
    cr_assert_eq(th_broker_start(&b, NULL), 0);
    char *dir = th_tmpdir();
    char path[512];
    snprintf(path, sizeof(path), "%s/in.tsv", dir);
    cr_assert_eq(
        th_write_file(path,
                      "K-1\t{\"message_id\":\"m-1\",\"order_id\":\"O-1\"}\n"
                      "{\"message_id\":\"m-2\",\"order_id\":\"O-2\"}\n"
                      "K-3\tnot json\n"),
        0);
    char *argv[] = {(char *)th_bin(),
                    "produce",
                    "-b",
                    b.bootstrap,
                    "-t",
                    "kd",
                    "--input",
                    path,
                    "--key-delimiter",
                    "\\t",
                    NULL};
    char *err = NULL;
    int rc = th_run(argv, NULL, &err, 60000);
    cr_assert_eq(rc, 0, "%s", err);
    cr_expect(strstr(err, "sent 3, acked 3"), "%s", err);
    cr_expect(strstr(err, "not-json lines 1"), "%s", err);
    char *got = kcat_read(b.bootstrap, "kd");
    size_t n;
    char **l = lines_sorted(got, &n);
    cr_assert_eq(n, 3, "%s", got);
    cr_expect_str_eq(l[0], "K-1\tmessage_id=m-1\t{\"message_id\":\"m-1\","
                           "\"order_id\":\"O-1\"}");
    cr_expect_str_eq(l[1], "K-3\t\tnot json");
    cr_expect_str_eq(l[2], "O-2\tmessage_id=m-2\t{\"message_id\":\"m-2\","
                           "\"order_id\":\"O-2\"}");
    free(l);
    free(got);
    free(err);
    th_rmrf(dir);
    free(dir);
    th_broker_stop(&b);
}

/* A regular file is mapped and its values read in place by librdkafka; a
 * pipe is read line by line. Both give the very same records (key, the
 * envelope's headers, value), whatever the line ends; with
 * --no-envelope-headers the same keys and values without headers. */
Test(produce, input_file_and_pipe_send_the_same_records)
{
    th_broker_t b;
    cr_assert_eq(th_broker_start(&b, NULL), 0);
    char *dir = th_tmpdir();
    char path[512];
    snprintf(path, sizeof(path), "%s/in.jsonl", dir);
    cr_assert_eq(
        th_write_file(path,
                      "{\"message_id\":\"m-1\",\"idempotency_key\":\"i-1\","
                      "\"order_id\":\"O-1\"}\r\n"
                      "\n"
                      "K-2\t{\"message_id\":\"m-2\",\"order_id\":\"O-2\"}\n"
                      "not json\r\n"
                      "{\"idempotency_key\":\"i-4\",\"order_id\":\"O-4\"}"),
        0);
    char cmd[4096];
    snprintf(cmd, sizeof(cmd),
             "%s produce -b %s -t mapped --input %s --key-delimiter '\\t' && "
             "cat %s | %s produce -b %s -t piped --input - "
             "--key-delimiter '\\t' && "
             "%s produce -b %s -t bare --input %s --key-delimiter '\\t' "
             "--no-envelope-headers",
             th_bin(), b.bootstrap, path, path, th_bin(), b.bootstrap, th_bin(),
             b.bootstrap, path);
    char *argv[] = {"/bin/sh", "-c", cmd, NULL};
    char *err = NULL;
    int rc = th_run(argv, NULL, &err, 60000);
    cr_assert_eq(rc, 0, "%s", err);
    cr_expect_eq(count_lines(err), 3, "%s", err);
    char *bare = kcat_read(b.bootstrap, "bare");
    size_t nb;
    char **lb = lines_sorted(bare, &nb);
    cr_assert_eq(nb, 4, "%s", bare);
    cr_expect_str_eq(lb[0], "\t\tnot json");
    cr_expect_str_eq(lb[1], "K-2\t\t{\"message_id\":\"m-2\",\"order_id\":"
                            "\"O-2\"}");
    cr_expect_str_eq(lb[2], "O-1\t\t{\"message_id\":\"m-1\",\"idempotency_"
                            "key\":\"i-1\",\"order_id\":\"O-1\"}");
    cr_expect_str_eq(lb[3], "O-4\t\t{\"idempotency_key\":\"i-4\",\"order_"
                            "id\":\"O-4\"}");
    free(lb);
    free(bare);
    char *mapped = kcat_read(b.bootstrap, "mapped");
    char *piped = kcat_read(b.bootstrap, "piped");
    size_t nm, np;
    char **lm = lines_sorted(mapped, &nm), **lp = lines_sorted(piped, &np);
    cr_assert_eq(nm, 4, "%s", mapped);
    cr_assert_eq(np, 4);
    for (size_t i = 0; i < 4; i++)
        cr_expect_str_eq(lm[i], lp[i]);
    cr_expect_str_eq(lm[1], "K-2\tmessage_id=m-2\t{\"message_id\":\"m-2\","
                            "\"order_id\":\"O-2\"}");
    cr_expect_str_eq(lm[2], "O-1\tmessage_id=m-1,idempotency_key=i-1\t"
                            "{\"message_id\":\"m-1\",\"idempotency_key\":"
                            "\"i-1\",\"order_id\":\"O-1\"}");
    cr_expect_str_eq(lm[3], "O-4\tidempotency_key=i-4\t{\"idempotency_key\":"
                            "\"i-4\",\"order_id\":\"O-4\"}");
    cr_expect_str_eq(lm[0], "\t\tnot json");
    free(lm);
    free(lp);
    free(mapped);
    free(piped);
    free(err);
    th_rmrf(dir);
    free(dir);
    th_broker_stop(&b);
}

Test(produce, bad_flags_exit_2_with_one_line)
{
    const char *cases[][5] = {
        {"--count", "0", NULL, NULL, "--count"},
        {"--poison", "1.5", NULL, NULL, "--poison"},
        {"--duplicates", "x", NULL, NULL, "--duplicates"},
        {"--currencies", "eur", NULL, NULL, "--currencies"},
        {"--rate", "-1", NULL, NULL, "--rate"},
        {"--users", "0", NULL, NULL, "--users"},
        {"--too-large-bytes", "10", NULL, NULL, "--too-large-bytes"},
        {"--nope", NULL, NULL, NULL, "--nope"},
        {"-X", "noequals", NULL, NULL, "-X"},
        {"-X", "no.such.property=1", NULL, NULL, "no.such.property"},
        {"-X", "acks=0", NULL, NULL, "-X acks: not configurable"},
        {"-X", "enable.idempotence=false", NULL, NULL,
         "-X enable.idempotence: not configurable"},
        {"--add-message-id=sometimes", NULL, NULL, NULL, "--add-message-id"},
        {"--timeout", "0", NULL, NULL, "--timeout"},
        {"--input", "-", "--poison", "0.1", "--poison"},
        {"--key-field", "id", NULL, NULL, "--key-field"},
        {"--no-envelope-headers", NULL, NULL, NULL, "--no-envelope-headers"},
        {"--count", NULL, NULL, NULL, "--count"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *argv[12] = {(char *)th_bin(), "produce", "-b",
                          "127.0.0.1:1",    "-t",      "t"};
        int n = 6;
        for (int j = 0; j < 4 && cases[i][j]; j++)
            argv[n++] = (char *)cases[i][j];
        argv[n] = NULL;
        char *out = NULL, *err = NULL;
        int rc = th_run(argv, &out, &err, 10000);
        cr_expect_eq(rc, 2, "%s: rc %d", cases[i][0], rc);
        cr_expect_eq(count_lines(err), 1, "%s: \"%s\"", cases[i][0], err);
        cr_expect(strstr(err, cases[i][4]), "%s: \"%s\"", cases[i][0], err);
        free(out);
        free(err);
    }
    char *argv[] = {(char *)th_bin(), "produce", "-t", "t", NULL};
    char *err = NULL;
    cr_expect_eq(th_run(argv, NULL, &err, 10000), 2);
    cr_expect(strstr(err, "--bootstrap"), "%s", err);
    free(err);
}

Test(produce, unreachable_bootstrap_exits_1_with_failure_count)
{
    char bs[64];
    snprintf(bs, sizeof(bs), "127.0.0.1:%d", th_free_port());
    char *argv[] = {(char *)th_bin(), "produce", "-b",        bs,  "-t", "t",
                    "--count",        "5",       "--timeout", "2", NULL};
    char *err = NULL;
    int64_t t0 = idem_now_ms();
    int rc = th_run(argv, NULL, &err, 60000);
    int64_t took = idem_now_ms() - t0;
    cr_assert_eq(rc, 1, "rc %d: %s", rc, err);
    char want[128];
    snprintf(want, sizeof(want),
             "idemproc produce: no Kafka broker reachable at %s within 2 s",
             bs);
    cr_expect(strstr(err, want), "%s", err);
    cr_expect_eq(count_lines(err), 1, "one line, no log lines: %s", err);
    cr_expect_lt(took, 20000, "bounded by --timeout: %lld ms", (long long)took);
    free(err);
}

/* -c FILE hands its kafka.* settings to the producer (-v prints the
 * effective librdkafka configuration before anything is sent). */
Test(produce, config_file_kafka_settings_reach_the_producer)
{
    char *dir = th_tmpdir();
    char conf[512], text[256];
    snprintf(conf, sizeof(conf), "%s/c.properties", dir);
    snprintf(text, sizeof(text),
             "kafka.bootstrap.servers=127.0.0.1:%d\ninput.topics=t\n"
             "kafka.socket.timeout.ms=12345\nkafka.sasl.password=hunter2\n",
             th_free_port());
    cr_assert_eq(th_write_file(conf, text), 0);
    char *argv[] = {(char *)th_bin(), "produce", "-c",      conf, "-v",
                    "--timeout",      "1",       "--count", "1",  NULL};
    char *err = NULL;
    cr_expect_eq(th_run(argv, NULL, &err, 30000), 1, "%s", err);
    cr_expect(strstr(err, "socket.timeout.ms=12345\n"), "%s", err);
    cr_expect(strstr(err, "no Kafka broker reachable at 127.0.0.1:"), "%s",
              err);
    cr_expect_null(strstr(err, "hunter2"), "%s", err);
    free(err);
    th_rmrf(dir);
    free(dir);
}

/* With -c, too-large records are sized by the member's message.max.bytes:
 * one byte above it by default (the producer's own limit then follows, as
 * -v shows), and a size the member would accept is refused in one line. */
Test(produce, too_large_bytes_follow_the_members_limit)
{
    char *dir = th_tmpdir();
    char conf[512], text[256];
    snprintf(conf, sizeof(conf), "%s/c.properties", dir);
    snprintf(text, sizeof(text),
             "kafka.bootstrap.servers=127.0.0.1:%d\ninput.topics=t\n"
             "message.max.bytes=2000000\n",
             th_free_port());
    cr_assert_eq(th_write_file(conf, text), 0);
    char *small[] = {(char *)th_bin(),    "produce", "-c", conf,
                     "--too-large-bytes", "5000",    NULL};
    char *err = NULL;
    cr_expect_eq(th_run(small, NULL, &err, 30000), 2, "%s", err);
    cr_expect_eq(count_lines(err), 1, "%s", err);
    cr_expect(strstr(err, "--too-large-bytes 5000: not above the member's "
                          "message.max.bytes 2000000"),
              "%s", err);
    cr_expect(strstr(err, "use at least 2000001"), "%s", err);
    free(err);
    /* default: 2000001-byte values, so the producer allows 2000001 + 64 KiB
     * (without -c's limit it would be the processor's default + 1) */
    char *dflt[] = {(char *)th_bin(), "produce", "-c",      conf, "-v",
                    "--timeout",      "1",       "--count", "1",  NULL};
    err = NULL;
    cr_expect_eq(th_run(dflt, NULL, &err, 30000), 1, "%s", err);
    cr_expect(strstr(err, "message.max.bytes=2065537\n"), "%s", err);
    free(err);
    char *above[] = {
        (char *)th_bin(), "produce", "-c",      conf, "-v",
        "--timeout",      "1",       "--count", "1",  "--too-large-bytes",
        "3000000",        NULL};
    err = NULL;
    cr_expect_eq(th_run(above, NULL, &err, 30000), 1, "%s", err);
    cr_expect(strstr(err, "message.max.bytes=3065536\n"), "%s", err);
    free(err);
    /* a file that leaves message.max.bytes at the default: a warning, as
     * the member may lower it with --set */
    snprintf(text, sizeof(text),
             "kafka.bootstrap.servers=127.0.0.1:%d\ninput.topics=t\n",
             th_free_port());
    cr_assert_eq(th_write_file(conf, text), 0);
    char *unset[] = {(char *)th_bin(),    "produce", "-c",      conf,
                     "--timeout",         "1",       "--count", "1",
                     "--too-large-bytes", "5000",    NULL};
    err = NULL;
    cr_expect_eq(th_run(unset, NULL, &err, 30000), 1, "%s", err);
    cr_expect(strstr(err, "warning: --too-large-bytes 5000 is not above "
                          "message.max.bytes 1048576 (the default"),
              "%s", err);
    free(err);
    th_rmrf(dir);
    free(dir);
}

/* A missing --input file is a usage error before anything is sent: one
 * line, no all-zero summary. */
Test(produce, missing_input_file_is_one_line)
{
    char *argv[] = {
        (char *)th_bin(), "produce",         "-b", "127.0.0.1:1", "-t", "t",
        "--input",        "/nonexistent/in", NULL};
    char *err = NULL;
    cr_assert_eq(th_run(argv, NULL, &err, 20000), 2, "%s", err);
    cr_expect_eq(count_lines(err), 1, "%s", err);
    cr_expect(strstr(err, "--input: cannot open \"/nonexistent/in\""), "%s",
              err);
    cr_expect_null(strstr(err, "produce: sent"), "%s", err);
    free(err);
}

/* --input with --expect: the expectation comes from the lines sent, judged
 * like the processor; --add-message-id=stable gives a line the same id
 * every time it is sent; -c FILE supplies bootstrap, topic and the log
 * format; empty lines are counted. */
Test(produce, input_expect_stable_ids_and_config_file)
{
    th_broker_t b;
    cr_assert_eq(th_broker_start(&b, NULL), 0);
    char *dir = th_tmpdir();
    char in[512], conf[512], expect[512], text[1024];
    snprintf(in, sizeof(in), "%s/in.jsonl", dir);
    snprintf(conf, sizeof(conf), "%s/c.properties", dir);
    snprintf(expect, sizeof(expect), "%s/x.json", dir);
    cr_assert_eq(th_write_file(in,
                               "{\"idempotency_key\":\"k1\",\"user_id\":\"u1\","
                               "\"amount\":1.5,\"currency\":\"EUR\"}\n"
                               "\n"
                               "{\"idempotency_key\":\"k2\",\"user_id\":\"u1\","
                               "\"amount\":2,\"currency\":\"EUR\"}\n"
                               "{\"idempotency_key\":\"k3\",\"user_id\":\"u2\","
                               "\"amount\":1.005,\"currency\":\"USD\"}\n"
                               "not json\n"
                               "{\"idempotency_key\":\"k1\",\"user_id\":\"u1\","
                               "\"amount\":1.5,\"currency\":\"EUR\"}\n"),
                 0);
    snprintf(text, sizeof(text),
             "kafka.bootstrap.servers=%s\ninput.topics=lines\n"
             "message.max.bytes=1000\nlog.format=text\nlog.level=debug\n",
             b.bootstrap);
    cr_assert_eq(th_write_file(conf, text), 0);
    char *argv[] = {(char *)th_bin(),
                    "produce",
                    "-c",
                    conf,
                    "--input",
                    in,
                    "--expect",
                    expect,
                    "--add-message-id=stable",
                    "-X",
                    "debug=metadata",
                    NULL};
    for (int round = 0; round < 2; round++) {
        char *err = NULL;
        int rc = th_run(argv, NULL, &err, 60000);
        cr_assert_eq(rc, 0, "%s", err);
        cr_expect(strstr(err, "sent 5, acked 5"), "%s", err);
        cr_expect(strstr(err, "not-json lines 1, empty lines skipped 1"), "%s",
                  err);
        /* librdkafka's own lines follow log.format=text from the file. */
        cr_expect(strstr(err, "Z debug "), "%s", err);
        cr_expect_null(strstr(err, "{\"ts\""), "%s", err);
        free(err);
    }
    json_t *e = json_load_file(expect, 0, NULL);
    cr_assert(e);
    cr_expect_eq(json_integer_value(json_object_get(e, "applied")), 2);
    cr_expect_eq(json_integer_value(json_object_get(e, "sent")), 5);
    json_t *eur = json_object_get(json_object_get(e, "ledger"), "EUR");
    cr_expect_eq(json_integer_value(json_object_get(eur, "u1")), 350);
    cr_expect_null(json_object_get(json_object_get(e, "ledger"), "USD"));
    json_t *po = json_object_get(e, "poison");
    cr_expect_eq(json_integer_value(json_object_get(po, "invalid-field")), 1);
    cr_expect_eq(json_integer_value(json_object_get(po, "not-json")), 1);
    json_t *d = json_object_get(e, "duplicates");
    cr_expect_eq(json_integer_value(json_object_get(d, "redelivery")), 1);
    json_decref(e);

    /* Both rounds gave each line the same message_id. */
    char *got = kcat_read(b.bootstrap, "lines");
    size_t n;
    char **l = lines_sorted(got, &n);
    cr_assert_eq(n, 10, "%s", got);
    int k1 = 0;
    char first[64] = "";
    for (size_t i = 0; i < n; i++) {
        const char *m = strstr(l[i], "\"message_id\":\"");
        if (!strstr(l[i], "\"k1\"") || !m)
            continue;
        if (!k1++)
            snprintf(first, sizeof(first), "%.36s", m + 14);
        cr_expect(!strncmp(m + 14, first, 36), "k1 ids differ: %s", l[i]);
    }
    cr_expect_eq(k1, 4, "%s", got);
    free(l);
    free(got);
    th_rmrf(dir);
    free(dir);
    th_broker_stop(&b);
}

Test(produce, sigint_stops_flushes_and_reports)
{
    th_broker_t b;
    cr_assert_eq(th_broker_start(&b, NULL), 0);
    char *dir = th_tmpdir();
    char expect_path[512], errp[512];
    snprintf(expect_path, sizeof(expect_path), "%s/expect.json", dir);
    snprintf(errp, sizeof(errp), "%s/err", dir);
    char *argv[] = {
        (char *)th_bin(), "produce",   "-b",      b.bootstrap, "-t",
        "slow",           "--count",   "1000000", "--rate",    "200",
        "--expect",       expect_path, NULL};
    pid_t pid = th_spawn(argv, NULL, errp, NULL);
    /* produce takes SIGINT once it reached the broker, before its first
     * record: a fixed 300 ms was sometimes before that under the
     * sanitizers, and SIGINT's default action killed it (exit 130). */
    for (int t = 0; t < 300 && th_topic_size(b.bootstrap, "slow") < 1; t++)
        usleep(100000);
    kill(pid, SIGINT);
    int rc = th_wait(pid, 30000);
    if (rc == -1)
        th_stop(pid, 1000);
    cr_assert_eq(rc, 0, "rc %d", rc);
    char *err = th_slurp(errp, NULL);
    cr_expect(strstr(err, "(interrupted)"), "%s", err);
    json_t *e = json_load_file(expect_path, 0, NULL);
    cr_assert(e);
    char *got = kcat_read(b.bootstrap, "slow");
    cr_expect_eq(json_integer_value(json_object_get(e, "sent")),
                 count_lines(got), "every generated record was delivered");
    cr_expect_lt(json_integer_value(json_object_get(e, "sent")), 1000000);
    json_decref(e);
    free(got);
    free(err);
    th_rmrf(dir);
    free(dir);
    th_broker_stop(&b);
}

/* --rate adds a line with the rate reached (first to last send) and the
 * acknowledgement latency; the bench's latency row checks its rate with
 * it. 300 records at 1000/s: about 0.3 s, the rate reached close to it. */
Test(produce, rate_reports_the_rate_reached_and_ack_latency)
{
    th_broker_t b;
    const char *extra[] = {"--topic", "paced:4", NULL};
    cr_assert_eq(th_broker_start(&b, extra), 0);
    char *argv[] = {
        (char *)th_bin(), "produce", "-b",     b.bootstrap, "-t", "paced",
        "--count",        "300",     "--rate", "1000",      NULL};
    char *out = NULL, *err = NULL;
    int rc = th_run(argv, &out, &err, 60000);
    cr_assert_eq(rc, 0, "produce exit %d: %s", rc, err);
    cr_expect_eq(count_lines(err), 2, "summary and pacing lines: %s", err);
    const char *line = strstr(err, "produce: send rate ");
    cr_assert(line, "%s", err);
    double reached = 0, share = 0, target = 0;
    long long p50 = -1, p99 = -1, max = -1;
    int n = sscanf(line,
                   "produce: send rate %lf msgs/s over %*fs (%lf%% of --rate "
                   "%lf); acknowledged after p50 %lld ms, p99 %lld ms, max "
                   "%lld ms",
                   &reached, &share, &target, &p50, &p99, &max);
    cr_assert_eq(n, 6, "unparsed: %s", line);
    cr_expect_eq(target, 1000);
    /* Paced, not as fast as possible: the bucket's burst is 10 ms. */
    cr_expect(reached > 0 && reached < 1500, "rate %g", reached);
    cr_expect(share > 0 && share < 150, "share %g", share);
    cr_expect(p50 >= 0 && p50 <= p99 && p99 <= max, "%lld %lld %lld", p50, p99,
              max);
    free(out);
    free(err);
    th_broker_stop(&b);
}
