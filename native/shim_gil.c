/* shim_gil.c -- the GIL hand-off, ordered.
 *
 * Which thread runs Python code between two ordered calls is decided by who takes the
 * GIL, and CPython decides that by timing: a thread waiting for the GIL asks the
 * holder to drop it after the switch interval (5 ms), and a thread that releases it
 * around any blocking call (file I/O, a lock, a socket) races the waiters to take it
 * back. Programs whose threads share state without a lock (a list and a random.Random
 * fed by 50 threads in test_queue; socketserver's serve_forever polling a flag that
 * shutdown() sets) then decide differently at a backup.
 *
 * So, once a process has a second thread, every GIL take is an ordered call: one
 * operation (LLFT_OPC_GIL) whose queue is the order in which threads took the GIL at
 * the primary. A backup thread enters CPython's take_gil only when its turn in that
 * queue has come, so the Python code between two hand-offs runs in the primary's
 * interleaving. And there are no time-based switches: a waiter is not preempting the
 * holder after 5 ms, the holder runs until it blocks.
 *
 * A thread that never blocks must still let the others run (a spin loop waiting for a
 * flag another thread sets): a waiter asks the holder to drop the GIL (CPython's own
 * mechanism: its timed wait times out) once the process has burnt GIL_PREEMPT_CPU_NS of
 * CPU time meanwhile, and the next take is recorded as a preemption
 * (LLFT_GIL_PREEMPTED). A backup cannot drop at the same bytecode; the taker asks the
 * holder to drop as soon as its turn has come, so the holder stops at its next
 * eval-breaker check. That is exact for a spin loop (it has no effects), approximate for
 * a thread doing CPU work with effects: such programs diverge only when one thread holds
 * the GIL for more than GIL_PREEMPT_CPU_NS of CPU while another waits.
 *
 * How the hand-off is seen: CPython 3.9-3.11 keep the GIL in _PyRuntime.ceval.gil,
 * struct _gil_runtime_state (Include/internal/pycore_gil.h: interval, last_holder,
 * locked, switch_number, cond, mutex, switch_cond, switch_mutex). take_gil locks
 * `mutex`, waits on `cond` (pthread_cond_timedwait, the switch interval) while `locked`,
 * then locks `switch_mutex` at the moment it owns the GIL; drop_gil sets last_holder to
 * the dropping thread and locks `mutex`. The shim finds the struct by its contents
 * (gil_find) and interposes on those three libc calls for those three objects only:
 *   pthread_mutex_lock(mutex): by the holder, a drop; otherwise a take begins (backup:
 *       wait for the turn, before anything is held);
 *   pthread_cond_timedwait(cond): the wait for the GIL (no time-based switch);
 *   pthread_mutex_lock(switch_mutex) during a take: the GIL is ours (primary: record,
 *       under `mutex`, so the record order is the take order; backup: complete).
 * If the struct is not found (another CPython), nothing is ordered (debug line).
 *
 * With hand-offs ordered, a backup thread never releases the GIL inside the shim while
 * it waits for a record or its turn (gil_drop returns NULL): a thread the primary
 * scheduled later must not run meanwhile, and none of the records it waits for needs a
 * thread that takes the GIL after it.
 */
#include "shim_internal.h"

struct gil_state {   /* struct _gil_runtime_state of CPython 3.9-3.11 */
    unsigned long interval;
    void *last_holder;
    int locked;
    unsigned long switch_number;
    pthread_cond_t cond;
    pthread_mutex_t mutex;
    pthread_cond_t switch_cond;
    pthread_mutex_t switch_mutex;
};

/* A waiter preempts the holder once this much process CPU time went by meanwhile
 * (CPython: 5 ms of wall time). CPU, not wall time: a holder descheduled by a loaded
 * machine is not preempted (that would be a nondeterministic hand-off for nothing). */
#define GIL_PREEMPT_CPU_NS (50 * 1000000LL)
#define GIL_WAIT_SLICE_NS (5 * 1000000LL)

static struct gil_state *g_gil;   /* found by gil_find; NULL: not (yet) ordered */
static int g_gil_tries;           /* gil_find attempts (it needs a holder to look) */
int g_gil_ordered;                /* every GIL take is an ordered call */
pthread_mutex_t *g_gil_mutex, *g_gil_switch_mutex;
static int g_preempt_pending;      /* primary: a waiter asked the holder to drop */

/* Which drop a take follows: the dropping thread and its call count then. A take
 * record carries the last drop before it (ret = tid << 40 | n); a backup thread whose
 * turn has come also waits until that thread has dropped the GIL with that many calls
 * made. So an EXTRA drop and take at a backup (a private read that came short, and
 * the read after it that passed through as hints do) does not open the GIL to the
 * next thread in the primary's order: that thread waits for the drop it followed. */
#define DROP_N_BITS 40
static uint64_t g_last_drop;                      /* primary, under the GIL's mutex */
static uint64_t g_drop_n[LLFT_MAX_THREADS];       /* backup: per thread, t_n at its last drop + 1 */
static uint32_t g_drop_seq, g_drop_waiters;       /* futex: bumped at every drop */

static int (*real_cond_timedwait)(pthread_cond_t *, pthread_mutex_t *, const struct timespec *);

static TLS int t_held;             /* this thread holds the GIL (known from its takes:
                                      CPython clears the thread's own state before the
                                      last drop of an ending thread) */
static TLS int t_taking;           /* between take_gil's two locks */
static TLS int t_replayed;         /* backup: 1 t_take_bk is this take's record, 2 an extra take */
static TLS int t_asked;            /* this take asked the holder to drop */
static TLS int64_t t_wait_cpu0;    /* process CPU time when this take began to wait */
static TLS struct bk t_take_bk;
static TLS struct stallw t_take_sw;

static int64_t process_cpu_ns(void) {
    struct timespec ts;
    R(clock_gettime)(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The GIL's state, found by its contents: the caller holds the GIL, so `locked` is 1
 * and `last_holder` is its thread state, `interval` is a switch interval, both mutexes
 * are unlocked. Exactly one match, or nothing is ordered. */
static struct gil_state *gil_find(void *me) {
    void *base = dlsym(RTLD_DEFAULT, "_PyRuntime");
    Dl_info info;
    const ElfW(Sym) *es = NULL;
    if (!base || !dladdr1(base, &info, (void **)&es, RTLD_DL_SYMENT) || !es || !es->st_size)
        return NULL;
    struct gil_state *found = NULL;
    for (size_t off = 0; off + sizeof(struct gil_state) <= es->st_size; off += 8) {
        struct gil_state *g = (struct gil_state *)((char *)base + off);
        if (g->last_holder != me || g->locked != 1 || g->interval == 0 || g->interval > 1000000000UL)
            continue;
        if (g->mutex.__data.__lock || g->mutex.__data.__owner || g->switch_mutex.__data.__lock
            || g->switch_mutex.__data.__owner)
            continue;
        if (found) return NULL;   /* ambiguous */
        found = g;
    }
    return found;
}

/* Called by pthread_create (shim_threads.c) in the creating thread, before a second
 * thread exists: from here on every take is ordered, at the same point everywhere. */
void gil_order_start(void) {
    if (g_gil_ordered || g_gil_tries > 8 || !app_started() || !gil_held()) return;
    g_gil_tries++;
    void *me = py_tstate_this ? py_tstate_this() : NULL;
    struct gil_state *g = me ? gil_find(me) : NULL;
    real_cond_timedwait = (int (*)(pthread_cond_t *, pthread_mutex_t *, const struct timespec *))
        dlvsym(RTLD_NEXT, "pthread_cond_timedwait", "GLIBC_2.3.2");
    if (!g || !real_cond_timedwait) {
        if (g_debug) R(write)(2, "llft: GIL not found: hand-offs not ordered\n", 43);
        return;
    }
    g_gil = g;
    g_gil_mutex = &g->mutex;
    g_gil_switch_mutex = &g->switch_mutex;
    t_held = 1;
    __atomic_store_n(&g_gil_ordered, 1, __ATOMIC_RELEASE);
}

static void note_drop(void) {
    __atomic_store_n(&g_drop_n[t_tid], t_n + 1, __ATOMIC_RELEASE);
    __atomic_fetch_add(&g_drop_seq, 1, __ATOMIC_ACQ_REL);
    if (__atomic_load_n(&g_drop_waiters, __ATOMIC_ACQUIRE))
        shim_futex_wake_bit(&g_drop_seq, (uint32_t)t_tid);   /* who waits for our drop */
}

/* Backup: a take of the trace this thread did not make while it held no GIL (bk_begin
 * passed its turn): at the primary the thread took the GIL and dropped it again with
 * this many calls made, and the next taker may wait for that drop. */
void gil_passed_take(void) { if (g_gil_ordered && t_tid >= 0) note_drop(); }

/* Backup: wait until the drop this take followed at the primary has happened here. */
static void wait_for_drop(uint64_t drop) {
    uint32_t tid = (uint32_t)(drop >> DROP_N_BITS);
    uint64_t n = drop & ((1ull << DROP_N_BITS) - 1);
    if (!drop || tid >= LLFT_MAX_THREADS || (int)tid == t_tid) return;
    struct stallw sw = {0, 0};
    for (;;) {
        uint32_t seq = __atomic_load_n(&g_drop_seq, __ATOMIC_ACQUIRE);
        if (__atomic_load_n(&g_drop_n[tid], __ATOMIC_ACQUIRE) >= n + 1) return;
        __atomic_fetch_add(&g_drop_waiters, 1, __ATOMIC_ACQ_REL);
        shim_futex_wait_bit(&g_drop_seq, seq, WAIT_SLICE_MS, tid);
        __atomic_fetch_sub(&g_drop_waiters, 1, __ATOMIC_ACQ_REL);
        stall_check(&sw, "the GIL's drop it followed", LLFT_C_GIL_TAKE, LLFT_OP(LLFT_OPC_GIL, 0));
    }
}

/* pthread_mutex_lock on the GIL's mutex or switch mutex (shim_locks.c). Takes are
 * ordered whatever t_guard says: a take inside the shim (a collection's finalizers)
 * is as much a hand-off as any other. */
int gil_lock(pthread_mutex_t *m) {
    if (!g_gil_ordered || !g_active || t_tid < 0) return R(pthread_mutex_lock)(m);   /* a forked child: inactive */
    if (m == g_gil_mutex && t_held) {
        t_held = 0;   /* drop_gil */
        int r = R(pthread_mutex_lock)(m);
        __atomic_store_n(&g_last_drop, ((uint64_t)(uint32_t)t_tid << DROP_N_BITS) | t_n, __ATOMIC_RELEASE);
        note_drop();
        return r;
    } else if (m == g_gil_mutex && !t_taking) {
        t_taking = 1;
        t_replayed = 0;
        t_asked = 0;
        t_wait_cpu0 = 0;
        t_take_sw.since = 0;
        t_guard++;
        if (backup_now()) {
            int got = bk_begin(&t_take_bk, LLFT_C_GIL_TAKE, LLFT_OP(LLFT_OPC_GIL, 0), NULL, 0);
            if (got == BK_RECORD) {
                t_replayed = 1;
                if (!(t_take_bk.h.aux & LLFT_GIL_PREEMPTED)) wait_for_drop((uint64_t)t_take_bk.h.ret);
            } else if (got == BK_EXTRA) {
                t_replayed = 2;   /* not in the trace: take it, record nothing */
            }
        }
        t_guard--;
    } else if (m == g_gil_switch_mutex && t_taking) {
        /* take_gil's `_ready:` with the GIL mutex held: this thread owns the GIL */
        t_taking = 0;
        t_held = 1;
        t_guard++;
        if (t_replayed == 1) {
            bk_end(&t_take_bk);
        } else if (!t_replayed) {
            uint32_t pre = __atomic_exchange_n(&g_preempt_pending, 0, __ATOMIC_ACQ_REL);
            pr_append(LLFT_C_GIL_TAKE, LLFT_OP(LLFT_OPC_GIL, 0), (int64_t)__atomic_load_n(&g_last_drop, __ATOMIC_ACQUIRE),
                      0, pre ? LLFT_GIL_PREEMPTED : 0, 0, NULL, 0);
        }
        t_guard--;
    }
    return R(pthread_mutex_lock)(m);
}

/* take_gil's wait while another thread holds the GIL. Returning ETIMEDOUT makes
 * CPython ask the holder to drop it (gil_drop_request); returning 0 makes it look again. */
static int gil_wait(pthread_cond_t *c, pthread_mutex_t *m) {
    if (t_replayed == 1 && (t_take_bk.h.aux & LLFT_GIL_PREEMPTED) && !t_asked) {
        /* The primary preempted the holder here: so do we, once the holder has made
         * as many calls as it had when the primary's dropped the GIL (a holder that
         * reaches its next call first yields there, bk_begin). */
        uint64_t drop = (uint64_t)t_take_bk.h.ret;
        uint32_t tid = (uint32_t)(drop >> DROP_N_BITS);
        uint64_t n = drop & ((1ull << DROP_N_BITS) - 1);
        if (tid >= LLFT_MAX_THREADS || __atomic_load_n(&g_thread_n[tid], __ATOMIC_ACQUIRE) >= n) {
            t_asked = 1;
            return ETIMEDOUT;
        }
    }
    struct timespec dl;
    R(clock_gettime)(CLOCK_MONOTONIC, &dl);
    dl.tv_nsec += GIL_WAIT_SLICE_NS;
    if (dl.tv_nsec >= 1000000000L) { dl.tv_sec++; dl.tv_nsec -= 1000000000L; }
    real_cond_timedwait(c, m, &dl);
    if (t_replayed) {   /* a backup preempts only where the primary did */
        if (t_replayed == 1) {
            t_guard++;
            stall_check(&t_take_sw, "the GIL's holder to release it", LLFT_C_GIL_TAKE, LLFT_OP(LLFT_OPC_GIL, 0));
            t_guard--;
        }
        return 0;
    }
    if (t_asked) return 0;
    int64_t now = process_cpu_ns();
    if (!t_wait_cpu0) t_wait_cpu0 = now;
    if (now - t_wait_cpu0 < GIL_PREEMPT_CPU_NS) return 0;
    t_asked = 1;
    __atomic_store_n(&g_preempt_pending, 1, __ATOMIC_RELEASE);
    return ETIMEDOUT;
}

EXPORT int pthread_cond_timedwait(pthread_cond_t *c, pthread_mutex_t *m, const struct timespec *abst) {
    if (g_gil && c == &g_gil->cond && t_taking) return gil_wait(c, m);
    if (__builtin_expect(!real_cond_timedwait, 0))
        real_cond_timedwait = (int (*)(pthread_cond_t *, pthread_mutex_t *, const struct timespec *))
            dlvsym(RTLD_NEXT, "pthread_cond_timedwait", "GLIBC_2.3.2");
    return real_cond_timedwait(c, m, abst);
}
