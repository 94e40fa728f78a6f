/* test_script (unit): the user's Lua effect (handler=script): the checks
 * of script.file with file and line, and the README's example. */
#include "testlib.h"
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

static void script_fini(void)
{
    if (dir)
        th_rmrf(dir);
    free(dir);
    dir = NULL;
}

TestSuite(script, .fini = script_fini);

/* Loads text as script.file and expects it to fail with every string of
 * want[] (NULL-terminated) in the error. */
static void expect_refused(const char *text, const char *const want[])
{
    char err[1024] = "";
    const char *path = th_file_in(&dir, "bad.lua", text);
    idem_luascript_t *sc = idem_luascript_load(path, NULL, err, sizeof(err));
    cr_assert_null(sc, "accepted:\n%s", text);
    for (size_t i = 0; want[i]; i++)
        cr_expect(strstr(err, want[i]), "error lacks \"%s\": %s", want[i], err);
}

Test(script, good_file_is_composed_unchanged)
{
    const char *text = "-- inventory\n"
                       "local function qty(rec) return 1 end\n"
                       "function effect(rec)\n"
                       "  redis.call('INCRBY', 'x', qty(rec))\n"
                       "end\n";
    char err[512] = "";
    idem_luascript_t *sc = idem_luascript_load(th_file_in(&dir, "ok.lua", text),
                                               NULL, err, sizeof(err));
    cr_assert(sc, "%s", err);
    cr_expect(strstr(idem_luascript_source(sc), text));
    cr_expect(strstr(idem_luascript_path(sc), "ok.lua"));
    idem_luascript_destroy(sc);
    idem_luascript_destroy(NULL);
}

Test(script, local_function_effect_is_accepted)
{
    char err[512] = "";
    idem_luascript_t *sc = idem_luascript_load(
        th_file_in(&dir, "local.lua", "local function effect(rec) end"), NULL,
        err, sizeof(err));
    cr_assert(sc, "%s", err);
    idem_luascript_destroy(sc);
}

Test(script, syntax_error_names_file_and_line)
{
    expect_refused("function effect(rec)\n"
                   "  local x = 1\n"
                   "  if x then\n"
                   "    x = = 2\n"
                   "  end\n"
                   "end\n",
                   (const char *const[]){"script.file: ", "bad.lua:4:",
                                         "unexpected symbol", NULL});
}

Test(script, unfinished_block_names_its_line)
{
    expect_refused("function effect(rec)\n  if rec then\n",
                   (const char *const[]){"bad.lua:2:", "'end' expected", NULL});
}

Test(script, global_helper_is_refused_with_its_line)
{
    expect_refused("function effect(rec) end\n"
                   "\n"
                   "function helper(x) return x end\n",
                   (const char *const[]){"bad.lua:3:", "helper",
                                         "declare it local", NULL});
}

Test(script, global_variable_is_refused)
{
    expect_refused("counter = 0\nfunction effect(rec) end\n",
                   (const char *const[]){"bad.lua:1:", "counter", NULL});
}

Test(script, unknown_global_at_top_level_is_refused)
{
    expect_refused("local t = os.time()\nfunction effect(rec) end\n",
                   (const char *const[]){
                       "bad.lua:1:", "nonexistent global variable os", NULL});
}

Test(script, no_effect_is_refused)
{
    expect_refused("local function effekt(rec) end\n",
                   (const char *const[]){"bad.lua defines no function "
                                         "effect(rec)",
                                         NULL});
}

Test(script, effect_that_is_no_function_is_refused)
{
    expect_refused("local effect = 5\n",
                   (const char *const[]){"defines no function effect", NULL});
}

Test(script, redis_call_at_top_level_is_refused)
{
    expect_refused("local n = redis.call('GET', 'n')\n"
                   "function effect(rec) end\n",
                   (const char *const[]){"bad.lua:1:", "top level", NULL});
}

/* The idem.* helpers, like redis.call, belong in the effect. */
Test(script, idem_at_top_level_is_refused)
{
    expect_refused(
        "local n = 0\nidem.incrby('x', 1)\nfunction effect(rec) end\n",
        (const char *const[]){"bad.lua:2: idem.incrby at the top "
                              "level of the file",
                              NULL});
    expect_refused("local v = idem.hget('h', 'f')\nfunction effect(rec) end\n",
                   (const char *const[]){"bad.lua:1: idem.hget at the top "
                                         "level of the file",
                                         NULL});
}

Test(script, shebang_is_refused_with_a_hint)
{
    expect_refused("#!lua flags=no-writes\nfunction effect(rec) end\n",
                   (const char *const[]){"bad.lua:1:", "#! line", NULL});
}

Test(script, top_level_return_is_refused_with_a_hint)
{
    expect_refused("local function effect(rec) end\nreturn effect\n",
                   (const char *const[]){"bad.lua:", "top-level return", NULL});
}

Test(script, endless_top_level_is_stopped)
{
    expect_refused("while true do end\nfunction effect(rec) end\n",
                   (const char *const[]){"instructions", NULL});
}

Test(script, missing_and_binary_files_are_refused)
{
    char err[512] = "";
    cr_assert_null(
        idem_luascript_load("/nonexistent/x.lua", NULL, err, sizeof(err)));
    cr_expect(strstr(err, "script.file: /nonexistent/x.lua: No such file"),
              "%s", err);
    static const char bin[] = "function effect(rec) end\n\0\1";
    const char *path = th_file_in(&dir, "bin.lua", "");
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    fwrite(bin, 1, sizeof(bin), f);
    fclose(f);
    cr_assert_null(idem_luascript_load(path, NULL, err, sizeof(err)));
    cr_expect(strstr(err, "NUL byte"), "%s", err);
}

Test(script, where_maps_lines_to_the_file)
{
    char err[512] = "";
    idem_luascript_t *sc = idem_luascript_load(
        th_file_in(&dir, "w.lua",
                   "function effect(rec)\n  error('boom')\nend\n"),
        NULL, err, sizeof(err));
    cr_assert(sc, "%s", err);
    /* The driver's lines come first: find line 2 of the file. */
    const char *src = idem_luascript_source(sc);
    const char *at = strstr(src, "  error('boom')");
    cr_assert(at);
    int line = 1;
    for (const char *p = src; p < at; p++)
        line += *p == '\n';
    char msg[128], out[256];
    snprintf(msg, sizeof(msg), "user_script:%d: boom; @user_script:%d: x", line,
             line + 1);
    idem_luascript_where(sc, msg, strlen(msg), out, sizeof(out));
    char want[600];
    snprintf(want, sizeof(want), "%s:2: boom; @%s:3: x",
             idem_luascript_path(sc), idem_luascript_path(sc));
    cr_expect_str_eq(out, want);
    idem_luascript_where(sc, "user_script:1: in the driver", 28, out,
                         sizeof(out));
    cr_expect_str_eq(out, "(idemproc driver):1: in the driver");
    idem_luascript_where(sc, "no tag user_script:x", 20, out, sizeof(out));
    cr_expect_str_eq(out, "no tag user_script:x");
    idem_luascript_where(sc, msg, strlen(msg), out, 8);
    cr_expect_eq(strlen(out), 7);
    idem_luascript_destroy(sc);
}

#define FIELDS_LIST                                                            \
    "/s,/n,/i,/big,/t,/f,/z,/o,/a,/missing,/nest/x,/a~1b,/a/1,/x~0y"

/* script.fields errors name the key and the pointer. */
Test(script, bad_script_fields_are_refused)
{
    const char *path = th_file_in(&dir, "ok.lua", "function effect(rec) end\n");
    const char *bad[][2] = {
        {"sku", "\"sku\": a JSON Pointer starts with '/'"},
        {"/a,/a", "\"/a\": listed twice"},
        {"/a,,/b", "\"\": empty entry"},
        {"/a~2", "\"/a~2\": '~' must be followed by 0 or 1"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char err[512] = "";
        cr_expect_null(idem_luascript_load(path, bad[i][0], err, sizeof(err)));
        cr_expect(strstr(err, "script.fields: ") && strstr(err, bad[i][1]),
                  "%s: %s", bad[i][0], err);
    }
    char many[400] = "";
    for (int i = 0; i <= IDEM_ENVELOPE_FIELDS_MAX; i++)
        snprintf(many + strlen(many), sizeof(many) - strlen(many), "%s/f%d",
                 i ? "," : "", i);
    char err[512] = "";
    cr_expect_null(idem_luascript_load(path, many, err, sizeof(err)));
    cr_expect(strstr(err, "more than 32 pointers"), "%s", err);
    idem_luascript_t *sc = idem_luascript_load(path, "", err, sizeof(err));
    cr_expect(sc, "%s", err);
    cr_expect_eq(idem_luascript_rec_args(sc), IDEM_LUASCRIPT_REC_ARGS);
    idem_luascript_destroy(sc);
    sc = idem_luascript_load(path, "/a, /b", err, sizeof(err));
    cr_expect(sc, "%s", err);
    cr_expect_eq(idem_luascript_rec_args(sc), IDEM_LUASCRIPT_REC_ARGS + 3);
    idem_luascript_destroy(sc);
}

/* A literal pointer the effect reads through rec.fields must be in
 * script.fields: at run time such a read is an error for every record.
 * Each case: the file, script.fields, and the error's words (NULL: the
 * file is accepted). */
Test(script, literal_fields_pointers_must_be_declared)
{
    const char *cases[][4] = {
        /* read, not declared: named with its line */
        {"function effect(rec)\n  local q = rec.fields['/qty']\n"
         "  local x = rec.fields[\"/x\"]\nend\n",
         "/qty", "bad.lua:3: rec.fields[\"/x\"]: not in script.fields (/qty)",
         "every record would be dead-lettered"},
        {"function effect(rec) return rec.fields['/x'] end\n", "",
         "bad.lua:1: rec.fields[\"/x\"]: not in script.fields (not set)", NULL},
        /* spaces, a long bracket, escapes, another parameter name */
        {"function effect(r)\n\n  return r . fields [ [[/a/b]] ]\nend\n", "/a",
         "bad.lua:3: r.fields[\"/a/b\"]", NULL},
        {"function effect(rec) return rec.fields['/a\\126\\0481'] end\n",
         "/a~0", "rec.fields[\"/a~01\"]", NULL},
        /* declared, in comments or strings, computed, another table: fine */
        {"function effect(rec)\n  local q = rec.fields['/qty']\n"
         "  -- rec.fields['/no']\n  --[[ rec.fields['/no'] ]]\n"
         "  local s = \"rec.fields['/no']\" .. [==[rec.fields['/no']]==]\n"
         "  local k = '/no'\n  local v = rec.fields[k]\n"
         "  local o = {fields = {}}\n  local w = o.fields['/no']\n"
         "  local z = myrec.fields['/no']\n  local y = rec.fields[k .. '']\n"
         "end\n",
         "/qty", NULL, NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char err[1024] = "";
        const char *path = th_file_in(&dir, "bad.lua", cases[i][0]);
        idem_luascript_t *sc =
            idem_luascript_load(path, cases[i][1], err, sizeof(err));
        if (!cases[i][2]) {
            cr_expect(sc, "case %zu refused: %s", i, err);
        } else {
            cr_expect_null(sc, "case %zu accepted", i);
            for (int w = 2; w < 4; w++)
                cr_expect(!cases[i][w] || strstr(err, cases[i][w]),
                          "case %zu: error lacks \"%s\": %s", i, cases[i][w],
                          err);
            cr_expect(!strncmp(err, "script.file: ", 13), "%s", err);
        }
        idem_luascript_destroy(sc);
    }
}

/* The README shows inventory.lua in full: it must be the shipped file. */
Test(script, readme_shows_the_example_file)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/config/examples/inventory.lua", th_src());
    char *file = th_slurp(path, NULL);
    snprintf(path, sizeof(path), "%s/README.md", th_src());
    char *readme = th_slurp(path, NULL);
    cr_assert(file && readme);
    const char *open = "$ cat > inventory.lua <<'EOF'\n";
    char *at = strstr(readme, open);
    cr_assert(at, "README: no \"%s\"", open);
    at += strlen(open);
    char *end = strstr(at, "\nEOF\n");
    cr_assert(end);
    end[1] = '\0';
    cr_expect_str_eq(at, file,
                     "README's inventory.lua differs from "
                     "config/examples/inventory.lua");
    free(file);
    free(readme);
}

#define RUN_SKUS 40

/* Redis Cluster mode: keys named literally outside the partition's slot
 * are configuration errors with the file's line; computed keys, comments,
 * strings and idem.key(...) pass. */
Test(script, cluster_check_finds_literal_keys_outside_the_slot)
{
    char err[1024] = "";
    const char *ok = "-- redis.call('SET', 'x', 1) in a comment\n"
                     "local s = \"idem.incrby('a{b}', 1)\"\n"
                     "function effect(rec)\n"
                     "  idem.hincrby('bal:' .. rec.key, 'u', 1)\n"
                     "  idem.incrby([[count]], 1)\n"
                     "  redis.call('SADD', idem.key('seen'), rec.identity)\n"
                     "  redis.call('PING', 'x')\n"
                     "  redis.call('SET', 'k:' .. rec.key, 1)\n"
                     "end\n";
    cr_expect_eq(idem_luascript_cluster_check(th_file_in(&dir, "ok.lua", ok),
                                              err, sizeof(err)),
                 0, "%s", err);
    const char *own_tag = "function effect(rec)\n"
                          "  idem.incrby('n', 1)\n"
                          "  idem . hincrby ( \"bal{u1}\" , rec.key, 1)\n"
                          "end\n";
    cr_expect_eq(idem_luascript_cluster_check(
                     th_file_in(&dir, "tag.lua", own_tag), err, sizeof(err)),
                 -1);
    cr_expect(strstr(err, "tag.lua:3: idem.hincrby(\"bal{u1}\")"), "%s", err);
    const char *plain = "function effect(rec)\n"
                        "  -- a comment\n"
                        "  redis.pcall('set', [[last]], rec.identity)\n"
                        "end\n";
    cr_expect_eq(idem_luascript_cluster_check(
                     th_file_in(&dir, "plain.lua", plain), err, sizeof(err)),
                 -1);
    cr_expect(strstr(err, "plain.lua:3: redis.pcall('SET', \"last\")"), "%s",
              err);
    cr_expect(strstr(err, "idem.key(\"last\")"), "%s", err);
}

/* The effect the store frames (dedup.scope=partition) holds the user's
 * file inside a block, and the effect function the framings call. */
Test(script, effect_for_the_partition_framing)
{
    const char *text = "local PER = 'mine'\n"
                       "function effect(rec) end\n";
    char err[512] = "";
    idem_luascript_t *sc = idem_luascript_load(th_file_in(&dir, "e.lua", text),
                                               NULL, err, sizeof(err));
    cr_assert(sc, "%s", err);
    const char *e = idem_luascript_effect(sc);
    const char *at = strstr(e, text);
    cr_assert(at);
    cr_expect(!strncmp(at - 3, "do\n", 3));
    cr_expect(strstr(at, "local function effect(base, stride, js, ksuf)"));
    cr_expect(!strstr(e, "return idemproc_run(effect)"));
    idem_luascript_destroy(sc);
}
