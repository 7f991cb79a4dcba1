//! What the binding needs of the host below JavaScript: the libuv loop's sockets and wake-ups
//! (Unix), busy polling between them, and the allocator (Linux).

#[cfg(target_os = "linux")]
pub mod alloc;
#[cfg(unix)]
pub mod busy_poll;
#[cfg(unix)]
pub mod uv_loop;
