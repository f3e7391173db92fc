/* kv-events-publisher driver in C: PUB [topic, seq, payload] and a replay
 * ROUTER with ZMQ_ROUTER_MANDATORY, served from the driver's one loop
 * between the suite's calls. publish() sends at once and never blocks; publish_many
 * (a burst in one request) is the same publish() for each batch.
 * Build with -DBROKEN_REPLAY_OFF_BY_ONE for a replay that starts one late. */
#include "kvdriver.h"

#define MAX_JOBS 256
#define SLICE 512

typedef struct {
    unsigned char id[256];
    size_t id_len;
    int64_t next, end, progress; /* next seq to send, first seq not to send */
} Job;

static struct {
    void *ctx, *pub, *router;
    char topic[256];
    int64_t steps, next_seq, stall, shutdown_ms;
    char **kept;      /* payload of seq s at kept[s % steps] */
    size_t *kept_len;
    Job jobs[MAX_JOBS];
    int njobs, closed;
    long published, served, abandoned, bad;
} P;

static void set_heartbeat(void *s, int ivl, int timeout) {
    if (ivl) opt(s, ZMQ_HEARTBEAT_IVL, ivl), opt(s, ZMQ_HEARTBEAT_TIMEOUT, timeout),
             opt(s, ZMQ_HEARTBEAT_TTL, timeout);
}

static const char *pub_open(const msgpack_object *a) {
    char endpoint[256], replay[256];
    if (!mp_text(mp_get(a, "endpoint"), endpoint, sizeof endpoint)
        || !mp_text(mp_get(a, "replay_endpoint"), replay, sizeof replay)
        || !mp_text(mp_get(a, "topic"), P.topic, sizeof P.topic))
        return "endpoint, replay_endpoint and topic must be strings under 256 bytes";
    P.steps = mp_int(mp_get(a, "buffer_steps"), 10000);
    P.stall = mp_int(mp_get(a, "replay_stall_timeout_ms"), 5000);
    P.shutdown_ms = mp_int(mp_get(a, "shutdown_timeout_ms"), 2000);
    int hwm = (int)mp_int(mp_get(a, "sndhwm"), 100000);
    int hb = (int)mp_int(mp_get(a, "heartbeat_ivl_ms"), 1000);
    int hbt = (int)mp_int(mp_get(a, "heartbeat_timeout_ms"), 3000);
    if (P.steps < 1 || P.stall < 1 || P.shutdown_ms < 1 || hwm < 0 || hb < 0 || hbt < 0)
        return "buffer_steps, replay_stall_timeout_ms and shutdown_timeout_ms must be >= 1";
    P.kept = calloc((size_t)P.steps, sizeof *P.kept);
    P.kept_len = calloc((size_t)P.steps, sizeof *P.kept_len);
    if (!P.kept || !P.kept_len) return "out of memory for buffer_steps";
    P.ctx = zmq_ctx_new();
    P.pub = zmq_socket(P.ctx, ZMQ_PUB);
    P.router = zmq_socket(P.ctx, ZMQ_ROUTER);
    opt(P.pub, ZMQ_SNDHWM, hwm);
    /* A full reader makes a send fail (EAGAIN) instead of dropping it. */
    opt(P.router, ZMQ_ROUTER_MANDATORY, 1);
    for (int i = 0; i < 2; i++) {
        void *s = i ? P.router : P.pub;
        opt(s, ZMQ_LINGER, 0);
        set_heartbeat(s, hb, hbt ? hbt : hb);
        if (zmq_bind(s, i ? replay : endpoint) != 0) {
            static char why[300];
            snprintf(why, sizeof why, "bind %s: %s", i ? replay : endpoint,
                     zmq_strerror(zmq_errno()));
            zmq_close(P.pub), zmq_close(P.router), zmq_ctx_term(P.ctx);
            P.ctx = NULL;
            return why;
        }
    }
    return NULL;
}

/* Number, send and retain one payload. Never blocks: PUB sheds per subscriber at its HWM. */
static void pub_publish(const char *payload, size_t len) {
    unsigned char seq[8];
    put_be64(seq, P.next_seq);
    zmq_send(P.pub, P.topic, strlen(P.topic), ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(P.pub, seq, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(P.pub, payload, len, ZMQ_DONTWAIT);
    size_t slot = (size_t)(P.next_seq % P.steps);
    free(P.kept[slot]);
    P.kept[slot] = malloc(len ? len : 1);
    if (!P.kept[slot]) abort();
    memcpy(P.kept[slot], payload, len);
    P.kept_len[slot] = len;
    P.next_seq++, P.published++;
}

static int64_t oldest(void) { return P.next_seq > P.steps ? P.next_seq - P.steps : 0; }

static void drop_job(int i) { P.jobs[i] = P.jobs[--P.njobs]; }

static void read_requests(void) {
    zmq_msg_t p[MAX_PARTS];
    for (int k = 0, n; k < 256 && (n = recv_parts(P.router, p)) >= 0; k++) {
        if (n != 3 || zmq_msg_size(&p[1]) != 0 || zmq_msg_size(&p[2]) != 8
            || zmq_msg_size(&p[0]) > sizeof P.jobs[0].id) {
            P.bad++;
            close_parts(p, n);
            continue;
        }
        int64_t start = be64(zmq_msg_data(&p[2]));
#ifdef BROKEN_REPLAY_OFF_BY_ONE
        start++;
#endif
        for (int i = 0; i < P.njobs; i++) /* a new request replaces that socket's last */
            if (P.jobs[i].id_len == zmq_msg_size(&p[0])
                && !memcmp(P.jobs[i].id, zmq_msg_data(&p[0]), P.jobs[i].id_len)) drop_job(i);
        if (P.njobs == MAX_JOBS) { drop_job(0); P.abandoned++; }
        Job *j = &P.jobs[P.njobs++];
        j->id_len = zmq_msg_size(&p[0]);
        memcpy(j->id, zmq_msg_data(&p[0]), j->id_len);
        /* From the oldest retained at most; a start past the newest (read unsigned,
         * as the request is) gets the end marker alone. */
        uint64_t from = (uint64_t)start, newest = (uint64_t)P.next_seq;
        j->next = from > newest ? P.next_seq : start < oldest() ? oldest() : start;
        j->end = P.next_seq, j->progress = now_ms();
        close_parts(p, n);
    }
}

/* With ROUTER_MANDATORY only the identity frame can fail; then the message goes out whole. */
static int send_answer(Job *j, const void *seq, const void *payload, size_t len) {
    if (zmq_send(P.router, j->id, j->id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) return zmq_errno();
    zmq_send(P.router, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(P.router, seq, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(P.router, payload, len, ZMQ_DONTWAIT);
    return 0;
}

/* A slice of every job; how long the loop may sleep: 0, 5 ms (a reader is full), -1 (none). */
static long serve_replays(void) {
    static const unsigned char END[8] = {255, 255, 255, 255, 255, 255, 255, 255}; /* -1 */
    long wait = -1;
    int64_t now = now_ms();
    for (int i = P.njobs - 1; i >= 0; i--) {
        Job *j = &P.jobs[i];
        int sent = 0, err = 0;
        while (!err && sent < SLICE && j->next < j->end) {
            if (j->next < oldest()) { err = EHOSTUNREACH; break; } /* evicted: no end marker */
            unsigned char seq[8];
            put_be64(seq, j->next);
            size_t slot = (size_t)(j->next % P.steps);
            if (!(err = send_answer(j, seq, P.kept[slot], P.kept_len[slot]))) j->next++, sent++;
        }
        if (!err && j->next == j->end && sent < SLICE && !(err = send_answer(j, END, "", 0))) {
            P.served++;
            drop_job(i);
            continue;
        }
        if (sent) j->progress = now;
        if (err == EHOSTUNREACH || (err && now - j->progress > P.stall)) {
            P.abandoned++; /* gone, or stalled: abandoned without the end marker */
            drop_job(i);
            continue;
        }
        wait = sent == SLICE ? 0 : wait == 0 ? 0 : 5;
    }
    return wait;
}

static void pub_shutdown(void) {
    int linger = (int)P.shutdown_ms;
    P.abandoned += P.njobs, P.njobs = 0, P.closed = 1;
    zmq_close(P.router);
    /* libzmq gets at most shutdown_timeout_ms to write what PUB still holds. */
    zmq_setsockopt(P.pub, ZMQ_LINGER, &linger, sizeof linger);
    zmq_close(P.pub);
    zmq_ctx_term(P.ctx);
    P.ctx = NULL;
    for (int64_t i = 0; i < P.steps; i++) free(P.kept[i]);
    free(P.kept), free(P.kept_len);
    P.kept = NULL;
}

static void pack_stats(msgpack_packer *pk) {
    const char *names[] = {"published", "dropped", "replays_served", "replays_abandoned",
                           "bad_requests", "undelivered", "retained"};
    long values[] = {P.published, 0, P.served, P.abandoned, P.bad, 0,
                     (long)(P.next_seq - oldest())};
    msgpack_pack_map(pk, 7);
    for (int i = 0; i < 7; i++) { pk_str(pk, names[i]); msgpack_pack_long(pk, values[i]); }
}

/* Serve replays until the suite's next request is readable on stdin. */
static void serve_replays_until_request(void) {
    for (;;) {
        int live = P.ctx && !P.closed;
        long wait = -1;
        if (live) { read_requests(); wait = serve_replays(); }
        zmq_pollitem_t items[2] = {{NULL, 0, ZMQ_POLLIN, 0}, {P.router, 0, ZMQ_POLLIN, 0}};
        zmq_poll(items, live ? 2 : 1, wait);
        if (items[0].revents) return;
    }
}

static int64_t handles; /* the last handle issued */

/* publish(): the batch map re-packed as it came is the payload ("map" encoding). */
static const char *publish(const msgpack_object *batch, const char **message) {
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    if (batch) msgpack_pack_object(&pk, *batch);
    int ok = batch && batch->type == MSGPACK_OBJECT_MAP && batch_ok(sb.data, sb.size, NULL);
    if (ok) pub_publish(sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
    return ok ? NULL : (*message = "batch is not a KVEventBatch map", "invalid");
}

static const char *dispatch(const msgpack_object *call, int64_t h, const msgpack_object *args,
                            msgpack_packer *pk, const char **message) {
    if (h == 0 && mp_is(call, "publisher")) {
        if (P.ctx) return *message = "one publisher per process at a time", "invalid";
        memset(&P, 0, sizeof P);
        if ((*message = pub_open(args)))
            return strstr(*message, "Address already in use") ? "address_in_use" : "invalid";
        msgpack_pack_map(pk, 1), pk_str(pk, "handle"), msgpack_pack_int64(pk, ++handles);
    } else if (h < 1 || h > handles) {
        return *message = "no such handle", "invalid";
    } else if (mp_is(call, "shutdown")) {
        if (h == handles && P.ctx) pub_shutdown();
        msgpack_pack_nil(pk);
    } else if (mp_is(call, "stats")) {
        pack_stats(pk);
    } else if (!mp_is(call, "publish") && !mp_is(call, "publish_many")) {
        return *message = "no such call", "unsupported"; /* publish_copies too: optional */
    } else if (h != handles || !P.ctx) {
        return *message = "publish() after shutdown()", "closed";
    } else if (mp_is(call, "publish")) {
        const char *kind = publish(mp_get(args, "batch"), message);
        if (kind) return kind;
        msgpack_pack_nil(pk);
    } else { /* publish_many: each batch's publish(), back to back; an outcome each */
        const msgpack_object *b = mp_get(args, "batches");
        if (!b || b->type != MSGPACK_OBJECT_ARRAY) return *message = "no batches array", "invalid";
        msgpack_pack_array(pk, b->via.array.size);
        for (uint32_t i = 0; i < b->via.array.size; i++) {
            const char *why = "", *kind = publish(&b->via.array.ptr[i], &why);
            if (!kind) { msgpack_pack_nil(pk); continue; }
            msgpack_pack_map(pk, 2), pk_pair(pk, "kind", kind), pk_pair(pk, "message", why);
        }
    }
    return NULL;
}

int main(void) {
    static const char *const options[] = {"buffer_steps", "shutdown_timeout_ms",
        "replay_stall_timeout_ms", "heartbeat_ivl_ms", "heartbeat_timeout_ms", NULL};
    int status = serve("kv-events-publisher", options, dispatch, serve_replays_until_request);
    if (P.ctx) P.shutdown_ms = 0, pub_shutdown(); /* end of stdin: release at once */
    return status;
}
