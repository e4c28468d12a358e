//! The read-only CLI commands on a journal in PostgreSQL (`--postgres URL NAME`): the real
//! `opjournal` binary against a private server started per test
//! ([`PgCluster::start_or_skip`]; without PostgreSQL a test passes after one line on
//! stderr, unless `OPJOURNAL_PG_REQUIRED=1`). The journals are written through the library
//! (`JournalBuilder::open_postgres`); the commands must report what the library reports,
//! write nothing, answer a missing journal with the names present, verify rows (and name
//! damaged ones), export a dump that `import` turns into an equal file journal, and read
//! beside a writer that holds the journal's writer lock.

mod cli_support;

use std::collections::BTreeMap;
use std::process::Output;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use cli_support::{code, json_lines, opjournal, stderr, stdout};
use opjournal::postgres::{Client, NoTls};
use opjournal::{
    Admission, ErrorKind, ExecutionStatus, Failure, Inspector, Intent, Journal, Operation, Outcome,
    Receipt,
};
use opjournal_testkit::pg::PgCluster;
use serde_json::{Value, json};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Runs `opjournal args...`, failing the test if it runs longer than a minute (a command
/// that waited for the writer lock would).
fn run(args: &[&str]) -> Output {
    opjournal(args)
        .timeout(Duration::from_secs(60))
        .output()
        .expect("opjournal runs")
}

/// Runs `opjournal args...` and asserts it exited 0.
fn ok(args: &[&str]) -> Output {
    let o = run(args);
    assert_eq!(
        code(&o),
        0,
        "{args:?}:\nstdout: {}\nstderr: {}",
        stdout(&o),
        stderr(&o)
    );
    o
}

fn intent(name: &str, n: i64) -> Intent {
    Intent::from_json(name, &json!({ "n": n })).expect("a valid intent")
}

fn open(cluster: &PgCluster, name: &str) -> Journal {
    Journal::builder()
        .lease(Duration::from_secs(3600))
        .open_postgres(&cluster.url(), name)
        .expect("the journal opens in PostgreSQL")
}

fn fresh(journal: &Journal, op: Operation) -> opjournal::Claim {
    match journal.submit(op).expect("submit") {
        Admission::Fresh(claim) => claim,
        other => panic!("expected fresh work, got {other:?}"),
    }
}

/// A journal with operations in several states, written through the library:
///
/// | id | state |
/// |---|---|
/// | `op_applied` | applied (revision 2), delivered, a result with a changed asset |
/// | `op_acked` | applied (revision 3), acknowledged by its session |
/// | `op_failed` | failed, with its message as the result |
/// | `op_running` | running (a lease of an hour) |
/// | `op_released` | released (no receipt, its events kept) |
fn sample(cluster: &PgCluster, name: &str) -> Journal {
    let j = open(cluster, name);
    let c = fresh(
        &j,
        Operation::new("op_applied", intent("scene.add_light", 1))
            .scope("scene/main")
            .base_revision(1)
            .session("tab-1"),
    );
    j.complete(
        &c,
        Outcome::applied(2, br#"{"light":"light-1"}"#.to_vec())
            .changed_assets(["scene/main/light-1"]),
    )
    .expect("complete op_applied");
    j.delivered("op_applied").expect("delivered");
    let c = fresh(
        &j,
        Operation::new("op_acked", intent("scene.rename", 2))
            .scope("scene/main")
            .base_revision(2)
            .session("tab-1"),
    );
    j.complete(&c, Outcome::applied(3, b"renamed".to_vec()))
        .expect("complete op_acked");
    j.delivered("op_acked").expect("delivered");
    j.acknowledge("op_acked", Some("tab-1"))
        .expect("acknowledge");
    let c = fresh(
        &j,
        Operation::new("op_failed", intent("export.render", 3)).scope("render/q"),
    );
    j.complete(&c, Outcome::failed("the renderer ran out of memory"))
        .expect("complete op_failed");
    let _running = fresh(&j, Operation::new("op_running", intent("scene.bake", 4)));
    let c = fresh(&j, Operation::new("op_released", intent("scene.undo", 5)));
    j.release(&c).expect("release");
    j.flush().expect("the lazy deliveries are committed");
    j
}

const IDS: [&str; 5] = [
    "op_applied",
    "op_acked",
    "op_failed",
    "op_running",
    "op_released",
];

/// Every row the schema holds, as text: the schema's version, the journals' rows, and each
/// entry's key and a digest of its value.
fn dump_schema(cluster: &PgCluster) -> String {
    cluster
        .psql(
            "SELECT 'schema', version::text, '' FROM opjournal_schema \
             UNION ALL SELECT 'journal', name, commits::text || ' ' || created_at::text \
               FROM opjournal_journals \
             UNION ALL SELECT journal || '/' || tbl::text, encode(k, 'hex'), md5(v) \
               FROM opjournal_kv \
             ORDER BY 1, 2, 3",
        )
        .expect("psql dumps the schema")
}

/// The receipt records of a JSON Lines output, as the library's type.
fn receipts_of(o: &Output) -> BTreeMap<String, Receipt> {
    json_lines(o)
        .into_iter()
        .filter(|(t, _)| t == "receipt")
        .map(|(_, d)| {
            let r: Receipt = serde_json::from_value(d).expect("a receipt as the library's type");
            (r.operation_id.clone(), r)
        })
        .collect()
}

fn summary_of(o: &Output) -> Value {
    json_lines(o).pop().map(|(_, d)| d).expect("a summary line")
}

#[test]
fn stats_ls_show_and_log_on_a_postgres_journal_match_what_the_library_reports() -> TestResult {
    let Some(cluster) = PgCluster::start_or_skip() else {
        return Ok(());
    };
    let url = cluster.url();
    let j = sample(&cluster, "editor");

    // stats: the library's counts.
    let o = ok(&["--json", "stats", "--postgres", &url, "editor"]);
    let lines = json_lines(&o);
    let cli = &lines
        .iter()
        .find(|(t, _)| t == "stats")
        .expect("a stats record")
        .1;
    let lib = serde_json::to_value(j.stats()?)?;
    for key in [
        "format_version",
        "created_at",
        "operations",
        "running",
        "in_doubt",
        "applied",
        "failed",
        "retired",
        "released",
        "pending",
        "delivered",
        "acknowledged",
        "exhausted",
        "ack_expired",
        "oldest_unacked",
        "events",
        "results",
        "scopes",
        "timers",
        "quarantined",
    ] {
        assert_eq!(cli[key], lib[key], "stats `{key}`: cli {cli} library {lib}");
    }
    assert_eq!(cli["operations"], 4, "{cli}");
    assert_eq!(cli["file_bytes"], 0, "no file: {cli}");
    let summary = summary_of(&o);
    assert_eq!(summary["access"], "database", "{summary}");
    assert!(
        summary["database"]
            .as_str()
            .is_some_and(|d| d.contains("journal `editor`") && d.contains("database `postgres`")),
        "{summary}"
    );

    // ls: every receipt, equal to the library's lookup.
    let o = ok(&["--json", "ls", "--postgres", &url, "editor"]);
    let listed = receipts_of(&o);
    let mut expected = BTreeMap::new();
    for id in IDS {
        if let Some(r) = j.lookup(id)? {
            expected.insert(id.to_string(), r);
        }
    }
    assert_eq!(listed, expected);
    assert_eq!(listed.len(), 4, "the released id has no receipt");

    // ls filters and sorts as on a file.
    let o = ok(&[
        "--json",
        "ls",
        "--postgres",
        &url,
        "editor",
        "--status",
        "applied",
        "--sort",
        "id",
    ]);
    let ids: Vec<String> = json_lines(&o)
        .into_iter()
        .filter(|(t, _)| t == "receipt")
        .map(|(_, d)| d["operation_id"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(ids, ["op_acked", "op_applied"]);
    let o = ok(&[
        "--json",
        "ls",
        "--postgres",
        &url,
        "editor",
        "--since",
        "1h",
        "--scope",
        "render/q",
    ]);
    assert_eq!(
        receipts_of(&o).keys().collect::<Vec<_>>(),
        ["op_failed"],
        "--since 1h (the server's time) and --scope"
    );
    let o = ok(&[
        "--json",
        "ls",
        "--postgres",
        &url,
        "editor",
        "--until",
        "1h",
    ]);
    assert!(receipts_of(&o).is_empty(), "nothing submitted an hour ago");
    // Human output: a table with every live operation.
    let o = ok(&["ls", "--postgres", &url, "editor"]);
    let text = stdout(&o);
    for id in ["op_applied", "op_acked", "op_failed", "op_running"] {
        assert!(text.contains(id), "{text}");
    }
    assert!(text.contains("4 operations"), "{text}");

    // show: the receipt, the result and the history of the library.
    let o = ok(&["--json", "show", "--postgres", &url, "editor", "op_applied"]);
    let lines = json_lines(&o);
    let receipt: Receipt = serde_json::from_value(
        lines
            .iter()
            .find(|(t, _)| t == "receipt")
            .expect("a receipt")
            .1
            .clone(),
    )?;
    assert_eq!(Some(receipt), j.lookup("op_applied")?);
    let result = &lines
        .iter()
        .find(|(t, _)| t == "result")
        .expect("a result")
        .1;
    let lib_result = j.result("op_applied")?.expect("a stored result");
    assert_eq!(
        result["content"].as_str().map(str::as_bytes),
        Some(lib_result.bytes.as_slice())
    );
    assert_eq!(result["changed_assets"], json!(lib_result.changed_assets));
    let events: Vec<(u64, String)> = lines
        .iter()
        .filter(|(t, _)| t == "event")
        .map(|(_, d)| {
            (
                d["seq"].as_u64().unwrap_or(u64::MAX),
                d["kind"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let lib_events: Vec<(u64, String)> = j
        .history("op_applied")?
        .iter()
        .map(|e| (e.seq, e.kind.name().to_string()))
        .collect();
    assert_eq!(events, lib_events);
    // --kind on show is not a flag; `show` of an unknown id exits 1 naming how to list.
    let o = run(&["show", "--postgres", &url, "editor", "op_nope"]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("opjournal ls --postgres URL editor"),
        "{}",
        stderr(&o)
    );
    // The released id: not live, its history kept.
    let o = ok(&["show", "--postgres", &url, "editor", "op_released"]);
    assert!(stdout(&o).contains("not live"), "{}", stdout(&o));

    // log: every event of the library, in order, and the filters.
    let o = ok(&["--json", "log", "--postgres", &url, "editor"]);
    let logged: Vec<(u64, Option<String>, String)> = json_lines(&o)
        .into_iter()
        .filter(|(t, _)| t == "event")
        .map(|(_, d)| {
            (
                d["seq"].as_u64().unwrap_or(u64::MAX),
                d["operation_id"].as_str().map(str::to_string),
                d["kind"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let mut lib_log = Vec::new();
    for id in IDS {
        for e in j.history(id)? {
            lib_log.push((e.seq, e.operation_id.clone(), e.kind.name().to_string()));
        }
    }
    lib_log.sort();
    assert_eq!(logged, lib_log);
    assert_eq!(logged.len() as u64, j.stats()?.events);
    let o = ok(&[
        "--json",
        "log",
        "--postgres",
        &url,
        "editor",
        "--kind",
        "completed",
        "--op",
        "op_failed",
    ]);
    let kinds: Vec<Value> = json_lines(&o)
        .into_iter()
        .filter(|(t, _)| t == "event")
        .map(|(_, d)| d["kind"].clone())
        .collect();
    assert_eq!(kinds, [json!("completed")]);
    let o = ok(&["--json", "log", "--postgres", &url, "editor", "--tail", "2"]);
    assert_eq!(summary_of(&o)["events"], 2);

    // stats, human: the journal and the database named, the server's time.
    let o = ok(&["stats", "--postgres", &url, "editor"]);
    let text = stdout(&o);
    assert!(
        text.contains("postgres:journal `editor` in database `postgres`"),
        "{text}"
    );
    assert!(text.contains("the database server's time"), "{text}");
    assert!(text.contains("operations      4"), "{text}");
    Ok(())
}

#[test]
fn the_clocks_shown_are_applied_at_the_servers_time() -> TestResult {
    let Some(cluster) = PgCluster::start_or_skip() else {
        return Ok(());
    };
    let url = cluster.url();
    drop(sample(&cluster, "editor"));
    let server_ms = || -> Result<u64, Box<dyn std::error::Error>> {
        Ok(cluster
            .psql("SELECT (extract(epoch from now()) * 1000)::int8")?
            .trim()
            .parse()?)
    };
    let before = server_ms()?;
    let o = ok(&["--json", "stats", "--postgres", &url, "editor"]);
    let after = server_ms()?;
    let now = json_lines(&o)
        .into_iter()
        .find(|(t, _)| t == "stats")
        .and_then(|(_, d)| d["now"].as_u64())
        .expect("stats carries `now`");
    assert!(
        (before..=after).contains(&now),
        "now {now} is the server's time between {before} and {after}"
    );
    Ok(())
}

#[test]
fn read_only_commands_write_nothing_and_never_create_a_journal() -> TestResult {
    let Some(cluster) = PgCluster::start_or_skip() else {
        return Ok(());
    };
    let url = cluster.url();
    drop(sample(&cluster, "editor"));
    let before = dump_schema(&cluster);
    assert!(before.contains("journal|editor|"), "{before}");
    let commands: [&[&str]; 12] = [
        &["stats"],
        &["--json", "stats"],
        &["ls"],
        &["--json", "ls", "--status", "running"],
        &["show", "op_applied"],
        &["--json", "show", "op_failed"],
        &["log"],
        &["--json", "log", "--op", "op_acked"],
        &["verify"],
        &["--json", "verify"],
        &["export", "--results"],
        &["export", "--dump"],
    ];
    for args in commands {
        // `opjournal [--json] COMMAND --postgres URL editor [flags]`.
        let (global, rest) = args.split_at(usize::from(args[0] == "--json"));
        let mut argv: Vec<&str> = global.to_vec();
        argv.push(rest[0]);
        argv.extend(["--postgres", &url, "editor"]);
        argv.extend(&rest[1..]);
        ok(&argv);
    }
    assert_eq!(
        dump_schema(&cluster),
        before,
        "no row of the schema changed"
    );

    // A journal that does not exist is not created by looking for it.
    for command in ["stats", "ls", "log", "verify", "export"] {
        let o = run(&[command, "--postgres", &url, "nope"]);
        assert_eq!(code(&o), 2, "{command}: {}", stderr(&o));
    }
    assert_eq!(dump_schema(&cluster), before, "no journal was registered");

    // Nor is the schema, in a database that has none.
    cluster.create_database("empty")?;
    let o = run(&["stats", "--postgres", &cluster.url_for("empty"), "editor"]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    let mut c = Client::connect(&cluster.url_for("empty"), NoTls)?;
    let tables: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE tablename LIKE 'opjournal%'",
            &[],
        )?
        .get(0);
    assert_eq!(tables, 0, "no opjournal table was created");
    Ok(())
}

#[test]
fn a_missing_journal_is_a_typed_error_naming_the_database_and_the_journals_present() -> TestResult {
    let Some(cluster) = PgCluster::start_or_skip() else {
        return Ok(());
    };
    let url = cluster.url();
    drop(open(&cluster, "alpha"));
    drop(open(&cluster, "beta"));

    let err = Inspector::open_postgres(&url, "gamma").expect_err("no such journal");
    match err.kind() {
        ErrorKind::NotAJournal { path, detail } => {
            assert_eq!(path.to_str(), Some("gamma"));
            assert!(detail.contains("database `postgres`"), "{detail}");
            assert!(
                detail.contains("journals present: `alpha`, `beta`"),
                "{detail}"
            );
            assert!(detail.contains("open_postgres"), "the next step: {detail}");
        }
        other => panic!("expected NotAJournal, got {other:?}: {err}"),
    }
    for command in [
        &["stats"][..],
        &["ls"],
        &["show", "op_1"],
        &["log"],
        &["verify"],
        &["export"],
    ] {
        let mut argv = vec![command[0], "--postgres", &url, "gamma"];
        argv.extend(&command[1..]);
        let o = run(&argv);
        assert_eq!(code(&o), 2, "{argv:?}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(
            e.starts_with("error: no journal `gamma` to read: "),
            "{argv:?}: {e}"
        );
        assert!(e.contains("`alpha`, `beta`"), "{argv:?}: {e}");
        assert!(e.contains("database `postgres` at 127.0.0.1:"), "{e}");
        assert!(e.contains("\nhint: "), "{e}");
        assert!(stdout(&o).is_empty(), "{}", stdout(&o));
    }

    // A database without the schema.
    cluster.create_database("bare")?;
    let o = run(&["ls", "--postgres", &cluster.url_for("bare"), "alpha"]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("database `bare` at 127.0.0.1:")
            && stderr(&o).contains("holds no opjournal schema")
            && stderr(&o).contains("journals present: none"),
        "{}",
        stderr(&o)
    );

    // An unreachable server: typed, exit 2, no panic.
    let o = run(&[
        "stats",
        "--postgres",
        "postgresql://postgres@127.0.0.1:1/postgres",
        "alpha",
    ]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(
        stderr(&o).starts_with("error: cannot read journal `alpha`"),
        "{}",
        stderr(&o)
    );

    // A schema newer than this build is refused like a newer file format.
    cluster.psql("UPDATE opjournal_schema SET version = 99")?;
    let err = Inspector::open_postgres(&url, "alpha").expect_err("a newer schema");
    assert!(
        matches!(
            err.kind(),
            ErrorKind::UnsupportedFormat {
                found: 99,
                supported: 1
            }
        ),
        "{err}"
    );
    let o = run(&["stats", "--postgres", &url, "alpha"]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("the database's opjournal schema (journal `alpha`) is version 99")
            && stderr(&o).contains("newer opjournal"),
        "{}",
        stderr(&o)
    );
    Ok(())
}

#[test]
fn verify_reports_a_clean_postgres_journal_clean() -> TestResult {
    let Some(cluster) = PgCluster::start_or_skip() else {
        return Ok(());
    };
    let url = cluster.url();
    let j = sample(&cluster, "editor");
    let o = ok(&["verify", "--postgres", &url, "editor"]);
    let text = stdout(&o);
    assert!(text.contains("no problems found"), "{text}");
    // Five stored receipt records: the released id keeps a vacant one until purged.
    assert!(text.contains("12 events, 5 receipts, 3 results"), "{text}");
    assert!(
        text.contains("not checked: the journal is in a database"),
        "{text}"
    );
    let o = ok(&["--json", "verify", "--postgres", &url, "editor"]);
    let summary = summary_of(&o);
    assert_eq!(summary["ok"], true, "{summary}");
    assert_eq!(summary["problems"], 0, "{summary}");
    assert_eq!(summary["events"], j.stats()?.events, "{summary}");
    assert_eq!(summary["receipts"], 5, "{summary}");
    assert!(
        summary["index_entries"].as_u64().is_some_and(|n| n > 0),
        "the indexes were checked: {summary}"
    );
    Ok(())
}

/// The key `id` has in a table keyed by a string, as hex (`to_ordered`: the bytes, each
/// 0x00 escaped, then 0x00 0x00).
fn string_key(id: &str) -> String {
    let mut hex = String::new();
    for b in id.bytes() {
        hex.push_str(&format!("{b:02x}"));
    }
    hex + "0000"
}

#[test]
fn verify_names_damaged_rows_and_exits_1_without_a_panic() -> TestResult {
    let Some(cluster) = PgCluster::start_or_skip() else {
        return Ok(());
    };
    let url = cluster.url();
    drop(sample(&cluster, "editor"));
    // A receipt whose bytes do not decode (table 3: receipts).
    cluster.psql(&format!(
        "UPDATE opjournal_kv SET v = '\\xdeadbeef'::bytea \
         WHERE journal = 'editor' AND tbl = 3 AND k = '\\x{}'::bytea",
        string_key("op_applied")
    ))?;
    // An in-doubt index entry for an operation without a receipt (table 11: in_doubt).
    cluster.psql(&format!(
        "INSERT INTO opjournal_kv (journal, tbl, k, v) \
         VALUES ('editor', 11, '\\x{}'::bytea, ''::bytea)",
        string_key("op_ghost")
    ))?;

    let o = run(&["verify", "--postgres", &url, "editor"]);
    assert_eq!(code(&o), 1, "{}{}", stdout(&o), stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains("problems found:") || text.contains("problem found:"),
        "{text}"
    );
    assert!(
        text.contains("repair works on journal files only"),
        "{text}"
    );
    assert!(!stderr(&o).contains("panic"), "{}", stderr(&o));

    let o = run(&["--json", "verify", "--postgres", &url, "editor"]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    let lines = json_lines(&o);
    let findings: Vec<(String, String, String)> = lines
        .iter()
        .filter(|(t, _)| t == "finding")
        .map(|(_, d)| {
            (
                d["table"].as_str().unwrap_or_default().to_string(),
                d["key"].as_str().unwrap_or_default().to_string(),
                d["problem"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert!(
        findings
            .iter()
            .any(|(t, k, _)| t == "receipts" && k == "op_applied"),
        "the damaged receipt is named: {findings:?}"
    );
    assert!(
        findings
            .iter()
            .any(|(t, k, _)| t == "in_doubt" && k == "op_ghost"),
        "the stray index entry is named: {findings:?}"
    );
    let summary = summary_of(&o);
    assert_eq!(summary["ok"], false, "{summary}");
    assert_eq!(
        summary["problems"].as_u64(),
        Some(findings.len() as u64),
        "{summary}"
    );

    // The other commands answer the damaged receipt with a typed error, exit 2.
    let o = run(&["ls", "--postgres", &url, "editor"]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(
        stderr(&o)
            .contains("damaged record in table `receipts` at key `op_applied` of journal `editor`"),
        "{}",
        stderr(&o)
    );
    assert!(!stderr(&o).contains("panic"), "{}", stderr(&o));
    Ok(())
}

#[test]
fn export_dump_from_postgres_imports_into_a_file_journal_that_answers_the_same() -> TestResult {
    let Some(cluster) = PgCluster::start_or_skip() else {
        return Ok(());
    };
    let url = cluster.url();
    let j = sample(&cluster, "editor");
    let dir = tempfile::tempdir()?;
    let dump = dir.path().join("editor.dump.jsonl");
    let file = dir.path().join("editor.opj");
    let o = ok(&["export", "--postgres", &url, "editor", "--dump"]);
    std::fs::write(&dump, &o.stdout)?;
    let summary = summary_of(&o);
    assert_eq!(summary["events"], j.stats()?.events, "{summary}");
    let (dump_s, file_s) = (
        dump.to_str().expect("a UTF-8 path"),
        file.to_str().expect("a UTF-8 path"),
    );
    ok(&["import", dump_s, file_s]);
    ok(&["verify", file_s]);

    // Read-only, the file answers every lookup, result and history as the database does.
    let insp = Inspector::open(&file)?;
    for id in IDS {
        assert_eq!(insp.lookup(id)?, j.lookup(id)?, "lookup {id}");
        assert_eq!(insp.result(id)?, j.result(id)?, "result {id}");
        assert_eq!(insp.history(id)?, j.history(id)?, "history {id}");
    }
    drop(insp);
    // And the CLI lists the same receipts from both.
    let from_db = receipts_of(&ok(&["--json", "ls", "--postgres", &url, "editor"]));
    let from_file = receipts_of(&ok(&["--json", "ls", file_s]));
    assert_eq!(from_db, from_file);

    // As a journal: a retry replays the recorded result, and a reused id with another
    // intent is refused, as in the database.
    let f = Journal::open(&file)?;
    for (id, n) in [("op_applied", 1), ("op_acked", 2), ("op_failed", 3)] {
        let name = match id {
            "op_applied" => "scene.add_light",
            "op_acked" => "scene.rename",
            _ => "export.render",
        };
        let from_file = f.submit(Operation::new(id, intent(name, n)))?;
        let from_db = j.submit(Operation::new(id, intent(name, n)))?;
        match (&from_file, &from_db) {
            (Admission::Replay(a), Admission::Replay(b)) => {
                assert_eq!(a.receipt.status, b.receipt.status, "{id}");
                assert_eq!(a.result, b.result, "{id}");
            }
            other => panic!("{id}: expected two replays, got {other:?}"),
        }
        let refused = f
            .submit(Operation::new(id, intent(name, n + 100)))
            .expect_err("another intent under a recorded id");
        assert!(
            matches!(refused.kind(), ErrorKind::IntentMismatch { .. }),
            "{refused}"
        );
    }
    assert_eq!(f.lookup("op_released")?, None, "the released id stays free");
    Ok(())
}

#[test]
fn reads_run_beside_a_writer_without_waiting_for_its_lock() -> TestResult {
    let Some(cluster) = PgCluster::start_or_skip() else {
        return Ok(());
    };
    let url = cluster.url();
    let j = Arc::new(sample(&cluster, "editor"));

    // A writer in another thread commits operations while the commands read.
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let writer = {
        let (j, stop, written) = (Arc::clone(&j), Arc::clone(&stop), Arc::clone(&written));
        std::thread::spawn(move || -> Result<(), opjournal::Error> {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                n += 1;
                let id = format!("w_{n:05}");
                let c = match j.submit(Operation::new(id.as_str(), intent("doc.append", n)))? {
                    Admission::Fresh(c) => c,
                    other => panic!("expected fresh work, got {other:?}"),
                };
                j.complete(&c, Outcome::applied(0, id.into_bytes()))?;
                written.fetch_add(1, Ordering::SeqCst);
            }
            Ok(())
        })
    };
    let mut last = 0;
    for _ in 0..4 {
        let o = ok(&["--json", "stats", "--postgres", &url, "editor"]);
        let ops = json_lines(&o)
            .into_iter()
            .find(|(t, _)| t == "stats")
            .and_then(|(_, d)| d["operations"].as_u64())
            .expect("a count");
        assert!(ops >= last, "counts only grow: {ops} after {last}");
        last = ops;
        // Each verify reads one snapshot: the writer's commits never show half-done.
        let o = ok(&["--json", "verify", "--postgres", &url, "editor"]);
        assert_eq!(summary_of(&o)["problems"], 0);
        ok(&["--json", "ls", "--postgres", &url, "editor"]);
        ok(&["--json", "log", "--postgres", &url, "editor", "--tail", "5"]);
    }
    stop.store(true, Ordering::SeqCst);
    writer.join().expect("the writer thread")?;
    assert!(
        written.load(Ordering::SeqCst) > 0,
        "the writer committed while the commands read"
    );

    // A writer that holds the journal's writer lock (an open `execute_in` transaction):
    // the commands read the last commit, without waiting, and never see the uncommitted.
    let mut client = Client::connect(&url, NoTls)?;
    let mut txn = client.transaction()?;
    let held = j.execute_in(
        &mut txn,
        Operation::new("op_in_txn", intent("doc.append", -1)),
        |_txn, _claim| {
            let started = std::time::Instant::now();
            let seen = receipts_of(&ok(&["--json", "ls", "--postgres", &url, "editor"]));
            let o = ok(&["--json", "verify", "--postgres", &url, "editor"]);
            let elapsed = started.elapsed();
            assert!(
                elapsed < Duration::from_secs(20),
                "the reads did not wait for the lock: {elapsed:?}"
            );
            assert!(
                !seen.contains_key("op_in_txn"),
                "the uncommitted claim is not seen"
            );
            assert!(seen.contains_key("op_applied"));
            assert_eq!(summary_of(&o)["problems"], 0);
            Ok::<_, Failure<std::io::Error>>(Outcome::applied(0, b"in txn".to_vec()))
        },
    );
    if let Err(e) = held {
        panic!("execute_in: {e:?}");
    }
    txn.commit()?;
    let o = ok(&["--json", "show", "--postgres", &url, "editor", "op_in_txn"]);
    let status = receipts_of(&o)
        .get("op_in_txn")
        .map(|r| r.status)
        .expect("committed now");
    assert_eq!(status, ExecutionStatus::Applied);
    Ok(())
}
