//! Log streams on the fake runtime: the dashboard's server-sent events of a resource's logs
//! (`http::logs` over `agent::logs::Follower`): every container of the resource interleaved
//! and named, lines masked and escaped, followed (a new container joins, a stopped one
//! leaves), other resources left out, and the limit of clients at once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use voodu_agent::agent::logs::Follower;
use voodu_agent::assets::sops::Keyring;
use voodu_agent::http::HttpOptions;
use voodu_agent::http::logs::{LogSource, MAX_CLIENTS};
use voodu_agent::runtime::{ContainerSpec, Containers, FakeRuntime, labels};

use crate::support::TestResult;
use crate::support::http::{TestRouter, client};

/// One server-sent event: its type and its data as JSON.
type SseEvent = (String, serde_json::Value);

/// Reads a server-sent event stream event by event.
pub(crate) struct SseReader {
    response: reqwest::Response,
    buffer: String,
}

impl SseReader {
    pub(crate) fn new(response: reqwest::Response) -> SseReader {
        SseReader {
            response,
            buffer: String::new(),
        }
    }

    /// The next `line` or `note` event (keep-alives skipped), within 20 s.
    pub(crate) async fn next(&mut self) -> TestResult<SseEvent> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            while let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut kind = String::new();
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(value) = line.strip_prefix("event:") {
                        kind = value.trim().to_owned();
                    } else if let Some(value) = line.strip_prefix("data:") {
                        data.push_str(value.trim_start());
                    }
                }
                if !kind.is_empty() {
                    return Ok((kind, serde_json::from_str(&data)?));
                }
            }
            let chunk = tokio::time::timeout_at(deadline, self.response.chunk())
                .await
                .map_err(|_| format!("no event within 20 s; read {:?}", self.buffer))??
                .ok_or("the stream ended")?;
            self.buffer.push_str(&String::from_utf8(chunk.to_vec())?);
        }
    }

    /// Events until one satisfies `done` (all of them, that one last).
    pub(crate) async fn until(
        &mut self,
        done: impl Fn(&SseEvent) -> bool,
    ) -> TestResult<Vec<SseEvent>> {
        let mut seen = Vec::new();
        loop {
            let event = self.next().await?;
            let last = done(&event);
            seen.push(event);
            if last {
                return Ok(seen);
            }
        }
    }
}

/// True for the line event `source | text`.
fn is_line(event: &SseEvent, source: &str, text: &str) -> bool {
    event.0 == "line" && event.1["s"] == source && event.1["t"] == text
}

/// A running replica of `scope/name` on agent `agent`, printing `script`'s echoes.
fn replica(agent: &str, scope: &str, name: &str, replica: &str, script: &str) -> ContainerSpec {
    ContainerSpec {
        name: format!("{scope}-{name}.{replica}"),
        image: "img".to_owned(),
        command: Some(vec![
            "sh".into(),
            "-c".into(),
            format!("{script}; sleep 300"),
        ]),
        labels: BTreeMap::from([
            (labels::AGENT.to_owned(), agent.to_owned()),
            (labels::SCOPE.to_owned(), scope.to_owned()),
            (labels::NAME.to_owned(), name.to_owned()),
            (labels::REPLICA_ID.to_owned(), replica.to_owned()),
        ]),
        ..ContainerSpec::default()
    }
}

#[tokio::test]
async fn the_dashboard_tails_a_resource_masked_escaped_and_followed() -> TestResult {
    let runtime = Arc::new(FakeRuntime::with_images(&["img"]));
    let for_router = runtime.clone();
    let router = TestRouter::start_with_logs("127.0.0.1:0", HttpOptions::default(), |store| {
        let agent_id = store.agent_id().ok()?;
        let keyring = Arc::new(Keyring::load(&[] as &[std::path::PathBuf]).ok()?);
        let follower: Arc<dyn LogSource> =
            Arc::new(Follower::new(for_router, store, agent_id, keyring));
        Some(follower)
    })
    .await?;
    let agent = router.store.agent_id()?;
    router.store.config_set(
        "shop",
        "web",
        &BTreeMap::from([("API_KEY".to_owned(), "sk-live-0123456789".to_owned())]),
    )?;
    let a = runtime
        .create(&replica(&agent, "shop", "web", "a1", "echo hello from a"))
        .await?;
    runtime.start(&a).await?;
    let other = runtime
        .create(&replica(&agent, "shop", "api", "z9", "echo not this one"))
        .await?;
    runtime.start(&other).await?;

    let client = client()?;
    let url = format!(
        "http://{}/ui/resource/deployment/shop/web/logs",
        router.address
    );
    let response = client.get(&url).send().await?;
    assert_eq!(response.status(), 200);
    assert_eq!(
        response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("text/event-stream")
    );
    let mut events = SseReader::new(response);
    events
        .until(|event| is_line(event, "shop-web.a1", "hello from a"))
        .await?;

    // A hostile line: a script tag, terminal escapes and the config value.
    runtime.write_output(
        &a,
        "<script>alert(1)</script>\u{1b}[2J\u{7} key=sk-live-0123456789\n",
    );
    let seen = events
        .until(|event| {
            event.0 == "line" && event.1["t"].as_str().is_some_and(|t| t.contains("key="))
        })
        .await?;
    let line = &seen.last().ok_or("no line")?.1["t"];
    assert_eq!(
        line, "<script>alert(1)</script>\\x1b[2J\\x07 key=••••••",
        "the script tag stays text (the page puts it in with textContent), the controls are escaped, the value masked"
    );

    // A new replica joins, the old one leaves; the other resource never shows.
    let b = runtime
        .create(&replica(&agent, "shop", "web", "b2", "echo hello from b"))
        .await?;
    runtime.start(&b).await?;
    let seen = events
        .until(|event| is_line(event, "shop-web.b2", "hello from b"))
        .await?;
    assert!(
        seen.iter()
            .any(|event| event.0 == "note" && event.1["t"] == "shop-web.b2 joined"),
        "{seen:?}"
    );
    runtime.exit(&a);
    let seen = events
        .until(|event| event.0 == "note" && event.1["t"] == "shop-web.a1 left")
        .await?;
    runtime.write_output(&b, "still here\n");
    let mut rest = events
        .until(|event| is_line(event, "shop-web.b2", "still here"))
        .await?;
    rest.extend(seen);
    assert!(
        !rest
            .iter()
            .any(|event| event.1["s"] == "shop-api.z9" || event.1["t"] == "not this one"),
        "{rest:?}"
    );

    // One replica only.
    let one = client.get(format!("{url}?replica=a1")).send().await?;
    let mut one = SseReader::new(one);
    let first = one.next().await?;
    assert!(is_line(&first, "shop-web.a1", "hello from a"), "{first:?}");
    drop(one);
    drop(events);
    Ok(())
}

#[tokio::test]
async fn log_streams_beyond_the_limit_are_refused_and_unknown_ones_say_so() -> TestResult {
    let runtime = Arc::new(FakeRuntime::with_images(&["img"]));
    let for_router = runtime.clone();
    let router = TestRouter::start_with_logs("127.0.0.1:0", HttpOptions::default(), |store| {
        let agent_id = store.agent_id().ok()?;
        let keyring = Arc::new(Keyring::load(&[] as &[std::path::PathBuf]).ok()?);
        let follower: Arc<dyn LogSource> =
            Arc::new(Follower::new(for_router, store, agent_id, keyring));
        Some(follower)
    })
    .await?;
    let client = client()?;
    let url = format!(
        "http://{}/ui/resource/deployment/s/web/logs",
        router.address
    );
    let mut open = Vec::new();
    for _ in 0..MAX_CLIENTS {
        let response = client.get(&url).send().await?;
        assert_eq!(response.status(), 200);
        open.push(response);
    }
    let refused = client.get(&url).send().await?;
    assert_eq!(refused.status(), 429);
    drop(open);
    // A place comes free once a stream's client is gone (its relay notices).
    let mut answered = 429;
    for _ in 0..400 {
        let response = client
            .get(format!("http://{}/logs/s/web", router.address))
            .send()
            .await?;
        answered = response.status().as_u16();
        if answered == 200 {
            assert_eq!(
                response.text().await?,
                "-- no container of s/web on this host\n"
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(answered, 200);
    Ok(())
}

#[tokio::test]
async fn a_stream_over_its_byte_budget_drops_lines_and_says_how_many() -> TestResult {
    let runtime = Arc::new(FakeRuntime::with_images(&["img"]));
    let for_router = runtime.clone();
    let router = TestRouter::start_with_logs("127.0.0.1:0", HttpOptions::default(), |store| {
        let agent_id = store.agent_id().ok()?;
        let keyring = Arc::new(Keyring::load(&[] as &[std::path::PathBuf]).ok()?);
        let follower: Arc<dyn LogSource> =
            Arc::new(Follower::new(for_router, store, agent_id, keyring));
        Some(follower)
    })
    .await?;
    let agent = router.store.agent_id()?;
    let id = runtime
        .create(&replica(&agent, "s", "web", "a1", "echo start"))
        .await?;
    runtime.start(&id).await?;
    let url = format!(
        "http://{}/ui/resource/deployment/s/web/logs",
        router.address
    );
    let mut events = SseReader::new(client()?.get(&url).send().await?);
    events
        .until(|event| is_line(event, "s-web.a1", "start"))
        .await?;
    // 1 MiB at once: past the burst, most of it is dropped, and a note says so.
    let line = "x".repeat(1023);
    runtime.write_output(&id, &format!("{line}\n").repeat(1024));
    tokio::time::sleep(Duration::from_millis(200)).await;
    runtime.write_output(&id, "after the burst\n");
    let seen = events
        .until(|event| is_line(event, "s-web.a1", "after the burst"))
        .await?;
    let shown = seen.iter().filter(|event| event.0 == "line").count();
    assert!(
        shown < 1024,
        "{shown} lines of 1 KiB shown at once: the burst is {} KiB",
        voodu_agent::http::logs::BURST / 1024
    );
    let mut dropped = 0;
    for note in seen.iter().filter(|event| event.0 == "note") {
        let text = note.1["t"].as_str().ok_or("no text")?;
        assert!(
            text.ends_with("lines dropped: this stream sends at most 64 KiB/s"),
            "{text}"
        );
        dropped += text.split(' ').next().ok_or("no count")?.parse::<usize>()?;
    }
    assert!(dropped > 0, "no note of the dropped lines");
    assert_eq!(shown - 1 + dropped, 1024, "every line is shown or counted");
    Ok(())
}
