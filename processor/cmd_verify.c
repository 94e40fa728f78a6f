/* cmd_verify: `idemproc verify`, exit 0 only when Redis (and the DLQ) hold
 * exactly what `produce --expect` promised. */
#include "cmd.h"
#include "cmdline.h"
#include "conf.h"
#include "verify.h"

#include <stdlib.h>
#include <string.h>

void idem_cmd_verify_usage(FILE *out)
{
    fprintf(out,
            "usage: idemproc verify -c FILE --expect FILE [--dlq] "
            "[--timeout-ms N] [--set k=v]...\n"
            "  Compares the ledger and the applied counter in Redis with the "
            "file that\n"
            "  'produce --expect' wrote; with --dlq also reads dlq.topic to "
            "its end and\n"
            "  compares distinct dead-lettered records by reason. Prints each "
            "difference.\n"
            "  Exit 0 exact match, 1 mismatch or failure, 2 usage.\n");
}

typedef struct {
    const char *expect;
    int with_dlq;
    int timeout_ms;
} verify_opts_t;

/* idem_cmdline_opt_cb for verify's own options. */
static int verify_opt(int opt, const char *arg, void *opaque)
{
    verify_opts_t *o = opaque;
    switch (opt) {
    case 'e':
        o->expect = arg;
        return 0;
    case 'd':
        o->with_dlq = 1;
        return 0;
    case 't': {
        char *end;
        long v = strtol(arg, &end, 10);
        if (*end || v < 100 || v > 3600000) {
            fprintf(stderr,
                    "idemproc verify: --timeout-ms: \"%s\" is not a number "
                    "of ms (100..3600000)\n",
                    arg);
            return -1;
        }
        o->timeout_ms = (int)v;
        return 0;
    }
    }
    return -1;
}

int idem_cmd_verify(int argc, char **argv, char **envp)
{
    static const struct option opts[] = {
        {"expect", required_argument, 0, 'e'},
        {"dlq", no_argument, 0, 'd'},
        {"timeout-ms", required_argument, 0, 't'},
        {0, 0, 0, 0}};
    verify_opts_t o = {.timeout_ms = 30000};
    idem_conf_t *conf;
    int rc = idem_cmdline_conf(argc, argv, envp, idem_cmd_verify_usage, opts,
                               "e:dt:", verify_opt, &o, &conf);
    if (rc >= 0)
        return rc;
    if (!o.expect) {
        fprintf(stderr, "idemproc verify: --expect FILE is required\n");
        idem_conf_destroy(conf);
        return IDEM_EXIT_USAGE;
    }
    char errstr[512];
    int r = idem_verify(conf, o.expect, o.with_dlq, o.timeout_ms, stdout,
                        errstr, sizeof(errstr));
    if (r < 0)
        fprintf(stderr, "idemproc verify: %s\n", errstr);
    idem_conf_destroy(conf);
    return r == 0 ? IDEM_EXIT_OK : IDEM_EXIT_FAIL;
}
