/* test_metrics: counters, histograms, lag from librdkafka statistics,
 * readiness and the exact Prometheus text the metrics module renders. */
#include "testlib.h"
#include "obs/metrics.h"

#include <criterion/criterion.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

static char *render(idem_metrics_t *m)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *fp = open_memstream(&buf, &len);
    idem_metrics_render(m, fp);
    fclose(fp);
    return buf;
}

/* 1 when `line` is a whole line of text. */
static int has_line(const char *text, const char *line)
{
    size_t l = strlen(line);
    for (const char *p = text; (p = strstr(p, line)); p++)
        if ((p == text || p[-1] == '\n') && (p[l] == '\n' || p[l] == '\0'))
            return 1;
    return 0;
}

#define expect_line(text, line)                                                \
    cr_expect(has_line(text, line), "missing line: %s\n--- got:\n%s", line,    \
              text)

/* Value of the sample whose name-and-labels part is exactly `series`;
 * -1 when absent. */
static double sample(const char *text, const char *series)
{
    size_t l = strlen(series);
    for (const char *p = text; (p = strstr(p, series)); p++)
        if ((p == text || p[-1] == '\n') && p[l] == ' ')
            return strtod(p + l + 1, NULL);
    return -1;
}

static char *slurp_src(const char *rel, size_t *len)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", th_src(), rel);
    char *s = th_slurp(path, len);
    cr_assert(s, "cannot read %s", path);
    return s;
}

Test(metrics, every_labelled_counter_starts_at_zero)
{
    idem_metrics_t *m = idem_metrics_new();
    char *t = render(m);
    expect_line(t, "idemproc_records_total{outcome=\"processed\"} 0");
    expect_line(t, "idemproc_records_total{outcome=\"duplicate\"} 0");
    expect_line(t, "idemproc_records_total{outcome=\"dlq\"} 0");
    expect_line(t, "idemproc_duplicates_total{kind=\"redelivery\"} 0");
    expect_line(t, "idemproc_duplicates_total{kind=\"resend\"} 0");
    for (int r = 0; r < IDEM_REASON_CNT; r++) {
        char line[128];
        snprintf(line, sizeof(line),
                 "idemproc_dlq_records_total{reason=\"%s\"} 0",
                 idem_reason2str((idem_reason_t)r));
        expect_line(t, line);
    }
    expect_line(t, "idemproc_retries_total 0");
    for (int i = 0; idem_metrics_redis_classes[i]; i++) {
        char line[128];
        snprintf(line, sizeof(line),
                 "idemproc_redis_errors_total{class=\"%s\"} 0",
                 idem_metrics_redis_classes[i]);
        expect_line(t, line);
    }
    expect_line(t, "idemproc_redis_position_behind_total 0");
    expect_line(t, "idemproc_redis_aof_rewrites_total{result=\"ok\"} 0");
    expect_line(t, "idemproc_redis_aof_rewrites_total{result=\"failed\"} 0");
    expect_line(t, "idemproc_redis_aof_rewrites_total{result=\"refused\"} 0");
    for (int i = 0; idem_metrics_mismatch_reasons[i]; i++) {
        char line[128];
        snprintf(line, sizeof(line),
                 "idemproc_position_mismatch_total{reason=\"%s\"} 0",
                 idem_metrics_mismatch_reasons[i]);
        expect_line(t, line);
    }
    expect_line(t, "idemproc_redis_eviction_allowed 0");
    expect_line(t, "idemproc_commits_total{result=\"ok\"} 0");
    expect_line(t, "idemproc_commits_total{result=\"error\"} 0");
    expect_line(t, "idemproc_rebalances_total{event=\"assign\"} 0");
    expect_line(t, "idemproc_rebalances_total{event=\"revoke\"} 0");
    expect_line(t, "idemproc_rebalances_total{event=\"lost\"} 0");
    expect_line(t, "idemproc_last_commit_timestamp_seconds 0");
    expect_line(t, "idemproc_ready 0");
    expect_line(t, "# TYPE idemproc_records_total counter");
    expect_line(t, "# TYPE idemproc_processing_latency_seconds histogram");
    expect_line(t, "# TYPE idemproc_consumer_lag_records gauge");
    cr_expect(strstr(t, "idemproc_build_info{version=\"" IDEM_VERSION
                        "\",librdkafka=\""),
              "%s", t);
    cr_expect_gt(sample(t, "idemproc_start_time_seconds"), 1.5e9);
    /* No lag series before the first statistics document. */
    cr_expect_null(strstr(t, "idemproc_consumer_lag_records{"));
    cr_expect_eq(idem_metrics_lag_total(m), -1);
    free(t);
    idem_metrics_destroy(m);
    idem_metrics_destroy(NULL);
}

Test(metrics, counters_render_exact_values)
{
    idem_metrics_t *m = idem_metrics_new();
    idem_metrics_outcome_add(m, IDEM_OUTCOME_PROCESSED, 40);
    idem_metrics_outcome_add(m, IDEM_OUTCOME_PROCESSED, 2);
    idem_metrics_outcome_add(m, IDEM_OUTCOME_DUPLICATE, 7);
    idem_metrics_outcome_add(m, IDEM_OUTCOME_DLQ, 3);
    idem_metrics_outcome_add(m, IDEM_OUTCOME_CNT, 99); /* ignored */
    idem_metrics_duplicate_add(m, IDEM_DUP_REDELIVERY, 5);
    idem_metrics_duplicate_add(m, IDEM_DUP_RESEND, 2);
    idem_metrics_dlq_add(m, IDEM_REASON_NOT_JSON, 2);
    idem_metrics_dlq_add(m, IDEM_REASON_MAX_RETRIES, 1);
    idem_metrics_retry_add(m, 9);
    idem_metrics_redis_error_add(m, "oom", 3);
    idem_metrics_redis_error_add(m, "no-such-class", 1);
    idem_metrics_redis_behind_add(m, 2);
    idem_metrics_redis_aof_rewrite_add(m, "ok");
    idem_metrics_redis_aof_rewrite_add(m, "refused");
    idem_metrics_redis_aof_rewrite_add(m, "refused");
    idem_metrics_redis_aof_rewrite_add(m, "bogus"); /* ignored */
    idem_metrics_position_mismatch_add(m, "cluster");
    idem_metrics_position_mismatch_add(m, "past-end");
    idem_metrics_position_mismatch_add(m, NULL); /* ignored */
    idem_metrics_redis_error_add(m, "aofrewrite", 4);
    idem_metrics_redis_eviction_set(m, 1);
    idem_metrics_commit_add(m, 1);
    idem_metrics_commit_add(m, 1);
    idem_metrics_commit_add(m, 0);
    idem_metrics_rebalance_add(m, "assign");
    idem_metrics_rebalance_add(m, "assign");
    idem_metrics_rebalance_add(m, "revoke");
    idem_metrics_rebalance_add(m, "bogus"); /* ignored */
    idem_metrics_rebalance_add(m, NULL);    /* ignored */
    idem_metrics_assigned_set(m, 6);
    idem_metrics_paused_set(m, 2);
    idem_metrics_inflight_set(m, 123);

    char *t = render(m);
    expect_line(t, "idemproc_records_total{outcome=\"processed\"} 42");
    expect_line(t, "idemproc_records_total{outcome=\"duplicate\"} 7");
    expect_line(t, "idemproc_records_total{outcome=\"dlq\"} 3");
    expect_line(t, "idemproc_duplicates_total{kind=\"redelivery\"} 5");
    expect_line(t, "idemproc_duplicates_total{kind=\"resend\"} 2");
    expect_line(t, "idemproc_dlq_records_total{reason=\"not-json\"} 2");
    expect_line(t, "idemproc_dlq_records_total{reason=\"max-retries\"} 1");
    expect_line(t, "idemproc_dlq_records_total{reason=\"too-large\"} 0");
    expect_line(t, "idemproc_retries_total 9");
    expect_line(t, "idemproc_redis_errors_total{class=\"oom\"} 3");
    expect_line(t, "idemproc_redis_errors_total{class=\"other\"} 1");
    expect_line(t, "idemproc_redis_errors_total{class=\"timeout\"} 0");
    expect_line(t, "idemproc_redis_position_behind_total 2");
    expect_line(t, "idemproc_redis_aof_rewrites_total{result=\"ok\"} 1");
    expect_line(t, "idemproc_redis_aof_rewrites_total{result=\"failed\"} 0");
    expect_line(t, "idemproc_redis_aof_rewrites_total{result=\"refused\"} 2");
    expect_line(t, "idemproc_position_mismatch_total{reason=\"cluster\"} 1");
    expect_line(t, "idemproc_position_mismatch_total{reason=\"record\"} 0");
    expect_line(t, "idemproc_position_mismatch_total{reason=\"past-end\"} 1");
    expect_line(t, "idemproc_redis_errors_total{class=\"aofrewrite\"} 4");
    expect_line(t, "idemproc_redis_eviction_allowed 1");
    expect_line(t, "idemproc_commits_total{result=\"ok\"} 2");
    expect_line(t, "idemproc_commits_total{result=\"error\"} 1");
    expect_line(t, "idemproc_rebalances_total{event=\"assign\"} 2");
    expect_line(t, "idemproc_rebalances_total{event=\"revoke\"} 1");
    expect_line(t, "idemproc_rebalances_total{event=\"lost\"} 0");
    expect_line(t, "idemproc_assigned_partitions 6");
    expect_line(t, "idemproc_paused_partitions 2");
    expect_line(t, "idemproc_inflight_records 123");
    double last = sample(t, "idemproc_last_commit_timestamp_seconds");
    double now = (double)idem_wall_ms() / 1000.0;
    cr_expect(last > now - 60 && last <= now + 1, "last commit %f", last);
    cr_expect_null(strstr(t, "bogus"));

    cr_expect_eq(idem_metrics_outcome_get(m, IDEM_OUTCOME_PROCESSED), 42);
    cr_expect_eq(idem_metrics_duplicate_get(m, IDEM_DUP_RESEND), 2);
    cr_expect_eq(idem_metrics_dlq_get(m, IDEM_REASON_NOT_JSON), 2);
    cr_expect_eq(idem_metrics_dlq_get(m, IDEM_REASON_CNT), 0);
    free(t);
    idem_metrics_destroy(m);
}

Test(metrics, histogram_buckets_are_cumulative)
{
    idem_metrics_t *m = idem_metrics_new();
    /* 0.0005 is exactly on the first bound: "le" includes it. */
    double obs[] = {0.0001, 0.0005, 0.003, 0.003, 0.2, 7, 60};
    for (size_t i = 0; i < sizeof(obs) / sizeof(obs[0]); i++)
        idem_metrics_latency_observe(m, obs[i]);
    idem_metrics_batch_observe(m, 1);
    idem_metrics_batch_observe(m, 500);
    idem_metrics_batch_observe(m, 20000);
    idem_metrics_redis_observe(m, 0.0002);

    char *t = render(m);
    const char *lat = "idemproc_processing_latency_seconds";
    struct {
        const char *le;
        double want;
    } want[] = {{"0.0005", 2}, {"0.001", 2}, {"0.0025", 2}, {"0.005", 4},
                {"0.0075", 4}, {"0.01", 4},  {"0.015", 4},  {"0.02", 4},
                {"0.025", 4},  {"0.05", 4},  {"0.1", 4},    {"0.25", 5},
                {"0.5", 5},    {"1", 5},     {"2.5", 5},    {"5", 5},
                {"10", 6},     {"+Inf", 7}};
    double prev = 0;
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        char series[128];
        snprintf(series, sizeof(series), "%s_bucket{le=\"%s\"}", lat,
                 want[i].le);
        double v = sample(t, series);
        cr_expect_eq(v, want[i].want, "%s = %g, want %g", series, v,
                     want[i].want);
        cr_expect_geq(v, prev, "%s decreases", series);
        prev = v;
    }
    cr_expect_eq(sample(t, "idemproc_processing_latency_seconds_count"), 7);
    cr_expect_eq(sample(t, "idemproc_processing_latency_seconds_bucket{le=\""
                           "+Inf\"}"),
                 sample(t, "idemproc_processing_latency_seconds_count"));
    double sum = sample(t, "idemproc_processing_latency_seconds_sum");
    cr_expect_float_eq(sum, 67.2066, 1e-9, "sum %.17g", sum);

    expect_line(t, "idemproc_batch_size_records_bucket{le=\"1\"} 1");
    expect_line(t, "idemproc_batch_size_records_bucket{le=\"250\"} 1");
    expect_line(t, "idemproc_batch_size_records_bucket{le=\"500\"} 2");
    expect_line(t, "idemproc_batch_size_records_bucket{le=\"10000\"} 2");
    expect_line(t, "idemproc_batch_size_records_bucket{le=\"+Inf\"} 3");
    expect_line(t, "idemproc_batch_size_records_sum 20501");
    expect_line(t, "idemproc_batch_size_records_count 3");
    expect_line(t, "idemproc_redis_roundtrip_seconds_bucket{le=\"0.0001\"} 0");
    expect_line(t, "idemproc_redis_roundtrip_seconds_bucket{le=\"0.00025\"} 1");
    expect_line(t, "idemproc_redis_roundtrip_seconds_bucket{le=\"1\"} 1");
    expect_line(t, "idemproc_redis_roundtrip_seconds_count 1");
    free(t);
    idem_metrics_destroy(m);
}

Test(metrics, webhook_series_only_once_enabled)
{
    idem_metrics_t *m = idem_metrics_new();
    char *t = render(m);
    cr_expect_null(strstr(t, "idemproc_webhook"), "%s", t);
    free(t);
    idem_metrics_webhook_enable(m);
    t = render(m);
    for (int i = 0; idem_metrics_webhook_classes[i]; i++) {
        char line[128];
        snprintf(line, sizeof(line),
                 "idemproc_webhook_requests_total{class=\"%s\"} 0",
                 idem_metrics_webhook_classes[i]);
        expect_line(t, line);
    }
    expect_line(t, "# TYPE idemproc_webhook_latency_seconds histogram");
    free(t);
    idem_metrics_webhook_request_add(m, "2xx");
    idem_metrics_webhook_request_add(m, "2xx");
    idem_metrics_webhook_request_add(m, "timeout");
    idem_metrics_webhook_request_add(m, "no-such-class");
    idem_metrics_webhook_latency_observe(m, 0.004);
    idem_metrics_webhook_latency_observe(m, 0.3);
    t = render(m);
    expect_line(t, "idemproc_webhook_requests_total{class=\"2xx\"} 2");
    expect_line(t, "idemproc_webhook_requests_total{class=\"timeout\"} 1");
    expect_line(t, "idemproc_webhook_requests_total{class=\"error\"} 1");
    expect_line(t, "idemproc_webhook_latency_seconds_bucket{le=\"0.005\"} 1");
    expect_line(t, "idemproc_webhook_latency_seconds_bucket{le=\"0.5\"} 2");
    expect_line(t, "idemproc_webhook_latency_seconds_count 2");
    cr_expect_eq(idem_metrics_webhook_request_get(m, "2xx"), 2);
    free(t);
    idem_metrics_destroy(m);
}

/* The partition tables' gauges appear once dedup.scope=partition reports
 * them, with the values given. */
Test(metrics, dedup_table_gauges_only_once_reported)
{
    idem_metrics_t *m = idem_metrics_new();
    char *t = render(m);
    cr_expect_null(strstr(t, "idemproc_dedup_table"), "%s", t);
    free(t);
    idem_metrics_dedup_table_set(m, 41216, 2048, 1048576);
    t = render(m);
    expect_line(t, "# TYPE idemproc_dedup_table_bytes gauge");
    expect_line(t, "idemproc_dedup_table_bytes 41216");
    expect_line(t, "idemproc_dedup_table_marks 2048");
    expect_line(t, "idemproc_dedup_memory_max_bytes 1048576");
    expect_line(t, "# TYPE idemproc_dedup_layout_refusals_total counter");
    expect_line(t, "idemproc_dedup_layout_refusals_total{script=\"chunk\"} 0");
    expect_line(t, "idemproc_dedup_layout_refusals_total{script=\"global\"} 0");
    free(t);
    idem_metrics_dedup_layout_refusals_set(m, 3, 1);
    t = render(m);
    expect_line(t, "idemproc_dedup_layout_refusals_total{script=\"chunk\"} 3");
    expect_line(t, "idemproc_dedup_layout_refusals_total{script=\"global\"} 1");
    free(t);
    idem_metrics_dedup_table_set(m, 0, 0, 1048576);
    t = render(m);
    expect_line(t, "idemproc_dedup_table_bytes 0");
    free(t);
    idem_metrics_destroy(m);
}

/* A script request Redis refused to end: counted, and one series names
 * its first record (and how many records it holds) while it is in flight,
 * the one before replaced, gone once it is over. */
Test(metrics, script_unkillable_names_the_request_while_stuck)
{
    idem_metrics_t *m = idem_metrics_new();
    char *t = render(m);
    expect_line(t, "idemproc_script_unkillable_total 0");
    cr_expect_null(strstr(t, "idemproc_script_unkillable_offset"), "%s", t);
    free(t);
    idem_metrics_script_unkillable_set(m, "pay\"ments", 3, 1234567890123, 16);
    idem_metrics_script_unkillable_set(m, "payments", 2, 41, 1);
    t = render(m);
    expect_line(t, "idemproc_script_unkillable_total 2");
    expect_line(t, "idemproc_script_unkillable_offset{topic=\"payments\","
                   "partition=\"2\",records=\"1\"} 41");
    cr_expect_null(strstr(t, "partition=\"3\""), "%s", t);
    expect_line(t, "# TYPE idemproc_script_unkillable_offset gauge");
    free(t);
    idem_metrics_script_unkillable_clear(m);
    t = render(m);
    expect_line(t, "idemproc_script_unkillable_total 2");
    cr_expect_null(strstr(t, "idemproc_script_unkillable_offset"), "%s", t);
    cr_expect_eq(idem_metrics_script_unkillable_get(m), 2);
    free(t);
    idem_metrics_destroy(m);
}

Test(metrics, lag_parsed_from_rdkafka_statistics)
{
    idem_metrics_t *m = idem_metrics_new();
    size_t len;
    /* A real document from librdkafka 2.0.2 (mock cluster): payments/0
     * committed up to the high watermark (lag 0), payments/1 committed 2 of
     * 10 (lag 8), payments/2 consumed but never committed (consumer_lag -1)
     * and the internal partition "-1". */
    char *json = slurp_src("tests/data/rdkafka_stats.json", &len);
    cr_assert_eq(idem_metrics_stats_json(m, json, len), 0);
    cr_expect_eq(idem_metrics_lag_total(m), 8);
    char *t = render(m);
    expect_line(t, "idemproc_consumer_lag_records{topic=\"payments\","
                   "partition=\"0\"} 0");
    expect_line(t, "idemproc_consumer_lag_records{topic=\"payments\","
                   "partition=\"1\"} 8");
    cr_expect_null(strstr(t, "partition=\"2\""), "%s", t);
    cr_expect_null(strstr(t, "partition=\"-1\""), "%s", t);
    free(t);

    /* A broken document keeps the previous table. */
    cr_expect_eq(idem_metrics_stats_json(m, "{\"topics\":", 10), -1);
    cr_expect_eq(idem_metrics_stats_json(m, "[1]", 3), -1);
    cr_expect_eq(idem_metrics_lag_total(m), 8);

    /* The next document replaces the table: revoked partitions disappear
     * (desired=false), others are updated. */
    const char *next =
        "{\"topics\":{\"payments\":{\"partitions\":{"
        "\"0\":{\"desired\":true,\"consumer_lag\":17},"
        "\"1\":{\"desired\":false,\"consumer_lag\":8},"
        "\"-1\":{\"desired\":false,\"consumer_lag\":-1}}},"
        "\"refunds\":{\"partitions\":{\"4\":{\"consumer_lag\":3}}}}}";
    cr_assert_eq(idem_metrics_stats_json(m, next, strlen(next)), 0);
    cr_expect_eq(idem_metrics_lag_total(m), 20);
    t = render(m);
    expect_line(t, "idemproc_consumer_lag_records{topic=\"payments\","
                   "partition=\"0\"} 17");
    expect_line(t, "idemproc_consumer_lag_records{topic=\"refunds\","
                   "partition=\"4\"} 3");
    cr_expect_null(strstr(t, "partition=\"1\""), "%s", t);
    free(t);

    /* No topics at all: statistics arrived, nothing lags. */
    cr_assert_eq(idem_metrics_stats_json(m, "{}", 2), 0);
    cr_expect_eq(idem_metrics_lag_total(m), 0);
    free(json);
    idem_metrics_destroy(m);
}

Test(metrics, label_values_are_escaped)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *fp = open_memstream(&buf, &len);
    idem_metrics_escape_label("a\"b\\c\nd", fp);
    fclose(fp);
    cr_expect_str_eq(buf, "a\\\"b\\\\c\\nd");
    free(buf);

    idem_metrics_t *m = idem_metrics_new();
    const char *json = "{\"topics\":{\"we\\\"ird\\\\to\\npic\":{\"partitions\":"
                       "{\"0\":{\"consumer_lag\":5}}}}}";
    cr_assert_eq(idem_metrics_stats_json(m, json, strlen(json)), 0);
    char *t = render(m);
    expect_line(t, "idemproc_consumer_lag_records{topic=\"we\\\"ird\\\\to\\n"
                   "pic\",partition=\"0\"} 5");
    free(t);
    idem_metrics_destroy(m);
}

Test(metrics, readiness_and_reason)
{
    idem_metrics_t *m = idem_metrics_new();
    char reason[64];
    cr_expect_eq(idem_metrics_ready_get(m, reason, sizeof(reason)), 0);
    cr_expect_str_eq(reason, "starting");

    idem_metrics_ready_set(m, 0, "redis: connection refused");
    cr_expect_eq(idem_metrics_ready_get(m, reason, sizeof(reason)), 0);
    cr_expect_str_eq(reason, "redis: connection refused");
    char *t = render(m);
    expect_line(t, "idemproc_ready 0");
    free(t);

    idem_metrics_ready_set(m, 1, "ignored when ready");
    cr_expect_eq(idem_metrics_ready_get(m, reason, sizeof(reason)), 1);
    cr_expect_str_eq(reason, "");
    t = render(m);
    expect_line(t, "idemproc_ready 1");
    free(t);

    /* A long reason is cut to the caller's buffer, never overflowing. */
    char longr[600];
    memset(longr, 'x', sizeof(longr) - 1);
    longr[sizeof(longr) - 1] = '\0';
    idem_metrics_ready_set(m, 0, longr);
    char small[8];
    cr_expect_eq(idem_metrics_ready_get(m, small, sizeof(small)), 0);
    cr_expect_str_eq(small, "xxxxxxx");
    idem_metrics_ready_set(m, 0, NULL);
    cr_expect_eq(idem_metrics_ready_get(m, reason, sizeof(reason)), 0);
    cr_expect_str_eq(reason, "");
    idem_metrics_destroy(m);
}

Test(metrics, heartbeat_age)
{
    idem_metrics_t *m = idem_metrics_new();
    idem_metrics_heartbeat(m);
    cr_expect_lt(idem_metrics_heartbeat_age_ms(m), 1000);
    idem_metrics_heartbeat_at(m, idem_now_ms() - 5000);
    int64_t age = idem_metrics_heartbeat_age_ms(m);
    cr_expect(age >= 5000 && age < 6000, "age %" PRId64, age);
    idem_metrics_destroy(m);
}

#define HAMMER_THREADS 4
#define HAMMER_ROUNDS  20000

Test(metrics, effect_latency_has_fine_buckets_around_20_ms)
{
    idem_metrics_t *m = idem_metrics_new();
    idem_metrics_effect_latency_observe(m, -0.002); /* clock skew */
    idem_metrics_effect_latency_observe(m, 0.0189);
    idem_metrics_effect_latency_observe(m, 0.02);
    idem_metrics_effect_latency_observe(m, 0.0201);
    idem_metrics_effect_latency_observe(m, 3);
    char *t = render(m);
    expect_line(t, "# TYPE idemproc_effect_latency_seconds histogram");
    expect_line(t, "idemproc_effect_latency_seconds_bucket{le=\"0.001\"} 1");
    expect_line(t, "idemproc_effect_latency_seconds_bucket{le=\"0.015\"} 1");
    expect_line(t, "idemproc_effect_latency_seconds_bucket{le=\"0.02\"} 3");
    expect_line(t, "idemproc_effect_latency_seconds_bucket{le=\"0.025\"} 4");
    expect_line(t, "idemproc_effect_latency_seconds_bucket{le=\"0.04\"} 4");
    expect_line(t, "idemproc_effect_latency_seconds_bucket{le=\"0.075\"} 4");
    expect_line(t, "idemproc_effect_latency_seconds_bucket{le=\"2.5\"} 4");
    expect_line(t, "idemproc_effect_latency_seconds_bucket{le=\"+Inf\"} 5");
    expect_line(t, "idemproc_effect_latency_seconds_count 5");
    free(t);
    idem_metrics_destroy(m);
}

/* CreateTime -> poll: its own family, with the effect histogram's bounds,
 * so the bench can split a record's latency at the poll. */
Test(metrics, fetch_latency_is_its_own_histogram)
{
    idem_metrics_t *m = idem_metrics_new();
    idem_metrics_fetch_latency_observe(m, 0.009);
    idem_metrics_fetch_latency_observe(m, 0.0199);
    idem_metrics_effect_latency_observe(m, 0.03);
    char *t = render(m);
    expect_line(t, "# TYPE idemproc_fetch_latency_seconds histogram");
    expect_line(t, "idemproc_fetch_latency_seconds_bucket{le=\"0.0075\"} 0");
    expect_line(t, "idemproc_fetch_latency_seconds_bucket{le=\"0.01\"} 1");
    expect_line(t, "idemproc_fetch_latency_seconds_bucket{le=\"0.015\"} 1");
    expect_line(t, "idemproc_fetch_latency_seconds_bucket{le=\"0.02\"} 2");
    expect_line(t, "idemproc_fetch_latency_seconds_count 2");
    expect_line(t, "idemproc_effect_latency_seconds_count 1");
    free(t);
    idem_metrics_destroy(m);
}

static void *hammer(void *arg)
{
    idem_metrics_t *m = arg;
    for (int i = 0; i < HAMMER_ROUNDS; i++) {
        idem_metrics_outcome_add(m, IDEM_OUTCOME_PROCESSED, 1);
        idem_metrics_latency_observe(m, 0.001);
        idem_metrics_ready_set(m, i & 1, "flapping");
    }
    return NULL;
}

static void *scrape(void *arg)
{
    idem_metrics_t *m = arg;
    for (int i = 0; i < 50; i++) {
        char *t = render(m);
        /* +Inf and _count come from one locked snapshot. */
        cr_expect_eq(
            sample(t,
                   "idemproc_processing_latency_seconds_bucket{le=\"+Inf\"}"),
            sample(t, "idemproc_processing_latency_seconds_count"));
        free(t);
    }
    return NULL;
}

Test(metrics, concurrent_updates_are_not_lost)
{
    idem_metrics_t *m = idem_metrics_new();
    pthread_t th[HAMMER_THREADS + 1];
    for (int i = 0; i < HAMMER_THREADS; i++)
        pthread_create(&th[i], NULL, hammer, m);
    pthread_create(&th[HAMMER_THREADS], NULL, scrape, m);
    for (int i = 0; i <= HAMMER_THREADS; i++)
        pthread_join(th[i], NULL);
    cr_expect_eq(idem_metrics_outcome_get(m, IDEM_OUTCOME_PROCESSED),
                 (uint64_t)HAMMER_THREADS * HAMMER_ROUNDS);
    char *t = render(m);
    cr_expect_eq(sample(t, "idemproc_processing_latency_seconds_count"),
                 (double)HAMMER_THREADS * HAMMER_ROUNDS);
    free(t);
    idem_metrics_destroy(m);
}

/* The next line of *p that is not idemproc_start_time_seconds or a
 * process_* sample (two renderings made apart may differ there: the CPU
 * time, memory and descriptors of the process move between them),
 * advancing *p past it; its length in *len. NULL at the end. */
static const char *next_line(const char **p, size_t *len)
{
    while (**p) {
        const char *line = *p;
        *len = strcspn(line, "\n");
        *p = line + *len + (line[*len] == '\n');
        if (strncmp(line, "idemproc_start_time_seconds ", 28) &&
            strncmp(line, "process_", 8))
            return line;
    }
    return NULL;
}

/* 1 when a and b render the same, start time and process_* aside. */
static int same_rendering(const char *a, const char *b)
{
    for (;;) {
        size_t la = 0, lb = 0;
        const char *x = next_line(&a, &la), *y = next_line(&b, &lb);
        if (!x || !y)
            return !x && !y;
        if (la != lb || memcmp(x, y, la)) {
            cr_log_error("differs: %.*s | %.*s", (int)la, x, (int)lb, y);
            return 0;
        }
    }
}

/* What rec_finish observes for one record, both ways. */
static const double acc_values[] = {
    0.0001, 0.0005, 0.001,  0.0019, 0.003,   0.02, 0.0201, 0.3,
    7,      60,     -0.002, NAN,    0.00731, 1e-9, 2.5,    0.123456789};

Test(metrics, accumulated_then_merged_renders_as_observed_directly)
{
    idem_metrics_t *direct = idem_metrics_new();
    idem_metrics_t *merged = idem_metrics_new();
    idem_metrics_acc_t *a = idem_metrics_acc_new(merged);
    size_t n = sizeof(acc_values) / sizeof(acc_values[0]);
    for (size_t i = 0; i < n; i++) {
        double v = acc_values[i];
        idem_outcome_t o = (idem_outcome_t)(i % IDEM_OUTCOME_CNT);
        idem_metrics_outcome_add(direct, o, 1);
        idem_metrics_latency_observe(direct, v);
        idem_metrics_effect_latency_observe(direct, v * 2);
        idem_metrics_fetch_latency_observe(direct, v / 3);
        idem_metrics_acc_outcome_add(a, o, 1);
        idem_metrics_acc_latency_observe(a, v);
        idem_metrics_acc_effect_latency_observe(a, v * 2);
        idem_metrics_acc_fetch_latency_observe(a, v / 3);
    }
    idem_metrics_outcome_add(direct, IDEM_OUTCOME_CNT, 5); /* ignored */
    idem_metrics_acc_outcome_add(a, IDEM_OUTCOME_CNT, 5);

    /* Nothing shows before the merge. */
    char *before = render(merged);
    expect_line(before, "idemproc_records_total{outcome=\"processed\"} 0");
    expect_line(before, "idemproc_processing_latency_seconds_count 0");
    expect_line(before, "idemproc_effect_latency_seconds_count 0");
    expect_line(before, "idemproc_fetch_latency_seconds_count 0");
    cr_expect_eq(idem_metrics_outcome_get(merged, IDEM_OUTCOME_PROCESSED), 0);
    free(before);

    /* One merge into an empty histogram adds the values in the same order
     * as observing them one by one: the very same sum, to the last bit. */
    idem_metrics_acc_merge(a);
    char *want = render(direct);
    char *got = render(merged);
    cr_expect(same_rendering(got, want), "got:\n%s\nwant:\n%s", got, want);
    /* Not trivially equal: the values did land. */
    expect_line(got, "idemproc_processing_latency_seconds_count 15");
    expect_line(got, "idemproc_records_total{outcome=\"processed\"} 6");
    free(got);

    /* Merged again with nothing held: nothing moves (no double count). */
    idem_metrics_acc_merge(a);
    got = render(merged);
    cr_expect(same_rendering(got, want), "got:\n%s\nwant:\n%s", got, want);
    free(got);

    /* A second round, merged by destroy. */
    for (size_t i = 0; i < n; i++) {
        idem_metrics_outcome_add(direct, IDEM_OUTCOME_DLQ, 2);
        idem_metrics_latency_observe(direct, 0.25 * (double)i);
        idem_metrics_acc_outcome_add(a, IDEM_OUTCOME_DLQ, 2);
        idem_metrics_acc_latency_observe(a, 0.25 * (double)i);
    }
    idem_metrics_acc_destroy(a);
    idem_metrics_acc_destroy(NULL);
    free(want);
    want = render(direct);
    got = render(merged);
    /* Quarters: every partial sum is exact, so the sum matches too. */
    cr_expect(same_rendering(got, want), "got:\n%s\nwant:\n%s", got, want);
    expect_line(got, "idemproc_processing_latency_seconds_count 31");
    free(got);
    free(want);
    idem_metrics_destroy(direct);
    idem_metrics_destroy(merged);
}

Test(metrics, merge_with_nothing_accumulated_changes_nothing)
{
    idem_metrics_t *m = idem_metrics_new();
    idem_metrics_outcome_add(m, IDEM_OUTCOME_DUPLICATE, 3);
    idem_metrics_latency_observe(m, 0.004);
    idem_metrics_fetch_latency_observe(m, 0.01);
    char *want = render(m);
    idem_metrics_acc_t *a = idem_metrics_acc_new(m);
    idem_metrics_acc_merge(a);
    idem_metrics_acc_latency_observe(a, NAN); /* dropped: nothing held */
    idem_metrics_acc_outcome_add(a, (idem_outcome_t)-1, 1);
    idem_metrics_acc_merge(a);
    idem_metrics_acc_destroy(a);
    char *got = render(m);
    cr_expect(same_rendering(got, want), "got:\n%s\nwant:\n%s", got, want);
    free(got);
    free(want);
    idem_metrics_destroy(m);
}

/* The loop's way: many observations, a merge now and then. */
static void *accumulate(void *arg)
{
    idem_metrics_t *m = arg;
    idem_metrics_acc_t *a = idem_metrics_acc_new(m);
    for (int i = 0; i < HAMMER_ROUNDS; i++) {
        idem_metrics_acc_outcome_add(a, IDEM_OUTCOME_PROCESSED, 1);
        idem_metrics_acc_latency_observe(a, (double)(i % 40) / 1000.0);
        if (i % 37 == 0)
            idem_metrics_acc_merge(a);
    }
    idem_metrics_acc_destroy(a);
    return NULL;
}

/* A scrape sees a merge whole or not at all: _count equals +Inf, and no
 * bucket ever goes down from one scrape to the next. */
static void *scrape_monotonic(void *arg)
{
    idem_metrics_t *m = arg;
    static const char *les[] = {"0.0005", "0.001", "0.0025", "0.005",
                                "0.0075", "0.01",  "0.015",  "0.02",
                                "0.025",  "0.05",  "+Inf"};
    double prev[sizeof(les) / sizeof(les[0])] = {0};
    for (int i = 0; i < 200; i++) {
        char *t = render(m);
        double below = 0;
        for (size_t b = 0; b < sizeof(les) / sizeof(les[0]); b++) {
            char series[128];
            snprintf(series, sizeof(series),
                     "idemproc_processing_latency_seconds_bucket{le=\"%s\"}",
                     les[b]);
            double v = sample(t, series);
            cr_expect_geq(v, prev[b], "%s went down", series);
            cr_expect_geq(v, below, "%s below the bucket before", series);
            prev[b] = below = v;
        }
        cr_expect_eq(below,
                     sample(t, "idemproc_processing_latency_seconds_count"));
        free(t);
    }
    return NULL;
}

Test(metrics, merges_are_whole_for_a_concurrent_scrape)
{
    idem_metrics_t *m = idem_metrics_new();
    pthread_t th[3];
    pthread_create(&th[0], NULL, accumulate, m);
    pthread_create(&th[1], NULL, accumulate, m);
    pthread_create(&th[2], NULL, scrape_monotonic, m);
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    cr_expect_eq(idem_metrics_outcome_get(m, IDEM_OUTCOME_PROCESSED),
                 2 * (uint64_t)HAMMER_ROUNDS);
    char *t = render(m);
    cr_expect_eq(sample(t, "idemproc_processing_latency_seconds_count"),
                 2.0 * HAMMER_ROUNDS);
    free(t);
    idem_metrics_destroy(m);
}

Test(metrics, cluster_nodes_rendered_with_a_node_label_only_once_set)
{
    idem_metrics_t *m = idem_metrics_new();
    char *t = render(m);
    cr_expect_null(strstr(t, "idemproc_redis_cluster_"),
                   "cluster series outside cluster mode:\n%s", t);
    free(t);
    idem_metrics_cluster_node_t v[2] = {
        {.node = "127.0.0.1:7000", .requests = 10, .moved = 1, .ask = 2},
        {.node = "127.0.0.1:7001",
         .requests = 5,
         .tryagain = 3,
         .clusterdown = 4,
         .conn_errors = 6,
         .timeouts = 7},
    };
    idem_metrics_cluster_set(m, v, 2, 3);
    v[0].requests = 99; /* copied: the registry keeps its own */
    idem_metrics_cluster_set(m, v, 1, 3);
    idem_metrics_cluster_set(m, v + 1, 1, 4);
    v[0].requests = 11;
    idem_metrics_cluster_set(m, v, 2, 5);
    t = render(m);
    expect_line(
        t, "idemproc_redis_cluster_requests_total{node=\"127.0.0.1:7000\"} 11");
    expect_line(
        t, "idemproc_redis_cluster_requests_total{node=\"127.0.0.1:7001\"} 5");
    expect_line(
        t, "idemproc_redis_cluster_moved_total{node=\"127.0.0.1:7000\"} 1");
    expect_line(t,
                "idemproc_redis_cluster_ask_total{node=\"127.0.0.1:7000\"} 2");
    expect_line(
        t, "idemproc_redis_cluster_tryagain_total{node=\"127.0.0.1:7001\"} 3");
    expect_line(
        t,
        "idemproc_redis_cluster_clusterdown_total{node=\"127.0.0.1:7001\"} 4");
    expect_line(t, "idemproc_redis_cluster_connection_errors_total{node=\"127."
                   "0.0.1:7001\"} 6");
    expect_line(
        t, "idemproc_redis_cluster_timeouts_total{node=\"127.0.0.1:7001\"} 7");
    expect_line(t, "idemproc_redis_cluster_slot_map_refreshes_total 5");
    expect_line(t, "# TYPE idemproc_redis_cluster_requests_total counter");
    free(t);
    idem_metrics_destroy(m);
}
