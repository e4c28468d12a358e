//! The file format: golden bytes of every record kind, checked-in journals of formats 1
//! and 2 (read as they are, upgraded by the first writer, a format-2 one also with a log a
//! crash left) and format 3, format version checks, and typed `Corrupt` errors for values
//! altered on disk.

mod common;

use std::path::{Path, PathBuf};

use common::{Env, FakeEditor, add_light, fresh, run_op};
use opjournal::codec::{self, RecordKind};
use opjournal::{
    Admission, DeliveryState, ErrorKind, ExecutionStatus, InDoubtCause, Journal, Operation, Outcome,
};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn bless() -> bool {
    std::env::var_os("OPJ_BLESS").is_some()
}

#[test]
fn every_record_kind_encodes_to_its_golden_bytes() {
    let golden: String = opjournal::fuzzing::golden_records()
        .into_iter()
        .map(|(name, bytes)| format!("{name} {}\n", hex::encode(bytes)))
        .collect();
    let path = fixture("golden.txt");
    if bless() {
        std::fs::write(&path, &golden).expect("write golden bytes");
    }
    let expected = std::fs::read_to_string(&path).expect("tests/fixtures/golden.txt");
    for (want, got) in expected.lines().zip(golden.lines()) {
        assert_eq!(
            got, want,
            "format changed: bump the format version or run with OPJ_BLESS=1"
        );
    }
    assert_eq!(expected.lines().count(), golden.lines().count());
}

#[test]
fn golden_records_decode_and_reencode_identically() {
    for (name, bytes) in opjournal::fuzzing::golden_records() {
        // Exactly one decoder accepts each record, and it round-trips.
        assert_eq!(
            opjournal::fuzzing::decode_every_record(&bytes),
            Ok(1),
            "{name}"
        );
    }
}

#[test]
fn envelope_matches_the_documented_layout() {
    let framed = codec::frame(RecordKind::Scope, b"abc");
    assert_eq!(&framed[0..2], b"OJ");
    assert_eq!(framed[2], 3, "format version");
    assert_eq!(framed[3], 4, "record kind: scope");
    assert_eq!(&framed[4..8], &3u32.to_le_bytes());
    let mut h = crc32fast::Hasher::new();
    h.update(&framed[0..8]);
    h.update(b"abc");
    assert_eq!(&framed[8..12], &h.finalize().to_le_bytes());
    assert_eq!(&framed[12..], b"abc");
    assert_eq!(codec::unframe(RecordKind::Scope, &framed), Ok(&b"abc"[..]));
}

#[test]
fn envelope_rejects_every_single_byte_change() {
    let framed = codec::encode(RecordKind::Scope, &("scene", 184u64));
    for i in 0..framed.len() {
        let mut bad = framed.clone();
        bad[i] ^= 0x01;
        assert!(
            codec::unframe(RecordKind::Scope, &bad).is_err(),
            "flip at {i} accepted"
        );
    }
    for cut in 0..framed.len() {
        assert!(
            codec::unframe(RecordKind::Scope, &framed[..cut]).is_err(),
            "cut at {cut}"
        );
    }
}

/// Builds a fixture: applied+acknowledged, delivered, failed, released, and one operation
/// running when the journal was closed. `tests/fixtures/v1.opj` and `v2.opj` were built by
/// this function with the format 1 and format 2 builds and are never rewritten; `v3.opj`
/// is rebuilt by `OPJ_BLESS=1`.
fn build_fixture(path: &Path) -> opjournal::Result<()> {
    let clock = opjournal::ManualClock::new(common::T0);
    let journal = Journal::builder().clock(clock.clone()).open(path)?;
    let mut editor = FakeEditor::at(183);
    let op = |id: &str| {
        Operation::new(id, add_light(id))
            .scope("scene/main")
            .session("tab-1")
    };
    run_op(&journal, &mut editor, op("acked"), "a")?;
    journal.delivered("acked")?;
    journal.acknowledge("acked", Some("tab-1"))?;
    run_op(&journal, &mut editor, op("delivered"), "b")?;
    journal.delivered("delivered")?;
    let c = fresh(&journal, op("failed"));
    journal.complete(&c, Outcome::failed("no door").with_result(b"why".to_vec()))?;
    let r = fresh(&journal, op("released"));
    journal.release(&r)?;
    journal.advance_revision("scene/main", 200)?;
    fresh(
        &journal,
        Operation::new("running", add_light("r")).scope("scene/other"),
    );
    Ok(())
}

/// Checks the states [`build_fixture`] leaves, through `lookup`.
fn fixture_states(
    lookup: impl Fn(&str) -> opjournal::Result<Option<opjournal::Receipt>>,
) -> opjournal::Result<()> {
    let acked = lookup("acked")?.expect("acked");
    assert_eq!(acked.status, ExecutionStatus::Applied);
    assert_eq!(acked.delivery, Some(DeliveryState::Acknowledged));
    assert_eq!(acked.result_revision, Some(184));
    // Delivered once; whether its acknowledgement has expired depends on the reader's
    // clock (an inspector reads by the system clock).
    let delivered = lookup("delivered")?.expect("delivered");
    assert_eq!(delivered.status, ExecutionStatus::Applied);
    assert_eq!(delivered.delivery_count, 1);
    let failed = lookup("failed")?.expect("failed");
    assert_eq!(failed.failure.as_deref(), Some("no door"));
    assert_eq!(lookup("released")?, None);
    Ok(())
}

/// Opens a copy of `fixture` for writing and checks every state, the replay and verify.
fn fixture_opens_for_writing(fixture_path: &Path) -> opjournal::Result<Env> {
    let env = Env::new();
    std::fs::copy(fixture_path, &env.path).map_err(opjournal::Error::from)?;
    env.clock.set(common::T0);
    let journal = env.open();
    fixture_states(|id| journal.lookup(id))?;
    let running = journal.lookup("running")?.expect("running");
    assert_eq!(running.status, ExecutionStatus::InDoubt);
    assert_eq!(running.in_doubt_cause, Some(InDoubtCause::Reopened));
    assert_eq!(journal.scope_revision("scene/main")?, 200);
    let Admission::Replay(r) = journal.submit(
        Operation::new("delivered", add_light("delivered"))
            .scope("scene/main")
            .session("tab-1"),
    )?
    else {
        panic!("expected a replay from the fixture");
    };
    assert_eq!(r.result.bytes, b"b");
    drop(journal);
    let report = opjournal::verify(&env.path)?;
    assert!(report.is_clean(), "{:?}", report.findings);
    Ok(env)
}

fn format_upgrades(path: &Path) -> opjournal::Result<Vec<(u32, u32)>> {
    let mut out = Vec::new();
    opjournal::Inspector::open(path)?.for_each_event(0, |ev| {
        if let opjournal::EventKind::FormatUpgraded { from, to } = ev.kind {
            out.push((from, to));
        }
        Ok(true)
    })?;
    Ok(out)
}

#[test]
fn checked_in_v3_journal_opens_with_every_state_intact() -> opjournal::Result<()> {
    let path = fixture("v3.opj");
    if bless() {
        let _ = std::fs::remove_file(&path);
        build_fixture(&path)?;
    }
    let env = fixture_opens_for_writing(&path)?;
    assert!(format_upgrades(&env.path)?.is_empty());
    Ok(())
}

#[test]
fn the_first_writer_upgrades_a_format_2_journal_once_and_records_it() -> opjournal::Result<()> {
    let env = fixture_opens_for_writing(&fixture("v2.opj"))?;
    assert_eq!(format_upgrades(&env.path)?, vec![(2, 3)]);
    let stats = opjournal::Inspector::open(&env.path)?.stats()?;
    assert_eq!((stats.format_version, stats.upgraded_from), (3, Some(2)));
    drop(env.open());
    assert_eq!(format_upgrades(&env.path)?, vec![(2, 3)]);
    Ok(())
}

/// `v2-with-log.opj` and its log: `v2.opj` opened by the format 2 build, one operation
/// (`logged`, result `logged-result`) completed and delivered, and the process gone without
/// closing: the log holds batches the file does not.
fn v2_with_log(env: &Env) {
    std::fs::copy(fixture("v2-with-log.opj"), &env.path).expect("copy the journal");
    std::fs::copy(
        fixture("v2-with-log.opj-log"),
        opjournal::FileLog::path_for(&env.path),
    )
    .expect("copy its log");
}

#[test]
fn a_format_2_journal_a_crash_left_with_a_log_keeps_the_logged_work_through_the_upgrade()
-> opjournal::Result<()> {
    let env = Env::new();
    v2_with_log(&env);
    // Read as it is: format 2, with the log's work visible.
    {
        let insp = opjournal::Inspector::open(&env.path)?;
        assert_eq!(insp.stats()?.format_version, 2);
        let logged = insp.lookup("logged")?.expect("the logged operation");
        assert_eq!(logged.status, ExecutionStatus::Applied);
    }
    env.clock.set(common::T0);
    let journal = env.open();
    let Admission::Replay(r) = journal.submit(
        Operation::new("logged", add_light("logged"))
            .scope("scene/logged")
            .session("tab-2"),
    )?
    else {
        panic!("the logged operation replays after the upgrade");
    };
    assert_eq!(r.result.bytes, b"logged-result");
    assert_eq!(r.receipt.delivery_count, 1);
    fixture_states(|id| journal.lookup(id))?;
    // The upgrade's event comes after every logged one (no seq was taken twice).
    let history = journal.history("logged")?;
    drop(journal);
    let upgrades = format_upgrades(&env.path)?;
    assert_eq!(upgrades, vec![(2, 3)]);
    let mut upgrade_seq = None;
    opjournal::Inspector::open(&env.path)?.for_each_event(0, |ev| {
        if let opjournal::EventKind::FormatUpgraded { .. } = ev.kind {
            upgrade_seq = Some(ev.seq);
        }
        Ok(true)
    })?;
    let upgrade_seq = upgrade_seq.expect("the upgrade event");
    assert!(history.iter().all(|e| e.seq < upgrade_seq), "{history:?}");
    let report = opjournal::verify(&env.path)?;
    assert!(report.is_clean(), "{:?}", report.findings);
    Ok(())
}

#[test]
fn a_read_only_format_2_journal_with_a_log_is_refused_for_writing_and_stays_unchanged() {
    let env = Env::new();
    v2_with_log(&env);
    let log = opjournal::FileLog::path_for(&env.path);
    let log_before = std::fs::read(&log).expect("log");
    let err = refused_read_only(&env);
    assert!(err.to_string().contains("read-only"), "{err}");
    assert!(std::fs::read(&log).expect("log") == log_before);
}

#[test]
fn a_format_1_journal_is_read_as_it_is_by_read_only_commands() -> opjournal::Result<()> {
    let env = Env::new();
    std::fs::copy(fixture("v1.opj"), &env.path).map_err(opjournal::Error::from)?;
    let before = env.bytes();
    let insp = opjournal::Inspector::open(&env.path)?;
    fixture_states(|id| insp.lookup(id))?;
    // Read-only: the operation a writer was running is not recorded as found in doubt by
    // a reopen (only its lease, by the reader's clock, may have run out).
    let running = insp.lookup("running")?.expect("running");
    assert_ne!(running.in_doubt_cause, Some(InDoubtCause::Reopened));
    let stats = insp.stats()?;
    assert_eq!((stats.format_version, stats.upgraded_from), (1, None));
    let report = opjournal::verify_inspected(&insp, &mut |_, _| {})?;
    assert!(report.is_clean(), "{:?}", report.findings);
    drop(insp);
    assert!(
        env.bytes() == before,
        "a read-only command changed the file"
    );
    assert!(!opjournal::FileLog::path_for(&env.path).exists());
    Ok(())
}

#[test]
fn the_first_writer_upgrades_a_format_1_journal_once_and_records_it() -> opjournal::Result<()> {
    let env = fixture_opens_for_writing(&fixture("v1.opj"))?;
    assert_eq!(format_upgrades(&env.path)?, vec![(1, 3)]);
    let stats = opjournal::Inspector::open(&env.path)?.stats()?;
    assert_eq!(stats.format_version, 3);
    assert_eq!(stats.upgraded_from, Some(1));
    assert!(stats.upgraded_at.is_some());
    // Opening again upgrades nothing.
    drop(env.open());
    assert_eq!(format_upgrades(&env.path)?, vec![(1, 3)]);
    Ok(())
}

#[test]
fn a_read_only_format_1_journal_is_not_opened_for_writing_and_stays_unchanged() {
    let env = Env::new();
    std::fs::copy(fixture("v1.opj"), &env.path).expect("copy");
    let err = refused_read_only(&env);
    let msg = err.to_string();
    assert!(
        msg.contains("format version 1") && msg.contains("read-only"),
        "{msg}"
    );
    assert!(!opjournal::FileLog::path_for(&env.path).exists());
}

/// Makes the journal file read-only, opens it for writing, and returns the refusal: an
/// `InvalidInput` that left the file's bytes as they were.
fn refused_read_only(env: &Env) -> opjournal::Error {
    let mut perms = std::fs::metadata(&env.path).expect("meta").permissions();
    perms.set_readonly(true);
    std::fs::set_permissions(&env.path, perms).expect("chmod");
    let before = env.bytes();
    let err = env
        .builder()
        .open(&env.path)
        .expect_err("a read-only file is not opened for writing");
    assert!(
        matches!(err.kind(), ErrorKind::InvalidInput { .. }),
        "{err:?}"
    );
    assert!(env.bytes() == before, "the refused open changed the file");
    err
}

/// Writes a redb database of another program: one table, no `meta`.
fn write_foreign_redb(path: &Path) {
    let db = redb::Database::create(path).expect("redb");
    let txn = db.begin_write().expect("txn");
    txn.open_table(redb::TableDefinition::<u64, u64>::new("things"))
        .expect("table")
        .insert(1, 2)
        .expect("insert");
    txn.commit().expect("commit");
}

/// Writes a redb file whose `meta` table holds only a format record saying
/// `format_version`, framed with envelope version `envelope` (as a build of that format
/// would write it: the CRC holds).
fn write_meta_only(path: &Path, format_version: u32, envelope: u8) {
    let db = redb::Database::create(path).expect("redb file");
    let txn = db.begin_write().expect("write");
    {
        let mut meta = txn
            .open_table(redb::TableDefinition::<&str, &[u8]>::new("meta"))
            .expect("meta");
        // FormatRecord per docs/format.md, with format 2's variable-width integers: the
        // version (one byte below 251), created_at (253, then 8 bytes), created_by (its
        // length in one byte, then the bytes), then an absent upgrade (0).
        let mut payload = vec![u8::try_from(format_version).expect("small version"), 253];
        payload.extend_from_slice(&common::T0.as_millis().to_le_bytes());
        payload.push(4);
        payload.extend_from_slice(b"test");
        payload.push(0);
        let mut framed = codec::frame(RecordKind::Meta, &payload);
        framed[2] = envelope;
        let mut h = crc32fast::Hasher::new();
        h.update(&framed[0..8]);
        h.update(&payload);
        framed[8..12].copy_from_slice(&h.finalize().to_le_bytes());
        meta.insert("format", framed.as_slice()).expect("insert");
    }
    txn.commit().expect("commit");
}

#[test]
fn newer_format_is_refused_naming_both_versions() {
    // A format record of a newer build: its envelope version, or the version it holds
    // (6: a record that says 4 or 5 is format 3 with deferred purges pending or two log
    // files, which this build reads).
    for (version, envelope, found) in [(4, 4, 4), (6, 3, 6)] {
        let env = Env::new();
        write_meta_only(&env.path, version, envelope);
        let before = env.bytes();
        let err = env.builder().open(&env.path).expect_err("newer format");
        assert!(
            matches!(
                err.kind(),
                ErrorKind::UnsupportedFormat {
                    found: f,
                    supported: 3
                } if *f == found
            ),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("version {found}")) && msg.contains("version 3"),
            "{msg}"
        );
        let err = opjournal::Inspector::open(&env.path).expect_err("newer format");
        assert!(
            matches!(err.kind(), ErrorKind::UnsupportedFormat { .. }),
            "{err:?}"
        );
        assert!(env.bytes() == before, "refusing wrote to the file");
        assert!(!opjournal::FileLog::path_for(&env.path).exists());
    }
}

#[test]
fn other_files_are_not_journals() {
    let env = Env::new();
    std::fs::write(&env.path, b"just some text, not a database").expect("write");
    let err = env.builder().open(&env.path).expect_err("text file");
    assert!(
        matches!(err.kind(), ErrorKind::NotAJournal { .. }),
        "{err:?}"
    );
    // A redb database of another program.
    let other = env.dir.path().join("other.redb");
    write_foreign_redb(&other);
    let err = env.builder().open(&other).expect_err("foreign redb");
    assert!(
        matches!(err.kind(), ErrorKind::NotAJournal { .. }),
        "{err:?}"
    );
    let err = opjournal::Inspector::open(&other).expect_err("foreign redb");
    assert!(
        matches!(err.kind(), ErrorKind::NotAJournal { .. }),
        "{err:?}"
    );
}

/// Flips one payload byte of every framed record of `kind` that contains `needle`.
fn damage_records(path: &Path, kind: RecordKind, needle: &[u8]) -> usize {
    let mut bytes = std::fs::read(path).expect("read");
    let mut hits = 0;
    let mut i = 0;
    while i + 12 < bytes.len() {
        if bytes[i..i + 2] == *b"OJ"
            && (1..=opjournal::codec::FORMAT_VERSION).contains(&bytes[i + 2])
            && bytes[i + 3] == kind as u8
        {
            let len = u32::from_le_bytes([bytes[i + 4], bytes[i + 5], bytes[i + 6], bytes[i + 7]])
                as usize;
            let end = i + 12 + len;
            if end <= bytes.len()
                && bytes[i + 12..end]
                    .windows(needle.len())
                    .any(|w| w == needle)
            {
                bytes[end - 1] ^= 0x55;
                hits += 1;
            }
        }
        i += 1;
    }
    std::fs::write(path, bytes).expect("write");
    hits
}

#[test]
fn altered_receipt_bytes_give_corrupt_naming_table_and_key() -> opjournal::Result<()> {
    let env = Env::new();
    let mut editor = FakeEditor::at(0);
    {
        let journal = env.open();
        run_op(
            &journal,
            &mut editor,
            Operation::new("victim", add_light("a")),
            "a",
        )?;
        run_op(
            &journal,
            &mut editor,
            Operation::new("bystander", add_light("b")),
            "b",
        )?;
    }
    assert!(damage_records(&env.path, RecordKind::Receipt, b"victim") > 0);
    let journal = env.open();
    let err = journal.lookup("victim").expect_err("damaged receipt");
    match err.kind() {
        ErrorKind::Corrupt { table, key, detail } => {
            assert_eq!((table.as_str(), key.as_str()), ("receipts", "victim"));
            assert!(detail.contains("CRC"), "{detail}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    let err = journal
        .submit(Operation::new("victim", add_light("a")))
        .expect_err("damaged receipt");
    assert!(matches!(err.kind(), ErrorKind::Corrupt { .. }), "{err:?}");
    // Other operations are unaffected.
    assert!(journal.lookup("bystander")?.is_some());
    Ok(())
}

#[test]
fn altered_event_bytes_give_corrupt_naming_the_sequence() -> opjournal::Result<()> {
    let env = Env::new();
    {
        let journal = env.open();
        fresh(&journal, Operation::new("victim", add_light("a")));
    }
    assert!(damage_records(&env.path, RecordKind::Event, b"victim") > 0);
    let journal = env.open();
    let err = journal.history("victim").expect_err("damaged event");
    assert!(
        matches!(err.kind(), ErrorKind::Corrupt { table, .. } if table == "events"),
        "{err:?}"
    );
    Ok(())
}

#[test]
fn repair_refuses_foreign_and_newer_files_without_writing_a_backup() {
    let env = Env::new();
    write_meta_only(&env.path, 4, 4);
    let before = env.bytes();
    let err = opjournal::repair(&env.path, &Default::default(), &mut |_, _| {})
        .expect_err("newer format");
    assert!(
        matches!(err.kind(), ErrorKind::UnsupportedFormat { .. }),
        "{err:?}"
    );
    let other = env.dir.path().join("other.redb");
    write_foreign_redb(&other);
    let err =
        opjournal::repair(&other, &Default::default(), &mut |_, _| {}).expect_err("foreign redb");
    assert!(
        matches!(err.kind(), ErrorKind::NotAJournal { .. }),
        "{err:?}"
    );
    assert!(env.bytes() == before);
    let files: Vec<_> = std::fs::read_dir(env.dir.path())
        .expect("dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(files.len(), 2, "no backup was written: {files:?}");
}
