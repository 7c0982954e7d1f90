//! `voodu-agent validate [DIR]`: check a working directory of manifests without git or an
//! agent: every problem as `path:line:col: message`, exit 0 when the set would be accepted.
//!
//! With trigger files (`.voodu/**/*.yml`), they are checked too and the manifests they name
//! are the ones validated (every trigger's, whatever branch it fires on).
//!
//! In a fleet repository (`hosts/<name>/`, `labels/<label>/`), each host directory and each
//! label directory is validated with the shared manifests in turn (one resource may be
//! declared for several hosts), or the one host `--host` names.
//!
//! A static check: `url()` sources are checked for form but not fetched, and a `file()` or
//! `env_file` that is missing is a warning (the agent would reject such a commit). `${VAR}`
//! values come from `--var` / `--var-file`, standing in for the config buckets the agent reads.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;

use crate::git::{WorkdirFiles, read_workdir, read_workdir_triggers};
use crate::manifest::{self, Diagnostic, LoadOptions, Mode, Policy, Vars};
use crate::model::hosts::{self, Addressed};
use crate::model::text::escape;
use crate::model::{FileRead, FileSource as _, HostSelection};

#[derive(Debug, Args)]
pub(super) struct ValidateArgs {
    /// Directory holding the manifests (searched recursively, `.git` skipped).
    #[arg(default_value = ".", value_name = "DIR")]
    dir: PathBuf,
    #[command(flatten)]
    vars: VarArgs,
    /// Only read manifests under this directory of DIR (repeatable), as the agent's --path.
    #[arg(long = "path", value_name = "DIR")]
    paths: Vec<String>,
    /// Without any of these, only the format is checked; with one, also the host policy.
    #[command(flatten)]
    policy: PolicyArgs,
    /// Validate what this fleet host applies: the shared manifests and its own
    /// `hosts/NAME/` (and `labels/LABEL/`). Default: each host directory and each label
    /// directory in turn, with the shared manifests (or everything, when there are none).
    #[command(flatten)]
    hosts: super::fleet::HostArgs,
    /// Also check that every resource can run under this runtime: `swarm` reports what
    /// Docker Swarm cannot run as errors (with the reason) and how the rest runs there as
    /// warnings. Default: docker (no such check).
    #[arg(long, value_name = "docker|swarm", default_value = "docker", value_parser = parse_runtime)]
    runtime: crate::reconcile::Engine,
    /// Validate as one source of an agent following several repositories: its resources
    /// must be in the scopes it owns (README "Several repositories").
    #[command(flatten)]
    source: SourceArgs,
    /// Print `{"ok", "files", "resources": {KIND: N}, "errors": [...], "warnings": [...]}`,
    /// each problem with its `path`, `line`, `col` and `message`; with several fleet hosts,
    /// `{"ok", "audiences": [{"audience", ...that document}]}`.
    #[arg(long)]
    json: bool,
}

/// Which manifests one validation reads.
#[derive(Debug, Clone)]
pub(super) enum Audience {
    /// Every manifest (a repository without `hosts/` or `labels/` directories).
    All,
    /// What one host applies (`--host`, `--host-label`).
    Selection(HostSelection),
    /// The shared manifests and one `hosts/<name>/` or `labels/<name>/` directory.
    Only { dir: &'static str, name: String },
}

impl Audience {
    fn keeps(&self, path: &str, watched: &[String]) -> bool {
        match self {
            Audience::All => true,
            Audience::Selection(selection) => selection.selects(path, watched),
            Audience::Only { dir, name } => match hosts::addressed(path, watched) {
                Addressed::Shared => true,
                Addressed::Host(host) => *dir == hosts::HOSTS_DIR && host == name,
                Addressed::Label(label) => *dir == hosts::LABELS_DIR && label == name,
            },
        }
    }

    /// How the report names it, when there are several.
    fn describe(&self) -> String {
        match self {
            Audience::All => "every manifest".to_owned(),
            Audience::Selection(selection) => selection.describe(),
            Audience::Only { dir, name } => format!("{dir}/{name}/ with the shared manifests"),
        }
    }
}

/// The audiences a repository without `--host` is validated for: one per `hosts/<name>/`
/// and `labels/<name>/` directory among `paths` (the trigger files' `apply.file`s included),
/// else everything at once.
fn audiences(paths: &[String], watched: &[String]) -> Vec<Audience> {
    let mut found = std::collections::BTreeSet::new();
    for path in paths {
        match hosts::addressed(path, watched) {
            Addressed::Shared => {}
            Addressed::Host(name) => {
                found.insert((hosts::HOSTS_DIR, name.to_owned()));
            }
            Addressed::Label(name) => {
                found.insert((hosts::LABELS_DIR, name.to_owned()));
            }
        }
    }
    if found.is_empty() {
        return vec![Audience::All];
    }
    found
        .into_iter()
        .map(|(dir, name)| Audience::Only { dir, name })
        .collect()
}

/// The `--json` document of one validation.
fn outcome_json(outcome: &Outcome) -> serde_json::Value {
    let problem = |diagnostic: &Diagnostic| {
        serde_json::json!({
            "path": diagnostic.path,
            "line": diagnostic.line,
            "col": diagnostic.col,
            "message": diagnostic.message,
        })
    };
    serde_json::json!({
        "ok": outcome.errors.is_empty(),
        "files": outcome.n_files,
        "resources": outcome.kinds,
        "errors": outcome.errors.iter().map(problem).collect::<Vec<_>>(),
        "warnings": outcome.warnings.iter().map(problem).collect::<Vec<_>>(),
    })
}

/// `--runtime`: `docker` or `swarm` (`validate`, `plan` and `run` share it).
pub(super) fn parse_runtime(text: &str) -> Result<crate::reconcile::Engine, String> {
    match text {
        "docker" => Ok(crate::reconcile::Engine::Docker),
        "swarm" => Ok(crate::reconcile::Engine::Swarm),
        _ => Err(format!("{text:?} is not a runtime: `docker` or `swarm`")),
    }
}

/// The host policy (see README "Host policy"): a policy file and/or flags, which add to it.
/// Used by the agent, `plan` and `validate`.
#[derive(Debug, Args, Default)]
#[command(next_help_heading = "Host policy")]
pub(super) struct PolicyArgs {
    /// Host policy file (JSON, the flags' names as keys, e.g. {"allow-cap": ["NET_ADMIN"]}),
    /// or `default` for the default-deny policy; the flags below add to it.
    #[arg(long, env = "VOODU_POLICY", value_name = "FILE|default", value_hint = clap::ValueHint::FilePath)]
    policy: Option<PathBuf>,
    /// Allow `--privileged` containers.
    #[arg(long, env = "VOODU_ALLOW_PRIVILEGED", value_parser = super::boolish())]
    allow_privileged: bool,
    /// Allow `network_mode = "host"` (and a network named `host`).
    #[arg(long, env = "VOODU_ALLOW_HOST_NETWORK", value_parser = super::boolish())]
    allow_host_network: bool,
    /// Allow `--pid=host` and `--pid=container:…`.
    #[arg(long, env = "VOODU_ALLOW_HOST_PID", value_parser = super::boolish())]
    allow_host_pid: bool,
    /// Allow `--ipc=host` and `--ipc=container:…`.
    #[arg(long, env = "VOODU_ALLOW_HOST_IPC", value_parser = super::boolish())]
    allow_host_ipc: bool,
    /// Allow `--device` and `--gpus`.
    #[arg(long, env = "VOODU_ALLOW_DEVICES", value_parser = super::boolish())]
    allow_devices: bool,
    /// A capability `cap_add` may add beyond Docker's default set (repeatable or comma-separated; ALL for any).
    #[arg(
        long = "allow-cap",
        env = "VOODU_ALLOW_CAP",
        value_name = "CAP",
        value_delimiter = ','
    )]
    allow_cap: Vec<String>,
    /// A host directory (or file) bind mounts may come from (repeatable or
    /// comma-separated). The Docker socket,
    /// `/`, system directories and the data dir stay refused unless named themselves.
    #[arg(
        long = "allow-bind-root",
        env = "VOODU_ALLOW_BIND_ROOT",
        value_name = "DIR",
        value_delimiter = ','
    )]
    allow_bind_root: Vec<String>,
    /// A network beside voodu0 that containers may join (repeatable or comma-separated).
    #[arg(
        long = "allow-network",
        env = "VOODU_ALLOW_NETWORK",
        value_name = "NAME",
        value_delimiter = ','
    )]
    allow_network: Vec<String>,
    /// A `--security-opt` value beside no-new-privileges (repeatable or comma-separated), e.g. seccomp=unconfined.
    #[arg(
        long = "allow-security-opt",
        env = "VOODU_ALLOW_SECURITY_OPT",
        value_name = "OPT",
        value_delimiter = ','
    )]
    allow_security_opt: Vec<String>,
    /// A `--log-driver` beside json-file, local, journald and none (repeatable or
    /// comma-separated; `*` for any): the others send output to an address, e.g. syslog.
    #[arg(
        long = "allow-log-driver",
        env = "VOODU_ALLOW_LOG_DRIVER",
        value_name = "DRIVER",
        value_delimiter = ','
    )]
    allow_log_driver: Vec<String>,
    /// An existing volume the agent did not create that a statefulset may still mount as a
    /// claim, taking its data over (repeatable or comma-separated).
    #[arg(
        long = "adopt-volume",
        env = "VOODU_ADOPT_VOLUME",
        value_name = "NAME",
        value_delimiter = ','
    )]
    adopt_volume: Vec<String>,
    /// A host `url()` may fetch from, and `image_update` may scan as a registry, although it is
    /// internal (repeatable or comma-separated): a host name, an IP address or a CIDR, e.g.
    /// 127.0.0.1, config.internal, 10.0.0.0/8. Loopback, link-local (cloud metadata), private,
    /// CGNAT, multicast and unspecified addresses are refused otherwise; the agent's own
    /// --listen address always is, and registry scans never reach link-local.
    #[arg(
        long = "allow-url-host",
        env = "VOODU_ALLOW_URL_HOST",
        value_name = "HOST|IP|CIDR",
        value_delimiter = ','
    )]
    allow_url_host: Vec<String>,
    /// Images of repositories matching PATTERN (a repository, a prefix ending in `*`, or `*`)
    /// run only when their digest carries a cosign signature by the key(s) in KEYFILE (PEM
    /// public keys, several separated by `:`; repeatable). Checked when a release resolves its
    /// images and again at the sink before any container is created.
    #[arg(
        long = "require-signature",
        env = "VOODU_REQUIRE_SIGNATURE",
        value_name = "PATTERN=KEYFILE",
        value_delimiter = ','
    )]
    require_signature: Vec<String>,
}

impl PolicyArgs {
    /// Whether a policy file or any policy flag was given.
    pub(super) fn given(&self) -> bool {
        self.policy.is_some()
            || self.allow_privileged
            || self.allow_host_network
            || self.allow_host_pid
            || self.allow_host_ipc
            || self.allow_devices
            || !self.allow_cap.is_empty()
            || !self.allow_bind_root.is_empty()
            || !self.allow_network.is_empty()
            || !self.allow_security_opt.is_empty()
            || !self.allow_log_driver.is_empty()
            || !self.adopt_volume.is_empty()
            || !self.allow_url_host.is_empty()
            || !self.require_signature.is_empty()
    }

    /// The policy file (if any) with the flags added; default-deny when neither is given.
    pub(super) fn to_policy(&self) -> anyhow::Result<Policy> {
        let mut policy = match &self.policy {
            Some(file) if file.as_os_str() == "default" => Policy::default(),
            Some(file) => {
                let text = std::fs::read_to_string(file)
                    .with_context(|| format!("cannot read --policy {}", file.display()))?;
                serde_json::from_str(&text)
                    .with_context(|| format!("--policy {} is not a host policy", file.display()))?
            }
            None => Policy::default(),
        };
        policy.merge(Policy {
            allow_privileged: self.allow_privileged,
            allow_host_network: self.allow_host_network,
            allow_host_pid: self.allow_host_pid,
            allow_host_ipc: self.allow_host_ipc,
            allow_devices: self.allow_devices,
            allow_cap: self.allow_cap.clone(),
            allow_bind_root: self.allow_bind_root.clone(),
            allow_network: self.allow_network.clone(),
            allow_security_opt: self.allow_security_opt.clone(),
            allow_log_driver: self.allow_log_driver.clone(),
            adopt_volume: self.adopt_volume.clone(),
            allow_url_host: self.allow_url_host.clone(),
            require_signature: self
                .require_signature
                .iter()
                .map(|text| crate::model::policy::SignatureRule::parse(text))
                .collect::<Result<_, _>>()
                .map_err(anyhow::Error::msg)?,
            data_dir: None,
            seal: None,
            seal_only: false,
            caps: crate::model::policy::Caps::default(),
        });
        if let Some(problem) = policy.problems().into_iter().next() {
            anyhow::bail!("{problem}");
        }
        Ok(policy)
    }

    /// `to_policy`, protecting the agent's data dir.
    pub(super) fn to_policy_for(&self, data_dir: &Path) -> anyhow::Result<Policy> {
        let mut policy = self.to_policy()?;
        policy.data_dir = Some(absolute_text(data_dir));
        Ok(policy)
    }
}

/// `${VAR}` values given on the command line (also used by `plan`).
#[derive(Debug, Args)]
pub(super) struct VarArgs {
    /// A `${KEY}` value (repeatable), as a config bucket would supply it.
    #[arg(long = "var", value_name = "KEY=VALUE", value_parser = parse_var)]
    vars: Vec<(String, String)>,
    /// A file of KEY=VALUE lines (env-file syntax) supplying `${KEY}` values (repeatable);
    /// `--var` wins over it.
    #[arg(long = "var-file", value_name = "FILE", value_hint = clap::ValueHint::FilePath)]
    var_files: Vec<PathBuf>,
}

impl VarArgs {
    pub(super) fn to_vars(&self) -> anyhow::Result<Vars> {
        let mut globals = BTreeMap::new();
        for file in &self.var_files {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("cannot read --var-file {}", file.display()))?;
            let values = manifest::parse_env_file(&text)
                .map_err(|problem| anyhow::anyhow!("--var-file {}: {problem}", file.display()))?;
            globals.extend(values);
        }
        globals.extend(self.vars.iter().cloned());
        Ok(Vars {
            buckets: BTreeMap::new(),
            globals,
        })
    }
}

/// `path` made absolute (lexically), as text.
pub(super) fn absolute_text(path: &Path) -> String {
    std::path::absolute(path)
        .unwrap_or_else(|_| path.to_owned())
        .display()
        .to_string()
}

fn parse_var(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("{text:?} is not KEY=VALUE")),
    }
}

/// The hint an undefined `${VAR}` shows in `validate` and `plan`.
pub(super) const MISSING_VAR_HINT: &str = "pass `--var {var}=…` or `--var-file FILE` (the agent reads it from a config bucket or --allow-env),";

/// `--sources FILE --source NAME`: check (or plan) the manifests as that source's.
#[derive(Debug, Args, Default)]
pub(super) struct SourceArgs {
    /// The agent's sources file (`--sources` of the agent).
    #[arg(long, value_name = "FILE", value_hint = clap::ValueHint::FilePath)]
    sources: Option<PathBuf>,
    /// Which source of the file the manifests are (default: the only one).
    #[arg(long, value_name = "NAME", requires = "sources")]
    source: Option<String>,
}

/// A source's name and which scopes each source owns.
pub(super) struct OwnedBy {
    pub(super) name: String,
    pub(super) ownership: crate::model::scopes::Ownership,
}

impl OwnedBy {
    /// What this source's commits may point at.
    pub(super) fn seal(&self) -> crate::model::scopes::Seal {
        crate::model::scopes::Seal::new(&self.name, std::sync::Arc::new(self.ownership.clone()))
    }
}

/// `policy` with `owned_by`'s seal: as one source of several, a commit points only into its
/// own scopes. Without a host policy, only the seal is judged.
fn sealed(policy: Option<Policy>, owned_by: Option<&OwnedBy>, data_dir: &Path) -> Option<Policy> {
    let Some(owned_by) = owned_by else {
        return policy;
    };
    Some(match policy {
        Some(mut policy) => {
            policy.seal = Some(owned_by.seal());
            policy
        }
        None => Policy {
            data_dir: Some(absolute_text(data_dir)),
            ..Policy::seal_only(owned_by.seal())
        },
    })
}

impl SourceArgs {
    /// The source the manifests are checked as; `None` without `--sources`.
    pub(super) fn owned_by(&self) -> anyhow::Result<Option<OwnedBy>> {
        let Some(path) = &self.sources else {
            return Ok(None);
        };
        let sources = crate::agent::sources::load(path, std::time::Duration::from_secs(60))
            .map_err(|diagnostics| anyhow::anyhow!("--sources:\n{diagnostics}"))?;
        let names: Vec<&str> = sources.iter().map(|source| source.name.as_str()).collect();
        let name = match (&self.source, names.as_slice()) {
            (Some(name), _) if names.contains(&name.as_str()) => name.clone(),
            (Some(name), _) => anyhow::bail!(
                "--source {name:?}: {} has no such source (it has: {})",
                path.display(),
                names.join(", ")
            ),
            (None, [only]) => (*only).to_owned(),
            (None, _) => anyhow::bail!(
                "{} has several sources ({}): name the one these manifests are with --source NAME",
                path.display(),
                names.join(", ")
            ),
        };
        let ownership = crate::agent::sources::ownership(&sources).map_err(anyhow::Error::msg)?;
        Ok(Some(OwnedBy { name, ownership }))
    }
}

pub(super) fn run(args: &ValidateArgs, data_dir: &Path) -> anyhow::Result<ExitCode> {
    let owned_by = args.source.owned_by()?;
    let vars = args.vars.to_vars()?;
    let policy = args
        .policy
        .given()
        .then(|| args.policy.to_policy_for(data_dir))
        .transpose()?;
    let policy = sealed(policy, owned_by.as_ref(), data_dir);
    let audiences = if args.hosts.given() {
        vec![Audience::Selection(args.hosts.to_selection(None)?)]
    } else {
        let every = validate_dir(
            &args.dir,
            &args.paths,
            &vars,
            (policy.as_ref(), owned_by.as_ref()),
            &Audience::All,
        )?;
        audiences(&every.paths, &normalized(&args.paths))
    };
    let swarm = args.runtime == crate::reconcile::Engine::Swarm;
    let validate = |audience: &Audience| -> anyhow::Result<Outcome> {
        let mut outcome = validate_dir(
            &args.dir,
            &args.paths,
            &vars,
            (policy.as_ref(), owned_by.as_ref()),
            audience,
        )?;
        if swarm {
            outcome.under_swarm();
        }
        Ok(outcome)
    };
    if let [audience] = audiences.as_slice() {
        let outcome = validate(audience)?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&outcome_json(&outcome))?);
        } else {
            print!("{}", outcome.report());
        }
        return Ok(if outcome.errors.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        });
    }
    if args.json {
        let mut ok = true;
        let mut views = Vec::new();
        for audience in &audiences {
            let outcome = validate(audience)?;
            ok &= outcome.errors.is_empty();
            let mut view = outcome_json(&outcome);
            view["audience"] = serde_json::Value::String(audience.describe());
            views.push(view);
        }
        let view = serde_json::json!({ "ok": ok, "audiences": views });
        println!("{}", serde_json::to_string_pretty(&view)?);
        return Ok(if ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        });
    }
    // Several hosts: each problem once, then one summary line per host.
    let mut printed = std::collections::BTreeSet::new();
    let mut summaries = Vec::new();
    let mut failed = false;
    for audience in &audiences {
        let outcome = validate(audience)?;
        for line in outcome.lines() {
            if printed.insert(line.clone()) {
                print!("{line}");
            }
        }
        failed |= !outcome.errors.is_empty();
        summaries.push(format!(
            "{}: {}",
            escape(&audience.describe()),
            outcome.summary()
        ));
    }
    for summary in summaries {
        print!("{summary}");
    }
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// `--path` prefixes, normalised as the agent does.
fn normalized(paths: &[String]) -> Vec<String> {
    paths
        .iter()
        .map(|path| path.trim_matches('/').trim_start_matches("./").to_owned())
        .filter(|path| !path.is_empty() && path != ".")
        .collect()
}

/// What `validate` found in one directory.
pub(super) struct Outcome {
    pub(super) errors: Vec<Diagnostic>,
    pub(super) warnings: Vec<Diagnostic>,
    pub(super) n_files: usize,
    /// Resources by kind, when accepted.
    pub(super) kinds: BTreeMap<String, usize>,
    /// The manifest files read (before the audience kept its own).
    pub(super) paths: Vec<String>,
    /// The accepted resources' specs with where each is declared (for `--runtime swarm`).
    specs: Vec<(Diagnostic, crate::manifest::spec::Spec)>,
}

impl Outcome {
    /// What Docker Swarm cannot run becomes an error at the resource's block, how the rest
    /// runs there a warning.
    fn under_swarm(&mut self) {
        for (origin, spec) in &self.specs {
            let gaps = crate::reconcile::plan::swarm_gaps(spec);
            if !gaps.is_empty() {
                self.errors.push(Diagnostic {
                    message: format!("cannot run under Docker Swarm: {}", gaps.join("; ")),
                    ..origin.clone()
                });
            }
            for note in crate::reconcile::plan::swarm_notes(spec) {
                self.warnings.push(Diagnostic {
                    message: format!("under Docker Swarm: {note}"),
                    ..origin.clone()
                });
            }
        }
    }

    /// The lines `validate` prints.
    pub(super) fn report(&self) -> String {
        let mut out: String = self.lines().concat();
        out.push_str(&self.summary());
        out
    }

    /// One line per error, then per warning.
    fn lines(&self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .errors
            .iter()
            .map(|error| format!("{}\n", escape(&error.to_string())))
            .collect();
        for warning in &self.warnings {
            lines.push(format!(
                "{}:{}:{}: warning: {}\n",
                escape(&warning.path),
                warning.line,
                warning.col,
                escape(&warning.message)
            ));
        }
        lines
    }

    /// The last line: `ok: …` or how many errors.
    fn summary(&self) -> String {
        let mut out = String::new();
        let plural = |n: usize, word: &str| format!("{n} {word}{}", if n == 1 { "" } else { "s" });
        if self.errors.is_empty() {
            let n_resources: usize = self.kinds.values().sum();
            let kinds: Vec<String> = self
                .kinds
                .iter()
                .map(|(kind, n)| format!("{n} {kind}"))
                .collect();
            out.push_str(&format!(
                "ok: {} in {}{}{}\n",
                plural(n_resources, "resource"),
                plural(self.n_files, "file"),
                if kinds.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", kinds.join(", "))
                },
                if self.warnings.is_empty() {
                    String::new()
                } else {
                    format!(", {}", plural(self.warnings.len(), "warning"))
                },
            ));
        } else {
            out.push_str(&format!(
                "{} in {}; nothing would be applied\n",
                plural(self.errors.len(), "error"),
                plural(self.n_files, "file")
            ));
        }
        out
    }
}

/// The manifests the trigger files name (`apply.file`, each once), and the mistakes: files
/// the mirror refused (`refused`), trigger files that do not parse, `apply.file`s that are
/// not one readable manifest.
fn trigger_manifests(
    files: &WorkdirFiles,
    trigger_files: &[crate::model::SourceFile],
    refused: Vec<(String, String)>,
) -> (Vec<crate::model::SourceFile>, Vec<Diagnostic>) {
    let mut errors = crate::sync::refusals(refused);
    let mut named = Vec::new();
    match manifest::triggers::parse_all(trigger_files) {
        Ok(triggers) => {
            for trigger in &triggers {
                if named
                    .iter()
                    .any(|file: &crate::model::SourceFile| file.path == trigger.apply_file)
                {
                    continue;
                }
                match files.read(&trigger.apply_file, crate::model::MAX_MANIFEST_BYTES) {
                    FileRead::File(contents) => named.push(crate::model::SourceFile {
                        path: trigger.apply_file.clone(),
                        contents,
                    }),
                    FileRead::Missing => errors.push(trigger.at_apply_file(format!(
                        "apply.file {} does not exist",
                        trigger.apply_file
                    ))),
                    FileRead::TooLarge(size) => errors.push(trigger.at_apply_file(format!(
                        "apply.file {} is {size}; at most {} bytes of a manifest are read",
                        trigger.apply_file,
                        crate::model::MAX_MANIFEST_BYTES
                    ))),
                    _ => errors.push(trigger.at_apply_file(format!(
                        "apply.file {} is not a regular file; it names one manifest file, as in voodu",
                        trigger.apply_file
                    ))),
                }
            }
        }
        Err(problems) => errors.extend(problems),
    }
    (named, errors)
}

impl Outcome {
    /// A valid manifest's outcome: its warnings, resources by kind, and specs.
    fn valid(manifest: manifest::Manifest, n_files: usize, read: Vec<String>) -> Outcome {
        let mut kinds = BTreeMap::new();
        for resource in &manifest.resources {
            *kinds.entry(resource.key.kind.to_string()).or_insert(0) += 1;
        }
        Outcome {
            errors: Vec::new(),
            warnings: manifest.warnings,
            n_files,
            kinds,
            paths: read,
            specs: manifest
                .resources
                .into_iter()
                .map(|resource| {
                    let resource = std::sync::Arc::unwrap_or_clone(resource);
                    (resource.origin, resource.spec)
                })
                .collect(),
        }
    }
}

pub(super) fn validate_dir(
    dir: &Path,
    paths: &[String],
    vars: &Vars,
    (policy, owned_by): (Option<&Policy>, Option<&OwnedBy>),
    audience: &Audience,
) -> anyhow::Result<Outcome> {
    let mut snapshot =
        read_workdir(dir, paths).with_context(|| format!("cannot read {}", dir.display()))?;
    let files = WorkdirFiles::new(dir);
    // With trigger files, what is deployed is their apply.files, each of them: every trigger
    // file is checked, and the manifests they name (whatever branch each fires on) are
    // validated together.
    let (trigger_files, refused) = read_workdir_triggers(dir)?;
    if !trigger_files.is_empty() || !refused.is_empty() {
        let (mut named, errors) = trigger_manifests(&files, &trigger_files, refused);
        if !errors.is_empty() {
            return Ok(Outcome {
                errors,
                warnings: Vec::new(),
                n_files: trigger_files.len(),
                kinds: BTreeMap::new(),
                paths: Vec::new(),
                specs: Vec::new(),
            });
        }
        named.sort_unstable_by(|a, b| a.path.cmp(&b.path));
        snapshot.files = named;
        snapshot.refused.clear();
    }
    let read: Vec<String> = snapshot
        .files
        .iter()
        .map(|file| file.path.clone())
        .collect();
    let watched = normalized(paths);
    snapshot
        .files
        .retain(|file| audience.keeps(&file.path, &watched));
    snapshot
        .refused
        .retain(|(path, _)| audience.keeps(path, &watched));
    let options = LoadOptions {
        vars,
        files: &files,
        fetcher: None,
        mode: Mode::Validate,
        max_file_bytes: manifest::DEFAULT_MAX_FILE_BYTES,
        missing_var_hint: MISSING_VAR_HINT,
    };
    let n_files = snapshot.files.len();
    Ok(
        match manifest::load_with_policy(&snapshot, &options, policy).and_then(|manifest| {
            // With a policy, the gate the agent runs at the sink judges the requests too.
            let refused = policy
                .filter(|policy| !policy.seal_only)
                .map_or_else(Vec::new, |policy| {
                    crate::reconcile::requests::sink_refusals_under(&manifest, policy)
                });
            if !refused.is_empty() {
                return Err(manifest::Diagnostics(refused));
            }
            // As one source of several, only in the scopes it owns.
            let foreign = owned_by.map_or_else(Vec::new, |owned_by| {
                crate::sync::foreign_scopes(&manifest, &owned_by.name, &owned_by.ownership)
            });
            if foreign.is_empty() {
                Ok(manifest)
            } else {
                Err(manifest::Diagnostics(foreign))
            }
        }) {
            Ok(manifest) => Outcome::valid(manifest, n_files, read),
            Err(diagnostics) => Outcome {
                errors: diagnostics.0,
                warnings: Vec::new(),
                n_files,
                kinds: BTreeMap::new(),
                paths: read,
                specs: Vec::new(),
            },
        },
    )
}
