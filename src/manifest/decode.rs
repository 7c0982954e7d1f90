//! HCL source → per-kind spec structs, keeping `path:line:col` for every problem.
//!
//! Walks `hcl::edit` structures (not the serde view: there `file("x")` and an escaped `$${X}`
//! lose their shape, see CRATES.md) so that every attribute, block and value has a span.
//! Invariant: decoding never stops at the first problem of a file; it reports all of them.

use std::collections::BTreeMap;
use std::ops::Range;

use hcl::edit::Span;
use hcl::edit::expr::{Expression, ObjectKey};
use hcl::edit::structure::{Attribute, Block, BlockLabel, Body, Structure};

use super::diagnostic::{Diagnostic, LineIndex};
use super::spec::{DeploymentSpec, Spec};
use crate::model::{Kind, ResourceKey};

/// One decoded resource and where its block starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    pub key: ResourceKey,
    pub spec: Spec,
    pub origin: Diagnostic,
}

/// Per-file decoding context: the path for diagnostics, the line index, and the problems
/// found so far.
pub(crate) struct FileDecoder<'a> {
    path: &'a str,
    index: LineIndex<'a>,
    pub(crate) diagnostics: Vec<Diagnostic>,
}

/// Block types voodu accepts that this agent cannot reconcile yet.
const KNOWN_UNSUPPORTED_BLOCKS: &[&str] = &[
    "app",
    "statefulset",
    "ingress",
    "job",
    "cronjob",
    "asset",
    "registry",
    "postgres",
    "redis",
];

impl<'a> FileDecoder<'a> {
    pub(crate) fn new(path: &'a str, text: &'a str) -> FileDecoder<'a> {
        FileDecoder {
            path,
            index: LineIndex::new(text),
            diagnostics: Vec::new(),
        }
    }

    fn error(&mut self, span: Option<Range<usize>>, message: impl Into<String>) {
        let diagnostic = self.index.at(self.path, span, message.into());
        self.diagnostics.push(diagnostic);
    }

    fn location(&self, span: Option<Range<usize>>) -> Diagnostic {
        self.index.at(self.path, span, String::new())
    }

    /// Decodes every top-level block of one parsed file.
    pub(crate) fn decode_file(&mut self, body: &Body) -> Vec<Resource> {
        let mut resources = Vec::new();
        for structure in body.iter() {
            match structure {
                Structure::Attribute(attribute) => self.error(
                    attribute.span(),
                    format!(
                        "top-level attribute `{}` is not allowed: a manifest holds blocks such as `deployment \"scope\" \"name\" {{ … }}`",
                        attribute.key.as_str()
                    ),
                ),
                Structure::Block(block) => {
                    if let Some(resource) = self.decode_block(block) {
                        resources.push(resource);
                    }
                }
            }
        }
        resources
    }

    fn decode_block(&mut self, block: &Block) -> Option<Resource> {
        let block_type = block.ident.as_str();
        match block_type {
            "deployment" => {
                let (scope, name) = self.scope_and_name(block)?;
                let key = ResourceKey::new(Kind::Deployment, scope, name);
                let spec = self.decode_deployment(&block.body)?;
                Some(Resource {
                    key,
                    spec: Spec::Deployment(spec),
                    origin: self.location(block.span()),
                })
            }
            known if KNOWN_UNSUPPORTED_BLOCKS.contains(&known) => {
                self.error(
                    block.ident.span(),
                    format!(
                        "`{known}` blocks are valid voodu but not supported by this agent yet; remove the block or keep it out of the watched --path"
                    ),
                );
                None
            }
            other => {
                let hint = did_you_mean(other, &["deployment"]);
                self.error(
                    block.ident.span(),
                    format!("unknown block type `{other}`{hint}"),
                );
                None
            }
        }
    }

    fn scope_and_name(&mut self, block: &Block) -> Option<(String, String)> {
        let block_type = block.ident.as_str();
        let labels: Vec<(&str, Option<Range<usize>>)> = block
            .labels
            .iter()
            .map(|label| match label {
                BlockLabel::String(text) => (text.as_str(), label.span()),
                BlockLabel::Ident(ident) => (ident.as_str(), label.span()),
            })
            .collect();
        if labels.len() != 2 {
            self.error(
                block.ident.span(),
                format!(
                    "{block_type} block needs scope and name labels (got {}): write `{block_type} \"scope\" \"name\" {{ … }}`",
                    labels.len()
                ),
            );
            return None;
        }
        let mut valid = true;
        for (what, (label, span)) in ["scope", "name"].iter().zip(&labels) {
            if let Err(problem) = check_name(label) {
                self.error(
                    span.clone(),
                    format!("{block_type} {what} {label:?} {problem}"),
                );
                valid = false;
            }
        }
        valid.then(|| (labels[0].0.to_owned(), labels[1].0.to_owned()))
    }

    fn decode_deployment(&mut self, body: &Body) -> Option<DeploymentSpec> {
        const SUPPORTED: &[&str] = &[
            "image",
            "command",
            "replicas",
            "env",
            "ports",
            "volumes",
            "restart",
            "health_check",
            "network",
            "networks",
            "extra_hosts",
            "cap_add",
        ];
        const LATER: &[&str] = &[
            "env_file",
            "env_from",
            "network_mode",
            "ulimits",
            "docker_options",
            "post_deploy",
            "keep_releases",
            "build",
            "depends_on",
            "resources",
            "logs",
            "release",
            "autoscale",
            "on_deploy",
            "on_probe",
            "probes",
            "init",
        ];
        let before = self.diagnostics.len();
        let mut spec = DeploymentSpec::default();
        let mut seen: BTreeMap<&str, Option<Range<usize>>> = BTreeMap::new();
        for structure in body.iter() {
            let (ident, span) = match structure {
                Structure::Attribute(attribute) => (attribute.key.as_str(), attribute.span()),
                Structure::Block(block) => (block.ident.as_str(), block.span()),
            };
            if LATER.contains(&ident) {
                self.error(
                    span,
                    format!(
                        "`{ident}` is a voodu deployment field this agent does not support yet"
                    ),
                );
                continue;
            }
            let Structure::Attribute(attribute) = structure else {
                let hint = did_you_mean(ident, SUPPORTED);
                self.error(span, format!("unknown block `{ident}` in deployment{hint}"));
                continue;
            };
            if let Some(first) = seen.insert(ident, span.clone()) {
                let (line, col) = self.index.line_col(first.map_or(0, |range| range.start));
                self.error(
                    span,
                    format!(
                        "duplicate attribute `{ident}` (first set at line {line}, column {col})"
                    ),
                );
                continue;
            }
            match ident {
                "image" => spec.image = self.string(attribute).unwrap_or_default(),
                "command" => spec.command = self.string_list(attribute),
                "replicas" => spec.replicas = self.integer(attribute),
                "env" => spec.env = self.string_map(attribute).unwrap_or_default(),
                "ports" => spec.ports = self.string_list(attribute).unwrap_or_default(),
                "volumes" => spec.volumes = self.string_list(attribute).unwrap_or_default(),
                "restart" => spec.restart = self.string(attribute),
                "health_check" => spec.health_check = self.string(attribute),
                "network" => spec.network = self.string(attribute),
                "networks" => spec.networks = self.string_list(attribute).unwrap_or_default(),
                "extra_hosts" => spec.extra_hosts = self.string_list(attribute).unwrap_or_default(),
                "cap_add" => spec.cap_add = self.string_list(attribute).unwrap_or_default(),
                other => {
                    let hint = did_you_mean(other, SUPPORTED);
                    self.error(
                        span,
                        format!("unknown attribute `{other}` in deployment{hint}"),
                    );
                }
            }
        }
        if let Some(replicas) = spec.replicas
            && replicas < 0
        {
            let span = seen.get("replicas").cloned().flatten();
            self.error(span, format!("replicas must be 0 or more (got {replicas})"));
        }
        if spec.health_check.is_none() {
            spec.health_check = Some("/".to_owned());
        }
        (self.diagnostics.len() == before).then_some(spec)
    }

    fn string(&mut self, attribute: &Attribute) -> Option<String> {
        let name = attribute.key.as_str();
        self.scalar_string(&attribute.value, name)
    }

    /// A string, or a number or bool converted to one (HCL's type conversion).
    fn scalar_string(&mut self, value: &Expression, what: &str) -> Option<String> {
        match value {
            Expression::String(text) => Some(text.as_str().to_owned()),
            Expression::Number(number) => Some(number.to_string()),
            Expression::Bool(flag) => Some(flag.to_string()),
            Expression::StringTemplate(_) | Expression::HeredocTemplate(_) => {
                self.error(
                    value.span(),
                    format!("`{what}`: `${{…}}` interpolation is not supported by this agent yet"),
                );
                None
            }
            other => {
                self.error(
                    other.span(),
                    format!("`{what}` must be a string, got {}", describe(other)),
                );
                None
            }
        }
    }

    fn integer(&mut self, attribute: &Attribute) -> Option<i64> {
        let name = attribute.key.as_str();
        let parsed = match &attribute.value {
            Expression::Number(number) => number.as_i64(),
            Expression::String(text) => text.as_str().trim().parse::<i64>().ok(),
            _ => None,
        };
        if parsed.is_none() {
            self.error(
                attribute.value.span(),
                format!(
                    "`{name}` must be a whole number, got {}",
                    describe(&attribute.value)
                ),
            );
        }
        parsed
    }

    fn string_list(&mut self, attribute: &Attribute) -> Option<Vec<String>> {
        let name = attribute.key.as_str();
        let Expression::Array(items) = &attribute.value else {
            self.error(
                attribute.value.span(),
                format!(
                    "`{name}` must be a list of strings like [\"a\", \"b\"], got {}",
                    describe(&attribute.value)
                ),
            );
            return None;
        };
        let mut values = Vec::new();
        let mut ok = true;
        for item in items.iter() {
            match self.scalar_string(item, name) {
                Some(value) => values.push(value),
                None => ok = false,
            }
        }
        ok.then_some(values)
    }

    fn string_map(&mut self, attribute: &Attribute) -> Option<BTreeMap<String, String>> {
        let name = attribute.key.as_str();
        let Expression::Object(object) = &attribute.value else {
            self.error(
                attribute.value.span(),
                format!(
                    "`{name}` must be a map like {{ KEY = \"value\" }}, got {}",
                    describe(&attribute.value)
                ),
            );
            return None;
        };
        let mut map = BTreeMap::new();
        let mut ok = true;
        for (key, value) in object.iter() {
            let key_text = match key {
                ObjectKey::Ident(ident) => Some(ident.as_str().to_owned()),
                ObjectKey::Expression(Expression::String(text)) => Some(text.as_str().to_owned()),
                ObjectKey::Expression(other) => {
                    self.error(
                        other.span(),
                        format!("`{name}` keys must be plain names or strings"),
                    );
                    None
                }
            };
            let value_text = self.scalar_string(value.expr(), name);
            match (key_text, value_text) {
                (Some(key_text), Some(value_text)) => {
                    map.insert(key_text, value_text);
                }
                _ => ok = false,
            }
        }
        ok.then_some(map)
    }
}

/// Names become parts of container names, DNS aliases and file paths: one charset for all.
fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("must not be empty");
    }
    if name.len() > 63 {
        return Err("is longer than 63 characters");
    }
    if name.contains("..") || name.contains('/') || name.contains('\0') {
        return Err("must not contain `..`, `/` or NUL");
    }
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    if !first_ok
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
    {
        return Err(
            "must start with a letter or digit and use only letters, digits, `_`, `.` and `-`",
        );
    }
    Ok(())
}

fn describe(value: &Expression) -> &'static str {
    match value {
        Expression::Null(_) => "null",
        Expression::Bool(_) => "a bool",
        Expression::Number(_) => "a number",
        Expression::String(_) => "a string",
        Expression::Array(_) => "a list",
        Expression::Object(_) => "a map",
        Expression::StringTemplate(_) | Expression::HeredocTemplate(_) => "a template",
        Expression::Variable(_) | Expression::Traversal(_) => "a variable reference",
        Expression::FuncCall(_) => "a function call",
        _ => "an expression",
    }
}

/// ` (did you mean `x`?)` when a known name is within two edits, else empty.
pub(crate) fn did_you_mean(input: &str, known: &[&str]) -> String {
    known
        .iter()
        .map(|candidate| (edit_distance(input, candidate), candidate))
        .filter(|(distance, _)| *distance <= 2)
        .min()
        .map(|(_, candidate)| format!(" (did you mean `{candidate}`?)"))
        .unwrap_or_default()
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != *cb);
            current.push(substitution.min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggestions_only_for_close_names() {
        assert_eq!(
            did_you_mean("replicaz", &["replicas", "image"]),
            " (did you mean `replicas`?)"
        );
        assert_eq!(did_you_mean("zzzzzz", &["replicas", "image"]), "");
    }

    #[test]
    fn names_are_confined() {
        assert!(check_name("web-1").is_ok());
        for bad in ["", "a/b", "..", "a..b", "-x", "a b", "a\0"] {
            assert!(check_name(bad).is_err(), "{bad:?} must be refused");
        }
    }
}
