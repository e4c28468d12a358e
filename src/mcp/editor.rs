//! The reference editor over MCP: the scene document of [`crate::service`] as tools, the
//! mutating ones journaled. `opjournal serve --mcp` runs it over stdio, and with `--port`
//! over Streamable HTTP at `http://127.0.0.1:PORT/mcp`.
//!
//! Tools: `scene.read` (a plain tool: the objects and the revision), and `scene.add`,
//! `scene.rename`, `scene.delete`, journaled: each takes an `operation_id` and an optional
//! `base_revision` (the revision the agent read; an older one is refused). The edit is made
//! durable in the document (one synced log line, [`DocumentStore`]) before its outcome is
//! recorded, as in the JSON Lines service; an operation found in doubt (a crash between the
//! two) is settled by looking at the document, at start and whenever a call meets one.
//! The intent of `scene.add {object, beside}` is the JSON Lines service's intent of the same
//! edit ([`Edit::intent`]), so both front ends settle each other's operations alike.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use rmcp::handler::server::{router::tool::ToolRouter, wrapper::Parameters};
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{Effect, JournalEventStore, Journaled, OpArgs, Step, ToolCall};
use crate::service::{
    ApplyError, Document, DocumentStore, Edit, Notes, Pauses, Reconciled, SCOPE, ServiceError,
    Stage, Verdict, describe_reconciled,
};
use crate::{Journal, Outcome, Receipt, Resolution};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How the editor runs. Start from [`EditorConfig::new`] and change the fields.
#[non_exhaustive]
pub struct EditorConfig {
    /// The document file (its log and temporary file live beside it).
    pub document: PathBuf,
    /// How long the document remembers which operations it applied (default 90 days, the
    /// journal's default audit retention). In-doubt operations are settled from it.
    pub applied_retention: Duration,
    /// Edits between two snapshots of the document (default 1,000).
    pub snapshot_every: usize,
    /// How long a call waits for a running duplicate or a busy scope (default
    /// [`DEFAULT_WAIT`](super::DEFAULT_WAIT)).
    pub wait: Duration,
    /// Where notes go (what was settled at start; default: nowhere).
    pub notes: Notes,
}

impl EditorConfig {
    /// The defaults, editing the document at `document`.
    pub fn new(document: impl Into<PathBuf>) -> EditorConfig {
        EditorConfig {
            document: document.into(),
            applied_retention: Duration::from_secs(90 * 24 * 3600),
            snapshot_every: 1000,
            wait: super::DEFAULT_WAIT,
            notes: Box::new(|_| {}),
        }
    }
}

impl std::fmt::Debug for EditorConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EditorConfig")
            .field("document", &self.document)
            .field("applied_retention", &self.applied_retention)
            .field("snapshot_every", &self.snapshot_every)
            .field("wait", &self.wait)
            .finish_non_exhaustive()
    }
}

/// The arguments of `scene.add`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct AddArgs {
    /// The new object's name.
    pub object: String,
    /// The existing object it is placed beside.
    pub beside: String,
    /// The scene revision you last read (from `scene.read`); the call is refused if the
    /// scene changed since. Optional.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_revision: Option<u64>,
}

/// The arguments of `scene.rename`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct RenameArgs {
    /// The object's current name.
    pub from: String,
    /// Its new name.
    pub to: String,
    /// The scene revision you last read (from `scene.read`); the call is refused if the
    /// scene changed since. Optional.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_revision: Option<u64>,
}

/// The arguments of `scene.delete`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct DeleteArgs {
    /// The object's name.
    pub object: String,
    /// The scene revision you last read (from `scene.read`); the call is refused if the
    /// scene changed since. Optional.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_revision: Option<u64>,
}

/// The reference editor as an MCP server (an rmcp [`ServerHandler`]). Cheap to clone:
/// clones share the document and the journal.
#[derive(Clone)]
pub struct SceneEditor {
    journaled: Journaled,
    document: Arc<Mutex<DocumentStore>>,
    document_path: Arc<PathBuf>,
    pauses: Arc<Pauses>,
    notes: Arc<Notes>,
    tool_router: ToolRouter<SceneEditor>,
}

impl std::fmt::Debug for SceneEditor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SceneEditor")
            .field("journaled", &self.journaled)
            .finish_non_exhaustive()
    }
}

impl SceneEditor {
    /// Loads the document, settles every operation left in doubt by looking at it (each
    /// is returned, for the notes), reports the document's revision to the journal, and
    /// returns the editor.
    ///
    /// # Errors
    ///
    /// [`ServiceError::Document`] or [`ServiceError::Io`] when the document cannot be
    /// loaded; [`ServiceError::Journal`] when the in-doubt operations cannot be listed or
    /// settled, or the revision cannot be reported.
    pub fn open(
        journal: Journal,
        cfg: EditorConfig,
    ) -> Result<(SceneEditor, Vec<Reconciled>), ServiceError> {
        let jerr = |what: &str| {
            let what = what.to_string();
            move |source| ServiceError::Journal { what, source }
        };
        let mut store = DocumentStore::open(&cfg.document, cfg.applied_retention, journal.now())?;
        store.snapshot_every = cfg.snapshot_every;
        let mut settled = Vec::new();
        for r in journal
            .in_doubt()
            .map_err(jerr("list in-doubt operations"))?
        {
            let resolution = resolution_from(store.document(), &r);
            let applied_at = match &resolution {
                Resolution::Completed(o) => match o.kind() {
                    crate::OutcomeKind::Applied { result_revision } => Some(*result_revision),
                    _ => None,
                },
                _ => None,
            };
            journal
                .resolve(&r.operation_id, resolution)
                .map_err(jerr(&format!("resolve `{}`", r.operation_id)))?;
            settled.push(Reconciled {
                id: r.operation_id.clone(),
                cause: r.in_doubt_cause,
                applied_at,
            });
        }
        let revision = store.document().revision();
        journal
            .advance_revision(SCOPE, revision)
            .map_err(jerr(&format!("report revision {revision} of `{SCOPE}`")))?;
        for r in &settled {
            (cfg.notes)(describe_reconciled(r));
        }
        let cfg_document = cfg.document.clone();
        let document = Arc::new(Mutex::new(store));
        let pauses = Arc::new(Pauses::default());
        let held = pauses.clone();
        let notes = Arc::new(cfg.notes);
        let hook_notes = notes.clone();
        let hook: super::StepHook = Arc::new(move |step, id| {
            let stage = match step {
                Step::Accepted => Stage::Accepted,
                Step::Mutated => Stage::Mutated,
                Step::Committed => Stage::Committed,
            };
            let verdict = held.reach(stage, id);
            if verdict == Verdict::Crash {
                hook_notes(format!(
                    "`{id}` stopped dead at {stage:?} (fault injection)"
                ));
            }
            verdict != Verdict::Crash
        });
        let settle_doc = document.clone();
        let resolver: super::Resolver = Arc::new(move |_: &Journal, r: &Receipt| {
            let store = lock(&settle_doc);
            Ok(Some(resolution_from(store.document(), r)))
        });
        let journaled = Journaled::new(journal)
            .with_wait(cfg.wait)
            .with_resolver(resolver)
            .with_hook(hook);
        Ok((
            SceneEditor {
                journaled,
                document,
                document_path: Arc::new(cfg_document),
                pauses,
                notes,
                tool_router: SceneEditor::tool_router(),
            },
            settled,
        ))
    }

    /// A copy of the document as it stands.
    pub fn document(&self) -> Document {
        lock(&self.document).document().clone()
    }

    /// The fault-injection device (tests): hold an operation at an exact step.
    pub fn pauses(&self) -> &Pauses {
        &self.pauses
    }

    /// The journaled-tools helper (its journal, its counters).
    pub fn journaled(&self) -> &Journaled {
        &self.journaled
    }

    /// Writes a snapshot of the document if edits were logged since the last one (at a
    /// clean stop).
    ///
    /// # Errors
    ///
    /// [`ServiceError::Io`] naming the step that failed (the log keeps every edit).
    pub fn snapshot(&self) -> Result<(), ServiceError> {
        let now = self.journaled.journal().now();
        let mut store = lock(&self.document);
        if store.logged() > 0 {
            store.write_snapshot(now)?;
        }
        Ok(())
    }

    async fn edit(&self, mut call: ToolCall, edit: Edit) -> Result<CallToolResult, ErrorData> {
        // Refused before anything is recorded, as the JSON Lines front end refuses it: a
        // name too long for the outcome's changed asset (or its result's size) would be
        // applied and then fail to be recorded.
        if let Err(e) = edit.validate() {
            call.problem.get_or_insert(e.to_string());
        }
        let document = self.document.clone();
        let path = self.document_path.clone();
        let journal = self.journaled.journal().clone();
        let notes = self.notes.clone();
        let asked = edit.clone();
        let result = self
            .journaled
            .run(call.scope(SCOPE), move |claim| {
                let at = Doc {
                    store: &document,
                    path: &path,
                };
                apply(&at, &journal, &notes, claim.operation_id(), &edit)
            })
            .await?;
        Ok(in_editor_form(result, &asked))
    }
}

/// The document and the path it was loaded from.
struct Doc<'a> {
    store: &'a Mutex<DocumentStore>,
    path: &'a std::path::Path,
}

/// Makes the edit durable in the document: the effect of a journaled scene tool.
fn apply(document: &Doc<'_>, journal: &Journal, notes: &Notes, id: &str, edit: &Edit) -> Effect {
    let mut store = lock(document.store);
    match store.apply(id, edit, journal.now(), || {}) {
        Ok((revision, summary)) => {
            if store.snapshot_due()
                && let Err(e) = store.write_snapshot(journal.now())
            {
                notes(format!(
                    "could not write a snapshot of the document (the log keeps every edit): {}",
                    crate::service::chain(&e)
                ));
            }
            Effect::done(edit_result(revision, &summary, edit))
                .at_revision(revision)
                .changed_assets(edit.changed_assets())
        }
        Err(ApplyError::Refused(reason)) => {
            Effect::not_applied(CallToolResult::error(vec![ContentBlock::text(format!(
                "cannot {}: {reason}. Nothing changed; read the scene (`scene.read`) and try again (the same operation_id may be reused)",
                edit.describe()
            ))]))
        }
        Err(ApplyError::Panicked(message)) => {
            Effect::not_applied(CallToolResult::error(vec![ContentBlock::text(format!(
                "the editor failed while applying {} ({message}); nothing changed, and the same call will fail the same way",
                edit.describe()
            ))]))
        }
        Err(ApplyError::NotSaved(e)) => {
            Effect::not_applied(CallToolResult::error(vec![ContentBlock::text(format!(
                "the document could not be saved ({}); nothing changed. Call again with the same operation_id in a moment",
                crate::service::chain(&e)
            ))]))
        }
        Err(ApplyError::Uncertain(e)) => {
            let message = format!(
                "the document may or may not have saved {} ({}); read the scene before going on",
                edit.describe(),
                crate::service::chain(&e)
            );
            // The document becomes what its files say, as a restart would see it.
            match DocumentStore::open(document.path, store.retention, journal.now()) {
                Ok(mut reloaded) => {
                    reloaded.snapshot_every = store.snapshot_every;
                    let _ = journal.advance_revision(SCOPE, reloaded.document().revision());
                    *store = reloaded;
                }
                Err(e) => notes(format!(
                    "could not reload the document, keeping it as it was in memory: {}",
                    crate::service::chain(&e)
                )),
            }
            Effect::done(CallToolResult::error(vec![ContentBlock::text(message)]))
        }
    }
}

/// The answer to a scene edit: the summary in words, and as structured content the
/// revision and what changed.
fn edit_result(revision: u64, summary: &str, edit: &Edit) -> CallToolResult {
    let mut result = CallToolResult::success(vec![ContentBlock::text(format!(
        "{summary} (the scene is now at revision {revision})"
    ))]);
    result.structured_content = Some(json!({
        "revision": revision,
        "summary": summary,
        "changed": edit.changed_assets(),
    }));
    result
}

/// A replayed result the JSON Lines service recorded (`{"summary": ...}`, which the replay
/// gives as structured content) in the form this editor answers an edit: the summary in
/// words with the revision, and the revision, summary and changed assets as structured
/// content. Every other result is returned as it is.
fn in_editor_form(mut result: CallToolResult, edit: &Edit) -> CallToolResult {
    let Some(structured) = &result.structured_content else {
        return result;
    };
    if result.is_error == Some(true) || structured.get("revision").is_some() {
        return result;
    }
    let revision = result
        .meta
        .as_ref()
        .and_then(|m| m.0.get(super::META_RESULT_REVISION))
        .and_then(serde_json::Value::as_u64);
    match (structured["summary"].as_str(), revision) {
        (Some(summary), Some(revision)) => {
            let mut shaped = edit_result(revision, summary, edit);
            shaped.meta = result.meta.take();
            shaped
        }
        _ => result,
    }
}

/// How an in-doubt operation ended, from the document: applied at its revision if its
/// edit is there with the same intent, else not applied (a retry runs it anew).
fn resolution_from(doc: &Document, r: &Receipt) -> Resolution {
    let applied = doc.applied(&r.operation_id).filter(|a| {
        a.edit
            .intent()
            .is_ok_and(|intent| r.intent_hash.matches(&intent))
    });
    match applied {
        Some(a) => {
            let bytes = serde_json::to_vec(&edit_result(a.revision, &a.summary, &a.edit))
                .unwrap_or_default();
            Resolution::Completed(
                Outcome::applied(a.revision, bytes).changed_assets(a.edit.changed_assets()),
            )
        }
        None => Resolution::not_applied(),
    }
}

#[tool_router]
impl SceneEditor {
    /// `scene.read`: the scene as it stands.
    #[tool(
        name = "scene.read",
        description = "Read the scene: its objects (each with the object it stands beside) and its revision. Pass the revision as `base_revision` to the editing tools.",
        annotations(read_only_hint = true)
    )]
    async fn read(&self, ctx: RequestContext<RoleServer>) -> Result<CallToolResult, ErrorData> {
        self.journaled.saw_request(&ctx).await;
        let doc = self.document();
        let mut result = CallToolResult::success(vec![ContentBlock::text(format!(
            "revision {}: {}",
            doc.revision(),
            doc.describe()
        ))]);
        result.structured_content = Some(json!({
            "revision": doc.revision(),
            "objects": doc.objects(),
        }));
        Ok(result)
    }

    /// `scene.add`: adds an object beside another.
    #[tool(
        name = "scene.add",
        description = "Add a new object to the scene, beside an existing one. Journaled: give an `operation_id`, and reuse it if you call again for the same change; a repeated call answers with the recorded result (marked `dev.opjournal/replayed`) and never adds twice.",
        annotations(destructive_hint = false, idempotent_hint = true)
    )]
    async fn add(
        &self,
        Parameters(args): Parameters<OpArgs<AddArgs>>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let call = ToolCall::new("scene.add", &args, &ctx);
        let edit = Edit::Add {
            object: args.args.object,
            beside: args.args.beside,
        };
        self.edit(call, edit).await
    }

    /// `scene.rename`: renames an object.
    #[tool(
        name = "scene.rename",
        description = "Rename an object of the scene. Journaled: give an `operation_id`, and reuse it if you call again for the same change; a repeated call answers with the recorded result (marked `dev.opjournal/replayed`) and never renames twice.",
        annotations(destructive_hint = false, idempotent_hint = true)
    )]
    async fn rename(
        &self,
        Parameters(args): Parameters<OpArgs<RenameArgs>>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let call = ToolCall::new("scene.rename", &args, &ctx);
        let edit = Edit::Rename {
            from: args.args.from,
            to: args.args.to,
        };
        self.edit(call, edit).await
    }

    /// `scene.delete`: deletes an object.
    #[tool(
        name = "scene.delete",
        description = "Delete an object of the scene. Journaled: give an `operation_id`, and reuse it if you call again for the same change; a repeated call answers with the recorded result (marked `dev.opjournal/replayed`) and never deletes twice.",
        annotations(destructive_hint = true, idempotent_hint = true)
    )]
    async fn delete(
        &self,
        Parameters(args): Parameters<OpArgs<DeleteArgs>>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let call = ToolCall::new("scene.delete", &args, &ctx);
        let edit = Edit::Delete {
            object: args.args.object,
        };
        self.edit(call, edit).await
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for SceneEditor {
    fn get_info(&self) -> ServerConfig {
        let mut info = ServerConfig::new(ServerCapabilities::builder().enable_tools().build());
        info.server_info = Implementation::new("opjournal-editor", env!("CARGO_PKG_VERSION"));
        info.instructions = Some(
            "A scene editor. Read the scene with `scene.read`; change it with `scene.add`, `scene.rename` and `scene.delete`. Every change takes an `operation_id` you choose: if a call fails, times out or the connection drops, call again with the SAME operation_id and arguments, and you get the recorded result instead of a second change. Results marked `dev.opjournal/replayed: true` repeat an earlier answer."
                .into(),
        );
        info
    }
}

/// Serves `editor` over stdio (what a desktop MCP host launches) until the client closes
/// its end.
///
/// # Errors
///
/// [`ServiceError::Io`] when the MCP session cannot start (no `initialize`, a broken pipe)
/// or ends with an error.
pub async fn serve_stdio(editor: SceneEditor) -> Result<(), ServiceError> {
    let running = editor
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| ServiceError::Io {
            what: "start the MCP session on stdio".into(),
            source: std::io::Error::other(e.to_string()),
        })?;
    running.waiting().await.map_err(|e| ServiceError::Io {
        what: "serve MCP on stdio".into(),
        source: std::io::Error::other(e.to_string()),
    })?;
    Ok(())
}

/// A running Streamable HTTP server (see [`serve_http`]); stops when
/// [`HttpServer::shutdown`] is called or it is dropped.
#[derive(Debug)]
pub struct HttpServer {
    addr: SocketAddr,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl HttpServer {
    /// The address it listens on; the endpoint is `http://ADDR/mcp`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The endpoint's URL.
    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    /// Stops accepting connections, ends the MCP sessions and waits for the accept loop.
    pub async fn shutdown(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Serves `editor` over Streamable HTTP at `/mcp` on `listener`: protocol revisions with
/// sessions (2025-11-25 and older: `Mcp-Session-Id`, streams resumable with
/// `Last-Event-ID` through a [`JournalEventStore`]) and without (2026-07-28). Other paths
/// answer 404. Call it inside a tokio runtime.
///
/// # Errors
///
/// [`ServiceError::Io`] when the listener's address cannot be read.
pub fn serve_http(
    editor: SceneEditor,
    listener: tokio::net::TcpListener,
) -> Result<HttpServer, ServiceError> {
    let events = JournalEventStore::new(editor.journaled().clone());
    serve_http_with(
        editor,
        listener,
        StreamableHttpServerConfig::default(),
        Arc::new(LocalSessionManager::default().with_event_store(Arc::new(events))),
    )
}

/// [`serve_http`] with rmcp's transport settings (keep-alives, the SSE retry interval that
/// lets a client resume a broken stream, allowed hosts) and session manager (its
/// `session_config`: session idle timeout, cache of completed streams; its event store: give
/// it a [`JournalEventStore`] as [`serve_http`] does; keep a handle to count its sessions). The config's
/// cancellation token is replaced by the server's own (see [`HttpServer::shutdown`]).
///
/// # Errors
///
/// [`ServiceError::Io`] when the listener's address cannot be read.
pub fn serve_http_with(
    editor: SceneEditor,
    listener: tokio::net::TcpListener,
    config: StreamableHttpServerConfig,
    sessions: Arc<LocalSessionManager>,
) -> Result<HttpServer, ServiceError> {
    let addr = listener.local_addr().map_err(|source| ServiceError::Io {
        what: "read the listening address".into(),
        source,
    })?;
    let stop = CancellationToken::new();
    let config = config.with_cancellation_token(stop.child_token());
    let service = StreamableHttpService::new(move || Ok(editor.clone()), sessions, config);
    let stopping = stop.clone();
    let task = tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                () = stopping.cancelled() => break,
            };
            let Ok((stream, _)) = accepted else {
                // Out of descriptors, say: wait instead of spinning.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let _ = stream.set_nodelay(true);
            let service = service.clone();
            let conn_stop = stopping.clone();
            tokio::spawn(async move {
                let io = hyper_util::rt::TokioIo::new(stream);
                let svc =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let mut service = service.clone();
                        async move {
                            if req.uri().path() != "/mcp" {
                                return Ok::<_, Infallible>(
                                    http::Response::builder()
                                        .status(http::StatusCode::NOT_FOUND)
                                        .body(
                                            Full::new(Bytes::from_static(
                                                b"Not Found: the MCP endpoint is /mcp",
                                            ))
                                            .boxed(),
                                        )
                                        .unwrap_or_default(),
                                );
                            }
                            tower_service::Service::call(&mut service, req).await
                        }
                    });
                let conn = hyper::server::conn::http1::Builder::new().serve_connection(io, svc);
                tokio::select! {
                    _ = conn => {}
                    () = conn_stop.cancelled() => {}
                }
            });
        }
    });
    Ok(HttpServer {
        addr,
        stop,
        task: Some(task),
    })
}
