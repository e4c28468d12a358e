//! Inputs the fuzzers found that broke a claim, checked in under `fuzz/regressions/`, each
//! with the claim it broke. (`tests/fuzz_properties.rs` also replays every one of them
//! through its whole target.)

use std::path::{Path, PathBuf};

#[path = "support/fault_backend.rs"]
mod fault_backend;

use opjournal::{ErrorKind, Inspector, Intent, Journal, canonical_json};
use opjournal::{RepairOptions, repair};

fn regression(target: &str, name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/regressions")
        .join(target)
        .join(name)
}

/// A copy of a checked-in damaged journal in a fresh directory.
fn damaged_copy(name: &str) -> (tempfile::TempDir, PathBuf, Vec<u8>) {
    let bytes = std::fs::read(regression("open_file", name))
        .unwrap_or_else(|e| panic!("regression input {name}: {e}"));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let path = dir.path().join("journal.opj");
    std::fs::write(&path, &bytes).unwrap_or_else(|e| panic!("write: {e}"));
    (dir, path, bytes)
}

/// A copy of a checked-in damaged journal and its log (an input of the `open_file`
/// target that holds both: its magic, the journal's length, the journal, the log) in a
/// fresh directory, with the bytes of both.
fn damaged_pair_copy(name: &str) -> (tempfile::TempDir, PathBuf, (Vec<u8>, Vec<u8>)) {
    let input = std::fs::read(regression("open_file", name))
        .unwrap_or_else(|e| panic!("regression input {name}: {e}"));
    assert_eq!(
        &input[..8],
        b"opj+log\x00",
        "{name} holds a journal and its log"
    );
    let len = u32::from_le_bytes([input[8], input[9], input[10], input[11]]) as usize;
    let (db, log) = input[12..].split_at(len);
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let path = dir.path().join("journal.opj");
    std::fs::write(&path, db).unwrap_or_else(|e| panic!("write: {e}"));
    std::fs::write(opjournal::FileLog::path_for(&path), log).unwrap_or_else(|e| panic!("{e}"));
    (dir, path, (db.to_vec(), log.to_vec()))
}

fn files_of(path: &Path) -> (Vec<u8>, Vec<u8>) {
    let read = |p: &Path| std::fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
    (read(path), read(&opjournal::FileLog::path_for(path)))
}

fn is_corrupt(kind: &ErrorKind) -> bool {
    matches!(kind, ErrorKind::Corrupt { .. })
}

/// redb 4.6 hits `unreachable!()` reading the allocator state of this file (a damaged
/// branch page); `Inspector::open` used to let that panic through, so `opjournal stats`
/// crashed on the file instead of reporting it.
#[test]
fn inspector_open_answers_corrupt_when_the_storage_engine_panics_on_a_damaged_page() {
    let (_dir, path, bytes) = damaged_copy("inspector-open-redb-panic-b462786d");
    let err = Inspector::open(&path).expect_err("a damaged journal does not open");
    assert!(is_corrupt(err.kind()), "{err:?}");
    assert_eq!(
        std::fs::read(&path).ok(),
        Some(bytes),
        "the read-only open modified the file"
    );
}

/// The same kind of damage on the writer's path: `Journal::open` used to panic inside
/// redb's `create`, taking the embedding editor down with it.
#[test]
fn journal_open_answers_corrupt_when_the_storage_engine_panics_on_a_damaged_page() {
    let (_dir, path, _) = damaged_copy("journal-open-redb-panic-d1499e69");
    let err = Journal::open(&path).expect_err("a damaged journal does not open");
    assert!(is_corrupt(err.kind()), "{err:?}");
}

/// After the typed error, `repair` still gets the operator out: it salvages what it can,
/// or says that nothing could be salvaged, and never panics.
#[test]
fn repair_handles_files_that_make_the_storage_engine_panic() {
    for name in [
        "inspector-open-redb-panic-b462786d",
        "journal-open-redb-panic-d1499e69",
    ] {
        let (_dir, path, _) = damaged_copy(name);
        let mut options = RepairOptions::default();
        options.backup = false;
        match repair(&path, &options, &mut |_, _| {}) {
            Ok(report) => {
                let insp = Inspector::open(&path).unwrap_or_else(|e| {
                    panic!("{name}: the repaired journal does not open: {e:?}")
                });
                let verified = opjournal::verify_inspected(&insp, &mut |_, _| {})
                    .unwrap_or_else(|e| panic!("{name}: verify fails after repair: {e:?}"));
                assert!(
                    verified.findings.is_empty(),
                    "{name}: verify finds problems after repair {report:?}: {:?}",
                    verified.findings
                );
            }
            Err(e) => assert!(is_corrupt(e.kind()), "{name}: {e:?}"),
        }
    }
}

/// In debug builds redb debug-asserts ("Malformed allocator state") while `repair` rebuilds
/// this file. `repair` caught that panic, but the panic had poisoned the engine's locks, so
/// closing the database before salvaging panicked again, outside the guard, and took the
/// caller down (found by the stable `open_file` property test).
#[test]
fn repair_survives_closing_a_database_whose_engine_panicked() {
    let (_dir, path, _) = damaged_copy("repair-close-after-caught-panic-f58322c7");
    let mut options = RepairOptions::default();
    options.backup = false;
    let outcome = std::panic::catch_unwind(|| repair(&path, &options, &mut |_, _| {}));
    match outcome {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => assert!(is_corrupt(e.kind()), "{e:?}"),
        Err(_) => panic!("repair panicked instead of answering"),
    }
}

/// serde_json's default float parser is not exact: the canonical text of
/// `5.056589415705536e-308` parsed back to a neighbouring float, so an intent rebuilt from
/// its own canonical text (an editor that stores the arguments and re-reads them, a client
/// that canonicalizes before sending) hashed differently and a retry was refused as
/// `IntentMismatch` (found by the `intent_json` fuzz target). The crate now enables
/// serde_json's `float_roundtrip`.
#[test]
fn an_intent_rebuilt_from_its_canonical_text_has_the_same_hash() {
    for text in [
        "[5.056589415705536e-308]",
        "[1.6328046125637032e-227]",
        "{\"x\":2.262644012078593e-309}",
        "[0.1,1e300,-2.5e-10,5e-324,1.7976931348623157e308]",
    ] {
        let value: serde_json::Value = serde_json::from_str(text).expect("valid JSON");
        let canonical = canonical_json(&value);
        let reparsed: serde_json::Value =
            serde_json::from_slice(&canonical).expect("canonical text is JSON");
        assert_eq!(
            canonical_json(&reparsed),
            canonical,
            "{text}: the canonical text parses to another value"
        );
        let a = Intent::from_json("scene.edit", &value).expect("valid name");
        let b = Intent::from_json("scene.edit", &reparsed).expect("valid name");
        assert_eq!(
            a.hash(),
            b.hash(),
            "{text}: the hash moved through canonical text"
        );
    }
}

/// These files open, but redb indexes past the end of a damaged key (`range end index 113
/// out of range for slice of length 13`) when `history` walks the `op_events` table. The
/// journal's calls used to let that panic through to the embedder; they now answer
/// `Corrupt` and poison the handle (found by the `open_file` fuzz target).
#[test]
fn journal_calls_answer_corrupt_when_the_storage_engine_panics_on_a_damaged_key() {
    for name in [
        "journal-read-redb-panic-14e40e14",
        "journal-read-redb-panic-988b5722",
    ] {
        let (_dir, path, _) = damaged_copy(name);
        let journal = match Journal::open(&path) {
            Ok(j) => j,
            Err(e) => {
                // Debug builds of redb may refuse the file earlier, at open.
                assert!(is_corrupt(e.kind()), "{name}: {e:?}");
                continue;
            }
        };
        let mut corrupt = 0;
        for id in [
            "op_0",
            "op_1",
            "op_2",
            "op_3",
            "op_4",
            "op_5",
            "op_running",
            "op_lease",
        ] {
            let answers = [
                journal.lookup(id).err(),
                journal.result(id).err(),
                journal.history(id).err(),
            ];
            for e in answers.into_iter().flatten() {
                assert!(is_corrupt(e.kind()), "{name} `{id}`: {e:?}");
                corrupt += 1;
            }
        }
        assert!(corrupt > 0, "{name}: the damage went unnoticed");
    }
}

/// This file holds an event recorded before the event ahead of it (a valid frame from
/// another history). `verify` reported it, but `repair` kept it, so a repaired journal
/// still failed `verify`. Repair now keeps the longest run of events in time order and
/// quarantines the rest (found by the `open_file` fuzz target).
#[test]
fn repair_quarantines_an_event_recorded_out_of_time_order_so_verify_is_clean() {
    let (_dir, path, _) = damaged_copy("repair-keeps-out-of-order-event-e3a70ed9");
    let mut options = RepairOptions::default();
    options.backup = false;
    let report = repair(&path, &options, &mut |_, _| {}).expect("the journal is repairable");
    assert!(
        report
            .quarantined
            .iter()
            .any(|f| f.table == "events" && f.problem.contains("out of time order")),
        "the out-of-order event was not quarantined: {report:?}"
    );
    let insp = Inspector::open(&path).expect("the repaired journal opens");
    let verified = opjournal::verify_inspected(&insp, &mut |_, _| {}).expect("verify runs");
    assert!(
        verified.findings.is_empty(),
        "verify finds problems after repair: {:?}",
        verified.findings
    );
}

/// Two faults of this file (found by the `open_file` fuzz target). Its allocator state is
/// damaged: in release builds `repair` rebuilt the journal and committed, then closing the
/// database (which commits the allocator state) indexed past redb's bitmap and panicked
/// outside the guard; the close now runs under the guard (the fuzzer replays this input in
/// release builds). And the stored type of its `events` table is damaged (`u28`): redb's
/// `TableTypeMismatch` was an opaque `Storage` error, so `repair` gave up instead of
/// salvaging; it is now `Corrupt`, and repair salvages the records.
#[test]
fn repair_survives_a_storage_engine_panic_while_closing_the_repaired_file() {
    let (_dir, path, _) = damaged_copy("repair-close-damaged-allocator-687d8ead");
    let mut options = RepairOptions::default();
    options.backup = false;
    let outcome = std::panic::catch_unwind(|| repair(&path, &options, &mut |_, _| {}));
    match outcome {
        Ok(Ok(report)) => {
            let insp = Inspector::open(&path)
                .unwrap_or_else(|e| panic!("the repaired journal does not open: {e:?}"));
            let verified = opjournal::verify_inspected(&insp, &mut |_, _| {}).expect("verify runs");
            assert!(
                verified.findings.is_empty(),
                "verify finds problems after repair {report:?}: {:?}",
                verified.findings
            );
        }
        Ok(Err(e)) => assert!(is_corrupt(e.kind()), "{e:?}"),
        Err(_) => panic!("repair panicked instead of answering"),
    }
}

/// Found by the stable `open_file` property test on every seed journal, once the log
/// became the commit point: `repair` rebuilt the `meta` table from the `format` and `state`
/// records only, so it quarantined the `checkpoint` record as unknown and left a journal
/// that `Journal::open` refused ("the checkpoint entry is missing"). Repair now keeps the
/// log's cycle in the file: a repaired journal opens for writing, and verifies clean.
#[test]
fn a_repaired_journal_opens_for_writing_and_verifies_clean() -> opjournal::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("journal.opj");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/open_file/session.opj"),
        &path,
    )?;
    let mut options = RepairOptions::default();
    options.backup = false;
    let report = repair(&path, &options, &mut |_, _| {})?;
    assert!(
        !report.quarantined.iter().any(|f| f.table == "meta"),
        "repair quarantined a meta record of an intact journal: {report:?}"
    );
    let journal = Journal::open(&path)?;
    assert!(
        journal.lookup("op_0")?.is_some(),
        "the repaired journal answers"
    );
    drop(journal);
    let verified = opjournal::verify(&path)?;
    assert!(verified.is_clean(), "{verified:?}");
    Ok(())
}

/// The same fault, for a journal whose process died: what was committed since the last
/// checkpoint is only in the log beside the file. Repair used to rebuild from the redb file
/// alone; it now writes the log's records in first, so no acknowledged call is lost, and
/// starts the log's next cycle, so they are not replayed over the repaired file.
#[test]
fn repair_keeps_the_calls_only_the_log_holds() -> opjournal::Result<()> {
    use opjournal::{Admission, Operation, Outcome};
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("journal.opj");
    let log = opjournal::FileLog::path_for(&path);
    let crashed = dir.path().join("crashed.opj");
    {
        let journal = Journal::open(&path)?;
        let intent = Intent::from_json("scene.edit", &serde_json::json!({}))?;
        let Admission::Fresh(claim) = journal.submit(Operation::new("op-logged", intent))? else {
            panic!("expected fresh work")
        };
        journal.complete(&claim, Outcome::applied(1, b"in the log only".to_vec()))?;
        // The process dies here: the files as it leaves them.
        std::fs::copy(&path, &crashed)?;
        std::fs::copy(&log, opjournal::FileLog::path_for(&crashed))?;
    }
    let mut options = RepairOptions::default();
    options.backup = false;
    let report = repair(&crashed, &options, &mut |_, _| {})?;
    assert!(report.log_records >= 2, "{report:?}");
    assert!(
        report.quarantined.iter().all(|f| f.table != "log"),
        "the log was whole: {report:?}"
    );
    let insp = Inspector::open(&crashed)?;
    let r = insp
        .result("op-logged")?
        .expect("the logged outcome survived the repair");
    assert_eq!(r.bytes, b"in the log only");
    drop(insp);
    let journal = Journal::open(&crashed)?;
    assert_eq!(journal.event_count()?, 2, "the log was not replayed twice");
    drop(journal);
    let verified = opjournal::verify(&crashed)?;
    assert!(verified.is_clean(), "{verified:?}");
    Ok(())
}

/// Found with the test above, on a seed journal of format 1: repair decoded the `format`
/// record as this build's format only, so it quarantined the format record of every
/// format 1 journal and wrote one of its own. It now reads both (a writer upgrades the
/// file when it opens it).
#[test]
fn repair_keeps_the_format_record_of_a_format_1_journal() -> opjournal::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("journal.opj");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1.opj"),
        &path,
    )?;
    let mut options = RepairOptions::default();
    options.backup = false;
    let report = repair(&path, &options, &mut |_, _| {})?;
    assert!(report.quarantined.is_empty(), "{report:?}");
    drop(Journal::open(&path)?);
    let verified = opjournal::verify(&path)?;
    assert!(verified.is_clean(), "{verified:?}");
    Ok(())
}

/// Found by the stable `open_file` property test once closing a journal checkpoints: on
/// this damaged file (a mutated seed) the journal opens and answers, but dropping it runs
/// the close's checkpoint, where redb indexes past a damaged page
/// (`range end index 5048342 out of range for slice of length 4096`): the panic escaped
/// `Drop for Journal`, taking the editor down. The close now runs under the storage guard.
#[test]
fn dropping_a_journal_on_a_damaged_file_never_panics() {
    let (_dir, path, _) = damaged_copy("journal-drop-checkpoint-redb-panic-2ce44f88");
    let outcome = std::panic::catch_unwind(|| {
        let Ok(journal) = Journal::open(&path) else {
            return;
        };
        if let Ok(intent) = Intent::from_json("fuzz.probe", &serde_json::json!({})) {
            let op = opjournal::Operation::new("fuzz_probe", intent).scope("fuzz/probe");
            if let Ok(opjournal::Admission::Fresh(claim)) = journal.submit(op) {
                let _ = journal.complete(&claim, opjournal::Outcome::failed("probe"));
            }
        }
        let _ = journal.compact();
        drop(journal);
    });
    assert!(outcome.is_ok(), "dropping the journal panicked");
}

/// The file-path open answers `Corrupt` when redb panics on a damaged page (above); the
/// open on custom storage (`JournalBuilder::open_backends`, which embedders use for
/// in-memory or fault-injecting storage and the fuzz targets for speed) did not run under
/// the storage guard, so the same damaged bytes panicked through it.
#[test]
fn open_on_custom_storage_answers_corrupt_when_the_storage_engine_panics() {
    let bytes = std::fs::read(regression("open_file", "journal-open-redb-panic-d1499e69"))
        .unwrap_or_else(|e| panic!("regression input: {e}"));
    let disk = fault_backend::FaultDisk::from_image(fault_backend::DiskImage {
        db: bytes.into(),
        log: Vec::new().into(),
    });
    let outcome = std::panic::catch_unwind(|| {
        Journal::builder().open_backends(disk.backend(), disk.log(), "damaged")
    });
    match outcome {
        Ok(Err(e)) => assert!(is_corrupt(e.kind()), "{e:?}"),
        Ok(Ok(_)) => {} // Debug and release builds of redb differ in what they refuse.
        Err(_) => panic!("opening damaged custom storage panicked"),
    }
}

/// Found by the `open_file` fuzz target (a journal with its log, mutated, after about
/// 14,000 executions): the file needs recovery, so the inspector recovers it in memory,
/// and the database writes its allocator state (to memory) when it closes; on this damaged file redb
/// asserts there (`bit < self.len` in its allocator bitmap), and the panic escaped the
/// inspector's drop, so `opjournal stats` would crash on its way out. The inspector now
/// closes its database under the storage guard.
///
/// `repair` of the same file used to abort the process (below, in
/// `repair_and_inspection_of_a_file_with_damaged_page_lists_never_abort`).
#[test]
fn dropping_an_inspector_of_a_damaged_file_never_panics() {
    let (_dir, path, _) = damaged_pair_copy("repair-abort-redb-freed-pages-8e9ace63");
    let outcome = std::panic::catch_unwind(|| {
        // The input predates format 2's variable-length integers: its records no longer
        // decode, which is a typed error; the claim is that nothing panics on the way.
        let insp = match Inspector::open(&path) {
            Ok(insp) => insp,
            Err(e) => {
                assert!(
                    matches!(e.kind(), ErrorKind::Corrupt { .. }),
                    "a damaged journal answers Corrupt: {e:?}"
                );
                return;
            }
        };
        assert_eq!(insp.access(), opjournal::Access::Recovered);
        let _ = insp.stats();
        let _ = insp.for_each_receipt(|_| Ok(true));
        let _ = opjournal::verify_inspected(&insp, &mut |_, _| {});
        drop(insp);
    });
    assert!(outcome.is_ok(), "dropping an inspector panicked");
}

/// Found by `open_file` in a one-hour run: a journal whose storage engine's own bookkeeping
/// (its system tree: the lists of pages the next commit frees, the recorded allocator
/// state) is damaged opened for writing; its first commit, the checkpoint when it closed,
/// made redb free a listed page past the end of its region, and the assertion unwound
/// through a redb destructor that panicked again, which aborts the process: no guard can
/// catch that, so an editor would die on the file at every start. The writer's open now
/// checks the system tree (checksums and page numbers) before anything commits, answers
/// `Corrupt` and leaves both files as they were; `repair` then rebuilds the journal.
#[test]
fn a_writer_refuses_a_file_whose_storage_bookkeeping_is_damaged_and_leaves_it_unchanged() {
    let (_dir, path, before) = damaged_pair_copy("writer-abort-damaged-freed-list-6d7b0c78");
    let err = Journal::open(&path).expect_err("a journal with a damaged system tree opened");
    match err.kind() {
        ErrorKind::Corrupt { table, key, .. } => {
            assert_eq!(
                (table.as_str(), key.as_str()),
                ("(redb)", "system tree"),
                "{err}"
            );
        }
        other => panic!("expected Corrupt, got {other:?}: {err}"),
    }
    assert!(err.to_string().contains("fails its checksum"), "{err}");
    assert!(
        files_of(&path) == before,
        "the refused open changed the files"
    );

    let mut options = RepairOptions::default();
    options.backup = false;
    repair(&path, &options, &mut |_, _| {}).unwrap_or_else(|e| panic!("repair failed: {e:?}"));
    let journal = Journal::open(&path).unwrap_or_else(|e| panic!("repaired journal: {e:?}"));
    let intent =
        Intent::from_json("probe", &serde_json::json!({})).unwrap_or_else(|e| panic!("{e}"));
    let admission = journal
        .submit(opjournal::Operation::new("after_repair", intent).scope("probe"))
        .unwrap_or_else(|e| panic!("submit after repair: {e:?}"));
    assert!(
        matches!(admission, opjournal::Admission::Fresh(_)),
        "a new id after repair is fresh work: {admission:?}"
    );
    journal.close().unwrap_or_else(|e| panic!("close: {e:?}"));
    let insp = Inspector::open(&path).unwrap_or_else(|e| panic!("inspect: {e:?}"));
    let verified = opjournal::verify_inspected(&insp, &mut |_, _| {})
        .unwrap_or_else(|e| panic!("verify: {e:?}"));
    assert!(verified.findings.is_empty(), "{:?}", verified.findings);
}

/// The other file of that kind (a journal left open by a crash, its page lists damaged):
/// inspecting and repairing it recover it in memory, and closing that in-memory database
/// used to run the storage engine's closing commit on the damaged lists and abort the same
/// way (the repair of it aborted every time). Databases that only serve reads of an input
/// now close without that commit; the files are untouched by inspection, and the repair
/// succeeds.
#[test]
fn repair_and_inspection_of_a_file_with_damaged_page_lists_never_abort() {
    for name in [
        "repair-abort-redb-freed-pages-8e9ace63",
        "writer-abort-damaged-freed-list-6d7b0c78",
    ] {
        let (_dir, path, before) = damaged_pair_copy(name);
        if let Ok(insp) = Inspector::open(&path) {
            let _ = insp.stats();
            let _ = opjournal::verify_inspected(&insp, &mut |_, _| {});
        }
        assert!(
            files_of(&path) == before,
            "{name}: inspection changed the files"
        );
        let mut options = RepairOptions::default();
        options.backup = false;
        options.dry_run = true;
        repair(&path, &options, &mut |_, _| {})
            .unwrap_or_else(|e| panic!("{name}: dry run failed: {e:?}"));
        assert!(
            files_of(&path) == before,
            "{name}: the dry run changed the files"
        );
        options.dry_run = false;
        repair(&path, &options, &mut |_, _| {})
            .unwrap_or_else(|e| panic!("{name}: repair failed: {e:?}"));
        let journal = Journal::open(&path).unwrap_or_else(|e| panic!("{name}: reopen: {e:?}"));
        journal
            .close()
            .unwrap_or_else(|e| panic!("{name}: close: {e:?}"));
    }
}
