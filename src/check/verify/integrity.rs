//! redb's own page check, run on a scratch in memory over the file (the file is never
//! written or copied): what `verify` reports as [`Integrity`].

use crate::error::{Error, ErrorKind};
use crate::inspect::Inspector;
use crate::preflight::guarded;
use crate::preflight::reading::Locks;

use super::{INTEGRITY_SCRATCH_BYTES, Integrity, corrupt_detail};

/// Runs redb's page checksum check on a scratch over the file (its writes kept
/// in memory, the file untouched and never copied).
pub(super) fn integrity_in_place(insp: &Inspector) -> Integrity {
    page_check(insp.path(), insp.extent().journal_len())
}

/// redb's page check of the file at `path` (its first `len` bytes), on a scratch in memory.
/// The caller already holds the file (an inspector, or repair's source), excluding
/// writers.
pub(crate) fn page_check(path: &std::path::Path, len: u64) -> Integrity {
    let r = guarded("integrity", || {
        // This process already holds the file through the inspector, which excludes writers:
        // the scratch takes no locks of its own.
        let mut db = crate::inspect::open_scratch(path, len, INTEGRITY_SCRATCH_BYTES, Locks::Skip)
            .map_err(|e| scratch_error(e.into()))?;
        let ok = db.check_integrity().map_err(|e| scratch_error(e.into()));
        crate::preflight::close_unwritten(db);
        ok
    });
    match r {
        Ok(true) => Integrity::Passed,
        Ok(false) => Integrity::Failed(
            "page checksums failed; the storage engine can roll back to the last intact commit \
             (run `opjournal repair`)"
                .into(),
        ),
        Err(e) if is_scratch_limit(&e) => Integrity::Skipped(format!(
            "checking the page checksums in place needs more than {} MiB of memory (every \
             record's CRC is still checked)",
            INTEGRITY_SCRATCH_BYTES >> 20
        )),
        Err(e) if matches!(e.kind(), ErrorKind::Io) => {
            Integrity::Skipped(format!("{e} (every record's CRC is still checked)"))
        }
        Err(e) => Integrity::Failed(corrupt_detail(&e)),
    }
}

fn scratch_error(e: redb::Error) -> Error {
    match e {
        redb::Error::Io(io) if io.kind() == std::io::ErrorKind::OutOfMemory => Error::io_while(
            "check the page checksums in memory",
            "nothing was changed",
            io,
        ),
        other => Error::from(other),
    }
}

fn is_scratch_limit(e: &Error) -> bool {
    matches!(e.kind(), ErrorKind::Io)
        && std::error::Error::source(e)
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .is_some_and(|io| io.kind() == std::io::ErrorKind::OutOfMemory)
}
