//! Why a command could not run, and how that is printed: one `error:` line saying what
//! happened, the cause chain, and a `hint:` line saying what to do (exit code 2).

use std::io::Write as _;
use std::path::Path;

use opjournal::{Error, ErrorKind};

/// How a command ended early.
#[derive(Debug)]
pub(crate) enum Failure {
    /// stdout was closed by its reader (`opjournal log FILE | head`): exit quietly, 0.
    BrokenPipe,
    /// The command could not run (exit 2).
    Error(CliError),
}

/// A message for stderr: what happened, its causes, and what to do.
#[derive(Debug)]
pub(crate) struct CliError {
    message: String,
    causes: Vec<String>,
    hint: Option<String>,
}

impl CliError {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        CliError {
            message: message.into(),
            causes: Vec::new(),
            hint: None,
        }
    }

    pub(crate) fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    fn causes_of(mut self, err: &(dyn std::error::Error + 'static)) -> Self {
        let mut source = err.source();
        while let Some(s) = source {
            let text = s.to_string();
            // redb sometimes repeats its own cause; print each distinct line once.
            if !self.causes.contains(&text) && text != self.message {
                self.causes.push(text);
            }
            source = s.source();
        }
        self
    }

    /// Prints the message to stderr (ignoring a closed stderr: there is nowhere else to
    /// say it).
    /// Each part stays on its own line: control characters in it (a path holding a
    /// newline) are printed escaped.
    pub(crate) fn print(&self) {
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err, "error: {}", one_line(&self.message));
        for cause in &self.causes {
            let _ = writeln!(err, "  caused by: {}", one_line(cause));
        }
        if let Some(hint) = &self.hint {
            let _ = writeln!(err, "hint: {}", one_line(hint));
        }
    }

    #[cfg(test)]
    pub(crate) fn message(&self) -> &str {
        &self.message
    }
}

impl From<CliError> for Failure {
    fn from(e: CliError) -> Self {
        Failure::Error(e)
    }
}

/// `text` with its control characters escaped as Rust escapes them (`\n`, `\t`,
/// `\u{1b}`), so that one message is one line of a terminal or a log.
pub(crate) fn one_line(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return text.into();
    }
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_debug().to_string()
            } else {
                c.to_string()
            }
        })
        .collect::<String>()
        .into()
}

/// What the command was doing to the file, which decides the hint for a lock conflict.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// A read-only command (stats, ls, show, log, verify, export).
    Read,
    /// A command that writes the file (repair, compact, resolve).
    Write,
}

/// Turns a library error about the journal at `path` into a message with a hint.
pub(crate) fn explain(err: &Error, path: &Path, mode: Mode) -> CliError {
    let file = path.display();
    let verb = match mode {
        Mode::Read => "reading",
        Mode::Write => "writing",
    };
    match err.kind() {
        // An I/O error that names what the journal was doing says it, with what it means.
        ErrorKind::Io
            if err.during().is_some()
                && !matches!(
                    std::error::Error::source(err)
                        .and_then(|s| s.downcast_ref::<std::io::Error>())
                        .map(std::io::Error::kind),
                    Some(
                        std::io::ErrorKind::NotFound
                            | std::io::ErrorKind::PermissionDenied
                            | std::io::ErrorKind::IsADirectory
                    )
                ) =>
        {
            CliError::new(format!("{err} (`{file}`)"))
                .causes_of(err)
                .hint("check the disk and the file system, then run the command again")
        }
        ErrorKind::Io => {
            let io = std::error::Error::source(err).and_then(|s| s.downcast_ref::<std::io::Error>());
            match io.map(std::io::Error::kind) {
                Some(std::io::ErrorKind::NotFound) => CliError::new(format!("no such file `{file}`"))
                    .hint("check the path; `opjournal demo --journal FILE` writes a sample journal to inspect"),
                Some(std::io::ErrorKind::PermissionDenied) => {
                    CliError::new(format!("permission denied {verb} `{file}`")).hint(match mode {
                        Mode::Read => "run as a user who may read the file, or inspect a copy of it",
                        Mode::Write => "run as a user who may write the file and its directory (repair writes a backup beside it)",
                    })
                }
                Some(std::io::ErrorKind::UnexpectedEof) => CliError::new(format!(
                    "`{file}` is damaged: it ends inside the storage engine's header (a truncated file?)"
                ))
                .hint(format!(
                    "`opjournal verify {file}` says what can be salvaged; `opjournal repair {file}` salvages it"
                )),
                Some(std::io::ErrorKind::IsADirectory) => {
                    CliError::new(format!("`{file}` is a directory, not a journal file"))
                        .hint("pass the journal file itself (journals are single files, usually `*.opj`)")
                }
                _ => CliError::new(format!("I/O error {verb} `{file}`"))
                    .causes_of(err)
                    .hint("check the disk and the file system, then run the command again"),
            }
        }
        ErrorKind::NotAJournal { detail, .. } if detail.contains("not a regular file") => {
            CliError::new(format!("`{file}` is not an opjournal journal: {detail}"))
                .hint("check the path: pass the journal file itself (a regular file, usually `*.opj`)")
        }
        ErrorKind::NotAJournal { detail, .. } => {
            CliError::new(format!("`{file}` is not an opjournal journal: {detail}")).hint(
                "check the path; if this file was a journal, it is damaged beyond salvage: restore it from a backup",
            )
        }
        ErrorKind::UnsupportedFormat { found, supported } => CliError::new(format!(
            "`{file}` has journal format version {found}, but this opjournal {} reads version {supported}",
            env!("CARGO_PKG_VERSION")
        ))
        .hint(if found > supported {
            "the journal was written by a newer opjournal: use that release's CLI to inspect it"
        } else {
            "the journal was written by an older opjournal: open it with the library to upgrade it explicitly"
        }),
        ErrorKind::Locked { .. } => match mode {
            Mode::Read => CliError::new(format!(
                "journal `{file}` is locked by a writer that excludes readers (`Sharing::Exclusive`)"
            ))
            .hint(
                "close the editor, or have it open the journal with `Sharing::LiveReaders` (the default) so read-only commands work while it runs",
            ),
            Mode::Write => CliError::new(format!(
                "journal `{file}` is open in another process (an editor, or another opjournal command)"
            ))
            .hint(
                "close that process first: repair, compact and resolve need the journal to themselves (read-only commands work beside a live writer)",
            ),
        },
        ErrorKind::Corrupt { table, key, detail } => CliError::new(if table.starts_with('(') {
            // redb's own structures, not a record.
            format!("`{file}` is damaged: {detail}")
        } else {
            format!("damaged record in table `{table}` at key `{key}` of `{file}`: {detail}")
        })
        .causes_of(err)
            .hint(format!(
                "`opjournal verify {file}` lists every damaged record; `opjournal repair {file}` rebuilds the indexes and quarantines the damage"
            )),
        ErrorKind::Poisoned => CliError::new(err.to_string())
            .causes_of(err)
            .hint("an I/O error interrupted a commit; check the disk, then run the command again"),
        ErrorKind::UnknownOperation { operation_id } => CliError::new(format!(
            "no operation `{operation_id}` is recorded in `{file}` (never submitted, released, or purged)"
        ))
        .hint(format!("list the operations with `opjournal ls {file}`")),
        // The library refuses to open a read-only file for writing; its reason ends on
        // the next step, which goes on the hint line like every other.
        ErrorKind::InvalidInput { what: "journal file", reason, .. } if reason.contains("read-only") => {
            let why = reason.split_once(": make it writable").map_or(reason.as_str(), |(why, _)| why);
            CliError::new(format!("cannot open `{file}` for writing: {why}")).hint(format!(
                "make it writable (`chmod u+w {file}`), or work on a writable copy; read-only commands such as `opjournal ls`, `verify` and `export` read it as it is, and `opjournal repair {file} --dry-run` shows what a repair would do"
            ))
        }
        ErrorKind::InvalidState { operation_id, .. } => CliError::new(err.to_string()).hint(format!(
            "only in-doubt operations are resolved; `opjournal show {file} {operation_id}` shows its state"
        )),
        _ => CliError::new(err.to_string()).causes_of(err),
    }
}

/// Turns a library error about the journal `name` in a PostgreSQL database (`--postgres`)
/// into a message with a hint. The library's messages name the journal and the database;
/// the URL itself is never printed (it may hold a password).
pub(crate) fn explain_database(err: &Error, name: &str) -> CliError {
    match err.kind() {
        ErrorKind::NotAJournal { detail, .. } => {
            CliError::new(format!("no journal `{name}` to read: {detail}")).hint(
                "read-only commands never create a journal or the schema: pass the name of one \
                 of the journals present, or check --postgres",
            )
        }
        ErrorKind::UnsupportedFormat { found, supported } => {
            let what = if *supported == opjournal::FORMAT_VERSION {
                "the journal's format"
            } else {
                "the database's opjournal schema"
            };
            CliError::new(format!(
                "{what} (journal `{name}`) is version {found}, but this opjournal {} reads \
                 version {supported}",
                env!("CARGO_PKG_VERSION")
            ))
            .hint(if found > supported {
                "it was written by a newer opjournal: use that release's CLI to inspect it"
            } else {
                "open the journal once with this release's library to migrate it"
            })
        }
        ErrorKind::Unavailable { detail, .. } => {
            CliError::new(format!("cannot read journal `{name}`: {detail}")).hint(
                "check that the server is running and reachable at the URL's host and port; \
                 nothing was written, so running the command again is safe",
            )
        }
        ErrorKind::Storage => {
            CliError::new(format!("the database refused reading journal `{name}`"))
                .causes_of(err)
                .hint(
                    "check the URL's user, password and database, and that the user may read the \
             opjournal_ tables",
                )
        }
        ErrorKind::InvalidInput { .. } => CliError::new(err.to_string()).hint(
            "write --postgres as `postgresql://user@host:5432/database`, and the journal's \
             name as it was created",
        ),
        ErrorKind::Corrupt { table, key, detail } => CliError::new(format!(
            "damaged record in table `{table}` at key `{key}` of journal `{name}`: {detail}"
        ))
        .causes_of(err)
        .hint(format!(
            "`opjournal verify --postgres URL {name}` lists every damaged record"
        )),
        _ => CliError::new(err.to_string()).causes_of(err),
    }
}

/// A write to stdout failed: a closed pipe ends quietly, anything else is an error.
pub(crate) fn output_failed(e: std::io::Error) -> Failure {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        Failure::BrokenPipe
    } else {
        Failure::Error(CliError::new(format!("cannot write the output: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io(kind: std::io::ErrorKind) -> Error {
        Error::from(std::io::Error::from(kind))
    }

    #[test]
    fn io_errors_say_what_happened_to_which_file() {
        let p = Path::new("x.opj");
        let cases = [
            (
                std::io::ErrorKind::NotFound,
                Mode::Read,
                "no such file `x.opj`",
            ),
            (
                std::io::ErrorKind::PermissionDenied,
                Mode::Read,
                "permission denied reading `x.opj`",
            ),
            (
                std::io::ErrorKind::PermissionDenied,
                Mode::Write,
                "permission denied writing `x.opj`",
            ),
            (
                std::io::ErrorKind::IsADirectory,
                Mode::Read,
                "`x.opj` is a directory, not a journal file",
            ),
        ];
        for (kind, mode, message) in cases {
            let e = explain(&io(kind), p, mode);
            assert_eq!(e.message(), message);
            assert!(e.hint.is_some(), "{message} comes with a hint");
        }
    }

    #[test]
    fn broken_pipe_is_quiet_and_other_write_errors_are_reported() {
        let quiet = output_failed(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert!(matches!(quiet, Failure::BrokenPipe), "{quiet:?}");
        let loud = output_failed(std::io::Error::other("disk full"));
        match loud {
            Failure::Error(e) => assert_eq!(e.message(), "cannot write the output: disk full"),
            Failure::BrokenPipe => panic!("a full disk is not a closed pipe"),
        }
    }
}
