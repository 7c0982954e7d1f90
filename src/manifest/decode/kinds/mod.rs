//! Per-kind decoders: voodu's field names, types, parser defaults and validation rules
//! (spec §2), one file per kind, plus the parts several kinds share: `container.rs` (the §2.0
//! container fields) with `env.rs` (`env_file`), `workload.rs` (the long-running workloads'
//! fields, `init`, `drain` and webhook targets), `probe.rs` and `checks.rs`.
//!
//! Invariant: every rule voodu checks (at parse time or only later, at reconcile) is checked
//! here, at the line that breaks it, so a commit the agent accepts does not fail on the host
//! for a reason the manifest alone shows.

mod asset;
mod checks;
mod container;
mod cronjob;
mod deployment;
mod env;
mod ingress;
mod job;
mod probe;
mod registry;
mod statefulset;
mod workload;

pub(in crate::manifest::decode) use asset::asset;
pub(in crate::manifest::decode) use container::check_build_image;
pub(in crate::manifest::decode) use cronjob::cronjob;
pub(in crate::manifest::decode) use deployment::deployment;
pub(in crate::manifest::decode) use ingress::ingress;
pub(in crate::manifest::decode) use job::job;
pub(in crate::manifest::decode) use registry::registry;
pub(in crate::manifest::decode) use statefulset::statefulset;
pub(in crate::manifest) use statefulset::statefulset_for_macro;
