//! The text of a caught panic, for the code that catches one and says what it was: the
//! panic guard around redb (`preflight::guard`), [`Journal::execute`](crate::Journal::execute),
//! the reference service's edits and journaled MCP tools.
//!
//! A leaf: it depends on no other module of the crate, so every layer may use it.

use std::any::Any;

/// The message a panic carried: the `&str` or `String` that `panic!` makes, or `None` for
/// any other payload (one given to `std::panic::panic_any`), which each caller names in its
/// own words.
pub(crate) fn message(payload: &(dyn Any + Send)) -> Option<&str> {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_of_a_str_or_string_panic_is_its_text_and_any_other_payload_has_none() {
        let of = |f: fn()| std::panic::catch_unwind(f).expect_err("it panics");
        assert_eq!(message(of(|| panic!("plain")).as_ref()), Some("plain"));
        assert_eq!(
            message(of(|| panic!("formatted {}", 7)).as_ref()),
            Some("formatted 7")
        );
        assert_eq!(message(of(|| std::panic::panic_any(7u32)).as_ref()), None);
    }
}
