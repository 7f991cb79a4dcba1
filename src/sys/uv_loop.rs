//! The engine's [`EventLoop`] over libuv: Node's own loop reports when a socket is ready, so a
//! Redis round trip needs no thread besides the JavaScript one, as with a JavaScript client.
//!
//! Writes are queued and leave just before libuv waits for events (a prepare handle), or
//! earlier once a batch is large: the requests that one turn of the loop makes share a few
//! `send`s. A lone request leaves at once. While its answer may be near, the loop polls
//! instead of sleeping, for a bounded time ([`crate::sys::busy_poll`]).
//!
//! Node exports libuv's functions to addons; they resolve when the addon loads.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::cell::{Cell, RefCell};
use std::io::Write;
use std::mem::ManuallyDrop;
use std::net::TcpStream;
use std::os::fd::FromRawFd;
use std::os::raw::{c_int, c_void};
use std::ptr;
use std::task::{Context, Waker};

use locco_core::{EventLoop, LocalFuture, SocketWatch, LOOP_ACTIVITY};
use napi::sys;

use crate::js;
use crate::run::executor;
use crate::sys::busy_poll;

type PollCb = unsafe extern "C" fn(handle: *mut c_void, status: c_int, events: c_int);
/// A close callback, or a prepare handle's callback: both get only the handle.
type HandleCb = unsafe extern "C" fn(handle: *mut c_void);

extern "C" {
    fn uv_handle_size(kind: c_int) -> usize;
    fn uv_poll_init_socket(lp: *mut c_void, handle: *mut c_void, socket: c_int) -> c_int;
    fn uv_poll_start(handle: *mut c_void, events: c_int, cb: PollCb) -> c_int;
    fn uv_close(handle: *mut c_void, cb: HandleCb);
    fn uv_unref(handle: *mut c_void);
    fn uv_prepare_init(lp: *mut c_void, handle: *mut c_void) -> c_int;
    fn uv_prepare_start(handle: *mut c_void, cb: HandleCb) -> c_int;
    fn uv_check_init(lp: *mut c_void, handle: *mut c_void) -> c_int;
    fn uv_check_start(handle: *mut c_void, cb: HandleCb) -> c_int;
    fn uv_idle_init(lp: *mut c_void, handle: *mut c_void) -> c_int;
    fn uv_strerror(err: c_int) -> *const std::os::raw::c_char;
}

const UV_CHECK: c_int = 2;
const UV_IDLE: c_int = 6;
const UV_POLL: c_int = 8;
const UV_PREPARE: c_int = 9;
const UV_READABLE: c_int = 1;
const UV_WRITABLE: c_int = 2;

thread_local! {
    /// The async context that callbacks from libuv run JavaScript in (so promise reactions
    /// run before control returns to the loop).
    static ASYNC_CONTEXT: Cell<sys::napi_async_context> = const { Cell::new(ptr::null_mut()) };
    /// The handles (poll and prepare) open on this thread's loop, which must be closed before
    /// the loop is.
    static OPEN: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
    /// Handles still closing at teardown, and how to tell Node when none are left.
    static CLOSING: Cell<(usize, sys::napi_async_cleanup_hook_handle)> =
        const { Cell::new((0, ptr::null_mut())) };
    /// Sockets with bytes waiting to be written.
    static UNSENT: RefCell<Vec<*mut Interest>> = const { RefCell::new(Vec::new()) };
}

/// The loop of this thread's Node.js environment.
pub struct UvLoop {
    lp: *mut c_void,
}

impl UvLoop {
    /// Called on the JavaScript thread, inside a call from JavaScript.
    pub fn current() -> napi::Result<UvLoop> {
        let env = js::env();
        let mut lp = ptr::null_mut();
        check(
            unsafe { sys::napi_get_uv_event_loop(env, &mut lp) },
            "get the event loop",
        )?;
        if ASYNC_CONTEXT.with(Cell::get).is_null() {
            let mut name = ptr::null_mut();
            let mut ctx = ptr::null_mut();
            unsafe {
                check(
                    sys::napi_create_string_utf8(env, c"locco-rs".as_ptr(), 8, &mut name),
                    "name the async context",
                )?;
                check(
                    sys::napi_async_init(env, ptr::null_mut(), name, &mut ctx),
                    "make the async context",
                )?;
            }
            ASYNC_CONTEXT.with(|c| c.set(ctx));
            unsafe { start_flushing(lp.cast())? };
            let mut hook = ptr::null_mut();
            check(
                unsafe {
                    sys::napi_add_async_cleanup_hook(
                        env,
                        Some(close_all),
                        ptr::null_mut(),
                        &mut hook,
                    )
                },
                "register the cleanup hook",
            )?;
        }
        Ok(UvLoop { lp: lp.cast() })
    }
}

fn check(status: sys::napi_status, what: &str) -> napi::Result<()> {
    if status == sys::Status::napi_ok {
        Ok(())
    } else {
        Err(napi::Error::from_reason(format!(
            "could not {what} ({status})"
        )))
    }
}

fn uv_error(code: c_int, what: &str) -> std::io::Error {
    let text = unsafe { std::ffi::CStr::from_ptr(uv_strerror(code)) };
    std::io::Error::other(format!("{what}: {}", text.to_string_lossy()))
}

/// One layout for every kind of handle this module makes (poll, prepare and check).
fn handle_layout() -> Layout {
    let size = unsafe {
        uv_handle_size(UV_POLL)
            .max(uv_handle_size(UV_PREPARE))
            .max(uv_handle_size(UV_CHECK))
            .max(uv_handle_size(UV_IDLE))
    };
    Layout::from_size_align(size, 16).expect("a libuv handle layout")
}

unsafe fn new_handle() -> std::io::Result<*mut c_void> {
    let handle = alloc_zeroed(handle_layout()).cast::<c_void>();
    if handle.is_null() {
        return Err(std::io::Error::other("out of memory for a libuv handle"));
    }
    Ok(handle)
}

/// A new handle of the loop, initialised by `init` and unreferenced (none of ours keeps the
/// process alive), kept in `OPEN` to be closed with the loop.
unsafe fn open_handle(
    lp: *mut c_void,
    init: unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int,
    kind: &str,
) -> napi::Result<*mut c_void> {
    let handle = new_handle().map_err(|e| napi::Error::from_reason(e.to_string()))?;
    if init(lp, handle) != 0 {
        dealloc(handle.cast(), handle_layout());
        return Err(napi::Error::from_reason(format!(
            "could not start a libuv {kind} handle"
        )));
    }
    uv_unref(handle);
    OPEN.with(|o| o.borrow_mut().push(handle as usize));
    Ok(handle)
}

/// Starts the prepare handle that writes queued bytes before each wait for events.
unsafe fn start_flushing(lp: *mut c_void) -> napi::Result<()> {
    uv_prepare_start(open_handle(lp, uv_prepare_init, "prepare")?, send_all);
    // The check handle runs right after the wait for events: from then on the loop works.
    uv_check_start(open_handle(lp, uv_check_init, "check")?, after_wait);
    busy_poll::started(open_handle(lp, uv_idle_init, "idle")?);
    Ok(())
}

/// The loop waited for events and now runs callbacks (see `LoopActivity`).
unsafe extern "C" fn after_wait(_: *mut c_void) {
    LOOP_ACTIVITY.working();
}

/// Runs a libuv callback's body; a panic must not unwind into libuv (it would abort the
/// process). What it interrupted fails later, by the command timeout.
fn shielded(body: impl FnOnce()) {
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
}

unsafe extern "C" fn send_all(_: *mut c_void) {
    shielded(send_queued);
    busy_poll::before_wait();
    LOOP_ACTIVITY.waiting();
}

fn send_queued() {
    // Tasks woken by a failed write may queue more requests; those leave now too, since the
    // loop is about to wait. A few rounds at most: each needs another failure.
    for _ in 0..8 {
        let unsent = UNSENT.with(|u| std::mem::take(&mut *u.borrow_mut()));
        let mut woke = false;
        for interest in unsent {
            // SAFETY: a queued socket's interest lives until its watch drops, which takes it
            // out of `UNSENT`; no task runs in this loop.
            let interest = unsafe { &mut *interest };
            interest.queued = false;
            woke |= interest.write_out();
        }
        if !woke {
            return;
        }
        run_woken_tasks();
    }
}

/// One socket's reader and unsent bytes; `uv_poll_t.data` points here.
struct Interest {
    handle: *mut c_void,
    fd: c_int,
    readable: Option<Waker>,
    unsent: Vec<u8>,
    /// Whether the socket is in `UNSENT`.
    queued: bool,
    /// The error that ended writing, reported by the next `send`.
    failed: Option<(std::io::ErrorKind, String)>,
    /// The events libuv watches now.
    events: c_int,
    /// Bytes written since it was last readable.
    unanswered: usize,
}

impl Interest {
    /// Writes what it can; watches for writability while the socket buffer is full. A write
    /// error wakes the reader, and the answer is then true: the caller runs the woken tasks
    /// once it no longer touches this socket (a task may drop it).
    fn write_out(&mut self) -> bool {
        // SAFETY: the socket is open while its watch lives, and this borrow never closes it.
        let sock = ManuallyDrop::new(unsafe { TcpStream::from_raw_fd(self.fd) });
        let mut sent = 0;
        let mut woke = false;
        while sent < self.unsent.len() {
            let written = match (&*sock).write(&self.unsent[sent..]) {
                Ok(0) => Err(std::io::ErrorKind::WriteZero.into()),
                other => other,
            };
            match written {
                Ok(n) => {
                    sent += n;
                    busy_poll::wrote(self.unanswered == 0, n);
                    self.unanswered += n;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // The reader finds the broken socket too, and fails what is in flight.
                    self.failed = Some((e.kind(), e.to_string()));
                    sent = self.unsent.len();
                    woke = self.readable.take().map(Waker::wake).is_some();
                }
            }
        }
        self.unsent.drain(..sent);
        let events = if self.unsent.is_empty() {
            UV_READABLE
        } else {
            UV_READABLE | UV_WRITABLE
        };
        if events != self.events {
            self.events = events;
            unsafe { uv_poll_start(self.handle, events, on_ready) };
        }
        woke
    }
}

/// Queued bytes are written early once there are this many, so the server works on the
/// first part of a turn's requests while JavaScript makes the rest (on two cores, writing a
/// whole turn at once left each side idle while the other worked: 1.5x against 2x ioredis).
const EARLY_WRITE_BYTES: usize = 8 * 1024;

/// One socket watched by a libuv poll handle. Reading stays watched for the socket's life (a
/// Redis connection always has a reader); writing only while bytes wait for room.
struct UvWatch {
    handle: *mut c_void,
    interest: *mut Interest,
}

impl SocketWatch for UvWatch {
    fn wait_readable(&mut self, cx: &mut Context<'_>) {
        // SAFETY: `interest` lives until this watch is dropped, on this thread.
        let interest = unsafe { &mut *self.interest };
        interest.readable = Some(cx.waker().clone());
    }

    fn send(&mut self, bytes: &[u8], now: bool) -> std::io::Result<()> {
        // SAFETY: as above.
        let interest = unsafe { &mut *self.interest };
        if let Some((kind, text)) = &interest.failed {
            return Err(std::io::Error::new(*kind, text.clone()));
        }
        interest.unsent.extend_from_slice(bytes);
        if now || interest.unsent.len() >= EARLY_WRITE_BYTES {
            // Inside a drain: the reader a failure wakes is polled by that drain.
            interest.write_out();
        } else if !interest.queued {
            interest.queued = true;
            UNSENT.with(|u| u.borrow_mut().push(self.interest));
        }
        Ok(())
    }
}

impl Drop for UvWatch {
    fn drop(&mut self) {
        let key = self.handle as usize;
        // After the environment's teardown closed it, the handle is gone already.
        let open = OPEN
            .try_with(|o| {
                let mut o = o.borrow_mut();
                let at = o.iter().position(|h| *h == key);
                at.map(|i| o.swap_remove(i)).is_some()
            })
            .unwrap_or(false);
        let _ = UNSENT.try_with(|u| u.borrow_mut().retain(|i| *i != self.interest));
        let interest = unsafe { &*self.interest };
        if interest.unanswered > 0 {
            busy_poll::answered(interest.unanswered);
        }
        unsafe {
            if open {
                stop_and_close(self.handle, on_closed);
            }
            drop(Box::from_raw(self.interest));
        }
    }
}

/// Closes a handle (which stops it) so that no later callback finds its data.
unsafe fn stop_and_close(handle: *mut c_void, cb: HandleCb) {
    *(handle as *mut *mut c_void) = ptr::null_mut();
    uv_close(handle, cb);
}

unsafe extern "C" fn on_closed(handle: *mut c_void) {
    dealloc(handle.cast(), handle_layout());
}

/// The environment is going away (a worker thread ends): Node closes the loop next, which
/// must have no open handle, so every socket watch is closed now.
unsafe extern "C" fn close_all(hook: sys::napi_async_cleanup_hook_handle, _: *mut c_void) {
    let open = OPEN.with(|o| std::mem::take(&mut *o.borrow_mut()));
    busy_poll::closed();
    if open.is_empty() {
        sys::napi_remove_async_cleanup_hook(hook);
        return;
    }
    CLOSING.with(|c| c.set((open.len(), hook)));
    for handle in open {
        stop_and_close(handle as *mut c_void, on_closed_at_teardown);
    }
}

unsafe extern "C" fn on_closed_at_teardown(handle: *mut c_void) {
    on_closed(handle);
    let (left, hook) = CLOSING.with(Cell::get);
    CLOSING.with(|c| c.set((left - 1, hook)));
    if left == 1 {
        sys::napi_remove_async_cleanup_hook(hook);
    }
}

unsafe extern "C" fn on_ready(handle: *mut c_void, status: c_int, events: c_int) {
    // What runs now (answers settled, the JavaScript they resume) is the loop's work.
    LOOP_ACTIVITY.working();
    shielded(|| unsafe { ready(handle, status, events) });
}

/// # Safety
/// `handle` is a poll handle of this module, whose data is its `Interest` or null.
unsafe fn ready(handle: *mut c_void, status: c_int, events: c_int) {
    // `data` is the first field of every libuv handle.
    let interest = *(handle as *mut *mut Interest);
    if interest.is_null() {
        return;
    }
    let interest = &mut *interest;
    // An error (a closed socket) wakes the reader, whose next read reports it.
    let (read, write) = if status < 0 {
        (true, false)
    } else {
        (events & UV_READABLE != 0, events & UV_WRITABLE != 0)
    };
    if read && interest.unanswered > 0 {
        busy_poll::answered(std::mem::take(&mut interest.unanswered));
    }
    let mut woke = write && interest.write_out();
    if let Some(w) = interest.readable.take().filter(|_| read) {
        w.wake();
        woke = true;
    }
    // Last: a task may drop this socket's watch.
    if woke {
        run_woken_tasks();
    }
}

/// Polls the tasks a socket woke, inside a callback scope so that the promises they settle
/// run their reactions before libuv goes on.
fn run_woken_tasks() {
    let env = js::env();
    let ctx = ASYNC_CONTEXT.with(Cell::get);
    if env.is_null() || ctx.is_null() {
        return;
    }
    unsafe {
        let mut handles = ptr::null_mut();
        if sys::napi_open_handle_scope(env, &mut handles) != sys::Status::napi_ok {
            return;
        }
        let mut resource = ptr::null_mut();
        let mut scope = ptr::null_mut();
        sys::napi_create_object(env, &mut resource);
        if sys::napi_open_callback_scope(env, resource, ctx, &mut scope) == sys::Status::napi_ok {
            executor::drain();
            sys::napi_close_callback_scope(env, scope);
        } else {
            executor::drain();
        }
        sys::napi_close_handle_scope(env, handles);
    }
}

impl EventLoop for UvLoop {
    fn watch(&self, fd: i32) -> std::io::Result<Box<dyn SocketWatch>> {
        unsafe {
            let handle = new_handle()?;
            let rc = uv_poll_init_socket(self.lp, handle, fd);
            if rc != 0 {
                dealloc(handle.cast(), handle_layout());
                return Err(uv_error(rc, "uv_poll_init_socket"));
            }
            let interest = Box::into_raw(Box::new(Interest {
                handle,
                fd,
                readable: None,
                unsent: Vec::new(),
                queued: false,
                failed: None,
                events: UV_READABLE,
                unanswered: 0,
            }));
            *(handle as *mut *mut Interest) = interest;
            // A socket of ours never keeps the process alive.
            uv_unref(handle);
            let rc = uv_poll_start(handle, UV_READABLE, on_ready);
            OPEN.with(|o| o.borrow_mut().push(handle as usize));
            let watch = UvWatch { handle, interest };
            if rc != 0 {
                return Err(uv_error(rc, "uv_poll_start"));
            }
            Ok(Box::new(watch))
        }
    }

    fn spawn(&self, task: LocalFuture<()>) {
        executor::spawn(task);
    }
}
