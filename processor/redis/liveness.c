/* liveness: the members' heartbeats in Redis (liveness.h). */
#include "redis/liveness.h"
#include "base/log.h"
#include "base/util.h"
#include "obs/metrics.h"
#include "redis/cluster.h"
#include "redis/layout.h"
#include "redis/rediskeys.h"
#include "redis/redisconn.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis.h>

/* KEYS[1] the set, KEYS[2] the settings hash, ARGV[1] the member, ARGV[2]
 * the TTL (ms), ARGV[3] the member's settings fingerprint: renews the
 * member's entry and drops the expired ones, all by Redis's clock, and
 * returns the fingerprints of the live members (member, fingerprint, ...),
 * dropping those of members no longer live. */
static const char beat_lua[] =
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)\n"
    "redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])\n"
    /* Members' TTLs may differ: the keys last as long as the longest
     * (read with the ZRANGEBYSCORE the ACL line already grants). */
    "local live, keep = {}, tonumber(ARGV[2])\n"
    "local z = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf',"
    " 'WITHSCORES')\n"
    "for i = 1, #z, 2 do\n"
    "  live[z[i]] = true\n"
    "  keep = math.max(keep, tonumber(z[i + 1]) - now)\n"
    "end\n"
    "redis.call('PEXPIRE', KEYS[1], keep)\n"
    "redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])\n"
    "redis.call('PEXPIRE', KEYS[2], keep)\n"
    "local h, out = redis.call('HGETALL', KEYS[2]), {}\n"
    "for i = 1, #h, 2 do\n"
    "  if live[h[i]] then out[#out + 1] = h[i]; out[#out + 1] = h[i + 1]\n"
    "  else redis.call('HDEL', KEYS[2], h[i]) end\n"
    "end\n"
    "return out\n";

/* KEYS[1] the set: the members not expired, each followed by the ms its
 * entry has left. Reads only. */
static const char list_lua[] =
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "local v = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf',"
    " 'WITHSCORES')\n"
    "for i = 2, #v, 2 do v[i] = tostring(tonumber(v[i]) - now) end\n"
    "return v\n";

/* KEYS[1] the set, KEYS[2] the settings hash, ARGV[1] the member: its
 * entries removed. */
static const char leave_lua[] = "redis.call('HDEL', KEYS[2], ARGV[1])\n"
                                "return redis.call('ZREM', KEYS[1], ARGV[1])\n";

struct idem_liveness_s {
    const idem_conf_t *conf;
    char key[512];     /* <prefix>members:<group.id> */
    char fp_key[512];  /* <prefix>memberconf:<group.id> */
    char *fingerprint; /* this member's (idem_liveness_start) */
    idem_metrics_t *metrics;
    char *warned; /* the mismatches last logged ("" when none) */
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int stop; /* under lock */
    idem_redisconn_t *rc;
    idem_cluster_t *cl; /* cluster mode: the client (rc unused) */
    int slot;           /* cluster mode: the slot of key and fp_key */
    int failing;        /* the last beat failed (logged once per outage) */
    char beat_sha[41], leave_sha[41]; /* script digests, "" until loaded */
    char layout_sha[41];              /* the layout switch's */
    char *layout_blocked; /* who blocks the switch, last logged ("" none) */
};

static int cluster_mode(const idem_conf_t *conf)
{
    return conf->redis_cluster_nodes && *conf->redis_cluster_nodes;
}

/* In cluster mode both keys carry the group as their hash tag, so the
 * beat's script (it touches both) runs on one node. */
static void members_key(const idem_conf_t *conf, char *buf, size_t size)
{
    snprintf(buf, size, cluster_mode(conf) ? "%smembers{%s}" : "%smembers:%s",
             conf->redis_prefix, conf->group_id);
}

static void settings_key(const idem_conf_t *conf, char *buf, size_t size)
{
    snprintf(buf, size,
             cluster_mode(conf) ? "%smemberconf{%s}" : "%smemberconf:%s",
             conf->redis_prefix, conf->group_id);
}

/* The connection of the keys' slot in cluster mode (its primary, the
 * client made first when needed): NULL with errstr on an outage (the
 * text names the node). */
static redisContext *cluster_ctx(const idem_conf_t *conf, idem_cluster_t **cl,
                                 int slot, char *errstr, size_t errstr_size)
{
    idem_cluster_err_t e;
    if (!*cl &&
        !(*cl = idem_cluster_new(conf, conf->redis_cluster_nodes, &e))) {
        snprintf(errstr, errstr_size, "%s", e.str);
        return NULL;
    }
    redisContext *c = idem_cluster_context(*cl, slot, &e);
    if (!c)
        snprintf(errstr, errstr_size, "%s", e.str);
    return c;
}

/* One script on l's connection, connecting first when needed. Returns 0
 * (the reply in *out when out is not NULL, the caller frees it), or -1
 * with errstr (the connection is dropped). */
static int liveness_command(idem_liveness_t *l, const char *lua, char *sha,
                            int nargs, const char **args, redisReply **out,
                            char *errstr, size_t errstr_size)
{
    redisContext *c;
    if (cluster_mode(l->conf)) {
        c = cluster_ctx(l->conf, &l->cl, l->slot, errstr, errstr_size);
        if (!c)
            return -1;
    } else {
        if (!l->rc) {
            l->rc = idem_redisconn_open(l->conf, 0, errstr, errstr_size);
            if (!l->rc)
                return -1;
        }
        c = idem_redisconn_context(l->rc);
    }
    redisReply *r = idem_redisconn_script(c, lua, sha, nargs, args);
    if (!r || r->type == REDIS_REPLY_ERROR) {
        snprintf(errstr, errstr_size, "redis: member heartbeat: %s",
                 r ? r->str : c->errstr);
        if (l->cl) /* MOVED, CLUSTERDOWN, a lost node: the map is read again */
            idem_cluster_failed(l->cl, l->slot, r ? r->str : NULL);
        freeReplyObject(r);
        idem_redisconn_close(l->rc);
        l->rc = NULL;
        return -1;
    }
    if (out)
        *out = r;
    else
        freeReplyObject(r);
    return 0;
}

/* Appends to buf (comma-separated) the keys of fingerprint `from` whose
 * value in `other` differs or is missing; returns how many. */
static int fp_diff_into(const char *from, const char *other, char *buf,
                        size_t size, int n)
{
    for (const char *p = from; p && *p;) {
        const char *end = strchr(p, '\n');
        size_t ln = end ? (size_t)(end - p) : strlen(p);
        const char *eq = memchr(p, '=', ln);
        if (eq && eq > p) {
            char key[128], a[512], b[512];
            size_t kn = (size_t)(eq - p) < sizeof(key) - 1 ? (size_t)(eq - p)
                                                           : sizeof(key) - 1;
            memcpy(key, p, kn);
            key[kn] = 0;
            const char *va = idem_layout_fp_get(from, key, a, sizeof(a));
            const char *vb = idem_layout_fp_get(other, key, b, sizeof(b));
            int listed = 0;
            size_t used = strlen(buf);
            for (const char *q = buf; *q;) {
                size_t qn = strcspn(q, ",");
                if (qn == kn && !strncmp(q, key, kn))
                    listed = 1;
                q += qn + (q[qn] == ',');
            }
            if (!listed && (!vb || strcmp(va, vb))) {
                snprintf(buf + used, size - used, "%s%s", used ? "," : "", key);
                n++;
            }
        }
        p = end ? end + 1 : NULL;
    }
    return n;
}

int idem_liveness_fp_diff(const char *mine, const char *theirs, char *buf,
                          size_t size)
{
    buf[0] = 0;
    int n = fp_diff_into(mine, theirs, buf, size, 0);
    return fp_diff_into(theirs, mine, buf, size, n);
}

/* Compares the live members' fingerprints (the beat's reply: member,
 * fingerprint, ...) with this member's: the metric, and a warning when
 * the mismatches change (one line per other member). */
static void check_members(idem_liveness_t *l, const redisReply *r)
{
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements % 2)
        return;
    int64_t differ = 0;
    char all[4096] = "";
    for (size_t i = 0; i + 1 < r->elements; i += 2) {
        const redisReply *m = r->element[i], *f = r->element[i + 1];
        if (m->type != REDIS_REPLY_STRING || f->type != REDIS_REPLY_STRING ||
            !strcmp(m->str, l->conf->member_id))
            continue;
        char keys[1024];
        if (!idem_liveness_fp_diff(l->fingerprint, f->str, keys, sizeof(keys)))
            continue;
        differ++;
        size_t used = strlen(all);
        snprintf(all + used, sizeof(all) - used, "%s=%s;", m->str, keys);
    }
    if (l->metrics)
        idem_metrics_group_config_mismatch_set(l->metrics, differ);
    if (!strcmp(all, l->warned ? l->warned : ""))
        return;
    free(l->warned);
    l->warned = idem_xstrdup(all);
    if (!differ) {
        idem_log_kv(IDEM_LOG_INFO,
                    "the group's live members agree on the effect settings",
                    "member", l->conf->member_id, NULL);
        return;
    }
    for (size_t i = 0; i + 1 < r->elements; i += 2) {
        const redisReply *m = r->element[i], *f = r->element[i + 1];
        if (m->type != REDIS_REPLY_STRING || f->type != REDIS_REPLY_STRING ||
            !strcmp(m->str, l->conf->member_id))
            continue;
        char keys[1024], mine[256], theirs[256];
        if (!idem_liveness_fp_diff(l->fingerprint, f->str, keys, sizeof(keys)))
            continue;
        const char *hm =
            idem_layout_fp_get(l->fingerprint, "handler", mine, sizeof(mine));
        const char *ht =
            idem_layout_fp_get(f->str, "handler", theirs, sizeof(theirs));
        idem_log_kv(IDEM_LOG_WARN,
                    "another live member of the group applies a different "
                    "effect: each applies its own to its share of the "
                    "partitions (a rolling change passes through this; "
                    "otherwise align the settings)",
                    "member", l->conf->member_id, "other", m->str, "differing",
                    keys, "handler", hm ? hm : "", "other_handler",
                    ht ? ht : "", NULL);
    }
}

/* A member that wants the partition layout switches the group's layout
 * key to it (compare and set: only if it still says global) once every
 * live member's fingerprint (the beat's reply: member, fingerprint, ...,
 * this member's included) supports the key and wants partition. Who
 * blocks it is logged when that changes. */
static void layout_consider(idem_liveness_t *l, const redisReply *r)
{
    /* In cluster mode the store fixes the layout key at partition. */
    if (l->conf->dedup_scope != IDEM_DEDUP_SCOPE_PARTITION || !r || l->cl ||
        r->type != REDIS_REPLY_ARRAY || r->elements % 2 || !l->rc)
        return;
    size_t n = r->elements / 2, k = 0;
    const char **fps = idem_xcalloc(n + 1, sizeof(*fps));
    const char **who = idem_xcalloc(n + 1, sizeof(*who));
    for (size_t i = 0; i + 1 < r->elements; i += 2)
        if (r->element[i]->type == REDIS_REPLY_STRING &&
            r->element[i + 1]->type == REDIS_REPLY_STRING) {
            who[k] = r->element[i]->str;
            fps[k++] = r->element[i + 1]->str;
        }
    size_t b = 0;
    char why[64] = "", blocked[512] = "";
    if (!idem_layout_decide(fps, k, IDEM_LAYOUT_PARTITION, &b, why,
                            sizeof(why)))
        snprintf(blocked, sizeof(blocked), "%s %s", who[b], why);
    free(fps);
    free(who);
    if (strcmp(blocked, l->layout_blocked ? l->layout_blocked : "")) {
        free(l->layout_blocked);
        l->layout_blocked = idem_xstrdup(blocked);
        if (blocked[0])
            idem_log_kv(IDEM_LOG_INFO,
                        "dedup layout stays as it is: a live member does not "
                        "support or want partition",
                        "member", l->conf->member_id, "blocker", blocked, NULL);
    }
    if (blocked[0])
        return;
    idem_layout_t st;
    char errstr[512];
    int rc = idem_layout_switch(
        idem_redisconn_context(l->rc), l->conf, l->layout_sha,
        IDEM_LAYOUT_GLOBAL, IDEM_LAYOUT_PARTITION, &st, errstr, sizeof(errstr));
    if (rc < 0)
        idem_log_kv(IDEM_LOG_WARN, "dedup layout switch failed", "error",
                    errstr, NULL);
    else if (rc == 1)
        idem_log_kv(IDEM_LOG_WARN,
                    "dedup layout switched to partition: every live member "
                    "supports and wants it; global marks are honoured for "
                    "one dedup.ttl.seconds",
                    "member", l->conf->member_id, NULL);
}

int64_t idem_liveness_ttl_ms(const idem_conf_t *conf)
{
    /* kafka.* durations are stored in ms (idem_conf_kafka_duration); the
     * last one set wins, as in librdkafka. */
    int64_t ms = IDEM_LIVENESS_SESSION_DEFAULT_MS;
    for (size_t i = 0; i < conf->kafka_cnt; i++)
        if (!strcmp(conf->kafka[i].name, "session.timeout.ms"))
            ms = strtoll(conf->kafka[i].value, NULL, 10);
    return ms < IDEM_LIVENESS_TTL_MIN_MS ? IDEM_LIVENESS_TTL_MIN_MS : ms;
}

static void beat(idem_liveness_t *l)
{
    char ttl[24], errstr[512];
    snprintf(ttl, sizeof(ttl), "%" PRId64, idem_liveness_ttl_ms(l->conf));
    const char *args[] = {"2", l->key,        l->fp_key, l->conf->member_id,
                          ttl, l->fingerprint};
    redisReply *r = NULL;
    if (liveness_command(l, beat_lua, l->beat_sha, 6, args, &r, errstr,
                         sizeof(errstr))) {
        if (!l->failing)
            idem_log_kv(IDEM_LOG_WARN,
                        "member heartbeat in redis failed: `idemproc offsets "
                        "reset` may not see this member",
                        "error", errstr, NULL);
        l->failing = 1;
        return;
    }
    l->failing = 0;
    check_members(l, r);
    layout_consider(l, r);
    freeReplyObject(r);
}

static void *liveness_main(void *arg)
{
    idem_liveness_t *l = arg;
    pthread_mutex_lock(&l->lock);
    while (!l->stop) {
        pthread_mutex_unlock(&l->lock);
        beat(l);
        pthread_mutex_lock(&l->lock);
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += IDEM_LIVENESS_BEAT_MS / 1000;
        until.tv_nsec += (long)(IDEM_LIVENESS_BEAT_MS % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        while (!l->stop &&
               pthread_cond_timedwait(&l->cond, &l->lock, &until) != ETIMEDOUT)
            ;
    }
    pthread_mutex_unlock(&l->lock);
    return NULL;
}

idem_liveness_t *idem_liveness_start(const idem_conf_t *conf,
                                     const char *fingerprint,
                                     idem_metrics_t *metrics, char *errstr,
                                     size_t errstr_size)
{
    idem_liveness_t *l = idem_xcalloc(1, sizeof(*l));
    l->conf = conf;
    l->fingerprint = idem_xstrdup(fingerprint ? fingerprint : "");
    l->metrics = metrics;
    members_key(conf, l->key, sizeof(l->key));
    settings_key(conf, l->fp_key, sizeof(l->fp_key));
    l->slot = idem_cluster_keyslot(l->key, strlen(l->key));
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&l->cond, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&l->lock, NULL);
    int err = pthread_create(&l->thread, NULL, liveness_main, l);
    if (err) {
        snprintf(errstr, errstr_size, "member heartbeat: thread: %s",
                 strerror(err));
        pthread_cond_destroy(&l->cond);
        pthread_mutex_destroy(&l->lock);
        free(l->fingerprint);
        free(l);
        return NULL;
    }
    return l;
}

void idem_liveness_stop(idem_liveness_t *l)
{
    if (!l)
        return;
    pthread_mutex_lock(&l->lock);
    l->stop = 1;
    pthread_cond_signal(&l->cond);
    pthread_mutex_unlock(&l->lock);
    pthread_join(l->thread, NULL);
    char errstr[512];
    const char *args[] = {"2", l->key, l->fp_key, l->conf->member_id};
    if (liveness_command(l, leave_lua, l->leave_sha, 4, args, NULL, errstr,
                         sizeof(errstr)))
        idem_log_kv(IDEM_LOG_WARN,
                    "removing the member heartbeat from redis failed: it "
                    "expires by itself",
                    "error", errstr, NULL);
    idem_redisconn_close(l->rc);
    idem_cluster_destroy(l->cl);
    pthread_cond_destroy(&l->cond);
    pthread_mutex_destroy(&l->lock);
    free(l->fingerprint);
    free(l->warned);
    free(l->layout_blocked);
    free(l);
}

int idem_liveness_list(const idem_conf_t *conf, idem_liveness_member_t **out,
                       size_t *n, char *errstr, size_t errstr_size)
{
    *out = NULL;
    *n = 0;
    char key[512];
    members_key(conf, key, sizeof(key));
    idem_redisconn_t *rc = NULL;
    idem_cluster_t *cl = NULL;
    redisContext *c;
    if (cluster_mode(conf)) {
        c = cluster_ctx(conf, &cl, idem_cluster_keyslot(key, strlen(key)),
                        errstr, errstr_size);
        if (!c) {
            idem_cluster_destroy(cl);
            return -1;
        }
    } else {
        if (!(rc = idem_redisconn_open(conf, 0, errstr, errstr_size)))
            return -1;
        c = idem_redisconn_context(rc);
    }
    const char *args[] = {"1", key};
    char sha[41] = "";
    redisReply *r = idem_redisconn_script(c, list_lua, sha, 2, args);
    int ret = 0;
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements % 2) {
        snprintf(errstr, errstr_size, "redis: live members of %s: %s",
                 conf->group_id,
                 !r                             ? c->errstr
                 : r->type == REDIS_REPLY_ERROR ? r->str
                                                : "unexpected reply");
        ret = -1;
    } else if (r->elements) {
        *n = r->elements / 2;
        *out = idem_xcalloc(*n, sizeof(**out));
        for (size_t i = 0; i < *n; i++) {
            redisReply *m = r->element[2 * i], *t = r->element[2 * i + 1];
            (*out)[i].member =
                idem_xstrdup(m->type == REDIS_REPLY_STRING ? m->str : "?");
            (*out)[i].expires_in_ms =
                t->type == REDIS_REPLY_STRING ? strtoll(t->str, NULL, 10) : 0;
        }
    }
    freeReplyObject(r);
    idem_redisconn_close(rc);
    idem_cluster_destroy(cl);
    return ret;
}

void idem_liveness_list_free(idem_liveness_member_t *v, size_t n)
{
    for (size_t i = 0; v && i < n; i++)
        free(v[i].member);
    free(v);
}

int idem_liveness_fingerprints(const idem_conf_t *conf,
                               const idem_liveness_member_t *m, size_t n,
                               char ***fps, char *errstr, size_t errstr_size)
{
    *fps = idem_xcalloc(n + 1, sizeof(**fps));
    char key[512];
    settings_key(conf, key, sizeof(key));
    idem_redisconn_t *rc = NULL;
    idem_cluster_t *cl = NULL;
    redisContext *c;
    if (cluster_mode(conf)) {
        c = cluster_ctx(conf, &cl, idem_cluster_keyslot(key, strlen(key)),
                        errstr, errstr_size);
    } else {
        rc = idem_redisconn_open(conf, 0, errstr, errstr_size);
        c = rc ? idem_redisconn_context(rc) : NULL;
    }
    int ret = c ? 0 : -1;
    for (size_t i = 0; c && i < n; i++) {
        const char *argv[] = {"HGET", key, m[i].member};
        redisReply *r = redisCommandArgv(c, 3, argv, NULL);
        if (!r || r->type == REDIS_REPLY_ERROR) {
            snprintf(errstr, errstr_size, "redis: %s: %s", key,
                     r ? r->str : c->errstr);
            freeReplyObject(r);
            ret = -1;
            break;
        }
        (*fps)[i] = idem_xstrdup(r->type == REDIS_REPLY_STRING ? r->str : "");
        freeReplyObject(r);
    }
    for (size_t i = 0; ret && i < n; i++) {
        free((*fps)[i]);
        (*fps)[i] = NULL;
    }
    idem_redisconn_close(rc);
    idem_cluster_destroy(cl);
    return ret;
}
