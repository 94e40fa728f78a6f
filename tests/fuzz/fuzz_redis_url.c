/* fuzz_redis_url: the Redis URL parser and its redaction. A thin file: it
 * only needs a parse and a redact function of the URL. */
#include "redisconn.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *url = malloc(size + 1);
    memcpy(url, data, size);
    url[size] = '\0';
    idem_redisconn_url_t addr;
    char err[512], buf[1024], small[8];
    if (idem_redisconn_url_parse(url, &addr, err, sizeof(err)) == 0) {
        if (memchr(addr.host, '\0', sizeof(addr.host)) == NULL ||
            memchr(addr.path, '\0', sizeof(addr.path)) == NULL ||
            memchr(addr.username, '\0', sizeof(addr.username)) == NULL ||
            memchr(addr.password, '\0', sizeof(addr.password)) == NULL)
            abort();
    }
    idem_redisconn_url_redact(url, buf, sizeof(buf));
    if (!memchr(buf, '\0', sizeof(buf)))
        abort();
    idem_redisconn_url_redact(url, small, sizeof(small));
    free(url);
    return 0;
}
