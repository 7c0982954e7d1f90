//! Build script: tells the tests whether voodu's example corpus (`../shared/corpus`, beside
//! the checkout for developers and CI) is there, so the corpus tests are reported as ignored,
//! never as passed, when it is not.

use std::path::Path;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(voodu_corpus_missing)");
    println!("cargo::rerun-if-changed=build.rs");
    let corpus = Path::new("../shared/corpus/voodu-examples");
    if corpus.is_dir() {
        println!("cargo::rerun-if-changed=../shared/corpus/voodu-examples");
    } else {
        println!("cargo::rustc-cfg=voodu_corpus_missing");
    }
}
