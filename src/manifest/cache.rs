//! `DecodeCache`: what each manifest file decoded to, kept between loads and keyed by the
//! file's path and git blob id, so a commit that changes one file of many parses that one file
//! alone; and the parallel decode of the files a load has to parse.
//!
//! What a file decodes to depends on its bytes (the blob id), its path (every diagnostic and
//! origin names it), and the load's inputs: the variables (`Vars`: config buckets and
//! globals), the mode, the `file()` size limit, the missing-variable hint and this agent's
//! code. The inputs are remembered with the entries: a load with other inputs clears the
//! cache first. A file whose decode read anything else (`file()`, `env_file`, `url()`) is
//! never stored. The per-file lex, parse and decode is reused; the host policy and the checks
//! across files (duplicates, references, digest stamping, route overlaps) run through the
//! cache's `CheckIndex` (`validate::index`), again only for the keys the changed files declare
//! and the keys that read them; and each resource is reused as the checks last accepted it
//! (`Decoded::stamped`, kept with the decode: at most a second copy of a consumer's spec,
//! and its canonical JSON once the store or a plan asked for it, `Resource::spec_json`)
//! while its asset references resolve to the same digests.
//!
//! Invariants: a load through the cache returns exactly what an uncached load returns
//! (`tests::cached_loads_equal_uncached_loads`); the cache holds at most `max_bytes` of source
//! (the decoded form of a file is a few times its source) and no file over
//! `DecodeCache::MAX_FILE_BYTES`, least recently used out first;
//! decoding in parallel returns the files' results in path order, as a serial decode does.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use super::decode::{self, Decoded, LoadEnv};
use super::diagnostic::{Diagnostic, LineIndex};
use super::interpolate::{self, Vars};
use super::validate::{CheckIndex, Checked};
use super::{LoadOptions, Mode, lex};
use crate::model::{BlobId, MemoryFiles, Policy, ResourceKey, SourceFile};

/// What one manifest file decoded to: its resources and every problem found in it alone.
#[derive(Clone, Default)]
pub(crate) struct FileResult {
    pub(crate) decoded: Vec<Decoded>,
    pub(crate) errors: Vec<Diagnostic>,
    pub(crate) warnings: Vec<Diagnostic>,
    /// Asset bytes the file's inline assets hold, by sha256 digest.
    pub(crate) blobs: BTreeMap<String, Vec<u8>>,
    /// Resources of this file that failed to decode.
    pub(crate) failed: Vec<ResourceKey>,
    /// The decode read a file or URL besides the manifest: not cacheable.
    pub(crate) read_beside: bool,
}

/// Lexes, parses and decodes one manifest file.
pub(crate) fn decode_source(
    file: &SourceFile,
    vars: &Vars,
    missing_var_hint: &str,
    env: &LoadEnv<'_>,
) -> FileResult {
    let mut result = FileResult::default();
    let text = match std::str::from_utf8(&file.contents) {
        Ok(text) => text,
        Err(error) => {
            let valid = &file.contents[..error.valid_up_to()];
            let valid = std::str::from_utf8(valid).unwrap_or_default();
            let (line, col) = LineIndex::new(valid).line_col(valid.len());
            result.errors.push(Diagnostic {
                path: file.path.clone(),
                line,
                col,
                message: "invalid UTF-8 here; manifests must be UTF-8 text".to_owned(),
            });
            return result;
        }
    };
    let (marked, lex_errors) = lex::mark_interpolations(text);
    // Pre-pass spans are byte offsets of the input: each mark before them is two bytes longer
    // than the `$` it replaced, so they are located in the input, not in `marked`.
    let blocks_parse = lex_errors.iter().any(|error| error.blocks_parse);
    if !lex_errors.is_empty() {
        let input_index = LineIndex::new(text);
        for error in lex_errors {
            result
                .errors
                .push(input_index.at(&file.path, Some(error.span), error.message));
        }
    }
    if blocks_parse {
        // Such input can make the HCL parser backtrack for hours (see `lex`); the file is
        // rejected on what the pre-pass reported.
        return result;
    }
    let body = match hcl::edit::parser::parse_body(&marked) {
        Ok(body) => body,
        Err(error) => {
            let (line, col) = LineIndex::new(&marked).line_col(error.location().offset());
            result.errors.push(Diagnostic {
                path: file.path.clone(),
                line,
                col,
                message: format!("HCL syntax error: {}", error.message()),
            });
            return result;
        }
    };
    let interpolator = interpolate::Interpolator::for_file(vars, &body, missing_var_hint);
    let mut cx = decode::DecodeCx::new(&file.path, &marked, interpolator, env);
    result.decoded = decode::decode_file(&mut cx, &body);
    result.errors.append(&mut cx.diagnostics);
    result.warnings = cx.warnings;
    result.blobs = cx.blobs;
    result.failed = cx.failed;
    result.read_beside = cx.read_beside;
    result
}

/// Below this many files to parse, a load decodes them on its own thread.
const PARALLEL_MIN_FILES: usize = 4;

/// Decodes `files` (the ones not cached), on up to `threads` threads, results in their order.
///
/// The other threads decode with no repo files and no fetcher: a file that reads one (its
/// result marked `read_beside`) is decoded again here, with the load's own sources, which need
/// not be shareable across threads.
pub(crate) fn decode_all(
    files: &[&SourceFile],
    options: &LoadOptions<'_>,
    env: &LoadEnv<'_>,
    threads: usize,
) -> Vec<FileResult> {
    let serial =
        |file: &SourceFile| decode_source(file, options.vars, options.missing_var_hint, env);
    let threads = threads.min(files.len() / 2).max(1);
    if threads == 1 || files.len() < PARALLEL_MIN_FILES {
        return files.iter().map(|file| serial(file)).collect();
    }
    static NO_FILES: MemoryFiles = MemoryFiles::new();
    let (vars, hint, mode, max_file_bytes) = (
        options.vars,
        options.missing_var_hint,
        options.mode,
        options.max_file_bytes,
    );
    // Strided, so files of every size spread over the threads; each result keeps its index.
    let mut indexed: Vec<(usize, FileResult)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|worker| {
                scope.spawn(move || {
                    let env = LoadEnv {
                        files: &NO_FILES,
                        fetcher: None,
                        mode,
                        max_file_bytes,
                    };
                    files
                        .iter()
                        .enumerate()
                        .skip(worker)
                        .step_by(threads)
                        .map(|(index, file)| (index, decode_source(file, vars, hint, &env)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|worker| match worker.join() {
                Ok(results) => results,
                Err(panic) => std::panic::resume_unwind(panic),
            })
            .collect()
    });
    indexed.sort_unstable_by_key(|(index, _)| *index);
    indexed
        .into_iter()
        .map(|(index, result)| {
            if result.read_beside {
                serial(files[index])
            } else {
                result
            }
        })
        .collect()
}

/// The inputs of a decode besides the file itself.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Inputs {
    vars: Vars,
    mode: Mode,
    max_file_bytes: u64,
    missing_var_hint: String,
    /// The decoder's own version: entries live in memory only, so this never differs within
    /// one process; kept so that the key names every input.
    version: &'static str,
}

impl Inputs {
    fn of(options: &LoadOptions<'_>) -> Inputs {
        Inputs {
            vars: options.vars.clone(),
            mode: options.mode,
            max_file_bytes: options.max_file_bytes,
            missing_var_hint: options.missing_var_hint.to_owned(),
            version: env!("CARGO_PKG_VERSION"),
        }
    }

    fn matches(&self, options: &LoadOptions<'_>) -> bool {
        self.vars == *options.vars
            && self.mode == options.mode
            && self.max_file_bytes == options.max_file_bytes
            && self.missing_var_hint == options.missing_var_hint
    }
}

struct Entry {
    result: Arc<FileResult>,
    /// Source bytes of the file: what the cache's bound counts.
    bytes: usize,
    /// The load that last used it (least recently used goes first).
    used: u64,
}

#[derive(Default)]
struct Inner {
    inputs: Option<Inputs>,
    entries: HashMap<(String, BlobId), Entry>,
    bytes: usize,
    loads: u64,
    stats: CacheStats,
}

/// What the cache did since it was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Files served from the cache.
    pub hits: u64,
    /// Files decoded (cacheable or not).
    pub misses: u64,
    /// Times the load's inputs differed from the entries' and the cache was cleared.
    pub cleared: u64,
    /// Keys the checks across files ran for (a key no change touched keeps what they
    /// concluded at an earlier load).
    pub checked: u64,
}

/// Decoded manifest files by path and blob id, between loads (see the module docs).
/// One per source of commits; loads through it may come from any thread, one at a time or
/// not (it locks inside).
pub struct DecodeCache {
    inner: Mutex<Inner>,
    /// The checks across files as the last load left them (taken by a load, put back after).
    checks: Mutex<CheckIndex>,
    max_bytes: usize,
    threads: usize,
}

impl Default for DecodeCache {
    fn default() -> DecodeCache {
        DecodeCache::new(DecodeCache::DEFAULT_MAX_BYTES)
    }
}

impl std::fmt::Debug for DecodeCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.lock();
        f.debug_struct("DecodeCache")
            .field("entries", &inner.entries.len())
            .field("bytes", &inner.bytes)
            .field("max_bytes", &self.max_bytes)
            .finish()
    }
}

impl DecodeCache {
    /// The default bound: 8 MiB of manifest source (about 18,000 resources of the plan
    /// bench's kind).
    pub const DEFAULT_MAX_BYTES: usize = 8 * 1024 * 1024;

    /// A larger file is not stored: its decode is large too, and it is rarely one of many
    /// unchanged files (a rejected 5 MB commit must not stay in memory).
    pub const MAX_FILE_BYTES: usize = 256 * 1024;

    /// A cache holding at most `max_bytes` of source (0: holds nothing), decoding on every
    /// core.
    pub fn new(max_bytes: usize) -> DecodeCache {
        DecodeCache {
            inner: Mutex::new(Inner::default()),
            checks: Mutex::new(CheckIndex::default()),
            max_bytes,
            threads: default_threads(),
        }
    }

    /// Decodes on at most `threads` threads (1: on the loading thread alone).
    pub fn with_threads(mut self, threads: usize) -> DecodeCache {
        self.threads = threads.max(1);
        self
    }

    pub fn stats(&self) -> CacheStats {
        self.lock().stats
    }

    /// Files held now, and their source bytes.
    pub fn size(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.entries.len(), inner.bytes)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Decodes `files` (`ids[i]` is the blob id of `files[i]`, `None`: not cacheable), from
    /// the cache where it holds them; stores what was decoded. Also returns whether the cache
    /// holds every file's decode now (then `check` may keep them in its index).
    pub(crate) fn decode(
        &self,
        files: &[SourceFile],
        ids: &[Option<BlobId>],
        options: &LoadOptions<'_>,
        env: &LoadEnv<'_>,
    ) -> (Vec<Arc<FileResult>>, bool) {
        let mut found: Vec<Option<Arc<FileResult>>> = {
            let mut inner = self.lock();
            if inner
                .inputs
                .as_ref()
                .is_none_or(|inputs| !inputs.matches(options))
            {
                if !inner.entries.is_empty() {
                    inner.stats.cleared += 1;
                }
                inner.entries.clear();
                inner.bytes = 0;
                inner.inputs = Some(Inputs::of(options));
            }
            inner.loads += 1;
            let load = inner.loads;
            files
                .iter()
                .enumerate()
                .map(|(index, file)| {
                    let id = ids.get(index)?.as_ref()?;
                    // A lookup by borrowed parts would need a second map; a path is short.
                    let entry = inner.entries.get_mut(&(file.path.clone(), id.clone()))?;
                    entry.used = load;
                    Some(Arc::clone(&entry.result))
                })
                .collect()
        };
        let missing: Vec<usize> = (0..files.len())
            .filter(|index| found[*index].is_none())
            .collect();
        let to_decode: Vec<&SourceFile> = missing.iter().map(|index| &files[*index]).collect();
        let decoded = decode_all(&to_decode, options, env, self.threads);
        let mut inner = self.lock();
        inner.stats.hits += (files.len() - missing.len()) as u64;
        inner.stats.misses += missing.len() as u64;
        let load = inner.loads;
        let mut held = true;
        for (index, result) in missing.into_iter().zip(decoded) {
            let result = Arc::new(result);
            let file = &files[index];
            let storable = !result.read_beside
                && file.contents.len() <= self.max_bytes.min(DecodeCache::MAX_FILE_BYTES);
            held &= storable && ids.get(index).is_some_and(Option::is_some);
            if let Some(Some(id)) = ids.get(index)
                && storable
            {
                let bytes = file.contents.len();
                let replaced = inner.entries.insert(
                    (file.path.clone(), id.clone()),
                    Entry {
                        result: Arc::clone(&result),
                        bytes,
                        used: load,
                    },
                );
                inner.bytes += bytes;
                if let Some(replaced) = replaced {
                    inner.bytes -= replaced.bytes;
                }
            }
            found[index] = Some(result);
        }
        while inner.bytes > self.max_bytes {
            let Some(oldest) = inner
                .entries
                .iter()
                .min_by_key(|(_, entry)| entry.used)
                .map(|(key, _)| key.clone())
            else {
                break;
            };
            if let Some(entry) = inner.entries.remove(&oldest) {
                inner.bytes -= entry.bytes;
                // One of this load's own decodes went out: the cache no longer holds them all.
                held &= !found
                    .iter()
                    .flatten()
                    .any(|result| Arc::ptr_eq(result, &entry.result));
            }
        }
        (found.into_iter().flatten().collect(), held)
    }

    /// The checks across `results`, the decodes of `files` (in load order), under `policy`,
    /// through the index the last load left: only the keys the change touches are checked
    /// again. A fresh index checks instead, dropped after, when the cache does not hold every
    /// decode (`held`, from `decode`: the index never keeps what the cache would not, such as
    /// a rejected 5 MB file), or when the files are not in strict path order with each path
    /// once (the index knows a file by its decode, and a later file wins a key); and when
    /// another load holds the index at the time.
    pub(crate) fn check(
        &self,
        files: &[SourceFile],
        results: Vec<Arc<FileResult>>,
        policy: Option<&Policy>,
        held: bool,
    ) -> Checked {
        let ordered = files.windows(2).all(|pair| pair[0].path < pair[1].path);
        let checked = if held && ordered {
            let mut index =
                std::mem::take(&mut *self.checks.lock().unwrap_or_else(PoisonError::into_inner));
            let checked = index.check(&results, policy);
            *self.checks.lock().unwrap_or_else(PoisonError::into_inner) = index;
            checked
        } else {
            // One path twice shares one cached decode: each copy gets its own.
            let mut seen = std::collections::HashSet::new();
            let results: Vec<Arc<FileResult>> = results
                .into_iter()
                .map(|result| match seen.insert(Arc::as_ptr(&result)) {
                    true => result,
                    false => Arc::new(FileResult::clone(&result)),
                })
                .collect();
            CheckIndex::default().check(&results, policy)
        };
        self.lock().stats.checked += checked.checked as u64;
        checked
    }
}

/// The cores to decode on.
pub(crate) fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{ids, snapshot};
    use super::super::{Diagnostics, Manifest, Policy, Resource, load_cached, load_with_policy};
    use super::*;
    use crate::manifest::spec::Spec;
    use crate::model::Snapshot;

    type Loaded = Result<Manifest, Diagnostics>;

    fn options<'a>(vars: &'a Vars, files: &'a MemoryFiles) -> LoadOptions<'a> {
        LoadOptions {
            vars,
            files,
            fetcher: None,
            mode: Mode::Apply,
            max_file_bytes: 1024,
            missing_var_hint: "set {var}",
        }
    }

    fn deployment(scope: &str, name: &str, image: &str) -> String {
        format!(
            "deployment \"{scope}\" \"{name}\" {{\n  image = \"{image}\"\n  volumes = [\"${{asset.{scope}.conf.main}}:/etc/app.conf:ro\"]\n}}\n"
        )
    }

    /// Twelve files (enough to decode on several threads): deployments referring to an asset
    /// declared in another file, an env_file reader, and what `edit` makes of them.
    fn commit(edit: impl Fn(&mut Vec<(String, String)>)) -> Snapshot {
        let mut files: Vec<(String, String)> = (0..10)
            .map(|n| {
                (
                    format!("deploy/f{n:02}.hcl"),
                    deployment("shop", &format!("web{n}"), &format!("img:{n}")),
                )
            })
            .collect();
        files.push((
            "deploy/g-assets.hcl".to_owned(),
            "asset \"shop\" \"conf\" {\n  main = \"a = 1\\n\"\n}\n".to_owned(),
        ));
        files.push((
            "deploy/h-env.hcl".to_owned(),
            "deployment \"shop\" \"envy\" {\n  image = \"img:${TAG}\"\n  env_file = [\"app.env\"]\n}\n"
                .to_owned(),
        ));
        edit(&mut files);
        let borrowed: Vec<(&str, &str)> = files
            .iter()
            .map(|(path, text)| (path.as_str(), text.as_str()))
            .collect();
        snapshot(&borrowed)
    }

    /// Loads `snapshot` the old way (serial, no cache), the uncached way, and through `cache`;
    /// asserts all three agree and returns the result.
    fn load_three_ways(
        snapshot: &Snapshot,
        options: &LoadOptions<'_>,
        policy: &Policy,
        cache: &DecodeCache,
    ) -> Loaded {
        let serial = DecodeCache::new(0).with_threads(1);
        let before = load_cached(snapshot, &[], options, Some(policy), &serial);
        let uncached = load_with_policy(snapshot, options, Some(policy));
        let cached = load_cached(snapshot, &ids(snapshot), options, Some(policy), cache);
        assert_eq!(uncached, before, "parallel decode differs from serial");
        assert_eq!(cached, before, "cached load differs from uncached");
        if let (Err(expected), Err(got)) = (&before, &cached) {
            assert_eq!(expected.to_string(), got.to_string());
        }
        // A shared resource's JSON, made by an earlier load or now, is its spec's.
        for resource in cached.iter().flat_map(|manifest| &manifest.resources) {
            assert_eq!(
                resource.spec_json(),
                resource.spec.to_json(),
                "{}",
                resource.key
            );
        }
        cached
    }

    /// `Resource::spec_json` is made once; a copy, made to be changed, makes its own.
    #[test]
    fn a_resource_s_json_is_its_spec_s_and_a_copy_makes_its_own() -> Result<(), Diagnostics> {
        let vars = Vars::default();
        let repo = MemoryFiles::default();
        let manifest = load_cached(
            &commit(|files| files.retain(|(path, _)| !path.contains("env"))),
            &[],
            &options(&vars, &repo),
            None,
            &DecodeCache::new(0),
        )?;
        let web0 = manifest
            .resources
            .iter()
            .find(|resource| resource.key.name == "web0")
            .expect("web0 is declared");
        let json = web0.spec_json();
        assert_eq!(json, web0.spec.to_json());
        assert!(std::ptr::eq(json, web0.spec_json()), "made once");
        let mut copy = Resource::clone(web0);
        if let Spec::Deployment(deployment) = &mut copy.spec {
            deployment.container.image = "img:changed".into();
        }
        assert_ne!(copy.spec, web0.spec);
        assert_eq!(copy.spec_json(), copy.spec.to_json());
        assert!(copy.spec_json().contains("img:changed"));
        Ok(())
    }

    #[test]
    fn cached_loads_equal_uncached_loads() -> Result<(), String> {
        let vars = Vars {
            buckets: BTreeMap::new(),
            globals: BTreeMap::from([("TAG".to_owned(), "7".to_owned())]),
        };
        let mut repo = MemoryFiles::default();
        repo.file("deploy/app.env", b"A=1\n");
        let options = options(&vars, &repo);
        let policy = Policy::default();
        let cache = DecodeCache::default().with_threads(4);
        let commits = [
            commit(|_| {}),
            // One file changed.
            commit(|files| files[3].1 = deployment("shop", "web3", "img:new")),
            // A file with a syntax error, and one with an unresolved reference.
            commit(|files| {
                files[3].1 = "deployment \"shop\" \"web3\" {\n  image = \n".to_owned();
                files[4].1 = deployment("shop", "web4", "img:4").replace("conf.main", "conf.nope");
            }),
            // The same again: the bad files come from the cache, with the same errors.
            commit(|files| {
                files[3].1 = "deployment \"shop\" \"web3\" {\n  image = \n".to_owned();
                files[4].1 = deployment("shop", "web4", "img:4").replace("conf.main", "conf.nope");
            }),
            // The asset goes: every consumer (cached, unchanged) now fails to resolve.
            commit(|files| files.retain(|(path, _)| !path.contains("assets"))),
            // A duplicate across files (a warning: the later file wins), then back.
            commit(|files| files[9].1 = deployment("shop", "web0", "img:dup")),
            commit(|_| {}),
        ];
        let mut outcomes = Vec::new();
        for commit in &commits {
            outcomes.push(load_three_ways(commit, &options, &policy, &cache).map(|_| ()));
        }
        let errors = |index: usize| match &outcomes[index] {
            Err(diagnostics) => diagnostics.to_string(),
            Ok(()) => String::new(),
        };
        assert!(outcomes[0].is_ok() && outcomes[1].is_ok() && outcomes[6].is_ok());
        assert_eq!(
            errors(3),
            "deploy/f03.hcl:2:11: HCL syntax error: invalid expression; expected `\"`, `[`, `{`, `-`, `!`, `(`, `_`, `<`, letter or digit\n\
             deploy/f04.hcl:3:15: unresolved asset reference \"shop.conf.nope\": asset \"shop\" \"conf\" has no key `nope` (keys: main)"
        );
        assert_eq!(errors(2), errors(3));
        assert!(
            errors(4).starts_with(
                "deploy/f00.hcl:3:15: unresolved asset reference \"shop.conf.main\": no asset"
            ),
            "{}",
            errors(4)
        );
        let stats = cache.stats();
        // The env_file reader is decoded every time; every other unchanged file is reused.
        assert!(stats.hits >= 50, "{stats:?}");
        assert!(stats.misses <= 7 + 3 + 1 + 1 + 1 + 1 + 12, "{stats:?}");
        assert_eq!(stats.cleared, 0);
        Ok(())
    }

    /// The stamped form of a cached decode is shared between loads, and stamped anew when an
    /// asset it mounts changes in another file (the consumer's file a cache hit).
    #[test]
    fn a_stamp_is_shared_until_the_asset_changes() -> Result<(), Diagnostics> {
        let vars = Vars::default();
        let repo = MemoryFiles::default();
        let options = options(&vars, &repo);
        let policy = Policy::default();
        let cache = DecodeCache::default();
        let asset_text =
            |value: &str| format!("asset \"shop\" \"conf\" {{\n  main = \"{value}\"\n}}\n");
        type Edit<'a> = &'a dyn Fn(&mut Vec<(String, String)>);
        let without_env = |edit: Edit<'_>| {
            commit(|files| {
                files.retain(|(path, _)| !path.contains("env"));
                edit(files);
            })
        };
        let web0 = |manifest: &Manifest| -> Arc<Resource> {
            let found = manifest
                .resources
                .iter()
                .find(|resource| resource.key.name == "web0");
            Arc::clone(found.expect("web0 is declared"))
        };
        let first = load_three_ways(&without_env(&|_| {}), &options, &policy, &cache)?;
        let again = load_three_ways(&without_env(&|_| {}), &options, &policy, &cache)?;
        assert!(
            Arc::ptr_eq(&web0(&first), &web0(&again)),
            "one copy per stamp"
        );
        let changed = without_env(&|files| files[10].1 = asset_text("a = 2\\n"));
        let hits = cache.stats().hits;
        let third = load_three_ways(&changed, &options, &policy, &cache)?;
        assert!(
            cache.stats().hits > hits,
            "web0's file is served from the cache"
        );
        assert!(!Arc::ptr_eq(&web0(&first), &web0(&third)));
        assert_ne!(
            web0(&first).spec,
            web0(&third).spec,
            "the new digest is stamped"
        );
        let hash = |resource: Arc<Resource>| resource.spec.spec_hash(&resource.key);
        assert_ne!(hash(web0(&first)), hash(web0(&third)));
        // And back: the first digest again, stamped again (never the stale memo).
        let back = load_three_ways(&without_env(&|_| {}), &options, &policy, &cache)?;
        assert_eq!(web0(&back), web0(&first));
        Ok(())
    }

    #[test]
    fn a_changed_input_is_not_served_from_the_cache() -> Result<(), Diagnostics> {
        let mut repo = MemoryFiles::default();
        repo.file("deploy/app.env", b"A=1\n");
        let policy = Policy::default();
        let cache = DecodeCache::default();
        let commit = commit(|_| {});
        let image_of = |manifest: &Manifest| {
            manifest
                .resources
                .iter()
                .find(|resource| resource.key.name == "envy")
                .map(|resource| format!("{:?}", resource.spec))
                .unwrap_or_default()
        };
        let env_of = image_of;
        let mut vars = Vars::default();
        vars.globals.insert("TAG".to_owned(), "1".to_owned());
        let first = load_three_ways(&commit, &options(&vars, &repo), &policy, &cache)?;
        vars.globals.insert("TAG".to_owned(), "2".to_owned());
        let second = load_three_ways(&commit, &options(&vars, &repo), &policy, &cache)?;
        assert!(image_of(&first).contains("img:1") && image_of(&second).contains("img:2"));
        assert_eq!(cache.stats().cleared, 1);
        // The same variables, but a file the manifest reads changed: the same blob decodes
        // anew.
        let mut changed = MemoryFiles::default();
        changed.file("deploy/app.env", b"A=changed\n");
        let third = load_three_ways(&commit, &options(&vars, &changed), &policy, &cache)?;
        assert!(!env_of(&second).contains("changed") && env_of(&third).contains("changed"));
        // Another missing-variable hint, mode or file limit clears it too.
        let mut other = options(&vars, &repo);
        other.max_file_bytes = 2048;
        load_three_ways(&commit, &other, &policy, &cache)?;
        assert_eq!(cache.stats().cleared, 2);
        Ok(())
    }

    #[test]
    fn the_cache_stays_within_its_bound() -> Result<(), Diagnostics> {
        let vars = Vars::default();
        let repo = MemoryFiles::default();
        let options = options(&vars, &repo);
        let cache = DecodeCache::new(400);
        for round in 0..5 {
            let files: Vec<(String, String)> = (0..8)
                .map(|n| {
                    (
                        format!("f{n}.hcl"),
                        format!("deployment \"s\" \"w{n}\" {{\n  image = \"i:{round}\"\n}}\n"),
                    )
                })
                .collect();
            let borrowed: Vec<(&str, &str)> = files
                .iter()
                .map(|(path, text)| (path.as_str(), text.as_str()))
                .collect();
            let commit = snapshot(&borrowed);
            let loaded = load_cached(&commit, &ids(&commit), &options, None, &cache)?;
            assert_eq!(loaded, load_with_policy(&commit, &options, None)?);
            let (entries, bytes) = cache.size();
            assert!(
                bytes <= 400 && entries > 0,
                "{entries} files, {bytes} bytes"
            );
        }
        Ok(())
    }

    /// The checks' index keeps a load's decodes only while the cache holds every one of them:
    /// a file the cache does not hold (here one over `MAX_FILE_BYTES`, as a rejected 5 MB
    /// commit's) is dropped with its load, and the index the last load left stays.
    #[test]
    fn the_index_keeps_no_decode_the_cache_does_not_hold() -> Result<(), Diagnostics> {
        let vars = Vars::default();
        let repo = MemoryFiles::default();
        let options = options(&vars, &repo);
        let cache = DecodeCache::default();
        let small = commit(|files| files.retain(|(path, _)| !path.contains("env")));
        load_cached(&small, &ids(&small), &options, None, &cache)?;
        let held = || cache.checks.lock().map(|index| index.files()).ok();
        assert_eq!(held(), Some(11));
        let large = commit(|files| {
            files.retain(|(path, _)| !path.contains("env"));
            files.push((
                "deploy/large.hcl".to_owned(),
                format!(
                    "# {}\ndeployment \"shop\" \"large\" {{\n  image = \"x\"\n}}\n",
                    "x".repeat(DecodeCache::MAX_FILE_BYTES)
                ),
            ));
        });
        let loaded = load_cached(&large, &ids(&large), &options, None, &cache)?;
        assert_eq!(loaded, load_with_policy(&large, &options, None)?);
        assert_eq!(held(), Some(11), "the large file's decode is not kept");
        // The next commit is checked against the index of the last load it kept.
        let checked = cache.stats().checked;
        load_cached(&small, &ids(&small), &options, None, &cache)?;
        assert_eq!(cache.stats().checked, checked, "nothing changed since");
        Ok(())
    }
}
