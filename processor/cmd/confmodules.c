/* confmodules: the modules whose keys make idemproc's configuration, in
 * the order help lists them (as nginx lists its modules in ngx_modules.c),
 * and the process's own keys (logs, the HTTP endpoints). */
#include "conf/conf.h"
#include "effect/handlerkeys.h"
#include "input/envkeys.h"
#include "kafka/kafka.h"
#include "loop/loopkeys.h"
#include "obs/http.h"
#include "outbox/outboxkeys.h"
#include "redis/redisconn.h"

/* An empty value disables HTTP; anything else must be what the server
 * will bind, so check-config refuses what run would. */
static int listen_check(const idem_conf_key_t *key, const char *value,
                        char *errstr, size_t errstr_size)
{
    (void)key;
    return *value ? idem_http_listen_check(value, errstr, errstr_size) : 0;
}

#define BOTH IDEM_KEY_OUTBOX

/* clang-format off */
static const idem_conf_key_t process_keys[] = {
    IDEM_CONF_STR("http.listen", http_listen, "127.0.0.1:9464", BOTH, listen_check,
        "metrics and probes address host:port; empty disables HTTP"),
    IDEM_CONF_ENUM("log.level", log_level, "info", BOTH,
        "least severe level logged",
        "debug", "info", "warn", "error"),
    IDEM_CONF_ENUM("log.format", log_format, "json", BOTH,
        "json: one object a line; text: for people",
        "json", "text"),
    {.name = NULL},
};
/* clang-format on */

static const idem_conf_module_t process_conf = {
    .name = "process",
    .doc = "logs and the HTTP endpoints",
    .keys = process_keys,
    .flags = BOTH,
};

/* One line per module. */
/* clang-format off */
static const idem_conf_module_t *const modules[] = {
    &idem_kafka_conf,
    &idem_handler_conf,
    &idem_envelope_conf,
    &idem_redis_conf,
    &idem_loop_conf,
    &process_conf,
    &idem_outbox_conf,
};
/* clang-format on */

#define MODULE_CNT (sizeof(modules) / sizeof(modules[0]))

const idem_conf_module_t *idem_conf_module_at(size_t i)
{
    return i < MODULE_CNT ? modules[i] : idem_handler_conf_at(i - MODULE_CNT);
}
