//! Reconcile stage: tail the store's journal and converge each changed resource through the
//! runtime, one key at a time.
//!
//! Invariants:
//! - on boot every desired resource, every resource the store still holds state for, and
//!   every resource this agent still has containers for, is reconciled once (a synthetic
//!   PUT), then the journal is tailed from the head it had at boot (or the persisted cursor,
//!   if further); the store wakes the tail at once, nothing polls SQLite;
//! - the cursor only moves past a journal row once its key's reconcile has finished;
//! - one key is never reconciled by two workers at once (`queue`); different keys proceed in
//!   parallel, up to `ReconcileOptions::concurrency`; their container creates share one pool
//!   of slots (`ReconcileOptions::create_concurrency`), so the engine stays as busy as that
//!   while any key has a replica to create (a pass waits for a slot, never for time);
//! - every handler returns an `Action`; every error goes through one error policy
//!   (`retry::RetryPolicy::error_policy`), which maps it to an `Action` and records it on the
//!   resource's status; a panicking handler is recorded the same way and the loop goes on;
//! - every delayed pass (a retry, a rollout re-check, a back-off) and every periodic or
//!   paused task of the stage waits in one timer (`timer`), one instant per key, the one
//!   its last pass asked for; each pass re-reads desired state;
//! - only a handler holding a key creates, starts, stops or removes that key's containers:
//!   probes, drift, the autoscaler, the cron scheduler, job waiters and the router report and
//!   requeue (the router owns only the proxy container, which belongs to no key);
//! - a store error in the boot replay or the journal tail is retried on the same schedule,
//!   never fatal.

//!
//! Rooms: `context` (options, `Ctx`, shared helpers), `run` (the loop, its queue, retry
//! policy, timer and wake-ups), `handlers` (one per kind, and what they share: launching,
//! images and their pins, env, one-shot runs, `on_deploy` webhooks), `plan` (pure decisions:
//! the plan `voodu-agent plan` prints, and the rollout's health gate), `observers` (what
//! watches the host or the clock and requeues keys: probes, drift, autoscale, cron, image
//! scans), `router` (the ingress proxy and its route table).

mod context;
mod error;
mod handlers;
mod observers;
pub mod plan;
pub mod router;
mod run;

pub use context::{Deps, Engine, Handles, ImageCommitterHandle, ReconcileOptions};
pub use error::{Error, HelperError, Result};
pub use handlers::container::BuildError;
pub use handlers::requests;
pub(crate) use observers::backups::PENDING_LOOK as BACKUP_LOOK;
pub use observers::cron::{Clock, DEFAULT_CATCH_UP as DEFAULT_CRON_CATCH_UP};
pub use observers::image_scan;
pub use run::action::Action;
pub use run::retry::RetryPolicy;
pub use run::{CURSOR, run, timer, wake};
