/* conf: the configuration engine: parses the sources (file, environment,
 * --set), validates type, range and enum, runs the modules' own checks and
 * prints help, check-config and the README table from the keys the
 * modules declare (conf.h). It knows no module and no key by name. */
#include "conf/conf.h"
#include "base/util.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* scope is the first field, so offset 0 can mean "no field". */
_Static_assert(offsetof(idem_conf_t, scope) == 0,
               "idem_conf_t.scope must come first");

static void err_set(char *errstr, size_t errstr_size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void err_set(char *errstr, size_t errstr_size, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errstr, errstr_size, fmt, ap);
    va_end(ap);
}

/* Iterates every declared key: *mi and *ki are the cursor (start both at
 * 0). Returns the next key and its module in *mod, or NULL at the end. */
static const idem_conf_key_t *key_next(size_t *mi, size_t *ki,
                                       const idem_conf_module_t **mod)
{
    const idem_conf_module_t *m;
    while ((m = idem_conf_module_at(*mi))) {
        if (m->keys && m->keys[*ki].name) {
            *mod = m;
            return &m->keys[(*ki)++];
        }
        (*mi)++;
        *ki = 0;
    }
    return NULL;
}

#define KEYS_EACH(k, m)                                                        \
    for (size_t k##_mi = 0, k##_ki = 0;                                        \
         ((k) = key_next(&k##_mi, &k##_ki, &(m)));)

static const idem_conf_key_t *key_find(const char *name,
                                       const idem_conf_module_t **mod)
{
    const idem_conf_key_t *k;
    const idem_conf_module_t *m;
    KEYS_EACH(k, m)
    if (!strcmp(k->name, name)) {
        if (mod)
            *mod = m;
        return k;
    }
    return NULL;
}

/* The module whose key_prefix `name` is under (with something after it). */
static const idem_conf_module_t *prefix_find(const char *name)
{
    const idem_conf_module_t *m;
    for (size_t i = 0; (m = idem_conf_module_at(i)); i++) {
        size_t pl = m->key_prefix ? strlen(m->key_prefix) : 0;
        if (pl && !strncmp(name, m->key_prefix, pl) && name[pl])
            return m;
    }
    return NULL;
}

static int key_is_dev(const idem_conf_key_t *k)
{
    return !strncmp(k->name, "dev.", 4);
}

/* Whether key k (flags) is read by a command of `scope`. */
static int flags_in_scope(unsigned flags, idem_conf_scope_t scope)
{
    if (flags & IDEM_KEY_OUTBOX_ONLY)
        return scope == IDEM_CONF_SCOPE_OUTBOX;
    if (flags & IDEM_KEY_OUTBOX)
        return 1;
    return scope == IDEM_CONF_SCOPE_PROCESSOR;
}

static int module_active(const idem_conf_module_t *m, const idem_conf_t *conf)
{
    return !m->active || m->active(m, conf);
}

/* A duration key (IDEM_KEY_INT named *.ms or *.seconds): its bare unit in
 * ms, else 0. */
static int64_t key_duration_unit(const idem_conf_key_t *k)
{
    size_t n = strlen(k->name);
    if (k->type != IDEM_KEY_INT)
        return 0;
    if (n > 3 && !strcmp(k->name + n - 3, ".ms"))
        return 1;
    if (n > 8 && !strcmp(k->name + n - 8, ".seconds"))
        return 1000;
    return 0;
}

/* The text a text-kept key holds in conf, or NULL when it was not set. */
static const char *hkey_get(const idem_conf_t *conf, const char *name)
{
    for (size_t i = conf->hkeys_cnt; i-- > 0;)
        if (!strcmp(conf->hkeys[i].name, name))
            return conf->hkeys[i].value;
    return NULL;
}

static void kv_store(struct idem_conf_kv **kv, size_t *cnt, const char *name,
                     const char *value)
{
    for (size_t i = 0; i < *cnt; i++)
        if (!strcmp((*kv)[i].name, name)) {
            free((*kv)[i].value);
            (*kv)[i].value = idem_xstrdup(value);
            return;
        }
    *kv = idem_xrealloc(*kv, (*cnt + 1) * sizeof(**kv));
    (*kv)[*cnt].name = idem_xstrdup(name);
    (*kv)[*cnt].value = idem_xstrdup(value);
    (*cnt)++;
}

int idem_conf_kafka_duration(const char *prop, const char *value, char *buf,
                             size_t bufsz, const char **out, char *errstr,
                             size_t errstr_size)
{
    size_t n = strlen(prop);
    const char *u = value;
    while (isdigit((unsigned char)*u))
        u++;
    *out = value;
    if (n < 3 || strcmp(prop + n - 3, ".ms") || u == value || !*u)
        return 0;
    int64_t ms = 0;
    int r = idem_duration_parse(value, 1, &ms);
    if (r == IDEM_DURATION_SYNTAX) { /* "1.5s": librdkafka would take 1 */
        err_set(errstr, errstr_size,
                "kafka.%s: \"%s\" is not a duration (milliseconds, or with "
                "a unit: 500ms, 30s, 5m, 2h, 7d)",
                prop, value);
        return -1;
    }
    if (r || ms > INT32_MAX) {
        err_set(errstr, errstr_size,
                "kafka.%s: \"%s\" is out of range (at most %" PRId32
                " ms, about 24d)",
                prop, value, INT32_MAX);
        return -1;
    }
    snprintf(buf, bufsz, "%" PRId64, ms);
    *out = buf;
    return 0;
}

void idem_conf_kafka_store(idem_conf_t *conf, const char *prop,
                           const char *value)
{
    kv_store(&conf->kafka, &conf->kafka_cnt, prop, value);
}

void *idem_conf_alloc(idem_conf_t *conf, size_t size)
{
    void *p = idem_xcalloc(1, size);
    conf->owned =
        idem_xrealloc(conf->owned, (conf->owned_cnt + 1) * sizeof(void *));
    conf->owned[conf->owned_cnt++] = p;
    return p;
}

const char *idem_conf_str(const idem_conf_t *conf, const char *key)
{
    const char *v = hkey_get(conf, key);
    if (v)
        return v;
    const idem_conf_key_t *decl = key_find(key, NULL);
    if (!decl && !prefix_find(key)) {
        fprintf(stderr, "idemproc: internal: no module declares key %s\n", key);
        return NULL;
    }
    return decl ? decl->def : NULL;
}

int64_t idem_conf_int(const idem_conf_t *conf, const char *key)
{
    const char *v = idem_conf_str(conf, key);
    if (!v)
        return 0;
    const idem_conf_key_t *decl = key_find(key, NULL);
    if (decl && decl->type == IDEM_KEY_ENUM) {
        for (int i = 0; i < 6 && decl->enums[i]; i++)
            if (!strcmp(decl->enums[i], v))
                return i;
        return 0;
    }
    int64_t n = 0;
    int64_t unit = decl ? key_duration_unit(decl) : 0;
    if (unit && !idem_duration_parse(v, unit, &n))
        return n;
    return strtoll(v, NULL, 10);
}

int idem_conf_kafka_prop_is_secret(const char *name)
{
    static const char *const patterns[] = {
        "password", "secret",  "sasl.jaas", "key.pem", "oauthbearer.config",
        "keystore", "ssl.key", "ssl_key",   "token",   "credential",
    };
    char low[256];
    size_t i;
    for (i = 0; name[i] && i < sizeof(low) - 1; i++)
        low[i] = (char)tolower((unsigned char)name[i]);
    low[i] = '\0';
    for (size_t j = 0; j < sizeof(patterns) / sizeof(patterns[0]); j++)
        if (strstr(low, patterns[j]))
            return 1;
    return 0;
}

/* Reads a whole small file (a mounted secret) into a new string, trailing
 * newlines removed. Returns NULL with errstr on failure. */
static char *read_secret_file(const char *key, const char *path, char *errstr,
                              size_t errstr_size)
{
    FILE *fp = fopen(path, "r");
    if (!fp) {
        err_set(errstr, errstr_size, "%s: cannot read \"%s\": %s", key, path,
                strerror(errno));
        return NULL;
    }
    char *buf = idem_xmalloc(65537);
    size_t n = fread(buf, 1, 65536, fp);
    /* A directory opens, then fails the read (EISDIR): say so, not "too
     * large". */
    int read_errno = ferror(fp) ? errno : 0;
    int toolong = !read_errno && !feof(fp);
    fclose(fp);
    if (read_errno) {
        free(buf);
        err_set(errstr, errstr_size, "%s: cannot read \"%s\": %s", key, path,
                strerror(read_errno));
        return NULL;
    }
    if (toolong) {
        free(buf);
        err_set(errstr, errstr_size, "%s: \"%s\" is larger than 64 KiB", key,
                path);
        return NULL;
    }
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
        n--;
    if (memchr(buf, '\0', n)) {
        /* The secret would be cut at it without a word. */
        memset(buf, 0, n);
        free(buf);
        err_set(errstr, errstr_size,
                "%s: \"%s\" holds a NUL byte (a secret must be text)", key,
                path);
        return NULL;
    }
    buf[n] = '\0';
    return buf;
}

static const char *closest_key(const char *name)
{
    const char *best = NULL;
    size_t best_d = (size_t)-1;
    const idem_conf_key_t *k;
    const idem_conf_module_t *m;
    KEYS_EACH(k, m)
    {
        size_t d = idem_edit_distance(name, k->name);
        if (d < best_d) {
            best_d = d;
            best = k->name;
        }
    }
    /* Only suggest what is plausibly a typo. */
    return best_d <= 1 + strlen(name) / 4 ? best : NULL;
}

/* Validates `value` against the key's type, range and enum, then its own
 * check: the number in *num (IDEM_KEY_INT, durations in the key's unit)
 * or the index in *idx (IDEM_KEY_ENUM). */
static int key_check(const idem_conf_key_t *k, const char *value, int64_t *num,
                     int *idx, char *errstr, size_t errstr_size)
{
    switch (k->type) {
    case IDEM_KEY_STR:
        break;
    case IDEM_KEY_INT: {
        int64_t unit = key_duration_unit(k);
        long long v;
        if (unit) {
            int64_t d = 0;
            int r = idem_duration_parse(value, unit, &d);
            if (r == IDEM_DURATION_FRACTION) {
                err_set(errstr, errstr_size,
                        "%s: \"%s\" is not a whole number of %s", k->name,
                        value, unit == 1 ? "milliseconds" : "seconds");
                return -1;
            }
            if (r == IDEM_DURATION_RANGE) {
                err_set(errstr, errstr_size,
                        "%s: \"%s\" is out of range (%" PRId64 "..%" PRId64 ")",
                        k->name, value, k->min, k->max);
                return -1;
            }
            if (r) {
                err_set(errstr, errstr_size,
                        "%s: \"%s\" is not a duration (%s, or with a unit: "
                        "500ms, 30s, 5m, 2h, 7d)",
                        k->name, value, unit == 1 ? "milliseconds" : "seconds");
                return -1;
            }
            v = d;
        } else {
            char *end;
            errno = 0;
            v = strtoll(value, &end, 10);
            if (!*value || *end || errno) {
                err_set(errstr, errstr_size, "%s: \"%s\" is not an integer",
                        k->name, value);
                return -1;
            }
        }
        if (v < k->min || v > k->max) {
            err_set(errstr, errstr_size,
                    "%s: %lld is out of range (%" PRId64 "..%" PRId64 ")",
                    k->name, v, k->min, k->max);
            return -1;
        }
        *num = v;
        break;
    }
    case IDEM_KEY_ENUM: {
        char allowed[128] = "";
        int found = -1;
        for (int i = 0; i < 6 && k->enums[i]; i++) {
            if (!strcmp(k->enums[i], value))
                found = i;
            if (i)
                strncat(allowed, ", ", sizeof(allowed) - strlen(allowed) - 1);
            strncat(allowed, k->enums[i],
                    sizeof(allowed) - strlen(allowed) - 1);
        }
        if (found < 0) {
            err_set(errstr, errstr_size, "%s: \"%s\" is not one of: %s",
                    k->name, value, allowed);
            return -1;
        }
        *idx = found;
        break;
    }
    }
    return k->check ? k->check(k, value, errstr, errstr_size) : 0;
}

/* The generic setter: validates `value` (key_check), then stores it in
 * its field, or as text (a number as its digits in the key's unit). */
static int key_set(idem_conf_t *conf, const idem_conf_key_t *k,
                   const char *value, char *errstr, size_t errstr_size)
{
    int64_t num = 0;
    int idx = 0;
    if (!value)
        value = "";
    if (key_check(k, value, &num, &idx, errstr, errstr_size))
        return -1;
    if (!k->offset) {
        char digits[32];
        if (k->type == IDEM_KEY_INT) {
            snprintf(digits, sizeof(digits), "%" PRId64, num);
            value = digits;
        }
        kv_store(&conf->hkeys, &conf->hkeys_cnt, k->name, value);
        return 0;
    }
    char *field = (char *)conf + k->offset;
    switch (k->type) {
    case IDEM_KEY_STR: {
        char **str = (char **)field;
        free(*str);
        *str = idem_xstrdup(value);
        break;
    }
    case IDEM_KEY_INT:
        *(int64_t *)field = num;
        break;
    case IDEM_KEY_ENUM:
        *(int *)field = idx;
        break;
    }
    return 0;
}

int idem_conf_set(idem_conf_t *conf, const char *key, const char *value,
                  char *errstr, size_t errstr_size)
{
    /* An exact key first: some keys end in ".file" themselves
     * (redis.tls.ca.file, script.file); "<key>.file" means "read <key>
     * from a file". */
    const idem_conf_key_t *k = key_find(key, NULL);
    if (k)
        return key_set(conf, k, value, errstr, errstr_size);
    size_t klen = strlen(key);
    if (klen > 5 && !strcmp(key + klen - 5, ".file")) {
        char base[256];
        if (klen - 5 >= sizeof(base)) {
            err_set(errstr, errstr_size, "%s: key too long", key);
            return -1;
        }
        memcpy(base, key, klen - 5);
        base[klen - 5] = '\0';
        char *content = read_secret_file(key, value, errstr, errstr_size);
        if (!content)
            return -1;
        int r = idem_conf_set(conf, base, content, errstr, errstr_size);
        memset(content, 0, strlen(content));
        free(content);
        return r;
    }
    const idem_conf_module_t *m = prefix_find(key);
    if (m) {
        if (m->prefix_set)
            return m->prefix_set(conf, key, value ? value : "", errstr,
                                 errstr_size);
        kv_store(&conf->hkeys, &conf->hkeys_cnt, key, value ? value : "");
        return 0;
    }
    const char *hint = closest_key(key);
    if (hint)
        err_set(errstr, errstr_size,
                "%s: unknown configuration key (did you mean \"%s\"?)", key,
                hint);
    else
        err_set(errstr, errstr_size,
                "%s: unknown configuration key (see 'idemproc help config')",
                key);
    return -1;
}

idem_conf_t *idem_conf_new(void)
{
    idem_conf_t *conf = idem_xcalloc(1, sizeof(*conf));
    char errstr[256];
    const idem_conf_key_t *k;
    const idem_conf_module_t *m;
    KEYS_EACH(k, m)
    if (k->offset && k->def && key_set(conf, k, k->def, errstr, sizeof(errstr)))
        abort(); /* a bad default is a bug in the module's table */
    return conf;
}

void idem_conf_destroy(idem_conf_t *conf)
{
    if (!conf)
        return;
    const idem_conf_key_t *k;
    const idem_conf_module_t *m;
    KEYS_EACH(k, m)
    if (k->offset && k->type == IDEM_KEY_STR)
        free(*(char **)((char *)conf + k->offset));
    struct idem_conf_kv *lists[] = {conf->kafka, conf->hkeys};
    size_t cnts[] = {conf->kafka_cnt, conf->hkeys_cnt};
    for (size_t l = 0; l < 2; l++) {
        for (size_t i = 0; i < cnts[l]; i++) {
            free(lists[l][i].name);
            free(lists[l][i].value);
        }
        free(lists[l]);
    }
    for (size_t i = 0; i < conf->owned_cnt; i++)
        free(conf->owned[i]);
    free(conf->owned);
    free(conf);
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = '\0';
    return s;
}

int idem_conf_load_file(idem_conf_t *conf, const char *path, char *errstr,
                        size_t errstr_size)
{
    FILE *fp = fopen(path, "r");
    if (!fp) {
        err_set(errstr, errstr_size, "%s: cannot open: %s", path,
                strerror(errno));
        return -1;
    }
    char *line = NULL;
    size_t line_cap = 0;
    ssize_t len;
    int lineno = 0;
    int r = 0;
    while ((len = getline(&line, &line_cap, fp)) >= 0) {
        lineno++;
        /* A UTF-8 byte order mark (editors on Windows write one) is not
         * part of the first key. */
        if (lineno == 1 && len >= 3 && !memcmp(line, "\xef\xbb\xbf", 3)) {
            memmove(line, line + 3, (size_t)len - 2);
            len -= 3;
        }
        /* A NUL byte would end the value early, silently: a key, a URL or
         * a password cut short is worse than a refusal. */
        if (memchr(line, '\0', (size_t)len)) {
            err_set(errstr, errstr_size,
                    "%s:%d: a NUL byte in the line (a binary file, or a "
                    "value that cannot be a C string)",
                    path, lineno);
            r = -1;
            break;
        }
        char *s = trim(line);
        if (!*s || *s == '#' || *s == '!')
            continue;
        char *eq = strchr(s, '=');
        if (!eq) {
            err_set(errstr, errstr_size,
                    "%s:%d: expected key=value, got \"%s\"", path, lineno, s);
            r = -1;
            break;
        }
        *eq = '\0';
        char *key = trim(s), *value = trim(eq + 1);
        char sub[512];
        if (idem_conf_set(conf, key, value, sub, sizeof(sub))) {
            err_set(errstr, errstr_size, "%s:%d: %s", path, lineno, sub);
            r = -1;
            break;
        }
    }
    /* getline's -1 is the end or an error: a directory opens, then fails
     * the first read (EISDIR), and was read as an empty file. */
    if (r == 0 && ferror(fp)) {
        err_set(errstr, errstr_size, "%s: cannot read: %s", path,
                strerror(errno));
        r = -1;
    }
    free(line);
    fclose(fp);
    return r;
}

/* IDEMPROC_<KEY>: the key upper-cased with '.' and '-' as '_'. */
static void env_name(const char *key, char *out, size_t out_size)
{
    size_t n = (size_t)snprintf(out, out_size, "IDEMPROC_");
    for (; *key && n + 1 < out_size; key++)
        out[n++] = (*key == '.' || *key == '-')
                       ? '_'
                       : (char)toupper((unsigned char)*key);
    out[n] = '\0';
}

/* Maps an environment variable name to a key: a declared key (with or
 * without a _FILE suffix), or any key under a module's prefix
 * (IDEMPROC_KAFKA_<PROP> -> kafka.<prop>, IDEMPROC_PLUGIN_<NAME> ->
 * plugin.<name>; '_' as '.', lower case). */
static int env_key(const char *var, char *key, size_t key_size)
{
    char name[256];
    const idem_conf_key_t *k;
    const idem_conf_module_t *m;
    KEYS_EACH(k, m)
    {
        env_name(k->name, name, sizeof(name));
        size_t nl = strlen(name);
        if (!strcmp(var, name)) {
            snprintf(key, key_size, "%s", k->name);
            return 0;
        }
        if (!strncmp(var, name, nl) && !strcmp(var + nl, "_FILE")) {
            snprintf(key, key_size, "%s.file", k->name);
            return 0;
        }
    }
    for (size_t i = 0; (m = idem_conf_module_at(i)); i++) {
        if (!m->key_prefix)
            continue;
        env_name(m->key_prefix, name, sizeof(name)); /* "IDEMPROC_KAFKA_" */
        size_t nl = strlen(name);
        if (!strncmp(var, name, nl) && var[nl]) {
            size_t n = (size_t)snprintf(key, key_size, "%s", m->key_prefix);
            for (const char *c = var + nl; *c && n + 1 < key_size; c++)
                key[n++] = *c == '_' ? '.' : (char)tolower((unsigned char)*c);
            key[n] = '\0';
            return 0;
        }
    }
    return -1;
}

/* The environment name of the key closest to `var` (a typo such as
 * IDEMPROC_GROUPID), or NULL when none is plausibly meant. Returns a
 * static buffer. */
static const char *closest_env(const char *var)
{
    static char best[256];
    char name[256];
    size_t best_d = (size_t)-1;
    const idem_conf_key_t *k;
    const idem_conf_module_t *m;
    KEYS_EACH(k, m)
    {
        env_name(k->name, name, sizeof(name));
        size_t d = idem_edit_distance(var, name);
        if (d < best_d) {
            best_d = d;
            snprintf(best, sizeof(best), "%s", name);
        }
    }
    size_t rest = strlen(var) > 9 ? strlen(var) - 9 : 0;
    return best_d <= 1 + rest / 4 ? best : NULL;
}

int idem_conf_load_env(idem_conf_t *conf, char **envp, char *errstr,
                       size_t errstr_size)
{
    for (char **e = envp; e && *e; e++) {
        if (strncmp(*e, "IDEMPROC_", 9))
            continue;
        const char *eq = strchr(*e, '=');
        if (!eq)
            continue;
        char var[256], key[256], sub[512];
        size_t vl = (size_t)(eq - *e);
        if (vl >= sizeof(var))
            continue;
        memcpy(var, *e, vl);
        var[vl] = '\0';
        if (!strcmp(var, "IDEMPROC_BIN") || !strcmp(var, "IDEMPROC_SRC"))
            continue; /* test harness variables, not configuration */
        if (env_key(var, key, sizeof(key))) {
            const char *hint = closest_env(var);
            if (hint)
                err_set(errstr, errstr_size,
                        "%s: environment variable names no configuration key "
                        "(did you mean %s?)",
                        var, hint);
            else
                err_set(errstr, errstr_size,
                        "%s: environment variable names no configuration key "
                        "(IDEMPROC_<KEY>: the key upper-cased, '.' and '-' "
                        "as '_')",
                        var);
            return -1;
        }
        if (idem_conf_set(conf, key, eq + 1, sub, sizeof(sub))) {
            err_set(errstr, errstr_size, "%s (from %s)", sub, var);
            return -1;
        }
    }
    return 0;
}

int idem_conf_apply_kafka(const idem_conf_t *conf, rd_kafka_conf_t *kconf,
                          char *errstr, size_t errstr_size)
{
    char kerr[512];
    if (conf->bootstrap_servers &&
        rd_kafka_conf_set(kconf, "bootstrap.servers", conf->bootstrap_servers,
                          kerr, sizeof(kerr)) != RD_KAFKA_CONF_OK) {
        err_set(errstr, errstr_size, "kafka.bootstrap.servers: %s", kerr);
        return -1;
    }
    for (size_t i = 0; i < conf->kafka_cnt; i++) {
        if (rd_kafka_conf_set(kconf, conf->kafka[i].name, conf->kafka[i].value,
                              kerr, sizeof(kerr)) != RD_KAFKA_CONF_OK) {
            err_set(errstr, errstr_size, "kafka.%s: %s", conf->kafka[i].name,
                    kerr);
            return -1;
        }
    }
    return 0;
}

/* idem_conf_finalize_scope, returning the class of the error. */
static idem_conf_errclass_t finalize_class(idem_conf_t *conf,
                                           idem_conf_scope_t scope,
                                           char *errstr, size_t errstr_size)
{
    conf->scope = scope;
    const idem_conf_key_t *k;
    const idem_conf_module_t *m;
    /* Required keys first, then each module's checks in module order. */
    KEYS_EACH(k, m)
    {
        if (!k->required || !flags_in_scope(k->flags, scope) ||
            !module_active(m, conf))
            continue;
        const char *v = k->offset && k->type == IDEM_KEY_STR
                            ? *(char **)((char *)conf + k->offset)
                            : idem_conf_str(conf, k->name);
        if (!v || !*v) {
            if (m->active)
                err_set(errstr, errstr_size, "%s: required when %s", k->name,
                        m->name);
            else
                err_set(errstr, errstr_size, "%s: required but not set",
                        k->name);
            return IDEM_CONF_ERR_REQUIRED;
        }
    }
    for (size_t i = 0; (m = idem_conf_module_at(i)); i++)
        if (m->check && flags_in_scope(m->flags, scope) &&
            module_active(m, conf) && m->check(m, conf, errstr, errstr_size))
            return IDEM_CONF_ERR_INVALID;
    return IDEM_CONF_OK;
}

int idem_conf_finalize_scope(idem_conf_t *conf, idem_conf_scope_t scope,
                             char *errstr, size_t errstr_size)
{
    return finalize_class(conf, scope, errstr, errstr_size) ? -1 : 0;
}

int idem_conf_finalize(idem_conf_t *conf, char *errstr, size_t errstr_size)
{
    return idem_conf_finalize_scope(conf, IDEM_CONF_SCOPE_PROCESSOR, errstr,
                                    errstr_size);
}

idem_conf_t *idem_conf_load(const char *path, char **envp, char **sets,
                            size_t set_cnt, char *errstr, size_t errstr_size)
{
    return idem_conf_load_scope(path, envp, sets, set_cnt,
                                IDEM_CONF_SCOPE_PROCESSOR, errstr, errstr_size);
}

idem_conf_t *idem_conf_load_scope(const char *path, char **envp, char **sets,
                                  size_t set_cnt, idem_conf_scope_t scope,
                                  char *errstr, size_t errstr_size)
{
    idem_conf_err_t err;
    idem_conf_t *conf =
        idem_conf_load_err(path, envp, sets, set_cnt, scope, &err);
    if (!conf)
        snprintf(errstr, errstr_size, "%s", err.str);
    return conf;
}

idem_conf_t *idem_conf_load_err(const char *path, char **envp, char **sets,
                                size_t set_cnt, idem_conf_scope_t scope,
                                idem_conf_err_t *err)
{
    idem_conf_t *conf = idem_conf_new();
    conf->scope = scope;
    err->cls = IDEM_CONF_ERR_INVALID;
    err->str[0] = '\0';
    char *errstr = err->str;
    size_t errstr_size = sizeof(err->str);
    if (path && idem_conf_load_file(conf, path, errstr, errstr_size))
        goto fail;
    if (idem_conf_load_env(conf, envp, errstr, errstr_size))
        goto fail;
    for (size_t i = 0; i < set_cnt; i++) {
        char *eq = strchr(sets[i], '=');
        if (!eq) {
            err_set(errstr, errstr_size,
                    "--set: expected key=value, got \"%s\"", sets[i]);
            goto fail;
        }
        char key[256];
        size_t kl = (size_t)(eq - sets[i]);
        if (kl >= sizeof(key))
            kl = sizeof(key) - 1;
        memcpy(key, sets[i], kl);
        key[kl] = '\0';
        if (idem_conf_set(conf, key, eq + 1, errstr, errstr_size))
            goto fail;
    }
    err->cls = finalize_class(conf, scope, errstr, errstr_size);
    if (err->cls)
        goto fail;
    return conf;
fail:
    idem_conf_destroy(conf);
    return NULL;
}

/* The value of key k as text into `buf`, secrets masked (and what the
 * module's show hides); *is_default says whether it is the default. */
static const char *key_value(const idem_conf_t *conf,
                             const idem_conf_module_t *m,
                             const idem_conf_key_t *k, char *buf, size_t size,
                             int *is_default)
{
    const char *v;
    if (!k->offset) {
        v = hkey_get(conf, k->name);
        *is_default = !v || (k->def && !strcmp(v, k->def));
        if (!v)
            v = k->def;
    } else {
        const char *field = (const char *)conf + k->offset;
        switch (k->type) {
        case IDEM_KEY_STR:
            v = *(char *const *)field;
            break;
        case IDEM_KEY_INT:
            snprintf(buf, size, "%" PRId64, *(const int64_t *)field);
            v = buf;
            break;
        default:
            v = k->enums[*(const int *)field];
            break;
        }
        int64_t def_num = 0;
        int def_idx = 0;
        char scratch[64];
        if (k->type == IDEM_KEY_STR)
            *is_default = (!v && !k->def) ||
                          (v && k->def && !strcmp(v, k->def)) ||
                          (v && !*v && !k->def);
        else if (k->def && !key_check(k, k->def, &def_num, &def_idx, scratch,
                                      sizeof(scratch)))
            *is_default = k->type == IDEM_KEY_INT
                              ? def_num == *(const int64_t *)field
                              : def_idx == *(const int *)field;
        else
            *is_default = 0;
    }
    if (!v)
        return "";
    if (k->secret)
        return *v ? "[redacted]" : "";
    if (m && m->show)
        return m->show(k, v, buf, size);
    return v;
}

/* check-config's listing: the keys the command of conf->scope reads, the
 * ones that differ from their defaults first. */
void idem_conf_dump(const idem_conf_t *conf, FILE *out)
{
    char buf[1024];
    for (int pass = 0; pass < 2; pass++) {
        fprintf(out, pass ? "# defaults\n" : "# set (not the default)\n");
        const idem_conf_key_t *k;
        const idem_conf_module_t *m;
        KEYS_EACH(k, m)
        {
            int dflt = 1;
            const char *v = key_value(conf, m, k, buf, sizeof(buf), &dflt);
            int in_scope =
                flags_in_scope(k->flags, conf->scope) && module_active(m, conf);
            /* A key of another handler or scope shows only when set; a
             * development key too. */
            if (dflt != pass || (!in_scope && dflt) || (key_is_dev(k) && dflt))
                continue;
            fprintf(out, "%s=%s\n", k->name, v);
        }
        if (pass)
            continue;
        for (size_t i = 0; i < conf->kafka_cnt; i++)
            fprintf(out, "kafka.%s=%s\n", conf->kafka[i].name,
                    idem_conf_kafka_prop_is_secret(conf->kafka[i].name)
                        ? "[redacted]"
                        : conf->kafka[i].value);
        /* Keys under a prefix that no module declares (plugin.<name>): they
         * may be secrets. */
        for (size_t i = 0; i < conf->hkeys_cnt; i++)
            if (!key_find(conf->hkeys[i].name, NULL))
                fprintf(out, "%s=[redacted]\n", conf->hkeys[i].name);
    }
}

static void key_type_text(const idem_conf_key_t *k, char *buf, size_t size)
{
    switch (k->type) {
    case IDEM_KEY_STR:
        snprintf(buf, size, "string");
        break;
    case IDEM_KEY_INT: {
        int64_t unit = key_duration_unit(k);
        snprintf(buf, size, "%s %" PRId64 "..%" PRId64,
                 !unit       ? "integer"
                 : unit == 1 ? "duration (ms)"
                             : "duration (s)",
                 k->min, k->max);
        break;
    }
    case IDEM_KEY_ENUM: {
        size_t n = 0;
        buf[0] = '\0';
        for (int i = 0; i < 6 && k->enums[i] && n < size; i++)
            n += (size_t)snprintf(buf + n, size - n, "%s%s",
                                  i ? ", " : "one of: ", k->enums[i]);
        break;
    }
    }
}

static const char *scope_text(unsigned flags)
{
    if (flags & IDEM_KEY_OUTBOX_ONLY)
        return ", outbox only";
    if (flags & IDEM_KEY_OUTBOX)
        return ", run and outbox";
    return "";
}

void idem_conf_print_help_dev(FILE *out, int dev)
{
    char type[128];
    fprintf(out, "Configuration keys (file key=value < IDEMPROC_<KEY> "
                 "environment < --set key=value);\n"
                 "a key ending in .ms or .seconds also takes a unit: 500ms, "
                 "30s, 5m, 2h, 7d.\n");
    const idem_conf_module_t *m;
    for (size_t i = 0; (m = idem_conf_module_at(i)); i++) {
        int printed = 0;
        for (const idem_conf_key_t *k = m->keys; k && k->name; k++) {
            if (key_is_dev(k) != dev)
                continue;
            if (!printed++)
                fprintf(out, "\n%s%s%s\n", m->name, m->doc ? ": " : "",
                        m->doc ? m->doc : "");
            key_type_text(k, type, sizeof(type));
            fprintf(out, "  %-26s %s%s%s%s\n", k->name, type,
                    k->required ? ", required" : "",
                    k->secret ? ", secret" : "", scope_text(k->flags));
            fprintf(out, "  %-26s default: %s\n", "",
                    k->def ? k->def : "(none)");
            fprintf(out, "  %-26s %s\n", "", k->doc);
        }
        if (!dev && m->key_prefix) {
            if (!printed++)
                fprintf(out, "\n%s%s%s\n", m->name, m->doc ? ": " : "",
                        m->doc ? m->doc : "");
            fprintf(out, "  %s<name>%*s %s\n", m->key_prefix,
                    (int)(20 - strlen(m->key_prefix)), "",
                    m->prefix_doc ? m->prefix_doc : "passed to it as text");
        }
    }
    if (!dev)
        fprintf(out, "\n  <key>.file                 read <key>'s value from "
                     "a file (e.g. a mounted Secret)\n");
}

void idem_conf_print_help(FILE *out)
{
    idem_conf_print_help_dev(out, 0);
}

void idem_conf_print_markdown(FILE *out)
{
    char type[128];
    fprintf(out, "| key | type | default | description |\n");
    fprintf(out, "| --- | --- | --- | --- |\n");
    const idem_conf_key_t *k;
    const idem_conf_module_t *m;
    KEYS_EACH(k, m)
    {
        if (key_is_dev(k))
            continue;
        key_type_text(k, type, sizeof(type));
        char when[96] = "";
        if (m->active)
            snprintf(when, sizeof(when), "with `%s`: ", m->name);
        fprintf(out, "| `%s` | %s%s%s%s | %s%s%s | %s%s |\n", k->name, type,
                k->required ? ", required" : "", k->secret ? ", secret" : "",
                scope_text(k->flags), k->def ? "`" : "", k->def ? k->def : "",
                k->def ? "`" : "", when, k->doc);
    }
    for (size_t i = 0; (m = idem_conf_module_at(i)); i++)
        if (m->key_prefix)
            fprintf(out, "| `%s<name>` | string | | %s%s%s%s |\n",
                    m->key_prefix, m->active ? "with `" : "",
                    m->active ? m->name : "", m->active ? "`: " : "",
                    m->prefix_doc ? m->prefix_doc : "passed to it as text");
    fprintf(out, "| `<key>.file` | path | | read the key's value from a file "
                 "(mounted Secret) |\n");
}

const char *idem_conf_topic_written(const idem_conf_t *conf, size_t i,
                                    const char **key)
{
    const idem_conf_key_t *k;
    const idem_conf_module_t *m;
    KEYS_EACH(k, m)
    {
        if (!(k->flags & IDEM_KEY_WRITES_TOPIC) || k->type != IDEM_KEY_STR ||
            !flags_in_scope(k->flags, conf->scope) || !module_active(m, conf))
            continue;
        const char *v = k->offset
                            ? *(char *const *)((const char *)conf + k->offset)
                            : idem_conf_str(conf, k->name);
        if (!v || !*v || i--)
            continue;
        if (key)
            *key = k->name;
        return v;
    }
    return NULL;
}
