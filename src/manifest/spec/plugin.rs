//! Plugin-owned nested blocks (voodu 2026, `manifests/plugin-blocks.mdx`): a block inside a
//! `deployment` or `statefulset` that the core schema does not know belongs to the plugin of
//! the same name (`trafik { port = 8084 }`, `trafik "sip" { … }`). It is carried opaquely —
//! type, labels, body as JSON, order kept — and never read by the agent.
//!
//! Invariants:
//! - a block is never a reason to reject a commit: the agent installs no plugins, so at apply
//!   the resource fails with voodu's "belongs to a plugin named …, which is not installed"
//!   message (`not_installed`), before any of its containers is touched;
//! - plugin blocks stay out of the spec hash: a plugin configures itself from its block and
//!   never the container (voodu's controller only lets a plugin validate and normalise its
//!   block), so adding, editing or removing one replaces no replica.

use serde::{Deserialize, Serialize};

/// One plugin-owned block, in declaration order among its siblings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginBlock {
    /// The block's type: the name of the plugin that owns it.
    #[serde(rename = "type")]
    pub block_type: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
    /// The body as JSON, as voodu's parser renders a plugin body (spec §2.9).
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub spec: serde_json::Value,
    /// Where the block is written, `path:line:col` (the agent's own field).
    #[serde(rename = "_at", default, skip_serializing_if = "String::is_empty")]
    pub(crate) at: String,
    /// A block name of the same workload within two edits of this one (a likely typo), or
    /// empty (the agent's own field).
    #[serde(rename = "_near", default, skip_serializing_if = "String::is_empty")]
    pub(crate) near: String,
}

impl PluginBlock {
    /// voodu's apply-time refusal of a block whose plugin is not installed, followed by where
    /// the block is and, when its name is close to a core block, that name. Every plugin
    /// block gets it here: the agent installs no plugins.
    ///
    /// The text after `resource` is voodu's (`internal/controller/plugin_nested.go`);
    /// `resource` is `kind/scope/name`.
    pub(crate) fn not_installed(&self, resource: &str) -> String {
        let block = &self.block_type;
        let mut message = format!(
            "{resource}: block {block:?} belongs to a plugin named {block:?}, which is not installed — run `vd plugins:install <source>` or remove the block"
        );
        let mut notes = Vec::new();
        if !self.at.is_empty() {
            notes.push(format!("at {}", self.at));
        }
        if self.near.is_empty() {
            notes.push("voodu-agent installs no plugins".to_owned());
        } else {
            notes.push(format!("did you mean `{}`?", self.near));
        }
        message.push_str(&format!(" ({})", notes.join("; ")));
        message
    }
}

/// The refusal of the first plugin block of a workload (voodu stops at the first one too),
/// or `None` when it has none.
pub(crate) fn plugin_refusal(
    resource: impl std::fmt::Display,
    blocks: &[PluginBlock],
) -> Option<String> {
    blocks
        .first()
        .map(|block| block.not_installed(&resource.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(block_type: &str, near: &str) -> PluginBlock {
        PluginBlock {
            block_type: block_type.into(),
            labels: Vec::new(),
            spec: serde_json::json!({"port": 8084}),
            at: "esl.hcl:13:3".into(),
            near: near.into(),
        }
    }

    #[test]
    fn the_refusal_starts_with_voodus_message_and_says_where() {
        assert_eq!(
            block("trafik", "").not_installed("deployment/prod/esl"),
            "deployment/prod/esl: block \"trafik\" belongs to a plugin named \"trafik\", which is not installed — run `vd plugins:install <source>` or remove the block (at esl.hcl:13:3; voodu-agent installs no plugins)"
        );
        assert_eq!(
            block("probs", "probes").not_installed("statefulset/data/pg"),
            "statefulset/data/pg: block \"probs\" belongs to a plugin named \"probs\", which is not installed — run `vd plugins:install <source>` or remove the block (at esl.hcl:13:3; did you mean `probes`?)"
        );
    }

    #[test]
    fn only_the_first_block_is_reported_and_none_without_blocks() {
        assert_eq!(plugin_refusal("deployment/a/b", &[]), None);
        let refusal = plugin_refusal(
            "deployment/a/b",
            &[block("trafik", ""), block("haproxy", "")],
        );
        assert!(
            refusal.is_some_and(|text| text.contains("\"trafik\"") && !text.contains("haproxy"))
        );
    }

    #[test]
    fn a_block_round_trips_through_json_with_voodus_field_names() -> serde_json::Result<()> {
        let mut labelled = block("trafik", "");
        labelled.labels = vec!["sip".into()];
        let json = serde_json::to_string(&labelled)?;
        assert_eq!(
            json,
            r#"{"type":"trafik","labels":["sip"],"spec":{"port":8084},"_at":"esl.hcl:13:3"}"#
        );
        assert_eq!(serde_json::from_str::<PluginBlock>(&json)?, labelled);
        Ok(())
    }
}
