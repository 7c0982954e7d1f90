//! The single integration-test binary: one module per area.

mod support;

mod bounds_docker;
mod cli;
mod contract;
mod corpus;
mod dashboard;
mod dashboard_browser;
mod e2e_docker;
mod e2e_jobs;
mod fetch_errors;
mod git;
mod health;
mod health_docker;
mod hooks_docker;
mod http;
mod identity_docker;
mod ingress;
mod jobs;
mod macro_scripts;
mod plugin_blocks;
mod policy;
mod process;
mod reconcile;
mod refusal_docker;
mod registry_docker;
mod service;
mod signed;
mod slow_clients;
mod sops;
mod statefulset;
mod tidy;
mod triggers;
mod triggers_docker;
