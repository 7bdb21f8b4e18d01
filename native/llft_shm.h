/* llft_shm.h -- the shared-memory layout between the preload shim and the agent.
 *
 * Theory of operation
 * -------------------
 * One file in /dev/shm, created and sized by the Python side (determinizer/shm.py),
 * mapped MAP_SHARED by the shim of the one process being determinized. It holds:
 *
 *   ctl      control block: mode (primary/backup), flags, the divergence report.
 *   out      primary direction: ONE multi-producer byte ring. Every app thread appends
 *            a record (t, o, n, d) as its non-deterministic call returns; the order of
 *            reservation on this ring IS the order-info queue of the paper. The agent
 *            (or the recorder) drains it; the drained bytes are the wire codec too.
 *   tring[t] backup direction: one single-producer byte ring per logical thread t.
 *            The feeder (trace reader now, network later) splits the global order by
 *            thread and stamps each record with `oseq`, its position in the queue of
 *            its operation o. Thread t takes its records in order; it may complete
 *            the record only when op o has completed exactly `oseq` earlier records:
 *            this is the paper's o.orderinfo queue, kept as a counter per op.
 *
 * Rings are byte rings of 8-aligned records. A record's first word (len) is written
 * last with release semantics: non-zero means committed. The consumer zeroes what it
 * consumed before advancing `tail`, so a producer that waited for space finds zeros.
 * Every bound is a named constant below (enum llft_bound).
 *
 * Header-only on purpose: the shim (native/shim_*.c) and the cffi module
 * (native/shm_build.py) compile the same inline ring code and read the same
 * declarations (the cdef region below), so the two sides of the boundary cannot drift
 * apart.
 */
#ifndef LLFT_SHM_H
#define LLFT_SHM_H

#include <stdint.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <errno.h>
#include <time.h>
#include <unistd.h>
#include <linux/futex.h>
#include <sys/syscall.h>

#define LLFT_SHM_MAGIC        0x314654464c4c0000ULL
#define LLFT_SHM_VERSION      10u   /* 2: group connections (ctl.group_*, ctl.div_*); 3: GIL records; 4: ctl.hold;
                                      5: thread ids reused (THREAD_EXIT records);
                                      6: output commit of external sends (ctl.commit_*);
                                      7: group connections over AF_UNIX (ctl.group_id,
                                         ctl.agent_pid, ctl.resets);
                                      8: the app's signals and reaped children
                                         (ctl.sent, ctl.reaped);
                                      9: signals its programs' handlers received
                                         (ctl.received);
                                      10: note rings of 512, not 64 */

/* ==== cdef begin ====================================================================
 * Everything up to cdef end is also read by cffi (native/shm_build.py): the Python
 * side takes the record layout and every constant from here, so this is their one
 * definition. Only what cffi's cdef parses: enums, structs, no macros with arguments. */

/* Bounds (TIGER_STYLE: put a limit on everything). */
enum llft_bound {
    LLFT_MAX_THREADS     = 1024,        /* logical threads alive at once (ids of ended threads
                                           are reused: shim_threads.c) */
    LLFT_OUT_CAP_BYTES   = 16 << 20,    /* primary ring */
    LLFT_TRING_CAP_BYTES = 128 << 10,   /* backup ring, per logical thread */
    LLFT_MAX_DATA_BYTES  = 32 << 10,    /* payload of one record (reads are clamped) */
    LLFT_REPORT_BYTES    = 2048,
    LLFT_RESET_SLOTS     = 64,          /* group connection resets in flight (ctl.resets) */
    LLFT_NOTE_SLOTS      = 512          /* the app's latest signals sent and children reaped */
};

/* ctl.resets: who reset a group connection (OR-ed with its index + 1, below 2^30). */
enum llft_reset { LLFT_RESET_BY_AGENT = 0, LLFT_RESET_BY_APP = 0x40000000, LLFT_RESET_CONN_MASK = 0x3fffffff };

/* The exit status of a process that diverged (or stalled) at a backup. */
enum llft_exit { LLFT_EXIT_DIVERGED = 86 };

/* ctl.sent / ctl.reaped: one thing the app did to another process. */
struct llft_proc_note {
    int32_t pid;     /* sent: kill()'s target (< 0: a process group; 0: the app's own group);
                        reaped: the child */
    int32_t value;   /* sent: the signal; reaped: the child's wait status */
};

/* ctl.mode */
enum llft_mode { LLFT_MODE_OFF = 0, LLFT_MODE_PRIMARY = 1, LLFT_MODE_BACKUP = 2 };

/* Operation classes: the top byte of an operation identifier `o` (LLFT_OP below). */
enum llft_op_class {
    LLFT_OPC_CLOCK  = 1,   /* low bits: clockid                            */
    LLFT_OPC_SEM    = 2,   /* low bits: logical lock id (creator<<32|count) */
    LLFT_OPC_MUTEX  = 3,   /* idem, pthread mutexes of C extensions         */
    LLFT_OPC_THREAD = 4,   /* per-thread operations (random, sleep, create) */
    LLFT_OPC_FD     = 5,   /* low bits: logical fd id (creator<<32|count)   */
    LLFT_OPC_GIL    = 6,   /* the GIL (one operation: its hand-offs)         */
    LLFT_OPC_WHERE  = 7    /* low bits: thread; LLFT_C_WHERE annotations only */
};

/* Calls (the record's `call` field): the kinds of entry. Printable names in
 * llft_call_name() below. */
enum llft_call {
    LLFT_C_NONE = 0,
    LLFT_C_CLOCK_GETTIME = 1, LLFT_C_GETTIMEOFDAY, LLFT_C_TIME,
    LLFT_C_CLOCK_NANOSLEEP, LLFT_C_NANOSLEEP,
    LLFT_C_GETRANDOM = 10, LLFT_C_READ_RANDOM, LLFT_C_GETLOADAVG,
    LLFT_C_SEM_WAIT = 20, LLFT_C_SEM_TRYWAIT, LLFT_C_SEM_TIMEDWAIT,
    LLFT_C_MUTEX_LOCK = 30, LLFT_C_MUTEX_TRYLOCK, LLFT_C_MUTEX_TIMEDLOCK,
    LLFT_C_THREAD_CREATE = 40, LLFT_C_THREAD_EXIT,
    LLFT_C_CONNECT = 50, LLFT_C_ACCEPT, LLFT_C_RECV, LLFT_C_SEND, LLFT_C_POLL,
    LLFT_C_SELECT, LLFT_C_EPOLL_WAIT, LLFT_C_GETSOCKOPT, LLFT_C_GETSOCKNAME,
    LLFT_C_GETPEERNAME, LLFT_C_SHUTDOWN,
    LLFT_C_STAT = 61, LLFT_C_WAITPID, LLFT_C_PRIVATE_RECV, LLFT_C_GETPID,
    LLFT_C_BIND,           /* a bind to port 0 (aux: the port the kernel chose) */
    LLFT_C_GIL_TAKE = 70,  /* a thread took the GIL (aux: LLFT_GIL_PREEMPTED) */
    LLFT_C_WHERE = 71      /* LLFT_TRACE_WHERE: the recording thread's Python location
                              (payload, text) at its next call; an annotation, not a call */
};

/* flags bits 8-15 of any record: a signal whose handler ran in the recording thread
 * since its previous record (shim_signals.c); bits 0-7 are the call's own flags. */
enum llft_flag_bits { LLFT_SIGNAL_SHIFT = 8, LLFT_CALL_FLAGS_MASK = 0xff };

/* aux of a GIL_TAKE record: the holder had been asked to drop the GIL (a preemption). */
enum llft_gil_flag { LLFT_GIL_PREEMPTED = 1 };

/* Socket kinds (docs/DESIGN.md "Three kinds of connection"), in record `flags` of
 * CONNECT; LLFT_SK_GROUP also in the flags of the accept/recv/send records of group
 * connections (same call ids as external ones, told apart by the flags). */
enum llft_sock_kind { LLFT_SK_PRIVATE = 1, LLFT_SK_EXTERNAL = 2, LLFT_SK_GROUP = 3 };

/* ctl.stats[] indices */
enum llft_stat {
    LLFT_ST_RECORDS   = 0,   /* records appended (primary) or completed (backup) */
    LLFT_ST_WAITS     = 1,   /* backup: waits that had to sleep */
    LLFT_ST_GIL_DROPS = 2,   /* backup: waits done after releasing the GIL */
    LLFT_ST_RING_FULL = 3,   /* primary: appends that waited for the drainer */
    LLFT_ST_HELD      = 4,   /* primary: appends that waited while ctl.hold was set */
    LLFT_ST_INPUT_WAIT = 5,  /* backup: threads waiting now for the agent's bytes on a group
                                connection (a gauge: the app can go no further without input) */
    LLFT_ST_COMMITS   = 6,   /* primary: external sends that waited for an output commit */
    LLFT_ST_STRAY_CONNS = 7  /* connections to the group listener from a process other than
                                the agent, closed at once (shim_group.c, group_take) */
};

/* The ctl words the agent reads (llft_get in native/shm_build.py). */
enum llft_ctl_word {
    LLFT_CTL_MODE = 0, LLFT_CTL_ACTIVE_PID, LLFT_CTL_FEED_DONE, LLFT_CTL_DIVERGED,
    LLFT_CTL_NEXT_TID, LLFT_CTL_PROGRESS, LLFT_CTL_GROUP_ID,
    LLFT_CTL_DIV_SET, LLFT_CTL_DIV_CONN, LLFT_CTL_HOLD, LLFT_CTL_COMMIT_REQ,
    LLFT_CTL_COMMIT_DONE, LLFT_CTL_CHILD_NEWS
};

/* One order-information entry (t, o, n, d). d = (ret, err, aux, payload). The wire
 * codec: little-endian, 56 bytes, followed by `dlen` payload bytes padded to 8. */
struct llft_rec {
    uint32_t len;    /* whole record incl. header and padding, multiple of 8; commit word */
    uint16_t call;   /* enum llft_call */
    uint16_t flags;  /* call-specific (socket kind, ...) */
    uint32_t tid;    /* logical thread id t */
    uint32_t dlen;   /* payload bytes that follow the header */
    uint64_t n;      /* t's call index: this is t's n-th determinized call */
    uint64_t op;     /* operation identifier o */
    int64_t  ret;    /* return value, or the clock value in ns */
    int32_t  err;    /* errno, 0 if none */
    uint32_t aux;    /* call-specific (child tid, out length, write hash low bits...) */
    uint64_t oseq;   /* backup only: o's completed-record count this entry waits for */
};
/* ==== cdef end ====================================================================== */

#define LLFT_OP(cls, low) (((uint64_t)(cls) << 56) | ((uint64_t)(low) & 0x00ffffffffffffffull))
#define LLFT_OP_CLASS(op) ((unsigned)((op) >> 56))
#define LLFT_OP_LOW(op)   ((op) & 0x00ffffffffffffffull)
#define LLFT_REC_HDR ((uint32_t)sizeof(struct llft_rec))
_Static_assert(sizeof(struct llft_rec) == 56, "wire layout of a record is fixed");

/* 64-aligned, so that the producer's words and the consumer's (each with its pad) are
 * on cache lines of their own wherever the ring lies in the block. */
struct __attribute__((aligned(64))) llft_ring {
    /* producer side */
    uint64_t head;          /* bytes reserved (monotonic) */
    uint32_t pub_seq;       /* futex: bumped after each commit */
    uint32_t pub_waiters;   /* consumers sleeping on pub_seq */
    uint8_t  pad0[48];
    /* consumer side */
    uint64_t tail;          /* bytes consumed (monotonic) */
    uint32_t tail_seq;      /* futex: bumped after each consume */
    uint32_t tail_waiters;  /* producers sleeping on tail_seq */
    uint8_t  pad1[48];
};

struct llft_ctl {
    uint64_t magic;
    uint32_t version;
    uint32_t mode;          /* LLFT_MODE_*; backup -> primary is a promotion */
    uint32_t active_pid;    /* set by the shim when it activates */
    uint32_t feed_done;     /* backup: the feeder will push nothing more */
    uint32_t diverged;      /* set once by the shim; report[] holds why */
    uint32_t next_tid;      /* threads created so far (main thread excluded) */
    uint32_t stall_ms;      /* backup: a wait with no progress this long is a stall */
    uint32_t progress;      /* backup: bumped on every completed record */
    uint64_t stats[8];      /* enum llft_stat */
    char     report[LLFT_REPORT_BYTES];
    /* group connections (shim_group.c): the group listener is a UNIX stream socket in
     * the abstract namespace, "\0llft-group-<active_pid>-<group_id>" (LLFT_GROUP_NAME).
     * group_id is set by the shim after the app's listen() on LLFT_SERVICE_PORT (0 until
     * then, and again once that listener is closed: the next one publishes its id). */
    uint32_t group_id;
    /* the process that made this block (the agent): the only peer the group listener
     * takes a connection from (SO_PEERCRED); 0: any */
    uint32_t agent_pid;
    /* ends of group connections a TCP connection would say and a UNIX one cannot (a
     * reset: UNIX sockets only close): a slot holds LLFT_RESET_* | (connection index +
     * 1), claimed by the side that resets before it closes (compare-and-swap from 0) and
     * taken by the other when it reads the end (llft_reset_mark/llft_reset_take below);
     * the shim clears its connection's slots when the app closes it, the agent the app's
     * marks when it lets the connection go; its own marks stay for the app's read however
     * late, and it lets the oldest go once half the table holds them (one of an app that
     * closed before the reset, determinizer/shm.py). A full table: the end is a plain
     * close (FIN). */
    uint32_t resets[LLFT_RESET_SLOTS];
    /* a group write divergence: div_set = 1 once div_conn (0-based acceptance index of
     * the connection) and div_offset (stream offset of the differing write's first
     * byte) are valid; written once, by the thread that wins `diverged`. */
    uint32_t div_set;
    uint32_t div_conn;
    uint64_t div_offset;
    /* primary: backpressure (docs/LOG.md). While the agent holds it non-zero (a backup's
     * application is beyond the lag bound), every ordered call waits, without the GIL,
     * before it records: the app stops where its next entry would be. A futex word. */
    uint32_t hold;
    uint32_t pad_hold;
    /* primary: output commit for EXTERNAL sends (docs/DESIGN.md, "Output commit"). While
     * commit_on (set by an agent, never by `llft record`), a thread about to send on an
     * external socket takes a ticket (commit_req, bumped; the drainer is woken through
     * out.pub_seq) and waits, without the GIL, until commit_done reaches it: the agent
     * stores a ticket in commit_done once every backup holds every entry appended
     * before the ticket was taken. So an external server never sees an effect of a
     * primary's execution that a successor could not reproduce. Futex words. */
    uint32_t commit_on;
    uint32_t commit_req;
    uint32_t commit_done;
    uint32_t pad_commit;
    /* what the app did to other processes (shim_process.c), for the agent to tell a child
     * the app killed or reaped itself from one killed from outside (llft/runtime/
     * proctree.py ChildWatch): the signals it sent with kill/killpg (before the call
     * makes them) and its children's wait statuses as waitpid reaped them (the real
     * ones, also at a backup). Rings of the latest LLFT_NOTE_SLOTS each (llft_note): a
     * writer claims slot count % LLFT_NOTE_SLOTS by bumping count, then writes it. Every
     * process that maps the block writes them: the app, and its forks before an exec. */
    uint32_t sent_count;
    uint32_t reaped_count;
    struct llft_proc_note sent[LLFT_NOTE_SLOTS];
    struct llft_proc_note reaped[LLFT_NOTE_SLOTS];
    /* ends the app met on its private connections and pipes (a read's EOF, a reset, a
     * broken pipe): how it learns that a child died, besides reaping it. The agent
     * looks for children it does not watch yet when this or reaped_count moved. */
    uint32_t ends_count;
    /* signals a program the app started received from a process and handled (a JVM
     * runs its shutdown hooks on SIGTERM, SIGINT or SIGHUP and exits with status 128 +
     * the signal: an exit, not a death by the signal), noted by its libllft_notes.so
     * (native/notes/): (the receiver, the signal). The agent counts such an exit as
     * the signal's kill (proctree.ChildWatch). */
    uint32_t received_count;
    struct llft_proc_note received[LLFT_NOTE_SLOTS];
};
struct llft_shm {
    struct llft_ctl  ctl;
    struct llft_ring out;
    struct llft_ring tring[LLFT_MAX_THREADS];
    uint8_t out_data[LLFT_OUT_CAP_BYTES];
    uint8_t tring_data[LLFT_MAX_THREADS][LLFT_TRING_CAP_BYTES];
};

/* The group listener's abstract UNIX name (after its leading NUL): active pid, group id. */
#define LLFT_GROUP_NAME "llft-group-%u-%u"

/* ---- what the app did to other processes (ctl.sent, ctl.reaped) -------------------- */

/* The writer: any thread of any process mapping the block (several at once: the slot
 * is claimed by a fetch-and-add, so two never share one; a reader may see a slot of a
 * note still being written, which only a burst of LLFT_NOTE_SLOTS notes makes stale). */
static inline void llft_note(uint32_t *count, struct llft_proc_note *ring, int32_t pid,
                             int32_t value) {
    uint32_t i = __atomic_fetch_add(count, 1, __ATOMIC_ACQ_REL) % LLFT_NOTE_SLOTS;
    __atomic_store_n(&ring[i].pid, pid, __ATOMIC_RELAXED);
    __atomic_store_n(&ring[i].value, value, __ATOMIC_RELEASE);
}

/* ---- group connection resets (ctl.resets), shared by both sides -------------------- */

static inline uint32_t llft_reset_word(uint32_t by, uint32_t conn) {
    return by | ((conn + 1u) & LLFT_RESET_CONN_MASK);
}
/* The resetting side, before it closes: 1 if the other side will be told. */
static inline int llft_reset_mark(struct llft_ctl *c, uint32_t by, uint32_t conn) {
    uint32_t w = llft_reset_word(by, conn);
    for (int i = 0; i < LLFT_RESET_SLOTS; i++) {
        uint32_t zero = 0;
        if (__atomic_compare_exchange_n(&c->resets[i], &zero, w, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            return 1;
    }
    return 0;
}
/* The reading side, at the end of the connection: 1 if it was a reset (taken). */
static inline int llft_reset_take(struct llft_ctl *c, uint32_t by, uint32_t conn) {
    uint32_t w = llft_reset_word(by, conn);
    for (int i = 0; i < LLFT_RESET_SLOTS; i++) {
        uint32_t x = w;
        if (__atomic_load_n(&c->resets[i], __ATOMIC_ACQUIRE) == w
            && __atomic_compare_exchange_n(&c->resets[i], &x, 0, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            return 1;
    }
    return 0;
}

/* ---- inline ring code, shared by both sides --------------------------------------- */

static inline uint32_t llft_align8(uint32_t n) { return (n + 7u) & ~7u; }

static inline long llft_futex(uint32_t *w, int op, uint32_t val, int timeout_ms) {
    struct timespec ts, *tp = NULL;
    if (timeout_ms >= 0) {
        ts.tv_sec = timeout_ms / 1000;
        ts.tv_nsec = (long)(timeout_ms % 1000) * 1000000L;
        tp = &ts;
    }
    return syscall(SYS_futex, w, op, val, tp, NULL, 0);
}
static inline void llft_futex_wake_all(uint32_t *w, int shared) {
    llft_futex(w, shared ? FUTEX_WAKE : FUTEX_WAKE_PRIVATE, 0x7fffffff, -1);
}

static inline void llft_ring_copy_in(uint8_t *data, uint32_t cap, uint64_t pos,
                                     const void *src, uint32_t n) {
    uint32_t off = (uint32_t)(pos % cap), first = cap - off;
    if (first >= n) { memcpy(data + off, src, n); return; }
    memcpy(data + off, src, first);
    memcpy(data, (const uint8_t *)src + first, n - first);
}
static inline void llft_ring_copy_out(const uint8_t *data, uint32_t cap, uint64_t pos,
                                      void *dst, uint32_t n) {
    uint32_t off = (uint32_t)(pos % cap), first = cap - off;
    if (first >= n) { memcpy(dst, data + off, n); return; }
    memcpy(dst, data + off, first);
    memcpy((uint8_t *)dst + first, data, n - first);
}
static inline void llft_ring_zero(uint8_t *data, uint32_t cap, uint64_t pos, uint32_t n) {
    uint32_t off = (uint32_t)(pos % cap), first = cap - off;
    if (first >= n) { memset(data + off, 0, n); return; }
    memset(data + off, 0, first);
    memset(data, 0, n - first);
}

/* Reserve `len` bytes (multi-producer). Returns the position; the caller then waits
 * for space with llft_ring_wait_space() and commits with llft_ring_commit(). */
static inline uint64_t llft_ring_reserve(struct llft_ring *r, uint32_t len) {
    return __atomic_fetch_add(&r->head, (uint64_t)len, __ATOMIC_ACQ_REL);
}
/* 1 when [pos, pos+len) is free; otherwise sleeps at most timeout_ms and returns 0. */
static inline int llft_ring_wait_space(struct llft_ring *r, uint32_t cap, uint64_t pos,
                                       uint32_t len, int timeout_ms) {
    uint32_t seq = __atomic_load_n(&r->tail_seq, __ATOMIC_ACQUIRE);
    if (pos + len <= __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE) + cap) return 1;
    if (timeout_ms == 0) return 0;
    __atomic_fetch_add(&r->tail_waiters, 1, __ATOMIC_ACQ_REL);
    if (pos + len > __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE) + cap)
        llft_futex(&r->tail_seq, FUTEX_WAIT, seq, timeout_ms);
    __atomic_fetch_sub(&r->tail_waiters, 1, __ATOMIC_ACQ_REL);
    return pos + len <= __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE) + cap;
}
/* Write header (len filled in here) + payload at pos, then publish. */
static inline void llft_ring_commit(struct llft_ring *r, uint8_t *data, uint32_t cap,
                                    uint64_t pos, struct llft_rec *h,
                                    const void *payload, uint32_t dlen) {
    uint32_t len = llft_align8(LLFT_REC_HDR + dlen);
    h->dlen = dlen;
    h->len = 0;
    /* everything but the commit word first */
    llft_ring_copy_in(data, cap, pos + 4, (const uint8_t *)h + 4, LLFT_REC_HDR - 4);
    if (dlen) llft_ring_copy_in(data, cap, pos + LLFT_REC_HDR, payload, dlen);
    __atomic_store_n((uint32_t *)(data + (pos % cap)), len, __ATOMIC_RELEASE);
    __atomic_fetch_add(&r->pub_seq, 1, __ATOMIC_ACQ_REL);
    if (__atomic_load_n(&r->pub_waiters, __ATOMIC_ACQUIRE))
        llft_futex_wake_all(&r->pub_seq, 1);
}
/* Committed length of the record at tail, 0 if none yet. */
static inline uint32_t llft_ring_peek(struct llft_ring *r, const uint8_t *data, uint32_t cap) {
    uint64_t t = __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE);
    return __atomic_load_n((const uint32_t *)(data + (t % cap)), __ATOMIC_ACQUIRE);
}
/* Consume the record at tail (single consumer): zero it, advance, wake producers. */
static inline void llft_ring_pop(struct llft_ring *r, uint8_t *data, uint32_t cap, uint32_t len) {
    uint64_t t = __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE);
    llft_ring_zero(data, cap, t, len);
    __atomic_store_n(&r->tail, t + len, __ATOMIC_RELEASE);
    __atomic_fetch_add(&r->tail_seq, 1, __ATOMIC_ACQ_REL);
    if (__atomic_load_n(&r->tail_waiters, __ATOMIC_ACQUIRE))
        llft_futex_wake_all(&r->tail_seq, 1);
}
/* Sleep until something is published after `seq` was read (or timeout). */
static inline void llft_ring_wait_pub(struct llft_ring *r, uint32_t seq, int timeout_ms) {
    __atomic_fetch_add(&r->pub_waiters, 1, __ATOMIC_ACQ_REL);
    llft_futex(&r->pub_seq, FUTEX_WAIT, seq, timeout_ms);
    __atomic_fetch_sub(&r->pub_waiters, 1, __ATOMIC_ACQ_REL);
}

static inline const char *llft_call_name(unsigned c) {
    switch (c) {
    case LLFT_C_CLOCK_GETTIME: return "clock_gettime";
    case LLFT_C_GETTIMEOFDAY: return "gettimeofday";
    case LLFT_C_TIME: return "time";
    case LLFT_C_CLOCK_NANOSLEEP: return "clock_nanosleep";
    case LLFT_C_NANOSLEEP: return "nanosleep";
    case LLFT_C_GETRANDOM: return "getrandom";
    case LLFT_C_READ_RANDOM: return "read(/dev/urandom)";
    case LLFT_C_GETLOADAVG: return "getloadavg";
    case LLFT_C_SEM_WAIT: return "sem_wait";
    case LLFT_C_SEM_TRYWAIT: return "sem_trywait";
    case LLFT_C_SEM_TIMEDWAIT: return "sem_timedwait";
    case LLFT_C_MUTEX_LOCK: return "pthread_mutex_lock";
    case LLFT_C_MUTEX_TRYLOCK: return "pthread_mutex_trylock";
    case LLFT_C_MUTEX_TIMEDLOCK: return "pthread_mutex_timedlock";
    case LLFT_C_THREAD_CREATE: return "pthread_create";
    case LLFT_C_THREAD_EXIT: return "thread end";
    case LLFT_C_CONNECT: return "connect";
    case LLFT_C_ACCEPT: return "accept";
    case LLFT_C_RECV: return "recv";
    case LLFT_C_SEND: return "send";
    case LLFT_C_POLL: return "poll";
    case LLFT_C_SELECT: return "select";
    case LLFT_C_EPOLL_WAIT: return "epoll_wait";
    case LLFT_C_GETSOCKOPT: return "getsockopt";
    case LLFT_C_GETSOCKNAME: return "getsockname";
    case LLFT_C_GETPEERNAME: return "getpeername";
    case LLFT_C_SHUTDOWN: return "shutdown";
    case LLFT_C_STAT: return "stat";
    case LLFT_C_WAITPID: return "waitpid";
    case LLFT_C_PRIVATE_RECV: return "recv(private)";
    case LLFT_C_GETPID: return "getpid";
    case LLFT_C_BIND: return "bind";
    case LLFT_C_GIL_TAKE: return "take the GIL";
    case LLFT_C_WHERE: return "where";
    default: return "?";
    }
}

/* "lock 3:9": an operation identifier as the divergence reports and the tools name it. */
static inline void llft_op_name(uint64_t op, char *buf, size_t n) {
    uint64_t low = LLFT_OP_LOW(op);
    unsigned long long hi32 = (unsigned long long)(low >> 32), lo32 = (unsigned long long)(low & 0xffffffffu);
    switch (LLFT_OP_CLASS(op)) {
    case LLFT_OPC_CLOCK: snprintf(buf, n, "clock %llu", (unsigned long long)low); break;
    case LLFT_OPC_SEM: snprintf(buf, n, "lock %llu:%llu", hi32, lo32); break;
    case LLFT_OPC_MUTEX: snprintf(buf, n, "mutex %llu:%llu", hi32, lo32); break;
    case LLFT_OPC_THREAD: snprintf(buf, n, "thread %llu", (unsigned long long)low); break;
    case LLFT_OPC_FD: snprintf(buf, n, "socket %llu:%llu", hi32, lo32); break;
    case LLFT_OPC_GIL: snprintf(buf, n, "GIL"); break;
    case LLFT_OPC_WHERE: snprintf(buf, n, "thread %llu", (unsigned long long)low); break;
    default: snprintf(buf, n, "op %#llx", (unsigned long long)op);
    }
}

#endif /* LLFT_SHM_H */
