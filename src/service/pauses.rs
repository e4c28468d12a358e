//! A fault-injection device for demos and tests: hold an operation at an exact step, so a
//! client can disconnect there, or make the service die or the edit panic there. A real
//! service never arms it (an unarmed [`Pauses`] costs one uncontended lock per step).

use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Duration;

use super::{ServiceError, lock};

/// A step of executing a fresh operation, where [`Pauses`] can hold it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stage {
    /// Accepted (recorded as running), the edit not yet applied.
    Accepted,
    /// The edit applied and saved, the outcome not yet recorded.
    Mutated,
    /// The outcome recorded, the result not yet sent.
    Committed,
}

/// How a held operation goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// Carry on.
    Continue,
    /// Stop dead, as if the process died here: record nothing more, send nothing.
    Crash,
    /// The edit code panics here (only at [`Stage::Accepted`], where the edit is applied;
    /// elsewhere it is [`Verdict::Continue`]).
    Panic,
}

/// Holds the next operation that reaches an armed [`Stage`] until released.
#[derive(Debug, Default)]
pub struct Pauses {
    state: Mutex<PauseState>,
    cv: Condvar,
}

#[derive(Debug, Default)]
struct PauseState {
    armed: Option<(Stage, Option<Verdict>)>,
    held: Option<(Stage, String)>,
    verdict: Option<Verdict>,
}

impl Pauses {
    /// Holds the next operation that reaches `stage` until [`Pauses::release`].
    pub fn arm(&self, stage: Stage) {
        lock(&self.state).armed = Some((stage, None));
    }

    /// Lets the next operation that reaches `stage` go on with `verdict` at once, without
    /// holding it (for example a panic of its edit).
    pub fn arm_with(&self, stage: Stage, verdict: Verdict) {
        lock(&self.state).armed = Some((stage, Some(verdict)));
    }

    /// Waits until an operation is held; returns its id.
    ///
    /// # Errors
    ///
    /// [`ServiceError::Timeout`] when none is held within `timeout`.
    pub fn wait_held(&self, timeout: Duration) -> Result<String, ServiceError> {
        let guard = lock(&self.state);
        let (guard, _) = self
            .cv
            .wait_timeout_while(guard, timeout, |s| s.held.is_none())
            .unwrap_or_else(PoisonError::into_inner);
        guard
            .held
            .as_ref()
            .map(|(_, id)| id.clone())
            .ok_or_else(|| ServiceError::Timeout {
                what: "an operation to reach the armed step".into(),
                after: timeout,
            })
    }

    /// Lets the held operation go on (or die), and disarms.
    pub fn release(&self, verdict: Verdict) {
        let mut s = lock(&self.state);
        s.armed = None;
        if s.held.is_some() {
            s.verdict = Some(verdict);
            self.cv.notify_all();
        }
    }

    /// Called by the service at `stage`: how the operation goes on.
    pub(crate) fn reach(&self, stage: Stage, id: &str) -> Verdict {
        let mut s = lock(&self.state);
        match s.armed {
            Some((armed, _)) if armed != stage => return Verdict::Continue,
            None => return Verdict::Continue,
            Some((_, Some(verdict))) => {
                s.armed = None;
                return verdict;
            }
            Some((_, None)) => {}
        }
        s.armed = None;
        s.held = Some((stage, id.to_string()));
        s.verdict = None;
        self.cv.notify_all();
        let mut s = self
            .cv
            .wait_while(s, |s| s.verdict.is_none())
            .unwrap_or_else(PoisonError::into_inner);
        s.held = None;
        s.verdict.take().unwrap_or(Verdict::Continue)
    }
}
