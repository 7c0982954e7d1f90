//! The single integration-test binary: one module per area.

mod support;

mod cli;
mod contract;
mod corpus;
mod e2e_docker;
mod e2e_jobs;
mod git;
mod health;
mod health_docker;
mod hooks_docker;
mod http;
mod ingress;
mod jobs;
mod process;
mod reconcile;
mod registry_docker;
mod statefulset;
mod tidy;
