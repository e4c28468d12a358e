//! A global allocator that measures, per thread, the largest single allocation and the
//! peak of live bytes while a closure runs, so a target can assert that hostile input
//! cannot make the decoders allocate beyond the configured limit.
//!
//! Install it with `#[global_allocator] static A: Meter = Meter;` in the binary; without
//! that, [`measure`] reports zeros.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// What [`measure`] saw.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// The largest single allocation (or reallocation target), in bytes.
    pub largest: usize,
    /// The peak of bytes allocated and not yet freed since the closure started.
    pub peak_live: usize,
}

thread_local! {
    static ON: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

/// The measuring allocator (it delegates to the system allocator).
pub struct Meter;

fn on_alloc(size: usize) {
    // `try_with` fails only while the thread's locals are being torn down.
    let _ = ON.try_with(|on| {
        if on.get() {
            LARGEST.with(|l| l.set(l.get().max(size)));
            LIVE.with(|live| {
                let now = live.get() + size as isize;
                live.set(now);
                PEAK.with(|p| p.set(p.get().max(now)));
            });
        }
    });
}

fn on_free(size: usize) {
    let _ = ON.try_with(|on| {
        if on.get() {
            LIVE.with(|live| live.set(live.get() - size as isize));
        }
    });
}

// SAFETY: every call is forwarded unchanged to `System`; the bookkeeping touches only
// thread-local cells with constant initializers, which never allocate.
unsafe impl GlobalAlloc for Meter {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        on_alloc(layout.size());
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        on_alloc(layout.size());
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        on_free(layout.size());
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        on_free(layout.size());
        on_alloc(new_size);
        // SAFETY: forwarded with the caller's pointer, layout and size.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Runs `f` and reports the allocations it made on this thread.
pub fn measure<T>(f: impl FnOnce() -> T) -> (T, Usage) {
    LARGEST.with(|l| l.set(0));
    LIVE.with(|l| l.set(0));
    PEAK.with(|p| p.set(0));
    ON.with(|on| on.set(true));
    let out = f();
    ON.with(|on| on.set(false));
    let usage = Usage {
        largest: LARGEST.with(Cell::get),
        peak_live: PEAK.with(|p| p.get().max(0) as usize),
    };
    (out, usage)
}
