//! The concurrent workload a power cut interrupts, and how its answers are checked.
//!
//! The child process runs a few threads on one journal (so their calls share group
//! commits). Each thread has its own operation ids, its own scope and its own seeded
//! [`Plan`], whose next call depends only on the seed and on the answers the thread got
//! before: the parent, reading what the child printed, knows every call each thread made,
//! and the one call each may have had in flight when the power went.
//!
//! The child prints one line per answered call, after the call returned (`ok <thread>
//! <call number> <answer as JSON>`): a call printed `ok` that writes returned `Ok`, so it
//! was durable. The parent replays the printed answers, in the order printed, through the
//! crash suites' reference model (`testkit/src/model.rs`): every answer must be the
//! model's (the threads' state is disjoint, so any order of their calls leaves the same
//! state). The crash may leave that state plus any subset of the calls in flight; the
//! reopened journal must equal one of those states exactly ([`Recovery::recover`]: every
//! acknowledged call present, with its recorded outcome; operations running at the cut
//! `InDoubt`, never re-runnable; nothing half-applied).

use std::time::Duration;

use opjournal::{Admission, Claim, Journal, Receipt, Replay};
use serde::{Deserialize, Serialize};

use crate::driver::{Rng, result_bytes};
use crate::model::{AdmissionView, ErrView, Model, OpSpec, OutcomeSpec, ReceiptView, Recovery};

/// The largest result a thread records (with 64 KiB checkpoints, one every few results).
const MAX_RESULT: u64 = 24 << 10;

/// One call of a thread.
#[derive(Clone, Debug)]
pub enum PCall {
    Submit(OpSpec),
    Complete(Claim, OutcomeSpec),
    Release(Claim),
    Extend(Claim, Duration),
    Advance(String, u64),
}

impl PCall {
    /// A short description, for reports.
    pub fn describe(&self) -> String {
        match self {
            PCall::Submit(op) => format!("submit `{}`", op.id),
            PCall::Complete(c, o) => format!(
                "complete `{}` {}",
                c.operation_id(),
                match o.applied {
                    Some(r) => format!("applied@{r} ({} bytes)", o.bytes.len()),
                    None => "failed".into(),
                }
            ),
            PCall::Release(c) => format!("release `{}`", c.operation_id()),
            PCall::Extend(c, _) => format!("extend `{}`", c.operation_id()),
            PCall::Advance(s, r) => format!("advance `{s}` to {r}"),
        }
    }
}

/// A call's answer as the child prints it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Wire {
    Fresh(Claim),
    InProgress(Receipt),
    Replay(Replay),
    Expired(Receipt),
    InDoubt(Receipt),
    /// `complete`'s receipt.
    Receipt(Receipt),
    Released,
    /// `extend_lease_by`'s renewed claim.
    Extended(Claim),
    /// `advance_revision`'s revision.
    Revision(u64),
    /// A refusal (writes nothing), as the model's `ErrView` prints it.
    Refused(String),
}

impl Wire {
    /// Whether the call wrote (and so was durable when it returned).
    pub fn wrote(&self) -> bool {
        matches!(
            self,
            Wire::Fresh(_)
                | Wire::Receipt(_)
                | Wire::Released
                | Wire::Extended(_)
                | Wire::Revision(_)
        )
    }
}

/// One thread's seeded choices.
#[derive(Clone, Debug)]
pub struct Plan {
    thread: usize,
    rng: Rng,
    scope: String,
    /// The scope's revision as this thread knows it.
    rev: u64,
    next: u64,
    /// Claims held (the effect is applied just before `complete` with an applied outcome).
    running: Vec<Claim>,
    /// Operations completed or released, resubmitted now and then.
    finished: Vec<OpSpec>,
    /// Every operation submitted.
    pub specs: Vec<OpSpec>,
    /// Calls made.
    pub calls: u64,
}

impl Plan {
    /// The plan of thread `thread` of the run `seed`.
    pub fn new(seed: u64, thread: usize) -> Plan {
        Plan {
            thread,
            rng: Rng::new(seed ^ (0x7410_0000 + thread as u64)),
            scope: format!("scene/{thread}"),
            rev: 0,
            next: 0,
            running: Vec::new(),
            finished: Vec::new(),
            specs: Vec::new(),
            calls: 0,
        }
    }

    /// The next call.
    pub fn next_call(&mut self) -> PCall {
        self.calls += 1;
        let roll = self.rng.below(100);
        if !self.running.is_empty() && (roll < 55 || self.running.len() >= 3) {
            let i = self.rng.below(self.running.len() as u64) as usize;
            let claim = self.running[i].clone();
            return match self.rng.below(100) {
                0..=71 => {
                    let rev = if claim.scope().is_some() {
                        self.rev + 1 + self.rng.below(2)
                    } else {
                        1 + self.rng.below(1_000)
                    };
                    let len = 1 + self.rng.below(MAX_RESULT) as usize;
                    let bytes = result_bytes(&format!("{} result", claim.operation_id()), len);
                    PCall::Complete(claim, OutcomeSpec::applied(rev, bytes))
                }
                72..=84 => PCall::Complete(claim, OutcomeSpec::failed("the target is gone")),
                85..=93 => PCall::Release(claim),
                _ => PCall::Extend(claim, Duration::from_secs(60)),
            };
        }
        if roll < 63 && !self.finished.is_empty() {
            return PCall::Submit(self.rng.pick(&self.finished).clone());
        }
        if roll < 69 {
            let rev = if self.rng.chance(10) {
                self.rev
            } else {
                self.rev + 1 + self.rng.below(3)
            };
            return PCall::Advance(self.scope.clone(), rev);
        }
        let n = self.next;
        self.next += 1;
        let scope = self.rng.chance(60).then(|| self.scope.clone());
        let base_revision = match (&scope, self.rng.below(10)) {
            (Some(_), 0..=4) => Some(self.rev),
            (Some(_), 5) => Some(self.rev.saturating_sub(1)),
            _ => None,
        };
        let spec = OpSpec {
            id: format!("t{}-{n}", self.thread),
            intent_name: "scene.edit".into(),
            intent_args: serde_json::json!({ "thread": self.thread, "n": n }),
            scope,
            session: None,
            base_revision,
            allow_stale: self.rng.chance(10),
        };
        self.specs.push(spec.clone());
        PCall::Submit(spec)
    }

    /// Takes in the answer to `call`.
    pub fn observe(&mut self, call: &PCall, answer: &Wire) {
        match (call, answer) {
            (PCall::Submit(spec), Wire::Fresh(claim)) => {
                self.finished.retain(|s| s.id != spec.id);
                self.running.push(claim.clone());
            }
            (PCall::Complete(c, o), Wire::Receipt(_)) => {
                if let (Some(rev), Some(_)) = (o.applied, c.scope()) {
                    self.rev = self.rev.max(rev);
                }
                self.finish(c);
            }
            (PCall::Release(c), Wire::Released) => self.finish(c),
            (PCall::Extend(c, _), Wire::Extended(renewed)) => {
                for held in &mut self.running {
                    if held.operation_id() == c.operation_id() {
                        *held = renewed.clone();
                    }
                }
            }
            (PCall::Advance(..), Wire::Revision(rev)) => self.rev = self.rev.max(*rev),
            _ => {}
        }
    }

    fn finish(&mut self, c: &Claim) {
        self.running
            .retain(|h| h.operation_id() != c.operation_id());
        if let Some(spec) = self.specs.iter().find(|s| s.id == c.operation_id()) {
            self.finished.push(spec.clone());
        }
    }

    /// Whether the thread holds `id`'s claim (its effect may be applied at any moment).
    pub fn holds(&self, id: &str) -> bool {
        self.running.iter().any(|c| c.operation_id() == id)
    }
}

/// Runs `call` on the journal: the answer, or the error's description for a storage
/// failure (which no call should meet before the power is cut).
pub fn execute(j: &Journal, call: &PCall) -> Result<Wire, String> {
    let refused = |e: opjournal::Error| {
        let v = ErrView::of(&e);
        if v.is_failure() {
            Err(format!("{e}"))
        } else {
            Ok(Wire::Refused(format!("{v:?}")))
        }
    };
    match call {
        PCall::Submit(op) => match j.submit(op.operation()) {
            Ok(Admission::Fresh(c)) => Ok(Wire::Fresh(c)),
            Ok(Admission::InProgress(r)) => Ok(Wire::InProgress(r)),
            Ok(Admission::Replay(r)) => Ok(Wire::Replay(r)),
            Ok(Admission::Expired(r)) => Ok(Wire::Expired(r)),
            Ok(Admission::InDoubt(r)) => Ok(Wire::InDoubt(r)),
            Ok(other) => Err(format!(
                "an admission this harness does not know: {other:?}"
            )),
            Err(e) => refused(e),
        },
        PCall::Complete(c, o) => j
            .complete(c, o.outcome())
            .map(Wire::Receipt)
            .or_else(refused),
        PCall::Release(c) => j.release(c).map(|()| Wire::Released).or_else(refused),
        PCall::Extend(c, by) => j
            .extend_lease_by(c, *by)
            .map(Wire::Extended)
            .or_else(refused),
        PCall::Advance(s, r) => j
            .advance_revision(s, *r)
            .map(Wire::Revision)
            .or_else(refused),
    }
}

fn err_text(e: ErrView) -> String {
    format!("{e:?}")
}

/// Plays `call` and the child's `answer` through the model: `Err` if the journal answered
/// what the model does not allow. The model moves as the journal did.
pub fn expect(model: &mut Model, call: &PCall, answer: &Wire) -> Result<(), String> {
    let mismatch = |expected: &dyn std::fmt::Debug| {
        Err(format!(
            "{}: the model expected {expected:?}, the journal answered {answer:?}",
            call.describe()
        ))
    };
    match call {
        PCall::Submit(op) => {
            let expected = model.submit(op).map_err(err_text);
            let actual = match answer {
                Wire::Fresh(c) => Ok(Admission::Fresh(c.clone())),
                Wire::InProgress(r) => Ok(Admission::InProgress(r.clone())),
                Wire::Replay(r) => Ok(Admission::Replay(r.clone())),
                Wire::Expired(r) => Ok(Admission::Expired(r.clone())),
                Wire::InDoubt(r) => Ok(Admission::InDoubt(r.clone())),
                Wire::Refused(e) => Err(e.clone()),
                _ => return mismatch(&expected),
            }
            .map(|a| AdmissionView::of(&a));
            let ok = match (&expected, &actual) {
                (Ok(e), Ok(a)) => e.admits(a),
                (Err(e), Err(a)) => e == a,
                _ => false,
            };
            if !ok {
                return mismatch(&expected);
            }
            if let Wire::Fresh(c) = answer {
                model.bind_claim(c);
            }
        }
        PCall::Complete(c, o) => {
            let expected = model.complete(c, o).map_err(err_text);
            let ok = match (&expected, answer) {
                (Ok(e), Wire::Receipt(r)) => e.admits(&ReceiptView::of(r)),
                (Err(e), Wire::Refused(a)) => e == a,
                _ => false,
            };
            if !ok {
                return mismatch(&expected);
            }
        }
        PCall::Release(c) => {
            let expected = model.release(c).map_err(err_text);
            let ok = match (&expected, answer) {
                (Ok(()), Wire::Released) => true,
                (Err(e), Wire::Refused(a)) => e == a,
                _ => false,
            };
            if !ok {
                return mismatch(&expected);
            }
        }
        PCall::Extend(c, by) => {
            let expected = model.extend_lease(c, *by).map_err(err_text);
            let ok = match (&expected, answer) {
                (Ok(until), Wire::Extended(renewed)) => *until == renewed.lease_until().as_millis(),
                (Err(e), Wire::Refused(a)) => e == a,
                _ => false,
            };
            if !ok {
                return mismatch(&expected);
            }
        }
        PCall::Advance(s, r) => {
            let expected = model.advance_revision(s, *r).map_err(err_text);
            let ok = match (&expected, answer) {
                (Ok(e), Wire::Revision(a)) => e == a,
                (Err(e), Wire::Refused(a)) => e == a,
                _ => false,
            };
            if !ok {
                return mismatch(&expected);
            }
        }
    }
    Ok(())
}

/// The model after `call` landed, its answer unknown (a call in flight at the cut): a
/// fresh claim's epoch is then unknown to the model, which takes it from the journal.
pub fn land(model: &mut Model, call: &PCall) {
    // A refusal changes nothing, in the model as in the journal.
    match call {
        PCall::Submit(op) => {
            let _ = model.submit(op);
        }
        PCall::Complete(c, o) => {
            let _ = model.complete(c, o);
        }
        PCall::Release(c) => {
            let _ = model.release(c);
        }
        PCall::Extend(c, by) => {
            let _ = model.extend_lease(c, *by);
        }
        PCall::Advance(s, r) => {
            let _ = model.advance_revision(s, *r);
        }
    }
}

/// The states the crash may leave: `durable` with each subset of the calls in flight
/// landed, and for each state the calls landed in it (bit `k`: call `k`).
pub fn candidates(durable: &Model, in_flight: &[PCall]) -> (Recovery, Vec<u32>) {
    let mut recovery = Recovery::new(durable);
    let mut masks = vec![0];
    let mut last = durable.clone();
    for mask in 1u32..(1 << in_flight.len()) {
        let mut m = durable.clone();
        for (k, call) in in_flight.iter().enumerate() {
            if mask & (1 << k) != 0 {
                land(&mut m, call);
            }
        }
        // `Recovery::maybe` skips a state equal to the one before.
        if m != last {
            recovery.maybe(&m);
            masks.push(mask);
            last = m;
        }
    }
    (recovery, masks)
}
