//! Journaled tools for servers of the Model Context Protocol (MCP), on the official Rust
//! SDK, [`rmcp`]. (Enabled by the `mcp` feature, which the `cli` feature turns on;
//! embedders with `default-features = false` do not compile it, nor rmcp or tokio.)
//!
//! An agent calls an editor's tools over MCP; a mutating `tools/call` is exactly the
//! operation the journal exists for, and MCP has no idempotency key of its own: when the
//! connection drops after the edit committed, the agent (or its SDK) calls the tool again.
//! A *journaled* tool answers that second call with the recorded result instead of
//! editing twice.
//!
//! - The tool takes [`OpArgs<T>`]: its own arguments `T` plus a required `operation_id`,
//!   which the tool description tells the model to reuse when it retries the same call.
//!   `_meta["dev.opjournal/operation_id"]` is accepted too.
//! - Its handler builds a [`ToolCall`] (tool name + arguments = the intent; a scope and a
//!   base revision where the tool declares them) and gives [`Journaled::run`] a closure
//!   that makes the change and returns an [`Effect`]. The closure runs on a blocking
//!   thread, detached from the request: a disconnect or `notifications/cancelled` never
//!   stops it half-way, and its outcome is recorded for the call that comes again.
//! - Every answer carries `_meta` entries under `dev.opjournal/`: [`META_REPLAYED`],
//!   [`META_DELIVERY`], [`META_RESULT_REVISION`], [`META_STATUS`], [`META_OPERATION_ID`].
//! - Over Streamable HTTP, [`JournalEventStore`] is rmcp's event store for streams resumed
//!   with `Last-Event-ID`: a resumed stream gets the recorded result from the journal.
//! - `editor` (with the `service` feature) is the reference editor over MCP (`opjournal serve
//!   --mcp`).
//!
//! `docs/mcp.md` in the repository shows what the agent sees in each case, what stands for
//! an acknowledgement, and which protocol revisions and SDK versions this was tested with.
//!
//! # Example
//!
//! A server with one journaled tool, in the style rmcp servers are written:
//!
//! ```
//! use std::sync::{Arc, Mutex};
//!
//! use opjournal::Journal;
//! use opjournal::mcp::{Effect, Journaled, OpArgs, ToolCall};
//! use rmcp::handler::server::{router::tool::ToolRouter, wrapper::Parameters};
//! use rmcp::model::{CallToolResult, ContentBlock};
//! use rmcp::service::RequestContext;
//! use rmcp::{ErrorData, RoleServer, ServerHandler, tool, tool_handler, tool_router};
//!
//! #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
//! struct AddLight {
//!     /// Where the light goes.
//!     near: String,
//! }
//!
//! #[derive(Clone)]
//! struct Editor {
//!     lights: Arc<Mutex<Vec<String>>>, // the project
//!     journaled: Journaled,
//!     tool_router: ToolRouter<Editor>,
//! }
//!
//! #[tool_router]
//! impl Editor {
//!     #[tool(name = "add_light", description = "Add a light near an object.")]
//!     async fn add_light(
//!         &self,
//!         Parameters(args): Parameters<OpArgs<AddLight>>,
//!         ctx: RequestContext<RoleServer>,
//!     ) -> Result<CallToolResult, ErrorData> {
//!         let call = ToolCall::new("add_light", &args, &ctx);
//!         let lights = self.lights.clone();
//!         self.journaled
//!             .run(call, move |_claim| {
//!                 // The effect: runs once per operation id, on a blocking thread.
//!                 let mut lights = lights.lock().unwrap_or_else(|e| e.into_inner());
//!                 lights.push(args.args.near.clone());
//!                 let text = format!("light {} added near {}", lights.len(), args.args.near);
//!                 Effect::done(CallToolResult::success(vec![ContentBlock::text(text)]))
//!             })
//!             .await
//!     }
//! }
//!
//! #[tool_handler(router = self.tool_router)]
//! impl ServerHandler for Editor {}
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! let journal = Journal::open(dir.path().join("project.opj"))?;
//! let editor = Editor {
//!     lights: Arc::default(),
//!     journaled: Journaled::new(journal),
//!     tool_router: Editor::tool_router(),
//! };
//! // Serve it: `editor.serve(rmcp::transport::stdio())`, or behind rmcp's
//! // `StreamableHttpService` (see `opjournal::mcp::editor` for both).
//! # let _ = editor;
//! # Ok(())
//! # }
//! ```

mod answers;
mod args;
mod call;
#[cfg(feature = "service")]
pub mod editor;
mod events;
mod journaled;

pub use args::{OPERATION_ID_DESCRIPTION, OpArgs};
pub use call::{Effect, ToolCall};
pub use events::{DEFAULT_MAX_STREAMS, JournalEventStore};
pub use journaled::{DEFAULT_WAIT, Journaled, Resolver};
#[cfg(feature = "service")]
pub(crate) use journaled::{Step, StepHook};

/// The prefix of every `_meta` entry opjournal reads or writes.
pub const META_PREFIX: &str = "dev.opjournal/";
/// Request `_meta`: the operation id, for clients that carry it outside the arguments.
/// Result `_meta`: the operation id the answer is about.
pub const META_OPERATION_ID: &str = "dev.opjournal/operation_id";
/// Result `_meta`: `true` when the answer repeats a recorded outcome (the effect did not
/// run again), `false` for the first answer of a new execution.
pub const META_REPLAYED: &str = "dev.opjournal/replayed";
/// Result `_meta`: which delivery of this result the answer is (1 for the first).
pub const META_DELIVERY: &str = "dev.opjournal/delivery";
/// Result `_meta`: the scope revision the operation produced.
pub const META_RESULT_REVISION: &str = "dev.opjournal/result_revision";
/// Result `_meta`: what the answer is: `applied`, `failed` (recorded outcomes),
/// `not_applied` (refused before any change, not recorded), `running`, `busy`,
/// `in_doubt`, `expired`, `mismatch`, `stale_base`, `window_full`, `invalid`,
/// `unrecorded`, `unavailable`.
pub const META_STATUS: &str = "dev.opjournal/status";

/// docs/mcp.md's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../../docs/mcp.md")]
struct McpGuideDoctests;
