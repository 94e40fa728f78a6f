/* cmd_broker: placeholder until the command lands (replaced in this change). */
#include "cmd.h"

void idem_cmd_broker_usage(FILE *out)
{
    fprintf(out, "idemproc broker: not built yet\n");
}

int idem_cmd_broker(int argc, char **argv, char **envp)
{
    (void)argc;
    (void)argv;
    (void)envp;
    idem_cmd_broker_usage(stderr);
    return IDEM_EXIT_FAIL;
}
