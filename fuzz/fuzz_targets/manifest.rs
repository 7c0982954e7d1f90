//! Fuzz target for the manifest stage (parse + interpolate + decode + validate): feeds the
//! input to `manifest::load` as one file and as two files, in apply and validate mode, and
//! panics when a property of `manifest::invariants` breaks (see fuzz/README.md).

#![no_main]

use libfuzzer_sys::fuzz_target;
use voodu_agent::manifest::invariants::check_input;

fuzz_target!(|data: &[u8]| {
    if let Err(violation) = check_input(data) {
        panic!("manifest invariant broken: {violation}");
    }
});
