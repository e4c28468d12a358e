//! The `opjournal` command-line tool: inspect, verify, repair and compact
//! journal files, also while an editor has them open.
//!
//! Results go to stdout as aligned tables, or as JSON Lines with `--json` (docs/cli.md);
//! diagnostics go to stderr. Exit status: 0 clean, 1 problems found, 2 could not run.

use std::path::PathBuf;
use std::process::ExitCode;

use std::io::Write as _;
use std::sync::LazyLock;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

mod commands;
pub(crate) mod demo;
mod failure;
mod format;
mod output;
mod progress;
mod serve;

use format::TimeArg;

const AFTER_HELP: &str = "\
Examples:
  opjournal stats project.opj
  opjournal ls project.opj --status in_doubt
  opjournal show project.opj op_7f3
  opjournal --json log project.opj --follow
  opjournal verify project.opj && echo intact
  opjournal stats --postgres postgresql://app@db1:5432/app orders

  opjournal completions bash > /etc/bash_completion.d/opjournal
  opjournal man > opjournal.1

Read-only commands (stats, ls, show, log, verify, export, backup) never modify the file and
work while an editor has it open (with the library's default `Sharing::LiveReaders`).
With `--postgres URL`, stats, ls, show, log, verify and export read the journal NAME in that
PostgreSQL database instead of a file: they never create or write anything there, and
work while other processes write (docs/postgres.md).
Exit status: 0 clean; 1 the command ran and found problems (verify, repair --dry-run, a
damaged result) or nothing to show (show of an unknown id); 2 could not run.
JSON Lines output is documented in docs/cli.md.";

/// `opjournal 0.1.0 (journal format 1)`: the package version and the file format version
/// this build reads and writes.
static VERSION: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{} (journal format {})",
        env!("CARGO_PKG_VERSION"),
        opjournal::FORMAT_VERSION
    )
});

/// The command-line interface as clap sees it, with the version naming the file format.
pub(crate) fn command() -> clap::Command {
    Cli::command().version(VERSION.as_str())
}

/// Inspect, verify, repair and compact opjournal journal files.
#[derive(Parser, Debug)]
#[command(
    name = "opjournal",
    version,
    about = "Inspect, verify, repair and compact opjournal journal files, also while an editor has them open",
    after_help = AFTER_HELP
)]
pub(crate) struct Cli {
    /// Print JSON Lines (one `{"type": ..., "data": ...}` object per line, ending with a
    /// `summary`) instead of tables.
    #[arg(long, global = true)]
    pub json: bool,

    /// Print times in the system's local time zone instead of UTC (JSON output keeps
    /// milliseconds since the Unix epoch).
    #[arg(long, global = true)]
    pub local: bool,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Show counts by execution status and delivery state, the oldest unacknowledged result,
    /// the file size and the format version.
    #[command(
        after_help = "Examples:\n  opjournal stats project.opj\n  opjournal stats --postgres postgresql://app@db1:5432/app orders"
    )]
    Stats(FileArgs),

    /// List operations (receipts), oldest submission first, filtered by status, delivery,
    /// scope, session, intent or time.
    #[command(after_help = "\
Examples:
  opjournal ls project.opj
  opjournal ls project.opj --status in_doubt,running
  opjournal ls project.opj --scope scene/main --since 2h --limit 20
  opjournal ls --postgres postgresql://app@db1:5432/app orders --status in_doubt")]
    Ls(LsArgs),

    /// Show one operation: its receipt, a preview of its result, and its event history.
    #[command(
        after_help = "Examples:\n  opjournal show project.opj op_7f3 --full\n  opjournal show --postgres postgresql://app@db1:5432/app orders op_7f3"
    )]
    Show(ShowArgs),

    /// Print the event journal (the file's source of truth), filtered, and optionally keep
    /// printing new events as a writer records them.
    #[command(after_help = "\
Examples:
  opjournal log project.opj --op op_7f3
  opjournal log project.opj --tail 20 --follow
  opjournal log --postgres postgresql://app@db1:5432/app orders --op op_7f3")]
    Log(LogArgs),

    /// Check the file: redb's page checksums, every record's CRC and decode,
    /// and every index against a replay of the event journal. Exits 1 if anything is wrong.
    /// With `--postgres`, the same record and index checks on the journal's rows (there
    /// are no file pages to check).
    #[command(
        after_help = "Examples:\n  opjournal verify project.opj || opjournal repair project.opj --dry-run\n  opjournal verify --postgres postgresql://app@db1:5432/app orders"
    )]
    Verify(FileArgs),

    /// Back the file up, then rebuild every index from the event journal, quarantine damaged
    /// records and report exactly what was lost; salvage intact records into a new file if
    /// redb refuses it.
    #[command(after_help = "\
Examples:
  opjournal repair project.opj --dry-run
  opjournal repair project.opj

The editor must be closed: repair needs the journal to itself.")]
    Repair(RepairArgs),

    /// Run the compactor now (fire every due timer: lease expiry, retry budgets, ack
    /// timeouts, retention) and print what it did; `--reclaim` also shrinks the file.
    #[command(after_help = "\
Example:
  opjournal compact project.opj --reclaim

The editor must be closed: compact needs the journal to itself.")]
    Compact(CompactArgs),

    /// Record how an in-doubt operation ended, after checking the real project state:
    /// applied at a revision, failed, or not applied (the id becomes free again).
    #[command(after_help = "\
Examples:
  opjournal resolve project.opj op_7f3 --applied 184
  opjournal resolve project.opj op_7f3 --failed \"the door no longer exists\"
  opjournal resolve project.opj op_7f3 --not-applied

The editor must be closed: resolve needs the journal to itself.")]
    Resolve(ResolveArgs),

    /// Write every receipt and event as JSON Lines (streaming, in constant memory).
    #[command(after_help = "\
Examples:
  opjournal export project.opj > project.jsonl
  opjournal export project.opj --only events --results | jq -c 'select(.type == \"result\")'
  opjournal export project.opj --dump > project.dump.jsonl   # `opjournal import` loads it

From PostgreSQL into a file (a migration path):
  opjournal export --postgres postgresql://app@db1:5432/app orders --dump | opjournal import - orders.opj")]
    Export(ExportArgs),

    /// Copy a journal into a new journal file: a consistent snapshot of its latest commit,
    /// also while an editor has it open. The copy is one closed file (no log) that
    /// `verify` passes; DEST must not exist.
    #[command(after_help = "\
Examples:
  opjournal backup project.opj project-2026-12-01.opj
  opjournal backup project.opj backup.opj && opjournal verify backup.opj

Works while the editor runs (with the library's default `Sharing::LiveReaders`); the source
is never written.")]
    Backup(BackupArgs),

    /// Build a new journal from a dump written by `export --dump`: the events are replayed
    /// (every index rebuilt), results and the meta restored. DEST must not exist; a bad dump
    /// writes nothing and names the line.
    #[command(after_help = "\
Examples:
  opjournal export project.opj --dump > project.dump.jsonl
  opjournal import project.dump.jsonl restored.opj
  opjournal export project.opj --dump | opjournal import - restored.opj")]
    Import(ImportArgs),

    /// Run a realistic editor session over a loopback socket, with forced disconnects at
    /// every boundary, and leave a journal to inspect.
    Demo {
        /// Where to write the journal (default: a new file in the temp directory).
        #[arg(long)]
        journal: Option<PathBuf>,
        /// Also keep the editor's document file beside the journal (the journal is
        /// always left for inspection).
        #[arg(long)]
        keep: bool,
    },

    /// Run the reference editor service on a loopback port, over the journal (docs/protocol.md).
    /// The first line on stdout is `listening on 127.0.0.1:PORT`; it runs until stopped.
    /// With `--mcp` it speaks the Model Context Protocol instead (docs/mcp.md): over stdio,
    /// or with `--port` over Streamable HTTP at `http://127.0.0.1:PORT/mcp`.
    #[command(after_help = "\
Examples:
  opjournal serve --journal project.opj
  opjournal serve --journal project.opj --port 7878 --max-connections 64 --idle-timeout 1min
  opjournal serve --mcp --journal project.opj              # MCP over stdio (for an MCP host)
  opjournal serve --mcp --journal project.opj --port 8765  # MCP over Streamable HTTP
  opjournal serve --postgres postgresql://app@db1/app --journal editor --port 7878

The document is kept beside the journal (project.scene.json and project.scene.log). With
`--postgres`, the journal and the document are in that database (docs/postgres.md), and
several processes on it serve one document.")]
    Serve {
        /// The journal file (created if missing); with `--postgres`, the journal's name in
        /// the database (default `editor`), which also names the document.
        #[arg(long, required_unless_present = "postgres")]
        journal: Option<PathBuf>,
        /// Keep the journal and the document in the PostgreSQL database at this URL
        /// (`postgresql://user@host:5432/db`); tables are created if missing.
        #[arg(long, value_name = "URL", conflicts_with = "mcp")]
        postgres: Option<String>,
        /// Speak the Model Context Protocol: the scene as tools, the edits journaled. Over
        /// stdio, or over Streamable HTTP with `--port`.
        #[arg(long)]
        mcp: bool,
        /// The port on 127.0.0.1 (0: one chosen by the system, printed at start; the
        /// default without `--mcp`).
        #[arg(long)]
        port: Option<u16>,
        /// Fault injection for tests: hold the first operation that reaches this step
        /// (accepted, mutated, committed) until the process is killed.
        #[arg(long, hide = true, value_name = "STEP")]
        fault_hold: Option<String>,
        /// Connections served at once; the next one is answered `too_many_connections`.
        #[arg(long, value_name = "N", default_value_t = 256)]
        max_connections: usize,
        /// Close a connection that sends no request for this long (`30s`, `5min`).
        #[arg(long, value_name = "DURATION", default_value = "5min", value_parser = format::parse_duration)]
        idle_timeout: std::time::Duration,
    },

    /// Print a shell completion script for bash, elvish, fish, powershell or zsh.
    #[command(after_help = "\
Examples:
  opjournal completions bash > ~/.local/share/bash-completion/completions/opjournal
  opjournal completions zsh > ~/.zfunc/_opjournal")]
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },

    /// Print the manual page (roff) on stdout.
    #[command(after_help = "Example:\n  opjournal man > opjournal.1 && man ./opjournal.1")]
    Man,
}

#[derive(Args, Debug)]
pub(crate) struct FileArgs {
    /// The journal file (usually `*.opj`), or with `--postgres` the journal's name.
    pub file: PathBuf,
    /// Read the journal NAME in the PostgreSQL database at URL
    /// (`postgresql://user@host:5432/db`) instead of a file. Nothing is created or written
    /// there; the clocks are applied at the server's time.
    #[arg(long, value_name = "URL")]
    pub postgres: Option<String>,
}

/// Execution statuses, as named on the command line.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum StatusArg {
    Running,
    #[value(name = "in_doubt", alias = "in-doubt")]
    InDoubt,
    Applied,
    Failed,
    Retired,
}

/// Delivery states, as named on the command line.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum DeliveryArg {
    Pending,
    Delivered,
    Acknowledged,
    Exhausted,
    #[value(name = "ack_expired", alias = "ack-expired")]
    AckExpired,
}

/// Orders for `ls`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum SortArg {
    /// Oldest submission first.
    Submitted,
    /// By operation id.
    Id,
}

#[derive(Args, Debug)]
pub(crate) struct LsArgs {
    /// The journal file (usually `*.opj`), or with `--postgres` the journal's name.
    pub file: PathBuf,
    /// Read the journal NAME in the PostgreSQL database at URL
    /// (`postgresql://user@host:5432/db`) instead of a file. Nothing is created or written
    /// there; the clocks are applied at the server's time.
    #[arg(long, value_name = "URL")]
    pub postgres: Option<String>,
    /// Only these execution statuses (comma-separated or repeated).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub status: Vec<StatusArg>,
    /// Only these delivery states (comma-separated or repeated).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub delivery: Vec<DeliveryArg>,
    /// Only operations on this scope.
    #[arg(long)]
    pub scope: Option<String>,
    /// Only operations of this client session.
    #[arg(long)]
    pub session: Option<String>,
    /// Only operations with this intent name.
    #[arg(long)]
    pub intent: Option<String>,
    /// Only operations submitted at or after this time (RFC 3339 with `Z` or an offset:
    /// `2026-11-30T14:00:00Z`, `2026-11-30T16:00:00+02:00`; a date, `2026-11-30`, is
    /// midnight UTC) or this long ago (`15min`, `2h`, `3days`).
    #[arg(long, value_name = "TIME")]
    pub since: Option<TimeArg>,
    /// Only operations submitted before this time (same forms as --since).
    #[arg(long, value_name = "TIME")]
    pub until: Option<TimeArg>,
    /// The order of the rows.
    #[arg(long, value_enum, default_value_t = SortArg::Submitted)]
    pub sort: SortArg,
    /// Show at most N operations: the last N in the chosen order.
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
}

#[derive(Args, Debug)]
pub(crate) struct ShowArgs {
    /// The journal file (usually `*.opj`), or with `--postgres` the journal's name.
    pub file: PathBuf,
    /// Read the journal NAME in the PostgreSQL database at URL
    /// (`postgresql://user@host:5432/db`) instead of a file. Nothing is created or written
    /// there; the clocks are applied at the server's time.
    #[arg(long, value_name = "URL")]
    pub postgres: Option<String>,
    /// The operation id.
    pub id: String,
    /// Print the whole result payload instead of a preview.
    #[arg(long)]
    pub full: bool,
}

/// Event kinds, as named on the command line.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub(crate) enum KindArg {
    Submitted,
    LeaseExtended,
    Completed,
    Released,
    LeaseExpired,
    Resolved,
    Delivered,
    Acknowledged,
    AckExpired,
    Exhausted,
    Retired,
    Salvaged,
    RevisionAdvanced,
    FormatUpgraded,
    ResultLost,
}

#[derive(Args, Debug)]
pub(crate) struct LogArgs {
    /// The journal file (usually `*.opj`), or with `--postgres` the journal's name.
    pub file: PathBuf,
    /// Read the journal NAME in the PostgreSQL database at URL
    /// (`postgresql://user@host:5432/db`) instead of a file. Nothing is created or written
    /// there; the clocks are applied at the server's time.
    #[arg(long, value_name = "URL")]
    pub postgres: Option<String>,
    /// Only events of this operation.
    #[arg(long, value_name = "ID")]
    pub op: Option<String>,
    /// Only events of these kinds (comma-separated or repeated).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub kind: Vec<KindArg>,
    /// Start at this sequence number.
    #[arg(long, value_name = "SEQ", default_value_t = 0)]
    pub from: u64,
    /// Only events recorded at or after this time (same forms as `ls --since`).
    #[arg(long, value_name = "TIME")]
    pub since: Option<TimeArg>,
    /// Show only the last N matching events (then follow, with --follow).
    #[arg(long, value_name = "N")]
    pub tail: Option<usize>,
    /// Keep running and print new events as they are committed (Ctrl-C to stop).
    #[arg(long, short = 'f')]
    pub follow: bool,
}

#[derive(Args, Debug)]
pub(crate) struct RepairArgs {
    /// The journal file (usually `*.opj`).
    pub file: PathBuf,
    /// Report what repair would do, working on a temporary copy; the file is not touched.
    /// Works while an editor has the journal open: it then repairs a consistent copy of
    /// the journal and its log.
    #[arg(long)]
    pub dry_run: bool,
    /// Do not write a backup copy (`FILE.<unix time>.bak`) before repairing.
    #[arg(long)]
    pub no_backup: bool,
}

#[derive(Args, Debug)]
pub(crate) struct CompactArgs {
    /// The journal file (usually `*.opj`).
    pub file: PathBuf,
    /// Also shrink the file (redb's compaction), reporting its size before
    /// and after.
    #[arg(long)]
    pub reclaim: bool,
}

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("outcome").required(true).args(["applied", "failed", "not_applied"])))]
pub(crate) struct ResolveArgs {
    /// The journal file (usually `*.opj`).
    pub file: PathBuf,
    /// The in-doubt operation's id.
    pub id: String,
    /// The effect happened and produced this scope revision.
    #[arg(long, value_name = "REV")]
    pub applied: Option<u64>,
    /// The operation failed, with this message for the client.
    #[arg(long, value_name = "MSG")]
    pub failed: Option<String>,
    /// The effect did not happen: the id becomes free, and a resubmission starts the next
    /// attempt.
    #[arg(long)]
    pub not_applied: bool,
    /// The result payload to record with --applied or --failed (text).
    #[arg(long, value_name = "TEXT", conflicts_with = "not_applied")]
    pub result: Option<String>,
}

/// What `export` writes.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum OnlyArg {
    Receipts,
    Events,
}

#[derive(Args, Debug)]
pub(crate) struct ExportArgs {
    /// The journal file (usually `*.opj`), or with `--postgres` the journal's name.
    pub file: PathBuf,
    /// Read the journal NAME in the PostgreSQL database at URL
    /// (`postgresql://user@host:5432/db`) instead of a file. Nothing is created or written
    /// there; the clocks are applied at the server's time.
    #[arg(long, value_name = "URL")]
    pub postgres: Option<String>,
    /// Export only receipts, or only events.
    #[arg(long, value_enum)]
    pub only: Option<OnlyArg>,
    /// Also export each stored result payload (a `result` line after its receipt).
    #[arg(long)]
    pub results: bool,
    /// Write a complete dump instead, which `opjournal import` loads: a `dump` header (dump
    /// and format versions, clock high-water mark, next sequence number), every event, every
    /// stored result (exact content), a `dump_end` line, then the summary.
    #[arg(long, conflicts_with_all = ["only", "results"])]
    pub dump: bool,
}

#[derive(Args, Debug)]
pub(crate) struct BackupArgs {
    /// The journal to copy (usually `*.opj`).
    pub file: PathBuf,
    /// The new journal file to write (must not exist).
    pub dest: PathBuf,
}

#[derive(Args, Debug)]
pub(crate) struct ImportArgs {
    /// The dump (`opjournal export --dump`), or `-` for stdin.
    pub dump: PathBuf,
    /// The new journal file to write (must not exist).
    pub dest: PathBuf,
}

pub(crate) fn main() -> ExitCode {
    let parsed = command()
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m));
    let cli = match parsed {
        Ok(cli) => cli,
        // No command at all: one usage error and a hint, as ripgrep does, rather than the
        // whole help on stderr.
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = command()
                .error(
                    clap::error::ErrorKind::MissingSubcommand,
                    "no command given: name one, such as `opjournal stats FILE` \
                     (`opjournal --help` lists them all)",
                )
                .print();
            return ExitCode::from(2);
        }
        Err(e) => {
            // Help and version go to stdout and exit 0; usage errors go to stderr, exit 2.
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    if cli.local {
        format::use_local_time();
    }
    match cli.command {
        Command::Completions { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut command(), "opjournal", &mut out);
            return print_generated(&out);
        }
        Command::Man => {
            let mut out = Vec::new();
            if let Err(e) = clap_mangen::Man::new(command()).render(&mut out) {
                failure::CliError::new(format!("could not render the manual page: {e}")).print();
                return ExitCode::from(2);
            }
            return print_generated(&out);
        }
        Command::Demo { journal, keep } => {
            return demo::run(&demo::DemoArgs {
                journal,
                keep,
                json: cli.json,
            });
        }
        Command::Serve {
            journal,
            postgres,
            mcp,
            port,
            fault_hold,
            max_connections,
            idle_timeout,
        } => {
            let args = serve::ServeArgs {
                journal,
                postgres,
                port,
                max_connections,
                idle_timeout,
                json: cli.json,
                fault_hold,
            };
            return if mcp {
                serve::run_mcp(&args)
            } else {
                serve::run(&args)
            };
        }
        _ => {}
    }
    commands::run(cli)
}

/// Writes generated text (completions, the manual page) to stdout; a closed pipe is quiet.
fn print_generated(bytes: &[u8]) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            failure::CliError::new(format!("could not write to stdout: {e}")).print();
            ExitCode::from(2)
        }
    }
}
