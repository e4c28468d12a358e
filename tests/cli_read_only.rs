//! The CLI's read-only promise for the commands `tests/cli.rs` does not byte-check
//! (`export --dump`, `log --follow`, `backup`), on both files of a journal: the journal
//! file and its log (`FileLog::path_for`), where a writer's latest commits are. Each runs
//! on a journal closed cleanly (no log, and none may appear), on a journal whose writer
//! (an editor, in this test's process; the CLI is another process) has it open with
//! commits in its log, and on the files a crash left (a log and a file not closed
//! cleanly, no writer). Also the exit status of `repair --dry-run` (docs/cli.md: 1 when
//! the repair would change something, 0 when it would not).

mod cli_support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use cli_support::*;
use opjournal::FileLog;

/// The bytes of the journal file and of its log (`None`: no log).
fn files(path: &Path) -> (Vec<u8>, Option<Vec<u8>>) {
    let log = FileLog::path_for(path);
    (
        std::fs::read(path).expect("the journal file is readable"),
        log.exists()
            .then(|| std::fs::read(&log).expect("the log is readable")),
    )
}

/// The names in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("readable directory")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

/// Runs `export --dump`, `log --follow` (for a while, then killed) and `backup` on the
/// journal at `path`, each asserted to have done its work (the dump holding `in_dump`),
/// and asserts after each that both files are byte for byte as before and nothing was
/// written beside them.
fn read_only_commands_leave_both_files_unchanged(path: &Path, situation: &str, in_dump: &str) {
    let p = path_str(path);
    let dir = path.parent().expect("a directory");
    let before = files(path);
    let names = listing(dir);
    let unchanged = |what: &str| {
        let after = files(path);
        assert!(
            after.0 == before.0,
            "{situation}: {what} changed the journal file's bytes"
        );
        assert!(
            after.1 == before.1,
            "{situation}: {what} changed the log ({} before, {} after)",
            before
                .1
                .as_ref()
                .map_or("absent".into(), |l| format!("{} bytes", l.len())),
            after
                .1
                .as_ref()
                .map_or("absent".into(), |l| format!("{} bytes", l.len())),
        );
        assert_eq!(
            listing(dir),
            names,
            "{situation}: {what} wrote beside the file"
        );
    };

    let o = run(&["export", p, "--dump"]);
    assert_eq!(code(&o), 0, "{situation}: export --dump: {}", stderr(&o));
    assert!(
        stdout(&o).contains("\"type\":\"dump_end\"") && stdout(&o).contains(in_dump),
        "{situation}: the dump is complete and holds `{in_dump}`: {}",
        stdout(&o)
    );
    unchanged("export --dump");

    let events = follow_for(p, Duration::from_millis(700));
    assert!(
        events > 0,
        "{situation}: log --follow printed no event in its time"
    );
    unchanged("log --follow");

    let elsewhere = tempfile::tempdir().expect("tempdir");
    let dest = elsewhere.path().join("copy.opj");
    let o = run(&["backup", p, path_str(&dest)]);
    assert_eq!(code(&o), 0, "{situation}: backup: {}", stderr(&o));
    assert!(dest.exists(), "{situation}: the backup was written");
    unchanged("backup");
}

/// Runs `opjournal --json log FILE --follow`, waits for its first event, lets it poll for
/// `polling` more (it polls every 250 ms), then kills it; returns the events it printed.
/// Never waits more than 20 s for the first event.
fn follow_for(p: &str, polling: Duration) -> usize {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_opjournal"))
        .args(["--json", "log", p, "--follow"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("opjournal log --follow starts");
    let out = child.stdout.take().expect("its stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut events = 0;
    let first = rx.recv_timeout(Duration::from_secs(20));
    if let Ok(line) = &first {
        events += usize::from(line.contains("\"type\":\"event\""));
        let until = Instant::now() + polling;
        while let Some(left) = until.checked_duration_since(Instant::now()) {
            match rx.recv_timeout(left) {
                Ok(line) => events += usize::from(line.contains("\"type\":\"event\"")),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => break,
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    // It ended by itself: `--follow` never does.
                    let status = child.wait().expect("wait");
                    panic!("log --follow ended by itself: {status}");
                }
            }
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    events
}

/// The revision the writer commits in the tests below (into its log only), as the dump
/// shows it: the commands read the log.
const LOGGED: &str = "\"revision\":6";

#[test]
fn export_dump_log_follow_and_backup_leave_a_closed_journal_byte_identical_and_add_no_log() {
    let s = sample();
    assert!(
        !FileLog::path_for(&s.path).exists(),
        "a journal closed cleanly has no log"
    );
    read_only_commands_leave_both_files_unchanged(&s.path, "closed cleanly", "\"revision\":5");
}

#[test]
fn export_dump_log_follow_and_backup_leave_both_files_byte_identical_while_a_writer_has_them_open()
{
    let s = sample();
    let journal = s.open();
    // Commits in the log, not yet in the journal file: what the commands must read.
    journal.advance_revision("doc/readme", 6).expect("a commit");
    journal.flush().expect("flush");
    assert!(
        FileLog::path_for(&s.path).exists(),
        "an open journal has its log"
    );
    read_only_commands_leave_both_files_unchanged(&s.path, "a writer has it open", LOGGED);
    // The writer was not disturbed: it still commits, and its commits are still read.
    journal
        .advance_revision("doc/readme", 7)
        .expect("the writer commits after the commands");
    drop(journal);
}

#[test]
fn export_dump_log_follow_and_backup_leave_a_crashed_journal_and_its_log_byte_identical() {
    let s = sample();
    let crashed: PathBuf = s.dir.path().join("crashed").join("project.opj");
    std::fs::create_dir(crashed.parent().expect("a parent")).expect("a directory");
    {
        let journal = s.open();
        journal.advance_revision("doc/readme", 6).expect("a commit");
        // Nothing of the writer's is still writing in the background.
        journal.flush().expect("flush");
        // The process dies here: its files as it leaves them.
        std::fs::copy(&s.path, &crashed).expect("copy the journal");
        std::fs::copy(FileLog::path_for(&s.path), FileLog::path_for(&crashed))
            .expect("copy the log");
    }
    read_only_commands_leave_both_files_unchanged(&crashed, "left by a crash", LOGGED);
}

/// docs/cli.md: exit 1 when "`repair --dry-run` would change something", 0 when not; and
/// the dry run writes nothing either way. An intact journal: 0. A copy with one byte of a
/// stored result changed (a CRC mismatch the repair would quarantine, losing the result):
/// 1, naming the record.
#[test]
fn repair_dry_run_exits_1_when_the_repair_would_change_something_and_0_when_not() {
    let s = sample();
    let p = path_str(&s.path);
    let before = files(&s.path);
    let names = listing(s.dir.path());
    let o = run(&["repair", p, "--dry-run"]);
    assert_eq!(
        code(&o),
        0,
        "an intact journal: {}{}",
        stdout(&o),
        stderr(&o)
    );
    assert!(files(&s.path) == before, "the dry run changed the file");
    assert_eq!(
        listing(s.dir.path()),
        names,
        "the dry run wrote beside the file"
    );

    // The damaged copy: one byte of `op_long`'s result (stored in the `results` table).
    let mut bytes = before.0.clone();
    let needle = b"line 01: the quick brown fox";
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("the result's bytes are in the file");
    bytes[at + 3] ^= 0x20;
    std::fs::write(&s.path, &bytes).expect("write the damaged copy");
    let o = run(&["--json", "repair", p, "--dry-run"]);
    assert_eq!(code(&o), 1, "a damaged copy: {}{}", stdout(&o), stderr(&o));
    let lines = json_lines(&o);
    assert!(
        lines
            .iter()
            .any(|(t, d)| t == "quarantined" && d["table"] == "results"),
        "the damaged result is reported: {}",
        stdout(&o)
    );
    let summary = &lines.last().expect("a summary").1;
    assert_eq!(summary["ok"], false, "{summary}");
    assert_eq!(summary["dry_run"], true, "{summary}");
    assert!(
        files(&s.path) == (bytes, None),
        "the dry run changed the damaged file"
    );
    assert_eq!(
        listing(s.dir.path()),
        names,
        "the dry run wrote beside the file"
    );
}
