/* cmdline: the options every configured command takes (-c FILE, --set k=v,
 * --help) and the loading of its configuration. */
#ifndef IDEM_CMDLINE_H
#define IDEM_CMDLINE_H

#include <getopt.h>
#include <stdio.h>

#include "conf/conf.h"

/* Called for each of a command's own options: returns 0, or -1 after it
 * printed one line naming the flag and the problem. */
typedef int idem_cmdline_opt_cb(int opt, const char *arg, void *opaque);

/* Parses argv[1..] with getopt_long: -c/--config FILE, -s/--set key=value
 * (repeatable), -h/--help, and the command's own `extra` options (getopt
 * long options, NULL-terminated array, may be NULL; `extra_short` their
 * short letters) handed to on_extra. No positional argument is allowed.
 * Then loads the configuration (defaults < file < IDEMPROC_* of envp <
 * --set). Returns -1 with *conf set (the caller destroys it) to go on, or
 * the exit code the command must return: 0 after --help, 2 after a usage
 * or configuration error (one line on stderr). */
int idem_cmdline_conf(int argc, char **argv, char **envp,
                      void (*usage)(FILE *out), const struct option *extra,
                      const char *extra_short, idem_cmdline_opt_cb *on_extra,
                      void *opaque, idem_conf_t **conf);

/* idem_cmdline_conf with the configuration finalized for `scope`. */
int idem_cmdline_conf_scope(int argc, char **argv, char **envp,
                            void (*usage)(FILE *out),
                            const struct option *extra, const char *extra_short,
                            idem_cmdline_opt_cb *on_extra, void *opaque,
                            idem_conf_scope_t scope, idem_conf_t **conf);

#endif
