/* test_retrytopic (unit): retry.topics' delays, names and headers and the
 * configuration checks, without a broker. */
#include "conf/conf.h"
#include "testlib.h"
#include "kafka/retrytopic.h"
#include "base/util.h"

#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---------------------------------------------------------- no broker */

Test(retrytopic, delays_parse_with_units_and_name_topics)
{
    int64_t d[IDEM_RETRY_TIERS_MAX];
    size_t n;
    char err[256];
    cr_assert_eq(
        idem_retrytopic_parse(" 200ms, 5s ,1m,2h", d, &n, err, sizeof(err)), 0,
        "%s", err);
    cr_assert_eq(n, 4);
    cr_expect_eq(d[0], 200);
    cr_expect_eq(d[1], 5000);
    cr_expect_eq(d[2], 60000);
    cr_expect_eq(d[3], 7200000);
    cr_assert_eq(idem_retrytopic_parse("", d, &n, err, sizeof(err)), 0);
    cr_expect_eq(n, 0, "empty: blocking retries");
    cr_assert_eq(idem_retrytopic_parse("  ", d, &n, err, sizeof(err)), 0);
    cr_expect_eq(n, 0);
    cr_assert_eq(idem_retrytopic_parse(NULL, d, &n, err, sizeof(err)), 0);
    cr_expect_eq(n, 0);

    char b[64];
    cr_expect_str_eq(idem_retrytopic_label(200, b, sizeof(b)), "200ms");
    cr_expect_str_eq(idem_retrytopic_label(1500, b, sizeof(b)), "1500ms");
    cr_expect_str_eq(idem_retrytopic_label(5000, b, sizeof(b)), "5s");
    cr_expect_str_eq(idem_retrytopic_label(90000, b, sizeof(b)), "90s");
    cr_expect_str_eq(idem_retrytopic_label(60000, b, sizeof(b)), "1m");
    cr_expect_str_eq(idem_retrytopic_label(3600000, b, sizeof(b)), "1h");
    cr_expect_str_eq(idem_retrytopic_name("payments", 5000, b, sizeof(b)),
                     "payments.retry.5s");
    /* The same delay written two ways is the same topic. */
    char c[64];
    idem_retrytopic_name("p", 60000, b, sizeof(b));
    cr_expect_str_eq(b, idem_retrytopic_name("p", 60 * 1000, c, sizeof(c)));
}

typedef struct {
    char spec[64];
    char error[96]; /* a part of the message */
} bad_delay_t;

ParameterizedTestParameters(retrytopic, bad_delays_name_the_item)
{
    static bad_delay_t cases[] = {
        {"5", "needs a unit"},
        {"5x", "unknown unit"},
        {"ms", "is not a delay"},
        {"0s", "out of range"},
        {"8d", "out of range"},
        {"5w", "unknown unit"},
        {"169h", "out of range"},
        {"5s,1s", "delays must ascend"},
        {"1m,60s", "delays must ascend"},
        {"1s,,2s", "empty delay"},
        {"1s,2s,3s,4s,5s,6s,7s,8s,9s", "more than 8 delays"},
        {"-1s", "is not a delay"},
    };
    return cr_make_param_array(bad_delay_t, cases,
                               sizeof(cases) / sizeof(cases[0]));
}

ParameterizedTest(bad_delay_t *c, retrytopic, bad_delays_name_the_item)
{
    int64_t d[IDEM_RETRY_TIERS_MAX];
    size_t n = 99;
    char err[256] = "";
    cr_assert_eq(idem_retrytopic_parse(c->spec, d, &n, err, sizeof(err)), -1,
                 "\"%s\" was accepted", c->spec);
    cr_expect_eq(n, 0);
    cr_expect(strstr(err, "retry.topics: "), "%s", err);
    cr_expect(strstr(err, c->error), "\"%s\": %s", c->spec, err);
    cr_expect(!strchr(err, '\n'), "one line: %s", err);
}

Test(retrytopic, headers_carry_the_origin_and_replace_their_own)
{
    rd_kafka_headers_t *orig = rd_kafka_headers_new(4);
    rd_kafka_header_add(orig, "message_id", -1, "m-1", -1);
    rd_kafka_header_add(orig, IDEM_RETRY_H_ATTEMPT, -1, "1", -1);
    rd_kafka_header_add(orig, IDEM_RETRY_H_TOPIC, -1, "stale", -1);
    idem_retry_info_t o = {.partition = 3, .offset = 42, .timestamp = 1700};
    snprintf(o.topic, sizeof(o.topic), "payments");
    rd_kafka_headers_t *h = idem_retrytopic_headers_new(
        orig, &o, 2, 1234567890123LL, "HTTP 503: busy, later");
    /* Each retry.* header once, the others kept. */
    cr_expect_eq(rd_kafka_header_cnt(h), 8);
    const void *v;
    size_t len;
    cr_assert_eq(rd_kafka_header_get_last(h, "message_id", &v, &len), 0);
    cr_expect_eq(len, 3);
    idem_retry_info_t back;
    cr_assert_eq(idem_retrytopic_info_read(h, &back), 0);
    cr_expect_str_eq(back.topic, "payments");
    cr_expect_eq(back.partition, 3);
    cr_expect_eq(back.offset, 42);
    cr_expect_eq(back.timestamp, 1700);
    cr_expect_eq(back.attempts, 2);
    cr_expect_eq(back.due_ms, 1234567890123LL);
    cr_assert_eq(rd_kafka_header_get_last(h, IDEM_RETRY_H_ERROR, &v, &len), 0);
    cr_expect_eq(len, strlen("HTTP 503: busy, later"));
    cr_expect_eq(memcmp(v, "HTTP 503: busy, later", len), 0);
    /* Stripped, they are gone. */
    idem_retrytopic_headers_strip(h);
    cr_expect_eq(rd_kafka_header_cnt(h), 1);
    cr_expect_eq(idem_retrytopic_info_read(h, &back), -1);
    cr_expect_eq(back.attempts, 0);
    cr_expect_eq(back.due_ms, -1);
    cr_expect_str_eq(back.topic, "");
    rd_kafka_headers_destroy(h);
    rd_kafka_headers_destroy(orig);
    /* No headers at all, or malformed ones: unknown. */
    cr_expect_eq(idem_retrytopic_info_read(NULL, &back), -1);
    rd_kafka_headers_t *bad = rd_kafka_headers_new(4);
    rd_kafka_header_add(bad, IDEM_RETRY_H_TOPIC, -1, "p", -1);
    rd_kafka_header_add(bad, IDEM_RETRY_H_PARTITION, -1, "x1", -1);
    rd_kafka_header_add(bad, IDEM_RETRY_H_OFFSET, -1, "7", -1);
    rd_kafka_header_add(bad, IDEM_RETRY_H_TIMESTAMP, -1, "7", -1);
    rd_kafka_header_add(bad, IDEM_RETRY_H_DUE_AT, -1, "soon", -1);
    cr_expect_eq(idem_retrytopic_info_read(bad, &back), -1);
    cr_expect_eq(back.partition, -1);
    cr_expect_eq(back.due_ms, -1);
    rd_kafka_headers_destroy(bad);
}

Test(retrytopic, tiers_of_every_input_and_where_a_failure_goes_next)
{
    int64_t d[] = {200, 5000};
    idem_retrytopics_t *rt = idem_retrytopics_new(" a , b", d, 2);
    cr_assert_eq(idem_retrytopics_count(rt), 4);
    cr_expect_str_eq(idem_retrytopics_at(rt, 0), "a.retry.200ms");
    cr_expect_str_eq(idem_retrytopics_at(rt, 1), "a.retry.5s");
    cr_expect_str_eq(idem_retrytopics_at(rt, 2), "b.retry.200ms");
    cr_expect_str_eq(idem_retrytopics_at(rt, 3), "b.retry.5s");
    cr_expect_null(idem_retrytopics_at(rt, 4));
    cr_expect_eq(idem_retrytopics_tier(rt, "a"), 0);
    cr_expect_eq(idem_retrytopics_tier(rt, "b.retry.200ms"), 1);
    cr_expect_eq(idem_retrytopics_tier(rt, "b.retry.5s"), 2);
    cr_expect_eq(idem_retrytopics_tier(rt, "c.retry.5s"), 0);
    cr_expect_str_eq(idem_retrytopics_next(rt, "a"), "a.retry.200ms");
    cr_expect_str_eq(idem_retrytopics_next(rt, "a.retry.200ms"), "a.retry.5s");
    cr_expect_null(idem_retrytopics_next(rt, "a.retry.5s"), "last tier");
    cr_expect_str_eq(idem_retrytopics_next(rt, "b.retry.200ms"), "b.retry.5s");
    cr_expect_null(idem_retrytopics_next(rt, "c"));
    cr_expect_str_eq(idem_retrytopics_topic(rt, "b", 2), "b.retry.5s");
    cr_expect_null(idem_retrytopics_topic(rt, "b", 3));
    cr_expect_eq(idem_retrytopics_delay(rt, 2), 5000);
    cr_expect_eq(idem_retrytopics_delay(rt, 0), 0);
    cr_expect_eq(idem_retrytopics_tiers(rt), 2);
    idem_retrytopics_destroy(rt);
    idem_retrytopics_destroy(NULL);
    cr_expect_eq(idem_retrytopics_tier(NULL, "a"), 0);
}

/* A processor conf with the given sets; NULL with err when refused. */
static idem_conf_t *conf_load(const char *const sets[], char *err, size_t errsz)
{
    const char *base[] = {"kafka.bootstrap.servers=127.0.0.1:1", "group.id=g",
                          "input.topics=payments", "dlq.topic=payments.dlq",
                          NULL};
    char *all[32];
    size_t n = 0;
    for (size_t i = 0; base[i]; i++)
        all[n++] = (char *)base[i];
    for (size_t i = 0; sets && sets[i]; i++)
        all[n++] = (char *)sets[i];
    char *envp[] = {NULL};
    return idem_conf_load(NULL, envp, all, n, err, errsz);
}

Test(retrytopic, conf_checks_the_topics_it_would_use)
{
    char err[512];
    const char *ok[] = {"retry.topics=200ms,1m", NULL};
    idem_conf_t *c = conf_load(ok, err, sizeof(err));
    cr_assert(c, "%s", err);
    cr_expect_eq(c->retry_tiers, 2);
    cr_expect_eq(c->retry_delays_ms[1], 60000);
    idem_conf_destroy(c);
    c = conf_load(NULL, err, sizeof(err));
    cr_assert(c, "%s", err);
    cr_expect_eq(c->retry_tiers, 0, "default: blocking retries");
    idem_conf_destroy(c);

    struct {
        const char *sets[4];
        const char *error;
    } bad[] = {
        {{"retry.topics=5s,1s"}, "retry.topics: \"1s\" is not longer"},
        {{"retry.topics=5s", "dlq.topic=payments.retry.5s"},
         "retry topic \"payments.retry.5s\" is the dlq.topic"},
        {{"retry.topics=5s", "input.topics=payments,payments.retry.5s"},
         "is also in input.topics"},
        {{"retry.topics=1s", "handler=forward",
          "output.topic=payments.retry.1s"},
         "is the output.topic"},
        {{"retry.topics=1s", "input.topics=^pay.*", "dlq.topic=dead"},
         "regex in input.topics"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        c = conf_load(bad[i].sets, err, sizeof(err));
        cr_expect_null(c, "case %zu accepted", i);
        idem_conf_destroy(c);
        cr_expect(strstr(err, bad[i].error), "case %zu: %s", i, err);
    }
}

#define LINE(fp, ...) fprintf((fp), __VA_ARGS__), fputc('\n', (fp))

/* Metadata as the brokers would give it: "name:count" items, NULL-ended. */
static rd_kafka_metadata_t *md_of(const char *const topics[],
                                  rd_kafka_metadata_topic_t *t, size_t room)
{
    static rd_kafka_metadata_t md;
    size_t n = 0;
    for (; topics[n] && n < room; n++) {
        const char *colon = strchr(topics[n], ':');
        t[n] = (rd_kafka_metadata_topic_t){
            .topic = strndup(topics[n], (size_t)(colon - topics[n])),
            .partition_cnt = atoi(colon + 1)};
    }
    md = (rd_kafka_metadata_t){.topic_cnt = (int)n, .topics = t};
    return &md;
}

static void md_free(rd_kafka_metadata_t *md)
{
    for (int i = 0; i < md->topic_cnt; i++)
        free(md->topics[i].topic);
}

/* A copy keeps its partition number, so each retry topic needs at least
 * its input's partition count: fewer is refused with both counts, a
 * missing one with the count to create it with; more is fine, and an
 * input that is not there yet is not checked. */
Test(retrytopic, partition_counts_of_the_retry_topics_are_checked)
{
    const int64_t d[] = {500, 60000};
    idem_retrytopics_t *rt = idem_retrytopics_new("a,b", d, 2);
    rd_kafka_metadata_topic_t t[8];
    char err[512] = "";

    const char *ok[] = {"a:4",
                        "b:1",
                        "a.retry.500ms:4",
                        "a.retry.1m:6",
                        "b.retry.500ms:1",
                        "b.retry.1m:3",
                        NULL};
    rd_kafka_metadata_t *md = md_of(ok, t, 8);
    cr_expect_eq(idem_retrytopics_check_md(rt, md, err, sizeof(err)), 0, "%s",
                 err);
    md_free(md);

    const char *fewer[] = {"a:4",
                           "b:1",
                           "a.retry.500ms:4",
                           "a.retry.1m:2",
                           "b.retry.500ms:1",
                           "b.retry.1m:1",
                           NULL};
    md = md_of(fewer, t, 8);
    cr_expect_eq(idem_retrytopics_check_md(rt, md, err, sizeof(err)), -1);
    cr_expect(strstr(err, "retry topic a.retry.1m has 2 partitions, input "
                          "topic a has 4"),
              "%s", err);
    md_free(md);

    const char *missing[] = {"a:4",          "b:3",          "a.retry.500ms:4",
                             "a.retry.1m:4", "b.retry.1m:3", NULL};
    md = md_of(missing, t, 8);
    cr_expect_eq(idem_retrytopics_check_md(rt, md, err, sizeof(err)), -1);
    cr_expect(strstr(err, "retry topic b.retry.500ms does not exist: create "
                          "it with at least 3 partitions, the partition "
                          "count of input topic b"),
              "%s", err);
    md_free(md);

    const char *no_input[] = {"a:2", "a.retry.500ms:2", "a.retry.1m:2", NULL};
    md = md_of(no_input, t, 8);
    cr_expect_eq(idem_retrytopics_check_md(rt, md, err, sizeof(err)), 0, "%s",
                 err);
    md_free(md);
    idem_retrytopics_destroy(rt);
}
