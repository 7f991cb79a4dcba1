//! Strings from JavaScript, read exactly. A key is read as UTF-16 and decoded here: N-API's
//! UTF-8 read replaces a lone surrogate with U+FFFD (so `'k:\ud800'` and `'k:\udfff'` would
//! be one lock) and stops short of a multi-byte character at a buffer's end (so two long keys
//! would collapse into their common prefix).

use std::ptr;

use locco_core::Error;
use napi::bindgen_prelude::{FromNapiValue, TypeName, ValidateNapiValue};
use napi::{sys, ValueType};

/// Why a value is not a usable key.
#[derive(Debug, Clone, Copy)]
pub enum Bad {
    NotString,
    LoneSurrogate(usize),
    Nul(usize),
}

impl Bad {
    pub fn error(self, field: &str) -> Error {
        match self {
            Bad::NotString => Error::validation(field, "must be a string"),
            Bad::LoneSurrogate(at) => Error::validation(
                field,
                format!("is not well-formed UTF-16: a lone surrogate at index {at}"),
            ),
            Bad::Nul(at) => {
                Error::validation(field, format!("must not contain NUL (found at index {at})"))
            }
        }
    }
}

/// Decodes UTF-16 that must be well-formed and hold no NUL.
fn decode(units: &[u16]) -> Result<String, Bad> {
    // Nearly every key is ASCII: a byte per unit, with no surrogate to pair.
    if units.iter().all(|&u| u != 0 && u < 0x80) {
        let bytes = units.iter().map(|&u| u as u8).collect();
        return Ok(String::from_utf8(bytes).expect("ASCII is UTF-8"));
    }
    let mut out = String::with_capacity(units.len());
    let mut at = 0;
    for c in char::decode_utf16(units.iter().copied()) {
        match c {
            Ok('\0') => return Err(Bad::Nul(at)),
            Ok(c) => {
                out.push(c);
                at += c.len_utf16();
            }
            Err(_) => return Err(Bad::LoneSurrogate(at)),
        }
    }
    Ok(out)
}

/// Reads a JavaScript string exactly: a short one (nearly every key) in one call into a stack
/// buffer, a longer one after asking its length.
///
/// # Safety
/// `env` and `v` must be live handles of the current call.
pub unsafe fn read(env: sys::napi_env, v: sys::napi_value) -> Result<String, Bad> {
    // N-API writes at most the buffer's length less one unit, then a NUL: a string that filled
    // `STACK` units may have been cut short, and is read again whole.
    const STACK: usize = 256;
    let mut small = std::mem::MaybeUninit::<[u16; STACK + 1]>::uninit();
    let start = small.as_mut_ptr().cast::<u16>();
    let mut written = 0usize;
    if sys::napi_get_value_string_utf16(env, v, start, STACK + 1, &mut written)
        != sys::Status::napi_ok
    {
        return Err(Bad::NotString);
    }
    if written < STACK {
        // SAFETY: N-API wrote the first `written` units.
        return decode(std::slice::from_raw_parts(start, written));
    }
    let mut len = 0usize;
    if sys::napi_get_value_string_utf16(env, v, ptr::null_mut(), 0, &mut len)
        != sys::Status::napi_ok
    {
        return Err(Bad::NotString);
    }
    let mut large = vec![0u16; len + 1];
    let status =
        sys::napi_get_value_string_utf16(env, v, large.as_mut_ptr(), large.len(), &mut written);
    if status != sys::Status::napi_ok || written != len {
        return Err(Bad::NotString);
    }
    decode(&large[..len])
}

/// A string argument of a `#[napi]` export, read with [`read`]; the export names the field
/// when it refuses it.
pub struct Key(pub Result<String, Bad>);

impl Key {
    pub fn get(self, field: &str) -> Result<String, Error> {
        self.0.map_err(|bad| bad.error(field))
    }
}

impl FromNapiValue for Key {
    unsafe fn from_napi_value(env: sys::napi_env, v: sys::napi_value) -> napi::Result<Self> {
        Ok(Key(read(env, v)))
    }
}

impl TypeName for Key {
    fn type_name() -> &'static str {
        "string"
    }
    fn value_type() -> ValueType {
        ValueType::String
    }
}

impl ValidateNapiValue for Key {}

#[cfg(test)]
mod tests {
    use super::*;

    fn utf16(s: &str) -> Vec<u16> {
        s.encode_utf16().collect()
    }

    #[test]
    fn decodes_well_formed_text() {
        let key = "é".repeat(200) + "a😀";
        assert_eq!(decode(&utf16(&key)).unwrap(), key);
    }

    #[test]
    fn decodes_ascii_byte_for_byte() {
        let key = "order:42/~{tag}";
        assert_eq!(decode(&utf16(key)).unwrap(), key);
        assert_eq!(decode(&[]).unwrap(), "");
    }

    #[test]
    fn refuses_lone_surrogates_and_nul() {
        assert!(matches!(
            decode(&[0x6b, 0xd800]),
            Err(Bad::LoneSurrogate(1))
        ));
        assert!(matches!(
            decode(&[0xdfff, 0x6b]),
            Err(Bad::LoneSurrogate(0))
        ));
        assert!(matches!(decode(&[0x61, 0, 0x62]), Err(Bad::Nul(1))));
    }
}
