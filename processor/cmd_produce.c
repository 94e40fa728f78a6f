/* cmd_produce: placeholder until the command lands (replaced in this change).
 */
#include "cmd.h"

void idem_cmd_produce_usage(FILE *out)
{
    fprintf(out, "idemproc produce: not built yet\n");
}

int idem_cmd_produce(int argc, char **argv, char **envp)
{
    (void)argc;
    (void)argv;
    (void)envp;
    idem_cmd_produce_usage(stderr);
    return IDEM_EXIT_FAIL;
}
