/* fingerprint: the effect-defining settings as text (fingerprint.h). */
#include "effect/fingerprint.h"
#include "base/util.h"
#include "effect/handler.h"
#include "redis/layout.h"
#include "redis/rediskeys.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t fnv1a(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ULL;
    }
    return h;
}

#define FNV_BASIS 14695981039346656037ULL

/* The digest of `path`'s contents, or of the path and "unreadable". */
static uint64_t file_digest(const char *path)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return fnv1a(fnv1a(FNV_BASIS, "unreadable:", 11), path, strlen(path));
    uint64_t h = FNV_BASIS;
    char buf[8192];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), fp)) > 0)
        h = fnv1a(h, buf, n);
    fclose(fp);
    return h;
}

typedef struct {
    char *s;
    size_t len, cap;
} text_t;

static void add_line(text_t *t, const char *key, uint64_t digest)
{
    char line[256];
    int n = snprintf(line, sizeof(line), "%s=#%016" PRIx64 "\n", key, digest);
    if (n < 0 || (size_t)n >= sizeof(line))
        return;
    if (t->len + (size_t)n + 1 > t->cap) {
        t->cap = (t->len + (size_t)n + 1) * 2;
        t->s = idem_xrealloc(t->s, t->cap);
    }
    memcpy(t->s + t->len, line, (size_t)n + 1);
    t->len += (size_t)n;
}

static void add_value(text_t *t, const char *key, const char *value)
{
    size_t kn = strlen(key);
    if (value && kn > 5 && !strcmp(key + kn - 5, ".file") && *value)
        add_line(t, key, file_digest(value));
    else if (value)
        add_line(t, key, fnv1a(FNV_BASIS, value, strlen(value)));
    else
        add_line(t, key, fnv1a(FNV_BASIS, "unset", 5));
}

/* A declared key's value as text into buf (fields by type, the rest as
 * kept text). */
static const char *key_text(const idem_conf_t *conf, const idem_conf_key_t *k,
                            char *buf, size_t size)
{
    if (!k->offset)
        return idem_conf_str(conf, k->name);
    const char *field = (const char *)conf + k->offset;
    switch (k->type) {
    case IDEM_KEY_STR:
        return *(char *const *)field;
    case IDEM_KEY_INT:
        snprintf(buf, size, "%" PRId64, *(const int64_t *)field);
        return buf;
    default:
        snprintf(buf, size, "%d", *(const int *)field);
        return buf;
    }
}

char *idem_effect_fingerprint(const idem_conf_t *conf)
{
    text_t t = {0};
    const char *h = conf->handler ? conf->handler : "";
    size_t hn = strlen("handler=") + strlen(h) + 2;
    t.cap = hn + 1024;
    t.s = idem_xcalloc(1, t.cap);
    t.len = (size_t)snprintf(t.s, t.cap, "handler=%s\n", h);
    char num[32];
    snprintf(num, sizeof(num), "%d", conf->envelope_format);
    add_value(&t, "envelope.format", num);
    add_value(&t, "envelope.identity", conf->envelope_identity);
    /* Where the marks live: members of one group under different scopes
     * do not see each other's marks (docs/guarantees.md). */
    snprintf(num, sizeof(num), "%d", conf->dedup_scope);
    add_value(&t, "dedup.scope", num);
    const char *arg;
    char errstr[256];
    const idem_handler_ops_t *ops =
        idem_handler_find(h, &arg, errstr, sizeof(errstr));
    if (ops && ops->keys)
        for (const idem_conf_key_t *k = ops->keys; k->name; k++)
            add_value(&t, k->name, key_text(conf, k, num, sizeof(num)));
    if (ops && ops->key_prefix)
        for (size_t i = 0; i < conf->hkeys_cnt; i++)
            if (!strncmp(conf->hkeys[i].name, ops->key_prefix,
                         strlen(ops->key_prefix)))
                add_value(&t, conf->hkeys[i].name, conf->hkeys[i].value);
    /* The dedup layouts this binary runs and the one it wants, in clear:
     * the switch to partition waits until every live member supports the
     * layout key and wants it (redis/layout.h). */
    char line[128];
    snprintf(line, sizeof(line), "%s=%s\n%s=%s\n", IDEM_LAYOUT_FP_SUPPORTS,
             IDEM_LAYOUT_FP_ALL, IDEM_LAYOUT_FP_WANTS,
             conf->dedup_scope == IDEM_DEDUP_SCOPE_PARTITION ? "partition"
                                                             : "global");
    size_t ln = strlen(line);
    if (t.len + ln + 1 > t.cap) {
        t.cap = t.len + ln + 1;
        t.s = idem_xrealloc(t.s, t.cap);
    }
    memcpy(t.s + t.len, line, ln + 1);
    t.len += ln;
    return t.s;
}
