//! reconcile tests.
