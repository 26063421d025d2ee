//! A hint to the CPU to start loading a cache line that will be read soon: the fast path's way to
//! overlap the memory misses of the pieces it is about to look up (see `byte_level`'s piece
//! batches). A hint never changes what the program computes, only when memory arrives.

/// Ask for the cache line holding `item` to be brought close to the core. No-op on targets
/// without a stable prefetch instruction.
#[inline(always)]
pub(crate) fn prefetch<T>(item: &T) {
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    // SAFETY: PREFETCHT0 reads nothing architecturally and never faults, whatever the address;
    // the pointer here comes from a live reference besides. SSE, which it needs, is part of every
    // x86_64 CPU (the target's baseline), so the instruction always exists.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>((item as *const T).cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = item;
}
