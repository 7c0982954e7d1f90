//! The host policy at the sink: `Guarded` wraps the runtime the agent drives, and every request
//! that could give the host away is judged here, on the values the engine would receive, before
//! it is sent: a container's create (bind sources folded as Docker folds them and their
//! symlinks resolved on this host, networks, capabilities, `docker_options` with the log
//! driver), a service's create and update (its task template the same way), the networks and
//! overlays the agent makes, and the volumes it mounts as claims (one the agent did not create
//! is refused unless adopted).
//!
//! The manifest stage judges the same values with the same rules (`model::policy`) for
//! `path:line:col`; this guard is the guarantee: whatever path a value takes (interpolation,
//! asset references, a stored spec of an older agent, a macro), a request that violates the
//! policy never reaches the engine. A refusal is `Error::Refused`, permanent.
//!
//! With several sources (`--sources`), the guard also seals them from each other on the same
//! final values (`model::scopes`): a container may bind only asset files of its own source's
//! scopes (after `..` and symlinks), mount only named volumes its source holds (the store's
//! claims; a volume the agent makes carries its scope in `voodu.scope`, one made before is
//! mounted only where it was adopted), only claims (`voodu-<scope>-…`) of its own scopes, and
//! join only its own source's network (a branch preview: its preview's own network).
//!
//! A branch preview's container (its source `<base>#<slug>`, `model::previews`) also passes
//! its base's previews' policy (the agent's narrowed, `Policy::narrowed`) and their caps: a
//! limit above a cap is refused, a missing one is set to the cap.
//!
//! Invariant: the agent only ever drives a `Guarded` runtime (`agent::run_until` wraps the one
//! it is given; the `Informer` over it passes every request on), so no handler can reach the
//! engine around it.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use super::forward::forward;
use super::service::OVERLAY_SUFFIX;
use super::{
    ContainerSpec, Containers, Error, RegistryAuth, Result, Runtime, ServiceSpec, Swarm, Volume,
    labels,
};
use crate::model::Policy;
use crate::model::image_policy::{repository_of, split_digest};
use crate::model::policy::SignatureRule;
use crate::model::policy::{OwnedPaths, bind_source_text, normalize_path, resolve_on_host};
use crate::model::scopes::{Ledger, Ownership, Seal, foreign};

/// What names the agent's statefulset claims start with (`voodu-<scope>-<name>-<claim>-<n>`).
const CLAIM_PREFIX: &str = "voodu-";

/// The policy and the agent's own paths, judging requests.
#[derive(Clone)]
pub struct Rules {
    policy: Policy,
    owned: OwnedPaths,
    /// Which source owns which scope; the single source by default.
    ownership: Arc<Ownership>,
    /// Who holds each named volume, and which digests are verified (the store), once it is
    /// open.
    ledger: Arc<std::sync::OnceLock<Arc<dyn Ledger>>>,
    /// Repositories whose images run only with a verified signature, with the fingerprint of
    /// their keys (`--require-signature`).
    signed: Vec<(SignatureRule, String)>,
    /// Each source with branch previews, with the policy its previews' containers pass too
    /// (`policy` narrowed by the previews', with their caps).
    previews: Vec<(String, Policy)>,
}

impl std::fmt::Debug for Rules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rules")
            .field("policy", &self.policy)
            .field("owned", &self.owned)
            .field("ownership", &self.ownership)
            .finish_non_exhaustive()
    }
}

impl Rules {
    /// The rules of `policy`; `owned` are the host paths the agent itself mounts.
    pub fn new(policy: Policy, owned: OwnedPaths) -> Rules {
        Rules {
            policy,
            owned,
            ownership: Arc::new(Ownership::single()),
            ledger: Arc::default(),
            signed: Vec::new(),
            previews: Vec::new(),
        }
    }

    /// The same rules judging the containers of the branch previews of each source of
    /// `previews` (source, the previews' policy, their caps) by this policy narrowed by the
    /// previews' (`Policy::narrowed`) and by their caps, too.
    pub fn with_previews(
        mut self,
        previews: Vec<(String, Option<Policy>, crate::model::policy::Caps)>,
    ) -> Rules {
        self.previews = previews
            .into_iter()
            .map(|(source, policy, caps)| {
                let mut narrowed = match &policy {
                    Some(policy) => self.policy.narrowed(policy),
                    None => self.policy.clone(),
                };
                narrowed.caps = caps;
                (source, narrowed)
            })
            .collect();
        self
    }

    /// The same rules, letting an image of a repository a rule covers through only by a
    /// digest the store has verified under the rule's keys (`fingerprint`).
    pub fn requiring_signatures(mut self, rules: Vec<(SignatureRule, String)>) -> Rules {
        self.signed = rules;
        self
    }

    /// The same rules sealing the sources of `ownership` from each other.
    pub fn sealing(mut self, ownership: Arc<Ownership>) -> Rules {
        self.ownership = ownership;
        self
    }

    /// The seal of the source owning the scope `spec` is labelled with; `None` for a
    /// container of no scope (the agent's own ingress proxy). A scope no source owns gets a
    /// seal that owns nothing.
    fn seal_of(&self, spec: &ContainerSpec) -> Option<Seal> {
        let scope = spec.labels.get(labels::SCOPE)?;
        let source = self
            .ownership
            .source_of(scope)
            .unwrap_or_else(|| "\u{0}none".to_owned());
        Some(Seal::new(&source, Arc::clone(&self.ownership)))
    }

    /// What `seal`'s container may not point at among `spec`'s binds and networks, with bind
    /// sources resolved by `resolve` (see the module docs; named volumes are judged where
    /// they are made, `Guarded::own_volumes`).
    fn sealed_refusals(
        &self,
        seal: &Seal,
        spec: &ContainerSpec,
        resolve: &dyn Fn(&str) -> std::result::Result<String, String>,
    ) -> Vec<String> {
        let mut refusals = Vec::new();
        for bind in &spec.binds {
            let source = bind_source_text(bind);
            match normalize_path(source) {
                Some(folded) => {
                    let resolved = resolve(&folded).unwrap_or(folded);
                    refusals.extend(seal.bind_refusal(&resolved, &self.owned));
                }
                None => {
                    if let Some(rest) = source.strip_prefix(CLAIM_PREFIX) {
                        let owner = self.ownership.owner_of_derived(rest);
                        if !seal.owns_derived(rest) {
                            refusals.push(foreign(
                                &format!("volume {source} (a statefulset's claim)"),
                                &seal.source,
                                owner,
                            ));
                        }
                    }
                }
            }
        }
        let own = self.own_network(seal);
        for network in &spec.networks {
            if let Some(owner) = self.ownership.network_owner(network)
                && owner != seal.source
            {
                refusals.push(foreign(
                    &format!("network {network}"),
                    &seal.source,
                    Some(&owner),
                ));
            } else if network == crate::model::policy::DEFAULT_NETWORK && own != *network {
                refusals.push(format!(
                    "network {network} is shared by the sources that opted in; source `{}` has its own, {own}",
                    seal.source
                ));
            }
        }
        refusals
    }

    /// The network of `seal`'s source.
    fn own_network(&self, seal: &Seal) -> String {
        self.ownership.network_of_source(&seal.source)
    }

    /// Every refusal of creating `spec`, with bind sources resolved by `resolve` (the host's
    /// symlinks at the sink, the identity for a plan); `overlay`: the networks are Swarm
    /// overlays named `<network>-swarm`, judged as the network they stand for.
    pub(crate) fn refusals(
        &self,
        spec: &ContainerSpec,
        overlay: bool,
        resolve: &dyn Fn(&str) -> std::result::Result<String, String>,
    ) -> Vec<String> {
        let seal = self.seal_of(spec);
        let mut refusals =
            self.policy_refusals(&self.policy, spec, overlay, resolve, seal.as_ref());
        if let Some(seal) = &seal {
            refusals.extend(self.sealed_refusals(seal, spec, resolve));
            // A branch preview's container: its policy (narrower) and its caps too.
            if let Some(preview) = self.preview_policy(&seal.source) {
                for refusal in self.policy_refusals(preview, spec, overlay, resolve, Some(seal)) {
                    if !refusals.contains(&refusal) {
                        refusals.push(refusal);
                    }
                }
                refusals.extend(spec.memory.and_then(|n| preview.caps.memory_refusal(n)));
                refusals.extend(spec.nano_cpus.and_then(|n| preview.caps.cpus_refusal(n)));
            }
        }
        refusals
    }

    /// The refusals of `spec` under `policy`'s host rules.
    fn policy_refusals(
        &self,
        policy: &Policy,
        spec: &ContainerSpec,
        overlay: bool,
        resolve: &dyn Fn(&str) -> std::result::Result<String, String>,
        seal: Option<&Seal>,
    ) -> Vec<String> {
        let mut refusals = Vec::new();
        for bind in &spec.binds {
            // Docker takes a source that is not an absolute path as a volume's name.
            let Some(folded) = normalize_path(bind_source_text(bind)) else {
                continue;
            };
            refusals.extend(policy.resolved_bind_refusal(&folded, &self.owned, resolve));
        }
        refusals.extend(policy.network_mode_refusal(&spec.network_mode));
        for network in &spec.networks {
            // A source's own network is the agent's, as `voodu0` is.
            let own = seal.is_some_and(|seal| {
                self.ownership.network_owner(network).as_deref() == Some(seal.source.as_str())
            });
            if !own {
                refusals.extend(self.network_refusal(policy, network, overlay));
            }
        }
        refusals.extend(
            spec.cap_add
                .iter()
                .filter_map(|cap| policy.cap_refusal(cap, "cap_add")),
        );
        refusals.extend(policy.options_refusals(&spec.options));
        refusals
    }

    /// The policy (the agent's narrowed by the previews', with their caps) of `source`'s
    /// containers when it is a branch preview's internal source of a base with previews.
    fn preview_policy(&self, source: &str) -> Option<&Policy> {
        let (base, _) = crate::model::previews::split_source(source)?;
        self.previews
            .iter()
            .find(|(name, _)| name == base)
            .map(|(_, policy)| policy)
    }

    /// `spec` with the caps of its preview filled in where it sets no limit (a container
    /// without a memory or CPU limit gets the cap); `None` when nothing changes.
    fn capped(&self, spec: &ContainerSpec) -> Option<ContainerSpec> {
        let seal = self.seal_of(spec)?;
        let caps = self.preview_policy(&seal.source)?.caps;
        let memory = spec.memory.or(caps.memory);
        let nano_cpus = spec.nano_cpus.or(caps.cpus);
        (memory != spec.memory || nano_cpus != spec.nano_cpus).then(|| ContainerSpec {
            memory,
            nano_cpus,
            ..spec.clone()
        })
    }

    fn network_refusal(&self, policy: &Policy, network: &str, overlay: bool) -> Option<String> {
        let base = if overlay {
            network.strip_suffix(OVERLAY_SUFFIX).unwrap_or(network)
        } else {
            network
        };
        if self.ownership.network_owner(base).is_some() {
            // The sources' own networks are the agent's to make; who joins one is judged by
            // `sealed_refusals`.
            return None;
        }
        policy.network_refusal(base)
    }

    /// `refusals` with bind sources resolved on this host (blocking: file system reads).
    fn refusals_on_host(&self, spec: &ContainerSpec, overlay: bool) -> Vec<String> {
        self.refusals(spec, overlay, &|path| {
            resolve_on_host(Path::new(path)).map_err(|error| error.to_string())
        })
    }
}

/// A runtime whose every request passes the rules first (see the module docs).
pub struct Guarded<R> {
    inner: Arc<R>,
    rules: Arc<Rules>,
    /// Turns of the blocking threads the checks run on (`CHECK_THREADS`).
    threads: Arc<tokio::sync::Semaphore>,
}

/// Blocking threads the checks of creates run on at once (the policy's file checks, the
/// ledger's lookups in the store): a burst of creates waits for a turn without a thread,
/// instead of each starting one in tokio's blocking pool.
const CHECK_THREADS: usize = 2;

impl<R: Runtime> Guarded<R> {
    pub fn new(inner: Arc<R>, rules: Rules) -> Guarded<R> {
        Guarded {
            inner,
            rules: Arc::new(rules),
            threads: Arc::new(tokio::sync::Semaphore::new(CHECK_THREADS)),
        }
    }

    /// Runs a check on a blocking thread (`crate::pool`), in one of the checks' turns
    /// (`CHECK_THREADS`).
    async fn off_thread<T: Send + 'static>(
        &self,
        check: impl FnOnce() -> T + Send + 'static,
    ) -> std::result::Result<T, tokio::task::JoinError> {
        // The semaphore is never closed; were it, the check would run without a turn.
        let turn = Arc::clone(&self.threads).acquire_owned().await.ok();
        crate::pool::run_as_task(move || {
            let _turn = turn;
            check()
        })
        .await
    }

    /// From now on, named volumes are judged by who holds them in `ledger` (the store).
    pub fn set_ledger(&self, ledger: Arc<dyn Ledger>) {
        // Set once, when the store opens; a second call keeps the first.
        let _ = self.rules.ledger.set(ledger);
    }

    /// Refuses `image` of a repository a signature rule covers unless it is a digest the
    /// store verified under the rule's keys: a tag, or a digest nobody verified, never
    /// reaches the engine whatever path built the request.
    async fn signed(&self, image: &str) -> Result<()> {
        let repository = repository_of(image);
        let Some((rule, fingerprint)) = self
            .rules
            .signed
            .iter()
            .find(|(rule, _)| rule.covers(repository))
        else {
            return Ok(());
        };
        let refused = |why: String| Error::Refused {
            message: format!(
                "image {image} of a repository that requires a signature ({}) is not run: {why}",
                rule.repositories
            ),
        };
        let Some((_, digest)) = split_digest(image) else {
            return Err(refused("it is not named by its digest".to_owned()));
        };
        let Some(ledger) = self.rules.ledger.get().cloned() else {
            return Err(refused("no verification is recorded yet".to_owned()));
        };
        let (digest, keys) = (digest.to_owned(), fingerprint.clone());
        let verified = self
            .off_thread(move || ledger.verified(&digest, &keys))
            .await
            .map_err(|error| Error::Unavailable {
                message: format!("the signature check did not finish: {error}"),
            })?
            .map_err(|error| Error::Unavailable {
                message: error.to_string(),
            })?;
        if verified {
            Ok(())
        } else {
            Err(refused(
                "no signature of its digest was verified under the trusted keys".to_owned(),
            ))
        }
    }

    /// Makes the named volumes `spec` mounts, labelled with its scope, and refuses what its
    /// source does not hold: a volume another source declared (the store's claims), one
    /// labelled with another source's scope, and one the agent did not make that no source
    /// adopted (unless the host adopts it, or one source owns every scope).
    async fn own_volumes(&self, spec: &ContainerSpec) -> Result<()> {
        let Some(seal) = self.rules.seal_of(spec) else {
            return Ok(());
        };
        let Some(ledger) = self.rules.ledger.get().cloned() else {
            return Ok(());
        };
        for bind in &spec.binds {
            let name = bind_source_text(bind);
            if name.is_empty() || name.starts_with('/') || name.starts_with(CLAIM_PREFIX) {
                continue;
            }
            let lookup = name.to_owned();
            let ledger = Arc::clone(&ledger);
            let holder = self
                .off_thread(move || ledger.holder(&lookup))
                .await
                .map_err(|error| Error::Unavailable {
                    message: format!("the volume check did not finish: {error}"),
                })?
                .map_err(|error| Error::Unavailable {
                    message: error.to_string(),
                })?;
            let adopted = match &holder {
                Some((source, adopted)) if *source == seal.source => *adopted,
                Some((source, _)) => {
                    return refuse(vec![foreign(
                        &format!("volume {name}"),
                        &seal.source,
                        Some(source),
                    )]);
                }
                None => {
                    return refuse(vec![format!(
                        "volume {name} is declared by no resource of source `{}`: the agent mounts only named volumes a resource of the container's source declares",
                        seal.source
                    )]);
                }
            };
            let scope = spec.labels.get(labels::SCOPE).cloned().unwrap_or_default();
            let mut volume_labels: BTreeMap<String, String> = crate::model::map_of(
                spec.labels
                    .iter()
                    .filter(|(key, _)| [labels::CREATED_BY, labels::AGENT].contains(&key.as_str()))
                    .map(|(key, value)| (key.clone(), value.clone())),
            );
            volume_labels.insert(labels::SCOPE.to_owned(), scope.clone());
            let volume = self.inner.ensure_volume(name, &volume_labels).await?;
            let made_by_agent = volume.labels.get(labels::CREATED_BY).map(String::as_str)
                == Some(labels::CREATED_BY_VALUE);
            match volume.labels.get(labels::SCOPE) {
                Some(owner_scope) if made_by_agent => {
                    if !self.rules.ownership.same_owner(owner_scope, &scope) {
                        return refuse(vec![foreign(
                            &format!("volume {name} (labelled voodu.scope={owner_scope})"),
                            &seal.source,
                            self.rules.ownership.owner_of(owner_scope),
                        )]);
                    }
                }
                _ if adopted || self.rules.ownership.is_single() => {}
                _ => refuse(
                    self.rules
                        .policy
                        .foreign_volume_refusal(name)
                        .into_iter()
                        .collect(),
                )?,
            }
        }
        Ok(())
    }

    async fn judge(&self, spec: &ContainerSpec, overlay: bool) -> Result<()> {
        let rules = Arc::clone(&self.rules);
        let spec = spec.clone();
        let refusals = self
            .off_thread(move || rules.refusals_on_host(&spec, overlay))
            .await
            .map_err(|error| Error::Unavailable {
                message: format!("the policy check did not finish: {error}"),
            })?;
        refuse(refusals)
    }
}

fn refuse(refusals: Vec<String>) -> Result<()> {
    if refusals.is_empty() {
        Ok(())
    } else {
        Err(Error::Refused {
            message: refusals.join("; "),
        })
    }
}

impl<R: Runtime> Containers for Guarded<R> {
    forward!(
        inner: list, list_by_id, start, remove, stop, inspect, wait, logs, log_stream, exec, exec_piped, volume_path,
        list_volumes, remove_volume, image_present, image_info, pull, events, cpu_percent,
        connect_network, remove_network
    );

    async fn create(&self, spec: &ContainerSpec) -> Result<String> {
        // A preview's container without a limit gets its previews' cap.
        let capped = self.rules.capped(spec);
        let spec = capped.as_ref().unwrap_or(spec);
        self.judge(spec, false).await?;
        self.signed(&spec.image).await?;
        self.own_volumes(spec).await?;
        self.inner.create(spec).await
    }

    async fn ensure_network(&self, name: &str) -> Result<()> {
        // A source's own network passes: who joins it is judged at each create.
        refuse(
            self.rules
                .network_refusal(&self.rules.policy, name, false)
                .into_iter()
                .collect(),
        )?;
        self.inner.ensure_network(name).await
    }

    async fn ensure_volume(&self, name: &str, labels: &BTreeMap<String, String>) -> Result<Volume> {
        let volume = self.inner.ensure_volume(name, labels).await?;
        let ours = volume.labels.get(labels::CREATED_BY).map(String::as_str)
            == Some(labels::CREATED_BY_VALUE);
        // A claim labelled with a scope of another source than the one asking is not this
        // scope's, whatever its name says.
        if ours
            && let (Some(asking), Some(labelled)) =
                (labels.get(labels::SCOPE), volume.labels.get(labels::SCOPE))
            && !self.rules.ownership.same_owner(asking, labelled)
        {
            return Err(Error::Refused {
                message: foreign(
                    &format!("volume {name} (labelled voodu.scope={labelled})"),
                    self.rules.ownership.owner_of(asking).unwrap_or_default(),
                    self.rules.ownership.owner_of(labelled),
                ),
            });
        }
        if !ours {
            refuse(
                self.rules
                    .policy
                    .foreign_volume_refusal(name)
                    .into_iter()
                    .collect(),
            )?;
        }
        Ok(volume)
    }
}

impl<R: Runtime> Swarm for Guarded<R> {
    forward!(
        inner: swarm_node, list_nodes, list_services, remove_service, list_tasks, task_logs,
        create_config, list_configs, remove_config
    );

    async fn ensure_overlay(&self, name: &str) -> Result<()> {
        refuse(
            self.rules
                .network_refusal(&self.rules.policy, name, true)
                .into_iter()
                .collect(),
        )?;
        self.inner.ensure_overlay(name).await
    }

    async fn create_service(
        &self,
        spec: &ServiceSpec,
        auth: Option<&RegistryAuth>,
    ) -> Result<String> {
        self.judge(&spec.task, true).await?;
        self.signed(&spec.task.image).await?;
        self.inner.create_service(spec, auth).await
    }

    async fn update_service(
        &self,
        id: &str,
        version: u64,
        spec: &ServiceSpec,
        auth: Option<&RegistryAuth>,
    ) -> Result<()> {
        self.judge(&spec.task, true).await?;
        self.signed(&spec.task.image).await?;
        self.inner.update_service(id, version, spec, auth).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::scopes::Ownership;
    use crate::runtime::FakeRuntime;

    type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

    const DATA: &str = "/srv/voodu";

    fn guarded(edit: impl FnOnce(&mut Policy)) -> (Arc<FakeRuntime>, Guarded<FakeRuntime>) {
        let mut policy = Policy {
            data_dir: Some(DATA.to_owned()),
            ..Policy::default()
        };
        edit(&mut policy);
        let mut owned = OwnedPaths::for_data_dir(DATA);
        owned.exact.push(format!("{DATA}/ingress/data"));
        let fake = Arc::new(FakeRuntime::new());
        (
            Arc::clone(&fake),
            Guarded::new(fake, Rules::new(policy, owned)),
        )
    }

    fn spec(binds: &[&str]) -> ContainerSpec {
        ContainerSpec {
            name: "s-web.1".to_owned(),
            image: "busybox".to_owned(),
            binds: binds.iter().map(|bind| (*bind).to_owned()).collect(),
            networks: vec!["voodu0".to_owned()],
            ..ContainerSpec::default()
        }
    }

    fn refused(result: Result<String>) -> String {
        match result {
            Err(Error::Refused { message }) => message,
            other => format!("not refused: {other:?}"),
        }
    }

    fn creates(fake: &FakeRuntime) -> usize {
        fake.calls()
            .iter()
            .filter(|call| call.starts_with("create"))
            .count()
    }

    #[tokio::test]
    async fn an_interpolated_walk_out_of_the_asset_directory_never_reaches_the_engine() -> TestResult
    {
        let (fake, runtime) = guarded(|_| {});
        runtime.ensure_network("voodu0").await?;
        let walk = format!("{DATA}/assets/s/a/k/../../../../../../../../etc:/x");
        assert_eq!(
            refused(runtime.create(&spec(&[&walk])).await),
            "bind mount of /etc (a system directory) is refused by the host policy; start the agent with --allow-bind-root /etc to allow it"
        );
        let socket = format!("{DATA}/assets/s/a/k/../../../../../../var/run/docker.sock:/s");
        // (`/var/run` is often a link to `/run`: either way the socket is refused.)
        let message = refused(runtime.create(&spec(&[&socket])).await);
        assert!(
            message.contains("docker.sock (under /")
                && message.contains("runtime sockets, the Docker socket among them"),
            "{message}"
        );
        assert_eq!(creates(&fake), 0, "{:?}", fake.calls());
        // The asset file itself, the ingress's own directory and named volumes pass.
        let file = format!("{DATA}/assets/s/a/k:/etc/app.conf:ro");
        let ingress = format!("{DATA}/ingress/data:/data");
        runtime
            .create(&spec(&[&file, &ingress, "pgdata:/var/lib/pg"]))
            .await?;
        assert_eq!(creates(&fake), 1);
        Ok(())
    }

    #[tokio::test]
    async fn a_symlink_under_an_allowed_root_is_judged_where_it_leads() -> TestResult {
        let root = tempfile::tempdir()?;
        let root_path = std::fs::canonicalize(root.path())?;
        let root_text = root_path.display().to_string();
        std::os::unix::fs::symlink("/etc", root_path.join("etc-link"))?;
        std::os::unix::fs::symlink(root_path.join("missing"), root_path.join("dangling"))?;
        std::fs::create_dir(root_path.join("data"))?;
        let (fake, runtime) = guarded(|policy| policy.allow_bind_root = vec![root_text.clone()]);
        runtime.ensure_network("voodu0").await?;
        assert_eq!(
            refused(
                runtime
                    .create(&spec(&[&format!("{root_text}/etc-link/ssl:/x")]))
                    .await
            ),
            format!(
                "bind mount of {root_text}/etc-link/ssl resolves to /etc/ssl on this host: bind mount of /etc/ssl (under /etc: a system directory) is refused by the host policy; start the agent with --allow-bind-root /etc/ssl to allow it"
            )
        );
        assert!(
            refused(
                runtime
                    .create(&spec(&[&format!("{root_text}/dangling/x:/x")]))
                    .await
            )
            .contains("is a link that leads nowhere on this host")
        );
        assert_eq!(creates(&fake), 0);
        runtime
            .create(&spec(&[&format!("{root_text}/data/new:/x")]))
            .await?;
        assert_eq!(creates(&fake), 1);
        Ok(())
    }

    #[tokio::test]
    async fn options_networks_and_capabilities_are_judged_on_the_request() -> TestResult {
        let (fake, runtime) = guarded(|_| {});
        let mut logging = spec(&[]);
        logging.options = crate::model::DockerOptions::parse(&[
            "--log-driver=syslog".to_owned(),
            "--log-opt=syslog-address=tcp://127.0.0.1:5140".to_owned(),
        ])?;
        assert!(refused(runtime.create(&logging).await).starts_with("log driver \"syslog\""));
        let mut privileged = spec(&[]);
        privileged.options.privileged = true;
        privileged.cap_add = vec!["SYS_ADMIN".to_owned()];
        privileged.network_mode = "host".to_owned();
        privileged.networks.clear();
        let message = refused(runtime.create(&privileged).await);
        for part in [
            "host networking",
            "capability SYS_ADMIN",
            "privileged containers",
        ] {
            assert!(message.contains(part), "{part}: {message}");
        }
        let mut other_network = spec(&[]);
        other_network.networks.push("db-backend".to_owned());
        assert!(
            refused(runtime.create(&other_network).await).contains("--allow-network db-backend")
        );
        assert!(matches!(
            runtime.ensure_network("bridge").await,
            Err(Error::Refused { .. })
        ));
        assert_eq!(creates(&fake), 0);
        assert!(
            !fake
                .calls()
                .iter()
                .any(|call| call.starts_with("ensure_network"))
        );
        Ok(())
    }

    #[tokio::test]
    async fn a_service_template_is_judged_with_its_overlays() -> TestResult {
        let (fake, runtime) = guarded(|_| {});
        let mut task = spec(&[]);
        task.networks = vec!["voodu0-swarm".to_owned()];
        let mut service = crate::runtime::service::fixture(task);
        runtime.ensure_overlay("voodu0-swarm").await?;
        let id = runtime.create_service(&service, None).await?;
        service.task.binds = vec!["/etc:/host-etc".to_owned()];
        assert!(matches!(
            runtime.update_service(&id, 1, &service, None).await,
            Err(Error::Refused { .. })
        ));
        service.task.binds.clear();
        service.task.networks.push("backend-swarm".to_owned());
        assert!(matches!(
            runtime.create_service(&service, None).await,
            Err(Error::Refused { .. })
        ));
        assert!(matches!(
            runtime.ensure_overlay("backend-swarm").await,
            Err(Error::Refused { .. })
        ));
        let sent: Vec<String> = fake
            .calls()
            .into_iter()
            .filter(|call| call.contains("service") || call.starts_with("ensure_overlay"))
            .collect();
        assert_eq!(sent.len(), 2, "{sent:?}");
        Ok(())
    }

    #[tokio::test]
    async fn a_volume_the_agent_did_not_create_is_not_mounted_unless_adopted() -> TestResult {
        let name = "voodu-shop-db-data-0";
        let ours = BTreeMap::from([(
            labels::CREATED_BY.to_owned(),
            labels::CREATED_BY_VALUE.to_owned(),
        )]);
        let (fake, runtime) = guarded(|_| {});
        // Made by hand (`docker volume create`), with foreign data in it.
        fake.ensure_volume(name, &BTreeMap::new()).await?;
        match runtime.ensure_volume(name, &ours).await {
            Err(Error::Refused { message }) => assert_eq!(
                message,
                format!(
                    "volume {name} already exists and was not created by voodu (no createdby=voodu label): the agent does not mount data it did not make; remove it (docker volume rm {name}) for a fresh one, or, only if you know who wrote it, start the agent with --adopt-volume {name} to hand its data to the resource mounting it (whoever could create a volume of that name chose what it holds: another tenant of this engine, another source)"
                )
            ),
            other => return Err(format!("not refused: {other:?}").into()),
        }
        // A volume the agent makes, or made before, is its own.
        runtime.ensure_volume("voodu-shop-db-data-1", &ours).await?;
        runtime.ensure_volume("voodu-shop-db-data-1", &ours).await?;
        let (fake, adopting) = guarded(|policy| policy.adopt_volume = vec![name.to_owned()]);
        fake.ensure_volume(name, &BTreeMap::new()).await?;
        adopting.ensure_volume(name, &ours).await?;
        Ok(())
    }

    /// Rules sealing `shop` (scope `shop`) from `blog` (scope `blog`).
    fn two_sources() -> std::result::Result<(Arc<FakeRuntime>, Guarded<FakeRuntime>), String> {
        use crate::model::scopes::ScopePattern;
        let ownership = Ownership::new(vec![
            (
                "shop".to_owned(),
                vec![ScopePattern::parse("shop").map_err(|error| error.to_string())?],
            ),
            (
                "blog".to_owned(),
                vec![ScopePattern::parse("blog").map_err(|error| error.to_string())?],
            ),
        ])
        .map_err(|error| error.to_string())?;
        let policy = Policy {
            data_dir: Some(DATA.to_owned()),
            ..Policy::default()
        };
        let fake = Arc::new(FakeRuntime::new());
        let rules = Rules::new(policy, OwnedPaths::for_data_dir(DATA)).sealing(Arc::new(ownership));
        Ok((Arc::clone(&fake), Guarded::new(fake, rules)))
    }

    fn scoped(scope: &str, binds: &[&str], networks: &[&str]) -> ContainerSpec {
        let mut spec = spec(binds);
        spec.name = format!("{scope}-web.1");
        spec.labels
            .insert(labels::SCOPE.to_owned(), scope.to_owned());
        spec.networks = networks
            .iter()
            .map(|network| (*network).to_owned())
            .collect();
        spec
    }

    #[tokio::test]
    async fn a_source_joins_its_own_network_and_binds_its_own_assets_only() -> TestResult {
        let (fake, runtime) = two_sources()?;
        runtime.ensure_network("voodu0-blog").await?;
        runtime.ensure_network("voodu0-shop").await?;
        let own = format!("{DATA}/assets/blog/a/k:/x:ro");
        runtime
            .create(&scoped("blog", &[&own], &["voodu0-blog"]))
            .await?;
        let shop_file = format!("{DATA}/assets/shop/cfg/secret:/x");
        let walk = format!("{DATA}/assets/blog/a/k/../../../shop/cfg/secret:/x");
        for refused_spec in [
            scoped("blog", &[&shop_file], &["voodu0-blog"]),
            scoped("blog", &[&walk], &["voodu0-blog"]),
            scoped("blog", &["voodu-shop-db-data-0:/x"], &["voodu0-blog"]),
            scoped("blog", &[], &["voodu0-shop"]),
            scoped("blog", &[], &["voodu0"]),
        ] {
            let message = refused(runtime.create(&refused_spec).await);
            assert!(
                message.contains("source `shop`") || message.contains("has its own, voodu0-blog"),
                "{:?}: {message}",
                refused_spec.binds
            );
        }
        assert_eq!(creates(&fake), 1, "{:?}", fake.calls());
        Ok(())
    }

    #[tokio::test]
    async fn a_preview_joins_its_own_network_and_gets_its_caps() -> TestResult {
        use crate::model::scopes::ScopePattern;
        let patterns = ["shop", "shop-pr-*"]
            .map(|pattern| ScopePattern::parse(pattern).map_err(|error| error.to_string()));
        let [shop, previews] = patterns;
        let ownership = Ownership::new(vec![
            ("shop".to_owned(), vec![shop?, previews?]),
            (
                "blog".to_owned(),
                vec![ScopePattern::parse("blog").map_err(|error| error.to_string())?],
            ),
        ])
        .map_err(|error| error.to_string())?
        .with_previews(vec![("shop".to_owned(), "-pr-".to_owned())]);
        let policy = Policy {
            data_dir: Some(DATA.to_owned()),
            ..Policy::default()
        };
        let caps = crate::model::policy::Caps {
            max_replicas: None,
            memory: Some(64 << 20),
            cpus: None,
        };
        let fake = Arc::new(FakeRuntime::new());
        let rules = Rules::new(policy, OwnedPaths::for_data_dir(DATA))
            .sealing(Arc::new(ownership))
            .with_previews(vec![("shop".to_owned(), None, caps)]);
        let runtime = Guarded::new(Arc::clone(&fake), rules);
        let own = "voodu0-shop.pr.feat-x";
        runtime.ensure_network(own).await?;
        runtime.ensure_network("voodu0-shop").await?;
        // Its own network; no limit: the cap.
        let id = runtime
            .create(&scoped("shop-pr-feat-x", &[], &[own]))
            .await?;
        assert_eq!(
            fake.spec_of(&id).and_then(|spec| spec.memory),
            Some(64 << 20)
        );
        // The base's network, another preview's, `voodu0`, and a limit above the cap.
        let mut above = scoped("shop-pr-feat-x", &[], &[own]);
        above.memory = Some(128 << 20);
        for refused_spec in [
            scoped("shop-pr-feat-x", &[], &["voodu0-shop"]),
            scoped("shop-pr-feat-x", &[], &["voodu0-shop.pr.other"]),
            scoped("shop-pr-feat-x", &[], &["voodu0"]),
            above,
        ] {
            let message = refused(runtime.create(&refused_spec).await);
            assert!(!message.starts_with("not refused"), "{message}");
        }
        // The base: its own network, no cap.
        let id = runtime
            .create(&scoped("shop", &[], &["voodu0-shop"]))
            .await?;
        assert_eq!(fake.spec_of(&id).and_then(|spec| spec.memory), None);
        assert_eq!(creates(&fake), 2, "{:?}", fake.calls());
        Ok(())
    }

    #[tokio::test]
    async fn a_claim_labelled_with_another_sources_scope_is_not_mounted() -> TestResult {
        let (fake, runtime) = two_sources()?;
        let name = "voodu-blog-db-data-0";
        let shops = BTreeMap::from([
            (
                labels::CREATED_BY.to_owned(),
                labels::CREATED_BY_VALUE.to_owned(),
            ),
            (labels::SCOPE.to_owned(), "shop".to_owned()),
        ]);
        fake.ensure_volume(name, &shops).await?;
        let blogs = BTreeMap::from([
            (
                labels::CREATED_BY.to_owned(),
                labels::CREATED_BY_VALUE.to_owned(),
            ),
            (labels::SCOPE.to_owned(), "blog".to_owned()),
        ]);
        match runtime.ensure_volume(name, &blogs).await {
            Err(Error::Refused { message }) => {
                assert!(message.contains("labelled voodu.scope=shop"), "{message}")
            }
            other => return Err(format!("not refused: {other:?}").into()),
        }
        runtime
            .ensure_volume("voodu-blog-db-data-1", &blogs)
            .await?;
        Ok(())
    }
}
