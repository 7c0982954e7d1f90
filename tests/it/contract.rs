//! contract tests.
