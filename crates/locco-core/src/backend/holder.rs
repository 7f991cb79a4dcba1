//! The holder label: an optional name an acquisition gives itself (`holder`), so an operator
//! or a rival can see who holds a key.
//!
//! The label travels inside the value every backend already stores, after the token:
//! `<token>|locco:holder=<label>`. The engine sends that whole string as the attempt's token,
//! so a backend stores it, compares it on release, extend and `is_held`, and hands it over as
//! it does any token: no backend needed a new column, field or script, the uncontended Redis
//! acquire stays one `SET NX`, and an acquisition without a label sends exactly the token it
//! sent before. On Redis the fair queue's `|locco:waited` mark goes after the whole value, so
//! a label never contains `|` (nor control characters, which a PostgreSQL `text` or a log
//! line cannot carry well).
//!
//! Values written without a label (by an older version, or without `holder`) have no mark and
//! read as "no holder known".

use crate::engine::error::{Error, Result};

/// Between the token and the label in a stored value.
pub const HOLDER_MARK: &str = "|locco:holder=";
/// The longest label, in bytes.
pub const MAX_HOLDER_BYTES: usize = 256;
/// After the value of a Redis key held while someone waits (see the Redis backend).
const WAITED_SUFFIX: &str = "|locco:waited";

/// Checks a label: a non-empty string of at most [`MAX_HOLDER_BYTES`] bytes without `|` or
/// control characters. The error names `holder`.
pub fn validate_holder(holder: &str) -> Result<()> {
    if holder.is_empty() {
        return Err(Error::validation("holder", "must be a non-empty string"));
    }
    if holder.len() > MAX_HOLDER_BYTES {
        return Err(Error::validation(
            "holder",
            format!("is {} bytes; the limit is {MAX_HOLDER_BYTES}", holder.len()),
        ));
    }
    if let Some(c) = holder.chars().find(|c| *c == '|' || c.is_control()) {
        return Err(Error::validation(
            "holder",
            format!(
                "must not contain {c:?}: the label is stored after the token, where '|' and \
                 control characters cannot be told apart from the stored value's marks"
            ),
        ));
    }
    Ok(())
}

/// The token an attempt sends: `token` itself without a label, else `token` and the label.
pub fn labelled(token: String, holder: Option<&str>) -> String {
    match holder {
        None => token,
        Some(h) => {
            let mut out = token;
            out.reserve(HOLDER_MARK.len() + h.len());
            out.push_str(HOLDER_MARK);
            out.push_str(h);
            out
        }
    }
}

/// The label in a stored value (a Redis value's `|locco:waited` mark taken off first), or
/// `None` for a value without one.
pub fn holder_of(value: &str) -> Option<String> {
    let value = value.strip_suffix(WAITED_SUFFIX).unwrap_or(value);
    let at = value.rfind(HOLDER_MARK)?;
    let label = &value[at + HOLDER_MARK.len()..];
    (!label.is_empty() && !label.contains('|')).then(|| label.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_label_rides_after_the_token_and_reads_back() {
        let t = labelled("abc".into(), Some("worker-1 (pid 7)"));
        assert_eq!(t, "abc|locco:holder=worker-1 (pid 7)");
        assert_eq!(holder_of(&t).as_deref(), Some("worker-1 (pid 7)"));
        assert_eq!(
            holder_of(&format!("{t}|locco:waited")).as_deref(),
            Some("worker-1 (pid 7)")
        );
        assert_eq!(labelled("abc".into(), None), "abc");
        assert_eq!(holder_of("abc"), None);
        assert_eq!(holder_of("abc|locco:waited"), None);
    }

    #[test]
    fn labels_are_checked() {
        assert!(validate_holder("api-7f9c").is_ok());
        assert!(validate_holder("ünïcode ✓").is_ok());
        for bad in ["", "a|b", "a\nb", "a\u{0}b"] {
            let e = validate_holder(bad).unwrap_err();
            assert!(matches!(e, Error::Validation { ref field, .. } if field == "holder"));
        }
        assert!(validate_holder(&"x".repeat(256)).is_ok());
        assert!(validate_holder(&"x".repeat(257)).is_err());
    }
}
