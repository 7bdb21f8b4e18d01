/* shim_group.c -- CSCS: group connections, the agent's side of the group's service port.
 *
 * Intercepts listen, and serves the socket hooks of shim_net.c for group sockets
 * (bind, accept, reads, writes, names, close: group_* below).
 *
 * LLFT_SERVICE_PORT=<p>: a TCP socket the app binds to port p (any address) is the
 * GROUP LISTENER. It is real at every replica but it is a UNIX stream socket: bind()
 * makes one in the abstract namespace (LLFT_GROUP_NAME: the app's pid and a random id,
 * so replicas on one host never clash) and puts it in the app's descriptor (dup3,
 * with its descriptor and status flags), and listen() publishes the id in
 * ctl.group_id. The app keeps seeing TCP: its addresses are the ones a loopback TCP
 * connection would show, options of the TCP and IP levels are taken and ignored, and a
 * reset travels through ctl.resets (below). Why not loopback TCP, as until 2026-11-30:
 * the agent's TCP send to its app was its largest single cost per request (~27 µs of a
 * backup's ~115 in cProfile at 16 clients), the kernel's TCP path run for every write
 * on both sides; a UNIX socket moves the same bytes in a fraction of it. Its only
 * peer is the agent, which connects the same group connections in the same order at
 * every replica and writes the same bytes into each. So, unlike external sockets,
 * group sockets are real at a backup too, and the order information carries no data:
 *   accept  primary: real, recorded (result/errno, peer address, connection index in
 *           aux). backup: recorded success -> waits (no GIL, stall-checked) for the
 *           agent's connection and really accepts it, returning the primary's peer
 *           address; recorded failure -> the same errno, nothing accepted.
 *   read    primary: real, recorded (count or errno, never the bytes). backup: waits
 *           until exactly that many bytes are there and reads exactly that many;
 *           EOF waits for the end (EOF, or ECONNRESET if the agent closed with the
 *           app's output unread: timing); an errno is returned without reading. A
 *           commitment, not a hint: no time cap, only the stall check.
 *   write   real at every replica. primary records the count + FNV-1a of the bytes;
 *           a backup writes exactly the recorded count (looping, blocking without
 *           the GIL) after checking the hash. A different hash is a DIVERGENCE:
 *           ctl.div_conn/div_offset name the connection (acceptance index) and the
 *           stream offset of the differing write's first byte, the report says the
 *           same, and -- as for every divergence -- the process exits at once with
 *           status 86 (the differing bytes are NOT written). A local write failure at
 *           a backup (its agent closed) keeps the primary's result for the app.
 *   names   getsockname: the listener answers the app's requested address (service
 *           port); an accepted connection answers loopback of the listener's family
 *           with the service port (the same at every replica, nothing recorded).
 *           getpeername: the primary's peer address from the accept record (made up at
 *           the primary: loopback, a port from the connection index).
 *   peers   only the agent (ctl.agent_pid, checked with SO_PEERCRED): a connection from
 *           any other process is closed at once and counted (LLFT_ST_STRAY_CONNS).
 *   resets  a TCP RST has no UNIX equivalent: the side that resets marks the connection
 *           in ctl.resets before it closes, the other takes the mark when it reads the
 *           end. The agent resets (a client's RST): the primary's read of the end fails
 *           with ECONNRESET (recorded like any read). The app closes after SO_LINGER 0:
 *           the agent reads a reset. The app's close clears its connection's marks.
 *   options setsockopt/getsockopt at the TCP and IP levels: taken, not passed (a UNIX
 *           socket has none; TCP_NODELAY is what it does anyway); socket-level ones are
 *           real. Not recorded.
 *   rest    readiness ordered like external sockets (no local enforcement: the read
 *           or accept that follows waits for the real bytes/connection); shutdown,
 *           fcntl, close: real at every replica, not recorded.
 */
#include "shim_internal.h"
#include <sys/un.h>

/* LLFT_SERVICE_PORT: the group's service port; 0: none. */
static uint16_t g_service_port;

void group_activate(void) {
    const char *svc = getenv("LLFT_SERVICE_PORT");
    if (svc) { long v = atol(svc); if (v > 0 && v < 65536) g_service_port = (uint16_t)v; }
}

struct gconn {
    uint32_t conn;                  /* connection: 0-based acceptance index */
    uint32_t id;                    /* listener: its name's id (LLFT_GROUP_NAME) */
    uint64_t written;               /* connection: bytes the app wrote (stream offset) */
    int family;                     /* the app's address family (of its listener) */
    int abort;                      /* connection: SO_LINGER 0 was set (a close resets) */
    socklen_t alen;                 /* listener: app's address; connection: primary's peer */
    struct sockaddr_storage addr;
};
static uint32_t g_group_accepted;  /* group connections accepted so far (next index) */
#define GROUP_MAX_IOV 64

static int sock_is_stream(int fd) {
    int type = 0;
    socklen_t tl = sizeof type;
    return R(getsockopt)(fd, SOL_SOCKET, SO_TYPE, &type, &tl) == 0 && type == SOCK_STREAM;
}
int is_service_addr(int fd, const struct sockaddr *a, socklen_t len) {
    if (!g_service_port || !a) return 0;
    if (!((a->sa_family == AF_INET && len >= sizeof(struct sockaddr_in))
          || (a->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6))))
        return 0;
    return addr_port(a) == g_service_port && sock_is_stream(fd);
}
static void copy_addr(struct sockaddr *dst, socklen_t *dlen, const void *src, socklen_t slen) {
    if (!dst || !dlen) return;
    socklen_t k = slen < *dlen ? slen : *dlen;
    memcpy(dst, src, k);
    *dlen = slen;
}

/* The listener's abstract UNIX address for `id`. */
static socklen_t group_name(uint32_t id, struct sockaddr_un *u) {
    memset(u, 0, sizeof *u);
    u->sun_family = AF_UNIX;
    int k = snprintf(u->sun_path + 1, sizeof u->sun_path - 1, LLFT_GROUP_NAME,
                     __atomic_load_n(&g_ctl->active_pid, __ATOMIC_ACQUIRE), id);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)k);
}

int group_bind(int fd, const struct sockaddr *a, socklen_t len) {
    struct gconn *g = calloc(1, sizeof *g);
    if (!g) { errno = ENOMEM; return -1; }
    g->alen = len < sizeof g->addr ? len : (socklen_t)sizeof g->addr;
    memcpy(&g->addr, a, g->alen);
    g->family = a->sa_family;
    int u = R(socket)(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (u < 0) { int e = errno; free(g); errno = e; return -1; }
    int r = -1;
    for (int tries = 0; tries < 8 && r != 0; tries++) {
        uint32_t id = 0;
        while (!id && syscall(SYS_getrandom, &id, sizeof id, 0) == (long)sizeof id) id &= 0x7fffffff;
        if (!id) id = (uint32_t)mono_ns() | 1u;
        struct sockaddr_un un;
        socklen_t ul = group_name(id, &un);
        r = R(bind)(u, (struct sockaddr *)&un, ul);
        if (r == 0) g->id = id;
        else if (errno != EADDRINUSE) break;
    }
    /* the app's descriptor becomes the UNIX socket, with its flags (a SOCK_NONBLOCK or
     * SOCK_CLOEXEC socket() stays one) */
    int fdf = r == 0 ? fcntl(fd, F_GETFD) : -1, flf = r == 0 ? fcntl(fd, F_GETFL) : -1;
    if (r == 0 && (fdf < 0 || flf < 0 || dup3(u, fd, (fdf & FD_CLOEXEC) ? O_CLOEXEC : 0) < 0
                   || fcntl(fd, F_SETFL, flf & O_NONBLOCK) < 0))
        r = -1;
    int e = errno;
    R(close)(u);
    if (r != 0) { free(g); errno = e; return -1; }
    g_fd[fd].kind = FDK_GROUP_LISTEN;
    g_fd[fd].g = g;
    return 0;
}

/* The group listener's accept queue holds every connection the agent has opened and the
 * app not yet accepted. The agent opens them as streams arrive, in order, without waiting
 * for the app's accept (it cannot see it); a backup catching up opens a whole history's
 * worth at once. With the app's own backlog (socketserver asks for 5) the kernel drops the
 * SYNs beyond it and each connection waits for a SYN retransmission (1 s, 3 s, ...): a
 * joiner replayed a 10 s HTTP history (4,127 connections) in 467 s. The kernel caps the
 * value at net.core.somaxconn; the backlog is invisible to the app otherwise. */
#define GROUP_LISTEN_BACKLOG 65535

EXPORT int listen(int fd, int backlog) {
    if (active_here() && fd_kind(fd) == FDK_GROUP_LISTEN && backlog < GROUP_LISTEN_BACKLOG)
        backlog = GROUP_LISTEN_BACKLOG;
    int r = R(listen)(fd, backlog);
    if (r == 0 && active_here() && fd_kind(fd) == FDK_GROUP_LISTEN && g_fd[fd].g) {
        uint32_t zero = 0;
        __atomic_compare_exchange_n(&g_ctl->group_id, &zero, g_fd[fd].g->id, 0,
                                    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    }
    return r;
}

/* The published listener is closed: clear ctl.group_id, the next listen() publishes. */
void group_unpublish(int fd) {
    uint32_t id = g_fd[fd].g ? g_fd[fd].g->id : 0;
    if (id) __atomic_compare_exchange_n(&g_ctl->group_id, &id, 0, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

/* A group connection is closed by the app: a reset after SO_LINGER 0 is marked for the
 * agent first (shim_net.c's close calls this before the real close), and a reset the
 * agent marked that the app never read is let go. */
void group_closing(int fd) {
    struct gconn *g = g_fd[fd].g;
    if (!g) return;
    llft_reset_take(g_ctl, LLFT_RESET_BY_AGENT, g->conn);
    if (g->abort) llft_reset_mark(g_ctl, LLFT_RESET_BY_APP, g->conn);
}

/* The address a loopback TCP socket of `family` would have, with `port`. */
static socklen_t loopback_addr(int family, uint16_t port, struct sockaddr_storage *ss) {
    memset(ss, 0, sizeof *ss);
    if (family == AF_INET6) {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
        s6->sin6_family = AF_INET6;
        s6->sin6_addr.s6_addr[10] = s6->sin6_addr.s6_addr[11] = 0xff;   /* ::ffff:127.0.0.1 */
        s6->sin6_addr.s6_addr[12] = 127;
        s6->sin6_addr.s6_addr[15] = 1;
        s6->sin6_port = htons(port);
        return sizeof *s6;
    }
    struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
    s4->sin_family = AF_INET;
    s4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    s4->sin_port = htons(port);
    return sizeof *s4;
}

/* Group sockets: TCP- and IP-level options are taken and not passed (see the top). */
int group_setsockopt(int fd, int lvl, int name, const void *v, socklen_t l) {
    if (lvl == SOL_SOCKET) {
        int r = R(setsockopt)(fd, lvl, name, v, l);
        if (r == 0 && name == SO_LINGER && v && l >= sizeof(struct linger) && g_fd[fd].g) {
            const struct linger *lg = v;
            g_fd[fd].g->abort = lg->l_onoff && lg->l_linger == 0;
        }
        return r;
    }
    return 0;
}
int group_getsockopt(int fd, int lvl, int name, void *v, socklen_t *l) {
    if (lvl == SOL_SOCKET && name == SO_DOMAIN && v && l && *l >= sizeof(int) && g_fd[fd].g) {
        *(int *)v = g_fd[fd].g->family;
        *l = sizeof(int);
        return 0;
    }
    if (lvl == SOL_SOCKET && name == SO_PROTOCOL && v && l && *l >= sizeof(int)) {
        *(int *)v = IPPROTO_TCP;
        *l = sizeof(int);
        return 0;
    }
    if (lvl == SOL_SOCKET) return R(getsockopt)(fd, lvl, name, v, l);
    if (v && l && *l >= sizeof(int)) { *(int *)v = 0; *l = sizeof(int); }
    return 0;
}

/* The record must be a group one: else the replicas disagree on what this socket is. */
static void group_check(struct bk *b) {
    if (b->h.flags != LLFT_SK_GROUP)
        diverge("divergence: thread %d call #%llu %s: a group connection here, the trace's "
                "socket is of kind %u", t_tid, (unsigned long long)t_n, llft_call_name(b->h.call),
                b->h.flags);
}

/* Whether connection c comes from the agent (ctl.agent_pid; 0: anyone). */
static int from_agent(int c) {
    uint32_t agent = __atomic_load_n(&g_ctl->agent_pid, __ATOMIC_ACQUIRE);
    struct ucred uc;
    socklen_t ul = sizeof uc;
    return !agent || (R(getsockopt)(c, SOL_SOCKET, SO_PEERCRED, &uc, &ul) == 0
                      && (uint32_t)uc.pid == agent);
}
/* Accept the next connection from the agent. One from any other process is closed at once
 * and counted (LLFT_ST_STRAY_CONNS): at the primary it would be input that no replica
 * agreed on, at a backup it would take the agent's place in the queue (the listener's
 * abstract name is visible in /proc/net/unix to every process of the host). `once`: after
 * a stray one, fail with EAGAIN instead of accepting again (a backup's wait polls). */
static int group_take(int fd, int flags, int four, int once) {
    for (;;) {
        int r = four ? R(accept4)(fd, NULL, NULL, flags) : R(accept)(fd, NULL, NULL);
        if (r < 0 || from_agent(r)) return r;
        R(close)(r);
        __atomic_fetch_add(&g_ctl->stats[LLFT_ST_STRAY_CONNS], 1, __ATOMIC_RELAXED);
        if (once) { errno = EAGAIN; return -1; }
    }
}

int group_accept(int fd, struct sockaddr *a, socklen_t *alen, int flags, int four) {
    uint64_t op = fd_op(fd);
    int r, e;
    int family = g_fd[fd].g ? g_fd[fd].g->family : AF_INET;    /* the app's listener's */
    uint32_t conn = 0;
    struct bk b;
    struct sockaddr_storage ss;
    socklen_t sl = 0;
    memset(&ss, 0, sizeof ss);
    if (replaying(&b, LLFT_C_ACCEPT, op, &ss, sizeof ss)) {
        group_check(&b);
        r = (int)b.h.ret;
        e = b.h.err;
        conn = b.h.aux;
        sl = b.h.dlen;
        if (r >= 0) {
            /* the agent connects here too, in the same order: take that connection */
            struct stallw sw = {0, 0};
            for (;;) {
                struct pollfd pf = {fd, POLLIN, 0};
                if (R(poll)(&pf, 1, 0) > 0) {
                    r = group_take(fd, four ? flags : 0, 1, 1);
                    if (r >= 0) break;
                    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
                        diverge("divergence: thread %d call #%llu accept(group): accepted at the "
                                "primary, fails here (errno %d)", t_tid, (unsigned long long)t_n, errno);
                }
                if (!b.gil) b.gil = gil_drop();
                R(poll)(&pf, 1, WAIT_SLICE_MS);
                stall_check(&sw, "the agent's group connection", LLFT_C_ACCEPT, op);
            }
            e = 0;
            if (conn + 1 > g_group_accepted) g_group_accepted = conn + 1;  /* for a promotion */
        }
        bk_end(&b);
    } else {
        r = group_take(fd, flags, four, 0);
        e = r < 0 ? errno : 0;
        if (r >= 0) {
            conn = __atomic_fetch_add(&g_group_accepted, 1, __ATOMIC_ACQ_REL);
            /* the peer is the agent's UNIX socket: the app sees a loopback TCP peer, its
             * port in the ephemeral range, from the connection's index */
            sl = loopback_addr(family, (uint16_t)(32768 + conn % 28232), &ss);
        }
        pr_append(LLFT_C_ACCEPT, op, r, e, conn, LLFT_SK_GROUP, &ss, r >= 0 ? sl : 0);
    }
    if (r >= 0) {
        copy_addr(a, alen, &ss, sl);
        fd_set_kind(r, FDK_GROUP, new_lid());
        struct gconn *g = calloc(1, sizeof *g);
        if (!g) diverge("out of memory for a group connection");
        g->conn = conn;
        g->family = family;
        g->alen = sl;
        memcpy(&g->addr, &ss, sizeof ss);
        g_fd[r].g = g;
    }
    errno = e ? e : errno;
    return r;
}

static size_t iov_total(const struct iovec *iov, int n) {
    size_t t = 0;
    for (int i = 0; i < n; i++) t += iov[i].iov_len;
    return t;
}
/* out = the part of iov in [skip, skip+len); returns its count */
static int iov_window(const struct iovec *iov, int n, size_t skip, size_t len, struct iovec *out) {
    int k = 0;
    for (int i = 0; i < n && len && k < GROUP_MAX_IOV; i++) {
        size_t l = iov[i].iov_len;
        if (skip >= l) { skip -= l; continue; }
        size_t take = l - skip < len ? l - skip : len;
        out[k].iov_base = (uint8_t *)iov[i].iov_base + skip;
        out[k++].iov_len = take;
        skip = 0;
        len -= take;
    }
    return k;
}
static uint32_t iov_hash(const struct iovec *iov, int n, size_t len) {
    uint32_t h = 2166136261u;
    for (int i = 0; i < n && len; i++) {
        size_t take = iov[i].iov_len < len ? iov[i].iov_len : len;
        h = fnv1a(iov[i].iov_base, take, h);
        len -= take;
    }
    return h;
}

/* Backup: wait (no GIL, stall-checked) until `enough` of the `want` bytes still to read
 * are readable, or for EOF when want == 0. */
static void group_wait_loop(int fd, size_t want, size_t enough, struct bk *b, int *counted) {
    struct stallw sw = {0, 0};
    for (;;) {
        int avail = 0;
        if (ioctl(fd, FIONREAD, &avail) != 0) avail = 0;
        if (want && (size_t)avail >= enough) return;
        struct pollfd pf = {fd, POLLIN | POLLRDHUP, 0};
        R(poll)(&pf, 1, 0);
        if (pf.revents & (POLLRDHUP | POLLHUP | POLLERR)) {
            if (ioctl(fd, FIONREAD, &avail) != 0) avail = 0;
            if (want && (size_t)avail >= enough) return;
            if (!want && avail == 0) return;
            if (want)
                diverge("divergence: thread %d call #%llu recv(group connection %u): the primary read "
                        "%zu bytes, the agent closed here after %d", t_tid, (unsigned long long)t_n,
                        g_fd[fd].g ? g_fd[fd].g->conn : 0, want, avail);
            if (pf.revents & POLLERR) return;   /* the real read reports the error */
        }
        if (!b->gil) b->gil = gil_drop();
        if (!(*counted)++) __atomic_fetch_add(&g_ctl->stats[LLFT_ST_INPUT_WAIT], 1, __ATOMIC_RELAXED);
        if (avail > 0 && want) { struct timespec ts = {0, 200000}; R(nanosleep)(&ts, NULL); }
        else { pf.revents = 0; R(poll)(&pf, 1, WAIT_SLICE_MS); }
        stall_check(&sw, want ? "the agent's bytes on a group connection" : "the agent's EOF on a group connection",
                    LLFT_C_RECV, b->h.op);
    }
}
/* A thread that sleeps here counts in LLFT_ST_INPUT_WAIT: the agent does not wait for a
 * backup's replay to progress while it cannot (its next input is not delivered yet). */
static void group_wait_bytes(int fd, size_t want, size_t enough, struct bk *b) {
    int counted = 0;
    group_wait_loop(fd, want, enough, b, &counted);
    if (counted) __atomic_fetch_sub(&g_ctl->stats[LLFT_ST_INPUT_WAIT], 1, __ATOMIC_RELAXED);
}

/* Every read of a group socket, as recvmsg (read/recv/recvfrom/readv are special cases). */
ssize_t group_recv(int fd, struct msghdr *m, int flags) {
    uint64_t op = fd_op(fd);
    ssize_t r;
    int e;
    struct bk b;
    if (replaying(&b, LLFT_C_RECV, op, NULL, 0)) {
        group_check(&b);
        r = (ssize_t)b.h.ret;
        e = b.h.err;
        size_t total = iov_total(m->msg_iov, (int)m->msg_iovlen);
        if (r > 0 && (size_t)r > total)
            diverge("divergence: thread %d call #%llu recv(group): the primary read %zd bytes, the "
                    "program asked for %zu", t_tid, (unsigned long long)t_n, r, total);
        if (r > 0 || (r == 0 && total > 0)) {
            struct iovec w[GROUP_MAX_IOV];
            struct msghdr mm = *m;
            size_t done = 0;
            int peek = flags & MSG_PEEK;
            do {
                /* A read takes the primary's count as the bytes come, in as many real
                 * reads as it needs: this socket's buffer may hold fewer at once than the
                 * primary's did (its kernel grew its buffer as its app read fast; a lagging
                 * backup's did not), and waiting for all of them at once waited until the
                 * primary was released from the lag bound (10 s). A peek sees them all at
                 * once; EOF (r == 0) is waited for as such. */
                size_t left = (size_t)r - done;
                group_wait_bytes(fd, left, peek || r == 0 ? left : 1, &b);
                mm.msg_iov = w;
                mm.msg_iovlen = (size_t)iov_window(m->msg_iov, (int)m->msg_iovlen, done, (size_t)r - done, w);
                ssize_t k = R(recvmsg)(fd, &mm, (flags & ~MSG_WAITALL) | MSG_DONTWAIT);
                if (k <= 0) {
                    /* the recorded end is here: an EOF, or ECONNRESET when the agent
                     * closed with the app's output unread in its socket (a UNIX socket's
                     * close resets its peer then). Whether a backup's agent had read it
                     * all is a matter of timing: the same end. */
                    if (r == 0 && (k == 0 || errno == ECONNRESET)) break;
                    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;   /* waits again */
                    diverge("divergence: thread %d call #%llu recv(group): the primary read %zd bytes, "
                            "here the read returned %zd (errno %d)", t_tid, (unsigned long long)t_n,
                            r, k, k < 0 ? errno : 0);
                }
                done += (size_t)k;
            } while (!peek && done < (size_t)r);
            m->msg_namelen = mm.msg_namelen;
            m->msg_controllen = mm.msg_controllen;
            m->msg_flags = mm.msg_flags;
        } else {
            m->msg_controllen = 0;
            m->msg_flags = 0;
        }
        bk_end(&b);
    } else {
        r = R(recvmsg)(fd, m, flags);
        e = r < 0 ? errno : 0;
        if (r == 0 && iov_total(m->msg_iov, (int)m->msg_iovlen) > 0 && g_fd[fd].g
            && llft_reset_take(g_ctl, LLFT_RESET_BY_AGENT, g_fd[fd].g->conn)) {
            r = -1;                         /* the agent's reset: a TCP RST's read */
            e = ECONNRESET;
        }
        pr_append(LLFT_C_RECV, op, r, e, 0, LLFT_SK_GROUP, NULL, 0);
    }
    errno = e ? e : errno;
    return r;
}

/* Every write of a group socket, as sendmsg. */
ssize_t group_send(int fd, const struct msghdr *m, int flags) {
    uint64_t op = fd_op(fd);
    struct gconn *g = g_fd[fd].g;
    ssize_t r;
    int e;
    struct bk b;
    if (replaying(&b, LLFT_C_SEND, op, NULL, 0)) {
        group_check(&b);
        r = (ssize_t)b.h.ret;
        e = b.h.err;
        size_t total = iov_total(m->msg_iov, (int)m->msg_iovlen);
        if (r > 0 && ((size_t)r > total || iov_hash(m->msg_iov, (int)m->msg_iovlen, (size_t)r) != b.h.aux))
            diverge_group(g->conn, g->written,
                          "divergence: thread %d call #%llu send(group): the program wrote different "
                          "bytes than the primary on group connection %u at stream offset %llu (%zu "
                          "asked, %zd recorded)", t_tid, (unsigned long long)t_n, g->conn,
                          (unsigned long long)g->written, total, r);
        size_t done = 0;
        struct stallw sw = {0, 0};
        while (r > 0 && done < (size_t)r) {
            struct iovec w[GROUP_MAX_IOV];
            struct msghdr mm;
            memset(&mm, 0, sizeof mm);
            mm.msg_iov = w;
            mm.msg_iovlen = (size_t)iov_window(m->msg_iov, (int)m->msg_iovlen, done, (size_t)r - done, w);
            ssize_t k = R(sendmsg)(fd, &mm, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (k > 0) { done += (size_t)k; continue; }
            if (k < 0 && errno == EINTR) continue;
            if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK) break;  /* the agent left */
            if (!b.gil) b.gil = gil_drop();
            struct pollfd pf = {fd, POLLOUT, 0};
            R(poll)(&pf, 1, WAIT_SLICE_MS);
            stall_check(&sw, "room to write on a group connection", LLFT_C_SEND, op);
        }
        bk_end(&b);
    } else {
        r = R(sendmsg)(fd, m, flags);
        e = r < 0 ? errno : 0;
        uint32_t h = r > 0 ? iov_hash(m->msg_iov, (int)m->msg_iovlen, (size_t)r) : 0;
        pr_append(LLFT_C_SEND, op, r, e, h, LLFT_SK_GROUP, NULL, 0);
    }
    if (r > 0) __atomic_fetch_add(&g->written, (uint64_t)r, __ATOMIC_ACQ_REL);
    errno = e ? e : errno;
    return r;
}

/* recv/read/recvfrom/readv and send/write/sendto/writev as msghdrs */
ssize_t group_recv_buf(int fd, void *buf, size_t n, int flags, struct sockaddr *src, socklen_t *sl) {
    struct iovec v = {buf, n};
    struct msghdr m;
    memset(&m, 0, sizeof m);
    m.msg_iov = &v;
    m.msg_iovlen = 1;
    if (src && sl) { m.msg_name = src; m.msg_namelen = *sl; }
    ssize_t r = group_recv(fd, &m, flags);
    if (src && sl && r >= 0) *sl = m.msg_namelen;
    return r;
}
ssize_t group_send_buf(int fd, const void *buf, size_t n, int flags) {
    struct iovec v = {(void *)buf, n};
    struct msghdr m;
    memset(&m, 0, sizeof m);
    m.msg_iov = &v;
    m.msg_iovlen = 1;
    return group_send(fd, &m, flags);
}
ssize_t group_recv_iov(int fd, const struct iovec *iov, int n) {
    struct msghdr m;
    memset(&m, 0, sizeof m);
    m.msg_iov = (struct iovec *)iov;
    m.msg_iovlen = (size_t)(n < 0 ? 0 : n);
    return group_recv(fd, &m, 0);
}
ssize_t group_send_iov(int fd, const struct iovec *iov, int n) {
    struct msghdr m;
    memset(&m, 0, sizeof m);
    m.msg_iov = (struct iovec *)iov;
    m.msg_iovlen = (size_t)(n < 0 ? 0 : n);
    return group_send(fd, &m, 0);
}

/* Group sockets: names every replica agrees on, nothing recorded (see the top). */
int group_sockname(int fd, struct sockaddr *a, socklen_t *l) {
    struct gconn *g = g_fd[fd].g;
    if (!a || !l) { errno = EFAULT; return -1; }
    if (fd_kind(fd) == FDK_GROUP_LISTEN) { copy_addr(a, l, &g->addr, g->alen); return 0; }
    struct sockaddr_storage ss;
    copy_addr(a, l, &ss, loopback_addr(g->family, g_service_port, &ss));
    return 0;
}
int group_peername(int fd, struct sockaddr *a, socklen_t *l) {
    copy_addr(a, l, &g_fd[fd].g->addr, g_fd[fd].g->alen);   /* the primary's peer */
    return 0;
}
