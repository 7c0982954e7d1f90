//! Build script: tells the tests where voodu's example corpus is (`VOODU_CORPUS_DIR`, else
//! `../shared/corpus`, beside the checkout for developers and CI), so the corpus tests are
//! reported as ignored, never as passed, when it is not there (and the Compose corpus
//! `convert` is tested on: `VOODU_COMPOSE_CORPUS_DIR`, else `tests/fixtures/compose-corpus`); whether
//! `busybox` is on PATH (the macro script tests run the scripts under its shell too); and
//! stamps the git commit the binary is built from (`VOODU_AGENT_COMMIT`, for `--version` and
//! the `voodu_agent_build_info` metric): the checkout's HEAD when git and a repository are
//! there, else `unknown` (a source tarball). It also links the agent's binary smaller and
//! laid out by use: its code in `build/code-order.txt`'s order and its relative relocations
//! packed (both below).

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(voodu_corpus_missing)");
    println!("cargo::rustc-check-cfg=cfg(voodu_busybox_missing)");
    println!("cargo::rustc-check-cfg=cfg(voodu_compose_corpus_missing)");
    println!("cargo::rustc-check-cfg=cfg(voodu_code_order)");
    println!("cargo::rustc-check-cfg=cfg(voodu_packed_relocs)");
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
    // The Compose corpus (`convert`'s tests): `VOODU_COMPOSE_CORPUS_DIR`, else the copy in
    // `tests/fixtures/compose-corpus`, holding `awesome-compose/`.
    println!("cargo::rerun-if-env-changed=VOODU_COMPOSE_CORPUS_DIR");
    let compose = std::env::var_os("VOODU_COMPOSE_CORPUS_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new("tests/fixtures/compose-corpus").to_owned());
    if compose.join("awesome-compose").is_dir() {
        let absolute = std::fs::canonicalize(&compose).unwrap_or(compose);
        println!(
            "cargo::rustc-env=VOODU_COMPOSE_CORPUS_DIR={}",
            absolute.display()
        );
    } else {
        println!("cargo::rustc-cfg=voodu_compose_corpus_missing");
    }
    stamp_commit();
    code_order();
    packed_relocations();
}

/// Packs the binary's relative relocations (`-z pack-relative-relocs`, the `DT_RELR` format):
/// the table the loader walks to relocate pointers in a position-independent executable shrinks
/// from 24 bytes a pointer to a bitmap, 0.6 MB less binary (issue 29). The loader must know the
/// format: glibc has since 2.36 (Debian 12), and the binary then names `GLIBC_ABI_DT_RELR`, so
/// an older glibc refuses to start it rather than running it half-relocated. So only where the
/// binary is built for the machine building it and that machine's glibc has it;
/// `VOODU_PACK_RELOCS=0` turns it off (a binary for an older glibc).
fn packed_relocations() {
    println!("cargo::rerun-if-env-changed=VOODU_PACK_RELOCS");
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    if var("VOODU_PACK_RELOCS") == "0"
        || var("CARGO_CFG_TARGET_OS") != "linux"
        || var("CARGO_CFG_TARGET_ENV") != "gnu"
        || var("HOST") != var("TARGET")
    {
        return;
    }
    let glibc = Command::new("getconf")
        .arg("GNU_LIBC_VERSION")
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_owned());
    // "glibc 2.36"
    let version = glibc
        .as_deref()
        .and_then(|text| text.strip_prefix("glibc "));
    let mut parts = version
        .unwrap_or_default()
        .split('.')
        .map(str::parse::<u32>);
    let at_least_2_36 = match (parts.next(), parts.next()) {
        (Some(Ok(major)), Some(Ok(minor))) => (major, minor) >= (2, 36),
        _ => false,
    };
    if at_least_2_36 {
        println!("cargo::rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
        // The test that the packing took (tests/it/code_order.rs) runs only then.
        println!("cargo::rustc-cfg=voodu_packed_relocs");
    }
}

/// Lays the binary's code out by use: the functions a starting, idle, deploying and
/// commit-rejecting agent runs first, together (`build/code-order.txt`, made by
/// `scripts/code-order`), so the few pages they fill
/// are what the kernel maps, not a page here and there across all of the code. Only the
/// agent's binary is linked so (tests and benches are not); only where the linker is LLD,
/// Rust's default on x86-64 Linux (`VOODU_CODE_ORDER=0` turns it off for another linker).
/// A name the binary no longer has is skipped: an older list only places less.
fn code_order() {
    let path = Path::new("build/code-order.txt");
    println!("cargo::rerun-if-changed={}", path.display());
    println!("cargo::rerun-if-env-changed=VOODU_CODE_ORDER");
    let target = |name: &str| std::env::var(name).unwrap_or_default();
    let lld_default = target("CARGO_CFG_TARGET_ARCH") == "x86_64"
        && target("CARGO_CFG_TARGET_OS") == "linux"
        && target("CARGO_CFG_TARGET_ENV") == "gnu";
    if !lld_default {
        return;
    }
    // scripts/code-order asks for the linker's map of the binary: which function is where in
    // the very build the list is for (a build with symbols kept would name them differently:
    // `strip` is part of what cargo hashes into symbol names).
    println!("cargo::rerun-if-env-changed=VOODU_LINK_MAP");
    if let Some(map) = std::env::var_os("VOODU_LINK_MAP") {
        println!(
            "cargo::rustc-link-arg-bins=-Wl,-Map={}",
            Path::new(&map).display()
        );
        println!("cargo::rustc-link-arg-bins=-Wl,--no-demangle");
    }
    let off = std::env::var_os("VOODU_CODE_ORDER").is_some_and(|value| value == "0");
    if off || !path.is_file() {
        return;
    }
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
    println!(
        "cargo::rustc-link-arg-bins=-Wl,--symbol-ordering-file={}",
        path.display()
    );
    println!("cargo::rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
    // The test that the order took (tests/it/code_order.rs) runs only then.
    println!("cargo::rustc-cfg=voodu_code_order");
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
