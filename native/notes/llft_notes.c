/* llft_notes.c -- libllft_notes.so: what the application's descendants do to processes.
 *
 * The agent tells a child of the app that died by a process's signal (SIGKILL, SIGTERM
 * ...) that the application sent from one killed from outside it (an operator's
 * `kill -9`, a failure of this machine that a takeover masks): llft/runtime/proctree.py
 * ChildWatch. The app's own kills are noted by the shim (native/shim_process.c), but
 * the app also kills through the programs it runs: a shell's `kill`, a JVM's
 * Process.destroy, a child that kills itself, a helper's `pkill`. Those run without the
 * shim (it is the app's alone); the shim's exec hooks give every program the app starts
 * this small library instead (LD_PRELOAD) and the shared block's path (LLFT_NOTES), and
 * it passes both on to their own children through the environment.
 *
 * It notes, before the call, in the shared block's ring of signals sent (llft_shm.h
 * ctl.sent, llft_note): kill and killpg with the target as the kernel reads it (0 turned
 * into this process's group), sigqueue, raise (this process), and a parent-death signal
 * a process asks for (prctl PR_SET_PDEATHSIG: the kernel sends it when the thread that
 * started it ends, which is the application's doing). The block is mapped at the first
 * note, so a program that signals nobody pays nothing.
 *
 * It also notes, in ctl.received, a SIGTERM, SIGINT or SIGHUP that a process (kill,
 * sigqueue: not the kernel, not a thread's pthread_kill) sent to a program that handles
 * it: a JVM runs its shutdown hooks and exits with status 128 + the signal, which looks
 * like an exit. sigaction and signal put a trampoline in front of the program's handler
 * (it notes, then calls the handler as the program asked) and give the program back its
 * own handler when it asks what is installed.
 * And it notes, in ctl.reaped, the processes a program reaps (waitpid, wait, wait3,
 * wait4, waitid) with their wait status: the app's grandchildren are watched too, and
 * the one a shell reaped the moment it died can no longer be read from /proc.
 * The exec hooks, and those of the other ways to signal (sigqueue, tgkill,
 * pidfd_send_signal, syscall()), are the shim's too: notes_hooks.h. A program that
 * starts its own with a clean environment passes the library on anyway.
 * Not covered: static binaries, raw system calls (a Go program's), a handler installed
 * by rt_sigaction's system call itself.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../llft_shm.h"

#define EXPORT __attribute__((visibility("default")))

static struct llft_ctl *g_ctl;          /* mapped at the first note; NULL: not yet */
static int g_unmappable;                /* no block (no LLFT_NOTES, gone, another version) */
static char g_path[PATH_MAX];           /* LLFT_NOTES as the program started: "" none */

static struct llft_ctl *ctl(void) {
    struct llft_ctl *c = __atomic_load_n(&g_ctl, __ATOMIC_ACQUIRE);
    if (c || __atomic_load_n(&g_unmappable, __ATOMIC_RELAXED))
        return c;
    int fd = g_path[0] ? open(g_path, O_RDWR | O_CLOEXEC) : -1;
    void *m = MAP_FAILED;
    if (fd >= 0) {
        m = mmap(NULL, sizeof(struct llft_ctl), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
    }
    if (m == MAP_FAILED) {
        __atomic_store_n(&g_unmappable, 1, __ATOMIC_RELAXED);
        return NULL;
    }
    c = m;
    if (c->magic != LLFT_SHM_MAGIC || c->version != LLFT_SHM_VERSION) {
        munmap(m, sizeof(struct llft_ctl));
        __atomic_store_n(&g_unmappable, 1, __ATOMIC_RELAXED);
        return NULL;
    }
    struct llft_ctl *none = NULL;       /* two threads at once: one mapping stays */
    if (!__atomic_compare_exchange_n(&g_ctl, &none, c, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        munmap(m, sizeof(struct llft_ctl));
        c = none;
    }
    return c;
}

static void note_sent(pid_t target, int sig) {
    if (sig <= 0)
        return;                         /* a probe (0) or an error the call will return */
    struct llft_ctl *c = ctl();
    if (c)
        llft_note(&c->sent_count, c->sent, (int32_t)target, sig);
}

static void *real(const char *name) { return dlsym(RTLD_NEXT, name); }

EXPORT int kill(pid_t pid, int sig) {
    static int (*k)(pid_t, int);
    if (!k) k = (int (*)(pid_t, int))real("kill");
    note_sent(pid == 0 ? -getpgrp() : pid, sig);
    return k(pid, sig);
}

/* glibc's killpg calls its kill internally, past any interposer */
EXPORT int killpg(pid_t pgrp, int sig) {
    static int (*k)(pid_t, int);
    if (!k) k = (int (*)(pid_t, int))real("killpg");
    if (pgrp >= 0) note_sent(pgrp == 0 ? -getpgrp() : -pgrp, sig);
    return k(pgrp, sig);
}

/* the exec hooks and the other ways to signal (notes_hooks.h) */
#define NOTES_REAL(name) ({ \
        static __typeof__(&name) f_; \
        if (!f_) f_ = (__typeof__(&name))real(#name); \
        f_; })
#define notes_sent note_sent
#define notes_kill kill
#define notes_waitpid waitpid        /* (system(): the hook below, which notes) */
EXPORT pid_t waitpid(pid_t pid, int *status, int options);
#include "notes_hooks.h"

/* ---- processes reaped (ctl.reaped) -------------------------------------------------- */

/* Resolved when the library is loaded: a shell reaps in its SIGCHLD handler, where
 * dlsym is not safe. */
static pid_t (*real_waitpid)(pid_t, int *, int);
static pid_t (*real_wait)(int *);
static pid_t (*real_wait3)(int *, int, struct rusage *);
static pid_t (*real_wait4)(pid_t, int *, int, struct rusage *);
static int (*real_waitid)(idtype_t, id_t, siginfo_t *, int);

static void resolve_waits(void) {       /* (also if a call comes before the constructor) */
    real_waitpid = (pid_t (*)(pid_t, int *, int))real("waitpid");
    real_wait = (pid_t (*)(int *))real("wait");
    real_wait3 = (pid_t (*)(int *, int, struct rusage *))real("wait3");
    real_wait4 = (pid_t (*)(pid_t, int *, int, struct rusage *))real("wait4");
    real_waitid = (int (*)(idtype_t, id_t, siginfo_t *, int))real("waitid");
}

static void note_reaped(pid_t r, int st) {
    if (r > 0 && (WIFEXITED(st) || WIFSIGNALED(st))) {
        struct llft_ctl *c = ctl();
        if (c)
            llft_note(&c->reaped_count, c->reaped, (int32_t)r, st);
    }
}

/* each keeps errno, and fills *status as the call did */
#define REAPED(call) ({ \
        int st_ = 0; \
        if (!real_waitid) resolve_waits(); \
        pid_t r_ = (call); \
        int e_ = errno; \
        note_reaped(r_, st_); \
        if (status && r_ > 0) *status = st_; \
        errno = e_; \
        r_; })

EXPORT pid_t waitpid(pid_t pid, int *status, int options) {
    return REAPED(real_waitpid(pid, &st_, options));
}
EXPORT pid_t wait(int *status) {
    return REAPED(real_wait(&st_));
}
EXPORT pid_t wait3(int *status, int options, struct rusage *ru) {
    return REAPED(real_wait3(&st_, options, ru));
}
EXPORT pid_t wait4(pid_t pid, int *status, int options, struct rusage *ru) {
    return REAPED(real_wait4(pid, &st_, options, ru));
}
EXPORT int waitid(idtype_t idtype, id_t id, siginfo_t *info, int options) {
    if (!real_waitid) resolve_waits();
    int r = real_waitid(idtype, id, info, options), e = errno;
    if (r == 0 && info && info->si_pid > 0 && !(options & WNOWAIT)) {
        int st = -1;                    /* the siginfo as a wait status */
        if (info->si_code == CLD_EXITED) st = (info->si_status & 0xff) << 8;
        else if (info->si_code == CLD_KILLED) st = info->si_status & 0x7f;
        else if (info->si_code == CLD_DUMPED) st = (info->si_status & 0x7f) | 0x80;
        if (st >= 0) note_reaped(info->si_pid, st);
    }
    errno = e;
    return r;
}

__attribute__((constructor))
static void notes_init(void) {
    const char *path = getenv("LLFT_NOTES");
    Dl_info info;
    resolve_waits();
    if (!path || strlen(path) >= sizeof g_path) return;
    strcpy(g_path, path);
    if (dladdr((void *)notes_init, &info) && info.dli_fname)
        notes_exec_setup(info.dli_fname, path);
}

EXPORT int raise(int sig) {
    static int (*r)(int);
    if (!r) r = (int (*)(int))real("raise");
    note_sent(getpid(), sig);
    return r(sig);
}

EXPORT int prctl(int option, ...) {
    static int (*p)(int, ...);
    if (!p) p = (int (*)(int, ...))real("prctl");
    va_list ap;
    va_start(ap, option);
    unsigned long a2 = va_arg(ap, unsigned long), a3 = va_arg(ap, unsigned long);
    unsigned long a4 = va_arg(ap, unsigned long), a5 = va_arg(ap, unsigned long);
    va_end(ap);
    if (option == PR_SET_PDEATHSIG)
        note_sent(getpid(), (int)a2);
    return p(option, a2, a3, a4, a5);
}

/* ---- signals received by a handler (ctl.received) ---------------------------------- */

static const int WATCHED[] = {SIGTERM, SIGINT, SIGHUP};
#define N_WATCHED 3
static struct sigaction g_user[N_WATCHED];  /* the program's own handler, behind ours */

static int watched(int sig) {
    for (int i = 0; i < N_WATCHED; i++)
        if (WATCHED[i] == sig) return i;
    return -1;
}

static void trampoline(int sig, siginfo_t *si, void *uc) {
    int i = watched(sig), e = errno;
    struct llft_ctl *c = __atomic_load_n(&g_ctl, __ATOMIC_ACQUIRE);
    if (c && si && (si->si_code == SI_USER || si->si_code == SI_QUEUE))
        llft_note(&c->received_count, c->received, (int32_t)getpid(), sig);
    errno = e;
    if (i < 0) return;
    struct sigaction u = g_user[i];
    if (u.sa_flags & SA_SIGINFO) u.sa_sigaction(sig, si, uc);
    else if (u.sa_handler != SIG_DFL && u.sa_handler != SIG_IGN) u.sa_handler(sig);
}

static int is_function(const struct sigaction *a) {
    return (a->sa_flags & SA_SIGINFO) ? a->sa_sigaction != NULL
                                      : a->sa_handler != SIG_DFL && a->sa_handler != SIG_IGN;
}

EXPORT int sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
    static int (*real_sa)(int, const struct sigaction *, struct sigaction *);
    if (!real_sa)
        real_sa = (int (*)(int, const struct sigaction *, struct sigaction *))real("sigaction");
    int i = watched(sig);
    if (i < 0) return real_sa(sig, act, old);
    struct sigaction mine, before = g_user[i];
    const struct sigaction *use = act;
    if (act && is_function(act) && ctl()) {     /* (no block: nothing to note into) */
        mine = *act;
        mine.sa_flags |= SA_SIGINFO;
        mine.sa_sigaction = trampoline;
        g_user[i] = *act;                       /* before the kernel may call it */
        use = &mine;
    }
    int r = real_sa(sig, use, old);
    if (r != 0) {
        g_user[i] = before;
        return r;
    }
    if (old && (old->sa_flags & SA_SIGINFO) && old->sa_sigaction == trampoline)
        *old = before;                          /* the program's own, as it gave it */
    return r;
}

/* glibc's signal() installs through its internal sigaction, past the hook above */
EXPORT sighandler_t signal(int sig, sighandler_t handler) {
    static sighandler_t (*real_signal)(int, sighandler_t);
    if (!real_signal) real_signal = (sighandler_t (*)(int, sighandler_t))real("signal");
    if (watched(sig) < 0) return real_signal(sig, handler);
    struct sigaction act, old;                  /* BSD semantics, as glibc's signal() */
    memset(&act, 0, sizeof act);
    act.sa_handler = handler;
    sigemptyset(&act.sa_mask);
    sigaddset(&act.sa_mask, sig);
    act.sa_flags = SA_RESTART;
    if (sigaction(sig, &act, &old) < 0) return SIG_ERR;
    return (old.sa_flags & SA_SIGINFO) ? (sighandler_t)(void *)old.sa_sigaction : old.sa_handler;
}
