//! The editor's wire protocol (`docs/protocol.md`): JSON Lines over TCP, one object per
//! line, its `type` saying which message it is. Shared by the service and any Rust client
//! (the demo's); clients in other languages follow `docs/protocol.md`.

use serde::{Deserialize, Serialize};

use crate::{Intent, Timestamp};

/// An edit of the scene: what a client asks the editor to do.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Edit {
    /// Adds a new object beside an existing one.
    Add {
        /// The new object's name.
        object: String,
        /// The object it is placed beside.
        beside: String,
    },
    /// Renames an object.
    Rename {
        /// The current name.
        from: String,
        /// The new name.
        to: String,
    },
    /// Deletes an object.
    Delete {
        /// The object's name.
        object: String,
    },
}

/// The longest object name, in bytes: an edit's changed asset is `scene/main/NAME`, and the
/// journal takes asset names of at most [`MAX_NAME_BYTES`](crate::MAX_NAME_BYTES) bytes.
pub const MAX_OBJECT_NAME_BYTES: usize = crate::MAX_NAME_BYTES - "scene/main/".len();

impl Edit {
    /// Checks every name the edit carries, before anything is recorded or applied: each is
    /// a valid name ([`validate_name`](crate::validate_name)) of at most
    /// [`MAX_OBJECT_NAME_BYTES`] bytes. An edit that passes has an outcome the journal can
    /// record (a name too long for its changed asset was applied and then could not be).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) naming the field and its
    /// value.
    ///
    /// # Example
    ///
    /// ```
    /// use opjournal::service::{Edit, MAX_OBJECT_NAME_BYTES};
    ///
    /// let ok = Edit::Delete { object: "lamp".into() };
    /// assert!(ok.validate().is_ok());
    /// let long = Edit::Delete { object: "n".repeat(MAX_OBJECT_NAME_BYTES + 1) };
    /// assert!(long.validate().is_err());
    /// ```
    pub fn validate(&self) -> crate::Result<()> {
        let names: &[(&'static str, &str)] = match self {
            Edit::Add { object, beside } => &[("object", object), ("beside", beside)],
            Edit::Rename { from, to } => &[("from", from), ("to", to)],
            Edit::Delete { object } => &[("object", object)],
        };
        for (what, name) in names {
            if name.len() > MAX_OBJECT_NAME_BYTES {
                return Err(crate::Error::invalid(
                    what,
                    name,
                    format!(
                        "it is {} bytes long; an object name may have at most \
                         {MAX_OBJECT_NAME_BYTES} bytes of UTF-8 (its changed asset, \
                         `scene/main/` and the name, must fit in {})",
                        name.len(),
                        crate::MAX_NAME_BYTES
                    ),
                ));
            }
            crate::validate_name(what, name)?;
        }
        Ok(())
    }

    /// The journal intent: the edit's name and its arguments, hashed canonically. The same
    /// operation id with a different edit is refused (`IntentMismatch`).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) only if the intent's name
    /// were invalid (the three names used here are valid).
    pub fn intent(&self) -> crate::Result<Intent> {
        let (name, args) = match self {
            Edit::Add { object, beside } => (
                "scene.add",
                serde_json::json!({"object": object, "beside": beside}),
            ),
            Edit::Rename { from, to } => {
                ("scene.rename", serde_json::json!({"from": from, "to": to}))
            }
            Edit::Delete { object } => ("scene.delete", serde_json::json!({"object": object})),
        };
        Intent::from_json(name, &args)
    }

    /// The assets the edit changes, as its outcome records them: `scene/main/NAME` for the
    /// object it adds, deletes or renames to. Empty for a name too long to record, which
    /// only an edit applied before names were checked ([`Edit::validate`]) can have.
    ///
    /// # Example
    ///
    /// ```
    /// use opjournal::service::Edit;
    ///
    /// let edit = Edit::Rename { from: "lamp".into(), to: "light".into() };
    /// assert_eq!(edit.changed_assets(), ["scene/main/light"]);
    /// ```
    pub fn changed_assets(&self) -> Vec<String> {
        let name = match self {
            Edit::Add { object, .. } | Edit::Delete { object } => object,
            Edit::Rename { to, .. } => to,
        };
        let asset = format!("{}/{name}", super::SCOPE);
        if asset.len() > crate::MAX_NAME_BYTES {
            return Vec::new();
        }
        vec![asset]
    }

    /// The edit in words, as asked: `add "light" beside "door"`.
    pub fn describe(&self) -> String {
        match self {
            Edit::Add { object, beside } => format!("add \"{object}\" beside \"{beside}\""),
            Edit::Rename { from, to } => format!("rename \"{from}\" to \"{to}\""),
            Edit::Delete { object } => format!("delete \"{object}\""),
        }
    }
}

/// What a client sends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Request {
    /// Names the client session; first on every connection, and again whenever the client
    /// wants to learn the document's revision. Answered by `welcome`, then the session's
    /// results that were never acknowledged are pushed again (within their retry budget).
    Hello {
        /// The session (an agent run, a browser tab): stable across reconnects.
        session: String,
    },
    /// A mutating operation. `id` is chosen by the client and reused for every retry.
    Submit {
        /// The operation id.
        id: String,
        /// The document revision the client last saw.
        base_revision: u64,
        /// What to do.
        edit: Edit,
    },
    /// The client has seen the result of `id`. Only the session that submitted `id` may
    /// acknowledge it (`not_owner` otherwise).
    Ack {
        /// The operation id.
        id: String,
    },
    /// Asks what became of `id`, without submitting anything.
    Status {
        /// The operation id.
        id: String,
    },
}

/// What the service sends: answers to requests, and pushed results. Types may be added
/// later: a client ignores one it does not know.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Reply {
    /// The answer to `hello`; `pushing` results follow at once.
    Welcome {
        /// The session.
        session: String,
        /// The document's scope.
        scope: String,
        /// The document's revision.
        revision: u64,
        /// How many unacknowledged results are pushed next.
        pushing: usize,
    },
    /// The operation is new and recorded: it will run, and its result will follow.
    Accepted {
        /// The operation id.
        id: String,
        /// The attempt (1 unless an earlier attempt was found not applied).
        attempt: u32,
    },
    /// An operation's outcome (answer or push).
    Result(ResultMsg),
    /// The operation is running: the request attached to it and applied nothing. Its final
    /// answer (`result`, `rejected` or `released`) follows on this connection too.
    Running {
        /// The operation id.
        id: String,
        /// When it was accepted.
        since: Timestamp,
    },
    /// The operation finished long ago and its result is no longer kept: refresh, do not
    /// retry. Nothing was run.
    Expired {
        /// The operation id.
        id: String,
        /// Whether it was applied (`false`: it failed).
        applied: bool,
        /// The revision it produced.
        revision: Option<u64>,
        /// When it finished.
        completed_at: Option<Timestamp>,
        /// The document's revision now.
        current_revision: u64,
        /// Why the result is no longer kept: `retention` (it aged out) or `damage` (it was
        /// lost to damage that `opjournal repair` found, see `repaired_at`). A service older
        /// than this field sends none: read that as `retention`.
        #[serde(default = "retention")]
        reason: String,
        /// When the repair that found the result lost ran (`reason: damage`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        repaired_at: Option<Timestamp>,
    },
    /// The service stopped while running the operation and has not yet checked whether its
    /// effect landed: ask again.
    InDoubt {
        /// The operation id.
        id: String,
        /// When it was accepted.
        since: Timestamp,
    },
    /// The edit was refused before changing anything (the id can be reused).
    Rejected {
        /// The operation id.
        id: String,
        /// Why.
        reason: String,
    },
    /// The editor could not apply the edit and changed nothing: the operation was released
    /// in the journal, so the id is free again.
    Released {
        /// The operation id.
        id: String,
        /// What went wrong.
        reason: String,
        /// `true`: the fault may be passing (the document could not be saved); retry the same
        /// id after a backoff. `false`: retrying the same edit will fail the same way.
        retry: bool,
    },
    /// The acknowledgement is recorded.
    Acked {
        /// The operation id.
        id: String,
        /// Whether it came after the acknowledgement timeout.
        late: bool,
    },
    /// The answer to `status`.
    Status(StatusMsg),
    /// The request was refused; nothing was applied. Also sent, without a request, just
    /// before the service closes a connection (`too_many_connections`, `idle_timeout`).
    Error {
        /// The operation id, when the request named one.
        id: Option<String>,
        /// `intent_mismatch`, `stale_base`, `scope_busy`, `window_full`, `not_owner`,
        /// `bad_request`, `too_many_connections`, `idle_timeout`, `unavailable` or
        /// `internal` (`docs/protocol.md` says what a client does with each).
        kind: String,
        /// What went wrong, and what to do.
        message: String,
    },
}

/// The `reason` of an `expired` answer from a service that sends none.
fn retention() -> String {
    "retention".into()
}

/// An operation's outcome, as answered or pushed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResultMsg {
    /// The operation id.
    pub id: String,
    /// `applied` or `failed`.
    pub outcome: String,
    /// The revision the edit produced (applied).
    pub revision: Option<u64>,
    /// What happened, in words (`added "light" beside "door"`), or why it failed.
    pub summary: String,
    /// What changed, for the UI.
    pub changed: Vec<String>,
    /// `false` only for the first sending of a new execution: every other copy is a
    /// replay of the recorded outcome, and the edit was not applied again.
    pub replayed: bool,
    /// Which delivery of this result this is (1 for the first).
    pub delivery: u32,
}

/// The answer to `status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusMsg {
    /// The operation id.
    pub id: String,
    /// `unknown`, `running`, `in_doubt`, `applied`, `failed` or `retired`.
    pub state: String,
    /// The revision it produced.
    pub revision: Option<u64>,
    /// `pending`, `delivered`, `acknowledged`, `exhausted` (the retry budget is spent: no
    /// more pushes) or `ack_expired`.
    pub delivery: Option<String>,
    /// How many times the result was delivered.
    pub deliveries: u32,
    /// Until when an acknowledgement is awaited.
    pub ack_deadline: Option<Timestamp>,
    /// The recorded events, oldest first (`in_doubt:reopened` for a lease lost to a restart).
    pub history: Vec<String>,
}
