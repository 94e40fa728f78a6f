/* fixture_redisconn: helpers the redisconn tests of more than one tier share
 * (static inline: each test file takes what it uses). */
#ifndef IDEM_FIXTURE_REDISCONN_H
#define IDEM_FIXTURE_REDISCONN_H

#include "base/log.h"
#include "conf/conf.h"

#include <stddef.h>

/* The in-process connections log as the member would; keep the output of
 * the tests to their failures. */
static inline void quiet(void)
{
    idem_log_setup(IDEM_LOG_WARN, IDEM_LOG_TEXT);
}

/* ---- configuration and URL ---------------------------------------- */

static inline idem_conf_t *conf_load(const char *const extra[], char *errstr,
                                     size_t size)
{
    char *sets[32] = {"kafka.bootstrap.servers=127.0.0.1:9092", "group.id=g",
                      "input.topics=payments", "dlq.topic=payments.dlq"};
    size_t n = 4;
    for (size_t i = 0; extra && extra[i] && n < 32; i++)
        sets[n++] = (char *)extra[i];
    char *envp[] = {NULL};
    return idem_conf_load(NULL, envp, sets, n, errstr, size);
}

#endif
