//! Arbitrary and mutated journal files through open, every read-only CLI path, and repair.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(
    init: {
        // redb's panics on damaged pages are caught by the library (answered `Corrupt`);
        // every other panic aborts, as libFuzzer's own hook would.
        opjournal_fuzz::panics::install(true);
    },
    |data: &[u8]| {
        opjournal_fuzz::open_file::check(data);
    }
);
