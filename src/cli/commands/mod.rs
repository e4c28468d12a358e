//! The commands, and what they share: opening the journal read-only (a file, or with
//! `--postgres` a journal in PostgreSQL: [`Target`]), notes on stderr, the JSON summary,
//! exit codes, and turning a panic into an error message.

use std::io::Write as _;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::Instant;

use opjournal::{Access, Inspector};
use serde_json::{Value, json};

use super::failure::{CliError, Failure, Mode, explain, explain_database};
use super::output::Out;
use super::{Cli, Command};

mod backup;
mod compact;
mod export;
mod log;
mod ls;
mod repair;
mod resolve;
mod show;
mod stats;
mod verify;

/// How a command that ran ended.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Nothing wrong (exit 0).
    Clean,
    /// The command ran and found problems (exit 1).
    Problems,
}

type Run = Result<Outcome, Failure>;

/// The last panic's message, kept by the quiet panic hook.
static LAST_PANIC: Mutex<Option<String>> = Mutex::new(None);

/// Replaces the default panic hook (which prints a backtrace notice) with one that only
/// remembers the message: redb may panic on a damaged file, and the library
/// catches those inside verify and repair; one that escapes is reported as an error below.
fn quiet_panics() {
    std::panic::set_hook(Box::new(|info| {
        let payload = info.payload();
        let msg = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        if let Ok(mut slot) = LAST_PANIC.lock() {
            *slot = Some(format!("{msg}{at}"));
        }
    }));
}

fn file_of(command: &Command) -> Option<&Path> {
    Some(match command {
        Command::Stats(a) | Command::Verify(a) => &a.file,
        Command::Ls(a) => &a.file,
        Command::Show(a) => &a.file,
        Command::Log(a) => &a.file,
        Command::Repair(a) => &a.file,
        Command::Compact(a) => &a.file,
        Command::Resolve(a) => &a.file,
        Command::Export(a) => &a.file,
        Command::Backup(a) => &a.file,
        Command::Import(a) => &a.dest,
        Command::Demo { .. }
        | Command::Serve { .. }
        | Command::Completions { .. }
        | Command::Man => return None,
    })
}

/// Whether the command reads a journal in PostgreSQL (`--postgres`).
fn reads_database(command: &Command) -> bool {
    match command {
        Command::Stats(a) | Command::Verify(a) => a.postgres.is_some(),
        Command::Ls(a) => a.postgres.is_some(),
        Command::Show(a) => a.postgres.is_some(),
        Command::Log(a) => a.postgres.is_some(),
        Command::Export(a) => a.postgres.is_some(),
        _ => false,
    }
}

/// Runs the command and turns how it ended into the exit status.
pub(crate) fn run(cli: Cli) -> ExitCode {
    quiet_panics();
    let mut out = Out::stdout(cli.json);
    let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let r = dispatch(&cli.command, &mut out);
        // Flush before deciding: a closed pipe shows up here for buffered output.
        let flushed = out.flush();
        match (r, flushed) {
            (Err(e), _) => Err(e),
            (Ok(_), Err(e)) => Err(e),
            (Ok(o), Ok(())) => Ok(o),
        }
    }));
    match result {
        Ok(Ok(Outcome::Clean)) => ExitCode::SUCCESS,
        Ok(Ok(Outcome::Problems)) => ExitCode::from(1),
        Ok(Err(Failure::BrokenPipe)) => ExitCode::SUCCESS,
        Ok(Err(Failure::Error(e))) => {
            e.print();
            ExitCode::from(2)
        }
        Err(_) => {
            let detail = LAST_PANIC
                .lock()
                .ok()
                .and_then(|mut s| s.take())
                .unwrap_or_else(|| "unknown panic".into());
            let file =
                file_of(&cli.command).map_or_else(|| "FILE".into(), |p| p.display().to_string());
            if reads_database(&cli.command) {
                // No file to repair: the rows were read through the journal's own checks.
                CliError::new(format!(
                    "reading journal `{file}` in the database failed unexpectedly ({detail})"
                ))
                .hint(format!(
                    "`opjournal verify --postgres URL {file}` names damaged rows; if it finds none, this is a bug in opjournal: please report it with the message above"
                ))
                .print();
                return ExitCode::from(2);
            }
            CliError::new(format!(
                "the file is damaged beyond what the storage engine can read ({detail}); run `opjournal repair {file}`"
            ))
            .hint(format!(
                "`opjournal verify {file}` names the damage; if verify finds the file intact, this is a bug in opjournal: please report it with the message above"
            ))
            .print();
            ExitCode::from(2)
        }
    }
}

fn dispatch(command: &Command, out: &mut Out) -> Run {
    match command {
        Command::Stats(a) => stats::run(a, out),
        Command::Ls(a) => ls::run(a, out),
        Command::Show(a) => show::run(a, out),
        Command::Log(a) => log::run(a, out),
        Command::Verify(a) => verify::run(a, out),
        Command::Repair(a) => repair::run(a, out),
        Command::Compact(a) => compact::run(a, out),
        Command::Resolve(a) => resolve::run(a, out),
        Command::Export(a) => export::run(a, out),
        Command::Backup(a) => backup::run_backup(a, out),
        Command::Import(a) => backup::run_import(a, out),
        // Dispatched in `cli::main`, before the panic hook.
        Command::Demo { .. }
        | Command::Serve { .. }
        | Command::Completions { .. }
        | Command::Man => Ok(Outcome::Clean),
    }
}

/// A line on stderr: `note: ...`.
pub(crate) fn note(msg: impl AsRef<str>) {
    let _ = writeln!(
        std::io::stderr(),
        "note: {}",
        crate::cli::failure::one_line(msg.as_ref())
    );
}

/// The name of an access mode, as in the JSON summary.
pub(crate) fn access_name(a: Access) -> &'static str {
    match a {
        Access::Idle => "idle",
        Access::Live => "live",
        Access::Recovered => "recovered",
        Access::Database => "database",
        _ => "other",
    }
}

/// The journal a read-only command reads: a file, or (`--postgres URL NAME`) the journal
/// `NAME` in a PostgreSQL database.
#[derive(Copy, Clone, Debug)]
pub(crate) enum Target<'a> {
    /// A journal file.
    File(&'a Path),
    /// A journal in PostgreSQL: the database's URL, and the journal's name (the
    /// positional argument).
    Postgres { url: &'a str, name: &'a Path },
}

impl<'a> Target<'a> {
    /// The target of a command's positional argument `file` and its `--postgres` flag.
    pub(crate) fn new(file: &'a Path, postgres: Option<&'a str>) -> Target<'a> {
        match postgres {
            Some(url) => Target::Postgres { url, name: file },
            None => Target::File(file),
        }
    }

    /// Whether the journal is in a database.
    pub(crate) fn is_database(self) -> bool {
        matches!(self, Target::Postgres { .. })
    }

    /// `opjournal COMMAND` on this journal, for hints (the URL is written `URL`: it may
    /// hold a password).
    pub(crate) fn command(self, command: &str) -> String {
        match self {
            Target::File(p) => format!("opjournal {command} {}", p.display()),
            Target::Postgres { name, .. } => {
                format!("opjournal {command} --postgres URL {}", name.display())
            }
        }
    }

    /// A library error while reading this journal.
    pub(crate) fn err(self) -> impl Fn(opjournal::Error) -> Failure + 'a {
        move |e| {
            Failure::Error(match self {
                Target::File(path) => explain(&e, path, Mode::Read),
                Target::Postgres { name, .. } => explain_database(&e, &name.display().to_string()),
            })
        }
    }
}

/// Opens the target read-only: a file as [`inspect`] does; a journal in PostgreSQL
/// without creating or writing anything.
pub(crate) fn open(target: Target<'_>) -> Result<Inspector, Failure> {
    match target {
        Target::File(path) => inspect(path),
        Target::Postgres { url, name } => {
            let Some(text) = name.to_str() else {
                return Err(CliError::new(format!(
                    "the journal name `{}` is not UTF-8",
                    name.display()
                ))
                .hint("journal names in PostgreSQL are text: pass the name the journal was created with")
                .into());
            };
            Inspector::open_postgres(url, text).map_err(target.err())
        }
    }
}

/// Opens the journal read-only, saying on stderr how it was reached when a writer has it
/// open or it was not closed cleanly.
pub(crate) fn inspect(path: &Path) -> Result<Inspector, Failure> {
    let insp = Inspector::open(path).map_err(|e| explain(&e, path, Mode::Read))?;
    if insp.access() != Access::Idle {
        note(insp.access().describe());
    }
    note_trailing(&insp);
    Ok(insp)
}

/// Says on stderr what follows the journal's data in its file, if anything does.
pub(crate) fn note_trailing(insp: &Inspector) {
    let n = insp.trailing_bytes();
    if n > 0 {
        note(format!(
            "{n} bytes follow the journal's data in `{}`: they are not part of the journal and were not read (a writer refuses the file until `opjournal repair` trims them)",
            insp.path().display()
        ));
    }
}

/// Opens the journal read-only to check it before a write command opens it for writing
/// (a writer would create a missing file, and commits on open).
pub(crate) fn inspect_before_writing(path: &Path) -> Result<Inspector, Failure> {
    let insp = Inspector::open(path).map_err(|e| explain(&e, path, Mode::Read))?;
    let n = insp.trailing_bytes();
    if n > 0 {
        return Err(super::failure::CliError::new(format!(
            "{n} bytes follow the journal's data in `{}`: a writer cannot open the file with them",
            path.display()
        ))
        .hint(format!(
            "`opjournal repair {}` trims them (the journal's data is intact; read-only commands read it as it is)",
            path.display()
        ))
        .into());
    }
    Ok(insp)
}

/// A library error while reading the journal at `path`.
pub(crate) fn read_err(path: &Path) -> impl Fn(opjournal::Error) -> Failure + '_ {
    move |e| Failure::Error(explain(&e, path, Mode::Read))
}

/// A library error while writing the journal at `path`.
pub(crate) fn write_err(path: &Path) -> impl Fn(opjournal::Error) -> Failure + '_ {
    move |e| Failure::Error(explain(&e, path, Mode::Write))
}

/// Milliseconds with three decimals (whole microseconds): no float noise in the output.
pub(crate) fn elapsed_ms(d: std::time::Duration) -> f64 {
    d.as_micros() as f64 / 1000.0
}

/// The final JSON line of every command: what ran, on which file, and its counts.
pub(crate) struct Summary {
    command: &'static str,
    file: String,
    started: Instant,
    access: Option<Access>,
    /// The journal's database, when it is in one.
    database: Option<String>,
}

impl Summary {
    pub(crate) fn start(command: &'static str, file: &Path) -> Summary {
        Summary {
            command,
            file: file.display().to_string(),
            started: Instant::now(),
            access: None,
            database: None,
        }
    }

    pub(crate) fn access(&mut self, a: Access) {
        self.access = Some(a);
    }

    /// Records how `insp` reached the journal, and for a journal in a database which one
    /// (``postgres:journal `orders` in database `app` at db1:5432``).
    pub(crate) fn inspected(&mut self, insp: &Inspector) {
        self.access = Some(insp.access());
        if insp.access() == Access::Database {
            self.database = Some(insp.path().display().to_string());
        }
    }

    /// Writes the summary (JSON mode only), merging `counts` into it.
    pub(crate) fn write(&self, out: &mut Out, outcome: Outcome, counts: Value) -> Run {
        if out.json() {
            let mut data = json!({
                "command": self.command,
                "file": self.file,
                "access": self.access.map(access_name),
                "ok": outcome == Outcome::Clean,
                "elapsed_ms": elapsed_ms(self.started.elapsed()),
            });
            if let (Some(db), Value::Object(d)) = (&self.database, &mut data) {
                d.insert("database".into(), json!(db));
            }
            if let (Value::Object(d), Value::Object(c)) = (&mut data, counts) {
                d.extend(c);
            }
            out.record("summary", &data)?;
        }
        Ok(outcome)
    }
}
