/* fuzz_envelope: a record's value and its idempotency_key / message_id
 * headers through idem_envelope_parse, and the amount rule on raw text.
 * Input: 1 byte = length of the idempotency_key header (0xff = absent),
 * 1 byte = length of the message_id header (0xff = absent), the header
 * bytes, then the value. The processor does not read the Kafka key.
 * A value that parses is also copied the way the forward handler does
 * (idem_envelope_set_member), and the copy must parse to the same. The
 * fast read (envscan) and jansson's must give the same answer, byte for
 * byte, for every input: with the default rules, and with a few sets of
 * fields (script.fields: JSON Pointers, nested, escaped) whose values
 * must match in type and bytes. */
#include "input/envelope.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    size_t klen = data[0], mlen = data[1];
    size_t pos = 2;
    rd_kafka_headers_t *h = rd_kafka_headers_new(2);
    if (klen != 0xff) {
        klen = klen < size - pos ? klen : size - pos;
        rd_kafka_header_add(h, "idempotency_key", -1, data + pos,
                            (ssize_t)klen);
        pos += klen;
    }
    if (mlen != 0xff) {
        mlen = mlen < size - pos ? mlen : size - pos;
        rd_kafka_header_add(h, "message_id", -1, data + pos, (ssize_t)mlen);
        pos += mlen;
    }
    /* The value in a buffer of its own size, so ASan sees any overread. */
    size_t vlen = size - pos;
    char *value = malloc(vlen ? vlen : 1);
    memcpy(value, data + pos, vlen);
    idem_envelope_t env;
    idem_reason_t reason;
    char err[256];
    for (int ledger = 0; ledger < 2; ledger++) {
        if (idem_envelope_parse(value, vlen, h, ledger, 1 << 20, &env, &reason,
                                err, sizeof(err)) == 0) {
            if (env.identity_len == 0 ||
                env.identity_len > IDEM_ENVELOPE_ID_MAX ||
                env.message_id_len > IDEM_ENVELOPE_ID_MAX)
                abort();
            if (ledger &&
                (env.amount_minor < 1 || env.amount_minor > 100000000000LL))
                abort();
            /* The forward handler's copy (value + processed_at) must parse
             * to the same identity and amount. */
            size_t olen;
            char *copy = idem_envelope_set_member(value, vlen, "processed_at",
                                                  "\"T\"", &olen);
            idem_envelope_t again;
            if (idem_envelope_parse(copy, olen, h, ledger, (size_t)-1, &again,
                                    &reason, err, sizeof(err)) ||
                again.identity_len != env.identity_len ||
                memcmp(again.identity, env.identity, env.identity_len) ||
                again.amount_minor != env.amount_minor)
                abort();
            free(copy);
        } else if (reason >= IDEM_REASON_CNT || !err[0]) {
            abort();
        }
    }
    /* Fast read against jansson's, with the default rules. */
    for (int ledger = 0; ledger < 2; ledger++) {
        static idem_envelope_rules_t *rules[2][2];
        for (int fast = 0; fast < 2 && !rules[ledger][fast]; fast++) {
            rules[ledger][fast] = idem_envelope_rules_new(
                IDEM_ENVELOPE_JSON, IDEM_ENVELOPE_IDENTITY_DEFAULT,
                IDEM_ENVELOPE_MESSAGE_ID_DEFAULT, ledger, 1 << 20, err,
                sizeof(err));
            idem_envelope_rules_fast(rules[ledger][fast], fast);
        }
        idem_envelope_t e[2];
        idem_reason_t rs[2] = {0, 0};
        char errs[2][256] = {"", ""};
        int rc[2];
        for (int fast = 0; fast < 2; fast++)
            rc[fast] = idem_envelope_read(rules[ledger][fast], value, vlen, h,
                                          NULL, 0, &e[fast], &rs[fast],
                                          errs[fast], sizeof(errs[fast]));
        if (rc[0] != rc[1] ||
            (rc[0] && (rs[0] != rs[1] || strcmp(errs[0], errs[1]))) ||
            (!rc[0] &&
             (e[0].identity_len != e[1].identity_len ||
              memcmp(e[0].identity, e[1].identity, e[0].identity_len) ||
              e[0].message_id_len != e[1].message_id_len ||
              memcmp(e[0].message_id, e[1].message_id, e[0].message_id_len) ||
              strcmp(e[0].user_id, e[1].user_id) ||
              strcmp(e[0].currency, e[1].currency) ||
              e[0].amount_minor != e[1].amount_minor ||
              e[0].json_object != e[1].json_object)))
            abort();
    }
    /* Fields at a few pointer sets, fast read against jansson's. */
    static const char *const lists[] = {
        "/user_id,/amount,/currency",
        "/a,/a/b,/a/b/c,/a~1b,/x~0y,/b,/c,/d,/0,/a/0",
        "/,//,/a/,/event/id,/idempotency_key,/message_id",
    };
    for (size_t l = 0; l < sizeof(lists) / sizeof(lists[0]); l++) {
        int ledger = l == 0;
        static idem_envelope_rules_t *frules[3][2];
        for (int fast = 0; fast < 2 && !frules[l][fast]; fast++) {
            frules[l][fast] = idem_envelope_rules_new(
                IDEM_ENVELOPE_JSON, IDEM_ENVELOPE_IDENTITY_DEFAULT,
                IDEM_ENVELOPE_MESSAGE_ID_DEFAULT, ledger, 1 << 20, err,
                sizeof(err));
            idem_envelope_rules_fast(frules[l][fast], fast);
            if (idem_envelope_rules_fields(frules[l][fast], "script.fields",
                                           lists[l], err, sizeof(err)))
                abort();
        }
        idem_envelope_t e[2];
        idem_reason_t rs[2] = {0, 0};
        char errs[2][256] = {"", ""};
        int rc[2];
        for (int fast = 0; fast < 2; fast++)
            rc[fast] = idem_envelope_read(frules[l][fast], value, vlen, h, NULL,
                                          0, &e[fast], &rs[fast], errs[fast],
                                          sizeof(errs[fast]));
        if (rc[0] != rc[1] ||
            (rc[0] && (rs[0] != rs[1] || strcmp(errs[0], errs[1]))))
            abort();
        if (!rc[0]) {
            if (e[0].nfields != e[1].nfields ||
                e[0].identity_len != e[1].identity_len ||
                memcmp(e[0].identity, e[1].identity, e[0].identity_len))
                abort();
            for (size_t i = 0; i < e[0].nfields; i++) {
                const idem_envelope_field_t *a = &e[0].fields[i],
                                            *b = &e[1].fields[i];
                if (a->type != b->type || a->len != b->len ||
                    memcmp(a->text, b->text, a->len + 1))
                    abort();
            }
            idem_envelope_term(&e[0]);
            idem_envelope_term(&e[1]);
        }
    }
    /* The amount rule on the raw value: what it accepts is a number whose
     * double is within rounding of the cents it gave. */
    int64_t minor;
    if (idem_amount_parse(value, vlen, &minor, err, sizeof(err)) == 0) {
        char *text = malloc(vlen + 1);
        memcpy(text, value, vlen);
        text[vlen] = '\0';
        double d = strtod(text, NULL) * 100.0;
        free(text);
        double diff = d - (double)minor;
        if (minor < 1 || minor > 100000000000LL ||
            diff > 1e-3 * (double)minor || -diff > 1e-3 * (double)minor)
            abort();
    }
    free(value);
    rd_kafka_headers_destroy(h);
    return 0;
}
