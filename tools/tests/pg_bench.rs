//! Smoke test: `pg_bench --quick` builds and runs against a private server (a few seconds
//! of work, 1 and 2 clients over 1 and 2 processes). Without PostgreSQL it skips, unless
//! `OPJOURNAL_PG_REQUIRED=1` (CI), as the backend's own tests do (testkit/src/pg.rs).

use std::process::Command;

use opjournal_testkit::pg::PgCluster;

#[test]
fn pg_bench_quick_runs_both_engines() {
    if let Err(why) = PgCluster::available() {
        assert!(
            !PgCluster::required(),
            "PostgreSQL is required (OPJOURNAL_PG_REQUIRED) but unavailable: {why}"
        );
        eprintln!("skipped pg_bench_quick_runs_both_engines: {why}");
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_pg_bench"))
        .args(["--quick", "--seconds", "0.3", "--clients", "1,2"])
        .args(["--processes", "1,2"])
        .output()
        .expect("pg_bench runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "pg_bench failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    for want in [
        "## Commit rate of the server",
        "| 1 clients / 1 proc |",
        "| 2 clients / 2 proc |",
        "## Replay",
        "errors: 0;",
    ] {
        assert!(stdout.contains(want), "no `{want}` in:\n{stdout}");
    }
}
