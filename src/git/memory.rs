//! Memory the agent's large steps leave behind: a received pack, a commit's load.
//!
//! gix holds a large object's compressed bytes whole, then its inflated bytes whole to hash
//! it; mimalloc (the agent's allocator) returns freed memory to the system only a second
//! later by default, and only when a later allocation or free looks, so the first buffer
//! stayed resident under the second and both after the fetch. While a pack is received,
//! freed memory goes back at once, and what is left is collected when it is done. A commit's
//! load (`sync`) hands back what it freed the same way ([`give_memory_back`]).
//!
//! Invariant: only mimalloc's purge delay changes, only while at least one pack is being
//! received, and the value found before is restored after the last one.

use std::ffi::{c_int, c_long};
use std::sync::Mutex;

// Links mimalloc (the functions below) into every build of the library, tests included,
// whichever allocator the binary sets.
extern crate mimalloc;

unsafe extern "C" {
    fn mi_option_get(option: c_int) -> c_long;
    fn mi_option_set(option: c_int, value: c_long);
    fn mi_collect(force: bool);
}

/// `mi_option_purge_delay` in mimalloc 3's `mi_option_t` (libmimalloc-sys' default build).
const PURGE_DELAY: c_int = 15;

/// Packs being received, and the purge delay found before the first of them.
static RECEIVING: Mutex<(usize, c_long)> = Mutex::new((0, 0));

/// Purges freed memory at once for as long as it lives.
pub(super) struct PromptPurge;

impl PromptPurge {
    pub(super) fn start() -> PromptPurge {
        let mut receiving = RECEIVING
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if receiving.0 == 0 {
            // SAFETY: reading and setting a mimalloc option touch no memory of ours; 0 (purge
            // at once) is a documented value.
            receiving.1 = unsafe { mi_option_get(PURGE_DELAY) };
            unsafe { mi_option_set(PURGE_DELAY, 0) };
        }
        receiving.0 += 1;
        PromptPurge
    }
}

impl Drop for PromptPurge {
    fn drop(&mut self) {
        let mut receiving = RECEIVING
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        receiving.0 = receiving.0.saturating_sub(1);
        if receiving.0 == 0 {
            // SAFETY: as in `start`.
            unsafe { mi_option_set(PURGE_DELAY, receiving.1) };
            give_memory_back();
        }
    }
}

/// Returns the heap memory freed so far to the system now, instead of when an allocation
/// next looks (mimalloc) or never (glibc, which SQLite's C code allocates from).
pub(crate) fn give_memory_back() {
    // SAFETY: mi_collect only returns free memory to the system: it frees this thread's empty
    // pages and purges the arenas' free ones, whichever thread freed them.
    unsafe { mi_collect(true) };
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim has no preconditions; it only releases free memory.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The option index is mimalloc's purge delay: its default (1000 ms) reads back when no
    /// pack is being received, it is 0 while one is, and it is restored after.
    #[test]
    fn the_purge_delay_is_zero_while_receiving_and_restored_after() {
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
            return;
        }
        // SAFETY: reads a mimalloc option.
        let read = || unsafe { mi_option_get(PURGE_DELAY) };
        // `None` while another test of this process receives a pack.
        let when_idle = || {
            let receiving = RECEIVING
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            (receiving.0 == 0).then(read)
        };
        assert!(
            matches!(when_idle(), Some(1000) | None),
            "{:?}",
            when_idle()
        );
        {
            let _outer = PromptPurge::start();
            let _inner = PromptPurge::start();
            assert_eq!(read(), 0);
        }
        assert!(
            matches!(when_idle(), Some(1000) | None),
            "{:?}",
            when_idle()
        );
    }
}
