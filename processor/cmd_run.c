/* cmd_run: placeholder until the command lands (replaced in this change). */
#include "cmd.h"

void idem_cmd_run_usage(FILE *out)
{
    fprintf(out, "idemproc run: not built yet\n");
}

int idem_cmd_run(int argc, char **argv, char **envp)
{
    (void)argc;
    (void)argv;
    (void)envp;
    idem_cmd_run_usage(stderr);
    return IDEM_EXIT_FAIL;
}
