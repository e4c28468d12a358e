//! Inputs the fuzzers found that broke a claim, checked in under `fuzz/regressions/`, each
//! with the claim it broke. (`tests/fuzz_properties.rs` also replays every one of them
//! through its whole target.)

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use opjournal_testkit::fault_backend;

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
fn damaged_pair_copy(name: &str) -> (tempfile::TempDir, PathBuf, Files) {
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
    (dir, path, (db.to_vec(), log.to_vec(), Vec::new()))
}

/// The bytes of a journal file, its log, and its second log file (empty when absent).
type Files = (Vec<u8>, Vec<u8>, Vec<u8>);

fn files_of(path: &Path) -> Files {
    let read = |p: &Path| std::fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
    let spare = opjournal::FileLog::spare_path_for(path);
    (
        read(path),
        read(&opjournal::FileLog::path_for(path)),
        if spare.exists() {
            read(&spare)
        } else {
            Vec::new()
        },
    )
}

/// A journal with 120 completed operations, checkpointed into its file (a small
/// checkpoint size), and the bytes of its file and log copied while its writer had them
/// open: what a crash leaves, a file the storage engine must recover before reading it.
fn crash_image() -> (tempfile::TempDir, Files) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let live = dir.path().join("live.opj");
    let journal = Journal::builder()
        .checkpoint_size(64 << 10)
        .open(&live)
        .unwrap_or_else(|e| panic!("open: {e}"));
    let intent =
        Intent::from_json("scene.edit", &serde_json::json!({})).unwrap_or_else(|e| panic!("{e}"));
    for i in 0..120 {
        let op = opjournal::Operation::new(format!("op_{i}"), intent.clone());
        let Ok(opjournal::Admission::Fresh(claim)) = journal.submit(op) else {
            panic!("fresh work expected")
        };
        let result = format!("result {i} ").repeat(60).into_bytes();
        journal
            .complete(&claim, opjournal::Outcome::applied(1, result))
            .unwrap_or_else(|e| panic!("complete: {e}"));
    }
    let image = files_of(&live);
    drop(journal);
    (dir, image)
}

/// Writes `db`, `log` and the second log file (if not empty) as the journal `name` in
/// `dir`, returning its path.
fn write_pair(dir: &Path, name: &str, db: &[u8], log: &[u8], spare: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, db).unwrap_or_else(|e| panic!("write: {e}"));
    std::fs::write(opjournal::FileLog::path_for(&path), log)
        .unwrap_or_else(|e| panic!("write: {e}"));
    if !spare.is_empty() {
        std::fs::write(opjournal::FileLog::spare_path_for(&path), spare)
            .unwrap_or_else(|e| panic!("write: {e}"));
    }
    path
}

fn is_corrupt(kind: &ErrorKind) -> bool {
    matches!(kind, ErrorKind::Corrupt { .. })
}

std::thread_local! {
    /// Panics raised on this thread (counted by the hook [`panics_during`] installs).
    static PANICS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Runs `f` and returns its value with the number of panics raised on this thread while
/// it ran, caught or not: a storage-engine panic that the library's guard turns into
/// `Corrupt` is counted. The regressions below use it to assert that their input still
/// makes the engine panic, i.e. that the guarded path is reached, instead of passing
/// because the file is now refused before the engine gets to it. (The hook counts the
/// panicking thread only, so tests running in parallel do not count each other's panics;
/// the default hook still prints each panic.)
fn panics_during<R>(f: impl FnOnce() -> R) -> (R, u64) {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.with(|n| n.set(n.get() + 1));
            previous(info);
        }));
    });
    let before = PANICS.with(std::cell::Cell::get);
    let r = f();
    (r, PANICS.with(std::cell::Cell::get) - before)
}

/// Asserts that `err` is the guard's answer to a storage-engine panic during `what`.
fn assert_engine_panic(err: &opjournal::Error, what: &str) {
    match err.kind() {
        ErrorKind::Corrupt { table, key, .. } => assert_eq!(
            (table.as_str(), key.as_str()),
            ("(redb)", what),
            "not the guard's answer to an engine panic: {err}"
        ),
        other => panic!("expected Corrupt from the panic guard, got {other:?}: {err}"),
    }
}

/// redb 4.6 hits `unreachable!()` reading the allocator state of this file (a damaged
/// branch page); `Inspector::open` used to let that panic through, so `opjournal stats`
/// crashed on the file instead of reporting it.
#[test]
fn inspector_open_answers_corrupt_when_the_storage_engine_panics_on_a_damaged_page() {
    let (_dir, path, bytes) = damaged_copy("inspector-open-redb-panic-b462786d");
    let (opened, panics) = panics_during(|| Inspector::open(&path));
    let err = opened.expect_err("a damaged journal does not open");
    assert_engine_panic(&err, "open");
    assert!(
        panics > 0,
        "the storage engine no longer panics on this input"
    );
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
    let (opened, panics) = panics_during(|| Journal::open(&path));
    let err = opened.expect_err("a damaged journal does not open");
    assert_engine_panic(&err, "open");
    assert!(
        panics > 0,
        "the storage engine no longer panics on this input"
    );
}

/// After the typed error, `repair` still gets the operator out: it salvages what it can,
/// or says that nothing could be salvaged, and never panics. The storage engine panics
/// inside the repair on both files (asserted: the guarded path is reached).
#[test]
fn repair_handles_files_that_make_the_storage_engine_panic() {
    for name in [
        "inspector-open-redb-panic-b462786d",
        "journal-open-redb-panic-d1499e69",
    ] {
        let (_dir, path, _) = damaged_copy(name);
        let mut options = RepairOptions::default();
        options.backup = false;
        let (repaired, panics) = panics_during(|| repair(&path, &options, &mut |_, _| {}));
        assert!(
            panics > 0,
            "{name}: the storage engine no longer panics while repairing this input"
        );
        match repaired {
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
///
/// Since `repair` reads a damaged file in place (issue 13), this input no longer makes the
/// engine panic inside it: the repair reads it in place, and the only damage is a page
/// that fails redb's page check (which `verify` reports too), gone from the rebuilt file.
/// The test asserts that outcome exactly (it used to accept any `Corrupt` too), so a
/// change in what the input reaches is noticed; the panic-then-close path itself is no
/// longer reached by any checked-in input (issue 23).
#[test]
fn repair_survives_closing_a_database_whose_engine_panicked() {
    let (_dir, path, _) = damaged_copy("repair-close-after-caught-panic-f58322c7");
    let report = assert_repairs_in_place(&path);
    assert!(report.page_checksums_failed, "{report:?}");
    assert!(
        report.quarantined.is_empty() && report.lost.is_empty() && report.unreadable.is_empty(),
        "{report:?}"
    );
}

/// Repairs `path` (no backup), asserting that nothing panics, that the storage engine read
/// it in place, and that the result verifies clean.
fn assert_repairs_in_place(path: &Path) -> opjournal::RepairReport {
    let mut options = RepairOptions::default();
    options.backup = false;
    let outcome = std::panic::catch_unwind(|| repair(path, &options, &mut |_, _| {}));
    let report = match outcome {
        Ok(Ok(report)) => report,
        Ok(Err(e)) => panic!("repair failed: {e:?}"),
        Err(_) => panic!("repair panicked instead of answering"),
    };
    assert_eq!(
        report.engine,
        opjournal::EngineAccess::InPlace,
        "{report:?}"
    );
    let insp = Inspector::open(path)
        .unwrap_or_else(|e| panic!("the repaired journal does not open: {e:?}"));
    let verified = opjournal::verify_inspected(&insp, &mut |_, _| {})
        .unwrap_or_else(|e| panic!("verify: {e:?}"));
    assert!(
        verified.findings.is_empty(),
        "verify finds problems after repair {report:?}: {:?}",
        verified.findings
    );
    report
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

/// These files made redb index past the end of a damaged key (`range end index 113 out
/// of range for slice of length 13`) when `history` walks the `op_events` table. The
/// journal's calls used to let that panic through to the embedder; they now answer
/// `Corrupt` and poison the handle (found by the `open_file` fuzz target).
///
/// Each input's path is asserted, not skipped: `988b5722` opens for writing and its
/// `history` calls make the engine panic (the claim's path); `14e40e14` is now refused
/// earlier, by an engine panic inside `Journal::open` (a damaged page type), so its
/// damaged key is reached through the read-only `Inspector`, whose calls must answer
/// `Corrupt` the same way.
#[test]
fn journal_calls_answer_corrupt_when_the_storage_engine_panics_on_a_damaged_key() {
    const IDS: [&str; 8] = [
        "op_0",
        "op_1",
        "op_2",
        "op_3",
        "op_4",
        "op_5",
        "op_running",
        "op_lease",
    ];
    // The writer's path.
    let name = "journal-read-redb-panic-988b5722";
    let (_dir, path, _) = damaged_copy(name);
    let journal = Journal::open(&path)
        .unwrap_or_else(|e| panic!("{name} no longer opens, so its damaged key is not read: {e}"));
    let mut corrupt = 0;
    let ((), panics) = panics_during(|| {
        for id in IDS {
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
    });
    assert!(corrupt > 0, "{name}: the damage went unnoticed");
    assert!(
        panics > 0,
        "{name}: no engine panic was reached, so the guard was not exercised"
    );
    assert!(
        journal.is_poisoned(),
        "{name}: the handle refuses writes now"
    );

    // The other input: refused at open (the engine panics there), and its damaged key
    // read through the inspector.
    let name = "journal-read-redb-panic-14e40e14";
    let (_dir, path, _) = damaged_copy(name);
    let (opened, panics) = panics_during(|| Journal::open(&path));
    let err = opened.expect_err("the writer's open reads the damaged page");
    assert_engine_panic(&err, "open");
    assert!(panics > 0, "{name}: the open no longer meets the damage");
    let insp = match Inspector::open(&path) {
        Ok(insp) => insp,
        // Built without debug assertions (`cargo test --release`), redb meets this damage
        // while the inspector opens the file, which answers `Corrupt` there instead.
        Err(e) if !cfg!(debug_assertions) => {
            assert!(is_corrupt(e.kind()), "{name}: inspect: {e:?}");
            return;
        }
        Err(e) => panic!("{name}: inspect: {e}"),
    };
    let mut corrupt = 0;
    let ((), panics) = panics_during(|| {
        for id in IDS {
            if let Err(e) = insp.history(id) {
                assert!(is_corrupt(e.kind()), "{name} `{id}`: {e:?}");
                corrupt += 1;
            }
        }
    });
    assert!(corrupt > 0, "{name}: the damaged key went unnoticed");
    assert!(panics > 0, "{name}: no engine panic was reached");
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
/// going on; it is now `Corrupt`, and repair completes.
///
/// The file never held an event (its state record says `next_seq = 1`; its raw bytes hold
/// two intact meta frames and nothing else), so there is nothing to salvage and nothing to
/// lose. Since `repair` reads a damaged file in place, it reads this one in place (no
/// engine panic in this test profile, so the close-after-panic path is no longer reached
/// by this input) and the repaired journal verifies clean.
#[test]
fn repair_survives_a_storage_engine_panic_while_closing_the_repaired_file() {
    let (_dir, path, _) = damaged_copy("repair-close-damaged-allocator-687d8ead");
    let intact = opjournal::intact_records(&path).expect("the raw bytes are scanned");
    assert_eq!(intact.events, 0, "{intact:?}");
    let report = assert_repairs_in_place(&path);
    assert!(!report.salvaged, "{report:?}");
    assert!(report.lost.is_empty(), "{report:?}");
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
/// a damaged file (a mutated seed) the journal opened and answered, but dropping it ran
/// the close's checkpoint, where redb indexed past a damaged page (`range end index
/// 5048342 out of range for slice of length 4096`): the panic escaped `Drop for Journal`,
/// taking the editor down. The close now runs under the storage guard.
///
/// The checked-in input (`journal-drop-checkpoint-redb-panic-2ce44f88`) no longer reaches
/// the close: its `format` record predates format 3 and `Journal::open` refuses it as
/// `Corrupt` (asserted below, so a change is noticed). The close's path is rebuilt instead:
/// a storage backend that panics once, on the first write after it is armed, stands for
/// the engine panicking on damaged data in the close's checkpoint; the test asserts that
/// the panic happened there (the path is reached), that `close` answers the guard's
/// `Corrupt`, and that dropping the last handle does not panic.
#[test]
fn dropping_a_journal_on_a_damaged_file_never_panics() {
    let (_dir, path, _) = damaged_copy("journal-drop-checkpoint-redb-panic-2ce44f88");
    let err = Journal::open(&path).expect_err("the old input is refused at open");
    assert!(is_corrupt(err.kind()), "{err:?}");

    for how in ["close", "drop"] {
        let backend = PanicOnWrite::default();
        let (armed, fired) = (backend.armed.clone(), backend.fired.clone());
        let journal = Journal::builder()
            .open_backends(backend, opjournal::MemoryLog::new(), "panicking")
            .unwrap_or_else(|e| panic!("open: {e}"));
        let intent = Intent::from_json("scene.edit", &serde_json::json!({}))
            .unwrap_or_else(|e| panic!("{e}"));
        for i in 0..3 {
            let op = opjournal::Operation::new(format!("op_{i}"), intent.clone());
            let Ok(opjournal::Admission::Fresh(claim)) = journal.submit(op) else {
                panic!("fresh work expected")
            };
            journal
                .complete(&claim, opjournal::Outcome::applied(1, b"r".to_vec()))
                .unwrap_or_else(|e| panic!("complete: {e}"));
        }
        assert_eq!(
            fired.load(Ordering::SeqCst),
            0,
            "nothing was checkpointed yet: commits only append to the log"
        );
        armed.store(true, Ordering::SeqCst);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match how {
            "close" => Some(journal.close()),
            _ => {
                drop(journal);
                None
            }
        }));
        let closed = outcome.unwrap_or_else(|_| panic!("{how}: the engine's panic escaped"));
        assert_eq!(
            fired.load(Ordering::SeqCst),
            1,
            "{how}: the close's checkpoint did not reach the storage engine"
        );
        if let Some(closed) = closed {
            let err = closed.expect_err("close reports the engine's failure");
            assert_engine_panic(&err, "close");
        }
    }
}

/// An in-memory redb backend that panics on the first write after `armed` is set (once),
/// counting it in `fired`: a storage engine stopping on damaged data mid-commit.
#[derive(Debug, Default)]
struct PanicOnWrite {
    inner: opjournal::redb::backends::InMemoryBackend,
    armed: Arc<AtomicBool>,
    fired: Arc<AtomicU64>,
}

impl opjournal::redb::StorageBackend for PanicOnWrite {
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        self.inner.read(offset, out)
    }

    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.inner.set_len(len)
    }

    fn sync_data(&self) -> std::io::Result<()> {
        self.inner.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        if self.armed.swap(false, Ordering::SeqCst) {
            self.fired.fetch_add(1, Ordering::SeqCst);
            panic!("injected: the storage engine stops on damaged data");
        }
        self.inner.write(offset, data)
    }
}

/// The file-path open answers `Corrupt` when redb panics on a damaged page (above); the
/// open on custom storage (`JournalBuilder::open_backends`, which embedders use for
/// in-memory or fault-injecting storage and the fuzz targets for speed) did not run under
/// the storage guard, so the same damaged bytes panicked through it.
///
/// Those bytes no longer reach the engine on custom storage: the system-tree check that
/// now runs first refuses them (asserted, so a change is noticed). The guarded open is
/// reached instead with a backend that panics on the engine's first write (creating the
/// journal writes), asserted to have fired inside the open.
#[test]
fn open_on_custom_storage_answers_corrupt_when_the_storage_engine_panics() {
    let bytes = std::fs::read(regression("open_file", "journal-open-redb-panic-d1499e69"))
        .unwrap_or_else(|e| panic!("regression input: {e}"));
    let disk = fault_backend::FaultDisk::from_image(fault_backend::DiskImage {
        db: bytes.into(),
        log: Vec::new().into(),
        log2: Vec::new().into(),
    });
    let outcome = std::panic::catch_unwind(|| {
        Journal::builder().open_backends(disk.backend(), disk.log(), "damaged")
    });
    match outcome {
        Ok(Err(e)) => match e.kind() {
            ErrorKind::Corrupt { table, key, .. } => assert_eq!(
                (table.as_str(), key.as_str()),
                ("(redb)", "system tree"),
                "{e}"
            ),
            other => panic!("expected Corrupt, got {other:?}"),
        },
        Ok(Ok(_)) => panic!("the damaged storage opened"),
        Err(_) => panic!("opening damaged custom storage panicked"),
    }

    let backend = PanicOnWrite::default();
    backend.armed.store(true, Ordering::SeqCst);
    let fired = backend.fired.clone();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Journal::builder().open_backends(backend, opjournal::MemoryLog::new(), "panicking")
    }));
    let opened = outcome.unwrap_or_else(|_| panic!("the engine's panic escaped the open"));
    assert_eq!(
        fired.load(Ordering::SeqCst),
        1,
        "the open did not reach the engine's write"
    );
    let err = opened.expect_err("an open whose engine panicked answers an error");
    assert_engine_panic(&err, "open");
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
///
/// The checked-in input no longer reaches the inspector's close: the storage engine now
/// refuses it at open (asserted, so a change is noticed). So the path is rebuilt: a
/// journal copied while its writer had it open (a crash image, which the inspector must
/// recover in memory), damaged by one byte in each page in turn; every copy that opens
/// as `Recovered` and whose reads notice the damage is read and dropped, none may panic,
/// and at least one such copy must be found (the path is reached).
#[test]
fn dropping_an_inspector_of_a_damaged_file_never_panics() {
    let (_dir, path, before) = damaged_pair_copy("repair-abort-redb-freed-pages-8e9ace63");
    let err = Inspector::open(&path).expect_err("the old input is refused at open");
    assert!(is_corrupt(err.kind()), "{err:?}");
    assert!(
        files_of(&path) == before,
        "the refused open changed the files"
    );

    let (dir, image) = crash_image();
    const PAGE: usize = 4096;
    let pages = image.0.len() / PAGE;
    assert!(pages > 8, "the journal file has {pages} pages");
    let (mut reached, mut refused) = (0, 0);
    for page in 1..pages {
        let mut db = image.0.clone();
        db[page * PAGE + 200] ^= 0xff;
        let path = write_pair(
            dir.path(),
            &format!("damaged-{page}.opj"),
            &db,
            &image.1,
            &image.2,
        );
        let outcome = std::panic::catch_unwind(|| {
            let insp = match Inspector::open(&path) {
                Ok(insp) => insp,
                Err(e) => {
                    assert!(is_corrupt(e.kind()), "page {page}: {e:?}");
                    return false;
                }
            };
            assert_eq!(insp.access(), opjournal::Access::Recovered, "page {page}");
            let mut noticed = insp.stats().is_err();
            noticed |= insp.for_each_receipt(|_| Ok(true)).is_err();
            noticed |= opjournal::verify_inspected(&insp, &mut |_, _| {})
                .map_or(true, |v| !v.findings.is_empty());
            drop(insp);
            noticed
        });
        match outcome {
            Ok(true) => reached += 1,
            Ok(false) => refused += 1,
            Err(_) => panic!("page {page}: inspecting or dropping the inspector panicked"),
        }
        assert!(
            files_of(&path) == (db, image.1.clone(), image.2.clone()),
            "page {page}: inspection changed the files"
        );
    }
    assert!(
        reached > 0,
        "no damaged copy was recovered and read ({refused} of {} refused at open)",
        pages - 1
    );
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
///
/// What each input reaches now is asserted: the storage engine refuses both files at
/// open, so inspection answers `Corrupt` and `repair` salvages them from their raw bytes
/// (`EngineAccess::Refused`): neither reaches an in-memory recovery any more. That path
/// is rebuilt with a crash image (a file whose writer had it open), which `repair` must
/// recover in memory (`EngineAccess::RecoveredInMemory`, asserted) and close without
/// the engine's closing commit, in a dry run and for real.
#[test]
fn repair_and_inspection_of_a_file_with_damaged_page_lists_never_abort() {
    use opjournal::EngineAccess;
    for name in [
        "repair-abort-redb-freed-pages-8e9ace63",
        "writer-abort-damaged-freed-list-6d7b0c78",
    ] {
        let (_dir, path, before) = damaged_pair_copy(name);
        let err = Inspector::open(&path).expect_err("the storage engine refuses the file");
        match err.kind() {
            ErrorKind::Corrupt { table, key, .. } => assert_eq!(
                (table.as_str(), key.as_str()),
                ("(redb)", "(file)"),
                "{name}: {err}"
            ),
            other => panic!("{name}: expected Corrupt, got {other:?}"),
        }
        assert!(
            files_of(&path) == before,
            "{name}: inspection changed the files"
        );
        let mut options = RepairOptions::default();
        options.backup = false;
        options.dry_run = true;
        let report = repair(&path, &options, &mut |_, _| {})
            .unwrap_or_else(|e| panic!("{name}: dry run failed: {e:?}"));
        assert_eq!(report.engine, EngineAccess::Refused, "{name}: {report:?}");
        assert!(report.salvaged, "{name}: {report:?}");
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

    // The in-memory recovery, rebuilt.
    let (dir, (db, log, spare)) = crash_image();
    let path = write_pair(dir.path(), "crashed.opj", &db, &log, &spare);
    let insp = Inspector::open(&path).unwrap_or_else(|e| panic!("inspect the crash image: {e}"));
    assert_eq!(insp.access(), opjournal::Access::Recovered);
    let receipts = insp
        .stats()
        .unwrap_or_else(|e| panic!("stats: {e}"))
        .operations;
    assert_eq!(receipts, 120, "the crash image holds every operation");
    drop(insp);
    assert!(
        files_of(&path) == (db.clone(), log.clone(), spare.clone()),
        "inspection changed the crash image"
    );
    let mut options = RepairOptions::default();
    options.backup = false;
    for dry_run in [true, false] {
        options.dry_run = dry_run;
        let report = repair(&path, &options, &mut |_, _| {})
            .unwrap_or_else(|e| panic!("repair (dry run: {dry_run}): {e:?}"));
        assert_eq!(
            report.engine,
            EngineAccess::RecoveredInMemory,
            "the crash image is recovered in memory (dry run: {dry_run}): {report:?}"
        );
        assert!(!report.found_damage(), "{report:?}");
        if dry_run {
            assert!(
                files_of(&path) == (db.clone(), log.clone(), spare.clone()),
                "the dry run changed the crash image"
            );
        }
    }
    let journal = Journal::open(&path).unwrap_or_else(|e| panic!("reopen: {e:?}"));
    assert_eq!(journal.stats().map(|s| s.applied).ok(), Some(120));
    journal.close().unwrap_or_else(|e| panic!("close: {e:?}"));
}
