//! An arbitrary sequence of API calls, clock jumps, compactions, reopens, crashes and
//! injected I/O errors against the reference model. One input in four (bits 1 and 2 of its
//! first byte) runs on a journal in memory instead of the fault-injecting disk, where the
//! reopens, crashes and faults compare every observable state with the model.
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
