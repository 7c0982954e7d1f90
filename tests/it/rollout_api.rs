//! `POST /api/rollouts/{scope}/{name}/promote|abort` (issue 51) on an in-process agent over
//! the fake runtime: authenticated with the webhook secret (a bearer token or the generic
//! signature), refused without it or from a browser; 404 for an unknown deployment, 409 with
//! no rollout in flight; a request is recorded in the activity log (as the caller) and the
//! outbox, and the paused canary moves on; the deployment's dashboard page shows the rollout
//! and its history.

use std::time::Duration;

use voodu_agent::http::WebhookSecret;
use voodu_agent::model::{Kind, ResourceKey};
use voodu_agent::store::{Phase, RolloutPhase};

use crate::support::http::client;
use crate::support::{TempRepo, TestAgent, TestAgentOptions, TestResult};

const SECRET: &str = "api-secret";

/// Two replicas at `version`, a canary paused at 50 % until promoted.
fn web(version: &str) -> String {
    format!(
        r#"deployment "shop" "web" {{
  image    = "busybox"
  command  = ["sleep", "3600"]
  replicas = 2
  env      = {{ V = "{version}" }}
  canary {{
    step {{
      weight = 50
      pause  = "until_promoted"
    }}
    step {{ weight = 100 }}
  }}
}}
"#
    )
}

/// POST `path` with `headers`: status and JSON body.
async fn post(
    agent: &TestAgent,
    path: &str,
    headers: &[(&str, &str)],
) -> TestResult<(u16, serde_json::Value)> {
    let mut request = client()?.post(agent.url(path)).body("{}");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await?;
    let status = response.status().as_u16();
    let text = response.text().await?;
    let body = serde_json::from_str(&text).map_err(|error| format!("{error}: {text}"))?;
    Ok((status, body))
}

#[tokio::test]
async fn promote_and_abort_are_authenticated_api_calls_recorded_as_the_caller() -> TestResult {
    let repo = TempRepo::new()?;
    repo.write("web.hcl", &web("1"))?;
    let first = repo.commit("web 1")?;
    let agent = TestAgent::start(
        repo,
        TestAgentOptions {
            secret: Some(SECRET.to_owned()),
            ..TestAgentOptions::default()
        },
    )
    .await?;
    agent.applied(&first).await?;
    let key = ResourceKey::new(Kind::Deployment, "shop", "web");
    agent
        .until("web Ready", |store| {
            Ok(store
                .status(&key)?
                .filter(|status| status.phase == Phase::Ready)
                .map(|_| ()))
        })
        .await?;
    let bearer = format!("Bearer {SECRET}");
    let promote = "/api/rollouts/shop/web/promote";

    // Nothing in flight yet: a clear 409, nothing recorded.
    let (status, body) = post(&agent, promote, &[("authorization", &bearer)]).await?;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["result"], "no_rollout", "{body}");
    assert!(
        body["reason"]
            .as_str()
            .is_some_and(|reason| reason.contains("no canary or blue/green rollout is in flight")),
        "{body}"
    );
    // An unknown deployment: 404.
    let (status, body) = post(
        &agent,
        "/api/rollouts/shop/nope/abort",
        &[("authorization", &bearer)],
    )
    .await?;
    assert_eq!(
        (status, &body["result"]),
        (404, &"not_found".into()),
        "{body}"
    );

    // The second version rolls out as a canary, paused at 50 % until promoted.
    agent.repo.write("web.hcl", &web("2"))?;
    let second = agent.repo.commit("web 2")?;
    let secret = WebhookSecret::new(SECRET);
    let hook = client()?
        .post(agent.url("/hooks/git?wait=true"))
        .header("x-voodu-signature", secret.sign(b"{}"))
        .body("{}")
        .send()
        .await?;
    assert!(hook.status().is_success(), "{:?}", hook.text().await?);
    agent.applied(&second).await?;
    let paused = agent
        .until("the canary paused", |store| {
            Ok(store
                .rollout_state("shop", "web")?
                .filter(|state| state.phase == RolloutPhase::Paused))
        })
        .await?;
    assert_eq!((paused.step, paused.share), (0, 50), "{paused:?}");

    // Refused: no credential, a wrong one, the dashboard's Basic password, a browser's
    // request (even with the secret). None of them is recorded.
    let refusals: &[(&[(&str, &str)], u16)] = &[
        (&[], 401),
        (&[("authorization", "Bearer wrong")], 401),
        (&[("authorization", "Basic YWRtaW46YXBpLXNlY3JldA==")], 401), // admin:api-secret
        (&[("x-voodu-signature", "sha256=00")], 401),
        (
            &[
                ("authorization", &bearer),
                ("origin", "https://evil.example"),
            ],
            403,
        ),
    ];
    for (headers, expected) in refusals {
        let (status, body) = post(&agent, promote, headers).await?;
        assert_eq!(status, *expected, "{headers:?}: {body}");
    }
    assert!(
        agent
            .store
            .activity(0, 100)?
            .0
            .iter()
            .all(|row| row.action != "rollout.promote"),
        "a refused request records nothing"
    );

    // The generic webhook signature and the bearer token both authenticate; the actor is
    // the caller's.
    let (status, body) = post(
        &agent,
        promote,
        &[("authorization", &bearer), ("x-voodu-actor", "ops-bot")],
    )
    .await?;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["result"], "requested", "{body}");
    assert_eq!(body["resource"], "deployment/shop/web", "{body}");
    assert_eq!(body["rollout"]["share"], 50, "{body}");
    assert_eq!(body["rollout"]["promote_requested"], true, "{body}");
    let row = agent
        .store
        .activity(0, 100)?
        .0
        .into_iter()
        .find(|row| row.action == "rollout.promote")
        .ok_or("no rollout.promote row")?;
    assert_eq!(
        (row.origin.as_str(), row.actor.as_deref()),
        ("http", Some("ops-bot"))
    );
    assert_eq!(row.data["share"], 50);
    let events: Vec<String> = agent
        .store
        .events_after(0, 500)?
        .into_iter()
        .filter(|event| event.resource == "deployment/shop/web")
        .map(|event| event.event)
        .filter(|event| event.starts_with("rollout."))
        .collect();
    assert!(
        events.contains(&"rollout.promoted".to_owned()),
        "{events:?}"
    );

    // The promote moves the canary on: past 50 %, to the end of the rollout.
    let done = agent
        .until_within(Duration::from_secs(60), "the canary promoted", |store| {
            Ok(store
                .rollout_state("shop", "web")?
                .filter(|state| state.phase == RolloutPhase::Promoted))
        })
        .await?;
    assert_eq!(done.share, 100, "{done:?}");
    // Over: nothing more to promote or abort.
    let signed = secret.sign(b"{}");
    let (status, body) = post(
        &agent,
        "/api/rollouts/shop/web/abort",
        &[("x-voodu-signature", &signed)],
    )
    .await?;
    assert_eq!(
        (status, &body["result"]),
        (409, &"no_rollout".into()),
        "{body}"
    );

    // The dashboard shows the rollout and its history, with the step, share and who asked.
    let page = client()?
        .get(agent.url("/ui/resource/deployment/shop/web"))
        .send()
        .await?
        .text()
        .await?;
    let section = page
        .split("<section id=\"rollout\">")
        .nth(1)
        .ok_or("no rollout section")?;
    assert!(
        section.contains("<span id=\"rollout-step-text\">step 2/2</span>"),
        "{section}"
    );
    assert!(
        section.contains("<span class=\"share current\" data-step=\"1\">100 %</span>"),
        "{section}"
    );
    assert!(
        section.contains("<span class=\"badge good\">promoted</span>"),
        "{section}"
    );
    assert!(section.contains("http (ops-bot)"), "{section}");
    assert!(
        section.contains("<td>rollout.promote</td><td>step 1, 50 %</td>"),
        "{section}"
    );
    let timeline = page
        .split("<section id=\"timeline\">")
        .nth(1)
        .ok_or("no timeline")?;
    assert!(timeline.contains("(step 1, 50 %)"), "{timeline}");
    // The page's live document carries the same, for `app.js`.
    let stream = client()?
        .get(agent.url("/ui/events?resource=deployment/shop/web"))
        .send()
        .await?;
    let document = crate::dashboard::first_event(stream).await?;
    assert_eq!(document["rollout"]["phase"], "promoted", "{document}");
    assert_eq!(document["rollout"]["step"], "step 2/2", "{document}");
    assert!(
        document["rollout"]["history"]
            .as_array()
            .is_some_and(|rows| rows.iter().any(|row| row[1] == "rollout.promote"
                && row[2] == "step 1, 50 %"
                && row[3] == "http (ops-bot)")),
        "{document}"
    );
    agent.stop().await
}
