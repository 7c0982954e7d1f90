//! e2e_docker tests.
