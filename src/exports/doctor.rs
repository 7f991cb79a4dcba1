//! `adapter.checkSafety()`: the engine checks the deployment and answers its findings as JSON
//! text, which the facade parses.

use locco_core::safety::{
    findings_json, in_memory_findings, redlock_findings, Finding, SafetyOptions,
};
use locco_core::{Error, Op};
use napi_derive::napi;

use crate::registry::{Adapter, REG};
use crate::run::ops::{self, Answer, Raw};

/// The options of one check (times in ms; unset: the engine's defaults).
#[napi(object, object_to_js = false)]
pub struct SafetySpec {
    pub clock_sample_ms: Option<f64>,
    /// For tests only: read the holder's clock as this many times the real one.
    pub holder_clock_rate: Option<f64>,
}

fn options_of(spec: SafetySpec) -> Result<SafetyOptions, Error> {
    let mut options = SafetyOptions::default();
    if let Some(ms) = spec.clock_sample_ms {
        if !(ms.is_finite() && ms >= 0.0 && ms.fract() == 0.0 && ms <= 600_000.0) {
            return Err(Error::validation(
                "clockSampleMs",
                format!("must be a whole number of ms from 0 to 600000, got {ms}"),
            ));
        }
        options = options.with_clock_sample_ms(ms as u64);
    }
    if let Some(rate) = spec.holder_clock_rate {
        if !(rate.is_finite() && rate > 0.0) {
            return Err(Error::validation(
                "holderClockRate",
                format!("must be a positive number, got {rate}"),
            ));
        }
        options = options.with_holder_clock_rate(rate);
    }
    Ok(options)
}

/// Checks adapter `adapter_id`'s deployment; answers the findings as a JSON array.
#[napi(catch_unwind)]
pub fn check_safety(adapter_id: f64, spec: SafetySpec, op_id: f64) -> Raw {
    let options = match options_of(spec) {
        Ok(o) => o,
        Err(e) => return ops::fail(e),
    };
    let op: Option<Op<Vec<Finding>>> =
        REG.with(|r| match r.borrow().adapters.get(&(adapter_id as u64))? {
            Adapter::Redis(b) => Some(b.inner().check_safety(options)),
            Adapter::Postgres(b) => Some(b.inner().check_safety(options)),
            Adapter::Mongo(b) => Some(b.inner().check_safety(options)),
            Adapter::Etcd(b) => Some(b.inner().check_safety(options)),
            Adapter::Memory(_) => Some(Op::ready(Ok(in_memory_findings()))),
            Adapter::Redlock(_) => Some(Op::ready(Ok(redlock_findings()))),
        });
    let Some(op) = op else {
        return ops::fail(Error::Internal(format!(
            "unknown built-in adapter {adapter_id}"
        )));
    };
    ops::run(
        op_id,
        async move { Ok(Answer::Text(findings_json(&op.await?))) },
    )
}
