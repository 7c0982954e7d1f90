//! One Compose service → one `deployment` or `statefulset` block (and the project's configs
//! and secrets → one `asset` each): every service key either written, or noted.

use std::collections::{BTreeMap, BTreeSet};

use super::super::yaml::{Node, Value};
use super::text::{self, key, list, quote, shell_words};
use super::{ComposeError, Cx, OutFile, Tops, Users, asset_key, entries, raw, shown};
use crate::manifest::decode::values;
use crate::model::parse_go_duration;

/// Mount options the agent's `volumes` accept after the target.
const MOUNT_OPTIONS: &[&str] = &[
    "ro",
    "rw",
    "z",
    "Z",
    "nocopy",
    "consistent",
    "cached",
    "delegated",
];

/// A mount as Compose declares it.
#[derive(Debug, Clone)]
enum Mount {
    Bind {
        source: String,
        target: String,
        ro: bool,
    },
    Named {
        volume: String,
        target: String,
        ro: bool,
    },
    Anonymous {
        target: String,
    },
    Tmpfs {
        target: String,
    },
}

/// A readiness probe from a `healthcheck`.
#[derive(Debug, Default)]
struct Probe {
    command: Vec<String>,
    period: Option<String>,
    timeout: Option<String>,
    initial_delay: Option<String>,
    failure_threshold: Option<i64>,
}

/// What one service becomes.
#[derive(Debug, Default)]
struct Service {
    name: String,
    image: String,
    command: Option<Vec<String>>,
    entrypoint: Option<Vec<String>>,
    env: BTreeMap<String, String>,
    ports: Vec<String>,
    mounts: Vec<(Node, Mount)>,
    /// `${asset…}` mounts of configs and secrets, already HCL-quoted.
    asset_mounts: Vec<String>,
    networks: Vec<String>,
    network_mode: Option<String>,
    docker_options: Vec<String>,
    cap_add: Vec<String>,
    extra_hosts: Vec<String>,
    ulimits: BTreeMap<String, String>,
    replicas: Option<i64>,
    restart: Option<String>,
    cpu: Option<String>,
    memory: Option<String>,
    probe: Option<Probe>,
    /// Compose's `depends_on`: the service, its condition, where it is named.
    depends_on: Vec<(String, String, Node)>,
    logs: Option<(Option<String>, Option<i64>)>,
}

/// The assets configs and secrets become: asset name → key → content.
type Assets = BTreeMap<&'static str, BTreeMap<String, String>>;

pub(super) fn convert_services(
    cx: &mut Cx<'_>,
    scope: &str,
    services: &[(Node, Node)],
    tops: &Tops,
    services_key: &Node,
) -> Result<Vec<OutFile>, ComposeError> {
    let mut converted: Vec<Service> = Vec::new();
    let mut assets: Assets = BTreeMap::new();
    let mut skipped = BTreeSet::new();
    for (name_node, body) in services {
        let name = name_node.key_text().to_owned();
        let path = format!("services.{name}");
        if let Err(problem) = crate::manifest::validate::check_name(&name) {
            cx.not_carried(name_node, &path, format!("the service name {problem}"));
            continue;
        }
        let Some(body) = entries(body) else {
            cx.not_carried(name_node, &path, "a service is a mapping");
            continue;
        };
        if let Some((profiles_key, profiles)) =
            body.iter().find(|(k, _)| k.key_text() == "profiles")
        {
            let listed: Vec<String> = cx
                .strings(profiles, &format!("{path}.profiles"))?
                .into_iter()
                .map(|(_, p)| p)
                .collect();
            if !listed.is_empty() && !listed.iter().any(|p| cx.options.profiles.contains(p)) {
                cx.not_carried(
                    profiles_key,
                    &format!("{path}.profiles"),
                    format!("the service is only in profiles {} and none is active: not converted (pass --profile NAME to convert it)", shown(&listed)),
                );
                skipped.insert(name);
                continue;
            }
        }
        if let Some(service) = read_service(cx, scope, &name, &path, &body, tops, &mut assets)? {
            converted.push(service);
        }
    }
    // Which services mount each named volume: a volume only one single-replica service mounts
    // read-write makes that service a statefulset.
    let mut users: Users = BTreeMap::new();
    for service in &converted {
        for (_, mount) in &service.mounts {
            if let Mount::Named { volume, .. } = mount {
                users
                    .entry(volume.clone())
                    .or_default()
                    .insert(service.name.clone());
            }
        }
    }
    let mut kinds = BTreeMap::new();
    for service in &converted {
        let named: Vec<&Mount> = service
            .mounts
            .iter()
            .map(|(_, m)| m)
            .filter(|m| matches!(m, Mount::Named { .. }))
            .collect();
        let stateful = !named.is_empty()
            && service.replicas.unwrap_or(1) <= 1
            && service.name.len() <= crate::model::names::MAX_STATEFULSET_NAME
            && named.iter().all(|m| match m {
                Mount::Named { volume, ro, .. } => {
                    !ro && !external(tops, volume)
                        && is_claim_name(volume)
                        && users.get(volume).is_some_and(|u| u.len() == 1)
                }
                _ => false,
            });
        kinds.insert(
            service.name.clone(),
            if stateful {
                "statefulset"
            } else {
                "deployment"
            },
        );
    }
    // The services whose healthcheck became a readiness probe: their Ready is Compose's healthy.
    let probed: BTreeSet<String> = converted
        .iter()
        .filter(|service| service.probe.is_some())
        .map(|service| service.name.clone())
        .collect();
    let mut files = Vec::new();
    for service in &converted {
        let kind = kinds.get(&service.name).copied().unwrap_or("deployment");
        let others = Others {
            kinds: &kinds,
            probed: &probed,
            skipped: &skipped,
        };
        let text = render(cx, scope, kind, service, tops, &others);
        files.push(OutFile {
            name: format!("{}.hcl", service.name),
            text,
        });
    }
    if !assets.is_empty() && !files.is_empty() {
        let mut text = String::from(
            "// Configs and secrets of the Compose file, mounted where Compose mounts them.\n",
        );
        for (asset, keys) in &assets {
            text.push_str(&format!("asset {} {} {{\n", quote(scope), quote(asset)));
            for (k, content) in keys {
                text.push_str(&format!("  {} = {}\n", key(k), quote(content)));
            }
            text.push_str("}\n");
        }
        files.push(OutFile {
            name: "compose-assets.hcl".to_owned(),
            text,
        });
    }
    if !converted.is_empty() {
        cx.note(
            services_key,
            "services",
            format!("note: the agent's containers reach each other as `SERVICE.{scope}` (and `SERVICE.{scope}.voodu`), not by the bare service name Compose resolves; values naming another service by its bare name are written as they are"),
        );
    }
    Ok(files)
}

fn external(tops: &Tops, name: &str) -> bool {
    Tops::find(&tops.volumes, name).is_some_and(|(_, body)| {
        entries(body).is_some_and(|e| {
            e.iter().any(|(k, v)| {
                matches!(k.key_text(), "external" | "name") && raw(v) != Some("false")
            })
        })
    })
}

fn is_claim_name(name: &str) -> bool {
    name.len() <= crate::model::names::MAX_CLAIM
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// The Docker name a top-level volume or network has: its `name:`, else the scope's
/// `<scope>_<name>` as Compose names it for a project.
fn docker_name(list: &[(Node, Node)], scope: &str, name: &str) -> String {
    if let Some((_, body)) = Tops::find(list, name)
        && let Some(e) = entries(body)
    {
        if let Some(n) = e
            .iter()
            .find(|(k, _)| k.key_text() == "name")
            .and_then(|(_, v)| raw(v))
        {
            return n.to_owned();
        }
        if e.iter()
            .any(|(k, v)| k.key_text() == "external" && raw(v) == Some("true"))
        {
            return name.to_owned();
        }
    }
    format!("{scope}_{name}")
}

fn read_service(
    cx: &mut Cx<'_>,
    scope: &str,
    name: &str,
    path: &str,
    body: &[(Node, Node)],
    tops: &Tops,
    assets: &mut Assets,
) -> Result<Option<Service>, ComposeError> {
    let mut s = Service {
        name: name.to_owned(),
        ..Service::default()
    };
    let mut build = None;
    let mut image_at: Option<Node> = None;
    let mut env_at: Option<Node> = None;
    let mut env_file_env = BTreeMap::new();
    let mut env = BTreeMap::new();
    for (k, v) in body {
        let field = k.key_text();
        let at = format!("{path}.{field}");
        match field {
            "image" => {
                s.image = cx.scalar(v, &at)?.unwrap_or_default();
                image_at = Some(v.clone());
            }
            "build" => build = Some(k.clone()),
            "command" => s.command = command(cx, v, &at)?,
            "entrypoint" => s.entrypoint = command(cx, v, &at)?,
            "environment" => {
                environment(cx, v, &at, &mut env)?;
                env_at = Some(k.clone());
            }
            "env_file" => env_files(cx, v, &at, &mut env_file_env)?,
            "ports" => ports(cx, v, &at, &mut s.ports)?,
            "expose" => cx.not_carried(
                k,
                &at,
                "the agent publishes `ports` only; containers on one network reach each other's ports without it",
            ),
            "volumes" => volumes(cx, v, &at, &mut s)?,
            "tmpfs" => {
                for (_, t) in cx.strings(v, &at)? {
                    s.docker_options.push(format!("--tmpfs={t}"));
                }
            }
            "networks" => networks(cx, v, &at, scope, tops, &mut s)?,
            "network_mode" => match cx.scalar(v, &at)?.as_deref() {
                Some(mode @ ("host" | "none")) => s.network_mode = Some(mode.to_owned()),
                Some("bridge") | None => {}
                Some(other) => cx.not_carried(
                    v,
                    &at,
                    format!("{other:?}: the agent runs `host`, `none` or its own network only"),
                ),
            },
            "healthcheck" => s.probe = healthcheck(cx, v, &at)?,
            "depends_on" => depends_on(cx, k, v, &at, &mut s)?,
            "deploy" => deploy(cx, v, &at, &mut s)?,
            "restart" => {
                if let Some(policy) = cx.scalar(v, &at)? {
                    s.restart = Some(policy);
                }
            }
            "labels" => {
                for (label, value) in pairs(cx, v, &at)? {
                    s.docker_options.push(format!("--label={label}={value}"));
                }
            }
            "configs" | "secrets" => files_of(cx, v, &at, field, scope, tops, &mut s, assets)?,
            "cap_add" => s.cap_add.extend(cx.strings(v, &at)?.into_iter().map(|(_, c)| c)),
            "extra_hosts" => {
                // A mapping `host: ip`, or a list of `host:ip` / `host=ip`.
                if matches!(v.value, Value::Map(_)) {
                    for (host, ip) in pairs(cx, v, &at)? {
                        s.extra_hosts.push(format!("{host}:{ip}"));
                    }
                } else {
                    for (_, entry) in cx.strings(v, &at)? {
                        s.extra_hosts.push(entry.replacen('=', ":", 1));
                    }
                }
            }
            "ulimits" => ulimits(cx, v, &at, &mut s)?,
            "cpus" => s.cpu = cx.scalar(v, &at)?,
            "mem_limit" => s.memory = memory(cx, v, &at)?,
            "scale" => s.replicas = int(cx, v, &at)?,
            "logging" => logging(cx, v, &at, &mut s)?,
            "container_name" => cx.not_carried(
                k,
                &at,
                "the agent names its containers (`<scope>-<name>.<replica>`)",
            ),
            "profiles" => {}
            "stdin_open" | "tty" => cx.not_carried(
                k,
                &at,
                "the agent's containers run without a terminal or open stdin",
            ),
            "platform" | "pull_policy" | "runtime" | "develop" => cx.not_carried(
                k,
                &at,
                "the agent runs the image for the host's platform and pulls when the image is missing",
            ),
            "links" | "external_links" => cx.not_carried(
                k,
                &at,
                "legacy links: services reach each other as `SERVICE.SCOPE` under the agent",
            ),
            other => match flag(other) {
                Some(flag) => flags(cx, v, &at, flag, &mut s)?,
                None => cx.not_carried(k, &at, "the agent has no equivalent"),
            },
        }
    }
    // env_file first, `environment` over it (Compose's precedence).
    s.env = env_file_env;
    s.env.extend(env);
    // What the agent's `env` would refuse (a name with `=`, a value with NUL) is named.
    let refused: Vec<(String, String)> = s
        .env
        .iter()
        .filter_map(|(name, value)| {
            values::env_name(name)
                .and_then(|()| values::env_value(value))
                .err()
                .map(|problem| (name.clone(), problem.to_string()))
        })
        .collect();
    for (name, problem) in refused {
        s.env.remove(&name);
        if let Some(at) = env_at.as_ref().or(body.first().map(|(k, _)| k)) {
            cx.not_carried(at, &format!("{path}.environment.{name}"), problem);
        }
    }
    if let Some(build) = build {
        if s.image.is_empty() {
            s.image = format!("{scope}-{name}:latest");
            cx.not_carried(
                &build,
                &format!("{path}.build"),
                format!("the agent builds nothing: it runs {:?}, which must be on the host (`docker build -t {scope}-{name}:latest …`), or set `image`", s.image),
            );
        } else {
            cx.not_carried(
                &build,
                &format!("{path}.build"),
                format!("the agent builds nothing: it runs `image` ({:?}), which must be on the host or in a registry", s.image),
            );
        }
    }
    if !s.image.is_empty()
        && let Err(problem) = values::image_reference(&s.image)
        && let Some(at) = &image_at
    {
        cx.not_carried(
            at,
            &format!("{path}.image"),
            format!("{:?}: {problem}; the service is not converted", s.image),
        );
        return Ok(None);
    }
    if s.image.is_empty() {
        let at = body.first().map(|(k, _)| k.clone());
        if let Some(at) = at {
            cx.not_carried(&at, path, "the service has neither `image` nor `build`");
        }
        return Ok(None);
    }
    Ok(Some(s))
}

/// Flags carried into `docker_options`: the Compose key → the `docker run` flag.
fn flag(key: &str) -> Option<&'static str> {
    Some(match key {
        "user" => "--user",
        "working_dir" => "--workdir",
        "hostname" => "--hostname",
        "cap_drop" => "--cap-drop",
        "dns" => "--dns",
        "dns_search" => "--dns-search",
        "dns_opt" => "--dns-option",
        "devices" => "--device",
        "security_opt" => "--security-opt",
        "shm_size" => "--shm-size",
        "stop_signal" => "--stop-signal",
        "stop_grace_period" => "--stop-timeout",
        "privileged" => "--privileged",
        "read_only" => "--read-only",
        "init" => "--init",
        "ipc" => "--ipc",
        "pid" => "--pid",
        "group_add" => "--group-add",
        "oom_score_adj" => "--oom-score-adj",
        "pids_limit" => "--pids-limit",
        "memswap_limit" => "--memory-swap",
        "mem_reservation" => "--memory-reservation",
        "cpuset" => "--cpuset-cpus",
        "cpu_shares" => "--cpu-shares",
        "sysctls" => "--sysctl",
        _ => return None,
    })
}

fn flags(
    cx: &mut Cx<'_>,
    v: &Node,
    at: &str,
    flag: &str,
    s: &mut Service,
) -> Result<(), ComposeError> {
    match flag {
        "--privileged" | "--read-only" | "--init" => {
            if cx.scalar(v, at)?.as_deref() == Some("true") {
                s.docker_options.push(flag.to_owned());
            }
        }
        "--sysctl" => {
            for (name, value) in pairs(cx, v, at)? {
                s.docker_options.push(format!("--sysctl={name}={value}"));
            }
        }
        "--stop-timeout" => {
            if let Some(text) = cx.scalar(v, at)? {
                match parse_go_duration(&text) {
                    Some(d) => s
                        .docker_options
                        .push(format!("--stop-timeout={}", d.as_secs().max(1))),
                    None => cx.not_carried(v, at, format!("{text:?} is not a duration")),
                }
            }
        }
        _ => {
            for (_, value) in cx.strings(v, at)? {
                s.docker_options.push(format!("{flag}={value}"));
            }
        }
    }
    Ok(())
}

/// `command`/`entrypoint`: a list, or a string split as a shell would.
fn command(cx: &mut Cx<'_>, v: &Node, at: &str) -> Result<Option<Vec<String>>, ComposeError> {
    match &v.value {
        Value::List(_) => Ok(Some(
            cx.strings(v, at)?.into_iter().map(|(_, w)| w).collect(),
        )),
        _ => match cx.scalar(v, at)? {
            Some(text) => match shell_words(&text) {
                Some(words) => Ok(Some(words)),
                None => {
                    cx.not_carried(v, at, "an unclosed quote");
                    Ok(None)
                }
            },
            None => Ok(None),
        },
    }
}

/// `KEY=VALUE` list items or a mapping, as (key, value) pairs; a key without a value takes
/// the environment's (Compose), or is noted.
fn pairs(cx: &mut Cx<'_>, v: &Node, at: &str) -> Result<Vec<(String, String)>, ComposeError> {
    let mut out = Vec::new();
    match &v.value {
        Value::Map(_) => {
            for (k, value) in entries(v).unwrap_or_default() {
                let name = k.key_text().to_owned();
                match cx.scalar(&value, &format!("{at}.{name}"))? {
                    Some(text) => out.push((name, text)),
                    None => out.push((name, String::new())),
                }
            }
        }
        _ => {
            for (_, item) in cx.strings(v, at)? {
                match item.split_once('=') {
                    Some((name, value)) => out.push((name.to_owned(), value.to_owned())),
                    None => out.push((item, String::new())),
                }
            }
        }
    }
    Ok(out)
}

fn environment(
    cx: &mut Cx<'_>,
    v: &Node,
    at: &str,
    env: &mut BTreeMap<String, String>,
) -> Result<(), ComposeError> {
    let bare: Vec<(Node, String)> = match &v.value {
        Value::Map(_) => entries(v)
            .unwrap_or_default()
            .into_iter()
            .filter(|(_, value)| matches!(value.value, Value::Scalar { null: true, .. }))
            .map(|(k, _)| (k.clone(), k.key_text().to_owned()))
            .collect(),
        Value::List(items) => items
            .iter()
            .filter_map(|item| {
                raw(item)
                    .filter(|t| !t.contains('='))
                    .map(|t| (item.clone(), t.to_owned()))
            })
            .collect(),
        _ => Vec::new(),
    };
    for (name, value) in pairs(cx, v, at)? {
        if let Some((node, _)) = bare.iter().find(|(_, b)| *b == name) {
            // `- NAME` / `NAME:`: the value of the converting shell's environment, as Compose.
            match cx.options.vars.get(&name) {
                Some(value) => {
                    env.insert(name, value.clone());
                }
                None => cx.not_carried(
                    node,
                    &format!("{at}.{name}"),
                    "no value given and the variable is not set where `convert` runs (Compose leaves it unset)",
                ),
            }
            continue;
        }
        env.insert(name, value);
    }
    Ok(())
}

fn env_files(
    cx: &mut Cx<'_>,
    v: &Node,
    at: &str,
    env: &mut BTreeMap<String, String>,
) -> Result<(), ComposeError> {
    let items: Vec<Node> = match &v.value {
        Value::List(items) => items.clone(),
        _ => vec![v.clone()],
    };
    for item in items {
        let (file, required) = match entries(&item) {
            Some(e) => {
                let path = match e.iter().find(|(k, _)| k.key_text() == "path") {
                    Some((_, p)) => cx.scalar(p, at)?,
                    None => None,
                };
                let required = e
                    .iter()
                    .find(|(k, _)| k.key_text() == "required")
                    .and_then(|(_, r)| raw(r))
                    != Some("false");
                (path, required)
            }
            None => (cx.scalar(&item, at)?, true),
        };
        let Some(file) = file else { continue };
        match (cx.options.read)(&file) {
            Ok(text) => env.extend(text::dotenv(&text)),
            Err(why) if required => cx.not_carried(&item, at, format!("{file:?}: {why}")),
            Err(_) => {}
        }
    }
    Ok(())
}

/// A port as the agent publishes it: with Compose's host address (every interface when none
/// is given), so the converted service listens where it did.
fn ports(cx: &mut Cx<'_>, v: &Node, at: &str, out: &mut Vec<String>) -> Result<(), ComposeError> {
    let Value::List(items) = &v.value else {
        cx.not_carried(v, at, "expected a list of ports");
        return Ok(());
    };
    for item in items {
        let port = match entries(item) {
            Some(e) => {
                let mut target = None;
                let mut published = None;
                let mut host_ip = None;
                let mut protocol = None;
                for (k, value) in &e {
                    let sub = format!("{at}.{}", k.key_text());
                    match k.key_text() {
                        "target" => target = cx.scalar(value, &sub)?,
                        "published" => published = cx.scalar(value, &sub)?,
                        "host_ip" => host_ip = cx.scalar(value, &sub)?,
                        "protocol" => protocol = cx.scalar(value, &sub)?,
                        "mode" if raw(value) == Some("ingress") || raw(value) == Some("host") => {}
                        _ => cx.not_carried(k, &sub, "the agent publishes a port by address, host port and container port only"),
                    }
                }
                let Some(target) = target else {
                    cx.not_carried(item, at, "a port without `target`");
                    continue;
                };
                let mut text = format!(
                    "{}:{}:{target}",
                    host_ip.unwrap_or_else(|| "0.0.0.0".to_owned()),
                    published.unwrap_or_default()
                );
                if let Some(p) = protocol.filter(|p| p != "tcp") {
                    text = format!("{text}/{p}");
                }
                text
            }
            None => {
                let Some(text) = cx.scalar(item, at)? else {
                    continue;
                };
                let (address, proto) = match text.split_once('/') {
                    Some((a, p)) => (a.to_owned(), Some(p.to_owned())),
                    None => (text.clone(), None),
                };
                let full = if address.starts_with('[') {
                    address
                } else {
                    match address.matches(':').count() {
                        0 => format!("0.0.0.0::{address}"),
                        1 => format!("0.0.0.0:{address}"),
                        _ => address,
                    }
                };
                match proto {
                    Some(p) if p != "tcp" => format!("{full}/{p}"),
                    _ => full,
                }
            }
        };
        if crate::model::parse_ports(&port).is_none() {
            cx.not_carried(
                item,
                at,
                format!("{port:?} is not a port the agent can publish"),
            );
            continue;
        }
        out.push(port);
    }
    Ok(())
}

fn volumes(cx: &mut Cx<'_>, v: &Node, at: &str, s: &mut Service) -> Result<(), ComposeError> {
    let Value::List(items) = &v.value else {
        cx.not_carried(v, at, "expected a list of volumes");
        return Ok(());
    };
    for item in items {
        let mount = match entries(item) {
            Some(e) => long_volume(cx, item, &e, at)?,
            None => {
                let Some(text) = cx.scalar(item, at)? else {
                    continue;
                };
                short_volume(cx, item, &text, at)
            }
        };
        let Some(mount) = mount else { continue };
        let mount = match mount {
            Mount::Bind { source, target, ro } => {
                match absolute(&source, &cx.options.base_dir, cx.options.vars.get("HOME")) {
                    Some(source) => Mount::Bind { source, target, ro },
                    None => {
                        cx.not_carried(
                            item,
                            at,
                            format!(
                                "bind source {source:?}: `~` needs HOME set to an absolute path"
                            ),
                        );
                        continue;
                    }
                }
            }
            other => other,
        };
        s.mounts.push((item.clone(), mount));
    }
    Ok(())
}

fn short_volume(cx: &mut Cx<'_>, item: &Node, text: &str, at: &str) -> Option<Mount> {
    let parts: Vec<&str> = text.split(':').collect();
    let (source, target, mode) = match parts.as_slice() {
        [target] => {
            return Some(Mount::Anonymous {
                target: (*target).to_owned(),
            });
        }
        [source, target] => (*source, *target, ""),
        [source, target, mode] => (*source, *target, *mode),
        _ => {
            cx.not_carried(item, at, format!("{text:?} is not `SOURCE:TARGET[:MODE]`"));
            return None;
        }
    };
    let mut ro = false;
    for option in mode.split(',').filter(|o| !o.is_empty()) {
        match option {
            "ro" => ro = true,
            "rw" => {}
            other if MOUNT_OPTIONS.contains(&other) => {}
            other => cx.not_carried(item, at, format!("mount option {other:?}")),
        }
    }
    let bind = source.starts_with(['/', '.', '~']) || source.contains('/');
    Some(if bind {
        Mount::Bind {
            source: source.to_owned(),
            target: target.to_owned(),
            ro,
        }
    } else {
        Mount::Named {
            volume: source.to_owned(),
            target: target.to_owned(),
            ro,
        }
    })
}

fn long_volume(
    cx: &mut Cx<'_>,
    item: &Node,
    e: &[(Node, Node)],
    at: &str,
) -> Result<Option<Mount>, ComposeError> {
    let mut kind = None;
    let mut source = None;
    let mut target = None;
    let mut ro = false;
    for (k, value) in e {
        let sub = format!("{at}.{}", k.key_text());
        match k.key_text() {
            "type" => kind = cx.scalar(value, &sub)?,
            "source" => source = cx.scalar(value, &sub)?,
            "target" => target = cx.scalar(value, &sub)?,
            "read_only" => ro = raw(value) == Some("true"),
            "bind" => {
                for (bk, _) in entries(value).unwrap_or_default() {
                    if bk.key_text() != "create_host_path" {
                        cx.not_carried(
                            &bk,
                            &format!("{sub}.{}", bk.key_text()),
                            "the agent mounts a bind with Docker's defaults",
                        );
                    }
                }
            }
            "consistency" => {}
            _ => cx.not_carried(k, &sub, "the agent mounts with Docker's defaults"),
        }
    }
    let Some(target) = target else {
        cx.not_carried(item, at, "a volume without `target`");
        return Ok(None);
    };
    Ok(match (kind.as_deref(), source) {
        (Some("bind"), Some(source)) => Some(Mount::Bind { source, target, ro }),
        (Some("volume") | None, Some(volume)) => Some(Mount::Named { volume, target, ro }),
        (Some("volume") | None, None) => Some(Mount::Anonymous { target }),
        (Some("tmpfs"), _) => Some(Mount::Tmpfs { target }),
        (other, _) => {
            cx.not_carried(
                item,
                at,
                format!("a mount of type {:?}", other.unwrap_or("")),
            );
            None
        }
    })
}

/// A bind source made absolute as Compose does: against the file's directory, `~` as HOME;
/// `.` and `..` folded.
fn absolute(source: &str, base: &str, home: Option<&String>) -> Option<String> {
    let joined = if let Some(rest) = source.strip_prefix('~') {
        format!("{}/{rest}", home?)
    } else if source.starts_with('/') {
        source.to_owned()
    } else {
        format!("{base}/{source}")
    };
    crate::model::policy::normalize_path(&joined)
}

fn networks(
    cx: &mut Cx<'_>,
    v: &Node,
    at: &str,
    scope: &str,
    tops: &Tops,
    s: &mut Service,
) -> Result<(), ComposeError> {
    let names: Vec<(Node, String)> = match &v.value {
        Value::Map(_) => {
            let mut names = Vec::new();
            for (k, body) in entries(v).unwrap_or_default() {
                for (sub, _) in entries(&body).unwrap_or_default() {
                    cx.not_carried(
                        &sub,
                        &format!("{at}.{}.{}", k.key_text(), sub.key_text()),
                        "the agent sets a container's aliases and addresses itself",
                    );
                }
                names.push((k.clone(), k.key_text().to_owned()));
            }
            names
        }
        _ => cx.strings(v, at)?,
    };
    for (node, name) in names {
        if name == "default" {
            continue;
        }
        if Tops::find(&tops.networks, &name).is_none() {
            cx.not_carried(
                &node,
                at,
                format!("network {name:?} is not declared under the top-level `networks`"),
            );
            continue;
        }
        s.networks.push(docker_name(&tops.networks, scope, &name));
    }
    Ok(())
}

fn healthcheck(cx: &mut Cx<'_>, v: &Node, at: &str) -> Result<Option<Probe>, ComposeError> {
    let Some(e) = entries(v) else {
        cx.not_carried(v, at, "expected a mapping");
        return Ok(None);
    };
    let mut probe = Probe::default();
    let mut disabled = false;
    for (k, value) in &e {
        let sub = format!("{at}.{}", k.key_text());
        match k.key_text() {
            "test" => {
                let words: Vec<String> = match &value.value {
                    Value::List(_) => cx
                        .strings(value, &sub)?
                        .into_iter()
                        .map(|(_, w)| w)
                        .collect(),
                    _ => match cx.scalar(value, &sub)? {
                        Some(text) => vec!["CMD-SHELL".to_owned(), text],
                        None => Vec::new(),
                    },
                };
                match words.split_first() {
                    Some((first, rest)) if first == "CMD" && !rest.is_empty() => {
                        probe.command = rest.to_vec()
                    }
                    Some((first, rest)) if first == "CMD-SHELL" && !rest.is_empty() => {
                        probe.command = vec!["/bin/sh".to_owned(), "-c".to_owned(), rest.join(" ")];
                    }
                    Some((first, _)) if first == "NONE" => disabled = true,
                    _ => cx.not_carried(
                        value,
                        &sub,
                        "expected [\"CMD\", …], [\"CMD-SHELL\", \"…\"] or a command string",
                    ),
                }
            }
            "interval" | "timeout" | "start_period" => {
                let Some(text) = cx.scalar(value, &sub)? else {
                    continue;
                };
                match parse_go_duration(&text) {
                    Some(d) if d <= crate::manifest::spec::bounds::MAX_PROBE_DURATION => {
                        let slot = match k.key_text() {
                            "interval" => &mut probe.period,
                            "timeout" => &mut probe.timeout,
                            _ => &mut probe.initial_delay,
                        };
                        *slot = Some(text);
                    }
                    _ => cx.not_carried(
                        value,
                        &sub,
                        format!("{text:?} is not a duration of at most an hour"),
                    ),
                }
            }
            "retries" => probe.failure_threshold = int(cx, value, &sub)?,
            "disable" => disabled = raw(value) == Some("true"),
            _ => cx.not_carried(k, &sub, "the agent's probes have no such setting"),
        }
    }
    if disabled {
        cx.not_carried(
            v,
            at,
            "a disabled healthcheck: the agent runs no probe (the image's own HEALTHCHECK is kept)",
        );
        return Ok(None);
    }
    if probe.command.is_empty() {
        return Ok(None);
    }
    cx.note(v, at, "note: carried as a readiness probe the agent runs with `docker exec` (Docker's own health status is not set)");
    Ok(Some(probe))
}

fn depends_on(
    cx: &mut Cx<'_>,
    k: &Node,
    v: &Node,
    at: &str,
    s: &mut Service,
) -> Result<(), ComposeError> {
    match &v.value {
        Value::Map(_) => {
            for (dep, body) in entries(v).unwrap_or_default() {
                let mut condition = "service_started".to_owned();
                for (ck, cv) in entries(&body).unwrap_or_default() {
                    match ck.key_text() {
                        "condition" => condition = raw(&cv).unwrap_or("service_started").to_owned(),
                        other => cx.not_carried(
                            &ck,
                            &format!("{at}.{}.{other}", dep.key_text()),
                            "the start-up order has no such setting",
                        ),
                    }
                }
                s.depends_on
                    .push((dep.key_text().to_owned(), condition, dep.clone()));
            }
        }
        _ => {
            for (node, dep) in cx.strings(v, at)? {
                s.depends_on.push((dep, "service_started".to_owned(), node));
            }
        }
    }
    if !s.depends_on.is_empty() {
        cx.note(
            k,
            at,
            "note: carried as the start-up order `depends_on { resources }`: a first replica, and a rollout's first replacement, wait until each dependency is Ready; later restarts of a dependency hold nothing (Compose's `restart: true` is not carried)",
        );
    }
    Ok(())
}

fn deploy(cx: &mut Cx<'_>, v: &Node, at: &str, s: &mut Service) -> Result<(), ComposeError> {
    for (k, value) in entries(v).unwrap_or_default() {
        let sub = format!("{at}.{}", k.key_text());
        match k.key_text() {
            "replicas" => s.replicas = int(cx, &value, &sub)?,
            "mode" if raw(&value) == Some("replicated") => {}
            "resources" => {
                for (rk, rv) in entries(&value).unwrap_or_default() {
                    let rsub = format!("{sub}.{}", rk.key_text());
                    if rk.key_text() != "limits" {
                        cx.not_carried(&rk, &rsub, "the agent sets limits only (Docker has no reservation for a plain container)");
                        continue;
                    }
                    for (lk, lv) in entries(&rv).unwrap_or_default() {
                        let lsub = format!("{rsub}.{}", lk.key_text());
                        match lk.key_text() {
                            "cpus" => s.cpu = cx.scalar(&lv, &lsub)?,
                            "memory" => s.memory = memory(cx, &lv, &lsub)?,
                            "pids" => {
                                if let Some(n) = cx.scalar(&lv, &lsub)? {
                                    s.docker_options.push(format!("--pids-limit={n}"));
                                }
                            }
                            _ => {
                                cx.not_carried(&lk, &lsub, "the agent limits cpus, memory and pids")
                            }
                        }
                    }
                }
            }
            "restart_policy" => {
                let mut condition = None;
                let mut attempts = None;
                for (rk, rv) in entries(&value).unwrap_or_default() {
                    let rsub = format!("{sub}.{}", rk.key_text());
                    match rk.key_text() {
                        "condition" => condition = cx.scalar(&rv, &rsub)?,
                        "max_attempts" => attempts = cx.scalar(&rv, &rsub)?,
                        _ => cx.not_carried(
                            &rk,
                            &rsub,
                            "Docker's restart policy has no delay or window",
                        ),
                    }
                }
                s.restart = match condition.as_deref() {
                    Some("none") => Some("no".to_owned()),
                    Some("on-failure") => Some(match attempts {
                        Some(n) => format!("on-failure:{n}"),
                        None => "on-failure".to_owned(),
                    }),
                    _ => Some("always".to_owned()),
                };
            }
            "update_config" | "rollback_config" => {
                for (uk, uv) in entries(&value).unwrap_or_default() {
                    let usub = format!("{sub}.{}", uk.key_text());
                    let why = match (uk.key_text(), raw(&uv)) {
                        ("order", Some("start-first")) => {
                            "note: the agent starts a successor before the replica it replaces unless a host port is pinned (then stop-first)"
                        }
                        ("order", _) => {
                            "not carried: the agent starts a successor first unless a host port is pinned (then stop-first); a statefulset is always stop-first"
                        }
                        ("parallelism", _) => {
                            "not carried: the agent replaces one replica at a time"
                        }
                        ("failure_action", _) => {
                            "not carried: a failed rollout keeps the replicas that were Ready, and the release can be rolled back (`rollback`)"
                        }
                        _ => {
                            "not carried: the agent's rollout waits for readiness, not a fixed delay"
                        }
                    };
                    cx.note(&uk, &usub, why);
                }
            }
            _ => cx.not_carried(
                &k,
                &sub,
                "a Swarm setting the agent's single host has no use for",
            ),
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn files_of(
    cx: &mut Cx<'_>,
    v: &Node,
    at: &str,
    field: &str,
    scope: &str,
    tops: &Tops,
    s: &mut Service,
    assets: &mut Assets,
) -> Result<(), ComposeError> {
    let Value::List(items) = &v.value else {
        cx.not_carried(v, at, "expected a list");
        return Ok(());
    };
    let (top, asset): (&[(Node, Node)], &'static str) = if field == "secrets" {
        (&tops.secrets, "secrets")
    } else {
        (&tops.configs, "configs")
    };
    for item in items {
        let (source, target) = match entries(item) {
            Some(e) => {
                let mut source = None;
                let mut target = None;
                for (k, value) in &e {
                    let sub = format!("{at}.{}", k.key_text());
                    match k.key_text() {
                        "source" => source = cx.scalar(value, &sub)?,
                        "target" => target = cx.scalar(value, &sub)?,
                        _ => cx.not_carried(
                            k,
                            &sub,
                            "asset files are mounted read-only with the agent's owner and mode",
                        ),
                    }
                }
                (source, target)
            }
            None => (cx.scalar(item, at)?, None),
        };
        let Some(source) = source else { continue };
        let target = match target {
            Some(t) if t.starts_with('/') => t,
            Some(t) if field == "secrets" => format!("/run/secrets/{t}"),
            Some(t) => format!("/{t}"),
            None if field == "secrets" => format!("/run/secrets/{source}"),
            None => format!("/{source}"),
        };
        cx.used.insert(format!("{field}.{source}"));
        let Some((top_key, body)) = Tops::find(top, &source) else {
            cx.not_carried(
                item,
                at,
                format!("{source:?} is not declared under the top-level `{field}`"),
            );
            continue;
        };
        let Some(content) = file_content(cx, top_key, body, &format!("{field}.{source}"))? else {
            continue;
        };
        let k = asset_key(&source);
        assets.entry(asset).or_default().insert(k.clone(), content);
        // Quoted here: the reference is the agent's own `${asset…}`, the rest escaped.
        let rest = quote(&format!(":{target}:ro"));
        s.asset_mounts
            .push(format!("\"${{asset.{scope}.{asset}.{k}}}{}", &rest[1..]));
    }
    Ok(())
}

/// A top-level config's or secret's content (`file`, `content` or `environment`), noted once
/// per use when it cannot be read.
fn file_content(
    cx: &mut Cx<'_>,
    top_key: &Node,
    body: &Node,
    at: &str,
) -> Result<Option<String>, ComposeError> {
    for (k, value) in entries(body).unwrap_or_default() {
        let sub = format!("{at}.{}", k.key_text());
        match k.key_text() {
            "file" => {
                let Some(file) = cx.scalar(&value, &sub)? else {
                    continue;
                };
                return match (cx.options.read)(&file) {
                    Ok(text) => {
                        if at.starts_with("secrets") {
                            cx.note(&k, &sub, "note: the secret's content is written into the asset in plain text: keep the repository private, or encrypt it (README \"Secrets in the repository (SOPS)\")");
                        }
                        Ok(Some(text))
                    }
                    Err(why) => {
                        cx.not_carried(&value, &sub, format!("{file:?}: {why}"));
                        Ok(None)
                    }
                };
            }
            "content" => return cx.scalar(&value, &sub),
            "environment" => {
                let Some(var) = cx.scalar(&value, &sub)? else {
                    continue;
                };
                return match cx.options.vars.get(&var) {
                    Some(text) => Ok(Some(text.clone())),
                    None => {
                        cx.not_carried(&value, &sub, format!("variable {var} is not set"));
                        Ok(None)
                    }
                };
            }
            _ => {}
        }
    }
    cx.not_carried(
        top_key,
        at,
        "external or without `file`, `content` or `environment`: the agent needs the content",
    );
    Ok(None)
}

fn ulimits(cx: &mut Cx<'_>, v: &Node, at: &str, s: &mut Service) -> Result<(), ComposeError> {
    for (k, value) in entries(v).unwrap_or_default() {
        let sub = format!("{at}.{}", k.key_text());
        let limit = match entries(&value) {
            Some(e) => {
                let soft = e
                    .iter()
                    .find(|(k, _)| k.key_text() == "soft")
                    .and_then(|(_, v)| raw(v));
                let hard = e
                    .iter()
                    .find(|(k, _)| k.key_text() == "hard")
                    .and_then(|(_, v)| raw(v));
                match (soft, hard) {
                    (Some(soft), Some(hard)) => Some(format!("{soft}:{hard}")),
                    _ => None,
                }
            }
            None => cx.scalar(&value, &sub)?,
        };
        match limit {
            Some(limit) => {
                s.ulimits.insert(k.key_text().to_owned(), limit);
            }
            None => cx.not_carried(&k, &sub, "expected a number or `soft` and `hard`"),
        }
    }
    Ok(())
}

fn logging(cx: &mut Cx<'_>, v: &Node, at: &str, s: &mut Service) -> Result<(), ComposeError> {
    let mut driver = None;
    let mut size = None;
    let mut files = None;
    for (k, value) in entries(v).unwrap_or_default() {
        let sub = format!("{at}.{}", k.key_text());
        match k.key_text() {
            "driver" => driver = cx.scalar(&value, &sub)?,
            "options" => {
                for (ok, ov) in entries(&value).unwrap_or_default() {
                    let osub = format!("{sub}.{}", ok.key_text());
                    match ok.key_text() {
                        "max-size" => size = cx.scalar(&ov, &osub)?,
                        "max-file" => files = int(cx, &ov, &osub)?,
                        _ => cx.not_carried(
                            &ok,
                            &osub,
                            "the agent's `logs {}` sets max-size and max-file only",
                        ),
                    }
                }
            }
            _ => cx.not_carried(&k, &sub, "no such logging setting"),
        }
    }
    match driver.as_deref() {
        None | Some("json-file" | "local") => {}
        Some(other) => s.docker_options.push(format!("--log-driver={other}")),
    }
    if size.is_some() || files.is_some() {
        s.logs = Some((size, files));
    }
    Ok(())
}

fn int(cx: &mut Cx<'_>, v: &Node, at: &str) -> Result<Option<i64>, ComposeError> {
    let Some(text) = cx.scalar(v, at)? else {
        return Ok(None);
    };
    match text.parse::<i64>() {
        Ok(n) => Ok(Some(n)),
        Err(_) => {
            cx.not_carried(v, at, format!("{text:?} is not a whole number"));
            Ok(None)
        }
    }
}

fn memory(cx: &mut Cx<'_>, v: &Node, at: &str) -> Result<Option<String>, ComposeError> {
    let Some(size) = cx.scalar(v, at)? else {
        return Ok(None);
    };
    match text::bytes(&size) {
        Some(bytes) => Ok(Some(text::memory(bytes))),
        None => {
            cx.not_carried(v, at, format!("{size:?} is not a byte size"));
            Ok(None)
        }
    }
}

fn render(
    cx: &mut Cx<'_>,
    scope: &str,
    kind: &str,
    s: &Service,
    tops: &Tops,
    others: &Others<'_>,
) -> String {
    let Others {
        kinds,
        probed,
        skipped,
    } = *others;
    let mut out = String::new();
    out.push_str(&format!("// Service {:?} of the Compose file.\n", s.name));
    out.push_str(&format!("{kind} {} {} {{\n", quote(scope), quote(&s.name)));
    let line = |out: &mut String, k: &str, v: String| out.push_str(&format!("  {k} = {v}\n"));
    line(&mut out, "image", quote(&s.image));
    if let Some(replicas) = s.replicas {
        line(&mut out, "replicas", replicas.to_string());
    }
    let mut docker_options = s.docker_options.clone();
    let mut command = s.command.clone();
    if let Some(entrypoint) = &s.entrypoint {
        // `--entrypoint` takes the executable; the rest of Compose's entrypoint goes first in
        // the command (so the container runs entrypoint + command, as Compose runs it).
        let (first, rest) = entrypoint
            .split_first()
            .map_or(("", &[][..]), |(f, r)| (f.as_str(), r));
        docker_options.insert(0, format!("--entrypoint={first}"));
        if !rest.is_empty() || command.is_some() {
            let mut words = rest.to_vec();
            words.extend(command.unwrap_or_default());
            command = Some(words);
        }
    }
    if let Some(command) = &command {
        line(&mut out, "command", list(command));
    }
    if !s.env.is_empty() {
        out.push_str("  env = {\n");
        for (k, v) in &s.env {
            out.push_str(&format!("    {} = {}\n", key(k), quote(v)));
        }
        out.push_str("  }\n");
    }
    if !s.ports.is_empty() {
        line(&mut out, "ports", list(&s.ports));
    }
    let mut volumes = Vec::new();
    let mut claims = Vec::new();
    for (node, mount) in &s.mounts {
        match mount {
            Mount::Bind { source, target, ro } => {
                volumes.push((
                    node,
                    format!("{source}:{target}{}", if *ro { ":ro" } else { "" }),
                ));
            }
            Mount::Named { volume, target, ro } => {
                if kind == "statefulset" {
                    claims.push((volume.clone(), target.clone()));
                } else {
                    let name = docker_name(&tops.volumes, scope, volume);
                    volumes.push((
                        node,
                        format!("{name}:{target}{}", if *ro { ":ro" } else { "" }),
                    ));
                }
                if Tops::find(&tops.volumes, volume).is_none() {
                    cx.note(node, &format!("services.{}.volumes", s.name), format!("note: volume {volume:?} is not declared under the top-level `volumes` (Compose refuses that)"));
                }
            }
            Mount::Anonymous { target } => volumes.push((node, target.clone())),
            Mount::Tmpfs { target } => docker_options.push(format!("--tmpfs={target}")),
        }
    }
    // What the agent's `volumes` would refuse is named rather than written.
    let mut written = Vec::new();
    for (node, entry) in volumes {
        match crate::manifest::decode::values::volume(&entry) {
            Ok(()) => written.push(entry),
            Err(problem) => cx.not_carried(
                node,
                &format!("services.{}.volumes", s.name),
                format!("{entry:?}: {problem}"),
            ),
        }
    }
    let mut quoted: Vec<String> = written.iter().map(|v| quote(v)).collect();
    quoted.extend(s.asset_mounts.iter().cloned());
    if !quoted.is_empty() {
        line(&mut out, "volumes", format!("[{}]", quoted.join(", ")));
    }
    if let Some(mode) = &s.network_mode {
        line(&mut out, "network_mode", quote(mode));
    } else if !s.networks.is_empty() {
        line(&mut out, "networks", list(&s.networks));
    }
    if !s.cap_add.is_empty() {
        line(&mut out, "cap_add", list(&s.cap_add));
    }
    if !s.extra_hosts.is_empty() {
        line(&mut out, "extra_hosts", list(&s.extra_hosts));
    }
    if !s.ulimits.is_empty() {
        out.push_str("  ulimits = {\n");
        for (k, v) in &s.ulimits {
            out.push_str(&format!("    {} = {}\n", key(k), quote(v)));
        }
        out.push_str("  }\n");
    }
    if !docker_options.is_empty() {
        line(&mut out, "docker_options", list(&docker_options));
    }
    if let Some(restart) = &s.restart {
        line(&mut out, "restart", quote(restart));
    }
    for (claim, target) in &claims {
        out.push_str(&format!(
            "\n  volume_claim {} {{\n    mount_path = {}\n  }}\n",
            quote(claim),
            quote(target)
        ));
    }
    if s.cpu.is_some() || s.memory.is_some() {
        out.push_str("\n  resources {\n    limits {\n");
        if let Some(cpu) = &s.cpu {
            out.push_str(&format!("      cpu = {}\n", quote(cpu)));
        }
        if let Some(memory) = &s.memory {
            out.push_str(&format!("      memory = {}\n", quote(memory)));
        }
        out.push_str("    }\n  }\n");
    }
    if let Some((size, files)) = &s.logs {
        out.push_str("\n  logs {\n");
        if let Some(size) = size {
            out.push_str(&format!("    max_size = {}\n", quote(size)));
        }
        if let Some(files) = files {
            out.push_str(&format!("    max_files = {files}\n"));
        }
        out.push_str("  }\n");
    }
    if let Some(probe) = &s.probe {
        out.push_str("\n  probes {\n    readiness {\n      exec {\n");
        out.push_str(&format!(
            "        command = {}\n      }}\n",
            list(&probe.command)
        ));
        if let Some(period) = &probe.period {
            out.push_str(&format!("      period = {}\n", quote(period)));
        }
        if let Some(timeout) = &probe.timeout {
            out.push_str(&format!("      timeout = {}\n", quote(timeout)));
        }
        if let Some(delay) = &probe.initial_delay {
            out.push_str(&format!("      initial_delay = {}\n", quote(delay)));
        }
        if let Some(n) = probe.failure_threshold.filter(|n| (1..=1000).contains(n)) {
            out.push_str(&format!("      failure_threshold = {n}\n"));
        }
        out.push_str("    }\n  }\n");
    }
    let resources = start_up_order(cx, scope, s, kinds, probed, skipped);
    if !resources.is_empty() {
        out.push_str(&format!(
            "\n  depends_on {{\n    resources = {}\n  }}\n",
            list(&resources)
        ));
    }
    out.push_str("}\n");
    out
}

/// Compose's `depends_on` as the agent's start-up order: `KIND/SCOPE/NAME` of each converted
/// service waited for. The agent waits for `Ready` (every replica running and, with a
/// readiness probe, passing it): `service_healthy` of a service with a healthcheck is that;
/// `service_started` waits longer under the agent (noted); `service_completed_successfully`
/// (a one-shot container exiting 0) has no equivalent and is named, as is a service not
/// converted.
/// What rendering one service knows of the others: each converted service's kind, those
/// with a readiness probe (from a healthcheck), those not converted (an inactive profile).
#[derive(Clone, Copy)]
struct Others<'a> {
    kinds: &'a BTreeMap<String, &'a str>,
    probed: &'a BTreeSet<String>,
    skipped: &'a BTreeSet<String>,
}

fn start_up_order(
    cx: &mut Cx<'_>,
    scope: &str,
    s: &Service,
    kinds: &BTreeMap<String, &str>,
    probed: &BTreeSet<String>,
    skipped: &BTreeSet<String>,
) -> Vec<String> {
    let mut resources: Vec<String> = Vec::new();
    for (dep, condition, node) in &s.depends_on {
        let at = format!("services.{}.depends_on.{dep}", s.name);
        let Some(kind) = kinds.get(dep).filter(|_| *dep != s.name) else {
            let why = if skipped.contains(dep) {
                format!("{dep:?} is in no active profile and was not converted")
            } else {
                format!("no converted service {dep:?}")
            };
            cx.not_carried(node, &at, why);
            continue;
        };
        match condition.as_str() {
            "service_healthy" if probed.contains(dep) => {}
            "service_healthy" => cx.note(
                node,
                &at,
                format!("note: {dep:?} has no healthcheck: the agent's Ready (what it waits for) means its replicas run"),
            ),
            "service_started" => cx.note(
                node,
                &at,
                format!("note: the agent waits until {dep:?} is Ready{}, not only started", if probed.contains(dep) { " (its readiness probe passes)" } else { " (its replicas run)" }),
            ),
            "service_completed_successfully" => {
                cx.not_carried(
                    node,
                    &at,
                    format!("the agent cannot wait for a one-shot container to exit 0; run {dep:?} as a job or a release hook (`pre_command`)"),
                );
                continue;
            }
            other => {
                cx.not_carried(node, &at, format!("the condition {other:?} is not Compose's"));
                continue;
            }
        }
        let resource = format!("{kind}/{scope}/{dep}");
        if !resources.contains(&resource) {
            resources.push(resource);
        }
    }
    resources
}
