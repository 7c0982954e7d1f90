//! The single integration-test binary: one module per area.

mod support;

mod bounds_docker;
mod cli;
mod contract;
mod contract_swarm;
mod corpus;
mod corpus_swarm;
mod e2e_docker;
mod e2e_jobs;
mod fetch_errors;
mod fleet;
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
mod slow_clients;
mod statefulset;
mod swarm;
mod swarm_docker;
mod tidy;
mod triggers;
mod triggers_docker;
