//! Per-kind decoders: voodu's field names, types, parser defaults and validation rules
//! (spec §2), one function per kind plus the shared container fields and sub-blocks.
//!
//! Invariant: every rule voodu checks (at parse time or only later, at reconcile) is checked
//! here, at the line that breaks it, so a commit the agent accepts does not fail on the host
//! for a reason the manifest alone shows.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::time::Duration;

use hcl::edit::Span;
use hcl::edit::expr::Expression;
use hcl::edit::structure::{Body, Structure};

use super::reader::{Cx, Reader, describe, labels, to_map, to_string};
use super::sources::Read;
use super::values::{self, IMAGE_FORM};
use crate::manifest::interpolate::{Reference, is_ref_segment};
use crate::manifest::spec::bounds::{
    MAX_CPUS, MAX_FETCH_TIMEOUT, MAX_HISTORY, MAX_IMAGE_SCAN_INTERVAL, MAX_LOG_FILES, MAX_LOG_SIZE,
    MAX_MEMORY, MAX_PROBE_DURATION, MAX_PROBE_THRESHOLD, MAX_PUBLISHED_PORTS, MAX_REPLICAS,
    MAX_RESTART_RETRIES, MAX_STOP_GRACE, MAX_TIMEOUT, MAX_ULIMIT, MAX_VOLUME_SIZE, MIN_MEMORY,
    show_duration,
};
use crate::manifest::spec::schedule::check_schedule;
use crate::manifest::spec::{
    AssetFile, AssetSpec, Autoscale, Build, Container, CronjobSpec, DependsOn, DeploymentSpec,
    Drain, ExecAction, HttpGet, ImageUpdate, IngressSpec, Init, JobSpec, Lang, Limits,
    LoadBalancing, Location, Logs, MIN_IMAGE_SCAN_INTERVAL, OnDeploy, OnProbe, Probe, Probes,
    RegistrySpec, ReleaseHooks, Resources, SealedEnv, StatefulsetSpec, TcpSocket, Tls, VolumeClaim,
    WebhookTarget, normalize_port, sha256_hex,
};
use crate::manifest::{Diagnostic, Mode};
use crate::model::{DockerOptions, parse_go_duration};

/// The §2.0 container fields every container kind shares.
pub(super) fn container(cx: &mut Cx<'_>, r: &mut Reader<'_>) -> Container {
    let image = r.string(cx, "image");
    if let Some(image) = &image {
        check_image(cx, r, image);
    }
    let image_update = image_update(cx, r, image.as_deref());
    let mut container = Container {
        image_update,
        image: image.unwrap_or_default(),
        command: r.strings(cx, "command"),
        ..Container::default()
    };
    if let Some(command) = &container.command {
        check_items(cx, r, "command", command, values::argument);
    }
    let env = r.map(cx, "env").unwrap_or_default();
    check_env(cx, r, &env);
    let (file_env, mut sealed) = env_files(cx, r);
    container.env = file_env;
    for key in env.keys() {
        for file in &mut sealed {
            file.keys.retain(|sealed_key| sealed_key != key);
        }
    }
    container.env.extend(env);
    container.env_sealed = sealed;
    container.env_from = r.strings(cx, "env_from").unwrap_or_default();
    if !container.env_from.is_empty() {
        let span = r.span_of("env_from");
        for reference in &container.env_from {
            let valid = match reference.split_once('/') {
                Some((scope, name)) => is_ref_segment(scope) && is_ref_segment(name),
                None => is_ref_segment(reference),
            };
            if !valid {
                cx.error(
                    span.clone(),
                    format!("`env_from` entry {reference:?} must be \"scope/name\" (an app bucket) or \"name\" (a bucket of this scope)"),
                );
            }
        }
    }
    container.volumes = r.strings(cx, "volumes").unwrap_or_default();
    check_items(cx, r, "volumes", &container.volumes, values::volume);
    container.network = r.string(cx, "network").unwrap_or_default();
    if let Err(problem) = values::one_line(&container.network) {
        cx.error(
            r.span_of("network"),
            format!("`{}`: {problem}", r.field("network")),
        );
    }
    container.networks = r.strings(cx, "networks").unwrap_or_default();
    check_items(cx, r, "networks", &container.networks, values::one_line);
    container.network_mode = r.string(cx, "network_mode").unwrap_or_default();
    match container.network_mode.as_str() {
        "" => {}
        "host" | "none" => {
            if !container.network.is_empty() || !container.networks.is_empty() {
                cx.error(
                    r.span_of("network_mode"),
                    format!(
                        "network_mode={:?} is mutually exclusive with network/networks",
                        container.network_mode
                    ),
                );
            }
        }
        other => cx.error(
            r.span_of("network_mode"),
            format!("network_mode={other:?} not supported (want \"host\" or \"none\"; omit for bridge mode)"),
        ),
    }
    container.extra_hosts = r.strings(cx, "extra_hosts").unwrap_or_default();
    check_items(cx, r, "extra_hosts", &container.extra_hosts, |entry| {
        if entry.contains("${") && values::one_line(entry).is_ok() {
            return Ok(());
        }
        DockerOptions::check_extra_host(entry)
    });
    container.cap_add = r.strings(cx, "cap_add").unwrap_or_default();
    check_items(cx, r, "cap_add", &container.cap_add, values::one_line);
    container.ulimits = r.map(cx, "ulimits").unwrap_or_default();
    check_ulimits(cx, r, &container.ulimits);
    container.docker_options = r.strings(cx, "docker_options").unwrap_or_default();
    check_docker_options(cx, r, &container.docker_options);
    if let Some(block) = r.block(cx, "build") {
        let mut b = r.nested(block, "");
        let mut build = Build {
            context: b.string(cx, "context").unwrap_or_default(),
            dockerfile: b.string(cx, "dockerfile").unwrap_or_default(),
            path: b.string(cx, "path").unwrap_or_default(),
            args: b.map(cx, "args").unwrap_or_default(),
            lang: None,
        };
        if build.context.is_empty() {
            build.context = ".".to_owned();
        }
        if let Some(lang_block) = b.block(cx, "lang") {
            let mut l = b.nested(lang_block, "");
            build.lang = Some(Lang {
                name: l.string(cx, "name").unwrap_or_default(),
                version: l.string(cx, "version").unwrap_or_default(),
                entrypoint: l.string(cx, "entrypoint").unwrap_or_default(),
            });
            l.finish(cx);
        }
        b.finish(cx);
        if !container.image.is_empty() {
            cx.error(
                block.ident.span(),
                "`image` and `build {}` are mutually exclusive: use `image` to pull from a registry, or `build {}` to build from source — not both",
            );
        }
        container.build = Some(build);
    } else if container.image.is_empty() {
        // voodu's parser default: no image means build mode at the repo root.
        container.build = Some(Build {
            context: ".".to_owned(),
            ..Build::default()
        });
    }
    if let Some(block) = r.block(cx, "depends_on") {
        let mut d = r.nested(block, "");
        let assets = d.strings(cx, "assets").unwrap_or_default();
        let span = d.span_of("assets");
        for entry in &assets {
            let segments: Vec<&str> = entry.split('.').collect();
            let valid = segments.iter().all(|segment| is_ref_segment(segment));
            let reference = match segments.as_slice() {
                [scope, name, key] if valid => Some(Reference::Asset {
                    scope: Some((*scope).to_owned()),
                    name: (*name).to_owned(),
                    key: (*key).to_owned(),
                }),
                [name, key] if valid => Some(Reference::Asset {
                    scope: None,
                    name: (*name).to_owned(),
                    key: (*key).to_owned(),
                }),
                _ => None,
            };
            match reference {
                Some(reference) => cx.record_reference(reference, span.clone()),
                None => cx.error(
                    span.clone(),
                    format!(
                        "depends_on.assets[{entry:?}]: expected 2 or 3 segments separated by '.', got {}",
                        segments.len()
                    ),
                ),
            }
        }
        d.finish(cx);
        container.depends_on = Some(DependsOn { assets });
    }
    if let Some(block) = r.block(cx, "resources") {
        let mut nested = r.nested(block, "");
        container.resources = Some(resources(cx, &mut nested));
        nested.finish(cx);
    }
    if let Some(block) = r.block(cx, "logs") {
        let mut l = r.nested(block, "");
        let mut logs = Logs::default();
        if let Some(max_size) = l.string(cx, "max_size").filter(|s| !s.is_empty()) {
            match crate::model::parse_docker_size(&max_size) {
                None => cx.error(
                    l.span_of("max_size"),
                    format!("`{}` {max_size:?} is not a size: write a number with b, k, m or g, like \"10m\"", l.field("max_size")),
                ),
                Some(bytes) if bytes > MAX_LOG_SIZE => cx.error(
                    l.span_of("max_size"),
                    format!("`{}` {max_size:?} is above the limit of 1g per log file: write a smaller size (and raise `max_files` for more history)", l.field("max_size")),
                ),
                Some(_) => {}
            }
            logs.max_size = max_size;
        }
        if let Some(max_files) = l.int(cx, "max_files").filter(|n| *n > 0) {
            let span = l.span_of("max_files");
            check_at_most(
                cx,
                span,
                &l.field("max_files"),
                max_files,
                MAX_LOG_FILES,
                "log files per container: keep fewer",
            );
            logs.max_files = max_files;
        }
        l.finish(cx);
        container.logs = logs;
    }
    container
}

/// `ulimits` values as `docker run --ulimit` takes them.
fn check_ulimits(cx: &mut Cx<'_>, r: &Reader<'_>, ulimits: &BTreeMap<String, String>) {
    for (name, value) in ulimits {
        let span = r.key_span("ulimits", name);
        if !values::ULIMIT_NAMES.contains(&name.as_str()) {
            cx.error(
                span.clone(),
                format!(
                    "`{}.{name}` is not a ulimit Docker knows ({})",
                    r.field("ulimits"),
                    values::ULIMIT_NAMES.join(", ")
                ),
            );
        }
        match crate::model::parse_ulimit(value) {
            None => cx.error(
                span,
                format!("`{}.{name}` {value:?} is not a ulimit: write \"soft:hard\" or one number (-1 for unlimited)", r.field("ulimits")),
            ),
            Some((soft, hard)) if soft.max(hard) > MAX_ULIMIT => cx.error(
                span,
                format!("`{}.{name}` {value:?} is above the limit of {MAX_ULIMIT}: write a smaller value, or -1 for unlimited", r.field("ulimits")),
            ),
            Some(_) => {}
        }
    }
}

/// `image`: written empty, or not a reference Docker accepts. A value still holding an
/// `${asset.…}` / `${ref.…}` reference is checked when it is resolved.
fn check_image(cx: &mut Cx<'_>, r: &Reader<'_>, image: &str) {
    let Some(span) = r.span_of("image") else {
        return;
    };
    if image.contains("${") {
        return;
    }
    if image.is_empty() {
        cx.error(
            Some(span),
            format!(
                "`{}` is empty: name an image such as \"nginx:1.27\", or leave `image` out",
                r.field("image")
            ),
        );
    } else if let Err(problem) = values::image_reference(image) {
        cx.error(
            Some(span),
            format!(
                "`{}` {image:?} is not an image reference: {problem}; {IMAGE_FORM}",
                r.field("image")
            ),
        );
    }
}

/// `image_update { policy range filter extract interval mode push_branch }` (agent
/// extension): every field checked here, at its line, so a scan never meets a bad policy.
fn image_update(cx: &mut Cx<'_>, r: &mut Reader<'_>, image: Option<&str>) -> Option<ImageUpdate> {
    let block = r.block(cx, "image_update")?;
    let mut u = r.nested(block, "");
    let anchor = block.ident.span();
    let mut update = ImageUpdate {
        policy: u.string(cx, "policy").unwrap_or_default(),
        range: u.string(cx, "range").unwrap_or_default(),
        filter: u.string(cx, "filter").unwrap_or_default(),
        extract: u.string(cx, "extract").unwrap_or_default(),
        interval: u
            .duration(cx, "interval", MAX_IMAGE_SCAN_INTERVAL)
            .unwrap_or_default(),
        mode: u.string(cx, "mode").unwrap_or_default(),
        push_branch: u.string(cx, "push_branch").unwrap_or_default(),
    };
    if let Err(error) = update.policy() {
        cx.error(
            u.span_of(error.field).or(anchor.clone()),
            format!("`image_update.{}` {}", error.field, error.message),
        );
    }
    if let Some(interval) = parse_go_duration(&update.interval)
        && interval < MIN_IMAGE_SCAN_INTERVAL
    {
        cx.error(
            u.span_of("interval"),
            format!(
                "image_update.interval {:?} is below the minimum of {}: a registry is a shared service, scan it less often",
                update.interval,
                show_duration(MIN_IMAGE_SCAN_INTERVAL)
            ),
        );
    }
    if !matches!(update.mode.as_str(), "" | "commit" | "report") {
        cx.error(
            u.span_of("mode"),
            format!(
                "image_update.mode {:?} is not a mode: use \"commit\" (write the new tag to git) or \"report\" (only show it)",
                update.mode
            ),
        );
    }
    if !update.push_branch.is_empty() && !is_branch_name(&update.push_branch) {
        cx.error(
            u.span_of("push_branch"),
            format!(
                "image_update.push_branch {:?} is not a branch name: letters, digits and `/._-`, not starting with `-` or `/`, no `..`",
                update.push_branch
            ),
        );
        update.push_branch.clear();
    }
    u.finish(cx);
    match image {
        None => cx.error(
            anchor,
            "image_update needs `image` with a tag to follow, like `image = \"ghcr.io/acme/web:1.4.2\"`",
        ),
        Some(image) if image.contains("${") => cx.error(
            r.span_of("image"),
            "image_update follows a literal `image`: write the image without `${…}` so the new tag can be committed in its place",
        ),
        // `policy = "digest"` keeps the tag it follows pinned by digest (`name:tag@sha256:…`).
        Some(image) if image.contains('@') && update.policy != "digest" => cx.error(
            r.span_of("image"),
            format!("image_update follows tags, and {image:?} is pinned by digest: write a tag instead, or use policy = \"digest\" to follow its digest"),
        ),
        Some(image)
            if crate::model::image_tag(image.split_once('@').map_or(image, |(name, _)| name))
                .is_none() =>
        {
            cx.error(
            r.span_of("image"),
            format!("image_update needs a tag in `image` to start from: write {image:?} with its current tag, like \"{image}:1.0.0\""),
            );
        }
        Some(_) => {}
    }
    Some(update)
}

/// A git branch name the agent may push to.
fn is_branch_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 200
        && !name.starts_with(['-', '/'])
        && !name.ends_with(['/', '.'])
        && !name.contains("..")
        && !name.contains("//")
        && !name.ends_with(".lock")
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '_' | '-'))
}

/// A build-mode resource runs `<scope>-<name>:latest`: that must be an image reference too
/// (an upper-case scope or name is not).
pub(super) fn check_build_image(
    cx: &mut Cx<'_>,
    block: &hcl::edit::structure::Block,
    key: &crate::model::ResourceKey,
    spec: &crate::manifest::spec::Spec,
) {
    let Some(container) = spec.container() else {
        return;
    };
    if !container.image.is_empty() {
        return;
    }
    let image = container.effective_image(key);
    if let Err(problem) = values::image_reference(&image) {
        cx.error(
            block.ident.span(),
            format!(
                "without `image` this {} runs the build-mode image {image:?}, which is not an image reference: {problem}; set `image`, or use a lowercase scope and name",
                key.kind
            ),
        );
    }
}

/// `env` names and values as Docker reads `NAME=value`.
fn check_env(cx: &mut Cx<'_>, r: &Reader<'_>, env: &BTreeMap<String, String>) {
    for (name, value) in env {
        if let Err(problem) = values::env_name(name).and_then(|()| values::env_value(value)) {
            cx.error(
                r.key_span("env", name),
                format!("`{}` {name:?}: {problem}", r.field("env")),
            );
        }
    }
}

/// Every item of list `name` through `check`, reported at the item: `check`'s error says
/// what is wrong, the diagnostic adds where (the field, its index, `path:line:col`).
fn check_items<E: std::fmt::Display>(
    cx: &mut Cx<'_>,
    r: &Reader<'_>,
    name: &str,
    items: &[String],
    check: impl Fn(&str) -> Result<(), E>,
) {
    for (index, item) in items.iter().enumerate() {
        if let Err(problem) = check(item) {
            cx.error(
                r.item_span(name, index),
                format!("`{}[{index}]` {item:?}: {problem}", r.field(name)),
            );
        }
    }
}

/// Reports `value` above `max` at `span`; `what_to_do` follows the bound.
fn check_at_most(
    cx: &mut Cx<'_>,
    span: Option<Range<usize>>,
    field: &str,
    value: i64,
    max: i64,
    what_to_do: &str,
) {
    if value > max {
        cx.error(
            span,
            format!("`{field}` is {value}, above the limit of {max} {what_to_do}"),
        );
    }
}

/// `docker_options` must be flags the agent can express through Docker's API.
fn check_docker_options(cx: &mut Cx<'_>, r: &Reader<'_>, options: &[String]) {
    if let Err(problem) = crate::model::DockerOptions::parse(options) {
        cx.error(
            r.span_of("docker_options"),
            format!("`{}`: {problem}", r.field("docker_options")),
        );
    }
}

/// `env_file = [...]`: read from the repo and merged in order (later wins), under `env`. A
/// file carrying SOPS metadata (`manifest::sops`) is not read for values: its variables are
/// named (they are in clear in the file) and its encrypted bytes kept by digest, to be
/// decrypted on the host; a later file or `env` still wins over the variables it names.
fn env_files(cx: &mut Cx<'_>, r: &mut Reader<'_>) -> (BTreeMap<String, String>, Vec<SealedEnv>) {
    let mut merged = BTreeMap::new();
    let mut sealed: Vec<SealedEnv> = Vec::new();
    let Some(paths) = r.strings(cx, "env_file") else {
        return (merged, sealed);
    };
    let span = r.span_of("env_file");
    for path in paths {
        match cx.read_file(&path) {
            Read::Bytes(bytes) => {
                if let Some(parsed) = crate::manifest::sops::parse(&bytes) {
                    match parsed {
                        Ok(file) if file.format == crate::manifest::sops::SopsFormat::Binary => {
                            cx.error(
                                span.clone(),
                                format!("env_file {path:?} is a binary SOPS file; encrypt an env file as dotenv, YAML or JSON (sops --input-type dotenv) so its variables are named"),
                            );
                        }
                        Ok(file) => {
                            let keys: Vec<String> = file
                                .top_level_keys()
                                .into_iter()
                                .map(ToOwned::to_owned)
                                .collect();
                            for name in &keys {
                                if let Err(problem) = values::env_name(name) {
                                    cx.error(
                                        span.clone(),
                                        format!("env_file {path:?}: {name:?}: {problem}"),
                                    );
                                }
                                merged.remove(name);
                                for earlier in &mut sealed {
                                    earlier.keys.retain(|key| key != name);
                                }
                            }
                            let digest = sha256_hex(&bytes);
                            cx.blobs.insert(digest.clone(), bytes);
                            sealed.push(SealedEnv {
                                path: path.clone(),
                                digest,
                                keys,
                            });
                        }
                        Err(problem) => cx.error(
                            span.clone(),
                            format!("env_file {path:?} is not a readable SOPS file: {problem}"),
                        ),
                    }
                    continue;
                }
                match crate::manifest::parse_env_file(&String::from_utf8_lossy(&bytes)) {
                    Ok(read) => {
                        for (name, value) in &read {
                            if let Err(problem) =
                                values::env_name(name).and_then(|()| values::env_value(value))
                            {
                                cx.error(
                                    span.clone(),
                                    format!("env_file {path:?}: {name:?}: {problem}"),
                                );
                            }
                            for earlier in &mut sealed {
                                earlier.keys.retain(|key| key != name);
                            }
                        }
                        merged.extend(read);
                    }
                    Err(problem) => cx.error(span.clone(), format!("env_file {path:?} {problem}")),
                }
            }
            Read::Failed(message) if message.is_missing() && cx.env.mode == Mode::Validate => {
                cx.warn(
                    span.clone(),
                    format!("env_file {message}; the agent rejects a commit without it"),
                );
            }
            Read::Failed(message) => {
                cx.error(span.clone(), format!("env_file {message}"));
            }
        }
    }
    sealed.retain(|file| !file.keys.is_empty());
    (merged, sealed)
}

/// `resources { limits { cpu, memory } }`, checked as voodu's reconciler would check it.
fn resources(cx: &mut Cx<'_>, r: &mut Reader<'_>) -> Resources {
    let mut resources = Resources::default();
    if let Some(block) = r.block(cx, "limits") {
        let mut l = r.nested(block, "");
        let cpu = l.string(cx, "cpu").unwrap_or_default();
        if !cpu.is_empty() {
            match crate::model::parse_cpus(&cpu) {
                None => cx.error(
                    l.span_of("cpu"),
                    format!("`{}` {cpu:?} is not a CPU amount: write a decimal like \"1.5\" or millicores like \"500m\"", l.field("cpu")),
                ),
                Some(nanos) if nanos < 10_000_000 => cx.error(
                    l.span_of("cpu"),
                    format!("`{}` {cpu:?} is below Docker's minimum of 0.01 CPUs (\"10m\")", l.field("cpu")),
                ),
                Some(nanos) if nanos > MAX_CPUS * 1_000_000_000 => cx.error(
                    l.span_of("cpu"),
                    format!("`{}` {cpu:?} is above the limit of {MAX_CPUS} CPUs: write the cores this container may use", l.field("cpu")),
                ),
                Some(_) => {}
            }
        }
        let memory = l.string(cx, "memory").unwrap_or_default();
        if !memory.is_empty() {
            match crate::model::parse_memory(&memory) {
                None => cx.error(
                    l.span_of("memory"),
                    format!("`{}` {memory:?} is not a memory size: write bytes, or a number with Ki Mi Gi Ti (1024-based) or K M G T (1000-based)", l.field("memory")),
                ),
                Some(bytes) if bytes < MIN_MEMORY => cx.error(
                    l.span_of("memory"),
                    format!("`{}` {memory:?} is below Docker's minimum of 6Mi", l.field("memory")),
                ),
                Some(bytes) if bytes > MAX_MEMORY => cx.error(
                    l.span_of("memory"),
                    format!("`{}` {memory:?} is above the limit of 16Ti: write the memory this container may use", l.field("memory")),
                ),
                Some(_) => {}
            }
        }
        l.finish(cx);
        resources.limits = Some(Limits { cpu, memory });
    }
    r.refuse(&["requests"], "voodu supports only `limits`");
    resources
}

/// Fields of long-running workloads (deployment, statefulset, app).
struct Workload {
    replicas: Option<i64>,
    ports: Vec<String>,
    restart: String,
    health_check: String,
    inits: Vec<Init>,
    probes: Option<Probes>,
    on_probe: Option<OnProbe>,
    drain: Option<Drain>,
}

/// `bridge`: the container publishes its ports (not in host or none network mode). `kind`
/// names the block in messages voodu words with it (`deployment.drain.timeout: …`).
fn workload(cx: &mut Cx<'_>, r: &mut Reader<'_>, bridge: bool, kind: &str) -> Workload {
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
fn drain(cx: &mut Cx<'_>, r: &mut Reader<'_>, kind: &str) -> Option<Drain> {
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

pub(super) fn deployment(cx: &mut Cx<'_>, r: &mut Reader<'_>) -> DeploymentSpec {
    let container = container(cx, r);
    let workload = workload(cx, r, container.network_mode.is_empty(), "deployment");
    let mut spec = DeploymentSpec {
        container,
        replicas: workload.replicas,
        ports: workload.ports,
        restart: workload.restart,
        health_check: workload.health_check,
        post_deploy: r.strings(cx, "post_deploy").unwrap_or_default(),
        keep_releases: r.int(cx, "keep_releases").unwrap_or_default(),
        inits: workload.inits,
        probes: workload.probes,
        on_probe: workload.on_probe,
        drain: workload.drain,
        ..DeploymentSpec::default()
    };
    if spec.health_check.is_empty() {
        spec.health_check = "/".to_owned();
    }
    check_items(cx, r, "post_deploy", &spec.post_deploy, values::argument);
    if spec.keep_releases < 0 {
        cx.error(
            r.span_of("keep_releases"),
            format!(
                "`keep_releases` must not be negative, got {}",
                spec.keep_releases
            ),
        );
    }
    check_at_most(
        cx,
        r.span_of("keep_releases"),
        "keep_releases",
        spec.keep_releases,
        MAX_HISTORY,
        "releases kept per deployment: keep fewer",
    );
    if let Some(block) = r.block(cx, "release") {
        let mut rel = r.nested(block, "");
        let hooks = ReleaseHooks {
            command: rel.strings(cx, "command").unwrap_or_default(),
            pre_command: rel.strings(cx, "pre_command").unwrap_or_default(),
            post_command: rel.strings(cx, "post_command").unwrap_or_default(),
            timeout: rel.duration(cx, "timeout", MAX_TIMEOUT).unwrap_or_default(),
        };
        check_items(cx, &rel, "command", &hooks.command, values::argument);
        check_items(
            cx,
            &rel,
            "pre_command",
            &hooks.pre_command,
            values::argument,
        );
        check_items(
            cx,
            &rel,
            "post_command",
            &hooks.post_command,
            values::argument,
        );
        spec.release = Some(hooks);
        rel.finish(cx);
    }
    if let Some(block) = r.block(cx, "autoscale") {
        let mut a = r.nested(block, "");
        let autoscale = Autoscale {
            min: a.int(cx, "min").unwrap_or_default(),
            max: a.int(cx, "max").unwrap_or_default(),
            cpu_target: a.int(cx, "cpu_target").unwrap_or_default(),
            cooldown_up: a
                .duration(cx, "cooldown_up", MAX_TIMEOUT)
                .unwrap_or_default(),
            cooldown_down: a
                .duration(cx, "cooldown_down", MAX_TIMEOUT)
                .unwrap_or_default(),
        };
        let anchor = block.ident.span();
        if autoscale.min < 1 {
            cx.error(
                a.span_of("min").or(anchor.clone()),
                format!("autoscale.min must be >= 1 (got {})", autoscale.min),
            );
        }
        if autoscale.max < autoscale.min {
            cx.error(
                a.span_of("max").or(anchor.clone()),
                format!(
                    "autoscale.max ({}) must be >= autoscale.min ({})",
                    autoscale.max, autoscale.min
                ),
            );
        }
        for (field, value) in [("min", autoscale.min), ("max", autoscale.max)] {
            check_at_most(
                cx,
                a.span_of(field),
                &a.field(field),
                value,
                MAX_REPLICAS,
                "replicas per resource on one host: lower it, or spread the load over more hosts",
            );
        }
        if !(1..=100).contains(&autoscale.cpu_target) {
            cx.error(
                a.span_of("cpu_target").or(anchor),
                format!(
                    "autoscale.cpu_target must be in (0, 100], got {}",
                    autoscale.cpu_target
                ),
            );
        }
        a.finish(cx);
        if spec.replicas.is_some() {
            cx.error(
                r.span_of("replicas"),
                "replicas and autoscale are mutually exclusive — use min/max instead",
            );
        } else if autoscale.min > 0 {
            spec.replicas = Some(autoscale.min);
        }
        spec.autoscale = Some(autoscale);
    }
    if let Some(block) = r.block(cx, "on_deploy") {
        let mut o = r.nested(block, "");
        spec.on_deploy = Some(OnDeploy {
            success: targets(cx, &mut o, "success"),
            failure: targets(cx, &mut o, "failure"),
        });
        o.finish(cx);
    }
    spec
}

pub(super) fn statefulset(cx: &mut Cx<'_>, r: &mut Reader<'_>) -> StatefulsetSpec {
    let container = container(cx, r);
    let workload = workload(cx, r, container.network_mode.is_empty(), "statefulset");
    let mut claims: Vec<VolumeClaim> = Vec::new();
    for block in r.blocks("volume_claim") {
        let label = labels(cx, block);
        let [(name, span)] = label.as_slice() else {
            cx.error(
                block.ident.span(),
                "`volume_claim` needs one label, its name: write `volume_claim \"data\" { mount_path = \"/data\" }`",
            );
            continue;
        };
        if !is_ref_segment(name) {
            cx.error(
                span.clone(),
                format!("volume_claim {name:?}: a claim name uses letters, digits, `_` and `-`"),
            );
        }
        if let Some(problem) = crate::model::names::too_long(
            name,
            crate::model::names::MAX_CLAIM,
            "part of the Docker volume `voodu-<scope>-<name>-<claim>-<n>`",
        ) {
            cx.error(
                span.clone(),
                format!("volume_claim {:?}… {problem}", truncated(name)),
            );
        }
        if claims.iter().any(|claim| &claim.name == name) {
            cx.error(span.clone(), format!("duplicate volume_claim {name:?}"));
        }
        let mut v = r.nested(block, name);
        let mount_path = v.required_string(cx, "mount_path").unwrap_or_default();
        if !mount_path.is_empty() && !mount_path.starts_with('/') {
            cx.error(
                v.span_of("mount_path"),
                format!("volume_claim {name:?}: mount_path must be absolute, got {mount_path:?}"),
            );
        }
        let size = v.string(cx, "size").unwrap_or_default();
        if !size.is_empty() {
            match crate::model::parse_memory(&size) {
                None => cx.error(
                    v.span_of("size"),
                    format!("volume_claim {name:?}: size {size:?} is not a size: write a number with Ki Mi Gi Ti (1024-based) or K M G T (1000-based), like \"20Gi\""),
                ),
                Some(bytes) if bytes > MAX_VOLUME_SIZE => cx.error(
                    v.span_of("size"),
                    format!("volume_claim {name:?}: size {size:?} is above the limit of 1024Ti: write a smaller size"),
                ),
                Some(_) => {}
            }
        }
        if let Err(problem) = values::one_line(&mount_path) {
            cx.error(
                v.span_of("mount_path"),
                format!("volume_claim {name:?}: mount_path {problem}"),
            );
        }
        v.finish(cx);
        claims.push(VolumeClaim {
            name: name.clone(),
            mount_path,
            size,
        });
    }
    r.refuse(
        &[
            "post_deploy",
            "keep_releases",
            "release",
            "autoscale",
            "on_deploy",
        ],
        "it is a deployment field; statefulsets have no release hooks, autoscaling or on_deploy",
    );
    StatefulsetSpec {
        container,
        replicas: workload.replicas,
        ports: workload.ports,
        restart: workload.restart,
        health_check: workload.health_check,
        volume_claims: claims,
        inits: workload.inits,
        probes: workload.probes,
        on_probe: workload.on_probe,
        drain: workload.drain,
        plugin_blocks: Vec::new(),
        expanded_from: None,
        asset_digests: BTreeMap::new(),
    }
}

/// The job fields (shared by `job` and, flat at its root, `cronjob`).
fn job_fields(cx: &mut Cx<'_>, r: &mut Reader<'_>) -> JobSpec {
    let container = container(cx, r);
    let mut spec = JobSpec {
        container,
        timeout: r.duration(cx, "timeout", MAX_TIMEOUT).unwrap_or_default(),
        successful_history_limit: r.int(cx, "successful_history_limit").unwrap_or_default(),
        failed_history_limit: r.int(cx, "failed_history_limit").unwrap_or_default(),
        asset_digests: BTreeMap::new(),
    };
    r.refuse(
        &[
            "replicas",
            "ports",
            "restart",
            "health_check",
            "probes",
            "init",
            "autoscale",
            "release",
            "on_deploy",
            "on_probe",
            "volume_claim",
        ],
        "jobs run to completion once; that field is for long-running workloads",
    );
    for (field, slot) in [
        (
            "successful_history_limit",
            &mut spec.successful_history_limit,
        ),
        ("failed_history_limit", &mut spec.failed_history_limit),
    ] {
        if *slot < 0 {
            cx.error(
                r.span_of(field),
                format!("`{field}` must not be negative, got {slot} (0 means the default)"),
            );
            *slot = 0;
        }
        check_at_most(
            cx,
            r.span_of(field),
            field,
            *slot,
            MAX_HISTORY,
            "runs kept per job: keep fewer",
        );
    }
    spec
}

pub(super) fn job(cx: &mut Cx<'_>, r: &mut Reader<'_>) -> JobSpec {
    job_fields(cx, r)
}

pub(super) fn cronjob(cx: &mut Cx<'_>, r: &mut Reader<'_>) -> CronjobSpec {
    let schedule = r.required_string(cx, "schedule").unwrap_or_default();
    if !schedule.is_empty()
        && let Err(problem) = check_schedule(&schedule)
    {
        cx.error(
            r.span_of("schedule"),
            format!("`schedule` {schedule:?}: {problem}"),
        );
    }
    let timezone = r.string(cx, "timezone").unwrap_or_default();
    if let Err(problem) = crate::manifest::spec::schedule::parse_timezone(&timezone) {
        cx.error(r.span_of("timezone"), format!("`timezone` {problem}"));
    }
    let suspend = r.bool(cx, "suspend").unwrap_or_default();
    let concurrency_policy = r.string(cx, "concurrency_policy").unwrap_or_default();
    match concurrency_policy.as_str() {
        "" | "Allow" | "Forbid" => {}
        "Replace" => cx.error(
            r.span_of("concurrency_policy"),
            "concurrency_policy \"Replace\" is not implemented by voodu: use \"Forbid\" or \"Allow\"",
        ),
        other => cx.error(
            r.span_of("concurrency_policy"),
            format!("concurrency_policy {other:?} must be \"Allow\" or \"Forbid\" (case-sensitive)"),
        ),
    }
    let mut job = job_fields(cx, r);
    let successful_history_limit = std::mem::take(&mut job.successful_history_limit);
    let failed_history_limit = std::mem::take(&mut job.failed_history_limit);
    CronjobSpec {
        schedule,
        job,
        concurrency_policy,
        timezone,
        suspend,
        successful_history_limit,
        failed_history_limit,
    }
}

/// An `ingress`, or the ingress half of an `app` (which routes to its own deployment).
pub(super) fn ingress(cx: &mut Cx<'_>, r: &mut Reader<'_>, app: bool) -> IngressSpec {
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
    if let Some(block) = r.block(cx, "tls") {
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
        spec.tls = Some(tls);
    }
    for block in r.blocks("location") {
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
        spec.locations.push(Location { path, strip });
    }
    if let Some(block) = r.block(cx, "lb") {
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
        spec.lb = Some(lb);
    }
    spec
}

pub(super) fn registry(cx: &mut Cx<'_>, r: &mut Reader<'_>) -> RegistrySpec {
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

/// The first 32 characters of a name too long to quote whole.
fn truncated(name: &str) -> String {
    name.chars().take(32).collect()
}

/// `asset ["scope"] "name" { key = "inline" | file("path") | url("href", {…}) }`.
pub(super) fn asset(cx: &mut Cx<'_>, body: &Body, anchor: Option<Range<usize>>) -> AssetSpec {
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
    cx: &mut Cx<'_>,
    key: &str,
    value: &Expression,
) -> Option<(AssetFile, Option<Vec<u8>>)> {
    let field = format!("asset key `{key}`");
    let span = value.span();
    let described = |source: &str, origin: String, on_failure: String, bytes: &[u8]| AssetFile {
        source: source.to_owned(),
        origin,
        on_failure,
        digest: sha256_hex(bytes),
        size: bytes.len() as u64,
        sealed: false,
    };
    match value {
        Expression::FuncCall(call) => {
            let function = call.name.name.as_str();
            let args: Vec<&Expression> = call.args.iter().collect();
            match (function, args.as_slice()) {
                ("file", [path]) => {
                    let path = to_string(cx, path, &field)?;
                    match cx.read_file(&path) {
                        Read::Bytes(bytes) => {
                            let mut file = described("file", path.clone(), String::new(), &bytes);
                            // A SOPS-encrypted source is decrypted on the host, never here.
                            match crate::manifest::sops::parse(&bytes) {
                                Some(Ok(_)) => file.sealed = true,
                                Some(Err(problem)) => {
                                    cx.error(
                                        span,
                                        format!(
                                            "file({path:?}) is not a readable SOPS file: {problem}"
                                        ),
                                    );
                                    return None;
                                }
                                None => {}
                            }
                            Some((file, Some(bytes)))
                        }
                        Read::Failed(message)
                            if message.is_missing() && cx.env.mode == Mode::Validate =>
                        {
                            cx.warn(span, format!("file({path:?}): {message}; the agent rejects a commit without it"));
                            Some((described("file", path, String::new(), b""), None))
                        }
                        Read::Failed(message) => {
                            cx.error(span, format!("file(): {message}"));
                            None
                        }
                    }
                }
                ("url", [href, rest @ ..]) if rest.len() <= 1 => {
                    let href = to_string(cx, href, &field)?;
                    if !(href.starts_with("https://") || href.starts_with("http://"))
                        || href.len() <= "https://".len()
                    {
                        cx.error(
                            span,
                            format!("url({href:?}): only http:// and https:// URLs can be fetched"),
                        );
                        return None;
                    }
                    let options = match rest.first() {
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
                        Some(Err(message)) => {
                            cx.error(span, format!("url({href:?}): {message}"));
                            None
                        }
                    }
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

fn inits(cx: &mut Cx<'_>, r: &mut Reader<'_>) -> Vec<Init> {
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

fn probes(cx: &mut Cx<'_>, r: &mut Reader<'_>) -> Probes {
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

fn probe(cx: &mut Cx<'_>, r: &mut Reader<'_>, name: &str, anchor: Option<Range<usize>>) -> Probe {
    let mut probe = Probe::default();
    let mut actions = 0;
    if let Some(block) = r.block(cx, "http_get") {
        actions += 1;
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
        probe.http_get = Some(HttpGet {
            path,
            port,
            scheme,
            http_headers,
        });
    }
    if let Some(block) = r.block(cx, "tcp_socket") {
        actions += 1;
        let mut t = r.nested(block, "");
        let port = t.int(cx, "port").unwrap_or_default();
        check_probe_port(
            cx,
            t.span_of("port").or(block.ident.span()),
            &format!("probes.{name}.tcp_socket.port"),
            port,
        );
        t.finish(cx);
        probe.tcp_socket = Some(TcpSocket { port });
    }
    if let Some(block) = r.block(cx, "exec") {
        actions += 1;
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
        probe.exec = Some(ExecAction { command });
    }
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

fn check_probe_port(cx: &mut Cx<'_>, span: Option<Range<usize>>, field: &str, port: i64) {
    if !(1..=65535).contains(&port) {
        cx.error(span, format!("{field} is required (got {port})"));
    }
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
fn targets(cx: &mut Cx<'_>, r: &mut Reader<'_>, name: &'static str) -> Vec<WebhookTarget> {
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
