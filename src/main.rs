//! The `opjournal` command-line tool: inspect, verify, repair and compact journal files.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
