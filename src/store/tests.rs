//! Store tests.
