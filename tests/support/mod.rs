//! Test support shared by the crash, fault and concurrency tests.
//!
//! `model.rs` and `fault_backend.rs` are self-contained so that fuzz targets and the tools
//! crate can include them by path.
#![allow(dead_code)]

pub mod driver;
pub mod fault_backend;
pub mod model;
