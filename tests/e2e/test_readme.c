/* test_readme: the README's own first-hour session (the blocks marked
 * <!-- first-hour -->), run by tests/first_hour.sh against a broker and a
 * redis-server the README's commands start, every shown output checked. */
#include "harness.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

Test(readme, first_hour_session_works_as_written, .timeout = 300)
{
    char *dir = th_tmpdir();
    char script[1024], readme[1024], errp[1024];
    snprintf(script, sizeof(script), "%s/tests/first_hour.sh", th_src());
    snprintf(readme, sizeof(readme), "%s/README.md", th_src());
    snprintf(errp, sizeof(errp), "%s/err", dir);
    char *argv[] = {"/bin/bash", script, (char *)th_bin(), readme, NULL};
    pid_t pid = th_spawn(argv, NULL, errp, NULL);
    /* Generous: about 10 s on an idle machine. On overrun the script gets
     * SIGTERM and stops the processes it started. */
    int rc = th_wait(pid, 240000);
    if (rc == -1)
        rc = th_stop(pid, 20000);
    char *err = th_slurp(errp, NULL);
    cr_expect_eq(rc, 0, "first_hour.sh exit %d:\n%s", rc, err ? err : "");
    free(err);
    th_rmrf(dir);
    free(dir);
}
