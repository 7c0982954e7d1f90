//! Claims: what one source holds on the host alone, first come (`--sources`). An ingress host
//! with every path under it, a published host port, a named volume (`Spec::claims`). A
//! commit's claims are checked against the other sources' and recorded in the transaction
//! that applies it; the router and the runtime's guard read them back as the guarantee.
//!
//! Invariants: a claim has one source (`claims`' primary key, and `conflicts` run in the
//! applying transaction, so two sources applying at once cannot both take one); a source's
//! claims are exactly what its last applied commit declares (a host it no longer declares is
//! free again); claims of the desired state that predates this table are recorded by
//! `adopt_claims`, oldest declaration first, marked `adopted` (a named volume made before the
//! agent labelled volumes is its declaring scope's).

use std::collections::BTreeMap;

use rusqlite::{OptionalExtension, Transaction, params};

use super::{Result, Store, now_unix};
use crate::manifest::spec::{Claim, ClaimKind, Spec};
use crate::manifest::{Diagnostic, Manifest};
use crate::model::ResourceKey;
use crate::model::scopes::LedgerError;

/// The `meta` key set once the desired state that predates claims was adopted.
const META_ADOPTED: &str = "claims_adopted_at";

/// A claim of a commit that another source holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimConflict {
    pub claim: Claim,
    /// Where the commit declares it.
    pub at: Diagnostic,
    /// The resource of the commit that declares it.
    pub key: ResourceKey,
    /// Who holds it: the source and the resource that declared it.
    pub holder: ClaimHolder,
}

impl ClaimConflict {
    /// The conflict as a diagnostic at the declaring resource: what, who holds it, what to do.
    pub fn diagnostic(&self) -> Diagnostic {
        let holder = if self.holder.source.is_empty() {
            "the single repository (--repo)".to_owned()
        } else {
            format!("source `{}`", self.holder.source)
        };
        Diagnostic {
            message: format!(
                "{} of {} is held by {holder} ({}{}): one source holds it; remove it from this commit, or from that source first",
                self.claim,
                self.key,
                self.holder.key,
                if self.holder.value == self.claim.value {
                    String::new()
                } else {
                    format!(", as {}", self.holder.value)
                }
            ),
            ..self.at.clone()
        }
    }
}

/// Who holds a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimHolder {
    pub source: String,
    /// The declaring resource, as `kind/scope/name`.
    pub key: String,
    /// The value held (a wildcard host may cover the claimed one).
    pub value: String,
    /// Recorded from the state that predates claims (see the module docs).
    pub adopted: bool,
}

impl Store {
    /// The claims of `manifest` (this handle's source's commit) that another source holds.
    pub fn claim_conflicts(&self, manifest: &Manifest) -> Result<Vec<ClaimConflict>> {
        self.with(|connection| {
            let tx = connection.transaction()?;
            conflicts(&tx, &self.source, manifest)
        })
    }

    /// Every claim of kind `what`: its value → who holds it.
    pub fn claims(&self, what: ClaimKind) -> Result<BTreeMap<String, ClaimHolder>> {
        self.with(|connection| {
            let tx = connection.transaction()?;
            held(&tx, what)
        })
    }

    /// Records the claims of the desired state no claim covers yet, oldest declaration first
    /// (the upgrade from before claims; see the module docs), once per data dir. Returns how
    /// many were recorded.
    pub fn adopt_claims(&self) -> Result<usize> {
        self.with(|connection| {
            let tx = connection.transaction()?;
            let done: Option<String> = tx
                .query_row("SELECT value FROM meta WHERE key = ?1", params![META_ADOPTED], |row| row.get(0))
                .map(Some)
                .or_else(|error| match error {
                    rusqlite::Error::QueryReturnedNoRows => Ok(None),
                    other => Err(other),
                })?;
            if done.is_some() {
                return Ok(0);
            }
            let mut rows = Vec::new();
            {
                // Oldest declaration first: the first journal row of each key.
                let mut statement = tx.prepare(
                    "SELECT d.kind, d.scope, d.name, d.spec, d.source FROM desired d ORDER BY \
                     COALESCE((SELECT MIN(j.seq) FROM journal j WHERE j.kind = d.kind AND j.scope = d.scope AND j.name = d.name), 0), d.rowid",
                )?;
                let found = statement.query_map([], |row| <(String, String, String, String, String)>::try_from(row))?;
                for row in found {
                    rows.push(row?);
                }
            }
            let mut recorded = 0;
            for (kind, scope, name, spec, source) in rows {
                let key = super::desired::key_from_row(&kind, scope, name)?;
                // A row this agent cannot read claims nothing (it is reported where read).
                let Ok(spec) = Spec::from_json(key.kind, &spec) else {
                    continue;
                };
                for claim in spec.claims() {
                    if holder_of(&tx, &claim)?.is_some() {
                        continue;
                    }
                    tx.execute(
                        "INSERT INTO claims (what, value, source, key, since, adopted) VALUES (?1, ?2, ?3, ?4, ?5, 1)",
                        params![claim.what.as_str(), claim.value, source, key.to_string(), now_unix()],
                    )?;
                    recorded += 1;
                }
            }
            tx.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)",
                params![META_ADOPTED, now_unix().to_string()],
            )?;
            tx.commit()?;
            Ok(recorded)
        })
    }
}

/// The claims of `manifest`, declared by `source`, that another source holds.
pub(super) fn conflicts(
    tx: &Transaction<'_>,
    source: &str,
    manifest: &Manifest,
) -> Result<Vec<ClaimConflict>> {
    let mut found = Vec::new();
    for resource in &manifest.resources {
        for claim in resource.spec.claims() {
            // A wildcard host can collide with several hosts: any of another source's counts.
            if let Some(holder) = holders_of(tx, &claim)?
                .into_iter()
                .find(|holder| holder.source != source)
            {
                found.push(ClaimConflict {
                    claim,
                    at: resource.origin.clone(),
                    key: resource.key.clone(),
                    holder,
                });
            }
        }
    }
    Ok(found)
}

/// Makes `source`'s claims those of `manifest`: new ones recorded, ones it no longer declares
/// freed, ones it keeps keep their time. Call after `conflicts` found none.
pub(super) fn record(tx: &Transaction<'_>, source: &str, manifest: &Manifest) -> Result<()> {
    tx.execute(
        "CREATE TEMP TABLE IF NOT EXISTS declared_claims (what TEXT NOT NULL, value TEXT NOT NULL, key TEXT NOT NULL, PRIMARY KEY (what, value))",
        [],
    )?;
    tx.execute("DELETE FROM declared_claims", [])?;
    for resource in &manifest.resources {
        for claim in resource.spec.claims() {
            tx.execute(
                "INSERT OR IGNORE INTO declared_claims (what, value, key) VALUES (?1, ?2, ?3)",
                params![claim.what.as_str(), claim.value, resource.key.to_string()],
            )?;
        }
    }
    tx.execute(
        "DELETE FROM claims WHERE source = ?1 AND NOT EXISTS (SELECT 1 FROM declared_claims d WHERE d.what = claims.what AND d.value = claims.value)",
        params![source],
    )?;
    tx.execute(
        "INSERT OR IGNORE INTO claims (what, value, source, key, since, adopted) SELECT what, value, ?1, key, ?2, 0 FROM declared_claims",
        params![source, now_unix()],
    )?;
    Ok(())
}

/// Who holds `claim` or a claim it collides with (for a host, every wildcard or host it
/// covers or that covers it).
fn holders_of(tx: &Transaction<'_>, claim: &Claim) -> Result<Vec<ClaimHolder>> {
    if claim.what != ClaimKind::Host {
        return Ok(holder_of(tx, claim)?.into_iter().collect());
    }
    // Few hosts per host, so a scan of the hosts is cheap.
    Ok(held(tx, ClaimKind::Host)?
        .into_iter()
        .filter(|(value, _)| {
            claim.collides(&Claim {
                what: ClaimKind::Host,
                value: value.clone(),
            })
        })
        .map(|(_, holder)| holder)
        .collect())
}

/// Who holds `claim`, or a claim it collides with (a wildcard host).
fn holder_of(tx: &Transaction<'_>, claim: &Claim) -> Result<Option<ClaimHolder>> {
    let exact = tx
        .prepare_cached(
            "SELECT source, key, value, adopted FROM claims WHERE what = ?1 AND value = ?2",
        )?
        .query_row(params![claim.what.as_str(), claim.value], holder_row)
        .map(Some)
        .or_else(|error| match error {
            rusqlite::Error::QueryReturnedNoRows => Ok(None),
            other => Err(other),
        })?;
    if exact.is_some() || claim.what != ClaimKind::Host {
        return Ok(exact);
    }
    // Hosts: a wildcard on either side. Few hosts per host, so a scan of the hosts is cheap.
    Ok(held(tx, ClaimKind::Host)?
        .into_iter()
        .find(|(value, _)| {
            claim.collides(&Claim {
                what: ClaimKind::Host,
                value: value.clone(),
            })
        })
        .map(|(_, holder)| holder))
}

fn holder_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<ClaimHolder> {
    Ok(ClaimHolder {
        source: row.get(0)?,
        key: row.get(1)?,
        value: row.get(2)?,
        adopted: row.get::<_, i64>(3)? != 0,
    })
}

fn held(tx: &Transaction<'_>, what: ClaimKind) -> Result<BTreeMap<String, ClaimHolder>> {
    let mut statement =
        tx.prepare_cached("SELECT source, key, value, adopted FROM claims WHERE what = ?1")?;
    let rows = statement.query_map(params![what.as_str()], holder_row)?;
    let mut out = BTreeMap::new();
    for row in rows {
        let holder = row?;
        out.insert(holder.value.clone(), holder);
    }
    Ok(out)
}

impl crate::model::scopes::Ledger for Store {
    fn holder(&self, name: &str) -> std::result::Result<Option<(String, bool)>, LedgerError> {
        let claim = Claim {
            what: ClaimKind::Volume,
            value: name.to_owned(),
        };
        self.with(|connection| {
            let tx = connection.transaction()?;
            holder_of(&tx, &claim)
        })
        .map(|holder| holder.map(|holder| (holder.source, holder.adopted)))
        .map_err(LedgerError::from)
    }

    fn verified(&self, digest: &str, keys: &str) -> std::result::Result<bool, LedgerError> {
        self.is_verified(digest, keys).map_err(LedgerError::from)
    }
}

impl Store {
    /// Whether `digest` was verified under the keys `keys` (a fingerprint).
    pub(crate) fn is_verified(&self, digest: &str, keys: &str) -> Result<bool> {
        self.with(|connection| {
            Ok(connection
                .query_row(
                    "SELECT 1 FROM verified_images WHERE digest = ?1 AND keys = ?2",
                    params![digest, keys],
                    |_| Ok(()),
                )
                .optional()?
                .is_some())
        })
    }

    /// Records that `digest` carries a signature verified under the keys `keys`.
    pub(crate) fn record_verified(&self, digest: &str, keys: &str) -> Result<()> {
        self.with(|connection| {
            connection.execute(
                "INSERT OR REPLACE INTO verified_images (digest, keys, verified_at) VALUES (?1, ?2, ?3)",
                params![digest, keys, now_unix()],
            )?;
            Ok(())
        })
    }
}

impl Store {
    /// What each tag a running release resolved names at its registry now (the image scanner's
    /// look): image → (digest, when).
    pub fn tag_digests(&self) -> Result<BTreeMap<String, (String, i64)>> {
        self.with(|connection| {
            let mut statement = connection.prepare_cached(
                "SELECT image, digest, checked_at FROM tag_digests WHERE digest != ''",
            )?;
            let rows = statement.query_map([], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    (row.get::<_, String>(1)?, row.get::<_, i64>(2)?),
                ))
            })?;
            Ok(crate::model::try_map_of(rows)?)
        })
    }

    /// Records what `image` (a tag) names at its registry now; the digest it named before.
    pub(crate) fn record_tag_digest(&self, image: &str, digest: &str) -> Result<Option<String>> {
        self.with(|connection| {
            let tx = connection.transaction()?;
            let before: Option<String> = tx
                .query_row(
                    "SELECT digest FROM tag_digests WHERE image = ?1",
                    params![image],
                    |row| row.get(0),
                )
                .optional()?;
            tx.execute(
                "INSERT OR REPLACE INTO tag_digests (image, digest, error, checked_at) VALUES (?1, ?2, '', ?3)",
                params![image, digest, now_unix()],
            )?;
            tx.commit()?;
            Ok(before)
        })
    }
}
