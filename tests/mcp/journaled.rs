//! `opjournal::mcp::Journaled` on its own (issue 24): a small rmcp server with one journaled
//! tool, and rmcp's client, over an in-memory pipe. The answers an agent gets that the
//! reference editor does not produce on demand: an operation in doubt without a resolver,
//! an expired result, a panicking effect, a recorded tool error, a call still running
//! past the wait, and a busy scope.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opjournal::mcp::{Effect, Journaled, OpArgs, ToolCall};
use opjournal::{Admission, Intent, Journal, ManualClock, Operation, Timestamp};
use rmcp::handler::server::{router::tool::ToolRouter, wrapper::Parameters};
use rmcp::model::{CallToolRequestParams, CallToolResult, ContentBlock};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt, tool, tool_handler, tool_router};
use serde_json::{Value, json};

type TestResult = Result<(), Box<dyn std::error::Error>>;

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
struct Act {
    /// What to do: `ok`, `fail` (a tool error), `panic`, or `hold` (wait for the gate).
    what: String,
}

/// Lets held effects go on.
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    cv: std::sync::Condvar,
}

impl Gate {
    fn wait(&self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        while !*open {
            open = self.cv.wait(open).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn open(&self) {
        *self.open.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.cv.notify_all();
    }
}

#[derive(Clone)]
struct Server {
    runs: Arc<AtomicUsize>,
    gate: Arc<Gate>,
    journaled: Journaled,
    tool_router: ToolRouter<Server>,
}

#[tool_router]
impl Server {
    #[tool(
        name = "act",
        description = "Does what it is told, once per operation id."
    )]
    async fn act(
        &self,
        Parameters(args): Parameters<OpArgs<Act>>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let call = ToolCall::new("act", &args, &ctx).scope("project");
        let runs = self.runs.clone();
        let gate = self.gate.clone();
        let what = args.args.what;
        self.journaled
            .run(call, move |_claim| {
                let n = runs.fetch_add(1, Ordering::SeqCst) as u64 + 1;
                match what.as_str() {
                    "panic" => panic!("the effect broke"),
                    "fail" => Effect::done(CallToolResult::error(vec![ContentBlock::text(
                        "the printer caught fire",
                    )])),
                    "hold" => {
                        gate.wait();
                        Effect::done(CallToolResult::success(vec![ContentBlock::text(
                            "held, done",
                        )]))
                        .at_revision(n)
                    }
                    _ => Effect::done(CallToolResult::success(vec![ContentBlock::text(format!(
                        "run {n}"
                    ))]))
                    .at_revision(n),
                }
            })
            .await
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Server {}

type Client = rmcp::service::RunningService<rmcp::RoleClient, ()>;

struct Setup {
    server: Server,
    clock: ManualClock,
    journal: Journal,
    _dir: tempfile::TempDir,
}

fn setup(wait: Duration) -> Result<Setup, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let clock = ManualClock::new(Timestamp::from_millis(1_800_000_000_000));
    let journal = Journal::builder()
        .clock(clock.clone())
        .lease(Duration::from_secs(60))
        .open(dir.path().join("p.opj"))?;
    let server = Server {
        runs: Arc::default(),
        gate: Arc::default(),
        journaled: Journaled::new(journal.clone()).with_wait(wait),
        tool_router: Server::tool_router(),
    };
    Ok(Setup {
        server,
        clock,
        journal,
        _dir: dir,
    })
}

async fn connect(server: &Server) -> Result<Client, Box<dyn std::error::Error>> {
    let (client_io, server_io) = tokio::io::duplex(64 * 1024);
    let served = server.clone();
    tokio::spawn(async move {
        if let Ok(running) = served.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    Ok(().serve(client_io).await?)
}

async fn act(
    client: &Client,
    id: &str,
    what: &str,
) -> Result<CallToolResult, Box<dyn std::error::Error>> {
    let args = json!({"operation_id": id, "what": what});
    let Value::Object(args) = args else {
        return Err("not an object".into());
    };
    Ok(client
        .call_tool(CallToolRequestParams::new("act").with_arguments(args))
        .await?)
}

fn meta(r: &CallToolResult, key: &str) -> Value {
    r.meta
        .as_ref()
        .and_then(|m| m.0.get(&format!("dev.opjournal/{key}")).cloned())
        .unwrap_or(Value::Null)
}

fn text(r: &CallToolResult) -> String {
    match r.content.first() {
        Some(ContentBlock::Text(t)) => t.text.clone(),
        _ => String::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_in_doubt_is_reported_to_the_agent_when_no_resolver_can_tell() -> TestResult {
    let s = setup(Duration::from_secs(5))?;
    // A claim whose holder vanished: submitted, never completed, its lease run out.
    let intent = Intent::from_json("act", &json!({"what": "ok"}))?;
    let Admission::Fresh(_claim) = s
        .journal
        .submit(Operation::new("op_d", intent).scope("project"))?
    else {
        return Err("not fresh".into());
    };
    s.clock.advance(Duration::from_secs(61));
    let client = connect(&s.server).await?;
    let r = act(&client, "op_d", "ok").await?;
    assert_eq!(r.is_error, Some(true), "{r:?}");
    assert_eq!(meta(&r, "status"), "in_doubt");
    assert!(text(&r).contains("Check the project"), "{}", text(&r));
    assert!(text(&r).contains("do not retry blindly"), "{}", text(&r));
    assert_eq!(
        s.server.runs.load(Ordering::SeqCst),
        0,
        "never run on its own"
    );
    client.cancel().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_result_says_refresh_do_not_retry_with_its_old_revision() -> TestResult {
    let s = setup(Duration::from_secs(5))?;
    let client = connect(&s.server).await?;
    let first = act(&client, "op_e", "ok").await?;
    assert_eq!(meta(&first, "result_revision"), 1);
    s.clock.advance(Duration::from_secs(8 * 24 * 3600)); // past the 7-day result retention
    let r = act(&client, "op_e", "ok").await?;
    assert_eq!(r.is_error, Some(true), "{r:?}");
    assert_eq!(meta(&r, "status"), "expired");
    assert_eq!(meta(&r, "result_revision"), 1);
    assert!(text(&r).contains("applied, at revision 1"), "{}", text(&r));
    assert!(text(&r).contains("do not retry"), "{}", text(&r));
    assert_eq!(s.server.runs.load(Ordering::SeqCst), 1);
    client.cancel().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_effect_and_a_tool_error_are_recorded_as_failures_and_replayed() -> TestResult {
    let s = setup(Duration::from_secs(5))?;
    let client = connect(&s.server).await?;
    for (id, what, says) in [
        ("op_p", "panic", "the tool panicked"),
        ("op_f", "fail", "the printer caught fire"),
    ] {
        let first = act(&client, id, what).await?;
        assert_eq!(first.is_error, Some(true), "{first:?}");
        assert_eq!(meta(&first, "status"), "failed");
        assert_eq!(meta(&first, "replayed"), false);
        assert!(text(&first).contains(says), "{}", text(&first));
        let again = act(&client, id, what).await?;
        assert_eq!(meta(&again, "replayed"), true);
        assert_eq!(meta(&again, "status"), "failed");
        assert_eq!(text(&again), text(&first));
        let receipt = s.journal.lookup(id)?.ok_or("not recorded")?;
        assert!(
            receipt.failure.as_deref().is_some_and(|f| f.contains(says)),
            "{receipt:?}"
        );
    }
    assert_eq!(
        s.server.runs.load(Ordering::SeqCst),
        2,
        "each effect ran once"
    );
    client.cancel().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_past_the_wait_is_told_to_call_again_and_then_gets_the_result() -> TestResult {
    let s = setup(Duration::from_millis(300))?;
    let first_client = connect(&s.server).await?;
    let second = connect(&s.server).await?;
    let held = tokio::spawn(async move {
        act(&first_client, "op_h", "hold")
            .await
            .map_err(|e| e.to_string())
    });
    while s.server.journaled.running() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let r = act(&second, "op_h", "hold").await?;
    assert_eq!(meta(&r, "status"), "running", "{r:?}");
    assert!(
        text(&r).contains("call again with the same operation_id"),
        "{}",
        text(&r)
    );
    // Another operation on the same scope waits for it, then is told the scope is busy.
    let busy = act(&second, "op_other", "ok").await?;
    assert_eq!(meta(&busy, "status"), "busy", "{busy:?}");
    s.server.gate.open();
    let done = held.await??;
    assert_eq!(meta(&done, "replayed"), false);
    let again = act(&second, "op_h", "hold").await?;
    assert_eq!(meta(&again, "replayed"), true);
    let other = act(&second, "op_other", "ok").await?;
    assert_eq!(meta(&other, "status"), "applied", "the scope is free again");
    assert_eq!(s.server.runs.load(Ordering::SeqCst), 2);
    second.cancel().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_waiting_on_a_busy_scope_runs_once_the_scope_is_free() -> TestResult {
    let s = setup(Duration::from_secs(10))?;
    let a = connect(&s.server).await?;
    let b = connect(&s.server).await?;
    let held =
        tokio::spawn(async move { act(&a, "op_a", "hold").await.map_err(|e| e.to_string()) });
    while s.server.journaled.running() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let gate = s.server.gate.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        gate.open();
    });
    let r = act(&b, "op_b", "ok").await?;
    assert_eq!(meta(&r, "status"), "applied", "{r:?}");
    assert_eq!(meta(&r, "result_revision"), 2, "after op_a");
    held.await??;
    b.cancel().await?;
    Ok(())
}
