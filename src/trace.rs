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

/// What a thread the journal starts for a caller's work (a checkpoint) takes over from
/// the caller: the `tracing` subscriber and the span in effect, so that the work's events
/// reach a subscriber set for the caller's thread only, under the caller's span.
#[cfg(feature = "tracing")]
pub(crate) struct Context {
    dispatch: tracing::Dispatch,
    span: tracing::Span,
}

#[cfg(feature = "tracing")]
impl Context {
    /// The calling thread's subscriber and current span.
    pub(crate) fn capture() -> Context {
        Context {
            dispatch: tracing::dispatcher::get_default(|d| d.clone()),
            span: tracing::Span::current(),
        }
    }

    /// Runs `f` under the captured subscriber and span.
    pub(crate) fn run<R>(&self, f: impl FnOnce() -> R) -> R {
        tracing::dispatcher::with_default(&self.dispatch, || self.span.in_scope(f))
    }
}

/// Nothing to take over without the `tracing` feature.
#[cfg(not(feature = "tracing"))]
pub(crate) struct Context;

#[cfg(not(feature = "tracing"))]
impl Context {
    pub(crate) fn capture() -> Context {
        Context
    }

    pub(crate) fn run<R>(&self, f: impl FnOnce() -> R) -> R {
        f()
    }
}
