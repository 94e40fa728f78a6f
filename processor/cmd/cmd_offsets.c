/* cmd_offsets: `idemproc offsets show|reset`: a group's positions in Kafka
 * and in Redis side by side, and moving both together, the way
 * kafka-consumer-groups --reset-offsets moves Kafka's alone (README,
 * "Operations: rewind, skip, replay"). */
#include "cmd/cmd.h"
#include "cmd/cmdline.h"
#include "base/util.h"
#include "conf/conf.h"
#include "kafka/dlqrec.h"
#include "kafka/kafka.h"
#include "kafka/offreset.h"
#include "loop/posread.h"
#include "redis/liveness.h"
#include "redis/posval.h"
#include "redis/store.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <regex.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#define KAFKA_TIMEOUT_MS 10000 /* metadata, committed offsets, watermarks */
#define JOIN_TIMEOUT_MS  30000 /* joining the group alone to commit */

void idem_cmd_offsets_usage(FILE *out)
{
    fprintf(
        out,
        "usage: idemproc offsets show  -c FILE [--json] [--topic "
        "T[:P,...]]...\n"
        "       idemproc offsets reset -c FILE (--to-earliest | --to-latest "
        "|\n"
        "                                --to-offset N | --to-datetime TIME "
        "|\n"
        "                                --shift-by N) [--topic T[:P,...]]... "
        "[--execute]\n"
        "  show   per partition of input.topics: Kafka's committed offset, "
        "Redis's\n"
        "         position and whether a member would use it (use, cluster, "
        "record,\n"
        "         past-end: posval; lost: none while Kafka holds a member's "
        "offset,\n"
        "         kept paused until a reset), where a member starts, the "
        "watermarks and\n"
        "         the lag; a total line. --json: one JSON object.\n"
        "  reset  prints the plan (each partition's start, its new offset, "
        "the records\n"
        "         skipped or read again); with --execute, refuses while the "
        "group has\n"
        "         live members (the broker's list where it answers, and the "
        "members'\n"
        "         heartbeats in Redis), then writes the positions to Redis "
        "and commits\n"
        "         the same offsets to Kafka. Backwards, the records are read "
        "again and\n"
        "         count as duplicates where their marks are kept; forwards, "
        "the records\n"
        "         skipped are never applied. Offsets are kept within the "
        "watermarks.\n"
        "         TIME: RFC 3339 (2026-11-30T16:00:00Z) or ago (90s, 15m, "
        "2h, 7d).\n"
        "  Exit 0 ok, 1 a failure or a refusal (nothing changed), 2 "
        "usage.\n");
}

enum {
    OPT_JSON = 256,
    OPT_TOPIC,
    OPT_EARLIEST,
    OPT_LATEST,
    OPT_OFFSET,
    OPT_DATETIME,
    OPT_SHIFT,
    OPT_EXECUTE,
    OPT_DRY_RUN,
};

static const struct option offsets_options[] = {
    {"json", no_argument, 0, OPT_JSON},
    {"topic", required_argument, 0, OPT_TOPIC},
    {"to-earliest", no_argument, 0, OPT_EARLIEST},
    {"to-latest", no_argument, 0, OPT_LATEST},
    {"to-offset", required_argument, 0, OPT_OFFSET},
    {"to-datetime", required_argument, 0, OPT_DATETIME},
    {"shift-by", required_argument, 0, OPT_SHIFT},
    {"execute", no_argument, 0, OPT_EXECUTE},
    {"dry-run", no_argument, 0, OPT_DRY_RUN},
    {0, 0, 0, 0}};

typedef struct {
    int reset; /* the verb */
    const char *name;
    int json;
    idem_offreset_sel_t *sel;
    size_t nsel;
    int have_to;
    idem_offreset_to_t to;
    const char *to_text; /* the --to-* as given, for the plan */
    int execute;
} offsets_opts_t;

static int int64_parse(const char *s, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno || isspace((unsigned char)*s))
        return -1; /* not the nearest end of int64 in silence */
    *out = v;
    return 0;
}

/* idem_cmdline_opt_cb for offsets' options. */
static int offsets_opt(int opt, const char *arg, void *opaque)
{
    offsets_opts_t *o = opaque;
    char err[256];
    if (opt == OPT_TOPIC) {
        o->sel = idem_xrealloc(o->sel, (o->nsel + 1) * sizeof(*o->sel));
        if (idem_offreset_sel_parse(arg, &o->sel[o->nsel], err, sizeof(err))) {
            fprintf(stderr, "idemproc %s: %s\n", o->name, err);
            return -1;
        }
        o->nsel++;
        return 0;
    }
    if (!o->reset && opt == OPT_JSON) {
        o->json = 1;
        return 0;
    }
    if (o->reset && opt >= OPT_EARLIEST && opt <= OPT_SHIFT) {
        if (o->have_to) {
            fprintf(stderr,
                    "idemproc %s: --%s: only one of --to-earliest, "
                    "--to-latest, --to-offset, --to-datetime, --shift-by\n",
                    o->name, offsets_options[opt - OPT_JSON].name);
            return -1;
        }
        o->have_to = 1;
        o->to_text = offsets_options[opt - OPT_JSON].name;
        switch (opt) {
        case OPT_EARLIEST:
            o->to.mode = IDEM_OFFRESET_EARLIEST;
            return 0;
        case OPT_LATEST:
            o->to.mode = IDEM_OFFRESET_LATEST;
            return 0;
        case OPT_OFFSET:
            o->to.mode = IDEM_OFFRESET_OFFSET;
            if (int64_parse(arg, &o->to.value) || o->to.value < 0) {
                fprintf(stderr,
                        "idemproc %s: --to-offset: \"%s\" is not an offset "
                        "(0 or more)\n",
                        o->name, arg);
                return -1;
            }
            return 0;
        case OPT_SHIFT:
            o->to.mode = IDEM_OFFRESET_SHIFT;
            if (int64_parse(arg, &o->to.value)) {
                fprintf(stderr,
                        "idemproc %s: --shift-by: \"%s\" is not a whole "
                        "number (negative moves back)\n",
                        o->name, arg);
                return -1;
            }
            return 0;
        case OPT_DATETIME:
            o->to.mode = IDEM_OFFRESET_DATETIME;
            if (idem_dlqtime_parse(arg, idem_wall_ms(), &o->to.value, err,
                                   sizeof(err))) {
                fprintf(stderr, "idemproc %s: --to-datetime: %s\n", o->name,
                        err);
                return -1;
            }
            return 0;
        }
    }
    if (o->reset && opt == OPT_EXECUTE) {
        o->execute = 1;
        return 0;
    }
    if (o->reset && opt == OPT_DRY_RUN)
        return 0; /* the default */
    fprintf(stderr,
            "idemproc %s: --%s is not an option of %s (see 'idemproc help "
            "offsets')\n",
            o->name, offsets_options[opt - OPT_JSON].name, o->name);
    return -1;
}

/* ---- what Kafka and Redis hold ---- */

/* One partition, as both systems see it. */
typedef struct {
    const char *topic; /* borrowed from the metadata's copy in topics */
    int32_t partition;
    int64_t kafka;        /* committed; -1 none */
    char kafka_meta[96];  /* its commit metadata ("" none) */
    idem_store_pos_t pos; /* Redis's position (offset -1 none) */
    idem_posval_verdict_t verdict;
    int64_t low, high;
    int64_t start; /* where a member starts it */
    idem_offreset_from_t from;
    int64_t target; /* reset */
} part_t;

typedef struct {
    const idem_conf_t *conf;
    const offsets_opts_t *o;
    rd_kafka_t *rk; /* a consumer of the group that never joins it */
    idem_store_t *store;
    idem_posread_t *reader;
    char cluster[IDEM_POSVAL_CLUSTER_MAX];
    int earliest;  /* auto.offset.reset is earliest */
    char **topics; /* owned names the parts point into */
    size_t ntopics;
    part_t *parts;
    size_t n;
} offsets_t;

/* Whether topic is one of input.topics (a comma list; "^" a regex). */
static int input_topic(const char *list, const char *topic)
{
    char *copy = idem_xstrdup(list), *save = NULL;
    int hit = 0;
    for (char *t = strtok_r(copy, ",", &save); t && !hit;
         t = strtok_r(NULL, ",", &save)) {
        while (*t == ' ')
            t++;
        if (t[0] == '^') {
            regex_t re;
            if (!regcomp(&re, t, REG_EXTENDED | REG_NOSUB)) {
                hit = !regexec(&re, topic, 0, NULL, 0);
                regfree(&re);
            }
        } else {
            hit = !strcmp(t, topic);
        }
    }
    free(copy);
    return hit;
}

static rd_kafka_t *group_client(const idem_conf_t *conf, int *earliest,
                                char *errstr, size_t errstr_size)
{
    rd_kafka_conf_t *kc = rd_kafka_conf_new();
    if (idem_kafka_set(kc, "auto.offset.reset", "earliest", errstr,
                       errstr_size) ||
        idem_conf_apply_kafka(conf, kc, errstr, errstr_size) ||
        idem_kafka_set(kc, "group.id", conf->group_id, errstr, errstr_size) ||
        idem_kafka_set(kc, "enable.auto.commit", "false", errstr,
                       errstr_size)) {
        rd_kafka_conf_destroy(kc);
        return NULL;
    }
    char v[32] = "";
    size_t vs = sizeof(v);
    rd_kafka_conf_get(kc, "auto.offset.reset", v, &vs);
    *earliest = !strcmp(v, "earliest") || !strcmp(v, "smallest") ||
                !strcmp(v, "beginning");
    return idem_kafka_new(RD_KAFKA_CONSUMER, kc, "offsets", errstr,
                          errstr_size);
}

/* Whether each --topic names an input topic of the cluster and partitions
 * it has. Returns 0, or -1 with errstr naming the topic and partitions. */
static int check_selection(const offsets_t *x,
                           const struct rd_kafka_metadata *md, char *errstr,
                           size_t errstr_size)
{
    for (size_t i = 0; i < x->o->nsel; i++) {
        const idem_offreset_sel_t *sel = &x->o->sel[i];
        const struct rd_kafka_metadata_topic *mt = NULL;
        for (int t = 0; t < md->topic_cnt && !mt; t++)
            if (!md->topics[t].err && !strcmp(md->topics[t].topic, sel->topic))
                mt = &md->topics[t];
        if (!mt || !input_topic(x->conf->input_topics, sel->topic)) {
            snprintf(errstr, errstr_size,
                     "--topic %s: %s is not a topic of input.topics (%s) in "
                     "the cluster",
                     sel->topic, sel->topic, x->conf->input_topics);
            return -1;
        }
        int32_t *ids =
            idem_xcalloc((size_t)mt->partition_cnt + 1, sizeof(*ids));
        for (int p = 0; p < mt->partition_cnt; p++)
            ids[p] = mt->partitions[p].id;
        int rc = idem_offreset_sel_check(sel, ids, (size_t)mt->partition_cnt,
                                         errstr, errstr_size);
        free(ids);
        if (rc)
            return -1;
    }
    return 0;
}

/* The selected partitions of input.topics, from the metadata. */
static int load_partitions(offsets_t *x, char *errstr, size_t errstr_size)
{
    const struct rd_kafka_metadata *md;
    rd_kafka_resp_err_t err =
        rd_kafka_metadata(x->rk, 1, NULL, &md, KAFKA_TIMEOUT_MS);
    if (err) {
        snprintf(errstr, errstr_size, "kafka: metadata: %s",
                 rd_kafka_err2str(err));
        return -1;
    }
    for (int t = 0; t < md->topic_cnt; t++) {
        const struct rd_kafka_metadata_topic *mt = &md->topics[t];
        if (mt->err || !input_topic(x->conf->input_topics, mt->topic))
            continue;
        int any = 0;
        for (int p = 0; p < mt->partition_cnt; p++)
            any |= idem_offreset_sel_match(x->o->sel, x->o->nsel, mt->topic,
                                           mt->partitions[p].id);
        if (!any)
            continue;
        x->topics =
            idem_xrealloc(x->topics, (x->ntopics + 1) * sizeof(*x->topics));
        char *name = x->topics[x->ntopics++] = idem_xstrdup(mt->topic);
        /* partitions in order of their id */
        for (int32_t id = 0, seen = 0; seen < mt->partition_cnt; id++) {
            int found = 0;
            for (int p = 0; p < mt->partition_cnt; p++)
                found |= mt->partitions[p].id == id;
            if (!found)
                continue;
            seen++;
            if (!idem_offreset_sel_match(x->o->sel, x->o->nsel, name, id))
                continue;
            x->parts = idem_xrealloc(x->parts, (x->n + 1) * sizeof(*x->parts));
            part_t *pt = &x->parts[x->n++];
            memset(pt, 0, sizeof(*pt));
            pt->topic = name;
            pt->partition = id;
        }
    }
    int rc = check_selection(x, md, errstr, errstr_size);
    rd_kafka_metadata_destroy(md);
    if (rc)
        return -1;
    if (!x->n) {
        snprintf(errstr, errstr_size,
                 "input.topics (%s): no such topic in the cluster",
                 x->conf->input_topics);
        return -1;
    }
    return 0;
}

/* Kafka's committed offsets (and their metadata) of every partition. */
static int load_committed(offsets_t *x, char *errstr, size_t errstr_size)
{
    rd_kafka_topic_partition_list_t *l =
        rd_kafka_topic_partition_list_new((int)x->n);
    for (size_t i = 0; i < x->n; i++)
        rd_kafka_topic_partition_list_add(l, x->parts[i].topic,
                                          x->parts[i].partition);
    rd_kafka_resp_err_t err = rd_kafka_committed(x->rk, l, KAFKA_TIMEOUT_MS);
    if (err) {
        snprintf(errstr, errstr_size, "kafka: committed offsets of %s: %s",
                 x->conf->group_id, rd_kafka_err2str(err));
        rd_kafka_topic_partition_list_destroy(l);
        return -1;
    }
    for (size_t i = 0; i < x->n; i++) {
        const rd_kafka_topic_partition_t *e = &l->elems[i];
        part_t *pt = &x->parts[i];
        pt->kafka = e->err || e->offset < 0 ? -1 : e->offset;
        size_t ml = e->metadata_size < sizeof(pt->kafka_meta)
                        ? e->metadata_size
                        : sizeof(pt->kafka_meta) - 1;
        if (e->metadata && ml)
            memcpy(pt->kafka_meta, e->metadata, ml);
        pt->kafka_meta[e->metadata ? ml : 0] = '\0';
    }
    rd_kafka_topic_partition_list_destroy(l);
    return 0;
}

/* Reads the records the positions vouch for (or at rec[i], when given)
 * with the watermarks: items[n] filled. */
static int read_back(offsets_t *x, idem_posread_item_t *items,
                     const int64_t *rec, char *errstr, size_t errstr_size)
{
    if (!x->reader) {
        x->reader = idem_posread_new(x->conf, errstr, errstr_size);
        if (!x->reader)
            return -1;
    }
    for (size_t i = 0; i < x->n; i++) {
        items[i].topic = x->parts[i].topic;
        items[i].partition = x->parts[i].partition;
        items[i].rec_offset = rec ? rec[i] : x->parts[i].pos.val.rec.offset;
        items[i].now.cluster = x->cluster;
    }
    return idem_posread_read(x->reader, items, x->n, KAFKA_TIMEOUT_MS, errstr,
                             errstr_size);
}

/* Everything show prints: committed offsets, positions and their verdict,
 * watermarks, where a member starts. */
static int load(offsets_t *x, char *errstr, size_t errstr_size)
{
    if (load_partitions(x, errstr, errstr_size) ||
        load_committed(x, errstr, errstr_size))
        return -1;
    char *id = rd_kafka_clusterid(x->rk, KAFKA_TIMEOUT_MS);
    snprintf(x->cluster, sizeof(x->cluster), "%s", id ? id : "");
    free(id);
    idem_store_pos_t *pos = idem_xcalloc(x->n, sizeof(*pos));
    for (size_t i = 0; i < x->n; i++) {
        pos[i].topic = x->parts[i].topic;
        pos[i].partition = x->parts[i].partition;
    }
    int rc =
        idem_store_positions_load(x->store, pos, x->n, errstr, errstr_size);
    for (size_t i = 0; i < x->n && !rc; i++)
        x->parts[i].pos = pos[i];
    free(pos);
    if (rc)
        return -1;
    idem_posread_item_t *items = idem_xcalloc(x->n, sizeof(*items));
    rc = read_back(x, items, NULL, errstr, errstr_size);
    for (size_t i = 0; i < x->n && !rc; i++) {
        part_t *pt = &x->parts[i];
        pt->low = items[i].now.low;
        pt->high = items[i].now.high;
        pt->verdict =
            pt->pos.offset >= 0
                ? idem_posval_judge(pt->pos.offset, &pt->pos.val, &items[i].now)
                : IDEM_POSVAL_USE;
        pt->start = idem_offreset_start(
            pt->pos.offset, pt->verdict == IDEM_POSVAL_USE, pt->kafka,
            idem_offreset_committed_by(pt->kafka_meta, strlen(pt->kafka_meta)),
            x->earliest, pt->low, pt->high, &pt->from);
    }
    free(items);
    return rc;
}

/* The verdict on Redis's position: "lost" when Redis holds none while
 * Kafka holds a member's offset (a member keeps the partition paused). */
static const char *verdict_text(const part_t *pt)
{
    if (pt->from == IDEM_OFFRESET_FROM_NOWHERE)
        return "lost";
    return pt->pos.offset < 0 ? "none" : idem_posval_verdict2str(pt->verdict);
}

static void fmt_offset(char *buf, size_t size, int64_t v)
{
    if (v < 0)
        snprintf(buf, size, "-");
    else
        snprintf(buf, size, "%" PRId64, v);
}

/* ---- show ---- */

static json_t *json_offset(int64_t v)
{
    return v < 0 ? json_null() : json_integer(v);
}

static void show_json(const offsets_t *x, FILE *out)
{
    json_t *parts = json_array();
    int64_t lag = 0;
    for (size_t i = 0; i < x->n; i++) {
        const part_t *pt = &x->parts[i];
        json_t *redis = json_null();
        if (pt->pos.offset >= 0) {
            redis = json_pack("{s:I, s:s, s:s}", "offset",
                              (json_int_t)pt->pos.offset, "cluster",
                              pt->pos.val.cluster, "verdict", verdict_text(pt));
            if (pt->pos.val.rec.offset >= 0) {
                char h[24];
                snprintf(h, sizeof(h), "%016" PRIx64, pt->pos.val.rec.hash);
                json_object_set_new(
                    redis, "record",
                    json_pack("{s:I, s:I, s:s}", "offset",
                              (json_int_t)pt->pos.val.rec.offset, "timestamp",
                              (json_int_t)pt->pos.val.rec.timestamp, "hash",
                              h));
            }
        }
        lag += pt->high - pt->start;
        json_array_append_new(
            parts,
            json_pack("{s:s, s:i, s:o, s:s, s:o, s:I, s:s, s:I, s:I, s:I}",
                      "topic", pt->topic, "partition", (int)pt->partition,
                      "kafka_committed", json_offset(pt->kafka),
                      "kafka_metadata", pt->kafka_meta, "redis", redis, "start",
                      (json_int_t)pt->start, "start_from",
                      idem_offreset_from2str(pt->from), "low",
                      (json_int_t)pt->low, "high", (json_int_t)pt->high, "lag",
                      (json_int_t)(pt->high - pt->start)));
    }
    json_t *doc =
        json_pack("{s:s, s:s, s:o, s:{s:I, s:I}}", "group", x->conf->group_id,
                  "cluster", x->cluster, "partitions", parts, "total",
                  "partitions", (json_int_t)x->n, "lag", (json_int_t)lag);
    json_dumpf(doc, out, JSON_COMPACT);
    fputc('\n', out);
    json_decref(doc);
}

static void show_text(const offsets_t *x, FILE *out)
{
    fprintf(out, "group %s, kafka cluster %s\n", x->conf->group_id,
            x->cluster[0] ? x->cluster : "-");
    fprintf(out, "%-24s %5s %12s %12s %-8s %12s %-17s %12s %12s %10s\n",
            "TOPIC", "PART", "KAFKA", "REDIS", "REDIS-IS", "START", "FROM",
            "LOW", "HIGH", "LAG");
    int64_t lag = 0;
    for (size_t i = 0; i < x->n; i++) {
        const part_t *pt = &x->parts[i];
        char k[24], r[24];
        fmt_offset(k, sizeof(k), pt->kafka);
        fmt_offset(r, sizeof(r), pt->pos.offset);
        lag += pt->high - pt->start;
        fprintf(out,
                "%-24s %5" PRId32 " %12s %12s %-8s %12" PRId64
                " %-17s %12" PRId64 " %12" PRId64 " %10" PRId64 "\n",
                pt->topic, pt->partition, k, r, verdict_text(pt), pt->start,
                idem_offreset_from2str(pt->from), pt->low, pt->high,
                pt->high - pt->start);
    }
    fprintf(out, "total: %zu partitions, lag %" PRId64 "\n", x->n, lag);
    for (size_t i = 0; i < x->n; i++)
        if (x->parts[i].from == IDEM_OFFRESET_FROM_NOWHERE)
            fprintf(out,
                    "%s [%" PRId32 "]: redis holds no position while kafka "
                    "holds a member's offset: redis lost its state of the "
                    "partition (how far back is unknown); members keep it "
                    "paused until idemproc offsets reset --topic %s:%" PRId32
                    " --to-... --execute\n",
                    x->parts[i].topic, x->parts[i].partition, x->parts[i].topic,
                    x->parts[i].partition);
}

/* ---- reset ---- */

/* The first offset of part i whose record's timestamp is at or after
 * at_ms, found by reading records (a binary search; timestamps taken as
 * ascending, as the broker's time index takes them): the broker's answer
 * when it has none, since the mock cluster answers every time with "none".
 * high when no record is that late. */
static int by_time_search(offsets_t *x, size_t i, int64_t at_ms, int64_t *out,
                          char *errstr, size_t errstr_size)
{
    int64_t lo = x->parts[i].low, hi = x->parts[i].high;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        idem_posread_item_t it = {.topic = x->parts[i].topic,
                                  .partition = x->parts[i].partition,
                                  .rec_offset = mid};
        it.now.cluster = x->cluster;
        if (idem_posread_read(x->reader, &it, 1, KAFKA_TIMEOUT_MS, errstr,
                              errstr_size))
            return -1;
        if (!it.now.found || it.now.got.timestamp >= at_ms)
            hi = mid;
        else
            lo = it.now.got.offset + 1;
    }
    *out = lo;
    return 0;
}

/* Each partition's target; the datetime's offsets asked of the broker. */
static int plan(offsets_t *x, char *errstr, size_t errstr_size)
{
    int64_t *by_time = idem_xcalloc(x->n, sizeof(*by_time));
    if (x->o->to.mode == IDEM_OFFRESET_DATETIME) {
        int64_t at_ms = idem_offreset_time_query(x->o->to.value);
        rd_kafka_topic_partition_list_t *l =
            rd_kafka_topic_partition_list_new((int)x->n);
        for (size_t i = 0; i < x->n; i++)
            rd_kafka_topic_partition_list_add(l, x->parts[i].topic,
                                              x->parts[i].partition)
                ->offset = at_ms;
        rd_kafka_resp_err_t err =
            rd_kafka_offsets_for_times(x->rk, l, KAFKA_TIMEOUT_MS);
        for (size_t i = 0; i < x->n && !err; i++) {
            err = l->elems[i].err;
            by_time[i] = l->elems[i].offset;
        }
        rd_kafka_topic_partition_list_destroy(l);
        if (err) {
            snprintf(errstr, errstr_size, "kafka: offsets for the time: %s",
                     rd_kafka_err2str(err));
            free(by_time);
            return -1;
        }
        for (size_t i = 0; i < x->n; i++)
            if (by_time[i] < 0 &&
                by_time_search(x, i, at_ms, &by_time[i], errstr, errstr_size)) {
                free(by_time);
                return -1;
            }
    }
    for (size_t i = 0; i < x->n; i++) {
        part_t *pt = &x->parts[i];
        pt->target = idem_offreset_target(&x->o->to, pt->low, pt->high,
                                          pt->start, by_time[i]);
    }
    free(by_time);
    return 0;
}

static void plan_print(const offsets_t *x, FILE *out)
{
    int64_t skip = 0, again = 0;
    fprintf(out, "reset of group %s (--%s):\n", x->conf->group_id,
            x->o->to_text);
    for (size_t i = 0; i < x->n; i++) {
        const part_t *pt = &x->parts[i];
        char k[24];
        fmt_offset(k, sizeof(k), pt->kafka);
        fprintf(out,
                "  %s [%" PRId32 "]: %" PRId64
                " (from %s; kafka %s) -> %" PRId64,
                pt->topic, pt->partition, pt->start,
                idem_offreset_from2str(pt->from), k, pt->target);
        if (pt->target > pt->start) {
            skip += pt->target - pt->start;
            fprintf(out, ": skips %" PRId64 " records\n",
                    pt->target - pt->start);
        } else if (pt->target < pt->start) {
            again += pt->start - pt->target;
            fprintf(out,
                    ": reads %" PRId64 " records again (duplicates where "
                    "their marks are kept)\n",
                    pt->start - pt->target);
        } else {
            fprintf(out, ": no change\n");
        }
    }
    fprintf(out,
            "total: %zu partitions, %" PRId64 " records skipped, %" PRId64
            " read again\n",
            x->n, skip, again);
}

/* 0 when the group has no live member; else prints them and returns -1.
 * Asks the broker (a real Kafka answers ListGroups with the members) and
 * the members' heartbeats in Redis (the mock cluster does not answer). */
static int refuse_live(offsets_t *x, char *errstr, size_t errstr_size)
{
    char names[2048] = "";
    size_t nl = 0, count = 0;
    const struct rd_kafka_group_list *gl = NULL;
    rd_kafka_resp_err_t err =
        rd_kafka_list_groups(x->rk, x->conf->group_id, &gl, KAFKA_TIMEOUT_MS);
    if (!err) {
        for (int g = 0; g < gl->group_cnt; g++)
            for (int m = 0; m < gl->groups[g].member_cnt; m++) {
                const struct rd_kafka_group_member_info *mi =
                    &gl->groups[g].members[m];
                nl += (size_t)snprintf(
                    names + nl, nl < sizeof(names) ? sizeof(names) - nl : 0,
                    "%s%s (%s, by the broker)", count ? ", " : "",
                    mi->client_id ? mi->client_id : mi->member_id,
                    mi->client_host ? mi->client_host : "?");
                count++;
            }
        rd_kafka_group_list_destroy(gl);
    } else if (err != RD_KAFKA_RESP_ERR__UNSUPPORTED_FEATURE) {
        snprintf(errstr, errstr_size, "kafka: members of group %s: %s",
                 x->conf->group_id, rd_kafka_err2str(err));
        return -1;
    }
    idem_liveness_member_t *live;
    size_t n;
    if (idem_liveness_list(x->conf, &live, &n, errstr, errstr_size))
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (nl < sizeof(names) && strstr(names, live[i].member))
            continue; /* named by the broker already */
        nl += (size_t)snprintf(
            names + nl, nl < sizeof(names) ? sizeof(names) - nl : 0,
            "%s%s (heartbeat in redis, %.1f s left)", count ? ", " : "",
            live[i].member, (double)live[i].expires_in_ms / 1000.0);
        count++;
    }
    idem_liveness_list_free(live, n);
    if (!count)
        return 0;
    snprintf(errstr, errstr_size,
             "group %s has %zu live member%s: %s; stop %s first (nothing "
             "changed)",
             x->conf->group_id, count, count == 1 ? "" : "s", names,
             count == 1 ? "it" : "them");
    return -1;
}

/* Joins the group alone and waits until every partition to reset is
 * assigned to this client: a broker takes a commit of a group it knows only
 * from a member of its current generation (the mock cluster refuses any
 * other with UNKNOWN_MEMBER_ID), and while this client holds them no member
 * can start on them. Returns 0, or -1 with errstr (a partition still held
 * elsewhere: a member the liveness check did not see). */
static int join_alone(offsets_t *x, char *errstr, size_t errstr_size)
{
    rd_kafka_topic_partition_list_t *sub =
        rd_kafka_topic_partition_list_new((int)x->ntopics);
    for (size_t i = 0; i < x->ntopics; i++)
        rd_kafka_topic_partition_list_add(sub, x->topics[i],
                                          RD_KAFKA_PARTITION_UA);
    rd_kafka_poll_set_consumer(x->rk);
    rd_kafka_resp_err_t err = rd_kafka_subscribe(x->rk, sub);
    rd_kafka_topic_partition_list_destroy(sub);
    if (err) {
        snprintf(errstr, errstr_size, "kafka: joining group %s: %s",
                 x->conf->group_id, rd_kafka_err2str(err));
        return -1;
    }
    int64_t deadline = idem_now_ms() + JOIN_TIMEOUT_MS;
    size_t missing = x->n;
    const part_t *first_missing = NULL;
    while (missing && idem_now_ms() < deadline) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(x->rk, 100);
        if (m)
            rd_kafka_message_destroy(m); /* never stored nor committed */
        rd_kafka_topic_partition_list_t *a = NULL;
        if (rd_kafka_assignment(x->rk, &a))
            continue;
        missing = 0;
        for (size_t i = 0; i < x->n; i++)
            if (!rd_kafka_topic_partition_list_find(a, x->parts[i].topic,
                                                    x->parts[i].partition)) {
                if (!missing++)
                    first_missing = &x->parts[i];
            }
        rd_kafka_topic_partition_list_destroy(a);
    }
    if (missing) {
        snprintf(errstr, errstr_size,
                 "group %s: %s [%" PRId32 "] (and %zu more) not assigned to "
                 "this reset within %d ms: another member holds them; stop "
                 "it first (nothing changed)",
                 x->conf->group_id, first_missing->topic,
                 first_missing->partition, missing - 1, JOIN_TIMEOUT_MS);
        return -1;
    }
    return 0;
}

/* Writes the targets: Redis's positions first (a member starts from them),
 * then Kafka's committed offsets with the reset's metadata. Each position
 * vouches for the record below it (or at it, when it is the first), read
 * back now, so a member judges it as its own. */
static int apply(offsets_t *x, char *errstr, size_t errstr_size)
{
    int64_t *rec = idem_xcalloc(x->n, sizeof(*rec));
    for (size_t i = 0; i < x->n; i++) {
        const part_t *pt = &x->parts[i];
        rec[i] = pt->target > pt->low    ? pt->target - 1
                 : pt->target < pt->high ? pt->target
                                         : -1;
    }
    idem_posread_item_t *items = idem_xcalloc(x->n, sizeof(*items));
    int rc = join_alone(x, errstr, errstr_size);
    if (!rc)
        rc = read_back(x, items, rec, errstr, errstr_size);
    idem_store_pos_t *pos = idem_xcalloc(x->n, sizeof(*pos));
    for (size_t i = 0; i < x->n && !rc; i++) {
        pos[i].topic = x->parts[i].topic;
        pos[i].partition = x->parts[i].partition;
        pos[i].offset = x->parts[i].target;
        idem_posval_init(&pos[i].val, x->cluster);
        if (rec[i] >= 0 && items[i].now.found)
            pos[i].val.rec = items[i].now.got;
    }
    if (!rc)
        rc =
            idem_store_positions_save(x->store, pos, x->n, errstr, errstr_size);
    free(pos);
    free(items);
    free(rec);
    if (rc)
        return -1;
    char meta[96], when[40];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
    snprintf(meta, sizeof(meta), "%s %s", IDEM_OFFRESET_META_RESET, when);
    rd_kafka_topic_partition_list_t *l =
        rd_kafka_topic_partition_list_new((int)x->n);
    for (size_t i = 0; i < x->n; i++) {
        rd_kafka_topic_partition_t *e = rd_kafka_topic_partition_list_add(
            l, x->parts[i].topic, x->parts[i].partition);
        e->offset = x->parts[i].target;
        e->metadata = idem_xstrdup(meta);
        e->metadata_size = strlen(meta);
    }
    rd_kafka_resp_err_t err = rd_kafka_commit(x->rk, l, 0);
    for (int i = 0; i < l->cnt && !err; i++)
        err = l->elems[i].err;
    rd_kafka_topic_partition_list_destroy(l);
    if (err) {
        snprintf(errstr, errstr_size,
                 "kafka: commit: %s (Redis's positions are written, and a "
                 "member starts from them; run the reset again to move "
                 "Kafka's offsets too)",
                 rd_kafka_err2str(err));
        return -1;
    }
    return 0;
}

static int run_reset(offsets_t *x, char *errstr, size_t errstr_size)
{
    if (plan(x, errstr, errstr_size))
        return -1;
    plan_print(x, stdout);
    if (!x->o->execute) {
        printf("dry run: nothing changed (add --execute to apply)\n");
        return 0;
    }
    if (refuse_live(x, errstr, errstr_size) || apply(x, errstr, errstr_size))
        return -1;
    printf("reset: done: redis positions and kafka offsets of %zu "
           "partitions moved\n",
           x->n);
    return 0;
}

int idem_cmd_offsets(int argc, char **argv, char **envp)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        idem_cmd_offsets_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? IDEM_EXIT_USAGE : IDEM_EXIT_OK;
    }
    offsets_opts_t o = {0};
    if (!strcmp(argv[1], "show")) {
        o.name = "offsets show";
    } else if (!strcmp(argv[1], "reset")) {
        o.name = "offsets reset";
        o.reset = 1;
    } else {
        fprintf(stderr,
                "idemproc offsets: unknown subcommand \"%s\" (show or "
                "reset)\n",
                argv[1]);
        return IDEM_EXIT_USAGE;
    }
    /* argv[1] (the verb) becomes the argv[0] getopt skips. */
    char **args = idem_xcalloc((size_t)argc, sizeof(*args));
    args[0] = (char *)o.name;
    for (int i = 2; i < argc; i++)
        args[i - 1] = argv[i];
    idem_conf_t *conf = NULL;
    int rc = idem_cmdline_conf(argc - 1, args, envp, idem_cmd_offsets_usage,
                               offsets_options, NULL, offsets_opt, &o, &conf);
    free(args);
    if (rc < 0 && o.reset && !o.have_to) {
        fprintf(stderr,
                "idemproc offsets reset: one of --to-earliest, --to-latest, "
                "--to-offset N, --to-datetime TIME, --shift-by N is "
                "required\n");
        rc = IDEM_EXIT_USAGE;
    }
    char errstr[1024];
    offsets_t x = {.conf = conf, .o = &o};
    if (rc < 0) {
        x.rk = group_client(conf, &x.earliest, errstr, sizeof(errstr));
        x.store = idem_store_new(conf, NULL);
        rc = !x.rk || load(&x, errstr, sizeof(errstr)) ? -1 : 0;
        if (!rc && !o.reset) {
            if (o.json)
                show_json(&x, stdout);
            else
                show_text(&x, stdout);
        } else if (!rc) {
            rc = run_reset(&x, errstr, sizeof(errstr));
        }
        if (rc)
            fprintf(stderr, "idemproc %s: %s\n", o.name, errstr);
        rc = rc ? IDEM_EXIT_FAIL : IDEM_EXIT_OK;
    }
    fflush(stdout);
    idem_posread_destroy(x.reader);
    idem_store_destroy(x.store);
    if (x.rk) {
        rd_kafka_consumer_close(x.rk); /* leaves the group when it joined */
        rd_kafka_destroy(x.rk);
    }
    for (size_t i = 0; i < x.ntopics; i++)
        free(x.topics[i]);
    free(x.topics);
    free(x.parts);
    for (size_t i = 0; i < o.nsel; i++)
        idem_offreset_sel_clear(&o.sel[i]);
    free(o.sel);
    idem_conf_destroy(conf);
    return rc;
}
