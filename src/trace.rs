//! Observability through the optional `tracing` feature.
//!
//! [`trace_span!`] and [`trace_event!`] take a level (`TRACE`, `DEBUG`, `INFO`, `WARN`,
//! `ERROR`) and then what `tracing::span!` / `tracing::event!` take. With the feature they
//! forward to `tracing`; without it they compile to nothing, and their arguments are not
//! evaluated. A span is entered at once and left when the returned guard drops:
//!
//! ```ignore
//! let _span = crate::trace_span!(DEBUG, "submit", operation_id = %op.id);
//! crate::trace_event!(DEBUG, batch = n, sync_us = t, "group commit");
//! ```

/// Enters a span until the returned guard drops (nothing without the `tracing` feature).
#[cfg(feature = "tracing")]
macro_rules! trace_span {
    ($level:ident, $($rest:tt)+) => {
        ::tracing::span!(::tracing::Level::$level, $($rest)+).entered()
    };
}

/// Enters a span until the returned guard drops (nothing without the `tracing` feature).
#[cfg(not(feature = "tracing"))]
macro_rules! trace_span {
    ($level:ident, $($rest:tt)+) => {
        ()
    };
}

/// Records an event (nothing without the `tracing` feature).
#[cfg(feature = "tracing")]
macro_rules! trace_event {
    ($level:ident, $($rest:tt)+) => {
        ::tracing::event!(::tracing::Level::$level, $($rest)+)
    };
}

/// Records an event (nothing without the `tracing` feature).
#[cfg(not(feature = "tracing"))]
macro_rules! trace_event {
    ($level:ident, $($rest:tt)+) => {{}};
}

pub(crate) use {trace_event, trace_span};
