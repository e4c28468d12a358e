//! The `opjournal` CLI on real journals built through the library: golden human
//! output, the JSON Lines envelope, read-only commands leaving the file's bytes unchanged,
//! exit codes and error messages, writes through the library's API, and reading beside a
//! live writer in another process.

mod cli_support;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cli_support::*;
use opjournal::{ExecutionStatus, Inspector, Intent, Journal, Operation, Outcome, Sharing};
use serde_json::Value;

/// The stdout of `args`, with the journal's path replaced by `JOURNAL` and the file size
/// (which depends on the storage engine's page allocation) by `SIZE`.
fn golden(s: &Sample, args: &[&str]) -> String {
    let o = run(args);
    assert_eq!(code(&o), 0, "{args:?}: {}", stderr(&o));
    stdout(&o)
        .replace(path_str(&s.path), "JOURNAL")
        .lines()
        .map(|l| {
            if l.starts_with("file size") {
                "file size       SIZE".to_string()
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

// ---- golden human output ----

#[test]
fn stats_prints_counts_by_status_and_delivery_and_the_oldest_unacked() {
    let s = sample();
    let p = path_str(&s.path);
    assert_eq!(
        golden(&s, &["stats", p]),
        "\
journal         JOURNAL
format          version 3, created 2100-01-01 00:00:00 UTC (10 min ago)
now             2100-01-01 00:10:01 UTC (clocks applied as of this time)
file size       SIZE

operations      6
  running       1
  in_doubt      1
  applied       3
  failed        1
  retired       0
released ids    1 (given back; history kept until purged)

delivery
  pending       2
  delivered     1
  acknowledged  1
  exhausted     0
  ack_expired   0
oldest unacked  op_7f3, completed 2100-01-01 00:01:01 UTC (9 min ago)

storage
  events        17
  results       4
  scopes        2
  timers        12
  quarantined   0

next            1 in doubt: `opjournal ls JOURNAL --status in_doubt`, then `opjournal resolve`"
    );
}

#[test]
fn ls_prints_an_aligned_table_oldest_submission_first() {
    let s = sample();
    assert_eq!(
        golden(&s, &["ls", path_str(&s.path)]),
        "\
ID        STATUS    DELIVERY      SCOPE       REV      SESSION  INTENT           SUBMITTED
op_doubt  in_doubt  -             scene/alt   -        tab-2    scene.move       2100-01-01 00:00:00 UTC (10 min ago)
op_7f3    applied   delivered×1   scene/main  183→184  tab-1    scene.add_light  2100-01-01 00:01:01 UTC (9 min ago)
op_ack    applied   acknowledged  scene/main  184→185  tab-1    scene.rename     2100-01-01 00:02:01 UTC (8 min ago)
op_fail   failed    pending       render/q    -        tab-2    export.render    2100-01-01 00:03:01 UTC (7 min ago)
op_long   applied   pending       doc/readme  1→2      -        doc.rewrite      2100-01-01 00:04:01 UTC (6 min ago)
op_run    running   -             scene/alt   -        -        scene.move       2100-01-01 00:06:01 UTC (4 min ago)

6 operations"
    );
}

#[test]
fn show_prints_the_receipt_the_result_and_the_history() {
    let s = sample();
    assert_eq!(
        golden(&s, &["show", path_str(&s.path), "op_7f3"]),
        "\
operation     op_7f3
attempt       1 (claim epoch 3)
intent        scene.add_light  jcs-sha256:97f043e9562c21515be0825448c05795426d4d7b401482a2402b084854c97762
status        applied at revision 184
delivery      delivered 1 time, not acknowledged; next push due 2100-01-01 00:01:01 UTC (8 min ago)
scope         scene/main (base revision 183)
session       tab-1
submitted     2100-01-01 00:01:01 UTC (9 min ago)
completed     2100-01-01 00:01:01 UTC (9 min ago)
ack deadline  2100-01-01 00:16:01 UTC (in 6 min)
retain until  2100-01-08 00:01:01 UTC (in 6 days)
purge at      2100-04-01 00:01:01 UTC (in 89 days)

result (19 bytes, 1 changed asset)
  changed: scene/main/light-1
  {\"light\":\"light-1\"}

history (3 events)
  SEQ  AT                       EVENT      DETAIL
    3  2100-01-01 00:01:01 UTC  submitted  attempt 1, scene.add_light, scope scene/main, base 183, session tab-1, lease until 2100-01-01 00:06:01 UTC
    4  2100-01-01 00:01:01 UTC  completed  applied at revision 184; result 19 bytes, 1 asset
    5  2100-01-01 00:01:01 UTC  delivered  delivery 1, next push 2100-01-01 00:01:01 UTC"
    );
}

#[test]
fn show_previews_a_long_result_and_says_how_much_was_cut() {
    let s = sample();
    let p = path_str(&s.path);
    let out = golden(&s, &["show", p, "op_long"]);
    assert!(
        out.contains("result (3180 bytes, 0 changed assets)"),
        "{out}"
    );
    assert!(out.contains("  line 19: the quick brown fox"), "{out}");
    assert!(
        !out.contains("line 21:"),
        "the preview stops at 20 lines:\n{out}"
    );
    assert!(
        out.contains("… 2.1 KiB (2156 bytes) more not shown (the preview stops at 1024 bytes or 20 lines; --full prints everything)"),
        "{out}"
    );
    let full = golden(&s, &["show", p, "op_long", "--full"]);
    assert!(full.contains("  line 60: the quick brown fox"), "{full}");
    assert!(!full.contains("more not shown"), "{full}");
}

#[test]
fn show_explains_in_doubt_failed_running_and_released_operations() {
    let s = sample();
    let p = path_str(&s.path);
    let doubt = golden(&s, &["show", p, "op_doubt"]);
    assert!(
        doubt.contains("status       in doubt: the journal was reopened while it was running (the process that ran it is gone); resolve it once you know how it ended"),
        "{doubt}"
    );
    let failed = golden(&s, &["show", p, "op_fail"]);
    assert!(
        failed.contains("status        failed: the door no longer exists"),
        "{failed}"
    );
    assert!(failed.contains("result: empty"), "{failed}");
    let running = golden(&s, &["show", p, "op_run"]);
    assert!(
        running.contains("status       running (lease until 2100-01-01 00:11:01 UTC (in 1 min))"),
        "{running}"
    );
    // A released id is not live, but its history is kept until the audit retention passes.
    let released = golden(&s, &["show", p, "op_released"]);
    assert!(
        released.contains("not live: released, or resolved as not applied"),
        "{released}"
    );
    assert!(
        released.contains("released   epoch 14 given back before any effect"),
        "{released}"
    );
}

#[test]
fn show_of_an_unknown_id_has_nothing_to_show_and_exits_1_naming_it() {
    let s = sample();
    let o = run(&["show", path_str(&s.path), "op_nope"]);
    assert_eq!(
        code(&o),
        1,
        "nothing to show is an answer, not a failure to run"
    );
    assert!(stdout(&o).is_empty());
    let err = stderr(&o);
    assert!(
        err.starts_with("no operation `op_nope` is recorded in"),
        "{err}"
    );
    assert!(
        err.contains("hint: list the operations with `opjournal ls"),
        "{err}"
    );
    // In JSON mode the summary says so.
    let lines = json_lines(&run(&["--json", "show", path_str(&s.path), "op_nope"]));
    assert_eq!(lines.len(), 1, "{lines:?}");
    let (kind, summary) = &lines[0];
    assert_eq!(kind, "summary");
    assert_eq!(summary["ok"], false, "{summary}");
    assert_eq!(summary["found"], false, "{summary}");
}

// ---- filters ----

fn ids(o: &std::process::Output) -> Vec<String> {
    json_lines(o)
        .into_iter()
        .filter(|(t, _)| t == "receipt")
        .map(|(_, d)| d["operation_id"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn ls_filters_by_status_delivery_scope_session_intent_and_time() {
    let s = sample();
    let p = path_str(&s.path);
    let ls = |extra: &[&str]| {
        let mut args = vec!["--json", "ls", p];
        args.extend_from_slice(extra);
        ids(&run(&args))
    };
    assert_eq!(
        ls(&["--status", "in_doubt,running"]),
        ["op_doubt", "op_run"]
    );
    assert_eq!(ls(&["--status", "applied", "--status", "failed"]).len(), 4);
    assert_eq!(ls(&["--delivery", "pending"]), ["op_fail", "op_long"]);
    assert_eq!(ls(&["--scope", "scene/main"]), ["op_7f3", "op_ack"]);
    assert_eq!(ls(&["--session", "tab-2"]), ["op_doubt", "op_fail"]);
    assert_eq!(ls(&["--intent", "scene.move"]), ["op_doubt", "op_run"]);
    // "Now" is 00:10:01: five minutes back is 00:05:01.
    assert_eq!(ls(&["--since", "5min"]), ["op_run"]);
    assert_eq!(
        ls(&["--until", "2100-01-01T00:01:30Z"]),
        ["op_doubt", "op_7f3"]
    );
    // An offset is honored: the same instant two hours east, and a bare date is midnight UTC.
    assert_eq!(
        ls(&["--until", "2100-01-01T02:01:30+02:00"]),
        ["op_doubt", "op_7f3"]
    );
    assert_eq!(ls(&["--until", "2100-01-01"]), Vec::<String>::new());
    assert_eq!(ls(&["--sort", "id", "--limit", "2"]), ["op_long", "op_run"]);
    let o = run(&["ls", p, "--scope", "nowhere"]);
    assert_eq!(stdout(&o), "no operation matches (of 6)\n");
    let o = run(&["ls", p, "--since", "last tuesday"]);
    assert_eq!(code(&o), 2, "a bad time is a usage error");
    assert!(stderr(&o).contains("is neither a time"), "{}", stderr(&o));
}

#[test]
fn ls_with_a_limit_shows_the_last_rows_of_the_full_listing_in_either_order() {
    // Ids that sort against their submission order (and a tie in time broken by id), so
    // the two orders differ.
    let s = Sample::empty_dir();
    {
        let j = s.open();
        for i in 0..60u64 {
            if i % 7 != 0 {
                s.advance(Duration::from_secs(1));
            }
            let id = format!("op_{:03}", (i * 37) % 61);
            let intent =
                Intent::from_json("doc.edit", &serde_json::json!({"n": i})).expect("intent");
            let Ok(opjournal::Admission::Fresh(c)) = j.submit(Operation::new(id.clone(), intent))
            else {
                panic!("{id} is not fresh work");
            };
            j.complete(&c, Outcome::applied(1, vec![b'r'; 10]))
                .expect("complete");
        }
    }
    let p = path_str(&s.path);
    for sort in ["submitted", "id"] {
        let all = ids(&run(&["--json", "ls", p, "--sort", sort]));
        assert_eq!(all.len(), 60);
        let mut by_id = all.clone();
        by_id.sort();
        assert_eq!(sort == "id", all == by_id, "the orders differ");
        for limit in [0usize, 1, 5, 59, 60, 100] {
            let shown = ids(&run(&[
                "--json",
                "ls",
                p,
                "--sort",
                sort,
                "--limit",
                &limit.to_string(),
            ]));
            assert_eq!(
                shown,
                all[all.len().saturating_sub(limit)..],
                "--sort {sort} --limit {limit}"
            );
        }
    }
}

#[test]
fn log_prints_events_filtered_by_operation_kind_and_position() {
    let s = sample();
    let p = path_str(&s.path);
    let o = run(&["log", p, "--op", "op_ack"]);
    assert_eq!(code(&o), 0);
    let text = stdout(&o);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 5, "a header and four events:\n{text}");
    assert!(
        lines[0].contains("SEQ") && lines[0].contains("DETAIL"),
        "{text}"
    );
    assert!(
        lines[4].contains(
            "      9  2100-01-01 00:02:01.000  op_ack            acknowledged       acknowledged"
        ),
        "{text}"
    );
    let seqs = |extra: &[&str]| -> Vec<u64> {
        let mut args = vec!["--json", "log", p];
        args.extend_from_slice(extra);
        json_lines(&run(&args))
            .into_iter()
            .filter(|(t, _)| t == "event")
            .map(|(_, d)| d["seq"].as_u64().unwrap_or_default())
            .collect()
    };
    assert_eq!(seqs(&["--kind", "completed"]), [4, 7, 11, 13]);
    assert_eq!(seqs(&["--kind", "released,lease_expired"]), [2, 15]);
    assert_eq!(seqs(&["--from", "15"]), [15, 16, 17]);
    assert_eq!(seqs(&["--tail", "2"]), [16, 17]);
    assert_eq!(seqs(&["--kind", "completed", "--tail", "1"]), [13]);
    assert!(text.contains("applied at revision 185"), "{text}");
    // Every kind an event can have is a filter, those `repair` and upgrades write too.
    for kind in [
        "result_lost",
        "format_upgraded",
        "salvaged",
        "revision_advanced",
    ] {
        let o = run(&["log", "--kind", kind, p]);
        assert_eq!(code(&o), 0, "--kind {kind}: {}", stderr(&o));
    }
}

// ---- JSON Lines ----

/// The `type`s each command may write (docs/cli.md).
fn documented_types(command: &str) -> &'static [&'static str] {
    match command {
        "stats" => &["stats", "summary"],
        "ls" => &["receipt", "summary"],
        "show" => &["receipt", "result", "event", "summary"],
        "log" => &["event", "summary"],
        "verify" => &["integrity", "log", "finding", "summary"],
        "export" => &["receipt", "result", "event", "summary"],
        "repair" => &["quarantined", "unreadable", "scope", "lost", "summary"],
        "compact" => &["compaction", "reclaim", "summary"],
        "resolve" => &["resolved", "summary"],
        other => panic!("no documented types for {other}"),
    }
}

#[test]
fn json_output_of_every_command_uses_the_documented_envelope_and_ends_with_a_summary() {
    let s = sample();
    let p = path_str(&s.path);
    let runs: Vec<Vec<&str>> = vec![
        vec!["--json", "stats", p],
        vec!["--json", "ls", p],
        vec!["--json", "show", p, "op_7f3"],
        vec!["--json", "log", p],
        vec!["--json", "verify", p],
        vec!["export", p, "--results"],
        vec!["--json", "repair", p, "--dry-run"],
        vec!["--json", "compact", p, "--reclaim"],
        vec!["resolve", p, "op_doubt", "--not-applied", "--json"],
    ];
    for args in runs {
        let o = run(&args);
        assert_eq!(code(&o), 0, "{args:?}: {}", stderr(&o));
        let command = args
            .iter()
            .find(|a| !a.starts_with("--"))
            .copied()
            .unwrap_or_default();
        let lines = json_lines(&o);
        let seen: BTreeSet<&str> = lines.iter().map(|(t, _)| t.as_str()).collect();
        for t in &seen {
            assert!(
                documented_types(command).contains(t),
                "{command} wrote undocumented `{t}`"
            );
        }
        let (_, summary) = lines.last().cloned().unwrap_or_default();
        assert_eq!(summary["command"], command, "{summary}");
        assert_eq!(summary["file"], p, "{summary}");
        assert_eq!(summary["ok"], true, "{summary}");
        assert!(summary["elapsed_ms"].is_number(), "{summary}");
        // Milliseconds with at most three decimals: no float noise.
        let ms = summary["elapsed_ms"].to_string();
        assert!(
            ms.split_once('.').is_none_or(|(_, frac)| frac.len() <= 3),
            "{ms}"
        );
        assert_eq!(
            lines.iter().filter(|(t, _)| t == "summary").count(),
            1,
            "exactly one summary, last"
        );
    }
}

#[test]
fn json_receipts_and_events_carry_readable_hashes_names_and_millisecond_times() {
    let s = sample();
    let p = path_str(&s.path);
    let lines = json_lines(&run(&["--json", "show", p, "op_7f3"]));
    let receipt = &lines[0].1;
    assert_eq!(lines[0].0, "receipt");
    assert_eq!(
        receipt["intent_hash"],
        "jcs-sha256:97f043e9562c21515be0825448c05795426d4d7b401482a2402b084854c97762"
    );
    assert_eq!(receipt["status"], "applied");
    assert_eq!(receipt["delivery"], "delivered");
    assert_eq!(receipt["result_revision"], 184);
    assert_eq!(receipt["submitted_at"], T0.as_millis() + 61_000);
    let (ty, result) = &lines[1];
    assert_eq!(ty, "result");
    assert_eq!(result["content"], r#"{"light":"light-1"}"#);
    assert_eq!(result["encoding"], "utf8");
    assert_eq!(result["changed_assets"][0], "scene/main/light-1");
    let (ty, event) = &lines[2];
    assert_eq!(ty, "event");
    assert_eq!(event["kind"], "submitted");
    assert_eq!(event["seq"], 3);
    assert_eq!(event["detail"]["intent_hash"], receipt["intent_hash"]);
    let doubt = json_lines(&run(&["--json", "show", p, "op_doubt"]));
    assert_eq!(doubt[0].1["in_doubt_cause"], "reopened");
    let stats = json_lines(&run(&["--json", "stats", p]));
    assert_eq!(stats[0].1["oldest_unacked"]["operation_id"], "op_7f3");
    assert_eq!(stats[0].1["in_doubt"], 1);
}

#[test]
fn export_writes_every_receipt_and_event_and_the_results_on_request() {
    let s = sample();
    let p = path_str(&s.path);
    let all = json_lines(&run(&["export", p, "--results"]));
    let count = |t: &str| all.iter().filter(|(ty, _)| ty == t).count();
    assert_eq!(
        (count("receipt"), count("event"), count("result")),
        (6, 17, 4)
    );
    let (_, summary) = all.last().cloned().unwrap_or_default();
    assert_eq!(
        (summary["receipts"].as_u64(), summary["events"].as_u64()),
        (Some(6), Some(17))
    );
    let long = all
        .iter()
        .find(|(t, d)| t == "result" && d["operation_id"] == "op_long")
        .map(|(_, d)| d.clone())
        .unwrap_or_default();
    assert_eq!(
        long["content"],
        long_result(),
        "export never truncates a result"
    );
    let events = json_lines(&run(&["export", p, "--only", "events"]));
    assert_eq!(events.len(), 18, "17 events and the summary");
}

// ---- read-only commands leave the file alone ----

fn dir_listing(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn read_only_runs(p: &str) -> Vec<Vec<&str>> {
    vec![
        vec!["stats", p],
        vec!["ls", p],
        vec!["ls", p, "--status", "applied"],
        vec!["show", p, "op_7f3"],
        vec!["show", p, "op_long", "--full"],
        vec!["log", p],
        vec!["log", p, "--tail", "3"],
        vec!["verify", p],
        vec!["export", p, "--results"],
        vec!["--json", "stats", p],
        vec!["--json", "ls", p],
        vec!["--json", "show", p, "op_doubt"],
        vec!["--json", "log", p],
        vec!["--json", "verify", p],
        vec!["repair", p, "--dry-run"],
    ]
}

#[test]
fn read_only_commands_leave_file_bytes_unchanged() {
    let s = sample();
    let p = path_str(&s.path);
    let before = s.bytes();
    let listing = dir_listing(s.dir.path());
    for args in read_only_runs(p) {
        let o = run(&args);
        assert_eq!(code(&o), 0, "{args:?}: {}", stderr(&o));
        assert!(s.bytes() == before, "{args:?} changed the file's bytes");
        assert_eq!(
            dir_listing(s.dir.path()),
            listing,
            "{args:?} wrote beside the file"
        );
    }
}

#[test]
fn read_only_commands_on_a_file_not_closed_cleanly_recover_it_in_memory_copying_nothing_and_leave_bytes_unchanged()
-> TestResult {
    // A copy taken while a writer has the file open, with its log, is what a crash leaves
    // behind.
    let s = sample();
    let crashed = s.dir.path().join("crashed.opj");
    {
        let j = s.open();
        j.advance_revision("doc/readme", 6)?;
        copy_with_log(&s.path, &crashed)?;
    }
    let p = path_str(&crashed);
    let before = std::fs::read(&crashed)?;
    // Nothing may be written to the temporary directory (it may be RAM): no copy of the file.
    let tmp = tempfile::tempdir()?;
    for args in read_only_runs(p) {
        let o = opjournal(&args).env("TMPDIR", tmp.path()).output()?;
        assert_eq!(code(&o), 0, "{args:?}: {}", stderr(&o));
        // A dry-run repair says nothing about access.
        if args[0] != "repair" {
            assert!(
                stderr(&o)
                    .contains("not closed cleanly; it was recovered in memory and read in place"),
                "{args:?} says how it read the file: {}",
                stderr(&o)
            );
        }
        assert!(
            std::fs::read(&crashed)? == before,
            "{args:?} changed the file's bytes"
        );
        assert_eq!(
            dir_listing(tmp.path()),
            Vec::<String>::new(),
            "{args:?} wrote to the temporary directory"
        );
    }
    Ok(())
}

/// Copies a journal and the log files beside it (those that exist).
fn copy_with_log(from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
    std::fs::copy(from, to)?;
    for (a, b) in opjournal::FileLog::paths_for(from)
        .into_iter()
        .zip(opjournal::FileLog::paths_for(to))
    {
        if a.exists() {
            std::fs::copy(a, b)?;
        }
    }
    Ok(())
}

#[test]
fn verify_of_a_journal_not_closed_cleanly_without_its_log_says_where_the_log_should_be()
-> TestResult {
    let s = sample();
    let crashed = s.dir.path().join("crashed.opj");
    {
        let j = s.open();
        j.advance_revision("doc/readme", 6)?;
        // The journal alone, as a copy made while its editor runs would take it.
        std::fs::copy(&s.path, &crashed)?;
    }
    // Not a finding (a power cut just after a clean close leaves the same, losing
    // nothing), but not "closed cleanly" either.
    let o = run(&["verify", path_str(&crashed)]);
    assert_eq!(code(&o), 0, "{}", stdout(&o));
    let text = stdout(&o);
    assert!(
        text.contains("though the journal was not closed cleanly")
            && text.contains("crashed.opj-log"),
        "{text}"
    );
    assert!(!text.contains("(the journal was closed cleanly)"), "{text}");
    Ok(())
}

#[test]
fn results_walked_from_one_snapshot_are_those_read_one_by_one() -> TestResult {
    // A journal whose log holds commits (a crash leaves it so): `export --results` walks
    // the receipts with their results from one snapshot instead of one per result.
    let s = sample();
    let crashed = s.dir.path().join("crashed.opj");
    {
        let j = s.open();
        j.advance_revision("doc/readme", 6)?;
        copy_with_log(&s.path, &crashed)?;
    }
    let insp = opjournal::Inspector::open(&crashed)?;
    let mut walked = Vec::new();
    insp.for_each_receipt_and_result(|r, result| {
        walked.push((r.operation_id, result));
        Ok(true)
    })?;
    assert!(
        walked.iter().filter(|(_, r)| r.is_some()).count() >= 2,
        "{walked:?}"
    );
    for (id, result) in &walked {
        assert_eq!(&insp.result(id)?, result, "{id}");
    }
    let o = run(&["--json", "export", path_str(&crashed), "--results"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let exported = json_lines(&o).iter().filter(|(t, _)| t == "result").count();
    assert_eq!(exported, walked.iter().filter(|(_, r)| r.is_some()).count());
    Ok(())
}

#[test]
fn repair_of_a_journal_whose_log_was_cut_does_not_say_nothing_was_lost() -> TestResult {
    let s = sample();
    let crashed = s.dir.path().join("cut.opj");
    {
        let j = s.open();
        for r in 6..40 {
            j.advance_revision("doc/readme", r)?;
        }
        copy_with_log(&s.path, &crashed)?;
    }
    // The log cut inside its records (not where a crash tears it: it is preallocated).
    let log = opjournal::FileLog::paths_for(&crashed)[0].clone();
    let used = std::fs::read(&log)?
        .iter()
        .rposition(|b| *b != 0)
        .ok_or("a log with records")?;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&log)?
        .set_len(used as u64 / 2)?;
    let o = run(&["repair", path_str(&crashed)]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let text = stdout(&o);
    assert!(!text.contains("lost: nothing"), "{text}");
    assert!(
        text.contains("lost: every operation that could be read"),
        "{text}"
    );
    assert_eq!(code(&run(&["verify", path_str(&crashed)])), 0);
    Ok(())
}

#[test]
fn inspections_of_a_file_not_closed_cleanly_run_side_by_side() -> TestResult {
    let s = sample();
    let crashed = s.dir.path().join("crashed.opj");
    {
        let j = s.open();
        j.advance_revision("doc/readme", 6)?;
        std::fs::copy(&s.path, &crashed)?;
    }
    // Each recovers the file in memory, holding only shared locks: the others may read it
    // too (they were refused as if a writer excluded readers).
    let first = opjournal::Inspector::open(&crashed)?;
    assert_eq!(first.access(), opjournal::Access::Recovered);
    let second = opjournal::Inspector::open(&crashed)?;
    assert_eq!(second.access(), opjournal::Access::Recovered);
    let o = run(&["stats", path_str(&crashed)]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    // Once they are gone, a writer opens the file (and recovers it).
    drop((first, second));
    drop(opjournal::Journal::open(&crashed)?);
    Ok(())
}

// ---- errors: one line saying what happened, a hint, exit 2 ----

fn assert_fails(args: &[&str], first_line: &str, hint: &str) {
    let o = run(args);
    assert_eq!(code(&o), 2, "{args:?}: {}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).is_empty(),
        "{args:?} wrote results: {}",
        stdout(&o)
    );
    let err = stderr(&o);
    let first = err.lines().next().unwrap_or_default();
    assert!(first.starts_with("error: "), "{args:?}: {err}");
    assert!(
        first.contains(first_line),
        "{args:?}: expected `{first_line}` in:\n{err}"
    );
    assert!(
        err.lines()
            .any(|l| l.starts_with("hint: ") && l.contains(hint)),
        "{args:?}: expected a hint with `{hint}` in:\n{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn a_missing_file_exits_2_for_every_command_and_is_not_created() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("nope.opj");
    let p = path_str(&missing);
    for args in [
        vec!["stats", p],
        vec!["ls", p],
        vec!["show", p, "op"],
        vec!["log", p],
        vec!["verify", p],
        vec!["export", p],
        vec!["repair", p],
        vec!["compact", p],
        vec!["resolve", p, "op", "--not-applied"],
    ] {
        assert_fails(&args, &format!("no such file `{p}`"), "check the path");
        assert!(!missing.exists(), "{args:?} created the file");
    }
}

#[test]
fn files_that_are_not_journals_exit_2_saying_so() -> TestResult {
    let dir = tempfile::tempdir()?;
    let empty = dir.path().join("empty.opj");
    std::fs::write(&empty, b"")?;
    let text = dir.path().join("notes.txt");
    std::fs::write(
        &text,
        b"just some notes, nothing like a journal\n".repeat(200),
    )?;
    let other = dir.path().join("other.redb");
    {
        let db = redb::Database::create(&other)?;
        let txn = db.begin_write()?;
        {
            let mut t = txn.open_table(redb::TableDefinition::<&str, u64>::new("settings"))?;
            t.insert("volume", 11)?;
        }
        txn.commit()?;
    }
    for cmd in [
        "stats", "ls", "log", "verify", "export", "compact", "repair",
    ] {
        assert_fails(
            &[cmd, path_str(&empty)],
            "is not an opjournal journal: the file is empty",
            "check the path",
        );
        assert_fails(
            &[cmd, path_str(&text)],
            "is not an opjournal journal: it does not start with the redb file signature",
            "check the path",
        );
        assert_fails(
            &[cmd, path_str(&other)],
            "is not an opjournal journal: it is a redb database without the journal's `meta` table",
            "check the path",
        );
    }
    assert_eq!(
        std::fs::read(&empty)?,
        b"",
        "nothing wrote to the empty file"
    );
    Ok(())
}

/// A format record as a newer build might write it (this build's layout, a higher version).
#[derive(serde::Serialize)]
struct NewerFormatRecord {
    format_version: u32,
    created_at: u64,
    created_by: String,
    upgraded: Option<(u32, u64)>,
}

#[test]
fn a_newer_format_exits_2_naming_both_versions() -> TestResult {
    let s = sample();
    {
        let db = redb::Database::open(&s.path)?;
        let txn = db.begin_write()?;
        {
            let mut meta = txn.open_table(redb::TableDefinition::<&str, &[u8]>::new("meta"))?;
            let record = NewerFormatRecord {
                // 6: a record that says 4 or 5 is format 3 (deferred purges pending, two logs).
                format_version: 6,
                created_at: T0.as_millis(),
                created_by: "opjournal 9.0.0".into(),
                upgraded: None,
            };
            let bytes = opjournal::codec::encode(opjournal::codec::RecordKind::Meta, &record);
            meta.insert("format", bytes.as_slice())?;
        }
        txn.commit()?;
    }
    let before = std::fs::read(&s.path)?;
    for cmd in [
        "stats", "ls", "log", "export", "verify", "compact", "repair",
    ] {
        assert_fails(
            &[cmd, path_str(&s.path)],
            "has journal format version 6, but this opjournal 0.1.0 reads version 3",
            "written by a newer opjournal",
        );
    }
    assert!(
        std::fs::read(&s.path)? == before,
        "a command changed a newer build's file"
    );
    Ok(())
}

#[test]
fn an_exclusive_writer_locks_out_read_commands_with_a_hint_to_share() -> TestResult {
    let s = sample();
    let _editor = Journal::builder()
        .clock(s.clock.clone())
        .sharing(Sharing::Exclusive)
        .open(&s.path)?;
    let p = path_str(&s.path);
    for args in [
        vec!["ls", p],
        vec!["stats", p],
        vec!["show", p, "op_7f3"],
        vec!["verify", p],
    ] {
        assert_fails(
            &args,
            "is locked by a writer that excludes readers (`Sharing::Exclusive`)",
            "`Sharing::LiveReaders`",
        );
    }
    Ok(())
}

#[test]
fn write_commands_refuse_while_an_editor_has_the_journal_open() -> TestResult {
    let s = sample();
    let editor = s.open();
    // What it writes after opening (in the background) is written.
    editor.flush()?;
    let p = path_str(&s.path);
    let before = s.bytes();
    for args in [
        vec!["compact", p],
        vec!["resolve", p, "op_doubt", "--not-applied"],
        vec!["repair", p],
    ] {
        assert_fails(
            &args,
            "is open in another process",
            "close that process first",
        );
    }
    assert!(s.bytes() == before, "a refused write changed nothing");
    Ok(())
}

#[test]
fn permission_denied_exits_2_saying_so() -> TestResult {
    use std::os::unix::fs::PermissionsExt;
    let s = sample();
    std::fs::set_permissions(&s.path, std::fs::Permissions::from_mode(0o000))?;
    if std::fs::File::open(&s.path).is_ok() {
        // Running as root: permissions do not apply, so there is nothing to observe here
        // (the message itself is unit-tested in src/cli/failure.rs).
        eprintln!("skipped: this process can read a mode-000 file (root)");
        std::fs::set_permissions(&s.path, std::fs::Permissions::from_mode(0o600))?;
        return Ok(());
    }
    let p = path_str(&s.path);
    assert_fails(
        &["ls", p],
        &format!("permission denied reading `{p}`"),
        "run as a user",
    );
    assert_fails(
        &["verify", p],
        &format!("permission denied reading `{p}`"),
        "run as a user",
    );
    std::fs::set_permissions(&s.path, std::fs::Permissions::from_mode(0o600))?;
    Ok(())
}

#[test]
fn usage_errors_exit_2_and_help_exits_0() {
    let o = run(&["ls"]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("<FILE>"), "{}", stderr(&o));
    let o = run(&["frobnicate"]);
    assert_eq!(code(&o), 2);
    let o = run(&["--help"]);
    assert_eq!(code(&o), 0);
    let o = run(&["--version"]);
    assert_eq!(code(&o), 0);
    assert!(
        stdout(&o).starts_with("opjournal 0.1.0 ("),
        "{}",
        stdout(&o)
    );
}

#[test]
fn no_arguments_is_one_usage_error_with_a_hint_not_the_whole_help() {
    let o = run(&[]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stdout(&o).is_empty(), "{}", stdout(&o));
    let err = stderr(&o);
    let first = err.lines().next().unwrap_or_default();
    assert!(first.starts_with("error: no command given"), "{err}");
    assert!(err.contains("Usage: opjournal"), "{err}");
    assert!(err.contains("--help"), "{err}");
    assert!(
        !err.contains("Commands:"),
        "the whole help was printed:\n{err}"
    );
    assert!(err.lines().count() <= 6, "{err}");
}

#[test]
fn a_path_holding_a_newline_stays_on_one_line_of_the_error() -> TestResult {
    let dir = tempfile::tempdir()?;
    let missing = dir.path().join("a\nb.opj");
    let not_a_journal = dir.path().join("notes\n.opj");
    std::fs::write(&not_a_journal, b"not a journal at all")?;
    for (path, first) in [
        (&missing, "no such file `"),
        (&not_a_journal, "is not an opjournal journal"),
    ] {
        for cmd in ["stats", "verify", "repair"] {
            let o = run(&[cmd, path_str(path)]);
            assert_eq!(code(&o), 2, "{cmd}: {}", stderr(&o));
            let err = stderr(&o);
            let lines: Vec<&str> = err.lines().collect();
            assert!(
                lines[0].starts_with("error: ") && lines[0].contains(first),
                "{cmd}: {err}"
            );
            assert!(
                lines[0].contains("\\n"),
                "{cmd}: the newline is shown escaped: {err}"
            );
            assert!(
                lines.iter().all(|l| l.starts_with("error: ")
                    || l.starts_with("hint: ")
                    || l.starts_with("  caused by: ")),
                "{cmd}: a line of the error was split: {err}"
            );
        }
    }
    Ok(())
}

#[test]
fn ls_takes_every_rfc_3339_time_the_last_second_of_year_9999_included() {
    let s = sample();
    let p = path_str(&s.path);
    let o = run(&["ls", p, "--since", "9999-12-31T23:59:59Z"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        stdout(&o).contains("no operation matches"),
        "{}",
        stdout(&o)
    );
    let o = run(&["ls", p, "--until", "9999-12-31T23:59:59+01:00"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).contains("op_doubt"), "{}", stdout(&o));
}

/// A 64 GiB sparse file of zeros is not a journal, answered at once: the commands read
/// at most the first 64 MiB looking for journal records, never the whole file (which took
/// minutes). The timeout only bounds a hang.
#[test]
fn a_64_gib_sparse_file_of_zeros_is_refused_as_not_a_journal_without_reading_it() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("zeros.opj");
    std::fs::File::create(&path)?.set_len(64 << 30)?;
    for args in [
        vec!["verify", path_str(&path)],
        vec!["repair", "--dry-run", path_str(&path)],
        vec!["repair", path_str(&path)],
        vec!["stats", path_str(&path)],
    ] {
        let o = opjournal(&args).timeout(Duration::from_secs(60)).output()?;
        assert_eq!(code(&o), 2, "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("is not an opjournal journal"),
            "{args:?}: {}",
            stderr(&o)
        );
    }
    assert_eq!(std::fs::metadata(&path)?.len(), 64 << 30);
    assert_eq!(
        std::fs::read_dir(dir.path())?.count(),
        1,
        "nothing was written beside it"
    );
    Ok(())
}

#[test]
fn help_explains_each_command_in_a_sentence_and_gives_an_example() {
    let o = run(&["--help"]);
    let top = stdout(&o);
    for (cmd, words) in [
        ("stats", "counts by execution status"),
        ("ls", "List operations"),
        ("show", "Show one operation"),
        ("log", "event journal"),
        ("verify", "Check the file"),
        ("repair", "Back the file up"),
        ("compact", "Run the compactor now"),
        ("resolve", "Record how an in-doubt operation ended"),
        ("export", "JSON Lines"),
        ("demo", "realistic editor session"),
    ] {
        assert!(
            top.lines()
                .any(|l| l.trim_start().starts_with(cmd) && l.contains(words)),
            "`{cmd}` is listed with `{words}`:\n{top}"
        );
        if cmd != "demo" {
            let help = stdout(&run(&[cmd, "--help"]));
            assert!(
                help.contains("Example"),
                "`{cmd} --help` gives an example:\n{help}"
            );
            assert!(help.contains(&format!("opjournal {cmd} ")), "{help}");
        }
    }
}

// ---- broken pipe ----

#[test]
fn a_closed_stdout_ends_the_command_quietly_with_exit_0() -> TestResult {
    let (s, _) = many(120);
    // Each writes well over a pipe buffer (64 KiB), so writes go on after the reader left.
    for args in [vec!["export"], vec!["--json", "log"], vec!["--json", "ls"]] {
        let mut full = args.clone();
        full.push(path_str(&s.path));
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_opjournal"))
            .args(&full)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let mut stdout = child.stdout.take().ok_or("no stdout")?;
        let mut first = [0u8; 64];
        stdout.read_exact(&mut first)?;
        drop(stdout); // `| head -c 64`
        let status = child.wait()?;
        let mut err = String::new();
        child
            .stderr
            .take()
            .ok_or("no stderr")?
            .read_to_string(&mut err)?;
        assert_eq!(status.code(), Some(0), "{full:?}: {err}");
        assert_eq!(err, "", "{full:?} is quiet about the closed pipe");
    }
    Ok(())
}

// ---- progress bars ----

/// Runs `opjournal ARGS >/dev/null` with stderr on a pseudo-terminal (util-linux
/// `script`) and returns what the terminal received.
#[cfg(target_os = "linux")]
fn on_a_terminal(
    args: &[&str],
    dir: &std::path::Path,
) -> Result<String, Box<dyn std::error::Error>> {
    let quoted: Vec<String> = std::iter::once(env!("CARGO_BIN_EXE_opjournal"))
        .chain(args.iter().copied())
        .map(|a| format!("'{a}'"))
        .collect();
    let typescript = dir.join("typescript");
    let status = std::process::Command::new("script")
        .args(["-q", "-e", "-c"])
        .arg(format!("{} >/dev/null", quoted.join(" ")))
        .arg(&typescript)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .map_err(|e| {
            format!("util-linux `script` is needed for this test (apt-get install bsdutils): {e}")
        })?;
    assert!(status.success(), "{args:?} on a terminal: {status}");
    Ok(String::from_utf8_lossy(&std::fs::read(typescript)?).into_owned())
}

// util-linux `script` options; other systems' `script` takes others.
#[cfg(target_os = "linux")]
#[test]
fn progress_bars_draw_on_a_terminal_with_their_totals_and_never_on_a_pipe() -> TestResult {
    let (s, _) = many(120);
    let p = path_str(&s.path);
    let dir = tempfile::tempdir()?;
    for (args, drawn) in [
        (vec!["verify", p], "verifying ["),
        (vec!["export", p], "exporting ["),
        (vec!["repair", "--dry-run", p], "repairing ["),
        (vec!["compact", p], "compacting"),
    ] {
        let screen = on_a_terminal(&args, dir.path())?;
        assert!(
            screen.contains(drawn),
            "{args:?} draws `{drawn}` on a terminal:\n{screen}"
        );
        if drawn.ends_with('[') {
            // The bar appears once its total is known: never an empty "0/0" drawn as done.
            assert!(
                !screen.contains(" 0/0 "),
                "{args:?} drew a bar before its total:\n{screen}"
            );
            assert!(screen.contains("/"), "{args:?} shows done/total:\n{screen}");
        }
        // The same command with stderr on a pipe writes nothing there.
        let o = run(&args);
        assert_eq!(code(&o), 0, "{args:?}: {}", stderr(&o));
        assert_eq!(
            stderr(&o),
            "",
            "{args:?} keeps a pipe free of progress output"
        );
    }
    Ok(())
}

// ---- verify and repair on an intact journal ----

#[test]
fn verify_exits_0_and_says_no_problems_on_an_intact_journal() {
    let s = sample();
    let o = run(&["verify", path_str(&s.path)]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("  storage engine  page checksums passed"),
        "{out}"
    );
    assert!(
        out.contains("17 events, 7 receipts, 4 results, 2 scopes"),
        "{out}"
    );
    assert!(out.ends_with("no problems found\n"), "{out}");
}

#[test]
fn repair_of_an_intact_journal_loses_nothing_and_keeps_a_backup() -> TestResult {
    let s = sample();
    let p = path_str(&s.path);
    let before = s.bytes();
    let receipts_before = ids(&run(&["--json", "ls", p]));
    let o = run(&["--json", "repair", p]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let lines = json_lines(&o);
    assert!(
        lines.iter().all(|(t, _)| t == "summary"),
        "nothing quarantined or lost: {lines:?}"
    );
    let summary = &lines[0].1;
    assert_eq!(summary["receipts_rebuilt"], 7);
    assert_eq!(summary["events_replayed"], 17);
    let backup = summary["backup"].as_str().ok_or("a backup path")?;
    assert!(
        std::fs::read(backup)? == before,
        "the backup is the file as it was"
    );
    assert_eq!(ids(&run(&["--json", "ls", p])), receipts_before);
    assert_eq!(code(&run(&["verify", p])), 0);
    Ok(())
}

#[test]
fn repair_of_a_journal_whose_path_is_not_utf8_reports_its_backup_in_json() -> TestResult {
    use std::os::unix::ffi::OsStrExt;
    let s = sample();
    // A directory whose name is not UTF-8: JSON has no string for it, so the summary
    // carries the path as text (it used to fail after the repair had run).
    let dir = s.dir.path().join(std::ffi::OsStr::from_bytes(b"r\xff"));
    std::fs::create_dir(&dir)?;
    let path = dir.join("j.opj");
    std::fs::copy(&s.path, &path)?;
    let o = opjournal(&["--json", "repair"]).arg(&path).output()?;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let lines = json_lines(&o);
    let summary = &lines.last().ok_or("a summary")?.1;
    let backup = summary["backup"].as_str().ok_or("a backup path")?;
    assert!(
        backup.ends_with(".bak") || backup.contains("j.opj"),
        "{backup}"
    );
    assert_eq!(code(&opjournal(&["verify"]).arg(&path).output()?), 0);
    Ok(())
}

#[test]
fn repair_dry_run_reports_without_writing_anything() {
    let s = sample();
    let p = path_str(&s.path);
    let before = s.bytes();
    let listing = dir_listing(s.dir.path());
    let o = run(&["repair", p, "--dry-run"]);
    assert_eq!(code(&o), 0, "nothing to repair: {}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.starts_with("dry run: repaired a temporary copy of"),
        "{out}"
    );
    assert!(
        out.contains("lost: nothing; every operation was restored as it was"),
        "{out}"
    );
    assert!(s.bytes() == before);
    assert_eq!(
        dir_listing(s.dir.path()),
        listing,
        "no backup for a dry run"
    );
}

/// Runs `opjournal args...` without the power to read or write any file regardless of its
/// permissions: as root (CI's machines), through `setpriv`, which drops the capabilities
/// that let root ignore them.
fn run_unprivileged(args: &[&str]) -> std::io::Result<std::process::Output> {
    use std::os::unix::fs::MetadataExt;
    if std::fs::metadata("/proc/self")?.uid() != 0 {
        return opjournal(args).output();
    }
    std::process::Command::new("setpriv")
        .arg("--bounding-set=-dac_override,-dac_read_search")
        .arg(env!("CARGO_BIN_EXE_opjournal"))
        .args(args)
        .output()
}

#[test]
fn commands_that_only_read_say_reading_when_the_file_cannot_be_read() -> TestResult {
    use std::os::unix::fs::PermissionsExt;
    let s = sample();
    let p = path_str(&s.path);
    std::fs::set_permissions(&s.path, std::fs::Permissions::from_mode(0o000))?;
    for args in [
        vec!["repair", p, "--dry-run"],
        vec!["verify", p],
        vec!["ls", p],
    ] {
        let o = run_unprivileged(&args)?;
        let err = stderr(&o);
        assert_eq!(code(&o), 2, "{args:?}: {err}");
        assert!(
            err.starts_with(&format!("error: permission denied reading `{p}`\n"))
                && err.contains("\nhint: run as a user who may read the file"),
            "{args:?}: {err}"
        );
    }
    // Writing says writing.
    let o = run_unprivileged(&["repair", p])?;
    assert!(
        stderr(&o).starts_with(&format!("error: permission denied writing `{p}`\n")),
        "{}",
        stderr(&o)
    );
    Ok(())
}

// ---- compact ----

#[test]
fn writing_commands_refuse_a_read_only_journal_with_a_hint_and_leave_it_as_it_was() -> TestResult {
    let s = sample();
    let p = path_str(&s.path);
    let mut perms = std::fs::metadata(&s.path)?.permissions();
    perms.set_readonly(true);
    std::fs::set_permissions(&s.path, perms)?;
    let before = s.bytes();
    for args in [
        vec!["compact", p],
        vec!["repair", p],
        vec![
            "resolve",
            p,
            "op_doubt",
            "--failed",
            "lost with the machine",
        ],
    ] {
        let o = run(&args);
        let err = stderr(&o);
        assert_eq!(code(&o), 2, "{args:?}: {err}");
        assert!(
            err.starts_with(&format!(
                "error: cannot open `{p}` for writing: the file is read-only\n"
            )) && err.contains(&format!("\nhint: make it writable (`chmod u+w {p}`)")),
            "{args:?}: the refusal, then what to do: {err}"
        );
        assert!(s.bytes() == before, "{args:?} left the file as it was");
    }
    // A dry run writes only a temporary copy, so it runs.
    let o = run(&["repair", p, "--dry-run"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(s.bytes() == before, "the dry run left the file as it was");
    let backups = std::fs::read_dir(s.path.parent().ok_or("no parent")?)?
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".bak"))
        })
        .count();
    assert_eq!(backups, 0, "no backup was written");
    Ok(())
}

#[test]
fn compact_fires_due_timers_and_reports_them_per_clock() -> TestResult {
    let s = sample();
    // Eight days on, every result is past its ack timeout and its retention.
    s.advance(Duration::from_secs(8 * 24 * 3600));
    s.open().advance_revision("doc/readme", 6)?;
    let p = path_str(&s.path);
    let o = run(&["--json", "compact", p]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let lines = json_lines(&o);
    let report = &lines[0].1;
    assert_eq!(lines[0].0, "compaction");
    assert_eq!(report["retired"], 4, "{report}");
    assert_eq!(report["ack_expired"], 3, "{report}");
    assert!(report["batches"].as_u64() >= Some(1), "{report}");
    let retired = ids(&run(&["--json", "ls", p, "--status", "retired"]));
    assert_eq!(retired, ["op_7f3", "op_ack", "op_fail", "op_long"]);
    let o = run(&["compact", p]);
    assert_eq!(
        stdout(&o).lines().next(),
        Some(format!("compacted {p}: no timer was due").as_str())
    );
    Ok(())
}

#[test]
fn compact_reclaim_shrinks_the_file_and_reports_both_sizes() -> TestResult {
    let (s, written) = many(40);
    let p = path_str(&s.path);
    let before = std::fs::metadata(&s.path)?.len();
    let o = run(&["--json", "compact", p, "--reclaim"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let lines = json_lines(&o);
    let reclaim = lines
        .iter()
        .find(|(t, _)| t == "reclaim")
        .map(|(_, d)| d.clone())
        .ok_or("no reclaim line")?;
    let after = std::fs::metadata(&s.path)?.len();
    assert_eq!(reclaim["file_bytes_before"], before);
    assert_eq!(reclaim["file_bytes_after"], after);
    assert!(after < before, "{before} → {after}");
    let insp = Inspector::open(&s.path)?;
    for w in &written {
        assert_eq!(
            insp.result(&w.id)?.map(|r| r.bytes),
            Some(w.result.clone()),
            "{}",
            w.id
        );
    }
    Ok(())
}

/// A journal whose file has little free space after redb's compaction: `n` operations with
/// 1 KiB results and scattered ids, from 4 threads (so in large group commits), closed.
fn tightly_packed(n: usize) -> Sample {
    let s = Sample::empty_dir();
    let j = s.open();
    let result = vec![b'r'; 1024];
    std::thread::scope(|scope| {
        for t in 0..4u64 {
            let (j, result) = (&j, &result);
            scope.spawn(move || {
                for i in 0..(n / 4) as u64 {
                    let id = format!("{:016x}", (t << 32 | i).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                    let intent = Intent::from_json("doc.edit", &serde_json::json!({"n": i}))
                        .expect("intent");
                    let Ok(opjournal::Admission::Fresh(c)) =
                        j.submit(Operation::new(id.clone(), intent))
                    else {
                        panic!("{id} is not fresh work");
                    };
                    j.complete(&c, Outcome::applied(1, result.clone()))
                        .expect("complete");
                }
            });
        }
    });
    j.close().expect("close");
    s
}

#[test]
fn compact_reclaim_never_leaves_the_file_larger_than_it_found_it() -> TestResult {
    // The close after redb's compaction used to grow the file: redb grows a file with no
    // free page by doubling it, and the close's own commits landed at the top of that.
    let s = tightly_packed(10_000);
    let p = path_str(&s.path);
    let before = std::fs::metadata(&s.path)?.len();
    // What redb's compaction makes of the same file, measured on a copy through the library.
    let copy = s.dir.path().join("copy.opj");
    std::fs::copy(&s.path, &copy)?;
    let (_, compacted) = Journal::builder().open(&copy)?.reclaim_space()?;
    let o = run(&["--json", "compact", p, "--reclaim"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let reclaim = json_lines(&o)
        .into_iter()
        .find(|(t, _)| t == "reclaim")
        .map(|(_, d)| d)
        .ok_or("no reclaim line")?;
    let after = std::fs::metadata(&s.path)?.len();
    assert_eq!(reclaim["file_bytes_after"], after);
    // The close's commits (its checkpoint, redb's allocator state) take a few pages.
    assert!(
        after <= compacted + (256 << 10) && after < before,
        "{before} → {after} bytes; redb's compaction reaches {compacted}"
    );
    let report = opjournal::verify(&s.path)?;
    assert!(report.is_clean(), "{:?}", report.findings);
    Ok(())
}

#[test]
fn a_journal_dropped_after_reclaiming_space_closes_as_small_as_the_reclaim_left_it() {
    let s = tightly_packed(10_000);
    let mut j = s.open();
    let (_, reclaimed) = j.reclaim_space().expect("reclaim");
    drop(j);
    let closed = std::fs::metadata(&s.path).expect("metadata").len();
    // The close's commits (its checkpoint, redb's allocator state) take a few pages.
    assert!(
        closed <= reclaimed + (256 << 10),
        "reclaimed to {reclaimed} bytes, closed at {closed}"
    );
    let insp = Inspector::open(&s.path).expect("inspect");
    assert_eq!(insp.stats().expect("stats").applied, 10_000);
}

#[test]
fn compact_says_when_running_operations_become_in_doubt() {
    let s = sample();
    let o = run(&["compact", path_str(&s.path)]);
    assert_eq!(code(&o), 0);
    assert!(
        stderr(&o).contains("note: 1 running operation had no live writer and is now in doubt"),
        "{}",
        stderr(&o)
    );
}

// ---- resolve ----

#[test]
fn resolve_applied_records_the_outcome_through_the_library() -> TestResult {
    let s = sample();
    let p = path_str(&s.path);
    let o = run(&[
        "resolve",
        p,
        "op_doubt",
        "--applied",
        "7",
        "--result",
        "moved",
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        "resolved `op_doubt` as applied at revision 7\n  status: applied at revision 7\n"
    );
    let insp = Inspector::open(&s.path)?;
    let r = insp.lookup("op_doubt")?.ok_or("op_doubt is recorded")?;
    assert_eq!(
        (r.status, r.result_revision),
        (ExecutionStatus::Applied, Some(7))
    );
    assert_eq!(
        insp.result("op_doubt")?.map(|r| r.bytes),
        Some(b"moved".to_vec())
    );
    Ok(())
}

#[test]
fn resolve_failed_and_not_applied_record_their_outcomes() -> TestResult {
    let s = sample();
    let p = path_str(&s.path);
    let o = run(&["resolve", p, "op_doubt", "--failed", "the scene was locked"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let r = Inspector::open(&s.path)?
        .lookup("op_doubt")?
        .ok_or("recorded")?;
    assert_eq!(r.status, ExecutionStatus::Failed);
    assert_eq!(r.failure.as_deref(), Some("the scene was locked"));
    // op_run was running with no writer left: opening for the resolve made it in doubt.
    let o = run(&["--json", "resolve", p, "op_run", "--not-applied"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let lines = json_lines(&o);
    assert_eq!(lines[0].0, "resolved");
    assert_eq!(lines[0].1["as"], "not_applied");
    assert_eq!(lines[0].1["receipt"], Value::Null);
    assert_eq!(
        Inspector::open(&s.path)?.lookup("op_run")?,
        None,
        "the id is free again"
    );
    Ok(())
}

#[test]
fn resolve_refuses_a_settled_or_unknown_operation_without_touching_the_file() {
    let s = sample();
    let p = path_str(&s.path);
    let before = s.bytes();
    assert_fails(
        &["resolve", p, "op_7f3", "--applied", "9"],
        "cannot resolve `op_7f3`: it is applied at revision 184",
        "only in-doubt operations are resolved",
    );
    assert_fails(
        &["resolve", p, "op_nope", "--not-applied"],
        "no operation `op_nope` is recorded",
        "--status in_doubt",
    );
    assert!(s.bytes() == before, "a refused resolve wrote nothing");
    let o = run(&["resolve", p, "op_doubt"]);
    assert_eq!(
        code(&o),
        2,
        "one of --applied, --failed, --not-applied is required"
    );
    let o = run(&["resolve", p, "op_doubt", "--applied", "3", "--not-applied"]);
    assert_eq!(code(&o), 2, "they exclude each other");
}

// ---- beside a live writer ----

/// Submits and completes operations on a background thread of this process (the editor)
/// until stopped; returns how many it completed.
fn editor(journal: Arc<Journal>, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut n = 0u64;
        while !stop.load(Ordering::SeqCst) {
            let id = format!("op_w{n:05}");
            let intent =
                Intent::from_json("doc.edit", &serde_json::json!({ "n": n })).expect("an intent");
            let op = Operation::new(id, intent)
                .scope("doc/main")
                .base_revision(n);
            match journal.submit(op).expect("submit") {
                opjournal::Admission::Fresh(claim) => {
                    journal
                        .complete(
                            &claim,
                            Outcome::applied(n + 1, format!("edit {n}").into_bytes()),
                        )
                        .expect("complete");
                }
                other => panic!("fresh work expected: {other:?}"),
            }
            n += 1;
        }
        n
    })
}

/// `repair --dry-run` writes nothing, so an editor having the journal open does not stop
/// it: it repairs a consistent copy, while the editor keeps committing and checkpointing,
/// and never reports damage that is not there.
#[test]
fn repair_dry_run_works_beside_a_live_writer_and_reports_no_damage() -> TestResult {
    let s = Sample::empty_dir();
    let journal = Arc::new(
        Journal::builder()
            .checkpoint_size(64 * 1024)
            .open(&s.path)?,
    );
    let stop = Arc::new(AtomicBool::new(false));
    let writer = editor(journal.clone(), stop.clone());
    let started = Instant::now();
    while journal.stats()?.applied < 3 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the writer makes progress"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let p = path_str(&s.path);
    let mut rebuilt = 0;
    for _ in 0..4 {
        let o = run(&["--json", "repair", "--dry-run", p]);
        assert_eq!(code(&o), 0, "{}{}", stdout(&o), stderr(&o));
        assert!(
            stderr(&o)
                .contains("is open in another process: this dry run repairs a consistent copy"),
            "{}",
            stderr(&o)
        );
        let lines = json_lines(&o);
        let (kind, summary) = lines.last().ok_or("a summary")?;
        assert_eq!(kind, "summary", "{lines:?}");
        let counts = summary;
        assert_eq!(counts["lost"], 0, "{summary}");
        assert_eq!(counts["quarantined"], 0, "{summary}");
        let now = counts["receipts_rebuilt"]
            .as_u64()
            .ok_or("receipts_rebuilt")?;
        assert!(
            now >= rebuilt.max(3),
            "{now} receipts after {rebuilt}: {summary}"
        );
        rebuilt = now;
    }
    stop.store(true, Ordering::SeqCst);
    let completed = writer.join().map_err(|_| "the writer panicked")?;
    assert!(
        completed >= rebuilt,
        "{completed} completed, {rebuilt} seen"
    );
    // An idle editor (its background checkpoint, if any, ended): its files are left byte
    // for byte as they were.
    journal.flush()?;
    let log = opjournal::FileLog::path_for(&s.path);
    let before = (std::fs::read(&s.path)?, std::fs::read(&log)?);
    let o = run(&["repair", "--dry-run", p]);
    assert_eq!(code(&o), 0, "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("lost: nothing"), "{}", stdout(&o));
    assert!(before == (std::fs::read(&s.path)?, std::fs::read(&log)?));
    // The repair itself still needs the editor closed.
    assert_fails(
        &["repair", p],
        "is open in another process",
        "close that process first",
    );
    Ok(())
}

#[test]
fn ls_stats_and_show_run_while_another_process_keeps_submitting() -> TestResult {
    let s = Sample::empty_dir();
    let journal = Arc::new(Journal::open(&s.path)?);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = editor(journal.clone(), stop.clone());
    let started = Instant::now();
    while journal.stats()?.applied < 3 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the writer makes progress"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let p = path_str(&s.path);
    let mut last = 0usize;
    for _ in 0..4 {
        let o = run(&["--json", "ls", p]);
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        assert!(
            stderr(&o).contains("note: a writer has the journal open"),
            "{}",
            stderr(&o)
        );
        let seen = ids(&o).len();
        assert!(
            seen >= last.max(3),
            "ls sees every committed operation ({seen} after {last})"
        );
        last = seen;
        let o = run(&["--json", "stats", p]);
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        let stats = &json_lines(&o)[0].1;
        assert!(
            stats["applied"].as_u64() >= Some(last as u64 - 1),
            "{stats}"
        );
        let o = run(&["show", p, "op_w00000"]);
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        assert!(
            stdout(&o).contains("status        applied at revision 1"),
            "{}",
            stdout(&o)
        );
        let o = run(&["ls", p]);
        assert_eq!(code(&o), 0, "{}", stderr(&o));
    }
    stop.store(true, Ordering::SeqCst);
    let completed = writer.join().map_err(|_| "the writer panicked")?;
    assert!(
        completed as usize >= last,
        "the writer kept going while we read"
    );
    Ok(())
}

#[test]
fn log_follow_prints_events_committed_after_it_started() -> TestResult {
    let s = sample();
    let journal = s.open();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_opjournal"))
        .args([
            "--json",
            "log",
            path_str(&s.path),
            "--follow",
            "--from",
            "17",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // The existing event first, then one the writer commits while `log` follows.
    let first = rx.recv_timeout(Duration::from_secs(20))?;
    assert!(first.contains("\"seq\":17"), "{first}");
    journal.advance_revision("doc/readme", 9)?;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    let found = loop {
        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
            break None;
        };
        let Ok(line) = rx.recv_timeout(left) else {
            break None;
        };
        let v: Value = serde_json::from_str(&line)?;
        assert_eq!(v["type"], "event", "{line}");
        if v["data"]["kind"] == "revision_advanced" {
            break Some(v);
        }
        seen.push(line);
    };
    let _ = child.kill();
    let _ = child.wait();
    let v = found.ok_or_else(|| format!("the new event never came; saw {seen:?}"))?;
    assert_eq!(v["data"]["detail"]["revision"], 9);
    assert!(v["data"]["seq"].as_u64() > Some(17), "{v}");
    Ok(())
}

// ---- version, completions, manual page, local time ----

#[test]
fn version_names_the_journal_format_it_reads_and_writes() {
    let o = run(&["--version"]);
    assert_eq!(code(&o), 0);
    assert_eq!(
        stdout(&o).trim(),
        format!(
            "opjournal {} (journal format {})",
            env!("CARGO_PKG_VERSION"),
            opjournal::FORMAT_VERSION
        )
    );
}

const SUBCOMMANDS: [&str; 9] = [
    "stats", "ls", "show", "log", "verify", "repair", "compact", "resolve", "export",
];

#[test]
fn completions_name_every_subcommand_for_each_shell() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let o = run(&["completions", shell]);
        assert_eq!(code(&o), 0, "{shell}: {}", stderr(&o));
        let script = stdout(&o);
        for sub in SUBCOMMANDS {
            assert!(script.contains(sub), "{shell} completions lack `{sub}`");
        }
    }
    let o = run(&["completions", "tcsh"]);
    assert_eq!(code(&o), 2, "an unknown shell is a usage error");
}

#[test]
fn the_manual_page_is_roff_naming_every_subcommand() {
    let o = run(&["man"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let page = stdout(&o);
    assert!(
        page.starts_with(".ie") || page.contains(".TH opjournal"),
        "{page}"
    );
    for sub in SUBCOMMANDS {
        assert!(page.contains(sub), "the manual page lacks `{sub}`");
    }
    assert!(
        page.contains("journal format"),
        "the version is in the page"
    );
}

#[test]
fn local_prints_times_in_the_system_time_zone() {
    let s = sample();
    let p = path_str(&s.path);
    let o = opjournal(&["--local", "show", p, "op_7f3"])
        .env("TZ", "XST-2")
        .output()
        .expect("runs");
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("+02:00"), "{text}");
    assert!(!text.contains(" UTC"), "{text}");
    // Without --local, UTC.
    let utc = run(&["show", p, "op_7f3"]);
    assert!(stdout(&utc).contains(" UTC"), "{}", stdout(&utc));
}
