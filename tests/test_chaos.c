/* test_chaos: the short version of `make chaos` (tests/chaos.sh): member
 * SIGKILLs, Redis kill -9 with AOF restarts and a broker fault schedule at
 * once, on fewer records; it must end exact. */
#include "harness.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

Test(chaos, short_run_ends_exact, .timeout = 240)
{
    char script[1024];
    snprintf(script, sizeof(script), "%s/tests/chaos.sh", th_src());
    char *argv[] = {"/bin/bash", script, (char *)th_bin(), NULL};
    /* Inherit the environment (PATH, TMPDIR), plus the short sizes. */
    extern char **environ;
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
    char *out = NULL, *err = NULL;
    int rc = th_run_env(argv, env, &out, &err, 230000);
    cr_expect_eq(rc, 0, "chaos exit %d\n%s\n%s", rc, out, err);
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
    free(err);
    free(env);
}
