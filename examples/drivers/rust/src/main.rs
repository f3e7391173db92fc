//! kv-events-subscriber driver in Rust (zmq-conformance driver protocol 1).
//!
//! SUB for the live stream (rebuilt after a failed handshake) and a DEALER replay
//! client, rebuilt after a timeout (lazy pirate); every batch once, in order.
//! `--features broken-end-marker` builds one that reads the end marker unsigned (EVS-2).
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::time::{Duration, Instant};

// --- MessagePack values, kept as they are (bin stays bin, str stays str) ---------

#[derive(Clone, Debug, PartialEq)]
enum Value {
    Nil,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(String),
    Bin(Vec<u8>),
    Array(Vec<Value>),
    Map(Vec<(Value, Value)>),
}

impl Serialize for Value {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::Nil => s.serialize_unit(),
            Value::Bool(b) => s.serialize_bool(*b),
            Value::Int(i) => s.serialize_i64(*i),
            Value::UInt(u) => s.serialize_u64(*u),
            Value::Float(f) => s.serialize_f64(*f),
            Value::Str(t) => s.serialize_str(t),
            Value::Bin(b) => s.serialize_bytes(b),
            Value::Array(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                items.iter().try_for_each(|v| seq.serialize_element(v))?;
                seq.end()
            }
            Value::Map(pairs) => {
                let mut map = s.serialize_map(Some(pairs.len()))?;
                pairs.iter().try_for_each(|(k, v)| map.serialize_entry(k, v))?;
                map.end()
            }
        }
    }
}

struct AnyValue;

impl<'de> Visitor<'de> for AnyValue {
    type Value = Value;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a MessagePack value")
    }
    fn visit_unit<E>(self) -> Result<Value, E> { Ok(Value::Nil) }
    fn visit_none<E>(self) -> Result<Value, E> { Ok(Value::Nil) }
    fn visit_bool<E>(self, b: bool) -> Result<Value, E> { Ok(Value::Bool(b)) }
    fn visit_i64<E>(self, i: i64) -> Result<Value, E> { Ok(Value::Int(i)) }
    fn visit_u64<E>(self, u: u64) -> Result<Value, E> {
        Ok(i64::try_from(u).map_or(Value::UInt(u), Value::Int))
    }
    fn visit_f64<E>(self, f: f64) -> Result<Value, E> { Ok(Value::Float(f)) }
    fn visit_str<E>(self, s: &str) -> Result<Value, E> { Ok(Value::Str(s.to_owned())) }
    fn visit_bytes<E>(self, b: &[u8]) -> Result<Value, E> { Ok(Value::Bin(b.to_vec())) }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(v) = seq.next_element()? { items.push(v) }
        Ok(Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut pairs = Vec::new();
        while let Some(pair) = map.next_entry()? { pairs.push(pair) }
        Ok(Value::Map(pairs))
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
        d.deserialize_any(AnyValue)
    }
}

impl Value {
    fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Map(pairs) => pairs.iter().find(|(k, _)| k.is_str(key)).map(|(_, v)| v),
            _ => None,
        }
    }
    fn is_str(&self, s: &str) -> bool { matches!(self, Value::Str(t) if t == s) }
    fn is_int(&self) -> bool { matches!(self, Value::Int(_) | Value::UInt(_)) }
    fn int(&self) -> Option<i64> { if let Value::Int(i) = self { Some(*i) } else { None } }
    fn text(&self) -> Option<&str> { if let Value::Str(s) = self { Some(s) } else { None } }
}

fn text(s: &str) -> Value { Value::Str(s.to_owned()) }

fn map(pairs: Vec<(&str, Value)>) -> Value {
    Value::Map(pairs.into_iter().map(|(k, v)| (text(k), v)).collect())
}

/// Exactly one MessagePack value filling `buf`, or `None`.
fn decode(buf: &[u8]) -> Option<Value> {
    let mut d = rmp_serde::Deserializer::new(std::io::Cursor::new(buf));
    let v = Value::deserialize(&mut d).ok()?;
    (d.position() as usize == buf.len()).then_some(v)
}

// --- the KVEventBatch schema: map or array encoding, newer fields ignored -------

/// Field kinds: H hashes, h hash or nil, I ints, i int, j int or nil, s str or nil.
fn kind_ok(kind: u8, v: &Value) -> bool {
    let nil = *v == Value::Nil;
    match kind {
        b'#' => v.is_int() || matches!(v, Value::Bin(_)),
        b'h' => nil || kind_ok(b'#', v),
        b'i' => v.is_int(),
        b'j' => nil || v.is_int(),
        b's' => nil || matches!(v, Value::Str(_)),
        b'H' | b'I' => match v {
            Value::Array(items) => {
                items.iter().all(|x| kind_ok(if kind == b'H' { b'#' } else { b'i' }, x))
            }
            _ => false,
        },
        _ => false,
    }
}

const EVENTS: [(&str, &str, usize, &[&str]); 3] = [
    ("BlockStored", "HhIijss", 6, &["block_hashes", "parent_block_hash", "token_ids", "block_size",
                                    "lora_id", "medium", "lora_name"]),
    ("BlockRemoved", "Hs", 2, &["block_hashes", "medium"]),
    ("AllBlocksCleared", "", 0, &[]),
];

/// Some(true): a known event, as the schema says; Some(false): a type this driver
/// does not know (a newer producer's: dropped from the batch); None: garbage.
fn event_ok(e: &Value) -> Option<bool> {
    let (tag, fields): (Option<&Value>, Vec<Option<&Value>>) = match e {
        Value::Map(_) => (e.get("type"), Vec::new()),
        Value::Array(items) if !items.is_empty() => {
            (items.first(), items[1..].iter().map(Some).collect())
        }
        _ => return None,
    };
    let tag = tag.and_then(Value::text)?;
    let &(_, kinds, required, names) = match EVENTS.iter().find(|ev| ev.0 == tag) {
        Some(ev) => ev,
        None => return Some(false),
    };
    let ok = kinds.bytes().enumerate().all(|(f, kind)| {
        let v = if matches!(e, Value::Map(_)) { e.get(names[f]) }
                else { fields.get(f).copied().flatten() };
        v.map_or(f >= required, |v| kind_ok(kind, v))
    });
    ok.then_some(true)
}

/// The payload decoded, if it is one KVEventBatch ({ts, events, data_parallel_rank?}
/// as a map, or [ts, events, data_parallel_rank?] as an array), without the events
/// of unknown types.
fn batch(payload: &[u8]) -> Option<Value> {
    let mut b = decode(payload)?;
    let (ts, events, rank) = match &b {
        Value::Map(_) => (b.get("ts")?, b.get("events")?, b.get("data_parallel_rank")),
        Value::Array(items) if items.len() >= 2 => (&items[0], &items[1], items.get(2)),
        _ => return None,
    };
    let events = match events { Value::Array(events) => events, _ => return None };
    let known: Vec<bool> = events.iter().map(event_ok).collect::<Option<_>>()?;
    if !known.is_empty() && !known.contains(&true) {
        return None; // only events of unknown types: garbled
    }
    if !(ts.is_int() || matches!(ts, Value::Float(_))) || !rank.map_or(true, |r| kind_ok(b'j', r)) {
        return None;
    }
    let kept = events.iter().zip(&known).filter(|(_, k)| **k).map(|(e, _)| e.clone());
    let kept = Value::Array(kept.collect());
    match &mut b {
        Value::Map(pairs) => pairs.iter_mut().filter(|(k, _)| k.is_str("events"))
            .for_each(|(_, v)| *v = kept.clone()),
        Value::Array(items) => items[1] = kept,
        _ => {}
    }
    Some(b)
}

// --- the subscriber --------------------------------------------------------------

use zmq::SocketEvent as Event;
const RECONNECT_IVL: Duration = Duration::from_millis(100);

/// The SUB socket, every option set before connect(), and the PAIR reading its events.
/// No receive limit: libzmq 4.3 aborts on a reset of a full, heartbeated pipe.
fn open_sub(ctx: &zmq::Context, endpoint: &str, topic: &[u8], (hb, hbt): (i64, i64))
            -> zmq::Result<(zmq::Socket, zmq::Socket)> {
    static MONITORS: AtomicU32 = AtomicU32::new(0); // monitor addresses are never reused
    let (sub, monitor) = (ctx.socket(zmq::SUB)?, ctx.socket(zmq::PAIR)?);
    sub.set_rcvhwm(0).and(sub.set_linger(0))?;
    sub.set_reconnect_ivl(RECONNECT_IVL.as_millis() as i32)?;
    if hb > 0 { sub.set_heartbeat_ivl(hb as i32).and(sub.set_heartbeat_timeout(hbt as i32))?; }
    let address = format!("inproc://sub-monitor-{}", MONITORS.fetch_add(1, Relaxed));
    let events = Event::CONNECTED as i32 | Event::DISCONNECTED as i32;
    let events = events | Event::HANDSHAKE_SUCCEEDED as i32;
    sub.set_subscribe(topic).and(sub.monitor(&address, events)).and(monitor.set_linger(0))?;
    monitor.connect(&address).and(sub.connect(endpoint)).map(|_| (sub, monitor))
}

/// One multipart message, if one is waiting.
fn recv(sock: Option<&zmq::Socket>) -> Option<Vec<Vec<u8>>> {
    sock?.recv_multipart(zmq::DONTWAIT).ok()
}

struct Replay { covers: i64, activity: Instant }

struct Subscriber {
    ctx: zmq::Context,
    sub: zmq::Socket,
    monitor: zmq::Socket, // the SUB's connection events (see watch_sub)
    dealer: Option<zmq::Socket>,
    topic: Vec<u8>,
    endpoint: String, heartbeat: (i64, i64), // where and how the SUB connects, to rebuild it
    handshaken: bool, sub_failed: bool, resubscribe_at: Instant, // see watch_sub
    replay_endpoint: String,
    replay_timeout: Duration, resync_idle: Duration, // a replay's patience; the idle resync
    attempts: u32, failed: u32, // replay attempts before a gap is lost; failed so far
    last: Option<i64>,      // last seq delivered or consumed
    last_live: Option<i64>, // last seq seen live
    held: BTreeMap<i64, Option<Value>>, // behind a gap; None: garbled, consumes its seq
    out: Vec<(i64, Value)>,
    replay: Option<Replay>,
    traffic: Instant,
    stats: BTreeMap<&'static str, i64>,
}

impl Subscriber {
    fn open(args: &Value) -> Result<Subscriber, String> {
        let arg = |k| args.get(k).and_then(Value::text).ok_or(format!("{k} must be a string"));
        let ms = |k, d| args.get(k).and_then(Value::int).unwrap_or(d);
        let (endpoint, replay_endpoint) = (arg("endpoint")?, arg("replay_endpoint")?);
        let (topic, timeout) = (arg("topic")?, ms("replay_timeout_ms", 1000));
        let (hb, hbt) = (ms("heartbeat_ivl_ms", 500), ms("heartbeat_timeout_ms", 1500));
        if timeout < 1 || hb < 0 || hbt < 0 {
            return Err("replay_timeout_ms must be >= 1, heartbeats >= 0".into());
        }
        let ctx = zmq::Context::new();
        let heartbeat = (hb, if hbt > 0 { hbt } else { hb });
        let (sub, monitor) = open_sub(&ctx, endpoint, topic.as_bytes(), heartbeat)
            .map_err(|e| format!("{endpoint}: {e}"))?;
        Ok(Subscriber {
            ctx, sub, monitor, dealer: None, topic: topic.as_bytes().to_vec(),
            endpoint: endpoint.to_owned(), heartbeat, handshaken: false, sub_failed: false,
            resubscribe_at: Instant::now(), replay_endpoint: replay_endpoint.to_owned(),
            replay_timeout: Duration::from_millis(timeout as u64),
            resync_idle: Duration::from_millis(1000), attempts: 3, failed: 0,
            last: None, last_live: None, held: BTreeMap::new(), out: Vec::new(), replay: None,
            traffic: Instant::now(), stats: BTreeMap::new(),
        })
    }

    fn count(&mut self, what: &'static str, n: i64) { *self.stats.entry(what).or_insert(0) += n; }

    /// A connection that ended before its handshake succeeded may have ended libzmq's session
    /// for good (an impostor's garbage: no reconnect, EVS-11): rebuild the SUB, once per 100 ms.
    fn watch_sub(&mut self) {
        while let Some(f) = recv(Some(&self.monitor)) { // frame 1: the event, native u16 first
            let event = f[0].get(..2).map_or(0, |e| u16::from_ne_bytes([e[0], e[1]]));
            self.sub_failed |= event == Event::DISCONNECTED as u16 && !self.handshaken;
            self.handshaken = event == Event::HANDSHAKE_SUCCEEDED as u16;
        }
        if !self.sub_failed || Instant::now() < self.resubscribe_at { return; }
        if let Ok(sockets) = open_sub(&self.ctx, &self.endpoint, &self.topic, self.heartbeat) {
            (self.sub, self.monitor) = sockets; // the old SUB is closed first
            (self.sub_failed, self.resubscribe_at) = (false, Instant::now() + RECONNECT_IVL);
            self.count("resubscribes", 1);
        }
    }

    /// Deliver held batches while they continue the sequence.
    fn flush(&mut self) {
        while let Some(next) = self.last.and_then(|l| l.checked_add(1)) {
            let b = match self.held.remove(&next) { Some(b) => b, None => return };
            self.last = Some(next);
            if let Some(b) = b { self.out.push((next, b)); self.count("delivered", 1); }
        }
    }

    /// Declare seqs missing up to `upto` (None: all held back) lost; deliver past them.
    fn give_up(&mut self, upto: Option<i64>) {
        while let (Some(&first), Some(last)) = (self.held.keys().next(), self.last) {
            let limit = upto.map_or(first - 1, |u| u.min(first - 1));
            if limit > last { self.count("lost", limit - last); self.last = Some(limit); }
            if self.last != Some(first - 1) { return; }
            self.flush();
        }
    }

    fn hold(&mut self, seq: i64, payload: &[u8]) {
        if self.last.map_or(false, |l| seq <= l) || self.held.contains_key(&seq) {
            return self.count("duplicates", 1);
        }
        let b = batch(payload);
        if b.is_none() { self.count("garbled", 1); } // still consumes its seq
        self.held.insert(seq, b);
        self.flush();
    }

    fn request_replay(&mut self) {
        if self.dealer.is_none() {
            let dealer = self.ctx.socket(zmq::DEALER).expect("a DEALER socket");
            let _ = dealer.set_linger(0).and(dealer.set_reconnect_ivl(100));
            let _ = dealer.connect(&self.replay_endpoint);
            self.dealer = Some(dealer);
        }
        let start = self.last.map_or(0, |l| l.saturating_add(1));
        let covers = self.last_live.or(self.last).unwrap_or(-1);
        self.replay = Some(Replay { covers, activity: Instant::now() });
        self.count("replays", 1);
        let request: [&[u8]; 2] = [b"", &start.to_be_bytes()];
        let _ = self.dealer.as_ref().unwrap().send_multipart(request, zmq::DONTWAIT); // or retried
    }

    /// A live seq at or below the last live one: a new publisher incarnation.
    fn restarted(&mut self) {
        self.count("restarts", 1);
        self.give_up(None);
        (self.dealer, self.replay, self.failed) = (None, None, 0);
        (self.last, self.last_live) = (Some(-1), None);
    }

    fn on_live(&mut self, f: Vec<Vec<u8>>) {
        if f.len() != 3 { return self.count("garbled", 1); }
        if !self.topic.is_empty() && f[0] != self.topic { return self.count("other_topic", 1); }
        let seq = match <[u8; 8]>::try_from(&f[1][..]) {
            Ok(b) if i64::from_be_bytes(b) >= 0 => i64::from_be_bytes(b),
            _ => return self.count("garbled", 1), // short, long, or past 2**63
        };
        self.traffic = Instant::now();
        if self.last_live.map_or(false, |l| seq <= l) {
            self.restarted();
        } else if self.last.is_none() {
            self.last = Some(seq - 1); // join the stream where it is
        }
        self.last_live = Some(seq);
        self.hold(seq, &f[2]);
        if !self.held.is_empty() && self.replay.is_none() {
            self.count("gaps", 1);
            self.request_replay();
        }
    }

    /// [b"", seq, payload] (seq-payload) or [b"", topic, seq, payload] (topic-seq-payload).
    fn on_answer(&mut self, f: Vec<Vec<u8>>) {
        let n = f.len();
        let raw = (n == 3 || n == 4).then(|| &f[0]).filter(|d| d.is_empty())
            .and_then(|_| <[u8; 8]>::try_from(&f[n - 2][..]).ok());
        let (replay, raw) = match (&mut self.replay, raw) {
            (None, _) => return self.count("stray_answers", 1),
            (Some(_), None) => return self.count("garbled", 1),
            (Some(replay), Some(raw)) => (replay, raw),
        };
        replay.activity = Instant::now();
        #[cfg(not(feature = "broken-end-marker"))]
        let seq = i64::from_be_bytes(raw); // signed: the end marker is -1
        #[cfg(feature = "broken-end-marker")] // read unsigned: the marker is a batch 2**64-1
        let seq = i64::try_from(u64::from_be_bytes(raw)).unwrap_or(i64::MAX);
        if seq == -1 {
            let covers = replay.covers;
            (self.replay, self.failed) = (None, 0);
            self.give_up(Some(covers));
            if !self.held.is_empty() { self.request_replay(); } // more went missing since
        } else if seq < 0 {
            self.count("garbled", 1);
        } else {
            self.hold(seq, &f[n - 1]);
        }
    }

    fn timers(&mut self, now: Instant) {
        if let Some(replay) = &self.replay {
            if now < replay.activity + self.replay_timeout { return; }
            self.count("replay_timeouts", 1);
            (self.dealer, self.replay) = (None, None); // lazy pirate: late answers die with it
            self.failed += 1;
            if self.failed >= self.attempts { self.failed = 0; self.give_up(None); }
            if self.held.is_empty() { self.failed = 0 } else { self.request_replay() }
        } else if self.last.is_some() && now >= self.traffic + self.resync_idle {
            self.traffic = now;
            self.request_replay();
        }
    }

    fn poll(&mut self, timeout_ms: i64) -> Vec<(i64, Value)> {
        let deadline = Instant::now() + Duration::from_millis(timeout_ms.max(0) as u64);
        loop { // up to 1024 messages a socket a turn: one reply carries many
            self.watch_sub();
            for _ in 0..1024 {
                match recv(Some(&self.sub)) { Some(f) => self.on_live(f), _ => break }
            }
            for _ in 0..1024 {
                match recv(self.dealer.as_ref()) { Some(f) => self.on_answer(f), _ => break }
            }
            let now = Instant::now();
            self.timers(now);
            if !self.out.is_empty() || now >= deadline { return std::mem::take(&mut self.out); }
            let timer = match &self.replay {
                Some(r) => r.activity + self.replay_timeout,
                None if self.last.is_some() => self.traffic + self.resync_idle,
                None => deadline,
            };
            let wait = timer.min(deadline).saturating_duration_since(now).as_millis() as i64 + 1;
            let mut items = vec![self.sub.as_poll_item(zmq::POLLIN)];
            items.extend(self.dealer.as_ref().map(|d| d.as_poll_item(zmq::POLLIN)));
            let _ = zmq::poll(&mut items, wait);
        }
    }
}

// --- driver protocol 1: 4-byte big-endian length, then one MessagePack map -------

fn read_message(input: &mut impl Read) -> Option<Value> {
    let mut head = [0u8; 4];
    input.read_exact(&mut head).ok()?;
    let mut body = vec![0u8; u32::from_be_bytes(head) as usize];
    input.read_exact(&mut body).ok()?;
    decode(&body)
}

fn write_message(output: &mut impl Write, v: &Value) {
    let body = rmp_serde::to_vec(v).expect("a MessagePack value");
    let sent = output.write_all(&(body.len() as u32).to_be_bytes())
        .and_then(|_| output.write_all(&body)).and_then(|_| output.flush());
    if sent.is_err() { std::process::exit(3); } // the suite is gone
}

fn error(kind: &str, message: &str) -> Result<Value, (String, String)> {
    Err((kind.to_owned(), message.to_owned()))
}

fn main() {
    let (mut input, mut output) = (std::io::stdin().lock(), std::io::stdout().lock());
    let hello = read_message(&mut input).unwrap_or_else(|| std::process::exit(2));
    const CONTRACT: &str = "kv-events-subscriber";
    if !hello.get("contract").map_or(false, |c| c.is_str(CONTRACT)) {
        let message = format!("this driver implements {CONTRACT} only");
        write_message(&mut output, &map(vec![("type", text("error")), ("kind", text("unsupported")),
                                             ("message", text(&message))]));
        std::process::exit(2);
    }
    let options = ["replay_timeout_ms", "heartbeat_ivl_ms", "heartbeat_timeout_ms"];
    write_message(&mut output, &map(vec![
        ("type", text("hello")), ("protocol", Value::Int(1)), ("contract", text(CONTRACT)),
        ("implementation", text("zmq-conformance Rust example (zmq 0.9, rmp-serde 1.1)")),
        ("capabilities", map(vec![("encoding", text("map")),
                                  ("heartbeat_configurable", Value::Bool(true))])),
        ("options", Value::Array(options.iter().map(|o| text(o)).collect())),
    ]));
    let (mut live, mut handles): (Option<Subscriber>, i64) = (None, 0);
    while let Some(request) = read_message(&mut input) {
        let id = request.get("id").and_then(Value::int).unwrap_or(0);
        let handle = request.get("handle").and_then(Value::int).unwrap_or(-1);
        let call = request.get("call").and_then(Value::text).unwrap_or("");
        let no_args = Value::Map(Vec::new());
        let args = request.get("args").unwrap_or(&no_args);
        let current = handle == handles && live.is_some();
        let result = match (handle, call) {
            (0, "subscriber") if live.is_some() => error("invalid", "one subscriber at a time"),
            (0, "subscriber") => Subscriber::open(args).map_or_else(|e| error("invalid", &e), |s| {
                live = Some(s);
                handles += 1;
                Ok(map(vec![("handle", Value::Int(handles))]))
            }),
            (h, _) if h < 1 || h > handles => error("invalid", "no such handle"),
            (_, "close") => { if current { live = None } Ok(Value::Nil) }
            (_, "poll" | "stats") if !current => error("closed", "the subscriber is closed"),
            (_, "poll") => {
                let timeout = args.get("timeout_ms").and_then(Value::int).unwrap_or(0);
                let got = live.as_mut().unwrap().poll(timeout);
                let pairs = got.into_iter().map(|(s, b)| Value::Array(vec![Value::Int(s), b]));
                Ok(Value::Array(pairs.collect()))
            }
            (_, "stats") => Ok(Value::Map(live.as_ref().unwrap().stats.iter()
                .map(|(k, v)| (text(k), Value::Int(*v))).collect())),
            _ => error("unsupported", "no such call"),
        };
        let reply = match result {
            Ok(v) => map(vec![("id", Value::Int(id)), ("result", v)]),
            Err((kind, message)) => map(vec![("id", Value::Int(id)),
                ("error", map(vec![("kind", text(&kind)), ("message", text(&message))]))]),
        };
        write_message(&mut output, &reply);
    }
}
