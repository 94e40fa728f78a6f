/* fingerprint: what defines a member's effect, as text a member publishes
 * in its heartbeat (redis/liveness.h) so that members of one group with
 * different effects notice each other. */
#ifndef IDEM_FINGERPRINT_H
#define IDEM_FINGERPRINT_H

#include "conf/conf.h"

/* "key=value" lines, one per effect-defining key: `handler` as set, then
 * envelope.format, envelope.identity, and every key the selected handler
 * declares (its defaults included) or accepts under its prefix, each
 * value as "#" and a 64-bit FNV-1a digest in hex (no secret, URL or path
 * leaves the member); a key named *.file is digested by the file's
 * contents, so the same script at two paths agrees. Last, in clear, the
 * dedup layouts this binary runs ("layouts=global,partition") and the one
 * it wants ("layout.wants=" its dedup.scope; redis/layout.h). A newly
 * allocated string (caller frees). */
char *idem_effect_fingerprint(const idem_conf_t *conf);

#endif
