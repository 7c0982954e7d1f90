//! Runtime: the container verbs the handlers need (`Containers`) — and, for Docker Swarm, the
//! service, task, node and config verbs (`Swarm`, types in `service`) — in the crate's own
//! types, so no bollard type leaks past this module; `Runtime` is both. `docker` drives a real
//! engine, `fake` keeps containers in memory for fast tests (compiled for the tests and with
//! the `fake-runtime` feature only, never into the shipped binary); the contract suite
//! (tests/it/contract.rs) runs the same checks on both. `guard` judges every request against
//! the host policy; `informer` holds the agent's own containers in memory, kept current by
//! their events, so a pass's list needs no engine walk of every container. Both wrap a
//! runtime and write only the verbs they change (`forward!` writes the rest).
//!
//! Invariant: every container created through a `Runtime` carries its labels from birth;
//! `list` filters by labels on the engine side and returns stopped containers too.

pub(crate) mod docker;
mod docker_api;
mod docker_service;
#[cfg(any(test, feature = "fake-runtime"))]
#[doc(hidden)]
pub mod fake;
mod forward;
pub(crate) mod guard;
pub mod informer;
pub mod labels;
pub(crate) mod service;

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

pub use crate::model::{DockerOptions, PortMapping, parse_ports};
pub use docker::DockerRuntime;
#[cfg(any(test, feature = "fake-runtime"))]
pub use fake::FakeRuntime;
pub use guard::{Guarded, Rules};
pub use informer::Informer;
pub use service::{
    ConfigMount, HealthCheck, HostPort, Node, NodeState, Service, ServiceMode, ServiceSpec,
    SwarmConfig, SwarmNode, Task, TaskState, UpdateOrder, UpdatePolicy, UpdateState, UpdateStatus,
};

/// What a container is doing, reduced to what reconcile decisions need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerState {
    Created,
    Running,
    Restarting,
    Exited,
    Other,
}

/// A container as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container {
    pub id: String,
    pub name: String,
    pub image: String,
    pub labels: BTreeMap<String, String>,
    pub state: ContainerState,
}

impl Container {
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }
}

/// Everything needed to create one container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerSpec {
    pub name: String,
    pub image: String,
    /// Replaces the image's CMD; the ENTRYPOINT is kept (as `docker run IMAGE cmd…`).
    pub command: Option<Vec<String>>,
    /// `KEY=VALUE` entries.
    pub env: Vec<String>,
    pub labels: BTreeMap<String, String>,
    pub ports: Vec<PortMapping>,
    /// Bind and named-volume mounts in `docker -v` syntax (`src:dst[:opts]`).
    pub binds: Vec<String>,
    /// Docker restart policy; empty means none (one-shot containers).
    pub restart: String,
    /// Networks to join, the first as primary, each with these DNS aliases. Empty with a
    /// `network_mode`.
    pub networks: Vec<String>,
    pub aliases: Vec<String>,
    /// `host` or `none`; empty for bridge networking on `networks`.
    pub network_mode: String,
    pub extra_hosts: Vec<String>,
    pub cap_add: Vec<String>,
    /// `(name, soft, hard)`.
    pub ulimits: Vec<(String, i64, i64)>,
    /// CPU limit in nano-CPUs.
    pub nano_cpus: Option<i64>,
    /// Memory limit in bytes.
    pub memory: Option<i64>,
    /// json-file log rotation: `max-size` and `max-file`.
    pub log_max_size: Option<String>,
    pub log_max_files: Option<i64>,
    /// Allocate a TTY (voodu does for init and release containers).
    pub tty: bool,
    /// The `docker_options` flags, parsed.
    pub options: DockerOptions,
}

/// A container's detailed state, as `docker inspect` shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inspection {
    pub(crate) id: String,
    pub name: String,
    pub running: bool,
    pub exit_code: Option<i64>,
    pub(crate) oom_killed: bool,
    pub(crate) restart_count: i64,
    /// RFC 3339, as the engine reports them.
    pub(crate) started_at: String,
    pub(crate) finished_at: String,
    /// Address on each network the container joined.
    pub ip_addresses: BTreeMap<String, String>,
    pub(crate) labels: BTreeMap<String, String>,
    /// Ports published on the host while the container runs (a port asked for as `0` or
    /// left empty shows the one the engine picked), sorted; empty when it is not running.
    pub published_ports: Vec<PublishedPort>,
}

/// One published port of a running container: `host_ip:host_port` → `container_port/protocol`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PublishedPort {
    pub container_port: u16,
    pub protocol: String,
    pub host_ip: String,
    pub host_port: u16,
}

impl Inspection {
    /// The first host binding of `container_port`/tcp (an engine publishing on every
    /// interface lists IPv4 before IPv6), if the container runs.
    pub fn published_tcp_port(&self, container_port: u16) -> Option<&PublishedPort> {
        self.published_ports
            .iter()
            .find(|port| port.container_port == container_port && port.protocol == "tcp")
    }
}

/// What a command run in a container (`exec`) did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutcome {
    pub exit_code: i64,
    /// stdout and stderr, interleaved as received.
    pub output: String,
}

/// Where a piped `exec` reads its stdin from.
pub type ExecInput = Box<dyn tokio::io::AsyncRead + Send + Unpin>;
/// Where a piped `exec` writes its stdout.
pub type ExecOutput = Box<dyn tokio::io::AsyncWrite + Send + Unpin>;

/// A named volume as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    pub name: String,
    pub labels: BTreeMap<String, String>,
}

/// A container event the agent reacts to (`docker events`): `start`, `die`, `stop`,
/// `destroy`, `oom`, `health_status: …`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub id: String,
    /// The container's name (no leading `/`); empty when the engine did not say.
    pub(crate) name: String,
    pub action: String,
    /// The container's labels, as the event carries them.
    pub labels: BTreeMap<String, String>,
}

/// What `log_stream` asks for (`docker logs --since --tail -f`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogOptions {
    /// Only output written at or after this Unix time (seconds); `None`: from the start.
    pub since: Option<i64>,
    /// Only the last `tail` lines written before the call; `None`: all of them.
    pub tail: Option<usize>,
    /// Keep the stream open and send output as it is written, until the container stops.
    pub follow: bool,
}

/// A container's output (stdout and stderr interleaved as the engine keeps them), in chunks
/// that need not end at a line's end; the stream ends when the output does (at once without
/// `follow`, when the container stops with it).
pub type LogChunks = std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<Vec<u8>>> + Send>>;

/// A stream of events, for as long as the engine keeps it open.
pub(crate) type Events = std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<Event>> + Send>>;

/// An image on the host (`docker image inspect`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageInfo {
    /// `sha256:…`, the image's config digest: what a local-only image (imported, built) is
    /// known by.
    pub id: String,
    /// `repository@sha256:…` for each registry manifest it was pulled by (empty for a
    /// local-only image).
    pub repo_digests: Vec<String>,
}

/// Credentials for pulling from a private registry.
#[derive(Clone, PartialEq, Eq)]
pub struct RegistryAuth {
    pub(crate) server: String,
    pub(crate) username: String,
    pub(crate) password: String,
}

impl std::fmt::Debug for RegistryAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryAuth")
            .field("server", &self.server)
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Runtime failures, classified for the retry policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("image {image} is not present on this host and cannot be pulled: {message}")]
    ImageMissing { image: String, message: String },
    #[error("container {name}: {message}")]
    Conflict { name: String, message: String },
    #[error("{what} not found")]
    NotFound { what: String },
    /// The engine answered that it will not do this (a 4xx, or a 500 that reports a bad
    /// spec: a device it cannot add, a user the image lacks…): permanent, with its message.
    #[error("the engine refused the request: {message}")]
    Invalid { message: String },
    /// The host policy refuses the request (`guard`): it was never sent. Permanent.
    #[error("{message}")]
    Refused { message: String },
    /// The engine could not be reached, or answered that it cannot serve right now.
    #[error("container engine unavailable: {message}")]
    Unavailable { message: String },
    /// A piped exec's input or output failed on the agent's side (`exec_piped`).
    #[error("{what}: {message}")]
    Pipe { what: String, message: String },
}

impl Error {
    /// True when trying again later can help (engine down, a name still being released).
    /// `docker::classify` decides which engine answers are which.
    pub(crate) fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::Unavailable { .. } | Error::Conflict { .. } | Error::NotFound { .. }
        )
    }
}

/// The runtime's result type.
pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

/// The verbs handlers use: the engine's containers, volumes and images (`Containers`) and,
/// for `--runtime swarm`, its services (`Swarm`). Code that drives an engine takes
/// `R: Runtime`; an implementation implements both halves and gets `Runtime` from the
/// blanket impl below.
///
/// The verbs return `impl Future<Output = …> + Send` (written as `async fn` in the
/// implementations), so handlers can run on any worker. That makes the traits not
/// dyn-compatible: nothing holds a `dyn Runtime`, every user is generic over `R: Runtime`
/// (one runtime per agent, chosen at start), and no verb pays for a boxed future. A
/// `dyn` runtime would need the verbs rewritten to return `BoxFuture`s.
pub trait Runtime: Containers + Swarm {}

impl<T: Containers + Swarm + ?Sized> Runtime for T {}

/// The container verbs: containers, networks, volumes, images and container events. A verb
/// added here (or to `Swarm`) needs its arm in `forward!` (`forward.rs`) for the wrappers.
pub trait Containers: Send + Sync + 'static {
    /// Containers (running or not) whose labels include every `(key, value)` in `filter`.
    fn list(&self, filter: &[(&str, &str)]) -> impl Future<Output = Result<Vec<Container>>> + Send;
    /// The containers (running or not) with these full ids, as `list` shows them; an id
    /// that names no container is left out. The engine finds each id in its index; a label
    /// filter makes it copy and test every container it has.
    fn list_by_id(&self, ids: &[String]) -> impl Future<Output = Result<Vec<Container>>> + Send;
    /// Creates (does not start) a container; returns its id.
    fn create(&self, spec: &ContainerSpec) -> impl Future<Output = Result<String>> + Send;
    fn start(&self, id: &str) -> impl Future<Output = Result<()>> + Send;
    /// Stops (SIGTERM, then SIGKILL after the grace period) and removes. Removing a container
    /// that is already gone succeeds.
    fn remove(&self, id: &str) -> impl Future<Output = Result<()>> + Send;
    /// Stops a running container as `docker stop -t` does: SIGTERM, then SIGKILL once `grace`
    /// has passed without it exiting. A container that is not running, or gone, is stopped.
    fn stop(&self, id: &str, grace: Duration) -> impl Future<Output = Result<()>> + Send;
    /// Creates a bridge network when none by that name exists.
    fn ensure_network(&self, name: &str) -> impl Future<Output = Result<()>> + Send;
    /// Joins the container `id` to the network `name` (which exists); joined already is
    /// joined.
    fn connect_network(&self, id: &str, name: &str) -> impl Future<Output = Result<()>> + Send;
    /// Removes the network `name`, first disconnecting any container still on it (the
    /// ingress proxy); a network that is gone is removed.
    fn remove_network(&self, name: &str) -> impl Future<Output = Result<()>> + Send;
    /// A container's detailed state.
    fn inspect(&self, id: &str) -> impl Future<Output = Result<Inspection>> + Send;
    /// Waits until the container stops; its exit code.
    fn wait(&self, id: &str) -> impl Future<Output = Result<i64>> + Send;
    /// The last `tail` lines of the container's stdout and stderr.
    fn logs(&self, id: &str, tail: usize) -> impl Future<Output = Result<String>> + Send;
    /// The container's output as `docker logs` reads it (`--since`, `--tail`, `-f`). An
    /// unknown container is a `NotFound` item, then the end.
    fn log_stream(&self, id: &str, options: LogOptions) -> LogChunks;
    /// Runs `command` in a running container and waits for it.
    fn exec(
        &self,
        id: &str,
        command: &[String],
    ) -> impl Future<Output = Result<ExecOutcome>> + Send;
    /// Runs `command` in a running container with its stdin fed from `stdin` (closed at the
    /// reader's end) and its stdout written to `stdout` (discarded when `None`); waits for it.
    /// The outcome's `output` is the last 8 KiB of its stderr.
    fn exec_piped(
        &self,
        id: &str,
        command: &[String],
        stdin: Option<ExecInput>,
        stdout: Option<ExecOutput>,
    ) -> impl Future<Output = Result<ExecOutcome>> + Send;
    /// The host directory holding named volume `name`'s files (the local driver's
    /// `Mountpoint`); `None` when no such volume exists.
    fn volume_path(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<std::path::PathBuf>>> + Send;
    /// Creates a named volume when none by that name exists; the volume as the engine has it
    /// then (an existing one keeps its own labels).
    fn ensure_volume(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
    ) -> impl Future<Output = Result<Volume>> + Send;
    /// Volumes whose labels include every `(key, value)` in `filter`.
    fn list_volumes(
        &self,
        filter: &[(&str, &str)],
    ) -> impl Future<Output = Result<Vec<Volume>>> + Send;
    fn remove_volume(&self, name: &str) -> impl Future<Output = Result<()>> + Send;
    /// Whether `image` is present on the host.
    fn image_present(&self, image: &str) -> impl Future<Output = Result<bool>> + Send;
    /// What the host holds as `image` (a tag, `repo@sha256:…` or an image id): its id and the
    /// registry digests it was pulled by; `None` when it is not there.
    fn image_info(&self, image: &str) -> impl Future<Output = Result<Option<ImageInfo>>> + Send;
    /// Pulls `image`, with credentials for a private registry; the manifest digest the
    /// registry answered for it, when the engine says (`Digest: sha256:…`).
    fn pull(
        &self,
        image: &str,
        auth: Option<&RegistryAuth>,
    ) -> impl Future<Output = Result<Option<String>>> + Send;
    /// Container events from now on, of containers whose labels include every `(key,
    /// value)` in `filter`.
    fn events(&self, filter: &[(&str, &str)]) -> Events;
    /// The container's CPU use over a short sample, as `docker stats` shows it (100 = one
    /// core).
    fn cpu_percent(&self, id: &str) -> impl Future<Output = Result<f64>> + Send;
}

/// The Docker Swarm verbs (`service`): the units of `--runtime swarm`.
pub trait Swarm: Send + Sync + 'static {
    /// This engine's place in a swarm; `None` when it is in none.
    fn swarm_node(&self) -> impl Future<Output = Result<Option<SwarmNode>>> + Send;
    /// The swarm's nodes (a manager only).
    fn list_nodes(&self) -> impl Future<Output = Result<Vec<Node>>> + Send;
    /// Creates an attachable overlay network when none by that name exists.
    fn ensure_overlay(&self, name: &str) -> impl Future<Output = Result<()>> + Send;
    /// Services whose labels include every `(key, value)` in `filter`.
    fn list_services(
        &self,
        filter: &[(&str, &str)],
    ) -> impl Future<Output = Result<Vec<Service>>> + Send;
    /// Creates a service (with registry credentials for its image); returns its id. A name
    /// taken is `Conflict`.
    fn create_service(
        &self,
        spec: &ServiceSpec,
        auth: Option<&RegistryAuth>,
    ) -> impl Future<Output = Result<String>> + Send;
    /// Updates service `id`, last read at `version`, to `spec`: a changed task template is a
    /// rolling update by `spec.update`; a changed replica count alone only adds or removes
    /// tasks. A version that is not the service's current one is `Conflict`.
    fn update_service(
        &self,
        id: &str,
        version: u64,
        spec: &ServiceSpec,
        auth: Option<&RegistryAuth>,
    ) -> impl Future<Output = Result<()>> + Send;
    /// Removes a service (its tasks stop with its grace period); a missing one is removed.
    fn remove_service(&self, id: &str) -> impl Future<Output = Result<()>> + Send;
    /// The tasks of service `id`, every state (Swarm keeps a few ended ones per slot).
    fn list_tasks(&self, service_id: &str) -> impl Future<Output = Result<Vec<Task>>> + Send;
    /// The last `tail` lines of a task's output.
    fn task_logs(&self, task_id: &str, tail: usize) -> impl Future<Output = Result<String>> + Send;
    /// Creates a config (at most `service::MAX_CONFIG_BYTES`); a name taken is `Conflict`.
    fn create_config(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
        data: &[u8],
    ) -> impl Future<Output = Result<String>> + Send;
    /// Configs whose labels include every `(key, value)` in `filter`.
    fn list_configs(
        &self,
        filter: &[(&str, &str)],
    ) -> impl Future<Output = Result<Vec<SwarmConfig>>> + Send;
    /// Removes a config; a missing one is removed, one a service uses is `Invalid`.
    fn remove_config(&self, id: &str) -> impl Future<Output = Result<()>> + Send;
}
