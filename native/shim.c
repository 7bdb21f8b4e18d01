/* shim.c -- libllft_preload.so: the virtual determinizer at the libc boundary.
 *
 * Theory of operation
 * -------------------
 * The agent starts the application with LD_PRELOAD=libllft_preload.so and, in the
 * environment, LLFT_SHM (the shared-memory file, layout in llft_shm.h) and
 * LLFT_ROOT_PID (the pid of the process to determinize). At load time the shim
 * decides once whether it is ACTIVE:
 *   - pid != LLFT_ROOT_PID: a descendant (bash subshell, the Spark JVM...): inactive,
 *     and it strips itself from the environment so grandchildren never see it;
 *   - pid == LLFT_ROOT_PID but the program is not a CPython interpreter (the pyenv
 *     `python3` bash wrapper, or `java` run directly): inactive and the environment is
 *     left alone, so that the interpreter the wrapper execs (same pid) activates;
 *   - pid == LLFT_ROOT_PID in CPython: active; strips itself from `environ` before the
 *     interpreter copies it into os.environ, so every child starts clean.
 * A forked child turns inactive (pthread_atfork); a vfork child shares our memory,
 * so the only hook that mutates state from there (close) checks the pid itself.
 *
 * Active, every intercepted call follows the paper's generic algorithm:
 *   primary: perform the call, then append (t, o, n, d) to the shared ring as it
 *            returns (so the ring order respects causality: a lock's holder appends
 *            before it can release);
 *   backup:  take thread t's next record from its ring, check it is (o, n) -- else a
 *            DIVERGENCE is reported naming the first differing call -- wait until o's
 *            queue has completed `oseq` records, then return the recorded result
 *            (performing the real call only where it must happen locally: a lock that
 *            was granted is really acquired, a private socket really connects).
 *
 * What is ordered, and why (DESIGN.md "Known hazards"):
 *   clocks  Only reads that reach the application: made by a thread that HOLDS THE
 *           GIL and NOT from the interpreter's timing machinery. CPython 3.11 reads
 *           CLOCK_MONOTONIC on every lock acquire (PyThread_acquire_lock_timed ->
 *           _PyTime_GetMonotonicClock), for deadlines (_PyDeadline_* ->
 *           _PyTime_GetMonotonicClock), for import/gc timing (_PyTime_GetPerfCounter)
 *           and in every GIL wait (_PyThread_cond_after, without the GIL). The
 *           app-facing readers are different functions (time.time ->
 *           _PyTime_GetSystemClockWithInfo, time.monotonic/perf_counter/sleep ->
 *           _PyTime_GetMonotonicClockWithInfo, datetime.now -> _PyTime_GetSystemClock,
 *           time.clock_gettime). So the call site (our return address) tells them
 *           apart: reads returning into _PyTime_GetMonotonicClock or
 *           _PyTime_GetPerfCounter (address ranges from the dynamic symbol table, found
 *           once at activation) are internal; of the rest, only reads with the GIL
 *           held are synchronous with Python code, hence deterministic in number.
 *   locks   POSIX semaphores (threading.Lock/RLock and everything built on them) and
 *           pthread mutexes, but only those initialised after Py_IsInitialized(): the
 *           GIL, the runtime's HEAD_LOCK, the import and pending-call locks are all
 *           created during start-up and are never ordered. Claims are ordered
 *           (success, try-lock failure, timed-wait timeout); releases need no order.
 *   threads pthread_create is a per-thread operation whose metadata is the child's
 *           logical id, so the k-th thread created by thread p has the same id
 *           everywhere.
 *   random  getrandom and reads of /dev/urandom|random: payload recorded. The
 *           interpreter's hash secret comes from getrandom at start-up, so set
 *           iteration order replays without touching PYTHONHASHSEED.
 *   sockets see the "sockets" section below.
 *
 * The GIL hazard: a backup thread that must wait for its turn may hold the GIL while
 * the thread that must go first needs it. The wait therefore releases the GIL
 * (PyEval_SaveThread, resolved with dlsym: no link-time Python symbols) when, and only
 * when, the thread really has to sleep, and takes it back afterwards. CPython itself
 * calls sem_trywait with the GIL held and then releases it to block, so a GIL switch
 * at that point is one the interpreter already allows.
 *
 * Hygiene (after libfaketime and rr's preload): real symbols resolved once, eagerly
 * at load and lazily as a fallback, with a thread-local guard so that the shim's own
 * calls (and the interpreter calls it makes, e.g. taking the GIL back) pass through;
 * errno saved and restored; no shim lock is ever held across a blocking call (the
 * only lock is a spinlock around the lock-registration table).
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/random.h>
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
#define LLFT_EXIT_DIVERGED 86
#define MAX_FDS 65536
#define OPTAB_SIZE (1u << 20)     /* distinct operations per process lifetime (backup) */
#define LOCKTAB_SIZE (1u << 16)   /* live registered locks */
#define WAIT_SLICE_MS 50

/* ------------------------------------------------------------------ real symbols */

#define REAL(ret, name, args) \
    static ret(*real_##name) args; \
    static void *resolve(const char *); \
    static inline __typeof__(real_##name) get_##name(void) { \
        if (__builtin_expect(!real_##name, 0)) real_##name = (__typeof__(real_##name))resolve(#name); \
        return real_##name; \
    }
REAL(int, clock_gettime, (clockid_t, struct timespec *));
REAL(int, gettimeofday, (struct timeval *, void *));
REAL(time_t, time, (time_t *));
REAL(int, clock_nanosleep, (clockid_t, int, const struct timespec *, struct timespec *));
REAL(int, nanosleep, (const struct timespec *, struct timespec *));
REAL(ssize_t, getrandom, (void *, size_t, unsigned));
REAL(int, open, (const char *, int, ...));
REAL(int, open64, (const char *, int, ...));
REAL(int, openat, (int, const char *, int, ...));
REAL(int, openat64, (int, const char *, int, ...));
REAL(ssize_t, read, (int, void *, size_t));
REAL(ssize_t, write, (int, const void *, size_t));
REAL(int, close, (int));
REAL(int, sem_init, (sem_t *, int, unsigned));
REAL(int, sem_destroy, (sem_t *));
REAL(int, sem_wait, (sem_t *));
REAL(int, sem_trywait, (sem_t *));
REAL(int, sem_timedwait, (sem_t *, const struct timespec *));
REAL(int, sem_clockwait, (sem_t *, clockid_t, const struct timespec *));
REAL(int, pthread_mutex_init, (pthread_mutex_t *, const pthread_mutexattr_t *));
REAL(int, pthread_mutex_destroy, (pthread_mutex_t *));
REAL(int, pthread_mutex_lock, (pthread_mutex_t *));
REAL(int, pthread_mutex_trylock, (pthread_mutex_t *));
REAL(int, pthread_mutex_timedlock, (pthread_mutex_t *, const struct timespec *));
REAL(int, pthread_create, (pthread_t *, const pthread_attr_t *, void *(*)(void *), void *));
REAL(int, socket, (int, int, int));
REAL(int, socketpair, (int, int, int, int[2]));
REAL(int, bind, (int, const struct sockaddr *, socklen_t));
REAL(int, connect, (int, const struct sockaddr *, socklen_t));
REAL(int, accept, (int, struct sockaddr *, socklen_t *));
REAL(int, accept4, (int, struct sockaddr *, socklen_t *, int));
REAL(ssize_t, recv, (int, void *, size_t, int));
REAL(ssize_t, recvfrom, (int, void *, size_t, int, struct sockaddr *, socklen_t *));
REAL(ssize_t, recvmsg, (int, struct msghdr *, int));
REAL(ssize_t, send, (int, const void *, size_t, int));
REAL(ssize_t, sendto, (int, const void *, size_t, int, const struct sockaddr *, socklen_t));
REAL(ssize_t, sendmsg, (int, const struct msghdr *, int));
REAL(int, poll, (struct pollfd *, nfds_t, int));
REAL(int, select, (int, fd_set *, fd_set *, fd_set *, struct timeval *));
REAL(int, epoll_create1, (int));
REAL(int, epoll_create, (int));
REAL(int, epoll_ctl, (int, int, int, struct epoll_event *));
REAL(int, epoll_wait, (int, struct epoll_event *, int, int));
REAL(int, epoll_pwait, (int, struct epoll_event *, int, int, const sigset_t *));
REAL(int, getsockopt, (int, int, int, void *, socklen_t *));
REAL(int, getsockname, (int, struct sockaddr *, socklen_t *));
REAL(int, getpeername, (int, struct sockaddr *, socklen_t *));
REAL(int, shutdown, (int, int));
REAL(int, listen, (int, int));
REAL(ssize_t, readv, (int, const struct iovec *, int));
REAL(ssize_t, writev, (int, const struct iovec *, int));
REAL(int, stat64, (const char *, struct stat64 *));
REAL(pid_t, waitpid, (pid_t, int *, int));

static TLS int t_guard;            /* >0: inside the shim, calls pass through */
static TLS int t_tid = -1;         /* logical thread id; -1: not determinized */
static TLS uint64_t t_n;           /* this thread's determinized call count */
static TLS uint32_t t_created;     /* locks/fds created by this thread (logical ids) */

static void *resolve(const char *name) {
    t_guard++;
    void *p = dlsym(RTLD_NEXT, name);
    t_guard--;
    return p;
}
#define R(name) (get_##name())

/* ------------------------------------------------------------------ state */

static int g_active;
static int g_debug;          /* LLFT_DEBUG=1: one line per determinized call on stderr */
static pid_t g_pid;
static struct llft_shm *g_shm;
static struct llft_ctl *g_ctl;

/* CPython entry points, resolved at activation (dlsym: no link-time dependency). */
static int (*py_is_initialized)(void);
static void *(*py_tstate_current)(void);     /* _PyThreadState_UncheckedGet */
static void *(*py_tstate_this)(void);        /* PyGILState_GetThisThreadState */
static void *(*py_save_thread)(void);        /* PyEval_SaveThread */
static void (*py_restore_thread)(void *);    /* PyEval_RestoreThread */
static void (*py_dump_traceback)(int, void *);  /* _Py_DumpTraceback (async-signal-safe) */
static int (*py_gc_disable)(void);                 /* PyGC_Disable (3.10+) */
static void *(*py_import)(const char *);           /* PyImport_ImportModule */
static void *(*py_getattr)(void *, const char *);  /* PyObject_GetAttrString */
static void *(*py_call1)(void *, void *);          /* PyObject_CallOneArg */
static void *(*py_long)(long);                     /* PyLong_FromLong */
static void (*py_decref)(void *);                  /* Py_DecRef */
static void (*py_err_fetch)(void **, void **, void **);
static void (*py_err_restore)(void *, void *, void *);
static void (*py_err_clear)(void);

/* Interpreter timing machinery: reads returning into these are never ordered. */
#define MAX_INTERNAL 4
static uintptr_t g_int_lo[MAX_INTERNAL], g_int_hi[MAX_INTERNAL];
static int g_nint;

/* CTS: per clock, offset of the virtual group clock over the local clock, and the
 * last value handed out (the group clock never goes backwards). */
#define NCLOCKS 12
static int64_t g_clk_off[NCLOCKS];
static int64_t g_clk_last[NCLOCKS];

/* Loopback ports that are external (a server outside the replica's process tree). */
#define MAX_EXT_PORTS 32
static uint16_t g_ext_ports[MAX_EXT_PORTS];
static int g_n_ext_ports;
/* LLFT_SERVICE_PORT: the group's service port (group listener, shim_net.inc); 0: none. */
static uint16_t g_service_port;

enum { FDK_NONE = 0, FDK_RANDOM, FDK_SOCK, FDK_PRIVATE, FDK_EXTERNAL, FDK_EPOLL, FDK_PRIVATE_STREAM,
       FDK_GROUP_LISTEN, FDK_GROUP };
struct gconn;   /* group listener / connection state, shim_net.inc */
struct fdent { uint8_t kind; uint8_t pad; uint16_t ext_watch; int32_t epfd; uint64_t lid; struct gconn *g; };
static struct fdent g_fd[MAX_FDS];

static inline int active_here(void) { return g_active && !t_guard && t_tid >= 0; }
static inline uint32_t cur_mode(void) { return __atomic_load_n(&g_ctl->mode, __ATOMIC_ACQUIRE); }
static inline uint64_t new_lid(void) { return ((uint64_t)(uint32_t)t_tid << 32) | ++t_created; }

static int64_t mono_ns(void) {
    struct timespec ts;
    R(clock_gettime)(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ------------------------------------------------------------------ GIL */

static int gil_held(void) {
    if (!py_tstate_current || !py_tstate_this) return 0;
    void *cur = py_tstate_current();
    return cur != NULL && cur == py_tstate_this();
}
static void *gil_drop(void) {
    if (!py_save_thread || !gil_held()) return NULL;
    __atomic_fetch_add(&g_ctl->stats[LLFT_ST_GIL_DROPS], 1, __ATOMIC_RELAXED);
    return py_save_thread();
}
static void gil_take(void *ts) { if (ts) py_restore_thread(ts); }

/* ------------------------------------------------------------------ divergence */

static void op_name(uint64_t op, char *buf, size_t n) {
    uint64_t low = LLFT_OP_LOW(op);
    switch (LLFT_OP_CLASS(op)) {
    case LLFT_OPC_CLOCK: snprintf(buf, n, "clock %llu", (unsigned long long)low); break;
    case LLFT_OPC_SEM: snprintf(buf, n, "lock %llu:%llu", (unsigned long long)(low >> 32),
                                (unsigned long long)(low & 0xffffffffu)); break;
    case LLFT_OPC_MUTEX: snprintf(buf, n, "mutex %llu:%llu", (unsigned long long)(low >> 32),
                                  (unsigned long long)(low & 0xffffffffu)); break;
    case LLFT_OPC_THREAD: snprintf(buf, n, "thread %llu", (unsigned long long)low); break;
    case LLFT_OPC_FD: snprintf(buf, n, "socket %llu:%llu", (unsigned long long)(low >> 32),
                               (unsigned long long)(low & 0xffffffffu)); break;
    default: snprintf(buf, n, "op %#llx", (unsigned long long)op);
    }
}

/* A divergence ends the process (exit status 86) after writing the report once.
 * `gconn`/`goff` >= 0: a group connection's write differed (ctl.div_*). */
__attribute__((noreturn))
static void vdiverge(int64_t gconn, int64_t goff, const char *fmt, va_list ap) {
    char msg[LLFT_REPORT_BYTES];
    int k = vsnprintf(msg, sizeof msg - 1, fmt, ap);
    if (k < 0) k = 0;
    if (k > (int)sizeof msg - 2) k = (int)sizeof msg - 2;
    msg[k] = '\n';
    msg[k + 1] = 0;
    uint32_t zero = 0;
    if (__atomic_compare_exchange_n(&g_ctl->diverged, &zero, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        if (gconn >= 0) {
            g_ctl->div_conn = (uint32_t)gconn;
            g_ctl->div_offset = (uint64_t)goff;
            __atomic_store_n(&g_ctl->div_set, 1, __ATOMIC_RELEASE);
        }
        memcpy(g_ctl->report, msg, (size_t)k + 2);
        R(write)(2, "llft: ", 6);
        R(write)(2, msg, (size_t)k + 1);
        /* where in the program: the diverging thread's Python stack, if it has one */
        void *ts = py_tstate_this ? py_tstate_this() : NULL;
        if (ts && py_dump_traceback) {
            R(write)(2, "llft: Python stack of the diverging thread (most recent call first):\n", 70);
            py_dump_traceback(2, ts);
        }
    }
    syscall(SYS_exit_group, LLFT_EXIT_DIVERGED);
    __builtin_unreachable();
}
__attribute__((noreturn, format(printf, 1, 2)))
static void diverge(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vdiverge(-1, -1, fmt, ap);
}
__attribute__((noreturn, format(printf, 3, 4)))
static void diverge_group(uint32_t conn, uint64_t off, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vdiverge(conn, (int64_t)off, fmt, ap);
}

static void debug_line(const char *what, const struct llft_rec *h) {
    char line[200], on[64];
    op_name(h->op, on, sizeof on);
    int k = snprintf(line, sizeof line, "llft[%s] t%u #%llu %s(%s) -> %lld err %d aux %u dlen %u oseq %llu\n",
                     what, h->tid, (unsigned long long)h->n, llft_call_name(h->call), on,
                     (long long)h->ret, h->err, h->aux, h->dlen, (unsigned long long)h->oseq);
    R(write)(2, line, (size_t)(k > 0 && k < (int)sizeof line ? k : 0));
}

/* ------------------------------------------------------------------ primary */

static void pr_append(unsigned call, uint64_t op, int64_t ret, int32_t err, uint32_t aux,
                      uint16_t flags, const void *data, uint32_t dlen) {
    struct llft_rec h;
    memset(&h, 0, sizeof h);
    h.call = (uint16_t)call;
    h.flags = flags;
    h.tid = (uint32_t)t_tid;
    h.n = t_n++;
    h.op = op;
    h.ret = ret;
    h.err = err;
    h.aux = aux;
    if (dlen > LLFT_MAX_DATA_BYTES) dlen = LLFT_MAX_DATA_BYTES;
    uint32_t len = llft_align8(LLFT_REC_HDR + dlen);
    struct llft_ring *r = &g_shm->out;
    uint64_t pos = llft_ring_reserve(r, len);
    if (!llft_ring_wait_space(r, LLFT_OUT_CAP_BYTES, pos, len, 0)) {
        /* The drainer is behind: wait without the GIL, it is another process. */
        __atomic_fetch_add(&g_ctl->stats[LLFT_ST_RING_FULL], 1, __ATOMIC_RELAXED);
        void *gil = gil_drop();
        while (!llft_ring_wait_space(r, LLFT_OUT_CAP_BYTES, pos, len, WAIT_SLICE_MS)) {}
        gil_take(gil);
    }
    llft_ring_commit(r, g_shm->out_data, LLFT_OUT_CAP_BYTES, pos, &h, data, dlen);
    __atomic_fetch_add(&g_ctl->stats[LLFT_ST_RECORDS], 1, __ATOMIC_RELAXED);
    if (g_debug) debug_line("rec", &h);
}

/* ------------------------------------------------------------------ backup */

/* Per-operation completed-record counters: the head of each o.orderinfo queue. */
struct opctr { uint64_t key; uint32_t count; uint32_t waiters; };
static struct opctr *g_optab;  /* OPTAB_SIZE entries, mmap'd at activation */

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}
static struct opctr *opctr_get(uint64_t key) {
    uint32_t h = (uint32_t)mix64(key) & (OPTAB_SIZE - 1);
    for (uint32_t i = 0; i < OPTAB_SIZE; i++) {
        struct opctr *e = &g_optab[(h + i) & (OPTAB_SIZE - 1)];
        uint64_t k = __atomic_load_n(&e->key, __ATOMIC_ACQUIRE);
        if (k == key) return e;
        if (k == 0) {
            uint64_t exp = 0;
            if (__atomic_compare_exchange_n(&e->key, &exp, key, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)
                || exp == key)
                return e;
        }
    }
    diverge("operation table full (%u operations): raise OPTAB_SIZE", OPTAB_SIZE);
}

struct bk {
    struct llft_rec h;
    struct opctr *ctr;
    void *gil;      /* thread state saved if we released the GIL to wait */
};

/* Stall detection: a wait with no progress anywhere for stall_ms is reported. */
struct stallw { int64_t since; uint32_t progress; };
static void stall_check(struct stallw *s, const char *what, unsigned call, uint64_t op) {
    uint32_t p = __atomic_load_n(&g_ctl->progress, __ATOMIC_ACQUIRE);
    int64_t now = mono_ns();
    if (s->since == 0 || p != s->progress) { s->since = now; s->progress = p; return; }
    uint32_t lim = g_ctl->stall_ms ? g_ctl->stall_ms : 10000;
    if (now - s->since > (int64_t)lim * 1000000LL) {
        char on[64];
        op_name(op, on, sizeof on);
        diverge("stall: thread %d call #%llu %s(%s) waited %u ms for %s with no progress",
                t_tid, (unsigned long long)t_n, llft_call_name(call), on, lim, what);
    }
}

/* Wait until every earlier record of o has completed (the o.orderinfo queue). */
static void bk_wait_turn(struct bk *b, unsigned call, uint64_t op) {
    struct stallw sw = {0, 0};
    b->ctr = opctr_get(b->h.op);
    for (;;) {
        uint32_t c = __atomic_load_n(&b->ctr->count, __ATOMIC_ACQUIRE);
        if (c == (uint32_t)b->h.oseq) break;
        if (c > (uint32_t)b->h.oseq) {
            char on[64];
            op_name(op, on, sizeof on);
            diverge("internal: %s(%s) completed %u records, thread %d's record is #%llu",
                    llft_call_name(call), on, c, t_tid, (unsigned long long)b->h.oseq);
        }
        if (!b->gil) b->gil = gil_drop();
        __atomic_fetch_add(&g_ctl->stats[LLFT_ST_WAITS], 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&b->ctr->waiters, 1, __ATOMIC_ACQ_REL);
        if (__atomic_load_n(&b->ctr->count, __ATOMIC_ACQUIRE) == c)
            llft_futex(&b->ctr->count, FUTEX_WAIT_PRIVATE, c, WAIT_SLICE_MS);
        __atomic_fetch_sub(&b->ctr->waiters, 1, __ATOMIC_ACQ_REL);
        stall_check(&sw, "its turn", call, op);
    }
}

/* The record's call is complete here: pop it, advance o's queue, wake. */
static void bk_complete(struct bk *b) {
    struct llft_ring *r = &g_shm->tring[t_tid];
    llft_ring_pop(r, g_shm->tring_data[t_tid], LLFT_TRING_CAP_BYTES, b->h.len);
    __atomic_fetch_add(&b->ctr->count, 1, __ATOMIC_ACQ_REL);
    if (__atomic_load_n(&b->ctr->waiters, __ATOMIC_ACQUIRE))
        llft_futex_wake_all(&b->ctr->count, 0);
    __atomic_fetch_add(&g_ctl->progress, 1, __ATOMIC_ACQ_REL);
    __atomic_fetch_add(&g_ctl->stats[LLFT_ST_RECORDS], 1, __ATOMIC_RELAXED);
    t_n++;
    if (g_debug) debug_line("rep", &b->h);
}

#define BK_PRIMARY 0   /* promoted meanwhile and no record left: act as a primary */
#define BK_RECORD  1   /* b->h is this call's record, its turn has come */
#define BK_NO_HINT 2   /* a private read with no size hint: pass through */

/* Take thread t's next record and wait for its turn on o.
 * Private-read records are HINTS (see shim_net.inc): a call that is not the hinted
 * read completes and skips them; a private read with no hint passes through. */
static int bk_begin(struct bk *b, unsigned call, uint64_t op, void *payload, uint32_t cap) {
    struct llft_ring *r = &g_shm->tring[t_tid];
    uint8_t *data = g_shm->tring_data[t_tid];
    struct stallw sw = {0, 0};
    b->gil = NULL;
    uint32_t len;
    uint64_t t;
    for (;;) {
        for (;;) {
            uint32_t seq = __atomic_load_n(&r->pub_seq, __ATOMIC_ACQUIRE);
            len = llft_ring_peek(r, data, LLFT_TRING_CAP_BYTES);
            if (len) break;
            if (cur_mode() == LLFT_MODE_PRIMARY) { gil_take(b->gil); b->gil = NULL; return BK_PRIMARY; }
            int parked = 0;
            if (__atomic_load_n(&g_ctl->feed_done, __ATOMIC_ACQUIRE)) {
                if (llft_ring_peek(r, data, LLFT_TRING_CAP_BYTES)) continue;
                if (call == LLFT_C_PRIVATE_RECV) { gil_take(b->gil); b->gil = NULL; return BK_NO_HINT; }
                if (t_tid == 0) {   /* the primary's process ended through its main thread */
                    char on[64];
                    op_name(op, on, sizeof on);
                    diverge("divergence: thread %d call #%llu: the trace has no more calls for this "
                            "thread, the program made %s(%s)", t_tid, (unsigned long long)t_n,
                            llft_call_name(call), on);
                }
                /* Another thread past the end of a complete trace: this call had not
                 * returned at the primary when it ended (a daemon thread asleep or
                 * blocked at exit). Park it, as it was there; the process ends around it. */
                parked = 1;
            }
            if (!b->gil) b->gil = gil_drop();
            __atomic_fetch_add(&g_ctl->stats[LLFT_ST_WAITS], 1, __ATOMIC_RELAXED);
            llft_ring_wait_pub(r, seq, parked ? 1000 : WAIT_SLICE_MS);
            if (!parked) stall_check(&sw, "its record", call, op);
        }
        t = __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE);
        llft_ring_copy_out(data, LLFT_TRING_CAP_BYTES, t, &b->h, LLFT_REC_HDR);
        b->h.len = len;
        int is_hint = b->h.call == LLFT_C_PRIVATE_RECV;
        if (call == LLFT_C_PRIVATE_RECV && !(is_hint && b->h.op == op && b->h.n == t_n)) {
            gil_take(b->gil);
            b->gil = NULL;
            return BK_NO_HINT;
        }
        if (is_hint && call != LLFT_C_PRIVATE_RECV && b->h.n == t_n) {
            bk_wait_turn(b, b->h.call, b->h.op);   /* skip a hint the program did not use */
            bk_complete(b);
            continue;
        }
        break;
    }
    if (b->h.call != call || b->h.op != op || b->h.n != t_n || b->h.tid != (uint32_t)t_tid) {
        char on_exp[64], on_got[64];
        op_name(b->h.op, on_exp, sizeof on_exp);
        op_name(op, on_got, sizeof on_got);
        diverge("divergence: thread %d call #%llu: the trace has %s(%s) [thread %u call #%llu], "
                "the program made %s(%s)", t_tid, (unsigned long long)t_n,
                llft_call_name(b->h.call), on_exp, b->h.tid, (unsigned long long)b->h.n,
                llft_call_name(call), on_got);
    }
    if (b->h.dlen) {
        if (!payload || b->h.dlen > cap)
            diverge("divergence: thread %d call #%llu %s: the trace returned %u bytes, the "
                    "program asked for %u", t_tid, (unsigned long long)t_n,
                    llft_call_name(call), b->h.dlen, cap);
        llft_ring_copy_out(data, LLFT_TRING_CAP_BYTES, t + LLFT_REC_HDR, payload, b->h.dlen);
    }
    bk_wait_turn(b, call, op);
    return BK_RECORD;
}

static void bk_end(struct bk *b) {
    bk_complete(b);
    gil_take(b->gil);
    b->gil = NULL;
}

static inline int backup_now(void) { return cur_mode() == LLFT_MODE_BACKUP; }

/* ------------------------------------------------------------------ activation */

static void strip_env(void) {
    const char *lp = getenv("LD_PRELOAD");
    if (lp && strstr(lp, "libllft_preload")) {
        char keep[4096];
        size_t k = 0;
        const char *p = lp;
        while (*p) {
            const char *e = p + strcspn(p, ": ");
            size_t n = (size_t)(e - p);
            if (n && !memmem(p, n, "libllft_preload", 15) && k + n + 2 < sizeof keep) {
                if (k) keep[k++] = ':';
                memcpy(keep + k, p, n);
                k += n;
            }
            p = *e ? e + 1 : e;
        }
        keep[k] = 0;
        if (k) setenv("LD_PRELOAD", keep, 1);
        else unsetenv("LD_PRELOAD");
    }
    unsetenv("LLFT_SHM");
    unsetenv("LLFT_ROOT_PID");
    unsetenv("LLFT_EXTERNAL_PORTS");
    unsetenv("LLFT_SERVICE_PORT");
}

static void child_after_fork(void) { g_active = 0; }

static void add_internal_range(const char *sym) {
    void *p = dlsym(RTLD_DEFAULT, sym);
    if (!p || g_nint >= MAX_INTERNAL) return;
    Dl_info info;
    const ElfW(Sym) *es = NULL;
    size_t size = 256;
    if (dladdr1(p, &info, (void **)&es, RTLD_DL_SYMENT) && es && es->st_size) size = es->st_size;
    g_int_lo[g_nint] = (uintptr_t)p;
    g_int_hi[g_nint] = (uintptr_t)p + size;
    g_nint++;
}

__attribute__((constructor(101)))
static void llft_init(void) {
    t_guard++;
    const char *root = getenv("LLFT_ROOT_PID");
    const char *path = getenv("LLFT_SHM");
    if (!root || !path) goto out;                 /* not started by llft: inert */
    if (getpid() != (pid_t)atoi(root)) { strip_env(); goto out; }  /* a descendant */
    if (!dlsym(RTLD_DEFAULT, "Py_IsInitialized")) goto out;        /* bash wrapper, java */
    int fd = R(open)(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) { R(write)(2, "llft: cannot open LLFT_SHM\n", 27); goto out; }
    void *m = mmap(NULL, sizeof(struct llft_shm), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    R(close)(fd);
    if (m == MAP_FAILED) { R(write)(2, "llft: cannot map LLFT_SHM\n", 26); goto out; }
    g_shm = m;
    g_ctl = &g_shm->ctl;
    if (g_ctl->magic != LLFT_SHM_MAGIC || g_ctl->version != LLFT_SHM_VERSION) {
        R(write)(2, "llft: LLFT_SHM has a wrong magic/version\n", 41);
        goto out;
    }
    void *ot = mmap(NULL, (size_t)OPTAB_SIZE * sizeof(struct opctr), PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (ot == MAP_FAILED) goto out;
    g_optab = ot;
    g_debug = getenv("LLFT_DEBUG") ? atoi(getenv("LLFT_DEBUG")) : 0;
    const char *ports = getenv("LLFT_EXTERNAL_PORTS");
    while (ports && *ports && g_n_ext_ports < MAX_EXT_PORTS) {
        char *end;
        long v = strtol(ports, &end, 10);
        if (end == ports) break;
        if (v > 0 && v < 65536) g_ext_ports[g_n_ext_ports++] = (uint16_t)v;
        ports = *end ? end + 1 : end;
    }
    const char *svc = getenv("LLFT_SERVICE_PORT");
    if (svc) { long v = atol(svc); if (v > 0 && v < 65536) g_service_port = (uint16_t)v; }
    py_is_initialized = (int (*)(void))dlsym(RTLD_DEFAULT, "Py_IsInitialized");
    py_tstate_current = (void *(*)(void))dlsym(RTLD_DEFAULT, "_PyThreadState_UncheckedGet");
    py_tstate_this = (void *(*)(void))dlsym(RTLD_DEFAULT, "PyGILState_GetThisThreadState");
    py_save_thread = (void *(*)(void))dlsym(RTLD_DEFAULT, "PyEval_SaveThread");
    py_restore_thread = (void (*)(void *))dlsym(RTLD_DEFAULT, "PyEval_RestoreThread");
    py_dump_traceback = (void (*)(int, void *))dlsym(RTLD_DEFAULT, "_Py_DumpTraceback");
    py_gc_disable = (int (*)(void))dlsym(RTLD_DEFAULT, "PyGC_Disable");
    py_import = (void *(*)(const char *))dlsym(RTLD_DEFAULT, "PyImport_ImportModule");
    py_getattr = (void *(*)(void *, const char *))dlsym(RTLD_DEFAULT, "PyObject_GetAttrString");
    py_call1 = (void *(*)(void *, void *))dlsym(RTLD_DEFAULT, "PyObject_CallOneArg");
    py_long = (void *(*)(long))dlsym(RTLD_DEFAULT, "PyLong_FromLong");
    py_decref = (void (*)(void *))dlsym(RTLD_DEFAULT, "Py_DecRef");
    py_err_fetch = (void (*)(void **, void **, void **))dlsym(RTLD_DEFAULT, "PyErr_Fetch");
    py_err_restore = (void (*)(void *, void *, void *))dlsym(RTLD_DEFAULT, "PyErr_Restore");
    py_err_clear = (void (*)(void))dlsym(RTLD_DEFAULT, "PyErr_Clear");
    add_internal_range("_PyTime_GetMonotonicClock");
    add_internal_range("_PyTime_GetPerfCounter");
    /* resolve every real symbol now, single-threaded, rather than on a hot path */
    R(clock_gettime); R(gettimeofday); R(time); R(clock_nanosleep); R(nanosleep);
    R(getrandom); R(open64); R(openat); R(openat64); R(read); R(sem_init); R(sem_destroy);
    R(sem_wait); R(sem_trywait); R(sem_timedwait); R(sem_clockwait); R(pthread_mutex_init);
    R(pthread_mutex_destroy); R(pthread_mutex_lock); R(pthread_mutex_trylock);
    R(pthread_mutex_timedlock); R(pthread_create); R(socket); R(socketpair); R(bind);
    R(connect); R(accept); R(accept4); R(recv); R(recvfrom); R(recvmsg); R(send); R(sendto);
    R(sendmsg); R(poll); R(select); R(epoll_create1); R(epoll_create); R(epoll_ctl);
    R(epoll_wait); R(epoll_pwait); R(getsockopt); R(getsockname); R(getpeername); R(shutdown);
    R(listen); R(readv); R(writev);
    strip_env();
    pthread_atfork(NULL, NULL, child_after_fork);
    g_pid = getpid();
    g_ctl->active_pid = (uint32_t)g_pid;
    t_tid = 0;
    __atomic_store_n(&g_active, 1, __ATOMIC_RELEASE);
out:
    t_guard--;
}

/* ------------------------------------------------------------------ CTS: clocks */

static int clock_app_visible(void *ra) {
    uintptr_t a = (uintptr_t)ra;
    for (int i = 0; i < g_nint; i++)
        if (a >= g_int_lo[i] && a < g_int_hi[i]) return 0;
    return gil_held();
}
static int clock_is_wall_or_mono(clockid_t c) {
    return c != CLOCK_PROCESS_CPUTIME_ID && c != CLOCK_THREAD_CPUTIME_ID;
}

/* ------------------------------------------------------------------ garbage collection
 *
 * CPython's cyclic GC runs when a global allocation count crosses a threshold, in
 * whichever thread allocates then: with several threads, where (and in which thread)
 * finalizers and weakref callbacks run is decided by thread interleaving, which replay
 * does not reproduce. PySpark frees Java objects from exactly such callbacks (py4j
 * takes a lock and talks to the JVM there), so a backup's threads made calls the
 * primary's had not made at that point. Instead, automatic collection is switched off
 * and the main thread collects at deterministic points: every GC_EVERY-th ordered
 * clock read it makes (the same calls at every replica), gen 1 every 10th time, gen 2
 * every 100th. What a collection's finalizers do is not ordered (t_guard): the garbage
 * found may differ slightly between replicas, and its effects are private (freeing
 * JVM objects). Locks and sockets created during a collection are never ordered. */
#define GC_EVERY 64
static void *g_gc_collect;       /* gc.collect, or NULL before set-up / if unavailable */
static int g_gc_state;           /* 0 not yet, 1 set up, -1 unavailable */
static TLS uint32_t t_gc_points;

static void gc_point(int may_collect) {
    if (t_tid != 0 || g_gc_state < 0 || !gil_held()) return;
    if (g_gc_state == 0) {
        if (!py_gc_disable || !py_import || !py_getattr || !py_call1 || !py_long || !py_decref
            || !py_err_fetch || !py_err_restore || !py_err_clear) { g_gc_state = -1; return; }
        void *et, *ev, *tb;
        py_err_fetch(&et, &ev, &tb);
        void *m = py_import("gc");
        g_gc_collect = m ? py_getattr(m, "collect") : NULL;
        if (m) py_decref(m);
        if (!g_gc_collect) { py_err_clear(); py_err_restore(et, ev, tb); g_gc_state = -1; return; }
        py_gc_disable();
        py_err_restore(et, ev, tb);
        g_gc_state = 1;
    }
    if (!may_collect || ++t_gc_points % GC_EVERY) return;
    uint32_t n = t_gc_points / GC_EVERY;
    long gen = n % 100 == 0 ? 2 : n % 10 == 0 ? 1 : 0;
    t_guard++;
    void *et, *ev, *tb;
    py_err_fetch(&et, &ev, &tb);
    void *arg = py_long(gen);
    void *r = arg ? py_call1(g_gc_collect, arg) : NULL;
    if (arg) py_decref(arg);
    if (r) py_decref(r); else py_err_clear();
    py_err_restore(et, ev, tb);
    t_guard--;
}

/* One virtual group clock reading, in ns. Returns 0 or -1 with *err set. */
static int cts_read(unsigned call, clockid_t clk, int64_t *v, int *err) {
    uint64_t op = LLFT_OP(LLFT_OPC_CLOCK, (uint64_t)clk);
    struct timespec ts;
    if (backup_now()) {
        struct bk b;
        if (bk_begin(&b, call, op, NULL, 0)) {
            *v = b.h.ret;
            *err = b.h.err;
            if (!b.h.err && clock_is_wall_or_mono(clk) && R(clock_gettime)(clk, &ts) == 0) {
                /* the offset a promoted backup keeps adding (paper, CTS) */
                g_clk_off[clk] = b.h.ret - ((int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec);
                g_clk_last[clk] = b.h.ret;
            }
            bk_end(&b);
            return b.h.err ? -1 : 0;
        }
    }
    int r = R(clock_gettime)(clk, &ts);
    *err = r ? errno : 0;
    *v = 0;
    if (!r) {
        int64_t x = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
        if (clock_is_wall_or_mono(clk)) {
            x += g_clk_off[clk];
            int64_t last = __atomic_load_n(&g_clk_last[clk], __ATOMIC_ACQUIRE);
            while (x > last && !__atomic_compare_exchange_n(&g_clk_last[clk], &last, x, 0,
                                                            __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {}
            if (x < last) x = last;
        }
        *v = x;
    }
    pr_append(call, op, r ? -1 : *v, *err, 0, 0, NULL, 0);
    return r;
}

EXPORT int clock_gettime(clockid_t clk, struct timespec *tp) {
    void *ra = __builtin_return_address(0);
    if (!active_here() || clk < 0 || clk >= NCLOCKS || !clock_app_visible(ra))
        return R(clock_gettime)(clk, tp);
    t_guard++;
    int64_t v; int err;
    int r = cts_read(LLFT_C_CLOCK_GETTIME, clk, &v, &err);
    if (!r) { tp->tv_sec = v / 1000000000LL; tp->tv_nsec = v % 1000000000LL; }
    t_guard--;
    gc_point(1);
    if (r) errno = err;
    return r;
}

EXPORT int gettimeofday(struct timeval *tv, void *tz) {
    void *ra = __builtin_return_address(0);
    if (!active_here() || !clock_app_visible(ra)) return R(gettimeofday)(tv, tz);
    t_guard++;
    int64_t v; int err;
    int r = cts_read(LLFT_C_GETTIMEOFDAY, CLOCK_REALTIME, &v, &err);
    if (!r) { tv->tv_sec = v / 1000000000LL; tv->tv_usec = (v % 1000000000LL) / 1000; }
    if (tz) memset(tz, 0, 8);
    t_guard--;
    gc_point(1);
    if (r) errno = err;
    return r;
}

EXPORT time_t time(time_t *out) {
    void *ra = __builtin_return_address(0);
    if (!active_here() || !clock_app_visible(ra)) return R(time)(out);
    t_guard++;
    int64_t v; int err;
    int r = cts_read(LLFT_C_TIME, CLOCK_REALTIME, &v, &err);
    t_guard--;
    time_t s = r ? (time_t)-1 : (time_t)(v / 1000000000LL);
    if (out && !r) *out = s;
    return s;
}

/* A thread that slept at the primary let the others run meanwhile; some programs
 * then look at what they did WITHOUT a lock (py4j's FinalizerWorker polls a deque
 * every second, a race only the GIL arbitrates). A backup thread therefore ends its
 * sleep only once as many entries have completed here as had been appended at the
 * primary before the sleep returned (the feeder stamps that count in `aux`). This
 * narrows such races to the instant between two ordered calls; it cannot close them
 * (that would take ordering every GIL hand-over). */
static void sleep_barrier(struct bk *b) {
    struct stallw sw = {0, 0};
    while (__atomic_load_n(&g_ctl->progress, __ATOMIC_ACQUIRE) < b->h.aux) {
        if (!b->gil) b->gil = gil_drop();
        struct timespec ms = {0, 500000};
        R(nanosleep)(&ms, NULL);
        stall_check(&sw, "the other threads to catch up with its sleep", b->h.call, b->h.op);
    }
}

/* time.sleep is clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME) with the GIL released,
 * its deadline computed from a (virtual) monotonic read. A primary translates virtual
 * deadlines by its clock offset (non-zero only after a promotion); a backup does not
 * sleep at all: it returns the recorded outcome, and its next ordered call waits for
 * the primary anyway. */
EXPORT int clock_nanosleep(clockid_t clk, int flags, const struct timespec *req, struct timespec *rem) {
    if (!active_here()) return R(clock_nanosleep)(clk, flags, req, rem);
    t_guard++;
    uint64_t op = LLFT_OP(LLFT_OPC_THREAD, (uint64_t)t_tid);
    int r;
    struct bk b;
    if (backup_now() && bk_begin(&b, LLFT_C_CLOCK_NANOSLEEP, op, NULL, 0)) {
        r = (int)b.h.ret;
        if (rem) memset(rem, 0, sizeof *rem);
        sleep_barrier(&b);
        bk_end(&b);
    } else {
        struct timespec adj;
        if ((flags & TIMER_ABSTIME) && clk >= 0 && clk < NCLOCKS && g_clk_off[clk] && req) {
            int64_t d = (int64_t)req->tv_sec * 1000000000LL + req->tv_nsec - g_clk_off[clk];
            adj.tv_sec = d / 1000000000LL;
            adj.tv_nsec = d % 1000000000LL;
            req = &adj;
        }
        r = R(clock_nanosleep)(clk, flags, req, rem);
        pr_append(LLFT_C_CLOCK_NANOSLEEP, op, r, 0, 0, 0, NULL, 0);
    }
    t_guard--;
    return r;
}

EXPORT int nanosleep(const struct timespec *req, struct timespec *rem) {
    if (!active_here()) return R(nanosleep)(req, rem);
    t_guard++;
    uint64_t op = LLFT_OP(LLFT_OPC_THREAD, (uint64_t)t_tid);
    int r, e;
    struct bk b;
    if (backup_now() && bk_begin(&b, LLFT_C_NANOSLEEP, op, NULL, 0)) {
        r = (int)b.h.ret;
        e = b.h.err;
        if (rem) memset(rem, 0, sizeof *rem);
        sleep_barrier(&b);
        bk_end(&b);
    } else {
        r = R(nanosleep)(req, rem);
        e = r ? errno : 0;
        pr_append(LLFT_C_NANOSLEEP, op, r, e, 0, 0, NULL, 0);
    }
    t_guard--;
    errno = e ? e : errno;
    return r;
}

/* ------------------------------------------------------------------ randomness */

static ssize_t random_call(unsigned call, int fd, void *buf, size_t n, unsigned flags) {
    uint64_t op = LLFT_OP(LLFT_OPC_THREAD, (uint64_t)t_tid);
    if (n > LLFT_MAX_DATA_BYTES) n = LLFT_MAX_DATA_BYTES;  /* a short read is legal */
    ssize_t r;
    int e;
    struct bk b;
    if (backup_now() && bk_begin(&b, call, op, buf, (uint32_t)n)) {
        r = (ssize_t)b.h.ret;
        e = b.h.err;
        bk_end(&b);
    } else {
        r = call == LLFT_C_GETRANDOM ? R(getrandom)(buf, n, flags) : R(read)(fd, buf, n);
        e = r < 0 ? errno : 0;
        pr_append(call, op, r, e, 0, 0, buf, r > 0 ? (uint32_t)r : 0);
    }
    errno = e ? e : errno;
    return r;
}

EXPORT ssize_t getrandom(void *buf, size_t n, unsigned flags) {
    if (!active_here()) return R(getrandom)(buf, n, flags);
    t_guard++;
    ssize_t r = random_call(LLFT_C_GETRANDOM, -1, buf, n, flags);
    int e = errno;
    t_guard--;
    errno = e;
    return r;
}

static int is_random_path(const char *p) {
    return p && (!strcmp(p, "/dev/urandom") || !strcmp(p, "/dev/random"));
}
static void note_open(int fd, const char *path) {
    if (fd >= 0 && fd < MAX_FDS && g_active && is_random_path(path)) {
        g_fd[fd].kind = FDK_RANDOM;
        g_fd[fd].lid = 0;
    }
}
#define OPEN_MODE(flags) \
    mode_t mode = 0; \
    if ((flags) & (O_CREAT | __O_TMPFILE)) { va_list ap; va_start(ap, flags); mode = (mode_t)va_arg(ap, int); va_end(ap); }

EXPORT int open(const char *path, int flags, ...) {
    OPEN_MODE(flags);
    int fd = R(open)(path, flags, mode);
    if (g_active) { int e = errno; note_open(fd, path); errno = e; }
    return fd;
}
EXPORT int open64(const char *path, int flags, ...) {
    OPEN_MODE(flags);
    int fd = R(open64)(path, flags, mode);
    if (g_active) { int e = errno; note_open(fd, path); errno = e; }
    return fd;
}
EXPORT int openat(int dir, const char *path, int flags, ...) {
    OPEN_MODE(flags);
    int fd = R(openat)(dir, path, flags, mode);
    if (g_active) { int e = errno; note_open(fd, path); errno = e; }
    return fd;
}
EXPORT int openat64(int dir, const char *path, int flags, ...) {
    OPEN_MODE(flags);
    int fd = R(openat64)(dir, path, flags, mode);
    if (g_active) { int e = errno; note_open(fd, path); errno = e; }
    return fd;
}

/* ------------------------------------------------------------------ CMTS: locks */

/* address -> logical lock id, for locks created after the interpreter is up. */
struct lockent { uintptr_t addr; uint64_t lid; };
static struct lockent g_locktab[LOCKTAB_SIZE];
static int g_locktab_spin;
static uint32_t g_nlocks;
#define TOMB ((uintptr_t)1)

static void lt_lock(void) { while (__atomic_exchange_n(&g_locktab_spin, 1, __ATOMIC_ACQUIRE)) __builtin_ia32_pause(); }
static void lt_unlock(void) { __atomic_store_n(&g_locktab_spin, 0, __ATOMIC_RELEASE); }

static void lock_register(const void *addr, uint64_t lid) {
    uint32_t h = (uint32_t)mix64((uintptr_t)addr) & (LOCKTAB_SIZE - 1);
    lt_lock();
    struct lockent *free_slot = NULL;
    for (uint32_t i = 0; i < LOCKTAB_SIZE; i++) {
        struct lockent *e = &g_locktab[(h + i) & (LOCKTAB_SIZE - 1)];
        if (e->addr == (uintptr_t)addr) { e->lid = lid; lt_unlock(); return; }
        if (e->addr == TOMB && !free_slot) free_slot = e;
        if (e->addr == 0) { if (!free_slot) free_slot = e; break; }
    }
    if (free_slot) {
        free_slot->addr = (uintptr_t)addr;
        free_slot->lid = lid;
        __atomic_fetch_add(&g_nlocks, 1, __ATOMIC_RELAXED);
    }
    lt_unlock();
    if (!free_slot) diverge("lock table full (%u live locks)", LOCKTAB_SIZE);
}
static void lock_unregister(const void *addr) {
    if (!__atomic_load_n(&g_nlocks, __ATOMIC_RELAXED)) return;
    uint32_t h = (uint32_t)mix64((uintptr_t)addr) & (LOCKTAB_SIZE - 1);
    lt_lock();
    for (uint32_t i = 0; i < LOCKTAB_SIZE; i++) {
        struct lockent *e = &g_locktab[(h + i) & (LOCKTAB_SIZE - 1)];
        if (e->addr == (uintptr_t)addr) { e->addr = TOMB; g_nlocks--; break; }
        if (e->addr == 0) break;
    }
    lt_unlock();
}
static uint64_t lock_lookup(const void *addr) {
    if (!__atomic_load_n(&g_nlocks, __ATOMIC_RELAXED)) return 0;
    uint32_t h = (uint32_t)mix64((uintptr_t)addr) & (LOCKTAB_SIZE - 1);
    uint64_t lid = 0;
    lt_lock();
    for (uint32_t i = 0; i < LOCKTAB_SIZE; i++) {
        struct lockent *e = &g_locktab[(h + i) & (LOCKTAB_SIZE - 1)];
        if (e->addr == (uintptr_t)addr) { lid = e->lid; break; }
        if (e->addr == 0) break;
    }
    lt_unlock();
    return lid;
}
static int app_era(void) { return py_is_initialized && py_is_initialized(); }

EXPORT int sem_init(sem_t *s, int pshared, unsigned v) {
    int r = R(sem_init)(s, pshared, v);
    if (r == 0 && active_here() && app_era()) {
        t_guard++;
        lock_register(s, new_lid());
        t_guard--;
    }
    return r;
}
EXPORT int sem_destroy(sem_t *s) {
    if (g_active) lock_unregister(s);
    return R(sem_destroy)(s);
}

/* At a backup, a claim the primary won must really happen here too: try first, and
 * only if we would block, block without the GIL (the holder may need it to release). */
static void sem_acquire_for_real(sem_t *s, struct bk *b) {
    if (R(sem_trywait)(s) == 0) return;
    if (!b->gil) b->gil = gil_drop();
    struct stallw sw = {0, 0};
    for (;;) {
        struct timespec dl;
        R(clock_gettime)(CLOCK_MONOTONIC, &dl);
        dl.tv_nsec += WAIT_SLICE_MS * 1000000L;
        if (dl.tv_nsec >= 1000000000L) { dl.tv_sec++; dl.tv_nsec -= 1000000000L; }
        if (R(sem_clockwait)(s, CLOCK_MONOTONIC, &dl) == 0) return;
        stall_check(&sw, "the lock's holder to release it", b->h.call, b->h.op);
    }
}

static int sem_op(unsigned call, sem_t *s, clockid_t clk, const struct timespec *abst) {
    uint64_t op = LLFT_OP(LLFT_OPC_SEM, lock_lookup(s));
    int r, e;
    struct bk b;
    if (backup_now() && bk_begin(&b, call, op, NULL, 0)) {
        if (b.h.ret == 0) { sem_acquire_for_real(s, &b); r = 0; e = 0; }
        else { r = -1; e = b.h.err; }
        bk_end(&b);
    } else {
        switch (call) {
        case LLFT_C_SEM_WAIT: r = R(sem_wait)(s); break;
        case LLFT_C_SEM_TRYWAIT: r = R(sem_trywait)(s); break;
        default:
            r = clk == (clockid_t)-1 ? R(sem_timedwait)(s, abst) : R(sem_clockwait)(s, clk, abst);
        }
        e = r ? errno : 0;
        pr_append(call, op, r, e, 0, 0, NULL, 0);
    }
    errno = e ? e : errno;
    return r;
}

#define SEM_HOOK(name, call, clk, abst, ...) \
    EXPORT int name(__VA_ARGS__) { \
        if (!active_here() || !lock_lookup(s)) return R(name) ARGS_##name; \
        t_guard++; \
        int r = sem_op(call, s, clk, abst); \
        int e = errno; \
        t_guard--; \
        errno = e; \
        return r; \
    }
#define ARGS_sem_wait (s)
#define ARGS_sem_trywait (s)
#define ARGS_sem_timedwait (s, abst)
#define ARGS_sem_clockwait (s, clk, abst)
SEM_HOOK(sem_wait, LLFT_C_SEM_WAIT, 0, NULL, sem_t *s)
SEM_HOOK(sem_trywait, LLFT_C_SEM_TRYWAIT, 0, NULL, sem_t *s)
SEM_HOOK(sem_timedwait, LLFT_C_SEM_TIMEDWAIT, (clockid_t)-1, abst, sem_t *s, const struct timespec *abst)
SEM_HOOK(sem_clockwait, LLFT_C_SEM_TIMEDWAIT, clk, abst, sem_t *s, clockid_t clk, const struct timespec *abst)

/* pthread mutexes of C extensions: the same rules. The GIL and its switch mutex are
 * created during start-up, before Py_IsInitialized(), so they are never registered. */
EXPORT int pthread_mutex_init(pthread_mutex_t *m, const pthread_mutexattr_t *a) {
    int r = R(pthread_mutex_init)(m, a);
    if (r == 0 && active_here() && app_era()) {
        t_guard++;
        lock_register(m, new_lid() | (1ull << 31));
        t_guard--;
    }
    return r;
}
EXPORT int pthread_mutex_destroy(pthread_mutex_t *m) {
    if (g_active) lock_unregister(m);
    return R(pthread_mutex_destroy)(m);
}
static int mutex_op(unsigned call, pthread_mutex_t *m, const struct timespec *abst) {
    uint64_t op = LLFT_OP(LLFT_OPC_MUTEX, lock_lookup(m));
    int r;
    struct bk b;
    if (backup_now() && bk_begin(&b, call, op, NULL, 0)) {
        r = (int)b.h.ret;
        if (r == 0 && R(pthread_mutex_trylock)(m) != 0) {
            if (!b.gil) b.gil = gil_drop();
            r = R(pthread_mutex_lock)(m);
        }
        bk_end(&b);
    } else {
        if (call == LLFT_C_MUTEX_LOCK) r = R(pthread_mutex_lock)(m);
        else if (call == LLFT_C_MUTEX_TRYLOCK) r = R(pthread_mutex_trylock)(m);
        else r = R(pthread_mutex_timedlock)(m, abst);
        pr_append(call, op, r, r, 0, 0, NULL, 0);
    }
    return r;
}
EXPORT int pthread_mutex_lock(pthread_mutex_t *m) {
    if (!active_here() || !lock_lookup(m)) return R(pthread_mutex_lock)(m);
    t_guard++; int r = mutex_op(LLFT_C_MUTEX_LOCK, m, NULL); t_guard--; return r;
}
EXPORT int pthread_mutex_trylock(pthread_mutex_t *m) {
    if (!active_here() || !lock_lookup(m)) return R(pthread_mutex_trylock)(m);
    t_guard++; int r = mutex_op(LLFT_C_MUTEX_TRYLOCK, m, NULL); t_guard--; return r;
}
EXPORT int pthread_mutex_timedlock(pthread_mutex_t *m, const struct timespec *abst) {
    if (!active_here() || !lock_lookup(m)) return R(pthread_mutex_timedlock)(m, abst);
    t_guard++; int r = mutex_op(LLFT_C_MUTEX_TIMEDLOCK, m, abst); t_guard--; return r;
}

/* ------------------------------------------------------------------ threads */

struct tstart { void *(*fn)(void *); void *arg; int tid; };
static void *thread_trampoline(void *p) {
    struct tstart s = *(struct tstart *)p;
    free(p);
    t_tid = s.tid;
    t_n = 0;
    t_created = 0;
    return s.fn(s.arg);
}

EXPORT int pthread_create(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *), void *arg) {
    if (!active_here()) return R(pthread_create)(th, attr, fn, arg);
    gc_point(0);   /* automatic GC off before a second thread exists */
    t_guard++;
    uint64_t op = LLFT_OP(LLFT_OPC_THREAD, (uint64_t)t_tid);
    int r;
    struct bk b;
    struct tstart *ts = malloc(sizeof *ts);
    ts->fn = fn;
    ts->arg = arg;
    if (backup_now() && bk_begin(&b, LLFT_C_THREAD_CREATE, op, NULL, 0)) {
        r = (int)b.h.ret;
        if (r == 0) {
            ts->tid = (int)b.h.aux;
            /* after a promotion this process hands out ids itself: continue above the
             * replayed ones (a reused id would merge two threads' call sequences) */
            uint32_t seen = __atomic_load_n(&g_ctl->next_tid, __ATOMIC_ACQUIRE);
            while (seen < (uint32_t)b.h.aux
                   && !__atomic_compare_exchange_n(&g_ctl->next_tid, &seen, (uint32_t)b.h.aux, 0,
                                                   __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {}
            r = R(pthread_create)(th, attr, thread_trampoline, ts);
            if (r) diverge("thread %d: pthread_create failed here (%d) but succeeded in the trace", t_tid, r);
        } else {
            free(ts);
        }
        bk_end(&b);
    } else {
        uint32_t child = __atomic_add_fetch(&g_ctl->next_tid, 1, __ATOMIC_ACQ_REL);
        if (child >= LLFT_MAX_THREADS)
            diverge("thread %d: more than %u threads in one process lifetime", t_tid, LLFT_MAX_THREADS);
        ts->tid = (int)child;
        r = R(pthread_create)(th, attr, thread_trampoline, ts);
        if (r) free(ts);
        pr_append(LLFT_C_THREAD_CREATE, op, r, 0, r ? 0 : child, 0, NULL, 0);
    }
    t_guard--;
    return r;
}

/* ------------------------------------------------------------------ private state */

/* The app also observes its private companions (the Spark JVM) through the file
 * system and its children's exit: PySpark polls `os.path.isfile(conn_info_file)` and
 * `proc.poll()` every 0.1 s until the JVM is up, so the number of loop turns -- and of
 * the clock reads and sleeps in them -- depends on the JVM's speed. The outcome is
 * ordered like a lock grant: a backup returns "not there yet / still running" when
 * the primary saw that, without looking; and when the primary saw the file or the
 * exit, the backup waits (bounded, stall-checked) until it is true locally too, then
 * returns the local facts. Calls after start-up count (os.stat and os.waitpid drop the
 * GIL around the call; the interpreter's own import stats are synchronous with Python
 * code, so their number is deterministic too). */
static int app_call(void) { return py_is_initialized && py_is_initialized(); }

EXPORT int stat64(const char *path, struct stat64 *st) {
    if (!active_here() || !app_call()) return R(stat64)(path, st);
    t_guard++;
    uint64_t op = LLFT_OP(LLFT_OPC_THREAD, (uint64_t)t_tid);
    int r, e;
    struct bk b;
    if (backup_now() && bk_begin(&b, LLFT_C_STAT, op, NULL, 0)) {
        if (b.h.ret == 0) {
            struct stallw sw = {0, 0};
            while ((r = R(stat64)(path, st)) != 0) {
                if (!b.gil) b.gil = gil_drop();
                struct timespec ms = {0, 1000000};
                R(nanosleep)(&ms, NULL);
                stall_check(&sw, "a file the primary saw", LLFT_C_STAT, op);
            }
            e = 0;
        } else {
            r = -1;
            e = b.h.err;
        }
        bk_end(&b);
    } else {
        r = R(stat64)(path, st);
        e = r ? errno : 0;
        pr_append(LLFT_C_STAT, op, r, e, 0, 0, NULL, 0);
    }
    t_guard--;
    errno = e ? e : errno;
    return r;
}

EXPORT pid_t waitpid(pid_t pid, int *status, int options) {
    if (!active_here() || !app_call()) return R(waitpid)(pid, status, options);
    t_guard++;
    uint64_t op = LLFT_OP(LLFT_OPC_THREAD, (uint64_t)t_tid);
    pid_t r;
    int e, st = 0;
    struct bk b;
    if (backup_now() && bk_begin(&b, LLFT_C_WAITPID, op, NULL, 0)) {
        r = (pid_t)b.h.ret;
        e = b.h.err;
        if (r > 0) {   /* the child had changed state at the primary: wait for it here */
            struct stallw sw = {0, 0};
            if (!b.gil) b.gil = gil_drop();
            while ((r = R(waitpid)(pid, &st, options | WNOHANG)) == 0) {
                struct timespec ms = {0, 1000000};
                R(nanosleep)(&ms, NULL);
                stall_check(&sw, "a child the primary saw change state", LLFT_C_WAITPID, op);
            }
            if (r > 0) st = (int)b.h.aux;   /* the primary's status */
        }
        bk_end(&b);
    } else {
        r = R(waitpid)(pid, &st, options);
        e = r < 0 ? errno : 0;
        pr_append(LLFT_C_WAITPID, op, r, e, (uint32_t)st, 0, NULL, 0);
    }
    if (status && r > 0) *status = st;
    t_guard--;
    errno = e ? e : errno;
    return r;
}

#include "shim_net.inc"
