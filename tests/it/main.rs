//! The single integration-test binary: one module per area.

mod support;

mod cli;
mod contract;
mod corpus;
mod e2e_docker;
mod git;
mod http;
mod ingress;
mod reconcile;
mod tidy;
