/* test_aofgate: when a member may write to a server it has not written to
 * yet (AOF rewrite first), from INFO texts, without Redis. */
#include "redis/aofgate.h"

#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdio.h>
#include <string.h>

/* An INFO persistence section as Redis 7.0.15 writes it (trimmed). */
static const char *info_text(int loading, int aof, int running, int scheduled,
                             const char *status)
{
    static char buf[1024];
    snprintf(buf, sizeof(buf),
             "# Persistence\r\nloading:%d\r\nasync_loading:0\r\n"
             "rdb_bgsave_in_progress:0\r\nrdb_last_bgsave_status:ok\r\n"
             "aof_enabled:%d\r\naof_rewrite_in_progress:%d\r\n"
             "aof_rewrite_scheduled:%d\r\naof_last_rewrite_time_sec:-1\r\n"
             "aof_current_rewrite_time_sec:-1\r\n"
             "aof_last_bgrewrite_status:%s\r\naof_rewrites:0\r\n"
             "aof_last_write_status:ok\r\n",
             loading, aof, running, scheduled, status);
    return buf;
}

static idem_aofgate_action_t step(idem_aofgate_t *g, const char *run_id,
                                  int loading, int aof, int running,
                                  int scheduled, const char *status)
{
    idem_aofgate_info_t in;
    idem_aofgate_info_parse(info_text(loading, aof, running, scheduled, status),
                            &in);
    return idem_aofgate_step(g, run_id, &in);
}

Test(aofgate, info_fields_are_read)
{
    idem_aofgate_info_t in;
    idem_aofgate_info_parse(info_text(1, 1, 1, 0, "err"), &in);
    cr_expect_eq(in.loading, 1);
    cr_expect_eq(in.aof_enabled, 1);
    cr_expect_eq(in.rewrite_running, 1);
    cr_expect_eq(in.rewrite_scheduled, 0);
    cr_expect_eq(in.last_rewrite_ok, 0);
    cr_expect_eq(in.known, 1);
    /* async_loading must not be read as loading, nor a prefix as a field */
    idem_aofgate_info_parse("async_loading:1\r\naof_enabled_x:1\r\n", &in);
    cr_expect_eq(in.loading, 0);
    cr_expect_eq(in.aof_enabled, 0);
    cr_expect_eq(in.known, 0);
    idem_aofgate_info_parse(NULL, &in);
    cr_expect_eq(in.known, 0);
    /* The reader the store takes run_id and maxmemory_policy with. */
    char v[48];
    idem_aofgate_info_field("# Server\r\nrun_id:ab12\r\nmaxmemory_policy:"
                            "noeviction\r\n",
                            "run_id", v, sizeof(v));
    cr_expect_str_eq(v, "ab12");
    idem_aofgate_info_field("xrun_id:1\r\n", "run_id", v, sizeof(v));
    cr_expect_str_eq(v, "");
}

Test(aofgate, without_aof_writes_at_once)
{
    idem_aofgate_t g;
    idem_aofgate_init(&g);
    cr_expect_eq(step(&g, "r1", 0, 0, 0, 0, "ok"), IDEM_AOFGATE_OPEN);
    cr_expect(idem_aofgate_open(&g, "r1"));
    cr_expect(!idem_aofgate_open(&g, "r2"));
}

Test(aofgate, a_new_server_is_rewritten_before_the_first_write)
{
    idem_aofgate_t g;
    idem_aofgate_init(&g);
    /* The last status says ok, but of a rewrite before the load. */
    cr_expect_eq(step(&g, "r1", 0, 1, 0, 0, "ok"), IDEM_AOFGATE_REWRITE);
    cr_expect_eq(idem_aofgate_reply(
                     &g, "Background append only file rewriting started", 0),
                 IDEM_AOFGATE_WAIT);
    cr_expect_eq(step(&g, "r1", 0, 1, 1, 0, "ok"), IDEM_AOFGATE_WAIT);
    cr_expect(!idem_aofgate_open(&g, "r1"));
    cr_expect_eq(step(&g, "r1", 0, 1, 0, 0, "ok"), IDEM_AOFGATE_OPEN);
    cr_expect(idem_aofgate_open(&g, "r1"));
    cr_expect_eq(g.rewrites, 1);
    /* The same server again: nothing to do. */
    cr_expect_eq(step(&g, "r1", 0, 1, 0, 0, "ok"), IDEM_AOFGATE_OPEN);
    /* A restart (or a failover): a new run_id starts over. */
    cr_expect_eq(step(&g, "r2", 0, 1, 0, 0, "ok"), IDEM_AOFGATE_REWRITE);
    cr_expect(!idem_aofgate_open(&g, "r2"));
}

Test(aofgate, waits_for_a_loading_server)
{
    idem_aofgate_t g;
    idem_aofgate_init(&g);
    cr_expect_eq(step(&g, "r1", 1, 1, 0, 0, "ok"), IDEM_AOFGATE_WAIT);
    cr_expect_eq(step(&g, "r1", 1, 0, 0, 0, "ok"), IDEM_AOFGATE_WAIT);
    cr_expect_eq(step(&g, "r1", 0, 1, 0, 0, "ok"), IDEM_AOFGATE_REWRITE);
}

/* Two members see the same restart: the second one's BGREWRITEAOF meets the
 * first one's rewrite; it waits for it, and neither writes before it ended. */
Test(aofgate, members_wait_for_each_others_rewrite)
{
    idem_aofgate_t a, b;
    idem_aofgate_init(&a);
    idem_aofgate_init(&b);
    cr_expect_eq(step(&a, "r1", 0, 1, 0, 0, "ok"), IDEM_AOFGATE_REWRITE);
    cr_expect_eq(step(&b, "r1", 0, 1, 0, 0, "ok"), IDEM_AOFGATE_REWRITE);
    cr_expect_eq(idem_aofgate_reply(
                     &a, "Background append only file rewriting started", 0),
                 IDEM_AOFGATE_WAIT);
    cr_expect_eq(
        idem_aofgate_reply(
            &b, "ERR Background append only file rewriting already in progress",
            1),
        IDEM_AOFGATE_WAIT);
    cr_expect_eq(step(&b, "r1", 0, 1, 1, 0, "ok"), IDEM_AOFGATE_WAIT);
    cr_expect_eq(step(&a, "r1", 0, 1, 1, 0, "ok"), IDEM_AOFGATE_WAIT);
    cr_expect_eq(step(&b, "r1", 0, 1, 0, 0, "ok"), IDEM_AOFGATE_OPEN);
    cr_expect_eq(step(&a, "r1", 0, 1, 0, 0, "ok"), IDEM_AOFGATE_OPEN);
    /* A third member that first sees the rewrite running waits for it
     * without asking for one. */
    idem_aofgate_t c;
    idem_aofgate_init(&c);
    cr_expect_eq(step(&c, "r2", 0, 1, 0, 1, "ok"), IDEM_AOFGATE_WAIT);
    cr_expect_eq(step(&c, "r2", 0, 1, 1, 0, "ok"), IDEM_AOFGATE_WAIT);
    cr_expect_eq(step(&c, "r2", 0, 1, 0, 0, "ok"), IDEM_AOFGATE_OPEN);
    cr_expect_eq(c.rewrites, 0);
}

Test(aofgate, a_failed_rewrite_is_asked_again)
{
    idem_aofgate_t g;
    idem_aofgate_init(&g);
    cr_expect_eq(step(&g, "r1", 0, 1, 0, 0, "ok"), IDEM_AOFGATE_REWRITE);
    idem_aofgate_reply(&g, "Background append only file rewriting scheduled",
                       0);
    cr_expect_eq(step(&g, "r1", 0, 1, 0, 1, "ok"), IDEM_AOFGATE_WAIT);
    cr_expect_eq(step(&g, "r1", 0, 1, 0, 0, "err"), IDEM_AOFGATE_REWRITE);
    cr_expect(!idem_aofgate_open(&g, "r1"));
    idem_aofgate_reply(&g, "Background append only file rewriting started", 0);
    cr_expect_eq(step(&g, "r1", 0, 1, 0, 0, "ok"), IDEM_AOFGATE_OPEN);
    cr_expect_eq(g.rewrites, 2);
}

typedef struct {
    char reply[128];
} refusal_t;

ParameterizedTestParameters(aofgate, refusals)
{
    static refusal_t replies[] = {
        {"NOPERM this user has no permissions to run the 'bgrewriteaof' "
         "command"},
        {"ERR unknown command 'BGREWRITEAOF', with args beginning with: "},
        {"ERR Can't open or create append-only dir"},
    };
    return cr_make_param_array(refusal_t, replies,
                               sizeof(replies) / sizeof(replies[0]));
}

/* Refused (an ACL without +bgrewriteaof, a renamed command): never open;
 * asked again at the next step, so granting it later is enough. */
ParameterizedTest(refusal_t *c, aofgate, refusals)
{
    idem_aofgate_t g;
    idem_aofgate_init(&g);
    cr_expect_eq(step(&g, "r1", 0, 1, 0, 0, "ok"), IDEM_AOFGATE_REWRITE);
    cr_expect_eq(idem_aofgate_reply(&g, c->reply, 1), IDEM_AOFGATE_REFUSED);
    cr_expect_eq(step(&g, "r1", 0, 1, 0, 0, "ok"), IDEM_AOFGATE_REWRITE);
    cr_expect(!idem_aofgate_open(&g, "r1"));
    cr_expect_eq(idem_aofgate_reply(
                     &g, "Background append only file rewriting started", 0),
                 IDEM_AOFGATE_WAIT);
    cr_expect_eq(step(&g, "r1", 0, 1, 0, 0, "ok"), IDEM_AOFGATE_OPEN);
}

Test(aofgate, action_names)
{
    cr_expect_str_eq(idem_aofgate_action2str(IDEM_AOFGATE_OPEN), "open");
    cr_expect_str_eq(idem_aofgate_action2str(IDEM_AOFGATE_REFUSED), "refused");
}
