/* shim_internal.h -- what the shim's compilation units share (private to the shim).
 *
 * libllft_preload.so is built from native/shim_*.c, one unit per concern:
 *   shim_core.c     activation, real symbols, GIL, divergence report, and the
 *                   record/replay engine every hook goes through (pr_append, bk_*)
 *   shim_time.c     clocks and sleeps (CTS)
 *   shim_gc.c       garbage collection at deterministic points
 *   shim_random.c   getrandom, /dev/urandom, getloadavg
 *   shim_locks.c    semaphores and pthread mutexes (CMTS)
 *   shim_threads.c  pthread_create, thread ends (logical thread ids, reused)
 *   shim_gil.c      the GIL's hand-offs (ordered once a second thread exists)
 *   shim_signals.c  signal handlers: which record a signal interrupted
 *   shim_process.c  stat and waitpid (the app's private companions); kill/killpg and
 *                   waitpid noted for the agent (ctl.sent, ctl.reaped)
 *   shim_net.c      sockets (CSCS): the fd table, kinds, private and external sockets,
 *                   readiness; every socket hook
 *   shim_group.c    group connections (the agent's side of the service port), listen
 * Everything is compiled with -fvisibility=hidden: the names declared here link the
 * units together but are not exported; only hooks (EXPORT) interpose on libc.
 *
 * Every hook has the same frame (HOOK below): the real call unless the shim is active
 * in this thread and the call is one it orders; otherwise the ordered version with
 * t_guard raised, which decides between replaying a record and performing the call
 * and recording it (`replaying`).
 */
#ifndef LLFT_SHIM_INTERNAL_H
#define LLFT_SHIM_INTERNAL_H

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <time.h>
#include <unistd.h>

#include "llft_shm.h"

#define EXPORT __attribute__((visibility("default")))
#define TLS __thread __attribute__((tls_model("initial-exec")))
#define MAX_FDS 65536
#define OPTAB_SIZE (1u << 20)     /* distinct operations per process lifetime (backup) */
#define LOCKTAB_SIZE (1u << 16)   /* live registered locks */
#define WAIT_SLICE_MS 50

/* Futex waits and wakes that pick their waiters by one bit of what they wait for
 * (FUTEX_WAIT_BITSET / FUTEX_WAKE_BITSET): a backup thread waits for its turn on an
 * operation's queue (count == its record's sequence number) or for one thread's GIL
 * drop, so a completion wakes only the waiters whose turn it may be (one in 32 false
 * wakes) instead of every waiter on the word. With 64 threads taking the GIL in the
 * primary's order each hand-off woke all of them (~10 context switches per request at
 * 16 clients, the backups' apps twice the primary's CPU). The timeout is absolute on
 * CLOCK_MONOTONIC, read by the raw syscall (the shim's own clock_gettime is a hook). */
static inline long shim_futex_wait_bit(uint32_t *w, uint32_t val, int timeout_ms, uint32_t key) {
    struct timespec ts;
    syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &ts);
    ts.tv_sec += timeout_ms / 1000;
    ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
    return syscall(SYS_futex, w, FUTEX_WAIT_BITSET_PRIVATE, val, &ts, NULL, 1u << (key & 31));
}
static inline void shim_futex_wake_bit(uint32_t *w, uint32_t key) {
    syscall(SYS_futex, w, FUTEX_WAKE_BITSET_PRIVATE, 0x7fffffff, NULL, NULL, 1u << (key & 31));
}

/* ------------------------------------------------------------------ real symbols */

/* Every libc function the shim calls past its own hooks: R(name) is the real one,
 * resolved eagerly at activation and lazily as a fallback (a descendant process,
 * or a call before the constructor ran). */
#define LLFT_REAL_SYMBOLS(X) \
    X(int, clock_gettime, (clockid_t, struct timespec *)) \
    X(int, gettimeofday, (struct timeval *, void *)) \
    X(time_t, time, (time_t *)) \
    X(int, clock_nanosleep, (clockid_t, int, const struct timespec *, struct timespec *)) \
    X(int, nanosleep, (const struct timespec *, struct timespec *)) \
    X(ssize_t, getrandom, (void *, size_t, unsigned)) \
    X(int, getloadavg, (double *, int)) \
    X(int, open, (const char *, int, ...)) \
    X(int, open64, (const char *, int, ...)) \
    X(int, openat, (int, const char *, int, ...)) \
    X(int, openat64, (int, const char *, int, ...)) \
    X(ssize_t, read, (int, void *, size_t)) \
    X(ssize_t, write, (int, const void *, size_t)) \
    X(int, close, (int)) \
    X(int, sem_init, (sem_t *, int, unsigned)) \
    X(int, sem_destroy, (sem_t *)) \
    X(int, sem_wait, (sem_t *)) \
    X(int, sem_trywait, (sem_t *)) \
    X(int, sem_timedwait, (sem_t *, const struct timespec *)) \
    X(int, sem_clockwait, (sem_t *, clockid_t, const struct timespec *)) \
    X(int, pthread_mutex_init, (pthread_mutex_t *, const pthread_mutexattr_t *)) \
    X(int, pthread_mutex_destroy, (pthread_mutex_t *)) \
    X(int, pthread_mutex_lock, (pthread_mutex_t *)) \
    X(int, pthread_mutex_trylock, (pthread_mutex_t *)) \
    X(int, pthread_mutex_timedlock, (pthread_mutex_t *, const struct timespec *)) \
    X(int, pthread_create, (pthread_t *, const pthread_attr_t *, void *(*)(void *), void *)) \
    X(int, socket, (int, int, int)) \
    X(int, socketpair, (int, int, int, int[2])) \
    X(int, bind, (int, const struct sockaddr *, socklen_t)) \
    X(int, connect, (int, const struct sockaddr *, socklen_t)) \
    X(int, accept, (int, struct sockaddr *, socklen_t *)) \
    X(int, accept4, (int, struct sockaddr *, socklen_t *, int)) \
    X(ssize_t, recv, (int, void *, size_t, int)) \
    X(ssize_t, recvfrom, (int, void *, size_t, int, struct sockaddr *, socklen_t *)) \
    X(ssize_t, recvmsg, (int, struct msghdr *, int)) \
    X(ssize_t, send, (int, const void *, size_t, int)) \
    X(ssize_t, sendto, (int, const void *, size_t, int, const struct sockaddr *, socklen_t)) \
    X(ssize_t, sendmsg, (int, const struct msghdr *, int)) \
    X(int, poll, (struct pollfd *, nfds_t, int)) \
    X(int, select, (int, fd_set *, fd_set *, fd_set *, struct timeval *)) \
    X(int, epoll_create1, (int)) \
    X(int, epoll_create, (int)) \
    X(int, epoll_ctl, (int, int, int, struct epoll_event *)) \
    X(int, epoll_wait, (int, struct epoll_event *, int, int)) \
    X(int, epoll_pwait, (int, struct epoll_event *, int, int, const sigset_t *)) \
    X(int, getsockopt, (int, int, int, void *, socklen_t *)) \
    X(int, setsockopt, (int, int, int, const void *, socklen_t)) \
    X(int, getsockname, (int, struct sockaddr *, socklen_t *)) \
    X(int, getpeername, (int, struct sockaddr *, socklen_t *)) \
    X(int, shutdown, (int, int)) \
    X(int, listen, (int, int)) \
    X(ssize_t, readv, (int, const struct iovec *, int)) \
    X(ssize_t, writev, (int, const struct iovec *, int)) \
    X(int, stat64, (const char *, struct stat64 *)) \
    X(int, lstat64, (const char *, struct stat64 *)) \
    X(int, fstat64, (int, struct stat64 *)) \
    X(int, fstatat64, (int, const char *, struct stat64 *, int)) \
    X(pid_t, waitpid, (pid_t, int *, int)) \
    X(pid_t, getpid, (void)) \
    X(int, kill, (pid_t, int)) \
    X(int, raise, (int)) \
    X(int, pthread_kill, (pthread_t, int)) \
    X(int, pipe, (int[2])) \
    X(int, pipe2, (int[2], int)) \
    X(int, prctl, (int, ...)) \
    X(int, sigqueue, (pid_t, int, const union sigval)) \
    X(long, syscall, (long, ...)) \
    X(int, execve, (const char *, char *const[], char *const[])) \
    X(int, execvpe, (const char *, char *const[], char *const[])) \
    X(int, fexecve, (int, char *const[], char *const[])) \
    X(int, posix_spawn, (pid_t *, const char *, const posix_spawn_file_actions_t *, \
                         const posix_spawnattr_t *, char *const[], char *const[])) \
    X(int, posix_spawnp, (pid_t *, const char *, const posix_spawn_file_actions_t *, \
                          const posix_spawnattr_t *, char *const[], char *const[]))

void *resolve(const char *name);
#define REAL_DECLARE(ret, name, args) \
    extern ret(*real_##name) args; \
    static inline __typeof__(real_##name) get_##name(void) { \
        if (__builtin_expect(!real_##name, 0)) real_##name = (__typeof__(real_##name))resolve(#name); \
        return real_##name; \
    }
LLFT_REAL_SYMBOLS(REAL_DECLARE)
#define R(name) (get_##name())

/* ------------------------------------------------------------------ state */

extern TLS int t_guard;            /* >0: inside the shim, calls pass through */
extern TLS int t_tid;              /* logical thread id; -1: not determinized */
extern TLS uint64_t t_n;           /* this thread's determinized call count */
extern TLS uint32_t t_created;     /* locks/fds created by this thread (logical ids) */
extern TLS uint32_t t_gen;         /* this thread is the t_gen-th holder of id t_tid (shim_threads.c) */

extern int g_active;
extern int g_debug;                /* LLFT_DEBUG=1: one line per determinized call on stderr */
extern pid_t g_pid;
extern struct llft_shm *g_shm;
extern struct llft_ctl *g_ctl;

/* CPython entry points, resolved at activation (dlsym: no link-time dependency). */
extern int (*py_is_initialized)(void);
extern void *(*py_tstate_current)(void);     /* _PyThreadState_UncheckedGet */
extern void *(*py_tstate_this)(void);        /* PyGILState_GetThisThreadState */

/* The file-descriptor table (shim_net.c, shim_group.c, and shim_random.c for
 * /dev/urandom). */
enum { FDK_NONE = 0, FDK_RANDOM, FDK_SOCK, FDK_PRIVATE, FDK_EXTERNAL, FDK_EPOLL, FDK_PRIVATE_STREAM,
       FDK_GROUP_LISTEN, FDK_GROUP, FDK_PIPE };
struct gconn;   /* group listener / connection state, shim_group.c */
/* local_peer: a private stream whose other end is one of the process's own sockets
 * (shim_net.c, own_port): the peer replays too, so a backup can wait for it uncapped. */
struct fdent { uint8_t kind; uint8_t local_peer; uint16_t ext_watch; int32_t epfd; uint64_t lid; struct gconn *g; };
extern struct fdent g_fd[MAX_FDS];
static inline int fd_ok(int fd) { return fd >= 0 && fd < MAX_FDS; }
static inline int fd_kind(int fd) { return fd_ok(fd) ? g_fd[fd].kind : FDK_NONE; }
static inline uint64_t fd_op(int fd) { return LLFT_OP(LLFT_OPC_FD, g_fd[fd].lid); }

static inline int active_here(void) { return g_active && !t_guard && t_tid >= 0; }
static inline uint32_t cur_mode(void) { return __atomic_load_n(&g_ctl->mode, __ATOMIC_ACQUIRE); }
static inline int backup_now(void) { return cur_mode() == LLFT_MODE_BACKUP; }
static inline uint64_t new_lid(void) { return ((uint64_t)(uint32_t)t_tid << 32) | ++t_created; }
/* Per-thread operations (random, sleep, create, poll, stat...) of the calling thread. */
static inline uint64_t thread_op(void) { return LLFT_OP(LLFT_OPC_THREAD, (uint64_t)t_tid); }
/* Calls the application makes once the interpreter is up (start-up is not ordered). */
static inline int app_started(void) { return py_is_initialized && py_is_initialized(); }
static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}
int64_t mono_ns(void);

/* ------------------------------------------------------------------ GIL (shim_core.c) */

int gil_held(void);
void *gil_drop(void);     /* NULL (nothing dropped) once hand-offs are ordered */
void gil_take(void *ts);
void gil_yield(void);     /* drop the GIL and take it back (ordered hand-offs) */
extern uint64_t g_thread_n[LLFT_MAX_THREADS];   /* backup: records completed per thread */
/* shim_gil.c: ordered hand-offs */
extern int g_gil_ordered;
extern pthread_mutex_t *g_gil_mutex, *g_gil_switch_mutex;
static inline int is_gil_mutex(const pthread_mutex_t *m) {
    return m && (m == g_gil_mutex || m == g_gil_switch_mutex);
}
int gil_lock(pthread_mutex_t *m);
void gil_order_start(void);
void import_lock_order_start(void);   /* shim_locks.c */
void gil_passed_take(void);

/* ------------------------------------------------------------------ divergence */

__attribute__((noreturn, format(printf, 1, 2)))
void diverge(const char *fmt, ...);
/* a group connection's write differed: also names it in ctl.div_* */
__attribute__((noreturn, format(printf, 3, 4)))
void diverge_group(uint32_t conn, uint64_t off, const char *fmt, ...);

int64_t cts_offset(clockid_t clk);   /* shim_time.c */
ssize_t pipe_read(int fd, void *buf, size_t n);   /* shim_process.c */
void note_private_end(ssize_t r, int e);           /* shim_process.c */
void fd_set_kind(int fd, int kind, uint64_t lid);  /* shim_net.c */

/* ------------------------------------------------------------------ record / replay */

/* Primary: append (t, o, n, d) for the call that just returned. */
void pr_append(unsigned call, uint64_t op, int64_t ret, int32_t err, uint32_t aux,
               uint16_t flags, const void *data, uint32_t dlen);

/* Backup: one call being replayed. */
struct opctr;
struct bk {
    struct llft_rec h;
    struct opctr *ctr;
    void *gil;      /* thread state saved if we released the GIL to wait */
    int sig;        /* a signal to raise when the record completes (shim_signals.c) */
};
/* Stall detection: a wait with no progress anywhere for stall_ms is reported. */
struct stallw { int64_t since; uint32_t progress; };
void stall_check(struct stallw *s, const char *what, unsigned call, uint64_t op);

#define BK_PRIMARY 0   /* promoted meanwhile and no record left: act as a primary */
#define BK_RECORD  1   /* b->h is this call's record, its turn has come */
#define BK_NO_HINT 2   /* a private read with no size hint: pass through */
#define BK_EXTRA   3   /* a GIL take the trace does not have here (shim_gil.c) */
int bk_begin(struct bk *b, unsigned call, uint64_t op, void *payload, uint32_t cap);
void bk_end(struct bk *b);

/* The record-or-replay branch of every ordered call:
 *     if (replaying(&b, call, op, payload, cap)) { ...the recorded outcome...; bk_end(&b); }
 *     else { ...the real call...; pr_append(call, op, ...); }
 * True at a backup once the call's record is there and its turn has come (b.h is the
 * record, `payload` holds its data); false at a primary, and at a backup promoted
 * meanwhile that has no record left (it then acts as a primary). */
static inline int replaying(struct bk *b, unsigned call, uint64_t op, void *payload, uint32_t cap) {
    return backup_now() && bk_begin(b, call, op, payload, cap) != BK_PRIMARY;
}

/* ------------------------------------------------------------------ the hook frame */

/* `expr` with the guard raised: the libc calls the shim makes meanwhile (and the
 * interpreter calls it makes, e.g. taking the GIL back) pass through. `expr` leaves
 * errno as the determinized call's. */
#define GUARDED(expr) ({ t_guard++; __typeof__(expr) guarded_r_ = (expr); t_guard--; guarded_r_; })

/* The prologue and epilogue of a hook: unless the shim determinizes this thread (active,
 * not inside the shim) and `cond` holds, return `real`; otherwise return `ordered`,
 * GUARDED. `cond` is evaluated only when the shim is active here. */
#define HOOK(cond, real, ordered) do { \
        if (!active_here() || !(cond)) return (real); \
        return GUARDED(ordered); \
    } while (0)

/* ------------------------------------------------------------------ across units */

void sleep_barrier(struct bk *b);                       /* shim_time.c */
int sig_take_pending(void);                             /* shim_signals.c */
void sig_replay(int sig);
void sig_sending(int on);                               /* inside a call that sends a signal */
void gc_point(int may_collect);                         /* shim_gc.c */
ssize_t random_call(unsigned call, int fd, void *buf, size_t n, unsigned flags);  /* shim_random.c */

/* sockets: shim_net.c */
void fd_set_kind(int fd, int kind, uint64_t lid);
uint16_t addr_port(const struct sockaddr *a);
uint32_t fnv1a(const void *p, size_t n, uint32_t h);
/* group sockets: shim_group.c, called by the socket hooks of shim_net.c */
int is_service_addr(int fd, const struct sockaddr *a, socklen_t len);
int group_bind(int fd, const struct sockaddr *a, socklen_t len);
void group_closing(int fd);
int group_setsockopt(int fd, int lvl, int name, const void *v, socklen_t l);
int group_getsockopt(int fd, int lvl, int name, void *v, socklen_t *l);
void group_unpublish(int fd);
int group_accept(int fd, struct sockaddr *a, socklen_t *alen, int flags, int four);
ssize_t group_recv(int fd, struct msghdr *m, int flags);
ssize_t group_send(int fd, const struct msghdr *m, int flags);
ssize_t group_recv_buf(int fd, void *buf, size_t n, int flags, struct sockaddr *src, socklen_t *sl);
ssize_t group_send_buf(int fd, const void *buf, size_t n, int flags);
ssize_t group_recv_iov(int fd, const struct iovec *iov, int n);
ssize_t group_send_iov(int fd, const struct iovec *iov, int n);
int group_sockname(int fd, struct sockaddr *a, socklen_t *l);
int group_peername(int fd, struct sockaddr *a, socklen_t *l);

/* Activation steps of the units, called once by the constructor (shim_core.c), before
 * the shim strips its variables from the environment. */
void time_activate(void);
void gc_activate(void);
void net_activate(void);
void group_activate(void);
void threads_activate(void);
void notes_activate(const char *shm_path); /* the app's descendants' notes (shim_process.c) */
void process_activate(void);   /* once active: the group's process id (shim_process.c) */

#endif /* LLFT_SHIM_INTERNAL_H */
