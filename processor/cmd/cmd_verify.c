/* cmd_verify: `idemproc verify`, exit 0 only when Redis (and the DLQ) hold
 * exactly what `produce --expect` promised. */
#include "cmd/cmd.h"
#include "cmd/cmdline.h"
#include "conf/conf.h"
#include "base/util.h"
#include "dev/expect.h"
#include "dev/verify.h"
#include "effect/handler.h"

#include <stdlib.h>
#include <string.h>

void idem_cmd_verify_usage(FILE *out)
{
    fprintf(
        out,
        "usage: idemproc verify -c FILE --expect FILE [--dlq] [--wait "
        "SECONDS]\n"
        "                       [--timeout-ms N] [--set k=v]...\n"
        "  Compares what took effect with the file that 'produce --expect' "
        "wrote (from\n"
        "  generated traffic or --input lines) or you wrote (README, \"The "
        "expectation\n"
        "  file\"), read through the configuration's handler and "
        "envelope.*:\n"
        "  every handler: the dedup marks of group.id (each listed identity "
        "applied,\n"
        "  no other; the ledger's counter stands in when none are listed);\n"
        "  handler=ledger: the ledger hashes and the applied counter;\n"
        "  handler=forward: output.topic read to its end, each identity once "
        "(values\n"
        "  as sent when listed; payments rebuild the ledger when one is "
        "expected);\n"
        "  \"redis\" values (script). With --dlq also reads dlq.topic to "
        "its end and\n"
        "  compares distinct dead-lettered records of this group.id by "
        "reason; a\n"
        "  partition whose earliest offset is above 0 (records dropped by "
        "retention\n"
        "  or by the embedded broker's size limit) is reported. Prints each "
        "difference.\n\n"
        "options:\n"
        "  -c, --config FILE   the processor's configuration (as for run)\n"
        "  --expect FILE       the expectation file (required)\n"
        "  --dlq               also compare the dead letters\n"
        "  --wait SECONDS      compare again every half second until the "
        "match is\n"
        "                      exact or SECONDS passed (while a member is "
        "still\n"
        "                      working); prints the last report only\n"
        "  --timeout-ms N      bound on reaching Kafka and reading a topic "
        "to its end\n"
        "                      (100..3600000, default 30000)\n"
        "  --set key=value     override a configuration key (repeatable)\n\n"
        "  Exit 0 exact match, 1 mismatch or failure, 2 usage (including a "
        "missing\n"
        "  or malformed --expect file).\n");
}

typedef struct {
    const char *expect;
    int with_dlq;
    int timeout_ms;
    int wait_s;
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
    case 'w': {
        char *end;
        long v = strtol(arg, &end, 10);
        if (!*arg || *end || v < 0 || v > 86400) {
            fprintf(stderr,
                    "idemproc verify: --wait: \"%s\" is not a number of "
                    "seconds (0..86400)\n",
                    arg);
            return -1;
        }
        o->wait_s = (int)v;
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
        {"wait", required_argument, 0, 'w'},
        {0, 0, 0, 0}};
    verify_opts_t o = {.timeout_ms = 30000};
    idem_conf_t *conf;
    int rc = idem_cmdline_conf(argc, argv, envp, idem_cmd_verify_usage, opts,
                               "e:dt:w:", verify_opt, &o, &conf);
    if (rc >= 0)
        return rc;
    if (!o.expect) {
        fprintf(stderr, "idemproc verify: --expect FILE is required\n");
        idem_conf_destroy(conf);
        return IDEM_EXIT_USAGE;
    }
    char errstr[512];
    json_t *expect = idem_expect_load(o.expect, errstr, sizeof(errstr));
    if (!expect) {
        fprintf(stderr, "idemproc verify: %s\n", errstr);
        idem_conf_destroy(conf);
        return IDEM_EXIT_USAGE;
    }
    /* What the handler's effect leaves to read back, from its ops. */
    const char *arg;
    const idem_handler_ops_t *ops =
        idem_handler_find(conf->handler, &arg, errstr, sizeof(errstr));
    if (!ops) {
        fprintf(stderr, "idemproc verify: %s\n", errstr);
        json_decref(expect);
        idem_conf_destroy(conf);
        return IDEM_EXIT_USAGE;
    }
    int as_sent;
    idem_verify_effect_t effect = {
        .balances = ops->needs_payment,
        .output = ops->output ? ops->output(conf, &as_sent) : NULL,
    };
    /* With --wait, each attempt's report is kept in memory and only the
     * last one is printed. */
    int64_t deadline = idem_now_ms() + (int64_t)o.wait_s * 1000;
    int r;
    char *report = NULL;
    for (;;) {
        size_t len = 0;
        FILE *mem = open_memstream(&report, &len);
        if (!mem) {
            fprintf(stderr, "idemproc verify: out of memory\n");
            r = -1;
            break;
        }
        r = idem_verify(conf, &effect, expect, o.with_dlq, o.timeout_ms, mem,
                        errstr, sizeof(errstr));
        fclose(mem);
        if (r == 0 || idem_now_ms() >= deadline)
            break;
        free(report);
        report = NULL;
        idem_sleep_ms(500, NULL);
    }
    if (report)
        fputs(report, stdout);
    free(report);
    if (r < 0)
        fprintf(stderr, "idemproc verify: %s\n", errstr);
    json_decref(expect);
    idem_conf_destroy(conf);
    return r == 0 ? IDEM_EXIT_OK : IDEM_EXIT_FAIL;
}
