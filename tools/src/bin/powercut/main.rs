//! Power cuts on real files (issue 23): the journal's own file code (`std::fs::File`, the
//! log's `FileLog`, redb's `FileBackend`) on a FUSE file system that loses unsynced writes.
//!
//! ```text
//! cargo run --release -p opjournal-tools --bin powercut -- --runs 1000
//! cargo run --release -p opjournal-tools --bin powercut -- --seed 0x... --runs 1 --verbose
//! ```
//!
//! Needs `/dev/fuse`, the right to mount (root, or CAP_SYS_ADMIN; fuser mounts without
//! libfuse) and `fusermount3` (Debian's `fuse3`), with which it unmounts what a killed
//! harness left mounted (at its next start) and what a failed unmount leaves. A panic
//! unmounts on the way out.
//!
//! Each run mounts cutfs (`cutfs.rs`: a passthrough over a fresh backing directory that
//! keeps every write since a file's last `fsync`/`fdatasync`, and every directory change
//! since the directory's last `fsync`, in memory) and starts a child process (this binary
//! with `--child`) that opens `<mount>/journal.opj` with the default settings and the
//! smallest checkpoint size (64 KiB: a checkpoint, which writes the log into redb and
//! starts the log over, every few results), and runs the concurrent workload of
//! `workload.rs` from two to four threads, printing every answer once the call returned.
//! At a random moment the power is cut: either cutfs holds the Nth changing operation (a write,
//! sync, length change, create, link, rename or unlink of either file, counted from the
//! mount) or the child has printed a random number of answers; the child is killed with
//! SIGKILL, and cutfs drops what was not synced (all of it, none of it, or a random part:
//! each pending write kept, dropped or torn at 512-byte sectors, a prefix of the directory
//! changes). The file system is unmounted; the backing directory then holds exactly what
//! a reboot would find. The parent checks it with the real file code:
//! - `Inspector::verify` on the files as the cut left them is clean (redb integrity, every
//!   record's CRC and decode, the log's records, indexes equal to the replay of events);
//! - every answer the child printed is the crash suites' reference model's answer, and the
//!   reopened journal equals the model's state after every printed call, with any subset of
//!   the calls in flight at the cut landed (`Recovery::recover`: every acknowledged
//!   operation present with its recorded outcome; operations running at the cut `InDoubt`;
//!   nothing applied twice, nothing half-applied);
//! - submitting every operation again answers as the model says (an operation whose claim
//!   was held at the cut is `InDoubt`, never `Fresh`), and the file verifies after a clean
//!   close.
//!
//! Before the runs, cutfs checks itself (`selftest.rs`). After them, the harness fails if
//! its cuts did not land often enough in checkpoints (unsynced redb pages, or a redb write
//! or sync held) and in log appends, or never during the journal's creation.
//! `--lying-disk` makes cutfs acknowledge the log's syncs without making anything
//! durable: the runs must then find violations (a check of the checks).
//!
//! A failing run prints its seed and how to run it again (the threads' interleaving
//! differs from one try to the next); `--keep-failures DIR` keeps the files as the cut left
//! them and the child's output, and `--recheck DIR/<seed>` checks those again, exactly.

use opjournal_testkit::{driver, model};

mod cutfs;
mod selftest;
mod workload;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use driver::{Rng, SMALL_CHECKPOINT, T0};
use fuser::{BackgroundSession, MountOption};
use model::{Call, Model, ModelConfig, StepResult};
use opjournal::{
    DEFAULT_MAX_RESULT_BYTES, Inspector, Journal, JournalBuilder, ManualClock, RetryPolicy,
    ScopeLock, Sharing, Timestamp,
};

use cutfs::{Class, CutFs, CutPolicy, CutReport, Shared};
use workload::{PCall, Plan, Wire};

const DEFAULT_BASE: u64 = 0x00C0_7000_0000_0000;

/// The source name of cutfs mounts in /proc/mounts.
const FS_NAME: &str = "opj-cutfs";

/// Changing operations of cutfs (writes, syncs, length and directory changes) until the
/// child has created and opened the journal (63 to 75 measured), and per 10 calls of the
/// workload after that (up to 17 measured): where the triggers are placed.
const OPS_TO_OPEN: u64 = 70;
const OPS_PER_10_CALLS: u64 = 18;

/// The journal's name inside the mount.
const JOURNAL: &str = "journal.opj";

#[derive(Debug, Clone)]
struct Args {
    runs: u64,
    base: u64,
    threads: usize,
    calls: u64,
    keep: Option<PathBuf>,
    verbose: bool,
    quiet: bool,
    /// cutfs lies about log syncs: the check must find violations.
    lying_disk: bool,
    /// Checks again the files and output a failed run kept.
    recheck: Option<PathBuf>,
    child: Option<ChildArgs>,
}

#[derive(Debug, Clone)]
struct ChildArgs {
    seed: u64,
    path: PathBuf,
}

fn parse_u64(s: &str) -> Result<u64, String> {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    }
    .map_err(|e| format!("`{s}` is not a number: {e}"))
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        runs: 100,
        base: DEFAULT_BASE,
        threads: 4,
        calls: 300,
        keep: None,
        verbose: false,
        quiet: false,
        lying_disk: false,
        recheck: None,
        child: None,
    };
    let (mut child, mut seed, mut path) = (false, 0, None);
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = || it.next().ok_or_else(|| format!("`{arg}` needs a value"));
        match arg.as_str() {
            "--runs" => a.runs = parse_u64(&val()?)?,
            "--seed" => a.base = parse_u64(&val()?)?,
            "--threads" => a.threads = parse_u64(&val()?)?.clamp(1, 8) as usize,
            "--calls" => a.calls = parse_u64(&val()?)?.max(1),
            "--keep-failures" => a.keep = Some(PathBuf::from(val()?)),
            "--verbose" => a.verbose = true,
            "--quiet" => a.quiet = true,
            "--lying-disk" => a.lying_disk = true,
            "--recheck" => a.recheck = Some(PathBuf::from(val()?)),
            "--child" => child = true,
            "--child-seed" => seed = parse_u64(&val()?)?,
            "--child-path" => path = Some(PathBuf::from(val()?)),
            "-h" | "--help" => {
                println!(
                    "usage: powercut [--runs N] [--seed S] [--threads T] [--calls C] [--keep-failures DIR] [--verbose] [--quiet] [--lying-disk] [--recheck DIR]"
                );
                println!(
                    "  --threads T: each run uses 2 to T threads (default 4); --calls C: each thread makes up to C calls (default 300)"
                );
                println!(
                    "  --keep-failures DIR: keep a failed run's files as the cut left them, and the child's output; --recheck DIR/<seed>: check them again"
                );
                println!(
                    "  --lying-disk: cutfs answers the log's syncs without making anything durable (the runs must fail: a check of the checks)"
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
        });
    }
    Ok(a)
}

/// The journal's settings: the defaults, with the smallest checkpoint size.
fn builder(clock: &ManualClock) -> JournalBuilder {
    Journal::builder()
        .checkpoint_size(SMALL_CHECKPOINT)
        .clock(clock.clone())
}

/// The same settings for the model (the library's documented defaults; a changed default
/// shows as a mismatch).
fn model_config() -> ModelConfig {
    const DAY: u64 = 24 * 3600;
    ModelConfig {
        lease: Duration::from_secs(5 * 60),
        ack_timeout: Duration::from_secs(15 * 60),
        result_retention: Duration::from_secs(7 * DAY),
        audit_retention: Duration::from_secs(90 * DAY),
        retry: RetryPolicy::default(),
        session_window: 64,
        scope_lock: ScopeLock::Serial,
        max_result_bytes: DEFAULT_MAX_RESULT_BYTES,
        compaction_batch: 1000,
        sharing: Sharing::LiveReaders,
        checkpoint_size: Some(SMALL_CHECKPOINT),
        compaction_scan: None,
        // Real files (cutfs): the journal keeps its log in two, whatever this says.
        two_logs: true,
    }
}

// ---------------------------------------------------------------------------------------
// The child: the workload on the mounted journal.
// ---------------------------------------------------------------------------------------

/// Writes one line to stdout in one piece (threads never interleave inside a line).
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let ok = out
        .write_all(format!("{line}\n").as_bytes())
        .and_then(|()| out.flush());
    if ok.is_err() {
        // The parent is gone.
        std::process::exit(5);
    }
}

fn child_main(c: &ChildArgs, threads: usize, calls: u64) -> i32 {
    let clock = ManualClock::new(Timestamp::from_millis(T0));
    let journal = match builder(&clock).open(&c.path) {
        Ok(j) => Arc::new(j),
        Err(e) => {
            say(&format!("open-failed {}", one_line(&e.to_string())));
            return 4;
        }
    };
    say("ready");
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let j = Arc::clone(&journal);
            let seed = c.seed;
            std::thread::spawn(move || {
                let mut plan = Plan::new(seed, t);
                while plan.calls < calls {
                    let call = plan.next_call();
                    let k = plan.calls;
                    match workload::execute(&j, &call) {
                        Ok(answer) => {
                            let json = serde_json::to_string(&answer).unwrap_or_default();
                            say(&format!("ok {t} {k} {json}"));
                            plan.observe(&call, &answer);
                        }
                        Err(e) => {
                            say(&format!(
                                "fail {t} {k} {}: {}",
                                call.describe(),
                                one_line(&e)
                            ));
                            return;
                        }
                    }
                }
                say(&format!("done {t}"));
            })
        })
        .collect();
    for (t, h) in handles.into_iter().enumerate() {
        if h.join().is_err() {
            say(&format!("fail {t} 0 the thread panicked (see stderr)"));
        }
    }
    say("idle");
    // Wait for the power cut: closing the journal would make everything durable.
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn one_line(s: &str) -> String {
    s.replace('\n', " | ")
}

// ---------------------------------------------------------------------------------------
// The parent.
// ---------------------------------------------------------------------------------------

/// What the child printed.
#[derive(Default, Debug)]
struct Report {
    ready: bool,
    /// (thread, call number, answer), in the order printed.
    answers: Vec<(usize, u64, Wire)>,
    /// Threads that finished their calls or stopped on an error.
    stopped: BTreeMap<usize, String>,
    idle: bool,
    /// `open-failed ...` or a line that makes no sense.
    end: Option<String>,
    /// Every line, for a failure's files.
    lines: Vec<String>,
}

impl Report {
    fn take(&mut self, line: String) {
        if line == "ready" {
            self.ready = true;
        } else if line == "idle" {
            self.idle = true;
        } else if let Some(rest) = line.strip_prefix("ok ") {
            let mut it = rest.splitn(3, ' ');
            let parsed = match (it.next(), it.next(), it.next()) {
                (Some(t), Some(k), Some(json)) => t
                    .parse()
                    .ok()
                    .zip(k.parse().ok())
                    .zip(serde_json::from_str::<Wire>(json).ok()),
                _ => None,
            };
            match parsed {
                Some(((t, k), w)) => self.answers.push((t, k, w)),
                None => self.end = Some(format!("an answer that does not parse: {line}")),
            }
        } else if let Some(t) = line.strip_prefix("done ") {
            if let Ok(t) = t.parse() {
                self.stopped.insert(t, "done".into());
            }
        } else if let Some(rest) = line.strip_prefix("fail ") {
            let t = rest.split(' ').next().and_then(|t| t.parse().ok());
            self.stopped.insert(t.unwrap_or(usize::MAX), line.clone());
        } else {
            self.end = Some(line.clone());
        }
        if self.lines.len() < 200_000 {
            self.lines.push(line);
        }
    }

    fn failures(&self) -> Vec<&String> {
        self.stopped
            .values()
            .filter(|s| s.starts_with("fail"))
            .collect()
    }
}

enum Ev {
    Line(String),
    Eof,
    Triggered,
}

/// Reads the child's complete lines on a thread (a line cut short by the kill is not an
/// answer).
fn read_lines(child: &mut Child, tx: mpsc::Sender<Ev>) {
    if let Some(out) = child.stdout.take() {
        std::thread::spawn(move || {
            let mut r = BufReader::new(out);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match r.read_until(b'\n', &mut buf) {
                    Ok(n) if n > 0 && buf.ends_with(b"\n") => {
                        buf.pop();
                        let line = String::from_utf8_lossy(&buf).into_owned();
                        if tx.send(Ev::Line(line)).is_err() {
                            return;
                        }
                    }
                    _ => {
                        let _ = tx.send(Ev::Eof);
                        return;
                    }
                }
            }
        });
    }
}

/// The mounted file system; unmounted when dropped (also on a panic), after the child is
/// gone (the [`ChildGuard`] is declared after it, so it drops first).
struct Mounted {
    session: Option<BackgroundSession>,
    mnt: PathBuf,
    shared: Arc<Shared>,
}

impl Mounted {
    fn mount(shared: &Arc<Shared>, mnt: &Path) -> std::io::Result<Mounted> {
        let mut cfg = fuser::Config::default();
        cfg.mount_options = vec![
            MountOption::FSName(FS_NAME.into()),
            MountOption::Subtype("cutfs".into()),
        ];
        let session = fuser::spawn_mount(CutFs(Arc::clone(shared)), mnt, &cfg)?;
        Ok(Mounted {
            session: Some(session),
            mnt: mnt.to_path_buf(),
            shared: Arc::clone(shared),
        })
    }

    /// Unmounts and ends the session. `Ok(true)`: the kernel had aborted the FUSE
    /// connection, so the session ended with `ECONNABORTED` instead of a clean end (seen
    /// once in about 2,000 runs on Linux 6.18, at this unmount, after the power cut; the
    /// files are what the cut left either way, and the mount is gone or lazily removed).
    fn unmount(&mut self) -> Result<bool, String> {
        // A held operation must not keep the session busy.
        self.shared.release();
        let Some(session) = self.session.take() else {
            return Ok(false);
        };
        let aborted = match session.umount_and_join() {
            Ok(()) => false,
            Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => true,
            Err(e) => {
                lazy_unmount(&self.mnt);
                return Err(format!("unmounting {}: {e}", self.mnt.display()));
            }
        };
        if is_mounted(&self.mnt) {
            lazy_unmount(&self.mnt);
        }
        Ok(aborted)
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Err(e) = self.unmount() {
            eprintln!("powercut: {e}");
        }
    }
}

fn is_mounted(mnt: &Path) -> bool {
    let Ok(mnt) = mnt.canonicalize() else {
        return false;
    };
    std::fs::read_to_string("/proc/self/mounts").is_ok_and(|m| {
        m.lines()
            .any(|l| l.split(' ').nth(1) == Some(&*mnt.to_string_lossy()))
    })
}

/// Unmounts the cutfs mounts whose file system process is gone (a harness killed before
/// it could unmount: the mount answers `ENOTCONN`); live ones (another harness's) answer.
fn sweep_stale_mounts() {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") else {
        return;
    };
    for line in mounts.lines() {
        let mut it = line.split(' ');
        if let (Some(FS_NAME), Some(mnt)) = (it.next(), it.next()) {
            let mnt = PathBuf::from(mnt.replace("\\040", " "));
            if std::fs::metadata(&mnt).is_err_and(|e| e.raw_os_error() == Some(libc::ENOTCONN)) {
                eprintln!(
                    "powercut: unmounting {} (left by a harness that died)",
                    mnt.display()
                );
                lazy_unmount(&mnt);
            }
        }
    }
}

fn lazy_unmount(mnt: &Path) {
    let _ = Command::new("fusermount3")
        .args(["-u", "-z", "-q"])
        .arg(mnt)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// The child, killed and reaped when dropped.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// How a run's power cut was decided.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum When {
    /// cutfs held the Nth changing operation.
    Trigger,
    /// The child had printed a number of answers.
    Answers,
    /// The workload had finished (everything answered was durable and nothing pending).
    Idle,
    /// The child stopped by itself (it could not open the journal).
    ChildExit,
    Deadline,
}

/// Figures over all runs.
#[derive(Default, Debug, Clone)]
struct Totals {
    runs: u64,
    when: BTreeMap<String, u64>,
    policy: BTreeMap<String, u64>,
    before_ready: u64,
    /// Cuts in a checkpoint (unsynced redb page writes, or a held redb write or sync), after
    /// the journal opened.
    mid_checkpoint: u64,
    /// Cuts whose held operation was on the redb file (a checkpoint's next write or sync).
    held_on_db: u64,
    /// Cuts in a log append (unsynced log writes, or a held log write or sync).
    mid_log_append: u64,
    held_on_log: u64,
    /// Cuts with unsynced directory changes.
    mid_dir_change: u64,
    nothing_pending: u64,
    kept: u64,
    dropped: u64,
    torn: u64,
    dir_kept: u64,
    dir_dropped: u64,
    /// redb syncs before the cut (two or three per checkpoint), and runs with at least one
    /// checkpoint after the journal opened.
    db_syncs: u64,
    runs_with_checkpoints: u64,
    answers_checked: u64,
    acked_writes_checked: u64,
    in_flight: u64,
    in_flight_landed: u64,
    running_in_doubt: u64,
    resubmits: u64,
    violations: u64,
    /// Log syncs (group commits and the log's own) before the cuts.
    log_syncs: u64,
    /// Runs whose FUSE session the kernel had aborted by the unmount after the cut (see
    /// [`Mounted::unmount`]).
    aborted_sessions: u64,
}

fn bump(map: &mut BTreeMap<String, u64>, key: impl Into<String>) {
    *map.entry(key.into()).or_default() += 1;
}

fn cut_policy(rng: &mut Rng) -> CutPolicy {
    match rng.below(5) {
        0 => CutPolicy::KeepAll,
        1 => CutPolicy::DropAll,
        _ => CutPolicy::Random,
    }
}

/// One run. `Ok` carries a line for `--verbose`.
fn run(args: &Args, exe: &Path, seed: u64, totals: &mut Totals) -> Result<String, String> {
    let mut rng = Rng::new(seed ^ 0x00C0_7C07);
    let dir = tempfile::Builder::new()
        .prefix("opj-powercut-")
        .tempdir()
        .map_err(|e| format!("temporary directory: {e}"))?;
    let backing = dir.path().join("backing");
    let mnt = dir.path().join("mnt");
    for d in [&backing, &mnt] {
        std::fs::create_dir(d).map_err(|e| format!("create {}: {e}", d.display()))?;
    }
    let (tx, rx) = mpsc::channel();
    let on_trigger = {
        let tx = Mutex::new(tx.clone());
        Box::new(move || {
            if let Ok(tx) = tx.lock() {
                let _ = tx.send(Ev::Triggered);
            }
        })
    };
    let shared = Arc::new(Shared::new(&backing, on_trigger).map_err(|e| format!("cutfs: {e}"))?);
    if args.lying_disk {
        shared.lie_about_log_syncs();
    }
    // 2 to --threads threads.
    let threads = if args.threads <= 2 {
        args.threads
    } else {
        2 + rng.below(args.threads as u64 - 1) as usize
    };
    // When to cut: at a changing operation of cutfs, counted from the mount (one run in
    // ten within the journal's creation and first open), or after a number of answers.
    let calls = threads as u64 * args.calls;
    let (trigger_at, answers_at) = if rng.chance(65) {
        let n = if rng.chance(10) {
            1 + rng.below(OPS_TO_OPEN)
        } else {
            1 + rng.below(calls * OPS_PER_10_CALLS / 10)
        };
        (Some(n), u64::MAX)
    } else {
        (None, rng.below(calls))
    };
    if let Some(n) = trigger_at {
        shared.arm(n);
    }
    let policy = cut_policy(&mut rng);
    let delay = Duration::from_micros(rng.below(2_000));
    let mut mounted =
        Mounted::mount(&shared, &mnt).map_err(|e| format!("mount {}: {e}", mnt.display()))?;
    let stderr_path = dir.path().join("child-stderr");
    let stderr = std::fs::File::create(&stderr_path).map_err(|e| e.to_string())?;
    let child = Command::new(exe)
        .args(["--child", "--child-seed", &seed.to_string(), "--child-path"])
        .arg(mnt.join(JOURNAL))
        .args(["--threads", &threads.to_string()])
        .args(["--calls", &args.calls.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .map_err(|e| format!("spawn the child: {e}"))?;
    let mut child = ChildGuard(child);
    read_lines(&mut child.0, tx);
    let mut report = Report::default();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut db_syncs_at_ready = 0;
    let when = loop {
        let wait = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(wait) {
            Ok(Ev::Line(line)) => {
                let was_ready = report.ready;
                report.take(line);
                if report.ready && !was_ready {
                    db_syncs_at_ready = shared.stats().syncs[0];
                }
                if report.answers.len() as u64 >= answers_at {
                    std::thread::sleep(delay);
                    break When::Answers;
                }
                if report.idle {
                    break When::Idle;
                }
                if report.end.is_some() || !report.failures().is_empty() {
                    break When::ChildExit;
                }
            }
            Ok(Ev::Triggered) => break When::Trigger,
            Ok(Ev::Eof) => break When::ChildExit,
            Err(_) => break When::Deadline,
        }
    };
    // The power cut: the child dies (SIGKILL), and what was not synced is dropped.
    let _ = child.0.kill();
    let cut = shared.cut(policy, &mut || rng.next_u64()).map_err(|e| {
        format!("harness error: the power cut failed on the backing directory: {e}")
    })?;
    let _ = child.0.wait();
    // Lines still in the pipe were printed before the kill: they count.
    while let Ok(ev) = rx.recv_timeout(Duration::from_secs(10)) {
        match ev {
            Ev::Line(line) => report.take(line),
            Ev::Eof => break,
            Ev::Triggered => {}
        }
    }
    drop(child);
    // The cut is made: how the session ends does not change the files checked below.
    if mounted
        .unmount()
        .map_err(|e| format!("harness error: {e}"))?
    {
        totals.aborted_sessions += 1;
    }
    drop(mounted);
    shared
        .finish()
        .map_err(|e| format!("harness error: removing cutfs's staging directory: {e}"))?;
    // Figures of the cut.
    totals.runs += 1;
    bump(&mut totals.when, format!("{when:?}"));
    bump(&mut totals.policy, format!("{policy:?}"));
    tally(totals, &cut, &report, db_syncs_at_ready);
    // The files as the cut left them, for --keep-failures (the check changes them).
    let as_cut = dir.path().join("as-cut");
    if args.keep.is_some() {
        copy_files(&backing, &as_cut);
    }
    let result = (|| {
        if let Some(end) = &report.end {
            return Err(format!("the child reported: {end}"));
        }
        if let Some(f) = report.failures().first() {
            return Err(format!("a call failed before the power cut: {f}"));
        }
        if when == When::Deadline {
            return Err("the run did not end within its deadline".into());
        }
        if when == When::ChildExit {
            return Err("the child stopped before the power cut (a panic?)".into());
        }
        check(threads, seed, &backing, &report, totals)
    })();
    let summary = format!(
        "seed {seed:#x}, {threads} threads: cut at {when:?}{} ({policy:?}), {} answers, db/log writes {}/{} syncs {}/{}, pending db pages/db/log/dir {}/{}/{}/{}, kept/dropped/torn {}/{}/{}",
        cut.held
            .as_ref()
            .map_or(String::new(), |h| format!(" holding {h}")),
        report.answers.len(),
        cut.stats.writes[0],
        cut.stats.writes[1],
        cut.stats.syncs[0],
        cut.stats.syncs[1],
        cut.pending_db_pages,
        cut.pending_db,
        cut.pending_log,
        cut.pending_dir,
        cut.kept,
        cut.dropped,
        cut.torn,
    );
    match result {
        Ok(detail) => Ok(format!("{summary}: {detail}")),
        Err(e) => {
            keep_failure(args, seed, threads, &as_cut, &report, &stderr_path);
            Err(format!(
                "{summary}\n  {e}\n  child stderr: {}",
                std::fs::read_to_string(&stderr_path)
                    .map(|s| one_line(s.trim()))
                    .unwrap_or_default()
            ))
        }
    }
}

fn tally(totals: &mut Totals, cut: &CutReport, report: &Report, db_syncs_at_ready: u64) {
    if !report.ready {
        totals.before_ready += 1;
    }
    let ready = report.ready;
    let held_db = cut.held_class == Some(Class::Db);
    let held_log = cut.held_class == Some(Class::Log);
    totals.mid_checkpoint += u64::from(ready && (cut.pending_db_pages > 0 || held_db));
    totals.mid_log_append += u64::from(ready && (cut.pending_log > 0 || held_log));
    totals.held_on_db += u64::from(ready && held_db);
    totals.held_on_log += u64::from(ready && held_log);
    totals.mid_dir_change += u64::from(cut.pending_dir > 0);
    totals.nothing_pending +=
        u64::from(cut.pending_db_pages == 0 && cut.pending_log == 0 && cut.pending_dir == 0);
    totals.log_syncs += cut.stats.syncs[1];
    totals.kept += cut.kept as u64;
    totals.dropped += cut.dropped as u64;
    totals.torn += cut.torn as u64;
    totals.dir_kept += cut.dir_kept as u64;
    totals.dir_dropped += cut.dir_dropped as u64;
    if ready {
        let after_open = cut.stats.syncs[0].saturating_sub(db_syncs_at_ready);
        totals.db_syncs += after_open;
        totals.runs_with_checkpoints += u64::from(after_open > 0);
    }
}

/// Checks the backing directory after the cut against what the child printed.
fn check(
    threads: usize,
    seed: u64,
    backing: &Path,
    report: &Report,
    totals: &mut Totals,
) -> Result<String, String> {
    let path = backing.join(JOURNAL);
    // The child's answers, through the model in the order printed.
    let clock = ManualClock::new(Timestamp::from_millis(T0));
    let mut model = Model::new(model_config(), clock.clone());
    let mut plans: Vec<Plan> = (0..threads).map(|t| Plan::new(seed, t)).collect();
    let mut acked = 0u64;
    for (t, k, answer) in &report.answers {
        let plan = plans
            .get_mut(*t)
            .ok_or_else(|| format!("an answer from thread {t}"))?;
        let call = plan.next_call();
        if plan.calls != *k {
            return Err(format!(
                "thread {t} printed answer {k} where call {} was due",
                plan.calls
            ));
        }
        workload::expect(&mut model, &call, answer)
            .map_err(|e| format!("thread {t}, call {k}: {e}"))?;
        plan.observe(&call, answer);
        acked += u64::from(answer.wrote());
    }
    totals.answers_checked += report.answers.len() as u64;
    // Each thread still running had one call in flight (maybe not started).
    let in_flight: Vec<PCall> = if report.ready {
        plans
            .iter()
            .enumerate()
            .filter(|(t, _)| !report.stopped.contains_key(t))
            .map(|(_, p)| p.clone().next_call())
            .collect()
    } else {
        Vec::new()
    };
    if !path.exists() {
        return if report.ready {
            Err("the journal file is gone after the power cut".into())
        } else {
            Ok("no journal yet".into())
        };
    }
    // The files as the cut left them verify (as a reader process would see them).
    verify(&path).map_err(|e| format!("after the cut: {e}"))?;
    // The reopened journal is the model's state with some of the calls in flight landed.
    let (recovery, masks) = workload::candidates(&model, &in_flight);
    let j = builder(&clock)
        .open(&path)
        .map_err(|e| format!("reopen after the cut: {e}"))?;
    let (mut recovered, lost) = recovery.recover(&j).map_err(|e| {
        format!(
            "the reopened journal is none of the states the cut may leave (calls in flight: {:?}):\n{e}",
            in_flight.iter().map(PCall::describe).collect::<Vec<_>>()
        )
    })?;
    // Which calls in flight landed (bit k: call k).
    let mask = masks.get(recovery.len() - 1 - lost).copied().unwrap_or(0);
    let landed = mask.count_ones();
    totals.acked_writes_checked += acked;
    totals.in_flight += in_flight.len() as u64;
    totals.in_flight_landed += u64::from(landed);
    // Operations whose claim a thread held at the cut are in doubt now, unless the call
    // in flight that completed or released them landed.
    let landed_ids: Vec<&str> = in_flight
        .iter()
        .enumerate()
        .filter(|(k, _)| mask & (1 << k) != 0)
        .filter_map(|(_, c)| match c {
            PCall::Complete(c, _) | PCall::Release(c) => Some(c.operation_id()),
            _ => None,
        })
        .collect();
    let mut in_doubt = 0;
    for plan in &plans {
        for spec in &plan.specs {
            if !plan.holds(&spec.id) {
                continue;
            }
            if recovered.is_in_doubt(&spec.id) {
                in_doubt += 1;
            } else if !landed_ids.contains(&spec.id.as_str()) {
                return Err(format!(
                    "`{}` was running at the cut and is not in doubt after recovery",
                    spec.id
                ));
            }
        }
    }
    totals.running_in_doubt += in_doubt;
    // Every operation submitted again answers as the model says: in doubt, replayed,
    // refused, or fresh only where no effect can have been applied.
    for plan in &plans {
        for spec in &plan.specs {
            let step = recovered
                .step(&j, &Call::Submit(spec.clone()))
                .map_err(|e| format!("submitting `{}` again after recovery: {e}", spec.id))?;
            if let StepResult::Failed { error, .. } = step {
                return Err(format!(
                    "submitting `{}` again after recovery failed: {error:?}",
                    spec.id
                ));
            }
            totals.resubmits += 1;
        }
    }
    drop(j);
    verify(&path).map_err(|e| format!("after a clean close: {e}"))?;
    Ok(format!(
        "{acked} acknowledged writes present, {landed} of {} calls in flight landed, {in_doubt} running found in doubt",
        in_flight.len()
    ))
}

fn verify(path: &Path) -> Result<(), String> {
    let insp = Inspector::open(path).map_err(|e| format!("inspect: {e}"))?;
    let v =
        opjournal::verify_inspected(&insp, &mut |_, _| {}).map_err(|e| format!("verify: {e}"))?;
    if v.is_clean() {
        Ok(())
    } else {
        Err(format!(
            "verify: integrity {:?}, findings {:?}",
            v.integrity, v.findings
        ))
    }
}

fn copy_files(from: &Path, to: &Path) {
    let _ = std::fs::create_dir_all(to);
    if let Ok(entries) = std::fs::read_dir(from) {
        for e in entries.flatten() {
            if e.path().is_file() {
                let _ = std::fs::copy(e.path(), to.join(e.file_name()));
            }
        }
    }
}

fn keep_failure(
    args: &Args,
    seed: u64,
    threads: usize,
    as_cut: &Path,
    report: &Report,
    stderr: &Path,
) {
    let Some(dir) = &args.keep else { return };
    let dir = dir.join(format!("{seed:#x}"));
    copy_files(as_cut, &dir.join("files"));
    let _ = std::fs::write(dir.join("child-stdout"), report.lines.join("\n") + "\n");
    let _ = std::fs::write(dir.join("run"), format!("{seed:#x} {threads}\n"));
    let _ = std::fs::copy(stderr, dir.join("child-stderr"));
    eprintln!(
        "  kept in {}; check again: cargo run --release -p opjournal-tools --bin powercut -- --recheck {}",
        dir.display(),
        dir.display()
    );
}

/// `--recheck DIR`: the check of a kept failure, on a copy of its files.
fn recheck(dir: &Path) -> Result<String, String> {
    let run =
        std::fs::read_to_string(dir.join("run")).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut it = run.split_whitespace();
    let seed = parse_u64(it.next().unwrap_or_default())?;
    let threads = parse_u64(it.next().unwrap_or_default())? as usize;
    let out = std::fs::read(dir.join("child-stdout")).map_err(|e| e.to_string())?;
    let mut report = Report::default();
    for line in String::from_utf8_lossy(&out).lines() {
        report.take(line.to_string());
    }
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    copy_files(&dir.join("files"), tmp.path());
    check(threads, seed, tmp.path(), &report, &mut Totals::default())
}

fn pct(n: u64, of: u64) -> String {
    if of == 0 {
        "-".into()
    } else {
        format!("{:.0}%", 100.0 * n as f64 / of as f64)
    }
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("powercut: {e}");
            std::process::exit(2);
        }
    };
    if let Some(c) = &args.child {
        std::process::exit(child_main(c, args.threads, args.calls));
    }
    if let Some(dir) = &args.recheck {
        match recheck(dir) {
            Ok(line) => println!("no violation: {line}"),
            Err(e) => {
                println!("VIOLATION: {e}");
                std::process::exit(1);
            }
        }
        return;
    }
    if !Path::new("/dev/fuse").exists() {
        eprintln!("powercut: needs /dev/fuse (FUSE) and the right to mount");
        std::process::exit(2);
    }
    let have_fusermount = Command::new("fusermount3")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !have_fusermount {
        eprintln!("powercut: needs fusermount3 (apt-get install -y fuse3)");
        std::process::exit(2);
    }
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("powercut: cannot find this executable: {e}");
            std::process::exit(2);
        }
    };
    sweep_stale_mounts();
    match selftest::run(args.base) {
        Ok(n) => {
            if !args.quiet {
                eprintln!(
                    "  cutfs self-test: {n} reads and lengths as written, power cuts keep what was synced"
                );
            }
        }
        Err(e) => {
            eprintln!("powercut: cutfs fails its self-test: {e}");
            std::process::exit(1);
        }
    }
    let started = Instant::now();
    let mut totals = Totals::default();
    for r in 0..args.runs {
        let seed = args.base.wrapping_add(r);
        match run(&args, &exe, seed, &mut totals) {
            Ok(line) => {
                if args.verbose {
                    eprintln!("  run {r}, {line}");
                }
            }
            Err(e) => {
                totals.violations += 1;
                eprintln!(
                    "VIOLATION in run {r}, {e}\n  the same run (same seed, threads, cut point and policy; the threads' interleaving differs, so it may take a few tries): cargo run --release -p opjournal-tools --bin powercut -- --seed {seed:#x} --runs 1 --threads {} --calls {} --verbose{}",
                    args.threads,
                    args.calls,
                    if args.lying_disk { " --lying-disk" } else { "" }
                );
            }
        }
        if !args.quiet && !args.verbose && (r + 1) % 50 == 0 {
            eprintln!(
                "  {} runs in {:.0}s, {} violations",
                r + 1,
                started.elapsed().as_secs_f64(),
                totals.violations
            );
        }
    }
    let t = &totals;
    let after_open = t.runs - t.before_ready;
    println!(
        "power cuts on real files (cutfs): {} runs in {:.1}s, 2 to {} threads x up to {} calls; cut by {:?}; policies {:?}; {} cuts before the journal was open",
        t.runs,
        started.elapsed().as_secs_f64(),
        args.threads,
        args.calls,
        t.when,
        t.policy,
        t.before_ready,
    );
    println!(
        "  of the {after_open} cuts after the open: in a checkpoint (unsynced redb pages, or a redb write or sync held) {} ({}), of which holding a redb write or sync {} ({}); in a log append (unsynced log writes, or a log write or sync held) {} ({}), of which holding a log write or sync {} ({}); {} runs checkpointed before the cut ({} redb syncs); unsynced directory changes at {} cuts; nothing unsynced but redb's header at {}",
        t.mid_checkpoint,
        pct(t.mid_checkpoint, after_open),
        t.held_on_db,
        pct(t.held_on_db, after_open),
        t.mid_log_append,
        pct(t.mid_log_append, after_open),
        t.held_on_log,
        pct(t.held_on_log, after_open),
        t.runs_with_checkpoints,
        t.db_syncs,
        t.mid_dir_change,
        t.nothing_pending,
    );
    println!(
        "  unsynced writes kept {}, dropped {}, torn {}; directory changes kept {}, dropped {}; FUSE sessions found aborted at the unmount after the cut {}",
        t.kept, t.dropped, t.torn, t.dir_kept, t.dir_dropped, t.aborted_sessions
    );
    println!(
        "  {} answers checked against the model; {} acknowledged writes found after recovery (made durable by {} log syncs: group commits); {} calls in flight at the cut, {} landed; {} operations running at the cut found in doubt; {} operations submitted again as the model says; violations: {}",
        t.answers_checked,
        t.acked_writes_checked,
        t.log_syncs,
        t.in_flight,
        t.in_flight_landed,
        t.running_in_doubt,
        t.resubmits,
        t.violations
    );
    // The runs must reach what they are for: a harness whose cuts stopped landing in
    // checkpoints or log appends (a changed checkpoint size, a workload that no longer
    // writes) would pass without testing anything.
    let mut thin = Vec::new();
    if t.runs >= 100 {
        if t.mid_checkpoint * 5 < after_open {
            thin.push(format!(
                "{} cuts in a checkpoint (under 20%)",
                t.mid_checkpoint
            ));
        }
        if t.mid_log_append * 7 < after_open {
            thin.push(format!(
                "{} cuts in a log append (under 15%)",
                t.mid_log_append
            ));
        }
        if t.runs_with_checkpoints * 2 < after_open {
            thin.push(format!(
                "{} runs with a checkpoint before the cut (under half)",
                t.runs_with_checkpoints
            ));
        }
        if t.before_ready == 0 && t.runs >= 200 {
            thin.push("no cut while the journal was being created or opened".into());
        }
    }
    if !thin.is_empty() {
        println!(
            "  the runs did not cover what they are for: {}",
            thin.join("; ")
        );
    }
    if t.violations > 0 || !thin.is_empty() {
        std::process::exit(1);
    }
}
