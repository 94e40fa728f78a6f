/* test_alerts (it): the Prometheus rule file and its unit tests pass
 * promtool. */
#include "harness.h"
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

static char *src_path(const char *rel)
{
    char *p = malloc(1024);
    snprintf(p, 1024, "%s/%s", th_src(), rel);
    return p;
}

/* Runs promtool with two arguments; asserts exit 0. */
static void promtool(const char *verb1, const char *verb2, const char *rel)
{
    char *path = src_path(rel);
    char *argv[] = {"/usr/bin/promtool", (char *)verb1, (char *)verb2, path,
                    NULL};
    char *out = NULL, *err = NULL;
    int rc = th_run(argv, &out, &err, 60000);
    cr_expect_eq(rc, 0, "promtool %s %s %s: rc %d\n%s%s", verb1, verb2, path,
                 rc, out ? out : "", err ? err : "");
    free(out);
    free(err);
    free(path);
}

Test(alerts, promtool_check_rules)
{
    promtool("check", "rules", RULES);
}

Test(alerts, promtool_unit_tests_pass)
{
    promtool("test", "rules", RULE_TEST);
}
