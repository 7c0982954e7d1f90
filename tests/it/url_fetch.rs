//! Issue 23 items 3 and 4: `url()` may not reach this host or its networks unless the host
//! policy names the destination (`--allow-url-host`), and the fetches of one commit share one
//! budget (`--url-budget`), so slow keys delay a later fix commit by one budget at most.
//!
//! The servers are on loopback and count the connections they accept: a refusal is shown to
//! be made before any connection. Refused addresses off loopback (link-local, private) are
//! judged before the connector by construction (`assets::url_guard` tests the function);
//! these tests show the text a commit is rejected with.

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use voodu_agent::git::{Source, SourceOptions};
use voodu_agent::store::Store;
use voodu_agent::sync::{SyncOptions, SyncOutcome, Syncer};

use crate::support::{TempRepo, TestResult};

/// A loopback HTTP server counting accepted connections; with `trickle`, it sends one body
/// byte every 100 ms (of a 1000-byte body) instead of answering at once.
struct Server {
    address: SocketAddr,
    accepts: Arc<AtomicUsize>,
}

impl Server {
    fn start(trickle: bool) -> TestResult<Server> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let address = listener.local_addr()?;
        let accepts = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&accepts);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                counter.fetch_add(1, Ordering::SeqCst);
                std::thread::spawn(move || {
                    let Ok(read_half) = stream.try_clone() else {
                        return;
                    };
                    let mut reader = BufReader::new(read_half);
                    let mut line = String::new();
                    while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                        line.clear();
                    }
                    let _ = if trickle {
                        (|| {
                            stream.write_all(
                                b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nConnection: close\r\n\r\n",
                            )?;
                            for _ in 0..1000 {
                                stream.write_all(b"x")?;
                                stream.flush()?;
                                std::thread::sleep(Duration::from_millis(100));
                            }
                            Ok::<(), std::io::Error>(())
                        })()
                    } else {
                        stream.write_all(
                            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
                        )
                    };
                });
            }
        });
        Ok(Server { address, accepts })
    }

    fn accepts(&self) -> usize {
        self.accepts.load(Ordering::SeqCst)
    }
}

/// A syncer over `repo` on `data` whose policy allows `allowed` url hosts.
fn syncer(
    repo: &TempRepo,
    data: &std::path::Path,
    allowed: &[&str],
    budget: Duration,
) -> TestResult<Syncer> {
    let store = Arc::new(Store::open(&data.join("state.db"))?);
    let mut options = SyncOptions::new(data.to_owned());
    options.policy.allow_url_host = allowed.iter().map(|host| (*host).to_owned()).collect();
    options.url_budget = budget;
    let source = Source::new(
        SourceOptions {
            url: repo.url(),
            branch: "main".into(),
            ..Default::default()
        },
        data,
    );
    Ok(Syncer::new(source, store, options)?)
}

/// Syncs and returns the diagnostics `sha` was rejected with (none: applied).
fn sync(syncer: &Syncer, sha: &str) -> TestResult<Vec<String>> {
    match syncer.sync_once(&AtomicBool::new(false))? {
        SyncOutcome::Applied { commit, .. } if commit.as_str() == sha => Ok(Vec::new()),
        SyncOutcome::Rejected {
            commit,
            diagnostics,
        } if commit.as_str() == sha => Ok(diagnostics.0.iter().map(ToString::to_string).collect()),
        other => Err(format!("unexpected {other:?}").into()),
    }
}

/// An asset whose keys are `url()`s of `urls`, one a line from line 2.
fn asset(urls: &[String]) -> String {
    let mut text = "asset \"shop\" \"conf\" {\n".to_owned();
    for (n, url) in urls.iter().enumerate() {
        text.push_str(&format!(
            "  k{n} = url(\"{url}\", {{ timeout = \"10s\" }})\n"
        ));
    }
    text + "}\n"
}

#[test]
fn a_url_to_loopback_is_refused_until_its_host_is_allowed() -> TestResult {
    let server = Server::start(false)?;
    let repo = TempRepo::new()?;
    let url = format!("http://{}/status", server.address);
    repo.write("conf.hcl", &asset(std::slice::from_ref(&url)))?;
    let sha = repo.commit("a url() to loopback")?;
    let data = tempfile::tempdir()?;
    let denying = syncer(&repo, data.path(), &[], Duration::from_secs(30))?;
    assert_eq!(
        sync(&denying, &sha)?,
        [format!(
            "conf.hcl:2:8: url({url:?}): refused: 127.0.0.1 is a loopback address; start the agent with --allow-url-host 127.0.0.1 to allow it"
        )]
    );
    assert_eq!(server.accepts(), 0, "a refused url() connected");
    // Restarted with the host allowed, the agent judges the same commit again and fetches it.
    drop(denying);
    let allowing = syncer(&repo, data.path(), &["127.0.0.1"], Duration::from_secs(30))?;
    assert_eq!(sync(&allowing, &sha)?, Vec::<String>::new());
    assert_eq!(server.accepts(), 1);
    Ok(())
}

#[test]
fn urls_to_metadata_private_mapped_and_local_names_are_refused_before_connecting() -> TestResult {
    let server = Server::start(false)?;
    let port = server.address.port();
    let repo = TempRepo::new()?;
    let urls = [
        "http://169.254.169.254/latest/meta-data/".to_owned(),
        "http://10.255.255.1/".to_owned(),
        format!("http://[::ffff:127.0.0.1]:{port}/"),
        format!("http://localhost:{port}/"),
    ];
    repo.write("conf.hcl", &asset(&urls))?;
    let sha = repo.commit("internal url()s")?;
    let data = tempfile::tempdir()?;
    let got = sync(
        &syncer(&repo, data.path(), &[], Duration::from_secs(30))?,
        &sha,
    )?;
    let expected = [
        "conf.hcl:2:8: url(\"http://169.254.169.254/latest/meta-data/\"): refused: 169.254.169.254 is a link-local address (where cloud metadata services answer); start the agent with --allow-url-host 169.254.169.254 to allow it".to_owned(),
        "conf.hcl:3:8: url(\"http://10.255.255.1/\"): refused: 10.255.255.1 is a private address; start the agent with --allow-url-host 10.255.255.1 to allow it".to_owned(),
        format!("conf.hcl:4:8: url(\"http://[::ffff:127.0.0.1]:{port}/\"): refused: ::ffff:127.0.0.1 is a loopback address; start the agent with --allow-url-host 127.0.0.1 to allow it"),
    ];
    assert_eq!(got[..3], expected, "{got:#?}");
    // localhost may resolve to ::1 or 127.0.0.1, whichever comes first.
    assert_eq!(got.len(), 4, "{got:#?}");
    assert!(
        got[3].starts_with(&format!(
            "conf.hcl:5:8: url(\"http://localhost:{port}/\"): refused: localhost resolves to "
        )) && got[3].ends_with(
            ", a loopback address; start the agent with --allow-url-host localhost to allow it"
        ),
        "{}",
        got[3]
    );
    assert_eq!(server.accepts(), 0, "a refused url() connected");
    Ok(())
}

/// Six keys with a 10 s timeout against a server that never finishes: the commit is rejected
/// when the 1 s budget is spent, naming each key, and the fix commit after it is applied.
/// (The budget is this test's length, and the test sorts last in the suite: its 2 s were the
/// last 1.6 s of the engine-free run.)
#[test]
fn slow_url_keys_share_one_budget_and_the_fix_is_applied() -> TestResult {
    let server = Server::start(true)?;
    let repo = TempRepo::new()?;
    let urls: Vec<String> = (0..6)
        .map(|n| format!("http://{}/{n}", server.address))
        .collect();
    repo.write("conf.hcl", &asset(&urls))?;
    let slow = repo.commit("six slow url() keys")?;
    let data = tempfile::tempdir()?;
    let syncer = syncer(&repo, data.path(), &["127.0.0.1"], Duration::from_secs(1))?;
    let expected: Vec<String> = urls
        .iter()
        .enumerate()
        .map(|(n, url)| {
            format!(
                "conf.hcl:{}:8: url({url:?}): not fetched within the url() budget of 1s (--url-budget), which all url() fetches of a commit share; make the server answer sooner, give this key a shorter timeout, or raise --url-budget",
                n + 2
            )
        })
        .collect();
    assert_eq!(sync(&syncer, &slow)?, expected);
    // Four were fetched at a time; the last two never started.
    assert_eq!(server.accepts(), 4);
    repo.write(
        "conf.hcl",
        "asset \"shop\" \"conf\" {\n  k0 = \"inline\"\n}\n",
    )?;
    let fix = repo.commit("the fix")?;
    assert_eq!(sync(&syncer, &fix)?, Vec::<String>::new());
    Ok(())
}

/// The agent's own HTTP address stays refused when its host is allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_to_the_agents_own_address_is_refused_even_when_loopback_is_allowed() -> TestResult {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let own = listener.local_addr()?;
    let repo = TempRepo::new()?;
    let url = format!("http://{own}/status");
    repo.write("conf.hcl", &asset(std::slice::from_ref(&url)))?;
    let sha = repo.commit("a url() to the agent itself")?;
    let data = tempfile::tempdir()?;
    let mut config = crate::support::agent::fake_agent_config(&repo, data.path());
    config.sync.policy.allow_url_host = vec!["127.0.0.1".to_owned()];
    let shutdown = tokio_util::sync::CancellationToken::new();
    let agent = tokio::spawn(voodu_agent::agent::run_with_runtime(
        config,
        Arc::new(voodu_agent::runtime::FakeRuntime::new()),
        Some(listener),
        shutdown.clone().cancelled_owned(),
    ));
    let store = Store::open(&data.path().join("state.db"));
    let rejected = crate::support::until(
        Duration::from_secs(20),
        Duration::from_millis(20),
        "the commit rejected",
        || {
            let Ok(store) = &store else {
                return Ok(None);
            };
            Ok(store
                .commit_summary()?
                .last_rejected
                .filter(|record| record.sha.as_str() == sha))
        },
    )
    .await;
    shutdown.cancel();
    agent.await??;
    let errors: Vec<String> = rejected?.errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        errors,
        [format!(
            "conf.hcl:2:8: url({url:?}): refused: 127.0.0.1 ({own}) is the agent's own HTTP address (--listen {own})"
        )]
    );
    Ok(())
}
