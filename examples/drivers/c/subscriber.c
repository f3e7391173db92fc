/* kv-events-subscriber driver in C: SUB for the live stream, a DEALER replay
 * client (lazy pirate: rebuilt after a timeout), every batch once, in order.
 * Build with -DBROKEN_DEDUP for a subscriber that lets duplicates through. */
#include "kvdriver.h"

typedef struct { int64_t seq; char *data; size_t len; int ok; } Batch;
typedef struct { Batch *v; size_t n, cap; } Batches;

static struct {
    void *ctx, *sub, *dealer;
    char topic[256], replay_endpoint[256];
    int64_t replay_timeout, resync_idle, reconnect_ivl;
    int attempts, failed;
    int64_t last, last_live;   /* last seq delivered or consumed; last seq seen live */
    Batches held, out;         /* waiting behind a gap; deliverable this poll */
    int replaying;
    int64_t covers, activity, traffic;
    long delivered, duplicates, garbled, other_topic, gaps, replays, timeouts, lost,
        restarts, stray;
} S;

static void push(Batches *b, int64_t seq, const void *data, size_t len, int ok) {
    if (b->n == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 64;
        b->v = realloc(b->v, b->cap * sizeof *b->v);
        if (!b->v) abort();
    }
    Batch *x = &b->v[b->n++];
    x->seq = seq, x->len = len, x->ok = ok, x->data = malloc(len ? len : 1);
    if (!x->data) abort();
    memcpy(x->data, data, len);
}

static void clear(Batches *b) {
    for (size_t i = 0; i < b->n; i++) free(b->v[i].data);
    b->n = 0;
}

static size_t held_min(void) {
    size_t best = 0;
    for (size_t i = 1; i < S.held.n; i++) if (S.held.v[i].seq < S.held.v[best].seq) best = i;
    return best;
}

static int held_find(int64_t seq) {
    for (size_t i = 0; i < S.held.n; i++) if (S.held.v[i].seq == seq) return (int)i;
    return -1;
}

/* Deliver held batches while they continue the sequence. */
static void flush(void) {
    int i;
    while ((i = held_find(S.last + 1)) >= 0) {
        Batch b = S.held.v[i];
        S.held.v[i] = S.held.v[--S.held.n];
        S.last = b.seq;
        if (b.ok) { push(&S.out, b.seq, b.data, b.len, 1); S.delivered++; }
        free(b.data);
    }
}

/* Declare seqs missing up to upto (NONE: everything held back) lost, deliver past them. */
static void give_up(int64_t upto) {
    while (S.held.n) {
        int64_t first = S.held.v[held_min()].seq;
        int64_t limit = upto == NONE || first - 1 < upto ? first - 1 : upto;
        if (limit > S.last) { S.lost += limit - S.last; S.last = limit; }
        if (S.last + 1 != first) return;
        flush();
    }
}

static void hold(int64_t seq, const void *data, size_t len) {
    if (seq <= S.last || held_find(seq) >= 0) {
#ifdef BROKEN_DEDUP
        push(&S.out, seq, data, len, batch_ok(data, len));
#endif
        S.duplicates++;
        return;
    }
    int ok = batch_ok(data, len);
    if (!ok) S.garbled++; /* a garbled payload still consumes its seq */
    push(&S.held, seq, data, len, ok);
    flush();
}

static void drop_dealer(void) {
    if (S.dealer) zmq_close(S.dealer);
    S.dealer = NULL;
}

static void request_replay(void) {
    if (!S.dealer) {
        S.dealer = zmq_socket(S.ctx, ZMQ_DEALER);
        int zero = 0, ivl = (int)S.reconnect_ivl;
        zmq_setsockopt(S.dealer, ZMQ_LINGER, &zero, sizeof zero);
        zmq_setsockopt(S.dealer, ZMQ_RECONNECT_IVL, &ivl, sizeof ivl);
        zmq_connect(S.dealer, S.replay_endpoint);
    }
    unsigned char start[8];
    put_be64(start, S.last + 1);
    S.replaying = 1, S.activity = now_ms(), S.replays++;
    S.covers = S.last_live != NONE ? S.last_live : S.last;
    zmq_send(S.dealer, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(S.dealer, start, 8, ZMQ_DONTWAIT); /* unsent: the timeout retries */
}

/* A live seq at or below the last live one: a new publisher incarnation. */
static void restarted(void) {
    S.restarts++;
    give_up(NONE);
    drop_dealer();
    S.replaying = 0, S.failed = 0, S.last = -1, S.last_live = NONE;
}

static void on_live(zmq_msg_t *p, int n) {
    size_t tlen = strlen(S.topic);
    if (n != 3) { S.garbled++; return; }
    if (tlen && (zmq_msg_size(&p[0]) != tlen || memcmp(zmq_msg_data(&p[0]), S.topic, tlen))) {
        S.other_topic++;
        return;
    }
    int64_t seq = zmq_msg_size(&p[1]) == 8 ? be64(zmq_msg_data(&p[1])) : -1;
    if (seq < 0) { S.garbled++; return; } /* short, long, or past 2**63 */
    S.traffic = now_ms();
    if (S.last_live != NONE && seq <= S.last_live) restarted();
    else if (S.last == NONE) S.last = seq - 1; /* join the stream where it is */
    S.last_live = seq;
    hold(seq, zmq_msg_data(&p[2]), zmq_msg_size(&p[2]));
    if (S.held.n && !S.replaying) { S.gaps++; request_replay(); }
}

/* [b"", seq, payload] (seq-payload) or [b"", topic, seq, payload] (topic-seq-payload). */
static void on_answer(zmq_msg_t *p, int n) {
    if (!S.replaying) { S.stray++; return; }
    zmq_msg_t *seqf = &p[n - 2];
    if ((n != 3 && n != 4) || zmq_msg_size(&p[0]) != 0 || zmq_msg_size(seqf) != 8) {
        S.garbled++;
        return;
    }
    S.activity = now_ms();
    int64_t seq = be64(zmq_msg_data(seqf)); /* signed: the end marker is -1 */
    if (seq == -1) {
        S.replaying = 0, S.failed = 0;
        give_up(S.covers);
        if (S.held.n) request_replay(); /* more went missing after the request left */
    } else if (seq < 0) {
        S.garbled++;
    } else {
        hold(seq, zmq_msg_data(&p[n - 1]), zmq_msg_size(&p[n - 1]));
    }
}

static void read_socket(void *sock, void (*handle)(zmq_msg_t *, int)) {
    zmq_msg_t parts[MAX_PARTS];
    for (int i = 0, n; i < 64 && sock && (n = recv_parts(sock, parts)) >= 0; i++) {
        handle(parts, n);
        close_parts(parts, n);
        if (sock != S.sub && sock != S.dealer) return; /* the dealer was rebuilt */
    }
}

static void timers(int64_t now) {
    if (S.replaying) {
        if (now - S.activity < S.replay_timeout) return;
        S.timeouts++, S.replaying = 0, S.failed++;
        drop_dealer(); /* lazy pirate: late answers die with the socket */
        if (S.failed >= S.attempts) { S.failed = 0; give_up(NONE); }
        if (S.held.n) request_replay(); else S.failed = 0;
    } else if (S.resync_idle && S.last != NONE && now - S.traffic >= S.resync_idle) {
        S.traffic = now;
        request_replay();
    }
}

static int64_t next_timer(int64_t now) {
    if (S.replaying) return S.activity + S.replay_timeout;
    if (S.resync_idle && S.last != NONE) return S.traffic + S.resync_idle;
    return now + 3600000;
}

static const char *sub_open(const msgpack_object *a) {
    char endpoint[256];
    if (!mp_text(mp_get(a, "endpoint"), endpoint, sizeof endpoint)
        || !mp_text(mp_get(a, "replay_endpoint"), S.replay_endpoint, sizeof S.replay_endpoint)
        || !mp_text(mp_get(a, "topic"), S.topic, sizeof S.topic))
        return "endpoint, replay_endpoint and topic must be strings under 256 bytes";
    S.replay_timeout = mp_int(mp_get(a, "replay_timeout_ms"), 1000);
    S.attempts = (int)mp_int(mp_get(a, "replay_attempts"), 3);
    S.resync_idle = mp_int(mp_get(a, "resync_idle_ms"), 1000);
    S.reconnect_ivl = 100;
    int hb = (int)mp_int(mp_get(a, "heartbeat_ivl_ms"), 500);
    int hbt = (int)mp_int(mp_get(a, "heartbeat_timeout_ms"), 1500), zero = 0, ivl = 100;
    if (S.replay_timeout < 1 || S.attempts < 1 || S.resync_idle < 0 || hb < 0 || hbt < 0)
        return "replay_timeout_ms and replay_attempts must be >= 1, the others >= 0";
    S.last = S.last_live = NONE;
    S.traffic = now_ms();
    S.ctx = zmq_ctx_new();
    S.sub = zmq_socket(S.ctx, ZMQ_SUB);
    /* No receive limit: libzmq 4.3 aborts on a reset of a full, heartbeated pipe. */
    zmq_setsockopt(S.sub, ZMQ_RCVHWM, &zero, sizeof zero);
    zmq_setsockopt(S.sub, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(S.sub, ZMQ_RECONNECT_IVL, &ivl, sizeof ivl);
    if (hb) {
        zmq_setsockopt(S.sub, ZMQ_HEARTBEAT_IVL, &hb, sizeof hb);
        zmq_setsockopt(S.sub, ZMQ_HEARTBEAT_TIMEOUT, hbt ? &hbt : &hb, sizeof hb);
    }
    zmq_setsockopt(S.sub, ZMQ_SUBSCRIBE, S.topic, strlen(S.topic));
    if (zmq_connect(S.sub, endpoint) != 0) return zmq_strerror(zmq_errno());
    return NULL;
}

/* Poll up to timeout_ms; the deliverable batches are left in S.out. */
static void sub_poll(int64_t timeout_ms) {
    int64_t deadline = now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    clear(&S.out);
    for (;;) {
        read_socket(S.sub, on_live);
        read_socket(S.dealer, on_answer);
        int64_t now = now_ms();
        timers(now);
        if (S.out.n || now >= deadline) return;
        int64_t wake = next_timer(now) < deadline ? next_timer(now) : deadline;
        zmq_pollitem_t items[2] = {{S.sub, 0, ZMQ_POLLIN, 0}, {S.dealer, 0, ZMQ_POLLIN, 0}};
        zmq_poll(items, S.dealer ? 2 : 1, (long)(wake - now) + 1);
    }
}

static void sub_close(void) {
    drop_dealer();
    if (S.sub) zmq_close(S.sub);
    if (S.ctx) zmq_ctx_term(S.ctx);
    S.sub = S.ctx = NULL;
}

static void pack_stats(msgpack_packer *pk) {
    const char *names[] = {"delivered", "duplicates", "garbled", "other_topic", "gaps",
                           "replays", "replay_timeouts", "lost", "restarts", "stray_answers"};
    long values[] = {S.delivered, S.duplicates, S.garbled, S.other_topic, S.gaps,
                     S.replays, S.timeouts, S.lost, S.restarts, S.stray};
    msgpack_pack_map(pk, 10);
    for (int i = 0; i < 10; i++) { pk_str(pk, names[i]); msgpack_pack_long(pk, values[i]); }
}

static void capabilities(msgpack_packer *pk) {
    msgpack_pack_map(pk, 2);
    pk_str(pk, "encoding");
    pk_str(pk, "map");
    pk_str(pk, "heartbeat_configurable");
    msgpack_pack_true(pk);
}

static void release(void) {
    sub_close();
    clear(&S.held), clear(&S.out);
    free(S.held.v), free(S.out.v);
    memset(&S, 0, sizeof S);
}

int main(void) {
    static const char *const options[] = {"replay_timeout_ms", "heartbeat_ivl_ms",
                                          "heartbeat_timeout_ms", NULL};
    msgpack_unpacked u;
    char *buf = NULL;
    int64_t handles = 0; /* the last handle issued; S.ctx is set while it is open */
    msgpack_unpacked_init(&u);
    if (!hello(&u, &buf, "kv-events-subscriber", capabilities, options)) return 2;
    while (read_request(&u, &buf)) {
        int64_t id = mp_int(mp_get(&u.data, "id"), 0), h = mp_int(mp_get(&u.data, "handle"), -1);
        const msgpack_object *call = mp_get(&u.data, "call"), *args = mp_get(&u.data, "args");
        Reply r;
        if (h == 0 && mp_is(call, "subscriber")) {
            if (S.ctx) { reply_error(id, "invalid", "one subscriber per process at a time"); continue; }
            const char *why = sub_open(args);
            if (why) { release(); reply_error(id, "invalid", why); continue; }
            msgpack_packer *pk = reply_result(&r, id);
            msgpack_pack_map(pk, 1);
            pk_str(pk, "handle");
            msgpack_pack_int64(pk, ++handles);
        } else if (h < 1 || h > handles) {
            reply_error(id, "invalid", "no such handle");
            continue;
        } else if (mp_is(call, "close")) {
            if (h == handles) release();
            msgpack_pack_nil(reply_result(&r, id));
        } else if (h != handles || !S.ctx) {
            reply_error(id, "closed", "the subscriber is closed");
            continue;
        } else if (mp_is(call, "poll")) {
            sub_poll(mp_int(mp_get(args, "timeout_ms"), 0));
            msgpack_packer *pk = reply_result(&r, id);
            msgpack_pack_array(pk, S.out.n);
            for (size_t i = 0; i < S.out.n; i++) { /* [seq, batch]: the payload as it came */
                msgpack_pack_array(pk, 2);
                msgpack_pack_int64(pk, S.out.v[i].seq);
                msgpack_sbuffer_write(&r.sb, S.out.v[i].data, S.out.v[i].len);
            }
            clear(&S.out);
        } else if (mp_is(call, "stats")) {
            pack_stats(reply_result(&r, id));
        } else {
            reply_error(id, "unsupported", "no such call");
            continue;
        }
        reply_send(&r);
    }
    release();
    msgpack_unpacked_destroy(&u);
    free(buf);
    return 0;
}
