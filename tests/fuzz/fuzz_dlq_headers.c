/* fuzz_dlq_headers: the dead letter's headers (idem_dlq_headers_new) from
 * arbitrary original headers, error text, reason and origin. Input: byte 0
 * = reason, byte 1 = number of original headers, bytes 2..9 = offset, then
 * for each header a 1-byte name length, a 1-byte value length (0xff = a
 * NULL value) and the bytes; the rest is the error text (up to a NUL) and
 * then the topic/group text. */
#include "kafka/dlq.h"
#include "kafka/retrytopic.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int take(const uint8_t *data, size_t size, size_t *pos, size_t n,
                const uint8_t **out)
{
    if (size - *pos < n)
        return -1;
    *out = data + *pos;
    *pos += n;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 10)
        return 0;
    idem_reason_t reason = (idem_reason_t)(data[0] % IDEM_REASON_CNT);
    int hcnt = data[1] % 16;
    int64_t offset;
    memcpy(&offset, data + 2, sizeof(offset));
    size_t pos = 10;
    rd_kafka_headers_t *orig = hcnt ? rd_kafka_headers_new(4) : NULL;
    int added = 0;
    for (int i = 0; i < hcnt; i++) {
        const uint8_t *lens, *name, *val;
        if (take(data, size, &pos, 2, &lens) ||
            take(data, size, &pos, lens[0], &name) ||
            take(data, size, &pos, lens[1] == 0xff ? 0 : lens[1], &val))
            break;
        char nm[256];
        memcpy(nm, name, lens[0]);
        nm[lens[0]] = '\0';
        rd_kafka_header_add(orig, nm, -1, lens[1] == 0xff ? NULL : val,
                            lens[1] == 0xff ? 0 : lens[1]);
        /* (a header named like one of ours is replaced, not kept, and a
         * retry topic's are dropped: dlq.original.* says it all) */
        if (!idem_dlq_header_is_own(nm) && !idem_retrytopic_header_is_own(nm))
            added++;
    }
    size_t rest = size - pos;
    char *text = malloc(rest + 2);
    memcpy(text, data + pos, rest);
    text[rest] = '\0';
    text[rest + 1] = '\0';
    const char *error = text;
    const char *topic = text + strlen(text) + 1;
    idem_dlq_origin_t o = {.topic = topic,
                           .partition = (int32_t)offset,
                           .offset = offset,
                           .timestamp = offset ^ 0x5555,
                           .group = topic,
                           .failed_at_ms = offset};
    rd_kafka_headers_t *h =
        idem_dlq_headers_new(orig, &o, reason, error, (int)(offset & 0xffff));
    /* The originals come first, untouched (but for ours, which are
     * replaced, and retry.* dropped), then the nine dlq.* headers. */
    if (rd_kafka_header_cnt(h) != (size_t)added + 9)
        abort();
    const void *v;
    size_t vs;
    if (rd_kafka_header_get_last(h, "dlq.error", &v, &vs) ||
        vs != strlen(error) || memcmp(v, error, vs))
        abort();
    if (rd_kafka_header_get_last(h, "dlq.reason", &v, &vs) ||
        vs != strlen(idem_reason2str(reason)))
        abort();
    rd_kafka_headers_destroy(h);
    if (orig)
        rd_kafka_headers_destroy(orig);
    free(text);
    return 0;
}
