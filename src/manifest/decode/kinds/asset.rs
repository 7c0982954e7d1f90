//! `asset ["scope"] "name" { key = … }`: each key's source, inline text, `file()` or
//! `url()`, with its digest.

use std::collections::BTreeMap;
use std::ops::Range;
use std::time::Duration;

use hcl::edit::Span;
use hcl::edit::expr::Expression;
use hcl::edit::structure::{Block, Body, Structure};

use super::super::reader::{DecodeCx, describe, labels, to_map, to_string};
use super::super::sources::Read;
use super::super::{Specs, check_label};
use super::Decoder;
use super::checks::truncated;
use crate::manifest::Mode;
use crate::manifest::spec::bounds::{MAX_FETCH_TIMEOUT, show_duration};
use crate::manifest::spec::{AssetFile, AssetSpec, Spec, sha256_hex};
use crate::model::{Kind, parse_go_duration};

/// `asset ["scope"] "name" { key = "inline" | file("path") | url("href", {…}) }`.
fn asset(cx: &mut DecodeCx<'_>, body: &Body, anchor: Option<Range<usize>>) -> AssetSpec {
    let mut spec = AssetSpec::default();
    for structure in body.iter() {
        let attribute = match structure {
            Structure::Block(block) => {
                cx.error(
                    block.ident.span(),
                    "nested blocks are not supported (asset bodies are flat key/source pairs)",
                );
                continue;
            }
            Structure::Attribute(attribute) => attribute,
        };
        let key = attribute.key.as_str().to_owned();
        if !key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            cx.error(
                attribute.key.span(),
                format!("asset key {key:?}: invalid key: must be alphanumeric + underscore + hyphen (no dots, no whitespace)"),
            );
            continue;
        }
        if let Some(problem) = crate::model::names::too_long(
            &key,
            crate::model::names::MAX_ASSET_KEY,
            "the file name of `<data-dir>/assets/<scope>/<name>/<key>`",
        ) {
            cx.error(
                attribute.key.span(),
                format!("asset key {:?}… {problem}", truncated(&key)),
            );
            continue;
        }
        if spec.files.contains_key(&key) {
            cx.error(
                attribute.key.span(),
                format!("asset key `{key}` is set twice"),
            );
            continue;
        }
        if let Some((file, bytes)) = asset_source(cx, &key, &attribute.value) {
            if let Some(bytes) = bytes {
                cx.blobs.insert(file.digest.clone(), bytes);
            }
            spec.files.insert(key, file);
        }
    }
    if spec.files.is_empty() && cx.diagnostics.is_empty() {
        cx.warn(anchor, "asset declares no keys");
    }
    spec
}

/// One asset key's source: its description and bytes (`None` when not fetched: validate).
fn asset_source(
    cx: &mut DecodeCx<'_>,
    key: &str,
    value: &Expression,
) -> Option<(AssetFile, Option<Vec<u8>>)> {
    let field = format!("asset key `{key}`");
    let span = value.span();
    match value {
        Expression::FuncCall(call) => {
            let function = call.name.name.as_str();
            let args: Vec<&Expression> = call.args.iter().collect();
            match (function, args.as_slice()) {
                ("file", [path]) => file_source(cx, &field, span, path),
                ("url", [href, rest @ ..]) if rest.len() <= 1 => {
                    url_source(cx, &field, span, href, rest.first().copied())
                }
                ("file" | "url", _) => {
                    cx.error(span, format!("{function}() takes {}", if function == "file" { "one path: file(\"./config.json\")" } else { "a URL and optional options: url(\"https://…\", { timeout = \"10s\" })" }));
                    None
                }
                (other, _) => {
                    cx.error(span, format!("unknown function `{other}()`: asset sources are a string, file(\"path\") or url(\"https://…\")"));
                    None
                }
            }
        }
        Expression::String(_) | Expression::StringTemplate(_) | Expression::HeredocTemplate(_) => {
            let text = to_string(cx, value, &field)?;
            let file = described("inline", String::new(), String::new(), text.as_bytes());
            Some((file, Some(text.into_bytes())))
        }
        other => {
            cx.error(
                span,
                format!(
                    "{field} must be a string, file(\"path\") or url(\"https://…\"), got {}",
                    describe(other)
                ),
            );
            None
        }
    }
}

/// An asset file's description from its source kind, origin and bytes.
fn described(source: &str, origin: String, on_failure: String, bytes: &[u8]) -> AssetFile {
    AssetFile {
        source: source.to_owned(),
        origin,
        on_failure,
        digest: sha256_hex(bytes),
        size: bytes.len() as u64,
        sealed: false,
    }
}

/// `file("path")`: read from the repository; a SOPS-encrypted file is kept sealed, for the
/// host to decrypt.
fn file_source(
    cx: &mut DecodeCx<'_>,
    field: &str,
    span: Option<Range<usize>>,
    path: &Expression,
) -> Option<(AssetFile, Option<Vec<u8>>)> {
    let path = to_string(cx, path, field)?;
    match cx.read_file(&path) {
        Read::Bytes(bytes) => {
            let mut file = described("file", path.clone(), String::new(), &bytes);
            // A SOPS-encrypted source is decrypted on the host, never here.
            match crate::manifest::sops::parse(&bytes) {
                Some(Ok(_)) => file.sealed = true,
                Some(Err(problem)) => {
                    cx.error(
                        span,
                        format!("file({path:?}) is not a readable SOPS file: {problem}"),
                    );
                    return None;
                }
                None => {}
            }
            Some((file, Some(bytes)))
        }
        Read::Failed(message) if message.is_missing() && cx.env.mode == Mode::Validate => {
            cx.warn(
                span,
                format!("file({path:?}): {message}; the agent rejects a commit without it"),
            );
            Some((described("file", path, String::new(), b""), None))
        }
        Read::Failed(message) => {
            cx.error(span, format!("file(): {message}"));
            None
        }
    }
}

/// `url("href", { timeout on_failure })`: fetched through the load's fetcher (not in
/// validate mode, where the bytes are `None`).
fn url_source(
    cx: &mut DecodeCx<'_>,
    field: &str,
    span: Option<Range<usize>>,
    href: &Expression,
    options: Option<&Expression>,
) -> Option<(AssetFile, Option<Vec<u8>>)> {
    let href = to_string(cx, href, field)?;
    if !(href.starts_with("https://") || href.starts_with("http://"))
        || href.len() <= "https://".len()
    {
        cx.error(
            span,
            format!("url({href:?}): only http:// and https:// URLs can be fetched"),
        );
        return None;
    }
    let options = match options {
        Some(options) => to_map(cx, options, "url() options")?,
        None => BTreeMap::new(),
    };
    let mut timeout = Duration::from_secs(30);
    let mut on_failure = "stale".to_owned();
    for (option, text) in &options {
        match option.as_str() {
            "timeout" => match parse_go_duration(text) {
                Some(parsed) if parsed > MAX_FETCH_TIMEOUT => cx.error(span.clone(), format!("url() timeout {text:?} is above the limit of {}: a fetch holds up the whole commit; write a shorter timeout", show_duration(MAX_FETCH_TIMEOUT))),
                Some(parsed) if !parsed.is_zero() => timeout = parsed,
                _ => cx.error(span.clone(), format!("url() timeout {text:?} must be a duration like \"10s\"")),
            },
            "on_failure" => match text.as_str() {
                "error" | "stale" | "skip" => on_failure.clone_from(text),
                other => cx.error(span.clone(), format!("url() on_failure {other:?} must be \"error\", \"stale\" or \"skip\"")),
            },
            other => cx.error(span.clone(), format!("unknown url() option `{other}` (timeout, on_failure)")),
        }
    }
    match cx.fetch(&href, timeout, on_failure != "error") {
        None => Some((described("url", href, on_failure, b""), None)),
        Some(Ok(bytes)) => {
            let file = described("url", href, on_failure, &bytes);
            Some((file, Some(bytes)))
        }
        Some(Err(error)) => {
            cx.error(span, format!("url({href:?}): {error}"));
            None
        }
    }
}

/// `asset "name"` (unscoped) or `asset "scope" "name"`; `None` when its labels are wrong.
impl Decoder for AssetSpec {
    fn decode(cx: &mut DecodeCx<'_>, block: &Block) -> Option<Specs> {
        let labels = labels(cx, block);
        let (scope, name, name_span) = match labels.as_slice() {
            [(name, span)] => (String::new(), name.clone(), span.clone()),
            [(scope, scope_span), (name, span)] => {
                check_label(cx, "asset", "scope", scope, scope_span.clone());
                (scope.clone(), name.clone(), span.clone())
            }
            _ => {
                cx.error(
                    block.ident.span(),
                    format!(
                        "asset block takes 1 label (unscoped) or 2 labels (scoped), got {}: write `asset \"scope\" \"name\" {{ key = … }}`",
                        labels.len()
                    ),
                );
                return None;
            }
        };
        check_label(cx, "asset", "name", &name, name_span);
        let spec = asset(cx, &block.body, block.ident.span());
        Some(vec![(Kind::Asset, scope, name, Spec::Asset(spec))])
    }
}
