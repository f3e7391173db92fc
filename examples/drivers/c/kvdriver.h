/* What both C drivers share: time, MessagePack values, the KVEventBatch
 * schema check, zmq multipart reads and the driver protocol's framing. */
#ifndef KVDRIVER_H
#define KVDRIVER_H
#include <msgpack.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#define NONE INT64_MIN
#define MAX_PARTS 5

static int64_t now_ms(void) {
    struct timespec t;
    return clock_gettime(CLOCK_MONOTONIC, &t), (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* --- MessagePack values -------------------------------------------------- */
static int mp_is(const msgpack_object *o, const char *s) {
    size_t n = strlen(s);
    return o && o->type == MSGPACK_OBJECT_STR && o->via.str.size == n
           && !memcmp(o->via.str.ptr, s, n);
}

static msgpack_object *mp_get(const msgpack_object *m, const char *key) {
    if (!m || m->type != MSGPACK_OBJECT_MAP) return NULL;
    for (uint32_t i = 0; i < m->via.map.size; i++)
        if (mp_is(&m->via.map.ptr[i].key, key)) return &m->via.map.ptr[i].val;
    return NULL;
}

static int mp_is_int(const msgpack_object *o) {
    return o && (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER
                 || o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER);
}
static int64_t mp_int(const msgpack_object *o, int64_t d) { return mp_is_int(o) ? o->via.i64 : d; }

/* A string argument copied into buf; 0 if absent, not a string or too long. */
static int mp_text(const msgpack_object *o, char *buf, size_t cap) {
    if (!o || o->type != MSGPACK_OBJECT_STR || o->via.str.size >= cap) return 0;
    memcpy(buf, o->via.str.ptr, o->via.str.size), buf[o->via.str.size] = 0;
    return 1;
}

static void opt(void *s, int option, int v) { zmq_setsockopt(s, option, &v, sizeof v); }
static void pk_str(msgpack_packer *pk, const char *s) {
    msgpack_pack_str_with_body(pk, s, strlen(s));
}

/* --- the KVEventBatch schema (map or array encoding, newer fields ignored) - */
/* Field kinds: H list of hashes, h hash or nil, I list of ints, i int,
 * j int or nil, s str or nil. A hash is an int or bytes. */
static int kind_ok(char kind, const msgpack_object *o) {
    int nil = o->type == MSGPACK_OBJECT_NIL;
    switch (kind) {
    case 'h': if (nil) return 1; /* fall through */
    case '#': return mp_is_int(o) || o->type == MSGPACK_OBJECT_BIN;
    case 'j': if (nil) return 1; /* fall through */
    case 'i': return mp_is_int(o);
    case 's': return nil || o->type == MSGPACK_OBJECT_STR;
    case 'H': case 'I':
        if (o->type != MSGPACK_OBJECT_ARRAY) return 0;
        for (uint32_t i = 0; i < o->via.array.size; i++)
            if (!kind_ok(kind == 'H' ? '#' : 'i', &o->via.array.ptr[i])) return 0;
        return 1;
    }
    return 0;
}

static const struct { const char *tag, *kinds; int required; const char *names[7]; } EVENTS[] = {
    {"BlockStored", "HhIijss", 6, {"block_hashes", "parent_block_hash", "token_ids",
                                   "block_size", "lora_id", "medium", "lora_name"}},
    {"BlockRemoved", "Hs", 2, {"block_hashes", "medium"}},
    {"AllBlocksCleared", "", 0, {0}},
};

/* 1: a known event, as the schema says; -1: a type this driver does not know (a
 * newer producer's, dropped from the batch); 0: garbage. */
static int event_ok(const msgpack_object *e) {
    int is_map = e->type == MSGPACK_OBJECT_MAP;
    if (!is_map && (e->type != MSGPACK_OBJECT_ARRAY || e->via.array.size == 0)) return 0;
    const msgpack_object *tag = is_map ? mp_get(e, "type") : &e->via.array.ptr[0];
    if (!tag || tag->type != MSGPACK_OBJECT_STR) return 0;
    for (size_t t = 0; t < sizeof EVENTS / sizeof EVENTS[0]; t++) {
        if (!mp_is(tag, EVENTS[t].tag)) continue;
        for (int f = 0; EVENTS[t].kinds[f]; f++) {
            const msgpack_object *v = is_map ? mp_get(e, EVENTS[t].names[f])
                : (uint32_t)f + 1 < e->via.array.size ? &e->via.array.ptr[f + 1] : NULL;
            if (v ? !kind_ok(EVENTS[t].kinds[f], v) : f < EVENTS[t].required) return 0;
        }
        return 1;
    }
    return -1;
}

/* Whether payload is exactly one KVEventBatch: {ts, events, data_parallel_rank?}
 * as a map, or [ts, events, data_parallel_rank?] as an array. If it is and clean
 * is given, the batch is packed into it without its events of unknown types. */
static int batch_ok(const char *payload, size_t len, msgpack_sbuffer *clean) {
    msgpack_unpacked u;
    msgpack_packer pk;
    size_t off = 0;
    int ok = 0;
    msgpack_unpacked_init(&u);
    if (msgpack_unpack_next(&u, payload, len, &off) == MSGPACK_UNPACK_SUCCESS && off == len) {
        msgpack_object *b = &u.data, *ts = NULL, *ev = NULL, *dp = NULL, *kept;
        if (b->type == MSGPACK_OBJECT_MAP) {
            ts = mp_get(b, "ts"), ev = mp_get(b, "events"), dp = mp_get(b, "data_parallel_rank");
        } else if (b->type == MSGPACK_OBJECT_ARRAY && b->via.array.size >= 2) {
            ts = &b->via.array.ptr[0], ev = &b->via.array.ptr[1];
            dp = b->via.array.size > 2 ? &b->via.array.ptr[2] : NULL;
        }
        ok = ts && ev && (mp_is_int(ts) || ts->type == MSGPACK_OBJECT_FLOAT64
                          || ts->type == MSGPACK_OBJECT_FLOAT32)
             && ev->type == MSGPACK_OBJECT_ARRAY && (!dp || kind_ok('j', dp));
        kept = ok ? ev->via.array.ptr : NULL; /* known events, moved down in place */
        for (uint32_t i = 0; ok && i < ev->via.array.size; i++) /* ok: -1 past unknown ones */
            if ((ok = event_ok(&ev->via.array.ptr[i])) > 0) *kept++ = ev->via.array.ptr[i];
        ok = ok && !(ev->via.array.size && kept == ev->via.array.ptr); /* all unknown: garbled */
        if (ok && clean) {
            ev->via.array.size = (uint32_t)(kept - ev->via.array.ptr);
            msgpack_packer_init(&pk, clean, msgpack_sbuffer_write);
            msgpack_pack_object(&pk, *b);
        }
    }
    msgpack_unpacked_destroy(&u);
    return ok != 0;
}

/* --- zmq ----------------------------------------------------------------- */
/* One multipart message without blocking: the frame count (frames past
 * MAX_PARTS are counted, not kept), or -1 when nothing is waiting. */
static int recv_parts(void *sock, zmq_msg_t *parts) {
    int n = 0, more = 1;
    for (; more; n++) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, sock, n ? 0 : ZMQ_DONTWAIT) < 0) { zmq_msg_close(&m); return -1; }
        more = zmq_msg_more(&m);
        if (n < MAX_PARTS) parts[n] = m; else zmq_msg_close(&m);
    }
    return n;
}

static void close_parts(zmq_msg_t *p, int n) {
    for (int i = 0; i < n && i < MAX_PARTS; i++) zmq_msg_close(&p[i]);
}

static int64_t be64(const void *p) { /* an 8-byte big-endian seq frame, signed */
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = v << 8 | ((const unsigned char *)p)[i];
    return (int64_t)v;
}

static void put_be64(unsigned char *b, int64_t seq) {
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)seq >> (56 - 8 * i));
}

/* --- driver protocol framing: 4-byte big-endian length, then MessagePack -- */
/* The next request from stdin into u (its buffer in *buf); 0 at end of input. */
static int read_request(msgpack_unpacked *u, char **buf) {
    unsigned char h[4];
    size_t off = 0, len;
    if (fread(h, 1, 4, stdin) != 4) return 0;
    len = (size_t)h[0] << 24 | (size_t)h[1] << 16 | (size_t)h[2] << 8 | h[3];
    free(*buf);
    if (!(*buf = malloc(len + 1)) || fread(*buf, 1, len, stdin) != len) return 0;
    return msgpack_unpack_next(u, *buf, len, &off) == MSGPACK_UNPACK_SUCCESS;
}

static void write_reply(const msgpack_sbuffer *sb) {
    unsigned char h[4] = {(unsigned char)(sb->size >> 24), (unsigned char)(sb->size >> 16),
                          (unsigned char)(sb->size >> 8), (unsigned char)sb->size};
    if (fwrite(h, 1, 4, stdout) != 4 || fwrite(sb->data, 1, sb->size, stdout) != sb->size
        || fflush(stdout) != 0) exit(3); /* the suite is gone */
}

/* --- driver protocol version 1 (docs/drivers.md) ---------------------------- */
static void pk_pair(msgpack_packer *p, const char *k, const char *v) { pk_str(p, k), pk_str(p, v); }

/* A contract's calls: pack the result and return NULL, or return an error kind
 * (and set *message). Handle 0 is the driver itself (constructors). */
typedef const char *(*Dispatch)(const msgpack_object *call, int64_t handle,
                                const msgpack_object *args, msgpack_packer *pk, const char **why);

static void reply_head(msgpack_packer *pk, int64_t id, const char *key) {
    msgpack_sbuffer_clear(pk->data);
    msgpack_pack_map(pk, 2), pk_str(pk, "id"), msgpack_pack_int64(pk, id), pk_str(pk, key);
}

/* The driver: answer the hello, then serve requests until stdin ends; idle()
 * (if any) runs until the next request is readable. Returns the exit status. */
static int serve(const char *contract, const char *const *options, Dispatch dispatch,
                 void (*idle)(void)) {
    msgpack_unpacked u;
    msgpack_sbuffer sb;
    msgpack_packer pk;
    char *buf = NULL, why[128];
    int n = 0;
    msgpack_unpacked_init(&u), msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    if (!read_request(&u, &buf)) return 2;
    if (!mp_is(mp_get(&u.data, "contract"), contract)) {
        snprintf(why, sizeof why, "this driver implements %s only", contract);
        msgpack_pack_map(&pk, 3), pk_pair(&pk, "type", "error");
        pk_pair(&pk, "kind", "unsupported"), pk_pair(&pk, "message", why);
        return write_reply(&sb), 2;
    }
    msgpack_pack_map(&pk, 6), pk_pair(&pk, "type", "hello"), pk_pair(&pk, "contract", contract);
    pk_str(&pk, "protocol"), msgpack_pack_int(&pk, 1);
    pk_pair(&pk, "implementation", "zmq-conformance C example (libzmq, msgpack-c)");
    pk_str(&pk, "capabilities"), msgpack_pack_map(&pk, 2), pk_pair(&pk, "encoding", "map");
    pk_str(&pk, "heartbeat_configurable"), msgpack_pack_true(&pk);
    while (options[n]) n++;
    pk_str(&pk, "options"), msgpack_pack_array(&pk, (size_t)n);
    for (int i = 0; i < n; i++) pk_str(&pk, options[i]);
    write_reply(&sb);
    for (;;) {
        if (idle) idle();
        if (!read_request(&u, &buf)) break;
        const msgpack_object *q = &u.data;
        const char *message = "";
        int64_t id = mp_int(mp_get(q, "id"), 0);
        reply_head(&pk, id, "result");
        const char *kind = dispatch(mp_get(q, "call"), mp_int(mp_get(q, "handle"), -1),
                                    mp_get(q, "args"), &pk, &message);
        if (kind) {
            reply_head(&pk, id, "error"), msgpack_pack_map(&pk, 2);
            pk_pair(&pk, "kind", kind), pk_pair(&pk, "message", message);
        }
        write_reply(&sb);
    }
    msgpack_unpacked_destroy(&u), msgpack_sbuffer_destroy(&sb), free(buf);
    return 0;
}
#endif
