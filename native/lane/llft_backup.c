/* llft_backup.c -- see llft_backup.h. Compiled in the same translation unit as
 * llft_lane.c (native/lane_build.py appends it): it uses that file's wire codec, its
 * msgpack reader of trailers (tr_*), sections and number helpers. Each function names
 * the BackupLane method (llft/protocol/messaging/backup_lane.py) it mirrors; where the
 * order of statements matters (a deadline, the clock, an action) it is the model's. */
#include "llft_backup.h"

typedef struct {
    llft_bk_msg **v;
    uint32_t head, n, cap;
} bk_list;

typedef struct {
    llft_bk_seg *v;
    uint32_t head, n, cap;
} bk_segs;


/* a connection's receive window: the slots (upto, upto + max_placeholders], msn at
 * msn % cap (every slot lies in that window: _expect and _rx_data stay inside it, and
 * the take empties the slot at upto + 1 before upto moves past it) */
enum { SLOT_NONE, SLOT_PLACEHOLDER, SLOT_MESSAGE };
typedef struct {
    llft_bk_msg **msg;
    uint8_t *state, *nack;
    uint32_t cap, n, nnack;     /* n: slots held; nnack: msns in nacks */
} bk_slots;

#define BK_MAX_PLACEHOLDERS (1u << 16)

struct llft_bk {
    const llft_wire *w;
    uint32_t mtu;
    llft_bk_state st;
    uint8_t group[MAX_GROUP_BYTES];
    uint32_t group_len;
    bk_list lists[LLFT_BK_MAX_CONNS][2];    /* held, received */
    bk_segs logs[LLFT_BK_MAX_CONNS];
    bk_slots slots[LLFT_BK_MAX_CONNS];
    uint8_t *sec[LLFT_BK_MAX_CONNS];    /* each connection's last_order_info: mtu bytes */
    uint64_t *nack_msns;        /* the last event's NACK entries' msns */
    uint32_t nnack_msns, cap_nack_msns;
    bk_list loaded;             /* messages made by llft_bk_add_msg, until the check */
    bk_list grave;              /* messages no list holds: freed at the next event */
    llft_bk_action *acts;
    uint32_t nacts, cap_acts;
};

/* ---- lists ------------------------------------------------------------------------------- */

/* An array of `size`-byte elements at *v, cap of them, doubled (64 to start); 0: no
 * memory (nothing changed). */
static int bk_grow(void **v, uint32_t *cap, size_t size) {
    uint32_t c = *cap ? 2 * *cap : 64;
    void *p = realloc(*v, size * c);
    if (p == NULL) return 0;
    *v = p;
    *cap = c;
    return 1;
}

/* Room for one more element at the end of a queue (n elements of `size` bytes from
 * *head in an array of *cap): what it holds moved to the front, or the array doubled.
 * 0: no memory (nothing changed). */
static int bk_room(void **v, uint32_t *head, uint32_t n, uint32_t *cap, size_t size) {
    if (*head + n < *cap) return 1;
    if (*head > 0) {
        memmove(*v, (char *)*v + (size_t)*head * size, (size_t)n * size);
        *head = 0;
        return 1;
    }
    return bk_grow(v, cap, size);
}

static int bk_list_push(bk_list *l, llft_bk_msg *m) {
    void *v = l->v;
    int ok = bk_room(&v, &l->head, l->n, &l->cap, sizeof *l->v);
    l->v = v;
    if (ok) l->v[l->head + l->n++] = m;
    return ok;
}

static llft_bk_msg *bk_list_first(const bk_list *l) { return l->n ? l->v[l->head] : NULL; }
static llft_bk_msg *bk_list_last(const bk_list *l) {
    return l->n ? l->v[l->head + l->n - 1] : NULL;
}

static void bk_release(llft_bk *L, llft_bk_msg *m);

/* the first message leaves a list; one no list holds goes to the grave (an action of
 * this event may name it) */
static void bk_list_pop(llft_bk *L, bk_list *l) {
    llft_bk_msg *m = l->v[l->head];
    l->head++;
    if (--l->n == 0) l->head = 0;
    bk_release(L, m);
}

static int bk_segs_push(bk_segs *l, llft_bk_seg seg) {
    void *v = l->v;
    int ok = bk_room(&v, &l->head, l->n, &l->cap, sizeof *l->v);
    l->v = v;
    if (ok) l->v[l->head + l->n++] = seg;
    return ok;
}

/* the first segment of a log leaves it (its bytes freed) */
static void bk_segs_pop(bk_segs *l) {
    free((void *)l->v[l->head].data);
    l->head++;
    if (--l->n == 0) l->head = 0;
}

/* a segment of `len` bytes at `data` (copied) ends the log; 0: no memory */
static int bk_segs_add(bk_segs *l, uint64_t msn, uint64_t offset, const char *data,
                       uint32_t len) {
    char *copy = malloc(len ? len : 1);
    if (copy == NULL) return 0;
    memcpy(copy, data, len);
    llft_bk_seg seg = {msn, offset, len, copy};
    if (!bk_segs_push(l, seg)) { free(copy); return 0; }
    return 1;
}

static void bk_bury(llft_bk *L) {
    for (uint32_t i = 0; i < L->grave.n; i++) free(L->grave.v[L->grave.head + i]);
    L->grave.head = L->grave.n = 0;
}

/* a message leaves a holder (a list or a slot): one nothing holds goes to the grave */
static void bk_release(llft_bk *L, llft_bk_msg *m) {
    if (--m->lists == 0 && !bk_list_push(&L->grave, m)) free(m);
}

static int bk_slots_size(bk_slots *sl, uint32_t cap) {
    if (sl->cap >= cap) return 1;
    llft_bk_msg **msg = realloc(sl->msg, sizeof *msg * cap);
    if (msg == NULL) return 0;
    sl->msg = msg;
    uint8_t *state = realloc(sl->state, cap);
    if (state == NULL) return 0;
    sl->state = state;
    uint8_t *nack = realloc(sl->nack, cap);
    if (nack == NULL) return 0;
    sl->nack = nack;
    memset(sl->state, 0, cap);
    memset(sl->nack, 0, cap);
    sl->cap = cap;
    sl->n = sl->nnack = 0;
    return 1;
}

/* the slot index of `msn` in conn c's window, or -1 outside it */
static int64_t bk_slot_index(const llft_bk *L, uint32_t c, uint64_t msn) {
    const llft_bk_state *s = &L->st;
    uint64_t upto = s->conns[c].upto, cap = s->max_placeholders;
    if (cap == 0 || msn <= upto || (i128)msn > (i128)upto + (i128)cap) return -1;
    return (int64_t)(msn % cap);
}

static int bk_slot_state(const llft_bk *L, uint32_t c, uint64_t msn) {
    int64_t i = bk_slot_index(L, c, msn);
    return i < 0 ? SLOT_NONE : L->slots[c].state[i];
}

/* empty a slot (its nack too); its message, if any, released */
static void bk_slot_clear(llft_bk *L, uint32_t c, int64_t i) {
    bk_slots *sl = &L->slots[c];
    if (sl->state[i] == SLOT_NONE) return;
    if (sl->state[i] == SLOT_MESSAGE) bk_release(L, sl->msg[i]);
    if (sl->nack[i]) {
        sl->nack[i] = 0;
        sl->nnack--;
    }
    sl->state[i] = SLOT_NONE;
    sl->n--;
}

/* ---- the lane ---------------------------------------------------------------------------- */

llft_bk *llft_bk_new(const llft_lane_codec *codec, uint32_t mtu) {
    if (codec == NULL || mtu < LN_MIN_MTU || mtu > MAX_DATAGRAM_BYTES) return NULL;
    llft_bk *L = calloc(1, sizeof *L);
    if (L == NULL) return NULL;
    L->w = codec->w;
    L->mtu = mtu;
    return L;
}

void llft_bk_reset(llft_bk *L) {
    bk_bury(L);
    /* messages loaded but never pushed (a loading that stopped before the check) */
    for (uint32_t i = 0; i < L->loaded.n; i++)
        if (L->loaded.v[L->loaded.head + i]->lists == 0) free(L->loaded.v[L->loaded.head + i]);
    L->loaded.head = L->loaded.n = 0;
    for (uint32_t c = 0; c < LLFT_BK_MAX_CONNS; c++) {
        for (int k = 0; k < 2; k++)
            while (L->lists[c][k].n) bk_list_pop(L, &L->lists[c][k]);
        while (L->logs[c].n) bk_segs_pop(&L->logs[c]);
        for (uint32_t i = 0; L->slots[c].n && i < L->slots[c].cap; i++)
            bk_slot_clear(L, c, i);
        L->slots[c].n = L->slots[c].nnack = 0;
    }
    bk_bury(L);
    memset(&L->st, 0, sizeof L->st);
    L->group_len = 0;
    L->nacts = 0;
}

void llft_bk_free(llft_bk *L) {
    if (L == NULL) return;
    llft_bk_reset(L);
    for (uint32_t c = 0; c < LLFT_BK_MAX_CONNS; c++) {
        free(L->lists[c][0].v);
        free(L->lists[c][1].v);
        free(L->logs[c].v);
        free(L->slots[c].msg);
        free(L->slots[c].state);
        free(L->slots[c].nack);
        free(L->sec[c]);
    }
    free(L->nack_msns);
    free(L->loaded.v);
    free(L->grave.v);
    free(L->acts);
    free(L);
}

llft_bk_state *llft_bk_state_of(llft_bk *L) { return &L->st; }

/* ---- loading and reading back ------------------------------------------------------------ */

int llft_bk_set_group(llft_bk *L, const char *group, size_t n) {
    if (n == 0 || n > MAX_GROUP_BYTES) return LLFT_BK_STATE;
    memcpy(L->group, group, n);
    L->group_len = (uint32_t)n;
    return LLFT_BK_OK;
}

int64_t llft_bk_add_msg(llft_bk *L, uint64_t msn, uint64_t ts, uint64_t offset, uint64_t pvn,
                        uint64_t flags, uint32_t data_len, uint32_t ref) {
    llft_bk_msg *m = calloc(1, sizeof *m);
    if (m == NULL) return -1;
    m->msn = msn;
    m->ts = ts;
    m->offset = offset;
    m->pvn = pvn;
    m->flags = flags;
    m->data_len = data_len;
    m->ref = ref;
    if (!bk_list_push(&L->loaded, m)) { free(m); return -1; }
    return (int64_t)L->loaded.n - 1;
}

int llft_bk_push(llft_bk *L, uint32_t conn, int which, int64_t msg) {
    if (conn >= LLFT_BK_MAX_CONNS || (which != 0 && which != 1) || msg < 0
        || msg >= (int64_t)L->loaded.n)
        return LLFT_BK_STATE;
    llft_bk_msg *m = L->loaded.v[L->loaded.head + (uint32_t)msg];
    if (!bk_list_push(&L->lists[conn][which], m)) return LLFT_BK_STATE;
    m->lists++;
    return LLFT_BK_OK;
}

int llft_bk_push_seg(llft_bk *L, uint32_t conn, uint64_t msn, uint64_t offset,
                     const char *data, uint32_t len) {
    if (conn >= LLFT_BK_MAX_CONNS) return LLFT_BK_STATE;
    return bk_segs_add(&L->logs[conn], msn, offset, data, len) ? LLFT_BK_OK : LLFT_BK_STATE;
}

int llft_bk_load_slot(llft_bk *L, uint32_t conn, uint64_t msn, int64_t msg, int nack) {
    llft_bk_state *s = &L->st;
    if (conn >= s->nconns || s->max_placeholders > BK_MAX_PLACEHOLDERS
        || !bk_slots_size(&L->slots[conn], (uint32_t)s->max_placeholders)
        || msg >= (int64_t)L->loaded.n)
        return LLFT_BK_STATE;
    int64_t i = bk_slot_index(L, conn, msn);
    bk_slots *sl = &L->slots[conn];
    if (i < 0 || sl->state[i] != SLOT_NONE || (nack && msg >= 0)) return LLFT_BK_STATE;
    if (msg >= 0) {
        llft_bk_msg *m = L->loaded.v[L->loaded.head + (uint32_t)msg];
        if (m->msn != msn) return LLFT_BK_STATE;
        sl->msg[i] = m;
        m->lists++;
        sl->state[i] = SLOT_MESSAGE;
    } else {
        sl->state[i] = SLOT_PLACEHOLDER;
    }
    sl->n++;
    if (nack) {
        sl->nack[i] = 1;
        sl->nnack++;
    }
    return LLFT_BK_OK;
}

int llft_bk_slot(const llft_bk *L, uint32_t conn, uint64_t msn, const llft_bk_msg **msg,
                 int *nack) {
    *msg = NULL;
    *nack = 0;
    if (conn >= L->st.nconns || L->slots[conn].cap < L->st.max_placeholders) return SLOT_NONE;
    int64_t i = bk_slot_index(L, conn, msn);
    if (i < 0) return SLOT_NONE;
    const bk_slots *sl = &L->slots[conn];
    if (sl->state[i] == SLOT_MESSAGE) *msg = sl->msg[i];
    *nack = sl->nack[i];
    return sl->state[i];
}

const uint64_t *llft_bk_nack_msns(const llft_bk *L) { return L->nack_msns; }

/* keep `sec` as conn c's last_order_info (0: no memory, or it does not fit) */
static int bk_keep_section(llft_bk *L, uint32_t c, const sec_t *sec) {
    if (L->sec[c] == NULL && (L->sec[c] = malloc(L->mtu)) == NULL) return 0;
    return sec_pack(L->sec[c], L->mtu, sec, &L->st.conns[c].last_order_info);
}

int llft_bk_load_section(llft_bk *L, uint32_t conn, const char *raw, size_t n) {
    if (conn >= LLFT_BK_MAX_CONNS) return LLFT_BK_STATE;
    rd_t rd;
    rd_over(&rd, (const uint8_t *)raw, n);
    sec_t s;
    if (tr_section(&rd, 0, &s) != 1 || rd.p != rd.end) return LLFT_BK_STATE;
    if (s.pvn < -((i128)1 << 63)) return LLFT_BK_STATE;
    return bk_keep_section(L, conn, &s) ? LLFT_BK_OK : LLFT_BK_STATE;
}

const char *llft_bk_section(const llft_bk *L, uint32_t conn) {
    return conn < LLFT_BK_MAX_CONNS ? (const char *)L->sec[conn] : NULL;
}

int llft_bk_check(llft_bk *L) {
    llft_bk_state *s = &L->st;
    /* the loaded messages no list took are not the loan's */
    for (uint32_t i = 0; i < L->loaded.n; i++)
        if (L->loaded.v[L->loaded.head + i]->lists == 0) free(L->loaded.v[L->loaded.head + i]);
    L->loaded.head = L->loaded.n = 0;
    int ok = L->group_len > 0 && s->nconns <= LLFT_BK_MAX_CONNS
        && s->nremotes <= LLFT_BK_MAX_REMOTES && s->nheard <= LLFT_BK_MAX_MEMBERS
        && s->nbackups <= LLFT_BK_MAX_MEMBERS && s->npeer <= LLFT_BK_MAX_PEER_PVNS - 1
        && time_ok(s->now) && time_ok(s->watermark_report_us)
        && time_ok(s->order_info_ack_us) && time_ok(s->nack_delay_us)
        && time_ok(s->keepalive_us) && time_ok(s->heartbeat_us)
        && s->max_payload_bytes >= 1 && s->max_payload_bytes <= UINT32_MAX
        && s->max_placeholders <= BK_MAX_PLACEHOLDERS && time_ok(s->nack_retry_us);
    for (uint32_t c = 0; ok && c < s->nconns; c++)
        ok = bk_slots_size(&L->slots[c], (uint32_t)s->max_placeholders)
            && (s->conns[c].has_view || L->slots[c].n == 0);
    for (int k = 0; ok && k < 3; k++)
        if (s->timer_set[k] && (s->timer_at[k] < -LN_TIMER_MAX || s->timer_at[k] > LN_TIMER_MAX))
            ok = 0;
    for (uint32_t i = 0; ok && i < s->npeer; i++)
        if (s->peer[i].n > LLFT_BK_MAX_MEMBERS) ok = 0;
    for (uint32_t i = 0; ok && i < s->nremotes; i++)
        if (s->remotes[i].name_len == 0 || s->remotes[i].name_len > MAX_GROUP_BYTES
            || s->remotes[i].heard_set || s->remotes[i].ph_set
            || (s->remotes[i].has_ph && !time_ok(s->remotes[i].ph_us)))
            ok = 0;
    for (uint32_t c = 0; ok && c < s->nconns; c++) {
        const llft_bk_conn *hc = &s->conns[c];
        ok = hc->remote < s->nremotes && hc->role <= 1 && hc->next_msn >= 1
            && time_ok(hc->last_send_us)
            && (hc->has_view || (L->lists[c][0].n == 0 && L->lists[c][1].n == 0));
        for (int k = 0; ok && k < 2; k++)
            if (hc->timer_set[k]
                && (hc->timer_at[k] < -LN_TIMER_MAX || hc->timer_at[k] > LN_TIMER_MAX))
                ok = 0;
        /* the held list continues `delivered` (lend_backup's condition, which C relies on:
         * a data message is taken where it continues the held bytes) */
        uint64_t reach = hc->delivered;
        const bk_list *held = &L->lists[c][0];
        for (uint32_t i = 0; ok && i < held->n; i++) {
            const llft_bk_msg *m = held->v[held->head + i];
            if (m->offset != reach || m->data_len > UINT64_MAX - reach) ok = 0;
            else reach += m->data_len;
        }
    }
    for (uint32_t c = s->nconns; ok && c < LLFT_BK_MAX_CONNS; c++)
        if (L->lists[c][0].n || L->lists[c][1].n || L->logs[c].n) ok = 0;
    return ok ? LLFT_BK_OK : LLFT_BK_STATE;
}

uint32_t llft_bk_list_len(const llft_bk *L, uint32_t conn, int which) {
    if (conn >= LLFT_BK_MAX_CONNS || (which != 0 && which != 1)) return 0;
    return L->lists[conn][which].n;
}

const llft_bk_msg *llft_bk_list_at(const llft_bk *L, uint32_t conn, int which, uint32_t i) {
    if (conn >= LLFT_BK_MAX_CONNS || (which != 0 && which != 1)) return NULL;
    const bk_list *l = &L->lists[conn][which];
    return i < l->n ? l->v[l->head + i] : NULL;
}

uint32_t llft_bk_log_len(const llft_bk *L, uint32_t conn) {
    return conn < LLFT_BK_MAX_CONNS ? L->logs[conn].n : 0;
}

const llft_bk_seg *llft_bk_log_at(const llft_bk *L, uint32_t conn, uint32_t i) {
    if (conn >= LLFT_BK_MAX_CONNS || i >= L->logs[conn].n) return NULL;
    return &L->logs[conn].v[L->logs[conn].head + i];
}

const llft_bk_action *llft_bk_actions(const llft_bk *L, uint32_t *n) {
    *n = L->nacts;
    return L->acts;
}

int llft_bk_next_timer(const llft_bk *L, int64_t *at_us) {
    const llft_bk_state *s = &L->st;
    int any = 0;
    for (int k = 0; k < 3; k++)
        if (s->timer_set[k] && (!any || s->timer_at[k] < *at_us)) {
            *at_us = s->timer_at[k];
            any = 1;
        }
    for (uint32_t c = 0; c < s->nconns; c++)
        for (int k = 0; k < 2; k++)
            if (s->conns[c].timer_set[k] && (!any || s->conns[c].timer_at[k] < *at_us)) {
                *at_us = s->conns[c].timer_at[k];
                any = 1;
            }
    return any;
}

/* ---- the rules --------------------------------------------------------------------------- */

/* an event starts: last event's actions gone, the messages they named freed */
static void bk_begin(llft_bk *L) {
    L->nacts = 0;
    bk_bury(L);
}

static llft_bk_action *bk_act(llft_bk *L, uint8_t kind) {
    if (L->nacts == L->cap_acts) {
        void *v = L->acts;
        if (!bk_grow(&v, &L->cap_acts, sizeof *L->acts))
            abort();                /* (an action cannot be dropped: out of memory) */
        L->acts = v;
    }
    llft_bk_action *a = &L->acts[L->nacts++];
    memset(a, 0, sizeof *a);
    a->kind = kind;
    return a;
}

static void bk_count(llft_bk_state *s, int k) { s->counters[k]++; }

/* _ts_w: timestamp_watermark(), the least term of the known connections (0 if none) */
static uint64_t bk_ts_w(const llft_bk_state *s) {
    int any = 0;
    uint64_t w = 0;
    for (uint32_t c = 0; c < s->nconns; c++)
        if (s->conns[c].known && (!any || s->conns[c].term < w)) {
            w = s->conns[c].term;
            any = 1;
        }
    return w;
}

/* _hb_soon */
static void bk_hb_soon(llft_bk_state *s) {
    if (!s->hb_quiet) return;
    s->hb_quiet = 0;
    int64_t due = s->now + s->heartbeat_us;
    if (!s->timer_set[LLFT_BK_T_HEARTBEAT] || due < s->timer_at[LLFT_BK_T_HEARTBEAT]) {
        s->timer_set[LLFT_BK_T_HEARTBEAT] = 1;
        s->timer_at[LLFT_BK_T_HEARTBEAT] = due;
    }
}

/* _after_event */
static void bk_after_event(llft_bk_state *s) {
    if (!s->timer_set[LLFT_BK_T_WATERMARK_REPORT] && s->has_backups
        && s->max_data_ts > s->reported_w && bk_ts_w(s) > s->reported_w) {
        s->timer_set[LLFT_BK_T_WATERMARK_REPORT] = 1;
        s->timer_at[LLFT_BK_T_WATERMARK_REPORT] = s->now + s->watermark_report_us;
    }
}

/* _merge: time, clock merge, counter; anything but a HEARTBEAT ends a quiet heartbeat */
static void bk_merge(llft_bk_state *s, unsigned type, uint64_t ts, int64_t now_us) {
    if (now_us > s->now) s->now = now_us;
    if (ts > s->clock) s->clock = ts;
    if (type < LLFT_BK_C_TYPES) bk_count(s, (int)type);
    if (type != LLFT_BK_HEARTBEAT) bk_hb_soon(s);
}

/* the slot of `sender` in last_heard (-1: none, and no room) */
static int bk_heard_slot(const llft_bk_state *s, uint64_t sender) {
    for (uint32_t i = 0; i < s->nheard; i++)
        if (s->last_heard[i].sender == sender) return (int)i;
    return s->nheard < LLFT_BK_MAX_MEMBERS ? (int)s->nheard : -1;
}

/* _from_group: _merge, then last_heard_us (the slot checked by the caller) */
static void bk_from_group(llft_bk_state *s, unsigned type, uint64_t sender, uint64_t ts,
                       int64_t now_us, int slot) {
    bk_merge(s, type, ts, now_us);
    if ((uint32_t)slot == s->nheard) {
        s->nheard++;
        s->last_heard[slot].sender = sender;
    }
    s->last_heard[slot].at_us = s->now;
}

/* _trim_log: what lies a window below the remote's `delivered` is covered */
static void bk_trim_log(llft_bk *L, uint32_t c) {
    llft_bk_conn *hc = &L->st.conns[c];
    i128 upto = (i128)hc->remote_delivered - (i128)L->st.window_bytes;
    bk_segs *log = &L->logs[c];
    while (log->n && (i128)log->v[log->head].offset + log->v[log->head].len <= upto) {
        hc->log_bytes -= log->v[log->head].len;
        bk_segs_pop(log);
    }
}

/* _deliver of a message starting at `delivered` (nothing ahead or beyond) */
static void bk_deliver(llft_bk *L, uint32_t c, const llft_bk_msg *m) {
    llft_bk_state *s = &L->st;
    llft_bk_conn *hc = &s->conns[c];
    uint64_t end = m->offset + m->data_len;
    uint64_t e = hc->end;
    if (hc->has_end && hc->delivered > e) {             /* recv.finished */
        bk_count(s, end > hc->delivered ? LLFT_BK_C_AFTER_END : LLFT_BK_C_DUP_BYTES);
        return;
    }
    if (end <= hc->delivered) {
        bk_count(s, LLFT_BK_C_DUP_BYTES);
        return;
    }
    if (hc->has_end && m->offset <= e && e < end) {
        if (e > m->offset) {
            llft_bk_action *a = bk_act(L, LLFT_BK_A_DELIVER);
            a->conn = c;
            a->msg = m;
            a->len = (uint32_t)(e - m->offset);
        }
        llft_bk_action *a = bk_act(L, LLFT_BK_A_CLOSED);
        a->conn = c;
        a->a = e;
        a->b = hc->abort;
        bk_count(s, LLFT_BK_C_STREAM_ENDS);
    } else {
        llft_bk_action *a = bk_act(L, LLFT_BK_A_DELIVER);
        a->conn = c;
        a->msg = m;
        a->len = m->data_len;
    }
    hc->delivered = end;
}

/* _release_held */
static void bk_release_held(llft_bk *L, uint32_t c) {
    bk_list *held = &L->lists[c][0];
    while (held->n && bk_list_first(held)->ts <= L->st.gw) {
        bk_deliver(L, c, bk_list_first(held));
        bk_list_pop(L, held);
    }
}

/* _gc_received */
static void bk_gc_received(llft_bk *L, uint32_t c) {
    llft_bk_conn *hc = &L->st.conns[c];
    bk_list *rx = &L->lists[c][1];
    while (rx->n && bk_list_first(rx)->ts <= L->st.gw) {
        const llft_bk_msg *m = bk_list_first(rx);
        uint64_t end = m->offset + m->data_len;
        if (end > hc->covered) hc->covered = end;
        bk_list_pop(L, rx);
    }
}

/* _advance_ts and the watermark term */
static void bk_advance_ts(llft_bk *L, uint32_t c) {
    llft_bk_conn *hc = &L->st.conns[c];
    if (L->slots[c].n == 0 && hc->upto >= hc->declared_upto && hc->declared_ts > hc->ts)
        hc->ts = hc->declared_ts;
    hc->term = hc->ts;
}

/* _expect: placeholders and nacks for what we lack up to `upto` (at most
 * max_placeholders past hc->upto), NACK armed if any is new */
static void bk_expect(llft_bk *L, uint32_t c, i128 upto) {
    llft_bk_state *s = &L->st;
    llft_bk_conn *hc = &s->conns[c];
    i128 top = (i128)hc->upto + (i128)s->max_placeholders;
    if (upto < top) top = upto;
    if (top <= (i128)hc->upto) return;
    bk_slots *sl = &L->slots[c];
    int fresh = 0;
    for (uint64_t k = hc->upto + 1; (i128)k <= top; k++) {
        int64_t i = bk_slot_index(L, c, k);
        if (sl->state[i] != SLOT_NONE) continue;
        sl->state[i] = SLOT_PLACEHOLDER;
        sl->n++;
        sl->nack[i] = 1;
        sl->nnack++;
        fresh = 1;
    }
    if (fresh && !hc->timer_set[LLFT_BK_CT_NACK]) {
        hc->timer_set[LLFT_BK_CT_NACK] = 1;
        hc->timer_at[LLFT_BK_CT_NACK] = s->now + s->nack_delay_us;
    }
}

/* _oi_accept of our view's section that continues what was delivered */
static void bk_oi_accept(llft_bk *L, const sec_t *sec, const uint8_t *base, int via) {
    llft_bk_state *s = &L->st;
    uint64_t d = s->oi_delivered;
    const uint8_t *p = sec->chunks;
    for (uint32_t i = 0; i < sec->n; i++) {
        const uint8_t *data;
        size_t len;
        p = bin_at(p, sec->end, &data, &len);
        if (p == NULL) return;                      /* (cannot be: the reader checked) */
        uint64_t pos = sec->first + i;              /* (<= 2^63 - 1: tr_section) */
        if (pos <= d) continue;
        if (pos - d > s->max_order_info_pending) break;
        s->oi_delivered = pos;
        bk_count(s, via);
        llft_bk_action *a = bk_act(L, LLFT_BK_A_ORDER_INFO);
        a->a = pos;
        a->at = (uint32_t)(data - base);
        a->len = (uint32_t)len;
        if (!s->timer_set[LLFT_BK_T_ORDER_INFO_ACK]) {
            s->timer_set[LLFT_BK_T_ORDER_INFO_ACK] = 1;
            s->timer_at[LLFT_BK_T_ORDER_INFO_ACK] = s->now + s->order_info_ack_us;
        }
    }
}

/* _order_info_ack: the report to our primary (the clock checked by the caller) */
static void bk_order_info_ack(llft_bk *L) {
    llft_bk_state *s = &L->st;
    s->oi_acked = s->oi_delivered;
    s->oi_done_acked = s->oi_executed;
    s->reported_w = bk_ts_w(s);
    s->timer_set[LLFT_BK_T_ORDER_INFO_ACK] = 0;
    s->timer_set[LLFT_BK_T_WATERMARK_REPORT] = 0;
    s->clock += 1;                                  /* _send_intra */
    llft_bk_action *a = bk_act(L, LLFT_BK_A_REPORT);
    a->a = s->oi_delivered;
    a->b = s->oi_executed;
    a->c = s->reported_w;
    a->d = s->digest;
    a->t = s->clock;
    bk_hb_soon(s);
}

/* the lent connection of (remote group named by span, seq, cid role), or -1 */
static int bk_find_conn(const llft_bk *L, const uint8_t *dg, size_t n, uint64_t span,
                     uint64_t seq, uint64_t role) {
    const llft_bk_state *s = &L->st;
    for (uint32_t c = 0; c < s->nconns; c++) {
        const llft_bk_conn *hc = &s->conns[c];
        if (hc->seq != seq || hc->role != role) continue;
        const llft_bk_remote *rm = &s->remotes[hc->remote];
        if (span_is(dg, n, span, (const uint8_t *)rm->name, rm->name_len)) return (int)c;
    }
    return -1;
}

/* _heard's `heard` and `primary_heard`, in the order _remember keeps */
static void bk_heard_remote(llft_bk_state *s, uint32_t remote, uint64_t pvn, uint64_t sender,
                         uint64_t ts, int64_t now_us) {
    llft_bk_remote *rm = &s->remotes[remote];
    rm->heard_set = 1;
    rm->heard_order = s->order++;
    rm->heard_us = s->now;
    /* rules.news_of_primary */
    if (!rm->has_ph || pvn > rm->ph_pvn
        || (pvn == rm->ph_pvn && (sender != rm->ph_sender || ts > rm->ph_ts))) {
        rm->has_ph = 1;
        rm->ph_pvn = pvn;
        rm->ph_sender = sender;
        rm->ph_us = now_us < s->now ? now_us : s->now;
        rm->ph_ts = ts;
        rm->ph_set = 1;
        rm->ph_order = s->order++;
    }
}

int llft_bk_receive(llft_bk *L, const char *dg_chars, size_t n, int64_t now_us) {
    bk_begin(L);
    llft_bk_state *s = &L->st;
    const uint8_t *dg = (const uint8_t *)dg_chars;
    if (n > L->mtu) return LLFT_BK_REFUSE;
    if (!time_ok(now_us)) return LLFT_BK_RANGE;
    uint64_t v[LLFT_WIRE_OUT];
    llft_wire_open(L->w, dg_chars, n, LN_MAX_MESSAGE_BYTES, v);
    /* (another type: the codec knows only those below; the decoder's then) */
    if (v[0] != LLFT_WIRE_OK) return LLFT_BK_NOT_RAW;
    uint64_t type = v[2], seq = v[3], role = v[4], pvn = v[5], sender = v[7], msn = v[8];
    uint64_t ack = v[9], back = v[10], ts = v[11];
    if (span_is(dg, n, v[12], L->group, L->group_len)) return LLFT_BK_NOT_RAW;
    /* _known_conn */
    if (!span_is(dg, n, v[13], L->group, L->group_len) || sender == s->birth_id || role > 1)
        return LLFT_BK_REFUSE;
    int ci = bk_find_conn(L, dg, n, v[12], seq, 1 - role);
    if (ci < 0) return LLFT_BK_REFUSE;
    uint32_t c = (uint32_t)ci;
    llft_bk_conn *hc = &s->conns[c];
    if (!hc->known) return LLFT_BK_REFUSE;
    if (type == LLFT_LANE_SECOND_ACK) {         /* _second_ack: a remote backup's */
        if (!hc->has_view || (v[14] & 0xffffffffu) != 0) return LLFT_BK_REFUSE;
        bk_merge(s, (unsigned)type, ts, now_us);    /* _heard (not a primary's) */
        llft_bk_remote *rm = &s->remotes[hc->remote];
        rm->heard_set = 1;
        rm->heard_order = s->order++;
        rm->heard_us = s->now;
        if (pvn == hc->view_pvn && !hc->after_change) bk_expect(L, c, (i128)ack);
        bk_after_event(s);
        return LLFT_BK_OK;
    }
    /* _remote_conn */
    if (!hc->has_view || hc->view_pvn != pvn || hc->sending) return LLFT_BK_REFUSE;
    int data = type == LLFT_LANE_REQUEST || type == LLFT_LANE_REPLY;
    uint64_t offset = 0, dspan = 0, flags = 0, data_at = 0, data_len = 0;
    int dup = 0;
    uint64_t take = 0;          /* how many messages the take moves to the lists */
    if (data) {                                 /* _data's conditions */
        if (hc->has_end) return LLFT_BK_REFUSE;
        if (!body_field(v, 0, &offset) || !body_field(v, 1, &dspan)
            || !body_field(v, 2, &flags))
            return LLFT_BK_REFUSE;
        data_at = dspan >> 32;
        data_len = dspan & 0xffffffffu;
        if (data_at > n || data_len > n - data_at) return LLFT_BK_REFUSE;
        if (flags != 0 || data_len == 0) return LLFT_BK_REFUSE;
        dup = msn <= hc->upto || bk_slot_state(L, c, msn) == SLOT_MESSAGE;
        if (!dup) {
            if (msn == 1 || (i128)msn > (i128)hc->upto + (i128)s->max_placeholders)
                return LLFT_BK_REFUSE;
            if (data_len > UINT64_MAX - offset) return LLFT_BK_RANGE;
            /* _contiguous: what the take would take once it is in its slot, each
             * continuing the held bytes without a flag (else not steady: the core's) */
            const llft_bk_msg *last = bk_list_last(&L->lists[c][0]);
            uint64_t reach = last ? last->offset + last->data_len : hc->delivered;
            for (uint64_t k = hc->upto + 1;; k++) {
                uint64_t o, len, f;
                if (k == msn) {
                    o = offset, len = data_len, f = flags;
                } else if (bk_slot_state(L, c, k) == SLOT_MESSAGE) {
                    const llft_bk_msg *m = L->slots[c].msg[bk_slot_index(L, c, k)];
                    o = m->offset, len = m->data_len, f = m->flags;
                } else {
                    break;
                }
                if (f || len == 0 || o != reach) return LLFT_BK_REFUSE;
                if (len > UINT64_MAX - reach) return LLFT_BK_RANGE;
                reach += len;
                take++;
            }
        }
    } else if (type == LLFT_LANE_KEEP_ALIVE || type == LLFT_LANE_FIRST_ACK) {
        if (hc->throttled || hc->resyncing) return LLFT_BK_REFUSE;   /* _control's */
    } else {
        return LLFT_BK_REFUSE;
    }
    /* _steady_trailer (and what this lane leaves to the core) */
    trailer_t tr;
    uint64_t oi = v[14], oi_at = oi >> 32, oi_len = oi & 0xffffffffu;
    if (oi_at > n || oi_len > n - oi_at) return LLFT_BK_REFUSE;
    int has_tr = tr_read(dg + oi_at, oi_len, &tr);
    if (has_tr < 0 || tr.others) return LLFT_BK_REFUSE;    /* (others: the core's) */
    i128 own_last = 0;
    int keep_own = 0;           /* _on_trailer keeps the remote's own order info */
    if (has_tr && tr.has_own) {
        size_t size = sec_size(&tr.own);
        if (tr.own.pvn < -((i128)1 << 63) || size == 0 || size > L->mtu)
            return LLFT_BK_RANGE;                       /* (cannot be: it came in one) */
        own_last = (i128)tr.own.first + (i128)tr.own.n - 1;
        const llft_lane_section *lr = &hc->last_order_info;
        keep_own = !lr->has || end_cmp(tr.own.pvn, own_last, int_get(lr->pvn),
                                       held_last(lr)) >= 0;
        if (keep_own && L->sec[c] == NULL && (L->sec[c] = malloc(L->mtu)) == NULL)
            return LLFT_BK_RANGE;                       /* (no memory: the core's) */
    }
    int refl = has_tr && tr.has_refl && tr.refl.pvn == (i128)s->pvn;
    if (refl && (s->oi_pending || (i128)tr.refl.first > (i128)s->oi_delivered + 1))
        return LLFT_BK_REFUSE;                  /* a gap: OrderInfoLog keeps it pending */
    int owes = 0;
    if (type == LLFT_LANE_FIRST_ACK) {
        uint64_t rd = hc->remote_delivered;
        if (has_tr && tr.has_delivered && tr.delivered > rd) rd = tr.delivered;
        owes = s->has_backups && ack > 0 && hc->out_offset >= rd;
        if (owes && (ts > s->clock ? ts : s->clock) == UINT64_MAX) return LLFT_BK_RANGE;
    }

    /* _from_remote_primary: from here on nothing refuses */
    bk_merge(s, (unsigned)type, ts, now_us);
    bk_heard_remote(s, hc->remote, pvn, sender, ts, now_us);
    if (type != LLFT_LANE_FIRST_ACK && ack != hc->next_msn - 1) hc->fa_count = 0;
    if (back > hc->remote_gw) hc->remote_gw = back;
    if (has_tr && tr.has_delivered && tr.delivered > hc->remote_delivered) {
        hc->remote_delivered = tr.delivered;
        bk_trim_log(L, c);
    }
    if (data && dup) {
        bk_count(s, LLFT_BK_C_DUP_DATA);
    } else if (data) {
        /* _rx_data: a message within the window (not msn 1) */
        llft_bk_msg *m = malloc(sizeof *m + n);
        if (m == NULL) abort();                 /* (nothing can be taken back now) */
        memset(m, 0, sizeof *m);
        memcpy(m + 1, dg, n);
        m->msn = msn;
        m->ts = ts;
        m->offset = offset;
        m->pvn = pvn;
        m->data_len = (uint32_t)data_len;
        m->ref = LLFT_BK_NONE;
        m->dg = (const char *)(m + 1);
        m->dg_len = (uint32_t)n;
        m->data_at = (uint32_t)data_at;
        if (!hc->has_first_offset || offset < hc->first_offset) {
            hc->has_first_offset = 1;
            hc->first_offset = offset;
        }
        hc->ka_idle = 0;
        bk_expect(L, c, (i128)msn - 1);
        bk_slots *sl = &L->slots[c];
        int64_t i = bk_slot_index(L, c, msn);
        if (sl->state[i] == SLOT_NONE) sl->n++;
        sl->state[i] = SLOT_MESSAGE;            /* (a placeholder, or nothing, before) */
        sl->msg[i] = m;
        m->lists = 1;
        if (sl->nack[i]) {
            sl->nack[i] = 0;
            sl->nnack--;
        }
        /* _advance: take_contiguous, keep_received, held */
        for (uint64_t k = 0; k < take; k++) {
            int64_t j = bk_slot_index(L, c, hc->upto + 1);
            llft_bk_msg *nxt = sl->msg[j];
            sl->state[j] = SLOT_NONE;           /* (no nack on a message's slot) */
            sl->n--;
            hc->upto += 1;
            uint64_t t = nxt->ts;
            if (t > hc->ts) hc->ts = t;
            if (t > hc->max_data_ts) hc->max_data_ts = t;
            if (!bk_list_push(&L->lists[c][1], nxt) || !bk_list_push(&L->lists[c][0], nxt))
                abort();
            nxt->lists += 1;                    /* (the slot's hold passes to a list) */
            hc->holding = 1;
            if (t > s->max_data_ts) s->max_data_ts = t;
        }
        bk_release_held(L, c);
        bk_advance_ts(L, c);
        bk_gc_received(L, c);
    } else if (type == LLFT_LANE_KEEP_ALIVE) {
        hc->fa_count = 0;                       /* _on_keepalive */
    } else {                                    /* _on_first_ack */
        if (ack > 0 && ack == hc->next_msn - 1) {
            if (hc->fa_msn != ack) {
                hc->fa_msn = ack;
                hc->fa_count = 0;
            }
            hc->fa_count++;
        }
        if (owes) {
            s->clock += 1;
            if (s->gw > hc->last_back) hc->last_back = s->gw;
            llft_bk_action *a = bk_act(L, LLFT_BK_A_SECOND_ACK);
            a->conn = c;
            a->a = ack;
            a->c = s->gw;
            a->t = s->clock;
            hc->last_send_us = s->now;
            hc->timer_set[LLFT_BK_CT_KEEPALIVE] = 1;
            hc->timer_at[LLFT_BK_CT_KEEPALIVE] = s->now + s->keepalive_us;
        }
    }
    /* _on_trailer */
    if (has_tr) {
        if (!data) {                            /* _declared of its own sent-up-to */
            i128 su = tr.sent_upto;
            if (su >= (i128)hc->declared_upto || ts > hc->declared_ts) {
                if (su > (i128)hc->declared_upto) hc->declared_upto = (uint64_t)su;
                if (ts > hc->declared_ts) hc->declared_ts = ts;
            }
            bk_expect(L, c, su);
            bk_advance_ts(L, c);
        }
        if (keep_own) bk_keep_section(L, c, &tr.own);    /* (it fits: checked) */
        if (refl) bk_oi_accept(L, &tr.refl, dg, LLFT_BK_C_OI_VIA_REFLECTION);
    }
    bk_after_event(s);
    return LLFT_BK_OK;
}

/* _note_peer_ack's entry for (pvn, sender): 1 if there is room for it */
static int bk_peer_room(const llft_bk_state *s, uint64_t pvn, uint64_t sender) {
    for (uint32_t i = 0; i < s->npeer; i++) {
        if (s->peer[i].pvn != pvn) continue;
        for (uint32_t j = 0; j < s->peer[i].n; j++)
            if (s->peer[i].sender[j] == sender) return 1;
        return s->peer[i].n < LLFT_BK_MAX_MEMBERS;
    }
    return s->npeer < LLFT_BK_MAX_PEER_PVNS;
}

/* _note_peer_ack (room checked by the caller) */
static void bk_note_peer_ack(llft_bk_state *s, uint64_t pvn, uint64_t sender, uint64_t upto) {
    int member = 0;
    for (uint32_t i = 0; i < s->nbackups; i++)
        if (s->backups[i] == sender) member = 1;
    if (!member) return;
    uint32_t i = 0;
    while (i < s->npeer && s->peer[i].pvn != pvn) i++;
    if (i == s->npeer) {
        s->npeer++;
        s->peer[i].pvn = pvn;
        s->peer[i].n = 0;
    }
    llft_bk_peer_acks *p = &s->peer[i];
    uint32_t j = 0;
    while (j < p->n && p->sender[j] != sender) j++;
    if (j == p->n) {
        p->n++;
        p->sender[j] = sender;
        p->upto[j] = 0;
    }
    if (upto > p->upto[j]) p->upto[j] = upto;
    while (s->npeer > 2) {                      /* sorted(...)[:-2]: the lowest views go */
        uint32_t lo = 0;
        for (uint32_t k = 1; k < s->npeer; k++)
            if (s->peer[k].pvn < s->peer[lo].pvn) lo = k;
        s->peer[lo] = s->peer[--s->npeer];
    }
}

int llft_bk_intra(llft_bk *L, unsigned type, uint64_t sender, uint64_t pvn, uint64_t ack,
                  uint64_t back, uint64_t ts, const char *oi_chars, size_t oi_len,
                  int has_upto, uint64_t upto, int64_t now_us) {
    bk_begin(L);
    llft_bk_state *s = &L->st;
    if (!time_ok(now_us)) return LLFT_BK_RANGE;
    if (sender == s->birth_id) return LLFT_BK_REFUSE;
    int slot = bk_heard_slot(s, sender);
    if (sender != s->primary_id) {              /* _peer */
        if (type != LLFT_BK_HEARTBEAT && type != LLFT_BK_ORDER_INFO && type != LLFT_BK_NACK)
            return LLFT_BK_REFUSE;
        int note = type == LLFT_BK_ORDER_INFO && has_upto;
        if (slot < 0 || (note && !bk_peer_room(s, pvn, sender))) return LLFT_BK_RANGE;
        bk_from_group(s, type, sender, ts, now_us, slot);
        if (note) bk_note_peer_ack(s, pvn, sender, upto);
        bk_after_event(s);
        return LLFT_BK_OK;
    }
    if (pvn != s->pvn) return LLFT_BK_REFUSE;
    if (type == LLFT_BK_HEARTBEAT) {            /* _heartbeat: rule 2 */
        if (oi_len != 0 || ack != s->digest) return LLFT_BK_REFUSE;
        if (slot < 0) return LLFT_BK_RANGE;
        bk_from_group(s, type, sender, ts, now_us, slot);
        if (back > s->gw) {
            s->gw = back;
            for (uint32_t c = 0; c < s->nconns; c++)    /* _gc_all_received */
                if (s->conns[c].holding) {
                    bk_gc_received(L, c);
                    if (L->lists[c][1].n == 0) s->conns[c].holding = 0;
                }
            for (uint32_t c = 0; c < s->nconns; c++) bk_release_held(L, c);
        }
        bk_after_event(s);
        return LLFT_BK_OK;
    }
    if (type != LLFT_BK_ORDER_INFO) return LLFT_BK_REFUSE;
    /* _order_info: our primary's direct ORDER_INFO of our view (the adapter refuses
     * it when order_info_direct_ack_us is set) */
    const uint8_t *oi = (const uint8_t *)oi_chars;
    trailer_t tr;
    int k = tr_read(oi, oi_len, &tr);
    if (k < 0 || tr.others) return LLFT_BK_REFUSE;  /* (malformed: the core ignores it) */
    int sec = k && tr.has_own && tr.own.pvn == (i128)s->pvn;
    if (sec && (s->oi_pending || (i128)tr.own.first > (i128)s->oi_delivered + 1))
        return LLFT_BK_REFUSE;
    if (slot < 0 || (ts > s->clock ? ts : s->clock) == UINT64_MAX) return LLFT_BK_RANGE;
    bk_from_group(s, type, sender, ts, now_us, slot);
    if (sec) bk_oi_accept(L, &tr.own, oi, LLFT_BK_C_OI_VIA_INTRA);
    bk_order_info_ack(L);
    bk_after_event(s);
    return LLFT_BK_OK;
}

/* _nack at a backup of a lent connection (no old view, nothing ahead: its view's nacks),
 * its entry of the local NACK written as an action; 1 if it wrote one */
static int bk_nack(llft_bk *L, uint32_t c) {
    llft_bk_state *s = &L->st;
    llft_bk_conn *hc = &s->conns[c];
    bk_slots *sl = &L->slots[c];
    if (!hc->has_view || sl->nnack == 0) {
        hc->timer_set[LLFT_BK_CT_NACK] = 0;
        return 0;
    }
    hc->timer_set[LLFT_BK_CT_NACK] = 1;
    hc->timer_at[LLFT_BK_CT_NACK] = s->now + s->nack_retry_us;
    uint32_t at = L->nnack_msns, k = 0;
    for (uint64_t j = 1; j <= s->max_placeholders && k < s->max_nack_msns; j++) {
        uint64_t msn = hc->upto + j;                /* sorted(nacks)[:max_nack_msns] */
        if (!sl->nack[bk_slot_index(L, c, msn)]) continue;
        if (L->nnack_msns == L->cap_nack_msns) {
            void *v = L->nack_msns;
            if (!bk_grow(&v, &L->cap_nack_msns, sizeof *L->nack_msns)) abort();
            L->nack_msns = v;
        }
        L->nack_msns[L->nnack_msns++] = msn;
        k++;
    }
    s->counters[LLFT_BK_C_NACK_MSNS] += k;
    llft_bk_action *a = bk_act(L, LLFT_BK_A_NACK_ENTRY);
    a->conn = c;
    a->a = hc->view_pvn;
    a->at = at;
    a->len = k;
    return 1;
}

/* _heartbeat_due at a backup: _heartbeat, _after_heartbeat, the next deadline */
static void bk_heartbeat_due(llft_bk *L, int same) {
    llft_bk_state *s = &L->st;
    uint64_t back = s->reported_w = bk_ts_w(s);     /* _heartbeat_back */
    uint64_t k = s->pulse_intervals;
    int64_t hb = s->heartbeat_us;
    int quiet = k > 1 && same && s->last_hb_back == back;
    if (!quiet) {
        s->clock += 1;                              /* _intra */
        s->last_hb_back = back;
    }
    llft_bk_action *a = bk_act(L, LLFT_BK_A_HEARTBEAT);
    a->b = (uint64_t)quiet;
    a->c = back;
    a->t = s->clock;
    s->timer_set[LLFT_BK_T_WATERMARK_REPORT] = 0;  /* _after_heartbeat */
    if (s->oi_acked != s->oi_delivered && !s->timer_set[LLFT_BK_T_ORDER_INFO_ACK]) {
        s->timer_set[LLFT_BK_T_ORDER_INFO_ACK] = 1;
        s->timer_at[LLFT_BK_T_ORDER_INFO_ACK] = s->now + s->order_info_ack_us;
    }
    s->hb_quiet = (uint8_t)quiet;
    s->timer_set[LLFT_BK_T_HEARTBEAT] = s->has_backups;
    s->timer_at[LLFT_BK_T_HEARTBEAT] = s->now + (quiet ? hb * (int64_t)k : hb);
}

int llft_bk_timer(llft_bk *L, int64_t now_us, int has_core_next, int64_t core_next_us,
                  int hb_same) {
    bk_begin(L);
    llft_bk_state *s = &L->st;
    if (!time_ok(now_us)) return LLFT_BK_RANGE;
    int64_t now = now_us > s->now ? now_us : s->now;
    if (has_core_next && core_next_us <= now) return LLFT_BK_REFUSE;
    int due[3], any = 0;
    for (int k = 0; k < 3; k++) {
        due[k] = s->timer_set[k] && s->timer_at[k] <= now;
        any |= due[k];
    }
    uint8_t kdue[LLFT_BK_MAX_CONNS][2];
    for (uint32_t c = 0; c < s->nconns; c++)
        for (int k = 0; k < 2; k++) {
            const llft_bk_conn *hc = &s->conns[c];
            kdue[c][k] = hc->timer_set[k] && hc->timer_at[k] <= now;
            any |= kdue[c][k];
        }
    if (!any) return LLFT_BK_REFUSE;
    if (s->clock >= UINT64_MAX - 3) return LLFT_BK_RANGE;  /* (a heartbeat, report, NACK) */
    if (due[LLFT_BK_T_HEARTBEAT] && (s->pulse_intervals == 0 || s->pulse_intervals > 1000000))
        return LLFT_BK_RANGE;
    s->now = now;
    if (due[LLFT_BK_T_HEARTBEAT]) bk_heartbeat_due(L, hb_same);
    if (due[LLFT_BK_T_WATERMARK_REPORT] && s->timer_set[LLFT_BK_T_WATERMARK_REPORT]
        && s->timer_at[LLFT_BK_T_WATERMARK_REPORT] <= now) {   /* _watermark_report_due */
        s->timer_set[LLFT_BK_T_WATERMARK_REPORT] = 0;
        if (bk_ts_w(s) > s->reported_w || s->oi_acked != s->oi_delivered) bk_order_info_ack(L);
    }
    if (due[LLFT_BK_T_ORDER_INFO_ACK] && s->timer_set[LLFT_BK_T_ORDER_INFO_ACK]
        && s->timer_at[LLFT_BK_T_ORDER_INFO_ACK] <= now)
        bk_order_info_ack(L);                   /* _order_info_ack_due */
    int entries = 0;
    for (uint32_t c = 0; c < s->nconns; c++) {
        llft_bk_conn *hc = &s->conns[c];
        if (kdue[c][LLFT_BK_CT_NACK] && hc->timer_set[LLFT_BK_CT_NACK]
            && hc->timer_at[LLFT_BK_CT_NACK] <= now)
            entries += bk_nack(L, c);
        if (kdue[c][LLFT_BK_CT_KEEPALIVE])
            hc->timer_set[LLFT_BK_CT_KEEPALIVE] = 0;    /* a primary's timer (not_mine) */
    }
    if (entries) {                              /* _send_intra(NACK, {"missing": ...}) */
        s->clock += 1;
        llft_bk_action *a = bk_act(L, LLFT_BK_A_LOCAL_NACK);
        a->t = s->clock;
        bk_hb_soon(s);
    }
    bk_after_event(s);
    return LLFT_BK_OK;
}

int llft_bk_set_executed(llft_bk *L, uint64_t pos, int has_now, int64_t now_us) {
    bk_begin(L);
    llft_bk_state *s = &L->st;
    if (has_now && !time_ok(now_us)) return LLFT_BK_RANGE;
    if (has_now && now_us > s->now) s->now = now_us;
    uint64_t x = pos < s->oi_delivered ? pos : s->oi_delivered;
    if (x > s->oi_executed) s->oi_executed = x;
    if (s->oi_executed != s->oi_done_acked && !s->timer_set[LLFT_BK_T_ORDER_INFO_ACK]) {
        s->timer_set[LLFT_BK_T_ORDER_INFO_ACK] = 1;
        s->timer_at[LLFT_BK_T_ORDER_INFO_ACK] = s->now + s->order_info_ack_us;
    }
    return LLFT_BK_OK;
}

int64_t llft_bk_send_space(const llft_bk *L, uint32_t conn) {
    const llft_bk_state *s = &L->st;
    if (conn >= s->nconns) return -1;
    const llft_bk_conn *hc = &s->conns[conn];
    i128 room = (i128)s->max_log_bytes - (i128)hc->log_bytes;
    return room < 0 ? 0 : room > INT64_MAX ? INT64_MAX : (int64_t)room;
}

int llft_bk_send(llft_bk *L, uint32_t conn, const char *data, uint64_t n, int has_now,
                 int64_t now_us, uint64_t *taken) {
    bk_begin(L);
    llft_bk_state *s = &L->st;
    *taken = 0;
    if (conn >= s->nconns) return LLFT_BK_REFUSE;
    llft_bk_conn *hc = &s->conns[conn];
    if (!hc->known || hc->send_ended) return LLFT_BK_REFUSE;
    if (has_now && !time_ok(now_us)) return LLFT_BK_RANGE;
    i128 room = (i128)s->max_log_bytes - (i128)hc->log_bytes;
    uint64_t take = room <= 0 ? 0 : (i128)n < room ? n : (uint64_t)room;
    uint64_t step = s->max_payload_bytes;
    uint64_t segs = take / step + (take % step != 0);
    if (take > UINT64_MAX - hc->out_offset || segs > UINT64_MAX - hc->next_msn
        || take > UINT64_MAX - hc->log_bytes)
        return LLFT_BK_RANGE;
    if (has_now && now_us > s->now) s->now = now_us;
    for (uint64_t i = 0; i < take; i += step) {
        uint32_t len = (uint32_t)(take - i < step ? take - i : step);
        if (!bk_segs_add(&L->logs[conn], hc->next_msn, hc->out_offset, data + i, len))
            abort();                            /* (no memory: nothing can be undone) */
        hc->log_bytes += len;
        hc->next_msn += 1;
        hc->out_offset += len;
    }
    if (take) bk_trim_log(L, conn);
    *taken = take;
    return LLFT_BK_OK;
}
