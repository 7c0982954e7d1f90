//! A branch preview's manifests: the text of each file with every resource block's scope
//! label mapped (`shop` → `shop-pr-feat-x`) and every `ingress`/`app` block's `host` mapped
//! by the host template (`model::previews`). Only those labels and values change, in place,
//! so every other location (`path:line:col`) stays where the author wrote it; the rest of the
//! text, references to scopes included, is loaded as written: a reference to the base
//! scope's buckets, assets or claims is refused by the preview's seal at its location.
//!
//! Invariants: a file that does not parse is left as it is (the load reports it); unscoped
//! blocks (one label) are left as they are (the preview's source does not own `""`, so they
//! are refused at their block).

use hcl::edit::Span as _;
use hcl::edit::expr::Expression;
use hcl::edit::structure::BlockLabel;

use crate::model::previews::PreviewRules;
use crate::model::{Snapshot, SourceFile};

/// `snapshot` as preview `slug` of `rules` deploys it.
pub(crate) fn rewrite(snapshot: &Snapshot, rules: &PreviewRules, slug: &str) -> Snapshot {
    Snapshot {
        commit: snapshot.commit.clone(),
        files: snapshot
            .files
            .iter()
            .map(|file| SourceFile {
                path: file.path.clone(),
                contents: std::str::from_utf8(&file.contents)
                    .ok()
                    .and_then(|text| rewrite_text(text, rules, slug))
                    .map_or_else(|| file.contents.clone(), String::into_bytes),
            })
            .collect(),
        refused: snapshot.refused.clone(),
    }
}

/// The text with its scopes and hosts mapped; `None` when it does not parse.
fn rewrite_text(text: &str, rules: &PreviewRules, slug: &str) -> Option<String> {
    let body = hcl::edit::parser::parse_body(text).ok()?;
    // (byte range, replacement), applied from the end.
    let mut edits: Vec<(std::ops::Range<usize>, String)> = Vec::new();
    for block in body.blocks() {
        let labels: Vec<(&str, Option<std::ops::Range<usize>>)> = block
            .labels
            .iter()
            .map(|label| match label {
                BlockLabel::String(text) => (text.as_str(), text.span()),
                BlockLabel::Ident(ident) => (ident.as_str(), ident.span()),
            })
            .collect();
        let [(scope, Some(at)), (name, _), ..] = labels.as_slice() else {
            continue;
        };
        let Some(mapped) = rules.map_scope(scope, slug) else {
            continue;
        };
        edits.push((at.clone(), format!("{mapped:?}")));
        if matches!(block.ident.as_str(), "ingress" | "app")
            && let Some(host) = block
                .body
                .attributes()
                .find(|attribute| attribute.key.as_str() == "host")
            && matches!(host.value, Expression::String(_))
            && let Some(span) = host.value.span()
        {
            edits.push((span, format!("{:?}", rules.map_host(slug, scope, name))));
        }
    }
    edits.sort_by_key(|(range, _)| std::cmp::Reverse(range.start));
    let mut text = text.to_owned();
    for (range, replacement) in edits {
        if text.get(range.clone()).is_some() {
            text.replace_range(range, &replacement);
        }
    }
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_and_hosts_are_mapped_in_place() {
        let rules = PreviewRules {
            branches: "preview/*".to_owned(),
            separator: "-pr-".to_owned(),
            host: "{slug}.preview.test".to_owned(),
            ttl: std::time::Duration::from_secs(60),
            max: 2,
            policy: None,
            caps: crate::model::policy::Caps::default(),
        };
        let text = "deployment \"shop\" \"web\" {\n  image = \"x\"\n}\n\ningress \"shop\" \"web\" {\n  host = \"shop.test\"\n  port = 80\n}\n\nregistry \"hub\" {\n  server = \"r\"\n}\n";
        let got = rewrite_text(text, &rules, "feat-x");
        assert_eq!(
            got.as_deref(),
            Some(
                "deployment \"shop-pr-feat-x\" \"web\" {\n  image = \"x\"\n}\n\ningress \"shop-pr-feat-x\" \"web\" {\n  host = \"feat-x.preview.test\"\n  port = 80\n}\n\nregistry \"hub\" {\n  server = \"r\"\n}\n"
            )
        );
        assert_eq!(rewrite_text("deployment {", &rules, "x"), None);
    }
}
