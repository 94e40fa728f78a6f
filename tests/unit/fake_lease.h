/* fake_lease: a lease store of our own behind the loop's lease seam
 * (loop/lease.h), for the unit tests of the lease life and of the effect
 * protocol: one mark per identity, free, leased to an owner, or done with
 * the message id of the record that made it. */
#ifndef IDEM_TEST_FAKE_LEASE_H
#define IDEM_TEST_FAKE_LEASE_H
#include "loop/lease.h"

#include <stddef.h>

#define FAKE_LEASE_MAX 16

typedef struct {
    struct {
        char id[32];
        int state; /* 0 free, 1 leased, 2 done */
        char owner[64];
        char mid[32];
    } mark[FAKE_LEASE_MAX];
    size_t cnt;
    int down;   /* 1: every call fails (an outage) */
    int claims; /* claim calls made */
    int marks;  /* mark calls made */
} fake_lease_t;

/* A store seam over f (zeroed first). */
idem_lease_store_t fake_lease_init(fake_lease_t *f);

/* Identity `id` leased to `owner` (another member), as a claim of it
 * made elsewhere leaves it. */
void fake_lease_hold(fake_lease_t *f, const char *id, const char *owner);

#endif
