/* verify: compares what the processor left in Redis, on its output topic
 * and in the DLQ with the expectation file (verify.h). */
#include "dev/verify.h"
#include "input/envelope.h"
#include "kafka/kafka.h"
#include "base/outcome.h"
#include "redis/store.h"
#include "redis/storeread.h"
#include "base/util.h"
#include "base/siphash.h"
#include "redis/rediskeys.h"

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
    /* Cluster mode shards a balance by partition: the parts add up. */
    json_int_t had = json_integer_value(json_object_get(cur, user));
    json_object_set_new(cur, user, json_integer(had + minor));
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
    int rc = -1;
    const rd_kafka_metadata_t *md = NULL;
    rd_kafka_resp_err_t err = rd_kafka_poll_set_consumer(rk);
    rd_kafka_topic_t *rkt = err ? NULL : rd_kafka_topic_new(rk, topic, NULL);
    if (!rkt) {
        snprintf(errstr, errstr_size, "topic %s: %s", topic,
                 rd_kafka_err2str(err ? err : rd_kafka_last_error()));
        goto out;
    }
    err = rd_kafka_metadata(rk, 0, rkt, &md, timeout_ms);
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
    if (rkt)
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
    const idem_envelope_rules_t *rules;        /* the config's envelope.* */
    const idem_envelope_rules_t *ledger_rules; /* payments (ledger mode) */
    json_t *ledger; /* ledger mode: {currency: {user: minor}} rebuilt */
    json_t *seen;   /* identity -> times seen on the output */
    json_t *values; /* identity -> the first value seen (a string) */
    int64_t distinct, records, unparsable, not_text;
    int64_t carried; /* ledger mode: distinct records without payment fields */
} output_tally_t;

/* read_topic callback for the forward handler's output: each record's
 * identity, read by the config's envelope.* as the member read it, counted;
 * in ledger mode (an expectation with a "ledger") the distinct payments
 * also rebuild the ledger. */
static void output_record(const rd_kafka_message_t *m, void *opaque)
{
    output_tally_t *t = opaque;
    idem_envelope_t env = {.fields =
                               NULL}; /* no fields asked: read leaves them */
    idem_reason_t reason;
    char err[256];
    rd_kafka_headers_t *h = NULL;
    rd_kafka_message_headers(m, &h);
    t->records++;
    if (idem_envelope_read(t->rules, m->payload, m->payload ? m->len : 0, h,
                           m->key, m->key ? m->key_len : 0, &env, &reason, err,
                           sizeof(err))) {
        t->unparsable++;
        return;
    }
    json_t *n = json_object_getn(t->seen, env.identity, env.identity_len);
    json_object_setn_new(t->seen, env.identity, env.identity_len,
                         json_integer(n ? json_integer_value(n) + 1 : 1));
    idem_envelope_term(&env);
    if (n)
        return;
    t->distinct++;
    json_t *v =
        json_stringn(m->payload ? m->payload : "", m->payload ? m->len : 0);
    if (!v)
        t->not_text++; /* not UTF-8: no value to compare with */
    json_object_setn_new(t->values, env.identity, env.identity_len,
                         v ? v : json_null());
    if (!t->ledger)
        return;
    idem_envelope_t pay = {.fields = NULL};
    if (idem_envelope_read(t->ledger_rules, m->payload, m->payload ? m->len : 0,
                           h, m->key, m->key ? m->key_len : 0, &pay, &reason,
                           err, sizeof(err))) {
        /* forward carries any record with an identity: one the ledger
         * would refuse (invalid-field) is output too, once. */
        t->carried++;
        return;
    }
    json_t *cur = json_object_get(t->ledger, pay.currency);
    if (!cur) {
        cur = json_object();
        json_object_set_new(t->ledger, pay.currency, cur);
    }
    json_t *b = json_object_get(cur, pay.user_id);
    json_object_set_new(
        cur, pay.user_id,
        json_integer((b ? json_integer_value(b) : 0) + pay.amount_minor));
    idem_envelope_term(&pay);
}

/* An identity for a report line: printable bytes as they are, others as
 * \xNN, cut at 80 bytes. */
static const char *printable(const char *id, size_t len, char *buf, size_t size)
{
    size_t o = 0;
    for (size_t i = 0; i < len && o + 5 < size && i < 80; i++) {
        unsigned char c = (unsigned char)id[i];
        if (c >= 0x20 && c < 0x7f)
            buf[o++] = (char)c;
        else
            o += (size_t)snprintf(buf + o, size - o, "\\x%02x", c);
    }
    buf[o] = '\0';
    return buf;
}

typedef struct {
    json_t *done; /* identity -> message_id of the record that applied it */
    int64_t leases;
    /* The partition layout (dedup.scope=partition, cluster mode): marks
     * are keyed hashes of the identities, not names. */
    json_t *part;    /* hex of a mark's 12 hash bytes -> marks that applied */
    int64_t moved;   /* marks written without an effect */
    int have_key;    /* key read: expected identities can be hashed */
    uint8_t key[16]; /* the group's hash key (idem_storeread_hashkey) */
    int cluster;     /* redis.cluster.nodes: done marks are the global
                        path's buckets, never a layout switch's */
} marks_tally_t;

static void collect_mark(const idem_storeread_mark_t *m, void *opaque)
{
    marks_tally_t *t = opaque;
    if (!m->done) {
        t->leases++;
        return;
    }
    json_t *mid = json_stringn(m->message_id, m->message_id_len);
    json_object_setn_new(t->done, m->identity, m->identity_len,
                         mid ? mid : json_null());
}

/* 24 hex digits of a mark's 12 hash bytes into hex[25]. */
static void mark_hex(const uint8_t *b, char hex[25])
{
    for (int i = 0; i < 12; i++)
        snprintf(hex + 2 * i, 3, "%02x", b[i]);
}

/* The mark hash of identity id under the group's key, as hex. */
static void identity_hex(const marks_tally_t *t, const char *id, size_t len,
                         char hex[25])
{
    uint8_t h[16];
    idem_siphash24_128(t->key, id, len, h);
    mark_hex(h, hex);
}

static void collect_partmarks(const idem_storeread_partmarks_t *pm,
                              void *opaque)
{
    marks_tally_t *t = opaque;
    for (size_t i = 0; i < pm->n; i++) {
        const uint8_t *b = pm->marks + i * IDEM_STOREREAD_MARK;
        if (b[12] & 0x80) {
            t->moved++;
            continue;
        }
        char hex[25];
        mark_hex(b, hex);
        json_int_t had = json_integer_value(json_object_get(t->part, hex));
        json_object_set_new(t->part, hex, json_integer(had + 1));
    }
}

/* The identities applied: the done marks' and, under the partition
 * layout, the distinct identities with a mark that applied (an identity
 * marked in both, applied before a switch from the global layout, counts
 * once). */
static int64_t marks_applied(const marks_tally_t *t)
{
    int64_t n = (int64_t)json_object_size(t->part);
    const char *k;
    size_t klen;
    json_t *v;
    void *tmp;
    json_object_keylen_foreach_safe(t->done, tmp, k, klen, v)
    {
        char hex[25];
        if (t->have_key)
            identity_hex(t, k, klen, hex);
        if (!t->have_key || !json_object_get(t->part, hex))
            n++;
    }
    return n;
}

/* Every expected identity (want: an array of strings) has a done mark of
 * this group or, under the partition layout, exactly one mark that
 * applied it, and no other identity has either. */
static void compare_marks(report_t *r, json_t *want, const marks_tally_t *got)
{
    char pb[400];
    json_t *set = json_object(), *hashes = json_object(), *id;
    size_t i;
    json_array_foreach(want, i, id)
    {
        const char *s = json_string_value(id);
        size_t n = json_string_length(id);
        json_object_setn_new(set, s, n, json_true());
        json_int_t in_part = 0;
        if (got->have_key) {
            char hex[25];
            identity_hex(got, s, n, hex);
            json_object_set_new(hashes, hex, json_true());
            in_part = json_integer_value(json_object_get(got->part, hex));
        }
        if (!json_object_getn(got->done, s, n) && !in_part)
            diff(r, "identity %s: not applied (no done mark in Redis)",
                 printable(s, n, pb, sizeof(pb)));
        else if (in_part > 1)
            diff(r,
                 "identity %s: applied %" JSON_INTEGER_FORMAT
                 " times (marks in the partition layout)",
                 printable(s, n, pb, sizeof(pb)), in_part);
        else if (got->cluster && in_part && json_object_getn(got->done, s, n))
            diff(r,
                 "identity %s: applied twice (a done mark of the global "
                 "path and a mark in the partition layout; cluster mode has "
                 "no layout switch that would explain both)",
                 printable(s, n, pb, sizeof(pb)));
    }
    const char *k;
    size_t klen;
    json_t *v;
    void *tmp;
    json_object_keylen_foreach_safe(got->done, tmp, k, klen, v)
    {
        if (!json_object_getn(set, k, klen))
            diff(r, "identity %s: applied (done mark), but not expected",
                 printable(k, klen, pb, sizeof(pb)));
    }
    /* A partition mark names no identity: the ones no expected identity
     * hashes to are counted. */
    size_t unexpected = 0;
    json_object_keylen_foreach_safe(got->part, tmp, k, klen, v)
    {
        if (!json_object_getn(hashes, k, klen))
            unexpected++;
    }
    if (unexpected)
        diff(r,
             "%zu identit%s applied (marks in the partition layout), but "
             "not expected (a mark holds a hash, not the identity)",
             unexpected, unexpected == 1 ? "y" : "ies");
    json_decref(set);
    json_decref(hashes);
}

/* The forward handler's output against the expected identities (each
 * exactly once) and, when the expectation holds "output", their values
 * byte for byte. */
static void compare_output(report_t *r, const char *topic, json_t *want_ids,
                           json_t *want_values, const output_tally_t *t)
{
    char pb[400];
    json_t *set = json_object(), *id;
    size_t i;
    json_array_foreach(want_ids, i, id)
    {
        const char *s = json_string_value(id);
        size_t n = json_string_length(id);
        json_object_setn_new(set, s, n, json_true());
        json_t *c = json_object_getn(t->seen, s, n);
        if (!c)
            diff(r, "output: identity %s: missing from %s",
                 printable(s, n, pb, sizeof(pb)), topic);
        else if (json_integer_value(c) != 1)
            diff(r,
                 "output: identity %s: %" JSON_INTEGER_FORMAT
                 " times on %s, expected once",
                 printable(s, n, pb, sizeof(pb)), json_integer_value(c), topic);
    }
    const char *k;
    size_t klen;
    json_t *v;
    void *tmp;
    json_object_keylen_foreach_safe(t->seen, tmp, k, klen, v)
    {
        if (want_ids && !json_object_getn(set, k, klen))
            diff(r, "output: identity %s: on %s, but not expected",
                 printable(k, klen, pb, sizeof(pb)), topic);
    }
    json_object_keylen_foreach_safe(want_values, tmp, k, klen, v)
    {
        json_t *g = json_object_getn(t->values, k, klen);
        if (g && !json_equal(g, v))
            diff(r, "output: identity %s: value differs from the one sent",
                 printable(k, klen, pb, sizeof(pb)));
    }
    json_decref(set);
}

/* 1 when got (len bytes) holds the number want (an integer compares as
 * an integer, a real as a double), else 0. */
static int same_number(const char *got, json_t *want)
{
    char *end;
    if (json_is_integer(want)) {
        errno = 0;
        long long g = strtoll(got, &end, 10);
        return !errno && end != got && !*end && g == json_integer_value(want);
    }
    double g = strtod(got, &end);
    return end != got && !*end && g == json_number_value(want);
}

/* Cluster mode: the shards of one key (or one field), in the read model
 * of the script handler's idem.* keys (README, "handler=script"). */
typedef struct {
    size_t shards;   /* that hold the value */
    long long isum;  /* integer values added up */
    double dsum;     /* all numeric values added up */
    int nonint;      /* a shard whose value is no integer */
    int nonnum;      /* a shard whose value is no number */
    char first[256]; /* the first shard's value (for strings and reports) */
    size_t first_len;
    int differ; /* the shards do not all hold the same value */
} shards_sum_t;

static void add_shard(const char *shard, size_t shard_len, const char *value,
                      size_t value_len, void *opaque)
{
    (void)shard;
    (void)shard_len;
    shards_sum_t *x = opaque;
    char buf[256];
    int fits = value_len < sizeof(buf);
    snprintf(buf, sizeof(buf), "%.*s", (int)(fits ? value_len : 0), value);
    if (!x->shards++) {
        memcpy(x->first, buf, sizeof(buf));
        x->first_len = value_len;
    } else if (value_len != x->first_len || !fits ||
               memcmp(buf, x->first, value_len)) {
        x->differ = 1;
    }
    char *end;
    errno = 0;
    long long i = fits && value_len ? strtoll(buf, &end, 10) : 0;
    if (!fits || !value_len || errno || *end)
        x->nonint = 1;
    else
        x->isum += i;
    double d = fits && value_len ? strtod(buf, &end) : 0;
    if (!fits || !value_len || *end)
        x->nonnum = 1;
    else
        x->dsum += d;
}

/* One expected value against the sum of key's (field's) shards over every
 * primary: a number is compared with the sum of the shards (each must
 * hold a number), a string with the value every shard holds (a string
 * cannot be added up: shards that differ are a difference), null with no
 * shard at all. */
static int compare_shards(report_t *r, idem_storeread_t *rd, const char *group,
                          const char *key, const char *field, json_t *want,
                          const char *where, char *errstr, size_t errstr_size)
{
    shards_sum_t x = {0};
    if (idem_storeread_shards(rd, key, field, group, add_shard, &x, errstr,
                              errstr_size))
        return -1;
    char *wtext = json_dumps(want, JSON_ENCODE_ANY);
    if (json_is_null(want)) {
        if (x.shards)
            diff(r, "%s: expected absent, held by %zu shard%s", where, x.shards,
                 x.shards == 1 ? "" : "s");
    } else if (!x.shards) {
        diff(r, "%s: expected %s, absent (no shard on any primary)", where,
             wtext);
    } else if (json_is_string(want)) {
        if (x.differ)
            diff(r,
                 "%s: expected %s in every shard, but its %zu shards "
                 "differ (a string is not added up; expect a number to "
                 "compare the sum)",
                 where, wtext, x.shards);
        else if (x.first_len != json_string_length(want) ||
                 memcmp(x.first, json_string_value(want), x.first_len))
            diff(r, "%s: expected %s, got \"%s\" (%zu shard%s)", where, wtext,
                 x.first, x.shards, x.shards == 1 ? "" : "s");
    } else if (json_is_integer(want) ? x.nonint : x.nonnum) {
        diff(r,
             "%s: expected the number %s, but a shard holds a value that is "
             "no %s (cannot be added up)",
             where, wtext, json_is_integer(want) ? "integer" : "number");
    } else if (json_is_integer(want) ? x.isum != json_integer_value(want)
                                     : x.dsum != json_number_value(want)) {
        if (json_is_integer(want))
            diff(r,
                 "%s: expected %s, got %lld (the sum of %zu shard%s, off by "
                 "%lld)",
                 where, wtext, x.isum, x.shards, x.shards == 1 ? "" : "s",
                 x.isum - (long long)json_integer_value(want));
        else
            diff(r, "%s: expected %s, got %g (the sum of %zu shard%s)", where,
                 wtext, x.dsum, x.shards, x.shards == 1 ? "" : "s");
    }
    free(wtext);
    return 0;
}

/* One expected Redis value (want: a string, a number or null for
 * "absent") against what Redis holds at key (field NULL) or key's field;
 * in cluster mode against key's shards (compare_shards). */
static int compare_value(report_t *r, idem_storeread_t *rd,
                         const idem_conf_t *conf, const char *key,
                         const char *field, json_t *want, char *errstr,
                         size_t errstr_size)
{
    char where[600];
    snprintf(where, sizeof(where), "redis %s%s%s", key, field ? " " : "",
             field ? field : "");
    if (conf->redis_cluster_nodes && *conf->redis_cluster_nodes)
        return compare_shards(r, rd, conf->group_id, key, field, want, where,
                              errstr, errstr_size);
    char *got;
    size_t len;
    if (idem_storeread_value(rd, key, field, &got, &len, errstr, errstr_size))
        return -1;
    char *wtext = json_dumps(want, JSON_ENCODE_ANY);
    int same;
    if (json_is_null(want))
        same = !got;
    else if (!got)
        same = 0;
    else if (json_is_string(want))
        same = len == json_string_length(want) &&
               !memcmp(got, json_string_value(want), len);
    else
        same = same_number(got, want);
    if (!same)
        diff(r, "%s: expected %s, %s%s%s", where, wtext,
             got ? "got \"" : "absent", got ? got : "", got ? "\"" : "");
    free(wtext);
    free(got);
    return 0;
}

/* The expectation's "redis": {key: value} for strings, {key: {field:
 * value}} for hashes. Counts the values compared in *n. */
static int compare_redis(report_t *r, idem_storeread_t *rd,
                         const idem_conf_t *conf, json_t *want, size_t *n,
                         char *errstr, size_t errstr_size)
{
    const char *key, *field;
    json_t *v, *fv;
    json_object_foreach(want, key, v)
    {
        if (!json_is_object(v)) {
            if (compare_value(r, rd, conf, key, NULL, v, errstr, errstr_size))
                return -1;
            (*n)++;
            continue;
        }
        json_object_foreach(v, field, fv)
        {
            if (compare_value(r, rd, conf, key, field, fv, errstr, errstr_size))
                return -1;
            (*n)++;
        }
    }
    return 0;
}

typedef enum { E_BALANCES, E_OUTPUT, E_MARKS } effect_kind_t;

int idem_verify(const idem_conf_t *conf, const idem_verify_effect_t *effect,
                json_t *expect, int with_dlq, int timeout_ms, FILE *out,
                char *errstr, size_t errstr_size)
{
    effect_kind_t kind = effect->output     ? E_OUTPUT
                         : effect->balances ? E_BALANCES
                                            : E_MARKS;
    const char *output = effect->output;
    json_t *want_ledger = json_object_get(expect, "ledger");
    json_t *want_applied = json_object_get(expect, "applied");
    json_t *want_ids = json_object_get(expect, "identities");
    json_t *want_redis = json_object_get(expect, "redis");
    report_t r = {.out = out, .diffs = 0};
    idem_store_t *store = idem_store_new(conf, NULL);
    idem_store_allow_replica(store);
    idem_storeread_t *rd = idem_storeread_new(conf);
    json_t *got = json_object();
    dlq_tally_t dlq = {.group = conf->group_id, .seen = json_object()};
    marks_tally_t marks = {.done = json_object(), .part = json_object()};
    idem_envelope_rules_t *rules = idem_envelope_rules_new(
        conf->envelope_format, conf->envelope_identity,
        conf->envelope_message_id, 0, (size_t)-1, errstr, errstr_size);
    idem_envelope_rules_t *ledger_rules = idem_envelope_rules_new(
        conf->envelope_format, conf->envelope_identity,
        conf->envelope_message_id, 1, (size_t)-1, errstr, errstr_size);
    output_tally_t outp = {.rules = rules,
                           .ledger_rules = ledger_rules,
                           .ledger = want_ledger ? got : NULL,
                           .seen = json_object(),
                           .values = json_object()};
    int64_t applied = 0;
    size_t redis_values = 0;
    int rc = -1;
    if (!rules || !ledger_rules)
        goto done;
    /* The marks: every handler sets one per applied identity (in one
     * script with the effect for ledger and script). The ledger's own
     * counter stands in for them when no identities are listed. */
    int with_marks = want_ids || kind == E_MARKS;
    int cluster = conf->redis_cluster_nodes && *conf->redis_cluster_nodes;
    int part_layout =
        cluster || conf->dedup_scope == IDEM_DEDUP_SCOPE_PARTITION;
    marks.cluster = cluster;
    if (with_marks) {
        if (idem_storeread_marks(rd, conf->group_id, collect_mark, &marks,
                                 errstr, errstr_size))
            goto done;
        /* The partition layout's marks, read with the group's hash key:
         * records with a Kafka key were marked there. */
        if (part_layout &&
            (idem_storeread_hashkey(rd, conf->group_id, marks.key,
                                    &marks.have_key, errstr, errstr_size) ||
             idem_storeread_partition_marks(rd, conf->group_id,
                                            collect_partmarks, &marks, errstr,
                                            errstr_size)))
            goto done;
        if (json_object_size(marks.part) && !marks.have_key) {
            snprintf(errstr, errstr_size,
                     "%sdedupkey:%s is missing: the partition marks cannot be "
                     "matched with identities",
                     conf->redis_prefix, conf->group_id);
            goto done;
        }
        if (want_ids)
            compare_marks(&r, want_ids, &marks);
    }
    if (kind == E_OUTPUT) {
        /* The effect is the output topic: each expected identity on it
         * once (ledger mode: the distinct records rebuild the ledger). */
        if (read_topic(conf, output, timeout_ms, output_record, &outp, out,
                       errstr, errstr_size))
            goto done;
        /* Ledger mode: a record the ledger would refuse is carried to the
         * output but is no payment applied. */
        applied = outp.distinct - (want_ledger ? outp.carried : 0);
        if (outp.unparsable)
            diff(&r, "output: %" PRId64 " records without an identity",
                 outp.unparsable);
        compare_output(&r, output, want_ids, json_object_get(expect, "output"),
                       &outp);
        if (want_ledger) {
            /* What the ledger would dead-letter as invalid-field,
             * forward carries to the output. */
            json_t *w = json_object_get(json_object_get(expect, "poison"),
                                        "invalid-field");
            int64_t want = w ? json_integer_value(w) : 0;
            if (outp.carried != want)
                diff(&r,
                     "output: expected %" PRId64
                     " records without payment fields (invalid-field for "
                     "the ledger), got %" PRId64,
                     want, outp.carried);
        }
    } else if (kind == E_BALANCES) {
        if (idem_store_ledger_scan(store, collect_ledger, got, errstr,
                                   errstr_size) ||
            idem_store_applied_get(store, &applied, errstr, errstr_size))
            goto done;
    } else {
        applied = marks_applied(&marks);
    }
    if (want_ledger)
        compare_ledger(&r, want_ledger, got);
    if (applied != json_integer_value(want_applied))
        diff(&r, "applied: expected %" JSON_INTEGER_FORMAT ", got %" PRId64,
             json_integer_value(want_applied), applied);
    if (want_redis && compare_redis(&r, rd, conf, want_redis, &redis_values,
                                    errstr, errstr_size))
        goto done;
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
        for (int i = 0; i < IDEM_REASON_CNT; i++) {
            json_t *w = json_object_get(poison, idem_reason2str(i));
            int64_t want = w ? json_integer_value(w) : 0;
            if (kind == E_OUTPUT && want_ledger &&
                i == IDEM_REASON_INVALID_FIELD)
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
        goto done;
    }
    if (want_ledger)
        fprintf(out,
                "verify: ledger exact (%zu currencies, %zu users, %" PRId64
                " applied%s)\n",
                json_object_size(got), users, applied,
                kind == E_OUTPUT ? ", from output.topic" : "");
    else if (kind == E_BALANCES)
        fprintf(out, "verify: applied exact (%" PRId64 " applied)\n", applied);
    if (kind == E_OUTPUT && !want_ledger)
        fprintf(out,
                "verify: output exact (%" PRId64 " identities once each on "
                "%s%s)\n",
                applied, output,
                json_object_size(json_object_get(expect, "output"))
                    ? ", values as sent"
                    : "");
    if (with_marks)
        fprintf(out,
                "verify: marks exact (%" PRId64
                " identities applied, group %s%s%s)\n",
                marks_applied(&marks), conf->group_id,
                part_layout ? ", partition layout" : "",
                want_ids ? "" : ", none listed");
    if (want_redis)
        fprintf(out, "verify: redis exact (%zu values%s)\n", redis_values,
                cluster ? ", read over the shards of every primary" : "");
    if (with_dlq)
        fprintf(out,
                "verify: dlq exact (%" PRId64 " distinct records, %" PRId64
                " written)\n",
                dlq_total, dlq.records);
    rc = 0;
done:
    idem_envelope_rules_destroy(rules);
    idem_envelope_rules_destroy(ledger_rules);
    json_decref(outp.seen);
    json_decref(outp.values);
    json_decref(marks.done);
    json_decref(marks.part);
    json_decref(dlq.seen);
    json_decref(got);
    idem_storeread_destroy(rd);
    idem_store_destroy(store);
    return rc;
}
