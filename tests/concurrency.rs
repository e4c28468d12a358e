//! Concurrency: one `Journal` shared by many threads, and exclusion between handles.

mod common;

use std::sync::{Arc, Barrier};
use std::thread;

use common::{Env, add_light};
use opjournal::{Admission, ErrorKind, Journal, Operation, Outcome};

#[test]
fn journal_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Journal>();
}

#[test]
fn concurrent_duplicate_submits_get_exactly_one_fresh_claim() -> opjournal::Result<()> {
    let env = Env::new();
    let journal = Arc::new(env.open());
    const THREADS: usize = 8;
    const ROUNDS: usize = 200;
    for round in 0..ROUNDS {
        let barrier = Arc::new(Barrier::new(THREADS));
        let id = format!("op_{round}");
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let journal = journal.clone();
                let barrier = barrier.clone();
                let id = id.clone();
                thread::spawn(move || -> opjournal::Result<(bool, bool)> {
                    let op = Operation::new(&id, add_light("door")).scope(format!("scope-{t}"));
                    barrier.wait();
                    match journal.submit(op)? {
                        Admission::Fresh(claim) => {
                            let rev = round as u64 + 1;
                            journal.complete(&claim, Outcome::applied(rev, id.into_bytes()))?;
                            Ok((true, false))
                        }
                        Admission::InProgress(_) => Ok((false, false)),
                        Admission::Replay(r) => Ok((false, r.replayed)),
                        other => panic!("unexpected {other:?}"),
                    }
                })
            })
            .collect();
        let mut fresh = 0;
        for h in handles {
            let (was_fresh, _) = h.join().expect("thread")?;
            fresh += usize::from(was_fresh);
        }
        assert_eq!(fresh, 1, "round {round}: {fresh} fresh claims");
    }
    // Every operation was applied once and replays afterwards.
    let stats = journal.stats()?;
    assert_eq!(stats.applied, ROUNDS as u64);
    Ok(())
}

#[test]
fn concurrent_independent_lifecycles_share_commits_and_all_land() -> opjournal::Result<()> {
    let env = Env::new();
    let journal = Arc::new(env.open());
    let handles: Vec<_> = (0..8)
        .map(|t| {
            let journal = journal.clone();
            thread::spawn(move || -> opjournal::Result<()> {
                for i in 0..40 {
                    let id = format!("t{t}-{i}");
                    let op = Operation::new(&id, add_light("x")).session(format!("s{t}"));
                    let Admission::Fresh(claim) = journal.submit(op)? else {
                        panic!("fresh expected");
                    };
                    journal.complete(&claim, Outcome::applied(1, Vec::new()))?;
                    journal.acknowledge(&id, Some(&format!("s{t}")))?;
                }
                Ok(())
            })
        })
        .collect();
    for h in handles {
        h.join().expect("thread")?;
    }
    drop(journal);
    // Everything is there after a reopen, and the indexes match the event journal.
    let journal = env.open();
    let stats = journal.stats()?;
    assert_eq!((stats.applied, stats.acknowledged), (320, 320));
    drop(journal);
    let report = opjournal::verify(&env.path)?;
    assert!(report.is_clean(), "{:?}", report.findings);
    Ok(())
}

#[test]
fn second_handle_in_this_process_is_locked_out() {
    let env = Env::new();
    let _journal = env.open();
    let err = env.builder().open(&env.path).expect_err("already open");
    assert!(matches!(err.kind(), ErrorKind::Locked { .. }), "{err:?}");
    assert!(err.to_string().contains("open for writing"), "{err}");
}

/// Run as a child process (`OPJ_CHILD_OPEN` set): tries to open the journal and reports
/// the outcome as its exit code. Run as a test: holds the journal open and checks that a
/// child process is locked out.
#[test]
fn handle_in_another_process_is_locked_out() {
    if let Ok(path) = std::env::var("OPJ_CHILD_OPEN") {
        let code = match Journal::open(&path) {
            Ok(_) => 0,
            Err(e) if matches!(e.kind(), ErrorKind::Locked { .. }) => 3,
            Err(_) => 4,
        };
        std::process::exit(code);
    }
    let env = Env::new();
    let journal = env.open();
    let child = |path: &std::path::Path| {
        std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "--exact",
                "handle_in_another_process_is_locked_out",
                "--nocapture",
            ])
            .env("OPJ_CHILD_OPEN", path)
            .status()
            .expect("child runs")
            .code()
    };
    assert_eq!(child(&env.path), Some(3), "the child was not locked out");
    drop(journal);
    assert_eq!(
        child(&env.path),
        Some(0),
        "the child could not open a closed journal"
    );
}
