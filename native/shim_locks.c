/* shim_locks.c -- CMTS: locks.
 *
 * Intercepts POSIX semaphores (sem_init/destroy/wait/trywait/timedwait/clockwait:
 * threading.Lock/RLock and everything built on them) and the pthread mutexes of C
 * extensions (pthread_mutex_init/destroy/lock/trylock/timedlock), but orders only
 * those initialised after Py_IsInitialized(): the GIL, the runtime's HEAD_LOCK and the
 * pending-call lock are created during start-up and are never ordered. The import lock
 * is created then too, but is registered when a second thread is about to exist
 * (import_lock_order_start). Claims are ordered (success, try-lock failure, timed-wait timeout);
 * releases need no order. A backup really acquires a claim the primary won, after
 * its turn has come in the lock's queue.
 */
#include "shim_internal.h"

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
EXPORT int sem_init(sem_t *s, int pshared, unsigned v) {
    int r = R(sem_init)(s, pshared, v);
    if (r == 0 && active_here() && app_started()) {
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
    if (replaying(&b, call, op, NULL, 0)) {
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

EXPORT int sem_wait(sem_t *s) {
    HOOK(lock_lookup(s), R(sem_wait)(s), sem_op(LLFT_C_SEM_WAIT, s, 0, NULL));
}
/* CPython's import lock (import.c's import_lock, created during start-up) is held by
 * importlib across finder calls that release the GIL (stat, listdir: _find_spec's
 * _ImportLockContext), so two threads importing at once contend on it. Unordered, a
 * backup thread could get it at another of the holder's releases than at the primary
 * and then wait for a GIL turn the holder can only give after taking the lock again
 * (a stall seen with two threads lazily importing a codec in getaddrinfo). It is not
 * exported: take and release it through CPython's own functions, with the GIL, before
 * the first thread is created (the same point in every replica), and register the
 * semaphore that take tries. Until a take names it (CPython not found, or the GIL not
 * held at that pthread_create) it stays unordered and the next creation tries again. */
static TLS int t_catch_lock;
static int g_import_lock_ordered;
void import_lock_order_start(void) {
    if (g_import_lock_ordered || !app_started() || !gil_held()) return;
    void (*acquire)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "_PyImport_AcquireLock");
    int (*release)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "_PyImport_ReleaseLock");
    if (!acquire || !release) { g_import_lock_ordered = -1; return; }
    t_catch_lock = 1;
    acquire();              /* with one thread: a try that succeeds, named to sem_trywait */
    t_catch_lock = 0;
    release();
    if (g_debug && g_import_lock_ordered != 1)
        R(write)(2, "llft: import lock not found: not ordered\n", 41);
}
static int catch_import_lock(sem_t *s) {
    t_catch_lock = 0;
    if (!lock_lookup(s)) lock_register(s, new_lid());
    g_import_lock_ordered = 1;
    return R(sem_trywait)(s);
}

EXPORT int sem_trywait(sem_t *s) {
    if (t_catch_lock) return catch_import_lock(s);
    HOOK(lock_lookup(s), R(sem_trywait)(s), sem_op(LLFT_C_SEM_TRYWAIT, s, 0, NULL));
}
EXPORT int sem_timedwait(sem_t *s, const struct timespec *abst) {
    HOOK(lock_lookup(s), R(sem_timedwait)(s, abst), sem_op(LLFT_C_SEM_TIMEDWAIT, s, (clockid_t)-1, abst));
}
EXPORT int sem_clockwait(sem_t *s, clockid_t clk, const struct timespec *abst) {
    HOOK(lock_lookup(s), R(sem_clockwait)(s, clk, abst), sem_op(LLFT_C_SEM_TIMEDWAIT, s, clk, abst));
}

/* pthread mutexes of C extensions: the same rules. The GIL and its switch mutex are
 * created during start-up, before Py_IsInitialized(), so they are never registered. */
EXPORT int pthread_mutex_init(pthread_mutex_t *m, const pthread_mutexattr_t *a) {
    int r = R(pthread_mutex_init)(m, a);
    if (r == 0 && active_here() && app_started()) {
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
    if (replaying(&b, call, op, NULL, 0)) {
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
    if (__builtin_expect(is_gil_mutex(m), 0)) return gil_lock(m);   /* shim_gil.c */
    HOOK(lock_lookup(m), R(pthread_mutex_lock)(m), mutex_op(LLFT_C_MUTEX_LOCK, m, NULL));
}
EXPORT int pthread_mutex_trylock(pthread_mutex_t *m) {
    HOOK(lock_lookup(m), R(pthread_mutex_trylock)(m), mutex_op(LLFT_C_MUTEX_TRYLOCK, m, NULL));
}
EXPORT int pthread_mutex_timedlock(pthread_mutex_t *m, const struct timespec *abst) {
    HOOK(lock_lookup(m), R(pthread_mutex_timedlock)(m, abst), mutex_op(LLFT_C_MUTEX_TIMEDLOCK, m, abst));
}
