/* test_cluster_check: check-config --connect in Redis Cluster mode asks
 * every primary for the partition chunk's rights: a cluster whose nodes
 * carry deploy/README.md's ACL line for cluster mode passes (the line is
 * read from the README, so the two stay in step), and the same line
 * without one right the chunk needs fails, naming the node and the
 * right. */
#include "harness.h"
#include "harness_cluster.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* At file scope (see test_pipeline.c): the suite's .fini needs them. */
static th_stack_t stk;
static th_cluster_t clu;

static void check_fini(void)
{
    th_stack_cleanup();
    th_cluster_stop(&clu);
}

TestSuite(cluster_check, .fini = check_fini);

/* deploy/README.md's ACL line for cluster mode (the first ACL SETUSER
 * line after the cluster section's heading) into buf. 0 or -1. */
static int readme_acl_line(char *buf, size_t size)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/deploy/README.md", th_src());
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[2048];
    int in_cluster = 0, found = -1;
    while (found && fgets(line, sizeof(line), f)) {
        if (!strncmp(line, "## Redis Cluster", 16))
            in_cluster = 1;
        if (in_cluster && !strncmp(line, "ACL SETUSER idemproc reset", 26)) {
            line[strcspn(line, "\n")] = '\0';
            snprintf(buf, size, "%s", line);
            found = 0;
        }
    }
    fclose(f);
    return found;
}

/* Sets the ACL line `acl` (its password replaced by acl-user-pw) on every
 * node, the whole line as one command's arguments. */
static void acl_everywhere(const char *acl)
{
    for (int i = 0; i < clu.n; i++) {
        const char *argv[64];
        int n = 0;
        char *copy = strdup(acl);
        for (char *w = strtok(copy, " "); w && n < 64; w = strtok(NULL, " "))
            argv[n++] = !strcmp(w, ">CHANGE-ME") ? ">acl-user-pw" : w;
        char *r = th_cluster_cmd_argv(&clu, i, n, argv);
        cr_assert_str_eq(r ? r : "", "OK", "node %d: %s", i, acl);
        free(r);
        free(copy);
    }
}

/* check-config --connect as the ACL user; exit code, output in *out and
 * *err (caller frees). */
static int check_connect(char **out, char **err)
{
    char nodes[512];
    snprintf(nodes, sizeof(nodes), "redis.cluster.nodes=%s", clu.seeds);
    char *argv[] = {(char *)th_bin(),
                    "check-config",
                    "--connect",
                    "-c",
                    stk.conf,
                    "--set",
                    nodes,
                    "--set",
                    "redis.url=redis://idemproc:acl-user-pw@127.0.0.1/0",
                    NULL};
    return th_run(argv, out, err, 120000);
}

Test(cluster_check, connect_asks_every_primary_for_the_chunk_rights,
     .timeout = 240)
{
    char acl[2048];
    cr_assert_eq(readme_acl_line(acl, sizeof(acl)), 0,
                 "deploy/README.md: no ACL line for cluster mode");
    cr_assert(strstr(acl, " +strlen"), "%s", acl);
    cr_assert_eq(th_cluster_start(&clu, 3, 0), 0, "cluster did not start");
    const char *props[] = {"dedup.scope=partition", "handler=ledger", NULL};
    cr_assert_eq(th_stack_start(&stk, 4, props), 0);

    /* The documented line: every primary ok. */
    acl_everywhere(acl);
    char *out = NULL, *err = NULL;
    int rc = check_connect(&out, &err);
    cr_expect_eq(rc, 0, "the documented line: exit %d\n%s\n%s", rc, out, err);
    cr_expect(out && strstr(out, "all 16384 slots covered by 3 primaries, "
                                 "every one ok"),
              "%s", out);
    free(out);
    free(err);

    /* Without +strlen (the chunk finding a window key's open part): every
     * primary fails, named, with the right. */
    char *cut = strstr(acl, " +strlen");
    memmove(cut, cut + 8, strlen(cut + 8) + 1);
    acl_everywhere(acl);
    rc = check_connect(&out, &err);
    cr_expect_eq(rc, 1, "without +strlen: exit %d\n%s\n%s", rc, out, err);
    for (int i = 0; i < clu.n; i++) {
        char want[128];
        snprintf(want, sizeof(want),
                 "redis cluster: 127.0.0.1:%d: the ACL "
                 "user (redis.username) lacks +strlen",
                 clu.node[i].port);
        cr_expect(err && strstr(err, want), "node %d: %s\n%s", i, want, err);
    }
    cr_expect(err && !strstr(err, "+append"), "only +strlen is missing: %s",
              err);
    cr_log_info("check-config without +strlen:\n%s", err ? err : "");
    free(out);
    free(err);
    th_stack_stop(&stk);
    th_cluster_stop(&clu);
}
