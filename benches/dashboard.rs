//! Benchmark: the dashboard's first load for 100 resources (issue 14 acceptance 4), in bytes
//! and milliseconds, served by the agent's HTTP side over a real SQLite file: 100
//! deployments of 3 replicas each with a status, 3 releases each, one rejected commit.
//!
//! A first load is what a browser fetches: `/ui`, then `/ui/static/app.css` and
//! `/ui/static/app.js`, on one connection. Prints the bytes of each, and the median and
//! slowest of the whole load over the runs (a new connection each run), then the same for one
//! resource page. Run: `cargo bench --bench dashboard`; under `cargo test --all-targets` it
//! runs a 10-resource smoke pass.

use std::sync::Arc;
use std::time::{Duration, Instant};

use voodu_agent::git::trigger;
use voodu_agent::http::{HookSource, HttpCtx, HttpOptions};
use voodu_agent::manifest::{self, Diagnostic, Diagnostics, LoadOptions};
use voodu_agent::metrics::Metrics;
use voodu_agent::model::{CommitSha, Kind, ResourceKey, Snapshot, SourceFile};
use voodu_agent::store::{
    DeploymentDetail, Detail, Phase, ReleasePhase, ReplicaDetail, ResourceStatus, Store,
};

const RUNS: usize = 31;

fn manifest_text(n: usize, version: usize) -> String {
    (0..n)
        .map(|id| {
            format!(
                "deployment \"shop\" \"web-{id:03}\" {{\n  image = \"registry.example.com/shop/web:{version}\"\n  replicas = 3\n  env = {{ VERSION = \"{version}\" }}\n}}\n"
            )
        })
        .collect()
}

/// A store holding `n` deployments after three commits, each rolled out.
fn store_with(dir: &std::path::Path, n: usize) -> Arc<Store> {
    let store = Store::open(&dir.join("state.db")).expect("store opens");
    for version in 1..=3 {
        let snapshot = Snapshot {
            commit: CommitSha::new(format!("{version}").repeat(40)),
            files: vec![SourceFile {
                path: "all.hcl".to_owned(),
                contents: manifest_text(n, version).into_bytes(),
            }],
            refused: Vec::new(),
        };
        let manifest = manifest::load(&snapshot, &LoadOptions::standalone()).expect("loads");
        store
            .apply_commit(&snapshot.commit, &manifest)
            .expect("applies");
        for desired in store.desired_all().expect("desired") {
            let release = store.begin_release(&desired).expect("release");
            store
                .finish_release(release.id, ReleasePhase::Succeeded, "")
                .expect("finish");
            let replicas = (0..3)
                .map(|slot| ReplicaDetail {
                    current: true,
                    name: format!("shop-{}.{slot}", desired.key.name),
                    ready: true,
                    reason: String::new(),
                    state: "running".to_owned(),
                })
                .collect();
            let status = ResourceStatus {
                desired_replicas: 3,
                running_replicas: 3,
                release_id: Some(release.id),
                spec_hash: desired.spec_hash.to_string(),
                detail: Detail::Deployment(DeploymentDetail {
                    autoscaled_replicas: None,
                    ready_replicas: 3,
                    replicas,
                }),
                ..ResourceStatus::new(Phase::Ready, "")
            };
            store.put_status(&desired.key, &status).expect("status");
        }
    }
    store
        .reject_commit(
            &CommitSha::new("f".repeat(40)),
            &Diagnostics(vec![Diagnostic {
                path: "all.hcl".to_owned(),
                line: 7,
                col: 14,
                message: "`replicas` must be a whole number, got a string".to_owned(),
            }]),
        )
        .expect("reject");
    Arc::new(store)
}

/// Medians and maxima of loading `paths` on one connection, and their bytes.
async fn load(
    address: std::net::SocketAddr,
    paths: &[&str],
    runs: usize,
) -> (Vec<usize>, Duration, Duration) {
    let mut times = Vec::new();
    let mut sizes = Vec::new();
    for _ in 0..runs {
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured(voodu_agent::model::tls::client_config().expect("tls"))
            .pool_max_idle_per_host(1)
            .build()
            .expect("client");
        let start = Instant::now();
        sizes.clear();
        for path in paths {
            let response = client
                .get(format!("http://{address}{path}"))
                .send()
                .await
                .expect("answer");
            assert!(
                response.status().is_success(),
                "{path}: {}",
                response.status()
            );
            sizes.push(response.bytes().await.expect("body").len());
        }
        times.push(start.elapsed());
    }
    times.sort();
    (sizes, times[times.len() / 2], times[times.len() - 1])
}

fn main() {
    let smoke = !std::env::args().any(|arg| arg == "--bench");
    let (n, runs) = if smoke { (10, 3) } else { (100, RUNS) };
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().expect("temp dir");
    let setup = Instant::now();
    let store = store_with(dir.path(), n);
    let setup = setup.elapsed();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let (requests, _receiver) = trigger::channel();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        let shutdown = tokio_util::sync::CancellationToken::new();
        let ctx = HttpCtx {
            store: store.clone(),
            sources: vec![HookSource::single(store.clone(), requests, "main")],
            metrics: Arc::new(Metrics::new()),
            options: HttpOptions::default(),
            on_registry_push: None,
            logs: None,
        };
        let server = tokio::spawn(voodu_agent::http::serve(listener, ctx, shutdown.clone()));
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let first = ["/ui", "/ui/static/app.css", "/ui/static/app.js"];
        let (sizes, median, slowest) = load(address, &first, runs).await;
        let key = ResourceKey::new(Kind::Deployment, "shop", "web-000");
        let page = format!("/ui/resource/deployment/{}/{}", key.scope, key.name);
        let (page_sizes, page_median, page_slowest) =
            load(address, &[page.as_str()], runs).await;
        if smoke {
            println!(
                "dashboard bench smoke run ({n} resources, debug build): first load {} bytes in {:.1} ms; real figures: cargo bench --bench dashboard",
                sizes.iter().sum::<usize>(),
                ms(median)
            );
        } else {
            println!(
                "dashboard first load, {n} deployments × 3 replicas, 3 releases each (store set up in {:.0} ms), {runs} runs:",
                ms(setup)
            );
            println!(
                "  bytes: /ui {} + app.css {} + app.js {} = {} (uncompressed)",
                sizes[0],
                sizes[1],
                sizes[2],
                sizes.iter().sum::<usize>()
            );
            println!(
                "  time (new connection, 3 requests): median {:.2} ms, slowest {:.2} ms",
                ms(median),
                ms(slowest)
            );
            println!(
                "  one resource page: {} bytes, median {:.2} ms, slowest {:.2} ms",
                page_sizes[0],
                ms(page_median),
                ms(page_slowest)
            );
        }
        shutdown.cancel();
        let _ = server.await;
    });
}
