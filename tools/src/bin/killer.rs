//! The kill -9 and syscall-fault harness (issue 5).
//!
//! ```text
//! cargo run --release -p opjournal-tools --bin killer -- --runs 1000
//! cargo run --release -p opjournal-tools --bin killer -- --strace --runs 20
//! ```
//!
//! **kill -9** (default): each run starts a child process (this binary with `--child`)
//! that runs the seeded workload of `testkit/src/driver.rs` against a journal file on
//! disk (and its log beside it) in the default configuration (`Sharing::LiveReaders`; one
//! run in five `Exclusive`), six seeds in ten with the smallest checkpoint size so that
//! checkpoints and log cycles are frequent, checking every answer against the reference
//! model as it goes, and reports each completed call on a pipe (and, for each
//! acknowledged durable call, the seq of the event it made durable). Beside it runs a
//! **reader process** (this binary with `--reader`): an `opjournal`-CLI-like reader that,
//! whenever the parent asks, opens the journal with `Inspector::open` and reads every
//! receipt, a few lookups and histories, and every event. At a random moment the parent
//! kills the writer with SIGKILL, has the reader read the crashed files (which must not
//! change their bytes), then: checks what the reader saw (never `Corrupt`; an event once
//! seen never changes and disappears only as a purge removes events; every event
//! acknowledged before a poll was asked for is in its answer); verifies the files
//! (`Inspector::verify`: redb integrity, every record's CRC and decode, the log's records,
//! indexes == replay of the event journal); replays the same seed in-process to know
//! exactly what the child had been told; reopens the file and checks that it equals one
//! of the states the crash may leave (every durable `Ok` present, the call in flight
//! landed or not, never half; lazily durable deliveries and acknowledgements kept or lost
//! in order; operations running at the kill `InDoubt`; no effect applied twice) and that
//! every event the reader saw in the crashed files is in it, unchanged.
//!
//! **strace** (`--strace`): the child runs under `strace -e inject=...`: fdatasync fails
//! with EIO once, or from the Nth call on; pwrite64 fails with ENOSPC once; or the child
//! is killed at its Nth fdatasync or pwrite64. A child that sees an error must find its
//! handle poisoned and every further write refused; it reopens the file in-process and
//! checks the recovered journal against the model (the failed commit may or may not have
//! landed), then carries on. When it cannot reopen (the failure persists) or is killed,
//! the parent checks the file as for kill -9. A reader process polls all along, with the
//! same checks.
//!
//! Every run prints its seed on failure; `--seed S --runs 1` replays it.

use opjournal_testkit::{driver, model};

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use driver::{Rng, Stepped, T0, Workload, WorkloadStats, config_for};
use opjournal::{Inspector, Journal, ManualClock, Sharing, Timestamp};

const DEFAULT_BASE: u64 = 0x0C0F_FEE0_0000_0000;

#[derive(Debug, Clone)]
struct Args {
    runs: u64,
    base: u64,
    max_steps: u64,
    strace: bool,
    keep: Option<PathBuf>,
    child: Option<ChildArgs>,
    /// Run as the reader process of the journal at this path.
    reader: Option<PathBuf>,
    quiet: bool,
}

#[derive(Debug, Clone)]
struct ChildArgs {
    seed: u64,
    path: PathBuf,
    sharing: Sharing,
    steps: u64,
}

fn parse_u64(s: &str) -> Result<u64, String> {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    }
    .map_err(|e| format!("`{s}` is not a number: {e}"))
}

fn parse_sharing(s: &str) -> Result<Sharing, String> {
    match s {
        "live" => Ok(Sharing::LiveReaders),
        "exclusive" => Ok(Sharing::Exclusive),
        other => Err(format!("unknown sharing `{other}` (live, exclusive)")),
    }
}

fn sharing_name(s: Sharing) -> &'static str {
    if s == Sharing::Exclusive {
        "exclusive"
    } else {
        "live"
    }
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        runs: 50,
        base: DEFAULT_BASE,
        max_steps: 400,
        strace: false,
        keep: None,
        child: None,
        reader: None,
        quiet: false,
    };
    let mut child = false;
    let (mut seed, mut path, mut sharing, mut steps) = (0, None, Sharing::LiveReaders, 0);
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = || it.next().ok_or_else(|| format!("`{arg}` needs a value"));
        match arg.as_str() {
            "--runs" => a.runs = parse_u64(&val()?)?,
            "--seed" => a.base = parse_u64(&val()?)?,
            "--max-steps" => a.max_steps = parse_u64(&val()?)?.max(1),
            "--strace" => a.strace = true,
            "--keep-failures" => a.keep = Some(PathBuf::from(val()?)),
            "--quiet" => a.quiet = true,
            "--child" => child = true,
            "--reader" => a.reader = Some(PathBuf::from(val()?)),
            "--child-seed" => seed = parse_u64(&val()?)?,
            "--child-path" => path = Some(PathBuf::from(val()?)),
            "--child-sharing" => sharing = parse_sharing(&val()?)?,
            "--child-steps" => steps = parse_u64(&val()?)?,
            "-h" | "--help" => {
                println!(
                    "usage: killer [--runs N] [--seed S] [--max-steps M] [--strace] [--keep-failures DIR] [--quiet]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    if child {
        a.child = Some(ChildArgs {
            seed,
            path: path.ok_or("--child needs --child-path")?,
            sharing,
            steps,
        });
    }
    Ok(a)
}

// ---------------------------------------------------------------------------------------
// The child: runs the workload on a file and reports each completed step.
// ---------------------------------------------------------------------------------------

fn open_file(w: &Workload, path: &Path, sharing: Sharing) -> opjournal::Result<Journal> {
    // A reader that opened the file while no writer had it (as `opjournal ls` may) keeps
    // writers out until it is done: retry for a while, as an editor would. An open that
    // fails with an I/O error is retried once, as an editor would: strace counts an
    // injection's `when=N` per thread, so a fault injected "once" fires once in each thread
    // that reaches its N-th call, and the writer's N-th can be the reopen's own (its writes
    // are fewer than its calls since the checkpoint thread zeroes the log files). A fault
    // from the N-th call on fails the retry too.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut io_retried = false;
    loop {
        let r = w
            .model
            .config()
            .builder(w.model.clock())
            .sharing(sharing)
            .open(path);
        match r {
            Err(e)
                if matches!(e.kind(), opjournal::ErrorKind::Locked { .. })
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) if matches!(e.kind(), opjournal::ErrorKind::Io) && !io_retried => {
                io_retried = true;
            }
            r => return r,
        }
    }
}

fn child_main(c: &ChildArgs) -> i32 {
    let out = std::io::stdout();
    let mut out = out.lock();
    let mut say = |line: String| {
        // The parent may have gone; nothing to do then but stop.
        if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
            std::process::exit(5);
        }
    };
    let cfg = config_for(c.seed, c.sharing);
    let clock = ManualClock::new(Timestamp::from_millis(T0));
    let mut w = Workload::new(c.seed, cfg, clock);
    let mut j = match open_file(&w, &c.path, c.sharing) {
        Ok(j) => j,
        Err(e) => {
            say(format!("open-failed 0 {e}"));
            return 4;
        }
    };
    say("ready".into());
    let mut k = 0u64;
    while k < c.steps {
        k += 1;
        match w.step(&j) {
            Ok(st) => {
                say(format!("step {k} {st:?}"));
                // What a reader must see from now on: the last event of the operation the
                // acknowledged call changed.
                if st == (Stepped::Ok { durable: true })
                    && let Some(op) = w.last_call.as_ref().and_then(call_operation)
                    && let Ok(events) = j.history(&op)
                    && let Some(last) = events.last()
                {
                    say(format!("ack {k} {} {op}", last.seq));
                }
            }
            Err(e) => {
                say(format!("violation {k} {}", one_line(&e)));
                return 3;
            }
        }
        if w.poisoned() {
            // The handle must refuse writes; then reopen in this process.
            for _ in 0..2 {
                if let Err(e) = w.step(&j) {
                    say(format!("violation {k} {}", one_line(&e)));
                    return 3;
                }
            }
            drop(j);
            w.model.before_reopen();
            j = match open_file(&w, &c.path, c.sharing) {
                Ok(j) => j,
                Err(e) => {
                    say(format!("reopen-failed {k} {e}"));
                    return 4;
                }
            };
            if let Err(e) = w.after_reopen(&j) {
                say(format!("violation {k} after reopen: {}", one_line(&e)));
                return 3;
            }
            say(format!("reopened {k}"));
        }
    }
    // Close cleanly, reopen, and check: a successful flush makes the lazy writes durable.
    if j.flush().is_ok() {
        w.recovery.closed_cleanly();
    }
    drop(j);
    w.model.before_reopen();
    let j = match open_file(&w, &c.path, c.sharing) {
        Ok(j) => j,
        Err(e) => {
            say(format!("reopen-failed {k} {e}"));
            return 4;
        }
    };
    if let Err(e) = w.after_reopen(&j) {
        say(format!(
            "violation {k} after a clean close: {}",
            one_line(&e)
        ));
        return 3;
    }
    say(format!("done {k}"));
    0
}

/// The operation a call changes, if any.
fn call_operation(call: &model::Call) -> Option<String> {
    use model::Call;
    match call {
        Call::Submit(op) => Some(op.id.clone()),
        Call::Complete(c, _) | Call::Release(c) | Call::ExtendLease(c, _) => {
            Some(c.operation_id().to_string())
        }
        Call::Resolve(id, _) => Some(id.clone()),
        _ => None,
    }
}

fn one_line(s: &str) -> String {
    s.replace('\n', " | ")
}

// ---------------------------------------------------------------------------------------
// The reader: an `opjournal`-CLI-like process polling the journal with the Inspector.
// ---------------------------------------------------------------------------------------

/// A hash of an event's content, to compare what two processes saw under one seq.
fn event_hash(ev: &opjournal::Event) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    format!("{ev:?}").hash(&mut h);
    h.finish()
}

/// The reader process: for every `poll` line on stdin, opens the journal with
/// `Inspector::open` (as the CLI's read commands do), reads every receipt, a few lookups and
/// histories, and every event, and answers `begin`, one `ev <seq> <operation|-> <hash>`
/// line per event and `end <receipts>`, or `err <corrupt|other> <message>`. Events are the
/// journal's raw record (no clock applied), so what a reader may see of them is exactly
/// a prefix of the writer's history.
fn reader_main(path: &Path) -> i32 {
    let stdin = std::io::stdin();
    let out = std::io::stdout();
    let mut out = out.lock();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { return 0 };
        if line != "poll" {
            continue;
        }
        let answer = read_once(path);
        let text = match answer {
            Ok((events, receipts)) => {
                let mut t = String::from("begin\n");
                for (seq, op, hash) in events {
                    t.push_str(&format!(
                        "ev {seq} {} {hash}\n",
                        op.as_deref().unwrap_or("-")
                    ));
                }
                t.push_str(&format!("end {receipts}"));
                t
            }
            Err(e) => {
                let class = if matches!(e.kind(), opjournal::ErrorKind::Corrupt { .. }) {
                    "corrupt"
                } else {
                    "other"
                };
                format!("err {class} {:?}: {}", e.kind(), one_line(&e.to_string()))
            }
        };
        if writeln!(out, "{text}").and_then(|()| out.flush()).is_err() {
            return 0;
        }
    }
    0
}

type Seen = Vec<(u64, Option<String>, u64)>;

fn read_once(path: &Path) -> opjournal::Result<(Seen, u64)> {
    let insp = Inspector::open(path)?;
    let mut receipts = 0u64;
    insp.for_each_receipt(|_| {
        receipts += 1;
        Ok(true)
    })?;
    for id in ["op-0", "op-3"] {
        insp.lookup(id)?;
        insp.history(id)?;
    }
    let mut events = Vec::new();
    insp.for_each_event(0, |ev| {
        events.push((ev.seq, ev.operation_id.clone(), event_hash(&ev)));
        Ok(true)
    })?;
    Ok((events, receipts))
}

/// One answer of the reader.
#[derive(Debug, Clone)]
struct Poll {
    /// Steps the child had reported, and acknowledgements, when the poll was asked for.
    asked_steps: usize,
    asked_acks: usize,
    /// Steps reported when the answer came.
    answered_steps: usize,
    /// After the writer was killed.
    after_kill: bool,
    answer: Result<BTreeMap<u64, (Option<String>, u64)>, String>,
}

/// The reader process, seen from the parent.
struct ReaderProc {
    child: Child,
    stdin: Option<std::process::ChildStdin>,
    rx: mpsc::Receiver<String>,
    /// The poll asked for and not answered yet: (steps, acks, after kill).
    asked: Option<(usize, usize, bool)>,
    partial: BTreeMap<u64, (Option<String>, u64)>,
    polls: Vec<Poll>,
}

impl ReaderProc {
    fn spawn(exe: &Path, path: &Path) -> std::io::Result<ReaderProc> {
        let mut child = Command::new(exe)
            .arg("--reader")
            .arg(path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let stdin = child.stdin.take();
        let rx = reader(&mut child);
        Ok(ReaderProc {
            child,
            stdin,
            rx,
            asked: None,
            partial: BTreeMap::new(),
            polls: Vec::new(),
        })
    }

    /// Asks for a poll if none is outstanding.
    fn ask(&mut self, report: &Report, after_kill: bool) {
        if self.asked.is_some() {
            return;
        }
        if let Some(stdin) = &mut self.stdin
            && writeln!(stdin, "poll").and_then(|()| stdin.flush()).is_ok()
        {
            self.asked = Some((report.steps.len(), report.acks.len(), after_kill));
        }
    }

    /// Takes the answers that arrived; `wait` blocks up to that long for the next line.
    fn collect(&mut self, report: &Report, wait: Duration) {
        let mut first = true;
        loop {
            let line = if first {
                first = false;
                self.rx.recv_timeout(wait).ok()
            } else {
                self.rx.try_recv().ok()
            };
            let Some(line) = line else { return };
            let Some((steps, acks, after_kill)) = self.asked else {
                continue;
            };
            let mut done = |answer| {
                self.polls.push(Poll {
                    asked_steps: steps,
                    asked_acks: acks,
                    answered_steps: report.steps.len(),
                    after_kill,
                    answer,
                });
            };
            if line == "begin" {
                self.partial.clear();
            } else if let Some(rest) = line.strip_prefix("ev ") {
                let mut it = rest.split(' ');
                if let (Some(Ok(seq)), Some(op), Some(Ok(hash))) = (
                    it.next().map(str::parse),
                    it.next(),
                    it.next().map(str::parse),
                ) {
                    let op = (op != "-").then(|| op.to_string());
                    self.partial.insert(seq, (op, hash));
                }
            } else if line.starts_with("end") {
                done(Ok(std::mem::take(&mut self.partial)));
                self.asked = None;
            } else if let Some(rest) = line.strip_prefix("err ") {
                done(Err(rest.to_string()));
                self.asked = None;
            }
        }
    }

    /// Polls until `n` more answers came after the kill (or a deadline passes).
    fn polls_after_kill(&mut self, report: &Report, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let target = self.polls.iter().filter(|p| p.after_kill).count() + n;
        while self.polls.iter().filter(|p| p.after_kill).count() < target
            && Instant::now() < deadline
        {
            if self.asked.is_some_and(|(_, _, after)| !after) {
                // The answer to a poll asked before the kill.
                self.collect(report, Duration::from_millis(50));
                continue;
            }
            self.ask(report, true);
            self.collect(report, Duration::from_millis(50));
        }
    }

    fn stop(mut self) {
        self.stdin = None;
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Figures of the reader processes.
#[derive(Default, Debug, Clone, Copy)]
struct ReaderTotals {
    polls: u64,
    polls_after_kill: u64,
    events_seen: u64,
    acks_checked: u64,
    /// Events the reader saw after the kill, each found unchanged in the recovered journal.
    events_matched: u64,
    /// Answers that were typed errors a live file explains (the journal not created yet,
    /// locked by an exclusive writer).
    expected_errors: u64,
}

/// Checks what the reader saw against the writer's acknowledged history:
/// - no `Corrupt` answer, ever (the files are intact: only kill -9 happens to them), and
///   no other error once the journal exists, except `Locked` beside an exclusive writer
///   (or a failed one, see below);
/// - an event, once seen, never changes (seqs are never reused) and disappears only as a
///   purge removes events (see [`purged`]);
/// - every event the writer acknowledged before a poll was asked for is in its answer,
///   unless purged since.
///
/// With `faulted` (a syscall fault injected into the writer), `Locked` is also expected
/// while the writer lives: a failed redb write leaves the file needing a recovery that only
/// a writer may run, and the poisoned writer still holds it. Once it stops, readers read.
fn check_reader(
    polls: &[Poll],
    report: &Report,
    sharing: Sharing,
    faulted: bool,
    totals: &mut ReaderTotals,
) -> Result<(), String> {
    let mut seen: BTreeMap<u64, (Option<String>, u64)> = BTreeMap::new();
    for (i, p) in polls.iter().enumerate() {
        totals.polls += 1;
        totals.polls_after_kill += u64::from(p.after_kill);
        let events = match &p.answer {
            Ok(e) => e,
            Err(e) if e.starts_with("corrupt") => {
                return Err(format!("the reader's poll {i} answered Corrupt: {e}"));
            }
            Err(e) => {
                // Beside an exclusive writer readers are refused; before the writer created
                // the journal (a kill that early) there is no file to read.
                let locked = e.contains("Locked")
                    && (sharing == Sharing::Exclusive || (faulted && !p.after_kill));
                let absent = !report.ready && e.contains("Io");
                if locked || absent {
                    totals.expected_errors += 1;
                    continue;
                }
                return Err(format!("the reader's poll {i} failed: {e}"));
            }
        };
        totals.events_seen += events.len() as u64;
        // Seen before: unchanged, or gone with its whole operation after a compaction.
        for (seq, (op, hash)) in &seen {
            match events.get(seq) {
                Some((op2, hash2)) if op2 == op && hash2 == hash => {}
                Some(other) => {
                    return Err(format!(
                        "poll {i}: event {seq} changed from {op:?}/{hash:x} to {other:?} (a seq was reused)"
                    ));
                }
                None => {
                    if !purged(events, *seq, op.as_deref()) {
                        let of_op = |evs: &mut dyn Iterator<Item = (u64, &Option<String>)>| {
                            evs.filter(|(_, o)| *o == op)
                                .map(|(s, _)| s)
                                .collect::<Vec<_>>()
                        };
                        return Err(format!(
                            "poll {i} (asked after {} steps, answered after {}): event {seq} of {op:?}, seen before, is gone, and not as a purge leaves events (its events before: {:?}, now: {:?})",
                            p.asked_steps,
                            p.answered_steps,
                            of_op(&mut seen.iter().map(|(s, (o, _))| (*s, o))),
                            of_op(&mut events.iter().map(|(s, (o, _))| (*s, o))),
                        ));
                    }
                }
            }
        }
        seen.clone_from(events);
        // Acknowledged before the poll was asked for: present.
        for ack in &report.acks[..p.asked_acks.min(report.acks.len())] {
            totals.acks_checked += 1;
            match events.get(&ack.seq) {
                Some((Some(op), _)) if *op == ack.op => {}
                Some(other) => {
                    return Err(format!(
                        "poll {i}: acknowledged event {} of `{}` reads as {other:?}",
                        ack.seq, ack.op
                    ));
                }
                None => {
                    if !purged(events, ack.seq, Some(&ack.op)) {
                        return Err(format!(
                            "poll {i} (asked after {} steps): event {} of `{}`, acknowledged at step {}, is missing",
                            p.asked_steps, ack.seq, ack.op, ack.step
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

/// Whether event `seq` of `op` may be missing from `events` because the journal purged it
/// (an operation whose audit retention passed, by compaction or by the next call that
/// touches it): a purged operation loses every event it had (events of a reused id come
/// after them), and a purged revision event is one a later one superseded. A commit lost
/// in a crash would take the *latest* events instead, leaving earlier ones of the same
/// operation.
fn purged(events: &BTreeMap<u64, (Option<String>, u64)>, seq: u64, op: Option<&str>) -> bool {
    match op {
        Some(op) => events
            .iter()
            .filter(|(_, (o, _))| o.as_deref() == Some(op))
            .all(|(s, _)| *s > seq),
        None => events.keys().next_back().is_some_and(|last| *last > seq),
    }
}

/// The bytes of a journal file and of its two log files (`None`: absent).
type FileBytes = (Option<Vec<u8>>, Option<Vec<u8>>, Option<Vec<u8>>);

/// The files' bytes (journal and both logs), to show that the reader alone changes
/// nothing.
fn file_bytes(path: &Path) -> FileBytes {
    let [log, spare] = opjournal::FileLog::paths_for(path);
    (
        std::fs::read(path).ok(),
        std::fs::read(log).ok(),
        std::fs::read(spare).ok(),
    )
}

// ---------------------------------------------------------------------------------------
// The parent.
// ---------------------------------------------------------------------------------------

#[derive(Default, Debug, Clone, Copy)]
struct Totals {
    runs: u64,
    kills: u64,
    kills_before_ready: u64,
    finished_before_kill: u64,
    faults_injected: u64,
    child_reopens: u64,
    /// Children that ran to the end and checked every reopen themselves.
    child_checked: u64,
    /// Children that stopped (a persistent fault) or died, checked by the parent.
    parent_checked: u64,
    /// Faults that hit the journal's creation or first open (then checked reopenable).
    open_faults: u64,
    reported_steps: u64,
    checked: WorkloadStats,
    reader: ReaderTotals,
    violations: u64,
}

/// What the child reported.
#[derive(Default, Debug)]
struct Report {
    ready: bool,
    steps: Vec<String>,
    reopened: u64,
    end: Option<String>,
    /// Events of acknowledged durable calls.
    acks: Vec<Ack>,
}

/// An event the child's acknowledged call made durable.
#[derive(Clone, Debug)]
struct Ack {
    seq: u64,
    op: String,
    /// The step (1-based) that acknowledged it.
    step: usize,
}

impl Report {
    fn take(&mut self, line: &str) {
        if line == "ready" {
            self.ready = true;
        } else if let Some(rest) = line.strip_prefix("step ") {
            let kind = rest.split_once(' ').map_or("", |(_, k)| k);
            self.steps.push(kind.to_string());
        } else if let Some(rest) = line.strip_prefix("ack ") {
            let mut it = rest.split(' ');
            let (_, seq, op) = (it.next(), it.next(), it.next());
            if let (Some(Ok(seq)), Some(op)) = (seq.map(str::parse), op) {
                self.acks.push(Ack {
                    seq,
                    op: op.to_string(),
                    step: self.steps.len(),
                });
            }
        } else if line.starts_with("reopened ") {
            self.reopened += 1;
        } else {
            self.end = Some(line.to_string());
        }
    }
}

fn spawn_child(
    exe: &Path,
    seed: u64,
    path: &Path,
    sharing: Sharing,
    steps: u64,
    strace: Option<&str>,
) -> std::io::Result<Child> {
    let child_args = [
        "--child".to_string(),
        "--child-seed".into(),
        seed.to_string(),
        "--child-path".into(),
        path.display().to_string(),
        "--child-sharing".into(),
        sharing_name(sharing).into(),
        "--child-steps".into(),
        steps.to_string(),
    ];
    let mut cmd = match strace {
        Some(spec) => {
            let mut c = Command::new("strace");
            c.args(["-f", "-qq", "-o", "/dev/null", "-e"])
                .arg(spec)
                .arg(exe)
                .args(child_args);
            c
        }
        None => {
            let mut c = Command::new(exe);
            c.args(child_args);
            c
        }
    };
    cmd.stdout(Stdio::piped()).stderr(Stdio::null()).spawn()
}

/// Reads the child's lines on a thread, so the parent can kill at any moment.
fn reader(child: &mut Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    if let Some(out) = child.stdout.take() {
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
    }
    rx
}

/// A file left by a failed creation or open: absent, or a journal that opens and verifies.
fn reopenable(path: &Path) -> Result<(), String> {
    if !path.exists() {
        return Ok(());
    }
    drop(Journal::open(path).map_err(|e| format!("the journal cannot be opened again: {e}"))?);
    let v = Inspector::open(path)
        .and_then(|i| opjournal::verify_inspected(&i, &mut |_, _| {}))
        .map_err(|e| format!("verify: {e}"))?;
    if v.is_clean() {
        Ok(())
    } else {
        Err(format!("verify: {:?} {:?}", v.integrity, v.findings))
    }
}

/// Checks the file a killed (or stopped) child left, by replaying what it reported.
fn check_after_crash(
    seed: u64,
    sharing: Sharing,
    path: &Path,
    report: &Report,
    reader_saw: Option<&BTreeMap<u64, (Option<String>, u64)>>,
    totals: &mut Totals,
) -> Result<(), String> {
    if !path.exists() {
        return if report.ready {
            Err("the journal file vanished".into())
        } else {
            Ok(())
        };
    }
    // Invariant 4 on the file exactly as the crash left it.
    let insp = Inspector::open(path).map_err(|e| format!("the file cannot be inspected: {e}"))?;
    let v = opjournal::verify_inspected(&insp, &mut |_, _| {})
        .map_err(|e| format!("verify failed: {e}"))?;
    if !v.is_clean() {
        return Err(format!(
            "verify: integrity {:?}, findings {:?}",
            v.integrity, v.findings
        ));
    }
    drop(insp);
    // Replay the child's run in-process: same seed, same answers.
    let cfg = config_for(seed, sharing);
    let clock = ManualClock::new(Timestamp::from_millis(T0));
    let mut w = Workload::new(seed, cfg.clone(), clock.clone());
    let mem = cfg
        .builder(&clock)
        .open_backends(
            redb::backends::InMemoryBackend::new(),
            opjournal::MemoryLog::new(),
            "replay",
        )
        .map_err(|e| format!("replay journal: {e}"))?;
    // A step that failed (the child then stopped) was in flight: it may or may not have
    // landed, like the step a kill interrupts.
    let mut steps = report.steps.as_slice();
    if let Some((last, before)) = steps.split_last()
        && last == "Failed"
    {
        steps = before;
    }
    for (k, reported) in steps.iter().enumerate() {
        let st: Stepped = w
            .step(&mem)
            .map_err(|e| format!("replay step {}: {e}", k + 1))?;
        let kind = format!("{st:?}");
        if &kind != reported {
            return Err(format!(
                "replay diverged at step {}: the child reported {reported}, the replay {kind}",
                k + 1
            ));
        }
    }
    // The next step may have been in flight at the kill.
    let mut w = w.with_next_step_in_flight(&mem)?;
    drop(mem);
    w.model.before_reopen();
    let j = open_file(&w, path, sharing).map_err(|e| format!("reopen: {e}"))?;
    w.after_reopen(&j).map_err(|e| format!("recovery: {e}"))?;
    // What the reader saw of the crashed files is what recovery made of them.
    if let Some(saw) = reader_saw {
        let ops: BTreeSet<&str> = saw.values().filter_map(|(op, _)| op.as_deref()).collect();
        let mut recovered = BTreeMap::new();
        for op in ops {
            for ev in j.history(op).map_err(|e| format!("history `{op}`: {e}"))? {
                recovered.insert(ev.seq, event_hash(&ev));
            }
        }
        for (seq, (op, hash)) in saw {
            if op.is_some() && recovered.get(seq) != Some(hash) {
                return Err(format!(
                    "the reader saw event {seq} of {op:?} in the crashed files; recovery has {:?}",
                    recovered.get(seq)
                ));
            }
        }
        totals.reader.events_matched += saw.len() as u64;
    }
    totals.checked.add(&w.stats);
    Ok(())
}

fn keep_failure(keep: &Option<PathBuf>, seed: u64, path: &Path) {
    if let Some(dir) = keep {
        let _ = std::fs::create_dir_all(dir);
        let _ = std::fs::copy(path, dir.join(format!("{seed:#x}.opj")));
    }
}

/// One kill -9 run.
fn kill_run(args: &Args, exe: &Path, seed: u64, totals: &mut Totals) -> Result<(), String> {
    let mut rng = Rng::new(seed ^ 0x4B11_1000);
    // The default configuration, with a reader process beside the writer; one run in five
    // excludes readers (they must then be refused, `Locked`, and change nothing either).
    let sharing = if rng.chance(80) {
        Sharing::LiveReaders
    } else {
        Sharing::Exclusive
    };
    let steps = 1 + rng.below(args.max_steps);
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let path = dir.path().join("journal.opj");
    let mut child =
        spawn_child(exe, seed, &path, sharing, steps, None).map_err(|e| format!("spawn: {e}"))?;
    let rx = reader(&mut child);
    let mut rd = ReaderProc::spawn(exe, &path).map_err(|e| format!("spawn the reader: {e}"))?;
    // Kill after a random number of reported steps (0: maybe before the journal is even
    // created), plus a random sub-millisecond delay.
    let target = rng.below(steps + 1);
    let delay = Duration::from_micros(rng.below(1_500));
    let mut report = Report::default();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut killed = false;
    loop {
        if (report.steps.len() as u64 >= target && (target > 0 || rng.chance(50)))
            || (target == 0 && report.ready)
        {
            std::thread::sleep(delay);
            let _ = child.kill();
            killed = true;
            break;
        }
        // The reader polls all along, once the writer has the journal open (a reader of a
        // journal no writer has open keeps writers out while it reads).
        if report.ready {
            rd.ask(&report, false);
        }
        rd.collect(&report, Duration::ZERO);
        match rx.recv_timeout(Duration::from_millis(2)) {
            Ok(line) => {
                report.take(&line);
                if report.end.is_some() {
                    break;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) if Instant::now() < deadline => {}
            Err(mpsc::RecvTimeoutError::Timeout) => break,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let _ = child.wait();
    // Lines still in the pipe were written before the kill: they count.
    while let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
        report.take(&line);
    }
    // The reader after the kill: it reads the files as the crash left them, and changes
    // nothing (no writer is left to change them).
    rd.polls_after_kill(&report, 1);
    let before = file_bytes(&path);
    rd.polls_after_kill(&report, 2);
    let after = file_bytes(&path);
    let polls = rd.polls.clone();
    rd.stop();
    totals.reported_steps += report.steps.len() as u64;
    if let Some(end) = &report.end {
        if end.starts_with("violation") || end.starts_with("open-failed") {
            return Err(format!("the child reported: {end}"));
        }
        if end.starts_with("done") {
            totals.finished_before_kill += 1;
        }
    }
    if killed && report.end.is_none() {
        totals.kills += 1;
        if !report.ready {
            totals.kills_before_ready += 1;
        }
    }
    let r = (|| {
        if before != after {
            return Err("the reader changed the files after the writer was killed".to_string());
        }
        check_reader(&polls, &report, sharing, false, &mut totals.reader)?;
        let last_seen = polls
            .iter()
            .rev()
            .find(|p| p.after_kill)
            .and_then(|p| p.answer.as_ref().ok())
            .cloned();
        check_after_crash(seed, sharing, &path, &report, last_seen.as_ref(), totals)
    })();
    if r.is_err() {
        keep_failure(&args.keep, seed, &path);
    }
    r
}

/// The syscall faults: (name, strace expression, whether the child is killed by it).
fn strace_specs(rng: &mut Rng) -> Vec<(String, String)> {
    // Creating and opening the journal takes about a dozen fdatasyncs and thirty pwrites:
    // most faults land in the workload, some in the open.
    let n = 10 + rng.below(40);
    let w = 25 + rng.below(250);
    vec![
        (
            format!("fdatasync EIO once at #{n}"),
            format!("inject=fdatasync:error=EIO:when={n}"),
        ),
        (
            format!("fdatasync EIO from #{n} on"),
            format!("inject=fdatasync:error=EIO:when={n}+"),
        ),
        (
            format!("pwrite64 ENOSPC once at #{w}"),
            format!("inject=pwrite64:error=ENOSPC:when={w}"),
        ),
        (
            format!("pwrite64 ENOSPC from #{w} on"),
            format!("inject=pwrite64:error=ENOSPC:when={w}+"),
        ),
        (
            format!("SIGKILL at fdatasync #{n}"),
            format!("inject=fdatasync:signal=KILL:when={n}"),
        ),
        (
            format!("SIGKILL at pwrite64 #{w}"),
            format!("inject=pwrite64:signal=KILL:when={w}"),
        ),
    ]
}

/// One strace run per fault kind.
fn strace_run(args: &Args, exe: &Path, seed: u64, totals: &mut Totals) -> Result<(), String> {
    let mut rng = Rng::new(seed ^ 0x57_2ACE);
    let mut failures = Vec::new();
    for (i, (name, spec)) in strace_specs(&mut rng).into_iter().enumerate() {
        let seed = seed.wrapping_add((i as u64) << 32);
        // The default configuration in four runs of five, with a reader process.
        let sharing = if rng.chance(80) {
            Sharing::LiveReaders
        } else {
            Sharing::Exclusive
        };
        let steps = 40 + rng.below(args.max_steps);
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let path = dir.path().join("journal.opj");
        let mut child = spawn_child(exe, seed, &path, sharing, steps, Some(&spec))
            .map_err(|e| format!("spawn strace: {e}"))?;
        let rx = reader(&mut child);
        let mut rd = ReaderProc::spawn(exe, &path).map_err(|e| format!("spawn the reader: {e}"))?;
        let mut report = Report::default();
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if report.ready {
                rd.ask(&report, false);
            }
            rd.collect(&report, Duration::ZERO);
            match rx.recv_timeout(Duration::from_millis(2)) {
                Ok(line) => report.take(&line),
                Err(mpsc::RecvTimeoutError::Timeout) if Instant::now() < deadline => {}
                Err(_) => break,
            }
        }
        let status = child.wait().map_err(|e| e.to_string())?;
        rd.polls_after_kill(&report, 1);
        let before = file_bytes(&path);
        rd.polls_after_kill(&report, 2);
        let unchanged = before == file_bytes(&path);
        let polls = rd.polls.clone();
        rd.stop();
        let reader_ok = if unchanged {
            check_reader(&polls, &report, sharing, true, &mut totals.reader)
        } else {
            Err("the reader changed the files after the writer stopped".to_string())
        };
        totals.faults_injected += 1;
        totals.reported_steps += report.steps.len() as u64;
        totals.child_reopens += report.reopened;
        let end = report.end.clone().unwrap_or_default();
        let r = if let Err(e) = reader_ok {
            Err(e)
        } else if end.starts_with("violation") {
            Err(format!("the child reported: {end}"))
        } else if end.starts_with("open-failed") {
            // The fault hit the journal's creation or first open: nothing was answered;
            // the file must be absent or open cleanly now that the disk works.
            totals.open_faults += 1;
            reopenable(&path)
        } else if end.starts_with("done") || report.reopened > 0 {
            // The child checked every reopen itself; the file must verify and open. A
            // child that reopened and then stopped (strace counts `when=N` per thread, so
            // a fault fires in each thread that reaches its N-th call: the checkpoint
            // thread's first, the writer's later) cannot be replayed by the parent, which
            // replays one run from open to the first fault: its file is checked so too.
            totals.child_checked += 1;
            let insp = Inspector::open(&path).map_err(|e| format!("inspect: {e}"));
            insp.and_then(|i| {
                let v =
                    opjournal::verify_inspected(&i, &mut |_, _| {}).map_err(|e| e.to_string())?;
                if v.is_clean() {
                    Ok(())
                } else {
                    Err(format!("verify: {:?} {:?}", v.integrity, v.findings))
                }
            })
        } else {
            // Killed by the injection, or stopped because the failure persisted: the
            // parent checks the file by replaying what the child reported (no earlier
            // fault can have changed the run: the first fault ends it).
            totals.kills += u64::from(!status.success() && end.is_empty());
            totals.parent_checked += 1;
            check_after_crash(seed, sharing, &path, &report, None, totals)
        };
        if !args.quiet {
            eprintln!(
                "  {name}: {} steps, {} reopen(s), ended `{}` ({status}) -> {}",
                report.steps.len(),
                report.reopened,
                if end.is_empty() { "killed" } else { &end },
                if r.is_ok() { "ok" } else { "VIOLATION" }
            );
        }
        if let Err(e) = r {
            keep_failure(&args.keep, seed, &path);
            failures.push(format!("{name} ({spec}), seed {seed:#x}: {e}"));
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("killer: {e}");
            std::process::exit(2);
        }
    };
    if let Some(c) = &args.child {
        std::process::exit(child_main(c));
    }
    if let Some(path) = &args.reader {
        std::process::exit(reader_main(path));
    }
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("killer: cannot find this executable: {e}");
            std::process::exit(2);
        }
    };
    let have_strace = || {
        Command::new("strace")
            .arg("-V")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if args.strace && !have_strace() {
        eprintln!("killer: --strace needs strace (apt-get install -y strace)");
        std::process::exit(2);
    }
    let started = Instant::now();
    let mut totals = Totals::default();
    for r in 0..args.runs {
        let seed = args.base.wrapping_add(r);
        totals.runs += 1;
        let result = if args.strace {
            strace_run(&args, &exe, seed, &mut totals)
        } else {
            kill_run(&args, &exe, seed, &mut totals)
        };
        if let Err(e) = result {
            totals.violations += 1;
            eprintln!(
                "VIOLATION in run {r}, seed {seed:#x}: {e}\n  replay: cargo run --release -p opjournal-tools --bin killer -- {}--seed {seed:#x} --runs 1",
                if args.strace { "--strace " } else { "" }
            );
        } else if !args.quiet && !args.strace && (r + 1) % 50 == 0 {
            eprintln!("  {} runs, {} kills so far", r + 1, totals.kills);
        }
    }
    let c = &totals.checked;
    let elapsed = started.elapsed().as_secs_f64();
    if args.strace {
        println!(
            "strace faults: {} runs, {} syscall fault scenarios in {elapsed:.1}s ({} faults hit the journal's creation or open; {} children ran to the end, checking {} in-process reopens after an error themselves (each after finding its handle poisoned); {} children were killed by SIGKILL injection or stopped by a persistent fault and checked by the parent); {} steps reported; acknowledged durable calls checked by the parent after a stop: {}; running at the stop and found in doubt: {}; reader processes: {} polls ({} after the writer stopped, files unchanged by them), {} acknowledged events checked present; violations: {}",
            totals.runs,
            totals.faults_injected,
            totals.open_faults,
            totals.child_checked,
            totals.child_reopens,
            totals.parent_checked,
            totals.reported_steps,
            c.acked_checked,
            c.running_at_cut,
            totals.reader.polls,
            totals.reader.polls_after_kill,
            totals.reader.acks_checked,
            totals.violations
        );
    } else {
        println!(
            "kill -9: {} runs in {elapsed:.1}s; {} kills (SIGKILL), {} before the journal was open, {} children finished first; {} steps reported by children; acknowledged durable calls checked after a kill: {}; lazily durable or in-flight states lost (allowed): {}; running at the kill and found in doubt: {}; effects applied: {}; reader processes: {} polls ({} after the kill, files unchanged by them), {} events seen, {} acknowledged events checked present, {} events seen after the kill found unchanged in the recovered journal, {} answers `Locked` beside an exclusive or failed writer or before the journal existed; violations: {}",
            totals.runs,
            totals.kills,
            totals.kills_before_ready,
            totals.finished_before_kill,
            totals.reported_steps,
            c.acked_checked,
            c.maybe_lost,
            c.running_at_cut,
            c.applications,
            totals.reader.polls,
            totals.reader.polls_after_kill,
            totals.reader.events_seen,
            totals.reader.acks_checked,
            totals.reader.events_matched,
            totals.reader.expected_errors,
            totals.violations
        );
    }
    if totals.violations > 0 {
        std::process::exit(1);
    }
}
