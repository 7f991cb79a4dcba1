//! Heartbeat extensions that fall due together leave as one backend operation
//! ([`crate::contract::Backend::extend_many`]), in chunks, instead of one request per lock. Each lock
//! still applies its own answer, with the lease clock rule of a single extension: its new
//! lease counts from when the chunk left.

use std::cell::RefCell;
use std::rc::Rc;

use crate::contract::Renewal;
use crate::engine::lock::state::{begin_extend, finish_extend, LockInner};
use crate::rt::clock::checked_now;
use crate::rt::error::Error;
use crate::rt::task::yield_now;

/// Renewals per backend operation: large enough that 1,000,000 locks need few operations,
/// small enough that one answer stays well under a millisecond to apply.
pub(crate) const CHUNK: usize = 1000;

/// The heartbeats that fell due in this turn of the engine, sent together at its end.
#[derive(Default)]
pub(crate) struct Renewals {
    due: RefCell<Vec<Rc<LockInner>>>,
}

impl Renewals {
    /// Queues a heartbeat extension of `lock`. The first one of a turn starts the task that
    /// sends them all once the turn's other due ticks have joined it.
    pub(crate) fn add(&self, lock: Rc<LockInner>) {
        let first = {
            let mut due = self.due.borrow_mut();
            due.push(lock.clone());
            due.len() == 1
        };
        if first {
            let spawner = lock.env().rt.spawner.clone();
            spawner.spawn(Box::pin(async move {
                yield_now().await;
                let due = std::mem::take(&mut *lock.env().renewals.due.borrow_mut());
                let mut due = due.into_iter().peekable();
                while due.peek().is_some() {
                    let chunk: Vec<_> = due.by_ref().take(CHUNK).collect();
                    lock.env().rt.spawner.spawn(Box::pin(send(chunk)));
                    // One chunk per poll: a million renewals must not hold up the host's loop.
                    if due.peek().is_some() {
                        yield_now().await;
                    }
                }
            }));
        }
    }
}

/// Sends one chunk of extensions and applies each answer to its lock.
async fn send(locks: Vec<Rc<LockInner>>) {
    let Some(env) = locks.first().map(|l| l.env().clone()) else {
        return;
    };
    // A clock that cannot be read sends nothing, as a single extension would: the leases then
    // run out and the expiry checks report them.
    let Ok(sent_at) = checked_now(&*env.rt.clock) else {
        return;
    };
    // Locks that lost their lease, began their release or stopped their heartbeat since the
    // tick drop out, and so do those past their hold deadline (begin_extend reports them).
    let sent: Vec<(Rc<LockInner>, u32)> = locks
        .into_iter()
        .filter(|l| l.renews_at(sent_at))
        .filter_map(|l| begin_extend(&l, sent_at).ok().map(|ttl| (l, ttl)))
        .collect();
    if sent.is_empty() {
        return;
    }
    let renewals: Vec<Renewal<'_>> = sent
        .iter()
        .map(|(l, ttl)| Renewal {
            key: l.key(),
            token: l.token(),
            ttl: *ttl,
        })
        .collect();
    let op = env.backend.extend_many(&renewals);
    drop(renewals);
    let answers = match op.await {
        Ok(answers) if answers.len() == sent.len() => answers,
        Ok(answers) => {
            let e = Error::Internal(format!(
                "the backend answered {} outcomes for {} renewals",
                answers.len(),
                sent.len()
            ));
            vec![Err(e); sent.len()]
        }
        Err(e) => vec![Err(e); sent.len()],
    };
    // One clock reading for the whole answer: it arrived at one moment.
    let now = env.rt.clock.now();
    for ((lock, ttl), answer) in sent.iter().zip(answers) {
        let _ = finish_extend(lock, *ttl, sent_at, now, Some(answer), true);
    }
}
