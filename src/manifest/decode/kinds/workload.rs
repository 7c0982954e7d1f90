//! The fields of long-running workloads (deployment, statefulset, app): replicas, ports,
//! restart, `init` blocks, `probes {}`, `on_probe {}` and `drain {}`, and the webhook
//! target blocks `on_probe` and `on_deploy` share.

use std::collections::BTreeSet;

use hcl::edit::Span;

use super::super::reader::{DecodeCx, Reader, labels};
use super::super::values;
use super::checks::{check_at_most, check_items};
use super::container::{check_docker_options, check_image, check_ulimits, resources};
use super::probe::probes;
use crate::manifest::Diagnostic;
use crate::manifest::interpolate::Reference;
use crate::manifest::spec::bounds::{
    MAX_PUBLISHED_PORTS, MAX_REPLICAS, MAX_RESTART_RETRIES, MAX_STOP_GRACE, MAX_TIMEOUT,
    show_duration,
};
use crate::manifest::spec::{Drain, Init, OnProbe, Probes, WebhookTarget, normalize_port};
use crate::model::parse_go_duration;

/// Fields of long-running workloads (deployment, statefulset, app).
pub(super) struct Workload {
    pub(super) replicas: Option<i64>,
    pub(super) ports: Vec<String>,
    pub(super) restart: String,
    pub(super) health_check: String,
    pub(super) inits: Vec<Init>,
    pub(super) probes: Option<Probes>,
    pub(super) on_probe: Option<OnProbe>,
    pub(super) drain: Option<Drain>,
}

/// `bridge`: the container publishes its ports (not in host or none network mode). `kind`
/// names the block in messages voodu words with it (`deployment.drain.timeout: …`).
pub(super) fn workload(
    cx: &mut DecodeCx<'_>,
    r: &mut Reader<'_>,
    bridge: bool,
    kind: &str,
) -> Workload {
    let replicas = r.int(cx, "replicas");
    if let Some(replicas) = replicas.filter(|n| *n < 0) {
        cx.error(
            r.span_of("replicas"),
            format!("`replicas` must not be negative, got {replicas}"),
        );
    }
    if let Some(replicas) = replicas {
        check_at_most(
            cx,
            r.span_of("replicas"),
            "replicas",
            replicas,
            MAX_REPLICAS,
            "replicas per resource on one host: lower it, or spread the load over more hosts",
        );
    }
    let ports = r.strings(cx, "ports").unwrap_or_default();
    let mut n_published = 0;
    for (index, port) in ports.iter().enumerate() {
        match crate::model::parse_ports(&normalize_port(port)) {
            Some(mappings) => n_published += mappings.len(),
            None => cx.error(
                r.item_span("ports", index),
                format!("port {port:?} is not `[ip:][host_port:]container_port[/tcp|udp]`"),
            ),
        }
    }
    if bridge && n_published > MAX_PUBLISHED_PORTS {
        cx.error(
            r.span_of("ports"),
            format!("`ports` publish {n_published} ports, above the limit of {MAX_PUBLISHED_PORTS}: publish narrower ranges, or use network_mode = \"host\""),
        );
    }
    let restart = r.string(cx, "restart").unwrap_or_default();
    let restart_ok = matches!(restart.as_str(), "" | "no" | "always" | "unless-stopped")
        || restart == "on-failure"
        || restart
            .strip_prefix("on-failure:")
            .is_some_and(|n| n.parse::<u32>().is_ok());
    if let Some(retries) = restart
        .strip_prefix("on-failure:")
        .and_then(|n| n.parse::<u32>().ok())
    {
        check_at_most(
            cx,
            r.span_of("restart"),
            "restart",
            i64::from(retries),
            MAX_RESTART_RETRIES,
            "on-failure retries: lower the count, or use \"always\"",
        );
    }
    if !restart_ok {
        cx.error(
            r.span_of("restart"),
            format!("`restart` {restart:?} is not a Docker restart policy: no, always, unless-stopped, on-failure[:N]"),
        );
    }
    let health_check = r.string(cx, "health_check").unwrap_or_default();
    let inits = inits(cx, r);
    let probes = r.block(cx, "probes").map(|block| {
        let mut p = r.nested(block, "");
        let probes = probes(cx, &mut p);
        p.finish(cx);
        probes
    });
    let on_probe = r.block(cx, "on_probe").map(|block| {
        let mut o = r.nested(block, "");
        let on_probe = OnProbe {
            failure: targets(cx, &mut o, "failure"),
            recovery: targets(cx, &mut o, "recovery"),
        };
        o.finish(cx);
        on_probe
    });
    let drain = drain(cx, r, kind);
    Workload {
        replicas,
        ports,
        restart,
        health_check,
        inits,
        probes,
        on_probe,
        drain,
    }
}

/// `drain { grace, timeout }` (voodu 2026), its durations checked when the file is parsed,
/// with voodu's message (`deployment.drain.timeout: "30min" is not a duration …`).
fn drain(cx: &mut DecodeCx<'_>, r: &mut Reader<'_>, kind: &str) -> Option<Drain> {
    let block = r.block(cx, "drain")?;
    let mut d = r.nested(block, "");
    let mut drain = Drain::default();
    for (field, max, slot) in [
        ("grace", MAX_STOP_GRACE, &mut drain.grace),
        ("timeout", MAX_TIMEOUT, &mut drain.timeout),
    ] {
        let Some(text) = d.string(cx, field) else {
            continue;
        };
        match parse_go_duration(&text) {
            Some(duration) if duration <= max => *slot = text,
            Some(_) => cx.error(
                d.span_of(field),
                format!(
                    "{kind}.drain.{field}: {text:?} is above the limit of {}: write a shorter duration",
                    show_duration(max)
                ),
            ),
            None => cx.error(
                d.span_of(field),
                format!(
                    "{kind}.drain.{field}: {text:?} is not a duration (want e.g. \"30s\", \"5m\", \"1h30m\")"
                ),
            ),
        }
    }
    d.finish(cx);
    Some(drain)
}

fn inits(cx: &mut DecodeCx<'_>, r: &mut Reader<'_>) -> Vec<Init> {
    let mut inits: Vec<Init> = Vec::new();
    let mut names = BTreeSet::new();
    for (index, block) in r.blocks("init").into_iter().enumerate() {
        let label = labels(cx, block);
        let [(name, span)] = label.as_slice() else {
            cx.error(
                block.ident.span(),
                format!(
                    "init[{index}] missing name: write `init \"migrate\" {{ command = [...] }}`"
                ),
            );
            continue;
        };
        let valid = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if !valid {
            cx.error(
                span.clone(),
                format!("init {name:?} invalid name (must match [a-z0-9][a-z0-9-]*)"),
            );
        }
        if !names.insert(name.clone()) {
            cx.error(span.clone(), format!("duplicate init name {name:?}"));
        }
        let mut i = r.nested(block, name);
        let image = i.string(cx, "image");
        if let Some(image) = &image {
            check_image(cx, &i, image);
        }
        let mut init = Init {
            name: name.clone(),
            image: image.unwrap_or_default(),
            command: Vec::new(),
            timeout: i.duration(cx, "timeout", MAX_TIMEOUT).unwrap_or_default(),
            retries: i.int(cx, "retries").unwrap_or_default(),
            resources: None,
            ulimits: i.map(cx, "ulimits").unwrap_or_default(),
            docker_options: i.strings(cx, "docker_options").unwrap_or_default(),
        };
        check_docker_options(cx, &i, &init.docker_options);
        check_ulimits(cx, &i, &init.ulimits);
        let command = i.strings(cx, "command");
        let lacks_command = i.lacks("command", &command);
        init.command = command.unwrap_or_default();
        check_items(cx, &i, "command", &init.command, values::argument);
        if lacks_command {
            cx.error(
                block.ident.span(),
                format!("init {name:?} requires command"),
            );
        }
        if !(0..=5).contains(&init.retries) {
            cx.error(
                i.span_of("retries"),
                format!(
                    "init {name:?} retries must be in [0, 5] (got {})",
                    init.retries
                ),
            );
        }
        if let Some(resources_block) = i.block(cx, "resources") {
            let mut nested = i.nested(resources_block, "");
            init.resources = Some(resources(cx, &mut nested));
            nested.finish(cx);
        }
        i.finish(cx);
        inits.push(init);
    }
    inits
}

/// Whether `file` is, whole, the literal of the one asset reference `recorded` while it was read.
fn is_one_asset_reference(file: &str, recorded: &[(Reference, Diagnostic)]) -> bool {
    match recorded {
        [(Reference::Asset { scope, name, key }, _)] => {
            file == format!(
                "${{asset.{}}}",
                Reference::asset_ref(scope.as_deref(), name, key)
            )
        }
        _ => false,
    }
}

/// The repeatable webhook target blocks `name` of an `on_deploy` / `on_probe` block.
pub(super) fn targets(
    cx: &mut DecodeCx<'_>,
    r: &mut Reader<'_>,
    name: &'static str,
) -> Vec<WebhookTarget> {
    let blocks = r.blocks(name);
    let many = blocks.len() > 1;
    let mut targets = Vec::new();
    for (index, block) in blocks.into_iter().enumerate() {
        let slot = if many {
            format!("{}[{index}]", r.field(name))
        } else {
            r.field(name)
        };
        let mut t = r.nested(block, "");
        let url = t.string(cx, "url");
        let lacks_url = t.lacks("url", &url);
        let url = url.unwrap_or_default();
        if lacks_url {
            cx.error(block.ident.span(), format!("{slot}.url is required"));
        }
        let method = t.string(cx, "method").unwrap_or_default().to_uppercase();
        if !matches!(method.as_str(), "" | "POST" | "PUT" | "PATCH" | "DELETE") {
            cx.error(
                t.span_of("method"),
                format!("{slot}.method must be one of POST/PUT/PATCH/DELETE (got {method:?})"),
            );
        }
        let headers = t.map(cx, "headers").unwrap_or_default();
        let body = t.json(cx, "body");
        if body.as_ref().is_some_and(|body| !body.is_object()) {
            cx.error(
                t.span_of("body"),
                format!("{slot}.body must be an object like {{ text = \"…\" }}"),
            );
        }
        let before = cx.reference_count();
        let file = t.string(cx, "file").unwrap_or_default();
        if !file.is_empty() && !is_one_asset_reference(&file, cx.references_since(before)) {
            // voodu takes any text containing `${asset.` and resolves it at delivery; the
            // agent takes exactly one reference it recorded (never the escaped `$${…}`, which
            // is literal text, nor a path around one), so the file read is an asset file.
            cx.error(t.span_of("file"), format!("{slot}.file must be exactly one asset reference (${{asset.<scope>.<name>.<key>}} or ${{asset.<name>.<key>}}), got {file:?}; an escaped `$${{…}}` is literal text, not a reference"));
        }
        if body.is_some() && !file.is_empty() {
            cx.error(
                t.span_of("file"),
                format!("{slot}: body and file are mutually exclusive"),
            );
        }
        t.finish(cx);
        targets.push(WebhookTarget {
            url,
            method,
            headers,
            body,
            file,
        });
    }
    targets
}
