//! The Redis connection of an event-loop link: requests are written into the host's send
//! queue on the caller's turn, and one reader task on the engine's thread splits the answers
//! into replies and hands each to its request, in order. No channel or second task sits
//! between an operation and its socket.
//!
//! It speaks RESP2 (what every supported server answers without `HELLO`), one command per
//! request or a pipeline, and hands replies to callers as the `redis` crate's values, so the
//! crate's commands and scripts run over it unchanged.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::io::Read;
use std::net::TcpStream;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use redis::{Cmd, RedisError, RedisResult, Value};

use super::health::{now_ms, Health};
use crate::rt::event_loop::SocketWatch;

/// Reads per wake-up before the reader yields to other tasks.
const READS_PER_TURN: usize = 16;
/// Requests sent between two looks of the reader at the socket within a turn (see `send`).
const LOOK_EVERY: u32 = 4;
const READ_BUFFER_BYTES: usize = 64 * 1024;

/// A cheap handle on one connection; clones share it.
#[derive(Clone)]
pub(crate) struct LoopConn {
    shared: Rc<Shared>,
}

// SAFETY: the `redis` crate's connection trait asks for `Send` futures because its drivers
// usually run on a thread pool, and the backend's operations are typed for either thread. A
// `LoopConn` is created, used and dropped on the engine's thread only: the operations that
// hold one are polled there (the event-loop branch of `RedisBackend::with_conn_as`).
unsafe impl Send for LoopConn {}
unsafe impl Sync for LoopConn {}

/// A future of the engine's thread, passed where the `redis` crate asks for `Send`.
struct OnEngineThread<F>(F);

// SAFETY: as for `LoopConn`: these futures are polled and dropped on the engine's thread only.
unsafe impl<F> Send for OnEngineThread<F> {}

impl<F: Future> Future for OnEngineThread<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // SAFETY: the inner future is pinned as its wrapper is; it is never moved out.
        unsafe { self.map_unchecked_mut(|s| &mut s.0) }.poll(cx)
    }
}

struct Shared {
    sock: Arc<TcpStream>,
    /// The database selected at connect.
    db: i64,
    health: Arc<Health>,
    state: RefCell<State>,
}

struct State {
    /// Dropped when the connection ends: a socket at end of file stays readable, and watched
    /// on it would wake the loop on every turn.
    watch: Option<Box<dyn SocketWatch>>,
    /// Requests written and not yet answered, oldest first (indices into `slots`).
    order: VecDeque<usize>,
    slots: Vec<Slot>,
    free: Vec<usize>,
    /// Where a request is encoded before it joins the socket's send queue.
    out: Vec<u8>,
    input: Input,
    /// Set once the connection failed or closed: every later request fails with it.
    broken: Option<(std::io::ErrorKind, String)>,
    /// The reader, parked until the socket is readable (or the connection closes).
    reader: Option<Waker>,
    /// Requests sent since the reader last looked at the socket on its own.
    sent_unread: u32,
    closing: bool,
}

#[derive(Default)]
struct Slot {
    /// Replies still to come for this request.
    awaited: usize,
    replies: Vec<Value>,
    failed: Option<RedisError>,
    done: bool,
    /// The request's future was dropped: its replies are read and thrown away.
    abandoned: bool,
    waker: Option<Waker>,
}

/// Bytes read and not yet parsed: `buf[start..end]`.
struct Input {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl LoopConn {
    /// A connection over `sock` (connected, non-blocking, watched by `watch`); its reader
    /// runs as a task the caller spawns on the engine's thread.
    pub fn new(
        sock: Arc<TcpStream>,
        watch: Box<dyn SocketWatch>,
        health: Arc<Health>,
        db: i64,
    ) -> (LoopConn, impl Future<Output = ()>) {
        let shared = Rc::new(Shared {
            sock,
            db,
            health,
            state: RefCell::new(State {
                watch: Some(watch),
                order: VecDeque::new(),
                slots: Vec::new(),
                free: Vec::new(),
                out: Vec::new(),
                input: Input {
                    buf: vec![0; READ_BUFFER_BYTES],
                    start: 0,
                    end: 0,
                },
                broken: None,
                reader: None,
                sent_unread: 0,
                closing: false,
            }),
        });
        let reader = Reader {
            shared: shared.clone(),
        };
        (LoopConn { shared }, reader)
    }

    /// Ends the connection once every request written is answered.
    pub fn close(&self) {
        let mut state = self.shared.state.borrow_mut();
        state.closing = true;
        if let Some(w) = state.reader.take() {
            w.wake();
        }
    }

    /// One command given as its arguments, encoded straight into the request: the hot
    /// commands (a lock's SET NX PX and the release script) build no `Cmd` on the way. An
    /// error reply (NOSCRIPT, OOM, READONLY, …) is the server's error, not a value.
    pub fn command<'a>(
        &'a self,
        args: &'a [&'a [u8]],
    ) -> impl Future<Output = RedisResult<Value>> + Send + 'a {
        OnEngineThread(async move {
            self.request(|out| encode(out, args), 1)
                .await
                .and_then(Value::extract_error)
        })
    }

    /// Writes a request (encoded by `encode`) that `replies` replies answer, and waits for
    /// them: one reply as itself, several as an array.
    async fn request(
        &self,
        encode: impl FnOnce(&mut Vec<u8>),
        replies: usize,
    ) -> RedisResult<Value> {
        let slot = self.send(encode, replies)?;
        Answer {
            shared: &self.shared,
            slot,
            finished: false,
        }
        .await
    }

    fn send(&self, encode: impl FnOnce(&mut Vec<u8>), replies: usize) -> RedisResult<usize> {
        let mut state = self.shared.state.borrow_mut();
        let state = &mut *state;
        if let Some((kind, text)) = &state.broken {
            return Err(std::io::Error::new(*kind, text.clone()).into());
        }
        state.out.clear();
        encode(&mut state.out);
        // A lone request leaves at once (a sequential caller waits for nothing else); with
        // others in flight it joins this turn's write, and their answers are on the way.
        let now = self.shared.health.in_flight.load(Ordering::Acquire) <= 1;
        let Some(watch) = &mut state.watch else {
            return Err(std::io::Error::from(std::io::ErrorKind::NotConnected).into());
        };
        watch.send(&state.out, now)?;
        // The loop reports the socket readable once per turn. In a long turn (thousands of
        // requests in flight) the answers that arrive meanwhile would wait for the next one,
        // and the server for Node's next batch: every few requests the reader looks anyway.
        state.sent_unread += 1;
        if state.sent_unread >= LOOK_EVERY {
            state.sent_unread = 0;
            if let Some(w) = state.reader.take() {
                w.wake();
            }
        }
        let at = match state.free.pop() {
            Some(at) => at,
            None => {
                state.slots.push(Slot::default());
                state.slots.len() - 1
            }
        };
        debug_assert!(replies > 0, "a request is answered");
        let slot = &mut state.slots[at];
        slot.awaited = replies;
        slot.done = false;
        slot.abandoned = false;
        state.order.push_back(at);
        Ok(at)
    }
}

/// Waits for one request's replies; dropped early, it leaves them to be thrown away.
struct Answer<'a> {
    shared: &'a Shared,
    slot: usize,
    finished: bool,
}

impl Future for Answer<'_> {
    type Output = RedisResult<Value>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let shared = self.shared;
        let mut state = shared.state.borrow_mut();
        let state = &mut *state;
        let slot = &mut state.slots[self.slot];
        if !slot.done {
            match &slot.waker {
                Some(w) if w.will_wake(cx.waker()) => {}
                _ => slot.waker = Some(cx.waker().clone()),
            }
            return Poll::Pending;
        }
        let answer = match slot.failed.take() {
            Some(e) => Err(e),
            // One reply leaves the vector's room to the slot's next request.
            None if slot.replies.len() == 1 => Ok(slot.replies.pop().unwrap_or(Value::Nil)),
            None => Ok(Value::Array(std::mem::take(&mut slot.replies))),
        };
        slot.replies.clear();
        slot.waker = None;
        state.free.push(self.slot);
        self.finished = true;
        Poll::Ready(answer)
    }
}

impl Drop for Answer<'_> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let mut state = self.shared.state.borrow_mut();
        let state = &mut *state;
        let slot = &mut state.slots[self.slot];
        if slot.done {
            slot.failed = None;
            slot.replies.clear();
            state.free.push(self.slot);
        } else {
            slot.abandoned = true;
            slot.waker = None;
        }
    }
}

/// The connection's reader: splits what the server sends into replies, in request order.
struct Reader {
    shared: Rc<Shared>,
}

impl Future for Reader {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let shared = &*self.shared;
        let mut state = shared.state.borrow_mut();
        let state = &mut *state;
        for _ in 0..READS_PER_TURN {
            if state.closing && state.order.is_empty() {
                state.fail(
                    std::io::ErrorKind::NotConnected,
                    "the Redis connection was closed",
                );
                let _ = shared.sock.shutdown(std::net::Shutdown::Both);
                return Poll::Ready(());
            }
            let input = &mut state.input;
            input.make_room();
            match (&*shared.sock).read(&mut input.buf[input.end..]) {
                Ok(0) => {
                    state.fail(
                        std::io::ErrorKind::UnexpectedEof,
                        "Redis closed the connection",
                    );
                    return Poll::Ready(());
                }
                Ok(n) => {
                    input.end += n;
                    // Answers arriving, however slowly, show the server is alive, even while
                    // the operations they finish have not run yet.
                    shared.health.progress_ms.store(now_ms(), Ordering::Release);
                    if let Err(text) = state.hand_out() {
                        state.fail(std::io::ErrorKind::InvalidData, &text);
                        let _ = shared.sock.shutdown(std::net::Shutdown::Both);
                        return Poll::Ready(());
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if let Some(watch) = &mut state.watch {
                        watch.wait_readable(cx);
                    }
                    state.reader = Some(cx.waker().clone());
                    return Poll::Pending;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    state.fail(e.kind(), &format!("reading from Redis: {e}"));
                    return Poll::Ready(());
                }
            }
        }
        // Plenty read this turn: let the tasks it finished run before reading on.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl State {
    /// Hands every complete reply read so far to its request. Fails on bytes that are not
    /// RESP2, or on a reply no request waits for.
    fn hand_out(&mut self) -> Result<(), String> {
        loop {
            let input = &mut self.input;
            let bytes = &input.buf[input.start..input.end];
            let Some(len) = reply_len(bytes)? else {
                return Ok(());
            };
            let reply = match simple_value(&bytes[..len]) {
                Some(v) => Ok(v),
                None => redis::parse_redis_value(&bytes[..len]),
            };
            input.start += len;
            let Some(&at) = self.order.front() else {
                return Err("Redis sent a reply no request was waiting for".into());
            };
            let slot = &mut self.slots[at];
            match reply {
                Ok(v) => slot.replies.push(v),
                Err(e) => slot.failed = Some(e),
            }
            slot.awaited -= 1;
            if slot.awaited > 0 {
                continue;
            }
            self.order.pop_front();
            if slot.abandoned {
                *slot = Slot::default();
                self.free.push(at);
            } else {
                slot.done = true;
                if let Some(w) = slot.waker.take() {
                    w.wake();
                }
            }
        }
    }

    /// Fails every request waiting and every later one.
    fn fail(&mut self, kind: std::io::ErrorKind, text: &str) {
        self.broken = Some((kind, text.to_owned()));
        self.watch = None;
        while let Some(at) = self.order.pop_front() {
            let slot = &mut self.slots[at];
            if slot.abandoned {
                *slot = Slot::default();
                self.free.push(at);
                continue;
            }
            slot.failed = Some(std::io::Error::new(kind, text.to_owned()).into());
            slot.done = true;
            if let Some(w) = slot.waker.take() {
                w.wake();
            }
        }
    }
}

impl Input {
    /// Makes space to read into: moves unparsed bytes to the front, or grows for a reply
    /// larger than the buffer.
    fn make_room(&mut self) {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        if self.end < self.buf.len() {
            return;
        }
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        } else {
            let len = self.buf.len();
            self.buf.resize(len * 2, 0);
        }
    }
}

/// The length of the RESP2 reply at the start of `bytes`, `None` while it is incomplete.
fn reply_len(bytes: &[u8]) -> Result<Option<usize>, String> {
    let mut at = 0;
    // Elements still to skip, as a stack of counts: arrays nest.
    let mut pending: Vec<i64> = Vec::new();
    loop {
        let Some(line) = line_end(&bytes[at..]) else {
            return Ok(None);
        };
        let head = bytes[at];
        let body = &bytes[at + 1..at + line];
        at += line + 2;
        match head {
            b'+' | b'-' | b':' => {}
            b'$' => {
                let n = number(body)?;
                if n >= 0 {
                    at += n as usize + 2;
                    if at > bytes.len() {
                        return Ok(None);
                    }
                }
            }
            b'*' => {
                let n = number(body)?;
                if n > 0 {
                    pending.push(n);
                    continue;
                }
            }
            other => {
                return Err(format!(
                    "Redis sent a reply of unknown type {:?}",
                    other as char
                ))
            }
        }
        // One element done: count it against the arrays it closes.
        loop {
            match pending.last_mut() {
                None => return Ok(Some(at)),
                Some(left) => {
                    *left -= 1;
                    if *left > 0 {
                        break;
                    }
                    pending.pop();
                }
            }
        }
    }
}

/// A command as RESP2: an array of bulk strings.
fn encode(out: &mut Vec<u8>, args: &[&[u8]]) {
    // Lengths through `itoa`: `write!` cost a tenth of the encoding's time.
    let mut digits = itoa::Buffer::new();
    out.push(b'*');
    out.extend_from_slice(digits.format(args.len()).as_bytes());
    out.extend_from_slice(b"\r\n");
    for arg in args {
        out.push(b'$');
        out.extend_from_slice(digits.format(arg.len()).as_bytes());
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

/// A whole simple reply (`+`, `:`, `$`) as the crate's parser would read it; `None` for the
/// rest (errors, arrays, anything odd), which the crate's parser then reads. Lock commands
/// answer simple replies, and the crate's parser costs more than the rest of a reply's way.
fn simple_value(reply: &[u8]) -> Option<Value> {
    let line = line_end(reply)?;
    let body = &reply[1..line];
    match reply[0] {
        b'+' if body == b"OK" => Some(Value::Okay),
        b'+' => std::str::from_utf8(body)
            .ok()
            .map(|t| Value::SimpleString(t.to_owned())),
        b':' => std::str::from_utf8(body).ok()?.parse().ok().map(Value::Int),
        b'$' => {
            let n: i64 = std::str::from_utf8(body).ok()?.parse().ok()?;
            if n < 0 {
                return Some(Value::Nil);
            }
            let data = reply.get(line + 2..line + 2 + n as usize)?;
            Some(Value::BulkString(data.to_vec()))
        }
        _ => None,
    }
}

/// The offset of the `\r\n` ending the line at the start of `bytes`.
fn line_end(bytes: &[u8]) -> Option<usize> {
    let n = bytes.iter().position(|&b| b == b'\r')?;
    (n + 1 < bytes.len()).then_some(n)
}

fn number(text: &[u8]) -> Result<i64, String> {
    std::str::from_utf8(text)
        .ok()
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| {
            format!(
                "Redis sent a malformed length {:?}",
                String::from_utf8_lossy(text)
            )
        })
}

impl redis::aio::ConnectionLike for LoopConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> redis::RedisFuture<'a, Value> {
        Box::pin(OnEngineThread(
            self.request(|out| cmd.write_packed_command(out), 1),
        ))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        Box::pin(OnEngineThread(async move {
            let packed = pipeline.get_packed_pipeline();
            let replies = self
                .request(|out| out.extend_from_slice(&packed), offset + count)
                .await?;
            let mut replies = match replies {
                Value::Array(all) if offset + count > 1 => all,
                one => vec![one],
            };
            Ok(replies.split_off(offset.min(replies.len())))
        }))
    }

    fn get_db(&self) -> i64 {
        self.shared.db
    }
}

#[cfg(test)]
mod tests {
    use super::{encode, reply_len, simple_value};
    use redis::Value;

    #[test]
    fn simple_replies_read_as_the_crate_reads_them() {
        let replies: &[&[u8]] = &[
            b"+OK\r\n",
            b"+QUEUED\r\n",
            b":42\r\n",
            b":-7\r\n",
            b"$-1\r\n",
            b"$3\r\nabc\r\n",
            b"$0\r\n\r\n",
            b"$4\r\n\r\n\r\n\r\n",
        ];
        for reply in replies {
            let ours = simple_value(reply).expect("a simple reply");
            let crate_ = redis::parse_redis_value(reply).expect("the crate reads it");
            assert_eq!(ours, crate_, "{:?}", String::from_utf8_lossy(reply));
        }
        // The crate reads errors and arrays.
        assert_eq!(simple_value(b"-ERR no\r\n"), None);
        assert_eq!(simple_value(b"*1\r\n:1\r\n"), None);
    }

    #[test]
    fn commands_are_encoded_as_the_crate_encodes_them() {
        let mut ours = Vec::new();
        encode(&mut ours, &[b"SET", b"k", b"t\r\n", b"NX", b"PX", b"3000"]);
        let theirs = redis::cmd("SET")
            .arg("k")
            .arg("t\r\n")
            .arg("NX")
            .arg("PX")
            .arg(3000)
            .get_packed_command();
        assert_eq!(ours, theirs);
        // Counts and lengths of more than one digit, and an empty argument.
        let long = vec![b'x'; 12_345];
        let mut args: Vec<&[u8]> = vec![b"EVALSHA", b"", &long];
        args.extend(std::iter::repeat_n(&b"k"[..], 10));
        let mut ours = Vec::new();
        encode(&mut ours, &args);
        let mut theirs = redis::cmd("EVALSHA");
        args[1..].iter().for_each(|a| {
            theirs.arg(*a);
        });
        assert_eq!(ours, theirs.get_packed_command());
        assert_eq!(
            redis::parse_redis_value(b"$-1\r\n").unwrap(),
            Value::Nil,
            "the crate's nil"
        );
    }

    #[test]
    fn reply_lengths_cover_every_resp2_type_and_stop_at_incomplete_input() {
        let whole: &[(&[u8], usize)] = &[
            (b"+OK\r\n", 5),
            (b"-ERR no\r\n", 9),
            (b":42\r\n", 5),
            (b"$-1\r\n", 5),
            (b"$3\r\nabc\r\n", 9),
            (b"$0\r\n\r\n", 6),
            (b"*-1\r\n", 5),
            (b"*0\r\n", 4),
            (b"*2\r\n$1\r\na\r\n:1\r\n", 15),
            (b"*2\r\n*1\r\n+x\r\n*2\r\n:1\r\n$2\r\nab\r\n", 28),
            // A bulk string may hold CR and LF.
            (b"$4\r\n\r\n\r\n\r\n", 10),
        ];
        for (bytes, len) in whole {
            assert_eq!(reply_len(bytes), Ok(Some(*len)), "{bytes:?}");
            let mut more = bytes.to_vec();
            more.extend_from_slice(b"+NEXT\r\n");
            assert_eq!(
                reply_len(&more),
                Ok(Some(*len)),
                "{bytes:?} followed by more"
            );
            for cut in 0..*len {
                assert_eq!(reply_len(&bytes[..cut]), Ok(None), "{bytes:?} cut at {cut}");
            }
        }
    }

    #[test]
    fn bytes_that_are_not_resp2_are_an_error() {
        assert!(reply_len(b"%1\r\n+a\r\n+b\r\n").is_err());
        assert!(reply_len(b"$x\r\n").is_err());
    }
}
