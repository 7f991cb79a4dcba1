//! Operations as JavaScript sees them: a value at once when the engine finished within the
//! call, `PENDING` and a later `settle(opId, …)` when it did not, `FAILED` and `takeError()`
//! when it failed at once. No promise is made on the Rust side: the facade makes one only
//! when it must wait.

use locco_core::IdMap;
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::mem::ManuallyDrop;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Poll, Waker};

use locco_core::{Error, Op};
use napi::bindgen_prelude::{ToNapiValue, TypeName, ValidateNapiValue};
use napi::{sys, ValueType};

use crate::js::{self, Trampoline};
use crate::run::executor::{self, Guarded};

pub const PENDING: f64 = -1.0;
pub const FAILED: f64 = -2.0;

/// A raw JavaScript value handed back from an export.
pub struct Raw(pub sys::napi_value);

impl ToNapiValue for Raw {
    unsafe fn to_napi_value(_env: sys::napi_env, val: Self) -> napi::Result<sys::napi_value> {
        Ok(val.0)
    }
}

impl TypeName for Raw {
    fn type_name() -> &'static str {
        "unknown"
    }
    fn value_type() -> ValueType {
        ValueType::Unknown
    }
}

impl ValidateNapiValue for Raw {}

/// What an operation answers.
pub enum Answer {
    Number(f64),
    Text(String),
    Bool(bool),
    Null,
    Undefined,
    Numbers(Vec<f64>),
    /// `locker.inspect`: `{ key, held, ttlLeft?, fence?, holder? }`.
    Info(locco_core::KeyInfo),
    /// `locker.list`: an array of them.
    Infos(Vec<locco_core::KeyInfo>),
}

impl Answer {
    fn to_js(&self) -> sys::napi_value {
        match self {
            Answer::Number(n) => js::num(*n),
            Answer::Text(t) => js::string(t),
            Answer::Bool(b) => js::boolean(*b),
            Answer::Null => js::null(),
            Answer::Undefined => js::undefined(),
            Answer::Numbers(ns) => {
                let env = js::env();
                let mut arr = std::ptr::null_mut();
                unsafe {
                    sys::napi_create_array_with_length(env, ns.len(), &mut arr);
                    for (i, n) in ns.iter().enumerate() {
                        sys::napi_set_element(env, arr, i as u32, js::num(*n));
                    }
                }
                arr
            }
            Answer::Info(info) => js::key_info(info),
            Answer::Infos(infos) => {
                let env = js::env();
                let mut arr = std::ptr::null_mut();
                unsafe {
                    sys::napi_create_array_with_length(env, infos.len(), &mut arr);
                    for (i, info) in infos.iter().enumerate() {
                        sys::napi_set_element(env, arr, i as u32, js::key_info(info));
                    }
                }
                arr
            }
        }
    }
}

thread_local! {
    // Like every thread-local of the binding, never dropped at thread exit: see `teardown`.
    static LAST_ERROR: ManuallyDrop<RefCell<Option<Error>>> = const { ManuallyDrop::new(RefCell::new(None)) };
}

/// The error of the last export that answered `FAILED`, as a JavaScript value of the facade
/// `realm` (the one that called).
pub fn take_error(realm: Option<u32>) -> Raw {
    let err = LAST_ERROR.with(|e| e.borrow_mut().take());
    Raw(match (err, realm) {
        (Some(e), Some(realm)) => js::error_value_in(realm, &e),
        (Some(e), None) => js::error_value(&e),
        (None, _) => js::undefined(),
    })
}

/// Forgets every operation and host call at the environment's teardown. Dropped outside the
/// borrows: a drop may reach back here.
pub fn teardown() {
    let err = LAST_ERROR.with(|e| e.borrow_mut().take());
    let waiting = WAITING.with(|w| std::mem::take(&mut *w.borrow_mut()));
    drop((err, waiting));
}

/// Answers `FAILED` now, keeping `err` for `takeError()`.
pub fn fail(err: Error) -> Raw {
    LAST_ERROR.with(|e| *e.borrow_mut() = Some(err));
    Raw(js::num(FAILED))
}

fn flatten(r: OpOutput) -> Result<Answer, Error> {
    r.unwrap_or_else(|panic| {
        Err(Error::Internal(format!(
            "panic in the lock engine: {panic}"
        )))
    })
}

/// An operation's future in the one box it is polled from, with its panic guard.
pub type GuardedOp = Pin<Box<dyn Future<Output = OpOutput>>>;

/// Boxes the future `make` builds as a [`GuardedOp`], built in its box (see
/// `locco_core::boxed`). A caller that boxes its future anyway (to choose among several) boxes
/// it so, rather than box a box.
pub fn guard<F>(make: impl FnOnce() -> F) -> GuardedOp
where
    F: Future<Output = Result<Answer, Error>> + 'static,
{
    locco_core::boxed(|| Guarded(make()))
}

/// Runs an engine operation for JavaScript (see the module docs).
pub fn run(op_id: f64, fut: impl Future<Output = Result<Answer, Error>> + 'static) -> Raw {
    run_guarded(op_id, guard(|| fut))
}

/// [`run`] of a future already boxed.
pub fn run_guarded(op_id: f64, fut: GuardedOp) -> Raw {
    finish(start(op_id, fut))
}

/// An operation that finished within the call without a future: its answer, once the tasks
/// the call woke or started (a waiter handed the key) have run, as [`start`] runs them.
pub fn finished(answer: Result<Answer, Error>) -> Option<Result<Answer, Error>> {
    executor::drain();
    Some(answer)
}

/// What an operation's future ends with: its answer, or the message of a panic inside it.
pub type OpOutput = Result<Result<Answer, Error>, String>;

/// Settles an operation that went on after the call that started it: facade `realm` (the one
/// that started it, see `js::realm_of`) hears of its end.
pub struct Settle {
    realm: u32,
    op_id: f64,
}

impl Settle {
    pub fn settle(self, output: OpOutput) {
        let Settle { realm, op_id } = self;
        let r = flatten(output);
        if let Ok(Answer::Number(n)) = r {
            if defer(realm, op_id, n) {
                return;
            }
        }
        let (value, is_error) = match r {
            Ok(a) => (a.to_js(), false),
            Err(e) => (js::error_value_in(realm, &e), true),
        };
        let _ = js::call_in(
            realm,
            Trampoline::Settle,
            &[js::num(op_id), value, js::boolean(is_error)],
        );
    }
}

/// The first part of [`run`]: the answer when the operation finished within the call, `None`
/// when it goes on (and settles `op_id` later).
pub fn start(op_id: f64, fut: GuardedOp) -> Option<Result<Answer, Error>> {
    let settle = Settle {
        realm: js::realm_of(op_id),
        op_id,
    };
    // The call reads the clocks once (a hand-off reads them about ten times otherwise).
    locco_core::one_reading(|| {
        let done = executor::EXECUTOR.with(|e| e.run_now(fut, settle));
        // Tasks this call woke (a waiter handed the key on release) run before it returns; one
        // of them may be this operation, which then settles before the facade waits: it keeps
        // that.
        executor::drain();
        done.map(flatten)
    })
}

/// Where a fast call from facade `realm` collects the numeric answers of operations that
/// finish within it: a count, then (opId, value) pairs.
#[derive(Clone, Copy)]
struct Deferral {
    realm: u32,
    slots: *mut f64,
    len: usize,
}

thread_local! {
    static DEFERRAL: Cell<Option<Deferral>> = const { Cell::new(None) };
}

/// Runs `call` (a call from facade `realm`) with the numeric answers of operations that finish
/// within it written into `slots` (a count, then pairs) rather than settled through
/// JavaScript: the facade settles them when the call returns. What does not fit, and any
/// other answer, settles as usual.
///
/// # Safety
/// `slots` points at `len` numbers that stay alive, and that nothing else reads or writes,
/// until `call` returns.
pub unsafe fn deferring<R>(realm: u32, slots: *mut f64, len: usize, call: impl FnOnce() -> R) -> R {
    struct Restore(Option<Deferral>);
    impl Drop for Restore {
        fn drop(&mut self) {
            DEFERRAL.with(|d| d.set(self.0));
        }
    }
    let here = Deferral { realm, slots, len };
    let _restore = Restore(DEFERRAL.with(|d| d.replace(Some(here))));
    call()
}

/// Writes `op_id`'s answer `value` into the open deferral of `realm`; false when there is none
/// or it is full.
fn defer(realm: u32, op_id: f64, value: f64) -> bool {
    let Some(d) = DEFERRAL.with(Cell::get).filter(|d| d.realm == realm) else {
        return false;
    };
    // SAFETY: as `deferring` requires, while the call that opened it runs.
    let slots = unsafe { std::slice::from_raw_parts_mut(d.slots, d.len) };
    let count = slots[0] as usize;
    if 1 + 2 * (count + 1) > slots.len() {
        return false;
    }
    slots[1 + 2 * count] = op_id;
    slots[2 + 2 * count] = value;
    slots[0] = (count + 1) as f64;
    true
}

/// The rest of [`run`]: what JavaScript receives for what [`start`] answered.
pub fn finish(done: Option<Result<Answer, Error>>) -> Raw {
    match done {
        None => Raw(js::num(PENDING)),
        Some(Ok(a)) => Raw(a.to_js()),
        Some(Err(e)) => fail(e),
    }
}

/// Values that JavaScript code (an adapter, a delay function) answers with.
pub enum HostValue {
    Bool(bool),
    Number(f64),
    Null,
}

#[derive(Default)]
struct Slot {
    value: Option<Result<HostValue, Error>>,
    waker: Option<Waker>,
}

thread_local! {
    static WAITING: ManuallyDrop<RefCell<IdMap<u64, Rc<RefCell<Slot>>>>> = ManuallyDrop::default();
    static NEXT_OP: Cell<u64> = const { Cell::new(1) };
}

/// Calls JavaScript through `which` with `args` plus a fresh op id, and waits for
/// `done(opId, …)`. Dropping the future forgets the op; a late answer is then ignored.
pub fn call_host(which: Trampoline, mut args: Vec<sys::napi_value>) -> Op<HostValue> {
    let id = NEXT_OP.with(|n| n.replace(n.get() + 1));
    let slot: Rc<RefCell<Slot>> = Rc::default();
    WAITING.with(|w| w.borrow_mut().insert(id, slot.clone()));
    args.push(js::num(id as f64));
    if let Err(exc) = js::call(which, &args) {
        WAITING.with(|w| w.borrow_mut().remove(&id));
        return Op::ready(Err(Error::Internal(format!(
            "the facade's trampoline threw: {:?}",
            js::get_string(exc)
        ))));
    }
    if let Some(v) = slot.borrow_mut().value.take() {
        WAITING.with(|w| w.borrow_mut().remove(&id));
        return Op::ready(v);
    }
    Op::pending(HostCall { id, slot })
}

struct HostCall {
    id: u64,
    slot: Rc<RefCell<Slot>>,
}

impl Future for HostCall {
    type Output = Result<HostValue, Error>;
    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        let mut slot = self.slot.borrow_mut();
        match slot.value.take() {
            Some(v) => Poll::Ready(v),
            None => {
                slot.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl Drop for HostCall {
    fn drop(&mut self) {
        // At thread exit the map may already be gone; then there is nothing to forget.
        let _ = WAITING.try_with(|w| w.borrow_mut().remove(&self.id));
    }
}

/// JavaScript's answer to a `call_host`. `false` when nobody waits for it any more.
pub fn host_done(id: f64, value: Result<HostValue, Error>) -> bool {
    let slot = WAITING.with(|w| w.borrow().get(&(id as u64)).cloned());
    let Some(slot) = slot else { return false };
    let waker = {
        let mut s = slot.borrow_mut();
        s.value = Some(value);
        s.waker.take()
    };
    if let Some(w) = waker {
        w.wake();
    }
    executor::drain();
    true
}
