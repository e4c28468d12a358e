//! What the service answers: results, refusals, and how an in-doubt operation is settled
//! from the document.

use super::*;

/// The stored result payload.
#[derive(Serialize, Deserialize)]
pub(super) struct Stored {
    summary: String,
}

pub(super) fn payload(summary: &str) -> Vec<u8> {
    // Serializing a struct of one string cannot fail; fall back to the bare text anyway.
    serde_json::to_vec(&Stored {
        summary: summary.to_string(),
    })
    .unwrap_or_else(|_| summary.as_bytes().to_vec())
}

/// How an execution ended, for its recipients.
pub(super) enum Answer {
    Result(OpResult),
    Rejected(String),
    Released { reason: String, retry: bool },
    Unrecorded(String),
}

/// Settles one in-doubt operation from the document (`applied`: the document's entry for
/// it): applied at its revision if its edit is there (with the same intent), else not
/// applied (a retry runs it anew).
pub(super) fn reconcile(
    journal: &Journal,
    applied: Option<&AppliedEdit>,
    r: &Receipt,
) -> Result<Reconciled, ServiceError> {
    let id = r.operation_id.clone();
    let applied = applied.filter(|a| {
        a.edit
            .intent()
            .is_ok_and(|intent| r.intent_hash.matches(&intent))
    });
    let resolution = match applied {
        Some(a) => Resolution::Completed(
            Outcome::applied(a.revision, payload(&a.summary))
                .changed_assets(a.edit.changed_assets()),
        ),
        None => Resolution::not_applied(),
    };
    journal
        .resolve(&id, resolution)
        .doing(|| format!("resolve `{id}`"))?;
    Ok(Reconciled {
        id,
        cause: r.in_doubt_cause,
        applied_at: applied.map(|a| a.revision),
    })
}

pub(super) fn journal_error(what: &str, source: crate::Error) -> ServiceError {
    ServiceError::Journal {
        what: what.to_string(),
        source,
    }
}

/// The summary and changed assets of a result the MCP front end recorded (a
/// `CallToolResult`: `structuredContent` with `summary` and `changed`, or text content),
/// for an operation made over MCP and asked again over JSON Lines.
fn from_tool_result(bytes: &[u8]) -> Option<(String, Vec<String>)> {
    let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    let structured = &v["structuredContent"];
    let summary = structured["summary"]
        .as_str()
        .or_else(|| v["content"][0]["text"].as_str())?;
    let changed = structured["changed"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|c| c.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    Some((summary.to_string(), changed))
}

pub(super) fn result_msg(receipt: &Receipt, result: &OpResult, replayed: bool) -> ResultMsg {
    let mut changed = result.changed_assets.clone();
    let summary = match (
        &receipt.failure,
        serde_json::from_slice::<Stored>(&result.bytes),
    ) {
        (Some(message), _) => message.clone(),
        (None, Ok(stored)) => stored.summary,
        (None, Err(_)) => match from_tool_result(&result.bytes) {
            Some((summary, listed)) => {
                // Recorded by a build whose MCP front end kept the assets only in the result.
                if changed.is_empty() {
                    changed = listed;
                }
                summary
            }
            None => String::from_utf8_lossy(&result.bytes).into_owned(),
        },
    };
    ResultMsg {
        id: receipt.operation_id.clone(),
        outcome: match receipt.status {
            ExecutionStatus::Failed => "failed".into(),
            _ => "applied".into(),
        },
        revision: receipt.result_revision,
        summary,
        changed,
        replayed,
        delivery: receipt.delivery_count,
    }
}

/// A failed request as a protocol error. Journal refusals keep their own message (it
/// names the values and the next step).
pub(super) fn refusal(id: Option<String>, e: &ServiceError) -> Reply {
    let e = match e {
        ServiceError::Journal { source, .. } => source,
        ServiceError::Unavailable => {
            return Reply::Error {
                id,
                kind: "unavailable".into(),
                message: "the service is restarting; retry after a backoff".into(),
            };
        }
        #[cfg(feature = "postgres")]
        ServiceError::Database { .. } => {
            return Reply::Error {
                id,
                kind: "unavailable".into(),
                message: format!("{}; retry after a backoff", chain(e)),
            };
        }
        other => {
            return Reply::Error {
                id,
                kind: "internal".into(),
                message: chain(other),
            };
        }
    };
    let kind = match e.kind() {
        ErrorKind::IntentMismatch { .. } => "intent_mismatch",
        ErrorKind::StaleBase { .. } => "stale_base",
        ErrorKind::ScopeBusy { .. } => "scope_busy",
        ErrorKind::WindowFull { .. } => "window_full",
        ErrorKind::NotOwner { .. } => "not_owner",
        ErrorKind::InvalidInput { .. } => "bad_request",
        ErrorKind::UnknownOperation { .. } | ErrorKind::InvalidState { .. } => "bad_request",
        ErrorKind::Io | ErrorKind::Poisoned | ErrorKind::Closed | ErrorKind::Unavailable { .. } => {
            "unavailable"
        }
        _ => "internal",
    };
    Reply::Error {
        id,
        kind: kind.into(),
        message: e.to_string(),
    }
}

/// `d` in the largest whole unit that shows it exactly (`5min`, `30s`, `1500ms`).
pub(super) fn human_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(3_600_000) && ms > 0 {
        format!("{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) && ms > 0 {
        format!("{}min", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}
