/* shim_time.c -- CTS: clocks and sleeps.
 *
 * Intercepts clock_gettime, gettimeofday, time (the group clock) and clock_nanosleep,
 * nanosleep (sleeps), all per the paper's consistent time service: a backup returns
 * the primary's readings and keeps the offset of the group clock over its own, so that
 * after a promotion it goes on from where the primary was (never backwards).
 *
 * Only reads that reach the application are ordered: made by a thread that HOLDS THE
 * GIL and NOT from the interpreter's timing machinery. CPython 3.11 reads
 * CLOCK_MONOTONIC on every lock acquire (PyThread_acquire_lock_timed ->
 * _PyTime_GetMonotonicClock), for deadlines (_PyDeadline_* -> _PyTime_GetMonotonicClock),
 * for import/gc timing (_PyTime_GetPerfCounter) and in every GIL wait
 * (_PyThread_cond_after, without the GIL). The app-facing readers are different
 * functions (time.time -> _PyTime_GetSystemClockWithInfo, time.monotonic/perf_counter/
 * sleep -> _PyTime_GetMonotonicClockWithInfo, datetime.now -> _PyTime_GetSystemClock,
 * time.clock_gettime). So the call site (our return address) tells them apart: reads
 * returning into _PyTime_GetMonotonicClock or _PyTime_GetPerfCounter (address ranges
 * from the dynamic symbol table, found once at activation) are internal; of the rest,
 * only reads with the GIL held are synchronous with Python code, hence deterministic
 * in number. The main thread's ordered clock reads are also the garbage collector's
 * points (shim_gc.c).
 */
#include "shim_internal.h"

/* Interpreter timing machinery: reads returning into these are never ordered. */
#define MAX_INTERNAL 4
static uintptr_t g_int_lo[MAX_INTERNAL], g_int_hi[MAX_INTERNAL];
static int g_nint;

/* CTS: per clock, offset of the virtual group clock over the local clock, and the
 * last value handed out (the group clock never goes backwards). */
#define NCLOCKS 12
static int64_t g_clk_off[NCLOCKS];
static int64_t g_clk_last[NCLOCKS];

/* The group clock's offset over the local clock `clk` (0 until a promotion): file
 * timestamps a primary records are shifted by it too (shim_process.c). */
int64_t cts_offset(clockid_t clk) { return clk >= 0 && clk < NCLOCKS ? g_clk_off[clk] : 0; }

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

void time_activate(void) {
    add_internal_range("_PyTime_GetMonotonicClock");
    add_internal_range("_PyTime_GetPerfCounter");
}

static int clock_app_visible(void *ra) {
    uintptr_t a = (uintptr_t)ra;
    for (int i = 0; i < g_nint; i++)
        if (a >= g_int_lo[i] && a < g_int_hi[i]) return 0;
    return gil_held();
}
static int clock_is_wall_or_mono(clockid_t c) {
    return c != CLOCK_PROCESS_CPUTIME_ID && c != CLOCK_THREAD_CPUTIME_ID;
}

/* One virtual group clock reading, in ns. Returns 0 or -1 with *err set. */
static int cts_read(unsigned call, clockid_t clk, int64_t *v, int *err) {
    uint64_t op = LLFT_OP(LLFT_OPC_CLOCK, (uint64_t)clk);
    struct timespec ts;
    struct bk b;
    if (replaying(&b, call, op, NULL, 0)) {
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

/* The clock hooks: the reading is ordered (GUARDED), then the main thread may collect
 * garbage (gc_point runs unguarded: it guards the collection itself). */
static int clock_gettime_ordered(clockid_t clk, struct timespec *tp, int *err) {
    int64_t v;
    int r = cts_read(LLFT_C_CLOCK_GETTIME, clk, &v, err);
    if (!r) { tp->tv_sec = v / 1000000000LL; tp->tv_nsec = v % 1000000000LL; }
    return r;
}
EXPORT int clock_gettime(clockid_t clk, struct timespec *tp) {
    void *ra = __builtin_return_address(0);
    if (!active_here() || clk < 0 || clk >= NCLOCKS || !clock_app_visible(ra))
        return R(clock_gettime)(clk, tp);
    int err;
    int r = GUARDED(clock_gettime_ordered(clk, tp, &err));
    gc_point(1);
    if (r) errno = err;
    return r;
}

static int gettimeofday_ordered(struct timeval *tv, void *tz, int *err) {
    int64_t v;
    int r = cts_read(LLFT_C_GETTIMEOFDAY, CLOCK_REALTIME, &v, err);
    if (!r) { tv->tv_sec = v / 1000000000LL; tv->tv_usec = (v % 1000000000LL) / 1000; }
    if (tz) memset(tz, 0, 8);
    return r;
}
EXPORT int gettimeofday(struct timeval *tv, void *tz) {
    void *ra = __builtin_return_address(0);
    if (!active_here() || !clock_app_visible(ra)) return R(gettimeofday)(tv, tz);
    int err;
    int r = GUARDED(gettimeofday_ordered(tv, tz, &err));
    gc_point(1);
    if (r) errno = err;
    return r;
}

static time_t time_ordered(time_t *out) {
    int64_t v;
    int err;
    int r = cts_read(LLFT_C_TIME, CLOCK_REALTIME, &v, &err);
    time_t s = r ? (time_t)-1 : (time_t)(v / 1000000000LL);
    if (out && !r) *out = s;
    return s;
}
EXPORT time_t time(time_t *out) {
    HOOK(clock_app_visible(__builtin_return_address(0)), R(time)(out), time_ordered(out));
}

/* A thread that slept at the primary let the others run meanwhile; some programs
 * then look at what they did WITHOUT a lock (py4j's FinalizerWorker polls a deque
 * every second, a race only the GIL arbitrates). A backup thread therefore ends its
 * sleep only once as many entries have completed here as had been appended at the
 * primary before the sleep returned (the feeder stamps that count in `aux`). This
 * narrows such races to the instant between two ordered calls; it cannot close them
 * (that would take ordering every GIL hand-over). */
void sleep_barrier(struct bk *b) {
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
static int clock_nanosleep_ordered(clockid_t clk, int flags, const struct timespec *req,
                                   struct timespec *rem) {
    uint64_t op = thread_op();
    int r;
    struct bk b;
    if (replaying(&b, LLFT_C_CLOCK_NANOSLEEP, op, NULL, 0)) {
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
    return r;
}
EXPORT int clock_nanosleep(clockid_t clk, int flags, const struct timespec *req, struct timespec *rem) {
    HOOK(1, R(clock_nanosleep)(clk, flags, req, rem), clock_nanosleep_ordered(clk, flags, req, rem));
}

static int nanosleep_ordered(const struct timespec *req, struct timespec *rem) {
    uint64_t op = thread_op();
    int r, e;
    struct bk b;
    if (replaying(&b, LLFT_C_NANOSLEEP, op, NULL, 0)) {
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
    errno = e ? e : errno;
    return r;
}
EXPORT int nanosleep(const struct timespec *req, struct timespec *rem) {
    HOOK(1, R(nanosleep)(req, rem), nanosleep_ordered(req, rem));
}
