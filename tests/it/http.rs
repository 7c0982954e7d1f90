//! The HTTP side against the real router on `127.0.0.1:0`: webhooks of every provider signed
//! right and wrong, oversize bodies, other branches and events; then the in-process agent
//! behind it: `?wait=true` outcomes, `/status` = `status --json`, `/releases`, a parsed
//! `/metrics` scrape, local ref changes, the `sync` command, and a handful of webhooks for one commit.

use std::io::{Read as _, Write as _};
use std::time::Duration;

use futures_util::StreamExt as _;
use voodu_agent::http::{self, HttpOptions, WebhookSecret};
use voodu_agent::model::CommitSha;

use crate::support::http::{
    TestRouter, client, flood, get, metric, parse_metrics, post, push_body,
};
use crate::support::{TempRepo, TestAgent, TestAgentOptions, TestResult};

const SECRET: &str = "webhook-test-secret";
const SHA: &str = "89abcdef0123456789abcdef0123456789abcdef";

/// The router alone with the test secret and a 4 KiB body cap.
async fn router_with_secret() -> TestResult<TestRouter> {
    TestRouter::start(
        "127.0.0.1:0",
        HttpOptions {
            secret: Some(WebhookSecret::new(SECRET)),
            max_body_bytes: 4096,
            ..HttpOptions::default()
        },
    )
    .await
}

fn secret() -> WebhookSecret {
    WebhookSecret::new(SECRET)
}

/// Provider headers for `body`, signed with `key` (a wrong key makes a wrong signature).
fn provider_headers(
    provider: &str,
    key: &WebhookSecret,
    body: &[u8],
) -> Vec<(&'static str, String)> {
    match provider {
        "github" => vec![
            ("x-github-event", "push".into()),
            ("x-hub-signature-256", key.sign(body)),
        ],
        "gitlab" => vec![
            ("x-gitlab-event", "Push Hook".into()),
            (
                "x-gitlab-token",
                if *key == secret() {
                    SECRET.into()
                } else {
                    "wrong-token".into()
                },
            ),
        ],
        "gitea" => vec![
            ("x-gitea-event", "push".into()),
            ("x-gitea-signature", key.hmac_hex(body)),
        ],
        "forgejo" => vec![
            ("x-forgejo-event", "push".into()),
            ("x-forgejo-signature", key.hmac_hex(body)),
            // Forgejo also sends Gitea's header; a wrong one there must not matter.
            ("x-gitea-signature", "00".repeat(32)),
        ],
        _ => vec![("x-voodu-signature", key.sign(body))],
    }
}

#[tokio::test]
async fn every_provider_is_accepted_when_signed_right_and_refused_when_not() -> TestResult {
    let mut router = router_with_secret().await?;
    let client = client()?;
    let body = push_body("main", SHA);
    let wrong = WebhookSecret::new("not-the-secret");
    for provider in ["github", "gitlab", "gitea", "forgejo", "generic"] {
        let (status, answer) = post(
            &client,
            &router.hook(),
            &provider_headers(provider, &secret(), &body),
            body.clone(),
        )
        .await?;
        assert_eq!(status, 202, "{provider}: {answer}");
        assert_eq!(answer["provider"], provider);
        assert_eq!(answer["commit"], SHA);
        assert!(
            ["accepted", "coalesced"].contains(&answer["result"].as_str().unwrap_or_default()),
            "{provider}: {answer}"
        );

        let (status, answer) = post(
            &client,
            &router.hook(),
            &provider_headers(provider, &wrong, &body),
            body.clone(),
        )
        .await?;
        assert_eq!(status, 401, "{provider} wrongly signed: {answer}");
        assert_eq!(answer["result"], "unauthorized");

        // Signed right, but the body was changed on the way (GitLab's token does not cover
        // the body, so it has no such case).
        if provider != "gitlab" {
            let mut tampered = body.clone();
            tampered.extend_from_slice(b" ");
            let (status, _) = post(
                &client,
                &router.hook(),
                &provider_headers(provider, &secret(), &body),
                tampered,
            )
            .await?;
            assert_eq!(status, 401, "{provider} tampered body");
        }
    }
    assert!(router.fetch_requested(), "good requests asked for a fetch");
    // Unsigned, with a secret configured.
    let (status, answer) = post(&client, &router.hook(), &[], body.clone()).await?;
    assert_eq!(status, 401);
    assert!(
        answer["reason"]
            .as_str()
            .is_some_and(|reason| reason.starts_with("missing X-Voodu-Signature header")),
        "{answer}"
    );
    assert!(
        !router.fetch_requested(),
        "refused requests ask for nothing"
    );
    assert_eq!(router.metrics.syncs_total(), 0);
    Ok(())
}

/// Issue 13: Gogs, Bitbucket Cloud, Bitbucket Server and Azure DevOps, each with the push
/// sample its documentation gives (`tests/fixtures/webhooks/README.md` names the sources):
/// 202 and a fetch when signed right, 401 naming the expected header when signed wrong.
#[tokio::test]
async fn documented_pushes_of_gogs_bitbucket_and_azure_devops_are_checked() -> TestResult {
    let mut router = router_with_secret().await?;
    let client = client()?;
    fn basic(key: &WebhookSecret) -> String {
        let password = if *key == secret() { SECRET } else { "wrong" };
        format!("Basic {}", base64(format!("azure:{password}").as_bytes()))
    }
    type Sign = dyn Fn(&WebhookSecret, &[u8]) -> Vec<(&'static str, String)>;
    let cases: [(&str, &str, &str, &str, &Sign); 4] = [
        (
            "gogs",
            include_str!("../fixtures/webhooks/gogs-push.json"),
            "bffeb74224043ba2feb48d137756c8a9331c449a",
            "X-Gogs-Signature",
            &|key, body| {
                vec![
                    ("x-gogs-event", "push".into()),
                    (
                        "x-gogs-delivery",
                        "f6266f16-1bf3-46a5-9ea4-602e06ead473".into(),
                    ),
                    ("x-gogs-signature", key.hmac_hex(body)),
                ]
            },
        ),
        (
            "bitbucket-cloud",
            include_str!("../fixtures/webhooks/bitbucket-cloud-push.json"),
            "709d658dc5b6d6afcd46049c2f332ee3f515a67d",
            "X-Hub-Signature",
            &|key, body| {
                vec![
                    ("x-event-key", "repo:push".into()),
                    ("x-hook-uuid", "0d4e2c5a-7a51-4c1e-9a1b-2f6f3c0d9e11".into()),
                    (
                        "x-request-uuid",
                        "5b2b0c3e-1f7d-4b8e-a2c4-7e9d1f0a6b33".into(),
                    ),
                    ("x-hub-signature", key.sign(body)),
                ]
            },
        ),
        (
            "bitbucket-server",
            include_str!("../fixtures/webhooks/bitbucket-server-push.json"),
            "178864a7d521b6f5e720b386b2c2b0ef8563e0dc",
            "X-Hub-Signature",
            &|key, body| {
                vec![
                    ("x-event-key", "repo:refs_changed".into()),
                    (
                        "x-request-id",
                        "c2b6a1f0-3d4e-4f5a-8b9c-0d1e2f3a4b5c".into(),
                    ),
                    ("x-hub-signature", key.sign(body)),
                ]
            },
        ),
        (
            "azure-devops",
            include_str!("../fixtures/webhooks/azure-devops-push.json"),
            "33b55f7cb7e7e245323987634f960cf4a6e6bc74",
            "Authorization",
            &|key, _| {
                vec![
                    (
                        "x-vss-activityid",
                        "7f3e2d1c-0b9a-4867-9564-3a2b1c0d9e8f".into(),
                    ),
                    ("authorization", basic(key)),
                ]
            },
        ),
    ];
    let wrong = WebhookSecret::new("not-the-secret");
    for (provider, body, after, header, sign) in cases {
        let body = body.as_bytes().to_vec();
        let (status, answer) = post(
            &client,
            &router.hook(),
            &sign(&secret(), &body),
            body.clone(),
        )
        .await?;
        assert_eq!(status, 202, "{provider}: {answer}");
        assert_eq!(answer["provider"], provider);
        assert_eq!(answer["commit"], after, "{provider}");
        assert!(router.fetch_requested(), "{provider}");

        let (status, answer) =
            post(&client, &router.hook(), &sign(&wrong, &body), body.clone()).await?;
        assert_eq!(status, 401, "{provider} wrongly signed: {answer}");
        assert_eq!(answer["provider"], provider);
        let reason = answer["reason"].as_str().unwrap_or_default();
        assert!(reason.starts_with(header), "{provider}: {reason}");

        let unsigned: Vec<(&'static str, String)> = sign(&secret(), &body)
            .into_iter()
            .filter(|(name, _)| !name.eq_ignore_ascii_case(header))
            .collect();
        let (status, answer) = post(&client, &router.hook(), &unsigned, body.clone()).await?;
        assert_eq!(status, 401, "{provider} unsigned: {answer}");
        let reason = answer["reason"].as_str().unwrap_or_default();
        assert!(
            reason.starts_with(&format!(
                "missing {header} header ({provider} sends {header}:"
            )),
            "{provider}: {reason}"
        );
        assert!(
            !router.fetch_requested(),
            "{provider}: refusals ask for nothing"
        );
    }
    Ok(())
}

/// Standard base64 (RFC 4648), for a basic-authentication header.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let group = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let bits = u32::from_be_bytes([0, group[0], group[1], group[2]]);
        for index in 0..4 {
            if index <= chunk.len() {
                out.push(char::from(
                    ALPHABET[(bits >> (18 - 6 * index)) as usize & 63],
                ));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[tokio::test]
async fn without_a_secret_unsigned_pushes_are_accepted_on_loopback() -> TestResult {
    let mut router = TestRouter::start("127.0.0.1:0", HttpOptions::default()).await?;
    let (status, answer) = post(&client()?, &router.hook(), &[], push_body("main", SHA)).await?;
    assert_eq!((status, answer["result"].as_str()), (202, Some("accepted")));
    assert!(router.fetch_requested());
    // Off loopback, no secret: refused before binding.
    match http::bind("0.0.0.0:0".parse()?, &HttpOptions::default()).await {
        Err(http::Error::InsecureListen { .. }) => {}
        other => return Err(format!("expected InsecureListen, got {other:?}").into()),
    }
    Ok(())
}

#[tokio::test]
async fn oversize_bodies_are_refused_with_413() -> TestResult {
    let mut router = router_with_secret().await?;
    let big = vec![b' '; 4097];
    let headers = provider_headers("github", &secret(), &big);
    let (status, answer) = post(&client()?, &router.hook(), &headers, big.clone()).await?;
    assert_eq!(
        (status, answer["result"].as_str()),
        (413, Some("too_large"))
    );
    assert_eq!(answer["reason"], "body larger than 4096 bytes");
    // Without a Content-Length (chunked), the cap holds while reading. A raw socket on a
    // blocking thread, so the server keeps running on this test's runtime.
    let address = router.address;
    let response = tokio::task::spawn_blocking(move || -> std::io::Result<String> {
        let mut stream = std::net::TcpStream::connect(address)?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut request = String::from(
            "POST /hooks/git HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n",
        );
        for (name, value) in &headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        // One write: the server answers 413 and closes once the cap is crossed, and a write
        // after that close fails (EPIPE) instead of reading the answer.
        let mut bytes = request.into_bytes();
        for chunk in big.chunks(1000) {
            bytes.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
            bytes.extend_from_slice(chunk);
            bytes.extend_from_slice(b"\r\n");
        }
        bytes.extend_from_slice(b"0\r\n\r\n");
        stream.write_all(&bytes)?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        Ok(response)
    })
    .await??;
    assert!(response.starts_with("HTTP/1.1 413"), "{response}");
    assert!(!router.fetch_requested());
    assert_eq!(
        router_metric(&router, "voodu_webhook_requests_total", "too_large").await?,
        2.0
    );
    Ok(())
}

async fn router_metric(router: &TestRouter, name: &str, result: &str) -> TestResult<f64> {
    let (_, text) = get(&client()?, &format!("http://{}/metrics", router.address)).await?;
    Ok(metric(&parse_metrics(&text)?, name, &[("result", result)]))
}

#[tokio::test]
async fn pushes_to_other_branches_and_other_events_are_answered_202_and_ignored() -> TestResult {
    let mut router = router_with_secret().await?;
    let client = client()?;
    let body = push_body("feature/x", SHA);
    let (status, answer) = post(
        &client,
        &router.hook(),
        &provider_headers("github", &secret(), &body),
        body,
    )
    .await?;
    assert_eq!(status, 202);
    assert_eq!(answer["result"], "ignored");
    assert_eq!(
        answer["reason"],
        "push to refs/heads/feature/x; this agent deploys refs/heads/main"
    );
    let body = br#"{"object_kind":"merge_request"}"#.to_vec();
    let headers = vec![
        ("x-gitlab-event", "Merge Request Hook".to_owned()),
        ("x-gitlab-token", SECRET.to_owned()),
    ];
    let (status, answer) = post(&client, &router.hook(), &headers, body).await?;
    assert_eq!((status, answer["result"].as_str()), (202, Some("ignored")));
    let body = br#"{"zen":"Keep it logically awesome."}"#.to_vec();
    let mut headers = provider_headers("github", &secret(), &body);
    headers[0].1 = "ping".into();
    let (status, answer) = post(&client, &router.hook(), &headers, body).await?;
    assert_eq!((status, answer["result"].as_str()), (200, Some("pong")));
    assert!(!router.fetch_requested(), "none of these syncs");
    // GitHub's form encoding carries the same push.
    let form = form_body(&push_body("main", SHA));
    let mut headers = provider_headers("github", &secret(), &form);
    headers.push(("content-type", "application/x-www-form-urlencoded".into()));
    let (status, answer) = post(&client, &router.hook(), &headers, form).await?;
    assert_eq!((status, answer["commit"].as_str()), (202, Some(SHA)));
    assert!(router.fetch_requested());
    Ok(())
}

fn form_body(json: &[u8]) -> Vec<u8> {
    let mut out = b"payload=".to_vec();
    for byte in json {
        if byte.is_ascii_alphanumeric() {
            out.push(*byte);
        } else {
            out.extend_from_slice(format!("%{byte:02X}").as_bytes());
        }
    }
    out
}

#[tokio::test]
async fn wait_times_out_with_504_when_no_fetch_answers() -> TestResult {
    // The test holds the receiver and runs no sync loop, so the fetch never ends.
    let router = TestRouter::start("127.0.0.1:0", HttpOptions::default()).await?;
    let url = format!("{}?wait=true&timeout=50ms", router.hook());
    let (status, answer) = post(&client()?, &url, &[], push_body("main", SHA)).await?;
    assert_eq!((status, answer["result"].as_str()), (504, Some("timeout")));
    assert_eq!(
        answer["reason"],
        "not applied or rejected within 50ms; the sync goes on in the background"
    );
    Ok(())
}

#[tokio::test]
async fn a_burst_for_one_sha_asks_for_one_fetch() -> TestResult {
    let mut router = router_with_secret().await?;
    let client = client()?;
    let body = push_body("main", SHA);
    let headers = provider_headers("gitea", &secret(), &body);
    let hook = router.hook();
    let answers: Vec<TestResult<(u16, serde_json::Value)>> = futures_util::stream::iter(0..200)
        .map(|_| post(&client, &hook, &headers, body.clone()))
        .buffer_unordered(50)
        .collect()
        .await;
    let mut results = std::collections::BTreeMap::<String, usize>::new();
    for answer in answers {
        let (status, answer) = answer?;
        assert_eq!(status, 202);
        *results
            .entry(answer["result"].as_str().unwrap_or_default().to_owned())
            .or_default() += 1;
    }
    assert_eq!(results.get("accepted"), Some(&1), "{results:?}");
    assert_eq!(results.get("coalesced"), Some(&199), "{results:?}");
    assert!(router.fetch_requested());
    assert!(!router.fetch_requested(), "one fetch for the burst");
    assert_eq!(router.requests.fetches_started(), 1);
    Ok(())
}

// ---- the in-process agent behind the router ---------------------------------------------

fn web(replicas: u32, env: &str) -> String {
    format!(
        r#"deployment "shop" "web" {{
  image = "busybox"
  command = ["sleep", "3600"]
  replicas = {replicas}
  env = {{ V = "{env}" }}
}}
"#
    )
}

/// A repo with `web` committed, and the agent started on it with `options`; returns after
/// the first commit is applied.
async fn agent_with_web(options: TestAgentOptions) -> TestResult<(TestAgent, String)> {
    let repo = TempRepo::new()?;
    repo.write("web.hcl", &web(2, "1"))?;
    let first = repo.commit("web")?;
    let agent = TestAgent::start(repo, options).await?;
    agent.applied(&first).await?;
    Ok((agent, first))
}

/// Waits until the agent's status shows `shop/web` Ready.
async fn web_ready(agent: &TestAgent) -> TestResult {
    let key =
        voodu_agent::model::ResourceKey::new(voodu_agent::model::Kind::Deployment, "shop", "web");
    agent
        .until("web Ready", |store| {
            Ok(store
                .status(&key)?
                .filter(|status| status.phase == "Ready")
                .map(|_| ()))
        })
        .await
}

fn signed(agent: &TestAgent, body: &[u8]) -> Vec<(&'static str, String)> {
    match &agent.secret {
        Some(secret) => vec![("x-hub-signature-256", secret.sign(body))],
        None => Vec::new(),
    }
}

#[tokio::test]
async fn wait_true_answers_with_the_outcome_of_the_pushed_commit() -> TestResult {
    let (agent, _) = agent_with_web(TestAgentOptions {
        secret: Some(SECRET.into()),
        ..TestAgentOptions::default()
    })
    .await?;
    let client = client()?;
    let hook = agent.url("/hooks/git?wait=true");

    agent.repo.write("web.hcl", &web(3, "2"))?;
    let good = agent.repo.commit("web: V=2")?;
    let body = push_body("main", &good);
    let (status, answer) = post(&client, &hook, &signed(&agent, &body), body).await?;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["result"], "applied");
    assert_eq!(answer["commit"], good.as_str());
    // Applied means in desired state, already when the answer arrives.
    let last = agent
        .store
        .commit_summary()?
        .last_applied
        .ok_or("applied")?;
    assert_eq!(last.sha.as_str(), good);

    agent.repo.write(
        "web.hcl",
        r#"deployment "shop" "web" {
  imge = "x"
}
"#,
    )?;
    let bad = agent.repo.commit("typo")?;
    let body = push_body("main", &bad);
    let (status, answer) = post(&client, &hook, &signed(&agent, &body), body).await?;
    assert_eq!(status, 422, "{answer}");
    assert_eq!(answer["result"], "rejected");
    assert_eq!(
        answer["errors"][0],
        "web.hcl:2:3: unknown attribute `imge` in deployment (did you mean `image`?)"
    );

    // An older SHA that was applied once: the branch has moved past it (issue 10).
    let body = push_body("main", &good);
    let (status, answer) = post(&client, &hook, &signed(&agent, &body), body).await?;
    assert_eq!(
        (status, answer["result"].as_str()),
        (409, Some("superseded")),
        "{answer}"
    );
    assert_eq!(answer["commit"], good.as_str());
    assert_eq!(answer["branch_tip"], bad.as_str());

    // A SHA the branch never had as its tip: the fetch sees another tip.
    let body = push_body("main", &"1".repeat(40));
    let (status, answer) = post(&client, &hook, &signed(&agent, &body), body).await?;
    assert_eq!(
        (status, answer["result"].as_str()),
        (409, Some("superseded"))
    );
    assert_eq!(answer["branch_tip"], bad.as_str());

    // Issue 13: a real commit that is not on the branch (pushed to another one) is only a
    // hint: the agent deploys what main points to after its own fetch, and says so.
    agent.repo.git(&["checkout", "-q", "-b", "elsewhere"])?;
    agent.repo.write("web.hcl", &web(3, "evil"))?;
    agent.repo.git(&["add", "-A"])?;
    agent.repo.git(&["commit", "-q", "-m", "not on main"])?;
    let elsewhere = agent.repo.head()?;
    agent.repo.git(&["checkout", "-q", "main"])?;
    let body = push_body("main", &elsewhere);
    let (status, answer) = post(&client, &hook, &signed(&agent, &body), body).await?;
    assert_eq!(
        (status, answer["result"].as_str()),
        (409, Some("superseded")),
        "{answer}"
    );
    let reason = answer["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("is not the tip of branch \"main\"") && reason.contains("only a hint"),
        "{reason}"
    );
    assert_eq!(answer["branch_tip"], bad.as_str());
    assert!(
        agent
            .store
            .commit_record(&CommitSha::new(&elsewhere))?
            .is_none()
    );

    agent.stop().await
}

#[tokio::test]
async fn status_json_and_http_status_are_the_same_document() -> TestResult {
    let (agent, _) = agent_with_web(TestAgentOptions::default()).await?;
    web_ready(&agent).await?;
    // The document changes while the agent works (a poll records its fetch): compare the
    // CLI's with the HTTP one read before and after it, when those two agree.
    let http_status = || async {
        let (status, body) = get(&client()?, &agent.url("/status")).await?;
        assert_eq!(status, 200);
        TestResult::<serde_json::Value>::Ok(serde_json::from_str(&body)?)
    };
    let mut compared = None;
    for _ in 0..20 {
        let before = http_status().await?;
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_voodu-agent"))
            .args(["status", "--json", "--data-dir"])
            .arg(agent.data_dir())
            .output()?;
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let from_cli: serde_json::Value = serde_json::from_slice(&output.stdout)?;
        if http_status().await? == before {
            compared = Some((before, from_cli));
            break;
        }
    }
    let (from_http, from_cli) = compared.ok_or("the status document never held still")?;
    assert_eq!(from_http, from_cli);
    assert_eq!(from_http["resources"][0]["phase"], "Ready");
    assert_eq!(from_http["resources"][0]["pin"], serde_json::Value::Null);
    assert_eq!(from_http["fetch"]["state"], "ok");
    assert_eq!(from_http["fetch"]["error"], serde_json::Value::Null);
    assert_eq!(from_http["engine"]["state"], "reachable");

    let (status, body) = get(&client()?, &agent.url("/releases/shop/web")).await?;
    assert_eq!(status, 200, "{body}");
    let releases: serde_json::Value = serde_json::from_str(&body)?;
    assert_eq!(releases["kind"], "deployment");
    assert_eq!(releases["releases"][0]["phase"], "succeeded");
    assert_eq!(releases["releases"][0]["snapshot"]["replicas"], 2);
    let (status, _) = get(&client()?, &agent.url("/releases/shop/nope")).await?;
    assert_eq!(status, 404);
    let (status, body) = get(&client()?, &agent.url("/healthz")).await?;
    assert_eq!((status, body.as_str()), (200, r#"{"status":"ok"}"#));
    agent.stop().await
}

#[tokio::test]
async fn metrics_scrape_parses_and_counts_what_happened() -> TestResult {
    let unix_now = || -> TestResult<i64> {
        Ok(i64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_secs(),
        )?)
    };
    let started = unix_now()?;
    let (agent, first) = agent_with_web(TestAgentOptions::default()).await?;
    web_ready(&agent).await?;
    let client = client()?;
    // One webhook for the applied commit (coalesced or not, it answers at once).
    let (status, _) = post(
        &client,
        &agent.url("/hooks/git"),
        &[],
        push_body("main", &first),
    )
    .await?;
    assert_eq!(status, 202);
    let (status, _) = post(
        &client,
        &agent.url("/hooks/git"),
        &[],
        push_body("dev", &first),
    )
    .await?;
    assert_eq!(status, 202);
    // That webhook's fetch may still run: wait until it was counted.
    let mut samples;
    loop {
        let (status, text) = get(&client, &agent.url("/metrics")).await?;
        assert_eq!(status, 200);
        samples = parse_metrics(&text)?;
        if metric(&samples, "voodu_syncs_total", &[]) >= 2.0
            || metric(
                &samples,
                "voodu_webhook_requests_total",
                &[("result", "coalesced")],
            ) == 1.0
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Periodic work waits in the one timer: the drift resync and the autoscaler each hold
    // one pending wake there (what `/metrics` lists as `voodu_timer_waits`).
    let mut waits = Vec::new();
    for _ in 0..500 {
        let (_, text) = get(&client, &agent.url("/metrics")).await?;
        waits = parse_metrics(&text)?;
        if metric(&waits, "voodu_timer_waits", &[("what", "resync")]) == 1.0
            && metric(&waits, "voodu_timer_waits", &[("what", "autoscale")]) == 1.0
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        metric(&waits, "voodu_timer_waits", &[("what", "resync")]),
        1.0
    );
    assert_eq!(
        metric(&waits, "voodu_timer_waits", &[("what", "autoscale")]),
        1.0
    );
    assert_eq!(
        metric(&samples, "voodu_syncs_total", &[("result", "applied")]),
        1.0
    );
    assert_eq!(
        metric(
            &samples,
            "voodu_sync_duration_seconds_count",
            &[("result", "applied")]
        ),
        1.0
    );
    assert_eq!(
        metric(
            &samples,
            "voodu_sync_duration_seconds_bucket",
            &[("result", "applied"), ("le", "+Inf")]
        ),
        1.0
    );
    assert!(
        metric(
            &samples,
            "voodu_reconciles_total",
            &[("kind", "deployment"), ("result", "success")]
        ) >= 1.0
    );
    assert_eq!(
        metric(&samples, "voodu_resources", &[("phase", "Ready")]),
        1.0
    );
    assert_eq!(metric(&samples, "voodu_pinned_resources", &[]), 0.0);
    assert_eq!(
        metric(
            &samples,
            "voodu_webhook_requests_total",
            &[("result", "ignored")]
        ),
        1.0
    );
    assert_eq!(
        metric(&samples, "voodu_webhook_requests_total", &[]),
        2.0,
        "two webhooks in all"
    );
    let applied_at = agent
        .store
        .commit_summary()?
        .last_applied
        .ok_or("applied")?
        .seen_at;
    assert_eq!(
        metric(&samples, "voodu_last_applied_commit_timestamp_seconds", &[]),
        applied_at as f64
    );
    let fetched_at = agent
        .store
        .health(voodu_agent::store::HEALTH_FETCH)?
        .and_then(|health| health.last_success_at)
        .ok_or("a successful fetch")?;
    // This run's last successful fetch, as stored (read after the scrape: a fetch between
    // them could only move it later). Not compared with the apply: the fetch that brought
    // the commit comes before its apply, and a second may tick between them (it did in a
    // loaded run).
    let scraped = metric(
        &samples,
        "voodu_last_successful_fetch_timestamp_seconds",
        &[],
    );
    assert!(
        started as f64 <= scraped && scraped <= fetched_at as f64 && fetched_at <= unix_now()?,
        "the last successful fetch (scraped {scraped}, stored {fetched_at}) is this run's (from {started})"
    );
    agent.stop().await
}

#[tokio::test]
async fn a_local_repos_new_commit_syncs_without_waiting_for_the_poll() -> TestResult {
    let (agent, _) = agent_with_web(TestAgentOptions {
        watch_local: true,
        ..TestAgentOptions::default()
    })
    .await?;
    // The poll interval is an hour: only the ref watch can notice this push.
    agent.repo.write("web.hcl", &web(2, "2"))?;
    let second = agent.repo.commit("web: V=2")?;
    agent.applied(&second).await?;
    agent.stop().await
}

#[tokio::test]
async fn the_sync_command_finds_the_agent_and_waits_for_the_commit() -> TestResult {
    let (agent, _) = agent_with_web(TestAgentOptions {
        secret: Some(SECRET.into()),
        ..TestAgentOptions::default()
    })
    .await?;
    agent.repo.write("web.hcl", &web(2, "3"))?;
    let next = agent.repo.commit("web: V=3")?;
    let data_dir = agent.data_dir();
    // The command signs with the secret file the agent recorded, at the address it recorded.
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_voodu-agent"))
            .args(["sync", "--wait", "--data-dir"])
            .arg(data_dir)
            .output()
    })
    .await??;
    let stdout = String::from_utf8(output.stdout)?;
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.starts_with(&format!("commit {} applied", &next[..12])),
        "{stdout}"
    );
    // `--json`: the agent's answer, through the same client.
    let data_dir = agent.data_dir();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_voodu-agent"))
            .args(["sync", "--wait", "--json", "--data-dir"])
            .arg(data_dir)
            .output()
    })
    .await??;
    assert!(output.status.success());
    let answer: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    assert_eq!(answer["result"], "applied", "{answer:#}");
    assert_eq!(answer["commit"], next.as_str(), "{answer:#}");
    agent.stop().await
}

/// The path through the router and the sync loop: a handful of signed webhooks (16 KiB each)
/// for one new commit are all answered, one of them starts a fetch and the rest join it, and
/// the commit costs exactly one fetch. (The flood of 12,000 is `git::trigger`'s unit test
/// `a_flood_of_webhooks_fetches_once_per_sha`; the agent's memory under a flood is measured on
/// the real binary: `e2e_docker::a_webhook_flood_keeps_the_agents_memory_bounded`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handful_of_webhooks_for_a_new_commit_fetch_once() -> TestResult {
    let (agent, _) = agent_with_web(TestAgentOptions {
        secret: Some(SECRET.into()),
        ..TestAgentOptions::default()
    })
    .await?;
    let secret = agent.secret.clone().ok_or("secret")?;
    agent.repo.write("web.hcl", &web(2, "2"))?;
    let second = agent.repo.commit("web: V=2")?;
    let client = client()?;
    // The sync counter moves just after the store records a commit: wait for the start-up
    // sync's count before taking the base, and for the flood's before comparing.
    let before = syncs_at_least(&client, &agent, 1.0).await?;
    assert_eq!(
        flood(
            &client,
            &agent.url("/hooks/git"),
            &secret,
            std::slice::from_ref(&second),
            20
        )
        .await?,
        20
    );
    agent.applied(&second).await?;
    assert_eq!(
        syncs_at_least(&client, &agent, before + 1.0).await? - before,
        1.0,
        "one fetch for one SHA"
    );
    let (_, text) = get(&client, &agent.url("/metrics")).await?;
    let samples = parse_metrics(&text)?;
    let result = |result| {
        metric(
            &samples,
            "voodu_webhook_requests_total",
            &[("result", result)],
        )
    };
    assert_eq!(result("accepted"), 1.0, "one request started the fetch");
    assert_eq!(result("coalesced"), 19.0);
    agent.stop().await
}

/// `voodu_syncs_total` once it is at least `least` (it is counted just after the store
/// records the sync's outcome); what it is then.
async fn syncs_at_least(
    client: &reqwest::Client,
    agent: &TestAgent,
    least: f64,
) -> TestResult<f64> {
    let started = std::time::Instant::now();
    loop {
        let now = syncs(client, agent).await?;
        if now >= least || started.elapsed() > Duration::from_secs(30) {
            return Ok(now);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn syncs(client: &reqwest::Client, agent: &TestAgent) -> TestResult<f64> {
    let (_, text) = get(client, &agent.url("/metrics")).await?;
    Ok(metric(&parse_metrics(&text)?, "voodu_syncs_total", &[]))
}
