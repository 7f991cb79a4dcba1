//! A profiling aid, not a benchmark with a floor: the in-memory contended hand-off of
//! `bench/memory.mjs` (8 workers, one key, every acquisition waits for the previous holder),
//! run by the engine alone on a single-threaded executor, without Node.js or the binding.
//! It shows what the engine's part of a hand-off costs, and builds in seconds, so a change to
//! the acquisition path can be profiled without a release build of the addon:
//!
//!     cargo run --release -p locco-core --example contended
//!     perf record -g target/release/examples/contended
//!
//! Each worker's step reads the clocks once, as the addon's calls from JavaScript do
//! (`one_reading`); `EVERY_READING=1` asks the system at every reading instead.

use std::cell::Cell;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Instant;

use futures_executor::LocalPool;
use futures_util::task::LocalSpawnExt;
use locco_core::{
    one_reading, AcquireOptions, Delay, LocalFuture, Locker, LockerOptions, MemoryBackend,
    RetryPolicy, Runtime, Spawn,
};

const WORKERS: usize = 8;
const ACQUISITIONS: u32 = 300_000;
const ROUNDS: usize = 5;

struct Spawner(futures_executor::LocalSpawner);

impl Spawn for Spawner {
    fn spawn(&self, task: LocalFuture<()>) {
        self.0.spawn_local(task).expect("the pool runs");
    }
}

/// Lets the other tasks run once, as an `await` of a settled promise does in JavaScript.
async fn yield_once() {
    let mut yielded = false;
    poll_fn(|cx| {
        if std::mem::replace(&mut yielded, true) {
            return Poll::Ready(());
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await
}

/// Polls its future with the clocks read at most once per poll, unless `every_reading`.
struct Readings<F> {
    fut: Pin<Box<F>>,
    every_reading: bool,
}

impl<F: Future> Future for Readings<F> {
    type Output = F::Output;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        if self.every_reading {
            return self.fut.as_mut().poll(cx);
        }
        one_reading(|| self.fut.as_mut().poll(cx))
    }
}

/// Statistics of one round: hand-offs per second, and how many acquisitions changed owner.
struct Round {
    per_second: f64,
    changed: u32,
}

fn round(pool: &mut LocalPool, locker: &Rc<Locker>, every_reading: bool) -> Round {
    let options = AcquireOptions::new(30_000).with_retry(RetryPolicy {
        retries: None,
        delay: Delay::Fixed(1000.0),
        timeout: None,
        ..Default::default()
    });
    let done = Rc::new(Cell::new(0u32));
    let changed = Rc::new(Cell::new(0u32));
    let last = Rc::new(Cell::new(usize::MAX));
    let finished = Rc::new(Cell::new(None::<Instant>));
    let started = Instant::now();
    for worker in 0..WORKERS {
        let (locker, options) = (locker.clone(), options.clone());
        let (done, changed, last, finished) = (
            done.clone(),
            changed.clone(),
            last.clone(),
            finished.clone(),
        );
        let work = async move {
            while done.get() < ACQUISITIONS {
                let lock = locker.acquire("contended", options.clone(), None).await;
                let lock = lock.expect("acquired");
                done.set(done.get() + 1);
                if done.get() == ACQUISITIONS {
                    finished.set(Some(Instant::now()));
                }
                if last.replace(worker) != worker {
                    changed.set(changed.get() + 1);
                }
                // Held across a turn, so that the others queue behind it.
                yield_once().await;
                lock.release(true).await.expect("released");
                yield_once().await;
            }
        };
        let work = Readings {
            fut: Box::pin(work),
            every_reading,
        };
        pool.spawner().spawn_local(work).expect("the pool runs");
    }
    // Runs until the timer's driver is done too: the round ends at the last acquisition.
    pool.run();
    let elapsed = finished.get().expect("a last acquisition") - started;
    Round {
        per_second: f64::from(ACQUISITIONS) / elapsed.as_secs_f64(),
        changed: changed.get(),
    }
}

fn main() {
    let mut pool = LocalPool::new();
    let runtime = Runtime::system(Rc::new(Spawner(pool.spawner())));
    let backend = Rc::new(MemoryBackend::default());
    let locker = Rc::new(Locker::new(backend, runtime, LockerOptions::default()).expect("locker"));
    let every_reading = std::env::var_os("EVERY_READING").is_some_and(|v| v == "1");
    for n in 1..=ROUNDS {
        let r = round(&mut pool, &locker, every_reading);
        println!(
            "round {n}: {:.0} hand-offs/s ({:.0} ns each), owner changed {:.1}%",
            r.per_second,
            1e9 / r.per_second,
            f64::from(r.changed) * 100.0 / f64::from(ACQUISITIONS)
        );
    }
}
