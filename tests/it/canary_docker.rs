//! Issue 51, acceptance 1: canary rollouts (`canary {}`) on a real engine, with the real
//! binary, its Caddy ingress and a real Prometheus (Debian's, `voodu-prometheus`). A
//! deployment of 9 replicas behind an ingress host gets a new release rolled out in steps of
//! 10 % / 50 % / 100 % while a client sends a steady stream of requests through the ingress:
//! - a version answering 500 to every request, judged by an `http` analysis, is aborted at
//!   its first step: the client's errors stay within that step's share, they stop within one
//!   analysis interval after the step's pause, none follow, and only the old replicas remain
//!   with the release failed;
//! - a good version passes every step, ends with every replica new, and the client sees no
//!   error at all;
//! - a version exporting `app_bad 1`, judged by a `prometheus` analysis of a Prometheus
//!   scraping the replicas, is aborted on that verdict, the measurements in `status`.
//!
//! Replicas are `voodu-busybox` with a `command` (`support::canary`); state is read as an
//! operator would: `status --json` (its `rollouts`), `status`, `releases --json`, `docker ps`.
//! Limits in `wait_until` are liveness bounds.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::e2e_docker::Env;
use crate::maintenance_docker::free_port;
use crate::support::canary::{
    Client, Hit, Prometheus, ProxyLoads, failing_replica, serving_replica,
};
use crate::support::{TestResult, test_image, wait_until};

const LIMIT: Duration = Duration::from_secs(90);

/// Stable replicas: a 10 % step is `round(9 × 10 / 100)` = 1 canary beside them, so with
/// round robin over the 10 upstreams the canary takes exactly 1 request in 10.
const REPLICAS: usize = 9;

/// The client's pace: one request every 20 ms (about 40 a second with the request itself).
const EVERY: Duration = Duration::from_millis(20);

/// How long the client goes on once the rollout is over, to see that nothing fails after it.
const AFTER: Duration = Duration::from_secs(5);

/// The agent's flags beside the repository: the ingress on a loopback port, Prometheus on
/// loopback allowed, replicas ready after 1 s running.
fn agent_flags(caddy: &str, proxy: &str) -> Vec<String> {
    [
        "--ingress-image",
        caddy,
        "--ingress-http",
        proxy,
        "--ingress-https",
        "127.0.0.1:0",
        "--allow-url-host",
        "127.0.0.1",
        "--ready-settle",
        "1s",
        "--rollout-deadline",
        "60s",
    ]
    .map(ToOwned::to_owned)
    .to_vec()
}

/// The deployment (`command` an HCL list), rolled out by canary steps 10 / 50 / 100 with
/// `pause` after each and `analysis` (the block's body), and an ingress for its host.
fn manifest(scope: &str, command: &str, pause: &str, analysis: &str) -> String {
    format!(
        r#"deployment "{scope}" "web" {{
  image    = "{image}"
  command  = {command}
  replicas = {REPLICAS}
  ports    = ["8080"]

  canary {{
    step {{
      weight = 10
      pause  = "{pause}"
    }}
    step {{
      weight = 50
      pause  = "{pause}"
    }}
    step {{
      weight = 100
    }}
    analysis {{
{analysis}    }}
  }}
}}

ingress "{scope}" "web" {{
  host = "{scope}.test"
  port = 8080
}}
"#,
        image = test_image()
    )
}

/// Removes the agent's proxy container on drop (it outlives the agent by design). Declared
/// before the `Env`, so it goes after the agent is killed and cannot be recreated.
struct ProxyGuard(Option<String>);

impl Drop for ProxyGuard {
    fn drop(&mut self) {
        if let Some(name) = &self.0 {
            if std::thread::panicking()
                && let Ok(output) = Command::new("docker")
                    .args(["logs", "--tail", "400", name])
                    .output()
            {
                // What the proxy said of the requests it could not serve.
                let logs = String::from_utf8_lossy(&output.stderr);
                let errors: Vec<&str> = logs
                    .lines()
                    .filter(|line| line.contains("\"error\""))
                    .collect();
                eprintln!("---- the proxy's errors ----\n{}", errors.join("\n"));
            }
            let _ = Command::new("docker").args(["rm", "-f", name]).output();
        }
    }
}

/// A scenario's running agent with its ingress: the proxy's port and the host it serves.
struct Ingress {
    port: u16,
    host: String,
}

/// Commits `text` as the first release, starts the agent with its ingress, and waits until
/// the 9 replicas run and the proxy balances over all of them (9 distinct host names
/// answer). Returns the ingress and the release's spec hash.
fn first_release(
    env: &mut Env,
    proxy: &mut ProxyGuard,
    text: &str,
) -> TestResult<(Ingress, String)> {
    env.repo.write("app/web.hcl", text)?;
    let v1 = env.repo.commit("web v1")?;
    let port = free_port()?;
    let caddy =
        std::env::var("VOODU_CADDY_IMAGE").unwrap_or_else(|_| "voodu-caddy:latest".to_owned());
    let flags = agent_flags(&caddy, &format!("127.0.0.1:{port}"));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    env.start_agent_with(&flags)?;
    let rows = env.converged(&v1, REPLICAS, None)?;
    let agent_id =
        voodu_agent::store::Store::open_read_only(&env.data_dir().join("state.db"))?.agent_id()?;
    proxy.0 = Some(format!("voodu-caddy-{agent_id}"));
    let ingress = Ingress {
        port,
        host: format!("{}.test", env.scope()),
    };
    let probe = Client::start(ingress.port, &ingress.host, Duration::from_millis(5));
    wait_until(LIMIT, "the proxy to balance over all 9 replicas", || {
        let hits = probe.hits();
        let recent = hits.iter().rev().take(4 * REPLICAS);
        let names: BTreeSet<&str> = recent
            .filter(|hit| hit.status == Some(200))
            .filter_map(|hit| hit.answer.split("shop-v1 ").nth(1))
            .filter_map(|rest| rest.split_whitespace().next())
            .collect();
        (names.len() == REPLICAS).then_some(())
    })
    .map_err(|error| {
        let hits = probe.hits();
        format!(
            "{error}; the last answers: {:#?}",
            &hits[hits.len().saturating_sub(3)..]
        )
    })?;
    drop(probe);
    Ok((ingress, rows[0].hash.clone()))
}

/// This scope's `web` row of `status --json`'s `rollouts`, if any.
pub(crate) fn rollout(env: &Env) -> Option<Value> {
    let status = env.status().ok()?;
    status["rollouts"]
        .as_array()?
        .iter()
        .find(|row| row["scope"] == env.scope() && row["name"] == "web")
        .cloned()
}

/// What was sampled while a rollout ran.
#[derive(Debug, Default)]
struct Watched {
    /// Every `share` the rollout row showed.
    shares: BTreeSet<u64>,
    /// The most running containers of another spec than the first release's at once.
    most_new: usize,
    /// The client's clock when the row first showed a share of 100 or a final phase.
    at_full: Option<Duration>,
}

/// Samples the rollout row and the containers until `done(row)`; the row and what was seen.
fn watch(
    env: &Env,
    old_hash: &str,
    client: Option<&Client>,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> TestResult<(Value, Watched)> {
    let mut watched = Watched::default();
    let row = wait_until(LIMIT, what, || {
        if let Ok(rows) = env.containers() {
            let new = rows
                .iter()
                .filter(|row| row.state == "running" && row.hash != old_hash)
                .count();
            watched.most_new = watched.most_new.max(new);
        }
        let row = rollout(env)?;
        if let Some(share) = row["share"].as_u64() {
            watched.shares.insert(share);
            let full = share >= 100 || row["phase"] == "promoted" || row["phase"] == "aborted";
            if full && watched.at_full.is_none() {
                watched.at_full = client.map(Client::now);
            }
        }
        done(&row).then_some(row)
    })?;
    Ok((row, watched))
}

/// Waits until the scope runs exactly the 9 replicas, all of spec `hash`; the client's
/// clock then.
fn only_spec(env: &Env, hash: &str, client: &Client) -> TestResult<Duration> {
    wait_until(LIMIT, "only the first release's replicas", || {
        let rows = env.containers().ok()?;
        let only = rows.len() == REPLICAS
            && rows
                .iter()
                .all(|row| row.state == "running" && row.hash == hash);
        only.then(|| client.now())
    })
}

/// Lets the client run `AFTER` past `since`, and on until it has had more than 120 answers
/// since then (the tests count on 100 after a proxy's drops are taken out), for at most 30 s:
/// on a loaded machine the client gets fewer answers a second (63 in 5 s once in CI).
fn run_past(client: &Client, since: Duration) {
    let answered = || client.hits().iter().filter(|hit| hit.at >= since).count();
    while client.now() < since + AFTER
        || (answered() <= 120 && client.now() < since + Duration::from_secs(30))
    {
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every number under a key named `key`, anywhere in `value`.
fn numbers_under(value: &Value, key: &str) -> Vec<f64> {
    fn all_numbers(value: &Value, out: &mut Vec<f64>) {
        match value {
            Value::Number(number) => out.extend(number.as_f64()),
            Value::Array(items) => items.iter().for_each(|item| all_numbers(item, out)),
            Value::Object(fields) => fields.values().for_each(|item| all_numbers(item, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    match value {
        Value::Array(items) => items
            .iter()
            .for_each(|item| out.extend(numbers_under(item, key))),
        Value::Object(fields) => {
            for (name, item) in fields {
                if name == key {
                    all_numbers(item, &mut out);
                } else {
                    out.extend(numbers_under(item, key));
                }
            }
        }
        _ => {}
    }
    out
}

/// `releases deployment/SCOPE/web --json` (the ingress is also named `web`).
pub(crate) fn releases(env: &Env) -> TestResult<Value> {
    let reference = format!("deployment/{}/web", env.scope());
    Ok(serde_json::from_str(
        &env.cli(&["releases", &reference, "--json"])?,
    )?)
}

/// The release of `commit` in `releases --json`, once it is in `phase`.
pub(crate) fn release_of(env: &Env, commit: &str, phase: &str) -> TestResult<Value> {
    wait_until(LIMIT, &format!("the release of {commit} {phase}"), || {
        let releases = releases(env).ok()?;
        releases["releases"]
            .as_array()?
            .iter()
            .find(|release| release["commit"] == commit && release["phase"] == phase)
            .cloned()
    })
    .map_err(|error| format!("{error}; releases: {:?}", releases(env)).into())
}

/// A short account of the errors among `hits`, for a failed assertion.
fn errors_told(hits: &[Hit]) -> String {
    let errors: Vec<String> = hits
        .iter()
        .filter(|hit| hit.is_error())
        .take(5)
        .map(|hit| {
            let when = hit
                .when
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            format!(
                "{:?} (unix {}.{:03}) {:?}: {:?}",
                hit.at,
                when.as_secs(),
                when.subsec_millis(),
                hit.status,
                hit.answer
            )
        })
        .collect();
    format!(
        "{} errors of {} requests; first: {errors:#?}",
        hits.iter().filter(|hit| hit.is_error()).count(),
        hits.len()
    )
}

/// The `voodu-agent status` text line of this deployment's rollout.
fn status_line(env: &Env) -> TestResult<String> {
    let text = env.cli(&["status"])?;
    Ok(text
        .lines()
        .find(|line| line.contains(&format!("deployment/{}/web canary", env.scope())))
        .unwrap_or_default()
        .to_owned())
}

#[test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
fn i51_a_canary_answering_500_is_aborted_at_its_first_step_within_its_share() -> TestResult {
    // The canary's pause and the analysis interval: after the 10 % step's replica is up
    // the agent pauses PAUSE, then sends its 20 samples spread over INTERVAL straight to
    // the canary, then aborts.
    const PAUSE: Duration = Duration::from_secs(2);
    const INTERVAL: Duration = Duration::from_secs(4);
    let analysis = "      interval = \"4s\"\n      http {\n        path              = \"/\"\n        samples           = 20\n        max_error_percent = 5\n      }\n";
    let mut proxy = ProxyGuard(None);
    Env::new()?.run(|env| {
        let scope = env.scope().to_owned();
        let good = serving_replica("shop-v1", 0);
        let (ingress, v1_hash) =
            first_release(env, &mut proxy, &manifest(&scope, &good, "2s", analysis))?;
        let client = Client::start(ingress.port, &ingress.host, EVERY);

        env.repo.write(
            "app/web.hcl",
            &manifest(&scope, &failing_replica(), "2s", analysis),
        )?;
        let v2 = env.repo.commit("web v2: answers 500")?;
        let (row, watched) = watch(env, &v1_hash, Some(&client), "the rollout aborted", |row| {
            row["phase"] == "aborted"
        })?;
        let gone = only_spec(env, &v1_hash, &client)?;
        run_past(&client, gone);
        let hits = ProxyLoads::from_log(&env.log())?.without_drops(client.stop())?;

        // The rollout: aborted at its first step, never past 10 %, one canary replica.
        assert_eq!(row["strategy"], "canary", "{row}");
        assert_eq!(row["step"], 0, "aborted at the first step: {row}");
        assert_eq!(row["verdict"], "failed", "{row}");
        assert!(
            watched.shares.iter().all(|share| *share <= 10),
            "the canary never went past 10 %: {:?}",
            watched.shares
        );
        assert_eq!(watched.most_new, 1, "one canary replica at 10 % of 9");
        let error_percent = numbers_under(&row["analysis"], "error_percent");
        assert!(
            error_percent.iter().any(|percent| *percent > 5.0),
            "the analysis measured the errors: {row}"
        );
        assert_eq!(
            row["analysis"]["http"]["via"], "ingress",
            "the analysis went through the ingress to the canary's own route: {row}"
        );
        let line = status_line(env)?;
        assert!(
            line.contains("aborted") && line.contains("analysis failed"),
            "{line}"
        );
        let failed = release_of(env, &v2, "failed")?;
        eprintln!("the failed release: {failed}");

        // The client. Errors are the bad canary's answers: it got traffic through the
        // ingress, so there are some.
        let errors: Vec<&Hit> = hits.iter().filter(|hit| hit.is_error()).collect();
        let (first, last) = match (errors.first(), errors.last()) {
            (Some(first), Some(last)) => (first.at, last.at),
            _ => return Err(format!("the canary got no traffic: {}", errors_told(&hits)).into()),
        };
        // The bound: in the canary's window (its first error to its last), the 10 % step
        // puts 1 canary among 10 upstreams and Caddy's round robin sends it 1 request in
        // 10, so errors ≤ window / 10, plus 2: the window opens on an error (k errors span
        // only 10(k-1)+1 requests), and a proxy config load (the canary joining, then
        // leaving) restarts the round robin, which may land on the canary once more. A
        // 50 % step (5 canaries of 14) would be a third of the requests.
        let window: Vec<&Hit> = hits
            .iter()
            .filter(|hit| hit.at >= first && hit.at <= last)
            .collect();
        eprintln!(
            "bad canary: {} errors among {} requests in its window of {:?} ({} requests in all)",
            errors.len(),
            window.len(),
            last - first,
            hits.len()
        );
        assert!(
            errors.len() <= window.len().div_ceil(10) + 2,
            "at most the first step's share: {} errors among {} requests",
            errors.len(),
            window.len()
        );
        assert!(
            errors.iter().all(|hit| hit.status == Some(500)),
            "every error is the canary's 500, no request failed: {}",
            errors_told(&hits)
        );
        // Aborted within one analysis interval: the canary serves (first error) through its
        // step's pause and one analysis interval, then leaves the routes (last error); 3 s
        // for the proxy's config loads and the passes between.
        assert!(
            last - first <= PAUSE + INTERVAL + Duration::from_secs(3),
            "the canary served from {first:?} to {last:?}: longer than its pause ({PAUSE:?}) \
             and one analysis interval ({INTERVAL:?})"
        );
        // Afterwards: no error while only the old replicas run.
        let after: Vec<&Hit> = hits.iter().filter(|hit| hit.at >= gone).collect();
        assert!(
            after.len() > 100,
            "{} requests after the abort",
            after.len()
        );
        assert!(
            after
                .iter()
                .all(|hit| hit.status == Some(200) && hit.answer.contains("shop-v1")),
            "no error after the abort: {}",
            errors_told(&hits[hits.len() - after.len()..])
        );
        assert!(
            hits.iter()
                .filter(|hit| !hit.is_error())
                .all(|hit| hit.answer.contains("shop-v1")),
            "only the old release answered 200"
        );
        Ok(())
    })
}

#[test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
fn i51_a_good_canary_passes_every_step_with_no_failed_request() -> TestResult {
    let analysis = "      interval = \"2s\"\n      http {\n        path              = \"/\"\n        samples           = 10\n        max_error_percent = 0\n      }\n";
    let mut proxy = ProxyGuard(None);
    Env::new()?.run(|env| {
        let scope = env.scope().to_owned();
        let v1_text = manifest(&scope, &serving_replica("shop-v1", 0), "2s", analysis);
        let (ingress, v1_hash) = first_release(env, &mut proxy, &v1_text)?;
        let client = Client::start(ingress.port, &ingress.host, EVERY);

        env.repo.write(
            "app/web.hcl",
            &manifest(&scope, &serving_replica("shop-v2", 0), "2s", analysis),
        )?;
        let v2 = env.repo.commit("web v2")?;
        let (row, watched) = watch(
            env,
            &v1_hash,
            Some(&client),
            "the rollout promoted",
            |row| row["phase"] == "promoted" || row["phase"] == "aborted",
        )?;
        let rows = env.converged(&v2, REPLICAS, Some(&v1_hash))?;
        let done = client.now();
        run_past(&client, done);
        let hits = ProxyLoads::from_log(&env.log())?.without_drops(client.stop())?;

        assert_eq!(row["phase"], "promoted", "{row}");
        assert_eq!(row["verdict"], "passed", "{row}");
        assert!(
            watched.shares.contains(&10) && watched.shares.contains(&50),
            "every step was taken: shares {:?}",
            watched.shares
        );
        assert!(
            rows.iter().all(|row| row.hash != v1_hash),
            "every replica is new: {rows:?}"
        );
        release_of(env, &v2, "succeeded")?;
        let line = status_line(env)?;
        assert!(line.contains("promoted"), "{line}");

        // The client: not one error, the new version shared with the old before 100 %,
        // then alone.
        eprintln!(
            "good canary: {} requests, shares seen {:?}",
            hits.len(),
            watched.shares
        );
        // Told apart: the steps (the canary beside the stable replicas), then the hand-over
        // at 100 % (the ordinary rollout retiring the stable replicas).
        let full = watched.at_full.ok_or("the rollout never showed 100 %")?;
        let (steps, handover): (Vec<Hit>, Vec<Hit>) =
            hits.iter().cloned().partition(|hit| hit.at < full);
        assert!(
            steps.iter().all(|hit| hit.status == Some(200)),
            "no failed request while the canary steps ran: {}",
            errors_told(&steps)
        );
        assert!(
            handover.iter().all(|hit| hit.status == Some(200)),
            "no failed request while the stable replicas were replaced at 100 %: {}",
            errors_told(&handover)
        );
        let first_new = hits
            .iter()
            .find(|hit| hit.answer.contains("shop-v2"))
            .ok_or("the new version never answered")?
            .at;
        assert!(
            first_new < full,
            "the canary answered before 100 % ({first_new:?} < {full:?})"
        );
        assert!(
            hits.iter()
                .any(|hit| hit.at > first_new && hit.at < full && hit.answer.contains("shop-v1")),
            "the old release went on serving beside the canary"
        );
        assert!(
            hits.iter()
                .filter(|hit| hit.at >= done)
                .all(|hit| hit.answer.contains("shop-v2")),
            "only the new release at the end"
        );
        Ok(())
    })
}

#[test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
fn i51_a_prometheus_analysis_aborts_a_canary_on_a_metric_it_exports() -> TestResult {
    let mut proxy = ProxyGuard(None);
    Env::new()?.run(|env| {
        let scope = env.scope().to_owned();
        // The first release needs no Prometheus (no rollout judges it); it is started once
        // the agent made its network, and the second release names its address.
        let placeholder = "      interval = \"2s\"\n      http {\n        path = \"/\"\n      }\n";
        let v1_text = manifest(&scope, &serving_replica("shop-v1", 0), "4s", placeholder);
        let (ingress, v1_hash) = first_release(env, &mut proxy, &v1_text)?;
        let prometheus = Prometheus::start(
            &format!("{scope}-prometheus"),
            "voodu0",
            &format!("web.{scope}"),
            env.dir.path(),
        )?;
        wait_until(LIMIT, "Prometheus to scrape the 9 replicas", || {
            let values = prometheus.query("app_bad").ok()?;
            (values.len() == REPLICAS && values.iter().all(|value| *value == 0.0)).then_some(())
        })
        .map_err(|error| format!("{error}; its log:\n{}", prometheus.logs()))?;

        // The new version answers 200 and exports app_bad 1: only the query can fail it.
        // The 10 % step's pause (4 s) gives Prometheus time to find the canary (its DNS
        // refresh and scrape are each 1 s) before the first measurement.
        let judged = format!(
            "      interval = \"2s\"\n      prometheus {{\n        url      = \"{}\"\n        query    = \"max(app_bad)\"\n        max      = 0\n        interval = \"1s\"\n        count    = 3\n      }}\n",
            prometheus.url()
        );
        let client = Client::start(ingress.port, &ingress.host, EVERY);
        env.repo.write(
            "app/web.hcl",
            &manifest(&scope, &serving_replica("shop-v2", 1), "4s", &judged),
        )?;
        let v2 = env.repo.commit("web v2: app_bad 1")?;
        let (row, watched) = watch(env, &v1_hash, Some(&client), "the rollout aborted", |row| {
            row["phase"] == "aborted" || row["phase"] == "promoted"
        })?;
        let gone = only_spec(env, &v1_hash, &client)?;
        run_past(&client, gone);
        let hits = ProxyLoads::from_log(&env.log())?.without_drops(client.stop())?;

        assert_eq!(row["phase"], "aborted", "{row}");
        assert_eq!(row["step"], 0, "aborted at the first step: {row}");
        assert_eq!(row["verdict"], "failed", "{row}");
        assert_eq!(watched.most_new, 1, "one canary replica at 10 % of 9");
        let measured = numbers_under(&row["analysis"], "measurements");
        assert!(
            measured.contains(&1.0),
            "status shows the measurement that failed it: {row}"
        );
        release_of(env, &v2, "failed")?;
        let line = status_line(env)?;
        assert!(line.contains("aborted"), "{line}");
        // The canary answered 200 throughout: nobody saw an error.
        assert!(
            hits.iter().all(|hit| hit.status == Some(200)),
            "no failed request: {}",
            errors_told(&hits)
        );
        assert!(
            hits.iter()
                .filter(|hit| hit.at >= gone)
                .all(|hit| hit.answer.contains("shop-v1")),
            "only the old release after the abort"
        );
        Ok(())
    })
}
