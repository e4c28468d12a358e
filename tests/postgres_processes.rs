//! A journal in PostgreSQL shared by several processes (feature `postgres`): each test
//! starts a private server ([`PgCluster::start_or_skip`]; without PostgreSQL a test
//! passes after one line on stderr, unless `OPJOURNAL_PG_REQUIRED=1`) and worker
//! processes, which are this test binary run again on [`worker_entry_runs_a_role_only_when_a_test_spawned_it`]
//! with their role in the environment.
//!
//! What a worker did goes to its own output file, one line per fact, written only after
//! the fact (a line `completed <id>` after `complete` returned `Ok`). The effect of an
//! operation is a line `<id> w<worker>` appended (`O_APPEND`, one `write`, then
//! `fsync`) to one effects file shared by every process, before the worker completes the
//! operation: the parent counts effects there, independently of the journal.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use opjournal::{
    Admission, Error, ErrorKind, EventKind, ExecutionStatus, InDoubtCause, Intent, Journal,
    JournalBuilder, Operation, Outcome, Resolution,
};
use opjournal_testkit::pg::{PgCluster, TcpProxy};
use serde_json::json;

/// The worker entry's name, as the test harness knows it.
const WORKER_TEST: &str = "worker_entry_runs_a_role_only_when_a_test_spawned_it";

const ENV_ROLE: &str = "OPJ_PGP_ROLE";
const ENV_URL: &str = "OPJ_PGP_URL";
const ENV_JOURNAL: &str = "OPJ_PGP_JOURNAL";
const ENV_INDEX: &str = "OPJ_PGP_INDEX";
const ENV_IDS: &str = "OPJ_PGP_IDS";
const ENV_OUT: &str = "OPJ_PGP_OUT";
const ENV_EFFECTS: &str = "OPJ_PGP_EFFECTS";
const ENV_SIGNALS: &str = "OPJ_PGP_SIGNALS";
const ENV_LEASE_MS: &str = "OPJ_PGP_LEASE_MS";
const ENV_NO_EFFECT: &str = "OPJ_PGP_NO_EFFECT";
const ENV_WATCH: &str = "OPJ_PGP_WATCH";
const ENV_RESOLVE: &str = "OPJ_PGP_RESOLVE";
const ENV_PAUSE_MS: &str = "OPJ_PGP_PAUSE_MS";
const ENV_ACK_MS: &str = "OPJ_PGP_ACK_MS";
const ENV_RETAIN_MS: &str = "OPJ_PGP_RETAIN_MS";
const ENV_COUNT: &str = "OPJ_PGP_COUNT";

/// The exit code of a worker whose watchdog found a call still running after
/// [`HANG_LIMIT`].
const HUNG_EXIT: i32 = 86;
/// How long one call may take through a cut connection before the worker reports it as
/// hung: the longest configured timeout of the backend (statement and lock timeouts, 30 s;
/// keepalives: 10 s idle and 3 probes 5 s apart) and a margin.
const HANG_LIMIT: Duration = Duration::from_secs(40);

// ---------------------------------------------------------------------------------------
// Shared by the parent and the workers

/// The intent every process submits for `id`.
fn intent(id: &str) -> Intent {
    Intent::from_json("doc.append", &json!({ "line": id })).expect("an intent")
}

/// Another intent under the same id.
fn other_intent(id: &str) -> Intent {
    Intent::from_json("doc.append", &json!({ "line": id, "twice": true })).expect("an intent")
}

fn op(id: &str) -> Operation {
    Operation::new(id, intent(id))
}

/// Appends `line` and a newline to `path` in one `write` on an `O_APPEND` descriptor (so
/// lines of several processes never interleave), then syncs it.
fn append_line(path: &Path, line: &str) {
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    f.write_all(format!("{line}\n").as_bytes())
        .unwrap_or_else(|e| panic!("append to {}: {e}", path.display()));
    f.sync_data()
        .unwrap_or_else(|e| panic!("sync {}: {e}", path.display()));
}

fn lines(path: &Path) -> Vec<String> {
    fs::read_to_string(path)
        .map(|s| s.lines().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// The kind's variant name (`Unavailable`, `StaleClaim`, ...).
fn kind_name(e: &Error) -> String {
    let debug = format!("{:?}", e.kind());
    debug
        .split(|c: char| !c.is_alphanumeric())
        .next()
        .unwrap_or_default()
        .to_owned()
}

fn is_unknown_outcome(e: &Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::Unavailable {
            outcome_unknown: true,
            ..
        }
    )
}

/// One line for an error: `error <call> <kind> retryable=<b> unknown=<b> | <message>`.
fn error_line(call: &str, e: &Error) -> String {
    format!(
        "error {call} {} retryable={} unknown={} | {}",
        kind_name(e),
        e.is_retryable(),
        is_unknown_outcome(e),
        e.to_string().replace('\n', " ")
    )
}

/// The same ids in an order of their own for each seed (xorshift, Fisher–Yates).
fn shuffled(ids: &[String], seed: u64) -> Vec<String> {
    let mut out = ids.to_vec();
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for i in (1..out.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let j = usize::try_from(x % (i as u64 + 1)).expect("an index");
        out.swap(i, j);
    }
    out
}

fn wait_until(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------------------
// The worker side

/// A worker's role and settings, from the environment its parent set.
struct Worker {
    role: String,
    url: String,
    journal: String,
    index: usize,
    ids: Vec<String>,
    out: PathBuf,
    effects: PathBuf,
    signals: PathBuf,
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("the worker needs {name}"))
}

fn env_list(name: &str) -> Vec<String> {
    std::env::var(name)
        .unwrap_or_default()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

fn env_ms(name: &str, default: u64) -> Duration {
    Duration::from_millis(
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default),
    )
}

impl Worker {
    fn from_env() -> Option<Worker> {
        let role = std::env::var(ENV_ROLE).ok()?;
        Some(Worker {
            role,
            url: env(ENV_URL),
            journal: env(ENV_JOURNAL),
            index: env(ENV_INDEX).parse().expect("a worker index"),
            ids: env_list(ENV_IDS),
            out: PathBuf::from(env(ENV_OUT)),
            effects: PathBuf::from(env(ENV_EFFECTS)),
            signals: PathBuf::from(env(ENV_SIGNALS)),
        })
    }

    fn record(&self, line: &str) {
        append_line(&self.out, line);
    }

    /// Applies the effect of `id`: a line in the effects file, synced.
    fn effect(&self, id: &str) {
        append_line(&self.effects, &format!("{id} w{}", self.index));
    }

    fn effect_seen(&self, id: &str) -> bool {
        lines(&self.effects)
            .iter()
            .any(|l| l.split(' ').next() == Some(id))
    }

    fn signaled(&self, name: &str) -> bool {
        self.signals.join(name).exists()
    }

    fn wait_signal(&self, name: &str, timeout: Duration) {
        assert!(
            wait_until(timeout, || self.signaled(name)),
            "worker {} waited {timeout:?} for the signal `{name}`",
            self.index
        );
    }

    /// Opens the journal, retrying while the database is unavailable (at most 60 s).
    fn open(&self, builder: impl Fn() -> JournalBuilder) -> Journal {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match builder().open_postgres(&self.url, &self.journal) {
                Ok(j) => return j,
                Err(e) if e.is_retryable() && Instant::now() < deadline => {
                    self.record(&error_line("open", &e));
                    thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!("worker {} could not open the journal: {e}", self.index),
            }
        }
    }

    fn result_of(&self, id: &str) -> String {
        format!("{id}@w{}", self.index)
    }
}

/// Run by every test binary run: does nothing unless a test of this file spawned the
/// process with a role in the environment, and then plays that role.
#[test]
fn worker_entry_runs_a_role_only_when_a_test_spawned_it() {
    let Some(w) = Worker::from_env() else {
        return;
    };
    match w.role.as_str() {
        "overlap" => overlap_worker(&w),
        "hold" => hold_worker(&w),
        "resubmit" => resubmit_worker(&w),
        "lifecycle" => lifecycle_worker(&w),
        "cut" => cut_worker(&w),
        "compact" => compact_worker(&w),
        other => panic!("unknown worker role {other}"),
    }
}

/// Submits every id of its list (the same ids as the others, in its own order): on
/// `Fresh` it applies the effect and completes with `<id>@w<index>`; on `InProgress` it
/// asks again after 2 ms until the answer is `Replay`. Then it submits ids that others ran
/// with another intent. Lines: `fresh <id> <result>`, `replay <id> <result> <times it saw
/// InProgress first>`, `mismatch <id> <kind>`.
fn overlap_worker(w: &Worker) {
    let journal = w.open(Journal::builder);
    w.record("ready");
    w.wait_signal("go", Duration::from_secs(60));
    let mut fresh = HashSet::new();
    for id in &w.ids {
        let mut waited = 0u32;
        loop {
            match journal.submit(op(id)) {
                Ok(Admission::Fresh(claim)) => {
                    w.effect(id);
                    match journal.complete(&claim, Outcome::applied(1, w.result_of(id))) {
                        Ok(_) => w.record(&format!("fresh {id} {}", w.result_of(id))),
                        Err(e) => w.record(&error_line("complete", &e)),
                    }
                    fresh.insert(id.clone());
                    break;
                }
                Ok(Admission::InProgress(_)) => {
                    waited += 1;
                    if waited > 10_000 {
                        w.record(&format!("stuck {id}"));
                        break;
                    }
                    thread::sleep(Duration::from_millis(2));
                }
                Ok(Admission::Replay(r)) => {
                    let result = String::from_utf8_lossy(&r.result.bytes).into_owned();
                    w.record(&format!("replay {id} {result} {waited}"));
                    break;
                }
                Ok(other) => {
                    w.record(&format!("unexpected {id} {}", other.name()));
                    break;
                }
                Err(e) => {
                    w.record(&error_line("submit", &e));
                    if !e.is_retryable() {
                        break;
                    }
                    thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }
    for id in w.ids.iter().filter(|id| !fresh.contains(*id)).take(10) {
        match journal.submit(Operation::new(id.as_str(), other_intent(id))) {
            Ok(a) => w.record(&format!("mismatch {id} admitted:{}", a.name())),
            Err(e) => w.record(&format!("mismatch {id} {}", kind_name(&e))),
        }
    }
    w.record("done");
}

/// Claims every id of its list with a short lease, applies the effect of each (except
/// those in `OPJ_PGP_NO_EFFECT`: it "crashed before the effect"), says `ready` and sleeps
/// without completing anything, until its parent kills it.
fn hold_worker(w: &Worker) {
    let lease = env_ms(ENV_LEASE_MS, 5_000);
    let no_effect = env_list(ENV_NO_EFFECT);
    let journal = w.open(|| Journal::builder().lease(lease));
    for id in &w.ids {
        match journal.submit(op(id)) {
            Ok(Admission::Fresh(claim)) => {
                if !no_effect.contains(id) {
                    w.effect(id);
                }
                w.record(&format!(
                    "claimed {id} epoch={} lease_until={}",
                    claim.epoch(),
                    claim.lease_until().0
                ));
            }
            Ok(other) => w.record(&format!("unexpected {id} {}", other.name())),
            Err(e) => w.record(&error_line("submit", &e)),
        }
    }
    w.record("ready");
    thread::sleep(Duration::from_secs(600));
}

/// Opens the journal, says `ready`, then for each signal `go1`, `go2`, ... (as many as
/// `OPJ_PGP_COUNT`) submits every id once: `round<n> <id> <answer> <before> <after>
/// <lease_until>`, with the journal's time (ms) right before and right after the submit:
/// the answer was decided in between.
fn resubmit_worker(w: &Worker) {
    let rounds: u32 = std::env::var(ENV_COUNT)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let journal = w.open(Journal::builder);
    w.record("ready");
    for round in 1..=rounds {
        w.wait_signal(&format!("go{round}"), Duration::from_secs(60));
        for id in &w.ids {
            let before = journal.now().0;
            let answer = journal.submit(op(id));
            let after = journal.now().0;
            let line = match answer {
                Ok(Admission::InProgress(r)) | Ok(Admission::InDoubt(r)) => {
                    let name = if r.status == ExecutionStatus::Running {
                        "in_progress"
                    } else {
                        "in_doubt"
                    };
                    format!(
                        "round{round} {id} {name} {before} {after} {}",
                        r.lease_until.map_or(0, |t| t.0)
                    )
                }
                Ok(other) => format!("round{round} {id} {} {before} {after} 0", other.name()),
                Err(e) => format!(
                    "round{round} {id} error:{} {before} {after} 0",
                    kind_name(&e)
                ),
            };
            w.record(&line);
        }
        w.record(&format!("round{round} done"));
    }
}

/// One lifecycle of a fresh id: submit (again after a retryable error, with the same id),
/// effect, complete (again after a retryable error, with the same claim). Lines:
/// `completed <id>` once `complete` returned `Ok` (or, after an unknown outcome, once a
/// lookup shows this claim's result), `orphan <id>` when a resubmit after a submit with an
/// unknown outcome answers `InProgress` (the claim committed; its holder lost it),
/// `error ...` for each error seen.
fn lifecycle(w: &Worker, journal: &Journal, id: &str) {
    let claim = loop {
        match journal.submit(op(id)) {
            Ok(Admission::Fresh(claim)) => break claim,
            Ok(Admission::InProgress(_)) => {
                w.record(&format!("orphan {id}"));
                return;
            }
            Ok(other) => {
                w.record(&format!("unexpected {id} {}", other.name()));
                return;
            }
            Err(e) => {
                w.record(&error_line("submit", &e));
                if !e.is_retryable() || w.signaled("stop") {
                    return;
                }
                thread::sleep(Duration::from_millis(50));
            }
        }
    };
    w.effect(id);
    let result = w.result_of(id);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut unknown = false;
    loop {
        match journal.complete(&claim, Outcome::applied(1, result.clone())) {
            Ok(_) => {
                w.record(&format!("completed {id}"));
                return;
            }
            Err(e) if matches!(e.kind(), ErrorKind::StaleClaim { .. }) && unknown => {
                // The complete whose outcome was unknown committed: check it is ours.
                w.record(&format!("stale_after_unknown {id} | {e}"));
                match journal.lookup(id) {
                    Ok(Some(r)) if r.status == ExecutionStatus::Applied => {
                        let bytes = journal.result(id).ok().flatten().map(|r| r.bytes);
                        if bytes.as_deref() == Some(result.as_bytes()) {
                            w.record(&format!("completed {id}"));
                        } else {
                            w.record(&format!("foreign_result {id} {bytes:?}"));
                        }
                    }
                    other => w.record(&format!("after_unknown {id} {other:?}")),
                }
                return;
            }
            Err(e) => {
                w.record(&error_line("complete", &e));
                unknown |= is_unknown_outcome(&e);
                if !e.is_retryable() || Instant::now() >= deadline {
                    w.record(&format!("gave_up {id}"));
                    return;
                }
                thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// Runs lifecycles of its own ids (`w<index>_<n>`) until the signal `stop`. Between two,
/// looks up the ids in `OPJ_PGP_WATCH`: the first time one is `InDoubt`, `in_doubt <id>
/// <cause>`; those in `OPJ_PGP_RESOLVE` whose effect it finds in the effects file it then
/// resolves as applied with `resolved@w<index>` (`resolved <id>`).
fn lifecycle_worker(w: &Worker) {
    let watch = env_list(ENV_WATCH);
    let resolve = env_list(ENV_RESOLVE);
    let pause = env_ms(ENV_PAUSE_MS, 0);
    let journal = w.open(Journal::builder);
    w.record("ready");
    w.wait_signal("go", Duration::from_secs(60));
    let mut seen = HashSet::new();
    let mut n = 0u64;
    while !w.signaled("stop") {
        lifecycle(w, &journal, &format!("w{}_{n}", w.index));
        n += 1;
        for id in &watch {
            if seen.contains(id) {
                continue;
            }
            if let Ok(Some(r)) = journal.lookup(id)
                && r.status == ExecutionStatus::InDoubt
            {
                w.record(&format!("in_doubt {id} {:?}", r.in_doubt_cause));
                seen.insert(id.clone());
                if resolve.contains(id) && w.effect_seen(id) {
                    let outcome = Resolution::applied(1, format!("resolved@w{}", w.index));
                    match journal.resolve(id, outcome) {
                        Ok(_) => w.record(&format!("resolved {id}")),
                        Err(e) => w.record(&error_line("resolve", &e)),
                    }
                }
            }
        }
        thread::sleep(pause);
    }
    w.record("done");
}

/// Exits the process with [`HUNG_EXIT`] unless disarmed within `limit`, after a line
/// `hung <call> after <limit>`.
struct Watchdog {
    disarmed: Arc<AtomicBool>,
}

impl Watchdog {
    fn arm(w: &Worker, call: &str, limit: Duration) -> Watchdog {
        let disarmed = Arc::new(AtomicBool::new(false));
        let flag = disarmed.clone();
        let out = w.out.clone();
        let call = call.to_owned();
        thread::spawn(move || {
            let deadline = Instant::now() + limit;
            while Instant::now() < deadline {
                if flag.load(Ordering::SeqCst) {
                    return;
                }
                thread::sleep(Duration::from_millis(50));
            }
            if !flag.load(Ordering::SeqCst) {
                append_line(&out, &format!("hung {call} after {limit:?}"));
                std::process::exit(HUNG_EXIT);
            }
        });
        Watchdog { disarmed }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.disarmed.store(true, Ordering::SeqCst);
    }
}

/// Through the proxy: claims every id of its list with a short lease and applies their
/// effects (`claimed`), waits for the signal `cut` (the parent cut the proxy), then
/// completes the first id (`during_cut ok` or `during_cut <error line> elapsed_ms=<ms>`)
/// under a watchdog; after the signal `healed`, completes every id (`late <id> ok` or
/// `late <id> refused <kind>`, retrying while the database is unavailable).
fn cut_worker(w: &Worker) {
    let lease = env_ms(ENV_LEASE_MS, 3_000);
    // The client's limit on the server's silence is this plus a second.
    let journal = w.open(|| {
        Journal::builder()
            .lease(lease)
            .database_timeout(Duration::from_secs(5))
    });
    let mut claims = Vec::new();
    for id in &w.ids {
        match journal.submit(op(id)) {
            Ok(Admission::Fresh(claim)) => {
                w.effect(id);
                claims.push((id.clone(), claim));
            }
            Ok(other) => panic!("the cut worker got {} for {id}", other.name()),
            Err(e) => panic!("the cut worker's submit of {id} failed: {e}"),
        }
    }
    w.record("claimed");
    w.wait_signal("cut", Duration::from_secs(60));
    let (first, claim) = &claims[0];
    let started = Instant::now();
    let answer = {
        let _watchdog = Watchdog::arm(w, &format!("complete {first}"), HANG_LIMIT);
        journal.complete(claim, Outcome::applied(1, w.result_of(first)))
    };
    let elapsed = started.elapsed().as_millis();
    match answer {
        Ok(_) => w.record(&format!("during_cut ok elapsed_ms={elapsed}")),
        Err(e) => w.record(&format!(
            "during_cut {} elapsed_ms={elapsed}",
            error_line("complete", &e)
        )),
    }
    w.wait_signal("healed", Duration::from_secs(120));
    for (id, claim) in &claims {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match journal.complete(claim, Outcome::applied(1, w.result_of(id))) {
                Ok(_) => {
                    w.record(&format!("late {id} ok"));
                    break;
                }
                Err(e) if e.is_retryable() && Instant::now() < deadline => {
                    w.record(&error_line("late_complete", &e));
                    thread::sleep(Duration::from_millis(100));
                }
                Err(e) => {
                    w.record(&format!("late {id} refused {} | {e}", kind_name(&e)));
                    break;
                }
            }
        }
    }
    w.record("done");
}

/// With short clocks and a compactor every 10 ms: after the signal `go`, creates
/// `OPJ_PGP_COUNT` operations of its own (`w<index>_<n>`, submitted and completed),
/// says `created`, and keeps the compactor running until the signal `stop`; then
/// `compactor errors=<n> last=<error>`.
fn compact_worker(w: &Worker) {
    let ack = env_ms(ENV_ACK_MS, 400);
    let retain = env_ms(ENV_RETAIN_MS, 800);
    let count: u64 = env(ENV_COUNT).parse().expect("a count");
    let journal = w.open(|| Journal::builder().ack_timeout(ack).result_retention(retain));
    let compactor = journal.spawn_compactor(Duration::from_millis(10));
    w.record("ready");
    w.wait_signal("go", Duration::from_secs(60));
    for n in 0..count {
        let id = format!("w{}_{n}", w.index);
        match journal.submit(op(&id)) {
            Ok(Admission::Fresh(claim)) => {
                if let Err(e) = journal.complete(&claim, Outcome::applied(1, w.result_of(&id))) {
                    w.record(&error_line("complete", &e));
                }
            }
            Ok(other) => w.record(&format!("unexpected {id} {}", other.name())),
            Err(e) => w.record(&error_line("submit", &e)),
        }
        thread::sleep(Duration::from_millis(5));
    }
    w.record("created");
    w.wait_signal("stop", Duration::from_secs(60));
    let errors = compactor.errors();
    let last = compactor
        .last_error()
        .map(|e| e.to_string().replace('\n', " "));
    let ended = compactor.stop().map(|e| e.to_string());
    w.record(&format!(
        "compactor errors={errors} last={last:?} ended={ended:?}"
    ));
}

// ---------------------------------------------------------------------------------------
// The parent side

/// One test's journal, its shared files and its workers.
struct Run {
    dir: tempfile::TempDir,
    url: String,
    journal: String,
}

/// A worker process; killed when dropped while it still runs.
struct Proc {
    index: usize,
    child: Child,
    out: PathBuf,
    log: PathBuf,
    status: Option<ExitStatus>,
}

impl Run {
    fn new(url: String, journal: &str) -> Run {
        let dir = tempfile::tempdir().expect("a temporary directory");
        fs::create_dir(dir.path().join("signals")).expect("the signals directory");
        Run {
            dir,
            url,
            journal: journal.to_owned(),
        }
    }

    fn effects_path(&self) -> PathBuf {
        self.dir.path().join("effects")
    }

    fn signal(&self, name: &str) {
        File::create(self.dir.path().join("signals").join(name)).expect("a signal file");
    }

    /// The effects file: how many times each id's effect happened, and by whom.
    fn effects(&self) -> BTreeMap<String, Vec<String>> {
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for line in lines(&self.effects_path()) {
            let (id, who) = line.split_once(' ').expect("an effect line");
            out.entry(id.to_owned()).or_default().push(who.to_owned());
        }
        out
    }

    fn journal(&self, builder: JournalBuilder) -> Journal {
        builder
            .open_postgres(&self.url, &self.journal)
            .expect("the parent opens the journal")
    }

    fn spawn(&self, role: &str, index: usize, url: &str, vars: &[(&str, String)]) -> Proc {
        let out = self.dir.path().join(format!("{role}-{index}.out"));
        let log = self.dir.path().join(format!("{role}-{index}.log"));
        let log_file = File::create(&log).expect("a log file");
        let mut cmd = Command::new(std::env::current_exe().expect("the test binary"));
        cmd.args(["--exact", WORKER_TEST, "--nocapture", "--test-threads", "1"])
            .env(ENV_ROLE, role)
            .env(ENV_URL, url)
            .env(ENV_JOURNAL, &self.journal)
            .env(ENV_INDEX, index.to_string())
            .env(ENV_OUT, &out)
            .env(ENV_EFFECTS, self.effects_path())
            .env(ENV_SIGNALS, self.dir.path().join("signals"))
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("a log file"))
            .stderr(log_file);
        for (k, v) in vars {
            cmd.env(k, v);
        }
        Proc {
            index,
            child: cmd.spawn().expect("a worker process"),
            out,
            log,
            status: None,
        }
    }
}

impl Proc {
    fn lines(&self) -> Vec<String> {
        lines(&self.out)
    }

    fn has_line(&self, line: &str) -> bool {
        self.lines().iter().any(|l| l == line)
    }

    fn count(&self, prefix: &str) -> usize {
        self.lines()
            .iter()
            .filter(|l| l.starts_with(prefix))
            .count()
    }

    /// What went wrong, for a failed assertion: the worker's output and log.
    fn describe(&self) -> String {
        let tail = |p: &Path| {
            let all = lines(p);
            all[all.len().saturating_sub(15)..].join("\n")
        };
        format!(
            "worker {} (status {:?})\n--- output (last lines) ---\n{}\n--- log (last lines) ---\n{}",
            self.index,
            self.status,
            tail(&self.out),
            tail(&self.log)
        )
    }

    /// Waits for `line` in the output; panics with the worker's output after `timeout` or
    /// when it exited first.
    fn wait_line(&mut self, line: &str, timeout: Duration) {
        let found = wait_until(timeout, || {
            self.has_line(line) || self.child.try_wait().ok().flatten().is_some()
        });
        if !(found && self.has_line(line)) {
            self.status = self.child.try_wait().ok().flatten();
            panic!("no `{line}` from {}", self.describe());
        }
    }

    /// The exit status, once the process ended within `timeout` (`None` otherwise).
    fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        if self.status.is_none() {
            wait_until(timeout, || {
                self.status = self.child.try_wait().ok().flatten();
                self.status.is_some()
            });
        }
        self.status
    }

    fn expect_success(&mut self, timeout: Duration) {
        let status = self.wait_exit(timeout);
        assert!(
            status.is_some_and(|s| s.success()),
            "the worker did not end well within {timeout:?}: {}",
            self.describe()
        );
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.status.is_none() && self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}_{i:03}")).collect()
}

/// The words of a line after its first `skip` ones.
fn word(line: &str, n: usize) -> &str {
    line.split(' ').nth(n).unwrap_or_default()
}

// ---------------------------------------------------------------------------------------
// The tests

/// Four processes submit the same 200 ids, each in its own order, with the same intent:
/// each id gets one `Fresh` in one process, its effect happens once, and every process
/// ends with the result that process recorded. The same id with another intent is
/// refused as `IntentMismatch` in processes that did not run it.
#[test]
fn four_processes_submitting_overlapping_ids_execute_each_exactly_once() {
    let Some(cluster) = PgCluster::start_or_skip() else {
        return;
    };
    const WORKERS: usize = 4;
    let run = Run::new(cluster.url(), "overlap");
    let all = ids("op", 200);
    let mut procs: Vec<Proc> = (0..WORKERS)
        .map(|i| {
            let order = shuffled(&all, i as u64 + 1).join(",");
            run.spawn("overlap", i, &run.url, &[(ENV_IDS, order)])
        })
        .collect();
    for p in &mut procs {
        p.wait_line("ready", Duration::from_secs(30));
    }
    let started = Instant::now();
    run.signal("go");
    for p in &mut procs {
        p.expect_success(Duration::from_secs(60));
    }
    let elapsed = started.elapsed();

    // Per id: who got Fresh, and the result each worker ended with.
    let mut fresh: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    let mut results: BTreeMap<String, Vec<(usize, String)>> = BTreeMap::new();
    let mut waits = 0u64;
    let mut mismatches = Vec::new();
    for p in &procs {
        let out = p.lines();
        assert!(
            out.iter().any(|l| l == "done"),
            "worker {} did not finish: {}",
            p.index,
            p.describe()
        );
        for line in &out {
            match word(line, 0) {
                "fresh" => {
                    fresh.entry(word(line, 1).into()).or_default().push(p.index);
                    results
                        .entry(word(line, 1).into())
                        .or_default()
                        .push((p.index, word(line, 2).into()));
                }
                "replay" => {
                    results
                        .entry(word(line, 1).into())
                        .or_default()
                        .push((p.index, word(line, 2).into()));
                    waits += word(line, 3).parse::<u64>().expect("a count");
                }
                "mismatch" => {
                    mismatches.push((p.index, word(line, 1).to_owned(), word(line, 2).to_owned()))
                }
                "ready" | "done" => {}
                _ => panic!("worker {}: unexpected line `{line}`", p.index),
            }
        }
    }
    let effects = run.effects();
    let journal = run.journal(Journal::builder());
    for id in &all {
        let holders = fresh.get(id).cloned().unwrap_or_default();
        assert_eq!(holders.len(), 1, "{id} was Fresh in workers {holders:?}");
        let winner = holders[0];
        let expected = format!("{id}@w{winner}");
        let seen = results.get(id).cloned().unwrap_or_default();
        assert_eq!(seen.len(), WORKERS, "{id}: answers {seen:?}");
        for (worker, result) in &seen {
            assert_eq!(
                result, &expected,
                "{id}: worker {worker} ended with another result"
            );
        }
        assert_eq!(
            effects.get(id).cloned().unwrap_or_default(),
            vec![format!("w{winner}")],
            "{id}: the effects"
        );
        let receipt = journal.lookup(id).expect("lookup").expect("a receipt");
        assert_eq!(receipt.status, ExecutionStatus::Applied, "{id}");
        assert_eq!(
            journal.result(id).expect("result").expect("a result").bytes,
            expected.as_bytes(),
            "{id}"
        );
    }
    assert_eq!(
        effects.len(),
        all.len(),
        "effects of unknown ids: {effects:?}"
    );
    for i in 0..WORKERS {
        assert!(
            mismatches.iter().any(|(w, _, _)| *w == i),
            "worker {i} tried no other intent"
        );
    }
    for (worker, id, kind) in &mismatches {
        assert_eq!(kind, "IntentMismatch", "worker {worker}, {id}");
        assert_eq!(
            journal.result(id).expect("result").expect("a result").bytes,
            format!("{id}@w{}", fresh[id][0]).as_bytes(),
            "{id}: the refused submit changed nothing"
        );
    }
    let per_worker: Vec<usize> = (0..WORKERS)
        .map(|i| fresh.values().filter(|h| h[0] == i).count())
        .collect();
    eprintln!(
        "overlap: {} ids x {WORKERS} processes in {elapsed:?}; Fresh per worker {per_worker:?}; \
         {waits} InProgress answers waited out; {} IntentMismatch refusals in other processes; \
         {} effects",
        all.len(),
        mismatches.len(),
        effects.values().map(Vec::len).sum::<usize>()
    );
}

/// A worker claims 10 ids, applies the effects of 8 (not of the last 2), and is killed
/// with SIGKILL without completing any. While the lease (5 s, the server's time) runs,
/// the parent and two other processes (opened before the kill, so opening marked nothing
/// in doubt) get `InProgress`, never `Fresh`; after it they get `InDoubt`
/// (`LeaseTimeout`, listed by `in_doubt()`), and so does the parent. Resolving settles
/// each: applied ones replay the resolved result, not-applied ones are `Fresh` again
/// (attempt 2); every effect happened once.
#[test]
fn a_worker_killed_mid_claim_leaves_the_operation_in_doubt_and_it_never_runs_again() {
    let Some(cluster) = PgCluster::start_or_skip() else {
        return;
    };
    const LEASE_MS: u64 = 5_000;
    let run = Run::new(cluster.url(), "killed");
    let all = ids("k", 10);
    let no_effect: Vec<String> = all[8..].to_vec();
    let journal = run.journal(Journal::builder());
    let mut resubmitters: Vec<Proc> = (1..=2)
        .map(|i| {
            run.spawn(
                "resubmit",
                i,
                &run.url,
                &[(ENV_IDS, all.join(",")), (ENV_COUNT, "2".into())],
            )
        })
        .collect();
    let mut holder = run.spawn(
        "hold",
        0,
        &run.url,
        &[
            (ENV_IDS, all.join(",")),
            (ENV_LEASE_MS, LEASE_MS.to_string()),
            (ENV_NO_EFFECT, no_effect.join(",")),
        ],
    );
    holder.wait_line("ready", Duration::from_secs(30));
    for p in &mut resubmitters {
        p.wait_line("ready", Duration::from_secs(30));
    }
    assert_eq!(
        holder.count("claimed "),
        all.len(),
        "the holder claimed every id: {}",
        holder.describe()
    );
    holder.child.kill().expect("SIGKILL the holder");
    let status = holder
        .wait_exit(Duration::from_secs(10))
        .expect("the holder is gone");
    assert_eq!(status.signal(), Some(9), "killed by SIGKILL");

    // Right after the kill: InProgress while the lease runs, InDoubt only past it (the
    // answer was decided between `before` and `after`), never Fresh.
    let check = |line: &str, answer: &str, before: u64, after: u64, until: u64| match answer {
        "in_progress" => assert!(before < until, "InProgress past the lease: {line}"),
        "in_doubt" => assert!(after >= until, "InDoubt before the lease expired: {line}"),
        _ => panic!("{line}: the holder died mid-claim, the answer must not be Fresh"),
    };
    let mut parent_in_progress = 0;
    for id in &all {
        let before = journal.now().0;
        let a = journal.submit(op(id)).expect("submit");
        let after = journal.now().0;
        let (name, until) = match &a {
            Admission::InProgress(r) => ("in_progress", r.lease_until),
            Admission::InDoubt(r) => ("in_doubt", r.lease_until),
            other => (other.name(), None),
        };
        let until = until.map_or(0, |t| t.0);
        check(
            &format!("the parent: {id} {name}"),
            name,
            before,
            after,
            until,
        );
        parent_in_progress += usize::from(name == "in_progress");
    }
    run.signal("go1");
    for p in &mut resubmitters {
        p.wait_line("round1 done", Duration::from_secs(30));
    }
    let mut round1 = BTreeMap::<&str, usize>::new();
    for p in &resubmitters {
        for line in p
            .lines()
            .iter()
            .filter(|l| l.starts_with("round1 ") && !l.ends_with("done"))
        {
            let answer = word(line, 2);
            let ms = |n: usize| word(line, n).parse::<u64>().expect("a time");
            check(
                &format!("worker {}: {line}", p.index),
                answer,
                ms(3),
                ms(4),
                ms(5),
            );
            *round1
                .entry(if answer == "in_progress" {
                    "in_progress"
                } else {
                    "in_doubt"
                })
                .or_default() += 1;
        }
    }
    assert_eq!(round1.values().sum::<usize>(), 2 * all.len());
    assert!(
        parent_in_progress + round1.get("in_progress").copied().unwrap_or(0) > 0,
        "nothing was asked while the lease ran: the test did not test InProgress"
    );

    // Past the lease, on the server's clock: InDoubt, for everyone.
    let lease_passed = wait_until(Duration::from_millis(LEASE_MS + 15_000), || {
        all.iter().all(|id| {
            journal
                .lookup(id)
                .expect("lookup")
                .is_some_and(|r| r.status == ExecutionStatus::InDoubt)
        })
    });
    assert!(
        lease_passed,
        "the ids did not become InDoubt after the lease"
    );
    let listed: BTreeSet<String> = journal
        .in_doubt()
        .expect("in_doubt")
        .into_iter()
        .map(|r| {
            assert_eq!(r.in_doubt_cause, Some(InDoubtCause::LeaseTimeout), "{r:?}");
            r.operation_id
        })
        .collect();
    assert_eq!(listed, all.iter().cloned().collect::<BTreeSet<_>>());
    run.signal("go2");
    for p in &mut resubmitters {
        p.expect_success(Duration::from_secs(30));
        for line in p
            .lines()
            .iter()
            .filter(|l| l.starts_with("round2 ") && !l.ends_with("done"))
        {
            assert_eq!(word(line, 2), "in_doubt", "worker {}: {line}", p.index);
        }
    }
    for id in &all {
        let a = journal.submit(op(id)).expect("submit");
        assert!(matches!(a, Admission::InDoubt(_)), "{id}: {}", a.name());
    }

    // The embedder looks at the project (the effects file) and resolves.
    let effects = run.effects();
    for id in &all {
        if effects.contains_key(id) {
            let r = journal
                .resolve(id, Resolution::applied(1, format!("resolved:{id}")))
                .expect("resolve")
                .expect("a receipt");
            assert_eq!(r.status, ExecutionStatus::Applied);
        } else {
            assert!(no_effect.contains(id), "{id} has no effect");
            let r = journal
                .resolve(id, Resolution::not_applied())
                .expect("resolve");
            assert!(r.is_none());
        }
    }
    for id in &all {
        match journal.submit(op(id)).expect("submit") {
            Admission::Replay(r) => {
                assert!(!no_effect.contains(id), "{id} replayed");
                assert_eq!(r.result.bytes, format!("resolved:{id}").as_bytes());
                let names: Vec<&str> = journal
                    .history(id)
                    .expect("history")
                    .iter()
                    .map(|e| e.kind.name())
                    .collect();
                assert_eq!(names, ["submitted", "lease_expired", "resolved"], "{id}");
            }
            Admission::Fresh(claim) => {
                assert!(no_effect.contains(id), "{id} ran again after its effect");
                assert_eq!(claim.attempt(), 2, "{id}");
                append_line(&run.effects_path(), &format!("{id} parent"));
                journal
                    .complete(&claim, Outcome::applied(1, format!("{id}@parent")))
                    .expect("complete");
            }
            other => panic!("{id} after resolve: {}", other.name()),
        }
    }
    for (id, who) in run.effects() {
        assert_eq!(who.len(), 1, "{id}: effects by {who:?}");
    }
    eprintln!(
        "killed: 10 ids claimed (8 with effects) by a process killed with SIGKILL, lease \
         {LEASE_MS} ms; InProgress to the parent {parent_in_progress}/10, to 2 other \
         processes {round1:?}; InDoubt (LeaseTimeout) for all after the lease; 8 resolved \
         applied, 2 not applied and run again as attempt 2"
    );
}

/// Four processes run lifecycles (submit, effect, complete) while the server is stopped
/// with `-m immediate` for 2 s and started again: every error while it is down is
/// `Unavailable` and retryable, the workers go on after the restart with the same ids,
/// every id a worker saw completed is `Applied` with its result, and no effect happened
/// twice.
#[test]
fn postgres_stopped_and_restarted_under_load_loses_nothing_acknowledged() {
    let Some(cluster) = PgCluster::start_or_skip() else {
        return;
    };
    const WORKERS: usize = 4;
    let run = Run::new(cluster.url(), "restart");
    let journal = run.journal(Journal::builder());
    let mut procs: Vec<Proc> = (0..WORKERS)
        .map(|i| run.spawn("lifecycle", i, &run.url, &[(ENV_PAUSE_MS, "2".into())]))
        .collect();
    for p in &mut procs {
        p.wait_line("ready", Duration::from_secs(30));
    }
    run.signal("go");
    let before = |procs: &[Proc], n: usize| procs.iter().all(|p| p.count("completed ") >= n);
    assert!(
        wait_until(Duration::from_secs(20), || before(&procs, 20)),
        "the workers did not get going"
    );
    let at_stop: Vec<usize> = procs.iter().map(|p| p.count("completed ")).collect();
    let errors_before: usize = procs.iter().map(|p| p.count("error ")).sum();
    cluster.stop_immediate().expect("stop -m immediate");
    let down = Instant::now();
    thread::sleep(Duration::from_secs(2));
    cluster.start_again().expect("start again");
    let outage = down.elapsed();
    let at_restart: Vec<usize> = procs.iter().map(|p| p.count("completed ")).collect();
    let went_on = wait_until(Duration::from_secs(30), || {
        procs
            .iter()
            .zip(&at_restart)
            .all(|(p, n)| p.count("completed ") >= n + 10)
    });
    run.signal("stop");
    for p in &mut procs {
        p.expect_success(Duration::from_secs(40));
    }
    assert!(
        went_on,
        "the workers did not go on after the restart: {}",
        procs
            .iter()
            .map(Proc::describe)
            .collect::<Vec<_>>()
            .join("\n")
    );

    let effects = run.effects();
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    let mut unknown = 0;
    let mut samples = BTreeSet::new();
    let mut completed_total = 0;
    let mut leftovers: BTreeMap<String, usize> = BTreeMap::new();
    for p in &procs {
        let out = p.lines();
        let errors: Vec<&String> = out.iter().filter(|l| l.starts_with("error ")).collect();
        assert!(
            !errors.is_empty(),
            "worker {} saw no error while the server was down",
            p.index
        );
        for line in errors {
            let kind = word(line, 2);
            assert_eq!(kind, "Unavailable", "worker {}: {line}", p.index);
            assert_eq!(
                word(line, 3),
                "retryable=true",
                "worker {}: {line}",
                p.index
            );
            *kinds
                .entry(format!("{} {kind}", word(line, 1)))
                .or_default() += 1;
            if word(line, 4) == "unknown=true" {
                unknown += 1;
            }
            // "... | the database is unavailable: could not <what> for <place>: <reason>; ..."
            let detail = line
                .split_once("could not ")
                .map_or("", |(_, d)| d.split(';').next().unwrap_or_default());
            let what = detail.split(" for ").next().unwrap_or_default();
            let reason = detail.rsplit(": ").next().unwrap_or_default();
            samples.insert(format!("{what}: {reason}"));
        }
        let mut completed = HashSet::new();
        for line in &out {
            match word(line, 0) {
                "completed" => {
                    let id = word(line, 1);
                    completed.insert(id.to_owned());
                    let r = journal.lookup(id).expect("lookup").expect("a receipt");
                    assert_eq!(
                        r.status,
                        ExecutionStatus::Applied,
                        "{id} was completed: {r:?}"
                    );
                    assert_eq!(
                        journal.result(id).expect("result").expect("a result").bytes,
                        format!("{id}@w{}", p.index).as_bytes(),
                        "{id}"
                    );
                    assert_eq!(
                        effects.get(id).map(Vec::len),
                        Some(1),
                        "{id} completed: its effect"
                    );
                }
                "orphan" => {
                    // A submit with an unknown outcome committed its claim: nobody holds it
                    // and nothing applied it.
                    let id = word(line, 1);
                    let r = journal.lookup(id).expect("lookup").expect("a receipt");
                    assert!(
                        matches!(
                            r.status,
                            ExecutionStatus::Running | ExecutionStatus::InDoubt
                        ),
                        "orphan {id}: {r:?}"
                    );
                    assert!(!effects.contains_key(id), "orphan {id} has an effect");
                    *leftovers.entry("orphan".to_owned()).or_default() += 1;
                }
                "gave_up" | "stale_after_unknown" => {
                    *leftovers.entry(word(line, 0).to_owned()).or_default() += 1;
                }
                "error" | "ready" | "done" => {}
                _ => panic!("worker {}: unexpected line `{line}`", p.index),
            }
        }
        completed_total += completed.len();
        // Effects of this worker's ids that it never saw completed: in doubt or running
        // (the complete did not commit) or applied (it did, unseen): never applied twice.
        for (id, who) in effects
            .iter()
            .filter(|(id, _)| id.starts_with(&format!("w{}_", p.index)))
        {
            assert_eq!(who.len(), 1, "{id}: effects {who:?}");
            if !completed.contains(id) {
                let r = journal.lookup(id).expect("lookup").expect("a receipt");
                *leftovers
                    .entry(format!("effect, not seen completed: {:?}", r.status))
                    .or_default() += 1;
                assert!(
                    matches!(
                        r.status,
                        ExecutionStatus::Running
                            | ExecutionStatus::InDoubt
                            | ExecutionStatus::Applied
                    ),
                    "{id}: {r:?}"
                );
            }
        }
    }
    for (id, who) in &effects {
        assert_eq!(who.len(), 1, "{id}: effects {who:?}");
    }
    eprintln!(
        "restart: {WORKERS} processes; completed before the stop {at_stop:?}, at the restart \
         {at_restart:?}, {completed_total} in all; server down {outage:?} (stop, 2 s, start); \
         {} errors before the stop, error kinds by call {kinds:?} ({unknown} with \
         outcome_unknown); leftovers {leftovers:?}; reasons seen: {samples:?}",
        errors_before
    );
}

/// One worker reaches the database through a proxy and holds two claims (lease 3 s);
/// the parent cuts the proxy. Its `complete` must fail typed (`Unavailable`) within
/// [`HANG_LIMIT`]; the two other workers keep completing their own operations and see the
/// claims `InDoubt` once the lease passed (`LeaseTimeout`), and one of them resolves the
/// first as applied (its effect is in the effects file). After
/// the heal, the late `complete` of the resolved one is refused (`StaleClaim`) and that of
/// the other is accepted (nothing else resolved it); no effect happened twice.
#[test]
fn a_worker_cut_off_from_the_database_fails_typed_and_the_others_proceed() {
    let Some(cluster) = PgCluster::start_or_skip() else {
        return;
    };
    let proxy = TcpProxy::start(cluster.port());
    let proxied = format!("postgres://postgres@127.0.0.1:{}/postgres", proxy.port());
    let run = Run::new(cluster.url(), "cut");
    let mut cut = run.spawn(
        "cut",
        9,
        &proxied,
        &[
            (ENV_IDS, "cut_a,cut_b".into()),
            (ENV_LEASE_MS, "3000".into()),
        ],
    );
    let mut peers: Vec<Proc> = (0..2)
        .map(|i| {
            let mut vars = vec![
                (ENV_WATCH, "cut_a,cut_b".to_owned()),
                (ENV_PAUSE_MS, "20".to_owned()),
            ];
            if i == 0 {
                vars.push((ENV_RESOLVE, "cut_a".to_owned()));
            }
            run.spawn("lifecycle", i, &run.url, &vars)
        })
        .collect();
    cut.wait_line("claimed", Duration::from_secs(30));
    for p in &mut peers {
        p.wait_line("ready", Duration::from_secs(30));
    }
    run.signal("go");
    assert!(
        wait_until(Duration::from_secs(20), || peers
            .iter()
            .all(|p| p.count("completed ") >= 3)),
        "the peers did not get going"
    );
    let at_cut: Vec<usize> = peers.iter().map(|p| p.count("completed ")).collect();
    proxy.cut();
    let cut_at = Instant::now();
    run.signal("cut");

    // Wait for the cut worker's call to come back (or its watchdog), and for the peers to
    // see both claims in doubt and resolve the first.
    let mut in_doubt_after = None;
    let mut call_after = None;
    let done = wait_until(HANG_LIMIT + Duration::from_secs(10), || {
        // cut_b stays in doubt, so both peers see it; cut_a may be resolved by peer 0
        // before peer 1 looks.
        if in_doubt_after.is_none()
            && peers[0].count("in_doubt cut_a ") == 1
            && peers[0].has_line("resolved cut_a")
            && peers.iter().all(|p| p.count("in_doubt cut_b ") == 1)
        {
            in_doubt_after = Some(cut_at.elapsed());
        }
        if call_after.is_none()
            && (cut.count("during_cut ") > 0 || cut.child.try_wait().ok().flatten().is_some())
        {
            call_after = Some(cut_at.elapsed());
        }
        in_doubt_after.is_some() && call_after.is_some()
    });
    let during: Vec<usize> = peers.iter().map(|p| p.count("completed ")).collect();
    proxy.heal();
    run.signal("healed");
    let cut_status = cut.wait_exit(Duration::from_secs(40));
    run.signal("stop");
    for p in &mut peers {
        p.expect_success(Duration::from_secs(40));
    }
    let watched = |p: &Proc| -> Vec<String> {
        let lines = p.lines().into_iter();
        lines.filter(|l| !l.starts_with("completed ")).collect()
    };
    assert!(
        in_doubt_after.is_some(),
        "the peers did not see the claims InDoubt (and peer 0 resolve cut_a) within {:?} of \
         the cut: peer 0 {:?}, peer 1 {:?}",
        HANG_LIMIT + Duration::from_secs(10),
        watched(&peers[0]),
        watched(&peers[1])
    );
    for p in &peers {
        for line in p.lines().iter().filter(|l| l.starts_with("in_doubt ")) {
            assert!(
                line.ends_with("Some(LeaseTimeout)"),
                "worker {}: {line}",
                p.index
            );
        }
        let errors: Vec<String> = p
            .lines()
            .into_iter()
            .filter(|l| l.starts_with("error "))
            .collect();
        assert!(errors.is_empty(), "peer {} saw errors: {errors:?}", p.index);
    }
    for (i, (before, after)) in at_cut.iter().zip(&during).enumerate() {
        assert!(
            after > before,
            "peer {i} completed nothing while the other worker was cut off ({before} -> {after})"
        );
    }
    for (id, who) in run.effects() {
        assert_eq!(who.len(), 1, "{id}: effects {who:?}");
    }

    // The cut worker's own call: typed, within the limit.
    let out = cut.lines();
    let hung = out.iter().find(|l| l.starts_with("hung "));
    assert!(
        hung.is_none() && cut_status.is_some_and(|s| s.code() != Some(HUNG_EXIT)),
        "FINDING: a call through a cut connection neither failed nor returned: `{}` (exit \
         {cut_status:?}); the peers meanwhile completed {during:?} operations (from \
         {at_cut:?}) and saw the claims InDoubt after {in_doubt_after:?}: {}",
        hung.map_or("no line", String::as_str),
        cut.describe()
    );
    assert!(
        done,
        "the cut worker's call did not come back: {}",
        cut.describe()
    );
    let during_cut = out
        .iter()
        .find(|l| l.starts_with("during_cut "))
        .unwrap_or_else(|| panic!("no during_cut line: {}", cut.describe()));
    assert_eq!(word(during_cut, 1), "error", "{during_cut}");
    assert_eq!(word(during_cut, 3), "Unavailable", "{during_cut}");
    assert_eq!(word(during_cut, 4), "retryable=true", "{during_cut}");

    // After the heal: the resolved claim is refused, the other one accepted.
    assert!(
        cut_status.is_some_and(|s| s.success()),
        "the cut worker did not end well: {}",
        cut.describe()
    );
    assert!(
        out.iter()
            .any(|l| l.starts_with("late cut_a refused StaleClaim")),
        "cut_a was resolved by a peer: {}",
        cut.describe()
    );
    assert!(
        out.iter().any(|l| l == "late cut_b ok"),
        "{}",
        cut.describe()
    );
    let journal = run.journal(Journal::builder());
    let result = |id: &str| journal.result(id).expect("result").expect("a result").bytes;
    assert_eq!(result("cut_a"), b"resolved@w0");
    assert_eq!(result("cut_b"), b"cut_b@w9");
    eprintln!(
        "cut: peers completed {at_cut:?} before the cut and {during:?} by the time the cut \
         worker's call returned ({call_after:?} after the cut); InDoubt seen and cut_a \
         resolved {in_doubt_after:?} after the cut; the cut worker: {during_cut}"
    );
}

/// Four processes run a compactor every 10 ms on one journal whose operations (100 made
/// by the parent, 40 by each worker while the compactors run) pass an ack timeout of
/// 400 ms and a result retention of 800 ms: each operation's history has exactly one
/// `ack_expired` and one `retired` event.
#[test]
fn compactors_in_four_processes_never_fire_a_transition_twice() {
    let Some(cluster) = PgCluster::start_or_skip() else {
        return;
    };
    const WORKERS: usize = 4;
    const PER_WORKER: usize = 40;
    let (ack, retain) = (Duration::from_millis(400), Duration::from_millis(800));
    let run = Run::new(cluster.url(), "compactors");
    let journal = run.journal(Journal::builder().ack_timeout(ack).result_retention(retain));
    let mut all = Vec::new();
    for id in ids("p", 100) {
        let Admission::Fresh(claim) = journal.submit(op(&id)).expect("submit") else {
            panic!("{id} is new");
        };
        journal
            .complete(&claim, Outcome::applied(1, format!("{id}@parent")))
            .expect("complete");
        all.push(id);
    }
    let mut procs: Vec<Proc> = (0..WORKERS)
        .map(|i| {
            run.spawn(
                "compact",
                i,
                &run.url,
                &[
                    (ENV_ACK_MS, ack.as_millis().to_string()),
                    (ENV_RETAIN_MS, retain.as_millis().to_string()),
                    (ENV_COUNT, PER_WORKER.to_string()),
                ],
            )
        })
        .collect();
    for p in &mut procs {
        p.wait_line("ready", Duration::from_secs(30));
    }
    let started = Instant::now();
    run.signal("go");
    for p in &mut procs {
        p.wait_line("created", Duration::from_secs(60));
        all.extend((0..PER_WORKER).map(|n| format!("w{}_{n}", p.index)));
    }
    // The last operation retires 800 ms after its outcome; the compactors run a while past.
    thread::sleep(retain + Duration::from_millis(1_500));
    run.signal("stop");
    for p in &mut procs {
        p.expect_success(Duration::from_secs(30));
    }
    let elapsed = started.elapsed();
    let mut compactor_lines = Vec::new();
    for p in &procs {
        for line in p.lines() {
            match word(&line, 0) {
                "compactor" => compactor_lines.push(line.clone()),
                "ready" | "created" => {}
                _ => panic!("worker {}: unexpected line `{line}`", p.index),
            }
        }
    }
    let mut by_kind: HashMap<&str, usize> = HashMap::new();
    for id in &all {
        let history = journal.history(id).expect("history");
        let count = |name: &str| history.iter().filter(|e| e.kind.name() == name).count();
        assert_eq!(count("ack_expired"), 1, "{id}: {history:#?}");
        assert_eq!(count("retired"), 1, "{id}: {history:#?}");
        assert!(
            history
                .iter()
                .all(|e| !matches!(e.kind, EventKind::Exhausted)),
            "{id}: {history:#?}"
        );
        let r = journal.lookup(id).expect("lookup").expect("a receipt");
        assert_eq!(r.status, ExecutionStatus::Retired, "{id}");
        for e in &history {
            *by_kind.entry(e.kind.name()).or_default() += 1;
        }
    }
    eprintln!(
        "compactors: {} operations, {WORKERS} processes compacting every 10 ms for {elapsed:?}; \
         events {by_kind:?}; {compactor_lines:?}",
        all.len()
    );
}
