//! The corruption suite for `opjournal verify` and `opjournal repair` (issue 4): bytes flipped
//! inside stored values and inside the storage engine's pages, the file truncated at page
//! boundaries, replaced with random bytes.
//!
//! Every case asserts what happened, not what was hoped: `verify` either finds the file
//! clean with every operation intact, or exits 1 naming what is damaged; it never panics.
//! `repair` then restores every operation whose events are intact (each compared by id with
//! what was written), says which ones it could not restore, and a second `verify` is
//! clean. The sweeps count their outcomes and assert that each expected path was reached.

mod cli_support;

use std::collections::BTreeMap;

use cli_support::*;
use opjournal::{ExecutionStatus, Inspector, Receipt};
use redb::{ReadableDatabase, TableDefinition};
use serde_json::Value;

const EVENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("events");
const RECEIPTS: TableDefinition<&str, &[u8]> = TableDefinition::new("receipts");
const RESULTS: TableDefinition<u64, &[u8]> = TableDefinition::new("results");
const PAGE: usize = 4096;

/// One stored value of the intact journal, and where copies of it lie in the file (the
/// live one, and stale ones on pages a later commit freed).
#[derive(Clone, Debug)]
struct Stored {
    /// The table a finding about it names (a result inline in its receipt is named by the
    /// receipt).
    table: &'static str,
    key: String,
    op: String,
    /// The event kind, for events.
    kind: String,
    bytes: Vec<u8>,
    copies: Vec<usize>,
}

impl Stored {
    /// Whether the byte range `[from, to)` of the file touches any copy.
    fn touched_by(&self, from: usize, to: usize) -> bool {
        self.copies
            .iter()
            .any(|&at| at < to && from < at + self.bytes.len())
    }

    /// Whether some copy lies wholly in the first `len` bytes.
    fn survives_truncation_to(&self, len: usize) -> bool {
        self.copies.iter().any(|&at| at + self.bytes.len() <= len)
    }
}

/// An intact journal, closed, and everything needed to judge a damaged copy of it.
struct Fixture {
    s: Sample,
    written: Vec<Written>,
    pristine: Vec<u8>,
    receipts: BTreeMap<String, Receipt>,
    events: Vec<Stored>,
    results: Vec<Stored>,
    receipt_values: Vec<Stored>,
}

fn copies_of(file: &[u8], value: &[u8]) -> Vec<usize> {
    file.windows(value.len())
        .enumerate()
        .filter(|(_, w)| *w == value)
        .map(|(i, _)| i)
        .collect()
}

fn fixture(n: usize) -> Fixture {
    let (s, written) = many(n);
    let pristine = s.bytes();
    let insp = Inspector::open(&s.path).expect("the intact journal opens");
    let mut receipts = BTreeMap::new();
    for w in &written {
        let r = insp.lookup(&w.id).expect("lookup").expect("recorded");
        receipts.insert(w.id.clone(), r);
    }
    let mut owners = BTreeMap::new();
    insp.for_each_event(0, |ev| {
        owners.insert(
            ev.seq,
            (
                ev.operation_id.clone().unwrap_or_default(),
                ev.kind.name().to_string(),
            ),
        );
        Ok(true)
    })
    .expect("events");
    drop(insp);
    let db = redb::Builder::new()
        .open_read_only(&s.path)
        .expect("redb opens the intact file");
    let txn = db.begin_read().expect("read");
    let mut events = Vec::new();
    let mut results = Vec::new();
    let mut receipt_values = Vec::new();
    {
        use redb::ReadableTable;
        for entry in txn
            .open_table(EVENTS)
            .expect("events")
            .iter()
            .expect("iter")
        {
            let (k, v) = entry.expect("entry");
            let (op, kind) = owners.get(&k.value()).cloned().unwrap_or_default();
            events.push(Stored {
                table: "events",
                key: k.value().to_string(),
                op,
                kind,
                bytes: v.value().to_vec(),
                copies: copies_of(&pristine, v.value()),
            });
        }
        for entry in txn
            .open_table(RESULTS)
            .expect("results")
            .iter()
            .expect("iter")
        {
            let (k, v) = entry.expect("entry");
            let (op, _) = owners.get(&k.value()).cloned().unwrap_or_default();
            results.push(Stored {
                table: "results",
                key: k.value().to_string(),
                op,
                kind: "result".into(),
                bytes: v.value().to_vec(),
                copies: copies_of(&pristine, v.value()),
            });
        }
        for entry in txn
            .open_table(RECEIPTS)
            .expect("receipts")
            .iter()
            .expect("iter")
        {
            let (k, v) = entry.expect("entry");
            // Format 3: a small result follows the receipt record in the same value.
            let value = v.value();
            let record_len = 12 + u32::from_le_bytes(value[4..8].try_into().expect("4")) as usize;
            let (record, inline) = value.split_at(record_len.min(value.len()));
            receipt_values.push(Stored {
                table: "receipts",
                key: k.value().to_string(),
                op: k.value().to_string(),
                kind: "receipt".into(),
                bytes: record.to_vec(),
                copies: copies_of(&pristine, record),
            });
            if !inline.is_empty() {
                results.push(Stored {
                    table: "receipts",
                    key: k.value().to_string(),
                    op: k.value().to_string(),
                    kind: "result".into(),
                    bytes: inline.to_vec(),
                    copies: copies_of(&pristine, inline),
                });
            }
        }
    }
    assert!(
        events.iter().all(|e| !e.copies.is_empty()),
        "every event is found in the file"
    );
    Fixture {
        s,
        written,
        pristine,
        receipts,
        events,
        results,
        receipt_values,
    }
}

/// What repair said.
#[derive(Debug, Default)]
struct Repaired {
    lost: BTreeMap<String, String>,
    quarantined: Vec<(String, String)>,
    salvaged: bool,
    in_place: bool,
}

/// How one damaged file went, for the tallies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Path {
    /// verify found nothing wrong, and every operation reads as written.
    Clean,
    /// verify exit 1; repair fixed it in place (the storage engine opened the file).
    RepairedInPlace,
    /// verify exit 1; the storage engine refused the file and repair salvaged its records.
    Salvaged,
    /// verify exit 1; nothing could be salvaged (repair exit 2, file untouched).
    BeyondSalvage,
    /// Not a journal at all (verify and repair exit 2).
    NotAJournal,
}

fn judge(fx: &Fixture, label: &str, damaged: &[u8], intact: &dyn Fn(&Stored) -> bool) -> Path {
    std::fs::write(&fx.s.path, damaged).expect("write the damaged file");
    let p = path_str(&fx.s.path);
    let o = run(&["--json", "verify", p]);
    let verify = code(&o);
    assert!(
        !stderr(&o).contains("panicked") && verify != 101,
        "{label}: verify panicked: {}",
        stderr(&o)
    );
    match verify {
        0 => {
            assert_all_as_written(fx, label, &Repaired::default(), intact);
            return Path::Clean;
        }
        1 => {
            // Every read command says what is wrong, or works; none panics.
            for cmd in ["stats", "ls", "log"] {
                let r = run(&[cmd, p]);
                let err = stderr(&r);
                assert!(
                    matches!(code(&r), 0 | 2) && !err.contains("panicked"),
                    "{label}: {cmd} exit {}: {err}",
                    code(&r)
                );
                assert!(
                    !err.contains("beyond what the storage engine can read"),
                    "{label}: a panic escaped the library in {cmd}: {err}"
                );
                if code(&r) == 2 {
                    assert!(
                        err.starts_with("error: ") && err.contains("\nhint: "),
                        "{label}: {cmd}: {err}"
                    );
                }
            }
            let findings: Vec<Value> = json_lines(&o)
                .into_iter()
                .filter(|(t, _)| t == "finding")
                .map(|(_, d)| d)
                .collect();
            let summary = json_lines(&o).pop().map(|(_, d)| d).unwrap_or_default();
            // Every problem counted is listed as a finding, or counted as one more past
            // the cap: a failed page check too, as a `(redb)` finding.
            let problems = summary["problems"].as_u64().unwrap_or_default();
            let more = summary["more_findings"].as_u64().unwrap_or_default();
            assert!(problems >= 1, "{label}: exit 1 counts a problem: {summary}");
            assert_eq!(
                findings.len() as u64 + more,
                problems,
                "{label}: each problem is a finding line: {summary}"
            );
            for f in &findings {
                assert!(
                    f["table"].as_str().is_some_and(|t| !t.is_empty())
                        && f["key"].as_str().is_some_and(|k| !k.is_empty())
                        && f["problem"].as_str().is_some_and(|p| !p.is_empty()),
                    "{label}: a finding names table, key and problem: {f}"
                );
            }
        }
        2 => {
            let err = stderr(&o);
            assert!(
                err.contains("is not an opjournal journal"),
                "{label}: {err}"
            );
            let r = run(&["repair", p]);
            assert_eq!(code(&r), 2, "{label}: {}", stderr(&r));
            assert!(
                fx.s.bytes() == damaged,
                "{label}: a refused repair leaves the file"
            );
            return Path::NotAJournal;
        }
        other => panic!("{label}: verify exit {other}: {}", stderr(&o)),
    }
    let o = run(&["--json", "repair", p, "--no-backup"]);
    let err = stderr(&o);
    assert!(!err.contains("panicked"), "{label}: repair panicked: {err}");
    if code(&o) == 2 {
        assert!(err.contains("is damaged beyond salvage"), "{label}: {err}");
        assert!(
            fx.s.bytes() == damaged,
            "{label}: an impossible repair leaves the file"
        );
        assert!(
            fx.events.iter().all(|e| !intact(e)),
            "{label}: repair gave up although some event was intact"
        );
        return Path::BeyondSalvage;
    }
    assert_eq!(code(&o), 0, "{label}: {err}");
    let mut rep = Repaired::default();
    for (t, d) in json_lines(&o) {
        let s = |k: &str| d[k].as_str().unwrap_or_default().to_string();
        match t.as_str() {
            "lost" => {
                rep.lost.insert(s("operation_id"), s("now"));
            }
            "quarantined" => rep.quarantined.push((s("table"), s("key"))),
            "summary" => {
                // Salvaged: the storage engine refused the file, and every record came from
                // its raw bytes.
                rep.salvaged = d["engine"] == "refused";
                rep.in_place = !rep.salvaged;
            }
            _ => {}
        }
    }
    let again = run(&["verify", p]);
    assert_eq!(
        code(&again),
        0,
        "{label}: verify after repair is clean:\n{}{}",
        stdout(&again),
        stderr(&again)
    );
    assert_all_as_written(fx, label, &rep, intact);
    if rep.salvaged {
        Path::Salvaged
    } else {
        Path::RepairedInPlace
    }
}

/// Every operation whose events are intact reads exactly as written (receipt and result);
/// every other one reads as written or is named by repair.
fn assert_all_as_written(
    fx: &Fixture,
    label: &str,
    rep: &Repaired,
    intact: &dyn Fn(&Stored) -> bool,
) {
    let insp =
        Inspector::open(&fx.s.path).unwrap_or_else(|e| panic!("{label}: the journal opens: {e}"));
    for w in &fx.written {
        let events_intact = fx.events.iter().filter(|e| e.op == w.id).all(intact);
        let result_intact = fx.results.iter().filter(|r| r.op == w.id).all(intact);
        let now = insp
            .lookup(&w.id)
            .unwrap_or_else(|e| panic!("{label}: lookup {}: {e}", w.id));
        let result = insp.result(&w.id).ok().flatten().map(|r| r.bytes);
        let exact = now.as_ref() == fx.receipts.get(&w.id) && result.as_ref() == Some(&w.result);
        if exact {
            continue;
        }
        let said = rep.lost.get(&w.id).map(String::as_str);
        assert!(
            !(events_intact && result_intact),
            "{label}: `{}` has intact events and result but reads {now:?} (repair said {said:?})",
            w.id
        );
        match said {
            Some("expired") => {
                let r = now.unwrap_or_else(|| panic!("{label}: expired `{}` is recorded", w.id));
                assert_eq!(r.status, ExecutionStatus::Retired, "{label}: {}", w.id);
                assert_eq!(r.result_revision, Some(w.revision), "{label}: {}", w.id);
            }
            Some("kept") => {
                let r = now.unwrap_or_else(|| panic!("{label}: kept `{}` is recorded", w.id));
                assert_eq!(r.result_revision, Some(w.revision), "{label}: {}", w.id);
            }
            Some("in_doubt") => {
                assert!(
                    !events_intact,
                    "{label}: `{}` in doubt with intact events",
                    w.id
                );
                let r = now.unwrap_or_else(|| panic!("{label}: `{}` is recorded", w.id));
                assert_eq!(r.status, ExecutionStatus::InDoubt, "{label}: {}", w.id);
            }
            other => {
                // Salvage cannot name an operation none of whose records survived.
                assert!(
                    rep.salvaged && !events_intact && now.is_none(),
                    "{label}: `{}` reads {now:?} but repair said {other:?}",
                    w.id
                );
            }
        }
    }
}

fn flip(bytes: &[u8], at: usize) -> Vec<u8> {
    let mut b = bytes.to_vec();
    b[at] ^= 0x5a;
    b
}

/// Damages every copy of `value` (so the live one is surely hit) one byte before its end.
fn damage_value(fx: &Fixture, value: &Stored) -> (Vec<u8>, Vec<usize>) {
    let mut b = fx.pristine.clone();
    let mut at = Vec::new();
    for &c in &value.copies {
        let i = c + value.bytes.len() - 2;
        b[i] ^= 0x5a;
        at.push(i);
    }
    (b, at)
}

fn finding_names(o: &std::process::Output, table: &str, key: &str) -> bool {
    json_lines(o)
        .into_iter()
        .any(|(t, d)| t == "finding" && d["table"] == table && d["key"] == key)
}

// ---- values ----

#[test]
fn verify_exits_1_naming_each_damaged_event_and_repair_restores_every_other_operation() {
    let fx = fixture(24);
    let mut by_kind: BTreeMap<String, Vec<&Stored>> = BTreeMap::new();
    for e in &fx.events {
        by_kind.entry(e.kind.clone()).or_default().push(e);
    }
    let mut tally: BTreeMap<&str, usize> = BTreeMap::new();
    for (kind, events) in &by_kind {
        for e in events.iter().step_by(5).take(2) {
            let label = format!("event {} ({kind} of {})", e.key, e.op);
            let (damaged, at) = damage_value(&fx, e);
            std::fs::write(&fx.s.path, &damaged).expect("write");
            let o = run(&["--json", "verify", path_str(&fx.s.path)]);
            assert_eq!(code(&o), 1, "{label}: {}", stderr(&o));
            assert!(
                finding_names(&o, "events", &e.key),
                "{label}: {}",
                stdout(&o)
            );
            let intact = |v: &Stored| !at.iter().any(|&i| v.touched_by(i, i + 1));
            let path = judge(&fx, &label, &damaged, &intact);
            assert_eq!(path, Path::RepairedInPlace, "{label}");
            let o = run(&["--json", "ls", path_str(&fx.s.path), "--status", "in_doubt"]);
            let doubtful: Vec<String> = json_lines(&o)
                .into_iter()
                .filter(|(t, _)| t == "receipt")
                .map(|(_, d)| d["operation_id"].as_str().unwrap_or_default().to_string())
                .collect();
            // Without its submission or its outcome, the outcome is unknown: in doubt. A
            // lost delivery or acknowledgement keeps the outcome.
            match kind.as_str() {
                "submitted" | "completed" => {
                    assert_eq!(doubtful, std::slice::from_ref(&e.op), "{label}");
                    *tally.entry("in_doubt").or_default() += 1;
                }
                _ => {
                    assert!(doubtful.is_empty(), "{label}: {doubtful:?}");
                    *tally.entry("kept").or_default() += 1;
                }
            }
        }
    }
    assert!(
        tally.get("in_doubt") >= Some(&2) && tally.get("kept") >= Some(&2),
        "{tally:?}"
    );
}

#[test]
fn a_damaged_receipt_is_named_and_rebuilt_from_the_events_losing_nothing() {
    let fx = fixture(12);
    for r in fx.receipt_values.iter().step_by(4) {
        let label = format!("receipt {}", r.key);
        let (damaged, _) = damage_value(&fx, r);
        std::fs::write(&fx.s.path, &damaged).expect("write");
        let o = run(&["--json", "verify", path_str(&fx.s.path)]);
        assert_eq!(code(&o), 1, "{label}");
        assert!(
            finding_names(&o, "receipts", &r.key),
            "{label}: {}",
            stdout(&o)
        );
        // `ls` reads every receipt: it stops at the damaged one and says what to do.
        let ls = run(&["ls", path_str(&fx.s.path)]);
        assert_eq!(code(&ls), 2, "{label}");
        assert!(
            stderr(&ls).contains(&format!(
                "damaged record in table `receipts` at key `{}`",
                r.key
            )) && stderr(&ls).contains("hint: `opjournal verify"),
            "{label}: {}",
            stderr(&ls)
        );
        // Receipts are an index of the events, which are all intact: nothing is lost.
        let path = judge(&fx, &label, &damaged, &|_| true);
        assert_eq!(path, Path::RepairedInPlace, "{label}");
    }
}

#[test]
fn a_damaged_result_is_named_and_its_operation_answers_expired_after_repair() -> TestResult {
    let fx = fixture(12);
    let r = &fx.results[3];
    let (damaged, at) = damage_value(&fx, r);
    std::fs::write(&fx.s.path, &damaged)?;
    let p = path_str(&fx.s.path);
    let o = run(&["--json", "verify", p]);
    assert_eq!(code(&o), 1);
    assert!(finding_names(&o, r.table, &r.key), "{}", stdout(&o));
    // `show` still shows the receipt and the history, and says the result is unreadable.
    let show = run(&["show", p, &r.op]);
    assert_eq!(code(&show), 1, "{}", stderr(&show));
    assert!(
        stdout(&show).contains(&format!(
            "result: cannot be read: corrupt record in table `{}`",
            r.table
        )),
        "{}",
        stdout(&show)
    );
    assert!(
        stdout(&show).contains("history (2 events)"),
        "{}",
        stdout(&show)
    );
    let intact = |v: &Stored| !at.iter().any(|&i| v.touched_by(i, i + 1));
    assert_eq!(
        judge(&fx, "result", &damaged, &intact),
        Path::RepairedInPlace
    );
    let insp = Inspector::open(&fx.s.path)?;
    let now = insp.lookup(&r.op)?.ok_or("still recorded")?;
    assert_eq!(
        now.status,
        ExecutionStatus::Retired,
        "the outcome stays; the payload is gone"
    );
    Ok(())
}

// ---- pages ----

/// Flips one byte at a time at seven offsets of every page of the file (page headers, keys,
/// values, page ends), and at several in the file header.
fn sweep(fx: &Fixture, pages: impl Iterator<Item = usize>) -> BTreeMap<Path, usize> {
    const OFFSETS: [usize; 7] = [0, 1, 9, 100, 1000, 2048, 4095];
    let mut tally = BTreeMap::new();
    for page in pages {
        let offsets: Vec<usize> = if page == 0 {
            vec![0, 9, 16, 64, 200, 512, 1000]
        } else {
            OFFSETS.to_vec()
        };
        for off in offsets {
            let at = page * PAGE + off;
            if at >= fx.pristine.len() {
                continue;
            }
            let label = format!("page {page} + {off}");
            let intact = |v: &Stored| !v.touched_by(at, at + 1);
            *tally
                .entry(judge(fx, &label, &flip(&fx.pristine, at), &intact))
                .or_default() += 1;
        }
    }
    tally
}

#[test]
fn page_flips_in_the_first_half_are_harmless_or_reported_and_repaired() {
    let fx = fixture(24);
    let pages = fx.pristine.len() / PAGE;
    let tally = sweep(&fx, 0..pages / 2);
    eprintln!("first half: {tally:?}");
    for path in [Path::Clean, Path::RepairedInPlace, Path::Salvaged] {
        assert!(
            tally.get(&path) > Some(&0),
            "the sweep reached {path:?}: {tally:?}"
        );
    }
}

#[test]
fn page_flips_in_the_second_half_are_harmless_or_reported_and_repaired() {
    let fx = fixture(24);
    let pages = fx.pristine.len() / PAGE;
    let tally = sweep(&fx, pages / 2..pages);
    eprintln!("second half: {tally:?}");
    for path in [Path::Clean, Path::RepairedInPlace] {
        assert!(
            tally.get(&path) > Some(&0),
            "the sweep reached {path:?}: {tally:?}"
        );
    }
}

// ---- truncation and random bytes ----

#[test]
fn truncation_is_reported_and_repair_salvages_every_operation_whose_events_survive() {
    let fx = fixture(24);
    let len = fx.pristine.len();
    let mut tally = BTreeMap::new();
    for cut in [
        1,
        9,
        100,
        PAGE - 1,
        PAGE,
        PAGE + 1,
        2 * PAGE,
        len / 2,
        len - PAGE,
        len - 1,
    ] {
        let label = format!("truncated to {cut}");
        let intact = |v: &Stored| v.survives_truncation_to(cut);
        *tally
            .entry(judge(&fx, &label, &fx.pristine[..cut], &intact))
            .or_default() += 1;
    }
    eprintln!("truncation: {tally:?}");
    for path in [Path::NotAJournal, Path::BeyondSalvage, Path::Salvaged] {
        assert!(
            tally.get(&path) > Some(&0),
            "truncation reached {path:?}: {tally:?}"
        );
    }
}

fn random_bytes(n: usize, mut x: u64) -> Vec<u8> {
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()[3]
        })
        .collect()
}

#[test]
fn random_bytes_are_not_a_journal_and_repair_writes_nothing() {
    let fx = fixture(6);
    let p = path_str(&fx.s.path);
    let noise = random_bytes(fx.pristine.len(), 0x9e37_79b9_7f4a_7c15);
    assert_eq!(judge(&fx, "random", &noise, &|_| false), Path::NotAJournal);
    for cmd in ["stats", "ls", "log", "export", "verify"] {
        let o = run(&[cmd, p]);
        assert_eq!(code(&o), 2, "{cmd}");
        assert!(
            stderr(&o).contains("is not an opjournal journal"),
            "{cmd}: {}",
            stderr(&o)
        );
    }
    let listing = std::fs::read_dir(fx.s.dir.path())
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(listing, 1, "no backup of a file that is not a journal");
}

#[test]
fn random_bytes_behind_an_intact_header_are_damage_beyond_salvage_and_never_a_panic() {
    let fx = fixture(6);
    let p = path_str(&fx.s.path);
    let mut damaged = fx.pristine[..PAGE].to_vec();
    damaged.extend(random_bytes(
        fx.pristine.len() - PAGE,
        0x2545_f491_4f6c_dd1d,
    ));
    assert_eq!(
        judge(&fx, "random body", &damaged, &|_| false),
        Path::BeyondSalvage
    );
    for cmd in ["stats", "ls", "log", "export"] {
        let o = run(&[cmd, p]);
        assert_eq!(code(&o), 2, "{cmd}");
        let err = stderr(&o);
        assert!(
            err.starts_with(&format!("error: `{p}` is damaged")),
            "{cmd}: {err}"
        );
        assert!(err.contains("hint: "), "{cmd}: {err}");
    }
}

// ---- index entries ----

const TIMERS: TableDefinition<(u8, u64, &str), ()> = TableDefinition::new("timers");

/// Removes from the journal at `path` the first `timers` entry of `op` (written directly
/// with redb, so the events and receipts stay intact), and returns its key.
fn remove_timer_of(
    path: &std::path::Path,
    op: &str,
) -> Result<(u8, u64, String), Box<dyn std::error::Error>> {
    use redb::ReadableTable;
    let db = redb::Database::open(path)?;
    let txn = db.begin_write()?;
    let key = {
        let mut timers = txn.open_table(TIMERS)?;
        let mut found = None;
        for entry in timers.iter()? {
            let (k, _) = entry?;
            let (kind, due, owner) = k.value();
            if owner == op {
                found = Some((kind, due, owner.to_string()));
                break;
            }
        }
        let key = found.ok_or_else(|| format!("no timer of `{op}`"))?;
        timers.remove((key.0, key.1, key.2.as_str()))?;
        key
    };
    txn.commit()?;
    Ok(key)
}

/// An index entry lost while every event and receipt is intact (the lease timer of a
/// running operation): every operation still answers as before, but the rebuild restores
/// the entry, so `repair --dry-run` exits 1 naming the table and counting the entry, as
/// `verify` exits 1; on the clean journal, before and after the repair, it exits 0.
#[test]
fn a_dry_run_exits_1_naming_the_index_table_whose_lost_entry_the_rebuild_restores() -> TestResult {
    let s = sample();
    let p = path_str(&s.path);
    let o = run(&["--json", "repair", "--dry-run", p]);
    assert_eq!(code(&o), 0, "clean: {}{}", stdout(&o), stderr(&o));
    let lines = json_lines(&o);
    let (_, summary) = lines.last().ok_or("a summary")?;
    assert_eq!(summary["index_entries_changed"], 0, "{summary}");

    let key = remove_timer_of(&s.path, "op_run")?;
    let o = run(&["verify", p]);
    assert_eq!(
        code(&o),
        1,
        "verify finds the missing timer: {}",
        stdout(&o)
    );
    assert!(stdout(&o).contains("timers"), "{}", stdout(&o));
    let before = s.bytes();

    let o = run(&["--json", "repair", "--dry-run", p]);
    assert_eq!(code(&o), 1, "{}{}", stdout(&o), stderr(&o));
    let lines = json_lines(&o);
    let (_, summary) = lines.last().ok_or("a summary")?;
    assert_eq!(
        summary["lost"], 0,
        "no operation answers differently: {summary}"
    );
    assert_eq!(summary["index_entries_changed"], 1, "{summary}");
    assert_eq!(
        summary["index_changes"]["timers"],
        serde_json::json!({"added": 1, "removed": 0, "changed": 0}),
        "{summary}"
    );
    let o = run(&["repair", "--dry-run", p]);
    assert_eq!(code(&o), 1, "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("index: 1 entry")
            && out
                .lines()
                .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["timers", "1", "0", "0"]),
        "the human report names the table: {out}"
    );
    assert!(s.bytes() == before, "a dry run writes nothing");

    let o = run(&["repair", "--no-backup", p]);
    assert_eq!(code(&o), 0, "{}{}", stdout(&o), stderr(&o));
    assert_eq!(code(&run(&["verify", p])), 0, "the timer {key:?} is back");
    let o = run(&["repair", "--dry-run", p]);
    assert_eq!(code(&o), 0, "repaired: {}{}", stdout(&o), stderr(&o));
    Ok(())
}
