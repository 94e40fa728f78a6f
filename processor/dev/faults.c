/* faults: parses a fault schedule for the embedded cluster and applies its
 * faults through librdkafka's mock-cluster API. */
#include "dev/faults.h"

#include "base/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#define FAULT_ERROR_MAX  100000 /* most failing requests one line may ask */
#define FAULT_AT_MAX_MS  (7LL * 24 * 3600 * 1000) /* a week */
#define FAULT_RTT_MAX_MS 600000

/* Kafka protocol API keys (the wire protocol's numbers, which librdkafka
 * does not export by name). */
static const struct {
    const char *name;
    int16_t key;
} api_keys[] = {
    {"Produce", 0},
    {"Fetch", 1},
    {"ListOffsets", 2},
    {"Metadata", 3},
    {"OffsetCommit", 8},
    {"OffsetFetch", 9},
    {"FindCoordinator", 10},
    {"JoinGroup", 11},
    {"Heartbeat", 12},
    {"LeaveGroup", 13},
    {"SyncGroup", 14},
    {"DescribeGroups", 15},
    {"ListGroups", 16},
    {"ApiVersions", 18},
    {"CreateTopics", 19},
    {"DeleteTopics", 20},
    {"InitProducerId", 22},
    {"OffsetForLeaderEpoch", 23},
    {"AddPartitionsToTxn", 24},
    {"AddOffsetsToTxn", 25},
    {"EndTxn", 26},
    {"TxnOffsetCommit", 28},
};

static const char *api_name(int16_t key)
{
    for (size_t i = 0; i < sizeof(api_keys) / sizeof(api_keys[0]); i++)
        if (api_keys[i].key == key)
            return api_keys[i].name;
    return NULL;
}

/* Parses a non-negative integer (the whole token). Returns 0 or -1. */
static int parse_int(const char *s, int64_t max, int64_t *out)
{
    char *end;
    errno = 0;
    if (*s < '0' || *s > '9')
        return -1;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v > max)
        return -1;
    *out = v;
    return 0;
}

/* "<N>ms", "<N>s", "<N>m" (or a bare N, milliseconds). */
static int parse_duration(const char *s, int64_t max_ms, int64_t *ms)
{
    char num[32];
    size_t n = strspn(s, "0123456789");
    if (n == 0 || n >= sizeof(num))
        return -1;
    memcpy(num, s, n);
    num[n] = '\0';
    int64_t v;
    if (parse_int(num, max_ms, &v))
        return -1;
    const char *unit = s + n;
    int64_t mul = !*unit || !strcmp(unit, "ms") ? 1
                  : !strcmp(unit, "s")          ? 1000
                  : !strcmp(unit, "m")          ? 60000
                                                : -1;
    if (mul < 0 || v > max_ms / mul)
        return -1;
    *ms = v * mul;
    return 0;
}

static int parse_error_code(const char *s, int *code)
{
    int64_t v;
    if (!parse_int(s, 32767, &v)) {
        *code = (int)v;
        return v > 0 ? 0 : -1;
    }
    const struct rd_kafka_err_desc *descs;
    size_t cnt;
    rd_kafka_get_err_descs(&descs, &cnt);
    for (size_t i = 0; i < cnt; i++)
        if (descs[i].name && descs[i].code > 0 &&
            !strcasecmp(descs[i].name, s)) {
            *code = descs[i].code;
            return 0;
        }
    return -1;
}

static int parse_api(const char *s, int16_t *key)
{
    int64_t v;
    if (!parse_int(s, 32767, &v)) {
        *key = (int16_t)v;
        return 0;
    }
    for (size_t i = 0; i < sizeof(api_keys) / sizeof(api_keys[0]); i++)
        if (!strcasecmp(api_keys[i].name, s)) {
            *key = api_keys[i].key;
            return 0;
        }
    return -1;
}

static int parse_broker_id(const char *s, int32_t *id)
{
    int64_t v;
    if (parse_int(s, 32, &v) || v < 1)
        return -1;
    *id = (int32_t)v;
    return 0;
}

/* Parses the words of one line (after the time) into f. Returns 0, or -1
 * with the problem (without the origin) in errstr. */
static int parse_fault(char **w, int n, idem_fault_t *f, char *errstr,
                       size_t errstr_size)
{
    int64_t v;
    if (n == 3 && !strcmp(w[0], "broker") &&
        (!strcmp(w[2], "down") || !strcmp(w[2], "up"))) {
        f->kind = !strcmp(w[2], "down") ? IDEM_FAULT_BROKER_DOWN
                                        : IDEM_FAULT_BROKER_UP;
        if (parse_broker_id(w[1], &f->broker_id))
            goto bad_broker;
        return 0;
    }
    if (n == 3 && !strcmp(w[0], "rtt")) {
        f->kind = IDEM_FAULT_RTT;
        if (parse_broker_id(w[1], &f->broker_id))
            goto bad_broker;
        if (parse_duration(w[2], FAULT_RTT_MAX_MS, &f->value)) {
            snprintf(errstr, errstr_size,
                     "rtt: bad time \"%s\" (e.g. 200ms, 2s; at most 600s)",
                     w[2]);
            return -1;
        }
        return 0;
    }
    if (n == 4 && !strcmp(w[0], "error")) {
        f->kind = IDEM_FAULT_ERROR;
        if (parse_api(w[1], &f->api_key)) {
            snprintf(errstr, errstr_size,
                     "error: unknown API \"%s\" (e.g. Produce, Fetch, "
                     "OffsetCommit, JoinGroup, or its number)",
                     w[1]);
            return -1;
        }
        if (parse_error_code(w[2], &f->error_code)) {
            snprintf(errstr, errstr_size,
                     "error: unknown error \"%s\" (a Kafka error name such "
                     "as NOT_LEADER_FOR_PARTITION, or its number)",
                     w[2]);
            return -1;
        }
        if (parse_int(w[3], FAULT_ERROR_MAX, &f->value) || f->value < 1) {
            snprintf(errstr, errstr_size, "error: bad count \"%s\" (1..%d)",
                     w[3], FAULT_ERROR_MAX);
            return -1;
        }
        return 0;
    }
    if (n == 4 && !strcmp(w[0], "leader")) {
        f->kind = IDEM_FAULT_LEADER;
        if (strlen(w[1]) >= sizeof(f->name)) {
            snprintf(errstr, errstr_size, "leader: topic name too long");
            return -1;
        }
        snprintf(f->name, sizeof(f->name), "%s", w[1]);
        if (parse_int(w[2], INT32_MAX, &v)) {
            snprintf(errstr, errstr_size, "leader: bad partition \"%s\"", w[2]);
            return -1;
        }
        f->partition = (int32_t)v;
        if (parse_broker_id(w[3], &f->broker_id)) {
            w[1] = w[3]; /* for the message */
            goto bad_broker;
        }
        return 0;
    }
    if (n == 4 && !strcmp(w[0], "coordinator")) {
        f->kind = IDEM_FAULT_COORDINATOR;
        if (strcmp(w[1], "group") && strcmp(w[1], "transaction")) {
            snprintf(errstr, errstr_size,
                     "coordinator: \"%s\" is not group or transaction", w[1]);
            return -1;
        }
        snprintf(f->coord_type, sizeof(f->coord_type), "%s", w[1]);
        if (strlen(w[2]) >= sizeof(f->name)) {
            snprintf(errstr, errstr_size, "coordinator: key too long");
            return -1;
        }
        snprintf(f->name, sizeof(f->name), "%s", w[2]);
        if (parse_broker_id(w[3], &f->broker_id)) {
            w[1] = w[3];
            goto bad_broker;
        }
        return 0;
    }
    snprintf(errstr, errstr_size,
             "unknown fault \"%s\" (broker ID down|up, rtt ID TIME, error API "
             "ERROR COUNT, leader TOPIC PARTITION ID, coordinator "
             "group|transaction KEY ID)",
             n ? w[0] : "");
    return -1;
bad_broker:
    snprintf(errstr, errstr_size, "bad broker id \"%s\" (1..32)", w[1]);
    return -1;
}

static int fault_cmp(const void *a, const void *b)
{
    const idem_fault_t *x = a, *y = b;
    if (x->at_ms != y->at_ms)
        return x->at_ms < y->at_ms ? -1 : 1;
    return x->line - y->line; /* stable: the file's order */
}

idem_faults_t *idem_faults_parse(const char *text, size_t len,
                                 const char *origin, char *errstr,
                                 size_t errstr_size)
{
    idem_faults_t *f = idem_xcalloc(1, sizeof(*f));
    size_t cap = 0;
    int line_no = 0;
    for (size_t pos = 0; pos < len;) {
        const char *nl = memchr(text + pos, '\n', len - pos);
        size_t ll = nl ? (size_t)(nl - (text + pos)) : len - pos;
        line_no++;
        char line[1024];
        if (ll >= sizeof(line)) {
            snprintf(errstr, errstr_size, "%s:%d: line longer than %zu bytes",
                     origin, line_no, sizeof(line) - 1);
            goto fail;
        }
        memcpy(line, text + pos, ll);
        line[ll] = '\0';
        pos += ll + (nl ? 1 : 0);
        if (memchr(line, '\0', ll)) {
            snprintf(errstr, errstr_size, "%s:%d: NUL byte in line", origin,
                     line_no);
            goto fail;
        }
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        char *w[8];
        int n = 0;
        for (char *save = NULL, *tok = strtok_r(line, " \t\r", &save); tok;
             tok = strtok_r(NULL, " \t\r", &save)) {
            if (n == 8) {
                snprintf(errstr, errstr_size, "%s:%d: too many words", origin,
                         line_no);
                goto fail;
            }
            w[n++] = tok;
        }
        if (n == 0)
            continue;
        idem_fault_t fault;
        memset(&fault, 0, sizeof(fault));
        fault.line = line_no;
        if (w[0][0] != '+' ||
            parse_duration(w[0] + 1, FAULT_AT_MAX_MS, &fault.at_ms)) {
            snprintf(errstr, errstr_size,
                     "%s:%d: \"%s\" is not a time offset (e.g. +5s, +1500ms, "
                     "+2m)",
                     origin, line_no, w[0]);
            goto fail;
        }
        char err[512];
        if (parse_fault(w + 1, n - 1, &fault, err, sizeof(err))) {
            snprintf(errstr, errstr_size, "%s:%d: %s", origin, line_no, err);
            goto fail;
        }
        if (f->cnt == cap) {
            cap = cap ? cap * 2 : 16;
            f->faults = idem_xrealloc(f->faults, cap * sizeof(*f->faults));
        }
        f->faults[f->cnt++] = fault;
    }
    if (f->cnt)
        qsort(f->faults, f->cnt, sizeof(*f->faults), fault_cmp);
    return f;
fail:
    idem_faults_destroy(f);
    return NULL;
}

idem_faults_t *idem_faults_load(const char *path, char *errstr,
                                size_t errstr_size)
{
    int std = !strcmp(path, "-");
    FILE *in = std ? stdin : fopen(path, "rb");
    if (!in) {
        snprintf(errstr, errstr_size, "%s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, len = 0;
    char *buf = idem_xmalloc(cap);
    size_t got;
    while ((got = fread(buf + len, 1, cap - len, in)) > 0) {
        len += got;
        if (len == cap) {
            if (cap >= (size_t)16 << 20) {
                snprintf(errstr, errstr_size, "%s: larger than 16 MiB", path);
                free(buf);
                if (!std)
                    fclose(in);
                return NULL;
            }
            cap *= 2;
            buf = idem_xrealloc(buf, cap);
        }
    }
    int rerr = ferror(in);
    if (!std)
        fclose(in);
    if (rerr) {
        snprintf(errstr, errstr_size, "%s: read error", path);
        free(buf);
        return NULL;
    }
    idem_faults_t *f = idem_faults_parse(buf, len, std ? "<stdin>" : path,
                                         errstr, errstr_size);
    free(buf);
    return f;
}

void idem_faults_destroy(idem_faults_t *f)
{
    if (!f)
        return;
    free(f->faults);
    free(f);
}

int idem_faults_check(const idem_faults_t *f, const char *origin,
                      int broker_cnt, char *errstr, size_t errstr_size)
{
    for (size_t i = 0; i < f->cnt; i++) {
        const idem_fault_t *x = &f->faults[i];
        if (x->kind != IDEM_FAULT_ERROR && x->broker_id > broker_cnt) {
            snprintf(errstr, errstr_size,
                     "%s:%d: broker %d: the cluster has brokers 1..%d "
                     "(--brokers)",
                     origin, x->line, (int)x->broker_id, broker_cnt);
            return -1;
        }
    }
    return 0;
}

int idem_fault_apply(idem_broker_t *broker, const idem_fault_t *x, char *errstr,
                     size_t errstr_size)
{
    rd_kafka_mock_cluster_t *mc = idem_broker_mock(broker);
    rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR_NO_ERROR;
    switch (x->kind) {
    case IDEM_FAULT_BROKER_DOWN:
        err = rd_kafka_mock_broker_set_down(mc, x->broker_id);
        break;
    case IDEM_FAULT_BROKER_UP:
        err = rd_kafka_mock_broker_set_up(mc, x->broker_id);
        break;
    case IDEM_FAULT_RTT:
        err = rd_kafka_mock_broker_set_rtt(mc, x->broker_id, (int)x->value);
        break;
    case IDEM_FAULT_ERROR: {
        rd_kafka_resp_err_t *errs =
            idem_xmalloc((size_t)x->value * sizeof(*errs));
        for (int64_t i = 0; i < x->value; i++)
            errs[i] = (rd_kafka_resp_err_t)x->error_code;
        rd_kafka_mock_push_request_errors_array(mc, x->api_key,
                                                (size_t)x->value, errs);
        free(errs);
        break;
    }
    case IDEM_FAULT_LEADER:
        err = rd_kafka_mock_partition_set_leader(mc, x->name, x->partition,
                                                 x->broker_id);
        break;
    case IDEM_FAULT_COORDINATOR:
        err = rd_kafka_mock_coordinator_set(mc, x->coord_type, x->name,
                                            x->broker_id);
        break;
    }
    if (err) {
        char what[512];
        idem_fault_format(x, what, sizeof(what));
        snprintf(errstr, errstr_size, "line %d: %s: %s", x->line, what,
                 rd_kafka_err2str(err));
        return -1;
    }
    return 0;
}

void idem_fault_format(const idem_fault_t *x, char *buf, size_t size)
{
    switch (x->kind) {
    case IDEM_FAULT_BROKER_DOWN:
    case IDEM_FAULT_BROKER_UP:
        snprintf(buf, size, "broker %d %s", (int)x->broker_id,
                 x->kind == IDEM_FAULT_BROKER_DOWN ? "down" : "up");
        break;
    case IDEM_FAULT_RTT:
        snprintf(buf, size, "rtt %d %lldms", (int)x->broker_id,
                 (long long)x->value);
        break;
    case IDEM_FAULT_ERROR: {
        const char *api = api_name(x->api_key);
        char num[16];
        snprintf(num, sizeof(num), "%d", (int)x->api_key);
        snprintf(buf, size, "error %s %s %lld", api ? api : num,
                 rd_kafka_err2name((rd_kafka_resp_err_t)x->error_code),
                 (long long)x->value);
        break;
    }
    case IDEM_FAULT_LEADER:
        snprintf(buf, size, "leader %s %d %d", x->name, (int)x->partition,
                 (int)x->broker_id);
        break;
    case IDEM_FAULT_COORDINATOR:
        snprintf(buf, size, "coordinator %s %s %d", x->coord_type, x->name,
                 (int)x->broker_id);
        break;
    }
}

void idem_faults_print_help(FILE *out)
{
    fprintf(
        out,
        "fault schedule (--faults FILE, or - for stdin):\n"
        "  one fault a line, \"+TIME FAULT\"; TIME is the offset from the "
        "broker's\n"
        "  start (+500ms, +5s, +2m; a bare number is ms); '#' starts a "
        "comment.\n"
        "  Lines may come in any order; each fault is applied once, at its "
        "time,\n"
        "  and logged on stderr. Faults:\n"
        "    broker ID down|up          stop / resume accepting "
        "connections\n"
        "                               (ID 1..--brokers)\n"
        "    rtt ID TIME                add TIME to every response of the "
        "broker\n"
        "                               (0 clears)\n"
        "    error API ERROR COUNT      the next COUNT requests of API (e.g. "
        "Produce,\n"
        "                               Fetch, OffsetCommit, JoinGroup, "
        "Heartbeat,\n"
        "                               SyncGroup, Metadata, or a number) "
        "fail with\n"
        "                               the Kafka error ERROR (e.g.\n"
        "                               NOT_LEADER_FOR_PARTITION, or a "
        "number)\n"
        "    leader TOPIC PARTITION ID  move the partition's leader to "
        "broker ID\n"
        "    coordinator group|transaction KEY ID\n"
        "                               move the coordinator of group (or "
        "transactional\n"
        "                               id) KEY to broker ID\n"
        "  e.g.\n"
        "    +3s rtt 1 200ms\n"
        "    +4s error Produce NOT_LEADER_FOR_PARTITION 5\n"
        "    +5s broker 2 down\n"
        "    +8s broker 2 up\n");
}

int64_t idem_faults_member_rss(const char *path)
{
    FILE *fp = fopen(path, "r");
    long long v = -1;
    if (!fp || fscanf(fp, "%lld", &v) != 1)
        v = -1;
    if (fp)
        fclose(fp);
    return v;
}
