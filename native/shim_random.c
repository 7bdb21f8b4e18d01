/* shim_random.c -- randomness, and the machine's state read through libc.
 *
 * Intercepts getrandom and reads of /dev/urandom and /dev/random (recognised when
 * opened: open, open64, openat, openat64), a per-thread operation whose payload is
 * the bytes. The interpreter's hash secret comes from getrandom at start-up, so set
 * iteration order replays without touching PYTHONHASHSEED.
 *
 * getloadavg (os.getloadavg) differs between replicas like a random source: libc reads
 * /proc/loadavg through its internal open/read, which no hook sees, so the call itself
 * is recorded (payload: the doubles it filled in).
 */
#include "shim_internal.h"

/* getrandom, or a read of a random device (`fd`): recorded bytes at a backup. */
ssize_t random_call(unsigned call, int fd, void *buf, size_t n, unsigned flags) {
    uint64_t op = thread_op();
    if (n > LLFT_MAX_DATA_BYTES) n = LLFT_MAX_DATA_BYTES;  /* a short read is legal */
    ssize_t r;
    int e;
    struct bk b;
    if (replaying(&b, call, op, buf, (uint32_t)n)) {
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
    HOOK(1, R(getrandom)(buf, n, flags), random_call(LLFT_C_GETRANDOM, -1, buf, n, flags));
}

static int loadavg_call(double *la, int nelem) {
    uint64_t op = thread_op();
    uint32_t n = nelem > 0 ? (uint32_t)nelem * (uint32_t)sizeof(double) : 0;
    if (n > LLFT_MAX_DATA_BYTES) n = LLFT_MAX_DATA_BYTES;
    int r, e;
    struct bk b;
    if (replaying(&b, LLFT_C_GETLOADAVG, op, la, n)) {
        r = (int)b.h.ret;
        e = b.h.err;
        bk_end(&b);
    } else {
        r = R(getloadavg)(la, nelem);
        e = r < 0 ? errno : 0;
        pr_append(LLFT_C_GETLOADAVG, op, r, e, 0, 0, la, r > 0 ? (uint32_t)r * (uint32_t)sizeof(double) : 0);
    }
    errno = e ? e : errno;
    return r;
}

EXPORT int getloadavg(double la[], int nelem) {
    HOOK(1, R(getloadavg)(la, nelem), loadavg_call(la, nelem));
}

static int is_random_path(const char *p) {
    return p && (!strcmp(p, "/dev/urandom") || !strcmp(p, "/dev/random"));
}
static void note_open(int fd, const char *path) {
    if (fd_ok(fd) && g_active && is_random_path(path)) {
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
