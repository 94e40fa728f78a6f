/* partredis: the seam of partscope over Redis (partredis.h). */
#include "loop/partredis.h"
#include "base/util.h"
#include "redis/layout.h"
#include "redis/partstate.h"

#include <stdlib.h>

typedef struct {
    idem_store_t *store;     /* borrowed */
    const idem_conf_t *conf; /* borrowed */
    idem_partstate_t *state; /* owned */
    char layout_sha[41];     /* the switch script's digest ("" at first) */
} partredis_t;

static int r_hashkey(void *ctx, uint8_t key[16], char *errstr,
                     size_t errstr_size)
{
    return idem_partstate_hashkey(((partredis_t *)ctx)->state, key, errstr,
                                  errstr_size);
}

static uint64_t r_connections(void *ctx)
{
    return idem_store_connections(((partredis_t *)ctx)->store);
}

static const char *r_run_id(void *ctx)
{
    return idem_store_run_id(((partredis_t *)ctx)->store);
}

static int64_t r_window_seconds(void *ctx)
{
    return idem_partstate_window_seconds(((partredis_t *)ctx)->state);
}

static int r_now(void *ctx, int64_t *now, char *errstr, size_t errstr_size)
{
    return idem_partstate_now(((partredis_t *)ctx)->state, now, errstr,
                              errstr_size);
}

static int r_partitions(void *ctx, const char *topic, int64_t current,
                        int64_t *recorded, char *errstr, size_t errstr_size)
{
    return idem_partstate_partitions(((partredis_t *)ctx)->state, topic,
                                     current, recorded, errstr, errstr_size);
}

static int r_epoch_bump(void *ctx, const char *topic, int32_t partition,
                        int64_t *epoch, char *errstr, size_t errstr_size)
{
    return idem_partstate_epoch_bump(((partredis_t *)ctx)->state, topic,
                                     partition, epoch, errstr, errstr_size);
}

static int r_positions_load(void *ctx, idem_store_pos_t *pos, size_t n,
                            char *errstr, size_t errstr_size)
{
    return idem_store_positions_load(((partredis_t *)ctx)->store, pos, n,
                                     errstr, errstr_size);
}

static int r_load(void *ctx, const char *topic, int32_t partition,
                  size_t piece_bytes, idem_partstate_marks_fn cb, void *opaque,
                  size_t *pieces, char *errstr, size_t errstr_size)
{
    return idem_partstate_load(((partredis_t *)ctx)->state, topic, partition,
                               piece_bytes, cb, opaque, pieces, errstr,
                               errstr_size);
}

static void r_honour_global(void *ctx, int on)
{
    idem_partstate_honour_global(((partredis_t *)ctx)->state, on);
}

static int r_chunks(void *ctx, const idem_partstate_chunk_t *ch, size_t k,
                    idem_partstate_result_t *const *results, int64_t *windows,
                    int *rcs, char *errstr, size_t errstr_size)
{
    return idem_partstate_chunks(((partredis_t *)ctx)->state, ch, k, results,
                                 windows, rcs, errstr, errstr_size);
}

static int r_layout_read(void *ctx, idem_layout_t *out, char *errstr,
                         size_t errstr_size)
{
    partredis_t *r = ctx;
    return idem_layout_store_read(r->store, r->conf, out, errstr, errstr_size);
}

static int r_layout_switch(void *ctx, idem_layout_kind_t expect,
                           idem_layout_kind_t to, idem_layout_t *out,
                           char *errstr, size_t errstr_size)
{
    partredis_t *r = ctx;
    return idem_layout_store_switch(r->store, r->conf, r->layout_sha, expect,
                                    to, out, errstr, errstr_size);
}

static void r_effect_layout(void *ctx, const char *layout)
{
    idem_store_effect_layout(((partredis_t *)ctx)->store, layout);
}

static void r_destroy(void *ctx)
{
    partredis_t *r = ctx;
    if (!r)
        return;
    idem_partstate_destroy(r->state);
    free(r);
}

int idem_partredis_open(idem_store_t *store, const idem_conf_t *conf,
                        idem_partscope_redis_t *out, char *errstr,
                        size_t errstr_size)
{
    partredis_t *r = idem_xcalloc(1, sizeof(*r));
    r->store = store;
    r->conf = conf;
    if (!(r->state = idem_partstate_new(store, conf, errstr, errstr_size))) {
        free(r);
        return -1;
    }
    *out = (idem_partscope_redis_t){
        .hashkey = r_hashkey,
        .connections = r_connections,
        .run_id = r_run_id,
        .window_seconds = r_window_seconds,
        .now = r_now,
        .partitions = r_partitions,
        .epoch_bump = r_epoch_bump,
        .positions_load = r_positions_load,
        .load = r_load,
        .honour_global = r_honour_global,
        .chunks = r_chunks,
        .layout_read = r_layout_read,
        .layout_switch = r_layout_switch,
        .effect_layout = r_effect_layout,
        .destroy = r_destroy,
        .ctx = r,
    };
    return 0;
}
