/* shim_net.c -- CSCS: sockets.
 *
 * Intercepts socket, socketpair, bind, connect, accept/accept4, close, the reads and
 * writes of sockets (read/recv/recvfrom/recvmsg/readv, write/send/sendto/sendmsg/
 * writev), getsockopt/getsockname/getpeername, shutdown, and readiness (poll, select,
 * epoll_create/create1/ctl/wait/pwait); a group socket's calls go to shim_group.c.
 *
 * Every socket the determinized process creates gets a logical id (creator thread,
 * creation count), the operation identifier of its calls. Its KIND decides what is
 * ordered (docs/DESIGN.md, "Three kinds of connection"):
 *   private   AF_UNIX, socketpair, and loopback peers inside the replica's process tree
 *             (py4j, asyncio's self-pipe): real at every replica, never recorded.
 *   external  anything else (and loopback ports named in LLFT_EXTERNAL_PORTS): real at
 *             the primary, which records every result (bytes read, byte counts
 *             written plus a hash of the bytes, connect/accept outcomes, poll/select/
 *             epoll results, EAGAIN...); NEVER opened at a backup, which returns the
 *             recorded results (a write whose bytes differ is a divergence).
 *   group     the app's TCP listener on the group's service port (env LLFT_SERVICE_PORT)
 *             and every connection accepted on it; the only peer is the replica's
 *             agent, which connects the same connections in the same order at every
 *             replica and writes the same bytes into them. Real at every replica
 *             (the listener made an abstract UNIX socket, published in ctl.group_id); the
 *             primary records accept outcomes, read COUNTS (never data) and write
 *             counts + hashes; a backup makes each recorded read/accept true locally
 *             (waits for exactly those bytes / that connection, no time cap) and
 *             writes exactly the recorded bytes, a differing hash being a divergence
 *             that names the connection and stream offset. Details: shim_group.c.
 * One refinement of "private", learnt from PySpark's collect(): the app's behaviour
 * can depend on how a private TCP stream is CHUNKED, not only on its bytes --
 * CPython's BufferedReader takes its lock only when its buffer cannot serve a read,
 * so the number of (ordered) lock operations follows the sizes recv() returned. So
 * the primary records the size of each read of a connected private TCP stream (never
 * the data) as a HINT: a backup that reads from its own peer waits a little (at most
 * PRIVATE_HINT_WAIT_MS) for that many bytes to be there and returns no more. A hint
 * is not a commitment: the JVM's answers may differ in content (ports, ids), so a
 * read with no matching hint passes through, and a hint nobody reads is skipped.
 * A peer INSIDE the process (fd.local_peer: the other end is one of the process's own
 * sockets, over loopback TCP or a unix socket -- asyncio talking to a server thread)
 * replays too, so there the hints are commitments: a backup reads exactly the primary's
 * count (waiting without a cap), a send takes exactly the primary's count (what its
 * kernel cannot take yet is queued and pushed by the waiting peer: pend_send; a blocking
 * send hands its bytes over before it learns the count: priv_send_blocking), EAGAIN is
 * returned without a call, and a loopback datagram socket's reads are hinted the same way.
 * The kind of an AF_INET socket is decided at the primary when it connects, and the
 * CONNECT record carries it, so a backup with no network agrees with the primary.
 * poll/select/epoll_wait are ordered when they watch at least one socket (group and
 * group listener included; only private ones are made true locally at a backup).
 */
#include "shim_internal.h"

struct fdent g_fd[MAX_FDS];

/* Loopback ports that are external (a server outside the replica's process tree). */
#define MAX_EXT_PORTS 32
static uint16_t g_ext_ports[MAX_EXT_PORTS];
static int g_n_ext_ports;

/* LLFT_EXTERNAL_PORTS=p,q,..., read before the shim strips it from the environment. */
void net_activate(void) {
    const char *ports = getenv("LLFT_EXTERNAL_PORTS");
    while (ports && *ports && g_n_ext_ports < MAX_EXT_PORTS) {
        char *end;
        long v = strtol(ports, &end, 10);
        if (end == ports) break;
        if (v > 0 && v < 65536) g_ext_ports[g_n_ext_ports++] = (uint16_t)v;
        ports = *end ? end + 1 : end;
    }
}

/* Fds whose readiness is ordered in poll/select/epoll_wait: every socket of the process
 * and every pipe (shim_process.c). Private ones are also real at a backup: see
 * enforce_ready(). */
static inline int fd_watched(int fd) {
    int k = fd_kind(fd);
    return k == FDK_EXTERNAL || k == FDK_PRIVATE || k == FDK_PRIVATE_STREAM || k == FDK_SOCK
        || k == FDK_GROUP || k == FDK_GROUP_LISTEN || k == FDK_PIPE;
}
/* Real at a backup too (private sockets, pipes to children): readiness made true locally. */
static inline int fd_local(int fd) {
    int k = fd_kind(fd);
    return k == FDK_PRIVATE || k == FDK_PRIVATE_STREAM || k == FDK_PIPE;
}

void fd_set_kind(int fd, int kind, uint64_t lid) {
    if (!fd_ok(fd)) return;
    free(g_fd[fd].g);   /* a stale entry (the fd was closed behind our back) */
    g_fd[fd].g = NULL;
    g_fd[fd].kind = (uint8_t)kind;
    g_fd[fd].lid = lid;
    g_fd[fd].ext_watch = 0;
    g_fd[fd].local_peer = 0;
    g_fd[fd].epfd = -1;
}
static void fd_forget(int fd) {
    if (!fd_ok(fd) || !g_fd[fd].kind) return;
    int ep = g_fd[fd].epfd;
    if (fd_watched(fd) && fd_ok(ep) && g_fd[ep].kind == FDK_EPOLL && g_fd[ep].ext_watch)
        g_fd[ep].ext_watch--;
    free(g_fd[fd].g);
    memset(&g_fd[fd], 0, sizeof g_fd[fd]);
}

static int addr_is_loopback(const struct sockaddr *a) {
    if (!a) return 0;
    if (a->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)a;
        return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    }
    if (a->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)a;
        static const uint8_t lo[16] = {0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,1};
        const uint8_t *b = in6->sin6_addr.s6_addr;
        if (!memcmp(b, lo, 16)) return 1;
        static const uint8_t v4m[12] = {0,0,0,0,0,0,0,0,0,0,0xff,0xff};
        return !memcmp(b, v4m, 12) && b[12] == 127;
    }
    return 0;
}
uint16_t addr_port(const struct sockaddr *a) {
    if (a->sa_family == AF_INET) return ntohs(((const struct sockaddr_in *)a)->sin_port);
    if (a->sa_family == AF_INET6) return ntohs(((const struct sockaddr_in6 *)a)->sin6_port);
    return 0;
}
static int sock_type(int fd) {
    int type = 0;
    socklen_t tl = sizeof type;
    return R(getsockopt)(fd, SOL_SOCKET, SO_TYPE, &type, &tl) == 0 ? type : 0;
}
/* Is a loopback listener on `port` owned by this process or one of its descendants?
 * Primary only, at connect time: /proc/net/tcp{,6} gives the LISTEN sockets' inodes,
 * /proc/<pid>/stat the parent links, /proc/<pid>/fd the owners. Fixed-size tables;
 * on any doubt (unreadable /proc, tables full) the answer is "no" (external), which
 * is the safe side: an external peer is recorded, a private one is not. */
#define TREE_MAX_PIDS 4096
#define TREE_MAX_INODES 16
static int read_small(const char *path, char *buf, size_t cap) {
    int fd = R(open)(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t n = 0;
    ssize_t k;
    while (n + 1 < cap && (k = R(read)(fd, buf + n, cap - 1 - n)) > 0) n += (size_t)k;
    R(close)(fd);
    buf[n] = 0;
    return (int)n;
}
static int listen_inodes(uint16_t port, unsigned long *inodes, int max) {
    static const char *files[] = {"/proc/net/tcp", "/proc/net/tcp6"};
    static char buf[1 << 18];
    int n = 0;
    for (int f = 0; f < 2; f++) {
        if (read_small(files[f], buf, sizeof buf) <= 0) continue;
        char *line = strchr(buf, '\n');
        while (line && *++line) {
            /* sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode */
            char local[64], st[8];
            unsigned long inode = 0;
            if (sscanf(line, "%*s %63s %*s %7s %*s %*s %*s %*s %*s %lu", local, st, &inode) == 3) {
                char *colon = strrchr(local, ':');
                if (colon && strtoul(colon + 1, NULL, 16) == port && !strcmp(st, "0A") && n < max)
                    inodes[n++] = inode;
            }
            line = strchr(line, '\n');
        }
    }
    return n;
}
static int in_process_tree(uint16_t port) {
    unsigned long inodes[TREE_MAX_INODES];
    int ni = listen_inodes(port, inodes, TREE_MAX_INODES);
    if (ni == 0) return 0;
    static int pids[TREE_MAX_PIDS], ppids[TREE_MAX_PIDS];
    int np = 0;
    DIR *d = opendir("/proc");
    if (!d) return 0;
    struct dirent *de;
    char path[64], buf[512];
    while ((de = readdir(d)) && np < TREE_MAX_PIDS) {
        int pid = atoi(de->d_name);
        if (pid <= 0) continue;
        snprintf(path, sizeof path, "/proc/%d/stat", pid);
        if (read_small(path, buf, sizeof buf) <= 0) continue;
        char *rp = strrchr(buf, ')');
        int ppid = 0;
        if (!rp || sscanf(rp + 2, "%*c %d", &ppid) != 1) continue;
        pids[np] = pid;
        ppids[np] = ppid;
        np++;
    }
    closedir(d);
    int found = 0;
    for (int i = 0; i < np && !found; i++) {
        int p = pids[i], hops = 0;   /* is pids[i] us or below us? */
        while (p > 1 && p != g_pid && hops++ < 64) {
            int next = 0;
            for (int j = 0; j < np; j++) if (pids[j] == p) { next = ppids[j]; break; }
            p = next;
        }
        if (p != g_pid) continue;
        snprintf(path, sizeof path, "/proc/%d/fd", pids[i]);
        DIR *fdd = opendir(path);
        if (!fdd) continue;
        while ((de = readdir(fdd)) && !found) {
            char lp[96], target[64];
            snprintf(lp, sizeof lp, "/proc/%d/fd/%s", pids[i], de->d_name);
            ssize_t k = readlink(lp, target, sizeof target - 1);
            if (k <= 0) continue;
            target[k] = 0;
            unsigned long ino;
            if (sscanf(target, "socket:[%lu]", &ino) == 1)
                for (int j = 0; j < ni; j++) if (inodes[j] == ino) { found = 1; break; }
        }
        closedir(fdd);
    }
    return found;
}

/* Is `port` a loopback port bound by one of this process's own sockets (other than
 * `self`) of this type? Its owner is in the process, so it runs at every replica:
 *  - a datagram port (logging's and socketserver's in-process UDP servers): the
 *    datagrams must really be sent there at a backup too;
 *  - a stream's peer port (a listener's at connect, a client's local port at accept):
 *    the other end replays the same program, so a backup may wait for it without a
 *    cap (fd.local_peer, see priv_recv/priv_send). */
static int own_port(int self, uint16_t port, int type) {
    for (int fd = 0; fd < MAX_FDS; fd++) {
        int k = g_fd[fd].kind;
        if (fd == self || !(k == FDK_PRIVATE || (type == SOCK_STREAM && (k == FDK_SOCK || k == FDK_PRIVATE_STREAM))))
            continue;
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int t = 0;
        socklen_t tl = sizeof t;
        if (R(getsockname)(fd, (struct sockaddr *)&ss, &sl) == 0
            && (ss.ss_family == AF_INET || ss.ss_family == AF_INET6)
            && addr_port((struct sockaddr *)&ss) == port
            && R(getsockopt)(fd, SOL_SOCKET, SO_TYPE, &t, &tl) == 0 && t == type)
            return 1;
    }
    return 0;
}
static int own_dgram_port(uint16_t port) { return own_port(-1, port, SOCK_DGRAM); }
/* A private stream's other end: one of our own sockets? (peer NULL: ask the kernel) A
 * unix stream's is ours if the kernel's credentials of its other end name this process
 * (the listener's creator for a client, the connecting process for an accepted one). */
static void note_local_peer(int fd, const struct sockaddr *peer) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (!peer && R(getpeername)(fd, (struct sockaddr *)&ss, &sl) == 0) peer = (struct sockaddr *)&ss;
    if (peer && peer->sa_family == AF_UNIX) {
        struct ucred uc;
        socklen_t ul = sizeof uc;
        g_fd[fd].local_peer = R(getsockopt)(fd, SOL_SOCKET, SO_PEERCRED, &uc, &ul) == 0 && uc.pid == g_pid;
        return;
    }
    g_fd[fd].local_peer = peer && addr_is_loopback(peer) && own_port(fd, addr_port(peer), SOCK_STREAM);
}
/* A unix stream connected to a listener of this process (asyncio's open_unix_connection
 * to a server thread): a private stream with its peer in the process, like a loopback
 * one -- read counts hinted, writes counted -- or a backup's reads are chunked by its
 * own timing (an SSL client read two session tickets at once, where the primary's
 * epoll had reported them one by one, and waited for a third). Other unix sockets stay
 * plain private ones. Not ordered: the other end is the same program everywhere. */
static int unix_connect(int fd, const struct sockaddr *a, socklen_t len) {
    int r = R(connect)(fd, a, len);
    int e = errno;
    if (r == 0 && sock_type(fd) == SOCK_STREAM) {
        note_local_peer(fd, NULL);
        if (g_fd[fd].local_peer) g_fd[fd].kind = FDK_PRIVATE_STREAM;
    }
    errno = e;
    return r;
}

static int classify_peer(const struct sockaddr *a) {
    if (!a || a->sa_family == AF_UNIX) return LLFT_SK_PRIVATE;
    if (a->sa_family != AF_INET && a->sa_family != AF_INET6) return LLFT_SK_PRIVATE;
    if (!addr_is_loopback(a)) return LLFT_SK_EXTERNAL;
    uint16_t p = addr_port(a);
    for (int i = 0; i < g_n_ext_ports; i++)
        if (g_ext_ports[i] == p) return LLFT_SK_EXTERNAL;
    /* loopback: private only if the listener is inside the replica's process tree */
    return in_process_tree(p) || own_dgram_port(p) ? LLFT_SK_PRIVATE : LLFT_SK_EXTERNAL;
}

uint32_t fnv1a(const void *p, size_t n, uint32_t h) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) { h ^= b[i]; h *= 16777619u; }
    return h;
}

#define GROUP_ENTER(fd) (active_here() && fd_kind(fd) == FDK_GROUP)

/* ---- creation ---- */

EXPORT int socket(int domain, int type, int proto) {
    int fd = R(socket)(domain, type, proto);
    if (fd >= 0 && active_here()) {
        if (domain == AF_INET || domain == AF_INET6) fd_set_kind(fd, FDK_SOCK, new_lid());
        else fd_set_kind(fd, FDK_PRIVATE, new_lid());
    }
    return fd;
}
EXPORT int socketpair(int d, int t, int p, int sv[2]) {
    int r = R(socketpair)(d, t, p, sv);
    if (r == 0 && active_here()) {
        fd_set_kind(sv[0], FDK_PRIVATE, new_lid());
        fd_set_kind(sv[1], FDK_PRIVATE, new_lid());
    }
    return r;
}
/* A port the program lets the kernel choose (bind to port 0) is the primary's at a
 * backup: programs send it to their own threads (ftplib's PASV reply "227 ...
 * (127,0,0,1,p1,p2)" and PORT command, test_ftplib), and a backup whose port had other
 * digits sent a message of another length to a reader held to the primary's counts. The
 * primary records the port; a backup binds to it, or, if it is taken there (replicas
 * sharing a host while the primary lives), to the kernel's choice as before. */
/* Backup: bind to the primary's `port` (0 if taken here). A stream binds past the port's
 * TIME_WAIT connections (the primary's, on one host), as the primary's kernel let it. */
static int bind_port(int fd, const struct sockaddr *a, socklen_t len, uint16_t port) {
    struct sockaddr_storage ss;
    if (len > sizeof ss) return -1;
    memcpy(&ss, a, len);
    if (ss.ss_family == AF_INET) ((struct sockaddr_in *)&ss)->sin_port = htons(port);
    else ((struct sockaddr_in6 *)&ss)->sin6_port = htons(port);
    int reuse = 0, on = 1;
    socklen_t rl = sizeof reuse;
    int stream = sock_type(fd) == SOCK_STREAM;
    if (stream) {
        R(getsockopt)(fd, SOL_SOCKET, SO_REUSEADDR, &reuse, &rl);
        if (!reuse) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    }
    int r = R(bind)(fd, (struct sockaddr *)&ss, len);
    int e = errno;
    if (stream && !reuse) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &reuse, sizeof reuse);
    if (r != 0 && g_debug) {
        char line[96];
        int k = snprintf(line, sizeof line, "llft[bind] t%d port %u is taken here (errno %d)\n",
                         t_tid, (unsigned)port, e);
        R(write)(2, line, (size_t)k);
    }
    return r;
}
static int port0_bind(int fd, const struct sockaddr *a, socklen_t len) {
    uint64_t op = thread_op();
    int r, e;
    struct bk b;
    if (replaying(&b, LLFT_C_BIND, op, NULL, 0)) {
        r = b.h.ret == 0 && b.h.aux ? bind_port(fd, a, len, (uint16_t)b.h.aux) : -1;
        if (r != 0) r = R(bind)(fd, a, len);
        e = r ? errno : 0;
        bk_end(&b);
    } else {
        r = R(bind)(fd, a, len);
        e = r ? errno : 0;
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        uint16_t port = r == 0 && R(getsockname)(fd, (struct sockaddr *)&ss, &sl) == 0
                        ? addr_port((struct sockaddr *)&ss) : 0;
        pr_append(LLFT_C_BIND, op, r, e, port, 0, NULL, 0);
    }
    errno = e ? e : errno;
    return r;
}

EXPORT int bind(int fd, const struct sockaddr *a, socklen_t len) {
    if (active_here() && fd_kind(fd) == FDK_SOCK && is_service_addr(fd, a, len))
        return GUARDED(group_bind(fd, a, len));
    int r = active_here() && fd_kind(fd) == FDK_SOCK && a && len >= sizeof(struct sockaddr_in)
            && (a->sa_family == AF_INET || a->sa_family == AF_INET6) && addr_port(a) == 0
            ? GUARDED(port0_bind(fd, a, len)) : R(bind)(fd, a, len);
    if (active_here() && fd_kind(fd) == FDK_SOCK && addr_is_loopback(a)) {
        int e = errno;
        g_fd[fd].kind = FDK_PRIVATE;  /* a loopback server serves the process tree */
        g_fd[fd].local_peer = sock_type(fd) == SOCK_DGRAM;   /* its clients: see priv_dgram_recv */
        errno = e;
    }
    return r;
}
EXPORT int epoll_create1(int flags) {
    int fd = R(epoll_create1)(flags);
    if (fd >= 0 && active_here()) fd_set_kind(fd, FDK_EPOLL, new_lid());
    return fd;
}
EXPORT int epoll_create(int size) {
    int fd = R(epoll_create)(size);
    if (fd >= 0 && active_here()) fd_set_kind(fd, FDK_EPOLL, new_lid());
    return fd;
}
EXPORT int epoll_ctl(int ep, int op, int fd, struct epoll_event *ev) {
    int r = R(epoll_ctl)(ep, op, fd, ev);
    if (g_active && !t_guard && fd_kind(ep) == FDK_EPOLL && fd_watched(fd)) {
        /* at a backup the dummy socket may refuse; the primary's answer is what counts */
        if (op == EPOLL_CTL_ADD && g_fd[fd].epfd != ep) { g_fd[ep].ext_watch++; g_fd[fd].epfd = ep; }
        else if (op == EPOLL_CTL_DEL && g_fd[fd].epfd == ep) {
            if (g_fd[ep].ext_watch) g_fd[ep].ext_watch--;
            g_fd[fd].epfd = -1;
        }
        if (backup_now() && r != 0 && fd_kind(fd) == FDK_EXTERNAL) { errno = 0; r = 0; }
    }
    return r;
}

/* A backup's send queue for in-process peers. The primary's kernel took r bytes of a
 * send at once; a backup's may have less room at that moment (socket buffers are sized
 * by the kernel's timing), and waiting for room can deadlock: the reader may be ordered
 * to read only after the sender's next step. So a backup returns the primary's count and
 * queues what its kernel did not take yet; the queue is written out (never blocking)
 * by the next send on that socket and by every wait in which a thread needs a private
 * socket's bytes or readiness (priv_recv, enforce_ready): the peer that waits for the
 * bytes is in the process, so it is the one that pushes them. A socket closed with bytes
 * queued is kept open (a dup) until they are out. */
#define MAX_PENDING 32
static struct pend { int fd, dup, shut; char *buf; size_t off, len; } g_pend[MAX_PENDING];
static int g_npend, g_pend_lock;
static void pend_lock(void) { while (__atomic_exchange_n(&g_pend_lock, 1, __ATOMIC_ACQUIRE)) sched_yield(); }
static void pend_unlock(void) { __atomic_store_n(&g_pend_lock, 0, __ATOMIC_RELEASE); }
static int pend_find(int fd) {
    for (int i = 0; i < g_npend; i++) if (g_pend[i].fd == fd && g_pend[i].dup < 0) return i;
    return -1;
}
/* Write what the kernel takes now; drop drained queues. Lock held. */
static void pend_push_locked(void) {
    for (int i = 0; i < g_npend;) {
        struct pend *q = &g_pend[i];
        int fd = q->dup >= 0 ? q->dup : q->fd;
        ssize_t k = 1;
        while (q->off < q->len && k > 0) {
            k = R(send)(fd, q->buf + q->off, q->len - q->off, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (k > 0) q->off += (size_t)k;
        }
        if (q->off < q->len && (k < 0 && (errno == EAGAIN || errno == EINTR))) { i++; continue; }
        free(q->buf);   /* drained, or the peer is gone */
        if (q->shut) R(shutdown)(fd, q->shut - 1);
        if (q->dup >= 0) R(close)(q->dup);
        *q = g_pend[--g_npend];
    }
}
static void pend_push(void) {
    if (!__atomic_load_n(&g_npend, __ATOMIC_RELAXED)) return;
    int e = errno;
    pend_lock();
    pend_push_locked();
    pend_unlock();
    errno = e;
}
/* Queue bytes [0, n) of a send the primary's kernel took whole: 1, or 0 when the queue
 * table is full (the caller then waits for room). */
static int pend_send(int fd, const char *buf, size_t n, int flags) {
    pend_lock();
    pend_push_locked();
    int i = pend_find(fd);
    size_t done = 0;
    if (i < 0) {   /* nothing queued: straight to the kernel */
        ssize_t k = 1;
        while (done < n && k > 0) {
            k = R(send)(fd, buf + done, n - done, (flags & ~MSG_DONTWAIT) | MSG_DONTWAIT | MSG_NOSIGNAL);
            if (k > 0) done += (size_t)k;
        }
        if (done == n || (k < 0 && errno != EAGAIN && errno != EINTR)) { pend_unlock(); return 1; }
        if (g_npend == MAX_PENDING) { pend_unlock(); return 0; }
        i = g_npend;
        g_pend[i] = (struct pend){fd, -1, 0, NULL, 0, 0};
        __atomic_store_n(&g_npend, g_npend + 1, __ATOMIC_RELAXED);
    }
    struct pend *q = &g_pend[i];
    char *nb = realloc(q->buf, q->len - q->off + n - done);
    if (nb) {
        memmove(nb, nb + q->off, q->len - q->off);
        memcpy(nb + q->len - q->off, buf + done, n - done);
        q->len = q->len - q->off + n - done;
        q->off = 0;
        q->buf = nb;
    }
    pend_unlock();
    return nb != NULL;
}
/* shutdown() of a socket with bytes queued: done once they are out; 1 if deferred. */
static int pend_shutdown(int fd, int how) {
    pend_lock();
    int i = pend_find(fd);
    if (i >= 0) g_pend[i].shut = how + 1;
    pend_unlock();
    return i >= 0;
}
/* close() of a socket with bytes queued: they go out later through a dup. */
static void pend_close(int fd) {
    pend_lock();
    int i = pend_find(fd);
    if (i >= 0) g_pend[i].dup = (int)syscall(SYS_dup, fd);
    pend_unlock();
}

/* Bytes a backup handed over ahead of the program (see priv_send_blocking). */
#define MAX_AHEAD 16
static struct ahead { int fd; size_t len; uint32_t hash; } g_ahead[MAX_AHEAD];
static int g_nahead;
static struct ahead *ahead_of(int fd, int make) {
    for (int i = 0; i < g_nahead; i++) if (g_ahead[i].fd == fd) return &g_ahead[i];
    if (!make || g_nahead == MAX_AHEAD) return NULL;
    g_ahead[g_nahead] = (struct ahead){fd, 0, 0};
    return &g_ahead[g_nahead++];
}
static void ahead_forget(int fd) {
    pend_lock();
    for (int i = 0; i < g_nahead; i++)
        if (g_ahead[i].fd == fd) { g_ahead[i] = g_ahead[--g_nahead]; break; }
    pend_unlock();
}
/* How many of buf's n bytes are out already; a send that does not repeat them diverges. */
static size_t ahead_covers(int fd, const void *buf, size_t n) {
    pend_lock();
    struct ahead *a = ahead_of(fd, 0);
    size_t m = a ? (a->len < n ? a->len : n) : 0;
    int bad = a && m == a->len && fnv1a(buf, m, 2166136261u) != a->hash;
    pend_unlock();
    if (bad)
        diverge("divergence: thread %d call #%llu: a write to an in-process peer does not "
                "repeat the %zu bytes the interrupted write before it had handed over",
                t_tid, (unsigned long long)t_n, m);
    return m;
}
/* The program's count r of a send whose bytes [0, n) are out: [r, n) stay ahead. */
static void ahead_settle(int fd, const void *buf, size_t n, ssize_t r) {
    size_t done = r > 0 ? (size_t)r : 0;
    pend_lock();
    struct ahead *a = ahead_of(fd, done < n);
    if (a && done >= n) *a = g_ahead[--g_nahead];
    else if (a) {
        a->len = n - done;
        a->hash = fnv1a((const char *)buf + done, n - done, 2166136261u);
    }
    pend_unlock();
}
EXPORT int close(int fd) {
    if (g_active && fd_ok(fd) && g_fd[fd].kind) {
        /* a vfork child shares our memory: only the process itself forgets its fds */
        if ((pid_t)syscall(SYS_getpid) == g_pid) {
            if (g_fd[fd].kind == FDK_GROUP_LISTEN) group_unpublish(fd);
            if (g_fd[fd].kind == FDK_GROUP) group_closing(fd);
            if (g_fd[fd].local_peer && g_npend) pend_close(fd);
            if (g_fd[fd].local_peer && g_nahead) ahead_forget(fd);
            fd_forget(fd);
        }
    }
    return R(close)(fd);
}

/* ---- connect / accept ---- */

static int connect_ordered(int fd, const struct sockaddr *a, socklen_t len) {
    uint64_t op = fd_op(fd);
    int r, e, kind;
    struct bk b;
    if (replaying(&b, LLFT_C_CONNECT, op, NULL, 0)) {
        kind = b.h.flags;
        r = (int)b.h.ret;
        e = b.h.err;
        if (kind == LLFT_SK_PRIVATE && (r == 0 || e == EINPROGRESS)) {
            /* a private peer really is connected to, and the primary's outcome is kept:
             * 0 waits (without the GIL) until a non-blocking connect completes here */
            int rr = R(connect)(fd, a, len);
            if (rr != 0 && errno == EINPROGRESS && r == 0) {
                struct pollfd pf = {fd, POLLOUT, 0};
                if (!b.gil) b.gil = gil_drop();
                R(poll)(&pf, 1, 30000);
            }
        }
        bk_end(&b);
    } else {
        kind = classify_peer(a);
        r = R(connect)(fd, a, len);
        e = r ? errno : 0;
        pr_append(LLFT_C_CONNECT, op, r, e, 0, (uint16_t)kind, NULL, 0);
    }
    if (kind != LLFT_SK_PRIVATE) g_fd[fd].kind = FDK_EXTERNAL;
    else {
        int type = 0;
        socklen_t tl = sizeof type;
        R(getsockopt)(fd, SOL_SOCKET, SO_TYPE, &type, &tl);
        g_fd[fd].kind = type == SOCK_STREAM ? FDK_PRIVATE_STREAM : FDK_PRIVATE;
        if (type == SOCK_STREAM) note_local_peer(fd, a);
        else if (type == SOCK_DGRAM) g_fd[fd].local_peer = addr_is_loopback(a) && own_dgram_port(addr_port(a));
    }
    errno = e ? e : errno;
    return r;
}
EXPORT int connect(int fd, const struct sockaddr *a, socklen_t len) {
    if (active_here() && fd_kind(fd) == FDK_PRIVATE && a && a->sa_family == AF_UNIX)
        return GUARDED(unix_connect(fd, a, len));
    HOOK(fd_kind(fd) == FDK_SOCK, R(connect)(fd, a, len), connect_ordered(fd, a, len));
}

static int external_accept(int fd, struct sockaddr *a, socklen_t *alen, int flags, int four);
static int accept_common(int fd, struct sockaddr *a, socklen_t *alen, int flags, int four) {
    if (active_here() && fd_kind(fd) == FDK_GROUP_LISTEN) return GUARDED(group_accept(fd, a, alen, flags, four));
    if (active_here() && fd_kind(fd) == FDK_PRIVATE) {
        /* a private server (py4j callback, PySpark's accumulator server): real, not
         * recorded; the connection is a private stream (read sizes hinted). A blocking
         * accept first waits in poll: the kernel takes the connection's fd number when
         * accept is ENTERED, so a thread blocked in it would reserve the lowest free
         * number while the others create fds -- an order a backup does not repeat
         * (asyncio's epoll reports fd numbers: another number is another callback). */
        if (!(fcntl(fd, F_GETFL) & O_NONBLOCK)) {
            struct pollfd pf = {fd, POLLIN, 0};
            if (R(poll)(&pf, 1, -1) < 0) return -1;
        }
        int r = four ? R(accept4)(fd, a, alen, flags) : R(accept)(fd, a, alen);
        if (r >= 0) {
            int e = errno;
            fd_set_kind(r, FDK_PRIVATE_STREAM, new_lid());
            note_local_peer(r, NULL);
            errno = e;
        }
        return r;
    }
    HOOK(fd_kind(fd) == FDK_SOCK, four ? R(accept4)(fd, a, alen, flags) : R(accept)(fd, a, alen),
         external_accept(fd, a, alen, flags, four));
}
EXPORT int accept(int fd, struct sockaddr *a, socklen_t *alen) { return accept_common(fd, a, alen, 0, 0); }
EXPORT int accept4(int fd, struct sockaddr *a, socklen_t *alen, int fl) { return accept_common(fd, a, alen, fl, 1); }

/* An accept on a listener of the app's own that is neither private nor the group's:
 * its clients are external. */
static int external_accept(int fd, struct sockaddr *a, socklen_t *alen, int flags, int four) {
    uint64_t op = fd_op(fd);
    int r, e;
    struct bk b;
    struct sockaddr_storage ss;
    if (replaying(&b, LLFT_C_ACCEPT, op, &ss, sizeof ss)) {
        r = (int)b.h.ret;
        e = b.h.err;
        if (r >= 0) {  /* an external client: a dummy socket stands for it */
            r = R(socket)(((struct sockaddr *)&ss)->sa_family ? ((struct sockaddr *)&ss)->sa_family : AF_INET,
                          SOCK_STREAM | ((flags & SOCK_CLOEXEC) ? SOCK_CLOEXEC : 0), 0);
            if (a && alen) {
                socklen_t n = b.h.dlen < *alen ? b.h.dlen : *alen;
                memcpy(a, &ss, n);
                *alen = b.h.dlen;
            }
        }
        bk_end(&b);
    } else {
        socklen_t sl = sizeof ss;
        r = four ? R(accept4)(fd, (struct sockaddr *)&ss, &sl, flags)
                 : R(accept)(fd, (struct sockaddr *)&ss, &sl);
        e = r < 0 ? errno : 0;
        if (r >= 0 && a && alen) {
            socklen_t n = sl < *alen ? sl : *alen;
            memcpy(a, &ss, n);
            *alen = sl;
        }
        pr_append(LLFT_C_ACCEPT, op, r, e, 0, 0, &ss, r >= 0 ? sl : 0);
    }
    if (r >= 0) fd_set_kind(r, FDK_EXTERNAL, new_lid());
    errno = e ? e : errno;
    return r;
}

/* ---- data ---- */

/* Reads of an external socket. The primary clamps the size to what one record holds
 * (a short read is legal on a stream socket). Payload = data, then the source address. */
static ssize_t ext_recv(int fd, void *buf, size_t n, int flags, struct sockaddr *src,
                        socklen_t *srclen, int kindcall) {
    uint64_t op = fd_op(fd);
    if (n > LLFT_MAX_DATA_BYTES - 128) n = LLFT_MAX_DATA_BYTES - 128;
    ssize_t r;
    int e;
    struct bk b;
    static TLS uint8_t scratch[LLFT_MAX_DATA_BYTES];
    if (replaying(&b, LLFT_C_RECV, op, scratch, sizeof scratch)) {
        r = (ssize_t)b.h.ret;
        e = b.h.err;
        uint32_t nd = b.h.dlen - b.h.aux;  /* aux = address bytes at the end */
        if (r > 0 && (size_t)r > n)
            diverge("divergence: thread %d call #%llu recv: the trace read %zd bytes, the program "
                    "asked for %zu", t_tid, (unsigned long long)t_n, r, n);
        if (nd) memcpy(buf, scratch, nd);
        if (src && srclen) {
            socklen_t k = b.h.aux < *srclen ? b.h.aux : *srclen;
            memcpy(src, scratch + nd, k);
            *srclen = b.h.aux;
        }
        bk_end(&b);
    } else {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        if (kindcall == 1) r = R(read)(fd, buf, n);
        else if (kindcall == 2) r = R(recvfrom)(fd, buf, n, flags, (struct sockaddr *)&ss, &sl);
        else r = R(recv)(fd, buf, n, flags);
        e = r < 0 ? errno : 0;
        uint32_t nd = r > 0 ? (uint32_t)r : 0, na = 0;
        memcpy(scratch, buf, nd);
        if (kindcall == 2 && r >= 0 && src && srclen) {
            na = sl > sizeof ss ? sizeof ss : sl;
            memcpy(scratch + nd, &ss, na);
            socklen_t k = na < *srclen ? na : *srclen;
            memcpy(src, &ss, k);
            *srclen = sl;
        }
        pr_append(LLFT_C_RECV, op, r, e, na, 0, scratch, nd + na);
    }
    errno = e ? e : errno;
    return r;
}

/* Output commit before an external send (ctl.commit_*, native/llft_shm.h): the bytes
 * leave only once every backup holds every entry recorded before them, so the server
 * never sees an effect of an execution a successor would not reproduce (a Spark Connect
 * client released results the new primary's replay had not received yet, and its
 * reattach found them gone). Python sends without the GIL; the wait is a futex. */
static void ext_commit(void) {
    struct llft_ctl *c = g_ctl;
    if (!__atomic_load_n(&c->commit_on, __ATOMIC_ACQUIRE)) return;
    uint32_t t = __atomic_add_fetch(&c->commit_req, 1, __ATOMIC_ACQ_REL);
    __atomic_fetch_add(&c->stats[LLFT_ST_COMMITS], 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&g_shm->out.pub_seq, 1, __ATOMIC_ACQ_REL);   /* the drainer looks */
    llft_futex_wake_all(&g_shm->out.pub_seq, 1);
    llft_futex_wake_all(&c->commit_req, 1);     /* ... also while it naps (shm_build.py dw_nap) */
    for (;;) {
        uint32_t done = __atomic_load_n(&c->commit_done, __ATOMIC_ACQUIRE);
        if ((int32_t)(done - t) >= 0 || !__atomic_load_n(&c->commit_on, __ATOMIC_ACQUIRE)) return;
        llft_futex(&c->commit_done, FUTEX_WAIT, done, WAIT_SLICE_MS);
    }
}

static ssize_t ext_send(int fd, const void *buf, size_t n, int flags,
                        const struct sockaddr *dst, socklen_t dlen, int kindcall) {
    uint64_t op = fd_op(fd);
    ssize_t r;
    int e;
    struct bk b;
    if (replaying(&b, LLFT_C_SEND, op, NULL, 0)) {
        r = (ssize_t)b.h.ret;
        e = b.h.err;
        if (r > 0 && ((size_t)r > n || fnv1a(buf, (size_t)r, 2166136261u) != b.h.aux))
            diverge("divergence: thread %d call #%llu send(%s): the program wrote different bytes "
                    "than the trace (%zu asked, %zd recorded)", t_tid, (unsigned long long)t_n,
                    "external", n, r);
        bk_end(&b);
    } else {
        ext_commit();
        if (kindcall == 1) r = R(write)(fd, buf, n);
        else if (kindcall == 2) r = R(sendto)(fd, buf, n, flags, dst, dlen);
        else r = R(send)(fd, buf, n, flags);
        e = r < 0 ? errno : 0;
        pr_append(LLFT_C_SEND, op, r, e, r > 0 ? fnv1a(buf, (size_t)r, 2166136261u) : 0, 0, NULL, 0);
    }
    errno = e ? e : errno;
    return r;
}

#define PRIVATE_HINT_WAIT_MS 200
#define PRIV_HINT_SEND 1   /* flags of a PRIVATE_RECV record that hints a send's count */

/* A read of a connected private TCP stream: its size is a hint (see the top). A peer in
 * the process (local_peer) replays too and will write what the primary's peer wrote,
 * so for it the hint is a commitment: a backup returns the primary's error (EAGAIN)
 * without reading, waits for its EOF, or reads exactly its count, waiting without a cap
 * (stall-checked) -- a capped wait read fewer bytes under load and made an extra read
 * (test_asyncio.test_sock_lowlevel, tests/programs/inprocess_stream.py). */
static ssize_t priv_recv(int fd, void *buf, size_t n, int flags, int kindcall) {
    uint64_t op = fd_op(fd);
    ssize_t r;
    int e;
    struct bk b;
    int got = backup_now() ? bk_begin(&b, LLFT_C_PRIVATE_RECV, op, NULL, 0) : BK_PRIMARY;
    if (got == BK_RECORD && b.h.flags == PRIV_HINT_SEND) {   /* a send's hint: not ours */
        bk_end(&b);
        got = BK_NO_HINT;
    }
    int local = g_fd[fd].local_peer && !(flags & MSG_PEEK);
    if (got == BK_RECORD && local) {
        /* exactly the primary's outcome: its error without reading, or its count, read
         * in as many real reads as this kernel needs (its buffer may hold less) */
        r = b.h.ret < 0 ? -1 : 0;
        e = b.h.ret < 0 ? b.h.err : 0;
        size_t want = b.h.ret > 0 && (size_t)b.h.ret < n ? (size_t)b.h.ret : n, have = 0;
        struct stallw sw = {0, 0};
        while (r == 0) {
            ssize_t k = b.h.ret == 0 ? R(recv)(fd, buf, 1, MSG_PEEK | MSG_DONTWAIT)   /* its EOF */
                                     : R(recv)(fd, (char *)buf + have, want - have,
                                               (flags & ~MSG_WAITALL) | MSG_DONTWAIT);
            if (b.h.ret == 0 && k >= 0) break;
            if (k > 0 && (have += (size_t)k) == want) break;
            if (k == 0) break;
            if (k < 0 && errno != EAGAIN && errno != EINTR) {
                if (!have) { r = -1; e = errno; }
                break;
            }
            if (k > 0) continue;
            pend_push();   /* they may be queued at this backup (see pend_send) */
            if (!b.gil) b.gil = gil_drop();
            struct pollfd pf = {fd, POLLIN, 0};
            R(poll)(&pf, 1, WAIT_SLICE_MS);
            stall_check(&sw, "the bytes an in-process peer had sent at the primary", b.h.call, b.h.op);
        }
        if (r == 0) r = (ssize_t)have;
        bk_end(&b);
    } else if (got == BK_RECORD) {
        size_t want = n;
        if (b.h.ret > 0 && (size_t)b.h.ret < n) want = (size_t)b.h.ret;
        if (b.h.ret > 0 && !(flags & MSG_PEEK)) {
            /* give the peer a moment to have sent what the primary's peer had */
            int64_t until = mono_ns() + PRIVATE_HINT_WAIT_MS * 1000000LL;
            for (;;) {
                ssize_t k = R(recv)(fd, buf, want, MSG_PEEK | MSG_DONTWAIT);
                if (k == (ssize_t)want || k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) break;
                if (mono_ns() > until) break;
                if (!b.gil) b.gil = gil_drop();
                struct pollfd pf = {fd, POLLIN, 0};
                if (k > 0) { struct timespec ms = {0, 500000}; R(nanosleep)(&ms, NULL); }
                else R(poll)(&pf, 1, 10);
            }
        }
        if (!b.gil && !(flags & MSG_DONTWAIT)) b.gil = gil_drop();  /* it may block */
        r = kindcall == 1 ? R(read)(fd, buf, want) : R(recv)(fd, buf, want, flags);
        e = r < 0 ? errno : 0;
        bk_end(&b);
    } else if (got == BK_NO_HINT) {
        r = kindcall == 1 ? R(read)(fd, buf, n) : R(recv)(fd, buf, n, flags);
        e = r < 0 ? errno : 0;
    } else {
        r = kindcall == 1 ? R(read)(fd, buf, n) : R(recv)(fd, buf, n, flags);
        e = r < 0 ? errno : 0;
        if (n && !(flags & MSG_PEEK)) note_private_end(r, e);
        pr_append(LLFT_C_PRIVATE_RECV, op, r, e, 0, 0, NULL, 0);
    }
    errno = e ? e : errno;
    return r;
}

/* A write to a private stream whose peer is in the process (local_peer): how much the
 * primary's kernel took is recorded as a hint; a backup takes exactly that much (sent,
 * or queued: see above) and returns the primary's result, or its error (EAGAIN) without
 * writing. So a non-blocking sender (asyncio's sock_sendall) makes the same sends and
 * readiness waits, and its peer's hinted reads find their bytes. */
#define PRIV_SEND_NB(fd, flags) (((flags) & MSG_DONTWAIT) || (fcntl(fd, F_GETFL) & O_NONBLOCK))
static ssize_t priv_send(int fd, const void *buf, size_t n, int flags, int kindcall) {
    uint64_t op = fd_op(fd);
    ssize_t r;
    int e;
    struct bk b;
    int got = backup_now() ? bk_begin(&b, LLFT_C_PRIVATE_RECV, op, NULL, 0) : BK_PRIMARY;
    if (got == BK_RECORD && b.h.flags == PRIV_HINT_SEND && b.h.ret <= (int64_t)n) {
        r = (ssize_t)b.h.ret;
        e = b.h.err;
        struct stallw sw = {0, 0};
        while (r > 0 && !pend_send(fd, buf, (size_t)r, flags)) {   /* table full: wait */
            if (!b.gil) b.gil = gil_drop();
            struct timespec ms = {0, 1000000};
            R(nanosleep)(&ms, NULL);
            stall_check(&sw, "room for the bytes the primary sent to an in-process peer",
                        b.h.call, b.h.op);
        }
        bk_end(&b);
    } else {
        if (got == BK_RECORD) bk_end(&b);   /* a read's hint, or a larger send: pass through */
        r = kindcall == 1 ? R(write)(fd, buf, n) : R(send)(fd, buf, n, flags);
        e = r < 0 ? errno : 0;
        if (got == BK_PRIMARY) pr_append(LLFT_C_PRIVATE_RECV, op, r, e, 0, PRIV_HINT_SEND, NULL, 0);
    }
    errno = e ? e : errno;
    return r;
}

/* A BLOCKING write to a private stream whose peer is in the process. The primary's kernel
 * takes the bytes as the peer reads them and the call returns when all are in, or
 * earlier if a signal interrupts it (test_socketserver's 16 MB write, interrupted by
 * another thread's pthread_kill): its count is recorded when it returns, AFTER the
 * peer's reads of those bytes. So a backup cannot wait for that record before writing:
 * it hands the whole buffer over at once (sent, or queued for the reading peer to push:
 * pend_send) and then waits for the primary's count. What it handed over beyond that
 * count is AHEAD of the program, which sends those bytes again (sendall sends the rest):
 * that send finds them out already (checked by hash) and skips them. A backup that made
 * the real blocking call instead blocked where the primary had not (its kernel buffers
 * are its own), with the peer waiting for this thread's next ordered call: a deadlock. */
static ssize_t priv_send_blocking(int fd, const void *buf, size_t n, int flags, int kindcall) {
    uint64_t op = fd_op(fd);
    ssize_t r;
    int e = 0;
    size_t out = ahead_covers(fd, buf, n);   /* bytes a backup (or this, before a promotion) sent */
    if (!backup_now()) {
        r = (ssize_t)out;
        if (out < n || n == 0) {
            ssize_t k = kindcall == 1 ? R(write)(fd, (const char *)buf + out, n - out)
                                      : R(send)(fd, (const char *)buf + out, n - out, flags);
            if (k >= 0) r += k;
            else if (!out) { r = -1; e = errno; }
        }
        ahead_settle(fd, buf, (size_t)out, r);
        pr_append(LLFT_C_PRIVATE_RECV, op, r, e, 0, PRIV_HINT_SEND, NULL, 0);
        errno = e ? e : errno;
        return r;
    }
    struct stallw sw = {0, 0};
    while (out < n && !pend_send(fd, (const char *)buf + out, n - out, flags)) {   /* table full */
        struct timespec ms = {0, 1000000};
        R(nanosleep)(&ms, NULL);
        stall_check(&sw, "room for the bytes the primary sent to an in-process peer", LLFT_C_PRIVATE_RECV, op);
    }
    struct bk b;
    int got = bk_begin(&b, LLFT_C_PRIVATE_RECV, op, NULL, 0);
    if (got == BK_RECORD && b.h.flags == PRIV_HINT_SEND && b.h.ret <= (int64_t)n) {
        r = (ssize_t)b.h.ret;
        e = b.h.err;
        bk_end(&b);
    } else {
        /* promoted meanwhile (BK_PRIMARY), or no count of the primary's here: its socket
         * did not see a peer in the process (the peer closed before the accept looked):
         * its blocking write took all n, as this one did */
        r = (ssize_t)n;
        if (got == BK_RECORD) bk_end(&b);
        else if (got == BK_PRIMARY) pr_append(LLFT_C_PRIVATE_RECV, op, r, 0, 0, PRIV_HINT_SEND, NULL, 0);
    }
    ahead_settle(fd, buf, n, r);
    errno = e ? e : errno;
    return r;
}
/* Any write to a private stream whose peer is in the process. */
static ssize_t priv_send_local(int fd, const void *buf, size_t n, int flags, int kindcall) {
    return PRIV_SEND_NB(fd, flags) ? priv_send(fd, buf, n, flags, kindcall)
                                   : priv_send_blocking(fd, buf, n, flags, kindcall);
}

/* A read of a loopback datagram socket of the process's own (local_peer: a server bound
 * to loopback, or a client of one): whether a datagram was there is timing (asyncio's
 * non-blocking recvfrom right after its sendto to an in-process echo server,
 * test_asyncio.test_sock_lowlevel). The primary records the outcome as a hint; a backup
 * returns the primary's error (EAGAIN) without reading, or waits (stall-checked) until
 * a datagram is there and reads it for real: its sender is in the process and replays. */
static ssize_t priv_dgram_recv(int fd, void *buf, size_t n, int flags, struct sockaddr *src,
                               socklen_t *sl) {
    uint64_t op = fd_op(fd);
    ssize_t r;
    int e;
    struct bk b;
    int got = backup_now() ? bk_begin(&b, LLFT_C_PRIVATE_RECV, op, NULL, 0) : BK_PRIMARY;
    if (got == BK_RECORD && b.h.ret < 0 && b.h.flags != PRIV_HINT_SEND) {
        r = -1;
        e = b.h.err;
        bk_end(&b);
    } else if (got == BK_RECORD) {
        struct stallw sw = {0, 0};
        struct pollfd pf = {fd, POLLIN, 0};
        while (b.h.flags != PRIV_HINT_SEND && R(poll)(&pf, 1, 0) == 0) {
            if (!b.gil) b.gil = gil_drop();
            R(poll)(&pf, 1, WAIT_SLICE_MS);
            stall_check(&sw, "a datagram an in-process peer had sent at the primary", b.h.call, b.h.op);
        }
        r = R(recvfrom)(fd, buf, n, flags, src, sl);
        e = r < 0 ? errno : 0;
        bk_end(&b);
    } else {
        r = R(recvfrom)(fd, buf, n, flags, src, sl);
        e = r < 0 ? errno : 0;
        if (got == BK_PRIMARY) pr_append(LLFT_C_PRIVATE_RECV, op, r, e, 0, 0, NULL, 0);
    }
    errno = e ? e : errno;
    return r;
}

/* An unconnected datagram socket meets its peer at sendto/recvfrom: any peer but a
 * unix socket or a loopback port of the process's own is external (decided from the
 * address and the process's own sockets, so every replica agrees without a record). */
static int dgram_external(int fd, const struct sockaddr *peer) {
    if (fd_kind(fd) != FDK_SOCK) return 0;
    int type = 0;
    socklen_t tl = sizeof type;
    if (R(getsockopt)(fd, SOL_SOCKET, SO_TYPE, &type, &tl) != 0 || type != SOCK_DGRAM) return 0;
    if (peer && peer->sa_family == AF_UNIX) return 0;
    if (peer && addr_is_loopback(peer) && own_dgram_port(addr_port(peer))) {
        g_fd[fd].kind = FDK_PRIVATE;
        g_fd[fd].local_peer = 1;
        return 0;
    }
    g_fd[fd].kind = FDK_EXTERNAL;
    return 1;
}

#define EXT_ENTER(fd) (active_here() && fd_kind(fd) == FDK_EXTERNAL)
#define PRIV_ENTER(fd) (active_here() && fd_kind(fd) == FDK_PRIVATE_STREAM)
#define PRIV_SEND_ENTER(fd) (PRIV_ENTER(fd) && g_fd[fd].local_peer)
#define PRIV_DGRAM_ENTER(fd) (active_here() && fd_kind(fd) == FDK_PRIVATE && g_fd[fd].local_peer)

EXPORT ssize_t read(int fd, void *buf, size_t n) {
    if (!active_here() || !fd_ok(fd)) return R(read)(fd, buf, n);
    int k = g_fd[fd].kind;
    if (k == FDK_RANDOM) return GUARDED(random_call(LLFT_C_READ_RANDOM, fd, buf, n, 0));
    if (k == FDK_EXTERNAL) return GUARDED(ext_recv(fd, buf, n, 0, NULL, NULL, 1));
    if (k == FDK_PRIVATE_STREAM) return GUARDED(priv_recv(fd, buf, n, 0, 1));
    if (k == FDK_PRIVATE && g_fd[fd].local_peer) return GUARDED(priv_dgram_recv(fd, buf, n, 0, NULL, NULL));
    if (k == FDK_GROUP) return GUARDED(group_recv_buf(fd, buf, n, 0, NULL, NULL));
    if (k == FDK_PIPE) return GUARDED(pipe_read(fd, buf, n));
    return R(read)(fd, buf, n);
}
/* LLFT_DEBUG=2: also log the sizes of private reads (pass-through, not recorded), to
 * see when a private peer's chunking is what makes a replay diverge. */
static void debug_private(const char *what, int fd, ssize_t r) {
    char line[96];
    int k = snprintf(line, sizeof line, "llft[private] t%d %s fd %d -> %zd\n", t_tid, what, fd, r);
    R(write)(2, line, (size_t)(k > 0 && k < (int)sizeof line ? k : 0));
}

EXPORT ssize_t recv(int fd, void *buf, size_t n, int flags) {
    if (g_debug > 1 && active_here() && fd_kind(fd) == FDK_PRIVATE && !g_fd[fd].local_peer) {
        ssize_t r = R(recv)(fd, buf, n, flags);
        int e = errno;
        debug_private("recv", fd, r);
        errno = e;
        return r;
    }
    if (PRIV_ENTER(fd)) return GUARDED(priv_recv(fd, buf, n, flags, 0));
    if (PRIV_DGRAM_ENTER(fd)) return GUARDED(priv_dgram_recv(fd, buf, n, flags, NULL, NULL));
    if (GROUP_ENTER(fd)) return GUARDED(group_recv_buf(fd, buf, n, flags, NULL, NULL));
    if (!EXT_ENTER(fd)) return R(recv)(fd, buf, n, flags);
    return GUARDED(ext_recv(fd, buf, n, flags, NULL, NULL, 0));
}
EXPORT ssize_t recvfrom(int fd, void *buf, size_t n, int flags, struct sockaddr *src, socklen_t *sl) {
    if (PRIV_ENTER(fd) && !src) return GUARDED(priv_recv(fd, buf, n, flags, 0));
    if (PRIV_DGRAM_ENTER(fd)) return GUARDED(priv_dgram_recv(fd, buf, n, flags, src, sl));
    if (GROUP_ENTER(fd)) return GUARDED(group_recv_buf(fd, buf, n, flags, src, sl));
    if (active_here() && fd_kind(fd) == FDK_SOCK) dgram_external(fd, NULL);
    if (!EXT_ENTER(fd)) return R(recvfrom)(fd, buf, n, flags, src, sl);
    return GUARDED(ext_recv(fd, buf, n, flags, src, sl, 2));
}
EXPORT ssize_t recvmsg(int fd, struct msghdr *m, int flags) {
    if (GROUP_ENTER(fd)) return GUARDED(group_recv(fd, m, flags));
    if (!EXT_ENTER(fd) || m->msg_iovlen < 1) return R(recvmsg)(fd, m, flags);
    /* the first iovec only (a short read is legal); no ancillary data */
    m->msg_controllen = 0;
    m->msg_flags = 0;
    return GUARDED(ext_recv(fd, m->msg_iov[0].iov_base, m->msg_iov[0].iov_len, flags,
                  (struct sockaddr *)m->msg_name, m->msg_name ? &m->msg_namelen : NULL, 2));
}
/* A write to a private stream whose peer is another process (a child: the JVM), or to a
 * pipe, passed through; a broken pipe or a reset is noted (note_private_end). */
static ssize_t priv_send_out(int fd, const void *buf, size_t n, int flags, int kindcall) {
    ssize_t r = kindcall == 1 ? R(write)(fd, buf, n) : R(send)(fd, buf, n, flags);
    if (r < 0) {
        int e = errno;
        note_private_end(r, e);
        errno = e;
    }
    return r;
}
EXPORT ssize_t write(int fd, const void *buf, size_t n) {
    if (GROUP_ENTER(fd)) return GUARDED(group_send_buf(fd, buf, n, 0));
    if (PRIV_SEND_ENTER(fd)) return GUARDED(priv_send_local(fd, buf, n, 0, 1));
    if (PRIV_ENTER(fd) || (active_here() && fd_kind(fd) == FDK_PIPE))
        return priv_send_out(fd, buf, n, 0, 1);
    if (!EXT_ENTER(fd)) return R(write)(fd, buf, n);
    return GUARDED(ext_send(fd, buf, n, 0, NULL, 0, 1));
}
EXPORT ssize_t send(int fd, const void *buf, size_t n, int flags) {
    if (GROUP_ENTER(fd)) return GUARDED(group_send_buf(fd, buf, n, flags));
    if (PRIV_SEND_ENTER(fd)) return GUARDED(priv_send_local(fd, buf, n, flags, 0));
    if (PRIV_ENTER(fd)) return priv_send_out(fd, buf, n, flags, 0);
    if (!EXT_ENTER(fd)) return R(send)(fd, buf, n, flags);
    return GUARDED(ext_send(fd, buf, n, flags, NULL, 0, 0));
}
EXPORT ssize_t sendto(int fd, const void *buf, size_t n, int flags, const struct sockaddr *d, socklen_t dl) {
    if (GROUP_ENTER(fd)) return GUARDED(group_send_buf(fd, buf, n, flags));   /* TCP: d is ignored */
    if (PRIV_SEND_ENTER(fd)) return GUARDED(priv_send_local(fd, buf, n, flags, 0));
    if (active_here() && fd_kind(fd) == FDK_SOCK && d) dgram_external(fd, d);
    if (!EXT_ENTER(fd)) return R(sendto)(fd, buf, n, flags, d, dl);
    return GUARDED(ext_send(fd, buf, n, flags, d, dl, 2));
}
EXPORT ssize_t sendmsg(int fd, const struct msghdr *m, int flags) {
    if (GROUP_ENTER(fd)) return GUARDED(group_send(fd, m, flags));
    if (!EXT_ENTER(fd) || m->msg_iovlen < 1) return R(sendmsg)(fd, m, flags);
    return GUARDED(ext_send(fd, m->msg_iov[0].iov_base, m->msg_iov[0].iov_len, flags,
                  (const struct sockaddr *)m->msg_name, m->msg_namelen, 2));
}

/* ---- small queries on external sockets: the primary's answers ---- */

static int ext_query(unsigned call, int fd, void *out, socklen_t *outlen,
                     int (*doit)(int, void *, socklen_t *, int, int), int lvl, int name) {
    uint64_t op = fd_op(fd);
    int r, e;
    struct bk b;
    uint8_t tmp[256];
    if (replaying(&b, call, op, tmp, sizeof tmp)) {
        r = (int)b.h.ret;
        e = b.h.err;
        if (r == 0 && out && outlen) {
            socklen_t k = b.h.dlen < *outlen ? b.h.dlen : *outlen;
            memcpy(out, tmp, k);
            *outlen = b.h.dlen;
        }
        bk_end(&b);
    } else {
        socklen_t sl = outlen && *outlen < sizeof tmp ? *outlen : sizeof tmp;
        r = doit(fd, tmp, &sl, lvl, name);
        e = r ? errno : 0;
        if (r == 0 && out && outlen) {
            socklen_t k = sl < *outlen ? sl : *outlen;
            memcpy(out, tmp, k);
            *outlen = sl;
        }
        pr_append(call, op, r, e, 0, 0, tmp, r == 0 ? (sl > sizeof tmp ? sizeof tmp : sl) : 0);
    }
    errno = e ? e : errno;
    return r;
}
static int do_getsockopt(int fd, void *o, socklen_t *l, int lvl, int name) { return R(getsockopt)(fd, lvl, name, o, l); }
static int do_getsockname(int fd, void *o, socklen_t *l, int lvl, int name) { return R(getsockname)(fd, o, l); }
static int do_getpeername(int fd, void *o, socklen_t *l, int lvl, int name) { return R(getpeername)(fd, o, l); }

EXPORT int setsockopt(int fd, int lvl, int name, const void *v, socklen_t l) {
    if (active_here() && (fd_kind(fd) == FDK_GROUP || fd_kind(fd) == FDK_GROUP_LISTEN))
        return GUARDED(group_setsockopt(fd, lvl, name, v, l));
    return R(setsockopt)(fd, lvl, name, v, l);
}
EXPORT int getsockopt(int fd, int lvl, int name, void *v, socklen_t *l) {
    if (active_here() && (fd_kind(fd) == FDK_GROUP || fd_kind(fd) == FDK_GROUP_LISTEN))
        return GUARDED(group_getsockopt(fd, lvl, name, v, l));
    if (!EXT_ENTER(fd)) return R(getsockopt)(fd, lvl, name, v, l);
    return GUARDED(ext_query(LLFT_C_GETSOCKOPT, fd, v, l, do_getsockopt, lvl, name));
}
EXPORT ssize_t readv(int fd, const struct iovec *iov, int n) {
    if (GROUP_ENTER(fd)) return GUARDED(group_recv_iov(fd, iov, n));
    return R(readv)(fd, iov, n);
}
EXPORT ssize_t writev(int fd, const struct iovec *iov, int n) {
    if (GROUP_ENTER(fd)) return GUARDED(group_send_iov(fd, iov, n));
    return R(writev)(fd, iov, n);
}

EXPORT int getsockname(int fd, struct sockaddr *a, socklen_t *l) {
    if (active_here() && (fd_kind(fd) == FDK_GROUP || fd_kind(fd) == FDK_GROUP_LISTEN) && g_fd[fd].g)
        return GUARDED(group_sockname(fd, a, l));
    if (!EXT_ENTER(fd)) return R(getsockname)(fd, a, l);
    return GUARDED(ext_query(LLFT_C_GETSOCKNAME, fd, a, l, do_getsockname, 0, 0));
}
EXPORT int getpeername(int fd, struct sockaddr *a, socklen_t *l) {
    if (GROUP_ENTER(fd) && g_fd[fd].g && a && l) return group_peername(fd, a, l);
    if (!EXT_ENTER(fd)) return R(getpeername)(fd, a, l);
    return GUARDED(ext_query(LLFT_C_GETPEERNAME, fd, a, l, do_getpeername, 0, 0));
}
static int shutdown_ordered(int fd, int how) {
    uint64_t op = fd_op(fd);
    int r, e;
    struct bk b;
    if (replaying(&b, LLFT_C_SHUTDOWN, op, NULL, 0)) { r = (int)b.h.ret; e = b.h.err; bk_end(&b); }
    else { r = R(shutdown)(fd, how); e = r ? errno : 0; pr_append(LLFT_C_SHUTDOWN, op, r, e, 0, 0, NULL, 0); }
    errno = e ? e : errno;
    return r;
}
EXPORT int shutdown(int fd, int how) {
    if (PRIV_SEND_ENTER(fd) && g_npend && how != SHUT_RD && pend_shutdown(fd, how)) return 0;
    HOOK(fd_kind(fd) == FDK_EXTERNAL, R(shutdown)(fd, how), shutdown_ordered(fd, how));
}

/* ---- readiness ----
 * Ordered whenever a socket is watched. A backup returns the primary's answer; for a
 * PRIVATE socket that the primary saw ready (its peer is real here too: the JVM's
 * accumulator-update connection, py4j's replies) it first waits, without the GIL,
 * until the socket really is ready here -- the same rule as a lock grant or a stat:
 * the primary's outcome is made true locally before it is returned. */
#define MAX_ENFORCE 64
static void enforce_ready(struct pollfd *need, int k, struct bk *b) {
    if (k <= 0) return;
    struct stallw sw = {0, 0};
    for (;;) {
        struct pollfd tmp[MAX_ENFORCE];
        memcpy(tmp, need, (size_t)k * sizeof *tmp);
        R(poll)(tmp, (nfds_t)k, 0);
        int ok = 1;
        for (int i = 0; i < k; i++) if (!(tmp[i].revents & (need[i].events | POLLHUP | POLLERR))) ok = 0;
        if (ok) return;
        pend_push();
        if (!b->gil) b->gil = gil_drop();
        R(poll)(tmp, (nfds_t)k, WAIT_SLICE_MS);
        stall_check(&sw, "a private socket the primary saw ready", b->h.call, b->h.op);
    }
}

static int poll_watches_a_socket(const struct pollfd *fds, nfds_t n) {
    if (n > 4096) return 0;
    for (nfds_t i = 0; i < n; i++) if (fd_watched(fds[i].fd)) return 1;
    return 0;
}
static int poll_ordered(struct pollfd *fds, nfds_t n, int timeout) {
    uint64_t op = thread_op();
    int r, e;
    struct bk b;
    int16_t rev[4096];
    if (replaying(&b, LLFT_C_POLL, op, rev, (uint32_t)(n * sizeof(int16_t)))) {
        r = (int)b.h.ret;
        e = b.h.err;
        struct pollfd need[MAX_ENFORCE];
        int k = 0;
        for (nfds_t i = 0; i < n; i++) {
            fds[i].revents = b.h.dlen ? rev[i] : 0;
            if (fds[i].revents && fd_local(fds[i].fd) && k < MAX_ENFORCE) {
                need[k].fd = fds[i].fd;
                need[k].events = fds[i].revents & (POLLIN | POLLOUT | POLLPRI);
                need[k++].revents = 0;
            }
        }
        enforce_ready(need, k, &b);
        if (r == 0) sleep_barrier(&b);   /* it timed out: time passed at the primary */
        bk_end(&b);
    } else {
        r = R(poll)(fds, n, timeout);
        e = r < 0 ? errno : 0;
        for (nfds_t i = 0; i < n; i++) rev[i] = fds[i].revents;
        pr_append(LLFT_C_POLL, op, r, e, 0, 0, rev, r >= 0 ? (uint32_t)(n * sizeof(int16_t)) : 0);
    }
    errno = e ? e : errno;
    return r;
}
EXPORT int poll(struct pollfd *fds, nfds_t n, int timeout) {
    HOOK(poll_watches_a_socket(fds, n), R(poll)(fds, n, timeout), poll_ordered(fds, n, timeout));
}

static int select_watches_a_socket(int nfds, fd_set *rs, fd_set *ws, fd_set *es) {
    if (nfds > FD_SETSIZE) return 0;
    for (int fd = 0; fd < nfds; fd++)
        if (fd_watched(fd) &&
            ((rs && FD_ISSET(fd, rs)) || (ws && FD_ISSET(fd, ws)) || (es && FD_ISSET(fd, es))))
            return 1;
    return 0;
}
static int select_ordered(int nfds, fd_set *rs, fd_set *ws, fd_set *es, struct timeval *tv) {
    uint64_t op = thread_op();
    int r, e;
    struct bk b;
    struct { fd_set s[3]; struct timeval tv; } out;
    if (replaying(&b, LLFT_C_SELECT, op, &out, sizeof out)) {
        r = (int)b.h.ret;
        e = b.h.err;
        if (b.h.dlen) {
            if (rs) *rs = out.s[0];
            if (ws) *ws = out.s[1];
            if (es) *es = out.s[2];
            if (tv) *tv = out.tv;
            struct pollfd need[MAX_ENFORCE];
            int k = 0;
            for (int fd = 0; fd < nfds && k < MAX_ENFORCE; fd++) {
                short ev = (short)((rs && FD_ISSET(fd, rs) ? POLLIN : 0) | (ws && FD_ISSET(fd, ws) ? POLLOUT : 0));
                if (ev && fd_local(fd)) { need[k].fd = fd; need[k].events = ev; need[k++].revents = 0; }
            }
            enforce_ready(need, k, &b);
        }
        if (r == 0) sleep_barrier(&b);
        bk_end(&b);
    } else {
        r = R(select)(nfds, rs, ws, es, tv);
        e = r < 0 ? errno : 0;
        memset(&out, 0, sizeof out);
        if (rs) out.s[0] = *rs;
        if (ws) out.s[1] = *ws;
        if (es) out.s[2] = *es;
        if (tv) out.tv = *tv;
        pr_append(LLFT_C_SELECT, op, r, e, 0, 0, &out, r >= 0 ? sizeof out : 0);
    }
    errno = e ? e : errno;
    return r;
}
EXPORT int select(int nfds, fd_set *rs, fd_set *ws, fd_set *es, struct timeval *tv) {
    HOOK(select_watches_a_socket(nfds, rs, ws, es), R(select)(nfds, rs, ws, es, tv),
         select_ordered(nfds, rs, ws, es, tv));
}

static int epoll_ordered(int ep, struct epoll_event *ev, int max, int timeout, const sigset_t *ss, int pw) {
    uint64_t op = fd_op(ep);
    int r, e;
    struct bk b;
    uint32_t cap = (uint32_t)max * sizeof *ev;
    if (cap > LLFT_MAX_DATA_BYTES) { max = LLFT_MAX_DATA_BYTES / sizeof *ev; cap = (uint32_t)max * sizeof *ev; }
    if (replaying(&b, LLFT_C_EPOLL_WAIT, op, ev, cap)) {
        r = (int)b.h.ret;
        e = b.h.err;
        /* CPython's select.epoll keeps the fd in data.fd */
        struct pollfd need[MAX_ENFORCE];
        int k = 0;
        for (int i = 0; i < r && k < MAX_ENFORCE; i++)
            if (fd_local(ev[i].data.fd)) {
                need[k].fd = ev[i].data.fd;
                need[k].events = (short)(ev[i].events & (EPOLLIN | EPOLLOUT | EPOLLPRI));
                need[k++].revents = 0;
            }
        enforce_ready(need, k, &b);
        if (r == 0) sleep_barrier(&b);   /* it timed out: time passed at the primary */
        bk_end(&b);
    } else {
        r = pw ? R(epoll_pwait)(ep, ev, max, timeout, ss) : R(epoll_wait)(ep, ev, max, timeout);
        e = r < 0 ? errno : 0;
        pr_append(LLFT_C_EPOLL_WAIT, op, r, e, 0, 0, ev, r > 0 ? (uint32_t)r * sizeof *ev : 0);
    }
    errno = e ? e : errno;
    return r;
}
/* Ordered when the epoll set watches a socket (ext_watch, kept by epoll_ctl). */
static int epoll_common(int ep, struct epoll_event *ev, int max, int timeout, const sigset_t *ss, int pw) {
    HOOK(fd_kind(ep) == FDK_EPOLL && g_fd[ep].ext_watch && max > 0,
         pw ? R(epoll_pwait)(ep, ev, max, timeout, ss) : R(epoll_wait)(ep, ev, max, timeout),
         epoll_ordered(ep, ev, max, timeout, ss, pw));
}
EXPORT int epoll_wait(int ep, struct epoll_event *ev, int max, int timeout) {
    return epoll_common(ep, ev, max, timeout, NULL, 0);
}
EXPORT int epoll_pwait(int ep, struct epoll_event *ev, int max, int timeout, const sigset_t *ss) {
    return epoll_common(ep, ev, max, timeout, ss, 1);
}
