//! The answers a journaled call gives the agent, as `CallToolResult`s: the recorded
//! result of a replay, and the tool errors that say what happened and what to do next
//! (in doubt, expired, refused), each with the `dev.opjournal/` entries in `_meta`.
//!
//! Everything the agent can act on is a tool error (`is_error: true`) whose text says what
//! to do and whose `_meta` status names the case; a protocol error is only for a call that
//! could not run at all (see [`Journaled::run`](super::Journaled::run)).

use rmcp::model::{CallToolResult, ContentBlock, MetaObject};

use super::{META_DELIVERY, META_OPERATION_ID, META_REPLAYED, META_RESULT_REVISION, META_STATUS};
use crate::{ExecutionStatus, Receipt};

/// The longest failure message recorded from a tool error's text.
pub(super) const MAX_FAILURE: usize = 1000;

pub(super) fn status_name(status: ExecutionStatus) -> &'static str {
    status.name()
}

/// The recorded result as a `CallToolResult`: the stored one, or, for an outcome recorded
/// another way, one made from the receipt: `opjournal resolve`'s bytes as text, and a JSON
/// object that is not a `CallToolResult` (another front end's result on the same journal,
/// such as the JSON Lines service's `{"summary": ...}`) as text and as structured content.
pub(super) fn recorded_result(receipt: &Receipt, bytes: &[u8]) -> CallToolResult {
    let structured = match serde_json::from_slice::<CallToolResult>(bytes) {
        Ok(result) => return result,
        // Read again only when it is not one: another front end's JSON object.
        Err(_) => serde_json::from_slice::<serde_json::Value>(bytes)
            .ok()
            .filter(serde_json::Value::is_object),
    };
    let text = String::from_utf8_lossy(bytes).into_owned();
    let mut result = match (&receipt.failure, receipt.result_revision) {
        (Some(message), _) => CallToolResult::error(vec![ContentBlock::text(message.clone())]),
        (None, Some(rev)) if text.is_empty() => CallToolResult::success(vec![ContentBlock::text(
            format!("applied at revision {rev}"),
        )]),
        _ => CallToolResult::success(vec![ContentBlock::text(text)]),
    };
    result.structured_content = structured;
    result
}

/// Adds the `dev.opjournal/` entries to a result's `_meta`.
pub(super) fn set_meta(
    result: &mut CallToolResult,
    id: &str,
    status: &str,
    replayed: Option<bool>,
    delivery: Option<u32>,
    revision: Option<u64>,
) {
    let meta = result.meta.get_or_insert_with(MetaObject::new);
    meta.0.insert(META_OPERATION_ID.into(), id.into());
    meta.0.insert(META_STATUS.into(), status.into());
    if let Some(r) = replayed {
        meta.0.insert(META_REPLAYED.into(), r.into());
    }
    if let Some(d) = delivery {
        meta.0.insert(META_DELIVERY.into(), d.into());
    }
    if let Some(rev) = revision {
        meta.0.insert(META_RESULT_REVISION.into(), rev.into());
    }
}

/// A tool error (`is_error: true`) with `message` as its text and `status` in `_meta`.
pub(super) fn tool_error(
    message: impl Into<String>,
    status: &str,
    id: Option<&str>,
) -> CallToolResult {
    let message = message.into();
    let mut result = CallToolResult::error(vec![ContentBlock::text(message)]);
    let meta = result.meta.get_or_insert_with(MetaObject::new);
    meta.0.insert(META_STATUS.into(), status.into());
    if let Some(id) = id {
        meta.0.insert(META_OPERATION_ID.into(), id.into());
    }
    result
}

pub(super) fn in_doubt(r: &Receipt) -> CallToolResult {
    tool_error(
        format!(
            "operation `{}` is in doubt: the server stopped while making this change, and has not yet established whether it was made. Check the project (read it) before doing anything else; do not retry blindly, and do not call again with a new id",
            r.operation_id
        ),
        "in_doubt",
        Some(&r.operation_id),
    )
}

pub(super) fn expired(r: &Receipt) -> CallToolResult {
    let outcome = match (r.applied, r.result_revision) {
        (Some(true), Some(rev)) => format!("it was applied, at revision {rev}"),
        (Some(true), None) => "it was applied".to_string(),
        (Some(false), _) => format!(
            "it failed ({})",
            r.failure.as_deref().unwrap_or("no message kept")
        ),
        _ => "its outcome is not known".to_string(),
    };
    // Damage is not age: a result that a repair found lost is not said to have aged out.
    let gone = match r.retire_cause {
        Some(crate::RetireCause::Damage { repaired_at }) => format!(
            "finished and its result was lost to damage (repair on {repaired_at}), so it is no longer kept"
        ),
        _ => "finished long ago and its result is no longer kept".to_string(),
    };
    let mut result = tool_error(
        format!(
            "operation `{}` {gone}: {outcome}. Refresh (read the project again); do not retry",
            r.operation_id
        ),
        "expired",
        Some(&r.operation_id),
    );
    if let (Some(meta), Some(rev)) = (result.meta.as_mut(), r.result_revision) {
        meta.0.insert(META_RESULT_REVISION.into(), rev.into());
    }
    result
}

pub(super) fn failure_text(result: &CallToolResult) -> String {
    let texts: Vec<&str> = result
        .content
        .iter()
        .filter_map(|c| match c {
            ContentBlock::Text(t) => Some(t.text.as_str()),
            _ => None,
        })
        .collect();
    let text = if texts.is_empty() {
        "the tool reported an error".to_string()
    } else {
        texts.join("\n")
    };
    crate::error::shorten(&text, MAX_FAILURE)
}
