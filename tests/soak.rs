//! A month of editor use in under a minute: 100,000 operations over 30 simulated days,
//! across many sessions and scopes, with clients that never acknowledge, reconnect storms
//! that re-ask old ids, clients that vanish mid-operation, and periodic compaction.
//! It asserts plateaus, not just survival.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{T0, intent};
use opjournal::{
    Admission, DeliveryState, ErrorKind, ExecutionStatus, Journal, ManualClock, Operation, Outcome,
    Resolution, Timestamp,
};

const OPS: u64 = 100_000;
const DAYS: u64 = 30;
const SESSIONS: u64 = 40;
const SCOPES: u64 = 25;
const WINDOW: u32 = 64;
const DAY: Duration = Duration::from_secs(24 * 3600);

/// A small deterministic generator (xorshift), so the soak replays exactly.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A directory where syncs are cheap (tmpfs) when the machine has one.
fn fast_dir() -> tempfile::TempDir {
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir()
        && let Ok(dir) = tempfile::tempdir_in(&shm)
    {
        return dir;
    }
    tempfile::tempdir().expect("a temporary directory")
}

struct Issued {
    session: u64,
    completed_at: Timestamp,
}

#[test]
fn month_long_session_plateaus_and_answers_every_old_id_by_its_age() -> opjournal::Result<()> {
    let started = Instant::now();
    let dir = fast_dir();
    let path = dir.path().join("soak.opj");
    let clock = ManualClock::new(T0);
    let ack_timeout = Duration::from_secs(15 * 60);
    let retention = 2 * DAY;
    let audit = 6 * DAY;
    let journal = Journal::builder()
        .clock(clock.clone())
        .ack_timeout(ack_timeout)
        .result_retention(retention)
        .audit_retention(audit)
        .session_window(WINDOW)
        // The soak is about bounds, not crash recovery: skip recording the allocator
        // state in every commit (quick repair), a third of each commit's work.
        .quick_repair(false)
        .open(&path)?;
    let step = Duration::from_millis(DAYS * DAY.as_millis() as u64 / OPS);
    let rate_per_day = OPS / DAYS;
    let mut rng = Rng(0x5eed_cafe_f00d_1234);
    let mut revisions = BTreeMap::<u64, u64>::new();
    let mut issued: BTreeMap<u64, Issued> = BTreeMap::new();
    let mut applications = BTreeMap::<u64, u32>::new();
    let mut never_acked = 0u64;
    let mut vanished = 0u64;
    let mut busy = 0u64;
    let mut sizes = Vec::new();
    let mut last_hour = 0u64;
    let op_of = |i: u64, session: u64, scope: u64, base: u64| {
        Operation::new(
            format!("op-{i}"),
            intent("scene.edit", serde_json::json!({ "n": i })),
        )
        .scope(format!("scene/{scope}"))
        .base_revision(base)
        .session(format!("tab-{session}"))
    };

    for i in 0..OPS {
        clock.advance(step);
        let session = rng.below(SESSIONS);
        let scope = rng.below(SCOPES);
        let base = revisions.get(&scope).copied().unwrap_or(0);
        let claim = match journal.submit(op_of(i, session, scope, base)) {
            Ok(Admission::Fresh(c)) => c,
            Err(e) if matches!(e.kind(), ErrorKind::ScopeBusy { .. }) => {
                // A vanished client still holds the scope until its lease expires.
                busy += 1;
                continue;
            }
            other => panic!("op-{i}: unexpected {other:?}"),
        };
        if rng.below(200) == 0 {
            // The client vanishes mid-operation: never completed, never released.
            vanished += 1;
            continue;
        }
        let rev = base + 1;
        revisions.insert(scope, rev);
        *applications.entry(i).or_default() += 1;
        journal.complete(&claim, Outcome::applied(rev, vec![b'r'; 64]))?;
        journal.delivered(&format!("op-{i}"))?;
        if rng.below(100) < 12 {
            never_acked += 1;
        } else {
            journal.acknowledge(&format!("op-{i}"), Some(&format!("tab-{session}")))?;
        }
        issued.insert(
            i,
            Issued {
                session,
                completed_at: journal.now(),
            },
        );

        // Every few hundred operations a client reconnects: it pulls what it has not
        // acknowledged and re-asks old ids.
        if i % 500 == 250 {
            let s = rng.below(SESSIONS);
            let pending = journal.undelivered(&format!("tab-{s}"))?;
            assert!(
                pending.len() <= WINDOW as usize,
                "queue of {}",
                pending.len()
            );
            for _ in 0..20 {
                let old = rng.below(i + 1);
                let Some(info) = issued.get(&old) else {
                    continue;
                };
                let now = journal.now();
                let age = now.saturating_since(info.completed_at);
                if age >= audit {
                    assert_eq!(journal.lookup(&format!("op-{old}"))?, None);
                    continue;
                }
                let answer = journal.submit(op_of(old, info.session, 0, 0))?;
                match (&answer, age >= retention) {
                    (Admission::Replay(r), false) => assert!(r.replayed),
                    (Admission::Expired(r), true) => {
                        assert_eq!(r.status, ExecutionStatus::Retired)
                    }
                    _ => panic!("op-{old} aged {age:?} answered {answer:?}"),
                }
            }
        }

        let hour = (clock_ms(&journal) - T0.as_millis()) / 3_600_000;
        if hour != last_hour {
            last_hour = hour;
            // Push what is due, resolve what is in doubt, compact.
            for r in journal.due_redeliveries(1000)? {
                journal.delivered(&r.receipt.operation_id)?;
            }
            for r in journal.in_doubt()? {
                let resolution = if r.operation_id.len() % 2 == 0 {
                    Resolution::not_applied()
                } else {
                    Resolution::failed("the client vanished; nothing was changed")
                };
                journal.resolve(&r.operation_id, resolution)?;
            }
            journal.compact()?;
            if hour.is_multiple_of(24) {
                let day = hour / 24;
                let stats = journal.stats()?;
                let receipts = stats.operations + stats.released;
                // Bounds from rate × retention, with slack for the day's variation.
                let bound = rate_per_day * audit.as_secs() / DAY.as_secs() * 11 / 10 + 500;
                assert!(
                    receipts <= bound,
                    "day {day}: {receipts} receipts > {bound}"
                );
                let open = stats.pending + stats.delivered + stats.exhausted;
                let open_bound = rate_per_day * ack_timeout.as_secs() / DAY.as_secs() * 3 + 100;
                assert!(
                    open <= open_bound,
                    "day {day}: {open} open deliveries > {open_bound}"
                );
                assert!(
                    stats.timers <= 3 * bound,
                    "day {day}: {} timers",
                    stats.timers
                );
                sizes.push((day, stats.file_bytes));
            }
        }
    }

    // Never-acknowledged results expire; new work is never refused for their sake.
    let flood = |k: u64| {
        Operation::new(
            format!("flood-{k}"),
            intent("scene.edit", serde_json::json!(k)),
        )
        .session("flood")
    };
    for k in 0..u64::from(WINDOW) {
        let Admission::Fresh(c) = journal.submit(flood(k))? else {
            panic!("flood-{k} not fresh");
        };
        journal.complete(&c, Outcome::applied(1, Vec::new()))?;
    }
    let err = journal.submit(flood(99)).expect_err("window full");
    assert!(
        matches!(err.kind(), ErrorKind::WindowFull { .. }),
        "{err:?}"
    );
    clock.advance(ack_timeout);
    assert!(matches!(journal.submit(flood(99))?, Admission::Fresh(_)));

    // Every old id answers by its age: retired ones Expired, purged ones unknown.
    let now = journal.now();
    let mut checked = (0, 0, 0);
    for (i, info) in issued.iter().step_by(37) {
        let age = now.saturating_since(info.completed_at);
        let r = journal.lookup(&format!("op-{i}"))?;
        if age >= audit {
            assert_eq!(r, None, "op-{i} aged {age:?}");
            checked.0 += 1;
        } else if age >= retention {
            assert_eq!(
                r.map(|r| r.status),
                Some(ExecutionStatus::Retired),
                "op-{i}"
            );
            checked.1 += 1;
        } else {
            let r = r.expect("live");
            assert_eq!(r.status, ExecutionStatus::Applied);
            assert!(
                r.delivery != Some(DeliveryState::Pending),
                "op-{i} was delivered"
            );
            checked.2 += 1;
        }
    }
    assert!(
        checked.0 > 100 && checked.1 > 10 && checked.2 > 10,
        "{checked:?}"
    );
    assert!(applications.values().all(|&n| n == 1));

    // The workload had what the issue asks for.
    assert!(
        never_acked * 10 >= applications.len() as u64,
        "{never_acked} never acked"
    );
    assert!(vanished > 100, "{vanished} vanished");
    // The file plateaus after the warm-up (audit retention: 6 days).
    let warm = sizes
        .iter()
        .find(|(d, _)| *d == 8)
        .map(|(_, s)| *s)
        .expect("day 8");
    let last = sizes.last().map(|(_, s)| *s).expect("sizes");
    assert!(
        last <= warm * 3 / 2,
        "file grew from {warm} to {last}: {sizes:?}"
    );
    eprintln!(
        "soak: {OPS} ops over {DAYS} days in {:?}; {never_acked} never acked, {vanished} vanished, {busy} scope-busy; file {warm} -> {last} bytes",
        started.elapsed()
    );
    drop(journal);
    let report = opjournal::verify(&path)?;
    assert!(
        report.is_clean(),
        "{:?}",
        &report.findings[..report.findings.len().min(5)]
    );
    Ok(())
}

fn clock_ms(journal: &Journal) -> u64 {
    journal.now().as_millis()
}
