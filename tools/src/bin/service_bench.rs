//! The editor service under load (issue 14): submit-to-result latency over loopback with
//! 1, 8 and 32 clients beside the library's own lifecycle in the same run, how many
//! submits an applied operation costs when clients contend for one document, and the
//! service's peak memory and threads after connection floods and a 50-client run.
//!
//! ```text
//! cargo build --release --bin opjournal
//! cargo run --release -p opjournal-tools --bin service_bench -- [--opjournal PATH]
//!     [--ops N] [--out DIR] [--json] [--quick]
//! ```
//!
//! The service is a real `opjournal serve` process (default `target/release/opjournal`),
//! its journal and document in `DIR/data` (default `target/service-bench`), on the same
//! file system as the library's journal. Clients are raw sockets speaking the JSON Lines
//! of docs/protocol.md and follow its retry rule: after `scope_busy` a backoff with full
//! jitter (the cap doubling from 10 ms to 1 s, halving after each applied operation), then
//! a `hello` and the same id again unless the revision moved; after `stale_base` (or a
//! moved revision) a `hello` to learn the revision and a new id.
//!
//! `--json` prints JSON Lines (`{"type": ..., "data": ...}`: `env`, `latency`,
//! `contention`, `memory`, and a final `summary`); types may be added later.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use opjournal::{Admission, Intent, Journal, Operation, Outcome};
use opjournal_tools::stats::{Percentiles, Rng, percentiles};
use serde_json::{Value, json};

type Error = Box<dyn std::error::Error + Send + Sync>;
type Result<T, E = Error> = std::result::Result<T, E>;

const WAIT: Duration = Duration::from_secs(60);

struct Args {
    opjournal: PathBuf,
    ops: usize,
    out: PathBuf,
    json: bool,
    quick: bool,
}

fn parse_args() -> Result<Args> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut args = Args {
        opjournal: root.join("target/release/opjournal"),
        ops: 400,
        out: root.join("target/service-bench"),
        json: false,
        quick: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--opjournal" => args.opjournal = it.next().ok_or("--opjournal PATH")?.into(),
            "--ops" => args.ops = it.next().ok_or("--ops N")?.parse()?,
            "--out" => args.out = it.next().ok_or("--out DIR")?.into(),
            "--json" => args.json = true,
            "--quick" => args.quick = true,
            other => return Err(format!("unknown argument `{other}`; see the file's docs").into()),
        }
    }
    if args.quick {
        args.ops = args.ops.min(80);
    }
    Ok(args)
}

// ---------------------------------------------------------------------------------------
// The service process and a raw client.
// ---------------------------------------------------------------------------------------

struct Server {
    child: Child,
    addr: SocketAddr,
}

impl Server {
    fn start(bin: &Path, dir: &Path, extra: &[&str]) -> Result<Server> {
        std::fs::create_dir_all(dir)?;
        let mut child = Command::new(bin)
            .arg("serve")
            .arg("--journal")
            .arg(dir.join("bench.opj"))
            .args(["--port", "0"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("could not start `{}` ({e}); build it with `cargo build --release --bin opjournal` or pass --opjournal PATH", bin.display()))?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().ok_or("no stdout")?).read_line(&mut line)?;
        let addr = line
            .trim_end()
            .strip_prefix("listening on ")
            .ok_or_else(|| format!("unexpected first line {line:?}"))?
            .parse()?;
        Ok(Server { child, addr })
    }

    /// `(peak RSS KiB, current RSS KiB, threads)` from /proc.
    fn memory(&self) -> Result<(u64, u64, u64)> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        let field = |name: &str| -> Result<u64> {
            let line = status
                .lines()
                .find(|l| l.starts_with(name))
                .ok_or_else(|| format!("no {name} in /proc status"))?;
            Ok(line[name.len()..]
                .split_whitespace()
                .next()
                .ok_or("empty field")?
                .parse()?)
        };
        Ok((field("VmHWM:")?, field("VmRSS:")?, field("Threads:")?))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Raw {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Raw {
    fn connect(addr: SocketAddr) -> Result<Raw> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(WAIT))?;
        let reader = BufReader::new(stream.try_clone()?);
        Ok(Raw { stream, reader })
    }

    fn send(&mut self, v: &Value) -> Result<()> {
        let mut line = v.to_string();
        line.push('\n');
        self.stream.write_all(line.as_bytes())?;
        Ok(())
    }

    fn recv(&mut self) -> Result<Value> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err("the service closed the connection".into());
        }
        Ok(serde_json::from_str(&line)?)
    }

    /// `hello`; returns the revision (pushed results are acknowledged and skipped).
    fn hello(&mut self, session: &str) -> Result<u64> {
        self.send(&json!({"type": "hello", "session": session}))?;
        let w = self.recv()?;
        if w["type"] != "welcome" {
            return Err(format!("expected a welcome, got {w}").into());
        }
        for _ in 0..w["pushing"].as_u64().unwrap_or(0) {
            let r = self.recv()?;
            self.send(&json!({"type": "ack", "id": r["id"]}))?;
            self.recv()?;
        }
        w["revision"]
            .as_u64()
            .ok_or_else(|| "welcome without revision".into())
    }
}

/// The retry rule's backoff: full jitter; the cap starts at 10 ms, doubles after each
/// `scope_busy` up to 1 s, halves after each applied operation (kept across operations).
struct Backoff {
    cap: Duration,
    rng: Rng,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(10);
    const MAX: Duration = Duration::from_secs(1);

    fn new(seed: u64) -> Backoff {
        Backoff {
            cap: Self::FIRST,
            rng: Rng::new(seed),
        }
    }
    fn succeeded(&mut self) {
        self.cap = (self.cap / 2).max(Self::FIRST);
    }
    fn next_delay(&mut self) -> Duration {
        let us = self.rng.below(self.cap.as_micros() as u64 + 1);
        self.cap = (self.cap * 2).min(Self::MAX);
        Duration::from_micros(us)
    }
}

/// What one client saw.
#[derive(Default)]
struct ClientRun {
    /// From the accepted submit to its result.
    admitted: Vec<Duration>,
    /// From the first submit of an edit (retries included) to its result.
    end_to_end: Vec<Duration>,
    submits: usize,
    busy: usize,
    stale: usize,
    applied: usize,
}

/// One client session: `ops` edits, each retried by the rule until applied.
fn client(addr: SocketAddr, k: usize, ops: usize, seed: u64) -> Result<ClientRun> {
    let mut c = Raw::connect(addr)?;
    let session = format!("client-{k}");
    let mut revision = c.hello(&session)?;
    let mut run = ClientRun::default();
    let mut backoff = Backoff::new(seed ^ (k as u64 + 1));
    for n in 0..ops {
        let object = format!("c{k}-{n}");
        let mut attempt = 0;
        let mut id = format!("c{k}-{n}-{attempt}");
        let first = Instant::now();
        loop {
            let t = Instant::now();
            run.submits += 1;
            c.send(&json!({
                "type": "submit", "id": id, "base_revision": revision,
                "edit": {"kind": "add", "object": object, "beside": "door"},
            }))?;
            let answer = c.recv()?;
            match (answer["type"].as_str(), answer["kind"].as_str()) {
                (Some("accepted"), _) => {
                    let r = c.recv()?;
                    if r["type"] != "result" || r["outcome"] != "applied" {
                        return Err(format!("`{id}`: expected its result, got {r}").into());
                    }
                    let now = Instant::now();
                    run.admitted.push(now - t);
                    run.end_to_end.push(now - first);
                    run.applied += 1;
                    backoff.succeeded();
                    revision = r["revision"].as_u64().unwrap_or(revision);
                    c.send(&json!({"type": "ack", "id": id}))?;
                    let acked = c.recv()?;
                    if acked["type"] != "acked" {
                        return Err(format!("`{id}`: ack answered {acked}").into());
                    }
                    break;
                }
                (Some("error"), Some("scope_busy")) => {
                    // Back off, then learn the revision: unchanged, the same id goes again;
                    // moved, the edit is decided again on the new document, with a new id.
                    run.busy += 1;
                    std::thread::sleep(backoff.next_delay());
                    let now = c.hello(&session)?;
                    if now != revision {
                        revision = now;
                        attempt += 1;
                        id = format!("c{k}-{n}-{attempt}");
                    }
                }
                (Some("error"), Some("stale_base")) => {
                    run.stale += 1;
                    revision = c.hello(&session)?;
                    attempt += 1;
                    id = format!("c{k}-{n}-{attempt}");
                }
                _ => return Err(format!("`{id}`: unexpected answer {answer}").into()),
            }
        }
    }
    Ok(run)
}

#[derive(Default)]
struct Contention {
    admitted: Percentiles,
    end_to_end: Percentiles,
    submits: usize,
    busy: usize,
    stale: usize,
    applied: usize,
    elapsed: Duration,
    peak_threads: u64,
}

/// `clients` sessions at once on one document, `ops` edits each.
fn contend(server: &Server, clients: usize, ops: usize) -> Result<Contention> {
    let addr = server.addr;
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    let started = Instant::now();
    // Sample the service's thread count while the clients run.
    let done = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicUsize::new(0));
    let pid = server.child.id();
    let sampler = {
        let (done, peak) = (done.clone(), peak.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status"))
                    && let Some(t) = s
                        .lines()
                        .find_map(|l| l.strip_prefix("Threads:"))
                        .and_then(|v| v.trim().parse::<usize>().ok())
                {
                    peak.fetch_max(t, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let handles: Vec<_> = (0..clients)
        .map(|k| std::thread::spawn(move || client(addr, k, ops, seed)))
        .collect();
    let mut all = ClientRun::default();
    for h in handles {
        let r = h.join().map_err(|_| "a client thread panicked")??;
        all.admitted.extend(r.admitted);
        all.end_to_end.extend(r.end_to_end);
        all.submits += r.submits;
        all.busy += r.busy;
        all.stale += r.stale;
        all.applied += r.applied;
    }
    done.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    Ok(Contention {
        admitted: percentiles(&all.admitted),
        end_to_end: percentiles(&all.end_to_end),
        submits: all.submits,
        busy: all.busy,
        stale: all.stale,
        applied: all.applied,
        elapsed: started.elapsed(),
        peak_threads: peak.load(Ordering::Relaxed) as u64,
    })
}

// ---------------------------------------------------------------------------------------
// The library's own lifecycle, and the one-client comparison.
// ---------------------------------------------------------------------------------------

/// submit (fresh) → complete(applied) → delivered → acknowledge, in-process.
fn lifecycle(journal: &Journal, n: usize, rev: &mut u64) -> Result<Duration> {
    let id = format!("lib-{n}");
    let t = Instant::now();
    let intent = Intent::from_json(
        "scene.add",
        &json!({"object": format!("o{n}"), "beside": "door"}),
    )?;
    let op = Operation::new(&id, intent)
        .scope("scene/main")
        .base_revision(*rev)
        .session("lib");
    let Admission::Fresh(claim) = journal.submit(op)? else {
        return Err(format!("`{id}`: not fresh").into());
    };
    *rev += 1;
    journal.complete(
        &claim,
        Outcome::applied(*rev, b"{\"summary\":\"added\"}".to_vec()),
    )?;
    journal.delivered(&id)?;
    journal.acknowledge(&id, Some("lib"))?;
    Ok(t.elapsed())
}

/// One client's submit → result, alternating with the library's lifecycle in slices so
/// both see the same machine.
fn one_client_beside_library(
    server: &Server,
    data: &Path,
    ops: usize,
) -> Result<(Percentiles, Percentiles)> {
    let journal = Journal::open(data.join("library.opj"))?;
    let mut rev = 0;
    let mut c = Raw::connect(server.addr)?;
    let mut revision = c.hello("solo")?;
    let (mut lib, mut svc) = (Vec::new(), Vec::new());
    let slice = 20;
    // Warm both up first.
    for n in 0..5 {
        lifecycle(&journal, 1_000_000 + n, &mut rev)?;
    }
    let mut n = 0;
    while lib.len() < ops {
        for _ in 0..slice {
            lib.push(lifecycle(&journal, n, &mut rev)?);
            let id = format!("solo-{n}");
            let t = Instant::now();
            c.send(&json!({
                "type": "submit", "id": id, "base_revision": revision,
                "edit": {"kind": "add", "object": format!("s{n}"), "beside": "door"},
            }))?;
            let accepted = c.recv()?;
            let result = c.recv()?;
            svc.push(t.elapsed());
            if accepted["type"] != "accepted" || result["type"] != "result" {
                return Err(format!("`{id}`: {accepted} then {result}").into());
            }
            revision = result["revision"].as_u64().unwrap_or(revision);
            c.send(&json!({"type": "ack", "id": id}))?;
            c.recv()?;
            n += 1;
        }
    }
    Ok((percentiles(&lib), percentiles(&svc)))
}

// ---------------------------------------------------------------------------------------
// Floods.
// ---------------------------------------------------------------------------------------

struct Memory {
    scenario: String,
    peak_rss_kib: u64,
    rss_kib: u64,
    threads: u64,
    note: String,
}

fn flood(bin: &Path, data: &Path, dropped: usize, idle: usize) -> Result<Memory> {
    let server = Server::start(bin, &data.join("flood"), &[])?;
    let (base_peak, _, base_threads) = server.memory()?;
    // Connections that say hello and drop at once.
    for i in 0..dropped {
        let mut c = Raw::connect(server.addr)?;
        c.send(&json!({"type": "hello", "session": format!("drop-{i}")}))?;
        drop(c);
    }
    // Then idle ones, kept open.
    let mut held = Vec::new();
    let mut refused = 0;
    for _ in 0..idle {
        let c = TcpStream::connect(server.addr)?;
        held.push(c);
    }
    // Let the service reach its steady state (accept everything, refuse the surplus).
    std::thread::sleep(Duration::from_secs(2));
    let mut served = None;
    for (i, c) in held.iter().enumerate() {
        c.set_nonblocking(true)?;
        let mut buf = [0u8; 256];
        match c.peek(&mut buf) {
            // The refusal (an error line, then the end).
            Ok(_) => refused += 1,
            Err(_) => served = served.or(Some(i)),
        }
    }
    let (peak, rss, threads) = server.memory()?;
    // The service still answers once a served connection goes away.
    let mut probe_ok = false;
    if let Some(i) = served {
        drop(held.remove(i));
    }
    std::thread::sleep(Duration::from_millis(300));
    if let Ok(mut c) = Raw::connect(server.addr) {
        probe_ok = c.hello("probe").is_ok();
    }
    drop(held);
    Ok(Memory {
        scenario: format!("after {dropped} dropped and {idle} idle connections"),
        peak_rss_kib: peak,
        rss_kib: rss,
        threads,
        note: format!(
            "{refused} of the idle ones were told too_many_connections; at start: {base_peak} KiB peak, {base_threads} threads; a new client after freeing one slot: {}",
            if probe_ok { "welcomed" } else { "NOT welcomed" }
        ),
    })
}

fn fifty_clients(
    bin: &Path,
    data: &Path,
    clients: usize,
    ops: usize,
) -> Result<(Memory, Contention)> {
    let server = Server::start(bin, &data.join("fifty"), &[])?;
    let c = contend(&server, clients, ops)?;
    let (peak, rss, threads) = server.memory()?;
    Ok((
        Memory {
            scenario: format!("after {clients} clients x {ops} operations"),
            peak_rss_kib: peak,
            rss_kib: rss,
            threads,
            note: format!(
                "peak threads while they ran: {}; {} applied in {:.1} s",
                c.peak_threads,
                c.applied,
                c.elapsed.as_secs_f64()
            ),
        },
        c,
    ))
}

// ---------------------------------------------------------------------------------------
// Report.
// ---------------------------------------------------------------------------------------

fn ms(us: f64) -> String {
    format!("{:.2} ms", us / 1000.0)
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn main() -> Result<()> {
    let args = parse_args()?;
    let data = args.out.join("data");
    let _ = std::fs::remove_dir_all(&data);
    std::fs::create_dir_all(&data)?;
    let mut lines: Vec<(String, Value)> = Vec::new();
    let mut text = String::new();
    let mut say = |s: String| {
        text.push_str(&s);
        text.push('\n');
        if !args.json {
            println!("{s}");
        }
    };
    let started = Instant::now();
    let load_start = load();
    say(format!(
        "service_bench: {} CPUs, load average at start {load_start}, data in {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        data.display()
    ));
    lines.push((
        "env".into(),
        json!({"cpus": std::thread::available_parallelism().map_or(0, |n| n.get()), "load_start": load_start, "data": data}),
    ));

    // 1 client beside the library, then 8 and 32 clients, each on a new document.
    let solo = Server::start(&args.opjournal, &data.join("solo"), &[])?;
    let (lib, one) = one_client_beside_library(&solo, &data, args.ops)?;
    drop(solo);
    say(String::new());
    say("submit -> result over loopback (p50 / p99), beside the library's lifecycle:".into());
    say(format!(
        "  library lifecycle (submit, complete, delivered, acknowledge; in-process): {} / {}  ({} ops)",
        ms(lib.p50),
        ms(lib.p99),
        lib.count
    ));
    say(format!(
        "  service, 1 client:  {} / {}  ({} ops; {:.2}x the library's p50)",
        ms(one.p50),
        ms(one.p99),
        one.count,
        one.p50 / lib.p50.max(1.0)
    ));
    lines.push((
        "latency".into(),
        json!({"clients": 1, "library_p50_us": lib.p50, "library_p99_us": lib.p99, "p50_us": one.p50, "p99_us": one.p99, "ops": one.count}),
    ));
    let per_client = |clients: usize| (args.ops / clients).max(if args.quick { 5 } else { 20 });
    for clients in [8usize, 32] {
        let server = Server::start(&args.opjournal, &data.join(format!("c{clients}")), &[])?;
        let c = contend(&server, clients, per_client(clients))?;
        say(format!(
            "  service, {clients} clients on one document: admitted submit -> result {} / {}; first try -> result {} / {}",
            ms(c.admitted.p50),
            ms(c.admitted.p99),
            ms(c.end_to_end.p50),
            ms(c.end_to_end.p99)
        ));
        say(format!(
            "      {} applied in {:.1} s ({:.0}/s); {} submits = {:.2} per applied ({} scope_busy, {} stale_base)",
            c.applied,
            c.elapsed.as_secs_f64(),
            c.applied as f64 / c.elapsed.as_secs_f64().max(1e-9),
            c.submits,
            c.submits as f64 / c.applied.max(1) as f64,
            c.busy,
            c.stale
        ));
        lines.push((
            "contention".into(),
            json!({
                "clients": clients, "applied": c.applied, "submits": c.submits,
                "scope_busy": c.busy, "stale_base": c.stale,
                "submits_per_applied": c.submits as f64 / c.applied.max(1) as f64,
                "admitted_p50_us": c.admitted.p50, "admitted_p99_us": c.admitted.p99,
                "end_to_end_p50_us": c.end_to_end.p50, "end_to_end_p99_us": c.end_to_end.p99,
                "elapsed_s": c.elapsed.as_secs_f64(),
            }),
        ));
    }

    // Memory and threads.
    say(String::new());
    say("service peak RSS and threads (from /proc/PID/status):".into());
    let (dropped, idle) = if args.quick { (400, 300) } else { (4000, 1000) };
    let (fifty, each) = if args.quick { (10, 10) } else { (50, 100) };
    let f = flood(&args.opjournal, &data, dropped, idle)?;
    let (m, c) = fifty_clients(&args.opjournal, &data, fifty, each)?;
    for mem in [&f, &m] {
        say(format!(
            "  {}: peak RSS {:.1} MiB, RSS now {:.1} MiB, {} threads ({})",
            mem.scenario,
            mem.peak_rss_kib as f64 / 1024.0,
            mem.rss_kib as f64 / 1024.0,
            mem.threads,
            mem.note
        ));
        lines.push((
            "memory".into(),
            json!({"scenario": mem.scenario, "peak_rss_kib": mem.peak_rss_kib, "rss_kib": mem.rss_kib, "threads": mem.threads, "note": mem.note}),
        ));
    }
    say(format!(
        "      ({fifty} clients: {} submits = {:.2} per applied; admitted submit -> result p50 {} p99 {})",
        c.submits,
        c.submits as f64 / c.applied.max(1) as f64,
        ms(c.admitted.p50),
        ms(c.admitted.p99)
    ));
    let load_end = load();
    say(String::new());
    say(format!(
        "done in {:.0} s; load average at end {load_end}",
        started.elapsed().as_secs_f64()
    ));
    lines.push((
        "summary".into(),
        json!({"elapsed_s": started.elapsed().as_secs_f64(), "load_end": load_end}),
    ));
    if args.json {
        for (kind, data) in &lines {
            println!("{}", json!({"type": kind, "data": data}));
        }
    }
    std::fs::write(args.out.join("service_bench.txt"), text)?;
    Ok(())
}
