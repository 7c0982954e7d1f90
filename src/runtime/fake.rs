//! `FakeRuntime`: containers in memory, with a call log and fault injection, for fast
//! reconcile tests under paused time.
//!
//! A started container "runs" its command through a tiny interpreter: `echo …` writes output,
//! `exit N` ends it with N, `true`/`false` set the status, and anything else (`sleep`,
//! `httpd`, an unknown program) keeps it running until it is removed or a test calls `exit`.
//! No command means the test image's default (`sh` without input): it exits 0 at once.
//! The Swarm verbs and their state are the child module `swarm`.
//!
//! Invariant: it behaves as the Docker engine does for every verb the contract suite checks
//! (duplicate names conflict, unknown images and networks fail, removing a missing container
//! succeeds, `list` returns stopped containers, exit codes and output of the interpreted
//! commands); anything a test assumes beyond that must be added to the contract suite first.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use futures_util::StreamExt as _;
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, broadcast};

use super::{
    Container, ContainerSpec, ContainerState, Containers, Error, ExecOutcome, ImageInfo,
    Inspection, PublishedPort, RegistryAuth, Result, Volume,
};

mod swarm;

/// An in-memory engine.
pub struct FakeRuntime {
    state: Arc<Mutex<FakeState>>,
    /// Wakes `wait` calls (and followed logs) whenever a container changes state.
    changed: Arc<Notify>,
    /// What `events` subscribers receive; `None` breaks every open stream (`interrupt_events`).
    events: broadcast::Sender<Option<super::Event>>,
    /// Services, tasks, configs and nodes (`swarm`).
    swarm: Mutex<swarm::FakeSwarm>,
}

impl Default for FakeRuntime {
    fn default() -> FakeRuntime {
        FakeRuntime {
            swarm: Mutex::default(),
            state: Arc::default(),
            changed: Arc::new(Notify::new()),
            events: broadcast::channel(1024).0,
        }
    }
}

impl FakeState {
    /// Whether the host has `image`: by a name it was given or pulled by, or by its id (a
    /// local-only image is pinned by its id).
    fn present(&self, image: &str) -> bool {
        let Some(images) = &self.images else {
            return true;
        };
        images.contains(image)
            || self.pulled.contains_key(image)
            || (image.starts_with("sha256:")
                && (images
                    .iter()
                    .any(|name| FakeRuntime::image_id(name) == image)
                    || self.pulled.values().any(|info| info.id == image)))
    }
}

#[derive(Default)]
struct FakeState {
    containers: BTreeMap<String, FakeContainer>,
    next_id: u64,
    /// The host port the next unspecified published port gets (the engine's ephemeral range).
    next_host_port: u16,
    networks: BTreeSet<String>,
    volumes: BTreeMap<String, BTreeMap<String, String>>,
    /// Where volumes keep their files (`set_volume_root`); none: volumes have no directory.
    volume_root: Option<std::path::PathBuf>,
    /// `None`: every image exists.
    images: Option<BTreeSet<String>>,
    /// Images a `pull` can fetch, with the username it requires (empty: public).
    registry: BTreeMap<String, String>,
    /// The registry's tags and what they name now (`repo:tag` → `sha256:…`;
    /// `set_tag_digest`), and every digest any tag ever named (pullable by digest).
    tag_digests: BTreeMap<String, String>,
    known_digests: BTreeSet<String>,
    /// What a pull by a registry's name left on the host: reference → image.
    pulled: BTreeMap<String, ImageInfo>,
    calls: Vec<String>,
    /// When each of `calls` was made, in the same order.
    call_instants: Vec<std::time::Instant>,
    /// The name of every container ever created, by id (removed ones too).
    names: BTreeMap<String, String>,
    faults: VecDeque<(String, Fault)>,
    /// How long each `create` takes (`set_create_latency`); none by default.
    create_latency: Option<std::time::Duration>,
    /// How long each `list_by_id` takes (`set_read_latency`); none by default.
    read_latency: Option<std::time::Duration>,
    /// Creates in flight now, and the most there ever were at once.
    creating: usize,
    creating_peak: usize,
}

struct FakeContainer {
    listed: Container,
    spec: ContainerSpec,
    exit_code: Option<i64>,
    output: String,
    restart_count: i64,
    ip_addresses: BTreeMap<String, String>,
    cpu_percent: f64,
    /// Set while running, as the engine shows them.
    published_ports: Vec<PublishedPort>,
}

/// What an injected fault does when its verb is called.
#[derive(Debug, Clone)]
pub enum Fault {
    Fail(Error),
    Panic(String),
}

/// What the interpreter made of a command.
enum Run {
    /// Ended with this status and output.
    Exited(i64, String),
    /// Still running, with the output written so far.
    Running(String),
}

/// Runs `script` (`sh -c` text, or a plain command line) as far as the fake can.
fn interpret(command: Option<&[String]>) -> Run {
    let Some(command) = command.filter(|command| !command.is_empty()) else {
        return Run::Exited(0, String::new());
    };
    let script = match command {
        [shell, flag, script, ..] if (shell == "sh" || shell == "/bin/sh") && flag == "-c" => {
            script.clone()
        }
        _ => command.join(" "),
    };
    let mut output = String::new();
    let mut status = 0;
    for statement in script.split(['\n', ';']).flat_map(|part| part.split("&&")) {
        let words: Vec<&str> = statement.split_whitespace().collect();
        match words.as_slice() {
            [] => {}
            ["echo", rest @ ..] => {
                output.push_str(&rest.join(" ").replace(['"', '\''], ""));
                output.push('\n');
                status = 0;
            }
            ["exit"] => return Run::Exited(status, output),
            ["exit", code] => return Run::Exited(code.parse().unwrap_or(2), output),
            ["true"] => status = 0,
            ["false"] => status = 1,
            _ => return Run::Running(output),
        }
    }
    Run::Exited(status, output)
}

impl FakeRuntime {
    pub fn new() -> FakeRuntime {
        FakeRuntime::default()
    }

    /// A fake that knows only these images: creating from any other fails as on an engine
    /// without a registry.
    pub fn with_images(images: &[&str]) -> FakeRuntime {
        let fake = FakeRuntime::default();
        fake.lock().images = Some(images.iter().map(|image| (*image).to_owned()).collect());
        fake
    }

    /// Volumes keep their files in `<root>/<name>` from now on (`volume_path`), as the
    /// local driver keeps them under `/var/lib/docker/volumes`.
    pub fn set_volume_root(&self, root: &std::path::Path) {
        self.lock().volume_root = Some(root.to_owned());
    }

    /// Makes `image` pullable; `username` empty for a public image, else the registry
    /// username a pull must present.
    pub fn publish(&self, image: &str, username: &str) {
        let mut state = self.lock();
        state.registry.insert(image.to_owned(), username.to_owned());
        // A registry names every tag's manifest by a digest.
        if !image.contains('@') && !state.tag_digests.contains_key(image) {
            let digest = FakeRuntime::image_id(&format!("{image} manifest"));
            state.tag_digests.insert(image.to_owned(), digest.clone());
            state.known_digests.insert(digest);
        }
    }

    /// Makes the registry's `image` (`repo:tag`, pullable) name the manifest `digest` from now
    /// on (a push, or a tag moved), as a registry would; what the host pulled stays.
    pub fn set_tag_digest(&self, image: &str, digest: &str) {
        let mut state = self.lock();
        state.registry.entry(image.to_owned()).or_default();
        state
            .tag_digests
            .insert(image.to_owned(), digest.to_owned());
        state.known_digests.insert(digest.to_owned());
    }

    /// Every later `create` takes `latency` before it acts (an engine whose creates are
    /// slow, so that they overlap), counted in `peak_creates`.
    pub fn set_create_latency(&self, latency: std::time::Duration) {
        self.lock().create_latency = Some(latency);
    }

    /// Every later `list_by_id` takes `latency` before it answers (an engine that reads
    /// slowly, so that reads overlap).
    pub fn set_read_latency(&self, latency: std::time::Duration) {
        self.lock().read_latency = Some(latency);
    }

    /// The most `create` calls that were ever in flight at once (with a create latency set).
    pub fn peak_creates(&self) -> usize {
        self.lock().creating_peak
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Every verb called so far, as `verb name-or-id`.
    pub fn calls(&self) -> Vec<String> {
        self.lock().calls.clone()
    }

    /// When each of `calls()` was made, in the same order (a bench times a call from what
    /// caused it).
    pub fn call_instants(&self) -> Vec<std::time::Instant> {
        self.lock().call_instants.clone()
    }

    /// `calls()` with container ids shown as the names they were created with, so a test can
    /// read the order of `start` and `remove` calls by name.
    pub fn calls_by_name(&self) -> Vec<String> {
        let state = self.lock();
        state
            .calls
            .iter()
            .map(|call| {
                // `verb id [rest]` (a stop also says its grace) → `verb name [rest]`.
                call.split_once(' ')
                    .and_then(|(verb, subject)| {
                        let (id, rest) = subject.split_once(' ').unwrap_or((subject, ""));
                        let name = state.names.get(id)?;
                        Some(format!(
                            "{verb} {name}{}{rest}",
                            if rest.is_empty() { "" } else { " " }
                        ))
                    })
                    .unwrap_or_else(|| call.clone())
            })
            .collect()
    }

    /// The next call of `verb` (`create`, `start`, `remove`, `list`, …) fails or panics
    /// instead of acting. Faults queue up in order.
    pub fn inject(&self, verb: &str, fault: Fault) {
        self.lock().faults.push_back((verb.to_owned(), fault));
    }

    /// Simulates a running container writing `text` to its output (followed logs see it).
    pub fn write_output(&self, id: &str, text: &str) {
        if let Some(container) = self.lock().containers.get_mut(id) {
            container.output.push_str(text);
        }
        self.changed.notify_waiters();
    }

    /// Simulates a container exiting on its own (or `docker stop` by hand): code 137.
    pub fn exit(&self, id: &str) {
        self.exit_with(id, 137);
    }

    /// Simulates a container exiting on its own with `code`.
    pub fn exit_with(&self, id: &str, code: i64) {
        if let Some(container) = self.lock().containers.get_mut(id) {
            container.listed.state = ContainerState::Exited;
            container.exit_code = Some(code);
            container.published_ports.clear();
        }
        self.changed.notify_waiters();
        self.emit(id, "die");
    }

    /// The spec a container was created from.
    pub fn spec_of(&self, id: &str) -> Option<ContainerSpec> {
        self.lock()
            .containers
            .get(id)
            .map(|container| container.spec.clone())
    }

    /// Names of every volume.
    pub fn volume_names(&self) -> Vec<String> {
        self.lock().volumes.keys().cloned().collect()
    }

    /// Removes `image` from the host (`docker rmi`, a prune, a rebuilt host), with every
    /// other name of the same pulled image; a fake made without `with_images` starts tracking
    /// images from here.
    pub fn remove_image(&self, image: &str) {
        let mut state = self.lock();
        // Every name of the repository's pulled images goes (its tag and its digests).
        let repository = name_of(image).to_owned();
        let names: Vec<String> = state
            .pulled
            .keys()
            .filter(|name| name_of(name) == repository)
            .cloned()
            .collect();
        for name in names {
            state.pulled.remove(&name);
            if let Some(images) = &mut state.images {
                images.remove(&name);
            }
        }
        let images = state.images.get_or_insert_with(BTreeSet::new);
        images.remove(image);
    }

    /// What a container of `image` pinned by its release runs as here: the digest a pull
    /// of its tag recorded, else (a local-only image) its image id.
    pub fn pinned(&self, image: &str) -> String {
        match self.lock().pulled.get(image) {
            Some(info) => info
                .repo_digests
                .first()
                .cloned()
                .unwrap_or_else(|| info.id.clone()),
            None => FakeRuntime::image_id(image),
        }
    }

    /// The fake's image id for what `reference` names.
    fn image_id(reference: &str) -> String {
        use sha2::Digest as _;
        let digest = sha2::Sha256::digest(reference.as_bytes());
        format!("sha256:{}", hex_of(&digest))
    }

    /// Whether `image` exists (every image does unless the fake was made `with_images`).
    fn knows_image(&self, image: &str) -> bool {
        self.lock().present(image)
    }

    fn enter(&self, verb: &str, subject: &str) -> Result<()> {
        let fault = {
            let mut state = self.lock();
            state.calls.push(format!("{verb} {subject}"));
            state.call_instants.push(std::time::Instant::now());
            let position = state.faults.iter().position(|(faulty, _)| faulty == verb);
            position
                .and_then(|index| state.faults.remove(index))
                .map(|(_, fault)| fault)
        };
        match fault {
            None => Ok(()),
            Some(Fault::Fail(error)) => Err(error),
            Some(Fault::Panic(message)) => panic!("{message}"),
        }
    }

    /// Sends `action` about container `id` to `events` subscribers.
    fn emit(&self, id: &str, action: &str) {
        let (name, labels) = self
            .lock()
            .containers
            .get(id)
            .map(|container| {
                (
                    container.listed.name.clone(),
                    container.listed.labels.clone(),
                )
            })
            .unwrap_or_default();
        self.emit_with(id, &name, action, labels);
    }

    fn emit_with(&self, id: &str, name: &str, action: &str, labels: BTreeMap<String, String>) {
        // No subscriber is fine: nobody is listening.
        let _ = self.events.send(Some(super::Event {
            id: id.to_owned(),
            name: name.to_owned(),
            action: action.to_owned(),
            labels,
        }));
    }

    /// Breaks every open event stream, as an engine restart or a dropped connection does:
    /// each yields an error and ends.
    pub fn interrupt_events(&self) {
        let _ = self.events.send(None);
    }

    /// Sets the CPU use `cpu_percent` reports for a container.
    pub fn set_cpu_percent(&self, id: &str, percent: f64) {
        if let Some(container) = self.lock().containers.get_mut(id) {
            container.cpu_percent = percent;
        }
    }

    /// Resolves at the next change of a container's state (start, stop, exit, removal); it
    /// counts from this call, not from the first poll, so tests take it before they look.
    pub fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.changed.notified()
    }

    fn not_found(id: &str) -> Error {
        Error::NotFound {
            what: format!("container {id}"),
        }
    }
}

impl Containers for FakeRuntime {
    async fn list(&self, filter: &[(&str, &str)]) -> Result<Vec<Container>> {
        // The filter in the call log (`list voodu.scope=s,voodu.name=n`), so a count of calls
        // can tell which resource a list was for.
        let subject = filter
            .iter()
            .map(|(key, value)| format!("{key}={value}"))
            .collect::<Vec<_>>()
            .join(",");
        self.enter("list", &subject)?;
        Ok(self
            .lock()
            .containers
            .values()
            .filter(|container| {
                filter
                    .iter()
                    .all(|(key, value)| container.listed.label(key) == Some(value))
            })
            .map(|container| container.listed.clone())
            .collect())
    }

    async fn list_by_id(&self, ids: &[String]) -> Result<Vec<Container>> {
        self.enter("list_by_id", &ids.join(","))?;
        let latency = self.lock().read_latency;
        if let Some(latency) = latency {
            tokio::time::sleep(latency).await;
        }
        let state = self.lock();
        Ok(ids
            .iter()
            .filter_map(|id| state.containers.get(id))
            .map(|container| container.listed.clone())
            .collect())
    }

    async fn create(&self, spec: &ContainerSpec) -> Result<String> {
        self.enter("create", &spec.name)?;
        let latency = self.lock().create_latency;
        if let Some(latency) = latency {
            /// Counts one create in flight until dropped (a cancelled create too).
            struct InFlight<'f>(&'f FakeRuntime);
            impl Drop for InFlight<'_> {
                fn drop(&mut self) {
                    self.0.lock().creating -= 1;
                }
            }
            let in_flight = {
                let mut state = self.lock();
                state.creating += 1;
                state.creating_peak = state.creating_peak.max(state.creating);
                InFlight(self)
            };
            tokio::time::sleep(latency).await;
            drop(in_flight);
        }
        let mut state = self.lock();
        if !state.present(&spec.image) {
            return Err(Error::ImageMissing {
                image: spec.image.clone(),
                message: format!("No such image: {}", spec.image),
            });
        }
        if let Some(missing) = spec
            .networks
            .iter()
            .find(|network| !state.networks.contains(*network))
        {
            return Err(Error::NotFound {
                what: format!("network {missing}"),
            });
        }
        if state
            .containers
            .values()
            .any(|container| container.listed.name == spec.name)
        {
            return Err(Error::Conflict {
                name: spec.name.clone(),
                message: format!("the container name \"/{}\" is already in use", spec.name),
            });
        }
        state.next_id += 1;
        let n = state.next_id;
        let id = format!("fake{n:060}");
        state.names.insert(id.clone(), spec.name.clone());
        let mut labels = spec.options.labels.clone();
        labels.extend(spec.labels.clone());
        let ip_addresses = spec
            .networks
            .iter()
            .enumerate()
            .map(|(index, network)| {
                (
                    network.clone(),
                    format!("10.{}.{}.{}", 88 + index, n / 250, 2 + n % 250),
                )
            })
            .collect();
        state.containers.insert(
            id.clone(),
            FakeContainer {
                listed: Container {
                    id: id.clone(),
                    name: spec.name.clone(),
                    image: spec.image.clone(),
                    labels,
                    state: ContainerState::Created,
                },
                spec: spec.clone(),
                exit_code: None,
                output: String::new(),
                restart_count: 0,
                ip_addresses,
                cpu_percent: 0.0,
                published_ports: Vec::new(),
            },
        );
        drop(state);
        self.emit(&id, "create");
        Ok(id)
    }

    async fn start(&self, id: &str) -> Result<()> {
        self.enter("start", id)?;
        {
            let mut guard = self.lock();
            let state = &mut *guard;
            let container = state
                .containers
                .get_mut(id)
                .ok_or_else(|| Self::not_found(id))?;
            match interpret(container.spec.command.as_deref()) {
                Run::Exited(code, output) => {
                    container.listed.state = ContainerState::Exited;
                    container.exit_code = Some(code);
                    container.output.push_str(&output);
                    container.published_ports.clear();
                }
                Run::Running(output) => {
                    container.listed.state = ContainerState::Running;
                    container.exit_code = None;
                    container.output.push_str(&output);
                    // As the engine: an unspecified host port gets one from the ephemeral
                    // range, anew at each start.
                    let mut ports = Vec::with_capacity(container.spec.ports.len());
                    for mapping in &container.spec.ports {
                        let host_port = match mapping.host_port.filter(|port| *port != 0) {
                            Some(port) => port,
                            None => {
                                if state.next_host_port < 32_768 {
                                    state.next_host_port = 32_768;
                                }
                                let port = state.next_host_port;
                                state.next_host_port = state.next_host_port.wrapping_add(1);
                                port
                            }
                        };
                        ports.push(PublishedPort {
                            container_port: mapping.container_port,
                            protocol: mapping.protocol.clone(),
                            host_ip: if mapping.host_ip.is_empty() {
                                "0.0.0.0".to_owned()
                            } else {
                                mapping.host_ip.clone()
                            },
                            host_port,
                        });
                    }
                    ports.sort();
                    container.published_ports = ports;
                }
            }
        }
        self.changed.notify_waiters();
        self.emit(id, "start");
        let exited = self
            .lock()
            .containers
            .get(id)
            .is_some_and(|container| container.listed.state == ContainerState::Exited);
        if exited {
            self.emit(id, "die");
        }
        Ok(())
    }

    async fn remove(&self, id: &str) -> Result<()> {
        self.enter("remove", id)?;
        let removed = self.lock().containers.remove(id);
        self.changed.notify_waiters();
        if let Some(container) = removed {
            self.emit_with(
                id,
                &container.listed.name,
                "destroy",
                container.listed.labels,
            );
        }
        Ok(())
    }

    /// Records `stop <id> <grace>` (a test reads the grace a handler used) and stops a
    /// running container at once, as one that exits on SIGTERM would.
    async fn stop(&self, id: &str, grace: std::time::Duration) -> Result<()> {
        self.enter("stop", &format!("{id} {}s", grace.as_secs_f64()))?;
        let running = self
            .lock()
            .containers
            .get(id)
            .is_some_and(|container| container.listed.state == ContainerState::Running);
        if running {
            self.exit_with(id, 0);
        }
        Ok(())
    }

    async fn ensure_network(&self, name: &str) -> Result<()> {
        self.enter("ensure_network", name)?;
        self.lock().networks.insert(name.to_owned());
        Ok(())
    }

    async fn connect_network(&self, id: &str, name: &str) -> Result<()> {
        self.enter("connect_network", &format!("{id} {name}"))?;
        let mut state = self.lock();
        if !state.networks.contains(name) {
            return Err(Error::NotFound {
                what: format!("network {name}"),
            });
        }
        let container = state
            .containers
            .get_mut(id)
            .ok_or_else(|| Self::not_found(id))?;
        let index = container.ip_addresses.len();
        container
            .ip_addresses
            .entry(name.to_owned())
            .or_insert_with(|| format!("10.{}.0.{}", 88 + index, 2 + index));
        Ok(())
    }

    async fn remove_network(&self, name: &str) -> Result<()> {
        self.enter("remove_network", name)?;
        let mut state = self.lock();
        state.networks.remove(name);
        for container in state.containers.values_mut() {
            container.ip_addresses.remove(name);
        }
        Ok(())
    }

    async fn inspect(&self, id: &str) -> Result<Inspection> {
        self.enter("inspect", id)?;
        let state = self.lock();
        let container = state
            .containers
            .get(id)
            .ok_or_else(|| Self::not_found(id))?;
        Ok(Inspection {
            id: id.to_owned(),
            name: container.listed.name.clone(),
            running: container.listed.state == ContainerState::Running,
            exit_code: container.exit_code,
            oom_killed: false,
            restart_count: container.restart_count,
            started_at: String::new(),
            finished_at: String::new(),
            ip_addresses: container.ip_addresses.clone(),
            labels: container.listed.labels.clone(),
            published_ports: container.published_ports.clone(),
        })
    }

    async fn wait(&self, id: &str) -> Result<i64> {
        self.enter("wait", id)?;
        loop {
            let notified = self.changed.notified();
            {
                let state = self.lock();
                let container = state
                    .containers
                    .get(id)
                    .ok_or_else(|| Self::not_found(id))?;
                if container.listed.state == ContainerState::Exited {
                    return Ok(container.exit_code.unwrap_or(0));
                }
            }
            notified.await;
        }
    }

    async fn logs(&self, id: &str, tail: usize) -> Result<String> {
        self.enter("logs", id)?;
        let state = self.lock();
        let container = state
            .containers
            .get(id)
            .ok_or_else(|| Self::not_found(id))?;
        let lines: Vec<&str> = container.output.lines().collect();
        let start = lines.len().saturating_sub(tail);
        Ok(lines[start..]
            .iter()
            .map(|line| format!("{line}\n"))
            .collect())
    }

    /// `since` is not kept (the fake's output has no times): all of it is sent.
    fn log_stream(&self, id: &str, options: super::LogOptions) -> super::LogChunks {
        let called = self.enter("log_stream", id);
        let state = Arc::clone(&self.state);
        let changed = Arc::clone(&self.changed);
        let id = id.to_owned();
        // The first chunk starts where the tail does.
        let (start, missing) = {
            let guard = state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let start = guard.containers.get(&id).map_or(0, |container| {
                let output = &container.output;
                let Some(tail) = options.tail else { return 0 };
                let mut starts: Vec<usize> = output
                    .match_indices('\n')
                    .map(|(at, _)| at + 1)
                    .filter(|at| *at < output.len())
                    .collect();
                starts.insert(0, 0);
                starts.len().checked_sub(tail).map_or(0, |first| {
                    starts.get(first).copied().unwrap_or(output.len())
                })
            });
            (start, !guard.containers.contains_key(&id))
        };
        let failed = called
            .err()
            .or_else(|| missing.then(|| Self::not_found(&id)));
        let begin = (failed, start, false);
        Box::pin(futures_util::stream::unfold(
            begin,
            move |(failed, offset, done)| {
                let state = Arc::clone(&state);
                let changed = Arc::clone(&changed);
                let id = id.clone();
                async move {
                    if let Some(error) = failed {
                        return Some((Err(error), (None, offset, true)));
                    }
                    if done {
                        return None;
                    }
                    loop {
                        let notified = changed.notified();
                        tokio::pin!(notified);
                        notified.as_mut().enable();
                        let (chunk, running) = {
                            let guard = state
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner);
                            let container = guard.containers.get(&id)?;
                            (
                                container.output.get(offset..).unwrap_or("").to_owned(),
                                container.listed.state == ContainerState::Running,
                            )
                        };
                        if !chunk.is_empty() {
                            let next = offset + chunk.len();
                            return Some((Ok(chunk.into_bytes()), (None, next, false)));
                        }
                        if !(options.follow && running) {
                            return None;
                        }
                        notified.await;
                    }
                }
            },
        ))
    }

    async fn exec(&self, id: &str, command: &[String]) -> Result<ExecOutcome> {
        self.enter("exec", id)?;
        let running = {
            let state = self.lock();
            let container = state
                .containers
                .get(id)
                .ok_or_else(|| Self::not_found(id))?;
            container.listed.state == ContainerState::Running
        };
        if !running {
            return Err(Error::Conflict {
                name: id.to_owned(),
                message: format!("container {id} is not running"),
            });
        }
        Ok(match interpret(Some(command)) {
            Run::Exited(exit_code, output) => ExecOutcome { exit_code, output },
            // An exec the fake cannot finish counts as a missing program, as in busybox.
            Run::Running(output) => ExecOutcome {
                exit_code: 127,
                output,
            },
        })
    }

    async fn exec_piped(
        &self,
        id: &str,
        command: &[String],
        stdin: Option<super::ExecInput>,
        stdout: Option<super::ExecOutput>,
    ) -> Result<ExecOutcome> {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let pipe = |what: &str, error: std::io::Error| Error::Pipe {
            what: format!("{what} of exec in {id}"),
            message: error.to_string(),
        };
        let mut input = Vec::new();
        if let Some(mut reader) = stdin {
            reader
                .read_to_end(&mut input)
                .await
                .map_err(|error| pipe("reading the input", error))?;
        }
        // `cat` copies its input, as in busybox; everything else is interpreted.
        let outcome = if command == ["cat"] {
            self.exec(id, &["true".to_owned()]).await?;
            ExecOutcome {
                exit_code: 0,
                output: String::from_utf8_lossy(&input).into_owned(),
            }
        } else {
            self.exec(id, command).await?
        };
        if let Some(mut out) = stdout {
            out.write_all(outcome.output.as_bytes())
                .await
                .map_err(|error| pipe("writing the output", error))?;
            out.shutdown()
                .await
                .map_err(|error| pipe("closing the output", error))?;
        }
        Ok(ExecOutcome {
            exit_code: outcome.exit_code,
            output: String::new(),
        })
    }

    async fn volume_path(&self, name: &str) -> Result<Option<std::path::PathBuf>> {
        self.enter("volume_path", name)?;
        let state = self.lock();
        Ok(state
            .volumes
            .contains_key(name)
            .then(|| state.volume_root.as_ref().map(|root| root.join(name)))
            .flatten())
    }

    async fn ensure_volume(&self, name: &str, labels: &BTreeMap<String, String>) -> Result<Volume> {
        self.enter("ensure_volume", name)?;
        if let Some(root) = self.lock().volume_root.clone() {
            std::fs::create_dir_all(root.join(name)).map_err(|error| Error::Invalid {
                message: format!("fake volume {name}: {error}"),
            })?;
        }
        let labels = self
            .lock()
            .volumes
            .entry(name.to_owned())
            .or_insert_with(|| labels.clone())
            .clone();
        Ok(Volume {
            name: name.to_owned(),
            labels,
        })
    }

    async fn list_volumes(&self, filter: &[(&str, &str)]) -> Result<Vec<Volume>> {
        self.enter("list_volumes", "")?;
        Ok(self
            .lock()
            .volumes
            .iter()
            .filter(|(_, labels)| {
                filter
                    .iter()
                    .all(|(key, value)| labels.get(*key).map(String::as_str) == Some(*value))
            })
            .map(|(name, labels)| Volume {
                name: name.clone(),
                labels: labels.clone(),
            })
            .collect())
    }

    async fn remove_volume(&self, name: &str) -> Result<()> {
        self.enter("remove_volume", name)?;
        let mut state = self.lock();
        let mounted = state.containers.values().any(|container| {
            container
                .spec
                .binds
                .iter()
                .any(|bind| bind.split(':').next() == Some(name))
        });
        if mounted {
            return Err(Error::Conflict {
                name: name.to_owned(),
                message: format!("remove {name}: volume is in use"),
            });
        }
        state.volumes.remove(name);
        Ok(())
    }

    async fn image_present(&self, image: &str) -> Result<bool> {
        self.enter("image_present", image)?;
        Ok(self.lock().present(image))
    }

    async fn image_info(&self, image: &str) -> Result<Option<ImageInfo>> {
        self.enter("image_info", image)?;
        let state = self.lock();
        if let Some(info) = state.pulled.get(image) {
            return Ok(Some(info.clone()));
        }
        let present = state
            .images
            .as_ref()
            .is_none_or(|images| images.contains(image));
        // Anything else the host has is local-only: imported or built, no registry digest.
        Ok(present.then(|| ImageInfo {
            id: FakeRuntime::image_id(image),
            repo_digests: Vec::new(),
        }))
    }

    async fn pull(&self, image: &str, auth: Option<&RegistryAuth>) -> Result<Option<String>> {
        self.enter("pull", image)?;
        let mut state = self.lock();
        // By digest: any digest a tag of the registry ever named, with that tag's access.
        let by_digest = image.split_once('@').and_then(|(repository, digest)| {
            state.known_digests.contains(digest).then(|| {
                // Access is the repository's: any of its published tags says who may pull.
                let tag = state
                    .registry
                    .keys()
                    .find(|tag| name_of(tag) == repository)
                    .cloned();
                (repository.to_owned(), digest.to_owned(), tag)
            })
        });
        let access = match &by_digest {
            Some((_, _, Some(tag))) => state.registry.get(tag),
            _ => state.registry.get(image),
        };
        let allowed = match access {
            Some(required) if required.is_empty() => true,
            Some(required) => auth.is_some_and(|auth| &auth.username == required),
            None => false,
        };
        if !allowed {
            return Err(Error::ImageMissing {
                image: image.to_owned(),
                message: format!("pull access denied for {image}"),
            });
        }
        let digest = match by_digest {
            Some((_, digest, _)) => Some(digest),
            None => state.tag_digests.get(image).cloned(),
        };
        if let Some(digest) = &digest {
            let repository = image
                .split_once('@')
                .map_or_else(|| repository_of(image), |(repository, _)| repository)
                .to_owned();
            let info = ImageInfo {
                id: FakeRuntime::image_id(digest),
                repo_digests: vec![format!("{repository}@{digest}")],
            };
            for name in [image.to_owned(), format!("{repository}@{digest}")] {
                state.pulled.insert(name.clone(), info.clone());
                if let Some(images) = &mut state.images {
                    images.insert(name);
                }
            }
        } else if let Some(images) = &mut state.images {
            images.insert(image.to_owned());
        }
        Ok(digest)
    }

    fn events(&self, filter: &[(&str, &str)]) -> super::Events {
        let filter: Vec<(String, String)> = filter
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect();
        let receiver = Some(self.events.subscribe());
        let stream = futures_util::stream::unfold(receiver, |receiver| async move {
            let mut receiver = receiver?;
            loop {
                match receiver.recv().await {
                    Ok(Some(event)) => return Some((Ok(event), Some(receiver))),
                    Ok(None) => {
                        let broken = Err(Error::Unavailable {
                            message: "the event stream was interrupted".to_owned(),
                        });
                        // Ends after the error: the receiver is dropped.
                        return Some((broken, None));
                    }
                    // A slow subscriber lost events: it goes on with the next ones, as a
                    // reconnecting engine client would.
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        })
        .filter(move |event| {
            let keep = match event {
                Ok(event) => filter
                    .iter()
                    .all(|(key, value)| event.labels.get(key) == Some(value)),
                Err(_) => true,
            };
            std::future::ready(keep)
        });
        Box::pin(stream)
    }

    async fn cpu_percent(&self, id: &str) -> Result<f64> {
        self.enter("cpu_percent", id)?;
        let state = self.lock();
        let container = state
            .containers
            .get(id)
            .ok_or_else(|| Self::not_found(id))?;
        Ok(if container.listed.state == ContainerState::Running {
            container.cpu_percent
        } else {
            0.0
        })
    }
}

/// The repository of a `repo:tag` reference (a registry's port is not a tag).
fn repository_of(image: &str) -> &str {
    match image.rsplit_once(':') {
        Some((repository, tag)) if !tag.contains('/') => repository,
        _ => image,
    }
}

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The repository of a `repo:tag` or `repo@digest` reference.
fn name_of(reference: &str) -> &str {
    repository_of(
        reference
            .split_once('@')
            .map_or(reference, |(name, _)| name),
    )
}
