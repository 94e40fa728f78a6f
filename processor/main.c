/* main: idemproc's entry point; dispatches to the subcommands. */
#include "cmd.h"
#include "cmdline.h"
#include "conf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

extern char **environ;

static void check_config_usage(FILE *out)
{
    fprintf(out, "usage: idemproc check-config -c FILE [--set key=value]... "
                 "[--for run|outbox]\n"
                 "  Validates the configuration (file < IDEMPROC_* environment "
                 "< --set) and\n  prints the effective one, secrets "
                 "redacted. Exit 0 valid, 2 invalid.\n"
                 "  --for outbox checks it as `idemproc outbox` reads it (no "
                 "group, topics or\n  Redis needed; outbox.dsn required); "
                 "the default is run.\n");
}

/* --for VALUE of check-config: checked in the option callback; the scope
 * itself is read before the configuration loads (see cmd_check_config). */
static int check_config_for(int opt, const char *arg, void *opaque)
{
    (void)opt;
    (void)opaque;
    if (!strcmp(arg, "run") || !strcmp(arg, "outbox"))
        return 0;
    fprintf(stderr,
            "idemproc check-config: --for \"%s\" is not one of: run, "
            "outbox\n",
            arg);
    return -1;
}

/* `idemproc check-config`: validate and print the effective config. */
static int cmd_check_config(int argc, char **argv, char **envp)
{
    static const struct option extra[] = {{"for", required_argument, 0, 'f'},
                                          {0, 0, 0, 0}};
    /* The scope decides what finalize requires, so it is needed before
     * idem_cmdline_conf_scope loads the configuration. */
    idem_conf_scope_t scope = IDEM_CONF_SCOPE_PROCESSOR;
    for (int i = 1; i < argc; i++)
        if ((!strcmp(argv[i], "--for") && i + 1 < argc &&
             !strcmp(argv[i + 1], "outbox")) ||
            !strcmp(argv[i], "--for=outbox"))
            scope = IDEM_CONF_SCOPE_OUTBOX;
    idem_conf_t *conf;
    int rc =
        idem_cmdline_conf_scope(argc, argv, envp, check_config_usage, extra, "",
                                check_config_for, NULL, scope, &conf);
    if (rc >= 0)
        return rc;
    idem_conf_dump(conf, stdout);
    idem_conf_destroy(conf);
    return IDEM_EXIT_OK;
}

static void usage(FILE *out)
{
    fprintf(out,
            "idemproc %s - exactly-once effects from at-least-once Kafka\n\n"
            "usage: idemproc COMMAND [options]\n\n"
            "commands:\n"
            "  run -c FILE [--set k=v]...     the processor "
            "(consumer-group member)\n"
            "  produce -b BOOTSTRAP -t TOPIC  idempotent producer: test "
            "traffic or JSON lines\n"
            "  broker [--brokers N] [--topic NAME:PARTITIONS]...\n"
            "                                 embedded in-memory Kafka for "
            "development\n"
            "  verify -c FILE --expect FILE   compare the Redis ledger (and "
            "DLQ) with produce --expect\n"
            "  outbox -c FILE                 outbox relay: PostgreSQL "
            "outbox table -> Kafka\n"
            "  check-config -c FILE           validate and print the "
            "effective configuration\n"
            "  help [COMMAND|config]          this text, a command's "
            "options, or the config keys\n"
            "  --version                      print the version\n\n"
            "exit codes: 0 ok, 1 runtime failure, 2 usage or configuration "
            "error\n",
            IDEM_VERSION);
}

typedef struct {
    const char *name;
    int (*main)(int argc, char **argv, char **envp);
    void (*usage)(FILE *out);
} command_t;

static const command_t commands[] = {
    {"run", idem_cmd_run, idem_cmd_run_usage},
    {"produce", idem_cmd_produce, idem_cmd_produce_usage},
    {"broker", idem_cmd_broker, idem_cmd_broker_usage},
    {"verify", idem_cmd_verify, idem_cmd_verify_usage},
    {"outbox", idem_cmd_outbox, idem_cmd_outbox_usage},
    {"check-config", cmd_check_config, check_config_usage},
};

static const command_t *command_find(const char *name)
{
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (!strcmp(commands[i].name, name))
            return &commands[i];
    return NULL;
}

static int cmd_help(int argc, char **argv)
{
    if (argc < 2) {
        usage(stdout);
        return IDEM_EXIT_OK;
    }
    if (!strcmp(argv[1], "config")) {
        idem_conf_print_help(stdout);
        return IDEM_EXIT_OK;
    }
    if (!strcmp(argv[1], "config-markdown")) {
        idem_conf_print_markdown(stdout);
        return IDEM_EXIT_OK;
    }
    const command_t *cmd = command_find(argv[1]);
    if (!cmd) {
        fprintf(stderr, "idemproc help: unknown command \"%s\"\n", argv[1]);
        return IDEM_EXIT_USAGE;
    }
    cmd->usage(stdout);
    return IDEM_EXIT_OK;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return IDEM_EXIT_USAGE;
    }
    const char *name = argv[1];
    if (!strcmp(name, "--version") || !strcmp(name, "version")) {
        printf("idemproc %s (librdkafka %s)\n", IDEM_VERSION,
               rd_kafka_version_str());
        return IDEM_EXIT_OK;
    }
    if (!strcmp(name, "help") || !strcmp(name, "--help") || !strcmp(name, "-h"))
        return cmd_help(argc - 1, argv + 1);
    const command_t *cmd = command_find(name);
    if (!cmd) {
        fprintf(stderr,
                "idemproc: unknown command \"%s\" (see 'idemproc help')\n",
                name);
        return IDEM_EXIT_USAGE;
    }
    return cmd->main(argc - 1, argv + 1, environ);
}
