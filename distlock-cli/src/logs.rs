//! How the library's log events look on stderr by default: one plain line each, like
//! distlock's own messages (`distlock: warning: ...`), control characters escaped. With -v,
//! tracing's full format.

use std::fmt;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use crate::out::printable;

/// `distlock: warning: MESSAGE key=value`.
#[derive(Debug)]
pub(crate) struct Plain;

impl<S, N> FormatEvent<S, N> for Plain
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let level = match *event.metadata().level() {
            Level::ERROR => "error: ",
            Level::WARN => "warning: ",
            _ => "",
        };
        // The fields may carry a lock name or a server's answer: their control characters
        // are escaped (so they go through a plain string, without colours).
        let mut fields = String::new();
        ctx.format_fields(Writer::new(&mut fields), event)?;
        writeln!(writer, "distlock: {level}{}", printable(&fields))
    }
}
