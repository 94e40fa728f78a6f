/* cmd_run: `idemproc run`, the processor: wires configuration, logging,
 * metrics, the HTTP endpoints and the pipeline, and owns the signals. */
#include "cmd/cmd.h"
#include "cmd/cmdline.h"
#include "cmd/signals.h"
#include "conf/conf.h"
#include "effect/fingerprint.h"
#include "obs/http.h"
#include "base/log.h"
#include "obs/metrics.h"
#include "loop/pipeline.h"
#include "dev/faults.h"
#include "redis/liveness.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Shutdown began without a signal (a fatal producer error): the same
 * watchdog bounds it. Called on the processing thread. */
static void arm_watchdog(void)
{
    idem_signals_arm_watchdog();
}

void idem_cmd_run_usage(FILE *out)
{
    fprintf(out, "usage: idemproc run -c FILE [--set key=value]...\n"
                 "  Runs a consumer-group member: consumes input.topics, "
                 "applies each record's\n"
                 "  effect exactly once through Redis, dead-letters poison to "
                 "dlq.topic and\n"
                 "  commits finished offsets. Configuration: file < "
                 "IDEMPROC_<KEY> environment\n"
                 "  < --set (see 'idemproc help config').\n"
                 "  SIGTERM/SIGINT/SIGHUP: finish the effects in flight, "
                 "flush, commit, leave\n"
                 "  the group, exit 0; a second signal exits at once without "
                 "committing.\n"
                 "  SIGUSR1/SIGUSR2: ignored.\n");
}

/* dev.fault.member.rss.file: the RSS member.memory.max reads. */
static int64_t fault_rss(void *path)
{
    return idem_faults_member_rss(path);
}

int idem_cmd_run(int argc, char **argv, char **envp)
{
    idem_conf_t *conf;
    int rc = idem_cmdline_conf(argc, argv, envp, idem_cmd_run_usage, NULL, NULL,
                               NULL, NULL, &conf);
    if (rc >= 0)
        return rc;
    char errstr[512];
    idem_log_setup((idem_log_level_t)conf->log_level,
                   (idem_log_format_t)conf->log_format);
    idem_log_context(conf->group_id, conf->member_id);

    /* The first SIGTERM/SIGINT/SIGHUP stops; a second exits at once
     * without committing (the records in hand are read again by whoever
     * owns the partition next, and the dedup marks absorb what was
     * applied). shutdown.timeout.ms bounds the shutdown. */
    idem_signals_opts_t so = {
        .watchdog_s = (unsigned)((conf->shutdown_timeout_ms + 999) / 1000),
        .watchdog_msg = "{\"level\":\"error\",\"msg\":\"shutdown.timeout.ms "
                        "exceeded: exiting without a final commit\"}",
        .second_exits = 1,
        .daemon = 1};
    idem_signals_setup(&so);

    rc = IDEM_EXIT_OK;
    idem_metrics_t *m = idem_metrics_new();
    idem_metrics_member_set(m, conf->group_id, conf->member_id);
    idem_http_t *http = NULL;
    idem_pipeline_t *p = NULL;
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
    p = idem_pipeline_new(conf, m, errstr, sizeof(errstr));
    if (!p) {
        idem_log_kv(IDEM_LOG_ERROR, "cannot start", "error", errstr, NULL);
        rc = IDEM_EXIT_FAIL;
        goto out;
    }
    idem_pipeline_on_shutdown(p, arm_watchdog);
    if (conf->fault_member_rss_file && *conf->fault_member_rss_file)
        idem_pipeline_rss_source(p, fault_rss, conf->fault_member_rss_file);
    idem_log_kv(IDEM_LOG_INFO, "started", "member", conf->member_id, "group",
                conf->group_id, "topics", conf->input_topics, "handler",
                conf->handler, "version", IDEM_VERSION, NULL);
    /* Live for `idemproc offsets reset` (redis/liveness.h) while it runs,
     * and compared with the other members' effect settings. */
    char *fingerprint = idem_effect_fingerprint(conf);
    idem_liveness_t *beat =
        idem_liveness_start(conf, fingerprint, m, errstr, sizeof(errstr));
    free(fingerprint);
    if (!beat)
        idem_log_kv(IDEM_LOG_WARN, "no member heartbeat", "error", errstr,
                    NULL);
    int prc =
        idem_pipeline_run(p, idem_signals_stop_flag(), errstr, sizeof(errstr));
    idem_liveness_stop(beat);
    if (prc == IDEM_PIPELINE_REFUSED) {
        idem_log_kv(IDEM_LOG_ERROR, "refusing to run", "error", errstr, NULL);
        rc = IDEM_EXIT_USAGE;
    } else if (prc) {
        idem_log_kv(IDEM_LOG_ERROR, "stopped with an error", "error", errstr,
                    NULL);
        rc = IDEM_EXIT_FAIL;
    } else {
        idem_log_kv(IDEM_LOG_INFO, "stopped cleanly", NULL);
    }
out:
    idem_pipeline_destroy(p);
    idem_http_stop(http);
    idem_metrics_destroy(m);
    idem_conf_destroy(conf);
    return rc;
}
