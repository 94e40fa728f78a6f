/* cmd_verify: placeholder until the command lands (replaced in this change). */
#include "cmd.h"

void idem_cmd_verify_usage(FILE *out)
{
    fprintf(out, "idemproc verify: not built yet\n");
}

int idem_cmd_verify(int argc, char **argv, char **envp)
{
    (void)argc;
    (void)argv;
    (void)envp;
    idem_cmd_verify_usage(stderr);
    return IDEM_EXIT_FAIL;
}
