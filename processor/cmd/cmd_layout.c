/* cmd_layout: `idemproc layout [show|set global|set partition]`: the
 * group's dedup layout key, the live members and which layouts each
 * supports and wants, and switching the key by hand (docs/guarantees.md,
 * "Changing dedup.scope"). */
#include "cmd/cmd.h"
#include "cmd/cmdline.h"
#include "base/util.h"
#include "conf/conf.h"
#include "redis/layout.h"
#include "redis/liveness.h"
#include "redis/redisconn.h"
#include "redis/store.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis.h>

void idem_cmd_layout_usage(FILE *out)
{
    fprintf(out,
            "usage: idemproc layout [show] -c FILE\n"
            "       idemproc layout set global|partition -c FILE [--force]\n"
            "  show   the group's dedup layout key (<prefix>layout:<group>): "
            "the layout\n"
            "         the group runs, since when, the one before and whether "
            "its marks\n"
            "         are still honoured; then each live member, the layouts "
            "it supports\n"
            "         and the one it wants (its dedup.scope).\n"
            "  set    switches the key (since = now; the other layout's marks "
            "are honoured\n"
            "         for one dedup.ttl.seconds). partition is refused while "
            "a live member\n"
            "         does not support the key or wants global, unless "
            "--force.\n"
            "  Exit 0 ok, 1 a failure or a refusal (nothing changed), 2 "
            "usage.\n");
}

typedef struct {
    int force;
} layout_opts_t;

static const struct option layout_options[] = {
    {"force", no_argument, NULL, 'f'}, {NULL, 0, NULL, 0}};

static int layout_opt(int opt, const char *arg, void *opaque)
{
    (void)arg;
    layout_opts_t *o = opaque;
    if (opt == 'f') {
        o->force = 1;
        return 0;
    }
    return -1;
}

/* The live members and their fingerprints: fps[i] for members[i] ("" when
 * a member published none). Caller frees both arrays' strings. */
static int members_read(const idem_conf_t *conf,
                        idem_liveness_member_t **members, size_t *n,
                        char ***fps, char *errstr, size_t errstr_size)
{
    if (idem_liveness_list(conf, members, n, errstr, errstr_size))
        return -1;
    return idem_liveness_fingerprints(conf, *members, *n, fps, errstr,
                                      errstr_size);
}

static void show(const idem_conf_t *conf, const idem_layout_t *l,
                 const idem_liveness_member_t *m, char *const *fps, size_t n)
{
    char key[512];
    idem_layout_key(conf, key, sizeof(key));
    printf("group %s: layout %s", conf->group_id,
           idem_layout_kind2str(l->layout));
    if (l->since)
        printf(" since %" PRId64 " (%" PRId64 " s ago), from %s", l->since,
               l->now - l->since, idem_layout_kind2str(l->from));
    else
        printf(" (key %s absent: never switched)", key);
    printf("\n");
    if (idem_layout_honours(l, conf->dedup_ttl_seconds, l->now))
        printf("the %s marks are honoured for %" PRId64 " s more\n",
               idem_layout_kind2str(l->from),
               l->since + conf->dedup_ttl_seconds - l->now);
    printf("%zu live member%s\n", n, n == 1 ? "" : "s");
    for (size_t i = 0; i < n; i++) {
        char sup[128], want[32];
        const char *s = idem_layout_fp_get(fps[i], IDEM_LAYOUT_FP_SUPPORTS, sup,
                                           sizeof(sup));
        const char *w = idem_layout_fp_get(fps[i], IDEM_LAYOUT_FP_WANTS, want,
                                           sizeof(want));
        printf("  %s supports %s, wants %s\n", m[i].member,
               s ? s : "no layout key (global only)", w ? w : "global");
    }
}

int idem_cmd_layout(int argc, char **argv, char **envp)
{
    const char *verb = "show";
    int shift = 0;
    idem_layout_kind_t to = IDEM_LAYOUT_GLOBAL;
    if (argc >= 2 && !strcmp(argv[1], "show")) {
        shift = 1;
    } else if (argc >= 2 && !strcmp(argv[1], "set")) {
        verb = "set";
        if (argc < 3 || idem_layout_kind_parse(argv[2], &to)) {
            fprintf(stderr,
                    "idemproc layout set: \"%s\" is no layout (global or "
                    "partition)\n",
                    argc < 3 ? "" : argv[2]);
            return IDEM_EXIT_USAGE;
        }
        shift = 2;
    } else if (argc >= 2 && argv[1][0] != '-') {
        fprintf(stderr,
                "idemproc layout: unknown subcommand \"%s\" (show or set)\n",
                argv[1]);
        return IDEM_EXIT_USAGE;
    }
    char name[32];
    snprintf(name, sizeof(name), "layout %s", verb);
    char **args = idem_xcalloc((size_t)argc + 1, sizeof(*args));
    args[0] = name;
    for (int i = 1 + shift; i < argc; i++)
        args[i - shift] = argv[i];
    layout_opts_t o = {0};
    idem_conf_t *conf = NULL;
    int rc = idem_cmdline_conf(argc - shift, args, envp, idem_cmd_layout_usage,
                               layout_options, "", layout_opt, &o, &conf);
    free(args);
    if (rc >= 0) {
        idem_conf_destroy(conf);
        return rc;
    }
    char errstr[1024] = "";
    /* Cluster mode: the layout is partition, fixed by the members (the
     * chunk script does not read the key, which lives in another slot). */
    int cluster = conf->redis_cluster_nodes && *conf->redis_cluster_nodes;
    if (cluster && !strcmp(verb, "set")) {
        fprintf(stderr,
                "idemproc %s: refused in cluster mode (redis.cluster.nodes): "
                "a cluster runs the partition layout only, nothing to switch "
                "(nothing changed)\n",
                name);
        idem_conf_destroy(conf);
        return IDEM_EXIT_FAIL;
    }
    idem_redisconn_t *rc_ = NULL;
    idem_store_t *store = NULL;
    idem_liveness_member_t *m = NULL;
    size_t n = 0;
    char **fps = NULL;
    idem_layout_t l;
    int ok;
    if (cluster) {
        /* Through the store, which finds the key's node; a reader, so its
         * connect writes nothing. */
        store = idem_store_new(conf, NULL);
        idem_store_allow_replica(store);
        ok = !idem_layout_store_read(store, conf, &l, errstr, sizeof(errstr));
    } else {
        rc_ = idem_redisconn_open(conf, 0, errstr, sizeof(errstr));
        ok = rc_ && !idem_layout_read(idem_redisconn_context(rc_), conf, &l,
                                      errstr, sizeof(errstr));
    }
    ok = ok && !members_read(conf, &m, &n, &fps, errstr, sizeof(errstr));
    rc = ok ? IDEM_EXIT_OK : IDEM_EXIT_FAIL;
    if (ok && !strcmp(verb, "show")) {
        show(conf, &l, m, fps, n);
    } else if (ok) {
        size_t b = 0;
        char why[64] = "";
        if (to == l.layout) {
            printf("layout %s already (nothing changed)\n",
                   idem_layout_kind2str(to));
        } else if (to == IDEM_LAYOUT_PARTITION && !o.force &&
                   !idem_layout_decide((const char *const *)fps, n, to, &b, why,
                                       sizeof(why))) {
            snprintf(errstr, sizeof(errstr),
                     "refused: live member %s %s (nothing changed; --force "
                     "switches anyway)",
                     m[b].member, why);
            rc = IDEM_EXIT_FAIL;
        } else {
            char sha[41] = "";
            int s =
                idem_layout_switch(idem_redisconn_context(rc_), conf, sha,
                                   l.layout, to, &l, errstr, sizeof(errstr));
            if (s == 1 &&
                idem_layout_honours(&l, conf->dedup_ttl_seconds, l.now))
                printf("layout %s since %" PRId64 ", from %s: the %s marks "
                       "are honoured for %" PRId64 " s\n",
                       idem_layout_kind2str(l.layout), l.since,
                       idem_layout_kind2str(l.from),
                       idem_layout_kind2str(l.from), conf->dedup_ttl_seconds);
            else if (s == 1)
                printf("layout %s, from %s: the group never ran, nothing of "
                       "the %s layout to honour\n",
                       idem_layout_kind2str(l.layout),
                       idem_layout_kind2str(l.from),
                       idem_layout_kind2str(l.from));
            else if (!s)
                snprintf(errstr, sizeof(errstr),
                         "refused: the key changed meanwhile (now %s; nothing "
                         "changed)",
                         idem_layout_kind2str(l.layout));
            rc = s == 1 ? IDEM_EXIT_OK : IDEM_EXIT_FAIL;
        }
    }
    if (rc)
        fprintf(stderr, "idemproc %s: %s\n", name, errstr);
    fflush(stdout);
    for (size_t i = 0; fps && i < n; i++)
        free(fps[i]);
    free(fps);
    idem_liveness_list_free(m, n);
    idem_redisconn_close(rc_);
    idem_store_destroy(store);
    idem_conf_destroy(conf);
    return rc;
}
