//! Observers: what watches the host or the clock and requeues keys, never acting on a key's
//! containers itself (only a handler holding a key does): the probe manager (`probes`), the
//! drift watcher and resync (`drift`), the autoscaler (`autoscale`), the cron scheduler
//! (`cron`) image automation's registry scans (`image_scan`) and the backup schedules (`backups`).

pub(crate) mod autoscale;
pub(crate) mod backups;
pub(crate) mod cron;
pub(crate) mod drift;
pub mod image_scan;
pub(crate) mod probes;
