//! Images before a container is created, per voodu's rule (spec §6.5): an image present on
//! the host is used as it is (never re-pulled); a missing one is pulled, with the credentials
//! of the `registry` resource whose `url` is the image's registry host (a token, or a
//! `docker-credential-<helper>` program).
//!
//! Invariants: credentials are never logged or put in an error; a pull the registry refuses is
//! a permanent error for the resource (fixed by a commit: a registry block, or another
//! image), an unreachable engine or registry a transient one.

use std::time::Duration;

use crate::manifest::spec::{RegistrySpec, Spec};
use crate::model::registry_host;
use crate::model::{Kind, ResourceKey};
use crate::runtime::{RegistryAuth, Runtime};

use crate::reconcile::{
    context::Ctx, context::blocking, error::Error, error::HelperError, error::Result,
};

/// How long a credential helper may take.
const HELPER_TIMEOUT: Duration = Duration::from_secs(20);

fn same_registry(url: &str, host: &str) -> bool {
    let url = url
        .trim_start_matches("https://")
        .trim_start_matches("http://")
        .trim_end_matches('/');
    let hub = |name: &str| {
        matches!(
            name,
            "docker.io" | "index.docker.io" | "registry-1.docker.io"
        )
    };
    url == host || (hub(url) && hub(host))
}

/// Makes sure `image` is on the host, pulling it when missing.
pub(crate) async fn ensure_image<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    image: &str,
) -> Result<()> {
    let runtime_error = |source| Error::Runtime {
        key: key.clone(),
        source,
    };
    if ctx
        .runtime
        .image_present(image)
        .await
        .map_err(runtime_error)?
    {
        return Ok(());
    }
    let (registry, auth) = registry_of(ctx, key, image).await?;
    tracing::info!(%key, image, registry = registry.as_ref().map(|spec| spec.url.as_str()), "pulling a missing image");
    match ctx.runtime.pull(image, auth.as_ref()).await {
        Ok(_) => {
            // For the resource's timeline and the sinks: a pull is rare (only a missing image).
            let (resource, message, data) = (
                key.to_string(),
                format!("pulled the missing image {image}"),
                serde_json::json!({ "image": image }),
            );
            let recorded = blocking(&ctx.store, move |store| {
                store.record_event("image.pulled", &resource, &message, data)
            })
            .await;
            if let Err(error) = recorded {
                tracing::warn!(%key, %error, "cannot record an image pull event");
            }
            Ok(())
        }
        Err(source @ crate::runtime::Error::ImageMissing { .. }) => Err(Error::PullFailed {
            key: key.clone(),
            source,
        }),
        Err(other) => Err(runtime_error(other)),
    }
}

/// The `registry` whose `url` is `image`'s registry host, and its credentials.
async fn registry_of<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    image: &str,
) -> Result<(Option<RegistrySpec>, Option<RegistryAuth>)> {
    let host = registry_host(image).to_owned();
    let registry = blocking(&ctx.store, move |store| {
        Ok(store
            .desired_of_kind(Kind::Registry)?
            .into_iter()
            .find_map(|desired| match desired.spec {
                Spec::Registry(spec) if same_registry(&spec.url, &host) => Some(spec),
                _ => None,
            }))
    })
    .await?;
    let auth = match &registry {
        Some(spec) => Some(credentials(key, spec).await?),
        None => None,
    };
    Ok((registry, auth))
}

/// The credentials of the `registry` for `image`'s registry host, if one is declared: what
/// a Swarm service is created with, so every node can pull its image.
pub(crate) async fn auth_for<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    image: &str,
) -> Result<Option<RegistryAuth>> {
    Ok(registry_of(ctx, key, image).await?.1)
}

async fn credentials(key: &ResourceKey, spec: &RegistrySpec) -> Result<RegistryAuth> {
    if spec.helper.is_empty() {
        return Ok(RegistryAuth {
            server: spec.url.clone(),
            username: spec.username.clone(),
            password: spec.token.clone(),
        });
    }
    let program = format!("docker-credential-{}", spec.helper);
    let failed = |problem: HelperError| Error::Credentials {
        key: key.clone(),
        program: program.clone(),
        url: spec.url.clone(),
        problem: Box::new(problem),
    };
    let mut child = tokio::process::Command::new(&program)
        .arg("get")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|error| failed(HelperError::NotRunnable(error)))?;
    if let Some(mut stdin) = child.stdin.take() {
        use tokio::io::AsyncWriteExt as _;
        stdin
            .write_all(spec.url.as_bytes())
            .await
            .map_err(|error| failed(HelperError::Io(error)))?;
    }
    let output = tokio::time::timeout(HELPER_TIMEOUT, child.wait_with_output())
        .await
        .map_err(|_| failed(HelperError::Timeout(HELPER_TIMEOUT)))?
        .map_err(|error| failed(HelperError::Io(error)))?;
    if !output.status.success() {
        return Err(failed(HelperError::Exited(output.status)));
    }
    #[derive(serde::Deserialize)]
    struct Answer {
        #[serde(rename = "Username")]
        username: String,
        #[serde(rename = "Secret")]
        secret: String,
    }
    let answer: Answer =
        serde_json::from_slice(&output.stdout).map_err(|_| failed(HelperError::BadAnswer))?;
    Ok(RegistryAuth {
        server: spec.url.clone(),
        username: answer.username,
        password: answer.secret,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_map_to_their_registry_host() {
        for (image, host) in [
            ("ghcr.io/acme/api:1", "ghcr.io"),
            ("localhost:5000/app", "localhost:5000"),
            ("localhost/app", "localhost"),
            ("redis:7", "docker.io"),
            ("library/redis", "docker.io"),
            ("acme/api@sha256:00", "docker.io"),
        ] {
            assert_eq!(registry_host(image), host, "{image}");
        }
        assert!(same_registry("https://ghcr.io/", "ghcr.io"));
        assert!(same_registry("index.docker.io", "docker.io"));
        assert!(!same_registry("ghcr.io", "docker.io"));
    }
}
