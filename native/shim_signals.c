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
 * at the end of that thread's next ordered call: later than at the primary. Signals the
 * process sends itself are not recorded (the backup's code sends them again).
 * Fault signals (SEGV, BUS, ILL, FPE, ABRT, TRAP) are never wrapped.
 */
#include "shim_internal.h"
#include <signal.h>

#define NSIG_WRAP 65
static struct sigaction g_orig[NSIG_WRAP];   /* the application's handlers */
static int g_wrapped[NSIG_WRAP];
static TLS volatile int t_sig_pending;                 /* a handler ran in this thread */
static TLS volatile int t_sig_replaying;               /* the signal being raised is a replayed one */
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
    if (t_tid >= 0 && g_active && !t_sig_replaying && timer_signal(sig) && backup_now())
        return;   /* the primary's own occurrence is replayed */
    /* a signal this process sent itself (kill(getpid()), raise, pthread_kill) is sent
     * again by the same code at a backup: only the others are inputs */
    int self_sent = info && (info->si_code == SI_USER || info->si_code == SI_TKILL
                             || info->si_code == SI_QUEUE) && info->si_pid == g_pid;
    if (t_tid >= 0 && g_active && !self_sent) t_sig_pending = sig;
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
