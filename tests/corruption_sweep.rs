//! The corruption sweep (issues 13 and 23): seeded damage — byte flips, zeroed 4 KiB pages
//! (any page, or one holding receipts with their inline results), truncations, appended
//! garbage, and the log's bytes flipped or cut — to three journals: 220 operations closed
//! cleanly (one file), the same left by a writer with a log beside the file, and 60
//! acknowledged operations with small results, closed cleanly (the shape issue 23 item 4
//! was found on). Every case is classified:
//!
//! - **intact**: `verify` finds the file clean and every operation answers as before;
//! - **repaired**: `repair` returned `Ok`, `verify` is clean after it, and every operation
//!   that answers differently from before the damage is named in the report;
//! - **clean error**: `verify` or `repair` returned a typed error (and repair left the files
//!   as they were).
//!
//! and these are violations, each failing the test with the seed that replays it:
//! a panic, a hang, a *silent wrong answer* (verify says clean but an operation answers
//! differently), an *unreported loss* (after repair an operation answers differently and
//! the report does not name it), a revived result payload (retention dropped it, repair
//! brought it back), a read that changed the files, and `verify` not clean after a repair
//! that returned `Ok`.
//!
//! An operation's "answer" is what a reader sees: `Inspector::lookup` (its receipt: state,
//! delivery, revision, …), `Inspector::result` and `Inspector::history`. A result that was
//! there before the damage and is gone after the repair must answer as lost to damage
//! (`RetireCause::Damage`), never as aged out.
//!
//! Cases are stratified (case `n`: image `n % 3`, and each kind of damage in turn), and a
//! run asserts that it reached every kind of damage, every image, every class, and named
//! losses, results lost to damage among them.
//!
//! `OPJ_SWEEP_CASES=N` sets the number of cases (default 200, about 20 s);
//! `OPJ_SWEEP_SEED=0x…` replays one case. The long run is in `docs/durability.md`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use opjournal::{
    Admission, Event, Inspector, Intent, Journal, ManualClock, OpResult, Operation, Outcome,
    Receipt, RepairOptions, RetireCause, Timestamp,
};

/// 2100-01-01T00:00:00Z: ahead of any real clock, so "now" for a reader is the journal's
/// high-water mark and answers do not drift with the wall clock.
const T0: Timestamp = Timestamp::from_millis(4_102_444_800_000);
const PAGE: usize = 4096;
const DEFAULT_CASES: u64 = 200;
/// A case that takes longer than this is a hang.
const HANG: Duration = Duration::from_secs(120);

/// What a reader answers about one operation.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Answer {
    receipt: Option<Receipt>,
    result: Option<OpResult>,
    history: Vec<Event>,
}

type Answers = BTreeMap<String, Answer>;

fn rng(state: &mut u64) -> u64 {
    // splitmix64
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn below(state: &mut u64, n: u64) -> u64 {
    if n == 0 { 0 } else { rng(state) % n }
}

/// A pristine journal image: the redb file's bytes and, for a writer's leftovers, its log.
struct Image {
    name: &'static str,
    opj: Vec<u8>,
    log: Option<Vec<u8>>,
    answers: Answers,
    /// Operations whose result retention dropped before the damage.
    dropped_payloads: BTreeSet<String>,
    /// Pages holding a receipt record followed by a result record (format 3 keeps a small
    /// result inline after its receipt): what a zeroed receipts page hits.
    receipt_pages: Vec<usize>,
}

/// Whether `page` holds a receipt record followed by a result record: the frames start
/// `4f 4a 03 03` and `4f 4a 03 05`.
fn holds_receipts_with_inline_results(page: &[u8]) -> bool {
    let receipt = page.windows(4).position(|w| w == [0x4f, 0x4a, 0x03, 0x03]);
    receipt.is_some_and(|r| page[r..].windows(4).any(|w| w == [0x4f, 0x4a, 0x03, 0x05]))
}

fn intent(n: usize) -> Intent {
    Intent::from_json("doc.edit", &serde_json::json!({ "n": n })).expect("a valid intent")
}

/// Builds a journal of `n` operations: applied and failed outcomes, deliveries and
/// acknowledgements, operations whose results retention dropped, released and in-doubt
/// ones. With `leave_log`, the files are copied while the writer still has them open (as a
/// crash leaves them: the log holds what was not checkpointed).
fn build(n: usize, leave_log: bool) -> Image {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("j.opj");
    let clock = ManualClock::new(T0);
    let j = Journal::builder()
        .clock(clock.clone())
        .session_window(100_000)
        .checkpoint_size(64 << 10)
        .open(&path)
        .expect("open");
    let mut revs: BTreeMap<String, u64> = BTreeMap::new();
    let mut op = |j: &Journal, i: usize| {
        clock.advance(Duration::from_secs(1));
        let id = format!("op_{i:04}");
        // An operation left running holds its scope: it gets one of its own.
        let scope = if i % 11 == 10 {
            format!("wip/{i}")
        } else {
            format!("doc/{}", i % 5)
        };
        let rev = *revs.get(&scope).unwrap_or(&0);
        let session = format!("tab-{}", i % 3);
        let claim = match j
            .submit(
                Operation::new(id.clone(), intent(i))
                    .scope(scope.clone())
                    .base_revision(rev)
                    .session(session.clone()),
            )
            .expect("submit")
        {
            Admission::Fresh(c) => c,
            other => panic!("expected fresh work for {id}, got {other:?}"),
        };
        match i % 11 {
            // Left running: in doubt after the writer is gone.
            10 => return,
            // Released before any effect.
            9 => {
                j.release(&claim).expect("release");
                return;
            }
            7 => {
                j.complete(&claim, Outcome::failed(format!("failure {i}")))
                    .expect("complete failed");
            }
            _ => {
                let result = format!("result of {id}: {}", "r".repeat(50 + i * 7 % 300));
                j.complete(&claim, Outcome::applied(rev + 1, result.into_bytes()))
                    .expect("complete");
                revs.insert(scope, rev + 1);
            }
        }
        for _ in 0..(i % 4) {
            j.delivered(&id).expect("delivered");
        }
        if i.is_multiple_of(3) {
            j.acknowledge(&id, Some(&session)).expect("acknowledge");
        }
        if i.is_multiple_of(8) {
            j.flush().expect("flush");
        }
    };
    let first = n / 3;
    for i in 0..first {
        op(&j, i);
    }
    // Retention passes for the first third: their payloads are dropped.
    clock.advance(Duration::from_secs(8 * 24 * 3600));
    j.compact().expect("compact");
    for i in first..n {
        op(&j, i);
    }
    j.advance_revision("doc/0", 10_000).expect("advance");
    j.flush().expect("flush");
    let (opj, log) = if leave_log {
        let opj = std::fs::read(&path).expect("read");
        let log = std::fs::read(log_path(&path)).ok();
        assert!(log.is_some(), "the writer has a log beside the file");
        std::mem::drop(j);
        (opj, log)
    } else {
        j.close().expect("close");
        (std::fs::read(&path).expect("read"), None)
    };
    let img = image_of(if leave_log { "with log" } else { "closed" }, opj, log);
    assert!(
        !img.dropped_payloads.is_empty(),
        "some payloads were retired"
    );
    img
}

/// A journal like the one issue 23 item 4 was found on (an editor service's): `n`
/// operations in one scope and session, each applied with a small result (stored inline
/// after its receipt), delivered once and acknowledged, closed cleanly. Nothing is retired,
/// so a result that is gone after a repair was taken by the damage.
fn build_acknowledged(n: usize) -> Image {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("j.opj");
    let clock = ManualClock::new(T0);
    let j = Journal::builder()
        .clock(clock.clone())
        .open(&path)
        .expect("open");
    for i in 0..n {
        clock.advance(Duration::from_millis(700));
        let id = format!("op_{i:03}");
        let rev = i as u64;
        let op = Operation::new(id.clone(), intent(i))
            .scope("scene/main")
            .base_revision(rev)
            .session("agent-1");
        let Admission::Fresh(claim) = j.submit(op).expect("submit") else {
            panic!("expected fresh work for {id}");
        };
        let result = format!("added \"lamp {i}\" beside \"door\"");
        j.complete(&claim, Outcome::applied(rev + 1, result.into_bytes()))
            .expect("complete");
        j.delivered(&id).expect("delivered");
        j.acknowledge(&id, Some("agent-1")).expect("acknowledge");
    }
    j.close().expect("close");
    image_of("acknowledged", std::fs::read(&path).expect("read"), None)
}

/// The image of a journal's files, with the answers of every operation, read from a fresh
/// copy (as copied), and its pages of receipts.
fn image_of(name: &'static str, opj: Vec<u8>, log: Option<Vec<u8>>) -> Image {
    let receipt_pages = (0..opj.len() / PAGE)
        .filter(|&pg| holds_receipts_with_inline_results(&opj[pg * PAGE..(pg + 1) * PAGE]))
        .collect::<Vec<_>>();
    assert!(
        !receipt_pages.is_empty(),
        "{name}: receipts with inline results"
    );
    let img = Image {
        name,
        opj,
        log,
        answers: BTreeMap::new(),
        dropped_payloads: BTreeSet::new(),
        receipt_pages,
    };
    let d = tempfile::tempdir().expect("tempdir");
    let p = img.place(d.path());
    let answers = answers_of(&p).expect("the pristine image reads");
    let v = opjournal::verify(&p).expect("the pristine image verifies");
    assert!(v.is_clean(), "the pristine image is clean: {v:?}");
    let dropped_payloads = answers
        .iter()
        .filter(|(_, a)| {
            a.receipt
                .as_ref()
                .is_some_and(|r| r.status == opjournal::ExecutionStatus::Retired)
        })
        .map(|(id, _)| id.clone())
        .collect::<BTreeSet<_>>();
    Image {
        answers,
        dropped_payloads,
        ..img
    }
}

fn log_path(p: &Path) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push("-log");
    PathBuf::from(s)
}

impl Image {
    fn place(&self, dir: &Path) -> PathBuf {
        let p = dir.join("x.opj");
        std::fs::write(&p, &self.opj).expect("write");
        if let Some(log) = &self.log {
            std::fs::write(log_path(&p), log).expect("write log");
        }
        p
    }
}

/// Every operation's answer, as a reader sees it (every id the receipts list, and every id
/// of `also`).
fn answers_of(p: &Path) -> opjournal::Result<Answers> {
    let insp = Inspector::open(p)?;
    let mut ids = BTreeSet::new();
    insp.for_each_receipt(|r| {
        ids.insert(r.operation_id.clone());
        Ok(true)
    })?;
    // Operations without a receipt (released) still have a history.
    insp.for_each_event(0, |ev| {
        if let Some(op) = &ev.operation_id {
            ids.insert(op.clone());
        }
        Ok(true)
    })?;
    let mut out = BTreeMap::new();
    for id in ids {
        out.insert(id.clone(), answer(&insp, &id)?);
    }
    Ok(out)
}

fn answer(insp: &Inspector, id: &str) -> opjournal::Result<Answer> {
    Ok(Answer {
        receipt: insp.lookup(id)?,
        result: insp.result(id)?,
        history: insp.history(id)?,
    })
}

fn answers_for(p: &Path, ids: &BTreeSet<String>) -> opjournal::Result<Answers> {
    let insp = Inspector::open(p)?;
    let mut out = BTreeMap::new();
    for id in ids {
        out.insert(id.clone(), answer(&insp, id)?);
    }
    Ok(out)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Damage {
    FlipFile,
    ZeroPage,
    /// A zeroed page that holds receipts with inline results (issue 23 item 4).
    ZeroReceiptsPage,
    Truncate,
    AppendGarbage,
    FlipLog,
    TruncateLog,
}

/// The kinds of damage a case of `img` can do (the log's only where there is one).
fn kinds(img: &Image) -> &'static [Damage] {
    if img.log.is_some() {
        &[
            Damage::FlipFile,
            Damage::ZeroPage,
            Damage::ZeroReceiptsPage,
            Damage::Truncate,
            Damage::AppendGarbage,
            Damage::FlipLog,
            Damage::TruncateLog,
        ]
    } else {
        &[
            Damage::FlipFile,
            Damage::ZeroPage,
            Damage::ZeroReceiptsPage,
            Damage::Truncate,
            Damage::AppendGarbage,
        ]
    }
}

/// The kind of damage the case `seed` does to `img`.
fn kind_of(img: &Image, seed: u64) -> Damage {
    let mut s = seed;
    let kinds = kinds(img);
    kinds[below(&mut s, kinds.len() as u64) as usize]
}

fn damage(img: &Image, seed: u64) -> (Damage, String, Vec<u8>, Option<Vec<u8>>) {
    let mut s = seed;
    let mut opj = img.opj.clone();
    let mut log = img.log.clone();
    let kind = kind_of(img, seed);
    below(&mut s, kinds(img).len() as u64);
    let what = match kind {
        Damage::FlipFile => {
            let flips = 1 + below(&mut s, 3);
            let mut at = Vec::new();
            for _ in 0..flips {
                let i = below(&mut s, opj.len() as u64) as usize;
                let x = 1 + below(&mut s, 255) as u8;
                opj[i] ^= x;
                at.push(format!("{i}^{x:#04x}"));
            }
            format!("flip {}", at.join(","))
        }
        Damage::ZeroPage => {
            let pages = opj.len() / PAGE;
            let pg = below(&mut s, pages as u64) as usize;
            opj[pg * PAGE..(pg + 1) * PAGE].fill(0);
            format!("zero page {pg}")
        }
        Damage::ZeroReceiptsPage => {
            let pages = &img.receipt_pages;
            let pg = pages[below(&mut s, pages.len() as u64) as usize];
            opj[pg * PAGE..(pg + 1) * PAGE].fill(0);
            format!("zero receipts page {pg}")
        }
        Damage::Truncate => {
            let len = if below(&mut s, 2) == 0 {
                (below(&mut s, (opj.len() / PAGE) as u64) as usize) * PAGE
            } else {
                below(&mut s, opj.len() as u64) as usize
            };
            opj.truncate(len);
            format!("truncate to {len}")
        }
        Damage::AppendGarbage => {
            let n = 1 + below(&mut s, 3 * PAGE as u64) as usize;
            let zeros = below(&mut s, 4) == 0;
            for _ in 0..n {
                opj.push(if zeros { 0 } else { rng(&mut s) as u8 });
            }
            format!("append {n} {} bytes", if zeros { "zero" } else { "random" })
        }
        Damage::FlipLog => {
            let l = log.as_mut().expect("a log");
            // Within the records written (the rest of the preallocated log is zero).
            let used = l.iter().rposition(|b| *b != 0).map_or(l.len(), |i| i + 1);
            let i = below(&mut s, used as u64) as usize;
            let x = 1 + below(&mut s, 255) as u8;
            l[i] ^= x;
            format!("flip log {i}^{x:#04x}")
        }
        Damage::TruncateLog => {
            let l = log.as_mut().expect("a log");
            let used = l.iter().rposition(|b| *b != 0).map_or(l.len(), |i| i + 1);
            let len = below(&mut s, used as u64) as usize;
            l.truncate(len);
            format!("truncate log to {len}")
        }
    };
    (kind, what, opj, log)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Class {
    Intact,
    Repaired,
    CleanError,
}

#[derive(Debug)]
struct Outcome_ {
    class: Class,
    violations: Vec<String>,
    /// Operations named in the report.
    named: usize,
    /// Operations lost without a trace, inside a receipts range the report names unreadable.
    in_ranges: usize,
    /// Operations that answered with their result before the damage and, after the repair,
    /// are known without it: each named, and answering that damage took it.
    results_lost: usize,
    /// Operations whose answer changed and that the report does not name (each also a
    /// violation).
    unnamed: usize,
    /// Of `in_ranges`, those whose receipt or result (not only their history) answered
    /// before: known operations lost with every byte of them.
    traceless_answers: usize,
}

/// Whether `id` lies in an unreadable range as the report shows it (`every key`,
/// ``after `a` ``, ``before `b` ``, ``between `a` and `b` ``).
fn in_range(key: &str, id: &str) -> bool {
    let quoted: Vec<&str> = key.split('`').skip(1).step_by(2).collect();
    if key == "every key" {
        true
    } else if key.starts_with("after") && quoted.len() == 1 {
        id > quoted[0]
    } else if key.starts_with("before") && quoted.len() == 1 {
        id < quoted[0]
    } else if key.starts_with("between") && quoted.len() == 2 {
        quoted[0] < id && id < quoted[1]
    } else {
        false
    }
}

/// The operation ids of the intact receipt records (CRC-valid frames of kind 3) in `bytes`:
/// an operation with one of these left is not one of which no byte survives.
fn intact_receipt_ids(bytes: &[u8]) -> BTreeSet<String> {
    use opjournal::codec::{RecordKind, unframe};
    let mut ids = BTreeSet::new();
    let mut i = 0;
    while let Some(at) = bytes[i..]
        .windows(4)
        .position(|w| w[..2] == [0x4f, 0x4a] && w[3] == RecordKind::Receipt as u8)
    {
        let start = i + at;
        i = start + 1;
        let Some(len) = bytes
            .get(start + 4..start + 8)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
        else {
            break;
        };
        let Some(frame) = bytes.get(start..start.saturating_add(12).saturating_add(len)) else {
            continue;
        };
        // The payload starts with the operation id: a one-byte length (ids are short),
        // then its bytes.
        if let Ok(payload) = unframe(RecordKind::Receipt, frame)
            && let Some((&n, rest)) = payload.split_first()
            && let Some(id) = rest.get(..usize::from(n))
            && let Ok(id) = std::str::from_utf8(id)
        {
            ids.insert(id.to_string());
        }
    }
    ids
}

fn files(p: &Path) -> (Vec<u8>, Option<Vec<u8>>) {
    (
        std::fs::read(p).unwrap_or_default(),
        std::fs::read(log_path(p)).ok(),
    )
}

fn diff_ids(before: &Answers, after: &Answers) -> Vec<String> {
    let mut ids: BTreeSet<&String> = before.keys().collect();
    ids.extend(after.keys());
    ids.into_iter()
        .filter(|id| {
            let empty = Answer {
                receipt: None,
                result: None,
                history: Vec::new(),
            };
            before.get(*id).unwrap_or(&empty) != after.get(*id).unwrap_or(&empty)
        })
        .cloned()
        .collect()
}

/// What differs between two answers, briefly.
fn describe(before: Option<&Answer>, after: Option<&Answer>) -> String {
    let brief = |a: Option<&Answer>| match a {
        None => "nothing".to_string(),
        Some(a) => format!(
            "{} result={} history={:?}",
            a.receipt
                .as_ref()
                .map_or("no receipt".to_string(), |r| format!(
                    "{:?}/{:?} rev={:?} deliveries={} ack={:?}",
                    r.status, r.delivery, r.result_revision, r.delivery_count, r.acknowledged_at
                )),
            a.result.as_ref().map_or(0, |r| r.bytes.len()),
            a.history.iter().map(|e| e.seq).collect::<Vec<_>>()
        ),
    };
    format!("before [{}] after [{}]", brief(before), brief(after))
}

fn run_case(img: &Image, seed: u64) -> (Damage, String, Outcome_) {
    let (kind, what, opj, log) = damage(img, seed);
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("x.opj");
    std::fs::write(&p, &opj).expect("write");
    if let Some(l) = &log {
        std::fs::write(log_path(&p), l).expect("write log");
    }
    let mut violations = Vec::new();
    let all_ids: BTreeSet<String> = img.answers.keys().cloned().collect();

    // verify, and what a reader answers when verify says clean.
    let verified = opjournal::verify(&p);
    let clean = matches!(&verified, Ok(v) if v.is_clean());
    if clean {
        match answers_for(&p, &all_ids) {
            Ok(now) => {
                let wrong = diff_ids(&img.answers, &now);
                if !wrong.is_empty() {
                    violations.push(format!(
                        "silent wrong answer: verify is clean but {} operations answer \
                         differently: {:?}",
                        wrong.len(),
                        &wrong[..wrong.len().min(5)]
                    ));
                }
            }
            Err(e) => violations.push(format!(
                "silent wrong answer: verify is clean but the reader fails: {e:#}"
            )),
        }
    }
    if files(&p) != (opj.clone(), log.clone()) {
        violations.push("verify or a reader changed the files".into());
    }

    // repair.
    let class;
    let mut named = 0;
    let mut in_ranges = 0;
    let mut results_lost = 0;
    let mut unnamed = 0;
    let mut traceless_answers = 0;
    match opjournal::repair(
        &p,
        &{
            let mut o = RepairOptions::default();
            o.backup = false;
            o
        },
        &mut |_, _| {},
    ) {
        Err(e) => {
            class = Class::CleanError;
            if files(&p) != (opj.clone(), log.clone()) {
                violations.push(format!("repair failed ({e}) and changed the files"));
            }
            if clean {
                violations.push(format!("verify is clean but repair refuses: {e:#}"));
            }
        }
        Ok(report) => {
            let v = opjournal::verify(&p);
            if !matches!(&v, Ok(v) if v.is_clean()) {
                violations.push(format!("verify is not clean after repair: {v:?}"));
            }
            let names: BTreeSet<&str> = report
                .lost
                .iter()
                .map(|l| l.operation_id.as_str())
                .collect();
            named = names.len();
            match answers_of(&p) {
                Ok(now) => {
                    // Every id before the damage, and every id after the repair.
                    let mut after = now;
                    if let Ok(more) = answers_for(&p, &all_ids) {
                        after.extend(more);
                    }
                    let changed = diff_ids(&img.answers, &after);
                    // An operation of which no byte survives (no receipt, no event, no
                    // log record) cannot be named by id: it must lie in a key range of the
                    // receipts table that the report names as unreadable. Likewise changes
                    // whose only trace was in a part of the log that is gone (the file was
                    // cut): the report must name the log's lost records, and the operation
                    // must answer as before those changes (its history a prefix of what it
                    // was), never with something it never had.
                    //
                    // "No byte of it left" is checked: an operation that answered with a
                    // receipt and has an intact receipt record left in the damaged file is
                    // not traceless (repair finds it there and must name it).
                    let log_cut = report.unreadable.iter().any(|f| f.table == "log");
                    let survivors = intact_receipt_ids(&opj);
                    let (traceless, unreported): (Vec<&String>, Vec<&String>) = changed
                        .iter()
                        .filter(|id| !names.contains(id.as_str()))
                        .partition(|id| {
                            let (b, a) = (img.answers.get(id.as_str()), after.get(id.as_str()));
                            let left = survivors.contains(id.as_str())
                                && b.is_some_and(|b| b.receipt.is_some());
                            let gone = !left
                                && a.is_none_or(|a| a.receipt.is_none() && a.history.is_empty());
                            let in_receipts_range = report
                                .unreadable
                                .iter()
                                .any(|f| f.table == "receipts" && in_range(&f.key, id));
                            let earlier = log_cut
                                && b.is_some_and(|b| {
                                    let a = a.map_or(&[][..], |a| &a.history[..]);
                                    a.len() < b.history.len() && b.history.starts_with(a)
                                });
                            gone && in_receipts_range || earlier
                        });
                    in_ranges = traceless.len();
                    traceless_answers = traceless
                        .iter()
                        .filter(|id| {
                            let (b, a) = (img.answers.get(id.as_str()), after.get(id.as_str()));
                            b.map(|b| (&b.receipt, &b.result)) != a.map(|a| (&a.receipt, &a.result))
                                && b.is_some_and(|b| b.receipt.is_some() || b.result.is_some())
                        })
                        .count();
                    unnamed = unreported.len();
                    // A result that was there before the damage and is gone now was taken by
                    // the damage (retention had not passed: the clock is the journal's own):
                    // its answer must say so, never that it aged out.
                    for id in &changed {
                        let had = img.answers.get(id).is_some_and(|b| b.result.is_some());
                        let Some(r) = after
                            .get(id)
                            .filter(|a| had && a.result.is_none())
                            .and_then(|a| a.receipt.as_ref())
                        else {
                            continue;
                        };
                        if r.status != opjournal::ExecutionStatus::Retired {
                            continue;
                        }
                        if matches!(r.retire_cause, Some(RetireCause::Damage { .. })) {
                            results_lost += 1;
                        } else {
                            violations.push(format!(
                                "{id}'s result was lost to damage but it answers {:?} (as if it \
                                 aged out)",
                                r.retire_cause
                            ));
                        }
                    }
                    if !unreported.is_empty() {
                        let first = unreported[0];
                        violations.push(format!(
                            "unreported loss: {} operations answer differently and are not \
                             named: {:?}; first: {}; report: {} named, unreadable {:?}, log \
                             records dropped {}",
                            unreported.len(),
                            &unreported[..unreported.len().min(5)],
                            describe(img.answers.get(first.as_str()), after.get(first.as_str())),
                            report.lost.len(),
                            report
                                .unreadable
                                .iter()
                                .map(|f| format!("{} {}", f.table, f.key))
                                .collect::<Vec<_>>(),
                            report.log_records_dropped,
                        ));
                    }
                    for id in &img.dropped_payloads {
                        if after.get(id).is_some_and(|a| a.result.is_some()) {
                            violations.push(format!("revived a dropped payload: {id}"));
                        }
                    }
                    if !clean || !changed.is_empty() || report.found_damage() {
                        class = Class::Repaired;
                    } else {
                        class = Class::Intact;
                    }
                }
                Err(e) => {
                    class = Class::Repaired;
                    violations.push(format!("the repaired journal does not read: {e:#}"));
                }
            }
        }
    }
    (
        kind,
        what,
        Outcome_ {
            class,
            violations,
            named,
            in_ranges,
            results_lost,
            unnamed,
            traceless_answers,
        },
    )
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    if let Some(h) = v.strip_prefix("0x") {
        u64::from_str_radix(h, 16).ok()
    } else {
        v.parse().ok()
    }
}

/// The seeds of `cases` cases, stratified: case `n` damages image `n % images` with kind
/// `(n / images) % kinds` (each a seed drawn from one fixed stream until it picks them), so
/// every image meets every kind of damage in any run of a few dozen cases, and a seed
/// replays its case alone.
fn stratified_seeds(images: &[Image], cases: u64) -> Vec<u64> {
    let mut stream = 0x5EED_0023_u64;
    (0..cases)
        .map(|n| {
            let which = (n % images.len() as u64) as usize;
            let kinds = kinds(&images[which]);
            let want = kinds[((n / images.len() as u64) % kinds.len() as u64) as usize];
            loop {
                let seed = rng(&mut stream);
                if image_of_seed(images, seed) == which && kind_of(&images[which], seed) == want {
                    return seed;
                }
            }
        })
        .collect()
}

/// The image a case's seed damages (its top byte).
fn image_of_seed(images: &[Image], seed: u64) -> usize {
    ((seed >> 56) % images.len() as u64) as usize
}

#[test]
fn a_seeded_corruption_sweep_has_no_panic_hang_silent_wrong_answer_or_unreported_loss() {
    let cases = env_u64("OPJ_SWEEP_CASES").unwrap_or(DEFAULT_CASES);
    let only = env_u64("OPJ_SWEEP_SEED");
    let ops = env_u64("OPJ_SWEEP_OPS").unwrap_or(220) as usize;
    let images = std::sync::Arc::new([build(ops, false), build(ops, true), build_acknowledged(60)]);
    for img in images.iter() {
        println!(
            "image {}: {} bytes{}; {} operations ({} retired); {} pages of receipts with inline \
             results",
            img.name,
            img.opj.len(),
            img.log
                .as_ref()
                .map_or(String::new(), |l| format!(" + a {} byte log", l.len())),
            img.answers.len(),
            img.dropped_payloads.len(),
            img.receipt_pages.len(),
        );
    }
    let seeds: Vec<u64> = match only {
        Some(s) => vec![s],
        None => stratified_seeds(&images[..], cases),
    };
    let mut counts: BTreeMap<(Damage, Class), u64> = BTreeMap::new();
    let mut kinds_seen: BTreeMap<Damage, u64> = BTreeMap::new();
    let mut classes: BTreeMap<Class, u64> = BTreeMap::new();
    let mut per_image: BTreeMap<&str, u64> = BTreeMap::new();
    let mut failures = Vec::new();
    let mut panics = 0;
    let mut hangs = 0;
    let mut named_total = 0;
    let mut in_ranges_total = 0;
    let mut traceless_by_kind: BTreeMap<Damage, usize> = BTreeMap::new();
    let mut traceless_answers_total = 0;
    let mut results_lost_total = 0;
    let mut unnamed_total = 0;
    let mut with_named_losses = 0;
    let start = std::time::Instant::now();
    for (n, seed) in seeds.iter().copied().enumerate() {
        let which = image_of_seed(&images[..], seed);
        let shared = images.clone();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                run_case(&shared[which], seed)
            }));
            let _ = tx.send(r);
        });
        let label = format!("case {n} seed={seed:#018x} ({})", images[which].name);
        match rx.recv_timeout(HANG) {
            Err(_) => {
                hangs += 1;
                failures.push(format!("{label}: hang (over {HANG:?})"));
                break;
            }
            Ok(Err(p)) => {
                panics += 1;
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                failures.push(format!("{label}: panic: {msg}"));
            }
            Ok(Ok((kind, what, out))) => {
                *counts.entry((kind, out.class)).or_default() += 1;
                *kinds_seen.entry(kind).or_default() += 1;
                *classes.entry(out.class).or_default() += 1;
                *per_image.entry(images[which].name).or_default() += 1;
                named_total += out.named;
                in_ranges_total += out.in_ranges;
                traceless_answers_total += out.traceless_answers;
                if out.in_ranges > 0 {
                    *traceless_by_kind.entry(kind).or_default() += out.in_ranges;
                }
                results_lost_total += out.results_lost;
                unnamed_total += out.unnamed;
                if out.named > 0 {
                    with_named_losses += 1;
                }
                for v in out.violations {
                    failures.push(format!("{label} [{what}]: {v}"));
                }
            }
        }
    }
    println!(
        "cases: {} in {:.0?}; by image: {per_image:?}",
        seeds.len(),
        start.elapsed()
    );
    println!("by class: {classes:?}");
    println!("by damage and class: {counts:?}");
    println!(
        "operations named in repair reports: {named_total} (in {with_named_losses} cases), of \
         which results lost to damage: {results_lost_total}; operations that changed and were \
         not named: {unnamed_total}"
    );
    println!(
        "operations lost without a trace (no byte of them left), inside an unreadable receipts \
         range or past the log's cut that the report names: {in_ranges_total} \
         {traceless_by_kind:?}; of which answered a lookup or a result before: \
         {traceless_answers_total}"
    );
    println!(
        "panics: {panics}, hangs: {hangs}, violations: {}",
        failures.len() - panics - hangs
    );
    assert!(
        failures.is_empty(),
        "{} failing cases:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert_eq!(unnamed_total, 0);
    if only.is_none() {
        // The sweep reached what it claims to check: every kind of damage, on every image,
        // every outcome, and losses (results lost to damage among them) that were named.
        let all = [
            Damage::FlipFile,
            Damage::ZeroPage,
            Damage::ZeroReceiptsPage,
            Damage::Truncate,
            Damage::AppendGarbage,
            Damage::FlipLog,
            Damage::TruncateLog,
        ];
        for kind in all {
            assert!(
                kinds_seen.get(&kind).is_some_and(|n| *n > 0),
                "{kind:?} never ran: {kinds_seen:?}"
            );
        }
        assert_eq!(per_image.len(), images.len(), "{per_image:?}");
        for class in [Class::Intact, Class::Repaired, Class::CleanError] {
            assert!(
                classes.get(&class).is_some_and(|n| *n > 0),
                "no {class:?} case: {classes:?}"
            );
        }
        assert!(
            with_named_losses > 0 && named_total > 0,
            "no repair named a loss"
        );
        assert!(
            results_lost_total > 0,
            "no result was lost to damage and named"
        );
    }
}
