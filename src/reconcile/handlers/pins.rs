//! A release is exact bytes: each image a release names is resolved once, when the release
//! starts, to what it runs as, and every container of the release is created from that, never
//! from the tag (first deploy, rollout, scale-up, drift re-creation, restart repair, pods,
//! init containers, release hooks; job and cronjob runs resolve once per spec).
//!
//! Resolution, per image:
//! - already a digest (`name@sha256:…`, `name:tag@sha256:…`): itself;
//! - a local-only image (imported or built on this host: present, no registry digest): its
//!   image id (`sha256:…`), which a rebuild under the same tag does not change;
//! - anything else: pulled by its tag, with the matching `registry` block's credentials, and
//!   pinned to the manifest digest the registry answered (`name@sha256:…`); when the registry
//!   cannot be reached, the digest of the copy the host has (said in the log).
//!
//! A rollback, and a commit whose spec equals an earlier release's (a `git revert`), take over
//! that release's resolution in the store (`store/releases.rs`): back to what ran. A spec
//! change or `voodu-agent redeploy` resolves anew.
//!
//! Invariants: resolution never runs for a legacy release (recorded before digests were: it
//! runs its tag until the next rollout); once recorded, a release's resolution never changes;
//! `Pins::label` names the whole resolution, so a replica of another resolution of the same
//! spec (a redeploy, a rollback across a moved tag) is outdated.

use std::collections::BTreeMap;
use std::sync::Arc;

use sha2::{Digest as _, Sha256};

use crate::assets::cosign::Unverified;
use crate::model::ResourceKey;
use crate::model::image_policy::{repository_of, split_digest};
use crate::reconcile::handlers::images::auth_for;
use crate::reconcile::{context::Ctx, context::blocking, error::Error, error::Result};
use crate::runtime::Runtime;
use crate::store::Release;

/// What each image of a release (or a job's spec) runs as: the image as the spec names it →
/// the reference a container is created from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Pins {
    images: BTreeMap<String, String>,
    /// `label()`, made once.
    label: String,
}

impl Pins {
    pub(crate) fn new(images: BTreeMap<String, String>) -> Pins {
        let mut hasher = Sha256::new();
        for (image, pinned) in &images {
            hasher.update(image.as_bytes());
            hasher.update(b"=");
            hasher.update(pinned.as_bytes());
            hasher.update(b"\n");
        }
        let digest = hasher.finalize();
        let label = digest[..8]
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        Pins { images, label }
    }

    /// What `image` runs as (itself when it is not pinned).
    pub(crate) fn pin<'a>(&'a self, image: &'a str) -> &'a str {
        self.images.get(image).map_or(image, String::as_str)
    }

    /// The `voodu.images` label of the containers made under these pins: a short digest of
    /// every image and what it runs as.
    pub(crate) fn label(&self) -> &str {
        &self.label
    }
}

/// The pins of `release` for `images`: recorded ones, or resolved now and recorded (the
/// release's first pass). `None` for a legacy release: its containers run the tag.
pub(crate) async fn of_release<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    release: &Release,
    images: &[String],
) -> Result<Option<Arc<Pins>>> {
    if release.legacy {
        return Ok(None);
    }
    if let Some(recorded) = &release.images
        && images.iter().all(|image| recorded.contains_key(image))
    {
        // Taken over from another release (a rollback, a revert), or resolved earlier: its
        // signatures are checked all the same (remembered once verified).
        verify(ctx, key, recorded).await?;
        return Ok(Some(Arc::new(Pins::new(recorded.clone()))));
    }
    let mut resolved = release.images.clone().unwrap_or_default();
    for image in images {
        if !resolved.contains_key(image) {
            let pinned = resolve(ctx, key, image).await?;
            resolved.insert(image.clone(), pinned);
        }
    }
    verify(ctx, key, &resolved).await?;
    let id = release.id;
    let recorded = blocking(&ctx.store, move |store| {
        store.record_release_images(id, &resolved)
    })
    .await?;
    tracing::info!(%key, release = id, images = ?recorded, "release images resolved");
    Ok(Some(Arc::new(Pins::new(recorded))))
}

/// Checks the signature of every pinned digest of a repository that requires one
/// (`--require-signature`): remembered once verified under the same keys, else asked of the
/// registry (the signature manifest `sha256-<hex>.sig`, its payloads). A refusal is counted,
/// told (`image.unverified`) and fails the release before any container is touched.
async fn verify<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    images: &BTreeMap<String, String>,
) -> Result<()> {
    let signatures = Arc::clone(&ctx.options.signatures);
    if signatures.is_empty() {
        return Ok(());
    }
    for (image, pinned) in images {
        let repository = repository_of(image);
        let Some(trusted) = signatures.for_repository(repository) else {
            continue;
        };
        let refuse = |why: Unverified| Error::Unverified {
            key: key.clone(),
            image: image.clone(),
            why,
        };
        let Some((name, digest)) = split_digest(pinned) else {
            return Err(refuse(Unverified::BadPayload(
                "a local-only image (no registry digest) cannot carry a signature".to_owned(),
            )));
        };
        // Releases resolving this digest at once: the first asks, the others find it remembered.
        let _held = signatures.one_at_a_time(digest).await;
        let (digest_owned, keys) = (digest.to_owned(), trusted.fingerprint.clone());
        if blocking(&ctx.store, move |store| {
            store.is_verified(&digest_owned, &keys)
        })
        .await?
        {
            continue;
        }
        let client = crate::assets::registry::client(&ctx.options.registry_access)
            .map_err(|message| refuse(Unverified::Registry(message.to_string())))?;
        let credentials =
            auth_for(ctx, key, image)
                .await?
                .map(|auth| crate::assets::registry::Credentials {
                    username: auth.username,
                    secret: auth.password,
                });
        match crate::assets::cosign::verify(
            &client,
            name,
            digest,
            credentials.as_ref(),
            &trusted.keys,
        )
        .await
        {
            Ok(()) => {
                let (digest_owned, keys) = (digest.to_owned(), trusted.fingerprint.clone());
                blocking(&ctx.store, move |store| {
                    store.record_verified(&digest_owned, &keys)
                })
                .await?;
                tracing::info!(%key, image = %pinned, "signature verified");
            }
            Err(why) => {
                ctx.metrics.record_image_refusal(why.reason());
                let (resource, message, data) = (
                    key.to_string(),
                    format!("{pinned}: {why}"),
                    serde_json::json!({ "image": image, "digest": digest, "reason": why.reason() }),
                );
                if !matches!(why, Unverified::Registry(_)) {
                    blocking(&ctx.store, move |store| {
                        store.record_event("image.unverified", &resource, &message, data)
                    })
                    .await?;
                }
                return Err(refuse(why));
            }
        }
    }
    Ok(())
}

/// The pins of every run of a job's (or cronjob's) spec `spec_hash`: the first run's
/// resolution, recorded, or resolved now and recorded.
pub(crate) async fn of_spec<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    spec_hash: &str,
    images: &[String],
) -> Result<Option<Arc<Pins>>> {
    let (owner, hash) = (key.clone(), spec_hash.to_owned());
    let recorded = blocking(&ctx.store, move |store| store.run_images(&owner, &hash)).await?;
    if let Some(recorded) = &recorded
        && images.iter().all(|image| recorded.contains_key(image))
    {
        return Ok(Some(Arc::new(Pins::new(recorded.clone()))));
    }
    let mut resolved = recorded.unwrap_or_default();
    for image in images {
        if !resolved.contains_key(image) {
            let pinned = resolve(ctx, key, image).await?;
            resolved.insert(image.clone(), pinned);
        }
    }
    verify(ctx, key, &resolved).await?;
    let (owner, hash) = (key.clone(), spec_hash.to_owned());
    let recorded = blocking(&ctx.store, move |store| {
        store.record_run_images(&owner, &hash, &resolved)
    })
    .await?;
    tracing::info!(%key, spec_hash, images = ?recorded, "run images resolved");
    Ok(Some(Arc::new(Pins::new(recorded))))
}

/// What `image` runs as, resolved now (see the module docs).
pub(crate) async fn resolve<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    image: &str,
) -> Result<String> {
    if let Some((name, digest)) = split_digest(image) {
        ctx.metrics.record_image_resolution("pinned");
        return Ok(format!("{name}@{digest}"));
    }
    let runtime_error = |source| Error::Runtime {
        key: key.clone(),
        source,
    };
    let local = ctx.runtime.image_info(image).await.map_err(runtime_error)?;
    if let Some(local) = &local
        && local.repo_digests.is_empty()
        && !local.id.is_empty()
    {
        ctx.metrics.record_image_resolution("local");
        // Swarm's nodes pull by name: a local-only image keeps its tag there.
        return Ok(match ctx.options.engine {
            crate::reconcile::context::Engine::Docker => local.id.clone(),
            crate::reconcile::context::Engine::Swarm => image.to_owned(),
        });
    }
    let repository = repository_of(image);
    let auth = auth_for(ctx, key, image).await?;
    match ctx.runtime.pull(image, auth.as_ref()).await {
        Ok(Some(digest)) => {
            ctx.metrics.record_image_resolution("registry");
            Ok(format!("{repository}@{digest}"))
        }
        Ok(None) => {
            let pulled = ctx.runtime.image_info(image).await.map_err(runtime_error)?;
            pulled
                .as_ref()
                .and_then(|info| digest_in(info, repository))
                .ok_or_else(|| Error::Permanent {
                    key: key.clone(),
                    reason: crate::store::FailureReason::PullFailed,
                    message: format!(
                        "{image}: the engine pulled it but names no registry digest for {repository}"
                    ),
                })
        }
        Err(source) => match local.as_ref().and_then(|info| digest_in(info, repository)) {
            // Offline: the copy the host has is what runs, as before it was pinned.
            Some(pinned) => {
                ctx.metrics.record_image_resolution("host_copy");
                tracing::warn!(%key, image, pinned, error = %source, "cannot ask the registry what the tag names now; pinned the copy this host has");
                Ok(pinned)
            }
            None => Err(match source {
                source @ crate::runtime::Error::ImageMissing { .. } => Error::PullFailed {
                    key: key.clone(),
                    source,
                },
                other => runtime_error(other),
            }),
        },
    }
}

/// `name@sha256:…` of `info` for `repository`, when it has one.
fn digest_in(info: &crate::runtime::ImageInfo, repository: &str) -> Option<String> {
    info.repo_digests
        .iter()
        .find(|found| {
            found
                .split_once('@')
                .is_some_and(|(name, _)| same_repository(name, repository))
        })
        .cloned()
}

/// Whether two repository names are one (Docker Hub's short and long forms).
fn same_repository(one: &str, two: &str) -> bool {
    let long = |name: &str| {
        let name = name
            .strip_prefix("docker.io/")
            .or_else(|| name.strip_prefix("index.docker.io/"))
            .unwrap_or(name);
        match name.contains('/') {
            true => name.to_owned(),
            false => format!("library/{name}"),
        }
    };
    one == two || long(one) == long(two)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::image_policy::short_digest as short;

    #[test]
    fn references_split_into_repository_and_digest() {
        assert_eq!(repository_of("postgres:16"), "postgres");
        assert_eq!(repository_of("localhost:5000/a/b:1"), "localhost:5000/a/b");
        assert_eq!(repository_of("localhost:5000/a/b"), "localhost:5000/a/b");
        assert_eq!(
            split_digest("r.io/a:1@sha256:ab"),
            Some(("r.io/a", "sha256:ab"))
        );
        assert_eq!(split_digest("r.io/a:1"), None);
        assert!(same_repository("postgres", "docker.io/library/postgres"));
        assert!(!same_repository("postgres", "r.io/postgres"));
        assert_eq!(short("r.io/a@sha256:0123456789abcdef"), "0123456789ab");
        assert_eq!(short("sha256:fedcba9876543210"), "fedcba987654");
    }

    #[test]
    fn the_label_names_the_whole_resolution() {
        let one = Pins::new(BTreeMap::from([("a:1".into(), "a@sha256:1".into())]));
        let two = Pins::new(BTreeMap::from([("a:1".into(), "a@sha256:2".into())]));
        assert_ne!(one.label(), two.label());
        assert_eq!(one.label(), one.clone().label());
        assert_eq!(one.pin("a:1"), "a@sha256:1");
        assert_eq!(one.pin("b:1"), "b:1");
    }
}
