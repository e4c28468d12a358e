//! What opjournal's tests, fuzz targets and tools share, in one crate instead of files
//! included by path:
//!
//! - [`model`]: the reference model of the journal's semantics, which every answer is
//!   compared with;
//! - [`fault_backend`]: the in-memory disk that injects I/O errors and power cuts (a
//!   `live` image of every write and a `durable` image of what a completed sync kept);
//! - [`images`]: journals on that disk, and the check of an image after a crash;
//! - [`driver`]: the seeded crash workload and its random numbers;
//! - the fuzz targets' checks ([`decode_record`], [`intent_json`], [`open_file`],
//!   [`ops_vs_model`]), with the seeds they start from ([`seeds`]), the allocation meter
//!   ([`alloc_meter`]) and the panic policy ([`panics`]): `fuzz/` runs them under
//!   libFuzzer and `tests/fuzz_properties.rs` under proptest, so both check the same
//!   claims;
//! - [`pg`]: private PostgreSQL servers for the `postgres` backend's tests (stopped with
//!   `-m immediate` and started again), and a TCP proxy that cuts connections like a
//!   network partition.
#![allow(clippy::unwrap_used)]

pub mod alloc_meter;
pub mod decode_record;
pub mod driver;
pub mod fault_backend;
pub mod images;
pub mod intent_json;
pub mod model;
pub mod open_file;
pub mod ops_vs_model;
pub mod panics;
#[cfg(unix)]
pub mod pg;
pub mod seeds;
