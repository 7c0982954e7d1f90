//! Tidy checks over `src/`: every file starts with `//!`, and no module imports from a layer
//! it may not use (the layering table in ARCHITECTURE.md).

use std::path::Path;

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

fn src_files() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    files
        .into_iter()
        .map(|path| {
            let relative = path
                .strip_prefix(&root)
                .expect("under src")
                .display()
                .to_string();
            let text = std::fs::read_to_string(&path).expect("readable source");
            (relative, text)
        })
        .collect()
}

#[test]
fn every_file_starts_with_module_docs() {
    let missing: Vec<String> = src_files()
        .into_iter()
        .filter(|(_, text)| !text.starts_with("//!"))
        .map(|(path, _)| path)
        .collect();
    assert!(
        missing.is_empty(),
        "files without a leading `//!` doc: {missing:?}"
    );
}

/// Which top-level modules each module may import with `crate::…`. `metrics` and `base` sit
/// beside `model` at layer 0 (they depend on nothing but `base`), so every stage may record into the
/// one and use the other's helpers (`base::lock`, `base::hmac_sha256`).
fn allowed(module: &str) -> Option<&'static [&'static str]> {
    Some(match module {
        "model" | "base" => &[],
        "pool" => &["base"],
        "metrics" => &["base"],
        "manifest" | "git" | "restic" => &["model", "metrics", "base"],
        "runtime" => &["model", "metrics", "base", "pool"],
        "assets" => &["model", "manifest", "metrics", "base"],
        "store" => &["model", "manifest", "metrics", "base", "pool"],
        "sync" => &[
            "git", "manifest", "assets", "store", "model", "metrics", "base",
        ],
        // `assets` too: the asset handler repairs files on the host from the stored bytes.
        // `restic` too: the backup handlers run restic beside the runtime.
        "reconcile" => &[
            "model", "manifest", "assets", "store", "runtime", "restic", "metrics", "base",
        ],
        "http" => &["model", "store", "git", "metrics", "base"],
        // Notifications read the outbox and speak HTTP to the sinks; nothing else.
        "notify" => &["model", "store", "metrics", "base"],
        _ => return None,
    })
}

/// `http` may use `git` for the sync request sender only (`git::trigger`).
#[test]
fn http_uses_only_the_trigger_of_git() {
    let violations: Vec<String> = src_files()
        .into_iter()
        .filter(|(path, _)| path.starts_with("http"))
        .flat_map(|(path, text)| {
            text.lines()
                .enumerate()
                .filter(|(_, line)| {
                    line.match_indices("crate::git")
                        .any(|(index, _)| !line[index..].starts_with("crate::git::trigger"))
                })
                .map(|(line_number, _)| format!("src/{path}:{}", line_number + 1))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        violations.is_empty(),
        "http reaches into git beyond git::trigger:\n{}",
        violations.join("\n")
    );
}

#[test]
fn modules_respect_the_layering_table() {
    let mut violations = Vec::new();
    for (path, text) in src_files() {
        let module = path.split(['/', '.']).next().unwrap_or_default().to_owned();
        let Some(allowed) = allowed(&module) else {
            continue;
        };
        for (line_number, line) in text.lines().enumerate() {
            for (index, _) in line.match_indices("crate::") {
                let rest = &line[index + "crate::".len()..];
                let target: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if target.is_empty() || target == module || allowed.contains(&target.as_str()) {
                    continue;
                }
                violations.push(format!(
                    "src/{path}:{}: {module} uses crate::{target}",
                    line_number + 1
                ));
            }
        }
    }
    assert!(
        violations.is_empty(),
        "layering violations:\n{}",
        violations.join("\n")
    );
}

/// One writer per key: in the reconcile stage only the handlers (`reconcile/handlers/`) create,
/// start, stop or remove containers; the tasks beside them (probes, drift, autoscaler, cron,
/// job bookkeeping, notify) report and requeue. The ingress router is the one exception: it
/// owns the proxy container, which belongs to no key.
#[test]
fn only_handlers_change_containers() {
    let verbs = [
        "create",
        "start",
        "stop",
        "remove",
        "kill",
        "create_service",
        "update_service",
        "remove_service",
    ];
    let offenders: Vec<String> = src_files()
        .into_iter()
        .filter(|(path, _)| {
            path.starts_with("reconcile/")
                && !path.starts_with("reconcile/handlers/")
                && !path.starts_with("reconcile/router/")
        })
        .flat_map(|(path, text)| {
            let compact: String = text.split_whitespace().collect();
            verbs
                .iter()
                .filter(|verb| compact.contains(&format!("runtime.{verb}(")))
                .map(|verb| format!("{path}: runtime.{verb}"))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        offenders.is_empty(),
        "containers changed outside a handler holding their key: {offenders:?}"
    );
}

/// Time in one place: in the reconcile stage only the one timer (`reconcile/run/timer.rs`) sleeps
/// on tokio's clock; every periodic task, back-off, probe period and run deadline waits in it
/// (`Timer::sleep`, `Timer::every`), so `voodu_timer_waits` lists everything the stage waits
/// for. A timeout that bounds an I/O call (`tokio::time::timeout`) is not a wait and is allowed.
#[test]
fn only_the_one_timer_sleeps_in_the_reconcile_stage() {
    let waits = [
        "time::sleep(",
        "time::sleep_until(",
        "time::interval(",
        "time::interval_at(",
    ];
    let offenders: Vec<String> = src_files()
        .into_iter()
        .filter(|(path, _)| path.starts_with("reconcile/") && path != "reconcile/run/timer.rs")
        .flat_map(|(path, text)| {
            // A file's own unit tests may drive paused time as they like.
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            let compact: String = code.split_whitespace().collect();
            waits
                .iter()
                .filter(|wait| compact.contains(*wait))
                .map(|wait| format!("{path}: tokio::{wait}…)"))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        offenders.is_empty(),
        "the reconcile stage waits outside its one timer: {offenders:?}"
    );
}

/// Every file under `src/` is as `rustfmt` writes it. `cargo fmt` reaches a file through the
/// `mod` lines only, and the per-kind modules of `manifest/decode/kinds/` and
/// `reconcile/handlers/` are declared by the kind table (`spec::for_each_kind!`), which it
/// cannot see: this check covers them (format them with `cargo fmt -- $(find src -name '*.rs')`).
#[test]
fn every_file_is_formatted() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let output = std::process::Command::new("rustfmt")
        .args(["--edition", "2024", "--check"])
        .args(&files)
        .output()
        .expect("rustfmt runs (install it with `rustup component add rustfmt`)");
    assert!(
        output.status.success(),
        "files not formatted (run `cargo fmt -- $(find src -name '*.rs')`):\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
