//! The binary's code order (`build.rs`, `build/code-order.txt`, made by `scripts/code-order`):
//! the functions the list names are laid out in its order, so a linker that ignored the list
//! (another linker, a renamed flag) is seen here rather than as a larger RSS in a bench.

use std::collections::HashSet;
use std::path::Path;
use std::process::Command;

#[test]
#[cfg_attr(
    not(voodu_code_order),
    ignore = "the binary is linked without build/code-order.txt (not x86-64 Linux with GNU libc, or VOODU_CODE_ORDER=0)"
)]
fn the_binary_lays_out_the_listed_functions_in_the_list_s_order() {
    let list =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("build/code-order.txt"))
            .expect("build/code-order.txt is readable");
    let output = Command::new("nm")
        .arg(env!("CARGO_BIN_EXE_voodu-agent"))
        .output()
        .expect("nm (binutils, beside the C compiler Rust links with) runs");
    assert!(
        output.status.success(),
        "nm failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let listed: HashSet<&str> = list.lines().filter(|line| !line.starts_with('#')).collect();
    let text = String::from_utf8_lossy(&output.stdout);
    let functions: Vec<(u64, &str)> = text
        .lines()
        .filter_map(|line| {
            let mut parts = line.split_whitespace();
            let (address, kind, name) = (parts.next()?, parts.next()?, parts.next()?);
            matches!(kind, "t" | "T")
                .then(|| Some((u64::from_str_radix(address, 16).ok()?, name)))
                .flatten()
        })
        .collect();
    let last_listed = functions
        .iter()
        .filter(|(_, name)| listed.contains(name))
        .map(|(address, _)| *address)
        .max();
    let n_listed = functions
        .iter()
        .filter(|(_, name)| listed.contains(name))
        .count();
    // A list from an older build names fewer of this build's functions, never few: the
    // runtime's, std's and the dependencies' do not change with the crate's code.
    assert!(
        n_listed >= 500,
        "only {n_listed} listed functions are in the binary"
    );
    // The listed functions come first: an unlisted one among them is one that shares a
    // section with a listed one (C code, the start-up files). In a debug build, 33 of 190,502
    // unlisted functions sit among the listed ones; linked without the list, 190,504 of 190,506.
    let unlisted: Vec<&str> = functions
        .iter()
        .filter(|(_, name)| !listed.contains(name))
        .map(|(_, name)| *name)
        .collect();
    let among: Vec<&str> = functions
        .iter()
        .filter(|(address, name)| !listed.contains(name) && Some(*address) < last_listed)
        .map(|(_, name)| *name)
        .collect();
    assert!(
        among.len() * 100 < unlisted.len(),
        "{} of {} unlisted functions are laid out among the {n_listed} listed ones, e.g. {:?}",
        among.len(),
        unlisted.len(),
        &among[..among.len().min(5)]
    );
}

/// `build.rs` packs the binary's relative relocations (`DT_RELR`) exactly where glibc can load
/// them (2.36 and newer, a native build): there the dynamic section says so, and what is left in
/// the classic table is the few relocations that are not relative (an unpacked build has tens
/// of thousands); elsewhere the binary has no `DT_RELR` entry, so an older glibc still runs it.
#[test]
fn the_binary_packs_its_relative_relocations_where_glibc_loads_them() {
    let output = Command::new("readelf")
        .args(["--dynamic", "--wide", env!("CARGO_BIN_EXE_voodu-agent")])
        .output()
        .expect("readelf (binutils, beside the C compiler Rust links with) runs");
    assert!(
        output.status.success(),
        "readelf failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8_lossy(&output.stdout);
    let entry = |tag: &str| {
        text.lines()
            .find(|line| line.contains(&format!("({tag})")))
            .and_then(|line| line.split_whitespace().nth(2))
            .map(str::to_owned)
    };
    if !cfg!(voodu_packed_relocs) {
        assert!(
            entry("RELR").is_none(),
            "packed where glibc cannot load it:\n{text}"
        );
        return;
    }
    assert!(entry("RELR").is_some(), "no DT_RELR entry:\n{text}");
    let relative_left = entry("RELACOUNT")
        .and_then(|count| count.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(
        relative_left < 100,
        "{relative_left} relative relocations are still in the RELA table"
    );
}
