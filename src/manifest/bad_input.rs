//! The bad-input suite: one small manifest per mistake, each asserting the exact
//! `path:line:col: message` of every diagnostic (expect-test snapshots; refresh with
//! `UPDATE_EXPECT=1 cargo test bad_input` and read the diff). None may panic, and every case
//! must be rejected: a bad commit changes nothing.
//!
//! Repo files available to `file()` and `env_file`: `m/conf.txt` (small), `m/big.bin` (over
//! the 64-byte cap these tests load with), `m/out` (a symlink leading out of the repo),
//! `m/bad.env` (a line without `=`). `${SET}` is defined; nothing else is.

use expect_test::{Expect, expect};

use super::*;
use crate::model::{CommitSha, MemoryFiles, SourceFile};

fn repo() -> MemoryFiles {
    let mut files = MemoryFiles::default();
    files
        .file("m/conf.txt", b"key = value\n")
        .file("m/big.bin", &[b'x'; 65])
        .link("m/out", "../../etc/passwd")
        .file("m/bad.env", b"A=1\nNOPE\n");
    files
}

fn load_bytes(contents: &[u8]) -> Result<Manifest, Diagnostics> {
    let mut vars = Vars::default();
    vars.globals.insert("SET".into(), "yes".into());
    let files = repo();
    let options = LoadOptions {
        vars: &vars,
        files: &files,
        fetcher: None,
        mode: Mode::Apply,
        max_file_bytes: 64,
        missing_var_hint: "set {var}",
    };
    let snapshot = Snapshot {
        commit: CommitSha::new("0".repeat(40)),
        files: vec![SourceFile {
            path: "m/app.hcl".into(),
            contents: contents.to_vec(),
        }],
        refused: Vec::new(),
    };
    load(&snapshot, &options)
}

#[track_caller]
fn check(input: &str, expected: Expect) {
    check_bytes(input.as_bytes(), expected);
}

#[track_caller]
fn check_bytes(input: &[u8], expected: Expect) {
    match load_bytes(input) {
        Ok(manifest) => panic!(
            "must be rejected, but loaded {} resource(s)",
            manifest.resources.len()
        ),
        Err(diagnostics) => expected.assert_eq(&format!("{diagnostics}\n")),
    }
}

#[test]
fn syntax_errors() {
    check(
        "deployment \"a\" \"b\" {\n  image = \n}\n",
        expect![[r#"
        m/app.hcl:2:11: HCL syntax error: invalid expression; expected `"`, `[`, `{`, `-`, `!`, `(`, `_`, `<`, letter or digit
    "#]],
    );
    check(
        "deployment \"a\" \"b\" {\n  image = \"x\"\n",
        expect![[r#"
        m/app.hcl:2:14: HCL syntax error: invalid block body; expected `}`, newline or identifier
    "#]],
    );
    check(
        "deployment \"a\" \"b\" {\n  image = \"x\n}\n",
        expect![[r#"
        m/app.hcl:2:3: HCL syntax error: invalid block body; expected `}`, newline or identifier
    "#]],
    );
    check(
        "deployment \"a\" \"b\" {\n  image = \"x${SET\"\n}\n",
        expect![[r#"
            m/app.hcl:2:13: unterminated `${`: close it with `}` (write `$${` for a literal `${`)
        "#]],
    );
    check(
        "deployment \"a\" \"b\" {\n  image = \"${lower(\"X\")}\"\n}\n",
        expect![[r#"
            m/app.hcl:2:12: `${…}` holding a string or a function call is not supported: manifests interpolate only ${VAR}, ${VAR:-default}, ${asset.…} and ${ref.…}
        "#]],
    );
    check(
        "deployment \"a\" \"b\" {\n  image = \"%{ if true }x%{ endif }\"\n}\n",
        expect![[r#"
            m/app.hcl:2:12: template directives (`%{…}`) are not supported: manifests interpolate only ${VAR}, ${VAR:-default}, ${asset.…} and ${ref.…} (write `%%{` for a literal `%{`)
            m/app.hcl:2:25: template directives (`%{…}`) are not supported: manifests interpolate only ${VAR}, ${VAR:-default}, ${asset.…} and ${ref.…} (write `%%{` for a literal `%{`)
        "#]],
    );
    check(
        "image = \"x\"\n",
        expect![[r#"
        m/app.hcl:1:1: top-level attribute `image` is not allowed: a manifest holds blocks such as `deployment "scope" "name" { … }`
    "#]],
    );
    check_bytes(
        b"deployment \"a\" \"b\" {\n  image = \"\xff\"\n}\n",
        expect![[r#"
        m/app.hcl:2:12: invalid UTF-8 here; manifests must be UTF-8 text
    "#]],
    );
    check(
        "deployment \"a\" \"b\" {\n  image = \"\u{E000}\"\n}\n",
        expect![[r#"
            m/app.hcl:2:3: `image` "$" is not an image reference: "$" is not a name component (lowercase letters and digits, joined by `.`, `_`, `__` or `-`); write [registry[:port]/]name[:tag][@digest], e.g. "nginx:1.27" or "ghcr.io/org/app:v1"
            m/app.hcl:2:12: the file contains U+E000, a private-use character this agent reserves; remove it
        "#]],
    );
}

#[test]
fn wrong_types() {
    check(
        "deployment \"a\" \"b\" {\n  replicas = [1]\n}\n",
        expect![[r#"
        m/app.hcl:2:14: `replicas` must be a whole number, got a list
    "#]],
    );
    check(
        "deployment \"a\" \"b\" {\n  replicas = \"three\"\n}\n",
        expect![[r#"
        m/app.hcl:2:14: `replicas` must be a whole number, got a string
    "#]],
    );
    check(
        "deployment \"a\" \"b\" {\n  command = \"sleep 1\"\n}\n",
        expect![[r#"
        m/app.hcl:2:13: `command` must be a list of strings like ["a", "b"], got a string
    "#]],
    );
    check(
        "deployment \"a\" \"b\" {\n  env = [\"A=1\"]\n}\n",
        expect![[r#"
        m/app.hcl:2:9: `env` must be a map like { KEY = "value" }, got a list
    "#]],
    );
    check(
        "deployment \"a\" \"b\" {\n  ports = 8080\n}\n",
        expect![[r#"
        m/app.hcl:2:11: `ports` must be a list of strings like ["a", "b"], got a number
    "#]],
    );
    check(
        "deployment \"a\" \"b\" {\n  image = busybox\n}\n",
        expect![[r#"
        m/app.hcl:2:11: `image` must be a string, got a variable reference (quote it, or write "${NAME}" to interpolate)
    "#]],
    );
    check(
        "cronjob \"a\" \"b\" {\n  schedule = \"@daily\"\n  image = \"x\"\n  suspend = \"maybe\"\n}\n",
        expect![[r#"
        m/app.hcl:4:13: `suspend` must be true or false
    "#]],
    );
    check(
        "deployment \"a\" \"b\" {\n  image = \"x\"\n  probes {\n    liveness {\n      tcp_socket { port = 80 }\n      period = \"10\"\n    }\n  }\n}\n",
        expect![[r#"
        m/app.hcl:6:16: `probes.liveness.period` must be a duration like "30s", "5m" or "1h30m", got "10"
    "#]],
    );
    check(
        "deployment \"a\" \"b\" {\n  env = { A = [1] }\n}\n",
        expect![[r#"
        m/app.hcl:2:15: `env.A` must be a string, got a list
    "#]],
    );
}

#[test]
fn unknown_fields_and_blocks() {
    check(
        "deployment \"a\" \"b\" {\n  imagee = \"x\"\n}\n",
        expect![[r#"
        m/app.hcl:2:3: unknown attribute `imagee` in deployment (did you mean `image`?)
    "#]],
    );
    // In a deployment or statefulset an unknown block belongs to a plugin (voodu 2026) and
    // fails at apply (`tests.rs`); in an `app` it is still an error.
    check(
        "app \"a\" \"b\" {\n  host = \"a.b\"\n  probe {}\n}\n",
        expect![[r#"
        m/app.hcl:3:3: unknown block `probe` in app (did you mean `probes`?)
    "#]],
    );
    check(
        "deploymnet \"a\" \"b\" {}\n",
        expect![[r#"
        m/app.hcl:1:1: unknown block type `deploymnet` (did you mean `deployment`?)
    "#]],
    );
    check(
        "hep3 \"fsw\" \"api\" {\n  store = \"ndjson\"\n}\n",
        expect![[r#"
            m/app.hcl:1:1: hep3 "fsw" "api" is not supported by this agent: its image (voodu-hep3-api:<version>) is built by the voodu-hep3 plugin's install hook, and voodu-agent installs and runs no plugins; build that image on this host yourself and declare the reader as a `deployment` (a hep3 block is a deployment spec plus `store`, which becomes HEP_STORE)
        "#]],
    );
    check(
        "mongodb \"a\" \"b\" {}\n",
        expect![[r#"
        m/app.hcl:1:1: unknown block type `mongodb` (voodu plugin macros other than `postgres` and `redis` are not supported by this agent)
    "#]],
    );
    check(
        "deployment \"a\" \"b\" {\n  image = \"x\"\n  env { A = \"1\" }\n}\n",
        expect![[r#"
        m/app.hcl:3:3: `env` is an attribute: write `env = …`
    "#]],
    );
    check(
        "deployment \"a\" \"b\" {\n  image = \"x\"\n  probes = {}\n}\n",
        expect![[r#"
        m/app.hcl:3:3: `probes` is a block: write `probes { … }`
    "#]],
    );
    check(
        "statefulset \"a\" \"b\" {\n  image = \"x\"\n  autoscale {\n    min = 1\n    max = 2\n    cpu_target = 50\n  }\n}\n",
        expect![[r#"
        m/app.hcl:3:3: `autoscale` is not allowed in statefulset: it is a deployment field; statefulsets have no release hooks, autoscaling or on_deploy
    "#]],
    );
    check(
        "job \"a\" \"b\" {\n  image = \"x\"\n  replicas = 2\n}\n",
        expect![[r#"
        m/app.hcl:3:3: `replicas` is not allowed in job: jobs run to completion once; that field is for long-running workloads
    "#]],
    );
    check(
        "app \"a\" \"b\" {\n  image = \"x\"\n  host = \"a.example\"\n  service = \"other\"\n}\n",
        expect![[r#"
        m/app.hcl:4:3: `service` is not allowed in app: an app's ingress routes to its own deployment; declare a separate `ingress` to route elsewhere
    "#]],
    );
    check(
        "deployment \"a\" \"b\" {\n  image = \"x\"\n  resources {\n    requests { cpu = \"1\" }\n  }\n}\n",
        expect![[r#"
        m/app.hcl:4:5: `resources.requests` is not allowed in resources: voodu supports only `limits`
    "#]],
    );
}

#[test]
fn duplicates() {
    check(
        "deployment \"a\" \"b\" { image = \"x\" }\ndeployment \"a\" \"b\" { image = \"y\" }\n",
        expect![[r#"
        m/app.hcl:2:1: duplicate identity deployment/a/b: declared more than once in this file (also at line 1); check `app` blocks and standalone deployment blocks for collisions
    "#]],
    );
    check(
        "app \"a\" \"b\" {\n  image = \"x\"\n  host = \"a.example\"\n}\ningress \"a\" \"b\" {\n  host = \"b.example\"\n}\n",
        expect![[r#"
        m/app.hcl:5:1: duplicate identity ingress/a/b: declared more than once in this file (also at line 1); check `app` blocks and standalone ingress blocks for collisions
    "#]],
    );
    check(
        "deployment \"a\" \"b\" {\n  image = \"x\"\n  image = \"y\"\n}\n",
        expect![[r#"
        m/app.hcl:3:3: HCL syntax error: invalid attribute; expected unique attribute key; found redefined attribute
    "#]],
    );
    check(
        "deployment \"a\" \"b\" {\n  image = \"x\"\n  init \"m\" { command = [\"a\"] }\n  init \"m\" { command = [\"b\"] }\n}\n",
        expect![[r#"
        m/app.hcl:4:8: duplicate init name "m"
    "#]],
    );
    check(
        "statefulset \"a\" \"b\" {\n  image = \"x\"\n  volume_claim \"d\" { mount_path = \"/d\" }\n  volume_claim \"d\" { mount_path = \"/e\" }\n}\n",
        expect![[r#"
        m/app.hcl:4:16: duplicate volume_claim "d"
    "#]],
    );
    check(
        "deployment \"a\" \"b\" {\n  image = \"x\"\n  env = { A = \"1\", A = \"2\" }\n}\n",
        expect![[r#"
        m/app.hcl:3:20: HCL syntax error: invalid object item; expected unique object key; found redefined object key
    "#]],
    );
    check(
        "deployment \"a\" \"b\" {\n  image = \"x\"\n  probes {}\n  probes {}\n}\n",
        expect![[r#"
        m/app.hcl:4:3: `probes` block is declared twice in deployment; merge them into one
    "#]],
    );
}

#[test]
fn rules_between_fields() {
    check(
        "deployment \"a\" \"b\" {\n  image = \"x\"\n  replicas = 2\n  autoscale {\n    min = 1\n    max = 3\n    cpu_target = 50\n  }\n}\n",
        expect![[r#"
        m/app.hcl:3:3: replicas and autoscale are mutually exclusive — use min/max instead
    "#]],
    );
    check(
        "deployment \"a\" \"b\" {\n  image = \"x\"\n  build { context = \".\" }\n}\n",
        expect![[r#"
        m/app.hcl:3:3: `image` and `build {}` are mutually exclusive: use `image` to pull from a registry, or `build {}` to build from source — not both
    "#]],
    );
    check(
        "deployment \"a\" \"b\" {\n  image = \"x\"\n  autoscale {\n    min = 0\n    max = 3\n    cpu_target = 150\n  }\n}\n",
        expect![[r#"
        m/app.hcl:4:5: autoscale.min must be >= 1 (got 0)
        m/app.hcl:6:5: autoscale.cpu_target must be in (0, 100], got 150
    "#]],
    );
    check(
        "deployment \"a\" \"b\" {\n  image = \"x\"\n  network_mode = \"bridge\"\n}\n",
        expect![[r#"
        m/app.hcl:3:3: network_mode="bridge" not supported (want "host" or "none"; omit for bridge mode)
    "#]],
    );
    check(
        "deployment \"a\" \"b\" {\n  image = \"x\"\n  network_mode = \"host\"\n  networks = [\"n\"]\n}\n",
        expect![[r#"
        m/app.hcl:3:3: network_mode="host" is mutually exclusive with network/networks
    "#]],
    );
    check(
        "deployment \"a\" \"b\" {\n  image = \"x\"\n  probes {\n    readiness {\n      tcp_socket { port = 80 }\n      exec { command = [\"true\"] }\n    }\n  }\n}\n",
        expect![[r#"
        m/app.hcl:4:5: probes.readiness: only one of http_get / tcp_socket / exec may be declared
    "#]],
    );
    check(
        "deployment \"a\" \"b\" {\n  image = \"x\"\n  probes {\n    readiness { period = \"5s\" }\n  }\n}\n",
        expect![[r#"
        m/app.hcl:4:5: probes.readiness requires exactly one of http_get / tcp_socket / exec
    "#]],
    );
    check(
        "deployment \"a\" \"b\" {\n  image = \"x\"\n  probes {\n    liveness {\n      http_get {\n        path = \"health\"\n        port = 0\n      }\n    }\n  }\n}\n",
        expect![[r#"
        m/app.hcl:6:9: probes.liveness.http_get.path must start with '/'
        m/app.hcl:7:9: probes.liveness.http_get.port is required (got 0)
    "#]],
    );
    check(
        "deployment \"a\" \"b\" {\n  image = \"x\"\n  init \"Migrate\" {\n    command = [\"m\"]\n    retries = 9\n  }\n  init \"seed\" {}\n}\n",
        expect![[r#"
        m/app.hcl:3:8: init "Migrate" invalid name (must match [a-z0-9][a-z0-9-]*)
        m/app.hcl:5:5: init "Migrate" retries must be in [0, 5] (got 9)
        m/app.hcl:7:3: init "seed" requires command
    "#]],
    );
    check(
        "deployment \"a\" \"b\" {\n  image = \"x\"\n  on_deploy {\n    success {\n      url = \"https://h\"\n      method = \"GET\"\n    }\n    failure {\n      url = \"https://h\"\n      body = { a = 1 }\n      file = \"${asset.a.b.c}\"\n    }\n  }\n}\n",
        expect![[r#"
        m/app.hcl:6:7: on_deploy.success.method must be one of POST/PUT/PATCH/DELETE (got "GET")
        m/app.hcl:11:7: on_deploy.failure: body and file are mutually exclusive
    "#]],
    );
    check(
        "registry \"ecr\" {\n  url = \"x.dkr.ecr.aws\"\n  helper = \"ecr\"\n}\nregistry \"r\" {\n  username = \"u\"\n}\n",
        expect![[r#"
        m/app.hcl:3:3: helper "ecr" is not a credential helper name: use "ecr-login" (docker-credential-ecr-login)
        m/app.hcl:5:1: registry needs `url` (a host such as "ghcr.io")
        m/app.hcl:5:1: registry needs `token` (or `password`), or use `helper` for a credential helper
    "#]],
    );
    check(
        "cronjob \"a\" \"b\" {\n  image = \"x\"\n  schedule = \"*/0 * * *\"\n  concurrency_policy = \"Replace\"\n  timezone = \"Mars/Olympus\"\n}\n",
        expect![[r#"
            m/app.hcl:3:3: `schedule` "*/0 * * *": needs 5 fields (minute hour day-of-month month day-of-week), got 4
            m/app.hcl:4:3: concurrency_policy "Replace" is not implemented by voodu: use "Forbid" or "Allow"
            m/app.hcl:5:3: `timezone` "Mars/Olympus" is not an IANA time zone name such as "Europe/Lisbon" or "America/New_York" in this host's time zone database
        "#]],
    );
    check(
        "deployment \"a\" \"b\" {\n  image = \"x\"\n  ports = [\"http\"]\n  restart = \"sometimes\"\n}\n",
        expect![[r#"
            m/app.hcl:3:12: port "http" is not `[ip:][host_port:]container_port[/tcp|udp]`
            m/app.hcl:4:3: `restart` "sometimes" is not a Docker restart policy: no, always, unless-stopped, on-failure[:N]
        "#]],
    );
    check(
        "deployment \"a\" \"b\" {\n  image = \"x\"\n  resources {\n    limits {\n      cpu = \"two\"\n      memory = \"1gb\"\n    }\n  }\n}\n",
        expect![[r#"
        m/app.hcl:5:7: `resources.limits.cpu` "two" is not a CPU amount: write a decimal like "1.5" or millicores like "500m"
        m/app.hcl:6:7: `resources.limits.memory` "1gb" is not a memory size: write bytes, or a number with Ki Mi Gi Ti (1024-based) or K M G T (1000-based)
    "#]],
    );
    check(
        "ingress \"a\" \"b\" {\n  host = \"a.example\"\n  tls { provider = \"zerossl\" }\n  location { path = \"api\" }\n  lb { policy = \"fastest\" }\n}\n",
        expect![[r#"
        m/app.hcl:3:9: tls.provider "zerossl" must be "letsencrypt" or "internal"
        m/app.hcl:4:14: location.path must start with '/', got "api"
        m/app.hcl:5:8: lb.policy "fastest" must be one of round_robin, random, least_conn, ip_hash
    "#]],
    );
    check(
        "ingress \"a\" \"b\" {\n  service = \"web\"\n}\n",
        expect![[r#"
        m/app.hcl:1:1: ingress needs `host`
    "#]],
    );
}

#[test]
fn unresolved_references() {
    check(
        "deployment \"a\" \"b\" {\n  image = \"x:${TAG}\"\n}\n",
        expect![[r#"
        m/app.hcl:2:14: undefined variable `TAG`: set TAG or write `${TAG:-default}`
    "#]],
    );
    check(
        "deployment \"a\" \"b\" {\n  image = \"x\"\n  volumes = [\"${asset.a.cfg.conf}:/c\"]\n}\n",
        expect![[r#"
        m/app.hcl:3:15: unresolved asset reference "a.cfg.conf": no asset "a" "cfg" in this commit
    "#]],
    );
    check(
        "asset \"a\" \"cfg\" {\n  conf = \"x\"\n}\ndeployment \"a\" \"b\" {\n  image = \"x\"\n  volumes = [\"${asset.a.cfg.other}:/c\"]\n}\n",
        expect![[r#"
        m/app.hcl:6:15: unresolved asset reference "a.cfg.other": asset "a" "cfg" has no key `other` (keys: conf)
    "#]],
    );
    check(
        "asset \"a\" \"cfg\" {\n  conf = \"x\"\n}\ndeployment \"a\" \"b\" {\n  image = \"x\"\n  volumes = [\"${asset.cfg.conf}:/c\"]\n}\n",
        expect![[r#"
        m/app.hcl:6:15: unresolved asset reference "cfg.conf": no asset "cfg" in this commit (a 2-part reference names an unscoped asset: `asset "name" { … }`)
    "#]],
    );
    check(
        "deployment \"a\" \"b\" {\n  image = \"x\"\n  env = { HOST = \"${ref.ingress.web.host}\" }\n}\n",
        expect![[r#"
        m/app.hcl:3:19: unresolved reference ingress.web.host: no ingress "web" in scope "a" in this commit
    "#]],
    );
    check(
        "deployment \"a\" \"b\" {\n  image = \"x\"\n  env = { A = \"${asset.a.b.c.d}\", B = \"${var.x}\" }\n}\n",
        expect![[r#"
        m/app.hcl:3:16: malformed asset reference `${asset.a.b.c.d}`: write ${asset.<scope>.<name>.<key>} or ${asset.<name>.<key>} (letters, digits, `_`, `-`)
        m/app.hcl:3:40: unsupported interpolation `${var.x}`: manifests interpolate ${VAR}, ${VAR:-default}, ${asset.…} and ${ref.…} (write `$${` for a literal `${`)
    "#]],
    );
    check(
        "deployment \"a\" \"b\" {\n  image = \"x\"\n  depends_on { assets = [\"cfg\"] }\n}\n",
        expect![[r#"
        m/app.hcl:3:16: depends_on.assets["cfg"]: expected 2 or 3 segments separated by '.', got 1
    "#]],
    );
    check(
        "deployment \"a\" \"b\" {\n  image = \"x\"\n  env_from = [\"a/b/c\"]\n}\n",
        expect![[r#"
        m/app.hcl:3:3: `env_from` entry "a/b/c" must be "scope/name" (an app bucket) or "name" (a bucket of this scope)
    "#]],
    );
}

#[test]
fn path_escapes_and_oversize_files() {
    check(
        "asset \"a\" \"b\" {\n  k = file(\"../../etc/passwd\")\n}\n",
        expect![[r#"
        m/app.hcl:2:7: file(): "../../etc/passwd" leads out of the repo
    "#]],
    );
    check(
        "asset \"a\" \"b\" {\n  k = file(\"/etc/passwd\")\n}\n",
        expect![[r#"
        m/app.hcl:2:7: file(): "/etc/passwd" is absolute: manifests read files of the repo only, relative to the manifest's directory
    "#]],
    );
    check(
        "asset \"a\" \"b\" {\n  k = file(\"out\")\n}\n",
        expect![[r#"
        m/app.hcl:2:7: file(): "out" is a symlink leading out of the repo ("../../etc/passwd")
    "#]],
    );
    check(
        "asset \"a\" \"b\" {\n  k = file(\"missing.txt\")\n}\n",
        expect![[r#"
        m/app.hcl:2:7: file(): "missing.txt" does not exist in the repo (looked for "m/missing.txt")
    "#]],
    );
    check(
        "asset \"a\" \"b\" {\n  k = file(\"big.bin\")\n}\n",
        expect![[r#"
        m/app.hcl:2:7: file(): "big.bin" is 65 bytes; the limit is 64 bytes (--max-file-size)
    "#]],
    );
    check(
        "asset \"a\" \"b\" {\n  k = url(\"ftp://example.com/x\")\n  j = lookup(\"x\")\n  i = 42\n}\n",
        expect![[r#"
        m/app.hcl:2:7: url("ftp://example.com/x"): only http:// and https:// URLs can be fetched
        m/app.hcl:3:7: unknown function `lookup()`: asset sources are a string, file("path") or url("https://…")
        m/app.hcl:4:7: asset key `i` must be a string, file("path") or url("https://…"), got a number
    "#]],
    );
    check(
        "deployment \"a\" \"b\" {\n  image = \"x\"\n  env_file = [\"../../secrets.env\", \"bad.env\"]\n}\n",
        expect![[r#"
        m/app.hcl:3:3: env_file "../../secrets.env" leads out of the repo
        m/app.hcl:3:3: env_file "bad.env" line 2: missing '=' (line: "NOPE")
    "#]],
    );
}

#[test]
fn illegal_names_and_labels() {
    check(
        "deployment \"a/b\" \"c\" {}\n",
        expect![[r#"
        m/app.hcl:1:12: deployment scope "a/b" must not contain `..`, `/` or NUL
    "#]],
    );
    check(
        "deployment \"a\" \"..\" {}\n",
        expect![[r#"
        m/app.hcl:1:16: deployment name ".." must not contain `..`, `/` or NUL
    "#]],
    );
    // Names whose derived names would not fit (issue 23 item 5); one byte less passes.
    check(
        &format!(
            "statefulset \"a\" \"{}\" {{\n  image = \"x\"\n}}\nstatefulset \"a\" \"{}\" {{\n  image = \"x\"\n  volume_claim \"{}\" {{\n    mount_path = \"/d\"\n  }}\n  volume_claim \"{}\" {{\n    mount_path = \"/e\"\n  }}\n}}\nasset \"a\" {{\n  {} = \"x\"\n  {} = \"y\"\n}}\n",
            "s".repeat(60),
            "s".repeat(59),
            "c".repeat(64),
            "c".repeat(63),
            "k".repeat(129),
            "k".repeat(128),
        ),
        expect![[r#"
        m/app.hcl:1:17: statefulset name "ssssssssssssssssssssssssssssssssssssssssssssssssssssssssssss" is 60 bytes long, above the limit of 59: it becomes part of each pod's DNS name `<name>-<n>.<scope>`, one 63-byte label with the ordinal; shorten it
        m/app.hcl:6:16: volume_claim "cccccccccccccccccccccccccccccccc"… is 64 bytes long, above the limit of 63: it becomes part of the Docker volume `voodu-<scope>-<name>-<claim>-<n>`; shorten it
        m/app.hcl:14:3: asset key "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk"… is 129 bytes long, above the limit of 128: it becomes the file name of `<data-dir>/assets/<scope>/<name>/<key>`; shorten it
    "#]],
    );
    check(
        "deployment \"-a\" \"b\" {}\n",
        expect![[r#"
        m/app.hcl:1:12: deployment scope "-a" must start with a letter or digit and use only letters, digits, `_`, `.` and `-`
    "#]],
    );
    check(
        &format!("deployment \"a\" \"{}\" {{}}\n", "n".repeat(64)),
        expect![[r#"
        m/app.hcl:1:16: deployment name "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn" is longer than 63 characters (it becomes a DNS label and a directory name)
    "#]],
    );
    check(
        "deployment \"a\" {}\n",
        expect![[r#"
        m/app.hcl:1:1: deployment block needs scope and name labels (got 1): write `deployment "scope" "name" { … }`
    "#]],
    );
    check(
        "registry \"a\" \"b\" {}\n",
        expect![[r#"
        m/app.hcl:1:1: registry block needs exactly one label (its name), got 2 — write `registry "name" { ... }`, e.g. `registry "ecr" { ... }`
    "#]],
    );
    check(
        "asset \"a\" \"b\" \"c\" {}\n",
        expect![[r#"
        m/app.hcl:1:1: asset block takes 1 label (unscoped) or 2 labels (scoped), got 3: write `asset "scope" "name" { key = … }`
    "#]],
    );
    check(
        "asset \"a\" \"b\" {\n  \"conf.yml\" = \"x\"\n}\n",
        expect![[r#"
        m/app.hcl:2:3: HCL syntax error: invalid block body; expected `}`, newline or identifier
    "#]],
    );
    check(
        "asset \"a\" \"b\" {\n  clé = \"x\"\n}\n",
        expect![[r#"
        m/app.hcl:2:3: asset key "clé": invalid key: must be alphanumeric + underscore + hyphen (no dots, no whitespace)
    "#]],
    );
    check(
        "asset \"a\" \"b\" {\n  nested { k = \"v\" }\n}\n",
        expect![[r#"
        m/app.hcl:2:3: nested blocks are not supported (asset bodies are flat key/source pairs)
    "#]],
    );
}

/// Issue 10, item 1: every number a manifest gives has an upper bound (`spec::bounds`),
/// enforced where it is written, and the message names the bound and what to do.
#[test]
fn numbers_past_their_bounds() {
    let rows = [
        (
            "deployment \"a\" \"b\" {\n  image = \"x\"\n  replicas = 1e12\n}\n",
            expect![[r#"
                m/app.hcl:3:3: `replicas` is 1000000000000, above the limit of 1000 replicas per resource on one host: lower it, or spread the load over more hosts
            "#]],
        ),
        (
            "statefulset \"a\" \"b\" {\n  image = \"x\"\n  replicas = 1001\n}\n",
            expect![[r#"
                m/app.hcl:3:3: `replicas` is 1001, above the limit of 1000 replicas per resource on one host: lower it, or spread the load over more hosts
            "#]],
        ),
        (
            "deployment \"a\" \"b\" {\n  image = \"x\"\n  autoscale {\n    min = 2000\n    max = 5000\n    cpu_target = 50\n  }\n}\n",
            expect![[r#"
                m/app.hcl:4:5: `autoscale.min` is 2000, above the limit of 1000 replicas per resource on one host: lower it, or spread the load over more hosts
                m/app.hcl:5:5: `autoscale.max` is 5000, above the limit of 1000 replicas per resource on one host: lower it, or spread the load over more hosts
            "#]],
        ),
        (
            "statefulset \"a\" \"b\" {\n  image = \"x\"\n  drain {\n    grace = \"2h\"\n    timeout = \"5x\"\n  }\n}\n",
            expect![[r#"
                m/app.hcl:4:5: statefulset.drain.grace: "2h" is above the limit of 1h: write a shorter duration
                m/app.hcl:5:5: statefulset.drain.timeout: "5x" is not a duration (want e.g. "30s", "5m", "1h30m")
            "#]],
        ),
        (
            "deployment \"a\" \"b\" {\n  image = \"x\"\n  ports = [\"1-65535\"]\n}\n",
            expect![[r#"
                m/app.hcl:3:3: `ports` publish 65535 ports, above the limit of 10000: publish narrower ranges, or use network_mode = "host"
            "#]],
        ),
        (
            "deployment \"a\" \"b\" {\n  image = \"x\"\n  restart = \"on-failure:100000\"\n  keep_releases = 500\n}\n",
            expect![[r#"
                m/app.hcl:3:3: `restart` is 100000, above the limit of 1000 on-failure retries: lower the count, or use "always"
                m/app.hcl:4:3: `keep_releases` is 500, above the limit of 100 releases kept per deployment: keep fewer
            "#]],
        ),
        (
            "job \"a\" \"b\" {\n  image = \"x\"\n  timeout = \"9999h\"\n  successful_history_limit = 1000\n  failed_history_limit = -1\n}\n",
            expect![[r#"
                m/app.hcl:3:13: `timeout` "9999h" is above the limit of 168h: write a shorter duration
                m/app.hcl:4:3: `successful_history_limit` is 1000, above the limit of 100 runs kept per job: keep fewer
                m/app.hcl:5:3: `failed_history_limit` must not be negative, got -1 (0 means the default)
            "#]],
        ),
        (
            "deployment \"a\" \"b\" {\n  image = \"x\"\n  release {\n    command = [\"m\"]\n    timeout = \"200h\"\n  }\n  autoscale {\n    min = 1\n    max = 2\n    cpu_target = 50\n    cooldown_up = \"1000h\"\n  }\n}\n",
            expect![[r#"
                m/app.hcl:5:15: `release.timeout` "200h" is above the limit of 168h: write a shorter duration
                m/app.hcl:11:19: `autoscale.cooldown_up` "1000h" is above the limit of 168h: write a shorter duration
            "#]],
        ),
        (
            "deployment \"a\" \"b\" {\n  image = \"x\"\n  probes {\n    readiness {\n      tcp_socket { port = 80 }\n      period = \"2h\"\n      initial_delay = \"1000000h\"\n      failure_threshold = 100000\n    }\n  }\n}\n",
            expect![[r#"
                m/app.hcl:6:16: `probes.readiness.period` "2h" is above the limit of 1h: write a shorter duration
                m/app.hcl:7:23: `probes.readiness.initial_delay` "1000000h" is above the limit of 1h: write a shorter duration
                m/app.hcl:8:7: `probes.readiness.failure_threshold` is 100000, above the limit of 1000 probe results in a row: lower it, or lengthen `period`
            "#]],
        ),
        (
            "deployment \"a\" \"b\" {\n  image = \"x\"\n  init \"i\" {\n    command = [\"true\"]\n    timeout = \"200h\"\n    retries = 9\n  }\n}\n",
            expect![[r#"
                m/app.hcl:5:15: `init "i".timeout` "200h" is above the limit of 168h: write a shorter duration
                m/app.hcl:6:5: init "i" retries must be in [0, 5] (got 9)
            "#]],
        ),
        (
            "deployment \"a\" \"b\" {\n  image = \"x\"\n  resources {\n    limits {\n      cpu = \"5000\"\n      memory = \"99999Ti\"\n    }\n  }\n  logs {\n    max_size = \"100g\"\n    max_files = 1000\n  }\n}\n",
            expect![[r#"
                m/app.hcl:5:7: `resources.limits.cpu` "5000" is above the limit of 1024 CPUs: write the cores this container may use
                m/app.hcl:6:7: `resources.limits.memory` "99999Ti" is above the limit of 16Ti: write the memory this container may use
                m/app.hcl:10:5: `logs.max_size` "100g" is above the limit of 1g per log file: write a smaller size (and raise `max_files` for more history)
                m/app.hcl:11:5: `logs.max_files` is 1000, above the limit of 100 log files per container: keep fewer
            "#]],
        ),
        (
            "deployment \"a\" \"b\" {\n  image = \"x\"\n  resources {\n    limits {\n      cpu = \"1m\"\n      memory = \"1Ki\"\n    }\n  }\n  logs {\n    max_size = \"ten\"\n  }\n}\n",
            expect![[r#"
                m/app.hcl:5:7: `resources.limits.cpu` "1m" is below Docker's minimum of 0.01 CPUs ("10m")
                m/app.hcl:6:7: `resources.limits.memory` "1Ki" is below Docker's minimum of 6Mi
                m/app.hcl:10:5: `logs.max_size` "ten" is not a size: write a number with b, k, m or g, like "10m"
            "#]],
        ),
        (
            "deployment \"a\" \"b\" {\n  image = \"x\"\n  ulimits = {\n    nofile = \"9999999999999\"\n    bogus = \"1\"\n  }\n}\n",
            expect![[r#"
                m/app.hcl:4:5: `ulimits.nofile` "9999999999999" is above the limit of 1099511627776: write a smaller value, or -1 for unlimited
                m/app.hcl:5:5: `ulimits.bogus` is not a ulimit Docker knows (core, cpu, data, fsize, locks, memlock, msgqueue, nice, nofile, nproc, rss, rtprio, rttime, sigpending, stack)
            "#]],
        ),
        (
            "statefulset \"a\" \"b\" {\n  image = \"x\"\n  volume_claim \"d\" {\n    mount_path = \"/d\"\n    size = \"9999Ti\"\n  }\n  volume_claim \"e\" {\n    mount_path = \"/e\"\n    size = \"lots\"\n  }\n}\n",
            expect![[r#"
                m/app.hcl:5:5: volume_claim "d": size "9999Ti" is above the limit of 1024Ti: write a smaller size
                m/app.hcl:9:5: volume_claim "e": size "lots" is not a size: write a number with Ki Mi Gi Ti (1024-based) or K M G T (1000-based), like "20Gi"
            "#]],
        ),
        (
            "deployment \"a\" \"b\" {\n  image = \"x\"\n  docker_options = [\"--pids-limit=99999999\"]\n}\n",
            expect![[r#"
                m/app.hcl:3:3: `docker_options`: --pids-limit "99999999" is out of range: a process count (-1 for unlimited) is -1 to 4194304
            "#]],
        ),
        (
            "deployment \"a\" \"b\" {\n  image = \"x\"\n  docker_options = [\"--shm-size=99999g\"]\n}\n",
            expect![[r#"
                m/app.hcl:3:3: `docker_options`: --shm-size "99999g" is above the limit of 16t (17592186044416 bytes): write a smaller size
            "#]],
        ),
        (
            "deployment \"a\" \"b\" {\n  image = \"x\"\n  docker_options = [\"--oom-score-adj\", \"5000\"]\n}\n",
            expect![[r#"
                m/app.hcl:3:3: `docker_options`: --oom-score-adj "5000" is out of range: the kernel's OOM score adjustment is -1000 to 1000
            "#]],
        ),
        (
            "deployment \"a\" \"b\" {\n  image = \"x\"\n  docker_options = [\"--stop-timeout=86400\"]\n}\n",
            expect![[r#"
                m/app.hcl:3:3: `docker_options`: --stop-timeout "86400" is out of range: seconds to wait before SIGKILL is 0 to 3600
            "#]],
        ),
        (
            "ingress \"a\" \"b\" {\n  host = \"x.example\"\n  port = 70000\n  lb {\n    interval = \"2h\"\n  }\n}\n",
            expect![[r#"
                m/app.hcl:3:3: `port` must be 1–65535, got 70000
                m/app.hcl:5:16: `lb.interval` "2h" is above the limit of 1h: write a shorter duration
            "#]],
        ),
        (
            "asset \"a\" \"b\" {\n  k = url(\"https://x.example/k\", { timeout = \"1h\" })\n}\n",
            expect![[r#"
                m/app.hcl:2:7: url() timeout "1h" is above the limit of 5m: a fetch holds up the whole commit; write a shorter timeout
            "#]],
        ),
    ];
    for (input, expected) in rows {
        check(input, expected);
    }
}

/// Issue 10, item 2: values Docker would refuse or misread are refused where they are
/// written, for every kind that has them.
#[test]
fn values_docker_would_refuse_or_misread() {
    let rows = [
        (
            "deployment \"a\" \"b\" {\n  image = \"\"\n}\n",
            expect![[r#"
                m/app.hcl:2:3: `image` is empty: name an image such as "nginx:1.27", or leave `image` out
            "#]],
        ),
        (
            "deployment \"a\" \"b\" {\n  image = \"nginx; rm -rf /\"\n}\n",
            expect![[r#"
                m/app.hcl:2:3: `image` "nginx; rm -rf /" is not an image reference: it contains whitespace; write [registry[:port]/]name[:tag][@digest], e.g. "nginx:1.27" or "ghcr.io/org/app:v1"
            "#]],
        ),
        (
            "statefulset \"a\" \"b\" {\n  image = \"Nginx:1\"\n}\n",
            expect![[r#"
                m/app.hcl:2:3: `image` "Nginx:1" is not an image reference: the repository name must be lowercase; write [registry[:port]/]name[:tag][@digest], e.g. "nginx:1.27" or "ghcr.io/org/app:v1"
            "#]],
        ),
        (
            "job \"a\" \"b\" {\n  image = \"nginx:-bad\"\n}\n",
            expect![[r#"
                m/app.hcl:2:3: `image` "nginx:-bad" is not an image reference: tag "-bad" is not a tag (letters, digits, `_`, `.` and `-`, at most 128, not starting with `.` or `-`); write [registry[:port]/]name[:tag][@digest], e.g. "nginx:1.27" or "ghcr.io/org/app:v1"
            "#]],
        ),
        (
            "cronjob \"a\" \"b\" {\n  schedule = \"@daily\"\n  image = \"nginx@sha256:abc\"\n}\n",
            expect![[r#"
                m/app.hcl:3:3: `image` "nginx@sha256:abc" is not an image reference: digest "sha256:abc" is not algorithm:hex (e.g. sha256: and 64 hex digits); write [registry[:port]/]name[:tag][@digest], e.g. "nginx:1.27" or "ghcr.io/org/app:v1"
            "#]],
        ),
        (
            "app \"a\" \"b\" {\n  image = \"ghcr.io:x/app\"\n  host = \"b.example\"\n}\n",
            expect![[r#"
                m/app.hcl:2:3: `image` "ghcr.io:x/app" is not an image reference: registry "ghcr.io:x" is not a host[:port] (letters, digits, `-` and `.`, or an [IPv6] address); write [registry[:port]/]name[:tag][@digest], e.g. "nginx:1.27" or "ghcr.io/org/app:v1"
            "#]],
        ),
        (
            "postgres \"a\" \"b\" {\n  image = \"postgres 16\"\n}\n",
            expect![[r#"
                m/app.hcl:2:3: `image` "postgres 16" is not an image reference: it contains whitespace; write [registry[:port]/]name[:tag][@digest], e.g. "nginx:1.27" or "ghcr.io/org/app:v1"
            "#]],
        ),
        (
            "deployment \"a\" \"b\" {\n  image = \"x\"\n  init \"i\" {\n    image = \"a..b\"\n    command = [\"sh\", \"-c\", \"a\\u0000b\"]\n  }\n}\n",
            expect![[r#"
                m/app.hcl:4:5: `init "i".image` "a..b" is not an image reference: "a..b" is not a name component (lowercase letters and digits, joined by `.`, `_`, `__` or `-`); write [registry[:port]/]name[:tag][@digest], e.g. "nginx:1.27" or "ghcr.io/org/app:v1"
                m/app.hcl:5:28: `init "i".command[2]` "a\0b": it contains a NUL character, which no process can receive
            "#]],
        ),
        (
            "deployment \"A\" \"Web\" {\n  build { context = \".\" }\n}\n",
            expect![[r#"
                m/app.hcl:1:1: without `image` this deployment runs the build-mode image "A-Web:latest", which is not an image reference: the repository name must be lowercase; set `image`, or use a lowercase scope and name
            "#]],
        ),
        (
            "deployment \"a\" \"b\" {\n  image = \"x\"\n  env = {\n    \"A=B\" = \"1\"\n    \"C\\nD\" = \"2\"\n    E = \"x\\u0000y\"\n  }\n}\n",
            expect![[r#"
                m/app.hcl:4:5: `env` "A=B": the name contains `=`, where Docker would split it
                m/app.hcl:5:5: `env` "C\nD": the name contains a line break
                m/app.hcl:6:5: `env` "E": the value contains a NUL character, where the process would see it end
            "#]],
        ),
        (
            "job \"a\" \"b\" {\n  image = \"x\"\n  command = [\"echo\", \"a\\u0000b\"]\n}\n",
            expect![[r#"
                m/app.hcl:3:22: `command[1]` "a\0b": it contains a NUL character, which no process can receive
            "#]],
        ),
        (
            "deployment \"a\" \"b\" {\n  image = \"x\"\n  extra_hosts = [\"db:10.0.0.1\", \"evil:1.2.3.4\\n5.6.7.8 other\", \"nope\", \"h:999.1.1.1\"]\n}\n",
            expect![[r#"
                m/app.hcl:3:33: `extra_hosts[1]` "evil:1.2.3.4\n5.6.7.8 other": it contains a line break
                m/app.hcl:3:64: `extra_hosts[2]` "nope": write "host:ip"
                m/app.hcl:3:72: `extra_hosts[3]` "h:999.1.1.1": "999.1.1.1" is not an IP address (or host-gateway)
            "#]],
        ),
        (
            "deployment \"a\" \"b\" {\n  image = \"x\"\n  volumes = [\"/srv:/srv:ro\", \"./data:/data\", \"data/x:/x\", \"v:/v\", \"/a:rel\", \"/a:/b:rx\"]\n}\n",
            expect![[r#"
                m/app.hcl:3:30: `volumes[1]` "./data:/data": "./data" is a relative host path: a bind source must be absolute ("/srv/data"), a named volume a plain name ("data")
                m/app.hcl:3:46: `volumes[2]` "data/x:/x": "data/x" is a relative host path: a bind source must be absolute ("/srv/data"), a named volume a plain name ("data")
                m/app.hcl:3:59: `volumes[3]` "v:/v": "v" is not a volume name (letters, digits, `_`, `.` and `-`, starting with a letter or digit, at least two characters); a bind source is an absolute path
                m/app.hcl:3:67: `volumes[4]` "/a:rel": the target "rel" must be an absolute path in the container
                m/app.hcl:3:77: `volumes[5]` "/a:/b:rx": "rx" is not a mount option (ro, rw, z, Z, nocopy, shared, rshared, slave, rslave, private, rprivate, consistent, cached, delegated)
            "#]],
        ),
        (
            "cronjob \"a\" \"b\" {\n  schedule = \"@daily\"\n  image = \"x\"\n  volumes = [\"~/cache:/cache\"]\n  networks = [\"n\\nm\"]\n}\n",
            expect![[r#"
                m/app.hcl:4:14: `volumes[0]` "~/cache:/cache": "~/cache" is a relative host path: a bind source must be absolute ("/srv/data"), a named volume a plain name ("data")
                m/app.hcl:5:15: `networks[0]` "n\nm": it contains a line break
            "#]],
        ),
        (
            "deployment \"a\" \"b\" {\n  image = \"x\"\n  docker_options = [\"--label=k=a\\u0000b\"]\n}\n",
            expect![[r#"
                m/app.hcl:3:3: `docker_options`: "--label=k=a\0b" contains a NUL character: Docker would refuse or misread it; write one flag or value per list item
            "#]],
        ),
        (
            "deployment \"a\" \"b\" {\n  image = \"x\"\n  docker_options = [\"--add-host\", \"h:1.2.3.4\\nx\"]\n}\n",
            expect![[r#"
                m/app.hcl:3:3: `docker_options`: "h:1.2.3.4\nx" contains a line break: Docker would refuse or misread it; write one flag or value per list item
            "#]],
        ),
        (
            "deployment \"a\" \"b\" {\n  image = \"x\"\n  docker_options = [\"--add-host=h:not-an-ip\"]\n}\n",
            expect![[r#"
                m/app.hcl:3:3: `docker_options`: --add-host "h:not-an-ip": "not-an-ip" is not an IP address (or host-gateway)
            "#]],
        ),
        (
            "deployment \"a\" \"b\" {\n  image = \"x\"\n  release {\n    command = [\"m\\u0000\"]\n  }\n  post_deploy = [\"x\\u0000\"]\n  probes {\n    readiness {\n      exec { command = [\"a\\u0000\"] }\n    }\n  }\n}\n",
            expect![[r#"
                m/app.hcl:4:16: `release.command[0]` "m\0": it contains a NUL character, which no process can receive
                m/app.hcl:6:18: `post_deploy[0]` "x\0": it contains a NUL character, which no process can receive
                m/app.hcl:9:25: `probes.readiness.exec.command[0]` "a\0": it contains a NUL character, which no process can receive
            "#]],
        ),
        (
            "ingress \"a\" \"b\" {\n  host = \"a.example\\nevil\"\n  location {\n    path = \"/a b\"\n  }\n}\n",
            expect![[r#"
                m/app.hcl:2:3: `host` "a.example\nevil" is not a host name: no whitespace, control characters or `/`
                m/app.hcl:4:5: location.path "/a b" must not contain whitespace or control characters (percent-encode them)
            "#]],
        ),
        (
            "registry \"r\" {\n  url = \"ghcr.io\\nx\"\n  username = \"u\\u0000\"\n  token = \"t\"\n}\n",
            expect![[r#"
                m/app.hcl:2:3: registry `url` "ghcr.io\nx" must not contain whitespace or control characters
                m/app.hcl:3:3: registry `username`: it contains a NUL character
            "#]],
        ),
    ];
    for (input, expected) in rows {
        check(input, expected);
    }
}

/// A statefulset's `backup {}` (an extension): every refusal at the line that breaks it.
/// `{}` in each row is the block's body, inside a statefulset with a claim (line 4 is
/// `backup {`, its first attribute line 5).
#[test]
fn backup_block() {
    let with_claim = |body: &str| {
        format!(
            "statefulset \"a\" \"b\" {{\n  image = \"x\"\n  volume_claim \"d\" {{ mount_path = \"/d\" }}\n  backup {{\n{body}  }}\n}}\n"
        )
    };
    let ok = "    repository = \"/srv/b\"\n    password_file = \"/etc/p\"\n";
    let rows = [
        (
            with_claim(&format!("{ok}    retention = 3\n  }}\n  backup {{\n{ok}")),
            expect![[r#"
                m/app.hcl:7:5: unknown attribute `backup.retention` in backup
                m/app.hcl:9:3: `backup` block is declared twice in statefulset; merge them into one
            "#]],
        ),
        (
            with_claim(""),
            expect![[r#"
                m/app.hcl:4:3: backup needs `backup.repository`
                m/app.hcl:4:3: backup needs `backup.password_file`
            "#]],
        ),
        (
            with_claim("    repository = \"\"\n    password_file = \"\"\n"),
            expect![[r#"
                m/app.hcl:5:5: `backup.repository` must not be empty
                m/app.hcl:6:5: `backup.password_file` must not be empty
            "#]],
        ),
        (
            with_claim("    repository = \"-o=x\"\n    password_file = \"etc/p\"\n"),
            expect![[r#"
                m/app.hcl:5:5: `backup.repository` "-o=x" starts with `-`, which restic would read as an option: write an absolute path or a backend URL
                m/app.hcl:6:5: `backup.password_file` must be an absolute host path, got "etc/p": write e.g. "/etc/voodu/restic.pass"
            "#]],
        ),
        (
            with_claim("    repository = \"backups/db\"\n    password_file = \"/etc/p\"\n"),
            expect![[r#"
                m/app.hcl:5:5: `backup.repository` "backups/db" is neither an absolute local path nor a restic backend: write e.g. "/srv/backups/db", or start it with one of sftp: s3: rest: b2: azure: gs: swift: rclone:
            "#]],
        ),
        (
            with_claim("    repository = \"ftp:host/db\"\n    password_file = \"/etc/p\"\n"),
            expect![[r#"
                m/app.hcl:5:5: `backup.repository` "ftp:host/db" is neither an absolute local path nor a restic backend: write e.g. "/srv/backups/db", or start it with one of sftp: s3: rest: b2: azure: gs: swift: rclone:
            "#]],
        ),
        (
            with_claim(&format!(
                "{ok}    mode = \"snapshot\"\n    command = [\"x\"]\n"
            )),
            expect![[r#"
                m/app.hcl:7:5: `backup.mode` "snapshot" is not a backup mode: write "stop" (the default), "exec" or "live"
            "#]],
        ),
        (
            with_claim(&format!("{ok}    mode = \"exec\"\n")),
            expect![[r#"
                m/app.hcl:4:3: backup with mode = "exec" needs `backup.command`: the command whose stdout is the backup, like ["pg_dump", "-Fc", "app"]
                m/app.hcl:4:3: backup with mode = "exec" needs `backup.restore_command`: the command that reads the backup on stdin, like ["pg_restore", "-d", "app"]
            "#]],
        ),
        (
            with_claim(&format!(
                "{ok}    mode = \"live\"\n    command = [\"dump\"]\n    restore_command = [\"load\"]\n"
            )),
            expect![[r#"
                m/app.hcl:8:5: `backup.command` is for mode = "exec" only: remove it, or set mode = "exec"
                m/app.hcl:9:5: `backup.restore_command` is for mode = "exec" only: remove it, or set mode = "exec"
            "#]],
        ),
        (
            with_claim(&format!("{ok}    command = [\"dump\"]\n")),
            expect![[r#"
                m/app.hcl:7:5: `backup.command` is for mode = "exec" only: remove it, or set mode = "exec"
            "#]],
        ),
        (
            with_claim(&format!(
                "{ok}    schedule = \"0 25 * * *\"\n    timezone = \"Mars/Olympus\"\n"
            )),
            expect![[r#"
                m/app.hcl:7:5: `backup.schedule` "0 25 * * *": hour field "25": 25 is outside 0-23
                m/app.hcl:8:5: `backup.timezone` "Mars/Olympus" is not an IANA time zone name such as "Europe/Lisbon" or "America/New_York" in this host's time zone database
            "#]],
        ),
        (
            with_claim(&format!("{ok}    timezone = \"UTC\"\n")),
            expect![[r#"
                m/app.hcl:7:5: `backup.timezone` without a `schedule` means nothing: add a schedule, or remove it
            "#]],
        ),
        (
            with_claim(&format!("{ok}    verify = \"monthly\"\n")),
            expect![[r#"
                m/app.hcl:7:5: `backup.verify` "monthly" is not a period: write "daily" or "weekly", or leave it out
            "#]],
        ),
        (
            with_claim(&format!("{ok}    timeout = \"5x\"\n")),
            expect![[r#"
                m/app.hcl:7:5: `backup.timeout` "5x" is not a duration (want e.g. "30m", "1h", "1h30m")
            "#]],
        ),
        (
            with_claim(&format!("{ok}    timeout = \"25h\"\n")),
            expect![[r#"
                m/app.hcl:7:5: `backup.timeout` "25h" is above the limit of 24h: write a shorter duration
            "#]],
        ),
        (
            with_claim(&format!("{ok}    timeout = \"500ms\"\n")),
            expect![[r#"
                m/app.hcl:7:5: `backup.timeout` "500ms" is below 1s: write a longer duration, or leave it out for 1h
            "#]],
        ),
        (
            with_claim(&format!(
                "{ok}    keep {{\n      last = 1001\n      daily = -1\n      yearly = 2\n    }}\n"
            )),
            expect![[r#"
                m/app.hcl:8:7: `backup.keep.last` is 1001, above the limit of 1000 snapshots kept: keep fewer
                m/app.hcl:9:7: `backup.keep.daily` must not be negative, got -1
                m/app.hcl:10:7: unknown attribute `backup.keep.yearly` in backup.keep
            "#]],
        ),
        (
            format!("statefulset \"a\" \"b\" {{\n  image = \"x\"\n  backup {{\n{ok}  }}\n}}\n"),
            expect![[r#"
                m/app.hcl:3:3: nothing to back up: declare a volume_claim or use mode = "exec"
            "#]],
        ),
        (
            format!(
                "statefulset \"a\" \"b\" {{\n  image = \"x\"\n  backup {{\n{ok}    mode = \"live\"\n  }}\n}}\n"
            ),
            expect![[r#"
                m/app.hcl:3:3: nothing to back up: declare a volume_claim or use mode = "exec"
            "#]],
        ),
        (
            with_claim(&format!("{ok}    volume = \"d\"\n")),
            expect![[r#"
                m/app.hcl:7:5: `backup.volume` is for a deployment's named volume: a statefulset's backup reads its volume_claims; remove it
            "#]],
        ),
    ];
    for (input, expected) in rows {
        check(&input, expected);
    }
}

/// A deployment's `backup {}` backs up a named volume it mounts (`volume`): missing (unless
/// the mode is `exec`), or one it does not mount, is refused at its line.
#[test]
fn deployment_backup_block() {
    let deployment = |volumes: &str, body: &str| {
        format!(
            "deployment \"a\" \"b\" {{\n  image = \"x\"\n  volumes = [{volumes}]\n  backup {{\n    repository = \"/srv/b\"\n    password_file = \"/etc/p\"\n{body}  }}\n}}\n"
        )
    };
    let rows = [
        (
            deployment("\"up:/srv/up\"", ""),
            expect![[r#"
                m/app.hcl:4:3: a deployment's backup needs `backup.volume`, the named volume it backs up: one of up
            "#]],
        ),
        (
            deployment("\"/srv/host:/srv/up\"", "    volume = \"other\"\n"),
            expect![[r#"
                m/app.hcl:7:5: `backup.volume` "other" is not a named volume this deployment mounts: mount it with volumes = ["other:/path"]
            "#]],
        ),
    ];
    for (input, expected) in rows {
        check(&input, expected);
    }
}

/// A deployment's `canary {}` / `blue_green {}` (an extension): steps that do not grow, a
/// last step below 100, out-of-bound numbers and a second strategy, each at its line.
#[test]
fn rollout_strategy_blocks() {
    let deployment = |body: &str| format!("deployment \"a\" \"b\" {{\n  image = \"x\"\n{body}}}\n");
    let rows = [
        (
            deployment(
                "  canary {\n    step {\n      weight = 50\n    }\n    step {\n      weight = 10\n      pause = \"forever\"\n    }\n  }\n",
            ),
            expect![[r#"
                m/app.hcl:8:7: `canary.step.weight` 10 must be above the step before's 50: shares only grow
                m/app.hcl:8:7: the last canary step must be weight = 100 (the whole release), got 10: add step { weight = 100 }
                m/app.hcl:9:7: `canary.step.pause` "forever" is neither a duration like "30s" nor "until_promoted"
            "#]],
        ),
        (
            deployment(
                "  canary {\n    step {\n      weight = 0\n    }\n    step {\n      weight = 101\n    }\n  }\n",
            ),
            expect![[r#"
                m/app.hcl:5:7: `canary.step.weight` is a percentage of the traffic from 1 to 100, got 0
                m/app.hcl:8:7: `canary.step.weight` is a percentage of the traffic from 1 to 100, got 101
            "#]],
        ),
        (
            deployment("  canary {\n  }\n"),
            expect![[r#"
                m/app.hcl:3:3: canary needs `step` blocks: write e.g. step { weight = 10 } … step { weight = 100 }
            "#]],
        ),
        (
            deployment(
                "  canary {\n    step {\n      weight = 100\n    }\n    analysis {\n      interval = \"500ms\"\n      http {\n        path = \"health\"\n        samples = 5000\n        max_error_percent = 101\n      }\n      prometheus {\n        url = \"ftp://p\"\n        query = \"up\"\n        max = \"lots\"\n        count = 0\n      }\n    }\n  }\n",
            ),
            expect![[r#"
                m/app.hcl:8:7: `canary.analysis.interval` "500ms" is below 1s: write a longer duration
                m/app.hcl:10:9: `canary.analysis.http.path` "health" must start with `/`, like "/health"
                m/app.hcl:11:9: `canary.analysis.http.samples` is 5000, outside 1..=1000
                m/app.hcl:12:9: `canary.analysis.http.max_error_percent` is 101, outside 0..=100
                m/app.hcl:15:9: `canary.analysis.prometheus.url` "ftp://p" must be an http:// or https:// URL, like "http://prometheus:9090"
                m/app.hcl:17:9: `canary.analysis.prometheus.max` must be a number, like 0.05
                m/app.hcl:18:9: `canary.analysis.prometheus.count` is 0, outside 1..=100
            "#]],
        ),
        (
            deployment(
                "  canary {\n    step {\n      weight = 100\n    }\n    analysis {\n      prometheus {\n        url = \"http://p:9090\"\n        query = \"up\"\n      }\n    }\n  }\n",
            ),
            expect![[r#"
                m/app.hcl:8:7: canary.analysis.prometheus needs exactly one of `max` and `min`: the bound every result must hold
            "#]],
        ),
        (
            deployment(
                "  canary {\n    step {\n      weight = 100\n    }\n  }\n  blue_green {\n    preview_host = \"next.example.com\"\n  }\n",
            ),
            expect![[r#"
                m/app.hcl:8:3: a deployment rolls out with `canary` or with `blue_green`, not both: remove one
            "#]],
        ),
        (
            deployment(
                "  blue_green {\n    preview_host = \"http://next\"\n    keep_old = \"9999h\"\n    colour = \"blue\"\n  }\n",
            ),
            expect![[r#"
                m/app.hcl:4:5: `blue_green.preview_host` "http://next" must be a host name only, like "next.example.com"
                m/app.hcl:5:16: `blue_green.keep_old` "9999h" is above the limit of 168h: write a shorter duration
                m/app.hcl:6:5: unknown attribute `blue_green.colour` in blue_green
            "#]],
        ),
    ];
    for (input, expected) in rows {
        check(&input, expected);
    }
}

#[test]
fn start_up_order() {
    let db = "statefulset \"s\" \"db\" {\n  image = \"x\"\n}\n";
    // Forms, kinds and bounds, at the entry.
    check(
        &format!(
            "{db}deployment \"s\" \"web\" {{\n  image = \"x\"\n  depends_on {{\n    resources = [\"db\", \"statefu1set/s/db\", \"postgres/s/db\", \"job/s/db\", \"statefulset/s/../db\", \"statefulset/s/db\", \"statefulset/s/db\"]\n  }}\n}}\n"
        ),
        expect![[r#"
            m/app.hcl:7:18: `depends_on.resources[0]` "db": expected `kind/scope/name` or `kind/name` (its own scope), got 1 segment(s) separated by '/'
            m/app.hcl:7:24: `depends_on.resources[1]` "statefu1set/s/db": `statefu1set` is not a kind that can be waited for: write `deployment/…` or `statefulset/…` (did you mean `statefulset`?)
            m/app.hcl:7:44: `depends_on.resources[2]` "postgres/s/db": `postgres` is not a kind that can be waited for: write `deployment/…` or `statefulset/…` (a postgres or redis block declares a statefulset: write `statefulset/<scope>/<name>`)
            m/app.hcl:7:61: `depends_on.resources[3]` "job/s/db": a job has no Ready state to wait for: only a deployment or a statefulset can be depended on
            m/app.hcl:7:73: `depends_on.resources[4]` "statefulset/s/../db": expected `kind/scope/name` or `kind/name` (its own scope), got 4 segment(s) separated by '/'
            m/app.hcl:7:116: `depends_on.resources[6]` "statefulset/s/db" is listed twice: list each resource once
        "#]],
    );
    check(
        &format!(
            "deployment \"s\" \"web\" {{\n  image = \"x\"\n  depends_on {{\n    resources = [{}]\n  }}\n}}\n",
            (0..65)
                .map(|n| format!("\"deployment/s/d{n}\""))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        expect![[r#"
            m/app.hcl:4:5: `depends_on.resources` lists 65 resources, above the limit of 64: depend on fewer
        "#]],
    );
    // Not declared: refused like a missing asset, with the near one.
    check(
        &format!(
            "{db}deployment \"s\" \"web\" {{\n  image = \"x\"\n  depends_on {{\n    resources = [\"deployment/s/db\", \"statefulset/t/db\", \"statefulset/s/cache\"]\n  }}\n}}\n"
        ),
        expect![[r#"
            m/app.hcl:7:18: unresolved dependency "deployment/s/db": no deployment "db" in scope "s" in this commit (did you mean `statefulset/s/db`?)
            m/app.hcl:7:37: unresolved dependency "statefulset/t/db": no statefulset "db" in scope "t" in this commit (did you mean `statefulset/s/db`?)
            m/app.hcl:7:57: unresolved dependency "statefulset/s/cache": no statefulset "cache" in scope "s" in this commit
        "#]],
    );
    // A cycle, reported at each resource's entry that closes it; a resource on itself.
    check(
        "deployment \"s\" \"a\" {\n  image = \"x\"\n  depends_on {\n    resources = [\"deployment/b\"]\n  }\n}\n\
         deployment \"s\" \"b\" {\n  image = \"x\"\n  depends_on {\n    resources = [\"statefulset/s/c\"]\n  }\n}\n\
         statefulset \"s\" \"c\" {\n  image = \"x\"\n  depends_on {\n    resources = [\"deployment/s/a\"]\n  }\n}\n\
         deployment \"s\" \"self\" {\n  image = \"x\"\n  depends_on {\n    resources = [\"deployment/self\"]\n  }\n}\n",
        expect![[r#"
            m/app.hcl:4:18: depends_on.resources "deployment/b": a cycle: deployment/s/a → deployment/s/b → statefulset/s/c → deployment/s/a; none of these could start first: remove one of the dependencies
            m/app.hcl:10:18: depends_on.resources "statefulset/s/c": a cycle: deployment/s/b → statefulset/s/c → deployment/s/a → deployment/s/b; none of these could start first: remove one of the dependencies
            m/app.hcl:16:18: depends_on.resources "deployment/s/a": a cycle: statefulset/s/c → deployment/s/a → deployment/s/b → statefulset/s/c; none of these could start first: remove one of the dependencies
            m/app.hcl:22:18: depends_on.resources "deployment/self": deployment/s/self depends on itself; a resource cannot start after itself: remove the entry
        "#]],
    );
    // A job waits for nothing.
    check(
        &format!(
            "{db}job \"s\" \"migrate\" {{\n  image = \"x\"\n  depends_on {{\n    resources = [\"statefulset/db\"]\n  }}\n}}\n"
        ),
        expect![[r#"
            m/app.hcl:7:18: depends_on.resources "statefulset/db": a job does not wait for other resources; only a deployment or a statefulset starts after what it depends on (remove the entry, or make the job a deployment)
        "#]],
    );
}
