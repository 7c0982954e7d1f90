//! Benchmark (issue 23 item 4): the time from a fix commit to its application while the
//! commit before it has six `url()` keys (timeout 10 s each) against a server that trickles
//! one byte every 100 ms and never finishes.
//!
//! The sync stage runs in-process (`Syncer`, no Docker): one sync starts on the slow commit;
//! once the server has accepted a fetch, the fix commit is pushed and the clock starts; syncs
//! run until the fix is applied. Before issue 23 the six keys were fetched one after the other
//! inside the decode (6 × 10 s); now they are fetched 4 at a time within the per-commit budget
//! (`--url-budget`, default 30 s). The bench builds on both: run it at the commit before the
//! change for the "before" figure. Prints every run and the median; nothing is asserted.
//! Run: `cargo bench --bench url_budget` (`VOODU_BENCH_RUNS`, default 3); under `cargo test
//! --all-targets` it runs once with 1 s timeouts, as a smoke test of itself.

mod support;

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use support::{Repo, Result, median, ms};
use voodu_agent::git::{Source, SourceOptions};
use voodu_agent::manifest::Policy;
use voodu_agent::store::Store;
use voodu_agent::sync::{SyncOptions, SyncOutcome, Syncer};

const KEYS: usize = 6;

fn main() -> Result {
    let measuring = support::measuring();
    let (timeout, runs) = if measuring {
        let runs = std::env::var("VOODU_BENCH_RUNS")
            .ok()
            .and_then(|runs| runs.parse().ok())
            .unwrap_or(3);
        (Duration::from_secs(10), runs)
    } else {
        (Duration::from_secs(1), 1)
    };
    let server = trickle_server()?;
    let mut times = Vec::new();
    for run in 1..=runs {
        let time = fix_latency(server, timeout)?;
        println!(
            "run {run}: fix commit applied {:.0} ms after it was pushed ({KEYS} url() keys, timeout {timeout:?} each, hanging)",
            ms(time)
        );
        times.push(time);
    }
    if !measuring {
        println!("(smoke run with 1 s timeouts: not a measurement)");
    }
    println!(
        "median: {:.0} ms from the fix commit to its application",
        ms(median(&mut times))
    );
    Ok(())
}

/// A loopback server that sends headers for 1,000,000 bytes, then one byte every 100 ms.
fn trickle_server() -> Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let address = listener.local_addr()?;
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            ACCEPTS.fetch_add(1, Ordering::SeqCst);
            std::thread::spawn(move || {
                let Ok(read_half) = stream.try_clone() else {
                    return;
                };
                let mut reader = BufReader::new(read_half);
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    line.clear();
                }
                let _ = (|| {
                    stream.write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\nConnection: close\r\n\r\n",
                    )?;
                    loop {
                        stream.write_all(b"x")?;
                        stream.flush()?;
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    #[allow(unreachable_code)]
                    Ok::<(), std::io::Error>(())
                })();
            });
        }
    });
    Ok(address)
}

static ACCEPTS: AtomicUsize = AtomicUsize::new(0);

/// One run: the slow commit's sync under way, the fix pushed, the time until it is applied.
fn fix_latency(server: SocketAddr, timeout: Duration) -> Result<Duration> {
    let dir = tempfile::tempdir()?;
    let repo = Repo::new(dir.path())?;
    let mut text = "asset \"shop\" \"conf\" {\n".to_owned();
    for key in 0..KEYS {
        text.push_str(&format!(
            "  k{key} = url(\"http://{server}/{key}\", {{ timeout = \"{}s\" }})\n",
            timeout.as_secs()
        ));
    }
    text.push_str("}\n");
    repo.write("conf.hcl", &text)?;
    repo.commit("six slow url() keys")?;
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data)?;
    let mut options = SyncOptions::new(data.clone());
    // Loopback must be allowed since issue 23; before it, the policy had no such key (and the
    // default policy fetched from loopback).
    let data_dir = options.policy.data_dir.take();
    options.policy =
        serde_json::from_str::<Policy>(r#"{"allow-url-host": ["127.0.0.1"]}"#).unwrap_or_default();
    options.policy.data_dir = data_dir;
    let store = Arc::new(Store::open(&data.join("state.db"))?);
    let source = Source::new(
        SourceOptions {
            url: repo.url(),
            branch: "main".into(),
            ..Default::default()
        },
        &data,
    );
    let syncer = Syncer::new(source, store, options)?;
    let interrupt = AtomicBool::new(false);
    std::thread::scope(|scope| -> Result<Duration> {
        let before = ACCEPTS.load(Ordering::SeqCst);
        let slow = scope.spawn(|| syncer.sync_once(&interrupt));
        // The slow commit's fetches have started: push the fix now.
        let waiting = Instant::now();
        while ACCEPTS.load(Ordering::SeqCst) == before {
            if waiting.elapsed() > Duration::from_secs(30) {
                return Err("the slow commit never fetched".into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        repo.write(
            "conf.hcl",
            "asset \"shop\" \"conf\" {\n  k0 = \"fixed\"\n}\n",
        )?;
        let fix = repo.commit("the fix")?;
        let pushed = Instant::now();
        match slow.join() {
            Ok(outcome) => match outcome? {
                SyncOutcome::Rejected { .. } | SyncOutcome::Applied { .. } => {}
                other => return Err(format!("the slow sync: {other:?}").into()),
            },
            Err(_) => return Err("the slow sync panicked".into()),
        }
        loop {
            match syncer.sync_once(&interrupt)? {
                SyncOutcome::Applied { commit, .. } if commit.as_str() == fix => {
                    return Ok(pushed.elapsed());
                }
                SyncOutcome::Rejected { commit, .. } if commit.as_str() == fix => {
                    return Err("the fix was rejected".into());
                }
                _ => {}
            }
            if pushed.elapsed() > Duration::from_secs(600) {
                return Err("the fix was never applied".into());
            }
        }
    })
}
