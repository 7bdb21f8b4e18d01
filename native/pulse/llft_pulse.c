/* llft_pulse.c -- the heartbeat thread (see llft_pulse.h for what and why).
 *
 * One mutex (mu) guards everything shared with the Python-facing calls; a second
 * (rmu) makes one reader of the receive socket at a time, the thread or a caller of
 * llft_pulse_poll, so that arrivals stay in the kernel's order and rbuf has one user.
 * The loop's parked state (llft_pulse_park) is the exception: two atomics, no lock, as
 * the loop writes it twice per iteration.
 * The thread sleeps in ppoll() on the receive socket and an internal eventfd (set,
 * watch and free wake it), with a timeout only while something is to be repeated or
 * watched: idle, it costs no wake-up at all.
 * It never holds the GIL (plain C; cffi releases the GIL around every call into here).
 */
#ifndef _GNU_SOURCE   /* cffi includes Python.h first, which defines it */
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "llft_pulse.h"

#define MAX_REPEAT 8       /* datagrams repeated at once */
#define MAX_FWD 1024       /* forward queue */
#define MAX_SRC 64         /* source table */
#define MAX_ACCEPTED 8     /* accepted datagrams kept per source (ring) */
#define MAX_ARRIVALS 256   /* arrivals kept per source (ring, oldest dropped) */
#define MAX_WATCH 16       /* silence watches */
#define RBUF 65536

enum { S_SENT, S_RECV, S_ABSORBED, S_FWD, S_FWD_DROP, S_ARR_DROP, S_SEND_ERR, S_RECV_ERR,
       S_LEASE_SKIP, S_WATCH_FIRED, S_N };

struct fwd {
    struct fwd *next;
    uint64_t src;
    int64_t at_us;
    uint32_t len;
    uint8_t data[];
};

struct source {
    uint64_t src;
    int used;
    int64_t last_heard;                 /* eviction: least recently heard goes first */
    int64_t newest_at_us;               /* newest absorbed copy's arrival; 0: none yet */
    uint8_t *acc[MAX_ACCEPTED];
    uint32_t acc_len[MAX_ACCEPTED];
    int acc_next;
    int64_t arr[MAX_ARRIVALS];
    int arr_head, arr_n;
};

struct llft_pulse {
    int rfd, sfd, efd, wake_fd;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_mutex_t rmu;                /* one reader of rfd at a time (drain) */
    int stop;
    /* what is repeated */
    uint8_t *rep;
    uint32_t rep_len[MAX_REPEAT];
    int rep_n;
    struct sockaddr_in dst;
    int64_t every_us, until_us, next_due;
    int64_t lease_us, lease_from_us;    /* copies need a live loop (loop_alive) */
    /* The loop's side of the lease: written by llft_pulse_park without mu (atomics) */
    int parked;
    int64_t left_at_us;
    /* silence watches (llft_pulse_watch) */
    uint64_t w_src[MAX_WATCH];
    int64_t w_heard_us[MAX_WATCH], w_deadline_us[MAX_WATCH];
    int w_n;
    int fired;
    int64_t sleep_until_us;             /* the thread's wake-up while it sleeps (INT64_MIN: awake) */
    /* forward queue */
    struct fwd *qhead, **qtail;
    int qn;
    struct source src[MAX_SRC];
    uint64_t stats[S_N];
    uint8_t rbuf[RBUF];                 /* the receive buffer, under rmu */
};

static int64_t clock_ns(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
static int64_t mono_us(void) { return clock_ns(CLOCK_MONOTONIC) / 1000; }

static void wake(int fd) {
    uint64_t one = 1;
    ssize_t r = write(fd, &one, sizeof one);
    (void)r;   /* EAGAIN: the counter is already non-zero, the reader wakes anyway */
}

/* Under mu. MSG_DONTWAIT: a full send buffer must delay neither the thread nor a
 * caller of set(); a lost heartbeat is repeated anyway. */
static void send_all(llft_pulse *p) {
    const uint8_t *d = p->rep;
    for (int i = 0; i < p->rep_n; i++) {
        if (sendto(p->sfd, d, p->rep_len[i], MSG_DONTWAIT, (struct sockaddr *)&p->dst,
                   sizeof p->dst) < 0)
            p->stats[S_SEND_ERR]++;
        else
            p->stats[S_SENT]++;
        d += p->rep_len[i];
    }
}

/* Under mu: may a copy due at t go out? With a lease, only while the loop shows it is
 * alive: it called set() or left its selector (park(0)) at most lease_us before t, or
 * it is blocked in its selector now (idle, not hung). Differences, not sums: a huge
 * lease_us must not overflow. */
static int loop_alive(llft_pulse *p, int64_t t) {
    if (p->lease_us <= 0 || t - p->lease_from_us <= p->lease_us) return 1;
    if (__atomic_load_n(&p->parked, __ATOMIC_ACQUIRE)) return 1;
    return t - __atomic_load_n(&p->left_at_us, __ATOMIC_RELAXED) <= p->lease_us;
}

static struct source *find_src(llft_pulse *p, uint64_t src) {
    for (int i = 0; i < MAX_SRC; i++)
        if (p->src[i].used && p->src[i].src == src) return &p->src[i];
    return NULL;
}

/* Under mu: src's entry, made (evicting the least recently heard) if new. */
static struct source *get_src(llft_pulse *p, uint64_t src) {
    struct source *s = find_src(p, src), *victim = &p->src[0];
    if (s) return s;
    for (int i = 0; i < MAX_SRC && victim->used; i++)
        if (!p->src[i].used || p->src[i].last_heard < victim->last_heard) victim = &p->src[i];
    if (victim->used) {
        p->stats[S_ARR_DROP] += victim->arr_n;   /* its unpopped arrivals go with it */
        for (int k = 0; k < MAX_ACCEPTED; k++) free(victim->acc[k]);
    }
    memset(victim, 0, sizeof *victim);
    victim->used = 1;
    victim->src = src;
    victim->last_heard = mono_us();
    return victim;
}

static int accepted(const struct source *s, const uint8_t *d, uint32_t len) {
    for (int k = 0; k < MAX_ACCEPTED; k++)
        if (s->acc[k] && s->acc_len[k] == len && memcmp(s->acc[k], d, len) == 0) return 1;
    return 0;
}

/* Under mu: one datagram read by the thread. */
static void on_datagram(llft_pulse *p, uint64_t src, const uint8_t *d, uint32_t len, int64_t at) {
    p->stats[S_RECV]++;
    struct source *s = find_src(p, src);
    if (s && accepted(s, d, len)) {
        s->last_heard = at;
        if (s->arr_n == MAX_ARRIVALS) {
            s->arr_head = (s->arr_head + 1) % MAX_ARRIVALS;
            s->arr_n--;
            p->stats[S_ARR_DROP]++;
        }
        s->arr[(s->arr_head + s->arr_n++) % MAX_ARRIVALS] = at;
        if (at > s->newest_at_us) s->newest_at_us = at;   /* kept when arrivals are popped */
        p->stats[S_ABSORBED]++;
        return;
    }
    struct fwd *f = p->qn < MAX_FWD ? malloc(sizeof *f + len) : NULL;
    if (!f) {
        p->stats[S_FWD_DROP]++;
        return;
    }
    f->next = NULL;
    f->src = src;
    f->at_us = at;
    f->len = len;
    memcpy(f->data, d, len);
    *p->qtail = f;
    p->qtail = &f->next;
    p->stats[S_FWD]++;
    /* Python reads its eventfd, then takes until empty: signalling only the empty ->
     * non-empty edge is enough and saves a system call per datagram in a burst. */
    if (p->qn++ == 0) wake(p->efd);
}

/* Under mu: when the earliest watch is due, INT64_MAX if none. A watch's deadline moves
 * by as much as its source's newest absorbed copy is younger than what Python had
 * heard when it set the watch. */
static int64_t watch_due_us(llft_pulse *p) {
    int64_t due = INT64_MAX;
    for (int i = 0; i < p->w_n; i++) {
        const struct source *s = find_src(p, p->w_src[i]);
        int64_t move = 0, d;   /* saturating: Python's times are not checked */
        if (s && s->newest_at_us && s->newest_at_us > p->w_heard_us[i]
            && __builtin_sub_overflow(s->newest_at_us, p->w_heard_us[i], &move))
            move = INT64_MAX;
        if (__builtin_add_overflow(p->w_deadline_us[i], move, &d)) d = INT64_MAX;
        if (d < due) due = d;
    }
    return due;
}

/* Reads recv_fd until EAGAIN (one readiness may hold many datagrams); how many.
 * Called without mu held. */
static int drain(llft_pulse *p) {
    int got = 0;
    pthread_mutex_lock(&p->rmu);
    for (;;) {
        struct sockaddr_in from;
        union { char buf[CMSG_SPACE(sizeof(struct timespec))]; struct cmsghdr align; } ctl;
        struct iovec iov = {p->rbuf, RBUF};
        struct msghdr m = {.msg_name = &from, .msg_namelen = sizeof from, .msg_iov = &iov,
                           .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
        ssize_t n = recvmsg(p->rfd, &m, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        /* Sample both clocks now: the kernel stamps CLOCK_REALTIME, Python wants
         * CLOCK_MONOTONIC; their offset at the read converts the stamp. */
        int64_t real = clock_ns(CLOCK_REALTIME), mono = clock_ns(CLOCK_MONOTONIC);
        pthread_mutex_lock(&p->mu);
        if (n < 0) {
            /* e.g. a pending ICMP error: recvmsg consumed it, so poll will not spin */
            p->stats[S_RECV_ERR]++;
            pthread_mutex_unlock(&p->mu);
            break;
        }
        int64_t at = mono / 1000;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
                struct timespec ts;
                memcpy(&ts, CMSG_DATA(c), sizeof ts);
                at = ((int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec + (mono - real)) / 1000;
            }
        uint64_t src = 0;
        if (from.sin_family == AF_INET)
            src = ((uint64_t)from.sin_addr.s_addr << 16) | ntohs(from.sin_port);
        on_datagram(p, src, p->rbuf, (uint32_t)n, at);
        pthread_mutex_unlock(&p->mu);
        got++;
    }
    pthread_mutex_unlock(&p->rmu);
    return got;
}

/* Under mu: a watch is due after a fresh read. Python re-sends its watches once it has
 * handled the event, so one signal per set, whatever else was due. */
static void fire(llft_pulse *p) {
    p->fired = 1;
    p->w_n = 0;
    p->stats[S_WATCH_FIRED]++;
    wake(p->efd);
}

static void *run(void *arg) {
    llft_pulse *p = arg;
    struct pollfd fds[2] = {{p->wake_fd, POLLIN, 0}, {p->rfd, POLLIN, 0}};
    pthread_mutex_lock(&p->mu);
    while (!p->stop) {
        int64_t now = mono_us();
        if (p->rep_n && p->next_due > p->until_us) p->rep_n = 0;   /* never due again */
        int send_due = p->rep_n && now >= p->next_due;
        int watch_due = now >= watch_due_us(p);
        if (send_due || watch_due) {
            /* While repeating, the socket is read here, at the sends, and not watched in
             * between: one wake-up per interval for both. The kernel's timestamps keep
             * the arrival times exact; a new datagram waits at most an interval. A watch
             * reads it too: copies waiting in the kernel may move its deadline. */
            if (fds[1].fd >= 0) {
                pthread_mutex_unlock(&p->mu);
                drain(p);
                pthread_mutex_lock(&p->mu);
                if (p->stop) continue;
            }
            if (watch_due && mono_us() >= watch_due_us(p)) fire(p);
            /* set() may have replaced or stopped the repetition meanwhile */
            if (send_due && p->rep_n && now >= p->next_due) {
                /* a copy the lease refuses is skipped, not the cadence: a loop that
                 * parks again is announced from the next one on */
                if (loop_alive(p, p->next_due))
                    send_all(p);
                else
                    p->stats[S_LEASE_SKIP]++;
                /* keep the cadence, but after a stall (machine busy) restart from now
                 * rather than send a burst of late copies */
                p->next_due += p->every_us;
                if (p->next_due <= now) p->next_due = now + p->every_us;
            }
            continue;   /* re-checks until_us, and what is due next */
        }
        int64_t wake_at = watch_due_us(p);
        if (p->rep_n && p->next_due < wake_at) wake_at = p->next_due;
        struct timespec to, *top = NULL;
        if (wake_at != INT64_MAX) {
            int64_t left = wake_at - now;
            to.tv_sec = left / 1000000;
            to.tv_nsec = (left % 1000000) * 1000;
            top = &to;
        }
        nfds_t watched = p->rep_n ? 1 : 2;   /* repeating: the socket is read at the sends */
        p->sleep_until_us = wake_at;
        pthread_mutex_unlock(&p->mu);
        int r = ppoll(fds, watched, top, NULL);
        if (r > 0 && fds[0].revents) {
            uint64_t v;
            ssize_t k = read(p->wake_fd, &v, sizeof v);
            (void)k;
        }
        if (r > 0 && watched == 2 && fds[1].revents & POLLNVAL)
            fds[1].fd = -1;   /* closed under us: stop watching */
        else if (r > 0 && watched == 2 && fds[1].revents)
            drain(p);
        pthread_mutex_lock(&p->mu);
        p->sleep_until_us = INT64_MIN;       /* awake: recomputes before it sleeps again */
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

llft_pulse *llft_pulse_new(int recv_fd, int send_fd, int event_fd) {
    int on = 1;
    if (setsockopt(recv_fd, SOL_SOCKET, SO_TIMESTAMPNS, &on, sizeof on) < 0) return NULL;
    llft_pulse *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->rfd = recv_fd;
    p->sfd = send_fd;
    p->efd = event_fd;
    p->qtail = &p->qhead;
    p->sleep_until_us = INT64_MIN;
    p->left_at_us = mono_us();   /* a loop that never parks: as if it left its selector now */
    p->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (p->wake_fd < 0) {
        free(p);
        return NULL;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->rmu, NULL);
    /* Block every signal in the thread: Python's handlers must run in (and interrupt
     * the system calls of) the main thread, not here. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int err = pthread_create(&p->th, NULL, run, p);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!err) pthread_setname_np(p->th, "llft-pulse");   /* findable in top, /proc */
    if (err) {
        close(p->wake_fd);
        pthread_mutex_destroy(&p->mu);
        pthread_mutex_destroy(&p->rmu);
        free(p);
        errno = err;
        return NULL;
    }
    return p;
}

void llft_pulse_free(llft_pulse *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_mutex_unlock(&p->mu);
    wake(p->wake_fd);
    pthread_join(p->th, NULL);
    close(p->wake_fd);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->rmu);
    for (struct fwd *f = p->qhead, *next; f; f = next) {
        next = f->next;
        free(f);
    }
    for (int i = 0; i < MAX_SRC; i++)
        for (int k = 0; k < MAX_ACCEPTED; k++) free(p->src[i].acc[k]);
    free(p->rep);
    free(p);
}

int llft_pulse_set(llft_pulse *p, const uint8_t *data, const uint32_t *lens, int n,
                   uint32_t dst_ip_be, uint16_t dst_port, int64_t every_us, int64_t until_us,
                   int64_t lease_us) {
    if (n < 0 || n > MAX_REPEAT || (n > 0 && (every_us <= 0 || !data || !lens))) return -1;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        if (lens[i] > RBUF) return -1;
        total += lens[i];
    }
    pthread_mutex_lock(&p->mu);
    /* The same datagrams, to the same place, still being repeated (a quiet member's
     * refresh): only the end moves. No extra copy, no wake-up, the cadence kept. */
    size_t cur = 0;
    for (int i = 0; i < p->rep_n; i++) cur += p->rep_len[i];
    int same = n > 0 && n == p->rep_n && total == cur && every_us == p->every_us
               && p->next_due <= p->until_us && p->dst.sin_addr.s_addr == dst_ip_be
               && p->dst.sin_port == htons(dst_port) && memcmp(p->rep, data, total) == 0;
    for (int i = 0; same && i < n; i++) same = lens[i] == p->rep_len[i];
    if (same) {
        if (until_us > p->until_us) p->until_us = until_us;
        p->lease_us = lease_us;   /* a refresh is the loop's sign of life too */
        p->lease_from_us = mono_us();
        pthread_mutex_unlock(&p->mu);
        return 0;
    }
    pthread_mutex_unlock(&p->mu);
    uint8_t *copy = NULL;
    if (n && !(copy = malloc(total ? total : 1))) return -1;
    if (n) memcpy(copy, data, total);
    pthread_mutex_lock(&p->mu);
    free(p->rep);
    p->rep = copy;
    p->rep_n = n;
    for (int i = 0; i < n; i++) p->rep_len[i] = lens[i];
    memset(&p->dst, 0, sizeof p->dst);
    p->dst.sin_family = AF_INET;
    p->dst.sin_addr.s_addr = dst_ip_be;
    p->dst.sin_port = htons(dst_port);
    p->every_us = every_us;
    p->until_us = until_us;
    p->lease_us = lease_us;
    p->lease_from_us = mono_us();
    /* The first copy goes from the caller's thread: a new heartbeat (a state change)
     * must not wait for the thread to be scheduled. */
    send_all(p);
    p->next_due = mono_us() + every_us;
    pthread_mutex_unlock(&p->mu);
    wake(p->wake_fd);   /* the thread's timeout changed */
    return 0;
}

void llft_pulse_park(llft_pulse *p, int parked) {
    /* Twice per loop iteration: no lock, no system call (the vDSO clock). left_at_us is
     * stored first: a thread that sees the loop unparked sees when it left. */
    if (!parked) __atomic_store_n(&p->left_at_us, mono_us(), __ATOMIC_RELAXED);
    __atomic_store_n(&p->parked, parked != 0, __ATOMIC_RELEASE);
}

int llft_pulse_watch(llft_pulse *p, const uint64_t *src, const int64_t *heard_us,
                     const int64_t *deadline_us, int n) {
    if (n < 0 || n > MAX_WATCH || (n > 0 && (!src || !heard_us || !deadline_us))) return -1;
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < n; i++) {
        p->w_src[i] = src[i];
        p->w_heard_us[i] = heard_us[i];
        p->w_deadline_us[i] = deadline_us[i];
    }
    p->w_n = n;
    /* Only a watch due before the thread's wake-up needs it woken now: watches handed
     * under load mostly move later (the peers are heard), and a write plus a context
     * switch each time would cost the request path for nothing (the thread recomputes
     * when it wakes anyway). */
    int sooner = watch_due_us(p) < p->sleep_until_us;
    pthread_mutex_unlock(&p->mu);
    if (sooner) wake(p->wake_fd);
    return 0;
}

int llft_pulse_watch_fired(llft_pulse *p) {
    pthread_mutex_lock(&p->mu);
    int fired = p->fired;
    p->fired = 0;
    pthread_mutex_unlock(&p->mu);
    return fired;
}

int64_t llft_pulse_take(llft_pulse *p, uint8_t *buf, size_t cap, uint64_t *src, int64_t *at_us) {
    pthread_mutex_lock(&p->mu);
    struct fwd *f = p->qhead;
    int64_t r = 0;
    if (f && f->len > cap) {
        r = -1;
    } else if (f) {
        memcpy(buf, f->data, f->len);
        *src = f->src;
        *at_us = f->at_us;
        r = f->len;
        if (!(p->qhead = f->next)) p->qtail = &p->qhead;
        p->qn--;
        free(f);
    }
    pthread_mutex_unlock(&p->mu);
    return r;
}

int llft_pulse_poll(llft_pulse *p) {
    return drain(p);
}

void llft_pulse_accept(llft_pulse *p, uint64_t src, const uint8_t *data, uint32_t len) {
    pthread_mutex_lock(&p->mu);
    struct source *s = get_src(p, src);
    s->last_heard = mono_us();
    /* A datagram forwarded twice (both copies queued before Python accepted the first)
     * is accepted twice: keep one slot for it. */
    if (!accepted(s, data, len)) {
        int k = s->acc_next;
        uint8_t *copy = realloc(s->acc[k], len ? len : 1);
        if (copy) {
            memcpy(copy, data, len);
            s->acc[k] = copy;
            s->acc_len[k] = len;
            s->acc_next = (k + 1) % MAX_ACCEPTED;
        }
    }
    pthread_mutex_unlock(&p->mu);
}

int llft_pulse_arrivals(llft_pulse *p, uint64_t *src, int64_t *at_us, int cap) {
    int n = 0;
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < MAX_SRC && n < cap; i++) {
        struct source *s = &p->src[i];
        while (s->used && s->arr_n && n < cap) {
            src[n] = s->src;
            at_us[n++] = s->arr[s->arr_head];
            s->arr_head = (s->arr_head + 1) % MAX_ARRIVALS;
            s->arr_n--;
        }
    }
    pthread_mutex_unlock(&p->mu);
    return n;
}

void llft_pulse_stats(llft_pulse *p, uint64_t out[10]) {
    pthread_mutex_lock(&p->mu);
    memcpy(out, p->stats, sizeof p->stats);
    pthread_mutex_unlock(&p->mu);
}
