//! Journals on the fault-injecting disk, and the check every disk image must pass: shared
//! by the crash tests and the `ops_vs_model` fuzz target (which includes it by path, beside
//! `model.rs` and `fault_backend.rs`).
#![allow(dead_code)]

use std::path::Path;

use opjournal::{FileLog, Inspector, Journal, ManualClock};

use crate::fault_backend::{DiskImage, FaultDisk};
use crate::model::ModelConfig;

/// Opens (or creates) the journal on `disk` with the model's configuration: the redb file
/// is `disk.backend()`, the log `disk.log()` (and with `cfg.two_logs` its second file
/// `disk.log2()`, as a journal file has), with redb in the concurrency mode of
/// `cfg.sharing`, as on a file (with `LiveReaders`, a checkpoint's commit marks its new
/// primary unflushed until its flush, and clears the mark in a write of its own that the
/// next sync makes durable). Checkpoints run in the foreground (`background_checkpoints(false)`:
/// with two log files the call that switches files waits for the commit and the zeroing of
/// the file the ended cycle used; with one, every checkpoint commits in the call that
/// reaches it): their writes happen at a point the calls determine, so a trigger armed for
/// the n-th write or sync fires at the same step in every run.
pub fn open(
    cfg: &ModelConfig,
    clock: &ManualClock,
    disk: &FaultDisk,
) -> opjournal::Result<Journal> {
    let builder = cfg.builder(clock).background_checkpoints(false);
    if cfg.two_logs {
        builder.open_backends_with_spare_log(
            disk.backend(),
            disk.log(),
            disk.log2(),
            "fault-disk.opj",
        )
    } else {
        builder.open_backends(disk.backend(), disk.log(), "fault-disk.opj")
    }
}

/// Writes `image` as a journal file at `path` and its log files beside it (none where the
/// image's is empty).
pub fn write_image(image: &DiskImage, path: &Path) -> std::io::Result<()> {
    std::fs::write(path, image.db.to_vec())?;
    for (log, at) in [
        (&image.log, FileLog::path_for(path)),
        (&image.log2, FileLog::spare_path_for(path)),
    ] {
        if log.is_empty() {
            match std::fs::remove_file(&at) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        } else {
            std::fs::write(at, log.to_vec())?;
        }
    }
    Ok(())
}

/// A temporary directory in memory (`/dev/shm`) where there is one, else in the system's
/// temporary directory: the images written there are read once and thrown away.
pub fn scratch_dir() -> std::io::Result<tempfile::TempDir> {
    let shm = Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(dir) = tempfile::Builder::new()
            .prefix("opj-image-")
            .tempdir_in(shm)
    {
        return Ok(dir);
    }
    tempfile::tempdir()
}

/// Reads the journal file at `path` and its log files (empty when absent).
pub fn read_image(path: &Path) -> std::io::Result<DiskImage> {
    let db = std::fs::read(path)?;
    let read_log = |at: &Path| match std::fs::read(at) {
        Ok(b) => Ok(b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    };
    Ok(DiskImage {
        db: db.into(),
        log: read_log(&FileLog::path_for(path))?.into(),
        log2: read_log(&FileLog::spare_path_for(path))?.into(),
    })
}

/// Invariant 4 on a disk image, as a reader process sees it: the files written out, then
/// `Inspector::open` and `verify` (redb's page check, every record's CRC and decode, the
/// log's records of the current cycle laid over redb, every index equal to the replay of
/// the event journal). The reader leaves both files' bytes as they were.
pub fn verify_image(image: &DiskImage) -> Result<(), String> {
    let dir = scratch_dir().map_err(|e| e.to_string())?;
    let path = dir.path().join("image.opj");
    write_image(image, &path).map_err(|e| e.to_string())?;
    {
        let insp =
            Inspector::open(&path).map_err(|e| format!("the inspector cannot open it: {e}"))?;
        let report = opjournal::verify_inspected(&insp, &mut |_, _| {})
            .map_err(|e| format!("verify failed: {e}"))?;
        if !report.is_clean() {
            return Err(format!(
                "verify found problems: integrity {:?}, findings {:#?}",
                report.integrity, report.findings
            ));
        }
    }
    let after = read_image(&path).map_err(|e| e.to_string())?;
    if after != *image {
        return Err(format!(
            "the reader modified the files (journal {} -> {} bytes{}, log {} -> {} bytes{}, second log {} -> {} bytes{})",
            image.db.len(),
            after.db.len(),
            if after.db == image.db {
                ""
            } else {
                ", changed"
            },
            image.log.len(),
            after.log.len(),
            if after.log == image.log {
                ""
            } else {
                ", changed"
            },
            image.log2.len(),
            after.log2.len(),
            if after.log2 == image.log2 {
                ""
            } else {
                ", changed"
            },
        ));
    }
    Ok(())
}
