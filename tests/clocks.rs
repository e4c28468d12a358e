//! The background compactor and a file's single writer: dropping the journal ends the
//! compactor quietly and leaves the file free to reopen at once. The clocks at their exact
//! edges, the compactor's passes and the lazy commits are conformance bodies run on every
//! backend (tests/conformance.rs).

mod common;

use std::time::Duration;

use common::Env;

#[test]
fn background_compactor_ends_quietly_when_the_journal_is_dropped() {
    let env = Env::new();
    let journal = env.open();
    let handle = journal.spawn_compactor(Duration::from_millis(1));
    drop(journal);
    // The journal can be reopened at once: the compactor does not keep it open.
    let reopened = env.builder().open(&env.path);
    assert!(reopened.is_ok(), "{reopened:?}");
    drop(handle);
}

/// Everything a caller can observe of `ids` in `journal`, after a compaction.
fn observed(journal: &opjournal::Journal, ids: &[String]) -> Vec<String> {
    let mut out: Vec<String> = ids.iter().map(|id| common::snapshot(journal, id)).collect();
    out.push(format!("{:?}", journal.stats().expect("stats")));
    out
}

#[test]
fn a_compaction_that_scans_every_receipt_leaves_what_one_that_looks_up_each_due_operation_leaves() {
    use opjournal::{Admission, Operation, Outcome};

    let env = Env::new();
    let journal = env.open();
    let mut ids = Vec::new();
    let mut revisions = std::collections::BTreeMap::new();
    // Two generations of operations in every state the clocks act on: the first is past
    // its audit retention when the journal is compacted (purged), the second only past its
    // leases, acknowledgement timeouts and result retention.
    for generation in 0..2 {
        for i in 0..300 {
            let id = format!("op-{generation}-{i:03}");
            let mut op = Operation::new(id.clone(), common::add_light(&id));
            // A running operation would hold its scope's lock: those have none.
            let scope = (i % 3 == 0 && i % 5 != 0).then(|| format!("scene-{}", i % 7));
            if let Some(scope) = &scope {
                op = op.scope(scope.clone());
            }
            let session = (i % 2 == 0).then(|| format!("agent-{}", i % 5));
            if let Some(session) = &session {
                op = op.session(session.clone());
            }
            let rev: &mut u64 = revisions.entry(scope.unwrap_or_default()).or_default();
            *rev += 1;
            let rev = *rev;
            let claim = match journal.submit(op).expect("submit") {
                Admission::Fresh(claim) => claim,
                other => panic!("{id}: expected a fresh claim, got {other:?}"),
            };
            match i % 5 {
                // Left running: its lease expires.
                0 => {}
                1 => journal.release(&claim).expect("release"),
                2 => {
                    journal
                        .complete(&claim, Outcome::applied(rev, id.as_bytes().to_vec()))
                        .expect("complete");
                }
                _ => {
                    journal
                        .complete(&claim, Outcome::applied(rev, vec![i as u8; 600]))
                        .expect("complete");
                    journal.delivered(&id).expect("delivered");
                    if i % 5 == 4 {
                        journal
                            .acknowledge(&id, session.as_deref())
                            .expect("acknowledge");
                    }
                }
            }
            ids.push(id);
        }
        // The second generation starts two days before the first's audit retention ends.
        if generation == 0 {
            env.advance(Duration::from_secs(88 * 24 * 3600));
        }
    }
    drop(journal);
    env.advance(Duration::from_secs(3 * 24 * 3600));

    let copy = env.dir.path().join("copy.opj");
    std::fs::copy(&env.path, &copy).expect("copy the journal");
    let scanned = env
        .builder()
        .compaction_scan(Some(true))
        .compaction_batch(7)
        .open(&env.path)
        .expect("open");
    let looked_up = env
        .builder()
        .compaction_scan(Some(false))
        .compaction_batch(7)
        .open(&copy)
        .expect("open the copy");
    let (a, b) = (
        scanned.compact().expect("compact, scanning"),
        looked_up.compact().expect("compact, looking up"),
    );
    // The first generation is purged but for the operations left running (in doubt since
    // the reopen: they wait for a resolution); the second's results retire and its
    // acknowledgements expire.
    assert_eq!(a.purged, 240, "{a:?}");
    assert!(a.retired > 0 && a.ack_expired > 0, "{a:?}");
    assert!(a.batches > 10 && b.batches > 10, "{a:?} {b:?}");
    let counts = |r: &opjournal::CompactionReport| {
        (
            r.lease_expired,
            r.exhausted,
            r.ack_expired,
            r.retired,
            r.purged,
            r.revision_events_purged,
        )
    };
    assert_eq!(counts(&a), counts(&b), "{a:?} against {b:?}");
    let (seen_a, seen_b) = (observed(&scanned, &ids), observed(&looked_up, &ids));
    if let Some((a, b)) = seen_a.iter().zip(&seen_b).find(|(a, b)| a != b) {
        panic!("scanning left\n{a}\nlooking up left\n{b}");
    }
    assert_eq!(
        scanned.event_count().expect("events"),
        looked_up.event_count().expect("events")
    );
    // A second pass finds nothing left to do, either way.
    assert_eq!(scanned.compact().expect("compact").total(), 0);
    assert_eq!(looked_up.compact().expect("compact").total(), 0);
}

/// `n` operations completed and acknowledged now, with ids `{prefix}-{i}`.
fn completed(journal: &opjournal::Journal, prefix: &str, n: usize) {
    use opjournal::{Operation, Outcome};
    for i in 0..n {
        let id = format!("{prefix}-{i:05}");
        let claim = common::fresh(journal, Operation::new(id.clone(), common::add_light(&id)));
        journal
            .complete(&claim, Outcome::applied(1, vec![7; 64]))
            .expect("complete");
        journal.acknowledge(&id, None).expect("acknowledge");
    }
}

/// Advances the clock by `days`, reopens the journal (its close wrote everything into the
/// file, where the scan's choice counts receipts) and compacts it.
fn compact_after(env: &Env, days: u32) -> (opjournal::Journal, opjournal::CompactionReport) {
    env.advance(Duration::from_secs(24 * 3600) * days);
    let journal = env.open();
    let report = journal.compact().expect("compact");
    (journal, report)
}

#[test]
fn compaction_scans_every_receipt_only_when_more_than_half_are_due() {
    let env = Env::new();
    let journal = env.open();
    completed(&journal, "a", 2_200);
    env.advance(Duration::from_secs(88 * 24 * 3600));
    completed(&journal, "b", 2_000);
    drop(journal);

    // 2,200 of 4,200 receipts are past their audit retention: a scan reads all of them.
    let (journal, report) = compact_after(&env, 3);
    assert_eq!(
        (report.purged, report.receipts_scanned),
        (2_200, 4_200),
        "{report:?}"
    );
    completed(&journal, "c", 2_100);
    drop(journal);

    // 2,000 of 4,100 are past their result retention: each is looked up by its timer.
    let (_, report) = compact_after(&env, 5);
    assert_eq!(
        (report.retired, report.purged, report.receipts_scanned),
        (2_000, 0, 0),
        "{report:?}"
    );
}
