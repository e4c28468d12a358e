//! `opjournal demo`: the main job. An editor service (embedding the journal) and an agent
//! client talk over a real loopback socket; the client disconnects at every boundary of
//! the failure window (before acceptance, after acceptance, after the commit, after
//! delivery, never acknowledging, reconnecting repeatedly), and every answer says in words
//! what happened. The session ends with a
//! table of what the client did, what the service answered and how many times each edit
//! landed, and leaves the journal to inspect.
//!
//! `--json` prints the session as JSON Lines instead.

mod client;
mod script;
mod transcript;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use script::{DemoError, Paths, Report, kib};
use transcript::Transcript;

/// Arguments of `opjournal demo`.
#[derive(Debug, Clone)]
pub(crate) struct DemoArgs {
    /// Where to write the journal (default: `demo.opj` in a new temporary directory).
    pub journal: Option<PathBuf>,
    /// Also keep the editor's document file beside the journal.
    pub keep: bool,
    /// Print the session as JSON Lines (`opjournal --json demo`).
    pub json: bool,
}

pub(crate) fn run(args: &DemoArgs) -> ExitCode {
    let mut out = Transcript::new(args.json);
    match session(args, &mut out) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {}", opjournal::service::chain(&e));
            ExitCode::from(2)
        }
    }
}

/// Runs the session; `Ok(false)` when an edit landed a different number of times than
/// expected or a repeated result was not marked as a replay.
fn session(args: &DemoArgs, out: &mut Transcript) -> Result<bool, DemoError> {
    let paths = paths(args)?;
    let report = script::run(&paths, out)?;
    let problems = problems(&report);
    conclude(&paths, &report, &problems, out);
    if !args.keep {
        // The journal stays for inspection; the document was only the editor's.
        for p in paths.document_files() {
            let _ = std::fs::remove_file(p);
        }
    }
    for p in &problems {
        eprintln!("problem: {p}");
    }
    Ok(problems.is_empty())
}

fn paths(args: &DemoArgs) -> Result<Paths, DemoError> {
    let journal = match &args.journal {
        Some(p) => p.clone(),
        None => {
            let dir = tempfile::Builder::new()
                .prefix("opjournal-demo-")
                .tempdir()
                .map_err(|source| DemoError::Io {
                    what: "create a temporary directory".into(),
                    source,
                })?;
            dir.keep().join("demo.opj")
        }
    };
    let paths = Paths {
        document: journal.with_extension("scene.json"),
        journal,
    };
    for p in std::iter::once(paths.journal.clone()).chain(paths.document_files()) {
        if p.exists() {
            return Err(DemoError::Exists { path: p });
        }
    }
    Ok(paths)
}

/// What went against expectations.
fn problems(report: &Report) -> Vec<String> {
    let mut out = Vec::new();
    for row in &report.rows {
        if row.applied != row.expected {
            out.push(format!(
                "{} ({}): `{}` landed {} time(s), expected {}",
                row.boundary, row.op, row.edit, row.applied, row.expected
            ));
        }
    }
    // Every operation's edit is in the document exactly once.
    for op in &report.ops {
        let n = report.document.times_applied(op);
        if n != 1 {
            out.push(format!(
                "{op} landed {n} time(s) in the document, expected once"
            ));
        }
    }
    // A result is unmarked only as the first delivery of a new execution.
    for op in &report.ops {
        let fresh: Vec<_> = report
            .results
            .iter()
            .filter(|r| &r.id == op && !r.replayed)
            .collect();
        if fresh.len() > 1 || fresh.iter().any(|r| r.delivery != 1) {
            out.push(format!(
                "{op}: a repeated result was not marked as a replay"
            ));
        }
    }
    let storm = &report.storm;
    if storm.connections != 1
        || storm.waiting > 1
        || storm.pushes >= storm.reloads as usize
        || storm.pushes > storm.budget as usize
    {
        out.push(format!(
            "the reconnect storm was not bounded: {} connections, {} waiting, {} pushes over {} reloads",
            storm.connections, storm.waiting, storm.pushes, storm.reloads
        ));
    }
    out
}

fn shell_quote(p: &Path) -> String {
    let s = p.display().to_string();
    if s.chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-+:@,".contains(c))
    {
        s
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

fn conclude(paths: &Paths, report: &Report, problems: &[String], out: &mut Transcript) {
    let doc = &report.document;
    let journal = shell_quote(&paths.journal);
    let commands = [
        format!("opjournal ls {journal}"),
        format!("opjournal show {journal} op_8"),
        format!("opjournal log {journal}"),
    ];
    out.heading("", "What happened");
    out.rows(&report.rows);
    if out.json() {
        out.summary(serde_json::json!({
            // The fields every command's summary starts with.
            "command": "demo",
            "file": paths.journal.display().to_string(),
            "access": null,
            "ok": problems.is_empty(),
            "problems": problems,
            "document": {"revision": doc.revision(), "objects": doc.objects()},
            "operations": report.ops,
            "storm": report.storm,
            "journal": {
                "path": paths.journal,
                "operations": report.operations,
                "events": report.events,
                "file_bytes": report.file_bytes,
            },
            "inspect": commands,
            "elapsed_ms": report.elapsed.as_millis() as u64,
        }));
        return;
    }
    out.text(&format!(
        "\nfinal document, revision {}: {}",
        doc.revision(),
        doc.describe()
    ));
    if problems.is_empty() {
        out.text(&format!(
            "every edit landed exactly once: {} operations, {} effects, none applied twice; every repeated result was marked as a replay",
            report.ops.len(),
            doc.edits_applied()
        ));
    } else {
        out.text(&format!(
            "{} problem(s): see the table and stderr",
            problems.len()
        ));
    }
    out.text(&format!(
        "the session took {:.1} s of real time",
        report.elapsed.as_secs_f64()
    ));
    out.text(&format!(
        "\nthe journal is left at {} ({} operations, {} events, {}); inspect it with:",
        paths.journal.display(),
        report.operations,
        report.events,
        kib(report.file_bytes)
    ));
    for c in &commands {
        out.text(&format!("  {c}"));
    }
}
