/* fixture_httpclient: helpers the httpclient tests of more than one tier share
 * (static inline: each test file takes what it uses). */
#ifndef IDEM_FIXTURE_HTTPCLIENT_H
#define IDEM_FIXTURE_HTTPCLIENT_H

#include "handlers/httpclient.h"

static inline idem_httpclient_conf_t conf_for(const char *url, int inflight)
{
    idem_httpclient_conf_t c = {.url = url,
                                .content_type = "application/json",
                                .headers = NULL,
                                .timeout_ms = 10000,
                                .max_inflight = inflight,
                                .ca_file = NULL,
                                .tls_verify = 1};
    return c;
}

#endif
