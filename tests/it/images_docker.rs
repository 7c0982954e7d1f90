//! Issue 27, acceptance 1: image automation against a real registry (Debian's
//! `docker-registry`, htpasswd auth) with the real binary, a real git remote and a real
//! engine. Tags 1.4.2, 1.4.3, 1.5.0 and 2.0.0 are pushed; `range = "~1.4"` commits 1.4.3 (the
//! diff touches only the tag), signed with `--image-signing-key` and accepted under
//! `--verify-commits tip`, and the agent deploys it (the container runs the 1.4.3 image); a
//! later 1.4.4 is picked up at the next interval; a `report` resource changes nothing and is
//! reported by `images`, `status` and `/metrics`; wrong credentials and an unreachable registry
//! show in status.
//!
//! Limits in `wait_until` are liveness bounds, not timing assertions.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::e2e_docker::Env;
use crate::support::distribution::Distribution;
use crate::support::http::{get_blocking, metric, parse_metrics};
use crate::support::signing::SshSigner;
use crate::support::{TestResult, test_image, wait_until};

/// Two scan intervals (10 s, the shortest allowed) and a deploy, with room.
const LIMIT: Duration = Duration::from_secs(90);

/// Removes the pulled `<host>/app:*` images from the host when dropped.
struct Images(String);

impl Drop for Images {
    fn drop(&mut self) {
        let listed = Command::new("docker")
            .args(["images", "--format", "{{.Repository}}:{{.Tag}}", &self.0])
            .output();
        if let Ok(output) = listed {
            for reference in String::from_utf8_lossy(&output.stdout).split_whitespace() {
                let _ = Command::new("docker")
                    .args(["rmi", "-f", reference])
                    .output();
            }
        }
    }
}

fn web(scope: &str, name: &str, image: &str, update: &str) -> String {
    format!(
        "deployment \"{scope}\" \"{name}\" {{\n  image   = \"{image}\"  # followed\n  command = [\"sleep\", \"3600\"]\n  image_update {{\n{update}  }}\n}}\n"
    )
}

fn registry_block(host: &str, username: &str, password: &str) -> String {
    format!(
        "registry \"local\" {{\n  url      = \"{host}\"\n  username = \"{username}\"\n  token    = \"{password}\"\n}}\n"
    )
}

/// The remote's `main` tip and its message, read by one command: two reads could straddle
/// the agent's push and pair the old tip with the new message.
fn remote_tip(env: &Env) -> TestResult<(String, String)> {
    let remote = env.repo.remote_path();
    let text = crate::support::repo::git(&remote, &["log", "-1", "--format=%H%n%B", "main"])?;
    let (sha, message) = text.split_once('\n').unwrap_or((text.as_str(), ""));
    Ok((sha.trim().to_owned(), message.to_owned()))
}

/// Waits for the agent's commit whose message names `change`; returns its SHA.
fn agent_commit(env: &Env, change: &str) -> TestResult<String> {
    wait_until(LIMIT, &format!("the agent to commit {change}"), || {
        let (sha, message) = remote_tip(env).ok()?;
        message.contains(change).then_some(sha)
    })
}

/// The `images --json` entry of `name`.
fn image_entry(env: &Env, name: &str) -> TestResult<Option<Value>> {
    let views: Value = serde_json::from_str(&env.cli(&["images", "--json"])?)?;
    Ok(views
        .as_array()
        .and_then(|views| views.iter().find(|view| view["name"] == name).cloned()))
}

/// Waits until `name`'s one replica runs `reference` and its `/version` is `tag`.
fn runs(env: &Env, name: &str, reference: &str, tag: &str) -> TestResult<String> {
    let marker = format!("{}-{name}.", env.scope());
    wait_until(LIMIT, &format!("{name} to run {reference}"), || {
        let rows = env.containers().ok()?;
        let running: Vec<_> = rows
            .into_iter()
            .filter(|row| row.name.starts_with(&marker) && row.state == "running")
            .collect();
        let [row] = running.as_slice() else {
            return None;
        };
        let image = docker(&["inspect", "--format", "{{.Config.Image}}", &row.id]).ok()?;
        let version = docker(&["exec", &row.id, "cat", "/version"]).ok()?;
        // Created from the digest its release pinned the tag to (a reference written with
        // its digest runs exactly that).
        let pinned = match reference.split_once('@') {
            Some(_) => image == reference,
            None => {
                let repository = reference
                    .rsplit_once(':')
                    .map_or(reference, |(name, _)| name);
                image.starts_with(&format!("{repository}@sha256:"))
            }
        };
        (pinned && version == tag).then(|| row.id.clone())
    })
}

fn docker(args: &[&str]) -> TestResult<String> {
    let output = Command::new("docker").args(args).output()?;
    if !output.status.success() {
        return Err(format!(
            "docker {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    Ok(String::from_utf8(output.stdout)?.trim().to_owned())
}

/// `voodu_image_update_available` of `resource` on the agent's `/metrics` (an error when the
/// agent exports no such sample).
fn update_metric(env: &Env, resource: &str) -> TestResult<f64> {
    let (_, text) = get_blocking(&env.http_address()?, "/metrics")?;
    let samples = parse_metrics(&text)?;
    let labels = [("resource", resource)];
    let present = samples.iter().any(|sample| {
        sample.name == "voodu_image_update_available"
            && sample.labels.get("resource").map(String::as_str) == Some(resource)
    });
    if !present {
        return Err(format!("no voodu_image_update_available for {resource}:\n{text}").into());
    }
    Ok(metric(&samples, "voodu_image_update_available", &labels))
}

#[test]
#[ignore = "needs a Docker engine and docker-registry: scripts/test runs it (cargo test -- --include-ignored)"]
fn a_registry_is_followed_by_policy_and_the_bump_committed_signed_and_deployed() -> TestResult {
    let password = format!("pw-{}", voodu_agent::model::random_hex(8));
    let mut registry = Distribution::start("deploy-bot", &password)?;
    let host = registry.host();
    let _images = Images(format!("{host}/app"));
    let reference = |tag: &str| format!("{host}/app:{tag}");
    for tag in ["1.4.2", "1.4.3", "1.5.0", "2.0.0"] {
        registry.push_version(&test_image(), "app", tag)?;
    }
    let human = SshSigner::new("human@example.com")?;
    let agent_key = SshSigner::new("voodu-agent@localhost")?;

    Env::new()?.run(|env| {
        let scope = env.scope().to_owned();
        let allowed = env.dir.path().join("allowed_signers");
        std::fs::write(
            &allowed,
            format!(
                "{}{}",
                human.allowed_signers_line()?,
                agent_key.allowed_signers_line()?
            ),
        )?;
        let web_file = web(
            &scope,
            "web",
            &reference("1.4.2"),
            "    range    = \"~1.4\"\n    interval = \"10s\"\n",
        );
        let api_file = web(
            &scope,
            "api",
            &reference("1.4.2"),
            "    range    = \"^1\"\n    interval = \"10s\"\n    mode     = \"report\"\n",
        );
        env.repo.write("app/web.hcl", &web_file)?;
        env.repo.write("app/api.hcl", &api_file)?;
        env.repo.write(
            "app/registry.hcl",
            &registry_block(&host, "deploy-bot", &password),
        )?;
        let first = env
            .repo
            .commit_signed(&human.git_config(), "web and api at 1.4.2")?;
        let key = agent_key.private_key().display().to_string();
        let allowed_text = allowed.display().to_string();
        env.start_agent_with(&[
            "--ready-settle",
            "1s",
            "--allow-url-host",
            "127.0.0.1",
            "--image-signing-key",
            &key,
            "--verify-commits",
            "tip",
            "--trusted-ssh-signers",
            &allowed_text,
        ])?;

        // 1. ~1.4 → 1.4.3 (not 1.5.0, not 2.0.0): committed, only the tag changed, signed.
        let bump = agent_commit(
            env,
            &format!("{scope}/web: {host}/app:1.4.2 → {host}/app:1.4.3"),
        )?;
        let remote = env.repo.remote_path();
        let diff = crate::support::repo::git(
            &remote,
            &["diff", "--unified=0", &format!("{first}..{bump}")],
        )?;
        let changed: Vec<&str> = diff
            .lines()
            .filter(|line| {
                (line.starts_with('-') || line.starts_with('+'))
                    && !line.starts_with("---")
                    && !line.starts_with("+++")
            })
            .collect();
        assert_eq!(
            changed,
            [
                format!("-  image   = \"{}\"  # followed", reference("1.4.2")),
                format!("+  image   = \"{}\"  # followed", reference("1.4.3")),
            ],
            "{diff}"
        );
        assert!(
            diff.contains("app/web.hcl") && !diff.contains("app/api.hcl"),
            "{diff}"
        );
        let signature = crate::support::repo::git(&remote, &["cat-file", "commit", &bump])?;
        assert!(
            signature.contains("-----BEGIN SSH SIGNATURE-----"),
            "{signature}"
        );

        // 2. Accepted under --verify-commits and deployed: the replica runs the 1.4.3 image.
        wait_until(LIMIT, "the bump to be applied", || {
            let status = env.status().ok()?;
            (status["last_applied"]["sha"] == bump.as_str()).then_some(())
        })?;
        runs(env, "web", &reference("1.4.3"), "1.4.3")?;

        // 3. report mode: api keeps 1.4.2 in git and on the host, and 1.5.0 is reported.
        let api = wait_until(LIMIT, "api's newer tag to be reported", || {
            let entry = image_entry(env, "api").ok()??;
            (entry["latest_tag"] == "1.5.0").then_some(entry)
        })?;
        assert_eq!(
            (&api["mode"], &api["current_tag"], &api["update_available"]),
            (
                &Value::from("report"),
                &Value::from("1.4.2"),
                &Value::from(true)
            ),
            "{api}"
        );
        assert!(
            api["scanned_at"].is_i64() && api["scan_error"].is_null(),
            "{api}"
        );
        let show = crate::support::repo::git(&remote, &["show", "main:app/api.hcl"])?;
        assert_eq!(
            show.trim_end(),
            api_file.trim_end(),
            "report mode changed git"
        );
        runs(env, "api", &reference("1.4.2"), "1.4.2")?;
        let status = env.status()?;
        let in_status = status["images"]
            .as_array()
            .and_then(|images| images.iter().find(|image| image["name"] == "api").cloned())
            .ok_or("no images in status --json")?;
        assert_eq!(in_status["latest_tag"], "1.5.0", "{status}");
        let api_resource = format!("deployment/{scope}/api");
        let web_resource = format!("deployment/{scope}/web");
        assert_eq!(update_metric(env, &api_resource)?, 1.0);
        wait_until(LIMIT, "web to be current", || {
            let entry = image_entry(env, "web").ok()??;
            (entry["current_tag"] == "1.4.3" && entry["update_available"] == false).then_some(())
        })?;
        assert_eq!(update_metric(env, &web_resource)?, 0.0);
        let table = env.cli(&["status"])?;
        assert!(table.contains("NEWER 1.5.0 available (report)"), "{table}");
        let activity = env.cli(&["activity", "--json"])?;
        assert!(
            activity.contains("image.available") && activity.contains("image.commit"),
            "{activity}"
        );

        // 4. A later 1.4.4 is picked up at the next interval.
        registry.push_version(&test_image(), "app", "1.4.4")?;
        let second = agent_commit(
            env,
            &format!("{scope}/web: {host}/app:1.4.3 → {host}/app:1.4.4"),
        )?;
        wait_until(LIMIT, "the second bump to be applied", || {
            let status = env.status().ok()?;
            (status["last_applied"]["sha"] == second.as_str()).then_some(())
        })?;
        runs(env, "web", &reference("1.4.4"), "1.4.4")?;

        // 5. Wrong credentials (a human commit on top of the agent's): shown in status.
        env.repo.git(&[
            "pull",
            "-q",
            "--ff-only",
            &remote.display().to_string(),
            "main",
        ])?;
        env.repo.write(
            "app/registry.hcl",
            &registry_block(&host, "deploy-bot", "wrong"),
        )?;
        let wrong = env
            .repo
            .commit_signed(&human.git_config(), "wrong registry password")?;
        wait_until(LIMIT, "the wrong credentials to show", || {
            let status = env.status().ok()?;
            let applied = status["last_applied"]["sha"] == wrong.as_str();
            let error = status["images"][0]["scan_error"].as_str()?.to_owned();
            (applied && error.contains("refused the credentials")).then_some(())
        })?;
        let table = env.cli(&["status"])?;
        assert!(table.contains("refused the credentials"), "{table}");

        // 6. An unreachable registry: shown in status, the last good tags kept.
        registry.stop();
        let error = wait_until(LIMIT, "the unreachable registry to show", || {
            let entry = image_entry(env, "web").ok()??;
            let error = entry["scan_error"].as_str()?.to_owned();
            error.contains("unreachable").then_some(error)
        })?;
        assert!(error.contains(&host), "{error}");
        let api = image_entry(env, "api")?.ok_or("no api")?;
        assert_eq!(
            api["latest_tag"], "1.5.0",
            "the last good tags are kept: {api}"
        );
        eprintln!("images_docker: bumps {bump} and {second}; unreachable: {error}");
        Ok(())
    })
}

/// Issue 48, item 3: `policy = "digest"` follows a mutable tag on purpose. The agent asks the
/// registry what `:stable` names, commits `app:stable@sha256:A` to git, and when the tag is
/// pushed again commits `@sha256:B`: the replica runs exactly what git names.
#[test]
#[ignore = "needs a Docker engine and docker-registry: scripts/test runs it (cargo test -- --include-ignored)"]
fn i48_a_tag_followed_by_its_digest_is_pinned_in_git_and_moved() -> TestResult {
    let password = format!("pw-{}", voodu_agent::model::random_hex(8));
    let registry = Distribution::start("deploy-bot", &password)?;
    let host = registry.host();
    let _images = Images(format!("{host}/tracked"));
    let image = format!("{host}/tracked:stable");
    let push = |content: &str| -> TestResult<String> {
        let context = tempfile::tempdir()?;
        std::fs::write(context.path().join("version"), content)?;
        std::fs::write(
            context.path().join("Dockerfile"),
            format!("FROM {}\nCOPY version /version\n", test_image()),
        )?;
        let path = context.path().display().to_string();
        registry.docker(&["build", "-q", "-t", &image, &path], None)?;
        registry.docker(&["push", "-q", &image], None)?;
        let digests = registry.docker(
            &[
                "image",
                "inspect",
                "--format",
                "{{json .RepoDigests}}",
                &image,
            ],
            None,
        )?;
        registry.docker(&["rmi", "-f", &image], None)?;
        let digests: Vec<String> = serde_json::from_str(&digests)?;
        Ok(digests
            .first()
            .and_then(|reference| reference.split_once('@'))
            .map(|(_, digest)| digest.to_owned())
            .ok_or("no digest")?)
    };
    let digest_a = push("A")?;
    Env::new()?.run(|env| {
        let scope = env.scope().to_owned();
        env.repo.write(
            "app/web.hcl",
            &web(
                &scope,
                "web",
                &image,
                "    policy   = \"digest\"\n    interval = \"10s\"\n",
            ),
        )?;
        env.repo.write(
            "app/registry.hcl",
            &registry_block(&host, "deploy-bot", &password),
        )?;
        env.repo.commit("web follows :stable by digest")?;
        env.start_agent_with(&["--ready-settle", "1s", "--allow-url-host", "127.0.0.1"])?;
        // git gets the digest the tag names now...
        let pinned = agent_commit(env, &format!("{image} → {image}@{digest_a}"))?;
        let remote = env.repo.remote_path();
        let show = crate::support::repo::git(&remote, &["show", &format!("{pinned}:app/web.hcl")])?;
        assert!(show.contains(&format!("\"{image}@{digest_a}\"")), "{show}");
        runs(env, "web", &format!("{host}/tracked@{digest_a}"), "A")?;
        // ...and the next digest once the tag is pushed again.
        let digest_b = push("B")?;
        agent_commit(env, &format!("{image}@{digest_a} → {image}@{digest_b}"))?;
        runs(env, "web", &format!("{host}/tracked@{digest_b}"), "B")?;
        let entry = image_entry(env, "web")?.ok_or("web in `images`")?;
        assert_eq!(entry["policy"], "digest", "{entry}");
        Ok(())
    })
}
