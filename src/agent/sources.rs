//! `--sources FILE`: the repositories one agent follows, each with the scopes it may deploy,
//! in HCL like the manifests. `--repo` alone is the single source `""` owning every scope.
//!
//! ```hcl
//! source "platform" {
//!   url    = "https://git.example.com/ops/platform.git"
//!   branch = "main"                      # default: main
//!   paths  = ["deploy"]                  # default: the whole repository
//!   scopes = ["ingress", ""]             # names, prefixes (`shop-*`), `*`; "" = unscoped
//!   poll   = "1m"                        # default: --interval
//!   token_file          = "/etc/voodu-agent/platform-token"   # https credentials
//!   ca_file             = "/etc/voodu-agent/ca.pem"
//!   ssh_key_file        = "/etc/voodu-agent/platform-deploy-key"   # ssh credentials
//!   ssh_accept_new_host_keys = false
//!   webhook_secret_file = "/etc/voodu-agent/platform-hook"    # default: --webhook-secret-file
//!   verify_commits      = "tip"          # tip | all; default: --verify-commits
//!   trusted_ssh_signers = "/etc/voodu-agent/allowed_signers"
//!   trusted_pgp_keys    = "/etc/voodu-agent/keys.asc"
//!   network             = "own"          # own (voodu0-<name>) | shared (voodu0)
//!   window "business" {                  # deploy windows (`manifest::window`), any number
//!     kind     = "allow"                 # allow | deny
//!     schedule = "0 9 * * 1-5"           # the cronjob grammar
//!     timezone = "Europe/Berlin"         # default: UTC
//!     duration = "8h"
//!   }
//!   previews {                           # a preview per branch (`model::previews`)
//!     branches = "preview/*"
//!     scope    = "{scope}-pr-{slug}"     # the default; the source must own these scopes
//!     host     = "{slug}.preview.example.com"
//!     ttl      = "72h"                   # default 72h
//!     max      = 5                       # default 5
//!     policy   = "/etc/voodu-agent/preview-policy.json"  # narrows the host policy
//!     max_replicas = 2                   # caps of a preview's resources (refused above;
//!     memory   = "512Mi"                 # a container without a limit gets the cap)
//!     cpus     = "0.5"
//!   }
//! }
//! ```
//!
//! Invariants: every mistake names `file:line:col` and what to write; names are unique, and
//! no scope is allowed to two sources (`Ownership::new`); secrets stay in the files named
//! here (read at start, never logged).

use std::path::{Path, PathBuf};
use std::time::Duration;

use hcl::edit::Span as _;
use hcl::edit::expr::Expression;
use hcl::edit::structure::{Attribute, Body};

use crate::git::{SourceOptions, VerifyMode};
use crate::http::WebhookSecret;
use crate::manifest::{Diagnostic, Diagnostics, LineIndex};
use crate::model::scopes::{Ownership, ScopePattern};
use crate::sync::CommitTrust;

/// One followed repository.
#[derive(Debug, Clone)]
pub struct SourceConfig {
    /// Unique among the sources; `""` for the single `--repo` source.
    pub name: String,
    pub options: SourceOptions,
    /// Time between polls of its remote.
    pub interval: Duration,
    pub scopes: Vec<ScopePattern>,
    /// Its webhook secret; `None`: the agent's (`--webhook-secret-file`).
    pub secret: Option<WebhookSecret>,
    /// Its commit signature rule; `None`: the agent's (`--verify-commits`).
    pub trust: Option<CommitTrust>,
    /// Its containers join the shared `voodu0` network (`network = "shared"`) instead of its
    /// own `voodu0-<name>` (`network = "own"`, the default), so they reach other sources'
    /// containers that share it.
    pub shared_network: bool,
    /// Its deploy windows (`window "NAME" { … }` blocks); empty: always open.
    pub windows: Vec<crate::manifest::window::WindowRule>,
    /// Its `previews { … }` block: a preview per matching branch.
    pub previews: Option<crate::model::previews::PreviewRules>,
}

/// Most sources one agent follows (an unchanged poll of a repository on this host is a read
/// of two ref files; of a remote, one ref listing: `benches/sources.rs` measures 100).
pub const MAX_SOURCES: usize = 128;
/// Longest sources file read.
const MAX_FILE_BYTES: u64 = 256 * 1024;
/// Shortest and longest poll interval.
const MIN_POLL: Duration = Duration::from_secs(1);
const MAX_POLL: Duration = Duration::from_secs(24 * 3600);

const KNOWN: &[&str] = &[
    "url",
    "branch",
    "paths",
    "scopes",
    "poll",
    "token_file",
    "ca_file",
    "ssh_accept_new_host_keys",
    "ssh_key_file",
    "webhook_secret_file",
    "verify_commits",
    "trusted_ssh_signers",
    "trusted_pgp_keys",
    "network",
];

/// Reads and checks a sources file; `default_interval` is `--interval`.
pub fn load(path: &Path, default_interval: Duration) -> Result<Vec<SourceConfig>, Diagnostics> {
    let shown = path.display().to_string();
    let whole = |message: String| {
        Diagnostics(vec![Diagnostic {
            path: shown.clone(),
            line: 1,
            col: 1,
            message,
        }])
    };
    let size = std::fs::metadata(path)
        .map_err(|error| whole(format!("cannot read the sources file: {error}")))?
        .len();
    if size > MAX_FILE_BYTES {
        return Err(whole(format!(
            "{size} bytes; a sources file holds at most {MAX_FILE_BYTES}"
        )));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|error| whole(format!("cannot read the sources file: {error}")))?;
    parse(&shown, &text, default_interval)
}

/// Checks the text of a sources file named `path` (for the diagnostics).
pub fn parse(
    path: &str,
    text: &str,
    default_interval: Duration,
) -> Result<Vec<SourceConfig>, Diagnostics> {
    let index = LineIndex::new(text);
    let body = hcl::edit::parser::parse_body(text).map_err(|error| {
        let (line, col) = index.line_col(error.location().offset());
        Diagnostics(vec![Diagnostic {
            path: path.to_owned(),
            line,
            col,
            message: format!("HCL syntax error: {}", error.message()),
        }])
    })?;
    let mut problems = Problems {
        path,
        index: &index,
        found: Vec::new(),
    };
    let sources = read_body(&mut problems, &body, default_interval);
    if problems.found.is_empty() {
        let ownership = Ownership::new(
            sources
                .iter()
                .map(|(source, _)| (source.name.clone(), source.scopes.clone()))
                .collect(),
        );
        if let Err(message) = ownership {
            // The `scopes` of the first source overlapping one declared before it.
            let at = (1..sources.len())
                .find(|&end| {
                    Ownership::new(
                        sources[..=end]
                            .iter()
                            .map(|(source, _)| (source.name.clone(), source.scopes.clone()))
                            .collect(),
                    )
                    .is_err()
                })
                .and_then(|end| sources[end].1.clone());
            problems.error(at, message.to_string());
        }
    }
    if problems.found.is_empty() {
        Ok(sources.into_iter().map(|(source, _)| source).collect())
    } else {
        Err(Diagnostics(problems.found))
    }
}

/// Sources whose scopes overlap (`model::scopes::Ownership` says how).
pub type OwnershipError = crate::model::scopes::ScopeError;

/// The ownership of `sources` (checked at parse: it cannot overlap).
pub fn ownership(sources: &[SourceConfig]) -> Result<Ownership, OwnershipError> {
    Ok(Ownership::new(
        sources
            .iter()
            .map(|source| (source.name.clone(), source.scopes.clone()))
            .collect(),
    )?
    .with_shared_network(
        sources
            .iter()
            .filter(|source| source.shared_network)
            .map(|source| source.name.clone())
            .collect(),
    )
    .with_previews(
        sources
            .iter()
            .filter_map(|source| {
                let rules = source.previews.as_ref()?;
                Some((source.name.clone(), rules.separator.clone()))
            })
            .collect(),
    ))
}

/// The preview rules of `--preview-*` or a `previews { … }` block, checked: with the scopes
/// the source owns, every preview scope of an exact scope must be owned too (`shop` needs
/// `shop-pr-*`). The message names what to write.
pub fn preview_rules(
    name: &str,
    scopes: &[ScopePattern],
    (branches, scope, host): (&str, &str, &str),
    (ttl, max): (Duration, usize),
) -> Result<crate::model::previews::PreviewRules, String> {
    let rules = crate::model::previews::PreviewRules {
        branches: branches.to_owned(),
        separator: crate::model::previews::PreviewRules::separator_of(scope)?,
        host: host.to_owned(),
        ttl,
        max,
        policy: None,
        caps: crate::model::policy::Caps::default(),
    };
    rules.check()?;
    for pattern in scopes {
        if let ScopePattern::Exact(exact) = pattern
            && !exact.is_empty()
        {
            let wanted = format!("{exact}{}", rules.separator);
            let owned = scopes.iter().any(|other| match other {
                ScopePattern::Any => true,
                ScopePattern::Prefix(prefix) => wanted.starts_with(prefix.as_str()),
                ScopePattern::Exact(_) => false,
            });
            if !owned {
                return Err(format!(
                    "source {name:?}: previews of scope {exact} deploy to scopes {wanted}<slug>, which the source does not own: add \"{wanted}*\" to its `scopes`"
                ));
            }
        }
    }
    Ok(rules)
}

/// The mistakes found in one sources file so far, each placed at its `file:line:col`.
struct Problems<'a> {
    path: &'a str,
    index: &'a LineIndex<'a>,
    found: Vec<Diagnostic>,
}

impl Problems<'_> {
    fn error(&mut self, span: Option<std::ops::Range<usize>>, message: String) {
        self.found.push(self.index.at(self.path, span, message));
    }
}

fn read_body(
    problems: &mut Problems<'_>,
    body: &Body,
    default_interval: Duration,
) -> Vec<(SourceConfig, Option<std::ops::Range<usize>>)> {
    // Each source with where its `scopes` are.
    let mut sources: Vec<(SourceConfig, Option<std::ops::Range<usize>>)> = Vec::new();
    // The block past the last one a file may hold.
    let mut too_many = None;
    for attribute in body.attributes() {
        problems.error(
            attribute.span(),
            format!(
                "unexpected attribute `{}`: a sources file holds `source \"NAME\" {{ … }}` blocks",
                attribute.key.as_str()
            ),
        );
    }
    for block in body.blocks() {
        let at = block.ident.span();
        if block.ident.as_str() != "source" {
            problems.error(
                at,
                format!(
                    "unknown block `{}`: write `source \"NAME\" {{ url = …, scopes = […] }}`",
                    block.ident.as_str()
                ),
            );
            continue;
        }
        let labels: Vec<&str> = block
            .labels
            .iter()
            .map(|label| match label {
                hcl::edit::structure::BlockLabel::String(text) => text.as_str(),
                hcl::edit::structure::BlockLabel::Ident(ident) => ident.as_str(),
            })
            .collect();
        let [name] = labels.as_slice() else {
            problems.error(
                at,
                format!(
                    "a source block takes one label, its name, got {}: write `source \"shop\" {{ … }}`",
                    labels.len()
                ),
            );
            continue;
        };
        let name = (*name).to_owned();
        if name.is_empty()
            || name.len() > 32
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            problems.error(
                at,
                format!("source name {name:?}: 1 to 32 letters, digits, `-` or `_`"),
            );
            continue;
        }
        if sources.iter().any(|(source, _)| source.name == name) {
            problems.error(at, format!("source {name:?} is declared twice"));
            continue;
        }
        if let Some(source) =
            read_source(problems, &name, &block.body, at.clone(), default_interval)
        {
            if sources.len() == MAX_SOURCES {
                too_many = too_many.or(at.clone());
            }
            let scopes = block
                .body
                .attributes()
                .find(|attribute| attribute.key.as_str() == "scopes")
                .and_then(|attribute| attribute.value.span());
            sources.push((source, scopes));
        }
    }
    if sources.is_empty() && problems.found.is_empty() {
        problems.error(
            None,
            "no source: write at least one `source \"NAME\" { url = …, scopes = […] }` block"
                .to_owned(),
        );
    }
    if sources.len() > MAX_SOURCES {
        problems.error(
            too_many,
            format!("{} sources; at most {MAX_SOURCES}", sources.len()),
        );
    }
    sources
}

/// One `source "NAME" { … }` block's attributes, read with its name in every mistake.
struct SourceBlock<'a> {
    name: &'a str,
    body: &'a Body,
}

impl<'a> SourceBlock<'a> {
    fn get(&self, key: &str) -> Option<&'a Attribute> {
        self.body
            .attributes()
            .find(|attribute| attribute.key.as_str() == key)
    }

    /// Where attribute `key`'s value is, if it is there.
    fn value_span(&self, key: &str) -> Option<std::ops::Range<usize>> {
        self.get(key).and_then(|attribute| attribute.value.span())
    }

    /// Attribute `key` as a string; a value of another type is reported.
    fn text(&self, problems: &mut Problems<'_>, key: &str) -> Option<String> {
        let name = self.name;
        let attribute = self.get(key)?;
        match &attribute.value {
            Expression::String(value) => Some(value.as_str().to_owned()),
            _ => {
                problems.error(
                    attribute.value.span(),
                    format!("source {name:?}: `{key}` wants a string"),
                );
                None
            }
        }
    }

    /// Attribute `key` as a path; a relative one is reported.
    fn file(&self, problems: &mut Problems<'_>, key: &str) -> Option<PathBuf> {
        let name = self.name;
        let value = self.text(problems, key)?;
        let path = PathBuf::from(&value);
        if !path.is_absolute() {
            problems.error(
                self.value_span(key),
                format!("source {name:?}: `{key}` wants an absolute path, got {value:?}"),
            );
        }
        Some(path)
    }

    /// Attributes and blocks a source does not have, reported.
    fn check_known(&self, problems: &mut Problems<'_>) {
        let name = self.name;
        for attribute in self.body.attributes() {
            if !KNOWN.contains(&attribute.key.as_str()) {
                problems.error(
                    attribute.key.span(),
                    format!(
                        "source {name:?}: unknown attribute `{}` (known: {})",
                        attribute.key.as_str(),
                        KNOWN.join(", ")
                    ),
                );
            }
        }
        if let Some(block) = self
            .body
            .blocks()
            .find(|block| !matches!(block.ident.as_str(), "window" | "previews"))
        {
            problems.error(
                block.ident.span(),
                format!(
                    "source {name:?}: unexpected block `{}`",
                    block.ident.as_str()
                ),
            );
        }
    }

    /// The `window "NAME" { kind, schedule, timezone, duration }` blocks, each mistake at
    /// its place.
    fn windows(&self, problems: &mut Problems<'_>) -> Vec<crate::manifest::window::WindowRule> {
        use crate::manifest::window::{MAX_RULES, WindowRule};
        let name = self.name;
        let mut rules: Vec<WindowRule> = Vec::new();
        for block in self
            .body
            .blocks()
            .filter(|block| block.ident.as_str() == "window")
        {
            let at = block.ident.span();
            let label = match block.labels.as_slice() {
                [hcl::edit::structure::BlockLabel::String(text)] => text.as_str().to_owned(),
                [hcl::edit::structure::BlockLabel::Ident(ident)] => ident.as_str().to_owned(),
                _ => {
                    problems.error(
                        at,
                        format!("source {name:?}: a window block takes one label, its name: `window \"business\" {{ kind = \"allow\", schedule = \"0 9 * * 1-5\", timezone = \"Europe/Berlin\", duration = \"8h\" }}`"),
                    );
                    continue;
                }
            };
            if label.is_empty() || label.len() > 64 || label.chars().any(char::is_control) {
                problems.error(
                    at,
                    format!("source {name:?}: window name {label:?}: 1 to 64 printable characters"),
                );
                continue;
            }
            let inner = SourceBlock {
                name: self.name,
                body: &block.body,
            };
            for attribute in block.body.attributes() {
                if !["kind", "schedule", "timezone", "duration"].contains(&attribute.key.as_str()) {
                    problems.error(
                        attribute.key.span(),
                        format!(
                            "source {name:?}: window {label:?}: unknown attribute `{}` (known: kind, schedule, timezone, duration)",
                            attribute.key.as_str()
                        ),
                    );
                }
            }
            let kind = inner.text(problems, "kind");
            let schedule = inner.text(problems, "schedule");
            let timezone = inner.text(problems, "timezone").unwrap_or_default();
            let duration = inner.text(problems, "duration");
            let (Some(kind), Some(schedule), Some(duration)) = (kind, schedule, duration) else {
                problems.error(
                    at,
                    format!("source {name:?}: window {label:?} needs `kind` (\"allow\" or \"deny\"), `schedule` and `duration`"),
                );
                continue;
            };
            if rules.iter().any(|rule| rule.name == label) {
                problems.error(
                    at,
                    format!("source {name:?}: window {label:?} is declared twice"),
                );
                continue;
            }
            match WindowRule::new(&label, &kind, &schedule, &timezone, &duration) {
                Ok(rule) => rules.push(rule),
                Err(message) => {
                    // At the attribute the message is about.
                    let key = ["schedule", "duration", "timezone", "kind"]
                        .into_iter()
                        .find(|key| message.starts_with(&format!("window {key}")))
                        .unwrap_or(if message.contains("time zone") {
                            "timezone"
                        } else {
                            "schedule"
                        });
                    problems.error(
                        inner.value_span(key).or(at),
                        format!("source {name:?}: window {label:?}: {message}"),
                    );
                }
            }
        }
        if rules.len() > MAX_RULES {
            problems.error(
                None,
                format!(
                    "source {name:?}: {} windows; at most {MAX_RULES}",
                    rules.len()
                ),
            );
        }
        rules
    }

    /// `ssh_accept_new_host_keys`: false unless it is `true`; another type is reported.
    fn accept_new_host_keys(&self, problems: &mut Problems<'_>) -> bool {
        let name = self.name;
        match self.get("ssh_accept_new_host_keys") {
            None => false,
            Some(attribute) => match &attribute.value {
                Expression::Bool(value) => *value.value(),
                other => {
                    problems.error(
                        other.span(),
                        format!("source {name:?}: `ssh_accept_new_host_keys` wants true or false"),
                    );
                    false
                }
            },
        }
    }

    /// `network`: whether the source's containers are on the shared `voodu0`.
    fn shared_network(&self, problems: &mut Problems<'_>) -> bool {
        let name = self.name;
        match self.text(problems, "network").as_deref() {
            None | Some("own") => false,
            Some("shared") => true,
            Some(other) => {
                problems.error(
                    self.value_span("network"),
                    format!(
                        "source {name:?}: network {other:?}: write \"own\" (its containers on their own network, voodu0-{name}) or \"shared\" (on voodu0, with the other sources that share it)"
                    ),
                );
                false
            }
        }
    }

    /// `scopes`, required and not empty: the scopes the source may deploy.
    fn scopes(
        &self,
        problems: &mut Problems<'_>,
        at: Option<std::ops::Range<usize>>,
    ) -> Vec<ScopePattern> {
        let name = self.name;
        let scopes_attribute = self.get("scopes");
        match strings(problems, name, scopes_attribute) {
            None if scopes_attribute.is_none() => {
                problems.error(
                    at,
                    format!(
                        "source {name:?}: `scopes` is required: the scopes it may deploy, e.g. `scopes = [\"{name}\"]` (`shop-*` for a prefix, \"\" for registries and unscoped assets)"
                    ),
                );
                Vec::new()
            }
            None => Vec::new(),
            Some(texts) => {
                let span = scopes_attribute.and_then(|attribute| attribute.value.span());
                let mut patterns = Vec::new();
                for text in texts {
                    match ScopePattern::parse(&text) {
                        Ok(pattern) => patterns.push(pattern),
                        Err(message) => {
                            problems.error(span.clone(), format!("source {name:?}: {message}"))
                        }
                    }
                }
                if patterns.is_empty() {
                    problems.error(
                        span,
                        format!("source {name:?}: `scopes` is empty: it could deploy nothing"),
                    );
                }
                patterns
            }
        }
    }

    /// `poll` as an interval from 1s to 24h, or `default_interval` (also when it is wrong,
    /// reported).
    fn interval(
        &self,
        problems: &mut Problems<'_>,
        poll: Option<String>,
        default_interval: Duration,
    ) -> Duration {
        let name = self.name;
        match poll {
            None => default_interval,
            Some(poll) => match humantime::parse_duration(&poll) {
                Ok(interval) if (MIN_POLL..=MAX_POLL).contains(&interval) => interval,
                _ => {
                    problems.error(
                        self.value_span("poll"),
                        format!("source {name:?}: poll {poll:?} is not a duration from 1s to 24h (e.g. \"1m\")"),
                    );
                    default_interval
                }
            },
        }
    }

    /// The git stage's own check of `options`, reported at the attribute it refused.
    fn check_options(
        &self,
        problems: &mut Problems<'_>,
        options: &SourceOptions,
        at: Option<std::ops::Range<usize>>,
    ) {
        let name = self.name;
        if let Err(error) = options.check() {
            // The attribute the check refused.
            let key = match &error {
                crate::git::Error::TokenOverHttp { .. } => "token_file",
                crate::git::Error::CaFile { .. } => "ca_file",
                crate::git::Error::SshKeyFile { .. } => "ssh_key_file",
                _ => "url",
            };
            let span = self.value_span(key).or(at);
            problems.error(span, format!("source {name:?}: {error}"));
        }
    }

    /// The webhook secret read from `webhook_secret_file`.
    fn secret(&self, problems: &mut Problems<'_>, file: Option<PathBuf>) -> Option<WebhookSecret> {
        let name = self.name;
        file.and_then(|path| match WebhookSecret::from_file(&path) {
            Ok(secret) => Some(secret),
            Err(error) => {
                problems.error(
                    self.value_span("webhook_secret_file"),
                    format!("source {name:?}: {error}"),
                );
                None
            }
        })
    }

    /// `verify_commits` with the keys to trust (`trusted_ssh_signers`, `trusted_pgp_keys`):
    /// keys without a mode, or a mode without keys, are reported.
    fn trust(
        &self,
        problems: &mut Problems<'_>,
        verify: Option<&str>,
        (ssh_signers, pgp_keys): (Option<PathBuf>, Option<PathBuf>),
        at: Option<std::ops::Range<usize>>,
    ) -> Option<CommitTrust> {
        let name = self.name;
        let Some(mode) = verify else {
            if ssh_signers.is_some() || pgp_keys.is_some() {
                let keys = self
                    .get("trusted_ssh_signers")
                    .or_else(|| self.get("trusted_pgp_keys"));
                problems.error(
                    keys.and_then(|attribute| attribute.key.span()).or(at),
                    format!("source {name:?}: trusted keys without `verify_commits = \"tip\"` or \"all\" have no effect"),
                );
            }
            return None;
        };
        let span = self.value_span("verify_commits");
        let mode = match mode {
            "tip" => VerifyMode::Tip,
            "all" => VerifyMode::All,
            other => {
                problems.error(
                    span,
                    format!("source {name:?}: verify_commits {other:?}: write \"tip\" or \"all\""),
                );
                return None;
            }
        };
        if ssh_signers.is_none() && pgp_keys.is_none() {
            problems.error(
                span,
                format!("source {name:?}: verify_commits needs the keys to trust: `trusted_ssh_signers` and/or `trusted_pgp_keys`"),
            );
            return None;
        }
        match CommitTrust::load(mode, ssh_signers.as_deref(), pgp_keys.as_deref()) {
            Ok(trust) => Some(trust),
            Err(error) => {
                problems.error(span, format!("source {name:?}: {error:#}"));
                None
            }
        }
    }
}

fn read_source(
    problems: &mut Problems<'_>,
    name: &str,
    body: &Body,
    at: Option<std::ops::Range<usize>>,
    default_interval: Duration,
) -> Option<SourceConfig> {
    let before = problems.found.len();
    let block = SourceBlock { name, body };
    block.check_known(problems);
    let url = block.text(problems, "url");
    let branch = block
        .text(problems, "branch")
        .unwrap_or_else(|| "main".to_owned());
    let poll = block.text(problems, "poll");
    let token_file = block.file(problems, "token_file");
    let ca_file = block.file(problems, "ca_file");
    let ssh_key_file = block.file(problems, "ssh_key_file");
    let secret_file = block.file(problems, "webhook_secret_file");
    let ssh_signers = block.file(problems, "trusted_ssh_signers");
    let pgp_keys = block.file(problems, "trusted_pgp_keys");
    let verify = block.text(problems, "verify_commits");
    let accept_new = block.accept_new_host_keys(problems);
    let shared_network = block.shared_network(problems);
    let windows = block.windows(problems);
    let paths = strings(problems, name, block.get("paths")).unwrap_or_default();
    let scopes = block.scopes(problems, at.clone());
    let previews = read_previews(problems, name, body, &scopes);
    let Some(url) = url.filter(|url| !url.is_empty()) else {
        problems.error(
            at,
            format!("source {name:?}: `url` is required, e.g. `url = \"https://git.example.com/team/deploy.git\"`"),
        );
        return None;
    };
    let interval = block.interval(problems, poll, default_interval);
    let options = SourceOptions {
        url,
        branch,
        paths,
        token_file,
        ca_file,
        ssh_accept_new_host_keys: accept_new,
        ssh_key_file,
        // The agent's `--max-file-size`, set where the source is made (`agent::start`).
        max_file_bytes: 0,
    };
    block.check_options(problems, &options, at.clone());
    let secret = block.secret(problems, secret_file);
    let trust = block.trust(problems, verify.as_deref(), (ssh_signers, pgp_keys), at);
    (problems.found.len() == before).then(|| SourceConfig {
        name: name.to_owned(),
        options,
        interval,
        scopes,
        secret,
        trust,
        shared_network,
        windows,
        previews,
    })
}

/// The `previews { … }` block of source `name`, checked (`preview_rules`).
fn read_previews(
    problems: &mut Problems<'_>,
    name: &str,
    body: &Body,
    scopes: &[ScopePattern],
) -> Option<crate::model::previews::PreviewRules> {
    let block = body
        .blocks()
        .find(|block| block.ident.as_str() == "previews")?;
    let at = block.ident.span();
    let mut texts = std::collections::BTreeMap::new();
    let mut max = 5;
    let mut limits = PreviewLimits::default();
    for attribute in block.body.attributes() {
        let key = attribute.key.as_str();
        if read_preview_limit(problems, name, attribute, &mut limits) {
            continue;
        }
        match (key, &attribute.value) {
            ("branches" | "scope" | "host" | "ttl", Expression::String(value)) => {
                texts.insert(key, value.as_str().to_owned());
            }
            ("max", Expression::Number(number)) => {
                match number.value().as_u64().and_then(|n| usize::try_from(n).ok()) {
                    Some(n) => max = n,
                    None => problems.error(
                        attribute.value.span(),
                        format!("source {name:?}: previews: `max` wants a whole number"),
                    ),
                }
            }
            ("branches" | "scope" | "host" | "ttl" | "max", value) => problems.error(
                value.span(),
                format!("source {name:?}: previews: `{key}` wants a {}", if key == "max" { "number" } else { "string" }),
            ),
            _ => problems.error(
                attribute.key.span(),
                format!("source {name:?}: previews: unknown attribute `{key}` (known: branches, scope, host, ttl, max, policy, max_replicas, memory, cpus)"),
            ),
        }
    }
    let (Some(branches), Some(host)) = (texts.get("branches"), texts.get("host")) else {
        problems.error(
            at,
            format!("source {name:?}: previews need `branches` (e.g. \"preview/*\") and `host` (e.g. \"{{slug}}.preview.example.com\")"),
        );
        return None;
    };
    let ttl = match texts.get("ttl") {
        None => DEFAULT_PREVIEW_TTL,
        Some(text) => {
            match humantime::parse_duration(text) {
                Ok(ttl) => ttl,
                Err(_) => {
                    problems.error(
                    at,
                    format!("source {name:?}: previews: ttl {text:?} is not a duration (e.g. \"72h\")"),
                );
                    return None;
                }
            }
        }
    };
    let scope = texts
        .get("scope")
        .map_or(DEFAULT_PREVIEW_SCOPE, String::as_str);
    match preview_rules(name, scopes, (branches, scope, host), (ttl, max)) {
        Ok(rules) => Some(crate::model::previews::PreviewRules {
            policy: limits.policy,
            caps: limits.caps,
            ..rules
        }),
        Err(message) => {
            problems.error(at, message);
            None
        }
    }
}

/// The previews' host policy and caps as a `previews { … }` block writes them.
#[derive(Default)]
struct PreviewLimits {
    policy: Option<crate::model::policy::Policy>,
    caps: crate::model::policy::Caps,
}

/// Reads `attribute` when it is one of the previews' limits (`policy`, `max_replicas`,
/// `memory`, `cpus`), reporting a bad value at it; `false` for any other attribute.
fn read_preview_limit(
    problems: &mut Problems<'_>,
    name: &str,
    attribute: &Attribute,
    limits: &mut PreviewLimits,
) -> bool {
    let key = attribute.key.as_str();
    let text = match &attribute.value {
        Expression::String(value) => Some(value.as_str().to_owned()),
        Expression::Number(number) => Some(number.to_string()),
        _ => None,
    };
    let result = match (key, text) {
        ("policy", Some(path)) => load_preview_policy(std::path::Path::new(&path))
            .map(|policy| limits.policy = Some(policy)),
        ("max_replicas", Some(text)) => match text.parse::<usize>() {
            Ok(n) => {
                limits.caps.max_replicas = Some(n);
                Ok(())
            }
            Err(_) => Err("`max_replicas` wants a whole number, e.g. 2".to_owned()),
        },
        ("memory", Some(text)) => match crate::model::parse_memory(&text) {
            Some(n) => {
                limits.caps.memory = Some(n);
                Ok(())
            }
            None => Err(format!("memory {text:?}: write a size, e.g. \"512Mi\"")),
        },
        ("cpus", Some(text)) => match crate::model::parse_cpus(&text) {
            Some(n) => {
                limits.caps.cpus = Some(n);
                Ok(())
            }
            None => Err(format!(
                "cpus {text:?}: write cores or millicores, e.g. \"0.5\" or \"500m\""
            )),
        },
        ("policy" | "max_replicas" | "memory" | "cpus", None) => {
            Err(format!("`{key}` wants a string"))
        }
        _ => return false,
    };
    if let Err(message) = result {
        problems.error(
            attribute.value.span(),
            format!("source {name:?}: previews: {message}"),
        );
    }
    true
}

/// The previews' host policy file `path` (the agent's `--policy` format, JSON), checked.
pub fn load_preview_policy(path: &std::path::Path) -> Result<crate::model::policy::Policy, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|error| format!("policy {}: {error}", path.display()))?;
    let policy: crate::model::policy::Policy = serde_json::from_str(&text).map_err(|error| {
        format!(
            "policy {}: not a host policy (the --policy format, JSON): {error}",
            path.display()
        )
    })?;
    match policy.problems().into_iter().next() {
        Some(problem) => Err(format!("policy {}: {problem}", path.display())),
        None => Ok(policy),
    }
}

/// A preview's scope template when none is written.
pub const DEFAULT_PREVIEW_SCOPE: &str = "{scope}-pr-{slug}";
/// A preview's ttl when none is written.
pub const DEFAULT_PREVIEW_TTL: Duration = Duration::from_secs(72 * 3600);

/// A list of strings, or `None` (reported) when it is something else.
fn strings(
    problems: &mut Problems<'_>,
    name: &str,
    attribute: Option<&Attribute>,
) -> Option<Vec<String>> {
    let attribute = attribute?;
    let wrong = |problems: &mut Problems<'_>| {
        problems.error(
            attribute.value.span(),
            format!(
                "source {name:?}: `{}` wants a list of strings",
                attribute.key.as_str()
            ),
        );
    };
    let Expression::Array(items) = &attribute.value else {
        wrong(problems);
        return None;
    };
    let mut texts = Vec::new();
    for item in items.iter() {
        match item {
            Expression::String(text) => texts.push(text.as_str().to_owned()),
            _ => {
                wrong(problems);
                return None;
            }
        }
    }
    Some(texts)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    fn problems(text: &str) -> String {
        match parse("sources.hcl", text, MINUTE) {
            Ok(_) => "accepted".to_owned(),
            Err(diagnostics) => diagnostics.to_string(),
        }
    }

    #[test]
    fn a_sources_file_names_each_repository_and_its_scopes() -> Result<(), Diagnostics> {
        let sources = parse(
            "sources.hcl",
            r#"
source "platform" {
  url    = "https://git.example.com/ops/platform.git"
  scopes = ["ingress", ""]
  poll   = "2m"
}
source "shop" {
  url    = "/srv/git/shop"
  branch = "release"
  paths  = ["deploy"]
  scopes = ["shop-*"]
  ssh_accept_new_host_keys = true
}
"#,
            MINUTE,
        )?;
        assert_eq!(sources.len(), 2);
        assert_eq!(sources[0].name, "platform");
        assert_eq!(sources[0].interval, Duration::from_secs(120));
        assert_eq!(sources[0].options.branch, "main");
        assert_eq!(sources[1].interval, MINUTE);
        assert_eq!(sources[1].options.branch, "release");
        assert_eq!(sources[1].options.paths, vec!["deploy".to_owned()]);
        assert!(sources[1].options.ssh_accept_new_host_keys);
        let ownership = ownership(&sources).map_err(|error| {
            Diagnostics(vec![Diagnostic {
                path: String::new(),
                line: 0,
                col: 0,
                message: error.to_string(),
            }])
        })?;
        assert_eq!(ownership.owner_of("shop-web"), Some("shop"));
        assert_eq!(ownership.owner_of(""), Some("platform"));
        // Each on its own network unless it shares `voodu0`.
        assert_eq!(ownership.network_of("shop-web"), "voodu0-shop");
        let shared = parse(
            "sources.hcl",
            "source \"a\" {\n  url = \"/r\"\n  scopes = [\"a\"]\n  network = \"shared\"\n}\nsource \"b\" {\n  url = \"/s\"\n  scopes = [\"b\"]\n  network = \"own\"\n}\n",
            MINUTE,
        )?;
        assert!(shared[0].shared_network && !shared[1].shared_network);
        let previewed = parse(
            "sources.hcl",
            "source \"a\" {\n  url = \"/r\"\n  scopes = [\"a\", \"a-pr-*\"]\n  previews {\n    branches = \"preview/*\"\n    host = \"{slug}.p.test\"\n    ttl = \"5s\"\n    max = 2\n  }\n}\n",
            MINUTE,
        )?;
        let rules = previewed[0]
            .previews
            .clone()
            .unwrap_or_else(|| panic!("no previews"));
        assert_eq!(
            (rules.separator.as_str(), rules.max, rules.ttl),
            ("-pr-", 2, Duration::from_secs(5))
        );
        assert!(rules.policy.is_none() && rules.caps.is_empty());
        // The previews' policy file and caps.
        let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("{error}"));
        let policy = dir.path().join("preview-policy.json");
        std::fs::write(&policy, r#"{"allow-cap": ["NET_ADMIN"]}"#)
            .unwrap_or_else(|error| panic!("{error}"));
        let capped = parse(
            "sources.hcl",
            &format!(
                "source \"a\" {{\n  url = \"/r\"\n  scopes = [\"a\", \"a-pr-*\"]\n  previews {{\n    branches = \"preview/*\"\n    host = \"{{slug}}.p.test\"\n    policy = \"{}\"\n    max_replicas = 2\n    memory = \"512Mi\"\n    cpus = \"500m\"\n  }}\n}}\n",
                policy.display()
            ),
            MINUTE,
        )?;
        let rules = capped[0]
            .previews
            .clone()
            .unwrap_or_else(|| panic!("no previews"));
        assert_eq!(
            rules.policy.map(|policy| policy.allow_cap),
            Some(vec!["NET_ADMIN".to_owned()])
        );
        assert_eq!(
            rules.caps,
            crate::model::policy::Caps {
                max_replicas: Some(2),
                memory: Some(512 << 20),
                cpus: Some(500_000_000),
            }
        );
        Ok(())
    }

    #[test]
    fn window_blocks_give_a_source_its_deploy_windows() -> Result<(), Diagnostics> {
        let sources = parse(
            "sources.hcl",
            "source \"shop\" {\n  url = \"/r\"\n  scopes = [\"shop\"]\n  window \"business\" {\n    kind = \"allow\"\n    schedule = \"0 9 * * 1-5\"\n    timezone = \"Europe/Berlin\"\n    duration = \"8h\"\n  }\n  window \"sale\" {\n    kind = \"deny\"\n    schedule = \"@daily\"\n    duration = \"1h\"\n  }\n}\n",
            MINUTE,
        )?;
        let described: Vec<String> = sources[0]
            .windows
            .iter()
            .map(|rule| format!("{} {}", rule.name, rule.describe()))
            .collect();
        assert_eq!(
            described,
            [
                "business allow 0 9 * * 1-5 8h Europe/Berlin",
                "sale deny @daily 1h UTC"
            ]
        );
        for (window, expected) in [
            (
                "  window \"w\" {\n    kind = \"allow\"\n    schedule = \"0 25 * * *\"\n    duration = \"1h\"\n  }\n",
                "sources.hcl:6:16: source \"a\": window \"w\": window schedule \"0 25 * * *\"",
            ),
            (
                "  window \"w\" {\n    kind = \"allow\"\n    schedule = \"0 9 * * *\"\n    duration = \"soon\"\n  }\n",
                "sources.hcl:7:16: source \"a\": window \"w\": window duration \"soon\"",
            ),
            (
                "  window \"w\" {\n    kind = \"allow\"\n  }\n",
                "sources.hcl:4:3: source \"a\": window \"w\" needs `kind`",
            ),
            (
                "  window \"w\" {\n    kind = \"allow\"\n    schedule = \"0 9 * * *\"\n    duration = \"1h\"\n    zone = \"UTC\"\n  }\n",
                "sources.hcl:8:5: source \"a\": window \"w\": unknown attribute `zone`",
            ),
        ] {
            let got = problems(&format!(
                "source \"a\" {{\n  url = \"/r\"\n  scopes = [\"a\"]\n{window}}}\n"
            ));
            assert!(got.starts_with(expected), "{window}: {got}");
        }
        Ok(())
    }

    #[test]
    fn each_mistake_names_its_line_and_column_and_what_to_write() {
        let cases: &[(&str, &str)] = &[
            (
                "source \"a\" {\n  scopes = [\"a\"]\n}\n",
                "sources.hcl:1:1: source \"a\": `url` is required",
            ),
            (
                "source \"a\" {\n  url = \"/r\"\n}\n",
                "sources.hcl:1:1: source \"a\": `scopes` is required",
            ),
            (
                "source \"a\" {\n  url = \"/r\"\n  scopes = [\"a\"]\n  colour = \"red\"\n}\n",
                "sources.hcl:4:3: source \"a\": unknown attribute `colour`",
            ),
            (
                "source \"a\" {\n  url = \"/r\"\n  scopes = [\"sh*p\"]\n}\n",
                "sources.hcl:3:12: source \"a\": scope pattern \"sh*p\"",
            ),
            (
                "source \"a\" {\n  url = \"/r\"\n  scopes = \"a\"\n}\n",
                "sources.hcl:3:12: source \"a\": `scopes` wants a list of strings",
            ),
            (
                "source \"a\" {\n  url = \"/r\"\n  scopes = [\"a\"]\n  poll = \"soon\"\n}\n",
                "sources.hcl:4:10: source \"a\": poll \"soon\"",
            ),
            (
                "source \"a\" {\n  url = \"/r\"\n  scopes = [\"a\"]\n  token_file = \"rel\"\n}\n",
                "sources.hcl:4:16: source \"a\": `token_file` wants an absolute path",
            ),
            (
                "source \"a\" {\n  url = \"/r\"\n  scopes = [\"a\"]\n}\nsource \"a\" {\n  url = \"/s\"\n  scopes = [\"b\"]\n}\n",
                "sources.hcl:5:1: source \"a\" is declared twice",
            ),
            (
                "source \"a\" {\n  url = \"/r\"\n  scopes = [\"shop-*\"]\n}\nsource \"b\" {\n  url = \"/s\"\n  scopes = [\"shop-web\"]\n}\n",
                "sources.hcl:7:12: sources \"a\" and \"b\" may both deploy scope shop-* / shop-web",
            ),
            (
                "source \"a\" {\n  url = \"/r\"\n  scopes = [\"shop\"]\n}\nsource \"b\" {\n  url = \"/s\"\n  scopes = [\"shop-api\"]\n}\n",
                "sources.hcl:7:12: sources \"a\" and \"b\" own scopes shop and shop-api, where one scope can be the other followed by `-`",
            ),
            (
                "source \"a\" {\n  url = \"/r\"\n  scopes = [\"a\"]\n  network = \"public\"\n}\n",
                "sources.hcl:4:13: source \"a\": network \"public\": write \"own\"",
            ),
            (
                "source \"a\" {\n  url = \"http://h/r\"\n  scopes = [\"a\"]\n  token_file = \"/t\"\n}\n",
                "sources.hcl:4:16: source \"a\": a token would go to http://h/r in clear text",
            ),
            (
                "source \"a\" {\n  url = \"/r\"\n  scopes = [\"a\"]\n  ca_file = \"/nonexistent/ca.pem\"\n}\n",
                "sources.hcl:4:13: source \"a\": --git-ca-file /nonexistent/ca.pem:",
            ),
            (
                "source \"a\" {\n  url = \"/r\"\n  scopes = [\"a\"]\n  ssh_key_file = \"/nonexistent/key\"\n}\n",
                "sources.hcl:4:18: source \"a\": ssh key file /nonexistent/key:",
            ),
            (
                "source \"a\" {\n  url = \"/r\"\n  scopes = [\"a\"]\n  trusted_pgp_keys = \"/k.asc\"\n}\n",
                "sources.hcl:4:3: source \"a\": trusted keys without `verify_commits",
            ),
            (
                "source \"a\" {\n  url = \"/r\"\n  scopes = [\"a\"]\n  verify_commits = \"tip\"\n}\n",
                "sources.hcl:4:20: source \"a\": verify_commits needs the keys",
            ),
            (
                "source \"a\" {\n  url = \"/r\"\n  scopes = [\"a\"]\n  previews {\n    branches = \"preview/*\"\n    host = \"{slug}.p.test\"\n  }\n}\n",
                "sources.hcl:4:3: source \"a\": previews of scope a deploy to scopes a-pr-<slug>, which the source does not own: add \"a-pr-*\" to its `scopes`",
            ),
            (
                "source \"a\" {\n  url = \"/r\"\n  scopes = [\"a\", \"a-pr-*\"]\n  previews {\n    branches = \"preview/*\"\n    host = \"p.test\"\n  }\n}\n",
                "sources.hcl:4:3: previews: host \"p.test\": write a host name holding `{slug}`",
            ),
            (
                "source \"a\" {\n  url = \"/r\"\n  scopes = [\"a\", \"a-pr-*\"]\n  previews {\n    branches = \"preview/*\"\n    host = \"{slug}.p.test\"\n    max = \"3\"\n  }\n}\n",
                "sources.hcl:7:11: source \"a\": previews: `max` wants a number",
            ),
            (
                "source \"a\" {\n  url = \"/r\"\n  scopes = [\"a\", \"a-pr-*\"]\n  previews {\n    branches = \"preview/*\"\n    host = \"{slug}.p.test\"\n    memory = \"512m\"\n  }\n}\n",
                "sources.hcl:7:14: source \"a\": previews: memory \"512m\": write a size",
            ),
            (
                "source \"a\" {\n  url = \"/r\"\n  scopes = [\"a\", \"a-pr-*\"]\n  previews {\n    branches = \"preview/*\"\n    host = \"{slug}.p.test\"\n    policy = \"/nonexistent/preview-policy.json\"\n  }\n}\n",
                "sources.hcl:7:14: source \"a\": previews: policy /nonexistent/preview-policy.json:",
            ),
            ("repo \"a\" {}\n", "sources.hcl:1:1: unknown block `repo`"),
            ("", "sources.hcl:1:1: no source"),
            ("source \"a\" {\n  url = \n}\n", "sources.hcl:2:"),
        ];
        // One source past the most a file may hold: the block that is one too many.
        let many: String = (0..=MAX_SOURCES)
            .map(|n| format!("source \"s{n}\" {{\n  url = \"/r\"\n  scopes = [\"s{n}\"]\n}}\n"))
            .collect();
        let at = MAX_SOURCES * 4 + 1;
        let got = problems(&many);
        assert!(
            got.starts_with(&format!(
                "sources.hcl:{at}:1: {} sources; at most",
                MAX_SOURCES + 1
            )),
            "{got}"
        );
        for (text, expected) in cases {
            let got = problems(text);
            assert!(
                got.contains(expected),
                "for {text:?}\n  got: {got}\n want: {expected}"
            );
        }
    }
}
