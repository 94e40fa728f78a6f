/* main: idemproc's entry point; dispatches to the subcommands. */
#include "cmd/cmd.h"
#include "cmd/cmdline.h"
#include "conf/conf.h"
#include "kafka/kafka.h"
#include "redis/redisconn.h"
#include "kafka/retrytopic.h"
#include "redis/store.h"
#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

extern char **environ;

static void check_config_usage(FILE *out)
{
    fprintf(out,
            "usage: idemproc check-config -c FILE [--connect [--timeout-ms N]] "
            "[--for run|outbox] [--set key=value]...\n"
            "  Validates the configuration (file < IDEMPROC_* environment "
            "< --set) and\n  prints the effective one, secrets redacted.\n"
            "  --connect        then also reach Kafka (brokers; input, DLQ "
            "and output\n"
            "                   topics) and Redis with these settings\n"
            "  --timeout-ms N   bound on each of those (100..3600000, default "
            "30000)\n"
            "  --for outbox     check it as `idemproc outbox` reads it (no "
            "group, topics or\n"
            "                   Redis needed; outbox.dsn required); with "
            "--connect it\n"
            "                   reaches Kafka (outbox.topic), PostgreSQL and "
            "outbox.table;\n"
            "                   the default is run\n"
            "  Exit 0 valid (and reachable), 1 not reachable, 2 invalid.\n");
}

typedef struct {
    int connect;
    int timeout_ms;
} check_opts_t;

/* idem_cmdline_opt_cb for check-config's own options. */
static int check_config_opt(int opt, const char *arg, void *opaque)
{
    check_opts_t *o = opaque;
    if (opt == 'C') {
        o->connect = 1;
        return 0;
    }
    if (opt == 'f') {
        /* Only checked here: the scope is read from argv before the
         * configuration loads (cmd_check_config). */
        if (!strcmp(arg, "run") || !strcmp(arg, "outbox"))
            return 0;
        fprintf(stderr,
                "idemproc check-config: --for \"%s\" is not one of: run, "
                "outbox\n",
                arg);
        return -1;
    }
    char *end;
    long v = strtol(arg, &end, 10);
    if (!*arg || *end || v < 100 || v > 3600000) {
        fprintf(stderr,
                "idemproc check-config: --timeout-ms: \"%s\" is not a "
                "number of ms (100..3600000)\n",
                arg);
        return -1;
    }
    o->timeout_ms = (int)v;
    return 0;
}

/* `idemproc check-config`: validate and print the effective config; with
 * --connect also reach Kafka and Redis. */
static int cmd_check_config(int argc, char **argv, char **envp)
{
    static const struct option opts[] = {
        {"connect", no_argument, 0, 'C'},
        {"timeout-ms", required_argument, 0, 'T'},
        {"for", required_argument, 0, 'f'},
        {0, 0, 0, 0}};
    check_opts_t o = {.timeout_ms = 30000};
    /* The scope decides what finalize requires, so it is needed before
     * idem_cmdline_conf_scope loads the configuration. */
    idem_conf_scope_t scope = IDEM_CONF_SCOPE_PROCESSOR;
    for (int i = 1; i < argc; i++)
        if ((!strcmp(argv[i], "--for") && i + 1 < argc &&
             !strcmp(argv[i + 1], "outbox")) ||
            !strcmp(argv[i], "--for=outbox"))
            scope = IDEM_CONF_SCOPE_OUTBOX;
    idem_conf_t *conf;
    int rc = idem_cmdline_conf_scope(argc, argv, envp, check_config_usage, opts,
                                     "", check_config_opt, &o, scope, &conf);
    if (rc >= 0)
        return rc;
    idem_conf_dump(conf, stdout);
    if (conf->retry_tiers) {
        /* The topics retry.topics needs: the user creates them. */
        idem_retrytopics_t *rt = idem_retrytopics_new(
            conf->input_topics, conf->retry_delays_ms, conf->retry_tiers);
        for (size_t i = 0; i < idem_retrytopics_count(rt); i++) {
            const char *name = idem_retrytopics_at(rt, i);
            int tier = idem_retrytopics_tier(rt, name);
            char label[32];
            printf("check-config: retry topic %s (tier %d of %zu: %s)\n", name,
                   tier, conf->retry_tiers,
                   idem_retrytopic_label(idem_retrytopics_delay(rt, tier),
                                         label, sizeof(label)));
        }
        idem_retrytopics_destroy(rt);
    }
    rc = IDEM_EXIT_OK;
    char errstr[512];
    if (o.connect && scope == IDEM_CONF_SCOPE_OUTBOX) {
        fflush(stdout);
        rc = idem_cmd_outbox_check(conf, o.timeout_ms, stdout);
    } else if (o.connect) {
        fflush(stdout);
        if (idem_kafka_check(conf, o.timeout_ms, stdout, errstr,
                             sizeof(errstr))) {
            fprintf(stderr, "idemproc check-config: %s\n", errstr);
            rc = IDEM_EXIT_FAIL;
        }
        /* The Redis timeout is redis.timeout.ms; --timeout-ms bounds the
         * whole check from above. */
        if (conf->redis_timeout_ms > o.timeout_ms)
            conf->redis_timeout_ms = o.timeout_ms;
        if (conf->redis_cluster_nodes && *conf->redis_cluster_nodes) {
            if (idem_cmd_cluster_check(conf, stdout))
                rc = IDEM_EXIT_FAIL;
            idem_conf_destroy(conf);
            return rc;
        }
        idem_store_t *store = idem_store_new(conf, NULL);
        /* As `run` does: an evicting maxmemory-policy is refused (unless
         * redis.allow.eviction=true), not "connected". */
        idem_store_guard_eviction(store);
        char url[512];
        if (idem_store_connect(store, errstr, sizeof(errstr))) {
            fprintf(
                stderr, "idemproc check-config: %s (redis.url %s)\n", errstr,
                idem_redisconn_url_redact(conf->redis_url, url, sizeof(url)));
            rc = IDEM_EXIT_FAIL;
        } else {
            printf(
                "check-config: redis: connected to %s\n",
                idem_redisconn_url_redact(conf->redis_url, url, sizeof(url)));
        }
        idem_store_destroy(store);
    }
    idem_conf_destroy(conf);
    return rc;
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
            "  produce -c FILE [options]      the same, with run's "
            "configuration file\n"
            "  broker [--brokers N] [--topic NAME:PARTITIONS]...\n"
            "                                 embedded in-memory Kafka for "
            "development\n"
            "  verify -c FILE --expect FILE   check what took effect (and the "
            "DLQ) against\n"
            "                                 an expectation, for any "
            "handler\n"
            "  outbox -c FILE                 outbox relay: PostgreSQL "
            "outbox table -> Kafka\n"
            "  dlq stats|inspect|replay -c FILE  what is in the DLQ and "
            "why; send dead\n"
            "                                 letters back through dedup\n"
            "  offsets show|reset -c FILE     Kafka's and Redis's positions; "
            "rewind or skip\n"
            "  layout [show|set L] -c FILE    the group's dedup layout "
            "(global or partition)\n"
            "                                 and what live members want; "
            "switch it\n"
            "  state get KIND ARGS -c FILE    a value an in-Redis effect "
            "keeps, as readers\n"
            "                                 see it (cluster mode: the sum "
            "of its shards)\n"
            "  migrate --from URL -c FILE     copy a stopped group's state "
            "from one Redis\n"
            "                                 to the Redis Cluster of FILE\n"
            "  check-config -c FILE           validate and print the "
            "effective configuration\n"
            "                                 (--connect: also reach Kafka "
            "and Redis)\n"
            "  help [COMMAND|config|config-dev]  this text, a command's "
            "options, the config\n"
            "                                 keys, or the development-only "
            "keys\n"
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
    {"dlq", idem_cmd_dlq, idem_cmd_dlq_usage},
    {"outbox", idem_cmd_outbox, idem_cmd_outbox_usage},
    {"offsets", idem_cmd_offsets, idem_cmd_offsets_usage},
    {"layout", idem_cmd_layout, idem_cmd_layout_usage},
    {"state", idem_cmd_state, idem_cmd_state_usage},
    {"migrate", idem_cmd_migrate, idem_cmd_migrate_usage},
    {"check-config", cmd_check_config, check_config_usage},
};

static const command_t *command_find(const char *name)
{
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (!strcmp(commands[i].name, name))
            return &commands[i];
    return NULL;
}

#define COMMAND_CNT (sizeof(commands) / sizeof(commands[0]))

/* One line: the unknown command, a did-you-mean when one is close, and
 * every command (help's topics too, `in_help`). */
static void unknown_command(const char *who, const char *name, int in_help)
{
    const char *names[COMMAND_CNT + 2];
    char list[256] = "";
    size_t n = 0, at = 0;
    for (size_t i = 0; i < COMMAND_CNT; i++) {
        names[n++] = commands[i].name;
        at += (size_t)snprintf(list + at, sizeof(list) - at, "%s%s",
                               i ? ", " : "", commands[i].name);
    }
    if (in_help) {
        names[n++] = "config";
        names[n++] = "config-dev";
        snprintf(list + at, sizeof(list) - at, "; or config, config-dev");
    }
    const char *hint = idem_closest_name(name, names, n);
    char mean[96] = "";
    if (hint)
        snprintf(mean, sizeof(mean), "did you mean \"%s\"? ", hint);
    fprintf(stderr, "%s: unknown command \"%s\" (%scommands: %s)\n", who, name,
            mean, list);
}

static int cmd_help(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
        !strcmp(argv[1], "help")) {
        usage(stdout);
        return IDEM_EXIT_OK;
    }
    if (argc > 2) {
        fprintf(stderr,
                "idemproc help: unexpected argument \"%s\" (usage: idemproc "
                "help [COMMAND|config])\n",
                argv[2]);
        return IDEM_EXIT_USAGE;
    }
    if (!strcmp(argv[1], "config")) {
        idem_conf_print_help(stdout);
        return IDEM_EXIT_OK;
    }
    if (!strcmp(argv[1], "config-dev")) {
        idem_conf_print_help_dev(stdout, 1);
        return IDEM_EXIT_OK;
    }
    if (!strcmp(argv[1], "config-markdown")) {
        idem_conf_print_markdown(stdout);
        return IDEM_EXIT_OK;
    }
    const command_t *cmd = command_find(argv[1]);
    if (!cmd) {
        unknown_command("idemproc help", argv[1], 1);
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
        unknown_command("idemproc", name, 0);
        return IDEM_EXIT_USAGE;
    }
    return cmd->main(argc - 1, argv + 1, environ);
}
