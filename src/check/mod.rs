//! `verify` and `repair`: the file is input, so every record is checked, every index is
//! checked against the event journal, and damage is reported by table and key, never by a
//! panic. Both read the file in place, never copy it, and hold bounded memory.

mod copy;
mod dump;
mod repair;
mod salvage;
mod source;
mod verify;

pub(crate) use copy::backup_snapshot;
pub use copy::{BackupReport, backup};
pub use dump::{DUMP_VERSION, DumpReport, ImportReport, import_dump};
pub use repair::{EngineAccess, LostOperation, RepairOptions, RepairReport, repair};
#[cfg(feature = "internals")]
pub(crate) use salvage::scan_frames;
pub use salvage::{IntactRecords, intact_records};
pub use verify::{
    Finding, INTEGRITY_SCRATCH_BYTES, Integrity, LogCheck, MAX_FINDINGS, VerifyReport, verify,
    verify_inspected,
};
