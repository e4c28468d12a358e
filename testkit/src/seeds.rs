//! Small, real journals to start the `open_file` fuzzer and the stable property tests
//! from. Each is built by the library itself with a manual clock, so it holds every kind
//! of record: events of every kind, receipts in every state, scopes, results, timers,
//! windows and holds.

use std::path::Path;
use std::time::Duration;

use opjournal::{
    Admission, Intent, Journal, ManualClock, Operation, Outcome, Resolution, ScopeLock, Timestamp,
};

/// 2026-11-30T00:00:00Z.
pub const T0: Timestamp = Timestamp::from_millis(1_796_083_200_000);

fn intent(name: &str, n: u64) -> opjournal::Result<Intent> {
    Intent::from_json(name, &serde_json::json!({ "n": n, "near": "door" }))
}

fn fresh(j: &Journal, op: Operation) -> opjournal::Result<opjournal::Claim> {
    match j.submit(op)? {
        Admission::Fresh(c) => Ok(c),
        other => Err(opjournal::Error::from(std::io::Error::other(format!(
            "seed journal: expected a fresh admission, got {}",
            other.name()
        )))),
    }
}

/// An editor session: operations applied, failed, released, delivered, acknowledged,
/// one left running (in doubt after reopening), one resolved, and an external revision.
pub fn write_session(path: &Path) -> opjournal::Result<()> {
    let clock = ManualClock::new(T0);
    {
        let j = Journal::builder()
            .clock(clock.clone())
            .scope_lock(ScopeLock::Serial)
            .open(path)?;
        let mut rev = 0;
        for n in 0..6u64 {
            let op = Operation::new(format!("op_{n}"), intent("scene.add_light", n)?)
                .scope("scene/main")
                .base_revision(rev)
                .session("tab-1");
            let claim = fresh(&j, op)?;
            clock.advance(Duration::from_millis(250));
            match n % 3 {
                0 => {
                    rev += 1;
                    j.complete(
                        &claim,
                        Outcome::applied(rev, format!("light-{n}").into_bytes())
                            .changed_assets([format!("scene/main/light-{n}")]),
                    )?;
                    j.delivered(claim.operation_id())?;
                    if n == 0 {
                        j.acknowledge("op_0", Some("tab-1"))?;
                    }
                }
                1 => {
                    j.complete(&claim, Outcome::failed("the door no longer exists"))?;
                }
                _ => j.release(&claim)?,
            }
        }
        j.advance_revision("scene/main", rev + 5)?;
        j.advance_revision("files/readme.md", 3)?;
        let op = Operation::new("op_running", intent("file.write", 9)?)
            .scope("files/readme.md")
            .base_revision(3)
            .session("agent-7");
        let claim = fresh(&j, op)?;
        let _ = j.extend_lease(&claim)?;
        j.flush()?;
    }
    clock.advance(Duration::from_secs(60));
    {
        // Reopening makes `op_running` in doubt; resolve one more after a lease expiry.
        let j = Journal::builder()
            .clock(clock.clone())
            .lease(Duration::from_secs(10))
            .open(path)?;
        let claim = fresh(
            &j,
            Operation::new("op_lease", intent("scene.move", 1)?).scope("scene/other"),
        )?;
        drop(claim);
        clock.advance(Duration::from_secs(11));
        j.compact()?;
        j.resolve("op_lease", Resolution::applied(1, b"moved".to_vec()))?;
        j.flush()?;
    }
    Ok(())
}

/// A journal whose clocks ran: acknowledgements expired, results retired, deliveries
/// exhausted, with a hold-until-ack scope lock.
pub fn write_aged(path: &Path) -> opjournal::Result<()> {
    let clock = ManualClock::new(T0);
    let j = Journal::builder()
        .clock(clock.clone())
        .scope_lock(ScopeLock::HoldUntilAck)
        .ack_timeout(Duration::from_secs(60))
        .result_retention(Duration::from_secs(120))
        .audit_retention(Duration::from_secs(600))
        .retry_policy(opjournal::RetryPolicy {
            attempts: 2,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(400),
        })
        .open(path)?;
    for n in 0..4u64 {
        let op = Operation::new(format!("aged_{n}"), intent("doc.edit", n)?)
            .scope(format!("doc/{}", n % 2))
            .session("s");
        let claim = fresh(&j, op)?;
        j.complete(&claim, Outcome::applied(n + 1, vec![b'x'; 40]))?;
        j.delivered(&format!("aged_{n}"))?;
        clock.advance(Duration::from_millis(500));
        j.delivered(&format!("aged_{n}"))?;
        if n == 1 {
            j.acknowledge("aged_1", Some("s"))?;
        }
        clock.advance(Duration::from_secs(70));
        j.compact()?;
    }
    clock.advance(Duration::from_secs(200));
    j.compact()?;
    j.flush()?;
    Ok(())
}

/// A journal that was just created: meta records only.
pub fn write_empty(path: &Path) -> opjournal::Result<()> {
    let j = Journal::builder().clock(ManualClock::new(T0)).open(path)?;
    j.flush()?;
    Ok(())
}

/// A journal (the editor session of [`write_session`], or with `cycles` a new one) reopened
/// with the smallest checkpoint size, then more calls, and the process dies: the files as
/// it leaves them, the journal and its log (`(db, log)`). With `cycles`, enough large
/// results to checkpoint once: the log then holds records of the next cycle over the rest
/// of the last one's. (Each stays under the fuzzer's 256 KiB input limit.)
pub fn write_crashed(path: &Path, cycles: bool) -> opjournal::Result<(Vec<u8>, Vec<u8>)> {
    if cycles {
        write_empty(path)?;
    } else {
        write_session(path)?;
    }
    let clock = ManualClock::new(T0.saturating_add(Duration::from_secs(600)));
    let j = Journal::builder()
        .clock(clock.clone())
        .checkpoint_size(64 << 10)
        .max_result_bytes(16 << 10)
        .open(path)?;
    // Many small operations fill the memtable (its entries count with their overhead)
    // before the log: a checkpoint comes with little data, keeping the seed small.
    let calls = if cycles { 48 } else { 3 };
    for n in 0..calls {
        let op = Operation::new(format!("op_logged_{n}"), intent("scene.paint", n)?)
            .scope(format!("scene/layer-{n}"))
            .session("tab-2");
        let claim = fresh(&j, op)?;
        clock.advance(Duration::from_millis(100));
        j.complete(&claim, Outcome::applied(1, vec![b'a' + (n % 26) as u8; 64]))?;
        j.delivered(claim.operation_id())?;
    }
    let running = Operation::new("op_logged_running", intent("scene.paint", 99)?);
    let _ = fresh(&j, running)?;
    j.flush()?;
    // The log file that holds the current cycle (the writer starts each cycle in the file
    // the cycle before did not use, and zeroes that one once it is checkpointed): as the
    // seed's one log, recovery reads it the same.
    let mut logs = Vec::new();
    for log in opjournal::FileLog::paths_for(path) {
        if log.exists() {
            logs.push(std::fs::read(log).map_err(opjournal::Error::from)?);
        }
    }
    const FIRST_RECORD: std::ops::Range<usize> = 4096..4124;
    let current = logs
        .iter()
        .position(|l| {
            l.get(FIRST_RECORD)
                .is_some_and(|r| r.iter().any(|b| *b != 0))
        })
        .unwrap_or(0);
    let mut log = logs.swap_remove(current);
    // The log is preallocated with zeros: without them it reads the same (its records end
    // where the file does), and the seed stays small enough for the fuzzer's input limit.
    let used = log.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1);
    log.truncate(used.next_multiple_of(512).max(4096));
    let files = (std::fs::read(path).map_err(opjournal::Error::from)?, log);
    // Dropping the journal now closes it cleanly; the copy above is what a crash left.
    drop(j);
    Ok(files)
}

/// Writes one seed journal at a path.
type Builder = fn(&Path) -> opjournal::Result<()>;

/// Every seed input of `open_file`, as `(name, bytes)`: the journals closed cleanly
/// (`*.opj`), and journals with their log as a crash left them (`*.pair`, see
/// [`crate::open_file::join`]).
///
/// # Errors
///
/// The library's error, if building one fails.
pub fn all() -> opjournal::Result<Vec<(&'static str, Vec<u8>)>> {
    let dir = tempfile::tempdir().map_err(opjournal::Error::from)?;
    let mut out = Vec::new();
    let builders: [(&'static str, Builder); 3] = [
        ("session.opj", write_session),
        ("aged.opj", write_aged),
        ("empty.opj", write_empty),
    ];
    for (name, build) in builders {
        let path = dir.path().join(name);
        build(&path)?;
        out.push((name, std::fs::read(&path).map_err(opjournal::Error::from)?));
    }
    for (name, cycles) in [("logged.pair", false), ("recycled.pair", true)] {
        let path = dir.path().join(name);
        let (db, log) = write_crashed(&path, cycles)?;
        out.push((name, crate::open_file::join(&db, &log)));
    }
    Ok(out)
}
