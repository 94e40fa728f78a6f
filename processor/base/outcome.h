/* outcome: the names every module shares for what became of a record:
 * outcomes, duplicate kinds and dead-letter reasons (README.md). */
#ifndef IDEM_OUTCOME_H
#define IDEM_OUTCOME_H

typedef enum {
    IDEM_OUTCOME_PROCESSED = 0,
    IDEM_OUTCOME_DUPLICATE,
    IDEM_OUTCOME_DLQ,
    IDEM_OUTCOME_CNT
} idem_outcome_t;

typedef enum {
    IDEM_DUP_REDELIVERY = 0, /* same message_id seen before */
    IDEM_DUP_RESEND,         /* same idempotency_key, new message_id */
    IDEM_DUP_CNT
} idem_dup_kind_t;

/* Poison reasons: the value of the dlq.reason header. */
typedef enum {
    IDEM_REASON_TOO_LARGE = 0,
    IDEM_REASON_NOT_JSON,
    IDEM_REASON_NOT_OBJECT,
    IDEM_REASON_NO_IDENTITY,
    IDEM_REASON_INVALID_FIELD,
    IDEM_REASON_HANDLER_REJECTED,
    IDEM_REASON_MAX_RETRIES,
    IDEM_REASON_CNT
} idem_reason_t;

const char *idem_outcome2str(idem_outcome_t o);
const char *idem_dup_kind2str(idem_dup_kind_t k);
const char *idem_reason2str(idem_reason_t r);

/* Reverse lookups; return -1 for an unknown name. */
int idem_reason_parse(const char *name);
int idem_dup_kind_parse(const char *name);

#endif
