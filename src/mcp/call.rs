//! What a journaled tool's handler gives [`Journaled::run`](super::Journaled::run): the
//! [`ToolCall`] (the tool, its arguments as the intent, the operation id, a scope and base
//! revision where the tool declares them) and, from its closure, the [`Effect`].
//!
//! A call that cannot run (no operation id, two different ones, arguments that are not a
//! JSON object) is still a `ToolCall`: it carries the problem, and `run` answers it with a
//! tool error without running anything, so a handler never has to check first.

use rmcp::RoleServer;
use rmcp::model::{CallToolResult, JsonObject};
use rmcp::service::RequestContext;
use serde::Serialize;
use serde_json::Value;

use super::META_OPERATION_ID;
use super::args::OpArgs;

/// One journaled `tools/call`: the tool, its arguments (the intent), the operation id, and
/// the scope and base revision where the tool declares them. Build it with
/// [`ToolCall::new`] in the handler, then pass it to [`Journaled::run`](super::Journaled::run).
#[derive(Clone, Debug)]
pub struct ToolCall {
    pub(super) tool: String,
    pub(super) operation_id: Option<String>,
    /// Why the call cannot run (no operation id, two of them, arguments that are not an
    /// object): answered as a tool error without running anything.
    pub(super) problem: Option<String>,
    pub(super) args: Value,
    pub(super) scope: Option<String>,
    pub(super) base_revision: Option<u64>,
    pub(super) allow_stale_base: bool,
    pub(super) session: CallSession,
}

/// Which session of the transport a call came in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum CallSession {
    /// A Streamable HTTP session (`Mcp-Session-Id`).
    Http(String),
    /// A Streamable HTTP request without a session (protocol 2026-07-28).
    Stateless,
    /// Another transport (stdio): one connection per server process.
    Connection,
}

/// Reads the Streamable HTTP session of a request: `Some(None)` for an HTTP request without
/// one, `None` for a request that did not come over HTTP.
fn http_session(ctx: &RequestContext<RoleServer>) -> Option<Option<String>> {
    let parts = ctx.extensions.get::<http::request::Parts>()?;
    Some(
        parts
            .headers
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
    )
}

impl ToolCall {
    /// A call of `tool` with `args` (as the handler received them), in the request `ctx`.
    ///
    /// The intent is `tool` with the RFC 8785 canonical JSON of `args.args` (the arguments
    /// without `operation_id`; a `base_revision` argument, if the tool declares one, is a
    /// precondition and not part of the intent, see [`ToolCall::scope`]). The operation id
    /// is `args.operation_id`, or else the request's `_meta` entry
    /// [`META_OPERATION_ID`](super::META_OPERATION_ID). A call without an id, with two
    /// different ids, or whose arguments are not a JSON object is answered by
    /// [`Journaled::run`](super::Journaled::run) with a tool error, without running anything.
    pub fn new<T: Serialize>(
        tool: &str,
        args: &OpArgs<T>,
        ctx: &RequestContext<RoleServer>,
    ) -> ToolCall {
        match serde_json::to_value(&args.args) {
            Ok(Value::Object(object)) => {
                ToolCall::from_arguments(tool, args.operation_id.clone(), object, ctx)
            }
            Ok(other) => ToolCall::broken(
                tool,
                ctx,
                format!("the arguments of `{tool}` must be a JSON object, not `{other}`"),
            ),
            Err(e) => ToolCall::broken(
                tool,
                ctx,
                format!("the arguments of `{tool}` could not be read as JSON: {e}"),
            ),
        }
    }

    /// A call of `tool` with untyped arguments (for a hand-written `call_tool`):
    /// `operation_id` is the argument of that name if present (remove it from `arguments`
    /// or leave it: it is never part of the intent).
    pub fn from_arguments(
        tool: &str,
        operation_id: Option<String>,
        mut arguments: JsonObject,
        ctx: &RequestContext<RoleServer>,
    ) -> ToolCall {
        let from_args = operation_id.or_else(|| match arguments.remove("operation_id") {
            Some(Value::String(s)) => Some(s),
            _ => None,
        });
        arguments.remove("operation_id");
        let from_meta = ctx
            .meta
            .0
            .0
            .get(META_OPERATION_ID)
            .and_then(Value::as_str)
            .map(str::to_string);
        let mut problem = None;
        let operation_id = match (from_args, from_meta) {
            (Some(a), Some(m)) if a != m => {
                problem = Some(format!(
                    "the call carries two operation ids: `{a}` in its arguments and `{m}` in `_meta[\"{META_OPERATION_ID}\"]`; send one"
                ));
                None
            }
            (Some(a), _) => Some(a),
            (None, Some(m)) => Some(m),
            (None, None) => {
                problem = Some(format!(
                    "`{tool}` changes the project and needs an `operation_id`: choose a new one (a UUID) for this change, and reuse it if you call again for the same change"
                ));
                None
            }
        };
        let base_revision = match arguments.remove("base_revision") {
            Some(v) if v.is_null() => None,
            Some(v) => match v.as_u64() {
                Some(r) => Some(r),
                None => {
                    problem.get_or_insert(format!(
                        "`base_revision` must be a non-negative integer (the revision you last read), not `{v}`"
                    ));
                    None
                }
            },
            None => None,
        };
        ToolCall {
            tool: tool.to_string(),
            operation_id,
            problem,
            args: Value::Object(arguments),
            scope: None,
            base_revision,
            allow_stale_base: false,
            session: ToolCall::session_of(ctx),
        }
    }

    fn broken(tool: &str, ctx: &RequestContext<RoleServer>, problem: String) -> ToolCall {
        ToolCall {
            tool: tool.to_string(),
            operation_id: None,
            problem: Some(problem),
            args: Value::Null,
            scope: None,
            base_revision: None,
            allow_stale_base: false,
            session: ToolCall::session_of(ctx),
        }
    }

    pub(super) fn session_of(ctx: &RequestContext<RoleServer>) -> CallSession {
        match http_session(ctx) {
            Some(Some(id)) => CallSession::Http(id),
            Some(None) => CallSession::Stateless,
            None => CallSession::Connection,
        }
    }

    /// The scope the tool mutates (revisions and the mutation lock are per scope). A
    /// `base_revision` argument, when the tool declares one, is checked against it: a call
    /// made on an older revision is refused with a tool error that says to read again.
    pub fn scope(mut self, scope: impl Into<String>) -> ToolCall {
        self.scope = Some(scope.into());
        self
    }

    /// Sets the base revision (instead of, or over, a `base_revision` argument).
    pub fn base_revision(mut self, revision: u64) -> ToolCall {
        self.base_revision = Some(revision);
        self
    }

    /// Accepts a base revision older than the scope's (the tool merges itself).
    pub fn allow_stale_base(mut self) -> ToolCall {
        self.allow_stale_base = true;
        self
    }

    /// The operation id, if the call carries one.
    pub fn operation_id(&self) -> Option<&str> {
        self.operation_id.as_deref()
    }

    /// The tool's name.
    pub fn tool(&self) -> &str {
        &self.tool
    }

    /// The arguments that make the intent (without `operation_id` and `base_revision`).
    pub fn arguments(&self) -> &Value {
        &self.args
    }
}

/// What a journaled tool's effect produced, returned by the closure given to
/// [`Journaled::run`](super::Journaled::run).
#[derive(Clone, Debug)]
#[must_use]
pub struct Effect {
    pub(super) kind: EffectKind,
    pub(super) result: CallToolResult,
    pub(super) revision: Option<u64>,
    pub(super) changed_assets: Vec<String>,
}

/// Whether the effect happened (its outcome is recorded) or was refused before any change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum EffectKind {
    Done,
    NotApplied,
}

impl Effect {
    /// The effect happened (or failed after it may have started, when `result.is_error` is
    /// `Some(true)`): `result` is recorded as the operation's outcome (applied, or failed
    /// with the text of its content as the message), and every later call with the same
    /// operation id is answered with it, marked as a replay, without running the effect.
    pub fn done(result: CallToolResult) -> Effect {
        Effect {
            kind: EffectKind::Done,
            result,
            revision: None,
            changed_assets: Vec::new(),
        }
    }

    /// Nothing changed: the call was refused before any effect (the arguments do not fit the
    /// project, a precondition does not hold). The operation is released, so its id is
    /// free again and a corrected call with the same id runs; `result` (usually a tool
    /// error saying why) is answered once and not recorded.
    pub fn not_applied(result: CallToolResult) -> Effect {
        Effect {
            kind: EffectKind::NotApplied,
            result,
            revision: None,
            changed_assets: Vec::new(),
        }
    }

    /// The scope revision the effect produced (for a tool with a scope: it must move the
    /// scope forward). Without it an applied outcome is recorded at revision 0, which only a
    /// tool without a scope may do.
    pub fn at_revision(mut self, revision: u64) -> Effect {
        self.revision = Some(revision);
        self
    }

    /// The assets the effect changed, recorded on the receipt beside the result (what
    /// `opjournal show` lists, and what the JSON Lines service answers as `changed` when
    /// the same operation reaches it). Each must be a valid name of at most
    /// [`MAX_NAME_BYTES`](crate::MAX_NAME_BYTES) bytes, or the outcome cannot be recorded
    /// and the call is answered as `unrecorded`.
    pub fn changed_assets<I, S>(mut self, assets: I) -> Effect
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.changed_assets = assets.into_iter().map(Into::into).collect();
        self
    }
}
