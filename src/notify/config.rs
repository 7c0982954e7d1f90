//! The `--notify FILE` configuration: host-local (secrets stay off the repository), HCL like
//! the manifests.
//!
//! ```hcl
//! dashboard_url = "https://deploy.example.com"      # optional: the link statuses carry
//! notify "chat" {
//!   type     = "slack"        # generic | slack | discord | teams | ntfy | gotify | alertmanager
//!   url_file = "/etc/voodu-agent/slack-url"
//!   events   = ["rollout.failed", "commit.rejected"]   # optional: every event when absent
//!   scopes   = ["shop"]       # optional filter
//!   secret_file = "/etc/voodu-agent/hmac"   # generic only: signs the body
//!   interval = "20s"          # optional: after a burst of 3, one message per interval
//! }
//! commit_status "origin" {
//!   provider   = "github"     # github | gitlab | gitea | forgejo | bitbucket
//!   api_url    = "https://api.github.com"
//!   repository = "acme/deploy"
//!   token_file = "/etc/voodu-agent/gh-token"
//!   source     = "shop"       # with --sources: whose commits (that source's repository)
//! }
//! ```
//!
//! Invariants: a secret (a webhook URL, a token, an HMAC key) is read from its file when it is
//! used and never kept in this type, shown, or logged; every mistake names the file's
//! `path:line:col` (of the attribute or value that is wrong, of the block that lacks one, as
//! the manifests' diagnostics: `hcl::edit` spans), the block and what to write instead;
//! names are unique across both block types (they key the sinks' progress in the store).

use std::ops::Range;
use std::path::{Path, PathBuf};

use hcl::edit::Span as _;
use hcl::edit::expr::Expression;
use hcl::edit::structure::{BlockLabel, Body};

use crate::store::EVENTS;

/// A chat or webhook sink's message format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkType {
    Generic,
    Slack,
    Discord,
    Teams,
    Ntfy,
    Gotify,
    Alertmanager,
}

impl SinkType {
    const ALL: &'static str = "generic, slack, discord, teams, ntfy, gotify, alertmanager";

    fn parse(text: &str) -> Option<SinkType> {
        Some(match text {
            "generic" => SinkType::Generic,
            "slack" => SinkType::Slack,
            "discord" => SinkType::Discord,
            "teams" => SinkType::Teams,
            "ntfy" => SinkType::Ntfy,
            "gotify" => SinkType::Gotify,
            "alertmanager" => SinkType::Alertmanager,
            _ => return None,
        })
    }
}

/// A git host whose commit status API is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    Github,
    Gitlab,
    Gitea,
    Forgejo,
    Bitbucket,
}

impl Provider {
    const ALL: &'static str = "github, gitlab, gitea, forgejo, bitbucket";

    fn parse(text: &str) -> Option<Provider> {
        Some(match text {
            "github" => Provider::Github,
            "gitlab" => Provider::Gitlab,
            "gitea" => Provider::Gitea,
            "forgejo" => Provider::Forgejo,
            "bitbucket" => Provider::Bitbucket,
            _ => return None,
        })
    }
}

/// What a sink is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A chat or webhook message.
    Message {
        kind: SinkType,
        url_file: PathBuf,
        secret_file: Option<PathBuf>,
    },
    /// A commit status on the git host.
    CommitStatus {
        provider: Provider,
        api_url: String,
        repository: String,
        token_file: PathBuf,
        /// With `--sources`: the source whose commits it reports (`repository` is that
        /// source's); `None` with `--repo`, where there is one.
        source: Option<String>,
    },
}

/// One configured sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sink {
    pub name: String,
    pub target: Target,
    /// Events it is told; empty: every event.
    pub events: Vec<String>,
    /// Scopes it is told about (events of no resource always pass); empty: every scope.
    pub scopes: Vec<String>,
    /// After a burst of messages, at most one per this (events meanwhile go out together).
    pub interval: std::time::Duration,
    /// Line and column of its block in the file, and of its `source` (for `check_sources`).
    pub(crate) at: (usize, usize),
    pub(crate) source_at: Option<(usize, usize)>,
}

impl Sink {
    /// Whether this sink is told of an event named `event` about `scope`.
    pub(crate) fn wants(&self, event: &str, scope: &str) -> bool {
        (self.events.is_empty() || self.events.iter().any(|wanted| wanted == event))
            && (self.scopes.is_empty()
                || scope.is_empty()
                || self.scopes.iter().any(|wanted| wanted == scope))
    }
}

/// The whole file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NotifyConfig {
    pub dashboard_url: Option<String>,
    pub sinks: Vec<Sink>,
    /// The file's name, as its errors show it.
    pub(crate) path: String,
}

/// A sink's message interval unless it says otherwise.
const DEFAULT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(20);
const MIN_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);
const MAX_INTERVAL: std::time::Duration = std::time::Duration::from_secs(3600);

/// Most sinks one file may declare.
const MAX_SINKS: usize = 32;
/// Longest file read.
const MAX_FILE_BYTES: u64 = 256 * 1024;

/// Why the file cannot be used: `path:line:col: message`, as the manifests' diagnostics (a
/// problem of the whole file, such as one that cannot be read, points at `1:1`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}:{line}:{col}: {message}")]
pub struct ConfigError {
    path: String,
    line: usize,
    col: usize,
    message: String,
}

/// A commit status sink that does not fit the sources the agent follows, at the sink's
/// `path:line:col` (of its block, or of its `source`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}:{line}:{col}: commit_status \"{sink}\": {mistake}")]
pub struct SourcesError {
    path: String,
    line: usize,
    col: usize,
    sink: String,
    mistake: SourceMistake,
}

/// What is wrong with a commit status sink's `source`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SourceMistake {
    #[error("source = {0:?}, but the agent follows one repository (--repo): remove `source`")]
    OneRepository(String),
    #[error(
        "the agent follows several repositories (--sources): say which source's commits go to `{repository}`, e.g. source = \"{first}\""
    )]
    Unnamed { repository: String, first: String },
    #[error("source = {named:?} is not a source the agent follows ({})", sources.join(", "))]
    Unknown { named: String, sources: Vec<String> },
}

/// A mistake at a byte offset of the text, before the file's name and the line are known.
#[derive(Debug)]
struct Problem {
    offset: usize,
    message: String,
}

type Checked<T> = Result<T, Problem>;

fn problem(span: Option<Range<usize>>, message: String) -> Problem {
    Problem {
        offset: span.map_or(0, |span| span.start),
        message,
    }
}

impl NotifyConfig {
    /// Reads and checks `path`.
    pub fn load(path: &Path) -> Result<NotifyConfig, ConfigError> {
        let shown = path.display().to_string();
        let whole = |message: String| ConfigError {
            path: shown.clone(),
            line: 1,
            col: 1,
            message,
        };
        let size = std::fs::metadata(path)
            .map_err(|e| whole(format!("cannot read it: {e}")))?
            .len();
        if size > MAX_FILE_BYTES {
            return Err(whole(format!(
                "{size} bytes; a notify file holds at most {MAX_FILE_BYTES}"
            )));
        }
        let text =
            std::fs::read_to_string(path).map_err(|e| whole(format!("cannot read it: {e}")))?;
        NotifyConfig::parse(&shown, &text)
    }

    /// Checks the text of a notify file named `path` (for the errors).
    pub fn parse(path: &str, text: &str) -> Result<NotifyConfig, ConfigError> {
        let located = |offset: usize, message: String| {
            let (line, col) = line_col(text, offset);
            ConfigError {
                path: path.to_owned(),
                line,
                col,
                message,
            }
        };
        let body = hcl::edit::parser::parse_body(text).map_err(|error| {
            located(
                error.location().offset(),
                format!("not valid HCL: {}", error.message()),
            )
        })?;
        let mut config =
            read_body(text, &body).map_err(|problem| located(problem.offset, problem.message))?;
        config.path = path.to_owned();
        Ok(config)
    }

    /// Checks the commit status sinks against the sources the agent follows (`sources`: their
    /// names; `[""]` for `--repo`): with several repositories each sink names the source whose
    /// commits it reports, as a commit's status goes to the repository that holds it. A
    /// mistake names the file's `path:line:col` of the block or of its `source`.
    pub fn check_sources(&self, sources: &[String]) -> Result<(), SourcesError> {
        let single = sources.iter().all(String::is_empty);
        for sink in &self.sinks {
            let Target::CommitStatus {
                repository, source, ..
            } = &sink.target
            else {
                continue;
            };
            let at = |(line, col): (usize, usize), mistake: SourceMistake| SourcesError {
                path: self.path.clone(),
                line,
                col,
                sink: sink.name.clone(),
                mistake,
            };
            let source_at = sink.source_at.unwrap_or(sink.at);
            match (single, source) {
                (true, None) => {}
                (true, Some(source)) => {
                    return Err(at(source_at, SourceMistake::OneRepository(source.clone())));
                }
                (false, None) => {
                    return Err(at(
                        sink.at,
                        SourceMistake::Unnamed {
                            repository: repository.clone(),
                            first: sources.first().cloned().unwrap_or_default(),
                        },
                    ));
                }
                (false, Some(source)) if !sources.contains(source) => {
                    return Err(at(
                        source_at,
                        SourceMistake::Unknown {
                            named: source.clone(),
                            sources: sources.to_vec(),
                        },
                    ));
                }
                (false, Some(_)) => {}
            }
        }
        Ok(())
    }

    /// The sink called `name`.
    pub fn sink(&self, name: &str) -> Option<&Sink> {
        self.sinks.iter().find(|sink| sink.name == name)
    }
}

/// 1-based line and column (in characters) of byte `offset` of `text`.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line_start = before.rfind('\n').map_or(0, |newline| newline + 1);
    (
        before.matches('\n').count() + 1,
        before[line_start..].chars().count() + 1,
    )
}

fn read_body(text: &str, body: &Body) -> Checked<NotifyConfig> {
    let mut config = NotifyConfig::default();
    for attribute in body.attributes() {
        match attribute.key.as_str() {
            "dashboard_url" => {
                let value = &attribute.value;
                let url = string(value).ok_or_else(|| {
                    problem(value.span(), "dashboard_url: want a string".to_owned())
                })?;
                check_http_url(&url)
                    .map_err(|e| problem(value.span(), format!("dashboard_url: {e}")))?;
                config.dashboard_url = Some(url.trim_end_matches('/').to_owned());
            }
            other => {
                return Err(problem(
                    attribute.key.span(),
                    format!(
                        "unknown attribute `{other}` (a notify file has `dashboard_url`, `notify` and `commit_status` blocks)"
                    ),
                ));
            }
        }
    }
    for block in body.blocks() {
        let identifier = block.ident.as_str();
        let [label] = block.labels.as_slice() else {
            return Err(problem(
                block.ident.span(),
                format!(
                    "`{identifier}` block: want one name, e.g. `{identifier} \"chat\" {{ … }}`"
                ),
            ));
        };
        let name = match label {
            BlockLabel::String(text) => text.as_str(),
            BlockLabel::Ident(ident) => ident.as_str(),
        }
        .to_owned();
        let at = format!("{identifier} \"{name}\"");
        if name.is_empty()
            || name.len() > 64
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(problem(
                label.span(),
                format!("{at}: a name is 1 to 64 letters, digits, `-` or `_`"),
            ));
        }
        if config.sinks.iter().any(|sink| sink.name == name) {
            return Err(problem(
                label.span(),
                format!("{at}: the name is used twice"),
            ));
        }
        let fields = Fields {
            body: &block.body,
            at: &at,
            block_span: block.ident.span(),
            known: &[],
        };
        let mut sink = match identifier {
            "notify" => message_sink(fields, name)?,
            "commit_status" => status_sink(fields, name)?,
            other => {
                return Err(problem(
                    block.ident.span(),
                    format!("unknown block `{other}` (want `notify` or `commit_status`)"),
                ));
            }
        };
        sink.at = line_col(text, block.ident.span().map_or(0, |span| span.start));
        sink.source_at = block
            .body
            .attributes()
            .find(|attribute| attribute.key.as_str() == "source")
            .and_then(|attribute| attribute.value.span())
            .map(|span| line_col(text, span.start));
        config.sinks.push(sink);
        if config.sinks.len() > MAX_SINKS {
            return Err(problem(
                block.ident.span(),
                format!("more than {MAX_SINKS} sinks; at most {MAX_SINKS}"),
            ));
        }
    }
    Ok(config)
}

/// The attributes of one block, each read once.
struct Fields<'a> {
    body: &'a Body,
    at: &'a str,
    /// The block's identifier: where a missing attribute is reported.
    block_span: Option<Range<usize>>,
    known: &'static [&'static str],
}

impl Fields<'_> {
    fn check_known(&self) -> Checked<()> {
        for attribute in self.body.attributes() {
            if !self.known.contains(&attribute.key.as_str()) {
                return Err(problem(
                    attribute.key.span(),
                    format!(
                        "{}: unknown attribute `{}` (known: {})",
                        self.at,
                        attribute.key.as_str(),
                        self.known.join(", ")
                    ),
                ));
            }
        }
        if let Some(block) = self.body.blocks().next() {
            return Err(problem(
                block.ident.span(),
                format!("{}: unexpected block `{}`", self.at, block.ident.as_str()),
            ));
        }
        Ok(())
    }

    fn get(&self, key: &str) -> Option<&Expression> {
        self.body
            .attributes()
            .find(|attribute| attribute.key.as_str() == key)
            .map(|attribute| &attribute.value)
    }

    /// Where the value of `key` is (the block when it is absent).
    fn span(&self, key: &str) -> Option<Range<usize>> {
        self.get(key)
            .and_then(Expression::span)
            .or_else(|| self.block_span.clone())
    }

    /// A mistake in the value of `key`.
    fn wrong(&self, key: &str, message: String) -> Problem {
        problem(self.span(key), format!("{}: {message}", self.at))
    }

    fn string(&self, key: &str) -> Checked<Option<String>> {
        match self.get(key) {
            None => Ok(None),
            Some(expr) => string(expr)
                .map(Some)
                .ok_or_else(|| self.wrong(key, format!("`{key}` wants a string"))),
        }
    }

    fn required(&self, key: &str, example: &str) -> Checked<String> {
        self.string(key)?
            .filter(|value| !value.is_empty())
            .ok_or_else(|| {
                self.wrong(
                    key,
                    format!("`{key}` is required, e.g. `{key} = {example}`"),
                )
            })
    }

    fn strings(&self, key: &str) -> Checked<Vec<(String, Option<Range<usize>>)>> {
        let Some(expr) = self.get(key) else {
            return Ok(Vec::new());
        };
        let Expression::Array(items) = expr else {
            return Err(self.wrong(key, format!("`{key}` wants a list of strings")));
        };
        items
            .iter()
            .map(|item| {
                string(item).map(|text| (text, item.span())).ok_or_else(|| {
                    problem(
                        item.span(),
                        format!("{}: `{key}` wants a list of strings", self.at),
                    )
                })
            })
            .collect()
    }

    fn file(&self, key: &str) -> Checked<PathBuf> {
        let path = self.required(key, "\"/etc/voodu-agent/…\"")?;
        let path = PathBuf::from(path);
        if !path.is_absolute() {
            return Err(self.wrong(
                key,
                format!("`{key}` wants an absolute path, got {}", path.display()),
            ));
        }
        Ok(path)
    }

    fn interval(&self) -> Checked<std::time::Duration> {
        let Some(text) = self.string("interval")? else {
            return Ok(DEFAULT_INTERVAL);
        };
        let interval = crate::model::parse_go_duration(&text).ok_or_else(|| {
            self.wrong(
                "interval",
                format!("interval `{text}` is not a duration (e.g. \"20s\")"),
            )
        })?;
        if !(MIN_INTERVAL..=MAX_INTERVAL).contains(&interval) {
            return Err(self.wrong("interval", format!("interval {text} is outside 1s to 1h")));
        }
        Ok(interval)
    }

    fn filters(&self) -> Checked<(Vec<String>, Vec<String>)> {
        let mut events = Vec::new();
        for (event, span) in self.strings("events")? {
            if !EVENTS.contains(&event.as_str()) {
                return Err(problem(
                    span,
                    format!(
                        "{}: unknown event `{event}` (known: {})",
                        self.at,
                        EVENTS.join(", ")
                    ),
                ));
            }
            events.push(event);
        }
        let scopes = self
            .strings("scopes")?
            .into_iter()
            .map(|(scope, _)| scope)
            .collect();
        Ok((events, scopes))
    }
}

fn message_sink(fields: Fields<'_>, name: String) -> Checked<Sink> {
    let fields = Fields {
        known: &[
            "type",
            "url_file",
            "secret_file",
            "events",
            "scopes",
            "interval",
        ],
        ..fields
    };
    fields.check_known()?;
    let kind = fields.required("type", "\"slack\"")?;
    let kind = SinkType::parse(&kind).ok_or_else(|| {
        fields.wrong(
            "type",
            format!("type `{kind}` is not one of {}", SinkType::ALL),
        )
    })?;
    let secret_file = match fields.get("secret_file") {
        None => None,
        Some(_) if kind != SinkType::Generic => {
            return Err(fields.wrong(
                "secret_file",
                "`secret_file` signs the body of a `generic` sink only".to_owned(),
            ));
        }
        Some(_) => Some(fields.file("secret_file")?),
    };
    let (events, scopes) = fields.filters()?;
    Ok(Sink {
        name,
        target: Target::Message {
            kind,
            url_file: fields.file("url_file")?,
            secret_file,
        },
        events,
        scopes,
        interval: fields.interval()?,
        at: (0, 0),
        source_at: None,
    })
}

fn status_sink(fields: Fields<'_>, name: String) -> Checked<Sink> {
    let fields = Fields {
        known: &[
            "provider",
            "api_url",
            "repository",
            "token_file",
            "source",
            "scopes",
            "interval",
        ],
        ..fields
    };
    fields.check_known()?;
    let provider = fields.required("provider", "\"github\"")?;
    let provider = Provider::parse(&provider).ok_or_else(|| {
        fields.wrong(
            "provider",
            format!("provider `{provider}` is not one of {}", Provider::ALL),
        )
    })?;
    let api_url = fields.required("api_url", "\"https://api.github.com\"")?;
    check_http_url(&api_url).map_err(|e| fields.wrong("api_url", format!("api_url: {e}")))?;
    let repository = fields.required("repository", "\"acme/deploy\"")?;
    let parts: Vec<&str> = repository.split('/').collect();
    let well_formed = parts.len() >= 2
        && parts.iter().all(|part| {
            !part.is_empty()
                && part != &".."
                && part
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        });
    if !well_formed {
        return Err(fields.wrong(
            "repository",
            format!("repository `{repository}` wants `owner/name` (GitLab: `group/…/project`)"),
        ));
    }
    let (_, scopes) = fields.filters()?;
    Ok(Sink {
        name,
        target: Target::CommitStatus {
            provider,
            api_url: api_url.trim_end_matches('/').to_owned(),
            repository,
            token_file: fields.file("token_file")?,
            source: fields.string("source")?,
        },
        events: Vec::new(),
        scopes,
        interval: fields.interval()?,
        at: (0, 0),
        source_at: None,
    })
}

fn string(expr: &Expression) -> Option<String> {
    match expr {
        Expression::String(text) => Some(text.as_str().to_owned()),
        _ => None,
    }
}

/// A URL the file gives that no request can go to.
#[derive(Debug, thiserror::Error)]
enum UrlError {
    #[error("`{url}` is not a URL: {source}")]
    NotUrl {
        url: String,
        #[source]
        source: <reqwest::Url as std::str::FromStr>::Err,
    },
    #[error("`{0}` wants http:// or https:// and a host")]
    NotHttp(String),
}

fn check_http_url(url: &str) -> Result<(), UrlError> {
    let parsed = reqwest::Url::parse(url).map_err(|source| UrlError::NotUrl {
        url: url.to_owned(),
        source,
    })?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err(UrlError::NotHttp(url.to_owned()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_issue_example_parses() -> Result<(), ConfigError> {
        let config = NotifyConfig::parse(
            "notify.hcl",
            r#"
            notify "chat" {
              type     = "slack"
              url_file = "/etc/voodu-agent/slack-url"
              events   = ["rollout.failed", "rollout.rolled_back", "commit.rejected", "fetch.failing"]
              scopes   = ["shop"]
            }
            commit_status "origin" {
              provider   = "github"
              api_url    = "https://api.github.com/"
              repository = "acme/deploy"
              token_file = "/etc/voodu-agent/gh-token"
            }
            "#,
        )?;
        assert_eq!(config.sinks.len(), 2);
        let chat = config.sink("chat").expect("chat is declared");
        assert!(chat.wants("rollout.failed", "shop"));
        assert!(!chat.wants("rollout.failed", "other"));
        assert!(
            chat.wants("fetch.failing", ""),
            "events of no resource pass the scope filter"
        );
        assert!(!chat.wants("commit.applied", "shop"));
        assert_eq!(
            config.sink("origin").map(|sink| &sink.target),
            Some(&Target::CommitStatus {
                provider: Provider::Github,
                api_url: "https://api.github.com".into(),
                repository: "acme/deploy".into(),
                token_file: "/etc/voodu-agent/gh-token".into(),
                source: None,
            })
        );
        Ok(())
    }

    /// Issue 47: each kind of mistake names the `path:line:col` of what is wrong (the value,
    /// the attribute, the block lacking one), the block, and what to write.
    #[test]
    fn each_mistake_names_its_line_and_column_and_what_to_write() {
        let types = SinkType::ALL;
        let events = EVENTS.join(", ");
        let cases: Vec<(&str, String)> = vec![
            (
                "notify \"a\" {\n  type = \"irc\"\n  url_file = \"/x\"\n}\n",
                format!("notify.hcl:2:10: notify \"a\": type `irc` is not one of {types}"),
            ),
            (
                "# chat\nnotify \"a\" {\n  type = \"slack\"\n}\n",
                "notify.hcl:2:1: notify \"a\": `url_file` is required, e.g. `url_file = \"/etc/voodu-agent/…\"`".to_owned(),
            ),
            (
                "notify \"a\" {\n  type = \"slack\"\n  url_file = \"x\"\n}\n",
                "notify.hcl:3:14: notify \"a\": `url_file` wants an absolute path, got x".to_owned(),
            ),
            (
                "notify \"a\" {\n  type = \"slack\"\n  url_file = \"/x\"\n  events = [\"commit.applied\", \"rollout.oops\"]\n}\n",
                format!("notify.hcl:4:31: notify \"a\": unknown event `rollout.oops` (known: {events})"),
            ),
            (
                "notify \"a\" {\n  type = \"slack\"\n  url_file = \"/x\"\n  scopes = \"shop\"\n}\n",
                "notify.hcl:4:12: notify \"a\": `scopes` wants a list of strings".to_owned(),
            ),
            (
                "notify \"a\" {\n  type = \"slack\"\n  url_file = 5\n}\n",
                "notify.hcl:3:14: notify \"a\": `url_file` wants a string".to_owned(),
            ),
            (
                "notify \"a\" {\n  type = \"slack\"\n  url_file = \"/x\"\n  secret_file = \"/k\"\n}\n",
                "notify.hcl:4:17: notify \"a\": `secret_file` signs the body of a `generic` sink only".to_owned(),
            ),
            (
                "notify \"a\" {\n  type = \"slack\"\n  url = \"https://hooks\"\n}\n",
                "notify.hcl:3:3: notify \"a\": unknown attribute `url` (known: type, url_file, secret_file, events, scopes, interval)".to_owned(),
            ),
            (
                "notify \"a\" {\n  type = \"slack\"\n  url_file = \"/x\"\n  retry {}\n}\n",
                "notify.hcl:4:3: notify \"a\": unexpected block `retry`".to_owned(),
            ),
            (
                "notify \"a\" {\n  type = \"slack\"\n  url_file = \"/x\"\n  interval = \"10ms\"\n}\n",
                "notify.hcl:4:14: notify \"a\": interval 10ms is outside 1s to 1h".to_owned(),
            ),
            (
                "notify \"a\" {\n  type = \"slack\"\n  url_file = \"/x\"\n  interval = \"soon\"\n}\n",
                "notify.hcl:4:14: notify \"a\": interval `soon` is not a duration (e.g. \"20s\")".to_owned(),
            ),
            (
                "notify \"a\" {\n  type = \"slack\"\n  url_file = \"/x\"\n}\nnotify \"a\" {\n  type = \"slack\"\n  url_file = \"/y\"\n}\n",
                "notify.hcl:5:8: notify \"a\": the name is used twice".to_owned(),
            ),
            (
                "notify \"a b\" {\n  type = \"slack\"\n  url_file = \"/x\"\n}\n",
                "notify.hcl:1:8: notify \"a b\": a name is 1 to 64 letters, digits, `-` or `_`".to_owned(),
            ),
            (
                "\nnotify {\n  type = \"slack\"\n}\n",
                "notify.hcl:2:1: `notify` block: want one name, e.g. `notify \"chat\" { … }`".to_owned(),
            ),
            (
                "commit_status \"o\" {\n  provider = \"github\"\n  api_url = \"https://x\"\n  repository = \"../etc\"\n  token_file = \"/t\"\n}\n",
                "notify.hcl:4:16: commit_status \"o\": repository `../etc` wants `owner/name` (GitLab: `group/…/project`)".to_owned(),
            ),
            (
                "commit_status \"o\" {\n  provider = \"svn\"\n  api_url = \"https://x\"\n  repository = \"a/b\"\n  token_file = \"/t\"\n}\n",
                "notify.hcl:2:14: commit_status \"o\": provider `svn` is not one of github, gitlab, gitea, forgejo, bitbucket".to_owned(),
            ),
            (
                "commit_status \"o\" {\n  provider = \"github\"\n  api_url = \"ftp://x\"\n  repository = \"a/b\"\n  token_file = \"/t\"\n}\n",
                "notify.hcl:3:13: commit_status \"o\": api_url: `ftp://x` wants http:// or https:// and a host".to_owned(),
            ),
            (
                "\n\nmail \"a\" {}\n",
                "notify.hcl:3:1: unknown block `mail` (want `notify` or `commit_status`)".to_owned(),
            ),
            (
                "\ndashboard_url = \"deploy\"\n",
                "notify.hcl:2:17: dashboard_url: `deploy` is not a URL: relative URL without a base".to_owned(),
            ),
            (
                "colour = \"red\"\n",
                "notify.hcl:1:1: unknown attribute `colour` (a notify file has `dashboard_url`, `notify` and `commit_status` blocks)".to_owned(),
            ),
        ];
        for (text, wanted) in &cases {
            match NotifyConfig::parse("notify.hcl", text) {
                Ok(_) => panic!("accepted:\n{text}"),
                Err(error) => assert_eq!(&error.to_string(), wanted, "\n{text}"),
            }
        }
        // A syntax error: where the parser stopped.
        let error = NotifyConfig::parse("notify.hcl", "notify \"a\" {\n  type = \n}\n")
            .expect_err("not HCL")
            .to_string();
        assert!(error.starts_with("notify.hcl:2:"), "{error}");
        assert!(error.contains(": not valid HCL: "), "{error}");
    }

    /// With several repositories a commit status sink names its source (a commit's status
    /// goes to the repository holding it); with `--repo` it names none. A mistake names the
    /// block, or its `source`, by line and column.
    #[test]
    fn commit_status_sinks_name_their_source_when_there_are_several() -> Result<(), ConfigError> {
        let parse = |source: &str| {
            NotifyConfig::parse(
                "notify.hcl",
                &format!(
                    "# origin\ncommit_status \"origin\" {{\n  provider = \"github\"\n  api_url = \"https://api.github.com\"\n  repository = \"acme/shop\"\n  token_file = \"/t\"\n  {source}\n}}\n"
                ),
            )
        };
        let named = parse(r#"source = "shop""#)?;
        let unnamed = parse("")?;
        let gone = parse(r#"source = "gone""#)?;
        let several = ["shop".to_owned(), "blog".to_owned()];
        let single = [String::new()];
        assert_eq!(named.check_sources(&several), Ok(()));
        assert_eq!(unnamed.check_sources(&single), Ok(()));
        let check = |config: &NotifyConfig, sources: &[String]| {
            config
                .check_sources(sources)
                .map_err(|error| error.to_string())
        };
        assert_eq!(
            check(&unnamed, &several),
            Err("notify.hcl:2:1: commit_status \"origin\": the agent follows several repositories (--sources): say which source's commits go to `acme/shop`, e.g. source = \"shop\"".to_owned())
        );
        assert_eq!(
            check(&named, &single),
            Err("notify.hcl:7:12: commit_status \"origin\": source = \"shop\", but the agent follows one repository (--repo): remove `source`".to_owned())
        );
        assert_eq!(
            check(&gone, &several),
            Err("notify.hcl:7:12: commit_status \"origin\": source = \"gone\" is not a source the agent follows (shop, blog)".to_owned())
        );
        Ok(())
    }
}
