//! The journal in an async (tokio) service.
//!
//! Journal calls are synchronous and may wait for a disk sync, so an async service runs
//! them on tokio's blocking pool (`spawn_blocking`), never on the async worker threads.
//! The journal is shared through an `Arc` (`Journal` is `Send + Sync`); concurrent calls
//! share commits.
//!
//! The service here handles requests arriving on a channel (a stand-in for a socket): the
//! same operation twice, as a client that lost the first reply and retried. The edit lands
//! once; the retry gets the recorded result, marked as a replay.
//!
//! ```text
//! cargo run --example async_service
//! ```

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opjournal::{ExecuteError, Executed, Failure, Intent, Journal, Operation, Outcome};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

/// What a client asks for.
#[derive(Clone, Debug, Serialize)]
struct AddLight {
    near: String,
}

/// What the service answers.
#[derive(Debug, Serialize, Deserialize)]
struct Added {
    light: String,
    revision: u64,
}

struct Request {
    operation_id: String,
    args: AddLight,
    reply: oneshot::Sender<String>,
}

/// The editor's project: a list of lights and a revision.
#[derive(Default)]
struct Scene {
    lights: Vec<String>,
    revision: u64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("project.opj");
    // Opening syncs the file: blocking work, so off the async threads too.
    let journal = Arc::new(tokio::task::spawn_blocking(move || Journal::open(path)).await??);
    let compactor = journal.spawn_compactor(Duration::from_secs(60));
    let scene = Arc::new(Mutex::new(Scene::default()));

    let (requests, mut incoming) = mpsc::channel::<Request>(16);
    let service = {
        let journal = journal.clone();
        tokio::spawn(async move {
            while let Some(request) = incoming.recv().await {
                let journal = journal.clone();
                let scene = scene.clone();
                // One task per request; the journal call runs on the blocking pool.
                tokio::spawn(async move {
                    let answer = tokio::task::spawn_blocking(move || {
                        handle(&journal, &scene, request.operation_id, request.args)
                    })
                    .await
                    .unwrap_or_else(|e| format!("the handler failed: {e}"));
                    let _ = request.reply.send(answer);
                });
            }
        })
    };

    // The client sends `op_7f3`, loses the reply, and sends it again.
    for attempt in 1..=2 {
        let (reply, answer) = oneshot::channel();
        requests
            .send(Request {
                operation_id: "op_7f3".into(),
                args: AddLight {
                    near: "door".into(),
                },
                reply,
            })
            .await?;
        println!("attempt {attempt}: {}", answer.await?);
    }
    drop(requests);
    service.await?;

    let stats = tokio::task::spawn_blocking(move || {
        let stats = journal.stats();
        drop(compactor);
        stats
    })
    .await??;
    println!(
        "{} operation(s) recorded, {} applied: the edit landed once",
        stats.operations, stats.applied
    );
    Ok(())
}

/// Runs one request against the journal (blocking): execute the edit exactly once.
fn handle(journal: &Journal, scene: &Mutex<Scene>, id: String, args: AddLight) -> String {
    let intent = match Intent::from_serialize("scene.add_light", &args) {
        Ok(intent) => intent,
        Err(e) => return format!("refused: {e}"),
    };
    let op = Operation::new(id, intent).scope("scene/main");
    let answer = journal.execute(op, |_claim| {
        let mut scene = scene
            .lock()
            .map_err(|_| Failure::NotApplied("the scene is unavailable"))?;
        scene.revision += 1;
        let light = format!("light-{}", scene.lights.len() + 1);
        scene.lights.push(format!("{light} near {}", args.near));
        let added = Added {
            light,
            revision: scene.revision,
        };
        Outcome::applied_json(scene.revision, &added).map_err(Failure::failed)
    });
    match answer {
        Ok(Executed::Fresh(_, result)) => match result.json::<Added>() {
            Ok(added) => format!("applied: {} at revision {}", added.light, added.revision),
            Err(e) => format!("applied, but the result does not read back: {e}"),
        },
        Ok(Executed::Replay(replay)) => match replay.result.json::<Added>() {
            Ok(added) => format!(
                "replayed (not re-applied): {} at revision {}",
                added.light, added.revision
            ),
            Err(e) => format!("replayed, but the result does not read back: {e}"),
        },
        Ok(other) => format!("the operation is {:?}", other.receipt().status),
        Err(ExecuteError::NotApplied(why)) => format!("not applied: {why}"),
        Err(e) => format!("failed: {e}"),
    }
}
