/* test_dlqrec: decoding dead letters (ours and Spring's headers), the
 * filters and times of `idemproc dlq`, its output lines, stats, and the
 * headers and refusals of a replay. No broker needed. */
#include "kafka/dlq.h"
#include "kafka/dlqrec.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOW 1796083200000LL /* 2026-12-01T00:00:00Z */

static rd_kafka_headers_t *ours(const char *reason, const char *failed_at)
{
    rd_kafka_headers_t *h = rd_kafka_headers_new(16);
    rd_kafka_header_add(h, "message_id", -1, "m-1", -1);
    rd_kafka_header_add(h, "dlq.reason", -1, reason, -1);
    rd_kafka_header_add(h, "dlq.error", -1, "amount: must be a JSON number",
                        -1);
    rd_kafka_header_add(h, "dlq.original.topic", -1, "payments", -1);
    rd_kafka_header_add(h, "dlq.original.partition", -1, "3", -1);
    rd_kafka_header_add(h, "dlq.original.offset", -1, "1042", -1);
    rd_kafka_header_add(h, "dlq.original.timestamp", -1, "1796054000000", -1);
    rd_kafka_header_add(h, "dlq.group", -1, "g", -1);
    rd_kafka_header_add(h, "dlq.attempts", -1, "2", -1);
    if (failed_at)
        rd_kafka_header_add(h, "dlq.failed.at", -1, failed_at, -1);
    return h;
}

Test(dlqrec, times_rfc3339_and_relative)
{
    int64_t t;
    char err[256];
    cr_assert_eq(
        idem_dlqtime_parse("2026-12-01T00:00:00Z", 0, &t, err, sizeof(err)), 0,
        "%s", err);
    cr_expect_eq(t, NOW);
    cr_assert_eq(idem_dlqtime_parse("2026-12-01T01:30:00.250+01:30", 0, &t, err,
                                    sizeof(err)),
                 0);
    cr_expect_eq(t, NOW + 250);
    cr_assert_eq(idem_dlqtime_parse("2026-11-30T19:00:00-05:00", 0, &t, err,
                                    sizeof(err)),
                 0);
    cr_expect_eq(t, NOW);
    cr_assert_eq(idem_dlqtime_parse("2026-12-01", 0, &t, err, sizeof(err)), 0);
    cr_expect_eq(t, NOW);
    cr_assert_eq(idem_dlqtime_parse("2h", NOW, &t, err, sizeof(err)), 0);
    cr_expect_eq(t, NOW - 7200000);
    cr_assert_eq(idem_dlqtime_parse("90s", NOW, &t, err, sizeof(err)), 0);
    cr_expect_eq(t, NOW - 90000);
    cr_assert_eq(idem_dlqtime_parse("7d", NOW, &t, err, sizeof(err)), 0);
    cr_expect_eq(t, NOW - 7 * 86400000LL);
    cr_assert_eq(idem_dlqtime_parse("500ms", NOW, &t, err, sizeof(err)), 0);
    cr_expect_eq(t, NOW - 500);
    const char *bad[] = {"",
                         "2h30",
                         "-2h",
                         "h",
                         "2026-12-01T00:00:00", /* no offset */
                         "2026-12-01T00:00Z",
                         "yesterday",
                         "2026-12-01T00:00:00Zjunk"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_expect_neq(idem_dlqtime_parse(bad[i], NOW, &t, err, sizeof(err)), 0,
                      "\"%s\" accepted", bad[i]);
        cr_expect(strstr(err, "is not a time"), "%s", err);
    }
}

/* A date or time that does not exist is refused, naming it, instead of
 * rolling over (2026-02-31 was read as 2026-03-03). */
Test(dlqrec, times_that_do_not_exist_are_refused)
{
    int64_t t;
    char err[256];
    const char *ok[] = {"2024-02-29", "2000-02-29T12:00:00Z",
                        "2026-12-31T23:59:60Z", "2026-04-30T23:59:59+14:00"};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
        cr_expect_eq(idem_dlqtime_parse(ok[i], NOW, &t, err, sizeof(err)), 0,
                     "%s: %s", ok[i], err);
    static const struct {
        const char *in, *err;
    } bad[] = {
        {"2026-02-31", "\"2026-02-31\": no day 31 in 2026-02 (28 days)"},
        {"2026-02-29", "\"2026-02-29\": no day 29 in 2026-02 (28 days)"},
        {"1900-02-29T00:00:00Z", "no day 29 in 1900-02 (28 days)"},
        {"2026-04-31T00:00:00Z", "no day 31 in 2026-04 (30 days)"},
        {"2026-12-00", "no day 00 in 2026-12 (31 days)"},
        {"2026-13-01", "\"2026-13-01\": no month 13 (01..12)"},
        {"2026-00-10", "no month 00"},
        {"2026-12-01T24:61:00Z", "\"2026-12-01T24:61:00Z\": no time of day "
                                 "24:61:00"},
        {"2026-12-01T23:60:00Z", "no time of day 23:60:00"},
        {"2026-12-01T12:00:60Z", "no time of day 12:00:60"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        cr_expect_neq(idem_dlqtime_parse(bad[i].in, NOW, &t, err, sizeof(err)),
                      0, "\"%s\" accepted", bad[i].in);
        cr_expect(strstr(err, bad[i].err), "%s: %s", bad[i].in, err);
    }
}

Test(dlqrec, decodes_our_headers)
{
    rd_kafka_headers_t *h = ours("invalid-field", "2026-12-01T00:00:00.000Z");
    idem_dlqrec_t r;
    idem_dlqrec_decode(&r, "payments.dlq", 1, 7, NOW, "ORD-1", 5, "{}", 2, h);
    cr_expect_str_eq(r.reason, "invalid-field");
    cr_expect_str_eq(r.error, "amount: must be a JSON number");
    cr_expect_str_eq(r.orig_topic, "payments");
    cr_expect_eq(r.orig_partition, 3);
    cr_expect_eq(r.orig_offset, 1042);
    cr_expect_eq(r.orig_timestamp, 1796054000000LL);
    cr_expect_str_eq(r.group, "g");
    cr_expect_eq(r.attempts, 2);
    cr_expect_eq(r.replay_count, 0);
    cr_expect_eq(r.failed_at_ms, NOW);
    cr_expect_eq(r.value_dropped, -1);
    idem_dlqrec_clear(&r);
    rd_kafka_headers_destroy(h);
}

/* With dlq.headers.format=spring (or a DLQ a Spring application wrote)
 * only the kafka_dlt-* headers are there; the reader falls back to them. */
Test(dlqrec, decodes_spring_headers_alone)
{
    rd_kafka_headers_t *h = rd_kafka_headers_new(16);
    idem_dlq_spring_headers(h, "payments", 70000, 5000000000LL, 1796054000000LL,
                            RD_KAFKA_TIMESTAMP_CREATE_TIME, "g", "not-json",
                            "not JSON");
    idem_dlqrec_t r;
    idem_dlqrec_decode(&r, "payments.dlq", 0, 0, NOW, NULL, 0, "x", 1, h);
    cr_expect_str_eq(r.reason, "not-json");
    cr_expect_str_eq(r.error, "not JSON");
    cr_expect_str_eq(r.orig_topic, "payments");
    cr_expect_eq(r.orig_partition, 70000);
    cr_expect_eq(r.orig_offset, 5000000000LL);
    cr_expect_eq(r.orig_timestamp, 1796054000000LL);
    cr_expect_str_eq(r.group, "g");
    /* No failure time in Spring's headers: the dead letter's timestamp. */
    cr_expect_str_eq(r.failed_at, "2026-12-01T00:00:00.000Z");
    cr_expect_eq(r.failed_at_ms, NOW, "so --since/--until work on it");
    idem_dlqrec_clear(&r);
    rd_kafka_headers_destroy(h);
}

Test(dlqrec, filters)
{
    rd_kafka_headers_t *h = ours("invalid-field", "2026-12-01T00:00:00.000Z");
    idem_dlqrec_t r;
    const char *value = "{\"user_id\":\"user-7\"}";
    idem_dlqrec_decode(&r, "payments.dlq", 1, 7, NOW, "ORD-1", 5, value,
                       strlen(value), h);
    idem_dlqfilter_t f;
    idem_dlqfilter_init(&f);
    cr_expect(idem_dlqfilter_match(&f, &r));
    f.reason = "not-json";
    cr_expect_not(idem_dlqfilter_match(&f, &r));
    f.reason = "invalid-field";
    cr_expect(idem_dlqfilter_match(&f, &r));
    f.topic = "orders";
    cr_expect_not(idem_dlqfilter_match(&f, &r));
    f.topic = "payments";
    f.key = "ORD-";
    cr_expect_not(idem_dlqfilter_match(&f, &r), "key must match whole");
    f.key = "ORD-1";
    cr_expect(idem_dlqfilter_match(&f, &r));
    f.grep = "user-8";
    cr_expect_not(idem_dlqfilter_match(&f, &r));
    f.grep = "user-7";
    cr_expect(idem_dlqfilter_match(&f, &r));
    f.since_ms = NOW + 1;
    cr_expect_not(idem_dlqfilter_match(&f, &r));
    f.since_ms = NOW;
    cr_expect(idem_dlqfilter_match(&f, &r), "since is inclusive");
    f.until_ms = NOW;
    cr_expect_not(idem_dlqfilter_match(&f, &r), "until is exclusive");
    f.until_ms = NOW + 1;
    cr_expect(idem_dlqfilter_match(&f, &r));
    /* A DLQ shared by groups: dlq.group is "g". */
    f.group = "other";
    cr_expect_not(idem_dlqfilter_match(&f, &r));
    f.group = "g";
    cr_expect(idem_dlqfilter_match(&f, &r));
    idem_dlqrec_clear(&r);
    rd_kafka_headers_destroy(h);
}

static json_t *json_line(const idem_dlqrec_t *r, long max_bytes)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *fp = open_memstream(&buf, &len);
    idem_dlqrec_print_json(r, max_bytes, fp);
    fclose(fp);
    cr_assert(len > 0 && buf[len - 1] == '\n' && !strchr(buf, '\n')[1]);
    json_error_t e;
    json_t *o = json_loads(buf, 0, &e);
    cr_assert(o, "%s: %s", buf, e.text);
    free(buf);
    return o;
}

/* A cut value ends on a character boundary and says how long it was; a
 * value that is not UTF-8 comes as hex. */
Test(dlqrec, json_line_cuts_values_on_characters)
{
    rd_kafka_headers_t *h = ours("not-json", "2026-12-01T00:00:00.000Z");
    idem_dlqrec_t r;
    const char *value = "ab\xc3\xa9z"; /* "abéz": é is 2 bytes */
    idem_dlqrec_decode(&r, "payments.dlq", 1, 7, NOW, "ORD-1", 5, value,
                       strlen(value), h);
    json_t *o = json_line(&r, 3);
    cr_expect_str_eq(json_string_value(json_object_get(o, "value")), "ab");
    cr_expect_eq(json_integer_value(json_object_get(o, "value_bytes")), 5);
    cr_expect(json_is_true(json_object_get(o, "value_truncated")));
    cr_expect_str_eq(json_string_value(json_object_get(o, "reason")),
                     "not-json");
    cr_expect_eq(json_integer_value(json_object_get(o, "original_offset")),
                 1042);
    json_decref(o);
    o = json_line(&r, -1);
    cr_expect_str_eq(json_string_value(json_object_get(o, "value")), value);
    cr_expect_null(json_object_get(o, "value_truncated"));
    json_decref(o);
    idem_dlqrec_clear(&r);
    idem_dlqrec_decode(&r, "payments.dlq", 1, 8, NOW, "ORD-1", 5, "\xff\x00", 2,
                       h);
    o = json_line(&r, -1);
    cr_expect_str_eq(json_string_value(json_object_get(o, "value_hex")),
                     "ff00");
    json_decref(o);
    idem_dlqrec_clear(&r);
    rd_kafka_headers_destroy(h);
}

/* inspect shows the original headers (in order, repeats kept, the DLQ's
 * own left out: they are decoded) and the identity. */
Test(dlqrec, lines_show_original_headers_and_identity)
{
    rd_kafka_headers_t *h = ours("handler-rejected", "2026-12-01T00:00:00Z");
    rd_kafka_header_add(h, "traceparent", -1, "00-abc-def-01", -1);
    rd_kafka_header_add(h, "kafka_dlt-original-topic", -1, "payments", -1);
    rd_kafka_header_add(h, "bin", -1, "\xff\x01", 2);
    rd_kafka_header_add(h, "nil", -1, NULL, 0);
    rd_kafka_header_add(h, "bad\xffname", -1, "v", 1); /* a foreign one */
    idem_dlqrec_t r;
    const char *value = "{\"meta\":{\"event_id\":\"e-1\"}}";
    idem_dlqrec_decode(&r, "orders.dlq", 0, 3, NOW, "c-1", 3, value,
                       strlen(value), h);
    r.identity = "e-1";
    r.identity_len = 3;
    json_t *o = json_line(&r, -1);
    cr_expect_str_eq(json_string_value(json_object_get(o, "identity")), "e-1");
    json_t *hs = json_object_get(o, "headers");
    cr_assert(json_is_array(hs));
    cr_assert_eq(json_array_size(hs), 5, "only the original ones");
    json_t *bad = json_array_get(hs, 4);
    cr_expect_str_eq(
        json_string_value(json_object_get(json_array_get(bad, 0), "hex")),
        "626164ff6e616d65");
    cr_expect_str_eq(json_string_value(json_array_get(bad, 1)), "v");
    const char *names[] = {"message_id", "traceparent", "bin", "nil"};
    for (size_t i = 0; i < 4; i++)
        cr_expect_str_eq(
            json_string_value(json_array_get(json_array_get(hs, i), 0)),
            names[i]);
    cr_expect_str_eq(
        json_string_value(json_array_get(json_array_get(hs, 1), 1)),
        "00-abc-def-01");
    cr_expect_str_eq(json_string_value(json_object_get(
                         json_array_get(json_array_get(hs, 2), 1), "hex")),
                     "ff01");
    cr_expect(json_is_null(json_array_get(json_array_get(hs, 3), 1)));
    json_decref(o);

    r.identity = NULL;
    r.identity_error = "no identity (tried value:/meta/event_id)";
    o = json_line(&r, -1);
    cr_expect_null(json_object_get(o, "identity"));
    cr_expect_str_eq(json_string_value(json_object_get(o, "identity_error")),
                     "no identity (tried value:/meta/event_id)");
    json_decref(o);

    char *buf = NULL;
    size_t len = 0;
    FILE *fp = open_memstream(&buf, &len);
    r.identity = "e-1";
    idem_dlqrec_print_text(&r, -1, fp);
    fclose(fp);
    cr_expect(strstr(buf, "\n  identity: e-1\n"), "%s", buf);
    cr_expect(strstr(buf, "\n  header:   traceparent: 00-abc-def-01\n"), "%s",
              buf);
    cr_expect_null(strstr(buf, "header:   dlq."), "%s", buf);
    cr_expect_null(strstr(buf, "header:   kafka_dlt-"), "%s", buf);
    free(buf);
    idem_dlqrec_clear(&r);
    rd_kafka_headers_destroy(h);
}

/* inspect's text escapes what is not well-formed UTF-8 and control
 * characters, and cuts long header values, keys and values at --max-bytes
 * (saying how long they were); -1 shows them whole; JSON stays exact. */
Test(dlqrec, text_escapes_bytes_and_cuts_long_fields)
{
    rd_kafka_headers_t *h = ours("not-json\x1b[2J", "2026-12-01T00:00:00Z");
    char big[3000];
    memset(big, 'h', sizeof(big));
    rd_kafka_header_add(h, "big", -1, big, sizeof(big));
    /* a bare continuation byte, an overlong '/', a surrogate, C1 NEL, a
     * cut-off 3-byte character at the end; and é, which is fine */
    const char bad[] = "a\x80"
                       "b\xc0\xaf"
                       "c\xed\xa0\x80"
                       "d\xc2\x85\xc3\xa9\xe2\x82";
    rd_kafka_header_add(h, "odd", -1, bad, sizeof(bad) - 1);
    idem_dlqrec_t r;
    char key[600];
    memset(key, 'k', sizeof(key));
    const char *value = "{\"x\":\"\xff\xfe\t\"}";
    idem_dlqrec_decode(&r, "payments.dlq", 0, 5, NOW, key, sizeof(key), value,
                       strlen(value), h);
    char *buf = NULL;
    size_t len = 0;
    FILE *fp = open_memstream(&buf, &len);
    idem_dlqrec_print_text(&r, 256, fp);
    fclose(fp);
    cr_expect(strstr(buf, "  not-json\\x1b[2J  "), "%s", buf);
    cr_expect(strstr(buf, "\n  header:   big: hhhhhhhh"), "%s", buf);
    cr_expect(strstr(buf, "h ... (256 of 3000 bytes)\n"), "%s", buf);
    cr_expect(strstr(buf, "\n  header:   odd: a\\x80b\\xc0\\xafc\\xed\\xa0"
                          "\\x80d\\xc2\\x85\xc3\xa9\\xe2\\x82\n"),
              "%s", buf);
    cr_expect(strstr(buf, "k ... (256 of 600 bytes)\n"), "%s", buf);
    cr_expect(strstr(buf, "\n  value:    {\"x\":\"\\xff\\xfe\\x09\"}\n"), "%s",
              buf);
    for (size_t i = 0; i < len; i++)
        cr_assert(buf[i] == '\n' || ((unsigned char)buf[i] >= 0x20 &&
                                     (unsigned char)buf[i] != 0x7f &&
                                     (unsigned char)buf[i] != 0xff),
                  "raw byte 0x%02x at %zu", (unsigned char)buf[i], i);
    free(buf);
    buf = NULL;
    fp = open_memstream(&buf, &len);
    idem_dlqrec_print_text(&r, -1, fp);
    fclose(fp);
    cr_expect_null(strstr(buf, " bytes)"), "%s", buf);
    cr_expect(strstr(buf, "hhh\n"), "%s", buf);
    free(buf);
    /* JSON: every byte of every header, whatever the cut of the value. */
    json_t *o = json_line(&r, 4);
    json_t *hs = json_object_get(o, "headers");
    json_t *bigv = NULL, *oddv = NULL;
    for (size_t i = 0; i < json_array_size(hs); i++) {
        const char *n =
            json_string_value(json_array_get(json_array_get(hs, i), 0));
        if (n && !strcmp(n, "big"))
            bigv = json_array_get(json_array_get(hs, i), 1);
        if (n && !strcmp(n, "odd"))
            oddv = json_array_get(json_array_get(hs, i), 1);
    }
    cr_expect_eq(json_string_length(bigv), sizeof(big));
    cr_expect_eq(strlen(json_string_value(json_object_get(oddv, "hex"))),
                 2 * (sizeof(bad) - 1));
    cr_expect_eq(json_string_length(json_object_get(o, "key")), sizeof(key));
    json_decref(o);
    idem_dlqrec_clear(&r);
    rd_kafka_headers_destroy(h);
}

/* An empty dlq.reason is a row of its own that says so, not a blank one;
 * a missing one is (none); JSON keeps the empty name as it is. */
Test(dlqrec, stats_show_empty_and_missing_reasons)
{
    idem_dlqstats_t *s = idem_dlqstats_new();
    idem_dlqstats_partition(s, 0, 0, 3);
    const char *reasons[] = {"", "", NULL};
    for (int i = 0; i < 3; i++) {
        rd_kafka_headers_t *h = ours("x", "2026-12-01T00:00:00Z");
        rd_kafka_header_remove(h, "dlq.reason");
        if (reasons[i])
            rd_kafka_header_add(h, "dlq.reason", -1, reasons[i], 0);
        idem_dlqrec_t r;
        idem_dlqrec_decode(&r, "payments.dlq", 0, i, NOW, NULL, 0, "x", 1, h);
        idem_dlqstats_add(s, &r);
        idem_dlqrec_clear(&r);
        rd_kafka_headers_destroy(h);
    }
    char *buf = NULL;
    size_t len = 0;
    FILE *fp = open_memstream(&buf, &len);
    idem_dlqstats_print(s, "payments.dlq", fp);
    idem_dlqstats_print_json(s, "payments.dlq", fp);
    fclose(fp);
    cr_expect(strstr(buf, "by reason:\n  (empty)                   2\n  "
                          "(none)                    1\n"),
              "%s", buf);
    cr_expect(strstr(buf, "(empty: dlq.reason is there but empty"), "%s", buf);
    cr_expect(strstr(buf, "(none: no dlq.reason header"), "%s", buf);
    cr_expect_null(strstr(buf, "\n                     "), "blank row: %s",
                   buf);
    cr_expect(strstr(buf, "\"by_reason\":{\"\":2,\"(none)\":1}"), "%s", buf);
    free(buf);
    idem_dlqstats_destroy(s);
}

static const char *hget(const rd_kafka_headers_t *h, const char *name,
                        char *buf, size_t size)
{
    const void *v;
    size_t n;
    if (rd_kafka_header_get_last(h, name, &v, &n))
        return NULL;
    snprintf(buf, size, "%.*s", (int)n, (const char *)v);
    return buf;
}

/* A replay keeps the record's own headers, drops what the DLQ added (ours
 * and Spring's), and counts itself. */
Test(dlqrec, replay_headers)
{
    rd_kafka_headers_t *h = ours("handler-rejected", "2026-12-01T00:00:00Z");
    idem_dlq_spring_headers(h, "payments", 3, 1042, 0,
                            RD_KAFKA_TIMESTAMP_CREATE_TIME, "g",
                            "handler-rejected", "x");
    rd_kafka_header_add(h, "dlq.replay.count", -1, "1", -1);
    rd_kafka_header_add(h, "dlq.replayed.from", -1, "payments.dlq/0/1", -1);
    idem_dlqrec_t r;
    idem_dlqrec_decode(&r, "payments.dlq", 1, 7, NOW, "ORD-1", 5, "{}", 2, h);
    cr_expect_eq(r.replay_count, 1);
    rd_kafka_headers_t *out = idem_dlqrec_replay_headers(&r);
    char buf[128];
    const char *name;
    const void *v;
    size_t n, cnt = 0;
    for (size_t i = 0; !rd_kafka_header_get_all(out, i, &name, &v, &n); i++)
        cnt++;
    cr_expect_eq(cnt, 3, "message_id, dlq.replayed.from, dlq.replay.count");
    cr_expect_str_eq(hget(out, "message_id", buf, sizeof(buf)), "m-1");
    cr_expect_str_eq(hget(out, "dlq.replayed.from", buf, sizeof(buf)),
                     "payments.dlq/1/7");
    cr_expect_str_eq(hget(out, "dlq.replay.count", buf, sizeof(buf)), "2");
    rd_kafka_headers_destroy(out);

    cr_expect_null(idem_dlqrec_refusal(&r, 3, 0, buf, sizeof(buf)));
    cr_expect_not_null(idem_dlqrec_refusal(&r, 1, 0, buf, sizeof(buf)));
    cr_expect(strstr(buf, "replayed 1 times already (dlq.replay.max=1)"), "%s",
              buf);
    idem_dlqrec_clear(&r);
    rd_kafka_headers_destroy(h);

    /* A dead letter without its value cannot be replayed from the DLQ. */
    h = ours("too-large", NULL);
    rd_kafka_header_add(h, "dlq.value.dropped", -1, "2000000", -1);
    idem_dlqrec_decode(&r, "payments.dlq", 0, 0, NOW, NULL, 0, NULL, 0, h);
    cr_expect_not_null(idem_dlqrec_refusal(&r, 3, 0, buf, sizeof(buf)));
    cr_expect(strstr(buf, "2000000 bytes"), "%s", buf);
    cr_expect(strstr(buf, "payments/3/1042"), "%s", buf);
    idem_dlqrec_clear(&r);
    rd_kafka_headers_destroy(h);
}

Test(dlqrec, stats_count_distinct_originals_and_gaps)
{
    idem_dlqstats_t *s = idem_dlqstats_new();
    idem_dlqstats_partition(s, 0, 0, 2);
    idem_dlqstats_partition(s, 1, 15, 16);
    const char *reasons[] = {"not-json", "not-json", "too-large"};
    const char *at[] = {"2026-12-01T00:00:02.000Z", "2026-12-01T00:00:01.000Z",
                        "2026-12-01T00:00:03.000Z"};
    for (int i = 0; i < 3; i++) {
        rd_kafka_headers_t *h = ours(reasons[i], at[i]);
        idem_dlqrec_t r;
        /* The first two are the same original written twice. */
        if (i == 2) {
            rd_kafka_header_remove(h, "dlq.original.offset");
            rd_kafka_header_add(h, "dlq.original.offset", -1, "9", -1);
        }
        idem_dlqrec_decode(&r, "payments.dlq", i < 2 ? 0 : 1, i, NOW, NULL, 0,
                           "x", 1, h);
        idem_dlqstats_add(s, &r);
        idem_dlqrec_clear(&r);
        rd_kafka_headers_destroy(h);
    }
    char *buf = NULL;
    size_t len = 0;
    FILE *fp = open_memstream(&buf, &len);
    idem_dlqstats_print_json(s, "payments.dlq", fp);
    idem_dlqstats_print(s, "payments.dlq", fp);
    fclose(fp);
    json_t *o = json_loads(buf, JSON_DISABLE_EOF_CHECK, NULL);
    cr_assert(o, "%s", buf);
    cr_expect_eq(json_integer_value(json_object_get(o, "written")), 3);
    cr_expect_eq(json_integer_value(json_object_get(o, "distinct")), 2);
    cr_expect_eq(json_integer_value(json_object_get(o, "gone")), 15);
    cr_expect_str_eq(json_string_value(json_object_get(o, "oldest_failed_at")),
                     "2026-12-01T00:00:01.000Z");
    cr_expect_str_eq(json_string_value(json_object_get(o, "newest_failed_at")),
                     "2026-12-01T00:00:03.000Z");
    json_t *by = json_object_get(o, "by_reason");
    cr_expect_eq(json_integer_value(json_object_get(by, "not-json")), 2);
    cr_expect_eq(json_integer_value(json_object_get(by, "too-large")), 1);
    json_decref(o);
    cr_expect(strstr(buf, "partition 1 starts at offset 15: 15 earlier dead "
                          "letters are gone"),
              "%s", buf);
    cr_expect(strstr(buf, "3 dead letters, 2 distinct originals"), "%s", buf);
    free(buf);
    idem_dlqstats_destroy(s);
}
