//! The §2.0 container fields every container kind shares (deployment, statefulset, job,
//! cronjob, a macro's statefulset): image and its `image_update`, command, env, networks,
//! `build {}`, `depends_on {}` (assets, and the resources it starts after), `resources {}` and `logs {}`, each checked at its line.

use std::collections::BTreeMap;

use hcl::edit::Span;

use super::super::reader::{DecodeCx, Reader};
use super::super::values::{self, IMAGE_FORM};
use super::checks::{check_at_most, check_items};
use super::env::env_files;
use crate::manifest::interpolate::{Reference, is_ref_segment};
use crate::manifest::spec::bounds::{
    MAX_CPUS, MAX_DEPENDENCIES, MAX_DEPENDENCY_ENTRY, MAX_IMAGE_SCAN_INTERVAL, MAX_LOG_FILES,
    MAX_LOG_SIZE, MAX_MEMORY, MAX_ULIMIT, MIN_MEMORY, show_duration,
};
use crate::manifest::spec::{
    Build, Container, DependsOn, ImageUpdate, Lang, Limits, Logs, MIN_IMAGE_SCAN_INTERVAL,
    Resources, parse_dependency,
};
use crate::model::{DockerOptions, parse_go_duration};

/// The §2.0 container fields every container kind shares.
pub(super) fn container(cx: &mut DecodeCx<'_>, r: &mut Reader<'_>) -> Container {
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
    let (file_env, mut encrypted) = env_files(cx, r);
    container.env = file_env;
    for key in env.keys() {
        for file in &mut encrypted {
            file.keys.retain(|encrypted_key| encrypted_key != key);
        }
    }
    container.env.extend(env);
    container.env_sealed = encrypted;
    container.env_from = r.strings(cx, "env_from").unwrap_or_default();
    check_env_from(cx, r, &container.env_from);
    container.volumes = r.strings(cx, "volumes").unwrap_or_default();
    check_items(cx, r, "volumes", &container.volumes, values::volume);
    networks(cx, r, &mut container);
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
    container.build = build(cx, r, &container.image);
    container.depends_on = depends_on(cx, r);
    if let Some(block) = r.block(cx, "resources") {
        let mut nested = r.nested(block, "");
        container.resources = Some(resources(cx, &mut nested));
        nested.finish(cx);
    }
    if let Some(logs) = logs(cx, r) {
        container.logs = logs;
    }
    container
}

/// `env_from` entries: `"scope/name"` (an app bucket) or `"name"` (a bucket of this scope).
fn check_env_from(cx: &mut DecodeCx<'_>, r: &Reader<'_>, env_from: &[String]) {
    if !env_from.is_empty() {
        let span = r.span_of("env_from");
        for reference in env_from {
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
}

/// `network`, `networks` and `network_mode` (host or none exclude the other two).
fn networks(cx: &mut DecodeCx<'_>, r: &mut Reader<'_>, container: &mut Container) {
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
}

/// `build { context dockerfile path args lang {} }`, or voodu's build-mode default when there
/// is no `image` either; `image` and `build {}` exclude each other.
fn build(cx: &mut DecodeCx<'_>, r: &mut Reader<'_>, image: &str) -> Option<Build> {
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
        if !image.is_empty() {
            cx.error(
                block.ident.span(),
                "`image` and `build {}` are mutually exclusive: use `image` to pull from a registry, or `build {}` to build from source — not both",
            );
        }
        Some(build)
    } else if image.is_empty() {
        // voodu's parser default: no image means build mode at the repo root.
        Some(Build {
            context: ".".to_owned(),
            ..Build::default()
        })
    } else {
        None
    }
}

/// `depends_on { assets = ["scope.name.key", …] }`: each entry recorded as an asset reference.
fn depends_on(cx: &mut DecodeCx<'_>, r: &mut Reader<'_>) -> Option<DependsOn> {
    let block = r.block(cx, "depends_on")?;
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
    let resources = d.strings(cx, "resources").unwrap_or_default();
    dependencies(cx, &d, &resources);
    d.finish(cx);
    Some(DependsOn { assets, resources })
}

/// `depends_on { resources = ["kind/scope/name", "kind/name", …] }` (an extension): bounded,
/// each entry parsed (a deployment or a statefulset) and recorded as a reference where it is
/// written; whether it is declared, in a scope of this source, and free of cycles is the
/// cross-resource checks'.
fn dependencies(cx: &mut DecodeCx<'_>, d: &Reader<'_>, resources: &[String]) {
    if resources.len() > MAX_DEPENDENCIES {
        cx.error(
            d.span_of("resources"),
            format!(
                "`{}` lists {} resources, above the limit of {MAX_DEPENDENCIES}: depend on fewer",
                d.field("resources"),
                resources.len()
            ),
        );
        return;
    }
    for (index, entry) in resources.iter().enumerate() {
        let span = d.item_span("resources", index);
        let field = d.field("resources");
        if entry.len() > MAX_DEPENDENCY_ENTRY {
            cx.error(
                span,
                format!(
                    "`{field}[{index}]` is {} bytes long, above the limit of {MAX_DEPENDENCY_ENTRY}: write `kind/scope/name`",
                    entry.len()
                ),
            );
            continue;
        }
        if resources[..index].contains(entry) {
            cx.error(
                span,
                format!("`{field}[{index}]` {entry:?} is listed twice: list each resource once"),
            );
            continue;
        }
        // `kind/name` takes the dependent's scope at the checks.
        match parse_dependency(entry, "") {
            Ok(key) => {
                let scope = (entry.matches('/').count() == 2).then(|| key.scope.clone());
                cx.record_reference(
                    Reference::Dependency {
                        kind: key.kind,
                        scope,
                        name: key.name.clone(),
                        entry: entry.clone(),
                    },
                    span,
                );
            }
            Err(problem) => cx.error(span, format!("`{field}[{index}]` {entry:?}: {problem}")),
        }
    }
}

/// `logs { max_size max_files }`, bounded.
fn logs(cx: &mut DecodeCx<'_>, r: &mut Reader<'_>) -> Option<Logs> {
    let block = r.block(cx, "logs")?;
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
    Some(logs)
}

/// `ulimits` values as `docker run --ulimit` takes them.
pub(super) fn check_ulimits(
    cx: &mut DecodeCx<'_>,
    r: &Reader<'_>,
    ulimits: &BTreeMap<String, String>,
) {
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
pub(super) fn check_image(cx: &mut DecodeCx<'_>, r: &Reader<'_>, image: &str) {
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
fn image_update(
    cx: &mut DecodeCx<'_>,
    r: &mut Reader<'_>,
    image: Option<&str>,
) -> Option<ImageUpdate> {
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
pub(in crate::manifest::decode) fn check_build_image(
    cx: &mut DecodeCx<'_>,
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
fn check_env(cx: &mut DecodeCx<'_>, r: &Reader<'_>, env: &BTreeMap<String, String>) {
    for (name, value) in env {
        if let Err(problem) = values::env_name(name).and_then(|()| values::env_value(value)) {
            cx.error(
                r.key_span("env", name),
                format!("`{}` {name:?}: {problem}", r.field("env")),
            );
        }
    }
}

/// `docker_options` must be flags the agent can express through Docker's API.
pub(super) fn check_docker_options(cx: &mut DecodeCx<'_>, r: &Reader<'_>, options: &[String]) {
    if let Err(problem) = crate::model::DockerOptions::parse(options) {
        cx.error(
            r.span_of("docker_options"),
            format!("`{}`: {problem}", r.field("docker_options")),
        );
    }
}

/// `resources { limits { cpu, memory } }`, checked as voodu's reconciler would check it.
pub(super) fn resources(cx: &mut DecodeCx<'_>, r: &mut Reader<'_>) -> Resources {
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
