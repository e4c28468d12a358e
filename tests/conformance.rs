//! One conformance suite for every storage backend: the behaviour of the public API that
//! does not depend on a crash or a restart of the process, as one body per claim run on
//! each backend (`file::claim`, `memory::claim`, `postgres::claim`; the fixture is in
//! tests/common/backends.rs). What a crash, a power cut or a damaged file does is
//! file-specific and stays in its own files (crash.rs, durability_regressions.rs,
//! corruption_sweep.rs, failure_window.rs's crash while running, ...).
//!
//! The suite covers the failure window (DESIGN.md §5: one mutation, a disconnect at every
//! boundary, the journal opened again where the boundary implies a restart, and a fake
//! editor counting how often each effect is applied), every row of what `submit` answers
//! (§4) and every typed refusal, with proof that a refusal writes nothing (receipts,
//! history and events unchanged; on a file, the bytes of the journal and of its log too),
//! the clocks at their exact edges (§6: one millisecond before, at and after each
//! deadline, answered on read before compaction and identically after it), fencing by
//! the lease epoch, `Journal::execute`, delivery and its ownership, and the counts of
//! `stats`.
//!
//! On PostgreSQL (feature `postgres`) the tests start one private server per test binary
//! (`opjournal_testkit::pg::PgCluster`) and skip, with a line on stderr, where PostgreSQL
//! is not installed (unless `OPJOURNAL_PG_REQUIRED=1`).

mod common;

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::backends::{Backend, Fixture};
use common::{FakeEditor, T0, add_light, fresh, run_op, snapshot};
use opjournal::{
    Admission, DeliveryState, ErrorKind, EventKind, ExecuteError, Executed, ExecutionStatus,
    Failure, InDoubtCause, Intent, Journal, Operation, Outcome, Resolution, Result, RetryPolicy,
    ScopeLock, Timestamp,
};
use serde::{Deserialize, Serialize};

/// Expands each body into one `#[test]` per backend: `file::name`, `memory::name` and,
/// with the `postgres` feature, `postgres::name` (which passes without running the body
/// where PostgreSQL is not installed).
macro_rules! conformance {
    ($(
        $(#[$meta:meta])*
        fn $name:ident($fx:ident: &Fixture $(,)?) -> $ret:ty $body:block
    )*) => {
        $(
            $(#[$meta])*
            fn $name($fx: &Fixture) -> $ret $body
        )*

        mod file {
            use super::*;
            $(
                #[test]
                fn $name() -> $ret {
                    match Fixture::new(Backend::File, stringify!($name)) {
                        Some(fx) => super::$name(&fx),
                        None => Ok(()),
                    }
                }
            )*
        }

        mod memory {
            use super::*;
            $(
                #[test]
                fn $name() -> $ret {
                    match Fixture::new(Backend::Memory, stringify!($name)) {
                        Some(fx) => super::$name(&fx),
                        None => Ok(()),
                    }
                }
            )*
        }

        #[cfg(feature = "postgres")]
        mod postgres {
            use super::*;
            $(
                #[test]
                fn $name() -> $ret {
                    match Fixture::new(Backend::Postgres, stringify!($name)) {
                        Some(fx) => super::$name(&fx),
                        None => Ok(()),
                    }
                }
            )*
        }
    };
}

// ---------------------------------------------------------------------------------------
// Helpers.
// ---------------------------------------------------------------------------------------

/// The failure window's mutation: a light in `scene/main` at revision 183, from `tab-1`.
fn window_op(id: &str) -> Operation {
    Operation::new(id, add_light("door"))
        .scope("scene/main")
        .base_revision(183)
        .session("tab-1")
}

/// An operation in scope `scene` from session `tab`.
fn op(id: &str) -> Operation {
    Operation::new(id, add_light("door"))
        .scope("scene")
        .session("tab")
}

/// An operation in scope `scene` without a session.
fn scoped(id: &str) -> Operation {
    Operation::new(id, add_light("door")).scope("scene")
}

/// An operation in scope `scene/main`, for `execute`.
fn exec_op(id: &str) -> Operation {
    Operation::new(id, add_light("door")).scope("scene/main")
}

fn status(journal: &Journal, id: &str) -> Option<ExecutionStatus> {
    journal.lookup(id).expect("lookup").map(|r| r.status)
}

fn delivery(journal: &Journal, id: &str) -> Option<DeliveryState> {
    journal.lookup(id).expect("lookup").and_then(|r| r.delivery)
}

/// The names of the operation's events, oldest first.
fn event_names(journal: &Journal, id: &str) -> Vec<&'static str> {
    journal
        .history(id)
        .expect("history")
        .iter()
        .map(|e| e.kind.name())
        .collect()
}

/// What a "nothing was written" check compares: the events, and on a file the bytes of
/// the journal and of its log (every commit appends to the log).
#[derive(PartialEq)]
struct Written {
    events: u64,
    bytes: Option<(Vec<u8>, Vec<u8>)>,
}

fn written(fx: &Fixture, journal: &Journal) -> Written {
    Written {
        events: journal.event_count().expect("event count"),
        bytes: fx.stored_bytes(),
    }
}

/// Asserts that nothing was written since `before`, naming what changed.
fn assert_unwritten(fx: &Fixture, journal: &Journal, before: &Written, what: &str) {
    let now = written(fx, journal);
    assert_eq!(now.events, before.events, "{what} recorded events");
    if let (Some(now), Some(before)) = (&now.bytes, &before.bytes) {
        assert!(now.0 == before.0, "{what} changed the journal file's bytes");
        assert!(now.1 == before.1, "{what} wrote to the journal's log");
    }
}

/// Runs `f`, expects a refusal, and checks that nothing changed in the journal or in what
/// it stores. Pending deliveries and acknowledgements are committed first, and again after
/// the refusal: a refused lazy call that left an entry behind would be written then.
fn refused(
    fx: &Fixture,
    journal: &Journal,
    watch: &str,
    f: impl FnOnce() -> Result<()>,
) -> opjournal::Error {
    journal.flush().expect("flush before the refusal");
    let before_written = written(fx, journal);
    let before = snapshot(journal, watch);
    let err = match f() {
        Ok(()) => panic!("expected a refusal"),
        Err(e) => e,
    };
    assert!(err.is_refusal(), "{err:?}");
    assert_eq!(snapshot(journal, watch), before, "journal changed by {err}");
    journal.flush().expect("flush after the refusal");
    assert_unwritten(fx, journal, &before_written, &format!("the refusal {err}"));
    err
}

fn assert_stale(err: &opjournal::Error) {
    assert!(
        matches!(err.kind(), ErrorKind::StaleClaim { .. }),
        "{err:?}"
    );
}

/// The checks a file journal offers after a test: `verify` finds it clean once closed.
fn verify_if_file(fx: &Fixture) -> Result<()> {
    if let Some(path) = fx.path() {
        let report = opjournal::verify(&path)?;
        assert!(report.is_clean(), "{:?}", report.findings);
    }
    Ok(())
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Added {
    light: String,
}

fn applied_json(revision: u64) -> std::result::Result<Outcome, Failure<String>> {
    Outcome::applied_json(
        revision,
        &Added {
            light: "light-1".into(),
        },
    )
    .map_err(Failure::failed)
}

fn never_runs(_: &opjournal::Claim) -> std::result::Result<Outcome, Failure<String>> {
    panic!("a known operation must not run again")
}

const MINUTE: Duration = Duration::from_secs(60);
const DAY: Duration = Duration::from_secs(24 * 3600);

conformance! {
    // -----------------------------------------------------------------------------------
    // The failure window: one mutation, a disconnect at every boundary.
    // -----------------------------------------------------------------------------------

    fn boundary_1_disconnect_before_accept_lets_the_retry_start_new_work(
        fx: &Fixture,
    ) -> Result<()> {
        let mut editor = FakeEditor::at(183);
        {
            // The client sent op_7f3 but the connection dropped before the service submitted
            // it: nothing is recorded, not even after a restart.
            let journal = fx.open();
            assert_eq!(journal.lookup("op_7f3")?, None);
        }
        let journal = fx.open();
        assert_eq!(journal.lookup("op_7f3")?, None);
        // The retry is fresh work and is applied exactly once.
        let rev = run_op(&journal, &mut editor, window_op("op_7f3"), "light")?;
        assert_eq!(rev, 184);
        assert_eq!(editor.applications("op_7f3"), 1);
        let receipt = journal.lookup("op_7f3")?.expect("recorded");
        assert_eq!(receipt.status, ExecutionStatus::Applied);
        assert_eq!(receipt.attempt, 1);
        Ok(())
    }

    fn boundary_2_disconnect_after_accept_attaches_the_retry_to_the_pending_work(
        fx: &Fixture,
    ) -> Result<()> {
        let mut editor = FakeEditor::at(183);
        let journal = fx.open();
        let claim = fresh(&journal, window_op("op_7f3"));
        // The client disconnects before execution and asks again: it attaches, nothing runs.
        match journal.submit(window_op("op_7f3"))? {
            Admission::InProgress(receipt) => {
                assert_eq!(receipt.status, ExecutionStatus::Running);
                assert_eq!(receipt.epoch, claim.epoch());
            }
            other => panic!("expected InProgress, got {other:?}"),
        }
        assert_eq!(editor.applications("op_7f3"), 0);
        // The service finishes the work it accepted; the client's next question is a replay.
        let rev = editor.apply(&claim, "light");
        journal.complete(&claim, Outcome::applied(rev, b"light-1".to_vec()))?;
        let Admission::Replay(replay) = journal.submit(window_op("op_7f3"))? else {
            panic!("expected a replay after completion");
        };
        assert!(replay.replayed);
        assert_eq!(replay.result.bytes, b"light-1");
        assert_eq!(editor.applications("op_7f3"), 1);
        Ok(())
    }

    fn boundary_3_disconnect_after_commit_replays_the_result_not_the_mutation(
        fx: &Fixture,
    ) -> Result<()> {
        let mut editor = FakeEditor::at(183);
        {
            let journal = fx.open();
            let claim = fresh(&journal, window_op("op_7f3"));
            let rev = editor.apply(&claim, "light");
            journal.complete(
                &claim,
                Outcome::applied(rev, b"light-1".to_vec()).changed_assets(["scene/main/light-1"]),
            )?;
            // The outcome is recorded; the connection (and the service) drop before delivery.
        }
        let journal = fx.open();
        // After the restart the result is waiting for the session...
        let pending = journal.undelivered("tab-1")?;
        assert_eq!(pending.len(), 1);
        assert_eq!(pending[0].receipt.operation_id, "op_7f3");
        // ...and the reconnecting client gets the recorded outcome, marked as a replay.
        let Admission::Replay(replay) = journal.submit(window_op("op_7f3"))? else {
            panic!("expected a replay");
        };
        assert!(replay.replayed);
        assert_eq!(replay.receipt.result_revision, Some(184));
        assert_eq!(replay.receipt.delivery_count, 0);
        assert_eq!(replay.result.bytes, b"light-1");
        assert_eq!(replay.result.changed_assets, vec!["scene/main/light-1"]);
        assert_eq!(editor.applications("op_7f3"), 1);
        assert_eq!(editor.revision, 184);
        Ok(())
    }

    fn boundary_4_reload_after_delivery_gets_a_recognizable_duplicate(fx: &Fixture) -> Result<()> {
        let mut editor = FakeEditor::at(183);
        {
            let journal = fx.open();
            run_op(&journal, &mut editor, window_op("op_7f3"), "light")?;
            let receipt = journal.delivered("op_7f3")?;
            assert_eq!(receipt.delivery_count, 1);
            assert_eq!(receipt.delivery, Some(DeliveryState::Delivered));
            // The tab reloads before acknowledging (and the service restarts too).
        }
        let journal = fx.open();
        let Admission::Replay(replay) = journal.submit(window_op("op_7f3"))? else {
            panic!("expected a replay");
        };
        // Recognizable: marked as a replay, and it says the result was delivered before.
        assert!(replay.replayed);
        assert_eq!(replay.receipt.delivery_count, 1);
        let second = journal.delivered("op_7f3")?;
        assert_eq!(second.delivery_count, 2);
        let acked = journal.acknowledge("op_7f3", Some("tab-1"))?;
        assert_eq!(acked.delivery, Some(DeliveryState::Acknowledged));
        assert_eq!(editor.applications("op_7f3"), 1);
        assert!(journal.undelivered("tab-1")?.is_empty());
        Ok(())
    }

    fn boundary_5_never_acknowledged_results_expire_and_release_window_and_lock(
        fx: &Fixture,
    ) -> Result<()> {
        let mut editor = FakeEditor::at(183);
        let ack_timeout = Duration::from_secs(15 * 60);
        fx.configure(move |b| {
            b.session_window(2)
                .scope_lock(ScopeLock::HoldUntilAck)
                .ack_timeout(ack_timeout)
        });
        let journal = fx.open();
        run_op(&journal, &mut editor, window_op("op_a"), "light")?;
        // Never acknowledged: the hold-until-ack lock keeps the scope...
        let next = Operation::new("op_b", add_light("window"))
            .scope("scene/main")
            .base_revision(184)
            .session("tab-1");
        let err = journal
            .submit(next.clone())
            .expect_err("the scope is held until ack");
        assert!(
            matches!(err.kind(), ErrorKind::ScopeBusy { holder, .. } if holder == "op_a"),
            "{err:?}"
        );
        // ...but independent work proceeds.
        let other = Operation::new("op_c", add_light("desk"))
            .scope("scene/other")
            .session("tab-1");
        let claim = fresh(&journal, other);
        journal.complete(&claim, Outcome::applied(1, b"desk".to_vec()))?;
        // The window of 2 is now full for tab-1.
        let third = Operation::new("op_d", add_light("hall"))
            .scope("scene/third")
            .session("tab-1");
        let err = journal
            .submit(third.clone())
            .expect_err("the window is full");
        assert!(
            matches!(err.kind(), ErrorKind::WindowFull { oldest, limit: 2, .. } if oldest == "op_a"),
            "{err:?}"
        );
        // The service restarts; the acknowledgement timeout passes without any compaction.
        drop(journal);
        fx.advance(ack_timeout);
        let journal = fx.open();
        let a = journal.lookup("op_a")?.expect("kept");
        assert_eq!(a.delivery, Some(DeliveryState::AckExpired));
        assert_eq!(a.status, ExecutionStatus::Applied);
        // Window and lock are free again.
        let rev = run_op(&journal, &mut editor, next, "light 2")?;
        assert_eq!(rev, 185);
        fresh(&journal, third);
        // The audit trail stays, and compaction records the expiry in it.
        let report = journal.compact()?;
        assert_eq!(report.ack_expired, 2);
        assert_eq!(
            event_names(&journal, "op_a"),
            ["submitted", "completed", "ack_expired"]
        );
        assert_eq!(editor.applications("op_a"), 1);
        Ok(())
    }

    fn boundary_6_repeated_reconnects_keep_queue_traffic_and_storage_bounded(
        fx: &Fixture,
    ) -> Result<()> {
        let mut editor = FakeEditor::at(0);
        // Short retentions, so that a few hours of session (600 rounds, a minute each) reach
        // the steady state, and a small log, so that a file journal cycles (checkpoints into
        // the redb file) many times in the session.
        fx.configure(|b| {
            b.session_window(16)
                .result_retention(Duration::from_secs(3600))
                .audit_retention(Duration::from_secs(2 * 3600))
                .checkpoint_size(64 << 10)
        });
        let journal = fx.open();
        let mut events = Vec::new();
        let mut sizes = Vec::new();
        let mut max_queue = 0;
        let mut deliveries = 0u64;
        for round in 0..600u64 {
            // A new operation every round; every third one is never acknowledged.
            let id = format!("op_{round}");
            let base = editor.revision;
            let o = Operation::new(&id, add_light(&format!("spot {round}")))
                .scope("scene/main")
                .base_revision(base)
                .session("agent");
            run_op(&journal, &mut editor, o.clone(), "light")?;
            journal.delivered(&id)?;
            if round % 3 != 0 {
                journal.acknowledge(&id, Some("agent"))?;
            }
            // The agent reconnects: re-asks a recent id and pulls what it has not acknowledged.
            let old = round.saturating_sub(5);
            let again = journal.submit(
                Operation::new(format!("op_{old}"), add_light(&format!("spot {old}")))
                    .scope("scene/main")
                    .base_revision(0)
                    .session("agent"),
            )?;
            assert!(
                matches!(again, Admission::Replay(_)),
                "op_{old} re-asked: {again:?}"
            );
            let queue = journal.undelivered("agent")?;
            max_queue = max_queue.max(queue.len());
            for r in journal.due_redeliveries(100)? {
                journal.delivered(&r.receipt.operation_id)?;
                deliveries += 1;
            }
            fx.advance(MINUTE);
            if round % 25 == 24 {
                journal.compact()?;
                events.push(journal.stats()?.events);
                if let Some(path) = fx.path() {
                    // The journal on disk: the redb file and its log.
                    let log = opjournal::FileLog::path_for(&path);
                    let size = |p: &std::path::Path| std::fs::metadata(p).map_or(0, |m| m.len());
                    sizes.push(size(&path) + size(&log));
                }
            }
        }
        // Every effect once.
        assert!(editor.applied.values().all(|&n| n == 1));
        assert_eq!(editor.applied.len(), 600);
        // The queue never exceeds the unacknowledged results alive within the ack timeout
        // (15 min / 1 min per round = 15 rounds, a third unacknowledged = 5).
        assert!(max_queue <= 6, "queue reached {max_queue}");
        // Retry traffic is bounded by the budget per unacknowledged result.
        assert!(deliveries <= 200 * 8, "{deliveries} redeliveries");
        // What the journal keeps plateaus: after the audit retention (120 rounds) the events
        // stop growing, and so do a file journal's files (sampled every 25 rounds; the
        // ninth sample is past round 200).
        for (what, series) in [("events", &events), ("bytes on disk", &sizes)] {
            let (Some(&warm), Some(&last)) = (series.get(8), series.last()) else {
                continue;
            };
            assert!(
                last <= warm + warm / 3,
                "{what} grew from {warm} to {last}: {series:?}"
            );
        }
        assert_eq!(events.len(), 24);
        Ok(())
    }

    fn aged_out_result_answers_expired_and_is_never_rerun(fx: &Fixture) -> Result<()> {
        let mut editor = FakeEditor::at(183);
        {
            let journal = fx.open();
            run_op(&journal, &mut editor, window_op("op_7f3"), "light")?;
        }
        fx.advance(7 * DAY);
        let journal = fx.open();
        match journal.submit(window_op("op_7f3"))? {
            Admission::Expired(audit) => {
                assert_eq!(audit.status, ExecutionStatus::Retired);
                assert_eq!(audit.applied, Some(true));
                assert_eq!(audit.result_revision, Some(184));
                assert_eq!(audit.base_revision, Some(183));
            }
            other => panic!("expected Expired, got {other:?}"),
        }
        assert_eq!(journal.result("op_7f3")?, None);
        assert_eq!(editor.applications("op_7f3"), 1);
        Ok(())
    }

    fn same_id_with_another_intent_is_refused_with_both_hashes(fx: &Fixture) -> Result<()> {
        let mut editor = FakeEditor::at(183);
        let journal = fx.open();
        run_op(&journal, &mut editor, window_op("op_7f3"), "light")?;
        let other = Operation::new("op_7f3", add_light("window"))
            .scope("scene/main")
            .base_revision(184);
        let err = journal.submit(other.clone()).expect_err("another intent");
        match err.kind() {
            ErrorKind::IntentMismatch {
                operation_id,
                recorded,
                submitted,
            } => {
                assert_eq!(operation_id, "op_7f3");
                // Both under the recorded hash's scheme, so they compare.
                assert!(recorded.matches(&add_light("door")), "{recorded}");
                assert_eq!(Some(*submitted), other.intent().hash_as(recorded.scheme()));
            }
            other => panic!("expected IntentMismatch, got {other:?}"),
        }
        assert_eq!(editor.applications("op_7f3"), 1);
        Ok(())
    }

    fn claim_holder_that_vanished_leaves_the_operation_in_doubt_at_its_lease_never_rerun(
        fx: &Fixture,
    ) -> Result<()> {
        let mut editor = FakeEditor::at(183);
        let journal = fx.open();
        let claim = fresh(&journal, window_op("op_7f3"));
        // The effect lands in the project, then the claim holder stops answering: it never
        // completes, releases or extends, and its lease runs out.
        editor.apply(&claim, "light");
        fx.advance(5 * MINUTE);
        match journal.submit(window_op("op_7f3"))? {
            Admission::InDoubt(receipt) => {
                assert_eq!(receipt.status, ExecutionStatus::InDoubt);
                assert_eq!(receipt.in_doubt_cause, Some(InDoubtCause::LeaseTimeout));
            }
            other => panic!("expected InDoubt, got {other:?}"),
        }
        assert_eq!(journal.compact()?.lease_expired, 1);
        assert_eq!(journal.in_doubt()?.len(), 1);
        // The embedder looks at the project, sees the light, and resolves.
        let receipt = journal
            .resolve("op_7f3", Resolution::applied(184, b"light-1".to_vec()))?
            .expect("resolved as applied");
        assert_eq!(receipt.status, ExecutionStatus::Applied);
        assert!(journal.in_doubt()?.is_empty());
        let Admission::Replay(replay) = journal.submit(window_op("op_7f3"))? else {
            panic!("expected a replay after resolution");
        };
        assert_eq!(replay.receipt.result_revision, Some(184));
        assert_eq!(replay.result.bytes, b"light-1");
        // The old claim's holder is gone; its claim no longer counts.
        let err = journal
            .complete(&claim, Outcome::applied(185, Vec::new()))
            .expect_err("stale claim");
        assert_stale(&err);
        assert_eq!(editor.applications("op_7f3"), 1);
        Ok(())
    }

    // -----------------------------------------------------------------------------------
    // Admission: every row of what `submit` answers, and every typed refusal.
    // -----------------------------------------------------------------------------------

    fn unknown_id_is_fresh(fx: &Fixture) -> Result<()> {
        let journal = fx.open();
        let claim = fresh(&journal, op("a"));
        assert_eq!(claim.attempt(), 1);
        assert_eq!(claim.operation_id(), "a");
        assert_eq!(status(&journal, "a"), Some(ExecutionStatus::Running));
        Ok(())
    }

    fn released_id_is_fresh_again_as_the_next_attempt(fx: &Fixture) -> Result<()> {
        let journal = fx.open();
        let first = fresh(&journal, op("a"));
        journal.release(&first)?;
        assert_eq!(journal.lookup("a")?, None);
        // Any intent may reuse a released id.
        let second = fresh(
            &journal,
            Operation::new("a", add_light("window")).scope("scene"),
        );
        assert_eq!(second.attempt(), 2);
        assert!(second.epoch() > first.epoch());
        assert_eq!(
            event_names(&journal, "a"),
            ["submitted", "released", "submitted"]
        );
        Ok(())
    }

    fn purged_id_is_fresh_again_from_attempt_one(fx: &Fixture) -> Result<()> {
        let mut editor = FakeEditor::at(0);
        let journal = fx.open();
        run_op(&journal, &mut editor, op("a"), "light")?;
        fx.advance(90 * DAY);
        assert_eq!(journal.lookup("a")?, None);
        let claim = fresh(&journal, op("a"));
        assert_eq!(claim.attempt(), 1);
        // The old history went with the purge.
        assert_eq!(event_names(&journal, "a"), ["submitted"]);
        Ok(())
    }

    fn running_id_with_same_intent_attaches_and_other_intent_is_refused(
        fx: &Fixture,
    ) -> Result<()> {
        let journal = fx.open();
        fresh(&journal, op("a"));
        let Admission::InProgress(r) = journal.submit(op("a"))? else {
            panic!("expected InProgress");
        };
        assert_eq!(r.status, ExecutionStatus::Running);
        let err = refused(fx, &journal, "a", || {
            journal
                .submit(Operation::new("a", add_light("window")).scope("scene"))
                .map(drop)
        });
        assert!(
            matches!(err.kind(), ErrorKind::IntentMismatch { .. }),
            "{err:?}"
        );
        Ok(())
    }

    fn applied_and_failed_ids_replay_and_other_intents_are_refused(fx: &Fixture) -> Result<()> {
        let mut editor = FakeEditor::at(0);
        let journal = fx.open();
        run_op(&journal, &mut editor, op("ok"), "light")?;
        let claim = fresh(&journal, Operation::new("bad", add_light("roof")));
        journal.complete(
            &claim,
            Outcome::failed("the roof is not editable").with_result(b"details".to_vec()),
        )?;
        let Admission::Replay(ok) = journal.submit(op("ok"))? else {
            panic!("expected a replay of the applied operation");
        };
        assert!(ok.replayed);
        assert_eq!(ok.receipt.status, ExecutionStatus::Applied);
        let Admission::Replay(bad) = journal.submit(Operation::new("bad", add_light("roof")))?
        else {
            panic!("expected a replay of the failed operation");
        };
        assert!(bad.replayed);
        assert_eq!(bad.receipt.status, ExecutionStatus::Failed);
        assert_eq!(
            bad.receipt.failure.as_deref(),
            Some("the roof is not editable")
        );
        assert_eq!(bad.result.bytes, b"details");
        for id in ["ok", "bad"] {
            let err = refused(fx, &journal, id, || {
                journal
                    .submit(Operation::new(id, add_light("elsewhere")))
                    .map(drop)
            });
            assert!(
                matches!(err.kind(), ErrorKind::IntentMismatch { .. }),
                "{err:?}"
            );
        }
        assert_eq!(editor.applications("ok"), 1);
        Ok(())
    }

    fn retired_id_answers_expired_and_other_intent_is_refused(fx: &Fixture) -> Result<()> {
        let mut editor = FakeEditor::at(0);
        let journal = fx.open();
        run_op(&journal, &mut editor, op("a"), "light")?;
        fx.advance(8 * DAY);
        let Admission::Expired(audit) = journal.submit(op("a"))? else {
            panic!("expected Expired");
        };
        assert_eq!(audit.status, ExecutionStatus::Retired);
        assert_eq!(audit.result_revision, Some(1));
        let err = refused(fx, &journal, "a", || {
            journal
                .submit(Operation::new("a", add_light("x")))
                .map(drop)
        });
        assert!(
            matches!(err.kind(), ErrorKind::IntentMismatch { .. }),
            "{err:?}"
        );
        Ok(())
    }

    fn in_doubt_id_answers_in_doubt_and_other_intent_is_refused(fx: &Fixture) -> Result<()> {
        let journal = fx.open();
        fresh(&journal, op("a"));
        fx.advance(5 * MINUTE);
        let Admission::InDoubt(r) = journal.submit(op("a"))? else {
            panic!("expected InDoubt after the lease expired");
        };
        assert_eq!(r.status, ExecutionStatus::InDoubt);
        let err = refused(fx, &journal, "a", || {
            journal
                .submit(Operation::new("a", add_light("x")))
                .map(drop)
        });
        assert!(
            matches!(err.kind(), ErrorKind::IntentMismatch { .. }),
            "{err:?}"
        );
        Ok(())
    }

    fn lookup_comes_before_the_fresh_work_checks(fx: &Fixture) -> Result<()> {
        let mut editor = FakeEditor::at(183);
        let journal = fx.open();
        let o = op("a").base_revision(183);
        run_op(&journal, &mut editor, o.clone(), "light")?;
        journal.advance_revision("scene", 190)?;
        // The base is now stale, but the id is known: it replays instead of refusing.
        let Admission::Replay(r) = journal.submit(o)? else {
            panic!("expected a replay");
        };
        assert_eq!(r.receipt.result_revision, Some(184));
        Ok(())
    }

    fn stale_base_is_refused_with_scope_base_and_current_unless_relaxed(
        fx: &Fixture,
    ) -> Result<()> {
        let journal = fx.open();
        journal.advance_revision("scene", 10)?;
        let err = refused(fx, &journal, "a", || {
            journal.submit(op("a").base_revision(9)).map(drop)
        });
        match err.kind() {
            ErrorKind::StaleBase {
                scope,
                base,
                current,
            } => assert_eq!((scope.as_str(), *base, *current), ("scene", 9, 10)),
            other => panic!("expected StaleBase, got {other:?}"),
        }
        assert!(
            err.to_string().contains("resubmit against revision 10"),
            "{err}"
        );
        let claim = fresh(&journal, op("a").base_revision(9).allow_stale_base());
        assert_eq!(claim.base_revision(), Some(9));
        Ok(())
    }

    fn busy_scope_is_refused_naming_the_holder(fx: &Fixture) -> Result<()> {
        let journal = fx.open();
        fresh(&journal, op("a"));
        let err = refused(fx, &journal, "b", || journal.submit(op("b")).map(drop));
        assert!(
            matches!(err.kind(), ErrorKind::ScopeBusy { scope, holder } if scope == "scene" && holder == "a"),
            "{err:?}"
        );
        // Another scope is independent.
        fresh(&journal, Operation::new("c", add_light("x")).scope("other"));
        Ok(())
    }

    fn full_window_is_refused_naming_oldest_and_when_it_frees(fx: &Fixture) -> Result<()> {
        let mut editor = FakeEditor::at(0);
        fx.configure(|b| b.session_window(2));
        let journal = fx.open();
        run_op(
            &journal,
            &mut editor,
            Operation::new("a", add_light("1")).session("tab"),
            "1",
        )?;
        fx.advance(Duration::from_secs(1));
        run_op(
            &journal,
            &mut editor,
            Operation::new("b", add_light("2")).session("tab"),
            "2",
        )?;
        let completed_a = journal
            .lookup("a")?
            .and_then(|r| r.completed_at)
            .expect("done");
        let err = refused(fx, &journal, "c", || {
            journal
                .submit(Operation::new("c", add_light("3")).session("tab"))
                .map(drop)
        });
        match err.kind() {
            ErrorKind::WindowFull {
                session,
                limit,
                oldest,
                frees_at,
            } => {
                assert_eq!((session.as_str(), *limit, oldest.as_str()), ("tab", 2, "a"));
                assert_eq!(
                    *frees_at,
                    completed_a.saturating_add(Duration::from_secs(900))
                );
            }
            other => panic!("expected WindowFull, got {other:?}"),
        }
        // An acknowledgement frees a slot at once.
        journal.acknowledge("a", Some("tab"))?;
        fresh(&journal, Operation::new("c", add_light("3")).session("tab"));
        Ok(())
    }

    fn invalid_ids_scopes_and_sessions_are_refused_before_anything_else(
        fx: &Fixture,
    ) -> Result<()> {
        let journal = fx.open();
        let long = "x".repeat(257);
        let cases = [
            Operation::new("", add_light("x")),
            Operation::new(long.as_str(), add_light("x")),
            Operation::new("op\n1", add_light("x")),
            Operation::new("ok", add_light("x")).scope(""),
            Operation::new("ok", add_light("x")).session("tab\u{7}"),
        ];
        for o in cases {
            let err = refused(fx, &journal, o.id(), || journal.submit(o.clone()).map(drop));
            assert!(
                matches!(err.kind(), ErrorKind::InvalidInput { .. }),
                "{err:?}"
            );
        }
        // Exactly 256 bytes is allowed.
        fresh(&journal, Operation::new("y".repeat(256), add_light("x")));
        assert!(Intent::from_bytes("", b"").is_err());
        Ok(())
    }

    fn oversized_result_is_refused_and_the_claim_stays_usable(fx: &Fixture) -> Result<()> {
        fx.configure(|b| b.max_result_bytes(1024));
        let journal = fx.open();
        let claim = fresh(&journal, op("a"));
        let err = refused(fx, &journal, "a", || {
            journal
                .complete(&claim, Outcome::applied(1, vec![0u8; 1025]))
                .map(drop)
        });
        assert!(
            matches!(
                err.kind(),
                ErrorKind::ResultTooLarge {
                    size: 1025,
                    limit: 1024
                }
            ),
            "{err:?}"
        );
        journal.complete(&claim, Outcome::applied(1, vec![0u8; 1024]))?;
        Ok(())
    }

    fn revision_that_does_not_move_forward_is_refused(fx: &Fixture) -> Result<()> {
        let journal = fx.open();
        journal.advance_revision("scene", 5)?;
        let claim = fresh(&journal, op("a").base_revision(5));
        let err = refused(fx, &journal, "a", || {
            journal
                .complete(&claim, Outcome::applied(5, Vec::new()))
                .map(drop)
        });
        assert!(
            matches!(
                err.kind(),
                ErrorKind::RevisionNotForward {
                    revision: 5,
                    current: 5,
                    ..
                }
            ),
            "{err:?}"
        );
        let err = refused(fx, &journal, "a", || {
            journal.advance_revision("scene", 4).map(drop)
        });
        assert!(
            matches!(err.kind(), ErrorKind::RevisionNotForward { .. }),
            "{err:?}"
        );
        // Reporting the current revision again is a no-op, not an error, and writes nothing.
        let before = written(fx, &journal);
        assert_eq!(journal.advance_revision("scene", 5)?, 5);
        assert_unwritten(
            fx,
            &journal,
            &before,
            "reporting the current revision again",
        );
        journal.complete(&claim, Outcome::applied(6, Vec::new()))?;
        assert_eq!(journal.scope_revision("scene")?, 6);
        Ok(())
    }

    fn calls_on_the_wrong_state_or_unknown_ids_are_refused(fx: &Fixture) -> Result<()> {
        let mut editor = FakeEditor::at(0);
        let journal = fx.open();
        run_op(&journal, &mut editor, op("done"), "x")?;
        fresh(&journal, Operation::new("running", add_light("y")));
        let err = refused(fx, &journal, "done", || {
            journal.resolve("done", Resolution::not_applied()).map(drop)
        });
        assert!(
            matches!(
                err.kind(),
                ErrorKind::InvalidState {
                    action: "resolve",
                    ..
                }
            ),
            "{err:?}"
        );
        let err = refused(fx, &journal, "running", || {
            journal
                .resolve("running", Resolution::not_applied())
                .map(drop)
        });
        assert!(
            matches!(err.kind(), ErrorKind::InvalidState { .. }),
            "{err:?}"
        );
        let err = refused(fx, &journal, "running", || {
            journal.acknowledge("running", Some("tab")).map(drop)
        });
        assert!(
            matches!(err.kind(), ErrorKind::InvalidState { .. }),
            "{err:?}"
        );
        let err = refused(fx, &journal, "running", || {
            journal.delivered("running").map(drop)
        });
        assert!(
            matches!(err.kind(), ErrorKind::InvalidState { .. }),
            "{err:?}"
        );
        for call in [
            Box::new(|| journal.acknowledge("nope", Some("tab")).map(drop))
                as Box<dyn Fn() -> Result<()>>,
            Box::new(|| journal.delivered("nope").map(drop)),
            Box::new(|| journal.resolve("nope", Resolution::not_applied()).map(drop)),
        ] {
            let err = refused(fx, &journal, "nope", call);
            assert!(
                matches!(err.kind(), ErrorKind::UnknownOperation { operation_id } if operation_id == "nope"),
                "{err:?}"
            );
        }
        // Acknowledging twice is idempotent and the second one writes nothing: the first is
        // committed before the check, and a flush after the second would write anything it
        // had left pending.
        journal.acknowledge("done", Some("tab"))?;
        journal.flush()?;
        let before = written(fx, &journal);
        journal.acknowledge("done", Some("tab"))?;
        journal.flush()?;
        assert_unwritten(fx, &journal, &before, "a second acknowledgement");
        Ok(())
    }

    fn replayed_answers_write_nothing(fx: &Fixture) -> Result<()> {
        let mut editor = FakeEditor::at(0);
        let journal = fx.open();
        run_op(&journal, &mut editor, op("a"), "x")?;
        let before = written(fx, &journal);
        for _ in 0..10 {
            let Admission::Replay(_) = journal.submit(op("a"))? else {
                panic!("expected a replay");
            };
        }
        assert_unwritten(fx, &journal, &before, "a replay");
        Ok(())
    }

    fn messages_name_the_values_and_the_next_step(fx: &Fixture) -> Result<()> {
        let journal = fx.open();
        fresh(&journal, op("a"));
        let err = journal.submit(op("b")).expect_err("busy");
        let msg = err.to_string();
        assert!(
            msg.contains("`scene`") && msg.contains("`a`") && msg.contains("retry"),
            "{msg}"
        );
        let err = journal
            .submit(Operation::new("", add_light("x")))
            .expect_err("invalid");
        assert!(err.to_string().contains("must not be empty"), "{err}");
        Ok(())
    }

    fn acknowledging_another_sessions_result_is_refused_and_writes_nothing(
        fx: &Fixture,
    ) -> Result<()> {
        let mut editor = FakeEditor::at(0);
        let journal = fx.open();
        run_op(&journal, &mut editor, op("mine"), "x")?;
        journal.delivered("mine")?;
        journal.flush()?;
        for caller in [Some("other-tab"), None] {
            let err = refused(fx, &journal, "mine", || {
                journal.acknowledge("mine", caller).map(drop)
            });
            match err.kind() {
                ErrorKind::NotOwner {
                    operation_id,
                    owner,
                    caller: got,
                } => {
                    assert_eq!(
                        (operation_id.as_str(), owner.as_str(), got.as_deref()),
                        ("mine", "tab", caller)
                    );
                }
                other => panic!("expected NotOwner, got {other:?}"),
            }
            let message = err.to_string();
            assert!(
                message.contains("`mine`") && message.contains("session `tab`"),
                "the message names the operation and its owner: {message}"
            );
        }
        // The result is still waiting for its owner, who may acknowledge it.
        assert_eq!(journal.undelivered("tab")?.len(), 1);
        let acked = journal.acknowledge("mine", Some("tab"))?;
        assert_eq!(acked.delivery, Some(DeliveryState::Acknowledged));
        assert!(journal.undelivered("tab")?.is_empty());
        Ok(())
    }

    fn an_operation_without_a_session_may_be_acknowledged_by_any_caller(
        fx: &Fixture,
    ) -> Result<()> {
        let mut editor = FakeEditor::at(0);
        let journal = fx.open();
        for (id, caller) in [("anon-1", None), ("anon-2", Some("some-tab"))] {
            run_op(
                &journal,
                &mut editor,
                Operation::new(id, add_light(id)).scope("scene"),
                "x",
            )?;
            let acked = journal.acknowledge(id, caller)?;
            assert_eq!(
                acked.delivery,
                Some(DeliveryState::Acknowledged),
                "{id} acknowledged by {caller:?}"
            );
        }
        Ok(())
    }

    fn replays_show_every_later_commit_whether_cached_or_not(fx: &Fixture) -> Result<()> {
        let mut editor = FakeEditor::at(0);
        let journal = fx.open();
        let op = || {
            Operation::new("op_c", add_light("c"))
                .scope("scene/main")
                .session("tab-1")
        };
        run_op(&journal, &mut editor, op(), "c")?;
        let replay = |journal: &Journal| -> Result<opjournal::Replay> {
            match journal.submit(op())? {
                Admission::Replay(r) => Ok(r),
                other => panic!("expected a replay, got {other:?}"),
            }
        };
        // With a replay cache, the first replay reads the index; the second reads it and
        // keeps the answer (an id asked twice is worth keeping); the third is served from
        // the cache.
        assert_eq!(replay(&journal)?.receipt.delivery_count, 0);
        assert_eq!(replay(&journal)?.receipt.delivery_count, 0);
        let third = replay(&journal)?;
        assert_eq!(third.result.bytes, b"c".to_vec());
        let stats = journal.stats()?;
        if fx.backend().caches_replays() {
            assert!(stats.replay_cache.hits >= 1, "{:?}", stats.replay_cache);
            assert_eq!(stats.replay_cache.entries, 1);
        } else {
            assert_eq!(stats.replay_cache.entries, 0, "{:?}", stats.replay_cache);
        }
        // A delivery (lazy) and its commit show in the next replay, cached or not.
        journal.delivered("op_c")?;
        assert_eq!(replay(&journal)?.receipt.delivery_count, 1);
        journal.flush()?;
        assert_eq!(replay(&journal)?.receipt.delivery_count, 1);
        journal.acknowledge("op_c", Some("tab-1"))?;
        journal.flush()?;
        assert_eq!(
            replay(&journal)?.receipt.delivery,
            Some(DeliveryState::Acknowledged)
        );
        // Past the result retention the cached result is not served: the answer is Expired.
        fx.advance(8 * DAY);
        let after = journal.submit(op())?;
        assert!(
            matches!(after, Admission::Expired(_)),
            "a retired operation answers Expired, not {after:?}"
        );
        Ok(())
    }

    fn a_journal_without_a_replay_cache_answers_the_same(fx: &Fixture) -> Result<()> {
        let mut editor = FakeEditor::at(0);
        fx.configure(|b| b.replay_cache_size(0));
        let journal = fx.open();
        run_op(
            &journal,
            &mut editor,
            Operation::new("op_n", add_light("n")),
            "n",
        )?;
        for _ in 0..3 {
            let Admission::Replay(r) = journal.submit(Operation::new("op_n", add_light("n")))?
            else {
                panic!("expected a replay");
            };
            assert_eq!(r.result.bytes, b"n".to_vec());
        }
        let stats = journal.stats()?.replay_cache;
        assert_eq!((stats.entries, stats.hits), (0, 0), "{stats:?}");
        Ok(())
    }

    fn stats_count_operations_by_status_and_delivery(fx: &Fixture) -> Result<()> {
        let mut editor = FakeEditor::at(0);
        let journal = fx.open();
        // In doubt: its lease (5 min) runs out, which frees the scope for "running".
        fresh(&journal, Operation::new("doubt", add_light("d")).scope("a"));
        fx.advance(5 * MINUTE);
        fresh(
            &journal,
            Operation::new("running", add_light("r")).scope("a"),
        );
        let in_session = |id: &str| Operation::new(id, add_light(id)).session("tab");
        for id in ["pending", "delivered", "acked"] {
            fx.advance(Duration::from_secs(1));
            run_op(&journal, &mut editor, in_session(id), id)?;
        }
        journal.delivered("delivered")?;
        journal.acknowledge("acked", Some("tab"))?;
        let failed = fresh(&journal, in_session("failed"));
        journal.complete(&failed, Outcome::failed("no light here"))?;
        let released = fresh(&journal, in_session("released"));
        journal.release(&released)?;
        journal.flush()?;
        let s = journal.stats()?;
        assert_eq!(
            (
                s.operations,
                s.running,
                s.in_doubt,
                s.applied,
                s.failed,
                s.retired
            ),
            (6, 1, 1, 3, 1, 0),
            "operations by status: {s:?}"
        );
        assert_eq!(s.released, 1, "{s:?}");
        // The failed operation's answer waits for delivery too.
        assert_eq!(
            (
                s.pending,
                s.delivered,
                s.acknowledged,
                s.exhausted,
                s.ack_expired
            ),
            (2, 1, 1, 0, 0),
            "terminal operations by delivery: {s:?}"
        );
        assert_eq!(
            s.oldest_unacked.as_ref().map(|o| o.operation_id.as_str()),
            Some("pending")
        );
        // Every event: 1 per submitted-only operation, 2 per outcome, 1 per delivery,
        // acknowledgement or release.
        assert_eq!(s.events, 1 + 1 + 2 + 3 + 3 + 2 + 2, "{s:?}");
        assert_eq!(s.events, journal.event_count()?);
        // The clocks move the counts on read: past every ack timeout the open deliveries
        // expire.
        fx.advance(15 * MINUTE);
        let s = journal.stats()?;
        assert_eq!(
            (s.pending, s.delivered, s.acknowledged, s.ack_expired),
            (0, 0, 1, 3),
            "{s:?}"
        );
        assert_eq!(s.in_doubt, 2, "the running one's lease ran out too: {s:?}");
        // Sizes are of files: a journal in memory or in a database has none, even when a
        // file carries its display name.
        match fx.backend() {
            Backend::File => assert!(s.file_bytes > 0, "{s:?}"),
            Backend::Memory | Backend::Postgres => {
                assert_eq!((s.file_bytes, s.log_bytes), (0, 0), "{s:?}")
            }
        }
        Ok(())
    }

    // -----------------------------------------------------------------------------------
    // The clocks at their exact edges.
    // -----------------------------------------------------------------------------------

    fn lease_expires_exactly_at_its_deadline(fx: &Fixture) -> Result<()> {
        let journal = fx.open();
        let claim = fresh(&journal, op("a"));
        let deadline = claim.lease_until();
        assert_eq!(deadline, T0.saturating_add(5 * MINUTE));
        fx.at(deadline, -1);
        assert_eq!(status(&journal, "a"), Some(ExecutionStatus::Running));
        // The scope is still locked one millisecond before.
        let err = journal.submit(Operation::new("b", add_light("x")).scope("scene"));
        assert!(err.is_err(), "{err:?}");
        assert_eq!(journal.compact()?.lease_expired, 0);
        fx.at(deadline, 0);
        assert_eq!(status(&journal, "a"), Some(ExecutionStatus::InDoubt));
        // Expiry releases the scope lock even before compaction.
        fresh(&journal, Operation::new("b", add_light("x")).scope("scene"));
        fx.at(deadline, 1);
        let before = journal.lookup("a")?;
        assert_eq!(journal.compact()?.lease_expired, 1);
        let after = journal.lookup("a")?.expect("kept");
        assert_eq!(after.status, ExecutionStatus::InDoubt);
        assert_eq!(after.in_doubt_cause, Some(InDoubtCause::LeaseTimeout));
        assert_eq!(before.map(|r| r.status), Some(after.status));
        assert_eq!(journal.in_doubt()?.len(), 1);
        Ok(())
    }

    fn ack_timeout_expires_exactly_at_its_deadline_and_a_late_ack_is_recorded(
        fx: &Fixture,
    ) -> Result<()> {
        let mut editor = FakeEditor::at(0);
        fx.configure(|b| b.session_window(1));
        let journal = fx.open();
        run_op(&journal, &mut editor, op("a"), "x")?;
        let deadline = journal
            .lookup("a")?
            .and_then(|r| r.ack_deadline)
            .expect("deadline");
        assert_eq!(deadline, T0.saturating_add(15 * MINUTE));
        let next = || Operation::new("b", add_light("y")).session("tab");
        fx.at(deadline, -1);
        assert_eq!(delivery(&journal, "a"), Some(DeliveryState::Pending));
        assert!(journal.submit(next()).is_err(), "window of 1 still full");
        assert_eq!(journal.undelivered("tab")?.len(), 1);
        fx.at(deadline, 0);
        assert_eq!(delivery(&journal, "a"), Some(DeliveryState::AckExpired));
        assert!(journal.undelivered("tab")?.is_empty());
        fresh(&journal, next());
        fx.at(deadline, 1);
        assert_eq!(journal.compact()?.ack_expired, 1);
        assert_eq!(delivery(&journal, "a"), Some(DeliveryState::AckExpired));
        // The client finally acknowledges: harmless, and recorded as late.
        let r = journal.acknowledge("a", Some("tab"))?;
        assert_eq!(r.delivery, Some(DeliveryState::Acknowledged));
        // History shows committed events; acknowledgements commit lazily (flush commits now).
        journal.flush()?;
        let last = journal.history("a")?.pop().expect("events");
        assert_eq!(last.kind, EventKind::Acknowledged { late: true });
        Ok(())
    }

    fn result_retention_retires_exactly_at_its_deadline(fx: &Fixture) -> Result<()> {
        let mut editor = FakeEditor::at(0);
        let journal = fx.open();
        run_op(&journal, &mut editor, op("a"), "x")?;
        let deadline = journal
            .lookup("a")?
            .and_then(|r| r.retain_until)
            .expect("deadline");
        assert_eq!(deadline, T0.saturating_add(7 * DAY));
        fx.at(deadline, -1);
        let before = journal.submit(op("a"))?;
        assert!(matches!(before, Admission::Replay(_)), "{before:?}");
        assert!(journal.result("a")?.is_some());
        fx.at(deadline, 0);
        let at = journal.submit(op("a"))?;
        assert!(matches!(at, Admission::Expired(_)), "{at:?}");
        assert_eq!(journal.result("a")?, None);
        fx.at(deadline, 1);
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

    fn audit_retention_purges_exactly_at_its_deadline(fx: &Fixture) -> Result<()> {
        let mut editor = FakeEditor::at(0);
        let journal = fx.open();
        run_op(&journal, &mut editor, op("a"), "x")?;
        let deadline = journal
            .lookup("a")?
            .and_then(|r| r.purge_at)
            .expect("deadline");
        assert_eq!(deadline, T0.saturating_add(90 * DAY));
        fx.at(deadline, -1);
        let before = journal.submit(op("a"))?;
        assert!(matches!(before, Admission::Expired(_)), "{before:?}");
        assert_eq!(journal.history("a")?.len(), 2);
        fx.at(deadline, 0);
        assert_eq!(journal.lookup("a")?, None);
        fx.at(deadline, 1);
        let report = journal.compact()?;
        assert_eq!((report.retired, report.purged), (1, 1));
        assert!(journal.history("a")?.is_empty());
        // The scope keeps its revision through a checkpoint event.
        assert_eq!(journal.scope_revision("scene")?, 1);
        // The id is unknown again: fresh work, attempt 1.
        assert_eq!(fresh(&journal, op("a")).attempt(), 1);
        Ok(())
    }

    fn released_history_is_purged_at_the_audit_retention(fx: &Fixture) -> Result<()> {
        let journal = fx.open();
        let c = fresh(&journal, op("a"));
        journal.release(&c)?;
        let deadline = T0.saturating_add(90 * DAY);
        fx.at(deadline, -1);
        assert_eq!(journal.compact()?.purged, 0);
        assert_eq!(journal.history("a")?.len(), 2);
        fx.at(deadline, 0);
        assert_eq!(journal.compact()?.purged, 1);
        assert!(journal.history("a")?.is_empty());
        Ok(())
    }

    fn backoff_doubles_with_deterministic_full_jitter_up_to_the_cap(fx: &Fixture) -> Result<()> {
        let policy = RetryPolicy {
            attempts: 8,
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(5),
        };
        let run = |fx: &Fixture| -> Result<Vec<u64>> {
            fx.configure(move |b| b.retry_policy(policy));
            let journal = fx.open();
            run_op(&journal, &mut FakeEditor::at(0), op("a"), "x")?;
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
                fx.clock.set(next);
            }
            Ok(delays)
        };
        let first = run(fx)?;
        // The same operation id and epoch in a new journal draw the same jitter.
        let second = run(&fx.sibling())?;
        assert_eq!(first, second);
        assert!(
            first.windows(2).any(|w| w[0] != w[1]),
            "jitter varies by attempt: {first:?}"
        );
        Ok(())
    }

    fn redelivery_is_due_exactly_at_its_time(fx: &Fixture) -> Result<()> {
        let mut editor = FakeEditor::at(0);
        let journal = fx.open();
        run_op(&journal, &mut editor, op("a"), "x")?;
        // A fresh result is due for a push one initial backoff after completion.
        let due = journal
            .lookup("a")?
            .and_then(|r| r.next_delivery_at)
            .expect("due");
        assert_eq!(due, T0.saturating_add(Duration::from_secs(1)));
        fx.at(due, -1);
        assert!(journal.due_redeliveries(10)?.is_empty());
        fx.at(due, 0);
        let list = journal.due_redeliveries(10)?;
        assert_eq!(list.len(), 1);
        assert!(list[0].replayed);
        let r = journal.delivered("a")?;
        let next = r.next_delivery_at.expect("next");
        fx.at(next, -1);
        assert!(journal.due_redeliveries(10)?.is_empty());
        fx.at(next, 0);
        assert_eq!(journal.due_redeliveries(10)?.len(), 1);
        journal.acknowledge("a", Some("tab"))?;
        assert!(journal.due_redeliveries(10)?.is_empty());
        Ok(())
    }

    fn retry_budget_is_exhausted_when_its_last_delivery_is_recorded_and_the_result_stays(
        fx: &Fixture,
    ) -> Result<()> {
        let mut editor = FakeEditor::at(0);
        let policy = RetryPolicy {
            attempts: 3,
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(60),
        };
        fx.configure(move |b| b.retry_policy(policy));
        let journal = fx.open();
        run_op(&journal, &mut editor, op("a"), "x")?;
        for n in 1..=2 {
            let r = journal.delivered("a")?;
            assert_eq!(r.delivery_count, n);
            assert_eq!(r.delivery, Some(DeliveryState::Delivered));
            fx.clock.set(r.next_delivery_at.expect("next push"));
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
        fx.advance(Duration::from_millis(1));
        journal.flush()?;
        assert_eq!(journal.compact()?.exhausted, 1);
        assert_eq!(
            event_names(&journal, "a"),
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
        let again = journal.submit(op("a"))?;
        assert!(matches!(again, Admission::Replay(_)), "{again:?}");
        // And the acknowledgement may still arrive.
        assert_eq!(
            journal.acknowledge("a", Some("tab"))?.delivery,
            Some(DeliveryState::Acknowledged)
        );
        Ok(())
    }

    fn deliveries_after_the_last_attempt_keep_the_budget_spent(fx: &Fixture) -> Result<()> {
        let mut editor = FakeEditor::at(0);
        let policy = RetryPolicy {
            attempts: 2,
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(60),
        };
        fx.configure(move |b| b.retry_policy(policy));
        let journal = fx.open();
        run_op(&journal, &mut editor, op("a"), "x")?;
        journal.delivered("a")?;
        let last = journal.delivered("a")?;
        assert_eq!(last.delivery, Some(DeliveryState::Exhausted));
        // The client keeps asking (replays, each recorded as a delivery): still spent, and
        // nothing is scheduled.
        for n in 3..=7 {
            fx.advance(Duration::from_millis(300));
            let r = journal.delivered("a")?;
            assert_eq!(r.delivery_count, n);
            assert_eq!(r.delivery, Some(DeliveryState::Exhausted), "{r:?}");
            assert_eq!(r.next_delivery_at, None);
        }
        assert_eq!(delivery(&journal, "a"), Some(DeliveryState::Exhausted));
        // An exhausted result is not pushed on reconnect; it is still there when asked for.
        assert!(journal.undelivered("tab")?.is_empty());
        let again = journal.submit(op("a"))?;
        assert!(matches!(again, Admission::Replay(_)), "{again:?}");
        Ok(())
    }

    fn journal_time_never_runs_backwards_even_across_reopen(fx: &Fixture) -> Result<()> {
        let later = Timestamp(T0.as_millis() + 10_000);
        fx.clock.set(later);
        {
            let journal = fx.open();
            fresh(&journal, op("a"));
            fx.clock.set(T0);
            assert_eq!(journal.now(), later);
        }
        // The high-water mark was kept.
        let journal = fx.open();
        assert_eq!(journal.now(), later);
        Ok(())
    }

    fn time_seen_by_reads_does_not_run_backwards_across_a_clean_reopen(fx: &Fixture) -> Result<()> {
        let later = Timestamp(T0.as_millis() + 600_000);
        {
            let journal = fx.open();
            fresh(&journal, op("a"));
            // Only a read observes the later time; no write happens after it.
            fx.clock.set(later);
            assert_eq!(status(&journal, "a"), Some(ExecutionStatus::InDoubt));
            fx.clock.set(T0);
        }
        let journal = fx.open();
        assert_eq!(journal.now(), later);
        assert_eq!(status(&journal, "a"), Some(ExecutionStatus::InDoubt));
        Ok(())
    }

    fn compaction_fires_in_bounded_batches_and_reports_per_clock(fx: &Fixture) -> Result<()> {
        let mut editor = FakeEditor::at(0);
        fx.configure(|b| {
            b.compaction_batch(7)
                .result_retention(Duration::from_secs(3600))
                .audit_retention(Duration::from_secs(7200))
        });
        let journal = fx.open();
        for i in 0..20 {
            run_op(
                &journal,
                &mut editor,
                Operation::new(format!("op{i}"), add_light("x")),
                "x",
            )?;
        }
        // Only what is due costs: 3 more operations completed later are not touched.
        fx.advance(Duration::from_secs(3600));
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
        let before = written(fx, &journal);
        let idle = journal.compact()?;
        assert_eq!((idle.batches, idle.total()), (0, 0));
        assert_unwritten(fx, &journal, &before, "an idle compaction");
        fx.advance(Duration::from_secs(3600));
        let report = journal.compact()?;
        assert_eq!(report.purged, 20);
        assert_eq!(report.retired, 3);
        assert_eq!(journal.stats()?.operations, 3);
        Ok(())
    }

    fn compaction_purges_only_expired_events_when_they_interleave_with_live_ones(
        fx: &Fixture,
    ) -> Result<()> {
        let mut editor = FakeEditor::at(0);
        fx.configure(|b| {
            b.lease(Duration::from_secs(10 * 365 * 24 * 3600))
                .result_retention(Duration::from_secs(3600))
                .audit_retention(Duration::from_secs(7200))
        });
        let journal = fx.open();
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
        fx.advance(Duration::from_secs(7200));
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
        verify_if_file(fx)
    }

    fn background_compactor_fires_due_timers_and_stops_when_asked(fx: &Fixture) -> Result<()> {
        let mut editor = FakeEditor::at(0);
        let journal = fx.open();
        run_op(&journal, &mut editor, op("a"), "x")?;
        let handle = journal.spawn_compactor(Duration::from_millis(5));
        fx.advance(Duration::from_secs(901));
        let mut recorded = false;
        for _ in 0..400 {
            if journal
                .history("a")?
                .iter()
                .any(|e| e.kind == EventKind::AckExpired)
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
        assert!(handle.is_running());
        assert!(handle.stop().is_none());
        Ok(())
    }

    fn background_compaction_never_fails_a_foreground_call_or_shows_half_a_batch(
        fx: &Fixture,
    ) -> Result<()> {
        fx.configure(|b| {
            b.compaction_batch(5)
                .result_retention(Duration::from_secs(1800))
                .audit_retention(Duration::from_secs(3600))
        });
        let journal = Arc::new(fx.open());
        let compactor = journal.spawn_compactor(Duration::from_millis(1));
        let stop = Arc::new(AtomicBool::new(false));
        // Both sides start together: on a loaded machine the reader could otherwise not run
        // before the 400 operations are done (it did, failing `checks > 0`).
        let started = Arc::new(std::sync::Barrier::new(2));
        // A reader checks that every operation it sees is in a state its clocks allow, and
        // that statuses only move forward; it makes one last pass after the stop.
        let reader = {
            let journal = journal.clone();
            let stop = stop.clone();
            let started = started.clone();
            std::thread::spawn(move || -> Result<u64> {
                started.wait();
                let mut checks = 0u64;
                let rank = |s: Option<ExecutionStatus>| match s {
                    Some(ExecutionStatus::Running) => 1,
                    Some(ExecutionStatus::Applied) => 2,
                    Some(ExecutionStatus::Retired) => 3,
                    None => 4,
                    Some(other) => panic!("unexpected status {other:?}"),
                };
                let mut seen = std::collections::HashMap::new();
                loop {
                    let last = stop.load(Ordering::SeqCst);
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
                    if last {
                        break;
                    }
                }
                Ok(checks)
            })
        };
        started.wait();
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
            fx.advance(Duration::from_secs(30));
        }
        stop.store(true, Ordering::SeqCst);
        let checks = reader.join().expect("reader")?;
        assert!(checks > 0);
        assert!(compactor.stop().is_none());
        let report = journal.compact()?;
        assert!(report.total() <= 400 * 3, "{report:?}");
        drop(journal);
        verify_if_file(fx)
    }

    fn completing_with_outcome_starts_every_clock_from_the_outcome(fx: &Fixture) -> Result<()> {
        let journal = fx.open();
        let claim = fresh(&journal, op("a"));
        fx.advance(Duration::from_secs(100));
        let r = journal.complete(&claim, Outcome::applied(1, Vec::new()))?;
        let done = T0.saturating_add(Duration::from_secs(100));
        assert_eq!(r.completed_at, Some(done));
        assert_eq!(r.ack_deadline, Some(done.saturating_add(15 * MINUTE)));
        assert_eq!(r.retain_until, Some(done.saturating_add(7 * DAY)));
        assert_eq!(r.purge_at, Some(done.saturating_add(90 * DAY)));
        assert_eq!(
            r.next_delivery_at,
            Some(done.saturating_add(Duration::from_secs(1)))
        );
        Ok(())
    }

    fn deliveries_and_acks_cost_no_commit_of_their_own_and_ride_the_next_one(
        fx: &Fixture,
    ) -> Result<()> {
        let mut editor = FakeEditor::at(0);
        let journal = fx.open();
        run_op(&journal, &mut editor, op("a"), "x")?;
        let before = written(fx, &journal);
        let r = journal.delivered("a")?;
        assert_eq!(r.delivery_count, 1);
        let r = journal.acknowledge("a", Some("tab"))?;
        assert_eq!(r.delivery, Some(DeliveryState::Acknowledged));
        // Visible to this handle's reads at once...
        assert_eq!(delivery(&journal, "a"), Some(DeliveryState::Acknowledged));
        assert!(journal.undelivered("tab")?.is_empty());
        // ...without a commit...
        assert_unwritten(fx, &journal, &before, "a lazy write");
        // ...and committed by the next state change.
        fresh(&journal, Operation::new("b", add_light("y")).scope("other"));
        assert_eq!(journal.event_count()?, before.events + 3);
        assert_eq!(
            event_names(&journal, "a"),
            ["submitted", "completed", "delivered", "acknowledged"]
        );
        Ok(())
    }

    fn pending_acks_are_committed_when_the_journal_closes(fx: &Fixture) -> Result<()> {
        let mut editor = FakeEditor::at(0);
        {
            let journal = fx.open();
            run_op(&journal, &mut editor, op("a"), "x")?;
            journal.acknowledge("a", Some("tab"))?;
        }
        let journal = fx.open();
        assert_eq!(delivery(&journal, "a"), Some(DeliveryState::Acknowledged));
        assert_eq!(
            event_names(&journal, "a"),
            ["submitted", "completed", "acknowledged"]
        );
        Ok(())
    }

    // -----------------------------------------------------------------------------------
    // Fencing: a claim's lease epoch must be current for complete, release and extend.
    // -----------------------------------------------------------------------------------

    fn claim_of_a_released_attempt_cannot_complete_release_or_extend_the_next_one(
        fx: &Fixture,
    ) -> Result<()> {
        let journal = fx.open();
        let old = fresh(&journal, scoped("a"));
        journal.release(&old)?;
        let new = fresh(&journal, scoped("a"));
        assert_ne!(old.epoch(), new.epoch());
        let before = snapshot(&journal, "a");
        let before_written = written(fx, &journal);
        assert_stale(
            &journal
                .complete(&old, Outcome::applied(1, Vec::new()))
                .expect_err("stale"),
        );
        assert_stale(&journal.release(&old).expect_err("stale"));
        assert_stale(&journal.extend_lease(&old).expect_err("stale"));
        assert_eq!(snapshot(&journal, "a"), before);
        assert_unwritten(fx, &journal, &before_written, "a stale claim");
        // The current claim still works.
        journal.complete(&new, Outcome::applied(1, Vec::new()))?;
        Ok(())
    }

    fn claim_whose_lease_expired_may_still_complete_while_nothing_resolved_it(
        fx: &Fixture,
    ) -> Result<()> {
        let journal = fx.open();
        let claim = fresh(&journal, scoped("a"));
        fx.advance(10 * MINUTE);
        assert_eq!(status(&journal, "a"), Some(ExecutionStatus::InDoubt));
        // Compaction records the expiry; the epoch is unchanged, so the holder may finish.
        assert_eq!(journal.compact()?.lease_expired, 1);
        let receipt = journal.complete(&claim, Outcome::applied(1, b"late".to_vec()))?;
        assert_eq!(receipt.status, ExecutionStatus::Applied);
        Ok(())
    }

    fn claim_cannot_complete_after_the_embedder_resolved_the_operation(fx: &Fixture) -> Result<()> {
        let journal = fx.open();
        let claim = fresh(&journal, scoped("a"));
        fx.advance(10 * MINUTE);
        journal.resolve("a", Resolution::failed("checked: nothing happened"))?;
        let err = journal
            .complete(&claim, Outcome::applied(1, Vec::new()))
            .expect_err("resolved");
        assert_stale(&err);
        assert!(err.to_string().contains("resolved"), "{err}");
        assert_eq!(status(&journal, "a"), Some(ExecutionStatus::Failed));
        Ok(())
    }

    fn claim_cannot_complete_twice(fx: &Fixture) -> Result<()> {
        let journal = fx.open();
        let claim = fresh(&journal, scoped("a"));
        journal.complete(&claim, Outcome::applied(1, b"first".to_vec()))?;
        let err = journal
            .complete(&claim, Outcome::applied(2, b"second".to_vec()))
            .expect_err("already completed");
        assert_stale(&err);
        let Admission::Replay(r) = journal.submit(scoped("a"))? else {
            panic!("expected replay");
        };
        assert_eq!(r.result.bytes, b"first");
        Ok(())
    }

    fn lease_extension_moves_expiry_and_is_refused_once_expired(fx: &Fixture) -> Result<()> {
        let journal = fx.open();
        let claim = fresh(&journal, scoped("a"));
        fx.advance(4 * MINUTE);
        let extended = journal.extend_lease(&claim)?;
        assert_eq!(extended.lease_until(), T0.saturating_add(9 * MINUTE));
        // Past the original lease but within the extension: still running.
        fx.advance(2 * MINUTE);
        assert_eq!(status(&journal, "a"), Some(ExecutionStatus::Running));
        fx.advance(3 * MINUTE);
        let err = journal.extend_lease(&extended).expect_err("expired");
        assert!(
            matches!(err.kind(), ErrorKind::LeaseExpired { expired_at, .. } if *expired_at == extended.lease_until()),
            "{err:?}"
        );
        Ok(())
    }

    fn released_claim_cannot_complete(fx: &Fixture) -> Result<()> {
        let journal = fx.open();
        let claim = fresh(&journal, scoped("a"));
        journal.release(&claim)?;
        assert_stale(
            &journal
                .complete(&claim, Outcome::applied(1, Vec::new()))
                .expect_err("released"),
        );
        assert_eq!(journal.lookup("a")?, None);
        Ok(())
    }

    fn claim_from_before_a_not_applied_resolution_is_stale_for_the_next_attempt(
        fx: &Fixture,
    ) -> Result<()> {
        let journal = fx.open();
        let old = fresh(&journal, scoped("a"));
        fx.advance(6 * MINUTE);
        assert_eq!(journal.resolve("a", Resolution::not_applied())?, None);
        let new = fresh(&journal, scoped("a"));
        assert_eq!(new.attempt(), 2);
        assert_stale(
            &journal
                .complete(&old, Outcome::applied(1, Vec::new()))
                .expect_err("stale"),
        );
        journal.complete(&new, Outcome::applied(1, Vec::new()))?;
        Ok(())
    }

    // -----------------------------------------------------------------------------------
    // `Journal::execute`: every admission, each way the closure can end.
    // -----------------------------------------------------------------------------------

    fn fresh_work_runs_once_and_its_retry_is_replayed_without_running(fx: &Fixture) -> Result<()> {
        let journal = fx.open();
        let runs = Cell::new(0);
        let first = journal
            .execute(exec_op("op_1"), |claim| {
                runs.set(runs.get() + 1);
                assert_eq!(claim.operation_id(), "op_1");
                applied_json(1)
            })
            .unwrap_or_else(|e| panic!("fresh work: {e}"));
        let Executed::Fresh(receipt, result) = &first else {
            panic!("expected fresh work, got {first:?}");
        };
        assert_eq!(receipt.status, ExecutionStatus::Applied);
        assert_eq!(receipt.result_revision, Some(1));
        assert_eq!(result.json::<Added>()?.light, "light-1");
        assert!(!first.is_replay());
        let again = journal
            .execute(exec_op("op_1"), never_runs)
            .unwrap_or_else(|e| panic!("the replay: {e}"));
        assert!(again.is_replay(), "{again:?}");
        assert_eq!(again.result(), first.result());
        assert_eq!(runs.get(), 1);
        Ok(())
    }

    fn a_failure_after_the_effect_started_is_recorded_and_replayed(fx: &Fixture) -> Result<()> {
        let journal = fx.open();
        let answer = journal
            .execute(
                exec_op("op_1"),
                |_| -> std::result::Result<Outcome, Failure<String>> {
                    Err(Failure::Failed("the disk filled up mid-write".into()))
                },
            )
            .unwrap_or_else(|e| panic!("a recorded failure: {e}"));
        let Executed::Fresh(receipt, _) = &answer else {
            panic!("a recorded failure is fresh work, got {answer:?}");
        };
        assert_eq!(receipt.status, ExecutionStatus::Failed);
        assert_eq!(
            receipt.failure.as_deref(),
            Some("the disk filled up mid-write")
        );
        let again = journal
            .execute(exec_op("op_1"), never_runs)
            .unwrap_or_else(|e| panic!("the replay: {e}"));
        assert_eq!(again.receipt().status, ExecutionStatus::Failed);
        assert!(again.is_replay());
        Ok(())
    }

    fn a_rejection_before_any_effect_releases_the_id_for_a_later_attempt(
        fx: &Fixture,
    ) -> Result<()> {
        let journal = fx.open();
        let err = journal
            .execute(
                exec_op("op_1"),
                |_| -> std::result::Result<Outcome, Failure<&str>> {
                    Err(Failure::NotApplied("the door is gone"))
                },
            )
            .expect_err("rejected");
        assert!(
            matches!(err, ExecuteError::NotApplied("the door is gone")),
            "{err:?}"
        );
        assert_eq!(journal.lookup("op_1")?, None, "the id is unknown again");
        // The scope lock was released with the claim, and the next attempt runs.
        let retry = journal
            .execute(exec_op("op_1"), |_| applied_json(1))
            .expect("the retry runs");
        assert_eq!(retry.receipt().attempt, 2);
        Ok(())
    }

    fn known_ids_in_progress_or_in_doubt_are_answered_without_running(fx: &Fixture) -> Result<()> {
        let journal = fx.open();
        let Admission::Fresh(_claim) = journal.submit(exec_op("op_1"))? else {
            panic!("fresh");
        };
        let running = journal
            .execute(exec_op("op_1"), never_runs)
            .expect("answered");
        assert!(
            matches!(&running, Executed::InProgress(r) if r.status == ExecutionStatus::Running),
            "{running:?}"
        );
        assert_eq!(running.result(), None);
        // The claim holder vanished: past its lease the operation is in doubt.
        fx.advance(5 * MINUTE);
        let doubt = journal
            .execute(exec_op("op_1"), never_runs)
            .expect("answered");
        assert!(
            matches!(&doubt, Executed::InDoubt(r) if r.status == ExecutionStatus::InDoubt),
            "{doubt:?}"
        );
        Ok(())
    }

    fn an_aged_out_result_is_answered_expired_without_running(fx: &Fixture) -> Result<()> {
        let journal = fx.open();
        let first = journal
            .execute(exec_op("op_1"), |_| applied_json(1))
            .expect("applied");
        assert!(matches!(first, Executed::Fresh(..)), "{first:?}");
        fx.advance(8 * DAY);
        let expired = journal
            .execute(exec_op("op_1"), never_runs)
            .expect("answered");
        assert!(
            matches!(&expired, Executed::Expired(r) if r.status == ExecutionStatus::Retired),
            "{expired:?}"
        );
        assert_eq!(expired.receipt().result_revision, Some(1));
        Ok(())
    }

    fn a_refused_submit_does_not_run_the_closure(fx: &Fixture) -> Result<()> {
        let journal = fx.open();
        let Admission::Fresh(_holder) = journal.submit(exec_op("op_1"))? else {
            panic!("fresh");
        };
        let err = journal
            .execute(
                exec_op("op_2"),
                |_| -> std::result::Result<Outcome, Failure<std::io::Error>> {
                    panic!("must not run")
                },
            )
            .expect_err("the scope is busy");
        match &err {
            ExecuteError::Journal(e) => {
                assert!(matches!(e.kind(), ErrorKind::ScopeBusy { .. }), "{e:?}");
                assert!(e.is_retryable());
            }
            other => panic!("expected a journal refusal, got {other:?}"),
        }
        assert!(std::error::Error::source(&err).is_some());
        Ok(())
    }

    fn an_outcome_the_journal_refuses_comes_back_with_its_claim_to_complete_again(
        fx: &Fixture,
    ) -> Result<()> {
        let journal = fx.open();
        journal.advance_revision("scene/main", 5)?;
        let err = journal
            .execute(exec_op("op_1").base_revision(5), |_| applied_json(3))
            .expect_err("revision 3 does not move the scope forward");
        let ExecuteError::Unrecorded(unrecorded) = err else {
            panic!("expected an unrecorded outcome, got {err:?}");
        };
        let opjournal::Unrecorded {
            claim,
            outcome,
            error,
            ..
        } = *unrecorded;
        assert!(
            matches!(error.kind(), ErrorKind::RevisionNotForward { .. }),
            "{error:?}"
        );
        assert_eq!(outcome.kind(), Outcome::applied(3, Vec::new()).kind());
        // The claim is still usable: record the corrected outcome.
        let receipt = journal.complete(&claim, Outcome::applied(6, b"fixed".to_vec()))?;
        assert_eq!(receipt.result_revision, Some(6));
        Ok(())
    }

    fn a_panic_in_the_work_is_recorded_as_a_failure_and_re_raised(fx: &Fixture) -> Result<()> {
        let journal = fx.open();
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            journal.execute(
                exec_op("op_1"),
                |_| -> std::result::Result<Outcome, Failure<String>> {
                    panic!("the renderer crashed")
                },
            )
        }));
        let payload = caught.expect_err("the panic continues in the caller");
        assert_eq!(
            payload.downcast_ref::<&str>(),
            Some(&"the renderer crashed")
        );
        let receipt = journal.lookup("op_1")?.expect("recorded");
        assert_eq!(receipt.status, ExecutionStatus::Failed);
        assert_eq!(
            receipt.failure.as_deref(),
            Some("the operation panicked: the renderer crashed")
        );
        Ok(())
    }
}
