//! `bench`: opjournal against SQLite and against the disk's own sync rate.
//!
//! ```text
//! cargo run --release -p opjournal-tools --bin bench -- [--quick] [--json] [--out DIR]
//!     [--only SECTION,...] [--reps N] [--base N] [--memory-ops N] [--keep]
//! ```
//!
//! Every competitor runs in the same process and run, interleaved (A, B, A, B, ...), and
//! figures are medians of the repetitions. Sections: `raw`, `lifecycle` (1 to 64 threads),
//! `sustained` (bytes written and call latency across several checkpoints), `memory` (RSS
//! over a long session, in child processes), `replay`, `size`, `compaction`, `foreground`,
//! `reopen`. See docs/performance.md for what each figure means and the targets.
//!
//! The results go to stdout (an aligned table, or JSON Lines with `--json`), and to the
//! `--out` directory (default: the workspace's `target/bench/`): `bench.txt`,
//! `bench.jsonl` and `lifecycle_concurrency.svg`. Scratch files live in `<out>/data`,
//! which must be on the disk being measured (not a tmpfs).
//!
//! Operation ids are random (a 64-bit hash of each operation's name, in hex), as agents'
//! ids are; `OPJ_BENCH_SEQUENTIAL_IDS=1` uses the names, nearly in key order.
//!
//! SQLite is measured in several arrangements (tools/src/sqlite_model.rs), the strongest
//! being a dedicated writer thread with group commit, and every ratio is taken against the
//! best one measured in the same run. The repository's .cargo/config.toml builds SQLite
//! syncing with `fdatasync()`. Every sync of either engine is counted and timed (the
//! `syncs` module below), so each lifecycle figure says how far it is from the disk.

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use opjournal::{
    Admission, ExecutionStatus, Intent, Journal, JournalBuilder, ManualClock, Operation, Outcome,
    Sharing, Timestamp,
};
use opjournal_tools::plot::{self, Chart, Series};
use opjournal_tools::sqlite_model::{
    Acks, Cache, Checkpoints, PurgeWay, Reads, SqlAdmission, SqlConfig, SqlJournal, SqlOp,
    SqlStore, WriterCfg, Writers,
};
use opjournal_tools::stats::{Percentiles, Rng, median, percentiles};
use serde_json::{Value, json};

type Error = Box<dyn std::error::Error + Send + Sync>;
type Result<T> = std::result::Result<T, Error>;

/// The result payload of every operation (item 7 asks for 1 KiB).
const PAYLOAD_BYTES: usize = 1024;
/// The protocol's durable commits per lifecycle: submit and complete (the ack is lazy).
const DURABLE_COMMITS_PER_OP: f64 = 2.0;
/// Far enough ahead that every completed operation is past audit retention (90 days).
const PAST_AUDIT_RETENTION: Duration = Duration::from_secs(91 * 24 * 3600);
const INTENT_NAME: &str = "bench.edit";
/// Lifecycles each thread runs in one slice of the lifecycle section. SQLite's busy
/// handler sleeps up to 100 ms at a time: with fewer lifecycles per slice, one such sleep
/// would decide a slice's figure.
const SLICE_PER_THREAD: usize = 100;
const SECTIONS: [&str; 9] = [
    "raw",
    "lifecycle",
    "sustained",
    "memory",
    "replay",
    "size",
    "compaction",
    "foreground",
    "reopen",
];

// ---------------------------------------------------------------------------------------
// Counting syncs
// ---------------------------------------------------------------------------------------

/// The syncs this process asks of the disk, counted and timed per file.
///
/// This binary defines `fdatasync` and `fsync` itself: the linker resolves every call to
/// them in the program (Rust's `File::sync_data`/`sync_all`, which opjournal, its log and
/// redb use, and the bundled SQLite's C code) to these definitions instead of the C
/// library's, so every sync of either engine is counted and timed, by the path of the file
/// it syncs (read from `/proc/self/fd`), and then made with the system call itself. The
/// cost is a `readlink`, two clock reads and a mutex per sync: a few microseconds beside a
/// sync that takes 100 µs or more. With the counts, each figure says how many syncs a
/// lifecycle took, how long they took, and so how much of the time the disk was busy
/// syncing for it: the distance to the physical limit, measured on the syncs themselves
/// (on a shared machine the disk's sync time swings by 10× within seconds, so a separate
/// sample of it says less).
mod syncs {
    use std::collections::BTreeMap;
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Mutex, PoisonError};
    use std::time::{Duration, Instant};

    static TOTAL: AtomicU64 = AtomicU64::new(0);
    static BY_FILE: Mutex<BTreeMap<PathBuf, Tally>> = Mutex::new(BTreeMap::new());

    /// Syncs of a file, and the time they took.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct Tally {
        /// Syncs.
        pub count: u64,
        /// Their total time.
        pub time: Duration,
    }

    impl Tally {
        /// `self` minus an earlier reading.
        pub fn since(self, before: Tally) -> Tally {
            Tally {
                count: self.count.saturating_sub(before.count),
                time: self.time.saturating_sub(before.time),
            }
        }

        /// The sum of two tallies.
        pub fn plus(self, other: Tally) -> Tally {
            Tally {
                count: self.count + other.count,
                time: self.time + other.time,
            }
        }
    }

    fn counted(fd: libc::c_int, sync: impl FnOnce() -> libc::c_int) -> libc::c_int {
        TOTAL.fetch_add(1, Ordering::Relaxed);
        let path = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok();
        let start = Instant::now();
        let rc = sync();
        let took = start.elapsed();
        if let Some(path) = path {
            let mut by_file = BY_FILE.lock().unwrap_or_else(PoisonError::into_inner);
            let t = by_file.entry(path).or_default();
            t.count += 1;
            t.time += took;
        }
        rc
    }

    /// `fdatasync(2)`, counted.
    #[unsafe(no_mangle)]
    pub extern "C" fn fdatasync(fd: libc::c_int) -> libc::c_int {
        // SAFETY: the system call takes a file descriptor and touches no memory; on
        // failure it returns -1 and sets `errno`, as the C library's wrapper does.
        counted(fd, || unsafe {
            libc::syscall(libc::SYS_fdatasync, fd) as libc::c_int
        })
    }

    /// `fsync(2)`, counted.
    #[unsafe(no_mangle)]
    pub extern "C" fn fsync(fd: libc::c_int) -> libc::c_int {
        // SAFETY: as `fdatasync` above.
        counted(fd, || unsafe {
            libc::syscall(libc::SYS_fsync, fd) as libc::c_int
        })
    }

    /// Syncs of any file so far.
    pub fn total() -> u64 {
        TOTAL.load(Ordering::Relaxed)
    }

    /// Every file's syncs so far, by path.
    pub fn all() -> BTreeMap<PathBuf, Tally> {
        BY_FILE
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// `path` as /proc/self/fd names it: absolute, links resolved (the file itself need
    /// not exist, its directory must).
    pub fn canonical(path: &Path) -> PathBuf {
        std::fs::canonicalize(path).unwrap_or_else(|_| match (path.parent(), path.file_name()) {
            (Some(dir), Some(name)) => {
                std::fs::canonicalize(dir).map_or_else(|_| path.to_path_buf(), |d| d.join(name))
            }
            _ => path.to_path_buf(),
        })
    }

    /// Syncs of the file at `path` so far. Compare two readings: a file removed and made
    /// again under the same path keeps counting.
    pub fn of(path: &Path) -> Tally {
        of_canonical(&canonical(path))
    }

    /// [`of`] for a path already made [`canonical`] (no system call).
    pub fn of_canonical(path: &Path) -> Tally {
        BY_FILE
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(path)
            .copied()
            .unwrap_or_default()
    }
}

// ---------------------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------------------

struct Params {
    quick: bool,
    reps: usize,
    lifecycle_slices: usize,
    raw_slice_writes: usize,
    raw_writes: usize,
    sweep_threads: Vec<usize>,
    base_n: usize,
    populate_threads: usize,
    replay_lookups: usize,
    replay_rounds: usize,
    fg_lifecycles: usize,
    /// Lifecycles per engine in the sustained run (several checkpoints).
    sustained_lifecycles: usize,
    /// Lifecycles of the log tail before the kill in the reopen section.
    reopen_tail: usize,
    /// Repetitions of the reopen section: more than the other sections', since one reopen
    /// takes a few milliseconds and three of them spread by as much as the target's margin.
    reopen_reps: usize,
    /// Lifecycles per memory session.
    memory_ops: usize,
}

impl Params {
    fn new(quick: bool) -> Params {
        if quick {
            Params {
                quick,
                reps: 2,
                lifecycle_slices: 3,
                raw_slice_writes: 50,
                raw_writes: 200,
                // The thread counts with figures and targets only.
                sweep_threads: HEADLINE_THREADS.to_vec(),
                base_n: 5_000,
                populate_threads: 32,
                replay_lookups: 20_000,
                replay_rounds: 4,
                fg_lifecycles: 40,
                sustained_lifecycles: 3_000,
                reopen_tail: 1_000,
                reopen_reps: 2,
                memory_ops: 50_000,
            }
        } else {
            Params {
                quick,
                reps: 3,
                lifecycle_slices: 12,
                raw_slice_writes: 100,
                raw_writes: 1_000,
                sweep_threads: vec![1, 2, 4, 8, 16, 32, 64],
                base_n: 100_000,
                populate_threads: 32,
                replay_lookups: 200_000,
                replay_rounds: 10,
                fg_lifecycles: 300,
                sustained_lifecycles: 12_000,
                reopen_tail: 1_000,
                reopen_reps: 7,
                memory_ops: 1_000_000,
            }
        }
    }
}

struct Args {
    params: Params,
    json: bool,
    keep: bool,
    out: PathBuf,
    only: Vec<String>,
}

fn usage() -> String {
    format!(
        "usage: bench [--quick] [--json] [--out DIR] [--only SECTION,...] [--reps N] [--base N] [--memory-ops N] [--keep]\n\
         sections: {}",
        SECTIONS.join(", ")
    )
}

fn parse_args(raw: &[String]) -> Result<Args> {
    let mut quick = false;
    let mut json = false;
    let mut keep = false;
    // The workspace's target/, whether cargo runs in the workspace or in tools/ (where
    // tools/.cargo/config.toml applies).
    let mut out = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("target"), |w| w.join("target"))
        .join("bench");
    let mut only: Vec<String> = Vec::new();
    let mut reps: Option<usize> = None;
    let mut base: Option<usize> = None;
    let mut memory_ops: Option<usize> = None;
    let mut it = raw.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("`{name}` needs a value\n{}", usage()))
        };
        match a.as_str() {
            "--quick" => quick = true,
            "--json" => json = true,
            "--keep" => keep = true,
            "--out" => out = PathBuf::from(value("--out")?),
            "--only" => {
                for s in value("--only")?.split(',') {
                    if !SECTIONS.contains(&s) {
                        return Err(format!("unknown section `{s}`\n{}", usage()).into());
                    }
                    only.push(s.to_string());
                }
            }
            "--reps" => reps = Some(value("--reps")?.parse()?),
            "--base" => base = Some(value("--base")?.parse()?),
            "--memory-ops" => memory_ops = Some(value("--memory-ops")?.parse()?),
            "-h" | "--help" => return Err(usage().into()),
            other => return Err(format!("unknown argument `{other}`\n{}", usage()).into()),
        }
    }
    let mut params = Params::new(quick);
    if let Some(r) = reps {
        params.reps = r.max(1);
        params.lifecycle_slices = (4 * r).max(2);
    }
    if let Some(b) = base {
        params.base_n = b.max(100);
    }
    if let Some(n) = memory_ops {
        params.memory_ops = n.max(MEMORY_THREADS * MEMORY_SAMPLES);
    }
    Ok(Args {
        params,
        json,
        keep,
        out,
        only,
    })
}

/// One opjournal configuration under test, with its names in the report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct OpjCfg {
    exclusive: bool,
    quick_repair: bool,
    /// In JSON keys and on the command line of `bench __profile`.
    key: &'static str,
    /// In the table.
    label: &'static str,
    /// In the plot's legend.
    short_label: &'static str,
    /// A checkpoint size other than the library's default (`bench __profile
    /// lifecycle-ab`); `OPJ_BENCH_CHECKPOINT_SIZE` applies when it is `None`.
    checkpoint_size: Option<u64>,
    /// A page cache bound other than the library's default, as `checkpoint_size` is.
    cache_size: Option<usize>,
}

const DEFAULT_CFG: OpjCfg = OpjCfg {
    exclusive: false,
    quick_repair: true,
    checkpoint_size: None,
    cache_size: None,
    key: "opj-live-qr",
    label: "opjournal LiveReaders, quick_repair on (default)",
    short_label: "opjournal LiveReaders, QR on (default)",
};

const OPJ_VARIANTS: [OpjCfg; 4] = [
    DEFAULT_CFG,
    OpjCfg {
        exclusive: false,
        quick_repair: false,
        key: "opj-live",
        checkpoint_size: None,
        cache_size: None,
        label: "opjournal LiveReaders, quick_repair off",
        short_label: "opjournal LiveReaders, QR off",
    },
    OpjCfg {
        exclusive: true,
        quick_repair: true,
        key: "opj-excl-qr",
        checkpoint_size: None,
        cache_size: None,
        label: "opjournal Exclusive, quick_repair on",
        short_label: "opjournal Exclusive, QR on",
    },
    OpjCfg {
        exclusive: true,
        quick_repair: false,
        key: "opj-excl",
        checkpoint_size: None,
        cache_size: None,
        label: "opjournal Exclusive, quick_repair off",
        short_label: "opjournal Exclusive, QR off",
    },
];

/// A number from the environment, if set: `OPJ_BENCH_CHECKPOINT_SIZE=<bytes>` and
/// `OPJ_BENCH_CACHE_SIZE=<bytes>` measure another checkpoint size or page cache bound (for
/// choosing the defaults; the report names them in its environment lines).
fn env_override<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok()?.parse().ok()
}

fn checkpoint_size_override() -> Option<u64> {
    env_override("OPJ_BENCH_CHECKPOINT_SIZE")
}

fn cache_size_override() -> Option<usize> {
    env_override("OPJ_BENCH_CACHE_SIZE")
}

impl OpjCfg {
    fn builder(self) -> JournalBuilder {
        let b = Journal::builder()
            .sharing(if self.exclusive {
                Sharing::Exclusive
            } else {
                Sharing::LiveReaders
            })
            .quick_repair(self.quick_repair);
        let b = match self.checkpoint_size.or_else(checkpoint_size_override) {
            Some(n) => b.checkpoint_size(n),
            None => b,
        };
        match self.cache_size.or_else(cache_size_override) {
            Some(n) => b.cache_size(n),
            None => b,
        }
    }

    fn key(self) -> &'static str {
        self.key
    }

    fn label(self) -> &'static str {
        self.label
    }

    fn short_label(self) -> &'static str {
        self.short_label
    }

    fn from_key(key: &str) -> Option<OpjCfg> {
        OPJ_VARIANTS.into_iter().find(|c| c.key() == key)
    }
}

/// One SQLite arrangement under test (tools/src/sqlite_model.rs), with its names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SqlCfg {
    cfg: SqlConfig,
    /// In JSON keys and on the command line of `bench __profile`.
    key: &'static str,
    /// In the table.
    label: &'static str,
    /// In the plot's legend and in ratios.
    short_label: &'static str,
}

/// A writing arrangement: the tuned cache (a lifecycle barely reads, but it costs nothing)
/// and a read transaction per lookup (a held snapshot would end at every commit anyway).
const fn writing(
    writers: Writers,
    acks: Acks,
    key: &'static str,
    label: &'static str,
    short_label: &'static str,
) -> SqlCfg {
    SqlCfg {
        cfg: SqlConfig {
            writers,
            acks,
            cache: Cache::Tuned,
            reads: Reads::PerLookup,
        },
        key,
        label,
        short_label,
    }
}

/// The arrangement of the single-writer sections (compaction, foreground, reopen) and of
/// the base journal: with one writing thread, a mutex costs nothing and spares the busy
/// handler's sleeps when the purge and the foreground meet, and queued acknowledgements
/// spare a commit per lifecycle.
const SQL_STANDARD: SqlCfg = writing(
    Writers::Mutex,
    Acks::NextCommit,
    "sqlite-mutex-ackq",
    "SQLite, writes under a mutex, acks in the next commit",
    "SQLite mutex, acks next commit",
);

/// The reopen after kill -9 against each of these (the same WAL recovery, but a writer
/// thread's store opens a second connection for the lookup): the ratios are against the
/// faster.
const SQL_REOPEN_VARIANTS: [SqlCfg; 2] = [SQL_STANDARD, SQL_WRITER];

/// A dedicated writer thread ([`Writers::Writer`]).
const fn writer(
    max_batch: usize,
    checkpoints: Checkpoints,
    acks: Acks,
    key: &'static str,
    label: &'static str,
    short_label: &'static str,
) -> SqlCfg {
    writing(
        Writers::Writer(WriterCfg {
            max_batch,
            checkpoints,
        }),
        acks,
        key,
        label,
        short_label,
    )
}

/// The dedicated writer as a careful engineer writes it: everything queued in one
/// transaction without savepoints, acknowledgements validated against the ids it completed
/// (no read) and queued for the next synced commit, SQLite's own WAL checkpoints.
const SQL_WRITER: SqlCfg = writer(
    0,
    Checkpoints::Auto,
    Acks::Remembered,
    "sqlite-writer",
    "SQLite, dedicated writer: all queued requests in one transaction, no savepoints, acks checked in memory and folded into the next synced commit",
    "SQLite dedicated writer",
);

/// Every way of serializing writers, each with both ways of writing acknowledgements, and
/// the dedicated writer with the variants that could beat it: the lifecycle figures
/// compare opjournal with the fastest of them at each thread count.
const SQL_LIFECYCLE_VARIANTS: [SqlCfg; 10] = [
    writing(
        Writers::Connections,
        Acks::OwnCommit,
        "sqlite-conns",
        "SQLite, connection per thread + busy handler, ack in its own commit (the old baseline)",
        "SQLite conns, ack own commit",
    ),
    writing(
        Writers::Connections,
        Acks::NextCommit,
        "sqlite-conns-ackq",
        "SQLite, connection per thread + busy handler, acks in the next commit",
        "SQLite conns, acks next commit",
    ),
    writing(
        Writers::Mutex,
        Acks::OwnCommit,
        "sqlite-mutex",
        "SQLite, writes under a mutex, ack in its own commit",
        "SQLite mutex, ack own commit",
    ),
    SQL_STANDARD,
    writing(
        Writers::GroupCommit,
        Acks::OwnCommit,
        "sqlite-group",
        "SQLite, writer thread with group commit, ack in its own commit",
        "SQLite group commit, ack own commit",
    ),
    writing(
        Writers::GroupCommit,
        Acks::NextCommit,
        "sqlite-group-ackq",
        "SQLite, writer thread with group commit, acks in the next commit",
        "SQLite group commit, acks next commit",
    ),
    SQL_WRITER,
    writer(
        0,
        Checkpoints::Auto,
        Acks::NextCommit,
        "sqlite-writer-readack",
        "SQLite, dedicated writer, each ack checked by a read on the caller's connection",
        "SQLite dedicated writer, acks checked by a read",
    ),
    writer(
        0,
        Checkpoints::Background,
        Acks::Remembered,
        "sqlite-writer-bgckpt",
        "SQLite, dedicated writer, WAL checkpoints on a thread of their own",
        "SQLite dedicated writer, background checkpoints",
    ),
    writer(
        16,
        Checkpoints::Auto,
        Acks::Remembered,
        "sqlite-writer-cap16",
        "SQLite, dedicated writer, at most 16 requests per transaction",
        "SQLite dedicated writer, batches of 16",
    ),
];

/// A reading arrangement, on the standard writing one (lookups do not write).
const fn reading(
    cache: Cache,
    reads: Reads,
    key: &'static str,
    label: &'static str,
    short_label: &'static str,
) -> SqlCfg {
    SqlCfg {
        cfg: SqlConfig {
            cache,
            reads,
            ..SQL_STANDARD.cfg
        },
        key,
        label,
        short_label,
    }
}

/// The replay lookup against each of these: the default cache, the tuned cache, and the
/// tuned cache with the read transaction held as opjournal holds its snapshot.
const SQL_REPLAY_VARIANTS: [SqlCfg; 3] = [
    reading(
        Cache::Default,
        Reads::PerLookup,
        "sqlite-untuned",
        "SQLite prepared SELECT receipt JOIN result, default 2 MiB cache, no mmap (the old baseline)",
        "SQLite default cache",
    ),
    reading(
        Cache::Tuned,
        Reads::PerLookup,
        "sqlite-tuned",
        "SQLite prepared SELECT receipt JOIN result, 1 GiB cache + 1 GiB mmap",
        "SQLite tuned cache + mmap",
    ),
    reading(
        Cache::Tuned,
        Reads::HeldSnapshot,
        "sqlite-snapshot",
        "SQLite prepared SELECT receipt JOIN result, tuned, read transaction held until the next commit",
        "SQLite tuned, held read snapshot",
    ),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Engine {
    Opj(OpjCfg),
    Sqlite(SqlCfg),
}

impl Engine {
    fn key(self) -> &'static str {
        match self {
            Engine::Opj(c) => c.key(),
            Engine::Sqlite(c) => c.key,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Engine::Opj(c) => c.label(),
            Engine::Sqlite(c) => c.label,
        }
    }

    fn short_label(self) -> &'static str {
        match self {
            Engine::Opj(c) => c.short_label(),
            Engine::Sqlite(c) => c.short_label,
        }
    }

    /// The lifecycle section's engines: every opjournal configuration, every SQLite
    /// writing arrangement.
    fn all() -> Vec<Engine> {
        let opj = OPJ_VARIANTS.into_iter().map(Engine::Opj);
        opj.chain(SQL_LIFECYCLE_VARIANTS.into_iter().map(Engine::Sqlite))
            .collect()
    }

    fn from_key(key: &str) -> Option<Engine> {
        let sql = SQL_LIFECYCLE_VARIANTS.iter().chain(&SQL_REPLAY_VARIANTS);
        OpjCfg::from_key(key)
            .map(Engine::Opj)
            .or_else(|| sql.copied().find(|c| c.key == key).map(Engine::Sqlite))
    }
}

// ---------------------------------------------------------------------------------------
// Reporting
// ---------------------------------------------------------------------------------------

struct Figure {
    key: String,
    label: String,
    value: f64,
    unit: &'static str,
    vs: String,
    extra: Value,
}

struct Target {
    name: String,
    measured: String,
    required: String,
    met: bool,
    value: f64,
    threshold: f64,
}

/// One engine at one thread count of the lifecycle sweep.
#[derive(Clone, Copy, Debug, Default)]
struct SweepPoint {
    per_s: f64,
    p50_us: f64,
    p99_us: f64,
    syncs_per_op: f64,
    syncs_per_s: f64,
    mean_sync_ms: f64,
    syncing_share: f64,
    cpu_us_per_op: f64,
    /// For `sqlite-best`: the arrangement that was the best.
    best_of: Option<&'static str>,
}

impl SweepPoint {
    fn of(m: &LcResult) -> SweepPoint {
        let pc = percentiles(&m.latencies);
        SweepPoint {
            per_s: m.per_s(),
            p50_us: pc.p50,
            p99_us: pc.p99,
            syncs_per_op: m.syncs_per_op,
            syncs_per_s: median(&m.syncs_per_s),
            mean_sync_ms: m.mean_sync_ms(),
            syncing_share: median(&m.busy),
            cpu_us_per_op: median(&m.cpu_us),
            best_of: None,
        }
    }
}

#[derive(Default)]
struct Report {
    env: Vec<(String, String)>,
    figures: Vec<Figure>,
    targets: Vec<Target>,
    sweep: BTreeMap<(&'static str, usize), SweepPoint>,
    notes: Vec<String>,
}

fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    let a = v.abs();
    if a >= 1000.0 {
        // Thousands separators for readability.
        let s = format!("{:.0}", v);
        let (sign, digits) = s.strip_prefix('-').map_or(("", s.as_str()), |d| ("-", d));
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        format!("{sign}{out}")
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn ratio_text(r: f64, of: &str) -> String {
    format!("{}× {of}", fmt_ratio(r))
}

fn fmt_ratio(r: f64) -> String {
    if r >= 10.0 {
        format!("{r:.1}")
    } else {
        format!("{r:.2}")
    }
}

impl Report {
    fn figure_vs(
        &mut self,
        key: impl Into<String>,
        label: impl Into<String>,
        value: f64,
        unit: &'static str,
        vs: String,
        extra: Value,
    ) {
        self.figures.push(Figure {
            key: key.into(),
            label: label.into(),
            value,
            unit,
            vs,
            extra,
        });
    }

    /// A "at least" target.
    fn at_least(
        &mut self,
        name: impl Into<String>,
        value: f64,
        threshold: f64,
        measured: String,
        required: String,
    ) {
        self.targets.push(Target {
            name: name.into(),
            measured,
            required,
            met: value >= threshold,
            value,
            threshold,
        });
    }

    /// A "at most" target.
    fn at_most(
        &mut self,
        name: impl Into<String>,
        value: f64,
        threshold: f64,
        measured: String,
        required: String,
    ) {
        self.targets.push(Target {
            name: name.into(),
            measured,
            required,
            met: value <= threshold,
            value,
            threshold,
        });
    }

    fn text(&self) -> String {
        let mut s = String::new();
        s.push_str("opjournal benchmark\n");
        for (k, v) in &self.env {
            s.push_str(&format!("  {k}: {v}\n"));
        }
        s.push('\n');
        let rows: Vec<Vec<String>> = self
            .figures
            .iter()
            .map(|f| {
                vec![
                    f.label.clone(),
                    fmt_num(f.value),
                    f.unit.to_string(),
                    f.vs.clone(),
                ]
            })
            .collect();
        s.push_str(&table(
            &["figure", "value", "unit", "vs reference"],
            &[false, true, false, false],
            &rows,
        ));
        s.push('\n');
        let rows: Vec<Vec<String>> = self
            .targets
            .iter()
            .map(|t| {
                vec![
                    t.name.clone(),
                    t.measured.clone(),
                    t.required.clone(),
                    if t.met { "yes".into() } else { "NO".into() },
                ]
            })
            .collect();
        s.push_str(&table(
            &["target", "measured", "required", "met"],
            &[false, true, true, false],
            &rows,
        ));
        let met = self.targets.iter().filter(|t| t.met).count();
        s.push_str(&format!("\n{met} of {} targets met\n", self.targets.len()));
        for n in &self.notes {
            s.push_str(&format!("note: {n}\n"));
        }
        s
    }

    fn json_lines(&self, elapsed: Duration) -> String {
        let mut out = Vec::new();
        let env: serde_json::Map<String, Value> = self
            .env
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        out.push(json!({"type": "env", "data": env}));
        for f in &self.figures {
            out.push(json!({"type": "figure", "data": {
                "key": f.key, "label": f.label, "value": f.value, "unit": f.unit,
                "vs": f.vs, "extra": f.extra,
            }}));
        }
        for ((engine, threads), v) in &self.sweep {
            out.push(json!({"type": "sweep_point", "data": {
                "engine": engine, "threads": threads, "lifecycles_per_s": v.per_s,
                "p50_us": v.p50_us, "p99_us": v.p99_us, "syncs_per_op": v.syncs_per_op,
                "syncs_per_s": v.syncs_per_s, "mean_sync_ms": v.mean_sync_ms,
                "syncing_share": v.syncing_share, "cpu_us_per_op": v.cpu_us_per_op,
                "best_of": v.best_of,
            }}));
        }
        for t in &self.targets {
            out.push(json!({"type": "target", "data": {
                "name": t.name, "measured": t.measured, "required": t.required,
                "met": t.met, "value": t.value, "threshold": t.threshold,
            }}));
        }
        for n in &self.notes {
            out.push(json!({"type": "note", "data": n}));
        }
        let met = self.targets.iter().filter(|t| t.met).count();
        out.push(json!({"type": "summary", "data": {
            "targets": self.targets.len(), "met": met,
            "missed": self.targets.len() - met, "elapsed_s": elapsed.as_secs_f64(),
        }}));
        let mut s = String::new();
        for v in out {
            s.push_str(&v.to_string());
            s.push('\n');
        }
        s
    }
}

fn table(header: &[&str], right: &[bool], rows: &[Vec<String>]) -> String {
    let n = header.len();
    let mut w: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate().take(n) {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            let pad = w[i].saturating_sub(c.chars().count());
            if i > 0 {
                s.push_str("  ");
            }
            if right[i] {
                s.push_str(&" ".repeat(pad));
                s.push_str(c);
            } else {
                s.push_str(c);
                if i + 1 < n {
                    s.push_str(&" ".repeat(pad));
                }
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut s = line(header.iter().map(|h| h.to_string()).collect());
    s.push_str(&line(w.iter().map(|k| "-".repeat(*k)).collect()));
    for r in rows {
        s.push_str(&line(r.clone()));
    }
    s
}

fn progress(msg: &str) {
    eprintln!("[bench] {msg}");
}

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn intent() -> Result<Intent> {
    Ok(Intent::from_bytes(INTENT_NAME, br#"{"change":"bench"}"#)?)
}

fn payload() -> Vec<u8> {
    (0..PAYLOAD_BYTES).map(|i| (i % 251) as u8).collect()
}

fn sqlite_files(path: &Path) -> [PathBuf; 3] {
    let s = path.as_os_str().to_string_lossy();
    [
        path.to_path_buf(),
        PathBuf::from(format!("{s}-wal")),
        PathBuf::from(format!("{s}-shm")),
    ]
}

fn remove_one(path: &Path) {
    let _ = fs::remove_file(path);
}

fn remove_all(paths: &[PathBuf]) {
    for p in paths {
        let _ = fs::remove_file(p);
    }
}

fn file_len(p: &Path) -> u64 {
    fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

/// Bytes the file system allocated to `p` (what `du` counts): a file's length also counts
/// holes that hold no blocks (redb grows its file by doubling it, and the new space is a
/// hole until pages are written there).
fn disk_bytes(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(p).map(|m| m.blocks() * 512).unwrap_or(0)
}

/// A file's length and its allocated bytes.
#[derive(Clone, Copy, Debug, Default)]
struct Footprint {
    len: u64,
    disk: u64,
}

impl Footprint {
    fn of(paths: &[&Path]) -> Footprint {
        paths.iter().fold(Footprint::default(), |acc, p| Footprint {
            len: acc.len + file_len(p),
            disk: acc.disk + disk_bytes(p),
        })
    }
}

/// `OPJ_BENCH_COLD=1` (`__profile reopen` and `reopen-copy`): drops the (synced, so
/// clean) pages of each of `files` that exists from the page cache, as after a reboot.
fn evict_for_cold_run(files: impl IntoIterator<Item = PathBuf>) -> Result<()> {
    use std::os::fd::AsRawFd;
    if std::env::var_os("OPJ_BENCH_COLD").is_none() {
        return Ok(());
    }
    for path in files.into_iter().filter(|f| f.exists()) {
        let f = fs::File::open(&path)?;
        f.sync_all()?;
        // SAFETY: `f` is an open file for the duration of the call.
        let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if rc != 0 {
            return Err(format!("posix_fadvise on {}: error {rc}", path.display()).into());
        }
    }
    Ok(())
}

/// A journal's files: the redb file and its two logs.
fn opj_files(path: &Path) -> impl Iterator<Item = PathBuf> {
    std::iter::once(path.to_path_buf()).chain(opjournal::FileLog::paths_for(path))
}

/// Copies `from` to `to` and syncs the copy, so its writeback does not disturb what is
/// measured next.
fn copy_synced(from: &Path, to: &Path) -> Result<()> {
    let _ = fs::remove_file(to);
    fs::copy(from, to)?;
    fs::File::open(to)?.sync_all()?;
    Ok(())
}

/// The filesystem holding `path`, from /proc/mounts: (mount point, type, device).
fn filesystem_of(path: &Path) -> Option<(String, String, String)> {
    let canon = fs::canonicalize(path).ok()?;
    let mounts = fs::read_to_string("/proc/mounts").ok()?;
    let mut best: Option<(String, String, String)> = None;
    for line in mounts.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 3 {
            continue;
        }
        let (dev, mnt, ty) = (f[0], f[1], f[2]);
        if canon.starts_with(mnt) && best.as_ref().is_none_or(|b| mnt.len() > b.0.len()) {
            best = Some((mnt.to_string(), ty.to_string(), dev.to_string()));
        }
    }
    best
}

/// Bytes this process passed to write(2)-like calls so far (`wchar` in /proc/self/io).
///
/// Not `write_bytes` (the page cache this process dirtied): the kernel counts it by folio,
/// and with large folios (ext4 has them since Linux 6.16) a 1 KiB append into a 2 MiB folio
/// counts 2 MiB, so it measures the page cache's layout rather than the bytes written.
fn written_bytes() -> u64 {
    fs::read_to_string("/proc/self/io")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("wchar:").map(|v| v.trim().parse().ok()))
                .flatten()
        })
        .unwrap_or(0)
}

/// CPU time this process used so far, every thread (`CLOCK_PROCESS_CPUTIME_ID`).
fn cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `clock_gettime` writes one `timespec` into the buffer it is given.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

/// The CPUs this process may run on.
fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Flushes every dirty page on the machine (build artifacts, earlier copies), so that
/// their writeback does not share the disk with what is measured next.
fn settle_disk() {
    let _ = Command::new("sync").status();
}

/// Whether the bundled SQLite syncs with `fdatasync()`. Its unix VFS calls `fsync()` unless
/// built with `HAVE_FDATASYNC`, which tools/.cargo/config.toml passes to libsqlite3-sys's
/// build through `LIBSQLITE3_FLAGS`; the same cargo run compiles this crate, so the
/// variable seen here is the one SQLite was built with.
fn sqlite_fdatasync() -> bool {
    option_env!("LIBSQLITE3_FLAGS").is_some_and(|f| f.contains("HAVE_FDATASYNC"))
}

fn sqlite_sync_call() -> &'static str {
    if sqlite_fdatasync() {
        "fdatasync() (built with HAVE_FDATASYNC)"
    } else {
        "fsync() (the bundled build's default)"
    }
}

/// The 1, 5 and 15 minute load averages: other work on the machine disturbs sync timings.
fn load_average() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// The library revision measured: the git commit of the workspace, and whether `src/`
/// had uncommitted changes when the benchmark ran.
fn library_revision() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(&root)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        Some(head) => {
            let dirty = git(&["status", "--porcelain", "--", "src", "Cargo.toml"])
                .is_some_and(|s| !s.is_empty());
            if dirty {
                format!("git {head} with uncommitted changes in src/")
            } else {
                format!("git {head}")
            }
        }
        None => "unknown (not a git checkout)".into(),
    }
}

fn scope_of(t: usize) -> String {
    format!("scope/{t}")
}

fn session_of(t: usize) -> String {
    format!("session/{t}")
}

/// Whether operation ids are the names the sections give them: set
/// `OPJ_BENCH_SEQUENTIAL_IDS=1` (read from the environment, so the memory section's child
/// processes see it too).
fn sequential_ids() -> bool {
    std::env::var_os("OPJ_BENCH_SEQUENTIAL_IDS").is_some_and(|v| v != "0")
}

/// The operation id a section's name for an operation stands for. By default a 64-bit
/// hash of the name in hex (`op-3f9a0c...`): agents' ids (UUIDs, random call ids) land at
/// random places in every index keyed by id, in both engines. With
/// [`sequential_ids`], the name itself: names like `op-0000123` arrive nearly in key
/// order, which packs B-tree pages and keeps a purge's deletions together, and flatters
/// both engines (and opjournal more: its receipts hold their results).
fn op_id(name: &str) -> String {
    static SEQUENTIAL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *SEQUENTIAL.get_or_init(sequential_ids) {
        return name.to_string();
    }
    // FNV-1a over the name, then splitmix64's finalizer to spread it.
    let mut z = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    format!("op-{:016x}", z ^ (z >> 31))
}

/// The name of the base journals' `i`-th operation (see [`op_id`]).
fn base_name(i: usize) -> String {
    format!("op-{i:07}")
}

/// The id of the base journals' `i`-th operation.
fn base_id(i: usize) -> String {
    op_id(&base_name(i))
}

// ---------------------------------------------------------------------------------------
// One lifecycle on either engine
// ---------------------------------------------------------------------------------------

struct Ctx {
    intent: Intent,
    hash: [u8; 32],
    payload: Vec<u8>,
}

impl Ctx {
    fn new() -> Result<Ctx> {
        let intent = intent()?;
        let hash = *intent.hash().as_bytes();
        Ok(Ctx {
            intent,
            hash,
            payload: payload(),
        })
    }
}

/// Per-call latencies of one lifecycle.
#[derive(Default)]
struct CallTimes {
    submit: Duration,
    complete: Duration,
    ack: Duration,
}

impl CallTimes {
    fn total(&self) -> Duration {
        self.submit + self.complete + self.ack
    }
}

enum Conn<'a> {
    Opj(&'a Journal),
    Sql(SqlJournal),
    SqlMut(&'a mut SqlJournal),
}

impl Conn<'_> {
    /// Waits for the engine's background writes, as [`Opened::settle`] does.
    fn settle(&self) -> Result<()> {
        match self {
            Conn::Opj(j) => j.flush()?,
            Conn::Sql(db) => db.settle(),
            Conn::SqlMut(db) => db.settle(),
        }
        Ok(())
    }

    /// submit (Fresh) → complete(applied) → acknowledge, with per-call times.
    fn lifecycle(
        &mut self,
        ctx: &Ctx,
        id: &str,
        scope: &str,
        session: &str,
        rev: &mut u64,
    ) -> Result<CallTimes> {
        let id = op_id(id);
        let id = id.as_str();
        let mut times = CallTimes::default();
        match self {
            Conn::Opj(j) => {
                let op = Operation::new(id, ctx.intent.clone())
                    .scope(scope)
                    .base_revision(*rev)
                    .session(session);
                let t0 = Instant::now();
                let admission = j.submit(op)?;
                times.submit = t0.elapsed();
                let Admission::Fresh(claim) = admission else {
                    return Err(format!(
                        "`{id}`: expected a fresh admission, got {}",
                        admission.name()
                    )
                    .into());
                };
                *rev += 1;
                let outcome = Outcome::applied(*rev, ctx.payload.clone());
                let t1 = Instant::now();
                j.complete(&claim, outcome)?;
                times.complete = t1.elapsed();
                let t2 = Instant::now();
                j.acknowledge(id, Some(session))?;
                times.ack = t2.elapsed();
            }
            Conn::Sql(db) => return sql_lifecycle(db, ctx, id, scope, session, rev),
            Conn::SqlMut(db) => return sql_lifecycle(db, ctx, id, scope, session, rev),
        }
        Ok(times)
    }
}

/// A lifecycle on a SQLite connection (see [`Conn::lifecycle`]).
fn sql_lifecycle(
    db: &mut SqlJournal,
    ctx: &Ctx,
    id: &str,
    scope: &str,
    session: &str,
    rev: &mut u64,
) -> Result<CallTimes> {
    let mut times = CallTimes::default();
    let op = SqlOp {
        id: id.to_string(),
        intent_name: INTENT_NAME.to_string(),
        intent_hash: ctx.hash,
        scope: Some(scope.to_string()),
        base_rev: Some(*rev),
        session: Some(session.to_string()),
    };
    let t0 = Instant::now();
    let admission = db.submit(op)?;
    times.submit = t0.elapsed();
    let SqlAdmission::Fresh(claim) = admission else {
        return Err(format!("`{id}`: expected a fresh admission, got {admission:?}").into());
    };
    *rev += 1;
    let t1 = Instant::now();
    db.complete(&claim, *rev, &ctx.payload)?;
    times.complete = t1.elapsed();
    let t2 = Instant::now();
    db.acknowledge(id)?;
    times.ack = t2.elapsed();
    Ok(times)
}

/// A journal of either engine open in this process, from which each thread takes its
/// connection.
enum Opened {
    Opj(Journal),
    Sql(SqlStore),
}

impl Opened {
    fn open(engine: Engine, path: &Path) -> Result<Opened> {
        Ok(match engine {
            Engine::Opj(cfg) => Opened::Opj(cfg.builder().open(path)?),
            Engine::Sqlite(cfg) => Opened::Sql(SqlStore::open(path, cfg.cfg)?),
        })
    }

    /// Waits for the engine's background writes (opjournal's checkpoint thread, SQLite's
    /// checkpointer thread where it has one) to end, so that they count in the slice that
    /// made them and not in the next engine's.
    fn settle(&self) -> Result<()> {
        match self {
            Opened::Opj(j) => j.flush()?,
            Opened::Sql(store) => store.settle(),
        }
        Ok(())
    }

    fn conn(&self) -> Result<Conn<'_>> {
        Ok(match self {
            Opened::Opj(j) => Conn::Opj(j),
            Opened::Sql(store) => Conn::Sql(store.connect()?),
        })
    }

    /// Operations, applied ones and acknowledged ones, lazily written acknowledgements
    /// committed first.
    fn counts(&self) -> Result<[u64; 3]> {
        Ok(match self {
            Opened::Opj(j) => {
                let s = j.stats()?;
                [s.operations, s.applied, s.acknowledged]
            }
            Opened::Sql(store) => {
                let c = store.connect()?.counts()?;
                [c.operations, c.applied, c.acknowledged]
            }
        })
    }
}

/// The file of a journal of `engine` named `stem` in `dir`.
fn journal_path(engine: Engine, dir: &Path, stem: &str) -> PathBuf {
    dir.join(match engine {
        Engine::Opj(_) => format!("{stem}.opj"),
        Engine::Sqlite(_) => format!("{stem}.sqlite"),
    })
}

/// An engine's key in the figures of a section that measures one SQLite arrangement only
/// (foreground, reopen): plain `sqlite`, as before there were several.
fn section_key(engine: Engine) -> &'static str {
    match engine {
        Engine::Opj(c) => c.key(),
        Engine::Sqlite(_) => "sqlite",
    }
}

/// Removes a journal file (with SQLite's `-wal` and `-shm` beside it, or the log an
/// opjournal journal killed before closing leaves).
fn remove_journal(path: &Path) {
    remove_all(&sqlite_files(path));
    for log in opjournal::FileLog::paths_for(path) {
        remove_one(&log);
    }
}

// ---------------------------------------------------------------------------------------
// 1. Raw 4 KiB write + fdatasync
// ---------------------------------------------------------------------------------------

/// How the raw sync benchmark writes its 4 KiB blocks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum RawMode {
    /// Appends to the end of the file (the file grows with every write).
    Append,
    /// Overwrites blocks written and synced beforehand (no allocation, no size change).
    Overwrite,
    /// Writes into a file grown with `set_len` (a sparse hole, as redb grows its file):
    /// every write allocates a block.
    Hole,
}

fn raw_sync_rate(dir: &Path, n: usize, mode: RawMode) -> Result<f64> {
    use std::os::unix::fs::FileExt;
    let path = dir.join("raw.dat");
    let _ = fs::remove_file(&path);
    let mut f = fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)?;
    let buf = vec![0xA5u8; 4096];
    match mode {
        RawMode::Append => {}
        RawMode::Overwrite => {
            for i in 0..n {
                f.write_all_at(&buf, (i * 4096) as u64)?;
            }
            f.sync_all()?;
        }
        RawMode::Hole => {
            f.set_len((n * 4096) as u64)?;
            f.sync_all()?;
        }
    }
    let start = Instant::now();
    for i in 0..n {
        if mode == RawMode::Append {
            f.write_all(&buf)?;
        } else {
            f.write_all_at(&buf, (i * 4096) as u64)?;
        }
        f.sync_data()?;
    }
    let secs = start.elapsed().as_secs_f64();
    drop(f);
    fs::remove_file(&path)?;
    Ok(n as f64 / secs)
}

/// What a checkpoint's writes cost a log sync beside them, on this disk, without either
/// engine: one thread overwrites a 4 KiB block of a preallocated file and syncs it, again
/// and again, while another thread writes `mib` MiB of 4 KiB blocks at random places in a
/// second preallocated file and syncs that (as a checkpoint writes the index file), five
/// times with pauses between. Returns the log syncs' latencies apart from the writes and
/// during them. A call that waits for a log sync during a checkpoint, however the engine
/// arranges its checkpoint, waits at least as long as these.
fn writeback_contention(dir: &Path, mib: usize) -> Result<(Percentiles, Percentiles)> {
    use std::os::unix::fs::FileExt;
    const LOG_BLOCKS: u64 = 256;
    const DB_BLOCKS: u64 = 16 * 1024;
    let open = |name: &str, blocks: u64| -> Result<(PathBuf, fs::File)> {
        let path = dir.join(name);
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)?;
        let chunk = vec![0u8; 1 << 20];
        for i in 0..(blocks * 4096).div_ceil(1 << 20) {
            f.write_all_at(&chunk, i << 20)?;
        }
        f.sync_all()?;
        Ok((path, f))
    };
    let (log_path, log) = open("contention-log.dat", LOG_BLOCKS)?;
    let (db_path, db) = open("contention-db.dat", DB_BLOCKS)?;
    let stop = AtomicBool::new(false);
    let (samples, spans) = std::thread::scope(|s| -> Result<_> {
        let logger = s.spawn(|| -> std::io::Result<Vec<(Instant, Duration)>> {
            let block = vec![0x5Au8; 4096];
            let mut out = Vec::new();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                log.write_all_at(&block, (i % LOG_BLOCKS) * 4096)?;
                log.sync_data()?;
                out.push((t0, t0.elapsed()));
                i += 1;
            }
            Ok(out)
        });
        let mut spans = Vec::new();
        let mut rng = Rng::new(0xC0_47E4D);
        let block = vec![0xA5u8; 4096];
        let written = (|| -> std::io::Result<()> {
            for _ in 0..5 {
                std::thread::sleep(Duration::from_millis(300));
                let t0 = Instant::now();
                for _ in 0..mib * 256 {
                    db.write_all_at(&block, rng.below(DB_BLOCKS) * 4096)?;
                }
                db.sync_data()?;
                spans.push((t0, Instant::now()));
            }
            std::thread::sleep(Duration::from_millis(300));
            Ok(())
        })();
        stop.store(true, Ordering::Relaxed);
        let samples = logger
            .join()
            .map_err(|_| "the contention probe's log thread panicked")??;
        written?;
        Ok((samples, spans))
    })?;
    drop((log, db));
    remove_one(&log_path);
    remove_one(&db_path);
    let during = |t: &Instant| spans.iter().any(|(a, b)| a <= t && t <= b);
    let (busy, quiet): (Vec<_>, Vec<_>) = samples.iter().partition(|(t, _)| during(t));
    let lat =
        |v: Vec<&(Instant, Duration)>| -> Vec<Duration> { v.into_iter().map(|x| x.1).collect() };
    Ok((percentiles(&lat(quiet)), percentiles(&lat(busy))))
}

/// Samples of the disk's sync rate, taken through the run (the rate drifts on a shared
/// machine): 4 KiB appends and 4 KiB overwrites in place, each followed by `fdatasync`.
#[derive(Default)]
struct DiskRate {
    append: Vec<f64>,
    overwrite: Vec<f64>,
}

impl DiskRate {
    fn sample(&mut self, dir: &Path, n: usize) -> Result<()> {
        self.append.push(raw_sync_rate(dir, n, RawMode::Append)?);
        self.overwrite
            .push(raw_sync_rate(dir, n, RawMode::Overwrite)?);
        Ok(())
    }

    /// The physical limit: syncs per second of small overwrites in place, what both
    /// engines do in their steady state (opjournal's log is preallocated and zeroed,
    /// SQLite's WAL starts over at its beginning after a checkpoint). Appends that grow
    /// the file are slower (the file system's journal commits the new size too).
    fn limit(&self) -> Option<f64> {
        (!self.overwrite.is_empty()).then(|| median(&self.overwrite))
    }

    /// "N syncs/s = P% of the disk's rate".
    /// What a run says about the physical limits: syncs per lifecycle, their mean time,
    /// the share of the run's time spent syncing (the disk busy for it), and the CPU time
    /// per lifecycle with the rate that would take every core.
    fn busy_text(&self, m: &LcResult) -> String {
        let mean_ms = m.mean_sync_ms();
        let raw = self
            .limit()
            .map(|l| format!(" (the raw loop's: {:.2} ms)", 1e3 / l))
            .unwrap_or_default();
        let cpu = median(&m.cpu_us);
        format!(
            "{:.2} syncs per lifecycle of {mean_ms:.2} ms{raw}, syncing {:.0}% of the time; CPU {cpu:.0} µs per lifecycle ({} cores: {}/s)",
            m.syncs_per_op,
            100.0 * median(&m.busy),
            cpus(),
            fmt_num(cpus() as f64 * 1e6 / cpu)
        )
    }

    /// Rewrites the raw figures from every sample taken in the run.
    fn report(&self, r: &mut Report) {
        for (key, samples) in [
            ("raw_append_fdatasync", &self.append),
            ("raw_overwrite_fdatasync", &self.overwrite),
        ] {
            if samples.is_empty() {
                continue;
            }
            let v = median(samples);
            if let Some(f) = r.figures.iter_mut().find(|f| f.key == key) {
                f.value = v;
                f.vs = format!(
                    "{:.0} µs per sync; median of {} samples taken through the run",
                    1e6 / v,
                    samples.len()
                );
                f.extra = json!({ "samples": samples });
            }
        }
    }
}

fn section_raw(p: &Params, dir: &Path, disk: &mut DiskRate, r: &mut Report) -> Result<()> {
    progress("raw 4 KiB write + fdatasync");
    let mut hole = Vec::new();
    for _ in 0..p.reps {
        disk.append
            .push(raw_sync_rate(dir, p.raw_writes, RawMode::Append)?);
        disk.overwrite
            .push(raw_sync_rate(dir, p.raw_writes, RawMode::Overwrite)?);
        hole.push(raw_sync_rate(dir, p.raw_writes, RawMode::Hole)?);
    }
    r.figure_vs(
        "raw_overwrite_fdatasync",
        "raw 4 KiB overwrite in place + fdatasync (the disk's sync rate: the physical limit)",
        median(&disk.overwrite),
        "syncs/s",
        String::new(),
        Value::Null,
    );
    r.figure_vs(
        "raw_append_fdatasync",
        "raw 4 KiB append + fdatasync (the file grows)",
        median(&disk.append),
        "syncs/s",
        String::new(),
        Value::Null,
    );
    let h = median(&hole);
    r.figure_vs(
        "raw_hole_fdatasync",
        "raw 4 KiB write into a sparse hole + fdatasync",
        h,
        "syncs/s",
        format!("{:.0} µs per sync (redb grows its file this way)", 1e6 / h),
        json!({"samples": hole}),
    );
    disk.report(r);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 2/3. Durable lifecycle throughput vs concurrency
// ---------------------------------------------------------------------------------------

/// The thread counts with figures and targets (issue 27: 1, 8, 32 and 64); the others of
/// the sweep are in the plot and the JSON.
const HEADLINE_THREADS: [usize; 4] = [1, 8, 32, 64];

/// Lifecycles per thread in one slice at `threads`: 100 up to 16 threads, then fewer, so
/// that a slice stays about 1,600 lifecycles (at least 25 per thread).
fn slice_per_thread(threads: usize) -> usize {
    if threads <= 16 {
        SLICE_PER_THREAD
    } else {
        (SLICE_PER_THREAD * 16 / threads).max(25)
    }
}

/// Whether `engine` runs at `threads` in the lifecycle sweep. Up to 16 threads, every
/// engine; past that, opjournal's default and the SQLite arrangements with one writer
/// thread: opjournal's other configurations differ little from its default, and SQLite's
/// connection-per-thread arrangements wait in the busy handler or on the mutex (more than
/// ten times slower than its writer thread at 8 threads), which at 32 and 64 threads would
/// take most of the run to measure what is never the best arrangement.
fn runs_at(engine: Engine, threads: usize) -> bool {
    threads <= 16
        || match engine {
            Engine::Opj(c) => c == DEFAULT_CFG,
            Engine::Sqlite(c) => matches!(c.cfg.writers, Writers::GroupCommit | Writers::Writer(_)),
        }
}

struct Point {
    per_s: f64,
    latencies: Vec<Duration>,
    written_per_op: f64,
    syncs: syncs::Tally,
    elapsed: Duration,
    cpu: Duration,
}

/// One engine's journal for a thread count, kept open across the interleaved slices.
struct LcJournal {
    engine: Engine,
    path: PathBuf,
    opened: Opened,
    /// Each thread's scope revision, carried from slice to slice.
    revs: Vec<u64>,
    slices: usize,
    /// Lifecycles run so far, warm-ups included (for the self-check).
    lifecycles: u64,
    /// Syncs of this journal's files when it had just been opened.
    syncs_at_open: syncs::Tally,
}

/// The files an engine syncs: opjournal's redb file and log, SQLite's database and WAL.
fn synced_files(engine: Engine, path: &Path) -> Vec<PathBuf> {
    match engine {
        Engine::Opj(_) => {
            let [log, spare] = opjournal::FileLog::paths_for(path);
            vec![path.to_path_buf(), log, spare]
        }
        Engine::Sqlite(_) => sqlite_files(path)[..2].to_vec(),
    }
}

/// Syncs of the journal at `path` so far.
fn journal_syncs(engine: Engine, path: &Path) -> syncs::Tally {
    synced_files(engine, path)
        .iter()
        .fold(syncs::Tally::default(), |acc, f| acc.plus(syncs::of(f)))
}

impl LcJournal {
    fn create(engine: Engine, threads: usize, dir: &Path) -> Result<LcJournal> {
        let path = journal_path(engine, dir, &format!("lc-{}-{threads}", engine.key()));
        remove_journal(&path);
        let opened = Opened::open(engine, &path)?;
        Ok(LcJournal {
            engine,
            syncs_at_open: journal_syncs(engine, &path),
            opened,
            path,
            revs: vec![0; threads],
            slices: 0,
            lifecycles: 0,
        })
    }

    fn syncs(&self) -> syncs::Tally {
        journal_syncs(self.engine, &self.path).since(self.syncs_at_open)
    }

    /// The self-check: every lifecycle run left one applied, acknowledged operation.
    fn check(&self) -> Result<()> {
        let [ops, applied, acked] = self.opened.counts()?;
        let n = self.lifecycles;
        if [ops, applied, acked] != [n; 3] {
            return Err(format!(
                "self-check: {} with {} threads holds {ops} operations, {applied} applied, \
                 {acked} acknowledged; {n} lifecycles ran",
                self.engine.key(),
                self.revs.len()
            )
            .into());
        }
        Ok(())
    }

    fn remove(self) {
        drop(self.opened);
        remove_journal(&self.path);
    }
}

/// One slice of every journal, interleaved (A, B, C, ...), the starting one rotated by
/// `round` so that no engine always runs first (right after the disk's sample) or last;
/// `each` gets the journal's index and its slice.
fn interleaved_slices(
    journals: &mut [LcJournal],
    round: usize,
    per_thread: usize,
    ctx: &Ctx,
    mut each: impl FnMut(usize, Point),
) -> Result<()> {
    let n = journals.len();
    for k in 0..n {
        let i = (k + round) % n;
        each(i, lifecycle_slice(&mut journals[i], per_thread, ctx)?);
    }
    Ok(())
}

/// One slice: every thread runs `per_thread` lifecycles (after one untimed warm-up
/// lifecycle that also opens its SQLite connection).
fn lifecycle_slice(lc: &mut LcJournal, per_thread: usize, ctx: &Ctx) -> Result<Point> {
    let threads = lc.revs.len();
    let slice = lc.slices;
    lc.slices += 1;
    lc.lifecycles += (threads * (per_thread + 1)) as u64;
    let barrier = Barrier::new(threads + 1);
    let opened = &lc.opened;
    let (engine, path) = (lc.engine, lc.path.clone());
    let (elapsed, results, settled) = std::thread::scope(|s| {
        let mut handles = Vec::new();
        for (t, rev) in lc.revs.iter_mut().enumerate() {
            let barrier = &barrier;
            handles.push(s.spawn(move || -> Result<Vec<Duration>> {
                let scope = scope_of(t);
                let session = session_of(t);
                let warmed = (|| -> Result<Conn<'_>> {
                    let mut conn = opened.conn()?;
                    conn.lifecycle(ctx, &format!("w{slice}-{t}"), &scope, &session, rev)?;
                    Ok(conn)
                })();
                barrier.wait();
                let mut conn = warmed?;
                let mut lat = Vec::with_capacity(per_thread);
                for i in 0..per_thread {
                    let id = format!("s{slice}-t{t}-{i}");
                    lat.push(conn.lifecycle(ctx, &id, &scope, &session, rev)?.total());
                }
                Ok(lat)
            }));
        }
        barrier.wait();
        let start = Instant::now();
        let written_before = written_bytes();
        let syncs_before = journal_syncs(engine, &path);
        let cpu_before = cpu_time();
        let results: Vec<Result<Vec<Duration>>> = handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a worker thread panicked".into()))
            })
            .collect();
        // Inside the slice's time: a checkpoint this engine started still writing when its
        // last call returned is this slice's work (see `Opened::settle`).
        let settled = opened.settle();
        (
            (
                start.elapsed(),
                written_bytes().saturating_sub(written_before),
                journal_syncs(engine, &path).since(syncs_before),
                cpu_time().saturating_sub(cpu_before),
            ),
            results,
            settled,
        )
    });
    let (elapsed, written, syncs, cpu) = elapsed;
    settled?;
    let mut latencies = Vec::new();
    for r in results {
        latencies.extend(r?);
    }
    Ok(Point {
        per_s: latencies.len() as f64 / elapsed.as_secs_f64(),
        written_per_op: written as f64 / latencies.len().max(1) as f64,
        syncs,
        elapsed,
        cpu,
        latencies,
    })
}

/// What the lifecycle sweep measured for one engine at one thread count.
#[derive(Clone, Debug, Default)]
struct LcResult {
    /// Lifecycles per second of each slice.
    samples: Vec<f64>,
    /// Every lifecycle's latency.
    latencies: Vec<Duration>,
    /// write(2) bytes per lifecycle of each slice.
    written: Vec<f64>,
    /// Syncs per second of each slice (of this journal's files).
    syncs_per_s: Vec<f64>,
    /// The share of each slice's time spent in a sync of this journal's files.
    busy: Vec<f64>,
    /// CPU time of the whole process per lifecycle of each slice, in µs.
    cpu_us: Vec<f64>,
    /// Syncs over the journal's whole life in the sweep, and the lifecycles run.
    syncs: syncs::Tally,
    lifecycles: u64,
    /// `syncs.count / lifecycles`.
    syncs_per_op: f64,
}

impl LcResult {
    fn per_s(&self) -> f64 {
        median(&self.samples)
    }

    fn add(&mut self, point: Point) {
        let secs = point.elapsed.as_secs_f64();
        let n = point.latencies.len().max(1) as f64;
        self.samples.push(point.per_s);
        self.latencies.extend(point.latencies);
        self.written.push(point.written_per_op);
        self.syncs_per_s.push(point.syncs.count as f64 / secs);
        self.busy.push(point.syncs.time.as_secs_f64() / secs);
        self.cpu_us.push(point.cpu.as_secs_f64() * 1e6 / n);
    }

    fn mean_sync_ms(&self) -> f64 {
        self.syncs.time.as_secs_f64() * 1e3 / self.syncs.count.max(1) as f64
    }
}

fn section_lifecycle(
    p: &Params,
    dir: &Path,
    ctx: &Ctx,
    disk: &mut DiskRate,
    r: &mut Report,
) -> Result<()> {
    let mut res: BTreeMap<(&'static str, usize), LcResult> = BTreeMap::new();
    for &threads in &p.sweep_threads {
        let engines: Vec<Engine> = Engine::all()
            .into_iter()
            .filter(|e| runs_at(*e, threads))
            .collect();
        let per_thread = slice_per_thread(threads);
        progress(&format!(
            "lifecycle: {threads} thread(s), {} engines, {} interleaved slices of {} lifecycles each",
            engines.len(),
            p.lifecycle_slices,
            threads * per_thread
        ));
        let mut journals = Vec::new();
        for e in &engines {
            journals.push(LcJournal::create(*e, threads, dir)?);
        }
        for slice in 0..p.lifecycle_slices {
            // The disk's sync rate drifts on a shared machine: sample it between the
            // slices it is compared with.
            disk.sample(dir, p.raw_slice_writes)?;
            interleaved_slices(&mut journals, slice, per_thread, ctx, |i, point| {
                res.entry((engines[i].key(), threads))
                    .or_default()
                    .add(point);
            })?;
        }
        for lc in journals {
            lc.check()?;
            let e = res.entry((lc.engine.key(), threads)).or_default();
            e.syncs = lc.syncs();
            e.lifecycles = lc.lifecycles;
            e.syncs_per_op = e.syncs.count as f64 / lc.lifecycles.max(1) as f64;
            lc.remove();
        }
    }
    let get = |key: &str, t: usize| res.get(&(key, t)).cloned().unwrap_or_default();
    // Every ratio is taken against the fastest SQLite arrangement at that thread count.
    let best_sql = |t: usize| -> (SqlCfg, f64) {
        SQL_LIFECYCLE_VARIANTS
            .iter()
            .filter(|c| res.contains_key(&(c.key, t)))
            .map(|c| (*c, get(c.key, t).per_s()))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap_or((SQL_STANDARD, 0.0))
    };
    for (&(k, t), v) in &res {
        r.sweep.insert((k, t), SweepPoint::of(v));
    }
    for &t in &p.sweep_threads {
        let (best, _) = best_sql(t);
        let mut point = SweepPoint::of(&get(best.key, t));
        point.best_of = Some(best.key);
        r.sweep.insert(("sqlite-best", t), point);
    }
    for threads in HEADLINE_THREADS {
        if !p.sweep_threads.contains(&threads) {
            continue;
        }
        let (best, best_v) = best_sql(threads);
        let plural = if threads == 1 { "" } else { "s" };
        let mut row = |key: String, label: String, e: Engine, vs: &dyn Fn(f64, &str) -> String| {
            let m = get(e.key(), threads);
            let v = m.per_s();
            let pc = percentiles(&m.latencies);
            let sps = median(&m.syncs_per_s);
            let detail = format!(
                "p50 {:.2} ms, p99 {:.2} ms; {}",
                pc.p50 / 1e3,
                pc.p99 / 1e3,
                disk.busy_text(&m)
            );
            r.figure_vs(
                key,
                format!("lifecycle {threads} thread{plural}: {label}"),
                v,
                "ops/s",
                vs(v, &detail),
                json!({
                    "engine": e.key(),
                    "samples": m.samples,
                    "p50_us": pc.p50,
                    "p99_us": pc.p99,
                    "written_per_op_bytes": median(&m.written),
                    "syncs_per_op": m.syncs_per_op,
                    "syncs_per_s": sps,
                    "mean_sync_ms": m.mean_sync_ms(),
                    "syncing_share": median(&m.busy),
                    "cpu_us_per_op": median(&m.cpu_us),
                    "raw_loop_syncs_per_s": disk.limit(),
                    "best_sqlite": best.key,
                    "best_sqlite_ops_per_s": best_v,
                }),
            );
        };
        for e in Engine::all() {
            let Engine::Opj(_) = e else { continue };
            if !runs_at(e, threads) {
                continue;
            }
            row(
                format!("lifecycle_{threads}t_{}", e.key()),
                e.label().to_string(),
                e,
                &|v, detail| {
                    format!(
                        "{} ({}); {detail}",
                        ratio_text(v / best_v, "best SQLite"),
                        best.short_label
                    )
                },
            );
        }
        // The old key names the best arrangement now, so that JSON consumers comparing
        // `lifecycle_Nt_<opjournal>` with `lifecycle_Nt_sqlite` compare with the best.
        row(
            format!("lifecycle_{threads}t_sqlite"),
            format!("best SQLite = {}", best.label),
            Engine::Sqlite(best),
            &|_, detail| format!("the ratios above are against this; {detail}"),
        );
        for c in SQL_LIFECYCLE_VARIANTS {
            if !runs_at(Engine::Sqlite(c), threads) {
                continue;
            }
            row(
                format!("lifecycle_{threads}t_{}", c.key),
                c.label.to_string(),
                Engine::Sqlite(c),
                &|v, detail| format!("{}; {detail}", ratio_text(v / best_v, "the best SQLite")),
            );
        }
    }
    disk.report(r);
    // Targets (issue 27), for the default configuration, against the best SQLite
    // arrangement at each thread count.
    let k = DEFAULT_CFG.key();
    for t in HEADLINE_THREADS {
        if !p.sweep_threads.contains(&t) {
            continue;
        }
        let (v, s) = (get(k, t).per_s(), best_sql(t).1);
        let plural = if t == 1 { "" } else { "s" };
        r.at_least(
            format!("lifecycle {t} thread{plural} vs the best SQLite [{k}]"),
            v / s,
            1.5,
            ratio_text(v / s, "best SQLite"),
            "≥ 1.50×".into(),
        );
    }
    if p.sweep_threads.contains(&8) {
        let (best, _) = best_sql(8);
        let (o, s) = (
            percentiles(&get(k, 8).latencies).p99,
            percentiles(&get(best.key, 8).latencies).p99,
        );
        r.at_most(
            format!("lifecycle p99 at 8 threads vs the best SQLite's [{k}]"),
            o / s,
            1.0,
            format!(
                "{:.2} ms vs {:.2} ms ({})",
                o / 1e3,
                s / 1e3,
                fmt_ratio(o / s)
            ),
            "≤ 1.00×".into(),
        );
    }
    if p.sweep_threads.contains(&1)
        && let Some(limit) = disk.limit()
    {
        let v = get(k, 1).per_s();
        let bound = 0.8 * limit / DURABLE_COMMITS_PER_OP;
        r.at_least(
            format!("lifecycle 1 thread vs 0.8 × the disk's syncs/s ÷ 2 [{k}]"),
            v,
            bound,
            format!("{} ops/s", fmt_num(v)),
            format!("≥ {} ops/s", fmt_num(bound)),
        );
    }
    // The plot: opjournal's default and the arrangements that tell the story.
    let plotted: Vec<(&str, String)> = [
        DEFAULT_CFG.key(),
        "opj-excl",
        "sqlite-best",
        "sqlite-writer",
        "sqlite-group-ackq",
        "sqlite-mutex-ackq",
        "sqlite-conns",
    ]
    .into_iter()
    .map(|k| {
        let label = Engine::from_key(k).map_or_else(
            || "SQLite, best arrangement at each thread count".to_string(),
            |e| e.short_label().to_string(),
        );
        (k, label)
    })
    .collect();
    let series: Vec<Series> = plotted
        .iter()
        .map(|(k, label)| Series {
            name: label.clone(),
            points: p
                .sweep_threads
                .iter()
                .filter_map(|&t| r.sweep.get(&(*k, t)).map(|v| (t as f64, v.per_s)))
                .collect(),
        })
        .collect();
    let subtitle = format!(
        "submit + complete(applied, 1 KiB) + acknowledge per operation; median of {} interleaved slices; {}",
        p.lifecycle_slices,
        if p.quick { "quick run" } else { "full run" }
    );
    let svg = plot::line_chart(
        &Chart {
            title: "Durable lifecycle throughput vs concurrency",
            subtitle: &subtitle,
            x_label: "threads (distinct ids, scopes and sessions)",
            y_label: "lifecycles per second",
            log2_x: true,
        },
        &series,
    );
    let out = dir
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
        .join("lifecycle_concurrency.svg");
    fs::write(&out, svg)?;
    r.notes.push(format!("plot written to {}", out.display()));
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 3b. A sustained run: bytes written per lifecycle across several checkpoints
// ---------------------------------------------------------------------------------------

/// Lifecycles in one interleaved chunk of the sustained run.
const SUSTAINED_CHUNK: usize = 500;

/// A journal of the sustained run with its one connection (which keeps a SQLite store,
/// and its writer thread, until it is dropped).
enum Live {
    Opj(Journal),
    Sql(Box<SqlJournal>),
}

/// One engine's journal in the sustained run.
struct Sustained {
    engine: Engine,
    path: PathBuf,
    written: u64,
    syncs: syncs::Tally,
    /// Syncs of the index file alone (redb's file, SQLite's database): checkpoints.
    index_syncs: syncs::Tally,
    calls: Vec<Duration>,
    /// The slowest call of each lifecycle during which the index file was synced (a
    /// checkpoint ended while it ran), and the calls of the other lifecycles.
    checkpoint_calls: Vec<Duration>,
    quiet_calls: Vec<Duration>,
    busy: Duration,
    lifecycles: usize,
}

/// The writeback of the contention probe: the default `checkpoint_size`, about what a
/// checkpoint writes into the index file.
const CONTENTION_MIB: usize = 4;

fn section_sustained(p: &Params, dir: &Path, ctx: &Ctx, r: &mut Report) -> Result<()> {
    let engines = [
        Engine::Opj(DEFAULT_CFG),
        Engine::Sqlite(SQL_WRITER),
        Engine::Sqlite(SQL_STANDARD),
    ];
    let chunks = p.sustained_lifecycles.div_ceil(SUSTAINED_CHUNK);
    progress(&format!(
        "sustained: {} lifecycles on 1 thread per engine, interleaved in chunks of {SUSTAINED_CHUNK}, then closed",
        chunks * SUSTAINED_CHUNK
    ));
    let mut runs = Vec::new();
    for e in engines {
        let path = journal_path(e, dir, &format!("sustained-{}", e.key()));
        remove_journal(&path);
        // One connection per engine for the whole run: a SQLite store whose last
        // connection closes checkpoints and deletes its WAL.
        let live = match Opened::open(e, &path)? {
            Opened::Opj(j) => Live::Opj(j),
            Opened::Sql(store) => Live::Sql(Box::new(store.connect()?)),
        };
        runs.push((
            Sustained {
                engine: e,
                path,
                written: 0,
                syncs: syncs::Tally::default(),
                index_syncs: syncs::Tally::default(),
                calls: Vec::new(),
                checkpoint_calls: Vec::new(),
                quiet_calls: Vec::new(),
                busy: Duration::ZERO,
                lifecycles: 0,
            },
            live,
            0u64,
        ));
    }
    // Each engine's writes are counted while it alone runs: its chunks, and its close
    // (opjournal's last checkpoint, SQLite's last WAL checkpoint).
    let measure = |run: &mut Sustained, f: &mut dyn FnMut() -> Result<()>| -> Result<()> {
        let (written, all, index) = (
            written_bytes(),
            journal_syncs(run.engine, &run.path),
            syncs::of(&run.path),
        );
        let start = Instant::now();
        f()?;
        run.busy += start.elapsed();
        run.written += written_bytes().saturating_sub(written);
        run.syncs = run
            .syncs
            .plus(journal_syncs(run.engine, &run.path).since(all));
        run.index_syncs = run.index_syncs.plus(syncs::of(&run.path).since(index));
        Ok(())
    };
    for chunk in 0..chunks {
        for k in 0..runs.len() {
            let n = runs.len();
            let (run, live, rev) = &mut runs[(k + chunk) % n];
            let mut conn = match live {
                Live::Opj(j) => Conn::Opj(j),
                Live::Sql(db) => Conn::SqlMut(db),
            };
            let mut calls = Vec::with_capacity(3 * SUSTAINED_CHUNK);
            let (mut checkpoint_calls, mut quiet_calls) = (Vec::new(), Vec::new());
            let first = run.lifecycles;
            let index = syncs::canonical(&run.path);
            measure(run, &mut || {
                for i in first..first + SUSTAINED_CHUNK {
                    let before = syncs::of_canonical(&index).count;
                    let t = conn.lifecycle(ctx, &format!("sus-{i}"), "sus", "sus", rev)?;
                    let three = [t.submit, t.complete, t.ack];
                    if syncs::of_canonical(&index).count != before {
                        checkpoint_calls.extend(three.iter().max().copied());
                    } else {
                        quiet_calls.extend(three);
                    }
                    calls.extend(three);
                }
                // A checkpoint on the engine's own thread (opjournal's, into redb and
                // zeroing the ended log file) may still be writing when the chunk's last
                // call returns: waited for here, so that its bytes count in this chunk and
                // not in the next engine's.
                conn.settle()
            })?;
            run.calls.extend(calls);
            run.checkpoint_calls.extend(checkpoint_calls);
            run.quiet_calls.extend(quiet_calls);
            run.lifecycles += SUSTAINED_CHUNK;
        }
    }
    let mut done = Vec::new();
    for (mut run, mut live, _) in runs {
        let [ops, applied, acked] = match &mut live {
            Live::Opj(j) => {
                let s = j.stats()?;
                [s.operations, s.applied, s.acknowledged]
            }
            Live::Sql(db) => {
                let c = db.counts()?;
                [c.operations, c.applied, c.acknowledged]
            }
        };
        let n = run.lifecycles as u64;
        if [ops, applied, acked] != [n; 3] {
            return Err(format!(
                "self-check: sustained {} holds {ops} operations, {applied} applied, {acked} acknowledged; {n} lifecycles ran",
                run.engine.key()
            )
            .into());
        }
        let mut live = Some(live);
        measure(&mut run, &mut || {
            drop(live.take());
            Ok(())
        })?;
        remove_journal(&run.path);
        done.push(run);
    }
    let per_op = |run: &Sustained| run.written as f64 / run.lifecycles as f64;
    let best = done[1..]
        .iter()
        .min_by(|a, b| per_op(a).total_cmp(&per_op(b)))
        .ok_or("no SQLite in the sustained run")?;
    let best_w = per_op(best);
    for run in &done {
        let n = run.lifecycles as f64;
        let w = per_op(run);
        let index_file = match run.engine {
            Engine::Opj(_) => "redb file (checkpoints)",
            Engine::Sqlite(_) => "database file (WAL checkpoints)",
        };
        let detail = format!(
            "write(2) bytes, the 1 KiB result included; {:.2} syncs per lifecycle, {} of the {index_file}; {} lifecycles/s",
            run.syncs.count as f64 / n,
            run.index_syncs.count,
            fmt_num(n / run.busy.as_secs_f64())
        );
        let vs = match run.engine {
            Engine::Opj(_) => format!(
                "{} ({}); {detail}",
                ratio_text(w / best_w, "best SQLite's"),
                best.engine.short_label()
            ),
            Engine::Sqlite(_) => detail,
        };
        let extra = json!({
            "engine": run.engine.key(),
            "lifecycles": run.lifecycles,
            "written_bytes": run.written,
            "syncs": run.syncs.count,
            "index_file_syncs": run.index_syncs.count,
            "seconds": run.busy.as_secs_f64(),
        });
        r.figure_vs(
            format!("written_per_lifecycle_{}", run.engine.key()),
            format!(
                "bytes written per lifecycle, {} lifecycles on 1 thread, open to close: {}",
                run.lifecycles,
                run.engine.label()
            ),
            w / 1024.0,
            "KiB",
            vs,
            extra.clone(),
        );
        if run.engine.key() == best.engine.key() {
            r.figure_vs(
                "written_per_lifecycle_sqlite",
                format!(
                    "bytes written per lifecycle, sustained: best SQLite = {}",
                    best.engine.label()
                ),
                w / 1024.0,
                "KiB",
                "the ratio above is against this; write(2) bytes, the 1 KiB result included".into(),
                extra,
            );
        }
    }
    for run in &done {
        let pc = percentiles(&run.calls);
        let p999 = {
            let mut us: Vec<f64> = run.calls.iter().map(|d| d.as_secs_f64() * 1e6).collect();
            us.sort_by(f64::total_cmp);
            us.get((us.len() * 999 / 1000).min(us.len().saturating_sub(1)))
                .copied()
                .unwrap_or(0.0)
        };
        r.figure_vs(
            format!("sustained_call_p99_{}", run.engine.key()),
            format!(
                "call latency over the sustained run (checkpoints included): {}",
                run.engine.label()
            ),
            pc.p99 / 1e3,
            "ms",
            format!(
                "p99; p50 {:.2} ms, p99.9 {:.2} ms, max {:.1} ms over {} calls",
                pc.p50 / 1e3,
                p999 / 1e3,
                pc.max / 1e3,
                pc.count
            ),
            json!({"p50_us": pc.p50, "p90_us": pc.p90, "p99_us": pc.p99, "p999_us": p999, "max_us": pc.max}),
        );
    }
    // The physical floor of the figure below: a log sync beside a checkpoint-sized
    // writeback of another file, on this disk, now.
    let floor = {
        let mib = CONTENTION_MIB;
        let (quiet, busy) = writeback_contention(dir, mib)?;
        let ratio = busy.p99 / quiet.p99;
        r.figure_vs(
            "raw_sync_p99_beside_writeback",
            format!(
                "raw 4 KiB overwrite + fdatasync while another file takes {mib} MiB of scattered 4 KiB writes and a sync (a checkpoint's writes, by either engine): p99"
            ),
            busy.p99 / 1e3,
            "ms",
            format!(
                "{}× the p99 without it ({:.2} ms); p50 {:.2} ms against {:.2}, max {:.1} ms, {} syncs beside the writes: what a log sync costs beside a checkpoint that writes this much at once: the floor under 'a call during a checkpoint'",
                fmt_ratio(ratio),
                quiet.p99 / 1e3,
                busy.p50 / 1e3,
                quiet.p50 / 1e3,
                busy.max / 1e3,
                busy.count
            ),
            json!({"mib": mib, "quiet_p50_us": quiet.p50, "quiet_p99_us": quiet.p99,
                   "busy_p50_us": busy.p50, "busy_p99_us": busy.p99, "busy_max_us": busy.max,
                   "busy_syncs": busy.count}),
        );
        (busy.count > 0).then_some(ratio)
    };
    for run in &done {
        let (c, q) = (
            percentiles(&run.checkpoint_calls),
            percentiles(&run.quiet_calls),
        );
        let vs = format!(
            "p99 of the {} lifecycles during which a checkpoint synced the index file (the slowest call of each; p50 {:.2} ms, max {:.1} ms) = {}× the other calls' p99 ({:.2} ms)",
            c.count,
            c.p50 / 1e3,
            c.max / 1e3,
            fmt_ratio(c.p99 / q.p99),
            q.p99 / 1e3
        );
        r.figure_vs(
            format!("checkpoint_call_p99_{}", run.engine.key()),
            format!(
                "a call during a checkpoint, sustained run: {}",
                run.engine.label()
            ),
            c.p99 / 1e3,
            "ms",
            vs,
            json!({"checkpoint_calls": c.count, "p50_us": c.p50, "p99_us": c.p99, "max_us": c.max,
                   "other_calls_p99_us": q.p99}),
        );
        if let Engine::Opj(cfg) = run.engine {
            let floor = floor
                .map(|f| format!("; the disk's floor {}×", fmt_ratio(f)))
                .unwrap_or_default();
            r.at_most(
                format!(
                    "call p99 during a checkpoint vs the other calls' [{}]",
                    cfg.key()
                ),
                c.p99 / q.p99,
                1.3,
                format!(
                    "{} ({} calls{floor})",
                    ratio_text(c.p99 / q.p99, "the others'"),
                    c.count
                ),
                "≤ 1.30×".into(),
            );
        }
    }
    let opj = per_op(&done[0]);
    r.at_most(
        format!(
            "bytes written per lifecycle, sustained, vs SQLite [{}]",
            DEFAULT_CFG.key()
        ),
        opj / best_w,
        1.0,
        ratio_text(opj / best_w, "best SQLite's"),
        "≤ 1.00×".into(),
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The base journals: N completed, acknowledged operations with 1 KiB results
// ---------------------------------------------------------------------------------------

struct Base {
    opj: PathBuf,
    sql: PathBuf,
    n: usize,
}

/// Returns the time and the size of the journal and its log while the journal was open.
fn build_opj_base(
    path: &Path,
    n: usize,
    threads: usize,
    ctx: &Ctx,
) -> Result<(Duration, Footprint)> {
    remove_one(path);
    let j = DEFAULT_CFG.builder().open(path)?;
    let start = Instant::now();
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let j = &j;
                let start = &start;
                s.spawn(move || -> Result<()> {
                    let mut conn = Conn::Opj(j);
                    let scope = format!("base/{t}");
                    let session = format!("base-session/{t}");
                    let mut rev = 0;
                    for i in (t..n).step_by(threads) {
                        conn.lifecycle(ctx, &base_name(i), &scope, &session, &mut rev)?;
                        if t == 0 && i > 0 && i % (n / 10).max(1) < threads {
                            progress(&format!(
                                "  populated {i} of {n}, {:.0} ops/s so far",
                                i as f64 / start.elapsed().as_secs_f64()
                            ));
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a populate thread panicked".into()))
            })
            .collect()
    });
    for r in results {
        r?;
    }
    let elapsed = start.elapsed();
    let [log, spare] = opjournal::FileLog::paths_for(path);
    let bytes = Footprint::of(&[path, log.as_path(), spare.as_path()]);
    drop(j);
    Ok((elapsed, bytes))
}

/// Returns the time and the size of db + wal while the connection was open.
fn build_sql_base(
    path: &Path,
    n: usize,
    threads: usize,
    ctx: &Ctx,
) -> Result<(Duration, Footprint)> {
    remove_journal(path);
    let store = SqlStore::open(path, SQL_STANDARD.cfg)?;
    let mut db = store.connect()?;
    let ops: Vec<(String, String, String)> = (0..n)
        .map(|i| {
            let t = i % threads;
            (base_id(i), format!("base/{t}"), format!("base-session/{t}"))
        })
        .collect();
    let start = Instant::now();
    db.populate(&ops, &ctx.hash, &ctx.payload, 1000)?;
    let elapsed = start.elapsed();
    let files = sqlite_files(path);
    let bytes = Footprint::of(&[&files[0], &files[1]]);
    drop((db, store));
    Ok((elapsed, bytes))
}

/// The base journals' sizes while their populating handles were open (journal and log;
/// db and wal).
struct OpenSizes {
    opj: Footprint,
    sql: Footprint,
}

fn build_base(p: &Params, dir: &Path, ctx: &Ctx, r: &mut Report) -> Result<(Base, OpenSizes)> {
    let base = Base {
        opj: dir.join("base.opj"),
        sql: dir.join("base.sqlite"),
        n: p.base_n,
    };
    progress(&format!(
        "building the base journals: {} completed operations with 1 KiB results ({} threads for opjournal)",
        base.n, p.populate_threads
    ));
    let (t, opj_open) = build_opj_base(&base.opj, base.n, p.populate_threads, ctx)?;
    r.figure_vs(
        "populate_opj_32t",
        format!(
            "populate: lifecycles with {} threads, opjournal default (group commit)",
            p.populate_threads
        ),
        base.n as f64 / t.as_secs_f64(),
        "ops/s",
        format!("{:.1} s for {}", t.as_secs_f64(), base.n),
        Value::Null,
    );
    let (t, sql_open) = build_sql_base(&base.sql, base.n, p.populate_threads, ctx)?;
    r.figure_vs(
        "populate_sqlite_batched",
        "populate: SQLite, 1000 lifecycles per transaction (not comparable)",
        base.n as f64 / t.as_secs_f64(),
        "ops/s",
        format!("{:.1} s for {}", t.as_secs_f64(), base.n),
        Value::Null,
    );
    Ok((
        base,
        OpenSizes {
            opj: opj_open,
            sql: sql_open,
        },
    ))
}

// ---------------------------------------------------------------------------------------
// 4. Replay lookups
// ---------------------------------------------------------------------------------------

/// One contestant of the replay section, on the base journal.
enum Replayer {
    Opj(Journal),
    Sql(SqlCfg, Box<SqlJournal>),
}

impl Replayer {
    fn engine(&self) -> Engine {
        match self {
            Replayer::Opj(_) => Engine::Opj(DEFAULT_CFG),
            Replayer::Sql(c, _) => Engine::Sqlite(*c),
        }
    }

    /// Looks up the base operation of every pick (each must answer a replay; the base was
    /// populated by `threads` threads), pushing each call's time onto `lat`; returns
    /// lookups per second.
    fn round(
        &self,
        picks: &[usize],
        ctx: &Ctx,
        threads: usize,
        lat: &mut Vec<Duration>,
    ) -> Result<f64> {
        let start;
        match self {
            Replayer::Opj(j) => {
                let ops: Vec<Operation> = picks
                    .iter()
                    .map(|&i| {
                        let t = i % threads;
                        Operation::new(base_id(i), ctx.intent.clone())
                            .scope(format!("base/{t}"))
                            .session(format!("base-session/{t}"))
                    })
                    .collect();
                start = Instant::now();
                for op in ops {
                    let t0 = Instant::now();
                    let a = j.submit(op)?;
                    lat.push(t0.elapsed());
                    if !matches!(a, Admission::Replay(_)) {
                        return Err(format!("expected a replay, got {}", a.name()).into());
                    }
                }
            }
            Replayer::Sql(_, db) => {
                let ids: Vec<String> = picks.iter().map(|&i| base_id(i)).collect();
                start = Instant::now();
                for id in &ids {
                    let t0 = Instant::now();
                    let a = db.lookup_replay(id, &ctx.hash)?;
                    lat.push(t0.elapsed());
                    if !matches!(a, SqlAdmission::Replay(_)) {
                        return Err(format!("expected a replay, got {a:?}").into());
                    }
                }
            }
        }
        Ok(picks.len() as f64 / start.elapsed().as_secs_f64())
    }
}

fn section_replay(p: &Params, base: &Base, ctx: &Ctx, r: &mut Report) -> Result<()> {
    progress(&format!(
        "replay lookups: {} per engine over {} stored receipts",
        p.replay_lookups, base.n
    ));
    let mut players = vec![Replayer::Opj(DEFAULT_CFG.builder().open(&base.opj)?)];
    for c in SQL_REPLAY_VARIANTS {
        let db = SqlStore::open(&base.sql, c.cfg)?.connect()?;
        players.push(Replayer::Sql(c, Box::new(db)));
    }
    let mut rng = Rng::new(0x5EED);
    // Random ids over every stored receipt: what the targets are about. Past opjournal's
    // replay cache (1 MiB by default), almost every lookup reads the index.
    let all = base.n as u64;
    let (o, s, po) = replay_pass(p, &players, ctx, &mut rng, all, 0, "", r)?;
    r.at_least(
        "replay lookup throughput vs SQLite",
        o / s,
        2.5,
        ratio_text(o / s, "best SQLite"),
        "≥ 2.50×".into(),
    );
    r.at_most(
        "replay lookup p50 (opjournal)",
        po.p50,
        2.0,
        format!("{:.2} µs", po.p50),
        "≤ 2.00 µs".into(),
    );
    // The same over the 500 most recent ids, as clients re-ask what they just got after a
    // reconnect: opjournal's replay cache holds them (SQLite's page cache holds their pages).
    let hot = 500u64.min(all);
    replay_pass(p, &players, ctx, &mut rng, hot, all - hot, "hot_", r)?;
    Ok(())
}

/// One replay measurement: rounds of lookups of ids `offset..offset + span` (random,
/// interleaved between the contestants), reported under `key_prefix`. Returns opjournal's
/// rate, the best SQLite rate and opjournal's latencies.
#[allow(clippy::too_many_arguments)]
fn replay_pass(
    p: &Params,
    players: &[Replayer],
    ctx: &Ctx,
    rng: &mut Rng,
    span: u64,
    offset: u64,
    key_prefix: &str,
    r: &mut Report,
) -> Result<(f64, f64, Percentiles)> {
    let what = if key_prefix.is_empty() {
        "replay lookup".to_string()
    } else {
        format!("replay lookup of the {span} most recent ids (re-asked)")
    };
    let chunk = (p.replay_lookups / p.replay_rounds).max(1);
    let mut lats: Vec<Vec<Duration>> = players.iter().map(|_| Vec::new()).collect();
    let mut rates: Vec<Vec<f64>> = players.iter().map(|_| Vec::new()).collect();
    let mut pick = || (offset + rng.below(span)) as usize;
    // Warm every cache with one pass over a sample.
    let warm: Vec<usize> = (0..chunk.min(5_000)).map(|_| pick()).collect();
    for pl in players {
        pl.round(&warm, ctx, p.populate_threads, &mut Vec::new())?;
    }
    for round in 0..p.replay_rounds {
        let picks: Vec<usize> = (0..chunk).map(|_| pick()).collect();
        // Interleaved, the starting contestant rotated every round.
        for k in 0..players.len() {
            let i = (k + round) % players.len();
            rates[i].push(players[i].round(&picks, ctx, p.populate_threads, &mut lats[i])?);
        }
    }
    let results: Vec<(Engine, f64, Percentiles, &Vec<f64>)> = players
        .iter()
        .enumerate()
        .map(|(i, pl)| {
            (
                pl.engine(),
                median(&rates[i]),
                percentiles(&lats[i]),
                &rates[i],
            )
        })
        .collect();
    // Every ratio is taken against the fastest SQLite arrangement.
    let (o, po) = (results[0].1, results[0].2);
    let best = results[1..]
        .iter()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .ok_or("no SQLite contestant")?;
    let s = best.1;
    let extra = |res: &(Engine, f64, Percentiles, &Vec<f64>)| {
        let (e, _, pc, rounds) = res;
        json!({
            "engine": e.key(), "p50_us": pc.p50, "p90_us": pc.p90,
            "p99_us": pc.p99, "max_us": pc.max, "rounds": rounds,
        })
    };
    let lat = |pc: &Percentiles| format!("p50 {:.2} µs, p99 {:.2} µs", pc.p50, pc.p99);
    r.figure_vs(
        format!("{key_prefix}replay_opj"),
        format!("{what}: opjournal submit() of a completed id"),
        o,
        "ops/s",
        format!(
            "{} ({}); {}",
            ratio_text(o / s, "best SQLite"),
            best.0.short_label(),
            lat(&po)
        ),
        extra(&results[0]),
    );
    r.figure_vs(
        format!("{key_prefix}replay_sqlite"),
        format!("{what}: best SQLite = {}", best.0.label()),
        s,
        "ops/s",
        format!("the ratio above is against this; {}", lat(&best.2)),
        extra(best),
    );
    for res in &results[1..] {
        r.figure_vs(
            format!("{key_prefix}replay_{}", res.0.key()),
            format!("{what}: {}", res.0.label()),
            res.1,
            "ops/s",
            format!(
                "{}; {}",
                ratio_text(res.1 / s, "the best SQLite"),
                lat(&res.2)
            ),
            extra(res),
        );
    }
    Ok((o, s, po))
}

// ---------------------------------------------------------------------------------------
// 7. Bytes on disk per live receipt
// ---------------------------------------------------------------------------------------

/// Where a journal file's bytes go, read with redb directly from a copy (the journal's
/// own API does not expose page statistics): per table, stored key+value bytes, then the
/// file size after `redb::Database::compact`.
struct RedbBreakdown {
    tables: Vec<(String, u64, u64)>,
    stored: u64,
    metadata: u64,
    fragmented: u64,
    allocated: u64,
    compacted_len: u64,
}

fn redb_breakdown(path: &Path, scratch: &Path) -> Result<RedbBreakdown> {
    use redb::{ReadableDatabase, ReadableTableMetadata, TableHandle};
    copy_synced(path, scratch)?;
    let mut db = redb::Database::open(scratch)?;
    let mut tables = Vec::new();
    {
        let txn = db.begin_read()?;
        let handles: Vec<_> = txn.list_tables()?.collect();
        for h in handles {
            let name = h.name().to_string();
            let t = txn.open_untyped_table(h)?;
            let st = t.stats()?;
            tables.push((name, t.len()?, st.stored_bytes()));
        }
    }
    let st = {
        let txn = db.begin_write()?;
        let st = txn.stats()?;
        txn.abort()?;
        st
    };
    db.compact()?;
    drop(db);
    let compacted_len = file_len(scratch);
    remove_one(scratch);
    tables.sort_by_key(|t| std::cmp::Reverse(t.2));
    Ok(RedbBreakdown {
        tables,
        stored: st.stored_bytes(),
        metadata: st.metadata_bytes(),
        fragmented: st.fragmented_bytes(),
        allocated: st.allocated_pages() * st.page_size() as u64,
        compacted_len,
    })
}

/// The peak resident memory of this process so far (`VmHWM`), in bytes.
fn peak_rss() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .ok_or("no VmHWM in /proc/self/status")?;
    Ok(kib * 1024)
}

/// `bench __export PATH`: walks the journal the way `opjournal export --results` does
/// (every receipt with its result, then every event, streaming through the
/// `Inspector`), serializing each to JSON into a sink, and prints `records peak_before
/// peak_after` (bytes of peak resident memory before opening and after the walk).
fn export_child(args: &[String]) -> Result<()> {
    let path = PathBuf::from(args.first().ok_or("missing PATH")?);
    let before = peak_rss()?;
    let insp = opjournal::Inspector::open(&path)?;
    let mut sink = std::io::sink();
    let mut records = 0u64;
    insp.for_each_receipt(|rcpt| {
        let res = insp.result(&rcpt.operation_id)?;
        let line = json!({"receipt": format!("{rcpt:?}"), "result": res.map(|x| x.bytes.len())});
        serde_json::to_writer(&mut sink, &line)
            .map_err(|e| opjournal::Error::from(std::io::Error::other(e)))?;
        records += 1;
        Ok(true)
    })?;
    insp.for_each_event(0, |ev| {
        serde_json::to_writer(&mut sink, &json!({"event": format!("{ev:?}")}))
            .map_err(|e| opjournal::Error::from(std::io::Error::other(e)))?;
        records += 1;
        Ok(true)
    })?;
    println!("{records} {before} {}", peak_rss()?);
    Ok(())
}

/// Peak memory of an export of the base journal, in a child process.
fn section_export_memory(base: &Base, r: &mut Report) -> Result<()> {
    progress("export memory");
    let out = Command::new(std::env::current_exe()?)
        .arg("__export")
        .arg(&base.opj)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()?;
    if !out.status.success() {
        return Err(format!("export child failed: {}", out.status).into());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let nums: Vec<u64> = text
        .split_whitespace()
        .map(str::parse)
        .collect::<std::result::Result<_, _>>()?;
    let [records, before, after] = nums[..] else {
        return Err(format!("unexpected export child output: {text}").into());
    };
    let file = file_len(&base.opj);
    r.figure_vs(
        "export_peak_rss",
        format!("export of {} receipts, results and events: peak memory", base.n),
        after as f64 / (1024.0 * 1024.0),
        "MiB",
        format!(
            "{:.2}× the {:.0} MiB file; {:.1} MiB before opening; {records} records",
            after as f64 / file as f64,
            file as f64 / (1024.0 * 1024.0),
            before as f64 / (1024.0 * 1024.0)
        ),
        json!({"records": records, "peak_before_bytes": before, "peak_after_bytes": after, "file_bytes": file}),
    );
    Ok(())
}

fn section_size(dir: &Path, base: &Base, open: &OpenSizes, r: &mut Report) -> Result<()> {
    progress("bytes on disk per receipt");
    let n = base.n as f64;
    // Bytes on disk: what the file system allocated (`du`), for both engines, in the same
    // state: at rest (closed: opjournal's log checkpointed and removed, SQLite's wal
    // checkpointed and removed), and open (the journal and its log; the db and its wal).
    // The file's length is shown too: redb doubles its file as it grows, and the new space
    // is a hole that takes no disk until pages are written there.
    let opj_files = Footprint::of(&[&base.opj]);
    let sql_closed = Footprint::of(&[&base.sql]);
    let sql_open = open.sql;
    let opj = opj_files.disk as f64 / n;
    let sql = sql_closed.disk as f64 / n;
    let opj_open = open.opj.disk as f64 / n;
    let sql_open_per = sql_open.disk as f64 / n;
    let bd = redb_breakdown(&base.opj, &dir.join("size-breakdown.opj"))?;
    let per_table: Vec<String> = bd
        .tables
        .iter()
        .filter(|t| t.2 > 0)
        .map(|(name, _, stored)| format!("{name} {:.0}", *stored as f64 / n))
        .collect();
    r.figure_vs(
        "bytes_per_receipt_opj",
        format!(
            "bytes on disk per receipt (allocated, as du counts; 1 KiB result, {} receipts): opjournal, closed",
            base.n
        ),
        opj,
        "B",
        ratio_text(opj / sql, "SQLite closed"),
        json!({"file_bytes": opj_files.len, "disk_bytes": opj_files.disk}),
    );
    r.figure_vs(
        "bytes_per_receipt_opj_stored",
        "  of which key+value bytes stored (redb stats)",
        bd.stored as f64 / n,
        "B",
        per_table.join(", "),
        json!({
            "tables": bd.tables.iter().map(|(name, len, stored)| json!({"table": name, "entries": len, "stored_bytes": stored})).collect::<Vec<_>>(),
            "metadata_bytes": bd.metadata,
            "fragmented_bytes": bd.fragmented,
            "allocated_bytes": bd.allocated,
        }),
    );
    r.figure_vs(
        "bytes_per_receipt_opj_fragmented",
        "  of which free pages written earlier and btree overhead",
        (opj_files.disk as f64 - bd.stored as f64) / n,
        "B",
        format!(
            "redb reports {} B/receipt fragmented (free pages, holes included), {} B/receipt metadata",
            fmt_num(bd.fragmented as f64 / n),
            fmt_num(bd.metadata as f64 / n)
        ),
        Value::Null,
    );
    r.figure_vs(
        "file_len_per_receipt_opj",
        "file length per receipt (ls), opjournal (redb doubles its file as it grows; new space is a hole until written)",
        opj_files.len as f64 / n,
        "B",
        ratio_text(opj_files.len as f64 / sql_closed.len as f64, "SQLite's closed db length"),
        Value::Null,
    );
    r.figure_vs(
        "bytes_per_receipt_opj_compacted",
        "bytes per receipt after redb compact (opjournal compact --reclaim), file length",
        bd.compacted_len as f64 / n,
        "B",
        ratio_text(
            bd.compacted_len as f64 / sql_closed.len as f64,
            "SQLite closed",
        ),
        Value::Null,
    );
    r.figure_vs(
        "bytes_per_receipt_sqlite",
        format!(
            "bytes on disk per receipt (allocated; 1 KiB result, {} receipts): SQLite db, closed",
            base.n
        ),
        sql,
        "B",
        format!("file length {} B", fmt_num(sql_closed.len as f64 / n)),
        json!({"closed_db_bytes": sql_closed.len, "closed_disk_bytes": sql_closed.disk}),
    );
    r.figure_vs(
        "bytes_per_receipt_opj_open",
        "bytes on disk per receipt while open: opjournal journal + log",
        opj_open,
        "B",
        ratio_text(opj_open / sql_open_per, "SQLite db + wal while open"),
        json!({"open_bytes": open.opj.len, "open_disk_bytes": open.opj.disk}),
    );
    r.figure_vs(
        "bytes_per_receipt_sqlite_open",
        "bytes on disk per receipt while open: SQLite db + wal",
        sql_open_per,
        "B",
        format!("file length {} B", fmt_num(sql_open.len as f64 / n)),
        json!({"open_bytes": sql_open.len, "open_disk_bytes": sql_open.disk}),
    );
    // The target holds in both states: the larger ratio is the one checked.
    let worse = (opj / sql).max(opj_open / sql_open_per);
    r.at_most(
        "bytes on disk per receipt vs SQLite (closed and open, the larger)",
        worse,
        1.2,
        format!(
            "{}; open {}",
            ratio_text(opj / sql, "SQLite closed"),
            ratio_text(opj_open / sql_open_per, "SQLite open")
        ),
        "≤ 1.20×".into(),
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 5. Compaction of N expired operations, and foreground latency meanwhile
// ---------------------------------------------------------------------------------------

fn expired_clock() -> ManualClock {
    ManualClock::new(Timestamp::from_millis(
        now_ms() + u64::try_from(PAST_AUDIT_RETENTION.as_millis()).unwrap_or(u64::MAX),
    ))
}

/// The SQLite purges the compaction section measures: (key, label, batch, way). The
/// ratio is taken against the fastest of them.
const SQL_PURGES: [(&str, &str, usize, PurgeWay); 5] = [
    (
        "per-op-1000",
        "a prepared DELETE per operation and table, 1,000 operations per transaction",
        1000,
        PurgeWay::PerOperation,
    ),
    (
        "per-op-one-tx",
        "a prepared DELETE per operation and table, all in one transaction",
        usize::MAX,
        PurgeWay::PerOperation,
    ),
    (
        "per-op-key-order-one-tx",
        "a prepared DELETE per operation and table, in op_id order, all in one transaction",
        usize::MAX,
        PurgeWay::PerOperationInKeyOrder,
    ),
    (
        "set-1000",
        "one set-based DELETE ... WHERE op_id IN (SELECT due) per table, 1,000 operations per transaction",
        1000,
        PurgeWay::SetBased,
    ),
    (
        "set-one-tx",
        "one set-based DELETE ... WHERE op_id IN (SELECT due) per table, all in one transaction",
        usize::MAX,
        PurgeWay::SetBased,
    ),
];

fn section_compaction(p: &Params, dir: &Path, base: &Base, r: &mut Report) -> Result<()> {
    let mut opj_t = Vec::new();
    // Until the checkpoint that removes the pass's deferred purges, which commits beside
    // the log after `compact()` returned, is in the index file too (`flush`).
    let mut opj_committed_t = Vec::new();
    let mut sql_t: Vec<Vec<f64>> = SQL_PURGES.iter().map(|_| Vec::new()).collect();
    let mut last_report = Value::Null;
    let run_opj = |last: &mut Value, committed: &mut Vec<f64>| -> Result<f64> {
        let path = dir.join("compact.opj");
        copy_synced(&base.opj, &path)?;
        let j = DEFAULT_CFG.builder().clock(expired_clock()).open(&path)?;
        let start = Instant::now();
        let report = j.compact()?;
        let secs = start.elapsed().as_secs_f64();
        j.flush()?;
        committed.push(start.elapsed().as_secs_f64());
        if report.purged < base.n as u64 {
            return Err(format!("compaction purged {} of {}", report.purged, base.n).into());
        }
        *last = serde_json::to_value(&report)?;
        drop(j);
        remove_one(&path);
        Ok(secs)
    };
    let run_sql = |batch: usize, way: PurgeWay| -> Result<f64> {
        let path = dir.join("compact.sqlite");
        remove_journal(&path);
        copy_synced(&base.sql, &path)?;
        let store = SqlStore::open(&path, SQL_STANDARD.cfg)?;
        let mut db = store.connect()?;
        db.clock_offset = PAST_AUDIT_RETENTION;
        let start = Instant::now();
        let purged = db.purge_expired_with(batch, way)?;
        let secs = start.elapsed().as_secs_f64();
        if purged < base.n as u64 {
            return Err(format!("sqlite purged {purged} of {}", base.n).into());
        }
        drop((db, store));
        remove_journal(&path);
        Ok(secs)
    };
    for rep in 0..p.reps {
        progress(&format!(
            "compaction of {} expired operations: repetition {}/{}",
            base.n,
            rep + 1,
            p.reps
        ));
        // Interleaved, the starting contestant rotated every repetition.
        let players = SQL_PURGES.len() + 1;
        for k in 0..players {
            match (k + rep) % players {
                0 => opj_t.push(run_opj(&mut last_report, &mut opj_committed_t)?),
                i => {
                    let (_, _, batch, way) = SQL_PURGES[i - 1];
                    sql_t[i - 1].push(run_sql(batch, way)?);
                }
            }
        }
    }
    let o = median(&opj_t);
    let sql_medians: Vec<f64> = sql_t.iter().map(|t| median(t)).collect();
    let best = (0..SQL_PURGES.len())
        .min_by(|&a, &b| sql_medians[a].total_cmp(&sql_medians[b]))
        .ok_or("no SQLite purge")?;
    let s = sql_medians[best];
    let (best_key, best_label, ..) = SQL_PURGES[best];
    r.figure_vs(
        "compaction_opj",
        format!(
            "compaction of {} expired operations: opjournal compact()",
            base.n
        ),
        o * 1e3,
        "ms",
        format!(
            "{} ({best_key}); {:.0} ms until the index file holds it too ({})",
            ratio_text(o / s, "the best SQLite's time"),
            median(&opj_committed_t) * 1e3,
            ratio_text(median(&opj_committed_t) / s, "SQLite's")
        ),
        json!({"samples_s": opj_t, "committed_s": opj_committed_t, "report": last_report}),
    );
    r.figure_vs(
        "compaction_sqlite",
        format!(
            "compaction of {} expired operations: best SQLite = {best_label} ({})",
            base.n, SQL_STANDARD.short_label
        ),
        s * 1e3,
        "ms",
        "the ratio above is against this".into(),
        json!({"samples_s": sql_t[best], "best_of": best_key}),
    );
    for (i, (key, label, ..)) in SQL_PURGES.iter().enumerate() {
        r.figure_vs(
            format!("compaction_sqlite_{key}"),
            format!(
                "compaction of {} expired operations: SQLite, {label}",
                base.n
            ),
            sql_medians[i] * 1e3,
            "ms",
            ratio_text(sql_medians[i] / s, "the best SQLite's time"),
            json!({"samples_s": sql_t[i]}),
        );
    }
    r.at_most(
        "compaction time vs SQLite",
        o / s,
        0.5,
        ratio_text(o / s, "the best SQLite's time"),
        "≤ 0.50×".into(),
    );
    Ok(())
}

/// Foreground lifecycle calls with no compaction, then while a thread compacts.
/// Returns (idle samples, busy samples, lifecycles run during compaction, compaction s).
fn foreground_run(
    engine: Engine,
    dir: &Path,
    base: &Base,
    ctx: &Ctx,
    n_idle: usize,
) -> Result<(Vec<Duration>, Vec<Duration>, usize, f64)> {
    match engine {
        Engine::Opj(cfg) => {
            let path = dir.join("fg.opj");
            copy_synced(&base.opj, &path)?;
            let j = cfg.builder().clock(expired_clock()).open(&path)?;
            // Until the pass's last checkpoint, which commits beside the calls after
            // `compact()` returned, is done too.
            let out = idle_then_busy(&mut Conn::Opj(&j), ctx, n_idle, || {
                j.compact().and_then(|_| j.flush()).map_err(Error::from)
            })?;
            drop(j);
            remove_one(&path);
            Ok(out)
        }
        Engine::Sqlite(cfg) => {
            let path = dir.join("fg.sqlite");
            remove_journal(&path);
            copy_synced(&base.sql, &path)?;
            // One store for both threads: the purge takes the same write path (mutex,
            // writer thread) as the foreground.
            let store = SqlStore::open(&path, cfg.cfg)?;
            let connect = || -> Result<SqlJournal> {
                let mut c = store.connect()?;
                c.clock_offset = PAST_AUDIT_RETENTION;
                Ok(c)
            };
            let mut conn = Conn::Sql(connect()?);
            let out = idle_then_busy(&mut conn, ctx, n_idle, || {
                connect()?.purge_expired(1000).map(drop)
            })?;
            drop((conn, store));
            remove_journal(&path);
            Ok(out)
        }
    }
}

/// `n_idle` lifecycles on `conn`, then lifecycles until `compact`, run on another thread,
/// returns. Returns (idle samples, busy samples, lifecycles during compaction, its s).
fn idle_then_busy(
    conn: &mut Conn<'_>,
    ctx: &Ctx,
    n_idle: usize,
    compact: impl FnOnce() -> Result<()> + Send,
) -> Result<(Vec<Duration>, Vec<Duration>, usize, f64)> {
    let calls = |t: &CallTimes| [t.submit, t.complete, t.ack];
    let mut rev = 0;
    let mut idle = Vec::new();
    for i in 0..n_idle {
        let t = conn.lifecycle(ctx, &format!("fg-idle-{i}"), "fg", "fg", &mut rev)?;
        idle.extend(calls(&t));
    }
    let mut busy = Vec::new();
    let mut during = 0usize;
    let done = AtomicBool::new(false);
    let (res, secs) = std::thread::scope(|s| {
        let h = s.spawn(|| {
            let start = Instant::now();
            let r = compact();
            done.store(true, Ordering::SeqCst);
            (r, start.elapsed().as_secs_f64())
        });
        let mut fg: Result<()> = Ok(());
        while !done.load(Ordering::SeqCst) {
            match conn.lifecycle(ctx, &format!("fg-busy-{during}"), "fg", "fg", &mut rev) {
                Ok(t) => busy.extend(calls(&t)),
                Err(e) => {
                    fg = Err(e);
                    break;
                }
            }
            during += 1;
        }
        let (r, secs) = h
            .join()
            .unwrap_or_else(|_| (Err("the compaction thread panicked".into()), 0.0));
        (fg.and(r), secs)
    });
    res?;
    Ok((idle, busy, during, secs))
}

/// Per engine: idle p99s, compacting p99s (µs), compaction seconds, lifecycles meanwhile.
/// Per engine: idle p99s, busy p99s, compaction seconds, lifecycles during the passes,
/// and the busy calls' (p50, p90, max) of each repetition.
type FgSamples = (Vec<f64>, Vec<f64>, Vec<f64>, usize, Vec<(f64, f64, f64)>);

fn section_foreground(
    p: &Params,
    dir: &Path,
    base: &Base,
    ctx: &Ctx,
    r: &mut Report,
) -> Result<()> {
    let engines = [Engine::Opj(DEFAULT_CFG), Engine::Sqlite(SQL_STANDARD)];
    let mut p99: BTreeMap<&'static str, FgSamples> = BTreeMap::new();
    for rep in 0..p.reps {
        progress(&format!(
            "foreground latency during compaction: repetition {}/{}",
            rep + 1,
            p.reps
        ));
        for k in 0..engines.len() {
            let e = engines[(k + rep) % engines.len()];
            if matches!(e, Engine::Sqlite(_)) && rep > 0 {
                // Context only, and slow (the purge waits behind the foreground writer):
                // one repetition is enough.
                continue;
            }
            let (idle, busy, during, secs) = foreground_run(e, dir, base, ctx, p.fg_lifecycles)?;
            let entry = p99.entry(e.key()).or_default();
            let b = percentiles(&busy);
            entry.0.push(percentiles(&idle).p99);
            entry.1.push(b.p99);
            entry.2.push(secs);
            entry.3 += during;
            entry.4.push((b.p50, b.p90, b.max));
        }
    }
    for e in engines {
        let Some((idle, busy, secs, during, spread)) = p99.get(e.key()) else {
            continue;
        };
        let (i, b) = (median(idle), median(busy));
        let of = |f: fn(&(f64, f64, f64)) -> f64| {
            median(&spread.iter().map(f).collect::<Vec<_>>()) / 1e3
        };
        let (b50, b90, bmax) = (of(|s| s.0), of(|s| s.1), of(|s| s.2));
        r.figure_vs(
            format!("fg_p99_idle_{}", section_key(e)),
            format!("foreground call p99, idle: {}", e.label()),
            i / 1e3,
            "ms",
            String::new(),
            json!({"samples_us": idle}),
        );
        r.figure_vs(
            format!("fg_p99_compacting_{}", section_key(e)),
            format!(
                "foreground call p99, while compacting {}: {}",
                base.n,
                e.label()
            ),
            b / 1e3,
            "ms",
            format!(
                "{} idle; compaction took {:.2} s; {} lifecycles ran meanwhile; calls p50 {b50:.2}, p90 {b90:.2}, max {bmax:.1} ms",
                ratio_text(b / i, "its"),
                median(secs),
                during / idle.len().max(1)
            ),
            json!({"samples_us": busy, "compaction_s": secs, "p50_p90_max_us": spread}),
        );
        if let Engine::Opj(_) = e {
            r.at_most(
                "foreground p99 during compaction vs idle p99",
                b / i,
                1.3,
                ratio_text(b / i, "idle"),
                "≤ 1.30×".into(),
            );
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 6. Reopen after kill -9
// ---------------------------------------------------------------------------------------

/// The hidden child: open, run `TAIL` lifecycles (the log tail the reopen replays), leave
/// one operation running, end on a lazily durable acknowledgement, say `ready` with the
/// bytes written and the syncs of the index file since the open, wait to be killed.
fn crash_child(args: &[String]) -> Result<()> {
    let [engine, path, tail] = args else {
        return Err("usage: bench __crash-child ENGINE PATH TAIL".into());
    };
    let path = PathBuf::from(path);
    let tail: usize = tail.parse()?;
    let ctx = Ctx::new()?;
    let engine = Engine::from_key(engine).ok_or_else(|| format!("unknown engine `{engine}`"))?;
    let opened = Opened::open(engine, &path)?;
    let (written, index) = (written_bytes(), syncs::of(&path));
    let mut conn = opened.conn()?;
    let mut rev = 0;
    for i in 0..tail {
        conn.lifecycle(&ctx, &format!("crash-{i}"), "crash", "crash", &mut rev)?;
    }
    // One operation left running (InDoubt after the reopen) ...
    let running = |scope: &str| SqlOp {
        id: "crash-running".into(),
        intent_name: INTENT_NAME.into(),
        intent_hash: ctx.hash,
        scope: Some(scope.into()),
        base_rev: None,
        session: None,
    };
    match &mut conn {
        Conn::Opj(j) => {
            let op = Operation::new("crash-running", ctx.intent.clone()).scope("crash/run");
            let _ = j.submit(op)?;
        }
        Conn::Sql(db) => {
            let _ = db.submit(running("crash/run"))?;
        }
        Conn::SqlMut(db) => {
            let _ = db.submit(running("crash/run"))?;
        }
    }
    // ... and a last lifecycle, so the last write is a lazily durable acknowledgement.
    let mut rev2 = 0;
    conn.lifecycle(&ctx, "crash-last", "crash/last", "crash", &mut rev2)?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "ready {} {}",
        written_bytes() - written,
        syncs::of(&path).since(index).count
    )?;
    out.flush()?;
    drop(out);
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}

/// The timed part of a reopen after kill -9: opening the journal at `path` (a killed
/// `__crash-child`'s) and the first lookup, a `submit` of `last` (the last operation the
/// child completed), which must answer a replay. Returns the seconds and the journal.
fn open_and_replay(cfg: OpjCfg, path: &Path, last: &str, ctx: &Ctx) -> Result<(f64, Journal)> {
    let start = Instant::now();
    let j = cfg.builder().open(path)?;
    let op = Operation::new(last, ctx.intent.clone())
        .scope("crash")
        .session("crash");
    let a = j.submit(op)?;
    let secs = start.elapsed().as_secs_f64();
    if !matches!(a, Admission::Replay(_)) {
        return Err(format!("after the crash, `{last}` is {}", a.name()).into());
    }
    Ok((secs, j))
}

/// One reopen after kill -9: (seconds to open and answer the first lookup, bytes the
/// child wrote after opening, syncs of the index file in the child after opening, the
/// length of SQLite's WAL at the kill).
fn reopen_once(
    engine: Engine,
    dir: &Path,
    base: &Base,
    tail: usize,
) -> Result<(f64, u64, u64, u64)> {
    let path = journal_path(engine, dir, "reopen");
    remove_journal(&path);
    match engine {
        Engine::Opj(_) => copy_synced(&base.opj, &path)?,
        Engine::Sqlite(_) => copy_synced(&base.sql, &path)?,
    }
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .arg("__crash-child")
        .arg(engine.key())
        .arg(&path)
        .arg(tail.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        BufReader::new(out).read_line(&mut line)?;
    }
    // SIGKILL on Unix.
    child.kill()?;
    let status = child.wait()?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let (written, index_syncs) = match words[..] {
        ["ready", w, s] => (w.parse::<u64>()?, s.parse::<u64>()?),
        _ => return Err(format!("the crash child did not get ready ({status})").into()),
    };
    let wal_len = file_len(&sqlite_files(&path)[1]);
    match engine {
        Engine::Opj(_) => evict_for_cold_run(opj_files(&path))?,
        Engine::Sqlite(_) => evict_for_cold_run(sqlite_files(&path))?,
    }
    // The same for both engines: open, then the first lookup, a replay of the last
    // operation completed before the kill (in the log tail), through the same call a
    // client's retry makes (`submit`). Checked afterwards, untimed.
    let ctx = Ctx::new()?;
    // The id its lifecycle gave it (see `op_id`).
    let last = op_id(&format!("crash-{}", tail.saturating_sub(1)));
    let secs = match engine {
        Engine::Opj(cfg) => {
            let (secs, j) = open_and_replay(cfg, &path, &last, &ctx)?;
            let running = j.lookup("crash-running")?.map(|r| r.status);
            if running != Some(ExecutionStatus::InDoubt) {
                return Err(format!(
                    "after the crash, `crash-running` is {running:?}, not in doubt"
                )
                .into());
            }
            secs
        }
        Engine::Sqlite(cfg) => {
            let start = Instant::now();
            let store = SqlStore::open(&path, cfg.cfg)?;
            // The connection lives past the clock: closing the last one checkpoints the
            // WAL into the database file and syncs it, which is closing, not reopening
            // (until 2026-12-06 the mutex arrangement's time included it, 6-8 ms).
            let conn = store.connect()?;
            let a = conn.lookup_replay(&last, &ctx.hash)?;
            let secs = start.elapsed().as_secs_f64();
            drop(conn);
            if !matches!(a, SqlAdmission::Replay(_)) {
                return Err(format!("after the crash, sqlite `{last}` is {a:?}").into());
            }
            secs
        }
    };
    remove_journal(&path);
    Ok((secs, written, index_syncs, wal_len))
}

fn section_reopen(p: &Params, dir: &Path, base: &Base, r: &mut Report) -> Result<()> {
    let engines: Vec<Engine> = OPJ_VARIANTS
        .into_iter()
        .map(Engine::Opj)
        .chain(SQL_REOPEN_VARIANTS.map(Engine::Sqlite))
        .collect();
    let tail = p.reopen_tail;
    let mut times: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
    let mut tails: BTreeMap<&'static str, (u64, u64, u64)> = BTreeMap::new();
    for rep in 0..p.reopen_reps {
        progress(&format!(
            "reopen after kill -9 with {} receipts and a tail of {tail} lifecycles: repetition {}/{}",
            base.n,
            rep + 1,
            p.reopen_reps
        ));
        for k in 0..engines.len() {
            let e = engines[(k + rep) % engines.len()];
            let (secs, written, index_syncs, wal_len) = reopen_once(e, dir, base, tail)?;
            times.entry(e.key()).or_default().push(secs);
            tails.insert(e.key(), (written, index_syncs, wal_len));
        }
    }
    // The ratios are against the SQLite arrangement that reopened fastest.
    let (sql, sql_best) = SQL_REOPEN_VARIANTS
        .iter()
        .map(|c| (times.get(c.key).map_or(f64::INFINITY, |v| median(v)), c))
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .ok_or("no SQLite arrangement")?;
    for e in &engines {
        let v = times.get(e.key()).map_or(0.0, |v| median(v));
        let (written, index_syncs, wal_len) = tails.get(e.key()).copied().unwrap_or_default();
        let tail_text = match e {
            Engine::Opj(_) if index_syncs == 0 => format!(
                "the log tail replayed: {tail} lifecycles, about {} records (one per durable commit), no checkpoint since the open",
                2 * tail
            ),
            Engine::Opj(_) => format!(
                "{tail} lifecycles; the redb file was synced {index_syncs} times after the open (`opjournal verify` of the killed child's journal names the records of the log's current cycle: a checkpoint would have left fewer than {})",
                2 * tail
            ),
            Engine::Sqlite(_) => format!(
                "{tail} lifecycles, WAL of {:.1} MiB recovered (the database file was synced {index_syncs} times after the open: WAL checkpoints)",
                wal_len as f64 / f64::from(1u32 << 20)
            ),
        };
        r.figure_vs(
            format!("reopen_after_kill_{}", section_key(*e)),
            format!(
                "reopen after kill -9, {} receipts + a tail of {tail} lifecycles, open + first lookup: {}",
                base.n,
                e.label()
            ),
            v * 1e3,
            "ms",
            match e {
                Engine::Opj(_) => format!(
                    "{} ({}); {tail_text}",
                    ratio_text(v / sql, "the best SQLite's time"),
                    sql_best.short_label
                ),
                Engine::Sqlite(_) => format!("WAL recovery included; {tail_text}"),
            },
            json!({"samples_s": times.get(e.key()), "tail_lifecycles": tail,
                   "tail_written_bytes": written, "index_file_syncs_in_tail": index_syncs,
                   "wal_bytes_at_kill": wal_len}),
        );
        if let Engine::Opj(cfg) = e {
            r.at_most(
                format!(
                    "reopen after kill -9 with {} receipts [{}]",
                    base.n,
                    cfg.key()
                ),
                v * 1e3,
                5.0,
                format!("{:.1} ms", v * 1e3),
                "≤ 5 ms".into(),
            );
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 8. Memory over a long session
// ---------------------------------------------------------------------------------------

/// One session of the memory section, in a child process of its own.
struct MemoryMode {
    /// The figure's key.
    key: &'static str,
    /// What `bench __memory` drives.
    target: &'static str,
    /// An environment variable for the child, if any.
    env: Option<(&'static str, &'static str)>,
    label: &'static str,
}

/// The sessions: the workload alone (what the journal's share is taken against), then the
/// journals.
const MEMORY_MODES: [MemoryMode; 6] = [
    MemoryMode {
        key: "workload",
        target: "workload",
        env: None,
        label: "the workload alone: the same threads building the same operations and results, no journal",
    },
    MemoryMode {
        key: "opj-default",
        target: "opj-default",
        env: None,
        label: "opjournal, default settings (its page cache and checkpoint size as the library ships them)",
    },
    MemoryMode {
        key: "opj-default-arena1",
        target: "opj-default",
        env: Some(("MALLOC_ARENA_MAX", "1")),
        label: "opjournal, default settings, glibc malloc with one arena (MALLOC_ARENA_MAX=1): the allocator's share",
    },
    MemoryMode {
        key: "opj-cache1g",
        target: "opj-cache1g",
        env: None,
        label: "opjournal, cache_size(1 GiB) (redb's own default, opjournal's before 2026-12-03)",
    },
    MemoryMode {
        key: "sqlite-writer",
        target: "sqlite-writer",
        env: None,
        label: "SQLite dedicated writer, the bench's tuned cache (1 GiB page cache + 1 GiB mmap)",
    },
    MemoryMode {
        key: "sqlite-writer-lean",
        target: "sqlite-writer-lean",
        env: None,
        label: "SQLite dedicated writer, SQLite's own cache defaults (2 MiB page cache per connection, no mmap): SQLite as lean as it ships",
    },
];
/// Threads driving a memory session (each its own scope and session).
const MEMORY_THREADS: usize = 8;
/// RSS samples per session.
const MEMORY_SAMPLES: usize = 20;

/// Resident memory of this process from /proc/self/status, in bytes.
#[derive(Clone, Copy, Debug, Default)]
struct Rss {
    rss: u64,
    anon: u64,
    file: u64,
    hwm: u64,
}

impl Rss {
    fn now() -> Rss {
        let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .unwrap_or(0)
                * 1024
        };
        Rss {
            rss: field("VmRSS:"),
            anon: field("RssAnon:"),
            file: field("RssFile:") + field("RssShmem:"),
            hwm: field("VmHWM:"),
        }
    }

    fn json(&self, ops: u64) -> Value {
        json!({"ops": ops, "rss": self.rss, "anon": self.anon, "file": self.file, "hwm": self.hwm})
    }
}

/// `bench __memory MODE PATH OPS`: drives one journal (or none, for `workload`) with OPS
/// lifecycles on [`MEMORY_THREADS`] threads and prints JSON lines: an RSS sample every
/// OPS / [`MEMORY_SAMPLES`] lifecycles, then a final line with the journal's figures.
fn memory_child(args: &[String]) -> Result<()> {
    let [mode, path, ops] = args else {
        return Err("usage: bench __memory MODE PATH OPS".into());
    };
    let path = PathBuf::from(path);
    let ops: u64 = ops.parse()?;
    let ctx = Ctx::new()?;
    enum Target {
        Workload,
        Opj(Journal),
        Sql(SqlStore),
    }
    let target = match mode.as_str() {
        "workload" => Target::Workload,
        "opj-default" => Target::Opj(DEFAULT_CFG.builder().open(&path)?),
        "opj-cache1g" => Target::Opj(DEFAULT_CFG.builder().cache_size(1 << 30).open(&path)?),
        "sqlite-writer" => Target::Sql(SqlStore::open(&path, SQL_WRITER.cfg)?),
        "sqlite-writer-lean" => Target::Sql(SqlStore::open(
            &path,
            SqlConfig {
                cache: Cache::Default,
                ..SQL_WRITER.cfg
            },
        )?),
        other => return Err(format!("unknown memory mode `{other}`").into()),
    };
    let done = std::sync::atomic::AtomicU64::new(0);
    let failed = AtomicBool::new(false);
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", Rss::now().json(0))?;
    let per_thread = ops / MEMORY_THREADS as u64;
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..MEMORY_THREADS)
            .map(|t| {
                let (target, ctx, done, failed) = (&target, &ctx, &done, &failed);
                s.spawn(move || -> Result<()> {
                    let (scope, session) = (scope_of(t), session_of(t));
                    let mut rev = 0;
                    let mut conn = match target {
                        Target::Workload => None,
                        Target::Opj(j) => Some(Conn::Opj(j)),
                        Target::Sql(store) => Some(Conn::Sql(store.connect()?)),
                    };
                    for i in 0..per_thread {
                        let id = format!("mem-{t}-{i}");
                        match conn.as_mut() {
                            Some(c) => {
                                let r = c.lifecycle(ctx, &id, &scope, &session, &mut rev);
                                if r.is_err() {
                                    failed.store(true, Ordering::SeqCst);
                                }
                                r?;
                            }
                            None => {
                                // What the caller builds for a lifecycle, then drops.
                                let op = Operation::new(op_id(&id), ctx.intent.clone())
                                    .scope(scope.as_str())
                                    .base_revision(rev)
                                    .session(session.as_str());
                                rev += 1;
                                let outcome = Outcome::applied(rev, ctx.payload.clone());
                                drop(std::hint::black_box((op, outcome)));
                            }
                        }
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(())
                })
            })
            .collect();
        // Sample RSS as the session passes each mark.
        let total = per_thread * MEMORY_THREADS as u64;
        let mut next = 1;
        while next <= MEMORY_SAMPLES as u64 && !failed.load(Ordering::SeqCst) {
            let n = done.load(Ordering::Relaxed);
            if n >= total * next / MEMORY_SAMPLES as u64 {
                let _ = writeln!(out, "{}", Rss::now().json(n));
                next += 1;
            } else if handles.iter().all(|h| h.is_finished()) {
                break;
            } else {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a memory session thread panicked".into()))
            })
            .collect()
    });
    for r in results {
        r?;
    }
    let end = Rss::now();
    // After the last sample: `stats` reads every receipt.
    let (cache, file) = match &target {
        Target::Workload => (0, 0),
        Target::Opj(j) => {
            let s = j.stats()?;
            (s.replay_cache.bytes, s.file_bytes)
        }
        Target::Sql(_) => (0, file_len(&path) + file_len(&sqlite_files(&path)[1])),
    };
    writeln!(
        out,
        "{}",
        json!({"final": true, "ops": done.load(Ordering::Relaxed), "rss": end.rss,
               "anon": end.anon, "file": end.file, "hwm": end.hwm,
               "replay_cache_bytes": cache, "file_bytes": file})
    )?;
    out.flush()?;
    drop(target);
    Ok(())
}

fn section_memory(p: &Params, dir: &Path, r: &mut Report) -> Result<()> {
    let ops = p.memory_ops;
    let mut sessions: Vec<(&str, &str, Vec<Value>, Value)> = Vec::new();
    for m in MEMORY_MODES {
        let (mode, label) = (m.key, m.label);
        progress(&format!(
            "memory: {ops} lifecycles on {MEMORY_THREADS} threads, {label}"
        ));
        let path = dir.join(format!(
            "memory-{mode}.{}",
            if mode.starts_with("sqlite") {
                "sqlite"
            } else {
                "opj"
            }
        ));
        remove_journal(&path);
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.arg("__memory")
            .arg(m.target)
            .arg(&path)
            .arg(ops.to_string())
            .stdin(Stdio::null())
            .stderr(Stdio::inherit());
        if let Some((k, v)) = m.env {
            cmd.env(k, v);
        }
        let out = cmd.output()?;
        remove_journal(&path);
        if !out.status.success() {
            return Err(format!("memory child `{mode}` failed: {}", out.status).into());
        }
        let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(serde_json::from_str)
            .collect::<std::result::Result<_, _>>()?;
        let (fin, samples): (Vec<Value>, Vec<Value>) =
            lines.into_iter().partition(|v| v.get("final").is_some());
        let fin = fin
            .into_iter()
            .next()
            .ok_or("memory child: no final line")?;
        sessions.push((mode, label, samples, fin));
    }
    let num = |v: &Value, k: &str| v.get(k).and_then(Value::as_f64).unwrap_or(0.0);
    let mib = |b: f64| b / f64::from(1u32 << 20);
    let workload_rss = sessions
        .iter()
        .find(|s| s.0 == "workload")
        .map_or(0.0, |s| num(&s.3, "rss"));
    // The RSS at the sample nearest half the session, for the growth over the second half.
    let half_rss = |samples: &[Value]| -> (f64, f64) {
        samples
            .iter()
            .min_by(|a, b| {
                let d = |v: &Value| (num(v, "ops") - ops as f64 / 2.0).abs();
                d(a).total_cmp(&d(b))
            })
            .map_or((0.0, 0.0), |v| (num(v, "ops"), num(v, "rss")))
    };
    // The SQLite session with the smallest share: the ratios of opjournal's shares are taken
    // against it (a memory figure's best competitor is the leanest one).
    let leanest_sql = sessions
        .iter()
        .filter(|s| s.0.starts_with("sqlite"))
        .map(|s| (s.0, num(&s.3, "rss") - workload_rss))
        .min_by(|a, b| a.1.total_cmp(&b.1));
    let mut default_share = None;
    for (mode, label, samples, fin) in &sessions {
        let (rss, end_ops) = (num(fin, "rss"), num(fin, "ops"));
        let (h_ops, h_rss) = half_rss(samples);
        let growth = if end_ops > h_ops {
            (rss - h_rss) / (end_ops - h_ops)
        } else {
            0.0
        };
        let share = rss - workload_rss;
        let vs = if *mode == "workload" {
            format!(
                "peak {:.1} MiB; what the journals' shares are taken against",
                mib(num(fin, "hwm"))
            )
        } else {
            let against = match leanest_sql {
                Some((key, sql)) if mode.starts_with("opj") && sql > 0.0 => format!(
                    "{:.2}× the leanest SQLite's share ({:.1} MiB, {key}); ",
                    share / sql,
                    mib(sql)
                ),
                _ => String::new(),
            };
            format!(
                "{against}journal's share {:.1} MiB (RSS less the workload's {:.1}); peak {:.1} MiB; anonymous {:.1}, file-backed {:.1} MiB; {:+.0} B per lifecycle over the second half; file {:.0} MiB{}",
                mib(share),
                mib(workload_rss),
                mib(num(fin, "hwm")),
                mib(num(fin, "anon")),
                mib(num(fin, "file")),
                growth,
                mib(num(fin, "file_bytes")),
                if mode.starts_with("opj") {
                    format!(
                        "; replay cache {:.2} MiB",
                        mib(num(fin, "replay_cache_bytes"))
                    )
                } else {
                    String::new()
                }
            )
        };
        if *mode == "opj-default" {
            default_share = Some(share);
        }
        r.figure_vs(
            format!("memory_rss_{mode}"),
            format!(
                "RSS after {} lifecycles ({MEMORY_THREADS} threads): {label}",
                fmt_num(end_ops)
            ),
            mib(rss),
            "MiB",
            vs,
            json!({"samples": samples, "final": fin, "share_bytes": share,
                   "growth_per_op_second_half_bytes": growth}),
        );
    }
    if let Some(share) = default_share {
        r.at_most(
            "the journal's RSS over a long session, default settings",
            mib(share),
            64.0,
            format!(
                "{:.1} MiB after {} lifecycles{}",
                mib(share),
                fmt_num(ops as f64),
                leanest_sql.map_or_else(String::new, |(key, sql)| format!(
                    " (the leanest SQLite's, {key}: {:.1} MiB)",
                    mib(sql)
                ))
            ),
            "≤ 64 MiB (tens of MiB)".into(),
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// main
// ---------------------------------------------------------------------------------------

/// Hot loops for a profiler, on journals kept by `--keep`:
///
/// ```text
/// bench __profile replay PATH N LOOKUPS                     submit() of known ids (Replay)
/// bench __profile replay-sqlite PATH N LOOKUPS [VARIANT]     the same on SQLite
/// bench __profile compact PATH N                            compact() with every operation expired (on a copy)
/// bench __profile lifecycle CFG PATH OPS                    OPS lifecycles on one thread, fresh journal
/// bench __profile lifecycle-on CFG PATH OPS                 the same on a copy of PATH
/// bench __profile lifecycle-sqlite PATH OPS [VARIANT]       the same on SQLite, fresh journal
/// bench __profile reopen CFG PATH REPS [TAIL]               kill -9 a writer of a copy of PATH after TAIL lifecycles, reopen it
/// ```
///
/// VARIANT is a SQLite arrangement's key (`sqlite-group-ackq`, ...), by default
/// `sqlite-mutex-ackq`.
/// What a profiling loop prints when it ends: lifecycles per second since `start`, and
/// syncs per lifecycle since the sync count was `syncs`.
fn report_rate(lifecycles: usize, start: Instant, syncs: u64) {
    eprintln!(
        "{:.0} lifecycles/s, {:.3} syncs per lifecycle",
        lifecycles as f64 / start.elapsed().as_secs_f64(),
        (syncs::total() - syncs) as f64 / lifecycles as f64
    );
}

/// The syncs of each file since `before` (a reading of [`syncs::all`]), per lifecycle and
/// with their mean time: which of a journal's files (log, second log, index) took them.
fn report_syncs_by_file(lifecycles: usize, before: &BTreeMap<PathBuf, syncs::Tally>) {
    for (path, now) in syncs::all() {
        let t = now.since(before.get(&path).copied().unwrap_or_default());
        if t.count == 0 {
            continue;
        }
        eprintln!(
            "  {}: {:.3} syncs per lifecycle, {:.3} ms each",
            path.file_name().map_or_else(
                || path.display().to_string(),
                |n| n.to_string_lossy().into_owned()
            ),
            t.count as f64 / lifecycles.max(1) as f64,
            t.time.as_secs_f64() * 1e3 / t.count as f64
        );
    }
}

fn profile(args: &[String]) -> Result<()> {
    let ctx = Ctx::new()?;
    let num = |i: usize| -> Result<usize> {
        Ok(args
            .get(i)
            .ok_or("missing a number argument")?
            .parse::<usize>()?)
    };
    let sql_cfg = |i: usize| -> Result<SqlConfig> {
        match args.get(i).map(|k| Engine::from_key(k)) {
            None => Ok(SQL_STANDARD.cfg),
            Some(Some(Engine::Sqlite(c))) => Ok(c.cfg),
            Some(_) => Err(format!("unknown SQLite variant `{}`", args[i]).into()),
        }
    };
    match args.first().map(String::as_str) {
        // The open and first lookup of a journal a killed child left (`reopen` kills a
        // fresh one each time; this one reuses KILLED, copied N times, for `perf`).
        Some("reopen-copy") => {
            let killed = PathBuf::from(args.get(1).ok_or("missing KILLED")?);
            let dir = killed.parent().ok_or("KILLED has no directory")?;
            let path = dir.join("reopen-copy.opj");
            let last = op_id(&format!("crash-{}", num(3)?.saturating_sub(1)));
            let mut times = Vec::new();
            for _ in 0..num(2)? {
                remove_journal(&path);
                copy_synced(&killed, &path)?;
                for (from, to) in opjournal::FileLog::paths_for(&killed)
                    .into_iter()
                    .zip(opjournal::FileLog::paths_for(&path))
                {
                    copy_synced(&from, &to)?;
                }
                evict_for_cold_run(opj_files(&path))?;
                times.push(open_and_replay(DEFAULT_CFG, &path, &last, &ctx)?.0);
            }
            remove_journal(&path);
            times.sort_by(f64::total_cmp);
            let ms = |t: Option<&f64>| t.map_or(0.0, |t| t * 1e3);
            eprintln!(
                "{:.2} ms median reopen ({:.2}-{:.2})",
                median(&times) * 1e3,
                ms(times.first()),
                ms(times.last())
            );
        }
        Some("reopen") => {
            let engine = Engine::from_key(args.get(1).ok_or("missing CFG")?)
                .ok_or("unknown configuration")?;
            let path = PathBuf::from(args.get(2).ok_or("missing PATH")?);
            let dir = path.parent().ok_or("PATH has no directory")?;
            let base = Base {
                opj: path.clone(),
                sql: path.clone(),
                n: 0,
            };
            let mut times: Vec<f64> = (0..num(3)?)
                .map(|_| reopen_once(engine, dir, &base, num(4).unwrap_or(1_000)).map(|t| t.0))
                .collect::<Result<_>>()?;
            times.sort_by(f64::total_cmp);
            eprintln!("{:.2} ms median reopen", median(&times) * 1e3);
        }
        Some("replay") => {
            let path = PathBuf::from(args.get(1).ok_or("missing PATH")?);
            let (n, lookups) = (num(2)?, num(3)?);
            // An optional fourth argument sets the page cache in MiB.
            let mut b = DEFAULT_CFG.builder();
            if args.get(4).is_some() {
                b = b.cache_size(num(4)? << 20);
            }
            let j = b.open(&path)?;
            let mut rng = Rng::new(7);
            let ops: Vec<Operation> = (0..lookups)
                .map(|_| Operation::new(base_id(rng.below(n as u64) as usize), ctx.intent.clone()))
                .collect();
            let start = Instant::now();
            for op in ops {
                if !matches!(j.submit(op)?, Admission::Replay(_)) {
                    return Err("expected a replay".into());
                }
            }
            eprintln!(
                "{:.2} µs per lookup",
                start.elapsed().as_secs_f64() * 1e6 / lookups as f64
            );
        }
        Some("replay-sqlite") => {
            let path = PathBuf::from(args.get(1).ok_or("missing PATH")?);
            let (n, lookups) = (num(2)?, num(3)?);
            let db = SqlStore::open(&path, sql_cfg(4)?)?.connect()?;
            let mut rng = Rng::new(7);
            let ids: Vec<String> = (0..lookups)
                .map(|_| base_id(rng.below(n as u64) as usize))
                .collect();
            let start = Instant::now();
            for id in &ids {
                if !matches!(db.lookup_replay(id, &ctx.hash)?, SqlAdmission::Replay(_)) {
                    return Err("expected a replay".into());
                }
            }
            eprintln!(
                "{:.2} µs per lookup",
                start.elapsed().as_secs_f64() * 1e6 / lookups as f64
            );
        }
        Some("compact") => {
            let path = PathBuf::from(args.get(1).ok_or("missing PATH")?);
            let copy = path.with_extension("profile.opj");
            copy_synced(&path, &copy)?;
            let scan = match std::env::var("OPJ_COMPACT_SCAN").as_deref() {
                Ok("on") => Some(true),
                Ok("off") => Some(false),
                _ => None,
            };
            let j = DEFAULT_CFG
                .builder()
                .clock(expired_clock())
                .compaction_scan(scan)
                .open(&copy)?;
            let start = Instant::now();
            let report = j.compact()?;
            eprintln!("compact() took {:.3} s", start.elapsed().as_secs_f64());
            eprintln!("{}", serde_json::to_string(&report)?);
            drop(j);
            remove_one(&copy);
        }
        Some("lifecycle-on") => {
            let cfg = OpjCfg::from_key(args.get(1).ok_or("missing CFG")?).ok_or("unknown CFG")?;
            let path = PathBuf::from(args.get(2).ok_or("missing PATH")?);
            let ops = num(3)?;
            let copy = path.with_extension("profile.opj");
            copy_synced(&path, &copy)?;
            let j = cfg.builder().open(&copy)?;
            let mut conn = Conn::Opj(&j);
            let mut rev = 0;
            let (start, syncs) = (Instant::now(), syncs::total());
            for i in 0..ops {
                conn.lifecycle(&ctx, &format!("p-{i}"), "p", "p", &mut rev)?;
            }
            report_rate(ops, start, syncs);
            drop(j);
            remove_one(&copy);
        }
        Some("lifecycle-sqlite") => {
            let path = PathBuf::from(args.get(1).ok_or("missing PATH")?);
            let ops = num(2)?;
            remove_journal(&path);
            let store = SqlStore::open(&path, sql_cfg(3)?)?;
            let mut conn = Conn::Sql(store.connect()?);
            let mut rev = 0;
            let (start, syncs) = (Instant::now(), syncs::total());
            for i in 0..ops {
                conn.lifecycle(&ctx, &format!("p-{i}"), "p", "p", &mut rev)?;
            }
            report_rate(ops, start, syncs);
            drop((conn, store));
            remove_journal(&path);
        }
        Some("lifecycle-mt") => {
            // The sweep's loop without the interleaving: THREADS threads on one journal,
            // each with its own scope and session, for profiling the commit path under
            // concurrency (`perf record -g`).
            let cfg = OpjCfg::from_key(args.get(1).ok_or("missing CFG")?).ok_or("unknown CFG")?;
            let path = PathBuf::from(args.get(2).ok_or("missing PATH")?);
            let (ops, threads) = (num(3)?, num(4)?.max(1));
            remove_one(&path);
            let j = cfg.builder().open(&path)?;
            let by_file = syncs::all();
            let (start, syncs) = (Instant::now(), syncs::total());
            std::thread::scope(|s| -> Result<()> {
                let handles: Vec<_> = (0..threads)
                    .map(|t| {
                        let (j, ctx) = (&j, &ctx);
                        s.spawn(move || -> Result<()> {
                            let mut conn = Conn::Opj(j);
                            let (scope, session) = (format!("s{t}"), format!("c{t}"));
                            let mut rev = 0;
                            for i in 0..ops / threads {
                                conn.lifecycle(
                                    ctx,
                                    &format!("p-{t}-{i}"),
                                    &scope,
                                    &session,
                                    &mut rev,
                                )?;
                            }
                            Ok(())
                        })
                    })
                    .collect();
                for h in handles {
                    h.join().map_err(|_| "a lifecycle thread panicked")??;
                }
                Ok(())
            })?;
            let done = ops / threads * threads;
            report_rate(done, start, syncs);
            report_syncs_by_file(done, &by_file);
            drop(j);
            remove_one(&path);
        }
        Some("lifecycle-ab") => {
            // The sweep's interleaved slices at one thread count, for as long as asked and
            // for the engines named only: a long A/B of two configurations in one run
            // (`KEY@BYTES` is opjournal's KEY with that checkpoint size, `KEY@BYTES/BYTES`
            // with that page cache bound too), e.g. `lifecycle-ab 8 100 100 DIR
            // opj-live-qr@4194304 opj-live-qr@16777216/8388608 sqlite-writer-bgckpt`.
            let (threads, slices, per_thread) = (num(1)?.max(1), num(2)?.max(1), num(3)?);
            let dir = PathBuf::from(args.get(4).ok_or("missing DIR")?);
            let specs = &args[args.len().min(5)..];
            if specs.is_empty() {
                return Err("lifecycle-ab: name at least one engine after DIR".into());
            }
            let mut journals = Vec::new();
            for (i, spec) in specs.iter().enumerate() {
                let (key, sizes) = match spec.split_once('@') {
                    Some((k, n)) => (k, Some(n)),
                    None => (spec.as_str(), None),
                };
                let engine = match (Engine::from_key(key), sizes) {
                    (Some(Engine::Opj(c)), None) => Engine::Opj(c),
                    (Some(Engine::Opj(c)), Some(n)) => {
                        let (checkpoint, cache) = match n.split_once('/') {
                            Some((a, b)) => (a.parse::<u64>()?, Some(b.parse::<usize>()?)),
                            None => (n.parse::<u64>()?, None),
                        };
                        Engine::Opj(OpjCfg {
                            checkpoint_size: Some(checkpoint),
                            cache_size: cache,
                            ..c
                        })
                    }
                    (Some(e @ Engine::Sqlite(_)), None) => e,
                    _ => return Err(format!("unknown engine `{spec}`").into()),
                };
                let sub = dir.join(format!("e{i}"));
                fs::create_dir_all(&sub)?;
                journals.push(LcJournal::create(engine, threads, &sub)?);
            }
            let mut points: Vec<LcResult> = vec![LcResult::default(); journals.len()];
            for slice in 0..slices {
                interleaved_slices(&mut journals, slice, per_thread, &ctx, |i, point| {
                    points[i].add(point)
                })?;
            }
            for ((spec, lc), m) in specs.iter().zip(journals).zip(&points) {
                lc.check()?;
                let pc = percentiles(&m.latencies);
                let rates = {
                    let mut v = m.samples.clone();
                    v.sort_by(f64::total_cmp);
                    v
                };
                eprintln!(
                    "{spec}: median {:.0} lifecycles/s (quartiles {:.0}-{:.0}), p50 {:.2} ms, \
                     p99 {:.2} ms, max {:.2} ms; {} lifecycles, {:.3} syncs each",
                    median(&m.samples),
                    rates[rates.len() / 4],
                    rates[rates.len() * 3 / 4],
                    pc.p50 / 1e3,
                    pc.p99 / 1e3,
                    pc.max / 1e3,
                    lc.lifecycles,
                    lc.syncs().count as f64 / lc.lifecycles.max(1) as f64,
                );
                lc.remove();
            }
        }
        Some("lifecycle") => {
            let cfg = OpjCfg::from_key(args.get(1).ok_or("missing CFG")?).ok_or("unknown CFG")?;
            let path = PathBuf::from(args.get(2).ok_or("missing PATH")?);
            let ops = num(3)?;
            remove_one(&path);
            let j = cfg.builder().open(&path)?;
            let mut conn = Conn::Opj(&j);
            let mut rev = 0;
            let (start, syncs) = (Instant::now(), syncs::total());
            for i in 0..ops {
                conn.lifecycle(&ctx, &format!("p-{i}"), "p", "p", &mut rev)?;
            }
            report_rate(ops, start, syncs);
            drop(j);
            remove_one(&path);
        }
        _ => {
            return Err(
                "usage: bench __profile replay|replay-sqlite|compact|lifecycle|lifecycle-on|\
                 lifecycle-mt|lifecycle-ab|lifecycle-sqlite|reopen ..."
                    .into(),
            );
        }
    }
    Ok(())
}

fn run(args: Args) -> Result<()> {
    let started = Instant::now();
    let p = &args.params;
    let want = |s: &str| args.only.is_empty() || args.only.iter().any(|o| o == s);
    let data = args.out.join("data");
    fs::create_dir_all(&data)?;
    let mut r = Report::default();
    r.env.push((
        "mode".into(),
        format!(
            "{} run, {} repetitions ({} of the reopen), medians reported",
            if p.quick { "quick" } else { "full" },
            p.reps,
            p.reopen_reps
        ),
    ));
    match filesystem_of(&data) {
        Some((mnt, ty, dev)) => {
            if ty == "tmpfs" || ty == "ramfs" {
                r.notes.push(format!(
                    "{} is on {ty}: sync figures do not reflect a disk; use --out on a real disk",
                    data.display()
                ));
            }
            r.env.push((
                "data dir".into(),
                format!("{} ({ty} on {dev}, mounted at {mnt})", data.display()),
            ));
        }
        None => r.env.push(("data dir".into(), data.display().to_string())),
    }
    r.env.push((
        "machine".into(),
        format!(
            "{} cpus, {} {}",
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            std::env::consts::OS,
            std::env::consts::ARCH
        ),
    ));
    r.env.push((
        "versions".into(),
        format!("sqlite {}, redb 4.6.0", rusqlite::version()),
    ));
    r.env
        .push(("sqlite sync call".into(), sqlite_sync_call().into()));
    if !sqlite_fdatasync() {
        r.notes.push(
            "SQLite was built syncing with fsync(), which also flushes the file's times: \
             run cargo from tools/ so that tools/.cargo/config.toml builds it with fdatasync()"
                .into(),
        );
    }
    r.env.push(("opjournal source".into(), library_revision()));
    r.env.push((
        "opjournal settings".into(),
        format!(
            "defaults except: checkpoint_size {}, cache_size {}",
            checkpoint_size_override().map_or("default".into(), |n| format!(
                "{n} B (OPJ_BENCH_CHECKPOINT_SIZE)"
            )),
            cache_size_override().map_or("default".into(), |n| format!(
                "{n} B (OPJ_BENCH_CACHE_SIZE)"
            )),
        ),
    ));
    r.env.push((
        "operation ids".into(),
        if sequential_ids() {
            "sequential names, nearly in key order (OPJ_BENCH_SEQUENTIAL_IDS)".into()
        } else {
            "random: a 64-bit hash of each name in hex, as agents' ids are".into()
        },
    ));
    r.env.push(("load average at start".into(), load_average()));
    let ctx = Ctx::new()?;

    settle_disk();
    let mut disk = DiskRate::default();
    if want("raw") || want("lifecycle") || want("sustained") {
        section_raw(p, &data, &mut disk, &mut r)?;
    }
    if want("lifecycle") {
        section_lifecycle(p, &data, &ctx, &mut disk, &mut r)?;
    }
    if want("sustained") {
        section_sustained(p, &data, &ctx, &mut r)?;
    }
    if want("memory") {
        section_memory(p, &data, &mut r)?;
    }
    let needs_base = ["replay", "size", "compaction", "foreground", "reopen"]
        .iter()
        .any(|s| want(s));
    if needs_base {
        let (base, open_sizes) = build_base(p, &data, &ctx, &mut r)?;
        settle_disk();
        if want("size") {
            section_size(&data, &base, &open_sizes, &mut r)?;
            section_export_memory(&base, &mut r)?;
        }
        if want("replay") {
            section_replay(p, &base, &ctx, &mut r)?;
        }
        if want("compaction") {
            section_compaction(p, &data, &base, &mut r)?;
        }
        if want("foreground") {
            section_foreground(p, &data, &base, &ctx, &mut r)?;
        }
        if want("reopen") {
            section_reopen(p, &data, &base, &mut r)?;
        }
        if args.keep {
            r.notes.push(format!(
                "base journals kept: {} and {}",
                base.opj.display(),
                base.sql.display()
            ));
        } else {
            remove_one(&base.opj);
            remove_all(&sqlite_files(&base.sql));
        }
    }
    r.env.push(("load average at end".into(), load_average()));
    let elapsed = started.elapsed();
    r.env
        .push(("elapsed".into(), format!("{:.1} s", elapsed.as_secs_f64())));
    let text = r.text();
    let jsonl = r.json_lines(elapsed);
    fs::write(args.out.join("bench.txt"), &text)?;
    fs::write(args.out.join("bench.jsonl"), &jsonl)?;
    let mut stdout = std::io::stdout().lock();
    if args.json {
        stdout.write_all(jsonl.as_bytes())?;
    } else {
        stdout.write_all(text.as_bytes())?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    // Internal subcommands: hot loops for a profiler, and the child processes of the
    // export-memory and reopen-after-kill sections.
    type Sub = fn(&[String]) -> Result<()>;
    let subs: [(&str, &str, Sub); 4] = [
        ("__profile", "bench profile", profile),
        ("__memory", "bench memory child", memory_child),
        ("__export", "bench export child", export_child),
        ("__crash-child", "bench crash child", crash_child),
    ];
    if let Some(first) = argv.first()
        && let Some((_, what, sub)) = subs.iter().find(|(name, ..)| name == first)
    {
        return match sub(&argv[1..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{what}: {e}");
                ExitCode::from(2)
            }
        };
    }
    let args = match parse_args(&argv) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("bench: {e}");
            return ExitCode::from(2);
        }
    };
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: {e}");
            ExitCode::from(2)
        }
    }
}
