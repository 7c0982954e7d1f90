//! The `voodu.*` labels on every managed container: voodu's identity set (spec §6.2) plus
//! `voodu.agent`, this agent's ownership marker, and `voodu.data_dir`, its data dir's.
//!
//! Invariant: the agent lists, replaces and removes only containers that carry its own
//! `voodu.agent` id; anything else on the engine is never touched.

pub const CREATED_BY: &str = "createdby";
pub const CREATED_BY_VALUE: &str = "voodu";
pub const KIND: &str = "voodu.kind";
pub const SCOPE: &str = "voodu.scope";
pub const NAME: &str = "voodu.name";
pub const REPLICA_ID: &str = "voodu.replica_id";
pub const MANIFEST_HASH: &str = "voodu.manifest_hash";
pub const CREATED_AT: &str = "voodu.created_at";
pub(crate) const RELEASE_ID: &str = "voodu.release_id";
pub const ROLE: &str = "voodu.role";
/// Statefulset pods (and their init containers): the pod's ordinal.
pub const REPLICA_ORDINAL: &str = "voodu.replica_ordinal";
/// Statefulset volumes: the claim name.
pub(crate) const CLAIM: &str = "voodu.claim";
/// What the release's images run as (`reconcile::handlers::pins::Pins::label`): a container of another
/// resolution of the same spec (a redeploy, a rollback across a moved tag) is outdated.
pub(crate) const IMAGES: &str = "voodu.images";
/// The agent's keyed digest of the container's environment: a bucket change makes it
/// outdated like a spec change does.
pub const ENV_DIGEST: &str = "voodu.env_digest";
/// A replica's probes as JSON, as its spec declared them (the agent's, not voodu's).
pub(crate) const PROBES: &str = "voodu.probes";
/// Job runs and cronjob ticks: the agent's spec hash of the job they ran (voodu puts no
/// `voodu.manifest_hash` on them).
pub const SPEC_HASH: &str = "voodu.spec_hash";
/// Init containers: which attempt of the init this container is (1 for the first).
pub const ATTEMPT: &str = "voodu.attempt";
/// Which agent (data dir) owns the container.
pub const AGENT: &str = "voodu.agent";
/// The canonical path of the data dir of the agent that created the container or volume:
/// how an agent whose state.db was lost recognises its old objects (they carry another
/// `voodu.agent` id) on an engine shared with other agents.
pub(crate) const DATA_DIR: &str = "voodu.data_dir";
