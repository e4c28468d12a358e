//! The logic of opjournal's fuzz targets, kept out of `fuzz_targets/` so that the stable
//! property tests (`tests/fuzz_properties.rs` at the repository root) run exactly the same
//! checks: they include these files by path.
//!
//! Each module has a `check` that takes the fuzzer's bytes and panics when a claim does
//! not hold.

pub mod alloc_meter;
pub mod decode_record;
pub mod intent_json;
pub mod open_file;
pub mod ops_vs_model;
pub mod panics;

/// The reference model of the journal's semantics, shared with the reliability tests.
#[path = "../../tests/support/model.rs"]
pub mod model;

/// The fault-injecting disk, shared with the crash tests.
#[path = "../../tests/support/fault_backend.rs"]
pub mod fault_backend;

/// Journals on the fault-injecting disk and the image check, shared with the crash tests.
#[path = "../../tests/support/images.rs"]
pub mod images;
pub mod seeds;
