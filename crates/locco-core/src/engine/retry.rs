//! Retry options: how many attempts, how long between them, and the budget for all of them.

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;

use crate::rt::error::{Error, Result};

/// Computes the wait before an attempt; may be asynchronous (a JavaScript `DelayFn`).
pub trait DelayFn {
    fn delay(&self, input: DelayInput) -> Pin<Box<dyn Future<Output = Result<f64>>>>;
}

/// What a [`DelayFn`] is told.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DelayInput {
    /// The attempt that just failed, from 1.
    pub attempt: u32,
    /// Milliseconds since the acquisition started.
    pub elapsed_ms: f64,
    /// The previous wait, 0 before the first.
    pub previous_delay: f64,
}

/// Exponential backoff: `base * factor^(attempt-1)`, capped at `max`. With `jitter`, the wait
/// is drawn uniformly from the upper half of that value, so contenders spread out while the
/// wait still grows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    pub base: f64,
    pub max: f64,
    pub factor: f64,
    pub jitter: bool,
}

impl Backoff {
    pub fn new(base: f64, max: f64) -> Result<Self> {
        let b = Backoff {
            base,
            max,
            factor: 2.0,
            jitter: true,
        };
        b.validate()?;
        Ok(b)
    }

    pub fn with_factor(mut self, factor: f64) -> Self {
        self.factor = factor;
        self
    }

    pub fn with_jitter(mut self, jitter: bool) -> Self {
        self.jitter = jitter;
        self
    }

    pub fn validate(&self) -> Result<()> {
        non_negative("base", self.base)?;
        non_negative("max", self.max)?;
        if !(self.factor.is_finite() && self.factor >= 1.0) {
            return Err(Error::validation("factor", "must be a finite number >= 1"));
        }
        if self.max < self.base {
            return Err(Error::validation("max", "must be at least base"));
        }
        Ok(())
    }

    pub fn delay(&self, attempt: u32) -> f64 {
        let exp = self.factor.powi(attempt.saturating_sub(1).min(1024) as i32);
        let full = (self.base * exp).min(self.max);
        if self.jitter {
            full / 2.0 + rand::random::<f64>() * full / 2.0
        } else {
            full
        }
    }
}

/// The wait between attempts.
#[derive(Clone)]
pub enum Delay {
    Fixed(f64),
    Backoff(Backoff),
    Custom(Rc<dyn DelayFn>),
}

impl std::fmt::Debug for Delay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Delay::Fixed(ms) => write!(f, "Fixed({ms})"),
            Delay::Backoff(b) => write!(f, "{b:?}"),
            Delay::Custom(_) => write!(f, "Custom"),
        }
    }
}

impl Delay {
    /// The wait before the next attempt, in milliseconds.
    pub async fn next(&self, input: DelayInput) -> Result<f64> {
        let ms = match self {
            Delay::Fixed(ms) => *ms,
            Delay::Backoff(b) => b.delay(input.attempt),
            Delay::Custom(f) => f.delay(input).await?,
        };
        if !(ms.is_finite() && ms >= 0.0) {
            return Err(Error::validation(
                "retry.delay",
                format!("the delay function returned {ms}; it must return a finite number >= 0"),
            ));
        }
        Ok(ms)
    }
}

/// A complete retry policy. `retries: None` retries until the timeout or the abort.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    pub retries: Option<u32>,
    pub delay: Delay,
    pub timeout: Option<f64>,
    /// What a transient backend failure (a refused or dropped connection, a timeout) does to
    /// an acquisition: end it, or count as a try and go on within the budget.
    pub on_backend_error: OnBackendError,
}

/// What an acquisition does when an attempt fails on the backend rather than on contention.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnBackendError {
    /// The failure ends the acquisition (a waiter already in a fair queue still rides out a
    /// dropped connection, since its place is worth keeping).
    #[default]
    Fail,
    /// A transient failure is one more try: the acquisition waits its delay and tries again,
    /// within its retries and timeout, and ends with that failure when they are spent.
    Retry,
}

impl Default for RetryPolicy {
    /// Ten retries, 200 ms apart, no overall timeout.
    fn default() -> Self {
        RetryPolicy {
            retries: Some(10),
            delay: Delay::Fixed(200.0),
            timeout: None,
            on_backend_error: OnBackendError::Fail,
        }
    }
}

/// Some fields of a policy: the Locker's defaults, or one call's overrides.
#[derive(Debug, Clone, Default)]
pub struct RetryOverrides {
    pub retries: Option<Option<u32>>,
    pub delay: Option<Delay>,
    pub timeout: Option<Option<f64>>,
    pub on_backend_error: Option<OnBackendError>,
}

impl RetryPolicy {
    /// Applies `layer` field by field: a field the layer leaves out keeps its value.
    pub fn merged(mut self, layer: &RetryOverrides) -> Self {
        if let Some(r) = layer.retries {
            self.retries = r;
        }
        if let Some(d) = &layer.delay {
            self.delay = d.clone();
        }
        if let Some(t) = layer.timeout {
            self.timeout = t;
        }
        if let Some(o) = layer.on_backend_error {
            self.on_backend_error = o;
        }
        self
    }
}

pub(crate) fn non_negative(field: &str, v: f64) -> Result<()> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(Error::validation(
            field,
            format!("must be a finite number >= 0, got {v}"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_three_layers_per_field() {
        let locker = RetryOverrides {
            retries: Some(Some(3)),
            delay: Some(Delay::Fixed(50.0)),
            ..Default::default()
        };
        let call = RetryOverrides {
            timeout: Some(Some(1000.0)),
            retries: Some(None),
            ..Default::default()
        };
        let p = RetryPolicy::default().merged(&locker).merged(&call);
        assert_eq!(p.retries, None);
        assert!(matches!(p.delay, Delay::Fixed(ms) if ms == 50.0));
        assert_eq!(p.timeout, Some(1000.0));
    }

    #[test]
    fn backoff_grows_and_caps() {
        let b = Backoff::new(100.0, 1000.0).unwrap().with_jitter(false);
        assert_eq!(b.delay(1), 100.0);
        assert_eq!(b.delay(2), 200.0);
        assert_eq!(b.delay(4), 800.0);
        assert_eq!(b.delay(5), 1000.0);
        assert_eq!(b.delay(u32::MAX), 1000.0);
        let j = Backoff::new(100.0, 1000.0).unwrap();
        for _ in 0..100 {
            let d = j.delay(3);
            assert!((200.0..=400.0).contains(&d), "{d}");
        }
        assert!(Backoff::new(100.0, 10.0).is_err());
    }
}
