//! Issue 10, item 1, on a real engine: a commit asking for `replicas = 1e12` (which once
//! validated, and then aborted the reconciler on a 56 TB allocation at every restart) is
//! rejected whole at its `path:line:col`, next to a valid change that is not applied either;
//! the previously applied commit keeps running, and the agent keeps serving: `/healthz`
//! answers and a later good commit deploys.

use crate::e2e_docker::Env;
use crate::support::http::get_blocking;
use crate::support::{TestResult, test_image, wait_until};

const LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Where and what the rejection says.
const REJECTION: &str = "app/huge.hcl:3:3: `replicas` is 1000000000000, above the limit of 1000 replicas per resource on one host: lower it, or spread the load over more hosts";

#[test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
fn a_commit_asking_for_1e12_replicas_is_rejected_and_the_agent_keeps_serving() -> TestResult {
    Env::new()?.run(|env| {
        env.write_web(1, "1")?;
        let first = env.repo.commit("web")?;
        env.start_agent()?;
        let rows = env.converged(&first, 1, None)?;
        let hash_1 = rows[0].hash.clone();

        // A valid edit of web next to a resource past its bound: the commit is refused whole.
        env.write_web(1, "2")?;
        env.repo.write(
            "app/huge.hcl",
            &format!(
                r#"deployment "{}" "huge" {{
  image    = "{}"
  replicas = 1e12
}}
"#,
                env.scope(),
                test_image()
            ),
        )?;
        let huge = env.repo.commit("huge")?;
        let rejected = wait_until(LIMIT, "the 1e12 commit to be rejected", || {
            let status = env.status().ok()?;
            (status["last_rejected"]["sha"] == huge.as_str())
                .then(|| status["last_rejected"].clone())
        })?;
        assert_eq!(rejected["outcome"], "rejected");
        assert_eq!(rejected["errors"], serde_json::json!([REJECTION]));
        let status = env.status()?;
        assert_eq!(
            status["last_applied"]["sha"],
            first.as_str(),
            "the host keeps the last good commit"
        );
        assert_eq!(
            env.containers()?,
            rows,
            "web keeps running as the first commit left it"
        );

        // The agent still serves: health, and the next good commit deploys.
        let (code, _) = get_blocking(&env.http_address()?, "/healthz")?;
        assert_eq!(code, 200, "/healthz answers");
        env.repo.remove("app/huge.hcl")?;
        let fixed = env.repo.commit("drop huge")?;
        let rows = env.converged(&fixed, 1, Some(&hash_1))?;
        assert_eq!(rows.len(), 1);
        let (code, _) = get_blocking(&env.http_address()?, "/healthz")?;
        assert_eq!(code, 200, "/healthz still answers");
        Ok(())
    })
}
