/* test_chaos: the short version of `make chaos` (tests/chaos.sh): member
 * SIGKILLs, Redis kill -9 with AOF restarts and a broker fault schedule at
 * once, on fewer records; it must end exact. And the verdict chaos.sh gives
 * on a dead broker (broker_check in tests/lib.sh), on which the short
 * version's one rerun depends. */
#include "harness.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* Starts the script with SIGTERM (not SIGKILL) as its parent-death signal:
 * its trap then stops every process it started, even when this test
 * process is killed. */
static pid_t spawn_script(char *const argv[], char *const env[],
                          const char *out_path)
{
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        int fd = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0)
            _exit(127);
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
        execve(argv[0], argv, env);
        _exit(127);
    }
    return pid;
}

Test(chaos, short_run_ends_exact, .timeout = 540)
{
    char script[1024];
    snprintf(script, sizeof(script), "%s/tests/chaos.sh", th_src());
    char *argv[] = {"/bin/bash", script, (char *)th_bin(), NULL};
    size_t n = 0;
    while (environ[n])
        n++;
    char **env = calloc(n + 5, sizeof(*env));
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "CHAOS_", 6))
            env[k++] = environ[i];
    env[k++] = "CHAOS_RECORDS=15000";
    env[k++] = "CHAOS_SECONDS=30";
    env[k++] = "CHAOS_SETTLE=120";
    env[k] = NULL;
    char *dir = th_tmpdir();
    char out_path[512];
    snprintf(out_path, sizeof(out_path), "%s/chaos.out", dir);
    /* A second run (with a new seed) only when the first was inconclusive:
     * librdkafka's mock cluster aborted on an assertion of its own. */
    char *out = NULL;
    int rc = -1;
    for (int attempt = 0; attempt < 2; attempt++) {
        free(out);
        pid_t pid = spawn_script(argv, env, out_path);
        cr_assert_gt(pid, 0);
        rc = th_wait(pid, attempt ? 200000 : 240000);
        if (rc == -1) /* its trap stops what it started */
            rc = th_stop(pid, 30000);
        out = th_slurp(out_path, NULL);
        if (rc != 3 || !out || !strstr(out, "chaos: INCONCLUSIVE"))
            break;
        cr_log_warn("chaos: the embedded broker aborted; running again:\n%s",
                    out);
    }
    cr_expect_eq(rc, 0, "chaos exit %d\n%s", rc, out);
    cr_expect(out && strstr(out, "lost                               0"), "%s",
              out);
    cr_expect(out && strstr(out, "doubled                            0"), "%s",
              out);
    cr_expect(out && strstr(out, "verify: dlq exact"), "%s", out);
    /* The chaos happened: kills, a Redis restart and faults. */
    cr_expect(out && !strstr(out, "member SIGKILLs                    0\n"),
              "%s", out);
    cr_expect(out && !strstr(out, "redis kill -9 + AOF restarts       0\n"),
              "%s", out);
    free(out);
    free(env);
    th_rmrf(dir);
    free(dir);
}

/* broker_check PID LOG, as chaos.sh calls it in its loops: a live broker
 * lets the run go on whatever its log says; a dead one (also a zombie,
 * not reaped yet) that died on librdkafka's own mock-cluster assertion
 * makes the run inconclusive (exit 3, which the test above reruns once);
 * any other death, a broker never started included, fails it (exit 1). */
Test(chaos, broker_death_verdict)
{
    static const char mock_assert[] =
        "idemproc broker: fault +3000ms broker 2 down\n"
        "idemproc: rdkafka_mock_cgrp.c:580: rd_kafka_mock_cgrp_member_add: "
        "Assertion `!member->resp' failed.\n";
    static const char other_assert[] =
        "idemproc: rdkafka_broker.c:1234: rd_kafka_broker_serve: Assertion "
        "`rkb' failed.\n";
    static const char crash[] = "idemproc broker: fault +3000ms rtt 1 80ms\n"
                                "Segmentation fault\n";
    enum { LIVE, DEAD, ZOMBIE, NONE };
    static const struct {
        const char *name;
        int broker; /* LIVE, DEAD (reaped), ZOMBIE (not reaped), NONE ("") */
        const char *log;
        int want_rc;
        const char *want_err; /* on stderr (NULL: nothing asked) */
    } cases[] = {
        {"live broker, assertion in its log", LIVE, mock_assert, 0, NULL},
        {"live broker, empty log", LIVE, "", 0, NULL},
        {"dead on a mock assertion", DEAD, mock_assert, 3,
         "chaos: INCONCLUSIVE (CHAOS_SEED=7): the embedded broker "
         "(librdkafka's mock cluster) aborted on its own assertion: "
         "idemproc: rdkafka_mock_cgrp.c:580: rd_kafka_mock_cgrp_member_add"},
        {"zombie after a mock assertion", ZOMBIE, mock_assert, 3,
         "chaos: INCONCLUSIVE (CHAOS_SEED=7)"},
        {"dead on another assertion", DEAD, other_assert, 1,
         "chaos: FAILED (CHAOS_SEED=7): the embedded broker exited"},
        {"dead without an assertion", DEAD, crash, 1,
         "chaos: FAILED (CHAOS_SEED=7): the embedded broker exited"},
        {"never started", NONE, "", 1,
         "chaos: FAILED (CHAOS_SEED=7): the embedded broker exited"},
    };
    char lib[1024];
    snprintf(lib, sizeof(lib), "%s/tests/lib.sh", th_src());
    char *dir = th_tmpdir();
    char log[600];
    snprintf(log, sizeof(log), "%s/broker.log", dir);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        cr_assert_eq(th_write_file(log, cases[i].log), 0);
        pid_t child = 0;
        char pid[32] = "";
        if (cases[i].broker == LIVE) {
            snprintf(pid, sizeof(pid), "%d", (int)getpid());
        } else if (cases[i].broker != NONE) {
            child = fork();
            cr_assert_geq(child, 0);
            if (child == 0)
                _exit(134);
            if (cases[i].broker == DEAD)
                cr_assert_eq(waitpid(child, NULL, 0), child);
            else /* until it is a zombie */
                cr_assert_eq(waitid(P_PID, (id_t)child, &(siginfo_t){0},
                                    WEXITED | WNOWAIT),
                             0);
            snprintf(pid, sizeof(pid), "%d", (int)child);
        }
        char *argv[] = {"/bin/bash",
                        "-c",
                        "set -euo pipefail; LIB_NAME=chaos "
                        "LIB_CONTEXT=' (CHAOS_SEED=7)'; . \"$1\"; "
                        "broker_check \"$2\" \"$3\"; echo goes on",
                        "chaos-verdict",
                        lib,
                        pid,
                        log,
                        NULL};
        char *out = NULL, *err = NULL;
        int rc = th_run(argv, &out, &err, 30000);
        if (cases[i].broker == ZOMBIE)
            waitpid(child, NULL, 0);
        cr_expect_eq(rc, cases[i].want_rc, "%s: exit %d, stderr: %s",
                     cases[i].name, rc, err);
        cr_expect_eq(out && strstr(out, "goes on") != NULL,
                     cases[i].want_rc == 0, "%s: stdout: %s", cases[i].name,
                     out);
        if (cases[i].want_err)
            cr_expect(err && strstr(err, cases[i].want_err),
                      "%s: stderr lacks \"%s\": %s", cases[i].name,
                      cases[i].want_err, err);
        free(out);
        free(err);
    }
    th_rmrf(dir);
    free(dir);
}
