/* test_property: random interleavings of produce, duplicate (redelivery and
 * resend), poison, member SIGKILL, rebalance and Redis restart, generated
 * from a seed as a few hundred short cases. Each case has its own
 * identities and users, so its oracle (the ledger it must leave, the
 * records it must dead-letter) is checked on its own; all cases run on one
 * real stack (broker, Redis, members) one after the other, and the events
 * of a case hit whatever records of it and of earlier cases are in flight.
 * Starting a stack per case would cost ~10 s each (group formation); this
 * keeps the whole suite under two minutes (docs/testing.md). */
#include "harness.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/util.h"

TestSuite(property, .fini = th_stack_cleanup);

#define CASES          250
#define MAX_STEPS      12
#define USERS_PER_CASE 3
#define MEMBERS        3

typedef enum {
    ST_PAY,       /* a new payment */
    ST_REDELIVER, /* the very same record again (same message_id) */
    ST_RESEND,    /* an earlier payment again with a new message_id */
    ST_POISON,    /* one of the five reasons, by arg */
    ST_KILL,      /* SIGKILL a member, restart it */
    ST_REBALANCE, /* the third member joins or leaves */
    ST_REDIS,     /* Redis restarts */
} step_kind_t;

static const char *step_names[] = {"pay",          "redeliver", "resend",
                                   "poison",       "kill",      "rebalance",
                                   "redis-restart"};

typedef struct {
    step_kind_t kind;
    int arg;
} step_t;

typedef struct rec_s {
    int case_id;
    int poison;
    char *value;
    size_t len;
    char mid[64], ikey[64]; /* headers; "" = none */
    int32_t partition;      /* from the delivery report */
    int64_t offset;
} rec_t;

typedef struct {
    uint64_t seed;
    step_t steps[MAX_STEPS];
    int nsteps;
    int64_t want[USERS_PER_CASE]; /* oracle: each user's balance, cents */
    int keys;                     /* distinct idempotency keys applied */
    rec_t *recs[MAX_STEPS];
    int nrecs;
} case_t;

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void case_generate(case_t *c, uint64_t seed)
{
    memset(c, 0, sizeof(*c));
    c->seed = seed;
    uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 1;
    c->nsteps = 3 + (int)(rng_next(&s) % (MAX_STEPS - 2));
    for (int i = 0; i < c->nsteps; i++) {
        unsigned r = (unsigned)(rng_next(&s) % 1000);
        step_t *st = &c->steps[i];
        st->kind = r < 430   ? ST_PAY
                   : r < 580 ? ST_REDELIVER
                   : r < 700 ? ST_RESEND
                   : r < 960 ? ST_POISON
                   : r < 972 ? ST_KILL
                   : r < 984 ? ST_REBALANCE
                   : r < 991 ? ST_REDIS
                             : ST_PAY;
        st->arg = (int)(rng_next(&s) % 1000);
    }
}

/* ------------------------------------------------------------ producing */

static void dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    (void)rk;
    (void)opaque;
    rec_t *r = m->_private;
    if (m->err) {
        r->partition = -1;
        return;
    }
    r->partition = m->partition;
    r->offset = m->offset;
}

static rd_kafka_t *producer_new(const char *bootstrap)
{
    char err[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap, err, sizeof(err));
    rd_kafka_conf_set(conf, "enable.idempotence", "true", err, sizeof(err));
    rd_kafka_conf_set(conf, "linger.ms", "5", err, sizeof(err));
    rd_kafka_conf_set(conf, "message.timeout.ms", "120000", err, sizeof(err));
    rd_kafka_conf_set_dr_msg_cb(conf, dr_cb);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
    cr_assert(rk, "%s", err);
    return rk;
}

static void send_rec(rd_kafka_t *rk, rec_t *r)
{
    rd_kafka_headers_t *h = rd_kafka_headers_new(2);
    if (r->mid[0])
        rd_kafka_header_add(h, "message_id", -1, r->mid, -1);
    if (r->ikey[0])
        rd_kafka_header_add(h, "idempotency_key", -1, r->ikey, -1);
    r->partition = -2; /* no report yet */
    char key[32];
    snprintf(key, sizeof(key), "c%d", r->case_id);
    rd_kafka_resp_err_t err = rd_kafka_producev(
        rk, RD_KAFKA_V_TOPIC("payments"), RD_KAFKA_V_KEY(key, strlen(key)),
        RD_KAFKA_V_VALUE(r->value, r->len), RD_KAFKA_V_HEADERS(h),
        RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_OPAQUE(r),
        RD_KAFKA_V_END);
    cr_assert_eq(err, 0, "produce: %s", rd_kafka_err2str(err));
    rd_kafka_poll(rk, 0);
}

static rec_t *rec_new(int case_id, int poison, char *value, const char *mid,
                      const char *ikey)
{
    rec_t *r = calloc(1, sizeof(*r));
    r->case_id = case_id;
    r->poison = poison;
    r->value = value;
    r->len = strlen(value);
    snprintf(r->mid, sizeof(r->mid), "%s", mid ? mid : "");
    snprintf(r->ikey, sizeof(r->ikey), "%s", ikey ? ikey : "");
    return r;
}

static rec_t *rec_copy(const rec_t *o, const char *new_mid)
{
    rec_t *r = calloc(1, sizeof(*r));
    *r = *o;
    r->value = strdup(o->value);
    if (new_mid) { /* a resend: the value carries the message_id too */
        char *v = r->value;
        char *at = strstr(v, o->mid);
        if (at) {
            size_t ol = strlen(o->mid), nl = strlen(new_mid);
            char *nv = malloc(strlen(v) - ol + nl + 1);
            memcpy(nv, v, (size_t)(at - v));
            memcpy(nv + (at - v), new_mid, nl);
            strcpy(nv + (at - v) + nl, at + ol);
            free(v);
            r->value = nv;
        }
        snprintf(r->mid, sizeof(r->mid), "%s", new_mid);
    }
    r->len = strlen(r->value);
    return r;
}

/* A poison record of case `c`, reason by `kind` (0..4). */
static char *poison_value(int c, int n, int kind)
{
    char *v = malloc(6000);
    switch (kind) {
    case 0: { /* too-large: above message.max.bytes=4096 */
        int l = snprintf(v, 6000,
                         "{\"message_id\":\"p%d-x%d\",\"user_id\":\"p%d-u0\","
                         "\"amount\":1,\"currency\":\"EUR\",\"pad\":\"",
                         c, n, c);
        memset(v + l, 'x', 5000);
        strcpy(v + l + 5000, "\"}");
        break;
    }
    case 1:
        snprintf(v, 6000, "p%d-x%d {not json", c, n);
        break;
    case 2:
        snprintf(v, 6000, "[\"p%d-x%d\"]", c, n);
        break;
    case 3:
        snprintf(v, 6000,
                 "{\"user_id\":\"p%d-u0\",\"amount\":1,"
                 "\"currency\":\"EUR\"}",
                 c);
        break;
    default:
        snprintf(v, 6000,
                 "{\"message_id\":\"p%d-x%d\",\"user_id\":\"p%d-u0\","
                 "\"amount\":1.005,\"currency\":\"EUR\"}",
                 c, n, c);
        break;
    }
    return v;
}

/* ------------------------------------------------------------- checking */

/* Reads the DLQ from the start and adds "partition:offset" of every
 * dead letter's original to `seen`. */
static void dlq_collect(rd_kafka_t *consumer, json_t *seen)
{
    rd_kafka_message_t *m;
    while ((m = rd_kafka_consumer_poll(consumer, 100))) {
        rd_kafka_headers_t *h = NULL;
        const void *p = NULL, *o = NULL;
        size_t pl = 0, ol = 0;
        if (!m->err && !rd_kafka_message_headers(m, &h) &&
            !rd_kafka_header_get_last(h, "dlq.original.partition", &p, &pl) &&
            !rd_kafka_header_get_last(h, "dlq.original.offset", &o, &ol)) {
            char key[64];
            snprintf(key, sizeof(key), "%.*s:%.*s", (int)pl, (const char *)p,
                     (int)ol, (const char *)o);
            json_object_set_new(seen, key, json_true());
        }
        rd_kafka_message_destroy(m);
    }
}

static rd_kafka_t *dlq_consumer_new(const char *bootstrap)
{
    char err[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap, err, sizeof(err));
    rd_kafka_conf_set(conf, "group.id", "property-dlq-reader", err,
                      sizeof(err));
    rd_kafka_conf_set(conf, "auto.offset.reset", "earliest", err, sizeof(err));
    rd_kafka_conf_set(conf, "fetch.wait.max.ms", "10", err, sizeof(err));
    rd_kafka_conf_set(conf, "enable.auto.commit", "false", err, sizeof(err));
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof(err));
    cr_assert(rk, "%s", err);
    rd_kafka_poll_set_consumer(rk);
    rd_kafka_topic_partition_list_t *tp = rd_kafka_topic_partition_list_new(2);
    for (int32_t p = 0; p < 2; p++)
        rd_kafka_topic_partition_list_add(tp, "payments.dlq", p)->offset =
            RD_KAFKA_OFFSET_BEGINNING;
    rd_kafka_assign(rk, tp);
    rd_kafka_topic_partition_list_destroy(tp);
    return rk;
}

/* The ledger in Redis as {user: cents}. */
static json_t *ledger_read(th_redis_t *r)
{
    const char *args[] = {"HGETALL", "idemproc:ledger:EUR", NULL};
    char *out = th_redis_cli(r, args);
    json_t *l = json_object();
    char *save = NULL, *user = NULL;
    for (char *tok = out ? strtok_r(out, "\n", &save) : NULL; tok;
         tok = strtok_r(NULL, "\n", &save)) {
        if (!user) {
            user = tok;
        } else {
            json_object_set_new(l, user, json_integer(atoll(tok)));
            user = NULL;
        }
    }
    free(out);
    return l;
}

/* Does case c hold in the ledger and the DLQ? Fills why when not. */
static int case_holds(const case_t *c, int id, json_t *ledger, json_t *dlq,
                      char *why, size_t size)
{
    for (int u = 0; u < USERS_PER_CASE; u++) {
        char user[32];
        snprintf(user, sizeof(user), "p%d-u%d", id, u);
        json_t *v = json_object_get(ledger, user);
        int64_t got = v ? json_integer_value(v) : 0;
        if (got != c->want[u]) {
            snprintf(why, size, "%s: balance %lld, oracle %lld", user,
                     (long long)got, (long long)c->want[u]);
            return 0;
        }
    }
    for (int i = 0; i < c->nrecs; i++) {
        const rec_t *r = c->recs[i];
        char key[64];
        snprintf(key, sizeof(key), "%d:%lld", (int)r->partition,
                 (long long)r->offset);
        int in_dlq = json_object_get(dlq, key) != NULL;
        if (in_dlq != r->poison) {
            snprintf(why, size, "record %d (%s) %s", i, key,
                     r->poison ? "not dead-lettered" : "dead-lettered");
            return 0;
        }
    }
    return 1;
}

static void case_describe(const case_t *c, char *buf, size_t size)
{
    size_t o =
        (size_t)snprintf(buf, size, "seed %llu:", (unsigned long long)c->seed);
    for (int i = 0; i < c->nsteps && o < size; i++)
        o += (size_t)snprintf(buf + o, size - o, " %s",
                              step_names[c->steps[i].kind]);
}

/* ----------------------------------------------------------------- test */

Test(property, random_interleavings_match_the_oracle, .timeout = 240)
{
    uint64_t base = (uint64_t)time(NULL);
    const char *env = getenv("PROPERTY_SEED");
    if (env)
        base = strtoull(env, NULL, 10);
    fprintf(stderr, "property: PROPERTY_SEED=%llu\n", (unsigned long long)base);
    th_stack_t s;
    cr_assert_eq(th_stack_start(&s, 8, NULL), 0);
    pid_t member[MEMBERS] = {0};
    const char *names[MEMBERS] = {"m1", "m2", "m3"};
    for (int i = 0; i < 2; i++)
        member[i] = th_stack_member(&s, names[i], NULL);
    rd_kafka_t *prod = producer_new(s.broker.bootstrap);

    case_t *cases = calloc(CASES, sizeof(*cases));
    int kills = 0, rebalances = 0, redis_restarts = 0, records = 0;
    int64_t t0 = idem_now_ms();
    for (int c = 0; c < CASES; c++) {
        case_t *cs = &cases[c];
        case_generate(cs, base + (uint64_t)c);
        int pays = 0, xn = 0;
        for (int i = 0; i < cs->nsteps; i++) {
            step_t *st = &cs->steps[i];
            rec_t *r = NULL;
            char mid[64], ikey[64];
            if ((st->kind == ST_REDELIVER && cs->nrecs == 0) ||
                (st->kind == ST_RESEND && pays == 0))
                st->kind = ST_PAY;
            switch (st->kind) {
            case ST_PAY: {
                int user = st->arg % USERS_PER_CASE;
                int cents = 1 + st->arg * 7;
                snprintf(mid, sizeof(mid), "p%d-m%d", c, i);
                snprintf(ikey, sizeof(ikey), "p%d-k%d", c, i);
                char *v = malloc(256);
                /* identities in the value, or (every third) only in the
                 * headers */
                if (st->arg % 3)
                    snprintf(v, 256,
                             "{\"message_id\":\"%s\",\"idempotency_key\":"
                             "\"%s\",\"user_id\":\"p%d-u%d\",\"amount\":%d."
                             "%02d,\"currency\":\"EUR\"}",
                             mid, ikey, c, user, cents / 100, cents % 100);
                else
                    snprintf(v, 256,
                             "{\"user_id\":\"p%d-u%d\",\"amount\":%d.%02d,"
                             "\"currency\":\"EUR\",\"note\":\"%s\"}",
                             c, user, cents / 100, cents % 100, mid);
                r = rec_new(c, 0, v, mid, ikey);
                cs->want[user] += cents;
                cs->keys++;
                pays++;
                break;
            }
            case ST_REDELIVER:
                r = rec_copy(cs->recs[st->arg % cs->nrecs], NULL);
                break;
            case ST_RESEND: {
                /* the n-th earlier payment (not poison) */
                int n = st->arg % pays;
                for (int j = 0; j < cs->nrecs; j++) {
                    if (cs->recs[j]->poison ||
                        strncmp(cs->recs[j]->mid, "p", 1))
                        continue;
                    if (n-- == 0) {
                        snprintf(mid, sizeof(mid), "p%d-r%d", c, i);
                        r = rec_copy(cs->recs[j], mid);
                        break;
                    }
                }
                break;
            }
            case ST_POISON:
                r = rec_new(c, 1, poison_value(c, xn++, st->arg % 5), NULL,
                            NULL);
                break;
            case ST_KILL: {
                int m = st->arg % MEMBERS;
                if (!member[m])
                    m = 0;
                kill(member[m], SIGKILL);
                th_wait(member[m], 10000);
                member[m] = th_stack_member(&s, names[m], NULL);
                kills++;
                break;
            }
            case ST_REBALANCE:
                if (member[2]) {
                    th_stop(member[2], 15000);
                    member[2] = 0;
                } else {
                    member[2] = th_stack_member(&s, names[2], NULL);
                }
                rebalances++;
                break;
            case ST_REDIS:
                cr_assert_eq(th_redis_kill(&s.redis), 0);
                cr_assert_eq(th_redis_restart(&s.redis), 0);
                redis_restarts++;
                break;
            }
            if (r) {
                cs->recs[cs->nrecs++] = r;
                send_rec(prod, r);
                records++;
            }
            usleep(15000);
        }
    }
    cr_assert_eq(rd_kafka_flush(prod, 120000), 0, "produce did not finish");
    int64_t t_sent = idem_now_ms();
    for (int c = 0; c < CASES; c++)
        for (int i = 0; i < cases[c].nrecs; i++)
            cr_assert_geq(cases[c].recs[i]->partition, 0,
                          "case %d record %d not delivered", c, i);

    /* Converged: every case holds. */
    rd_kafka_t *dlq_reader = dlq_consumer_new(s.broker.bootstrap);
    json_t *dlq = json_object();
    json_t *ledger = NULL;
    int failing = CASES, first_bad = -1;
    char why[256] = "";
    for (int64_t deadline = idem_now_ms() + 120000;
         failing && idem_now_ms() < deadline;) {
        usleep(500000);
        dlq_collect(dlq_reader, dlq);
        json_decref(ledger);
        ledger = ledger_read(&s.redis);
        failing = 0;
        first_bad = -1;
        for (int c = 0; c < CASES; c++)
            if (!case_holds(&cases[c], c, ledger, dlq, why, sizeof(why))) {
                if (first_bad < 0)
                    first_bad = c;
                failing++;
            }
    }
    int64_t t_done = idem_now_ms();
    if (failing) {
        char desc[512];
        case_holds(&cases[first_bad], first_bad, ledger, dlq, why, sizeof(why));
        case_describe(&cases[first_bad], desc, sizeof(desc));
        cr_assert_fail(
            "%d of %d cases fail (PROPERTY_SEED=%llu); case %d (%s): %s",
            failing, CASES, (unsigned long long)base, first_bad, desc, why);
    }
    /* Nothing beyond the oracle: no other user, no other dead letter, and
     * the applied count is the number of distinct keys. */
    int keys = 0, poison = 0, users = 0;
    for (int c = 0; c < CASES; c++) {
        keys += cases[c].keys;
        for (int u = 0; u < USERS_PER_CASE; u++)
            users += cases[c].want[u] != 0;
        for (int i = 0; i < cases[c].nrecs; i++)
            poison += cases[c].recs[i]->poison;
    }
    cr_expect_eq(json_object_size(dlq), (size_t)poison);
    cr_expect_eq(json_object_size(ledger), (size_t)users);
    cr_expect_eq(th_stack_applied(&s), keys);
    fprintf(stderr,
            "property: %d cases, %d records (%d poison, %d keys), %d kills, "
            "%d rebalances, %d redis restarts; sent in %lld ms, converged "
            "%lld ms later\n",
            CASES, records, poison, keys, kills, rebalances, redis_restarts,
            (long long)(t_sent - t0), (long long)(t_done - t_sent));

    json_decref(ledger);
    json_decref(dlq);
    rd_kafka_consumer_close(dlq_reader);
    rd_kafka_destroy(dlq_reader);
    rd_kafka_destroy(prod);
    for (int m = 0; m < MEMBERS; m++)
        if (member[m])
            th_stop(member[m], 15000);
    for (int c = 0; c < CASES; c++)
        for (int i = 0; i < cases[c].nrecs; i++) {
            free(cases[c].recs[i]->value);
            free(cases[c].recs[i]);
        }
    free(cases);
    th_stack_stop(&s);
}
