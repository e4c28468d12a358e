//! `opjournal backup` and the dump (`export --dump`, `import`): a backup taken beside a live
//! writer in another process is a complete, closed journal that verifies clean; a dump
//! imported and exported again is the same dump; a bad dump or an existing destination
//! writes nothing.

mod cli_support;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cli_support::*;
use opjournal::{
    Admission, ErrorKind, ExecutionStatus, Inspector, Intent, Journal, Operation, Outcome,
};
use serde_json::Value;

fn edit(n: u64) -> Operation {
    let intent = Intent::from_json("doc.edit", &serde_json::json!({ "n": n })).expect("an intent");
    Operation::new(format!("op_w{n:05}"), intent)
        .scope("doc/main")
        .base_revision(n)
}

fn commit_edit(journal: &Journal, n: u64) {
    match journal.submit(edit(n)).expect("submit") {
        Admission::Fresh(claim) => {
            journal
                .complete(
                    &claim,
                    Outcome::applied(n + 1, format!("edit {n}").into_bytes()),
                )
                .expect("complete");
        }
        other => panic!("fresh work expected: {other:?}"),
    }
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("a readable directory")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    v.sort();
    v
}

fn summary(o: &std::process::Output) -> Value {
    let lines = json_lines(o);
    let (ty, data) = lines.last().expect("a summary line").clone();
    assert_eq!(ty, "summary");
    data
}

// ---- backup ----

#[test]
fn backup_of_a_journal_open_in_another_process_verifies_clean_and_holds_every_committed_operation()
-> TestResult {
    let s = Sample::empty_dir();
    let journal = Arc::new(Journal::open(&s.path)?);
    // Committed, not checkpointed: the default checkpoint size (16 MiB) keeps these in the log.
    for n in 0..20 {
        commit_edit(&journal, n);
    }
    let log = s.dir.path().join("project.opj-log");
    assert!(
        std::fs::metadata(&log)?.len() > 0,
        "the writer's log holds the commits"
    );
    // The writer keeps committing while the backup (another process) copies.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (journal, stop) = (journal.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 20;
            while !stop.load(Ordering::SeqCst) {
                commit_edit(&journal, n);
                n += 1;
            }
            n
        })
    };
    let started = Instant::now();
    while journal.stats()?.applied < 25 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the writer makes progress"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let before = journal.stats()?.applied;
    let dest = s.dir.path().join("copy.opj");
    let o = run(&["--json", "backup", path_str(&s.path), path_str(&dest)]);
    stop.store(true, Ordering::SeqCst);
    let committed = writer.join().map_err(|_| "the writer panicked")?;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("note: a writer has the journal open"),
        "{}",
        stderr(&o)
    );
    let sum = summary(&o);
    assert_eq!(sum["command"], "backup");
    assert_eq!(sum["access"], "live");
    assert!(
        sum["log_records"].as_u64() > Some(0),
        "the copy includes records still in the log: {sum}"
    );
    // One closed file: no log beside the copy.
    assert!(!s.dir.path().join("copy.opj-log").exists());
    assert!(
        !names(s.dir.path()).iter().any(|n| n.contains("creating")),
        "{:?}",
        names(s.dir.path())
    );
    let o = run(&["--json", "verify", path_str(&dest)]);
    assert_eq!(code(&o), 0, "verify on the copy: {}", stdout(&o));
    assert_eq!(summary(&o)["problems"], 0);

    // Every operation committed before the backup began is in the copy, with its result;
    // the copy holds a prefix of the writer's history (a consistent snapshot).
    let copy = Inspector::open(&dest)?;
    let copied = copy.stats()?.applied;
    assert!(
        copied >= before,
        "{copied} copied, {before} committed before"
    );
    assert!(copied <= committed as u64);
    for n in 0..copied {
        let id = format!("op_w{n:05}");
        let r = copy.lookup(&id)?.ok_or(format!("{id} is in the copy"))?;
        assert_eq!(r.status, ExecutionStatus::Applied, "{id}");
        let res = copy.result(&id)?.ok_or(format!("{id}'s result"))?;
        assert_eq!(res.bytes, format!("edit {n}").into_bytes());
    }
    drop(copy);
    drop(journal);

    // The copy is a journal a writer opens and continues: a retry replays, new work goes on.
    let j = Journal::open(&dest)?;
    match j.submit(edit(0))? {
        Admission::Replay(r) => assert_eq!(r.result.bytes, b"edit 0"),
        other => panic!("a copied outcome replays, not {other:?}"),
    }
    // The operation that was running when the copy was taken is in doubt now, as after a
    // crash: its claim holder is not this process. New work goes on.
    let running = format!("op_w{copied:05}");
    if let Some(r) = j.lookup(&running)? {
        assert_eq!(r.status, ExecutionStatus::InDoubt, "{running}");
    }
    commit_edit(&j, copied + 1);
    Ok(())
}

#[test]
fn journal_backup_copies_what_the_handle_committed_log_included_without_holding_it_up() -> TestResult
{
    let s = Sample::empty_dir();
    let journal = Journal::open(&s.path)?;
    for n in 0..10 {
        commit_edit(&journal, n);
    }
    let dest = s.dir.path().join("copy.opj");
    let report = journal.backup(&dest)?;
    assert_eq!(
        (report.events, report.receipts, report.results),
        (20, 10, 10)
    );
    // The writer goes on; the copy is of the moment it was taken.
    commit_edit(&journal, 10);
    let o = run(&["--json", "verify", path_str(&dest)]);
    assert_eq!(code(&o), 0, "{}", stdout(&o));
    let copy = Inspector::open(&dest)?;
    assert_eq!(copy.stats()?.applied, 10);
    assert_eq!(
        copy.result("op_w00009")?.ok_or("a result")?.bytes,
        b"edit 9"
    );
    drop(copy);
    let e = journal
        .backup(&dest)
        .expect_err("the destination exists now");
    assert!(matches!(e.kind(), ErrorKind::InvalidInput { .. }), "{e:?}");
    Ok(())
}

#[test]
fn backup_refuses_an_existing_destination_and_writes_nothing() -> TestResult {
    let s = sample();
    let dest = s.dir.path().join("taken.opj");
    std::fs::write(&dest, b"keep me")?;
    let listing = names(s.dir.path());
    let source = s.bytes();
    let o = run(&["backup", path_str(&s.path), path_str(&dest)]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("already exists") && stderr(&o).contains(path_str(&dest)),
        "{}",
        stderr(&o)
    );
    assert!(
        stderr(&o).contains("hint: choose another path"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read(&dest)?, b"keep me");
    assert_eq!(names(s.dir.path()), listing, "nothing new beside it");
    assert_eq!(s.bytes(), source, "the source is never written");
    let e = opjournal::backup(&s.path, &dest).expect_err("refused");
    assert!(matches!(e.kind(), ErrorKind::InvalidInput { .. }), "{e:?}");
    assert!(e.to_string().contains("taken.opj"), "{e}");
    assert_eq!(names(s.dir.path()), listing);
    // To a free path it copies, and the source's bytes stay as they were.
    let free = s.dir.path().join("free.opj");
    let o = run(&["backup", path_str(&s.path), path_str(&free)]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(s.bytes(), source, "the source is never written");
    Ok(())
}

#[test]
fn backup_of_a_journal_with_a_damaged_record_writes_nothing_and_points_to_repair() -> TestResult {
    use redb::{ReadableTable, TableDefinition};
    const EVENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("events");
    let s = sample();
    // One bit flipped inside an event's stored value: its CRC fails.
    let seq = {
        let db = redb::Database::open(&s.path)?;
        let txn = db.begin_write()?;
        let seq = {
            let mut t = txn.open_table(EVENTS)?;
            let (seq, mut value) = {
                let (k, v) = t.last()?.ok_or("events")?;
                (k.value(), v.value().to_vec())
            };
            let last = value.len() - 1;
            value[last / 2] ^= 0x10;
            t.insert(seq, value.as_slice())?;
            seq
        };
        txn.commit()?;
        seq
    };
    let listing = names(s.dir.path());
    let dest = s.dir.path().join("copy.opj");
    let o = run(&["backup", path_str(&s.path), path_str(&dest)]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("events")
            && err.contains(&seq.to_string())
            && err.contains("opjournal repair"),
        "names the record and the next step: {err}"
    );
    assert!(!dest.exists(), "nothing at the destination");
    assert_eq!(names(s.dir.path()), listing, "nothing new beside it");
    let e = opjournal::backup(&s.path, &dest).expect_err("refused");
    assert!(matches!(e.kind(), ErrorKind::Corrupt { .. }), "{e:?}");
    // After a repair, the backup is made, and verify passes on it.
    assert_eq!(code(&run(&["repair", path_str(&s.path)])), 0);
    let o = run(&["backup", path_str(&s.path), path_str(&dest)]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(code(&run(&["verify", path_str(&dest)])), 0);
    Ok(())
}

#[test]
fn a_format_1_journal_dumps_and_imports_as_a_journal_of_this_format() -> TestResult {
    let dir = tempfile::tempdir()?;
    let v1 = dir.path().join("v1.opj");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1.opj"),
        &v1,
    )?;
    let (first, _) = dump_of(&v1);
    let header: Value = serde_json::from_str(&first[0])?;
    assert_eq!(header["data"]["format_version"], 1);
    let dest = dir.path().join("v2.opj");
    let o = run(&["import", "-", path_str(&dest)]);
    assert_eq!(code(&o), 2, "an empty dump is refused: {}", stderr(&o));
    assert!(stderr(&o).contains("the dump is empty"), "{}", stderr(&o));
    opjournal::import_dump((first.join("\n") + "\n").as_bytes(), &dest)?;
    let (again, _) = dump_of(&dest);
    // The same events and results; the header names this build's format.
    assert_eq!(again[1..], first[1..]);
    assert_eq!(
        again[0],
        first[0].replace(
            r#""format_version":1"#,
            &format!(r#""format_version":{}"#, opjournal::FORMAT_VERSION)
        )
    );
    let o = run(&["verify", path_str(&dest)]);
    assert_eq!(code(&o), 0, "{}", stdout(&o));
    Ok(())
}

// ---- the dump ----

/// The sample journal plus an operation with a binary result (written as hex).
fn sample_with_binary() -> Sample {
    let s = sample();
    {
        let j = s.open();
        let op = Operation::new(
            "op_bin",
            Intent::from_json("asset.bake", &serde_json::json!({"lod": 2})).expect("intent"),
        )
        .scope("asset/tree");
        match j.submit(op).expect("submit") {
            Admission::Fresh(c) => {
                j.complete(&c, Outcome::applied(1, vec![0xff, 0x00, 0x7f, 0x80]))
                    .expect("complete");
            }
            other => panic!("{other:?}"),
        }
    }
    s
}

/// `export --dump`'s lines, and its summary apart.
fn dump_of(path: &Path) -> (Vec<String>, Value) {
    let o = run(&["export", path_str(path), "--dump"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let mut lines: Vec<String> = stdout(&o).lines().map(str::to_string).collect();
    let last = lines.pop().expect("a summary");
    let v: Value = serde_json::from_str(&last).expect("JSON");
    assert_eq!(v["type"], "summary");
    (lines, v["data"].clone())
}

#[test]
fn export_import_export_gives_the_same_dump() -> TestResult {
    let s = sample_with_binary();
    let (first, sum1) = dump_of(&s.path);
    assert!(
        first[0].starts_with(r#"{"type":"dump","data":{"#),
        "{}",
        first[0]
    );
    let header: Value = serde_json::from_str(&first[0])?;
    assert_eq!(header["data"]["dump_version"], opjournal::DUMP_VERSION);
    assert_eq!(header["data"]["format_version"], opjournal::FORMAT_VERSION);
    assert!(header["data"]["clock_high_water"].as_u64() > Some(0));
    assert!(
        first
            .iter()
            .any(|l| l.contains(r#""encoding":"hex""#) && l.contains("ff007f80"))
    );
    assert!(first.iter().any(|l| l.contains(r#"{"type":"dump_end""#)));

    // Through a file, and through stdin.
    let dump_file = s.dir.path().join("dump.jsonl");
    let full = run(&["export", path_str(&s.path), "--dump"]);
    std::fs::write(&dump_file, &full.stdout)?;
    let a = s.dir.path().join("a.opj");
    let o = run(&["--json", "import", path_str(&dump_file), path_str(&a)]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(summary(&o)["events"], sum1["events"]);
    let b = s.dir.path().join("b.opj");
    let o = opjournal(&["import", "-", path_str(&b)])
        .write_stdin(full.stdout.clone())
        .output()?;
    assert_eq!(code(&o), 0, "{}", stderr(&o));

    for imported in [&a, &b] {
        let (again, sum2) = dump_of(imported);
        // Byte-identical, line for line; only the CLI's summary line (after the dump)
        // differs, in `file` and `elapsed_ms`.
        assert_eq!(again, first, "{}", imported.display());
        let strip = |mut v: Value| {
            let m = v.as_object_mut().expect("an object");
            m.remove("file");
            m.remove("elapsed_ms");
            v
        };
        assert_eq!(strip(sum2), strip(sum1.clone()));
        let o = run(&["verify", path_str(imported)]);
        assert_eq!(code(&o), 0, "{}", stdout(&o));
        assert!(!Path::new(&format!("{}-log", imported.display())).exists());
    }
    Ok(())
}

#[test]
fn import_refuses_a_damaged_dump_naming_the_line_and_writes_nothing() -> TestResult {
    let s = sample_with_binary();
    let (lines, _) = dump_of(&s.path);
    let dir = tempfile::tempdir()?;
    let dest = dir.path().join("restored.opj");
    let import = |text: String| {
        let o = opjournal(&["import", "-", path_str(&dest)])
            .write_stdin(text.into_bytes())
            .output()
            .expect("runs");
        assert_eq!(code(&o), 2, "{}", stderr(&o));
        assert!(!dest.exists(), "nothing at the destination");
        assert_eq!(
            names(dir.path()),
            Vec::<String>::new(),
            "no temporary file left"
        );
        stderr(&o)
    };
    let join = |v: &[String]| v.join("\n") + "\n";

    // A line that is not a record.
    let mut bad = lines.clone();
    bad[4] = r#"{"type":"event","data":{"seq":"#.into();
    let err = import(join(&bad));
    assert!(err.contains("line 5 of the dump"), "{err}");
    assert!(err.contains("nothing was imported"), "{err}");

    // Events out of order: the first event again.
    let mut bad = lines.clone();
    bad.insert(2, lines[1].clone());
    let err = import(join(&bad));
    assert!(err.contains("line 3 of the dump"), "{err}");
    assert!(err.contains("increasing seq order"), "{err}");

    // An event whose operation's history does not hold it (a completion without submission).
    let completed = lines
        .iter()
        .position(|l| l.contains(r#""kind":"completed""#))
        .ok_or("a completion")?;
    let mut bad = lines.clone();
    let submitted = bad
        .iter()
        .position(|l| l.contains(r#""kind":"submitted""#))
        .ok_or("a submission")?;
    assert!(submitted < completed);
    let doomed = bad[completed].clone();
    let op: Value = serde_json::from_str(&doomed)?;
    let op = op["data"]["operation_id"]
        .as_str()
        .ok_or("an id")?
        .to_string();
    bad.retain(|l| {
        !(l.contains(r#""kind":"submitted""#) && l.contains(&format!(r#""operation_id":"{op}""#)))
    });
    let err = import(join(&bad));
    assert!(err.contains("does not fit the history"), "{err}");

    // Cut short: no end line.
    let err = import(join(&lines[..lines.len() - 1]));
    assert!(
        err.contains(&format!("line {} of the dump", lines.len())),
        "{err}"
    );
    assert!(err.contains("cut short"), "{err}");

    // A result edited after the fact.
    let r = lines
        .iter()
        .position(|l| l.contains(r#""type":"result""#) && l.contains("light-1"))
        .ok_or("a result line")?;
    let mut bad = lines.clone();
    bad[r] = bad[r].replace("light-1", "light-2");
    let err = import(join(&bad));
    assert!(
        err.contains(&format!("line {} of the dump", r + 1)),
        "{err}"
    );
    assert!(err.contains("does not match"), "{err}");

    // Newer versions are named with this build's.
    let mut bad = lines.clone();
    bad[0] = bad[0].replace(r#""dump_version":1"#, r#""dump_version":99"#);
    let err = import(join(&bad));
    assert!(
        err.contains("line 1") && err.contains("dump version 99") && err.contains("(version 1)"),
        "{err}"
    );
    let mut bad = lines.clone();
    let ours = opjournal::FORMAT_VERSION;
    bad[0] = bad[0].replace(
        &format!(r#""format_version":{ours}"#),
        r#""format_version":7"#,
    );
    let err = import(join(&bad));
    assert!(
        err.contains("format version 7") && err.contains(&format!("(version {ours})")),
        "{err}"
    );

    // The library's typed error.
    let e = opjournal::import_dump(join(&bad).as_bytes(), &dest).expect_err("refused");
    assert!(
        matches!(e.kind(), ErrorKind::InvalidDump { line: 1, .. }),
        "{e:?}"
    );
    assert!(!e.is_retryable());
    assert!(!dest.exists());
    Ok(())
}

#[test]
fn an_imported_journal_replays_recorded_results_without_re_executing() -> TestResult {
    let s = sample_with_binary();
    let dump = run(&["export", path_str(&s.path), "--dump"]).stdout;
    let dest = s.dir.path().join("restored.opj");
    opjournal::import_dump(dump.as_slice(), &dest)?;
    let j = Journal::builder().clock(s.clock.clone()).open(&dest)?;
    let op = Operation::new(
        "op_7f3",
        Intent::from_json("scene.add_light", &serde_json::json!({"near": "door"}))?,
    )
    .scope("scene/main")
    .base_revision(183)
    .session("tab-1");
    match j.submit(op)? {
        Admission::Replay(r) => {
            assert!(r.replayed);
            assert_eq!(r.result.bytes, br#"{"light":"light-1"}"#);
            assert_eq!(
                r.result.changed_assets,
                vec!["scene/main/light-1".to_string()]
            );
        }
        other => panic!("a recorded outcome replays, not {other:?}"),
    }
    let op = Operation::new(
        "op_bin",
        Intent::from_json("asset.bake", &serde_json::json!({"lod": 2}))?,
    )
    .scope("asset/tree");
    match j.submit(op)? {
        Admission::Replay(r) => assert_eq!(r.result.bytes, vec![0xff, 0x00, 0x7f, 0x80]),
        other => panic!("a recorded outcome replays, not {other:?}"),
    }
    // The scope revision came back with the events: stale work is refused.
    let stale = Operation::new(
        "op_new",
        Intent::from_json("scene.add_light", &serde_json::json!({"near": "window"}))?,
    )
    .scope("scene/main")
    .base_revision(183);
    let e = j.submit(stale).expect_err("stale base");
    assert!(matches!(e.kind(), ErrorKind::StaleBase { .. }), "{e:?}");
    Ok(())
}
