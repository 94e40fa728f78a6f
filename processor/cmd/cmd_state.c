/* cmd_state: `idemproc state get KIND ARGS... -c FILE [--json]`: a
 * Redis-held effect's value as its readers should see it (in cluster mode
 * the sum over the partitions' shards; docs/guarantees.md, "Redis Cluster
 * mode"). One row of `kinds` per kind of state. */
#include "base/util.h"
#include "cmd/cmd.h"
#include "cmd/cmdline.h"
#include "conf/conf.h"
#include "redis/store.h"
#include "redis/storeread.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* Reads the value of one kind of state for args[nargs] (borrowed) and
 * prints it to out, as text or as one JSON object. 0, or -1 with errstr
 * (an outage: exit 1). */
typedef int (*state_get_fn)(idem_store_t *s, const idem_conf_t *conf,
                            const char *const *args, int json, FILE *out,
                            char *errstr, size_t errstr_size);

typedef struct {
    const char *name;
    int nargs;
    const char *args_doc; /* its arguments, for usage */
    const char *doc;      /* one line */
    state_get_fn get;
} state_kind_t;

static int ledger_get(idem_store_t *s, const idem_conf_t *conf,
                      const char *const *args, int json, FILE *out,
                      char *errstr, size_t errstr_size)
{
    (void)conf;
    int64_t minor;
    size_t shards;
    if (idem_store_ledger_get(s, args[0], args[1], &minor, &shards, errstr,
                              errstr_size))
        return -1;
    int cluster = idem_store_cluster(s);
    if (json) {
        json_t *o = json_pack("{s:s, s:s, s:s, s:I, s:i, s:b}", "kind",
                              "ledger", "currency", args[0], "user", args[1],
                              "minor", (json_int_t)minor, "shards", (int)shards,
                              "cluster", cluster);
        char *txt = json_dumps(o, JSON_COMPACT);
        fprintf(out, "%s\n", txt);
        free(txt);
        json_decref(o);
        return 0;
    }
    fprintf(out, "ledger %s %s: %" PRId64, args[0], args[1], minor);
    if (cluster)
        fprintf(out, " (the sum of %zu shard%s)", shards,
                shards == 1 ? "" : "s");
    else if (!shards)
        fprintf(out, " (no such field)");
    fprintf(out, "\n");
    return 0;
}

/* The shards of a script effect's key, added up as integers while every
 * one holds an integer; else the value when all hold the same one. */
typedef struct {
    size_t shards;
    long long sum;
    int nonint; /* a shard holds no integer */
    int differ; /* the shards do not all hold the same value */
    char *first;
} script_sum_t;

static void script_shard(const char *shard, size_t shard_len, const char *value,
                         size_t value_len, void *opaque)
{
    (void)shard;
    (void)shard_len;
    script_sum_t *x = opaque;
    char *v = idem_xmalloc(value_len + 1);
    memcpy(v, value, value_len);
    v[value_len] = '\0';
    if (!x->shards++)
        x->first = idem_xstrdup(v);
    else if (strcmp(v, x->first))
        x->differ = 1;
    char *end;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    if (errno || end == v || *end || strlen(v) != value_len)
        x->nonint = 1;
    else
        x->sum += n;
    free(v);
}

/* script KEY FIELD: a key the script handler's effect writes through
 * idem.* (FIELD "-": a string key), read as readers should: on one Redis
 * the key itself, in cluster mode its shards <key>{<group>:<topic>:
 * <partition>} on every primary, added up (integers) or, for other
 * values, the one value every shard holds. */
static int script_get(idem_store_t *s, const idem_conf_t *conf,
                      const char *const *args, int json, FILE *out,
                      char *errstr, size_t errstr_size)
{
    (void)s;
    const char *key = args[0], *field = strcmp(args[1], "-") ? args[1] : NULL;
    int cluster = conf->redis_cluster_nodes && *conf->redis_cluster_nodes;
    idem_storeread_t *rd = idem_storeread_new(conf);
    script_sum_t x = {0};
    int rc = -1;
    if (cluster) {
        if (idem_storeread_shards(rd, key, field, conf->group_id, script_shard,
                                  &x, errstr, errstr_size))
            goto done;
    } else {
        char *v;
        size_t len;
        if (idem_storeread_value(rd, key, field, &v, &len, errstr, errstr_size))
            goto done;
        if (v)
            script_shard(key, strlen(key), v, len, &x);
        free(v);
    }
    if (x.nonint && x.differ) {
        snprintf(errstr, errstr_size,
                 "%s%s%s: its %zu shards hold different values that are not "
                 "all integers: they cannot be added up",
                 key, field ? " " : "", field ? field : "", x.shards);
        goto done;
    }
    char where[512];
    snprintf(where, sizeof(where), "%s%s%s", key, field ? " " : "",
             field ? field : "");
    if (json) {
        json_t *o = json_pack("{s:s, s:s, s:o, s:o, s:i, s:b}", "kind",
                              "script", "key", key, "field",
                              field ? json_string(field) : json_null(), "value",
                              !x.shards  ? json_null()
                              : x.nonint ? json_string(x.first)
                                         : json_integer((json_int_t)x.sum),
                              "shards", (int)x.shards, "cluster", cluster);
        char *txt = json_dumps(o, JSON_COMPACT);
        fprintf(out, "%s\n", txt);
        free(txt);
        json_decref(o);
    } else if (!x.shards) {
        fprintf(out, "script %s: absent%s\n", where,
                cluster ? " (no shard on any primary)" : "");
    } else {
        if (x.nonint)
            fprintf(out, "script %s: %s", where, x.first);
        else
            fprintf(out, "script %s: %lld", where, x.sum);
        if (cluster)
            fprintf(out, " (%s %zu shard%s)",
                    x.nonint ? "the same in" : "the sum of", x.shards,
                    x.shards == 1 ? "" : "s");
        fprintf(out, "\n");
    }
    rc = 0;
done:
    free(x.first);
    idem_storeread_destroy(rd);
    return rc;
}

/* One row per kind. */
static const state_kind_t kinds[] = {
    {"ledger", 2, "CURRENCY USER",
     "a balance in minor units (cents); cluster mode: the sum of its shards",
     ledger_get},
    {"script", 2, "KEY FIELD",
     "a script effect's idem.* value (FIELD - for a string key); cluster "
     "mode: the sum of its shards",
     script_get},
};

#define KIND_CNT (sizeof(kinds) / sizeof(kinds[0]))

void idem_cmd_state_usage(FILE *out)
{
    fprintf(out, "usage: idemproc state get KIND ARGS... -c FILE [--json] "
                 "[--set k=v]...\n"
                 "  Prints a value an in-Redis effect keeps, as its readers "
                 "should see it: on\n"
                 "  a single Redis the key itself; in cluster mode "
                 "(redis.cluster.nodes) the\n"
                 "  sum of its shards over every primary (one per partition "
                 "that carried\n"
                 "  events for it). Read-only; a replica will do.\n"
                 "  kinds:\n");
    for (size_t i = 0; i < KIND_CNT; i++)
        fprintf(out, "    %s %-16s %s\n", kinds[i].name, kinds[i].args_doc,
                kinds[i].doc);
    fprintf(out, "  --json   one JSON object instead of the text line\n"
                 "  Exit 0 ok (an absent value: ledger 0, script \"absent\"), "
                 "1 Redis failed, 2 "
                 "usage.\n");
}

static const struct option state_options[] = {{"json", no_argument, NULL, 'j'},
                                              {NULL, 0, NULL, 0}};

static int state_opt(int opt, const char *arg, void *opaque)
{
    (void)arg;
    if (opt != 'j')
        return -1;
    *(int *)opaque = 1;
    return 0;
}

int idem_cmd_state(int argc, char **argv, char **envp)
{
    if (argc < 2 || strcmp(argv[1], "get")) {
        if (argc >= 2 &&
            (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
            idem_cmd_state_usage(stdout);
            return IDEM_EXIT_OK;
        }
        fprintf(stderr, "idemproc state: unknown subcommand \"%s\" (get)\n",
                argc < 2 ? "" : argv[1]);
        return IDEM_EXIT_USAGE;
    }
    const state_kind_t *k = NULL;
    for (size_t i = 0; argc >= 3 && i < KIND_CNT; i++)
        if (!strcmp(argv[2], kinds[i].name))
            k = &kinds[i];
    if (!k) {
        fprintf(stderr, "idemproc state get: unknown kind \"%s\" (kinds:",
                argc < 3 ? "" : argv[2]);
        for (size_t i = 0; i < KIND_CNT; i++)
            fprintf(stderr, " %s", kinds[i].name);
        fprintf(stderr, ")\n");
        return IDEM_EXIT_USAGE;
    }
    int have = 0;
    while (3 + have < argc &&
           (argv[3 + have][0] != '-' || !strcmp(argv[3 + have], "-")))
        have++;
    if (have != k->nargs) {
        fprintf(stderr,
                "idemproc state get %s: takes %s before the options (got %d "
                "argument%s)\n",
                k->name, k->args_doc, have, have == 1 ? "" : "s");
        return IDEM_EXIT_USAGE;
    }
    const char *const *args = (const char *const *)argv + 3;
    int shift = 2 + have;
    char name[64];
    snprintf(name, sizeof(name), "state get %s", k->name);
    char **rest = idem_xcalloc((size_t)argc + 1, sizeof(*rest));
    rest[0] = name;
    for (int i = 1 + shift; i < argc; i++)
        rest[i - shift] = argv[i];
    int json = 0;
    idem_conf_t *conf = NULL;
    int rc = idem_cmdline_conf(argc - shift, rest, envp, idem_cmd_state_usage,
                               state_options, "", state_opt, &json, &conf);
    free(rest);
    if (rc >= 0) {
        idem_conf_destroy(conf);
        return rc;
    }
    idem_store_t *s = idem_store_new(conf, NULL);
    idem_store_allow_replica(s);
    char errstr[1024];
    rc = IDEM_EXIT_OK;
    if (k->get(s, conf, args, json, stdout, errstr, sizeof(errstr))) {
        fprintf(stderr, "idemproc %s: %s\n", name, errstr);
        rc = IDEM_EXIT_FAIL;
    }
    idem_store_destroy(s);
    idem_conf_destroy(conf);
    return rc;
}
