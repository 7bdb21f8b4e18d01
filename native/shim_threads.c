/* shim_threads.c -- threads.
 *
 * Intercepts pthread_create, a per-thread operation whose metadata is the child's
 * logical id (t of the (t, o, n, d) entries), so the k-th thread created by thread p
 * has the same id everywhere; the child starts with its id set (thread_trampoline).
 */
#include "shim_internal.h"

struct tstart { void *(*fn)(void *); void *arg; int tid; };
static void *thread_trampoline(void *p) {
    struct tstart s = *(struct tstart *)p;
    free(p);
    t_tid = s.tid;
    t_n = 0;
    t_created = 0;
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
    return r;
}
EXPORT int pthread_create(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *), void *arg) {
    if (!active_here()) return R(pthread_create)(th, attr, fn, arg);
    gc_point(0);   /* automatic GC off before a second thread exists */
    t_guard++;
    gil_order_start();   /* and GIL hand-offs ordered (shim_gil.c) */
    t_guard--;
    return GUARDED(pthread_create_ordered(th, attr, fn, arg));
}
