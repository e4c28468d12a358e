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

/// Callers sleep on their own slots and are woken one by one (by the leader that answers
/// them, or to lead the next batch): a lost wake-up would leave a caller asleep for ever.
/// 64 threads with checkpoints every few batches (run by the leader while callers queue),
/// a compaction pass batched on its own, `flush` and `backup` beside them: every call
/// returns (a watchdog turns a hang into a failure), and everything lands.
#[test]
fn sixty_four_callers_with_checkpoints_and_compaction_all_return() -> opjournal::Result<()> {
    const THREADS: usize = 64;
    const EACH: usize = 25;
    let env = Env::new();
    let journal = Arc::new(env.builder().checkpoint_size(64 * 1024).open(&env.path)?);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let journal = journal.clone();
            let done = done_tx.clone();
            thread::spawn(move || -> opjournal::Result<()> {
                let session = format!("s{t}");
                for i in 0..EACH {
                    let id = format!("t{t}-{i}");
                    let op = Operation::new(&id, add_light("x"))
                        .scope(format!("scope-{t}"))
                        .base_revision(i as u64)
                        .session(session.as_str());
                    let Admission::Fresh(claim) = journal.submit(op)? else {
                        panic!("`{id}`: fresh expected");
                    };
                    journal.complete(&claim, Outcome::applied(i as u64 + 1, vec![7; 512]))?;
                    journal.acknowledge(&id, Some(&session))?;
                }
                let _ = done.send(());
                Ok(())
            })
        })
        .collect();
    let side = {
        let journal = journal.clone();
        let dir = env.path.with_extension("backups");
        thread::spawn(move || -> opjournal::Result<()> {
            std::fs::create_dir_all(&dir).expect("a directory for the backups");
            for round in 0..5 {
                journal.compact()?;
                journal.flush()?;
                journal.backup(dir.join(format!("b{round}.opj")))?;
            }
            Ok(())
        })
    };
    drop(done_tx);
    for _ in 0..THREADS {
        done_rx
            .recv_timeout(std::time::Duration::from_secs(120))
            .expect("a caller never returned (a lost wake-up?)");
    }
    for h in workers {
        h.join().expect("worker")?;
    }
    side.join().expect("side thread")?;
    let stats = journal.stats()?;
    let n = (THREADS * EACH) as u64;
    assert_eq!((stats.applied, stats.acknowledged), (n, n));
    drop(journal);
    let journal = env.open();
    assert_eq!(journal.stats()?.applied, n);
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

/// Read-only opens walk the file's page numbers before the storage engine reads it (see
/// `JournalBuilder::page_check_size`). While a writer in this process checkpoints over and
/// over (a 64 KiB checkpoint size, 2 KiB results, a file of a few megabytes so that a walk
/// overlaps commits), the file grows and pages of older commits are reused under a walk in
/// progress: no open may take that for damage, and each sees the operation completed last
/// before it began. (Without the walk's second try when the commit slots changed meanwhile,
/// this loop, run longer over a growing file on a loaded machine, refused the live file
/// within seconds; at this size the race is rare, so the test guards the claim more than
/// that one mechanism.)
#[test]
fn inspecting_a_journal_while_it_checkpoints_never_reports_damage() -> opjournal::Result<()> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let env = Env::new();
    let journal = Arc::new(env.builder().checkpoint_size(64 * 1024).open(&env.path)?);
    for n in 0..2_000u64 {
        let op = Operation::new(format!("op_{n}"), add_light("door"));
        if let Admission::Fresh(claim) = journal.submit(op)? {
            journal.complete(&claim, Outcome::applied(n + 1, vec![b'b'; 2048]))?;
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(1_999));
    let writer = {
        let (journal, stop, done) = (journal.clone(), stop.clone(), done.clone());
        thread::spawn(move || -> opjournal::Result<u64> {
            let mut n = 2_000u64;
            while !stop.load(Ordering::SeqCst) && n < 5_000 {
                let op = Operation::new(format!("op_{n}"), add_light("door"));
                if let Admission::Fresh(claim) = journal.submit(op)? {
                    journal.complete(&claim, Outcome::applied(n + 1, vec![b'x'; 2048]))?;
                    done.store(n, Ordering::SeqCst);
                }
                n += 1;
            }
            Ok(n)
        })
    };
    let header = || std::fs::read(&env.path).map(|b| b[..320].to_vec());
    let mut headers = std::collections::BTreeSet::new();
    // Until the writer has written its 3,000 operations (at most 2,000 opens).
    let mut opens = 0;
    while !writer.is_finished() && opens < 2_000 {
        opens += 1;
        headers.insert(header().map_err(opjournal::Error::from)?);
        let last = done.load(Ordering::SeqCst);
        let insp = opjournal::Inspector::open(&env.path)
            .unwrap_or_else(|e| panic!("a live journal was refused: {e}"));
        let seen = insp.lookup(&format!("op_{last}"))?;
        assert!(
            seen.is_some(),
            "op_{last}, completed before the open, is not seen"
        );
    }
    stop.store(true, Ordering::SeqCst);
    let written = writer.join().expect("the writer thread")?;
    assert!(
        headers.len() >= 20,
        "the reads overlapped checkpoints ({} commit headers seen in {opens} opens, {written} \
         operations)",
        headers.len()
    );
    Ok(())
}
