/* outboxrow: what the columns of an outbox row become in its Kafka
 * record (topic check, headers). */
#include "outbox/outboxrow.h"

#include <ctype.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Checked before producing, so a bad name is the row's error on any
 * broker: the embedded one takes any name, Kafka answers with a metadata
 * error. */
int idem_outboxrow_topic_check(const char *topic, char *errstr,
                               size_t errstr_size)
{
    size_t len = strlen(topic);
    if (len == 0) {
        snprintf(errstr, errstr_size, "topic: empty (NULL means outbox.topic)");
        return -1;
    }
    if (len > 249) {
        snprintf(errstr, errstr_size,
                 "topic: %zu characters, Kafka allows at most 249", len);
        return -1;
    }
    if (!strcmp(topic, ".") || !strcmp(topic, "..")) {
        snprintf(errstr, errstr_size, "topic: \"%.2s\" is not a valid name",
                 topic);
        return -1;
    }
    for (const char *c = topic; *c; c++)
        if (!isalnum((unsigned char)*c) && *c != '.' && *c != '_' &&
            *c != '-') {
            snprintf(errstr, errstr_size,
                     "topic: \"%.60s\" has a character Kafka does not allow "
                     "(only a-z A-Z 0-9 . _ -)",
                     topic);
            return -1;
        }
    return 0;
}

/* A header of the row's headers column named like an identity column
 * (message_id, idempotency_key): the column says what the identity is,
 * so the header may only repeat it, or stand in for a NULL column. *col
 * is the column's value (borrowed, NULL when the column is NULL) and
 * becomes the header's when it was NULL; the header itself is then sent
 * once, with the columns. 0, or -1 with errstr when they differ or the
 * header is not a string. */
static int identity_header_merge(const char *name, json_t *v, const char **col,
                                 char *errstr, size_t errstr_size)
{
    if (!json_is_string(v)) {
        snprintf(errstr, errstr_size,
                 "headers: %s must be a string, like the column", name);
        return -1;
    }
    const char *h = json_string_value(v);
    if (strlen(h) != json_string_length(v)) {
        snprintf(errstr, errstr_size, "headers: %s has a NUL byte", name);
        return -1;
    }
    if (!*col) {
        *col = h;
        return 0;
    }
    if (strcmp(*col, h)) {
        snprintf(errstr, errstr_size,
                 "headers: %s \"%.40s\" differs from the %s column "
                 "\"%.40s\" (drop the header or make them equal)",
                 name, h, name, *col);
        return -1;
    }
    return 0;
}

static const char *json_type2str(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
    case JSON_REAL:
        return "a number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    default:
        return "not an object";
    }
}

/* The identity headers are checked before anything is built, so a row
 * that fails costs no header list. */
rd_kafka_headers_t *idem_outboxrow_headers(const char *json, const char *mid,
                                           const char *ikey, char *errstr,
                                           size_t errstr_size)
{
    json_t *root = NULL;
    if (json) {
        json_error_t jerr;
        root = json_loads(json, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
        if (!root) {
            snprintf(errstr, errstr_size, "headers: not JSON: %s", jerr.text);
            return NULL;
        }
        if (json_is_null(root)) {
            json_decref(root);
            root = NULL;
        } else if (!json_is_object(root)) {
            snprintf(errstr, errstr_size,
                     "headers: %s, not a JSON object of name: value",
                     json_type2str(root));
            json_decref(root);
            return NULL;
        }
    }
    const char *name;
    json_t *v;
    json_object_foreach(root, name, v)
    {
        if ((!strcmp(name, "message_id") &&
             identity_header_merge(name, v, &mid, errstr, errstr_size)) ||
            (!strcmp(name, "idempotency_key") &&
             identity_header_merge(name, v, &ikey, errstr, errstr_size))) {
            json_decref(root);
            return NULL;
        }
    }
    if (!mid || !*mid) {
        snprintf(errstr, errstr_size,
                 "message_id: %s (the column needs DEFAULT "
                 "gen_random_uuid(), see config/sql/outbox.sql)",
                 mid ? "empty" : "NULL");
        json_decref(root);
        return NULL;
    }
    if (ikey && !*ikey) {
        snprintf(errstr, errstr_size,
                 "idempotency_key: empty (NULL means none: the identity is "
                 "then message_id)");
        json_decref(root);
        return NULL;
    }
    rd_kafka_headers_t *h = rd_kafka_headers_new(4);
    size_t name_len;
    json_object_keylen_foreach(root, name, name_len, v)
    {
        if (!strcmp(name, "message_id") || !strcmp(name, "idempotency_key"))
            continue; /* sent once, below */
        if (json_is_string(v)) {
            rd_kafka_header_add(h, name, (ssize_t)name_len,
                                json_string_value(v),
                                (ssize_t)json_string_length(v));
        } else if (json_is_null(v)) {
            rd_kafka_header_add(h, name, (ssize_t)name_len, NULL, 0);
        } else {
            char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
            rd_kafka_header_add(h, name, (ssize_t)name_len, text, -1);
            free(text);
        }
    }
    rd_kafka_header_add(h, "message_id", -1, mid, -1);
    if (ikey)
        rd_kafka_header_add(h, "idempotency_key", -1, ikey, -1);
    json_decref(root); /* after the adds: mid and ikey may be its strings */
    return h;
}

/* The length of the well-formed UTF-8 sequence at p (RFC 3629: no
 * overlong forms, no surrogates, at most U+10FFFF), 0 when there is none. */
static size_t utf8_seq_len(const unsigned char *p)
{
    if (p[0] < 0x80)
        return 1;
    size_t n;
    unsigned char lo = 0x80, hi = 0xbf; /* allowed range of p[1] */
    if (p[0] >= 0xc2 && p[0] <= 0xdf) {
        n = 2;
    } else if (p[0] >= 0xe0 && p[0] <= 0xef) {
        n = 3;
        if (p[0] == 0xe0)
            lo = 0xa0; /* overlong */
        else if (p[0] == 0xed)
            hi = 0x9f; /* surrogates */
    } else if (p[0] >= 0xf0 && p[0] <= 0xf4) {
        n = 4;
        if (p[0] == 0xf0)
            lo = 0x90; /* overlong */
        else if (p[0] == 0xf4)
            hi = 0x8f; /* above U+10FFFF */
    } else {
        return 0;
    }
    if (p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if (p[i] < 0x80 || p[i] > 0xbf)
            return 0; /* the NUL that ends s stops here too */
    return n;
}

char *idem_outboxrow_utf8_clean(char *s)
{
    unsigned char *p = (unsigned char *)s;
    while (*p) {
        size_t n = utf8_seq_len(p);
        if (n == 0) {
            *p++ = '?';
            continue;
        }
        p += n;
    }
    return s;
}
