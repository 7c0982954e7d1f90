//! Issue 47, acceptance 3: a seeded property test of the seal between two sources. Source
//! `shop` (scope `shop`) holds an asset, a named volume, a claim, a published port and an
//! ingress host; generated commits of source `blog` (scope `blog`) mix references to both
//! sides: config buckets, asset references and asset files by path (with walks out of its
//! own), claims and named volumes, networks, `on_deploy` templates, published ports and
//! ingress hosts (as written, in upper case, with a trailing dot, a wildcard over them). Each
//! runs the agent's path: the manifest stage under blog's seal → the claims in the store
//! (checked, then recorded in the applying transaction) → the requests the handlers would send
//! → the sink (`Guarded`, with the store as its ledger). An independent oracle, written from
//! the README's rules and not from the code, checks everything that got through: nothing of
//! blog's may point at what shop holds.
//!
//! `VOODU_SEAL_SEED` and `VOODU_SEAL_CASES` choose the run (the seed is printed).

use std::path::Path;
use std::sync::Arc;

use voodu_agent::manifest::spec::{Claim, ClaimKind, Spec};
use voodu_agent::manifest::{self, LoadOptions};
use voodu_agent::model::policy::{ASSETS_DIR, OwnedPaths};
use voodu_agent::model::scopes::{Ownership, ScopePattern, Seal};
use voodu_agent::model::{CommitSha, Policy, Snapshot, SourceFile};
use voodu_agent::reconcile::requests::container_requests;
use voodu_agent::runtime::{ContainerSpec, Containers, Error, FakeRuntime, Guarded, Rules};
use voodu_agent::store::Store;

use crate::support::TestResult;

/// xorshift64*: small, seeded, the same sequence everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % n as u64).unwrap_or(0)
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }

    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
}

const SHOP_PORT: u16 = 18_080;

fn snapshot(path: &str, text: &str, n: usize) -> Snapshot {
    Snapshot {
        commit: CommitSha::new(format!("{n:040x}")),
        files: vec![SourceFile {
            path: path.to_owned(),
            contents: text.as_bytes().to_vec(),
        }],
        refused: Vec::new(),
    }
}

fn shop() -> String {
    format!(
        r#"asset "shop" "cfg" {{
  k = "shop's"
}}

deployment "shop" "web" {{
  image   = "busybox"
  ports   = ["127.0.0.1:{SHOP_PORT}:8080"]
  volumes = ["${{asset.shop.cfg.k}}:/etc/k:ro", "shopvol:/data"]
}}

statefulset "shop" "db" {{
  image = "busybox"
  volume_claim "data" {{
    mount_path = "/data"
  }}
}}

ingress "shop" "web" {{
  host = "shop.test"
  port = 8080
}}
"#
    )
}

/// One generated commit of blog.
fn case(rng: &mut Rng, data: &str) -> String {
    let env_from = match rng.below(4) {
        0 => "  env_from = [\"shop/web\"]\n".to_owned(),
        1 => "  env_from = [\"blog/web\", \"x\"]\n".to_owned(),
        _ => String::new(),
    };
    let volumes: Vec<String> = (0..rng.below(3))
        .map(|_| {
            let source = match rng.below(12) {
                0 => "${asset.blog.a.k}".to_owned(),
                1 => "${asset.shop.cfg.k}".to_owned(),
                2 => format!("{data}/{ASSETS_DIR}/shop/cfg/k"),
                3 => format!("{data}/{ASSETS_DIR}/blog/a/k"),
                4 => "${asset.blog.a.k}/../../../shop/cfg/k".to_owned(),
                5 => "${asset.blog.a.k}/../../../_unscoped/u/k".to_owned(),
                6 => "${asset.blog.a.k}/./../../a/k".to_owned(),
                7 => "voodu-shop-db-data-0".to_owned(),
                8 => "voodu-blog-db-data-0".to_owned(),
                9 => "shopvol".to_owned(),
                10 => "blogvol".to_owned(),
                _ => "voodu-shop-cache-data-0".to_owned(),
            };
            format!("\"{source}:/m{}\"", rng.below(100))
        })
        .collect();
    let ports = match rng.below(4) {
        0 => format!("  ports = [\"127.0.0.1:{SHOP_PORT}:80\"]\n"),
        1 => format!("  ports = [\"{SHOP_PORT}:80/udp\", \"127.0.0.1:18081:80\"]\n"),
        _ => String::new(),
    };
    let networks = match rng.below(6) {
        0 => "  networks = [\"voodu0-shop\"]\n",
        1 => "  networks = [\"voodu0-blog\"]\n",
        _ => "",
    };
    let hook = match rng.below(5) {
        0 => {
            "  on_deploy {\n    success {\n      url  = \"https://hooks.example/x\"\n      file = \"${asset.shop.cfg.k}\"\n    }\n  }\n"
        }
        1 => {
            "  on_deploy {\n    success {\n      url  = \"https://hooks.example/x\"\n      file = \"${asset.blog.a.k}\"\n    }\n  }\n"
        }
        2 => {
            "  on_deploy {\n    success {\n      url  = \"https://hooks.example/x\"\n      file = \"$${asset.shop.cfg.k}\"\n    }\n  }\n"
        }
        _ => "",
    };
    let ingress = if rng.chance(2) {
        let host = rng.pick(&[
            "shop.test",
            "SHOP.test",
            "shop.test.",
            "*.test",
            "blog.test",
            "api.blog.test",
        ]);
        let location = if rng.chance(3) {
            "  location {\n    path = \"/admin\"\n  }\n"
        } else {
            ""
        };
        format!("\ningress \"blog\" \"web\" {{\n  host = \"{host}\"\n  port = 8080\n{location}}}\n")
    } else {
        String::new()
    };
    let claim = if rng.chance(4) {
        "\nstatefulset \"blog\" \"db\" {\n  image = \"busybox\"\n  volume_claim \"data\" {\n    mount_path = \"/data\"\n  }\n}\n"
    } else {
        ""
    };
    format!(
        "asset \"blog\" \"a\" {{\n  k = \"blog's\"\n}}\n\ndeployment \"blog\" \"web\" {{\n  image   = \"busybox\"\n  volumes = [{}]\n{env_from}{ports}{networks}{hook}}}\n{ingress}{claim}",
        volumes.join(", ")
    )
}

/// What of shop's blog may not point at, from the README's rules ("several repositories":
/// everything a resource points at belongs to the source owning its scope; hosts compared
/// case-insensitively with every path under them; held first come).
fn violation(request: &ContainerSpec, data: &str) -> Option<String> {
    let shop_assets = Path::new(data).join(ASSETS_DIR).join("shop");
    let unscoped = Path::new(data).join(ASSETS_DIR).join("_unscoped");
    for bind in &request.binds {
        let source = bind.split(':').next().unwrap_or_default();
        if source.starts_with('/') {
            // Fold as Docker does, lexically.
            let mut folded = std::path::PathBuf::from("/");
            for part in Path::new(source).components() {
                match part {
                    std::path::Component::ParentDir => {
                        folded.pop();
                    }
                    std::path::Component::Normal(name) => folded.push(name),
                    _ => {}
                }
            }
            if folded.starts_with(&shop_assets) || folded.starts_with(&unscoped) {
                return Some(format!("binds {} (really {})", source, folded.display()));
            }
        } else if source == "shopvol" || source.starts_with("voodu-shop-") {
            return Some(format!("mounts shop's volume {source}"));
        }
    }
    if request
        .networks
        .iter()
        .any(|network| network != "voodu0-blog")
    {
        return Some(format!("joins {:?}", request.networks));
    }
    None
}

/// What of shop's a spec blog's commit declared points at, outside the requests.
fn spec_violation(spec: &Spec, text: &str) -> Option<String> {
    if text.contains("\"shop/") {
        return Some("reads a bucket of shop".to_owned());
    }
    if text.contains("asset.shop.") {
        return Some("references an asset of shop".to_owned());
    }
    for claim in spec.claims() {
        let shop_host = Claim {
            what: ClaimKind::Host,
            value: "shop.test".to_owned(),
        };
        if claim.collides(&shop_host) {
            return Some(format!("routes {}", claim.value));
        }
        // A port is one protocol's: shop publishes tcp.
        if claim.what == ClaimKind::Port && claim.value == format!("tcp/{SHOP_PORT}") {
            return Some(format!("publishes {}", claim.value));
        }
    }
    None
}

#[tokio::test]
async fn i47_no_commit_of_one_source_points_at_what_another_holds() -> TestResult {
    let seed = std::env::var("VOODU_SEAL_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or(0x5EA1_2026_u64);
    let cases: usize = std::env::var("VOODU_SEAL_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(1500);
    let dir = tempfile::tempdir()?;
    let base = std::fs::canonicalize(dir.path())?;
    let data = base.join("data").display().to_string();
    for (scope, name) in [("shop", "cfg"), ("blog", "a"), ("_unscoped", "u")] {
        let asset = Path::new(&data).join(ASSETS_DIR).join(scope).join(name);
        std::fs::create_dir_all(&asset)?;
        std::fs::write(asset.join("k"), scope)?;
    }
    let store = Arc::new(Store::open(&base.join("state.db"))?);
    let ownership = Arc::new(Ownership::new(vec![
        ("shop".to_owned(), vec![ScopePattern::parse("shop")?]),
        ("blog".to_owned(), vec![ScopePattern::parse("blog")?]),
    ])?);
    let host_policy = Policy {
        data_dir: Some(data.clone()),
        ..Policy::default()
    };
    let sealed_to = |source: &str| Policy {
        seal: Some(Seal::new(source, ownership.clone())),
        ..host_policy.clone()
    };
    let shop_manifest = manifest::load_with_policy(
        &snapshot("shop.hcl", &shop(), 0),
        &LoadOptions::standalone(),
        Some(&sealed_to("shop")),
    )
    .map_err(|diagnostics| diagnostics.to_string())?;
    store
        .for_source("shop")
        .apply_commit(&CommitSha::new("f".repeat(40)), &shop_manifest)?;
    let blog_store = store.for_source("blog");
    let blog_policy = sealed_to("blog");
    let fake = Arc::new(FakeRuntime::new());
    let sink = Guarded::new(
        Arc::clone(&fake),
        Rules::new(host_policy.clone(), OwnedPaths::for_data_dir(&data)).sealing(ownership.clone()),
    );
    sink.set_ledger(store.clone());
    sink.ensure_network("voodu0-blog").await?;
    let assets_root = Path::new(&data).join(ASSETS_DIR);
    let mut rng = Rng(seed | 1);
    let (mut decoded, mut accepted, mut sent, mut refused_at_sink) = (0, 0, 0, 0);
    let mut sent_unsealed = 0;
    let mut violations = Vec::new();
    for index in 0..cases {
        let text = case(&mut rng, &data);
        // The sink alone, as the guarantee: the same commit loaded without the seal (as a
        // stored spec of an older agent would be) sends nothing of shop's either.
        if let Ok(unsealed) = manifest::load_with_policy(
            &snapshot("blog.hcl", &text, index + 1),
            &LoadOptions::standalone(),
            Some(&host_policy),
        ) {
            for resource in &unsealed.resources {
                for request in container_requests(resource, &assets_root, &ownership) {
                    let request = request?;
                    match sink.create(&request).await {
                        Ok(id) => {
                            sink.remove(&id).await?;
                            sent_unsealed += 1;
                            if let Some(why) = violation(&request, &data) {
                                violations.push(format!("at the sink alone: {why}\n{text}"));
                            }
                        }
                        Err(Error::Refused { .. }) => refused_at_sink += 1,
                        Err(other) => return Err(format!("{other}\n{text}").into()),
                    }
                }
            }
        }
        let manifest = match manifest::load_with_policy(
            &snapshot("blog.hcl", &text, index + 1),
            &LoadOptions::standalone(),
            Some(&blog_policy),
        ) {
            Ok(manifest) => manifest,
            Err(_) => continue,
        };
        decoded += 1;
        if !blog_store.claim_conflicts(&manifest)?.is_empty() {
            continue;
        }
        // Applied as the sync stage applies it: the claims checked again and recorded.
        blog_store.apply_commit(&CommitSha::new(format!("{:040x}", index + 1)), &manifest)?;
        accepted += 1;
        for resource in &manifest.resources {
            if let Some(why) = spec_violation(&resource.spec, resource.spec_json()) {
                violations.push(format!("{why}\n{text}"));
            }
            for request in container_requests(resource, &assets_root, &ownership) {
                let request = request?;
                match sink.create(&request).await {
                    Ok(id) => {
                        sink.remove(&id).await?;
                        sent += 1;
                        if let Some(why) = violation(&request, &data) {
                            violations.push(format!("{why}\n{text}"));
                        }
                    }
                    Err(Error::Refused { .. }) => refused_at_sink += 1,
                    Err(other) => return Err(format!("{other}\n{text}").into()),
                }
            }
        }
    }
    println!(
        "seal property: seed {seed:#x}, {cases} cases, {decoded} passed the manifest stage, {accepted} held nothing of shop's, {sent} requests sent; unsealed: {sent_unsealed} sent and {refused_at_sink} refused at the sink; {} violations",
        violations.len()
    );
    assert!(
        violations.is_empty(),
        "{} violations, first:\n{}",
        violations.len(),
        violations[0]
    );
    // The generator reaches both sides of every rule.
    assert!(
        sent > 50 && accepted < decoded && decoded < cases && refused_at_sink > 50,
        "{sent} sent, {accepted} accepted of {decoded} decoded of {cases}, {refused_at_sink} refused at the sink"
    );
    Ok(())
}
