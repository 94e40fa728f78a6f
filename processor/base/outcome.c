/* outcome: the names every module shares for what became of a record. */
#include "base/outcome.h"

#include <string.h>

static const char *outcome_names[IDEM_OUTCOME_CNT] = {"processed", "duplicate",
                                                      "dlq"};
static const char *dup_names[IDEM_DUP_CNT] = {"redelivery", "resend"};
static const char *reason_names[IDEM_REASON_CNT] = {
    "too-large",     "not-json",         "not-object", "no-identity",
    "invalid-field", "handler-rejected", "max-retries"};

const char *idem_outcome2str(idem_outcome_t o)
{
    return (unsigned)o < IDEM_OUTCOME_CNT ? outcome_names[o] : "?";
}

const char *idem_dup_kind2str(idem_dup_kind_t k)
{
    return (unsigned)k < IDEM_DUP_CNT ? dup_names[k] : "?";
}

const char *idem_reason2str(idem_reason_t r)
{
    return (unsigned)r < IDEM_REASON_CNT ? reason_names[r] : "?";
}

int idem_reason_parse(const char *name)
{
    for (int i = 0; i < IDEM_REASON_CNT; i++)
        if (!strcmp(reason_names[i], name))
            return i;
    return -1;
}

int idem_dup_kind_parse(const char *name)
{
    for (int i = 0; i < IDEM_DUP_CNT; i++)
        if (!strcmp(dup_names[i], name))
            return i;
    return -1;
}
