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
 * started it ends, which is the application's doing). Nothing else is interposed; the
 * block is mapped at the first note, so a program that signals nobody pays nothing.
 * Not covered: static binaries, raw syscalls (pidfd_send_signal, tgkill).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "../llft_shm.h"

#define EXPORT __attribute__((visibility("default")))

static struct llft_ctl *g_ctl;          /* mapped at the first note; NULL: not yet */
static int g_unmappable;                /* no block (no LLFT_NOTES, gone, another version) */

static struct llft_ctl *ctl(void) {
    struct llft_ctl *c = __atomic_load_n(&g_ctl, __ATOMIC_ACQUIRE);
    if (c || __atomic_load_n(&g_unmappable, __ATOMIC_RELAXED))
        return c;
    const char *path = getenv("LLFT_NOTES");
    int fd = path ? open(path, O_RDWR | O_CLOEXEC) : -1;
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

EXPORT int sigqueue(pid_t pid, int sig, const union sigval value) {
    static int (*q)(pid_t, int, const union sigval);
    if (!q) q = (int (*)(pid_t, int, const union sigval))real("sigqueue");
    note_sent(pid == 0 ? -getpgrp() : pid, sig);
    return q(pid, sig, value);
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
