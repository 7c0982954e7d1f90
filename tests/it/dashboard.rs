//! The dashboard over HTTP (issue 14 items 4-5): pages built from what the agent stored,
//! everything escaped, a strict CSP on every answer, the release diff, the live stream's
//! first document, and the same auth as `/status` (a browser logs in with the secret as its
//! Basic password). The browser itself drives it in `dashboard_browser.rs`.

use voodu_agent::http::HttpOptions;
use voodu_agent::model::{Kind, ResourceKey};
use voodu_agent::store::Phase;

use crate::support::http::{TestRouter, client};
use crate::support::{TempRepo, TestAgent, TestAgentOptions, TestResult};

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

fn web(value: &str) -> String {
    format!(
        r#"deployment "shop" "web" {{
  image = "busybox"
  command = ["sleep", "3600"]
  replicas = 2
  env = {{ GREETING = "{value}" }}
}}
"#
    )
}

/// Waits until `key` is Ready with `n_releases` releases.
async fn web_ready(agent: &TestAgent, key: &ResourceKey, n_releases: usize) -> TestResult {
    agent
        .until("web Ready", |store| {
            let ready = store
                .status(key)?
                .is_some_and(|status| status.phase == Phase::Ready);
            Ok((ready && store.releases(key, 10)?.len() == n_releases).then_some(()))
        })
        .await
}

/// GET `url`: status, headers, body.
async fn fetch(
    client: &reqwest::Client,
    url: &str,
) -> TestResult<(u16, reqwest::header::HeaderMap, String)> {
    let response = client.get(url).send().await?;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    Ok((status, headers, response.text().await?))
}

fn assert_secured(headers: &reqwest::header::HeaderMap, what: &str) {
    assert_eq!(
        headers
            .get("content-security-policy")
            .and_then(|v| v.to_str().ok()),
        Some(CSP),
        "{what}"
    );
    assert_eq!(
        headers
            .get("x-content-type-options")
            .and_then(|v| v.to_str().ok()),
        Some("nosniff"),
        "{what}"
    );
}

#[tokio::test]
async fn pages_show_the_stored_state_escaped_with_a_strict_csp() -> TestResult {
    let repo = TempRepo::new()?;
    repo.write("web.hcl", &web("<b>one</b>"))?;
    let first = repo.commit("web one")?;
    // A generic sink, so the timeline can say what was sent to it.
    let receiver = crate::support::http::Capture::start()?;
    let secrets = tempfile::tempdir()?;
    let url_file = secrets.path().join("url");
    std::fs::write(&url_file, receiver.url("/hook"))?;
    let notify = voodu_agent::notify::NotifyConfig::parse(
        "notify.hcl",
        &format!(
            "notify \"ci\" {{\n  type = \"generic\"\n  url_file = \"{}\"\n  interval = \"1s\"\n}}\n",
            url_file.display()
        ),
    )?;
    let agent = TestAgent::start(
        repo,
        TestAgentOptions {
            notify: Some(notify),
            ..TestAgentOptions::default()
        },
    )
    .await?;
    agent.applied(&first).await?;
    let key = ResourceKey::new(Kind::Deployment, "shop", "web");
    web_ready(&agent, &key, 1).await?;
    // Issue 48: the host's local-only `busybox` is gone and a registry has it before the
    // second release, which resolves anew (a spec change): the diff shows other bytes.
    let moved = format!("sha256:{}", "b".repeat(64));
    agent.fake.remove_image("busybox");
    agent.fake.set_tag_digest("busybox", &moved);
    agent.repo.write("web.hcl", &web("<i>two</i>"))?;
    let second = agent.repo.commit("web two")?;
    let client = client()?;
    let hook = agent.url("/hooks/git?wait=true");
    client.post(&hook).body("{}").send().await?;
    agent.applied(&second).await?;
    web_ready(&agent, &key, 2).await?;
    // A rejected commit: a parse error and a value that would be markup.
    agent
        .repo
        .write("broken.hcl", "deployment \"shop\" \"x\" {\n  image = \n}\n")?;
    let rejected = agent.repo.commit("broken")?;
    client.post(&hook).body("{}").send().await?;
    agent
        .until("the commit rejected", |store| {
            Ok(store
                .commit_summary()?
                .last_rejected
                .filter(|record| record.sha.as_str() == rejected)
                .map(|_| ()))
        })
        .await?;

    let (status, headers, overview) = fetch(&client, &agent.url("/ui")).await?;
    assert_eq!(status, 200, "{overview}");
    assert_secured(&headers, "/ui");
    assert!(
        overview.contains("<a href=\"/ui/resource/deployment/shop/web\">shop/web</a>"),
        "{overview}"
    );
    assert!(
        overview.contains("data-field=\"ready\">2/2</td>"),
        "{overview}"
    );
    assert!(overview.contains(&format!(
        "<code id=\"rejected-sha\">{}</code>",
        &rejected[..12]
    )));
    assert!(
        overview.contains("<code class=\"loc\">broken.hcl:"),
        "{overview}"
    );
    assert!(overview.contains("id=\"activity\""), "{overview}");
    assert!(!overview.contains("<script>"), "no inline script");

    let (status, headers, page) =
        fetch(&client, &agent.url("/ui/resource/deployment/shop/web")).await?;
    assert_eq!(status, 200, "{page}");
    assert_secured(&headers, "resource page");
    assert!(page.contains("id=\"ready-plot\""), "{page}");
    assert_eq!(
        page.matches("<span class=\"badge good\">ready</span>")
            .count(),
        2,
        "{page}"
    );
    assert!(page.contains("<form class=\"compare\""), "{page}");
    // A replica's readiness probe turns failing (as the probe runner records it; web has no
    // probe of its own, so nothing records it back): one `probe.failing` row.
    let replica = agent
        .store
        .readiness(&key)?
        .into_iter()
        .next()
        .ok_or("no readiness row")?;
    agent.store.put_readiness(&voodu_agent::store::Readiness {
        ready: false,
        reason: "readiness probe: answered 500 <b>".to_owned(),
        ..replica.clone()
    })?;
    // The sink delivered web's rollout events.
    agent
        .until("a sent event of web", |store| {
            Ok((!store.sent_of("deployment/shop/web", 10)?.is_empty()).then_some(()))
        })
        .await?;

    let (_, _, page) = fetch(&client, &agent.url("/ui/resource/deployment/shop/web")).await?;
    // Its timeline, from the activity log: the rollouts of its two releases.
    let timeline = page
        .split("<section id=\"timeline\">")
        .nth(1)
        .ok_or("no timeline section")?;
    assert!(
        timeline.matches("<td>rollout</td>").count() >= 2,
        "{timeline}"
    );
    // Issue 53: the probe failing, escaped, and the notifications sent.
    assert!(
        timeline.contains("<td>probe.failing</td><td class=\"bad\">failing</td>"),
        "{timeline}"
    );
    assert!(
        timeline.contains(&format!(
            "replica {} is failing: readiness probe: answered 500 &lt;b&gt;",
            replica.container
        )),
        "{timeline}"
    );
    assert!(
        timeline.contains("<td>notify.sent</td>")
            && (timeline.contains("rollout.succeeded sent to ci")
                || timeline.contains("rollout.started sent to ci")),
        "{timeline}"
    );
    let releases = agent.store.releases(&key, 10)?;
    let (newer, older) = (releases[0].id, releases[1].id);
    let (status, headers, diff) = fetch(
        &client,
        &agent.url(&format!(
            "/ui/resource/deployment/shop/web/diff?from={older}&to={newer}"
        )),
    )
    .await?;
    assert_eq!(status, 200, "{diff}");
    assert_secured(&headers, "diff");
    assert!(
        diff.contains("1 line(s) differ") || diff.contains("line(s) differ"),
        "{diff}"
    );
    assert!(
        diff.contains(
            "<span class=\"del\">-     &quot;GREETING&quot;: &quot;&lt;b&gt;one&lt;/b&gt;&quot;"
        ) && diff.contains(
            "<span class=\"add\">+     &quot;GREETING&quot;: &quot;&lt;i&gt;two&lt;/i&gt;&quot;"
        ),
        "{diff}"
    );
    assert!(
        !diff.contains("<b>one") && !diff.contains("<i>two"),
        "{diff}"
    );
    assert!(
        diff.contains("1 image(s) run other bytes")
            && diff.contains(&format!(
                "<td><code>busybox@{moved}</code></td><td>other bytes</td>"
            )),
        "{diff}"
    );
    // A release compared with itself: the same bytes.
    let (_, _, same) = fetch(
        &client,
        &agent.url(&format!(
            "/ui/resource/deployment/shop/web/diff?from={newer}&to={newer}"
        )),
    )
    .await?;
    assert!(same.contains("Every image runs the same bytes."), "{same}");
    assert!(
        page.contains(&format!("<td><code>{}</code></td>", &moved[7..19])),
        "{page}"
    );
    let (status, _, _) = fetch(
        &client,
        &agent.url("/ui/resource/deployment/shop/web/diff?from=1&to=999999"),
    )
    .await?;
    assert_eq!(status, 404);
    let (status, _, _) = fetch(&client, &agent.url("/ui/resource/nokind/shop/web")).await?;
    assert_eq!(status, 404);

    // The live stream's first document: what the page shows.
    let response = client
        .get(agent.url("/ui/events?resource=deployment%2Fshop%2Fweb"))
        .send()
        .await?;
    assert_eq!(
        response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("text/event-stream")
    );
    let document = first_event(response).await?;
    assert_eq!(document["ready"], "2/2", "{document:#}");
    assert_eq!(document["containers"].as_array().map(Vec::len), Some(2));
    assert!(document["plot"]["ready_points"].is_string(), "{document:#}");
    let overview_stream = client.get(agent.url("/ui/events")).send().await?;
    let document = first_event(overview_stream).await?;
    assert_eq!(document["rows"][0]["key"], "deployment/shop/web");
    assert!(
        document["rejected"]["problems"][0][0]
            .as_str()
            .is_some_and(|location| location.starts_with("broken.hcl:")),
        "{document:#}"
    );
    let (status, headers, script) = fetch(&client, &agent.url("/ui/static/app.js")).await?;
    assert_eq!(status, 200);
    assert_eq!(
        headers.get("content-type").and_then(|v| v.to_str().ok()),
        Some("text/javascript; charset=utf-8")
    );
    assert!(script.contains("EventSource"));
    agent.stop().await
}

/// Reads the stream until its first `update` event and parses its data.
pub(crate) async fn first_event(mut response: reqwest::Response) -> TestResult<serde_json::Value> {
    let mut text = String::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while !text.contains("\n\n") {
        let chunk = tokio::time::timeout_at(deadline, response.chunk())
            .await
            .map_err(|_| format!("no event in time: {text}"))??
            .ok_or("the stream ended")?;
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    let data: String = text
        .lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .map(str::trim_start)
        .collect();
    assert!(text.contains("event: update"), "{text}");
    Ok(serde_json::from_str(&data)?)
}

/// Off loopback the dashboard needs the webhook secret, like `/status`: a browser is asked
/// for it (Basic), and takes it as the password; a bearer token works too.
#[tokio::test]
async fn off_loopback_the_dashboard_asks_a_browser_for_the_secret() -> TestResult {
    let options = HttpOptions {
        secret: Some(voodu_agent::http::WebhookSecret::new("dash-secret")),
        ..HttpOptions::default()
    };
    let router = TestRouter::start("0.0.0.0:0", options).await?;
    let client = client()?;
    let url = format!("http://{}/ui", router.address);
    let response = client.get(&url).send().await?;
    assert_eq!(response.status().as_u16(), 401);
    assert_eq!(
        response
            .headers()
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok()),
        Some("Basic realm=\"voodu-agent\", charset=\"UTF-8\"")
    );
    let cases: &[(&str, u16)] = &[
        ("Basic YWRtaW46ZGFzaC1zZWNyZXQ=", 200), // admin:dash-secret
        ("Basic YWRtaW46d3Jvbmc=", 401),         // admin:wrong
        ("Bearer dash-secret", 200),
    ];
    for (authorization, expected) in cases {
        let response = client
            .get(&url)
            .header("authorization", *authorization)
            .send()
            .await?;
        assert_eq!(response.status().as_u16(), *expected, "{authorization}");
    }
    // `/` leads to the dashboard.
    let response = reqwest::Client::builder()
        .tls_backend_preconfigured(voodu_agent::model::tls::client_config()?)
        .redirect(reqwest::redirect::Policy::none())
        .build()?
        .get(format!("http://{}/", router.address))
        .send()
        .await?;
    assert_eq!(response.status().as_u16(), 303);
    assert_eq!(
        response
            .headers()
            .get("location")
            .and_then(|v| v.to_str().ok()),
        Some("/ui")
    );
    Ok(())
}

/// Issue 23 item 8: every answer of the dashboard, the API and the webhook carries the
/// security headers, errors included (a 400 of a bad diff query and a 404 under `/ui` had
/// none): they are put on in one place every answer goes through.
#[tokio::test]
async fn every_answer_carries_the_security_headers() -> TestResult {
    let secret = voodu_agent::http::WebhookSecret::new("headers-secret");
    let options = HttpOptions {
        secret: Some(secret.clone()),
        ..HttpOptions::default()
    };
    let router = TestRouter::start("127.0.0.1:0", options).await?;
    let client = client()?;
    let url = |path: &str| format!("http://{}{path}", router.address);
    let body = crate::support::http::push_body("main", "89abcdef0123456789abcdef0123456789abcdef");
    let signed = [
        ("x-github-event", "push".to_owned()),
        ("x-hub-signature-256", secret.sign(&body)),
    ];
    let cases: Vec<(&str, reqwest::RequestBuilder, u16)> = vec![
        ("status", client.get(url("/status")), 200),
        ("healthz", client.get(url("/healthz")), 200),
        ("metrics", client.get(url("/metrics")), 200),
        ("overview", client.get(url("/ui")), 200),
        ("stylesheet", client.get(url("/ui/static/app.css")), 200),
        (
            "bad diff query",
            client.get(url("/ui/resource/deployment/shop/web/diff?from=x&to=y")),
            400,
        ),
        ("unknown page under /ui", client.get(url("/ui/nope")), 404),
        ("unknown API path", client.get(url("/nope")), 404),
        ("no such release list", client.get(url("/releases/a")), 404),
        (
            "webhook accepted",
            signed
                .iter()
                .fold(client.post(url("/hooks/git")), |request, (name, value)| {
                    request.header(*name, value)
                })
                .body(body.clone()),
            202,
        ),
        (
            "webhook with a bad signature",
            client
                .post(url("/hooks/git"))
                .header("x-github-event", "push")
                .header("x-hub-signature-256", "sha256=00")
                .body(body.clone()),
            401,
        ),
        ("webhook by GET", client.get(url("/hooks/git")), 405),
    ];
    for (what, request, expected) in cases {
        let response = request.send().await?;
        assert_eq!(response.status().as_u16(), expected, "{what}");
        assert_secured(response.headers(), what);
        assert_eq!(
            response
                .headers()
                .get("x-frame-options")
                .and_then(|v| v.to_str().ok()),
            Some("DENY"),
            "{what}"
        );
    }
    Ok(())
}
