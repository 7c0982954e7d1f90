//! Issue 13 item 2: SOPS files encrypted by the real `sops` with `age` keys, opened by the
//! agent: the four formats with their MAC verified, a wrong key and a changed value refused
//! with the reason; then the agent: a SOPS env file decrypted into a replica's environment
//! (`docker inspect`), the value nowhere in the log, status, plan or state.db, and a commit
//! whose file the agent cannot decrypt rejected naming the file.

use voodu_agent::assets::sops::{Keyring, SopsError};
use voodu_agent::manifest::sops::{SopsFormat, parse};

use crate::support::TestResult;
use crate::support::sops::AgeKey;

const NEEDS_TOOLS: &str = "sops and age are not installed: run scripts/test-deps";

fn open(
    key: &AgeKey,
    bytes: &[u8],
) -> TestResult<Result<voodu_agent::assets::sops::Plain, SopsError>> {
    let file = parse(bytes).ok_or("not recognised as SOPS")??;
    let keyring = Keyring::load(&[key.identity()])?;
    Ok(keyring.open(&file))
}

#[test]
#[ignore = "needs sops and age, which scripts/test-deps installs: scripts/test runs it"]
fn files_sops_encrypts_open_in_every_format_with_their_mac_checked() -> TestResult {
    if !AgeKey::tools_available() {
        return Err(NEEDS_TOOLS.into());
    }
    let key = AgeKey::new()?;
    let dotenv = key.encrypt(
        b"DB_PASSWORD=s3cr3t\nTOKEN=a\\nb\n# a comment\nEMPTY=\n",
        "dotenv",
    )?;
    let file = parse(&dotenv).ok_or("dotenv")??;
    assert_eq!(file.format, SopsFormat::Dotenv);
    let plain = open(&key, &dotenv)??;
    assert_eq!(
        plain.env()?,
        [
            ("DB_PASSWORD".to_owned(), "s3cr3t".to_owned()),
            ("TOKEN".to_owned(), "a\nb".to_owned()),
            ("EMPTY".to_owned(), String::new()),
        ]
    );
    assert_eq!(
        plain.file_bytes()?,
        b"DB_PASSWORD=s3cr3t\nTOKEN=a\\nb\nEMPTY=\n"
    );

    let yaml = key.encrypt(
        b"db:\n  password: hunter2\n  hosts:\n    - a\n    - 2\nport: 5432\nenabled: true\nratio: 1.50\nport_unencrypted: 8080\n",
        "yaml",
    )?;
    let plain = open(&key, &yaml)??;
    let text = String::from_utf8(plain.file_bytes()?)?;
    assert!(
        text.contains("password: hunter2") && text.contains("port: 5432"),
        "{text}"
    );
    assert!(
        plain.env().is_err(),
        "a nested value is no environment variable"
    );

    let json = key.encrypt(
        br#"{"API_KEY": "k-123", "RETRIES": 3, "DEBUG": false}"#,
        "json",
    )?;
    let plain = open(&key, &json)??;
    assert_eq!(
        plain.env()?,
        [
            ("API_KEY".to_owned(), "k-123".to_owned()),
            ("RETRIES".to_owned(), "3".to_owned()),
            ("DEBUG".to_owned(), "false".to_owned()),
        ]
    );

    let bytes = b"-----BEGIN PRIVATE KEY-----\n\x00\xffbinary\n-----END PRIVATE KEY-----\n";
    let binary = key.encrypt(bytes, "binary")?;
    let file = parse(&binary).ok_or("binary")??;
    assert_eq!(file.format, SopsFormat::Binary);
    assert_eq!(open(&key, &binary)??.file_bytes()?, bytes);
    Ok(())
}

#[test]
#[ignore = "needs sops and age, which scripts/test-deps installs: scripts/test runs it"]
fn a_wrong_key_or_a_changed_value_is_refused_with_the_reason() -> TestResult {
    if !AgeKey::tools_available() {
        return Err(NEEDS_TOOLS.into());
    }
    let key = AgeKey::new()?;
    let other = AgeKey::new()?;
    let dotenv = key.encrypt(b"A=1\nB=2\n", "dotenv")?;
    match open(&other, &dotenv)? {
        Err(SopsError::NoMatchingKey { recipients, held }) => {
            assert_eq!(recipients, key.recipient);
            assert_eq!(held, other.recipient);
        }
        other => return Err(format!("expected no matching key, got {other:?}").into()),
    }
    // Lines reordered: each value still decrypts under its own key (its path is the additional
    // data), but the MAC covers the values in order and no longer matches.
    let text = String::from_utf8(dotenv)?;
    let mut lines: Vec<&str> = text.lines().collect();
    lines.swap(0, 1);
    let reordered = lines.join("\n") + "\n";
    assert!(matches!(
        open(&key, reordered.as_bytes())?,
        Err(SopsError::MacMismatch)
    ));
    // A value replaced by one encrypted for the same key and path in another file.
    let forged = key.encrypt(b"A=9\nB=2\n", "dotenv")?;
    let forged_a = String::from_utf8(forged)?
        .lines()
        .find(|line| line.starts_with("A="))
        .ok_or("A")?
        .to_owned();
    let swapped = text
        .lines()
        .map(|line| {
            if line.starts_with("A=") {
                forged_a.as_str()
            } else {
                line
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    match open(&key, swapped.as_bytes())? {
        Err(SopsError::Malformed(why)) => assert!(why.contains("at A"), "{why}"),
        other => return Err(format!("expected the foreign value refused, got {other:?}").into()),
    }
    Ok(())
}

/// The deployment of the Docker test: `V` in clear, the rest from a SOPS env file.
fn web_with_secrets(scope: &str) -> String {
    format!(
        r#"deployment "{scope}" "web" {{
  image    = "{image}"
  command  = ["sleep", "3600"]
  env_file = ["secrets.sops.env"]
  env      = {{ V = "1" }}
}}
"#,
        image = crate::support::test_image(),
    )
}

/// Every file under `dir` (recursively) whose bytes contain `needle`.
fn files_containing(dir: &std::path::Path, needle: &[u8]) -> TestResult<Vec<String>> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let path = entry.path();
            if entry.file_type()?.is_dir() {
                pending.push(path);
            } else if std::fs::read(&path)?
                .windows(needle.len())
                .any(|window| window == needle)
            {
                found.push(path.display().to_string());
            }
        }
    }
    Ok(found)
}

fn container_env(id: &str) -> TestResult<Vec<String>> {
    let output = std::process::Command::new("docker")
        .args(["inspect", "--format", "{{json .Config.Env}}", id])
        .output()?;
    Ok(serde_json::from_slice(&output.stdout)?)
}

#[test]
#[ignore = "needs a Docker engine, sops and age (scripts/test-deps): scripts/test runs it"]
fn i13_a_sops_env_file_reaches_the_replica_and_nothing_else() -> TestResult {
    if !AgeKey::tools_available() {
        return Err(NEEDS_TOOLS.into());
    }
    crate::e2e_docker::Env::new()?.run(sops_env_file)
}

fn sops_env_file(env: &mut crate::e2e_docker::Env) -> TestResult {
    let key = AgeKey::new()?;
    let identity = key.identity().display().to_string();
    // A value that appears nowhere unless it leaks.
    let secret = format!("pw-{}", voodu_agent::model::random_hex(12));
    let secrets = env.repo.work().join("secrets.sops.env");
    key.encrypt_to(
        &secrets,
        format!("DB_PASSWORD={secret}\nV=from-the-file\n").as_bytes(),
        "dotenv",
    )?;
    env.repo.write(
        "app/web.hcl",
        &web_with_secrets(env.scope()).replace("\"secrets.sops.env\"", "\"../secrets.sops.env\""),
    )?;
    // An asset whose source is a SOPS binary file: decrypted onto the host, mode 0600.
    let private_key = format!(
        "-----BEGIN KEY-----\n{}\n-----END KEY-----\n",
        voodu_agent::model::random_hex(16)
    );
    key.encrypt_to(
        &env.repo.work().join("tls.key.sops"),
        private_key.as_bytes(),
        "binary",
    )?;
    env.repo.write(
        "app/certs.hcl",
        &format!(
            "asset \"{}\" \"certs\" {{\n  key = file(\"../tls.key.sops\")\n}}\n",
            env.scope()
        ),
    )?;
    let first = env.repo.commit("web with a SOPS env file")?;
    env.start_agent_with(&["--age-identity", &identity, "--ready-settle", "1s"])?;
    let running = env.converged(&first, 1, None)?;
    let vars = container_env(&running[0].id)?;
    assert!(vars.contains(&format!("DB_PASSWORD={secret}")), "{vars:?}");
    // `env` wins over the file for V, as over a plain env_file.
    assert!(vars.contains(&"V=1".to_owned()), "{vars:?}");
    let asset = env
        .data_dir()
        .join("assets")
        .join(env.scope())
        .join("certs")
        .join("key");
    assert_eq!(std::fs::read_to_string(&asset)?, private_key);
    {
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(
            std::fs::metadata(&asset)?.permissions().mode() & 0o777,
            0o600
        );
    }

    // A changed secret rolls the replica, as any env change.
    let rotated = format!("pw-{}", voodu_agent::model::random_hex(12));
    key.encrypt_to(
        &secrets,
        format!("DB_PASSWORD={rotated}\nV=from-the-file\n").as_bytes(),
        "dotenv",
    )?;
    let second = env.repo.commit("rotate the password")?;
    // The spec hash does not cover the values (voodu's hash, no secret in it); the keyed
    // env digest does, as for a config bucket change: the replica is replaced.
    let rolled = crate::support::wait_until(
        std::time::Duration::from_secs(60),
        "a replica with the rotated password",
        || {
            let rows = env.containers().ok()?;
            let row = rows
                .iter()
                .find(|row| row.state == "running" && row.id != running[0].id)?;
            container_env(&row.id)
                .ok()?
                .contains(&format!("DB_PASSWORD={rotated}"))
                .then(|| row.id.clone())
        },
    )?;
    let converged = env.converged(&second, 1, None)?;
    assert_eq!(converged[0].id, rolled);

    // A file encrypted for another key: rejected naming the file; the host keeps the last
    // good commit.
    let stranger = AgeKey::new()?;
    stranger.encrypt_to(&secrets, b"DB_PASSWORD=other\n", "dotenv")?;
    let third = env.repo.commit("encrypted for someone else")?;
    let status = crate::support::wait_until(
        std::time::Duration::from_secs(60),
        "the commit's rejection",
        || {
            env.status()
                .ok()
                .filter(|status| status["last_rejected"]["sha"] == third.as_str())
        },
    )?;
    let error = status["last_rejected"]["errors"][0]
        .as_str()
        .unwrap_or_default();
    assert!(
        error.contains("env_file \"../secrets.sops.env\" cannot be decrypted: no matching key")
            && error.contains(&stranger.recipient),
        "{status}"
    );
    assert_eq!(status["last_applied"]["sha"], second.as_str());

    // `plan` with the agent's identity, over the rotation: the change shows by digest.
    let plan = std::process::Command::new(env!("CARGO_BIN_EXE_voodu-agent"))
        .args([
            "plan",
            "--repo",
            &env.repo.url(),
            "--rev",
            &second,
            "--age-identity",
            &identity,
        ])
        .arg("--data-dir")
        .arg(env.data_dir())
        .output()?;
    let plan_text = format!(
        "{}{}",
        String::from_utf8_lossy(&plan.stdout),
        String::from_utf8_lossy(&plan.stderr)
    );
    assert_eq!(plan.status.code(), Some(0), "{plan_text}");

    // The values appear nowhere but in the container: not in the agent's log, status, plan,
    // the activity log, state.db (and its WAL) or any other file of the data dir.
    let activity = env.cli(&["activity", "--json"])?;
    assert!(
        activity.contains(&second[..12]),
        "the activity log records the rotation's commit: {activity}"
    );
    for value in [&secret, &rotated] {
        assert!(
            !activity.contains(value.as_str()),
            "the activity log holds a secret"
        );
        let log = std::fs::read_to_string(env.log())?;
        assert!(!log.contains(value.as_str()), "the log holds a secret");
        let status = serde_json::to_string(&env.status()?)?;
        assert!(!status.contains(value.as_str()), "status holds a secret");
        assert!(!plan_text.contains(value.as_str()), "plan holds a secret");
        let leaked = files_containing(&env.data_dir(), value.as_bytes())?;
        assert!(leaked.is_empty(), "files holding a secret: {leaked:?}");
    }
    Ok(())
}

#[test]
#[ignore = "needs sops and age, which scripts/test-deps installs: scripts/test runs it"]
fn files_the_age_tool_encrypts_open_at_every_chunk_boundary() -> TestResult {
    use voodu_agent::assets::age::{AgeError, Identity, decrypt};
    if !AgeKey::tools_available() {
        return Err(NEEDS_TOOLS.into());
    }
    let key = AgeKey::new()?;
    let other = AgeKey::new()?;
    let text = std::fs::read_to_string(key.identity())?;
    let identity: Identity = text
        .lines()
        .find(|line| line.starts_with("AGE-SECRET-KEY-1"))
        .ok_or("no identity line")?
        .parse()?;
    assert_eq!(identity.recipient(), key.recipient);
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("plain");
    let age = |plain: &[u8], armor: bool, recipients: &[&str]| -> TestResult<Vec<u8>> {
        std::fs::write(&input, plain)?;
        let mut command = std::process::Command::new("age");
        command.arg("--encrypt");
        if armor {
            command.arg("--armor");
        }
        for recipient in recipients {
            command.args(["--recipient", recipient]);
        }
        let output = command.arg(&input).output()?;
        assert!(output.status.success(), "age --encrypt failed");
        Ok(output.stdout)
    };
    // Payload chunks are 64 KiB: empty, one byte, around one and two chunk lengths.
    for size in [0usize, 1, 65_535, 65_536, 65_537, 131_072, 200_000] {
        let plain: Vec<u8> = (0..size).map(|at| (at * 7 % 251) as u8).collect();
        for armor in [true, false] {
            let file = age(&plain, armor, &[&other.recipient, &key.recipient])?;
            let opened = decrypt(std::slice::from_ref(&identity), &file)?;
            assert!(
                opened == plain,
                "{size} bytes, armor {armor}: wrong plaintext"
            );
            let mut cut = file.clone();
            cut.truncate(file.len() - if armor { 40 } else { 1 });
            assert!(
                decrypt(std::slice::from_ref(&identity), &cut).is_err(),
                "{size} bytes cut short"
            );
        }
    }
    let theirs = age(b"not for us", true, &[&other.recipient])?;
    assert_eq!(decrypt(&[identity], &theirs), Err(AgeError::NoMatch));
    Ok(())
}
