/* test_conf (unit): the configuration table, its sources and every error
 * path, loaded in-process. */
#include "conf/conf.h"
#include "redis/rediskeys.h"
#include "testlib.h"

#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *base_sets[] = {"kafka.bootstrap.servers=127.0.0.1:9092",
                            "group.id=g", "input.topics=payments",
                            "dlq.topic=payments.dlq"};

static idem_conf_t *load(const char *path, char **envp, char **extra,
                         size_t extra_cnt, char *errstr, size_t size)
{
    char *sets[32];
    size_t n = 0;
    for (size_t i = 0; i < 4; i++)
        sets[n++] = base_sets[i];
    for (size_t i = 0; i < extra_cnt; i++)
        sets[n++] = extra[i];
    return idem_conf_load(path, envp, sets, n, errstr, size);
}

static char *write_tmp(const char *dir, const char *name, const char *text)
{
    char *path = malloc(512);
    snprintf(path, 512, "%s/%s", dir, name);
    FILE *fp = fopen(path, "w");
    fputs(text, fp);
    fclose(fp);
    return path;
}

static char *dump(const idem_conf_t *conf)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *fp = open_memstream(&buf, &len);
    idem_conf_dump(conf, fp);
    fclose(fp);
    return buf;
}

Test(conf, defaults_are_documented_values)
{
    idem_conf_t *c = idem_conf_new();
    cr_assert_str_eq(c->redis_prefix, "idemproc:");
    cr_assert_eq(c->dedup_ttl_seconds, 86400);
    cr_assert_str_eq(c->handler, "ledger");
    idem_conf_destroy(c);
    idem_conf_destroy(NULL);
}

Test(conf, precedence_file_env_set)
{
    char *dir = th_tmpdir();
    char *path = write_tmp(dir, "p.properties",
                           "# comment\n! also a comment\n\n"
                           "batch.max.messages = 10\n"
                           "batch.max.wait.ms=11\n"
                           "commit.interval.ms=12\n");
    char *envp[] = {"IDEMPROC_BATCH_MAX_WAIT_MS=21",
                    "IDEMPROC_COMMIT_INTERVAL_MS=22", "PATH=/bin", NULL};
    char *extra[] = {"commit.interval.ms=33"};
    char err[512];
    idem_conf_t *c = load(path, envp, extra, 1, err, sizeof(err));
    cr_assert(c, "%s", err);
    cr_expect_eq(c->batch_max_messages, 10); /* file */
    cr_expect_eq(c->batch_max_wait_ms, 21);  /* env beats file */
    cr_expect_eq(c->commit_interval_ms, 33); /* --set beats env */
    idem_conf_destroy(c);
    th_rmrf(dir);
    free(dir);
    free(path);
}

Test(conf, kafka_passthrough_and_env_mapping)
{
    char *envp[] = {"IDEMPROC_KAFKA_SESSION_TIMEOUT_MS=6000", NULL};
    char *extra[] = {"kafka.fetch.wait.max.ms=10"};
    char err[512];
    idem_conf_t *c = load(NULL, envp, extra, 1, err, sizeof(err));
    cr_assert(c, "%s", err);
    char *d = dump(c);
    cr_expect(strstr(d, "kafka.session.timeout.ms=6000\n"), "%s", d);
    cr_expect(strstr(d, "kafka.fetch.wait.max.ms=10\n"), "%s", d);
    free(d);
    idem_conf_destroy(c);
}

Test(conf, secrets_from_files_are_never_printed)
{
    char *dir = th_tmpdir();
    char *pw = write_tmp(dir, "pw", "s3cr3t-redis\n");
    char *kpw = write_tmp(dir, "kpw", "s3cr3t-kafka");
    char set1[600], set2[600];
    snprintf(set1, sizeof(set1), "redis.password.file=%s", pw);
    snprintf(set2, sizeof(set2), "kafka.sasl.password.file=%s", kpw);
    char *extra[] = {set1, set2, "redis.url=redis://:inline-pw@127.0.0.1:1/0",
                     "kafka.sasl.username=user"};
    char err[512];
    idem_conf_t *c = load(NULL, NULL, extra, 4, err, sizeof(err));
    cr_assert(c, "%s", err);
    cr_expect_str_eq(c->redis_password, "s3cr3t-redis");
    char *d = dump(c);
    cr_expect_null(strstr(d, "s3cr3t"), "%s", d);
    cr_expect_null(strstr(d, "inline-pw"), "%s", d);
    cr_expect(strstr(d, "redis.password=[redacted]"), "%s", d);
    cr_expect(strstr(d, "kafka.sasl.password=[redacted]"), "%s", d);
    cr_expect(strstr(d, "kafka.sasl.username=user"), "%s", d);
    free(d);
    idem_conf_destroy(c);
    th_rmrf(dir);
    free(dir);
    free(pw);
    free(kpw);
}

/* A key whose own name ends in ".file" (a table key such as
 * redis.tls.ca.file, or one a handler declares: script.file,
 * webhook.ca.file) is that key, its value a path; for every other key,
 * <key>.file=PATH reads <key>'s value from PATH: table keys, handler keys
 * (webhook.headers, script.fields) and plugin.<key> alike, from the
 * environment too. */
Test(conf, declared_file_keys_win_over_the_file_rule)
{
    char *dir = th_tmpdir();
    char *fields = write_tmp(dir, "fields", "/sku,/qty\n");
    char *hdrs = write_tmp(dir, "hdrs", "Authorization: Bearer t0ken\n");
    char *tok = write_tmp(dir, "tok", "plugin-secret\n");
    char set_fields[600], set_hdrs[600], set_tok[600], env_file[600];
    snprintf(set_fields, sizeof(set_fields), "script.fields.file=%s", fields);
    snprintf(set_hdrs, sizeof(set_hdrs), "webhook.headers.file=%s", hdrs);
    snprintf(set_tok, sizeof(set_tok), "plugin.token.file=%s", tok);
    snprintf(env_file, sizeof(env_file), "IDEMPROC_SCRIPT_FILE=%s/x.lua", dir);
    char *envp[] = {env_file, NULL};
    char *extra[] = {"webhook.ca.file=/nonexistent/ca.pem", set_fields,
                     set_hdrs, set_tok};
    char err[512];
    idem_conf_t *c = load(NULL, envp, extra, 4, err, sizeof(err));
    cr_assert(c, "%s", err);
    /* Paths, not file contents (the files do not even exist). */
    char want[600];
    snprintf(want, sizeof(want), "%s/x.lua", dir);
    cr_expect_str_eq(idem_conf_str(c, "script.file"), want);
    cr_expect_str_eq(idem_conf_str(c, "webhook.ca.file"),
                     "/nonexistent/ca.pem");
    /* Read from the files, trailing newline removed. */
    cr_expect_str_eq(idem_conf_str(c, "script.fields"), "/sku,/qty");
    cr_expect_str_eq(idem_conf_str(c, "webhook.headers"),
                     "Authorization: Bearer t0ken");
    cr_expect_str_eq(idem_conf_str(c, "plugin.token"), "plugin-secret");
    idem_conf_destroy(c);
    /* A key that is neither: the file rule names the file's problem. */
    char *bad[] = {"script.fields.file=/nonexistent/f"};
    cr_expect_null(load(NULL, NULL, bad, 1, err, sizeof(err)));
    cr_expect(strstr(err, "script.fields.file"), "%s", err);
    th_rmrf(dir);
    free(dir);
    free(fields);
    free(hdrs);
    free(tok);
}

/* Data-driven error cases: each line of tests/data/conf_errors.txt is
 * "--set argument<TAB>substring the error must contain". */
Test(conf, every_error_names_key_and_problem)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/tests/data/conf_errors.txt", th_src());
    FILE *fp = fopen(path, "r");
    cr_assert(fp, "cannot open %s", path);
    char line[1024];
    int cases = 0;
    while (fgets(line, sizeof(line), fp)) {
        line[strcspn(line, "\n")] = '\0';
        if (!line[0] || line[0] == '#')
            continue;
        char *tab = strchr(line, '\t');
        cr_assert(tab, "bad line in %s: %s", path, line);
        *tab = '\0';
        char *extra[] = {line};
        char err[512] = "";
        idem_conf_t *c = load(NULL, NULL, extra, 1, err, sizeof(err));
        cr_expect_null(c, "accepted: %s", line);
        cr_expect(strstr(err, tab + 1), "for %s: got \"%s\", want \"%s\"", line,
                  err, tab + 1);
        idem_conf_destroy(c);
        cases++;
    }
    fclose(fp);
    cr_expect_gt(cases, 10);
}

Test(conf, missing_required_key)
{
    char err[512];
    char *sets[] = {"group.id=g"};
    idem_conf_t *c = idem_conf_load(NULL, NULL, sets, 1, err, sizeof(err));
    cr_assert_null(c);
    cr_expect(strstr(err, "kafka.bootstrap.servers: required"), "%s", err);
}

Test(conf, file_errors_name_file_and_line)
{
    char *dir = th_tmpdir();
    char *path = write_tmp(dir, "bad.properties", "group.id=g\nnot a pair\n");
    char err[512];
    idem_conf_t *c = load(path, NULL, NULL, 0, err, sizeof(err));
    cr_assert_null(c);
    cr_expect(strstr(err, "bad.properties:2: expected key=value"), "%s", err);
    free(path);
    /* librdkafka's verdict on a kafka.* key carries the file and line. */
    path = write_tmp(dir, "k.properties",
                     "group.id=g\n# comment\nkafka.socket.timeout.ms=abc\n");
    c = load(path, NULL, NULL, 0, err, sizeof(err));
    cr_assert_null(c);
    cr_expect(strstr(err, "k.properties:3: kafka.socket.timeout.ms: "), "%s",
              err);
    free(path);
    path = write_tmp(dir, "g.properties", "kafka.group.id=zzz\n");
    c = load(path, NULL, NULL, 0, err, sizeof(err));
    cr_assert_null(c);
    cr_expect(strstr(err, "g.properties:1: kafka.group.id: set by idemproc "
                          "itself, not configurable (use group.id)"),
              "%s", err);
    c = load("/nonexistent/x.properties", NULL, NULL, 0, err, sizeof(err));
    cr_assert_null(c);
    cr_expect(strstr(err, "/nonexistent/x.properties: cannot open"), "%s", err);
    th_rmrf(dir);
    free(dir);
    free(path);
}

Test(conf, unknown_environment_variable_is_an_error)
{
    char *envp[] = {"IDEMPROC_GROUPID=x", NULL};
    char err[512];
    idem_conf_t *c = load(NULL, envp, NULL, 0, err, sizeof(err));
    cr_assert_null(c);
    cr_expect(strstr(err, "IDEMPROC_GROUPID: environment variable names no "
                          "configuration key (did you mean "
                          "IDEMPROC_GROUP_ID?)"),
              "%s", err);
    char *far[] = {"IDEMPROC_XYZZY=1", NULL};
    c = load(NULL, far, NULL, 0, err, sizeof(err));
    cr_assert_null(c);
    cr_expect(strstr(err, "IDEMPROC_XYZZY: environment variable names no "
                          "configuration key (IDEMPROC_<KEY>"),
              "%s", err);
}

/* The README's configuration section must be what the table prints. */
Test(conf, readme_table_is_current)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/README.md", th_src());
    char *readme = th_slurp(path, NULL);
    cr_assert(readme, "cannot read %s", path);
    const char *begin_mark = "<!-- config-table:begin -->\n";
    char *b = strstr(readme, begin_mark);
    char *e = strstr(readme, "<!-- config-table:end -->");
    cr_assert(b && e && e > b, "README.md lacks the config-table markers");
    b += strlen(begin_mark);
    char *want = NULL;
    size_t len = 0;
    FILE *fp = open_memstream(&want, &len);
    idem_conf_print_markdown(fp);
    fclose(fp);
    cr_expect(len == (size_t)(e - b) && !memcmp(b, want, len),
              "README.md configuration table is stale: regenerate it with "
              "'build/idemproc help config-markdown'");
    free(want);
    free(readme);
}

/* The Kubernetes way: a mounted Secret named by IDEMPROC_<KEY>_FILE. */
Test(conf, secret_file_from_the_environment)
{
    char *dir = th_tmpdir();
    char *pw = write_tmp(dir, "pw", "from-a-secret\n");
    char var[600];
    snprintf(var, sizeof(var), "IDEMPROC_REDIS_PASSWORD_FILE=%s", pw);
    char *envp[] = {var, NULL};
    char err[512];
    idem_conf_t *c = load(NULL, envp, NULL, 0, err, sizeof(err));
    cr_assert(c, "%s", err);
    cr_expect_str_eq(c->redis_password, "from-a-secret");
    idem_conf_destroy(c);
    th_rmrf(dir);
    free(dir);
    free(pw);
}

/* A handler's keys come from its registry entry: set, validated, read,
 * dumped, listed by help, and suggested on a typo. */
Test(conf, handler_keys_come_from_the_registry)
{
    char err[512] = "";
    char *fwd[] = {"handler=forward", "output.topic=out"};
    idem_conf_t *c = load(NULL, NULL, fwd, 2, err, sizeof(err));
    cr_assert(c, "%s", err);
    cr_expect_eq(idem_conf_int(c, "forward.processed.at"), 0); /* default */
    char *d = dump(c);
    cr_expect(strstr(d, "forward.processed.at=false\n"), "%s", d);
    free(d);
    idem_conf_destroy(c);

    char *off[] = {"handler=forward", "output.topic=out",
                   "forward.processed.at=header"};
    c = load(NULL, NULL, off, 3, err, sizeof(err));
    cr_assert(c, "%s", err);
    cr_expect_eq(idem_conf_int(c, "forward.processed.at"), 2);
    cr_expect_str_eq(idem_conf_str(c, "forward.processed.at"), "header");
    idem_conf_destroy(c);

    /* From the environment, like the table's keys. */
    char *env[] = {"IDEMPROC_FORWARD_PROCESSED_AT=true", NULL};
    c = load(NULL, env, fwd, 2, err, sizeof(err));
    cr_assert(c, "%s", err);
    cr_expect_eq(idem_conf_int(c, "forward.processed.at"), 1);
    idem_conf_destroy(c);

    char *typo[] = {"forward.processed.att=true"};
    c = load(NULL, NULL, typo, 1, err, sizeof(err));
    cr_expect_null(c);
    cr_expect(strstr(err, "did you mean \"forward.processed.at\""), "%s", err);

    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    idem_conf_print_help(out);
    fclose(out);
    cr_expect(strstr(buf, "handler=forward: "), "%s", buf);
    cr_expect(strstr(buf, "  forward.processed.at"), "%s", buf);
    free(buf);
    out = open_memstream(&buf, &len);
    idem_conf_print_markdown(out);
    fclose(out);
    cr_expect(strstr(buf, "| `forward.processed.at` | one of: false, true, "
                          "header | `false` | with `handler=forward`: "),
              "%s", buf);
    free(buf);
}

/* The envelope keys: defaults as documented, bytes refused for the ledger
 * (it reads payment fields from JSON). */
Test(conf, envelope_keys)
{
    char err[512] = "";
    idem_conf_t *c = load(NULL, NULL, NULL, 0, err, sizeof(err));
    cr_assert(c, "%s", err);
    cr_expect_str_eq(c->envelope_identity,
                     "value:/idempotency_key,header:idempotency_key,"
                     "value:/message_id,header:message_id");
    cr_expect_str_eq(c->envelope_message_id,
                     "value:/message_id,header:message_id");
    idem_conf_destroy(c);
    char *bytes[] = {"envelope.format=bytes"};
    c = load(NULL, NULL, bytes, 1, err, sizeof(err));
    cr_expect_null(c);
    cr_expect(strstr(err, "envelope.format: handler=ledger"), "%s", err);
    char *fwd[] = {"envelope.format=bytes", "handler=forward",
                   "output.topic=out", "envelope.identity=key,header:id"};
    c = load(NULL, NULL, fwd, 4, err, sizeof(err));
    cr_expect(c, "%s", err);
    idem_conf_destroy(c);
}

/* Writes len bytes (NUL bytes included) to dir/name. */
static char *write_tmp_bytes(const char *dir, const char *name,
                             const char *bytes, size_t len)
{
    char *path = malloc(512);
    snprintf(path, 512, "%s/%s", dir, name);
    FILE *fp = fopen(path, "w");
    fwrite(bytes, 1, len, fp);
    fclose(fp);
    return path;
}

/* A NUL byte in a value, in the properties file or a secret file, is
 * refused with the file (and line): it used to cut the value short
 * without a word ("group.id=ab\0cd" ran as group "ab"). */
Test(conf, nul_bytes_in_values_are_refused)
{
    char *dir = th_tmpdir();
    static const char props[] = "dlq.topic=d\ngroup.id=ab\0cd\n";
    char *path =
        write_tmp_bytes(dir, "nul.properties", props, sizeof(props) - 1);
    char err[512];
    idem_conf_t *c = idem_conf_load(path, NULL, NULL, 0, err, sizeof(err));
    cr_expect_null(c, "loaded with group.id=%s", c ? c->group_id : "");
    idem_conf_destroy(c);
    cr_expect(strstr(err, "nul.properties:2: a NUL byte"), "%s", err);
    static const char secret[] = "s3cr\0t\n";
    char *pw = write_tmp_bytes(dir, "pw", secret, sizeof(secret) - 1);
    char set[600];
    snprintf(set, sizeof(set), "redis.password.file=%s", pw);
    char *extra[] = {set};
    c = load(NULL, NULL, extra, 1, err, sizeof(err));
    cr_expect_null(c, "loaded with redis.password=%s",
                   c ? c->redis_password : "");
    idem_conf_destroy(c);
    cr_expect(strstr(err, "redis.password.file: ") && strstr(err, "NUL byte"),
              "%s", err);
    cr_expect_null(strstr(err, "s3cr"), "%s", err);
    th_rmrf(dir);
    free(dir);
    free(path);
    free(pw);
}

/* Every key named *.ms or *.seconds takes a unit, as retry.topics does;
 * a bare number keeps the key's own unit. */
Test(conf, durations_take_a_unit)
{
    char err[512] = "";
    char *sets[] = {"commit.interval.ms=1s", "dedup.ttl.seconds=7d",
                    "dedup.lease.ms=2m",     "shutdown.timeout.ms=1500ms",
                    "health.stall.ms=45000", "handler=script",
                    "script.file=/dev/null", "script.timeout.ms=2s"};
    idem_conf_t *c = load(NULL, NULL, sets, 8, err, sizeof(err));
    if (!c) {
        /* script.file must compile; fall back to checking the core keys. */
        c = load(NULL, NULL, sets, 5, err, sizeof(err));
        cr_assert(c, "%s", err);
    } else {
        cr_expect_eq(idem_conf_int(c, "script.timeout.ms"), 2000);
    }
    cr_expect_eq(c->commit_interval_ms, 1000);
    cr_expect_eq(c->dedup_ttl_seconds, 7 * 86400);
    cr_expect_eq(c->dedup_lease_ms, 120000);
    cr_expect_eq(c->shutdown_timeout_ms, 1500);
    cr_expect_eq(c->health_stall_ms, 45000);
    idem_conf_destroy(c);
}

/* input.topics is parsed once, at finalize: trimmed names in order. */
Test(conf, input_topics_parsed_once)
{
    char err[512] = "";
    char *sets[] = {"input.topics= a , ^b.* ,c"};
    idem_conf_t *c = load(NULL, NULL, sets, 1, err, sizeof(err));
    cr_assert(c, "%s", err);
    cr_assert_eq(c->input_topic_cnt, 3);
    cr_expect_str_eq(c->input_topic[0], "a");
    cr_expect_str_eq(c->input_topic[1], "^b.*");
    cr_expect_str_eq(c->input_topic[2], "c");
    cr_expect_null(c->input_topic[3]);
    idem_conf_destroy(c);
}

/* Development keys live under dev.: out of help and the README, listed
 * by `help config-dev`, shown by check-config only when set. */
Test(conf, dev_keys_stay_out_of_production_help)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    idem_conf_print_help(out);
    fclose(out);
    cr_expect_null(strstr(buf, "fault."), "%s", buf);
    free(buf);
    out = open_memstream(&buf, &len);
    idem_conf_print_markdown(out);
    fclose(out);
    cr_expect_null(strstr(buf, "fault."), "%s", buf);
    free(buf);
    out = open_memstream(&buf, &len);
    idem_conf_print_help_dev(out, 1);
    fclose(out);
    cr_expect(strstr(buf, "dev.fault.fetch.pause"), "%s", buf);
    cr_expect_null(strstr(buf, "group.id"), "%s", buf);
    free(buf);

    char err[512] = "";
    idem_conf_t *c = load(NULL, NULL, NULL, 0, err, sizeof(err));
    cr_assert(c, "%s", err);
    char *d = dump(c);
    cr_expect_null(strstr(d, "fault."), "%s", d);
    free(d);
    idem_conf_destroy(c);
    char *sets[] = {"dev.fault.fetch.assign.fail=2"};
    c = load(NULL, NULL, sets, 1, err, sizeof(err));
    cr_assert(c, "%s", err);
    d = dump(c);
    cr_expect(strstr(d, "dev.fault.fetch.assign.fail=2\n"), "%s", d);
    free(d);
    idem_conf_destroy(c);
}

/* Where needle starts in hay, or -1. */
static long at(const char *hay, const char *needle)
{
    size_t n = strlen(needle);
    for (long i = 0; hay[i]; i++)
        if (!strncmp(hay + i, needle, n))
            return i;
    return -1;
}

/* check-config lists the keys of its command's scope, the ones set apart
 * from the defaults; the outbox's keys are not run's, and the reverse. */
Test(conf, dump_shows_scope_and_marks_what_is_set)
{
    char err[512] = "";
    char *sets[] = {"batch.max.messages=50"};
    idem_conf_t *c = load(NULL, NULL, sets, 1, err, sizeof(err));
    cr_assert(c, "%s", err);
    char *d = dump(c);
    long set = at(d, "# set (not the default)\n");
    long defaults = at(d, "# defaults\n");
    cr_assert(set >= 0 && defaults > set, "%s", d);
    long batch = at(d, "batch.max.messages=50\n");
    long group = at(d, "group.id=g\n");
    long prefix = at(d, "redis.prefix=idemproc:\n");
    cr_expect(batch > set && batch < defaults, "%s", d);
    cr_expect(group > set && group < defaults, "%s", d);
    cr_expect(prefix > defaults, "%s", d);
    cr_expect_null(strstr(d, "outbox."), "%s", d);
    cr_expect_null(strstr(d, "webhook.url"), "%s", d);
    free(d);
    idem_conf_destroy(c);

    char *osets[] = {"kafka.bootstrap.servers=127.0.0.1:9092",
                     "outbox.dsn=postgresql://u:p@h/db"};
    c = idem_conf_load_scope(NULL, NULL, osets, 2, IDEM_CONF_SCOPE_OUTBOX, err,
                             sizeof(err));
    cr_assert(c, "%s", err);
    d = dump(c);
    cr_expect(strstr(d, "outbox.dsn=[redacted]\n"), "%s", d);
    cr_expect(strstr(d, "outbox.table=idemproc_outbox\n"), "%s", d);
    cr_expect_null(strstr(d, "group.id"), "%s", d);
    cr_expect_null(strstr(d, "redis."), "%s", d);
    free(d);
    idem_conf_destroy(c);
}

/* A caller learns what kind of error it was from the class, not the
 * text: a missing required key is REQUIRED, a bad value INVALID. */
Test(conf, errors_carry_a_class)
{
    idem_conf_err_t err;
    char *none[] = {"group.id=g"};
    cr_expect_null(idem_conf_load_err(NULL, NULL, none, 1,
                                      IDEM_CONF_SCOPE_PROCESSOR, &err));
    cr_expect_eq(err.cls, IDEM_CONF_ERR_REQUIRED, "%s", err.str);
    cr_expect(strstr(err.str, "kafka.bootstrap.servers"), "%s", err.str);
    char *bad[] = {"kafka.bootstrap.servers=h:1", "group.id=g",
                   "input.topics=t", "dlq.topic=d", "batch.max.messages=0"};
    cr_expect_null(idem_conf_load_err(NULL, NULL, bad, 5,
                                      IDEM_CONF_SCOPE_PROCESSOR, &err));
    cr_expect_eq(err.cls, IDEM_CONF_ERR_INVALID, "%s", err.str);
    char *fwd[] = {"kafka.bootstrap.servers=h:1", "group.id=g",
                   "input.topics=t", "dlq.topic=d", "handler=forward"};
    cr_expect_null(idem_conf_load_err(NULL, NULL, fwd, 5,
                                      IDEM_CONF_SCOPE_PROCESSOR, &err));
    cr_expect_eq(err.cls, IDEM_CONF_ERR_REQUIRED, "%s", err.str);
    cr_expect(strstr(err.str, "output.topic: required when handler=forward"),
              "%s", err.str);
}

/* kafka.*.ms keys take units too: librdkafka itself would read "6s" as 6
 * ms and "1.5s" as 1 ms, and wrap "99999999999999d". */
Test(conf, kafka_durations_take_a_unit)
{
    char err[512] = "";
    char *sets[] = {"kafka.session.timeout.ms=6s",
                    "kafka.statistics.interval.ms=1m",
                    "kafka.fetch.wait.max.ms=10"};
    idem_conf_t *c = load(NULL, NULL, sets, 3, err, sizeof(err));
    cr_assert(c, "%s", err);
    int seen = 0;
    for (size_t i = 0; i < c->kafka_cnt; i++) {
        const char *n = c->kafka[i].name, *v = c->kafka[i].value;
        if (!strcmp(n, "session.timeout.ms")) {
            seen++;
            cr_expect_str_eq(v, "6000");
        }
        if (!strcmp(n, "statistics.interval.ms")) {
            seen++;
            cr_expect_str_eq(v, "60000");
        }
        if (!strcmp(n, "fetch.wait.max.ms")) {
            seen++;
            cr_expect_str_eq(v, "10");
        }
    }
    cr_expect_eq(seen, 3);
    /* past int64 is out of range, not "not a duration" */
    char *huge[] = {"health.stall.ms=999999999999d"};
    cr_expect_null(load(NULL, NULL, huge, 1, err, sizeof(err)));
    cr_expect(strstr(err, "health.stall.ms: \"999999999999d\" is out of range"),
              "%s", err);
    idem_conf_destroy(c);
    const char *bad[][2] = {
        {"kafka.session.timeout.ms=1.5s", "is not a duration"},
        {"kafka.session.timeout.ms=99999999999999d", "is out of range"},
        {"kafka.session.timeout.ms=25d", "is out of range"},
        {"kafka.session.timeout.ms=6 s", "is not a duration"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *one[] = {(char *)bad[i][0]};
        err[0] = '\0';
        c = load(NULL, NULL, one, 1, err, sizeof(err));
        cr_expect_null(c, "%s was taken", bad[i][0]);
        idem_conf_destroy(c);
        cr_expect(strstr(err, "kafka.session.timeout.ms: \"") &&
                      strstr(err, bad[i][1]),
                  "%s: %s", bad[i][0], err);
    }
}

/* dedup.scope=partition runs the ledger's effect in the partition chunk
 * script: any other handler is refused, naming it; global is the default. */
Test(conf, partition_scope_only_with_the_ledger)
{
    char err[512];
    idem_conf_t *c = load(NULL, NULL, NULL, 0, err, sizeof(err));
    cr_assert(c, "%s", err);
    cr_expect_eq(c->dedup_scope, IDEM_DEDUP_SCOPE_GLOBAL);
    cr_expect_eq(c->dedup_memory_max, 1073741824);
    idem_conf_destroy(c);
    char *ok[] = {"dedup.scope=partition", "dedup.memory.max=2097152"};
    c = load(NULL, NULL, ok, 2, err, sizeof(err));
    cr_assert(c, "%s", err);
    cr_expect_eq(c->dedup_scope, IDEM_DEDUP_SCOPE_PARTITION);
    cr_expect_eq(c->dedup_memory_max, 2097152);
    idem_conf_destroy(c);
    char *bad[] = {"dedup.scope=partition", "handler=forward",
                   "output.topic=out"};
    c = load(NULL, NULL, bad, 3, err, sizeof(err));
    cr_assert_null(c);
    cr_expect(strstr(err, "dedup.scope=partition: handler \"forward\""), "%s",
              err);
}

/* A directory given as the file (a mounted ConfigMap's folder instead of
 * its file) was read as an empty file: the error then named a required
 * key, never the path. A <key>.file that is a directory said "larger than
 * 64 KiB". */
Test(conf, a_directory_is_not_a_file)
{
    char *dir = th_tmpdir();
    char err[512];
    idem_conf_t *c = load(dir, NULL, NULL, 0, err, sizeof(err));
    cr_assert_null(c);
    cr_expect(strstr(err, dir) && strstr(err, "cannot read") &&
                  strstr(err, "Is a directory"),
              "%s", err);
    char set[600];
    snprintf(set, sizeof(set), "redis.password.file=%s", dir);
    char *extra[] = {set};
    c = load(NULL, NULL, extra, 1, err, sizeof(err));
    cr_assert_null(c);
    cr_expect(strstr(err, "redis.password") && strstr(err, "Is a directory"),
              "%s", err);
    th_rmrf(dir);
    free(dir);
}

/* Editors on Windows save UTF-8 with a byte order mark; the first key
 * then carried it and was "unknown (did you mean <the same key>?)". */
Test(conf, a_byte_order_mark_is_skipped)
{
    char *dir = th_tmpdir();
    char *path = write_tmp(dir, "bom.properties",
                           "\xef\xbb\xbf"
                           "batch.max.messages=10\n");
    char err[512];
    idem_conf_t *c = load(path, NULL, NULL, 0, err, sizeof(err));
    cr_assert(c, "%s", err);
    cr_expect_eq(c->batch_max_messages, 10);
    idem_conf_destroy(c);
    free(path);
    /* Only at the start of the file: elsewhere it is a byte of the key. */
    path = write_tmp(dir, "bom2.properties",
                     "batch.max.wait.ms=5\n\xef\xbb\xbf"
                     "batch.max.messages=10\n");
    c = load(path, NULL, NULL, 0, err, sizeof(err));
    cr_assert_null(c);
    cr_expect(strstr(err, "bom2.properties:2:"), "%s", err);
    th_rmrf(dir);
    free(dir);
    free(path);
}

/* A topic name Kafka refuses (a space, a colon, 250 characters) passed
 * the configuration: a real broker then answered the subscription with
 * an error and the member sat "ready", consuming nothing. Regexes are
 * patterns, not names, and keep their own check. */
Test(conf, topic_names_kafka_refuses_are_configuration_errors)
{
    char long_name[300];
    memset(long_name, 'a', 250);
    long_name[250] = '\0';
    char set_long[320];
    snprintf(set_long, sizeof(set_long), "input.topics=ok,%s", long_name);
    const char *bad[][2] = {
        {"input.topics=bad topic", "input.topics: \"bad topic\" is not a"},
        {"input.topics=a,pay:ments", "input.topics: \"pay:ments\" is not a"},
        {"input.topics=..", "input.topics: \"..\" is not a"},
        {set_long, "is not a valid Kafka topic name"},
        {"dlq.topic=dead letters", "dlq.topic: \"dead letters\" is not a"},
    };
    char err[512];
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *one[] = {(char *)bad[i][0]};
        err[0] = '\0';
        idem_conf_t *c = load(NULL, NULL, one, 1, err, sizeof(err));
        cr_expect_null(c, "%s was taken", bad[i][0]);
        idem_conf_destroy(c);
        cr_expect(strstr(err, bad[i][1]), "%s: %s", bad[i][0], err);
    }
    char *good[] = {"input.topics=Pay_ments-1.v2,^pay ments.*",
                    "dlq.topic=payments.dlq_1-x"};
    idem_conf_t *c = load(NULL, NULL, good, 2, err, sizeof(err));
    cr_assert(c, "%s", err);
    idem_conf_destroy(c);
}
