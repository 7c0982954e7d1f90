//! Plugin-owned nested blocks of a `deployment` or `statefulset` (voodu 2026,
//! `internal/manifest/plugin_nested.go`): the blocks the kind's reader did not ask for become
//! `PluginBlock`s, in order, with their labels, their body as JSON and where they are written.
//!
//! The body is rendered as voodu's parser renders a plugin body (spec §2.9): attributes as
//! JSON values (strings interpolated), a nested block type that occurs once as an object and
//! one that repeats as an array of objects, nested labels under `"_labels"`.
//!
//! Invariant: a body that cannot be rendered (a function call, an unresolved `${…}`) is a
//! located error like any other value's; a block's contents are otherwise never checked.

use hcl::edit::Span;
use hcl::edit::structure::{Block, Body, Structure};
use serde_json::{Map, Value};

use super::reader::{DecodeCx, Reader, labels, to_json};
use crate::manifest::spec::PluginBlock;
use crate::manifest::spec::bounds::MAX_PLUGIN_BLOCKS;

/// Finishes a workload's reader, turning the blocks it did not ask for into plugin blocks.
pub(super) fn carry(cx: &mut DecodeCx<'_>, reader: Reader<'_>) -> Vec<PluginBlock> {
    let what = reader.what.clone();
    let carried = reader.finish_carrying_blocks(cx);
    plugin_blocks(cx, &what, carried)
}

/// The carried blocks of one workload (`what` names it in messages), as plugin blocks.
fn plugin_blocks(
    cx: &mut DecodeCx<'_>,
    what: &str,
    carried: Vec<(&Block, String)>,
) -> Vec<PluginBlock> {
    if let Some((extra, _)) = carried.get(MAX_PLUGIN_BLOCKS) {
        cx.error(
            extra.ident.span(),
            format!(
                "{what} has {} plugin blocks; at most {MAX_PLUGIN_BLOCKS} are allowed",
                carried.len()
            ),
        );
        return Vec::new();
    }
    carried
        .into_iter()
        .map(|(block, near)| {
            let block_type = block.ident.as_str().to_owned();
            let labels = labels(cx, block)
                .into_iter()
                .map(|(label, _)| label)
                .collect();
            let spec = body_json(cx, &block_type, &block.body);
            let hint = if near.is_empty() {
                String::new()
            } else {
                format!(" (did you mean `{near}`?)")
            };
            cx.warn(
                block.ident.span(),
                format!(
                    "block `{block_type}` belongs to a plugin named {block_type:?}{hint}; voodu-agent installs no plugins, so this {what} fails when applied and its running containers are kept"
                ),
            );
            let at = cx.location(block.ident.span());
            PluginBlock {
                block_type,
                labels,
                spec: Value::Object(spec),
                at: format!("{}:{}:{}", at.path, at.line, at.col),
                near,
            }
        })
        .collect()
}

/// A body as a JSON object: attributes by name; nested blocks by type, an object when the
/// type occurs once and an array when it repeats, their labels under `"_labels"`.
fn body_json(cx: &mut DecodeCx<'_>, field: &str, body: &Body) -> Map<String, Value> {
    let mut object = Map::new();
    let mut nested: Vec<(String, Vec<Value>)> = Vec::new();
    for structure in body.iter() {
        match structure {
            Structure::Attribute(attribute) => {
                let name = attribute.key.as_str();
                let path = format!("{field}.{name}");
                if let Some(value) = to_json(cx, &attribute.value, &path) {
                    object.insert(name.to_owned(), value);
                }
            }
            Structure::Block(block) => {
                let name = block.ident.as_str();
                let mut inner = body_json(cx, &format!("{field}.{name}"), &block.body);
                let block_labels: Vec<Value> = labels(cx, block)
                    .into_iter()
                    .map(|(label, _)| Value::String(label))
                    .collect();
                if !block_labels.is_empty() {
                    inner.insert("_labels".to_owned(), Value::Array(block_labels));
                }
                match nested.iter_mut().find(|(seen, _)| seen == name) {
                    Some((_, items)) => items.push(Value::Object(inner)),
                    None => nested.push((name.to_owned(), vec![Value::Object(inner)])),
                }
            }
        }
    }
    for (name, mut items) in nested {
        let value = if items.len() == 1 {
            items.remove(0)
        } else {
            Value::Array(items)
        };
        object.insert(name, value);
    }
    object
}
