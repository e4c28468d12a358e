//! The editor service as a client sees it (issue 14): a real `opjournal serve` process,
//! driven over loopback by a raw socket client that speaks the JSON Lines of
//! docs/protocol.md by hand (not the demo's client, not the library's message types).
//!
//! Each test names the contract it checks. Two behaviours need a fault that cannot be
//! caused from outside a process (an edit that panics; an operation held while a second
//! client attaches to it is raced for, not forced, against the process): the panic test
//! runs the same service in-process, with the same raw client.
#![cfg(all(feature = "cli", feature = "service"))]

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const WAIT: Duration = Duration::from_secs(20);

/// An `opjournal serve` process on a port chosen by the system; killed when dropped.
struct Server {
    child: Child,
    addr: SocketAddr,
    journal: PathBuf,
    _dir: Option<tempfile::TempDir>,
}

impl Server {
    /// Starts `opjournal serve` on a new journal in a temporary directory under `base`.
    fn start_in(
        base: &Path,
        args: &[&str],
        ulimit: Option<u32>,
    ) -> Result<Server, Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir_in(base)?;
        let journal = dir.path().join("p.opj");
        let bin = env!("CARGO_BIN_EXE_opjournal");
        let mut cmd = match ulimit {
            // The descriptor limit of the service process only.
            Some(n) => {
                let mut c = Command::new("sh");
                c.arg("-c")
                    .arg(format!("ulimit -n {n} && exec \"$0\" \"$@\""))
                    .arg(bin);
                c
            }
            None => Command::new(bin),
        };
        cmd.arg("serve")
            .arg("--journal")
            .arg(&journal)
            .args(["--port", "0"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd.spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        // The documented first line: `listening on 127.0.0.1:PORT`.
        let addr = line
            .trim_end()
            .strip_prefix("listening on ")
            .ok_or_else(|| format!("unexpected first line {line:?}"))?
            .parse()?;
        Ok(Server {
            child,
            addr,
            journal,
            _dir: Some(dir),
        })
    }

    fn start(args: &[&str]) -> Result<Server, Box<dyn std::error::Error>> {
        Server::start_in(&std::env::temp_dir(), args, None)
    }

    fn connect(&self) -> std::io::Result<Raw> {
        Raw::connect(self.addr)
    }

    /// The document's edit log.
    fn log(&self) -> PathBuf {
        self.journal.with_extension("scene.log")
    }

    fn threads(&self) -> Result<usize, Box<dyn std::error::Error>> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        let line = status
            .lines()
            .find(|l| l.starts_with("Threads:"))
            .ok_or("no thread count")?;
        Ok(line["Threads:".len()..].trim().parse()?)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A raw protocol client: JSON objects written and read as lines on a TCP socket.
struct Raw {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Raw {
    fn connect(addr: SocketAddr) -> std::io::Result<Raw> {
        let stream = TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(WAIT))?;
        stream.set_nodelay(true)?;
        let reader = BufReader::new(stream.try_clone()?);
        Ok(Raw { stream, reader })
    }

    fn send(&mut self, msg: &Value) -> std::io::Result<()> {
        self.send_line(&msg.to_string())
    }

    fn send_line(&mut self, line: &str) -> std::io::Result<()> {
        self.stream.write_all(format!("{line}\n").as_bytes())
    }

    /// The next message; `Value::Null` when the service closed the connection.
    fn recv(&mut self) -> Result<Value, Box<dyn std::error::Error>> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => Ok(Value::Null),
            Ok(_) => Ok(serde_json::from_str(&line)?),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Ok(Value::Null),
            Err(e) => Err(e.into()),
        }
    }

    /// `hello`, then the welcome and the results it announces.
    fn hello(&mut self, session: &str) -> Result<(Value, Vec<Value>), Box<dyn std::error::Error>> {
        self.send(&json!({"type": "hello", "session": session}))?;
        let welcome = self.recv()?;
        assert_eq!(welcome["type"], "welcome", "{welcome}");
        let n = welcome["pushing"].as_u64().ok_or("no `pushing`")?;
        let mut pushed = Vec::new();
        for _ in 0..n {
            pushed.push(self.recv()?);
        }
        Ok((welcome, pushed))
    }

    fn submit(&mut self, id: &str, base: u64, object: &str) -> std::io::Result<()> {
        self.send(&submit(id, base, object))
    }

    /// Submits and reads until the operation's final answer (`result`, `released`,
    /// `rejected` or an `error`), returning every message read.
    fn run(
        &mut self,
        id: &str,
        base: u64,
        object: &str,
    ) -> Result<Vec<Value>, Box<dyn std::error::Error>> {
        self.submit(id, base, object)?;
        self.until_final(id)
    }

    fn until_final(&mut self, id: &str) -> Result<Vec<Value>, Box<dyn std::error::Error>> {
        let mut seen = Vec::new();
        loop {
            let m = self.recv()?;
            let done = m.is_null()
                || (m["id"] == id
                    && matches!(
                        m["type"].as_str(),
                        Some("result" | "released" | "rejected" | "error")
                    ));
            seen.push(m);
            if done {
                return Ok(seen);
            }
        }
    }

    fn ask(&mut self, msg: &Value) -> Result<Value, Box<dyn std::error::Error>> {
        self.send(msg)?;
        self.recv()
    }
}

fn submit(id: &str, base: u64, object: &str) -> Value {
    json!({
        "type": "submit", "id": id, "base_revision": base,
        "edit": {"kind": "add", "object": object, "beside": "door"},
    })
}

fn status(id: &str) -> Value {
    json!({"type": "status", "id": id})
}

fn ack(id: &str) -> Value {
    json!({"type": "ack", "id": id})
}

fn types(msgs: &[Value]) -> Vec<&str> {
    msgs.iter()
        .map(|m| m["type"].as_str().unwrap_or("?"))
        .collect()
}

// ---------------------------------------------------------------------------------------
// 1. A failed apply ends the operation at once.
// ---------------------------------------------------------------------------------------

/// SIGTERM and SIGINT stop the service cleanly: it exits 0 and the journal is closed, with
/// the acknowledgement it answered `acked` committed (a kill may lose it: it is committed
/// lazily, and only a clean close commits it without a later change).
#[test]
fn status_of_a_released_operation_lists_its_events() -> TestResult {
    let server = Server::start(&[])?;
    let mut c = server.connect()?;
    c.hello("tab-1")?;
    // Deleting an object that is not there is refused before any change: released.
    c.send(&json!({
        "type": "submit", "id": "op_gone", "base_revision": 0,
        "edit": {"kind": "delete", "object": "nothing"},
    }))?;
    let seen = c.until_final("op_gone")?;
    assert_eq!(
        seen.last().map(|m| m["type"].clone()),
        Some(json!("rejected"))
    );
    let status = c.ask(&status("op_gone"))?;
    assert_eq!(status["state"], "unknown", "{status}");
    assert_eq!(
        status["history"],
        json!(["submitted", "released"]),
        "the events are kept after the receipt is gone: {status}"
    );
    Ok(())
}

#[test]
fn sigterm_and_sigint_stop_the_service_cleanly_with_the_acknowledgement_committed() -> TestResult {
    for signal in ["-TERM", "-INT"] {
        let mut server = Server::start(&[])?;
        let mut c = server.connect()?;
        c.hello("tab-1")?;
        let seen = c.run("op_1", 0, "lamp")?;
        assert_eq!(types(&seen), ["accepted", "result"], "{seen:?}");
        let acked = c.ask(&ack("op_1"))?;
        assert_eq!(acked["type"], "acked", "{acked}");
        let pid = server.child.id().to_string();
        assert!(
            Command::new("kill")
                .args([signal, &pid])
                .status()?
                .success()
        );
        let deadline = Instant::now() + WAIT;
        let status = loop {
            if let Some(status) = server.child.try_wait()? {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "{signal}: still running after {WAIT:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(status.code(), Some(0), "{signal}: {status:?}");
        let inspector = opjournal::Inspector::open(&server.journal)?;
        assert_eq!(
            inspector.access(),
            opjournal::Access::Idle,
            "{signal}: closed cleanly"
        );
        let receipt = inspector.lookup("op_1")?.ok_or("no receipt")?;
        assert_eq!(
            receipt.delivery,
            Some(opjournal::DeliveryState::Acknowledged),
            "{signal}: {receipt:?}"
        );
    }
    Ok(())
}

#[test]
fn a_save_that_fails_releases_the_operation_at_once_and_frees_the_document() -> TestResult {
    let server = Server::start(&[])?;
    let mut a = server.connect()?;
    a.hello("tab-a")?;
    let first = a.run("op_1", 0, "light")?;
    assert_eq!(types(&first), ["accepted", "result"], "{first:?}");
    // The document cannot be saved: its log is replaced by a directory.
    let log = server.log();
    let aside = log.with_extension("aside");
    std::fs::rename(&log, &aside)?;
    std::fs::create_dir(&log)?;

    let failed = a.run("op_2", 1, "lamp")?;
    assert_eq!(types(&failed), ["accepted", "released"], "{failed:?}");
    let released = &failed[1];
    assert_eq!(
        released["retry"], true,
        "a save failure may pass: {released}"
    );
    assert!(
        released["reason"]
            .as_str()
            .is_some_and(|r| r.contains("could not be saved") && r.contains("nothing changed")),
        "{released}"
    );
    // Ended in the journal, not left running: the id is free again ...
    let s = a.ask(&status("op_2"))?;
    assert_eq!(s["state"], "unknown", "{s}");
    // ... and another session can work on the document at once (no `scope_busy`).
    let mut b = server.connect()?;
    b.hello("tab-b")?;
    let other = b.run("op_3", 1, "chair")?;
    assert_eq!(types(&other), ["accepted", "released"], "{other:?}");

    // Once the document can be saved again, the same id runs (a new attempt).
    std::fs::remove_dir(&log)?;
    std::fs::rename(&aside, &log)?;
    let retried = a.run("op_2", 1, "lamp")?;
    assert_eq!(types(&retried), ["accepted", "result"], "{retried:?}");
    assert_eq!(retried[0]["attempt"], 2, "{retried:?}");
    assert_eq!(retried[1]["outcome"], "applied");
    assert_eq!(retried[1]["revision"], 2);
    Ok(())
}

#[test]
fn an_edit_that_panics_is_released_at_once_and_the_client_told_not_to_retry() -> TestResult {
    use opjournal::service::{JournalOpener, Service, ServiceConfig, Stage, Verdict};
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("p.opj");
    let open: JournalOpener = Box::new(move || opjournal::Journal::open(&path));
    let service = Service::start(
        std::net::TcpListener::bind(("127.0.0.1", 0))?,
        open,
        ServiceConfig::new(dir.path().join("p.scene.json")),
    )?;
    let mut a = Raw::connect(service.addr())?;
    a.hello("tab-a")?;
    service.pauses().arm_with(Stage::Accepted, Verdict::Panic);
    let answers = a.run("op_1", 0, "light")?;
    assert_eq!(types(&answers), ["accepted", "released"], "{answers:?}");
    assert_eq!(answers[1]["retry"], false, "{answers:?}");
    assert!(
        answers[1]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("panicked") && r.contains("nothing changed")),
        "{answers:?}"
    );
    assert_eq!(a.ask(&status("op_1"))?["state"], "unknown");
    assert_eq!(service.document().revision(), 0, "nothing was applied");
    // The service goes on: the next edit is applied.
    let next = a.run("op_2", 0, "lamp")?;
    assert_eq!(types(&next), ["accepted", "result"], "{next:?}");
    service.shutdown()?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 2. Connections are bounded.
// ---------------------------------------------------------------------------------------

#[test]
fn the_connection_past_the_limit_is_told_why_and_closed_and_a_freed_slot_is_reused() -> TestResult {
    let server = Server::start(&["--max-connections", "4"])?;
    let mut held: Vec<Raw> = (0..4).map(|_| server.connect()).collect::<Result<_, _>>()?;
    held[0].hello("tab-0")?;
    let mut extra = server.connect()?;
    let refused = extra.recv()?;
    assert_eq!(refused["type"], "error", "{refused}");
    assert_eq!(refused["kind"], "too_many_connections", "{refused}");
    assert!(extra.recv()?.is_null(), "then the connection is closed");
    // The served connections still work.
    let r = held[0].run("op_1", 0, "light")?;
    assert_eq!(types(&r), ["accepted", "result"], "{r:?}");
    // A closed connection frees its slot.
    drop(held.pop());
    let deadline = Instant::now() + WAIT;
    loop {
        let mut again = server.connect()?;
        again.send(&json!({"type": "hello", "session": "tab-9"}))?;
        let m = again.recv()?;
        if m["type"] == "welcome" {
            break;
        }
        assert_eq!(m["kind"], "too_many_connections", "{m}");
        assert!(Instant::now() < deadline, "the slot was never freed");
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

#[test]
fn an_idle_connection_is_told_and_closed_after_the_idle_timeout() -> TestResult {
    let server = Server::start(&["--idle-timeout", "1s"])?;
    let mut idle = server.connect()?;
    idle.hello("tab-idle")?;
    let started = Instant::now();
    let m = idle.recv()?;
    assert_eq!(m["kind"], "idle_timeout", "{m}");
    assert!(idle.recv()?.is_null(), "then the connection is closed");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(10),
        "closed after {waited:?}"
    );
    // A client trickling a request byte by byte (3.4 s for the line) does not keep it
    // open either: the whole line must come within the timeout.
    let mut slow = server.connect()?;
    slow.stream
        .set_read_timeout(Some(Duration::from_millis(100)))?;
    let mut line = String::new();
    for b in b"{\"type\":\"hello\",\"session\":\"slow\"}" {
        if slow.stream.write_all(&[*b]).is_err() {
            break;
        }
        match slow.reader.read_line(&mut line) {
            Ok(_) => break,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let m: Value = serde_json::from_str(&line)?;
    assert_eq!(m["kind"], "idle_timeout", "{m}");
    Ok(())
}

#[test]
fn a_small_descriptor_limit_bounds_connections_and_edits_still_save() -> TestResult {
    // The issue: ~30 idle connections exhausted 64 descriptors, then saving failed.
    let server = Server::start_in(&std::env::temp_dir(), &[], Some(64))?;
    let mut served = server.connect()?;
    served.hello("tab-a")?;
    let mut others = Vec::new();
    let mut refused = 0;
    for _ in 0..60 {
        let mut c = server.connect()?;
        c.send(&json!({"type": "hello", "session": "idle"}))?;
        let m = c.recv()?;
        match m["type"].as_str() {
            Some("welcome") => others.push(c),
            _ => {
                assert_eq!(m["kind"], "too_many_connections", "{m}");
                refused += 1;
            }
        }
    }
    assert!(refused > 0, "the limit was lowered to fit 64 descriptors");
    assert!(others.len() <= 32, "{} connections served", others.len());
    // Every descriptor the document and journal need is still there.
    for i in 0..3 {
        let r = served.run(&format!("op_{i}"), i, &format!("o{i}"))?;
        assert_eq!(types(&r), ["accepted", "result"], "{r:?}");
    }
    assert!(server.threads()? <= others.len() + 1 + 8, "threads bounded");
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 3. Latency, and the cost of an edit.
// ---------------------------------------------------------------------------------------

#[test]
fn a_result_follows_its_acceptance_without_waiting_for_a_delayed_ack() -> TestResult {
    // On tmpfs the journal's lifecycle takes well under a millisecond, so a reply held
    // back by Nagle's algorithm until a delayed ACK (~40 ms) would show in the median.
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let server = Server::start_in(&base, &[], None)?;
    let mut a = server.connect()?;
    a.hello("tab-a")?;
    let mut times = Vec::new();
    for i in 0..41u64 {
        let t = Instant::now();
        let r = a.run(&format!("op_{i}"), i, &format!("o{i}"))?;
        times.push(t.elapsed());
        assert_eq!(types(&r), ["accepted", "result"], "{r:?}");
        a.send(&ack(&format!("op_{i}")))?;
        assert_eq!(a.recv()?["type"], "acked");
    }
    times.sort();
    let median = times[times.len() / 2];
    assert!(
        median < Duration::from_millis(25),
        "submit to result median {median:?}: {times:?}"
    );
    Ok(())
}

#[test]
fn an_edit_appends_one_short_line_to_the_document_however_long_its_history() -> TestResult {
    let server = Server::start(&[])?;
    let mut a = server.connect()?;
    a.hello("tab-a")?;
    let mut grew = Vec::new();
    for i in 0..60u64 {
        let before = std::fs::metadata(server.log()).map_or(0, |m| m.len());
        let r = a.run(&format!("op_{i:03}"), i, &format!("o{i:03}"))?;
        assert_eq!(types(&r), ["accepted", "result"], "{r:?}");
        grew.push(std::fs::metadata(server.log())?.len() - before);
    }
    let (first, last) = (grew[0], grew[grew.len() - 1]);
    assert!(
        first < 200 && last <= first + 4,
        "edit 1 wrote {first} bytes, edit 60 wrote {last}"
    );
    assert!(
        !server.journal.with_extension("scene.json").exists(),
        "no whole-document rewrite per edit (a snapshot comes every 1,000 edits)"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 4. Attaching from another session.
// ---------------------------------------------------------------------------------------

#[test]
fn a_session_that_attaches_to_a_running_operation_gets_its_result_too() -> TestResult {
    let server = Server::start(&[])?;
    let mut a = server.connect()?;
    a.hello("tab-a")?;
    let mut b = server.connect()?;
    b.hello("tab-b")?;
    // B submits A's operation while it runs. The window is an edit's saves and commits
    // (milliseconds); on a miss the operation has finished and B gets its replay, so try
    // again with a new id.
    for trial in 0..30u64 {
        let id = format!("op_{trial}");
        a.submit(&id, trial, &format!("o{trial}"))?;
        let accepted = a.recv()?;
        assert_eq!(accepted["type"], "accepted", "{accepted}");
        b.submit(&id, trial, &format!("o{trial}"))?;
        let first_b = b.recv()?;
        let from_a = a.until_final(&id)?;
        let result_a = from_a.last().cloned().unwrap_or_default();
        assert_eq!(result_a["type"], "result", "{from_a:?}");
        if first_b["type"] != "running" {
            assert_eq!(first_b["type"], "result", "{first_b}");
            assert_eq!(first_b["replayed"], true);
            continue;
        }
        // Told `running` ("its result follows"): it does.
        let result_b = b.until_final(&id)?;
        let result_b = result_b.last().cloned().unwrap_or_default();
        assert_eq!(result_b["type"], "result", "{result_b}");
        assert_eq!(result_a["replayed"], false, "{result_a}");
        assert_eq!(
            result_b["replayed"], true,
            "B's copy is a repeat: {result_b}"
        );
        assert_eq!(result_a["revision"], result_b["revision"]);
        let mut deliveries = [result_a["delivery"].as_u64(), result_b["delivery"].as_u64()];
        deliveries.sort();
        assert_eq!(deliveries, [Some(1), Some(2)], "one delivery per copy");
        // The result is still A's: B may not acknowledge it.
        let refused = b.ask(&ack(&id))?;
        assert_eq!(refused["kind"], "not_owner", "{refused}");
        assert_eq!(a.ask(&ack(&id))?["type"], "acked");
        return Ok(());
    }
    Err("B never caught an operation running in 30 trials".into())
}

// ---------------------------------------------------------------------------------------
// 5. Exhaustion, said when it happens.
// ---------------------------------------------------------------------------------------

#[test]
fn the_eighth_delivery_spends_the_budget_and_status_says_so_at_once() -> TestResult {
    let server = Server::start(&[])?;
    let mut a = server.connect()?;
    a.hello("tab-a")?;
    let r = a.run("op_1", 0, "light")?;
    assert_eq!(r[1]["delivery"], 1);
    // Seven reconnects push it again: deliveries 2 to 8 (the default budget).
    for n in 2..=8u64 {
        let mut again = server.connect()?;
        let (welcome, pushed) = again.hello("tab-a")?;
        assert_eq!(welcome["pushing"], 1, "{welcome}");
        assert_eq!(pushed[0]["delivery"], n, "{pushed:?}");
        let s = again.ask(&status("op_1"))?;
        let expected = if n < 8 { "delivered" } else { "exhausted" };
        assert_eq!(s["delivery"], expected, "after delivery {n}: {s}");
        assert_eq!(s["deliveries"], n);
    }
    // Not pushed any more, and still there when asked for.
    let mut last = server.connect()?;
    let (welcome, _) = last.hello("tab-a")?;
    assert_eq!(welcome["pushing"], 0, "{welcome}");
    let replay = last.ask(&submit("op_1", 0, "light"))?;
    assert_eq!(replay["type"], "result");
    assert_eq!(replay["replayed"], true);
    assert_eq!(last.ask(&ack("op_1"))?["type"], "acked");
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 6. Only the owner acknowledges.
// ---------------------------------------------------------------------------------------

#[test]
fn a_session_cannot_acknowledge_another_sessions_result() -> TestResult {
    let server = Server::start(&[])?;
    let mut a = server.connect()?;
    a.hello("tab-a")?;
    a.run("op_1", 0, "light")?;
    let mut b = server.connect()?;
    b.hello("tab-b")?;
    let refused = b.ask(&ack("op_1"))?;
    assert_eq!(refused["type"], "error", "{refused}");
    assert_eq!(refused["kind"], "not_owner", "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .is_some_and(|m| m.contains("tab-a") && m.contains("tab-b")),
        "{refused}"
    );
    // Still A's to see: pushed again on A's next hello, until A acknowledges it.
    let mut a2 = server.connect()?;
    let (_, pushed) = a2.hello("tab-a")?;
    assert_eq!(pushed.len(), 1, "{pushed:?}");
    assert_eq!(pushed[0]["id"], "op_1");
    assert_eq!(a2.ask(&ack("op_1"))?["type"], "acked");
    let (welcome, _) = server.connect()?.hello("tab-a")?;
    assert_eq!(welcome["pushing"], 0);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 7. Names are checked as `submit` checks them.
// ---------------------------------------------------------------------------------------

#[test]
fn sessions_and_ids_that_submit_would_refuse_are_refused_everywhere() -> TestResult {
    let server = Server::start(&[])?;
    let long = "s".repeat(60 * 1024);
    for session in ["", "tab\u{0}1", long.as_str()] {
        let mut c = server.connect()?;
        let m = c.ask(&json!({"type": "hello", "session": session}))?;
        assert_eq!(
            m["type"],
            "error",
            "hello {:?}: {m}",
            &session[..session.len().min(9)]
        );
        assert_eq!(m["kind"], "bad_request", "{m}");
        // Not welcomed: the connection has no session.
        let m = c.ask(&status("op_1"))?;
        assert!(
            m["message"].as_str().is_some_and(|t| t.contains("hello")),
            "{m}"
        );
    }
    let mut a = server.connect()?;
    a.hello("tab-a")?;
    let long_id = "i".repeat(300);
    for id in ["", "op\u{1}1", "op\n1", long_id.as_str()] {
        for request in [status(id), ack(id), submit(id, 0, "light")] {
            let m = a.ask(&request)?;
            assert_eq!(m["type"], "error", "{request}: {m}");
            assert_eq!(m["kind"], "bad_request", "{request}: {m}");
        }
    }
    Ok(())
}

#[test]
fn an_object_name_too_long_for_its_changed_asset_is_refused_before_anything_is_recorded()
-> TestResult {
    // `scene/main/NAME` is the outcome's changed asset, which the journal takes up to 256
    // bytes: a longer name used to be applied and then fail to be recorded.
    let server = Server::start(&[])?;
    let mut a = server.connect()?;
    let (welcome, _) = a.hello("tab-a")?;
    let revision = welcome["revision"].as_u64().ok_or("no revision")?;
    let max = opjournal::service::MAX_OBJECT_NAME_BYTES;
    let too_long = "n".repeat(max + 1);
    let edits = [
        json!({"kind": "add", "object": too_long, "beside": "door"}),
        json!({"kind": "add", "object": "lamp", "beside": too_long}),
        json!({"kind": "rename", "from": "door", "to": too_long}),
        json!({"kind": "delete", "object": "n".repeat(1_500_000 / 1000 * 40)}),
    ];
    for (i, edit) in edits.iter().enumerate() {
        let id = format!("op_long_{i}");
        let m =
            a.ask(&json!({"type": "submit", "id": id, "base_revision": revision, "edit": edit}))?;
        assert_eq!(m["type"], "error", "{m}");
        assert_eq!(m["kind"], "bad_request", "{m}");
        let text = m["message"].as_str().unwrap_or("");
        assert!(text.contains(&max.to_string()), "names the limit: {text}");
        let s = a.ask(&status(&id))?;
        assert_eq!(s["state"], "unknown", "nothing recorded: {s}");
    }
    // Nothing applied: the document's log has no line with the name (or no line at all).
    let log = std::fs::read_to_string(server.log()).unwrap_or_default();
    assert!(!log.contains("nnnnnnnn"), "nothing applied: {log}");
    let s = a.ask(&json!({"type": "hello", "session": "tab-a"}))?;
    assert_eq!(s["revision"], revision, "the revision did not move: {s}");
    // The longest name that fits is applied and recorded, its asset listed.
    let fits = "n".repeat(max);
    let r = a.run("op_fits", revision, &fits)?;
    assert_eq!(types(&r), ["accepted", "result"], "{r:?}");
    let changed = &r[1]["changed"];
    assert_eq!(changed, &json!([format!("scene/main/{fits}")]), "{changed}");
    Ok(())
}

#[test]
fn the_submitting_connection_hears_the_answer_when_its_session_has_a_newer_one() -> TestResult {
    let server = Server::start(&[])?;
    let mut older = server.connect()?;
    let (welcome, _) = older.hello("tab-a")?;
    let revision = welcome["revision"].as_u64().ok_or("no revision")?;
    // A newer connection of the same session, gone before the edit ends.
    let mut newer = server.connect()?;
    newer.hello("tab-a")?;
    drop(newer);
    let r = older.run("op_older", revision, "lamp")?;
    assert_eq!(types(&r), ["accepted", "result"], "{r:?}");
    Ok(())
}

#[test]
fn a_client_that_stops_reading_does_not_hold_up_other_clients_answers() -> TestResult {
    let server = Server::start(&[])?;
    let mut same = server.connect()?;
    let (welcome, _) = same.hello("tab-a")?;
    let revision = welcome["revision"].as_u64().ok_or("no revision")?;
    // The session's newest connection, which gets its answers, stops reading and fills
    // its socket with replies: a write to it blocks until the write timeout (10 s)
    // closes it.
    let mut stuck = server.connect()?;
    stuck.hello("tab-a")?;
    stuck
        .stream
        .set_write_timeout(Some(Duration::from_secs(2)))?;
    let flood = std::thread::spawn(move || {
        let line = format!("{}\n", status("op_flood"));
        // Until the service stops reading this connection (its write is blocked) and the
        // socket's buffers are full both ways.
        while stuck.stream.write_all(line.as_bytes()).is_ok() {}
        stuck
    });
    std::thread::sleep(Duration::from_millis(1500));
    // Another session, whose edit waits for the editor thread.
    let mut other = server.connect()?;
    other.hello("tab-b")?;
    let t = Instant::now();
    // The answer goes to the stuck connection first (the session's newest), then here.
    let r = same.run("op_same", revision, "lamp")?;
    let same_took = t.elapsed();
    assert_eq!(types(&r), ["accepted", "result"], "{r:?}");
    let t = Instant::now();
    let r = other.run("op_other", revision + 1, "chair")?;
    let other_took = t.elapsed();
    assert_eq!(types(&r), ["accepted", "result"], "{r:?}");
    assert!(
        same_took < Duration::from_secs(5) && other_took < Duration::from_secs(5),
        "the answers waited for the stuck client: {same_took:?} and {other_took:?}"
    );
    drop(flood.join());
    Ok(())
}
