//! `convert`: a Compose file (the Compose Specification) → voodu HCL the agent reads, and a
//! note for every key that is not carried over, at its line and column.
//!
//! Each service becomes a `deployment`, or a `statefulset` when it keeps data in named volumes
//! only it mounts (one `volume_claim` per volume: each pod its own volume, replaced
//! stop-first, kept when the resource goes); `configs` and `secrets` become one `asset`
//! mounted where Compose mounts them. README "From Docker Compose" has the table.
//!
//! Invariants: pure (text in, text and notes out; files named by the Compose file are read
//! through the caller's [`Options::read`]). The YAML is read by [`super::yaml`] under bounds
//! (size, depth, nodes, alias copies counted). Nothing is dropped silently: every key the
//! converter does not write is a [`Note`] with its position. Every string written is quoted
//! by `text::quote`, so nothing in a Compose value is interpolated by the agent again.

mod service;
#[cfg(test)]
mod tests;
mod text;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use super::yaml::{self, Node, Rules, Value};
use text::{interpolate, quote};

pub(crate) use text::{dotenv, project_name};

/// Largest Compose file read.
pub(crate) const MAX_FILE_BYTES: usize = 1 << 20;
/// Largest file a service names (`env_file`, a config's or secret's `file`).
pub(crate) const MAX_READ_BYTES: usize = 256 << 10;
/// Services in one file.
const MAX_SERVICES: usize = 500;

const RULES: Rules = Rules {
    what: "a Compose file",
    max_depth: 32,
    max_nodes: 100_000,
    aliases: true,
};

/// What the caller supplies besides the text.
pub(crate) struct Options<'a> {
    /// The directory of the Compose file, absolute: relative bind sources are resolved
    /// against it, as Compose does.
    pub(crate) base_dir: String,
    /// The scope to write; `None`: the project name (`name:`, else `default_project`).
    pub(crate) scope: Option<String>,
    /// The project name when the file has no `name:` (Compose: the directory's name).
    pub(crate) default_project: String,
    /// Interpolation variables: the `.env` beside the file, the environment over it.
    pub(crate) vars: BTreeMap<String, String>,
    /// Active profiles (`--profile`, `COMPOSE_PROFILES`).
    pub(crate) profiles: Vec<String>,
    /// Reads a file the Compose file names (relative to `base_dir`), at most
    /// [`MAX_READ_BYTES`]; the error says why not.
    pub(crate) read: &'a dyn Fn(&str) -> Result<String, String>,
}

/// One key not carried over, or carried differently, at its position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Note {
    pub(crate) line: usize,
    pub(crate) col: usize,
    /// The key's path, e.g. `services.web.expose`.
    pub(crate) key: String,
    /// Why, starting with `not carried:` or `note:`.
    pub(crate) message: String,
}

impl Note {
    /// `compose.yaml:12:5: services.web.expose: not carried: …`, the text escaped.
    pub(crate) fn show(&self, file: &str) -> String {
        crate::model::text::escape(&format!(
            "{file}:{}:{}: {}: {}",
            self.line, self.col, self.key, self.message
        ))
        .into_owned()
    }
}

/// One HCL file of the output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OutFile {
    /// A plain file name (`web.hcl`).
    pub(crate) name: String,
    pub(crate) text: String,
}

/// The result: the files to write and the notes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Conversion {
    pub(crate) scope: String,
    pub(crate) files: Vec<OutFile>,
    pub(crate) notes: Vec<Note>,
}

/// A file that cannot be converted at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{line}:{col}: {message}")]
pub(crate) struct ComposeError {
    pub(crate) line: usize,
    pub(crate) col: usize,
    pub(crate) message: String,
}

fn error_at(node: &Node, message: impl Into<String>) -> ComposeError {
    ComposeError {
        line: node.line,
        col: node.col,
        message: message.into(),
    }
}

/// The reading state: variables and the notes gathered.
pub(super) struct Cx<'a> {
    options: &'a Options<'a>,
    notes: Vec<Note>,
    /// The top-level configs and secrets a converted service mounts (`configs.NAME`).
    used: BTreeSet<String>,
}

impl Cx<'_> {
    fn note(&mut self, node: &Node, key: &str, message: impl Into<String>) {
        self.notes.push(Note {
            line: node.line,
            col: node.col,
            key: key.to_owned(),
            message: message.into(),
        });
    }

    fn not_carried(&mut self, node: &Node, key: &str, why: impl fmt::Display) {
        self.note(node, key, format!("not carried: {why}"));
    }

    /// A scalar's text, interpolated; `None` for a list or mapping (noted as such), or a
    /// null scalar.
    fn scalar(&mut self, node: &Node, key: &str) -> Result<Option<String>, ComposeError> {
        match &node.value {
            Value::Scalar { null: true, .. } => Ok(None),
            Value::Scalar { text, .. } => {
                let done = interpolate(text, &self.options.vars)
                    .map_err(|message| error_at(node, format!("{key}: {message}")))?;
                for name in done.unset {
                    self.note(
                        node,
                        key,
                        format!("note: variable {name} is not set; an empty string is used (as Compose does)"),
                    );
                }
                Ok(Some(done.text))
            }
            _ => {
                self.not_carried(
                    node,
                    key,
                    format!("expected a value, found {}", node.what()),
                );
                Ok(None)
            }
        }
    }

    /// A list of scalars (a single scalar counts as a list of one).
    fn strings(&mut self, node: &Node, key: &str) -> Result<Vec<(Node, String)>, ComposeError> {
        let items: Vec<Node> = match &node.value {
            Value::List(items) => items.clone(),
            Value::Scalar { null: true, .. } => Vec::new(),
            Value::Scalar { .. } => vec![node.clone()],
            Value::Map(_) => {
                self.not_carried(node, key, "expected a list, found a mapping");
                return Ok(Vec::new());
            }
        };
        let mut out = Vec::new();
        for item in items {
            if let Some(text) = self.scalar(&item, key)? {
                out.push((item, text));
            }
        }
        Ok(out)
    }
}

/// A mapping's entries with YAML merge keys (`<<: *anchor`, `<<: [*a, *b]`) folded in: keys
/// written in the mapping win, then earlier merged mappings. Not a mapping: `None`.
pub(super) fn entries(node: &Node) -> Option<Vec<(Node, Node)>> {
    let Value::Map(entries) = &node.value else {
        return None;
    };
    let mut own: Vec<(Node, Node)> = Vec::new();
    let mut merged: Vec<(Node, Node)> = Vec::new();
    for (key, value) in entries {
        if key.key_text() == "<<" {
            let sources: Vec<&Node> = match &value.value {
                Value::List(items) => items.iter().collect(),
                _ => vec![value],
            };
            for source in sources {
                for (k, v) in entries_of_merge(source) {
                    if !merged.iter().any(|(m, _)| m.key_text() == k.key_text()) {
                        merged.push((k, v));
                    }
                }
            }
        } else {
            own.push((key.clone(), value.clone()));
        }
    }
    for (k, v) in merged {
        if !own.iter().any(|(o, _)| o.key_text() == k.key_text()) {
            own.push((k, v));
        }
    }
    Some(own)
}

fn entries_of_merge(node: &Node) -> Vec<(Node, Node)> {
    entries(node).unwrap_or_default()
}

/// A scalar's raw text (keys, booleans), without interpolation.
pub(super) fn raw(node: &Node) -> Option<&str> {
    match &node.value {
        Value::Scalar { text, null: false } => Some(text),
        _ => None,
    }
}

/// Converts the Compose `text`.
pub(crate) fn convert(text: &str, options: &Options<'_>) -> Result<Conversion, ComposeError> {
    if text.len() > MAX_FILE_BYTES {
        return Err(ComposeError {
            line: 1,
            col: 1,
            message: format!(
                "the file is {} bytes, above the limit of {MAX_FILE_BYTES}",
                text.len()
            ),
        });
    }
    let root = yaml::parse_with(text, &RULES)
        .map_err(|e| ComposeError {
            line: e.line,
            col: e.col,
            message: e.message,
        })?
        .ok_or(ComposeError {
            line: 1,
            col: 1,
            message: "the file holds no YAML document".to_owned(),
        })?;
    let top = entries(&root).ok_or_else(|| error_at(&root, "a Compose file is a mapping"))?;
    let mut cx = Cx {
        options,
        notes: Vec::new(),
        used: BTreeSet::new(),
    };
    let mut project = None;
    let mut services_node = None;
    let mut tops = Tops::default();
    for (key, value) in &top {
        let name = key.key_text();
        match name {
            "services" => services_node = Some((key.clone(), value.clone())),
            "name" => project = cx.scalar(value, "name")?,
            "version" => cx.note(
                key,
                "version",
                "not carried: obsolete in the Compose Specification; nothing reads it",
            ),
            "volumes" => tops.volumes = entries(value).unwrap_or_default(),
            "networks" => tops.networks = entries(value).unwrap_or_default(),
            "configs" => tops.configs = entries(value).unwrap_or_default(),
            "secrets" => tops.secrets = entries(value).unwrap_or_default(),
            other if other.starts_with("x-") => cx.not_carried(
                key,
                other,
                "an extension field: Compose itself ignores it (its anchors are used where merged)",
            ),
            other => cx.not_carried(key, other, "not a key of the Compose Specification"),
        }
    }
    let scope = match &options.scope {
        Some(scope) => scope.clone(),
        None => project_name(project.as_deref().unwrap_or(&options.default_project)),
    };
    if let Err(problem) = super::validate::check_name(&scope) {
        return Err(ComposeError {
            line: 1,
            col: 1,
            message: format!("scope {scope:?} {problem}: give one with --scope"),
        });
    }
    let Some((services_key, services)) = services_node else {
        return Err(error_at(&root, "no `services:`: nothing to convert"));
    };
    let services = entries(&services)
        .ok_or_else(|| error_at(&services, "`services` must be a mapping of services"))?;
    if services.len() > MAX_SERVICES {
        return Err(error_at(
            &services_key,
            format!("more than {MAX_SERVICES} services"),
        ));
    }
    let files = service::convert_services(&mut cx, &scope, &services, &tops, &services_key)?;
    if files.is_empty() {
        return Err(error_at(
            &services_key,
            "no service could be converted (see the notes)",
        ));
    }
    top_level_notes(&mut cx, &tops);
    // In file order, each once (a config used by two services is noted at its key once).
    let mut notes = cx.notes;
    notes.sort_by_key(|note| (note.line, note.col));
    notes.dedup();
    Ok(Conversion {
        scope,
        files,
        notes,
    })
}

/// Notes for what the top-level `volumes`, `networks`, `configs` and `secrets` declare that is
/// not carried: drivers and their options, and declarations no converted service uses.
fn top_level_notes(cx: &mut Cx<'_>, tops: &Tops) {
    for (section, list, why) in [
        (
            "volumes",
            &tops.volumes,
            "the agent creates a volume with Docker's local driver and its own labels",
        ),
        (
            "networks",
            &tops.networks,
            "the agent creates a network with Docker's defaults (a bridge) and its own labels",
        ),
    ] {
        for (name, body) in list {
            for (key, _) in entries(body).unwrap_or_default() {
                if !matches!(key.key_text(), "external" | "name") {
                    let path = format!("{section}.{}.{}", name.key_text(), key.key_text());
                    cx.not_carried(&key, &path, why);
                }
            }
        }
    }
    for (section, list) in [("configs", &tops.configs), ("secrets", &tops.secrets)] {
        for (name, _) in list {
            let path = format!("{section}.{}", name.key_text());
            if !cx.used.contains(&path) {
                cx.not_carried(name, &path, "no converted service mounts it");
            }
        }
    }
}

/// The top-level `volumes`, `networks`, `configs` and `secrets`.
#[derive(Default)]
pub(super) struct Tops {
    volumes: Vec<(Node, Node)>,
    networks: Vec<(Node, Node)>,
    configs: Vec<(Node, Node)>,
    secrets: Vec<(Node, Node)>,
}

impl Tops {
    fn find<'t>(list: &'t [(Node, Node)], name: &str) -> Option<&'t (Node, Node)> {
        list.iter().find(|(key, _)| key.key_text() == name)
    }
}

/// An asset key from a config or secret name: `[A-Za-z0-9_-]`, others as `_`.
pub(super) fn asset_key(name: &str) -> String {
    let key: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(crate::model::names::MAX_ASSET_KEY)
        .collect();
    if key.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        key
    } else {
        format!("k{key}")
    }
}

/// The names used by several services (`volumes`), for the kind decision.
pub(super) type Users = BTreeMap<String, BTreeSet<String>>;

/// Quotes each of `items`, for messages.
pub(super) fn shown(items: &[String]) -> String {
    items
        .iter()
        .map(|i| quote(i))
        .collect::<Vec<_>>()
        .join(", ")
}
