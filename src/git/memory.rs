//! Memory a received pack leaves behind. gix holds a large object's compressed bytes whole,
//! then its inflated bytes whole to hash it; mimalloc (the agent's allocator) returns freed
//! memory to the system only a second later by default, so the first buffer stayed resident
//! under the second and both after the fetch. While a pack is received, freed memory goes
//! back at once, and what is left is collected when it is done.
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
            // SAFETY: as in `start`; mi_collect only returns free memory to the system.
            unsafe {
                mi_option_set(PURGE_DELAY, receiving.1);
                mi_collect(true);
            }
        }
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
