//! [`CountingAllocator`]: the system allocator, counting the allocations of the threads
//! that ask it to. Tests install it as the `#[global_allocator]` of their binary to hold
//! a per-I/O path to no allocation at all (the house rule), a proof that does not depend
//! on the machine's speed. It lives here because this crate is the one allowed unsafe
//! code, and a global allocator is an unsafe trait.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

/// The system allocator, counting allocations (and reallocations) made by a thread
/// inside [`allocations_in`]. Other threads, and the same thread outside it, are not
/// counted. Install with `#[global_allocator] static A: CountingAllocator = CountingAllocator;`.
#[derive(Debug, Clone, Copy, Default)]
pub struct CountingAllocator;

fn count() {
    // `try_with`: a thread being torn down has no locals left, and is not counting.
    let _ = COUNTING.try_with(|on| {
        if on.get() {
            let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        }
    });
}

// SAFETY: every call goes to the system allocator unchanged; counting touches only
// const-initialised thread locals without destructors, which never allocate.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded with the caller's layout, under the caller's contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded with the caller's layout, under the caller's contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: `ptr` came from this allocator, which is the system's, with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, which is the system's, with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Runs `f` and returns what it returned and how many allocations the calling thread
/// made meanwhile. Counts only where [`CountingAllocator`] is the global allocator (else
/// always 0: check with a known allocation first).
pub fn allocations_in<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let before = ALLOCATIONS.with(Cell::get);
    let outer = COUNTING.with(|on| on.replace(true));
    let out = f();
    COUNTING.with(|on| on.set(outer));
    (out, ALLOCATIONS.with(Cell::get) - before)
}
