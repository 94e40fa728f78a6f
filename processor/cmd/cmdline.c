/* cmdline: the options every configured command takes (-c FILE, --set k=v,
 * --help) and the loading of its configuration. */
#include "cmd/cmdline.h"
#include "cmd/cmd.h"
#include "base/util.h"

#include <stdlib.h>
#include <string.h>

int idem_cmdline_conf(int argc, char **argv, char **envp,
                      void (*usage)(FILE *out), const struct option *extra,
                      const char *extra_short, idem_cmdline_opt_cb *on_extra,
                      void *opaque, idem_conf_t **conf)
{
    return idem_cmdline_conf_scope(argc, argv, envp, usage, extra, extra_short,
                                   on_extra, opaque, IDEM_CONF_SCOPE_PROCESSOR,
                                   conf);
}

int idem_cmdline_conf_scope(int argc, char **argv, char **envp,
                            void (*usage)(FILE *out),
                            const struct option *extra, const char *extra_short,
                            idem_cmdline_opt_cb *on_extra, void *opaque,
                            idem_conf_scope_t scope, idem_conf_t **conf)
{
    static const struct option base[] = {{"config", required_argument, 0, 'c'},
                                         {"set", required_argument, 0, 's'},
                                         {"help", no_argument, 0, 'h'}};
    size_t base_cnt = sizeof(base) / sizeof(base[0]), extra_cnt = 0;
    while (extra && extra[extra_cnt].name)
        extra_cnt++;
    struct option *opts = idem_xcalloc(base_cnt + extra_cnt + 1, sizeof(*opts));
    memcpy(opts, base, sizeof(base));
    if (extra_cnt)
        memcpy(opts + base_cnt, extra, extra_cnt * sizeof(*opts));
    char shorts[64];
    /* Leading ':' and opterr=0: we print one line ourselves. */
    snprintf(shorts, sizeof(shorts), ":c:s:h%s",
             extra_short ? extra_short : "");

    const char *path = NULL;
    char **sets = idem_xcalloc((size_t)argc + 1, sizeof(*sets));
    size_t set_cnt = 0;
    int rc = -1, c;
    *conf = NULL;
    optind = 1;
    opterr = 0;
    while (rc < 0 && (c = getopt_long(argc, argv, shorts, opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            path = optarg;
            break;
        case 's':
            sets[set_cnt++] = optarg;
            break;
        case 'h':
            usage(stdout);
            rc = IDEM_EXIT_OK;
            break;
        case '?':
        case ':':
            fprintf(stderr, "idemproc %s: %s \"%s\" (see 'idemproc help %s')\n",
                    argv[0], c == ':' ? "missing value for" : "unknown option",
                    argv[optind - 1], argv[0]);
            rc = IDEM_EXIT_USAGE;
            break;
        default:
            if (!on_extra || on_extra(c, optarg, opaque))
                rc = IDEM_EXIT_USAGE;
            break;
        }
    }
    if (rc < 0 && optind < argc) {
        fprintf(stderr, "idemproc %s: unexpected argument \"%s\"\n", argv[0],
                argv[optind]);
        rc = IDEM_EXIT_USAGE;
    }
    if (rc < 0) {
        idem_conf_err_t err;
        *conf = idem_conf_load_err(path, envp, sets, set_cnt, scope, &err);
        if (!*conf) {
            /* A first run without -c fails on the first required key: say
             * what is missing is the file, not just that key. */
            if (!path && err.cls == IDEM_CONF_ERR_REQUIRED)
                fprintf(stderr,
                        "idemproc %s: %s (no configuration file given: use "
                        "-c FILE; 'idemproc help config' lists the keys)\n",
                        argv[0], err.str);
            else
                fprintf(stderr, "idemproc: %s\n", err.str);
            rc = IDEM_EXIT_USAGE;
        }
    }
    free(sets);
    free(opts);
    return rc;
}
