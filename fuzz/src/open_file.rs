//! `open_file`: arbitrary and mutated journal files through every read-only path the CLI
//! uses (`stats`, `ls`, `show`, `log`, `export`, `verify`), through the writer's open,
//! and through `repair`.
//!
//! Claims checked, besides "never panics" (the fuzzer) and "never hangs" (its timeout):
//! - no panic outside the storage engine happens, even one that is caught (redb's own
//!   panics on damaged pages are caught by the library and answered `Corrupt`; see
//!   [`crate::panics`]);
//! - every call answers `Ok` or a typed error of a kind that file damage can cause;
//! - the read-only paths and a dry-run repair leave the file's bytes unchanged;
//! - after a repair that succeeded, the journal opens, `verify` is clean, a writer can
//!   open it and submit, and `verify` is still clean after that writer closes.

use std::path::Path;

use opjournal::{Admission, ErrorKind, Inspector, Intent, Journal, ManualClock, Operation};
use opjournal::{RepairOptions, repair};

/// Receipts and events visited per file, so one input cannot take long.
const MAX_ITEMS: usize = 256;

/// Whether `kind` is an error that a damaged or foreign file may cause. Refusals
/// (`InvalidInput`, `StaleClaim`, ...) and `Locked` (no other handle exists here) are not.
pub fn damage_error(kind: &ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::Corrupt { .. }
            | ErrorKind::NotAJournal { .. }
            | ErrorKind::UnsupportedFormat { .. }
            | ErrorKind::Io
            | ErrorKind::Storage
            | ErrorKind::Poisoned
    )
}

fn expect_typed<T>(what: &str, r: opjournal::Result<T>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            assert!(
                damage_error(e.kind()),
                "{what}: an error a damaged file cannot explain: {e:?}"
            );
            None
        }
    }
}

/// Every read-only path of the CLI, on `path`. Returns whether the file opened.
pub fn inspect_everything(path: &Path) -> bool {
    let Some(insp) = expect_typed("Inspector::open", Inspector::open(path)) else {
        return false;
    };
    let _ = expect_typed("stats", insp.stats());
    let _ = expect_typed("now", insp.now());
    let _ = expect_typed("sizes", insp.sizes());
    let mut ids = Vec::new();
    let _ = expect_typed(
        "for_each_receipt",
        insp.for_each_receipt(|r| {
            ids.push(r.operation_id);
            Ok(ids.len() < MAX_ITEMS)
        }),
    );
    let mut events = 0usize;
    let _ = expect_typed(
        "for_each_event",
        insp.for_each_event(0, |ev| {
            if let Some(op) = ev.operation_id
                && ids.len() < 2 * MAX_ITEMS
            {
                ids.push(op);
            }
            events += 1;
            Ok(events < MAX_ITEMS)
        }),
    );
    ids.sort();
    ids.dedup();
    for id in ids.iter().take(MAX_ITEMS) {
        let _ = expect_typed("lookup", insp.lookup(id));
        let _ = expect_typed("result", insp.result(id));
        let _ = expect_typed("history", insp.history(id));
    }
    let _ = expect_typed("verify", opjournal::verify_inspected(&insp, &mut |_, _| {}));
    true
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_default()
}

/// Checks the claims of this module on a file holding `bytes`.
///
/// # Panics
///
/// When a claim does not hold (that is the finding).
pub fn check(bytes: &[u8]) {
    crate::panics::dump_on_panic("open_file", bytes, || {
        crate::panics::escaped("open_file", || check_file(bytes));
    });
}

fn check_file(bytes: &[u8]) {
    let Ok(dir) = tempfile::tempdir() else {
        return;
    };
    let path = dir.path().join("journal.opj");
    if std::fs::write(&path, bytes).is_err() {
        return;
    }

    // Read-only paths: bytes unchanged.
    inspect_everything(&path);
    assert!(read(&path) == bytes, "a read-only path modified the file");
    let mut dry = RepairOptions::default();
    dry.dry_run = true;
    let _ = expect_typed("repair (dry run)", repair(&path, &dry, &mut |_, _| {}));
    assert!(read(&path) == bytes, "a dry-run repair modified the file");

    // The writer's open on a copy of the damaged file.
    let writer_copy = dir.path().join("writer.opj");
    if std::fs::write(&writer_copy, bytes).is_ok() {
        let clock = ManualClock::new(crate::seeds::T0);
        if let Some(j) = expect_typed(
            "Journal::open",
            Journal::builder().clock(clock).open(&writer_copy),
        ) {
            exercise_writer(&j);
        }
    }

    // Repair in place; when it succeeds the journal is whole again.
    let mut options = RepairOptions::default();
    options.backup = false;
    if expect_typed("repair", repair(&path, &options, &mut |_, _| {})).is_some() {
        let insp = Inspector::open(&path)
            .unwrap_or_else(|e| panic!("a repaired journal does not open: {e:?}"));
        let report = opjournal::verify_inspected(&insp, &mut |_, _| {})
            .unwrap_or_else(|e| panic!("verify fails on a repaired journal: {e:?}"));
        assert!(
            report.findings.is_empty(),
            "verify finds problems in a repaired journal: {:?}",
            report.findings
        );
        drop(insp);
        let clock = ManualClock::new(crate::seeds::T0);
        let j = Journal::builder()
            .clock(clock)
            .open(&path)
            .unwrap_or_else(|e| panic!("a repaired journal does not open for writing: {e:?}"));
        exercise_writer(&j);
        drop(j);
        let insp = Inspector::open(&path)
            .unwrap_or_else(|e| panic!("a repaired, reopened journal does not open: {e:?}"));
        let report = opjournal::verify_inspected(&insp, &mut |_, _| {})
            .unwrap_or_else(|e| panic!("verify fails on a repaired, reopened journal: {e:?}"));
        assert!(
            report.findings.is_empty(),
            "verify finds problems after a writer used a repaired journal: {:?}",
            report.findings
        );
    }
}

/// A writer's reads and one write on a possibly damaged journal: typed answers only.
fn exercise_writer(j: &Journal) {
    let _ = expect_typed("stats", j.stats());
    let _ = expect_typed("in_doubt", j.in_doubt());
    let _ = expect_typed("due_redeliveries", j.due_redeliveries(16));
    let _ = expect_typed("undelivered", j.undelivered("tab-1"));
    for id in ["op_0", "op_1", "op_2", "op_running", "op_lease", "aged_1"] {
        let _ = expect_typed("lookup", j.lookup(id));
        let _ = expect_typed("result", j.result(id));
        let _ = expect_typed("history", j.history(id));
    }
    let Ok(intent) = Intent::from_json("fuzz.probe", &serde_json::json!({})) else {
        return;
    };
    let op = Operation::new("fuzz_probe", intent).scope("fuzz/probe");
    match j.submit(op) {
        Ok(Admission::Fresh(claim)) => {
            let _ = j.complete(&claim, opjournal::Outcome::failed("probe"));
        }
        Ok(_) => {}
        Err(e) => assert!(
            damage_error(e.kind()) || e.is_refusal(),
            "submit: an error a damaged file cannot explain: {e:?}"
        ),
    }
    let _ = expect_typed("compact", j.compact());
}
