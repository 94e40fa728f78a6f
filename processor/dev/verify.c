/* verify: compares what the processor left in Redis (and the DLQ) with the
 * expectations `produce --expect` wrote. */
#include "dev/verify.h"
#include "input/envelope.h"
#include "kafka/kafka.h"
#include "base/outcome.h"
#include "redis/store.h"
#include "base/util.h"

#include <inttypes.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SHOW_MAX 20 /* differences printed before "... and N more" */

typedef struct {
    FILE *out;
    int diffs;
} report_t;

static void diff(report_t *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void diff(report_t *r, const char *fmt, ...)
{
    if (r->diffs++ < SHOW_MAX) {
        va_list ap;
        va_start(ap, fmt);
        fputs("  - ", r->out);
        vfprintf(r->out, fmt, ap);
        fputc('\n', r->out);
        va_end(ap);
    }
}

/* Store scan callback: builds {currency: {user: minor}} in a json object. */
static void collect_ledger(const char *currency, const char *user,
                           int64_t minor, void *opaque)
{
    json_t *ledger = opaque;
    json_t *cur = json_object_get(ledger, currency);
    if (!cur) {
        cur = json_object();
        json_object_set_new(ledger, currency, cur);
    }
    json_object_set_new(cur, user, json_integer(minor));
}

static void compare_ledger(report_t *r, json_t *want, json_t *got)
{
    const char *cur, *user;
    json_t *users, *v;
    json_object_foreach(want, cur, users)
    {
        json_t *gu = json_object_get(got, cur);
        json_object_foreach(users, user, v)
        {
            json_t *g = gu ? json_object_get(gu, user) : NULL;
            json_int_t w = json_integer_value(v);
            if (!g)
                diff(r,
                     "ledger %s %s: expected %" JSON_INTEGER_FORMAT ", missing",
                     cur, user, w);
            else if (json_integer_value(g) != w)
                diff(r,
                     "ledger %s %s: expected %" JSON_INTEGER_FORMAT
                     ", got %" JSON_INTEGER_FORMAT
                     " (off by %" JSON_INTEGER_FORMAT ")",
                     cur, user, w, json_integer_value(g),
                     json_integer_value(g) - w);
        }
    }
    json_object_foreach(got, cur, users)
    {
        json_t *wu = json_object_get(want, cur);
        json_object_foreach(users, user, v)
        {
            if (!wu || !json_object_get(wu, user))
                diff(r, "ledger %s %s: unexpected %" JSON_INTEGER_FORMAT, cur,
                     user, json_integer_value(v));
        }
    }
}

static int header_str(rd_kafka_headers_t *h, const char *name, char *out,
                      size_t size)
{
    const void *v;
    size_t sz;
    if (!h || rd_kafka_header_get_last(h, name, &v, &sz) || !v || sz >= size)
        return -1;
    memcpy(out, v, sz);
    out[sz] = '\0';
    return 0;
}

/* Reads `topic` from the beginning to its high watermarks (as they were
 * when the read started) and calls cb for every record (borrowed). A
 * partition whose earliest offset is above 0 lost records before this read
 * (retention, or the embedded broker's size limit): one line on `note`
 * says so. Fails within about timeout_ms when no broker answers, naming
 * the bootstrap servers. */
static int read_topic(const idem_conf_t *conf, const char *topic,
                      int timeout_ms,
                      void (*cb)(const rd_kafka_message_t *m, void *opaque),
                      void *opaque, FILE *note, char *errstr,
                      size_t errstr_size)
{
    rd_kafka_conf_t *kc = rd_kafka_conf_new();
    char kerr[512], reader_group[64];
    snprintf(reader_group, sizeof(reader_group), "idemproc-verify-%ld",
             (long)getpid());
    if (idem_conf_apply_kafka(conf, kc, errstr, errstr_size)) {
        rd_kafka_conf_destroy(kc);
        return -1;
    }
    /* assign() needs a group.id, but this reader never joins the group
     * (no subscribe) and commits nothing. */
    if (rd_kafka_conf_set(kc, "group.id", reader_group, kerr, sizeof(kerr)) ||
        rd_kafka_conf_set(kc, "enable.auto.commit", "false", kerr,
                          sizeof(kerr)) ||
        rd_kafka_conf_set(kc, "enable.partition.eof", "true", kerr,
                          sizeof(kerr)) ||
        rd_kafka_conf_set(kc, "log_level", "3", kerr, sizeof(kerr))) {
        snprintf(errstr, errstr_size, "topic reader: %s", kerr);
        rd_kafka_conf_destroy(kc);
        return -1;
    }
    rd_kafka_t *rk = idem_kafka_new(RD_KAFKA_CONSUMER, kc, "topic reader",
                                    errstr, errstr_size);
    if (!rk)
        return -1;
    rd_kafka_poll_set_consumer(rk);
    int rc = -1;
    const rd_kafka_metadata_t *md = NULL;
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
    rd_kafka_resp_err_t err = rd_kafka_metadata(rk, 0, rkt, &md, timeout_ms);
    if (err == RD_KAFKA_RESP_ERR__TRANSPORT ||
        err == RD_KAFKA_RESP_ERR__TIMED_OUT) {
        snprintf(errstr, errstr_size,
                 "no Kafka broker reachable at %s within %d ms "
                 "(kafka.bootstrap.servers; --timeout-ms): %s",
                 conf->bootstrap_servers, timeout_ms, rd_kafka_err2str(err));
        goto out;
    }
    if (err || md->topic_cnt != 1 || md->topics[0].err) {
        snprintf(errstr, errstr_size, "topic %s: metadata: %s", topic,
                 rd_kafka_err2str(err ? err
                                  : md->topic_cnt != 1
                                      ? RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC
                                      : md->topics[0].err));
        goto out;
    }
    /* The end of each partition is its high watermark when the read
     * starts; a partition is done when a record at or past it, or the end
     * of the partition, was seen (once: later arrivals do not count). */
    int pcnt = md->topics[0].partition_cnt;
    int32_t max_id = 0;
    for (int i = 0; i < pcnt; i++)
        if (md->topics[0].partitions[i].id > max_id)
            max_id = md->topics[0].partitions[i].id;
    int64_t *end = idem_xcalloc((size_t)max_id + 1, sizeof(*end));
    char *done = idem_xcalloc((size_t)max_id + 1, 1);
    rd_kafka_topic_partition_list_t *l =
        rd_kafka_topic_partition_list_new(pcnt);
    int remaining = 0;
    for (int i = 0; i < pcnt; i++) {
        int32_t part = md->topics[0].partitions[i].id;
        int64_t lo, hi;
        err = rd_kafka_query_watermark_offsets(rk, topic, part, &lo, &hi,
                                               timeout_ms);
        if (err) {
            snprintf(errstr, errstr_size, "topic %s [%" PRId32 "]: %s", topic,
                     part, rd_kafka_err2str(err));
            rd_kafka_topic_partition_list_destroy(l);
            free(end);
            free(done);
            goto out;
        }
        end[part] = hi;
        if (lo > 0 && note)
            fprintf(note,
                    "verify: note: %s [%" PRId32 "] starts at offset %" PRId64
                    ": the broker no longer has its %" PRId64
                    " oldest records (retention, or the embedded broker's "
                    "limit of about 5 MiB per partition), so counts from it "
                    "can be short\n",
                    topic, part, lo, lo);
        if (hi > lo) {
            rd_kafka_topic_partition_list_add(l, topic, part)->offset =
                RD_KAFKA_OFFSET_BEGINNING;
            remaining++;
        } else {
            done[part] = 1;
        }
    }
    err = rd_kafka_assign(rk, l);
    rd_kafka_topic_partition_list_destroy(l);
    if (err) {
        snprintf(errstr, errstr_size, "topic %s: assign: %s", topic,
                 rd_kafka_err2str(err));
        free(end);
        free(done);
        goto out;
    }
    int64_t deadline = idem_now_ms() + timeout_ms;
    while (remaining > 0 && idem_now_ms() < deadline) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
        if (!m)
            continue;
        int32_t part = m->partition;
        int in_range = part >= 0 && part <= max_id;
        if (!m->err)
            cb(m, opaque);
        if (in_range && !done[part] &&
            (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF ||
             (!m->err && m->offset + 1 >= end[part]))) {
            done[part] = 1;
            remaining--;
        }
        rd_kafka_message_destroy(m);
    }
    free(end);
    free(done);
    if (remaining > 0) {
        snprintf(errstr, errstr_size,
                 "topic %s: not read to its end within %d ms", topic,
                 timeout_ms);
        goto out;
    }
    rc = 0;
out:
    if (md)
        rd_kafka_metadata_destroy(md);
    rd_kafka_topic_destroy(rkt);
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    return rc;
}

typedef struct {
    const char *group;
    json_t *seen; /* "topic/partition/offset" -> reason: distinct originals */
    int64_t counts[IDEM_REASON_CNT];
    int64_t records;
} dlq_tally_t;

/* read_topic callback: counts distinct dead-lettered originals of this
 * group by reason (the DLQ is at-least-once, the originals are not). */
static void dlq_record(const rd_kafka_message_t *m, void *opaque)
{
    dlq_tally_t *t = opaque;
    rd_kafka_headers_t *h = NULL;
    rd_kafka_message_headers(m, &h);
    char reason[64], group[256], topic[256], p[32], o[32];
    t->records++;
    if (header_str(h, "dlq.group", group, sizeof(group)) == 0 &&
        strcmp(group, t->group))
        return; /* another group's dead letters */
    if (header_str(h, "dlq.reason", reason, sizeof(reason)) ||
        header_str(h, "dlq.original.topic", topic, sizeof(topic)) ||
        header_str(h, "dlq.original.partition", p, sizeof(p)) ||
        header_str(h, "dlq.original.offset", o, sizeof(o))) {
        snprintf(reason, sizeof(reason), "(missing headers)");
        snprintf(topic, sizeof(topic), "?%" PRId64, m->offset);
        p[0] = o[0] = '\0';
    }
    char key[700];
    snprintf(key, sizeof(key), "%s/%s/%s", topic, p, o);
    if (json_object_get(t->seen, key))
        return;
    json_object_set_new(t->seen, key, json_string(reason));
    int ri = idem_reason_parse(reason);
    if (ri >= 0)
        t->counts[ri]++;
}

typedef struct {
    json_t *ledger; /* {currency: {user: minor}} rebuilt from the output */
    json_t *seen;   /* identities already counted */
    int64_t distinct, records, unparsable;
    int64_t carried; /* distinct records without valid payment fields */
} output_tally_t;

/* read_topic callback for the forward handler's output: each distinct
 * identity must appear, and together they must rebuild the exact ledger. */
static void output_record(const rd_kafka_message_t *m, void *opaque)
{
    output_tally_t *t = opaque;
    idem_envelope_t env;
    idem_reason_t reason;
    char err[256];
    rd_kafka_headers_t *h = NULL;
    rd_kafka_message_headers(m, &h);
    t->records++;
    if (idem_envelope_parse(m->payload, m->len, h, 1, (size_t)-1, &env, &reason,
                            err, sizeof(err))) {
        /* forward carries any record with an identity: one the ledger
         * would refuse (invalid-field) is output too, once. */
        if (reason == IDEM_REASON_INVALID_FIELD &&
            !idem_envelope_parse(m->payload, m->len, h, 0, (size_t)-1, &env,
                                 &reason, err, sizeof(err))) {
            if (!json_object_getn(t->seen, env.identity, env.identity_len)) {
                json_object_setn_new(t->seen, env.identity, env.identity_len,
                                     json_true());
                t->carried++;
            }
            return;
        }
        t->unparsable++;
        return;
    }
    if (json_object_getn(t->seen, env.identity, env.identity_len))
        return;
    json_object_setn_new(t->seen, env.identity, env.identity_len, json_true());
    t->distinct++;
    json_t *cur = json_object_get(t->ledger, env.currency);
    if (!cur) {
        cur = json_object();
        json_object_set_new(t->ledger, env.currency, cur);
    }
    json_t *v = json_object_get(cur, env.user_id);
    json_object_set_new(
        cur, env.user_id,
        json_integer((v ? json_integer_value(v) : 0) + env.amount_minor));
}

/* Checks that `obj` maps names to integers; -1 with errstr naming the
 * member otherwise. */
static int expect_int_map(const char *path, const char *what, json_t *obj,
                          char *errstr, size_t errstr_size)
{
    const char *k;
    json_t *v;
    json_object_foreach(obj, k, v)
    {
        if (!json_is_integer(v)) {
            snprintf(errstr, errstr_size,
                     "--expect %s: %s \"%s\" must be an integer", path, what,
                     k);
            return -1;
        }
    }
    return 0;
}

json_t *idem_verify_expect_load(const char *path, char *errstr,
                                size_t errstr_size)
{
    FILE *fp = fopen(path, "r");
    if (!fp) {
        snprintf(errstr, errstr_size, "--expect %s: cannot open: %s", path,
                 strerror(errno));
        return NULL;
    }
    json_error_t jerr;
    json_t *e = json_loadf(fp, 0, &jerr);
    fclose(fp);
    if (!e) {
        snprintf(errstr, errstr_size,
                 "--expect %s:%d:%d: not JSON: %s (write it with 'idemproc "
                 "produce --expect')",
                 path, jerr.line, jerr.column, jerr.text);
        return NULL;
    }
    json_t *ledger = json_object_get(e, "ledger");
    json_t *applied = json_object_get(e, "applied");
    json_t *poison = json_object_get(e, "poison");
    const char *missing = !json_is_object(e)          ? "a JSON object"
                          : !json_is_object(ledger)   ? "a \"ledger\" object"
                          : !json_is_integer(applied) ? "an integer \"applied\""
                          : poison && !json_is_object(poison)
                              ? "\"poison\" as an object"
                              : NULL;
    if (missing) {
        snprintf(errstr, errstr_size,
                 "--expect %s: needs %s (README, \"The expectation file\")",
                 path, missing);
        json_decref(e);
        return NULL;
    }
    const char *cur;
    json_t *users;
    json_object_foreach(ledger, cur, users)
    {
        if (!json_is_object(users)) {
            snprintf(errstr, errstr_size,
                     "--expect %s: ledger \"%s\" must be an object of "
                     "user: minor units",
                     path, cur);
            json_decref(e);
            return NULL;
        }
        char what[64];
        snprintf(what, sizeof(what), "ledger %.16s user", cur);
        if (expect_int_map(path, what, users, errstr, errstr_size)) {
            json_decref(e);
            return NULL;
        }
    }
    if (poison &&
        expect_int_map(path, "poison reason", poison, errstr, errstr_size)) {
        json_decref(e);
        return NULL;
    }
    return e;
}

int idem_verify(const idem_conf_t *conf, json_t *expect, int with_dlq,
                int timeout_ms, FILE *out, char *errstr, size_t errstr_size)
{
    json_t *want_ledger = json_object_get(expect, "ledger");
    json_t *want_applied = json_object_get(expect, "applied");
    report_t r = {.out = out, .diffs = 0};
    idem_store_t *store = idem_store_new(conf, NULL);
    idem_store_allow_replica(store);
    json_t *got = json_object();
    dlq_tally_t dlq = {.group = conf->group_id, .seen = json_object()};
    output_tally_t outp = {.ledger = got, .seen = json_object()};
    int64_t applied = 0;
    int rc = -1;
    if (!strcmp(conf->handler, "forward")) {
        /* The effect is the output topic: its distinct records must
         * rebuild the ledger exactly, one per unique payment. */
        if (read_topic(conf, conf->output_topic, timeout_ms, output_record,
                       &outp, out, errstr, errstr_size))
            goto done;
        applied = outp.distinct;
        if (outp.unparsable)
            diff(&r, "output: %" PRId64 " records do not parse",
                 outp.unparsable);
        /* What the ledger would dead-letter as invalid-field, forward
         * carries to the output. */
        json_t *w =
            json_object_get(json_object_get(expect, "poison"), "invalid-field");
        int64_t want = w ? json_integer_value(w) : 0;
        if (outp.carried != want)
            diff(&r,
                 "output: expected %" PRId64 " records without payment fields "
                 "(invalid-field for the ledger), got %" PRId64,
                 want, outp.carried);
    } else if (idem_store_ledger_scan(store, collect_ledger, got, errstr,
                                      errstr_size) ||
               idem_store_applied_get(store, &applied, errstr, errstr_size)) {
        goto done;
    }
    compare_ledger(&r, want_ledger, got);
    if (applied != json_integer_value(want_applied))
        diff(&r, "applied: expected %" JSON_INTEGER_FORMAT ", got %" PRId64,
             json_integer_value(want_applied), applied);
    size_t users = 0;
    const char *cur;
    json_t *u;
    json_object_foreach(got, cur, u) users += json_object_size(u);

    int64_t dlq_total = 0;
    if (with_dlq) {
        if (read_topic(conf, conf->dlq_topic, timeout_ms, dlq_record, &dlq, out,
                       errstr, errstr_size))
            goto done;
        json_t *poison = json_object_get(expect, "poison");
        int forward = !strcmp(conf->handler, "forward");
        for (int i = 0; i < IDEM_REASON_CNT; i++) {
            json_t *w = json_object_get(poison, idem_reason2str(i));
            int64_t want = w ? json_integer_value(w) : 0;
            if (forward && i == IDEM_REASON_INVALID_FIELD)
                want = 0; /* carried to the output (above) */
            dlq_total += dlq.counts[i];
            if (want != dlq.counts[i])
                diff(&r, "dlq %s: expected %" PRId64 ", got %" PRId64,
                     idem_reason2str(i), want, dlq.counts[i]);
        }
    }
    if (r.diffs > SHOW_MAX)
        fprintf(out, "  ... and %d more differences\n", r.diffs - SHOW_MAX);
    if (r.diffs) {
        fprintf(out, "verify: MISMATCH (%d differences)\n", r.diffs);
        rc = 1;
    } else {
        fprintf(out,
                "verify: ledger exact (%zu currencies, %zu users, %" PRId64
                " applied%s)\n",
                json_object_size(got), users, applied,
                !strcmp(conf->handler, "forward") ? ", from output.topic" : "");
        if (with_dlq)
            fprintf(out,
                    "verify: dlq exact (%" PRId64 " distinct records, %" PRId64
                    " written)\n",
                    dlq_total, dlq.records);
        rc = 0;
    }
done:
    json_decref(outp.seen);
    json_decref(dlq.seen);
    json_decref(got);
    idem_store_destroy(store);
    return rc;
}
