//! Input rules shared by ids, scopes, sessions and intent names.

use crate::error::{Error, Result};

/// The longest operation id, scope, session or intent name, in bytes of UTF-8.
pub const MAX_NAME_BYTES: usize = 256;

/// Checks a name by the rules [`Journal::submit`](crate::Journal::submit) applies to
/// operation ids, scopes and sessions: non-empty, at most [`MAX_NAME_BYTES`] bytes of
/// UTF-8, no control characters.
///
/// A service that receives names from clients outside a `submit` (a session in a
/// handshake, an id in a status query) checks them with the same rules, so that a name it
/// accepts there is one `submit` accepts too. `what` names the input in the message
/// (`"session"`, `"operation id"`).
///
/// # Errors
///
/// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) naming the rule broken.
///
/// # Example
///
/// ```
/// use opjournal::{ErrorKind, validate_name};
///
/// validate_name("session", "tab-1")?;
/// let err = validate_name("session", "tab\u{0}1").unwrap_err();
/// assert!(matches!(err.kind(), ErrorKind::InvalidInput { what: "session", .. }), "{err}");
/// assert!(validate_name("operation id", "").is_err());
/// assert!(validate_name("operation id", &"x".repeat(257)).is_err());
/// # Ok::<(), opjournal::Error>(())
/// ```
pub fn validate_name(what: &'static str, value: &str) -> Result<()> {
    name(what, value)
}

/// Checks an identifier: non-empty, at most [`MAX_NAME_BYTES`] bytes, no control characters.
pub(crate) fn name(what: &'static str, value: &str) -> Result<()> {
    if value.is_empty() {
        return Err(Error::invalid(what, value, "it must not be empty"));
    }
    if value.len() > MAX_NAME_BYTES {
        return Err(Error::invalid(
            what,
            value,
            format!(
                "it is {} bytes long; the limit is {MAX_NAME_BYTES} bytes of UTF-8",
                value.len()
            ),
        ));
    }
    if let Some(c) = value.chars().find(|c| c.is_control()) {
        return Err(Error::invalid(
            what,
            &value.escape_debug().to_string(),
            format!("it contains the control character {:?}", c),
        ));
    }
    Ok(())
}
