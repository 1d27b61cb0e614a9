//! `run -d` / `resume -d`: what such a turn prints, and `__drive` itself. Starting the
//! background driver is the library's ([`crate::Session::start_detached`]).

use crate::cli::OutputFormat;
use crate::client::Session;
use crate::error::Result;
use crate::event::{Event, Status, TurnResult};
use crate::output;

pub(super) fn print_detached(session: &Session, format: OutputFormat) -> i32 {
    let record = session.record();
    match format {
        OutputFormat::Text => output::println(&record.session_id.to_string()),
        _ => {
            let result = TurnResult {
                session_id: record.session_id.to_string(),
                name: record.name.clone(),
                provider: record.provider,
                turn: record.next_turn(),
                status: match crate::session::admission::queued_turn(record.session_id) {
                    Some(q) if !q.admitted => q.status(),
                    _ => Status::Running,
                },
                result: String::new(),
                resume_handle: session.handle().to_json(),
                usage: Default::default(),
                priced: true,
                duration_ms: 0,
                exit_code: 0,
                quarantined: None,
                egress: None,
            };
            if format == OutputFormat::Json {
                output::print_json_line(&result);
            } else {
                output::print_json_line(&Event::Result { result });
            }
        }
    }
    0
}

/// `__drive`: runs one detached turn to its end, recording it in the session's volume.
pub async fn detached_driver() -> Result<i32> {
    crate::client::detach::drive_from_stdin().await
}
