//! HCL source → per-kind specs, keeping `path:line:col` for every problem.
//!
//! Walks `hcl::edit` structures (not the serde view: there `file("x")` and an escaped `$${X}`
//! lose their shape, and nothing carries a location), so every attribute, block and value has
//! a span. Top-level
//! blocks dispatch by type (spec §1.4): the core kinds, `app` (deployment + ingress), and the
//! `postgres` / `redis` macros (statefulsets, see `macros`).
//!
//! Invariant: decoding never stops at the first problem of a file; a resource with any
//! problem is left out and every problem is reported.

pub(super) mod kinds;
mod plugin_blocks;
pub(crate) mod reader;
mod sources;
pub(in crate::manifest) mod values;

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use hcl::edit::Span;
use hcl::edit::structure::{Block, Body, Structure};

use super::diagnostic::Diagnostic;
use super::interpolate::Reference;
use super::spec::Spec;
use super::{macros, validate};
use crate::model::{Kind, ResourceKey};
pub(crate) use reader::DecodeCx;
use reader::{Reader, did_you_mean, labels};
pub(crate) use sources::LoadEnv;

/// One decoded resource and where its block starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    pub key: ResourceKey,
    pub spec: Spec,
    pub(crate) origin: Diagnostic,
    /// `spec`'s canonical JSON, made the first time it is asked for (`spec_json`).
    pub(crate) json: SpecJson,
}

impl Resource {
    /// The spec's canonical JSON (`Spec::to_json`): what the store keeps and compares, and
    /// what a plan compares with the desired state. Made once per resource: a cached file's
    /// resources (`Decoded::stamped`) serve every later load and commit with it, so a commit
    /// that changes one file of many serialises that file's resources alone.
    ///
    /// Invariant: the spec does not change once this was asked for. A resource is changed in
    /// one place, `Decoded::stamped`, on a fresh copy, whose memo a clone leaves empty.
    pub fn spec_json(&self) -> &str {
        self.json.0.get_or_init(|| self.spec.to_json())
    }
}

/// The memo behind `Resource::spec_json`. A clone starts empty, since a clone is made to be
/// changed; it takes no part in comparing or showing a resource.
#[derive(Default)]
pub(crate) struct SpecJson(std::sync::OnceLock<String>);

impl Clone for SpecJson {
    fn clone(&self) -> SpecJson {
        SpecJson::default()
    }
}

impl PartialEq for SpecJson {
    fn eq(&self, _: &SpecJson) -> bool {
        true
    }
}

impl Eq for SpecJson {}

impl std::fmt::Debug for SpecJson {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SpecJson")
    }
}

/// A resource with the references its spec makes, for the cross-resource checks.
#[derive(Clone)]
pub(crate) struct Decoded {
    /// Shared with what `stamped` returns when stamping changes nothing (a kind without asset
    /// references, or the digests it already carries): a cached file holds one copy.
    pub(crate) resource: Arc<Resource>,
    pub(crate) references: Vec<(Reference, Diagnostic)>,
    /// `(bucket, key)` pairs a macro needs to exist (e.g. a generated postgres password).
    pub(crate) secrets: Vec<macros::SecretRequest>,
    /// Where the fields the host policy reads are written (see `policy_locations`).
    pub(crate) locations: BTreeMap<String, Diagnostic>,
    /// The resource as the last load accepted it (see `Decoded::stamped`).
    pub(crate) stamped: Stamped,
}

/// What `Decoded::stamped` returned last: the digests it resolved and the stamped resource.
/// A clone starts empty (it is only ever a memo of the original).
#[derive(Default)]
pub(crate) struct Stamped(std::sync::Mutex<Option<(Vec<String>, Arc<Resource>)>>);

impl Clone for Stamped {
    fn clone(&self) -> Stamped {
        Stamped::default()
    }
}

impl Decoded {
    /// The resource with its asset references stamped into `_asset_digests` (consumer kinds;
    /// other kinds as decoded), `resolved[i]` the digest of its `i`-th asset reference, as
    /// `${asset.…}` text → digest. Shared: a cached file's decode serves every later load
    /// that resolves the same digests with the one copy made the first time, instead of a
    /// copy per load. `resolved` is the only input besides the decode itself (its references
    /// fixed), which never changes once made.
    pub(crate) fn stamped(&self, resolved: &[&str]) -> Arc<Resource> {
        let mut memo = self
            .stamped
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((stamped_with, resource)) = memo.as_ref()
            && stamped_with
                .iter()
                .map(String::as_str)
                .eq(resolved.iter().copied())
        {
            return Arc::clone(resource);
        }
        let mut resource = Resource::clone(&self.resource);
        if let Some(stamp) = resource.spec.asset_digests_mut() {
            let asset_references =
                self.references
                    .iter()
                    .filter_map(|(reference, _)| match reference {
                        Reference::Asset { scope, name, key } => {
                            Some(Reference::asset_ref(scope.as_deref(), name, key))
                        }
                        Reference::Resource { .. } | Reference::Dependency { .. } => None,
                    });
            *stamp = crate::model::map_of(
                asset_references.zip(resolved.iter().map(|digest| (*digest).to_owned())),
            );
        }
        let resource = if resource.spec == self.resource.spec {
            Arc::clone(&self.resource)
        } else {
            Arc::new(resource)
        };
        let stamped_with = resolved.iter().map(|digest| (*digest).to_owned()).collect();
        *memo = Some((stamped_with, Arc::clone(&resource)));
        resource
    }
}

/// Top-level block types besides the kinds' own, for "did you mean" on a misspelt one.
const OTHER_BLOCK_TYPES: &[&str] = &["app", "postgres", "redis"];

/// Decodes every top-level block of one parsed file.
pub(crate) fn decode_file(cx: &mut DecodeCx<'_>, body: &Body) -> Vec<Decoded> {
    let mut decoded = Vec::new();
    for structure in body.iter() {
        match structure {
            Structure::Attribute(attribute) => cx.error(
                attribute.key.span(),
                format!(
                    "top-level attribute `{}` is not allowed: a manifest holds blocks such as `deployment \"scope\" \"name\" {{ … }}`",
                    attribute.key.as_str()
                ),
            ),
            Structure::Block(block) => decode_block(cx, block, &mut decoded),
        }
    }
    decoded
}

/// One decoded block's resources before the checks that span them: kind, scope, name, spec.
pub(super) type Specs = Vec<(Kind, String, String, Spec)>;

fn decode_block(cx: &mut DecodeCx<'_>, block: &Block, out: &mut Vec<Decoded>) {
    let before = cx.diagnostics.len();
    let origin = cx.location(block.ident.span());
    let _ = cx.take_references();
    let mut secrets = Vec::new();
    let specs = match block.ident.as_str() {
        "app" => decode_app(cx, block),
        "postgres" | "redis" => scope_and_name(cx, block).map(|(scope, name)| {
            let key = ResourceKey::new(Kind::Statefulset, scope.clone(), name.clone());
            let expansion = macros::expand(cx, block, &key);
            secrets = expansion.secrets;
            expansion
                .specs
                .into_iter()
                .map(|(kind, spec)| (kind, scope.clone(), name.clone(), spec))
                .collect()
        }),
        "hep3" => {
            refuse_hep3(cx, block);
            None
        }
        other => match kinds::decoder(other) {
            Some(decode) => decode(cx, block),
            None => {
                refuse_unknown(cx, block);
                None
            }
        },
    };
    let Some(specs) = specs else {
        return;
    };
    for (kind, scope, name, spec) in &specs {
        kinds::check_build_image(cx, block, &ResourceKey::new(*kind, scope, name), spec);
    }
    let references = cx.take_references();
    if cx.diagnostics.len() != before {
        cx.failed.extend(
            specs
                .into_iter()
                .map(|(kind, scope, name, _)| ResourceKey::new(kind, scope, name)),
        );
        return;
    }
    let locations = policy_locations(cx, &block.body);
    for (kind, scope, name, spec) in specs {
        out.push(Decoded {
            resource: Arc::new(Resource {
                key: ResourceKey::new(kind, scope, name),
                spec,
                origin: origin.clone(),
                json: SpecJson::default(),
            }),
            references: references.clone(),
            secrets: std::mem::take(&mut secrets),
            locations: locations.clone(),
            stamped: Stamped::default(),
        });
    }
}

/// `app "scope" "name"`: a deployment and its ingress from one body; `None` when its labels
/// are wrong.
fn decode_app(cx: &mut DecodeCx<'_>, block: &Block) -> Option<Specs> {
    let (scope, name, mut reader) = scoped(cx, block)?;
    let ingress = kinds::ingress(cx, &mut reader, true);
    let deployment = kinds::deployment(cx, &mut reader);
    reader.finish(cx);
    Some(vec![
        (
            Kind::Deployment,
            scope.clone(),
            name.clone(),
            Spec::Deployment(deployment),
        ),
        (Kind::Ingress, scope, name, Spec::Ingress(ingress)),
    ])
}

/// A block with scope and name labels (checked as names), and a reader over its body;
/// `None` when its labels are wrong.
fn scoped<'b>(cx: &mut DecodeCx<'_>, block: &'b Block) -> Option<(String, String, Reader<'b>)> {
    let (scope, name) = scope_and_name(cx, block)?;
    let reader = Reader::new(block.ident.as_str(), "", &block.body, block.ident.span());
    Some((scope, name, reader))
}

/// A block of no type the agent knows: refused, with the closest known type.
fn refuse_unknown(cx: &mut DecodeCx<'_>, block: &Block) {
    let other = block.ident.as_str();
    let known: Vec<&str> = Kind::ALL
        .iter()
        .map(|kind| kind.as_str())
        .chain(OTHER_BLOCK_TYPES.iter().copied())
        .collect();
    let hint = did_you_mean(other, &known);
    let hint = if hint.is_empty() {
        " (voodu plugin macros other than `postgres` and `redis` are not supported by this agent)"
            .to_owned()
    } else {
        hint
    };
    cx.error(
        block.ident.span(),
        format!("unknown block type `{other}`{hint}"),
    );
}

/// voodu's `hep3` plugin block: refused, with what to declare instead.
fn refuse_hep3(cx: &mut DecodeCx<'_>, block: &Block) {
    let labels = labels(cx, block)
        .into_iter()
        .map(|(label, _)| format!("{label:?}"))
        .collect::<Vec<_>>()
        .join(" ");
    cx.error(
        block.ident.span(),
        format!(
            "hep3 {labels} is not supported by this agent: its image (voodu-hep3-api:<version>) is built by the voodu-hep3 plugin's install hook, and voodu-agent installs and runs no plugins; build that image on this host yourself and declare the reader as a `deployment` (a hep3 block is a deployment spec plus `store`, which becomes HEP_STORE)"
        ),
    );
}

/// Fields the host policy reads, by name: the container fields at the block's root (and
/// `replicas`, `resources {}`, `autoscale {}` for a preview's caps),
/// `init "name".docker_options` of its init blocks, and a statefulset's
/// `backup.repository` and `backup.password_file` (host paths).
fn policy_locations(cx: &DecodeCx<'_>, body: &Body) -> BTreeMap<String, Diagnostic> {
    const FIELDS: &[&str] = &[
        "env_from",
        "volumes",
        "network",
        "networks",
        "network_mode",
        "cap_add",
        "docker_options",
        "replicas",
    ];
    let mut locations = BTreeMap::new();
    for structure in body.iter() {
        match structure {
            Structure::Attribute(attribute) if FIELDS.contains(&attribute.key.as_str()) => {
                locations.insert(
                    attribute.key.as_str().to_owned(),
                    cx.location(attribute.span()),
                );
            }
            Structure::Block(block)
                if matches!(
                    block.ident.as_str(),
                    "tls" | "on_deploy" | "on_probe" | "resources" | "autoscale"
                ) =>
            {
                locations.insert(
                    block.ident.as_str().to_owned(),
                    cx.location(block.ident.span()),
                );
            }
            Structure::Block(block) if block.ident.as_str() == "backup" => {
                // A statefulset's host paths; a second block is refused by the decoder.
                for inner in block.body.iter() {
                    if let Structure::Attribute(attribute) = inner
                        && matches!(attribute.key.as_str(), "repository" | "password_file")
                    {
                        locations
                            .entry(format!("backup.{}", attribute.key.as_str()))
                            .or_insert_with(|| cx.location(attribute.span()));
                    }
                }
            }
            Structure::Block(block) if block.ident.as_str() == "init" => {
                let Some(name) = block.labels.first().map(|label| match label {
                    hcl::edit::structure::BlockLabel::String(text) => text.as_str(),
                    hcl::edit::structure::BlockLabel::Ident(ident) => ident.as_str(),
                }) else {
                    continue;
                };
                for inner in block.body.iter() {
                    if let Structure::Attribute(attribute) = inner
                        && attribute.key.as_str() == "docker_options"
                    {
                        locations.insert(
                            format!("init {name:?}.docker_options"),
                            cx.location(attribute.span()),
                        );
                    }
                }
            }
            _ => {}
        }
    }
    locations
}

/// The two labels of a scoped block, checked as names.
fn scope_and_name(cx: &mut DecodeCx<'_>, block: &Block) -> Option<(String, String)> {
    let block_type = block.ident.as_str();
    let labels = labels(cx, block);
    if labels.len() != 2 {
        let message = if labels.len() > 2 {
            format!("{block_type} block: too many labels (max 2: scope and name)")
        } else {
            format!(
                "{block_type} block needs scope and name labels (got {}): write `{block_type} \"scope\" \"name\" {{ … }}`",
                labels.len()
            )
        };
        cx.error(block.ident.span(), message);
        return None;
    }
    let scope_ok = check_label(cx, block_type, "scope", &labels[0].0, labels[0].1.clone());
    let mut name_ok = check_label(cx, block_type, "name", &labels[1].0, labels[1].1.clone());
    if name_ok && matches!(block_type, "statefulset" | "postgres" | "redis") {
        let max = crate::model::names::MAX_STATEFULSET_NAME;
        if let Some(problem) = crate::model::names::too_long(
            &labels[1].0,
            max,
            "part of each pod's DNS name `<name>-<n>.<scope>`, one 63-byte label with the ordinal",
        ) {
            cx.error(
                labels[1].1.clone(),
                format!("{block_type} name {:?} {problem}", labels[1].0),
            );
            name_ok = false;
        }
    }
    (scope_ok && name_ok).then(|| (labels[0].0.clone(), labels[1].0.clone()))
}

fn check_label(
    cx: &mut DecodeCx<'_>,
    block_type: &str,
    what: &str,
    label: &str,
    span: Option<Range<usize>>,
) -> bool {
    match validate::check_name(label) {
        Ok(()) => true,
        Err(problem) => {
            cx.error(span, format!("{block_type} {what} {label:?} {problem}"));
            false
        }
    }
}
