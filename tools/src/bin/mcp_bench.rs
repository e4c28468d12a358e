//! The cost of a journaled MCP tool (issue 24): `tools/call` latency through
//! `opjournal::mcp::Journaled` against the same tool without the journal, at 1 and 8
//! clients, and the latency of a replay (the same operation id again).
//!
//! ```text
//! cargo run --release -p opjournal-tools --bin mcp_bench -- [--calls N] [--dir DIR] [--json]
//!     [--exclusive]
//! ```
//!
//! One rmcp server in this process with two tools whose effect is the same, the reference
//! editor's kind of effect: one line appended to a file and `fdatasync`ed, on a blocking
//! thread. `effect.plain` takes `{seq}`; `effect.journaled` takes `{operation_id, seq}` and
//! runs the effect through `Journaled::run` (a submit and a complete, each durable, then a
//! delivery). Each client is its own MCP connection (rmcp's client over an in-memory duplex
//! pipe, so no socket costs are measured), calling one tool `--calls` times (default 400 at
//! one client, that many in all at eight), each call waiting for its answer. The journal
//! and the effect file live in `DIR` (default `target/mcp-bench`), on the same file system.
//! The journal is opened with the default `Sharing::LiveReaders` (two syncs per commit, so
//! that `opjournal ls` can read beside it), or with `--exclusive` `Sharing::Exclusive` (one).
//!
//! `--json` prints JSON Lines (`{"type": ..., "data": ...}`: `latency` rows, a final
//! `summary`); types may be added later.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opjournal::mcp::{Effect, Journaled, OpArgs, ToolCall};
use opjournal::{Journal, Sharing};
use opjournal_tools::stats::{Percentiles, percentiles};
use rmcp::handler::server::{router::tool::ToolRouter, wrapper::Parameters};
use rmcp::model::{CallToolRequestParams, CallToolResult, ContentBlock};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt, tool, tool_handler, tool_router};
use serde_json::json;

type Error = Box<dyn std::error::Error + Send + Sync>;
type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
struct Args {
    /// Which call this is.
    seq: u64,
}

/// The effect both tools make: one synced line.
struct EffectFile {
    file: Mutex<std::fs::File>,
}

impl EffectFile {
    fn append(&self, line: &str) -> std::io::Result<()> {
        let mut f = self
            .file
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f.write_all(line.as_bytes())?;
        f.sync_data()
    }
}

#[derive(Clone)]
struct Bench {
    effect: Arc<EffectFile>,
    journaled: Journaled,
    tool_router: ToolRouter<Bench>,
}

fn done(text: String) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(text)])
}

#[tool_router]
impl Bench {
    #[tool(
        name = "effect.plain",
        description = "Append a synced line (no journal)."
    )]
    async fn plain(&self, Parameters(args): Parameters<Args>) -> Result<CallToolResult, ErrorData> {
        let effect = self.effect.clone();
        tokio::task::spawn_blocking(
            move || match effect.append(&format!("plain {}\n", args.seq)) {
                Ok(()) => Ok(done(format!("appended {}", args.seq))),
                Err(e) => Err(ErrorData::internal_error(e.to_string(), None)),
            },
        )
        .await
        .map_err(|e| ErrorData::internal_error(e.to_string(), None))?
    }

    #[tool(
        name = "effect.journaled",
        description = "Append a synced line, journaled."
    )]
    async fn journaled(
        &self,
        Parameters(args): Parameters<OpArgs<Args>>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let call = ToolCall::new("effect.journaled", &args, &ctx);
        let effect = self.effect.clone();
        let seq = args.args.seq;
        self.journaled
            .run(call, move |claim| {
                match effect.append(&format!("{} {seq}\n", claim.operation_id())) {
                    Ok(()) => Effect::done(done(format!("appended {seq}"))),
                    Err(e) => Effect::not_applied(CallToolResult::error(vec![ContentBlock::text(
                        e.to_string(),
                    )])),
                }
            })
            .await
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Bench {}

type Client = rmcp::service::RunningService<rmcp::RoleClient, ()>;

/// A new MCP connection to `server` over an in-memory pipe.
async fn connect(server: &Bench) -> Result<Client> {
    let (client_io, server_io) = tokio::io::duplex(64 * 1024);
    let served = server.clone();
    tokio::spawn(async move {
        if let Ok(running) = served.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    Ok(().serve(client_io).await?)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Route {
    Plain,
    Journaled,
    Replay,
}

impl Route {
    fn name(self) -> &'static str {
        match self {
            Route::Plain => "plain",
            Route::Journaled => "journaled",
            Route::Replay => "replay",
        }
    }
}

/// `calls` calls in all, spread over `clients` connections, each waiting for its answer.
async fn run(
    server: &Bench,
    path: Route,
    clients: usize,
    calls: usize,
    run_id: u64,
) -> Result<Vec<Duration>> {
    let per = calls.div_ceil(clients);
    let mut tasks = Vec::new();
    for c in 0..clients {
        let client = connect(server).await?;
        tasks.push(tokio::spawn(async move {
            let mut samples = Vec::with_capacity(per);
            for i in 0..per {
                let seq = (c * per + i) as u64;
                let params = match path {
                    Route::Plain => CallToolRequestParams::new("effect.plain")
                        .with_arguments(obj(json!({"seq": seq}))),
                    Route::Journaled => CallToolRequestParams::new("effect.journaled")
                        .with_arguments(obj(
                            json!({"seq": seq, "operation_id": format!("op_{run_id}_{c}_{i}")}),
                        )),
                    // The ids and arguments of the journaled pass just before (same `run_id`):
                    // every call is answered from the journal.
                    Route::Replay => CallToolRequestParams::new("effect.journaled").with_arguments(
                        obj(json!({"seq": seq, "operation_id": format!("op_{run_id}_{c}_{i}")})),
                    ),
                };
                let t = Instant::now();
                let result = client.call_tool(params).await?;
                samples.push(t.elapsed());
                if result.is_error == Some(true) {
                    return Err(format!("a call failed: {:?}", result.content).into());
                }
            }
            let _ = client.cancel().await;
            Ok::<_, Error>(samples)
        }));
    }
    let mut all = Vec::with_capacity(calls);
    for t in tasks {
        all.extend(t.await??);
    }
    Ok(all)
}

fn obj(v: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    match v {
        serde_json::Value::Object(m) => m,
        _ => serde_json::Map::new(),
    }
}

struct Opts {
    calls: usize,
    dir: PathBuf,
    json: bool,
    exclusive: bool,
}

fn parse() -> Result<Opts> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut o = Opts {
        calls: 400,
        dir: root.join("target/mcp-bench"),
        json: false,
        exclusive: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--calls" => o.calls = it.next().ok_or("--calls N")?.parse()?,
            "--dir" => o.dir = it.next().ok_or("--dir DIR")?.into(),
            "--json" => o.json = true,
            "--exclusive" => o.exclusive = true,
            other => return Err(format!("unknown argument `{other}`").into()),
        }
    }
    Ok(o)
}

fn ms(us: f64) -> String {
    format!("{:.2} ms", us / 1000.0)
}

fn main() -> Result<()> {
    let opts = parse()?;
    let _ = std::fs::remove_dir_all(&opts.dir);
    std::fs::create_dir_all(&opts.dir)?;
    let sharing = if opts.exclusive {
        Sharing::Exclusive
    } else {
        Sharing::LiveReaders
    };
    let journal = Journal::builder()
        .sharing(sharing)
        .open(opts.dir.join("bench.opj"))?;
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(opts.dir.join("effect.log"))?;
    let server = Bench {
        effect: Arc::new(EffectFile {
            file: Mutex::new(file),
        }),
        journaled: Journaled::new(journal.clone()),
        tool_router: Bench::tool_router(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let mut rows: Vec<(usize, Route, Percentiles)> = Vec::new();
    let mut run_id = 0;
    runtime.block_on(async {
        // Warm up both paths (connections, the journal's first commits, the file).
        run(&server, Route::Plain, 1, 20, 0).await?;
        run(&server, Route::Journaled, 1, 20, 0).await?;
        for clients in [1, 8] {
            for path in [Route::Plain, Route::Journaled, Route::Replay] {
                if path != Route::Replay {
                    run_id += 1;
                }
                let samples = run(&server, path, clients, opts.calls, run_id).await?;
                rows.push((clients, path, percentiles(&samples)));
            }
        }
        Ok::<_, Error>(())
    })?;
    let find = |clients: usize, path: Route| {
        rows.iter()
            .find(|(c, p, _)| *c == clients && *p == path)
            .map(|(_, _, s)| *s)
            .unwrap_or_default()
    };
    if opts.json {
        for (clients, path, p) in &rows {
            println!(
                "{}",
                json!({"type": "latency", "data": {"clients": clients, "tool": path.name(), "calls": p.count, "p50_us": p.p50, "p99_us": p.p99, "max_us": p.max}})
            );
        }
    } else {
        println!(
            "tools/call latency, {} calls per row (rmcp client and server in process, an in-memory pipe)",
            opts.calls
        );
        println!(
            "{:>7}  {:<10} {:>10} {:>10} {:>10}",
            "clients", "tool", "p50", "p99", "max"
        );
        for (clients, path, p) in &rows {
            println!(
                "{:>7}  {:<10} {:>10} {:>10} {:>10}",
                clients,
                path.name(),
                ms(p.p50),
                ms(p.p99),
                ms(p.max)
            );
        }
    }
    let mut summary = serde_json::Map::new();
    for clients in [1, 8] {
        let (plain, journaled, replay) = (
            find(clients, Route::Plain),
            find(clients, Route::Journaled),
            find(clients, Route::Replay),
        );
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
        let line = format!(
            "{clients} client(s): journaled/plain p50 {:.2}x, p99 {:.2}x; replay/plain p50 {:.2}x",
            ratio(journaled.p50, plain.p50),
            ratio(journaled.p99, plain.p99),
            ratio(replay.p50, plain.p50)
        );
        summary.insert(
            format!("clients_{clients}"),
            json!({"p50_ratio": ratio(journaled.p50, plain.p50), "p99_ratio": ratio(journaled.p99, plain.p99), "replay_p50_ratio": ratio(replay.p50, plain.p50)}),
        );
        if !opts.json {
            println!("{line}");
        }
    }
    if opts.json {
        println!("{}", json!({"type": "summary", "data": summary}));
    }
    drop(server);
    journal.close().ok();
    Ok(())
}
