/* lease: the life of an external effect's dedup mark against the store
 * (lease.h). */
#include "loop/lease.h"

static int redis_claim(void *ctx, const char *owner,
                       const idem_envelope_t *const *env, size_t n,
                       idem_store_result_t *results, char *errstr,
                       size_t errstr_size)
{
    return idem_store_claim(ctx, owner, env, n, results, errstr, errstr_size);
}

static int redis_mark_done(void *ctx, const char *owner,
                           const idem_envelope_t *const *env, size_t n,
                           idem_store_result_t *results, char *errstr,
                           size_t errstr_size)
{
    return idem_store_mark_done(ctx, owner, env, n, results, errstr,
                                errstr_size);
}

idem_lease_store_t idem_lease_store_redis(idem_store_t *s)
{
    idem_lease_store_t st = {redis_claim, redis_mark_done, s};
    return st;
}

const char *idem_lease_verdict2str(idem_lease_verdict_t v)
{
    switch (v) {
    case IDEM_LEASE_GO:
        return "go";
    case IDEM_LEASE_DUPLICATE:
        return "duplicate";
    case IDEM_LEASE_AGAIN:
        return "again";
    case IDEM_LEASE_LEASED:
        return "leased";
    case IDEM_LEASE_BEHIND:
        return "behind";
    }
    return "?";
}

int idem_lease_claim(const idem_lease_store_t *st, const char *owner,
                     const idem_envelope_t *const *env,
                     idem_part_t *const *part, size_t n,
                     idem_store_result_t *results,
                     idem_lease_verdict_t *verdict, char *errstr,
                     size_t errstr_size)
{
    if (st->claim(st->ctx, owner, env, n, results, errstr, errstr_size))
        return -1;
    for (size_t i = 0; i < n; i++)
        if (part[i])
            part[i]->waiting = 0;
    for (size_t i = 0; i < n; i++) {
        idem_part_t *pt = part[i];
        if (pt && pt->waiting) {
            verdict[i] = IDEM_LEASE_BEHIND;
            continue;
        }
        switch (results[i].mark) {
        case IDEM_MARK_NEW:
            verdict[i] = IDEM_LEASE_GO;
            break;
        case IDEM_MARK_DONE:
            verdict[i] = IDEM_LEASE_DUPLICATE;
            break;
        case IDEM_MARK_AGAIN:
            verdict[i] = IDEM_LEASE_AGAIN;
            break;
        default: /* leased elsewhere */
            verdict[i] = IDEM_LEASE_LEASED;
            break;
        }
        if (pt && verdict[i] >= IDEM_LEASE_AGAIN)
            pt->waiting = 1;
    }
    return 0;
}

int idem_lease_mark(const idem_lease_store_t *st, const char *owner,
                    const idem_envelope_t *const *env, size_t n,
                    idem_store_result_t *results, char *errstr,
                    size_t errstr_size)
{
    return st->mark_done(st->ctx, owner, env, n, results, errstr, errstr_size);
}
