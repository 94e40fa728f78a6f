#include "partrig.h"
#include "redis/posval.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern const char idem_ledger_lua[];
extern const size_t idem_ledger_lua_len;

void th_mark_of(uint8_t m[16], int seed)
{
    for (int i = 0; i < 16; i++)
        m[i] = (uint8_t)(seed * 31 + i);
    m[12] &= 0x7f;
}

size_t th_trec_args(const void *rec, const char **argv, size_t *argvlen,
                    void *opaque)
{
    (void)opaque;
    const th_trec_t *t = rec;
    const char *v[] = {t->id, t->mid, t->cur, t->user, t->amt};
    for (int i = 0; i < 5; i++) {
        argv[i] = v[i];
        argvlen[i] = strlen(v[i]);
    }
    return 5;
}

void th_partrig_start(const idem_conf_t *conf, idem_store_t **store,
                      idem_partstate_t **ps)
{
    char err[512] = "";
    *store = idem_store_new(conf, NULL);
    cr_assert(*store);
    cr_assert_geq(
        idem_store_effect_register(*store, idem_ledger_lua, idem_ledger_lua_len,
                                   5, th_trec_args, NULL, err, sizeof(err)),
        0, "%s", err);
    *ps = idem_partstate_new(*store, conf, err, sizeof(err));
    cr_assert(*ps, "%s", err);
}

int th_partrig_chunk(idem_partstate_t *ps, int32_t part, int64_t epoch,
                     int64_t expect, int64_t newoff, const th_trec_t *recs,
                     size_t n, int seed0, idem_partstate_result_t *res,
                     int64_t *window, char *err, size_t errsz)
{
    const void **rp = calloc(n ? n : 1, sizeof(*rp));
    uint8_t(*marks)[16] = calloc(n ? n : 1, 16);
    cr_assert(rp && marks);
    for (size_t i = 0; i < n; i++) {
        rp[i] = &recs[i];
        th_mark_of(marks[i], seed0 + (int)i);
    }
    idem_store_pos_t pos = {.topic = "t", .partition = part, .offset = newoff};
    idem_posval_init(&pos.val, "c1");
    idem_partstate_chunk_t ch = {.topic = "t",
                                 .partition = part,
                                 .epoch = epoch,
                                 .expect_offset = expect,
                                 .newpos = newoff >= 0 ? &pos : NULL,
                                 .recs = (const void *const *)rp,
                                 .marks = (const uint8_t(*)[16])marks,
                                 .n = n};
    int64_t w = -1;
    int rc = idem_partstate_chunk(ps, &ch, res, &w, err, errsz);
    if (rc == 0)
        cr_assert_geq(w, 0);
    if (window)
        *window = w;
    free(rp);
    free(marks);
    return rc;
}

void th_partrig_first_position(idem_store_t *store, int32_t part, int64_t off)
{
    idem_store_pos_t pos = {.topic = "t", .partition = part, .offset = off};
    idem_posval_init(&pos.val, "c1");
    char err[512];
    cr_assert_eq(idem_store_positions_save(store, &pos, 1, err, sizeof(err)), 0,
                 "%s", err);
}

char *th_reply_text(redisContext *cli, const char *fmt, const char *a,
                    const char *b)
{
    static char out[4][256];
    static int k;
    redisReply *r = redisCommand(cli, fmt, a, b);
    cr_assert(r);
    char *o = out[k++ % 4];
    if (r->type == REDIS_REPLY_INTEGER)
        snprintf(o, 256, "%lld", r->integer);
    else if (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS ||
             r->type == REDIS_REPLY_ERROR)
        snprintf(o, 256, "%s", r->str);
    else
        o[0] = '\0';
    freeReplyObject(r);
    return o;
}
