/* fake_lease: see fake_lease.h. */
#include "fake_lease.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

static int find(fake_lease_t *f, const idem_envelope_t *e)
{
    for (size_t i = 0; i < f->cnt; i++)
        if (strlen(f->mark[i].id) == e->identity_len &&
            !memcmp(f->mark[i].id, e->identity, e->identity_len))
            return (int)i;
    cr_assert_lt(f->cnt, FAKE_LEASE_MAX);
    snprintf(f->mark[f->cnt].id, sizeof(f->mark[0].id), "%.*s",
             (int)e->identity_len, e->identity);
    return (int)f->cnt++;
}

static int claim(void *ctx, const char *owner,
                 const idem_envelope_t *const *env, size_t n,
                 idem_store_result_t *res, char *errstr, size_t errstr_size)
{
    fake_lease_t *f = ctx;
    f->claims++;
    if (f->down) {
        snprintf(errstr, errstr_size, "redis: connection refused");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        memset(&res[i], 0, sizeof(res[i]));
        int again = 0;
        for (size_t j = 0; j < i && !again; j++)
            again = env[j]->identity_len == env[i]->identity_len &&
                    !memcmp(env[j]->identity, env[i]->identity,
                            env[i]->identity_len);
        int k = find(f, env[i]);
        if (again) {
            res[i].mark = IDEM_MARK_AGAIN;
        } else if (f->mark[k].state == 2) {
            res[i].mark = IDEM_MARK_DONE;
            res[i].prior_mid_len = strlen(f->mark[k].mid);
            memcpy(res[i].prior_mid, f->mark[k].mid, res[i].prior_mid_len);
        } else if (f->mark[k].state == 1 && strcmp(f->mark[k].owner, owner)) {
            res[i].mark = IDEM_MARK_BUSY;
            snprintf(res[i].detail, sizeof(res[i].detail), "%s",
                     f->mark[k].owner);
        } else {
            f->mark[k].state = 1;
            snprintf(f->mark[k].owner, sizeof(f->mark[k].owner), "%s", owner);
            res[i].mark = IDEM_MARK_NEW;
        }
    }
    return 0;
}

static int mark(void *ctx, const char *owner, const idem_envelope_t *const *env,
                size_t n, idem_store_result_t *res, char *errstr,
                size_t errstr_size)
{
    fake_lease_t *f = ctx;
    f->marks++;
    if (f->down) {
        snprintf(errstr, errstr_size, "redis: connection refused");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        memset(&res[i], 0, sizeof(res[i]));
        int k = find(f, env[i]);
        if (f->mark[k].state == 1 && strcmp(f->mark[k].owner, owner)) {
            res[i].mark = IDEM_MARK_LOST;
            snprintf(res[i].detail, sizeof(res[i].detail), "%s",
                     f->mark[k].owner);
            continue;
        }
        f->mark[k].state = 2;
        snprintf(f->mark[k].mid, sizeof(f->mark[k].mid), "%.*s",
                 (int)env[i]->message_id_len, env[i]->message_id);
        res[i].mark = IDEM_MARK_NEW;
    }
    return 0;
}

idem_lease_store_t fake_lease_init(fake_lease_t *f)
{
    memset(f, 0, sizeof(*f));
    return (idem_lease_store_t){claim, mark, f};
}

void fake_lease_hold(fake_lease_t *f, const char *id, const char *owner)
{
    cr_assert_lt(f->cnt, FAKE_LEASE_MAX);
    snprintf(f->mark[f->cnt].id, sizeof(f->mark[0].id), "%s", id);
    snprintf(f->mark[f->cnt].owner, sizeof(f->mark[0].owner), "%s", owner);
    f->mark[f->cnt].state = 1;
    f->cnt++;
}
