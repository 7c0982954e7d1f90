//! Properties of [`load`] that hold for every input, whatever its bytes: the checks the fuzz
//! target (`fuzz/fuzz_targets/manifest.rs`) runs on each input, and that the unit tests run
//! on its seed files so they are exercised without the fuzzer.
//!
//! Compiled only for tests and for fuzzing builds (`cargo fuzz` passes `--cfg fuzzing`), so
//! the agent itself never carries it.
//!
//! The checked properties, for every load:
//! - loading the same snapshot twice gives the same result;
//! - a rejected load carries at least one diagnostic, sorted by location;
//! - every diagnostic, warning and resource origin names one of the snapshot's paths and
//!   points inside its file: line ≥ 1 and at most the file's line count, column ≥ 1 and at
//!   most one past the end of that line;
//! - on success, resources are sorted by key without repeats, every scope and name passes
//!   the name rules (an empty scope only for assets and registries), each spec is of its
//!   key's kind and round-trips through `Spec::to_json` / `Spec::from_json` unchanged, and
//!   every blob is stored under its own sha256 digest.

use std::collections::BTreeMap;
use std::time::Duration;

use super::diagnostic::Diagnostic;
use super::spec::{Spec, sha256_hex};
use super::validate::check_name;
use super::{LoadOptions, Manifest, Mode, UrlError, UrlFetcher, Vars, load};
use crate::model::{CommitSha, Kind, MemoryFiles, Snapshot, SourceFile};

/// In the two-file variant, the input splits into two files at the first occurrence of this
/// line (an HCL comment, so it changes nothing where it is left in).
pub(crate) const FILE_SEPARATOR: &[u8] = b"\n#----\n";

/// The path the single-file variant loads the input as.
pub(crate) const SINGLE_PATH: &str = "m/app.hcl";

/// The paths of the two-file variant, in snapshot (lexical) order.
pub(crate) const PAIR_PATHS: [&str; 2] = ["apps/a.hcl", "apps/b/b.voodu"];

/// The `max_file_bytes` of the two-file variant: small, so `apps/big.txt` exceeds it.
pub(crate) const PAIR_MAX_FILE_BYTES: u64 = 128;

/// Runs every check on `data`: as one file with no vars and no other repo files, then split
/// in two files (at [`FILE_SEPARATOR`]; without one, both files hold the whole input) with
/// the vars of [`pair_vars`], the repo files of [`pair_files`] and a fetcher that answers
/// from the URL alone; each in both modes. Returns how many of those four loads accepted the
/// input; the error describes the first broken property.
pub(crate) fn check_input(data: &[u8]) -> Result<usize, String> {
    let mut n_accepted = 0;
    let single = snapshot(&[(SINGLE_PATH, data)]);
    for mode in [Mode::Apply, Mode::Validate] {
        let options = LoadOptions {
            mode,
            ..LoadOptions::standalone()
        };
        n_accepted += usize::from(
            check_load(&single, &options).map_err(|why| format!("single file, {mode:?}: {why}"))?,
        );
    }

    let (first, second) = split(data);
    let pair = snapshot(&[(PAIR_PATHS[0], first), (PAIR_PATHS[1], second)]);
    let vars = pair_vars();
    let files = pair_files();
    for mode in [Mode::Apply, Mode::Validate] {
        let options = LoadOptions {
            vars: &vars,
            files: &files,
            fetcher: (mode == Mode::Apply).then_some(&FakeFetcher as &dyn UrlFetcher),
            mode,
            max_file_bytes: PAIR_MAX_FILE_BYTES,
            missing_var_hint: "set NAME",
        };
        n_accepted += usize::from(
            check_load(&pair, &options).map_err(|why| format!("two files, {mode:?}: {why}"))?,
        );
    }
    Ok(n_accepted)
}

/// Loads `snapshot` twice with `options` and checks every property of the result. Returns
/// whether the load accepted the snapshot.
pub(crate) fn check_load(snapshot: &Snapshot, options: &LoadOptions<'_>) -> Result<bool, String> {
    let result = load(snapshot, options);
    let again = load(snapshot, options);
    if result != again {
        return Err(format!(
            "loading twice gave different results:\n{result:?}\nthen\n{again:?}"
        ));
    }
    match &result {
        Err(diagnostics) => {
            if diagnostics.0.is_empty() {
                return Err("rejected without a diagnostic".to_owned());
            }
            let sorted = diagnostics.0.windows(2).all(|pair| {
                (&pair[0].path, pair[0].line, pair[0].col)
                    <= (&pair[1].path, pair[1].line, pair[1].col)
            });
            if !sorted {
                return Err(format!(
                    "diagnostics are not sorted by location: {diagnostics:?}"
                ));
            }
            check_locations(snapshot, "diagnostic", &diagnostics.0)?;
            Ok(false)
        }
        Ok(manifest) => {
            check_manifest(snapshot, manifest)?;
            Ok(true)
        }
    }
}

fn check_manifest(snapshot: &Snapshot, manifest: &Manifest) -> Result<(), String> {
    check_locations(snapshot, "warning", &manifest.warnings)?;
    let origins: Vec<Diagnostic> = manifest
        .resources
        .iter()
        .map(|resource| resource.origin.clone())
        .collect();
    check_locations(snapshot, "resource origin", &origins)?;
    for pair in manifest.resources.windows(2) {
        if pair[0].key >= pair[1].key {
            return Err(format!(
                "resources are not sorted by key without repeats: {} then {}",
                pair[0].key, pair[1].key
            ));
        }
    }
    for resource in &manifest.resources {
        let key = &resource.key;
        let scope_may_be_empty = matches!(key.kind, Kind::Asset | Kind::Registry);
        if key.kind == Kind::Registry && !key.scope.is_empty() {
            return Err(format!("{key}: a registry has a scope"));
        }
        if !(key.scope.is_empty() && scope_may_be_empty) {
            check_name(&key.scope).map_err(|why| format!("{key}: scope {:?} {why}", key.scope))?;
        }
        check_name(&key.name).map_err(|why| format!("{key}: name {:?} {why}", key.name))?;
        if resource.spec.kind() != key.kind {
            return Err(format!("{key}: holds a {} spec", resource.spec.kind()));
        }
        let json = resource.spec.to_json();
        let back = Spec::from_json(key.kind, &json)
            .map_err(|error| format!("{key}: its JSON does not read back ({error}): {json}"))?;
        if back != resource.spec {
            return Err(format!(
                "{key}: the spec changes through JSON:\n{:?}\nbecame\n{back:?}\n(JSON {json})",
                resource.spec
            ));
        }
    }
    for (digest, bytes) in &manifest.blobs {
        if &sha256_hex(bytes) != digest {
            return Err(format!("blob {digest} holds bytes of another digest"));
        }
    }
    Ok(())
}

/// Every location names a snapshot path and points inside that file.
fn check_locations(snapshot: &Snapshot, what: &str, located: &[Diagnostic]) -> Result<(), String> {
    for diagnostic in located {
        let Some(file) = snapshot
            .files
            .iter()
            .find(|file| file.path == diagnostic.path)
        else {
            if snapshot
                .refused
                .iter()
                .any(|(path, _)| *path == diagnostic.path)
            {
                continue;
            }
            return Err(format!(
                "{what} names a path not in the snapshot: {diagnostic}"
            ));
        };
        let text = String::from_utf8_lossy(&file.contents);
        let lines: Vec<&str> = text.split('\n').collect();
        let Some(line) = diagnostic
            .line
            .checked_sub(1)
            .and_then(|index| lines.get(index))
        else {
            return Err(format!(
                "{what} points at line {} of a {}-line file: {diagnostic}",
                diagnostic.line,
                lines.len()
            ));
        };
        let n_chars = line.chars().count();
        if diagnostic.col == 0 || diagnostic.col > n_chars + 1 {
            return Err(format!(
                "{what} points at column {} of a {n_chars}-character line: {diagnostic}",
                diagnostic.col
            ));
        }
    }
    Ok(())
}

/// `data` split at the first [`FILE_SEPARATOR`], or twice the whole of it.
pub(crate) fn split(data: &[u8]) -> (&[u8], &[u8]) {
    match data
        .windows(FILE_SEPARATOR.len())
        .position(|window| window == FILE_SEPARATOR)
    {
        Some(at) => (&data[..at + 1], &data[at + FILE_SEPARATOR.len()..]),
        None => (data, data),
    }
}

fn snapshot(files: &[(&str, &[u8])]) -> Snapshot {
    Snapshot {
        commit: CommitSha::new("0".repeat(40)),
        files: files
            .iter()
            .map(|(path, contents)| SourceFile {
                path: (*path).to_owned(),
                contents: contents.to_vec(),
            })
            .collect(),
        refused: Vec::new(),
    }
}

/// The `${VAR}` values of the two-file variant: scope and app buckets, and globals, some of
/// them awkward (empty, a path climbing up, text that looks like an interpolation).
pub(crate) fn pair_vars() -> Vars {
    let values = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect()
    };
    let mut vars = Vars::default();
    vars.buckets.insert(
        ("shop".to_owned(), String::new()),
        values(&[("DB_HOST", "db.internal"), ("PORT", "5432")]),
    );
    vars.buckets.insert(
        ("shop".to_owned(), "web".to_owned()),
        values(&[("PORT", "8080"), ("SECRET", "s3cr3t"), ("NAME", "web")]),
    );
    vars.buckets.insert(
        ("data".to_owned(), "pg".to_owned()),
        values(&[("PGDATA", "/var/lib/postgresql/data")]),
    );
    vars.globals = values(&[
        ("REGION", "eu-west-1"),
        ("EMPTY", ""),
        ("CLIMB", "../.."),
        ("LOOKS_INTERPOLATED", "${REGION}"),
        ("MARKED", "\u{E000}{REGION}"),
        ("QUOTE", "\""),
        ("REPLICAS", "3"),
        ("TAG", "1.27"),
    ]);
    vars
}

/// The other repo files of the two-file variant (manifests at `apps/a.hcl` and
/// `apps/b/b.voodu`): env files good and bad, a file over the size limit, non-UTF-8 bytes,
/// and symlinks inside the repo, out of it, absolute and looping.
pub(crate) fn pair_files() -> MemoryFiles {
    let mut files = MemoryFiles::new();
    files
        .file(
            "apps/conf/app.env",
            b"PORT=8080\nexport NAME='web'\n# note\n",
        )
        .file("apps/conf/bad.env", b"NO_EQUALS_SIGN\n")
        .file("apps/conf/nginx.conf", b"server { listen 80; }\n")
        .file("apps/conf/binary.bin", &[0xff, 0xfe, 0x00, 0x01])
        .file("apps/big.txt", &[b'x'; 200])
        .file("shared/common.env", b"SHARED=1\n")
        .link("apps/link.env", "conf/app.env")
        .link("apps/b/up.env", "../conf/app.env")
        .link("apps/escape", "../../etc/passwd")
        .link("apps/abs", "/etc/passwd")
        .link("apps/loop", "loop");
    files
}

/// Answers from the URL alone: a URL containing `fail` fails, any other returns its text.
struct FakeFetcher;

impl UrlFetcher for FakeFetcher {
    fn fetch(&self, url: &str, _timeout: Duration, _stale_ok: bool) -> Result<Vec<u8>, UrlError> {
        if url.contains("fail") {
            Err("connection refused".into())
        } else {
            Ok(format!("body of {url}").into_bytes())
        }
    }
}
