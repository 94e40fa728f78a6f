/* redisconn: opening a connection to the Redis primary: redis.url parsing,
 * TLS (OpenSSL underneath the hiredis context), AUTH with an ACL user,
 * SELECT, Sentinel discovery and the ROLE check. */
#include "redis/redisconn.h"
#include "base/log.h"
#include "redis/tlspipe.h"
#include "base/util.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct idem_redisconn_s {
    redisContext *c;
    idem_tlspipe_t *tls; /* NULL for redis:// and unix:// */
    char addr[300];      /* host:port or socket path */
    /* Why the last step failed (idem_redisconn_err_t): set where the
     * failure is seen, so no caller reads it from the text. */
    idem_redisconn_errclass_t cls;
    char code[32]; /* IDEM_REDISCONN_ERR_REPLY: the reply's first word */
};

/* Parses "host[:port]" of length len into host/port (port stays as given
 * when absent). `key` names the setting in errors. */
static int hostport_parse(const char *s, size_t len, char *host,
                          size_t host_size, int *port, const char *key,
                          char *errstr, size_t errstr_size)
{
    char hp[300];
    if (len == 0 || len >= sizeof(hp)) {
        snprintf(errstr, errstr_size, "%s: no host", key);
        return -1;
    }
    memcpy(hp, s, len);
    hp[len] = '\0';
    char *h = hp;
    char *colon = strrchr(hp, ':');
    if (hp[0] == '[') { /* [IPv6]:port */
        char *close = strchr(hp, ']');
        if (!close || (close[1] && close[1] != ':')) {
            snprintf(errstr, errstr_size, "%s: bad IPv6 address", key);
            return -1;
        }
        *close = '\0';
        h = hp + 1;
        colon = close[1] ? close + 1 : NULL;
    }
    if (colon) {
        char *end;
        long p = strtol(colon + 1, &end, 10);
        if (!colon[1] || *end || p < 1 || p > 65535) {
            snprintf(errstr, errstr_size, "%s: bad port \"%.16s\" (1..65535)",
                     key, colon + 1);
            return -1;
        }
        *port = (int)p;
        *colon = '\0';
    }
    if (!h[0] || strlen(h) >= host_size) {
        snprintf(errstr, errstr_size, "%s: no host", key);
        return -1;
    }
    snprintf(host, host_size, "%s", h);
    return 0;
}

int idem_redisconn_url_parse(const char *url, idem_redisconn_url_t *out,
                             char *errstr, size_t errstr_size)
{
    memset(out, 0, sizeof(*out));
    const char *sep = strstr(url, "://");
    if (!sep) {
        snprintf(errstr, errstr_size,
                 "redis.url: not a URL (use redis://host:port/db, "
                 "rediss://host:port/db or unix:///path)");
        return -1;
    }
    size_t sl = (size_t)(sep - url);
    const char *p = sep + 3;
    if (sl == 4 && !strncmp(url, "unix", 4)) {
        const char *q = strchr(p, '?');
        size_t pl = q ? (size_t)(q - p) : strlen(p);
        if (pl == 0 || pl >= sizeof(out->path) || p[0] != '/') {
            snprintf(errstr, errstr_size,
                     "redis.url: unix:// needs an absolute socket path "
                     "(unix:///path)");
            return -1;
        }
        out->scheme = IDEM_REDIS_UNIX;
        memcpy(out->path, p, pl);
        if (q) {
            /* strtol only once "?db=" is there: q + 4 may be past the end. */
            char *end = NULL;
            long db = strncmp(q, "?db=", 4) ? -1 : strtol(q + 4, &end, 10);
            if (db < 0 || !q[4] || *end || db > 1000000) {
                snprintf(errstr, errstr_size,
                         "redis.url: unix:// takes only ?db=N after the path");
                return -1;
            }
            out->db = (int)db;
        }
        return 0;
    }
    if (sl == 5 && !strncmp(url, "redis", 5)) {
        out->scheme = IDEM_REDIS_TCP;
    } else if (sl == 6 && !strncmp(url, "rediss", 6)) {
        out->scheme = IDEM_REDIS_TLS;
    } else {
        snprintf(errstr, errstr_size,
                 "redis.url: unsupported scheme \"%.*s\" (use redis://, "
                 "rediss:// or unix://)",
                 sl > 16 ? 16 : (int)sl, url);
        return -1;
    }
    /* Userinfo ends at the last '@', so a password may contain '@'. */
    const char *at = strrchr(p, '@');
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        size_t ul = colon ? (size_t)(colon - p) : (size_t)(at - p);
        if (ul >= sizeof(out->username)) {
            snprintf(errstr, errstr_size, "redis.url: user name too long");
            return -1;
        }
        memcpy(out->username, p, ul);
        if (colon) {
            size_t pwl = (size_t)(at - colon - 1);
            if (pwl >= sizeof(out->password)) {
                snprintf(errstr, errstr_size, "redis.url: password too long");
                return -1;
            }
            memcpy(out->password, colon + 1, pwl);
        }
        p = at + 1;
    }
    const char *slash = strchr(p, '/');
    size_t hl = slash ? (size_t)(slash - p) : strlen(p);
    out->port = 6379;
    if (hostport_parse(p, hl, out->host, sizeof(out->host), &out->port,
                       "redis.url", errstr, errstr_size))
        return -1;
    if (slash && slash[1]) {
        char *end;
        long db = strtol(slash + 1, &end, 10);
        if (*end || db < 0 || db > 1000000) {
            snprintf(errstr, errstr_size,
                     "redis.url: bad database \"%.16s\" (a number)", slash + 1);
            return -1;
        }
        out->db = (int)db;
    }
    return 0;
}

const char *idem_redisconn_url_redact(const char *url, char *buf, size_t size)
{
    const char *sep = strstr(url, "://");
    const char *at = sep ? strrchr(sep + 3, '@') : NULL;
    if (!at || strncmp(url, "unix://", 7) == 0) {
        snprintf(buf, size, "%s", url);
        return buf;
    }
    const char *colon = memchr(sep + 3, ':', (size_t)(at - sep - 3));
    if (!colon) /* a user name only */
        snprintf(buf, size, "%s", url);
    else
        snprintf(buf, size, "%.*s:***%s", (int)(colon - url), url, at);
    return buf;
}

static int set(const char *s)
{
    return s && *s;
}

/* The next "host:port" of a comma list into host/port; advances *list.
 * Returns 1 when one was read, 0 at the end, -1 with errstr. */
static int sentinel_next(const char **list, char *host, size_t host_size,
                         int *port, char *errstr, size_t errstr_size)
{
    const char *s = *list;
    while (*s == ' ' || *s == ',')
        s++;
    if (!*s)
        return 0;
    size_t len = strcspn(s, ", ");
    *list = s + len;
    *port = 26379;
    return hostport_parse(s, len, host, host_size, port, "redis.sentinels",
                          errstr, errstr_size)
               ? -1
               : 1;
}

int idem_redisconn_conf_check(const idem_conf_t *conf, char *errstr,
                              size_t errstr_size)
{
    idem_redisconn_url_t u;
    if (idem_redisconn_url_parse(conf->redis_url, &u, errstr, errstr_size))
        return -1;
    int has_pw = set(conf->redis_password) || u.password[0];
    if ((set(conf->redis_username) || u.username[0]) && !has_pw) {
        snprintf(errstr, errstr_size,
                 "%s: a user name needs a password (in redis.url or "
                 "redis.password)",
                 set(conf->redis_username) ? "redis.username" : "redis.url");
        return -1;
    }
    const char *tls_keys[] = {"redis.tls.ca.file", "redis.tls.cert.file",
                              "redis.tls.key.file"};
    const char *tls_vals[] = {conf->redis_tls_ca_file,
                              conf->redis_tls_cert_file,
                              conf->redis_tls_key_file};
    for (int i = 0; i < 3; i++) {
        if (!set(tls_vals[i]))
            continue;
        if (u.scheme != IDEM_REDIS_TLS) {
            snprintf(errstr, errstr_size,
                     "%s: set, but redis.url is not rediss:// (TLS)",
                     tls_keys[i]);
            return -1;
        }
        if (access(tls_vals[i], R_OK)) {
            snprintf(errstr, errstr_size, "%s: cannot read \"%s\"", tls_keys[i],
                     tls_vals[i]);
            return -1;
        }
    }
    if (set(conf->redis_tls_key_file) && !set(conf->redis_tls_cert_file)) {
        snprintf(errstr, errstr_size,
                 "redis.tls.key.file: set without redis.tls.cert.file");
        return -1;
    }
    if (set(conf->redis_sentinels) != set(conf->redis_sentinel_master)) {
        snprintf(errstr, errstr_size, "%s: required with %s",
                 set(conf->redis_sentinels) ? "redis.sentinel.master"
                                            : "redis.sentinels",
                 set(conf->redis_sentinels) ? "redis.sentinels"
                                            : "redis.sentinel.master");
        return -1;
    }
    if (set(conf->redis_sentinels)) {
        if (u.scheme == IDEM_REDIS_UNIX) {
            snprintf(errstr, errstr_size,
                     "redis.sentinels: cannot be used with a unix:// "
                     "redis.url");
            return -1;
        }
        const char *list = conf->redis_sentinels;
        char host[256];
        int port, n = 0, r;
        while ((r = sentinel_next(&list, host, sizeof(host), &port, errstr,
                                  errstr_size)) == 1)
            n++;
        if (r < 0)
            return -1;
        if (!n) {
            snprintf(errstr, errstr_size,
                     "redis.sentinels: no host:port in the list");
            return -1;
        }
    }
    return 0;
}

/* One command on a fresh connection; the reply (caller frees) or NULL with
 * "redis: <what> at <addr>: <error>" in errstr. */
static redisReply *conn_command(idem_redisconn_t *rc, const char *what,
                                int argc, const char **argv, char *errstr,
                                size_t errstr_size)
{
    redisContext *c = rc->c;
    redisReply *r = redisCommandArgv(c, argc, argv, NULL);
    if (!r) {
        rc->cls = IDEM_REDISCONN_ERR_CONNECTION;
        snprintf(errstr, errstr_size, "redis: %s at %s: %s", what, rc->addr,
                 c->errstr[0] ? c->errstr : "connection lost");
        return NULL;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        rc->cls = IDEM_REDISCONN_ERR_REPLY;
        snprintf(rc->code, sizeof(rc->code), "%.*s", (int)strcspn(r->str, " "),
                 r->str);
        snprintf(errstr, errstr_size, "redis: %s at %s: %s", what, rc->addr,
                 r->str);
        freeReplyObject(r);
        return NULL;
    }
    return r;
}

static struct timeval tv_of(int64_t ms)
{
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
    return tv;
}

/* A plain blocking connection to host:port with the timeouts set, or NULL
 * with errstr. */
static redisContext *tcp_open(const char *host, int port, int64_t timeout_ms,
                              idem_redisconn_errclass_t *cls, char *errstr,
                              size_t errstr_size)
{
    struct timeval tv = tv_of(timeout_ms);
    redisContext *c = redisConnectWithTimeout(host, port, tv);
    if (!c) {
        snprintf(errstr, errstr_size, "redis: connect: %s:%d: out of memory",
                 host, port);
        return NULL;
    }
    if (c->err) {
        /* hiredis reports a connect timeout as an I/O error with the
         * system's text (ETIMEDOUT): its own library's words, the only
         * sign of it. */
        *cls = strstr(c->errstr, "timed out") ? IDEM_REDISCONN_ERR_TIMEOUT
                                              : IDEM_REDISCONN_ERR_CONNECTION;
        if (*cls == IDEM_REDISCONN_ERR_TIMEOUT)
            snprintf(errstr, errstr_size,
                     "redis: connect: %s:%d: timeout after %" PRId64 " ms",
                     host, port, timeout_ms);
        else
            snprintf(errstr, errstr_size, "redis: connect: %s:%d: %s", host,
                     port, c->errstr);
        redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, tv);
    return c;
}

/* The transport: TCP, unix socket, or TLS through a tlspipe. Fills rc. */
static int transport_open(idem_redisconn_t *rc, const idem_conf_t *conf,
                          const idem_redisconn_url_t *u, const char *host,
                          int port, char *errstr, size_t errstr_size)
{
    struct timeval tv = tv_of(conf->redis_timeout_ms);
    if (u->scheme == IDEM_REDIS_UNIX) {
        snprintf(rc->addr, sizeof(rc->addr), "%s", u->path);
        rc->c = redisConnectUnixWithTimeout(u->path, tv);
        if (!rc->c || rc->c->err) {
            snprintf(errstr, errstr_size, "redis: connect: %s: %s", u->path,
                     rc->c ? rc->c->errstr : "out of memory");
            return -1;
        }
        redisSetTimeout(rc->c, tv);
        return 0;
    }
    snprintf(rc->addr, sizeof(rc->addr), "%s:%d", host, port);
    if (u->scheme == IDEM_REDIS_TCP) {
        rc->c = tcp_open(host, port, conf->redis_timeout_ms, &rc->cls, errstr,
                         errstr_size);
        return rc->c ? 0 : -1;
    }
    idem_tlspipe_opts_t o = {.ca_file = conf->redis_tls_ca_file,
                             .cert_file = conf->redis_tls_cert_file,
                             .key_file = conf->redis_tls_key_file,
                             .server_name = conf->redis_tls_server_name,
                             .verify = conf->redis_tls_verify};
    int fd = -1;
    rc->tls = idem_tlspipe_open(host, port, &o, conf->redis_timeout_ms, &fd,
                                errstr, errstr_size);
    if (!rc->tls)
        return -1;
    rc->c = redisConnectFd(fd);
    if (!rc->c) {
        close(fd);
        snprintf(errstr, errstr_size, "redis: out of memory");
        return -1;
    }
    redisSetTimeout(rc->c, tv);
    return 0;
}

/* Frees what an open connection holds (not rc itself). */
static void conn_release(idem_redisconn_t *rc)
{
    if (rc->c)
        redisFree(rc->c); /* closes our end: the TLS thread ends */
    rc->c = NULL;
    idem_tlspipe_close(rc->tls);
    rc->tls = NULL;
}

/* Asks one sentinel where the primary of `master` is. The sentinels are
 * reached like the data nodes: TLS (same CA, client certificate and
 * server name) when redis.url is rediss://. 0 with host/port, or -1 with
 * errstr. */
static int sentinel_ask(const idem_conf_t *conf, const idem_redisconn_url_t *u,
                        const char *shost, int sport, char *host,
                        size_t host_size, int *port, char *errstr,
                        size_t errstr_size)
{
    idem_redisconn_t sc = {0};
    int rc = -1;
    if (transport_open(&sc, conf, u, shost, sport, errstr, errstr_size))
        goto done;
    if (set(conf->redis_sentinel_password)) {
        const char *argv[] = {"AUTH", conf->redis_sentinel_password};
        redisReply *r =
            conn_command(&sc, "sentinel AUTH", 2, argv, errstr, errstr_size);
        if (!r)
            goto done;
        freeReplyObject(r);
    }
    const char *argv[] = {"SENTINEL", "get-master-addr-by-name",
                          conf->redis_sentinel_master};
    redisReply *r = conn_command(&sc, "SENTINEL get-master-addr-by-name", 3,
                                 argv, errstr, errstr_size);
    if (!r)
        goto done;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[0]->type == REDIS_REPLY_STRING &&
        r->element[1]->type == REDIS_REPLY_STRING) {
        snprintf(host, host_size, "%s", r->element[0]->str);
        *port = atoi(r->element[1]->str);
        rc = 0;
    } else {
        snprintf(errstr, errstr_size,
                 "redis.sentinel.master: sentinel %s does not know a master "
                 "named \"%s\"",
                 sc.addr, conf->redis_sentinel_master);
    }
    freeReplyObject(r);
done:
    conn_release(&sc);
    return rc;
}

/* Asks the sentinels in order until one answers. */
static int sentinel_discover(const idem_conf_t *conf,
                             const idem_redisconn_url_t *u, char *host,
                             size_t host_size, int *port, char *errstr,
                             size_t errstr_size)
{
    const char *list = conf->redis_sentinels;
    char shost[256], last[400] = "";
    int sport, r;
    while ((r = sentinel_next(&list, shost, sizeof(shost), &sport, errstr,
                              errstr_size)) == 1) {
        if (sentinel_ask(conf, u, shost, sport, host, host_size, port, last,
                         sizeof(last)) == 0)
            return 0;
        idem_log_kv(IDEM_LOG_DEBUG, "sentinel did not answer", "error", last,
                    NULL);
    }
    if (r == 0)
        snprintf(errstr, errstr_size,
                 "redis.sentinels: no sentinel gave the primary of \"%s\" "
                 "(last: %s)",
                 conf->redis_sentinel_master, last);
    return -1;
}

/* After a failed command on a TLS connection, the TLS layer often knows
 * better (an alert from the server): appends it to errstr. */
static void tls_reason(idem_redisconn_t *rc, const idem_conf_t *conf,
                       char *errstr, size_t errstr_size)
{
    if (!rc->tls)
        return;
    char why[256];
    /* The thread records why before it closes the pipe, so a command that
     * saw the end of the stream finds the reason here. */
    if (!idem_tlspipe_error(rc->tls, why, sizeof(why))[0])
        return;
    size_t l = strlen(errstr);
    snprintf(errstr + l, errstr_size - l, " (%s%s)", why,
             set(conf->redis_tls_cert_file)
                 ? ""
                 : (idem_tlspipe_cert_required(rc->tls)
                        ? "; the server wants a client certificate: set "
                          "redis.tls.cert.file and redis.tls.key.file"
                        : "; if the server requires client certificates, "
                          "set redis.tls.cert.file and redis.tls.key.file"));
}

/* AUTH, SELECT and ROLE on a fresh connection. */
static int session_setup(idem_redisconn_t *rc, const idem_conf_t *conf,
                         const idem_redisconn_url_t *u, int replica_ok,
                         char *errstr, size_t errstr_size)
{
    const char *pw = set(conf->redis_password)
                         ? conf->redis_password
                         : (u->password[0] ? u->password : NULL);
    const char *user = set(conf->redis_username)
                           ? conf->redis_username
                           : (u->username[0] ? u->username : NULL);
    redisReply *r;
    if (pw) {
        const char *argv[] = {"AUTH", user ? user : pw, pw};
        r = conn_command(rc, "AUTH", user ? 3 : 2, argv, errstr, errstr_size);
        if (!r)
            return -1;
        freeReplyObject(r);
    }
    if (u->db) {
        char db[16];
        snprintf(db, sizeof(db), "%d", u->db);
        const char *argv[] = {"SELECT", db};
        r = conn_command(rc, "SELECT", 2, argv, errstr, errstr_size);
        if (!r)
            return -1;
        freeReplyObject(r);
    }
    /* A replica (after a failover, or a DNS name that moved) would refuse
     * every write: not connected is the honest state. */
    if (replica_ok)
        return 0;
    const char *argv[] = {"ROLE"};
    r = conn_command(rc, "ROLE", 1, argv, errstr, errstr_size);
    if (!r)
        return -1;
    const char *role = r->type == REDIS_REPLY_ARRAY && r->elements > 0 &&
                               r->element[0]->type == REDIS_REPLY_STRING
                           ? r->element[0]->str
                           : "?";
    int primary = !strcmp(role, "master");
    if (!primary)
        rc->cls = IDEM_REDISCONN_ERR_NOT_PRIMARY;
    if (!primary)
        snprintf(
            errstr, errstr_size,
            "redis: %s is not the primary (ROLE says \"%s\")%s", rc->addr, role,
            set(conf->redis_sentinels) ? "; the sentinels will be asked again"
                                       : "");
    freeReplyObject(r);
    return primary ? 0 : -1;
}

static idem_redisconn_t *open_at(const idem_conf_t *conf,
                                 const idem_redisconn_url_t *u,
                                 const char *host, int port, int replica_ok,
                                 idem_redisconn_err_t *err);

idem_redisconn_t *idem_redisconn_open(const idem_conf_t *conf, int replica_ok,
                                      char *errstr, size_t errstr_size)
{
    idem_redisconn_err_t err;
    idem_redisconn_t *rc = idem_redisconn_open_err(conf, replica_ok, &err);
    if (!rc)
        snprintf(errstr, errstr_size, "%s", err.str);
    return rc;
}

idem_redisconn_t *idem_redisconn_open_err(const idem_conf_t *conf,
                                          int replica_ok,
                                          idem_redisconn_err_t *err)
{
    char *errstr = err->str;
    size_t errstr_size = sizeof(err->str);
    err->cls = IDEM_REDISCONN_ERR_CONNECTION;
    err->code[0] = '\0';
    idem_redisconn_url_t u;
    if (idem_redisconn_url_parse(conf->redis_url, &u, errstr, errstr_size))
        return NULL;
    char host[256];
    int port = u.port;
    snprintf(host, sizeof(host), "%s", u.host);
    if (set(conf->redis_sentinels)) {
        if (sentinel_discover(conf, &u, host, sizeof(host), &port, errstr,
                              errstr_size))
            return NULL;
    }
    idem_redisconn_t *rc = open_at(conf, &u, host, port, replica_ok, err);
    if (rc && set(conf->redis_sentinels))
        idem_log_kv(IDEM_LOG_INFO, "redis primary from sentinels", "master",
                    conf->redis_sentinel_master, "addr", rc->addr, NULL);
    return rc;
}

idem_redisconn_t *idem_redisconn_open_node(const idem_conf_t *conf,
                                           const char *host, int port,
                                           int replica_ok,
                                           idem_redisconn_err_t *err)
{
    err->cls = IDEM_REDISCONN_ERR_CONNECTION;
    err->code[0] = '\0';
    idem_redisconn_url_t u;
    if (idem_redisconn_url_parse(conf->redis_url, &u, err->str,
                                 sizeof(err->str)))
        return NULL;
    if (u.scheme == IDEM_REDIS_UNIX)
        u.scheme = IDEM_REDIS_TCP; /* a node is an address, never a socket */
    return open_at(conf, &u, host, port, replica_ok, err);
}

/* The transport to host:port and the session on it (AUTH, SELECT, ROLE),
 * with the failure's class in *err. */
static idem_redisconn_t *open_at(const idem_conf_t *conf,
                                 const idem_redisconn_url_t *u,
                                 const char *host, int port, int replica_ok,
                                 idem_redisconn_err_t *err)
{
    char *errstr = err->str;
    size_t errstr_size = sizeof(err->str);
    idem_redisconn_t *rc = idem_xcalloc(1, sizeof(*rc));
    rc->cls = IDEM_REDISCONN_ERR_CONNECTION;
    if (transport_open(rc, conf, u, host, port, errstr, errstr_size) ||
        session_setup(rc, conf, u, replica_ok, errstr, errstr_size)) {
        tls_reason(rc, conf, errstr, errstr_size);
        err->cls = rc->cls;
        snprintf(err->code, sizeof(err->code), "%s", rc->code);
        idem_redisconn_close(rc);
        return NULL;
    }
    return rc;
}

redisContext *idem_redisconn_context(idem_redisconn_t *rc)
{
    return rc->c;
}

const char *idem_redisconn_addr(const idem_redisconn_t *rc)
{
    return rc->addr;
}

void idem_redisconn_close(idem_redisconn_t *rc)
{
    if (!rc)
        return;
    conn_release(rc);
    free(rc);
}

redisReply *idem_redisconn_script(redisContext *c, const char *lua, char *sha,
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
        const char *argv[16] = {"EVALSHA", sha};
        for (int i = 0; i < nargs && i < 14; i++)
            argv[2 + i] = args[i];
        redisReply *r =
            redisCommandArgv(c, 2 + (nargs < 14 ? nargs : 14), argv, NULL);
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
