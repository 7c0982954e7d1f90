//! Config buckets: host-local key/value sets that `voodu-agent config` edits, that `${VAR}`
//! reads at sync time, and that containers get in their environment (spec §4). They never come
//! from git and never appear in logs, status or errors.
//!
//! Invariants: a bucket is `(scope, name)`, `name` empty for the scope-level bucket; every
//! change bumps `config_version` in the same transaction, so the sync loop notices it with one
//! read; `Bucket`'s `Debug` shows keys, never values; each change is in the activity log with
//! its keys and keyed digests of the values, never a value.

use std::collections::BTreeMap;
use std::fmt;

use rusqlite::{OptionalExtension, params};

use super::activity::{self, ActivityOutcome, Entry, Origin, Who};
use super::{Result, Store};

/// One bucket's values. `Debug` redacts them.
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct Bucket(pub(crate) BTreeMap<String, String>);

impl fmt::Debug for Bucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.keys().map(|key| (key, "<redacted>")))
            .finish()
    }
}

/// All buckets by `(scope, name)`.
pub(crate) type Buckets = BTreeMap<(String, String), BTreeMap<String, String>>;

impl Store {
    /// Sets `pairs` in bucket `(scope, name)`. Returns the keys whose value changed. A change
    /// queues the deployments and statefulsets for a reconcile in the same transaction
    /// (journal rows), so those whose environment it changes roll at once.
    pub fn config_set(
        &self,
        scope: &str,
        name: &str,
        pairs: &BTreeMap<String, String>,
    ) -> Result<Vec<String>> {
        let (changed, head) = self.with(|connection| {
            let tx = connection.transaction()?;
            let mut changed = Vec::new();
            for (key, value) in pairs {
                let old: Option<String> = tx
                    .query_row(
                        "SELECT value FROM config WHERE scope = ?1 AND name = ?2 AND key = ?3",
                        params![scope, name, key],
                        |row| row.get(0),
                    )
                    .optional()?;
                if old.as_deref() != Some(value.as_str()) {
                    tx.execute(
                        "INSERT INTO config (scope, name, key, value) VALUES (?1, ?2, ?3, ?4)
                         ON CONFLICT (scope, name, key) DO UPDATE SET value = excluded.value",
                        params![scope, name, key, value],
                    )?;
                    changed.push(key.clone());
                }
            }
            let head = if changed.is_empty() {
                None
            } else {
                let mut keys = Vec::new();
                for key in &changed {
                    let value = pairs.get(key).map(String::as_str).unwrap_or_default();
                    keys.push(serde_json::json!({
                        "key": key,
                        "digest": activity::config_digest(&tx, value)?,
                    }));
                }
                record_config(&tx, &self.who, "config.set", scope, name, &changed, keys)?;
                Some(config_changed(&tx)?)
            };
            tx.commit()?;
            Ok((changed, head))
        })?;
        if let Some(head) = head {
            self.shared.journal_head.send_replace(head);
        }
        Ok(changed)
    }

    /// Removes `keys` from bucket `(scope, name)`. Returns the keys that were there. Queues the
    /// workloads as `config_set` does.
    pub(crate) fn config_unset(
        &self,
        scope: &str,
        name: &str,
        keys: &[String],
    ) -> Result<Vec<String>> {
        let (removed, head) = self.with(|connection| {
            let tx = connection.transaction()?;
            let mut removed = Vec::new();
            for key in keys {
                let n = tx.execute(
                    "DELETE FROM config WHERE scope = ?1 AND name = ?2 AND key = ?3",
                    params![scope, name, key],
                )?;
                if n > 0 {
                    removed.push(key.clone());
                }
            }
            let head = if removed.is_empty() {
                None
            } else {
                let keys = removed
                    .iter()
                    .map(|key| serde_json::json!({ "key": key }))
                    .collect();
                record_config(&tx, &self.who, "config.unset", scope, name, &removed, keys)?;
                Some(config_changed(&tx)?)
            };
            tx.commit()?;
            Ok((removed, head))
        })?;
        if let Some(head) = head {
            self.shared.journal_head.send_replace(head);
        }
        Ok(removed)
    }

    /// One bucket's values.
    pub(crate) fn config_get(&self, scope: &str, name: &str) -> Result<Bucket> {
        self.with(|connection| {
            let mut statement = connection.prepare_cached(
                "SELECT key, value FROM config WHERE scope = ?1 AND name = ?2 ORDER BY key",
            )?;
            let rows = statement.query_map(params![scope, name], |row| {
                Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
            })?;
            Ok(Bucket(crate::model::try_map_of(rows)?))
        })
    }

    /// Every bucket.
    pub fn buckets(&self) -> Result<Buckets> {
        self.with(|connection| {
            let mut statement = connection
                .prepare("SELECT scope, name, key, value FROM config ORDER BY scope, name, key")?;
            let rows =
                statement.query_map([], |row| <(String, String, String, String)>::try_from(row))?;
            let mut buckets = Buckets::new();
            for row in rows {
                let (scope, name, key, value) = row?;
                buckets.entry((scope, name)).or_default().insert(key, value);
            }
            Ok(buckets)
        })
    }

    /// The buckets named in `names` that exist, read in one transaction (one indexed lookup
    /// per name): what one resource's environment is made of, without reading the others.
    pub fn buckets_of(&self, names: &[(String, String)]) -> Result<Buckets> {
        self.with(|connection| {
            let tx = connection.transaction()?;
            let mut buckets = Buckets::new();
            {
                let mut statement = tx.prepare_cached(
                    "SELECT key, value FROM config WHERE scope = ?1 AND name = ?2 ORDER BY key",
                )?;
                for (scope, name) in names {
                    let values = crate::model::try_map_of(
                        statement.query_map(params![scope, name], |row| {
                            Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
                        })?,
                    )?;
                    if !values.is_empty() {
                        buckets.insert((scope.clone(), name.clone()), values);
                    }
                }
            }
            tx.commit()?;
            Ok(buckets)
        })
    }

    /// Bumped by every bucket change.
    pub(crate) fn config_version(&self) -> Result<i64> {
        self.with(|connection| {
            // Read by every poll of every source: prepared once.
            Ok(connection
                .prepare_cached("SELECT value FROM meta WHERE key = 'config_version'")?
                .query_row([], |row| row.get::<_, String>(0))
                .optional()?
                .and_then(|text| text.parse().ok())
                .unwrap_or(0))
        })
    }

    /// Makes sure bucket `(scope, name)` has `key`, setting it to `generate()` if missing.
    /// Returns true when it generated one.
    pub(crate) fn ensure_config(
        &self,
        scope: &str,
        name: &str,
        key: &str,
        generate: impl FnOnce() -> String,
    ) -> Result<bool> {
        self.with(|connection| {
            let tx = connection.transaction()?;
            let present: Option<i64> = tx
                .query_row(
                    "SELECT 1 FROM config WHERE scope = ?1 AND name = ?2 AND key = ?3",
                    params![scope, name, key],
                    |row| row.get(0),
                )
                .optional()?;
            if present.is_some() {
                return Ok(false);
            }
            let value = generate();
            tx.execute(
                "INSERT INTO config (scope, name, key, value) VALUES (?1, ?2, ?3, ?4)",
                params![scope, name, key, value],
            )?;
            let keys = vec![serde_json::json!({
                "key": key,
                "digest": activity::config_digest(&tx, &value)?,
            })];
            record_config(
                &tx,
                &Who::AGENT,
                "config.set",
                scope,
                name,
                &[key.to_owned()],
                keys,
            )?;
            bump_config_version(&tx)?;
            tx.commit()?;
            Ok(true)
        })
    }

    /// Asset bytes by digest.
    pub(crate) fn blob(&self, digest: &str) -> Result<Option<Vec<u8>>> {
        self.with(|connection| {
            Ok(connection
                .query_row(
                    "SELECT bytes FROM blobs WHERE digest = ?1 LIMIT 1",
                    params![digest],
                    |row| row.get(0),
                )
                .optional()?)
        })
    }
}

/// A bucket changed: bump the config version (the sync re-applies the commit, for `${VAR}`)
/// and journal every deployment and statefulset with its current generation (their
/// environment digests are recomputed; those that changed roll). Returns the journal head.
/// The activity row of a config change: the bucket, the keys and (for a set) their
/// digests; never a value.
fn record_config(
    tx: &rusqlite::Transaction<'_>,
    who: &Who,
    action: &str,
    scope: &str,
    name: &str,
    keys: &[String],
    digests: Vec<serde_json::Value>,
) -> rusqlite::Result<()> {
    let resource = if name.is_empty() {
        format!("config/{scope}")
    } else {
        format!("config/{scope}/{name}")
    };
    let message = if who.origin == Origin::Agent {
        format!("generated {}", keys.join(" "))
    } else {
        keys.join(" ")
    };
    let mut entry = Entry::new(action, who, ActivityOutcome::Succeeded);
    entry.resource = Some(&resource);
    entry.message = &message;
    entry.data = serde_json::json!({ "keys": digests });
    activity::record(tx, &entry)
}

fn config_changed(tx: &rusqlite::Transaction<'_>) -> Result<i64> {
    bump_config_version(tx)?;
    let workloads: Vec<(String, String, String, i64, String)> = {
        let mut statement = tx.prepare_cached(
            "SELECT kind, scope, name, generation, commit_sha FROM desired
             WHERE kind IN ('deployment', 'statefulset') ORDER BY kind, scope, name",
        )?;
        let rows = statement.query_map([], |row| row.try_into())?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    for (kind, scope, name, generation, commit) in workloads {
        let key = super::key_from_row(&kind, scope, name)?;
        super::desired::append_journal(
            tx,
            &key,
            super::Op::Put,
            generation,
            &crate::model::CommitSha::new(commit),
        )?;
    }
    Ok(
        tx.query_row("SELECT COALESCE(MAX(seq), 0) FROM journal", [], |row| {
            row.get(0)
        })?,
    )
}

fn bump_config_version(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute(
        "INSERT INTO meta (key, value) VALUES ('config_version', '1')
         ON CONFLICT (key) DO UPDATE SET value = CAST(value AS INTEGER) + 1",
        [],
    )?;
    Ok(())
}
