//! `CheckIndex`: every declaration of a load by key, and what each key's checks concluded and
//! read, kept between loads so that a commit runs the checks again for the keys it touches
//! alone.
//!
//! A load hands over its files' decodes (`FileResult`s, shared with the decode cache: an
//! unchanged file is the same allocation as last time). The files that left and the files that
//! came are the change; the keys they declare (or report failed) are dirty. So is every key
//! whose checks read a dirty key (a consumer of a changed asset, an ingress whose deployment
//! went, a `${ref.ingress.…}` to a changed ingress: `readers`), and every ingress sharing a
//! route with a dirty one (`routes`). Only the dirty keys' rules run (`super::rules`); the
//! others keep what they concluded. The result is read off the index in key order.
//!
//! It keeps the last load's decodes (only while the decode cache holds every one of them:
//! `DecodeCache::check`) and, per key, its declarations, winner, notes and the keys it read:
//! some hundreds of bytes a key (its key twice or more, its state, its reads, reader sets).
//!
//! Invariant: the result equals what the rules give run over every key (a fresh index:
//! `tests::an_index_kept_between_loads_checks_as_a_fresh_one`).

use std::borrow::{Borrow, Cow};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::super::cache::FileResult;
use super::super::decode::{Decoded, Resource};
use super::super::diagnostic::Diagnostic;
use super::rules::{self, Keys, Note, Stage};
use crate::model::{Policy, ResourceKey};

/// A file's decode, by address: the same `Arc` from load to load while the file is unchanged.
type FileId = usize;

fn file_id(file: &Arc<FileResult>) -> FileId {
    Arc::as_ptr(file) as usize
}

/// One declaration: the file and the resource's place in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Decl {
    file: FileId,
    item: usize,
}

/// What the index holds for one key.
#[derive(Default)]
struct KeyState {
    /// Every declaration, in load order.
    decls: Vec<Decl>,
    /// How many files report that it failed to decode.
    failed: usize,
    /// The declaration that wins.
    winner: Option<Decl>,
    /// The winner as its own checks passed it (stamped), if they did.
    passed: Option<Arc<Resource>>,
    /// Whether it is accepted: it passed, and so did every ingress it references.
    accepted: bool,
    /// The routes the winner declares (an ingress's).
    routes: Vec<String>,
    /// The keys its checks read.
    reads: Vec<ResourceKey>,
    /// What its checks said.
    notes: Vec<Note>,
}

/// What one rule concluded about one key, and what it read.
struct Verdict<T> {
    outcome: T,
    reads: Vec<ResourceKey>,
    notes: Vec<Note>,
}

/// What the checks across files concluded about one load.
pub(crate) struct Checked {
    /// The accepted resources, by key.
    pub(crate) resources: Vec<Arc<Resource>>,
    pub(crate) errors: Vec<Diagnostic>,
    pub(crate) warnings: Vec<Diagnostic>,
    /// How many keys the rules ran for (the rest kept what the last load concluded).
    pub(crate) checked: usize,
}

/// The declarations of the last load, by key, and the checks' conclusions (see the module
/// docs). `Default` is an empty index: its first load checks every key.
#[derive(Default)]
pub(crate) struct CheckIndex {
    /// The last load's files.
    files: HashMap<FileId, Arc<FileResult>>,
    /// The policy the refusals were made under.
    policy: Option<Policy>,
    keys: BTreeMap<ResourceKey, KeyState>,
    /// Key → the keys whose checks read it.
    readers: BTreeMap<ResourceKey, BTreeSet<ResourceKey>>,
    /// Route → the ingresses whose winners declare it.
    routes: BTreeMap<String, BTreeSet<ResourceKey>>,
}

/// The index as the rules read it.
struct View<'a> {
    files: &'a HashMap<FileId, Arc<FileResult>>,
    keys: &'a BTreeMap<ResourceKey, KeyState>,
    routes: &'a BTreeMap<String, BTreeSet<ResourceKey>>,
    /// The source this load is checked for (`--sources`), if any.
    seal: Option<&'a crate::model::scopes::Seal>,
}

impl View<'_> {
    fn decl(&self, decl: Decl) -> Option<&Decoded> {
        declared(self.files, decl)
    }
}

/// The resource `decl` names among `files`.
fn declared(files: &HashMap<FileId, Arc<FileResult>>, decl: Decl) -> Option<&Decoded> {
    files.get(&decl.file)?.decoded.get(decl.item)
}

impl Keys for View<'_> {
    fn winner(&self, key: &ResourceKey) -> Option<&Decoded> {
        self.decl(self.keys.get(key)?.winner?)
    }

    fn failed(&self, key: &ResourceKey) -> bool {
        self.keys.get(key).is_some_and(|state| state.failed > 0)
    }

    fn passed(&self, key: &ResourceKey) -> bool {
        self.keys
            .get(key)
            .is_some_and(|state| state.passed.is_some())
    }

    fn first_route(&self, route: &str) -> Option<&ResourceKey> {
        self.routes.get(route)?.first()
    }

    fn foreign(&self, scope: &str) -> bool {
        self.seal.is_some_and(|seal| !seal.owns(scope))
    }
}

/// A change touching more than one key in this many is walked in order, not looked up.
const DENSE: usize = 8;

/// Calls `f` with the state of each of `keys` (sorted, unique) that the index holds, in key
/// order: looked up one by one for a few keys, or in one walk beside the index for many.
fn each_state<'k, K: Borrow<ResourceKey> + 'k>(
    states: &mut BTreeMap<ResourceKey, KeyState>,
    keys: &'k [K],
    mut f: impl FnMut(&'k ResourceKey, &mut KeyState),
) {
    if keys.len() * DENSE < states.len() {
        for key in keys {
            if let Some(state) = states.get_mut(key.borrow()) {
                f(key.borrow(), state);
            }
        }
        return;
    }
    let mut walk = states.iter_mut().peekable();
    for key in keys {
        let key = key.borrow();
        while walk.next_if(|(at, _)| *at < key).is_some() {}
        if let Some((_, state)) = walk.next_if(|(at, _)| *at == key) {
            f(key, state);
        }
    }
}

/// `each_state` reading: `f` gets `None` for a key the index does not hold.
fn each_state_ref<'k, K: Borrow<ResourceKey> + 'k>(
    states: &BTreeMap<ResourceKey, KeyState>,
    keys: &'k [K],
    mut f: impl FnMut(&'k ResourceKey, Option<&KeyState>),
) {
    if keys.len() * DENSE < states.len() {
        for key in keys {
            f(key.borrow(), states.get(key.borrow()));
        }
        return;
    }
    let mut walk = states.iter().peekable();
    for key in keys {
        let key = key.borrow();
        while walk.next_if(|(at, _)| *at < key).is_some() {}
        f(
            key,
            walk.next_if(|(at, _)| *at == key).map(|(_, state)| state),
        );
    }
}

impl CheckIndex {
    /// Checks `files` (the load's decodes, in load order: a later file wins a key), under
    /// `policy`, running the rules again for the keys the change from the last load touches.
    pub(crate) fn check(&mut self, files: &[Arc<FileResult>], policy: Option<&Policy>) -> Checked {
        if self.policy.as_ref() != policy {
            *self = CheckIndex {
                policy: policy.cloned(),
                ..CheckIndex::default()
            };
        }
        let order: HashMap<FileId, usize> = files
            .iter()
            .enumerate()
            .map(|(index, file)| (file_id(file), index))
            .collect();
        let gone: Vec<FileId> = self
            .files
            .keys()
            .filter(|id| !order.contains_key(*id))
            .copied()
            .collect();
        let came: Vec<&Arc<FileResult>> = files
            .iter()
            .filter(|file| !self.files.contains_key(&file_id(file)))
            .collect();
        // A change of most files is checked as new: cheaper than undoing the old.
        if !self.files.is_empty() && gone.len() + came.len() > files.len() {
            *self = CheckIndex {
                policy: policy.cloned(),
                ..CheckIndex::default()
            };
            return self.check(files, policy);
        }
        let gone: Vec<Arc<FileResult>> =
            gone.iter().filter_map(|id| self.files.remove(id)).collect();
        let mut dirty: Vec<Cow<'_, ResourceKey>> = Vec::new();
        for file in &gone {
            let id = file_id(file);
            for (item, decoded) in file.decoded.iter().enumerate() {
                let key = &decoded.resource.key;
                if let Some(state) = self.keys.get_mut(key) {
                    state.decls.retain(|decl| *decl != Decl { file: id, item });
                }
                dirty.push(Cow::Borrowed(key));
            }
            for key in &file.failed {
                if let Some(state) = self.keys.get_mut(key) {
                    state.failed = state.failed.saturating_sub(1);
                }
                dirty.push(Cow::Borrowed(key));
            }
        }
        // What came, sorted by key (stable: a key's declarations stay in load order).
        let mut declared: Vec<(&ResourceKey, Option<Decl>)> = Vec::new();
        for file in came {
            let id = file_id(file);
            if self.files.insert(id, Arc::clone(file)).is_some() {
                continue;
            }
            declared.extend(
                (file.decoded.iter().enumerate())
                    .map(|(item, decoded)| (&decoded.resource.key, Some(Decl { file: id, item }))),
            );
            declared.extend(file.failed.iter().map(|key| (key, None)));
        }
        declared.sort_by(|a, b| a.0.cmp(b.0));
        dirty.extend(declared.iter().map(|(key, _)| Cow::Borrowed(*key)));
        self.add(declared);
        dirty.sort_unstable();
        dirty.dedup();
        let mates = self.declare(&dirty, &order);
        let more = self.spread(&dirty, mates);
        if !more.is_empty() {
            dirty.extend(more.into_iter().map(Cow::Owned));
            dirty.sort_unstable();
            dirty.dedup();
        }
        let dirty: Vec<&ResourceKey> = dirty.iter().map(AsRef::as_ref).collect();
        self.run_checks(&dirty);
        self.forget_undeclared(&dirty);
        self.read_off(dirty.len())
    }

    /// Files each declaration (`Some`) or failed decode (`None`) of `declared`, sorted by key,
    /// under its key: all at once into an empty index, else key by key.
    fn add(&mut self, declared: Vec<(&ResourceKey, Option<Decl>)>) {
        let file = |state: &mut KeyState, decl: Option<Decl>| match decl {
            Some(decl) => state.decls.push(decl),
            None => state.failed += 1,
        };
        if self.keys.is_empty() {
            let mut states: Vec<(ResourceKey, KeyState)> = Vec::new();
            for (key, decl) in declared {
                match states.last_mut() {
                    Some((last, state)) if last == key => file(state, decl),
                    _ => {
                        let mut state = KeyState::default();
                        file(&mut state, decl);
                        states.push((key.clone(), state));
                    }
                }
            }
            // Sorted and unique already: built in one pass.
            self.keys = states.into_iter().collect();
            return;
        }
        for (key, decl) in declared {
            match self.keys.get_mut(key) {
                Some(state) => file(state, decl),
                None => {
                    let mut state = KeyState::default();
                    file(&mut state, decl);
                    self.keys.insert(key.clone(), state);
                }
            }
        }
    }

    /// For each key of `dirty`: its declarations in load order, the winner, what the
    /// duplicates and the policy say, and its routes in `routes`. Returns the ingresses that
    /// shared a route with one of them, before or after: which is first may have changed.
    fn declare(
        &mut self,
        dirty: &[Cow<'_, ResourceKey>],
        order: &HashMap<FileId, usize>,
    ) -> Vec<ResourceKey> {
        let mut mates = Vec::new();
        let (files, policy, routes) = (&self.files, &self.policy, &mut self.routes);
        each_state(&mut self.keys, dirty, |key, state| {
            state
                .decls
                .sort_by_key(|decl| (order.get(&decl.file).copied(), decl.item));
            let decls: Vec<&Decoded> = state
                .decls
                .iter()
                .filter_map(|decl| declared(files, *decl))
                .collect();
            state.notes.clear();
            if let (Some(policy), Some(last)) = (policy, decls.last()) {
                rules::refusals(policy, last, &mut state.notes);
            }
            state.winner = (!decls.is_empty())
                .then(|| state.decls[rules::winner(key, &decls, &mut state.notes)]);
            let now = state
                .winner
                .and_then(|winner| declared(files, winner))
                .map(rules::routes)
                .unwrap_or_default();
            if now.is_empty() && state.routes.is_empty() {
                return;
            }
            for route in &state.routes {
                if let Some(ingresses) = routes.get_mut(route) {
                    ingresses.remove(key);
                    mates.extend(ingresses.iter().cloned());
                    if ingresses.is_empty() {
                        routes.remove(route);
                    }
                }
            }
            for route in &now {
                let ingresses = routes.entry(route.clone()).or_default();
                mates.extend(ingresses.iter().cloned());
                ingresses.insert(key.clone());
            }
            state.routes = now;
        });
        mates
    }

    /// The keys not in `dirty` (sorted) to check again as well: `more`, and every key whose
    /// checks read a dirty key or one of these, transitively.
    fn spread(
        &self,
        dirty: &[Cow<'_, ResourceKey>],
        more: Vec<ResourceKey>,
    ) -> BTreeSet<ResourceKey> {
        let is_dirty = |key: &ResourceKey| {
            dirty
                .binary_search_by(|dirty| dirty.as_ref().cmp(key))
                .is_ok()
        };
        let mut todo: Vec<ResourceKey> = more;
        if !self.readers.is_empty() {
            todo.extend(
                dirty
                    .iter()
                    .filter_map(|key| self.readers.get(key.borrow()))
                    .flatten()
                    .cloned(),
            );
        }
        let mut added = BTreeSet::new();
        while let Some(key) = todo.pop() {
            if is_dirty(&key) || added.contains(&key) {
                continue;
            }
            todo.extend(self.readers.get(&key).into_iter().flatten().cloned());
            added.insert(key);
        }
        added
    }

    /// Runs each dirty key's checks, its own first for them all, then its references (which
    /// read whether other keys passed theirs), and files what each read under `readers`.
    fn run_checks(&mut self, dirty: &[&ResourceKey]) {
        let own = self.judge(dirty, |key, _, winner, view, notes, reads| {
            let passed = rules::check_one(key, winner, view, notes, reads);
            let references = passed.is_some() && rules::references_an_ingress(winner);
            Some((passed, references))
        });
        let mut verdicts = own.into_iter();
        let mut referring = Vec::new();
        let mut read: Vec<(ResourceKey, &ResourceKey)> = Vec::new();
        let readers = &mut self.readers;
        each_state(&mut self.keys, dirty, |key, state| {
            let verdict = verdicts.next().flatten();
            for was_read in std::mem::take(&mut state.reads) {
                if let Some(set) = readers.get_mut(&was_read) {
                    set.remove(key);
                    if set.is_empty() {
                        readers.remove(&was_read);
                    }
                }
            }
            state.notes.retain(|note| note.stage < Stage::Check);
            let Some(Verdict {
                outcome: (passed, references),
                reads,
                notes,
            }) = verdict
            else {
                state.passed = None;
                state.accepted = false;
                return;
            };
            state.accepted = passed.is_some();
            state.passed = passed;
            state.notes.extend(notes);
            read.extend(reads.iter().map(|target| (target.clone(), key)));
            state.reads = reads;
            if references {
                referring.push(key);
            }
        });
        let checked = self.judge(&referring, |key, _, winner, view, notes, reads| {
            Some(rules::check_references(key, winner, view, notes, reads))
        });
        for (key, verdict) in referring.iter().zip(checked) {
            let (Some(state), Some(verdict)) = (self.keys.get_mut(*key), verdict) else {
                continue;
            };
            state.accepted = verdict.outcome;
            state.notes.extend(verdict.notes);
            read.extend(verdict.reads.iter().map(|target| (target.clone(), *key)));
            state.reads.extend(verdict.reads);
        }
        self.file_reads(read);
    }

    /// Files `(read, reader)` pairs under `readers`: all at once into an empty index.
    fn file_reads(&mut self, mut read: Vec<(ResourceKey, &ResourceKey)>) {
        if self.readers.is_empty() {
            read.sort_unstable();
            let mut grouped: Vec<(ResourceKey, BTreeSet<ResourceKey>)> = Vec::new();
            for (target, reader) in read {
                match grouped.last_mut() {
                    Some((last, set)) if *last == target => {
                        set.insert(reader.clone());
                    }
                    _ => grouped.push((target, BTreeSet::from([reader.clone()]))),
                }
            }
            self.readers = grouped.into_iter().collect();
            return;
        }
        for (target, reader) in read {
            self.readers
                .entry(target)
                .or_default()
                .insert(reader.clone());
        }
    }

    /// `rule` over the winner of each of `keys` (sorted; `None` where there is none or
    /// `rule` says so), reading the index as it stands.
    fn judge<T>(
        &self,
        keys: &[&ResourceKey],
        rule: impl Fn(
            &ResourceKey,
            &KeyState,
            &Decoded,
            &View<'_>,
            &mut Vec<Note>,
            &mut Vec<ResourceKey>,
        ) -> Option<T>,
    ) -> Vec<Option<Verdict<T>>> {
        let view = View {
            files: &self.files,
            keys: &self.keys,
            routes: &self.routes,
            seal: self.policy.as_ref().and_then(|policy| policy.seal.as_ref()),
        };
        let mut verdicts = Vec::with_capacity(keys.len());
        each_state_ref(&self.keys, keys, |key, state| {
            let verdict = state.and_then(|state| {
                let winner = view.decl(state.winner?)?;
                let (mut notes, mut reads) = (Vec::new(), Vec::new());
                let outcome = rule(key, state, winner, &view, &mut notes, &mut reads)?;
                Some(Verdict {
                    outcome,
                    reads,
                    notes,
                })
            });
            verdicts.push(verdict);
        });
        verdicts
    }

    /// How many files' decodes the index keeps.
    #[cfg(test)]
    pub(crate) fn files(&self) -> usize {
        self.files.len()
    }

    /// Drops the dirty keys nothing declares any more.
    fn forget_undeclared(&mut self, dirty: &[&ResourceKey]) {
        let mut undeclared = Vec::new();
        each_state(&mut self.keys, dirty, |key, state| {
            if state.decls.is_empty() && state.failed == 0 {
                undeclared.push(key);
            }
        });
        for key in undeclared {
            self.keys.remove(key);
        }
    }

    /// The accepted resources in key order, and the notes: errors and warnings each in stage
    /// order, then key order (the order the checks of one pass over every key make them);
    /// `checked` keys were checked again.
    fn read_off(&self, checked: usize) -> Checked {
        let mut resources = Vec::with_capacity(self.keys.len());
        let mut errors: [Vec<Diagnostic>; Stage::ALL.len()] = Default::default();
        let mut warnings: [Vec<Diagnostic>; Stage::ALL.len()] = Default::default();
        for state in self.keys.values() {
            if state.accepted
                && let Some(resource) = &state.passed
            {
                resources.push(Arc::clone(resource));
            }
            for note in &state.notes {
                let list = if note.error {
                    &mut errors
                } else {
                    &mut warnings
                };
                list[note.stage as usize].push(note.diagnostic.clone());
            }
        }
        Checked {
            resources,
            errors: errors.into_iter().flatten().collect(),
            warnings: warnings.into_iter().flatten().collect(),
            checked,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::manifest::tests::{ids, snapshot};
    use crate::manifest::{
        DecodeCache, Diagnostics, LoadOptions, Manifest, load_cached, load_with_policy,
    };
    use crate::model::{Policy, Snapshot};

    /// A small deterministic generator (xorshift64), so a failing sequence can be replayed.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    /// One block of a kind each rule reads: deployments with and without asset or ingress
    /// references (some unresolved) or dependencies (some undeclared, some in a cycle), assets, ingresses sharing hosts or missing their
    /// deployment, a redis and its sentinel, and, rarely, a block that fails to decode or
    /// that the default host policy refuses. Few names, so keys collide across files.
    fn block(rng: &mut Rng) -> String {
        let (n, v) = (rng.below(5), rng.below(3));
        match rng.below(20) {
            0..=2 => format!("deployment \"s\" \"web{n}\" {{\n  image = \"img:{v}\"\n}}\n"),
            // Start-up order: undeclared names and cycles come and go.
            3 => format!(
                "deployment \"s\" \"web{n}\" {{\n  image = \"img:{v}\"\n  depends_on {{\n    resources = [\"deployment/web{}\"]\n  }}\n}}\n",
                rng.below(5)
            ),
            4..=7 => {
                let key = if rng.below(6) == 0 { "other" } else { "main" };
                format!(
                    "deployment \"s\" \"web{n}\" {{\n  image = \"img:{v}\"\n  volumes = [\"${{asset.s.conf{}.{key}}}:/etc/app.conf:ro\"]\n}}\n",
                    rng.below(3)
                )
            }
            8..=10 => format!(
                "asset \"s\" \"conf{}\" {{\n  main = \"x = {v}\\n\"\n}}\n",
                rng.below(3)
            ),
            11..=13 => format!(
                "ingress \"s\" \"in{}\" {{\n  host = \"h{}.example.com\"\n  service = \"web{n}\"\n  port = 80\n}}\n",
                rng.below(4),
                rng.below(2)
            ),
            14 | 15 => format!(
                "deployment \"s\" \"web{n}\" {{\n  image = \"img:{v}\"\n  env = {{ URL = \"${{ref.ingress.in{}.host}}\" }}\n}}\n",
                rng.below(4)
            ),
            16 => format!("redis \"s\" \"r{}\" {{\n  replicas = 1\n}}\n", rng.below(2)),
            17 => format!(
                "redis \"s\" \"q{n}\" {{\n  sentinel {{\n    monitor = \"s/r{}\"\n  }}\n}}\n",
                rng.below(2)
            ),
            18 => format!(
                "deployment \"s\" \"web{n}\" {{\n  image = \"img:{v}\"\n  replicas = \"many\"\n}}\n"
            ),
            _ => format!(
                "deployment \"s\" \"web{n}\" {{\n  image = \"img:{v}\"\n  network_mode = \"host\"\n}}\n"
            ),
        }
    }

    fn file(rng: &mut Rng) -> String {
        (0..rng.below(4)).map(|_| block(rng)).collect()
    }

    fn commit(files: &[(String, String)]) -> Snapshot {
        let borrowed: Vec<(&str, &str)> = files
            .iter()
            .map(|(path, text)| (path.as_str(), text.as_str()))
            .collect();
        snapshot(&borrowed)
    }

    /// Commit after commit, each changing, adding or removing a file or two (now and then
    /// every file, or the policy), a load through one cache (its index kept from load to
    /// load) returns what a load through a fresh index returns: the same resources, stamped
    /// the same, and the same errors and warnings in the same order.
    #[test]
    fn an_index_kept_between_loads_checks_as_a_fresh_one() {
        let vars = crate::manifest::Vars::default();
        let options = LoadOptions {
            vars: &vars,
            ..LoadOptions::standalone()
        };
        let strict = Policy::default();
        let open = Policy {
            allow_host_network: true,
            ..Policy::default()
        };
        let (mut accepted, mut rejected) = (0, 0);
        for seed in 1..=30_u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let cache = DecodeCache::default();
            let mut files: Vec<(String, String)> = (0..6)
                .map(|index| (format!("m/f{index}.hcl"), file(&mut rng)))
                .collect();
            for step in 0..40 {
                match rng.below(10) {
                    0 if files.len() > 1 => {
                        let at = rng.below(files.len() as u64) as usize;
                        files.remove(at);
                    }
                    1 => {
                        let path = format!("m/f{}.hcl", rng.below(12));
                        if !files.iter().any(|(name, _)| *name == path) {
                            files.push((path, file(&mut rng)));
                            files.sort_unstable();
                        }
                    }
                    2 if step % 13 == 0 => {
                        for (_, text) in &mut files {
                            *text = file(&mut rng);
                        }
                    }
                    _ => {
                        for _ in 0..=rng.below(2) {
                            let at = rng.below(files.len() as u64) as usize;
                            files[at].1 = file(&mut rng);
                        }
                    }
                }
                let policy = if step % 17 == 16 { &open } else { &strict };
                let snapshot = commit(&files);
                let kept: Result<Manifest, Diagnostics> =
                    load_cached(&snapshot, &ids(&snapshot), &options, Some(policy), &cache);
                let fresh = load_with_policy(&snapshot, &options, Some(policy));
                assert_eq!(kept, fresh, "seed {seed}, step {step}: {files:#?}");
                match kept {
                    Ok(_) => accepted += 1,
                    Err(_) => rejected += 1,
                }
            }
        }
        // Both outcomes were exercised, many times.
        assert!(
            accepted > 100 && rejected > 100,
            "{accepted} accepted, {rejected} rejected"
        );
    }

    /// Files out of path order, or one path twice (a snapshot neither reader makes, but
    /// `load_cached` is public), are checked on a fresh index: a kept one would know the
    /// second copy of a path by the first's decode, and would keep a winner that the new
    /// order changes.
    #[test]
    fn files_out_of_path_order_are_checked_as_new() {
        let vars = crate::manifest::Vars::default();
        let options = LoadOptions {
            vars: &vars,
            ..LoadOptions::standalone()
        };
        let web = |image: &str| format!("deployment \"s\" \"web\" {{\n  image = \"{image}\"\n}}\n");
        let cache = DecodeCache::default();
        let twice = commit(&[
            ("m/a.hcl".to_owned(), web("img:1")),
            ("m/a.hcl".to_owned(), web("img:1")),
        ]);
        let sorted = commit(&[
            ("m/a.hcl".to_owned(), web("img:1")),
            ("m/b.hcl".to_owned(), web("img:2")),
        ]);
        let reversed = commit(&[
            ("m/b.hcl".to_owned(), web("img:2")),
            ("m/a.hcl".to_owned(), web("img:1")),
        ]);
        for snapshot in [&twice, &twice, &sorted, &reversed, &sorted] {
            let kept = load_cached(snapshot, &ids(snapshot), &options, None, &cache);
            assert_eq!(kept, load_with_policy(snapshot, &options, None));
        }
    }

    /// A commit that changes one file of many checks that file's keys again, and the keys
    /// that read them (the deployment that mounts its asset, the ingress that routes to its
    /// deployment), not the others.
    #[test]
    fn a_change_checks_again_the_keys_it_touches_alone() -> Result<(), Diagnostics> {
        let vars = crate::manifest::Vars::default();
        let options = LoadOptions {
            vars: &vars,
            ..LoadOptions::standalone()
        };
        let group = |n: usize, image: &str| {
            format!(
                "asset \"s\" \"conf{n}\" {{\n  main = \"n = {n}\\n\"\n}}\n\
                 deployment \"s\" \"web{n}\" {{\n  image = \"{image}\"\n  volumes = [\"${{asset.s.conf{n}.main}}:/etc/app.conf:ro\"]\n}}\n\
                 ingress \"s\" \"in{n}\" {{\n  host = \"h{n}.example.com\"\n  service = \"web{n}\"\n  port = 80\n}}\n"
            )
        };
        let mut files: Vec<(String, String)> = (0..50)
            .map(|n| (format!("m/f{n:02}.hcl"), group(n, "img:1")))
            .collect();
        let cache = DecodeCache::default();
        let load = |files: &[(String, String)]| {
            let snapshot = commit(files);
            load_cached(&snapshot, &ids(&snapshot), &options, None, &cache)
        };
        load(&files)?;
        assert_eq!(
            cache.stats().checked,
            150,
            "the first load checks every key"
        );
        // The image alone: the deployment, and the ingress that reads it.
        files[7].1 = group(7, "img:2");
        load(&files)?;
        assert_eq!(cache.stats().checked, 150 + 3);
        // The asset's bytes: its file's three keys again, and the new digest is stamped.
        files[20].1 = group(20, "img:1").replace("main = \"n = 20", "main = \"n = 21");
        let manifest = load(&files)?;
        assert_eq!(cache.stats().checked, 150 + 3 + 3);
        let web20 = manifest
            .resources
            .iter()
            .find(|resource| resource.key.name == "web20")
            .expect("web20 is accepted");
        assert!(
            web20
                .spec_json()
                .contains(&crate::manifest::spec::sha256_hex(b"n = 21\n")),
            "the new digest is stamped: {}",
            web20.spec_json()
        );
        // The same commit again: nothing to check.
        load(&files)?;
        assert_eq!(cache.stats().checked, 150 + 3 + 3);
        Ok(())
    }
}
