/* test_alerts (unit): every alert has a firing and a non-firing promtool
 * case, and the rules and the Grafana dashboard only use metrics the
 * processor really exports (read from the files, no tool run). */
#include "testlib.h"
#include "obs/metrics.h"

#include <criterion/criterion.h>
#include <ctype.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RULES     "config/alerts/idemproc.rules.yml"
#define RULE_TEST "tests/alerts.test.yml"
#define DASHBOARD "config/grafana/idemproc.json"
#define MAX_NAMES 128

typedef struct {
    char *v[MAX_NAMES];
    size_t n;
} names_t;

static void names_add(names_t *s, const char *p, size_t len)
{
    for (size_t i = 0; i < s->n; i++)
        if (strlen(s->v[i]) == len && !strncmp(s->v[i], p, len))
            return;
    cr_assert_lt(s->n, MAX_NAMES);
    s->v[s->n++] = strndup(p, len);
}

static int names_has(const names_t *s, const char *name)
{
    for (size_t i = 0; i < s->n; i++)
        if (!strcmp(s->v[i], name))
            return 1;
    return 0;
}

static void names_free(names_t *s)
{
    for (size_t i = 0; i < s->n; i++)
        free(s->v[i]);
    s->n = 0;
}

static char *src_path(const char *rel)
{
    char *p = malloc(1024);
    snprintf(p, 1024, "%s/%s", th_src(), rel);
    return p;
}

static char *slurp_src(const char *rel)
{
    char *path = src_path(rel);
    char *s = th_slurp(path, NULL);
    cr_assert(s, "cannot read %s", path);
    free(path);
    return s;
}

/* Every idemproc_* identifier in text. */
static void metric_refs(const char *text, names_t *out)
{
    for (const char *p = text; (p = strstr(p, "idemproc_"));) {
        if (p > text && (isalnum((unsigned char)p[-1]) || p[-1] == '_')) {
            p++;
            continue;
        }
        size_t l = 0;
        while (isalnum((unsigned char)p[l]) || p[l] == '_')
            l++;
        names_add(out, p, l);
        p += l;
    }
}

/* Sample names in a full render (lag series included), i.e. everything a
 * query can select: histograms as _bucket/_sum/_count. */
static void exported_names(names_t *out)
{
    idem_metrics_t *m = idem_metrics_new();
    char *json = slurp_src("tests/data/rdkafka_stats.json");
    cr_assert_eq(idem_metrics_stats_json(m, json, strlen(json)), 0);
    free(json);
    /* The fetch watch's series, as a member renders them. */
    idem_metrics_stall_enable(m);
    idem_metrics_stall_t stall = {"payments", 0, 0};
    idem_metrics_stalled_set(m, &stall, 1);
    /* A script request Redis cannot end, as a stuck member renders it. */
    idem_metrics_script_unkillable_set(m, "payments", 0, 5, 1);
    idem_metrics_member_set(m, "payments", "member-1"); /* as run does */
    /* The partition tables' gauges, as dedup.scope=partition renders them. */
    idem_metrics_dedup_table_set(m, 1024, 50, 1073741824);
    char *buf = NULL;
    size_t len = 0;
    FILE *fp = open_memstream(&buf, &len);
    idem_metrics_render(m, fp);
    fclose(fp);
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#')
            continue;
        size_t l = strcspn(line, "{ ");
        names_add(out, line, l);
        if (l > 7 && !strncmp(line + l - 7, "_bucket", 7))
            names_add(out, line, l - 7); /* the family, for prose */
    }
    free(buf);
    idem_metrics_destroy(m);
}

/* Alert names declared in the rule file ("- alert: Name"). */
static void rule_alerts(const char *rules, names_t *out)
{
    for (const char *p = rules; (p = strstr(p, "- alert:")); p += 8) {
        const char *n = p + 8;
        while (*n == ' ')
            n++;
        names_add(out, n, strcspn(n, " \r\n#"));
    }
}

/* In the unit test file each case is "alertname: X" followed by
 * "exp_alerts: []" (must not fire) or "exp_alerts:" and a list (must
 * fire). Both kinds are required for every alert. */
Test(alerts, every_alert_has_firing_and_silent_cases)
{
    char *rules = slurp_src(RULES);
    char *tests = slurp_src(RULE_TEST);
    names_t alerts = {0}, firing = {0}, silent = {0};
    rule_alerts(rules, &alerts);
    cr_assert_geq(alerts.n, 6);
    for (const char *p = tests; (p = strstr(p, "alertname:")); p += 10) {
        const char *n = p + 10;
        while (*n == ' ')
            n++;
        size_t nl = strcspn(n, " \r\n#");
        const char *exp = strstr(n, "exp_alerts:");
        cr_assert(exp, "no exp_alerts after alertname %.*s", (int)nl, n);
        const char *v = exp + 11;
        while (*v == ' ')
            v++;
        if (!strncmp(v, "[]", 2))
            names_add(&silent, n, nl);
        else
            names_add(&firing, n, nl);
    }
    for (size_t i = 0; i < alerts.n; i++) {
        cr_expect(names_has(&firing, alerts.v[i]), "%s: no firing case",
                  alerts.v[i]);
        cr_expect(names_has(&silent, alerts.v[i]), "%s: no non-firing case",
                  alerts.v[i]);
    }
    for (size_t i = 0; i < firing.n; i++)
        cr_expect(names_has(&alerts, firing.v[i]), "%s: tested, not defined",
                  firing.v[i]);
    cr_expect(names_has(&alerts, "IdemprocHighDuplicateRate"));
    cr_expect(names_has(&alerts, "IdemprocDeadLettering"));
    cr_expect(names_has(&alerts, "IdemprocConsumerLagGrowing"));
    cr_expect(names_has(&alerts, "IdemprocNotReady"));
    cr_expect(names_has(&alerts, "IdemprocRedisErrors"));
    cr_expect(names_has(&alerts, "IdemprocNoCommitProgress"));
    names_free(&alerts);
    names_free(&firing);
    names_free(&silent);
    free(rules);
    free(tests);
}

Test(alerts, rules_use_exported_metrics)
{
    char *rules = slurp_src(RULES);
    names_t refs = {0}, have = {0};
    metric_refs(rules, &refs);
    exported_names(&have);
    cr_assert_gt(refs.n, 0);
    for (size_t i = 0; i < refs.n; i++)
        cr_expect(names_has(&have, refs.v[i]), "%s is not exported", refs.v[i]);
    names_free(&refs);
    names_free(&have);
    free(rules);
}

/* Collects every "expr" string of the dashboard (panels, rows, targets);
 * each must select by the namespace, job and instance variables. */
static void dashboard_exprs(json_t *node, names_t *refs, size_t *exprs)
{
    if (json_is_object(node)) {
        const char *key;
        json_t *v;
        json_object_foreach(node, key, v)
        {
            if (!strcmp(key, "expr") && json_is_string(v)) {
                (*exprs)++;
                const char *e = json_string_value(v);
                cr_expect(strstr(e, "namespace=~\"$namespace\"") &&
                              strstr(e, "job=~\"$job\"") &&
                              strstr(e, "instance=~\"$instance\""),
                          "not filtered by the variables: %s", e);
                metric_refs(json_string_value(v), refs);
            } else {
                dashboard_exprs(v, refs, exprs);
            }
        }
    } else if (json_is_array(node)) {
        size_t i;
        json_t *v;
        json_array_foreach(node, i, v) dashboard_exprs(v, refs, exprs);
    }
}

Test(alerts, dashboard_is_valid_and_uses_exported_metrics)
{
    char *path = src_path(DASHBOARD);
    json_error_t jerr;
    json_t *d = json_load_file(path, 0, &jerr);
    cr_assert(d, "%s:%d: %s", path, jerr.line, jerr.text);
    cr_expect(json_is_array(json_object_get(d, "panels")));
    cr_expect_geq(json_integer_value(json_object_get(d, "schemaVersion")), 36);

    /* Template variables: datasource (Prometheus) and instance. */
    json_t *vars = json_object_get(json_object_get(d, "templating"), "list");
    int has_ds = 0, has_instance = 0;
    size_t i;
    json_t *v;
    json_array_foreach(vars, i, v)
    {
        const char *name = json_string_value(json_object_get(v, "name"));
        const char *type = json_string_value(json_object_get(v, "type"));
        const char *query = json_string_value(json_object_get(v, "query"));
        if (name && !strcmp(name, "datasource") && type &&
            !strcmp(type, "datasource") && query &&
            !strcmp(query, "prometheus"))
            has_ds = 1;
        if (name && !strcmp(name, "instance"))
            has_instance = 1;
    }
    cr_expect(has_ds, "no ${datasource} Prometheus variable");
    cr_expect(has_instance, "no instance variable");
    /* Filters for a cluster of several namespaces, jobs and groups; the
     * group comes from the info metric (README, "Metrics"). */
    const char *wanted[] = {"namespace", "job", "group"};
    for (size_t w = 0; w < sizeof(wanted) / sizeof(wanted[0]); w++) {
        int found = 0;
        json_array_foreach(vars, i, v)
        {
            const char *name = json_string_value(json_object_get(v, "name"));
            if (name && !strcmp(name, wanted[w]))
                found = 1;
        }
        cr_expect(found, "no %s variable", wanted[w]);
    }
    json_array_foreach(vars, i, v)
    {
        const char *name = json_string_value(json_object_get(v, "name"));
        const char *def = json_string_value(json_object_get(v, "definition"));
        if (name && !strcmp(name, "instance"))
            cr_expect(def && strstr(def, "idemproc_member_info{") &&
                          strstr(def, "group=~\"$group\""),
                      "instance variable not narrowed by group: %s", def);
    }

    names_t refs = {0}, have = {0};
    size_t exprs = 0;
    dashboard_exprs(d, &refs, &exprs);
    /* Variable queries and descriptions name metrics too. */
    char *text = slurp_src(DASHBOARD);
    metric_refs(text, &refs);
    free(text);
    exported_names(&have);
    cr_expect_geq(exprs, 10);
    for (size_t k = 0; k < refs.n; k++)
        cr_expect(names_has(&have, refs.v[k]), "%s is not exported", refs.v[k]);
    /* And every metric family shows up on the dashboard. */
    const char *families[] = {"idemproc_records_total",
                              "idemproc_duplicates_total",
                              "idemproc_dlq_records_total",
                              "idemproc_processing_latency_seconds_bucket",
                              "idemproc_batch_size_records_bucket",
                              "idemproc_redis_roundtrip_seconds_bucket",
                              "idemproc_redis_errors_total",
                              "idemproc_commits_total",
                              "idemproc_consumer_lag_records",
                              "idemproc_ready",
                              "idemproc_assigned_partitions",
                              "idemproc_paused_partitions"};
    for (size_t k = 0; k < sizeof(families) / sizeof(families[0]); k++)
        cr_expect(names_has(&refs, families[k]), "dashboard lacks %s",
                  families[k]);
    names_free(&refs);
    names_free(&have);
    json_decref(d);
    free(path);
}

/* Each alert links its runbook (runbook_url, a section of docs/runbook.md
 * that exists) instead of carrying the text inline. */
Test(alerts, every_alert_has_a_runbook_url_to_an_existing_section)
{
    char *rules = slurp_src(RULES);
    char *book = slurp_src("docs/runbook.md");
    names_t alerts = {0};
    rule_alerts(rules, &alerts);
    cr_assert_gt(alerts.n, 0);
    cr_expect_null(strstr(rules, "runbook:"), "inline runbook text left");
    for (size_t i = 0; i < alerts.n; i++) {
        char anchor[160], heading[160];
        size_t k = 0;
        for (const char *c = alerts.v[i]; *c && k < sizeof(anchor) - 1; c++)
            anchor[k++] = (char)tolower((unsigned char)*c);
        anchor[k] = '\0';
        const char *at = strstr(rules, alerts.v[i]);
        const char *next = at ? strstr(at + 1, "- alert:") : NULL;
        const char *ru = at ? strstr(at, "runbook_url: \"") : NULL;
        cr_expect(ru && (!next || ru < next), "%s: no runbook_url",
                  alerts.v[i]);
        if (ru && (!next || ru < next)) {
            const char *end = strchr(ru + 14, '"');
            char frag[200];
            snprintf(frag, sizeof(frag), "docs/runbook.md#%s\"", anchor);
            cr_expect(end &&
                          !strncmp(end - strlen(frag) + 1, frag, strlen(frag)),
                      "%s: runbook_url is not docs/runbook.md#%s", alerts.v[i],
                      anchor);
        }
        snprintf(heading, sizeof(heading), "\n## %s\n", alerts.v[i]);
        cr_expect(strstr(book, heading), "docs/runbook.md lacks ## %s",
                  alerts.v[i]);
    }
    names_free(&alerts);
    free(rules);
    free(book);
}
