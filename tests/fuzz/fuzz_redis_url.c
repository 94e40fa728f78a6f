/* fuzz_redis_url: the Redis URL parser (processor/redis/redisconn.c) and its
 * redaction: every parse ends in NUL-terminated fields, and neither
 * overruns its buffers. */
#include "redis/redisconn.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *url = malloc(size + 1);
    memcpy(url, data, size);
    url[size] = '\0';
    idem_redisconn_url_t u;
    char err[512], buf[1024], small[8];
    err[0] = '\0';
    if (idem_redisconn_url_parse(url, &u, err, sizeof(err)) == 0) {
        if (!memchr(u.host, '\0', sizeof(u.host)) ||
            !memchr(u.path, '\0', sizeof(u.path)) ||
            !memchr(u.username, '\0', sizeof(u.username)) ||
            !memchr(u.password, '\0', sizeof(u.password)))
            abort();
    } else if (!memchr(err, '\0', sizeof(err))) {
        abort();
    }
    idem_redisconn_url_redact(url, buf, sizeof(buf));
    if (!memchr(buf, '\0', sizeof(buf)))
        abort();
    idem_redisconn_url_redact(url, small, sizeof(small));
    free(url);
    return 0;
}
