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

use crate::rt::error::{Error, Result};

/// Between the token and the label in a stored value.
pub const HOLDER_MARK: &str = "|locco:holder=";
/// The longest label, in bytes.
pub const MAX_HOLDER_BYTES: usize = 256;
/// After the value of a Redis key held while someone waits (see the Redis backend).
pub const WAITED_SUFFIX: &str = "|locco:waited";
/// Starts the value of a Redis key promised to the head of its fair queue.
pub const RESERVED_PREFIX: &str = "locco:reserved|";
/// What every mark after a token starts with ([`HOLDER_MARK`], [`WAITED_SUFFIX`]).
const MARK_START: &str = "|locco:";

/// Checks a token from a custom token source: a non-empty string that cannot be read as one
/// of the marks a stored value carries. One that started like a reservation would read as a
/// place promised to a waiter; one carrying a mark would let the holder of its front part
/// release it, or name a holder it never gave. The error names `token`.
pub fn validate_token(token: &str) -> Result<()> {
    if token.is_empty() {
        return Err(Error::validation("token", "must be a non-empty string"));
    }
    if token.starts_with(RESERVED_PREFIX) || token.contains(MARK_START) {
        return Err(Error::validation(
            "token",
            format!(
                "must not start with {RESERVED_PREFIX:?} nor contain {MARK_START:?}: those mark \
                 the values the library stores, and a token carrying them would be read as one"
            ),
        ));
    }
    Ok(())
}

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
    fn tokens_with_a_stored_values_marks_are_refused() {
        for bad in [
            "",
            "locco:reserved|x",
            "a|locco:waited",
            "a|locco:holder=b",
            "a|locco:x",
        ] {
            let e = validate_token(bad).unwrap_err();
            assert!(matches!(e, Error::Validation { ref field, .. } if field == "token"));
        }
        for fine in ["abc", "a|b", "locco:reserved", "x|locco"] {
            assert!(validate_token(fine).is_ok(), "{fine}");
        }
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
