//! The lease clock: monotonic time plus any pause that only the wall clock saw.

use std::cell::Cell;
use std::time::{SystemTime, UNIX_EPOCH};

/// The local lease ends this share of the TTL early: room for a holder clock that runs slower
/// than the backend's (the margin Redlock uses).
pub const CLOCK_DRIFT_FACTOR: f64 = 0.01;

/// Where a lease ends on the holder's clock, for a request that left at `sent_at`.
pub fn lease_end(sent_at: f64, ttl: u32) -> f64 {
    sent_at + ttl as f64 * (1.0 - CLOCK_DRIFT_FACTOR)
}

/// A monotonic clock in milliseconds. Implementations never step backwards.
pub trait Clock {
    fn now(&self) -> f64;
}

/// Reads `clock`, refusing a reading that is not a finite number. An injected clock that
/// answers NaN would otherwise make every deadline look passed, so a retry loop would run
/// without ever waiting; the operation that read it fails instead, naming the option.
pub(crate) fn checked_now(clock: &dyn Clock) -> crate::rt::error::Result<f64> {
    let now = clock.now();
    if now.is_finite() {
        return Ok(now);
    }
    // Spelled as JavaScript spells it: the injected clock is usually a JS function.
    let shown = if now.is_nan() {
        "NaN"
    } else if now > 0.0 {
        "Infinity"
    } else {
        "-Infinity"
    };
    Err(crate::rt::error::Error::validation(
        "now",
        format!("the injected clock returned {shown}; it must return a finite number of ms"),
    ))
}

/// Raw readings for [`LeaseClock`]; replaced in tests.
pub trait TimeSource {
    /// Milliseconds of a clock that stops while the machine sleeps or the VM is paused.
    fn monotonic(&self) -> f64;
    /// Milliseconds of the wall clock, which keeps counting through such pauses.
    fn wall(&self) -> f64;
    /// Both, (monotonic, wall): one reading for a source that reads them together.
    fn both(&self) -> (f64, f64) {
        (self.monotonic(), self.wall())
    }
}

/// The process's clocks.
pub struct SystemSource;

/// Milliseconds since an arbitrary origin, from the monotonic clock; the same origin on
/// every thread.
#[cfg(target_os = "linux")]
pub fn monotonic_ms() -> f64 {
    // Read directly: through `Instant` a reading also paid a thread-local origin and a
    // checked subtraction, a third of its cost, on the hottest path of an acquisition.
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write into; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 * 1000.0 + ts.tv_nsec as f64 / 1e6
}

#[cfg(not(target_os = "linux"))]
pub fn monotonic_ms() -> f64 {
    use std::time::Instant;
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    ORIGIN.get_or_init(Instant::now).elapsed().as_secs_f64() * 1000.0
}

impl TimeSource for SystemSource {
    fn monotonic(&self) -> f64 {
        monotonic_reading()
    }
    fn wall(&self) -> f64 {
        shared_reading().1
    }
    fn both(&self) -> (f64, f64) {
        shared_reading()
    }
}

/// The [`one_reading`] scopes open on this thread, and the reading they share: one
/// thread-local, read once per reading (in the addon, a shared library, each thread-local
/// access is a call into the dynamic loader).
#[derive(Clone, Copy)]
struct Scopes {
    open: u32,
    reading: Option<(f64, f64)>,
}

thread_local! {
    static SCOPES: Cell<Scopes> = const { Cell::new(Scopes { open: 0, reading: None }) };
}

/// Runs `f` with the process's clocks read at most once: every reading of [`SystemSource`] and
/// [`MonotonicClock`] in it answers the first one's (monotonic, wall) pair, until
/// [`fresh_reading`]. For one synchronous call from JavaScript, which reads the clock about
/// ten times within microseconds; a reading is reused only while nothing but the engine has
/// run, so it is never older than the call. Lease starts read so are earlier, the safe side.
pub fn one_reading<R>(f: impl FnOnce() -> R) -> R {
    struct Close;
    impl Drop for Close {
        fn drop(&mut self) {
            SCOPES.with(|s| {
                let open = s.get().open - 1;
                // The last scope closed forgets the reading.
                let reading = s.get().reading.filter(|_| open > 0);
                s.set(Scopes { open, reading });
            });
        }
    }
    SCOPES.with(|s| {
        let mut scopes = s.get();
        scopes.open += 1;
        s.set(scopes);
    });
    let _close = Close;
    f()
}

/// Forgets the shared reading of the open [`one_reading`] scope: code outside the engine
/// (JavaScript) is about to run, and may take any time.
pub fn fresh_reading() {
    SCOPES.with(|s| {
        let mut scopes = s.get();
        scopes.reading = None;
        s.set(scopes);
    });
}

/// The monotonic clock in ms, read as [`MonotonicClock`] reads it: within a [`one_reading`]
/// scope, its shared reading.
pub fn monotonic_reading() -> f64 {
    shared_reading().0
}

/// (monotonic, wall): the scope's shared reading, or a new one.
fn shared_reading() -> (f64, f64) {
    SCOPES.with(|s| {
        let scopes = s.get();
        if let Some(reading) = scopes.reading {
            return reading;
        }
        let reading = (monotonic_ms(), coarse_wall_ms());
        if scopes.open > 0 {
            s.set(Scopes {
                open: scopes.open,
                reading: Some(reading),
            });
        }
        reading
    })
}

/// The wall clock at the kernel tick's resolution (a few ms): plenty to see a pause of more
/// than [`PAUSE_THRESHOLD_MS`], and much cheaper to read than the precise clock.
#[cfg(target_os = "linux")]
fn coarse_wall_ms() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write into.
    if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) } == 0 {
        ts.tv_sec as f64 * 1000.0 + ts.tv_nsec as f64 / 1e6
    } else {
        precise_wall_ms()
    }
}

#[cfg(not(target_os = "linux"))]
fn coarse_wall_ms() -> f64 {
    precise_wall_ms()
}

fn precise_wall_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1000.0)
        .unwrap_or(0.0)
}

/// A gap between wall and monotonic time larger than this between two readings counts as a
/// pause. Smaller gaps are clock slewing and resolution noise, far below the 1% lease margin.
const PAUSE_THRESHOLD_MS: f64 = 100.0;

/// Monotonic time plus the pauses the wall clock saw and the monotonic clock did not.
///
/// A suspended laptop or a paused VM stops the monotonic clock while the backend's clock keeps
/// running; without this a lease would look alive long after the backend expired it. A wall
/// clock that steps forward also reads as a pause, which ends leases early: the safe direction.
/// A wall clock that steps back is ignored.
pub struct LeaseClock<S = SystemSource> {
    source: S,
    last: Cell<(f64, f64)>,
    paused: Cell<f64>,
}

impl LeaseClock<SystemSource> {
    pub fn system() -> Self {
        Self::new(SystemSource)
    }
}

impl<S: TimeSource> LeaseClock<S> {
    pub fn new(source: S) -> Self {
        let last = source.both();
        LeaseClock {
            source,
            last: Cell::new(last),
            paused: Cell::new(0.0),
        }
    }
}

impl<S: TimeSource> Clock for LeaseClock<S> {
    fn now(&self) -> f64 {
        let (mono, wall) = self.source.both();
        let (last_mono, last_wall) = self.last.get();
        let unseen = (wall - last_wall) - (mono - last_mono);
        if unseen > PAUSE_THRESHOLD_MS {
            self.paused.set(self.paused.get() + unseen);
        }
        self.last.set((mono, wall));
        mono + self.paused.get()
    }
}

/// The monotonic clock alone. The in-memory backend uses it: a pause stops that backend too.
pub struct MonotonicClock;

impl Clock for MonotonicClock {
    fn now(&self) -> f64 {
        monotonic_reading()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    #[derive(Clone, Default)]
    struct Fake(Rc<Cell<(f64, f64)>>);
    impl TimeSource for Fake {
        fn monotonic(&self) -> f64 {
            self.0.get().0
        }
        fn wall(&self) -> f64 {
            self.0.get().1
        }
    }

    #[test]
    fn follows_monotonic_time() {
        let src = Fake::default();
        let clock = LeaseClock::new(src.clone());
        src.0.set((500.0, 500.0));
        assert_eq!(clock.now(), 500.0);
    }

    #[test]
    fn adds_a_pause_only_the_wall_clock_saw() {
        let src = Fake::default();
        let clock = LeaseClock::new(src.clone());
        src.0.set((10.0, 10.0));
        assert_eq!(clock.now(), 10.0);
        // Suspended for 60 s: the monotonic clock moved 5 ms, the wall clock 60 s.
        src.0.set((15.0, 60_010.0));
        assert_eq!(clock.now(), 60_010.0);
        // Later readings keep the pause.
        src.0.set((25.0, 60_020.0));
        assert_eq!(clock.now(), 60_020.0);
    }

    #[test]
    fn ignores_small_drift_and_backward_wall_steps() {
        let src = Fake::default();
        let clock = LeaseClock::new(src.clone());
        src.0.set((1000.0, 1050.0));
        assert_eq!(clock.now(), 1000.0);
        src.0.set((2000.0, 0.0));
        assert_eq!(clock.now(), 2000.0);
    }
}
