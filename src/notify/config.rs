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
//! used and never kept in this type, shown, or logged; every mistake names the file, the
//! block and what to write instead; names are unique across both block types (they key the
//! sinks' progress in the store).

use std::path::{Path, PathBuf};

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
}

/// A sink's message interval unless it says otherwise.
const DEFAULT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(20);
const MIN_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);
const MAX_INTERVAL: std::time::Duration = std::time::Duration::from_secs(3600);

/// Most sinks one file may declare.
const MAX_SINKS: usize = 32;
/// Longest file read.
const MAX_FILE_BYTES: u64 = 256 * 1024;

/// Why the file cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub struct ConfigError {
    path: String,
    message: String,
}

impl NotifyConfig {
    /// Reads and checks `path`.
    pub fn load(path: &Path) -> Result<NotifyConfig, ConfigError> {
        let error = |message: String| ConfigError {
            path: path.display().to_string(),
            message,
        };
        let size = std::fs::metadata(path)
            .map_err(|e| error(format!("cannot read it: {e}")))?
            .len();
        if size > MAX_FILE_BYTES {
            return Err(error(format!(
                "{size} bytes; a notify file holds at most {MAX_FILE_BYTES}"
            )));
        }
        let text =
            std::fs::read_to_string(path).map_err(|e| error(format!("cannot read it: {e}")))?;
        NotifyConfig::parse(&text).map_err(error)
    }

    /// Checks the text of a notify file.
    pub fn parse(text: &str) -> Result<NotifyConfig, String> {
        let body: hcl::Body = hcl::from_str(text).map_err(|e| format!("not valid HCL: {e}"))?;
        let mut config = NotifyConfig::default();
        for attribute in body.attributes() {
            match attribute.key() {
                "dashboard_url" => {
                    let url = string(attribute.expr()).ok_or("dashboard_url: want a string")?;
                    check_http_url(&url).map_err(|e| format!("dashboard_url: {e}"))?;
                    config.dashboard_url = Some(url.trim_end_matches('/').to_owned());
                }
                other => {
                    return Err(format!(
                        "unknown attribute `{other}` (a notify file has `dashboard_url`, `notify` and `commit_status` blocks)"
                    ));
                }
            }
        }
        for block in body.blocks() {
            let [label] = block.labels() else {
                return Err(format!(
                    "`{}` block: want one name, e.g. `{} \"chat\" {{ … }}`",
                    block.identifier(),
                    block.identifier()
                ));
            };
            let name = label.as_str().to_owned();
            let at = format!("{} \"{name}\"", block.identifier());
            if name.is_empty()
                || name.len() > 64
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return Err(format!(
                    "{at}: a name is 1 to 64 letters, digits, `-` or `_`"
                ));
            }
            if config.sinks.iter().any(|sink| sink.name == name) {
                return Err(format!("{at}: the name is used twice"));
            }
            let sink = match block.identifier() {
                "notify" => message_sink(&block.body, name, &at)?,
                "commit_status" => status_sink(&block.body, name, &at)?,
                other => {
                    return Err(format!(
                        "unknown block `{other}` (want `notify` or `commit_status`)"
                    ));
                }
            };
            config.sinks.push(sink);
        }
        if config.sinks.len() > MAX_SINKS {
            return Err(format!("{} sinks; at most {MAX_SINKS}", config.sinks.len()));
        }
        Ok(config)
    }

    /// Checks the commit status sinks against the sources the agent follows (`sources`: their
    /// names; `[""]` for `--repo`): with several repositories each sink names the source whose
    /// commits it reports, as a commit's status goes to the repository that holds it.
    pub fn check_sources(&self, sources: &[String]) -> Result<(), String> {
        let single = sources.iter().all(String::is_empty);
        for sink in &self.sinks {
            let Target::CommitStatus {
                repository, source, ..
            } = &sink.target
            else {
                continue;
            };
            let at = format!("commit_status \"{}\"", sink.name);
            match (single, source) {
                (true, None) => {}
                (true, Some(source)) => {
                    return Err(format!(
                        "{at}: source = {source:?}, but the agent follows one repository (--repo): remove `source`"
                    ));
                }
                (false, None) => {
                    return Err(format!(
                        "{at}: the agent follows several repositories (--sources): say which source's commits go to `{repository}`, e.g. source = \"{}\"",
                        sources.first().map(String::as_str).unwrap_or_default()
                    ));
                }
                (false, Some(source)) if !sources.contains(source) => {
                    return Err(format!(
                        "{at}: source = {source:?} is not a source the agent follows ({})",
                        sources.join(", ")
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

/// The attributes of one block, each read once.
struct Fields<'a> {
    body: &'a hcl::Body,
    at: &'a str,
    known: &'static [&'static str],
}

impl Fields<'_> {
    fn check_known(&self) -> Result<(), String> {
        for attribute in self.body.attributes() {
            if !self.known.contains(&attribute.key()) {
                return Err(format!(
                    "{}: unknown attribute `{}` (known: {})",
                    self.at,
                    attribute.key(),
                    self.known.join(", ")
                ));
            }
        }
        if let Some(block) = self.body.blocks().next() {
            return Err(format!(
                "{}: unexpected block `{}`",
                self.at,
                block.identifier()
            ));
        }
        Ok(())
    }

    fn get(&self, key: &str) -> Option<&hcl::Expression> {
        self.body
            .attributes()
            .find(|attribute| attribute.key() == key)
            .map(hcl::Attribute::expr)
    }

    fn string(&self, key: &str) -> Result<Option<String>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(expr) => string(expr)
                .map(Some)
                .ok_or_else(|| format!("{}: `{key}` wants a string", self.at)),
        }
    }

    fn required(&self, key: &str, example: &str) -> Result<String, String> {
        self.string(key)?
            .filter(|value| !value.is_empty())
            .ok_or_else(|| format!("{}: `{key}` is required, e.g. `{key} = {example}`", self.at))
    }

    fn strings(&self, key: &str) -> Result<Vec<String>, String> {
        let Some(expr) = self.get(key) else {
            return Ok(Vec::new());
        };
        let hcl::Expression::Array(items) = expr else {
            return Err(format!("{}: `{key}` wants a list of strings", self.at));
        };
        items
            .iter()
            .map(|item| {
                string(item).ok_or_else(|| format!("{}: `{key}` wants a list of strings", self.at))
            })
            .collect()
    }

    fn file(&self, key: &str) -> Result<PathBuf, String> {
        let path = self.required(key, "\"/etc/voodu-agent/…\"")?;
        let path = PathBuf::from(path);
        if !path.is_absolute() {
            return Err(format!(
                "{}: `{key}` wants an absolute path, got {}",
                self.at,
                path.display()
            ));
        }
        Ok(path)
    }

    fn interval(&self) -> Result<std::time::Duration, String> {
        let Some(text) = self.string("interval")? else {
            return Ok(DEFAULT_INTERVAL);
        };
        let interval = crate::model::parse_go_duration(&text).ok_or_else(|| {
            format!(
                "{}: interval `{text}` is not a duration (e.g. \"20s\")",
                self.at
            )
        })?;
        if !(MIN_INTERVAL..=MAX_INTERVAL).contains(&interval) {
            return Err(format!("{}: interval {text} is outside 1s to 1h", self.at));
        }
        Ok(interval)
    }

    fn filters(&self) -> Result<(Vec<String>, Vec<String>), String> {
        let events = self.strings("events")?;
        for event in &events {
            if !EVENTS.contains(&event.as_str()) {
                return Err(format!(
                    "{}: unknown event `{event}` (known: {})",
                    self.at,
                    EVENTS.join(", ")
                ));
            }
        }
        Ok((events, self.strings("scopes")?))
    }
}

fn message_sink(body: &hcl::Body, name: String, at: &str) -> Result<Sink, String> {
    let fields = Fields {
        body,
        at,
        known: &[
            "type",
            "url_file",
            "secret_file",
            "events",
            "scopes",
            "interval",
        ],
    };
    fields.check_known()?;
    let kind = fields.required("type", "\"slack\"")?;
    let kind = SinkType::parse(&kind)
        .ok_or_else(|| format!("{at}: type `{kind}` is not one of {}", SinkType::ALL))?;
    let secret_file = match fields.get("secret_file") {
        None => None,
        Some(_) if kind != SinkType::Generic => {
            return Err(format!(
                "{at}: `secret_file` signs the body of a `generic` sink only"
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
    })
}

fn status_sink(body: &hcl::Body, name: String, at: &str) -> Result<Sink, String> {
    let fields = Fields {
        body,
        at,
        known: &[
            "provider",
            "api_url",
            "repository",
            "token_file",
            "source",
            "scopes",
            "interval",
        ],
    };
    fields.check_known()?;
    let provider = fields.required("provider", "\"github\"")?;
    let provider = Provider::parse(&provider).ok_or_else(|| {
        format!(
            "{at}: provider `{provider}` is not one of {}",
            Provider::ALL
        )
    })?;
    let api_url = fields.required("api_url", "\"https://api.github.com\"")?;
    check_http_url(&api_url).map_err(|e| format!("{at}: api_url: {e}"))?;
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
        return Err(format!(
            "{at}: repository `{repository}` wants `owner/name` (GitLab: `group/…/project`)"
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
    })
}

fn string(expr: &hcl::Expression) -> Option<String> {
    match expr {
        hcl::Expression::String(text) => Some(text.clone()),
        _ => None,
    }
}

fn check_http_url(url: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("`{url}` is not a URL: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err(format!("`{url}` wants http:// or https:// and a host"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_issue_example_parses_and_mistakes_name_the_block_and_the_fix() {
        let config = NotifyConfig::parse(
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
        )
        .expect("the issue's example");
        assert_eq!(config.sinks.len(), 2);
        let chat = config.sink("chat").expect("chat");
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
        for (text, wanted) in [
            (
                r#"notify "a" { type = "irc"  url_file = "/x" }"#,
                "notify \"a\": type `irc` is not one of generic, slack",
            ),
            (
                r#"notify "a" { type = "slack" }"#,
                "notify \"a\": `url_file` is required",
            ),
            (
                r#"notify "a" { type = "slack"  url_file = "x" }"#,
                "wants an absolute path",
            ),
            (
                r#"notify "a" { type = "slack"  url_file = "/x"  events = ["rollout.oops"] }"#,
                "unknown event `rollout.oops`",
            ),
            (
                r#"notify "a" { type = "slack"  url_file = "/x"  secret_file = "/k" }"#,
                "`generic` sink only",
            ),
            (
                r#"notify "a" { type = "slack"  url = "https://hooks" }"#,
                "unknown attribute `url`",
            ),
            (
                r#"notify "a" { type = "slack"  url_file = "/x" }
                notify "a" { type = "slack"  url_file = "/y" }"#,
                "the name is used twice",
            ),
            (
                r#"commit_status "o" { provider = "github"  api_url = "https://x"  repository = "../etc"  token_file = "/t" }"#,
                "wants `owner/name`",
            ),
            (
                r#"commit_status "o" { provider = "svn"  api_url = "https://x"  repository = "a/b"  token_file = "/t" }"#,
                "provider `svn`",
            ),
            (r#"mail "a" {}"#, "unknown block `mail`"),
            (
                r#"notify "a" { type = "slack"  url_file = "/x"  interval = "10ms" }"#,
                "outside 1s to 1h",
            ),
            ("notify \"a\" {", "not valid HCL"),
        ] {
            // One attribute a line, as HCL wants (the cases are written on one line).
            let text = &text
                .replace("{ ", "{\n")
                .replace(" }", "\n}")
                .replace("  ", "\n");
            let error = NotifyConfig::parse(text).expect_err(text);
            assert!(
                error.contains(wanted),
                "{text}\n  gave: {error}\n  want: {wanted}"
            );
        }
    }

    /// With several repositories a commit status sink names its source (a commit's status
    /// goes to the repository holding it); with `--repo` it names none.
    #[test]
    fn commit_status_sinks_name_their_source_when_there_are_several() {
        let parse = |source: &str| {
            NotifyConfig::parse(&format!(
                r#"commit_status "origin" {{
                     provider = "github"
                     api_url = "https://api.github.com"
                     repository = "acme/shop"
                     token_file = "/t"
                     {source}
                   }}"#
            ))
            .expect("parses")
        };
        let named = parse(r#"source = "shop""#);
        let unnamed = parse("");
        let several = ["shop".to_owned(), "blog".to_owned()];
        let single = [String::new()];
        assert_eq!(named.check_sources(&several), Ok(()));
        assert_eq!(unnamed.check_sources(&single), Ok(()));
        let error = unnamed.check_sources(&several).expect_err("refused");
        assert!(
            error.contains("commit_status \"origin\"")
                && error.contains("say which source's commits go to `acme/shop`")
                && error.contains("source = \"shop\""),
            "{error}"
        );
        let error = named.check_sources(&single).expect_err("refused");
        assert!(error.contains("remove `source`"), "{error}");
        let error = parse(r#"source = "gone""#)
            .check_sources(&several)
            .expect_err("refused");
        assert!(
            error.contains("\"gone\" is not a source the agent follows (shop, blog)"),
            "{error}"
        );
    }
}
