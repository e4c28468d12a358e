//! Input rules shared by ids, scopes, sessions and intent names.

use crate::error::{Error, Result};

/// The longest operation id, scope, session or intent name, in bytes of UTF-8.
pub const MAX_NAME_BYTES: usize = 256;

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
