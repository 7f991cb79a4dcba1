//! The binding's allocator on Linux: the C library's malloc, behind a per-thread cache of
//! freed blocks of up to 4 KiB, sorted by size class.
//!
//! glibc keeps 7 freed blocks per size in its own thread cache, and none above 1,032 bytes.
//! The engine frees in bursts (a reply that finishes a thousand operations), so most frees
//! went past that cache into glibc's bins, and the next allocations paid their slow path
//! (sorting, coalescing): a fifth of Node's time when 300,000 Redis locks were acquired 4,096
//! at a time. Here a thread keeps up to [`CACHE_BYTES`] per class and reuses them first.
//! (mimalloc was tried before: v3 crashed on a worker thread when loaded by dlopen, v2 was
//! slower on the contended in-memory benchmark.)
//!
//! Every block comes from `malloc` with its class's size, so any thread may cache or free it.
//! A JavaScript thread's cache goes back to `free` at its environment's teardown
//! ([`close_this_thread`]): Node unloads an addon that only a worker loaded once the worker
//! ends, so nothing of the library may run at thread exit (a pthread key's destructor would).
//! The binding's other threads live as long as the process.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::UnsafeCell;
use std::ptr;

/// Classes every 16 bytes up to 1 KiB, then every 128 bytes up to 4 KiB.
const FINE_STEP: usize = 16;
const FINE_MAX: usize = 1024;
const COARSE_STEP: usize = 128;
const CACHED_MAX: usize = 4096;
const CLASSES: usize = 1 + FINE_MAX / FINE_STEP + (CACHED_MAX - FINE_MAX) / COARSE_STEP;
/// What one thread keeps of one class.
const CACHE_BYTES: usize = 128 * 1024;
/// `malloc` aligns to 16 bytes on every 64-bit Linux target; larger alignments are passed on.
const MALLOC_ALIGN: usize = 16;

/// The class of a block of `size` bytes (at least 1), when blocks that large are cached.
fn class_of(size: usize) -> Option<usize> {
    if size <= FINE_MAX {
        Some(size.div_ceil(FINE_STEP))
    } else if size <= CACHED_MAX {
        Some(FINE_MAX / FINE_STEP + (size - FINE_MAX).div_ceil(COARSE_STEP))
    } else {
        None
    }
}

/// The size of the blocks of `class`.
fn class_size(class: usize) -> usize {
    let fine = FINE_MAX / FINE_STEP;
    if class <= fine {
        class * FINE_STEP
    } else {
        FINE_MAX + (class - fine) * COARSE_STEP
    }
}

/// A cached block: its first word links to the next of its class.
struct Free {
    next: *mut Free,
}

struct Cache {
    heads: [*mut Free; CLASSES],
    counts: [u32; CLASSES],
    /// The thread's environment is gone: frees go straight to `free`.
    closed: bool,
}

thread_local! {
    // No destructor (see the module docs): one would run at thread exit, and a value it
    // dropped could be asked for by later thread-exit destructors that free memory.
    static CACHE: UnsafeCell<Cache> = const {
        UnsafeCell::new(Cache {
            heads: [ptr::null_mut(); CLASSES],
            counts: [0; CLASSES],
            closed: false,
        })
    };
}

pub struct ThreadCached;

unsafe impl GlobalAlloc for ThreadCached {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let Some(class) = cached_class(layout) else {
            return large_alloc(layout);
        };
        let reused = CACHE.with(|c| {
            let cache = &mut *c.get();
            let head = cache.heads[class];
            if !head.is_null() {
                cache.heads[class] = (*head).next;
                cache.counts[class] -= 1;
            }
            head
        });
        if reused.is_null() {
            libc::malloc(class_size(class)).cast()
        } else {
            reused.cast()
        }
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        let Some(class) = cached_class(layout) else {
            return libc::free(block.cast());
        };
        let kept = CACHE.with(|c| {
            let cache = &mut *c.get();
            if cache.closed || cache.counts[class] as usize * class_size(class) >= CACHE_BYTES {
                return false;
            }
            let free = block.cast::<Free>();
            (*free).next = cache.heads[class];
            cache.heads[class] = free;
            cache.counts[class] += 1;
            true
        });
        if !kept {
            libc::free(block.cast());
        }
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
        match (cached_class(layout), cached_class(new_layout)) {
            // The block already has room.
            (Some(a), Some(b)) if a == b => block,
            // Neither end is cached: the C library may grow the block in place.
            (None, None) if layout.align() <= MALLOC_ALIGN => {
                libc::realloc(block.cast(), new_size).cast()
            }
            _ => {
                let moved = self.alloc(new_layout);
                if !moved.is_null() {
                    ptr::copy_nonoverlapping(block, moved, layout.size().min(new_size));
                    self.dealloc(block, layout);
                }
                moved
            }
        }
    }
}

/// The class of blocks of `layout`, when they are cached.
fn cached_class(layout: Layout) -> Option<usize> {
    if layout.align() > MALLOC_ALIGN {
        return None;
    }
    class_of(layout.size())
}

unsafe fn large_alloc(layout: Layout) -> *mut u8 {
    if layout.align() <= MALLOC_ALIGN {
        return libc::malloc(layout.size()).cast();
    }
    let mut out = ptr::null_mut();
    let align = layout.align().max(std::mem::size_of::<usize>());
    if libc::posix_memalign(&mut out, align, layout.size()) != 0 {
        return ptr::null_mut();
    }
    out.cast()
}

/// Gives the calling thread's cached blocks back to `free`, and caches no more on it.
pub fn close_this_thread() {
    CACHE.with(|c| {
        // SAFETY: the cache is this thread's, and nothing else borrows it while this runs (the
        // allocator's own borrows end before they return).
        let cache = unsafe { &mut *c.get() };
        cache.closed = true;
        for class in 0..CLASSES {
            let mut at = std::mem::replace(&mut cache.heads[class], ptr::null_mut());
            while !at.is_null() {
                // SAFETY: a cached block is a live `malloc` block that only this list refers to.
                unsafe {
                    let next = (*at).next;
                    libc::free(at.cast());
                    at = next;
                }
            }
            cache.counts[class] = 0;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cached_size_fits_its_class_and_classes_grow() {
        let mut last = 0;
        for size in 1..=CACHED_MAX {
            let class = class_of(size).expect("cached");
            assert!(class > 0 && class < CLASSES, "class {class} of {size}");
            assert!(class_size(class) >= size, "{size} in class {class}");
            assert!(class >= last);
            last = class;
        }
        assert_eq!(class_of(CACHED_MAX + 1), None);
        assert_eq!(class_size(CLASSES - 1), CACHED_MAX);
    }

    #[test]
    fn blocks_come_back_reused_and_keep_their_contents_through_realloc() {
        let a = ThreadCached;
        unsafe {
            let layout = Layout::from_size_align(100, 8).unwrap();
            let p = a.alloc(layout);
            a.dealloc(p, layout);
            // The same class (97..=112 bytes) takes the freed block first.
            let q = a.alloc(Layout::from_size_align(110, 8).unwrap());
            assert_eq!(p, q);
            q.write_bytes(7, 110);
            let r = a.realloc(q, Layout::from_size_align(110, 8).unwrap(), 3000);
            assert!((0..110).all(|i| *r.add(i) == 7));
            let s = a.realloc(r, Layout::from_size_align(3000, 8).unwrap(), 10_000);
            assert!((0..110).all(|i| *s.add(i) == 7));
            a.dealloc(s, Layout::from_size_align(10_000, 8).unwrap());
            let big = Layout::from_size_align(64, 64).unwrap();
            let b = a.alloc(big);
            assert_eq!(b as usize % 64, 0);
            a.dealloc(b, big);
        }
    }

    #[test]
    fn a_thread_keeps_freed_blocks_up_to_its_cap() {
        std::thread::spawn(|| unsafe {
            let a = ThreadCached;
            let layout = Layout::from_size_align(48, 8).unwrap();
            let many = 2 * CACHE_BYTES / 48;
            let mut blocks = Vec::with_capacity(many);
            blocks.extend((0..many).map(|_| a.alloc(layout)));
            blocks.into_iter().for_each(|b| a.dealloc(b, layout));
            let kept = CACHE.with(|c| (*c.get()).counts[3] as usize);
            assert_eq!(kept, CACHE_BYTES / 48 + 1);
            // Closed, the thread gives them back and frees later blocks at once.
            close_this_thread();
            let b = a.alloc(layout);
            a.dealloc(b, layout);
            CACHE.with(|c| assert_eq!((*c.get()).counts[3], 0));
        })
        .join()
        .unwrap();
    }
}
