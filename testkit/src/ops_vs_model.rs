//! `ops_vs_model`: an arbitrary sequence of API calls against the reference model
//! (`testkit/src/model.rs`), on a disk in memory that holds the journal's two files (the
//! redb file and the log) and injects I/O errors and power cuts
//! (`testkit/src/fault_backend.rs`), in the default configuration.
//!
//! Every public operation is reachable: submit (fresh, resubmitted, other intent, stale
//! base, busy scope, full window, bad input), complete (applied, failed, too large, not
//! forward), release, extend the lease, resolve, delivered, acknowledge, advance a
//! revision, lookup, result, undelivered, in_doubt, due redeliveries, compact, flush;
//! clock jumps forward and back; clean close and reopen; process crash and power cut
//! (unsynced writes of either file kept, dropped or torn), also right after a clean close
//! (the log's removal lost); an I/O error (EIO or ENOSPC, once or from then on) or a power
//! cut armed at the Nth write, length change or sync of the log, the redb file or any file.
//! Half the inputs keep the log in two files, as a journal file does (each cycle in the file
//! the cycle before did not use; [`Input::two_logs`]), the others in one.
//! Half the setups use the smallest checkpoint size with large results, so checkpoints
//! (and faults during them) come every few calls.
//!
//! Claims checked:
//! - every answer is the model's (a value or a predicted refusal), and a full comparison
//!   of every observable state (`Model::check_against`) holds when asked;
//! - exactly once: the fake editor applies an effect only under a `Fresh` claim, and the
//!   journal never hands out `Fresh` again for an id whose effect was applied and whose
//!   audit record has not aged out; a `Replay` carries the recorded result (compared by
//!   the model) and is marked as a replay;
//! - a fault never goes unreported (a call during which a fault on the log fired does not
//!   return `Ok`; one during a checkpoint, after the call's record was synced, poisons the
//!   handle), a failed commit poisons the handle, a poisoned handle refuses writes and
//!   never syncs the failed file again;
//! - after every reopen the journal equals one state the crash may have left (every
//!   durable `Ok` kept, never a mix), and effects the editor applied are recorded or in
//!   doubt (never forgotten);
//! - `verify` finds the files clean, as a reader process sees them (written out, and left
//!   unchanged by it): after a crash in the middle of a redb write (a checkpoint), where
//!   only it can judge them, on every input; and after a clean close at the end of the
//!   input, on one input in four (sampled, see below).
//!
//! The costly parts are kept where they can find something. Every input starts from a
//! copy of one new journal made once per process, on the disk in memory. `verify` (redb's
//! page check of every page, every record, every index against the events) and the clean
//! close before it (a checkpoint and redb's close, two commits) cost about a third of an
//! input, so the end of an input is sampled: one input in four, chosen by its own bytes
//! (bits 2 and 3 of [`Setup::window`] zero, [`Input::verify_end`]), ends with a clean close
//! and `verify`; the others end as a process crash would (the disk cut, the handle
//! dropped), after the same final comparison with the model. A check is never skipped
//! where only it can judge: a crash in the middle of a redb write is verified on every
//! input, and a fault still pending at the end is recovered from (a reopen, compared with
//! the model) on every input. The stable tests run every committed input with
//! `verify_end` on ([`check_every_claim`]).
//!
//! The same sessions also run on a journal in memory (`JournalBuilder::open_in_memory`,
//! [`Backend::Memory`]), which has no disk: there a fault is never armed, and a clean
//! close, a crash or a power cut is a step that compares every observable state with the
//! model instead (nothing is lost, nothing to recover), so the answers of the journal in
//! memory are held to the same model several times faster. The fuzzer picks the backend
//! from bits of the input's first byte that the setup does not read ([`Input::backend`]);
//! the stable tests' committed inputs run on both ([`check_every_claim`]).
//!
//! With the feature `postgres`, the same sessions run on a journal in PostgreSQL
//! ([`Backend::Postgres`], a server the test names): as in memory, a fault is never armed
//! and a crash compares every observable state with the model; a clean reopen closes the
//! handle and opens the journal again from the database, and the model changes nothing
//! (the journal lives on: opening it marks nothing in doubt, since other processes may be
//! running its operations), so the claims held before complete on the new handle.
//!
//! The model and the disk are shared with the reliability tests; this file includes them
//! through the crate root (`crate::model`, `crate::fault_backend`).

use std::collections::BTreeMap;
use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use opjournal::{Claim, Journal, ManualClock, ScopeLock, Sharing, Timestamp};

use crate::fault_backend::{
    CutPolicy, DiskFile, DiskImage, EIO, ENOSPC, FaultAction, FaultDisk, IoKind, Trigger,
};
use crate::images::{open, verify_image};
use crate::model::{
    Call, ErrView, Model, ModelConfig, OpSpec, OutcomeSpec, Recovery, ResolutionSpec, StepResult,
};

/// Where every run's clock starts: 2026-01-01T00:00:00Z.
pub const T0: u64 = 1_767_225_600_000;
/// Operations per input, at most (longer inputs are cut).
pub const MAX_OPS: usize = 96;
/// Reopens per input, at most.
pub const MAX_REOPENS: usize = 6;

// Half the ids, one scope and one session longer than 23 bytes: the tables keep shorter
// strings inline and longer ones shared, and both must behave alike.
const IDS: [&str; 6] = [
    "op-0",
    "op-1",
    "op-2",
    "op-3-0f8fad5b-d9cb-469f-a165-70867728950e",
    "op-4-0f8fad5b-d9cb-469f-a165-70867728950e",
    "op-5-0f8fad5b-d9cb-469f-a165-70867728950e",
];
const SCOPES: [&str; 2] = ["scene/a", "scene/b/a-scope-name-of-some-length"];
const SESSIONS: [&str; 2] = ["tab-1", "tab-2-of-a-window-with-a-long-session-id"];

/// Where the session's journal keeps its tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The redb file and its log on the fault-injecting disk in memory: faults, crashes,
    /// power cuts and reopens as the input says.
    FaultDisk,
    /// A journal in memory (`JournalBuilder::open_in_memory`): nothing durable, no disk to
    /// fault; an input's reopens and crashes compare every observable state with the model.
    Memory,
    /// A journal in the PostgreSQL database at this URL (`JournalBuilder::open_postgres`),
    /// a fresh journal name per session: no disk to fault; a crash compares with the model,
    /// a reopen opens the journal again from the database.
    #[cfg(feature = "postgres")]
    Postgres(&'static str),
}

/// The journal's configuration, chosen by the input.
#[derive(Arbitrary, Debug, Clone)]
pub struct Setup {
    /// `ScopeLock::HoldUntilAck` instead of `Serial`.
    pub hold_until_ack: bool,
    /// Session window: 1 + this % 4. Bits 2 and 3 (this / 4 % 4 == 0, one input in four)
    /// select [`Input::verify_end`].
    pub window: u8,
    /// Compaction batch: 1 + this % 4; bit 4 makes compaction scan every receipt instead
    /// of looking up each due operation; from 128 on, also the smallest checkpoint size
    /// (64 KiB) with results of up to 16 KiB, so that a few completed operations fill the
    /// log and checkpoints (and faults during them) are frequent.
    pub batch: u8,
}

/// The largest result with small checkpoints.
const CHECKPOINTING_RESULT_BYTES: u64 = 16 << 10;

/// How a submit names its base revision.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Base {
    /// No base revision.
    None,
    /// The scope's current revision.
    Current,
    /// One behind (stale unless allowed).
    Behind,
    /// Ahead of the scope.
    Ahead,
}

/// A fault to arm on the disk.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub struct Fault {
    /// Write, set_len or sync (this % 3), of any file, the log or the redb file
    /// (this / 3 % 3).
    pub kind: u8,
    /// Which one fires (1 + this % 24), counted from now. With two log files, bit 7 moves a
    /// trigger on the log to its second file.
    pub nth: u8,
    /// EIO or ENOSPC, once or persistent, or a power cut.
    pub action: u8,
}

/// One step of the fuzzed session.
#[derive(Arbitrary, Debug, Clone)]
pub enum Op {
    /// `submit` of one of six ids.
    Submit {
        /// Which id.
        id: u8,
        /// Which scope (or none).
        scope: u8,
        /// Which session (or none).
        session: u8,
        /// The base revision.
        base: Base,
        /// A different intent under the same id.
        other_intent: bool,
        /// `allow_stale_base()`.
        allow_stale: bool,
    },
    /// `submit` with an invalid id, scope or session (refused, writes nothing).
    SubmitInvalid {
        /// Which input is bad and how.
        which: u8,
    },
    /// The editor applies the effect of a claim it holds (no journal call).
    ApplyEffect {
        /// Which claim.
        pick: u8,
    },
    /// `complete(applied)` of a claim whose effect was applied.
    CompleteApplied {
        /// Which claim.
        pick: u8,
    },
    /// `complete(failed)` of a claim (with or without an effect).
    CompleteFailed {
        /// Which claim.
        pick: u8,
    },
    /// `release` of a claim whose effect was not applied.
    Release {
        /// Which claim.
        pick: u8,
    },
    /// `extend_lease_by`.
    ExtendLease {
        /// Which claim.
        pick: u8,
        /// By how much.
        by: u8,
    },
    /// `resolve` an in-doubt operation as the editor knows it ended.
    Resolve {
        /// Which in-doubt id.
        pick: u8,
        /// Not applied or failed, when the effect was not applied.
        failed: bool,
    },
    /// Calls the model predicts to be refused: stale claims, resolving what is not in
    /// doubt, revisions not forward, results too large.
    Probe {
        /// Which kind.
        kind: u8,
        /// Which claim or id.
        pick: u8,
    },
    /// `delivered`.
    Delivered {
        /// Which id.
        id: u8,
    },
    /// `acknowledge`.
    Acknowledge {
        /// Which id.
        id: u8,
    },
    /// `advance_revision`.
    AdvanceRevision {
        /// Which scope.
        scope: u8,
        /// 0: current, 1: one behind, else ahead.
        delta: u8,
    },
    /// The clock jumps forward.
    ClockForward {
        /// Which jump.
        by: u8,
    },
    /// The clock jumps back (the journal must not follow).
    ClockBack {
        /// By how many milliseconds (at most 65 s).
        by: u16,
    },
    /// `compact`.
    Compact,
    /// `flush`.
    Flush,
    /// `lookup`, compared.
    Lookup {
        /// Which id.
        id: u8,
    },
    /// Every observable state compared with the model.
    CheckAll,
    /// Arm an I/O error or a power cut.
    ArmFault(Fault),
    /// Close cleanly and reopen.
    Reopen,
    /// The process dies (writes kept) or the power fails (unsynced writes kept, dropped or
    /// torn), then reopen.
    Crash {
        /// A power cut rather than a process crash.
        power: bool,
        /// Keep all, drop all, or each independently (this % 3); with a power cut, one in
        /// four (this / 3 % 4 == 3) closes the journal cleanly first, so the log's removal
        /// may be lost.
        policy: u8,
        /// Randomness for the torn writes.
        seed: u64,
    },
}

/// One fuzz input.
#[derive(Debug, Clone)]
pub struct Input {
    /// The backend: [`Backend::Memory`] when bits 1 and 2 of the first byte are both set
    /// (one input in four; [`Setup::hold_until_ack`] reads only bit 0 of that byte), else
    /// [`Backend::FaultDisk`].
    pub backend: Backend,
    /// The journal's configuration.
    pub setup: Setup,
    /// The session.
    pub ops: Vec<Op>,
    /// On the fault disk, whether the journal keeps its log in two files (bit 3 of the
    /// first byte, which the setup does not read), as a journal file does.
    pub two_logs: bool,
    /// Whether the input ends with a clean close and `verify` of the files (the costly
    /// end). From the input's bytes: one input in four ([`Setup::window`]).
    pub verify_end: bool,
}

/// Of every [`VERIFY_END_ONE_IN`] inputs, one ends with a clean close and `verify`.
pub const VERIFY_END_ONE_IN: u8 = 4;

impl Input {
    /// The setup, then one operation after another until the bytes run out (at most
    /// [`MAX_OPS`]). Unlike a derived `Vec`, no continuation byte sits between operations,
    /// so every byte the fuzzer adds at the end is one more step.
    pub fn from_bytes(data: &[u8]) -> Input {
        let mut u = Unstructured::new(data);
        let setup = Setup::arbitrary(&mut u).unwrap_or(Setup {
            hold_until_ack: false,
            window: 2,
            batch: 1,
        });
        let mut ops = Vec::new();
        while !u.is_empty() && ops.len() < MAX_OPS {
            match Op::arbitrary(&mut u) {
                Ok(op) => ops.push(op),
                Err(_) => break,
            }
        }
        let verify_end = (setup.window / 4).is_multiple_of(VERIFY_END_ONE_IN);
        let backend = match data.first() {
            Some(b) if b & 0b110 == 0b110 => Backend::Memory,
            _ => Backend::FaultDisk,
        };
        let two_logs = data.first().is_some_and(|b| b & 0b1000 != 0);
        Input {
            backend,
            setup,
            ops,
            two_logs,
            verify_end,
        }
    }
}

/// What a run did (for the stable test's coverage assertions).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Figures {
    /// Journal calls made.
    pub calls: u64,
    /// Predicted refusals.
    pub refusals: u64,
    /// Effects applied by the editor.
    pub applications: u64,
    /// Calls that failed with an injected fault.
    pub failures: u64,
    /// Writes refused by a poisoned handle.
    pub poisoned_refusals: u64,
    /// Reopens (clean, crash or power cut), each compared with the model.
    pub reopens: u64,
    /// Disk images verified (`verify` on the files, as a reader process sees them).
    pub verified: u64,
    /// Replays answered.
    pub replays: u64,
    /// Comparisons of every observable state with the model (the input's, and on the
    /// memory backend each reopen or crash step).
    pub comparisons: u64,
}

/// The editor's and the harness's state.
struct Session {
    cfg: ModelConfig,
    clock: ManualClock,
    model: Model,
    recovery: Recovery,
    /// The disk the journal's files are on; `None` for a journal in memory or in a
    /// database.
    disk: Option<FaultDisk>,
    /// A journal in a database: its URL and name, to open it again.
    #[cfg(feature = "postgres")]
    database: Option<(&'static str, String)>,
    journal: Option<Journal>,
    poisoned: bool,
    fault_armed: bool,
    /// The latest time a failed call read: `Recovery` judges every candidate state by it,
    /// so the clock must not be behind it at the reopen.
    failed_at: u64,
    /// Claims this process holds.
    claims: BTreeMap<String, Claim>,
    /// Effects applied, outcome not yet recorded: id → (revision, result bytes).
    effects: BTreeMap<String, (u64, Vec<u8>)>,
    /// Claims no longer current.
    old_claims: Vec<Claim>,
    /// Ids whose effect was applied: when the journal may forget the outcome (`None`:
    /// not recorded yet).
    applied: BTreeMap<String, Option<u64>>,
    figures: Figures,
    log: Vec<String>,
}

fn pick<T: Clone>(items: &[T], i: u8) -> Option<T> {
    if items.is_empty() {
        None
    } else {
        Some(items[usize::from(i) % items.len()].clone())
    }
}

fn trigger(f: Fault, two_logs: bool) -> Trigger {
    let kind = match f.kind % 3 {
        0 => IoKind::Write,
        1 => IoKind::Sync,
        _ => IoKind::SetLen,
    };
    let file = match (f.kind / 3) % 3 {
        0 => None,
        1 if two_logs && f.nth & 128 != 0 => Some(DiskFile::Log2),
        1 => Some(DiskFile::Log),
        _ => Some(DiskFile::Db),
    };
    let nth = 1 + u64::from(f.nth % 24);
    let action = match f.action % 6 {
        0 => FaultAction::PowerCut,
        1 => FaultAction::Fail {
            errno: EIO,
            persistent: false,
        },
        2 => FaultAction::Fail {
            errno: EIO,
            persistent: true,
        },
        3 => FaultAction::Fail {
            errno: ENOSPC,
            persistent: false,
        },
        _ => FaultAction::Fail {
            errno: ENOSPC,
            persistent: true,
        },
    };
    Trigger {
        kind,
        nth,
        action,
        file,
    }
}

impl Session {
    fn new(setup: &Setup, backend: Backend, two_logs: bool) -> Result<Session, String> {
        let mut cfg = ModelConfig::small();
        cfg.two_logs = two_logs;
        cfg.scope_lock = if setup.hold_until_ack {
            ScopeLock::HoldUntilAck
        } else {
            ScopeLock::Serial
        };
        cfg.session_window = 1 + u32::from(setup.window % 4);
        cfg.compaction_batch = 1 + usize::from(setup.batch % 4);
        cfg.compaction_scan = (setup.batch & 16 != 0).then_some(true);
        if setup.batch >= 128 {
            cfg.checkpoint_size = Some(64 << 10);
            cfg.max_result_bytes = CHECKPOINTING_RESULT_BYTES;
        }
        // The default configuration: on the fault disk, which takes byte-range locks, redb
        // runs its `SingleWriter` protocol, as on a file.
        cfg.sharing = Sharing::LiveReaders;
        let clock = ManualClock::new(Timestamp::from_millis(T0));
        #[cfg(feature = "postgres")]
        let database = match backend {
            Backend::Postgres(url) => {
                use std::sync::atomic::{AtomicU64, Ordering};
                static SESSIONS: AtomicU64 = AtomicU64::new(0);
                let n = SESSIONS.fetch_add(1, Ordering::Relaxed);
                Some((url, format!("model_{}_{n}", std::process::id())))
            }
            _ => None,
        };
        let (disk, journal) = match backend {
            Backend::FaultDisk => {
                let disk = FaultDisk::from_image(pristine()?);
                let journal = open(&cfg, &clock, &disk);
                (Some(disk), journal)
            }
            Backend::Memory => (None, cfg.builder(&clock).open_in_memory()),
            #[cfg(feature = "postgres")]
            Backend::Postgres(url) => {
                let name = database
                    .as_ref()
                    .map(|(_, n)| n.clone())
                    .unwrap_or_default();
                (None, cfg.builder(&clock).open_postgres(url, &name))
            }
        };
        let journal = journal.map_err(|e| format!("open: {e}"))?;
        let model = Model::new(cfg.clone(), clock.clone());
        let recovery = Recovery::new(&model);
        Ok(Session {
            cfg,
            clock,
            model,
            recovery,
            disk,
            #[cfg(feature = "postgres")]
            database,
            journal: Some(journal),
            poisoned: false,
            fault_armed: false,
            failed_at: 0,
            claims: BTreeMap::new(),
            effects: BTreeMap::new(),
            old_claims: Vec::new(),
            applied: BTreeMap::new(),
            figures: Figures::default(),
            log: Vec::new(),
        })
    }

    /// Drops the journal as a process that died leaves it, once the disk is cut (nothing
    /// can reach it any more): first a write, which fails on the dead disk and poisons the
    /// handle, so that closing does not build a checkpoint that cannot land; then the drop,
    /// during an unwind, when redb does not write its allocator state at close either. A
    /// dead process does neither, and building them took about a third of an input.
    /// (`resume_unwind` does not call the panic hook: no finding is reported.)
    fn abandon(&mut self) {
        debug_assert!(self.disk_is_dead(), "abandon before the disk is cut");
        let Some(j) = self.journal.take() else {
            return;
        };
        // Always a write while the handle is not poisoned (a revision ahead of any the
        // session reaches); its failure is not compared with the model: the journal is
        // gone.
        let _ = j.advance_revision(SCOPES[0], u64::MAX / 2);
        struct Abandoned;
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _dropped_while_unwinding = j;
            std::panic::resume_unwind(Box::new(Abandoned));
        }));
    }

    fn note(&mut self, line: String) {
        self.log.push(line);
    }

    /// Whether an armed fault fired on the disk (never, in memory).
    fn disk_fired(&self) -> bool {
        self.disk.as_ref().is_some_and(FaultDisk::fired)
    }

    /// Whether the power is off (never, in memory).
    fn disk_is_dead(&self) -> bool {
        self.disk.as_ref().is_some_and(FaultDisk::is_dead)
    }

    /// Compares every observable state of the journal with the model.
    fn compare(&mut self, what: &str) -> Result<(), String> {
        self.figures.comparisons += 1;
        let j = self.journal.take().ok_or("no journal open")?;
        let r = self.model.check_against(&j);
        self.journal = Some(j);
        r.map_err(|e| self.fail(format!("{what}: {e}")))
    }

    fn fail(&self, msg: String) -> String {
        let start = self.log.len().saturating_sub(40);
        format!(
            "{msg}\n--- config {:?}\n--- last steps ---\n{}",
            self.cfg,
            self.log[start..].join("\n")
        )
    }

    fn journal(&self) -> Result<&Journal, String> {
        self.journal
            .as_ref()
            .ok_or_else(|| "no journal open".to_string())
    }

    fn claimed(&self, with_effect: Option<bool>) -> Vec<String> {
        self.claims
            .keys()
            .filter(|id| with_effect.is_none_or(|e| self.effects.contains_key(*id) == e))
            .cloned()
            .collect()
    }

    fn op_spec(&self, id: u8, scope: u8, session: u8, base: Base, other: bool) -> OpSpec {
        let i = usize::from(id) % IDS.len();
        let scope = match scope % 3 {
            0 => None,
            s => Some(SCOPES[usize::from(s) - 1].to_string()),
        };
        let session = match session % 3 {
            0 => None,
            s => Some(SESSIONS[usize::from(s) - 1].to_string()),
        };
        let base_revision = match (&scope, base) {
            (Some(s), Base::Current) => Some(self.model.scope_revision(s)),
            (Some(s), Base::Behind) => Some(self.model.scope_revision(s).saturating_sub(1)),
            (Some(s), Base::Ahead) => Some(self.model.scope_revision(s) + 2),
            (None, Base::Current | Base::Behind | Base::Ahead) => Some(0),
            (_, Base::None) => None,
        };
        OpSpec {
            id: IDS[i].to_string(),
            intent_name: "scene.edit".into(),
            intent_args: serde_json::json!({ "target": i, "variant": u8::from(other) }),
            scope,
            session,
            base_revision,
            allow_stale: false,
        }
    }

    /// One input step. `Err` is a violated claim.
    fn step(&mut self, op: &Op) -> Result<(), String> {
        if self.disk_is_dead() {
            // The power is off: nothing else can happen before the reboot.
            return self.reopen(End::PowerCut(CutPolicy::Random), 0);
        }
        match op {
            #[cfg(feature = "postgres")]
            Op::Reopen if self.database.is_some() => return self.reopen_database(),
            Op::Reopen | Op::Crash { .. } | Op::ArmFault(_) if self.disk.is_none() => {
                // In memory there is nothing to fault, and nothing a restart would recover:
                // the journal must equal the model here, as it must after a reopen.
                self.note(format!("{op:?} on the memory backend: compare"));
                return self.compare(&format!("in memory, at {op:?}"));
            }
            Op::Reopen => return self.reopen(End::Clean, 0),
            Op::Crash {
                power,
                policy,
                seed,
            } => {
                let cut = match policy % 3 {
                    0 => CutPolicy::KeepAll,
                    1 => CutPolicy::DropAll,
                    _ => CutPolicy::Random,
                };
                let end = match (*power, (policy / 3) % 4) {
                    (true, 3) => End::CleanThenCut(cut),
                    (true, _) => End::PowerCut(cut),
                    (false, _) => End::ProcessCrash,
                };
                return self.reopen(end, *seed);
            }
            Op::ClockForward { by } => {
                let by =
                    [0u64, 50, 150, 400, 900, 1_500, 5_200, 11_000, 21_000][usize::from(*by) % 9];
                self.clock.advance(Duration::from_millis(by));
                self.note(format!("clock +{by} ms"));
                return Ok(());
            }
            Op::ClockBack { by } => {
                let now = opjournal::Clock::now(&self.clock).as_millis();
                self.clock
                    .set(Timestamp::from_millis(now.saturating_sub(u64::from(*by))));
                self.note(format!("clock back {by} ms"));
                return Ok(());
            }
            Op::ArmFault(f) => {
                let t = trigger(*f, self.cfg.two_logs);
                self.note(format!("ARM {t:?}"));
                if let Some(disk) = &self.disk {
                    disk.arm(t);
                    self.fault_armed = true;
                }
                return Ok(());
            }
            Op::ApplyEffect { pick: p } => {
                // After a failure the editor applies nothing: a release or completion that
                // failed may have landed (the claim is then no longer its to act on), and
                // the process is about to reopen the journal anyway.
                if !self.poisoned
                    && let Some(id) = pick(&self.claimed(Some(false)), *p)
                {
                    self.apply_effect(&id);
                }
                return Ok(());
            }
            _ => {}
        }
        if self.poisoned {
            return self.poisoned_step(op);
        }
        let call = match op {
            Op::Submit {
                id,
                scope,
                session,
                base,
                other_intent,
                allow_stale,
            } => {
                let mut spec = self.op_spec(*id, *scope, *session, *base, *other_intent);
                spec.allow_stale = *allow_stale;
                Call::Submit(spec)
            }
            Op::SubmitInvalid { which } => {
                let mut spec = self.op_spec(0, 1, 1, Base::None, false);
                let bad = match which % 3 {
                    0 => String::new(),
                    1 => "tab\u{7}bell".to_string(),
                    _ => "x".repeat(opjournal::MAX_NAME_BYTES + 1),
                };
                match (which / 3) % 3 {
                    0 => spec.id = bad,
                    1 => spec.scope = Some(bad),
                    _ => spec.session = Some(bad),
                }
                Call::Submit(spec)
            }
            Op::CompleteApplied { pick: p } => {
                let Some(id) = pick(&self.claimed(Some(true)), *p) else {
                    return Ok(());
                };
                let claim = self.claims[&id].clone();
                let (rev, bytes) = self.effects[&id].clone();
                // An external edit may have moved the scope since: the effect lands on top.
                let rev = match claim.scope() {
                    Some(s) => rev.max(self.model.scope_revision(s) + 1),
                    None => rev,
                };
                self.effects.insert(id.clone(), (rev, bytes.clone()));
                Call::Complete(claim, OutcomeSpec::applied(rev, bytes))
            }
            Op::CompleteFailed { pick: p } => {
                let Some(id) = pick(&self.claimed(None), *p) else {
                    return Ok(());
                };
                let claim = self.claims[&id].clone();
                Call::Complete(claim, OutcomeSpec::failed("the target no longer exists"))
            }
            Op::Release { pick: p } => {
                let Some(id) = pick(&self.claimed(Some(false)), *p) else {
                    return Ok(());
                };
                Call::Release(self.claims[&id].clone())
            }
            Op::ExtendLease { pick: p, by } => {
                let Some(id) = pick(&self.claimed(None), *p) else {
                    return Ok(());
                };
                let by = Duration::from_millis([200, 1_000, 3_000][usize::from(*by) % 3]);
                Call::ExtendLease(self.claims[&id].clone(), by)
            }
            Op::Resolve { pick: p, failed } => {
                // Asked of a copy: the model must read the clock only when the journal does.
                let mut m = self.model.clone();
                let in_doubt: Vec<String> = IDS
                    .iter()
                    .map(|s| s.to_string())
                    .filter(|id| m.is_in_doubt(id))
                    .collect();
                let Some(id) = pick(&in_doubt, *p) else {
                    return Ok(());
                };
                // The editor looks at the project: it knows whether it applied the effect.
                let res = match self.effects.get(&id) {
                    Some((rev, bytes)) => {
                        ResolutionSpec::Completed(OutcomeSpec::applied(*rev, bytes.clone()))
                    }
                    None if *failed => ResolutionSpec::Completed(OutcomeSpec::failed("abandoned")),
                    None => ResolutionSpec::NotApplied,
                };
                Call::Resolve(id, res)
            }
            Op::Probe { kind, pick: p } => match self.probe(*kind, *p) {
                Some(call) => call,
                None => return Ok(()),
            },
            Op::Delivered { id } => Call::Delivered(IDS[usize::from(*id) % IDS.len()].into()),
            Op::Acknowledge { id } => {
                let name = IDS[usize::from(*id) % IDS.len()];
                // The higher bits pick the caller: mostly the owner, sometimes a caller
                // without a session or another session (refused as not the owner).
                let session = match (usize::from(*id) / IDS.len()) % 4 {
                    0 => None,
                    1 => Some(SESSIONS[usize::from(*id) % SESSIONS.len()].to_string()),
                    _ => self.model.session_of(name),
                };
                Call::Acknowledge(name.into(), session)
            }
            Op::AdvanceRevision { scope, delta } => {
                let scope = SCOPES[usize::from(*scope) % SCOPES.len()].to_string();
                let current = self.model.scope_revision(&scope);
                let rev = match delta % 4 {
                    0 => current,
                    1 => current.saturating_sub(1),
                    d => current + u64::from(d),
                };
                Call::AdvanceRevision(scope, rev)
            }
            Op::Compact => Call::Compact,
            Op::Flush => Call::Flush,
            Op::Lookup { id } => Call::Lookup(IDS[usize::from(*id) % IDS.len()].into()),
            Op::CheckAll => return self.compare("full comparison"),
            Op::Reopen
            | Op::Crash { .. }
            | Op::ClockForward { .. }
            | Op::ClockBack { .. }
            | Op::ArmFault(_)
            | Op::ApplyEffect { .. } => return Ok(()),
        };
        self.call(call)
    }

    fn apply_effect(&mut self, id: &str) {
        let Some(claim) = self.claims.get(id) else {
            return;
        };
        let rev = match claim.scope() {
            Some(s) => self.model.scope_revision(s) + 1,
            None => 1 + u64::from(claim.attempt()),
        };
        let mut bytes = format!("{id}/{}@{rev}", claim.attempt()).into_bytes();
        if self.cfg.max_result_bytes >= CHECKPOINTING_RESULT_BYTES {
            // Large results: a few of them fill the log.
            let fill = bytes
                .iter()
                .fold(7u8, |a, b| a.wrapping_mul(31).wrapping_add(*b));
            let len = self.cfg.max_result_bytes as usize * 3 / 4;
            let mut i = 0u8;
            while bytes.len() < len {
                bytes.push(fill.wrapping_add(i));
                i = i.wrapping_add(1);
            }
        }
        self.applied.insert(id.to_string(), None);
        self.effects.insert(id.to_string(), (rev, bytes));
        self.figures.applications += 1;
        self.note(format!("editor applies `{id}` at rev {rev}"));
    }

    /// A call the model predicts to be refused, or `None`.
    fn probe(&mut self, kind: u8, p: u8) -> Option<Call> {
        let call = match kind % 4 {
            0 => {
                let claim = pick(&self.old_claims, p)?;
                match p % 3 {
                    0 => Call::Release(claim),
                    1 => Call::ExtendLease(claim, Duration::from_millis(500)),
                    _ => Call::Complete(claim, OutcomeSpec::failed("stale")),
                }
            }
            1 => Call::Resolve(
                IDS[usize::from(p) % IDS.len()].into(),
                ResolutionSpec::NotApplied,
            ),
            2 => {
                let id = pick(&self.claimed(None), p)?;
                let claim = self.claims[&id].clone();
                let rev = claim.scope().map_or(0, |s| self.model.scope_revision(s));
                Call::Complete(claim, OutcomeSpec::applied(rev, b"late".to_vec()))
            }
            _ => {
                let id = pick(&self.claimed(None), p)?;
                let claim = self.claims[&id].clone();
                let big = vec![7u8; self.cfg.max_result_bytes as usize + 1];
                Call::Complete(claim, OutcomeSpec::applied(u64::MAX, big))
            }
        };
        let mut m = self.model.clone();
        let refused = match &call {
            Call::Release(c) => m.release(c).is_err(),
            Call::ExtendLease(c, by) => m.extend_lease(c, *by).is_err(),
            Call::Complete(c, o) => m.complete(c, o).is_err(),
            Call::Resolve(id, r) => m.resolve(id, r).is_err(),
            _ => false,
        };
        // Only refusals: a probe must not change what the editor knows.
        refused.then_some(call)
    }

    /// A poisoned handle: every write must be refused with a failure, and nothing change.
    fn poisoned_step(&mut self, op: &Op) -> Result<(), String> {
        let j = self.journal()?;
        if !j.is_poisoned() {
            return Err(self.fail("a storage failure did not poison the handle".into()));
        }
        let id = IDS[0];
        let (what, r) = match op {
            Op::AdvanceRevision { scope, .. } => {
                let scope = SCOPES[usize::from(*scope) % SCOPES.len()];
                let rev = self.model.scope_revision(scope) + 1;
                (
                    "advance_revision",
                    j.advance_revision(scope, rev).map(|_| ()),
                )
            }
            Op::Acknowledge { .. } => (
                "acknowledge",
                j.acknowledge(id, self.model.session_of(id).as_deref())
                    .map(|_| ()),
            ),
            Op::Delivered { .. } => ("delivered", j.delivered(id).map(|_| ())),
            Op::Compact => ("compact", j.compact().map(|_| ())),
            // Reads and other writes: the model does not know which state the failed call
            // left until the reopen; nothing to compare.
            _ => return Ok(()),
        };
        match r {
            Ok(()) => Err(self.fail(format!("the poisoned handle accepted a write ({what})"))),
            Err(e) => {
                if !ErrView::of(&e).is_failure() {
                    return Err(self.fail(format!(
                        "the poisoned handle answered {what} with a refusal instead of an error: {e}"
                    )));
                }
                self.figures.poisoned_refusals += 1;
                self.note(format!("poisoned handle refuses {what}: {e}"));
                Ok(())
            }
        }
    }

    /// Runs `call` on the journal and the model, and keeps the editor's books.
    fn call(&mut self, call: Call) -> Result<(), String> {
        self.figures.calls += 1;
        let desc = format!("{call:?}");
        let fired_before = self.disk_fired();
        let stats_before = self.disk.as_ref().map(FaultDisk::stats);
        let j = self.journal.take().ok_or("no journal open")?;
        let r = self.model.step(&j, &call);
        self.journal = Some(j);
        let r = r.map_err(|diff| {
            self.note(format!("{desc} -> MISMATCH"));
            self.fail(diff)
        })?;
        let fired = !fired_before && self.disk_fired();
        match r {
            StepResult::Failed { error, after } => {
                self.note(format!("{desc} -> FAILED {error:?}"));
                if matches!(call, Call::Lookup(_)) {
                    return Ok(());
                }
                if !self.fault_armed {
                    return Err(self.fail(format!(
                        "{desc} failed ({error:?}) without an injected fault"
                    )));
                }
                self.figures.failures += 1;
                self.poisoned = true;
                self.failed_at = self.failed_at.max(after.high_water());
                if matches!(call, Call::Compact) {
                    // Earlier batches of the failed compaction are durable.
                    self.recovery.update_all(Model::compaction_uncertain);
                }
                self.recovery.maybe(&after);
                if !self.journal()?.is_poisoned() && !matches!(call, Call::Flush) {
                    return Err(self.fail(format!(
                        "{desc} failed ({error:?}) but the handle is not poisoned"
                    )));
                }
                Ok(())
            }
            StepResult::Done {
                claim,
                durable,
                refused,
            } => {
                if fired {
                    // A fault on the redb file after the call's record was synced (a
                    // checkpoint) leaves the call durable and poisons the handle; a fault on
                    // the log must fail the call. With two log files, a fault on either after
                    // a sync in the call (the call's record, or a checkpoint's commit) hit
                    // the checkpoint's work after the call's commit point (zeroing the file
                    // the ended cycle used, readying the second file): poisoned too.
                    let poisoned = self.journal()?.is_poisoned();
                    let on = self.disk.as_ref().and_then(FaultDisk::fired_on);
                    let after_a_sync = self.cfg.two_logs
                        && self
                            .disk
                            .as_ref()
                            .zip(stats_before.as_ref())
                            .is_some_and(|(disk, before)| disk.fault_followed_a_sync(before));
                    let checkpoints = on == Some(DiskFile::Db)
                        || (after_a_sync && on.is_some_and(DiskFile::is_log));
                    if !checkpoints || !poisoned {
                        return Err(self.fail(format!(
                            "a fault fired on the {on:?} file during {desc}, which answered as if nothing happened (poisoned: {poisoned})"
                        )));
                    }
                    self.note(format!("{desc}: a checkpoint after it failed; poisoned"));
                    self.poisoned = true;
                }
                if refused {
                    self.figures.refusals += 1;
                    self.note(format!("{desc} -> refused as predicted"));
                    return Ok(());
                }
                let durable = self.after_ok(&call, claim, durable)?;
                match durable {
                    Some(true) => self.recovery.durable(&self.model),
                    Some(false) => self.recovery.maybe(&self.model),
                    None => {}
                }
                self.note(format!("{desc} -> ok (durable {durable:?})"));
                Ok(())
            }
        }
    }

    /// Bookkeeping after an answer the model agreed with. Returns whether the call wrote
    /// something durable (`Some(true)`), lazily (`Some(false)`), or nothing (`None`).
    fn after_ok(
        &mut self,
        call: &Call,
        claim: Option<Claim>,
        durable: bool,
    ) -> Result<Option<bool>, String> {
        let now = self.model.high_water();
        Ok(match call {
            Call::Submit(op) => match claim {
                Some(c) => {
                    // Exactly once: the editor never gets to apply an effect twice.
                    if let Some(purge_at) = self.applied.get(&op.id)
                        && purge_at.is_none_or(|p| now < p)
                    {
                        return Err(self.fail(format!(
                            "DOUBLE APPLICATION: `{}` was answered Fresh (attempt {}) although its effect was applied and its record is not purged (purge at {purge_at:?})",
                            op.id,
                            c.attempt()
                        )));
                    }
                    self.applied.remove(&op.id);
                    self.claims.insert(op.id.clone(), c);
                    Some(durable)
                }
                None => {
                    if self.model.clone().is_terminal(&op.id) {
                        self.figures.replays += 1;
                    }
                    None
                }
            },
            Call::Complete(c, _) | Call::Release(c) => {
                let id = c.operation_id().to_string();
                self.claims.remove(&id);
                self.old_claims.push(c.clone());
                if self.effects.remove(&id).is_some() {
                    self.confirm(&id);
                }
                Some(true)
            }
            Call::ExtendLease(c, _) => {
                if let Some(newc) = claim {
                    self.claims.insert(c.operation_id().to_string(), newc);
                }
                Some(true)
            }
            Call::Resolve(id, _) => {
                if let Some(c) = self.claims.remove(id) {
                    self.old_claims.push(c);
                }
                if self.effects.remove(id).is_some() {
                    self.confirm(id);
                }
                Some(true)
            }
            Call::Delivered(_) | Call::Acknowledge(..) => Some(durable),
            Call::AdvanceRevision(..) | Call::Flush => Some(true),
            Call::Compact => durable.then_some(true),
            Call::Lookup(_) => None,
        })
    }

    /// The outcome of an applied effect is recorded: it may be forgotten only once its
    /// audit record is purged.
    fn confirm(&mut self, id: &str) {
        let purge_at = self.model.lookup(id).and_then(|r| r.purge_at);
        self.applied.insert(id.to_string(), purge_at);
    }

    /// Ends the journal's life as `end` says, verifies the file, reopens it, and checks it
    /// against every state the crash may have left.
    /// A journal in a database: closes the handle, opens the journal again and compares.
    /// The model is not told: the journal lived on in the database (opening marks nothing
    /// in doubt), and the claims held before stay valid.
    #[cfg(feature = "postgres")]
    fn reopen_database(&mut self) -> Result<(), String> {
        let (url, name) = self.database.clone().ok_or("no database")?;
        if self.figures.reopens >= MAX_REOPENS as u64 {
            return self.compare("in the database, at a reopen past the limit");
        }
        self.figures.reopens += 1;
        let j = self.journal.take().ok_or("no journal open")?;
        j.close()
            .map_err(|e| self.fail(format!("closing the journal in PostgreSQL: {e}")))?;
        let j = self
            .cfg
            .builder(&self.clock)
            .open_postgres(url, &name)
            .map_err(|e| self.fail(format!("opening the journal in PostgreSQL again: {e}")))?;
        self.journal = Some(j);
        self.note("closed and opened again from the database".to_string());
        self.compare("after opening the journal again from the database")
    }

    fn reopen(&mut self, end: End, seed: u64) -> Result<(), String> {
        if self.figures.reopens >= MAX_REOPENS as u64 && !self.disk_is_dead() {
            return Ok(());
        }
        self.reopen_now(end, seed)
    }

    fn reopen_now(&mut self, end: End, seed: u64) -> Result<(), String> {
        let disk = self
            .disk
            .clone()
            .ok_or("a reopen of a journal that is not on a disk")?;
        self.figures.reopens += 1;
        // Never retry an fsync on a handle that saw an I/O error.
        let stats = disk.stats();
        if stats.syncs_after_fault > 0 && !disk.is_dead() {
            return Err(self.fail(format!(
                "the handle attempted {} sync(s) after a fault",
                stats.syncs_after_fault
            )));
        }
        let end = match end {
            End::Clean if disk.fired() => End::ProcessCrash,
            End::CleanThenCut(p) if disk.fired() => End::PowerCut(p),
            e => e,
        };
        self.note(format!("END {end:?}"));
        // A crash in the middle of a redb write (a checkpoint) is where the files can be
        // left in a state only `verify` judges (redb's own recovery, the indexes): the
        // image is verified then, and at the end of the input; after the other ends the
        // comparison with the model below is the check.
        let redb_torn = end != End::Clean && disk.pending_ops_of(DiskFile::Db) > 0;
        let mut rng = seed | 1;
        // xorshift64: any 64-bit generator will do.
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let image = match end {
            End::Clean | End::CleanThenCut(_) => {
                // Closing checkpoints and removes the log (a fault armed may fire now).
                self.journal = None;
                match end {
                    _ if disk.is_dead() => disk.power_cut_image(CutPolicy::Random, &mut next),
                    End::CleanThenCut(policy) => {
                        disk.cut();
                        disk.power_cut_image(policy, &mut next)
                    }
                    _ => disk.live_image(),
                }
            }
            End::ProcessCrash => {
                let image = disk.live_image();
                disk.cut();
                self.abandon();
                image
            }
            End::PowerCut(policy) => {
                disk.cut();
                self.abandon();
                disk.power_cut_image(policy, &mut next)
            }
        };
        if redb_torn {
            verify_image(&image).map_err(|e| self.fail(format!("after {end:?}: {e}")))?;
            self.figures.verified += 1;
        }
        let disk = FaultDisk::from_image(image);
        self.disk = Some(disk.clone());
        self.fault_armed = false;
        self.model.before_reopen();
        if opjournal::Clock::now(&self.clock).as_millis() < self.failed_at {
            self.clock.set(Timestamp::from_millis(self.failed_at));
        }
        let j = open(&self.cfg, &self.clock, &disk)
            .map_err(|e| self.fail(format!("reopen after {end:?} failed: {e}")))?;
        let (model, lost) = self.recovery.recover(&j).map_err(|e| {
            self.fail(format!(
                "after {end:?}, the journal matches no state the crash may leave:\n{e}"
            ))
        })?;
        self.note(format!("reopened: {lost} uncertain call(s) lost"));
        self.model = model;
        self.recovery = Recovery::new(&self.model);
        self.poisoned = false;
        // The process that held the claims is gone.
        let claims = std::mem::take(&mut self.claims);
        self.old_claims.extend(claims.into_values());
        if self.old_claims.len() > 64 {
            self.old_claims.drain(..32);
        }
        // Effects applied whose outcome was not recorded: in doubt, never forgotten.
        let effects: Vec<String> = self.effects.keys().cloned().collect();
        for id in effects {
            if self.model.is_terminal(&id) {
                self.effects.remove(&id);
                self.confirm(&id);
            } else if self.model.lookup(&id).is_none() {
                // The outcome of a call that failed landed after all (its record survived
                // the crash), and the record has since aged out (audit retention): the
                // journal no longer answers for the id, which the exactly-once claim
                // allows once the record is purged. (Recovery never drops an acknowledged
                // call, so the model knows the id unless retention purged it.)
                self.effects.remove(&id);
                self.applied.remove(&id);
            } else if !self.model.is_in_doubt(&id) {
                return Err(self.fail(format!(
                    "DOUBLE APPLICATION RISK: the editor applied `{id}` but after {end:?} the journal neither records its outcome nor holds it in doubt ({:?})",
                    j.lookup(&id).map_err(|e| e.to_string())
                )));
            }
        }
        self.journal = Some(j);
        Ok(())
    }
}

/// How a journal's life ends before a reopen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    Clean,
    /// Closed cleanly, then the power fails (the log's removal may be lost).
    CleanThenCut(CutPolicy),
    ProcessCrash,
    PowerCut(CutPolicy),
}

/// A new journal's files, made once per process: every input starts from a copy (on a
/// disk in memory), so no execution pays for creating one. The log is the one the
/// journal's first open prepared (a header, preallocated zeros), left beside the file
/// after the journal closed cleanly: the next open uses it as it is.
fn pristine() -> Result<DiskImage, String> {
    static PRISTINE: std::sync::OnceLock<Result<DiskImage, String>> = std::sync::OnceLock::new();
    PRISTINE
        .get_or_init(|| {
            let clock = ManualClock::new(Timestamp::from_millis(T0));
            let disk = FaultDisk::new();
            let journal =
                open(&ModelConfig::small(), &clock, &disk).map_err(|e| format!("create: {e}"))?;
            let log = disk.live_image().log;
            drop(journal);
            Ok(DiskImage {
                db: disk.live_image().db,
                log,
                log2: Default::default(),
            })
        })
        .clone()
}

/// Runs one input. `Err` describes the violated claim and the steps that led to it.
///
/// # Errors
///
/// The violation, with the configuration and the last steps.
pub fn run(input: &Input) -> Result<Figures, String> {
    let mut s = Session::new(&input.setup, input.backend, input.two_logs)?;
    for op in &input.ops {
        s.step(op)?;
    }
    let Some(disk) = s.disk.clone() else {
        // In memory: compare everything, and (one input in four) close, which must succeed.
        s.compare("final comparison")?;
        if input.verify_end {
            let j = s.journal.take().ok_or("no journal open")?;
            j.close()
                .map_err(|e| s.fail(format!("closing the journal in memory: {e}")))?;
        }
        return Ok(s.figures);
    };
    // The end of the session: recover from a fault still pending, compare everything, and
    // (one input in four) close cleanly and verify the files.
    if s.poisoned || disk.fired() || disk.is_dead() {
        let end = if disk.is_dead() {
            End::PowerCut(CutPolicy::Random)
        } else {
            End::ProcessCrash
        };
        s.reopen_now(end, 7)?;
    }
    s.compare("final comparison")?;
    // After a reopen the session's journal is on a new disk.
    let disk = s.disk.clone().ok_or("no disk")?;
    if !input.verify_end {
        // The process ends without closing: nothing more is written, and no image is left
        // to judge.
        disk.cut();
        s.abandon();
        return Ok(s.figures);
    }
    disk.heal();
    s.journal = None;
    verify_image(&disk.live_image()).map_err(|e| s.fail(format!("final image: {e}")))?;
    s.figures.verified += 1;
    Ok(s.figures)
}

/// Checks every claim of this module on one fuzz input.
///
/// # Panics
///
/// When a claim does not hold (that is the finding).
pub fn check(data: &[u8]) {
    check_input(&Input::from_bytes(data));
}

/// As [`check`], with the sampled end on (every input ends with a clean close and
/// `verify`), on both backends: the fault-injecting disk (where the committed inputs were
/// found, whatever their first byte says), with the log in one file and in two, and memory.
/// For the stable tests' committed inputs.
///
/// # Panics
///
/// When a claim does not hold.
pub fn check_every_claim(data: &[u8]) {
    let mut input = Input::from_bytes(data);
    input.verify_end = true;
    for (backend, two_logs) in [
        (Backend::FaultDisk, false),
        (Backend::FaultDisk, true),
        (Backend::Memory, false),
    ] {
        input.backend = backend;
        input.two_logs = two_logs;
        check_input(&input);
    }
}

fn check_input(input: &Input) {
    crate::panics::escaped("ops_vs_model", || {
        if let Err(e) = run(input) {
            panic!("ops_vs_model: {e}");
        }
    });
}
