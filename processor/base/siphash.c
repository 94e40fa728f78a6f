/* siphash: SipHash-2-4, written from the paper ("SipHash: a fast
 * short-input PRF", Aumasson and Bernstein, 2012) and checked against its
 * reference vectors in tests/unit/test_siphash.c. */
#include "base/siphash.h"

/* The four 64-bit words of the state. */
typedef struct {
    uint64_t v0, v1, v2, v3;
} sip_state_t;

static uint64_t rotl64(uint64_t x, int b)
{
    return (x << b) | (x >> (64 - b));
}

/* Reads 8 bytes little-endian whatever the host's byte order. */
static uint64_t load_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static void store_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void sip_round(sip_state_t *s)
{
    s->v0 += s->v1;
    s->v1 = rotl64(s->v1, 13);
    s->v1 ^= s->v0;
    s->v0 = rotl64(s->v0, 32);
    s->v2 += s->v3;
    s->v3 = rotl64(s->v3, 16);
    s->v3 ^= s->v2;
    s->v0 += s->v3;
    s->v3 = rotl64(s->v3, 21);
    s->v3 ^= s->v0;
    s->v2 += s->v1;
    s->v1 = rotl64(s->v1, 17);
    s->v1 ^= s->v2;
    s->v2 = rotl64(s->v2, 32);
}

static void sip_compress(sip_state_t *s, uint64_t m)
{
    s->v3 ^= m;
    sip_round(s); /* c = 2 rounds per message word */
    sip_round(s);
    s->v0 ^= m;
}

static void sip_final_rounds(sip_state_t *s)
{
    for (int i = 0; i < 4; i++) /* d = 4 finalisation rounds */
        sip_round(s);
}

/* Initialises the state with the key ("somepseudorandomlygeneratedbytes"
 * as the constants), absorbs every message word including the last one
 * (the remaining bytes with the length's low byte on top). wide selects
 * the 128-bit variant's extra 0xee in v1. */
static void sip_absorb(sip_state_t *s, const uint8_t key[16], const void *in,
                       size_t len, int wide)
{
    uint64_t k0 = load_le64(key), k1 = load_le64(key + 8);
    s->v0 = k0 ^ UINT64_C(0x736f6d6570736575);
    s->v1 = k1 ^ UINT64_C(0x646f72616e646f6d);
    s->v2 = k0 ^ UINT64_C(0x6c7967656e657261);
    s->v3 = k1 ^ UINT64_C(0x7465646279746573);
    if (wide)
        s->v1 ^= 0xee;

    const uint8_t *p = in;
    size_t whole = len - len % 8;
    for (size_t i = 0; i < whole; i += 8)
        sip_compress(s, load_le64(p + i));
    uint64_t last = (uint64_t)(len & 0xff) << 56;
    for (size_t i = 0; i < len % 8; i++)
        last |= (uint64_t)p[whole + i] << (8 * i);
    sip_compress(s, last);
}

uint64_t idem_siphash24(const uint8_t key[16], const void *in, size_t len)
{
    sip_state_t s;
    sip_absorb(&s, key, in, len, 0);
    s.v2 ^= 0xff;
    sip_final_rounds(&s);
    return s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
}

void idem_siphash24_128(const uint8_t key[16], const void *in, size_t len,
                        uint8_t out[16])
{
    sip_state_t s;
    sip_absorb(&s, key, in, len, 1);
    s.v2 ^= 0xee;
    sip_final_rounds(&s);
    store_le64(out, s.v0 ^ s.v1 ^ s.v2 ^ s.v3);
    s.v1 ^= 0xdd;
    sip_final_rounds(&s);
    store_le64(out + 8, s.v0 ^ s.v1 ^ s.v2 ^ s.v3);
}
