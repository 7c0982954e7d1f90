//! Notifications (`--notify`), on the fake runtime with local receivers: what each sink is
//! sent for a commit that deploys, a commit that is rejected and a rollout, that a receiver
//! that was down gets what it missed (the outbox), that a receiver echoing its secret path
//! leaves it nowhere, and `notify test` (what it says when a request fails).

use std::io::Write as _;
use std::time::Duration;

use crate::support::http::{Capture, Captured};
use crate::support::{TempRepo, TestAgent, TestAgentOptions, TestResult};
use voodu_agent::http::WebhookSecret;
use voodu_agent::notify::NotifyConfig;

fn web(env: &str) -> String {
    format!(
        r#"deployment "shop" "web" {{
  image = "busybox"
  command = ["sleep", "3600"]
  replicas = 2
  env = {{ V = "{env}" }}
}}
"#
    )
}

/// Every event named in the JSON bodies a generic sink received, in order.
fn generic_events(received: &[Captured]) -> TestResult<Vec<serde_json::Value>> {
    let mut events = Vec::new();
    for request in received {
        let body: serde_json::Value = serde_json::from_str(&request.body)?;
        events.extend(body["events"].as_array().cloned().unwrap_or_default());
    }
    Ok(events)
}

async fn until(what: &str, mut check: impl FnMut() -> bool) -> TestResult {
    for _ in 0..600 {
        if check() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("timed out waiting for {what}").into())
}

/// The generic, Slack and GitHub sinks each hear of a deploy; a commit rejected while the
/// generic receiver is down reaches it once it is back (the outbox), with every
/// `path:line:col`, signed as the agent's own webhook receiver expects; the commit status
/// goes pending → success for the good commit and failure for the rejected one; secrets never
/// show in the sinks' recorded errors.
#[tokio::test]
async fn sinks_hear_of_deploys_and_rejections_and_a_receiver_that_was_down_gets_them_later()
-> TestResult {
    let generic = Capture::start()?;
    let slack = Capture::start()?;
    let github = Capture::start()?;
    let secrets = tempfile::tempdir()?;
    let file = |name: &str, text: &str| -> TestResult<String> {
        let path = secrets.path().join(name);
        std::fs::write(&path, text)?;
        Ok(path.display().to_string())
    };
    let generic_url = file("generic-url", &generic.url("/hook?token=s3cret-in-url"))?;
    let hmac = file("hmac", "hmac-key\n")?;
    let slack_url = file("slack-url", &slack.url("/services/T0/B0/s3cret"))?;
    let token = file("gh-token", "ghp_s3cret\n")?;
    let config = NotifyConfig::parse(
        "notify.hcl",
        &format!(
            r#"
        dashboard_url = "https://deploy.example.com"
        notify "ci" {{
          type = "generic"
          url_file = "{generic_url}"
          secret_file = "{hmac}"
          interval = "1s"
        }}
        notify "chat" {{
          type = "slack"
          url_file = "{slack_url}"
          events = ["commit.rejected", "rollout.failed"]
          interval = "1s"
        }}
        commit_status "origin" {{
          provider = "github"
          api_url = "{api}"
          repository = "acme/deploy"
          token_file = "{token}"
          interval = "1s"
        }}
        "#,
            api = github.url("/api/v3"),
        ),
    )?;
    let repo = TempRepo::new()?;
    repo.write("web.hcl", &web("1"))?;
    let good = repo.commit("web")?;
    let agent = TestAgent::start(
        repo,
        TestAgentOptions {
            interval: Duration::from_millis(100),
            notify: Some(config),
            ..TestAgentOptions::default()
        },
    )
    .await?;
    agent.applied(&good).await?;

    // The deploy: applied, the rollout started and succeeded, in order.
    until("the generic sink to hear of the rollout's success", || {
        generic_events(&generic.received()).is_ok_and(|events| {
            events
                .iter()
                .any(|event| event["event"] == "rollout.succeeded")
        })
    })
    .await?;
    let events = generic_events(&generic.received())?;
    let names: Vec<&str> = events
        .iter()
        .filter_map(|event| event["event"].as_str())
        .collect();
    assert_eq!(
        names,
        ["commit.applied", "rollout.started", "rollout.succeeded"],
        "{events:#?}"
    );
    assert_eq!(events[0]["commit"], good.as_str());
    assert_eq!(events[1]["resource"], "deployment/shop/web");
    assert_eq!(events[1]["scope"], "shop");
    let secret = WebhookSecret::new("hmac-key");
    for request in generic.received() {
        assert_eq!(request.path, "/hook?token=s3cret-in-url");
        assert_eq!(
            request.headers.get("x-voodu-signature"),
            Some(&secret.sign(request.body.as_bytes())),
            "signed as the agent's own receiver checks it"
        );
    }
    assert!(
        slack.received().is_empty(),
        "the chat sink wants failures only"
    );
    until("the good commit's success status", || {
        github
            .received()
            .iter()
            .any(|request| request.body.contains(r#""state":"success""#))
    })
    .await?;
    let statuses = github.received();
    let path = format!("/api/v3/repos/acme/deploy/statuses/{good}");
    for request in &statuses {
        assert_eq!(
            (request.method.as_str(), request.path.as_str()),
            ("POST", path.as_str())
        );
        assert_eq!(
            request.headers.get("authorization").map(String::as_str),
            Some("Bearer ghp_s3cret")
        );
        let body: serde_json::Value = serde_json::from_str(&request.body)?;
        assert_eq!(body["context"], "voodu-agent");
        assert_eq!(body["target_url"], "https://deploy.example.com");
    }
    let states: Vec<String> = statuses
        .iter()
        .map(|request| {
            serde_json::from_str::<serde_json::Value>(&request.body)
                .map(|body| body["state"].as_str().unwrap_or_default().to_owned())
        })
        .collect::<Result<_, _>>()?;
    // Pending while it rolls out (unless the sink's first look already found it done: a
    // sink sends the latest state of a commit), then success.
    assert!(
        states
            .iter()
            .all(|state| state == "pending" || state == "success"),
        "{states:?}"
    );
    assert_eq!(states.last().map(String::as_str), Some("success"));

    // The generic receiver goes down; a bad commit is rejected meanwhile.
    generic.answer_with(503);
    agent
        .repo
        .write("web.hcl", "deployment \"shop\" \"web\" {\n  image = \n}\n")?;
    let bad = agent.repo.commit("broken")?;
    until("the chat sink to hear of the rejection", || {
        slack
            .received()
            .iter()
            .any(|request| request.body.contains("commit.rejected"))
    })
    .await?;
    let chat = &slack.received()[0];
    let text: serde_json::Value = serde_json::from_str(&chat.body)?;
    let text = text["text"].as_str().unwrap_or_default();
    assert!(text.contains("web.hcl:2:"), "the location: {text}");
    until("the generic sink to be refused", || generic.refused() > 0).await?;
    // The sink records the refusal after its receiver answered: wait for the record.
    until("the generic sink to record the refusal", || {
        agent.store.sink_states().is_ok_and(|states| {
            states
                .iter()
                .any(|state| state.name == "ci" && !state.last_error.is_empty())
        })
    })
    .await?;
    let states = agent.store.sink_states()?;
    let ci = states
        .iter()
        .find(|state| state.name == "ci")
        .ok_or("no ci state")?;
    assert!(ci.last_error.contains("503"), "{ci:?}");
    for state in &states {
        assert!(
            !state.last_error.contains("s3cret"),
            "a recorded error shows a secret: {state:?}"
        );
    }
    until("the rejected commit's failure status", || {
        github.received().iter().any(|request| {
            request.path.ends_with(&bad) && request.body.contains(r#""state":"failure""#)
        })
    })
    .await?;

    // Back up: the rejection arrives, once, with its location.
    generic.answer_with(200);
    until("the generic sink to get the rejection it missed", || {
        generic_events(&generic.received()).is_ok_and(|events| {
            events
                .iter()
                .any(|event| event["event"] == "commit.rejected")
        })
    })
    .await?;
    let events = generic_events(&generic.received())?;
    let rejected: Vec<&serde_json::Value> = events
        .iter()
        .filter(|event| event["event"] == "commit.rejected")
        .collect();
    assert_eq!(rejected.len(), 1, "{events:#?}");
    assert_eq!(rejected[0]["commit"], bad.as_str());
    assert!(
        rejected[0]["data"]["errors"][0]
            .as_str()
            .is_some_and(|error| error.starts_with("web.hcl:2:")),
        "{:#}",
        rejected[0]
    );
    // `/metrics` and `/status` show each sink. A delivery is counted once its answer is read,
    // which can be a moment after the receiver holds the event (seen on a loaded machine).
    let client = crate::support::http::client()?;
    let started = std::time::Instant::now();
    loop {
        let (_, text) = crate::support::http::get(&client, &agent.url("/metrics")).await?;
        let samples = crate::support::http::parse_metrics(&text)?;
        let delivered =
            crate::support::http::metric(&samples, "voodu_notify_delivered", &[("sink", "ci")]);
        if delivered >= 4.0 {
            break;
        }
        if started.elapsed() > Duration::from_secs(30) {
            return Err(format!("{delivered} deliveries counted after 30 s\n{text}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, status) = crate::support::http::get(&client, &agent.url("/status")).await?;
    let status: serde_json::Value = serde_json::from_str(&status)?;
    let names: Vec<&str> = status["notify"]
        .as_array()
        .ok_or("no notify in /status")?
        .iter()
        .filter_map(|sink| sink["name"].as_str())
        .collect();
    assert_eq!(names, ["chat", "ci", "origin"]);
    agent.stop().await
}

/// Issue 53: a commit that got `pending` and was replaced by the next push before its
/// rollout began (here: a manual trigger's hold the next push replaces) ends `error`,
/// "superseded by <sha7>", instead of `pending` for good.
#[tokio::test]
async fn a_commit_replaced_before_its_rollout_began_ends_in_error() -> TestResult {
    let github = Capture::start()?;
    let secrets = tempfile::tempdir()?;
    let token = secrets.path().join("gh-token");
    std::fs::write(&token, "ghp_t0k\n")?;
    let config = NotifyConfig::parse(
        "notify.hcl",
        &format!(
            r#"
        commit_status "origin" {{
          provider = "github"
          api_url = "{api}"
          repository = "acme/deploy"
          token_file = "{token}"
          interval = "1s"
        }}
        "#,
            api = github.url("/api/v3"),
            token = token.display(),
        ),
    )?;
    let repo = TempRepo::new()?;
    repo.write("web.hcl", &web("1"))?;
    repo.write(
        ".voodu/web.yml",
        "on:\n  push:\n    branches: [main]\napply:\n  file: web.hcl\ndeploy: manual\n",
    )?;
    let first = repo.commit("web v1, manual")?;
    let agent = TestAgent::start(
        repo,
        TestAgentOptions {
            interval: Duration::from_millis(100),
            notify: Some(config),
            ..TestAgentOptions::default()
        },
    )
    .await?;
    agent.applied(&first).await?;
    let state_of = |sha: &str, state: &str| {
        let (path, state) = (
            format!("/api/v3/repos/acme/deploy/statuses/{sha}"),
            format!(r#""state":"{state}""#),
        );
        move |request: &Captured| request.path == path && request.body.contains(&state)
    };
    until("the held commit's pending status", || {
        github.received().iter().any(state_of(&first, "pending"))
    })
    .await?;
    // The next push replaces the hold before the first commit ever rolled.
    agent.repo.write("web.hcl", &web("2"))?;
    let second = agent.repo.commit("web v2")?;
    until("the replaced commit's error status", || {
        github.received().iter().any(state_of(&first, "error"))
    })
    .await?;
    let ended = github
        .received()
        .into_iter()
        .rfind(|request| request.path.ends_with(&first))
        .ok_or("no status of the first commit")?;
    let body: serde_json::Value = serde_json::from_str(&ended.body)?;
    assert_eq!(body["state"], "error", "{body}");
    assert_eq!(
        body["description"],
        format!("superseded by {}", &second[..7]).as_str(),
        "{body}"
    );
    agent.stop().await
}

/// `notify test NAME` sends one test message and says so; an unknown name lists the sinks.
#[tokio::test]
async fn notify_test_sends_one_message_to_the_named_sink() -> TestResult {
    let receiver = Capture::start()?;
    let dir = tempfile::tempdir()?;
    let url = dir.path().join("url");
    std::fs::write(&url, receiver.url("/topic"))?;
    let file = dir.path().join("notify.hcl");
    std::fs::write(
        &file,
        format!(
            "notify \"phone\" {{\n  type = \"ntfy\"\n  url_file = \"{}\"\n}}\n",
            url.display()
        ),
    )?;
    let bin = env!("CARGO_BIN_EXE_voodu-agent");
    let file = file.display().to_string();
    let output = tokio::process::Command::new(bin)
        .args(["notify", "test", "phone", "--notify", &file])
        .output()
        .await?;
    assert!(output.status.success(), "{output:?}");
    assert_eq!(String::from_utf8(output.stdout)?, "phone: delivered\n");
    let received = receiver.received();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].path, "/topic");
    assert_eq!(
        received[0].headers.get("title").map(String::as_str),
        Some("voodu-agent: notify.test")
    );
    assert!(received[0].body.contains("a test message from voodu-agent"));
    // Every message type reaches its receiver through the real client.
    let mut blocks = String::new();
    for kind in [
        "generic",
        "slack",
        "discord",
        "teams",
        "ntfy",
        "gotify",
        "alertmanager",
    ] {
        let url = dir.path().join(format!("{kind}-url"));
        std::fs::write(&url, receiver.url(&format!("/{kind}")))?;
        blocks.push_str(&format!(
            "notify \"{kind}\" {{\n  type = \"{kind}\"\n  url_file = \"{}\"\n}}\n",
            url.display()
        ));
    }
    let every = dir.path().join("every.hcl");
    std::fs::write(&every, blocks)?;
    let every = every.display().to_string();
    for kind in [
        "generic",
        "slack",
        "discord",
        "teams",
        "ntfy",
        "gotify",
        "alertmanager",
    ] {
        let output = tokio::process::Command::new(bin)
            .args(["notify", "test", kind, "--notify", &every])
            .output()
            .await?;
        assert!(output.status.success(), "{kind}: {output:?}");
        let last = receiver.received().pop().ok_or("nothing received")?;
        let path = if kind == "alertmanager" {
            "/alertmanager/api/v2/alerts".to_owned()
        } else {
            format!("/{kind}")
        };
        assert_eq!(
            (last.method.as_str(), last.path.as_str()),
            ("POST", path.as_str())
        );
        assert!(last.body.contains("notify.test"), "{kind}: {}", last.body);
    }
    let output = tokio::process::Command::new(bin)
        .args(["notify", "test", "pager", "--notify", &file])
        .output()
        .await?;
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8(output.stderr)?;
    assert!(
        stderr.contains("no sink called \"pager\"") && stderr.contains("phone"),
        "{stderr}"
    );
    Ok(())
}

/// A receiver answering every request with Express's default 404 page, which echoes the
/// request's method and path (`Cannot POST /hooks/<secret>`).
fn express_404() -> TestResult<std::net::SocketAddr> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let address = listener.local_addr()?;
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let _ = answer_404(stream);
        }
    });
    Ok(address)
}

fn answer_404(mut stream: std::net::TcpStream) -> TestResult {
    let mut reader = std::io::BufReader::new(stream.try_clone()?);
    let head = crate::support::http::read_request_head(&mut reader)?.ok_or("no request")?;
    crate::support::http::read_body(&mut reader, &head)?;
    let page = format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>Error</title>\n</head>\n<body>\n<pre>Cannot {} {}</pre>\n</body>\n</html>\n",
        head.method, head.target
    );
    write!(
        stream,
        "HTTP/1.1 404 Not Found\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
        page.len()
    )?;
    Ok(())
}

/// Every file under `dir`, read whole.
fn files_under(dir: &std::path::Path, out: &mut Vec<(std::path::PathBuf, Vec<u8>)>) -> TestResult {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            files_under(&path, out)?;
        } else if path.is_file() {
            out.push((path.clone(), std::fs::read(&path)?));
        }
    }
    Ok(())
}

/// Issue 47: a receiver whose 404 page echoes the request path (the secret of a chat
/// webhook's URL) leaves the secret nowhere: not in the sink's recorded error, not in any
/// file of the data dir (`state.db` and its log), not in `GET /status`; the status code and
/// what the page says are kept.
#[tokio::test]
async fn a_receiver_echoing_its_secret_path_leaves_it_out_of_the_store_and_status() -> TestResult {
    let receiver = express_404()?;
    let secrets = tempfile::tempdir()?;
    let url_file = secrets.path().join("url");
    std::fs::write(
        &url_file,
        format!("http://{receiver}/hooks/T0-p4th-s3cret?token=qu3ry-s3cret\n"),
    )?;
    let config = NotifyConfig::parse(
        "notify.hcl",
        &format!(
            "notify \"ci\" {{\n  type = \"generic\"\n  url_file = \"{}\"\n  interval = \"1s\"\n}}\n",
            url_file.display()
        ),
    )?;
    let repo = TempRepo::new()?;
    repo.write("web.hcl", &web("1"))?;
    let good = repo.commit("web")?;
    let agent = TestAgent::start(
        repo,
        TestAgentOptions {
            interval: Duration::from_millis(100),
            notify: Some(config),
            ..TestAgentOptions::default()
        },
    )
    .await?;
    agent.applied(&good).await?;
    until("the sink to record the refusal", || {
        agent
            .store
            .sink_states()
            .is_ok_and(|states| states.iter().any(|state| !state.last_error.is_empty()))
    })
    .await?;
    let states = agent.store.sink_states()?;
    let error = &states.first().ok_or("no sink state")?.last_error;
    assert!(
        error.starts_with("answered 404: <!DOCTYPE html>")
            && error.contains("Cannot POST <redacted>"),
        "{error}"
    );
    let client = crate::support::http::client()?;
    let (_, status) = crate::support::http::get(&client, &agent.url("/status")).await?;
    assert!(
        status.contains("Cannot POST"),
        "the error is shown: {status}"
    );
    assert!(!status.contains("s3cret"), "a secret in /status: {status}");
    let mut files = Vec::new();
    files_under(&agent.data_dir(), &mut files)?;
    assert!(
        files.iter().any(|(path, _)| path.ends_with("state.db")),
        "{files:?}"
    );
    for (path, bytes) in &files {
        assert!(
            !bytes.windows(6).any(|window| window == b"s3cret"),
            "a secret in {}",
            path.display()
        );
    }
    agent.stop().await
}

/// Issue 47: `notify test` says why a request failed, cause by cause (it said only "error
/// sending request"): a port nothing listens on is refused; a receiver that takes the
/// connection and never answers has timed out, after `--timeout`.
#[tokio::test]
async fn notify_test_says_why_a_request_failed() -> TestResult {
    // Bound, then let go: nothing listens there.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let hanging = std::net::TcpListener::bind("127.0.0.1:0")?;
    let silent = hanging.local_addr()?;
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in hanging.incoming().flatten() {
            held.push(stream);
        }
    });
    let dir = tempfile::tempdir()?;
    let bin = env!("CARGO_BIN_EXE_voodu-agent");
    for (address, cause) in [(closed, "Connection refused"), (silent, "timed out")] {
        let url = dir.path().join("url");
        std::fs::write(&url, format!("http://{address}/topic"))?;
        let file = dir.path().join("notify.hcl");
        std::fs::write(
            &file,
            format!(
                "notify \"phone\" {{\n  type = \"ntfy\"\n  url_file = \"{}\"\n}}\n",
                url.display()
            ),
        )?;
        let file = file.display().to_string();
        let output = tokio::process::Command::new(bin)
            .args([
                "notify",
                "test",
                "phone",
                "--notify",
                &file,
                "--timeout",
                "1s",
            ])
            .output()
            .await?;
        assert_eq!(output.status.code(), Some(1), "{output:?}");
        let stderr = String::from_utf8(output.stderr)?;
        assert!(
            stderr.starts_with("voodu-agent: phone: ") && stderr.contains(cause),
            "{address}: {stderr}"
        );
    }
    Ok(())
}
