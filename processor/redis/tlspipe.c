/* tlspipe: a TLS client connection (OpenSSL) presented as a plain local
 * socket, so a library that only speaks to file descriptors (hiredis 0.14)
 * can talk TLS: a thread per connection carries the bytes between one end
 * of a socketpair and the TLS session. */
#include "redis/tlspipe.h"
#include "base/util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

/* One TLS record at most; either direction holds one buffer in flight. */
#define PIPE_BUF_BYTES 16384

struct idem_tlspipe_s {
    SSL *ssl;
    int net;  /* the TCP socket (non-blocking), owned */
    int pipe; /* our end of the socketpair, owned by the thread */
    pthread_t thread;
    pthread_mutex_t lock;
    char err[256];     /* why the thread ended, under lock; empty = clean */
    int cert_required; /* under lock: the server wanted a client certificate */
};

/* The first queued OpenSSL error as text ("unknown" when none); clears
 * the queue. *cert_required (may be NULL) says whether it was the
 * server's alert that it wants a client certificate. */
static const char *ssl_err_why(char *buf, size_t size, int *cert_required)
{
    unsigned long e = ERR_get_error();
    if (cert_required)
        *cert_required =
            e && ERR_GET_REASON(e) == SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED;
    if (!e) {
        snprintf(buf, size, "unknown error");
    } else {
        const char *r = ERR_reason_error_string(e);
        if (r)
            snprintf(buf, size, "%s", r);
        else
            ERR_error_string_n(e, buf, size);
    }
    ERR_clear_error();
    return buf;
}

static const char *ssl_err(char *buf, size_t size)
{
    return ssl_err_why(buf, size, NULL);
}

static int64_t left_ms(int64_t deadline)
{
    int64_t l = deadline - idem_now_ms();
    return l > 0 ? l : 0;
}

/* A non-blocking TCP socket connected to host:port before the deadline, or
 * -1 with errstr. */
static int tcp_connect(const char *host, int port, int64_t deadline,
                       int64_t timeout_ms, char *errstr, size_t errstr_size)
{
    char service[16];
    snprintf(service, sizeof(service), "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(host, service, &hints, &res);
    if (gai) {
        snprintf(errstr, errstr_size, "redis: cannot resolve %s: %s", host,
                 gai_strerror(gai));
        return -1;
    }
    int fd = -1;
    snprintf(errstr, errstr_size, "redis: connect: %s:%d: no address", host,
             port);
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family,
                    ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    ai->ai_protocol);
        if (fd < 0)
            continue;
        int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
        if (rc && errno == EINPROGRESS) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            int n;
            do
                n = poll(&p, 1, (int)left_ms(deadline));
            while (n < 0 && errno == EINTR);
            if (n == 0) {
                snprintf(errstr, errstr_size,
                         "redis: connect: %s:%d: timeout after %" PRId64 " ms",
                         host, port, timeout_ms);
                close(fd);
                fd = -1;
                break;
            }
            int soerr = 0;
            socklen_t l = sizeof(soerr);
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &l);
            rc = soerr ? -1 : 0;
            errno = soerr;
        }
        if (rc == 0)
            break;
        snprintf(errstr, errstr_size, "redis: connect: %s:%d: %s", host, port,
                 strerror(errno));
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd;
}

static int is_ip_literal(const char *name)
{
    unsigned char buf[sizeof(struct in6_addr)];
    return inet_pton(AF_INET, name, buf) == 1 ||
           inet_pton(AF_INET6, name, buf) == 1;
}

/* The client context for opts: protocol floor, trust anchors, our own
 * certificate. NULL with errstr naming the key at fault. */
static SSL_CTX *ctx_new(const idem_tlspipe_opts_t *o, char *errstr,
                        size_t errstr_size)
{
    char e[200];
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx) {
        snprintf(errstr, errstr_size, "redis: TLS: %s", ssl_err(e, sizeof(e)));
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_verify(ctx, o->verify ? SSL_VERIFY_PEER : SSL_VERIFY_NONE,
                       NULL);
    if (o->ca_file && *o->ca_file) {
        if (SSL_CTX_load_verify_locations(ctx, o->ca_file, NULL) != 1) {
            snprintf(errstr, errstr_size,
                     "redis.tls.ca.file: cannot load \"%s\": %s", o->ca_file,
                     ssl_err(e, sizeof(e)));
            goto fail;
        }
    } else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
        snprintf(errstr, errstr_size,
                 "redis.tls.ca.file: not set and the system's CA store "
                 "cannot be loaded: %s",
                 ssl_err(e, sizeof(e)));
        goto fail;
    }
    if (o->cert_file && *o->cert_file) {
        const char *key =
            o->key_file && *o->key_file ? o->key_file : o->cert_file;
        if (SSL_CTX_use_certificate_chain_file(ctx, o->cert_file) != 1) {
            snprintf(errstr, errstr_size,
                     "redis.tls.cert.file: cannot load \"%s\": %s",
                     o->cert_file, ssl_err(e, sizeof(e)));
            goto fail;
        }
        if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1 ||
            SSL_CTX_check_private_key(ctx) != 1) {
            snprintf(errstr, errstr_size,
                     "redis.tls.key.file: cannot use \"%s\": %s", key,
                     ssl_err(e, sizeof(e)));
            goto fail;
        }
    }
    return ctx;
fail:
    SSL_CTX_free(ctx);
    return NULL;
}

/* Why a handshake failed, as one line naming the key to look at. */
static void handshake_error(SSL *ssl, const idem_tlspipe_opts_t *o,
                            const char *host, int port, const char *name,
                            char *errstr, size_t errstr_size)
{
    char e[200];
    long vr = SSL_get_verify_result(ssl);
    if (o->verify && vr != X509_V_OK) {
        ERR_clear_error();
        if (vr == X509_V_ERR_HOSTNAME_MISMATCH ||
            vr == X509_V_ERR_IP_ADDRESS_MISMATCH)
            snprintf(errstr, errstr_size,
                     "redis.tls.server.name: the certificate of %s:%d is not "
                     "for \"%s\" (%s)",
                     host, port, name, X509_verify_cert_error_string(vr));
        else
            snprintf(errstr, errstr_size,
                     "redis.tls.ca.file: certificate verify failed for %s:%d "
                     "(%s)",
                     host, port, X509_verify_cert_error_string(vr));
        return;
    }
    int cert_required;
    ssl_err_why(e, sizeof(e), &cert_required);
    snprintf(errstr, errstr_size,
             "redis: TLS handshake with %s:%d failed: %s%s", host, port, e,
             cert_required ? " (the server wants a client certificate: set "
                             "redis.tls.cert.file and redis.tls.key.file)"
                           : "");
}

static int handshake(SSL *ssl, int fd, int64_t deadline, int64_t timeout_ms,
                     const char *host, int port, char *errstr,
                     size_t errstr_size)
{
    for (;;) {
        int r = SSL_connect(ssl);
        if (r == 1)
            return 0;
        int e = SSL_get_error(ssl, r);
        if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE)
            return -1;
        struct pollfd p = {
            .fd = fd, .events = e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT};
        int n = poll(&p, 1, (int)left_ms(deadline));
        if (n == 0) {
            snprintf(errstr, errstr_size,
                     "redis: TLS handshake with %s:%d: timeout after %" PRId64
                     " ms",
                     host, port, timeout_ms);
            return -2;
        }
    }
}

static void pipe_fail(idem_tlspipe_t *t, const char *what, int ssl_error)
{
    char e[200];
    if (ssl_error == SSL_ERROR_SYSCALL && errno)
        snprintf(e, sizeof(e), "%s", strerror(errno));
    else if (ssl_error == SSL_ERROR_SYSCALL)
        snprintf(e, sizeof(e), "connection closed without close_notify");
    int cert_required = 0;
    if (ssl_error != SSL_ERROR_SYSCALL)
        ssl_err_why(e, sizeof(e), &cert_required);
    pthread_mutex_lock(&t->lock);
    t->cert_required = cert_required;
    snprintf(t->err, sizeof(t->err), "TLS %s: %s", what, e);
    pthread_mutex_unlock(&t->lock);
}

/* The pipe's thread: moves bytes both ways until either side closes. Our
 * socketpair end and the TCP socket are non-blocking; poll waits for
 * whichever side can make progress. SIGPIPE is blocked on this thread. */
static void *pump(void *arg)
{
    idem_tlspipe_t *t = arg;
    char up[PIPE_BUF_BYTES], down[PIPE_BUF_BYTES]; /* to net, to pipe */
    size_t up_len = 0, up_off = 0, down_len = 0, down_off = 0;
    int clean = 0, net_hup = 0;
    for (;;) {
        /* What the TLS session waits for on the socket (a write can need
         * a read, e.g. a key update, and the other way round). */
        int progress = 0, net_wants_write = 0, net_wants_read = 0;
        if (up_len == 0) {
            ssize_t n = recv(t->pipe, up, sizeof(up), MSG_DONTWAIT);
            if (n == 0) {
                clean = 1; /* the client closed: we are done */
                break;
            }
            if (n < 0 && errno != EAGAIN && errno != EINTR)
                break;
            if (n > 0) {
                up_len = (size_t)n;
                up_off = 0;
                progress = 1;
            }
        }
        if (up_off < up_len) {
            ERR_clear_error();
            errno = 0;
            int r = SSL_write(t->ssl, up + up_off, (int)(up_len - up_off));
            if (r > 0) {
                up_off += (size_t)r;
                if (up_off == up_len)
                    up_len = up_off = 0;
                progress = 1;
            } else {
                int e = SSL_get_error(t->ssl, r);
                if (e == SSL_ERROR_WANT_WRITE)
                    net_wants_write = 1;
                else if (e == SSL_ERROR_WANT_READ)
                    net_wants_read = 1;
                else {
                    /* The server's alert, when it sent one, says more than
                     * the reset that follows it. */
                    char probe[256];
                    ERR_clear_error();
                    int rr = SSL_read(t->ssl, probe, sizeof(probe));
                    int re = SSL_get_error(t->ssl, rr);
                    if (rr <= 0 && re == SSL_ERROR_SSL)
                        pipe_fail(t, "read", re);
                    else
                        pipe_fail(t, "write", e);
                    break;
                }
            }
        }
        if (down_len == 0) {
            ERR_clear_error();
            errno = 0;
            int r = SSL_read(t->ssl, down, sizeof(down));
            if (r > 0) {
                down_len = (size_t)r;
                down_off = 0;
                progress = 1;
            } else {
                int e = SSL_get_error(t->ssl, r);
                if (e == SSL_ERROR_ZERO_RETURN) {
                    pthread_mutex_lock(&t->lock);
                    snprintf(t->err, sizeof(t->err),
                             "the server closed the TLS session");
                    pthread_mutex_unlock(&t->lock);
                    break;
                }
                if (e == SSL_ERROR_WANT_WRITE)
                    net_wants_write = 1;
                else if (e == SSL_ERROR_WANT_READ)
                    net_wants_read = 1;
                else {
                    pipe_fail(t, "read", e);
                    break;
                }
            }
        }
        if (down_off < down_len) {
            ssize_t n = send(t->pipe, down + down_off, down_len - down_off,
                             MSG_DONTWAIT | MSG_NOSIGNAL);
            if (n < 0 && errno != EAGAIN && errno != EINTR) {
                clean = 1;
                break;
            }
            if (n > 0) {
                down_off += (size_t)n;
                if (down_off == down_len)
                    down_len = down_off = 0;
                progress = 1;
            }
        }
        if (progress)
            continue;
        struct pollfd p[2] = {
            {.fd = t->pipe,
             .events = (short)((up_len == 0 ? POLLIN : 0) |
                               (down_off < down_len ? POLLOUT : 0))},
            /* A socket that hung up stays readable: stop polling it (so a
             * client that is slow to read the rest does not make us spin);
             * the next SSL_read reports the end. */
            {.fd = net_hup ? -1 : t->net,
             .events = (short)((net_wants_read ? POLLIN : 0) |
                               (net_wants_write ? POLLOUT : 0))}};
        if (poll(p, 2, 1000) < 0 && errno != EINTR)
            break;
        if (p[0].revents & (POLLHUP | POLLERR | POLLNVAL)) {
            clean = 1;
            break;
        }
        if (p[1].revents & (POLLHUP | POLLERR))
            net_hup = 1;
    }
    if (clean)
        SSL_shutdown(t->ssl); /* close_notify, best effort */
    /* The client sees end of stream now (and t->err, if it asks). Only
     * shut down, not closed: a write hiredis makes before it notices would
     * otherwise raise SIGPIPE in a process that did not ignore it (verify,
     * a test). idem_tlspipe_close closes it. */
    shutdown(t->pipe, SHUT_WR);
    return NULL;
}

idem_tlspipe_t *idem_tlspipe_open(const char *host, int port,
                                  const idem_tlspipe_opts_t *o,
                                  int64_t timeout_ms, int *app_fd, char *errstr,
                                  size_t errstr_size)
{
    int64_t deadline = idem_now_ms() + timeout_ms;
    SSL_CTX *ctx = ctx_new(o, errstr, errstr_size);
    if (!ctx)
        return NULL;
    int fd = tcp_connect(host, port, deadline, timeout_ms, errstr, errstr_size);
    if (fd < 0) {
        SSL_CTX_free(ctx);
        return NULL;
    }
    SSL *ssl = SSL_new(ctx);
    SSL_CTX_free(ctx); /* the session keeps its own reference */
    const char *name =
        o->server_name && *o->server_name ? o->server_name : host;
    if (o->verify) {
        X509_VERIFY_PARAM *vp = SSL_get0_param(ssl);
        X509_VERIFY_PARAM_set_hostflags(vp,
                                        X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
        if (is_ip_literal(name))
            X509_VERIFY_PARAM_set1_ip_asc(vp, name);
        else
            X509_VERIFY_PARAM_set1_host(vp, name, 0);
    }
    if (!is_ip_literal(name))
        SSL_set_tlsext_host_name(ssl, name);
    SSL_set_mode(ssl, SSL_MODE_ENABLE_PARTIAL_WRITE |
                          SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    SSL_set_fd(ssl, fd);

    /* OpenSSL writes with write(2): a peer that closed during the
     * handshake must not kill the process with SIGPIPE. The thread created
     * below inherits the blocked mask. */
    sigset_t sigpipe, old;
    sigemptyset(&sigpipe);
    sigaddset(&sigpipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &sigpipe, &old);
    idem_tlspipe_t *t = NULL;
    int sv[2] = {-1, -1};
    int hs = handshake(ssl, fd, deadline, timeout_ms, host, port, errstr,
                       errstr_size);
    if (hs == -1)
        handshake_error(ssl, o, host, port, name, errstr, errstr_size);
    if (hs == 0 && socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) {
        snprintf(errstr, errstr_size, "redis: socketpair: %s", strerror(errno));
        hs = -1;
    }
    if (hs == 0) {
        t = idem_xcalloc(1, sizeof(*t));
        t->ssl = ssl;
        t->net = fd;
        t->pipe = sv[1];
        pthread_mutex_init(&t->lock, NULL);
        if (pthread_create(&t->thread, NULL, pump, t)) {
            snprintf(errstr, errstr_size, "redis: cannot start TLS thread");
            pthread_mutex_destroy(&t->lock);
            free(t);
            t = NULL;
            close(sv[0]);
            close(sv[1]);
        }
    }
    sigset_t pending;
    struct timespec zero = {0, 0};
    if (!sigismember(&old, SIGPIPE) && sigpending(&pending) == 0 &&
        sigismember(&pending, SIGPIPE))
        sigtimedwait(&sigpipe, NULL, &zero);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!t) {
        SSL_free(ssl);
        close(fd);
        return NULL;
    }
    *app_fd = sv[0];
    return t;
}

void idem_tlspipe_close(idem_tlspipe_t *t)
{
    if (!t)
        return;
    pthread_join(t->thread, NULL);
    if (t->pipe >= 0)
        close(t->pipe);
    SSL_free(t->ssl);
    close(t->net);
    pthread_mutex_destroy(&t->lock);
    free(t);
}

const char *idem_tlspipe_error(idem_tlspipe_t *t, char *buf, size_t size)
{
    pthread_mutex_lock(&t->lock);
    snprintf(buf, size, "%s", t->err);
    pthread_mutex_unlock(&t->lock);
    return buf;
}

int idem_tlspipe_cert_required(idem_tlspipe_t *t)
{
    pthread_mutex_lock(&t->lock);
    int r = t->cert_required;
    pthread_mutex_unlock(&t->lock);
    return r;
}
