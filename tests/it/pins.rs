//! Issue 48: a release is exact bytes, on the fake runtime with paused time. A release
//! resolves `app:stable` once to the digest it names (A); after the tag moved to B and the
//! host lost the image, a scale-up, a replica removed by hand and an agent restart all run A
//! (pulled by digest); a spec change runs B; `git revert` to the first spec and `rollback
//! --release 1` run A again (the very bytes release 1 ran); `redeploy` resolves the tag anew and rolls the replicas onto B.
//! A local-only image runs by its image id. One resolution per image per release: the tag is
//! pulled once per rollout, never per replica.

use voodu_agent::model::{Kind, ResourceKey};
use voodu_agent::runtime::FakeRuntime;

use crate::support::TestResult;
use crate::support::harness::Harness;

const IMAGE: &str = "registry.example/acme/app:stable";
const DIGEST_A: &str = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const DIGEST_B: &str = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

fn web_key() -> ResourceKey {
    ResourceKey::new(Kind::Deployment, "shop", "web")
}

fn web(replicas: u32, v: &str) -> String {
    format!(
        "deployment \"shop\" \"web\" {{\n  image    = \"{IMAGE}\"\n  command  = [\"sleep\", \"3600\"]\n  replicas = {replicas}\n  env      = {{ V = \"{v}\" }}\n}}\n"
    )
}

fn pinned(digest: &str) -> String {
    format!("registry.example/acme/app@{digest}")
}

/// The images the key's running containers were created from, sorted.
async fn images(harness: &Harness) -> TestResult<Vec<String>> {
    let mut images: Vec<String> = harness
        .containers(&web_key())
        .await?
        .into_iter()
        .map(|container| container.image)
        .collect();
    images.sort();
    Ok(images)
}

fn tag_pulls(harness: &Harness) -> usize {
    harness
        .fake
        .calls()
        .iter()
        .filter(|call| *call == &format!("pull {IMAGE}"))
        .count()
}

#[tokio::test(start_paused = true)]
async fn i48_every_container_of_a_release_runs_the_digest_it_resolved() -> TestResult {
    let fake = FakeRuntime::with_images(&["busybox"]);
    fake.publish(IMAGE, "");
    fake.set_tag_digest(IMAGE, DIGEST_A);
    let mut harness = Harness::with_fake(fake)?;
    harness.start()?;

    // Release 1 resolves the tag once, for both replicas.
    let first = harness.push(&[("web.hcl", &web(2, "1"))])?;
    harness.converged(&web_key(), 2).await?;
    assert_eq!(images(&harness).await?, vec![pinned(DIGEST_A); 2]);
    assert_eq!(
        tag_pulls(&harness),
        1,
        "one resolution per release, not per replica"
    );
    let release = harness
        .store
        .latest_release(&web_key())?
        .ok_or("a release")?;
    assert_eq!(
        release.images.as_ref().and_then(|images| images.get(IMAGE)),
        Some(&pinned(DIGEST_A))
    );

    // The tag moves to B, and the host loses its copy.
    harness.fake.set_tag_digest(IMAGE, DIGEST_B);
    harness.fake.remove_image(IMAGE);
    // 1. A scale-up: the new replica is A's, pulled by digest.
    harness.push(&[("web.hcl", &web(3, "1"))])?;
    harness.converged(&web_key(), 3).await?;
    assert_eq!(images(&harness).await?, vec![pinned(DIGEST_A); 3]);
    // 2. A replica removed by hand after the host lost the image again.
    harness.fake.remove_image(IMAGE);
    let replicas = harness.containers(&web_key()).await?;
    voodu_agent::runtime::Containers::remove(harness.fake.as_ref(), &replicas[0].id).await?;
    harness.converged(&web_key(), 3).await?;
    assert_eq!(images(&harness).await?, vec![pinned(DIGEST_A); 3]);
    // 3. An agent restart on a host pruned meanwhile, a replica gone.
    harness.stop().await?;
    harness.fake.remove_image(IMAGE);
    let replicas = harness.containers(&web_key()).await?;
    voodu_agent::runtime::Containers::remove(harness.fake.as_ref(), &replicas[0].id).await?;
    harness.start()?;
    harness.converged(&web_key(), 3).await?;
    assert_eq!(images(&harness).await?, vec![pinned(DIGEST_A); 3]);
    assert_eq!(tag_pulls(&harness), 1, "no repair asked the tag again");

    // A spec change resolves anew: B.
    harness.push(&[("web.hcl", &web(3, "2"))])?;
    harness.converged(&web_key(), 3).await?;
    assert_eq!(images(&harness).await?, vec![pinned(DIGEST_B); 3]);
    assert_eq!(tag_pulls(&harness), 2);

    // `git revert` to the first spec: back to what ran, A, without asking the registry.
    harness.push(&[("web.hcl", &web(3, "1"))])?;
    harness.converged(&web_key(), 3).await?;
    assert_eq!(images(&harness).await?, vec![pinned(DIGEST_A); 3]);
    assert_eq!(
        tag_pulls(&harness),
        2,
        "a revert takes the release's digest over"
    );

    // A redeploy resolves the tag anew: the same spec rolls onto B.
    let redeploy = harness.store.redeploy(&web_key())?;
    harness
        .status_where(&web_key(), |status| {
            status.phase == "Ready" && status.release_id == Some(redeploy.id)
        })
        .await?;
    harness.converged(&web_key(), 3).await?;
    assert_eq!(images(&harness).await?, vec![pinned(DIGEST_B); 3]);

    // `rollback --release 1`: A again, whatever the tag names.
    harness
        .store
        .rollback(&web_key(), Some(&format!("#{}", release.id)))?;
    harness
        .status_where(&web_key(), |status| {
            status.phase == "Ready" && status.release_id > Some(redeploy.id)
        })
        .await?;
    // (Release 1's snapshot says 2 replicas.)
    harness.converged(&web_key(), 2).await?;
    assert_eq!(images(&harness).await?, vec![pinned(DIGEST_A); 2]);
    assert_ne!(first.as_str(), "");
    harness.stop().await
}

#[tokio::test(start_paused = true)]
async fn i48_a_local_only_image_runs_by_its_image_id() -> TestResult {
    let mut harness = Harness::with_fake(FakeRuntime::with_images(&["local/app:dev"]))?;
    harness.start()?;
    harness.push(&[(
        "web.hcl",
        "deployment \"shop\" \"web\" {\n  image = \"local/app:dev\"\n  command = [\"sleep\", \"3600\"]\n}\n",
    )])?;
    let replicas = harness.converged(&web_key(), 1).await?;
    let id = harness.fake.pinned("local/app:dev");
    assert!(id.starts_with("sha256:"), "{id}");
    assert_eq!(replicas[0].image, id);
    // Never asked a registry.
    assert!(
        !harness
            .fake
            .calls()
            .iter()
            .any(|call| call.starts_with("pull"))
    );
    harness.stop().await
}
