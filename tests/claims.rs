//! Claims made in the code and the docs that no other test stood behind, each asserted as
//! stated (issue 23): group commit, the lazy-commit triggers of deliveries and
//! acknowledgements, the builder's memory bounds, and the edge of inline results.
//!
//! Most run on the fault disk (`testkit/src/fault_backend.rs`), whose counters show
//! every write and sync of the journal's two files and whose durable image is what a
//! power cut would leave.

use opjournal_testkit::fault_backend;

use std::sync::Barrier;
use std::time::{Duration, Instant};

use fault_backend::{CutPolicy, FaultDisk};
use opjournal::{
    Admission, Claim, DeliveryState, Intent, Journal, JournalBuilder, ManualClock, Operation,
    Outcome, Timestamp,
};

/// 2026-11-30T00:00:00Z.
const T0: Timestamp = Timestamp::from_millis(1_796_083_200_000);

fn builder(clock: &ManualClock) -> JournalBuilder {
    Journal::builder().clock(clock.clone())
}

fn on_disk(b: JournalBuilder, disk: &FaultDisk) -> Journal {
    b.open_backends(disk.backend(), disk.log(), "fault-disk")
        .expect("the journal opens on the fault disk")
}

/// An operation with its own intent, in no scope, in a session of its own named as it is
/// (so no session window fills up).
fn op(id: &str) -> Operation {
    let intent =
        Intent::from_json("claims.edit", &serde_json::json!({ "id": id })).expect("a valid intent");
    Operation::new(id, intent).session(id)
}

fn fresh(journal: &Journal, id: &str) -> Claim {
    match journal.submit(op(id)).expect("submit") {
        Admission::Fresh(claim) => claim,
        other => panic!("expected fresh work for `{id}`, got {other:?}"),
    }
}

/// Submits and completes `id` with `result`.
fn finished(journal: &Journal, id: &str, result: Vec<u8>) {
    let claim = fresh(journal, id);
    journal
        .complete(&claim, Outcome::applied(1, result))
        .expect("complete");
}

/// Whether `needle` is in the log's durable image: what completed syncs made permanent.
fn durable_in_log(disk: &FaultDisk, needle: &[u8]) -> bool {
    disk.durable_image()
        .log
        .to_vec()
        .windows(needle.len())
        .any(|w| w == needle)
}

/// Records appended to the log so far (each append is one write of the log; no
/// checkpoint runs in the tests that count them, so no other write reaches the log).
fn log_writes(disk: &FaultDisk) -> u64 {
    disk.stats().log.writes
}

/// The journal that a reboot after a power cut finds: only what was synced.
fn after_power_cut(journal: Journal, disk: &FaultDisk, clock: &ManualClock) -> Journal {
    disk.cut();
    drop(journal);
    let image = disk.power_cut_image(CutPolicy::DropAll, &mut || 0);
    on_disk(builder(clock), &FaultDisk::from_image(image))
}

// ---------------------------------------------------------------------------------------
// Group commit (DESIGN.md §7, `src/journal/committer.rs`).
// ---------------------------------------------------------------------------------------

/// "Concurrent callers may share one commit (group commit); each still returns only after
/// its own change is durable." Sixteen callers submit at once, then complete at once, on a
/// disk whose syncs take 10 ms (a real fsync's order): the log is synced fewer times than
/// there were calls (at most half as often), and each caller, when its call returns, finds
/// its record (its operation id, then its result) in the log's durable image.
#[test]
fn group_commit_shares_one_sync_among_concurrent_callers() {
    const CALLERS: usize = 16;
    let clock = ManualClock::new(T0);
    let disk = FaultDisk::new();
    let journal = on_disk(builder(&clock), &disk);
    disk.set_sync_delay(Duration::from_millis(10));
    let before = disk.stats().log;
    let start = Barrier::new(CALLERS);
    let completing = Barrier::new(CALLERS);
    // Each caller reports instead of asserting, so that one failing caller cannot leave the
    // others waiting at the barrier: whether its record was durable when each call returned.
    let reports: Vec<Result<(bool, bool), String>> = std::thread::scope(|s| {
        let callers: Vec<_> = (0..CALLERS)
            .map(|t| {
                let (journal, disk, start, completing) = (&journal, &disk, &start, &completing);
                s.spawn(move || {
                    let id = format!("group-op-{t:02}");
                    start.wait();
                    let submitted = journal.submit(op(&id));
                    let submit_durable = durable_in_log(disk, id.as_bytes());
                    completing.wait();
                    let claim = match submitted {
                        Ok(Admission::Fresh(claim)) => claim,
                        other => return Err(format!("submit `{id}`: {other:?}")),
                    };
                    let result = format!("group-result-{t:02}");
                    journal
                        .complete(&claim, Outcome::applied(1, result.clone().into_bytes()))
                        .map_err(|e| format!("complete `{id}`: {e}"))?;
                    Ok((submit_durable, durable_in_log(disk, result.as_bytes())))
                })
            })
            .collect();
        callers
            .into_iter()
            .map(|c| c.join().unwrap_or_else(|_| Err("a caller panicked".into())))
            .collect()
    });
    for (t, report) in reports.into_iter().enumerate() {
        let (submit_durable, complete_durable) =
            report.unwrap_or_else(|e| panic!("caller {t}: {e}"));
        assert!(
            submit_durable,
            "caller {t}: submit returned before a sync made its record durable"
        );
        assert!(
            complete_durable,
            "caller {t}: complete returned before a sync made its result durable"
        );
    }
    let after = disk.stats().log;
    let calls = 2 * CALLERS as u64;
    let syncs = after.syncs - before.syncs;
    let appends = after.writes - before.writes;
    assert!(
        syncs > 0 && syncs <= calls / 2,
        "{calls} concurrent calls took {syncs} log syncs ({appends} appends): not shared"
    );
    assert_eq!(appends, syncs, "one append, one sync per commit");
}

// ---------------------------------------------------------------------------------------
// The lazy commit of deliveries and acknowledgements (`src/journal/reads.rs`:
// `LAZY_MAX_ENTRIES` = 256, `LAZY_MAX_DELAY` = 200 ms; README, docs/durability.md: "after
// 256 of them / 200 ms of further lazy calls").
// ---------------------------------------------------------------------------------------

/// The pending count that triggers a commit, as the docs state it.
const LAZY_MAX_ENTRIES: usize = 256;
/// The age of the oldest pending entry past which the next lazy call commits.
const LAZY_MAX_DELAY: Duration = Duration::from_millis(200);

/// With no other commit, the 256th pending delivery or acknowledgement commits them all
/// (one log append), and none before it does. 512 lazy calls (a delivery and an
/// acknowledgement of each of 256 operations) are two full buffers: the log is appended to
/// exactly at calls 256 and 512, and after a power cut every delivery and acknowledgement
/// is there.
///
/// The 200 ms rule can also commit early if this machine stalls: a commit before the
/// 256th call is accepted only when the test saw 200 ms pass since the first pending call,
/// and then that buffer is not counted; at least one full buffer of 256 must be observed.
#[test]
fn the_256th_pending_delivery_or_acknowledgement_commits_them_all() {
    const OPS: usize = LAZY_MAX_ENTRIES;
    let clock = ManualClock::new(T0);
    let disk = FaultDisk::new();
    let journal = on_disk(builder(&clock), &disk);
    let ids: Vec<String> = (0..OPS).map(|i| format!("lazy-{i:03}")).collect();
    for id in &ids {
        finished(&journal, id, b"r".to_vec());
    }
    let calls: Vec<(&str, bool)> = ids
        .iter()
        .flat_map(|id| [(id.as_str(), false), (id.as_str(), true)])
        .collect();
    let mut pending = 0usize;
    let mut since: Option<Instant> = None;
    let mut full_buffers = 0;
    for (n, (id, ack)) in calls.iter().enumerate() {
        let first = *since.get_or_insert_with(Instant::now);
        let writes = log_writes(&disk);
        let r = if *ack {
            journal.acknowledge(id, Some(id))
        } else {
            journal.delivered(id)
        };
        r.unwrap_or_else(|e| panic!("lazy call {} on `{id}`: {e}", n + 1));
        pending += 1;
        let committed = log_writes(&disk) - writes;
        assert!(committed <= 1, "one lazy call appended {committed} records");
        if pending == LAZY_MAX_ENTRIES {
            assert_eq!(
                committed,
                1,
                "call {}: the {LAZY_MAX_ENTRIES}th pending entry did not commit the buffer",
                n + 1
            );
            full_buffers += 1;
        } else if committed == 1 {
            assert!(
                first.elapsed() >= LAZY_MAX_DELAY,
                "call {}: {pending} pending entries, the first {:?} old, were committed",
                n + 1,
                first.elapsed()
            );
        }
        if committed == 1 {
            pending = 0;
            since = None;
        }
    }
    assert!(
        full_buffers >= 1,
        "no buffer reached {LAZY_MAX_ENTRIES} entries (the machine stalled for 200 ms in each)"
    );
    assert_eq!(pending, 0, "the last call committed what was pending");
    let journal = after_power_cut(journal, &disk, &clock);
    for id in &ids {
        let r = journal.lookup(id).expect("lookup").expect("recorded");
        assert_eq!(
            (r.delivery, r.delivery_count),
            (Some(DeliveryState::Acknowledged), 1),
            "`{id}` after a power cut"
        );
    }
}

/// A lazy call made once the oldest pending entry is 200 ms old commits every pending
/// entry with it; one made before then does not (judged only when this test can tell:
/// when the call returned within 200 ms of the first one).
#[test]
fn a_lazy_call_200_ms_after_the_first_pending_one_commits_them_all() {
    let clock = ManualClock::new(T0);
    let disk = FaultDisk::new();
    let journal = on_disk(builder(&clock), &disk);
    for id in ["timer-0", "timer-1", "timer-2"] {
        finished(&journal, id, b"r".to_vec());
    }
    let writes = log_writes(&disk);
    let started = Instant::now();
    journal.delivered("timer-0").expect("delivered");
    let first_returned = Instant::now();
    assert_eq!(
        log_writes(&disk),
        writes,
        "a first lazy call commits nothing"
    );
    journal.delivered("timer-1").expect("delivered");
    if started.elapsed() < LAZY_MAX_DELAY {
        assert_eq!(
            log_writes(&disk),
            writes,
            "a lazy call within 200 ms of the first pending one committed them"
        );
    }
    // The first entry was made before `first_returned`: 200 ms after it, it is that old.
    std::thread::sleep(LAZY_MAX_DELAY.saturating_sub(first_returned.elapsed()));
    journal
        .acknowledge("timer-2", Some("timer-2"))
        .expect("acknowledge");
    assert_eq!(
        log_writes(&disk),
        writes + 1,
        "the lazy call 200 ms after the first pending one committed them all, once"
    );
    let journal = after_power_cut(journal, &disk, &clock);
    let state = |id: &str| {
        let r = journal.lookup(id).expect("lookup").expect("recorded");
        (r.delivery, r.delivery_count)
    };
    assert_eq!(state("timer-0"), (Some(DeliveryState::Delivered), 1));
    assert_eq!(state("timer-1"), (Some(DeliveryState::Delivered), 1));
    assert_eq!(state("timer-2"), (Some(DeliveryState::Acknowledged), 0));
}

// ---------------------------------------------------------------------------------------
// Memory bounds set on the builder.
// ---------------------------------------------------------------------------------------

/// `JournalBuilder::checkpoint_size`: "Changes logged since the last checkpoint are also
/// held in memory (roughly as much again), so this bounds the journal's memory". With one
/// caller (no call queued, so a checkpoint runs as soon as the log or the memtable reaches
/// the size), the memtable holds less than the checkpoint size after every call, while
/// the workload logs many times that size (checkpoints ran: the journal file was synced);
/// with four concurrent callers (a checkpoint may wait up to twice the size while calls
/// are queued), it holds less than twice the size plus one batch whenever it is sampled.
#[test]
fn the_memtable_stays_within_the_configured_checkpoint_size() {
    const SIZE: u64 = 64 << 10;
    let clock = ManualClock::new(T0);
    let disk = FaultDisk::new();
    let journal = on_disk(builder(&clock).checkpoint_size(SIZE), &disk);
    let db_syncs = disk.stats().db.syncs;
    let mut peak = 0;
    for i in 0..300 {
        let id = format!("mem-{i:03}");
        let claim = fresh(&journal, &id);
        peak = peak.max(journal.memtable_bytes());
        assert!(
            (journal.memtable_bytes() as u64) < SIZE,
            "after submit {i}: {} bytes",
            journal.memtable_bytes()
        );
        journal
            .complete(&claim, Outcome::applied(1, vec![b'm'; 1000]))
            .expect("complete");
        peak = peak.max(journal.memtable_bytes());
        assert!(
            (journal.memtable_bytes() as u64) < SIZE,
            "after complete {i}: {} bytes",
            journal.memtable_bytes()
        );
    }
    let checkpoints = disk.stats().db.syncs - db_syncs;
    assert!(
        checkpoints >= 3,
        "the workload ran {checkpoints} checkpoint syncs: the bound was not approached"
    );
    assert!(
        peak as u64 >= SIZE / 2,
        "the memtable peaked at {peak} bytes: the bound was not approached"
    );

    // Concurrent callers.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let sampled = std::thread::scope(|s| {
        let workers: Vec<_> = (0..4)
            .map(|t| {
                let journal = &journal;
                s.spawn(move || {
                    for i in 0..150 {
                        finished(journal, &format!("mem-{t}-{i:03}"), vec![b'c'; 1000]);
                    }
                })
            })
            .collect();
        let sampler = s.spawn(|| {
            let mut max = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                max = max.max(journal.memtable_bytes());
                std::thread::yield_now();
            }
            max
        });
        for w in workers {
            w.join().expect("a worker panicked");
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        sampler.join().expect("the sampler panicked")
    });
    // One batch: at most the four callers' calls, each well under 4 KiB of changes.
    let batch = 4 * 4096;
    assert!(
        (sampled as u64) < 2 * SIZE + batch,
        "with concurrent callers the memtable held {sampled} bytes"
    );
}

/// `JournalBuilder::checkpoint_size` bounds the log's file too: it keeps the power of two
/// that holds the checkpoint size (here 4 MiB) across checkpoints, one caller after
/// another and with callers always queued (when a checkpoint may wait for up to twice the
/// size), instead of doubling when the record that makes the checkpoint due passes its end.
#[test]
fn the_log_file_keeps_the_power_of_two_that_holds_the_checkpoint_size() {
    const SIZE: u64 = 4 << 20;
    let clock = ManualClock::new(T0);
    let disk = FaultDisk::new();
    let journal = on_disk(builder(&clock).checkpoint_size(SIZE), &disk);
    // Whole lifecycles in one scope and session, with 1 KiB results: about 3.4 KiB of
    // log each, so 1,300 of them make a checkpoint due on the log's growth.
    let lifecycle = |t: usize, i: usize| {
        let id = format!("log-{t}-{i:04}");
        let intent = Intent::from_json("claims.edit", &serde_json::json!({ "id": id }))
            .expect("a valid intent");
        let op = Operation::new(id.as_str(), intent)
            .scope(format!("doc-{t}"))
            .session(format!("session-{t}"));
        let Admission::Fresh(claim) = journal.submit(op).expect("submit") else {
            panic!("`{id}` is new");
        };
        journal
            .complete(&claim, Outcome::applied(i as u64 + 1, vec![b'l'; 1 << 10]))
            .expect("complete");
        journal
            .acknowledge(&id, Some(&format!("session-{t}")))
            .expect("acknowledge");
    };
    let log_len = || disk.live_image().log.len() as u64;
    let db_syncs = disk.stats().db.syncs;
    for i in 0..4000 {
        lifecycle(0, i);
        assert!(
            log_len() <= SIZE,
            "after {i} lifecycles the log is {} bytes",
            log_len()
        );
    }
    let checkpoints = disk.stats().db.syncs - db_syncs;
    assert!(checkpoints >= 2, "only {checkpoints} checkpoint syncs");

    // Four callers, so that calls are queued at most checkpoints: the log may then reach
    // twice the size before one is taken, and its file the next power of two, no more.
    let db_syncs = disk.stats().db.syncs;
    std::thread::scope(|s| {
        for t in 1..=4 {
            let lifecycle = &lifecycle;
            s.spawn(move || (0..2500).for_each(|i| lifecycle(t, i)));
        }
    });
    let checkpoints = disk.stats().db.syncs - db_syncs;
    assert!(checkpoints >= 2, "only {checkpoints} checkpoint syncs");
    assert!(
        log_len() <= 2 * SIZE,
        "with queued callers the log grew to {} bytes",
        log_len()
    );
}

/// `JournalBuilder::replay_cache_size`: the replay cache never holds more bytes than its
/// bound (read from `Stats::replay_cache`, after every replay), while a workload that
/// re-asks 200 results of 500 bytes (far more than the bound) fills it and is served from
/// it.
#[test]
fn the_replay_cache_never_holds_more_than_its_configured_bytes() {
    const BOUND: usize = 16 << 10;
    let clock = ManualClock::new(T0);
    let disk = FaultDisk::new();
    let journal = on_disk(builder(&clock).replay_cache_size(BOUND), &disk);
    let ids: Vec<String> = (0..200).map(|i| format!("cache-{i:03}")).collect();
    for id in &ids {
        finished(&journal, id, vec![b'x'; 500]);
    }
    let mut peak = 0;
    for round in 0..3 {
        for id in &ids {
            match journal.submit(op(id)).expect("submit") {
                Admission::Replay(r) => assert_eq!(r.result.bytes.len(), 500),
                other => panic!("expected a replay of `{id}`, got {other:?}"),
            }
            let held = journal.stats().expect("stats").replay_cache.bytes;
            assert!(
                held <= BOUND as u64,
                "round {round}, `{id}`: the cache holds {held} bytes, bound {BOUND}"
            );
            peak = peak.max(held);
        }
    }
    let cache = journal.stats().expect("stats").replay_cache;
    assert!(
        peak >= BOUND as u64 / 2,
        "the cache peaked at {peak} bytes: the bound was not approached"
    );
    assert!(
        cache.hits > 0,
        "no replay was served from the cache: {cache:?}"
    );
}

// ---------------------------------------------------------------------------------------
// The inline edge (docs/decisions/inline-results.md, docs/format.md: a result whose framed
// record is at most 256 bytes is stored in its receipt's value, a larger one in the
// `results` table).
// ---------------------------------------------------------------------------------------

const INLINE_MAX: usize = 256;

mod inline_edge {
    use super::*;
    use opjournal::redb::{ReadableDatabase, ReadableTable, TableDefinition};

    const RECEIPTS: TableDefinition<&str, &[u8]> = TableDefinition::new("receipts");
    const RESULTS: TableDefinition<u64, &[u8]> = TableDefinition::new("results");
    /// The record kind of a result (docs/format.md).
    const RESULT_KIND: u8 = 5;

    /// The result length whose framed record, for operation `id` completed at a seq below
    /// 251 (one byte as a variable-length integer), is `framed` bytes long: the header,
    /// then the bincode `ResultHeader` (`operation_id`, `completed_seq`, no changed
    /// assets), then the raw bytes.
    fn result_len_for(id: &str, framed: usize) -> usize {
        let header =
            opjournal::codec::encode_payload(&(id.to_string(), 0u64, Vec::<String>::new()));
        framed - opjournal::codec::HEADER_LEN - header.len()
    }

    /// Where the closed journal at `path` stores the result of `id`: `Ok(framed length)`
    /// inline after its receipt, or `Err(framed length)` in `results` (the only entry).
    fn stored(path: &std::path::Path, id: &str) -> Result<usize, usize> {
        let db = opjournal::redb::Database::open(path).expect("redb opens the closed journal");
        let txn = db.begin_read().expect("read");
        let receipts = txn.open_table(RECEIPTS).expect("receipts");
        let value = receipts
            .get(id)
            .expect("get")
            .expect("a receipt")
            .value()
            .to_vec();
        let receipt_len =
            12 + u32::from_le_bytes([value[4], value[5], value[6], value[7]]) as usize;
        if value.len() > receipt_len {
            let inline = &value[receipt_len..];
            assert_eq!(
                inline[3], RESULT_KIND,
                "a result record follows the receipt"
            );
            return Ok(inline.len());
        }
        let results = txn.open_table(RESULTS).expect("results");
        let mut found = Vec::new();
        for entry in results.iter().expect("iter") {
            let (_, v) = entry.expect("entry");
            let v = v.value();
            let (_, payload) = opjournal::codec::unframe_any(v).expect("a framed record");
            // The payload starts with the operation id (length-prefixed).
            if payload[1..].starts_with(id.as_bytes()) {
                assert_eq!(v[3], RESULT_KIND);
                found.push(v.len());
            }
        }
        assert_eq!(found.len(), 1, "`{id}` has one stored result");
        Err(found[0])
    }

    fn replayed(journal: &Journal, id: &str) -> Vec<u8> {
        match journal.submit(op(id)).expect("submit") {
            Admission::Replay(r) => {
                let via_result = journal.result(id).expect("result").expect("kept").bytes;
                assert_eq!(
                    via_result, r.result.bytes,
                    "`{id}`: result() and the replay"
                );
                r.result.bytes
            }
            other => panic!("expected a replay of `{id}`, got {other:?}"),
        }
    }

    /// A result framed at exactly 256 bytes is stored inline, one byte more goes to the
    /// `results` table; both replay byte for byte from the memtable (before a checkpoint),
    /// from the file (after one), and after a reopen. The replay cache is off, so every
    /// replay reads the store.
    #[test]
    fn a_result_framed_at_the_256_byte_bound_is_inline_and_one_byte_more_is_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("edge.opj");
        let clock = ManualClock::new(T0);
        let open = || {
            builder(&clock)
                .replay_cache_size(0)
                .open(&path)
                .expect("open")
        };
        let mut journal = open();
        let (at, over) = ("edge-at", "edge-over");
        let pattern = |len: usize| (0..len).map(|i| (i % 251) as u8).collect::<Vec<u8>>();
        let at_bytes = pattern(result_len_for(at, INLINE_MAX));
        let over_bytes = pattern(result_len_for(over, INLINE_MAX + 1));
        finished(&journal, at, at_bytes.clone());
        finished(&journal, over, over_bytes.clone());
        for id in [at, over] {
            let seq = journal
                .history(id)
                .expect("history")
                .iter()
                .find(|e| matches!(e.kind, opjournal::EventKind::Completed { .. }))
                .map(|e| e.seq)
                .expect("a completion");
            assert!(seq < 251, "the completion seq {seq} takes one byte");
        }
        let check = |journal: &Journal, when: &str| {
            assert!(replayed(journal, at) == at_bytes, "{at} {when}");
            assert!(replayed(journal, over) == over_bytes, "{over} {when}");
        };
        check(&journal, "before a checkpoint");
        journal
            .reclaim_space()
            .expect("a checkpoint (and compaction)");
        check(&journal, "after a checkpoint");
        journal.close().expect("close");
        assert_eq!(stored(&path, at), Ok(INLINE_MAX), "{at} is inline");
        assert_eq!(
            stored(&path, over),
            Err(INLINE_MAX + 1),
            "{over} is in `results`"
        );
        let journal = open();
        check(&journal, "after a reopen");
        assert_eq!(journal.stats().expect("stats").results, 2);
        drop(journal);
        let report = opjournal::verify(&path).expect("verify");
        assert!(report.is_clean(), "{:?}", report.findings);
    }
}
