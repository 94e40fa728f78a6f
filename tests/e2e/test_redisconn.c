/* test_redisconn (e2e): AUTH with an ACL user, the ROLE check, TLS (a test
 * CA made here with openssl) and Sentinel failover against real
 * redis-server processes, with members running. */
#include "conf/conf.h"
#include "harness.h"
#include "fixture_redisconn.h"
#include "base/log.h"
#include "redis/redisconn.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static th_stack_t stk;

/* Processes a test starts besides the stack (replicas, sentinels, TLS
 * servers) and its own temp dirs: removed by the suite's .fini when a
 * test fails half-way. */
#define EXTRA_MAX 8
static pid_t extra_pids[EXTRA_MAX];
static char *extra_dirs[EXTRA_MAX];

static void extra_pid(pid_t pid)
{
    for (int i = 0; i < EXTRA_MAX; i++)
        if (!extra_pids[i]) {
            extra_pids[i] = pid;
            return;
        }
}

static char *extra_dir(void)
{
    char *d = th_tmpdir();
    for (int i = 0; i < EXTRA_MAX; i++)
        if (!extra_dirs[i]) {
            extra_dirs[i] = d;
            break;
        }
    return d;
}

static void cleanup(void)
{
    for (int i = 0; i < EXTRA_MAX; i++) {
        if (extra_pids[i] > 0) {
            kill(extra_pids[i], SIGKILL);
            th_wait(extra_pids[i], 5000);
        }
        extra_pids[i] = 0;
        th_rmrf(extra_dirs[i]);
        free(extra_dirs[i]);
        extra_dirs[i] = NULL;
    }
    th_stack_cleanup();
}

TestSuite(redisconn, .init = quiet, .fini = cleanup);

/* ---- connections, in process --------------------------------------- */

static char *cli(int port, const char *const args[])
{
    th_redis_t r = {.port = port};
    return th_redis_cli(&r, args);
}

/* Opens with the given sets, runs ACL WHOAMI; returns the user name (caller
 * frees) or NULL with err filled. */
static char *open_whoami(const char *const sets[], char *err, size_t size)
{
    idem_conf_t *c = conf_load(sets, err, size);
    cr_assert(c, "%s", err);
    idem_redisconn_t *rc = idem_redisconn_open(c, 0, err, size);
    char *who = NULL;
    if (rc) {
        redisReply *r = redisCommand(idem_redisconn_context(rc), "ACL WHOAMI");
        cr_assert(r, "%s", idem_redisconn_context(rc)->errstr);
        who = strdup(r->type == REDIS_REPLY_STRING ? r->str : "?");
        freeReplyObject(r);
        /* A big reply and a big request cross the connection intact. */
        char *big = malloc(300001);
        memset(big, 'x', 300000);
        big[300000] = '\0';
        r = redisCommand(idem_redisconn_context(rc), "ECHO %s", big);
        cr_assert(r && r->type == REDIS_REPLY_STRING && r->len == 300000);
        freeReplyObject(r);
        free(big);
    }
    idem_redisconn_close(rc);
    idem_conf_destroy(c);
    return who;
}

Test(redisconn, acl_user_from_url_or_key_and_clear_auth_errors, .timeout = 60)
{
    th_redis_t r;
    cr_assert_eq(th_redis_start(&r), 0);
    const char *acl[] = {"ACL",      "SETUSER",     "idem",  "on",
                         ">user-pw", "~idemproc:*", "+@all", NULL};
    free(th_redis_cli(&r, acl));
    const char *pw[] = {"CONFIG", "SET", "requirepass", "default-pw", NULL};
    free(th_redis_cli(&r, pw));
    char url[128], err[512];

    snprintf(url, sizeof(url), "redis.url=redis://idem:user-pw@127.0.0.1:%d/0",
             r.port);
    const char *s1[] = {url, NULL};
    char *who = open_whoami(s1, err, sizeof(err));
    cr_expect_str_eq(who ? who : err, "idem", "the user in the URL is used");
    free(who);

    snprintf(url, sizeof(url), "redis.url=redis://127.0.0.1:%d/0", r.port);
    const char *s2[] = {url, "redis.username=idem", "redis.password=user-pw",
                        NULL};
    who = open_whoami(s2, err, sizeof(err));
    cr_expect_str_eq(who ? who : err, "idem");
    free(who);

    const char *s3[] = {url, "redis.password=default-pw", NULL};
    who = open_whoami(s3, err, sizeof(err));
    cr_expect_str_eq(who ? who : err, "default");
    free(who);

    const char *s4[] = {url, "redis.username=idem",
                        "redis.password=wrong-s3cr3t", NULL};
    who = open_whoami(s4, err, sizeof(err));
    cr_expect_null(who);
    cr_expect(strstr(err, "AUTH") && strstr(err, "WRONGPASS"), "%s", err);
    cr_expect_null(strstr(err, "s3cr3t"), "%s", err);
    th_redis_stop(&r);
}

Test(redisconn, a_replica_is_refused_until_it_is_the_primary, .timeout = 60)
{
    th_redis_t r;
    cr_assert_eq(th_redis_start(&r), 0);
    char port[16];
    snprintf(port, sizeof(port), "%d", r.port);
    const char *replicaof[] = {"REPLICAOF", "127.0.0.1", "1", NULL};
    free(th_redis_cli(&r, replicaof));
    char url[128], err[512];
    snprintf(url, sizeof(url), "redis.url=redis://127.0.0.1:%d/0", r.port);
    const char *sets[] = {url, NULL};
    char *who = open_whoami(sets, err, sizeof(err));
    cr_expect_null(who);
    cr_expect(strstr(err, "is not the primary (ROLE says \"slave\")"), "%s",
              err);
    free(who);
    const char *promote[] = {"REPLICAOF", "NO", "ONE", NULL};
    free(th_redis_cli(&r, promote));
    who = open_whoami(sets, err, sizeof(err));
    cr_expect_str_eq(who ? who : err, "default");
    free(who);
    th_redis_stop(&r);
}

/* The class of a failed connect travels as data: a wrong password is an
 * error reply with its code, a replica is NOT_PRIMARY, nothing listening
 * is CONNECTION. */
Test(redisconn, a_failed_connect_carries_its_class, .timeout = 60)
{
    th_redis_t r;
    cr_assert_eq(th_redis_start(&r), 0);
    const char *pw[] = {"CONFIG", "SET", "requirepass", "right-pw", NULL};
    free(th_redis_cli(&r, pw));
    char url[128], err[512];
    snprintf(url, sizeof(url), "redis.url=redis://127.0.0.1:%d/0", r.port);
    const char *wrong[] = {url, "redis.password=wrong-pw", NULL};
    idem_conf_t *c = conf_load(wrong, err, sizeof(err));
    cr_assert(c, "%s", err);
    idem_redisconn_err_t e;
    cr_expect_null(idem_redisconn_open_err(c, 0, &e));
    cr_expect_eq(e.cls, IDEM_REDISCONN_ERR_REPLY, "%s", e.str);
    cr_expect_str_eq(e.code, "WRONGPASS", "%s", e.str);
    idem_conf_destroy(c);

    const char *right[] = {url, "redis.password=right-pw", NULL};
    c = conf_load(right, err, sizeof(err));
    cr_assert(c, "%s", err);
    const char *replicaof[] = {"-a",        "right-pw", "REPLICAOF",
                               "127.0.0.1", "1",        NULL};
    free(th_redis_cli(&r, replicaof));
    cr_expect_null(idem_redisconn_open_err(c, 0, &e));
    cr_expect_eq(e.cls, IDEM_REDISCONN_ERR_NOT_PRIMARY, "%s", e.str);
    idem_redisconn_t *rc = idem_redisconn_open_err(c, 1, &e);
    cr_expect(rc, "a reader accepts a replica: %s", e.str);
    idem_redisconn_close(rc);
    idem_conf_destroy(c);

    snprintf(url, sizeof(url), "redis.url=redis://127.0.0.1:%d/0",
             th_free_port());
    const char *none[] = {url, NULL};
    c = conf_load(none, err, sizeof(err));
    cr_assert(c, "%s", err);
    cr_expect_null(idem_redisconn_open_err(c, 0, &e));
    cr_expect_eq(e.cls, IDEM_REDISCONN_ERR_CONNECTION, "%s", e.str);
    idem_conf_destroy(c);
    const char *promote[] = {"-a", "right-pw", "REPLICAOF", "NO", "ONE", NULL};
    free(th_redis_cli(&r, promote));
    th_redis_stop(&r);
}

typedef struct {
    char *dir;
    char ca[600], ca_other[600], server_crt[600], server_key[600],
        client_crt[600], client_key[600];
} certs_t;

static void openssl(const char *dir, const char *cmd)
{
    char sh[4096];
    snprintf(sh, sizeof(sh), "cd '%s' && %s", dir, cmd);
    char *argv[] = {"/bin/sh", "-c", sh, NULL};
    char *err = NULL;
    int rc = th_run(argv, NULL, &err, 30000);
    cr_assert_eq(rc, 0, "%s: %s", cmd, err);
    free(err);
}

/* A test CA, a second unrelated CA, a server certificate for 127.0.0.1 and
 * localhost, and a client certificate, in a new temp dir. */
static void certs_make(certs_t *c)
{
    c->dir = extra_dir();
    const char *ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
                     "-nodes -days 2";
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             "openssl req -x509 %s -keyout ca.key -out ca.crt "
             "-subj /CN=idemproc-test-ca && "
             "openssl req -x509 %s -keyout other.key -out other.crt "
             "-subj /CN=another-ca && "
             "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > "
             "san.cnf && "
             "openssl req %s -keyout server.key -out server.csr "
             "-subj /CN=redis && "
             "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key "
             "-CAcreateserial -days 2 -extfile san.cnf -out server.crt && "
             "openssl req %s -keyout client.key -out client.csr "
             "-subj /CN=idemproc && "
             "openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key "
             "-CAcreateserial -days 2 -out client.crt",
             ec, ec, ec, ec);
    openssl(c->dir, cmd);
    snprintf(c->ca, sizeof(c->ca), "%s/ca.crt", c->dir);
    snprintf(c->ca_other, sizeof(c->ca_other), "%s/other.crt", c->dir);
    snprintf(c->server_crt, sizeof(c->server_crt), "%s/server.crt", c->dir);
    snprintf(c->server_key, sizeof(c->server_key), "%s/server.key", c->dir);
    snprintf(c->client_crt, sizeof(c->client_crt), "%s/client.crt", c->dir);
    snprintf(c->client_key, sizeof(c->client_key), "%s/client.key", c->dir);
}

/* Adds a TLS listener on a free port to a running plain redis-server (the
 * plain port stays for the test's own redis-cli and verify). Returns the
 * TLS port. */
static int tls_listen(th_redis_t *r, const certs_t *c, const char *auth)
{
    for (int attempt = 0; attempt < 5; attempt++) {
        char port[16];
        snprintf(port, sizeof(port), "%d", th_free_port());
        const char *args[] = {"CONFIG",
                              "SET",
                              "tls-cert-file",
                              c->server_crt,
                              "tls-key-file",
                              c->server_key,
                              "tls-ca-cert-file",
                              c->ca,
                              "tls-auth-clients",
                              auth,
                              "tls-port",
                              port,
                              NULL};
        char *out = th_redis_cli(r, args);
        int ok = out && !strcmp(out, "OK");
        free(out);
        if (ok)
            return atoi(port);
    }
    cr_assert_fail("redis-server would not listen for TLS");
    return -1;
}

Test(redisconn, tls_verifies_the_server_and_offers_a_client_certificate,
     .timeout = 90)
{
    certs_t c;
    certs_make(&c);
    th_redis_t r;
    cr_assert_eq(th_redis_start(&r), 0);
    int port = tls_listen(&r, &c, "no");
    char url[128], ca[700], other[700], cert[700], key[700], err[512];
    snprintf(url, sizeof(url), "redis.url=rediss://127.0.0.1:%d/0", port);
    snprintf(ca, sizeof(ca), "redis.tls.ca.file=%s", c.ca);
    snprintf(other, sizeof(other), "redis.tls.ca.file=%s", c.ca_other);
    snprintf(cert, sizeof(cert), "redis.tls.cert.file=%s", c.client_crt);
    snprintf(key, sizeof(key), "redis.tls.key.file=%s", c.client_key);

    /* Server-only TLS: the test CA, the IP in the certificate. */
    const char *good[] = {url, ca, NULL};
    char *who = open_whoami(good, err, sizeof(err));
    cr_expect_str_eq(who ? who : err, "default");
    free(who);

    /* A name the certificate carries; then one it does not. */
    const char *named[] = {url, ca, "redis.tls.server.name=localhost", NULL};
    who = open_whoami(named, err, sizeof(err));
    cr_expect_str_eq(who ? who : err, "default");
    free(who);
    const char *misnamed[] = {url, ca, "redis.tls.server.name=redis.example",
                              NULL};
    who = open_whoami(misnamed, err, sizeof(err));
    cr_expect_null(who);
    cr_expect(strstr(err, "redis.tls.server.name: the certificate of "
                          "127.0.0.1:"),
              "%s", err);

    /* The wrong CA: refused, one line naming the key and the address. */
    const char *wrong[] = {url, other, NULL};
    who = open_whoami(wrong, err, sizeof(err));
    cr_expect_null(who);
    char want[128];
    snprintf(want, sizeof(want),
             "redis.tls.ca.file: certificate verify failed for 127.0.0.1:%d (",
             port);
    cr_expect(!strncmp(err, want, strlen(want)), "%s", err);
    cr_expect_null(strchr(err, '\n'), "%s", err);

    /* Verification off accepts it (for tests only). */
    const char *unverified[] = {url, other, "redis.tls.verify=false", NULL};
    who = open_whoami(unverified, err, sizeof(err));
    cr_expect_str_eq(who ? who : err, "default");
    free(who);

    /* A server that requires client certificates. */
    const char *req[] = {"CONFIG", "SET", "tls-auth-clients", "yes", NULL};
    free(th_redis_cli(&r, req));
    who = open_whoami(good, err, sizeof(err));
    cr_expect_null(who);
    cr_expect(strstr(err, "redis.tls.cert.file"), "%s", err);
    const char *mutual[] = {url, ca, cert, key, NULL};
    who = open_whoami(mutual, err, sizeof(err));
    cr_expect_str_eq(who ? who : err, "default");
    free(who);
    th_redis_stop(&r);
}

static pid_t spawn_logged(const char *dir, const char *name,
                          char *const argv[]);

/* With rediss://, the sentinels are asked over TLS too (same CA), and
 * redis.sentinel.password is sent to them, never shown. */
Test(redisconn, sentinels_over_tls_with_a_password, .timeout = 90)
{
    certs_t c;
    certs_make(&c);
    th_redis_t r;
    cr_assert_eq(th_redis_start(&r), 0);
    int tport = tls_listen(&r, &c, "no");
    char *dir = extra_dir();
    int sport = th_free_port();
    char sconf[600], text[2048];
    snprintf(sconf, sizeof(sconf), "%s/sentinel.conf", dir);
    snprintf(text, sizeof(text),
             "port 0\ntls-port %d\nbind 127.0.0.1\ndir %s\n"
             "tls-cert-file %s\ntls-key-file %s\ntls-ca-cert-file %s\n"
             "tls-auth-clients no\ntls-replication yes\n"
             "requirepass sentinel-s3cr3t\n"
             "sentinel monitor tm 127.0.0.1 %d 1\n",
             sport, dir, c.server_crt, c.server_key, c.ca, tport);
    cr_assert_eq(th_write_file(sconf, text), 0);
    char *sentinel[] = {"/usr/bin/redis-server", sconf, "--sentinel", NULL};
    spawn_logged(dir, "sentinel", sentinel);

    char ca[700], sentinels[64], err[512] = "";
    snprintf(ca, sizeof(ca), "redis.tls.ca.file=%s", c.ca);
    snprintf(sentinels, sizeof(sentinels), "redis.sentinels=127.0.0.1:%d",
             sport);
    const char *good[] = {"redis.url=rediss://unused.invalid:1/0",
                          ca,
                          sentinels,
                          "redis.sentinel.master=tm",
                          "redis.sentinel.password=sentinel-s3cr3t",
                          NULL};
    char *who = NULL;
    for (int t = 0; t < 200 && !who; t++) {
        who = open_whoami(good, err, sizeof(err));
        if (!who)
            usleep(100000);
    }
    cr_expect_str_eq(who ? who : err, "default");
    free(who);

    const char *badpw[] = {"redis.url=rediss://unused.invalid:1/0",
                           ca,
                           sentinels,
                           "redis.sentinel.master=tm",
                           "redis.sentinel.password=wrong-s3cr3t",
                           NULL};
    who = open_whoami(badpw, err, sizeof(err));
    cr_expect_null(who);
    cr_expect(strstr(err, "sentinel AUTH") && strstr(err, "WRONGPASS"), "%s",
              err);
    cr_expect_null(strstr(err, "s3cr3t"), "%s", err);

    const char *unknown[] = {"redis.url=rediss://unused.invalid:1/0",
                             ca,
                             sentinels,
                             "redis.sentinel.master=nope",
                             "redis.sentinel.password=sentinel-s3cr3t",
                             NULL};
    who = open_whoami(unknown, err, sizeof(err));
    cr_expect_null(who);
    cr_expect(strstr(err, "does not know a master named \"nope\""), "%s", err);
    th_redis_stop(&r);
}

/* ---- the pipeline over TLS, an ACL user, Sentinel -------------------- */

static const char *const traffic[] = {
    "--count",  "4000", "--duplicates",      "0.1",
    "--poison", "0.02", "--too-large-bytes", "5000",
    "--seed",   "21",   "--users",           "40",
    NULL};

static char *member_log(const char *name)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/%s.log", stk.dir, name);
    char *log = th_slurp(path, NULL);
    return log ? log : strdup("");
}

static long expect_unique(void)
{
    json_t *e = json_load_file(stk.expect, 0, NULL);
    cr_assert(e);
    long n = (long)json_integer_value(json_object_get(e, "unique"));
    json_decref(e);
    return n;
}

/* The ACL deploy/README.md documents for the processor: the commands
 * store.c and redisconn.c send, directly or from the Lua scripts, on keys
 * under the prefix only. Keep the two in step. */
static const char *const acl_processor[] = {"ACL",
                                            "SETUSER",
                                            "idemproc",
                                            "reset",
                                            "on",
                                            ">acl-user-pw",
                                            "~idemproc:*",
                                            "resetchannels",
                                            "-@all",
                                            "+select",
                                            "+role",
                                            "+script|load",
                                            "+evalsha",
                                            "+mget",
                                            "+get",
                                            "+set",
                                            "+incrby",
                                            "+hincrby",
                                            "+hset",
                                            "+hmget",
                                            "+info",
                                            "+wait",
                                            "+scan",
                                            "+hgetall",
                                            "+ping",
                                            "+bgrewriteaof",
                                            "+time",
                                            "+zadd",
                                            "+zrem",
                                            "+zremrangebyscore",
                                            "+zrangebyscore",
                                            "+pexpire",
                                            "+hdel",
                                            NULL};

/* deploy/README.md's addition for dedup.scope=partition. */
static const char *const acl_partition[] = {
    "ACL",     "SETUSER",   "idemproc", "+incr",   "+getrange",
    "+append", "+expireat", "+exists",  "+strlen", NULL};

/* A member (and verify) as the documented ACL user, plus `extra` if any,
 * with AOF on (so the rewrite before the first write runs as that user):
 * exact, and nothing denied. */
static void run_as_acl_user(const char *const props[],
                            const char *const extra[])
{
    cr_assert_eq(th_stack_start(&stk, 4, props), 0);
    char *out = th_redis_cli(&stk.redis, acl_processor);
    cr_assert_str_eq(out ? out : "", "OK");
    free(out);
    if (extra) {
        out = th_redis_cli(&stk.redis, extra);
        cr_assert_str_eq(out ? out : "", "OK");
        free(out);
    }
    const char *aof[] = {"CONFIG", "SET", "appendonly", "yes", NULL};
    out = th_redis_cli(&stk.redis, aof);
    cr_assert_str_eq(out ? out : "", "OK");
    free(out);
    cr_assert_eq(th_stack_produce(&stk, traffic), 0);
    char url[128];
    snprintf(url, sizeof(url),
             "redis.url=redis://idemproc:acl-user-pw@127.0.0.1:%d/0",
             stk.redis.port);
    const char *sets[] = {url, NULL};
    pid_t m = th_stack_member(&stk, "m1", sets);
    TH_ASSERT_VERIFIED(&stk, 1, NULL, 120000);
    /* verify itself also runs as the processor's user. */
    cr_expect_eq(th_stack_verify(&stk, 1, sets, NULL), 0);
    const char *log_args[] = {"ACL", "LOG", NULL};
    out = th_redis_cli(&stk.redis, log_args);
    cr_expect_str_empty(out ? out : "?", "commands were denied:\n%s", out);
    free(out);
    cr_expect_eq(th_wait(m, 0), -1, "the member must still run");
    cr_expect_eq(th_stop(m, 15000), 0);
}

Test(redisconn, acl_user_with_only_the_needed_commands_runs_exactly,
     .timeout = 180)
{
    run_as_acl_user(NULL, NULL);
    th_stack_stop(&stk);
}

Test(redisconn, acl_user_runs_the_partition_layout_exactly, .timeout = 180)
{
    const char *props[] = {"dedup.scope=partition", NULL};
    run_as_acl_user(props, acl_partition);
    /* the member ran the partition layout: its window keys exist */
    const char *scan[] = {"--scan", "--pattern", "idemproc:st{*}:w*", NULL};
    char *out = th_redis_cli(&stk.redis, scan);
    cr_expect(out && strstr(out, ":w"), "no partition window keys: %s", out);
    free(out);
    th_stack_stop(&stk);
}

Test(redisconn, wrong_password_is_an_outage_then_resumes_exactly,
     .timeout = 180)
{
    int hport = th_free_port();
    char listen[64];
    snprintf(listen, sizeof(listen), "http.listen=127.0.0.1:%d", hport);
    const char *props[] = {listen, NULL};
    cr_assert_eq(th_stack_start(&stk, 2, props), 0);
    char *out = th_redis_cli(&stk.redis, acl_processor);
    cr_assert_str_eq(out ? out : "", "OK");
    free(out);
    cr_assert_eq(th_stack_produce(&stk, traffic), 0);
    char url[128];
    snprintf(url, sizeof(url),
             "redis.url=redis://idemproc:n3w-s3cr3t@127.0.0.1:%d/0",
             stk.redis.port);
    const char *sets[] = {url, NULL};
    pid_t m = th_stack_member(&stk, "m1", sets);
    /* Not ready, saying why, without the password. */
    char *body = NULL;
    int status = -1;
    for (int t = 0; t < 300; t++) {
        free(body);
        body = NULL;
        status = th_http_get(hport, "/readyz", &body);
        if (status == 503 && body && strstr(body, "WRONGPASS"))
            break;
        usleep(100000);
    }
    cr_expect_eq(status, 503);
    cr_expect(body && strstr(body, "WRONGPASS"), "reason: %s", body);
    cr_expect(body && !strstr(body, "s3cr3t"), "reason: %s", body);
    free(body);
    cr_expect_eq(th_stack_applied(&stk), 0);
    /* The operator rotates the password the member already has. */
    const char *rotate[] = {"ACL",       "SETUSER",     "idemproc",
                            "resetpass", ">n3w-s3cr3t", NULL};
    free(th_redis_cli(&stk.redis, rotate));
    TH_ASSERT_VERIFIED(&stk, 1, NULL, 120000);
    cr_expect_eq(th_wait(m, 0), -1, "the member must still run");
    cr_expect_eq(th_http_get(hport, "/metrics", &body), 200);
    cr_expect_gt(th_metric(body, "idemproc_redis_errors_total{class=\"auth\"}"),
                 0);
    free(body);
    cr_expect_eq(th_stop(m, 15000), 0);
    char *log = member_log("m1");
    cr_expect(strstr(log, "WRONGPASS"), "%s", log);
    cr_expect_null(strstr(log, "s3cr3t"), "password in the log");
    free(log);
    th_stack_stop(&stk);
}

Test(redisconn, pipeline_over_tls_with_a_client_certificate, .timeout = 180)
{
    certs_t c;
    certs_make(&c);
    cr_assert_eq(th_stack_start(&stk, 4, NULL), 0);
    int port = tls_listen(&stk.redis, &c, "yes");
    const char *more[] = {
        "--count",           "12000", "--duplicates", "0.1", "--poison", "0.01",
        "--too-large-bytes", "5000",  "--seed",       "22",  NULL};
    cr_assert_eq(th_stack_produce(&stk, more), 0);
    char url[128], ca[700], cert[700], key[700];
    snprintf(url, sizeof(url), "redis.url=rediss://127.0.0.1:%d/0", port);
    snprintf(ca, sizeof(ca), "redis.tls.ca.file=%s", c.ca);
    snprintf(cert, sizeof(cert), "redis.tls.cert.file=%s", c.client_crt);
    snprintf(key, sizeof(key), "redis.tls.key.file=%s", c.client_key);
    const char *sets[] = {url, ca, cert, key, "batch.max.messages=50", NULL};
    pid_t m = th_stack_member(&stk, "m1", sets);
    /* Mid-stream the server drops the member's TLS connection: the member
     * reconnects over TLS and goes on. */
    long unique = expect_unique();
    long applied = 0;
    for (int t = 0; t < 600 && applied < unique / 4; t++) {
        applied = th_stack_applied(&stk);
        usleep(50000);
    }
    cr_assert_geq(applied, unique / 4, "the member never got going");
    const char *kill_args[] = {"CLIENT", "KILL", "TYPE", "normal", NULL};
    char *killed = th_redis_cli(&stk.redis, kill_args);
    cr_expect(killed && atoi(killed) >= 1, "no connection killed: %s", killed);
    free(killed);
    TH_ASSERT_VERIFIED(&stk, 1, NULL, 120000);
    char *log = member_log("m1");
    cr_expect(strstr(log, "infrastructure back"),
              "the kill did not hit the member mid-stream:\n%s", log);
    free(log);
    cr_expect_eq(th_wait(m, 0), -1, "the member must still run");
    cr_expect_eq(th_stop(m, 15000), 0);
    th_stack_stop(&stk);
}

/* Waits until the redis at port says `field:value` in INFO section. */
static int wait_info(int port, const char *section, const char *want,
                     int timeout_ms)
{
    for (int t = 0; t < timeout_ms; t += 100) {
        const char *args[] = {"INFO", section, NULL};
        char *out = cli(port, args);
        int ok = out && strstr(out, want);
        free(out);
        if (ok)
            return 0;
        usleep(100000);
    }
    return -1;
}

static pid_t spawn_logged(const char *dir, const char *name, char *const argv[])
{
    char log[600];
    snprintf(log, sizeof(log), "%s/%s.log", dir, name);
    pid_t pid = th_spawn(argv, log, log, NULL);
    extra_pid(pid);
    return pid;
}

/* A primary, a replica and a sentinel; the member finds the primary
 * through the sentinels (the first one in the list is down). Mid-stream
 * the primary is killed; the sentinel promotes the replica and the member
 * follows without a restart. */
Test(redisconn, sentinel_failover_mid_stream_is_followed_without_restart,
     .timeout = 240)
{
    int hport = th_free_port();
    char listen[64];
    snprintf(listen, sizeof(listen), "http.listen=127.0.0.1:%d", hport);
    const char *props[] = {listen, "batch.max.messages=50",
                           "redis.timeout.ms=500", NULL};
    cr_assert_eq(th_stack_start(&stk, 4, props), 0);
    char *dir = extra_dir();

    int rport = th_free_port();
    char rp[16], pp[16];
    snprintf(rp, sizeof(rp), "%d", rport);
    snprintf(pp, sizeof(pp), "%d", stk.redis.port);
    char *replica[] = {"/usr/bin/redis-server",
                       "--port",
                       rp,
                       "--bind",
                       "127.0.0.1",
                       "--dir",
                       dir,
                       "--save",
                       "",
                       "--appendonly",
                       "no",
                       "--replicaof",
                       "127.0.0.1",
                       pp,
                       NULL};
    pid_t rpid = spawn_logged(dir, "replica", replica);
    cr_assert_eq(
        wait_info(rport, "replication", "master_link_status:up", 30000), 0,
        "the replica never synced");

    int sport = th_free_port();
    char sconf[600], text[1024];
    snprintf(sconf, sizeof(sconf), "%s/sentinel.conf", dir);
    snprintf(text, sizeof(text),
             "port %d\nbind 127.0.0.1\ndir %s\n"
             "sentinel monitor m1 127.0.0.1 %d 1\n"
             "sentinel down-after-milliseconds m1 1000\n"
             "sentinel failover-timeout m1 5000\n",
             sport, dir, stk.redis.port);
    cr_assert_eq(th_write_file(sconf, text), 0);
    char *sentinel[] = {"/usr/bin/redis-server", sconf, "--sentinel", NULL};
    spawn_logged(dir, "sentinel", sentinel);
    cr_assert_eq(wait_info(sport, "sentinel", ",slaves=1,", 30000), 0,
                 "the sentinel never saw the replica");

    const char *big[] = {
        "--count", "20000", "--duplicates",      "0.1",  "--poison", "0.01",
        "--seed",  "23",    "--too-large-bytes", "5000", NULL};
    cr_assert_eq(th_stack_produce(&stk, big), 0);
    long unique = expect_unique();
    char sentinels[128];
    snprintf(sentinels, sizeof(sentinels),
             "redis.sentinels=127.0.0.1:%d,"
             "127.0.0.1:%d",
             th_free_port(), sport);
    const char *sets[] = {sentinels, "redis.sentinel.master=m1", NULL};
    pid_t m = th_stack_member(&stk, "m1", sets);

    long applied = 0;
    for (int t = 0; t < 600 && applied < unique / 5; t++) {
        applied = th_stack_applied(&stk);
        usleep(100000);
    }
    cr_assert_geq(applied, unique / 5, "the member never got going");
    kill(stk.redis.pid, SIGKILL);
    th_wait(stk.redis.pid, 5000);
    stk.redis.pid = 0;
    const char *role[] = {"ROLE", NULL};
    char *out = NULL;
    for (int t = 0; t < 300; t++) {
        free(out);
        out = cli(rport, role);
        if (out && !strncmp(out, "master", 6))
            break;
        usleep(100000);
    }
    cr_assert(out && !strncmp(out, "master", 6),
              "the sentinel did not promote the replica: %s", out);
    free(out);
    cr_assert_lt(applied, unique, "killed too late to prove anything");

    /* verify finds the new primary through the sentinels too. */
    char *vout = NULL;
    int vrc = th_stack_wait_verified(&stk, 1, sets, 120000, &vout);
    char *mlog = member_log("m1");
    cr_assert_eq(vrc, 0, "verify never exact:\n%s\nmember log:\n%s", vout,
                 mlog);
    free(mlog);
    free(vout);
    cr_expect_eq(th_wait(m, 0), -1, "the member must not have exited");
    char want[64];
    snprintf(want, sizeof(want), "127.0.0.1:%d", rport);
    char *log = member_log("m1");
    cr_expect(strstr(log, want), "never connected to the new primary:\n%s",
              log);
    free(log);
    int status = 0;
    for (int t = 0; t < 100 && status != 200; t++) {
        status = th_http_get(hport, "/readyz", NULL);
        usleep(100000);
    }
    cr_expect_eq(status, 200, "ready again on the new primary");
    cr_expect_eq(th_stop(m, 15000), 0);
    (void)rpid;
    th_stack_stop(&stk);
    cleanup();
}
