//! `opjournal serve`: the reference editor service (`opjournal::service`) on its own, for
//! clients in any language and for tests that need it as a process.
//!
//! The first line on stdout says where it listens, once it is ready to accept:
//! `listening on 127.0.0.1:PORT` (with `--json`:
//! `{"type":"listening","data":{"addr":"127.0.0.1:PORT","journal":...,"document":...}}`).
//! Notes go to stderr. It runs until stopped by a signal: every outcome it answered is
//! durable, and what a kill can lose (recent delivery counts and acknowledgements) only
//! causes recognizable redeliveries (docs/protocol.md, "What survives a crash"). SIGINT
//! (Ctrl-C) and SIGTERM stop it cleanly, losing nothing: it stops accepting, writes the
//! document's snapshot, commits the pending deliveries and acknowledgements, closes the
//! journal, and exits 0.
//!
//! `opjournal serve --postgres URL` keeps the journal and the document in that database
//! (`--journal` names them, `editor` by default): several such processes on one database
//! serve one document, and a client's retry may land on any of them (docs/postgres.md).
//!
//! `opjournal serve --mcp` serves the same document as MCP tools (`opjournal::mcp::editor`,
//! docs/mcp.md): over stdio (stdout is the protocol; nothing else is written there), or
//! with `--port` over Streamable HTTP, announcing `listening on http://127.0.0.1:PORT/mcp`.

use std::io::Write as _;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use opjournal::Journal;
use opjournal::service::{JournalOpener, Pauses, Service, ServiceConfig, Stage, chain};

/// Arguments of `opjournal serve`.
#[derive(Debug, Clone)]
pub(crate) struct ServeArgs {
    /// The journal file; with `postgres`, the journal's name.
    pub journal: Option<PathBuf>,
    /// The database of the journal and the document.
    pub postgres: Option<String>,
    pub port: Option<u16>,
    pub max_connections: usize,
    pub idle_timeout: Duration,
    pub json: bool,
    /// Fault injection (`--fault-hold`, hidden): hold the first operation at this step.
    pub fault_hold: Option<String>,
}

/// How often the service's housekeeping runs (expiries, retention, lazy writes).
const COMPACT_EVERY: Duration = Duration::from_secs(60);

/// The journal's (and the document's) name in the database without `--journal`.
const DEFAULT_NAME: &str = "editor";

/// The step `--fault-hold` names, or the exit code after saying why it names none.
fn hold_stage(args: &ServeArgs) -> Result<Option<Stage>, ExitCode> {
    match args.fault_hold.as_deref() {
        None => Ok(None),
        Some("accepted") => Ok(Some(Stage::Accepted)),
        Some("mutated") => Ok(Some(Stage::Mutated)),
        Some("committed") => Ok(Some(Stage::Committed)),
        Some(other) => {
            eprintln!(
                "error: `--fault-hold {other}` names no step; use `accepted`, `mutated` or `committed`"
            );
            Err(ExitCode::from(2))
        }
    }
}

/// The journal file, which every mode but `--postgres` needs.
fn journal_file(args: &ServeArgs) -> Result<PathBuf, ExitCode> {
    args.journal.clone().ok_or_else(|| {
        eprintln!("error: `opjournal serve` needs `--journal FILE` (or `--postgres URL`)");
        ExitCode::from(2)
    })
}

/// Arms `--fault-hold` at `stage` and says on stderr when the operation is held, for the tests that
/// kill the process there.
fn arm_hold<T: Send + 'static>(owner: T, pauses: fn(&T) -> &Pauses, stage: Stage) {
    pauses(&owner).arm(stage);
    let _ = std::thread::Builder::new()
        .name("fault-hold".into())
        .spawn(move || {
            if let Ok(id) = pauses(&owner).wait_held(Duration::from_secs(24 * 3600)) {
                eprintln!("editor: `{id}` is held at {stage:?} (fault injection)");
            }
        });
}

pub(crate) fn run(args: &ServeArgs) -> ExitCode {
    let hold = match hold_stage(args) {
        Ok(hold) => hold,
        Err(code) => return code,
    };
    let (open, mut cfg, journal, document): (JournalOpener, _, String, String) =
        match &args.postgres {
            Some(url) => {
                let name = args
                    .journal
                    .as_ref()
                    .map_or_else(|| DEFAULT_NAME.to_string(), |p| p.display().to_string());
                let cfg = ServiceConfig::in_database(url, &name);
                let (url, journal) = (url.clone(), name.clone());
                let open: JournalOpener =
                    Box::new(move || Journal::builder().open_postgres(&url, &journal));
                (open, cfg, name.clone(), format!("postgres:{name}"))
            }
            None => {
                let path = match journal_file(args) {
                    Ok(p) => p,
                    Err(code) => return code,
                };
                let document = path.with_extension("scene.json");
                let cfg = ServiceConfig::new(document.clone());
                let label = path.display().to_string();
                let open: JournalOpener = Box::new(move || Journal::open(&path));
                (open, cfg, label, document.display().to_string())
            }
        };
    cfg.max_connections = args.max_connections;
    cfg.idle_timeout = args.idle_timeout;
    cfg.notes = Box::new(|note| eprintln!("editor: {note}"));
    let port = args.port.unwrap_or(0);
    let listener = match TcpListener::bind(("127.0.0.1", port)) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: could not listen on 127.0.0.1:{port}: {e}");
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
    let compactor = match service.journal() {
        Ok(j) => Some(j.spawn_compactor(COMPACT_EVERY)),
        Err(_) => None,
    };
    let service = std::sync::Arc::new(service);
    if let Some(stage) = hold {
        arm_hold(service.clone(), |s| s.pauses(), stage);
    }
    let addr = service.addr();
    let line = if args.json {
        serde_json::json!({
            "type": "listening",
            "data": {"addr": addr.to_string(), "journal": journal, "document": document},
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
    let signal = match wait_for_stop_signal() {
        Ok(signal) => signal,
        Err(e) => {
            // Without signal handling, serve as before: until killed.
            eprintln!("editor: cannot watch for SIGINT and SIGTERM ({e}); serving until killed");
            loop {
                std::thread::park();
            }
        }
    };
    drop(compactor);
    let Ok(service) = std::sync::Arc::try_unwrap(service) else {
        // `--fault-hold` keeps a handle for its thread: a test's process, stopped as killed.
        eprintln!("editor: stopped by {signal} with a fault hold armed: not shut down");
        return ExitCode::SUCCESS;
    };
    match service.shutdown() {
        Ok(()) => {
            eprintln!("editor: stopped by {signal}; document saved, journal closed");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: stopping after {signal}: {}", chain(&e));
            ExitCode::from(2)
        }
    }
}

/// Blocks until SIGINT or SIGTERM arrives; answers its name.
///
/// # Errors
///
/// When the signal handlers cannot be installed.
fn wait_for_stop_signal() -> std::io::Result<&'static str> {
    tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()?
        .block_on(stop_signal())
}

/// Waits for SIGINT or SIGTERM; answers its name.
///
/// # Errors
///
/// When the signal handlers cannot be installed.
async fn stop_signal() -> std::io::Result<&'static str> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = interrupt.recv() => Ok("SIGINT"),
        _ = terminate.recv() => Ok("SIGTERM"),
    }
}

/// `opjournal serve --mcp`: the editor as MCP tools, over stdio or (with `--port`) over
/// Streamable HTTP. Over stdio it ends when the host closes stdin (writing a snapshot of the
/// document); over HTTP it runs until SIGINT or SIGTERM, then writes the snapshot and closes
/// the journal.
pub(crate) fn run_mcp(args: &ServeArgs) -> ExitCode {
    use opjournal::mcp::editor::{EditorConfig, SceneEditor, serve_http, serve_stdio};
    let hold = match hold_stage(args) {
        Ok(hold) => hold,
        Err(code) => return code,
    };
    let path = match journal_file(args) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let journal = match Journal::open(&path) {
        Ok(j) => j,
        Err(e) => {
            eprintln!("error: could not open the journal: {}", chain(&e));
            return ExitCode::from(2);
        }
    };
    let document = path.with_extension("scene.json");
    let mut cfg = EditorConfig::new(document.clone());
    cfg.notes = Box::new(|note| eprintln!("editor: {note}"));
    let editor = match SceneEditor::open(journal.clone(), cfg) {
        Ok((editor, _settled)) => editor,
        Err(e) => {
            eprintln!("error: {}", chain(&e));
            return ExitCode::from(2);
        }
    };
    let _compactor = journal.spawn_compactor(COMPACT_EVERY);
    drop(journal);
    if let Some(stage) = hold {
        arm_hold(editor.clone(), |e| e.pauses(), stage);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: could not start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let served = runtime.block_on(async {
        let Some(port) = args.port else {
            let served = serve_stdio(editor.clone()).await;
            return served.and_then(|()| editor.snapshot());
        };
        let listener = match tokio::net::TcpListener::bind(("127.0.0.1", port)).await {
            Ok(l) => l,
            Err(source) => {
                return Err(opjournal::service::ServiceError::Io {
                    what: format!("listen on 127.0.0.1:{port}"),
                    source,
                });
            }
        };
        let server = serve_http(editor.clone(), listener)?;
        let line = if args.json {
            serde_json::json!({
                "type": "listening",
                // As text: a path that is not UTF-8 has no JSON string (serializing it fails).
                "data": {
                    "url": server.url(),
                    "journal": path.display().to_string(),
                    "document": document.display().to_string(),
                },
            })
            .to_string()
        } else {
            format!("listening on {}", server.url())
        };
        let mut out = std::io::stdout().lock();
        if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
            // Nobody reads stdout: serve anyway.
        }
        drop(out);
        match stop_signal().await {
            Ok(signal) => {
                eprintln!("editor: stopped by {signal}; saving the document, closing the journal");
            }
            Err(e) => {
                eprintln!(
                    "editor: cannot watch for SIGINT and SIGTERM ({e}); serving until killed"
                );
                std::future::pending::<()>().await;
            }
        }
        drop(server);
        editor.snapshot()
    });
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", chain(&e));
            ExitCode::from(2)
        }
    }
}
