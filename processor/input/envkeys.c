/* envkeys: the configuration keys of reading a record (envelope.*) and
 * their checks (conf.h). */
#include "input/envelope.h"
#include "input/envkeys.h"

static int identity_check(const idem_conf_key_t *key, const char *value,
                          char *errstr, size_t errstr_size)
{
    return idem_envelope_sources_check(key->name, value, 0, errstr,
                                       errstr_size);
}

static int message_id_check(const idem_conf_key_t *key, const char *value,
                            char *errstr, size_t errstr_size)
{
    return idem_envelope_sources_check(key->name, value, 1, errstr,
                                       errstr_size);
}

/* clang-format off */
static const idem_conf_key_t envelope_keys[] = {
    IDEM_CONF_ENUM("envelope.format", envelope_format, "json", 0,
        "json: the value must be a JSON object; bytes: the value is not parsed (identity from headers or the key)",
        "json", "bytes"),
    IDEM_CONF_STR("envelope.identity", envelope_identity, IDEM_ENVELOPE_IDENTITY_DEFAULT, 0, identity_check,
        "where the dedup identity comes from: comma list of value:<JSON Pointer>, header:<name>, key; the first found wins"),
    IDEM_CONF_STR("envelope.message.id", envelope_message_id, IDEM_ENVELOPE_MESSAGE_ID_DEFAULT, 0, message_id_check,
        "where the message id comes from (same syntax; empty: none): tells a redelivery from a resend"),
    {.name = NULL},
};
/* clang-format on */

const idem_conf_module_t idem_envelope_conf = {
    .name = "envelope",
    .doc = "where a record's identity and message id come from",
    .keys = envelope_keys,
};
