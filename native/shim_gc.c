/* shim_gc.c -- garbage collection at deterministic points.
 *
 * Intercepts nothing itself: gc_point() is called by the clock hooks (shim_time.c) and
 * by pthread_create (shim_threads.c). CPython's cyclic GC runs when a global allocation count crosses a threshold, in
 * whichever thread allocates then: with several threads, where (and in which thread)
 * finalizers and weakref callbacks run is decided by thread interleaving, which replay
 * does not reproduce. PySpark frees Java objects from exactly such callbacks (py4j
 * takes a lock and talks to the JVM there), so a backup's threads made calls the
 * primary's had not made at that point. Instead, automatic collection is switched off
 * and the main thread collects at deterministic points: every GC_EVERY-th ordered
 * clock read it makes (the same calls at every replica), gen 1 every 10th time, gen 2
 * every 100th. What a collection's finalizers do is not ordered (t_guard): the garbage
 * found may differ slightly between replicas, and its effects are private (freeing
 * JVM objects). Locks and sockets created during a collection are never ordered.
 */
#include "shim_internal.h"

/* CPython's gc entry points, resolved at activation. */
static int (*py_gc_disable)(void);                 /* PyGC_Disable (3.10+) */
static void *(*py_import)(const char *);           /* PyImport_ImportModule */
static void *(*py_getattr)(void *, const char *);  /* PyObject_GetAttrString */
static void *(*py_call1)(void *, void *);          /* PyObject_CallOneArg */
static void *(*py_long)(long);                     /* PyLong_FromLong */
static void (*py_decref)(void *);                  /* Py_DecRef */
static void (*py_err_fetch)(void **, void **, void **);
static void (*py_err_restore)(void *, void *, void *);
static void (*py_err_clear)(void);

void gc_activate(void) {
    py_gc_disable = (int (*)(void))dlsym(RTLD_DEFAULT, "PyGC_Disable");
    py_import = (void *(*)(const char *))dlsym(RTLD_DEFAULT, "PyImport_ImportModule");
    py_getattr = (void *(*)(void *, const char *))dlsym(RTLD_DEFAULT, "PyObject_GetAttrString");
    py_call1 = (void *(*)(void *, void *))dlsym(RTLD_DEFAULT, "PyObject_CallOneArg");
    py_long = (void *(*)(long))dlsym(RTLD_DEFAULT, "PyLong_FromLong");
    py_decref = (void (*)(void *))dlsym(RTLD_DEFAULT, "Py_DecRef");
    py_err_fetch = (void (*)(void **, void **, void **))dlsym(RTLD_DEFAULT, "PyErr_Fetch");
    py_err_restore = (void (*)(void *, void *, void *))dlsym(RTLD_DEFAULT, "PyErr_Restore");
    py_err_clear = (void (*)(void))dlsym(RTLD_DEFAULT, "PyErr_Clear");
}

#define GC_EVERY 64
static void *g_gc_collect;       /* gc.collect, or NULL before set-up / if unavailable */
static int g_gc_state;           /* 0 not yet, 1 set up, -1 unavailable */
static TLS uint32_t t_gc_points;

/* The main thread with the GIL: the first call switches automatic collection off;
 * with `may_collect`, every GC_EVERY-th call collects. */
void gc_point(int may_collect) {
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
