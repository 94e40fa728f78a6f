/* test_chaos: the short version of `make chaos` (tests/chaos.sh): member
 * SIGKILLs, Redis kill -9 with AOF restarts and a broker fault schedule at
 * once, on fewer records; it must end exact. */
#include "harness.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
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
