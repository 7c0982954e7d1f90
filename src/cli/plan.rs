//! `voodu-agent plan`: what this host would create, update, replace, delete or leave if the
//! given manifests were applied, computed by `reconcile::plan` (the function the handlers
//! use) against the agent's desired state and, when the engine answers, its containers.
//!
//! Exit codes as terraform's and voodu's: 0 success, 1 error, and with `--detailed-exitcode`
//! 2 when there are changes. Values of `env`, `token` and `headers` are never printed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;

use anyhow::Context as _;
use clap::Args;
use serde::Serialize;

use super::validate::{MISSING_VAR_HINT, PolicyArgs, VarArgs, absolute_text};
use crate::assets::{DEFAULT_MAX_URL_BYTES, UrlCache};
use crate::git::{Source, SourceOptions, WorkdirFiles, read_workdir, read_workdir_triggers};
use crate::manifest::spec::Spec;
use crate::manifest::triggers;
use crate::manifest::{self, LoadOptions, Manifest, Mode, Policy};
use crate::model::text::{Esc, escape};
use crate::model::{
    CommitSha, FileRead, FileSource, HostSelection, Kind, ResourceKey, Snapshot, SourceFile,
};
use crate::reconcile::Engine;
use crate::reconcile::plan::{
    Action, CurrentSpec, ResourcePlan, StatefulStep, Step, plan_all, swarm_gaps, swarm_notes,
};
use crate::runtime::{Container, Containers, DockerRuntime, labels};
use crate::store::Store;

#[derive(Debug, Args)]
pub(super) struct PlanArgs {
    /// What to plan: a working directory (uncommitted edits included), or a git repository
    /// (a URL, or a path together with --rev).
    #[arg(long, value_name = "URL|DIR", default_value = ".")]
    repo: String,
    /// Plan this revision of the repository (branch, tag or full commit SHA) instead of a
    /// working directory. Default for a URL: main.
    #[arg(long, value_name = "REV")]
    rev: Option<String>,
    /// Only read manifests under this directory (repeatable), as the agent's --path.
    #[arg(long = "path", value_name = "DIR")]
    paths: Vec<String>,
    /// With trigger files (`.voodu/*.yml`): the branch the agent tracks, which decides which
    /// triggers can fire. Default: the branch the agent recorded in state.db, else main.
    #[arg(long, value_name = "BRANCH")]
    branch: Option<String>,
    #[command(flatten)]
    vars: VarArgs,
    /// Exit 2 when the plan has changes (0 when none, 1 on error).
    #[arg(long)]
    detailed_exitcode: bool,
    /// Print the plan as JSON.
    #[arg(long)]
    json: bool,
    /// The host policy to plan under. Default: the one the agent last ran with (recorded in
    /// its state.db), else the default-deny policy.
    #[command(flatten)]
    policy: PolicyArgs,
    /// The fleet host to plan for: the shared manifests and its own `hosts/NAME/` (and
    /// `labels/LABEL/`). Default: the host the agent recorded in state.db, else the
    /// machine's host name.
    #[command(flatten)]
    hosts: super::fleet::HostArgs,
    /// Plan for this runtime: `docker` (containers) or `swarm` (Docker Swarm services: which
    /// resources map fully, which with notes, which cannot run and why). Default: the one
    /// the agent recorded in state.db, else docker.
    #[arg(long, value_name = "docker|swarm", value_parser = super::validate::parse_runtime)]
    runtime: Option<Engine>,
    /// The signatures to require of the planned commit, as the agent's flags.
    #[command(flatten)]
    trust: super::trust::TrustArgs,
    /// Plan as one source of an agent following several repositories: against what that
    /// source applied, in the scopes it owns (README "Several repositories").
    #[command(flatten)]
    source: super::validate::SourceArgs,
}

pub(super) fn run(args: &PlanArgs, data_dir: &Path) -> anyhow::Result<ExitCode> {
    let scratch = tempfile::tempdir().context("cannot create a scratch directory")?;
    let owned_by = args.source.owned_by()?;
    let store = open_store(data_dir, owned_by.as_ref())?;
    let mut vars = args.vars.to_vars()?;
    if let Some(store) = &store {
        vars.buckets = store.buckets()?;
    }
    let mut policy = host_policy(args, store.as_ref(), data_dir)?;
    if let Some(owned_by) = &owned_by {
        policy.seal = Some(owned_by.seal());
    }
    let trust = args.trust.to_commit_trust()?;
    let hosts = plan_hosts(args, store.as_ref())?;
    let read = read_source(args, scratch.path(), &hosts)?;
    if let Some(trust) = &trust
        && let Some(code) = refuse_untrusted(trust, store.as_ref(), &read)?
    {
        return Ok(code);
    }
    let (snapshot, files, triggers) = match with_triggers(
        args,
        read,
        store.as_ref(),
        data_dir,
        &hosts,
    )? {
        Ok(planned) => planned,
        Err(problems) => {
            eprint_escaped(&problems);
            eprintln!(
                "plan: {} error(s) in the trigger files; the agent would reject this commit and keep running the last good one",
                problems.len()
            );
            return Ok(ExitCode::from(1));
        }
    };
    let Some(manifest) = load(scratch.path(), &policy, &vars, files.as_ref(), &snapshot)? else {
        return Ok(ExitCode::from(1));
    };
    if let Some(code) = refusals(args, &manifest, &policy, owned_by.as_ref(), &snapshot)? {
        return Ok(code);
    }
    let (scaled, current) = current_specs(store.as_ref(), owned_by.is_some())?;
    let (swarm, actual, engine_note) = actual_state(args, store.as_ref())?;
    let mut plans = plan_all(&manifest, &current, &actual, &scaled);
    if swarm {
        for plan in &mut plans {
            // Container steps do not apply: Swarm replaces tasks itself.
            plan.steps.clear();
            plan.pod_steps.clear();
        }
    }
    let mut view = PlanView::new(
        &snapshot,
        data_dir,
        store.is_some(),
        engine_note,
        &manifest,
        &plans,
    );
    view.triggers = triggers;
    view.host = hosts.host.clone();
    view.host_labels = hosts.labels.clone();
    if swarm {
        view.under_swarm(&manifest);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&view)?);
    } else {
        print!("{}", view.text());
    }
    let changes = plans.iter().any(|plan| plan.action != Action::Unchanged);
    Ok(if args.detailed_exitcode && changes {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    })
}

/// The agent's store, read only, when the data dir has one: as one source of several, that
/// source's view (commits, triggers and resources) only.
fn open_store(
    data_dir: &Path,
    owned_by: Option<&super::validate::OwnedBy>,
) -> anyhow::Result<Option<Store>> {
    let db = data_dir.join("state.db");
    let store = if db.exists() {
        Some(Store::open_read_only(&db).with_context(|| format!("cannot read {}", db.display()))?)
    } else {
        None
    };
    // As one source of several: its commits, triggers and resources only.
    let store = match (store, owned_by) {
        (Some(store), Some(owned_by)) => Some(store.for_source(&owned_by.name)),
        (Some(store), None) if !store.source_names()?.is_empty() => anyhow::bail!(
            "this agent follows several repositories ({}): plan one of them with --sources FILE --source NAME",
            store.source_names()?.join(", ")
        ),
        (store, _) => store,
    };
    Ok(store)
}

/// With `--verify-commits`: the exit code when the commit planned is not signed by a trusted
/// key (said on stderr), as the agent would reject it.
fn refuse_untrusted(
    trust: &crate::sync::CommitTrust,
    store: Option<&Store>,
    read: &Read,
) -> anyhow::Result<Option<ExitCode>> {
    let Some((source, commit)) = &read.git else {
        anyhow::bail!(
            "--verify-commits checks commits: plan a revision (`--rev REV`) or a repository URL, not a working directory"
        );
    };
    let since = match (store, trust.mode) {
        (Some(store), crate::git::VerifyMode::All) => store
            .commit_summary()?
            .last_applied
            .map(|record| record.sha),
        _ => None,
    };
    if let Err(untrusted) = source.verify(&trust.keys, trust.mode, since.as_ref(), commit)? {
        eprintln!(
            "commit {}: not signed by a trusted key: {} (--verify-commits {})",
            untrusted.commit.short(),
            Esc(&untrusted.refusal.to_string()),
            trust.mode.as_str()
        );
        eprintln!(
            "plan: the agent would reject {} and keep running the last good commit",
            commit.short()
        );
        return Ok(Some(ExitCode::from(1)));
    }
    Ok(None)
}

/// Loads the manifests as the agent would, fetching `url()` sources with its host rules and
/// default budget; `None` when the agent would reject the commit (said on stderr).
fn load(
    scratch: &Path,
    policy: &Policy,
    vars: &manifest::Vars,
    files: &dyn FileSource,
    snapshot: &Snapshot,
) -> anyhow::Result<Option<Manifest>> {
    // Fetched as the agent fetches: the same host rules, the default budget.
    let fetcher = UrlCache::new(scratch, DEFAULT_MAX_URL_BYTES).guarded(
        manifest::UrlHosts::parse(&policy.allow_url_host).map_err(anyhow::Error::msg)?,
        None,
    );
    let options = LoadOptions {
        vars,
        files,
        fetcher: None,
        mode: Mode::Apply,
        max_file_bytes: manifest::DEFAULT_MAX_FILE_BYTES,
        missing_var_hint: MISSING_VAR_HINT,
    };
    Ok(
        match crate::assets::load_fetching_urls(
            &fetcher,
            crate::assets::DEFAULT_URL_BUDGET,
            (snapshot, &[], &manifest::DecodeCache::new(0)),
            &options,
            Some(policy),
        ) {
            Ok(manifest) => Some(manifest),
            Err(diagnostics) => {
                eprint_escaped(&diagnostics.0);
                eprintln!(
                    "plan: {} error(s) in {}; the agent would reject this commit and keep running the last good one",
                    diagnostics.0.len(),
                    snapshot.commit
                );
                None
            }
        },
    )
}

/// What the agent would refuse in `manifest` before anything runs: what the host policy's
/// gate refuses, scopes another source owns, SOPS files its identities cannot open. The exit
/// code when there is any (said on stderr).
fn refusals(
    args: &PlanArgs,
    manifest: &Manifest,
    policy: &Policy,
    owned_by: Option<&super::validate::OwnedBy>,
    snapshot: &Snapshot,
) -> anyhow::Result<Option<ExitCode>> {
    // The gate the agent runs at the sink, on the requests it would send.
    let refused = crate::reconcile::requests::sink_refusals_under(manifest, policy);
    if !refused.is_empty() {
        eprint_escaped(&refused);
        eprintln!(
            "plan: the host policy refuses what {} would send to the engine; the agent would not create it",
            snapshot.commit
        );
        return Ok(Some(ExitCode::from(1)));
    }
    if let Some(owned_by) = owned_by {
        let foreign = crate::sync::foreign_scopes(manifest, &owned_by.name, &owned_by.ownership);
        if !foreign.is_empty() {
            eprint_escaped(&foreign);
            eprintln!(
                "plan: the agent would reject {}: source {:?} may not deploy these scopes",
                snapshot.commit, owned_by.name
            );
            return Ok(Some(ExitCode::from(1)));
        }
    }
    // SOPS env files are opened as the agent would, when given its identities; the values
    // are dropped at once (a plan shows a secret's change by its file's digest only).
    let keyring = args.trust.to_keyring()?;
    if !keyring.is_empty() {
        let refusals = crate::sync::sealed_refusals(manifest, &keyring);
        if !refusals.is_empty() {
            eprint_escaped(&refusals);
            eprintln!(
                "plan: the agent would reject {} and keep running the last good one",
                snapshot.commit
            );
            return Ok(Some(ExitCode::from(1)));
        }
    }
    Ok(None)
}

/// The agent's desired state (as one source: its own resources only) as the plan compares
/// against it: the autoscaler's counts, and each resource's current spec.
fn current_specs(
    store: Option<&Store>,
    one_source: bool,
) -> anyhow::Result<(
    BTreeMap<ResourceKey, usize>,
    BTreeMap<ResourceKey, CurrentSpec>,
)> {
    let desired = match store {
        Some(store) if one_source => {
            let owners = store.sources_of_desired()?;
            store
                .desired_all()?
                .into_iter()
                .filter(|desired| {
                    owners.get(&desired.key).map(String::as_str) == Some(store.source())
                })
                .collect()
        }
        Some(store) => store.desired_all()?,
        None => Vec::new(),
    };
    // The autoscaler's counts: a commit that keeps `autoscale` keeps them.
    let scaled: BTreeMap<ResourceKey, usize> = crate::model::map_of(
        desired
            .iter()
            .filter_map(|desired| Some((desired.key.clone(), desired.replicas_override?))),
    );
    let current: BTreeMap<ResourceKey, CurrentSpec> =
        crate::model::map_of(desired.into_iter().map(|desired| {
            let current = CurrentSpec::stored(desired.spec, desired.spec_json);
            (desired.key, current)
        }));
    Ok((scaled, current))
}

/// Under Swarm, the containers by resource, and a note when the engine did not answer.
type ActualState = (bool, BTreeMap<ResourceKey, Vec<Container>>, Option<String>);

/// Whether the agent runs under Swarm (`--runtime`, else what it recorded), and its
/// containers on this engine: none under Swarm, or none with a note when the engine did not
/// answer.
fn actual_state(args: &PlanArgs, store: Option<&Store>) -> anyhow::Result<ActualState> {
    let recorded = match store {
        Some(store) => store.meta(crate::store::META_RUNTIME)?,
        None => None,
    };
    let swarm = args
        .runtime
        .unwrap_or(if recorded.as_deref() == Some("swarm") {
            Engine::Swarm
        } else {
            Engine::Docker
        })
        == Engine::Swarm;
    let actual = match store {
        // Under Swarm the replicas are tasks of services, not containers of this engine.
        _ if swarm => Ok(BTreeMap::new()),
        Some(store) => actual_containers(&store.agent_id_read_only()?),
        None => Ok(BTreeMap::new()),
    };
    let (actual, engine_note) = match actual {
        Ok(actual) => (actual, None),
        Err(error) => (
            BTreeMap::new(),
            Some(format!(
                "the Docker engine did not answer ({error}); planned against the agent's desired state only"
            )),
        ),
    };
    Ok((swarm, actual, engine_note))
}

/// The snapshot to plan and the files `file()` may read beside it.
/// The policy flags or file when given, else the agent's recorded policy, else the default.
/// Prints each problem on its own line of stderr, data from the repo escaped.
fn eprint_escaped(problems: &[impl std::fmt::Display]) {
    for problem in problems {
        eprintln!("{}", escape(&problem.to_string()));
    }
}

fn host_policy(args: &PlanArgs, store: Option<&Store>, data_dir: &Path) -> anyhow::Result<Policy> {
    if args.policy.given() {
        return args.policy.to_policy_for(data_dir);
    }
    let recorded = match store {
        Some(store) => store.meta(crate::sync::META_HOST_POLICY)?,
        None => None,
    };
    let mut policy = match recorded {
        Some(json) => serde_json::from_str(&json)
            .context("the host policy recorded in state.db is not readable")?,
        None => Policy::default(),
    };
    policy.data_dir = Some(absolute_text(data_dir));
    Ok(policy)
}

/// `--host` when given, else the host the agent recorded, else the machine's.
fn plan_hosts(args: &PlanArgs, store: Option<&Store>) -> anyhow::Result<HostSelection> {
    if !args.hosts.given()
        && let Some(store) = store
        && let Some(recorded) = store.host_selection()?
    {
        return Ok(recorded);
    }
    args.hosts.to_selection(None)
}

/// What `plan` reads: the snapshot of the planned source (its manifests under `--path`),
/// its files, its trigger files and, for a git revision, the source and commit.
struct Read {
    snapshot: Snapshot,
    files: Box<dyn FileSource>,
    trigger_files: crate::git::TriggerFiles,
    git: Option<(Source, CommitSha)>,
}

fn read_source(args: &PlanArgs, scratch: &Path, hosts: &HostSelection) -> anyhow::Result<Read> {
    let dir = Path::new(&args.repo);
    if args.rev.is_none() && dir.is_dir() {
        let mut snapshot = read_workdir(dir, &args.paths)
            .with_context(|| format!("cannot read {}", dir.display()))?;
        snapshot.keep_for(hosts, &watched_paths(args));
        let trigger_files = read_workdir_triggers(dir)?;
        return Ok(Read {
            snapshot,
            files: Box::new(WorkdirFiles::new(dir)),
            trigger_files,
            git: None,
        });
    }
    let rev = args.rev.clone().unwrap_or_else(|| "main".to_owned());
    let source = Source::new(
        SourceOptions {
            url: args.repo.clone(),
            branch: rev.clone(),
            paths: args.paths.clone(),
            token_file: None,
            ..Default::default()
        },
        scratch,
    )
    .selecting(hosts.clone());
    let commit = source
        .fetch_rev(&rev, &AtomicBool::new(false))
        .with_context(|| format!("cannot fetch {rev} from {}", args.repo))?;
    let snapshot = source.read_snapshot(&commit)?;
    let files = source.files_at(&commit)?;
    let trigger_files = source.read_trigger_files(&commit)?;
    Ok(Read {
        snapshot,
        files: Box::new(files),
        trigger_files,
        git: Some((source, commit)),
    })
}

/// `file()` reads for manifests of several commits: each at its manifest's source.
struct PlanFiles {
    default: Box<dyn FileSource>,
    by_manifest: BTreeMap<String, Box<dyn FileSource>>,
}

impl FileSource for PlanFiles {
    fn read(&self, path: &str, max_bytes: u64) -> FileRead {
        self.default.read(path, max_bytes)
    }

    fn read_for(&self, manifest_path: &str, path: &str, max_bytes: u64) -> FileRead {
        self.by_manifest
            .get(manifest_path)
            .unwrap_or(&self.default)
            .read(path, max_bytes)
    }
}

type Planned = (Snapshot, Box<dyn FileSource>, Vec<TriggerPlanView>);

/// Without trigger files, the read source as it is. With them, what the agent would do:
/// the firing decision against the triggers it remembers, and desired state made of each
/// trigger's file at the commit it would have fired at (older commits read from the agent's
/// mirror). `Err` with the trigger files' problems.
fn with_triggers(
    args: &PlanArgs,
    read: Read,
    store: Option<&Store>,
    data_dir: &Path,
    hosts: &HostSelection,
) -> anyhow::Result<Result<Planned, Vec<String>>> {
    let (trigger_files, refused) = &read.trigger_files;
    if trigger_files.is_empty() && refused.is_empty() {
        return Ok(Ok((read.snapshot, read.files, Vec::new())));
    }
    let mut problems: Vec<String> = refused
        .iter()
        .map(|(path, why)| format!("{path}:1:1: {why}"))
        .collect();
    let parsed = match triggers::parse_all(trigger_files) {
        Ok(parsed) => parsed,
        Err(errors) => {
            problems.extend(errors.iter().map(ToString::to_string));
            return Ok(Err(problems));
        }
    };
    if !problems.is_empty() {
        return Ok(Err(problems));
    }
    let previous = match store {
        Some(store) => store.trigger_states()?,
        None => Vec::new(),
    };
    let recorded_branch = match store {
        Some(store) => store.meta(&store.source_key(crate::agent::META_BRANCH))?,
        None => None,
    };
    let branch = args
        .branch
        .clone()
        .or(recorded_branch)
        .unwrap_or_else(|| "main".to_owned());
    let commit = read.snapshot.commit.clone();
    let base = match store {
        Some(store) => store.trigger_base()?,
        None => None,
    };
    let changed = match (&read.git, &base) {
        (Some((source, at)), Some(base)) => source.changed_paths(base, at)?,
        _ => None,
    };
    let watched = watched_paths(args);
    let decision = triggers::decide(
        &parsed,
        &previous,
        &triggers::Situation {
            branch: &branch,
            commit: &commit,
            changed: changed.as_deref(),
            watched: &watched,
            hosts,
            now: crate::store::now_unix(),
        },
    );
    let mirror = data_dir.join("repo.git");
    let agent_mirror = mirror.join("HEAD").exists().then(|| {
        Source::new(
            SourceOptions {
                url: mirror.display().to_string(),
                branch: branch.clone(),
                paths: Vec::new(),
                token_file: None,
                ..Default::default()
            },
            data_dir,
        )
    });
    let mut files = Vec::new();
    let mut by_manifest: BTreeMap<String, Box<dyn FileSource>> = BTreeMap::new();
    for (file, at, trigger_path) in &decision.files {
        let located =
            |message: String| match parsed.iter().find(|trigger| &trigger.path == trigger_path) {
                Some(trigger) => trigger.at_apply_file(message).to_string(),
                None => format!("{trigger_path}:1:1: {message}"),
            };
        let (contents, source): (FileRead, Option<Box<dyn FileSource>>) = if *at == commit {
            (
                read.files.read(file, crate::model::MAX_MANIFEST_BYTES),
                None,
            )
        } else {
            match &agent_mirror {
                Some(mirror) => {
                    let at_commit = mirror.files_at(at).with_context(|| {
                        format!("cannot read commit {} from the agent's mirror", at.short())
                    })?;
                    (
                        at_commit.read(file, crate::model::MAX_MANIFEST_BYTES),
                        Some(Box::new(at_commit)),
                    )
                }
                None => {
                    problems.push(located(format!(
                        "{file} is deployed at commit {} but the agent's mirror ({}) is not there to read it",
                        at.short(),
                        mirror.display()
                    )));
                    continue;
                }
            }
        };
        match contents {
            FileRead::File(contents) => files.push(SourceFile {
                path: file.clone(),
                contents,
            }),
            FileRead::Missing => problems.push(located(format!(
                "apply.file {file} does not exist at {}",
                at.short()
            ))),
            FileRead::TooLarge(size) => problems.push(located(format!(
                "apply.file {file} is {size} at {}; at most {} bytes of a manifest are read",
                at.short(),
                crate::model::MAX_MANIFEST_BYTES
            ))),
            _ => problems.push(located(format!(
                "apply.file {file} is not a regular file at {}",
                at.short()
            ))),
        }
        if let Some(source) = source {
            by_manifest.insert(file.clone(), source);
        }
    }
    if !problems.is_empty() {
        return Ok(Err(problems));
    }
    let views = decision
        .outcomes
        .iter()
        .map(|outcome| trigger_plan_view(outcome, &decision, &commit))
        .collect();
    let snapshot = Snapshot {
        commit: commit.clone(),
        files,
        refused: Vec::new(),
    };
    let files = PlanFiles {
        default: read.files,
        by_manifest,
    };
    Ok(Ok((snapshot, Box::new(files), views)))
}

/// The `--path` prefixes, normalised as the agent does.
fn watched_paths(args: &PlanArgs) -> Vec<String> {
    args.paths
        .iter()
        .map(|path| path.trim_matches('/').trim_start_matches("./").to_owned())
        .filter(|path| !path.is_empty() && path != ".")
        .collect()
}

/// One trigger's verdict as `plan` shows it.
#[derive(Debug, Serialize)]
struct TriggerPlanView {
    name: String,
    file: String,
    /// `fires`, `held`, `approved`, `skipped` or `inactive`.
    verdict: &'static str,
    /// What it contributes to desired state, as `FILE@COMMIT`, if anything.
    #[serde(skip_serializing_if = "Option::is_none")]
    applies: Option<String>,
    /// A held commit that still waits for `voodu-agent approve`.
    #[serde(skip_serializing_if = "Option::is_none")]
    held: Option<String>,
    detail: String,
}

fn trigger_plan_view(
    outcome: &triggers::Outcome,
    decision: &triggers::Decision,
    commit: &CommitSha,
) -> TriggerPlanView {
    use triggers::Verdict;
    let applies = decision
        .states
        .iter()
        .find(|state| state.path == outcome.path)
        .and_then(|state| state.applied.as_ref())
        .map(|applied| format!("{}@{}", applied.file, applied.commit.short()));
    let (verdict, detail) = match &outcome.verdict {
        Verdict::Fired { first: true } => (
            "fires",
            "fires: new to the agent, or the changed paths are unknown".to_owned(),
        ),
        Verdict::Fired { first: false } => {
            ("fires", "fires: the commit touches its paths".to_owned())
        }
        Verdict::Held { .. } => (
            "held",
            format!(
                "HELD (deploy: manual): nothing of it changes until `voodu-agent approve {}`",
                commit.short()
            ),
        ),
        Verdict::Approved { commit, .. } => (
            "approved",
            format!("an approved hold: applies its file at {}", commit.short()),
        ),
        Verdict::Skipped => (
            "skipped",
            "skipped: the commit touches none of its paths; it keeps what it applied".to_owned(),
        ),
        Verdict::Inactive(why) => ("inactive", format!("never fires here: {why}")),
    };
    TriggerPlanView {
        name: outcome.name.clone(),
        file: outcome.path.clone(),
        verdict,
        applies,
        held: outcome.held.as_ref().map(ToString::to_string),
        detail,
    }
}

/// The agent's containers, by resource.
fn actual_containers(agent_id: &str) -> anyhow::Result<BTreeMap<ResourceKey, Vec<Container>>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let docker =
            tokio::time::timeout(std::time::Duration::from_secs(3), DockerRuntime::connect())
                .await
                .map_err(|_| anyhow::anyhow!("timed out"))??;
        let containers = docker.list(&[(labels::AGENT, agent_id)]).await?;
        let mut by_key: BTreeMap<ResourceKey, Vec<Container>> = BTreeMap::new();
        for container in containers {
            let kind = container.label(labels::KIND).and_then(Kind::parse);
            if container
                .label(labels::ROLE)
                .is_some_and(|role| role != kind.map_or("", Kind::as_str))
            {
                // Init and release containers belong to a resource but are not its replicas.
                continue;
            }
            if let (Some(kind), Some(scope), Some(name)) = (
                kind,
                container.label(labels::SCOPE),
                container.label(labels::NAME),
            ) {
                by_key
                    .entry(ResourceKey::new(kind, scope, name))
                    .or_default()
                    .push(container);
            }
        }
        Ok(by_key)
    })
}

/// `plan --json`, and the text output built from the same data.
#[derive(Debug, Serialize)]
struct PlanView {
    commit: String,
    /// `docker` or `swarm`.
    runtime: &'static str,
    /// Under Swarm: how many resources map fully, with notes, or not at all.
    #[serde(skip_serializing_if = "Option::is_none")]
    swarm: Option<SwarmSummary>,
    /// The fleet host planned for (`--host`); `None`: every host's manifests.
    host: Option<String>,
    host_labels: Vec<String>,
    data_dir: PathBuf,
    /// False when the data dir holds no agent state: everything is new.
    agent_state: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
    /// With trigger files: what each trigger does for this commit.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    triggers: Vec<TriggerPlanView>,
    resources: Vec<ResourceView>,
    warnings: Vec<String>,
    summary: BTreeMap<&'static str, usize>,
}

/// How a commit's resources map to Docker Swarm.
#[derive(Debug, Serialize)]
struct SwarmSummary {
    maps_fully: usize,
    maps_with_notes: usize,
    does_not_map: usize,
}

#[derive(Debug, Serialize)]
struct ResourceView {
    kind: String,
    scope: String,
    name: String,
    action: &'static str,
    /// One line: what happens and why.
    detail: String,
    /// Why applying fails (action `fail`): the message the resource's status will carry.
    #[serde(skip_serializing_if = "Option::is_none")]
    failure: Option<String>,
    changes: Vec<ChangeView>,
    steps: Vec<String>,
    /// Under Swarm: how it runs differently there.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    notes: Vec<String>,
    /// Start-up order: what this commit also creates or replaces, which it waits for.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    waits_for: Vec<String>,
}

#[derive(Debug, Serialize)]
struct ChangeView {
    field: String,
    hashed: bool,
    before: Option<String>,
    after: Option<String>,
}

impl PlanView {
    fn new(
        snapshot: &Snapshot,
        data_dir: &Path,
        agent_state: bool,
        note: Option<String>,
        manifest: &Manifest,
        plans: &[ResourcePlan],
    ) -> PlanView {
        let next: BTreeMap<&ResourceKey, &Spec> = crate::model::map_of(
            manifest
                .resources
                .iter()
                .map(|resource| (&resource.key, &resource.spec)),
        );
        let mut summary: BTreeMap<&'static str, usize> = [
            Action::Create,
            Action::Update,
            Action::Replace,
            Action::Delete,
            Action::Unchanged,
            Action::Fail,
        ]
        .into_iter()
        .map(|action| (action.as_str(), 0))
        .collect();
        let rolls = |action: Action| matches!(action, Action::Create | Action::Replace);
        let rolling: BTreeMap<&ResourceKey, bool> =
            crate::model::map_of(plans.iter().map(|plan| (&plan.key, rolls(plan.action))));
        let waits_for = |plan: &ResourcePlan| -> Vec<String> {
            let dependencies: Vec<(ResourceKey, bool)> = next
                .get(&plan.key)
                .and_then(|spec| spec.container()?.depends_on.as_ref())
                .map(|depends_on| depends_on.resource_keys(&plan.key.scope))
                .unwrap_or_default()
                .into_iter()
                .map(|key| {
                    let rolls = rolling.get(&key).copied().unwrap_or(false);
                    (key, rolls)
                })
                .collect();
            crate::reconcile::plan::depends::waits_in_plan(rolls(plan.action), &dependencies)
                .iter()
                .map(ToString::to_string)
                .collect()
        };
        let resources = plans
            .iter()
            .map(|plan| {
                *summary.entry(plan.action.as_str()).or_default() += 1;
                ResourceView {
                    kind: plan.key.kind.to_string(),
                    scope: plan.key.scope.clone(),
                    name: plan.key.name.clone(),
                    action: plan.action.as_str(),
                    detail: detail(plan, next.get(&plan.key).copied()),
                    failure: plan.failure.clone(),
                    changes: plan
                        .changes
                        .iter()
                        .map(|change| ChangeView {
                            field: change.field.clone(),
                            hashed: change.hashed,
                            before: change.before.clone(),
                            after: change.after.clone(),
                        })
                        .collect(),
                    notes: Vec::new(),
                    waits_for: waits_for(plan),
                    steps: plan
                        .steps
                        .iter()
                        .map(step_text)
                        .chain(
                            plan.pod_steps
                                .iter()
                                .map(|step| pod_step_text(&plan.key, step)),
                        )
                        .collect(),
                }
            })
            .collect();
        PlanView {
            commit: snapshot.commit.to_string(),
            runtime: "docker",
            swarm: None,
            host: None,
            host_labels: Vec::new(),
            data_dir: data_dir.to_owned(),
            agent_state,
            note,
            triggers: Vec::new(),
            resources,
            warnings: manifest.warnings.iter().map(ToString::to_string).collect(),
            summary,
        }
    }

    /// Marks what Swarm cannot run as failing (the handlers refuse it with this reason) and
    /// adds how the rest runs there.
    fn under_swarm(&mut self, manifest: &Manifest) {
        self.runtime = "swarm";
        let mut summary = SwarmSummary {
            maps_fully: 0,
            maps_with_notes: 0,
            does_not_map: 0,
        };
        for resource in &mut self.resources {
            let Some(next) = manifest.resources.iter().find(|next| {
                next.key.kind.as_str() == resource.kind
                    && next.key.scope == resource.scope
                    && next.key.name == resource.name
            }) else {
                continue;
            };
            let gaps = swarm_gaps(&next.spec);
            resource.notes = swarm_notes(&next.spec);
            if gaps.is_empty() {
                if resource.notes.is_empty() {
                    summary.maps_fully += 1;
                } else {
                    summary.maps_with_notes += 1;
                }
                continue;
            }
            summary.does_not_map += 1;
            let failure = format!("cannot run under Docker Swarm: {}", gaps.join("; "));
            if resource.action != "fail" {
                *self.summary.entry(resource.action).or_default() -= 1;
                *self.summary.entry("fail").or_default() += 1;
                resource.action = "fail";
            }
            resource.detail = format!(
                "fails when applied, before anything is touched (running ones are kept): {failure}"
            );
            resource.failure = Some(failure);
        }
        self.swarm = Some(summary);
    }

    fn text(&self) -> String {
        let mut out = String::new();
        for warning in &self.warnings {
            out.push_str(&format!("warning: {}\n", escape(&warning.to_string())));
        }
        if !self.agent_state {
            out.push_str(&format!(
                "note: no agent state in {}; everything is planned as new\n",
                self.data_dir.display()
            ));
        }
        if let Some(note) = &self.note {
            out.push_str(&format!("note: {}\n", Esc(note)));
        }
        if !self.triggers.is_empty() {
            out.push_str("Triggers (.voodu/*.yml):\n");
            for trigger in &self.triggers {
                let applies = trigger
                    .applies
                    .as_deref()
                    .map_or_else(String::new, |applies| {
                        format!(" [applies {}]", Esc(applies))
                    });
                let held = trigger.held.as_deref().map_or_else(String::new, |held| {
                    format!(
                        " [holds {}: `voodu-agent approve {}`]",
                        Esc(&held[..held.len().min(12)]),
                        Esc(held)
                    )
                });
                out.push_str(&format!(
                    "  {:<16} {}{applies}{held}\n",
                    Esc(&trigger.name),
                    Esc(&trigger.detail)
                ));
            }
        }
        let on = match &self.host {
            Some(host) if self.host_labels.is_empty() => format!(" on host {}", Esc(host)),
            Some(host) => format!(
                " on host {} (labels {})",
                Esc(host),
                Esc(&self.host_labels.join(", "))
            ),
            None => String::new(),
        };
        let engine = if self.swarm.is_some() {
            " (Docker Swarm)"
        } else {
            ""
        };
        out.push_str(&format!("Plan for {}{on}{engine}:\n", Esc(&self.commit)));
        let width = self
            .resources
            .iter()
            .map(|resource| escape(&key_text(resource)).chars().count())
            .max()
            .unwrap_or(0);
        for resource in &self.resources {
            let sign = match resource.action {
                "create" => "+",
                "replace" => "-/+",
                "update" => "~",
                "delete" => "-",
                "fail" => "!",
                _ => "=",
            };
            out.push_str(&format!(
                "  {sign:>3} {:width$}  {}: {}\n",
                Esc(&key_text(resource)),
                resource.action,
                Esc(&resource.detail)
            ));
            for change in &resource.changes {
                let arrow = match (&change.before, &change.after) {
                    (Some(before), Some(after)) => format!("{before} → {after}"),
                    (None, Some(after)) => format!("(unset) → {after}"),
                    (Some(before), None) => format!("{before} → (unset)"),
                    (None, None) => String::new(),
                };
                let mark = if change.hashed { " [replaces]" } else { "" };
                out.push_str(&format!(
                    "        {}: {}{mark}\n",
                    Esc(&change.field),
                    Esc(&arrow)
                ));
            }
            for note in &resource.notes {
                out.push_str(&format!("        swarm: {}\n", Esc(note)));
            }
            if !resource.waits_for.is_empty() {
                out.push_str(&format!(
                    "        waits for: {} (Ready first)\n",
                    Esc(&resource.waits_for.join(", "))
                ));
            }
        }
        let count = |action: &str| self.summary.get(action).copied().unwrap_or(0);
        let failing = match count("fail") {
            0 => String::new(),
            n => format!(", {n} failing when applied"),
        };
        out.push_str(&format!(
            "Plan: {} to create, {} to update, {} to replace, {} to delete, {} unchanged{failing}.\n",
            count("create"),
            count("update"),
            count("replace"),
            count("delete"),
            count("unchanged")
        ));
        if let Some(swarm) = &self.swarm {
            out.push_str(&format!(
                "Under Docker Swarm: {} map fully, {} map with notes, {} do not map.\n",
                swarm.maps_fully, swarm.maps_with_notes, swarm.does_not_map
            ));
        }
        out
    }
}

fn key_text(resource: &ResourceView) -> String {
    if resource.scope.is_empty() {
        format!("{}/{}", resource.kind, resource.name)
    } else {
        format!("{}/{}/{}", resource.kind, resource.scope, resource.name)
    }
}

fn step_text(step: &Step) -> String {
    match step {
        Step::Create => "create a replica".to_owned(),
        Step::Start { name, .. } => format!("start {name}"),
        Step::Replace { name, .. } => format!("replace {name}"),
        Step::Remove { name, .. } => format!("remove {name}"),
        Step::Retire { name, .. } => format!("retire {name} (its successor runs)"),
    }
}

fn pod_step_text(key: &ResourceKey, step: &StatefulStep) -> String {
    match step {
        StatefulStep::Create { ordinal } => {
            format!("create pod {ordinal} ({}.{ordinal})", key.app_id())
        }
        StatefulStep::Start { ordinal, name, .. } => format!("start pod {ordinal} ({name})"),
        StatefulStep::Replace { ordinal, name, .. } => {
            format!("replace pod {ordinal} ({name}), same name and volumes")
        }
        StatefulStep::Remove {
            ordinal: Some(ordinal),
            name,
            ..
        } => format!("remove pod {ordinal} ({name}), volumes kept"),
        StatefulStep::Remove {
            ordinal: None,
            name,
            ..
        } => format!("remove {name} (no ordinal)"),
    }
}

/// The ordinals of a statefulset's steps of one sort, in execution order (`2, 1, 0`).
fn ordinals(plan: &ResourcePlan, wanted: fn(&StatefulStep) -> bool) -> String {
    let ordinals: Vec<String> = plan
        .pod_steps
        .iter()
        .filter(|step| wanted(step))
        .filter_map(|step| step.ordinal().map(|ordinal| ordinal.to_string()))
        .collect();
    ordinals.join(", ")
}

/// The fields a plan changes, in order; only those in the spec hash when `hashed_only`.
fn changed_fields(plan: &ResourcePlan, hashed_only: bool) -> Vec<&str> {
    plan.changes
        .iter()
        .filter(|change| change.hashed || !hashed_only)
        .map(|change| change.field.as_str())
        .collect()
}

/// One line for a resource: what happens and why.
fn detail(plan: &ResourcePlan, next: Option<&Spec>) -> String {
    if let Some(failure) = &plan.failure {
        return format!(
            "fails when applied, before any container is touched (running ones are kept): {failure}"
        );
    }
    if plan.key.kind == Kind::Statefulset {
        return statefulset_detail(plan, next);
    }
    let count = |wanted: fn(&Step) -> bool| plan.steps.iter().filter(|step| wanted(step)).count();
    let creates = count(|step| matches!(step, Step::Create));
    let replaces = count(|step| matches!(step, Step::Replace { .. }));
    let removes = count(|step| matches!(step, Step::Remove { .. } | Step::Retire { .. }));
    let starts = count(|step| matches!(step, Step::Start { .. }));
    let mut parts = Vec::new();
    match plan.action {
        Action::Create => parts.push(describe(next)),
        Action::Delete => parts.push(if removes > 0 {
            format!("{removes} container(s) removed")
        } else {
            "removed from the host".to_owned()
        }),
        Action::Replace => {
            let why = changed_fields(plan, true);
            parts.push(if why.is_empty() {
                "running containers have an outdated spec hash".to_owned()
            } else {
                format!("{} changed", why.join(", "))
            });
            match plan.key.kind {
                Kind::Job => parts.push("the job runs again".to_owned()),
                Kind::Cronjob => parts.push(cronjob_change(plan, next)),
                _ => {}
            }
            match next.and_then(Spec::strategy) {
                Some(strategy) if plan.key.kind == Kind::Deployment => {
                    parts.push(format!("rolled out {}", strategy.describe()));
                }
                _ if replaces > 0 => {
                    parts.push(format!("{replaces} replica(s) replaced one at a time"));
                }
                _ => {}
            }
        }
        Action::Update => {
            let fields = changed_fields(plan, false);
            if !fields.is_empty() {
                parts.push(format!(
                    "{} changed (no container is replaced)",
                    fields.join(", ")
                ));
            }
        }
        Action::Unchanged => parts.push("no change".to_owned()),
        Action::Fail => {}
    }
    if plan.action != Action::Create && plan.action != Action::Delete {
        if creates > 0 {
            parts.push(format!("{creates} replica(s) created"));
        }
        if removes > 0 {
            parts.push(format!("{removes} replica(s) removed"));
        }
        if starts > 0 {
            parts.push(format!("{starts} stopped replica(s) started"));
        }
    }
    parts.join("; ")
}

/// What a changed cronjob hash means: later ticks run the new job, a new schedule starts from
/// now (no tick fires for the change itself), suspending stops the ticks.
fn cronjob_change(plan: &ResourcePlan, next: Option<&Spec>) -> String {
    let changed = |field: &str| plan.changes.iter().any(|change| change.field == field);
    let mut effects = Vec::new();
    if changed("schedule") || changed("timezone") {
        effects.push("the schedule restarts from now");
    }
    if changed("suspend") {
        effects.push(match next {
            Some(Spec::Cronjob(spec)) if spec.suspend => "no tick runs while suspended",
            _ => "ticks resume (missed ones are not caught up)",
        });
    }
    if effects.is_empty() || changed("job") || changed("concurrency_policy") {
        effects.push("later ticks run the new spec");
    }
    effects.join(", ")
}

/// `detail` for a statefulset: its pod steps by ordinal, in the order they run.
fn statefulset_detail(plan: &ResourcePlan, next: Option<&Spec>) -> String {
    let creates = ordinals(plan, |step| matches!(step, StatefulStep::Create { .. }));
    let starts = ordinals(plan, |step| matches!(step, StatefulStep::Start { .. }));
    let replaces = ordinals(plan, |step| matches!(step, StatefulStep::Replace { .. }));
    let removes = ordinals(plan, |step| matches!(step, StatefulStep::Remove { .. }));
    let mut parts = Vec::new();
    match plan.action {
        Action::Create => parts.push(describe(next)),
        Action::Delete => parts.push(if removes.is_empty() {
            "removed from the host; its volumes are kept".to_owned()
        } else {
            format!("pod(s) {removes} removed in that order; volumes kept")
        }),
        Action::Replace => {
            let why = changed_fields(plan, true);
            parts.push(if why.is_empty() {
                "running pods have an outdated spec hash".to_owned()
            } else {
                format!("{} changed", why.join(", "))
            });
        }
        Action::Update => {
            let fields = changed_fields(plan, false);
            if !fields.is_empty() {
                parts.push(format!(
                    "{} changed (no pod is replaced)",
                    fields.join(", ")
                ));
            }
        }
        Action::Unchanged => parts.push("no change".to_owned()),
        Action::Fail => {}
    }
    if plan.action != Action::Create && plan.action != Action::Delete {
        if !removes.is_empty() {
            parts.push(format!("pod(s) {removes} removed (volumes kept)"));
        }
        if !creates.is_empty() {
            parts.push(format!("pod(s) {creates} created"));
        }
        if !starts.is_empty() {
            parts.push(format!("stopped pod(s) {starts} started"));
        }
        if !replaces.is_empty() {
            parts.push(format!("pod(s) {replaces} replaced one at a time"));
        }
    }
    parts.join("; ")
}

fn describe(spec: Option<&Spec>) -> String {
    spec.map(Spec::summary).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::spec::{CronjobSpec, JobSpec};
    use crate::reconcile::plan::plan_resource;

    fn job(image: &str) -> JobSpec {
        let mut spec = JobSpec::default();
        spec.container.image = image.to_owned();
        spec
    }

    fn check(kind: Kind, current: &Spec, next: &Spec, expected: &str) {
        let key = ResourceKey::new(kind, "ops", "x");
        let plan = plan_resource(&key, Some(current), Some(next), None, &[], None);
        assert_eq!(plan.action, Action::Replace, "{expected}");
        assert_eq!(detail(&plan, Some(next)), expected);
    }

    #[test]
    fn a_changed_job_runs_again_and_a_changed_cronjob_says_what_changes() {
        check(
            Kind::Job,
            &Spec::Job(job("a:1")),
            &Spec::Job(job("a:2")),
            "image changed; the job runs again",
        );
        let cron = CronjobSpec {
            schedule: "* * * * *".into(),
            job: job("a:1"),
            ..CronjobSpec::default()
        };
        let rescheduled = CronjobSpec {
            schedule: "0 * * * *".into(),
            ..cron.clone()
        };
        check(
            Kind::Cronjob,
            &Spec::Cronjob(cron.clone()),
            &Spec::Cronjob(rescheduled),
            "schedule changed; the schedule restarts from now",
        );
        let new_image = CronjobSpec {
            job: job("a:2"),
            ..cron.clone()
        };
        check(
            Kind::Cronjob,
            &Spec::Cronjob(cron.clone()),
            &Spec::Cronjob(new_image),
            "job changed; later ticks run the new spec",
        );
        let suspended = CronjobSpec {
            suspend: true,
            ..cron.clone()
        };
        check(
            Kind::Cronjob,
            &Spec::Cronjob(cron),
            &Spec::Cronjob(suspended),
            "suspend changed; no tick runs while suspended",
        );
    }
}
