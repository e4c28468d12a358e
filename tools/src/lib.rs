//! Shared support for opjournal's benchmarks and crash/fault harnesses.
