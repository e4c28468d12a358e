//! `pg_bench`: opjournal's PostgreSQL backend against a plain-PostgreSQL idempotency-key
//! implementation on the same server, in the same run (issue 26).
//!
//! ```text
//! cargo run --release -p opjournal-tools --bin pg_bench -- [--quick] [--url URL]
//!     [--seconds S] [--rounds N] [--clients 1,8,32] [--processes 1,3] [--no-tune]
//!     [--statements]
//! ```
//!
//! Without `--url` the bench starts a private server (`opjournal_testkit::pg::PgCluster`:
//! `initdb` in a temporary directory, `fsync=on`), sets what an operator would set for a
//! write-heavy OLTP load ([`TUNING`]; `--no-tune` keeps the defaults) and restarts it.
//! With `--url` it uses that server as it is (and creates its tables in schema
//! `opj_bench` and journals named `pgbench-...`).
//!
//! Both sides, per lifecycle (docs/postgres.md, "Figures"):
//!
//! - **opjournal** (`opj`): `submit` (Fresh) → `complete(applied, 1 KiB)` → `delivered` →
//!   `acknowledge`, on one `Journal` per process (`open_postgres`, its pool and group
//!   committer shared by the process's threads). Submit and complete return after their
//!   batch's transaction committed; delivered and acknowledge are lazily written (they ride
//!   along with the process's next batch), as on a file.
//! - **idempotency keys** (`keys`), Stripe's design as brandur published it ("Implementing
//!   Stripe-like idempotency keys in Postgres"): one table `idempotency_keys`, unique
//!   `(user_id, idempotency_key)`, the request's parameters hash, `locked_at`,
//!   `recovery_point`, response code and body. Phase 1 (claim) is one prepared statement in
//!   its own transaction: `INSERT ... ON CONFLICT DO NOTHING RETURNING`, and in the same
//!   statement the existing row when there was one (its parameters hash compared, a live
//!   lock refused, a finished key answered from its stored response); a stale lock goes
//!   through `SELECT ... FOR UPDATE` and an `UPDATE` in a transaction (brandur's path).
//!   Phase 2 (finish) is one prepared `UPDATE` setting `recovery_point = 'finished'`, the
//!   response and `locked_at = NULL`. Two commits per request, each durable before it
//!   returns, as opjournal's submit and complete. No equivalent of delivered/acknowledged:
//!   Stripe's keys expire by age (a reaper deletes them after 24 hours), which opjournal's
//!   compaction does too; the acknowledgement is extra work on opjournal's side.
//!
//! A configuration is a number of clients spread over a number of processes: the bench
//! spawns itself (`pg_bench __worker ...`) once per process, each process opens its own
//! handle (opjournal) or its own connections (one per client thread), runs `clients /
//! processes` threads for `--seconds`, and reports its count and latencies. The two
//! engines alternate, the first one swapping every round. Replay (a retried id whose
//! result is recorded) is measured the same way, in one process.
//!
//! The physical limit: single-row `INSERT` commits per second on the same server with the
//! same number of connections (each commit waits for its WAL flush; concurrent commits
//! share flushes).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use opjournal::{Admission, Intent, Journal, Operation, Outcome};
use opjournal_testkit::pg::PgCluster;
use opjournal_tools::stats::{Percentiles, median, percentiles};
use postgres::{Client, NoTls, Statement};
use serde_json::{Value, json};

type Error = Box<dyn std::error::Error + Send + Sync>;
type Result<T> = std::result::Result<T, Error>;

/// The result recorded per operation (bench.rs uses the same size).
const PAYLOAD_BYTES: usize = 1024;
const INTENT_NAME: &str = "bench.edit";
/// The schema of the competitor's table (and the commit probe's), so that `--url` touches
/// nothing of the database's own.
const SCHEMA: &str = "opj_bench";
/// How long a claim's lock holds before another request may recover the key (brandur's
/// `IDEMPOTENCY_KEY_LOCK_TIMEOUT`).
const LOCK_TIMEOUT_SECS: u32 = 90;

/// What a competent operator sets for a write-heavy OLTP server with this machine's memory
/// (24 GiB): the same for both engines. Everything else is the default, notably
/// `fsync = on`, `synchronous_commit = on`, `full_page_writes = on`, `commit_delay = 0`.
const TUNING: [(&str, &str); 7] = [
    ("shared_buffers", "1GB"),
    ("effective_cache_size", "8GB"),
    ("wal_buffers", "16MB"),
    // No checkpoint during a run: a checkpoint's full-page writes would land on whichever
    // engine ran then.
    ("max_wal_size", "8GB"),
    ("min_wal_size", "1GB"),
    ("checkpoint_timeout", "15min"),
    ("random_page_cost", "1.1"),
];

/// The settings printed with the figures.
const SHOWN: [&str; 15] = [
    "server_version",
    "fsync",
    "synchronous_commit",
    "wal_sync_method",
    "full_page_writes",
    "commit_delay",
    "shared_buffers",
    "wal_buffers",
    "effective_cache_size",
    "max_wal_size",
    "checkpoint_timeout",
    "random_page_cost",
    "wal_level",
    "max_connections",
    "shared_preload_libraries",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Engine {
    /// opjournal's PostgreSQL backend.
    Opj,
    /// The plain idempotency-key table.
    Keys,
}

impl Engine {
    fn key(self) -> &'static str {
        match self {
            Engine::Opj => "opj",
            Engine::Keys => "keys",
        }
    }

    fn from_key(s: &str) -> Option<Engine> {
        match s {
            "opj" => Some(Engine::Opj),
            "keys" => Some(Engine::Keys),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Fresh lifecycles for the run's duration.
    Lifecycle,
    /// Each thread records `populate` operations, then retries random ones of them.
    Replay,
}

impl Mode {
    fn key(self) -> &'static str {
        match self {
            Mode::Lifecycle => "lifecycle",
            Mode::Replay => "replay",
        }
    }

    fn from_key(s: &str) -> Option<Mode> {
        match s {
            "lifecycle" => Some(Mode::Lifecycle),
            "replay" => Some(Mode::Replay),
            _ => None,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Arguments
// ---------------------------------------------------------------------------------------

struct Args {
    url: Option<String>,
    seconds: f64,
    replay_seconds: f64,
    probe_seconds: f64,
    rounds: usize,
    clients: Vec<usize>,
    processes: Vec<usize>,
    populate: usize,
    tune: bool,
    quick: bool,
    statements: bool,
}

const USAGE: &str = "usage: pg_bench [--quick] [--url URL] [--seconds S] [--rounds N] \
                     [--clients 1,8,32] [--processes 1,3] [--no-tune] [--statements]";

fn parse_list(s: &str) -> Result<Vec<usize>> {
    let v: Vec<usize> = s
        .split(',')
        .map(|x| x.trim().parse::<usize>())
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| format!("`{s}`: {e}"))?;
    if v.is_empty() || v.contains(&0) {
        return Err(format!("`{s}`: a list of positive numbers").into());
    }
    Ok(v)
}

fn parse_args(argv: &[String]) -> Result<Args> {
    let quick = argv.iter().any(|a| a == "--quick");
    let mut args = Args {
        url: None,
        seconds: if quick { 1.0 } else { 5.0 },
        replay_seconds: if quick { 0.5 } else { 3.0 },
        probe_seconds: if quick { 0.5 } else { 3.0 },
        rounds: if quick { 1 } else { 3 },
        clients: vec![1, 8, 32],
        processes: vec![1, 3],
        populate: if quick { 10 } else { 50 },
        tune: true,
        quick,
        statements: false,
    };
    let mut it = argv.iter();
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .ok_or_else(|| format!("{a} needs a value\n{USAGE}"))
        };
        match a.as_str() {
            "--quick" => {}
            "--no-tune" => args.tune = false,
            "--statements" => args.statements = true,
            "--url" => args.url = Some(value()?.clone()),
            "--seconds" => {
                let s: f64 = value()?.parse()?;
                if s.is_nan() || s <= 0.0 {
                    return Err("--seconds must be positive".into());
                }
                args.seconds = s;
                args.replay_seconds = (s * 0.6).max(0.2);
                args.probe_seconds = (s * 0.6).max(0.2);
            }
            "--rounds" => args.rounds = value()?.parse::<usize>()?.max(1),
            "--clients" => args.clients = parse_list(value()?)?,
            "--processes" => args.processes = parse_list(value()?)?,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument `{other}`\n{USAGE}").into()),
        }
    }
    Ok(args)
}

// ---------------------------------------------------------------------------------------
// The work: one lifecycle, one replay, on either engine
// ---------------------------------------------------------------------------------------

fn intent() -> Result<Intent> {
    Ok(Intent::from_bytes(INTENT_NAME, br#"{"change":"bench"}"#)?)
}

fn payload() -> Vec<u8> {
    (0..PAYLOAD_BYTES).map(|i| (i % 251) as u8).collect()
}

/// One client thread's connection to either engine.
enum Conn<'a> {
    Opj {
        journal: &'a Journal,
        intent: Intent,
    },
    Keys(Box<KeysClient>),
}

impl Conn<'_> {
    /// One fresh request from submit to acknowledgement (opjournal) or from claim to the
    /// stored response (keys).
    fn lifecycle(&mut self, id: &str, payload: &[u8]) -> Result<()> {
        match self {
            Conn::Opj { journal, intent } => {
                let admission = journal.submit(Operation::new(id, intent.clone()))?;
                let Admission::Fresh(claim) = admission else {
                    return Err(format!("`{id}`: expected fresh, got {}", admission.name()).into());
                };
                // The effect would run here (nothing, on both sides).
                journal.complete(&claim, Outcome::applied(1, payload.to_vec()))?;
                journal.delivered(id)?;
                journal.acknowledge(id, None)?;
                Ok(())
            }
            Conn::Keys(k) => {
                match k.claim(id)? {
                    Claimed::Fresh => {}
                    other => return Err(format!("`{id}`: expected fresh, got {other:?}").into()),
                }
                k.finish(id, 200, payload)
            }
        }
    }

    /// A retried id whose result is recorded: answers the recorded result.
    fn replay(&mut self, id: &str) -> Result<()> {
        match self {
            Conn::Opj { journal, intent } => {
                match journal.submit(Operation::new(id, intent.clone()))? {
                    Admission::Replay(r) if r.result.bytes.len() == PAYLOAD_BYTES => Ok(()),
                    other => Err(format!("`{id}`: expected a replay, got {}", other.name()).into()),
                }
            }
            Conn::Keys(k) => match k.claim(id)? {
                Claimed::Replay { code: 200, body } if body.len() == PAYLOAD_BYTES => Ok(()),
                other => Err(format!("`{id}`: expected a replay, got {other:?}").into()),
            },
        }
    }
}

/// What the competitor's phase 1 answers.
#[derive(Debug)]
enum Claimed {
    /// The key is new (or its stale lock was taken over): run the effect.
    Fresh,
    /// The key finished: send its stored response again.
    Replay { code: i32, body: Vec<u8> },
    /// Another request holds the key (HTTP 409).
    Locked,
    /// The same key with other parameters (HTTP 422).
    Mismatch,
}

/// The plain idempotency-key implementation: one connection, prepared statements.
struct KeysClient {
    client: Client,
    user_id: i64,
    params_hash: Vec<u8>,
    claim: Statement,
    lock_select: Statement,
    relock: Statement,
    finish: Statement,
}

fn keys_table_sql() -> String {
    format!(
        "CREATE SCHEMA IF NOT EXISTS {SCHEMA};
         CREATE TABLE IF NOT EXISTS {SCHEMA}.idempotency_keys (
             created_at          timestamptz NOT NULL DEFAULT now(),
             user_id             bigint      NOT NULL,
             idempotency_key     text        NOT NULL CHECK (char_length(idempotency_key) <= 100),
             last_run_at         timestamptz NOT NULL DEFAULT now(),
             locked_at           timestamptz DEFAULT now(),
             request_method      text        NOT NULL,
             request_path        text        NOT NULL,
             request_params_hash bytea       NOT NULL,
             response_code       int,
             response_body       bytea,
             recovery_point      text        NOT NULL,
             PRIMARY KEY (user_id, idempotency_key)
         );
         CREATE TABLE IF NOT EXISTS {SCHEMA}.commit_probe (id bigint, v bigint);"
    )
}

impl KeysClient {
    fn connect(url: &str, user_id: i64, params_hash: Vec<u8>) -> Result<KeysClient> {
        let mut client = Client::connect(url, NoTls)?;
        // Phase 1 in one round trip and one transaction: insert the key locked, or (when it
        // exists) return the stored row. The existing row comes from the statement's
        // snapshot; when another transaction inserted it after that snapshot, neither part
        // returns a row and the caller asks again.
        let claim = client.prepare(&format!(
            "WITH ins AS (
                 INSERT INTO {SCHEMA}.idempotency_keys
                     (user_id, idempotency_key, request_method, request_path,
                      request_params_hash, recovery_point, locked_at)
                 VALUES ($1, $2, 'POST', '/v1/edits', $3, 'started', now())
                 ON CONFLICT (user_id, idempotency_key) DO NOTHING
                 RETURNING true AS fresh)
             SELECT true, NULL::bytea, NULL::text, false, NULL::int, NULL::bytea FROM ins
             UNION ALL
             SELECT false, request_params_hash, recovery_point,
                    locked_at IS NOT NULL
                        AND locked_at > now() - make_interval(secs => {LOCK_TIMEOUT_SECS}),
                    response_code, response_body
               FROM {SCHEMA}.idempotency_keys
              WHERE user_id = $1 AND idempotency_key = $2
                AND NOT EXISTS (SELECT 1 FROM ins)"
        ))?;
        let lock_select = client.prepare(&format!(
            "SELECT request_params_hash, recovery_point,
                    locked_at IS NOT NULL
                        AND locked_at > now() - make_interval(secs => {LOCK_TIMEOUT_SECS}),
                    response_code, response_body
               FROM {SCHEMA}.idempotency_keys
              WHERE user_id = $1 AND idempotency_key = $2
              FOR UPDATE"
        ))?;
        let relock = client.prepare(&format!(
            "UPDATE {SCHEMA}.idempotency_keys SET locked_at = now(), last_run_at = now()
              WHERE user_id = $1 AND idempotency_key = $2"
        ))?;
        let finish = client.prepare(&format!(
            "UPDATE {SCHEMA}.idempotency_keys
                SET recovery_point = 'finished', locked_at = NULL, last_run_at = now(),
                    response_code = $3, response_body = $4
              WHERE user_id = $1 AND idempotency_key = $2 AND locked_at IS NOT NULL"
        ))?;
        Ok(KeysClient {
            client,
            user_id,
            params_hash,
            claim,
            lock_select,
            relock,
            finish,
        })
    }

    /// Phase 1: claim the key, or answer what it holds.
    fn claim(&mut self, key: &str) -> Result<Claimed> {
        for _ in 0..3 {
            let rows = self
                .client
                .query(&self.claim, &[&self.user_id, &key, &self.params_hash])?;
            let Some(row) = rows.first() else {
                // Inserted by a transaction that committed after this statement's
                // snapshot: ask again.
                continue;
            };
            if row.get::<_, bool>(0) {
                return Ok(Claimed::Fresh);
            }
            let hash: Vec<u8> = row.get(1);
            let point: String = row.get(2);
            let live: bool = row.get(3);
            if hash != self.params_hash {
                return Ok(Claimed::Mismatch);
            }
            if point == "finished" {
                return Ok(Claimed::Replay {
                    code: row.get::<_, Option<i32>>(4).unwrap_or(0),
                    body: row.get::<_, Option<Vec<u8>>>(5).unwrap_or_default(),
                });
            }
            if live {
                return Ok(Claimed::Locked);
            }
            return self.recover(key);
        }
        Err(format!("`{key}`: no row after 3 claims").into())
    }

    /// brandur's path for a key whose lock expired: lock its row, check again, relock.
    fn recover(&mut self, key: &str) -> Result<Claimed> {
        let mut txn = self.client.transaction()?;
        let row = txn.query_one(&self.lock_select, &[&self.user_id, &key])?;
        let hash: Vec<u8> = row.get(0);
        let point: String = row.get(1);
        let live: bool = row.get(2);
        let claimed = if hash != self.params_hash {
            Claimed::Mismatch
        } else if point == "finished" {
            Claimed::Replay {
                code: row.get::<_, Option<i32>>(3).unwrap_or(0),
                body: row.get::<_, Option<Vec<u8>>>(4).unwrap_or_default(),
            }
        } else if live {
            Claimed::Locked
        } else {
            txn.execute(&self.relock, &[&self.user_id, &key])?;
            Claimed::Fresh
        };
        txn.commit()?;
        Ok(claimed)
    }

    /// Phase 2: the key finished, with its response.
    fn finish(&mut self, key: &str, code: i32, body: &[u8]) -> Result<()> {
        let n = self
            .client
            .execute(&self.finish, &[&self.user_id, &key, &code, &body])?;
        if n != 1 {
            return Err(format!("`{key}`: finish updated {n} rows (lock lost)").into());
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// A worker process
// ---------------------------------------------------------------------------------------

struct WorkerArgs {
    url: String,
    engine: Engine,
    mode: Mode,
    threads: usize,
    seconds: f64,
    prefix: String,
    journal: String,
    populate: usize,
}

fn worker_args(argv: &[String]) -> Result<WorkerArgs> {
    let get = |name: &str| -> Result<&String> {
        let i = argv
            .iter()
            .position(|a| a == name)
            .ok_or_else(|| format!("missing {name}"))?;
        argv.get(i + 1)
            .ok_or_else(|| format!("{name} needs a value").into())
    };
    Ok(WorkerArgs {
        url: get("--url")?.clone(),
        engine: Engine::from_key(get("--engine")?).ok_or("unknown engine")?,
        mode: Mode::from_key(get("--mode")?).ok_or("unknown mode")?,
        threads: get("--threads")?.parse()?,
        seconds: get("--seconds")?.parse()?,
        prefix: get("--prefix")?.clone(),
        journal: get("--journal")?.clone(),
        populate: get("--populate")?.parse()?,
    })
}

/// The process's CPU time (every thread).
fn cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// `pg_bench __worker ...`: opens its handle or connections, says `ready`, waits for `go`
/// on stdin, runs, prints one JSON line with its count and latencies.
fn worker(argv: &[String]) -> Result<()> {
    let w = worker_args(argv)?;
    let intent = intent()?;
    let hash = intent.hash().as_bytes().to_vec();
    let payload = payload();
    let journal = match w.engine {
        Engine::Opj => Some(Journal::builder().open_postgres(&w.url, &w.journal)?),
        Engine::Keys => None,
    };
    let ready = Barrier::new(w.threads + 1);
    let go = Barrier::new(w.threads + 1);
    let results = thread::scope(|s| -> Result<Vec<(usize, usize, Vec<Duration>)>> {
        let mut handles = Vec::new();
        for t in 0..w.threads {
            let (ready, go, w, intent, hash, payload, journal) =
                (&ready, &go, &w, &intent, &hash, &payload, &journal);
            handles.push(s.spawn(move || -> Result<(usize, usize, Vec<Duration>)> {
                let conn = match journal {
                    Some(journal) => Ok(Conn::Opj {
                        journal,
                        intent: intent.clone(),
                    }),
                    None => KeysClient::connect(&w.url, t as i64, hash.clone())
                        .map(|k| Conn::Keys(Box::new(k))),
                };
                let prepared = conn.and_then(|mut conn| {
                    // Warm the connection (and the pool) before the clock starts; in replay
                    // mode, record the operations to be retried.
                    let n = match w.mode {
                        Mode::Lifecycle => 2,
                        Mode::Replay => w.populate,
                    };
                    for i in 0..n {
                        conn.lifecycle(&format!("{}-t{t}-w{i}", w.prefix), payload)?;
                    }
                    Ok(conn)
                });
                ready.wait();
                go.wait();
                let mut conn = prepared?;
                let mut lat = Vec::new();
                let mut errors = 0;
                let mut rng = opjournal_tools::stats::Rng::new(t as u64 + 1);
                let start = Instant::now();
                let deadline = start + Duration::from_secs_f64(w.seconds);
                let mut i = 0usize;
                while Instant::now() < deadline {
                    let t0 = Instant::now();
                    let r = match w.mode {
                        Mode::Lifecycle => {
                            conn.lifecycle(&format!("{}-t{t}-{i}", w.prefix), payload)
                        }
                        Mode::Replay => {
                            let k = rng.below(w.populate as u64);
                            conn.replay(&format!("{}-t{t}-w{k}", w.prefix))
                        }
                    };
                    match r {
                        Ok(()) => lat.push(t0.elapsed()),
                        Err(e) => {
                            errors += 1;
                            if errors <= 3 {
                                eprintln!("pg_bench worker ({}): {e}", w.engine.key());
                            }
                        }
                    }
                    i += 1;
                }
                Ok((lat.len(), errors, lat))
            }));
        }
        ready.wait();
        println!("ready");
        std::io::stdout().flush()?;
        let mut line = String::new();
        std::io::stdin().read_line(&mut line)?;
        let (cpu0, t0) = (cpu_time(), Instant::now());
        go.wait();
        let mut out = Vec::new();
        for h in handles {
            out.push(h.join().map_err(|_| "a client thread panicked")??);
        }
        let (elapsed, cpu) = (t0.elapsed(), cpu_time() - cpu0);
        let count: usize = out.iter().map(|r| r.0).sum();
        let errors: usize = out.iter().map(|r| r.1).sum();
        let lat_us: Vec<u64> = out
            .iter()
            .flat_map(|r| r.2.iter().map(|d| d.as_micros() as u64))
            .collect();
        println!(
            "{}",
            json!({
                "count": count,
                "errors": errors,
                "elapsed_s": elapsed.as_secs_f64(),
                "cpu_s": cpu.as_secs_f64(),
                "lat_us": lat_us,
            })
        );
        std::io::stdout().flush()?;
        Ok(out)
    })?;
    drop(results);
    // Closing the journal writes the pending lazy entries.
    drop(journal);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The parent: configurations, rounds, the report
// ---------------------------------------------------------------------------------------

/// One engine's run of one configuration (every process of it).
#[derive(Clone, Debug, Default)]
struct Run {
    count: usize,
    errors: usize,
    rate: f64,
    lat: Vec<Duration>,
    /// Client CPU time per operation (every process).
    cpu_us: f64,
    /// Server-side, per operation: committed transactions, WAL bytes, WAL syncs.
    xacts: f64,
    wal_bytes: f64,
    wal_syncs: f64,
    /// Statements executed per operation (from `pg_stat_statements`, when loaded).
    statements: Option<f64>,
    /// Server CPU time per operation (a private server only).
    server_cpu_us: Option<f64>,
}

/// Server counters read before and after a run.
#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    xacts: i64,
    wal_lsn: i64,
    wal_syncs: i64,
    statements: Option<i64>,
    /// The server's CPU time: the postmaster's and its ended children's (every backend of a
    /// run's workers has ended when it is read after the run).
    server_cpu: Option<Duration>,
}

/// The CPU time of the postmaster and of its children that ended (`/proc/PID/stat`:
/// utime, stime, cutime, cstime).
fn server_cpu(postmaster: Option<u32>) -> Option<Duration> {
    let pid = postmaster?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the command: state is field 3 of the file, utime 14 ... cstime 17.
    let ticks: u64 = fields
        .get(11..15)?
        .iter()
        .map(|f| f.parse::<u64>().ok())
        .sum::<Option<u64>>()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| Duration::from_secs_f64(ticks as f64 / hz as f64))
}

fn counters(admin: &mut Client, postmaster: Option<u32>) -> Result<Counters> {
    admin.batch_execute("SELECT pg_stat_clear_snapshot()")?;
    let row = admin.query_one(
        "SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),
                (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint,
                (SELECT wal_sync FROM pg_stat_wal)",
        &[],
    )?;
    // Every statement but the bench's own reads of the statistics (`BEGIN` and `COMMIT`
    // count: `pg_stat_statements.track_utility` is on by default).
    let statements = admin
        .query_one(
            "SELECT sum(calls)::bigint FROM pg_stat_statements WHERE query NOT LIKE '%pg_stat%'",
            &[],
        )
        .ok()
        .and_then(|r| r.get::<_, Option<i64>>(0));
    Ok(Counters {
        xacts: row.get(0),
        wal_lsn: row.get(1),
        wal_syncs: row.get(2),
        statements,
        server_cpu: server_cpu(postmaster),
    })
}

/// Waits (up to 10 s) until no session but the caller's is connected to its database.
fn wait_for_backends(admin: &mut Client) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let row = admin.query_one(
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND pid <> pg_backend_pid()",
            &[],
        )?;
        if row.get::<_, i64>(0) == 0 || Instant::now() > deadline {
            break;
        }
        thread::sleep(Duration::from_millis(10));
    }
    // The postmaster collects an ended backend's CPU time when it reaps it.
    thread::sleep(Duration::from_millis(20));
    Ok(())
}

struct Spawned {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

struct Plan<'a> {
    url: &'a str,
    engine: Engine,
    mode: Mode,
    clients: usize,
    processes: usize,
    seconds: f64,
    prefix: String,
    journal: String,
    populate: usize,
    /// Print the statements the run executed (`--statements`).
    statements: bool,
}

/// The statements of a run by calls per operation (from `pg_stat_statements`).
fn print_statements(admin: &mut Client, plan: &Plan<'_>, count: usize) -> Result<()> {
    let rows = admin.query(
        "SELECT calls, total_exec_time, regexp_replace(query, '\\s+', ' ', 'g')
           FROM pg_stat_statements
          WHERE query NOT LIKE '%pg_stat%' ORDER BY calls DESC LIMIT 25",
        &[],
    )?;
    eprintln!(
        "  statements of {} {} at {} clients / {} processes, per operation ({count} operations):",
        plan.engine.key(),
        plan.mode.key(),
        plan.clients,
        plan.processes
    );
    for r in rows {
        let (calls, ms, q): (i64, f64, String) = (r.get(0), r.get(1), r.get(2));
        let q: String = q.chars().take(150).collect();
        eprintln!(
            "    {:>7.2} calls, {:>6.1} µs each: {q}",
            calls as f64 / count.max(1) as f64,
            ms * 1000.0 / calls.max(1) as f64
        );
    }
    Ok(())
}

fn spawn_worker(plan: &Plan<'_>, proc_index: usize, threads: usize) -> Result<Spawned> {
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .arg("__worker")
        .args(["--url", plan.url])
        .args(["--engine", plan.engine.key()])
        .args(["--mode", plan.mode.key()])
        .args(["--threads", &threads.to_string()])
        .args(["--seconds", &plan.seconds.to_string()])
        .args(["--prefix", &format!("{}-p{proc_index}", plan.prefix)])
        .args(["--journal", &plan.journal])
        .args(["--populate", &plan.populate.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let stdin = child.stdin.take().ok_or("no stdin")?;
    let stdout = BufReader::new(child.stdout.take().ok_or("no stdout")?);
    Ok(Spawned {
        child,
        stdin,
        stdout,
    })
}

fn read_line(w: &mut Spawned) -> Result<String> {
    let mut line = String::new();
    if w.stdout.read_line(&mut line)? == 0 {
        let status = w.child.wait()?;
        return Err(format!("a worker ended early ({status})").into());
    }
    Ok(line)
}

/// Runs one engine on one configuration: spawns the processes, starts them together,
/// collects their figures and the server's counters.
fn run_plan(plan: &Plan<'_>, admin: &mut Client, postmaster: Option<u32>) -> Result<Run> {
    let mut workers = Vec::new();
    for p in 0..plan.processes {
        // Clients spread as evenly as they go (8 over 3: 3, 3, 2).
        let threads =
            plan.clients / plan.processes + usize::from(p < plan.clients % plan.processes);
        workers.push(spawn_worker(plan, p, threads)?);
    }
    for w in &mut workers {
        let line = read_line(w)?;
        if line.trim() != "ready" {
            return Err(format!("a worker said {line:?}").into());
        }
    }
    if plan.statements {
        let _ = admin.batch_execute("SELECT pg_stat_statements_reset()");
    }
    let before = counters(admin, postmaster)?;
    for w in &mut workers {
        w.stdin.write_all(b"go\n")?;
        w.stdin.flush()?;
    }
    let mut run = Run::default();
    let mut elapsed: f64 = 0.0;
    let mut cpu = 0.0;
    for w in &mut workers {
        let line = read_line(w)?;
        let v: Value = serde_json::from_str(&line)?;
        run.count += v["count"].as_u64().unwrap_or(0) as usize;
        run.errors += v["errors"].as_u64().unwrap_or(0) as usize;
        elapsed = elapsed.max(v["elapsed_s"].as_f64().unwrap_or(0.0));
        cpu += v["cpu_s"].as_f64().unwrap_or(0.0);
        if let Some(lat) = v["lat_us"].as_array() {
            run.lat.extend(
                lat.iter()
                    .filter_map(Value::as_u64)
                    .map(Duration::from_micros),
            );
        }
    }
    for mut w in workers {
        drop(w.stdin);
        let status = w.child.wait()?;
        if !status.success() {
            return Err(format!("a worker failed ({status})").into());
        }
    }
    // A backend flushes its statistics when it ends, and the postmaster then collects its
    // CPU time: wait until the workers' backends are gone (they end after their processes,
    // once they see the socket closed).
    wait_for_backends(admin)?;
    let after = counters(admin, postmaster)?;
    if plan.statements {
        print_statements(admin, plan, run.count)?;
    }
    let n = run.count.max(1) as f64;
    run.rate = run.count as f64 / elapsed.max(1e-9);
    run.cpu_us = cpu * 1e6 / n;
    run.xacts = (after.xacts - before.xacts) as f64 / n;
    run.wal_bytes = (after.wal_lsn - before.wal_lsn) as f64 / n;
    run.wal_syncs = (after.wal_syncs - before.wal_syncs) as f64 / n;
    run.statements = match (before.statements, after.statements) {
        (Some(b), Some(a)) => Some((a - b) as f64 / n),
        _ => None,
    };
    run.server_cpu_us = match (before.server_cpu, after.server_cpu) {
        (Some(b), Some(a)) => Some(a.saturating_sub(b).as_secs_f64() * 1e6 / n),
        _ => None,
    };
    Ok(run)
}

/// One engine's figures over the rounds of a configuration.
#[derive(Default)]
struct Summary {
    rates: Vec<f64>,
    lat: Vec<Duration>,
    errors: usize,
    count: usize,
    cpu_us: Vec<f64>,
    xacts: Vec<f64>,
    wal_bytes: Vec<f64>,
    wal_syncs: Vec<f64>,
    statements: Vec<f64>,
    server_cpu_us: Vec<f64>,
}

impl Summary {
    fn add(&mut self, r: Run) {
        self.rates.push(r.rate);
        self.errors += r.errors;
        self.count += r.count;
        self.cpu_us.push(r.cpu_us);
        self.xacts.push(r.xacts);
        self.wal_bytes.push(r.wal_bytes);
        self.wal_syncs.push(r.wal_syncs);
        self.statements.extend(r.statements);
        self.server_cpu_us.extend(r.server_cpu_us);
        self.lat.extend(r.lat);
    }

    fn rate(&self) -> f64 {
        median(&self.rates)
    }

    fn pct(&self) -> Percentiles {
        percentiles(&self.lat)
    }
}

fn fmt_rate(r: f64) -> String {
    let n = r.round() as u64;
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn fmt_ms(us: f64) -> String {
    if us >= 10_000.0 {
        format!("{:.1} ms", us / 1000.0)
    } else {
        format!("{:.2} ms", us / 1000.0)
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn git_revision() -> String {
    Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "?".into())
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Sets [`TUNING`] with `ALTER SYSTEM` and restarts the server.
fn tune(cluster: &PgCluster) -> Result<()> {
    let mut c = Client::connect(&cluster.url(), NoTls)?;
    for (name, value) in TUNING {
        c.batch_execute(&format!("ALTER SYSTEM SET {name} = '{value}'"))?;
    }
    // Statement counts per operation (many operators load it; its cost is the same for
    // both engines), when the server has the module.
    let lib = cluster.bin_dir().join("../lib/pg_stat_statements.so");
    if lib.exists() {
        c.batch_execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")?;
    }
    drop(c);
    // `shared_buffers` and `wal_buffers` take a restart. Only an immediate stop is offered:
    // the new server recovers a cluster that has nothing in it yet.
    cluster.stop_immediate()?;
    cluster.start_again()?;
    let mut c = Client::connect(&cluster.url(), NoTls)?;
    c.batch_execute("CHECKPOINT")?;
    Ok(())
}

fn settings(admin: &mut Client) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for name in SHOWN {
        let row = admin.query_one(&format!("SHOW {name}"), &[])?;
        out.push((name.to_owned(), row.get::<_, String>(0)));
    }
    Ok(out)
}

/// Single-row `INSERT` commits per second with `clients` connections, each its own
/// transaction: the server's commit (WAL flush) rate, the physical limit.
fn commit_probe(url: &str, clients: usize, seconds: f64) -> Result<(f64, Percentiles)> {
    let barrier = Barrier::new(clients);
    let results = thread::scope(|s| -> Result<Vec<Vec<Duration>>> {
        let handles: Vec<_> = (0..clients)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || -> Result<Vec<Duration>> {
                    let mut c = Client::connect(url, NoTls);
                    let stmt = c.as_mut().map_err(|e| e.to_string()).and_then(|c| {
                        c.prepare(&format!(
                            "INSERT INTO {SCHEMA}.commit_probe (id, v) VALUES ($1, $2)"
                        ))
                        .map_err(|e| e.to_string())
                    });
                    barrier.wait();
                    let (mut c, stmt) = (c?, stmt?);
                    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
                    let mut lat = Vec::new();
                    let id = t as i64;
                    let mut v = 0i64;
                    while Instant::now() < deadline {
                        let t0 = Instant::now();
                        c.execute(&stmt, &[&id, &v])?;
                        lat.push(t0.elapsed());
                        v += 1;
                    }
                    Ok(lat)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| Error::from("a probe thread panicked"))?
            })
            .collect()
    })?;
    let all: Vec<Duration> = results.into_iter().flatten().collect();
    Ok((all.len() as f64 / seconds, percentiles(&all)))
}

struct Row {
    label: String,
    opj: Summary,
    keys: Summary,
    limit: Option<f64>,
}

fn run(args: Args) -> Result<()> {
    let started = Instant::now();
    let load_start = load_average();
    let (cluster, url) = match &args.url {
        Some(url) => (None, url.clone()),
        None => {
            let Some(cluster) = PgCluster::start_or_skip() else {
                println!("pg_bench: skipped, no PostgreSQL (set OPJOURNAL_PG_BIN)");
                return Ok(());
            };
            if args.tune {
                tune(&cluster)?;
            }
            cluster.create_database("opj_bench")?;
            let url = cluster.url_for("opj_bench");
            (Some(cluster), url)
        }
    };
    let postmaster = cluster.as_ref().and_then(|c| {
        std::fs::read_to_string(c.data_dir().join("postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse::<u32>()
            .ok()
    });
    let mut admin = Client::connect(&url, NoTls)?;
    admin.batch_execute(&keys_table_sql())?;
    // Statements per operation, when the server loads pg_stat_statements.
    let _ = admin.batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
    let run_id = format!("{:x}", now_secs());

    println!("# pg_bench: opjournal on PostgreSQL vs a plain idempotency-key table");
    println!();
    println!(
        "opjournal git {}, {} CPUs, load average at start {load_start}, mode {}",
        git_revision(),
        thread::available_parallelism().map_or(0, |n| n.get()),
        if args.quick { "quick" } else { "full" },
    );
    match &cluster {
        Some(c) => println!(
            "server: private (testkit PgCluster, {}), data in {}, {}",
            c.bin_dir().display(),
            c.data_dir().display(),
            if args.tune {
                "tuned as listed"
            } else {
                "defaults"
            }
        ),
        None => println!("server: --url (as configured)"),
    }
    let shown = settings(&mut admin)?;
    println!(
        "settings: {}",
        shown
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "per run: {} s per engine, {} rounds (engines alternate, the first one swapping each round), \
         figures are the median round; latencies over every round",
        args.seconds, args.rounds
    );
    println!();

    // The physical limit, per client count.
    let mut limits = std::collections::BTreeMap::new();
    println!("## Commit rate of the server (single-row INSERT, one transaction each)");
    println!();
    println!("| connections | commits/s | p50 | p99 |");
    println!("|---|---|---|---|");
    for &c in &args.clients {
        let (rate, p) = commit_probe(&url, c, args.probe_seconds)?;
        limits.insert(c, rate);
        println!(
            "| {c} | {} | {} | {} |",
            fmt_rate(rate),
            fmt_ms(p.p50),
            fmt_ms(p.p99)
        );
    }
    admin.batch_execute(&format!("TRUNCATE {SCHEMA}.commit_probe"))?;
    println!();

    let mut rows = Vec::new();
    for &procs in &args.processes {
        for &clients in &args.clients {
            if clients < procs {
                continue;
            }
            let label = format!("{clients} clients / {procs} proc");
            let mut row = Row {
                label: label.clone(),
                opj: Summary::default(),
                keys: Summary::default(),
                limit: limits.get(&clients).copied(),
            };
            let journal = format!("pgbench-{run_id}-c{clients}-p{procs}");
            for round in 0..args.rounds {
                let order = if round % 2 == 0 {
                    [Engine::Opj, Engine::Keys]
                } else {
                    [Engine::Keys, Engine::Opj]
                };
                for engine in order {
                    let plan = Plan {
                        url: &url,
                        engine,
                        mode: Mode::Lifecycle,
                        clients,
                        processes: procs,
                        seconds: args.seconds,
                        prefix: format!("{run_id}-c{clients}p{procs}r{round}"),
                        journal: journal.clone(),
                        populate: 0,
                        statements: args.statements,
                    };
                    let r = run_plan(&plan, &mut admin, postmaster)?;
                    eprintln!(
                        "  {label}, round {round}, {}: {:.0}/s ({} errors), load {}",
                        engine.key(),
                        r.rate,
                        r.errors,
                        load_average()
                    );
                    match engine {
                        Engine::Opj => row.opj.add(r),
                        Engine::Keys => row.keys.add(r),
                    }
                }
            }
            rows.push(row);
        }
    }

    // Replay: one process, each client count.
    let mut replays = Vec::new();
    for &clients in &args.clients {
        let mut row = Row {
            label: format!("{clients} clients / 1 proc"),
            opj: Summary::default(),
            keys: Summary::default(),
            limit: None,
        };
        let journal = format!("pgbench-{run_id}-replay-c{clients}");
        for round in 0..args.rounds {
            let order = if round % 2 == 0 {
                [Engine::Opj, Engine::Keys]
            } else {
                [Engine::Keys, Engine::Opj]
            };
            for engine in order {
                let plan = Plan {
                    url: &url,
                    engine,
                    mode: Mode::Replay,
                    clients,
                    processes: 1,
                    seconds: args.replay_seconds,
                    prefix: format!("{run_id}-rp{clients}r{round}"),
                    journal: journal.clone(),
                    populate: args.populate,
                    statements: args.statements,
                };
                let r = run_plan(&plan, &mut admin, postmaster)?;
                match engine {
                    Engine::Opj => row.opj.add(r),
                    Engine::Keys => row.keys.add(r),
                }
            }
        }
        replays.push(row);
    }

    println!("## Lifecycles");
    println!();
    println!(
        "opj = submit → complete(applied, 1 KiB) → delivered → acknowledge; \
         keys = claim (INSERT ... ON CONFLICT) → finish (UPDATE with the response)"
    );
    println!();
    println!(
        "| clients / processes | opjournal /s (p50, p99) | keys /s (p50, p99) | ratio | commit limit /s |"
    );
    println!("|---|---|---|---|---|");
    for r in &rows {
        print_row(r);
    }
    println!();
    print_costs("lifecycle", &rows);
    println!("## Replay (a retried id whose result is recorded)");
    println!();
    println!("| clients / processes | opjournal /s (p50, p99) | keys /s (p50, p99) | ratio | |");
    println!("|---|---|---|---|---|");
    for r in &replays {
        print_row(r);
    }
    println!();
    print_costs("replay", &replays);
    let errors: usize = rows
        .iter()
        .chain(&replays)
        .map(|r| r.opj.errors + r.keys.errors)
        .sum();
    println!(
        "errors: {errors}; load average at end {}; {:.0} s",
        load_average(),
        started.elapsed().as_secs_f64()
    );
    drop(admin);
    drop(cluster);
    if errors > 0 {
        return Err(format!("{errors} calls failed").into());
    }
    Ok(())
}

/// What each operation cost, median round: statements and transactions on the server,
/// WAL bytes and syncs, server and client CPU.
fn print_costs(what: &str, rows: &[Row]) {
    println!(
        "Per {what} (median round; opj / keys): statements run, transactions committed, \
         WAL bytes, WAL syncs, server CPU, client CPU"
    );
    println!();
    println!(
        "| clients / processes | statements | xacts | WAL B | WAL syncs | server CPU | client CPU |"
    );
    println!("|---|---|---|---|---|---|---|");
    let pair = |a: &[f64], b: &[f64], digits: usize| {
        if a.is_empty() || b.is_empty() {
            return "–".to_owned();
        }
        format!("{:.digits$} / {:.digits$}", median(a), median(b))
    };
    for r in rows {
        println!(
            "| {} | {} | {} | {} | {} | {} µs | {} µs |",
            r.label,
            pair(&r.opj.statements, &r.keys.statements, 1),
            pair(&r.opj.xacts, &r.keys.xacts, 2),
            pair(&r.opj.wal_bytes, &r.keys.wal_bytes, 0),
            pair(&r.opj.wal_syncs, &r.keys.wal_syncs, 2),
            pair(&r.opj.server_cpu_us, &r.keys.server_cpu_us, 0),
            pair(&r.opj.cpu_us, &r.keys.cpu_us, 0),
        );
    }
    println!();
}

fn print_row(r: &Row) {
    let (po, pk) = (r.opj.pct(), r.keys.pct());
    let ratio = r.opj.rate() / r.keys.rate().max(1e-9);
    println!(
        "| {} | {} ({}, {}) | {} ({}, {}) | **{:.2}×** | {} |",
        r.label,
        fmt_rate(r.opj.rate()),
        fmt_ms(po.p50),
        fmt_ms(po.p99),
        fmt_rate(r.keys.rate()),
        fmt_ms(pk.p50),
        fmt_ms(pk.p99),
        ratio,
        r.limit.map_or(String::new(), fmt_rate),
    );
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.first().map(String::as_str) == Some("__worker") {
        return match worker(&argv[1..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("pg_bench worker: {e}");
                ExitCode::from(2)
            }
        };
    }
    let result = parse_args(&argv).and_then(run);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pg_bench: {e}");
            ExitCode::from(2)
        }
    }
}
