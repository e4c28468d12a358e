//! The scripted session of `opjournal demo`: one agent client and one editor service over
//! a real loopback socket, with the client disconnecting at every boundary of the failure
//! window, plus a reused id, a crash while an edit runs, and a result that ages out.
//!
//! The client closes its socket at the exact moment without telling the service; the
//! service's [`Pauses`](opjournal::service::Pauses) hold an operation at a given step so that
//! moment is reproducible. A manual clock skips the waits (acknowledgement timeout,
//! retention) so the whole session takes a few seconds, with the journal's default
//! durations.

use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use opjournal::service::{
    Document, Edit, JournalOpener, Reply, Request, ResultMsg, SCOPE, Service, ServiceConfig,
    ServiceError, Stage, StatusMsg, Verdict, describe_reconciled,
};
use opjournal::{Clock, Journal, ManualClock, RetryPolicy, SystemClock};
use serde::Serialize;

use super::client::{Backoff, Client, ClientError, submit_request};
use super::transcript::{Row, Transcript, Who};

/// The client session.
pub(crate) const SESSION: &str = "agent-1";
/// How long any single wait may take before the demo gives up.
const WAIT: Duration = Duration::from_secs(10);
/// Reconnects in the storm, and the demo time between two of them.
const RELOADS: u32 = 20;
const RELOAD_EVERY: Duration = Duration::from_secs(30);
/// The demo time skipped past the acknowledgement timeout (15 min by default).
const ACK_WAIT: Duration = Duration::from_secs(16 * 60);
/// The demo time skipped past the result retention (7 days by default).
const AGE_WAIT: Duration = Duration::from_secs(8 * 24 * 3600);

/// Where the demo clock starts: as far in the past as the session skips ahead (and a
/// minute more), so that it ends just before the real time and the journal it leaves
/// holds no timestamp in the future.
fn demo_start() -> opjournal::Timestamp {
    let skipped = ACK_WAIT + RELOAD_EVERY * RELOADS + AGE_WAIT + Duration::from_secs(60);
    let now = SystemClock.now().as_millis();
    let back = u64::try_from(skipped.as_millis()).unwrap_or(u64::MAX);
    opjournal::Timestamp::from_millis(now.saturating_sub(back))
}

/// Why the session could not run.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DemoError {
    #[error("the client failed")]
    Client(#[from] ClientError),
    #[error("the editor service failed")]
    Service(#[from] ServiceError),
    #[error("could not {what}")]
    Journal {
        what: String,
        #[source]
        source: opjournal::Error,
    },
    #[error("could not {what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "`{}` already exists: the demo needs a new journal and document; remove it or pick another `--journal` path",
        path.display()
    )]
    Exists { path: PathBuf },
    #[error("expected {expected} from the service, got: {got}")]
    Unexpected { expected: String, got: String },
}

fn journal_err(what: &str) -> impl FnOnce(opjournal::Error) -> DemoError + '_ {
    move |source| DemoError::Journal {
        what: what.to_string(),
        source,
    }
}

/// Where the session writes.
pub(crate) struct Paths {
    pub journal: PathBuf,
    pub document: PathBuf,
}

impl Paths {
    /// The editor's files: the document snapshot, its edit log, its temporary file.
    pub(crate) fn document_files(&self) -> [PathBuf; 3] {
        [
            self.document.clone(),
            self.document.with_extension("log"),
            self.document.with_extension("tmp"),
        ]
    }
}

/// What the reconnect storm left behind: the numbers that must stay bounded.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct Storm {
    pub reloads: u32,
    /// Results pushed again over all reconnects.
    pub pushes: usize,
    /// The journal's retry budget: deliveries of one result before pushes stop.
    pub budget: u32,
    /// Open connections at the service after the storm.
    pub connections: usize,
    /// Unacknowledged results of the session after the storm.
    pub waiting: usize,
    pub events_before: u64,
    pub events_after: u64,
    pub file_bytes_before: u64,
    pub file_bytes_after: u64,
}

/// What the session did.
pub(crate) struct Report {
    pub rows: Vec<Row>,
    pub document: Document,
    /// Operation ids in the order they were first submitted.
    pub ops: Vec<String>,
    /// Every result the client received.
    pub results: Vec<ResultMsg>,
    pub storm: Storm,
    /// Journal facts at the end.
    pub operations: u64,
    pub events: u64,
    pub file_bytes: u64,
    pub elapsed: Duration,
}

struct Session<'t> {
    svc: Service,
    client: Client,
    /// The retry rule's backoff, kept across operations.
    backoff: Backoff,
    clock: ManualClock,
    out: &'t mut Transcript,
    notes: Arc<Mutex<Vec<String>>>,
    rows: Vec<Row>,
    ops: Vec<String>,
    results: Vec<ResultMsg>,
}

/// Runs the whole session.
pub(crate) fn run(paths: &Paths, out: &mut Transcript) -> Result<Report, DemoError> {
    let started = Instant::now();
    let clock = ManualClock::new(demo_start());
    let retry = RetryPolicy::default();
    let open: JournalOpener = {
        let clock = clock.clone();
        let path = paths.journal.clone();
        // Default durations; only the clock is the demo's, so it can skip the waits.
        Box::new(move || {
            Journal::builder()
                .clock(clock.clone())
                .retry_policy(retry)
                .open(&path)
        })
    };
    let notes = Arc::new(Mutex::new(Vec::new()));
    let sink = notes.clone();
    let mut cfg = ServiceConfig::new(paths.document.clone());
    cfg.notes = Box::new(move |note| {
        sink.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(note)
    });
    let listener = TcpListener::bind(("127.0.0.1", 0)).map_err(|source| DemoError::Io {
        what: "listen on a loopback port".into(),
        source,
    })?;
    let svc = Service::start(listener, open, cfg)?;
    let client = Client::new(svc.addr(), SESSION, WAIT);
    let mut s = Session {
        svc,
        client,
        backoff: Backoff::new(SESSION),
        clock,
        out,
        notes,
        rows: Vec::new(),
        ops: Vec::new(),
        results: Vec::new(),
    };
    s.out
        .text("opjournal demo: an editor service and an agent client over a real loopback socket");
    s.intro(paths)?;
    s.before_acceptance()?;
    s.after_acceptance()?;
    s.after_commit()?;
    s.after_delivery()?;
    s.never_acknowledged()?;
    let storm = s.reconnect_storm()?;
    s.same_id_other_edit()?;
    s.crash_while_running()?;
    s.result_aged_out()?;
    s.flush_notes();
    let journal = s.svc.journal()?;
    let stats = journal
        .stats()
        .map_err(journal_err("read the journal's stats"))?;
    drop(journal);
    let document = s.svc.document();
    s.svc.shutdown()?;
    // The size of the file left behind: closing checkpoints the log into it and trims its
    // end, so the open journal's figure is not it.
    let file_bytes = std::fs::metadata(&paths.journal).map_or(stats.file_bytes, |m| m.len());
    Ok(Report {
        rows: s.rows,
        document,
        ops: s.ops,
        results: s.results,
        storm,
        operations: stats.operations,
        events: stats.events,
        file_bytes,
        elapsed: started.elapsed(),
    })
}

fn unexpected(expected: impl Into<String>, got: &Reply) -> DemoError {
    DemoError::Unexpected {
        expected: expected.into(),
        got: serde_json::to_string(got).unwrap_or_else(|_| format!("{got:?}")),
    }
}

fn revision(r: &ResultMsg) -> String {
    r.revision
        .map_or_else(|| "?".to_string(), |rev| rev.to_string())
}

fn add(object: &str, beside: &str) -> Edit {
    Edit::Add {
        object: object.into(),
        beside: beside.into(),
    }
}

fn rename(from: &str, to: &str) -> Edit {
    Edit::Rename {
        from: from.into(),
        to: to.into(),
    }
}

impl Session<'_> {
    fn say(&mut self, who: Who, text: impl AsRef<str>) {
        self.out.line(who, text.as_ref());
    }

    /// Prints what the service noted on its own (errors it could only log).
    fn flush_notes(&mut self) {
        let notes: Vec<String> =
            std::mem::take(&mut *self.notes.lock().unwrap_or_else(PoisonError::into_inner));
        for n in notes {
            self.say(Who::Editor, n);
        }
    }

    fn heading(&mut self, key: &str, title: &str) {
        self.flush_notes();
        self.out.heading(key, title);
    }

    fn note_op(&mut self, id: &str) {
        if !self.ops.iter().any(|o| o == id) {
            self.ops.push(id.to_string());
        }
    }

    /// The next message from the service, printed in words.
    fn recv(&mut self, quiet: bool) -> Result<Reply, DemoError> {
        let reply = self.client.recv()?;
        let words = self.client.words(&reply);
        if let Reply::Result(r) = &reply {
            self.results.push(r.clone());
        }
        self.out.answer(&words, &reply, quiet);
        Ok(reply)
    }

    fn expect_result(&mut self, id: &str, quiet: bool) -> Result<ResultMsg, DemoError> {
        match self.recv(quiet)? {
            Reply::Result(r) if r.id == id => Ok(r),
            other => Err(unexpected(format!("the result of {id}"), &other)),
        }
    }

    fn expect_accepted(&mut self, id: &str) -> Result<(), DemoError> {
        match self.recv(false)? {
            Reply::Accepted { id: got, .. } if got == id => Ok(()),
            other => Err(unexpected(format!("{id} accepted"), &other)),
        }
    }

    /// Connects and reads the welcome and every pushed result.
    fn connect(&mut self, quiet: bool) -> Result<Vec<ResultMsg>, DemoError> {
        let welcome = self.client.connect()?;
        let words = self.client.words(&welcome);
        self.out.answer(&words, &welcome, quiet);
        let Reply::Welcome { pushing, .. } = welcome else {
            return Err(unexpected("a welcome", &welcome));
        };
        let mut pushed = Vec::new();
        for _ in 0..pushing {
            match self.recv(quiet)? {
                Reply::Result(r) => pushed.push(r),
                other => return Err(unexpected("a pushed result", &other)),
            }
        }
        Ok(pushed)
    }

    /// Closes the socket and waits until the service has noticed.
    fn disconnect(&mut self) -> Result<(), DemoError> {
        self.client.close();
        self.svc.wait_disconnected(SESSION, WAIT)?;
        Ok(())
    }

    fn submit(&mut self, id: &str, edit: &Edit) -> Result<(), DemoError> {
        self.note_op(id);
        self.client.submit(id, edit)?;
        Ok(())
    }

    /// Submits a new operation and waits for its result, following the retry rule of
    /// docs/protocol.md: after `scope_busy`, back off (full jitter), say `hello` to learn
    /// the revision, and submit the same id again if it did not move; after `stale_base`
    /// (or a moved revision), submit the edit again with a new id on the new revision.
    fn run_op(&mut self, id: &str, edit: &Edit) -> Result<ResultMsg, DemoError> {
        let base_id = id.to_string();
        let mut id = base_id.clone();
        for attempt in 1..=20 {
            self.submit(&id, edit)?;
            let before = self.client.revision;
            let moved = match self.recv(false)? {
                Reply::Accepted { id: got, .. } if got == id => {
                    self.backoff.succeeded();
                    return self.expect_result(&id, false);
                }
                Reply::Error { kind, .. } if kind == "scope_busy" => {
                    let delay = self.backoff.next_delay();
                    self.say(
                        Who::Client,
                        format!(
                            "waits {} ms (backoff with jitter), then asks for the revision",
                            delay.as_millis()
                        ),
                    );
                    std::thread::sleep(delay);
                    self.connect(false)?;
                    self.client.revision != before
                }
                Reply::Error { kind, .. } if kind == "stale_base" => {
                    self.say(
                        Who::Client,
                        "says hello again to learn the document's revision",
                    );
                    self.connect(false)?;
                    true
                }
                other => return Err(unexpected(format!("{id} accepted"), &other)),
            };
            if moved {
                id = format!("{base_id}-r{attempt}");
                self.say(
                    Who::Client,
                    format!("the document moved: submits the edit again as {id}"),
                );
            }
        }
        Err(DemoError::Unexpected {
            expected: format!("{id} accepted within 20 attempts"),
            got: "refusals only".into(),
        })
    }

    fn ack(&mut self, id: &str) -> Result<(), DemoError> {
        self.say(Who::Client, format!("acknowledges {id}"));
        self.client.send(&Request::Ack { id: id.into() })?;
        match self.recv(false)? {
            Reply::Acked { id: got, .. } if got == id => Ok(()),
            other => Err(unexpected(format!("{id} acknowledged"), &other)),
        }
    }

    fn status(&mut self, id: &str) -> Result<StatusMsg, DemoError> {
        self.client.send(&Request::Status { id: id.into() })?;
        match self.recv(false)? {
            Reply::Status(s) if s.id == id => Ok(s),
            other => Err(unexpected(format!("the status of {id}"), &other)),
        }
    }

    fn compact(&mut self) -> Result<opjournal::CompactionReport, DemoError> {
        self.svc
            .journal()?
            .compact()
            .map_err(journal_err("run the journal's housekeeping"))
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "one table row, named at the call site"
    )]
    fn row(
        &mut self,
        key: &str,
        boundary: &str,
        op: &str,
        edit: &Edit,
        client_did: &str,
        service_answered: String,
        expected: usize,
    ) {
        let applied = self.svc.document().effects(op, edit);
        self.rows.push(Row {
            key: key.into(),
            boundary: boundary.into(),
            op: op.into(),
            edit: edit.describe(),
            client_did: client_did.into(),
            service_answered,
            applied,
            expected,
        });
    }

    fn intro(&mut self, paths: &Paths) -> Result<(), DemoError> {
        let doc = self.svc.document();
        let addr = self.svc.addr();
        self.say(
            Who::Editor,
            format!(
                "listening on {addr}; {SCOPE} is at revision {}: {}",
                doc.revision(),
                doc.describe()
            ),
        );
        self.say(
            Who::Editor,
            format!(
                "journal {} (default durations; the demo's clock starts 8 days back and jumps ahead to skip the waits)",
                paths.journal.display()
            ),
        );
        self.say(Who::Client, format!("connects as {SESSION}"));
        self.connect(false)?;
        Ok(())
    }

    /// 1. The service never sees the request: a retry starts new work.
    fn before_acceptance(&mut self) -> Result<(), DemoError> {
        self.heading("1", "disconnect before the service accepts the operation");
        let edit = add("light", "door");
        self.say(
            Who::Client,
            format!(
                "sends half of `submit op_1` ({}), then closes its socket",
                edit.describe()
            ),
        );
        self.note_op("op_1");
        let torn = submit_request("op_1", self.client.revision, &edit);
        self.client.send_torn(&torn)?;
        self.svc.wait_disconnected(SESSION, WAIT)?;
        self.say(Who::Client, "reconnects and asks about op_1");
        self.connect(false)?;
        let status = self.status("op_1")?;
        self.say(Who::Client, "retries op_1 (same id, same edit)");
        let result = self.run_op("op_1", &edit)?;
        self.ack("op_1")?;
        self.row(
            "1",
            "before acceptance",
            "op_1",
            &edit,
            "half a request, closed; asked; retried",
            format!(
                "{}; then a new execution at rev {}",
                status.state,
                revision(&result)
            ),
            1,
        );
        Ok(())
    }

    /// 2. Accepted, not yet executed: the same id attaches to the running work.
    fn after_acceptance(&mut self) -> Result<(), DemoError> {
        self.heading("2", "disconnect after acceptance, before execution");
        let edit = add("plant", "window");
        self.svc.pauses().arm(Stage::Accepted);
        self.say(Who::Client, format!("submits op_2 ({})", edit.describe()));
        self.submit("op_2", &edit)?;
        self.expect_accepted("op_2")?;
        self.svc.pauses().wait_held(WAIT)?;
        self.say(
            Who::Editor,
            "op_2 is recorded as running; the editor has not applied the edit yet",
        );
        self.say(Who::Client, "closes its socket right after `accepted`");
        self.disconnect()?;
        self.say(Who::Client, "reconnects and sends op_2 again");
        self.connect(false)?;
        self.submit("op_2", &edit)?;
        match self.recv(false)? {
            Reply::Running { id, .. } if id == "op_2" => {}
            other => return Err(unexpected("op_2 running", &other)),
        }
        self.say(
            Who::Editor,
            "op_2 goes on: applies the edit, records the outcome, sends the result to agent-1's new connection",
        );
        self.svc.pauses().release(Verdict::Continue);
        let result = self.expect_result("op_2", false)?;
        self.ack("op_2")?;
        self.row(
            "2",
            "accepted, not executed",
            "op_2",
            &edit,
            "closed after `accepted`; resent op_2",
            format!(
                "running (attached); then its result at rev {}, delivery {}",
                revision(&result),
                result.delivery
            ),
            1,
        );
        Ok(())
    }

    /// 3. Committed, not delivered: reconnecting replays the result, not the edit.
    fn after_commit(&mut self) -> Result<(), DemoError> {
        self.heading(
            "3",
            "disconnect after the mutation commits, before the result is sent",
        );
        let edit = rename("light", "reading light");
        self.svc.pauses().arm(Stage::Committed);
        self.say(Who::Client, format!("submits op_3 ({})", edit.describe()));
        self.submit("op_3", &edit)?;
        self.expect_accepted("op_3")?;
        self.svc.pauses().wait_held(WAIT)?;
        let rev = self.svc.document().revision();
        self.say(
            Who::Editor,
            format!(
                "op_3 is applied (revision {rev}) and its outcome recorded; the result is about to be sent"
            ),
        );
        self.say(Who::Client, "closes its socket before the result arrives");
        self.disconnect()?;
        self.svc.pauses().release(Verdict::Continue);
        self.svc.wait_idle(WAIT)?;
        self.say(
            Who::Editor,
            "op_3's result finds no connection for agent-1: it waits in the journal",
        );
        self.say(Who::Client, "reconnects");
        let pushed = self.connect(false)?;
        let Some(result) = pushed.into_iter().find(|r| r.id == "op_3") else {
            return Err(DemoError::Unexpected {
                expected: "op_3's result pushed on reconnect".into(),
                got: "no push for op_3".into(),
            });
        };
        self.ack("op_3")?;
        self.row(
            "3",
            "committed, not delivered",
            "op_3",
            &edit,
            "closed before the result; reconnected",
            format!(
                "pushed on reconnect: replayed, delivery {}",
                result.delivery
            ),
            1,
        );
        Ok(())
    }

    /// 4. Delivered, not acknowledged: the repeat is harmless and recognizable.
    fn after_delivery(&mut self) -> Result<(), DemoError> {
        self.heading("4", "reload after delivery, before acknowledgement");
        let edit = add("chair", "table");
        self.say(Who::Client, format!("submits op_4 ({})", edit.describe()));
        self.run_op("op_4", &edit)?;
        self.say(
            Who::Client,
            "reloads before acknowledging: closes its socket and reconnects",
        );
        self.disconnect()?;
        let pushed = self.connect(false)?;
        let Some(push) = pushed.into_iter().find(|r| r.id == "op_4") else {
            return Err(DemoError::Unexpected {
                expected: "op_4's result pushed on reconnect".into(),
                got: "no push for op_4".into(),
            });
        };
        self.say(Who::Client, "the reloaded client sends op_4 again");
        self.submit("op_4", &edit)?;
        let again = self.expect_result("op_4", false)?;
        self.ack("op_4")?;
        self.row(
            "4",
            "delivered, not acked",
            "op_4",
            &edit,
            "reloaded; resent op_4",
            format!(
                "replays, marked: deliveries {} and {}",
                push.delivery, again.delivery
            ),
            1,
        );
        Ok(())
    }

    /// 5. Never acknowledged: later work proceeds; the expiry frees the slot; the audit
    ///    trail stays.
    fn never_acknowledged(&mut self) -> Result<(), DemoError> {
        self.heading("5", "never acknowledge");
        let edit = rename("chair", "armchair");
        self.say(
            Who::Client,
            format!(
                "submits op_5 ({}) and never acknowledges it",
                edit.describe()
            ),
        );
        self.run_op("op_5", &edit)?;
        let later = Edit::Delete {
            object: "plant".into(),
        };
        self.say(
            Who::Client,
            format!(
                "goes on with an independent edit: op_6 ({})",
                later.describe()
            ),
        );
        let later_result = self.run_op("op_6", &later)?;
        self.ack("op_6")?;
        self.say(Who::Client, "asks about op_5");
        self.status("op_5")?;
        self.clock.advance(ACK_WAIT);
        self.say(
            Who::Clock,
            format!(
                "+{} min: past op_5's acknowledgement timeout (15 min by default)",
                ACK_WAIT.as_secs() / 60
            ),
        );
        let swept = self.compact()?;
        self.say(
            Who::Editor,
            format!(
                "housekeeping: {} acknowledgement(s) expired",
                swept.ack_expired
            ),
        );
        self.say(Who::Client, "asks about op_5 again");
        let status = self.status("op_5")?;
        let waiting = self
            .svc
            .journal()?
            .undelivered(SESSION)
            .map_err(journal_err("list the session's unacknowledged results"))?
            .len();
        self.say(
            Who::Editor,
            format!("{SESSION} has {waiting} unacknowledged result(s): op_5's window slot is free"),
        );
        self.row(
            "5",
            "never acknowledged",
            "op_5",
            &edit,
            "never acked op_5; sent op_6",
            format!(
                "op_6 applied at rev {}; op_5 {} at 15 min, {} events kept",
                revision(&later_result),
                status.delivery.as_deref().unwrap_or("?").replace('_', " "),
                status.history.len()
            ),
            1,
        );
        Ok(())
    }

    /// 6. A reconnect storm: connections, queue, pushes and file stay bounded.
    fn reconnect_storm(&mut self) -> Result<Storm, DemoError> {
        self.heading("6", "reconnect again and again during a long session");
        let edit = add("rug", "table");
        self.say(
            Who::Client,
            format!(
                "submits op_7 ({}); its acknowledgement never gets through",
                edit.describe()
            ),
        );
        self.run_op("op_7", &edit)?;
        let journal = self.svc.journal()?;
        journal
            .flush()
            .map_err(journal_err("commit the deliveries"))?;
        let before = journal
            .stats()
            .map_err(journal_err("read the journal's stats"))?;
        drop(journal);
        self.say(
            Who::Client,
            format!(
                "reloads {RELOADS} times, {}s apart, acknowledging nothing",
                RELOAD_EVERY.as_secs()
            ),
        );
        let mut pushes: Vec<(u32, u32)> = Vec::new();
        for reload in 1..=RELOADS {
            self.clock.advance(RELOAD_EVERY);
            self.disconnect()?;
            for r in self.connect(true)? {
                pushes.push((reload, r.delivery));
            }
        }
        let budget = RetryPolicy::default().attempts;
        match (pushes.first(), pushes.last()) {
            (Some(&(r0, d0)), Some(&(r1, d1))) => self.say(
                Who::Answer,
                format!(
                    "reloads {r0}-{r1}: op_7 pushed again each time (replayed, deliveries {d0}-{d1}), recognized as a duplicate each time"
                ),
            ),
            _ => self.say(Who::Answer, "no reload pushed anything"),
        }
        let quiet_from = pushes.last().map_or(1, |&(r, _)| r + 1);
        if quiet_from <= RELOADS {
            self.say(
                Who::Answer,
                format!(
                    "reloads {quiet_from}-{RELOADS}: nothing pushed: op_7 has been delivered {budget} times, its whole retry budget"
                ),
            );
        }
        let journal = self.svc.journal()?;
        // Deliveries commit lazily: commit them, so the counts below include them.
        journal
            .flush()
            .map_err(journal_err("commit the deliveries"))?;
        let after = journal
            .stats()
            .map_err(journal_err("read the journal's stats"))?;
        // Unacknowledged results, including one whose retry budget is spent (no longer
        // pushed on reconnect, but still waiting for its acknowledgement).
        let waiting = (after.pending + after.delivered + after.exhausted) as usize;
        drop(journal);
        let storm = Storm {
            reloads: RELOADS,
            pushes: pushes.len(),
            budget,
            connections: self.svc.connections(),
            waiting,
            events_before: before.events,
            events_after: after.events,
            file_bytes_before: before.file_bytes,
            file_bytes_after: after.file_bytes,
        };
        self.say(
            Who::Editor,
            format!(
                "after {RELOADS} reconnects: {} open connection(s), {} unacknowledged result(s) for {SESSION}, {} pushes in all; journal +{} events, file {} -> {}",
                storm.connections,
                storm.waiting,
                storm.pushes,
                storm.events_after.saturating_sub(storm.events_before),
                kib(storm.file_bytes_before),
                kib(storm.file_bytes_after)
            ),
        );
        self.say(Who::Client, "asks about op_7");
        self.status("op_7")?;
        self.ack("op_7")?;
        self.row(
            "6",
            "reconnect storm",
            "op_7",
            &edit,
            &format!("{RELOADS} reloads, never acked"),
            format!(
                "{} pushes, then none; {} connection, {} waiting",
                storm.pushes, storm.connections, storm.waiting
            ),
            1,
        );
        Ok(storm)
    }

    /// The same id with a different intent is refused.
    fn same_id_other_edit(&mut self) -> Result<(), DemoError> {
        self.heading("+", "the same id for a different edit");
        let edit = add("lamp", "door");
        self.say(
            Who::Client,
            format!(
                "sends op_2 again, but for a different edit: {}",
                edit.describe()
            ),
        );
        self.client.submit("op_2", &edit)?;
        let refused = match self.recv(false)? {
            Reply::Error {
                id: Some(id), kind, ..
            } if id == "op_2" => kind,
            other => return Err(unexpected("op_2 refused", &other)),
        };
        self.row(
            "+",
            "same id, other edit",
            "op_2",
            &edit,
            "reused op_2 for another edit",
            format!("refused: {}", refused.replace('_', " ")),
            0,
        );
        Ok(())
    }

    /// The service dies between applying an edit and recording it: in doubt on reopen,
    /// resolved by looking at the document.
    fn crash_while_running(&mut self) -> Result<(), DemoError> {
        self.heading("+", "the service crashes while an operation runs");
        let edit = add("lamp", "armchair");
        self.svc.pauses().arm(Stage::Mutated);
        self.say(Who::Client, format!("submits op_8 ({})", edit.describe()));
        self.submit("op_8", &edit)?;
        self.expect_accepted("op_8")?;
        self.svc.pauses().wait_held(WAIT)?;
        let rev = self.svc.document().revision();
        self.say(
            Who::Editor,
            format!(
                "op_8's edit is saved in the document (revision {rev}) but its outcome is not recorded yet: the editor process dies here"
            ),
        );
        let reconciled = self.svc.restart(WAIT)?;
        let doc = self.svc.document();
        self.say(
            Who::Editor,
            format!(
                "editor restarted: document reloaded at revision {}; journal reopened, {} operation(s) in doubt",
                doc.revision(),
                reconciled.len()
            ),
        );
        for r in &reconciled {
            self.say(Who::Editor, describe_reconciled(r));
        }
        match self.client.recv() {
            Err(ClientError::Closed) => {
                self.say(Who::Answer, "the connection dropped: the service went away")
            }
            Ok(other) => return Err(unexpected("the connection to drop", &other)),
            Err(e) => return Err(e.into()),
        }
        self.say(Who::Client, "reconnects");
        let pushed = self.connect(false)?;
        let Some(result) = pushed.into_iter().find(|r| r.id == "op_8") else {
            return Err(DemoError::Unexpected {
                expected: "op_8's result pushed on reconnect".into(),
                got: "no push for op_8".into(),
            });
        };
        self.say(Who::Client, "asks about op_8");
        self.status("op_8")?;
        self.ack("op_8")?;
        let decided = reconciled
            .iter()
            .find(|r| r.id == "op_8")
            .and_then(|r| r.applied_at)
            .map_or_else(
                || "not applied".to_string(),
                |rev| format!("applied at rev {rev}"),
            );
        self.row(
            "+",
            "crash while running",
            "op_8",
            &edit,
            "(service died mid-edit); reconnected",
            format!(
                "in doubt; document checked: {decided}; replayed, delivery {}",
                result.delivery
            ),
            1,
        );
        Ok(())
    }

    /// The result aged out: the answer says so; nothing runs again.
    fn result_aged_out(&mut self) -> Result<(), DemoError> {
        self.heading("+", "the result ages out");
        self.clock.advance(AGE_WAIT);
        self.say(
            Who::Clock,
            format!(
                "+{} days: past the result retention (7 days by default)",
                AGE_WAIT.as_secs() / 86_400
            ),
        );
        let swept = self.compact()?;
        self.say(
            Who::Editor,
            format!(
                "housekeeping: {} result(s) retired (payloads dropped, audit records kept)",
                swept.retired
            ),
        );
        let edit = add("light", "door");
        self.say(
            Who::Client,
            format!(
                "back after a long absence, retries op_1 ({})",
                edit.describe()
            ),
        );
        self.client.submit("op_1", &edit)?;
        let finished = match self.recv(false)? {
            Reply::Expired { id, revision, .. } if id == "op_1" => revision,
            other => return Err(unexpected("op_1 expired", &other)),
        };
        self.row(
            "+",
            "result aged out",
            "op_1",
            &edit,
            "resent op_1 after 8 days",
            format!(
                "expired: finished at rev {}; refresh, not re-run",
                finished.map_or_else(|| "?".to_string(), |r| r.to_string())
            ),
            1,
        );
        Ok(())
    }
}

/// A byte count in KiB.
pub(crate) fn kib(bytes: u64) -> String {
    format!("{:.1} KiB", bytes as f64 / 1024.0)
}
