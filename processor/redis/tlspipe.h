/* tlspipe: a TLS client connection (OpenSSL) presented as a plain local
 * socket, so a library that only speaks to file descriptors (hiredis 0.14)
 * can talk TLS: a thread per connection carries the bytes between one end
 * of a socketpair and the TLS session. */
#ifndef IDEM_TLSPIPE_H
#define IDEM_TLSPIPE_H

#include <stddef.h>
#include <stdint.h>

typedef struct idem_tlspipe_s idem_tlspipe_t;

typedef struct {
    const char *ca_file;     /* PEM CA bundle; NULL = the system's */
    const char *cert_file;   /* client certificate chain (PEM) or NULL */
    const char *key_file;    /* its private key (PEM) or NULL */
    const char *server_name; /* name checked in the certificate and sent
                                as SNI; NULL = the host connected to */
    int verify;              /* 0: accept any certificate (testing only) */
} idem_tlspipe_opts_t;

/* Connects to host:port, completes the TLS handshake and verifies the
 * server's certificate (chain against ca_file, name against server_name),
 * all within timeout_ms. On success returns the pipe and sets *app_fd to
 * the local end the caller reads and writes in the clear (the caller owns
 * it and closes it first, then calls idem_tlspipe_close). Returns NULL with
 * one line in errstr naming the redis.tls.* key at fault, e.g.
 * "redis.tls.ca.file: certificate verify failed for 127.0.0.1:6380 (...)".
 * opts and its strings are borrowed for the call only. */
idem_tlspipe_t *idem_tlspipe_open(const char *host, int port,
                                  const idem_tlspipe_opts_t *opts,
                                  int64_t timeout_ms, int *app_fd, char *errstr,
                                  size_t errstr_size);

/* Why the pipe's thread ended (e.g. the server's TLS alert), copied into
 * buf; empty while it runs or after a clean end. Returns buf. */
const char *idem_tlspipe_error(idem_tlspipe_t *t, char *buf, size_t size);

/* 1 when the thread ended on the server's alert that it wants a client
 * certificate (TLS 1.3 sends it after the handshake), else 0. */
int idem_tlspipe_cert_required(idem_tlspipe_t *t);

/* Waits for the pipe's thread to end (it ends once the caller's end is
 * closed, or when the server closes), then frees the TLS session and the
 * socket. NULL is a no-op. */
void idem_tlspipe_close(idem_tlspipe_t *t);

#endif
