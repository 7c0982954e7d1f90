//! Who this data dir is on the engine, and the check that it never silently becomes someone
//! else.
//!
//! The agent id lives in state.db; every container and volume the agent creates carries it
//! (`voodu.agent`) and the data dir's canonical path (`voodu.data_dir`). A copy of the id and
//! the env digest key sits beside state.db in `<data-dir>/identity`. At start, objects on the
//! engine that carry this data dir's path but another agent id, or an identity file naming
//! another id, mean state.db was lost or replaced: the agent refuses to start, saying what it
//! found, unless the operator passes `--adopt` (take that identity over) or removes them.
//!
//! Invariant: the agent never starts with a new identity while anything of an old identity of
//! its data dir is known to remain; other agents' objects on a shared engine never count.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::runtime::{Runtime, labels};

/// The identity file's name inside the data dir.
pub(crate) const IDENTITY_FILE: &str = "identity";

/// The copy of state.db's identity kept beside it (`<data-dir>/identity`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IdentityFile {
    pub(crate) agent_id: String,
    /// The key of the `voodu.env_digest` labels: with it, adopted containers stay current.
    pub(crate) env_key: Option<String>,
}

/// This data dir's objects on the engine, by their `voodu.agent` id.
pub(crate) type Found = BTreeMap<String, Counts>;

/// How many objects of one agent id carry this data dir's path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) containers: usize,
    pub(crate) volumes: usize,
}

/// What the start-up check knows.
#[derive(Debug)]
pub(crate) struct Situation<'a> {
    pub(crate) data_dir: &'a Path,
    /// state.db's agent id; `None` when there is no state.db.
    pub(crate) own: Option<&'a str>,
    pub(crate) file: Option<&'a IdentityFile>,
    pub(crate) found: &'a Found,
    /// `--adopt`.
    pub(crate) adopt: bool,
}

/// What the agent does about its identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Start with state.db's identity (a new one when there is no state.db).
    Proceed,
    /// Take over `agent_id` (and its digest key, when known).
    Adopt {
        agent_id: String,
        env_key: Option<String>,
    },
}

/// The data dir's canonical path: the `voodu.data_dir` label value. Creates the dir.
pub(crate) fn marker(data_dir: &Path) -> std::io::Result<String> {
    std::fs::create_dir_all(data_dir)?;
    Ok(std::fs::canonicalize(data_dir)?.display().to_string())
}

/// Containers and volumes labelled with this data dir's `marker`, counted by agent id.
pub(crate) async fn scan<R: Runtime>(runtime: &R, marker: &str) -> crate::runtime::Result<Found> {
    let filter = [(labels::DATA_DIR, marker)];
    let mut found = Found::new();
    for container in runtime.list(&filter).await? {
        let id = container
            .label(labels::AGENT)
            .unwrap_or_default()
            .to_owned();
        found.entry(id).or_default().containers += 1;
    }
    for volume in runtime.list_volumes(&filter).await? {
        let id = volume
            .labels
            .get(labels::AGENT)
            .cloned()
            .unwrap_or_default();
        found.entry(id).or_default().volumes += 1;
    }
    Ok(found)
}

/// The refusal to start on a data dir that lost its state: what was found, and the commands
/// that take the objects over or remove them (printed whole; the agent exits 1).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct LostState(String);

/// Decides from what is known; `Err` is the refusal to print (the agent exits 1).
pub(crate) fn decide(situation: &Situation<'_>) -> Result<Decision, LostState> {
    let own = situation.own;
    // Every other identity this data dir is known to have had.
    let mut foreign: BTreeMap<&str, Counts> = crate::model::map_of(
        situation
            .found
            .iter()
            .filter(|(id, _)| Some(id.as_str()) != own && !id.is_empty())
            .map(|(id, counts)| (id.as_str(), *counts)),
    );
    if let Some(file) = situation.file
        && Some(file.agent_id.as_str()) != own
    {
        foreign.entry(file.agent_id.as_str()).or_default();
    }
    if foreign.is_empty() {
        return Ok(Decision::Proceed);
    }
    let dir = situation.data_dir.display();
    let why = match (own, situation.file) {
        (None, _) => format!("{dir}/state.db is missing"),
        (Some(own), Some(file)) if file.agent_id != own => format!(
            "{dir}/state.db holds agent id {own}, but {dir}/{IDENTITY_FILE} names agent {}",
            file.agent_id
        ),
        (Some(own), _) => {
            format!("{dir}/state.db holds agent id {own}, not the id of this data dir's objects")
        }
    };
    let mut message = format!("data dir {dir} has lost its state: {why}");
    for (id, counts) in &foreign {
        let _ = write!(
            message,
            "\n  agent {id}: {} on this engine",
            objects(*counts)
        );
        if situation.file.is_some_and(|file| file.agent_id == *id) {
            let _ = write!(message, " (named by {dir}/{IDENTITY_FILE})");
        }
    }
    if situation.adopt {
        let own_objects = own
            .and_then(|own| situation.found.get(own))
            .copied()
            .unwrap_or_default();
        if foreign.len() > 1 {
            let _ = write!(
                message,
                "\n--adopt takes over one identity, and {} are found: remove all but one (commands below)",
                foreign.len()
            );
        } else if own_objects != Counts::default() {
            let _ = write!(
                message,
                "\n--adopt would orphan state.db's own {}: remove them or the others first (commands below)",
                objects(own_objects)
            );
        } else if let Some((id, _)) = foreign.first_key_value() {
            let env_key = situation
                .file
                .filter(|file| file.agent_id == *id)
                .and_then(|file| file.env_key.clone());
            return Ok(Decision::Adopt {
                agent_id: (*id).to_owned(),
                env_key,
            });
        }
    } else {
        let _ = write!(
            message,
            "\nto take them over, start again with --adopt: the agent becomes that agent and converges on the repo, keeping its containers (no duplicates)"
        );
    }
    let _ = write!(message, "\nto start fresh instead, remove them first:");
    for (id, counts) in &foreign {
        if counts.containers > 0 {
            let _ = write!(
                message,
                "\n  docker rm -f $(docker ps -aq --filter label=voodu.agent={id})"
            );
        }
        if counts.volumes > 0 {
            let _ = write!(
                message,
                "\n  docker volume rm $(docker volume ls -q --filter label=voodu.agent={id})   # deletes statefulset data"
            );
        }
    }
    if situation
        .file
        .is_some_and(|file| Some(file.agent_id.as_str()) != own)
    {
        let _ = write!(message, "\n  rm {dir}/{IDENTITY_FILE}");
    }
    Err(LostState(message))
}

fn objects(counts: Counts) -> String {
    let plural = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
    format!(
        "{} and {}",
        plural(counts.containers, "container"),
        plural(counts.volumes, "volume")
    )
}

/// Reads `<data-dir>/identity`; `None` when there is none.
pub(crate) fn read_file(data_dir: &Path) -> std::io::Result<Option<IdentityFile>> {
    let text = match std::fs::read_to_string(data_dir.join(IDENTITY_FILE)) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    let value = |key: &str| {
        text.lines()
            .filter_map(|line| line.split_once('='))
            .find(|(found, _)| found.trim() == key)
            .map(|(_, value)| value.trim().to_owned())
            .filter(|value| !value.is_empty())
    };
    Ok(value("agent_id").map(|agent_id| IdentityFile {
        agent_id,
        env_key: value("env_key"),
    }))
}

/// Writes `<data-dir>/identity` (mode 0600, atomically) unless it already says `identity`.
pub(crate) fn write_file(data_dir: &Path, identity: &IdentityFile) -> std::io::Result<()> {
    if read_file(data_dir).ok().flatten().as_ref() == Some(identity) {
        return Ok(());
    }
    let mut text = format!(
        "# voodu-agent: the identity of this data dir, a copy of state.db's (README: \"Identity and the data dir\")\nagent_id={}\n",
        identity.agent_id
    );
    if let Some(env_key) = &identity.env_key {
        let _ = writeln!(text, "env_key={env_key}");
    }
    let temporary: PathBuf = data_dir.join(format!(".{IDENTITY_FILE}.new"));
    let mut file = {
        use std::os::unix::fs::OpenOptionsExt as _;
        std::fs::File::options()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&temporary)?
    };
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&temporary, data_dir.join(IDENTITY_FILE))
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    fn found(entries: &[(&str, usize, usize)]) -> Found {
        entries
            .iter()
            .map(|(id, containers, volumes)| {
                (
                    (*id).to_owned(),
                    Counts {
                        containers: *containers,
                        volumes: *volumes,
                    },
                )
            })
            .collect()
    }

    /// One case: state.db's id, the identity file's id (its key is `k-<id>`), the objects
    /// found, `--adopt`; the decision, or the fragments the refusal must contain.
    struct Case {
        name: &'static str,
        own: Option<&'static str>,
        file: Option<&'static str>,
        found: &'static [(&'static str, usize, usize)],
        adopt: bool,
        expected: Result<Decision, &'static [&'static str]>,
    }

    fn check(case: &Case) -> TestResult {
        let file = case.file.map(|id| IdentityFile {
            agent_id: id.to_owned(),
            env_key: Some(format!("k-{id}")),
        });
        let found = found(case.found);
        let situation = Situation {
            data_dir: Path::new("/d"),
            own: case.own,
            file: file.as_ref(),
            found: &found,
            adopt: case.adopt,
        };
        let decided = decide(&situation);
        match (&decided, &case.expected) {
            (Ok(decision), Ok(expected)) if decision == expected => Ok(()),
            (Err(refusal), Err(fragments)) => {
                let message = refusal.to_string();
                for fragment in *fragments {
                    if !message.contains(fragment) {
                        return Err(format!("{}: {message:?} lacks {fragment:?}", case.name).into());
                    }
                }
                Ok(())
            }
            _ => Err(format!("{}: got {decided:?}", case.name).into()),
        }
    }

    #[test]
    fn a_lost_identity_is_refused_adopted_on_request_and_others_are_ignored() -> TestResult {
        let adopt = |id: &str, key: Option<&str>| Decision::Adopt {
            agent_id: id.to_owned(),
            env_key: key.map(str::to_owned),
        };
        let cases = [
            Case {
                name: "first start",
                own: None,
                file: None,
                found: &[],
                adopt: false,
                expected: Ok(Decision::Proceed),
            },
            Case {
                name: "a restart",
                own: Some("a"),
                file: Some("a"),
                found: &[("a", 3, 1)],
                adopt: false,
                expected: Ok(Decision::Proceed),
            },
            Case {
                name: "--adopt left on a healthy data dir",
                own: Some("a"),
                file: Some("a"),
                found: &[("a", 2, 0)],
                adopt: true,
                expected: Ok(Decision::Proceed),
            },
            Case {
                name: "state.db deleted, containers and identity file left",
                own: None,
                file: Some("a"),
                found: &[("a", 2, 1)],
                adopt: false,
                expected: Err(&[
                    "data dir /d has lost its state: /d/state.db is missing",
                    "agent a: 2 containers and 1 volume on this engine (named by /d/identity)",
                    "start again with --adopt",
                    "docker rm -f $(docker ps -aq --filter label=voodu.agent=a)",
                    "docker volume rm $(docker volume ls -q --filter label=voodu.agent=a)",
                    "rm /d/identity",
                ]),
            },
            Case {
                name: "the whole data dir wiped: only the containers tell",
                own: None,
                file: None,
                found: &[("a", 1, 0)],
                adopt: false,
                expected: Err(&["agent a: 1 container and 0 volumes", "--adopt"]),
            },
            Case {
                name: "state.db replaced by a new one (config set after deleting it)",
                own: Some("b"),
                file: Some("a"),
                found: &[("a", 1, 0)],
                adopt: false,
                expected: Err(&["state.db holds agent id b, but /d/identity names agent a"]),
            },
            Case {
                name: "identity file only: the containers were removed, the state lost",
                own: None,
                file: Some("a"),
                found: &[],
                adopt: false,
                expected: Err(&["agent a: 0 containers and 0 volumes", "rm /d/identity"]),
            },
            Case {
                name: "adopt with the identity file: id and digest key",
                own: None,
                file: Some("a"),
                found: &[("a", 2, 0)],
                adopt: true,
                expected: Ok(adopt("a", Some("k-a"))),
            },
            Case {
                name: "adopt from the containers alone: no key",
                own: Some("b"),
                file: None,
                found: &[("a", 2, 0)],
                adopt: true,
                expected: Ok(adopt("a", None)),
            },
            Case {
                name: "adopt between two old identities is refused",
                own: None,
                file: None,
                found: &[("a", 1, 0), ("c", 1, 0)],
                adopt: true,
                expected: Err(&["takes over one identity, and 2 are found", "voodu.agent=c"]),
            },
            Case {
                name: "adopt that would orphan state.db's own containers is refused",
                own: Some("b"),
                file: Some("b"),
                found: &[("a", 1, 0), ("b", 1, 0)],
                adopt: true,
                expected: Err(&["would orphan state.db's own 1 container"]),
            },
        ];
        for case in &cases {
            check(case)?;
        }
        Ok(())
    }

    #[test]
    fn the_identity_file_round_trips_privately() -> TestResult {
        let dir = tempfile::tempdir()?;
        assert_eq!(read_file(dir.path())?, None);
        let identity = IdentityFile {
            agent_id: "0123456789abcdef".to_owned(),
            env_key: Some("k".to_owned()),
        };
        write_file(dir.path(), &identity)?;
        assert_eq!(read_file(dir.path())?, Some(identity));
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(dir.path().join(IDENTITY_FILE))?.permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        Ok(())
    }
}
