//! The JavaScript side as Rust sees it: the facade's trampolines and its realms ([`calls`]),
//! values ([`values`]), errors ([`errors`]) and text ([`text`]).

pub mod calls;
pub mod errors;
pub mod text;
pub mod values;

pub use calls::{call, call_in, check, env, realm_of, register, Trampoline};
pub use errors::{error_value, error_value_in, foreign};
pub use values::{boolean, get_f64, get_string, key_info, null, num, string, undefined};
