//! An editor service that embeds opjournal: the model for integrators.
//!
//! The service is the library's reference editor service, `opjournal::service` (the
//! `service` feature), the same one `opjournal demo` and `opjournal serve` run: read
//! `src/service/server.rs` for every journal call, commented; `src/service/protocol.rs` and
//! `docs/protocol.md` for the wire format; `src/service/document.rs` for the editor's
//! document. This file shows the wiring: open the journal, start the service, run
//! housekeeping, stop cleanly.
//!
//! ```text
//! cargo run --example editor -- [--journal PATH] [--port N]
//! ```
//!
//! then, from another terminal (the port is printed at start):
//!
//! ```text
//! { echo '{"type":"hello","session":"tab-1"}'
//!   echo '{"type":"submit","id":"op_7f3","base_revision":0,"edit":{"kind":"add","object":"light","beside":"door"}}'
//!   sleep 1; } | nc 127.0.0.1 PORT
//! ```
//!
//! Send the same `submit` again: the answer is the recorded result, marked
//! `"replayed":true`, and the light is not added twice. Press Enter (or close stdin) to stop.

use std::net::TcpListener;
use std::path::PathBuf;
use std::time::Duration;

use opjournal::service::{JournalOpener, Service, ServiceConfig};
use opjournal::{Journal, RetryPolicy};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (journal_path, port) = parse_args()?;
    // The editor's own state lives beside the journal: one journal file per project.
    let document = journal_path.with_extension("scene.json");

    // 1. How to open the journal. The service calls this at start: the same settings every
    //    time, since deadlines are computed from them. The retry budget decides how often a
    //    reconnect pushes an unacknowledged result again (the journal says when it is spent).
    let path = journal_path.clone();
    let open: JournalOpener = Box::new(move || {
        Journal::builder()
            .ack_timeout(Duration::from_secs(15 * 60))
            .retry_policy(RetryPolicy::default())
            .open(&path)
    });

    // 2. Start. Before serving, the service loads the document, opens the journal, and
    //    resolves every operation a crash left in doubt by checking whether its edit is in
    //    the document. Nothing is ever re-run on its own.
    let mut cfg = ServiceConfig::new(document);
    cfg.max_connections = 64;
    cfg.notes = Box::new(|note| eprintln!("editor: {note}"));
    let service = Service::start(TcpListener::bind(("127.0.0.1", port))?, open, cfg)?;

    // 3. Housekeeping: expire acknowledgements, retire old results, purge old audit
    //    records, commit lazy writes. (Reads apply the clocks anyway; this keeps the file
    //    small.)
    let compactor = service.journal()?.spawn_compactor(Duration::from_secs(60));

    println!(
        "editor listening on {}, journal {}",
        service.addr(),
        journal_path.display()
    );
    println!("press Enter to stop");
    let _ = std::io::stdin().read_line(&mut String::new());

    // Stop the compactor first: it holds the journal while it runs.
    drop(compactor);
    service.shutdown()?;
    Ok(())
}

fn parse_args() -> Result<(PathBuf, u16), Box<dyn std::error::Error>> {
    let mut journal = None;
    let mut port = 0;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--journal" => journal = args.next().map(PathBuf::from),
            "--port" => port = args.next().ok_or("--port needs a number")?.parse()?,
            other => {
                return Err(
                    format!("unknown argument `{other}`; try --journal PATH --port N").into(),
                );
            }
        }
    }
    let journal = match journal {
        Some(p) => p,
        None => tempfile::Builder::new()
            .prefix("opjournal-editor-")
            .tempdir()?
            .keep()
            .join("editor.opj"),
    };
    Ok((journal, port))
}
