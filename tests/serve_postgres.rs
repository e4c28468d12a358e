//! The editor service on PostgreSQL (issue 26): several real `opjournal serve --postgres`
//! processes on one private server ([`PgCluster::start_or_skip`]; without PostgreSQL a test
//! passes after one line on stderr, unless `OPJOURNAL_PG_REQUIRED=1`), driven over loopback
//! by a raw socket client that speaks the JSON Lines of docs/protocol.md by hand. A
//! client's retry lands on another process; the claims are the protocol's guarantees.
//!
//! What the document holds is read from its tables with `psql`, independently of the
//! service: `opjournal_scene_applied.times` counts how often an operation's edit was
//! applied, so an edit applied twice shows as 2.
#![cfg(all(feature = "cli", feature = "postgres"))]

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use opjournal_testkit::pg::PgCluster;
use serde_json::{Value, json};

type TestResult = Result<(), Box<dyn std::error::Error>>;
type Res<T> = Result<T, Box<dyn std::error::Error>>;

const WAIT: Duration = Duration::from_secs(30);

/// The journal and document name every test uses (each test has its own server).
const NAME: &str = "editor";

/// An `opjournal serve --postgres` process on a port chosen by the system; killed when
/// dropped. Its stderr lines are forwarded to the test's stderr and kept for
/// [`Server::wait_note`].
struct Server {
    child: Child,
    addr: SocketAddr,
    notes: Receiver<String>,
}

impl Server {
    fn start(pg: &PgCluster, args: &[&str]) -> Res<Server> {
        let mut child = Command::new(env!("CARGO_BIN_EXE_opjournal"))
            .arg("serve")
            .args(["--postgres", &pg.url(), "--journal", NAME, "--port", "0"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let stderr = child.stderr.take().ok_or("no stderr")?;
        let (tx, notes) = channel();
        let pid = child.id();
        thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[serve {pid}] {line}");
                let _ = tx.send(line);
            }
        });
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        // The documented first line: `listening on 127.0.0.1:PORT`.
        let addr = line
            .trim_end()
            .strip_prefix("listening on ")
            .ok_or_else(|| format!("unexpected first line {line:?}"))?
            .parse()?;
        Ok(Server { child, addr, notes })
    }

    fn connect(&self) -> std::io::Result<Raw> {
        Raw::connect(self.addr)
    }

    /// Waits for a line on stderr containing `needle`.
    fn wait_note(&self, needle: &str) -> Res<String> {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .notes
                .recv_timeout(left)
                .map_err(|_| format!("no line with {needle:?} on the service's stderr"))?;
            if line.contains(needle) {
                return Ok(line);
            }
        }
    }

    /// `kill -9`, and waits for the process to be gone.
    fn kill9(&mut self) -> TestResult {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
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
        self.stream.write_all(format!("{msg}\n").as_bytes())
    }

    /// The next message; `Value::Null` when the service closed the connection.
    fn recv(&mut self) -> Res<Value> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => Ok(Value::Null),
            Ok(_) => Ok(serde_json::from_str(&line)?),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Ok(Value::Null),
            Err(e) => Err(e.into()),
        }
    }

    /// `hello`, then the welcome and the results it announces.
    fn hello(&mut self, session: &str) -> Res<(Value, Vec<Value>)> {
        self.send(&json!({"type": "hello", "session": session}))?;
        let welcome = self.recv()?;
        if welcome["type"] != "welcome" {
            return Err(format!("expected a welcome, got {welcome}").into());
        }
        let n = welcome["pushing"].as_u64().ok_or("no `pushing`")?;
        let mut pushed = Vec::new();
        for _ in 0..n {
            pushed.push(self.recv()?);
        }
        Ok((welcome, pushed))
    }

    /// The document's revision, as `welcome` says it.
    fn revision(&mut self, session: &str) -> Res<u64> {
        let (welcome, _) = self.hello(session)?;
        welcome["revision"]
            .as_u64()
            .ok_or_else(|| format!("no revision in {welcome}").into())
    }

    /// Submits and reads until the operation's final answer (`result`, `released`,
    /// `rejected` or an `error`), returning every message read.
    fn run(&mut self, id: &str, base: u64, object: &str) -> Res<Vec<Value>> {
        self.send(&submit(id, base, object))?;
        self.until_final(id)
    }

    fn until_final(&mut self, id: &str) -> Res<Vec<Value>> {
        let mut seen = Vec::new();
        loop {
            let m = self.recv()?;
            let done = m.is_null()
                || (m["id"] == id
                    && matches!(
                        m["type"].as_str(),
                        Some("result" | "released" | "rejected" | "error" | "in_doubt")
                    ));
            seen.push(m);
            if done {
                return Ok(seen);
            }
        }
    }

    fn status(&mut self, id: &str) -> Res<Value> {
        self.send(&json!({"type": "status", "id": id}))?;
        self.recv()
    }
}

fn submit(id: &str, base: u64, object: &str) -> Value {
    json!({
        "type": "submit", "id": id, "base_revision": base,
        "edit": {"kind": "add", "object": object, "beside": "door"},
    })
}

fn types(msgs: &[Value]) -> Vec<&str> {
    msgs.iter()
        .map(|m| m["type"].as_str().unwrap_or("?"))
        .collect()
}

/// The last message (the final answer of [`Raw::run`]).
fn last(msgs: &[Value]) -> &Value {
    msgs.last().unwrap_or(&Value::Null)
}

// ---------------------------------------------------------------------------------------
// The document, read from its tables

/// Operation id -> (revision, times applied), from `opjournal_scene_applied`.
fn applied(pg: &PgCluster) -> Res<BTreeMap<String, (u64, u32)>> {
    let out = pg.psql(&format!(
        "SELECT op, revision, times FROM opjournal_scene_applied WHERE document = '{NAME}' ORDER BY op"
    ))?;
    let mut map = BTreeMap::new();
    for line in out.lines().filter(|l| !l.is_empty()) {
        let cols: Vec<&str> = line.split('|').collect();
        let [op, revision, times] = cols[..] else {
            return Err(format!("unexpected row {line:?}").into());
        };
        map.insert(op.to_string(), (revision.parse()?, times.parse()?));
    }
    Ok(map)
}

/// The document's objects, from `opjournal_scene_objects`.
fn objects(pg: &PgCluster) -> Res<BTreeSet<String>> {
    let out = pg.psql(&format!(
        "SELECT name FROM opjournal_scene_objects WHERE document = '{NAME}'"
    ))?;
    Ok(out
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect())
}

/// The document's revision, from `opjournal_scene_documents`.
fn revision(pg: &PgCluster) -> Res<u64> {
    Ok(pg
        .psql(&format!(
            "SELECT revision FROM opjournal_scene_documents WHERE name = '{NAME}'"
        ))?
        .trim()
        .parse()?)
}

/// Every process answers the same revision in `welcome` and the same `status` for `ids`.
fn all_agree(servers: &[&Server], ids: &[String], want_revision: u64) -> TestResult {
    let mut answers: Vec<Vec<Value>> = Vec::new();
    for (i, s) in servers.iter().enumerate() {
        let mut c = s.connect()?;
        assert_eq!(
            c.revision(&format!("observer-{i}"))?,
            want_revision,
            "process {i} reports the document's revision"
        );
        let mut statuses = Vec::new();
        for id in ids {
            let st = c.status(id)?;
            assert_eq!(st["type"], "status", "{st}");
            // Deliveries are committed lazily, per process: compare what the document and
            // the outcome say.
            statuses.push(json!({"state": st["state"], "revision": st["revision"]}));
        }
        answers.push(statuses);
    }
    for (i, a) in answers.iter().enumerate().skip(1) {
        assert_eq!(
            a, &answers[0],
            "process {i} and process 0 report the same operations"
        );
    }
    Ok(())
}

/// One client of claim 3: submits every id of `order` until it has its result, following
/// the protocol's rules (a `stale_base` learns the revision and sends the same id again:
/// nothing was recorded).
fn client_run(
    addr: SocketAddr,
    k: usize,
    order: &[String],
    results: &Mutex<Vec<(String, Value)>>,
) -> Res<usize> {
    let session = format!("client-{k}");
    let mut c = Raw::connect(addr)?;
    let mut base = c.revision(&session)?;
    let mut accepted = 0;
    for id in order {
        let object = format!("o{id}");
        let mut tries = 0;
        loop {
            tries += 1;
            if tries > 200 {
                return Err(format!("{session}: {id} never finished").into());
            }
            let msgs = c.run(id, base, &object)?;
            accepted += types(&msgs).iter().filter(|t| **t == "accepted").count();
            let m = last(&msgs);
            match (m["type"].as_str(), m["kind"].as_str()) {
                (Some("result"), _) => {
                    base = base.max(m["revision"].as_u64().ok_or("no revision")?);
                    results
                        .lock()
                        .map_err(|_| "poisoned")?
                        .push((id.clone(), m.clone()));
                    break;
                }
                (Some("error"), Some("stale_base")) => base = c.revision(&session)?,
                (Some("error"), Some("scope_busy" | "unavailable")) => {
                    thread::sleep(Duration::from_millis(5));
                }
                _ => return Err(format!("{session}: {id} answered {m}").into()),
            }
        }
    }
    Ok(accepted)
}

// ---------------------------------------------------------------------------------------
// Claims

/// Claim 1: the reply to an edit is lost with the connection to process A (A committed the
/// edit and its receipt, and is held there before replying); the retry with the same id on
/// process B answers the recorded result, a replay at the same revision, and the document
/// holds the edit once, as every process reports.
#[test]
fn an_edit_whose_reply_was_lost_on_one_process_is_replayed_by_another_and_applied_once()
-> TestResult {
    let Some(pg) = PgCluster::start_or_skip() else {
        return Ok(());
    };
    let a = Server::start(&pg, &["--fault-hold", "committed"])?;
    let b = Server::start(&pg, &[])?;
    let c = Server::start(&pg, &[])?;

    let mut on_a = a.connect()?;
    assert_eq!(on_a.revision("tab")?, 0);
    on_a.send(&submit("op_1", 0, "light"))?;
    a.wait_note("`op_1` is held at Committed")?;
    drop(on_a); // the connection drops before any reply

    let mut on_b = b.connect()?;
    let (welcome, pushed) = on_b.hello("tab")?;
    assert_eq!(welcome["revision"], 1, "B reads the document A changed");
    // The result was never delivered: the session's reconnect is pushed it, as a replay.
    assert_eq!(types(&pushed), ["result"], "{pushed:?}");
    assert_eq!(pushed[0]["id"], "op_1");
    assert_eq!(pushed[0]["replayed"], true);
    assert_eq!(pushed[0]["revision"], 1);
    let retry = on_b.run("op_1", 0, "light")?;
    assert_eq!(
        types(&retry),
        ["result"],
        "no `accepted`: nothing ran again: {retry:?}"
    );
    assert_eq!(last(&retry)["replayed"], true);
    assert_eq!(last(&retry)["revision"], 1, "the same result revision");
    assert_eq!(last(&retry)["outcome"], "applied");

    assert_eq!(
        applied(&pg)?.get("op_1"),
        Some(&(1, 1)),
        "applied once, at revision 1"
    );
    assert_eq!(revision(&pg)?, 1);
    assert!(objects(&pg)?.contains("light"));
    all_agree(&[&a, &b, &c], &["op_1".to_string()], 1)
}

/// Claim 3: clients on three processes submit overlapping operation ids concurrently (each
/// id is sent by every client, in a different order). Each edit is applied exactly once (one
/// `accepted` and one fresh result per id, `times` 1 in the document), the revisions the
/// ids produced are 1..=N without a gap or a repeat, and all processes agree.
#[test]
fn overlapping_ids_on_three_processes_are_each_applied_once_with_gapless_revisions() -> TestResult {
    let Some(pg) = PgCluster::start_or_skip() else {
        return Ok(());
    };
    const IDS: usize = 24;
    const CLIENTS: usize = 6;
    let servers: Vec<Server> = (0..3)
        .map(|_| Server::start(&pg, &[]))
        .collect::<Result<_, _>>()?;
    let ids: Vec<String> = (0..IDS).map(|i| format!("op_{i:02}")).collect();
    let results = Arc::new(Mutex::new(Vec::<(String, Value)>::new()));
    let mut accepted = 0usize;
    thread::scope(|scope| -> TestResult {
        let mut handles = Vec::new();
        for k in 0..CLIENTS {
            let addr = servers[k % servers.len()].addr;
            let order: Vec<String> = ids
                .iter()
                .cycle()
                .skip(k * IDS / CLIENTS)
                .take(IDS)
                .cloned()
                .collect();
            let results = results.clone();
            handles.push(
                scope.spawn(move || {
                    client_run(addr, k, &order, &results).map_err(|e| e.to_string())
                }),
            );
        }
        for h in handles {
            accepted += h.join().map_err(|_| "a client panicked")??;
        }
        Ok(())
    })?;

    let results = results.lock().map_err(|_| "poisoned")?;
    assert_eq!(
        results.len(),
        IDS * CLIENTS,
        "every client got a result for every id"
    );
    assert_eq!(
        accepted, IDS,
        "one `accepted` per id, across every client and process"
    );
    let mut revision_of: BTreeMap<&str, u64> = BTreeMap::new();
    let mut fresh: BTreeMap<&str, usize> = BTreeMap::new();
    for (id, m) in results.iter() {
        assert_eq!(m["outcome"], "applied", "{m}");
        let rev = m["revision"].as_u64().ok_or("no revision")?;
        let seen = *revision_of.entry(id).or_insert(rev);
        assert_eq!(
            seen, rev,
            "every copy of {id}'s result has the same revision"
        );
        if m["replayed"] == false {
            *fresh.entry(id).or_default() += 1;
        }
    }
    for id in &ids {
        assert_eq!(
            fresh.get(id.as_str()),
            Some(&1),
            "{id} executed exactly once"
        );
    }
    let revisions: BTreeSet<u64> = revision_of.values().copied().collect();
    let want: BTreeSet<u64> = (1..=IDS as u64).collect();
    assert_eq!(
        revisions, want,
        "revisions strictly increasing, no gap, no repeat"
    );

    let stored = applied(&pg)?;
    assert_eq!(stored.len(), IDS);
    for (op, (rev, times)) in &stored {
        assert_eq!(*times, 1, "{op} applied once in the document");
        assert_eq!(Some(rev), revision_of.get(op.as_str()), "{op}'s revision");
    }
    assert_eq!(revision(&pg)?, IDS as u64);
    assert_eq!(
        objects(&pg)?.len(),
        3 + IDS,
        "the starter's 3 objects and one per edit"
    );
    let refs: Vec<&Server> = servers.iter().collect();
    all_agree(&refs, &ids, IDS as u64)
}

/// Claim 4: a process killed (`kill -9`) in the middle of an edit, at each step (after the
/// admission, after the document's change, after the commit), leaves nothing in doubt: the
/// retry on another process answers a fresh execution (`accepted`, then the result) when
/// the process died before its commit, or a replay when it died after; the edit is in the
/// document once.
#[test]
fn a_process_killed_mid_edit_leaves_nothing_in_doubt_and_the_retry_elsewhere_applies_it_once()
-> TestResult {
    let Some(pg) = PgCluster::start_or_skip() else {
        return Ok(());
    };
    let b = Server::start(&pg, &[])?;
    let mut want_revision = 0;
    for (step, held, committed) in [
        ("accepted", "Accepted", false),
        ("mutated", "Mutated", false),
        ("committed", "Committed", true),
    ] {
        let mut a = Server::start(&pg, &["--fault-hold", step])?;
        let id = format!("op_{step}");
        let session = format!("tab-{step}");
        let mut on_a = a.connect()?;
        assert_eq!(on_a.revision(&session)?, want_revision);
        on_a.send(&submit(&id, want_revision, &id))?;
        a.wait_note(&format!("`{id}` is held at {held}"))?;
        a.kill9()?;

        let mut on_b = b.connect()?;
        let (_, pushed) = on_b.hello(&session)?;
        let st = on_b.status(&id)?;
        let state = if committed { "applied" } else { "unknown" };
        assert_eq!(st["state"], state, "killed after `{step}`: {st}");
        let retry = on_b.run(&id, want_revision, &id)?;
        want_revision += 1;
        let answer = last(&retry);
        assert_eq!(answer["type"], "result", "killed after `{step}`: {retry:?}");
        assert_eq!(answer["revision"], want_revision);
        if committed {
            assert_eq!(types(&retry), ["result"], "{retry:?}");
            assert_eq!(answer["replayed"], true);
            assert_eq!(
                types(&pushed),
                ["result"],
                "the undelivered result is pushed"
            );
        } else {
            assert_eq!(types(&retry), ["accepted", "result"], "{retry:?}");
            assert_eq!(answer["replayed"], false, "a fresh execution");
            assert!(pushed.is_empty(), "{pushed:?}");
        }
        let st = on_b.status(&id)?;
        assert_eq!(st["state"], "applied", "{st}");
        let history: Vec<&str> = st["history"]
            .as_array()
            .ok_or("no history")?
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(
            !history.iter().any(|h| h.starts_with("in_doubt")),
            "never in doubt: {history:?}"
        );
        assert_eq!(
            applied(&pg)?.get(&id),
            Some(&(want_revision, 1)),
            "{id} applied once"
        );
        assert_eq!(revision(&pg)?, want_revision);
    }
    Ok(())
}

/// Claim 5: the base-revision check holds across processes: an edit on a base that another
/// process's edit moved past is refused `stale_base` and changes nothing, as on a file; on
/// the current base it applies.
#[test]
fn a_base_that_another_process_moved_past_is_refused_stale_base() -> TestResult {
    let Some(pg) = PgCluster::start_or_skip() else {
        return Ok(());
    };
    let a = Server::start(&pg, &[])?;
    let b = Server::start(&pg, &[])?;
    let mut on_a = a.connect()?;
    let mut on_b = b.connect()?;
    assert_eq!(on_a.revision("tab-a")?, 0);
    assert_eq!(on_b.revision("tab-b")?, 0);
    let first = on_a.run("op_a", 0, "light")?;
    assert_eq!(types(&first), ["accepted", "result"], "{first:?}");
    assert_eq!(last(&first)["revision"], 1);

    let stale = on_b.run("op_b", 0, "lamp")?;
    assert_eq!(types(&stale), ["error"], "{stale:?}");
    assert_eq!(last(&stale)["kind"], "stale_base", "{stale:?}");
    assert_eq!(on_b.status("op_b")?["state"], "unknown", "nothing recorded");
    assert_eq!(revision(&pg)?, 1);
    assert!(!applied(&pg)?.contains_key("op_b"));
    assert!(!objects(&pg)?.contains("lamp"));

    assert_eq!(on_b.revision("tab-b")?, 1, "B reads the revision A made");
    let fresh = on_b.run("op_b2", 1, "lamp")?;
    assert_eq!(types(&fresh), ["accepted", "result"], "{fresh:?}");
    assert_eq!(last(&fresh)["revision"], 2);
    let stale_on_a = on_a.run("op_c", 1, "rug")?;
    assert_eq!(last(&stale_on_a)["kind"], "stale_base", "{stale_on_a:?}");
    assert_eq!(revision(&pg)?, 2);
    Ok(())
}
