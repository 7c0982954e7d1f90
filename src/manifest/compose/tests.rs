//! Unit tests of `convert`: each mapping, the notes at their positions, anchors and merge keys
//! bounded, and that the output loads as the agent loads a commit.

use std::collections::BTreeMap;

use super::*;
use crate::manifest::{LoadOptions, load, tests::snapshot};

fn no_files(name: &str) -> Result<String, String> {
    match name {
        "app.env" => Ok("FROM_FILE=1\nSHARED=file\n".to_owned()),
        "secret.txt" => Ok("s3cret".to_owned()),
        _ => Err("no such file".to_owned()),
    }
}

fn run(text: &str) -> Result<Conversion, ComposeError> {
    let options = Options {
        base_dir: "/srv/app".to_owned(),
        scope: None,
        default_project: "My_App".to_owned(),
        vars: BTreeMap::from([
            ("TAG".to_owned(), "1.2".to_owned()),
            ("FROM_SHELL".to_owned(), "sh".to_owned()),
        ]),
        profiles: vec!["debug".to_owned()],
        read: &no_files,
    };
    convert(text, &options)
}

fn notes(conversion: &Conversion) -> Vec<String> {
    conversion
        .notes
        .iter()
        .map(|n| n.show("compose.yaml"))
        .collect()
}

/// Loads the output as one commit: no diagnostics.
fn loads(conversion: &Conversion) {
    let files: Vec<(String, String)> = conversion
        .files
        .iter()
        .map(|f| (format!("c/{}", f.name), f.text.clone()))
        .collect();
    let borrowed: Vec<(&str, &str)> = files
        .iter()
        .map(|(p, t)| (p.as_str(), t.as_str()))
        .collect();
    if let Err(diagnostics) = load(&snapshot(&borrowed), &LoadOptions::standalone()) {
        panic!("{diagnostics:?}\n{files:#?}");
    }
}

const FULL: &str = r#"x-common: &common
  restart: unless-stopped
  labels:
    team: web
services:
  web:
    <<: *common
    image: "nginx:${TAG}"
    entrypoint: ["/docker-entrypoint.sh", "-x"]
    command: nginx -g 'daemon off;'
    environment:
      - A=1
      - FROM_SHELL
      - SHARED=env
      - DOLLAR=$$HOME
    env_file: app.env
    ports:
      - "8080:80"
      - "127.0.0.1:9000:9000/udp"
      - target: 443
        published: "8443"
    volumes:
      - ./html:/usr/share/nginx/html:ro
      - cache:/var/cache/nginx
      - /tmp/anon
    expose: [80]
    container_name: web1
    networks: [front]
    extra_hosts: ["gw:10.0.0.1", "db=10.0.0.2"]
    deploy:
      replicas: 2
      resources:
        limits: {cpus: "0.5", memory: 512M}
        reservations: {memory: 64M}
    secrets: [token]
    depends_on:
      db:
        condition: service_healthy
  db:
    image: postgres:16
    volumes: [data:/var/lib/postgresql/data]
    healthcheck:
      test: ["CMD-SHELL", "pg_isready -U $${USER}"]
      interval: 5s
      retries: 3
      start_interval: 1s
  tools:
    image: busybox
    profiles: [ops]
volumes:
  cache:
  data:
networks:
  front:
    driver: overlay
secrets:
  token:
    file: secret.txt
  unused:
    file: secret.txt
"#;

#[test]
fn a_full_service_maps_and_loads() -> Result<(), ComposeError> {
    let c = run(FULL)?;
    assert_eq!(c.scope, "my_app");
    let web = &c
        .files
        .iter()
        .find(|f| f.name == "web.hcl")
        .map(|f| f.text.clone())
        .unwrap_or_default();
    for line in [
        "deployment \"my_app\" \"web\" {",
        "image = \"nginx:1.2\"",
        "replicas = 2",
        "command = [\"-x\", \"nginx\", \"-g\", \"daemon off;\"]",
        "\"--entrypoint=/docker-entrypoint.sh\"",
        "\"--label=team=web\"",
        "FROM_FILE = \"1\"",
        "FROM_SHELL = \"sh\"",
        "SHARED = \"env\"",
        "DOLLAR = \"$HOME\"",
        "ports = [\"0.0.0.0:8080:80\", \"127.0.0.1:9000:9000/udp\", \"0.0.0.0:8443:443\"]",
        "\"/srv/app/html:/usr/share/nginx/html:ro\"",
        "\"my_app_cache:/var/cache/nginx\"",
        "\"/tmp/anon\"",
        "\"${asset.my_app.secrets.token}:/run/secrets/token:ro\"",
        "networks = [\"my_app_front\"]",
        "extra_hosts = [\"gw:10.0.0.1\", \"db:10.0.0.2\"]",
        "restart = \"unless-stopped\"",
        "cpu = \"0.5\"",
        "memory = \"512Mi\"",
        "  depends_on {\n    resources = [\"statefulset/my_app/db\"]\n  }",
    ] {
        assert!(web.contains(line), "{line} in:\n{web}");
    }
    let db = &c
        .files
        .iter()
        .find(|f| f.name == "db.hcl")
        .map(|f| f.text.clone())
        .unwrap_or_default();
    assert!(db.contains("statefulset \"my_app\" \"db\""), "{db}");
    assert!(db.contains("volume_claim \"data\""), "{db}");
    assert!(
        db.contains("command = [\"/bin/sh\", \"-c\", \"pg_isready -U $${USER}\"]"),
        "{db}"
    );
    assert!(db.contains("failure_threshold = 3"), "{db}");
    assert!(
        !c.files.iter().any(|f| f.name == "tools.hcl"),
        "tools is in an inactive profile"
    );
    let notes = notes(&c);
    for expected in [
        "compose.yaml:1:1: x-common: not carried: an extension field",
        "compose.yaml:26:5: services.web.expose: not carried:",
        "compose.yaml:27:5: services.web.container_name: not carried:",
        "compose.yaml:34:9: services.web.deploy.resources.reservations: not carried:",
        "compose.yaml:36:5: services.web.depends_on: note: carried as the start-up order",
        "compose.yaml:46:7: services.db.healthcheck.start_interval: not carried:",
        "compose.yaml:49:5: services.tools.profiles: not carried: the service is only in profiles \"ops\"",
        "compose.yaml:55:5: networks.front.driver: not carried: the agent creates a network",
        "compose.yaml:58:5: secrets.token.file: note: the secret's content is written",
        "compose.yaml:59:3: secrets.unused: not carried: no converted service mounts it",
    ] {
        assert!(
            notes.iter().any(|n| n.starts_with(expected)),
            "{expected} in:\n{}",
            notes.join("\n")
        );
    }
    loads(&c);
    Ok(())
}

#[test]
fn a_shared_named_volume_keeps_deployments() -> Result<(), ComposeError> {
    let c = run(
        "services:\n  a:\n    image: x\n    volumes: [vol:/v]\n  b:\n    image: x\n    volumes: [vol:/w:ro, x:/x]\nvolumes:\n  vol:\n    external: true\n  x:\n    external: true\n",
    )?;
    for f in &c.files {
        assert!(f.text.contains("deployment "), "{}", f.text);
        assert!(
            f.text.contains("\"vol:/"),
            "an external volume keeps its name: {}",
            f.text
        );
        assert!(!f.text.contains("\"x:/x"), "{}", f.text);
    }
    assert!(
        notes(&c)
            .iter()
            .any(|n| n.starts_with("compose.yaml:7:26: services.b.volumes: not carried: \"x:/x\"")),
        "{:?}",
        notes(&c)
    );
    loads(&c);
    Ok(())
}

/// Compose's `depends_on` conditions become the start-up order where the agent's `Ready`
/// means the same (or more, noted); a one-shot's exit and a service not converted are named.
#[test]
fn depends_on_conditions_become_the_start_up_order() -> Result<(), ComposeError> {
    let c = run(concat!(
        "services:\n",
        "  web:\n    image: x\n    depends_on: [api]\n",
        "  api:\n    image: x\n    depends_on:\n",
        "      cache:\n        condition: service_healthy\n",
        "      migrate:\n        condition: service_completed_successfully\n",
        "      tools:\n        condition: service_started\n",
        "  cache:\n    image: x\n",
        "  migrate:\n    image: x\n",
        "  tools:\n    image: x\n    profiles: [ops]\n",
    ))?;
    let file = |name: &str| {
        c.files
            .iter()
            .find(|f| f.name == name)
            .map(|f| f.text.clone())
            .unwrap_or_default()
    };
    assert!(
        file("web.hcl")
            .contains("  depends_on {\n    resources = [\"deployment/my_app/api\"]\n  }"),
        "{}",
        file("web.hcl")
    );
    assert!(
        file("api.hcl").contains("resources = [\"deployment/my_app/cache\"]"),
        "{}",
        file("api.hcl")
    );
    let notes = notes(&c);
    for expected in [
        "compose.yaml:4:18: services.web.depends_on.api: note: the agent waits until \"api\" is Ready (its replicas run), not only started",
        "compose.yaml:8:7: services.api.depends_on.cache: note: \"cache\" has no healthcheck",
        "compose.yaml:10:7: services.api.depends_on.migrate: not carried: the agent cannot wait for a one-shot container to exit 0",
        "compose.yaml:12:7: services.api.depends_on.tools: not carried: \"tools\" is in no active profile",
    ] {
        assert!(
            notes.iter().any(|n| n.starts_with(expected)),
            "{expected} in:\n{}",
            notes.join("\n")
        );
    }
    loads(&c);
    Ok(())
}

#[test]
fn values_the_agent_would_refuse_are_named() -> Result<(), ComposeError> {
    let c = run(
        "services:\n  a:\n    image: Bad/Name\n  b:\n    image: x\n    environment:\n      \"A=B\": 1\n      OK: 2\n",
    )?;
    assert_eq!(c.files.len(), 1, "{:?}", c.files);
    assert!(c.files[0].text.contains("OK = \"2\"") && !c.files[0].text.contains("A=B"));
    let notes = notes(&c);
    assert!(
        notes.iter().any(
            |n| n.starts_with("compose.yaml:3:12: services.a.image: not carried: \"Bad/Name\"")
        ),
        "{notes:?}"
    );
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with("compose.yaml:6:5: services.b.environment.A=B: not carried:")),
        "{notes:?}"
    );
    loads(&c);
    Ok(())
}

#[test]
fn build_only_services_run_a_local_image_and_say_so() -> Result<(), ComposeError> {
    let c = run("services:\n  app:\n    build: .\n")?;
    assert!(c.files[0].text.contains("image = \"my_app-app:latest\""));
    assert!(
        notes(&c).iter().any(|n| n.starts_with(
            "compose.yaml:3:5: services.app.build: not carried: the agent builds nothing"
        )),
        "{:?}",
        notes(&c)
    );
    loads(&c);
    Ok(())
}

#[test]
fn invalid_files_and_nothing_to_convert_are_errors_with_positions() {
    let error = |text: &str| {
        run(text)
            .map(|_| String::new())
            .unwrap_or_else(|e| e.to_string())
    };
    assert!(error("services:\n  a: [\n").contains("not valid YAML"));
    assert!(
        error("services:\n  a:\n    image: ${X:?set X}\n")
            .starts_with("3:12: services.a.image: required variable X")
    );
    assert!(error("volumes: {}\n").contains("no `services:`"));
    assert!(error("services:\n  a:\n    command: x\n").contains("no service could be converted"));
    assert!(error("a: &a [*a]\n").contains("alias to no anchor"));
    // An alias bomb: each level doubles; the node budget stops it.
    let mut bomb = String::from("a: &a0 [x, x]\n");
    for n in 1..40 {
        bomb.push_str(&format!("a{n}: &a{n} [*a{}, *a{}]\n", n - 1, n - 1));
    }
    assert!(
        error(&bomb).contains("more than 100000 values"),
        "{}",
        error(&bomb)
    );
}
