//! Benchmark: commit signature verification in "every commit" mode (`--verify-commits all`,
//! issue 13) over a range of 1,000 commits, each signed with `git commit -S` by a key
//! `ssh-keygen` made (`gpg.format=ssh`, ed25519), and, when gpg is installed, 200 commits
//! signed with an OpenPGP ed25519 key made by `gpg`. Prints the median over the runs of the
//! whole range and per commit (ms). The set-up (signing with the git CLI) is not measured.
//! Run: `cargo bench --bench verify`; under `cargo test --all-targets` it runs a 20-commit
//! smoke pass.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use voodu_agent::git::{Source, SourceOptions, TrustedKeys, VerifyMode};
use voodu_agent::model::CommitSha;

const RUNS: usize = 7;

fn run(command: &mut Command) -> String {
    let output = command.output().expect("the tool runs");
    assert!(
        output.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .expect("utf-8")
        .trim()
        .to_owned()
}

fn git(dir: &Path, args: &[&str]) -> String {
    run(Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "bench")
        .env("GIT_AUTHOR_EMAIL", "bench@example.invalid")
        .env("GIT_COMMITTER_NAME", "bench")
        .env("GIT_COMMITTER_EMAIL", "bench@example.invalid"))
}

/// A repository of `n + 1` commits signed with `sign` (git `-c` settings); returns the first
/// commit and the tip.
fn signed_repo(dir: &Path, sign: &[String], n: usize) -> (CommitSha, CommitSha) {
    git(dir, &["init", "-q", "-b", "main", "repo"]);
    let repo = dir.join("repo");
    let mut args: Vec<&str> = sign.iter().map(String::as_str).collect();
    args.extend(["commit", "-q", "--allow-empty", "-S", "-m"]);
    let mut first = None;
    for index in 0..=n {
        let message = format!("commit {index}");
        let mut with_message = args.clone();
        with_message.push(&message);
        git(&repo, &with_message);
        if first.is_none() {
            first = Some(CommitSha::new(git(&repo, &["rev-parse", "HEAD"])));
        }
    }
    let tip = CommitSha::new(git(&repo, &["rev-parse", "HEAD"]));
    (first.expect("at least one commit"), tip)
}

/// Median time to verify every commit after `first` up to `tip`.
fn bench(dir: &Path, keys: &TrustedKeys, first: &CommitSha, tip: &CommitSha, n: usize) -> Duration {
    let source = Source::new(
        SourceOptions {
            url: dir.join("repo").display().to_string(),
            branch: "main".to_owned(),
            paths: Vec::new(),
            token_file: None,
            ..Default::default()
        },
        &dir.join("data"),
    );
    let fetched = source.fetch(&AtomicBool::new(false)).expect("fetch");
    assert_eq!(&fetched, tip);
    let mut samples = Vec::new();
    for _ in 0..RUNS {
        let start = Instant::now();
        let verified = source
            .verify(keys, VerifyMode::All, Some(first), tip)
            .expect("verify runs")
            .expect("every commit is trusted");
        samples.push(start.elapsed());
        assert_eq!(verified.n_commits, n);
    }
    samples.sort();
    samples[samples.len() / 2]
}

fn ssh(n: usize) -> Duration {
    let dir = tempfile::tempdir().expect("temp dir");
    run(Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "bench", "-f"])
        .arg(dir.path().join("key")));
    let public = std::fs::read_to_string(dir.path().join("key.pub")).expect("public key");
    let fields: Vec<&str> = public.split_whitespace().collect();
    let allowed = dir.path().join("allowed_signers");
    std::fs::write(
        &allowed,
        format!("bench@example.invalid {} {}\n", fields[0], fields[1]),
    )
    .expect("allowed_signers");
    let sign = vec![
        "-c".to_owned(),
        "gpg.format=ssh".to_owned(),
        "-c".to_owned(),
        format!("user.signingkey={}", dir.path().join("key").display()),
    ];
    let (first, tip) = signed_repo(dir.path(), &sign, n);
    let keys = TrustedKeys::load(Some(&allowed), None).expect("keys");
    bench(dir.path(), &keys, &first, &tip, n)
}

fn gpg(n: usize) -> Option<Duration> {
    Command::new("gpg").arg("--version").output().ok()?;
    let dir = tempfile::Builder::new()
        .prefix("g")
        .tempdir_in("/tmp")
        .expect("temp dir");
    let home = dir.path().join("h");
    std::fs::create_dir(&home).expect("GNUPGHOME");
    let gpg = || {
        let mut command = Command::new("gpg");
        command.env("GNUPGHOME", &home);
        command
    };
    run(gpg()
        .args(["--batch", "--passphrase", "", "--quick-generate-key"])
        .args(["Bench <bench@example.invalid>", "ed25519", "sign", "never"]));
    let listing = run(gpg().args(["--batch", "--with-colons", "--list-secret-keys"]));
    let fingerprint = listing
        .lines()
        .find_map(|line| line.strip_prefix("fpr:"))?
        .trim_matches(':')
        .rsplit(':')
        .next()?
        .to_owned();
    let keyring = dir.path().join("keys.asc");
    std::fs::write(
        &keyring,
        run(gpg().args(["--batch", "--export", "--armor", &fingerprint])),
    )
    .expect("keyring");
    let wrapper = dir.path().join("gpg");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nGNUPGHOME='{}' exec gpg \"$@\"\n",
            home.display()
        ),
    )
    .expect("wrapper");
    run(Command::new("chmod").arg("755").arg(&wrapper));
    let sign = vec![
        "-c".to_owned(),
        format!("gpg.program={}", wrapper.display()),
        "-c".to_owned(),
        format!("user.signingkey={fingerprint}"),
    ];
    let (first, tip) = signed_repo(dir.path(), &sign, n);
    let keys = TrustedKeys::load(None, Some(&keyring)).expect("keys");
    let median = bench(dir.path(), &keys, &first, &tip, n);
    let _ = Command::new("gpgconf")
        .env("GNUPGHOME", &home)
        .args(["--kill", "gpg-agent"])
        .output();
    Some(median)
}

fn main() {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let full = std::env::args().any(|arg| arg == "--bench");
    let (n_ssh, n_gpg) = if full { (1_000, 200) } else { (20, 0) };
    let median = ssh(n_ssh);
    if !full {
        println!(
            "verify bench smoke run ({n_ssh} ssh-signed commits, debug build): {:.2} ms; real figures: cargo bench --bench verify",
            ms(median)
        );
        return;
    }
    println!("--verify-commits all, median of {RUNS} runs over one range");
    println!(
        "ssh (ed25519)     {n_ssh:>5} commits: {:9.2} ms   {:.3} ms per commit",
        ms(median),
        ms(median) / n_ssh as f64
    );
    match gpg(n_gpg) {
        Some(median) => println!(
            "openpgp (ed25519) {n_gpg:>5} commits: {:9.2} ms   {:.3} ms per commit",
            ms(median),
            ms(median) / n_gpg as f64
        ),
        None => println!("openpgp: gpg is not installed (scripts/test-deps installs gnupg)"),
    }
}
