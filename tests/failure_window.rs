//! The failure window (DESIGN.md §5): one mutation, a disconnect at every boundary, each
//! against a real file, with the `Journal` dropped and reopened where the boundary implies
//! a restart. The fake editor counts how often each effect is applied.

mod common;

use std::time::Duration;

use common::{Env, FakeEditor, add_light, fresh, run_op};
use opjournal::{
    Admission, DeliveryState, ErrorKind, ExecutionStatus, InDoubtCause, Operation, Outcome,
    Resolution, ScopeLock,
};

fn op(id: &str) -> Operation {
    Operation::new(id, add_light("door"))
        .scope("scene/main")
        .base_revision(183)
        .session("tab-1")
}

#[test]
fn boundary_1_disconnect_before_accept_lets_the_retry_start_new_work() -> opjournal::Result<()> {
    let env = Env::new();
    let mut editor = FakeEditor::at(183);
    {
        // The client sent op_7f3 but the connection dropped before the service submitted
        // it: nothing is recorded, not even after a restart.
        let journal = env.open();
        assert_eq!(journal.lookup("op_7f3")?, None);
    }
    let journal = env.open();
    assert_eq!(journal.lookup("op_7f3")?, None);
    // The retry is fresh work and is applied exactly once.
    let rev = run_op(&journal, &mut editor, op("op_7f3"), "light")?;
    assert_eq!(rev, 184);
    assert_eq!(editor.applications("op_7f3"), 1);
    let receipt = journal.lookup("op_7f3")?.expect("recorded");
    assert_eq!(receipt.status, ExecutionStatus::Applied);
    assert_eq!(receipt.attempt, 1);
    Ok(())
}

#[test]
fn boundary_2_disconnect_after_accept_attaches_the_retry_to_the_pending_work()
-> opjournal::Result<()> {
    let env = Env::new();
    let mut editor = FakeEditor::at(183);
    let journal = env.open();
    let claim = fresh(&journal, op("op_7f3"));
    // The client disconnects before execution and asks again: it attaches, nothing runs.
    match journal.submit(op("op_7f3"))? {
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
    let Admission::Replay(replay) = journal.submit(op("op_7f3"))? else {
        panic!("expected a replay after completion");
    };
    assert!(replay.replayed);
    assert_eq!(replay.result.bytes, b"light-1");
    assert_eq!(editor.applications("op_7f3"), 1);
    Ok(())
}

#[test]
fn boundary_3_disconnect_after_commit_replays_the_result_not_the_mutation() -> opjournal::Result<()>
{
    let env = Env::new();
    let mut editor = FakeEditor::at(183);
    {
        let journal = env.open();
        let claim = fresh(&journal, op("op_7f3"));
        let rev = editor.apply(&claim, "light");
        journal.complete(
            &claim,
            Outcome::applied(rev, b"light-1".to_vec()).changed_assets(["scene/main/light-1"]),
        )?;
        // The outcome is durable; the connection (and the service) drop before delivery.
    }
    let journal = env.open();
    // After the restart the result is waiting for the session...
    let pending = journal.undelivered("tab-1")?;
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].receipt.operation_id, "op_7f3");
    // ...and the reconnecting client gets the recorded outcome, marked as a replay.
    let Admission::Replay(replay) = journal.submit(op("op_7f3"))? else {
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

#[test]
fn boundary_4_reload_after_delivery_gets_a_recognizable_duplicate() -> opjournal::Result<()> {
    let env = Env::new();
    let mut editor = FakeEditor::at(183);
    {
        let journal = env.open();
        run_op(&journal, &mut editor, op("op_7f3"), "light")?;
        let receipt = journal.delivered("op_7f3")?;
        assert_eq!(receipt.delivery_count, 1);
        assert_eq!(receipt.delivery, Some(DeliveryState::Delivered));
        // The tab reloads before acknowledging (and the service restarts too).
    }
    let journal = env.open();
    let Admission::Replay(replay) = journal.submit(op("op_7f3"))? else {
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

#[test]
fn boundary_5_never_acknowledged_results_expire_and_release_window_and_lock()
-> opjournal::Result<()> {
    let env = Env::new();
    let mut editor = FakeEditor::at(183);
    let ack_timeout = Duration::from_secs(15 * 60);
    let builder = || {
        env.builder()
            .session_window(2)
            .scope_lock(ScopeLock::HoldUntilAck)
            .ack_timeout(ack_timeout)
    };
    let journal = builder().open(&env.path)?;
    run_op(&journal, &mut editor, op("op_a"), "light")?;
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
    env.advance(ack_timeout);
    let journal = builder().open(&env.path)?;
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
    let names: Vec<&str> = journal
        .history("op_a")?
        .iter()
        .map(|e| e.kind.name())
        .collect();
    assert_eq!(names, ["submitted", "completed", "ack_expired"]);
    assert_eq!(editor.applications("op_a"), 1);
    Ok(())
}

#[test]
fn boundary_6_repeated_reconnects_keep_queue_traffic_and_file_bounded() -> opjournal::Result<()> {
    let env = Env::new();
    let mut editor = FakeEditor::at(0);
    // Short retentions, so that a few hours of session reach the steady state, and a small
    // log, so that it cycles (checkpoints into the redb file) many times in the session.
    let journal = env
        .builder()
        .session_window(16)
        .result_retention(Duration::from_secs(3600))
        .audit_retention(Duration::from_secs(2 * 3600))
        .checkpoint_size(64 << 10)
        .open(&env.path)?;
    let mut sizes = Vec::new();
    let mut max_queue = 0;
    let mut deliveries = 0u64;
    for round in 0..1200u64 {
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
        let _ = journal.submit(
            Operation::new(format!("op_{old}"), add_light(&format!("spot {old}")))
                .scope("scene/main")
                .base_revision(0)
                .session("agent"),
        )?;
        let queue = journal.undelivered("agent")?;
        max_queue = max_queue.max(queue.len());
        for r in journal.due_redeliveries(100)? {
            journal.delivered(&r.receipt.operation_id)?;
            deliveries += 1;
        }
        env.advance(Duration::from_secs(30));
        if round % 50 == 49 {
            journal.compact()?;
            // The journal on disk: the redb file and its log.
            let log = opjournal::FileLog::path_for(&env.path);
            let size = |p: &std::path::Path| std::fs::metadata(p).map_or(0, |m| m.len());
            sizes.push(size(&env.path) + size(&log));
        }
    }
    // Every effect once.
    assert!(editor.applied.values().all(|&n| n == 1));
    assert_eq!(editor.applied.len(), 1200);
    // The queue never exceeds the unacknowledged results alive within the ack timeout
    // (15 min / 30 s per round = 30 rounds, a third unacknowledged = 10).
    assert!(max_queue <= 11, "queue reached {max_queue}");
    // Retry traffic is bounded by the budget per unacknowledged result.
    assert!(deliveries <= 400 * 8, "{deliveries} redeliveries");
    // The files plateau: after the audit retention (240 rounds) they stop growing.
    let warm = sizes[8];
    let last = *sizes.last().expect("sizes");
    assert!(
        last <= warm + warm / 3,
        "file grew from {warm} to {last}: {sizes:?}"
    );
    Ok(())
}

#[test]
fn aged_out_result_answers_expired_and_is_never_rerun() -> opjournal::Result<()> {
    let env = Env::new();
    let mut editor = FakeEditor::at(183);
    {
        let journal = env.open();
        run_op(&journal, &mut editor, op("op_7f3"), "light")?;
    }
    env.advance(Duration::from_secs(7 * 24 * 3600));
    let journal = env.open();
    match journal.submit(op("op_7f3"))? {
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

#[test]
fn same_id_with_another_intent_is_refused_with_both_hashes() -> opjournal::Result<()> {
    let env = Env::new();
    let mut editor = FakeEditor::at(183);
    let journal = env.open();
    run_op(&journal, &mut editor, op("op_7f3"), "light")?;
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

#[test]
fn crash_while_running_is_in_doubt_on_reopen_and_never_rerun() -> opjournal::Result<()> {
    let env = Env::new();
    let mut editor = FakeEditor::at(183);
    let claim = {
        let journal = env.open();
        let claim = fresh(&journal, op("op_7f3"));
        // The effect lands in the project, then the service dies before completing.
        editor.apply(&claim, "light");
        claim
    };
    let journal = env.open();
    match journal.submit(op("op_7f3"))? {
        Admission::InDoubt(receipt) => {
            assert_eq!(receipt.status, ExecutionStatus::InDoubt);
            assert_eq!(receipt.in_doubt_cause, Some(InDoubtCause::Reopened));
        }
        other => panic!("expected InDoubt, got {other:?}"),
    }
    assert_eq!(journal.in_doubt()?.len(), 1);
    // The embedder looks at the project, sees the light, and resolves.
    let receipt = journal
        .resolve("op_7f3", Resolution::applied(184, b"light-1".to_vec()))?
        .expect("resolved as applied");
    assert_eq!(receipt.status, ExecutionStatus::Applied);
    let Admission::Replay(replay) = journal.submit(op("op_7f3"))? else {
        panic!("expected a replay after resolution");
    };
    assert_eq!(replay.receipt.result_revision, Some(184));
    // The old claim's holder is gone; its claim no longer counts.
    let err = journal
        .complete(&claim, Outcome::applied(185, Vec::new()))
        .expect_err("stale claim");
    assert!(
        matches!(err.kind(), ErrorKind::StaleClaim { .. }),
        "{err:?}"
    );
    assert_eq!(editor.applications("op_7f3"), 1);
    Ok(())
}
