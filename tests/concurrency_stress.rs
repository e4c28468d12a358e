//! Concurrency stress (issue 5): eight editor threads share one `Journal`, submitting
//! overlapping operation ids in overlapping scopes, while a clock thread moves time (so
//! leases expire under running work), a compactor runs, and a resolver settles abandoned
//! work. Checked against the model's invariants:
//!
//! - a `Fresh` claim is exclusive: no two threads ever hold one for the same id, nor for
//!   two operations of the same scope (serial scope lock);
//! - no effect is applied twice (the editor counts applications per id);
//! - every `Ok` outcome is what the journal records, and a replay returns it;
//! - an applied effect is never forgotten: its id is applied, or in doubt until resolved;
//! - scope revisions only move forward and end at the highest applied revision;
//! - after closing, the file verifies clean (records, redb integrity, indexes == replay),
//!   and a reopen answers the same.
//!
//! `OPJ_STRESS_ITERS` sets the calls per thread (default 300); `OPJ_SEED` the seed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opjournal::{
    Admission, Clock, DeliveryState, ErrorKind, ExecutionStatus, Intent, Journal, ManualClock,
    Operation, Outcome, Resolution, Sharing, Timestamp,
};
use opjournal_testkit::driver::{Rng, T0};

const THREADS: usize = 8;
/// How many ids the threads share at any moment; the window slides as calls are made, so
/// ids are contended by every thread, then retired from the workload.
const WINDOW: usize = 16;
/// Calls between two steps of the window.
const SLIDE_EVERY: u64 = 16;
const SCOPES: usize = 3;

fn scope_of(i: usize) -> Option<String> {
    (i % 8 != 7).then(|| format!("scene/{}", i % SCOPES))
}

fn op(i: usize) -> opjournal::Result<Operation> {
    let intent = Intent::from_json("scene.edit", &serde_json::json!({ "target": i }))?;
    let mut op = Operation::new(format!("op-{i}"), intent).session(format!("tab-{}", i % 4));
    if let Some(s) = scope_of(i) {
        op = op.scope(s).allow_stale_base();
    }
    Ok(op)
}

/// What the fake editor knows, shared by every thread.
#[derive(Default)]
struct Editor {
    /// Effects applied per id.
    applied: BTreeMap<String, u32>,
    /// Outcomes the journal acknowledged: id → (result revision, result bytes).
    recorded: BTreeMap<String, (Option<u64>, Vec<u8>)>,
    /// Claims abandoned by a "crashed" worker: id → the revision applied, if it was.
    abandoned: BTreeMap<String, Option<u64>>,
    violations: Vec<String>,
}

struct Shared {
    journal: Journal,
    clock: ManualClock,
    editor: Mutex<Editor>,
    /// Per scope, the fresh claim some thread holds in it: its id and when its lease
    /// ends. Leases are short here (2 s of a clock that moves 150 ms every 2 ms), so a
    /// worker the machine leaves waiting can see its lease expire: its operation is then
    /// in doubt, the scope is free, and another claim in it is correct.
    scope_busy: Vec<Mutex<Option<(usize, Timestamp)>>>,
    /// The ids some thread holds a fresh claim for.
    id_busy: Mutex<std::collections::BTreeSet<usize>>,
    stop: AtomicBool,
    calls: AtomicU64,
    /// Submits refused because another operation held the scope.
    busy: AtomicU64,
    /// Abandoned claims settled by the resolver.
    resolved: AtomicU64,
    /// Compaction passes run while the workers ran.
    compactions: AtomicU64,
}

impl Shared {
    fn violation(&self, v: String) {
        let mut e = self.editor.lock().unwrap_or_else(|e| e.into_inner());
        if e.violations.len() < 20 {
            e.violations.push(v);
        }
    }

    fn editor(&self) -> std::sync::MutexGuard<'_, Editor> {
        self.editor.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn scope_index(i: usize) -> Option<usize> {
    scope_of(i).map(|_| i % SCOPES)
}

/// One editor thread; returns the calls it made (all `iters`, unless it stopped at a
/// violation).
fn worker(sh: &Shared, seed: u64, iters: u64) -> u64 {
    let mut rng = Rng::new(seed);
    let mut made = 0;
    for _ in 0..iters {
        made += 1;
        let call = sh.calls.fetch_add(1, Ordering::Relaxed);
        let i = (call / SLIDE_EVERY) as usize + rng.below(WINDOW as u64) as usize;
        let id = format!("op-{i}");
        match rng.below(10) {
            0 => {
                let r = sh.journal.delivered(&id);
                check_refusal(sh, "delivered", &id, r.map(drop));
                continue;
            }
            1 => {
                let r = sh.journal.acknowledge(&id, Some(&format!("tab-{}", i % 4)));
                check_refusal(sh, "acknowledge", &id, r.map(drop));
                continue;
            }
            2 if rng.chance(30) => {
                if let Some(s) = scope_of(i) {
                    let cur = sh.journal.scope_revision(&s).unwrap_or(0);
                    match sh.journal.advance_revision(&s, cur + 1) {
                        Ok(_) => {}
                        Err(e) if matches!(e.kind(), ErrorKind::RevisionNotForward { .. }) => {}
                        Err(e) => sh.violation(format!("advance `{s}`: {e}")),
                    }
                }
                continue;
            }
            _ => {}
        }
        let operation = match op(i) {
            Ok(o) => o,
            Err(e) => {
                sh.violation(format!("op: {e}"));
                return made;
            }
        };
        match sh.journal.submit(operation) {
            Ok(Admission::Fresh(claim)) => run_claim(sh, &mut rng, i, claim),
            Ok(Admission::Replay(r)) => {
                let recorded = sh.editor().recorded.get(&id).cloned();
                if !r.replayed {
                    sh.violation(format!("replay of `{id}` not marked as a replay"));
                }
                if let Some((_, bytes)) = recorded
                    && bytes != r.result.bytes
                {
                    sh.violation(format!(
                        "replay of `{id}` returned {:?}, but {:?} was recorded",
                        r.result.bytes, bytes
                    ));
                }
            }
            Ok(_) => {}
            Err(e) => match e.kind() {
                ErrorKind::ScopeBusy { .. } => {
                    sh.busy.fetch_add(1, Ordering::Relaxed);
                }
                ErrorKind::WindowFull { .. } => {}
                _ => sh.violation(format!("submit `{id}`: {e}")),
            },
        }
    }
    made
}

fn check_refusal(sh: &Shared, what: &str, id: &str, r: opjournal::Result<()>) {
    if let Err(e) = r
        && !matches!(
            e.kind(),
            ErrorKind::UnknownOperation { .. } | ErrorKind::InvalidState { .. }
        )
    {
        sh.violation(format!("{what} `{id}`: {e}"));
    }
}

/// Holds a fresh claim: applies and completes, fails, releases, or abandons it.
fn run_claim(sh: &Shared, rng: &mut Rng, i: usize, claim: opjournal::Claim) {
    let id = format!("op-{i}");
    if !sh
        .id_busy
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(i)
    {
        sh.violation(format!("two fresh claims at once for `{id}`"));
    }
    let scope = scope_index(i);
    if let Some(s) = scope {
        let mut holder = sh.scope_busy[s].lock().unwrap_or_else(|e| e.into_inner());
        // The journal judged this claim at or before now: the holder's lease had not
        // ended then either if it has not ended now.
        if let Some((other, until)) = *holder
            && sh.clock.now() < until
        {
            sh.violation(format!(
                "two fresh claims at once in scope {s} (`{id}` is the second, `op-{other}` \
                 holds it until {until:?})"
            ));
        }
        *holder = Some((i, claim.lease_until()));
    }
    let release_locks = || {
        if let Some(s) = scope {
            let mut holder = sh.scope_busy[s].lock().unwrap_or_else(|e| e.into_inner());
            if holder.is_some_and(|(held, _)| held == i) {
                *holder = None;
            }
        }
        sh.id_busy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&i);
    };
    {
        let e = sh.editor();
        if e.applied.get(&id).copied().unwrap_or(0) > 0 {
            drop(e);
            sh.violation(format!(
                "`{id}` answered Fresh although its effect was applied: double application"
            ));
        }
    }
    let choice = rng.below(20);
    if choice == 0 {
        release_locks();
        if let Err(e) = sh.journal.release(&claim) {
            sh.violation(format!("release `{id}`: {e}"));
        }
        return;
    }
    if choice <= 2 {
        release_locks();
        let msg = format!("{id} failed");
        match sh.journal.complete(
            &claim,
            Outcome::failed(msg.clone()).with_result(msg.clone()),
        ) {
            Ok(_) => {
                sh.editor().recorded.insert(id, (None, msg.into_bytes()));
            }
            Err(e) => sh.violation(format!("fail `{id}`: {e}")),
        }
        return;
    }
    // Apply the effect (while holding the scope: nobody else mutates it).
    let rev_for = |sh: &Shared| match claim.scope() {
        Some(s) => sh.journal.scope_revision(s).unwrap_or(0) + 1,
        None => 1,
    };
    let mut rev = rev_for(sh);
    *sh.editor().applied.entry(id.clone()).or_default() += 1;
    if choice == 3 {
        // The worker "crashes" after applying (or before, half the time): the claim is
        // abandoned; its lease expires and the resolver settles it from the editor's truth.
        let applied = rng.chance(50);
        if !applied {
            let mut e = sh.editor();
            if let Some(n) = e.applied.get_mut(&id) {
                *n -= 1;
            }
        }
        sh.editor().abandoned.insert(id, applied.then_some(rev));
        release_locks();
        return;
    }
    std::thread::yield_now();
    let bytes = format!("{id}@").into_bytes();
    release_locks();
    loop {
        let bytes = [bytes.clone(), rev.to_string().into_bytes()].concat();
        match sh
            .journal
            .complete(&claim, Outcome::applied(rev, bytes.clone()))
        {
            Ok(r) => {
                if r.status != ExecutionStatus::Applied || r.result_revision != Some(rev) {
                    sh.violation(format!("complete `{id}` answered {r:?}"));
                }
                sh.editor().recorded.insert(id, (Some(rev), bytes));
                return;
            }
            // An external edit moved the scope meanwhile: the effect lands on top of it.
            Err(e) if matches!(e.kind(), ErrorKind::RevisionNotForward { .. }) => {
                rev = rev_for(sh);
            }
            Err(e) => {
                sh.violation(format!("complete `{id}` (its effect was applied): {e}"));
                return;
            }
        }
    }
}

/// Moves time (so leases expire under running work) and compacts.
fn clock_and_compactor(sh: &Shared) {
    let mut n = 0u64;
    while !sh.stop.load(Ordering::SeqCst) {
        sh.clock.advance(Duration::from_millis(150));
        n += 1;
        // The first pass at once (so one surely runs beside the workers), then every tenth.
        if n % 10 == 1 {
            match sh.journal.compact() {
                Ok(_) => {
                    sh.compactions.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => sh.violation(format!("compact: {e}")),
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Resolves in-doubt work that a worker abandoned, from the editor's truth.
fn resolver(sh: &Shared) {
    loop {
        let done = sh.stop.load(Ordering::SeqCst);
        settle_abandoned(sh);
        if done {
            return;
        }
        std::thread::sleep(Duration::from_millis(3));
    }
}

fn settle_abandoned(sh: &Shared) {
    let in_doubt = match sh.journal.in_doubt() {
        Ok(v) => v,
        Err(e) => return sh.violation(format!("in_doubt: {e}")),
    };
    for r in in_doubt {
        let truth = sh.editor().abandoned.get(&r.operation_id).cloned();
        let Some(applied) = truth else {
            // A live worker whose lease expired: it will still complete (same epoch).
            continue;
        };
        let res = match applied {
            Some(rev) => Resolution::applied(rev, format!("{}@{rev}", r.operation_id)),
            None => Resolution::not_applied(),
        };
        match sh.journal.resolve(&r.operation_id, res) {
            Ok(out) => {
                sh.resolved.fetch_add(1, Ordering::Relaxed);
                let mut e = sh.editor();
                e.abandoned.remove(&r.operation_id);
                if let (Some(rev), Some(out)) = (applied, out) {
                    e.recorded.insert(
                        r.operation_id.clone(),
                        (Some(rev), format!("{}@{rev}", r.operation_id).into_bytes()),
                    );
                    let _ = out;
                }
            }
            // Resolved meanwhile by... nobody else resolves; refusals are violations.
            Err(e) => sh.violation(format!("resolve `{}`: {e}", r.operation_id)),
        }
    }
}

fn final_checks(j: &Journal, editor: &Editor, ids: usize, scope_revs: &mut BTreeMap<String, u64>) {
    let mut problems = Vec::new();
    for i in 0..ids {
        let id = format!("op-{i}");
        let applied = editor.applied.get(&id).copied().unwrap_or(0);
        if applied > 1 {
            problems.push(format!("`{id}` applied {applied} times"));
        }
        let r = match j.lookup(&id) {
            Ok(r) => r,
            Err(e) => {
                problems.push(format!("lookup `{id}`: {e}"));
                continue;
            }
        };
        match (&r, editor.recorded.get(&id)) {
            (Some(r), Some((rev, bytes))) => {
                let status_ok = match rev {
                    Some(_) => r.status == ExecutionStatus::Applied,
                    None => r.status == ExecutionStatus::Failed,
                };
                if !status_ok || r.result_revision != *rev {
                    problems.push(format!(
                        "`{id}`: recorded {rev:?}, journal says {:?} at {:?}",
                        r.status, r.result_revision
                    ));
                }
                match j.result(&id) {
                    Ok(Some(res)) if &res.bytes == bytes => {}
                    other => problems.push(format!("result of `{id}`: {other:?}")),
                }
                if let (Some(rev), Some(s)) = (rev, &r.scope) {
                    let e = scope_revs.entry(s.clone()).or_default();
                    *e = (*e).max(*rev);
                }
            }
            (None, Some(rec)) => problems.push(format!("`{id}`: acknowledged {rec:?} is lost")),
            (Some(r), None) if r.status == ExecutionStatus::Applied => problems.push(format!(
                "`{id}` is applied in the journal but no outcome was acknowledged"
            )),
            _ => {}
        }
        if applied == 1
            && !matches!(
                r.as_ref().map(|r| r.status),
                Some(ExecutionStatus::Applied | ExecutionStatus::InDoubt)
            )
        {
            problems.push(format!(
                "`{id}`'s effect was applied but the journal answers {:?}",
                r.as_ref().map(|r| r.status)
            ));
        }
        if let Some(r) = &r
            && r.delivery == Some(DeliveryState::Acknowledged)
            && r.acknowledged_at.is_none()
        {
            problems.push(format!("`{id}` acknowledged without a time"));
        }
    }
    for (scope, max) in scope_revs.iter() {
        match j.scope_revision(scope) {
            Ok(rev) if rev >= *max => {}
            other => problems.push(format!(
                "scope `{scope}` at {other:?}, below applied revision {max}"
            )),
        }
    }
    assert!(
        problems.is_empty(),
        "invariants broken:\n{}",
        problems.join("\n")
    );
}

fn stress(sharing: Sharing) -> opjournal::Result<()> {
    let seed: u64 = std::env::var("OPJ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x57_2E55);
    let iters: u64 = std::env::var("OPJ_STRESS_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("stress.opj");
    let clock = ManualClock::new(Timestamp::from_millis(T0));
    let builder = || {
        Journal::builder()
            .lease(Duration::from_secs(2))
            .sharing(sharing)
            .clock(clock.clone())
    };
    let sh = Arc::new(Shared {
        journal: builder().open(&path)?,
        clock: clock.clone(),
        editor: Mutex::new(Editor::default()),
        scope_busy: (0..SCOPES).map(|_| Mutex::new(None)).collect(),
        id_busy: Mutex::new(std::collections::BTreeSet::new()),
        stop: AtomicBool::new(false),
        calls: AtomicU64::new(0),
        busy: AtomicU64::new(0),
        resolved: AtomicU64::new(0),
        compactions: AtomicU64::new(0),
    });
    // Every thread is joined and its panic reported: a worker that died early would
    // otherwise leave the checks below judging less work than was asked for.
    let mut failed = Vec::new();
    std::thread::scope(|s| {
        let helpers = [
            ("clock and compactor", s.spawn(|| clock_and_compactor(&sh))),
            ("resolver", s.spawn(|| resolver(&sh))),
        ];
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let sh = &sh;
                s.spawn(move || worker(sh, seed.wrapping_add(t as u64 * 7919), iters))
            })
            .collect();
        for (t, w) in workers.into_iter().enumerate() {
            match w.join() {
                Ok(made) if made == iters => {}
                Ok(made) => {
                    failed.push(format!("worker {t} stopped after {made} of {iters} calls"))
                }
                Err(p) => failed.push(format!("worker {t} panicked: {}", panic_text(&*p))),
            }
        }
        // Let every abandoned lease expire and be settled.
        sh.clock.advance(Duration::from_secs(5));
        sh.stop.store(true, Ordering::SeqCst);
        for (name, h) in helpers {
            if let Err(p) = h.join() {
                failed.push(format!("the {name} thread panicked: {}", panic_text(&*p)));
            }
        }
    });
    assert!(
        failed.is_empty(),
        "seed {seed:#x}: threads failed:\n{}",
        failed.join("\n")
    );
    settle_abandoned(&sh);
    let editor = std::mem::take(&mut *sh.editor());
    assert!(
        editor.violations.is_empty(),
        "seed {seed:#x}: violations:\n{}",
        editor.violations.join("\n")
    );
    assert!(
        editor.abandoned.is_empty(),
        "abandoned work left unresolved: {:?}",
        editor.abandoned
    );
    let mut scope_revs = BTreeMap::new();
    let calls = sh.calls.load(Ordering::Relaxed);
    let busy = sh.busy.load(Ordering::Relaxed);
    let resolved = sh.resolved.load(Ordering::Relaxed);
    let compactions = sh.compactions.load(Ordering::Relaxed);
    assert_eq!(calls, THREADS as u64 * iters, "every call was made");
    // The contention the stress exists for happened: scopes were found busy, and
    // compaction passes ran beside the workers.
    assert!(busy > 0, "no submit ever found its scope busy");
    assert!(
        compactions > 0,
        "no compaction pass ran while the workers ran"
    );
    let ids = (calls / SLIDE_EVERY) as usize + WINDOW;
    final_checks(&sh.journal, &editor, ids, &mut scope_revs);
    let Ok(sh) = Arc::try_unwrap(sh) else {
        panic!("threads still hold the journal")
    };
    drop(sh.journal);
    let report = opjournal::verify(&path)?;
    assert!(report.is_clean(), "verify after the stress: {report:?}");
    // Everything acknowledged is still there after a reopen.
    let j = builder().open(&path)?;
    final_checks(&j, &editor, ids, &mut scope_revs);
    let applied: u32 = editor.applied.values().sum();
    eprintln!(
        "stress ({sharing:?}): {THREADS} threads, {calls} calls over {ids} ids, {applied} effects applied, {} outcomes checked, {busy} scope-busy refusals, {resolved} abandoned claims resolved, {compactions} compaction passes, violations: 0",
        editor.recorded.len()
    );
    assert!(
        applied > 0 && !editor.recorded.is_empty(),
        "the stress did work"
    );
    Ok(())
}

/// The message of a thread's panic.
fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

#[test]
fn eight_threads_sharing_one_journal_keep_claims_exclusive_and_effects_single()
-> opjournal::Result<()> {
    stress(Sharing::LiveReaders)
}

#[test]
fn eight_threads_sharing_an_exclusive_journal_keep_claims_exclusive_and_effects_single()
-> opjournal::Result<()> {
    stress(Sharing::Exclusive)
}
