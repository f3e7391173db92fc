/* kv-events-subscriber driver in C: SUB for the live stream (rebuilt after a failed
 * handshake), a DEALER replay client (lazy pirate: rebuilt after a timeout), every
 * batch once, in order. -DBROKEN_DEDUP builds one that lets duplicates through. */
#include "kvdriver.h"

typedef struct { int64_t seq; char *data; size_t len; int ok; } Batch;
typedef struct { Batch *v; size_t n, cap; } Batches;
enum { DELIVERED, DUPLICATES, GARBLED, OTHER_TOPIC, GAPS, REPLAYS, TIMEOUTS, LOST, RESTARTS,
       STRAY, RESUBSCRIBES, NCOUNTS };
static const char *const COUNTS[NCOUNTS] = {"delivered", "duplicates", "garbled", "other_topic",
    "gaps", "replays", "replay_timeouts", "lost", "restarts", "stray_answers", "resubscribes"};

static struct {
    void *ctx, *sub, *monitor, *dealer;
    char topic[256], endpoint[256], replay_endpoint[256];
    int64_t replay_timeout, resync_idle, resubscribe_at;
    int attempts, failed, replaying, hb, hbt, handshaken, sub_failed, monitors;
    int64_t last, last_live;   /* last seq delivered or consumed; last seq seen live */
    Batches held, out;         /* waiting behind a gap; deliverable this poll */
    int64_t covers, activity, traffic; /* newest live seq when the replay left; timers */
    long count[NCOUNTS];
} S;

static Batch *append(Batches *b) {
    if (b->n == b->cap && !(b->v = realloc(b->v, (b->cap = 2 * b->cap + 64) * sizeof *b->v)))
        abort();
    return &b->v[b->n++];
}
static void clear(Batches *b) { while (b->n) free(b->v[--b->n].data); }

static int held_find(int64_t seq) {
    for (size_t i = 0; i < S.held.n; i++) if (S.held.v[i].seq == seq) return (int)i;
    return -1;
}

/* Deliver held batches while they continue the sequence. */
static void flush(void) {
    for (int i; (i = held_find(S.last + 1)) >= 0;) {
        Batch b = S.held.v[i];
        S.held.v[i] = S.held.v[--S.held.n];
        S.last = b.seq;
        if (b.ok) *append(&S.out) = b, S.count[DELIVERED]++; else free(b.data);
    }
}

/* Declare seqs missing up to upto (NONE: everything held back) lost, deliver past them. */
static void give_up(int64_t upto) {
    while (S.held.n) {
        int64_t first = S.held.v[0].seq;
        for (size_t i = 1; i < S.held.n; i++) if (S.held.v[i].seq < first) first = S.held.v[i].seq;
        int64_t limit = upto == NONE || first - 1 < upto ? first - 1 : upto;
        if (limit > S.last) S.count[LOST] += limit - S.last, S.last = limit;
        if (S.last + 1 != first) return;
        flush();
    }
}

static void hold(int64_t seq, const char *data, size_t len) {
    msgpack_sbuffer sb = {0, NULL, 0}; /* the batch as the application gets it */
    Batch b = {seq, NULL, 0, batch_ok(data, len, &sb)};
    b.data = sb.data, b.len = sb.size;
    if (seq <= S.last || held_find(seq) >= 0) {
#ifdef BROKEN_DEDUP
        if (b.ok) *append(&S.out) = b, b.data = NULL; /* hands the copy on again */
#endif
        S.count[DUPLICATES]++, free(b.data);
        return;
    }
    if (!b.ok) S.count[GARBLED]++; /* a garbled payload still consumes its seq */
    *append(&S.held) = b;
    flush();
}
static void drop_dealer(void) { if (S.dealer) zmq_close(S.dealer), S.dealer = NULL; }

static void request_replay(void) {
    if (!S.dealer) {
        S.dealer = zmq_socket(S.ctx, ZMQ_DEALER);
        opt(S.dealer, ZMQ_LINGER, 0), opt(S.dealer, ZMQ_RECONNECT_IVL, 100);
        zmq_connect(S.dealer, S.replay_endpoint);
    }
    unsigned char start[8]; /* [b"", last + 1] */
    put_be64(start, S.last + 1);
    S.replaying = 1, S.activity = now_ms(), S.count[REPLAYS]++;
    S.covers = S.last_live != NONE ? S.last_live : S.last;
    zmq_send(S.dealer, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(S.dealer, start, 8, ZMQ_DONTWAIT); /* unsent: the timeout retries */
}

/* A live seq at or below the last live one: a new publisher incarnation. */
static void restarted(void) {
    S.count[RESTARTS]++, give_up(NONE), drop_dealer();
    S.replaying = 0, S.failed = 0, S.last = -1, S.last_live = NONE;
}

static void on_live(zmq_msg_t *p, int n) {
    size_t tlen = strlen(S.topic);
    int64_t seq = n == 3 && zmq_msg_size(&p[1]) == 8 ? be64(zmq_msg_data(&p[1])) : -1;
    if (seq < 0) { S.count[GARBLED]++; return; } /* frame count; short, long, >= 2**63 seq */
    int other = tlen && (zmq_msg_size(&p[0]) != tlen || memcmp(zmq_msg_data(&p[0]), S.topic, tlen));
    if (other) { S.count[OTHER_TOPIC]++; return; }
    S.traffic = now_ms();
    if (S.last_live != NONE && seq <= S.last_live) restarted();
    else if (S.last == NONE) S.last = seq - 1; /* join the stream where it is */
    S.last_live = seq;
    hold(seq, zmq_msg_data(&p[2]), zmq_msg_size(&p[2]));
    if (S.held.n && !S.replaying) { S.count[GAPS]++; request_replay(); }
}

/* [b"", seq, payload] (seq-payload) or [b"", topic, seq, payload] (topic-seq-payload). */
static void on_answer(zmq_msg_t *p, int n) {
    if (!S.replaying) { S.count[STRAY]++; return; }
    zmq_msg_t *seqf = &p[n == 4 ? 2 : 1];
    int bad = (n != 3 && n != 4) || zmq_msg_size(&p[0]) || zmq_msg_size(seqf) != 8;
    if (bad) { S.count[GARBLED]++; return; }
    S.activity = now_ms();
    int64_t seq = be64(zmq_msg_data(seqf)); /* signed: the end marker is -1 */
    if (seq == -1) {
        S.replaying = 0, S.failed = 0, give_up(S.covers);
        if (S.held.n) request_replay(); /* more went missing after the request left */
    } else if (seq < 0) {
        S.count[GARBLED]++;
    } else {
        hold(seq, zmq_msg_data(&p[n - 1]), zmq_msg_size(&p[n - 1]));
    }
}

/* Up to 1024 messages a turn: one poll() reply carries many (fewer round trips). */
static void read_socket(void *sock, void (*handle)(zmq_msg_t *, int)) {
    zmq_msg_t parts[MAX_PARTS];
    for (int i = 0, n; i < 1024 && sock && (n = recv_parts(sock, parts)) >= 0; i++) {
        handle(parts, n);
        close_parts(parts, n);
        if (sock != S.sub && sock != S.dealer) return; /* the dealer was rebuilt */
    }
}

static void timers(int64_t now) {
    if (S.replaying) {
        if (now - S.activity < S.replay_timeout) return;
        S.count[TIMEOUTS]++, S.replaying = 0, S.failed++, drop_dealer(); /* lazy pirate */
        if (S.failed >= S.attempts) { S.failed = 0; give_up(NONE); }
        if (S.held.n) request_replay(); else S.failed = 0;
    } else if (S.resync_idle && S.last != NONE && now - S.traffic >= S.resync_idle) {
        S.traffic = now, request_replay();
    }
}

/* The SUB socket, options set before connect(), and the PAIR reading its events. */
static int open_sub(void) {
    char monitor[64];
    S.sub = zmq_socket(S.ctx, ZMQ_SUB), S.monitor = zmq_socket(S.ctx, ZMQ_PAIR);
    /* No receive limit: libzmq 4.3 aborts on a reset of a full, heartbeated pipe. */
    opt(S.sub, ZMQ_RCVHWM, 0), opt(S.sub, ZMQ_LINGER, 0), opt(S.sub, ZMQ_RECONNECT_IVL, 100);
    if (S.hb) opt(S.sub, ZMQ_HEARTBEAT_IVL, S.hb), opt(S.sub, ZMQ_HEARTBEAT_TIMEOUT, S.hbt);
    zmq_setsockopt(S.sub, ZMQ_SUBSCRIBE, S.topic, strlen(S.topic));
    snprintf(monitor, sizeof monitor, "inproc://sub-monitor-%d", ++S.monitors); /* never reused */
    zmq_socket_monitor(S.sub, monitor, ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED
                                       | ZMQ_EVENT_HANDSHAKE_SUCCEEDED);
    opt(S.monitor, ZMQ_LINGER, 0), zmq_connect(S.monitor, monitor);
    return zmq_connect(S.sub, S.endpoint);
}

static void close_sub(void) { /* the monitored socket first: the other order can hang */
    if (S.sub) zmq_socket_monitor(S.sub, NULL, 0), zmq_close(S.sub), zmq_close(S.monitor);
}

/* A connection that ended before its handshake succeeded may have ended libzmq's session
 * for good (an impostor's garbage: no reconnect, EVS-11): rebuild the SUB, once per 100 ms. */
static void watch_sub(void) {
    zmq_msg_t p[MAX_PARTS];
    for (int n; (n = recv_parts(S.monitor, p)) >= 0; close_parts(p, n)) {
        uint16_t event; /* frame 1: the event (native 16 bits), then its value */
        memcpy(&event, zmq_msg_data(&p[0]), sizeof event);
        if (event == ZMQ_EVENT_DISCONNECTED && !S.handshaken) S.sub_failed = 1;
        S.handshaken = event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED;
    }
    if (!S.sub_failed || now_ms() < S.resubscribe_at) return;
    S.sub_failed = 0, S.resubscribe_at = now_ms() + 100, S.count[RESUBSCRIBES]++;
    close_sub(), open_sub();
}

static const char *sub_open(const msgpack_object *a) {
    if (!mp_text(mp_get(a, "endpoint"), S.endpoint, sizeof S.endpoint)
        || !mp_text(mp_get(a, "replay_endpoint"), S.replay_endpoint, sizeof S.replay_endpoint)
        || !mp_text(mp_get(a, "topic"), S.topic, sizeof S.topic))
        return "endpoint, replay_endpoint and topic must be strings under 256 bytes";
    S.replay_timeout = mp_int(mp_get(a, "replay_timeout_ms"), 1000);
    S.attempts = 3, S.resync_idle = 1000; /* a gap is lost after 3 tries; resync after 1 s quiet */
    S.hb = (int)mp_int(mp_get(a, "heartbeat_ivl_ms"), 500);
    S.hbt = (int)mp_int(mp_get(a, "heartbeat_timeout_ms"), 1500);
    if (S.replay_timeout < 1 || S.hb < 0 || S.hbt < 0)
        return "replay_timeout_ms must be >= 1, heartbeat_ivl_ms and heartbeat_timeout_ms >= 0";
    S.hbt = S.hbt ? S.hbt : S.hb, S.last = S.last_live = NONE, S.traffic = now_ms();
    S.ctx = zmq_ctx_new();
    return open_sub() ? zmq_strerror(zmq_errno()) : NULL;
}

/* Poll up to timeout_ms; the deliverable batches are left in S.out. */
static void sub_poll(int64_t timeout_ms) {
    int64_t deadline = now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    clear(&S.out);
    for (;;) {
        watch_sub();
        read_socket(S.sub, on_live);
        read_socket(S.dealer, on_answer);
        int64_t now = now_ms();
        timers(now);
        if (S.out.n || now >= deadline) return;
        int64_t wake = S.replaying ? S.activity + S.replay_timeout
                       : S.resync_idle && S.last != NONE ? S.traffic + S.resync_idle : deadline;
        zmq_pollitem_t items[2] = {{S.sub, 0, ZMQ_POLLIN, 0}, {S.dealer, 0, ZMQ_POLLIN, 0}};
        zmq_poll(items, S.dealer ? 2 : 1, (long)((wake < deadline ? wake : deadline) - now) + 1);
    }
}

static void release(void) { /* close: both sockets, the context, every buffer */
    drop_dealer(), close_sub();
    if (S.ctx) zmq_ctx_term(S.ctx);
    clear(&S.held), clear(&S.out), free(S.held.v), free(S.out.v);
    memset(&S, 0, sizeof S);
}

static int64_t handles; /* the last handle issued; S.ctx is set while it is open */

static const char *dispatch(const msgpack_object *call, int64_t h, const msgpack_object *args,
                            msgpack_packer *pk, const char **message) {
    if (h == 0 && mp_is(call, "subscriber")) {
        if (S.ctx) return *message = "one subscriber per process at a time", "invalid";
        if ((*message = sub_open(args))) { release(); return "invalid"; }
        msgpack_pack_map(pk, 1), pk_str(pk, "handle"), msgpack_pack_int64(pk, ++handles);
    } else if (h < 1 || h > handles) {
        return *message = "no such handle", "invalid";
    } else if (mp_is(call, "close")) {
        if (h == handles) release();
        msgpack_pack_nil(pk);
    } else if (h != handles || !S.ctx) {
        return *message = "the subscriber is closed", "closed";
    } else if (mp_is(call, "poll")) {
        sub_poll(mp_int(mp_get(args, "timeout_ms"), 0));
        msgpack_pack_array(pk, S.out.n);
        for (size_t i = 0; i < S.out.n; i++) { /* [seq, batch], the batch packed by hold() */
            msgpack_pack_array(pk, 2), msgpack_pack_int64(pk, S.out.v[i].seq);
            msgpack_sbuffer_write(pk->data, S.out.v[i].data, S.out.v[i].len);
        }
        clear(&S.out);
    } else if (mp_is(call, "stats")) {
        msgpack_pack_map(pk, NCOUNTS);
        for (int i = 0; i < NCOUNTS; i++) pk_str(pk, COUNTS[i]), msgpack_pack_long(pk, S.count[i]);
    } else {
        return *message = "no such call", "unsupported";
    }
    return NULL;
}

int main(void) {
    static const char *const options[] = {"replay_timeout_ms", "heartbeat_ivl_ms",
                                          "heartbeat_timeout_ms", NULL};
    int status = serve("kv-events-subscriber", options, dispatch, NULL);
    return release(), status;
}
