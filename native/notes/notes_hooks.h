/* notes_hooks.h -- hooks the shim (the app, native/shim_process.c) and libllft_notes.so
 * (the programs it runs, native/notes/llft_notes.c) share: included by one .c file of
 * each, which defines before it
 *   NOTES_REAL(name)           the real libc function `name`, typed as its prototype;
 *   static int notes_kill(pid_t, int)   its kill hook (the note, then the signal);
 *   static void notes_sent(pid_t target, int sig)   the note alone (ctl.sent);
 *   static pid_t notes_waitpid(pid_t, int *, int)   a waitpid that notes the reap.
 *
 * 1. Every exec gives the program the notes library and the block's path. The hooks add
 *    `LD_PRELOAD=<libllft_notes.so>[:the user's]` and `LLFT_NOTES=<block>` to the
 *    environment the exec is given, never to the caller's own (the app's os.environ stays
 *    what it is at every replica; a program that passes a clean environment to its child,
 *    `env -i`, passes them on anyway). They run between fork -- or vfork, sharing the
 *    caller's memory -- and exec: the new environment is built on the stack. glibc's
 *    execl, execle, execlp and system() call its execve and posix_spawn internally, past
 *    any interposer, so they are hooked too (system() is rebuilt on the posix_spawn hook).
 * 2. Every way a process signals another through libc is noted before the signal: kill
 *    and killpg (the includer's), sigqueue, tgkill, pidfd_send_signal, and syscall() with
 *    the numbers of those (CPython's signal.pidfd_send_signal, a program's raw tkill). A
 *    thread's id is noted as its process's, a pidfd as the pid it refers to.
 * Not covered: static binaries and a raw `syscall` instruction (Go programs), which
 * no preload sees. */
#ifndef LLFT_NOTES_HOOKS_H
#define LLFT_NOTES_HOOKS_H

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define NOTES_ENV_MAX 4096                  /* entries; a larger environment is passed as is */
#define NOTES_PRELOAD_CAP 8192
static char g_notes_lib[PATH_MAX];          /* "" until notes_exec_setup found the library */
static char g_notes_var[PATH_MAX + 16];     /* "LLFT_NOTES=<the block's path>" */

/* The library beside `self_file` (the shim's or its own file) and the block at
 * `shm_path`: from now on every exec passes them on. */
static void notes_exec_setup(const char *self_file, const char *shm_path) {
    const char *slash = strrchr(self_file, '/');
    size_t dir = slash ? (size_t)(slash - self_file) + 1 : 0;
    if (!shm_path || dir + sizeof "libllft_notes.so" > sizeof g_notes_lib ||
        strlen(shm_path) + sizeof "LLFT_NOTES=" > sizeof g_notes_var)
        return;
    char lib[PATH_MAX];
    memcpy(lib, self_file, dir);
    strcpy(lib + dir, "libllft_notes.so");
    if (access(lib, R_OK) != 0) return;     /* not built: descendants go unnoted */
    snprintf(g_notes_var, sizeof g_notes_var, "LLFT_NOTES=%s", shm_path);
    strcpy(g_notes_lib, lib);
}

/* `envp` with LLFT_NOTES and libllft_notes.so first in LD_PRELOAD (the shim's and an
 * older notes library taken out) into `out` (count(envp) + 3 slots); 0: unchanged. */
static int notes_env(char *const envp[], char **out, char *preload) {
    size_t n = 0, k = 0;
    const char *user = "";
    for (; envp && envp[n]; n++) {
        if (!strncmp(envp[n], "LD_PRELOAD=", 11)) user = envp[n] + 11;
        else if (strncmp(envp[n], "LLFT_NOTES=", 11)) out[k++] = envp[n];
    }
    size_t len = (size_t)snprintf(preload, NOTES_PRELOAD_CAP, "LD_PRELOAD=%s", g_notes_lib);
    for (const char *p = user; *p;) {
        const char *e = p + strcspn(p, ": ");
        size_t w = (size_t)(e - p);
        if (w && !memmem(p, w, "libllft_", 8)) {
            if (len + w + 2 > NOTES_PRELOAD_CAP) return 0;
            preload[len++] = ':';
            memcpy(preload + len, p, w);
            len += w;
        }
        p = *e ? e + 1 : e;
    }
    preload[len] = 0;
    out[k++] = preload;
    out[k++] = g_notes_var;
    out[k] = NULL;
    return 1;
}

static size_t notes_env_len(char *const envp[]) {
    size_t n = 0;
    while (envp && envp[n] && n <= NOTES_ENV_MAX) n++;
    return n;
}

/* Each exec: `env` is envp with the notes, or envp itself. */
#define WITH_NOTES(envp, call) do { \
        size_t n_ = g_notes_lib[0] ? notes_env_len(envp) : NOTES_ENV_MAX + 1; \
        char *env_[n_ <= NOTES_ENV_MAX ? n_ + 3 : 1]; \
        char preload_[n_ <= NOTES_ENV_MAX ? NOTES_PRELOAD_CAP : 1]; \
        char *const *env = envp; \
        if (n_ <= NOTES_ENV_MAX && notes_env(envp, env_, preload_)) env = env_; \
        return call; \
    } while (0)

static int notes_execve(const char *path, char *const argv[], char *const envp[]) {
    WITH_NOTES(envp, NOTES_REAL(execve)(path, argv, env));
}
static int notes_execvpe(const char *file, char *const argv[], char *const envp[]) {
    WITH_NOTES(envp, NOTES_REAL(execvpe)(file, argv, env));
}
static int notes_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
                       const posix_spawnattr_t *attr, char *const argv[], char *const envp[]) {
    WITH_NOTES(envp, NOTES_REAL(posix_spawn)(pid, path, fa, attr, argv, env));
}

EXPORT int execve(const char *path, char *const argv[], char *const envp[]) {
    return notes_execve(path, argv, envp);
}
EXPORT int execv(const char *path, char *const argv[]) {
    return notes_execve(path, argv, environ);
}
EXPORT int execvpe(const char *file, char *const argv[], char *const envp[]) {
    return notes_execvpe(file, argv, envp);
}
EXPORT int execvp(const char *file, char *const argv[]) {
    return notes_execvpe(file, argv, environ);
}
EXPORT int fexecve(int fd, char *const argv[], char *const envp[]) {
    WITH_NOTES(envp, NOTES_REAL(fexecve)(fd, argv, env));
}
EXPORT int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
                       const posix_spawnattr_t *attr, char *const argv[], char *const envp[]) {
    return notes_spawn(pid, path, fa, attr, argv, envp);
}
EXPORT int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa,
                        const posix_spawnattr_t *attr, char *const argv[], char *const envp[]) {
    WITH_NOTES(envp, NOTES_REAL(posix_spawnp)(pid, file, fa, attr, argv, env));
}

/* execl, execlp, execle: the list, ending with a NULL (execle's environment after it),
 * into an argv on the stack. */
#define NOTES_ARGV(first, argv, after) \
    size_t n_ = 0; \
    va_list ap_; \
    va_start(ap_, first); \
    for (const char *a_ = first; a_; a_ = va_arg(ap_, const char *)) n_++; \
    va_end(ap_); \
    char *argv[n_ + 1]; \
    va_start(ap_, first); \
    argv[0] = (char *)first; \
    for (size_t i_ = 1; i_ <= n_; i_++) argv[i_] = i_ < n_ ? va_arg(ap_, char *) : NULL; \
    if (n_ == 0) argv[0] = NULL; \
    after; \
    va_end(ap_)

EXPORT int execl(const char *path, const char *arg, ...) {
    NOTES_ARGV(arg, argv, (void)0);
    return notes_execve(path, argv, environ);
}
EXPORT int execlp(const char *file, const char *arg, ...) {
    NOTES_ARGV(arg, argv, (void)0);
    return notes_execvpe(file, argv, environ);
}
EXPORT int execle(const char *path, const char *arg, ...) {
    char *const *envp;
    NOTES_ARGV(arg, argv, (void)(n_ ? va_arg(ap_, char *) : NULL);
               envp = va_arg(ap_, char *const *));
    return notes_execve(path, argv, envp);
}

/* system(): glibc's, on the posix_spawn hook. The caller ignores SIGINT and SIGQUIT and
 * blocks SIGCHLD while the shell runs; the shell starts with their defaults and the
 * caller's mask. (glibc also counts concurrent calls to restore the dispositions once;
 * here each call restores what it found.) */
EXPORT int system(const char *cmd) {
    if (cmd == NULL)
        return access("/bin/sh", X_OK) == 0;
    struct sigaction ign, old_int, old_quit;
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGINT, &ign, &old_int);
    sigaction(SIGQUIT, &ign, &old_quit);
    sigset_t chld, old_mask, defaults;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, &old_mask);
    sigemptyset(&defaults);
    if (old_int.sa_handler != SIG_IGN) sigaddset(&defaults, SIGINT);
    if (old_quit.sa_handler != SIG_IGN) sigaddset(&defaults, SIGQUIT);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setsigmask(&attr, &old_mask);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
    char *argv[] = {(char *)"sh", (char *)"-c", (char *)cmd, NULL};
    pid_t pid;
    int status, e = notes_spawn(&pid, "/bin/sh", NULL, &attr, argv, environ);
    posix_spawnattr_destroy(&attr);
    if (e == 0) {
        while (notes_waitpid(pid, &status, 0) < 0) {
            if (errno != EINTR) { status = -1; break; }
        }
    } else {
        status = 127 << 8;                  /* the shell could not run, as glibc says */
    }
    int keep = errno;
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGQUIT, &old_quit, NULL);
    sigprocmask(SIG_SETMASK, &old_mask, NULL);
    errno = keep;
    return status;
}

/* ---- the other ways to send a signal ----------------------------------------------- */

/* The number after `key` in a small /proc file; `fallback` if none. */
static long notes_proc_field(const char *path, const char *key, long fallback) {
    int fd = NOTES_REAL(open)(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fallback;
    char buf[1024];
    ssize_t r = NOTES_REAL(read)(fd, buf, sizeof buf - 1);
    NOTES_REAL(close)(fd);
    if (r <= 0) return fallback;
    buf[r] = 0;
    for (char *p = buf; (p = strstr(p, key)) != NULL; p++) {
        if (p == buf || p[-1] == '\n')
            return strtol(p + strlen(key), NULL, 10);
    }
    return fallback;
}
/* The process of thread `tid` (the agent watches processes). */
static pid_t notes_tgid(pid_t tid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/status", (int)tid);
    return (pid_t)notes_proc_field(path, "Tgid:", tid);
}
/* The process a pidfd of this process refers to; 0: none (not a pidfd, or its process
 * is gone -- fdinfo says -1 -- and the signal will not be sent). */
static pid_t notes_pidfd_pid(int pidfd) {
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fdinfo/%d", pidfd);
    long p = notes_proc_field(path, "Pid:", 0);
    return p > 0 ? (pid_t)p : 0;
}
static void notes_sent_pidfd(int pidfd, int sig) {
    pid_t p = sig > 0 ? notes_pidfd_pid(pidfd) : 0;
    if (p > 0) notes_sent(p, sig);
}

EXPORT int sigqueue(pid_t pid, int sig, const union sigval value) {
    notes_sent(pid == 0 ? -getpgrp() : pid, sig);
    return NOTES_REAL(sigqueue)(pid, sig, value);
}
/* (glibc's wrappers of the two, 2.30 and 2.36: the system call itself, as they do) */
EXPORT int tgkill(pid_t tgid, pid_t tid, int sig) {
    notes_sent(tgid, sig);
    return (int)NOTES_REAL(syscall)(SYS_tgkill, tgid, tid, sig);
}
EXPORT int pidfd_send_signal(int pidfd, int sig, siginfo_t *info, unsigned int flags) {
    notes_sent_pidfd(pidfd, sig);
    return (int)NOTES_REAL(syscall)(SYS_pidfd_send_signal, pidfd, sig, info, flags);
}

EXPORT long syscall(long nr, ...) {
    va_list ap;
    va_start(ap, nr);
    long a1 = va_arg(ap, long), a2 = va_arg(ap, long), a3 = va_arg(ap, long);
    long a4 = va_arg(ap, long), a5 = va_arg(ap, long), a6 = va_arg(ap, long);
    va_end(ap);
    switch (nr) {
    case SYS_kill:
        return notes_kill((pid_t)a1, (int)a2);
    case SYS_tkill:
        if ((int)a2 > 0) notes_sent(notes_tgid((pid_t)a1), (int)a2);
        break;
    case SYS_tgkill:
        notes_sent((pid_t)a1, (int)a3);
        break;
    case SYS_rt_sigqueueinfo:
        notes_sent((pid_t)a1 == 0 ? -getpgrp() : (pid_t)a1, (int)a2);
        break;
    case SYS_rt_tgsigqueueinfo:
        notes_sent((pid_t)a1, (int)a3);
        break;
    case SYS_pidfd_send_signal:
        notes_sent_pidfd((int)a1, (int)a2);
        break;
    }
    return NOTES_REAL(syscall)(nr, a1, a2, a3, a4, a5, a6);
}

#endif
