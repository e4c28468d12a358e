//! Arbitrary JSON values through canonical hashing.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    opjournal_fuzz::intent_json::check(data);
});
