//! Real PostgreSQL servers for the `postgres` backend's tests, and a TCP proxy that cuts
//! connections like a network partition.
//!
//! [`PgCluster::start`] runs `initdb` into a fresh temporary directory and starts a private
//! server on a free loopback port: trust authentication, listening on 127.0.0.1 only, its
//! unix socket in that directory, `fsync=on` (the tests check durability) and
//! `max_connections=200`. A test stops it with `pg_ctl stop -m immediate` (a crash, as
//! far as the server's clients and its WAL are concerned) and starts it again on the same
//! data directory and port. Dropping the cluster stops the server and removes the
//! directory; a watchdog process does the same if the test process dies first (a killed
//! or interrupted `cargo test`).
//!
//! The binaries: the directory named by `OPJOURNAL_PG_BIN`, else the highest
//! `/usr/lib/postgresql/<version>/bin` (Debian's layout), else the directory of the
//! `initdb` found on `PATH`. `tools/pg.sh install` installs Debian's server. Tests call
//! [`PgCluster::start_or_skip`]: without binaries a test prints one line and passes, so
//! `cargo test --workspace` stays green on a machine without PostgreSQL, unless
//! `OPJOURNAL_PG_REQUIRED=1` (CI), where it fails.
//!
//! `initdb` and `postgres` refuse to run as root. When the effective user is root, they run
//! as `nobody` (through util-linux `setpriv`), which owns the cluster's directory; `psql`
//! runs as the caller, over TCP.
//!
//! [`TcpProxy`] forwards a loopback port to another; [`TcpProxy::cut`] stops the bytes in
//! both directions while every socket stays open, so each side sees silence (not a reset),
//! and [`TcpProxy::heal`] delivers what was held back, as TCP would after a partition.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::fs;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// The environment variable naming the directory that holds `initdb`, `pg_ctl`,
/// `postgres` and `psql`.
pub const BIN_ENV: &str = "OPJOURNAL_PG_BIN";

/// The environment variable that turns a missing PostgreSQL into a failure (CI sets it to
/// `1`).
pub const REQUIRED_ENV: &str = "OPJOURNAL_PG_REQUIRED";

/// The binaries a cluster needs, all in one directory.
const BINARIES: [&str; 4] = ["initdb", "pg_ctl", "postgres", "psql"];

/// How long `pg_ctl` waits for the server to start (crash recovery included) or stop.
const PG_CTL_TIMEOUT_SECS: &str = "120";

/// A private PostgreSQL server in a temporary directory, on a loopback port of its own.
pub struct PgCluster {
    bin: PathBuf,
    // Dropped after `Drop::drop` stopped the server: removes the directory.
    dir: tempfile::TempDir,
    port: u16,
    run_as: Option<User>,
    /// Whether the server runs; held across `pg_ctl` calls so they do not interleave.
    running: Mutex<bool>,
    watchdog: Mutex<Option<Child>>,
}

/// The unprivileged user the server runs as when the caller is root.
#[derive(Clone, Copy, Debug)]
struct User {
    uid: u32,
    gid: u32,
}

impl PgCluster {
    /// The directory of the PostgreSQL binaries, or why there is none: what
    /// [`PgCluster::start`] would use.
    pub fn available() -> Result<PathBuf, String> {
        find_bin_dir()
    }

    /// Whether the environment requires PostgreSQL (`OPJOURNAL_PG_REQUIRED` set to anything
    /// but empty or `0`).
    pub fn required() -> bool {
        std::env::var_os(REQUIRED_ENV).is_some_and(|v| !v.is_empty() && v != "0")
    }

    /// Starts a cluster for a test, or returns `None` after one line on stderr when there
    /// are no PostgreSQL binaries and the environment does not require them.
    ///
    /// # Panics
    ///
    /// When the binaries are missing and `OPJOURNAL_PG_REQUIRED` is set, when
    /// `OPJOURNAL_PG_BIN` names a directory without them, and when the binaries are there
    /// but the cluster does not start.
    pub fn start_or_skip() -> Option<PgCluster> {
        if let Err(why) = find_bin_dir() {
            if Self::required() {
                panic!("PostgreSQL is required ({REQUIRED_ENV} is set) but unavailable: {why}");
            }
            if std::env::var_os(BIN_ENV).is_some_and(|v| !v.is_empty()) {
                panic!("{why}");
            }
            let test = thread::current().name().unwrap_or("a test").to_owned();
            // Straight to the process's stderr: the test harness captures `eprintln!`.
            let _ = writeln!(
                io::stderr(),
                "skipped {test}: {why} (set {REQUIRED_ENV}=1 to fail instead)"
            );
            return None;
        }
        match PgCluster::start() {
            Ok(cluster) => Some(cluster),
            Err(e) => {
                panic!("the PostgreSQL binaries are there but the cluster did not start: {e}")
            }
        }
    }

    /// Runs `initdb` into a fresh temporary directory and starts the server on a free
    /// loopback port (retrying with another port if the chosen one was taken meanwhile).
    pub fn start() -> Result<PgCluster, String> {
        let bin = find_bin_dir()?;
        let run_as = if effective_uid()? == 0 {
            Some(unprivileged_user()?)
        } else {
            None
        };
        let base = temp_base(run_as.is_some())?;
        let dir = tempfile::Builder::new()
            .prefix("opj-pg-")
            .tempdir_in(&base)
            .map_err(|e| format!("a temporary directory in {}: {e}", base.display()))?;
        // The server's unix socket lives in the directory: sun_path holds 107 bytes.
        let socket = dir.path().join(".s.PGSQL.65535");
        if socket.as_os_str().len() > 100 {
            return Err(format!(
                "the temporary directory's path is too long for a unix socket ({}): set TMPDIR to a shorter one",
                dir.path().display()
            ));
        }
        if let Some(user) = run_as {
            std::os::unix::fs::chown(dir.path(), Some(user.uid), Some(user.gid))
                .map_err(|e| format!("chown {}: {e}", dir.path().display()))?;
        }
        let mut cluster = PgCluster {
            bin,
            dir,
            port: 0,
            run_as,
            running: Mutex::new(false),
            watchdog: Mutex::new(None),
        };
        cluster.init()?;
        cluster.spawn_watchdog()?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            cluster.port = pick_port()?;
            cluster.append_conf(&format!("port = {}\n", cluster.port))?;
            let log_before = fs::metadata(cluster.log_path()).map_or(0, |m| m.len());
            match cluster.start_again() {
                Ok(()) => return Ok(cluster),
                // Another process took the port since `pick_port` found it free.
                Err(_)
                    if attempt < 8 && cluster.log_since(log_before).contains("could not bind") => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        self.url_for("postgres")
    }

    /// The URL of database `name` on this server (the name percent-encoded).
    pub fn url_for(&self, name: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{}",
            self.port,
            percent_encode(name)
        )
    }

    /// The loopback port the server listens on (the same after [`PgCluster::start_again`]).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The directory of the binaries this cluster runs.
    pub fn bin_dir(&self) -> &Path {
        &self.bin
    }

    /// The data directory (`PGDATA`).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The server's log (`pg_ctl -l`), kept across restarts.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    /// Whether the server runs (as far as this handle's calls know).
    pub fn is_running(&self) -> bool {
        *self.running_guard()
    }

    /// `pg_ctl stop -m immediate`: the server's processes quit without a checkpoint, as in a
    /// crash; the next start runs crash recovery. Returns once the server is gone.
    pub fn stop_immediate(&self) -> Result<(), String> {
        let mut running = self.running_guard();
        self.pg_ctl_stop("immediate")?;
        *running = false;
        Ok(())
    }

    /// Starts the server again on the same data directory and port (`pg_ctl -w start`):
    /// returns once it accepts connections, crash recovery done.
    pub fn start_again(&self) -> Result<(), String> {
        let mut running = self.running_guard();
        let data = self.data_dir();
        let log = self.log_path();
        let mut cmd = self.pg_command("pg_ctl");
        cmd.arg("-D").arg(&data).arg("-l").arg(&log).args([
            "-w",
            "-t",
            PG_CTL_TIMEOUT_SECS,
            "start",
        ]);
        match run(cmd, "pg_ctl start") {
            Ok(_) => {
                *running = true;
                Ok(())
            }
            Err(e) => Err(format!("{e}\n--- server log ---\n{}", self.log_tail(30))),
        }
    }

    /// Runs `sql` with `psql` in database `postgres` (as user `postgres`, over TCP) and
    /// returns its unaligned, tuples-only output without the trailing newline.
    pub fn psql(&self, sql: &str) -> Result<String, String> {
        let mut cmd = Command::new(self.bin.join("psql"));
        cmd.args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
            .args(["-h", "127.0.0.1", "-U", "postgres", "-d", "postgres"])
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-c")
            .arg(sql)
            .env("PGCONNECT_TIMEOUT", "10")
            .current_dir(self.dir.path());
        run(cmd, "psql").map(|out| out.trim_end_matches('\n').to_owned())
    }

    /// `CREATE DATABASE "name"`.
    pub fn create_database(&self, name: &str) -> Result<(), String> {
        let quoted = name.replace('"', "\"\"");
        self.psql(&format!("CREATE DATABASE \"{quoted}\""))
            .map(|_| ())
    }

    fn running_guard(&self) -> MutexGuard<'_, bool> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A command for a server binary, run as the unprivileged user when the caller is root,
    /// in the cluster's directory (the caller's may not be readable by that user).
    fn pg_command(&self, binary: &str) -> Command {
        let program = self.bin.join(binary);
        let mut cmd = match self.run_as {
            None => Command::new(program),
            Some(user) => {
                let mut cmd = Command::new("setpriv");
                cmd.arg(format!("--reuid={}", user.uid))
                    .arg(format!("--regid={}", user.gid))
                    .args(["--clear-groups", "--"])
                    .arg(program);
                cmd
            }
        };
        cmd.current_dir(self.dir.path());
        cmd
    }

    fn init(&self) -> Result<(), String> {
        let mut cmd = self.pg_command("initdb");
        cmd.arg("-D")
            .arg(self.data_dir())
            .args(["-U", "postgres", "-E", "UTF8", "--locale=C"])
            .args(["--auth=trust", "--no-sync"]);
        run(cmd, "initdb")?;
        // Later lines win: `start` appends the port.
        let socket_dir = self.dir.path().to_string_lossy().replace('\'', "''");
        let mut conf = format!(
            "\n# opjournal-testkit (testkit/src/pg.rs)\n\
             listen_addresses = '127.0.0.1'\n\
             unix_socket_directories = '{socket_dir}'\n\
             fsync = on\n\
             max_connections = 200\n"
        );
        // Before crash recovery the server syncs its whole data directory, by default one
        // fsync per file: seconds on a busy disk, for each restart after `-m immediate`.
        // One syncfs() instead (PostgreSQL 14 and later); commits still wait for fsync.
        if self.major_version()? >= 14 {
            conf.push_str("recovery_init_sync_method = syncfs\n");
        }
        self.append_conf(&conf)
    }

    /// The server's major version, from `postgres -V` ("postgres (PostgreSQL) 15.18 ...").
    fn major_version(&self) -> Result<u32, String> {
        let mut cmd = Command::new(self.bin.join("postgres"));
        cmd.arg("-V");
        let out = run(cmd, "postgres -V")?;
        out.split_once("(PostgreSQL)")
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .and_then(|version| version.split(['.', 'b', 'r']).next()?.parse().ok())
            .ok_or_else(|| format!("no version in postgres -V: {out:?}"))
    }

    fn append_conf(&self, text: &str) -> Result<(), String> {
        let path = self.data_dir().join("postgresql.conf");
        fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .map_err(|e| format!("appending to {}: {e}", path.display()))
    }

    fn pg_ctl_stop(&self, mode: &str) -> Result<(), String> {
        let mut cmd = self.pg_command("pg_ctl");
        cmd.arg("-D").arg(self.data_dir()).args([
            "-m",
            mode,
            "-w",
            "-t",
            PG_CTL_TIMEOUT_SECS,
            "stop",
        ]);
        run(cmd, "pg_ctl stop").map(|_| ())
    }

    /// A shell that outlives the test process: when that process is gone (or a zombie)
    /// without having dropped the cluster, it stops the server (SIGQUIT, an immediate
    /// shutdown) and removes the directory, within a few seconds. It ignores the terminal's
    /// Ctrl-C, which interrupts the tests.
    fn spawn_watchdog(&self) -> Result<(), String> {
        const SCRIPT: &str = r#"
trap '' INT HUP TERM QUIT PIPE
while kill -0 "$1" 2>/dev/null; do
    case "$(cat "/proc/$1/stat" 2>/dev/null)" in *") Z "*) break ;; esac
    sleep 1
done
if [ -f "$2/postmaster.pid" ]; then
    pid=$(head -n 1 "$2/postmaster.pid")
    kill -QUIT "$pid" 2>/dev/null
    i=0
    while kill -0 "$pid" 2>/dev/null && [ "$i" -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
fi
rm -rf "$3"
"#;
        let child = Command::new("sh")
            .arg("-c")
            .arg(SCRIPT)
            .arg("opjournal-pg-watchdog")
            .arg(std::process::id().to_string())
            .arg(self.data_dir())
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("the watchdog shell: {e}"))?;
        *self.watchdog.lock().unwrap_or_else(|e| e.into_inner()) = Some(child);
        Ok(())
    }

    fn log_since(&self, offset: u64) -> String {
        let text = fs::read(self.log_path()).unwrap_or_default();
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(text.len());
        String::from_utf8_lossy(&text[start..]).into_owned()
    }

    fn log_tail(&self, lines: usize) -> String {
        let text = self.log_since(0);
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let running = *self.running_guard();
        if running && let Err(e) = self.pg_ctl_stop("immediate") {
            // The directory goes anyway; a postmaster whose lock file is gone shuts down.
            let _ = writeln!(io::stderr(), "PgCluster: stopping the server: {e}");
            if let Ok(pid) = fs::read_to_string(self.data_dir().join("postmaster.pid"))
                && let Some(pid) = pid.lines().next()
            {
                let _ = Command::new("kill")
                    .args(["-QUIT", pid.trim()])
                    .stderr(Stdio::null())
                    .status();
            }
        }
        if let Some(mut watchdog) = self
            .watchdog
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
        // `self.dir` drops next and removes the directory.
    }
}

impl std::fmt::Debug for PgCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgCluster")
            .field("url", &self.url())
            .field("dir", &self.dir.path())
            .field("bin", &self.bin)
            .field("run_as", &self.run_as)
            .finish()
    }
}

/// Runs `cmd` (stdin closed) and returns its stdout, or an error with its output.
fn run(mut cmd: Command, what: &str) -> Result<String, String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{what}: {e} ({cmd:?})"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(format!(
            "{what} failed ({}): {}{}",
            out.status,
            stdout,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn find_bin_dir() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os(BIN_ENV).filter(|v| !v.is_empty()) {
        let dir = PathBuf::from(dir);
        return match missing_binary(&dir) {
            None => Ok(dir),
            Some(name) => Err(format!("{BIN_ENV}={}: no {name} there", dir.display())),
        };
    }
    // Debian: /usr/lib/postgresql/<version>/bin, the highest version first.
    if let Ok(entries) = fs::read_dir("/usr/lib/postgresql") {
        let mut versions: Vec<(Vec<u64>, PathBuf)> = entries
            .filter_map(|entry| {
                let entry = entry.ok()?;
                let name = entry.file_name().into_string().ok()?;
                let version = name
                    .split('.')
                    .map(|part| part.parse().ok())
                    .collect::<Option<Vec<u64>>>()?;
                Some((version, entry.path().join("bin")))
            })
            .filter(|(_, bin)| missing_binary(bin).is_none())
            .collect();
        versions.sort();
        if let Some((_, bin)) = versions.pop() {
            return Ok(bin);
        }
    }
    // `initdb` on PATH, through its symlinks to the directory that holds the rest.
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let initdb = dir.join("initdb");
            if !initdb.is_file() {
                continue;
            }
            if let Some(bin) = fs::canonicalize(&initdb)
                .ok()
                .and_then(|real| real.parent().map(Path::to_path_buf))
                && missing_binary(&bin).is_none()
            {
                return Ok(bin);
            }
        }
    }
    Err(format!(
        "no PostgreSQL binaries ({} in {BIN_ENV}, /usr/lib/postgresql/*/bin or beside initdb on PATH); tools/pg.sh install installs them",
        BINARIES.join(", ")
    ))
}

fn missing_binary(dir: &Path) -> Option<&'static str> {
    BINARIES.into_iter().find(|name| !dir.join(name).is_file())
}

/// The effective user id, from `/proc/self/status` (its `Uid:` line: real, effective,
/// saved, filesystem), else `id -u`.
fn effective_uid() -> Result<u32, String> {
    if let Ok(status) = fs::read_to_string("/proc/self/status")
        && let Some(uid) = status
            .lines()
            .find_map(|line| line.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            .and_then(|euid| euid.parse().ok())
    {
        return Ok(uid);
    }
    let mut cmd = Command::new("id");
    cmd.arg("-u");
    parse_id(&run(cmd, "id -u")?)
}

/// `nobody`'s user and group ids.
fn unprivileged_user() -> Result<User, String> {
    let id = |flag: &str| {
        let mut cmd = Command::new("id");
        cmd.args([flag, "nobody"]);
        run(cmd, "id nobody").and_then(|out| parse_id(&out))
    };
    Ok(User {
        uid: id("-u")?,
        gid: id("-g")?,
    })
}

fn parse_id(text: &str) -> Result<u32, String> {
    text.trim()
        .parse()
        .map_err(|e| format!("not a user or group id ({e}): {text:?}"))
}

/// Where the cluster's directory goes: the system's temporary directory, or `/tmp` when
/// another user must reach it and some directory on the way there is closed to others.
fn temp_base(other_user: bool) -> Result<PathBuf, String> {
    let candidates = [std::env::temp_dir(), PathBuf::from("/tmp")];
    candidates
        .into_iter()
        .find(|dir| !other_user || traversable_by_others(dir))
        .ok_or_else(|| {
            "no temporary directory that the unprivileged user can reach (TMPDIR or /tmp)"
                .to_owned()
        })
}

fn traversable_by_others(dir: &Path) -> bool {
    dir.ancestors()
        .all(|d| fs::metadata(d).is_ok_and(|m| m.is_dir() && m.permissions().mode() & 0o001 != 0))
}

/// A loopback port that nothing listens on. Drawn below the kernel's ephemeral range when
/// there is room, so no outgoing connection or `bind(0)` takes it while the server is
/// stopped between [`PgCluster::stop_immediate`] and [`PgCluster::start_again`].
fn pick_port() -> Result<u16, String> {
    let ephemeral_low = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    const LOW: u16 = 10_000;
    if ephemeral_low > LOW + 1_000 {
        let span = u64::from(ephemeral_low - LOW);
        for _ in 0..200 {
            let port = LOW + u16::try_from(random_u64() % span).unwrap_or(0);
            if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
                return Ok(port);
            }
        }
    }
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .map_err(|e| format!("no free loopback port: {e}"))
}

/// A random number from std's per-process random hash keys.
fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u32(std::process::id());
    hasher.finish()
}

fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// A TCP proxy on a loopback port that forwards each connection to `127.0.0.1:target`,
/// and can cut every connection like a network partition.
///
/// While cut, no byte moves in either direction and new connections are accepted but not
/// dialed through: every socket stays open, so both sides see silence, not a reset. The
/// server's timeouts fire as in a partition; the client's TCP keepalives do not (this
/// proxy's kernel answers them), so only a client-side deadline ends a call. Bytes read before the cut are
/// delivered; bytes sent during it are held and delivered after [`TcpProxy::heal`], as TCP
/// retransmits them after a partition heals. Dropping the proxy closes every connection.
pub struct TcpProxy {
    port: u16,
    shared: Arc<ProxyShared>,
    acceptor: Option<JoinHandle<()>>,
}

struct ProxyShared {
    target: SocketAddr,
    cut: AtomicBool,
    closing: AtomicBool,
    next_id: AtomicU64,
    /// Both sockets of each live connection, for `Drop` to shut them down.
    connections: Mutex<HashMap<u64, (TcpStream, TcpStream)>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// How often a connection waiting out a cut looks at the cut and closing flags.
const PUMP_TICK: Duration = Duration::from_millis(5);

impl TcpProxy {
    /// Listens on a free loopback port and forwards to `127.0.0.1:target_port`.
    ///
    /// # Panics
    ///
    /// When no loopback port can be bound (a broken test machine).
    pub fn start(target_port: u16) -> TcpProxy {
        let listener =
            TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("TcpProxy: bind a loopback port");
        let port = listener
            .local_addr()
            .expect("TcpProxy: the listener's address")
            .port();
        let shared = Arc::new(ProxyShared {
            target: SocketAddr::from((Ipv4Addr::LOCALHOST, target_port)),
            cut: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            next_id: AtomicU64::new(0),
            connections: Mutex::new(HashMap::new()),
            threads: Mutex::new(Vec::new()),
        });
        let accepting = Arc::clone(&shared);
        let acceptor = thread::Builder::new()
            .name(format!("proxy-{port}-accept"))
            .spawn(move || accept_loop(&listener, &accepting))
            .expect("TcpProxy: spawn the accept thread");
        TcpProxy {
            port,
            shared,
            acceptor: Some(acceptor),
        }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops forwarding in both directions, keeping every socket open.
    pub fn cut(&self) {
        self.shared.cut.store(true, Ordering::SeqCst);
    }

    /// Forwards again, the held bytes first.
    pub fn heal(&self) {
        self.shared.cut.store(false, Ordering::SeqCst);
    }

    /// Whether the proxy is cut.
    pub fn is_cut(&self) -> bool {
        self.shared.cut.load(Ordering::SeqCst)
    }

    /// How many connections are open through the proxy (dialed through to the target).
    pub fn connections(&self) -> usize {
        lock(&self.shared.connections).len()
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.shared.closing.store(true, Ordering::SeqCst);
        // Wakes the blocking accept, which then sees `closing`.
        let _ = TcpStream::connect_timeout(
            &SocketAddr::from((Ipv4Addr::LOCALHOST, self.port)),
            Duration::from_secs(1),
        );
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        for (client, server) in lock(&self.shared.connections).values() {
            let _ = client.shutdown(Shutdown::Both);
            let _ = server.shutdown(Shutdown::Both);
        }
        let threads = std::mem::take(&mut *lock(&self.shared.threads));
        for thread in threads {
            let _ = thread.join();
        }
    }
}

impl std::fmt::Debug for TcpProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpProxy")
            .field("port", &self.port)
            .field("target", &self.shared.target)
            .field("cut", &self.is_cut())
            .finish()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

fn accept_loop(listener: &TcpListener, shared: &Arc<ProxyShared>) {
    loop {
        let accepted = listener.accept();
        if shared.closing.load(Ordering::SeqCst) {
            return;
        }
        let Ok((client, _)) = accepted else {
            thread::sleep(PUMP_TICK);
            continue;
        };
        let conn = Arc::clone(shared);
        let spawned = thread::Builder::new()
            .name("proxy-conn".to_owned())
            .spawn(move || connection(client, &conn));
        let mut threads = lock(&shared.threads);
        threads.retain(|t| !t.is_finished());
        if let Ok(handle) = spawned {
            threads.push(handle);
        }
    }
}

/// One client: waits out a cut, dials the target, pumps the client's bytes on this thread
/// and the server's on another, and forgets the connection when both directions ended.
fn connection(client: TcpStream, shared: &Arc<ProxyShared>) {
    while shared.cut.load(Ordering::SeqCst) {
        if shared.closing.load(Ordering::SeqCst) {
            return;
        }
        thread::sleep(PUMP_TICK);
    }
    if shared.closing.load(Ordering::SeqCst) {
        return;
    }
    // Refused or unreachable: the client sees its connection closed.
    let Ok(server) = TcpStream::connect_timeout(&shared.target, Duration::from_secs(5)) else {
        return;
    };
    let sockets = (|| {
        for s in [&client, &server] {
            s.set_nodelay(true)?;
        }
        Ok::<_, io::Error>((
            client.try_clone()?,
            server.try_clone()?,
            client.try_clone()?,
            server.try_clone()?,
        ))
    })();
    let Ok((client_kept, server_kept, client_back, server_back)) = sockets else {
        return;
    };
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    lock(&shared.connections).insert(id, (client_kept, server_kept));
    if shared.closing.load(Ordering::SeqCst) {
        // Drop may have shut the registered sockets down before this one was there.
        lock(&shared.connections).remove(&id);
        return;
    }
    let back = Arc::clone(shared);
    let backwards = thread::Builder::new()
        .name("proxy-pump".to_owned())
        .spawn(move || pump(server_back, client_back, &back));
    pump(client, server, shared);
    if let Ok(backwards) = backwards {
        let _ = backwards.join();
    }
    lock(&shared.connections).remove(&id);
}

/// Copies `from` to `to` until end of stream or an error, holding still while cut. The
/// read blocks (no polling while idle): bytes it returns after a cut began are held until
/// the cut heals, and `Drop` ends it by shutting the sockets down.
fn pump(mut from: TcpStream, mut to: TcpStream, shared: &ProxyShared) {
    let mut buf = vec![0u8; 64 * 1024];
    let wait_while_cut = || {
        while shared.cut.load(Ordering::SeqCst) {
            if shared.closing.load(Ordering::SeqCst) {
                return false;
            }
            thread::sleep(PUMP_TICK);
        }
        !shared.closing.load(Ordering::SeqCst)
    };
    loop {
        if !wait_while_cut() {
            return;
        }
        match from.read(&mut buf) {
            Ok(0) => {
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
            // Read after a cut began: held until it heals.
            Ok(n) => {
                if !wait_while_cut() {
                    return;
                }
                if to.write_all(&buf[..n]).is_err() {
                    let _ = from.shutdown(Shutdown::Both);
                    return;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) => {}
            Err(_) => {
                let _ = to.shutdown(Shutdown::Both);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn pg_cluster_survives_an_immediate_stop_and_goes_away_on_drop() {
        let started = Instant::now();
        let Some(cluster) = PgCluster::start_or_skip() else {
            return;
        };
        let startup = started.elapsed();
        assert_eq!(cluster.psql("select 1").expect("select 1"), "1");
        assert_eq!(
            cluster.psql("show fsync").expect("show fsync"),
            "on",
            "the durability tests need fsync"
        );
        assert_eq!(cluster.psql("show max_connections").expect("show"), "200");
        assert_eq!(
            cluster.psql("show listen_addresses").expect("show"),
            "127.0.0.1"
        );
        cluster
            .create_database("opj test")
            .expect("create database");
        assert_eq!(
            cluster
                .psql("select count(*) from pg_database where datname = 'opj test'")
                .expect("pg_database"),
            "1"
        );
        assert!(cluster.url_for("opj test").ends_with("/opj%20test"));
        assert_eq!(
            cluster.url(),
            format!("postgres://postgres@127.0.0.1:{}/postgres", cluster.port())
        );
        cluster
            .psql("create table t (x int); insert into t values (7)")
            .expect("a committed row");

        let port = cluster.port();
        cluster.stop_immediate().expect("stop -m immediate");
        assert!(!cluster.is_running());
        assert!(cluster.psql("select 1").is_err(), "the server is stopped");
        assert!(TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_err());
        let restarted = Instant::now();
        cluster.start_again().expect("start again");
        let restart = restarted.elapsed();
        assert_eq!(cluster.port(), port);
        assert_eq!(
            cluster
                .psql("select x from t")
                .expect("the row after a crash"),
            "7"
        );
        let _ = writeln!(
            io::stderr(),
            "pg: cluster started in {startup:?} (initdb and start), restarted after -m immediate in {restart:?}"
        );

        let dir = cluster.data_dir();
        assert!(dir.is_dir());
        drop(cluster);
        assert!(!dir.exists(), "drop removes the directory");
        assert!(
            TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_err(),
            "drop stops the server"
        );
    }

    #[test]
    fn pg_clusters_run_side_by_side() {
        let Some(a) = PgCluster::start_or_skip() else {
            return;
        };
        let Some(b) = PgCluster::start_or_skip() else {
            return;
        };
        assert_ne!(a.port(), b.port());
        a.psql("create table only_in_a (x int)")
            .expect("a table in a");
        assert_eq!(
            b.psql("select count(*) from pg_tables where tablename = 'only_in_a'")
                .expect("b"),
            "0"
        );
    }

    /// An echo server on a loopback port, one thread per connection.
    fn echo_server() -> u16 {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind echo");
        let port = listener.local_addr().expect("echo address").port();
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = stream.read(&mut buf) {
                        if n == 0 || stream.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        port
    }

    fn read_some(stream: &mut TcpStream) -> io::Result<Vec<u8>> {
        let mut buf = [0u8; 64];
        let n = stream.read(&mut buf)?;
        Ok(buf[..n].to_vec())
    }

    fn is_timeout(e: &io::Error) -> bool {
        matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        )
    }

    #[test]
    fn pg_proxy_forwards_goes_silent_when_cut_and_delivers_after_heal() {
        let proxy = TcpProxy::start(echo_server());
        let mut conn =
            TcpStream::connect((Ipv4Addr::LOCALHOST, proxy.port())).expect("connect to proxy");
        conn.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        conn.write_all(b"ping").expect("write");
        assert_eq!(read_some(&mut conn).expect("echo"), b"ping");
        assert_eq!(proxy.connections(), 1);

        proxy.cut();
        assert!(proxy.is_cut());
        conn.write_all(b"lost?").expect("writes still succeed");
        conn.set_read_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
        let err = read_some(&mut conn).expect_err("silence while cut");
        assert!(is_timeout(&err), "a timeout, not a reset: {err}");
        // A connection made during the cut is accepted and silent too.
        let mut late = TcpStream::connect((Ipv4Addr::LOCALHOST, proxy.port())).expect("connect");
        late.set_read_timeout(Some(Duration::from_millis(100)))
            .expect("timeout");
        late.write_all(b"late").expect("write");
        let err = read_some(&mut late).expect_err("silence while cut");
        assert!(is_timeout(&err), "{err}");

        proxy.heal();
        conn.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        late.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        assert_eq!(read_some(&mut conn).expect("held bytes"), b"lost?");
        assert_eq!(read_some(&mut late).expect("held bytes"), b"late");

        drop(proxy);
        // The proxy closed the connection: end of stream (or a reset), not silence.
        match read_some(&mut conn) {
            Ok(bytes) => assert!(bytes.is_empty(), "{bytes:?}"),
            Err(e) => assert!(!is_timeout(&e), "{e}"),
        }
    }

    #[test]
    fn pg_proxy_carries_psql_to_a_cluster() {
        let Some(cluster) = PgCluster::start_or_skip() else {
            return;
        };
        let proxy = TcpProxy::start(cluster.port());
        let mut cmd = Command::new(cluster.bin_dir().join("psql"));
        cmd.args(["-X", "-A", "-t", "-h", "127.0.0.1", "-U", "postgres"])
            .arg("-p")
            .arg(proxy.port().to_string())
            .args(["-c", "select 40 + 2"]);
        assert_eq!(run(cmd, "psql").expect("through the proxy").trim(), "42");
    }
}
