/* test_faults (unit): the fault schedule parser. */
#include "dev/faults.h"
#include "testlib.h"
#include "base/util.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static idem_faults_t *parse(const char *text, char *err, size_t size)
{
    return idem_faults_parse(text, strlen(text), "sched", err, size);
}

Test(faults, every_kind_parses_sorted_by_time)
{
    const char *text = "# a schedule\n"
                       "\n"
                       "+8s broker 2 up\n"
                       "+5s broker 2 down   # comment\n"
                       "+3s rtt 1 200ms\n"
                       "+4s error Produce NOT_LEADER_FOR_PARTITION 5\n"
                       "+6s leader payments 3 2\n"
                       "+7s coordinator group g1 2\n"
                       "+1500ms error 1 6 2\n"
                       "+1m rtt 3 0\n"
                       "+0 error heartbeat rebalance_in_progress 1\n";
    char err[512] = "";
    idem_faults_t *f = parse(text, err, sizeof(err));
    cr_assert(f, "%s", err);
    cr_assert_eq(f->cnt, 9);
    const char *want[] = {
        "error Heartbeat REBALANCE_IN_PROGRESS 1",
        "error Fetch NOT_LEADER_FOR_PARTITION 2",
        "rtt 1 200ms",
        "error Produce NOT_LEADER_FOR_PARTITION 5",
        "broker 2 down",
        "leader payments 3 2",
        "coordinator group g1 2",
        "broker 2 up",
        "rtt 3 0ms",
    };
    int64_t at[] = {0, 1500, 3000, 4000, 5000, 6000, 7000, 8000, 60000};
    for (size_t i = 0; i < f->cnt; i++) {
        char buf[512];
        idem_fault_format(&f->faults[i], buf, sizeof(buf));
        cr_expect_str_eq(buf, want[i], "fault %zu", i);
        cr_expect_eq(f->faults[i].at_ms, at[i], "fault %zu at %lld", i,
                     (long long)f->faults[i].at_ms);
    }
    cr_expect_eq(idem_faults_check(f, "sched", 3, err, sizeof(err)), 0, "%s",
                 err);
    cr_expect_eq(idem_faults_check(f, "sched", 2, err, sizeof(err)), -1);
    cr_expect(strstr(err, "sched:10: broker 3: the cluster has brokers 1..2"),
              "%s", err);
    idem_faults_destroy(f);

    f = parse("", err, sizeof(err));
    cr_assert(f);
    cr_expect_eq(f->cnt, 0);
    idem_faults_destroy(f);
}

Test(faults, errors_name_the_line)
{
    struct {
        const char *text, *err_has;
    } bad[] = {
        {"+1s broker 1 down\n5s broker 1 up\n",
         "sched:2: \"5s\" is not a time"},
        {"+1x broker 1 down\n", "sched:1: \"+1x\" is not a time"},
        {"+1s broker 0 down\n", "sched:1: bad broker id \"0\""},
        {"+1s broker 33 down\n", "bad broker id \"33\""},
        {"+1s broker 1 sideways\n", "sched:1: unknown fault \"broker\""},
        {"\n\n+1s rtt 1 fast\n", "sched:3: rtt: bad time \"fast\""},
        {"+1s error Nope NOT_LEADER_FOR_PARTITION 1\n", "unknown API \"Nope\""},
        {"+1s error Produce NOPE 1\n", "unknown error \"NOPE\""},
        {"+1s error Produce 0 1\n", "unknown error \"0\""},
        {"+1s error Produce NOT_LEADER_FOR_PARTITION 0\n", "bad count \"0\""},
        {"+1s leader t x 1\n", "leader: bad partition \"x\""},
        {"+1s coordinator consumer g 1\n", "\"consumer\" is not group"},
        {"+1s explode\n", "unknown fault \"explode\""},
        {"+1s\n", "unknown fault \"\""},
        {"+99999999999s broker 1 down\n", "is not a time offset"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char err[512] = "";
        idem_faults_t *f = parse(bad[i].text, err, sizeof(err));
        cr_expect_null(f, "case %zu accepted", i);
        idem_faults_destroy(f);
        cr_expect(strstr(err, bad[i].err_has), "case %zu: %s", i, err);
    }
    char nul[] = "+1s broker 1 down\n+2s broker\0 1 up\n";
    char err[512] = "";
    cr_expect_null(
        idem_faults_parse(nul, sizeof(nul) - 1, "sched", err, sizeof(err)));
    cr_expect(strstr(err, "sched:2: NUL byte"), "%s", err);
}
