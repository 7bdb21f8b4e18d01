/* shim_threads.c -- threads: logical ids, and their reuse.
 *
 * Intercepts pthread_create, a per-thread operation whose metadata is the child's
 * logical id (t of the (t, o, n, d) entries), so the k-th thread created by thread p
 * has the same id everywhere; the child starts with its id set (thread_trampoline).
 *
 * Ids are reused. A logical id is a SLOT (its ring in the shm, its counters here),
 * held from the pthread_create that picks it until the thread's end, which is an
 * ordered call of its own (LLFT_C_THREAD_EXIT, recorded by a thread-specific-data
 * destructor, so it runs however the thread ends). The threads that hold one slot in
 * turn behave as ONE logical thread whose calls are theirs concatenated: the next
 * holder starts with the call count (t_n) and the created-object count (t_created:
 * lock and socket ids) where the previous one ended. So the records of a slot stay one
 * sequence in one ring, per-thread operations one queue, lock ids unique, and GIL drop
 * references (tid, n) unambiguous: nothing downstream knows about reuse.
 *
 * Which slot a create takes is decided at the primary (the lowest one whose holder has
 * ended: a timing decision) and recorded (aux), so a backup takes the same one. At a
 * backup the previous holder may still be replaying its last records when the create
 * is replayed: the child waits, before its first call, until that holder has completed
 * its end record here (slot_enter). Its end record is its last: a call the holder
 * made beyond the primary's is a divergence against it, never a record of the next
 * holder. After a promotion the process picks free slots itself, with the same rule.
 * A thread that never ends (a daemon blocked at exit) keeps its slot.
 *
 * Reports name the generation: "thread 5 (gen 3)" is the 3rd thread that held id 5.
 */
#include "shim_internal.h"

struct slot {
    uint32_t started;   /* holders assigned (creates that picked this slot) */
    uint32_t ended;     /* holders that completed their end record; futex */
    uint64_t n;         /* the last holder's t_n and t_created at its end */
    uint32_t created;
    uint32_t waiters;
};
static struct slot g_slot[LLFT_MAX_THREADS];   /* slot 0: the main thread, never reused */
static pthread_key_t g_end_key;
TLS uint32_t t_gen;
static void thread_end(void *unused);

void threads_activate(void) {
    g_slot[0].started = 1;
    t_gen = 1;
    pthread_key_create(&g_end_key, thread_end);
}

/* Primary: the lowest slot with no holder, claimed. 0 if none. */
static uint32_t slot_claim(uint32_t *gen) {
    for (uint32_t i = 1; i < LLFT_MAX_THREADS; i++) {
        uint32_t s = __atomic_load_n(&g_slot[i].started, __ATOMIC_ACQUIRE);
        if (s != __atomic_load_n(&g_slot[i].ended, __ATOMIC_ACQUIRE)) continue;
        if (__atomic_compare_exchange_n(&g_slot[i].started, &s, s + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            *gen = s + 1;
            return i;
        }
    }
    return 0;
}

/* The child, before anything else: wait until the slot's previous holder has ended
 * here (only ever waits at a backup), then continue its call sequence. */
static void slot_enter(uint32_t tid, uint32_t gen) {
    struct slot *sl = &g_slot[tid];
    struct stallw sw = {0, 0};
    for (;;) {
        uint32_t e = __atomic_load_n(&sl->ended, __ATOMIC_ACQUIRE);
        if (e + 1 >= gen) break;
        __atomic_fetch_add(&sl->waiters, 1, __ATOMIC_ACQ_REL);
        if (__atomic_load_n(&sl->ended, __ATOMIC_ACQUIRE) == e)
            llft_futex(&sl->ended, FUTEX_WAIT_PRIVATE, e, WAIT_SLICE_MS);
        __atomic_fetch_sub(&sl->waiters, 1, __ATOMIC_ACQ_REL);
        t_guard++;
        t_tid = (int)tid;   /* for the report only: no call is made meanwhile (guarded) */
        t_gen = gen;
        stall_check(&sw, "the previous thread with its id to end", LLFT_C_THREAD_CREATE, thread_op());
        t_tid = -1;
        t_guard--;
    }
    t_n = sl->n;
    t_created = sl->created;
    t_gen = gen;
    t_tid = (int)tid;
}

/* The thread's end (thread-specific-data destructor: after its start routine returned
 * or it called pthread_exit): an ordered call, then the slot is free. */
static void thread_end(void *unused) {
    (void)unused;
    if (!g_active || t_tid <= 0) return;   /* a forked child's thread, or not determinized */
    t_guard++;
    struct bk b;
    uint64_t op = thread_op();
    if (replaying(&b, LLFT_C_THREAD_EXIT, op, NULL, 0)) bk_end(&b);
    else pr_append(LLFT_C_THREAD_EXIT, op, 0, 0, 0, 0, NULL, 0);
    struct slot *sl = &g_slot[t_tid];
    sl->n = t_n;
    sl->created = t_created;
    t_tid = -1;
    __atomic_fetch_add(&sl->ended, 1, __ATOMIC_ACQ_REL);
    if (__atomic_load_n(&sl->waiters, __ATOMIC_ACQUIRE)) llft_futex_wake_all(&sl->ended, 0);
    t_guard--;
}

struct tstart { void *(*fn)(void *); void *arg; uint32_t tid, gen; };
static void *thread_trampoline(void *p) {
    struct tstart s = *(struct tstart *)p;
    free(p);
    slot_enter(s.tid, s.gen);
    pthread_setspecific(g_end_key, (void *)1);   /* non-NULL: thread_end runs at the end */
    return s.fn(s.arg);
}

static int pthread_create_ordered(pthread_t *th, const pthread_attr_t *attr,
                                  void *(*fn)(void *), void *arg) {
    uint64_t op = thread_op();
    int r;
    struct bk b;
    struct tstart *ts = malloc(sizeof *ts);
    ts->fn = fn;
    ts->arg = arg;
    if (replaying(&b, LLFT_C_THREAD_CREATE, op, NULL, 0)) {
        r = (int)b.h.ret;
        if (r == 0) {
            if (b.h.aux == 0 || b.h.aux >= LLFT_MAX_THREADS)
                diverge("thread %d (gen %u): the trace's pthread_create made thread %u", t_tid, t_gen, b.h.aux);
            ts->tid = b.h.aux;
            ts->gen = __atomic_add_fetch(&g_slot[b.h.aux].started, 1, __ATOMIC_ACQ_REL);
            __atomic_fetch_add(&g_ctl->next_tid, 1, __ATOMIC_ACQ_REL);
            r = R(pthread_create)(th, attr, thread_trampoline, ts);
            if (r) diverge("thread %d (gen %u): pthread_create failed here (%d) but succeeded in the trace",
                           t_tid, t_gen, r);
        } else {
            free(ts);
        }
        bk_end(&b);
    } else {
        uint32_t child = slot_claim(&ts->gen);
        if (!child)
            diverge("thread %d (gen %u): more than %u threads alive at once", t_tid, t_gen, LLFT_MAX_THREADS);
        ts->tid = child;
        r = R(pthread_create)(th, attr, thread_trampoline, ts);   /* ts is the child's now */
        if (r) {
            /* nobody else claims or ends the slot meanwhile: give it back */
            __atomic_fetch_sub(&g_slot[child].started, 1, __ATOMIC_ACQ_REL);
            free(ts);
        } else {
            __atomic_fetch_add(&g_ctl->next_tid, 1, __ATOMIC_ACQ_REL);
        }
        pr_append(LLFT_C_THREAD_CREATE, op, r, 0, r ? 0 : child, 0, NULL, 0);
    }
    return r;
}
EXPORT int pthread_create(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *), void *arg) {
    if (!active_here()) return R(pthread_create)(th, attr, fn, arg);
    gc_point(0);   /* automatic GC off before a second thread exists */
    t_guard++;
    gil_order_start();   /* and GIL hand-offs ordered (shim_gil.c) */
    import_lock_order_start();   /* and the import lock's claims (shim_locks.c) */
    t_guard--;
    return GUARDED(pthread_create_ordered(th, attr, fn, arg));
}
