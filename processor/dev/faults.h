/* faults: a schedule of faults for the embedded cluster (`idemproc broker
 * --faults FILE`): brokers down and up, added round-trip time, request
 * errors, partition leader and coordinator moves, each at a time offset. */
#ifndef IDEM_FAULTS_H
#define IDEM_FAULTS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dev/broker.h"

typedef enum {
    IDEM_FAULT_BROKER_DOWN, /* broker ID down */
    IDEM_FAULT_BROKER_UP,   /* broker ID up */
    IDEM_FAULT_RTT,         /* rtt ID MS: added round-trip time (0 clears) */
    IDEM_FAULT_ERROR,       /* error API ERR COUNT: next COUNT requests fail */
    IDEM_FAULT_LEADER,      /* leader TOPIC PARTITION ID */
    IDEM_FAULT_COORDINATOR, /* coordinator group|transaction KEY ID */
} idem_fault_kind_t;

typedef struct {
    int64_t at_ms; /* offset from the start of the schedule */
    idem_fault_kind_t kind;
    int32_t broker_id;   /* every kind but error */
    int32_t partition;   /* leader */
    int64_t value;       /* rtt: ms; error: count */
    int16_t api_key;     /* error */
    int error_code;      /* error: a rd_kafka_resp_err_t */
    char name[256];      /* leader: topic; coordinator: group/txn id */
    char coord_type[16]; /* coordinator: "group" or "transaction" */
    int line;            /* where it was written */
} idem_fault_t;

typedef struct {
    idem_fault_t *faults; /* sorted by at_ms (stable: file order on ties) */
    size_t cnt;
} idem_faults_t;

/* Parses a schedule from `text` (`len` bytes; `origin` names it in errors,
 * e.g. the file name). One fault a line: "+<N>(ms|s|m) <fault>"; '#'
 * starts a comment; blank lines are skipped. Returns a schedule the caller
 * frees with idem_faults_destroy, or NULL with "ORIGIN:LINE: ..." in
 * errstr. An empty schedule is valid. */
idem_faults_t *idem_faults_parse(const char *text, size_t len,
                                 const char *origin, char *errstr,
                                 size_t errstr_size);

/* Reads and parses a schedule from `path` ("-" = stdin). Same contract as
 * idem_faults_parse. */
idem_faults_t *idem_faults_load(const char *path, char *errstr,
                                size_t errstr_size);

void idem_faults_destroy(idem_faults_t *f); /* NULL is a no-op */

/* Checks the schedule against a cluster of broker_cnt brokers (broker ids
 * 1..broker_cnt). Returns 0, or -1 with "ORIGIN:LINE: ..." in errstr. */
int idem_faults_check(const idem_faults_t *f, const char *origin,
                      int broker_cnt, char *errstr, size_t errstr_size);

/* Applies one fault to the cluster now. Returns 0, or -1 with errstr
 * (e.g. an unknown topic for a leader move). */
int idem_fault_apply(idem_broker_t *broker, const idem_fault_t *fault,
                     char *errstr, size_t errstr_size);

/* One line describing the fault as written ("broker 2 down"). */
void idem_fault_format(const idem_fault_t *fault, char *buf, size_t size);

/* dev.fault.member.rss.file: the member's RSS as the file at path says
 * (its first integer, bytes), so a test can put a member over
 * member.memory.max and back without using the memory; -1 when the file
 * cannot be read or holds no integer. Read again at every call. */
int64_t idem_faults_member_rss(const char *path);

/* The text for `idemproc broker --help`. */
void idem_faults_print_help(FILE *out);

#endif
