/* tcpnodelay: TCP_NODELAY on the connections the embedded broker accepts
 * (see tcpnodelay.h for why). */
#include "dev/tcpnodelay.h"

#include <dlfcn.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdatomic.h>
#include <sys/socket.h>

static atomic_int nodelay_on;

void idem_tcpnodelay_enable(void)
{
    atomic_store(&nodelay_on, 1);
}

static int nodelay(int fd)
{
    if (fd >= 0 && atomic_load(&nodelay_on)) {
        int one = 1;
        /* Fails harmlessly on a unix socket. */
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    return fd;
}

/* The libc functions, found once with RTLD_NEXT (atomics: the mock's
 * threads may race on the first call; both find the same address). */
typedef int accept_fn(int, struct sockaddr *, socklen_t *);
typedef int accept4_fn(int, struct sockaddr *, socklen_t *, int);
static _Atomic(accept_fn *) real_accept;
static _Atomic(accept4_fn *) real_accept4;

int accept(int fd, struct sockaddr *addr, socklen_t *len)
{
    accept_fn *f = atomic_load(&real_accept);
    if (!f) {
        f = (accept_fn *)dlsym(RTLD_NEXT, "accept");
        atomic_store(&real_accept, f);
    }
    return nodelay(f(fd, addr, len));
}

int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
    accept4_fn *f = atomic_load(&real_accept4);
    if (!f) {
        f = (accept4_fn *)dlsym(RTLD_NEXT, "accept4");
        atomic_store(&real_accept4, f);
    }
    return nodelay(f(fd, addr, len, flags));
}
