//! An arbitrary sequence of API calls, clock jumps, compactions, reopens, crashes and
//! injected I/O errors against the reference model.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(
    init: {
        opjournal_fuzz::panics::install(true);
    },
    |data: &[u8]| {
        opjournal_fuzz::ops_vs_model::check(data);
    }
);
