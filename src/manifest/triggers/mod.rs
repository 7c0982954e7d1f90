//! voodu's deploy trigger files, `.voodu/**/*.yml`: when a push deploys, and which manifest
//! file it applies. Parsing (`parse_all`, every problem as `path:line:col: message`), glob
//! matching (`glob.rs`) and the pure firing decision (`decide.rs`: which triggers fire for a
//! commit, which are held for `approve`, and which files at which commits make up desired
//! state).
//!
//! The keys are voodu's (`internal/triggerspec`): `name` (default: the file's base name),
//! `on.push.branches` / `tags` / `paths`, `apply.file`, `deploy: manual`; any other key is an
//! error at its position (`branch:` is not `branches:`). One extension: `window`, a list of
//! deploy windows (`manifest::window`), each `{name, kind: allow|deny, schedule, timezone,
//! duration}`: a firing waits until they are open.
//!
//! Invariants: no IO; a repository with a broken trigger file gets diagnostics, never a
//! partial trigger set (the commit is rejected whole, like a broken manifest); input is
//! bounded ([`MAX_TRIGGER_FILES`] files of at most [`MAX_TRIGGER_FILE_BYTES`] each, the YAML
//! reader's own bounds, at most [`MAX_PATTERNS`] patterns per list).

mod decide;
mod glob;

pub use decide::{
    Applied, Approval, Decision, Held, Outcome, Situation, TriggerState, Verdict, decide,
};

use super::Diagnostic;
use super::yaml::{self, Node, Value};
use crate::model::SourceFile;
use glob::Glob;

/// voodu reads at most this many trigger files; the agent refuses a commit with more.
pub(crate) const MAX_TRIGGER_FILES: usize = 20;
/// Largest trigger file accepted, in bytes.
pub(crate) const MAX_TRIGGER_FILE_BYTES: usize = crate::model::MAX_TRIGGER_FILE_BYTES as usize;
/// Most patterns one `branches`, `tags` or `paths` list may hold.
pub(crate) const MAX_PATTERNS: usize = 100;
/// Longest trigger name, in bytes.
const MAX_NAME_BYTES: usize = 128;

/// One parsed trigger file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trigger {
    /// The trigger file, repo-relative (`.voodu/deploy/api.yml`): its identity.
    pub(crate) path: String,
    pub(crate) name: String,
    pub(crate) branches: Vec<String>,
    pub(crate) tags: Vec<String>,
    pub(crate) paths: Vec<String>,
    /// The manifest file it applies, repo-relative, normalised (no `./`).
    pub(crate) apply_file: String,
    /// `deploy: manual`: a push that fires it is held until `voodu-agent approve`.
    pub(crate) manual: bool,
    /// `window` (an extension): a firing is held while these are closed.
    pub(crate) windows: Vec<crate::manifest::window::WindowRule>,
    /// Where `apply.file` is written, for problems with the file it names.
    pub(crate) apply_file_line: usize,
    pub(crate) apply_file_col: usize,
    branch_globs: Vec<Glob>,
    path_globs: Vec<Glob>,
}

impl Trigger {
    /// Whether a push to `branch` fires it (by `on.push.branches`; a branch push never
    /// matches `tags`, as in voodu, which compares full refs).
    pub(crate) fn matches_branch(&self, branch: &str) -> bool {
        self.branch_globs.iter().any(|glob| glob.matches(branch))
    }

    /// Whether a change of `changed` fires it: always without `paths`, else when any path
    /// matches any pattern.
    pub(crate) fn matches_paths(&self, changed: &[String]) -> bool {
        self.path_globs.is_empty()
            || changed
                .iter()
                .any(|path| self.path_globs.iter().any(|glob| glob.matches(path)))
    }

    /// A diagnostic at this trigger's `apply.file`.
    pub(crate) fn at_apply_file(&self, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            path: self.path.clone(),
            line: self.apply_file_line,
            col: self.apply_file_col,
            message: message.into(),
        }
    }
}

/// Parses every trigger file (`files` are the repo's `.voodu/**/*.yml`, in path order).
/// All problems are reported; with any, no trigger is returned.
pub(crate) fn parse_all(files: &[SourceFile]) -> Result<Vec<Trigger>, Vec<Diagnostic>> {
    let mut errors = Vec::new();
    let mut triggers = Vec::new();
    if files.len() > MAX_TRIGGER_FILES {
        errors.push(Diagnostic {
            path: files[MAX_TRIGGER_FILES].path.clone(),
            line: 1,
            col: 1,
            message: format!(
                "more than {MAX_TRIGGER_FILES} trigger files under .voodu/ ({} found); voodu reads at most {MAX_TRIGGER_FILES}: merge or remove some",
                files.len()
            ),
        });
        return Err(errors);
    }
    for file in files {
        match parse(&file.path, &file.contents) {
            Ok(trigger) => triggers.push(trigger),
            Err(problems) => errors.extend(problems),
        }
    }
    if errors.is_empty() {
        Ok(triggers)
    } else {
        Err(errors)
    }
}

/// Parses one trigger file.
pub(crate) fn parse(path: &str, contents: &[u8]) -> Result<Trigger, Vec<Diagnostic>> {
    let root = read_root(path, contents)?;
    let mut reader = Reader {
        path,
        errors: Vec::new(),
    };
    let top = reader.map(
        &root,
        "the trigger file",
        &["name", "on", "apply", "deploy", "window"],
    );
    let name = match top.get("name") {
        Some(node) => reader.string(node, "name"),
        None => None,
    };
    let mut branches = Vec::new();
    let mut tags = Vec::new();
    let mut paths = Vec::new();
    let mut on_at = top.key_at("on").unwrap_or((root.line, root.col));
    if let Some(on) = top.get("on") {
        let on_map = reader.map(on, "on", &["push"]);
        if let Some(push) = on_map.get("push") {
            on_at = on_map.key_at("push").unwrap_or(on_at);
            let push_map = reader.map(push, "on.push", &["branches", "tags", "paths"]);
            branches = reader.patterns(push_map.get("branches"), "on.push.branches");
            tags = reader.patterns(push_map.get("tags"), "on.push.tags");
            paths = reader.patterns(push_map.get("paths"), "on.push.paths");
        }
    }
    let mut apply_file = None;
    let mut apply_at = top.key_at("apply").unwrap_or((root.line, root.col));
    if let Some(apply) = top.get("apply") {
        let apply_map = reader.map(apply, "apply", &["file"]);
        if let Some(file) = apply_map.get("file") {
            apply_at = (file.line, file.col);
            apply_file = reader.string(file, "apply.file");
        }
    }
    let manual = top.get("deploy").is_some_and(|node| reader.manual(node));
    let windows = top
        .get("window")
        .map(|node| reader.windows(node))
        .unwrap_or_default();
    // voodu's checks, in voodu's order.
    let apply_file = match apply_file.as_deref().map(str::trim) {
        None | Some("") => {
            reader.error_at(
                apply_at,
                "apply.file is required: it names the manifest to apply".to_owned(),
            );
            None
        }
        Some(target) => match repo_path(target) {
            Ok(normalised) => Some(normalised),
            Err(error) => {
                reader.error_at(apply_at, error.to_string());
                None
            }
        },
    };
    if branches.is_empty() && tags.is_empty() {
        reader.error_at(
            on_at,
            "on.push needs branches or tags: a trigger that matches nothing never fires".to_owned(),
        );
    }
    let name = name
        .filter(|name| !name.trim().is_empty())
        .unwrap_or_else(|| default_name(path));
    if name.len() > MAX_NAME_BYTES || name.chars().any(char::is_control) {
        reader.error_at(
            (1, 1),
            format!("name must be printable text of at most {MAX_NAME_BYTES} bytes"),
        );
    }
    let branch_globs = reader.globs(&branches);
    reader.globs(&tags);
    let path_globs = reader.globs(&paths);
    match apply_file {
        Some(apply_file) if reader.errors.is_empty() => Ok(Trigger {
            path: path.to_owned(),
            name,
            branches: branches.into_iter().map(|(pattern, _)| pattern).collect(),
            tags: tags.into_iter().map(|(pattern, _)| pattern).collect(),
            paths: paths.into_iter().map(|(pattern, _)| pattern).collect(),
            apply_file,
            manual,
            windows,
            apply_file_line: apply_at.0,
            apply_file_col: apply_at.1,
            branch_globs,
            path_globs,
        }),
        _ => Err(reader.errors),
    }
}

/// The file's root node: a mapping, read from at most `MAX_TRIGGER_FILE_BYTES` of UTF-8 YAML.
fn read_root(path: &str, contents: &[u8]) -> Result<Node, Vec<Diagnostic>> {
    let at = |line: usize, col: usize, message: String| Diagnostic {
        path: path.to_owned(),
        line,
        col,
        message,
    };
    if contents.len() > MAX_TRIGGER_FILE_BYTES {
        return Err(vec![at(
            1,
            1,
            format!(
                "trigger file is {} bytes; at most {MAX_TRIGGER_FILE_BYTES} are read",
                contents.len()
            ),
        )]);
    }
    let text = std::str::from_utf8(contents)
        .map_err(|_| vec![at(1, 1, "trigger file is not UTF-8 text".to_owned())])?;
    let root = match yaml::parse(text) {
        Ok(Some(root)) => root,
        Ok(None) => {
            return Err(vec![at(
                1,
                1,
                "empty trigger file: it needs `on.push.branches` and `apply.file`".to_owned(),
            )]);
        }
        Err(error) => return Err(vec![at(error.line, error.col, error.message)]),
    };
    if !matches!(root.value, Value::Map(_)) {
        return Err(vec![at(
            root.line,
            root.col,
            format!(
                "a trigger file is a mapping (name, on, apply, deploy), not {}",
                root.what()
            ),
        )]);
    }
    Ok(root)
}

/// Why an `apply.file` is refused; each variant holds the path as written. Display is the
/// reason; the parser reports it at `apply.file`'s `path:line:col`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum ApplyFileError {
    #[error("apply.file {0:?} must be relative to the repository root")]
    Absolute(String),
    #[error("apply.file {0:?} escapes the repository")]
    Escapes(String),
    #[error("apply.file {0:?} must be a plain path")]
    NotPlain(String),
    #[error("apply.file {0:?} is inside .git")]
    InsideGit(String),
    #[error(
        "apply.file {0:?}: JSON manifests are not supported by the agent; name an HCL manifest"
    )]
    Json(String),
}

/// `apply.file` made repo-relative and checked: relative, a plain path, inside the repo.
fn repo_path(target: &str) -> Result<String, ApplyFileError> {
    if target.starts_with('/') {
        return Err(ApplyFileError::Absolute(target.to_owned()));
    }
    let plain = target.strip_prefix("./").unwrap_or(target);
    let parts: Vec<&str> = plain.split('/').collect();
    if parts.contains(&"..") {
        return Err(ApplyFileError::Escapes(target.to_owned()));
    }
    if parts.iter().any(|part| part.is_empty() || *part == ".") || target.contains('\\') {
        return Err(ApplyFileError::NotPlain(target.to_owned()));
    }
    if plain.starts_with(".git/") {
        return Err(ApplyFileError::InsideGit(target.to_owned()));
    }
    if plain.to_ascii_lowercase().ends_with(".json") {
        return Err(ApplyFileError::Json(target.to_owned()));
    }
    Ok(plain.to_owned())
}

/// The file's base name without its extension: `.voodu/deploy/pwa.yml` is `pwa`.
fn default_name(path: &str) -> String {
    let base = path.rsplit('/').next().unwrap_or(path);
    base.rsplit_once('.')
        .map_or(base, |(stem, _)| stem)
        .to_owned()
}

/// Walks the node tree, collecting every problem.
struct Reader<'a> {
    path: &'a str,
    errors: Vec<Diagnostic>,
}

/// A mapping's known keys and their values.
struct Fields<'n> {
    /// Name, key node, value node.
    entries: Vec<(&'static str, &'n Node, &'n Node)>,
}

impl<'n> Fields<'n> {
    fn get(&self, key: &str) -> Option<&'n Node> {
        self.entries
            .iter()
            .find(|(name, _, _)| *name == key)
            .map(|(_, _, node)| *node)
    }

    /// Where `key` is written.
    fn key_at(&self, key: &str) -> Option<(usize, usize)> {
        self.entries
            .iter()
            .find(|(name, _, _)| *name == key)
            .map(|(_, node, _)| (node.line, node.col))
    }
}

impl Reader<'_> {
    /// Records a problem at `(line, col)`.
    fn error_at(&mut self, (line, col): (usize, usize), message: String) {
        self.errors.push(Diagnostic {
            path: self.path.to_owned(),
            line,
            col,
            message,
        });
    }

    /// `deploy`: whether the trigger waits for an approval (`manual`) or fires (`auto`).
    fn manual(&mut self, node: &Node) -> bool {
        match self.string(node, "deploy").as_deref() {
            Some("manual") => true,
            Some("auto") | None => false,
            Some(other) => {
                self.error(
                    node,
                    format!("deploy must be \"manual\" (held until `voodu-agent approve`) or \"auto\", not {other:?}"),
                );
                false
            }
        }
    }

    /// `window`: a list of `{name, kind, schedule, timezone, duration}`, each checked where
    /// it is written.
    fn windows(&mut self, node: &Node) -> Vec<crate::manifest::window::WindowRule> {
        use crate::manifest::window::{MAX_RULES, WindowRule};
        let items = match &node.value {
            Value::Scalar { null: true, .. } => return Vec::new(),
            Value::List(items) if items.len() <= MAX_RULES => items,
            Value::List(items) => {
                self.error(
                    node,
                    format!("window has {} rules; at most {MAX_RULES}", items.len()),
                );
                return Vec::new();
            }
            _ => {
                self.error(
                    node,
                    "window must be a list of `- {kind: allow, schedule: \"0 9 * * 1-5\", timezone: Europe/Berlin, duration: 8h}`".to_owned(),
                );
                return Vec::new();
            }
        };
        let mut rules = Vec::new();
        for (index, item) in items.iter().enumerate() {
            let fields = self.map(
                item,
                "window",
                &["name", "kind", "schedule", "timezone", "duration"],
            );
            let mut text = |key: &str| {
                fields
                    .get(key)
                    .and_then(|value| self.string(value, &format!("window.{key}")))
                    .unwrap_or_default()
            };
            let name = text("name");
            let (kind, schedule, timezone, duration) = (
                text("kind"),
                text("schedule"),
                text("timezone"),
                text("duration"),
            );
            if name.len() > 64 || name.chars().any(char::is_control) {
                self.error(
                    item,
                    "window.name must be printable text of at most 64 bytes".to_owned(),
                );
                continue;
            }
            // Named with its trigger file, so `status` says whose window holds a commit.
            let name = if name.is_empty() {
                format!("{}: window {}", self.path, index + 1)
            } else {
                format!("{}: {name}", self.path)
            };
            match WindowRule::new(&name, &kind, &schedule, &timezone, &duration) {
                Ok(rule) => rules.push(rule),
                Err(message) => self.error(item, message),
            }
        }
        rules
    }

    /// The globs of `patterns`, each refused one reported where it is written.
    fn globs(&mut self, patterns: &[(String, (usize, usize))]) -> Vec<Glob> {
        patterns
            .iter()
            .filter_map(|(pattern, at)| match Glob::new(pattern) {
                Ok(glob) => Some(glob),
                Err(error) => {
                    self.error_at(*at, error.to_string());
                    None
                }
            })
            .collect()
    }

    fn error(&mut self, node: &Node, message: String) {
        self.errors.push(Diagnostic {
            path: self.path.to_owned(),
            line: node.line,
            col: node.col,
            message,
        });
    }

    /// The entries of a mapping whose keys must be in `known`; an empty (`~`) node is an
    /// empty mapping.
    fn map<'n>(&mut self, node: &'n Node, what: &str, known: &[&'static str]) -> Fields<'n> {
        let mut fields = Fields {
            entries: Vec::new(),
        };
        match &node.value {
            Value::Map(entries) => {
                for (key, value) in entries {
                    let text = key.key_text();
                    match known.iter().find(|name| **name == text) {
                        Some(name) => fields.entries.push((name, key, value)),
                        None => self.error(
                            key,
                            format!(
                                "unknown key {text:?} in {what} (known: {}){}",
                                known.join(", "),
                                crate::manifest::decode::reader::did_you_mean(text, known)
                            ),
                        ),
                    }
                }
            }
            Value::Scalar { null: true, .. } => {}
            _ => self.error(
                node,
                format!("{what} must be a mapping, not {}", node.what()),
            ),
        }
        fields
    }

    fn string(&mut self, node: &Node, what: &str) -> Option<String> {
        match &node.value {
            Value::Scalar { null: true, .. } => None,
            Value::Scalar { text, .. } => Some(text.clone()),
            _ => {
                self.error(
                    node,
                    format!("{what} must be a single value, not {}", node.what()),
                );
                None
            }
        }
    }

    /// A list of patterns, each with its position; an empty node is an empty list.
    fn patterns(&mut self, node: Option<&Node>, what: &str) -> Vec<(String, (usize, usize))> {
        let Some(node) = node else {
            return Vec::new();
        };
        match &node.value {
            Value::Scalar { null: true, .. } => Vec::new(),
            Value::List(items) => {
                if items.len() > MAX_PATTERNS {
                    self.error(
                        node,
                        format!(
                            "{what} has {} patterns; at most {MAX_PATTERNS}",
                            items.len()
                        ),
                    );
                    return Vec::new();
                }
                items
                    .iter()
                    .filter_map(|item| {
                        let text = self.string(item, what)?;
                        Some((text, (item.line, item.col)))
                    })
                    .collect()
            }
            Value::Scalar { text, .. } => {
                self.error(
                    node,
                    format!("{what} must be a list, as in GitHub Actions: write [{text}]"),
                );
                Vec::new()
            }
            Value::Map(_) => {
                self.error(node, format!("{what} must be a list, not a mapping"));
                Vec::new()
            }
        }
    }
}

#[cfg(test)]
mod tests;
