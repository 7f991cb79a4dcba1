//! A check of a deployment against what the lock relies on (`adapter.checkSafety()`, `locco-rs
//! doctor`): each backend gathers the facts from its server and judges them here into
//! [`Finding`]s, and the holder clock's rate is measured against the server's clock.
//!
//! The checks read settings and catalog entries; they never write a lock, create a table or
//! an index.

use std::time::Duration;

use crate::backend::shared::io::Failure;
use crate::rt::clock::monotonic_ms;
use crate::rt::clock::CLOCK_DRIFT_FACTOR;

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// Worth knowing; nothing to fix (or a check that could not run).
    Info,
    /// Weakens a guarantee in some failure (a failover, a restart), or costs availability.
    Warning,
    /// The lock can be granted to two holders at once, or not at all, in ordinary operation.
    Unsafe,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Unsafe => "unsafe",
        }
    }
}

/// One thing the check found: what it is, why it matters, and how to fix it.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    /// Stable, dotted: `redis.maxmemory-policy`, `postgres.primary-key`, `clock.rate`…
    pub id: String,
    pub severity: Severity,
    /// What was found, with the values read.
    pub message: String,
    /// What it does to the locks.
    pub why: String,
    /// What to change.
    pub fix: String,
}

impl Finding {
    pub fn new(
        id: &str,
        severity: Severity,
        message: impl Into<String>,
        why: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Finding {
            id: id.to_owned(),
            severity,
            message: message.into(),
            why: why.into(),
            fix: fix.into(),
        }
    }

    /// An info finding for a check the server did not let us run.
    pub fn not_checked(id: &str, what: &str, reason: impl std::fmt::Display) -> Self {
        Finding::new(
            id,
            Severity::Info,
            format!("could not check {what}: {reason}"),
            "the server refused or does not know the command (managed services often rename or \
             disable admin commands), so this part of the set-up is unknown",
            format!("check {what} by hand, or run the check with a role that may read it"),
        )
    }
}

/// What the check may do.
#[derive(Debug, Clone)]
pub struct SafetyOptions {
    /// How long to compare the holder's clock with the server's, in ms. Default 3000; 0 skips
    /// the clock check.
    pub clock_sample_ms: u64,
    /// For tests: the holder's clock is read as this many times the real one (1.0 = the real
    /// clock), to see that a skewed clock is caught.
    pub holder_clock_rate: f64,
}

impl Default for SafetyOptions {
    fn default() -> Self {
        SafetyOptions {
            clock_sample_ms: 3000,
            holder_clock_rate: 1.0,
        }
    }
}

impl SafetyOptions {
    pub fn with_clock_sample_ms(mut self, ms: u64) -> Self {
        self.clock_sample_ms = ms;
        self
    }

    pub fn with_holder_clock_rate(mut self, rate: f64) -> Self {
        self.holder_clock_rate = rate;
        self
    }

    /// The holder's clock as the lease clock reads it (ms), scaled for tests.
    fn holder_now(&self) -> f64 {
        monotonic_ms() * self.holder_clock_rate
    }
}

/// One reading of the server's clock, bracketed by the holder's.
#[derive(Debug, Clone, Copy)]
struct Sample {
    /// Holder ms at the round trip's midpoint.
    mid: f64,
    /// Half the round trip, ms: how far the server's reading can be from `mid`.
    half_rtt: f64,
    /// Server ms.
    server: f64,
}

/// How many round trips each end of the interval takes; the fastest of each is used.
const SAMPLES_PER_END: usize = 7;
/// A few more spread over the interval, only to see the server's clock did not step.
const MIDDLE_SAMPLES: usize = 3;

/// Compares the holder's clock rate with the server's over `options.clock_sample_ms`.
///
/// `server_ms` reads the server's clock once (ms, any origin); `resolution_ms` is the finest
/// step it reports. Each end of the interval takes several round trips and keeps the fastest,
/// whose midpoint is closest to the moment the server read its clock (the least jitter), so
/// the rate is `Δserver / Δholder` between two well-placed readings, give or take the sum of
/// their half round trips and resolutions over the interval. That error bar decides how sure
/// the verdict is.
pub(crate) async fn check_clock<F, Fut>(
    backend: &str,
    server_clock: &str,
    resolution_ms: f64,
    options: &SafetyOptions,
    mut server_ms: F,
) -> Finding
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<f64, Failure>>,
{
    if options.clock_sample_ms == 0 {
        return Finding::new(
            "clock.rate",
            Severity::Info,
            "the clock check was skipped (clockSampleMs: 0)",
            clock_why(),
            "run the check with clockSampleMs of a few seconds",
        );
    }
    let started = std::time::Instant::now();
    let first = match burst(options, &mut server_ms).await {
        Ok(s) => s,
        Err(f) => return Finding::not_checked("clock.rate", server_clock, f.message),
    };
    let mut middle = Vec::new();
    let total = Duration::from_millis(options.clock_sample_ms);
    for i in 1..=MIDDLE_SAMPLES {
        let at = total.mul_f64(i as f64 / (MIDDLE_SAMPLES + 1) as f64);
        tokio::time::sleep(at.saturating_sub(started.elapsed())).await;
        match sample(options, &mut server_ms).await {
            Ok(s) => middle.push(s),
            Err(f) => return Finding::not_checked("clock.rate", server_clock, f.message),
        }
    }
    tokio::time::sleep(total.saturating_sub(started.elapsed())).await;
    let last = match burst(options, &mut server_ms).await {
        Ok(s) => s,
        Err(f) => return Finding::not_checked("clock.rate", server_clock, f.message),
    };
    let n = first.len() + middle.len() + last.len();
    judge_clock(
        backend,
        server_clock,
        resolution_ms,
        &first,
        &middle,
        &last,
        n,
    )
}

/// One reading of the server's clock between two of the holder's.
async fn sample<F, Fut>(options: &SafetyOptions, server_ms: &mut F) -> Result<Sample, Failure>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<f64, Failure>>,
{
    let before = options.holder_now();
    let server = server_ms().await?;
    let after = options.holder_now();
    Ok(Sample {
        mid: (before + after) / 2.0,
        half_rtt: ((after - before) / 2.0).max(0.0),
        server,
    })
}

/// Readings back to back, for one end of the interval.
async fn burst<F, Fut>(options: &SafetyOptions, server_ms: &mut F) -> Result<Vec<Sample>, Failure>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<f64, Failure>>,
{
    let mut got = Vec::with_capacity(SAMPLES_PER_END);
    for _ in 0..SAMPLES_PER_END {
        got.push(sample(options, server_ms).await?);
    }
    Ok(got)
}

fn fastest(samples: &[Sample]) -> Sample {
    *samples
        .iter()
        .min_by(|a, b| a.half_rtt.total_cmp(&b.half_rtt))
        .expect("a burst has samples")
}

fn clock_why() -> String {
    format!(
        "a lock's lease is timed twice: the server expires the key after the TTL on its clock, \
         and the holder stops trusting it after the TTL less {}% on its own clock. That margin \
         is all the room there is for the holder's clock to run slower than the server's: if it \
         runs slower by more, the holder still believes it holds the lock after the server has \
         expired it and granted it to someone else",
        CLOCK_DRIFT_FACTOR * 100.0
    )
}

fn judge_clock(
    backend: &str,
    server_clock: &str,
    resolution_ms: f64,
    first: &[Sample],
    middle: &[Sample],
    last: &[Sample],
    n: usize,
) -> Finding {
    let (a, b) = (fastest(first), fastest(last));
    let holder_span = b.mid - a.mid;
    let server_span = b.server - a.server;
    let margin = CLOCK_DRIFT_FACTOR;
    let pct = |x: f64| format!("{:.3}%", x * 100.0);
    if holder_span <= 0.0 || server_span <= 0.0 {
        return Finding::new(
            "clock.rate",
            Severity::Warning,
            format!(
                "the {backend} server's clock ({server_clock}) did not advance with the holder's \
                 ({server_span:.1} ms against {holder_span:.1} ms): it was stepped during the check"
            ),
            clock_why(),
            "run the check again; if it repeats, see why the server's clock jumps (NTP stepping, \
             a paused VM)",
        );
    }
    // A step of the server's clock in the middle shows as middle readings far off the line
    // between the two ends.
    let rate_line = server_span / holder_span;
    let stepped = middle.iter().any(|s| {
        let expected = a.server + (s.mid - a.mid) * rate_line;
        (s.server - expected).abs() > s.half_rtt + resolution_ms + 0.05 * holder_span
    });
    // The holder's clock runs `rate` times as fast as the server's.
    let rate = holder_span / server_span;
    let error = (a.half_rtt + b.half_rtt + 2.0 * resolution_ms) / holder_span;
    let diff = rate - 1.0;
    let measured = format!(
        "the holder's clock ran {} {} than the {backend} server's ({server_clock}), \
         ± {} ({n} round trips over {:.0} ms; the fastest took {:.2} ms)",
        pct(diff.abs()),
        if diff < 0.0 { "slower" } else { "faster" },
        pct(error),
        holder_span,
        2.0 * a.half_rtt.min(b.half_rtt)
    );
    if stepped {
        return Finding::new(
            "clock.rate",
            Severity::Warning,
            format!("{measured}, but the server's clock jumped during the check"),
            clock_why(),
            "run the check again; if it repeats, see why the server's clock steps (NTP, a \
             paused VM)",
        );
    }
    if rate < 1.0 - margin - error {
        return Finding::new(
            "clock.rate",
            Severity::Unsafe,
            format!(
                "{measured}: more than the {} margin the lease allows",
                pct(margin)
            ),
            clock_why(),
            "fix the holder's or the server's clock (NTP with slewing on both, no CPU throttling \
             that slows a VM's clock); until then the lock may be held twice near the end of a \
             lease",
        );
    }
    if error >= margin {
        return Finding::new(
            "clock.rate",
            Severity::Info,
            format!(
                "{measured}: too coarse to tell against the {} margin",
                pct(margin)
            ),
            clock_why(),
            "run the check with a longer clockSampleMs (--clock-sample), or nearer the server",
        );
    }
    if rate < 1.0 - margin {
        return Finding::new(
            "clock.rate",
            Severity::Warning,
            format!(
                "{measured}: near or beyond the {} margin the lease allows",
                pct(margin)
            ),
            clock_why(),
            "run the check again over a longer sample; if it holds, fix the clocks (NTP with \
             slewing on both machines)",
        );
    }
    let note = if rate > 1.0 + margin {
        ": faster is safe (the holder gives up its leases early), but locks may seem lost \
         before their time"
    } else {
        ": within the margin"
    };
    Finding::new(
        "clock.rate",
        Severity::Info,
        format!("{measured}{note}"),
        clock_why(),
        "nothing to do",
    )
}

/// What there is to say of the in-memory adapter: its locks stay in this process.
pub fn in_memory_findings() -> Vec<Finding> {
    vec![Finding::new(
        "memory.scope",
        Severity::Info,
        "the in-memory adapter keeps its locks in this process",
        "its locks exclude only callers in this process; other processes and machines do not \
         see them",
        "use a networked adapter (Redis, PostgreSQL, MongoDB, etcd) when several processes \
         share the keys",
    )]
}

/// A Redlock adapter is several deployments: each server is checked on its own.
pub fn redlock_findings() -> Vec<Finding> {
    vec![Finding::new(
        "redlock.not-checked",
        Severity::Info,
        "a Redlock adapter is not checked as a whole",
        "each of its Redis servers has its own settings",
        "check each server with checkSafety() of a RedisAdapter on its URL, or locco-rs doctor \
         --url",
    )]
}

/// The findings as a JSON array of `{ id, severity, message, why, fix }`.
pub fn findings_json(findings: &[Finding]) -> String {
    let mut out = String::from("[");
    for (i, f) in findings.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str("{\"id\":");
        json_string(&mut out, &f.id);
        out.push_str(",\"severity\":");
        json_string(&mut out, f.severity.as_str());
        out.push_str(",\"message\":");
        json_string(&mut out, &f.message);
        out.push_str(",\"why\":");
        json_string(&mut out, &f.why);
        out.push_str(",\"fix\":");
        json_string(&mut out, &f.fix);
        out.push('}');
    }
    out.push(']');
    out
}

fn json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(mid: f64, server: f64) -> Sample {
        Sample {
            mid,
            half_rtt: 0.05,
            server,
        }
    }

    fn verdict(holder_rate: f64, span: f64) -> Severity {
        let first = [at(0.0, 1000.0)];
        let last = [at(span * holder_rate, 1000.0 + span)];
        judge_clock("redis", "TIME", 0.001, &first, &[], &last, 2).severity
    }

    #[test]
    fn a_slow_holder_clock_beyond_the_margin_is_unsafe() {
        assert_eq!(verdict(1.0, 3000.0), Severity::Info);
        assert_eq!(verdict(0.995, 3000.0), Severity::Info);
        assert_eq!(verdict(0.97, 3000.0), Severity::Unsafe);
        // A fast holder clock gives its leases up early: safe.
        assert_eq!(verdict(1.05, 3000.0), Severity::Info);
    }

    #[test]
    fn a_measurement_too_coarse_for_the_margin_says_so() {
        let first = [Sample {
            mid: 0.0,
            half_rtt: 5.0,
            server: 0.0,
        }];
        let last = [Sample {
            mid: 300.0,
            half_rtt: 5.0,
            server: 300.0,
        }];
        let f = judge_clock("redis", "TIME", 0.001, &first, &[], &last, 2);
        assert_eq!(f.severity, Severity::Info);
        assert!(f.message.contains("too coarse"), "{}", f.message);
    }

    #[test]
    fn the_fastest_round_trip_of_each_end_is_used() {
        // A slow first round trip, whose reading lands late in its window, would put the rate
        // 0.5% off and the error bar at 1.4%: too coarse. The fast ones tell it to 0.003%.
        let slow = |mid: f64, server: f64| Sample {
            mid,
            half_rtt: 20.0,
            server: server + 15.0,
        };
        let first = [slow(0.0, 1000.0), at(50.0, 1050.0)];
        let last = [slow(3000.0, 4000.0), at(3050.0, 4050.0)];
        let f = judge_clock("redis", "TIME", 0.001, &first, &[], &last, 4);
        assert_eq!(f.severity, Severity::Info);
        assert!(f.message.contains("within the margin"), "{}", f.message);
    }

    #[test]
    fn findings_are_json() {
        let f = Finding::new("a.b", Severity::Unsafe, "say \"x\"\n", "w", "f");
        assert_eq!(
            findings_json(&[f]),
            r#"[{"id":"a.b","severity":"unsafe","message":"say \"x\"\n","why":"w","fix":"f"}]"#
        );
    }
}
