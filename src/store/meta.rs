//! The `meta` table: the agent's identity (its id and the key of its env digests) and small
//! values other parts keep there (the HTTP address, …).
//!
//! Invariant: a database without an agent id has lost its identity and is `Error::Unusable`;
//! no call here ever makes a new id for it.

use rusqlite::{OptionalExtension, params};

use super::{Error, Result, Store, unusable_or};
use crate::model::HostSelection;

/// `meta` key of the host selection the agent syncs with (JSON of `HostSelection`): which
/// host of a fleet it is, for `status` and `plan`.
pub(crate) const META_HOST_SELECTION: &str = "host_selection";
/// `meta` key of what runs the agent's workloads (`docker` or `swarm`, `--runtime`).
pub(crate) const META_RUNTIME: &str = "runtime";

impl Store {
    /// This data dir's agent id, made with the database (`open`): the `voodu.agent` label on
    /// every container this agent creates, so two agents (or a test and an agent) on one
    /// engine never touch each other's containers. A database without one has lost its
    /// identity: `Error::Unusable`, never a new id.
    pub fn agent_id(&self) -> Result<String> {
        let found = self.with(|connection| {
            Ok(connection
                .query_row("SELECT value FROM meta WHERE key = 'agent_id'", [], |row| {
                    row.get::<_, String>(0)
                })
                .optional())
        })?;
        match found {
            Ok(Some(id)) if !id.is_empty() => Ok(id),
            Ok(_) => Err(Error::Unusable {
                path: self.shared.path.clone(),
                problem: "it holds no agent id".to_owned(),
            }),
            Err(source) => Err(unusable_or(&self.shared.path, source)),
        }
    }

    /// Takes over another identity (`voodu-agent --adopt`): the agent id, and the digest key
    /// when it is known, so the adopted containers count as this agent's own and, with the
    /// key, as current.
    pub(crate) fn adopt_identity(&self, agent_id: &str, env_key: Option<&str>) -> Result<()> {
        self.with(|connection| {
            let tx = connection.transaction()?;
            let upsert = "INSERT INTO meta (key, value) VALUES (?1, ?2)
                          ON CONFLICT (key) DO UPDATE SET value = excluded.value";
            tx.execute(upsert, params!["agent_id", agent_id])?;
            if let Some(env_key) = env_key {
                tx.execute(upsert, params!["env_key", env_key])?;
            }
            tx.commit()?;
            Ok(())
        })
    }

    /// The key of this agent's keyed digests (`voodu.env_digest`), made once per data dir.
    pub(crate) fn env_key(&self) -> Result<String> {
        self.with(|connection| {
            connection.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('env_key', ?1)",
                params![crate::model::random_hex(32)],
            )?;
            Ok(
                connection.query_row(
                    "SELECT value FROM meta WHERE key = 'env_key'",
                    [],
                    |row| row.get(0),
                )?,
            )
        })
    }

    /// The agent id without creating one (for read-only stores). Empty when never set.
    pub fn agent_id_read_only(&self) -> Result<String> {
        self.with(|connection| {
            Ok(connection
                .query_row("SELECT value FROM meta WHERE key = 'agent_id'", [], |row| {
                    row.get::<_, String>(0)
                })
                .optional()?
                .unwrap_or_default())
        })
    }

    /// A value of the `meta` table (the agent's id, its HTTP address, …).
    pub fn meta(&self, key: &str) -> Result<Option<String>> {
        self.with(|connection| {
            Ok(connection
                .query_row(
                    "SELECT value FROM meta WHERE key = ?1",
                    params![key],
                    |row| row.get(0),
                )
                .optional()?)
        })
    }

    /// Sets (or, with `None`, removes) a value of the `meta` table.
    pub fn set_meta(&self, key: &str, value: Option<&str>) -> Result<()> {
        self.with(|connection| {
            match value {
                Some(value) => connection.execute(
                    "INSERT INTO meta (key, value) VALUES (?1, ?2)
                     ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    params![key, value],
                )?,
                None => connection.execute("DELETE FROM meta WHERE key = ?1", params![key])?,
            };
            Ok(())
        })
    }

    /// The host selection the agent last synced with; `None` before its first start (or
    /// from an older agent). An unreadable value is `None` too: it is only ever shown.
    pub fn host_selection(&self) -> Result<Option<HostSelection>> {
        Ok(self
            .meta(META_HOST_SELECTION)?
            .and_then(|json| serde_json::from_str(&json).ok()))
    }
}
