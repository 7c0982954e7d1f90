//! `registry "name"`: a registry's URL and its credentials, or a credential helper.

use hcl::edit::Span;
use hcl::edit::structure::Block;

use super::super::reader::{DecodeCx, Reader, labels};
use super::super::{Specs, check_label, values};
use super::Decoder;
use crate::manifest::spec::{RegistrySpec, Spec};
use crate::model::Kind;

fn registry(cx: &mut DecodeCx<'_>, r: &mut Reader<'_>) -> RegistrySpec {
    let url = r.string(cx, "url");
    let username = r.string(cx, "username");
    let token = r.string(cx, "token");
    let password = r.string(cx, "password");
    let helper = r.string(cx, "helper").unwrap_or_default();
    let anchor = r.anchor.clone();
    if r.lacks("url", &url) {
        cx.error(
            anchor.clone(),
            "registry needs `url` (a host such as \"ghcr.io\")",
        );
    }
    if let Some(url) = &url
        && url.contains(|c: char| c.is_whitespace() || c.is_control())
    {
        cx.error(
            r.span_of("url"),
            format!("registry `url` {url:?} must not contain whitespace or control characters"),
        );
    }
    for (field, value) in [
        ("username", &username),
        ("token", &token),
        ("password", &password),
    ] {
        if let Some(problem) = value
            .as_deref()
            .and_then(|text| values::one_line(text).err())
        {
            cx.error(r.span_of(field), format!("registry `{field}`: {problem}"));
        }
    }
    let given = |value: &Option<String>| value.as_ref().is_some_and(|text| !text.is_empty());
    if !helper.is_empty() {
        if given(&username) || given(&token) || given(&password) {
            cx.error(
                r.span_of("helper"),
                "`helper` and `username`/`token` are mutually exclusive: a credential helper supplies the credentials",
            );
        }
        if matches!(helper.as_str(), "ecr" | "aws") {
            cx.error(
                r.span_of("helper"),
                format!("helper {helper:?} is not a credential helper name: use \"ecr-login\" (docker-credential-ecr-login)"),
            );
        }
    } else {
        if r.lacks("username", &username) {
            cx.error(
                anchor.clone(),
                "registry needs `username` (or use `helper` for a credential helper)",
            );
        }
        if r.lacks("token", &token) && r.lacks("password", &password) {
            cx.error(
                anchor,
                "registry needs `token` (or `password`), or use `helper` for a credential helper",
            );
        }
    }
    let token = token
        .filter(|token| !token.is_empty())
        .or(password)
        .unwrap_or_default();
    RegistrySpec {
        url: url.unwrap_or_default(),
        username: username.unwrap_or_default(),
        token,
        helper,
    }
}

/// `registry "name"` (unscoped); `None` when its label is wrong.
impl Decoder for RegistrySpec {
    fn decode(cx: &mut DecodeCx<'_>, block: &Block) -> Option<Specs> {
        let labels = labels(cx, block);
        let [(name, span)] = labels.as_slice() else {
            cx.error(
                block.ident.span(),
                format!(
                    "registry block needs exactly one label (its name), got {} — write `registry \"name\" {{ ... }}`, e.g. `registry \"ecr\" {{ ... }}`",
                    labels.len()
                ),
            );
            return None;
        };
        check_label(cx, "registry", "name", name, span.clone());
        let mut reader = Reader::new("registry", "", &block.body, block.ident.span());
        let spec = registry(cx, &mut reader);
        reader.finish(cx);
        Some(vec![(
            Kind::Registry,
            String::new(),
            name.clone(),
            Spec::Registry(spec),
        )])
    }
}
