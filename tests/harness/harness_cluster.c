/* harness_cluster: a real 127.0.0.1 Redis Cluster for the tests: start,
 * create, migrate a slot step by step, kill -9 and restart a node. */
#include "harness_cluster.h"

#include <hiredis.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Every node runs with these on top of th_redis_start's arguments: a
 * short node timeout, so a killed primary is failed over in seconds. */
static const char *const cluster_args[] = {"--cluster-enabled",
                                           "yes",
                                           "--cluster-config-file",
                                           "nodes.conf",
                                           "--cluster-node-timeout",
                                           "1000",
                                           "--cluster-replica-validity-factor",
                                           "0",
                                           NULL};

static void reply_text(const redisReply *r, char **buf, size_t *len,
                       size_t *cap)
{
    char tmp[64];
    const char *s = NULL;
    size_t l = 0;
    switch (r->type) {
    case REDIS_REPLY_STATUS:
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_ERROR:
        s = r->str;
        l = r->len;
        break;
    case REDIS_REPLY_INTEGER:
        l = (size_t)snprintf(tmp, sizeof(tmp), "%lld", r->integer);
        s = tmp;
        break;
    case REDIS_REPLY_ARRAY:
        for (size_t i = 0; i < r->elements; i++)
            reply_text(r->element[i], buf, len, cap);
        return;
    default:
        s = "";
    }
    if (*len + l + 2 > *cap) {
        *cap = (*len + l + 2) * 2;
        *buf = realloc(*buf, *cap);
    }
    memcpy(*buf + *len, s, l);
    *len += l;
    (*buf)[(*len)++] = '\n';
    (*buf)[*len] = '\0';
}

/* A connection to node i (AUTH sent when the cluster has a password),
 * or NULL when it does not answer. Caller frees with redisFree. */
static redisContext *node_connect(th_cluster_t *c, int i)
{
    if (i < 0 || i >= c->n || c->node[i].pid <= 0)
        return NULL;
    struct timeval tv = {.tv_sec = 5};
    redisContext *rc =
        redisConnectWithTimeout("127.0.0.1", c->node[i].port, tv);
    if (!rc || rc->err) {
        if (rc)
            redisFree(rc);
        return NULL;
    }
    redisSetTimeout(rc, tv);
    if (c->password[0]) {
        redisReply *a = redisCommand(rc, "AUTH %s", c->password);
        if (a)
            freeReplyObject(a);
    }
    return rc;
}

/* r as th_cluster_cmd's text (NULL for no reply), r freed. */
static char *reply_take(redisReply *r)
{
    char *out = NULL;
    if (r) {
        size_t len = 0, cap = 64;
        out = calloc(1, cap);
        reply_text(r, &out, &len, &cap);
        if (len && out[len - 1] == '\n')
            out[--len] = '\0';
        freeReplyObject(r);
    }
    return out;
}

char *th_cluster_cmd(th_cluster_t *c, int i, const char *fmt, ...)
{
    redisContext *rc = node_connect(c, i);
    if (!rc)
        return NULL;
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(rc, fmt, ap);
    va_end(ap);
    redisFree(rc);
    return reply_take(r);
}

char *th_cluster_cmd_argv(th_cluster_t *c, int i, int argc,
                          const char *const argv[])
{
    redisContext *rc = node_connect(c, i);
    if (!rc)
        return NULL;
    redisReply *r = redisCommandArgv(rc, argc, (const char **)argv, NULL);
    redisFree(rc);
    return reply_take(r);
}

/* The node's id (CLUSTER MYID) into id; 0 or -1. */
static int node_id(th_cluster_t *c, int i, char *id, size_t size)
{
    char *out = th_cluster_cmd(c, i, "CLUSTER MYID");
    if (!out || strlen(out) != 40) {
        free(out);
        return -1;
    }
    snprintf(id, size, "%s", out);
    free(out);
    return 0;
}

static int index_of_port(th_cluster_t *c, int port)
{
    for (int i = 0; i < c->n; i++)
        if (c->node[i].port == port)
            return i;
    return -1;
}

/* owner[slot] = node index, as node i's CLUSTER NODES says (-1: none).
 * 0, or -1 when i did not answer. */
static int slot_view(th_cluster_t *c, int i, int *owner)
{
    char *out = th_cluster_cmd(c, i, "CLUSTER NODES");
    if (!out)
        return -1;
    for (int s = 0; s < 16384; s++)
        owner[s] = -1;
    char *save = NULL;
    for (char *line = strtok_r(out, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        char *f[64];
        int nf = 0;
        char *fs = NULL;
        for (char *t = strtok_r(line, " ", &fs); t && nf < 64;
             t = strtok_r(NULL, " ", &fs))
            f[nf++] = t;
        if (nf < 8 || !strstr(f[2], "master") || strstr(f[2], "fail"))
            continue;
        char *at = strchr(f[1], '@');
        if (at)
            *at = '\0';
        char *colon = strrchr(f[1], ':');
        int idx = colon ? index_of_port(c, atoi(colon + 1)) : -1;
        for (int k = 8; k < nf; k++) {
            if (f[k][0] == '[')
                continue; /* a slot being migrated or imported */
            int a = atoi(f[k]), b = a;
            char *dash = strchr(f[k], '-');
            if (dash)
                b = atoi(dash + 1);
            for (int s = a; s <= b && s < 16384; s++)
                owner[s] = idx;
        }
    }
    free(out);
    return 0;
}

const char *th_cluster_state(th_cluster_t *c, int i)
{
    char *out = th_cluster_cmd(c, i, "CLUSTER INFO");
    const char *st = "";
    if (out && strstr(out, "cluster_state:ok"))
        st = "ok";
    else if (out && strstr(out, "cluster_state:fail"))
        st = "fail";
    free(out);
    return st;
}

int th_cluster_owner(th_cluster_t *c, int slot)
{
    static int view[16384];
    int owner = -2;
    for (int i = 0; i < c->n; i++) {
        if (c->node[i].pid <= 0 || slot_view(c, i, view))
            continue;
        if (owner == -2)
            owner = view[slot];
        else if (owner != view[slot])
            return -1;
    }
    return owner < 0 ? -1 : owner;
}

int th_cluster_wait_ok(th_cluster_t *c, int timeout_ms)
{
    static int first[16384], view[16384];
    for (int waited = 0; waited <= timeout_ms; waited += 100) {
        int ok = 1, have = 0;
        for (int i = 0; i < c->n && ok; i++) {
            if (c->node[i].pid <= 0)
                continue;
            if (strcmp(th_cluster_state(c, i), "ok") ||
                slot_view(c, i, have ? view : first)) {
                ok = 0;
                break;
            }
            if (have && memcmp(first, view, sizeof(view)))
                ok = 0;
            have = 1;
        }
        for (int s = 0; ok && s < 16384; s++)
            ok = first[s] >= 0 && c->node[first[s]].pid > 0;
        if (ok && have)
            return 0;
        usleep(100 * 1000);
    }
    return -1;
}

int th_cluster_replica_of(th_cluster_t *c, int primary)
{
    for (int i = 0; i < c->n; i++) {
        if (i == primary || c->node[i].pid <= 0)
            continue;
        char *out = th_cluster_cmd(c, i, "ROLE");
        /* ROLE of a replica: slave, host, port, state, offset. */
        int port = -1;
        const char *nl =
            out && !strncmp(out, "slave\n", 6) ? strchr(out + 6, '\n') : NULL;
        if (nl)
            port = atoi(nl + 1);
        free(out);
        /* On a TLS cluster (tls-replication) a replica names its
         * primary's TLS port. */
        if (port == c->node[primary].port ||
            (c->tls_port[primary] && port == c->tls_port[primary]))
            return i;
    }
    return -1;
}

void th_cluster_stop(th_cluster_t *c)
{
    for (int i = 0; i < c->n; i++)
        if (c->node[i].dir)
            th_redis_stop(&c->node[i]);
    c->n = 0;
    if (c->tls_dir) {
        th_rmrf(c->tls_dir);
        free(c->tls_dir);
        c->tls_dir = NULL;
    }
}

static int start_nodes(th_cluster_t *c, int primaries, int replicas,
                       const char *password);

int th_cluster_start(th_cluster_t *c, int primaries, int replicas)
{
    memset(c, 0, sizeof(*c));
    return start_nodes(c, primaries, replicas, NULL);
}

int th_cluster_start_auth(th_cluster_t *c, int primaries, int replicas,
                          const char *password)
{
    memset(c, 0, sizeof(*c));
    return start_nodes(c, primaries, replicas, password);
}

/* The test CA and a server certificate for 127.0.0.1 in c->tls_dir. */
static int make_certs(th_cluster_t *c)
{
    c->tls_dir = th_tmpdir();
    const char *ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
                     "-nodes -days 2";
    char sh[2048];
    snprintf(sh, sizeof(sh),
             "cd '%s' && openssl req -x509 %s -keyout ca.key -out ca.crt "
             "-subj /CN=idemproc-test-ca && "
             "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > "
             "san.cnf && "
             "openssl req %s -keyout server.key -out server.csr "
             "-subj /CN=redis && "
             "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key "
             "-CAcreateserial -days 2 -extfile san.cnf -out server.crt",
             c->tls_dir, ec, ec);
    char *argv[] = {"/bin/sh", "-c", sh, NULL};
    char *err = NULL;
    int rc = th_run(argv, NULL, &err, 30000);
    if (rc)
        fprintf(stderr, "harness_cluster: openssl: %s\n", err ? err : "");
    free(err);
    snprintf(c->tls_ca, sizeof(c->tls_ca), "%s/ca.crt", c->tls_dir);
    return rc ? -1 : 0;
}

int th_cluster_start_tls(th_cluster_t *c, int primaries, int replicas)
{
    memset(c, 0, sizeof(*c));
    if (primaries * (1 + replicas) > TH_CLUSTER_MAX || make_certs(c)) {
        th_cluster_stop(c);
        return -1;
    }
    for (int i = 0; i < TH_CLUSTER_MAX; i++) {
        c->tls_port[i] = th_free_port();
        snprintf(c->tls_args[i][0], 512, "%d", c->tls_port[i]);
        snprintf(c->tls_args[i][1], 512, "%s/server.crt", c->tls_dir);
        snprintf(c->tls_args[i][2], 512, "%s/server.key", c->tls_dir);
        snprintf(c->tls_args[i][3], 512, "%s", c->tls_ca);
        const char *tls[] = {"--tls-port",
                             c->tls_args[i][0],
                             "--tls-cert-file",
                             c->tls_args[i][1],
                             "--tls-key-file",
                             c->tls_args[i][2],
                             "--tls-ca-cert-file",
                             c->tls_args[i][3],
                             "--tls-auth-clients",
                             "no",
                             "--tls-cluster",
                             "yes",
                             "--tls-replication",
                             "yes",
                             NULL};
        int n = 0;
        for (int k = 0; cluster_args[k]; k++)
            c->extra[i][n++] = cluster_args[k];
        for (int k = 0; tls[k]; k++)
            c->extra[i][n++] = tls[k];
        c->extra[i][n] = NULL;
    }
    if (start_nodes(c, primaries, replicas, NULL))
        return -1;
    for (int i = 0; i < c->n; i++) {
        size_t l = strlen(c->tls_seeds);
        snprintf(c->tls_seeds + l, sizeof(c->tls_seeds) - l, "%s127.0.0.1:%d",
                 i ? "," : "", c->tls_port[i]);
    }
    return 0;
}

int th_cluster_start_args(th_cluster_t *c, int primaries, int replicas,
                          const char *const more[])
{
    memset(c, 0, sizeof(*c));
    for (int i = 0; i < TH_CLUSTER_MAX; i++) {
        int n = 0;
        for (int k = 0; cluster_args[k]; k++)
            c->extra[i][n++] = cluster_args[k];
        for (int k = 0; more && more[k] && n < 23; k++)
            c->extra[i][n++] = more[k];
        c->extra[i][n] = NULL;
    }
    return start_nodes(c, primaries, replicas, NULL);
}

static int start_nodes(th_cluster_t *c, int primaries, int replicas,
                       const char *password)
{
    int total = primaries * (1 + replicas);
    if (primaries < 3 || total > TH_CLUSTER_MAX)
        return -1;
    char *argv[32] = {"/usr/bin/redis-cli", "--cluster", "create"};
    int an = 3;
    static char addrs[TH_CLUSTER_MAX][32];
    for (int i = 0; i < total; i++) {
        /* th_redis_start_args tries new ports, but not a new TLS port: a
         * TLS node that cannot start (its TLS port taken meanwhile, e.g.
         * by another node's bus port, its port + 10000) gets a new one. */
        int rc = -1;
        for (int attempt = 0; rc && attempt < 5; attempt++) {
            if (attempt) {
                th_redis_stop(&c->node[i]); /* its directory */
                if (c->tls_dir) {
                    c->tls_port[i] = th_free_port();
                    snprintf(c->tls_args[i][0], 512, "%d", c->tls_port[i]);
                }
            }
            rc = th_redis_start_args(
                &c->node[i], c->extra[i][0] ? c->extra[i] : cluster_args);
        }
        if (rc) {
            c->n = i + 1;
            th_cluster_stop(c);
            return -1;
        }
        c->n = i + 1;
        snprintf(addrs[i], sizeof(addrs[i]), "127.0.0.1:%d", c->node[i].port);
        argv[an++] = addrs[i];
        size_t l = strlen(c->seeds);
        snprintf(c->seeds + l, sizeof(c->seeds) - l, "%s%s", i ? "," : "",
                 addrs[i]);
    }
    if (password && password[0]) {
        for (int i = 0; i < total; i++) {
            free(th_cluster_cmd(c, i, "CONFIG SET masterauth %s", password));
            free(th_cluster_cmd(c, i, "CONFIG SET requirepass %s", password));
        }
        snprintf(c->password, sizeof(c->password), "%s", password);
        argv[an++] = "-a";
        argv[an++] = c->password;
        argv[an++] = "--no-auth-warning";
    }
    char reps[8];
    snprintf(reps, sizeof(reps), "%d", replicas);
    argv[an++] = "--cluster-replicas";
    argv[an++] = reps;
    argv[an++] = "--cluster-yes";
    argv[an] = NULL;
    char *out = NULL, *err = NULL;
    int rc = th_run(argv, &out, &err, 60000);
    if (rc != 0)
        fprintf(stderr, "redis-cli --cluster create: exit %d\n%s\n%s\n", rc,
                out ? out : "", err ? err : "");
    free(out);
    free(err);
    /* Replicas attach after the slots are assigned: wait for both. */
    for (int waited = 0; rc == 0 && replicas > 0; waited += 100) {
        int attached = 0;
        for (int i = 0; i < c->n; i++) {
            char *role = th_cluster_cmd(c, i, "ROLE");
            if (role && !strncmp(role, "slave\n", 6) &&
                strstr(role, "\nconnected\n"))
                attached++;
            free(role);
        }
        if (attached == primaries * replicas)
            break;
        if (waited > 30000)
            rc = -1;
        usleep(100 * 1000);
    }
    if (rc != 0 || th_cluster_wait_ok(c, 30000)) {
        th_cluster_stop(c);
        return -1;
    }
    return 0;
}

void th_cluster_kill(th_cluster_t *c, int i)
{
    if (c->node[i].pid > 0) {
        kill(c->node[i].pid, SIGKILL);
        th_wait(c->node[i].pid, 5000);
    }
    c->node[i].pid = 0;
}

int th_cluster_restart(th_cluster_t *c, int i)
{
    return th_redis_restart(&c->node[i]);
}

/* An OK from node i, else -1 (the reply printed). */
static int ok_reply(char *out, const char *what)
{
    int ok = out && !strcmp(out, "OK");
    if (!ok)
        fprintf(stderr, "harness_cluster: %s: %s\n", what,
                out ? out : "no answer");
    free(out);
    return ok ? 0 : -1;
}

int th_cluster_migrate_begin(th_cluster_t *c, int slot, int from, int to)
{
    char fid[64], tid[64];
    if (node_id(c, from, fid, sizeof(fid)) || node_id(c, to, tid, sizeof(tid)))
        return -1;
    if (ok_reply(
            th_cluster_cmd(c, to, "CLUSTER SETSLOT %d IMPORTING %s", slot, fid),
            "SETSLOT IMPORTING"))
        return -1;
    return ok_reply(
        th_cluster_cmd(c, from, "CLUSTER SETSLOT %d MIGRATING %s", slot, tid),
        "SETSLOT MIGRATING");
}

int th_cluster_migrate_keys(th_cluster_t *c, int slot, int from, int to,
                            int max)
{
    char *keys =
        th_cluster_cmd(c, from, "CLUSTER GETKEYSINSLOT %d %d", slot, max);
    if (!keys)
        return -1;
    int moved = 0;
    char *save = NULL;
    for (char *k = strtok_r(keys, "\n", &save); k;
         k = strtok_r(NULL, "\n", &save)) {
        char *out = th_cluster_cmd(c, from, "MIGRATE 127.0.0.1 %d %s 0 5000",
                                   c->node[to].port, k);
        int ok = out && (!strcmp(out, "OK") || !strcmp(out, "NOKEY"));
        if (!ok)
            fprintf(stderr, "harness_cluster: MIGRATE %s: %s\n", k,
                    out ? out : "no answer");
        free(out);
        if (!ok) {
            free(keys);
            return -1;
        }
        moved++;
    }
    free(keys);
    return moved;
}

int th_cluster_migrate_end(th_cluster_t *c, int slot, int from, int to)
{
    char tid[64];
    if (node_id(c, to, tid, sizeof(tid)))
        return -1;
    /* The new owner first, then the old one, then everyone else, as
     * redis-cli does: the old owner must not answer MOVED to a node that
     * does not know yet. */
    if (ok_reply(th_cluster_cmd(c, to, "CLUSTER SETSLOT %d NODE %s", slot, tid),
                 "SETSLOT NODE (to)") ||
        ok_reply(
            th_cluster_cmd(c, from, "CLUSTER SETSLOT %d NODE %s", slot, tid),
            "SETSLOT NODE (from)"))
        return -1;
    for (int i = 0; i < c->n; i++) {
        if (i == from || i == to || c->node[i].pid <= 0)
            continue;
        free(th_cluster_cmd(c, i, "CLUSTER SETSLOT %d NODE %s", slot, tid));
    }
    return 0;
}

int th_cluster_reshard(th_cluster_t *c, int from, int to, int nslots)
{
    char fid[64], tid[64], addr[32], n[16];
    if (node_id(c, from, fid, sizeof(fid)) || node_id(c, to, tid, sizeof(tid)))
        return -1;
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", c->node[from].port);
    snprintf(n, sizeof(n), "%d", nslots);
    char *argv[20] = {"/usr/bin/redis-cli", "--cluster", "reshard",      addr,
                      "--cluster-from",     fid,         "--cluster-to", tid,
                      "--cluster-slots",    n,           "--cluster-yes"};
    int an = 11;
    if (c->password[0]) {
        argv[an++] = "-a";
        argv[an++] = c->password;
        argv[an++] = "--no-auth-warning";
    }
    argv[an] = NULL;
    char *out = NULL, *err = NULL;
    int rc = th_run(argv, &out, &err, 120000);
    if (rc != 0)
        fprintf(stderr, "redis-cli --cluster reshard: exit %d\n%s\n%s\n", rc,
                out ? out : "", err ? err : "");
    free(out);
    free(err);
    return rc == 0 ? 0 : -1;
}

int th_cluster_slots_upto(th_cluster_t *c, int i, int slot)
{
    static int view[16384];
    int agreed = -1;
    for (int k = 0; k < c->n; k++) {
        if (c->node[k].pid <= 0 || slot_view(c, k, view))
            continue;
        if (view[slot] != i)
            return -1;
        int count = 0;
        for (int s = 0; s <= slot; s++)
            count += view[s] == i;
        if (agreed >= 0 && agreed != count)
            return -1;
        agreed = count;
    }
    return agreed;
}

int th_cluster_is_primary(th_cluster_t *c, int i)
{
    if (i < 0 || i >= c->n || !c->node[i].pid)
        return 0;
    char *role = th_cluster_cmd(c, i, "ROLE");
    int primary = role && !strncmp(role, "master", 6);
    free(role);
    return primary;
}
