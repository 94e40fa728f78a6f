/* Cluster mode's configuration checks (redis/rediskeys.c): what it runs
 * and what it refuses, each refusal naming the key and the reason. */
#include <criterion/criterion.h>
#include <string.h>

#include "conf/conf.h"
#include "testlib.h"

#include <stdio.h>
#include <stdlib.h>

static idem_conf_t *load_with(const char *a, const char *b, const char *c,
                              char *err, size_t size)
{
    const char *sets[] = {"kafka.bootstrap.servers=127.0.0.1:1",
                          "group.id=g",
                          "input.topics=t",
                          "dlq.topic=d",
                          "redis.cluster.nodes=127.0.0.1:7000,127.0.0.1:7001",
                          a,
                          b,
                          c};
    size_t n = 5;
    while (n < 8 && sets[n])
        n++;
    return idem_conf_load(NULL, NULL, (char **)sets, n, err, size);
}

/* WAIT goes to each node a request's chunks were written to. */
Test(clusterconf, ledger_with_wait_accepted)
{
    char err[512] = "";
    idem_conf_t *c = load_with("dedup.scope=partition", "redis.wait.replicas=1",
                               NULL, err, sizeof(err));
    cr_assert_not_null(c, "%s", err);
    cr_expect_eq(c->redis_wait_replicas, 1);
    idem_conf_destroy(c);
}

Test(clusterconf, ledger_partition_accepted)
{
    char err[512] = "";
    idem_conf_t *c =
        load_with("dedup.scope=partition", NULL, NULL, err, sizeof(err));
    cr_assert_not_null(c, "%s", err);
    cr_expect_str_eq(c->redis_cluster_nodes, "127.0.0.1:7000,127.0.0.1:7001");
    idem_conf_destroy(c);
    /* Retry copies take the global path, sharded by bucket. */
    c = load_with("dedup.scope=partition", "retry.topics=5s", NULL, err,
                  sizeof(err));
    cr_expect_not_null(c, "%s", err);
    idem_conf_destroy(c);
}

/* The external handlers keep only their per-identity marks: cluster
 * mode runs them on dedup.scope=global, with retry topics and WAIT. */
Test(clusterconf, external_handlers_accepted_with_global_marks)
{
    static const char *cases[][3] = {
        {"handler=forward", "output.topic=o", "retry.topics=5s,1m"},
        {"handler=forward", "output.topic=o", "redis.wait.replicas=1"},
        {"handler=webhook", "webhook.url=http://127.0.0.1:1/h",
         "dedup.scope=global"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char err[512] = "";
        idem_conf_t *c =
            load_with(cases[i][0], cases[i][1], cases[i][2], err, sizeof(err));
        cr_expect_not_null(c, "%s %s: %s", cases[i][0], cases[i][2], err);
        idem_conf_destroy(c);
    }
}

typedef struct {
    const char *a, *b, *c, *want;
} refusal_t;

/* Each refusal names the key and the reason. */
Test(clusterconf, refused)
{
    static refusal_t cases[] = {
        {"dedup.scope=global", NULL, NULL, "needs dedup.scope=partition"},
        {"dedup.scope=partition", "redis.sentinels=127.0.0.1:26379",
         "redis.sentinel.master=m", "together with redis.sentinels"},
        {"dedup.scope=partition", "redis.prefix=a{b}:", NULL, "contains '{'"},
        {"handler=forward", "output.topic=o", "dedup.scope=partition",
         "dedup.scope=partition"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const refusal_t *t = &cases[i];
        char err[512] = "";
        idem_conf_t *c = load_with(t->a, t->b, t->c, err, sizeof(err));
        cr_expect_null(c, "accepted: %s %s", t->a, t->b ? t->b : "");
        cr_expect(strstr(err, t->want), "got \"%s\", want \"%s\"", err,
                  t->want);
        idem_conf_destroy(c);
    }
}

/* handler=script runs in cluster mode (its idem.* keys get the partition's
 * tag); a literal key outside the slot in its file is refused. */
Test(clusterconf, script_partition_accepted_literal_key_refused)
{
    char *dir = NULL, file[600], err[1024] = "";
    snprintf(file, sizeof(file), "script.file=%s",
             th_file_in(&dir, "ok.lua",
                        "function effect(rec) idem.incrby('n', 1) end\n"));
    idem_conf_t *c = load_with("dedup.scope=partition", "handler=script", file,
                               err, sizeof(err));
    cr_expect_not_null(c, "%s", err);
    idem_conf_destroy(c);
    snprintf(file, sizeof(file), "script.file=%s",
             th_file_in(&dir, "bad.lua",
                        "function effect(rec)\n"
                        "  redis.call('SET', 'last', rec.identity)\n"
                        "end\n"));
    c = load_with("dedup.scope=partition", "handler=script", file, err,
                  sizeof(err));
    cr_expect_null(c);
    cr_expect(strstr(err, "bad.lua:2: redis.call('SET', \"last\")"), "%s", err);
    idem_conf_destroy(c);
    th_rmrf(dir);
    free(dir);
}
