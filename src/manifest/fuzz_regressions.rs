//! What the manifest fuzz target (`fuzz/`) checks, run without the fuzzer: every seed file
//! under `fuzz/seeds/` goes through the same invariant checker, and every input the fuzzer
//! found breaking a property is kept here with the exact behaviour it now has.

use super::invariants::check_input;
use super::*;

/// The seeds of the fuzz corpus, read from the repo (`fuzz/seeds/`).
fn seeds() -> Vec<(String, Vec<u8>)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
    let mut seeds: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .expect("fuzz/seeds is readable")
        .map(|entry| {
            let path = entry.expect("a directory entry").path();
            let bytes = std::fs::read(&path).expect("a seed is readable");
            (path.display().to_string(), bytes)
        })
        .collect();
    seeds.sort();
    seeds
}

#[test]
fn fuzz_seeds_keep_every_invariant() {
    let seeds = seeds();
    assert!(
        seeds.len() >= 10,
        "expected the seed files, got {}",
        seeds.len()
    );
    let mut n_accepted = 0;
    for (path, bytes) in &seeds {
        match check_input(bytes) {
            Ok(n) => n_accepted += n,
            Err(violation) => panic!("{path}: {violation}"),
        }
    }
    // The properties of an accepted manifest are checked only when some seeds load.
    assert!(
        n_accepted >= seeds.len(),
        "only {n_accepted} of {} loads accepted a seed",
        seeds.len() * 4
    );
}

/// Loads `text` as `m/app.hcl` with no vars and no repo files, in apply mode.
fn load_text(text: &str) -> Result<Manifest, Diagnostics> {
    load(
        &super::tests::snapshot(&[("m/app.hcl", text)]),
        &LoadOptions::standalone(),
    )
}

/// One finding (each entry says whether the fuzzer made it): the input, and every diagnostic
/// it must now give (empty: it loads).
struct Finding {
    input: &'static str,
    expected: &'static [&'static str],
}

const FINDINGS: &[Finding] = &[
    // Found by the fuzzer. Pre-pass errors were located in the marked text, where every
    // earlier mark is two bytes longer: after three `${}` the error below pointed at 1:13
    // of a 10-character line.
    Finding {
        input: "\"${}${}${}\n\"${",
        expected: &[
            "m/app.hcl:2:2: unterminated `${`: close it with `}` (write `$${` for a literal `${`)",
        ],
    },
    // Negating i64::MIN overflowed (a panic with debug assertions, as fuzz builds have).
    // Found by reading the decoder during the fuzzing work, not by the fuzzer itself.
    Finding {
        input: "deployment \"s\" \"n\" {\n  image    = \"x\"\n  replicas = -\"-9223372036854775808\"\n}\n",
        expected: &[
            "m/app.hcl:3:14: `replicas` is out of range: -(-9223372036854775808) does not fit in 64 bits",
        ],
    },
    // Found by the fuzzer (a timeout): a 633-byte input took 32 s, as hcl-edit 0.10 re-parses
    // an operand that fails after a partial operator chain once more per nesting level. This
    // is its shape, cut down: operators now stop the file before the HCL parser.
    Finding {
        input: "d \"s\" {\nm = 1 % {\nm % 1 % {\nm % 1 % {\n",
        expected: &[
            "m/app.hcl:2:7: operator `%` is not supported: manifest values are literals (strings, numbers, bools, lists and maps)",
            "m/app.hcl:3:3: operator `%` is not supported: manifest values are literals (strings, numbers, bools, lists and maps)",
            "m/app.hcl:3:7: operator `%` is not supported: manifest values are literals (strings, numbers, bools, lists and maps)",
            "m/app.hcl:4:3: operator `%` is not supported: manifest values are literals (strings, numbers, bools, lists and maps)",
            "m/app.hcl:4:7: operator `%` is not supported: manifest values are literals (strings, numbers, bools, lists and maps)",
        ],
    },
    // Found by the fuzzer. hcl-edit located this error inside the 3-byte `—`, and the byte
    // offset past the line start became the column: 1:7 on a 5-character line.
    Finding {
        input: "n=[#\u{2014}",
        expected: &["m/app.hcl:1:5: HCL syntax error: expected `]`"],
    },
];

#[test]
fn fuzz_findings_behave_exactly_as_fixed() {
    for finding in FINDINGS {
        if let Err(violation) = check_input(finding.input.as_bytes()) {
            panic!("{:?}: {violation}", finding.input);
        }
        let got: Vec<String> = match load_text(finding.input) {
            Ok(_) => Vec::new(),
            Err(diagnostics) => diagnostics.0.iter().map(ToString::to_string).collect(),
        };
        assert_eq!(got, finding.expected, "input {:?}", finding.input);
    }
}
