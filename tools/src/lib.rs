//! Shared support for opjournal's benchmarks and crash/fault harnesses.

pub mod plot;
pub mod sqlite_model;
pub mod stats;
