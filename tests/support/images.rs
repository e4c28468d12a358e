//! Journals on the fault-injecting disk, and the check every disk image must pass: shared
//! by the crash tests and the `ops_vs_model` fuzz target (which includes it by path, beside
//! `model.rs` and `fault_backend.rs`).
#![allow(dead_code)]

use opjournal::{Inspector, Journal, ManualClock};

use super::fault_backend::FaultDisk;
use super::model::ModelConfig;

/// Opens (or creates) the journal on `disk` with the model's configuration.
pub fn open(
    cfg: &ModelConfig,
    clock: &ManualClock,
    disk: &FaultDisk,
) -> opjournal::Result<Journal> {
    cfg.builder(clock).open_backends(
        disk.backend(),
        opjournal::MemoryLog::new(),
        "fault-disk.opj",
    )
}

/// Invariant 4 on a disk image: redb's page check, every record's CRC and decode, every
/// index equal to the replay of the event journal.
pub fn verify_image(image: &[u8]) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let path = dir.path().join("image.opj");
    std::fs::write(&path, image).map_err(|e| e.to_string())?;
    let insp = Inspector::open(&path).map_err(|e| format!("the inspector cannot open it: {e}"))?;
    let report = opjournal::verify_inspected(&insp, &mut |_, _| {})
        .map_err(|e| format!("verify failed: {e}"))?;
    if !report.is_clean() {
        return Err(format!(
            "verify found problems: integrity {:?}, findings {:#?}",
            report.integrity, report.findings
        ));
    }
    Ok(())
}
