//! The file format: golden bytes of every record kind, a checked-in v1 journal, format
//! version checks, and typed `Corrupt` errors for values altered on disk.

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
    assert_eq!(framed[2], 1, "format version");
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

/// Builds the v1 fixture: applied+acknowledged, delivered, failed, released, and one
/// operation running when the journal was closed.
fn build_v1_fixture(path: &Path) -> opjournal::Result<()> {
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
    journal.acknowledge("acked")?;
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

#[test]
fn checked_in_v1_journal_opens_with_every_state_intact() -> opjournal::Result<()> {
    let path = fixture("v1.opj");
    if bless() {
        let _ = std::fs::remove_file(&path);
        build_v1_fixture(&path)?;
    }
    // Opening writes (reopen bookkeeping), so work on a copy.
    let env = Env::new();
    std::fs::copy(&path, &env.path).map_err(opjournal::Error::from)?;
    env.clock.set(common::T0);
    let journal = env.open();
    let acked = journal.lookup("acked")?.expect("acked");
    assert_eq!(acked.status, ExecutionStatus::Applied);
    assert_eq!(acked.delivery, Some(DeliveryState::Acknowledged));
    assert_eq!(acked.result_revision, Some(184));
    let delivered = journal.lookup("delivered")?.expect("delivered");
    assert_eq!(
        (delivered.delivery, delivered.delivery_count),
        (Some(DeliveryState::Delivered), 1)
    );
    let failed = journal.lookup("failed")?.expect("failed");
    assert_eq!(failed.failure.as_deref(), Some("no door"));
    assert_eq!(journal.lookup("released")?, None);
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
    Ok(())
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

/// Writes a redb file whose `meta` table says `format_version`.
fn write_meta_only(path: &Path, format_version: u32) {
    let db = redb::Database::create(path).expect("redb file");
    let txn = db.begin_write().expect("write");
    {
        let mut meta = txn
            .open_table(redb::TableDefinition::<&str, &[u8]>::new("meta"))
            .expect("meta");
        // FormatRecord per docs/format.md: u32 version, u64 created_at, string created_by.
        let mut payload = Vec::new();
        payload.extend_from_slice(&format_version.to_le_bytes());
        payload.extend_from_slice(&common::T0.as_millis().to_le_bytes());
        payload.extend_from_slice(&(4u64).to_le_bytes());
        payload.extend_from_slice(b"test");
        meta.insert(
            "format",
            codec::frame(RecordKind::Meta, &payload).as_slice(),
        )
        .expect("insert");
    }
    txn.commit().expect("commit");
}

#[test]
fn newer_format_is_refused_naming_both_versions() {
    let env = Env::new();
    write_meta_only(&env.path, 2);
    let err = env.builder().open(&env.path).expect_err("newer format");
    assert!(
        matches!(
            err.kind(),
            ErrorKind::UnsupportedFormat {
                found: 2,
                supported: 1
            }
        ),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("version 2") && msg.contains("version 1"),
        "{msg}"
    );
    let err = opjournal::Inspector::open(&env.path).expect_err("newer format");
    assert!(
        matches!(err.kind(), ErrorKind::UnsupportedFormat { .. }),
        "{err:?}"
    );
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
        if bytes[i..i + 2] == *b"OJ" && bytes[i + 2] == 1 && bytes[i + 3] == kind as u8 {
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
    write_meta_only(&env.path, 2);
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
