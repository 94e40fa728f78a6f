/* tcpnodelay: TCP_NODELAY on the connections the embedded broker accepts.
 * librdkafka's mock cluster sets no socket options on them, so each
 * response it writes in two parts waits for the client's delayed ACK
 * (Nagle's algorithm): about 40 ms on every produce and fetch round trip,
 * where a real broker answers in well under a millisecond. */
#ifndef IDEM_TCPNODELAY_H
#define IDEM_TCPNODELAY_H

/* From now on, every socket this process accepts gets TCP_NODELAY. The
 * accept()/accept4() of the process are wrapped (the dynamic linker
 * resolves librdkafka's calls to them here) and pass through unchanged
 * until this is called. Safe to call more than once, from any thread. */
void idem_tcpnodelay_enable(void);

#endif
