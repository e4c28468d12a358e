//! [`Journaled`]: runs a tool call as a journal operation.
//!
//! [`Journaled::run`] is the loop: submit the operation, and for a fresh one run the
//! effect and record its outcome, all on one blocking thread so that nothing between the
//! claim and the record depends on the request still being there; a duplicate running
//! here, or a scope another operation holds, is waited for (at most the configured wait).
//! The call's inputs are in `call`, the answers it gives in `answers`.

use std::collections::{HashMap, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use serde_json::json;
use tokio::sync::watch;

use super::answers::{
    MAX_FAILURE, expired, failure_text, in_doubt, recorded_result, set_meta, status_name,
    tool_error,
};
use super::call::{CallSession, Effect, EffectKind, ToolCall};
use crate::{
    Admission, Claim, Error, ErrorKind, ExecutionStatus, Intent, Journal, Operation, Outcome,
    Receipt, Replay, Resolution,
};

/// How long a call waits, by default, for a running duplicate of itself or for another
/// operation to free the scope before it answers "still running" or "busy".
pub const DEFAULT_WAIT: Duration = Duration::from_secs(30);

/// How often a waiting call asks the journal again when nothing in this process tells it.
const POLL: Duration = Duration::from_millis(25);

/// Sessions whose delivered results wait for their acknowledgement in memory, at most.
const MAX_SESSIONS: usize = 4096;
/// Delivered results remembered per session, at most (the journal's session window is 64
/// by default); the oldest beyond are left to the acknowledgement timeout.
const MAX_PER_SESSION: usize = 256;

/// Locks a mutex; its data is a few maps updated in single statements, so a panic elsewhere
/// never leaves it half-changed and a poisoned lock is taken as it is.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Settles an operation found in doubt (its execution ended without an outcome: a crash,
/// a lease that ran out) by looking at the project: `Ok(Some(resolution))` to record it,
/// `Ok(None)` when it cannot tell (the agent is told to check the project).
pub type Resolver =
    Arc<dyn Fn(&Journal, &Receipt) -> Result<Option<Resolution>, String> + Send + Sync>;

/// A step of executing a fresh operation where a test hook may hold it (see
/// [`crate::service::Pauses`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Accepted (recorded as running), the effect not yet run.
    Accepted,
    /// The effect ran, its outcome not yet recorded.
    Mutated,
    /// The outcome recorded, the result not yet handed to the transport.
    Committed,
}

/// A fault-injection hook: `false` stops the operation dead where it stands, as if the
/// process died (nothing more is recorded or answered).
pub(crate) type StepHook = Arc<dyn Fn(Step, &str) -> bool + Send + Sync>;

/// Makes tools journaled: each call is an operation of the journal, so a repeated call
/// (same `operation_id`) is answered with the recorded result instead of running again.
///
/// Cheap to clone (a handle); keep one in the server struct and call [`Journaled::run`]
/// from each mutating `#[tool]` handler. Journal calls run on tokio's blocking threads
/// (`spawn_blocking`), and so does the effect: it runs to the end and its outcome is
/// recorded even when the client disconnects or cancels the request meanwhile.
///
/// What the agent sees, and what stands for an acknowledgement, is in `docs/mcp.md`.
#[derive(Clone)]
pub struct Journaled {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Journaled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journaled")
            .field("journal", &self.inner.journal)
            .field("wait", &self.inner.wait)
            .field("connection_session", &self.inner.connection_session)
            .finish_non_exhaustive()
    }
}

struct Inner {
    journal: Journal,
    wait: Duration,
    resolver: Option<Resolver>,
    /// Operations executing in this process: a call of the same id waits on it.
    running: Mutex<HashMap<String, watch::Receiver<bool>>>,
    /// Delivered results per session, not acknowledged yet.
    acks: Mutex<Acks>,
    /// The journal session of calls that did not come over HTTP (one connection per
    /// process, as with stdio).
    connection_session: String,
    hook: Option<StepHook>,
}

#[derive(Default)]
struct Acks {
    /// Session → the results delivered to it (oldest first), and when it last got one.
    by_session: HashMap<String, (u64, VecDeque<String>)>,
    clock: u64,
}

impl Acks {
    fn take(&mut self, session: &str) -> Vec<String> {
        self.by_session
            .remove(session)
            .map(|(_, ids)| Vec::from(ids))
            .unwrap_or_default()
    }

    fn push(&mut self, session: &str, id: &str) {
        self.clock += 1;
        let clock = self.clock;
        if !self.by_session.contains_key(session) && self.by_session.len() >= MAX_SESSIONS {
            // The session that got a result longest ago: its results are left to the
            // acknowledgement timeout.
            let oldest = self
                .by_session
                .iter()
                .min_by_key(|(_, (touched, _))| *touched)
                .map(|(s, _)| s.clone());
            if let Some(oldest) = oldest {
                self.by_session.remove(&oldest);
            }
        }
        let (touched, ids) = self.by_session.entry(session.to_string()).or_default();
        *touched = clock;
        if !ids.iter().any(|i| i == id) {
            ids.push_back(id.to_string());
        }
        while ids.len() > MAX_PER_SESSION {
            ids.pop_front();
        }
    }

    fn len(&self) -> usize {
        self.by_session.values().map(|(_, ids)| ids.len()).sum()
    }
}

/// What one blocking round of a call ended with.
enum Round {
    /// The answer.
    Answer(CallToolResult),
    /// Another execution holds the id or the scope: wait for it, then ask again.
    Wait { holder: String, why: Waiting },
    /// The operation is in doubt and a resolver may settle it.
    InDoubt(Box<Receipt>),
    /// A test hook stopped the operation dead.
    Dead,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Waiting {
    Running,
    ScopeBusy,
}

impl Journaled {
    /// Journaled tools over `journal`, waiting at most [`DEFAULT_WAIT`] for a running
    /// duplicate, without a resolver (operations in doubt are reported to the agent).
    pub fn new(journal: Journal) -> Journaled {
        Journaled::build(journal, DEFAULT_WAIT, None, None)
    }

    fn build(
        journal: Journal,
        wait: Duration,
        resolver: Option<Resolver>,
        hook: Option<StepHook>,
    ) -> Journaled {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        Journaled {
            inner: Arc::new(Inner {
                journal,
                wait,
                resolver,
                running: Mutex::new(HashMap::new()),
                acks: Mutex::new(Acks::default()),
                connection_session: format!("mcp-{}-{nanos:x}", std::process::id()),
                hook,
            }),
        }
    }

    /// How long a call waits for a running duplicate of itself (the same operation id) or
    /// for another operation to free its scope, before it answers with a tool error that
    /// says to call again with the same `operation_id`.
    pub fn with_wait(self, wait: Duration) -> Journaled {
        let i = self.into_parts();
        Journaled::build(i.0, wait, i.2, i.3)
    }

    /// Settles operations found in doubt by looking at the project (see [`Resolver`]). Without
    /// one, a call of an operation in doubt is answered with a tool error telling the agent
    /// to check the project instead of retrying.
    pub fn with_resolver(self, resolver: Resolver) -> Journaled {
        let i = self.into_parts();
        Journaled::build(i.0, i.1, Some(resolver), i.3)
    }

    #[cfg_attr(
        not(feature = "service"),
        expect(dead_code, reason = "the editor (feature `service`) is its one user")
    )]
    pub(crate) fn with_hook(self, hook: StepHook) -> Journaled {
        let i = self.into_parts();
        Journaled::build(i.0, i.1, i.2, Some(hook))
    }

    fn into_parts(self) -> (Journal, Duration, Option<Resolver>, Option<StepHook>) {
        let i = &self.inner;
        (
            i.journal.clone(),
            i.wait,
            i.resolver.clone(),
            i.hook.clone(),
        )
    }

    /// The journal.
    pub fn journal(&self) -> &Journal {
        &self.inner.journal
    }

    /// Delivered results waiting in memory for the next call of their session (which
    /// acknowledges them), for tests and monitoring.
    pub fn unacknowledged_in_memory(&self) -> usize {
        lock(&self.inner.acks).len()
    }

    /// Operations executing now in this process.
    pub fn running(&self) -> usize {
        lock(&self.inner.running).len()
    }

    /// Records that a request of the session of `ctx` arrived: the results delivered to that
    /// session before are acknowledged (see `docs/mcp.md`). [`Journaled::run`] does this
    /// itself; call it from tools that are not journaled (a read) so that they acknowledge
    /// too.
    pub async fn saw_request(&self, ctx: &RequestContext<RoleServer>) {
        let session = self.session_name(&ToolCall::session_of(ctx));
        let Some(session) = session else { return };
        let ids = lock(&self.inner.acks).take(&session);
        if ids.is_empty() {
            return;
        }
        let journal = self.inner.journal.clone();
        let _ = tokio::task::spawn_blocking(move || acknowledge(&journal, &session, &ids)).await;
    }

    /// The recorded result of `operation_id` as a replay (marked, and counted as a
    /// delivery), or `None` if it has no recorded result (unknown, running, in doubt,
    /// retired). Blocking: for [`super::JournalEventStore`]'s resumed streams.
    pub(crate) fn replay_recorded(&self, operation_id: &str) -> Option<CallToolResult> {
        let journal = &self.inner.journal;
        let receipt = journal.lookup(operation_id).ok()??;
        if !matches!(
            receipt.status,
            ExecutionStatus::Applied | ExecutionStatus::Failed
        ) {
            return None;
        }
        let recorded = journal.result(operation_id).ok()??;
        let delivered = self
            .inner
            .deliver(operation_id, None)
            .unwrap_or(receipt.clone());
        let mut result = recorded_result(&receipt, &recorded.bytes);
        set_meta(
            &mut result,
            operation_id,
            status_name(receipt.status),
            Some(true),
            Some(delivered.delivery_count),
            receipt.result_revision,
        );
        Some(result)
    }

    fn session_name(&self, s: &CallSession) -> Option<String> {
        match s {
            CallSession::Http(id) => Some(format!("mcp-http-{id}")),
            CallSession::Stateless => None,
            CallSession::Connection => Some(self.inner.connection_session.clone()),
        }
    }

    /// Runs `call` as an operation: a new operation id runs `effect` (on a blocking thread)
    /// and records its result; a known one is answered from the journal without running it.
    ///
    /// What the agent receives (every answer carries `_meta` entries under `dev.opjournal/`):
    ///
    /// - **new id**: the effect's result, `replayed: false`, `delivery: 1`;
    /// - **same id again** (a retry after a disconnect): the recorded result, not run again,
    ///   `replayed: true`, the delivery count and the result revision;
    /// - **same id, other arguments**: a tool error naming the mismatch;
    /// - **still running** (a duplicate in flight): the call waits for the outcome up to
    ///   [`Journaled::with_wait`], then a tool error "still running; call again with the same
    ///   operation_id";
    /// - **in doubt**: settled by the [`Resolver`] if there is one, else a tool error
    ///   telling the agent to check the project and not to retry blindly;
    /// - **expired** (the result aged out): a tool error with the old outcome and revision,
    ///   "refresh, do not retry".
    ///
    /// Refusals of the journal are tool errors saying what to do (a stale base revision: read
    /// again; a full session window: wait). The effect's result is counted as a delivery
    /// (`journal.delivered`) when it is handed to the transport; the next request of the same
    /// MCP session acknowledges it.
    ///
    /// # Errors
    ///
    /// An [`ErrorData`] (a JSON-RPC internal error) only when the blocking task could not
    /// run; everything the agent can act on is a tool error (`is_error: true`).
    pub async fn run<F>(&self, call: ToolCall, effect: F) -> Result<CallToolResult, ErrorData>
    where
        F: FnOnce(&Claim) -> Effect + Send + 'static,
    {
        if let Some(problem) = &call.problem {
            return Ok(tool_error(problem.clone(), "invalid", None));
        }
        let Some(id) = call.operation_id.clone() else {
            return Ok(tool_error("the call has no operation id", "invalid", None));
        };
        let session = self.session_name(&call.session);
        let intent = match Intent::from_json(&call.tool, &call.args) {
            Ok(i) => i,
            Err(e) => return Ok(tool_error(e.to_string(), "invalid", Some(&id))),
        };
        let mut op = Operation::new(id.clone(), intent);
        if let Some(scope) = &call.scope {
            op = op.scope(scope.clone());
            if let Some(base) = call.base_revision {
                op = op.base_revision(base);
            }
        }
        if call.allow_stale_base {
            op = op.allow_stale_base();
        }
        if let Some(s) = &session {
            op = op.session(s.clone());
        }
        // The earlier results of this session were seen: this request came after them.
        let to_ack = session
            .as_ref()
            .map(|s| lock(&self.inner.acks).take(s))
            .unwrap_or_default();
        let deadline = Instant::now() + self.inner.wait;
        let mut effect = Some(effect);
        let mut to_ack = Some(to_ack);
        let mut resolved_once = false;
        loop {
            let inner = self.inner.clone();
            let op = op.clone();
            let session = session.clone();
            let acks = to_ack.take().unwrap_or_default();
            let work = effect.take();
            let (round, unused) = tokio::task::spawn_blocking(move || {
                if let Some(s) = &session {
                    acknowledge(&inner.journal, s, &acks);
                }
                inner.round(op, session.as_deref(), work)
            })
            .await
            .map_err(|e| {
                ErrorData::internal_error(format!("the journaled call could not run: {e}"), None)
            })?;
            effect = unused;
            match round {
                Round::Answer(result) => return Ok(result),
                Round::Dead => {
                    return Err(ErrorData::internal_error(
                        "the server stopped while running the operation (fault injection)",
                        None,
                    ));
                }
                Round::InDoubt(receipt) => {
                    let resolver = self.inner.resolver.clone();
                    if resolver.is_none() || resolved_once {
                        return Ok(in_doubt(&receipt));
                    }
                    resolved_once = true;
                    let inner = self.inner.clone();
                    let settled = tokio::task::spawn_blocking(move || inner.settle(&receipt))
                        .await
                        .map_err(|e| {
                            ErrorData::internal_error(
                                format!("the in-doubt operation could not be settled: {e}"),
                                None,
                            )
                        })?;
                    if let Err(answer) = settled {
                        return Ok(*answer);
                    }
                }
                Round::Wait { holder, why } => {
                    if Instant::now() >= deadline {
                        return Ok(match why {
                            Waiting::Running => tool_error(
                                format!(
                                    "operation `{id}` is still running; call again with the same operation_id to get its result (do not use a new id: that would make the change twice)"
                                ),
                                "running",
                                Some(&id),
                            ),
                            Waiting::ScopeBusy => tool_error(
                                format!(
                                    "another change (`{holder}`) is being made to the same part of the project; call again with the same operation_id in a moment"
                                ),
                                "busy",
                                Some(&id),
                            ),
                        });
                    }
                    self.wait_for(&holder, deadline).await;
                }
            }
        }
    }

    /// Waits until `holder` ends in this process (or a short poll passes, for an operation
    /// this process does not run), at most until `deadline`.
    async fn wait_for(&self, holder: &str, deadline: Instant) {
        let rx = lock(&self.inner.running).get(holder).cloned();
        let left = deadline.saturating_duration_since(Instant::now());
        match rx {
            Some(mut rx) => {
                let _ = tokio::time::timeout(left, rx.wait_for(|done| *done)).await;
            }
            None => tokio::time::sleep(POLL.min(left)).await,
        }
    }
}

impl Inner {
    fn hook(&self, step: Step, id: &str) -> bool {
        self.hook.as_ref().is_none_or(|h| h(step, id))
    }

    /// One submission, and for fresh work the effect, its record and its delivery: all on
    /// this (blocking) thread, so that nothing between the claim and the record depends on
    /// the request still being there.
    fn round<F>(
        &self,
        op: Operation,
        session: Option<&str>,
        effect: Option<F>,
    ) -> (Round, Option<F>)
    where
        F: FnOnce(&Claim) -> Effect,
    {
        let id = op.id().to_string();
        let admission = match self.journal.submit(op) {
            Ok(a) => a,
            Err(e) => return (refused(&id, &e), effect),
        };
        match admission {
            Admission::Fresh(claim) => match effect {
                Some(effect) => (self.execute(&claim, session, effect), None),
                None => {
                    // Cannot happen (the effect is spent only by a fresh admission, which
                    // answers); give the claim back rather than leave it running.
                    let _ = self.journal.release(&claim);
                    (
                        Round::Answer(tool_error(
                            "the server lost the tool's effect before running it; nothing changed, call again with the same operation_id",
                            "unavailable",
                            Some(&id),
                        )),
                        None,
                    )
                }
            },
            Admission::Replay(replay) => (Round::Answer(self.replay(&replay, session)), effect),
            Admission::InProgress(_) => (
                Round::Wait {
                    holder: id,
                    why: Waiting::Running,
                },
                effect,
            ),
            Admission::Expired(r) => (Round::Answer(expired(&r)), effect),
            // Its lease ran out while the effect still runs here: wait for it, never settle it.
            Admission::InDoubt(_) if lock(&self.running).contains_key(&id) => (
                Round::Wait {
                    holder: id,
                    why: Waiting::Running,
                },
                effect,
            ),
            Admission::InDoubt(r) => (Round::InDoubt(Box::new(r)), effect),
        }
    }

    fn execute<F>(&self, claim: &Claim, session: Option<&str>, effect: F) -> Round
    where
        F: FnOnce(&Claim) -> Effect,
    {
        let id = claim.operation_id().to_string();
        let (tx, rx) = watch::channel(false);
        lock(&self.running).insert(id.clone(), rx);
        let round = self.execute_inner(claim, session, effect);
        lock(&self.running).remove(&id);
        let _ = tx.send(true);
        round
    }

    fn execute_inner<F>(&self, claim: &Claim, session: Option<&str>, effect: F) -> Round
    where
        F: FnOnce(&Claim) -> Effect,
    {
        let id = claim.operation_id();
        if !self.hook(Step::Accepted, id) {
            return Round::Dead;
        }
        let ran = catch_unwind(AssertUnwindSafe(|| effect(claim)));
        let effect = match ran {
            Ok(effect) => effect,
            Err(panic) => {
                // Its effect may have started: a failure, recorded and replayed.
                let text = crate::panics::message(panic.as_ref());
                let text = text.unwrap_or("a panic without a message");
                let message = format!(
                    "the tool panicked: {}",
                    crate::error::shorten(text, MAX_FAILURE)
                );
                Effect::done(CallToolResult::error(vec![ContentBlock::text(message)]))
            }
        };
        if effect.kind == EffectKind::NotApplied {
            return match self.journal.release(claim) {
                Ok(()) => {
                    let mut result = effect.result;
                    set_meta(&mut result, id, "not_applied", None, None, None);
                    Round::Answer(result)
                }
                Err(e) => Round::Answer(tool_error(
                    format!(
                        "nothing changed, but the server could not free operation `{id}` ({e}); call again with the same operation_id later"
                    ),
                    "unavailable",
                    Some(id),
                )),
            };
        }
        if !self.hook(Step::Mutated, id) {
            return Round::Dead;
        }
        let bytes = match serde_json::to_vec(&effect.result) {
            Ok(b) => b,
            Err(e) => format!(
                "{{\"content\":[{{\"type\":\"text\",\"text\":{}}}]}}",
                json!(e.to_string())
            )
            .into_bytes(),
        };
        let outcome = if effect.result.is_error == Some(true) {
            Outcome::failed(failure_text(&effect.result)).with_result(bytes)
        } else {
            Outcome::applied(effect.revision.unwrap_or(0), bytes)
                .changed_assets(effect.changed_assets)
        };
        let receipt = match self.journal.complete(claim, outcome) {
            Ok(r) => r,
            Err(e) => {
                return Round::Answer(tool_error(
                    format!(
                        "the change may have been made, but its outcome could not be recorded ({e}); do not call again with a new id: check the project, or call again with the same operation_id later"
                    ),
                    "unrecorded",
                    Some(id),
                ));
            }
        };
        if !self.hook(Step::Committed, id) {
            return Round::Dead;
        }
        let delivered = self.deliver(id, session).unwrap_or(receipt);
        let mut result = effect.result;
        set_meta(
            &mut result,
            id,
            status_name(delivered.status),
            Some(false),
            Some(delivered.delivery_count.max(1)),
            delivered.result_revision,
        );
        Round::Answer(result)
    }

    /// Records a delivery, and remembers it for the session's acknowledgement.
    fn deliver(&self, id: &str, session: Option<&str>) -> Option<Receipt> {
        let receipt = self.journal.delivered(id).ok()?;
        if let Some(s) = session
            && receipt.session.as_deref() == Some(s)
        {
            lock(&self.acks).push(s, id);
        }
        Some(receipt)
    }

    fn replay(&self, replay: &Replay, session: Option<&str>) -> CallToolResult {
        let id = replay.receipt.operation_id.as_str();
        let receipt = self
            .deliver(id, session)
            .unwrap_or_else(|| replay.receipt.clone());
        let mut result = recorded_result(&replay.receipt, &replay.result.bytes);
        set_meta(
            &mut result,
            id,
            status_name(replay.receipt.status),
            Some(true),
            Some(receipt.delivery_count),
            replay.receipt.result_revision,
        );
        result
    }

    /// Asks the resolver about an operation in doubt and records its answer. `Err` is the
    /// answer to give the agent instead.
    fn settle(&self, receipt: &Receipt) -> Result<(), Box<CallToolResult>> {
        let Some(resolver) = &self.resolver else {
            return Err(Box::new(in_doubt(receipt)));
        };
        match resolver(&self.journal, receipt) {
            Ok(Some(resolution)) => {
                match self.journal.resolve(&receipt.operation_id, resolution) {
                    Ok(_) => Ok(()),
                    // Settled meanwhile by another call: ask the journal again.
                    Err(e) if matches!(e.kind(), ErrorKind::InvalidState { .. }) => Ok(()),
                    Err(e) => Err(Box::new(tool_error(
                        format!(
                            "operation `{}` is in doubt and could not be settled ({e}); check the project before doing anything else, and do not call again with a new id",
                            receipt.operation_id
                        ),
                        "in_doubt",
                        Some(&receipt.operation_id),
                    ))),
                }
            }
            Ok(None) => Err(Box::new(in_doubt(receipt))),
            Err(why) => Err(Box::new(tool_error(
                format!(
                    "operation `{}` is in doubt and the server could not tell whether its change was made ({why}); check the project before doing anything else, and do not call again with a new id",
                    receipt.operation_id
                ),
                "in_doubt",
                Some(&receipt.operation_id),
            ))),
        }
    }
}

/// Acknowledges `ids` for `session`; an id another session owns, or that aged out, is
/// skipped (the acknowledgement is a hint, the clocks free everything anyway).
fn acknowledge(journal: &Journal, session: &str, ids: &[String]) {
    for id in ids {
        let _ = journal.acknowledge(id, Some(session));
    }
}

/// A refusal of `submit` as the answer, or a reason to wait.
fn refused(id: &str, e: &Error) -> Round {
    let (message, status) = match e.kind() {
        ErrorKind::ScopeBusy { holder, .. } => {
            return Round::Wait {
                holder: holder.clone(),
                why: Waiting::ScopeBusy,
            };
        }
        ErrorKind::IntentMismatch { .. } => (
            format!(
                "operation_id `{id}` was already used for a different call (other tool or other arguments); nothing was run. Use a new operation_id for a new change, or repeat the original call exactly to get its result"
            ),
            "mismatch",
        ),
        ErrorKind::StaleBase { current, base, .. } => (
            format!(
                "the project is at revision {current}, and this call was made on revision {base}: nothing was run. Read the project again and decide whether the change still makes sense (with a new operation_id if it differs)"
            ),
            "stale_base",
        ),
        ErrorKind::WindowFull { frees_at, .. } => (
            format!(
                "this session has too many results that were never acknowledged; nothing was run. Call again with the same operation_id after {frees_at}"
            ),
            "window_full",
        ),
        ErrorKind::InvalidInput { .. } => (format!("{e}"), "invalid"),
        _ => (
            format!(
                "the server could not record the operation ({e}); nothing was run. Call again with the same operation_id later"
            ),
            "unavailable",
        ),
    };
    Round::Answer(tool_error(message, status, Some(id)))
}
