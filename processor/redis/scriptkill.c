/* scriptkill: SCRIPT KILL over a connection of its own (scriptkill.h). */
#include "redis/scriptkill.h"
#include "redis/redisconn.h"

#include <hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "base/util.h"

struct idem_scriptkill_s {
    const idem_conf_t *conf;
    idem_redisconn_t *rc; /* NULL until connected */
};

static int connect_now(idem_scriptkill_t *k, char *errstr, size_t errstr_size)
{
    if (k->rc)
        return 0;
    /* replica_ok: no ROLE round trip, which a busy server would hold. */
    k->rc = idem_redisconn_open(k->conf, 1, errstr, errstr_size);
    return k->rc ? 0 : -1;
}

idem_scriptkill_t *idem_scriptkill_new(const idem_conf_t *conf)
{
    idem_scriptkill_t *k = idem_xcalloc(1, sizeof(*k));
    k->conf = conf;
    char err[256];
    connect_now(k, err, sizeof(err));
    return k;
}

idem_scriptkill_result_t idem_scriptkill_run(idem_scriptkill_t *k, int wait_ms,
                                             char *errstr, size_t errstr_size)
{
    if (connect_now(k, errstr, errstr_size))
        return IDEM_SCRIPTKILL_FAILED;
    redisContext *c = idem_redisconn_context(k->rc);
    struct timeval tv = {wait_ms / 1000, (wait_ms % 1000) * 1000};
    redisSetTimeout(c, tv);
    redisReply *r = redisCommand(c, "SCRIPT KILL");
    idem_scriptkill_result_t res;
    if (!r) {
        snprintf(errstr, errstr_size, "redis: SCRIPT KILL: %s", c->errstr);
        idem_redisconn_close(k->rc);
        k->rc = NULL;
        return IDEM_SCRIPTKILL_FAILED;
    }
    if (r->type != REDIS_REPLY_ERROR) {
        snprintf(errstr, errstr_size, "killed");
        res = IDEM_SCRIPTKILL_KILLED;
    } else {
        snprintf(errstr, errstr_size, "%s", r->str);
        res = !strncmp(r->str, "UNKILLABLE", 10) ? IDEM_SCRIPTKILL_UNKILLABLE
              : !strncmp(r->str, "NOTBUSY", 7)   ? IDEM_SCRIPTKILL_NOT_BUSY
                                                 : IDEM_SCRIPTKILL_FAILED;
    }
    freeReplyObject(r);
    return res;
}

void idem_scriptkill_destroy(idem_scriptkill_t *k)
{
    if (!k)
        return;
    idem_redisconn_close(k->rc);
    free(k);
}
