/* deadletter: the life of one dead-letter or retry-topic write
 * (deadletter.h). */
#include "loop/deadletter.h"
#include "base/util.h"

#include <stdlib.h>

ticket_t *idem_deadletter_ticket_new(void)
{
    return idem_xcalloc(1, sizeof(ticket_t));
}

void idem_deadletter_report(void *opaque, rd_kafka_resp_err_t err)
{
    ticket_t *t = opaque;
    if (t->orphan) {
        free(t);
        return;
    }
    t->err = err;
    t->state = err ? -1 : 1;
}

void idem_deadletter_release(ticket_t *t)
{
    if (!t)
        return;
    if (t->state == 0)
        t->orphan = 1;
    else
        free(t);
}

static int too_large(rd_kafka_resp_err_t err)
{
    return err == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE ||
           err == RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE;
}

idem_deadletter_step_t idem_deadletter_after(const ticket_t *t, int poison,
                                             int to_tier)
{
    if (t->state == 0)
        return IDEM_DL_PENDING;
    int retry = to_tier && !poison;
    if (t->state == 1)
        return retry ? IDEM_DL_RETRY_SENT : IDEM_DL_DEAD;
    if (too_large(t->err))
        return retry ? IDEM_DL_RETRY_REFUSED : IDEM_DL_DROP_VALUE;
    return IDEM_DL_FAILED;
}

const char *idem_deadletter_step2str(idem_deadletter_step_t s)
{
    switch (s) {
    case IDEM_DL_PENDING:
        return "pending";
    case IDEM_DL_DEAD:
        return "dead";
    case IDEM_DL_RETRY_SENT:
        return "retry-sent";
    case IDEM_DL_RETRY_REFUSED:
        return "retry-refused";
    case IDEM_DL_DROP_VALUE:
        return "drop-value";
    case IDEM_DL_FAILED:
        return "failed";
    }
    return "?";
}
