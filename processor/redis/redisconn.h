/* redisconn: opening a connection to the Redis primary: redis.url parsing,
 * TLS (OpenSSL underneath the hiredis context), AUTH with an ACL user,
 * SELECT, Sentinel discovery and the ROLE check. */
#ifndef IDEM_REDISCONN_H
#define IDEM_REDISCONN_H

#include <stddef.h>

#include <hiredis.h>

#include "conf/conf.h"

typedef enum {
    IDEM_REDIS_TCP = 0, /* redis:// */
    IDEM_REDIS_TLS,     /* rediss:// */
    IDEM_REDIS_UNIX,    /* unix:// */
} idem_redis_scheme_t;

typedef struct {
    int scheme; /* idem_redis_scheme_t */
    char host[256];
    int port;
    char path[256];     /* unix socket */
    char username[256]; /* empty when none */
    char password[256]; /* empty when none */
    int db;
} idem_redisconn_url_t;

/* Parses redis://[user[:password]@]host[:port][/db], the same with
 * rediss:// (TLS), or unix:///path[?db=N]. A user without ':' is a user
 * name. Returns 0, or -1 with errstr naming redis.url; errstr never holds
 * the password (nor the URL, which may carry it). */
int idem_redisconn_url_parse(const char *url, idem_redisconn_url_t *out,
                             char *errstr, size_t errstr_size);

/* Copies url into buf with any password replaced by "***" (the user name
 * stays). Returns buf. */
const char *idem_redisconn_url_redact(const char *url, char *buf, size_t size);

/* The redis folder's configuration keys and checks (rediskeys.c). */
extern const idem_conf_module_t idem_redis_conf;

/* Cross-key checks of the redis.* keys for idem_conf_finalize: the URL,
 * user and password, TLS files readable, sentinels and master together.
 * Returns 0 or -1 with errstr naming the key. Connects to nothing. */
int idem_redisconn_conf_check(const idem_conf_t *conf, char *errstr,
                              size_t errstr_size);

typedef struct idem_redisconn_s idem_redisconn_t;

/* Opens a connection to the primary: asks the sentinels for its address
 * when redis.sentinels is set, connects (TLS for rediss://), sends AUTH
 * (user and password), SELECT, and checks with ROLE that the server is a
 * primary. Every call does all of it again, so calling it after a lost
 * connection follows a failover. Returns a handle (caller closes with
 * idem_redisconn_close), or NULL with errstr; every failure is an outage
 * (retriable), never a password in errstr. conf is borrowed. With
 * replica_ok (readers such as verify) a replica is accepted. */
idem_redisconn_t *idem_redisconn_open(const idem_conf_t *conf, int replica_ok,
                                      char *errstr, size_t errstr_size);

/* Why a connect failed, as data (hiredis's err beside errstr): a caller
 * counts or decides by the class, never by the text. */
typedef enum {
    IDEM_REDISCONN_ERR_CONNECTION = 1, /* refused, reset, DNS, TLS, URL, the
                                          sentinels */
    IDEM_REDISCONN_ERR_TIMEOUT,        /* the connect took redis.timeout.ms */
    IDEM_REDISCONN_ERR_NOT_PRIMARY,    /* ROLE: a replica */
    IDEM_REDISCONN_ERR_REPLY, /* AUTH, SELECT or ROLE got an error reply:
                                 its code (WRONGPASS, NOAUTH, LOADING) */
} idem_redisconn_errclass_t;

typedef struct {
    idem_redisconn_errclass_t cls;
    char code[32]; /* IDEM_REDISCONN_ERR_REPLY: the reply's first word */
    char str[512]; /* one line, never a password */
} idem_redisconn_err_t;

/* idem_redisconn_open with the failure's class in *err (NULL returned). */
idem_redisconn_t *idem_redisconn_open_err(const idem_conf_t *conf,
                                          int replica_ok,
                                          idem_redisconn_err_t *err);

/* Opens a connection to the node host:port (a Redis Cluster node): the
 * scheme (TLS for rediss://), user, password and database of redis.url
 * and the redis.* keys, as idem_redisconn_open does, without the
 * sentinels; a unix:// redis.url counts as redis:// here. With replica_ok
 * 0 the ROLE check refuses a replica (IDEM_REDISCONN_ERR_NOT_PRIMARY).
 * Returns a handle (caller closes with idem_redisconn_close), or NULL
 * with the failure's class in *err. conf and host are borrowed. */
idem_redisconn_t *idem_redisconn_open_node(const idem_conf_t *conf,
                                           const char *host, int port,
                                           int replica_ok,
                                           idem_redisconn_err_t *err);

/* The blocking hiredis context of the connection (borrowed: valid until
 * idem_redisconn_close). Timeouts are set to redis.timeout.ms. */
redisContext *idem_redisconn_context(idem_redisconn_t *rc);

/* "host:port" (or the socket path) the connection went to (borrowed). */
const char *idem_redisconn_addr(const idem_redisconn_t *rc);

/* Closes the connection: frees the hiredis context and, for TLS, stops
 * the thread that carries its bytes. NULL is a no-op. */
void idem_redisconn_close(idem_redisconn_t *rc);

/* Runs `lua` on c by EVALSHA, as the store does (the documented ACL grants
 * +script|load +evalsha, not +eval): `sha` caches its digest (41 bytes,
 * "" at first); it is loaded when empty and again after NOSCRIPT (a
 * restarted Redis). `nargs` (at most 14) arguments follow the digest: the
 * key count, the keys, the rest. The reply (caller frees), or NULL. */
redisReply *idem_redisconn_script(redisContext *c, const char *lua, char *sha,
                                  int nargs, const char **args);

#endif
