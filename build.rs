//! Build script: tells the tests whether voodu's example corpus (`../shared/corpus`, beside
//! the checkout for developers and CI) is there, so the corpus tests are reported as ignored,
//! never as passed, when it is not; and whether `busybox` is on PATH (the macro script tests
//! run the scripts under its shell too).

use std::path::Path;

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
    let corpus = Path::new("../shared/corpus/voodu-examples");
    if corpus.is_dir() {
        println!("cargo::rerun-if-changed=../shared/corpus/voodu-examples");
    } else {
        println!("cargo::rustc-cfg=voodu_corpus_missing");
    }
}
