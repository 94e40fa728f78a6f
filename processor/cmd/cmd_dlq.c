/* cmd_dlq: `idemproc dlq stats|inspect|replay`: what is in the DLQ, why,
 * and sending chosen dead letters back through the processor's dedup. */
#include "cmd/cmd.h"
#include "cmd/cmdline.h"
#include "conf/conf.h"
#include "kafka/dlqread.h"
#include "kafka/dlqrec.h"
#include "kafka/kafka.h"
#include "kafka/produce.h"
#include "input/envelope.h"
#include "base/outcome.h"
#include "base/util.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define READ_TIMEOUT_MS 30000 /* metadata, watermarks, each next record */
#define FLUSH_EVERY     1000  /* replays between waits for their reports */

void idem_cmd_dlq_usage(FILE *out)
{
    fprintf(
        out,
        "usage: idemproc dlq stats   -c FILE [filters] [--json]\n"
        "       idemproc dlq inspect -c FILE [filters] [--format json|text]\n"
        "                                    [--max-bytes N | --value]\n"
        "       idemproc dlq replay  -c FILE [filters] [--to TOPIC] "
        "[--dry-run]\n"
        "                                    [--rate N/s] [--checkpoint "
        "GROUP]\n"
        "  Reads dlq.topic once, from each partition's earliest stored "
        "offset to its\n"
        "  end as of the start, with no consumer group (never moves the "
        "processor's\n"
        "  offsets).\n"
        "  stats    counts by reason and original topic, oldest/newest "
        "dlq.failed.at,\n"
        "           distinct originals vs dead letters written\n"
        "  inspect  one dead letter a line: JSON (default) or text, with "
        "its identity\n"
        "           (read by the config's envelope.*) and original headers; "
        "the value\n"
        "           is cut to --max-bytes (default 1024) unless --value; "
        "text cuts\n"
        "           every field so and shows control characters and bytes "
        "that are not\n"
        "           UTF-8 as \\xNN (JSON is exact)\n"
        "  replay   re-publishes the selected dead letters to their "
        "original topic and\n"
        "           partition (or --to: the same partition number where it "
        "has it, else\n"
        "           by key) with the idempotent producer: same key, value and "
        "headers minus\n"
        "           dlq.*, plus dlq.replayed.from and dlq.replay.count; the "
        "message id is\n"
        "           kept, so dedup absorbs what was already applied. A dead "
        "letter\n"
        "           replayed dlq.replay.max times is refused. --checkpoint "
        "GROUP commits\n"
        "           how far it got, so the next run with it continues "
        "there.\n"
        "  filters: --reason R  --topic T  --group G  --since TIME  --until "
        "TIME\n"
        "           --key K"
        "  --grep TEXT  --limit N  --from-offset N\n"
        "           (--group: dlq.group, for a DLQ that several consumer "
        "groups share)\n"
        "           TIME: RFC 3339 (2026-11-30T16:00:00Z) or ago (90s, 15m, "
        "2h, 7d)\n"
        "  Exit 0 ok, 1 a replay or read failed, 2 usage.\n");
}

enum {
    OPT_REASON = 256,
    OPT_TOPIC,
    OPT_SINCE,
    OPT_UNTIL,
    OPT_KEY,
    OPT_GREP,
    OPT_LIMIT,
    OPT_FROM,
    OPT_FORMAT,
    OPT_MAX_BYTES,
    OPT_VALUE,
    OPT_JSON,
    OPT_TO,
    OPT_DRY_RUN,
    OPT_RATE,
    OPT_CHECKPOINT,
    OPT_GROUP,
};

/* Every option of the three; dlq_opt refuses those a verb does not take. */
static const struct option dlq_options[] = {
    {"reason", required_argument, 0, OPT_REASON},
    {"topic", required_argument, 0, OPT_TOPIC},
    {"since", required_argument, 0, OPT_SINCE},
    {"until", required_argument, 0, OPT_UNTIL},
    {"key", required_argument, 0, OPT_KEY},
    {"grep", required_argument, 0, OPT_GREP},
    {"limit", required_argument, 0, OPT_LIMIT},
    {"from-offset", required_argument, 0, OPT_FROM},
    {"format", required_argument, 0, OPT_FORMAT},
    {"max-bytes", required_argument, 0, OPT_MAX_BYTES},
    {"value", no_argument, 0, OPT_VALUE},
    {"json", no_argument, 0, OPT_JSON},
    {"to", required_argument, 0, OPT_TO},
    {"dry-run", no_argument, 0, OPT_DRY_RUN},
    {"rate", required_argument, 0, OPT_RATE},
    {"checkpoint", required_argument, 0, OPT_CHECKPOINT},
    {"group", required_argument, 0, OPT_GROUP},
    {0, 0, 0, 0}};

typedef enum { DLQ_STATS, DLQ_INSPECT, DLQ_REPLAY } dlq_verb_t;

typedef struct {
    dlq_verb_t verb;
    const char *name; /* "dlq stats", ... for messages */
    idem_dlqfilter_t filter;
    long limit;          /* -1 = all */
    int64_t from_offset; /* -1 = earliest */
    int text;            /* inspect --format text */
    long max_bytes;      /* inspect; -1 = whole value */
    int json;            /* stats --json */
    const char *to;      /* replay --to */
    int dry_run;
    double rate; /* replays per second; 0 = unlimited */
    const char *checkpoint;
} dlq_opts_t;

static int bad(const dlq_opts_t *o, const char *flag, const char *arg,
               const char *why)
{
    fprintf(stderr, "idemproc %s: %s: \"%s\" %s\n", o->name, flag, arg, why);
    return -1;
}

static int long_parse(const char *s, long min, long *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < min)
        return -1;
    *out = v;
    return 0;
}

/* idem_cmdline_opt_cb for the dlq subcommands' options. */
static int dlq_opt(int opt, const char *arg, void *opaque)
{
    dlq_opts_t *o = opaque;
    char err[256];
    long v;
    switch (opt) {
    case OPT_REASON:
        if (idem_reason_parse(arg) < 0)
            return bad(o, "--reason", arg,
                       "is not a reason (too-large, not-json, not-object, "
                       "no-identity, invalid-field, handler-rejected, "
                       "max-retries)");
        o->filter.reason = arg;
        return 0;
    case OPT_TOPIC:
        o->filter.topic = arg;
        return 0;
    case OPT_KEY:
        o->filter.key = arg;
        return 0;
    case OPT_GROUP:
        if (!*arg)
            return bad(o, "--group", arg, "is not a group name");
        o->filter.group = arg;
        return 0;
    case OPT_GREP:
        o->filter.grep = arg;
        return 0;
    case OPT_SINCE:
    case OPT_UNTIL: {
        int64_t *t =
            opt == OPT_SINCE ? &o->filter.since_ms : &o->filter.until_ms;
        if (idem_dlqtime_parse(arg, idem_wall_ms(), t, err, sizeof(err))) {
            fprintf(stderr, "idemproc %s: %s: %s\n", o->name,
                    opt == OPT_SINCE ? "--since" : "--until", err);
            return -1;
        }
        return 0;
    }
    case OPT_LIMIT:
        if (long_parse(arg, 1, &o->limit))
            return bad(o, "--limit", arg, "is not a count (1 or more)");
        return 0;
    case OPT_FROM:
        if (long_parse(arg, 0, &v))
            return bad(o, "--from-offset", arg, "is not an offset (0 or more)");
        o->from_offset = v;
        return 0;
    }
    if (o->verb == DLQ_INSPECT) {
        switch (opt) {
        case OPT_FORMAT:
            if (strcmp(arg, "json") && strcmp(arg, "text"))
                return bad(o, "--format", arg, "is not json or text");
            o->text = !strcmp(arg, "text");
            return 0;
        case OPT_MAX_BYTES:
            if (long_parse(arg, 0, &o->max_bytes))
                return bad(o, "--max-bytes", arg, "is not a byte count");
            return 0;
        case OPT_VALUE:
            o->max_bytes = -1;
            return 0;
        }
    }
    if (o->verb == DLQ_STATS && opt == OPT_JSON) {
        o->json = 1;
        return 0;
    }
    if (o->verb == DLQ_REPLAY) {
        switch (opt) {
        case OPT_TO:
            o->to = arg;
            return 0;
        case OPT_DRY_RUN:
            o->dry_run = 1;
            return 0;
        case OPT_RATE: {
            char *end;
            double r = strtod(arg, &end);
            if (end == arg || (*end && strcmp(end, "/s")) || !(r > 0) ||
                r > 1e7)
                return bad(o, "--rate", arg, "is not a rate (e.g. 100/s)");
            o->rate = r;
            return 0;
        }
        case OPT_CHECKPOINT:
            if (!*arg)
                return bad(o, "--checkpoint", arg, "is not a group name");
            o->checkpoint = arg;
            return 0;
        }
    }
    const char *flag = "?";
    for (size_t i = 0; dlq_options[i].name; i++)
        if (dlq_options[i].val == opt)
            flag = dlq_options[i].name;
    fprintf(stderr,
            "idemproc %s: --%s is not an option of %s (see 'idemproc help "
            "dlq')\n",
            o->name, flag, o->name);
    return -1;
}

/* ---- the shared scan ---- */

/* Called for each dead letter that passes the filters; returns 0 to go on,
 * 1 to stop reading. */
typedef int scan_cb(const idem_dlqrec_t *r, size_t part_index, void *opaque);
/* Called for each dead letter the filters skip (replay's checkpoint). */
typedef void skip_cb(size_t part_index, int64_t offset, void *opaque);

/* Prints what the reader found about the partitions: retention gaps and an
 * empty DLQ. */
static void scan_notes(const dlq_opts_t *o, const char *topic,
                       const idem_dlqread_part_t *parts, size_t n, FILE *out)
{
    int64_t stored = 0, todo = 0;
    for (size_t i = 0; i < n; i++) {
        stored += parts[i].high - parts[i].low;
        todo += parts[i].high - parts[i].start;
        if (parts[i].low > 0)
            fprintf(out,
                    "%s: partition %" PRId32 " starts at offset %" PRId64
                    ": %" PRId64 " earlier dead letters are gone\n",
                    o->name, parts[i].partition, parts[i].low, parts[i].low);
    }
    if (!stored)
        fprintf(out, "%s: %s is empty: no dead letters in its %zu partitions\n",
                o->name, topic, n);
    else if (!todo)
        fprintf(out,
                "%s: nothing to read: every partition of %s is read to its "
                "end%s\n",
                o->name, topic, o->checkpoint ? " by this checkpoint" : "");
}

/* Reads the DLQ once with the filters; returns 0, or -1 with errstr. */
static int scan(const idem_conf_t *conf, const dlq_opts_t *o,
                idem_dlqread_t *rd, long *read_cnt, scan_cb *cb, skip_cb *skip,
                void *opaque, char *errstr, size_t errstr_size)
{
    long matched = 0;
    for (;;) {
        rd_kafka_message_t *m;
        int rc =
            idem_dlqread_next(rd, &m, READ_TIMEOUT_MS, errstr, errstr_size);
        if (rc <= 0)
            return rc;
        (*read_cnt)++;
        rd_kafka_headers_t *h = NULL;
        if (rd_kafka_message_headers(m, &h))
            h = NULL;
        idem_dlqrec_t r;
        idem_dlqrec_decode(&r, conf->dlq_topic, m->partition, m->offset,
                           rd_kafka_message_timestamp(m, NULL), m->key,
                           m->key_len, m->payload, m->len, h);
        int stop = 0;
        if (idem_dlqfilter_match(&o->filter, &r)) {
            stop = cb(&r, (size_t)m->partition, opaque);
            if (o->limit > 0 && ++matched >= o->limit)
                stop = 1;
        } else if (skip) {
            skip((size_t)m->partition, m->offset, opaque);
        }
        idem_dlqrec_clear(&r);
        rd_kafka_message_destroy(m);
        if (stop)
            return 0;
    }
}

/* ---- stats and inspect ---- */

static int stats_cb(const idem_dlqrec_t *r, size_t pi, void *opaque)
{
    (void)pi;
    idem_dlqstats_add(opaque, r);
    return 0;
}

typedef struct {
    const dlq_opts_t *o;
    idem_envelope_rules_t *rules; /* the config's envelope.* */
    long shown;
} inspect_t;

static int inspect_cb(const idem_dlqrec_t *r, size_t pi, void *opaque)
{
    (void)pi;
    inspect_t *in = opaque;
    /* The identity as the processor reads it: the same rules, so a
     * no-identity dead letter says here why it has none. */
    idem_dlqrec_t shown = *r;
    idem_envelope_t env;
    idem_reason_t reason;
    char err[256];
    memset(&env, 0, sizeof(env));
    if (!idem_envelope_read(in->rules, r->value, r->value_len, r->headers,
                            r->key, r->key_len, &env, &reason, err,
                            sizeof(err))) {
        shown.identity = env.identity;
        shown.identity_len = env.identity_len;
    } else {
        shown.identity_error = err;
    }
    if (in->o->text)
        idem_dlqrec_print_text(&shown, in->o->max_bytes, stdout);
    else
        idem_dlqrec_print_json(&shown, in->o->max_bytes, stdout);
    idem_envelope_term(&env);
    in->shown++;
    return 0;
}

static int run_stats(const idem_conf_t *conf, const dlq_opts_t *o,
                     idem_dlqread_t *rd)
{
    char errstr[512];
    size_t n;
    const idem_dlqread_part_t *parts = idem_dlqread_parts(rd, &n);
    idem_dlqstats_t *s = idem_dlqstats_new();
    for (size_t i = 0; i < n; i++)
        idem_dlqstats_partition(s, parts[i].partition, parts[i].low,
                                parts[i].high);
    long read_cnt = 0;
    int rc =
        scan(conf, o, rd, &read_cnt, stats_cb, NULL, s, errstr, sizeof(errstr));
    if (rc) {
        fprintf(stderr, "idemproc %s: %s\n", o->name, errstr);
    } else if (o->json) {
        idem_dlqstats_print_json(s, conf->dlq_topic, stdout);
    } else {
        idem_dlqstats_print(s, conf->dlq_topic, stdout);
    }
    idem_dlqstats_destroy(s);
    return rc ? IDEM_EXIT_FAIL : IDEM_EXIT_OK;
}

static int run_inspect(const idem_conf_t *conf, const dlq_opts_t *o,
                       idem_dlqread_t *rd)
{
    char errstr[512];
    size_t n;
    const idem_dlqread_part_t *parts = idem_dlqread_parts(rd, &n);
    scan_notes(o, conf->dlq_topic, parts, n, stderr);
    /* No size limit: a dead letter too large for the input is still shown
     * with the identity it has. */
    inspect_t in = {o, NULL, 0};
    in.rules = idem_envelope_rules_new(
        conf->envelope_format, conf->envelope_identity,
        conf->envelope_message_id, 0, SIZE_MAX, errstr, sizeof(errstr));
    if (!in.rules) {
        fprintf(stderr, "idemproc %s: %s\n", o->name, errstr);
        return IDEM_EXIT_USAGE;
    }
    long read_cnt = 0;
    int rc = scan(conf, o, rd, &read_cnt, inspect_cb, NULL, &in, errstr,
                  sizeof(errstr));
    idem_envelope_rules_destroy(in.rules);
    fflush(stdout);
    if (rc) {
        fprintf(stderr, "idemproc %s: %s\n", o->name, errstr);
        return IDEM_EXIT_FAIL;
    }
    fprintf(stderr, "%s: %ld shown, %ld read\n", o->name, in.shown, read_cnt);
    return IDEM_EXIT_OK;
}

/* ---- replay ---- */

/* What happened to one replay: filled by the delivery report. */
typedef struct {
    size_t part_index;
    int32_t partition; /* in the DLQ */
    int64_t offset;    /* in the DLQ */
    int state;         /* 0 in flight, 1 acked, -1 failed */
    rd_kafka_resp_err_t err;
} slot_t;

/* Per DLQ partition: what the checkpoint may cover. */
typedef struct {
    int64_t handled;    /* next offset after the last record handled */
    int64_t first_fail; /* offset of the first failed replay; INT64_MAX */
    int64_t committed;  /* last committed position; -1 none */
} cursor_t;

/* A target topic's partition count, asked once per run. */
typedef struct {
    char *topic;
    int count; /* 0: the topic does not exist */
} target_t;

typedef struct {
    const idem_conf_t *conf;
    const dlq_opts_t *o;
    idem_dlqread_t *rd;
    rd_kafka_t *rk; /* also on a dry run (asks partition counts, sends none) */
    target_t *targets;
    size_t target_cnt;
    slot_t **slots; /* in flight since the last wait */
    size_t slot_cnt;
    cursor_t *cur;
    size_t cur_cnt;
    long matched, sent, acked, refused, failed, read_cnt;
    int64_t t0_us;    /* --rate: when the first replay went out */
    int64_t shown_ms; /* last progress line */
    int tty;
    int commit_failed;
} replay_t;

/* Delivery report callback: fires inside rd_kafka_poll/flush of the replay
 * producer, on the thread that calls them (the command's). */
static void replay_dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m,
                         void *opaque)
{
    (void)rk;
    replay_t *rp = opaque;
    slot_t *s = m->_private;
    s->err = m->err;
    s->state = m->err ? -1 : 1;
    if (m->err) {
        rp->failed++;
        fprintf(stderr, "failed %s/%" PRId32 "/%" PRId64 ": %s\n",
                rp->conf->dlq_topic, s->partition, s->offset,
                rd_kafka_err2str(m->err));
    } else {
        rp->acked++;
    }
}

static void progress(replay_t *rp, int last)
{
    if (!rp->tty)
        return;
    int64_t now = idem_now_ms();
    if (!last && now - rp->shown_ms < 250)
        return;
    rp->shown_ms = now;
    fprintf(stderr,
            "\rreplay: read %ld, matched %ld, sent %ld, acked %ld, "
            "refused %ld, failed %ld%s",
            rp->read_cnt, rp->matched, rp->sent, rp->acked, rp->refused,
            rp->failed, last ? "\n" : "");
}

static void handled(replay_t *rp, size_t pi, int64_t offset)
{
    if (pi < rp->cur_cnt && offset + 1 > rp->cur[pi].handled)
        rp->cur[pi].handled = offset + 1;
}

static void replay_skip(size_t pi, int64_t offset, void *opaque)
{
    handled(opaque, pi, offset);
}

/* Waits for every report of the replays in flight, then (with a
 * checkpoint) commits each partition up to its first failure. */
static void replay_settle(replay_t *rp)
{
    if (rp->rk) {
        while (rd_kafka_outq_len(rp->rk) > 0)
            rd_kafka_flush(rp->rk, 1000); /* message.timeout.ms bounds it */
    }
    for (size_t i = 0; i < rp->slot_cnt; i++) {
        slot_t *s = rp->slots[i];
        if (s->state < 0 && s->offset < rp->cur[s->part_index].first_fail)
            rp->cur[s->part_index].first_fail = s->offset;
        free(s);
    }
    rp->slot_cnt = 0;
    if (!rp->o->checkpoint || rp->o->dry_run)
        return;
    for (size_t i = 0; i < rp->cur_cnt; i++) {
        cursor_t *c = &rp->cur[i];
        int64_t pos = c->handled < c->first_fail ? c->handled : c->first_fail;
        if (pos <= c->committed)
            continue;
        char errstr[512];
        if (idem_dlqread_commit(rp->rd, i, pos, errstr, sizeof(errstr))) {
            fprintf(stderr, "idemproc %s: %s\n", rp->o->name, errstr);
            rp->commit_failed = 1;
        } else {
            c->committed = pos;
        }
    }
}

static void pace(replay_t *rp)
{
    if (rp->o->rate <= 0)
        return;
    int64_t now = idem_now_us();
    if (!rp->t0_us)
        rp->t0_us = now;
    int64_t due = rp->t0_us + (int64_t)((double)rp->sent * 1e6 / rp->o->rate);
    while (now < due) {
        rd_kafka_poll(rp->rk, (int)((due - now) / 1000) + 1);
        now = idem_now_us();
    }
}

/* The partition count of `topic` (0: it does not exist), asked of the
 * brokers the first time only; -1 with errstr when none answered. */
static int target_partitions(replay_t *rp, const char *topic, char *errstr,
                             size_t errstr_size)
{
    for (size_t i = 0; i < rp->target_cnt; i++)
        if (!strcmp(rp->targets[i].topic, topic))
            return rp->targets[i].count;
    int n =
        idem_kafka_partition_count(rp->rk, topic, 30000, errstr, errstr_size);
    if (n < 0)
        return -1;
    rp->targets =
        idem_xrealloc(rp->targets, (rp->target_cnt + 1) * sizeof(*rp->targets));
    rp->targets[rp->target_cnt++] = (target_t){idem_xstrdup(topic), n};
    return n;
}

/* Where the replay of r goes in `target`: back to the partition number it
 * came from (dlq.original.partition), so it stays in line with its key's
 * other records whatever partitioner wrote them, and its dedup state is
 * the partition's it was first read from. Where its key hashes
 * (RD_KAFKA_PARTITION_UA) when it names no partition, and with --to when
 * the target has no partition of that number. Returns the partition, or
 * -2 with why: the original topic has no such partition (deleted and
 * created again with fewer) or is gone, or no broker answered. */
static int32_t replay_partition(replay_t *rp, const idem_dlqrec_t *r,
                                const char *target, char *why, size_t why_size)
{
    if (r->orig_partition < 0)
        return RD_KAFKA_PARTITION_UA;
    int n = target_partitions(rp, target, why, why_size);
    if (n < 0)
        return -2;
    if (r->orig_partition < n)
        return r->orig_partition;
    if (rp->o->to)
        return RD_KAFKA_PARTITION_UA;
    if (!n)
        snprintf(why, why_size,
                 "original topic %s does not exist (replay with --to TOPIC)",
                 target);
    else
        snprintf(why, why_size,
                 "dlq.original.partition %" PRId32
                 " is not a partition of %s, which has %d (was the topic "
                 "created again?): replay with --to TOPIC to send it where "
                 "its key hashes",
                 r->orig_partition, target, n);
    return -2;
}

static int replay_cb(const idem_dlqrec_t *r, size_t pi, void *opaque)
{
    replay_t *rp = opaque;
    const dlq_opts_t *o = rp->o;
    rp->matched++;
    char why[512];
    const char *target = o->to ? o->to : r->orig_topic;
    if (idem_dlqrec_refusal(r, rp->conf->dlq_replay_max, o->to != NULL, why,
                            sizeof(why))) {
        rp->refused++;
        printf("refused %s/%" PRId32 "/%" PRId64 ": %s\n", r->dlq_topic,
               r->partition, r->offset, why);
        handled(rp, pi, r->offset); /* it can never succeed: move on */
        progress(rp, 0);
        return 0;
    }
    int32_t part = replay_partition(rp, r, target, why, sizeof(why));
    if (part == -2) {
        rp->failed++;
        fprintf(stderr, "failed %s/%" PRId32 "/%" PRId64 ": %s\n", r->dlq_topic,
                r->partition, r->offset, why);
        handled(rp, pi, r->offset);
        if (r->offset < rp->cur[pi].first_fail)
            rp->cur[pi].first_fail = r->offset;
        progress(rp, 0);
        return 0;
    }
    if (o->dry_run) {
        printf("would replay %s/%" PRId32 "/%" PRId64 " (%s) to %s",
               r->dlq_topic, r->partition, r->offset,
               r->reason ? r->reason : "?", target);
        if (part >= 0)
            printf("/%" PRId32, part);
        printf(" as replay %d of at most %" PRId64 "\n", r->replay_count + 1,
               rp->conf->dlq_replay_max);
        rp->sent++;
        return 0;
    }
    pace(rp);
    slot_t *s = idem_xcalloc(1, sizeof(*s));
    s->part_index = pi;
    s->partition = r->partition;
    s->offset = r->offset;
    rd_kafka_headers_t *h = idem_dlqrec_replay_headers(r);
    idem_kafka_msg_t m = {.topic = target,
                          .partitioned = part != RD_KAFKA_PARTITION_UA,
                          .partition = part,
                          .msgflags = RD_KAFKA_MSG_F_COPY,
                          .key = r->key,
                          .key_len = r->key_len,
                          .value = (void *)r->value,
                          .value_len = r->value_len,
                          .headers = h,
                          .opaque = s};
    rd_kafka_resp_err_t err = idem_kafka_produce(rp->rk, &m, 100);
    handled(rp, pi, r->offset);
    if (err) {
        rd_kafka_headers_destroy(h); /* not taken over on failure */
        rp->failed++;
        fprintf(stderr, "failed %s/%" PRId32 "/%" PRId64 ": %s\n", r->dlq_topic,
                r->partition, r->offset, rd_kafka_err2str(err));
        if (r->offset < rp->cur[pi].first_fail)
            rp->cur[pi].first_fail = r->offset;
        free(s);
    } else {
        rp->sent++;
        rp->slots =
            idem_xrealloc(rp->slots, (rp->slot_cnt + 1) * sizeof(*rp->slots));
        rp->slots[rp->slot_cnt++] = s;
        if (rp->slot_cnt >= FLUSH_EVERY)
            replay_settle(rp);
    }
    rd_kafka_poll(rp->rk, 0);
    progress(rp, 0);
    return 0;
}

static int run_replay(const idem_conf_t *conf, const dlq_opts_t *o,
                      idem_dlqread_t *rd)
{
    char errstr[512];
    size_t n;
    const idem_dlqread_part_t *parts = idem_dlqread_parts(rd, &n);
    scan_notes(o, conf->dlq_topic, parts, n, stderr);
    replay_t rp = {.conf = conf, .o = o, .rd = rd, .tty = isatty(2)};
    rp.cur_cnt = n;
    rp.cur = idem_xcalloc(n + 1, sizeof(*rp.cur));
    for (size_t i = 0; i < n; i++)
        rp.cur[i] = (cursor_t){parts[i].start, INT64_MAX, parts[i].start};
    /* A dry run needs it too: where each replay would go depends on the
     * target's partition count. */
    rd_kafka_conf_t *kc =
        idem_kafka_writer_conf(conf, 1000000000, errstr, sizeof(errstr));
    if (kc) {
        rd_kafka_conf_set_opaque(kc, &rp);
        rd_kafka_conf_set_dr_msg_cb(kc, replay_dr_cb);
        rp.rk = idem_kafka_new(RD_KAFKA_PRODUCER, kc, "replay producer", errstr,
                               sizeof(errstr));
    }
    if (!rp.rk) {
        fprintf(stderr, "idemproc %s: %s\n", o->name, errstr);
        free(rp.cur);
        return IDEM_EXIT_FAIL;
    }
    int rc = scan(conf, o, rd, &rp.read_cnt, replay_cb, replay_skip, &rp,
                  errstr, sizeof(errstr));
    replay_settle(&rp);
    progress(&rp, 1);
    char fatal[512];
    if (rp.rk &&
        idem_kafka_fatal(rp.rk, "replay producer", fatal, sizeof(fatal))) {
        fprintf(stderr, "idemproc %s: %s\n", o->name, fatal);
        rc = -1;
    }
    if (rc < 0)
        fprintf(stderr, "idemproc %s: %s\n", o->name, errstr);
    printf("replay: read %ld, matched %ld, %s %ld, acked %ld, refused %ld, "
           "failed %ld\n",
           rp.read_cnt, rp.matched, o->dry_run ? "would send" : "sent", rp.sent,
           rp.acked, rp.refused, rp.failed);
    fflush(stdout);
    rd_kafka_destroy(rp.rk);
    for (size_t i = 0; i < rp.target_cnt; i++)
        free(rp.targets[i].topic);
    free(rp.targets);
    free(rp.slots);
    free(rp.cur);
    return rc < 0 || rp.failed || rp.commit_failed ? IDEM_EXIT_FAIL
                                                   : IDEM_EXIT_OK;
}

int idem_cmd_dlq(int argc, char **argv, char **envp)
{
    static const struct {
        const char *name, *full;
        dlq_verb_t verb;
    } verbs[] = {{"stats", "dlq stats", DLQ_STATS},
                 {"inspect", "dlq inspect", DLQ_INSPECT},
                 {"replay", "dlq replay", DLQ_REPLAY}};
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        idem_cmd_dlq_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? IDEM_EXIT_USAGE : IDEM_EXIT_OK;
    }
    dlq_opts_t o = {.limit = -1, .from_offset = -1, .max_bytes = 1024};
    idem_dlqfilter_init(&o.filter);
    size_t v = 0;
    while (v < 3 && strcmp(verbs[v].name, argv[1]))
        v++;
    if (v == 3) {
        const char *const names[] = {"stats", "inspect", "replay"};
        const char *hint = idem_closest_name(argv[1], names, 3);
        fprintf(stderr,
                "idemproc dlq: unknown subcommand \"%s\" (%s%s%sstats, "
                "inspect or replay)\n",
                argv[1], hint ? "did you mean \"" : "", hint ? hint : "",
                hint ? "\"? " : "");
        return IDEM_EXIT_USAGE;
    }
    o.verb = verbs[v].verb;
    o.name = verbs[v].full;
    /* argv[1] (the verb) becomes the argv[0] getopt skips. */
    char **args = idem_xcalloc((size_t)argc, sizeof(*args));
    args[0] = (char *)o.name;
    for (int i = 2; i < argc; i++)
        args[i - 1] = argv[i];
    idem_conf_t *conf;
    int rc = idem_cmdline_conf(argc - 1, args, envp, idem_cmd_dlq_usage,
                               dlq_options, NULL, dlq_opt, &o, &conf);
    free(args);
    if (rc >= 0)
        return rc;
    char errstr[512];
    idem_dlqread_t *rd = idem_dlqread_new(
        conf, o.verb == DLQ_REPLAY ? o.checkpoint : NULL, o.from_offset,
        READ_TIMEOUT_MS, errstr, sizeof(errstr));
    if (!rd) {
        fprintf(stderr, "idemproc %s: %s\n", o.name, errstr);
        idem_conf_destroy(conf);
        return IDEM_EXIT_FAIL;
    }
    if (o.verb == DLQ_STATS)
        rc = run_stats(conf, &o, rd);
    else if (o.verb == DLQ_INSPECT)
        rc = run_inspect(conf, &o, rd);
    else
        rc = run_replay(conf, &o, rd);
    idem_dlqread_destroy(rd);
    idem_conf_destroy(conf);
    return rc;
}
