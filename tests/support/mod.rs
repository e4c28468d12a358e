//! Test support shared by the crash, fault and concurrency tests.
//!
//! `model.rs` and `fault_backend.rs` are self-contained so that fuzz targets and the tools
//! crate can include them by path; `images.rs` (journals on the fault disk, the image
//! check) needs those two beside it, as the `ops_vs_model` fuzz target has them.
#![allow(dead_code)]

pub mod driver;
pub mod fault_backend;
pub mod images;
pub mod model;
