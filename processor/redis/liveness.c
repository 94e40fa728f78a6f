/* liveness: the members' heartbeats in Redis (liveness.h). */
#include "redis/liveness.h"
#include "base/log.h"
#include "base/util.h"
#include "redis/redisconn.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis.h>

/* KEYS[1] the set, ARGV[1] the member, ARGV[2] the TTL (ms): renews the
 * member's entry and drops the expired ones, all by Redis's clock. */
static const char beat_lua[] =
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)\n"
    "redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])\n"
    "redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))\n"
    "return 1\n";

/* KEYS[1] the set: the members not expired, each followed by the ms its
 * entry has left. Reads only. */
static const char list_lua[] =
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "local v = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf',"
    " 'WITHSCORES')\n"
    "for i = 2, #v, 2 do v[i] = tostring(tonumber(v[i]) - now) end\n"
    "return v\n";

/* Runs `lua` by EVALSHA, as the store does (the documented ACL grants
 * +script|load +evalsha, not +eval): `sha` caches its digest (41 bytes,
 * "" at first); it is loaded when empty and again after NOSCRIPT (a
 * restarted Redis). `nargs` arguments follow the digest: the key count,
 * the keys, the rest. The reply, or NULL. */
static redisReply *script_call(redisContext *c, const char *lua, char *sha,
                               int nargs, const char **args)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        if (!sha[0]) {
            redisReply *l = redisCommand(c, "SCRIPT LOAD %s", lua);
            if (!l || l->type != REDIS_REPLY_STRING || l->len != 40)
                return l;
            memcpy(sha, l->str, 41);
            freeReplyObject(l);
        }
        const char *argv[8] = {"EVALSHA", sha};
        for (int i = 0; i < nargs && i < 6; i++)
            argv[2 + i] = args[i];
        redisReply *r = redisCommandArgv(c, 2 + nargs, argv, NULL);
        if (r && r->type == REDIS_REPLY_ERROR &&
            !strncmp(r->str, "NOSCRIPT", 8)) {
            freeReplyObject(r);
            sha[0] = 0;
            continue;
        }
        return r;
    }
    return NULL;
}

/* KEYS[1] the set, ARGV[1] the member: its entry removed. */
static const char leave_lua[] = "return redis.call('ZREM', KEYS[1], ARGV[1])\n";

struct idem_liveness_s {
    const idem_conf_t *conf;
    char key[512]; /* <prefix>members:<group.id> */
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int stop; /* under lock */
    idem_redisconn_t *rc;
    int failing; /* the last beat failed (logged once per outage) */
    char beat_sha[41], leave_sha[41]; /* script digests, "" until loaded */
};

static void members_key(const idem_conf_t *conf, char *buf, size_t size)
{
    snprintf(buf, size, "%smembers:%s", conf->redis_prefix, conf->group_id);
}

/* One script on l's connection, connecting first when needed. Returns 0,
 * or -1 with errstr (the connection is dropped). */
static int liveness_command(idem_liveness_t *l, const char *lua, char *sha,
                            int nargs, const char **args, char *errstr,
                            size_t errstr_size)
{
    if (!l->rc) {
        l->rc = idem_redisconn_open(l->conf, 0, errstr, errstr_size);
        if (!l->rc)
            return -1;
    }
    redisReply *r =
        script_call(idem_redisconn_context(l->rc), lua, sha, nargs, args);
    if (!r || r->type == REDIS_REPLY_ERROR) {
        snprintf(errstr, errstr_size, "redis: member heartbeat: %s",
                 r ? r->str : idem_redisconn_context(l->rc)->errstr);
        freeReplyObject(r);
        idem_redisconn_close(l->rc);
        l->rc = NULL;
        return -1;
    }
    freeReplyObject(r);
    return 0;
}

static void beat(idem_liveness_t *l)
{
    char ttl[24], errstr[512];
    snprintf(ttl, sizeof(ttl), "%d", IDEM_LIVENESS_TTL_MS);
    const char *args[] = {"1", l->key, l->conf->member_id, ttl};
    if (liveness_command(l, beat_lua, l->beat_sha, 4, args, errstr,
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

idem_liveness_t *idem_liveness_start(const idem_conf_t *conf, char *errstr,
                                     size_t errstr_size)
{
    idem_liveness_t *l = idem_xcalloc(1, sizeof(*l));
    l->conf = conf;
    members_key(conf, l->key, sizeof(l->key));
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
    const char *args[] = {"1", l->key, l->conf->member_id};
    if (liveness_command(l, leave_lua, l->leave_sha, 3, args, errstr,
                         sizeof(errstr)))
        idem_log_kv(IDEM_LOG_WARN,
                    "removing the member heartbeat from redis failed: it "
                    "expires by itself",
                    "error", errstr, NULL);
    idem_redisconn_close(l->rc);
    pthread_cond_destroy(&l->cond);
    pthread_mutex_destroy(&l->lock);
    free(l);
}

int idem_liveness_list(const idem_conf_t *conf, idem_liveness_member_t **out,
                       size_t *n, char *errstr, size_t errstr_size)
{
    *out = NULL;
    *n = 0;
    char key[512];
    members_key(conf, key, sizeof(key));
    idem_redisconn_t *rc = idem_redisconn_open(conf, 0, errstr, errstr_size);
    if (!rc)
        return -1;
    const char *args[] = {"1", key};
    char sha[41] = "";
    redisReply *r =
        script_call(idem_redisconn_context(rc), list_lua, sha, 2, args);
    int ret = 0;
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements % 2) {
        snprintf(errstr, errstr_size, "redis: live members of %s: %s",
                 conf->group_id,
                 !r ? idem_redisconn_context(rc)->errstr
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
    return ret;
}

void idem_liveness_list_free(idem_liveness_member_t *v, size_t n)
{
    for (size_t i = 0; v && i < n; i++)
        free(v[i].member);
    free(v);
}
