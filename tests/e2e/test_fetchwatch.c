/* test_fetchwatch (e2e): members whose partitions stall: the repair, and
 * statistics served inside rd_kafka_destroy. */
#include "dev/broker.h"
#include "conf/conf.h"
#include "loop/fetchwatch.h"
#include "harness.h"
#include "obs/metrics.h"
#include "loop/pipeline.h"
#include "loop/rebalance.h"
#include "base/util.h"

#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Two statistics documents of one consumer (librdkafka 2.0.2, mock
 * cluster, statistics.interval.ms=500), 2 s apart, 64 partitions of
 * payments behind their high watermark (314 each): every partition is
 * fetched and consumed, except payments/5, which was paused inside
 * librdkafka after its first record (next_offset stays 1, nothing
 * queued in b). */
#define DOC_A "tests/data/fetchwatch/stats-2.0.2-64p-a.json"
#define DOC_B "tests/data/fetchwatch/stats-2.0.2-64p-b.json"

/* ------------------------------------- with a real consumer, in-process */

#define HEARTBEAT_API 12 /* Kafka protocol ApiKey of Heartbeat */

/* ------------------------------------------------ with a broker and Redis */

static th_stack_t stk;

TestSuite(fetchwatch_run, .fini = th_stack_cleanup);

/* rd_kafka_destroy of a consumer that was not closed closes it, and the
 * close serves what waits in the consumer queue, statistics included
 * (design.md, "When not to repair"). A pipeline made and destroyed
 * without a poll in between has statistics waiting, so its destroy serves
 * a statistics callback: the lag gauges prove it was served, and the
 * watch it would judge with must not be freed yet or must no longer be
 * reachable (AddressSanitizer reports the use otherwise; run this under
 * make SAN=address). */
Test(fetchwatch_run, statistics_served_by_destroy_skip_the_watch, .timeout = 60)
{
    cr_assert_eq(th_stack_start(&stk, 2, NULL), 0);
    char *sets[] = {"stats.interval.ms=10", "fetch.stall.ms=1000",
                    "http.listen=", NULL};
    char err[512];
    idem_conf_t *conf =
        idem_conf_load(stk.conf, NULL, sets, 3, err, sizeof(err));
    cr_assert(conf, "%s", err);
    idem_metrics_t *m = idem_metrics_new();
    idem_pipeline_t *p = idem_pipeline_new(conf, m, err, sizeof(err));
    cr_assert(p, "%s", err);
    /* 50 statistics periods: documents are queued (nothing polls). */
    usleep(500000);
    cr_assert_eq(idem_metrics_lag_total(m), -1, "served before destroy");
    idem_pipeline_destroy(p);
    cr_expect_geq(idem_metrics_lag_total(m), 0,
                  "no statistics callback was served by the destroy");
    idem_metrics_destroy(m);
    idem_conf_destroy(conf);
    th_stack_stop(&stk);
}

typedef struct {
    th_stack_t *s;
    int rc;
    volatile int done;
} produce_job_t;

static void *produce_thread(void *arg)
{
    produce_job_t *j = arg;
    const char *args[] = {"--count", "6000",         "--rate", "1500", "--seed",
                          "31",      "--duplicates", "0.05",   NULL};
    j->rc = th_stack_produce(j->s, args);
    j->done = 1;
    return NULL;
}

static double metric_of(int port, const char *series)
{
    char *body = NULL;
    double v = -2;
    if (th_http_get(port, "/metrics", &body) == 200)
        v = th_metric(body, series);
    free(body);
    return v;
}

/* Starts member `name` of stk with metrics and probes on a free port
 * (*port), statistics every 200 ms, fetch.stall.ms=1500 and `fault`
 * (--set values, NULL-terminated, may be NULL), and waits until it is
 * ready. Returns its pid. */
static pid_t watched_member(const char *name, const char *const fault[],
                            int *port)
{
    *port = th_free_port();
    char listen[64];
    snprintf(listen, sizeof(listen), "http.listen=127.0.0.1:%d", *port);
    const char *sets[8] = {listen, "stats.interval.ms=200",
                           "fetch.stall.ms=1500"};
    size_t n = 3;
    for (size_t i = 0; fault && fault[i] && n < 7; i++)
        sets[n++] = fault[i];
    sets[n] = NULL;
    pid_t pid = th_stack_member(&stk, name, sets);
    for (int t = 0; t < 600 && th_http_get(*port, "/readyz", NULL) != 200; t++)
        usleep(100000);
    cr_assert_eq(th_http_get(*port, "/readyz", NULL), 200, "%s never ready",
                 name);
    return pid;
}

typedef struct {
    char strategy[32]; /* partition.assignment.strategy */
    int times;         /* dev.fault.fetch.pause TIMES */
    int assign_fail;   /* dev.fault.fetch.assign.fail */
} stall_case_t;

/* A partition paused inside librdkafka behind the member's back while
 * records keep arriving (dev.fault.fetch.pause). With TIMES=1 the first
 * repair (resume, seek) brings it back. With TIMES=3 the first two are
 * dropped: the member reports not ready after the second; with
 * cooperative assignment the third (resume, assign the partition again)
 * brings it back; with eager assignment the watch does not assign again
 * (only the whole assignment could be): the member stays not ready and
 * says to restart it, and a restarted member fetches the partition.
 * With TIMES=2 and cooperative assignment, the second repair takes the
 * partition out of the assignment and its assign back is refused
 * (dev.fault.fetch.assign.fail=1): not ready at once, and the third repair
 * assigns it again. Either way the stall is logged and counted, and the
 * ledger ends exact. */
ParameterizedTestParameters(fetchwatch_run, stalled_partition_is_repaired)
{
    static stall_case_t cases[] = {{"range", 1, 0},
                                   {"range", 3, 0},
                                   {"cooperative-sticky", 3, 0},
                                   {"cooperative-sticky", 2, 1}};
    return cr_make_param_array(stall_case_t, cases, 4);
}

ParameterizedTest(stall_case_t *c, fetchwatch_run,
                  stalled_partition_is_repaired, .timeout = 180)
{
    int eager_restart = c->times > 1 && strcmp(c->strategy, "range") == 0;
    int repairs = eager_restart ? c->times - 1 : c->times + c->assign_fail;
    char strat[96];
    snprintf(strat, sizeof(strat), "kafka.partition.assignment.strategy=%s",
             c->strategy);
    const char *props[] = {strat, NULL};
    cr_assert_eq(th_stack_start(&stk, 4, props), 0);
    char pause[64], refuse[64];
    snprintf(pause, sizeof(pause), "dev.fault.fetch.pause=payments:2:%d",
             c->times);
    snprintf(refuse, sizeof(refuse), "dev.fault.fetch.assign.fail=%d",
             c->assign_fail);
    const char *fault[] = {pause, refuse, NULL};
    int port;
    pid_t m = watched_member("m", fault, &port);

    produce_job_t job = {&stk, -1, 0};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, produce_thread, &job), 0);
    const char *g2 = "idemproc_partition_stalled{topic=\"payments\","
                     "partition=\"2\"}";
    char path[600];
    snprintf(path, sizeof(path), "%s/m.log", stk.dir);
    int saw_stalled = 0, saw_unready = 0, back = 0;
    for (int t = 0; t < 900 && !back; t++) {
        if (metric_of(port, g2) == 1)
            saw_stalled = 1;
        int st = th_http_get(port, "/readyz", NULL);
        if (st == 503)
            saw_unready = 1;
        if (eager_restart) {
            /* Stays stalled and not ready: what the operator sees. */
            char *l = th_slurp(path, NULL);
            back = job.done && saw_stalled && st == 503 && l &&
                   strstr(l, "eager assignment, not repaired in place") &&
                   metric_of(port, g2) == 1;
            free(l);
        } else {
            back = job.done && saw_stalled && st == 200 &&
                   metric_of(port, g2) == 0 &&
                   metric_of(port, "idemproc_partition_stall_repairs_total") ==
                       repairs;
        }
        usleep(100000);
    }
    pthread_join(th, NULL);
    cr_assert_eq(job.rc, 0, "produce failed");
    char *log = th_slurp(path, NULL);
    cr_assert(log);
    cr_expect(saw_stalled, "idemproc_partition_stalled never showed 1");
    if (c->times > 1)
        cr_expect(saw_unready, "/readyz never said 503");
    cr_assert(back, "never %s:\n%s",
              eager_restart ? "not ready with the partition stalled"
                            : "ready again with the partition fetched",
              log);
    free(log);
    cr_expect_eq(metric_of(port, "idemproc_partition_stalls_total"), 1);
    cr_expect_eq(metric_of(port, "idemproc_partition_stall_repairs_total"),
                 repairs);
    pid_t m2 = -1;
    if (eager_restart) {
        /* The operator restarts the member (no fault this time). */
        cr_expect_eq(th_stop(m, 15000), 0);
        int port2;
        m2 = watched_member("m2", NULL, &port2);
    }
    TH_ASSERT_VERIFIED(&stk, 0, NULL, 60000);
    if (eager_restart)
        cr_expect_eq(th_stop(m2, 15000), 0);
    else
        cr_expect_eq(th_stop(m, 15000), 0);

    log = th_slurp(path, NULL);
    cr_assert(log);
    const char *said_eager[] = {
        "fault: partition paused behind the member's back",
        "partition assigned but not fetched: resuming it",
        "partition still not fetched after a repair: not ready",
        "stalled partition: eager assignment, not repaired in place: "
        "restart the member",
        NULL};
    const char *said[] = {
        "fault: partition paused behind the member's back",
        "partition assigned but not fetched: resuming it",
        c->times > 1 ? "partition still not fetched after a repair: not ready"
                     : "stalled partition: resumed and sought",
        c->times > 1 ? "stalled partition: resumed and assigned again"
                     : "stalled partition fetched again",
        "stalled partition fetched again",
        NULL};
    const char *said_refused[] = {
        "fault: partition paused behind the member's back",
        "fault: repair dropped",
        "partition still not fetched after a repair: not ready",
        "fault: assign refused",
        "stalled partition: resumed and assigned again",
        "stalled partition fetched again",
        NULL};
    const char **want = eager_restart    ? said_eager
                        : c->assign_fail ? said_refused
                                         : said;
    for (int i = 0; want[i]; i++)
        cr_expect(strstr(log, want[i]), "not logged: %s\n%s", want[i], log);
    if (eager_restart)
        cr_expect_not(strstr(log, "resumed and assigned again"), "%s", log);
    cr_expect(strstr(log, "\"partition\":2"), "%s", log);
    free(log);
    th_stack_stop(&stk);
}
