//! The clocks (DESIGN.md §6) at their exact edges: one millisecond before, at, and after
//! each deadline, answered on read before compaction and identically after it.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{Env, FakeEditor, T0, add_light, fresh, run_op};
use opjournal::{
    Admission, DeliveryState, ExecutionStatus, InDoubtCause, Journal, Operation, Outcome,
    RetryPolicy, Timestamp,
};

const MS: Duration = Duration::from_millis(1);

fn op(id: &str) -> Operation {
    Operation::new(id, add_light("door"))
        .scope("scene")
        .session("tab")
}

/// Sets the clock to `deadline + offset_ms` (offset may be negative).
fn at(env: &Env, deadline: Timestamp, offset_ms: i64) {
    env.clock
        .set(Timestamp((deadline.as_millis() as i64 + offset_ms) as u64));
}

fn status(journal: &Journal, id: &str) -> Option<ExecutionStatus> {
    journal.lookup(id).expect("lookup").map(|r| r.status)
}

fn delivery(journal: &Journal, id: &str) -> Option<DeliveryState> {
    journal.lookup(id).expect("lookup").and_then(|r| r.delivery)
}

#[test]
fn lease_expires_exactly_at_its_deadline() -> opjournal::Result<()> {
    let env = Env::new();
    let journal = env.open();
    let claim = fresh(&journal, op("a"));
    let deadline = claim.lease_until();
    assert_eq!(deadline, T0.saturating_add(Duration::from_secs(300)));
    at(&env, deadline, -1);
    assert_eq!(status(&journal, "a"), Some(ExecutionStatus::Running));
    // The scope is still locked one millisecond before.
    let err = journal.submit(Operation::new("b", add_light("x")).scope("scene"));
    assert!(err.is_err(), "{err:?}");
    assert_eq!(journal.compact()?.lease_expired, 0);
    at(&env, deadline, 0);
    assert_eq!(status(&journal, "a"), Some(ExecutionStatus::InDoubt));
    // Expiry releases the scope lock even before compaction.
    fresh(&journal, Operation::new("b", add_light("x")).scope("scene"));
    at(&env, deadline, 1);
    let before = journal.lookup("a")?;
    assert_eq!(journal.compact()?.lease_expired, 1);
    let after = journal.lookup("a")?.expect("kept");
    assert_eq!(after.status, ExecutionStatus::InDoubt);
    assert_eq!(after.in_doubt_cause, Some(InDoubtCause::LeaseTimeout));
    assert_eq!(before.map(|r| r.status), Some(after.status));
    assert_eq!(journal.in_doubt()?.len(), 1);
    Ok(())
}

#[test]
fn ack_timeout_expires_exactly_at_its_deadline_and_a_late_ack_is_recorded() -> opjournal::Result<()>
{
    let env = Env::new();
    let mut editor = FakeEditor::at(0);
    let journal = env.builder().session_window(1).open(&env.path)?;
    run_op(&journal, &mut editor, op("a"), "x")?;
    let deadline = journal
        .lookup("a")?
        .and_then(|r| r.ack_deadline)
        .expect("deadline");
    assert_eq!(deadline, T0.saturating_add(Duration::from_secs(900)));
    let next = || Operation::new("b", add_light("y")).session("tab");
    at(&env, deadline, -1);
    assert_eq!(delivery(&journal, "a"), Some(DeliveryState::Pending));
    assert!(journal.submit(next()).is_err(), "window of 1 still full");
    assert_eq!(journal.undelivered("tab")?.len(), 1);
    at(&env, deadline, 0);
    assert_eq!(delivery(&journal, "a"), Some(DeliveryState::AckExpired));
    assert!(journal.undelivered("tab")?.is_empty());
    fresh(&journal, next());
    at(&env, deadline, 1);
    assert_eq!(journal.compact()?.ack_expired, 1);
    assert_eq!(delivery(&journal, "a"), Some(DeliveryState::AckExpired));
    // The client finally acknowledges: harmless, and recorded as late.
    let r = journal.acknowledge("a", Some("tab"))?;
    assert_eq!(r.delivery, Some(DeliveryState::Acknowledged));
    // History shows committed events; acknowledgements commit lazily (flush commits now).
    journal.flush()?;
    let last = journal.history("a")?.pop().expect("events");
    assert_eq!(last.kind, opjournal::EventKind::Acknowledged { late: true });
    Ok(())
}

#[test]
fn result_retention_retires_exactly_at_its_deadline() -> opjournal::Result<()> {
    let env = Env::new();
    let mut editor = FakeEditor::at(0);
    let journal = env.open();
    run_op(&journal, &mut editor, op("a"), "x")?;
    let deadline = journal
        .lookup("a")?
        .and_then(|r| r.retain_until)
        .expect("deadline");
    assert_eq!(
        deadline,
        T0.saturating_add(Duration::from_secs(7 * 24 * 3600))
    );
    at(&env, deadline, -1);
    assert!(matches!(journal.submit(op("a"))?, Admission::Replay(_)));
    assert!(journal.result("a")?.is_some());
    at(&env, deadline, 0);
    assert!(matches!(journal.submit(op("a"))?, Admission::Expired(_)));
    assert_eq!(journal.result("a")?, None);
    at(&env, deadline, 1);
    let report = journal.compact()?;
    assert_eq!(report.retired, 1);
    let r = journal.lookup("a")?.expect("audit record");
    assert_eq!(
        (r.status, r.result_revision),
        (ExecutionStatus::Retired, Some(1))
    );
    assert_eq!(journal.stats()?.results, 0, "the payload was dropped");
    Ok(())
}

#[test]
fn audit_retention_purges_exactly_at_its_deadline() -> opjournal::Result<()> {
    let env = Env::new();
    let mut editor = FakeEditor::at(0);
    let journal = env.open();
    run_op(&journal, &mut editor, op("a"), "x")?;
    let deadline = journal
        .lookup("a")?
        .and_then(|r| r.purge_at)
        .expect("deadline");
    assert_eq!(
        deadline,
        T0.saturating_add(Duration::from_secs(90 * 24 * 3600))
    );
    at(&env, deadline, -1);
    assert!(matches!(journal.submit(op("a"))?, Admission::Expired(_)));
    assert_eq!(journal.history("a")?.len(), 2);
    at(&env, deadline, 0);
    assert_eq!(journal.lookup("a")?, None);
    at(&env, deadline, 1);
    let report = journal.compact()?;
    assert_eq!((report.retired, report.purged), (1, 1));
    assert!(journal.history("a")?.is_empty());
    // The scope keeps its revision through a checkpoint event.
    assert_eq!(journal.scope_revision("scene")?, 1);
    // The id is unknown again: fresh work, attempt 1.
    assert_eq!(fresh(&journal, op("a")).attempt(), 1);
    Ok(())
}

#[test]
fn released_history_is_purged_at_the_audit_retention() -> opjournal::Result<()> {
    let env = Env::new();
    let journal = env.open();
    let c = fresh(&journal, op("a"));
    journal.release(&c)?;
    let deadline = T0.saturating_add(Duration::from_secs(90 * 24 * 3600));
    at(&env, deadline, -1);
    assert_eq!(journal.compact()?.purged, 0);
    assert_eq!(journal.history("a")?.len(), 2);
    at(&env, deadline, 0);
    assert_eq!(journal.compact()?.purged, 1);
    assert!(journal.history("a")?.is_empty());
    Ok(())
}

#[test]
fn backoff_doubles_with_deterministic_full_jitter_up_to_the_cap() -> opjournal::Result<()> {
    let env = Env::new();
    let mut editor = FakeEditor::at(0);
    let policy = RetryPolicy {
        attempts: 8,
        initial_backoff: Duration::from_secs(1),
        max_backoff: Duration::from_secs(5),
    };
    let run = |env: &Env, editor: &mut FakeEditor| -> opjournal::Result<Vec<u64>> {
        let journal = env.builder().retry_policy(policy).open(&env.path)?;
        run_op(&journal, editor, op("a"), "x")?;
        let mut delays = Vec::new();
        for n in 1..=5u32 {
            let now = journal.now();
            let r = journal.delivered("a")?;
            let next = r.next_delivery_at.expect("next push");
            let delay = next.as_millis() - now.as_millis();
            let cap = (1000u64 << (n - 1)).min(5000);
            assert!(
                delay <= cap,
                "attempt {n}: delay {delay} ms above cap {cap}"
            );
            delays.push(delay);
            env.clock.set(next);
        }
        Ok(delays)
    };
    let first = run(&env, &mut editor)?;
    // The same operation id and epoch in a fresh journal draw the same jitter.
    let env2 = Env::new();
    let second = run(&env2, &mut FakeEditor::at(0))?;
    assert_eq!(first, second);
    assert!(
        first.windows(2).any(|w| w[0] != w[1]),
        "jitter varies by attempt: {first:?}"
    );
    Ok(())
}

#[test]
fn redelivery_is_due_exactly_at_its_time() -> opjournal::Result<()> {
    let env = Env::new();
    let mut editor = FakeEditor::at(0);
    let journal = env.open();
    run_op(&journal, &mut editor, op("a"), "x")?;
    // A fresh result is due for a push one initial backoff after completion.
    let due = journal
        .lookup("a")?
        .and_then(|r| r.next_delivery_at)
        .expect("due");
    assert_eq!(due, T0.saturating_add(Duration::from_secs(1)));
    at(&env, due, -1);
    assert!(journal.due_redeliveries(10)?.is_empty());
    at(&env, due, 0);
    let list = journal.due_redeliveries(10)?;
    assert_eq!(list.len(), 1);
    assert!(list[0].replayed);
    let r = journal.delivered("a")?;
    let next = r.next_delivery_at.expect("next");
    at(&env, next, -1);
    assert!(journal.due_redeliveries(10)?.is_empty());
    at(&env, next, 0);
    assert_eq!(journal.due_redeliveries(10)?.len(), 1);
    journal.acknowledge("a", Some("tab"))?;
    assert!(journal.due_redeliveries(10)?.is_empty());
    Ok(())
}

#[test]
fn retry_budget_is_exhausted_when_its_last_delivery_is_recorded_and_the_result_stays()
-> opjournal::Result<()> {
    let env = Env::new();
    let mut editor = FakeEditor::at(0);
    let policy = RetryPolicy {
        attempts: 3,
        initial_backoff: Duration::from_secs(1),
        max_backoff: Duration::from_secs(60),
    };
    let journal = env.builder().retry_policy(policy).open(&env.path)?;
    run_op(&journal, &mut editor, op("a"), "x")?;
    for n in 1..=2 {
        let r = journal.delivered("a")?;
        assert_eq!(r.delivery_count, n);
        assert_eq!(r.delivery, Some(DeliveryState::Delivered));
        env.clock.set(r.next_delivery_at.expect("next push"));
    }
    // The third delivery is the last the budget permits: the receipt it answers already
    // says the budget is spent, and nothing is scheduled after it.
    let last = journal.delivered("a")?;
    assert_eq!(last.delivery_count, 3);
    assert_eq!(last.delivery, Some(DeliveryState::Exhausted), "{last:?}");
    assert_eq!(last.next_delivery_at, None);
    assert_eq!(delivery(&journal, "a"), Some(DeliveryState::Exhausted));
    assert!(journal.undelivered("tab")?.is_empty(), "not pushed again");
    assert!(journal.due_redeliveries(10)?.is_empty(), "no more pushes");
    // The event is recorded when the clock is next applied (here: by compaction).
    env.advance(Duration::from_millis(1));
    journal.flush()?;
    assert_eq!(journal.compact()?.exhausted, 1);
    let kinds: Vec<&str> = journal
        .history("a")?
        .iter()
        .map(|e| e.kind.name())
        .collect();
    assert_eq!(
        kinds,
        [
            "submitted",
            "completed",
            "delivered",
            "delivered",
            "delivered",
            "exhausted"
        ]
    );
    // Still retrievable, by lookup and by a resubmit.
    assert_eq!(journal.result("a")?.map(|r| r.bytes), Some(b"x".to_vec()));
    assert!(matches!(journal.submit(op("a"))?, Admission::Replay(_)));
    // And the acknowledgement may still arrive.
    assert_eq!(
        journal.acknowledge("a", Some("tab"))?.delivery,
        Some(DeliveryState::Acknowledged)
    );
    Ok(())
}

#[test]
fn journal_time_never_runs_backwards_even_across_reopen() -> opjournal::Result<()> {
    let env = Env::new();
    env.clock.set(Timestamp(T0.as_millis() + 10_000));
    {
        let journal = env.open();
        fresh(&journal, op("a"));
        env.clock.set(T0);
        assert_eq!(journal.now(), Timestamp(T0.as_millis() + 10_000));
    }
    // The high-water mark was persisted.
    let journal = env.open();
    assert_eq!(journal.now(), Timestamp(T0.as_millis() + 10_000));
    Ok(())
}

#[test]
fn compaction_fires_in_bounded_batches_and_reports_per_clock() -> opjournal::Result<()> {
    let env = Env::new();
    let mut editor = FakeEditor::at(0);
    let journal = env
        .builder()
        .compaction_batch(7)
        .result_retention(Duration::from_secs(3600))
        .audit_retention(Duration::from_secs(7200))
        .open(&env.path)?;
    for i in 0..20 {
        run_op(
            &journal,
            &mut editor,
            Operation::new(format!("op{i}"), add_light("x")),
            "x",
        )?;
    }
    // Only what is due costs: 3 more operations completed later are not touched.
    env.advance(Duration::from_secs(3600));
    for i in 20..23 {
        run_op(
            &journal,
            &mut editor,
            Operation::new(format!("op{i}"), add_light("x")),
            "x",
        )?;
    }
    let report = journal.compact()?;
    assert_eq!(report.ack_expired, 20);
    assert_eq!(report.retired, 20);
    assert_eq!(report.batches, 3, "20 due operations in batches of 7");
    assert_eq!(report.total(), 40);
    // Nothing due: no batch, nothing written.
    let before = env.bytes();
    let idle = journal.compact()?;
    assert_eq!((idle.batches, idle.total()), (0, 0));
    assert!(env.bytes() == before);
    env.advance(Duration::from_secs(3600));
    let report = journal.compact()?;
    assert_eq!(report.purged, 20);
    assert_eq!(report.retired, 3);
    assert_eq!(journal.stats()?.operations, 3);
    Ok(())
}

#[test]
fn compaction_purges_only_expired_events_when_they_interleave_with_live_ones()
-> opjournal::Result<()> {
    let env = Env::new();
    let mut editor = FakeEditor::at(0);
    let journal = env
        .builder()
        .lease(Duration::from_secs(10 * 365 * 24 * 3600))
        .result_retention(Duration::from_secs(3600))
        .audit_retention(Duration::from_secs(7200))
        .open(&env.path)?;
    // Each finished operation's events sit between the events of operations that stay:
    // the purge deletes runs of neighbouring events with live ones in the gaps.
    let mut live = Vec::new();
    for i in 0..150 {
        run_op(
            &journal,
            &mut editor,
            Operation::new(format!("done{i}"), add_light("x")),
            "x",
        )?;
        let id = format!("live{i}");
        let _claim = fresh(&journal, Operation::new(id.clone(), add_light("y")));
        live.push((id.clone(), journal.history(&id)?));
    }
    env.advance(Duration::from_secs(7200));
    let report = journal.compact()?;
    assert_eq!(report.purged, 150);
    for i in 0..150 {
        assert_eq!(
            journal.lookup(&format!("done{i}"))?,
            None,
            "done{i} is purged"
        );
        assert!(journal.history(&format!("done{i}"))?.is_empty());
    }
    for (id, history) in &live {
        assert_eq!(status(&journal, id), Some(ExecutionStatus::Running), "{id}");
        assert_eq!(&journal.history(id)?, history, "{id} keeps every event");
    }
    drop(journal);
    let verify = opjournal::verify(&env.path)?;
    assert!(verify.findings.is_empty(), "{:?}", verify.findings);
    Ok(())
}

#[test]
fn background_compactor_fires_due_timers_and_stops_on_drop() -> opjournal::Result<()> {
    let env = Env::new();
    let mut editor = FakeEditor::at(0);
    let journal = env.open();
    run_op(&journal, &mut editor, op("a"), "x")?;
    let handle = journal.spawn_compactor(Duration::from_millis(5));
    env.advance(Duration::from_secs(901));
    let mut recorded = false;
    for _ in 0..400 {
        if journal
            .history("a")?
            .iter()
            .any(|e| e.kind == opjournal::EventKind::AckExpired)
        {
            recorded = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        recorded,
        "the background compactor did not record the expiry"
    );
    assert!(handle.stop().is_none());
    Ok(())
}

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

#[test]
fn background_compaction_never_fails_a_foreground_call_or_shows_half_a_batch()
-> opjournal::Result<()> {
    let env = Env::new();
    let journal = Arc::new(
        env.builder()
            .compaction_batch(5)
            .result_retention(Duration::from_secs(1800))
            .audit_retention(Duration::from_secs(3600))
            .open(&env.path)?,
    );
    let compactor = journal.spawn_compactor(Duration::from_millis(1));
    let stop = Arc::new(AtomicBool::new(false));
    // A reader checks that every operation it sees is in a state its clocks allow, and
    // that statuses only move forward.
    let reader = {
        let journal = journal.clone();
        let stop = stop.clone();
        std::thread::spawn(move || -> opjournal::Result<u64> {
            let mut checks = 0u64;
            let rank = |s: Option<ExecutionStatus>| match s {
                Some(ExecutionStatus::Running) => 1,
                Some(ExecutionStatus::Applied) => 2,
                Some(ExecutionStatus::Retired) => 3,
                None => 4,
                Some(other) => panic!("unexpected status {other:?}"),
            };
            let mut seen = std::collections::HashMap::new();
            while !stop.load(Ordering::SeqCst) {
                for i in (0..400).step_by(13) {
                    let id = format!("op{i}");
                    let r = journal.lookup(&id)?;
                    let now = rank(r.as_ref().map(|r| r.status));
                    let prev = seen.insert(id.clone(), now).unwrap_or(0);
                    // Unknown before submission is rank 4 too; only compare known ids.
                    if prev != 4 && prev != 0 {
                        assert!(now >= prev, "{id} went back from {prev} to {now}");
                    }
                    checks += 1;
                }
            }
            Ok(checks)
        })
    };
    let mut editor = FakeEditor::at(0);
    for i in 0..400 {
        let id = format!("op{i}");
        run_op(
            &journal,
            &mut editor,
            Operation::new(&id, add_light("x")),
            "x",
        )?;
        if i % 2 == 0 {
            journal.acknowledge(&id, None)?;
        }
        env.advance(Duration::from_secs(30));
    }
    stop.store(true, Ordering::SeqCst);
    let checks = reader.join().expect("reader")?;
    assert!(checks > 0);
    assert!(compactor.stop().is_none());
    let report = journal.compact()?;
    assert!(report.total() <= 400 * 3, "{report:?}");
    drop(journal);
    let verify = opjournal::verify(&env.path)?;
    assert!(verify.is_clean(), "{:?}", verify.findings);
    Ok(())
}

#[test]
fn completing_with_outcome_starts_every_clock_from_the_outcome() -> opjournal::Result<()> {
    let env = Env::new();
    let journal = env.open();
    let claim = fresh(&journal, op("a"));
    env.advance(Duration::from_secs(100));
    let r = journal.complete(&claim, Outcome::applied(1, Vec::new()))?;
    let done = T0.saturating_add(Duration::from_secs(100));
    assert_eq!(r.completed_at, Some(done));
    assert_eq!(
        r.ack_deadline,
        Some(done.saturating_add(Duration::from_secs(900)))
    );
    assert_eq!(
        r.retain_until,
        Some(done.saturating_add(Duration::from_secs(7 * 24 * 3600)))
    );
    assert_eq!(
        r.purge_at,
        Some(done.saturating_add(Duration::from_secs(90 * 24 * 3600)))
    );
    assert_eq!(r.next_delivery_at, Some(done.saturating_add(MS * 1000)));
    Ok(())
}

#[test]
fn deliveries_and_acks_cost_no_commit_of_their_own_and_ride_the_next_one() -> opjournal::Result<()>
{
    let env = Env::new();
    let mut editor = FakeEditor::at(0);
    let journal = env.open();
    run_op(&journal, &mut editor, op("a"), "x")?;
    let bytes = env.bytes();
    let events = journal.event_count()?;
    let r = journal.delivered("a")?;
    assert_eq!(r.delivery_count, 1);
    let r = journal.acknowledge("a", Some("tab"))?;
    assert_eq!(r.delivery, Some(DeliveryState::Acknowledged));
    // Visible to this handle's reads at once...
    assert_eq!(delivery(&journal, "a"), Some(DeliveryState::Acknowledged));
    assert!(journal.undelivered("tab")?.is_empty());
    // ...without a commit (the file is unchanged)...
    assert!(env.bytes() == bytes, "a lazy write committed on its own");
    assert_eq!(journal.event_count()?, events);
    // ...and committed by the next state change.
    fresh(&journal, Operation::new("b", add_light("y")).scope("other"));
    assert_eq!(journal.event_count()?, events + 3);
    let names: Vec<&str> = journal
        .history("a")?
        .iter()
        .map(|e| e.kind.name())
        .collect();
    assert_eq!(
        names,
        ["submitted", "completed", "delivered", "acknowledged"]
    );
    Ok(())
}

#[test]
fn pending_acks_are_committed_when_the_journal_closes() -> opjournal::Result<()> {
    let env = Env::new();
    let mut editor = FakeEditor::at(0);
    {
        let journal = env.open();
        run_op(&journal, &mut editor, op("a"), "x")?;
        journal.acknowledge("a", Some("tab"))?;
    }
    let journal = env.open();
    assert_eq!(delivery(&journal, "a"), Some(DeliveryState::Acknowledged));
    Ok(())
}

#[test]
fn deliveries_after_the_last_attempt_keep_the_budget_spent() -> opjournal::Result<()> {
    let env = Env::new();
    let mut editor = FakeEditor::at(0);
    let policy = RetryPolicy {
        attempts: 2,
        initial_backoff: Duration::from_secs(1),
        max_backoff: Duration::from_secs(60),
    };
    let journal = env.builder().retry_policy(policy).open(&env.path)?;
    run_op(&journal, &mut editor, op("a"), "x")?;
    journal.delivered("a")?;
    let last = journal.delivered("a")?;
    assert_eq!(last.delivery, Some(DeliveryState::Exhausted));
    // The client keeps asking (replays, each recorded as a delivery): still spent, and
    // nothing is scheduled.
    for n in 3..=7 {
        env.advance(Duration::from_millis(300));
        let r = journal.delivered("a")?;
        assert_eq!(r.delivery_count, n);
        assert_eq!(r.delivery, Some(DeliveryState::Exhausted), "{r:?}");
        assert_eq!(r.next_delivery_at, None);
    }
    assert_eq!(delivery(&journal, "a"), Some(DeliveryState::Exhausted));
    // An exhausted result is not pushed on reconnect; it is still there when asked for.
    assert!(journal.undelivered("tab")?.is_empty());
    assert!(matches!(journal.submit(op("a"))?, Admission::Replay(_)));
    Ok(())
}

#[test]
fn time_seen_by_reads_does_not_run_backwards_across_a_clean_reopen() -> opjournal::Result<()> {
    let env = Env::new();
    {
        let journal = env.open();
        fresh(&journal, op("a"));
        // Only a read observes the later time; no write happens after it.
        env.clock.set(Timestamp(T0.as_millis() + 600_000));
        assert_eq!(status(&journal, "a"), Some(ExecutionStatus::InDoubt));
        env.clock.set(T0);
    }
    let journal = env.open();
    assert_eq!(journal.now(), Timestamp(T0.as_millis() + 600_000));
    assert_eq!(status(&journal, "a"), Some(ExecutionStatus::InDoubt));
    Ok(())
}
