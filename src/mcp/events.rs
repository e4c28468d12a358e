//! [`JournalEventStore`]: rmcp's event store for resumable Streamable HTTP streams, with the
//! results of journaled calls read back from the journal.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use futures::Stream;
use rmcp::model::{RequestId, ServerJsonRpcMessage, ServerResult};
use rmcp::transport::streamable_http_server::session::{
    EventId, EventStore, EventStoreError, EventStream, ServerSseMessage,
};

use super::journaled::Journaled;
use super::{META_OPERATION_ID, META_STATUS};

/// Streams remembered, by default: the oldest beyond are forgotten (a resumption of one
/// then gets nothing, and the client calls again: the journal answers).
pub const DEFAULT_MAX_STREAMS: usize = 1024;
/// Events remembered per stream (the last ones).
const MAX_EVENTS_PER_STREAM: usize = 64;
/// How long a resumed stream waits for its response before it ends (the client may resume
/// again, or call again).
const DEFAULT_PENDING_WAIT: Duration = Duration::from_secs(30);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The event store rmcp's Streamable HTTP server uses for `Last-Event-ID` resumption
/// (`LocalSessionManager::with_event_store`), backed by the journal for what matters:
///
/// - the response to a journaled `tools/call` (a result carrying
///   `dev.opjournal/operation_id` with a recorded status) is kept as its operation id only,
///   and a resumed stream gets the **recorded result from the journal**, marked as a replay
///   (`dev.opjournal/replayed: true`) and counted as a delivery;
/// - a stream resumed while its call still runs stays open until the response is stored
///   (up to 30 s), then ends;
/// - every other event (priming events, notifications, other responses) is kept as sent.
///
/// The index of streams lives in memory, bounded ([`DEFAULT_MAX_STREAMS`] streams of at
/// most 64 events): resumption works while the server process lives, which is what the
/// 2025-11-25 revision promises (resumption is tied to the session, which a restart ends).
/// After a restart, or once a stream is forgotten, the client calls again with the same
/// `operation_id`, and the journal answers that call the same way.
pub struct JournalEventStore {
    shared: Arc<Shared>,
}

struct Shared {
    journaled: Journaled,
    state: Mutex<State>,
    changed: tokio::sync::Notify,
    /// Distinguishes this process's event ids from those of an earlier run.
    epoch: String,
    max_streams: usize,
    pending_wait: Duration,
}

impl std::fmt::Debug for JournalEventStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = lock(&self.shared.state);
        f.debug_struct("JournalEventStore")
            .field("epoch", &self.shared.epoch)
            .field("streams", &state.streams.len())
            .field("max_streams", &self.shared.max_streams)
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct State {
    next_stream: u64,
    next_event: u64,
    /// rmcp's stream id → our stream number.
    numbers: HashMap<String, u64>,
    streams: HashMap<u64, StreamLog>,
    /// Stream numbers, oldest first.
    order: VecDeque<u64>,
}

#[derive(Default)]
struct StreamLog {
    name: String,
    events: VecDeque<(u64, Stored)>,
    /// A response or error was stored: nothing follows.
    ended: bool,
}

enum Stored {
    Event(ServerSseMessage),
    /// The response to a journaled call: rebuilt from the journal.
    Journaled {
        operation_id: String,
        request_id: RequestId,
        /// Whether the response carried `resultType` (newer revisions) or not.
        result_type: bool,
    },
}

enum NextEvent {
    Ready(ServerSseMessage),
    Journaled {
        event_id: String,
        operation_id: String,
        request_id: RequestId,
        result_type: bool,
    },
}

impl JournalEventStore {
    /// An event store reading recorded results through `journaled`'s journal.
    pub fn new(journaled: Journaled) -> JournalEventStore {
        JournalEventStore::with_max_streams(journaled, DEFAULT_MAX_STREAMS)
    }

    /// An event store that remembers at most `max_streams` streams (at least 1).
    pub fn with_max_streams(journaled: Journaled, max_streams: usize) -> JournalEventStore {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        JournalEventStore {
            shared: Arc::new(Shared {
                journaled,
                state: Mutex::new(State::default()),
                changed: tokio::sync::Notify::new(),
                epoch: format!("{nanos:x}"),
                max_streams: max_streams.max(1),
                pending_wait: DEFAULT_PENDING_WAIT,
            }),
        }
    }

    /// Streams remembered now.
    pub fn streams(&self) -> usize {
        lock(&self.shared.state).streams.len()
    }
}

impl Shared {
    fn event_id(&self, stream: u64, n: u64) -> String {
        format!("{}-{stream}-{n}", self.epoch)
    }

    /// `(stream, event)` of an id this process gave out.
    fn parse(&self, id: &str) -> Option<(u64, u64)> {
        let rest = id.strip_prefix(&self.epoch)?.strip_prefix('-')?;
        let (stream, n) = rest.split_once('-')?;
        Some((stream.parse().ok()?, n.parse().ok()?))
    }

    /// The next event of `stream` after `after`; `Err(ended)` when there is none yet.
    fn next_after(&self, stream: u64, after: u64) -> Result<(u64, NextEvent), bool> {
        let state = lock(&self.state);
        let Some(log) = state.streams.get(&stream) else {
            return Err(true);
        };
        match log.events.iter().find(|(n, _)| *n > after) {
            Some((n, Stored::Event(e))) => Ok((*n, NextEvent::Ready(e.clone()))),
            Some((
                n,
                Stored::Journaled {
                    operation_id,
                    request_id,
                    result_type,
                },
            )) => Ok((
                *n,
                NextEvent::Journaled {
                    event_id: self.event_id(stream, *n),
                    operation_id: operation_id.clone(),
                    request_id: request_id.clone(),
                    result_type: *result_type,
                },
            )),
            None => Err(log.ended),
        }
    }

    fn store(&self, stream_id: &str, event: &ServerSseMessage) -> String {
        let mut state = lock(&self.state);
        let stream = match state.numbers.get(stream_id) {
            Some(n) => *n,
            None => {
                let n = state.next_stream;
                state.next_stream += 1;
                state.numbers.insert(stream_id.to_string(), n);
                state.streams.insert(
                    n,
                    StreamLog {
                        name: stream_id.to_string(),
                        ..StreamLog::default()
                    },
                );
                state.order.push_back(n);
                while state.order.len() > self.max_streams {
                    if let Some(old) = state.order.pop_front()
                        && let Some(log) = state.streams.remove(&old)
                    {
                        state.numbers.remove(&log.name);
                    }
                }
                n
            }
        };
        let n = state.next_event;
        state.next_event += 1;
        let id = self.event_id(stream, n);
        let mut stored = event.clone();
        stored.event_id = Some(id.clone());
        let ends = stored.message.as_deref().is_some_and(|m| {
            matches!(
                m,
                ServerJsonRpcMessage::Response(_) | ServerJsonRpcMessage::Error(_)
            )
        });
        let stored = match stored.message.as_deref().and_then(journaled_response) {
            Some((operation_id, request_id, result_type)) => Stored::Journaled {
                operation_id,
                request_id,
                result_type,
            },
            None => Stored::Event(stored),
        };
        if let Some(log) = state.streams.get_mut(&stream) {
            log.events.push_back((n, stored));
            while log.events.len() > MAX_EVENTS_PER_STREAM {
                log.events.pop_front();
            }
            log.ended |= ends;
        }
        id
    }
}

/// The operation id of a journaled call's recorded answer, its request id, and whether it
/// carried `resultType`.
fn journaled_response(message: &ServerJsonRpcMessage) -> Option<(String, RequestId, bool)> {
    let ServerJsonRpcMessage::Response(response) = message else {
        return None;
    };
    let ServerResult::CallToolResult(result) = &response.result else {
        return None;
    };
    let meta = result.meta.as_ref()?;
    let status = meta.0.get(META_STATUS)?.as_str()?;
    if !matches!(status, "applied" | "failed") {
        return None;
    }
    let id = meta.0.get(META_OPERATION_ID)?.as_str()?;
    Some((
        id.to_string(),
        response.id.clone(),
        result.result_type.is_some(),
    ))
}

/// A resumed stream's position.
struct Resumed {
    shared: Arc<Shared>,
    stream: u64,
    after: u64,
    deadline: Instant,
}

impl Resumed {
    /// The next event to send, waiting for one while the stream has not ended, until the
    /// deadline.
    async fn next(&mut self) -> Option<ServerSseMessage> {
        loop {
            // Registered before looking, so a store between the look and the wait wakes it.
            let changed = self.shared.changed.notified();
            match self.shared.next_after(self.stream, self.after) {
                Ok((n, NextEvent::Ready(event))) => {
                    self.after = n;
                    return Some(event);
                }
                Ok((
                    n,
                    NextEvent::Journaled {
                        event_id,
                        operation_id,
                        request_id,
                        result_type,
                    },
                )) => {
                    self.after = n;
                    let journaled = self.shared.journaled.clone();
                    let replayed = tokio::task::spawn_blocking(move || {
                        journaled.replay_recorded(&operation_id)
                    })
                    .await
                    .ok()
                    .flatten();
                    // Retired or purged meanwhile: nothing to send; the client calls again
                    // and is told it expired.
                    let Some(mut result) = replayed else { continue };
                    if !result_type {
                        result.result_type = None;
                    }
                    let message = ServerJsonRpcMessage::response(
                        ServerResult::CallToolResult(result),
                        request_id,
                    );
                    return Some(ServerSseMessage::new(event_id, message));
                }
                Err(true) => return None,
                Err(false) => {
                    let left = self.deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    let _ = tokio::time::timeout(left, changed).await;
                }
            }
        }
    }
}

#[async_trait::async_trait]
impl EventStore for JournalEventStore {
    async fn store_event(
        &self,
        stream_id: &str,
        event: &ServerSseMessage,
    ) -> Result<EventId, EventStoreError> {
        let id = self.shared.store(stream_id, event);
        self.shared.changed.notify_waiters();
        Ok(id)
    }

    async fn replay_events_after(
        &self,
        last_event_id: &str,
    ) -> Result<EventStream, EventStoreError> {
        let Some((stream, after)) = self.shared.parse(last_event_id) else {
            return Err(format!(
                "unknown event id `{last_event_id}` (from another run of the server): call again with the same operation_id"
            )
            .into());
        };
        if !lock(&self.shared.state).streams.contains_key(&stream) {
            return Err(format!(
                "the stream of event `{last_event_id}` is forgotten: call again with the same operation_id"
            )
            .into());
        }
        let resumed = Resumed {
            shared: self.shared.clone(),
            stream,
            after,
            deadline: Instant::now() + self.shared.pending_wait,
        };
        let events = futures::stream::unfold(resumed, |mut r| async move {
            let event = r.next().await?;
            Some((event, r))
        });
        Ok(Box::pin(events)
            as Pin<
                Box<dyn Stream<Item = ServerSseMessage> + Send + Sync>,
            >)
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use rmcp::model::{CallToolResult, ContentBlock, MetaObject, NumberOrString};
    use serde_json::json;

    use super::*;
    use crate::{Admission, Intent, Journal, Operation, Outcome};

    type Error = Box<dyn std::error::Error + Send + Sync>;
    type TestResult = Result<(), Error>;

    /// A journal with operation `op_1` applied, its recorded result a `CallToolResult`, and
    /// the answer a journaled tool sent for it.
    fn recorded(dir: &std::path::Path) -> Result<(Journaled, ServerSseMessage), Error> {
        let journal = Journal::open(dir.join("p.opj"))?;
        let Admission::Fresh(claim) =
            journal.submit(Operation::new("op_1", Intent::from_json("t", &json!({}))?))?
        else {
            return Err("not fresh".into());
        };
        let result = CallToolResult::success(vec![ContentBlock::text("done")]);
        journal.complete(&claim, Outcome::applied(1, serde_json::to_vec(&result)?))?;
        journal.delivered("op_1")?;
        let mut sent = result;
        let mut meta = MetaObject::new();
        meta.0.insert(META_OPERATION_ID.into(), "op_1".into());
        meta.0.insert(META_STATUS.into(), "applied".into());
        sent.meta = Some(meta);
        let message = ServerJsonRpcMessage::response(
            ServerResult::CallToolResult(sent),
            NumberOrString::Number(7),
        );
        Ok((
            Journaled::new(journal),
            ServerSseMessage::from_message(message),
        ))
    }

    fn replayed(event: &ServerSseMessage) -> Option<(serde_json::Value, serde_json::Value)> {
        let ServerJsonRpcMessage::Response(r) = event.message.as_deref()? else {
            return None;
        };
        let ServerResult::CallToolResult(result) = &r.result else {
            return None;
        };
        let meta = result.meta.as_ref()?;
        Some((
            meta.0.get("dev.opjournal/replayed")?.clone(),
            meta.0.get("dev.opjournal/delivery")?.clone(),
        ))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_answer_lost_after_it_was_sent_is_resumed_from_the_journal_as_a_replay() -> TestResult
    {
        let dir = tempfile::tempdir()?;
        let (journaled, answer) = recorded(dir.path())?;
        let store = JournalEventStore::new(journaled);
        let priming = store
            .store_event("s", &ServerSseMessage::retry(Duration::from_millis(100)))
            .await?;
        store.store_event("s", &answer).await?;
        let mut resumed = store.replay_events_after(&priming).await?;
        let event = resumed.next().await.ok_or("nothing resumed")?;
        assert_eq!(replayed(&event), Some((json!(true), json!(2))), "{event:?}");
        assert!(
            resumed.next().await.is_none(),
            "the stream ends after its answer"
        );
        Ok(())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stream_resumed_before_its_answer_waits_for_it() -> TestResult {
        let dir = tempfile::tempdir()?;
        let (journaled, answer) = recorded(dir.path())?;
        let store = Arc::new(JournalEventStore::new(journaled));
        let priming = store
            .store_event("s", &ServerSseMessage::retry(Duration::from_millis(100)))
            .await?;
        let mut resumed = store.replay_events_after(&priming).await?;
        let later = store.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let _ = later.store_event("s", &answer).await;
        });
        let event = resumed.next().await.ok_or("nothing resumed")?;
        assert_eq!(replayed(&event).map(|r| r.0), Some(json!(true)));
        Ok(())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn event_ids_of_another_run_or_a_forgotten_stream_are_refused() -> TestResult {
        let dir = tempfile::tempdir()?;
        let (journaled, _) = recorded(dir.path())?;
        let store = JournalEventStore::with_max_streams(journaled, 1);
        let first = store
            .store_event("a", &ServerSseMessage::retry(Duration::from_millis(1)))
            .await?;
        store
            .store_event("b", &ServerSseMessage::retry(Duration::from_millis(1)))
            .await?;
        assert_eq!(store.streams(), 1, "bounded");
        assert!(
            store.replay_events_after(&first).await.is_err(),
            "stream `a` is forgotten"
        );
        assert!(
            store.replay_events_after("0-0-0").await.is_err(),
            "another run's id"
        );
        Ok(())
    }
}
