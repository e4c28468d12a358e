//! `opjournal serve`: the reference editor service (`opjournal::service`) on its own, for
//! clients in any language and for tests that need it as a process.
//!
//! The first line on stdout says where it listens, once it is ready to accept:
//! `listening on 127.0.0.1:PORT` (with `--json`:
//! `{"type":"listening","data":{"addr":"127.0.0.1:PORT","journal":...,"document":...}}`).
//! Notes go to stderr. It runs until stopped by a signal: every outcome it answered is
//! durable, and what a kill can lose (recent delivery counts and acknowledgements) only
//! causes recognizable redeliveries (docs/protocol.md, "What survives a crash").

use std::io::Write as _;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use opjournal::Journal;
use opjournal::service::{JournalOpener, Service, ServiceConfig, chain};

/// Arguments of `opjournal serve`.
#[derive(Debug, Clone)]
pub(crate) struct ServeArgs {
    pub journal: PathBuf,
    pub port: u16,
    pub max_connections: usize,
    pub idle_timeout: Duration,
    pub json: bool,
}

/// How often the service's housekeeping runs (expiries, retention, lazy writes).
const COMPACT_EVERY: Duration = Duration::from_secs(60);

pub(crate) fn run(args: &ServeArgs) -> ExitCode {
    let path = args.journal.clone();
    let open: JournalOpener = Box::new(move || Journal::open(&path));
    let document = args.journal.with_extension("scene.json");
    let mut cfg = ServiceConfig::new(document.clone());
    cfg.max_connections = args.max_connections;
    cfg.idle_timeout = args.idle_timeout;
    cfg.notes = Box::new(|note| eprintln!("editor: {note}"));
    let listener = match TcpListener::bind(("127.0.0.1", args.port)) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: could not listen on 127.0.0.1:{}: {e}", args.port);
            return ExitCode::from(2);
        }
    };
    let service = match Service::start(listener, open, cfg) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {}", chain(&e));
            return ExitCode::from(2);
        }
    };
    let _compactor = match service.journal() {
        Ok(j) => Some(j.spawn_compactor(COMPACT_EVERY)),
        Err(_) => None,
    };
    let addr = service.addr();
    let line = if args.json {
        serde_json::json!({
            "type": "listening",
            "data": {"addr": addr.to_string(), "journal": args.journal, "document": document},
        })
        .to_string()
    } else {
        format!("listening on {addr}")
    };
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
        // Nobody reads stdout: serve anyway.
    }
    drop(out);
    loop {
        std::thread::park();
    }
}
