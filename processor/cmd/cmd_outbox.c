/* cmd_outbox: `idemproc outbox`, the transactional outbox relay: wires
 * configuration, logging, metrics, the HTTP endpoints and the relay loop,
 * and owns the signals. */
#include "cmd/cmd.h"
#include "cmd/cmdline.h"
#include "cmd/signals.h"
#include "conf/conf.h"
#include "kafka/kafka.h"
#include "obs/http.h"
#include "base/log.h"
#include "obs/metrics.h"
#include "outbox/outbox.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* The run flag: set by the first SIGTERM/SIGINT/SIGHUP (finish the batch in
 * hand, mark, commit, exit 0); a second signal exits at once. Rows published
 * but not marked are published again by the next relay, with the same
 * message_id. */
void idem_cmd_outbox_usage(FILE *out)
{
    fprintf(out,
            "usage: idemproc outbox -c FILE [--set key=value]...\n"
            "  Transactional outbox relay: publishes the committed rows of "
            "the PostgreSQL\n"
            "  table outbox.table (schema: config/sql/outbox.sql) with the "
            "idempotent\n"
            "  producer, keyed by the row's key, with message_id and "
            "idempotency_key\n"
            "  headers, and marks (outbox.after=mark) or deletes them in the "
            "same\n"
            "  transaction once the broker acknowledged them. Needs "
            "outbox.dsn and\n"
            "  kafka.bootstrap.servers; see 'idemproc help config' "
            "(outbox.*).\n"
            "  SIGTERM/SIGINT/SIGHUP: finish the batch in hand, commit, "
            "exit 0; a second\n"
            "  signal exits at once. SIGUSR1/SIGUSR2: ignored.\n");
}

int idem_cmd_outbox(int argc, char **argv, char **envp)
{
    idem_conf_t *conf;
    int rc = idem_cmdline_conf_scope(argc, argv, envp, idem_cmd_outbox_usage,
                                     NULL, NULL, NULL, NULL,
                                     IDEM_CONF_SCOPE_OUTBOX, &conf);
    if (rc >= 0)
        return rc;
    char errstr[512];
    idem_log_setup((idem_log_level_t)conf->log_level,
                   (idem_log_format_t)conf->log_format);

    idem_signals_opts_t so = {
        .watchdog_s = (unsigned)((conf->shutdown_timeout_ms + 999) / 1000),
        .watchdog_msg = "{\"level\":\"error\",\"msg\":\"shutdown.timeout.ms "
                        "exceeded: exiting without marking the batch in "
                        "hand\"}",
        .second_exits = 1,
        .daemon = 1};
    idem_signals_setup(&so);

    rc = IDEM_EXIT_OK;
    idem_metrics_t *m = idem_metrics_new();
    idem_http_t *http = NULL;
    idem_outbox_t *o = idem_outbox_new(conf, m, errstr, sizeof(errstr));
    if (!o) {
        idem_log_kv(IDEM_LOG_ERROR, "cannot start", "error", errstr, NULL);
        rc = IDEM_EXIT_FAIL;
        goto out;
    }
    if (conf->http_listen && *conf->http_listen) {
        http = idem_http_start(conf->http_listen, m, conf->health_stall_ms,
                               errstr, sizeof(errstr));
        if (!http) {
            idem_log_kv(IDEM_LOG_ERROR, "cannot start http", "error", errstr,
                        NULL);
            rc = IDEM_EXIT_FAIL;
            goto out;
        }
    }
    idem_log_kv(IDEM_LOG_INFO, "outbox relay started", "member",
                conf->member_id, "table", conf->outbox_table, "after",
                conf->outbox_after == IDEM_OUTBOX_AFTER_DELETE ? "delete"
                                                               : "mark",
                "version", IDEM_VERSION, NULL);
    if (idem_outbox_run(o, idem_signals_stop_flag(), errstr, sizeof(errstr))) {
        idem_log_kv(IDEM_LOG_ERROR, "stopped with an error", "error", errstr,
                    NULL);
        rc = IDEM_EXIT_FAIL;
    } else {
        char pub[32], fail[32];
        snprintf(pub, sizeof(pub), "%" PRIu64, idem_outbox_published(o));
        snprintf(fail, sizeof(fail), "%" PRIu64, idem_outbox_failed(o));
        idem_log_kv(IDEM_LOG_INFO, "stopped cleanly", "published", pub,
                    "failed", fail, NULL);
    }
out:
    idem_http_stop(http);
    idem_outbox_destroy(o);
    idem_metrics_destroy(m);
    idem_conf_destroy(conf);
    return rc;
}

int idem_cmd_outbox_check(const idem_conf_t *conf, int timeout_ms, FILE *out)
{
    char errstr[512];
    int rc = IDEM_EXIT_OK;
    if (idem_kafka_check(conf, timeout_ms, out, errstr, sizeof(errstr))) {
        fprintf(stderr, "idemproc check-config: %s\n", errstr);
        rc = IDEM_EXIT_FAIL;
    }
    fflush(out);
    if (idem_outbox_check(conf, timeout_ms, out, errstr, sizeof(errstr))) {
        fprintf(stderr, "idemproc check-config: %s\n", errstr);
        rc = IDEM_EXIT_FAIL;
    }
    return rc;
}
