/* layout: the group's dedup layout key and the switch decision
 * (layout.h). */
#include "redis/layout.h"
#include "redis/redisconn.h"
#include "redis/storectx.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *idem_layout_kind2str(idem_layout_kind_t k)
{
    return k == IDEM_LAYOUT_PARTITION ? "partition" : "global";
}

int idem_layout_kind_parse(const char *s, idem_layout_kind_t *k)
{
    if (s && !strcmp(s, "global"))
        *k = IDEM_LAYOUT_GLOBAL;
    else if (s && !strcmp(s, "partition"))
        *k = IDEM_LAYOUT_PARTITION;
    else
        return -1;
    return 0;
}

void idem_layout_key(const idem_conf_t *conf, char *buf, size_t size)
{
    snprintf(buf, size, "%slayout:%s", conf->redis_prefix,
             conf->group_id ? conf->group_id : "");
}

int idem_layout_honours(const idem_layout_t *l, int64_t ttl_s, int64_t now)
{
    return l->since > 0 && l->from != l->layout && now < l->since + ttl_s;
}

const char *idem_layout_fp_get(const char *fp, const char *key, char *buf,
                               size_t size)
{
    size_t kn = strlen(key);
    for (const char *p = fp; p && *p;) {
        const char *end = strchr(p, '\n');
        size_t ln = end ? (size_t)(end - p) : strlen(p);
        if (ln > kn && !strncmp(p, key, kn) && p[kn] == '=') {
            size_t vn = ln - kn - 1;
            if (vn >= size)
                vn = size - 1;
            memcpy(buf, p + kn + 1, vn);
            buf[vn] = 0;
            return buf;
        }
        p = end ? end + 1 : NULL;
    }
    return NULL;
}

/* 1 when the comma-separated list has `item`. */
static int list_has(const char *list, const char *item)
{
    size_t in = strlen(item);
    for (const char *q = list; *q;) {
        size_t qn = strcspn(q, ",");
        if (qn == in && !strncmp(q, item, in))
            return 1;
        q += qn + (q[qn] == ',');
    }
    return 0;
}

int idem_layout_decide(const char *const *fps, size_t n,
                       idem_layout_kind_t want, size_t *blocker, char *why,
                       size_t why_size)
{
    const char *w = idem_layout_kind2str(want);
    for (size_t i = 0; i < n; i++) {
        char sup[128], wants[32];
        const char *s = idem_layout_fp_get(fps[i], IDEM_LAYOUT_FP_SUPPORTS, sup,
                                           sizeof(sup));
        const char *v = idem_layout_fp_get(fps[i], IDEM_LAYOUT_FP_WANTS, wants,
                                           sizeof(wants));
        const char *no = NULL;
        if (!s || !list_has(s, w))
            no = "does not support the layout key";
        else if (!v || strcmp(v, w))
            no = v && !strcmp(v, "partition") ? "wants partition"
                                              : "wants global";
        if (no) {
            if (blocker)
                *blocker = i;
            if (why && why_size)
                snprintf(why, why_size, "%s", no);
            return 0;
        }
    }
    return 1;
}

/* Fills out from a reply of {layout, since, from, TIME seconds}. */
static int parse_state(const redisReply *r, idem_layout_t *out)
{
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 4)
        return -1;
    memset(out, 0, sizeof(*out));
    for (size_t i = 0; i < 4; i++) {
        const redisReply *e = r->element[i];
        const char *s = e->type == REDIS_REPLY_STRING ? e->str : NULL;
        int64_t v = e->type == REDIS_REPLY_INTEGER ? e->integer
                    : s                            ? strtoll(s, NULL, 10)
                                                   : 0;
        switch (i) {
        case 0:
            if (s && idem_layout_kind_parse(s, &out->layout))
                return -1;
            break;
        case 1:
            out->since = v;
            break;
        case 2:
            if (s && idem_layout_kind_parse(s, &out->from))
                return -1;
            if (!s)
                out->from = out->layout;
            break;
        case 3:
            out->now = v;
            break;
        }
    }
    return 0;
}

/* KEYS[1] the layout key: its fields and Redis's clock. Reads only. */
static const char read_lua[] =
    "local v = redis.call('HMGET', KEYS[1], 'layout', 'since', 'from')\n"
    "return {v[1], v[2], v[3], redis.call('TIME')[1]}\n";

/* KEYS[1] the layout key, KEYS[2] the group's positions hash, ARGV[1]
 * the layout expected, ARGV[2] the new one: switched only when the key
 * still says ARGV[1] (absent: global); returns 1 or 0, then the key's
 * fields and the clock. A group that never ran (no key, no positions:
 * every member writes its partitions' positions before it applies a
 * record) has no marks of the other layout to honour: since = 0. */
static const char switch_lua[] =
    "local had = redis.call('HMGET', KEYS[1], 'layout')[1]\n"
    "local cur = had or 'global'\n"
    "local t = redis.call('TIME')[1]\n"
    "local did = 0\n"
    "if cur == ARGV[1] and cur ~= ARGV[2] then\n"
    "  local since = t\n"
    "  if not had and redis.call('EXISTS', KEYS[2]) == 0 then\n"
    "    since = 0\n"
    "  end\n"
    "  redis.call('HSET', KEYS[1], 'layout', ARGV[2], 'since', since,\n"
    "             'from', cur)\n"
    "  did = 1\n"
    "end\n"
    "local v = redis.call('HMGET', KEYS[1], 'layout', 'since', 'from')\n"
    "return {did, v[1], v[2], v[3], t}\n";

/* A failed call's text into errstr; -1. */
static int failed(redisContext *c, redisReply *r, const char *what,
                  char *errstr, size_t errstr_size)
{
    snprintf(errstr, errstr_size, "redis: dedup layout %s: %s", what,
             !r                             ? c->errstr
             : r->type == REDIS_REPLY_ERROR ? r->str
                                            : "unexpected reply");
    freeReplyObject(r);
    return -1;
}

int idem_layout_read(redisContext *c, const idem_conf_t *conf,
                     idem_layout_t *out, char *errstr, size_t errstr_size)
{
    char key[512], sha[41] = "";
    idem_layout_key(conf, key, sizeof(key));
    const char *argv[] = {"1", key};
    redisReply *r = idem_redisconn_script(c, read_lua, sha, 2, argv);
    if (!r || parse_state(r, out))
        return failed(c, r, "read", errstr, errstr_size);
    freeReplyObject(r);
    return 0;
}

int idem_layout_switch(redisContext *c, const idem_conf_t *conf, char *sha,
                       idem_layout_kind_t expect, idem_layout_kind_t to,
                       idem_layout_t *out, char *errstr, size_t errstr_size)
{
    char key[512], pos[512];
    idem_layout_key(conf, key, sizeof(key));
    snprintf(pos, sizeof(pos), "%spos:%s", conf->redis_prefix,
             conf->group_id ? conf->group_id : "");
    const char *argv[] = {"2", key, pos, idem_layout_kind2str(expect),
                          idem_layout_kind2str(to)};
    redisReply *r = idem_redisconn_script(c, switch_lua, sha, 5, argv);
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 5 ||
        r->element[0]->type != REDIS_REPLY_INTEGER)
        return failed(c, r, "switch", errstr, errstr_size);
    int did = r->element[0]->integer == 1;
    redisReply tail = *r;
    tail.element = r->element + 1;
    tail.elements = 4;
    int bad = parse_state(&tail, out);
    if (bad)
        return failed(c, r, "switch", errstr, errstr_size);
    freeReplyObject(r);
    return did;
}

int idem_layout_store_read(idem_store_t *s, const idem_conf_t *conf,
                           idem_layout_t *out, char *errstr, size_t errstr_size)
{
    redisContext *c = idem_store_ctx(s, 0, errstr, errstr_size);
    if (!c)
        return -1;
    char e[512];
    if (idem_layout_read(c, conf, out, e, sizeof(e)))
        return idem_store_ctx_fail(s, "dedup layout read", c->err ? NULL : e,
                                   errstr, errstr_size);
    return 0;
}

int idem_layout_store_switch(idem_store_t *s, const idem_conf_t *conf,
                             char *sha, idem_layout_kind_t expect,
                             idem_layout_kind_t to, idem_layout_t *out,
                             char *errstr, size_t errstr_size)
{
    redisContext *c = idem_store_ctx(s, 1, errstr, errstr_size);
    if (!c)
        return -1;
    char e[512];
    int rc = idem_layout_switch(c, conf, sha, expect, to, out, e, sizeof(e));
    if (rc < 0)
        return idem_store_ctx_fail(s, "dedup layout switch", c->err ? NULL : e,
                                   errstr, errstr_size);
    return rc;
}
