//! Build script: tells the tests where voodu's example corpus is (`VOODU_CORPUS_DIR`, else
//! `../shared/corpus`, beside the checkout for developers and CI), so the corpus tests are
//! reported as ignored, never as passed, when it is not there; whether `busybox` is on PATH (the macro script tests run
//! the scripts under its shell too); and stamps the git commit the binary is built from
//! (`VOODU_AGENT_COMMIT`, for `--version` and the `voodu_agent_build_info` metric): the
//! checkout's HEAD when git and a repository are there, else `unknown` (a source tarball).

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(voodu_corpus_missing)");
    println!("cargo::rustc-check-cfg=cfg(voodu_busybox_missing)");
    println!("cargo::rerun-if-env-changed=PATH");
    let busybox = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join("busybox").is_file()));
    if !busybox {
        println!("cargo::rustc-cfg=voodu_busybox_missing");
    }
    println!("cargo::rerun-if-changed=build.rs");
    // The corpus: `VOODU_CORPUS_DIR` (a copy anywhere, same layout), else `../shared/corpus`.
    println!("cargo::rerun-if-env-changed=VOODU_CORPUS_DIR");
    let corpus = std::env::var_os("VOODU_CORPUS_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new("../shared/corpus").to_owned());
    let examples = corpus.join("voodu-examples");
    if examples.is_dir() {
        println!("cargo::rerun-if-changed={}", examples.display());
        let absolute = std::fs::canonicalize(&corpus).unwrap_or(corpus);
        println!("cargo::rustc-env=VOODU_CORPUS_DIR={}", absolute.display());
    } else {
        println!("cargo::rustc-cfg=voodu_corpus_missing");
    }
    stamp_commit();
}

/// Sets `VOODU_AGENT_COMMIT` and asks for a rerun when HEAD moves (HEAD itself for a branch
/// switch, the branch's ref file and packed-refs for a new commit).
fn stamp_commit() {
    let git = |args: &[&str]| -> Option<String> {
        let output = Command::new("git").args(args).output().ok()?;
        output
            .status
            .success()
            .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
            .filter(|text| !text.is_empty())
    };
    let commit = git(&["rev-parse", "--short=12", "HEAD"]);
    if commit.is_some() {
        for (args, name) in [
            (&["rev-parse", "--git-path", "HEAD"][..], None),
            (&["rev-parse", "--git-path", "packed-refs"][..], None),
            (&["symbolic-ref", "-q", "HEAD"][..], Some(())),
        ] {
            let Some(path) = git(args) else { continue };
            let path = match name {
                // The branch's loose ref file.
                Some(()) => match git(&["rev-parse", "--git-path", &path]) {
                    Some(path) => path,
                    None => continue,
                },
                None => path,
            };
            if Path::new(&path).exists() {
                println!("cargo::rerun-if-changed={path}");
            }
        }
    }
    println!(
        "cargo::rustc-env=VOODU_AGENT_COMMIT={}",
        commit.as_deref().unwrap_or("unknown")
    );
}
