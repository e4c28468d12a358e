//! The CLI's command tree (clap derive).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub(crate) mod demo;

/// Inspect, verify, repair and compact opjournal journal files.
#[derive(Parser, Debug)]
#[command(name = "opjournal", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a realistic editor session over a loopback socket, with forced disconnects at
    /// every boundary, and leave a journal to inspect.
    Demo {
        /// Where to write the journal (default: a new file in the temp directory).
        #[arg(long)]
        journal: Option<PathBuf>,
        /// Keep the journal file (always kept when --journal is given).
        #[arg(long)]
        keep: bool,
    },
}

pub(crate) fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Demo { journal, keep } => demo::run(&demo::DemoArgs { journal, keep }),
    }
}
