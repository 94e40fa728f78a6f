/* http: the metrics and probe endpoints (libmicrohttpd, its own thread). */
#ifndef IDEM_HTTP_H
#define IDEM_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "obs/metrics.h"

typedef struct idem_http_s idem_http_t;

/* Starts serving /metrics, /healthz and /readyz on `listen` ("host:port",
 * port 0 = any free port). `m` is borrowed and must outlive the server.
 * /healthz is 503 when the heartbeat is older than stall_ms.
 * Returns NULL with errstr ("http.listen: ...") on failure. */
idem_http_t *idem_http_start(const char *listen, idem_metrics_t *m,
                             int64_t stall_ms, char *errstr,
                             size_t errstr_size);

/* Checks an http.listen value as idem_http_start reads it (host:port,
 * the host resolved), binding nothing: check-config and run refuse the
 * same values. Returns 0, or -1 with "http.listen: ..." in errstr. */
int idem_http_listen_check(const char *listen, char *errstr,
                           size_t errstr_size);

/* The port actually bound (useful with port 0). */
int idem_http_port(const idem_http_t *h);

void idem_http_stop(idem_http_t *h); /* NULL is a no-op */

#endif
