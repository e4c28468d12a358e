//! The logic of opjournal's fuzz targets lives in the `opjournal-testkit` crate (the
//! repository's `testkit/`), so that the stable property tests (`tests/fuzz_properties.rs`)
//! run exactly the same checks; the targets in `fuzz_targets/` call it through this crate.
//!
//! Each module has a `check` that takes the fuzzer's bytes and panics when a claim does
//! not hold.

pub use opjournal_testkit::*;
