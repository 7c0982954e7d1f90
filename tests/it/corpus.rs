//! Conformance with voodu's own example manifests (`../shared/corpus/voodu-examples`, read in
//! place: they are voodu's files, not the project's). Every set validates once its `${VAR}`s
//! are supplied (each undefined one is first reported at the exact file:line:col that uses
//! it), and planning a set yields the resources voodu would create from it: an `app` becomes
//! a deployment plus an ingress, `postgres`/`redis` become statefulsets plus an asset of
//! their scripts.
//!
//! Issue 12: voodu's newer examples (`../shared/corpus/voodu-examples-new`) too: every set
//! validates, except the negative drain case (voodu's duration message) and `hep3` (the agent
//! cannot build its image, and says so); `plan` yields what voodu would create, a workload
//! with a plugin block as a failure with voodu's message.
//!
//! Without the corpus folder (a user's own clone) the tests print a SKIPPED line.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use voodu_agent::git::{WorkdirFiles, read_workdir};
use voodu_agent::manifest::spec::Spec;
use voodu_agent::manifest::{self, LoadOptions, Mode, UrlFetcher, Vars};
use voodu_agent::reconcile::plan::{Action, plan_all};

use crate::support::TestResult;

/// The resources each set yields, as `kind/scope/name`: checked by hand against the files.
const EXPECTED: &[(&str, &[&str])] = &[
    (
        "app",
        &[
            "asset/data/cache",
            // postgres now expands to an asset (its scripts) and a statefulset (issue 12).
            "asset/data/pg",
            "asset/prod/webhooks",
            "deployment/prod/api",
            "ingress/prod/api",
            "registry/ghcr",
            "statefulset/data/cache",
            "statefulset/data/pg",
        ],
    ),
    (
        "autoscale",
        &[
            "deployment/prod/api",
            "deployment/prod/sidekiq",
            "ingress/prod/api",
        ],
    ),
    (
        "build",
        &[
            "deployment/demo/web",
            "deployment/shop/api",
            "deployment/shop/scheduler",
            "deployment/shop/worker",
            "deployment/voice/fsw",
            "ingress/demo/web",
            "ingress/shop/api",
            "statefulset/data/pg",
        ],
    ),
    (
        "docker-passthrough",
        &[
            "deployment/demo/api",
            "deployment/demo/search",
            "statefulset/data/redis",
        ],
    ),
    (
        "fsw-esl",
        &[
            "asset/fsw/redis",
            "deployment/fsw/adapter",
            "deployment/fsw/api",
            "deployment/fsw/controller",
            "deployment/fsw/events",
            "deployment/fsw/jobs",
            "statefulset/fsw/rabbitmq",
            "statefulset/fsw/redis",
        ],
    ),
    ("fullstack", &["deployment/clowk/api", "ingress/clowk/api"]),
    (
        "ingress",
        &[
            "deployment/acme/api-v1",
            "deployment/acme/api-v2",
            "ingress/acme/api-dual",
            "ingress/acme/api-v1",
            "ingress/acme/api-v2",
            "ingress/clowk/landing",
            "ingress/clowk/voodu-docs",
            "ingress/public/api_http",
            "ingress/public/api_internal",
            "ingress/public/api_public",
            "ingress/public/tenants_wildcard",
        ],
    ),
    (
        "init",
        &[
            "deployment/prod/api",
            "deployment/prod/rails-web",
            "ingress/prod/rails-web",
            "statefulset/data/pg",
        ],
    ),
    (
        "multi-env",
        &["deployment/clowk-lp/web", "ingress/clowk-lp/web"],
    ),
    (
        "on_deploy",
        &[
            "asset/prod/slack",
            "asset/prod/webhooks",
            "deployment/prod/api",
            "deployment/prod/checkout",
            "ingress/prod/checkout",
        ],
    ),
    (
        "probes",
        &[
            "deployment/prod/api",
            "deployment/prod/rails-web",
            "ingress/prod/api",
            "ingress/prod/rails-web",
            "statefulset/data/cache",
            "statefulset/data/pg",
        ],
    ),
    ("procfile", &[]),
    (
        "registry",
        &[
            "deployment/acme/api",
            "deployment/internal/backend",
            "deployment/public/marketing-site",
            "registry/ghcr",
            "registry/harbor",
        ],
    ),
    (
        "shared-scope",
        &[
            "deployment/clowk/api",
            "deployment/clowk/app",
            "deployment/clowk/jobs",
            "deployment/clowk/lp",
            "ingress/clowk/api",
            "ingress/clowk/app",
            "ingress/clowk/lp",
        ],
    ),
    (
        "stack",
        &[
            "asset/data/cache",
            // postgres now expands to an asset (its scripts) and a statefulset (issue 12).
            "asset/data/pg",
            "asset/data/pg-config",
            "asset/data/redis-config",
            "deployment/myapp/web",
            "ingress/myapp/web",
            "statefulset/data/cache",
            "statefulset/data/pg",
        ],
    ),
    (
        "statefulset",
        &["statefulset/data/cache", "statefulset/data/pg"],
    ),
];

/// `asset/basic.hcl` reads `./tls/ca-bundle.pem`, which the folder does not hold: voodu's CLI
/// reads `file()` at parse time and fails on it too, so planning that set is an error, at the
/// line that names the file. `validate` (a static check) warns instead.
const ASSET_SET_ERROR: &str = r#"basic.hcl:56:9: file(): "./tls/ca-bundle.pem" does not exist in the repo (looked for "tls/ca-bundle.pem")"#;

/// voodu's example sets. Without them (no `../shared` beside the checkout) build.rs sets
/// `voodu_corpus_missing` and these tests are reported as ignored; run anyway
/// (`--include-ignored`, as scripts/test does), they fail here.
fn corpus() -> TestResult<PathBuf> {
    let dir = crate::support::corpus_root().join("voodu-examples");
    if dir.is_dir() {
        Ok(dir)
    } else {
        Err(format!(
            "{} not found: the corpus lives beside the checkout for developers and in CI",
            dir.display()
        )
        .into())
    }
}

fn sets(corpus: &Path) -> TestResult<Vec<(String, PathBuf)>> {
    let mut sets: Vec<(String, PathBuf)> = std::fs::read_dir(corpus)?
        .filter_map(Result::ok)
        .filter(|entry| entry.path().is_dir())
        .map(|entry| {
            (
                entry.file_name().to_string_lossy().into_owned(),
                entry.path(),
            )
        })
        .collect();
    sets.sort();
    Ok(sets)
}

/// `(file, line, col, NAME)` of every "undefined variable" line `validate` printed.
fn undefined_variables(output: &str) -> Vec<(String, usize, usize, String)> {
    output
        .lines()
        .filter_map(|line| {
            let (location, message) = line.split_once(": undefined variable `")?;
            let name = message.split('`').next()?.to_owned();
            let mut parts = location.rsplitn(3, ':');
            let col = parts.next()?.parse().ok()?;
            let line_number = parts.next()?.parse().ok()?;
            let file = parts.next()?.to_owned();
            Some((file, line_number, col, name))
        })
        .collect()
}

fn validate(dir: &Path, vars: &BTreeSet<String>) -> TestResult<(Option<i32>, String)> {
    let mut command = Command::new(env!("CARGO_BIN_EXE_voodu-agent"));
    command.arg("validate").arg(dir);
    for name in vars {
        command.args(["--var", &format!("{name}=value-of-{name}")]);
    }
    let output = command.output()?;
    Ok((output.status.code(), String::from_utf8(output.stdout)?))
}

#[cfg_attr(
    voodu_corpus_missing,
    ignore = "needs voodu's corpus (../shared/corpus beside the checkout, or VOODU_CORPUS_DIR): scripts/test says how"
)]
#[test]
fn every_set_validates_once_its_variables_are_supplied() -> TestResult {
    let corpus = corpus()?;
    let sets = sets(&corpus)?;
    assert_eq!(
        sets.len(),
        EXPECTED.len() + 1,
        "a set was added or removed: update EXPECTED"
    );
    for (name, dir) in sets {
        let (code, output) = validate(&dir, &BTreeSet::new())?;
        let undefined = undefined_variables(&output);
        assert_eq!(
            code == Some(0),
            undefined.is_empty(),
            "{name}: without variables, validate fails exactly when a variable is undefined:\n{output}"
        );
        let mut names = BTreeSet::new();
        for (file, line, col, variable) in &undefined {
            // The location is exact: that line, at that column, starts `${NAME`.
            let text = std::fs::read_to_string(dir.join(file))?;
            let source_line = text.lines().nth(line - 1).unwrap_or_default();
            let at: String = source_line.chars().skip(col - 1).collect();
            assert!(
                at.starts_with(&format!("${{{variable}")),
                "{name}: {file}:{line}:{col} should point at ${{{variable}…}}, the line is {source_line:?}"
            );
            names.insert(variable.clone());
        }
        let (code, output) = validate(&dir, &names)?;
        assert_eq!(code, Some(0), "{name} with {names:?}:\n{output}");
        assert!(
            output
                .lines()
                .last()
                .unwrap_or_default()
                .starts_with("ok: "),
            "{name}:\n{output}"
        );
    }
    Ok(())
}

/// Stands in for the network (this machine has none): every `url()` yields fixed bytes.
struct StubFetcher;

impl UrlFetcher for StubFetcher {
    fn fetch(
        &self,
        url: &str,
        _timeout: Duration,
        _stale_ok: bool,
    ) -> Result<Vec<u8>, manifest::UrlError> {
        Ok(format!("fetched from {url}\n").into_bytes())
    }
}

/// Loads a set the way `plan` does (apply mode), supplying a value for every `${VAR}`.
pub(crate) fn load_set(
    dir: &Path,
) -> TestResult<Result<manifest::Manifest, manifest::Diagnostics>> {
    let snapshot = read_workdir(dir, &[])?;
    let files = WorkdirFiles::new(dir);
    let mut vars = Vars::default();
    let probe = LoadOptions {
        vars: &vars,
        files: &files,
        fetcher: None,
        mode: Mode::Validate,
        max_file_bytes: manifest::DEFAULT_MAX_FILE_BYTES,
        missing_var_hint: "",
    };
    if let Err(diagnostics) = manifest::load(&snapshot, &probe) {
        for diagnostic in &diagnostics.0 {
            if let Some(rest) = diagnostic.message.strip_prefix("undefined variable `") {
                let name = rest.split('`').next().unwrap_or_default().to_owned();
                vars.globals
                    .insert(name.clone(), format!("value-of-{name}"));
            }
        }
    }
    let options = LoadOptions {
        vars: &vars,
        files: &files,
        fetcher: Some(&StubFetcher),
        mode: Mode::Apply,
        max_file_bytes: manifest::DEFAULT_MAX_FILE_BYTES,
        missing_var_hint: "",
    };
    Ok(manifest::load(&snapshot, &options))
}

#[cfg_attr(
    voodu_corpus_missing,
    ignore = "needs voodu's corpus (../shared/corpus beside the checkout, or VOODU_CORPUS_DIR): scripts/test says how"
)]
#[test]
fn plan_yields_the_resources_voodu_would_create() -> TestResult {
    let corpus = corpus()?;
    for (name, expected) in EXPECTED {
        let manifest = match load_set(&corpus.join(name))? {
            Ok(manifest) => manifest,
            Err(diagnostics) => return Err(format!("{name} must load:\n{diagnostics}").into()),
        };
        let plans = plan_all(
            &manifest,
            &Default::default(),
            &Default::default(),
            &Default::default(),
        );
        assert!(
            plans.iter().all(|plan| plan.action == Action::Create),
            "{name}: against an empty host everything is created"
        );
        let keys: Vec<String> = plans.iter().map(|plan| plan.key.to_string()).collect();
        assert_eq!(keys, *expected, "{name}");
    }
    let asset_set = load_set(&corpus.join("asset"))?;
    match asset_set {
        Ok(_) => {
            return Err("the asset set reads a file it does not hold; it must not load".into());
        }
        Err(diagnostics) => assert_eq!(diagnostics.to_string(), ASSET_SET_ERROR),
    }
    Ok(())
}

#[cfg_attr(
    voodu_corpus_missing,
    ignore = "needs voodu's corpus (../shared/corpus beside the checkout, or VOODU_CORPUS_DIR): scripts/test says how"
)]
#[test]
fn macros_and_app_expand_as_voodus_plugins_do() -> TestResult {
    let corpus = corpus()?;
    let manifest = load_set(&corpus.join("app"))?.map_err(|d| d.to_string())?;
    let spec = |key: &str| {
        manifest
            .resources
            .iter()
            .find(|resource| resource.key.to_string() == key)
            .map(|resource| resource.spec.clone())
            .ok_or_else(|| format!("{key} missing"))
    };
    let Spec::Statefulset(pg) = spec("statefulset/data/pg")? else {
        return Err("postgres expands to a statefulset".into());
    };
    assert_eq!(
        pg.container.image, "postgres:16",
        "the operator's image wins"
    );
    assert_eq!(pg.volume_claims[0].mount_path, "/var/lib/postgresql/data");
    let readiness = pg
        .probes
        .as_ref()
        .and_then(|probes| probes.readiness.as_ref());
    assert_eq!(
        readiness
            .and_then(|probe| probe.exec.as_ref())
            .map(|exec| exec.command.clone()),
        Some(vec![
            "pg_isready".into(),
            "-U".into(),
            "postgres".into(),
            "-d".into(),
            "myapp".into()
        ]),
        "the operator's probes replace the plugin's"
    );
    assert!(
        manifest
            .secrets
            .iter()
            .any(|secret| secret.key == "POSTGRES_PASSWORD"),
        "a password is generated into the resource's own bucket"
    );
    let Spec::Statefulset(cache) = spec("statefulset/data/cache")? else {
        return Err("redis expands to a statefulset".into());
    };
    assert!(
        cache
            .container
            .volumes
            .iter()
            .any(|volume| volume.starts_with("${asset.data.cache.redis_conf}"))
    );
    assert!(matches!(spec("asset/data/cache")?, Spec::Asset(_)));
    let Spec::Ingress(ingress) = spec("ingress/prod/api")? else {
        return Err("app yields an ingress".into());
    };
    assert_eq!(
        (
            ingress.host.as_str(),
            ingress.service.as_str(),
            ingress.port
        ),
        ("api.acme.com", "", 0)
    );
    let Spec::Deployment(api) = spec("deployment/prod/api")? else {
        return Err("app yields a deployment".into());
    };
    assert_eq!(
        api.replicas,
        Some(3),
        "autoscale without replicas starts at min"
    );
    assert_eq!(
        api.asset_digests.keys().cloned().collect::<Vec<_>>(),
        ["prod.webhooks.pagerduty_failure"],
        "the on_deploy file template's digest is stamped"
    );
    Ok(())
}

/// Issue 10: the corpus is checked for its FORMAT above (no policy). Under the host's
/// default-deny policy, `build/custom-dockerfile.hcl` (host networking, `cap_add`) is refused
/// with the settings that would allow it; with those settings the set is accepted.
#[cfg_attr(
    voodu_corpus_missing,
    ignore = "needs voodu's corpus (../shared/corpus beside the checkout, or VOODU_CORPUS_DIR): scripts/test says how"
)]
#[test]
fn host_policy_refuses_the_custom_dockerfile_example_until_allowed() -> TestResult {
    let corpus = corpus()?;
    let build = corpus.join("build");
    let check = |policy: &[&str], code: i32, expected: &[&str]| -> TestResult {
        let output = Command::new(env!("CARGO_BIN_EXE_voodu-agent"))
            .arg("validate")
            .arg(&build)
            .args(policy)
            .output()?;
        let stdout = String::from_utf8(output.stdout)?;
        assert_eq!(output.status.code(), Some(code), "{policy:?}: {stdout}");
        assert_eq!(stdout.lines().collect::<Vec<_>>(), expected, "{policy:?}");
        Ok(())
    };
    check(
        &["--policy", "default"],
        1,
        &[
            r#"custom-dockerfile.hcl:33:3: host networking (network_mode = "host") is refused by the host policy; start the agent with --allow-host-network to allow it"#,
            "custom-dockerfile.hcl:35:3: capability SYS_NICE (cap_add) is refused by the host policy; start the agent with --allow-cap SYS_NICE to allow it",
            "custom-dockerfile.hcl:35:3: capability NET_ADMIN (cap_add) is refused by the host policy; start the agent with --allow-cap NET_ADMIN to allow it",
            "3 errors in 4 files; nothing would be applied",
        ],
    )?;
    let accepted = &["ok: 8 resources in 4 files (5 deployment, 2 ingress, 1 statefulset)"];
    check(
        &[
            "--allow-host-network",
            "--allow-cap",
            "SYS_NICE",
            "--allow-cap",
            "NET_ADMIN",
        ],
        0,
        accepted,
    )?;
    // No policy: the format alone.
    check(&[], 0, accepted)
}

/// voodu's newer examples (`../shared/corpus/voodu-examples-new`), read in place.
fn new_corpus() -> TestResult<PathBuf> {
    let dir = corpus()?.with_file_name("voodu-examples-new");
    if dir.is_dir() {
        Ok(dir)
    } else {
        Err(format!("{} not found", dir.display()).into())
    }
}

#[cfg_attr(
    voodu_corpus_missing,
    ignore = "needs voodu's corpus (../shared/corpus beside the checkout, or VOODU_CORPUS_DIR): scripts/test says how"
)]
#[test]
fn drain_blocks_load_and_a_bad_drain_duration_is_refused_as_voodu_refuses_it() -> TestResult {
    let snippets = new_corpus()?.join("clowk-voodu/docs-snippets");
    let manifest = load_set(&snippets.join("drain"))?
        .map_err(|diagnostics| format!("the drain snippets must load:\n{diagnostics}"))?;
    let drains: Vec<(String, String, String)> = manifest
        .resources
        .iter()
        .filter_map(|resource| match &resource.spec {
            Spec::Deployment(deployment) => {
                let drain = deployment.drain.clone()?;
                Some((resource.key.to_string(), drain.grace, drain.timeout))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        drains,
        [
            ("deployment/prod/api".into(), "60s".into(), "30m".into()),
            (
                "deployment/prod/worker".into(),
                "120s".into(),
                String::new()
            ),
        ]
    );
    let diagnostics = match load_set(&snippets.join("invalid-drain-timeout"))? {
        Ok(_) => return Err("a drain timeout of \"30min\" must be refused".into()),
        Err(diagnostics) => diagnostics,
    };
    let found: Vec<(usize, String)> = diagnostics
        .0
        .iter()
        .map(|diagnostic| (diagnostic.line, diagnostic.message.clone()))
        .collect();
    assert_eq!(
        found,
        [(
            9,
            r#"deployment.drain.timeout: "30min" is not a duration (want e.g. "30s", "5m", "1h30m")"#
                .to_owned()
        )]
    );
    Ok(())
}

/// Where a set of the newer corpus keeps its manifests, and what comes of it.
struct NewSet {
    /// The set's folder under `voodu-examples-new` (README's "path").
    dir: &'static str,
    /// The manifests, when they live elsewhere: the registry set's `.envrc.example` names the
    /// variables of `voodu-examples/registry/*.hcl`.
    manifests_in_old_corpus: Option<&'static str>,
    /// `validate`'s diagnostics when the set is refused (empty: it validates).
    refused: &'static [&'static str],
    /// What `plan` yields on an empty host, `<action> <kind/scope/name>`, failures with the
    /// message the resource's status will carry.
    plan: &'static [&'static str],
}

/// Every set of `../shared/corpus/voodu-examples-new` (README), checked by hand against the
/// files, the plugins' code and voodu's docs (issue 12).
const NEW_SETS: &[NewSet] = &[
    NewSet {
        dir: "clowk-voodu/docs-snippets/cross-vm-ingress",
        manifests_in_old_corpus: None,
        refused: &[],
        plan: &["create ingress/clowk/api"],
    },
    NewSet {
        dir: "clowk-voodu/docs-snippets/cross-vm-postgres",
        manifests_in_old_corpus: None,
        refused: &[],
        plan: &[
            "create asset/clowk/pg",
            "create asset/hep3/pg",
            "create asset/yourapp/pg",
            "create statefulset/clowk/pg",
            "create statefulset/hep3/pg",
            "create statefulset/yourapp/pg",
        ],
    },
    NewSet {
        dir: "clowk-voodu/docs-snippets/drain",
        manifests_in_old_corpus: None,
        refused: &[],
        plan: &[
            "create deployment/prod/api",
            "create deployment/prod/worker",
        ],
    },
    NewSet {
        dir: "clowk-voodu/docs-snippets/drain-plugin-block",
        manifests_in_old_corpus: None,
        refused: &[],
        plan: &[
            "fail deployment/prod/esl: deployment/prod/esl: block \"trafik\" belongs to a plugin named \"trafik\", which is not installed — run `vd plugins:install <source>` or remove the block (at esl.hcl:13:3; voodu-agent installs no plugins)",
        ],
    },
    NewSet {
        dir: "clowk-voodu/docs-snippets/invalid-drain-timeout",
        manifests_in_old_corpus: None,
        refused: &[
            r#"bad.hcl:9:5: deployment.drain.timeout: "30min" is not a duration (want e.g. "30s", "5m", "1h30m")"#,
        ],
        plan: &[],
    },
    NewSet {
        dir: "clowk-voodu/docs-snippets/plugin-blocks-labelled",
        manifests_in_old_corpus: None,
        refused: &[],
        plan: &[
            "fail deployment/prod/esl: deployment/prod/esl: block \"trafik\" belongs to a plugin named \"trafik\", which is not installed — run `vd plugins:install <source>` or remove the block (at esl.hcl:5:3; voodu-agent installs no plugins)",
        ],
    },
    NewSet {
        dir: "clowk-voodu/examples/registry",
        manifests_in_old_corpus: Some("registry"),
        refused: &[],
        plan: &[
            "create deployment/acme/api",
            "create deployment/internal/backend",
            "create deployment/public/marketing-site",
            "create registry/ghcr",
            "create registry/harbor",
        ],
    },
    // voodu installs the hep3 plugin, whose install hook builds the image: the agent cannot,
    // and says so where the block is (docs/differences-from-voodu.md).
    NewSet {
        dir: "voodu-hep3/examples",
        manifests_in_old_corpus: None,
        refused: &[
            "hep3-api.voodu:22:1: hep3 \"fsw\" \"hep3-api\" is not supported by this agent: its image (voodu-hep3-api:<version>) is built by the voodu-hep3 plugin's install hook, and voodu-agent installs and runs no plugins; build that image on this host yourself and declare the reader as a `deployment` (a hep3 block is a deployment spec plus `store`, which becomes HEP_STORE)",
        ],
        plan: &[],
    },
    NewSet {
        dir: "voodu-postgres/examples",
        manifests_in_old_corpus: None,
        refused: &[],
        plan: &[
            "create asset/clowk-lp/db",
            "create cronjob/clowk-lp/wal-cleanup",
            "create cronjob/clowk-lp/wal-sync-r2",
            "create cronjob/clowk-lp/wal-sync-s3",
            "create statefulset/clowk-lp/db",
        ],
    },
    NewSet {
        dir: "voodu-redis/examples/custom-acls",
        manifests_in_old_corpus: None,
        refused: &[],
        plan: &[
            "create asset/clowk-lp/redis",
            "create asset/clowk-lp/redis-users",
            "create statefulset/clowk-lp/redis",
        ],
    },
    NewSet {
        dir: "voodu-redis/examples/sentinel-ha",
        manifests_in_old_corpus: None,
        refused: &[],
        plan: &[
            "create asset/clowk-lp/redis",
            "create asset/clowk-lp/redis-quorum",
            "create statefulset/clowk-lp/redis",
            "create statefulset/clowk-lp/redis-quorum",
        ],
    },
];

/// The registry set's variables, as `.envrc.example` writes them.
const ENVRC: &str = "clowk-voodu/examples/registry/.envrc.example";

/// The folders of the newer corpus that hold a set: manifests, or the registry's `.envrc`.
fn new_set_dirs(root: &Path) -> TestResult<Vec<String>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<String>) -> std::io::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.is_dir() {
                walk(root, &path, out)?;
                continue;
            }
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            if name.ends_with(".hcl") || name.ends_with(".voodu") || name == ".envrc.example" {
                let parent = path.parent().unwrap_or(root);
                let relative = parent.strip_prefix(root).unwrap_or(parent);
                out.insert(relative.display().to_string());
            }
        }
        Ok(())
    }
    let mut dirs = BTreeSet::new();
    walk(root, root, &mut dirs)?;
    Ok(dirs.into_iter().collect())
}

fn manifests_dir(set: &NewSet) -> TestResult<PathBuf> {
    Ok(match set.manifests_in_old_corpus {
        Some(old) => corpus()?.join(old),
        None => new_corpus()?.join(set.dir),
    })
}

#[cfg_attr(
    voodu_corpus_missing,
    ignore = "needs voodu's corpus (../shared/corpus beside the checkout, or VOODU_CORPUS_DIR): scripts/test says how"
)]
#[test]
fn i12_every_newer_set_validates_or_is_refused_where_the_agent_cannot_run_it() -> TestResult {
    let root = new_corpus()?;
    let listed: Vec<&str> = NEW_SETS.iter().map(|set| set.dir).collect();
    assert_eq!(
        new_set_dirs(&root)?,
        listed,
        "a set was added or removed: update NEW_SETS"
    );
    for set in NEW_SETS {
        let dir = manifests_dir(set)?;
        let mut command = Command::new(env!("CARGO_BIN_EXE_voodu-agent"));
        command.arg("validate").arg(&dir);
        if set.manifests_in_old_corpus.is_some() {
            // Without values, exactly the variables `.envrc.example` names are missing.
            let (code, output) = validate(&dir, &BTreeSet::new())?;
            assert_eq!(code, Some(1), "{}", set.dir);
            let missing: BTreeSet<String> = undefined_variables(&output)
                .into_iter()
                .map(|(_, _, _, name)| name)
                .collect();
            let named: BTreeSet<String> =
                manifest::parse_env_file(&std::fs::read_to_string(root.join(ENVRC))?)?
                    .into_keys()
                    .collect();
            assert_eq!(missing, named, "{}", set.dir);
            command.arg("--var-file").arg(root.join(ENVRC));
        }
        let output = command.output()?;
        let stdout = String::from_utf8(output.stdout)?;
        let lines: Vec<&str> = stdout.lines().collect();
        if set.refused.is_empty() {
            assert_eq!(output.status.code(), Some(0), "{}:\n{stdout}", set.dir);
            assert!(
                lines.last().is_some_and(|last| last.starts_with("ok: ")),
                "{}:\n{stdout}",
                set.dir
            );
        } else {
            assert_eq!(output.status.code(), Some(1), "{}:\n{stdout}", set.dir);
            assert_eq!(
                lines[..lines.len() - 1],
                *set.refused,
                "{}: refused with exactly these diagnostics",
                set.dir
            );
        }
    }
    Ok(())
}

#[cfg_attr(
    voodu_corpus_missing,
    ignore = "needs voodu's corpus (../shared/corpus beside the checkout, or VOODU_CORPUS_DIR): scripts/test says how"
)]
#[test]
fn i12_plan_yields_what_voodu_would_create_from_the_newer_sets() -> TestResult {
    for set in NEW_SETS.iter().filter(|set| set.refused.is_empty()) {
        let manifest = load_set(&manifests_dir(set)?)?
            .map_err(|diagnostics| format!("{} must load:\n{diagnostics}", set.dir))?;
        let plans = plan_all(
            &manifest,
            &Default::default(),
            &Default::default(),
            &Default::default(),
        );
        let lines: Vec<String> = plans
            .iter()
            .map(|plan| match &plan.failure {
                Some(failure) => format!("{} {}: {failure}", plan.action.as_str(), plan.key),
                None => format!("{} {}", plan.action.as_str(), plan.key),
            })
            .collect();
        assert_eq!(lines, set.plan, "{}", set.dir);
    }
    Ok(())
}

/// The spec a loaded set holds for `key`.
fn spec_of(manifest: &manifest::Manifest, key: &str) -> TestResult<Spec> {
    manifest
        .resources
        .iter()
        .find(|resource| resource.key.to_string() == key)
        .map(|resource| resource.spec.clone())
        .ok_or_else(|| format!("{key} missing").into())
}

/// What the plugins would set up, field by field, for the macro sets (voodu-postgres da3253d,
/// voodu-redis 4dd3b77).
#[cfg_attr(
    voodu_corpus_missing,
    ignore = "needs voodu's corpus (../shared/corpus beside the checkout, or VOODU_CORPUS_DIR): scripts/test says how"
)]
#[test]
fn i12_the_newer_macro_sets_expand_as_the_plugins_set_them_up() -> TestResult {
    let root = new_corpus()?;
    let load = |dir: &str| -> TestResult<manifest::Manifest> {
        Ok(load_set(&root.join(dir))?.map_err(|d| format!("{dir}: {d}"))?)
    };

    // postgres: 3 pods of the operator's image, 1 primary + 2 standbys, pg_config from the
    // first boot, and the stale `wal_archive {}` dropped with a warning.
    let pg_set = load("voodu-postgres/examples")?;
    let Spec::Statefulset(db) = spec_of(&pg_set, "statefulset/clowk-lp/db")? else {
        return Err("postgres expands to a statefulset".into());
    };
    assert_eq!(db.container.image, "postgres:16");
    assert_eq!(db.replicas, Some(3));
    assert_eq!(
        db.roles().as_deref(),
        Some("postgres: primary pod 0 and 2 streaming standbys (pods 1–2)")
    );
    assert_eq!(
        db.container.command.as_deref().map(|command| command.join(" ")),
        Some(
            "sh /usr/local/bin/voodu-postgres-entrypoint -c max_connections=50 -c shared_buffers=256MB -c work_mem=16MB"
                .to_owned()
        )
    );
    assert_eq!(
        db.container.env.get("POSTGRES_DB").map(String::as_str),
        Some("clowk_development")
    );
    let secrets: Vec<&str> = pg_set
        .secrets
        .iter()
        .map(|secret| secret.key.as_str())
        .collect();
    assert_eq!(
        secrets,
        ["POSTGRES_PASSWORD", "POSTGRES_REPLICATION_PASSWORD"]
    );
    let warnings: Vec<String> = pg_set.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(
        warnings,
        [
            "postgres.voodu:27:3: `wal_archive {}` is ignored: voodu-postgres no longer has a WAL archive and voodu drops the block; archive WAL yourself (`pg_config = { archive_mode = \"on\", archive_command = … }`)"
        ]
    );

    // `version = "16"` picks the tag, in each of the three scopes.
    let cross_vm = load("clowk-voodu/docs-snippets/cross-vm-postgres")?;
    for scope in ["clowk", "hep3", "yourapp"] {
        let Spec::Statefulset(pg) = spec_of(&cross_vm, &format!("statefulset/{scope}/pg"))? else {
            return Err("postgres expands to a statefulset".into());
        };
        assert_eq!(pg.container.image, "postgres:16", "{scope}");
        assert_eq!(
            pg.container.env.get("PG_SCOPE_SUFFIX").map(String::as_str),
            Some(format!(".{scope}.voodu").as_str()),
            "standbys dial pg-0.{scope}.voodu"
        );
    }

    // redis with sentinel: a 3-pod data redis (1 master, 2 replicas) and a 3-sentinel quorum
    // watching it, reading its bucket.
    let ha = load("voodu-redis/examples/sentinel-ha")?;
    let Spec::Statefulset(data) = spec_of(&ha, "statefulset/clowk-lp/redis")? else {
        return Err("redis expands to a statefulset".into());
    };
    assert_eq!(
        data.roles().as_deref(),
        Some("redis: master pod 0 and 2 replicas (pods 1–2)")
    );
    let Spec::Statefulset(quorum) = spec_of(&ha, "statefulset/clowk-lp/redis-quorum")? else {
        return Err("a sentinel expands to a statefulset".into());
    };
    assert_eq!(
        quorum.roles().as_deref(),
        Some("redis sentinel: 3 sentinel(s), quorum 2, watching clowk-lp/redis")
    );
    assert_eq!(quorum.container.image, "redis:8");
    assert_eq!(quorum.ports, ["26379"]);
    assert_eq!(quorum.container.env_from, ["clowk-lp/redis"]);
    assert_eq!(
        quorum
            .container
            .env
            .get("VOODU_CONTROLLER_URL")
            .map(String::as_str),
        Some("http://host.docker.internal:8080"),
        "the operator's env passes through"
    );

    // custom ACLs: the url() asset is mounted where the redis config includes it, and its
    // digest is stamped so new users roll the pods.
    let acls = load("voodu-redis/examples/custom-acls")?;
    let Spec::Statefulset(redis) = spec_of(&acls, "statefulset/clowk-lp/redis")? else {
        return Err("redis expands to a statefulset".into());
    };
    assert_eq!(
        redis.container.volumes[0],
        "${asset.clowk-lp.redis-users.defs}:/etc/redis/conf.d/users.conf:ro"
    );
    assert!(
        redis
            .asset_digests
            .contains_key("clowk-lp.redis-users.defs")
    );
    assert_eq!(redis.replicas, Some(2));

    // Labelled plugin blocks keep their order and labels.
    let labelled = load("clowk-voodu/docs-snippets/plugin-blocks-labelled")?;
    let Spec::Deployment(esl) = spec_of(&labelled, "deployment/prod/esl")? else {
        return Err("a deployment".into());
    };
    let blocks: Vec<(String, Vec<String>, String)> = esl
        .plugin_blocks
        .iter()
        .map(|block| {
            (
                block.block_type.clone(),
                block.labels.clone(),
                block.spec.to_string(),
            )
        })
        .collect();
    assert_eq!(
        blocks,
        [
            (
                "trafik".into(),
                vec!["sip".into()],
                r#"{"port":5060}"#.into()
            ),
            (
                "trafik".into(),
                vec!["http".into()],
                r#"{"port":8084}"#.into()
            ),
        ]
    );
    Ok(())
}
