//! `probes { liveness readiness startup }`: one action each (`http_get`, `tcp_socket` or
//! `exec`) and its timings.

use std::ops::Range;

use hcl::edit::Span;

use super::super::reader::{DecodeCx, Reader};
use super::super::values;
use super::checks::{check_at_most, check_items};
use crate::manifest::spec::bounds::{MAX_PROBE_DURATION, MAX_PROBE_THRESHOLD};
use crate::manifest::spec::{ExecAction, HttpGet, Probe, Probes, TcpSocket};

pub(super) fn probes(cx: &mut DecodeCx<'_>, r: &mut Reader<'_>) -> Probes {
    let mut probes = Probes::default();
    for (name, slot) in [
        ("liveness", &mut probes.liveness),
        ("readiness", &mut probes.readiness),
        ("startup", &mut probes.startup),
    ] {
        if let Some(block) = r.block(cx, name) {
            let mut p = r.nested(block, "");
            *slot = Some(probe(cx, &mut p, name, block.ident.span()));
            p.finish(cx);
        }
    }
    probes
}

fn probe(
    cx: &mut DecodeCx<'_>,
    r: &mut Reader<'_>,
    name: &str,
    anchor: Option<Range<usize>>,
) -> Probe {
    let mut probe = Probe {
        http_get: http_get(cx, r, name),
        tcp_socket: tcp_socket(cx, r, name),
        exec: exec(cx, r, name),
        ..Probe::default()
    };
    let actions = [
        probe.http_get.is_some(),
        probe.tcp_socket.is_some(),
        probe.exec.is_some(),
    ]
    .into_iter()
    .filter(|declared| *declared)
    .count();
    match actions {
        0 => cx.error(
            anchor,
            format!("probes.{name} requires exactly one of http_get / tcp_socket / exec"),
        ),
        1 => {}
        _ => cx.error(
            anchor,
            format!("probes.{name}: only one of http_get / tcp_socket / exec may be declared"),
        ),
    }
    probe.initial_delay = r
        .duration(cx, "initial_delay", MAX_PROBE_DURATION)
        .unwrap_or_default();
    probe.period = r
        .duration(cx, "period", MAX_PROBE_DURATION)
        .unwrap_or_default();
    probe.timeout = r
        .duration(cx, "timeout", MAX_PROBE_DURATION)
        .unwrap_or_default();
    for (field, slot) in [
        ("failure_threshold", &mut probe.failure_threshold),
        ("success_threshold", &mut probe.success_threshold),
    ] {
        let value = r.int(cx, field).unwrap_or_default();
        if value < 0 {
            cx.error(
                r.span_of(field),
                format!("probes.{name}.{field} must be at least 1, got {value}"),
            );
        }
        check_at_most(
            cx,
            r.span_of(field),
            &r.field(field),
            value,
            MAX_PROBE_THRESHOLD,
            "probe results in a row: lower it, or lengthen `period`",
        );
        *slot = value;
    }
    probe
}

/// `http_get { path port scheme http_headers }` of probe `name`.
fn http_get(cx: &mut DecodeCx<'_>, r: &mut Reader<'_>, name: &str) -> Option<HttpGet> {
    let block = r.block(cx, "http_get")?;
    let mut h = r.nested(block, "");
    let path = h.string(cx, "path");
    let lacks_path = h.lacks("path", &path);
    let path = path.unwrap_or_default();
    if lacks_path {
        cx.error(
            block.ident.span(),
            format!("probes.{name}.http_get.path is required"),
        );
    } else if !path.is_empty() && !path.starts_with('/') {
        cx.error(
            h.span_of("path"),
            format!("probes.{name}.http_get.path must start with '/'"),
        );
    } else if path.contains(|c: char| c.is_whitespace() || c.is_control()) {
        cx.error(
            h.span_of("path"),
            format!("probes.{name}.http_get.path {path:?} must not contain whitespace or control characters (percent-encode them)"),
        );
    }
    let port = h.int(cx, "port").unwrap_or_default();
    check_probe_port(
        cx,
        h.span_of("port").or(block.ident.span()),
        &format!("probes.{name}.http_get.port"),
        port,
    );
    let scheme = h.string(cx, "scheme").unwrap_or_default();
    if !matches!(scheme.as_str(), "" | "http" | "https") {
        cx.error(
            h.span_of("scheme"),
            format!("probes.{name}.http_get.scheme must be \"http\" or \"https\""),
        );
    }
    let http_headers = h.map(cx, "http_headers").unwrap_or_default();
    for (header, value) in &http_headers {
        if let Err(problem) = values::one_line(header).and_then(|()| values::one_line(value)) {
            cx.error(
                h.key_span("http_headers", header),
                format!("probes.{name}.http_get.http_headers {header:?}: {problem}"),
            );
        }
    }
    h.finish(cx);
    Some(HttpGet {
        path,
        port,
        scheme,
        http_headers,
    })
}

/// `tcp_socket { port }` of probe `name`.
fn tcp_socket(cx: &mut DecodeCx<'_>, r: &mut Reader<'_>, name: &str) -> Option<TcpSocket> {
    let block = r.block(cx, "tcp_socket")?;
    let mut t = r.nested(block, "");
    let port = t.int(cx, "port").unwrap_or_default();
    check_probe_port(
        cx,
        t.span_of("port").or(block.ident.span()),
        &format!("probes.{name}.tcp_socket.port"),
        port,
    );
    t.finish(cx);
    Some(TcpSocket { port })
}

/// `exec { command }` of probe `name`.
fn exec(cx: &mut DecodeCx<'_>, r: &mut Reader<'_>, name: &str) -> Option<ExecAction> {
    let block = r.block(cx, "exec")?;
    let mut e = r.nested(block, "");
    let command = e.strings(cx, "command");
    let lacks_command = e.lacks("command", &command);
    let command = command.unwrap_or_default();
    if lacks_command {
        cx.error(
            block.ident.span(),
            format!("probes.{name}.exec.command must be non-empty"),
        );
    }
    check_items(cx, &e, "command", &command, values::argument);
    e.finish(cx);
    Some(ExecAction { command })
}

fn check_probe_port(cx: &mut DecodeCx<'_>, span: Option<Range<usize>>, field: &str, port: i64) {
    if !(1..=65535).contains(&port) {
        cx.error(span, format!("{field} is required (got {port})"));
    }
}
