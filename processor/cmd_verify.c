/* cmd_verify: `idemproc verify`, exit 0 only when Redis (and the DLQ) hold
 * exactly what `produce --expect` promised. */
#include "cmd.h"
#include "conf.h"
#include "verify.h"

#include <getopt.h>
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

int idem_cmd_verify(int argc, char **argv, char **envp)
{
    const char *path = NULL, *expect = NULL;
    int with_dlq = 0, timeout_ms = 30000;
    char **sets = calloc((size_t)argc + 1, sizeof(*sets));
    size_t set_cnt = 0;
    static const struct option opts[] = {
        {"config", required_argument, 0, 'c'},
        {"set", required_argument, 0, 's'},
        {"expect", required_argument, 0, 'e'},
        {"dlq", no_argument, 0, 'd'},
        {"timeout-ms", required_argument, 0, 't'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    int c, rc;
    optind = 1;
    while ((c = getopt_long(argc, argv, "c:s:e:dt:h", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            path = optarg;
            break;
        case 's':
            sets[set_cnt++] = optarg;
            break;
        case 'e':
            expect = optarg;
            break;
        case 'd':
            with_dlq = 1;
            break;
        case 't': {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (*end || v < 100 || v > 3600000) {
                fprintf(stderr,
                        "idemproc verify: --timeout-ms: \"%s\" is not a "
                        "number of ms (100..3600000)\n",
                        optarg);
                free(sets);
                return IDEM_EXIT_USAGE;
            }
            timeout_ms = (int)v;
            break;
        }
        case 'h':
            idem_cmd_verify_usage(stdout);
            free(sets);
            return IDEM_EXIT_OK;
        default:
            idem_cmd_verify_usage(stderr);
            free(sets);
            return IDEM_EXIT_USAGE;
        }
    }
    if (!expect || optind < argc) {
        fprintf(stderr, "idemproc verify: %s\n",
                !expect ? "--expect FILE is required" : "unexpected argument");
        free(sets);
        return IDEM_EXIT_USAGE;
    }
    char errstr[512];
    idem_conf_t *conf =
        idem_conf_load(path, envp, sets, set_cnt, errstr, sizeof(errstr));
    free(sets);
    if (!conf) {
        fprintf(stderr, "idemproc: %s\n", errstr);
        return IDEM_EXIT_USAGE;
    }
    int r = idem_verify(conf, expect, with_dlq, timeout_ms, stdout, errstr,
                        sizeof(errstr));
    if (r < 0)
        fprintf(stderr, "idemproc verify: %s\n", errstr);
    rc = r == 0 ? IDEM_EXIT_OK : IDEM_EXIT_FAIL;
    idem_conf_destroy(conf);
    return rc;
}
