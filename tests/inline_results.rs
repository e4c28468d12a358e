//! Format 3 keeps a small result in its receipt's value, so that a replay reads one value
//! (one B-tree descent) instead of the receipt and then the result. These tests look at the
//! file with redb itself to see where a result is stored, and check that every path that
//! rewrites, drops, verifies or repairs a receipt keeps the two together.

mod common;

use std::time::Duration;

use common::{Env, FakeEditor, add_light, fresh};
use opjournal::redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use opjournal::{Admission, ExecutionStatus, Operation, Outcome, RepairOptions};

const RECEIPTS: TableDefinition<&str, &[u8]> = TableDefinition::new("receipts");
const RESULTS: TableDefinition<u64, &[u8]> = TableDefinition::new("results");

/// A result small enough to be stored inline (framed with its header, at most 256 bytes:
/// docs/format.md); larger ones go to `results`.
const SMALL: usize = 128;

fn op(id: &str) -> Operation {
    Operation::new(id, add_light(id))
        .scope(format!("scene/{id}"))
        .session("tab-1")
}

/// Runs `id` to completion with a result of `len` bytes (a pattern, so a copy of it is
/// recognizable in a value) and returns that result.
fn complete(journal: &opjournal::Journal, id: &str, len: usize) -> Vec<u8> {
    let mut editor = FakeEditor::at(0);
    let claim = fresh(journal, op(id));
    let rev = editor.apply(&claim, id);
    let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    journal
        .complete(&claim, Outcome::applied(rev, bytes.clone()))
        .expect("complete");
    bytes
}

/// (length of the receipt value of `id`, entries in `results`), read from the closed file.
fn layout(env: &Env, id: &str) -> (usize, u64) {
    let db = opjournal::redb::Database::open(&env.path).expect("redb opens the closed journal");
    let txn = db.begin_read().expect("read");
    let receipts = txn.open_table(RECEIPTS).expect("receipts");
    let value_len = receipts
        .get(id)
        .expect("get")
        .map_or(0, |v| v.value().len());
    let results = txn
        .open_table(RESULTS)
        .expect("results")
        .len()
        .expect("len");
    (value_len, results)
}

fn replayed(journal: &opjournal::Journal, id: &str) -> Vec<u8> {
    match journal.submit(op(id)).expect("submit") {
        Admission::Replay(r) => r.result.bytes,
        other => panic!("expected a replay of {id}, got {other:?}"),
    }
}

#[test]
fn a_small_result_is_stored_in_its_receipt_and_replayed_from_it() {
    let env = Env::new();
    let journal = env.open();
    let result = complete(&journal, "small", SMALL);
    // Before a checkpoint (from the memtable) and after one (from the file).
    assert_eq!(replayed(&journal, "small"), result);
    journal.close().expect("close");
    let (value_len, results) = layout(&env, "small");
    assert_eq!(results, 0, "a small result is not in the results table");
    assert!(
        value_len > result.len(),
        "the receipt value ({value_len} bytes) holds the small result"
    );
    let journal = env.open();
    assert_eq!(replayed(&journal, "small"), result);
    let stored = journal.result("small").expect("result").expect("kept");
    assert_eq!(stored.bytes, result);
    assert_eq!(journal.stats().expect("stats").results, 1);
}

#[test]
fn a_large_result_is_stored_in_the_results_table() {
    let env = Env::new();
    let journal = env.open();
    // 1 KiB, the size the bench uses: stored once, in `results`.
    let result = complete(&journal, "large", 1024);
    journal.close().expect("close");
    let (value_len, results) = layout(&env, "large");
    assert_eq!(results, 1, "a 1 KiB result is in the results table");
    assert!(value_len < 1024, "the receipt value is {value_len} bytes");
    let journal = env.open();
    assert_eq!(replayed(&journal, "large"), result);
    assert_eq!(journal.stats().expect("stats").results, 1);
}

#[test]
fn deliveries_and_acknowledgements_keep_the_inline_result() {
    let env = Env::new();
    let journal = env.open();
    let result = complete(&journal, "acked", SMALL);
    journal.delivered("acked").expect("delivered");
    journal.flush().expect("flush");
    assert_eq!(replayed(&journal, "acked"), result);
    journal
        .acknowledge("acked", Some("tab-1"))
        .expect("acknowledge");
    journal.close().expect("close");
    let (value_len, results) = layout(&env, "acked");
    assert_eq!(results, 0);
    assert!(value_len > SMALL, "the receipt value is {value_len} bytes");
    let journal = env.open();
    assert_eq!(replayed(&journal, "acked"), result);
    drop(journal);
    let report = opjournal::verify(&env.path).expect("verify");
    assert!(report.is_clean(), "{:?}", report.findings);
    assert_eq!(report.results, 1);
}

#[test]
fn retiring_drops_the_inline_result_and_keeps_the_audit_record() {
    let env = Env::new();
    let journal = env.open();
    complete(&journal, "old", SMALL);
    journal.close().expect("close");
    let (inline_len, _) = layout(&env, "old");
    let journal = env.open();
    env.advance(Duration::from_secs(7 * 24 * 3600 + 1));
    assert_eq!(journal.compact().expect("compact").retired, 1);
    let r = journal
        .lookup("old")
        .expect("lookup")
        .expect("audit record");
    assert_eq!(r.status, ExecutionStatus::Retired);
    assert_eq!(journal.stats().expect("stats").results, 0);
    assert!(matches!(
        journal.submit(op("old")).expect("submit"),
        Admission::Expired(_)
    ));
    journal.close().expect("close");
    let (value_len, _) = layout(&env, "old");
    assert!(
        value_len + SMALL < inline_len,
        "the retired receipt value is {value_len} bytes, {inline_len} with its result"
    );
    let report = opjournal::verify(&env.path).expect("verify");
    assert!(report.is_clean(), "{:?}", report.findings);
}

/// Flips the last byte of the receipt value of `id` (the inline result's payload).
fn damage_inline_result(env: &Env, id: &str) {
    let db = opjournal::redb::Database::create(&env.path).expect("redb opens the closed journal");
    let txn = db.begin_write().expect("write");
    {
        let mut receipts = txn.open_table(RECEIPTS).expect("receipts");
        let mut value = receipts
            .get(id)
            .expect("get")
            .expect("the receipt")
            .value()
            .to_vec();
        let last = value.len() - 1;
        value[last] ^= 0x40;
        receipts.insert(id, value.as_slice()).expect("insert");
    }
    txn.commit().expect("commit");
}

#[test]
fn verify_names_the_receipt_of_a_damaged_inline_result_and_repair_answers_it_expired() {
    let env = Env::new();
    let journal = env.open();
    complete(&journal, "hit", SMALL);
    complete(&journal, "fine", SMALL);
    journal.close().expect("close");
    damage_inline_result(&env, "hit");
    let report = opjournal::verify(&env.path).expect("verify");
    let hit: Vec<_> = report
        .findings
        .iter()
        .filter(|f| f.table == "receipts" && f.key == "hit")
        .collect();
    assert_eq!(hit.len(), 1, "{:?}", report.findings);
    assert!(
        hit[0].problem.contains("inline result"),
        "{}",
        hit[0].problem
    );
    // Reads name the damage instead of answering with a wrong result.
    let journal = env.open();
    let err = journal.submit(op("hit")).expect_err("a damaged result");
    assert!(
        matches!(err.kind(), opjournal::ErrorKind::Corrupt { .. }),
        "{err:?}"
    );
    drop(journal);
    let mut options = RepairOptions::default();
    options.backup = false;
    opjournal::repair(&env.path, &options, &mut |_, _| {}).expect("repair");
    let report = opjournal::verify(&env.path).expect("verify after repair");
    assert!(report.is_clean(), "{:?}", report.findings);
    let journal = env.open();
    // The undamaged result is kept (and still inline), the damaged one is gone: its receipt
    // answers expired, never with altered bytes.
    assert_eq!(replayed(&journal, "fine").len(), SMALL);
    assert!(matches!(
        journal.submit(op("hit")).expect("submit"),
        Admission::Expired(_)
    ));
    journal.close().expect("close");
    assert_eq!(layout(&env, "fine").1, 0);
}

#[test]
fn a_dump_lists_inline_and_table_results_in_seq_order_and_imports_to_the_same_dump() {
    let env = Env::new();
    let journal = env.open();
    complete(&journal, "b-small", 100);
    complete(&journal, "a-large", 5000);
    complete(&journal, "c-small", 200);
    journal.close().expect("close");
    let dump = |path: &std::path::Path| {
        let mut out = Vec::new();
        opjournal::Inspector::open(path)
            .expect("inspect")
            .export_dump(&mut out)
            .expect("dump");
        String::from_utf8(out).expect("utf-8")
    };
    let first = dump(&env.path);
    let results: Vec<&str> = first.lines().filter(|l| l.contains("\"result\"")).collect();
    let order: Vec<usize> = ["b-small", "a-large", "c-small"]
        .iter()
        .map(|id| {
            results
                .iter()
                .position(|l| l.contains(&format!("\"{id}\"")))
                .expect("each result is in the dump")
        })
        .collect();
    assert_eq!(order, vec![0, 1, 2], "results in completion order");
    let copy = env.dir.path().join("imported.opj");
    opjournal::import_dump(&mut first.as_bytes(), &copy).expect("import");
    assert_eq!(dump(&copy), first);
}
