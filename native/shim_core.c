/* shim_core.c -- libllft_preload.so: the virtual determinizer at the libc boundary.
 *
 * This unit: activation, the real symbols, the GIL, the divergence report, and the
 * record/replay engine (pr_append at a primary, bk_begin/bk_end at a backup) that
 * every hook of the other units goes through (shim_internal.h).
 *
 * Theory of operation
 * -------------------
 * The agent starts the application with LD_PRELOAD=libllft_preload.so and, in the
 * environment, LLFT_SHM (the shared-memory file, layout in llft_shm.h); the process it
 * spawned sets LLFT_ROOT_PID (the pid of the process to determinize) to its own pid
 * first thing (`root_setup`, which its descendants inherit). At load time the shim
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
 * What is ordered, and why (docs/DESIGN.md "Known hazards"): each unit's opening
 * comment says it for its calls -- clocks (shim_time.c), locks (shim_locks.c),
 * threads (shim_threads.c), randomness (shim_random.c), files and children
 * (shim_process.c), sockets (shim_net.c, shim_group.c), garbage collection (shim_gc.c).
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

#include "shim_internal.h"

#include <signal.h>
#include <sys/prctl.h>

/* ------------------------------------------------------------------ real symbols */

#define REAL_DEFINE(ret, name, args) ret(*real_##name) args;
LLFT_REAL_SYMBOLS(REAL_DEFINE)

TLS int t_guard;
TLS int t_tid = -1;
TLS uint64_t t_n;
TLS uint32_t t_created;

void *resolve(const char *name) {
    t_guard++;
    void *p = dlsym(RTLD_NEXT, name);
    t_guard--;
    return p;
}

/* ------------------------------------------------------------------ state */

int g_active;
int g_debug;
static int g_trace_where;          /* LLFT_TRACE_WHERE=1: a WHERE annotation before each record */
static TLS char t_where[400];      /* backup: the recording thread's location at its last record */
static int g_where_fd = -1;        /* primary: memfd the Python stacks are dumped into */
static int g_where_spin;
pid_t g_pid;
struct llft_shm *g_shm;
struct llft_ctl *g_ctl;

int (*py_is_initialized)(void);
void *(*py_tstate_current)(void);
void *(*py_tstate_this)(void);
static void *(*py_save_thread)(void);        /* PyEval_SaveThread */
static void (*py_restore_thread)(void *);    /* PyEval_RestoreThread */
static void (*py_dump_traceback)(int, void *);  /* _Py_DumpTraceback (async-signal-safe) */

int64_t mono_ns(void) {
    struct timespec ts;
    R(clock_gettime)(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ------------------------------------------------------------------ GIL */

int gil_held(void) {
    if (!py_tstate_current || !py_tstate_this) return 0;
    void *cur = py_tstate_current();
    return cur != NULL && cur == py_tstate_this();
}
void *gil_drop(void) {
    if (!py_save_thread || g_gil_ordered || !gil_held()) return NULL;
    __atomic_fetch_add(&g_ctl->stats[LLFT_ST_GIL_DROPS], 1, __ATOMIC_RELAXED);
    return py_save_thread();
}
void gil_take(void *ts) { if (ts) py_restore_thread(ts); }
void gil_yield(void) { py_restore_thread(py_save_thread()); }

/* ------------------------------------------------------------------ divergence */

/* A divergence ends the process (exit status 86) after writing the report once.
 * `gconn`/`goff` >= 0: a group connection's write differed (ctl.div_*). */
__attribute__((noreturn))
static void vdiverge(int64_t gconn, int64_t goff, const char *fmt, va_list ap) {
    char msg[LLFT_REPORT_BYTES];
    int k = vsnprintf(msg, sizeof msg - 1, fmt, ap);
    if (k < 0) k = 0;
    if (k > (int)sizeof msg - 2) k = (int)sizeof msg - 2;
    if (t_where[0] && k < (int)sizeof msg - 64)   /* LLFT_TRACE_WHERE was set at the primary */
        k += snprintf(msg + k, sizeof msg - 1 - (size_t)k, "\nllft: at the primary, thread %d's call #%llu "
                      "was made at %s", t_tid, (unsigned long long)t_n, t_where);
    if (k > (int)sizeof msg - 2) k = (int)sizeof msg - 2;
    if (t_gen > 1 && t_tid > 0 && k < (int)sizeof msg - 100)   /* ids of ended threads are reused */
        k += snprintf(msg + k, sizeof msg - 1 - (size_t)k, "\nllft: thread %d (gen %u): the ids of "
                      "ended threads are reused, and call numbers go on from the previous holder's",
                      t_tid, t_gen);
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
void diverge(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vdiverge(-1, -1, fmt, ap);
}
void diverge_group(uint32_t conn, uint64_t off, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vdiverge(conn, (int64_t)off, fmt, ap);
}

static void debug_line(const char *what, const struct llft_rec *h) {
    char line[200], on[64];
    llft_op_name(h->op, on, sizeof on);
    int k = snprintf(line, sizeof line, "llft[%s] t%u #%llu %s(%s) -> %lld err %d aux %u dlen %u oseq %llu\n",
                     what, h->tid, (unsigned long long)h->n, llft_call_name(h->call), on,
                     (long long)h->ret, h->err, h->aux, h->dlen, (unsigned long long)h->oseq);
    R(write)(2, line, (size_t)(k > 0 && k < (int)sizeof line ? k : 0));
}

/* ------------------------------------------------------------------ primary */

static void ring_append(struct llft_rec *h, const void *data, uint32_t dlen) {
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
    llft_ring_commit(r, g_shm->out_data, LLFT_OUT_CAP_BYTES, pos, h, data, dlen);
    __atomic_fetch_add(&g_ctl->stats[LLFT_ST_RECORDS], 1, __ATOMIC_RELAXED);
    if (g_debug) debug_line("rec", h);
}

/* "x.py:28 in consumer < threading.py:982 in run < ...": the innermost frames of the
 * calling thread's Python stack, from CPython's async-signal-safe dumper (it reads the
 * thread's frames without allocating, so it works without the GIL too). */
static size_t where_text(char *out, size_t cap) {
    void *ts = py_tstate_this ? py_tstate_this() : NULL;
    if (!ts || !py_dump_traceback || cap < 2) return 0;
    while (__atomic_exchange_n(&g_where_spin, 1, __ATOMIC_ACQUIRE)) __builtin_ia32_pause();
    if (g_where_fd < 0) {
        /* the highest descriptor allowed: a backup has no such fd, and the app's next
         * fds must get the same numbers as there */
        struct rlimit rl;
        int fd = (int)syscall(SYS_memfd_create, "llft-where", 1u /* CLOEXEC */);
        if (fd >= 0 && getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur > 64) {
            g_where_fd = dup3(fd, (int)(rl.rlim_cur < MAX_FDS ? rl.rlim_cur : MAX_FDS) - 1, O_CLOEXEC);
        }
        if (fd >= 0) R(close)(fd);
    }
    ssize_t n = -1;
    char raw[2048];
    if (g_where_fd >= 0 && lseek(g_where_fd, 0, SEEK_SET) == 0 && ftruncate(g_where_fd, 0) == 0) {
        py_dump_traceback(g_where_fd, ts);
        lseek(g_where_fd, 0, SEEK_SET);
        n = R(read)(g_where_fd, raw, sizeof raw - 1);
    }
    __atomic_store_n(&g_where_spin, 0, __ATOMIC_RELEASE);
    if (n <= 0) return 0;
    raw[n] = 0;
    /* lines: '  File "PATH", line N in FUNC' */
    size_t k = 0;
    int frames = 0;
    for (char *line = strstr(raw, "File \""); line && frames < 4; line = strstr(line, "File \"")) {
        char *path = line + 6, *q = strchr(path, '"');
        char *eol = strchr(line, '\n');
        if (!q || !eol) break;
        *eol = 0;
        char *base = path;
        for (char *c = path; c < q; c++) if (*c == '/') base = c + 1;
        char *ln = strstr(q, "line ");
        int w = snprintf(out + k, cap - k, "%s%.*s:%s", frames ? " < " : "", (int)(q - base), base,
                         ln ? ln + 5 : "?");
        if (w < 0 || (size_t)w >= cap - k) break;
        k += (size_t)w;
        frames++;
        line = eol + 1;
    }
    return k;
}

/* LLFT_TRACE_WHERE: the next record's Python location, as an annotation (same n, an
 * operation of its own: it takes no turn and is skipped by a backup, which keeps it for
 * its divergence report). */
static void where_append(void) {
    char text[sizeof t_where];
    size_t n = where_text(text, sizeof text);
    struct llft_rec h;
    memset(&h, 0, sizeof h);
    h.call = LLFT_C_WHERE;
    h.tid = (uint32_t)t_tid;
    h.n = t_n;
    h.op = LLFT_OP(LLFT_OPC_WHERE, (uint64_t)t_tid);
    ring_append(&h, text, (uint32_t)n);
}

void pr_append(unsigned call, uint64_t op, int64_t ret, int32_t err, uint32_t aux,
               uint16_t flags, const void *data, uint32_t dlen) {
    if (__atomic_load_n(&g_ctl->hold, __ATOMIC_ACQUIRE)) {
        /* A backup is beyond the lag bound: wait, without the GIL, until the agent
         * lets go (bounded slices: the word may change without a wake-up we see). */
        __atomic_fetch_add(&g_ctl->stats[LLFT_ST_HELD], 1, __ATOMIC_RELAXED);
        void *gil = gil_drop();
        while (__atomic_load_n(&g_ctl->hold, __ATOMIC_ACQUIRE))
            llft_futex(&g_ctl->hold, FUTEX_WAIT, 1, WAIT_SLICE_MS);
        gil_take(gil);
    }
    if (__builtin_expect(g_trace_where, 0)) where_append();
    struct llft_rec h;
    memset(&h, 0, sizeof h);
    h.call = (uint16_t)call;
    h.flags = (uint16_t)(flags | (sig_take_pending() << LLFT_SIGNAL_SHIFT));
    h.tid = (uint32_t)t_tid;
    h.n = t_n++;
    h.op = op;
    h.ret = ret;
    h.err = err;
    h.aux = aux;
    ring_append(&h, data, dlen);
}

/* ------------------------------------------------------------------ backup */

uint64_t g_thread_n[LLFT_MAX_THREADS];   /* backup: records each thread has completed */

/* Per-operation completed-record counters: the head of each o.orderinfo queue. */
struct opctr { uint64_t key; uint32_t count; uint32_t waiters; };
static struct opctr *g_optab;  /* OPTAB_SIZE entries, mmap'd at activation */

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

void stall_check(struct stallw *s, const char *what, unsigned call, uint64_t op) {
    uint32_t p = __atomic_load_n(&g_ctl->progress, __ATOMIC_ACQUIRE);
    int64_t now = mono_ns();
    if (s->since == 0 || p != s->progress) { s->since = now; s->progress = p; return; }
    uint32_t lim = g_ctl->stall_ms ? g_ctl->stall_ms : 10000;
    if (now - s->since > (int64_t)lim * 1000000LL) {
        char on[64];
        llft_op_name(op, on, sizeof on);
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
            llft_op_name(op, on, sizeof on);
            diverge("internal: %s(%s) completed %u records, thread %d's record is #%llu",
                    llft_call_name(call), on, c, t_tid, (unsigned long long)b->h.oseq);
        }
        if (!b->gil) b->gil = gil_drop();
        __atomic_fetch_add(&g_ctl->stats[LLFT_ST_WAITS], 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&b->ctr->waiters, 1, __ATOMIC_ACQ_REL);
        if (__atomic_load_n(&b->ctr->count, __ATOMIC_ACQUIRE) == c)
            shim_futex_wait_bit(&b->ctr->count, c, WAIT_SLICE_MS, (uint32_t)b->h.oseq);
        __atomic_fetch_sub(&b->ctr->waiters, 1, __ATOMIC_ACQ_REL);
        stall_check(&sw, "its turn", call, op);
    }
}

/* The record's call is complete here: pop it, advance o's queue, wake. */
static void bk_complete(struct bk *b) {
    struct llft_ring *r = &g_shm->tring[t_tid];
    llft_ring_pop(r, g_shm->tring_data[t_tid], LLFT_TRING_CAP_BYTES, b->h.len);
    uint32_t next = __atomic_add_fetch(&b->ctr->count, 1, __ATOMIC_ACQ_REL);
    if (__atomic_load_n(&b->ctr->waiters, __ATOMIC_ACQUIRE))
        shim_futex_wake_bit(&b->ctr->count, next);   /* whose turn it is now */
    __atomic_fetch_add(&g_ctl->progress, 1, __ATOMIC_ACQ_REL);
    __atomic_fetch_add(&g_ctl->stats[LLFT_ST_RECORDS], 1, __ATOMIC_RELAXED);
    t_n++;
    __atomic_store_n(&g_thread_n[t_tid], t_n, __ATOMIC_RELEASE);
    if (g_debug) debug_line("rep", &b->h);
}

/* Take thread t's next record and wait for its turn on o.
 * Private-read records are HINTS (see shim_net.c): a call that is not the hinted
 * read completes and skips them; a private read with no hint passes through. */
int bk_begin(struct bk *b, unsigned call, uint64_t op, void *payload, uint32_t cap) {
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
                if (call == LLFT_C_GIL_TAKE && t_tid == 0) return BK_EXTRA;   /* exiting */
                if (t_tid == 0) {   /* the primary's process ended through its main thread */
                    char on[64];
                    llft_op_name(op, on, sizeof on);
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
        b->sig = b->h.flags >> LLFT_SIGNAL_SHIFT;
        b->h.flags &= LLFT_CALL_FLAGS_MASK;
        if (b->h.call == LLFT_C_WHERE) {   /* an annotation: keep it for a report */
            uint32_t d = b->h.dlen < sizeof t_where - 1 ? b->h.dlen : (uint32_t)sizeof t_where - 1;
            llft_ring_copy_out(data, LLFT_TRING_CAP_BYTES, t + LLFT_REC_HDR, t_where, d);
            t_where[d] = 0;
            llft_ring_pop(r, data, LLFT_TRING_CAP_BYTES, len);
            __atomic_fetch_add(&g_ctl->progress, 1, __ATOMIC_ACQ_REL);
            continue;
        }
        int is_hint = b->h.call == LLFT_C_PRIVATE_RECV;
        if (call == LLFT_C_PRIVATE_RECV && !(is_hint && b->h.op == op && b->h.n == t_n)) {
            gil_take(b->gil);
            b->gil = NULL;
            return BK_NO_HINT;
        }
        if (is_hint && call != LLFT_C_PRIVATE_RECV && b->h.n == t_n) {
            bk_wait_turn(b, b->h.call, b->h.op);   /* skip a hint the program did not use */
            bk_complete(b);
            if (b->sig) sig_replay(b->sig);
            continue;
        }
        if (b->h.call == LLFT_C_GIL_TAKE && call != LLFT_C_GIL_TAKE && b->h.n == t_n) {
            /* The primary's thread dropped the GIL here and took it back (it was
             * preempted, or blocked in a call this one does not make). Holding the GIL:
             * yield, so the threads it let run, run now (the take consumes the record).
             * Not holding it: the take's turn passes (skipped like an unused hint). */
            if (gil_held()) {
                gil_yield();
            } else {
                bk_wait_turn(b, b->h.call, b->h.op);
                bk_complete(b);
                gil_passed_take();
                if (b->sig) sig_replay(b->sig);
            }
            continue;
        }
        break;
    }
    if (call == LLFT_C_GIL_TAKE && b->h.call != LLFT_C_GIL_TAKE) {
        gil_take(b->gil);   /* nothing consumed: the thread's next record stays */
        b->gil = NULL;
        return BK_EXTRA;
    }
    if (b->h.call != call || b->h.op != op || b->h.n != t_n || b->h.tid != (uint32_t)t_tid) {
        char on_exp[64], on_got[64];
        llft_op_name(b->h.op, on_exp, sizeof on_exp);
        llft_op_name(op, on_got, sizeof on_got);
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

void bk_end(struct bk *b) {
    bk_complete(b);
    if (b->sig) sig_replay(b->sig);
    gil_take(b->gil);
    b->gil = NULL;
}

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
    unsetenv("LLFT_PARENT_PID");
    unsetenv("LLFT_DEATH_SIGNAL");
    unsetenv("LLFT_EXTERNAL_PORTS");
    unsetenv("LLFT_SERVICE_PORT");
}

static void child_after_fork(void) { g_active = 0; }

/* The process llft spawned (determinizer/runner.py `spawn`) has no LLFT_ROOT_PID: the
 * spawner runs no code between fork and exec, so that Popen can vfork (a fork of the
 * agent with Python in the child blocked its event loop for up to 0.5 s on a busy
 * machine). The child's part is done here, first thing: it names itself the root (a
 * wrapper it execs keeps the pid and finds the variable), and it asks for
 * LLFT_DEATH_SIGNAL when its spawner dies -- at once if that already happened. */
static void root_setup(void) {
    const char *sig = getenv("LLFT_DEATH_SIGNAL");
    const char *parent = getenv("LLFT_PARENT_PID");
    if (!getenv("LLFT_ROOT_PID")) {
        char pid[16];
        snprintf(pid, sizeof pid, "%d", (int)R(getpid)());
        setenv("LLFT_ROOT_PID", pid, 1);
    }
    if (sig && atoi(sig) > 0 && parent) {
        prctl(PR_SET_PDEATHSIG, (unsigned long)atoi(sig), 0, 0, 0);
        if (getppid() != (pid_t)atoi(parent)) raise(atoi(sig));
    }
}

__attribute__((constructor(101)))
static void llft_init(void) {
    t_guard++;
    const char *path = getenv("LLFT_SHM");
    if (!path) goto out;                          /* not started by llft: inert */
    const char *root = getenv("LLFT_ROOT_PID");
    if (!root || getpid() == (pid_t)atoi(root)) {  /* the spawned process (or its exec) */
        root_setup();
        root = getenv("LLFT_ROOT_PID");
    }
    if (getpid() != (pid_t)atoi(root)) {                          /* a descendant */
        notes_activate(path);   /* (the programs it runs note their signals) */
        strip_env();
        goto out;
    }
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
    g_trace_where = getenv("LLFT_TRACE_WHERE") ? atoi(getenv("LLFT_TRACE_WHERE")) : 0;
    net_activate();
    group_activate();
    py_is_initialized = (int (*)(void))dlsym(RTLD_DEFAULT, "Py_IsInitialized");
    py_tstate_current = (void *(*)(void))dlsym(RTLD_DEFAULT, "_PyThreadState_UncheckedGet");
    py_tstate_this = (void *(*)(void))dlsym(RTLD_DEFAULT, "PyGILState_GetThisThreadState");
    py_save_thread = (void *(*)(void))dlsym(RTLD_DEFAULT, "PyEval_SaveThread");
    py_restore_thread = (void (*)(void *))dlsym(RTLD_DEFAULT, "PyEval_RestoreThread");
    py_dump_traceback = (void (*)(int, void *))dlsym(RTLD_DEFAULT, "_Py_DumpTraceback");
    gc_activate();
    time_activate();
    /* resolve every real symbol now, single-threaded, rather than on a hot path */
#define REAL_RESOLVE(ret, name, args) R(name);
    LLFT_REAL_SYMBOLS(REAL_RESOLVE)
    notes_activate(path);
    strip_env();
    pthread_atfork(NULL, NULL, child_after_fork);
    g_pid = R(getpid)();
    g_ctl->active_pid = (uint32_t)g_pid;
    threads_activate();
    t_tid = 0;
    __atomic_store_n(&g_active, 1, __ATOMIC_RELEASE);
    process_activate();
out:
    t_guard--;
}
