//! Issue 51, acceptance 3: an agent killed (`kill -9`) mid-canary resumes the step it was at.
//! The real binary with its Caddy ingress on a real engine: 9 replicas of `shop-v1`, then
//! `shop-v2` rolled out by canary steps 10 % / 50 % / 100 %, each paused until
//! `voodu-agent promote`. At the first step (1 canary beside the 9 stable replicas) the
//! agent is killed while a client sends a steady stream through the ingress (the proxy goes
//! on serving: the data plane does not need the agent), then restarted on the same data
//! dir. Afterwards the same containers run (no new canary, no stable replica replaced), the
//! stored rollout is the same step, share and pause, and the client's share of v2 answers
//! over the whole window stayed within the step's 10 %. Two promotes then take the rollout
//! to 50 % (5 canaries beside the 9) and 100 % (9 v2 replicas, the release succeeded), with
//! no failed request at any point.
//!
//! State is read as an operator would: `status --json` (its `rollouts`), `releases --json`,
//! `docker ps`. Limits in `wait_until` are liveness bounds.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::Value;

use crate::canary_docker::{release_of, rollout};
use crate::e2e_docker::{Env, Row};
use crate::maintenance_docker::{ProxyGuard, free_port};
use crate::support::canary::{Client, Hit, ProxyLoads, serving_replica};
use crate::support::{TestResult, test_image, wait_until};

const LIMIT: Duration = Duration::from_secs(90);

/// Stable replicas: the 10 % step is `round(9 × 10 / 100)` = 1 canary beside them (1 of 10
/// upstreams), the 50 % step `round(9 × 50 / 100)` = 5 (5 of 14).
const REPLICAS: usize = 9;

/// The client's pace: one request every 20 ms, each on a fresh connection.
const EVERY: Duration = Duration::from_millis(20);

/// How long the agent stays dead, with the client running, before it is restarted.
const DEAD: Duration = Duration::from_secs(3);

/// How long the restarted agent runs (at least) before the step is checked: about ten of its
/// 1 s polls, each a pass that could move the rollout if it did not resume.
const RESUMED: Duration = Duration::from_secs(10);

/// The agent's flags: the ingress on a loopback port, replicas ready after 1 s running.
fn agent_flags(caddy: &str, proxy: &str) -> Vec<String> {
    [
        "--ingress-image",
        caddy,
        "--ingress-http",
        proxy,
        "--ingress-https",
        "127.0.0.1:0",
        "--ready-settle",
        "1s",
        "--rollout-deadline",
        "60s",
    ]
    .map(ToOwned::to_owned)
    .to_vec()
}

/// The deployment answering `version` (and its host name), rolled out by canary steps
/// 10 / 50 / 100, the first two paused until promoted, no analysis; and its ingress.
fn manifest(scope: &str, version: &str) -> String {
    format!(
        r#"deployment "{scope}" "web" {{
  image    = "{image}"
  command  = {command}
  replicas = {REPLICAS}
  ports    = ["8080"]

  canary {{
    step {{
      weight = 10
      pause  = "until_promoted"
    }}
    step {{
      weight = 50
      pause  = "until_promoted"
    }}
    step {{
      weight = 100
    }}
  }}
}}

ingress "{scope}" "web" {{
  host = "{scope}.test"
  port = 8080
}}
"#,
        image = test_image(),
        command = serving_replica(version, 0),
    )
}

/// The running containers' ids: (of spec `v1`, of any other spec); `None` if one is not
/// running.
fn running(env: &Env, v1: &str) -> Option<(BTreeSet<String>, BTreeSet<String>)> {
    let rows: Vec<Row> = env.containers().ok()?;
    if rows.iter().any(|row| row.state != "running") {
        return None;
    }
    let (old, new): (Vec<&Row>, Vec<&Row>) = rows.iter().partition(|row| row.hash == v1);
    let ids = |rows: Vec<&Row>| rows.into_iter().map(|row| row.id.clone()).collect();
    Some((ids(old), ids(new)))
}

/// Waits until the rollout is paused at `step` with `share` and `canaries` canary replicas
/// running beside the 9 stable ones; the row and the ids (stable, canary).
fn paused_at(
    env: &Env,
    v1: &str,
    step: u64,
    share: u64,
    canaries: usize,
) -> TestResult<(Value, BTreeSet<String>, BTreeSet<String>)> {
    wait_until(
        LIMIT,
        &format!("the rollout paused at step {step} with {canaries} canaries"),
        || {
            let row = rollout(env)?;
            let (old, new) = running(env, v1)?;
            let paused = row["strategy"] == "canary"
                && row["step"] == step
                && row["share"] == share
                && row["canary_replicas"] == canaries
                && row["phase"] == "paused"
                && old.len() == REPLICAS
                && new.len() == canaries;
            paused.then_some((row, old, new))
        },
    )
}

/// `(requests, v2 answers, failed requests)` among `hits`.
fn tally(hits: &[&Hit]) -> (usize, usize, usize) {
    let v2 = hits
        .iter()
        .filter(|hit| hit.status == Some(200) && hit.answer.contains("shop-v2"))
        .count();
    let failed = hits.iter().filter(|hit| hit.status != Some(200)).count();
    (hits.len(), v2, failed)
}

/// The hits sent in `[from, to)` on the client's clock.
fn between(hits: &[Hit], from: Duration, to: Duration) -> Vec<&Hit> {
    hits.iter()
        .filter(|hit| hit.at >= from && hit.at < to)
        .collect()
}

/// One phase's figures, printed for the test output.
fn report(phase: &str, hits: &[&Hit]) -> (usize, usize, usize) {
    let (n, v2, failed) = tally(hits);
    let share = if n == 0 {
        0.0
    } else {
        100.0 * v2 as f64 / n as f64
    };
    println!("{phase}: {n} requests, {v2} answered by v2 ({share:.1} %), {failed} failed");
    (n, v2, failed)
}

/// A short account of the failed requests among `hits`.
fn failures_told(hits: &[Hit]) -> String {
    let failed: Vec<&Hit> = hits
        .iter()
        .filter(|hit| hit.status != Some(200))
        .take(5)
        .collect();
    format!(
        "{} failed of {} requests; first: {failed:#?}",
        hits.iter().filter(|hit| hit.status != Some(200)).count(),
        hits.len()
    )
}

#[test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
fn i51_an_agent_killed_mid_canary_resumes_its_step_within_its_share() -> TestResult {
    // Declared before the `Env`: the proxy goes after the agent is killed.
    let mut proxy = ProxyGuard(None);
    Env::new()?.run(|env| {
        let scope = env.scope().to_owned();
        env.repo.write("app/web.hcl", &manifest(&scope, "shop-v1"))?;
        let v1 = env.repo.commit("web v1")?;
        let port = free_port()?;
        let caddy =
            std::env::var("VOODU_CADDY_IMAGE").unwrap_or_else(|_| "voodu-caddy:latest".to_owned());
        let flags = agent_flags(&caddy, &format!("127.0.0.1:{port}"));
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        env.start_agent_with(&flags)?;
        let v1_hash = env.converged(&v1, REPLICAS, None)?[0].hash.clone();
        let agent_id = voodu_agent::store::Store::open_read_only(&env.data_dir().join("state.db"))?
            .agent_id()?;
        proxy.0 = Some(format!("voodu-caddy-{agent_id}"));
        let host = format!("{scope}.test");
        let probe = Client::start(port, &host, Duration::from_millis(5));
        wait_until(LIMIT, "the proxy to balance over all 9 replicas", || {
            let hits = probe.hits();
            let names: BTreeSet<&str> = hits
                .iter()
                .rev()
                .take(4 * REPLICAS)
                .filter(|hit| hit.status == Some(200))
                .filter_map(|hit| hit.answer.split("shop-v1 ").nth(1))
                .filter_map(|rest| rest.split_whitespace().next())
                .collect();
            (names.len() == REPLICAS).then_some(())
        })?;
        drop(probe);
        let client = Client::start(port, &host, EVERY);

        // v2: its first step, 1 canary beside the 9, paused until promoted.
        env.repo.write("app/web.hcl", &manifest(&scope, "shop-v2"))?;
        let v2 = env.repo.commit("web v2")?;
        let (row_before, stable, canary) = paused_at(env, &v1_hash, 0, 10, 1)?;
        wait_until(LIMIT, "the canary to answer through the ingress", || {
            client
                .hits()
                .iter()
                .any(|hit| hit.answer.contains("shop-v2"))
                .then_some(())
        })?;
        // A few seconds of the step with the agent alive, to compare with.
        let alive_from = client.now();
        std::thread::sleep(DEAD);

        // kill -9 (dropping `Agent` is SIGKILL), the client going on.
        let killed = client.now();
        env.agent = None;
        std::thread::sleep(DEAD);
        let restarted = client.now();
        env.start_agent_with(&flags)?;
        // Fresh again: the new agent answers on its own address and counted its passes.
        env.polled(3)?;
        // Watch the containers and the stored rollout until the agent ran RESUMED.
        let mut most_new = 0;
        let mut shares = BTreeSet::new();
        let mut changed = Vec::new();
        while client.now() < restarted + RESUMED {
            if let Some((old, new)) = running(env, &v1_hash) {
                most_new = most_new.max(new.len());
                if old != stable || new != canary {
                    changed.push(format!("{:?}: {old:?} {new:?}", client.now()));
                }
            }
            if let Some(row) = rollout(env)
                && let Some(share) = row["share"].as_u64()
            {
                shares.insert(share);
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        env.polled(1)?;
        let window_end = client.now();

        let row_after = rollout(env).ok_or("the rollout is still in status")?;
        let (old_after, new_after) = running(env, &v1_hash).ok_or("a container not running")?;
        assert_eq!(
            new_after, canary,
            "still exactly the one canary (the same container)"
        );
        assert_eq!(old_after, stable, "the 9 stable replicas, the same containers");
        assert!(
            changed.is_empty(),
            "no container came or went after the restart: {changed:#?}"
        );
        assert_eq!(most_new, 1, "never more than the one canary");
        assert_eq!(
            shares,
            BTreeSet::from([10]),
            "the stored share stayed 10 %"
        );
        for key in ["release", "strategy", "step", "share", "canary_replicas", "phase", "started"] {
            assert_eq!(
                row_after[key], row_before[key],
                "the stored rollout's {key} is the same after the restart:\n{row_before}\n{row_after}"
            );
        }
        assert_eq!(row_after["step"], 0, "{row_after}");
        assert_eq!(row_after["share"], 10, "{row_after}");
        assert_eq!(row_after["phase"], "paused", "{row_after}");
        assert_eq!(row_after["promote_requested"], false, "{row_after}");

        // promote: step 1, 5 canaries beside the 9.
        let said = env.cli(&["promote", &format!("{scope}/web")])?;
        println!("promote: {}", said.trim());
        let promoted_1 = client.now();
        let (row_1, stable_1, canary_1) = paused_at(env, &v1_hash, 1, 50, 5)?;
        assert_eq!(stable_1, stable, "the stable replicas stay at 50 %");
        let at_50 = client.now();
        std::thread::sleep(DEAD);
        let end_50 = client.now();
        println!("step 1: {row_1}\ncanaries: {canary_1:?}");

        // promote again: 100 %, every replica v2, the release succeeded.
        let said = env.cli(&["promote", &format!("{scope}/web")])?;
        println!("promote: {}", said.trim());
        let row_done = wait_until(LIMIT, "the rollout promoted", || {
            let row = rollout(env)?;
            (row["phase"] == "promoted" || row["phase"] == "aborted").then_some(row)
        })?;
        assert_eq!(row_done["phase"], "promoted", "{row_done}");
        let rows = env.converged(&v2, REPLICAS, Some(&v1_hash))?;
        assert!(
            rows.iter().all(|row| row.hash != v1_hash),
            "every replica is v2: {rows:?}"
        );
        release_of(env, &v2, "succeeded")?;
        let done = client.now();
        std::thread::sleep(DEAD);
        let hits = ProxyLoads::from_log(&env.log())?.without_drops(client.stop())?;

        // The figures, then the bounds.
        println!("{} requests in all", hits.len());
        report("step 0, agent alive", &between(&hits, alive_from, killed));
        report("step 0, agent dead", &between(&hits, killed, restarted));
        report(
            "step 0, agent restarted",
            &between(&hits, restarted, window_end),
        );
        let (n, v2_answers, failed) = report(
            "step 0, kill to resumed (the window)",
            &between(&hits, killed, window_end),
        );
        report("promote to step 1", &between(&hits, promoted_1, at_50));
        let (n_50, v2_50, _) = report("step 1, paused", &between(&hits, at_50, end_50));
        report("promote to 100 %", &between(&hits, end_50, done));
        report("after", &between(&hits, done, Duration::MAX));
        let (_, _, failed_all) = report("all", &hits.iter().collect::<Vec<_>>());

        // The bound in the window: 1 canary among 10 upstreams and Caddy's round robin
        // sends it exactly 1 request in 10 consecutive ones, so at most ⌈n / 10⌉; plus 2
        // for config loads (the restarted agent writing its proxy config), each of which
        // restarts the round robin and may land on the canary once more. The next step's
        // share (5 of 14) would be over a third.
        assert!(n > 200, "the window saw a steady stream: {n} requests");
        assert!(v2_answers > 0, "the canary went on serving its share");
        assert!(
            v2_answers <= n.div_ceil(10) + 2,
            "at most the first step's share through the kill and restart: {v2_answers} of {n}"
        );
        assert_eq!(failed, 0, "no failed request through the kill and restart");
        // At 50 %: 5 of 14 upstreams, ⌈5n / 14⌉ + 2 on the same reasoning.
        assert!(
            v2_50 > 0 && v2_50 <= (5 * n_50).div_ceil(14) + 2,
            "the 50 % step's share: {v2_50} of {n_50}"
        );
        assert_eq!(failed_all, 0, "{}", failures_told(&hits));
        assert!(
            between(&hits, done, Duration::MAX)
                .iter()
                .all(|hit| hit.answer.contains("shop-v2")),
            "only v2 at the end"
        );
        Ok(())
    })
}

/// Four replicas answering `version`, rolled out by a canary of 25 % (a 1 s pause) then
/// 100 %, judged by an `http` analysis of 12 samples over 12 s; and their ingress.
fn analysed_manifest(scope: &str, version: &str) -> String {
    format!(
        r#"deployment "{scope}" "web" {{
  image    = "{image}"
  command  = {command}
  replicas = 4
  ports    = ["8080"]

  canary {{
    step {{
      weight = 25
      pause  = "1s"
    }}
    step {{
      weight = 100
    }}
    analysis {{
      interval = "12s"
      http {{
        path              = "/"
        samples           = 12
        max_error_percent = 0
      }}
    }}
  }}
}}

ingress "{scope}" "web" {{
  host = "{scope}.test"
  port = 8080
}}
"#,
        image = test_image(),
        command = serving_replica(version, 0),
    )
}

/// The `message` of this scope's `deployment/web` in `status --json`.
fn web_message(env: &Env) -> Option<String> {
    let status = env.status().ok()?;
    status["resources"]
        .as_array()?
        .iter()
        .find(|row| row["kind"] == "deployment" && row["scope"] == env.scope())
        .and_then(|row| row["message"].as_str().map(str::to_owned))
}

#[test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
fn i51_an_agent_killed_during_a_canary_analysis_runs_it_again_and_goes_on() -> TestResult {
    let mut proxy = ProxyGuard(None);
    Env::new()?.run(|env| {
        let scope = env.scope().to_owned();
        env.repo
            .write("app/web.hcl", &analysed_manifest(&scope, "shop-v1"))?;
        let v1 = env.repo.commit("web v1")?;
        let port = free_port()?;
        let caddy =
            std::env::var("VOODU_CADDY_IMAGE").unwrap_or_else(|_| "voodu-caddy:latest".to_owned());
        let flags = agent_flags(&caddy, &format!("127.0.0.1:{port}"));
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        env.start_agent_with(&flags)?;
        let v1_hash = env.converged(&v1, 4, None)?[0].hash.clone();
        let agent_id = voodu_agent::store::Store::open_read_only(&env.data_dir().join("state.db"))?
            .agent_id()?;
        proxy.0 = Some(format!("voodu-caddy-{agent_id}"));

        env.repo
            .write("app/web.hcl", &analysed_manifest(&scope, "shop-v2"))?;
        let v2 = env.repo.commit("web v2")?;
        // The step's analysis is running (its 12 s have begun): kill -9 then.
        wait_until(LIMIT, "the canary's analysis running", || {
            web_message(env)?
                .contains("analysing the canary")
                .then_some(())
        })?;
        let (_, canary) = running(env, &v1_hash).ok_or("a container not running")?;
        assert_eq!(
            canary.len(),
            1,
            "one canary (25 % of 4) while it is analysed"
        );
        env.agent = None;
        std::thread::sleep(DEAD);
        env.start_agent_with(&flags)?;
        env.polled(2)?;
        // Resumed at the same step with the same canary: the analysis runs again from its
        // start, then the rollout goes on to 100 %.
        let row = rollout(env).ok_or("the rollout is in status")?;
        assert_eq!(
            (row["step"].clone(), row["share"].clone()),
            (0.into(), 25.into()),
            "{row}"
        );
        let (_, still) = running(env, &v1_hash).ok_or("a container not running")?;
        assert_eq!(still, canary, "the same canary after the restart");
        let done = wait_until(LIMIT, "the rollout promoted after its analysis", || {
            let row = rollout(env)?;
            (row["phase"] == "promoted" || row["phase"] == "aborted").then_some(row)
        })?;
        println!("after the restart: {done}");
        assert_eq!(done["phase"], "promoted", "{done}");
        assert_eq!(done["verdict"], "passed", "{done}");
        assert_eq!(done["analysis"]["step"], 0, "{done}");
        assert_eq!(done["analysis"]["http"]["samples"], 12, "{done}");
        assert_eq!(done["analysis"]["http"]["via"], "ingress", "{done}");
        env.converged(&v2, 4, Some(&v1_hash))?;
        release_of(env, &v2, "succeeded")?;
        Ok(())
    })
}
