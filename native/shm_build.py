"""cffi builder for native._llft_shm: the Python side of native/llft_shm.h.

The agent (and `llft record`/`llft replay`) never touches the rings byte by byte from
Python: the few loops that do (drain the primary ring, feed the per-thread backup
rings) are C functions here, compiled from the same inline code the shim uses. cffi
releases the GIL around each call, so a drainer or feeder thread that waits on a
futex does not stop the agent's other threads.

The declarations cffi sees are not written here: they are the header's cdef region
(between its "cdef begin" and "cdef end" lines: the record, the bounds, the call, op
class, socket kind, mode, stat and ctl-word enums), plus the prototypes of the
functions defined below. So `lib.LLFT_C_RECV`, `ffi.sizeof("struct llft_rec")` and
`ffi.typeof("enum llft_call")` come from the one definition the shim compiles.
"""
import os
import re

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
HEADER = os.path.join(HERE, "llft_shm.h")


def header_cdef(path: str = HEADER) -> str:
    """The part of the header between its "cdef begin" and "cdef end" lines."""
    text = open(path).read()
    m = re.search(r"^(/\* ==== cdef begin .*)^/\* ==== cdef end", text, re.S | re.M)
    if not m:
        raise RuntimeError(f"{path}: no cdef begin/end region")
    return m.group(1)


FUNCTIONS = """
    size_t llft_shm_size(void);
    void llft_shm_init(void *base, uint32_t mode, uint32_t stall_ms);
    int64_t llft_drain(void *base, uint8_t *out, size_t cap, int timeout_ms);
    uint64_t llft_out_reserved(void *base);
    uint64_t llft_out_drained(void *base);
    uint64_t llft_out_reserve(void *base, uint32_t dlen);
    void llft_out_commit(void *base, uint64_t pos, uint32_t dlen);
    int llft_wait(void *base, int timeout_ms, uint32_t seen_commit_req);
    uint64_t llft_div_offset(void *base);
    void *llft_seqtab_new(void);
    void llft_seqtab_free(void *t);
    uint64_t llft_seqtab_fed(void *t);
    int64_t llft_feed(void *base, const uint8_t *buf, size_t len, void *seqtab, int timeout_ms);
    void llft_feed_done(void *base);
    int64_t llft_oi_walk(const uint8_t *buf, size_t len, size_t start, uint64_t max_entries,
                         uint64_t max_bytes, uint64_t *end);
    uint32_t llft_get(void *base, int what);
    int llft_proc_notes(void *base, int which, uint32_t since, int32_t *out, uint32_t *count);
    int llft_group_name(void *base, char *buf, size_t n);
    int llft_conn_reset_mark(void *base, uint32_t by, uint32_t conn);
    int llft_conn_reset_take(void *base, uint32_t by, uint32_t conn);
    void llft_set_mode(void *base, uint32_t mode);
    void llft_set_hold(void *base, uint32_t on);
    void llft_set_commit(void *base, uint32_t on);
    void llft_commit_done(void *base, uint32_t ticket);
    uint64_t llft_stat(void *base, int i);
    const char *llft_report(void *base);
    void *llft_dw_start(void *base, int efd, int coalesce_us, int wait_ms);
    void llft_dw_drained(void *w);
    uint32_t llft_dw_take(void *w);
    void llft_dw_stop(void *w);
    void llft_dw_join(void *w);
    const char *llft_call_name(unsigned c);
    void llft_op_name(uint64_t op, char *buf, size_t n);
"""

SOURCE = r"""
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include "llft_shm.h"

size_t llft_shm_size(void) { return sizeof(struct llft_shm); }

void llft_shm_init(void *base, uint32_t mode, uint32_t stall_ms) {
    struct llft_shm *s = base;
    memset(&s->ctl, 0, sizeof s->ctl);
    s->ctl.version = LLFT_SHM_VERSION;
    s->ctl.mode = mode;
    s->ctl.stall_ms = stall_ms;
    s->ctl.agent_pid = (uint32_t)getpid();
    __atomic_store_n(&s->ctl.magic, LLFT_SHM_MAGIC, __ATOMIC_RELEASE);
}

/* Copy whole committed records from the primary ring into out; waits up to
 * timeout_ms for the first one. Returns bytes copied. */
int64_t llft_drain(void *base, uint8_t *out, size_t cap, int timeout_ms) {
    struct llft_shm *s = base;
    struct llft_ring *r = &s->out;
    size_t n = 0;
    for (int waited = 0;;) {
        uint32_t seq = __atomic_load_n(&r->pub_seq, __ATOMIC_ACQUIRE);
        uint32_t len = llft_ring_peek(r, s->out_data, LLFT_OUT_CAP_BYTES);
        if (!len) {
            if (n || waited || timeout_ms == 0) break;
            /* Poll a little before sleeping on the futex: while the app is busy it then
             * never sees a waiter, so its appends cost no wake-up system call. */
            int polls = 0;
            while (polls < 10 && !llft_ring_peek(r, s->out_data, LLFT_OUT_CAP_BYTES)) {
                struct timespec ts = {0, 100000};
                nanosleep(&ts, NULL);
                polls++;
            }
            if (polls < 10) continue;
            llft_ring_wait_pub(r, seq, timeout_ms);
            waited = 1;
            continue;
        }
        if (n + len > cap) break;
        llft_ring_copy_out(s->out_data, LLFT_OUT_CAP_BYTES, r->tail, out + n, len);
        llft_ring_pop(r, s->out_data, LLFT_OUT_CAP_BYTES, len);
        n += len;
    }
    return (int64_t)n;
}

/* The primary ring's producer and consumer positions. A producer reserves a record
 * (head), writes it, then commits it; a drain stops at the first record not committed,
 * so records other threads committed after it wait too. Output commit compares the two:
 * everything reserved before the app's output was read must be drained before that
 * output goes out (llft/runtime/application.py, `owe_drain`). */
uint64_t llft_out_reserved(void *base) {
    return __atomic_load_n(&((struct llft_shm *)base)->out.head, __ATOMIC_ACQUIRE);
}
uint64_t llft_out_drained(void *base) {
    return __atomic_load_n(&((struct llft_shm *)base)->out.tail, __ATOMIC_ACQUIRE);
}

/* The shim's append in its two steps (native/shim_core.c ring_append), for tests of the
 * drain and of output commit: reserve a record of `dlen` zero bytes of payload, commit
 * it later (at most 64 bytes). Returns the reserved position (the ring must have
 * room: tests only). */
uint64_t llft_out_reserve(void *base, uint32_t dlen) {
    struct llft_shm *s = base;
    if (dlen > 64) dlen = 64;
    return llft_ring_reserve(&s->out, llft_align8(LLFT_REC_HDR + dlen));
}
void llft_out_commit(void *base, uint64_t pos, uint32_t dlen) {
    struct llft_shm *s = base;
    struct llft_rec h;
    uint8_t zero[64] = {0};
    memset(&h, 0, sizeof h);
    if (dlen > sizeof zero) dlen = sizeof zero;
    llft_ring_commit(&s->out, s->out_data, LLFT_OUT_CAP_BYTES, pos, &h, zero, dlen);
}

/* 2 as soon as an output commit was asked for beyond `seen_commit_req` (ctl.commit_req),
 * else 1 as soon as the primary ring holds a committed record to drain, without taking it;
 * 0 after timeout_ms (0: just look). Safe without a lock next to a drainer: it only
 * reads the commit word at `tail` (the drainer may take the record meanwhile; then a
 * later drain simply returns less). llft_drain(base, buf, 0, t) waits the same way
 * but cannot tell "something there" from "timed out" (it returns 0 for both). */
int llft_wait(void *base, int timeout_ms, uint32_t seen_commit_req) {
    struct llft_shm *s = base;
    struct llft_ring *r = &s->out;
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    /* No polling with short sleeps: the waiter sleeps on the futex (one wake-up per
     * publish it waits for); the caller batches (the agent's drain thread stays off the
     * futex for a coalescing interval after each wake-up, so a busy app's appends then
     * cost no wake-up). */
    for (;;) {
        uint32_t seq = __atomic_load_n(&r->pub_seq, __ATOMIC_ACQUIRE);
        /* a commit first: answering it drains the ring too */
        if (__atomic_load_n(&s->ctl.commit_req, __ATOMIC_ACQUIRE) != seen_commit_req) return 2;
        if (llft_ring_peek(r, s->out_data, LLFT_OUT_CAP_BYTES)) return 1;
        if (timeout_ms <= 0) return 0;
        clock_gettime(CLOCK_MONOTONIC, &now);
        long left = timeout_ms - ((now.tv_sec - t0.tv_sec) * 1000L + (now.tv_nsec - t0.tv_nsec) / 1000000L);
        if (left <= 0) return 0;
        llft_ring_wait_pub(r, seq, (int)left);
    }
}

/* o -> number of records of o fed so far (the next record's oseq). */
#define SEQTAB_SIZE (1u << 20)
struct seqent { uint64_t key; uint64_t count; };
struct seqtab_hdr { uint64_t fed; uint64_t pad; };   /* entries fed so far, then the table */
void *llft_seqtab_new(void) { return calloc(SEQTAB_SIZE + 1, sizeof(struct seqent)); }
void llft_seqtab_free(void *t) { free(t); }
uint64_t llft_seqtab_fed(void *t) { return ((struct seqtab_hdr *)t)->fed; }
static struct seqent *seq_get(struct seqent *t, uint64_t key) {
    t += 1;   /* skip the header */
    uint64_t x = key;
    x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33;
    for (uint32_t i = 0; i < SEQTAB_SIZE; i++) {
        struct seqent *e = &t[(x + i) & (SEQTAB_SIZE - 1)];
        if (e->key == key) return e;
        if (e->key == 0) { e->key = key; return e; }
    }
    return NULL;
}

/* Push records (global order) into the per-thread rings, stamping oseq. Returns bytes
 * consumed (whole records), -1 on a malformed record, -2 if the op table is full. */
int64_t llft_feed(void *base, const uint8_t *buf, size_t len, void *seqtab, int timeout_ms) {
    struct llft_shm *s = base;
    size_t off = 0;
    while (off + LLFT_REC_HDR <= len) {
        struct llft_rec h;
        memcpy(&h, buf + off, LLFT_REC_HDR);
        if (h.len < LLFT_REC_HDR || (h.len & 7) || h.tid >= LLFT_MAX_THREADS
            || h.dlen > h.len - LLFT_REC_HDR || h.len > LLFT_TRING_CAP_BYTES) return -1;
        if (off + h.len > len) break;
        struct llft_ring *r = &s->tring[h.tid];
        uint64_t pos = __atomic_load_n(&r->head, __ATOMIC_ACQUIRE);
        if (!llft_ring_wait_space(r, LLFT_TRING_CAP_BYTES, pos, h.len, 0)) {
            /* the thread is behind. timeout 0: feed no further now (the caller, the
             * agent's loop, hands the rest to its feeder thread). Otherwise poll a
             * little first, so that its pops cost no wake-up system call while it
             * catches up, then sleep on the futex */
            if (timeout_ms == 0) break;
            int polls = 0;
            while (polls < 10 && !llft_ring_wait_space(r, LLFT_TRING_CAP_BYTES, pos, h.len, 0)) {
                struct timespec ts = {0, 100000};
                nanosleep(&ts, NULL);
                polls++;
            }
            if (polls == 10 && !llft_ring_wait_space(r, LLFT_TRING_CAP_BYTES, pos, h.len, timeout_ms))
                break;
        }
        struct seqent *e = seq_get((struct seqent *)seqtab, h.op);
        if (!e) return -2;
        h.oseq = e->count++;
        /* A sleep at the primary let the other threads run: a backup thread ends its
         * sleep only when as many entries have completed as preceded the sleep's
         * return in the primary's order (see shim_time.c, sleep_barrier). */
        if (h.call == LLFT_C_CLOCK_NANOSLEEP || h.call == LLFT_C_NANOSLEEP
            || ((h.call == LLFT_C_POLL || h.call == LLFT_C_SELECT || h.call == LLFT_C_EPOLL_WAIT)
                && h.ret == 0))
            h.aux = (uint32_t)((struct seqtab_hdr *)seqtab)->fed;
        ((struct seqtab_hdr *)seqtab)->fed++;
        uint32_t rec_len = h.len;   /* commit rewrites h.len (the commit word goes last) */
        llft_ring_reserve(r, rec_len);
        llft_ring_commit(r, s->tring_data[h.tid], LLFT_TRING_CAP_BYTES, pos, &h,
                         buf + off + LLFT_REC_HDR, h.dlen);
        off += rec_len;
    }
    return (int64_t)off;
}

/* The entry framing of determinizer/orderinfo.py's `_spans` (its reference), for the
 * hot callers: whole entries from buf[start], while fewer than max_entries and, past
 * the first, ending within max_bytes of start. Returns how many and sets *end to the
 * byte after the last (relative to start); -1 on an entry length below the header or
 * not a multiple of 8, with *end at that entry (relative to start). */
int64_t llft_oi_walk(const uint8_t *buf, size_t len, size_t start, uint64_t max_entries,
                     uint64_t max_bytes, uint64_t *end) {
    size_t off = 0;
    int64_t count = 0;
    if (start > len) start = len;
    buf += start;
    len -= start;
    while (len - off >= LLFT_REC_HDR && (uint64_t)count < max_entries) {
        uint32_t n;
        memcpy(&n, buf + off, sizeof n);        /* little-endian hosts only, as the rings */
        if (n < LLFT_REC_HDR || (n & 7)) { *end = off; return -1; }
        if (n > len - off) break;
        if (count > 0 && off + n > max_bytes) break;
        off += n;
        count++;
    }
    *end = off;
    return count;
}

void llft_feed_done(void *base) {
    struct llft_shm *s = base;
    __atomic_store_n(&s->ctl.feed_done, 1, __ATOMIC_RELEASE);
    for (uint32_t t = 0; t < LLFT_MAX_THREADS; t++)
        if (__atomic_load_n(&s->tring[t].pub_waiters, __ATOMIC_ACQUIRE)) {
            __atomic_fetch_add(&s->tring[t].pub_seq, 1, __ATOMIC_ACQ_REL);
            llft_futex_wake_all(&s->tring[t].pub_seq, 1);
        }
}

/* One ctl word (enum llft_ctl_word), read with acquire semantics. */
uint32_t llft_get(void *base, int what) {
    struct llft_ctl *c = &((struct llft_shm *)base)->ctl;
    switch (what) {
    case LLFT_CTL_MODE: return __atomic_load_n(&c->mode, __ATOMIC_ACQUIRE);
    case LLFT_CTL_ACTIVE_PID: return __atomic_load_n(&c->active_pid, __ATOMIC_ACQUIRE);
    case LLFT_CTL_FEED_DONE: return __atomic_load_n(&c->feed_done, __ATOMIC_ACQUIRE);
    case LLFT_CTL_DIVERGED: return __atomic_load_n(&c->diverged, __ATOMIC_ACQUIRE);
    case LLFT_CTL_NEXT_TID: return __atomic_load_n(&c->next_tid, __ATOMIC_ACQUIRE);
    case LLFT_CTL_PROGRESS: return __atomic_load_n(&c->progress, __ATOMIC_ACQUIRE);
    case LLFT_CTL_GROUP_ID: return __atomic_load_n(&c->group_id, __ATOMIC_ACQUIRE);
    case LLFT_CTL_DIV_SET: return __atomic_load_n(&c->div_set, __ATOMIC_ACQUIRE);
    case LLFT_CTL_DIV_CONN: return __atomic_load_n(&c->div_conn, __ATOMIC_ACQUIRE);
    case LLFT_CTL_HOLD: return __atomic_load_n(&c->hold, __ATOMIC_ACQUIRE);
    case LLFT_CTL_COMMIT_REQ: return __atomic_load_n(&c->commit_req, __ATOMIC_ACQUIRE);
    case LLFT_CTL_COMMIT_DONE: return __atomic_load_n(&c->commit_done, __ATOMIC_ACQUIRE);
    case LLFT_CTL_CHILD_NEWS: return __atomic_load_n(&c->ends_count, __ATOMIC_ACQUIRE)
                                     + __atomic_load_n(&c->reaped_count, __ATOMIC_ACQUIRE)
                                     + __atomic_load_n(&c->received_count, __ATOMIC_ACQUIRE);
    }
    return 0;
}
/* The notes of ring `which` (0: ctl.sent, 1: ctl.reaped, 2: ctl.received) numbered
 * `since` and after that the ring still keeps (the latest LLFT_NOTE_SLOTS), oldest first,
 * as (pid, value) pairs into out[2 * LLFT_NOTE_SLOTS]; returns how many, and in *count
 * how many were ever written (the last one's number + 1). (since >= *count: none, the
 * count alone.) */
int llft_proc_notes(void *base, int which, uint32_t since, int32_t *out, uint32_t *count) {
    struct llft_ctl *c = &((struct llft_shm *)base)->ctl;
    uint32_t *counts[] = {&c->sent_count, &c->reaped_count, &c->received_count};
    struct llft_proc_note *rings[] = {c->sent, c->reaped, c->received};
    if (which < 0 || which > 2) return 0;
    uint32_t n = __atomic_load_n(counts[which], __ATOMIC_ACQUIRE);
    struct llft_proc_note *ring = rings[which];
    uint32_t first = n > LLFT_NOTE_SLOTS ? n - LLFT_NOTE_SLOTS : 0;
    if (since > first) first = since < n ? since : n;
    int k = (int)(n - first);
    for (int i = 0; i < k; i++) {
        struct llft_proc_note *slot = &ring[(first + (uint32_t)i) % LLFT_NOTE_SLOTS];
        out[2 * i + 1] = __atomic_load_n(&slot->value, __ATOMIC_ACQUIRE);
        out[2 * i] = __atomic_load_n(&slot->pid, __ATOMIC_RELAXED);
    }
    *count = n;
    return k;
}
/* The group listener's abstract UNIX name without its leading NUL (LLFT_GROUP_NAME), or 0
 * bytes before the app's listen(). */
int llft_group_name(void *base, char *buf, size_t n) {
    struct llft_ctl *c = &((struct llft_shm *)base)->ctl;
    uint32_t id = __atomic_load_n(&c->group_id, __ATOMIC_ACQUIRE);
    if (!id) return 0;
    int k = snprintf(buf, n, LLFT_GROUP_NAME, __atomic_load_n(&c->active_pid, __ATOMIC_ACQUIRE), id);
    return k < 0 || (size_t)k >= n ? 0 : k;
}
int llft_conn_reset_mark(void *base, uint32_t by, uint32_t conn) {
    return llft_reset_mark(&((struct llft_shm *)base)->ctl, by, conn);
}
int llft_conn_reset_take(void *base, uint32_t by, uint32_t conn) {
    return llft_reset_take(&((struct llft_shm *)base)->ctl, by, conn);
}
uint64_t llft_div_offset(void *base) {
    return __atomic_load_n(&((struct llft_shm *)base)->ctl.div_offset, __ATOMIC_ACQUIRE);
}
void llft_set_mode(void *base, uint32_t mode) {
    struct llft_shm *s = base;
    __atomic_store_n(&s->ctl.mode, mode, __ATOMIC_RELEASE);
    for (uint32_t t = 0; t < LLFT_MAX_THREADS; t++)
        if (__atomic_load_n(&s->tring[t].pub_waiters, __ATOMIC_ACQUIRE)) {
            __atomic_fetch_add(&s->tring[t].pub_seq, 1, __ATOMIC_ACQ_REL);
            llft_futex_wake_all(&s->tring[t].pub_seq, 1);
        }
}
void llft_set_hold(void *base, uint32_t on) {
    struct llft_ctl *c = &((struct llft_shm *)base)->ctl;
    __atomic_store_n(&c->hold, on ? 1u : 0u, __ATOMIC_RELEASE);
    if (!on) llft_futex_wake_all(&c->hold, 1);
}
/* Output commit of external sends (ctl.commit_*): on/off, and "every entry appended
 * before `ticket` is held by the backups" (wakes the senders waiting for it). Off also
 * lets every waiter go (the agent stops, or no longer runs this app as a primary). */
void llft_set_commit(void *base, uint32_t on) {
    struct llft_ctl *c = &((struct llft_shm *)base)->ctl;
    __atomic_store_n(&c->commit_on, on ? 1u : 0u, __ATOMIC_RELEASE);
    if (!on) llft_futex_wake_all(&c->commit_done, 1);
}
void llft_commit_done(void *base, uint32_t ticket) {
    struct llft_ctl *c = &((struct llft_shm *)base)->ctl;
    __atomic_store_n(&c->commit_done, ticket, __ATOMIC_RELEASE);
    llft_futex_wake_all(&c->commit_done, 1);
}
uint64_t llft_stat(void *base, int i) {
    return __atomic_load_n(&((struct llft_shm *)base)->ctl.stats[i & 7], __ATOMIC_RELAXED);
}
const char *llft_report(void *base) { return ((struct llft_shm *)base)->ctl.report; }

/* The drain watcher (a primary's): a native thread that tells the agent's loop, through
 * an eventfd, when the primary ring holds entries the loop has not drained for
 * `coalesce_us` (DW_ORDER_INFO), or an output commit of an external send is asked for
 * (DW_COMMIT). The loop drains before every output anyway, so under load the entries
 * leave with the replies and the watcher only looks; it does so without the GIL (a
 * Python thread doing this woke every coalescing interval under load and took the GIL
 * from the loop each time). The loop counts its drains (llft_dw_drained) and takes the
 * flags (llft_dw_take) when the eventfd is readable. One request at a time: after it
 * asked, the watcher waits (bounded by wait_ms) until the loop drained. */
#define DW_ORDER_INFO 1u
#define DW_COMMIT 2u
struct llft_dw {
    void *base;
    int efd, coalesce_us, wait_ms;
    uint32_t stop, flags;
    uint64_t drains;
    pthread_t th;
};
static void dw_signal(struct llft_dw *w, uint32_t flag) {
    __atomic_fetch_or(&w->flags, flag, __ATOMIC_ACQ_REL);
    uint64_t one = 1;
    ssize_t r = write(w->efd, &one, sizeof one);
    (void)r;   /* EAGAIN: the counter is already non-zero, the loop will look */
}
static int64_t dw_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}
/* Sleep `us`, or less if an output commit is asked for beyond `seen` meanwhile (the
 * shim's ext_commit wakes the commit_req futex; appends do not, so coalescing still
 * costs no wake-up per append): 1 if one was. An external send's wait is the app's
 * latency: it must not sit out a coalescing interval (it did: ~1.5 ms of each 3 ms
 * external round trip at 2 replicas, `llft bench ndlatency --op-kinds external`). */
static int dw_nap(struct llft_dw *w, int us, uint32_t seen) {
    uint32_t *req = &((struct llft_shm *)w->base)->ctl.commit_req;
    int64_t until = dw_now_us() + us;
    for (;;) {
        if (__atomic_load_n(req, __ATOMIC_ACQUIRE) != seen) return 1;
        if (__atomic_load_n(&w->stop, __ATOMIC_ACQUIRE)) return 0;
        int64_t left = until - dw_now_us();
        if (left <= 0) return 0;
        struct timespec ts = {(time_t)(left / 1000000), (long)(left % 1000000) * 1000L};
        syscall(SYS_futex, req, FUTEX_WAIT, seen, &ts, NULL, 0);
    }
}
static void *dw_main(void *arg) {
    struct llft_dw *w = arg;
    struct llft_shm *s = w->base;
    uint32_t seen = 0;   /* commit tickets start at 0: one taken before we ran is news */
    while (!__atomic_load_n(&w->stop, __ATOMIC_ACQUIRE)) {
        int got = llft_wait(w->base, w->wait_ms, seen);
        if (got == 2) {
            seen = __atomic_load_n(&s->ctl.commit_req, __ATOMIC_ACQUIRE);
            dw_signal(w, DW_COMMIT);
        } else if (got == 1) {
            uint64_t d = __atomic_load_n(&w->drains, __ATOMIC_ACQUIRE);
            if (dw_nap(w, w->coalesce_us, seen))
                continue;                   /* a commit: signalled at once, above */
            if (__atomic_load_n(&w->drains, __ATOMIC_ACQUIRE) != d
                || __atomic_load_n(&w->stop, __ATOMIC_ACQUIRE) || !llft_wait(w->base, 0, seen))
                continue;
            dw_signal(w, DW_ORDER_INFO);
            int64_t until = dw_now_us() + (int64_t)w->wait_ms * 1000;
            while (__atomic_load_n(&w->drains, __ATOMIC_ACQUIRE) == d
                   && !__atomic_load_n(&w->stop, __ATOMIC_ACQUIRE) && dw_now_us() < until)
                if (dw_nap(w, w->coalesce_us, seen))
                    break;
        }
    }
    return NULL;
}
void *llft_dw_start(void *base, int efd, int coalesce_us, int wait_ms) {
    struct llft_dw *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->base = base; w->efd = efd; w->coalesce_us = coalesce_us; w->wait_ms = wait_ms;
    if (pthread_create(&w->th, NULL, dw_main, w) != 0) { free(w); return NULL; }
    return w;
}
void llft_dw_drained(void *w) {
    __atomic_fetch_add(&((struct llft_dw *)w)->drains, 1, __ATOMIC_RELEASE);
}
uint32_t llft_dw_take(void *w) {
    return __atomic_exchange_n(&((struct llft_dw *)w)->flags, 0u, __ATOMIC_ACQ_REL);
}
/* Ask the thread to end (it does within wait_ms); llft_dw_join waits for it and frees. */
void llft_dw_stop(void *w) {
    struct llft_dw *d = w;
    __atomic_store_n(&d->stop, 1u, __ATOMIC_RELEASE);
    llft_futex_wake_all(&((struct llft_shm *)d->base)->ctl.commit_req, 1);   /* dw_nap */
}
void llft_dw_join(void *w) {
    llft_dw_stop(w);
    pthread_join(((struct llft_dw *)w)->th, NULL);
    free(w);
}
"""

ffibuilder = FFI()
ffibuilder.cdef(header_cdef() + FUNCTIONS)
ffibuilder.set_source(
    "native._llft_shm",
    SOURCE,
    include_dirs=[HERE],
    extra_compile_args=["-O2", "-D_GNU_SOURCE", "-pthread"],
    extra_link_args=["-pthread"],
    depends=[HEADER],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
