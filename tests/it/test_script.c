/* test_script (it): the composed dedup script run by a real redis-server
 * (EVALSHA as the handler sends it): effects and marks together,
 * duplicates, rejections, runtime errors, Redis's refusals as outages,
 * and every field of `rec`. */
#include "harness.h"
#include "handlers/luascript.h"

#include <criterion/criterion.h>
#include <hiredis.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static char *dir;
static th_redis_t rds;

static void script_fini(void)
{
    th_stack_cleanup();
    if (rds.dir)
        th_redis_stop(&rds);
    if (dir)
        th_rmrf(dir);
    free(dir);
    dir = NULL;
}

TestSuite(script, .fini = script_fini);

/* ---- the composed script in a real redis-server ---- */

static redisContext *rctx;
static char sha[41];
static idem_luascript_t *loaded;

/* Starts Redis (once per test) and loads `path` as script.file with
 * script.fields `fields` (NULL: none). */
static void redis_with_file_fields(const char *path, const char *fields)
{
    char err[1024] = "";
    loaded = idem_luascript_load(path, fields, err, sizeof(err));
    cr_assert(loaded, "%s", err);
    if (!rds.dir)
        cr_assert_eq(th_redis_start(&rds), 0);
    rctx = redisConnect("127.0.0.1", rds.port);
    cr_assert(rctx && !rctx->err);
    redisReply *r =
        redisCommand(rctx, "SCRIPT LOAD %s", idem_luascript_source(loaded));
    cr_assert(r && r->type == REDIS_REPLY_STRING, "%s",
              r ? r->str : rctx->errstr);
    snprintf(sha, sizeof(sha), "%s", r->str);
    freeReplyObject(r);
}

static void redis_with_file(const char *path)
{
    redis_with_file_fields(path, NULL);
}

static void redis_with(const char *text)
{
    redis_with_file(th_file_in(&dir, "fx.lua", text));
}

static void redis_done(void)
{
    redisFree(rctx);
    rctx = NULL;
    idem_luascript_destroy(loaded);
    loaded = NULL;
}

/* A record with identity id, message id mid (NULL: none) and value v
 * (NULL: a null value), no key, no headers, partition 3, offset 100. */
static idem_record_t rec_of(const char *id, const char *mid, const char *v)
{
    return (idem_record_t){.identity = id,
                           .identity_len = strlen(id),
                           .message_id = mid,
                           .message_id_len = mid ? strlen(mid) : 0,
                           .topic = "inventory",
                           .partition = 3,
                           .offset = 100,
                           .timestamp = 1700000000123,
                           .value = v,
                           .value_len = v ? strlen(v) : 0};
}

/* EVALSHA over recs[n] as idem_store_script_send sends it; returns the
 * reply (caller frees). */
static redisReply *eval(const idem_record_t *recs, size_t n)
{
    size_t per = idem_luascript_rec_args(loaded);
    size_t cap = 6 + n * per;
    const char **argv = calloc(cap, sizeof(*argv));
    size_t *lens = calloc(cap, sizeof(*lens));
    idem_luascript_scratch_t sb = {0};
    size_t a = 0;
    const char *fixed[] = {"EVALSHA", sha, "0", "t:", "g1", "600"};
    for (; a < 6; a++)
        argv[a] = fixed[a], lens[a] = strlen(fixed[a]);
    for (size_t i = 0; i < n; i++) {
        size_t k =
            idem_luascript_args(loaded, &recs[i], &sb, argv + a, lens + a);
        cr_assert_eq(k, per);
        a += k;
    }
    redisReply *r = redisCommandArgv(rctx, (int)a, argv, lens);
    cr_assert(r, "%s", rctx->errstr);
    idem_luascript_scratch_term(&sb);
    free(argv);
    free(lens);
    return r;
}

static char *get(const char *key)
{
    redisReply *r = redisCommand(rctx, "GET %s", key);
    cr_assert(r);
    char *v = r->type == REDIS_REPLY_STRING ? strdup(r->str) : NULL;
    freeReplyObject(r);
    return v;
}

static void expect_key(const char *key, const char *want)
{
    char *v = get(key);
    if (want)
        cr_expect(v && !strcmp(v, want), "%s = %s, want %s", key,
                  v ? v : "(nil)", want);
    else
        cr_expect_null(v, "%s = %s, want nil", key, v);
    free(v);
}

static const char *elem(redisReply *r, size_t i)
{
    cr_assert_eq(r->type, REDIS_REPLY_ARRAY, "reply type %d: %s", r->type,
                 r->type == REDIS_REPLY_ERROR ? r->str : "");
    cr_assert_lt(i, r->elements);
    return r->element[i]->str ? r->element[i]->str : "";
}

static const char inventory[] =
    "local function qty(rec)\n"
    "  local ev = cjson.decode(rec.value)\n"
    "  return ev.sku, tonumber(ev.qty)\n"
    "end\n"
    "function effect(rec)\n"
    "  local sku, q = qty(rec)\n"
    "  if not q then return false, 'qty missing' end\n"
    "  local left = redis.call('HINCRBY', 'stock', sku, -q)\n"
    "  if left < 0 then\n"
    "    redis.call('HINCRBY', 'stock', sku, q)\n"
    "    return false, 'out of stock: ' .. sku\n"
    "  end\n"
    "  if sku == 'boom' then local t = nil; return t.x end\n"
    "end\n";

Test(script, effect_and_mark_together_then_duplicates)
{
    redis_with(inventory);
    redisReply *s = redisCommand(rctx, "HSET stock a 10 b 1 boom 5");
    freeReplyObject(s);
    idem_record_t recs[] = {
        rec_of("e1", "m1", "{\"sku\":\"a\",\"qty\":3}"),
        rec_of("e2", "m2", "{\"sku\":\"b\",\"qty\":2}"),    /* rejected */
        rec_of("e1", "m1b", "{\"sku\":\"a\",\"qty\":3}"),   /* dup, same call */
        rec_of("e3", "m3", "{\"sku\":\"boom\",\"qty\":1}"), /* error */
        rec_of("e4", "m4", "{\"sku\":\"a\"}"),              /* rejected */
        rec_of("e2", "m2", "{\"sku\":\"b\",\"qty\":1}"),    /* retried: ok */
    };
    redisReply *r = eval(recs, 6);
    cr_assert_eq(r->elements, 6);
    cr_expect_str_eq(elem(r, 0), "");
    cr_expect_str_eq(elem(r, 1), "reject:out of stock: b");
    cr_expect_str_eq(elem(r, 2), "done:m1");
    /* The error names the file's line 13. */
    char want[600];
    snprintf(want, sizeof(want),
             "reject:lua error: %s:13: attempt to index local 't' (a nil "
             "value)",
             idem_luascript_path(loaded));
    cr_expect_str_eq(elem(r, 3), want);
    cr_expect_str_eq(elem(r, 4), "reject:qty missing");
    cr_expect_str_eq(elem(r, 5), "");
    freeReplyObject(r);
    redisReply *h = redisCommand(rctx, "HMGET stock a b boom");
    cr_expect_str_eq(h->element[0]->str, "7");
    cr_expect_str_eq(h->element[1]->str, "0");
    /* Writes before a runtime error stay (Redis has no rollback). */
    cr_expect_str_eq(h->element[2]->str, "4");
    freeReplyObject(h);
    expect_key("t:dedup:g1:e1", "done:m1");
    expect_key("t:dedup:g1:e2", "done:m2");
    expect_key("t:dedup:g1:e3", NULL);
    expect_key("t:dedup:g1:e4", NULL);
    redisReply *ttl = redisCommand(rctx, "TTL t:dedup:g1:e1");
    cr_expect(ttl->integer > 590 && ttl->integer <= 600);
    freeReplyObject(ttl);

    /* Again: every applied one is a duplicate, nothing is applied twice. */
    r = eval(recs, 2);
    cr_expect_str_eq(elem(r, 0), "done:m1");
    cr_expect_str_eq(elem(r, 1), "done:m2");
    freeReplyObject(r);
    h = redisCommand(rctx, "HGET stock a");
    cr_expect_str_eq(h->str, "7");
    freeReplyObject(h);
    redis_done();
}

Test(script, rec_has_every_field)
{
    redis_with("function effect(rec)\n"
               "  local h = {}\n"
               "  for k, v in pairs(rec.headers) do\n"
               "    h[#h + 1] = k .. '=' .. tostring(v)\n"
               "  end\n"
               "  table.sort(h)\n"
               "  redis.call('RPUSH', 'seen', cjson.encode({\n"
               "    id = rec.identity, mid = rec.message_id or 'nil',\n"
               "    topic = rec.topic, p = rec.partition,\n"
               "    o = string.format('%.0f', rec.offset),\n"
               "    ts = rec.timestamp or 'nil', key = rec.key or 'nil',\n"
               "    value = rec.value or 'nil', idlen = #rec.identity,\n"
               "    h = table.concat(h, ',')}))\n"
               "end\n");
    rd_kafka_headers_t *hdrs = rd_kafka_headers_new(4);
    rd_kafka_header_add(hdrs, "idempotency_key", -1, "k\0x", 3);
    rd_kafka_header_add(hdrs, "trace", -1, "t1", 2);
    rd_kafka_header_add(hdrs, "empty", -1, NULL, 0);
    rd_kafka_header_add(hdrs, "trace", -1, "t2", 2);
    idem_record_t a = rec_of("k\0x", "m-1", "v1");
    a.identity_len = 3; /* a NUL byte is data */
    a.key = "order-7";
    a.key_len = 7;
    a.offset = 9007199254740000;
    a.headers = hdrs;
    idem_record_t b = rec_of("k2", NULL, NULL);
    b.timestamp = -1;
    b.partition = 0;
    idem_record_t recs[] = {a, b};
    redisReply *r = eval(recs, 2);
    rd_kafka_headers_destroy(hdrs);
    cr_expect_str_eq(elem(r, 0), "");
    cr_expect_str_eq(elem(r, 1), "");
    freeReplyObject(r);
    redisReply *l = redisCommand(rctx, "LRANGE seen 0 -1");
    cr_assert_eq(l->elements, 2);
    json_error_t je;
    json_t *x = json_loads(l->element[0]->str, JSON_ALLOW_NUL, &je);
    cr_assert(x, "%s", l->element[0]->str);
    cr_expect_eq(json_integer_value(json_object_get(x, "idlen")), 3);
    cr_expect_str_eq(json_string_value(json_object_get(x, "mid")), "m-1");
    cr_expect_str_eq(json_string_value(json_object_get(x, "topic")),
                     "inventory");
    cr_expect_eq(json_integer_value(json_object_get(x, "p")), 3);
    cr_expect_str_eq(json_string_value(json_object_get(x, "o")),
                     "9007199254740000");
    cr_expect_eq(json_integer_value(json_object_get(x, "ts")), 1700000000123);
    cr_expect_str_eq(json_string_value(json_object_get(x, "key")), "order-7");
    cr_expect_str_eq(json_string_value(json_object_get(x, "value")), "v1");
    /* A repeated header: the last one; no value: false. */
    json_t *hj = json_object_get(x, "h");
    const char *h = json_string_value(hj);
    size_t hl = json_string_length(hj);
    static const char want_h[] = "empty=false,idempotency_key=k\0x,trace=t2";
    cr_expect(h && hl == sizeof(want_h) - 1 && !memcmp(h, want_h, hl), "%s",
              l->element[0]->str);
    json_decref(x);
    x = json_loads(l->element[1]->str, 0, &je);
    cr_assert(x);
    cr_expect_str_eq(json_string_value(json_object_get(x, "mid")), "nil");
    cr_expect_str_eq(json_string_value(json_object_get(x, "ts")), "nil");
    cr_expect_str_eq(json_string_value(json_object_get(x, "key")), "nil");
    cr_expect_str_eq(json_string_value(json_object_get(x, "value")), "nil");
    cr_expect_str_eq(json_string_value(json_object_get(x, "h")), "");
    json_decref(x);
    freeReplyObject(l);
    /* The mark of a record without a message id. */
    expect_key("t:dedup:g1:k2", "done:");
    redis_done();
}

/* ---- script.fields: values the member already parsed ---- */

/* An envelope of `value` read into *env with identity value:/id and the
 * fields `list`, as the loop reads it; the record view points into it. */
static idem_record_t rec_with_fields(const char *list, const char *value,
                                     idem_envelope_t *env)
{
    char err[256] = "";
    idem_envelope_rules_t *rules = idem_envelope_rules_new(
        IDEM_ENVELOPE_JSON, "value:/id", IDEM_ENVELOPE_MESSAGE_ID_DEFAULT, 0,
        1 << 20, err, sizeof(err));
    cr_assert(rules, "%s", err);
    cr_assert_eq(idem_envelope_rules_fields(rules, "script.fields", list, err,
                                            sizeof(err)),
                 0, "%s", err);
    idem_reason_t reason;
    cr_assert_eq(idem_envelope_read(rules, value, strlen(value), NULL, NULL, 0,
                                    env, &reason, err, sizeof(err)),
                 0, "%s", err);
    idem_envelope_rules_destroy(rules);
    idem_record_t r = rec_of(env->identity, "m", value);
    r.env = env;
    return r;
}

#define FIELDS_LIST                                                            \
    "/s,/n,/i,/big,/t,/f,/z,/o,/a,/missing,/nest/x,/a~1b,/a/1,/x~0y"

/* rec.fields[p] is what cjson.decode(rec.value) gives at p, for every JSON
 * type; a pointer not listed in script.fields is an error at the user's
 * line, not a silent nil (one computed at run time: a literal one is
 * refused at load, tests/unit/test_script.c). */
Test(script, fields_are_what_cjson_decode_gives)
{
    const char *path = th_file_in(
        &dir, "fields.lua",
        "local P = {'/s', '/n', '/i', '/big', '/t', '/f', '/z', '/o', '/a',\n"
        "  '/missing', '/nest/x', '/a~1b', '/a/1', '/x~0y'}\n"
        "local function at(v, p)\n"
        "  for tok in string.gmatch(p, '/([^/]*)') do\n"
        "    tok = string.gsub(string.gsub(tok, '~1', '/'), '~0', '~')\n"
        "    if type(v) ~= 'table' then return nil end\n"
        "    if #v > 0 then v = v[tonumber(tok) + 1] else v = v[tok] end\n"
        "  end\n"
        "  return v\n"
        "end\n"
        "local function same(a, b)\n"
        "  if type(a) ~= type(b) then return false end\n"
        "  if type(a) ~= 'table' then return a == b end\n"
        "  for k, x in pairs(a) do if not same(x, b[k]) then return false end "
        "end\n"
        "  for k, x in pairs(b) do if not same(x, a[k]) then return false end "
        "end\n"
        "  return true\n"
        "end\n"
        "function effect(rec)\n"
        "  if rec.identity == 'typo' then return rec.fields['/' .. 'sku'] "
        "end\n"
        "  local ev, bad = cjson.decode(rec.value), {}\n"
        "  for _, p in ipairs(P) do\n"
        "    if not same(rec.fields[p], at(ev, p)) then\n"
        "      bad[#bad + 1] = p .. '=' .. tostring(rec.fields[p])\n"
        "    end\n"
        "  end\n"
        "  if rec.fields['/missing'] ~= nil then bad[#bad + 1] = 'missing' "
        "end\n"
        "  if rec.identity == 'f1' and rec.fields['/z'] ~= cjson.null then\n"
        "    bad[#bad + 1] = 'null'\n"
        "  end\n"
        "  if #bad > 0 then return false, table.concat(bad, ' ') end\n"
        "  redis.call('SET', 'ok:' .. rec.identity, rec.fields['/s'])\n"
        "end\n");
    redis_with_file_fields(path, " " FIELDS_LIST " ");
    idem_record_t recs[3];
    idem_envelope_t envs[3] = {0};
    recs[0] = rec_with_fields(
        FIELDS_LIST,
        "{\"id\":\"f1\",\"s\":\"h\\u00e9llo \\\"q\\\"\",\"n\":12.35,\"i\":-7,"
        "\"big\":9007199254740993,\"t\":true,\"f\":false,\"z\":null,"
        "\"o\":{\"k\":[1,2.5,\"x\"],\"e\":{}},\"a\":[1,\"two\",null],"
        "\"nest\":{\"x\":\"deep\"},\"a/b\":0.1,\"x~y\":1e300}",
        &envs[0]);
    recs[1] =
        rec_with_fields(FIELDS_LIST, "{\"id\":\"f2\",\"s\":\"\"}", &envs[1]);
    recs[2] = rec_with_fields(FIELDS_LIST, "{\"id\":\"typo\"}", &envs[2]);
    redisReply *r = eval(recs, 3);
    cr_expect_str_eq(elem(r, 0), "");
    cr_expect_str_eq(elem(r, 1), "");
    char want[700];
    snprintf(want, sizeof(want),
             "reject:lua error: %s:19: rec.fields[\"/sku\"]: not in "
             "script.fields (/s,/n,/i,/big,/t,/f,/z,/o,/a,/missing,/nest/x,"
             "/a~1b,/a/1,/x~0y)",
             path);
    cr_expect_str_eq(elem(r, 2), want);
    freeReplyObject(r);
    expect_key("ok:f1", "h\xc3\xa9llo \"q\"");
    expect_key("ok:f2", "");
    for (size_t i = 0; i < 3; i++)
        idem_envelope_term(&envs[i]);
    redis_done();
}

/* Without script.fields, rec.fields names the key to set (a pointer
 * computed at run time: a literal one is refused at load). */
Test(script, fields_without_script_fields_say_so)
{
    redis_with("function effect(rec)\n"
               "  return rec.fields['/q' .. 'ty']\n"
               "end\n");
    idem_record_t recs[] = {rec_of("n1", "m", "{}")};
    redisReply *r = eval(recs, 1);
    char want[700];
    snprintf(want, sizeof(want),
             "reject:lua error: %s:2: rec.fields[\"/qty\"]: not in "
             "script.fields ()",
             idem_luascript_path(loaded));
    cr_expect_str_eq(elem(r, 0), want);
    freeReplyObject(r);
    redis_done();
}

/* rec is filled on first use: what the effect assigns wins, members it
 * never reads cost nothing, and every member reads the same as before. */
Test(script, rec_members_are_read_on_first_use)
{
    redis_with("function effect(rec)\n"
               "  local first = rawget(rec, 'value')\n"
               "  rec.topic = 'mine'\n"
               "  local v1, v2 = rec.value, rec.value\n"
               "  redis.call('RPUSH', 'l', tostring(first), v1, v2,\n"
               "    rec.topic, tostring(rawget(rec, 'headers')),\n"
               "    tostring(rec.nothing))\n"
               "end\n");
    idem_record_t recs[] = {rec_of("z1", "m", "val")};
    redisReply *r = eval(recs, 1);
    cr_expect_str_eq(elem(r, 0), "");
    freeReplyObject(r);
    redisReply *l = redisCommand(rctx, "LRANGE l 0 -1");
    cr_assert_eq(l->elements, 6);
    const char *want[] = {"nil", "val", "val", "mine", "nil", "nil"};
    for (size_t i = 0; i < 6; i++)
        cr_expect_str_eq(l->element[i]->str, want[i], "element %zu", i);
    freeReplyObject(l);
    redis_done();
}

Test(script, return_values)
{
    redis_with("function effect(rec)\n"
               "  local v = rec.value\n"
               "  if v == 'true' then return true end\n"
               "  if v == 'false' then return false end\n"
               "  if v == 'nilreason' then return nil, 'why' end\n"
               "  if v == 'number' then return false, 42 end\n"
               "  if v == 'reply' then return redis.error_reply('bad') end\n"
               "  if v == 'table' then error({code = 1}) end\n"
               "  if v == 'errtab' then error({err = 'E1'}) end\n"
               "  if v == 'long' then return false, string.rep('x', 5000) end\n"
               "  if v == 'tabreason' then return false, {code = 1} end\n"
               "  if v == 'boolreason' then return nil, true end\n"
               "end\n");
    idem_record_t recs[] = {
        rec_of("r1", "m", "true"),        rec_of("r2", "m", "false"),
        rec_of("r3", "m", "nilreason"),   rec_of("r4", "m", "number"),
        rec_of("r5", "m", "reply"),       rec_of("r6", "m", "table"),
        rec_of("r7", "m", "errtab"),      rec_of("r8", "m", "long"),
        rec_of("r9", "m", "other"),       rec_of("r10", "m", "tabreason"),
        rec_of("r11", "m", "boolreason"),
    };
    redisReply *r = eval(recs, 11);
    cr_expect_str_eq(elem(r, 0), "");
    cr_expect_str_eq(elem(r, 1), "reject:effect returned false");
    cr_expect_str_eq(elem(r, 2), "reject:why");
    cr_expect_str_eq(elem(r, 3), "reject:42");
    cr_expect_str_eq(elem(r, 4), "reject:ERR bad");
    /* a table has no text: its type, not "table: 0x7f..." */
    cr_expect_str_eq(elem(r, 5),
                     "reject:lua error: a non-string error (table)");
    cr_expect_str_eq(elem(r, 6), "reject:lua error: E1");
    cr_expect_eq(strlen(elem(r, 7)), 7 + 500);
    cr_expect_str_eq(elem(r, 8), "");
    cr_expect_str_eq(elem(r, 9),
                     "reject:effect returned a non-string reason (table)");
    cr_expect_str_eq(elem(r, 10),
                     "reject:effect returned a non-string reason (boolean)");
    freeReplyObject(r);
    redis_done();
}

/* A command error the effect did not catch rejects with the user's line;
 * one it caught with redis.pcall is its own business. */
Test(script, command_errors_belong_to_the_record)
{
    redis_with("function effect(rec)\n"
               "  if rec.value == 'caught' then\n"
               "    local r = redis.pcall('INCR', 'str')\n"
               "    redis.call('SET', 'caught', r.err)\n"
               "    return\n"
               "  end\n"
               "  redis.call('INCR', 'str')\n"
               "end\n");
    freeReplyObject(redisCommand(rctx, "SET str abc"));
    idem_record_t recs[] = {rec_of("c1", "m", "raise"),
                            rec_of("c2", "m", "caught")};
    redisReply *r = eval(recs, 2);
    char want[600];
    snprintf(want, sizeof(want),
             "reject:lua error: %s:7: ERR value is not an integer or out of "
             "range",
             idem_luascript_path(loaded));
    cr_expect_str_eq(elem(r, 0), want);
    cr_expect_str_eq(elem(r, 1), "");
    freeReplyObject(r);
    expect_key("caught", "ERR value is not an integer or out of range");
    redis_done();
}

/* Redis refusing a write because of its state is an outage: the script
 * fails as a whole with Redis's error, even when the effect catches it. */
Test(script, server_refusals_are_outages)
{
    redis_with("function effect(rec)\n"
               "  if rec.value == 'swallow' then\n"
               "    local ok = pcall(redis.call, 'SET', 'a', '1')\n"
               "    redis.pcall('SET', 'b', '1')\n"
               "    return false, 'caught it'\n"
               "  end\n"
               "  redis.call('SET', 'a', '1')\n"
               "end\n");
    freeReplyObject(redisCommand(rctx, "CONFIG SET maxmemory 1"));
    const char *modes[] = {"plain", "swallow"};
    for (int i = 0; i < 2; i++) {
        idem_record_t recs[] = {rec_of("o1", "m", modes[i])};
        redisReply *r = eval(recs, 1);
        cr_expect_eq(r->type, REDIS_REPLY_ERROR, "%s: type %d", modes[i],
                     r->type);
        if (r->type == REDIS_REPLY_ERROR)
            cr_expect(!strncmp(r->str, "OOM ", 4), "%s: %s", modes[i], r->str);
        freeReplyObject(r);
    }
    freeReplyObject(redisCommand(rctx, "CONFIG SET maxmemory 0"));
    expect_key("t:dedup:g1:o1", NULL);
    idem_record_t recs[] = {rec_of("o1", "m", "plain")};
    redisReply *r = eval(recs, 1);
    cr_expect_str_eq(elem(r, 0), "");
    freeReplyObject(r);
    expect_key("a", "1");
    expect_key("t:dedup:g1:o1", "done:m");
    redis_done();
}

/* A lease of the claim protocol (another handler in the same group) is
 * returned as found, without running the effect. */
Test(script, lease_is_busy)
{
    redis_with("function effect(rec) redis.call('SET', 'ran', '1') end\n");
    freeReplyObject(redisCommand(rctx, "SET t:dedup:g1:l1 lease:m1:3:mid PX "
                                       "60000"));
    idem_record_t recs[] = {rec_of("l1", "m", "v")};
    redisReply *r = eval(recs, 1);
    cr_expect_str_eq(elem(r, 0), "lease:m1:3:mid");
    freeReplyObject(r);
    expect_key("ran", NULL);
    redis_done();
}

/* 1000 records (a chunk), each a distinct identity. */
Test(script, full_chunk)
{
    redis_with("function effect(rec) redis.call('INCR', 'n') end\n");
    enum { N = 1000 };
    static char ids[N][16];
    static idem_record_t recs[N];
    for (int i = 0; i < N; i++) {
        snprintf(ids[i], sizeof(ids[i]), "id%d", i);
        recs[i] = rec_of(ids[i], ids[i], "v");
    }
    redisReply *r = eval(recs, N);
    cr_assert_eq(r->elements, N);
    freeReplyObject(r);
    expect_key("n", "1000");
    redis_done();
}

/* A file name with quotes, a backslash and a non-ASCII byte still names
 * the file in a runtime error (it is embedded in the script as a Lua
 * string). */
Test(script, odd_file_name_in_errors)
{
    const char *path = th_file_in(&dir, "we\"ird\\ \xc3\xa9.lua",
                                  "function effect(rec)\n  error('no')\nend\n");
    redis_with_file(path);
    idem_record_t recs[] = {rec_of("x1", "m", "v")};
    redisReply *r = eval(recs, 1);
    char want[700];
    snprintf(want, sizeof(want), "reject:lua error: %s:2: no", path);
    cr_expect_str_eq(elem(r, 0), want);
    freeReplyObject(r);
    redis_done();
}

/* ---- idem.*: counters summed per chunk ---- */

static char *hget(const char *key, const char *field)
{
    redisReply *r = redisCommand(rctx, "HGET %s %s", key, field);
    cr_assert(r);
    char *v = r->type == REDIS_REPLY_STRING ? strdup(r->str) : NULL;
    freeReplyObject(r);
    return v;
}

static void expect_hkey(const char *key, const char *field, const char *want)
{
    char *v = hget(key, field);
    if (want)
        cr_expect(v && !strcmp(v, want), "%s %s = %s, want %s", key, field,
                  v ? v : "(nil)", want);
    else
        cr_expect_null(v, "%s %s = %s, want nil", key, field, v);
    free(v);
}

/* Increments of accepted records land once, summed; those of a record the
 * effect rejects, or that raises after staging them, never land; a
 * duplicate in the same chunk runs nothing. */
Test(script, idem_increments_of_accepted_records_only)
{
    redis_with("function effect(rec)\n"
               "  idem.hincrby('h', rec.value, 2)\n"
               "  idem.incrby('c', '3')\n"
               "  idem.hincrbyfloat('hf', 'x', 0.25)\n"
               "  idem.incrbyfloat('f', 1.5)\n"
               "  if rec.identity == 'no' then return false, 'refused' end\n"
               "  if rec.identity == 'boom' then error('boom') end\n"
               "end\n");
    freeReplyObject(redisCommand(rctx, "HSET h a 10"));
    idem_record_t recs[] = {
        rec_of("i1", "m1", "a"),  rec_of("no", "m2", "a"),
        rec_of("i2", "m3", "b"),  rec_of("boom", "m4", "a"),
        rec_of("i1", "m1b", "a"), /* a duplicate of i1 in the chunk */
        rec_of("i3", "m5", "a"),
    };
    redisReply *r = eval(recs, 6);
    cr_assert_eq(r->elements, 6);
    cr_expect_str_eq(elem(r, 0), "");
    cr_expect_str_eq(elem(r, 1), "reject:refused");
    cr_expect_str_eq(elem(r, 2), "");
    char want[600];
    snprintf(want, sizeof(want), "reject:lua error: %s:7: boom",
             idem_luascript_path(loaded));
    cr_expect_str_eq(elem(r, 3), want);
    cr_expect_str_eq(elem(r, 4), "done:m1");
    cr_expect_str_eq(elem(r, 5), "");
    freeReplyObject(r);
    expect_hkey("h", "a", "14");
    expect_hkey("h", "b", "2");
    expect_key("c", "9");
    expect_hkey("hf", "x", "0.75");
    expect_key("f", "4.5");
    expect_key("t:dedup:g1:i1", "done:m1");
    expect_key("t:dedup:g1:i3", "done:m5");
    expect_key("t:dedup:g1:no", NULL);
    expect_key("t:dedup:g1:boom", NULL);
    /* Again: all duplicates, nothing lands twice. */
    r = eval(recs, 6);
    cr_expect_str_eq(elem(r, 0), "done:m1");
    cr_expect_str_eq(elem(r, 5), "done:m5");
    freeReplyObject(r);
    expect_hkey("h", "a", "14");
    expect_key("c", "9");
    expect_key("f", "4.5");
    redis_done();
}

/* idem.hget and idem.get see Redis's value plus every pending increment
 * of the chunk, the record's own included. The effect makes a plain write
 * (RPUSH), so the chunk is eager: each accepted record's sums are written
 * after its effect, and a plain HGET sees the earlier records' sums (not
 * the current record's pending ones). */
Test(script, idem_reads_see_pending_increments)
{
    redis_with(
        "function effect(rec)\n"
        "  local q = tonumber(rec.value)\n"
        "  local have = idem.hget('stock', 'apple') or 0\n"
        "  if have + q < 0 then\n"
        "    return false, 'have ' .. have .. ', plain ' ..\n"
        "      tostring(redis.call('HGET', 'stock', 'apple'))\n"
        "  end\n"
        "  idem.hincrby('stock', 'apple', q)\n"
        "  idem.incrby('n', 1)\n"
        "  redis.call('RPUSH', 'seen', idem.hget('stock', 'apple') ..\n"
        "    '/' .. idem.get('n') .. '/' .. tostring(idem.get('none')))\n"
        "end\n");
    freeReplyObject(redisCommand(rctx, "HSET stock apple 10"));
    idem_record_t recs[] = {
        rec_of("s1", "m", "-6"),
        rec_of("s2", "m", "-6"), /* would overdraw: 4 left */
        rec_of("s3", "m", "3"),
        rec_of("s4", "m", "-7"), /* exactly what is left */
        rec_of("s5", "m", "-1"),
    };
    redisReply *r = eval(recs, 5);
    cr_expect_str_eq(elem(r, 0), "");
    cr_expect_str_eq(elem(r, 1), "reject:have 4, plain 4");
    cr_expect_str_eq(elem(r, 2), "");
    cr_expect_str_eq(elem(r, 3), "");
    cr_expect_str_eq(elem(r, 4), "reject:have 0, plain 0");
    freeReplyObject(r);
    expect_hkey("stock", "apple", "0");
    expect_key("n", "3");
    redisReply *l = redisCommand(rctx, "LRANGE seen 0 -1");
    cr_assert_eq(l->elements, 3);
    cr_expect_str_eq(l->element[0]->str, "4/1/nil");
    cr_expect_str_eq(l->element[1]->str, "7/2/nil");
    cr_expect_str_eq(l->element[2]->str, "0/3/nil");
    freeReplyObject(l);
    redis_done();
}

/* Increments Redis would refuse are refused by the helper, at the
 * effect's line, as a rejection of the record. */
Test(script, idem_bad_increments_reject_with_a_reason)
{
    redis_with("function effect(rec)\n"
               "  local v = rec.value\n"
               "  if v == 'half' then idem.hincrby('h', 'a', 1.5) end\n"
               "  if v == 'text' then idem.incrby('c', 'abc') end\n"
               "  if v == 'lead0' then idem.incrby('c', '01') end\n"
               "  if v == 'big' then idem.incrby('c', 2^60) end\n"
               "  if v == 'nokey' then idem.incrby(nil, 1) end\n"
               "  if v == 'tfield' then idem.hincrby('h', {}, 1) end\n"
               "  if v == 'inf' then idem.incrbyfloat('f', 1/0) end\n"
               "  if v == 'mix' then\n"
               "    idem.hincrby('h', 'a', 1)\n"
               "    idem.hincrbyfloat('h', 'a', 1)\n"
               "  end\n"
               "  if v == 'notnum' then idem.hincrbyfloat('t', 'x', 1) end\n"
               "  if v == 'hgettext' then idem.hget('t', 'x') end\n"
               "  if v == 'type' then idem.get('t') end\n"
               "  if v == 'sum' then\n"
               "    idem.incrby('c', 2^53 - 1)\n"
               "    idem.incrby('c', 1)\n"
               "  end\n"
               "  if v == 'ok' then idem.incrby('c', '-12') end\n"
               "end\n");
    freeReplyObject(redisCommand(rctx, "HSET t x abc"));
    static const char *const cases[][2] = {
        {"half", "3: idem.hincrby: increment 1.5 is not an integer"},
        {"text", "4: idem.incrby: increment \"abc\" is not an integer"},
        {"lead0", "5: idem.incrby: increment \"01\" is not an integer"},
        {"big", "6: idem.incrby: increment 1152921504606846976 is beyond "
                "2^53 - 1"},
        {"nokey", "7: idem.incrby: key must be a string, not nil"},
        {"tfield", "8: idem.hincrby: field must be a string, not table"},
        {"inf", "9: idem.incrbyfloat: increment inf is not a finite number"},
        {"mix", "12: idem.hincrbyfloat: h a has integer increments pending "
                "in this chunk: use one kind per counter"},
        {"notnum", "14: idem.hincrbyfloat: t x holds \"abc\", not a number"},
        {"hgettext", "15: idem.hget: t x holds \"abc\", not a number"},
        {"type", "16: WRONGTYPE"},
        {"sum", "19: idem.incrby: the pending increments of c add up "
                "beyond 2^53 - 1"},
        {"ok", NULL},
    };
    enum { N = sizeof(cases) / sizeof(cases[0]) };
    idem_record_t recs[N];
    char ids[N][8];
    for (size_t i = 0; i < N; i++) {
        snprintf(ids[i], sizeof(ids[i]), "b%zu", i);
        recs[i] = rec_of(ids[i], "m", cases[i][0]);
    }
    redisReply *r = eval(recs, N);
    for (size_t i = 0; i < N; i++) {
        if (!cases[i][1]) {
            cr_expect_str_eq(elem(r, i), "", "%s", cases[i][0]);
            continue;
        }
        char want[700];
        snprintf(want, sizeof(want), "reject:lua error: %s:%s",
                 idem_luascript_path(loaded), cases[i][1]);
        cr_expect(!strncmp(elem(r, i), want, strlen(want)),
                  "%s: %s\nwant %s...", cases[i][0], elem(r, i), want);
    }
    freeReplyObject(r);
    /* Only the accepted record's increment landed. */
    expect_key("c", "-12");
    expect_hkey("h", "a", NULL);
    expect_key("f", NULL);
    redis_done();
}

/* A sum Redis refuses when it is written (the key holds another type, the
 * field no integer, the total would overflow) rejects every record that
 * staged into it, with Redis's error; their other increments do not land
 * and the rest of the chunk is applied. */
Test(script, idem_refused_sum_rejects_its_records)
{
    redis_with("function effect(rec)\n"
               "  idem.incrby('n', 1)\n"
               "  if rec.value ~= '' then idem.hincrby(rec.value, 'f', 1) end\n"
               "end\n");
    freeReplyObject(redisCommand(rctx, "SET str x"));
    freeReplyObject(redisCommand(rctx, "HSET txt f abc"));
    freeReplyObject(redisCommand(rctx, "HSET big f 9223372036854775807"));
    freeReplyObject(redisCommand(rctx, "SET n 100"));
    idem_record_t recs[] = {
        rec_of("r1", "m1", "ok"),  rec_of("r2", "m2", "str"),
        rec_of("r3", "m3", "txt"), rec_of("r4", "m4", "big"),
        rec_of("r5", "m5", "ok"),  rec_of("r2", "m2b", "str"),
        rec_of("r6", "m6", ""),
    };
    redisReply *r = eval(recs, 7);
    cr_expect_str_eq(elem(r, 0), "");
    cr_expect_str_eq(elem(r, 1),
                     "reject:HINCRBY str f: WRONGTYPE Operation against a key "
                     "holding the wrong kind of value");
    cr_expect_str_eq(elem(r, 2),
                     "reject:HINCRBY txt f: ERR hash value is not an integer");
    cr_expect_str_eq(elem(r, 3), "reject:HINCRBY big f: ERR increment or "
                                 "decrement would overflow");
    cr_expect_str_eq(elem(r, 4), "");
    cr_expect_str_eq(elem(r, 5), elem(r, 1)); /* its duplicate */
    cr_expect_str_eq(elem(r, 6), "");
    freeReplyObject(r);
    expect_key("n", "103");
    expect_hkey("ok", "f", "2");
    expect_hkey("txt", "f", "abc");
    expect_hkey("big", "f", "9223372036854775807");
    expect_key("t:dedup:g1:r1", "done:m1");
    expect_key("t:dedup:g1:r2", NULL);
    expect_key("t:dedup:g1:r3", NULL);
    expect_key("t:dedup:g1:r6", "done:m6");
    redis_done();
}

/* Redis refusing writes (OOM) fails the chunk before anything is written:
 * no increment and no mark, and the same chunk applies once later. */
Test(script, idem_outage_writes_neither_marks_nor_increments)
{
    redis_with("function effect(rec)\n"
               "  idem.hincrby('h', 'a', 1)\n"
               "  idem.incrbyfloat('f', 0.5)\n"
               "end\n");
    freeReplyObject(redisCommand(rctx, "SET f 1"));
    freeReplyObject(redisCommand(rctx, "CONFIG SET maxmemory 1"));
    idem_record_t recs[] = {rec_of("o1", "m1", "v"), rec_of("o2", "m2", "v")};
    redisReply *r = eval(recs, 2);
    cr_expect_eq(r->type, REDIS_REPLY_ERROR, "type %d", r->type);
    if (r->type == REDIS_REPLY_ERROR)
        cr_expect(!strncmp(r->str, "OOM ", 4), "%s", r->str);
    freeReplyObject(r);
    freeReplyObject(redisCommand(rctx, "CONFIG SET maxmemory 0"));
    expect_hkey("h", "a", NULL);
    expect_key("f", "1");
    expect_key("t:dedup:g1:o1", NULL);
    expect_key("t:dedup:g1:o2", NULL);
    for (int i = 0; i < 2; i++) {
        r = eval(recs, 2);
        cr_expect_str_eq(elem(r, 0), i ? "done:m1" : "");
        cr_expect_str_eq(elem(r, 1), i ? "done:m2" : "");
        freeReplyObject(r);
    }
    expect_hkey("h", "a", "2");
    expect_key("f", "2");
    redis_done();
}

/* A refusal that comes after the increments were written (here an ACL
 * that lets the member read the marks but not write them: NOPERM on the
 * first mark) takes the increments back, so the chunk's retry applies
 * them once. */
Test(script, idem_refused_mark_takes_the_increments_back)
{
    redis_with("function effect(rec)\n"
               "  idem.hincrby('h', 'a', 5)\n"
               "  idem.incrby('c', 1)\n"
               "  idem.hincrbyfloat('hf', 'x', 0.1)\n"
               "  idem.incrbyfloat('f', 0.1)\n"
               "end\n");
    freeReplyObject(redisCommand(rctx, "HSET h a 1"));
    freeReplyObject(redisCommand(rctx, "SET c 7"));
    freeReplyObject(redisCommand(rctx, "SET f 0.3 PX 600000"));
    redisReply *a = redisCommand(
        rctx, "ACL SETUSER ro on >pw ~h ~c ~hf ~f %%R~t:dedup:* +@all");
    cr_assert(a && a->type == REDIS_REPLY_STATUS, "%s", a ? a->str : "");
    freeReplyObject(a);
    redisContext *admin = rctx;
    rctx = redisConnect("127.0.0.1", rds.port);
    cr_assert(rctx && !rctx->err);
    freeReplyObject(redisCommand(rctx, "AUTH ro pw"));
    idem_record_t recs[] = {rec_of("p1", "m1", "v"), rec_of("p2", "m2", "v")};
    redisReply *r = eval(recs, 2);
    cr_expect_eq(r->type, REDIS_REPLY_ERROR, "type %d", r->type);
    if (r->type == REDIS_REPLY_ERROR)
        cr_expect(!strncmp(r->str, "NOPERM", 6) ||
                      strstr(r->str, "user executing the script can't"),
                  "%s", r->str);
    freeReplyObject(r);
    redisFree(rctx);
    rctx = admin;
    expect_hkey("h", "a", "1");
    expect_key("c", "7");
    expect_hkey("hf", "x", NULL);
    expect_key("f", "0.3");
    redisReply *t = redisCommand(rctx, "PTTL f");
    cr_expect(t->integer > 500000, "PTTL f = %lld", t->integer);
    freeReplyObject(t);
    expect_key("t:dedup:g1:p1", NULL);
    r = eval(recs, 2);
    cr_expect_str_eq(elem(r, 0), "");
    cr_expect_str_eq(elem(r, 1), "");
    freeReplyObject(r);
    expect_hkey("h", "a", "11");
    expect_key("c", "9");
    redis_done();
}

/* An ACL that refuses one command (SADD) to the member's user, met by a
 * record in the middle of a chunk after earlier records made plain
 * writes: the chunk fails as an outage. Returns the error reply's text
 * check; the caller fixes the ACL and runs the chunk again. */
static void eval_as_limited_user(const idem_record_t *recs, size_t n)
{
    redisReply *a =
        redisCommand(rctx, "ACL SETUSER lim on >pw ~* &* +@all -sadd");
    cr_assert(a && a->type == REDIS_REPLY_STATUS, "%s", a ? a->str : "");
    freeReplyObject(a);
    redisContext *admin = rctx;
    rctx = redisConnect("127.0.0.1", rds.port);
    cr_assert(rctx && !rctx->err);
    freeReplyObject(redisCommand(rctx, "AUTH lim pw"));
    redisReply *r = eval(recs, n);
    cr_expect_eq(r->type, REDIS_REPLY_ERROR, "type %d", r->type);
    if (r->type == REDIS_REPLY_ERROR)
        cr_expect(!strncmp(r->str, "NOPERM", 6) ||
                      strstr(r->str, "user executing the script can't"),
                  "%s", r->str);
    freeReplyObject(r);
    redisFree(rctx);
    rctx = admin;
}

/* Plain writes make the chunk eager: each accepted record's writes and
 * mark are complete before the next record runs, so an ACL refusal in a
 * later record leaves the earlier ones done, and the retry does not apply
 * their writes again. The failing record wrote nothing before its
 * refusal, so the end state is exact. */
Test(script, plain_writes_before_a_refusal_apply_once)
{
    redis_with("function effect(rec)\n"
               "  if rec.value == 'tag' then redis.call('SADD', 'tags', "
               "rec.identity) end\n"
               "  redis.call('HINCRBY', 'h', 'n', 1)\n"
               "  redis.call('RPUSH', 'l', rec.identity)\n"
               "end\n");
    idem_record_t recs[] = {rec_of("q1", "m1", "v"), rec_of("q2", "m2", "v"),
                            rec_of("q3", "m3", "tag"), rec_of("q4", "m4", "v")};
    eval_as_limited_user(recs, 4);
    expect_hkey("h", "n", "2");
    expect_key("t:dedup:g1:q1", "done:m1");
    expect_key("t:dedup:g1:q2", "done:m2");
    expect_key("t:dedup:g1:q3", NULL);
    redisReply *r = redisCommand(rctx, "ACL SETUSER lim +sadd");
    freeReplyObject(r);
    r = eval(recs, 4);
    cr_expect_str_eq(elem(r, 0), "done:m1");
    cr_expect_str_eq(elem(r, 1), "done:m2");
    cr_expect_str_eq(elem(r, 2), "");
    cr_expect_str_eq(elem(r, 3), "");
    freeReplyObject(r);
    expect_hkey("h", "n", "4");
    r = redisCommand(rctx, "LRANGE l 0 -1");
    cr_assert_eq(r->type, REDIS_REPLY_ARRAY);
    cr_expect_eq(r->elements, 4);
    for (size_t i = 0; i < r->elements && i < 4; i++)
        cr_expect_str_eq(r->element[i]->str, recs[i].identity);
    freeReplyObject(r);
    redis_done();
}

/* idem.* and plain writes mixed: records that staged only idem.* before
 * the chunk's first plain write get their sums and marks written just
 * before it; the record that makes it keeps its own staged increments
 * (integer and float) and commits them after its effect; a refusal later
 * leaves all of them applied once. */
Test(script, idem_and_plain_writes_before_a_refusal_apply_once)
{
    redis_with("function effect(rec)\n"
               "  idem.hincrby('h', 'a', 1)\n"
               "  idem.incrbyfloat('f', 0.25)\n"
               "  if rec.value == 'tag' then redis.call('SADD', 'tags', "
               "rec.identity) end\n"
               "  if rec.value ~= 'idem' then redis.call('INCR', 'plain') "
               "end\n"
               "  if idem.hget('h', 'a') == 0 then return false, 'never' end\n"
               "end\n");
    freeReplyObject(redisCommand(rctx, "SET f 1"));
    idem_record_t recs[] = {
        rec_of("r1", "m1", "idem"), rec_of("r2", "m2", "idem"),
        rec_of("r3", "m3", "v"),    rec_of("r4", "m4", "idem"),
        rec_of("r5", "m5", "tag"),  rec_of("r6", "m6", "v")};
    eval_as_limited_user(recs, 6);
    expect_hkey("h", "a", "4");
    expect_key("f", "2");
    expect_key("plain", "1");
    expect_key("t:dedup:g1:r4", "done:m4");
    expect_key("t:dedup:g1:r5", NULL);
    freeReplyObject(redisCommand(rctx, "ACL SETUSER lim +sadd"));
    redisReply *r = eval(recs, 6);
    for (size_t i = 0; i < 4; i++) {
        char want[16];
        snprintf(want, sizeof(want), "done:m%zu", i + 1);
        cr_expect_str_eq(elem(r, i), want);
    }
    cr_expect_str_eq(elem(r, 4), "");
    cr_expect_str_eq(elem(r, 5), "");
    freeReplyObject(r);
    expect_hkey("h", "a", "6");
    expect_key("f", "2.5");
    expect_key("plain", "3");
    redis_done();
}

/* Eager mode keeps the refused-sum rule: a sum Redis refuses rejects the
 * record that staged it (in eager mode the sums are the current
 * record's), which gets no mark; the next records are unaffected. */
Test(script, eager_refused_sum_rejects_the_record)
{
    redis_with("function effect(rec)\n"
               "  redis.call('INCR', 'plain')\n"
               "  idem.hincrby(rec.value, 'a', 1)\n"
               "end\n");
    freeReplyObject(redisCommand(rctx, "SET str x"));
    idem_record_t recs[] = {rec_of("s1", "m1", "h"), rec_of("s2", "m2", "str"),
                            rec_of("s3", "m3", "h")};
    redisReply *r = eval(recs, 3);
    cr_expect_str_eq(elem(r, 0), "");
    cr_expect(!strncmp(elem(r, 1), "reject:HINCRBY str a: WRONGTYPE", 31), "%s",
              elem(r, 1));
    cr_expect_str_eq(elem(r, 2), "");
    freeReplyObject(r);
    expect_hkey("h", "a", "2");
    expect_key("plain", "3");
    expect_key("t:dedup:g1:s2", NULL);
    redis_done();
}

/* config/examples/inventory.lua, the README's walk-through script, with
 * its script.fields as the loop reads them. */
Test(script, inventory_example)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/config/examples/inventory.lua", th_src());
    redis_with_file_fields(path, "/sku,/qty");
    static const char *const values[] = {
        "{\"id\":\"evt-1\",\"sku\":\"apple\",\"qty\":10}",
        "{\"id\":\"evt-2\",\"sku\":\"apple\",\"qty\":-3}",
        "{\"id\":\"evt-3\",\"sku\":\"pear\",\"qty\":-1}",
        "{\"id\":\"evt-2\",\"sku\":\"apple\",\"qty\":-3}",
        "{\"id\":\"evt-4\",\"sku\":\"apple\"}",
        "{\"id\":\"evt-5\",\"sku\":\"apple\",\"qty\":1.5}",
        "{\"id\":\"evt-6\",\"qty\":1}",
        "{\"id\":\"evt-7\",\"sku\":7,\"qty\":1}",
        /* the same chunk's evt-1 and evt-2 count: 7 left */
        "{\"id\":\"evt-8\",\"sku\":\"apple\",\"qty\":-8}",
        "{\"id\":\"evt-9\",\"sku\":\"apple\",\"qty\":-7}",
    };
    enum { N = sizeof(values) / sizeof(values[0]) };
    idem_record_t recs[N];
    idem_envelope_t envs[N];
    memset(envs, 0, sizeof(envs));
    for (size_t i = 0; i < N; i++) {
        recs[i] = rec_with_fields("/sku,/qty", values[i], &envs[i]);
        recs[i].message_id_len = 0; /* no message id: marks say "done:" */
    }
    redisReply *r = eval(recs, N);
    cr_expect_str_eq(elem(r, 0), "");
    cr_expect_str_eq(elem(r, 1), "");
    cr_expect_str_eq(elem(r, 2),
                     "reject:out of stock: pear has 0, the event takes 1");
    cr_expect_str_eq(elem(r, 3), "done:");
    cr_expect_str_eq(elem(r, 4),
                     "reject:qty: must be a whole number other than 0");
    cr_expect_str_eq(elem(r, 5),
                     "reject:qty: must be a whole number other than 0");
    cr_expect_str_eq(elem(r, 6), "reject:sku: missing");
    cr_expect_str_eq(elem(r, 7), "reject:sku: missing");
    cr_expect_str_eq(elem(r, 8),
                     "reject:out of stock: apple has 7, the event takes 8");
    cr_expect_str_eq(elem(r, 9), "");
    freeReplyObject(r);
    redisReply *h = redisCommand(rctx, "HGETALL inventory:stock");
    cr_assert_eq(h->elements, 2);
    cr_expect_str_eq(h->element[0]->str, "apple");
    cr_expect_str_eq(h->element[1]->str, "0");
    freeReplyObject(h);
    for (size_t i = 0; i < N; i++)
        idem_envelope_term(&envs[i]);
    redis_done();
}

#define RUN_SKUS 40

/* ---- a script Redis cannot end, under AOF ---- */

/* GET key as text ("" when absent; static, valid until the next call). */
static const char *aof_get(const char *key)
{
    static char v[64];
    const char *get[] = {"GET", key, NULL};
    char *out = th_redis_cli(&rds, get);
    snprintf(v, sizeof(v), "%s", out ? out : "?");
    free(out);
    return v;
}

/* A script writes, then loops: SCRIPT KILL is refused (UNKILLABLE) and
 * SHUTDOWN NOSAVE ends Redis. With AOF on (appendfsync `fsync`) neither
 * the next load nor the one after a clean restart holds the script's
 * writes (Redis 7.0 replays a block cut inside MULTI/EXEC only at the
 * load after the next, so both are read); a write before it stays.
 * docs/guarantees.md, "An effect that never finishes". */
static void unkillable_under_aof(const char *fsync)
{
    static const char *args[] = {
        "--appendonly", "yes", "--appendfsync", NULL, "--busy-reply-threshold",
        "200",          NULL};
    args[3] = fsync;
    cr_assert_eq(th_redis_start_args(&rds, args), 0);
    const char *before[] = {"SET", "test:before", "1", NULL};
    free(th_redis_cli(&rds, before));
    redisContext *c = redisConnect("127.0.0.1", rds.port);
    cr_assert(c && !c->err);
    /* Sent, never read: the script does not end. */
    redisAppendCommand(c, "EVAL %s 0",
                       "redis.call('INCR', 'test:written') "
                       "redis.call('SET', 'test:other', 'x') "
                       "while true do end");
    int done = 0;
    while (!done)
        cr_assert_eq(redisBufferWrite(c, &done), REDIS_OK);
    char *kill = NULL;
    const char *sk[] = {"SCRIPT", "KILL", NULL};
    for (int t = 0; t < 100; t++) {
        free(kill);
        kill = th_redis_cli(&rds, sk);
        if (kill && strstr(kill, "UNKILLABLE"))
            break;
        usleep(100000);
    }
    cr_assert(kill && strstr(kill, "UNKILLABLE"), "SCRIPT KILL: %s", kill);
    free(kill);
    const char *sd[] = {"SHUTDOWN", "NOSAVE", NULL};
    free(th_redis_cli(&rds, sd));
    redisFree(c);
    cr_assert_eq(th_redis_restart(&rds), 0);
    cr_expect_str_eq(aof_get("test:before"), "1");
    cr_expect_str_eq(aof_get("test:written"), "", "first load");
    cr_expect_str_eq(aof_get("test:other"), "", "first load");
    const char *after[] = {"SET", "test:after", "1", NULL};
    free(th_redis_cli(&rds, after));
    cr_assert_eq(th_redis_kill(&rds), 0); /* a clean shutdown */
    cr_assert_eq(th_redis_restart(&rds), 0);
    cr_expect_str_eq(aof_get("test:after"), "1");
    cr_expect_str_eq(aof_get("test:written"), "", "second load");
    cr_expect_str_eq(aof_get("test:other"), "", "second load");
}

Test(script, unkillable_writes_are_not_replayed_from_aof_always)
{
    unkillable_under_aof("always");
}

Test(script, unkillable_writes_are_not_replayed_from_aof_everysec)
{
    unkillable_under_aof("everysec");
}
