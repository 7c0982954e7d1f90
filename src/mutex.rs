//! The one way the crate locks a `std::sync::Mutex`: a poisoned mutex is taken as it is.
//!
//! Invariant: only data that stays consistent when a holder panics is kept behind these
//! mutexes (every critical section is a single map, set or counter update), so a panic in
//! one task never wedges the others on a poisoned lock.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `mutex`, taking its data as it is if a holder panicked.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
