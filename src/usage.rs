//! Watching a stream for usage: the usage seen so far, folded event by event by the dialect
//! of the stream's API (running totals are overwritten, never added).

use crate::api::ApiKind;
pub use crate::meter::Usage;
use crate::sse::SseEvent;

#[derive(Debug, Clone)]
pub struct StreamUsage {
    api: ApiKind,
    usage: Option<Usage>,
}

impl StreamUsage {
    pub fn new(api: ApiKind) -> Self {
        Self { api, usage: None }
    }

    /// Looks at one event; only events that can carry usage are parsed.
    pub fn observe(&mut self, ev: &SseEvent) {
        self.api.dialect().observe_usage(ev, &mut self.usage);
    }

    /// The usage seen so far (None until an event carried some).
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }
}
