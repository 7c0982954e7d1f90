//! voodu-agent: a GitOps agent that makes a Docker host match a git repository of voodu HCL
//! manifests.
//!
//! # Layout
//!
//! Modules in data-flow order (see ARCHITECTURE.md for the bird's-eye view):
//!
//! - [`model`]: the shared vocabulary (kinds, keys, SHAs, hashes, snapshots).
//! - [`metrics`]: counters and histograms every stage records; rendered by `http`.
//! - [`git`]: fetch with gix, resolve the branch to a commit, read manifest blobs at it.
//! - [`manifest`]: parse and validate a snapshot; every problem has `path:line:col`.
//! - [`assets`]: put asset files on the host, atomically; the `url()` fetcher and cache.
//! - [`store`]: the SQLite journal: desired state, journal rows, cursor, releases, status.
//! - [`sync`]: one commit from git through manifest into the store, in one transaction.
//! - [`reconcile`]: tail the journal, plan, and drive the runtime, one key at a time.
//! - [`runtime`]: the container verbs handlers need; Docker through bollard, or a fake.
//! - `restic`: the restic executable, run by the agent (backups of volumes and streams).
//! - [`http`]: the webhook (→ a sync request), health, status, releases and metrics.
//! - [`agent`], [`cli`]: the edge: wiring, signals, commands.
//!
//! `spec §N` in these docs cites a section of docs/voodu-format.md: voodu's format as its
//! upstream code defines it at the commit the agent follows. Where the agent deliberately does
//! otherwise is listed in docs/differences-from-voodu.md.

#![warn(unreachable_pub)]

pub(crate) mod base;
pub mod metrics;
pub mod model;
pub(crate) mod pool;

pub mod git;
pub mod manifest;
pub(crate) mod restic;
pub mod runtime;

pub mod assets;
pub mod store;

pub mod reconcile;
pub mod sync;

pub mod http;
pub mod notify;

pub mod agent;
pub mod cli;
