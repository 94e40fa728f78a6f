/* test_script: the user's Lua effect (handler=script): the checks of
 * script.file with file and line, and the composed dedup script run by a
 * real redis-server (EVALSHA as the handler sends it): effects and marks
 * together, duplicates, rejections, runtime errors, Redis's refusals as
 * outages, and every field of `rec`. */
#include "harness.h"
#include "script.h"

#include <criterion/criterion.h>
#include <hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *dir;
static th_redis_t rds;

static void script_fini(void)
{
    if (rds.dir)
        th_redis_stop(&rds);
    if (dir)
        th_rmrf(dir);
    free(dir);
    dir = NULL;
}

TestSuite(script, .fini = script_fini);

/* Writes text to a file in the suite's temp dir; returns its path (static
 * buffer, one at a time). */
static const char *lua_file(const char *name, const char *text)
{
    static char path[512];
    if (!dir)
        dir = th_tmpdir();
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    cr_assert_eq(th_write_file(path, text), 0);
    return path;
}

/* Loads text as script.file and expects it to fail with every string of
 * want[] (NULL-terminated) in the error. */
static void expect_refused(const char *text, const char *const want[])
{
    char err[1024] = "";
    const char *path = lua_file("bad.lua", text);
    idem_script_t *sc = idem_script_load(path, err, sizeof(err));
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
    idem_script_t *sc =
        idem_script_load(lua_file("ok.lua", text), err, sizeof(err));
    cr_assert(sc, "%s", err);
    cr_expect(strstr(idem_script_source(sc), text));
    cr_expect(strstr(idem_script_path(sc), "ok.lua"));
    idem_script_destroy(sc);
    idem_script_destroy(NULL);
}

Test(script, local_function_effect_is_accepted)
{
    char err[512] = "";
    idem_script_t *sc = idem_script_load(
        lua_file("local.lua", "local function effect(rec) end"), err,
        sizeof(err));
    cr_assert(sc, "%s", err);
    idem_script_destroy(sc);
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
    cr_assert_null(idem_script_load("/nonexistent/x.lua", err, sizeof(err)));
    cr_expect(strstr(err, "script.file: /nonexistent/x.lua: No such file"),
              "%s", err);
    static const char bin[] = "function effect(rec) end\n\0\1";
    const char *path = lua_file("bin.lua", "");
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    fwrite(bin, 1, sizeof(bin), f);
    fclose(f);
    cr_assert_null(idem_script_load(path, err, sizeof(err)));
    cr_expect(strstr(err, "NUL byte"), "%s", err);
}

Test(script, where_maps_lines_to_the_file)
{
    char err[512] = "";
    idem_script_t *sc = idem_script_load(
        lua_file("w.lua", "function effect(rec)\n  error('boom')\nend\n"), err,
        sizeof(err));
    cr_assert(sc, "%s", err);
    /* The driver's lines come first: find line 2 of the file. */
    const char *src = idem_script_source(sc);
    const char *at = strstr(src, "  error('boom')");
    cr_assert(at);
    int line = 1;
    for (const char *p = src; p < at; p++)
        line += *p == '\n';
    char msg[128], out[256];
    snprintf(msg, sizeof(msg), "user_script:%d: boom; @user_script:%d: x", line,
             line + 1);
    idem_script_where(sc, msg, strlen(msg), out, sizeof(out));
    char want[600];
    snprintf(want, sizeof(want), "%s:2: boom; @%s:3: x", idem_script_path(sc),
             idem_script_path(sc));
    cr_expect_str_eq(out, want);
    idem_script_where(sc, "user_script:1: in the driver", 28, out, sizeof(out));
    cr_expect_str_eq(out, "(idemproc driver):1: in the driver");
    idem_script_where(sc, "no tag user_script:x", 20, out, sizeof(out));
    cr_expect_str_eq(out, "no tag user_script:x");
    idem_script_where(sc, msg, strlen(msg), out, 8);
    cr_expect_eq(strlen(out), 7);
    idem_script_destroy(sc);
}

Test(script, verdicts)
{
    const char *d;
    size_t dl;
    cr_expect_eq(idem_script_verdict("", 0, &d, &dl), IDEM_SCRIPT_APPLIED);
    cr_expect_eq(idem_script_verdict("done:m1", 7, &d, &dl),
                 IDEM_SCRIPT_DUPLICATE);
    cr_expect(dl == 2 && !memcmp(d, "m1", 2));
    cr_expect_eq(idem_script_verdict("reject:no stock", 15, &d, &dl),
                 IDEM_SCRIPT_REJECTED);
    cr_expect(dl == 8 && !memcmp(d, "no stock", 8));
    cr_expect_eq(idem_script_verdict("error:x", 7, &d, &dl),
                 IDEM_SCRIPT_FAILED);
    cr_expect_eq(idem_script_verdict("lease:m:1:mid", 13, &d, &dl),
                 IDEM_SCRIPT_BUSY);
    cr_expect(dl == 13);
}
