/* llft_pulse.h -- the agent's heartbeat thread (native._llft_pulse).
 *
 * Heartbeats are small UDP datagrams repeated every ~20 ms. Sending and receiving them
 * from the agent's asyncio loop woke Python ~113 times a second; this plain C thread
 * (no GIL) does the repetitive part instead:
 *
 *   send     repeats the agent's current heartbeat datagram(s), byte for byte, every
 *            `every_us` until `until_us` (llft_pulse_set);
 *   receive  drains a dedicated socket. A datagram byte-identical to one Python already
 *            authenticated from the same source (llft_pulse_accept) is ABSORBED: only
 *            its kernel arrival time is kept (llft_pulse_arrivals). Anything else is
 *            queued for Python (llft_pulse_take) and Python's eventfd is signalled when
 *            the queue goes from empty to non-empty.
 *
 * Python therefore sees each distinct heartbeat once, plus a cheap list of times at
 * which copies of it arrived again (the liveness evidence it needs).
 *
 * Two things let an idle loop sleep ~1 s at a time instead of waking to refresh and
 * to judge deadlines:
 *
 *   lease    until_us stops announcing a loop that hung for good; the lease stops it
 *            sooner, without the loop refreshing: with lease_us > 0 a copy goes out
 *            only while the loop set() or left its selector at most lease_us before,
 *            or sits blocked in its selector now (llft_pulse_park). The cadence goes
 *            on meanwhile, so a loop that recovers is announced again by itself;
 *   watches  the deadlines at which Python would suspect a silent peer
 *            (llft_pulse_watch), each moved by the copies absorbed from that peer
 *            since; the thread signals Python's eventfd only when one really passes.
 *
 * Addresses: a source is (ip_be << 16) | port, ip_be being sin_addr.s_addr read as a
 * native 32-bit integer (network byte order in memory) and port in host order. Times
 * are CLOCK_MONOTONIC microseconds (Python: time.monotonic_ns() // 1000).
 *
 * The cdef region below is also read by cffi (native/pulse_build.py), so the two sides
 * cannot drift apart.
 */
#ifndef LLFT_PULSE_H
#define LLFT_PULSE_H

#include <stddef.h>
#include <stdint.h>

/* ==== cdef begin ==================================================================== */
typedef struct llft_pulse llft_pulse;

/* Starts the thread. recv_fd: a bound UDP socket; send_fd: a UDP socket to send from;
 * event_fd: Python's eventfd, written (1) when the forward queue becomes non-empty
 * and when a watch fires.
 * Sets SO_TIMESTAMPNS on recv_fd. NULL on failure (errno). Never closes the fds. */
llft_pulse *llft_pulse_new(int recv_fd, int send_fd, int event_fd);
/* Stops and joins the thread, frees everything (not the fds). NULL is a no-op. */
void llft_pulse_free(llft_pulse *p);
/* Repeat n datagrams (concatenated in data, lengths in lens, n <= 8) to dst: sent once
 * now (before returning), then every every_us while CLOCK_MONOTONIC <= until_us.
 * The same datagrams still being repeated: only until_us moves (no copy now, the
 * cadence kept). n == 0 stops repeating. 0, or -1 on bad arguments.
 * lease_us > 0: a copy due at t is sent only if t <= (this call) + lease_us, or the
 * loop is parked now, or t <= (its last park(0)) + lease_us; otherwise it is skipped
 * (stats [8]) and the cadence goes on. Every call, a refresh too, renews the lease.
 * lease_us <= 0: no lease. */
int llft_pulse_set(llft_pulse *p, const uint8_t *data, const uint32_t *lens, int n,
                   uint32_t dst_ip_be, uint16_t dst_port, int64_t every_us, int64_t until_us,
                   int64_t lease_us);
/* The loop thread: 1 right before it blocks in its selector, 0 right after. No lock,
 * no system call (atomics and the vDSO clock): it is on every loop iteration. A new
 * pulse is not parked and left its selector at creation. */
void llft_pulse_park(llft_pulse *p, int parked);
/* Replaces the silence watches with n (n <= 16; 0 clears them). Watch i is due once
 * CLOCK_MONOTONIC >= deadline_us[i] + max(0, newest - heard_us[i]), newest being the
 * arrival time of the newest copy absorbed from src[i] (none: no move). When one is
 * due, the thread reads its socket (fresh evidence) and if one still is: clears the
 * watches, marks them fired (llft_pulse_watch_fired) and writes 1 to event_fd (stats
 * [9]). 0, or -1 on bad arguments (the watches unchanged). */
int llft_pulse_watch(llft_pulse *p, const uint64_t *src, const int64_t *heard_us,
                     const int64_t *deadline_us, int n);
/* 1 if a watch fired since the previous call (and forgets it), else 0. */
int llft_pulse_watch_fired(llft_pulse *p);
/* Next forwarded datagram into buf: its length, 0 if none, -1 if cap is too small (it
 * stays queued). *src: its source; *at_us: kernel arrival time (monotonic µs). */
int64_t llft_pulse_take(llft_pulse *p, uint8_t *buf, size_t cap, uint64_t *src, int64_t *at_us);
/* Reads the receive socket now, from the caller's thread, as the thread does at its
 * sends: what was waiting is absorbed or queued. A caller about to judge a peer's
 * silence calls it first (the thread reads only once an interval, and may itself be
 * kept from running on a busy machine while the evidence waits in the kernel). Returns
 * how many datagrams were read. */
int llft_pulse_poll(llft_pulse *p);
/* Byte-identical copies of data from src are absorbed from now on (the last 8 accepted
 * datagrams of each source). */
void llft_pulse_accept(llft_pulse *p, uint64_t src, const uint8_t *data, uint32_t len);
/* Pops up to cap recorded arrivals of absorbed copies; in arrival order per source.
 * Returns the count. */
int llft_pulse_arrivals(llft_pulse *p, uint64_t *src, int64_t *at_us, int cap);
/* [0] sent [1] received [2] absorbed [3] forwarded [4] forward queue full drops
 * [5] arrivals dropped [6] send errors [7] receive errors [8] copies skipped, the
 * lease lapsed [9] watches fired. */
void llft_pulse_stats(llft_pulse *p, uint64_t out[10]);
/* ==== cdef end ====================================================================== */

#endif
