/* test_redisconn (unit): redis.url parsing and redaction, and the
 * cross-key checks. */
#include "conf/conf.h"
#include "testlib.h"
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

/* The tests' own temp dirs: removed by the suite's .fini when a test
 * fails half-way. */
#define EXTRA_MAX 8
static char *extra_dirs[EXTRA_MAX];

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
        th_rmrf(extra_dirs[i]);
        free(extra_dirs[i]);
        extra_dirs[i] = NULL;
    }
}

TestSuite(redisconn, .init = quiet, .fini = cleanup);

Test(redisconn, url_forms)
{
    idem_redisconn_url_t u;
    char err[256];
    cr_assert_eq(
        idem_redisconn_url_parse("redis://h:7000/3", &u, err, sizeof(err)), 0,
        "%s", err);
    cr_expect_eq(u.scheme, IDEM_REDIS_TCP);
    cr_expect_str_eq(u.host, "h");
    cr_expect_eq(u.port, 7000);
    cr_expect_eq(u.db, 3);
    cr_expect_str_empty(u.username);
    cr_expect_str_empty(u.password);

    cr_assert_eq(idem_redisconn_url_parse("rediss://idem:p@ss:w@rd@h/0", &u,
                                          err, sizeof(err)),
                 0, "%s", err);
    cr_expect_eq(u.scheme, IDEM_REDIS_TLS);
    cr_expect_str_eq(u.username, "idem");
    cr_expect_str_eq(u.password, "p@ss:w@rd");
    cr_expect_str_eq(u.host, "h");
    cr_expect_eq(u.port, 6379);

    cr_assert_eq(
        idem_redisconn_url_parse("redis://:pw@h:1", &u, err, sizeof(err)), 0);
    cr_expect_str_empty(u.username, "the old form: password only");
    cr_expect_str_eq(u.password, "pw");

    cr_assert_eq(
        idem_redisconn_url_parse("redis://idem@h:1", &u, err, sizeof(err)), 0);
    cr_expect_str_eq(u.username, "idem");
    cr_expect_str_empty(u.password);

    cr_assert_eq(idem_redisconn_url_parse("rediss://u:p@[::1]:6380/1", &u, err,
                                          sizeof(err)),
                 0, "%s", err);
    cr_expect_str_eq(u.host, "::1");
    cr_expect_eq(u.port, 6380);
    cr_expect_eq(u.db, 1);

    cr_assert_eq(idem_redisconn_url_parse("unix:///run/r.sock?db=2", &u, err,
                                          sizeof(err)),
                 0);
    cr_expect_eq(u.scheme, IDEM_REDIS_UNIX);
    cr_expect_str_eq(u.path, "/run/r.sock");
    cr_expect_eq(u.db, 2);
}

/* Fuzzer find: a query shorter than "?db=" made the parser read past the
 * end of the URL (strtol at q + 4). Each copy is on the heap with its exact
 * size, so the sanitizer build sees any overread. */
Test(redisconn, short_unix_query_is_refused_without_overread)
{
    const char *urls[] = {"unix:///tms?", "unix:///s?d", "unix:///s?db",
                          "unix:///s?db="};
    for (size_t i = 0; i < sizeof(urls) / sizeof(urls[0]); i++) {
        size_t n = strlen(urls[i]) + 1;
        char *url = malloc(n);
        memcpy(url, urls[i], n);
        idem_redisconn_url_t u;
        char err[256];
        cr_expect_eq(idem_redisconn_url_parse(url, &u, err, sizeof(err)), -1,
                     "%s accepted", urls[i]);
        cr_expect(strstr(err, "?db=N"), "%s: %s", urls[i], err);
        free(url);
    }
}

/* Regression: the URL errors used to echo the whole URL, password and
 * all ("redis.url: no host in \"redis://:s3cr3t@/0\""). */
Test(redisconn, url_errors_name_the_key_and_never_print_the_password)
{
    const char *bad[] = {
        "redis://:s3cr3t-pw@/0",      "redis://idem:s3cr3t-pw@:6379/0",
        "redis://idem:s3cr3t-pw@h:0", "redis://idem:s3cr3t-pw@h:1/x",
        "http://idem:s3cr3t-pw@h:1",  "idem:s3cr3t-pw@h:1",
        "unix://idem:s3cr3t-pw@sock", "unix:///s?x=s3cr3t-pw",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char set[128], err[512] = "";
        snprintf(set, sizeof(set), "redis.url=%s", bad[i]);
        const char *extra[] = {set, NULL};
        idem_conf_t *c = conf_load(extra, err, sizeof(err));
        cr_expect_null(c, "%s accepted", bad[i]);
        idem_conf_destroy(c);
        cr_expect(!strncmp(err, "redis.url: ", 11), "%s: %s", bad[i], err);
        cr_expect_null(strstr(err, "s3cr3t"), "password printed: %s", err);
    }
}

Test(redisconn, check_config_masks_the_password_keeps_the_user)
{
    const char *extra[] = {"redis.url=rediss://idem:s3cr3t@h:6380/1",
                           "redis.sentinel.password=s3cr3t2", NULL};
    char err[256];
    idem_conf_t *c = conf_load(extra, err, sizeof(err));
    cr_assert(c, "%s", err);
    char *buf = NULL;
    size_t len = 0;
    FILE *fp = open_memstream(&buf, &len);
    idem_conf_dump(c, fp);
    fclose(fp);
    cr_expect(strstr(buf, "redis.url=rediss://idem:***@h:6380/1\n"), "%s", buf);
    cr_expect_null(strstr(buf, "s3cr3t"), "%s", buf);
    free(buf);
    idem_conf_destroy(c);
}

Test(redisconn, cross_key_checks)
{
    struct {
        const char *sets[4];
        const char *want;
    } cases[] = {
        {{"redis.sentinels=127.0.0.1:26379"}, "redis.sentinel.master: "},
        {{"redis.sentinel.master=m"}, "redis.sentinels: "},
        {{"redis.sentinels=127.0.0.1:x", "redis.sentinel.master=m"},
         "redis.sentinels: bad port"},
        {{"redis.url=unix:///s", "redis.sentinels=h:1",
          "redis.sentinel.master=m"},
         "redis.sentinels: cannot be used with a unix://"},
        {{"redis.tls.ca.file=/etc/hostname"}, "redis.tls.ca.file: set, but"},
        {{"redis.url=rediss://h:1", "redis.tls.ca.file=/nonexistent/ca.pem"},
         "redis.tls.ca.file: cannot read \"/nonexistent/ca.pem\""},
        {{"redis.url=rediss://h:1", "redis.tls.key.file=/etc/hostname"},
         "redis.tls.key.file: set without redis.tls.cert.file"},
        {{"redis.username=idem"}, "redis.username: a user name needs"},
        {{"redis.url=redis://idem@h:1"}, "redis.url: a user name needs"},
        {{"redis.tls.verify=maybe"}, "redis.tls.verify: \"maybe\""},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char err[512] = "";
        idem_conf_t *c = conf_load(cases[i].sets, err, sizeof(err));
        cr_expect_null(c, "case %zu accepted", i);
        idem_conf_destroy(c);
        cr_expect(strstr(err, cases[i].want), "case %zu: %s", i, err);
    }
    /* redis.tls.ca.file is a key of its own, not "read redis.tls.ca from
     * a file"; redis.username with redis.password is complete. */
    const char *ok[] = {"redis.url=rediss://h:1",
                        "redis.tls.ca.file=/etc/hostname",
                        "redis.username=idem", "redis.password=pw", NULL};
    char err[512];
    idem_conf_t *c = conf_load(ok, err, sizeof(err));
    cr_assert(c, "%s", err);
    cr_expect_str_eq(c->redis_tls_ca_file, "/etc/hostname");
    cr_expect_str_eq(c->redis_username, "idem");
    cr_expect_eq(c->redis_tls_verify, 1);
    idem_conf_destroy(c);

    /* The same from the environment; and the sentinel password from a
     * file, as from a mounted Secret. */
    char *dir = extra_dir();
    char pwfile[600];
    snprintf(pwfile, sizeof(pwfile), "%s/sentinel-pw", dir);
    cr_assert_eq(th_write_file(pwfile, "from-a-file\n"), 0);
    char envpw[700];
    snprintf(envpw, sizeof(envpw), "IDEMPROC_REDIS_SENTINEL_PASSWORD_FILE=%s",
             pwfile);
    char *envp[] = {"IDEMPROC_REDIS_URL=rediss://h:1",
                    "IDEMPROC_REDIS_TLS_CA_FILE=/etc/hostname", envpw, NULL};
    char *sets[] = {"kafka.bootstrap.servers=127.0.0.1:9092", "group.id=g",
                    "input.topics=payments", "dlq.topic=payments.dlq"};
    c = idem_conf_load(NULL, envp, sets, 4, err, sizeof(err));
    cr_assert(c, "%s", err);
    cr_expect_str_eq(c->redis_tls_ca_file, "/etc/hostname");
    cr_expect_str_eq(c->redis_sentinel_password, "from-a-file");
    idem_conf_destroy(c);
}
