//! Manifest stage tests: decoding, defaults and diagnostics, driven by small HCL fixtures.
//! `check_err` asserts the exact `path:line:col: message` of every problem.

use super::*;
use crate::manifest::spec::KindSpec as _;
use crate::model::{CommitSha, MemoryFiles, SourceFile, is_manifest_path};
use spec::Spec;

/// A commit of `files` (path, text); shared by the manifest stage's test modules and the
/// reconciler's.
pub(crate) fn snapshot(files: &[(&str, &str)]) -> Snapshot {
    Snapshot {
        commit: CommitSha::new("0".repeat(40)),
        files: files
            .iter()
            .map(|(path, text)| SourceFile {
                path: (*path).to_owned(),
                contents: text.as_bytes().to_vec(),
            })
            .collect(),
        refused: Vec::new(),
    }
}

/// A content id for each file of `snapshot`, as a cache key (the agent uses git's blob id).
pub(super) fn ids(snapshot: &Snapshot) -> Vec<Option<crate::model::BlobId>> {
    snapshot
        .files
        .iter()
        .map(|file| {
            Some(crate::model::BlobId::new(
                spec::sha256_hex(&file.contents).as_bytes(),
            ))
        })
        .collect()
}

/// Loads with the given vars and repo files, in apply mode, with no URL fetcher.
fn load_with(
    files: &[(&str, &str)],
    vars: &Vars,
    repo: &MemoryFiles,
) -> Result<Manifest, Diagnostics> {
    let options = LoadOptions {
        vars,
        files: repo,
        fetcher: None,
        mode: Mode::Apply,
        max_file_bytes: 64,
        missing_var_hint: "set {var}",
    };
    load(&snapshot(files), &options)
}

fn load_one(text: &str) -> Result<Manifest, Diagnostics> {
    load_with(
        &[("m/app.hcl", text)],
        &Vars::default(),
        &MemoryFiles::default(),
    )
}

fn check_err(text: &str, expected: &[&str]) {
    let errors = load_one(text).expect_err("must be rejected");
    let got: Vec<String> = errors.0.iter().map(ToString::to_string).collect();
    assert_eq!(got, expected);
}

#[test]
fn decodes_a_deployment() -> Result<(), Diagnostics> {
    let manifest = load_one(
        r#"
deployment "shop" "web" {
  image    = "busybox"
  command  = ["httpd", "-f", "-p", 8080]
  replicas = "3"
  env      = { GREETING = "hi", PORT = 8080 }
  ports    = ["8080"]
}
"#,
    )?;
    assert_eq!(manifest.resources.len(), 1);
    let resource = &manifest.resources[0];
    assert_eq!(resource.key.to_string(), "deployment/shop/web");
    let Spec::Deployment(spec) = &resource.spec else {
        panic!("a deployment");
    };
    assert_eq!(spec.n_replicas(), 3);
    assert_eq!(
        spec.container.command.as_deref().map(<[String]>::len),
        Some(4)
    );
    assert_eq!(
        spec.container.env.get("PORT").map(String::as_str),
        Some("8080")
    );
    assert_eq!(spec.health_check, "/");
    Ok(())
}

#[test]
fn syntax_errors_carry_line_and_column() {
    check_err(
        "deployment \"a\" \"b\" {\n  image = \n}\n",
        &[
            "m/app.hcl:2:11: HCL syntax error: invalid expression; expected `\"`, `[`, `{`, `-`, `!`, `(`, `_`, `<`, letter or digit",
        ],
    );
}

#[test]
fn every_problem_is_reported_with_its_location() {
    check_err(
        "deployment \"a\" \"b\" {\n  imagee = \"x\"\n  replicas = [1]\n  envv = {}\n}\n",
        &[
            "m/app.hcl:2:3: unknown attribute `imagee` in deployment (did you mean `image`?)",
            "m/app.hcl:3:14: `replicas` must be a whole number, got a list",
            "m/app.hcl:4:3: unknown attribute `envv` in deployment (did you mean `env`?)",
        ],
    );
}

#[test]
fn labels_are_checked() {
    check_err(
        "deployment \"a\" {}\ndeployment \"a/b\" \"c\" {}\n",
        &[
            "m/app.hcl:1:1: deployment block needs scope and name labels (got 1): write `deployment \"scope\" \"name\" { … }`",
            "m/app.hcl:2:12: deployment scope \"a/b\" must not contain `..`, `/` or NUL",
        ],
    );
}

#[test]
fn duplicates_within_a_file_are_errors() {
    check_err(
        "deployment \"s\" \"n\" { image = \"x\" }\napp \"s\" \"n\" {\n  image = \"y\"\n  host = \"a.example\"\n}\n",
        &[
            "m/app.hcl:2:1: duplicate identity deployment/s/n: declared more than once in this file (also at line 1); check `app` blocks and standalone deployment blocks for collisions",
        ],
    );
}

#[test]
fn across_files_the_later_file_wins_with_a_warning() -> Result<(), Diagnostics> {
    let manifest = load_with(
        &[
            ("a.hcl", "deployment \"s\" \"n\" { image = \"x\" }\n"),
            ("b.hcl", "\n\ndeployment \"s\" \"n\" { image = \"y\" }\n"),
            ("c.hcl", "deployment \"s\" \"n\" { image = \"y\" }\n"),
        ],
        &Vars::default(),
        &MemoryFiles::default(),
    )?;
    let Spec::Deployment(spec) = &manifest.resources[0].spec else {
        panic!("a deployment");
    };
    assert_eq!(spec.container.image, "y");
    let warnings: Vec<String> = manifest.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(
        warnings,
        [
            "b.hcl:3:1: deployment/s/n is also declared at a.hcl:1:1; this later file wins (as `voodu apply` on the directory does) and that declaration is ignored",
            "c.hcl:1:1: deployment/s/n is also declared, identically, at b.hcl:3:1; one copy is used",
        ]
    );
    Ok(())
}

#[test]
fn manifest_extensions_follow_voodu() {
    for yes in ["a.hcl", "x/b.voodu", "c.VD", "d.vdu"] {
        assert!(is_manifest_path(yes), "{yes}");
    }
    for no in ["a.yaml", "hcl", "x/.hcl", "README.md"] {
        assert!(!is_manifest_path(no), "{no}");
    }
}

/// Issue 12 (voodu 2026): an unknown block inside a deployment or statefulset belongs to a
/// plugin: carried (type, labels, body, order, location), warned about, never an error.
#[test]
fn unknown_blocks_in_workloads_are_carried_as_plugin_blocks() -> Result<(), Diagnostics> {
    let mut vars = Vars::default();
    vars.globals.insert("PORT".into(), "8084".into());
    let manifest = load_with(
        &[(
            "m/app.hcl",
            r#"deployment "prod" "esl" {
  image = "x"
  trafik "sip" { port = 5060 }
  probs {
    readiness { period = "5s" }
  }
  trafik "http" {
    port = "${PORT}"
    listener { bind = "a" }
    listener "b" { bind = "b" }
  }
}
statefulset "data" "pg" {
  image = "postgres:16"
  trafik { port = 5432 }
}
"#,
        )],
        &vars,
        &MemoryFiles::default(),
    )?;
    let Spec::Deployment(esl) = &manifest.resources[0].spec else {
        panic!("a deployment");
    };
    let blocks: Vec<String> = esl
        .plugin_blocks
        .iter()
        .map(|block| serde_json::to_string(block).expect("serialises"))
        .collect();
    assert_eq!(
        blocks,
        [
            r#"{"type":"trafik","labels":["sip"],"spec":{"port":5060},"_at":"m/app.hcl:3:3"}"#,
            r#"{"type":"probs","spec":{"readiness":{"period":"5s"}},"_at":"m/app.hcl:4:3","_near":"probes"}"#,
            r#"{"type":"trafik","labels":["http"],"spec":{"listener":[{"bind":"a"},{"_labels":["b"],"bind":"b"}],"port":"8084"},"_at":"m/app.hcl:7:3"}"#,
        ]
    );
    assert!(esl.probes.is_none(), "a typo configures nothing");
    let Spec::Statefulset(pg) = &manifest.resources[1].spec else {
        panic!("a statefulset");
    };
    assert_eq!(pg.plugin_blocks.len(), 1);
    let warnings: Vec<String> = manifest.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(
        warnings,
        [
            "m/app.hcl:3:3: block `trafik` belongs to a plugin named \"trafik\"; voodu-agent installs no plugins, so this deployment fails when applied and its running containers are kept",
            "m/app.hcl:4:3: block `probs` belongs to a plugin named \"probs\" (did you mean `probes`?); voodu-agent installs no plugins, so this deployment fails when applied and its running containers are kept",
            "m/app.hcl:7:3: block `trafik` belongs to a plugin named \"trafik\"; voodu-agent installs no plugins, so this deployment fails when applied and its running containers are kept",
            "m/app.hcl:15:3: block `trafik` belongs to a plugin named \"trafik\"; voodu-agent installs no plugins, so this statefulset fails when applied and its running containers are kept",
        ]
    );
    Ok(())
}

/// Outside deployments and statefulsets (voodu's `plugin_nested.go` extracts only theirs), an
/// unknown block is still an error, and so is an unknown attribute anywhere.
#[test]
fn unknown_blocks_elsewhere_and_unknown_attributes_stay_errors() {
    check_err(
        "job \"a\" \"b\" {\n  image = \"x\"\n  trafik {}\n}\ndeployment \"a\" \"c\" {\n  image = \"x\"\n  trafik = 1\n}\n",
        &[
            "m/app.hcl:3:3: unknown block `trafik` in job",
            "m/app.hcl:7:3: unknown attribute `trafik` in deployment",
        ],
    );
}

#[test]
fn env_files_parse_voodus_format_and_name_the_bad_line() -> Result<(), EnvFileError> {
    let values = parse_env_file("# c\n\nexport A=1\nB = \"two\"\nC='3'\nA=4\n")?;
    let pairs: Vec<(&str, &str)> = values
        .iter()
        .map(|(key, value)| (key.as_str(), value.as_str()))
        .collect();
    assert_eq!(pairs, [("A", "4"), ("B", "two"), ("C", "3")]);
    let error = parse_env_file("A=1\n\n  NOPE  \n").expect_err("line 3 has no '='");
    assert_eq!(
        error,
        EnvFileError::MissingEquals {
            line: 3,
            text: "NOPE".to_owned()
        }
    );
    assert_eq!(error.to_string(), "line 3: missing '=' (line: \"NOPE\")");
    Ok(())
}

/// Issue 48: `policy = "digest"` follows a tag pinned by digest; the other policies follow
/// tags and refuse an image pinned by digest.
#[test]
fn a_digest_policy_takes_an_image_pinned_by_digest() -> Result<(), Diagnostics> {
    let digest = format!("sha256:{}", "a".repeat(64));
    let manifest = load_one(&format!(
        "deployment \"shop\" \"web\" {{\n  image = \"registry.example/app:stable@{digest}\"\n  image_update {{\n    policy = \"digest\"\n  }}\n}}\n"
    ))?;
    assert_eq!(manifest.resources.len(), 1);
    let refused = load_one(&format!(
        "deployment \"shop\" \"web\" {{\n  image = \"registry.example/app:1.4@{digest}\"\n  image_update {{\n    range = \"~1.4\"\n  }}\n}}\n"
    ));
    let messages = refused
        .err()
        .map(|errors| errors.to_string())
        .unwrap_or_default();
    assert!(
        messages.contains("is pinned by digest: write a tag instead, or use policy = \"digest\""),
        "{messages}"
    );
    let refused = load_one(
        "deployment \"shop\" \"web\" {\n  image = \"registry.example/app:stable\"\n  image_update {\n    policy = \"digest\"\n    range  = \"~1\"\n  }\n}\n",
    );
    let messages = refused
        .err()
        .map(|errors| errors.to_string())
        .unwrap_or_default();
    assert!(
        messages.contains("is not for policy \"digest\""),
        "{messages}"
    );
    Ok(())
}

/// Issue 27: `image_update` is decoded into the container, out of the spec hash, and every bad
/// field is a located error.
#[test]
fn image_update_blocks_are_decoded_and_checked() -> Result<(), Diagnostics> {
    let manifest = load_one(
        r#"deployment "shop" "web" {
  image = "registry.example/app:1.4.2"
  image_update {
    range    = "~1.4"
    interval = "1m"
  }
}
cronjob "shop" "nightly" {
  schedule = "0 3 * * *"
  image    = "tool:main-7"
  image_update {
    policy  = "numerical"
    filter  = "^main-([0-9]+)$"
    extract = "$1"
    mode    = "report"
  }
}
"#,
    )?;
    let find = |kind: crate::model::Kind| {
        manifest
            .resources
            .iter()
            .find(|resource| resource.key.kind == kind)
            .expect("decoded")
    };
    let web_resource = find(crate::model::Kind::Deployment);
    let Spec::Deployment(web) = &web_resource.spec else {
        panic!("a deployment");
    };
    let update = web.container.image_update.clone().expect("decoded");
    assert_eq!(
        (update.range.as_str(), update.interval(), update.commits()),
        ("~1.4", std::time::Duration::from_secs(60), true)
    );
    let mut without = web.clone();
    without.container.image_update = None;
    let key = &web_resource.key;
    assert_eq!(
        web.spec_hash(key),
        without.spec_hash(key),
        "out of the hash"
    );
    let Spec::Cronjob(nightly) = &find(crate::model::Kind::Cronjob).spec else {
        panic!("a cronjob");
    };
    let update = nightly.job.container.image_update.clone().expect("decoded");
    assert!(!update.commits());
    check_err(
        r#"deployment "shop" "web" {
  image = "app:1.4.2"
  image_update {
    policy   = "newest"
    interval = "1s"
    mode     = "push"
  }
}
statefulset "shop" "db" {
  image = "pg:16"
  image_update {
    range = "~x"
  }
}
job "shop" "j" {
  image = "tool:1"
  image_update {
    policy  = "numerical"
    filter  = "^(main"
    surprise = 1
  }
}
job "shop" "k" {
  image = "tool"
  image_update {
    policy  = "alphabetical"
    extract = "$1"
    push_branch = "-x"
  }
}
"#,
        &[
            "m/app.hcl:4:5: `image_update.policy` \"newest\" is not a policy: use \"semver\", \"numerical\", \"alphabetical\" or \"digest\"",
            "m/app.hcl:5:5: image_update.interval \"1s\" is below the minimum of 10s: a registry is a shared service, scan it less often",
            "m/app.hcl:6:5: image_update.mode \"push\" is not a mode: use \"commit\" (write the new tag to git) or \"report\" (only show it)",
            "m/app.hcl:12:5: `image_update.range` \"~x\" is not a semver range (unexpected character 'x' while parsing major version number): write e.g. \"~1.4\", \"^2\" or \">=1.2, <2\"",
            "m/app.hcl:19:5: `image_update.filter` \"^(main\" is not a regular expression: found open group without closing ')'",
            "m/app.hcl:20:5: unknown attribute `image_update.surprise` in image_update",
            "m/app.hcl:24:3: image_update needs a tag in `image` to start from: write \"tool\" with its current tag, like \"tool:1.0.0\"",
            "m/app.hcl:27:5: `image_update.extract` needs a `filter` whose groups it names (e.g. filter = \"^main-([0-9]+)$\", extract = \"$1\")",
            "m/app.hcl:28:5: image_update.push_branch \"-x\" is not a branch name: letters, digits and `/._-`, not starting with `-` or `/`, no `..`",
        ],
    );
    Ok(())
}

const BACKED_UP_DB: &str = r#"
statefulset "shop" "db" {
  image = "voodu-postgres:latest"
  volume_claim "data" { mount_path = "/var/lib/postgresql/data" }
  backup {
    repository      = "/srv/backups/shop-db"
    password_file   = "/etc/voodu/restic-shop.pass"
    schedule        = "0 3 * * *"
    timezone        = "UTC"
    mode            = "exec"
    command         = ["pg_dump", "-U", "postgres", "-Fc", "app"]
    restore_command = ["pg_restore", "-U", "postgres", "--clean", "-d", "app"]
    before_release  = true
    verify          = "weekly"
    timeout         = "2h"
    keep {
      last    = 7
      daily   = 7
      weekly  = 4
      monthly = 6
    }
  }
}
"#;

fn only_statefulset(manifest: &Manifest) -> spec::StatefulsetSpec {
    match manifest.resources.as_slice() {
        [resource] => match &resource.spec {
            Spec::Statefulset(spec) => spec.clone(),
            other => panic!("a statefulset, got {other:?}"),
        },
        other => panic!("one resource, got {}", other.len()),
    }
}

/// A statefulset's `backup {}` (an extension) decodes every field, round-trips through the
/// stored JSON, and leaves voodu's spec hash as it is without the block.
#[test]
fn a_backup_block_decodes_every_field_and_is_not_hashed() -> Result<(), Diagnostics> {
    use spec::{Backup, BackupMode, Keep};
    let manifest = load_one(BACKED_UP_DB)?;
    let statefulset = only_statefulset(&manifest);
    let expected = Backup {
        repository: "/srv/backups/shop-db".into(),
        password_file: "/etc/voodu/restic-shop.pass".into(),
        schedule: "0 3 * * *".into(),
        timezone: "UTC".into(),
        mode: BackupMode::Exec,
        command: ["pg_dump", "-U", "postgres", "-Fc", "app"]
            .map(String::from)
            .to_vec(),
        restore_command: ["pg_restore", "-U", "postgres", "--clean", "-d", "app"]
            .map(String::from)
            .to_vec(),
        before_release: true,
        verify: "weekly".into(),
        timeout: "2h".into(),
        keep: Some(Keep {
            last: 7,
            daily: 7,
            weekly: 4,
            monthly: 6,
        }),
        volume: String::new(),
    };
    assert_eq!(statefulset.backup.as_deref(), Some(&expected));
    let resource = &manifest.resources[0];
    let json = resource.spec.to_json();
    let back = Spec::from_json(resource.key.kind, &json).expect("reads back");
    assert_eq!(back, resource.spec);
    assert!(
        statefulset.summary().ends_with("; backup (exec)"),
        "{}",
        statefulset.summary()
    );

    // The least block: the defaults.
    let least = load_one(
        r#"
statefulset "shop" "db" {
  image = "voodu-postgres:latest"
  volume_claim "data" { mount_path = "/var/lib/postgresql/data" }
  backup {
    repository    = "s3:s3.amazonaws.com/shop-db"
    password_file = "/etc/voodu/restic-shop.pass"
  }
}
"#,
    )?;
    let least = only_statefulset(&least).backup.expect("a backup");
    assert_eq!(least.mode, BackupMode::Stop);
    assert_eq!(least.deadline(), std::time::Duration::from_secs(3600));
    assert_eq!(least.keep, None);
    assert!(!least.is_local());

    // Without the block, or with another one, the spec hash is voodu's, unchanged.
    let start = BACKED_UP_DB.find("  backup {").expect("the block");
    let end = BACKED_UP_DB.rfind("  }\n}").expect("its end") + "  }\n".len();
    let without = format!("{}{}", &BACKED_UP_DB[..start], &BACKED_UP_DB[end..]);
    let without = load_one(&without)?;
    assert_eq!(only_statefulset(&without).backup, None);
    let other = BACKED_UP_DB
        .replace("\"weekly\"", "\"daily\"")
        .replace("= 7", "= 30")
        .replace("\"2h\"", "\"30m\"");
    let other = load_one(&other)?;
    assert_ne!(only_statefulset(&other).backup, statefulset.backup);
    let hash = |manifest: &Manifest| {
        manifest.resources[0]
            .spec
            .spec_hash(&manifest.resources[0].key)
    };
    assert_eq!(hash(&manifest), hash(&without));
    assert_eq!(hash(&other), hash(&without));
    Ok(())
}

/// A deployment's `backup {}` names a named volume it mounts; in `exec` mode it needs none.
#[test]
fn a_deployment_backs_up_a_named_volume_it_mounts() -> Result<(), Diagnostics> {
    for body in [
        "    volume = \"up\"\n",
        "    mode = \"exec\"\n    command = [\"dump\"]\n    restore_command = [\"load\"]\n",
    ] {
        let manifest = load_one(&format!(
            "deployment \"a\" \"b\" {{\n  image = \"x\"\n  volumes = [\"up:/srv/up\"]\n  backup {{\n    repository = \"/srv/b\"\n    password_file = \"/etc/p\"\n{body}  }}\n}}\n"
        ))?;
        let backup = manifest.resources[0].spec.backup().cloned();
        assert!(backup.is_some(), "{body}");
    }
    Ok(())
}
