//! The reconcile stage's error type.
//!
//! Invariant: each variant keeps the input that failed (the runtime's or the environment's
//! error, the image, the init container), so the error policy classifies by type
//! (`is_transient`, `reason`) and never by message text.

use std::time::Duration;

use crate::model::ResourceKey;
use crate::store::FailureReason;

use crate::reconcile::handlers::env::EnvError;

/// A reconcile of one resource failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] crate::store::Error),
    #[error("{key}: {source}")]
    Runtime {
        key: ResourceKey,
        #[source]
        source: crate::runtime::Error,
    },
    /// Creating a container said its image is not on the host (and the engine cannot pull it).
    #[error("{key}: {source}; build or load it on this host")]
    ImageMissing {
        key: ResourceKey,
        #[source]
        source: crate::runtime::Error,
    },
    /// The image is missing and pulling it failed (`source`: the runtime's `ImageMissing`,
    /// which names the image).
    #[error("{key}: {}", pull_failure(.source))]
    PullFailed {
        key: ResourceKey,
        #[source]
        source: crate::runtime::Error,
    },
    /// A registry's credential helper gave no credentials.
    #[error("{key}: credential helper {program} for {url}: {problem}")]
    Credentials {
        key: ResourceKey,
        program: String,
        url: String,
        #[source]
        problem: Box<HelperError>,
    },
    /// The engine refused to start a container (a spec it cannot run, ulimits it will not
    /// grant): permanent.
    #[error("{key}: cannot start {name}: {}", start_message(.source))]
    Start {
        key: ResourceKey,
        name: String,
        #[source]
        source: Box<crate::runtime::Error>,
    },
    /// The containers' environment cannot be built.
    #[error("{key}: {source}")]
    Env {
        key: ResourceKey,
        #[source]
        source: EnvError,
    },
    /// An init container failed on every attempt; `exit_code` is `None` when the last one
    /// timed out after `timeout`.
    #[error("{key}: init container {init:?} failed after {attempts} attempt(s): {}", init_outcome(*.exit_code, *.timeout))]
    Init {
        key: ResourceKey,
        init: String,
        attempts: i64,
        exit_code: Option<i64>,
        timeout: Duration,
    },
    /// An asset's files cannot be written on the host.
    #[error("{key}: cannot write the asset's files: {source}")]
    Files {
        key: ResourceKey,
        #[source]
        source: crate::assets::Error,
    },
    /// An image of a repository that requires a signature (`--require-signature`) has none
    /// this host trusts for its digest: the release fails before any container is touched.
    #[error("{key}: image {image} is not run: {why}")]
    Unverified {
        key: ResourceKey,
        image: String,
        why: crate::assets::cosign::Unverified,
    },
    /// Retrying cannot help until desired state changes; `reason` says what failed.
    #[error("{key}: {message}")]
    Permanent {
        key: ResourceKey,
        reason: FailureReason,
        message: String,
    },
    /// A blocking store task could not complete (the runtime is shutting down).
    #[error("background task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// The agent is shutting down while the handler waited.
    #[error("{key}: stopped while {waiting_for}")]
    Stopped {
        key: ResourceKey,
        waiting_for: String,
    },
}

/// Why a registry's credential helper gave no credentials.
#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    #[error("cannot run it ({0}); install it on the host")]
    NotRunnable(#[source] std::io::Error),
    #[error("{0}")]
    Io(#[source] std::io::Error),
    #[error("no answer within {}s", .0.as_secs())]
    Timeout(Duration),
    #[error("exited with {0}")]
    Exited(std::process::ExitStatus),
    /// Its output is not the JSON credential helpers answer (the output itself is never kept:
    /// it may hold the secret).
    #[error("its answer is not {{\"Username\", \"Secret\"}} JSON")]
    BadAnswer,
}

fn pull_failure(source: &crate::runtime::Error) -> String {
    match source {
        crate::runtime::Error::ImageMissing { image, message } => format!(
            "image {image} is not on this host and pulling it failed ({message}); load or build it on the host, or declare a `registry` for {}",
            crate::model::registry_host(image)
        ),
        other => format!("pulling an image failed: {other}"),
    }
}

fn start_message(source: &crate::runtime::Error) -> String {
    match source {
        crate::runtime::Error::Invalid { message }
        | crate::runtime::Error::Unavailable { message }
            if refused_ulimits(source) =>
        {
            format!(
                "the engine may not grant its ulimits (voodu's defaults are nofile=65536:65536 and nproc=4096:4096; raise dockerd's LimitNOFILE / LimitNPROC, or set lower `ulimits` in the manifest): {message}"
            )
        }
        other => other.to_string(),
    }
}

/// True when the engine failed a start because it may not set the container's rlimits.
pub(crate) fn refused_ulimits(source: &crate::runtime::Error) -> bool {
    match source {
        crate::runtime::Error::Invalid { message }
        | crate::runtime::Error::Unavailable { message } => message.contains("setting rlimit"),
        _ => false,
    }
}

fn init_outcome(exit_code: Option<i64>, timeout: Duration) -> String {
    match exit_code {
        Some(code) => format!("exit code {code}"),
        None => format!("timed out after {}s", timeout.as_secs()),
    }
}

impl Error {
    /// The error of an engine call made for `key`, for `map_err`.
    pub(crate) fn runtime(key: &ResourceKey) -> impl Fn(crate::runtime::Error) -> Error + '_ {
        move |source| Error::Runtime {
            key: key.clone(),
            source,
        }
    }

    /// True when the retry schedule applies.
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            Error::Store(_) | Error::Task(_) | Error::Init { .. } | Error::Stopped { .. } => true,
            Error::Files { .. } => true,
            // A registry that could not be asked is asked again; a refusal stands.
            Error::Unverified { why, .. } => {
                matches!(why, crate::assets::cosign::Unverified::Registry(_))
            }
            Error::Runtime { source, .. } => source.is_transient(),
            Error::Env { source, .. } => matches!(source, EnvError::Unresolved(_)),
            Error::ImageMissing { .. }
            | Error::PullFailed { .. }
            | Error::Credentials { .. }
            | Error::Start { .. }
            | Error::Permanent { .. } => false,
        }
    }

    /// Why the resource failed, by cause: what its status records.
    pub(crate) fn reason(&self) -> FailureReason {
        match self {
            Error::Store(_) => FailureReason::Store,
            Error::Runtime { source, .. } => match source {
                crate::runtime::Error::ImageMissing { .. } => FailureReason::ImageMissing,
                other if other.is_transient() => FailureReason::EngineUnavailable,
                _ => FailureReason::EngineRefused,
            },
            Error::ImageMissing { .. } => FailureReason::ImageMissing,
            Error::PullFailed { .. } => FailureReason::PullFailed,
            Error::Credentials { .. } => FailureReason::Credentials,
            Error::Start { .. } => FailureReason::EngineRefused,
            Error::Env { .. } => FailureReason::Environment,
            Error::Init { .. } => FailureReason::Init,
            Error::Files { .. } => FailureReason::Files,
            Error::Permanent { reason, .. } => *reason,
            Error::Unverified { .. } => FailureReason::Unverified,
            Error::Task(_) | Error::Stopped { .. } => FailureReason::Interrupted,
        }
    }
}

/// The reconcile stage's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Kind;
    use crate::runtime::Error as RuntimeError;

    /// Each typed variant prints what the `String` variants it replaced printed, and is
    /// classified by its cause.
    #[test]
    fn typed_errors_keep_their_messages_and_classify_by_cause() {
        let key = || ResourceKey::new(Kind::Deployment, "s", "web");
        let missing = || RuntimeError::ImageMissing {
            image: "app:1".into(),
            message: "no such image".into(),
        };
        let cases = [
            (
                Error::PullFailed {
                    key: key(),
                    source: RuntimeError::ImageMissing {
                        image: "ghcr.io/a/app:1".into(),
                        message: "no such image".into(),
                    },
                },
                "deployment/s/web: image ghcr.io/a/app:1 is not on this host and pulling it failed (no such image); load or build it on the host, or declare a `registry` for ghcr.io",
                false,
                FailureReason::PullFailed,
            ),
            (
                Error::ImageMissing {
                    key: key(),
                    source: missing(),
                },
                "deployment/s/web: image app:1 is not present on this host and cannot be pulled: no such image; build or load it on this host",
                false,
                FailureReason::ImageMissing,
            ),
            (
                Error::Start {
                    key: key(),
                    name: "s-web.1".into(),
                    source: Box::new(RuntimeError::Invalid {
                        message: "setting rlimit: denied".into(),
                    }),
                },
                "deployment/s/web: cannot start s-web.1: the engine may not grant its ulimits (voodu's defaults are nofile=65536:65536 and nproc=4096:4096; raise dockerd's LimitNOFILE / LimitNPROC, or set lower `ulimits` in the manifest): setting rlimit: denied",
                false,
                FailureReason::EngineRefused,
            ),
            (
                Error::Start {
                    key: key(),
                    name: "s-web.1".into(),
                    source: Box::new(RuntimeError::NotFound {
                        what: "network n".into(),
                    }),
                },
                "deployment/s/web: cannot start s-web.1: network n not found",
                false,
                FailureReason::EngineRefused,
            ),
            (
                Error::Env {
                    key: key(),
                    source: EnvError::NoBuckets(vec!["s/db".into()]),
                },
                "deployment/s/web: env_from [s/db]: none of these config buckets exists; set them with `voodu-agent config set SCOPE/NAME KEY=VALUE`",
                false,
                FailureReason::Environment,
            ),
            (
                Error::Env {
                    key: key(),
                    source: EnvError::Unresolved(vec!["${ref.x}".into()]),
                },
                "deployment/s/web: unresolved reference(s): ${ref.x} (the ingress has no status yet)",
                true,
                FailureReason::Environment,
            ),
            (
                Error::Init {
                    key: key(),
                    init: "migrate".into(),
                    attempts: 2,
                    exit_code: None,
                    timeout: Duration::from_secs(30),
                },
                "deployment/s/web: init container \"migrate\" failed after 2 attempt(s): timed out after 30s",
                true,
                FailureReason::Init,
            ),
            (
                Error::Runtime {
                    key: key(),
                    source: RuntimeError::Unavailable {
                        message: "down".into(),
                    },
                },
                "deployment/s/web: container engine unavailable: down",
                true,
                FailureReason::EngineUnavailable,
            ),
        ];
        for (error, message, transient, reason) in cases {
            assert_eq!(error.to_string(), message);
            assert_eq!(error.is_transient(), transient, "{message}");
            assert_eq!(error.reason(), reason, "{message}");
        }
    }
}
