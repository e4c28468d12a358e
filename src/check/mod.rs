//! `verify` and `repair`: the file is input, so every record is checked, every index is
//! compared with what replaying the event journal gives, and damage is reported by table
//! and key, never by a panic.

mod repair;
mod salvage;
mod verify;

pub use repair::{LostOperation, RepairOptions, RepairReport, repair};
#[cfg(feature = "internals")]
pub(crate) use salvage::scan_frames;
pub use verify::{Finding, Integrity, VerifyReport, verify, verify_inspected};
