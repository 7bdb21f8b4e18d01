/* shim_process.c -- files and children: the app's private companions.
 *
 * Intercepts stat64, waitpid and pipe/pipe2 (and the reads of pipes), made by the
 * application once the interpreter is up.
 * The app also observes its private companions (the Spark JVM) through the file
 * system and its children's exit: PySpark polls `os.path.isfile(conn_info_file)` and
 * `proc.poll()` every 0.1 s until the JVM is up, so the number of loop turns -- and of
 * the clock reads and sleeps in them -- depends on the JVM's speed. The outcome is
 * ordered like a lock grant: a backup returns "not there yet / still running" when
 * the primary saw that, without looking; and when the primary saw the file or the
 * exit, the backup waits (bounded, stall-checked) until it is true locally too, then
 * returns the local facts. Calls after start-up count (os.stat and os.waitpid drop the
 * GIL around the call; the interpreter's own import stats are synchronous with Python
 * code, so their number is deterministic too).
 */
#include "shim_internal.h"

#include <sys/prctl.h>

/* The process id is an input like the clock: a replicated program puts it in what it
 * sends (logging's LogRecord.process, test_logging's socket handlers), and every replica
 * has its own. The primary records its pid as its main thread's first entry (at
 * activation); getpid() returns that group pid everywhere, and kill() of the group pid
 * reaches this process (os.kill(os.getpid(), sig) works at a backup). Children's pids
 * are not virtualized. */
static pid_t g_group_pid;
static struct timespec g_run_start;   /* coarse real time at activation: see stat64 */

void process_activate(void) {
    syscall(SYS_clock_gettime, CLOCK_REALTIME_COARSE, &g_run_start);
    uint64_t op = thread_op();
    struct bk b;
    pid_t group_pid;
    if (replaying(&b, LLFT_C_GETPID, op, NULL, 0)) {
        group_pid = (pid_t)b.h.ret;
        bk_end(&b);
    } else {
        group_pid = g_pid;
        pr_append(LLFT_C_GETPID, op, g_pid, 0, 0, 0, NULL, 0);
    }
    /* Recorded always, applied only on request: replicas that share a host (tests, the
     * demo) would otherwise share every file named after the process id. */
    const char *on = getenv("LLFT_GROUP_PID");
    if (on && on[0] == '1') g_group_pid = group_pid;
}
EXPORT pid_t getpid(void) {
    if (!g_active || !g_group_pid) return R(getpid)();
    pid_t real = R(getpid)();
    return real == g_pid ? g_group_pid : real;   /* a forked child: its own */
}
/* A signal the app (or a fork of it) sends another process is noted before it is sent
 * (ctl.sent): the agent tells a child the app killed (every replica does the same) from
 * one killed from outside (a failure of this machine). */
static void note_sent(pid_t pid, int sig) {
    if (g_ctl && sig > 0 && pid != R(getpid)())
        llft_note(&g_ctl->sent_count, g_ctl->sent, (int32_t)pid, sig);
}
EXPORT int kill(pid_t pid, int sig) {
    if (g_active && g_group_pid && pid == g_group_pid && R(getpid)() == g_pid) pid = g_pid;
    note_sent(pid, sig);
    if (!g_active) return R(kill)(pid, sig);
    sig_sending(1);   /* a signal this thread gets now is its own (shim_signals.c) */
    int r = R(kill)(pid, sig);
    sig_sending(0);
    return r;
}
/* glibc's killpg calls its kill internally: interposed on its own, for the note. */
EXPORT int killpg(pid_t pgrp, int sig) {
    if (pgrp < 0) { errno = EINVAL; return -1; }
    return kill(-pgrp, sig);
}

/* A parent-death signal a fork of the app asks for before its exec (a preexec_fn's
 * prctl): the kernel sends it when the app's thread that started the child ends, which
 * is the app's doing; noted as a signal the app sends the child. */
EXPORT int prctl(int option, ...) {
    va_list ap;
    va_start(ap, option);
    unsigned long a2 = va_arg(ap, unsigned long), a3 = va_arg(ap, unsigned long);
    unsigned long a4 = va_arg(ap, unsigned long), a5 = va_arg(ap, unsigned long);
    va_end(ap);
    pid_t me = R(getpid)();
    if (option == PR_SET_PDEATHSIG && g_ctl && (int)a2 > 0 && me != g_pid)
        llft_note(&g_ctl->sent_count, g_ctl->sent, (int32_t)me, (int)a2);
    return R(prctl)(option, a2, a3, a4, a5);
}

/* The app also kills through the programs it runs (a shell's `kill`, a JVM's
 * Process.destroy, a child that kills itself). Every program it starts gets
 * libllft_notes.so (native/notes/llft_notes.c: its signals noted in ctl.sent, as here)
 * and LLFT_NOTES, the block's path, added to the environment its exec is given, not to
 * the app's own: its os.environ stays what it is at every replica (a PySpark driver
 * hands the JVM a copy of it). The exec hooks, and those of the other ways to signal
 * (sigqueue, tgkill, pidfd_send_signal, syscall()), are the notes library's own:
 * native/notes/notes_hooks.h. */
static pid_t waitpid_noted(pid_t pid, int *status, int options);
#define NOTES_REAL(name) R(name)
#define notes_sent note_sent
#define notes_kill kill
#define notes_waitpid waitpid_noted
#include "notes/notes_hooks.h"

void notes_activate(const char *shm_path) {
    Dl_info info;
    if (dladdr((void *)notes_activate, &info) && info.dli_fname)
        notes_exec_setup(info.dli_fname, shm_path);
}

/* File timestamps are clock readings the kernel took: a file the run wrote has the
 * primary's real times there and the backup's (later) real times here, while the program
 * compares them with the group clock (logging's TimedRotatingFileHandler rolls over by a
 * log file's st_mtime). So a stat of a file changed since the process started (its ctime
 * is not older than the start, by the coarse clock the kernel stamps files with) records
 * its three times, shifted like the group clock, and a backup returns those. Files older
 * than the run (the program's own sources, which import compares with their .pyc) keep
 * each host's real times. rr records every stat result; DMTCP leaves them real. */
#define STAT_TIMES 1   /* flags: the record carries atime, mtime, ctime */
static int changed_in_run(const struct stat64 *st) {
    return st->st_ctim.tv_sec > g_run_start.tv_sec
        || (st->st_ctim.tv_sec == g_run_start.tv_sec && st->st_ctim.tv_nsec >= g_run_start.tv_nsec);
}
static void shift(struct timespec *t, int64_t ns) {
    int64_t v = (int64_t)t->tv_sec * 1000000000LL + t->tv_nsec + ns;
    t->tv_sec = v / 1000000000LL;
    t->tv_nsec = v % 1000000000LL;
}

/* One stat call, whichever variant: every variant must give a file the same times
 * (SimpleHTTPRequestHandler compares os.stat's mtime with os.fstat's). */
enum { ST_PATH, ST_LINK, ST_FD, ST_AT };
struct stat_call { int how, fd, flags; const char *path; };
static int stat_real(const struct stat_call *c, struct stat64 *st) {
    switch (c->how) {
    case ST_PATH: return R(stat64)(c->path, st);
    case ST_LINK: return R(lstat64)(c->path, st);
    case ST_FD: return R(fstat64)(c->fd, st);
    default: return R(fstatat64)(c->fd, c->path, st, c->flags);
    }
}
static int stat_ordered(const struct stat_call *c, struct stat64 *st) {
    uint64_t op = thread_op();
    int r, e;
    struct bk b;
    struct timespec times[3];
    if (replaying(&b, LLFT_C_STAT, op, times, sizeof times)) {
        e = 0;
        if (b.h.ret == 0) {
            struct stallw sw = {0, 0};
            while ((r = stat_real(c, st)) != 0 && c->how != ST_FD) {   /* an fd: no file to wait for */
                if (!b.gil) b.gil = gil_drop();
                struct timespec ms = {0, 1000000};
                R(nanosleep)(&ms, NULL);
                stall_check(&sw, "a file the primary saw", LLFT_C_STAT, op);
            }
            if (r) e = errno;
            else if (b.h.flags == STAT_TIMES && b.h.dlen == sizeof times) {
                st->st_atim = times[0];
                st->st_mtim = times[1];
                st->st_ctim = times[2];
            }
        } else {
            r = -1;
            e = b.h.err;
        }
        bk_end(&b);
    } else {
        r = stat_real(c, st);
        e = r ? errno : 0;
        int times_too = r == 0 && changed_in_run(st);
        if (times_too) {   /* the group clock's view (offset non-zero after a promotion) */
            int64_t off = cts_offset(CLOCK_REALTIME);
            shift(&st->st_atim, off);
            shift(&st->st_mtim, off);
            shift(&st->st_ctim, off);
            times[0] = st->st_atim;
            times[1] = st->st_mtim;
            times[2] = st->st_ctim;
        }
        pr_append(LLFT_C_STAT, op, r, e, 0, times_too ? STAT_TIMES : 0, times, times_too ? sizeof times : 0);
    }
    errno = e ? e : errno;
    return r;
}

EXPORT int stat64(const char *path, struct stat64 *st) {
    struct stat_call c = {ST_PATH, -1, 0, path};
    HOOK(app_started(), R(stat64)(path, st), stat_ordered(&c, st));
}
EXPORT int lstat64(const char *path, struct stat64 *st) {
    struct stat_call c = {ST_LINK, -1, 0, path};
    HOOK(app_started(), R(lstat64)(path, st), stat_ordered(&c, st));
}
EXPORT int fstat64(int fd, struct stat64 *st) {
    struct stat_call c = {ST_FD, fd, 0, NULL};
    HOOK(app_started(), R(fstat64)(fd, st), stat_ordered(&c, st));
}
EXPORT int fstatat64(int dirfd, const char *path, struct stat64 *st, int flags) {
    struct stat_call c = {ST_AT, dirfd, flags, path};
    HOOK(app_started(), R(fstatat64)(dirfd, path, st, flags), stat_ordered(&c, st));
}

/* A child the app reaped, with its real wait status (ctl.reaped): once reaped, its death
 * can no longer be read from /proc, and the agent asks how it died (see note_sent). */
static void note_reaped(pid_t r, int st) {
    if (g_ctl && r > 0 && (WIFEXITED(st) || WIFSIGNALED(st)))
        llft_note(&g_ctl->reaped_count, g_ctl->reaped, (int32_t)r, st);
}

/* The app met the end of a private connection or a pipe (a read's EOF, a reset, a broken
 * pipe): maybe a child's death (ctl.ends_count; the agent then looks for children it
 * does not watch yet). Keeps errno. */
void note_private_end(ssize_t r, int e) {
    if (g_ctl && (r == 0 || (r < 0 && (e == EPIPE || e == ECONNRESET || e == ECONNABORTED
                                       || e == ENOTCONN))))
        __atomic_fetch_add(&g_ctl->ends_count, 1, __ATOMIC_ACQ_REL);
}

static pid_t waitpid_ordered(pid_t pid, int *status, int options) {
    uint64_t op = thread_op();
    pid_t r;
    int e, st = 0;
    struct bk b;
    if (replaying(&b, LLFT_C_WAITPID, op, NULL, 0)) {
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
            if (r > 0) {
                note_reaped(r, st);
                st = (int)b.h.aux;   /* the primary's status */
            }
        }
        bk_end(&b);
    } else {
        r = R(waitpid)(pid, &st, options);
        e = r < 0 ? errno : 0;
        note_reaped(r, st);
        pr_append(LLFT_C_WAITPID, op, r, e, (uint32_t)st, 0, NULL, 0);
    }
    if (status && r > 0) *status = st;
    errno = e ? e : errno;
    return r;
}
static pid_t waitpid_noted(pid_t pid, int *status, int options) {
    int st = 0;
    pid_t r = R(waitpid)(pid, &st, options);
    int e = errno;
    note_reaped(r, st);
    if (status && r > 0) *status = st;
    errno = e;
    return r;
}
EXPORT pid_t waitpid(pid_t pid, int *status, int options) {
    HOOK(app_started(), waitpid_noted(pid, status, options), waitpid_ordered(pid, status, options));
}

/* Pipes (subprocess.communicate, asyncio's pipe transports, script_helper's children):
 * a backup's child runs too, so its output is real there, but WHEN it is ready and HOW
 * MUCH one read returns are timing -- and the program's number of reads, selector turns
 * and GIL hand-offs follow them. So a pipe is like a private stream with exact hints:
 * its readiness is ordered in poll/select/epoll_wait (made true locally at a backup,
 * shim_net.c), the primary records each read's count or error, and a backup returns
 * the error (EAGAIN) without reading, waits (stall-checked, no cap: the child writes
 * what it wrote at the primary, or exits) for that many bytes or the writer's close,
 * and reads exactly that much. Pipes between threads of the process replay the same way. */
static void pipe_note(int r, int fds[2]) {
    if (r != 0 || !active_here() || !app_started()) return;
    fd_set_kind(fds[0], FDK_PIPE, new_lid());
    fd_set_kind(fds[1], FDK_PIPE, new_lid());
}
EXPORT int pipe(int fds[2]) {
    int r = R(pipe)(fds);
    int e = errno;
    pipe_note(r, fds);
    errno = e;
    return r;
}
EXPORT int pipe2(int fds[2], int flags) {
    int r = R(pipe2)(fds, flags);
    int e = errno;
    pipe_note(r, fds);
    errno = e;
    return r;
}

ssize_t pipe_read(int fd, void *buf, size_t n) {
    uint64_t op = fd_op(fd);
    ssize_t r;
    int e;
    struct bk b;
    int got = backup_now() ? bk_begin(&b, LLFT_C_PRIVATE_RECV, op, NULL, 0) : BK_PRIMARY;
    if (got == BK_RECORD && b.h.ret < 0) {
        r = -1;
        e = b.h.err;
        bk_end(&b);
    } else if (got == BK_RECORD) {
        size_t want = (size_t)b.h.ret < n ? (size_t)b.h.ret : n;
        struct stallw sw = {0, 0};
        for (;;) {
            int avail = 0;
            struct pollfd pf = {fd, POLLIN, 0};
            ioctl(fd, FIONREAD, &avail);
            R(poll)(&pf, 1, 0);
            int closed = (pf.revents & (POLLHUP | POLLERR)) && avail == 0;
            if (closed || (want && (size_t)avail >= want) || (!want && avail)) break;
            if (!b.gil) b.gil = gil_drop();
            if (avail) { struct timespec ms = {0, 500000}; R(nanosleep)(&ms, NULL); }
            else R(poll)(&pf, 1, WAIT_SLICE_MS);
            stall_check(&sw, "what a pipe gave the primary", b.h.call, b.h.op);
        }
        r = want ? R(read)(fd, buf, want) : 0;   /* EOF at the primary: EOF here */
        e = r < 0 ? errno : 0;
        bk_end(&b);
    } else {
        r = R(read)(fd, buf, n);
        e = r < 0 ? errno : 0;
        if (n) note_private_end(r, e);
        if (got == BK_PRIMARY) pr_append(LLFT_C_PRIVATE_RECV, op, r, e, 0, 0, NULL, 0);
    }
    errno = e ? e : errno;
    return r;
}
