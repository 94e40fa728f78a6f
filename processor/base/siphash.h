/* siphash: SipHash-2-4 (Aumasson and Bernstein, 2012), the keyed hash of
 * the dedup marks, with 64-bit and 128-bit outputs. */
#ifndef IDEM_SIPHASH_H
#define IDEM_SIPHASH_H

#include <stddef.h>
#include <stdint.h>

/* SipHash-2-4 of len bytes at in (borrowed; NULL allowed when len is 0)
 * under the 16-byte key, as a 64-bit value: the reference implementation's
 * 8 output bytes read little-endian. Cannot fail. */
uint64_t idem_siphash24(const uint8_t key[16], const void *in, size_t len);

/* SipHash-2-4 with the 128-bit output (the variant with 0xee and 0xdd
 * in the finalisation): writes the reference implementation's 16 output
 * bytes to out (caller's buffer). Cannot fail. */
void idem_siphash24_128(const uint8_t key[16], const void *in, size_t len,
                        uint8_t out[16]);

#endif
