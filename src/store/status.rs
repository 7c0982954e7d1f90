//! Per-resource status: what the reconciler last observed and did, read by `status`, the HTTP
//! side and `plan`.
//!
//! Invariant: one row per resource; a handler replaces the whole row, and `detail` holds the
//! kind-specific part as JSON.

use rusqlite::{OptionalExtension, params};

use super::{ResourceStatus, Result, Store, key_from_row};
use crate::model::ResourceKey;

type StatusRow = (
    String,
    String,
    String,
    String,
    String,
    i64,
    i64,
    String,
    Option<i64>,
    i64,
    String,
);

const COLUMNS: &str = "kind, scope, name, phase, message, desired_replicas, running_replicas, spec_hash, release_id, updated_at, detail";

fn status_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<StatusRow> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
        row.get(5)?,
        row.get(6)?,
        row.get(7)?,
        row.get(8)?,
        row.get(9)?,
        row.get(10)?,
    ))
}

fn from_row(row: StatusRow) -> Result<(ResourceKey, ResourceStatus)> {
    let (
        kind,
        scope,
        name,
        phase,
        message,
        desired,
        running,
        spec_hash,
        release_id,
        updated_at,
        detail,
    ) = row;
    Ok((
        key_from_row(&kind, scope, name)?,
        ResourceStatus {
            phase,
            message,
            desired_replicas: usize::try_from(desired).unwrap_or(0),
            running_replicas: usize::try_from(running).unwrap_or(0),
            spec_hash,
            release_id,
            updated_at,
            detail: serde_json::from_str(&detail).unwrap_or(serde_json::Value::Null),
        },
    ))
}

impl Store {
    pub fn put_status(&self, key: &ResourceKey, status: &ResourceStatus) -> Result<()> {
        let detail = if status.detail.is_null() {
            "{}".to_owned()
        } else {
            status.detail.to_string()
        };
        self.with(|connection| {
            connection.execute(
                "INSERT INTO status (kind, scope, name, phase, message, desired_replicas, running_replicas, spec_hash, release_id, updated_at, detail)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
                 ON CONFLICT (kind, scope, name) DO UPDATE SET
                   phase = excluded.phase, message = excluded.message,
                   desired_replicas = excluded.desired_replicas, running_replicas = excluded.running_replicas,
                   spec_hash = excluded.spec_hash, release_id = excluded.release_id,
                   updated_at = excluded.updated_at, detail = excluded.detail",
                params![
                    key.kind.as_str(),
                    key.scope,
                    key.name,
                    status.phase,
                    status.message,
                    i64::try_from(status.desired_replicas).unwrap_or(i64::MAX),
                    i64::try_from(status.running_replicas).unwrap_or(i64::MAX),
                    status.spec_hash,
                    status.release_id,
                    status.updated_at,
                    detail
                ],
            )?;
            Ok(())
        })
    }

    pub fn delete_status(&self, key: &ResourceKey) -> Result<()> {
        self.with(|connection| {
            connection.execute(
                "DELETE FROM status WHERE kind = ?1 AND scope = ?2 AND name = ?3",
                params![key.kind.as_str(), key.scope, key.name],
            )?;
            Ok(())
        })
    }

    pub fn status(&self, key: &ResourceKey) -> Result<Option<ResourceStatus>> {
        self.with(|connection| {
            let row = connection
                .query_row(
                    &format!(
                        "SELECT {COLUMNS} FROM status WHERE kind = ?1 AND scope = ?2 AND name = ?3"
                    ),
                    params![key.kind.as_str(), key.scope, key.name],
                    status_row,
                )
                .optional()?;
            row.map(|row| from_row(row).map(|(_, status)| status))
                .transpose()
        })
    }

    /// Every resource's status, ordered by key.
    pub fn statuses(&self) -> Result<Vec<(ResourceKey, ResourceStatus)>> {
        self.with(|connection| {
            let mut statement = connection.prepare(&format!(
                "SELECT {COLUMNS} FROM status ORDER BY kind, scope, name"
            ))?;
            let rows = statement.query_map([], status_row)?;
            rows.map(|row| from_row(row?)).collect()
        })
    }
}
