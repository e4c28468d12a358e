//! Every row of DESIGN.md §4 (what `submit` answers), and every typed refusal, with proof
//! that a refusal writes nothing: the bytes of both files (the journal and its log, where
//! every commit lands first), receipts and events unchanged.

mod common;

use std::time::Duration;

use common::{Env, FakeEditor, add_light, fresh, run_op};
use opjournal::{
    Admission, ErrorKind, ExecutionStatus, FileLog, Intent, Journal, Operation, Outcome, Resolution,
};

/// The bytes of the journal file and of its log. Every commit appends to the log (the
/// commit point); the journal file changes only at a checkpoint, so a check of it alone
/// would miss a stray commit. While a journal is open its log exists: a missing log fails
/// here rather than comparing two absent files.
fn disk(env: &Env) -> (Vec<u8>, Vec<u8>) {
    let log = FileLog::path_for(&env.path);
    let log = std::fs::read(&log)
        .unwrap_or_else(|e| panic!("the open journal's log {}: {e}", log.display()));
    (env.bytes(), log)
}

/// Asserts that both files are as `before`, naming which one changed.
fn assert_unwritten(env: &Env, before: &(Vec<u8>, Vec<u8>), what: &str) {
    let (db, log) = disk(env);
    assert!(db == before.0, "{what} changed the journal file's bytes");
    assert!(log == before.1, "{what} wrote to the journal's log");
}

/// Runs `f`, expects a refusal, and checks that nothing changed on disk or in the journal.
/// Pending deliveries and acknowledgements are committed first, and again after the
/// refusal: a refused lazy call that left an entry behind would be written then.
fn refused(
    env: &Env,
    journal: &Journal,
    watch: &str,
    f: impl FnOnce() -> opjournal::Result<()>,
) -> opjournal::Error {
    journal.flush().expect("flush before the refusal");
    let before_bytes = disk(env);
    let before = common::snapshot(journal, watch);
    let err = match f() {
        Ok(()) => panic!("expected a refusal"),
        Err(e) => e,
    };
    assert!(err.is_refusal(), "{err:?}");
    assert_eq!(
        common::snapshot(journal, watch),
        before,
        "journal changed by {err}"
    );
    journal.flush().expect("flush after the refusal");
    assert_unwritten(env, &before_bytes, &format!("the refusal {err}"));
    err
}

fn op(id: &str) -> Operation {
    Operation::new(id, add_light("door"))
        .scope("scene")
        .session("tab")
}

#[test]
fn unknown_id_is_fresh() -> opjournal::Result<()> {
    let env = Env::new();
    let journal = env.open();
    let claim = fresh(&journal, op("a"));
    assert_eq!(claim.attempt(), 1);
    assert_eq!(claim.operation_id(), "a");
    assert_eq!(
        journal.lookup("a")?.map(|r| r.status),
        Some(ExecutionStatus::Running)
    );
    Ok(())
}

#[test]
fn released_id_is_fresh_again_as_the_next_attempt() -> opjournal::Result<()> {
    let env = Env::new();
    let journal = env.open();
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
    let names: Vec<&str> = journal
        .history("a")?
        .iter()
        .map(|e| e.kind.name())
        .collect();
    assert_eq!(names, ["submitted", "released", "submitted"]);
    Ok(())
}

#[test]
fn purged_id_is_fresh_again_from_attempt_one() -> opjournal::Result<()> {
    let env = Env::new();
    let mut editor = FakeEditor::at(0);
    let journal = env.open();
    run_op(&journal, &mut editor, op("a"), "light")?;
    env.advance(Duration::from_secs(90 * 24 * 3600));
    assert_eq!(journal.lookup("a")?, None);
    let claim = fresh(&journal, op("a"));
    assert_eq!(claim.attempt(), 1);
    // The old history went with the purge.
    let names: Vec<&str> = journal
        .history("a")?
        .iter()
        .map(|e| e.kind.name())
        .collect();
    assert_eq!(names, ["submitted"]);
    Ok(())
}

#[test]
fn running_id_with_same_intent_attaches_and_other_intent_is_refused() -> opjournal::Result<()> {
    let env = Env::new();
    let journal = env.open();
    fresh(&journal, op("a"));
    let Admission::InProgress(r) = journal.submit(op("a"))? else {
        panic!("expected InProgress");
    };
    assert_eq!(r.status, ExecutionStatus::Running);
    let err = refused(&env, &journal, "a", || {
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

#[test]
fn applied_and_failed_ids_replay_and_other_intents_are_refused() -> opjournal::Result<()> {
    let env = Env::new();
    let mut editor = FakeEditor::at(0);
    let journal = env.open();
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
    let Admission::Replay(bad) = journal.submit(Operation::new("bad", add_light("roof")))? else {
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
        let err = refused(&env, &journal, id, || {
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

#[test]
fn retired_id_answers_expired_and_other_intent_is_refused() -> opjournal::Result<()> {
    let env = Env::new();
    let mut editor = FakeEditor::at(0);
    let journal = env.open();
    run_op(&journal, &mut editor, op("a"), "light")?;
    env.advance(Duration::from_secs(8 * 24 * 3600));
    let Admission::Expired(audit) = journal.submit(op("a"))? else {
        panic!("expected Expired");
    };
    assert_eq!(audit.status, ExecutionStatus::Retired);
    assert_eq!(audit.result_revision, Some(1));
    let err = refused(&env, &journal, "a", || {
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

#[test]
fn in_doubt_id_answers_in_doubt_and_other_intent_is_refused() -> opjournal::Result<()> {
    let env = Env::new();
    let journal = env.open();
    fresh(&journal, op("a"));
    env.advance(Duration::from_secs(5 * 60));
    let Admission::InDoubt(r) = journal.submit(op("a"))? else {
        panic!("expected InDoubt after the lease expired");
    };
    assert_eq!(r.status, ExecutionStatus::InDoubt);
    let err = refused(&env, &journal, "a", || {
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

#[test]
fn lookup_comes_before_the_fresh_work_checks() -> opjournal::Result<()> {
    let env = Env::new();
    let mut editor = FakeEditor::at(183);
    let journal = env.open();
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

#[test]
fn stale_base_is_refused_with_scope_base_and_current_unless_relaxed() -> opjournal::Result<()> {
    let env = Env::new();
    let journal = env.open();
    journal.advance_revision("scene", 10)?;
    let err = refused(&env, &journal, "a", || {
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

#[test]
fn busy_scope_is_refused_naming_the_holder() -> opjournal::Result<()> {
    let env = Env::new();
    let journal = env.open();
    fresh(&journal, op("a"));
    let err = refused(&env, &journal, "b", || journal.submit(op("b")).map(drop));
    assert!(
        matches!(err.kind(), ErrorKind::ScopeBusy { scope, holder } if scope == "scene" && holder == "a"),
        "{err:?}"
    );
    // Another scope is independent.
    fresh(&journal, Operation::new("c", add_light("x")).scope("other"));
    Ok(())
}

#[test]
fn full_window_is_refused_naming_oldest_and_when_it_frees() -> opjournal::Result<()> {
    let env = Env::new();
    let mut editor = FakeEditor::at(0);
    let journal = env.builder().session_window(2).open(&env.path)?;
    run_op(
        &journal,
        &mut editor,
        Operation::new("a", add_light("1")).session("tab"),
        "1",
    )?;
    env.advance(Duration::from_secs(1));
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
    let err = refused(&env, &journal, "c", || {
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

#[test]
fn invalid_ids_scopes_and_sessions_are_refused_before_anything_else() -> opjournal::Result<()> {
    let env = Env::new();
    let journal = env.open();
    let long = "x".repeat(257);
    let cases = [
        Operation::new("", add_light("x")),
        Operation::new(long.as_str(), add_light("x")),
        Operation::new("op\n1", add_light("x")),
        Operation::new("ok", add_light("x")).scope(""),
        Operation::new("ok", add_light("x")).session("tab\u{7}"),
    ];
    for o in cases {
        let err = refused(&env, &journal, o.id(), || {
            journal.submit(o.clone()).map(drop)
        });
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

#[test]
fn oversized_result_is_refused_and_the_claim_stays_usable() -> opjournal::Result<()> {
    let env = Env::new();
    let journal = env.builder().max_result_bytes(1024).open(&env.path)?;
    let claim = fresh(&journal, op("a"));
    let err = refused(&env, &journal, "a", || {
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

#[test]
fn revision_that_does_not_move_forward_is_refused() -> opjournal::Result<()> {
    let env = Env::new();
    let journal = env.open();
    journal.advance_revision("scene", 5)?;
    let claim = fresh(&journal, op("a").base_revision(5));
    let err = refused(&env, &journal, "a", || {
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
    let err = refused(&env, &journal, "a", || {
        journal.advance_revision("scene", 4).map(drop)
    });
    assert!(
        matches!(err.kind(), ErrorKind::RevisionNotForward { .. }),
        "{err:?}"
    );
    // Reporting the current revision again is a no-op, not an error, and writes nothing.
    let before = disk(&env);
    assert_eq!(journal.advance_revision("scene", 5)?, 5);
    assert_unwritten(&env, &before, "reporting the current revision again");
    journal.complete(&claim, Outcome::applied(6, Vec::new()))?;
    assert_eq!(journal.scope_revision("scene")?, 6);
    Ok(())
}

#[test]
fn calls_on_the_wrong_state_or_unknown_ids_are_refused() -> opjournal::Result<()> {
    let env = Env::new();
    let mut editor = FakeEditor::at(0);
    let journal = env.open();
    run_op(&journal, &mut editor, op("done"), "x")?;
    fresh(&journal, Operation::new("running", add_light("y")));
    let err = refused(&env, &journal, "done", || {
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
    let err = refused(&env, &journal, "running", || {
        journal
            .resolve("running", Resolution::not_applied())
            .map(drop)
    });
    assert!(
        matches!(err.kind(), ErrorKind::InvalidState { .. }),
        "{err:?}"
    );
    let err = refused(&env, &journal, "running", || {
        journal.acknowledge("running", Some("tab")).map(drop)
    });
    assert!(
        matches!(err.kind(), ErrorKind::InvalidState { .. }),
        "{err:?}"
    );
    let err = refused(&env, &journal, "running", || {
        journal.delivered("running").map(drop)
    });
    assert!(
        matches!(err.kind(), ErrorKind::InvalidState { .. }),
        "{err:?}"
    );
    for call in [
        Box::new(|| journal.acknowledge("nope", Some("tab")).map(drop))
            as Box<dyn Fn() -> opjournal::Result<()>>,
        Box::new(|| journal.delivered("nope").map(drop)),
        Box::new(|| journal.resolve("nope", Resolution::not_applied()).map(drop)),
    ] {
        let err = refused(&env, &journal, "nope", call);
        assert!(
            matches!(err.kind(), ErrorKind::UnknownOperation { operation_id } if operation_id == "nope"),
            "{err:?}"
        );
    }
    // Acknowledging twice is idempotent and the second one writes nothing: the first is
    // committed before the bytes are taken, and a flush after the second would write
    // anything it had left pending.
    journal.acknowledge("done", Some("tab"))?;
    journal.flush()?;
    let before = disk(&env);
    journal.acknowledge("done", Some("tab"))?;
    journal.flush()?;
    assert_unwritten(&env, &before, "a second acknowledgement");
    Ok(())
}

#[test]
fn replayed_answers_write_nothing() -> opjournal::Result<()> {
    let env = Env::new();
    let mut editor = FakeEditor::at(0);
    let journal = env.open();
    run_op(&journal, &mut editor, op("a"), "x")?;
    let before = disk(&env);
    for _ in 0..10 {
        let Admission::Replay(_) = journal.submit(op("a"))? else {
            panic!("expected a replay");
        };
    }
    assert_unwritten(&env, &before, "a replay");
    Ok(())
}

#[test]
fn messages_name_the_values_and_the_next_step() {
    let env = Env::new();
    let journal = env.open();
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
}

#[test]
fn acknowledging_another_sessions_result_is_refused_and_writes_nothing() -> opjournal::Result<()> {
    let env = Env::new();
    let mut editor = FakeEditor::at(0);
    let journal = env.open();
    run_op(&journal, &mut editor, op("mine"), "x")?;
    journal.delivered("mine")?;
    journal.flush()?;
    for caller in [Some("other-tab"), None] {
        let err = refused(&env, &journal, "mine", || {
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
    assert_eq!(acked.delivery, Some(opjournal::DeliveryState::Acknowledged));
    assert!(journal.undelivered("tab")?.is_empty());
    Ok(())
}

#[test]
fn an_operation_without_a_session_may_be_acknowledged_by_any_caller() -> opjournal::Result<()> {
    let env = Env::new();
    let mut editor = FakeEditor::at(0);
    let journal = env.open();
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
            Some(opjournal::DeliveryState::Acknowledged),
            "{id} acknowledged by {caller:?}"
        );
    }
    Ok(())
}

#[test]
fn replays_served_from_the_replay_cache_show_every_later_commit() -> opjournal::Result<()> {
    let env = Env::new();
    let mut editor = FakeEditor::at(0);
    let journal = env.open();
    let op = || {
        Operation::new("op_c", add_light("c"))
            .scope("scene/main")
            .session("tab-1")
    };
    run_op(&journal, &mut editor, op(), "c")?;
    let replay = |journal: &Journal| -> opjournal::Result<opjournal::Replay> {
        match journal.submit(op())? {
            Admission::Replay(r) => Ok(r),
            other => panic!("expected a replay, got {other:?}"),
        }
    };
    // The first replay reads the index; the second reads it and keeps the answer (an id
    // asked twice is worth keeping); the third is served from the cache.
    assert_eq!(replay(&journal)?.receipt.delivery_count, 0);
    assert_eq!(replay(&journal)?.receipt.delivery_count, 0);
    let third = replay(&journal)?;
    assert_eq!(third.result.bytes, b"c".to_vec());
    let stats = journal.stats()?;
    assert!(stats.replay_cache.hits >= 1, "{:?}", stats.replay_cache);
    assert_eq!(stats.replay_cache.entries, 1);
    // A delivery (lazy) and its commit show in the next replay, cached or not.
    journal.delivered("op_c")?;
    assert_eq!(replay(&journal)?.receipt.delivery_count, 1);
    journal.flush()?;
    assert_eq!(replay(&journal)?.receipt.delivery_count, 1);
    journal.acknowledge("op_c", Some("tab-1"))?;
    journal.flush()?;
    assert_eq!(
        replay(&journal)?.receipt.delivery,
        Some(opjournal::DeliveryState::Acknowledged)
    );
    // Past the result retention the cached result is not served: the answer is Expired.
    env.advance(Duration::from_secs(8 * 24 * 3600));
    assert!(
        matches!(journal.submit(op())?, Admission::Expired(_)),
        "a retired operation answers Expired"
    );
    Ok(())
}

#[test]
fn a_journal_without_a_replay_cache_answers_the_same() -> opjournal::Result<()> {
    let env = Env::new();
    let mut editor = FakeEditor::at(0);
    let journal = env.builder().replay_cache_size(0).open(&env.path)?;
    run_op(
        &journal,
        &mut editor,
        Operation::new("op_n", add_light("n")),
        "n",
    )?;
    for _ in 0..3 {
        let Admission::Replay(r) = journal.submit(Operation::new("op_n", add_light("n")))? else {
            panic!("expected a replay");
        };
        assert_eq!(r.result.bytes, b"n".to_vec());
    }
    let stats = journal.stats()?.replay_cache;
    assert_eq!((stats.entries, stats.hits), (0, 0), "{stats:?}");
    Ok(())
}
