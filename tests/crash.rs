//! Seeded power-cut and fault runs (issue 5).
//!
//! Each run drives a random workload (submit, complete, fail, release, extend, resolve,
//! deliver, acknowledge, advance revision, clock jumps, compaction, flush) against a journal
//! on a fault-injecting disk and against the reference model, in lockstep. At a random
//! moment it injects a fault (EIO or ENOSPC on the Nth write, set_len or sync, once or from
//! then on) or cuts the power (mid-operation or between calls; each unsynced write kept,
//! dropped or torn at 512-byte granularity), reopens, and checks:
//!
//! 1. every call that returned `Ok` and is durable is present after recovery;
//! 2. no effect is applied twice (the fake editor counts applications per id);
//! 3. no call that returned `Err` left partial state (the journal equals the state before
//!    or after the call, never a mix);
//! 4. every stored record passes CRC and decode, redb's integrity check passes, and every
//!    index equals the replay of the event journal (`Inspector::verify`);
//! 5. operations `Running` at the cut are `InDoubt`, never silently re-runnable.
//!
//! `OPJ_CRASH_RUNS` sets the number of runs (default 1000); `OPJ_SEED=<seed>` replays one
//! run with its steps printed. A failing run prints its seed.

mod support;

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use opjournal::{ErrorKind, ManualClock, Sharing, Timestamp};
use support::driver::{Rng, Stepped, T0, Workload, WorkloadStats, config_for};
use support::fault_backend::{
    CutPolicy, DiskStats, EIO, ENOSPC, FaultAction, FaultDisk, IoKind, Trigger,
};
use support::images::{open, verify_image};
use support::model::ModelConfig;

/// The first seed of the default runs (any fixed value; runs use `BASE + i`).
const BASE_SEED: u64 = 0x0A11_CE5E_ED00_0000;

/// Figures of one or many runs.
#[derive(Clone, Copy, Debug, Default)]
struct Figures {
    runs: u64,
    /// I/O errors injected (EIO/ENOSPC) and power cuts in the middle of an operation.
    faults: u64,
    /// Episodes ended by a power cut (mid-operation or between calls).
    power_cuts: u64,
    process_crashes: u64,
    clean_closes: u64,
    open_faults: u64,
    verified_images: u64,
    workload: WorkloadStats,
}

impl Figures {
    fn add(&mut self, o: &Figures) {
        self.runs += o.runs;
        self.faults += o.faults;
        self.power_cuts += o.power_cuts;
        self.process_crashes += o.process_crashes;
        self.clean_closes += o.clean_closes;
        self.open_faults += o.open_faults;
        self.verified_images += o.verified_images;
        self.workload.add(&o.workload);
    }
}

fn random_trigger(rng: &mut Rng) -> Trigger {
    let kind = match rng.below(20) {
        0..=9 => IoKind::Write,
        10..=17 => IoKind::Sync,
        _ => IoKind::SetLen,
    };
    let nth = match kind {
        IoKind::Write => 1 + rng.below(24),
        IoKind::Sync => 1 + rng.below(6),
        IoKind::SetLen => 1 + rng.below(2),
    };
    let action = match rng.below(10) {
        0..=2 => FaultAction::PowerCut,
        3..=5 => FaultAction::Fail {
            errno: EIO,
            persistent: false,
        },
        6..=7 => FaultAction::Fail {
            errno: EIO,
            persistent: true,
        },
        8 => FaultAction::Fail {
            errno: ENOSPC,
            persistent: false,
        },
        _ => FaultAction::Fail {
            errno: ENOSPC,
            persistent: true,
        },
    };
    Trigger { kind, nth, action }
}

fn cut_policy(rng: &mut Rng) -> CutPolicy {
    match rng.below(5) {
        0 => CutPolicy::KeepAll,
        1 => CutPolicy::DropAll,
        _ => CutPolicy::Random,
    }
}

/// How an episode ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    /// The journal is dropped normally.
    Clean,
    /// The process dies; the OS keeps every write (page cache).
    ProcessCrash,
    /// The power fails; unsynced writes are kept, dropped or torn.
    PowerCut(CutPolicy),
}

/// One seeded run. `Err` describes the violation (with the recent steps).
fn run(seed: u64, verbose: bool) -> Result<Figures, String> {
    let mut figures = Figures {
        runs: 1,
        ..Figures::default()
    };
    let mut orng = Rng::new(seed ^ 0xFA17_0000_0000_0001);
    let cfg = config_for(seed, Sharing::Exclusive);
    let clock = ManualClock::new(Timestamp::from_millis(T0));
    let mut w = Workload::new(seed, cfg.clone(), clock.clone());
    w.set_verbose(verbose);
    w.note(format!("config {cfg:?}"));
    let mut disk = FaultDisk::new();
    let mut journal = Some(open(&cfg, &clock, &disk).map_err(|e| format!("create: {e}"))?);
    let episodes = 1 + orng.below(3);
    let fail = |w: &Workload, msg: String| -> String {
        format!("{msg}\n--- last steps ---\n{}", w.tail(60))
    };
    for episode in 0..episodes {
        let steps = 8 + orng.below(32);
        let fault_at = orng.chance(65).then(|| orng.below(steps));
        let trigger = random_trigger(&mut orng);
        let mut fault_fired = false;
        let j = journal
            .as_ref()
            .ok_or_else(|| "no journal open".to_string())?;
        for s in 0..steps {
            if Some(s) == fault_at {
                w.note(format!("ARM {trigger:?}"));
                disk.arm(trigger);
            }
            let fired_before = disk.fired();
            let stepped = w.step(j).map_err(|e| fail(&w, e))?;
            if !fired_before && disk.fired() {
                fault_fired = true;
                w.note(format!("fault fired: {trigger:?}"));
                if let Stepped::Ok { .. } | Stepped::Refused = stepped {
                    return Err(fail(
                        &w,
                        format!(
                            "a fault ({trigger:?}) fired during a call that returned {stepped:?}: the caller was not told"
                        ),
                    ));
                }
            }
            if disk.is_dead() {
                break;
            }
            if w.poisoned() {
                // The poisoned handle must refuse writes; then the process restarts.
                for _ in 0..1 + orng.below(3) {
                    w.step(j).map_err(|e| fail(&w, e))?;
                }
                break;
            }
            if s % 8 == 7 {
                w.check(j)
                    .map_err(|e| fail(&w, format!("in-session check: {e}")))?;
            }
        }
        // Never retry an fsync on a handle that saw an I/O error.
        let stats: DiskStats = disk.stats();
        if stats.syncs_after_fault > 0 && !disk.is_dead() {
            return Err(fail(
                &w,
                format!(
                    "the handle attempted {} sync(s) after a fault",
                    stats.syncs_after_fault
                ),
            ));
        }
        // How the episode ends.
        let end = if disk.is_dead() {
            End::PowerCut(cut_policy(&mut orng))
        } else {
            match orng.below(10) {
                0..=2 => End::Clean,
                3..=5 => End::ProcessCrash,
                _ => End::PowerCut(cut_policy(&mut orng)),
            }
        };
        let end = if fault_fired && end == End::Clean {
            End::ProcessCrash
        } else {
            end
        };
        w.note(format!("episode {episode} ends: {end:?}"));
        let image = match end {
            End::Clean => {
                journal = None;
                figures.clean_closes += 1;
                if !disk.fired() {
                    // Closing commits the pending deliveries and acknowledgements.
                    w.recovery.closed_cleanly();
                }
                disk.live_image()
            }
            End::ProcessCrash => {
                let image = disk.live_image();
                disk.cut();
                journal = None;
                figures.process_crashes += 1;
                image
            }
            End::PowerCut(policy) => {
                disk.cut();
                journal = None;
                figures.power_cuts += 1;
                disk.power_cut_image(policy, &mut || orng.next_u64())
            }
        };
        figures.faults += disk.stats().faults;
        verify_image(&image).map_err(|e| fail(&w, format!("after {end:?}: {e}")))?;
        figures.verified_images += 1;
        // Reopen, sometimes with a fault during recovery itself.
        disk = FaultDisk::from_image(image);
        w.model.before_reopen();
        if orng.chance(10) {
            let t = random_trigger(&mut orng);
            w.note(format!("ARM during open {t:?}"));
            disk.arm(t);
            match open(&cfg, &clock, &disk) {
                Ok(j) => {
                    w.note("open survived the armed fault".into());
                    journal = Some(j);
                }
                Err(e) => {
                    figures.open_faults += 1;
                    w.note(format!("open failed under fault: {e}"));
                    let image = if disk.is_dead() || orng.chance(50) {
                        disk.cut();
                        disk.power_cut_image(cut_policy(&mut orng), &mut || orng.next_u64())
                    } else {
                        disk.live_image()
                    };
                    figures.faults += disk.stats().faults;
                    verify_image(&image)
                        .map_err(|e| fail(&w, format!("after a failed open: {e}")))?;
                    disk = FaultDisk::from_image(image);
                }
            }
        }
        if journal.is_none() {
            journal = Some(open(&cfg, &clock, &disk).map_err(|e| {
                fail(
                    &w,
                    format!("reopen after {end:?} failed: {e} ({:?})", e.kind()),
                )
            })?);
        }
        let j = journal
            .as_ref()
            .ok_or_else(|| "no journal open".to_string())?;
        w.after_reopen(j)
            .map_err(|e| fail(&w, format!("after {end:?}, recovery does not match: {e}")))?;
    }
    // Close cleanly and check the final file too.
    drop(journal);
    figures.faults += disk.stats().faults;
    verify_image(&disk.live_image()).map_err(|e| fail(&w, format!("final image: {e}")))?;
    figures.verified_images += 1;
    figures.workload = w.stats;
    Ok(figures)
}

fn summary(f: &Figures) -> String {
    let w = &f.workload;
    format!(
        "crash runs: {} runs; faults injected: {} (I/O errors and mid-operation power cuts; {} during recovery); episodes ended by {} power cuts, {} process crashes, {} clean closes; {} calls ({} failed with the outcome unknown, {} refused by a poisoned handle); {} reopens checked; acknowledged durable calls checked: {}; lazily durable or uncertain states lost (allowed): {}; running at the cut and found in doubt: {}; effects applied: {}; images verified: {}; violations: 0",
        f.runs,
        f.faults,
        f.open_faults,
        f.power_cuts,
        f.process_crashes,
        f.clean_closes,
        w.calls,
        w.failures,
        w.poisoned_refusals,
        w.reopens,
        w.acked_checked,
        w.maybe_lost,
        w.running_at_cut,
        w.applications,
        f.verified_images
    )
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => v.parse().ok(),
    }
}

fn replay_hint(seed: u64) -> String {
    format!(
        "replay with: OPJ_SEED={seed:#x} cargo test --test crash seeded_power_cuts_and_faults_keep_every_invariant -- --nocapture"
    )
}

/// Runs `runs` seeds from `base` on every core; returns the figures or every failure.
fn run_many(base: u64, runs: u64) -> Result<Figures, Vec<String>> {
    let next = AtomicU64::new(0);
    let total = Mutex::new(Figures::default());
    let failures = Mutex::new(Vec::new());
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= runs {
                        return;
                    }
                    let seed = base.wrapping_add(i);
                    let r = std::panic::catch_unwind(|| run(seed, false));
                    match r {
                        Ok(Ok(f)) => total.lock().unwrap_or_else(|e| e.into_inner()).add(&f),
                        Ok(Err(e)) => failures
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(format!("seed {seed:#x}: {e}\n{}", replay_hint(seed))),
                        Err(_) => failures
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(format!("seed {seed:#x}: PANIC\n{}", replay_hint(seed))),
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap_or_else(|e| e.into_inner());
    if failures.is_empty() {
        Ok(total.into_inner().unwrap_or_else(|e| e.into_inner()))
    } else {
        Err(failures)
    }
}

#[test]
fn seeded_power_cuts_and_faults_keep_every_invariant() {
    if let Some(seed) = env_u64("OPJ_SEED") {
        match run(seed, true) {
            Ok(f) => eprintln!("seed {seed:#x} passed: {f:?}"),
            Err(e) => panic!("seed {seed:#x} failed: {e}"),
        }
        return;
    }
    let runs = env_u64("OPJ_CRASH_RUNS").unwrap_or(1000);
    let base = env_u64("OPJ_CRASH_BASE").unwrap_or(BASE_SEED);
    match run_many(base, runs) {
        Ok(f) => {
            eprintln!("{}", summary(&f));
            assert!(f.runs == runs, "every run reported");
            assert!(
                f.workload.acked_checked > 0 && f.faults > 0,
                "the runs checked acknowledged calls and injected faults: {f:?}"
            );
        }
        Err(failures) => {
            let n = failures.len();
            let shown: Vec<&String> = failures.iter().take(3).collect();
            panic!(
                "{n} of {runs} runs violated an invariant; first ones:\n{}",
                shown
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join("\n\n")
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// Named claims, each on a fixed scenario.
// ---------------------------------------------------------------------------------------

#[test]
fn fsync_error_poisons_the_handle_and_reopen_answers_every_operation() -> opjournal::Result<()> {
    use opjournal::{Admission, Intent, Operation, Outcome};
    let cfg = ModelConfig::small();
    let clock = ManualClock::new(Timestamp::from_millis(T0));
    let disk = FaultDisk::new();
    let j = open(&cfg, &clock, &disk)?;
    let intent = Intent::from_json("scene.edit", &serde_json::json!({"n": 1}))?;
    let op = Operation::new("op-a", intent.clone()).scope("s");
    let Admission::Fresh(claim) = j.submit(op.clone())? else {
        panic!("expected fresh work")
    };
    disk.arm(Trigger {
        kind: IoKind::Sync,
        nth: 1,
        action: FaultAction::Fail {
            errno: EIO,
            persistent: false,
        },
    });
    let err = j
        .complete(&claim, Outcome::applied(1, b"r".to_vec()))
        .expect_err("the commit's fsync failed, so the caller must be told");
    assert!(matches!(err.kind(), ErrorKind::Io), "{err:?}");
    assert!(
        j.is_poisoned(),
        "the handle is poisoned after an fsync error"
    );
    // The disk works again, but the handle must not retry: every write is refused.
    let again = j
        .advance_revision("s", 9)
        .expect_err("poisoned handles refuse writes");
    assert!(matches!(again.kind(), ErrorKind::Poisoned), "{again:?}");
    assert_eq!(
        disk.stats().syncs_after_fault,
        0,
        "no fsync retried on the handle"
    );
    drop(j);
    // The OS kept the page cache: the commit may have landed; either way the answer is
    // coherent and the retry is safe.
    for image in [
        disk.live_image(),
        disk.power_cut_image(CutPolicy::DropAll, &mut || 0),
    ] {
        verify_image(&image).map_err(|e| opjournal::Error::from(std::io::Error::other(e)))?;
        let d = FaultDisk::from_image(image);
        let j = open(&cfg, &clock, &d)?;
        match j.submit(op.clone())? {
            Admission::Replay(r) => assert_eq!(r.result.bytes, b"r"),
            Admission::InDoubt(r) => {
                assert_eq!(r.in_doubt_cause, Some(opjournal::InDoubtCause::Reopened));
                j.resolve("op-a", opjournal::Resolution::applied(1, b"r".to_vec()))?;
            }
            other => panic!(
                "after an fsync error the operation is replayed or in doubt, never {other:?}"
            ),
        }
        assert!(
            matches!(j.submit(op.clone())?, Admission::Replay(_)),
            "the retry is answered from the record"
        );
    }
    Ok(())
}

#[test]
fn power_cut_during_commit_keeps_the_previous_commit_intact() -> opjournal::Result<()> {
    use opjournal::{Admission, Intent, Operation};
    let cfg = ModelConfig::small();
    let clock = ManualClock::new(Timestamp::from_millis(T0));
    let mut torn_runs = 0;
    for nth in 1..12 {
        let disk = FaultDisk::new();
        let j = open(&cfg, &clock, &disk)?;
        let intent = Intent::from_json("scene.edit", &serde_json::json!({}))?;
        let first = Operation::new("first", intent.clone());
        assert!(matches!(j.submit(first.clone())?, Admission::Fresh(_)));
        disk.arm(Trigger {
            kind: IoKind::Write,
            nth,
            action: FaultAction::PowerCut,
        });
        let second = j.submit(Operation::new("second", intent.clone()));
        let cut = disk.is_dead();
        if cut {
            assert!(
                second.is_err(),
                "a cut commit does not return Ok: {second:?}"
            );
            torn_runs += 1;
        }
        drop(j);
        let mut seed = nth;
        let image = disk.power_cut_image(CutPolicy::Random, &mut || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            seed >> 33
        });
        verify_image(&image).map_err(|e| opjournal::Error::from(std::io::Error::other(e)))?;
        let j = open(&cfg, &clock, &FaultDisk::from_image(image))?;
        let r = j
            .lookup("first")?
            .expect("the acknowledged submit survives");
        assert_eq!(r.status, opjournal::ExecutionStatus::InDoubt);
        if let Some(s) = j.lookup("second")? {
            assert_eq!(s.status, opjournal::ExecutionStatus::InDoubt, "{s:?}");
        }
    }
    assert!(torn_runs > 0, "the sweep cut at least one commit");
    let _ = Duration::ZERO;
    Ok(())
}

/// Seeds that found bugs, replayed on every run of the suite (they are also inside the
/// default range; this keeps them if the range or the workload changes):
/// - `0xa11ce5eed00008b`: a lazily recorded acknowledgement was committed at the time of
///   the next batch, after its deadline (`lazy_acknowledgement_is_committed_with_the_time_it_was_made`);
/// - `0xa11ce5eed0000c5`: `due_redeliveries` missed a delivery not yet committed
///   (`due_redeliveries_follow_a_delivery_not_yet_committed`);
/// - `0xa11ce5eed000676`, `0xa11ce5eed000696`, `0xa11ce5eed0003e5`, `0xa11ce5eed000405`:
///   `0xa11ce5eed000a50`: seeds that exercised lazy writes around no-op commits, a
///   compaction failing part way (then either in-doubt cause), and a backwards clock (the
///   model's corner cases).
#[test]
fn seeds_that_found_bugs_replay_clean() {
    for offset in [
        0x08b, 0x0c5, 0x676, 0x696, 0x3e5, 0x405, 0x059, 0x4f2, 0xa50,
    ] {
        let seed = BASE_SEED + offset;
        if let Err(e) = run(seed, false) {
            panic!("seed {seed:#x}: {e}\n{}", replay_hint(seed));
        }
    }
}
