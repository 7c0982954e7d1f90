//! Asset handler: the files of an `asset` are written by the sync stage before its commit
//! reaches the journal; this handler keeps them that way. It compares each file under
//! `<data-dir>/assets/[<scope>/]<name>/<key>` with the digest the spec records and rewrites a
//! missing or edited one from the bytes the store kept, so drift on the host is repaired.
//!
//! Invariants: a file whose digest matches is never rewritten (containers keep their bind
//! mounts); the status lists each key's digest and whether the file was repaired; the files
//! of an asset that left the repo are removed by the sync stage, not here.

use std::sync::Arc;

use super::Handler;
use crate::assets::{AssetFiles, check_asset, prepare, write_prepared};
use crate::manifest::spec::AssetSpec;
use crate::model::ResourceKey;
use crate::reconcile::{
    context::Ctx, context::blocking, error::Error, error::Result, run::action::Action,
};
use crate::runtime::Runtime;
use crate::store::{AssetDetail, AssetFileDetail, Detail, FailureReason, Phase, ResourceStatus};

impl Handler for AssetSpec {
    async fn reconcile<R: Runtime>(ctx: &Arc<Ctx<R>>, key: &ResourceKey) -> Result<Action> {
        let desired = super::desired_of(ctx, key).await?;
        let Some(desired) = desired else {
            // Its configs go once no service uses them (those in use stay; Swarm refuses).
            super::engine::tidy_asset_configs(ctx, key, None).await;
            let key = key.clone();
            blocking(&ctx.store, move |store| store.delete_status(&key)).await?;
            return Ok(Action::Done);
        };
        let asset = spec_of!(key, desired, Asset);
        // Configs of earlier versions of its files that no service uses any more (a consumer's
        // update tries at once; this catches those a job run kept in use).
        let current: Vec<(String, String)> = asset
            .files
            .iter()
            .map(|(file, content)| (file.clone(), content.digest.clone()))
            .collect();
        super::engine::tidy_asset_configs(ctx, key, Some(current)).await;
        let spec_files = asset.files.clone();
        let root = ctx.assets_root.clone();
        let store = ctx.store.clone();
        let keyring = std::sync::Arc::clone(&ctx.options.keyring);
        let (scope, name) = (key.scope.clone(), key.name.clone());
        let (before, expected, written) = tokio::task::spawn_blocking(move || {
            let blob = |digest: &str| store.blob(digest).ok().flatten();
            // SOPS-encrypted keys are decrypted in memory to know the bytes the disk must hold.
            let prepared = match prepare(&spec_files, &blob, &keyring) {
                Ok(prepared) => prepared,
                Err(error) => return (Default::default(), AssetFiles::new(), Err(error)),
            };
            let before = check_asset(&root, &scope, &name, &prepared.files);
            let written = write_prepared(&root, &scope, &name, &prepared, &blob);
            (before, prepared.files, written)
        })
        .await
        .map_err(Error::Task)?;
        let repaired: Vec<&String> = before
            .iter()
            .filter(|(name, found)| found.as_ref() != expected.get(*name))
            .map(|(name, _)| name)
            .collect();
        let status = match written {
            Ok(count) => {
                if count > 0 {
                    tracing::warn!(%key, files = ?repaired, "asset files differed from the commit on the host; rewritten");
                }
                let mut status = ResourceStatus::new(Phase::Ready, "");
                status.spec_hash = desired.spec_hash.to_string();
                status.detail = Detail::Asset(AssetDetail {
                    files: crate::model::map_of(asset.files.iter().map(|(name, file)| {
                        let file = AssetFileDetail {
                            digest: file.digest.clone(),
                            size: file.size,
                            source: file.source.clone(),
                        };
                        (name.clone(), file)
                    })),
                    path: crate::model::asset_dir(&ctx.assets_root, &key.scope, &key.name),
                    repaired: repaired.into_iter().cloned().collect(),
                });
                status
            }
            Err(source) => {
                let status = ResourceStatus {
                    spec_hash: desired.spec_hash.to_string(),
                    ..ResourceStatus::failed(
                        FailureReason::Files,
                        format!("cannot write the asset's files: {source}"),
                    )
                };
                let error = Error::Files {
                    key: key.clone(),
                    source,
                };
                let key_for_store = key.clone();
                blocking(&ctx.store, move |store| {
                    store.put_status(&key_for_store, &status)
                })
                .await?;
                return Err(error);
            }
        };
        let key = key.clone();
        blocking(&ctx.store, move |store| store.put_status(&key, &status)).await?;
        Ok(Action::Done)
    }
}
