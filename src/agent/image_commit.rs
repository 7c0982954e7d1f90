//! Image automation's commit mode, wired: the reconcile stage's `ImageCommitter` implemented
//! with `git::push` (the `git` executable) and `manifest::image_edit` (the byte-exact tag
//! edit), then a sync request so the pushed commit is fetched and deployed like any other.
//!
//! Invariants: git work runs off the async threads, one commit at a time; the edit is redone
//! from the branch tip on every attempt, so a bump never overwrites a human commit (a resource
//! whose image was changed to another repository is a conflict, reported).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use crate::git::push::{PushError, PushOptions, commit_and_push};
use crate::git::trigger::{SyncReason, SyncRequest, SyncRequests};
use crate::manifest::image_edit::{EditError, set_image_tag};
use crate::model::{CommitSha, ResourceKey};
use crate::reconcile::image_scan::{Bump, CommitResult, ImageCommitter, commit_message};

/// Commits bumps to the repository of the source that declares the resources, with `git`.
pub(crate) struct GitCommitter {
    /// Per source name: where its bumps go and how its syncer is asked to fetch them.
    targets: BTreeMap<String, Target>,
    /// One git operation at a time (every working clone).
    busy: Arc<Mutex<()>>,
}

/// Why a bump's edit pass stops (the push reports it as a conflict).
#[derive(Debug, thiserror::Error)]
enum BumpError {
    #[error("{path}: {source}")]
    Edit {
        path: String,
        #[source]
        source: EditError,
    },
    #[error("no manifest declares {} with an `image` any more", .0.join(", "))]
    Missing(Vec<String>),
}

/// Why `GitCommitter` made no commit.
#[derive(Debug, thiserror::Error)]
enum GitCommitError {
    #[error("nothing to commit")]
    NoBumps,
    #[error("no source named {name:?} to commit {key} to")]
    NoSource { name: String, key: ResourceKey },
    #[error("the git task failed: {0}")]
    Task(#[source] tokio::task::JoinError),
    #[error(transparent)]
    Push(#[from] PushError),
}

struct Target {
    options: PushOptions,
    requests: SyncRequests,
}

impl GitCommitter {
    /// A committer for `sources`, each with the channel of its syncer (`requests`, by name).
    pub(crate) fn new(
        config: &super::AgentConfig,
        sources: &[super::SourceConfig],
        requests: &BTreeMap<String, SyncRequests>,
    ) -> GitCommitter {
        let mut targets = BTreeMap::new();
        for source in sources {
            let Some(requests) = requests.get(&source.name) else {
                continue;
            };
            targets.insert(
                source.name.clone(),
                Target {
                    options: PushOptions {
                        url: git_url(&source.options.url),
                        branch: source.options.branch.clone(),
                        push_branch: String::new(),
                        paths: source.options.paths.clone(),
                        work_dir: super::source_dir(&config.data_dir, &source.name)
                            .join("image-updates"),
                        signing_key: config.image_signing_key.clone(),
                        author_name: "voodu-agent".to_owned(),
                        author_email: "voodu-agent@localhost".to_owned(),
                        ssh_command: source.options.ssh_command(),
                        token_file: source.options.token_file.clone(),
                        ca_file: source.options.ca_file.clone(),
                    },
                    requests: requests.clone(),
                },
            );
        }
        GitCommitter {
            targets,
            busy: Arc::new(Mutex::new(())),
        }
    }
}

/// A plain path as `git` takes it (absolute, so the working clone's `-C` does not move it).
fn git_url(url: &str) -> String {
    if url.contains("://") || (url.contains('@') && url.contains(':')) {
        return url.to_owned();
    }
    let path = PathBuf::from(url);
    std::path::absolute(&path)
        .unwrap_or(path)
        .display()
        .to_string()
}

impl ImageCommitter for GitCommitter {
    fn commit(
        &self,
        bumps: Vec<Bump>,
    ) -> Pin<Box<dyn std::future::Future<Output = CommitResult> + Send + '_>> {
        Box::pin(async move {
            let Some(first) = bumps.first() else {
                return Err(GitCommitError::NoBumps.into());
            };
            let Some(target) = self.targets.get(&first.source) else {
                return Err(GitCommitError::NoSource {
                    name: first.source.clone(),
                    key: first.key.clone(),
                }
                .into());
            };
            let mut options = target.options.clone();
            options.push_branch = first.push_branch.clone();
            let busy = Arc::clone(&self.busy);
            let to_branch = options.push_branch.is_empty();
            let result = tokio::task::spawn_blocking(move || {
                let _held = crate::base::lock(&busy);
                bump_in_git(&options, &bumps)
            })
            .await
            .map_err(GitCommitError::Task)?;
            if result.is_ok() && to_branch {
                let _ticket = target.requests.request(SyncRequest {
                    reason: SyncReason::Poll,
                    commit: None,
                    actor: Some("voodu-agent image_update".to_owned()),
                });
            }
            result.map_err(|error| GitCommitError::Push(error).into())
        })
    }
}

/// Applies `bumps` on the branch tip, commits and pushes (see `git::push`).
pub fn bump_in_git(options: &PushOptions, bumps: &[Bump]) -> Result<CommitSha, PushError> {
    let message = commit_message(bumps);
    let found = Mutex::new(vec![false; bumps.len()]);
    let mut edit = |path: &str, text: &str| {
        let mut current = text.to_owned();
        let mut changed = false;
        for (index, bump) in bumps.iter().enumerate() {
            match set_image_tag(
                &current,
                bump.key.kind,
                &bump.key.scope,
                &bump.key.name,
                &bump.repository,
                &bump.to_tag,
            ) {
                Ok(Some(edit)) => {
                    current = edit.text;
                    changed = true;
                    crate::base::lock(&found)[index] = true;
                }
                Ok(None) => {
                    crate::base::lock(&found)[index] = true;
                }
                Err(EditError::NotFound { .. } | EditError::Unparsable) => {}
                Err(source) => {
                    return Err(BumpError::Edit {
                        path: path.to_owned(),
                        source,
                    });
                }
            }
        }
        Ok(changed.then_some(current))
    };
    let mut finish = || {
        let mut found = crate::base::lock(&found);
        let missing: Vec<String> = bumps
            .iter()
            .zip(found.iter())
            .filter(|(_, found)| !**found)
            .map(|(bump, _)| bump.key.to_string())
            .collect();
        found.iter_mut().for_each(|found| *found = false);
        if missing.is_empty() {
            Ok(())
        } else {
            Err(BumpError::Missing(missing))
        }
    };
    commit_and_push(options, &message, &mut edit, &mut finish)
}
