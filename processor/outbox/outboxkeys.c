/* outboxkeys: the outbox relay's configuration keys and their checks
 * (conf.h). */
#include "outbox/outboxkeys.h"
#include "outbox/outboxrow.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

/* Whether s is a SQL identifier we may put into a statement unquoted:
 * [schema.]name, letters, digits and '_', not starting with a digit. */
static int is_sql_name(const char *s)
{
    int parts = 0;
    for (;;) {
        if (!isalpha((unsigned char)*s) && *s != '_')
            return 0;
        while (isalnum((unsigned char)*s) || *s == '_')
            s++;
        parts++;
        if (!*s)
            return 1;
        if (*s != '.' || parts == 2)
            return 0;
        s++;
    }
}

static int table_check(const idem_conf_key_t *key, const char *value,
                       char *errstr, size_t errstr_size)
{
    (void)key;
    if (strlen(value) <= 127 && is_sql_name(value))
        return 0;
    snprintf(errstr, errstr_size,
             "outbox.table: \"%s\" is not a [schema.]name of letters, digits "
             "and _",
             value);
    return -1;
}

/* Checked when set, not row by row: a bad default would fail every row
 * whose topic column is NULL. */
static int topic_check(const idem_conf_key_t *key, const char *value,
                       char *errstr, size_t errstr_size)
{
    (void)key;
    char why[256];
    if (!*value || !idem_outboxrow_topic_check(value, why, sizeof(why)))
        return 0;
    snprintf(errstr, errstr_size, "outbox.%s", why);
    return -1;
}

#define OUTBOX IDEM_KEY_OUTBOX_ONLY

/* clang-format off */
static const idem_conf_key_t outbox_keys[] = {
    IDEM_CONF_STR("outbox.dsn", outbox_dsn, NULL, OUTBOX | IDEM_KEY_SECRET | IDEM_KEY_REQUIRED, NULL,
        "outbox: PostgreSQL connection string or URI (libpq); required by idemproc outbox"),
    IDEM_CONF_STR("outbox.table", outbox_table, "idemproc_outbox", OUTBOX, table_check,
        "outbox: the outbox table, [schema.]name (config/sql/outbox.sql)"),
    IDEM_CONF_STR("outbox.topic", outbox_topic, NULL, OUTBOX | IDEM_KEY_WRITES_TOPIC, topic_check,
        "outbox: topic for rows whose topic column is NULL"),
    IDEM_CONF_INT("outbox.batch.max", outbox_batch_max, "5000", 1, 100000, OUTBOX, NULL,
        "outbox: rows claimed, published and marked per transaction"),
    IDEM_CONF_INT("outbox.poll.ms", outbox_poll_ms, "1000", 10, 3600000, OUTBOX, NULL,
        "outbox: look for rows this often when no NOTIFY arrives"),
    IDEM_CONF_ENUM("outbox.after", outbox_after, "mark", OUTBOX,
        "outbox: mark: set published_at; delete: delete published rows",
        "mark", "delete"),
    {.name = NULL},
};
/* clang-format on */

const idem_conf_module_t idem_outbox_conf = {
    .name = "outbox",
    .doc = "the outbox relay (idemproc outbox)",
    .keys = outbox_keys,
    .flags = IDEM_KEY_OUTBOX_ONLY,
};
