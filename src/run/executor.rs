//! A small executor that polls the engine's futures on the JavaScript thread.
//!
//! The engine is single-threaded. Polling it here, rather than on a Tokio thread, means an
//! in-memory acquire or a hand-off to the next waiter costs no thread hop, and a heartbeat can
//! only go out while the event loop is alive. Wakers called on another thread (the timer
//! thread, later network I/O) queue the task and wake the loop through one unreferenced
//! threadsafe function, which keeps nothing alive.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::mem::ManuallyDrop;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::ThreadId;

use locco_core::{IdMap, LocalFuture};
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};

use crate::run::ops;

type WakeFn = ThreadsafeFunction<(), (), (), napi::Status, false, true>;

/// The longest (ms) one drain polls before it lets the event loop run.
const DRAIN_BUDGET_MS: f64 = 4.0;

/// The part of the executor other threads may touch.
pub struct Remote {
    owner: ThreadId,
    queue: Mutex<Vec<u64>>,
    scheduled: AtomicBool,
    wake: OnceLock<WakeFn>,
}

struct TaskWaker {
    id: u64,
    remote: Arc<Remote>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref()
    }
    fn wake_by_ref(self: &Arc<Self>) {
        if std::thread::current().id() == self.remote.owner {
            // A task dropped at teardown may wake another: a closed executor ignores it.
            let _ = EXECUTOR.try_with(|e| {
                if !e.closed.get() {
                    e.ready.borrow_mut().push_back(self.id)
                }
            });
            return;
        }
        self.remote
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(self.id);
        self.remote.schedule();
    }
}

impl Remote {
    /// Asks the event loop for a drain in a later turn, unless one is asked for already.
    fn schedule(&self) {
        if !self.scheduled.swap(true, Ordering::AcqRel) {
            if let Some(wake) = self.wake.get() {
                wake.call((), ThreadsafeFunctionCallMode::NonBlocking);
            }
        }
    }
}

/// What a task runs: background work, or an operation whose output settles it for JavaScript.
enum Task {
    Background(LocalFuture<()>),
    Op(ops::GuardedOp, ops::Settle),
}

/// A task waiting to be woken, with its waker (made once per task) and the waker's own handle,
/// which a finished task hands to the next operation when nobody else kept it.
struct Pending {
    task: Task,
    waker: Waker,
    handle: Arc<TaskWaker>,
}

pub struct Executor {
    tasks: RefCell<IdMap<u64, Pending>>,
    ready: RefCell<VecDeque<u64>>,
    next_id: Cell<u64>,
    draining: Cell<bool>,
    /// A drain ran out of its budget and asked for `drain_later`: wakes wait for it.
    behind: Cell<bool>,
    /// Set by `teardown`: nothing runs or is kept from then on.
    closed: Cell<bool>,
    /// The waker of a finished task that nobody kept a clone of: the next task takes it (and
    /// its id, which no wake can name any more) instead of allocating one.
    spare: RefCell<Option<(u64, Arc<TaskWaker>)>>,
    remote: Arc<Remote>,
}

thread_local! {
    // Never dropped when the thread exits: `teardown` empties it at the environment's cleanup,
    // in order. At `process.exit()` the thread's destructors run while Node is half gone, and
    // a task dropped there would wake others into a destroyed thread-local (an abort).
    pub static EXECUTOR: ManuallyDrop<Executor> = ManuallyDrop::new(Executor {
        tasks: RefCell::default(),
        ready: RefCell::default(),
        next_id: Cell::new(1),
        draining: Cell::new(false),
        behind: Cell::new(false),
        closed: Cell::new(false),
        spare: RefCell::new(None),
        remote: Arc::new(Remote {
            owner: std::thread::current().id(),
            queue: Mutex::default(),
            scheduled: AtomicBool::new(false),
            wake: OnceLock::new(),
        }),
    });
}

impl Executor {
    pub fn set_wake(&self, wake: WakeFn) {
        let _ = self.remote.wake.set(wake);
    }

    /// Drops every task, with wakes ignored from now on: the environment is going away.
    /// Tasks are dropped outside the table's borrow, since a drop may reach the executor.
    pub fn teardown(&self) {
        self.closed.set(true);
        loop {
            let tasks = std::mem::take(&mut *self.tasks.borrow_mut());
            self.ready.borrow_mut().clear();
            if tasks.is_empty() {
                break;
            }
            drop(tasks);
        }
    }

    /// Polls `fut` once now; if it is not done, keeps it and polls it when woken.
    pub fn spawn(&self, fut: LocalFuture<()>) {
        if self.closed.get() {
            return;
        }
        let (id, waker, handle) = self.take_spare();
        let task = Task::Background(fut);
        self.poll_task(
            id,
            Pending {
                task,
                waker,
                handle,
            },
        );
    }

    /// Polls operation `fut` once now and answers its output if it is ready. Otherwise it goes
    /// on as a task, and `then` settles it with its output. The common case (an in-memory
    /// operation) thus allocates the future once and never enters the task table.
    pub fn run_now(&self, mut fut: ops::GuardedOp, then: ops::Settle) -> Option<ops::OpOutput> {
        let (id, waker, task_waker) = self.take_spare();
        let polled = fut.as_mut().poll(&mut Context::from_waker(&waker));
        if let Poll::Ready(v) = polled {
            drop(waker);
            self.keep_spare(id, task_waker);
            return Some(v);
        }
        if self.closed.get() {
            return None;
        }
        let pending = Pending {
            task: Task::Op(fut, then),
            waker,
            handle: task_waker,
        };
        self.tasks.borrow_mut().insert(id, pending);
        None
    }

    /// An id and waker for a new task (with the waker's handle): the spare one, when there is
    /// one.
    fn take_spare(&self) -> (u64, Waker, Arc<TaskWaker>) {
        let spare = self.spare.borrow_mut().take();
        let (id, handle) = spare.unwrap_or_else(|| {
            let id = self.next_id.get();
            self.next_id.set(id + 1);
            (id, self.task_waker(id))
        });
        (id, Waker::from(handle.clone()), handle)
    }

    /// Keeps the waker of a finished task for the next one, when nobody kept a clone (so no
    /// wake can ever name its id again).
    fn keep_spare(&self, id: u64, task_waker: Arc<TaskWaker>) {
        if Arc::strong_count(&task_waker) == 1 {
            let mut spare = self.spare.borrow_mut();
            if spare.is_none() {
                *spare = Some((id, task_waker));
            }
        }
    }

    fn task_waker(&self, id: u64) -> Arc<TaskWaker> {
        Arc::new(TaskWaker {
            id,
            remote: self.remote.clone(),
        })
    }

    fn poll_task(&self, id: u64, mut pending: Pending) {
        let mut cx = Context::from_waker(&pending.waker);
        // A panic inside the engine ends this task only; its caller hears of it through the
        // `Guarded` wrapper of the operation.
        let polled = catch_unwind(AssertUnwindSafe(|| match &mut pending.task {
            Task::Background(fut) => fut.as_mut().poll(&mut cx).map(|()| None),
            Task::Op(fut, _) => fut.as_mut().poll(&mut cx).map(Some),
        }));
        match polled {
            Ok(Poll::Pending) if !self.closed.get() => {
                self.tasks.borrow_mut().insert(id, pending);
            }
            Ok(Poll::Pending) => {}
            Ok(Poll::Ready(output)) => {
                let Pending {
                    task,
                    waker,
                    handle,
                } = pending;
                drop(waker);
                self.keep_spare(id, handle);
                if let (Task::Op(_, then), Some(output)) = (task, output) {
                    // Settling calls into JavaScript: a panic there ends this task only, too.
                    let _ = catch_unwind(AssertUnwindSafe(|| then.settle(output)));
                }
            }
            Err(_) => {}
        }
    }

    /// Polls every woken task until none is left, or until the turn's budget is spent: then
    /// the rest runs after the event loop's other work (`drain_later`), so that a storm of due
    /// work (a million renewals) never keeps JavaScript waiting for long. Re-entrant calls
    /// return at once: the outer loop picks up what they would have run.
    pub fn drain(&self) {
        if self.draining.replace(true) {
            return;
        }
        // Read only once there is work: most drains (after a call that woke nobody) find none.
        // Read as the engine reads it: a hand-off within a call from JavaScript (one poll)
        // then costs no reading of its own.
        let mut started: Option<f64> = None;
        let mut polled = false;
        loop {
            if !self.ready.borrow().is_empty() {
                match started {
                    None => started = Some(locco_core::monotonic_reading()),
                    // Through setImmediate, not the threadsafe function: Node runs the queued
                    // calls of that one in a single turn, which would not let the loop run.
                    Some(at)
                        if locco_core::monotonic_reading() - at >= DRAIN_BUDGET_MS
                            && crate::js::call(crate::js::Trampoline::Resume, &[]).is_ok() =>
                    {
                        self.behind.set(true);
                        break;
                    }
                    Some(_) => {}
                }
            }
            // Other threads set `scheduled` after queueing, so the lock is taken only when
            // something is there (a push racing this check triggers another drain).
            if self.remote.scheduled.load(Ordering::Acquire) {
                let remote: Vec<u64> = {
                    let mut q = self.remote.queue.lock().unwrap_or_else(|e| e.into_inner());
                    self.remote.scheduled.store(false, Ordering::Release);
                    std::mem::take(&mut *q)
                };
                self.ready.borrow_mut().extend(remote);
            }
            let next = self.ready.borrow_mut().pop_front();
            let Some(id) = next else { break };
            let task = self.tasks.borrow_mut().remove(&id);
            if let Some(pending) = task {
                // Each task after the first reads the clock afresh: a drain may run for its
                // whole budget. (The first runs right after the reading it shares.)
                if std::mem::replace(&mut polled, true) {
                    locco_core::fresh_reading();
                }
                self.poll_task(id, pending);
            }
        }
        self.draining.set(false);
    }
}

pub fn spawn(fut: LocalFuture<()>) {
    EXECUTOR.with(|e| e.spawn(fut));
}

pub fn drain() {
    EXECUTOR.with(|e| e.drain());
}

/// The drain for a wake from another thread. While a drain that ran out of budget waits for
/// `drain_later`, it leaves the work to that one: Node runs the threadsafe function's queued
/// calls in one turn, and each would spend a budget of its own. (A drain after a call from
/// JavaScript still runs: it is how the engine keeps up while JavaScript is busy.)
pub fn drain_on_wake() {
    EXECUTOR.with(|e| {
        if !e.behind.get() {
            e.drain()
        }
    });
}

/// The drain a drain that ran out of budget asked for, a turn of the event loop later.
pub fn drain_later() {
    EXECUTOR.with(|e| {
        e.behind.set(false);
        e.drain()
    });
}

pub fn teardown() {
    EXECUTOR.with(|e| e.teardown());
}

/// The engine's spawner: background tasks on this thread's executor.
pub struct Spawner;

impl locco_core::Spawn for Spawner {
    fn spawn(&self, task: LocalFuture<()>) {
        spawn(task)
    }
}

/// Runs `fut`, turning a panic into `Err(message)`.
pub struct Guarded<F>(pub F);

impl<F: Future> Future for Guarded<F> {
    type Output = Result<F::Output, String>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: structural pinning: the inner future is never moved out of `self`.
        let fut = unsafe { self.map_unchecked_mut(|g| &mut g.0) };
        match catch_unwind(AssertUnwindSafe(|| fut.poll(cx))) {
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(panic) => Poll::Ready(Err(panic_message(panic))),
        }
    }
}

pub fn panic_message(panic: Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}
