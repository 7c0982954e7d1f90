//! `ingress` (and the ingress half of `app`): host, service and port, `tls {}`, `location`
//! blocks and `lb {}`.

use hcl::edit::Span;
use hcl::edit::structure::Block;

use super::super::reader::{DecodeCx, Reader};
use super::super::{Specs, scoped};
use super::Decoder;
use crate::manifest::interpolate::is_ref_segment;
use crate::manifest::spec::bounds::MAX_PROBE_DURATION;
use crate::manifest::spec::{IngressSpec, LoadBalancing, Location, Spec, Tls};
use crate::model::Kind;

/// An `ingress`, or the ingress half of an `app` (which routes to its own deployment).
pub(in crate::manifest::decode) fn ingress(
    cx: &mut DecodeCx<'_>,
    r: &mut Reader<'_>,
    app: bool,
) -> IngressSpec {
    let mut spec = IngressSpec {
        host: r.required_string(cx, "host").unwrap_or_default(),
        ..IngressSpec::default()
    };
    if spec
        .host
        .contains(|c: char| c.is_whitespace() || c.is_control() || c == '/')
    {
        cx.error(
            r.span_of("host"),
            format!(
                "`host` {:?} is not a host name: no whitespace, control characters or `/`",
                spec.host
            ),
        );
    }
    if app {
        r.refuse(
            &["service", "port"],
            "an app's ingress routes to its own deployment; declare a separate `ingress` to route elsewhere",
        );
    } else {
        spec.service = r.string(cx, "service").unwrap_or_default();
        if !spec.service.is_empty() && !is_ref_segment(&spec.service) {
            cx.error(
                r.span_of("service"),
                format!(
                    "`service` {:?} must name a deployment of this scope",
                    spec.service
                ),
            );
        }
        spec.port = r.int(cx, "port").unwrap_or_default();
        if !(0..=65535).contains(&spec.port) {
            cx.error(
                r.span_of("port"),
                format!("`port` must be 1–65535, got {}", spec.port),
            );
        }
    }
    spec.tls = tls(cx, r);
    for block in r.blocks("location") {
        spec.locations.push(location(cx, r, block));
    }
    spec.lb = lb(cx, r);
    spec
}

/// `tls { enabled provider email on_demand ask }`.
fn tls(cx: &mut DecodeCx<'_>, r: &mut Reader<'_>) -> Option<Tls> {
    let block = r.block(cx, "tls")?;
    let mut t = r.nested(block, "");
    let tls = Tls {
        enabled: t.bool(cx, "enabled").unwrap_or(true),
        provider: t.string(cx, "provider").unwrap_or_default(),
        email: t.string(cx, "email").unwrap_or_default(),
        on_demand: t.bool(cx, "on_demand").unwrap_or_default(),
        ask: t.string(cx, "ask").unwrap_or_default(),
    };
    if !matches!(tls.provider.as_str(), "" | "letsencrypt" | "internal") {
        cx.error(
            t.span_of("provider"),
            format!(
                "tls.provider {:?} must be \"letsencrypt\" or \"internal\"",
                tls.provider
            ),
        );
    }
    t.finish(cx);
    Some(tls)
}

/// One `location { path strip }` block (it takes no label).
fn location(cx: &mut DecodeCx<'_>, r: &mut Reader<'_>, block: &Block) -> Location {
    if !block.labels.is_empty() {
        cx.error(
            block.ident.span(),
            "`location` takes no label: write `location { path = \"/api\" }`",
        );
    }
    let mut l = r.nested(block, "");
    let path = l.required_string(cx, "path").unwrap_or_default();
    if !path.is_empty() && !path.starts_with('/') {
        cx.error(
            l.span_of("path"),
            format!("location.path must start with '/', got {path:?}"),
        );
    } else if path.contains(|c: char| c.is_whitespace() || c.is_control()) {
        cx.error(
            l.span_of("path"),
            format!("location.path {path:?} must not contain whitespace or control characters (percent-encode them)"),
        );
    }
    let strip = l.bool(cx, "strip").unwrap_or_default();
    l.finish(cx);
    Location { path, strip }
}

/// `lb { policy interval }`: how requests spread over the replicas.
fn lb(cx: &mut DecodeCx<'_>, r: &mut Reader<'_>) -> Option<LoadBalancing> {
    let block = r.block(cx, "lb")?;
    let mut l = r.nested(block, "");
    let lb = LoadBalancing {
        policy: l.string(cx, "policy").unwrap_or_default(),
        interval: l
            .duration(cx, "interval", MAX_PROBE_DURATION)
            .unwrap_or_default(),
    };
    if !matches!(
        lb.policy.as_str(),
        "" | "round_robin" | "random" | "least_conn" | "ip_hash"
    ) {
        cx.error(
            l.span_of("policy"),
            format!(
                "lb.policy {:?} must be one of round_robin, random, least_conn, ip_hash",
                lb.policy
            ),
        );
    }
    l.finish(cx);
    Some(lb)
}

/// `ingress "scope" "name" { … }`.
impl Decoder for IngressSpec {
    fn decode(cx: &mut DecodeCx<'_>, block: &Block) -> Option<Specs> {
        let (scope, name, mut reader) = scoped(cx, block)?;
        let spec = ingress(cx, &mut reader, false);
        reader.finish(cx);
        Some(vec![(Kind::Ingress, scope, name, Spec::Ingress(spec))])
    }
}
