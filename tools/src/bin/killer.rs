//! The kill -9 and syscall-fault harness (issue 5).
//!
//! ```text
//! cargo run --release -p opjournal-tools --bin killer -- --runs 1000
//! cargo run --release -p opjournal-tools --bin killer -- --strace --runs 20
//! ```
//!
//! **kill -9** (default): each run starts a child process (this binary with `--child`)
//! that runs the seeded workload of `tests/support/driver.rs` against a journal file on
//! disk, checking every answer against the reference model as it goes, and reports each
//! completed call on a pipe. At a random moment the parent kills it with SIGKILL, then:
//! verifies the file (`Inspector::verify`: redb integrity, every record's CRC and decode,
//! indexes == replay of the event journal), replays the same seed in-process to know
//! exactly what the child had been told, reopens the file and checks that it equals one
//! of the states the crash may leave: every durable `Ok` present, the call in flight
//! landed or not (never half), lazily durable deliveries and acknowledgements kept or
//! lost in order, operations running at the kill `InDoubt`, no effect applied twice.
//!
//! **strace** (`--strace`): the child runs under `strace -e inject=...`: fdatasync fails
//! with EIO once, or from the Nth call on; pwrite64 fails with ENOSPC once; or the child
//! is killed at its Nth fdatasync or pwrite64. A child that sees an error must find its
//! handle poisoned and every further write refused; it reopens the file in-process and
//! checks the recovered journal against the model (the failed commit may or may not have
//! landed), then carries on. When it cannot reopen (the failure persists) or is killed,
//! the parent checks the file as for kill -9.
//!
//! Every run prints its seed on failure; `--seed S --runs 1` replays it.

#[path = "../../../tests/support/model.rs"]
mod model;

#[path = "../../../tests/support/driver.rs"]
mod driver;

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
    w.model
        .config()
        .builder(w.model.clock())
        .sharing(sharing)
        .open(path)
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
            Ok(st) => say(format!("step {k} {st:?}")),
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

fn one_line(s: &str) -> String {
    s.replace('\n', " | ")
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
    violations: u64,
}

/// What the child reported.
#[derive(Default, Debug)]
struct Report {
    ready: bool,
    steps: Vec<String>,
    reopened: u64,
    end: Option<String>,
}

impl Report {
    fn take(&mut self, line: &str) {
        if line == "ready" {
            self.ready = true;
        } else if let Some(rest) = line.strip_prefix("step ") {
            let kind = rest.split_once(' ').map_or("", |(_, k)| k);
            self.steps.push(kind.to_string());
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
    let sharing = if rng.chance(50) {
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
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(line) => {
                report.take(&line);
                if report.end.is_some() {
                    break;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) if Instant::now() < deadline => {}
            Err(_) => break,
        }
    }
    let _ = child.wait();
    // Lines still in the pipe were written before the kill: they count.
    while let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
        report.take(&line);
    }
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
    let r = check_after_crash(seed, sharing, &path, &report, totals);
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
        let sharing = if rng.chance(50) {
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
        let mut report = Report::default();
        while let Ok(line) = rx.recv_timeout(Duration::from_secs(60)) {
            report.take(&line);
        }
        let status = child.wait().map_err(|e| e.to_string())?;
        totals.faults_injected += 1;
        totals.reported_steps += report.steps.len() as u64;
        totals.child_reopens += report.reopened;
        let end = report.end.clone().unwrap_or_default();
        let r = if end.starts_with("violation") {
            Err(format!("the child reported: {end}"))
        } else if end.starts_with("open-failed") {
            // The fault hit the journal's creation or first open: nothing was answered;
            // the file must be absent or open cleanly now that the disk works.
            totals.open_faults += 1;
            reopenable(&path)
        } else if end.starts_with("done") {
            totals.child_checked += 1;
            // The child checked every reopen itself; the file must verify and open.
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
            if report.reopened > 0 {
                Err(format!(
                    "the child reopened {} time(s) before stopping ({end}); the run cannot be replayed",
                    report.reopened
                ))
            } else {
                totals.kills += u64::from(!status.success() && end.is_empty());
                totals.parent_checked += 1;
                check_after_crash(seed, sharing, &path, &report, totals)
            }
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
            "strace faults: {} runs, {} syscall fault scenarios in {elapsed:.1}s ({} faults hit the journal's creation or open; {} children ran to the end, checking {} in-process reopens after an error themselves (each after finding its handle poisoned); {} children were killed by SIGKILL injection or stopped by a persistent fault and checked by the parent); {} steps reported; acknowledged durable calls checked by the parent after a stop: {}; running at the stop and found in doubt: {}; violations: {}",
            totals.runs,
            totals.faults_injected,
            totals.open_faults,
            totals.child_checked,
            totals.child_reopens,
            totals.parent_checked,
            totals.reported_steps,
            c.acked_checked,
            c.running_at_cut,
            totals.violations
        );
    } else {
        println!(
            "kill -9: {} runs in {elapsed:.1}s; {} kills (SIGKILL), {} before the journal was open, {} children finished first; {} steps reported by children; acknowledged durable calls checked after a kill: {}; lazily durable or in-flight states lost (allowed): {}; running at the kill and found in doubt: {}; effects applied: {}; violations: {}",
            totals.runs,
            totals.kills,
            totals.kills_before_ready,
            totals.finished_before_kill,
            totals.reported_steps,
            c.acked_checked,
            c.maybe_lost,
            c.running_at_cut,
            c.applications,
            totals.violations
        );
    }
    if totals.violations > 0 {
        std::process::exit(1);
    }
}
