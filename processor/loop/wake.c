/* wake: waiting for librdkafka queues and one descriptor at once. */
#include "loop/wake.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* The byte queue i writes: 'a' + i. */
static const char payload[IDEM_WAKE_QUEUES_MAX] = {'a', 'b', 'c', 'd'};

int idem_wake_init(idem_wake_t *w, char *errstr, size_t errstr_size)
{
    w->cnt = 0;
    /* Both ends non-blocking: librdkafka must never block writing (it
     * ignores a full pipe: a byte waiting there is enough), nor we
     * reading. */
    if (pipe2(w->fd, O_NONBLOCK | O_CLOEXEC)) {
        snprintf(errstr, errstr_size, "wake: pipe: %s", strerror(errno));
        w->fd[0] = w->fd[1] = -1;
        return -1;
    }
    return 0;
}

int idem_wake_add(idem_wake_t *w, rd_kafka_queue_t *q)
{
    if (!q)
        return 0;
    if (w->cnt == IDEM_WAKE_QUEUES_MAX || w->fd[1] < 0) {
        rd_kafka_queue_destroy(q);
        return 0;
    }
    rd_kafka_queue_io_event_enable(q, w->fd[1], &payload[w->cnt], 1);
    w->q[w->cnt] = q;
    return 2 << w->cnt++;
}

void idem_wake_term(idem_wake_t *w)
{
    for (size_t i = 0; i < w->cnt; i++) {
        rd_kafka_queue_io_event_enable(w->q[i], -1, NULL, 0);
        rd_kafka_queue_destroy(w->q[i]);
    }
    w->cnt = 0;
    for (int i = 0; i < 2; i++)
        if (w->fd[i] >= 0) {
            close(w->fd[i]);
            w->fd[i] = -1;
        }
}

int idem_wake_wait(idem_wake_t *w, int fd, int timeout_ms)
{
    struct pollfd pf[2] = {{.fd = w->fd[0], .events = POLLIN},
                           {.fd = fd, .events = POLLIN}};
    if (poll(pf, fd >= 0 ? 2 : 1, timeout_ms < 0 ? 0 : timeout_ms) <= 0)
        return 0; /* timeout, or EINTR: the caller looks at its flags */
    int why = fd >= 0 && pf[1].revents ? IDEM_WAKE_FD : 0;
    if (pf[0].revents) {
        char buf[64];
        ssize_t n;
        while ((n = read(w->fd[0], buf, sizeof(buf))) > 0)
            for (ssize_t i = 0; i < n; i++)
                if (buf[i] >= 'a' && buf[i] < 'a' + IDEM_WAKE_QUEUES_MAX)
                    why |= 2 << (buf[i] - 'a');
    }
    return why;
}
