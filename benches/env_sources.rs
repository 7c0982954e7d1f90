//! Benchmark: what one deployment pass reads to build its environment (issue 11), for a
//! desired state of 1,000 and 10,000 resources in 50 scopes, each scope with a scope bucket
//! and one app bucket per deployment, one ingress per ten deployments.
//!
//! "all" is what a pass read before issue 11: every desired row and every bucket. "own" is
//! what it reads now: the buckets the container names (`Store::buckets_of`) and the ingress
//! its `env` refers to (`${ref.ingress.…}`) with the deployment it routes to
//! (`Store::desired_of`). Prints the median of each over the runs and the 10k/1k
//! ratios (10.0 = linear in the whole state; near 1 = proportional to the resource). A real
//! SQLite file in a temp dir. Run: `cargo bench --bench env_sources`; under `cargo test
//! --all-targets` it runs a 200-resource smoke pass.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use voodu_agent::manifest::{self, LoadOptions};
use voodu_agent::model::{CommitSha, Kind, ResourceKey, Snapshot, SourceFile};
use voodu_agent::store::Store;

const RUNS: usize = 31;
const SCOPES: usize = 50;

fn manifest_text(n: usize) -> String {
    let mut text = String::new();
    for id in 0..n {
        // Each group of ten (nine deployments and their ingress) shares a scope.
        let scope = (id / 10) % SCOPES;
        if id % 10 == 9 {
            let _ = write!(
                text,
                "ingress \"s{scope}\" \"web{id}\" {{\n  host = \"web{id}.example.com\"\n  service = \"web{}\"\n}}\n",
                id - 1
            );
        } else {
            let _ = write!(
                text,
                "deployment \"s{scope}\" \"web{id}\" {{\n  image = \"busybox\"\n  env_from = [\"shared/db\"]\n  env = {{\n    ID = \"{id}\"\n    URL = \"${{ref.ingress.web{}.url}}\"\n  }}\n}}\n",
                id - id % 10 + 9
            );
        }
    }
    text
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// Medians of (all, own) for a store of `n` resources.
fn bench(n: usize) -> (Duration, Duration) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Store::open(&dir.path().join("state.db")).expect("store opens");
    let snapshot = Snapshot {
        commit: CommitSha::new("1".repeat(40)),
        files: vec![SourceFile {
            path: "all.hcl".to_owned(),
            contents: manifest_text(n).into_bytes(),
        }],
        refused: Vec::new(),
    };
    // Buckets first: a bucket change journals every workload already declared, which would
    // make this set-up quadratic (see issue 15).
    let pairs = |k: &str, v: &str| BTreeMap::from([(k.to_owned(), v.to_owned())]);
    store
        .config_set("shared", "db", &pairs("DB", "postgres://db"))
        .expect("config");
    for scope in 0..SCOPES {
        store
            .config_set(&format!("s{scope}"), "", &pairs("REGION", "eu"))
            .expect("config");
    }
    for id in (0..n).filter(|id| id % 10 != 9) {
        store
            .config_set(
                &format!("s{}", (id / 10) % SCOPES),
                &format!("web{id}"),
                &pairs("APP", "x"),
            )
            .expect("config");
    }
    let manifest = manifest::load(&snapshot, &LoadOptions::standalone()).expect("loads");
    store
        .apply_commit(&snapshot.commit, &manifest)
        .expect("applies");
    // The pass of one deployment in the middle.
    let id = n / 2 - (n / 2) % 10;
    let scope = format!("s{}", (id / 10) % SCOPES);
    let ingress = ResourceKey::new(Kind::Ingress, &scope, format!("web{}", id + 9));
    let service = ResourceKey::new(Kind::Deployment, &scope, format!("web{}", id + 8));
    let names = vec![
        ("shared".to_owned(), "db".to_owned()),
        (scope.clone(), String::new()),
        (scope.clone(), format!("web{id}")),
    ];
    let (mut all, mut own) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        let start = Instant::now();
        let desired = store.desired_all().expect("desired");
        let buckets = store.buckets().expect("buckets");
        all.push(start.elapsed());
        assert!(desired.len() == n && buckets.len() > n / 2);
        let start = Instant::now();
        let mut desired = store
            .desired_of(std::slice::from_ref(&ingress))
            .expect("desired");
        desired.extend(
            store
                .desired_of(std::slice::from_ref(&service))
                .expect("desired"),
        );
        let buckets = store.buckets_of(&names).expect("buckets");
        own.push(start.elapsed());
        assert!(desired.len() == 2 && buckets.len() == 3);
    }
    (median(all), median(own))
}

fn main() {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    if !std::env::args().any(|arg| arg == "--bench") {
        let (all, own) = bench(200);
        println!(
            "env_sources bench smoke run (200 resources, debug build): all {:.2} ms, own {:.2} ms; real figures: cargo bench --bench env_sources",
            ms(all),
            ms(own)
        );
        return;
    }
    println!("environment sources of one deployment pass, median of {RUNS} runs");
    let (all_1k, own_1k) = bench(1_000);
    let (all_10k, own_10k) = bench(10_000);
    for (n, all, own) in [(1_000, all_1k, own_1k), (10_000, all_10k, own_10k)] {
        println!(
            "{n:>6} resources: all (before) {:8.3} ms   own (now) {:7.3} ms   all / own {:7.1}",
            ms(all),
            ms(own),
            ms(all) / ms(own)
        );
    }
    println!(
        "10k / 1k ratio: all {:.2}, own {:.2} (10.0 = linear in the whole state)",
        ms(all_10k) / ms(all_1k),
        ms(own_10k) / ms(own_1k)
    );
}
