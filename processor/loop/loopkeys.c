/* loopkeys: the consumer loop's configuration keys and their cross-key
 * checks (conf.h). */
#include "loop/loopkeys.h"
#include "loop/fetchwatch.h"
#include "loop/membound.h"
#include "redis/rediskeys.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fault_pause_check(const idem_conf_key_t *key, const char *value,
                             char *errstr, size_t errstr_size)
{
    (void)key;
    return idem_fetchwatch_fault_check(value, errstr, errstr_size);
}

/* clang-format off */
static const idem_conf_key_t loop_keys[] = {
    IDEM_CONF_INT("retry.max.attempts", retry_max_attempts, "5", 1, 1000, 0, NULL,
        "attempts of a retriable handler error before max-retries"),
    IDEM_CONF_INT("handler.max.consecutive.rejects", handler_max_consecutive_rejects, "100", 0, 100000000, 0, NULL,
        "after this many handler-rejected records in a row (no success "
        "between) the member pauses and turns not ready instead of "
        "dead-lettering more, until a record succeeds; 0 = off"),
    IDEM_CONF_INT("retry.backoff.initial.ms", retry_backoff_initial_ms, "100", 1, 3600000, 0, NULL,
        "first retry delay (doubles, with jitter)"),
    IDEM_CONF_INT("retry.backoff.max.ms", retry_backoff_max_ms, "10000", 1, 3600000, 0, NULL,
        "largest retry and reconnect delay"),
    IDEM_CONF_INT("batch.max.messages", batch_max_messages, "1000", 1, 100000, 0, NULL,
        "records per batch (one Redis round trip)"),
    IDEM_CONF_INT("batch.max.wait.ms", batch_max_wait_ms, "0", 0, 60000, 0, NULL,
        "with the handler free, longest wait for a fuller batch (0: send what has arrived at once)"),
    IDEM_CONF_INT("commit.interval.ms", commit_interval_ms, "1000", 10, 3600000, 0, NULL,
        "asynchronous offset commit period"),
    IDEM_CONF_INT("message.max.bytes", message_max_bytes, "1048576", 64, 104857600, 0, NULL,
        "larger record values go to the DLQ as too-large"),
    IDEM_CONF_INT("health.stall.ms", health_stall_ms, "30000", 100, 3600000, IDEM_KEY_OUTBOX, NULL,
        "/healthz fails when the loop made no progress this long"),
    IDEM_CONF_INT("stats.interval.ms", stats_interval_ms, "5000", 0, 3600000, 0, NULL,
        "librdkafka statistics period (consumer lag, fetch.stall.ms); 0 = off"),
    IDEM_CONF_INT("fetch.stall.ms", fetch_stall_ms, "30000", 0, 3600000, 0, NULL,
        "an assigned partition, not paused by the member, behind its end and not fetched this long is logged, counted and resumed; still stalled as long after that, the member is not ready (needs stats.interval.ms); 0 = off"),
    IDEM_CONF_INT("progress.interval.ms", progress_interval_ms, "10000", 0, 3600000, 0, NULL,
        "period of the progress log line; 0 = off"),
    IDEM_CONF_INT("member.memory.max", member_memory_max, "0", 0, INT64_C(1099511627776), 0, NULL,
        "bytes of resident memory the member keeps under: refused at start unless it holds dedup.memory.max (partition scope), twice the prefetch bound, the records in hand and 32 MiB; at run time fetching pauses while RSS is over it (marks are never dropped); 0 = no bound"),
    IDEM_CONF_INT("shutdown.timeout.ms", shutdown_timeout_ms, "10000", 100, 600000, IDEM_KEY_OUTBOX, NULL,
        "SIGTERM: finish, flush, commit and leave within this"),
    {.name = "ordering", .type = IDEM_KEY_ENUM, .def = "key",
     .enums = {"key", "partition", "none"},
     .doc = "external effects (webhook, plugin) of one Kafka key start in offset order, each after the previous one finished (key; keyless records: per partition), one record per partition at a time (partition), or as due up to the handler's in-flight limit (none)"},
    IDEM_CONF_STR("dev.fault.fetch.pause", fault_fetch_pause, "", 0, fault_pause_check,
        "development only: TOPIC:PARTITION[:TIMES] pauses that partition inside librdkafka behind the member's back once its fetch started, and drops the first TIMES-1 repairs (exercises fetch.stall.ms)"),
    IDEM_CONF_STR("dev.fault.member.rss.file", fault_member_rss_file, "", 0, NULL,
        "development only: the member reads its resident memory (bytes, as text) from this file instead of /proc/self/statm (exercises member.memory.max)"),
    IDEM_CONF_INT("dev.fault.fetch.assign.fail", fault_fetch_assign_fail, "0", 0, 100, 0, NULL,
        "development only: the fetch watch's next N assigns of a stalled partition it took out of the assignment are refused, as librdkafka may refuse one (exercises fetch.stall.ms); 0 = off"),
    {.name = NULL},
};
/* clang-format on */

/* The last kafka.queued.max.messages.kbytes set wins; librdkafka judges
 * its syntax. */
int64_t idem_loop_prefetch_kbytes(const idem_conf_t *conf)
{
    const char *v = IDEM_PREFETCH_KBYTES_DEFAULT;
    for (size_t i = 0; i < conf->kafka_cnt; i++)
        if (!strcmp(conf->kafka[i].name, "queued.max.messages.kbytes"))
            v = conf->kafka[i].value;
    return strtoll(v, NULL, 10);
}

/* member.memory.max must hold what the member keeps by its configuration
 * (membound.h); else the bound would pause the member for good. */
static int member_memory_check(const idem_conf_t *conf, char *errstr,
                               size_t errstr_size)
{
    if (conf->member_memory_max <= 0)
        return 0;
    int64_t tables = conf->dedup_scope == IDEM_DEDUP_SCOPE_PARTITION
                         ? conf->dedup_memory_max
                         : 0;
    int64_t kb = idem_loop_prefetch_kbytes(conf);
    int64_t need = idem_membound_need(tables, kb, conf->batch_max_messages);
    if (conf->member_memory_max >= need)
        return 0;
    snprintf(errstr, errstr_size,
             "member.memory.max: %" PRId64 " bytes cannot hold the member's "
             "parts, %" PRId64 " bytes: dedup.memory.max %" PRId64
             " (dedup.scope=partition) + 2 x kafka.queued.max.messages.kbytes "
             "%" PRId64 " KiB + 4 x batch.max.messages %" PRId64
             " x 2 KiB + %" PRId64 " fixed (raise member.memory.max or lower "
             "the others)",
             conf->member_memory_max, need, tables, kb,
             conf->batch_max_messages, (int64_t)IDEM_MEMBOUND_FIXED_BYTES);
    return -1;
}

static int loop_conf_check(const idem_conf_module_t *m, idem_conf_t *conf,
                           char *errstr, size_t errstr_size)
{
    (void)m;
    if (conf->fetch_stall_ms > 0 && conf->stats_interval_ms > 0 &&
        conf->fetch_stall_ms < conf->stats_interval_ms) {
        snprintf(errstr, errstr_size,
                 "fetch.stall.ms: %" PRId64
                 " is below stats.interval.ms %" PRId64
                 " (a stall is judged from statistics: use at least "
                 "stats.interval.ms, or 0 for no watch)",
                 conf->fetch_stall_ms, conf->stats_interval_ms);
        return -1;
    }
    if (conf->retry_backoff_initial_ms > conf->retry_backoff_max_ms) {
        snprintf(errstr, errstr_size,
                 "retry.backoff.initial.ms: %" PRId64
                 " is above retry.backoff.max.ms (%" PRId64 ")",
                 conf->retry_backoff_initial_ms, conf->retry_backoff_max_ms);
        return -1;
    }
    return member_memory_check(conf, errstr, errstr_size);
}

const idem_conf_module_t idem_loop_conf = {
    .name = "loop",
    .doc = "batches, commits, retries, health",
    .keys = loop_keys,
    .check = loop_conf_check,
};
