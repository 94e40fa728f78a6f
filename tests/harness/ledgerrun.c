/* ledgerrun: the ledger handler through its ops (ledgerrun.h). */
#include "ledgerrun.h"
#include "effect/handler.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TH_LEDGER_MAX 64

struct th_ledger_s {
    void *h;
    idem_record_t recs[TH_LEDGER_MAX];
    idem_record_t *ptrs[TH_LEDGER_MAX];
    idem_result_t out[TH_LEDGER_MAX];
    size_t n;
};

th_ledger_t *th_ledger_start(const idem_conf_t *conf, idem_store_t *s)
{
    th_ledger_t *l = calloc(1, sizeof(*l));
    cr_assert(l);
    char err[512] = "";
    idem_handler_ctx_t ctx = {.conf = conf, .arg = "", .store = s};
    l->h = idem_handler_ledger.start(&ctx, err, sizeof(err));
    cr_assert(l->h, "ledger start: %s", err);
    return l;
}

int th_ledger_send(th_ledger_t *l, const idem_envelope_t *const *envs, size_t n,
                   char *errstr, size_t errstr_size)
{
    cr_assert_leq(n, TH_LEDGER_MAX);
    for (size_t i = 0; i < n; i++) {
        memset(&l->recs[i], 0, sizeof(l->recs[i]));
        l->recs[i].topic = "t";
        l->recs[i].offset = (int64_t)i;
        l->recs[i].identity = envs[i]->identity;
        l->recs[i].identity_len = envs[i]->identity_len;
        l->recs[i].message_id = envs[i]->message_id;
        l->recs[i].message_id_len = envs[i]->message_id_len;
        l->recs[i].env = envs[i];
        l->ptrs[i] = &l->recs[i];
    }
    if (idem_handler_ledger.submit(l->h, l->ptrs, n, NULL, 0, errstr,
                                   errstr_size))
        return -1;
    l->n = n;
    return 0;
}

int th_ledger_recv(th_ledger_t *l, idem_store_result_t *res, char *errstr,
                   size_t errstr_size)
{
    size_t n = idem_handler_ledger.collect(l->h, l->out, TH_LEDGER_MAX, 1000);
    cr_assert_eq(n, l->n, "one result per record");
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        const idem_result_t *o = &l->out[i];
        idem_store_result_t *r = &res[o->rec - l->recs];
        memset(r, 0, sizeof(*r));
        snprintf(r->detail, sizeof(r->detail), "%s", o->detail);
        switch (o->kind) {
        case IDEM_RESULT_DONE:
            r->mark = IDEM_MARK_NEW;
            break;
        case IDEM_RESULT_DUPLICATE:
            r->mark = IDEM_MARK_DONE;
            memcpy(r->prior_mid, o->prior_mid, o->prior_mid_len);
            r->prior_mid_len = o->prior_mid_len;
            break;
        case IDEM_RESULT_REJECT:
            r->mark = IDEM_MARK_REJECT;
            break;
        case IDEM_RESULT_BUSY:
            r->mark = IDEM_MARK_BUSY;
            break;
        default:
            snprintf(errstr, errstr_size, "%s", o->detail);
            rc = -1;
        }
    }
    l->n = 0;
    return rc;
}

int th_ledger_apply(th_ledger_t *l, const idem_envelope_t *const *envs,
                    size_t n, idem_store_result_t *res, char *errstr,
                    size_t errstr_size)
{
    if (th_ledger_send(l, envs, n, errstr, errstr_size))
        return -1;
    return th_ledger_recv(l, res, errstr, errstr_size);
}

void th_ledger_stop(th_ledger_t *l)
{
    if (!l)
        return;
    idem_handler_ledger.stop(l->h);
    free(l);
}
