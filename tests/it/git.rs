//! git tests.
