//! Start-up order on a real engine (issue 52): the agent binary, a statefulset `db` whose
//! readiness probe passes only once its pod has run 6 s, and a deployment `web` with
//! `depends_on { resources = ["statefulset/<scope>/db"] }`, pushed in one commit. From
//! `docker events` (create and start times per container) and the agent's records
//! (readiness, status): web's first container is created after db's pod was published ready,
//! and web's status said what it waited for meanwhile. The fake-runtime twin: `depends`.

use std::time::{Duration, SystemTime};

use serde_json::Value;

use crate::e2e_docker::{Env, Events};
use crate::support::{TestResult, test_image, wait_until};

const LIMIT: Duration = Duration::from_secs(90);

/// How long db's pod runs before its readiness probe can pass.
const DB_WARM_UP: f64 = 6.0;

fn manifests(scope: &str) -> String {
    let image = test_image();
    format!(
        r#"statefulset "{scope}" "db" {{
  image   = "{image}"
  command = ["sh", "-c", "sleep 6; touch /tmp/ready; exec sleep 3600"]
  probes {{
    readiness {{
      exec {{ command = ["sh", "-c", "test -f /tmp/ready"] }}
      period = "1s"
    }}
  }}
}}

deployment "{scope}" "web" {{
  image    = "{image}"
  command  = ["sleep", "3600"]
  replicas = 2
  depends_on {{
    resources = ["statefulset/{scope}/db"]
  }}
}}
"#
    )
}

/// The status row of `kind/<scope>/name` in `status --json`, if listed.
fn resource(env: &Env, kind: &str, name: &str) -> Option<Value> {
    let status = env.status().ok()?;
    status["resources"]
        .as_array()?
        .iter()
        .find(|row| row["kind"] == kind && row["scope"] == env.scope() && row["name"] == name)
        .cloned()
}

#[test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
fn a_deployment_is_created_only_after_the_statefulset_it_depends_on_is_ready() -> TestResult {
    Env::new()?.run(|env| {
        let scope = env.scope().to_owned();
        let events = Events::start(&scope, SystemTime::now(), env.dir.path().join("events.log"))?;
        env.repo.write("shop.hcl", &manifests(&scope))?;
        env.repo.commit("db and web")?;
        env.start_agent()?;
        // While db warms up, web says what it waits for, and has no container.
        let waiting = format!("waiting for statefulset/{scope}/db (");
        let message = wait_until(LIMIT, "web's status to say what it waits for", || {
            let web = resource(env, "deployment", "web")?;
            let message = web["message"].as_str()?.to_owned();
            message.starts_with(&waiting).then_some(message)
        })?;
        assert!(
            env.containers()?
                .iter()
                .all(|row| !row.name.starts_with(&format!("{scope}-web"))),
            "web has no container while it waits ({message})"
        );
        // Both converge.
        wait_until(LIMIT, "db and web Ready", || {
            let db = resource(env, "statefulset", "db")?;
            let web = resource(env, "deployment", "web")?;
            (db["phase"] == "Ready" && web["phase"] == "Ready" && web["running_replicas"] == 2)
                .then_some(())
        })?;
        let web_prefix = format!("{scope}-web.");
        let db_pod = format!("{scope}-db.0");
        let events = events.timed_once(LIMIT, |events| {
            events
                .iter()
                .filter(|(_, action, name, _)| action == "create" && name.starts_with(&web_prefix))
                .count()
                >= 2
        })?;
        let time_of = |action: &str, matches: &dyn Fn(&str) -> bool| {
            events
                .iter()
                .find(|(_, seen, name, _)| seen == action && matches(name))
                .map(|(at, ..)| *at)
                .ok_or_else(|| format!("no {action} event in {events:#?}"))
        };
        let db_started = time_of("start", &|name| name == db_pod)?;
        let web_created = time_of("create", &|name| name.starts_with(&web_prefix))?;
        // db cannot be ready before its pod ran DB_WARM_UP: the engine's own clock says web
        // was created after that.
        assert!(
            web_created >= db_started + DB_WARM_UP,
            "web created at {web_created}, db started at {db_started}: {events:#?}"
        );
        // The agent's record: db's pod published ready, no later than web's first create.
        let store = voodu_agent::store::Store::open_read_only(&env.data_dir().join("state.db"))?;
        let db_key = voodu_agent::model::ResourceKey::new(
            voodu_agent::model::Kind::Statefulset,
            scope.as_str(),
            "db",
        );
        let readiness = store.readiness(&db_key)?;
        let ready_at = readiness
            .iter()
            .find(|row| row.container == db_pod && row.ready)
            .map(|row| row.updated_at)
            .ok_or_else(|| format!("db's pod is not recorded ready: {readiness:?}"))?;
        // `updated_at` is whole seconds, rounded down.
        assert!(
            web_created >= ready_at as f64,
            "web created at {web_created}, db recorded ready at {ready_at}"
        );
        Ok(())
    })
}
