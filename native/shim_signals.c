/* shim_signals.c -- signals, as far as they meet ordered calls.
 *
 * A signal handler runs whenever the signal arrives: at a backup, a timer (signal.alarm,
 * setitimer) fires at another point of the program, and a blocking call the primary saw
 * interrupted (EINTR) is replayed as interrupted while no handler has run, so CPython
 * retries it where the primary raised the handler's exception (test_selectors'
 * select-interrupted tests).
 *
 * So the shim wraps every handler the application installs (sigaction) and notes, per
 * thread, that a signal's handler ran. The next record that thread appends carries the
 * signal number (flags bits 8-15, LLFT_SIGNAL_SHIFT); a backup raises that signal in the
 * same thread when it completes the record, i.e. before the replayed call returns, as it
 * had arrived during the call at the primary. At a backup, timer and child signals
 * (SIGALRM, SIGVTALRM, SIGPROF, SIGCHLD) that really arrive are dropped: their sources
 * exist there too, at other times; the primary's are replayed instead.
 * A signal that arrives while a thread runs Python code (no call in progress) is replayed
 * at the end of that thread's next ordered call: later than at the primary. (Rare for
 * signals between the process's own threads: the sender holds the GIL, so the target is
 * blocked in a call or waiting for the GIL, which is an ordered call too.)
 * A signal a thread sends ITSELF (raise, os.kill(os.getpid()) from the main thread,
 * pthread_kill(self)) arrives before the sending call returns, at the same point of the
 * program everywhere: it is not recorded, and a backup's code sends it again. A signal
 * one thread sends ANOTHER (test_socketserver's client thread interrupting the main
 * thread's blocking write with pthread_kill) arrives at a moment of the target's that
 * timing picks: it is recorded like an outside signal, and at a backup the live one is
 * dropped (its sender exists there too) and the primary's is replayed. The shim tells
 * the two apart by marking the thread that is inside kill/raise/pthread_kill.
 * Fault signals (SEGV, BUS, ILL, FPE, ABRT, TRAP) are never wrapped.
 */
#include "shim_internal.h"
#include <signal.h>

#define NSIG_WRAP 65
static struct sigaction g_orig[NSIG_WRAP];   /* the application's handlers */
static int g_wrapped[NSIG_WRAP];
static TLS volatile int t_sig_pending;                 /* a handler ran in this thread */
static TLS volatile int t_sig_replaying;               /* the signal being raised is a replayed one */
static TLS volatile int t_sig_sending;                 /* inside kill/raise/pthread_kill */
static int (*real_sigaction)(int, const struct sigaction *, struct sigaction *);

static int wrappable(int sig) {
    return sig > 0 && sig < NSIG_WRAP && sig != SIGSEGV && sig != SIGBUS && sig != SIGILL
           && sig != SIGFPE && sig != SIGABRT && sig != SIGTRAP && sig != SIGKILL && sig != SIGSTOP;
}
/* Signals whose source exists at a backup too, at another time: timers and children. */
static int timer_signal(int sig) {
    return sig == SIGALRM || sig == SIGVTALRM || sig == SIGPROF || sig == SIGCHLD;
}

static void sig_wrapper(int sig, siginfo_t *info, void *ctx) {
    int self_sent = info && (info->si_code == SI_USER || info->si_code == SI_TKILL
                             || info->si_code == SI_QUEUE) && info->si_pid == g_pid;
    /* sent by this very thread, inside its kill/raise: the same point at a backup */
    int own = self_sent && t_sig_sending;
    if (t_tid >= 0 && g_active && !t_sig_replaying && (timer_signal(sig) || (self_sent && !own))
        && backup_now())
        return;   /* its source exists here too, at another time: the primary's is replayed */
    if (t_tid >= 0 && g_active && !own) t_sig_pending = sig;
    const struct sigaction *o = &g_orig[sig];
    if (o->sa_flags & SA_SIGINFO) o->sa_sigaction(sig, info, ctx);
    else if (o->sa_handler != SIG_DFL && o->sa_handler != SIG_IGN) o->sa_handler(sig);
}

EXPORT int sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
    if (!real_sigaction)
        real_sigaction = (int (*)(int, const struct sigaction *, struct sigaction *))resolve("sigaction");
    if (!g_active || R(getpid)() != g_pid || !wrappable(sig)) return real_sigaction(sig, act, old);
    struct sigaction mine, prev;
    const struct sigaction *use = act;
    if (act && act->sa_handler != SIG_DFL && act->sa_handler != SIG_IGN) {
        mine = *act;
        mine.sa_sigaction = sig_wrapper;
        mine.sa_flags |= SA_SIGINFO;
        use = &mine;
    }
    int was = g_wrapped[sig];
    struct sigaction saved = g_orig[sig];
    if (act && use == &mine) { g_orig[sig] = *act; g_wrapped[sig] = 1; }
    int r = real_sigaction(sig, use, &prev);
    if (r != 0) { g_orig[sig] = saved; g_wrapped[sig] = was; return r; }
    if (act && use != &mine) g_wrapped[sig] = 0;
    if (old) *old = (was && prev.sa_sigaction == sig_wrapper) ? saved : prev;
    return r;
}

/* Primary: the signal to put in the record being appended (0 if none). */
int sig_take_pending(void) {
    int s = t_sig_pending;
    t_sig_pending = 0;
    return s;
}

/* Backup: the record just completed carried a signal: raise it here, now. */
void sig_replay(int sig) {
    if (g_debug) {
        char line[64];
        int k = snprintf(line, sizeof line, "llft[rep] t%d signal %d\n", t_tid, sig);
        R(write)(2, line, (size_t)k);
    }
    t_sig_replaying = 1;
    syscall(SYS_tgkill, R(getpid)(), (pid_t)syscall(SYS_gettid), sig);
    t_sig_replaying = 0;
    t_sig_pending = 0;
}

/* The calls that send signals: a signal the calling thread gets before they return is
 * its own (see the top). kill() of the group pid is in shim_process.c. */
void sig_sending(int on) { t_sig_sending = on; }
EXPORT int raise(int sig) {
    if (!g_active) return R(raise)(sig);
    t_sig_sending = 1;
    int r = R(raise)(sig);
    t_sig_sending = 0;
    return r;
}
EXPORT int pthread_kill(pthread_t th, int sig) {
    if (!g_active) return R(pthread_kill)(th, sig);
    t_sig_sending = 1;
    int r = R(pthread_kill)(th, sig);
    t_sig_sending = 0;
    return r;
}
