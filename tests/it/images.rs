//! Image automation on the fake runtime, against registries served here (the Docker-backed
//! acceptance is `images_docker.rs`): a registry that trickles does not hold up the scans of
//! the others.
//!
//! Limits in the waits are liveness bounds, not timing assertions.

use std::io::{BufReader, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use voodu_agent::store::Store;

use crate::support::http::read_request_head;
use crate::support::{TempRepo, TestResult};

/// One registry on loopback for two repositories: `a-slow` answers its tag list a byte a
/// second (it never finishes: each byte comes within every deadline but the scan's),
/// `z-fast` at once.
fn registry() -> TestResult<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let address = listener.local_addr()?;
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let _ = answer(stream);
            });
        }
    });
    Ok(address)
}

fn answer(mut stream: TcpStream) -> TestResult {
    let head = read_request_head(&mut BufReader::new(stream.try_clone()?))?.ok_or("no request")?;
    if head.target.starts_with("/v2/a-slow/tags/list") {
        stream.write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n",
        )?;
        // Until the client goes away: JSON may start with any amount of white space.
        while stream.write_all(b" ").is_ok() {
            std::thread::sleep(Duration::from_secs(1));
        }
        return Ok(());
    }
    let body = r#"{"name":"z-fast","tags":["1.0.0","1.0.1"]}"#;
    write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    Ok(())
}

fn follower(name: &str, image: &str) -> String {
    format!(
        "deployment \"shop\" \"{name}\" {{\n  image   = \"{image}\"\n  command = [\"sleep\", \"3600\"]\n  image_update {{\n    mode = \"report\"\n  }}\n}}\n"
    )
}

/// Issue 47: scans ran one at a time, so a registry that trickles (a byte a second) held up
/// every other repository's scan until its deadline. `a-slow` sorts (and so was scanned)
/// first; `z-fast` is scanned and its newer tag decided while `a-slow`'s answer is still
/// trickling in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickling_registry_does_not_hold_up_the_other_scans() -> TestResult {
    let registry = registry()?;
    let repo = TempRepo::new()?;
    repo.write(
        "images.hcl",
        &format!(
            "{}{}",
            follower("slow", &format!("{registry}/a-slow:1.0.0")),
            follower("fast", &format!("{registry}/z-fast:1.0.0"))
        ),
    )?;
    repo.commit("two followed images")?;
    let data = tempfile::tempdir()?;
    let mut config = crate::support::agent::fake_agent_config(&repo, data.path());
    config.sync.policy.allow_url_host = vec!["127.0.0.1".to_owned()];
    let shutdown = tokio_util::sync::CancellationToken::new();
    let agent = tokio::spawn(voodu_agent::agent::run_with_runtime(
        config,
        Arc::new(voodu_agent::runtime::FakeRuntime::new()),
        None,
        shutdown.clone().cancelled_owned(),
    ));
    // The first look is at start, before the commit is applied; the next one 10 s later.
    let mut store = None;
    let views = crate::support::until(
        Duration::from_secs(90),
        Duration::from_millis(50),
        "the fast repository's newer tag",
        || {
            let state_db = data.path().join("state.db");
            if store.is_none() && state_db.exists() {
                store = Store::open(&state_db).ok();
            }
            let Some(store) = &store else {
                return Ok(None);
            };
            let views = voodu_agent::http::images::build(store)?;
            let fast_decided = views.iter().any(|view| {
                view.resource == "deployment/shop/fast"
                    && view.latest_tag.as_deref() == Some("1.0.1")
            });
            Ok(fast_decided.then_some(views))
        },
    )
    .await;
    shutdown.cancel();
    agent.await??;
    let views = views?;
    let slow = views
        .iter()
        .find(|view| view.resource == "deployment/shop/slow")
        .ok_or("no slow view")?;
    assert_eq!(
        slow.scanned_at, None,
        "the slow scan had not ended when the fast one was decided: {slow:?}"
    );
    Ok(())
}
