//! A seeded, deterministic random workload with a fake editor, checked call by call
//! against the reference model.
//!
//! The editor applies an operation's effect only while it holds a `Fresh` claim, and counts
//! applications per id. It never applies an effect twice within one retention generation
//! of an id; if the journal ever hands out a `Fresh` claim for an id whose effect the
//! editor applied and whose audit record has not aged out, that is a double application
//! and the run fails.
//!
//! The workload's choices depend only on its seed and on the model (never on timing), so
//! the same seed replays the same calls — in this process (`OPJ_SEED=...`) or in another
//! one (the kill -9 harness replays a child's run to know what it acknowledged).
//!
//! Self-contained apart from `super::model`; include both by path.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::Duration;

use opjournal::{Claim, Journal, ManualClock, ScopeLock, Sharing, Timestamp};

use crate::model::{
    Call, ErrView, Model, ModelConfig, OpSpec, OutcomeSpec, Recovery, ResolutionSpec, StepResult,
};

/// Where every run's clock starts: 2026-01-01T00:00:00Z.
pub const T0: u64 = 1_767_225_600_000;

/// SplitMix64: small, fast, and the same everywhere.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// One element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

/// What the fake editor knows about one id's effect.
#[derive(Clone, Debug, Default)]
struct Generation {
    /// When the journal may forget the outcome (`None`: not yet recorded).
    purge_at: Option<u64>,
}

/// Figures of a workload, summed over reopens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkloadStats {
    /// Steps taken (journal calls and clock moves).
    pub steps: u64,
    /// Journal calls made.
    pub calls: u64,
    /// Calls that returned `Ok` and are durable.
    pub ok_durable: u64,
    /// Calls that returned `Ok` and are lazily durable.
    pub ok_lazy: u64,
    /// Predicted refusals.
    pub refusals: u64,
    /// Calls that failed with a storage error (outcome unknown).
    pub failures: u64,
    /// Calls refused by a poisoned handle.
    pub poisoned_refusals: u64,
    /// Effects the editor applied.
    pub applications: u64,
    /// Durable `Ok` calls checked present after a reopen.
    pub acked_checked: u64,
    /// Reopens checked against the model.
    pub reopens: u64,
    /// Operations found `InDoubt` after a reopen that were `Running` before it.
    pub running_at_cut: u64,
    /// Lazily durable or uncertain calls lost to a crash (allowed).
    pub maybe_lost: u64,
    /// Calls answered `Ok` after which a checkpoint failed (the handle then refuses writes).
    pub checkpoint_failures: u64,
}

impl WorkloadStats {
    /// Adds `o` to `self`.
    pub fn add(&mut self, o: &WorkloadStats) {
        self.steps += o.steps;
        self.calls += o.calls;
        self.ok_durable += o.ok_durable;
        self.ok_lazy += o.ok_lazy;
        self.refusals += o.refusals;
        self.failures += o.failures;
        self.poisoned_refusals += o.poisoned_refusals;
        self.applications += o.applications;
        self.acked_checked += o.acked_checked;
        self.reopens += o.reopens;
        self.running_at_cut += o.running_at_cut;
        self.maybe_lost += o.maybe_lost;
        self.checkpoint_failures += o.checkpoint_failures;
    }
}

/// What one step did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stepped {
    /// A call returned `Ok`; `durable` unless lazily durable.
    Ok {
        /// Whether it must survive any crash.
        durable: bool,
    },
    /// A predicted refusal (writes nothing).
    Refused,
    /// An answer from the record (a known id resubmitted): writes nothing.
    Answered,
    /// A storage failure: the handle is poisoned and the outcome unknown.
    Failed,
    /// A write refused by the poisoned handle.
    PoisonedRefusal,
    /// No journal call (clock move, editor-side effect).
    Local,
}

/// The seeded workload: the model, the fake editor and the claims it holds.
#[derive(Clone)]
pub struct Workload {
    /// Drives every choice.
    pub rng: Rng,
    /// The reference model.
    pub model: Model,
    /// The states a crash may leave.
    pub recovery: Recovery,
    /// Figures.
    pub stats: WorkloadStats,
    /// Recent steps, for a failing seed's report.
    pub log: Vec<String>,
    /// The last journal call made (for a harness that must know what was in flight).
    pub last_call: Option<Call>,
    ok_durable_since_reopen: u64,
    poisoned: bool,
    /// Claims this process holds (lost at a reopen: the process that held them is gone).
    claims: BTreeMap<String, Claim>,
    /// Effects applied whose outcome is not recorded yet: id → (revision, result bytes).
    effects: BTreeMap<String, (u64, Vec<u8>)>,
    /// Claims no longer current, for probing fencing.
    old_claims: Vec<Claim>,
    applications: BTreeMap<String, u32>,
    generations: BTreeMap<String, Generation>,
    ids: Vec<String>,
    scopes: Vec<String>,
    sessions: Vec<String>,
    /// The result being redelivered lately.
    focus: Option<String>,
    verbose: bool,
}

/// The smallest checkpoint size the journal accepts: seeds that use it checkpoint (write
/// the log into redb and start the log over) every few completed operations.
pub const SMALL_CHECKPOINT: u64 = 64 << 10;

/// The configuration a seed uses: short clocks, and per seed a scope lock policy, a
/// session window, a compaction batch size, one log file or two on the fault disk (half the
/// seeds each); and for six seeds in ten the smallest checkpoint size with results of up to
/// 64 or 128 KiB, so that checkpoints (and crashes during them, and records of the next
/// cycle overwriting the last one's) come every few completed operations.
pub fn config_for(seed: u64, sharing: Sharing) -> ModelConfig {
    let mut rng = Rng::new(seed ^ 0xC0F1_6000);
    let mut cfg = ModelConfig::small();
    cfg.scope_lock = if rng.chance(30) {
        ScopeLock::HoldUntilAck
    } else {
        ScopeLock::Serial
    };
    cfg.session_window = 2 + rng.below(3) as u32;
    cfg.compaction_batch = 1 + rng.below(4) as usize;
    // From a generator of its own, so that each seed's other choices stay as they were.
    cfg.compaction_scan = Rng::new(seed ^ 0x5CA7_0000).chance(50).then_some(true);
    // Likewise: half the seeds keep the log in two files, as a journal file does.
    cfg.two_logs = Rng::new(seed ^ 0x2106_0000).chance(50);
    cfg.sharing = sharing;
    if rng.chance(60) {
        cfg.checkpoint_size = Some(SMALL_CHECKPOINT);
        cfg.max_result_bytes = (64 << 10) << rng.below(2);
    }
    cfg
}

/// A result of `len` bytes starting with `text` (padded with a pattern the text names, so
/// results of different operations differ throughout).
pub fn result_bytes(text: &str, len: usize) -> Vec<u8> {
    let mut bytes = text.as_bytes().to_vec();
    let fill = text
        .bytes()
        .fold(7u8, |a, b| a.wrapping_mul(31).wrapping_add(b));
    let mut i = 0u8;
    while bytes.len() < len {
        bytes.push(fill.wrapping_add(i));
        i = i.wrapping_add(1);
    }
    bytes
}

impl Workload {
    /// A workload for `seed` against a journal configured by `cfg`, on `clock`.
    pub fn new(seed: u64, cfg: ModelConfig, clock: ManualClock) -> Workload {
        let model = Model::new(cfg, clock);
        let recovery = Recovery::new(&model);
        Workload {
            rng: Rng::new(seed),
            model,
            recovery,
            stats: WorkloadStats::default(),
            log: Vec::new(),
            last_call: None,
            ok_durable_since_reopen: 0,
            poisoned: false,
            claims: BTreeMap::new(),
            effects: BTreeMap::new(),
            old_claims: Vec::new(),
            applications: BTreeMap::new(),
            generations: BTreeMap::new(),
            // Half the ids, one scope and one session longer than 23 bytes: the tables keep
            // shorter strings inline and longer ones shared, and both must behave alike.
            ids: (0..6)
                .map(|i| match i {
                    0..3 => format!("op-{i}"),
                    _ => format!("op-{i}-0f8fad5b-d9cb-469f-a165-70867728950e"),
                })
                .collect(),
            scopes: vec![
                "scene/a".into(),
                "scene/b/a-scope-name-of-some-length".into(),
            ],
            sessions: vec![
                "tab-1".into(),
                "tab-2-of-a-window-with-a-long-session-id".into(),
            ],
            focus: None,
            verbose: false,
        }
    }

    /// Prints every step as it happens.
    pub fn set_verbose(&mut self, verbose: bool) {
        self.verbose = verbose;
    }

    /// Whether the handle has been poisoned by a storage failure.
    pub fn poisoned(&self) -> bool {
        self.poisoned
    }

    /// Adds a line to the log.
    pub fn note(&mut self, line: String) {
        if self.verbose {
            eprintln!("{line}");
        }
        self.log.push(line);
        if self.log.len() > 400 {
            self.log.drain(..200);
        }
    }

    /// The last `n` log lines.
    pub fn tail(&self, n: usize) -> String {
        let start = self.log.len().saturating_sub(n);
        self.log[start..].join("\n")
    }

    /// Compares every observable state of `journal` with the model.
    pub fn check(&mut self, journal: &Journal) -> Result<(), String> {
        self.model.check_against(journal)
    }

    fn op_spec(&mut self, id: &str) -> OpSpec {
        let i: usize = id.trim_start_matches("op-").parse().unwrap_or(0);
        let scope = if i == 5 {
            None
        } else if self.rng.chance(10) {
            Some(self.rng.pick(&self.scopes).clone())
        } else {
            Some(self.scopes[i % 2].clone())
        };
        let session = if i == 4 {
            None
        } else if self.rng.chance(10) {
            Some(self.rng.pick(&self.sessions).clone())
        } else {
            Some(self.sessions[i % 2].clone())
        };
        let base_revision = match (&scope, self.rng.below(100)) {
            (Some(s), 0..=59) => Some(self.model.scope_revision(s)),
            (Some(s), 60..=74) => Some(self.model.scope_revision(s).saturating_sub(1)),
            _ => None,
        };
        let variant = u64::from(self.rng.chance(5));
        OpSpec {
            id: id.to_string(),
            intent_name: "scene.edit".into(),
            intent_args: serde_json::json!({ "target": i, "variant": variant }),
            scope,
            session,
            base_revision,
            allow_stale: self.rng.chance(10),
        }
    }

    fn claimed_ids(&self, with_effect: Option<bool>) -> Vec<String> {
        self.claims
            .keys()
            .filter(|id| with_effect.is_none_or(|e| self.effects.contains_key(*id) == e))
            .cloned()
            .collect()
    }

    /// One random step against `journal`. `Err` is a violation, described.
    pub fn step(&mut self, journal: &Journal) -> Result<Stepped, String> {
        self.stats.steps += 1;
        self.last_call = None;
        if self.poisoned {
            return self.poisoned_step(journal);
        }
        let roll = self.rng.below(100);
        let with_effect = self.claimed_ids(Some(true));
        let without_effect = self.claimed_ids(Some(false));
        match roll {
            0..=21 => {
                let id = self.rng.pick(&self.ids).clone();
                let spec = self.op_spec(&id);
                self.call(journal, Call::Submit(spec))
            }
            22..=29 if !without_effect.is_empty() => {
                let id = self.rng.pick(&without_effect).clone();
                self.apply_effect(&id);
                Ok(Stepped::Local)
            }
            30..=39 if !with_effect.is_empty() => {
                let id = self.rng.pick(&with_effect).clone();
                self.complete_effect(journal, &id)
            }
            40..=42 if !without_effect.is_empty() => {
                let id = self.rng.pick(&without_effect).clone();
                let claim = self.claims[&id].clone();
                let o = OutcomeSpec::failed("the target no longer exists");
                self.call(journal, Call::Complete(claim, o))
            }
            43..=45 if !without_effect.is_empty() => {
                let id = self.rng.pick(&without_effect).clone();
                let claim = self.claims[&id].clone();
                self.call(journal, Call::Release(claim))
            }
            46..=48 if !self.claims.is_empty() => {
                let ids = self.claimed_ids(None);
                let id = self.rng.pick(&ids).clone();
                let claim = self.claims[&id].clone();
                let by = Duration::from_millis(*self.rng.pick(&[200, 1_000, 3_000]));
                self.call(journal, Call::ExtendLease(claim, by))
            }
            49..=54 => self.resolve_one(journal),
            55..=57 => self.probe(journal),
            58..=64 => {
                let id = self.delivery_target();
                self.call(journal, Call::Delivered(id))
            }
            65..=70 => {
                let id = self.delivery_target();
                // Mostly the owner; sometimes a caller without a session, or another
                // session (refused unless the operation has no session).
                let session = match self.rng.below(10) {
                    0 => None,
                    1 => Some(self.rng.pick(&self.sessions).clone()),
                    _ => self.model.session_of(&id),
                };
                self.call(journal, Call::Acknowledge(id, session))
            }
            71..=73 => {
                let scope = self.rng.pick(&self.scopes).clone();
                let current = self.model.scope_revision(&scope);
                let rev = match self.rng.below(10) {
                    0 => current,
                    1 => current.saturating_sub(1),
                    _ => current + 1 + self.rng.below(3),
                };
                self.call(journal, Call::AdvanceRevision(scope, rev))
            }
            74..=84 => {
                self.move_clock();
                Ok(Stepped::Local)
            }
            85..=87 => self.call(journal, Call::Compact),
            88..=89 => self.call(journal, Call::Flush),
            _ => {
                let id = self.rng.pick(&self.ids).clone();
                self.call(journal, Call::Lookup(id))
            }
        }
    }

    /// Mostly an operation with a result (so deliveries pile up and spend their budget),
    /// sometimes any id (to be refused).
    fn delivery_target(&mut self) -> String {
        let terminal: Vec<String> = self
            .ids
            .clone()
            .into_iter()
            .filter(|id| self.model.peek_is_terminal(id))
            .collect();
        if let Some(f) = &self.focus
            && terminal.contains(f)
            && self.rng.chance(60)
        {
            // Keep pushing the same result: its retry budget gets spent.
            return f.clone();
        }
        if !terminal.is_empty() && self.rng.chance(70) {
            let id = self.rng.pick(&terminal).clone();
            self.focus = Some(id.clone());
            id
        } else {
            self.rng.pick(&self.ids).clone()
        }
    }

    fn move_clock(&mut self) {
        let clock = self.model.clock().clone();
        if self.rng.chance(5) {
            let back = 500 + self.rng.below(4_500);
            let now = opjournal::Clock::now(&clock).as_millis();
            clock.set(Timestamp::from_millis(now.saturating_sub(back)));
            self.note(format!("clock back {back} ms"));
        } else {
            let by = *self
                .rng
                .pick(&[0u64, 50, 150, 450, 900, 1_500, 5_200, 11_000, 21_000]);
            clock.advance(Duration::from_millis(by));
            self.note(format!("clock +{by} ms"));
        }
    }

    /// The editor applies the effect of a claimed operation (no journal call).
    fn apply_effect(&mut self, id: &str) {
        let Some(claim) = self.claims.get(id) else {
            return;
        };
        let rev = match claim.scope() {
            Some(s) => self.model.scope_revision(s) + 1,
            None => 1 + self.rng.below(100),
        };
        // Results of half to all of the largest size: with a small checkpoint size, a few of
        // them fill the log.
        let max = self.model.config().max_result_bytes as usize;
        let len = max / 2 + self.rng.below((max - max / 2) as u64 + 1) as usize;
        let bytes = result_bytes(&format!("{id}/{}@{rev}", claim.attempt()), len);
        *self.applications.entry(id.to_string()).or_default() += 1;
        self.generations
            .insert(id.to_string(), Generation { purge_at: None });
        self.effects.insert(id.to_string(), (rev, bytes));
        self.stats.applications += 1;
        self.note(format!("editor applies `{id}` at rev {rev}"));
    }

    fn complete_effect(&mut self, journal: &Journal, id: &str) -> Result<Stepped, String> {
        let claim = self.claims[id].clone();
        let (rev, bytes) = self.effects[id].clone();
        // An external edit may have moved the scope since: the effect lands on top of it.
        let rev = match claim.scope() {
            Some(s) => rev.max(self.model.scope_revision(s) + 1),
            None => rev,
        };
        self.effects.insert(id.to_string(), (rev, bytes.clone()));
        self.call(
            journal,
            Call::Complete(claim, OutcomeSpec::applied(rev, bytes)),
        )
    }

    fn resolve_one(&mut self, journal: &Journal) -> Result<Stepped, String> {
        let ids: Vec<String> = self
            .ids
            .clone()
            .into_iter()
            .filter(|id| self.model.is_in_doubt(id))
            .collect();
        if ids.is_empty() {
            let id = self.rng.pick(&self.ids).clone();
            return self.call(journal, Call::Lookup(id));
        }
        let id = self.rng.pick(&ids).clone();
        // The editor looks at the project: it knows whether it applied the effect.
        let res = match self.effects.get(&id) {
            Some((rev, bytes)) => {
                ResolutionSpec::Completed(OutcomeSpec::applied(*rev, bytes.clone()))
            }
            None if self.rng.chance(70) => ResolutionSpec::NotApplied,
            None => ResolutionSpec::Completed(OutcomeSpec::failed("abandoned")),
        };
        self.call(journal, Call::Resolve(id, res))
    }

    /// Calls that must be refused: stale claims, resolving what is not in doubt, revisions
    /// that do not move forward, results over the limit. Issued only when the model
    /// predicts a refusal, so the editor's bookkeeping stays true.
    fn probe(&mut self, journal: &Journal) -> Result<Stepped, String> {
        let call = match self.rng.below(4) {
            0 if !self.old_claims.is_empty() => {
                let claim = self.rng.pick(&self.old_claims).clone();
                match self.rng.below(3) {
                    0 => Call::Release(claim),
                    1 => Call::ExtendLease(claim, Duration::from_millis(500)),
                    _ => Call::Complete(claim, OutcomeSpec::failed("stale")),
                }
            }
            1 => {
                let id = self.rng.pick(&self.ids).clone();
                Call::Resolve(id, ResolutionSpec::NotApplied)
            }
            2 if !self.claims.is_empty() => {
                let ids = self.claimed_ids(None);
                let id = self.rng.pick(&ids).clone();
                let claim = self.claims[&id].clone();
                let rev = claim.scope().map_or(0, |s| self.model.scope_revision(s));
                Call::Complete(claim, OutcomeSpec::applied(rev, b"late".to_vec()))
            }
            _ if !self.claims.is_empty() => {
                let ids = self.claimed_ids(None);
                let id = self.rng.pick(&ids).clone();
                let claim = self.claims[&id].clone();
                let big = vec![7u8; self.model.config().max_result_bytes as usize + 1];
                Call::Complete(claim, OutcomeSpec::applied(u64::MAX, big))
            }
            _ => return Ok(Stepped::Local),
        };
        if !self.predicts_refusal(&call) {
            return Ok(Stepped::Local);
        }
        self.call(journal, call)
    }

    fn predicts_refusal(&self, call: &Call) -> bool {
        let mut m = self.model.clone();
        match call {
            Call::Release(c) => m.release(c).is_err(),
            Call::ExtendLease(c, by) => m.extend_lease(c, *by).is_err(),
            Call::Complete(c, o) => m.complete(c, o).is_err(),
            Call::Resolve(id, r) => m.resolve(id, r).is_err(),
            _ => false,
        }
    }

    /// A poisoned handle: every write must be refused, and nothing may change.
    fn poisoned_step(&mut self, journal: &Journal) -> Result<Stepped, String> {
        if !journal.is_poisoned() {
            return Err("a storage failure did not poison the handle".into());
        }
        let scope = self.rng.pick(&self.scopes).clone();
        let rev = self.model.scope_revision(&scope) + 1;
        let id = self.rng.pick(&self.ids).clone();
        let (what, r) = match self.rng.below(4) {
            0 => (
                "advance_revision",
                journal.advance_revision(&scope, rev).map(|_| ()),
            ),
            1 => (
                "acknowledge",
                journal
                    .acknowledge(&id, self.model.session_of(&id).as_deref())
                    .map(|_| ()),
            ),
            2 => ("delivered", journal.delivered(&id).map(|_| ())),
            _ => ("compact", journal.compact().map(|_| ())),
        };
        self.stats.calls += 1;
        match r {
            Ok(()) => Err(format!(
                "the poisoned handle accepted a write ({what} `{id}`/`{scope}`)"
            )),
            Err(e) => {
                let v = ErrView::of(&e);
                if !v.is_failure() {
                    // Refusals are decided before the poison check only for bad input.
                    return Err(format!(
                        "the poisoned handle answered {what} with a refusal instead of an error: {e}"
                    ));
                }
                self.stats.poisoned_refusals += 1;
                self.note(format!("poisoned handle refuses {what}: {e}"));
                Ok(Stepped::PoisonedRefusal)
            }
        }
    }

    /// Runs `call` through the model and records what it means for the editor.
    fn call(&mut self, journal: &Journal, call: Call) -> Result<Stepped, String> {
        self.stats.calls += 1;
        self.last_call = Some(call.clone());
        let desc = describe(&call);
        let r = self.model.step(journal, &call);
        let r = match r {
            Ok(r) => r,
            Err(diff) => {
                self.note(format!("{desc} -> MISMATCH"));
                return Err(diff);
            }
        };
        match r {
            StepResult::Failed { error, after } => {
                self.note(format!("{desc} -> FAILED {error:?}"));
                if matches!(call, Call::Lookup(_)) {
                    return Ok(Stepped::Local);
                }
                self.stats.failures += 1;
                self.poisoned = true;
                if matches!(call, Call::Compact) {
                    // Earlier batches of the failed compaction are durable.
                    self.recovery.update_all(Model::compaction_uncertain);
                }
                self.recovery.maybe(&after);
                if !journal.is_poisoned() && !matches!(call, Call::Flush) {
                    return Err(format!(
                        "{desc} failed ({error:?}) but the handle is not poisoned"
                    ));
                }
                Ok(Stepped::Failed)
            }
            StepResult::Done {
                claim,
                durable,
                refused,
            } => {
                if journal.is_poisoned() && !self.poisoned {
                    // A checkpoint after the call's commit point failed: the call is durable
                    // (in the log) and answered `Ok`, but the handle refuses writes now.
                    self.note(format!("{desc}: a checkpoint after it failed; poisoned"));
                    self.stats.checkpoint_failures += 1;
                    self.poisoned = true;
                }
                let outcome = if refused {
                    Stepped::Refused
                } else {
                    self.after_ok(&call, claim, durable)?
                };
                match outcome {
                    Stepped::Ok { durable: true } => {
                        self.stats.ok_durable += 1;
                        self.ok_durable_since_reopen += 1;
                        self.recovery.durable(&self.model);
                    }
                    Stepped::Ok { durable: false } => {
                        self.stats.ok_lazy += 1;
                        self.recovery.maybe(&self.model);
                    }
                    Stepped::Refused => self.stats.refusals += 1,
                    _ => {}
                }
                self.note(format!("{desc} -> {outcome:?}"));
                Ok(outcome)
            }
        }
    }

    /// Bookkeeping after an answer the model agreed with.
    fn after_ok(
        &mut self,
        call: &Call,
        claim: Option<Claim>,
        durable: bool,
    ) -> Result<Stepped, String> {
        // The time the journal judged the call by (reading the clock again could move the
        // model's time where the journal's did not).
        let now = self.model.high_water();
        match call {
            Call::Submit(op) => {
                if let Some(c) = claim {
                    // The exactly-once check: the editor never gets to apply twice.
                    if let Some(g) = self.generations.get(&op.id)
                        && g.purge_at.is_none_or(|p| now < p)
                    {
                        return Err(format!(
                            "DOUBLE APPLICATION: `{}` was answered Fresh (attempt {}) although its effect was applied ({} times) and its record is not purged (purge at {:?})",
                            op.id,
                            c.attempt(),
                            self.applications.get(&op.id).copied().unwrap_or(0),
                            g.purge_at
                        ));
                    }
                    self.generations.remove(&op.id);
                    self.claims.insert(op.id.clone(), c);
                    Ok(Stepped::Ok { durable })
                } else {
                    Ok(Stepped::Answered)
                }
            }
            Call::Complete(c, _) | Call::Release(c) => {
                let id = c.operation_id().to_string();
                self.claims.remove(&id);
                self.old_claims.push(c.clone());
                if self.effects.remove(&id).is_some() {
                    self.confirm(&id);
                }
                Ok(Stepped::Ok { durable: true })
            }
            Call::ExtendLease(c, _) => {
                if let Some(newc) = claim {
                    self.claims.insert(c.operation_id().to_string(), newc);
                }
                Ok(Stepped::Ok { durable: true })
            }
            Call::Resolve(id, _) => {
                if let Some(c) = self.claims.remove(id) {
                    self.old_claims.push(c);
                }
                if self.effects.remove(id).is_some() {
                    self.confirm(id);
                }
                Ok(Stepped::Ok { durable: true })
            }
            Call::Delivered(_) | Call::Acknowledge(..) => Ok(Stepped::Ok { durable }),
            Call::AdvanceRevision(..) | Call::Flush => Ok(Stepped::Ok { durable: true }),
            Call::Compact if durable => Ok(Stepped::Ok { durable }),
            Call::Lookup(_) | Call::Compact => Ok(Stepped::Local),
        }
    }

    /// The outcome of an effect the editor applied is recorded: it may be forgotten only
    /// after the audit retention.
    fn confirm(&mut self, id: &str) {
        if let Some(r) = self.model.lookup(id) {
            self.generations.insert(
                id.to_string(),
                Generation {
                    purge_at: r.purge_at,
                },
            );
        }
    }

    /// For a crash in the middle of the next step: runs that step on `journal` (one that
    /// does not fail, replaying another process's run) and returns this workload as it was
    /// before the step, with the step's outcome added to the states a crash may leave.
    pub fn with_next_step_in_flight(&mut self, journal: &Journal) -> Result<Workload, String> {
        let mut before = self.clone();
        self.step(journal)?;
        if matches!(self.last_call, Some(Call::Compact)) {
            // Some of its batches may have landed.
            before.recovery.update_all(Model::compaction_uncertain);
        }
        before.recovery.maybe(&self.model);
        Ok(before)
    }

    /// After the journal was reopened: matches it with one state the crash may have left,
    /// and reconciles the editor (claims are gone; applied effects must be in doubt or
    /// recorded, never forgotten).
    pub fn after_reopen(&mut self, journal: &Journal) -> Result<(), String> {
        self.stats.reopens += 1;
        let running: Vec<String> = self.claims.keys().cloned().collect();
        let (model, lost) = self.recovery.recover(journal)?;
        self.model = model;
        self.recovery = Recovery::new(&self.model);
        self.stats.maybe_lost += lost as u64;
        self.stats.acked_checked += self.ok_durable_since_reopen;
        self.ok_durable_since_reopen = 0;
        self.poisoned = false;
        for id in running {
            if self.model.is_in_doubt(&id) {
                self.stats.running_at_cut += 1;
            }
        }
        let claims = std::mem::take(&mut self.claims);
        self.old_claims.extend(claims.into_values());
        let effects: Vec<String> = self.effects.keys().cloned().collect();
        for id in effects {
            if self.model.is_terminal(&id) {
                self.effects.remove(&id);
                self.confirm(&id);
            } else if !self.model.is_in_doubt(&id) {
                return Err(format!(
                    "DOUBLE APPLICATION RISK: the editor applied `{id}` but after the reopen the journal neither records its outcome nor holds it in doubt ({:?})",
                    journal.lookup(&id).map_err(|e| e.to_string())
                ));
            }
        }
        if self.old_claims.len() > 64 {
            self.old_claims.drain(..32);
        }
        Ok(())
    }
}

fn describe(call: &Call) -> String {
    match call {
        Call::Submit(op) => format!(
            "submit `{}` scope={:?} session={:?} base={:?}{}{}",
            op.id,
            op.scope,
            op.session,
            op.base_revision,
            if op.allow_stale { " stale-ok" } else { "" },
            if op.intent_args["variant"] == 1 {
                " OTHER-INTENT"
            } else {
                ""
            }
        ),
        Call::Complete(c, o) => format!(
            "complete `{}` epoch {} {}",
            c.operation_id(),
            c.epoch(),
            match o.applied {
                Some(r) => format!("applied@{r} ({} bytes)", o.bytes.len()),
                None => format!("failed({})", o.message),
            }
        ),
        Call::Release(c) => format!("release `{}` epoch {}", c.operation_id(), c.epoch()),
        Call::ExtendLease(c, by) => format!(
            "extend `{}` epoch {} by {by:?}",
            c.operation_id(),
            c.epoch()
        ),
        Call::Resolve(id, r) => format!("resolve `{id}` {r:?}"),
        Call::Delivered(id) => format!("delivered `{id}`"),
        Call::Acknowledge(id, session) => format!("acknowledge `{id}` as {session:?}"),
        Call::AdvanceRevision(s, r) => format!("advance `{s}` to {r}"),
        Call::Compact => "compact".into(),
        Call::Flush => "flush".into(),
        Call::Lookup(id) => format!("lookup `{id}`"),
    }
}
