//! Options of a Locker and of one acquisition, and their validation.

use std::rc::Rc;

use crate::contract::MAX_TTL_MS;
use crate::engine::events::{EventSink, LossListener};
use crate::engine::retry::{RetryOverrides, RetryPolicy};
use crate::rt::error::{Error, Result};

/// The longest key, in bytes, prefix included.
pub const MAX_KEY_BYTES: usize = 4096;

/// Makes the random value stored under a key.
pub type TokenSource = Rc<dyn Fn() -> Result<String>>;

/// Options of a [`crate::engine::locker::Locker`].
#[derive(Clone, Default)]
pub struct LockerOptions {
    /// Prepended to every key.
    pub key_prefix: String,
    /// Take a fencing token with every acquisition.
    pub fencing: bool,
    /// The Locker's retry defaults, over the built-in ones.
    pub retry: RetryOverrides,
    /// Receives every event.
    pub events: Option<Rc<dyn EventSink>>,
    /// Told the moment a lock is known lost.
    pub loss: Option<Rc<dyn LossListener>>,
    /// Replaces the default token (16 random bytes as hex).
    pub token: Option<TokenSource>,
}

/// The heartbeat of a lock.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AutoExtend {
    /// Milliseconds between extensions, counted from when the previous request left.
    /// Default a third of the TTL; at most half of it.
    pub interval: Option<f64>,
    /// The hold deadline, counted from acquisition. Required: no heartbeat runs forever.
    pub max_hold: f64,
    /// An extension goes out only when the host's event loop ran within this many ms of the
    /// tick's due time. Default: the interval.
    pub max_event_loop_lag: Option<f64>,
}

/// Options of one acquisition.
#[derive(Clone)]
pub struct AcquireOptions {
    /// Lease length in milliseconds.
    pub ttl: u32,
    /// The merged retry policy (built-in, Locker, call).
    pub retry: RetryPolicy,
    pub auto_extend: Option<AutoExtend>,
    /// A label stored with the lock, so that others can see who holds it (see
    /// [`crate::contract::value`]). Default none.
    pub holder: Option<String>,
}

impl AcquireOptions {
    pub fn new(ttl: u32) -> Self {
        AcquireOptions {
            ttl,
            retry: RetryPolicy::default(),
            auto_extend: None,
            holder: None,
        }
    }

    pub fn with_holder(mut self, holder: impl Into<String>) -> Self {
        self.holder = Some(holder.into());
        self
    }

    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    pub fn with_auto_extend(mut self, auto_extend: AutoExtend) -> Self {
        self.auto_extend = Some(auto_extend);
        self
    }

    /// Checks every field; the error names the field.
    /// The first lease: the TTL, cut to `maxHold` when that is shorter.
    pub(crate) fn first_ttl(&self) -> u32 {
        match self.auto_extend {
            Some(ax) if ax.max_hold < self.ttl as f64 => ax.max_hold.max(1.0) as u32,
            _ => self.ttl,
        }
    }

    pub fn validate(&self) -> Result<()> {
        validate_ttl("ttl", self.ttl as f64)?;
        if let Some(h) = &self.holder {
            crate::contract::value::validate_holder(h)?;
        }
        if let Some(t) = self.retry.timeout {
            crate::engine::retry::non_negative("retry.timeout", t)?;
        }
        if let crate::engine::retry::Delay::Fixed(d) = self.retry.delay {
            crate::engine::retry::non_negative("retry.delay", d)?;
        }
        if let Some(ax) = &self.auto_extend {
            let interval = ax.interval.unwrap_or(self.ttl as f64 / 3.0);
            if !(interval.is_finite() && interval > 0.0) {
                return Err(Error::validation(
                    "autoExtend.interval",
                    "must be a positive number",
                ));
            }
            if interval > self.ttl as f64 / 2.0 {
                return Err(Error::validation(
                    "autoExtend.interval",
                    format!(
                        "must be at most half the ttl ({} ms), got {interval}",
                        self.ttl / 2
                    ),
                ));
            }
            if !(ax.max_hold.is_finite() && ax.max_hold > 0.0) {
                return Err(Error::validation(
                    "autoExtend.maxHold",
                    "must be a positive number of ms",
                ));
            }
            if let Some(lag) = ax.max_event_loop_lag {
                if !(lag.is_finite() && lag > 0.0) {
                    return Err(Error::validation(
                        "autoExtend.maxEventLoopLag",
                        "must be a positive number of ms",
                    ));
                }
            }
        }
        Ok(())
    }
}

/// A lease length: a whole number of ms from 1 to 2^31-1.
pub fn validate_ttl(field: &str, ttl: f64) -> Result<()> {
    if ttl.is_finite() && ttl.fract() == 0.0 && (1.0..=MAX_TTL_MS).contains(&ttl) {
        Ok(())
    } else {
        Err(Error::validation(
            field,
            format!("must be a whole number of ms from 1 to 2147483647, got {ttl}"),
        ))
    }
}

/// A key: a non-empty string of at most [`MAX_KEY_BYTES`] bytes once prefixed.
pub fn validate_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::validation("key", "must be a non-empty string"));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(Error::validation(
            "key",
            format!(
                "is {} bytes with its prefix; the limit is {MAX_KEY_BYTES}",
                key.len()
            ),
        ));
    }
    Ok(())
}
