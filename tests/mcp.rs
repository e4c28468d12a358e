//! MCP (issue 24), tested against clients nobody here wrote: the official Python SDK (`mcp`
//! on PyPI, pinned in tests/mcp/requirements.txt, driven by tests/mcp/driver.py) over
//! Streamable HTTP, in both protocol revisions it lets a client pin (2025-11-25 with the
//! `initialize` handshake and sessions, 2026-07-28 without), and rmcp's own client over
//! stdio.
//!
//! The failure window of DESIGN.md §5 is forced at each boundary by a TCP proxy between the
//! client and the server, which cuts every connection and refuses new ones until the test
//! restores it; the editor holds the operation at an exact step ([`Pauses`]) meanwhile. The
//! call is then re-issued, as the protocol says a client must after a broken stream: the
//! edit lands once in the document, and the second answer is the recorded result, marked
//! as a replay. The kill -9 tests run `opjournal serve --mcp` as a process.
//!
//! The Python tests need the SDK: `.ci/run` installs it (`python3 -m venv target/mcp-venv`,
//! then `pip install -r tests/mcp/requirements.txt`) and runs the tests with
//! `OPJOURNAL_MCP_PYTHON` naming it, so that there a missing SDK fails the suite. Elsewhere
//! they use that venv if it exists, and are skipped with a note if not.
//!
//! `journaled` (tests/mcp/journaled.rs) tests `opjournal::mcp::Journaled` on its own, with
//! rmcp's client; it is a module of this test binary rather than a binary of its own, which
//! would link rmcp and tokio once more.
#![cfg(all(feature = "cli", feature = "mcp"))]

#[path = "mcp/journaled.rs"]
mod journaled;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opjournal::mcp::JournalEventStore;
use opjournal::mcp::editor::{EditorConfig, HttpServer, SceneEditor, serve_http_with};
use opjournal::service::{Stage, Verdict};
use opjournal::{DeliveryState, ExecutionStatus, Journal, ManualClock, Timestamp};
use rmcp::transport::streamable_http_server::StreamableHttpServerConfig;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use serde_json::{Value, json};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const WAIT: Duration = Duration::from_secs(30);
/// The SDK version the suite was written against (tests/mcp/requirements.txt pins it).
const PINNED_SDK: &str = "2.3.0";
/// The two revisions the SDK lets a client pin: its `mode` values.
const LEGACY: &str = "legacy";
const MODERN: &str = "2026-07-28";

// ---------------------------------------------------------------------------------------
// The Python SDK, driven line by line.
// ---------------------------------------------------------------------------------------

/// The Python with the SDK installed: the one `OPJOURNAL_MCP_PYTHON` names (it must exist:
/// `.ci/run` names it, so there the suite fails rather than skips), else the venv under
/// target/ if there is one, else `None`: the test is skipped with a note.
fn python() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("OPJOURNAL_MCP_PYTHON") {
        let p = PathBuf::from(p);
        assert!(
            p.exists(),
            "OPJOURNAL_MCP_PYTHON names {p:?}, which does not exist"
        );
        return Some(p);
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/mcp-venv/bin/python");
    if venv.exists() {
        return Some(venv);
    }
    eprintln!(
        "skipped: no MCP Python SDK (python3 -m venv target/mcp-venv && target/mcp-venv/bin/pip install -r tests/mcp/requirements.txt)"
    );
    None
}

/// tests/mcp/driver.py in a child process.
struct Driver {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<Value>,
    early: HashMap<String, Value>,
    next: usize,
}

impl Driver {
    fn start(python: &Path) -> Result<Driver, Box<dyn std::error::Error>> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/driver.py");
        let mut child = Command::new(python)
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                match serde_json::from_str::<Value>(&line) {
                    Ok(v) => {
                        if tx.send(v).is_err() {
                            break;
                        }
                    }
                    Err(_) => eprintln!("driver: {line}"),
                }
            }
        });
        let mut driver = Driver {
            child,
            stdin,
            lines,
            early: HashMap::new(),
            next: 0,
        };
        let ready = driver.answer("ready")?;
        assert_eq!(ready["mcp"], PINNED_SDK, "the SDK under test: {ready}");
        Ok(driver)
    }

    /// Sends a command; returns its tag.
    fn send(&mut self, mut cmd: Value) -> Result<String, Box<dyn std::error::Error>> {
        self.next += 1;
        let tag = format!("t{}", self.next);
        cmd["tag"] = json!(tag);
        writeln!(self.stdin, "{cmd}")?;
        self.stdin.flush()?;
        Ok(tag)
    }

    /// The answer to the command tagged `tag`.
    fn answer(&mut self, tag: &str) -> Result<Value, Box<dyn std::error::Error>> {
        if let Some(v) = self.early.remove(tag) {
            return Ok(v);
        }
        let deadline = Instant::now() + WAIT + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(v) if v["tag"] == tag => return Ok(v),
                Ok(v) => {
                    let t = v["tag"].as_str().unwrap_or_default().to_string();
                    self.early.insert(t, v);
                }
                Err(RecvTimeoutError::Timeout) => {
                    return Err(format!("no answer to `{tag}` in time").into());
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(format!("the driver ended before answering `{tag}`").into());
                }
            }
        }
    }

    /// One `tools/call` on a client of its own (a new connection).
    fn call(
        &mut self,
        url: &str,
        mode: &str,
        tool: &str,
        args: Value,
    ) -> Result<String, Box<dyn std::error::Error>> {
        self.send(json!({"op": "call", "url": url, "mode": mode, "tool": tool, "args": args, "timeout": 20}))
    }

    fn call_now(
        &mut self,
        url: &str,
        mode: &str,
        tool: &str,
        args: Value,
    ) -> Result<Value, Box<dyn std::error::Error>> {
        let tag = self.call(url, mode, tool, args)?;
        self.answer(&tag)
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------
// The editor in this process, and a proxy that cuts connections.
// ---------------------------------------------------------------------------------------

struct Editor {
    runtime: tokio::runtime::Runtime,
    editor: SceneEditor,
    sessions: Arc<LocalSessionManager>,
    events: Arc<JournalEventStore>,
    server: Option<HttpServer>,
    clock: ManualClock,
    _dir: tempfile::TempDir,
}

impl Editor {
    fn start() -> Result<Editor, Box<dyn std::error::Error>> {
        Editor::start_with(|b| b)
    }

    fn start_with(
        tune: impl FnOnce(opjournal::JournalBuilder) -> opjournal::JournalBuilder,
    ) -> Result<Editor, Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let clock = ManualClock::new(Timestamp::from_millis(1_800_000_000_000));
        let journal =
            tune(Journal::builder().clock(clock.clone())).open(dir.path().join("p.opj"))?;
        let (editor, _) =
            SceneEditor::open(journal, EditorConfig::new(dir.path().join("p.scene.json")))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let served = editor.clone();
        // As `serve_http` does: streams resumable through the journal-backed store.
        let events = Arc::new(JournalEventStore::new(editor.journaled().clone()));
        let sessions = Arc::new(LocalSessionManager::default().with_event_store(events.clone()));
        let manager = sessions.clone();
        let server = runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
            // A client may resume a broken stream after the retry interval: short here, so a
            // refused resumption fails the call quickly.
            let config = StreamableHttpServerConfig::default()
                .with_sse_retry(Some(Duration::from_millis(100)))
                .with_sse_keep_alive(None);
            Ok::<_, Box<dyn std::error::Error>>(serve_http_with(served, listener, config, manager)?)
        })?;
        Ok(Editor {
            runtime,
            editor,
            sessions,
            events,
            server: Some(server),
            clock,
            _dir: dir,
        })
    }

    fn addr(&self) -> SocketAddr {
        self.server
            .as_ref()
            .map_or_else(|| ([127, 0, 0, 1], 0).into(), HttpServer::addr)
    }

    fn url(&self) -> String {
        format!("http://{}/mcp", self.addr())
    }

    fn journal(&self) -> &Journal {
        self.editor.journaled().journal()
    }

    /// MCP sessions the server holds now.
    fn sessions(&self) -> usize {
        self.runtime
            .block_on(async { self.sessions.sessions.read().await.len() })
    }

    fn times_applied(&self, op: &str) -> usize {
        self.editor.document().times_applied(op)
    }

    /// Waits until nothing executes (a released operation finished and recorded).
    fn wait_idle(&self) -> TestResult {
        let deadline = Instant::now() + WAIT;
        while self.editor.journaled().running() > 0 {
            if Instant::now() > deadline {
                return Err("an operation is still running".into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }
}

impl Drop for Editor {
    fn drop(&mut self) {
        self.editor.pauses().release(Verdict::Continue);
        if let Some(server) = self.server.take() {
            self.runtime.block_on(server.shutdown());
        }
    }
}

/// A TCP proxy in front of `upstream`: passes bytes both ways until cut.
struct Proxy {
    addr: SocketAddr,
    refusing: Arc<AtomicBool>,
    live: Arc<Mutex<Vec<TcpStream>>>,
    accepted: Arc<AtomicUsize>,
}

impl Proxy {
    fn start(upstream: SocketAddr) -> Result<Proxy, Box<dyn std::error::Error>> {
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        let addr = listener.local_addr()?;
        let refusing = Arc::new(AtomicBool::new(false));
        let live: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let accepted = Arc::new(AtomicUsize::new(0));
        let (r, l, a) = (refusing.clone(), live.clone(), accepted.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                a.fetch_add(1, Ordering::SeqCst);
                if r.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(upstream) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                if let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) {
                    let mut live = l.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    live.retain(|s| s.peer_addr().is_ok());
                    live.push(c2);
                    live.push(s2);
                }
                pipe(client.try_clone(), server.try_clone());
                pipe(server.try_clone(), client.try_clone());
            }
        });
        Ok(Proxy {
            addr,
            refusing,
            live,
            accepted,
        })
    }

    fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    /// Cuts every connection and refuses new ones until [`Proxy::restore`].
    fn cut(&self) {
        self.refusing.store(true, Ordering::SeqCst);
        let live = std::mem::take(
            &mut *self
                .live
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for s in live {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Refuses new connections (those open go on).
    fn refuse(&self) {
        self.refusing.store(true, Ordering::SeqCst);
    }

    fn restore(&self) {
        self.refusing.store(false, Ordering::SeqCst);
    }
}

fn pipe(from: std::io::Result<TcpStream>, to: std::io::Result<TcpStream>) {
    let (Ok(mut from), Ok(mut to)) = (from, to) else {
        return;
    };
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}

// ---------------------------------------------------------------------------------------
// Reading answers.
// ---------------------------------------------------------------------------------------

fn result(answer: &Value) -> Result<&Value, Box<dyn std::error::Error>> {
    if answer["ok"] != true {
        return Err(format!("the call failed: {answer}").into());
    }
    Ok(&answer["result"])
}

fn meta<'a>(result: &'a Value, key: &str) -> &'a Value {
    &result["_meta"][format!("dev.opjournal/{key}")]
}

fn text(result: &Value) -> String {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn add(id: &str, object: &str) -> Value {
    json!({"operation_id": id, "object": object, "beside": "door"})
}

/// Holds the next operation at `stage`, sends the call through the proxy, waits until it is
/// held, cuts the connection, and checks that the client's call failed.
fn call_and_cut_at(
    ed: &Editor,
    proxy: &Proxy,
    py: &mut Driver,
    mode: &str,
    id: &str,
    object: &str,
    stage: Stage,
) -> TestResult {
    ed.editor.pauses().arm(stage);
    let tag = py.call(&proxy.url(), mode, "scene.add", add(id, object))?;
    let held = ed.editor.pauses().wait_held(WAIT)?;
    assert_eq!(held, id);
    proxy.cut();
    let first = py.answer(&tag)?;
    assert_eq!(
        first["ok"], false,
        "the cut call cannot have answered: {first}"
    );
    Ok(())
}

fn reissue_is_a_replay_of_one_edit(
    ed: &Editor,
    proxy: &Proxy,
    py: &mut Driver,
    mode: &str,
    id: &str,
    object: &str,
) -> TestResult {
    proxy.restore();
    let again = py.call_now(&proxy.url(), mode, "scene.add", add(id, object))?;
    let r = result(&again)?;
    assert_eq!(r["isError"], false, "{r}");
    assert_eq!(
        meta(r, "replayed"),
        true,
        "the re-issued call is a replay: {r}"
    );
    assert_eq!(meta(r, "status"), "applied");
    assert!(meta(r, "delivery").as_u64() >= Some(2), "{r}");
    assert!(text(r).contains(object), "{r}");
    assert_eq!(ed.times_applied(id), 1, "the edit landed once");
    assert_eq!(
        ed.editor.document().objects().get(object),
        Some(&Some("door".to_string()))
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Tests.
// ---------------------------------------------------------------------------------------

#[test]
fn the_python_sdk_lists_the_tools_with_a_required_operation_id_in_both_revisions() -> TestResult {
    let Some(python) = python() else {
        return Ok(());
    };
    let ed = Editor::start()?;
    let mut py = Driver::start(&python)?;
    for (mode, protocol) in [(LEGACY, "2025-11-25"), (MODERN, "2026-07-28")] {
        let tag = py.send(json!({"op": "list", "url": ed.url(), "mode": mode}))?;
        let listed = py.answer(&tag)?;
        assert_eq!(listed["ok"], true, "{listed}");
        assert_eq!(listed["protocol"], protocol, "{listed}");
        let tools = listed["tools"].as_array().ok_or("no tools")?;
        let names: Vec<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
        assert_eq!(names.len(), 4, "{names:?}");
        for tool in tools {
            let required = &tool["inputSchema"]["required"];
            let needs_id = required
                .as_array()
                .is_some_and(|r| r.iter().any(|x| x == "operation_id"));
            assert_eq!(needs_id, tool["name"] != "scene.read", "{tool}");
            if needs_id {
                let described = tool["inputSchema"]["properties"]["operation_id"]["description"]
                    .as_str()
                    .unwrap_or_default();
                assert!(described.contains("Reuse the SAME id"), "{described}");
            }
        }
    }
    Ok(())
}

/// What a desktop MCP host does: launch `opjournal serve --mcp` and speak over its stdin and
/// stdout. The SDK's stdio client initializes (or, at 2026-07-28, goes straight to the
/// calls), lists the tools, calls one, and calls it again: a replay.
#[test]
fn the_python_sdk_launches_serve_mcp_over_stdio_and_gets_a_replay_in_both_revisions() -> TestResult
{
    let Some(python) = python() else {
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let journal = dir.path().join("p.opj");
    let journal = journal.to_str().ok_or("not UTF-8")?;
    let command = json!([
        env!("CARGO_BIN_EXE_opjournal"),
        "serve",
        "--mcp",
        "--journal",
        journal
    ]);
    let mut py = Driver::start(&python)?;
    for (mode, protocol) in [(LEGACY, "2025-11-25"), (MODERN, "2026-07-28")] {
        let tag = py.send(json!({"op": "list", "command": command, "mode": mode}))?;
        let listed = py.answer(&tag)?;
        assert_eq!(listed["protocol"], protocol, "{listed}");
        assert_eq!(
            listed["tools"].as_array().map(Vec::len),
            Some(4),
            "{listed}"
        );
        let id = format!("op_stdio_{mode}");
        let object = format!("lamp_{}", &mode[..4]);
        for replayed in [false, true] {
            let tag = py.send(json!({"op": "call", "command": command, "mode": mode,
                "tool": "scene.add", "args": add(&id, &object)}))?;
            let r = result(&py.answer(&tag)?)?.clone();
            assert_eq!(meta(&r, "replayed"), replayed, "{r}");
        }
    }
    assert_eq!(logged_edits(Path::new(journal), "op_stdio_legacy"), 1);
    assert_eq!(logged_edits(Path::new(journal), "op_stdio_2026-07-28"), 1);
    Ok(())
}

/// Boundary 1: the connection drops before the server accepts the call. Nothing is
/// recorded; the re-issued call is new work, and runs once.
fn cut_before_acceptance(mode: &str) -> TestResult {
    let Some(python) = python() else {
        return Ok(());
    };
    let ed = Editor::start()?;
    let proxy = Proxy::start(ed.addr())?;
    let mut py = Driver::start(&python)?;
    proxy.refuse();
    let first = py.call_now(&proxy.url(), mode, "scene.add", add("op_b1", "lamp"))?;
    assert_eq!(first["ok"], false, "{first}");
    assert!(
        ed.journal().lookup("op_b1")?.is_none(),
        "nothing was accepted"
    );
    assert_eq!(ed.times_applied("op_b1"), 0);
    proxy.restore();
    let again = py.call_now(&proxy.url(), mode, "scene.add", add("op_b1", "lamp"))?;
    let r = result(&again)?;
    assert_eq!(
        meta(r, "replayed"),
        false,
        "the first call never arrived: {r}"
    );
    assert_eq!(meta(r, "delivery"), 1);
    assert_eq!(ed.times_applied("op_b1"), 1);
    Ok(())
}

#[test]
fn a_call_cut_before_acceptance_runs_once_when_reissued_2025_11_25() -> TestResult {
    cut_before_acceptance(LEGACY)
}

#[test]
fn a_call_cut_before_acceptance_runs_once_when_reissued_2026_07_28() -> TestResult {
    cut_before_acceptance(MODERN)
}

/// Boundary 2: accepted, not yet executed. The client's connection is cut; the re-issued
/// call attaches to the running operation (it waits, applies nothing) and receives its
/// outcome once the edit is made.
fn cut_after_acceptance(mode: &str) -> TestResult {
    let Some(python) = python() else {
        return Ok(());
    };
    let ed = Editor::start()?;
    let proxy = Proxy::start(ed.addr())?;
    let mut py = Driver::start(&python)?;
    call_and_cut_at(&ed, &proxy, &mut py, mode, "op_b2", "lamp", Stage::Accepted)?;
    assert_eq!(
        ed.journal().lookup("op_b2")?.map(|r| r.status),
        Some(ExecutionStatus::Running)
    );
    proxy.restore();
    let tag = py.call(&proxy.url(), mode, "scene.add", add("op_b2", "lamp"))?;
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        ed.times_applied("op_b2"),
        0,
        "the attached call applied nothing"
    );
    ed.editor.pauses().release(Verdict::Continue);
    let r = result(&py.answer(&tag)?)?.clone();
    assert_eq!(meta(&r, "replayed"), true, "{r}");
    assert_eq!(meta(&r, "status"), "applied", "{r}");
    assert_eq!(ed.times_applied("op_b2"), 1);
    Ok(())
}

#[test]
fn a_reissued_call_attaches_to_the_operation_accepted_before_the_cut_2025_11_25() -> TestResult {
    cut_after_acceptance(LEGACY)
}

#[test]
fn a_reissued_call_attaches_to_the_operation_accepted_before_the_cut_2026_07_28() -> TestResult {
    cut_after_acceptance(MODERN)
}

/// Boundary 3: the edit is made (and, at `Committed`, recorded) but the result never
/// reaches the client. The handler goes on after the cut; the re-issued call is answered
/// with the recorded result.
fn cut_after_the_edit(mode: &str, stage: Stage) -> TestResult {
    let Some(python) = python() else {
        return Ok(());
    };
    let ed = Editor::start()?;
    let proxy = Proxy::start(ed.addr())?;
    let mut py = Driver::start(&python)?;
    call_and_cut_at(&ed, &proxy, &mut py, mode, "op_b3", "lamp", stage)?;
    ed.editor.pauses().release(Verdict::Continue);
    ed.wait_idle()?;
    let receipt = ed.journal().lookup("op_b3")?.ok_or("not recorded")?;
    assert_eq!(
        receipt.status,
        ExecutionStatus::Applied,
        "the detached handler recorded it"
    );
    reissue_is_a_replay_of_one_edit(&ed, &proxy, &mut py, mode, "op_b3", "lamp")
}

#[test]
fn a_result_cut_after_the_edit_was_saved_is_replayed_not_reapplied_2025_11_25() -> TestResult {
    cut_after_the_edit(LEGACY, Stage::Mutated)
}

#[test]
fn a_result_cut_after_the_edit_was_saved_is_replayed_not_reapplied_2026_07_28() -> TestResult {
    cut_after_the_edit(MODERN, Stage::Mutated)
}

#[test]
fn a_result_cut_after_the_outcome_committed_is_replayed_not_reapplied_2025_11_25() -> TestResult {
    cut_after_the_edit(LEGACY, Stage::Committed)
}

#[test]
fn a_result_cut_after_the_outcome_committed_is_replayed_not_reapplied_2026_07_28() -> TestResult {
    cut_after_the_edit(MODERN, Stage::Committed)
}

/// A stream that broke while the call ran is resumed by the SDK with `Last-Event-ID`
/// (2025-11-25 sessions): the journal-backed event store holds the resumed stream open
/// until the outcome is recorded, then sends the recorded result, marked as a replay. The
/// client never called again, and the edit landed once.
#[test]
fn a_stream_resumed_with_last_event_id_gets_the_recorded_result_2025_11_25() -> TestResult {
    let Some(python) = python() else {
        return Ok(());
    };
    let ed = Editor::start()?;
    let proxy = Proxy::start(ed.addr())?;
    let mut py = Driver::start(&python)?;
    ed.editor.pauses().arm(Stage::Committed);
    let tag = py.call(&proxy.url(), LEGACY, "scene.add", add("op_r", "lamp"))?;
    assert_eq!(ed.editor.pauses().wait_held(WAIT)?, "op_r");
    // The connection breaks; reconnecting works at once.
    let before = proxy.accepted.load(Ordering::SeqCst);
    proxy.cut();
    proxy.restore();
    std::thread::sleep(Duration::from_millis(500));
    ed.editor.pauses().release(Verdict::Continue);
    let r = result(&py.answer(&tag)?)?.clone();
    assert_eq!(
        meta(&r, "replayed"),
        true,
        "read back from the journal: {r}"
    );
    assert_eq!(meta(&r, "status"), "applied", "{r}");
    assert!(text(&r).contains("lamp"), "{r}");
    assert!(
        proxy.accepted.load(Ordering::SeqCst) > before,
        "the SDK reconnected to resume"
    );
    assert_eq!(ed.times_applied("op_r"), 1);
    Ok(())
}

/// Boundary 4: the result was delivered, then the client reloads before anything
/// acknowledged it. The duplicate answer is harmless and recognizable.
fn delivered_then_reloaded(mode: &str) -> TestResult {
    let Some(python) = python() else {
        return Ok(());
    };
    let ed = Editor::start()?;
    let proxy = Proxy::start(ed.addr())?;
    let mut py = Driver::start(&python)?;
    let first = py.call_now(&proxy.url(), mode, "scene.add", add("op_b4", "lamp"))?;
    let r = result(&first)?;
    assert_eq!(meta(r, "replayed"), false);
    assert_eq!(meta(r, "delivery"), 1);
    proxy.cut();
    let receipt = ed.journal().lookup("op_b4")?.ok_or("not recorded")?;
    assert_eq!(
        receipt.delivery,
        Some(DeliveryState::Delivered),
        "delivered, not acknowledged"
    );
    reissue_is_a_replay_of_one_edit(&ed, &proxy, &mut py, mode, "op_b4", "lamp")?;
    assert_eq!(
        ed.journal().lookup("op_b4")?.map(|r| r.delivery_count),
        Some(2)
    );
    Ok(())
}

#[test]
fn a_delivered_result_asked_again_after_a_reload_is_a_marked_replay_2025_11_25() -> TestResult {
    delivered_then_reloaded(LEGACY)
}

#[test]
fn a_delivered_result_asked_again_after_a_reload_is_a_marked_replay_2026_07_28() -> TestResult {
    delivered_then_reloaded(MODERN)
}

/// Boundary 5 and the acknowledgement: within one MCP session (2025-11-25), each call
/// acknowledges the results delivered to the session before it, so a session window of 2
/// never fills; results never followed by a call stay unacknowledged until the ack timeout
/// frees them, and their audit records stay.
#[test]
fn the_next_call_of_a_session_acknowledges_and_the_ack_timeout_frees_the_rest() -> TestResult {
    let Some(python) = python() else {
        return Ok(());
    };
    let ed = Editor::start_with(|b| b.session_window(2).ack_timeout(Duration::from_secs(900)))?;
    let mut py = Driver::start(&python)?;
    let open = py.send(json!({"op": "open", "session": "s", "url": ed.url(), "mode": LEGACY}))?;
    assert_eq!(py.answer(&open)?["ok"], true);
    for i in 0..5 {
        let tag = py.send(json!({"op": "call", "session": "s", "tool": "scene.add", "args": add(&format!("op_s{i}"), &format!("o{i}"))}))?;
        let r = result(&py.answer(&tag)?)?.clone();
        assert_eq!(
            meta(&r, "status"),
            "applied",
            "call {i} of a session with a window of 2: {r}"
        );
    }
    // The scene.read, a plain tool, acknowledges the last one too.
    let tag = py.send(json!({"op": "call", "session": "s", "tool": "scene.read", "args": {}}))?;
    result(&py.answer(&tag)?)?;
    ed.journal().flush()?;
    for i in 0..5 {
        let r = ed.journal().lookup(&format!("op_s{i}"))?.ok_or("gone")?;
        assert_eq!(r.delivery, Some(DeliveryState::Acknowledged), "op_s{i}");
    }
    // Sessions that never call again: one call each, never acknowledged.
    for i in 0..3 {
        let r = py.call_now(
            &ed.url(),
            LEGACY,
            "scene.add",
            add(&format!("op_n{i}"), &format!("n{i}")),
        )?;
        result(&r)?;
    }
    for i in 0..3 {
        let r = ed.journal().lookup(&format!("op_n{i}"))?.ok_or("gone")?;
        assert_eq!(r.delivery, Some(DeliveryState::Delivered), "op_n{i}");
    }
    // Later independent mutations proceed.
    let later = py.call_now(&ed.url(), MODERN, "scene.add", add("op_later", "later"))?;
    assert_eq!(meta(result(&later)?, "status"), "applied");
    ed.clock.advance(Duration::from_secs(901));
    ed.journal().compact()?;
    for i in 0..3 {
        let r = ed
            .journal()
            .lookup(&format!("op_n{i}"))?
            .ok_or("the audit record stays")?;
        assert_eq!(r.delivery, Some(DeliveryState::AckExpired), "op_n{i}");
        assert_eq!(r.status, ExecutionStatus::Applied);
    }
    let close = py.send(json!({"op": "close", "session": "s"}))?;
    py.answer(&close)?;
    Ok(())
}

/// Boundary 6: reconnecting again and again with the same call. Every answer is a replay
/// of one edit; the delivery count grows until the retry budget is spent (then the result
/// is still answered); the server keeps nothing per reconnect; the file stays small.
fn repeated_reconnects(mode: &str) -> TestResult {
    let Some(python) = python() else {
        return Ok(());
    };
    let ed = Editor::start()?;
    let proxy = Proxy::start(ed.addr())?;
    let mut py = Driver::start(&python)?;
    let first = py.call_now(&proxy.url(), mode, "scene.add", add("op_b6", "lamp"))?;
    assert_eq!(meta(result(&first)?, "replayed"), false);
    let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
    let journal_path = ed.journal().path().to_path_buf();
    let log_path = opjournal::FileLog::path_for(&journal_path);
    let mut deliveries = Vec::new();
    for round in 0..20 {
        proxy.cut();
        proxy.restore();
        let again = py.call_now(&proxy.url(), mode, "scene.add", add("op_b6", "lamp"))?;
        let r = result(&again)?;
        assert_eq!(meta(r, "replayed"), true, "round {round}: {r}");
        deliveries.push(meta(r, "delivery").as_u64().unwrap_or(0));
    }
    assert_eq!(deliveries.first(), Some(&2));
    assert_eq!(deliveries.last(), Some(&21), "{deliveries:?}");
    assert_eq!(ed.times_applied("op_b6"), 1);
    let receipt = ed.journal().lookup("op_b6")?.ok_or("gone")?;
    assert_eq!(
        receipt.delivery,
        Some(DeliveryState::Exhausted),
        "the retry budget is spent, the result still answered"
    );
    assert_eq!(ed.editor.journaled().running(), 0);
    // The results were delivered to later sessions than the one that owns them: nothing
    // waits in memory for an acknowledgement but the first session's result.
    assert!(ed.editor.journaled().unacknowledged_in_memory() <= 1);
    // Each reconnect's session was closed by its client (or, for a cut one, idles out):
    // the server does not keep one per reconnect, and its event store is bounded.
    assert!(
        ed.sessions() <= 2,
        "{} sessions after 21 reconnects",
        ed.sessions()
    );
    assert!(ed.events.streams() <= opjournal::mcp::DEFAULT_MAX_STREAMS);
    let bytes = size(&journal_path) + size(&log_path);
    assert!(
        bytes < 4 << 20,
        "journal and log: {bytes} bytes after 21 deliveries"
    );
    assert!(proxy.accepted.load(Ordering::SeqCst) >= 21);
    Ok(())
}

#[test]
fn repeated_reconnects_replay_one_edit_and_keep_the_server_bounded_2025_11_25() -> TestResult {
    repeated_reconnects(LEGACY)
}

#[test]
fn repeated_reconnects_replay_one_edit_and_keep_the_server_bounded_2026_07_28() -> TestResult {
    repeated_reconnects(MODERN)
}

/// Eight clients send the same first call at once (one operation id): one execution, seven
/// answers attached to it.
fn eight_clients(mode: &str) -> TestResult {
    let Some(python) = python() else {
        return Ok(());
    };
    let ed = Editor::start()?;
    let mut py = Driver::start(&python)?;
    ed.editor.pauses().arm(Stage::Accepted);
    let tags: Vec<String> = (0..8)
        .map(|_| py.call(&ed.url(), mode, "scene.add", add("op_8", "lamp")))
        .collect::<Result<_, _>>()?;
    assert_eq!(ed.editor.pauses().wait_held(WAIT)?, "op_8");
    // Let the seven others arrive and wait on it.
    std::thread::sleep(Duration::from_millis(700));
    ed.editor.pauses().release(Verdict::Continue);
    let mut fresh = 0;
    for tag in tags {
        let r = result(&py.answer(&tag)?)?.clone();
        assert_eq!(meta(&r, "status"), "applied", "{r}");
        if meta(&r, "replayed") == false {
            fresh += 1;
        }
    }
    assert_eq!(fresh, 1, "one answer of the execution, seven replays");
    assert_eq!(ed.times_applied("op_8"), 1);
    Ok(())
}

#[test]
fn eight_clients_sending_one_operation_id_at_once_make_one_edit_2025_11_25() -> TestResult {
    eight_clients(LEGACY)
}

#[test]
fn eight_clients_sending_one_operation_id_at_once_make_one_edit_2026_07_28() -> TestResult {
    eight_clients(MODERN)
}

/// A client that gives up (a read timeout: the SDK sends `notifications/cancelled`) does not
/// stop or undo the edit: it is made and recorded, and the call re-issued gets it.
#[test]
fn a_cancelled_call_still_makes_its_edit_once_and_the_reissue_gets_it() -> TestResult {
    let Some(python) = python() else {
        return Ok(());
    };
    let ed = Editor::start()?;
    let mut py = Driver::start(&python)?;
    ed.editor.pauses().arm(Stage::Accepted);
    let tag = py.send(json!({"op": "call", "url": ed.url(), "mode": LEGACY, "tool": "scene.add", "args": add("op_c", "lamp"), "timeout": 1}))?;
    ed.editor.pauses().wait_held(WAIT)?;
    let first = py.answer(&tag)?;
    assert_eq!(first["ok"], false, "the client gave up: {first}");
    ed.editor.pauses().release(Verdict::Continue);
    ed.wait_idle()?;
    assert_eq!(
        ed.journal().lookup("op_c")?.map(|r| r.status),
        Some(ExecutionStatus::Applied)
    );
    let again = py.call_now(&ed.url(), LEGACY, "scene.add", add("op_c", "lamp"))?;
    assert_eq!(meta(result(&again)?, "replayed"), true);
    assert_eq!(ed.times_applied("op_c"), 1);
    Ok(())
}

/// What the agent is told: the same id with other arguments, a missing id, an id in
/// `_meta`, a refused edit (its id free again), and a stale base revision.
#[test]
fn the_agent_is_told_what_to_do_for_a_mismatch_a_missing_id_a_refusal_and_a_stale_base()
-> TestResult {
    let Some(python) = python() else {
        return Ok(());
    };
    let ed = Editor::start()?;
    let mut py = Driver::start(&python)?;
    let url = ed.url();
    result(&py.call_now(&url, MODERN, "scene.add", add("op_m", "lamp"))?)?;
    let mismatch = py.call_now(&url, MODERN, "scene.add", add("op_m", "other"))?;
    let r = result(&mismatch)?;
    assert_eq!(
        (r["isError"].clone(), meta(r, "status").clone()),
        (json!(true), json!("mismatch")),
        "{r}"
    );
    assert!(text(r).contains("new operation_id"), "{r}");
    let missing = py.call_now(
        &url,
        MODERN,
        "scene.add",
        json!({"object": "x", "beside": "door"}),
    )?;
    let r = result(&missing)?;
    assert_eq!(meta(r, "status"), "invalid", "{r}");
    assert!(text(r).contains("operation_id"), "{r}");
    let tag = py.send(json!({"op": "call", "url": url, "mode": MODERN, "tool": "scene.add",
        "args": {"object": "viameta", "beside": "door"}, "meta": {"dev.opjournal/operation_id": "op_meta"}}))?;
    let r = result(&py.answer(&tag)?)?.clone();
    assert_eq!(
        (meta(&r, "status").clone(), meta(&r, "operation_id").clone()),
        (json!("applied"), json!("op_meta")),
        "{r}"
    );
    let refused = py.call_now(
        &url,
        MODERN,
        "scene.add",
        json!({"operation_id": "op_r", "object": "y", "beside": "nothing"}),
    )?;
    let r = result(&refused)?;
    assert_eq!(meta(r, "status"), "not_applied", "{r}");
    assert!(
        ed.journal().lookup("op_r")?.is_none(),
        "a refused edit frees its id"
    );
    let fixed = py.call_now(
        &url,
        MODERN,
        "scene.add",
        json!({"operation_id": "op_r", "object": "y", "beside": "door"}),
    )?;
    assert_eq!(meta(result(&fixed)?, "replayed"), false);
    let stale = py.call_now(
        &url,
        MODERN,
        "scene.add",
        json!({"operation_id": "op_s", "object": "z", "beside": "door", "base_revision": 1}),
    )?;
    let r = result(&stale)?;
    assert_eq!(meta(r, "status"), "stale_base", "{r}");
    assert!(text(r).contains("Read the project again"), "{r}");
    assert_eq!(ed.times_applied("op_s"), 0);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// `opjournal serve --mcp` as a process: kill -9 mid-call.
// ---------------------------------------------------------------------------------------

/// `opjournal serve --mcp --port 0` on `journal`; its stderr lines arrive on `notes`.
struct Process {
    child: Child,
    url: String,
    notes: Receiver<String>,
}

impl Process {
    fn start(journal: &Path, extra: &[&str]) -> Result<Process, Box<dyn std::error::Error>> {
        Process::serve(&["--mcp"], journal, extra)
    }

    /// `opjournal serve FRONT --port 0 --journal JOURNAL EXTRA...`; `url` is what its
    /// first line announces (`127.0.0.1:PORT` for the JSON Lines service).
    fn serve(
        front: &[&str],
        journal: &Path,
        extra: &[&str],
    ) -> Result<Process, Box<dyn std::error::Error>> {
        let mut child = Command::new(env!("CARGO_BIN_EXE_opjournal"))
            .arg("serve")
            .args(front)
            .args(["--port", "0", "--journal"])
            .arg(journal)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let stderr = child.stderr.take().ok_or("no stderr")?;
        let (tx, notes) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                eprintln!("server: {line}");
                let _ = tx.send(line);
            }
        });
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let url = line
            .trim_end()
            .strip_prefix("listening on ")
            .ok_or_else(|| format!("unexpected first line {line:?}"))?
            .to_string();
        Ok(Process { child, url, notes })
    }

    fn wait_note(&self, contains: &str) -> Result<String, Box<dyn std::error::Error>> {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .notes
                .recv_timeout(left)
                .map_err(|_| format!("no note with `{contains}`"))?;
            if line.contains(contains) {
                return Ok(line);
            }
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How many times the document on disk records operation `id` as applied: the snapshot's
/// applied index (each entry counts its applications) plus the lines of the edit log since.
fn logged_edits(journal: &Path, id: &str) -> usize {
    let snapshot = std::fs::read(journal.with_extension("scene.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok());
    let in_snapshot: u64 = snapshot
        .as_ref()
        .and_then(|s| s["applied"].as_array())
        .map_or(0, |applied| {
            applied
                .iter()
                .filter(|a| a["op"] == id)
                .map(|a| a["times"].as_u64().unwrap_or(1))
                .sum()
        });
    let log = std::fs::read_to_string(journal.with_extension("scene.log")).unwrap_or_default();
    let in_log = log
        .lines()
        .filter(|l| serde_json::from_str::<Value>(l).is_ok_and(|v| v["op"] == id))
        .count();
    usize::try_from(in_snapshot).unwrap_or(usize::MAX) + in_log
}

/// Killed with the edit saved in the document but its outcome not recorded: the restart
/// finds the operation in doubt, sees the edit in the document and records it as applied;
/// the re-issued call is a replay.
#[test]
fn a_server_killed_after_the_edit_settles_it_from_the_document_and_replays_it() -> TestResult {
    let Some(python) = python() else {
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let journal = dir.path().join("p.opj");
    let mut py = Driver::start(&python)?;
    let mut server = Process::start(&journal, &["--fault-hold", "mutated"])?;
    let tag = py.call(&server.url, LEGACY, "scene.add", add("op_k", "lamp"))?;
    server.wait_note("is held at Mutated")?;
    server.child.kill()?; // SIGKILL
    server.child.wait()?;
    let first = py.answer(&tag)?;
    assert_eq!(first["ok"], false, "{first}");
    assert_eq!(
        logged_edits(&journal, "op_k"),
        1,
        "the edit was saved before the kill"
    );
    let server = Process::start(&journal, &[])?;
    let note = server.wait_note("op_k was in doubt")?;
    assert!(note.contains("recorded as applied"), "{note}");
    for mode in [LEGACY, MODERN] {
        let again = py.call_now(&server.url, mode, "scene.add", add("op_k", "lamp"))?;
        let r = result(&again)?;
        assert_eq!(meta(r, "replayed"), true, "{r}");
        assert_eq!(meta(r, "result_revision"), 1, "{r}");
    }
    assert_eq!(logged_edits(&journal, "op_k"), 1, "never applied twice");
    Ok(())
}

/// Killed after acceptance, before the edit: the restart finds the operation in doubt, sees
/// no edit in the document and records it as not applied; the re-issued call then makes the
/// edit, once.
#[test]
fn a_server_killed_before_the_edit_settles_it_as_not_applied_and_the_reissue_runs_once()
-> TestResult {
    let Some(python) = python() else {
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let journal = dir.path().join("p.opj");
    let mut py = Driver::start(&python)?;
    let mut server = Process::start(&journal, &["--fault-hold", "accepted"])?;
    let tag = py.call(&server.url, MODERN, "scene.add", add("op_k2", "lamp"))?;
    server.wait_note("is held at Accepted")?;
    server.child.kill()?;
    server.child.wait()?;
    assert_eq!(py.answer(&tag)?["ok"], false);
    assert_eq!(logged_edits(&journal, "op_k2"), 0);
    let server = Process::start(&journal, &[])?;
    let note = server.wait_note("op_k2 was in doubt")?;
    assert!(note.contains("recorded as not applied"), "{note}");
    let again = py.call_now(&server.url, MODERN, "scene.add", add("op_k2", "lamp"))?;
    let r = result(&again)?;
    assert_eq!(meta(r, "replayed"), false, "{r}");
    assert_eq!(logged_edits(&journal, "op_k2"), 1);
    let third = py.call_now(&server.url, LEGACY, "scene.add", add("op_k2", "lamp"))?;
    assert_eq!(meta(result(&third)?, "replayed"), true);
    assert_eq!(logged_edits(&journal, "op_k2"), 1);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// rmcp's own client over stdio.
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn rmcp_client_over_stdio_initializes_lists_calls_and_gets_a_replay() -> TestResult {
    use rmcp::ServiceExt;
    use rmcp::model::CallToolRequestParams;
    use rmcp::transport::TokioChildProcess;

    let dir = tempfile::tempdir()?;
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_opjournal"));
    cmd.args(["serve", "--mcp", "--journal"])
        .arg(dir.path().join("p.opj"));
    let client = ().serve(TokioChildProcess::new(cmd)?).await?;
    let info = client.peer_info().ok_or("no initialize result")?;
    let server = info.server_info.as_ref().ok_or("no server info")?;
    assert_eq!(server.name, "opjournal-editor");
    let tools = client.list_all_tools().await?;
    let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        ["scene.add", "scene.delete", "scene.read", "scene.rename"]
    );
    let args = add("op_rmcp", "lamp");
    let args = args.as_object().ok_or("not an object")?.clone();
    let first = client
        .call_tool(CallToolRequestParams::new("scene.add").with_arguments(args.clone()))
        .await?;
    let second = client
        .call_tool(CallToolRequestParams::new("scene.add").with_arguments(args))
        .await?;
    let m = |r: &rmcp::model::CallToolResult, k: &str| {
        r.meta
            .as_ref()
            .and_then(|m| m.0.get(&format!("dev.opjournal/{k}")).cloned())
    };
    assert_eq!(m(&first, "replayed"), Some(json!(false)));
    assert_eq!(m(&second, "replayed"), Some(json!(true)));
    assert_eq!(m(&second, "delivery"), Some(json!(2)));
    assert_eq!(
        first.content, second.content,
        "the recorded result, as first answered"
    );
    let read = client
        .call_tool(CallToolRequestParams::new("scene.read"))
        .await?;
    let objects = read.structured_content.ok_or("no structured content")?;
    assert_eq!(objects["revision"], 1, "one edit: {objects}");
    client.cancel().await?;
    Ok(())
}

/// One JSON Lines request on `stream`, and the next answer of `want` type.
fn ask_json_lines(
    stream: &mut BufReader<TcpStream>,
    request: &Value,
    want: &str,
) -> Result<Value, Box<dyn std::error::Error>> {
    stream
        .get_mut()
        .write_all(format!("{request}\n").as_bytes())?;
    loop {
        let mut line = String::new();
        if stream.read_line(&mut line)? == 0 {
            return Err(format!("closed before a `{want}` for {request}").into());
        }
        let v: Value = serde_json::from_str(&line)?;
        if v["type"] == want {
            return Ok(v);
        }
    }
}

/// `opjournal serve --mcp` over stdio with rmcp's client: one `scene.add` call, then the
/// process is let exit (its journal free for the next server).
async fn add_over_mcp(
    journal: &Path,
    id: &str,
    object: &str,
) -> Result<rmcp::model::CallToolResult, Box<dyn std::error::Error>> {
    use rmcp::ServiceExt;
    use rmcp::model::CallToolRequestParams;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_opjournal"))
        .args(["serve", "--mcp", "--journal"])
        .arg(journal)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let io = (
        child.stdout.take().ok_or("no stdout")?,
        child.stdin.take().ok_or("no stdin")?,
    );
    let client = ().serve(io).await?;
    let args = add(id, object).as_object().ok_or("not an object")?.clone();
    let result = client
        .call_tool(CallToolRequestParams::new("scene.add").with_arguments(args))
        .await?;
    client.cancel().await?;
    let status = tokio::time::timeout(WAIT, child.wait()).await??;
    assert!(status.success(), "serve --mcp ended cleanly: {status}");
    Ok(result)
}

#[tokio::test]
async fn an_edit_made_over_one_front_end_replays_over_the_other_with_its_summary_and_assets()
-> TestResult {
    let dir = tempfile::tempdir()?;
    let journal = dir.path().join("p.opj");
    // Over MCP: `op_m` adds the lamp.
    let made = add_over_mcp(&journal, "op_m", "lamp").await?;
    let structured = made
        .structured_content
        .clone()
        .ok_or("no structured content")?;
    let summary = structured["summary"]
        .as_str()
        .ok_or("no summary")?
        .to_string();
    assert_eq!(structured["changed"], json!(["scene/main/lamp"]));
    // Over JSON Lines: the same operation is a replay with that summary and asset, and
    // `op_j` adds the chair.
    let server = Process::serve(&[], &journal, &[])?;
    let stream = TcpStream::connect(server.url.parse::<SocketAddr>()?)?;
    stream.set_read_timeout(Some(WAIT))?;
    let mut jl = BufReader::new(stream);
    ask_json_lines(
        &mut jl,
        &json!({"type": "hello", "session": "s"}),
        "welcome",
    )?;
    let mut add_jl = |id: &str, base: u64, object: &str| {
        let edit = json!({"kind": "add", "object": object, "beside": "door"});
        let submit = json!({"type": "submit", "id": id, "base_revision": base, "edit": edit});
        ask_json_lines(&mut jl, &submit, "result")
    };
    let replay = add_jl("op_m", 0, "lamp")?;
    assert_eq!(replay["replayed"], true, "{replay}");
    assert_eq!(replay["revision"], 1, "{replay}");
    assert_eq!(replay["summary"], summary.as_str(), "{replay}");
    assert_eq!(replay["changed"], json!(["scene/main/lamp"]), "{replay}");
    let chair = add_jl("op_j", 1, "chair")?;
    assert_eq!(chair["replayed"], false, "{chair}");
    let chair_summary = chair["summary"].as_str().ok_or("no summary")?.to_string();
    drop(jl);
    drop(server);
    // Over MCP again: `op_j` is a replay in the form an MCP edit is answered.
    let again = add_over_mcp(&journal, "op_j", "chair").await?;
    let m = again.meta.as_ref().ok_or("no _meta")?;
    assert_eq!(m.0.get("dev.opjournal/replayed"), Some(&json!(true)));
    assert_eq!(again.is_error, Some(false));
    let structured = again.structured_content.ok_or("no structured content")?;
    assert_eq!(
        structured,
        json!({"revision": 2, "summary": chair_summary, "changed": ["scene/main/chair"]})
    );
    let text = again.content[0]
        .as_text()
        .map(|t| t.text.clone())
        .unwrap_or_default();
    assert_eq!(
        text,
        format!("{chair_summary} (the scene is now at revision 2)")
    );
    // The journal recorded both operations' assets.
    let insp = opjournal::Inspector::open(&journal)?;
    for (id, asset) in [("op_m", "scene/main/lamp"), ("op_j", "scene/main/chair")] {
        let result = insp.result(id)?.ok_or("no result")?;
        assert_eq!(result.changed_assets, [asset], "{id}");
    }
    Ok(())
}

#[test]
fn an_object_name_too_long_for_its_asset_is_a_tool_error_marked_invalid_and_nothing_runs()
-> TestResult {
    let Some(python) = python() else {
        return Ok(());
    };
    let ed = Editor::start()?;
    let mut py = Driver::start(&python)?;
    // `scene/main/NAME` is the outcome's changed asset; a longer name was applied and then
    // could not be recorded (and one of 1.5 MB made a result over the journal's limit; the
    // driver reads lines of at most 64 KiB).
    for (id, len) in [
        ("op_long", opjournal::service::MAX_OBJECT_NAME_BYTES + 1),
        ("op_huge", 60_000),
    ] {
        let long = "n".repeat(len);
        let answer = py.call_now(&ed.url(), MODERN, "scene.add", add(id, &long))?;
        let r = result(&answer)?;
        assert_eq!(r["isError"], true, "{id}: {r}");
        assert_eq!(meta(r, "status"), "invalid", "{id}: {r}");
        assert!(text(r).contains("object"), "{id}: {}", text(r));
        assert!(ed.journal().lookup(id)?.is_none(), "{id}: nothing recorded");
        assert_eq!(ed.times_applied(id), 0, "{id}: nothing applied");
    }
    Ok(())
}
