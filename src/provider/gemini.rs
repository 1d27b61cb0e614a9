//! Placeholder adapter for gemini, being written (see provider/mod.rs for the contract).

use super::*;

#[derive(Debug)]
pub struct Gemini;

impl Provider for Gemini {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Gemini
    }
    fn turn_command(&self, _request: &TurnRequest<'_>) -> TurnCommand {
        TurnCommand::default()
    }
    fn parser(&self, _context: ParseContext) -> Box<dyn StreamParser> {
        unimplemented!()
    }
}
