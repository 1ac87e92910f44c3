//! A Responses request's conversation on the request path (SPEC §11): its
//! `previous_response_id` looked up once, the body a translated step gets, and the translators
//! that carry an answer back in the caller's API and keep each finished response in the store.
//! Every step calls `stream_translator` / `translate_whole` / `translate_error` with the
//! step's [`Xlate`]; the classic Messages ↔ Chat translation goes through them too. A relayed
//! stream is not translated: its watch hands the terminal event to [`stream_keeper`]'s
//! conversation.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde_json::Value;

use crate::api::{ApiKind, Operation, openai_responses};
use crate::error::ProxyError;
use crate::meter::Usage;
use crate::observe::RequestId;
use crate::proxy::Inbound;
use crate::proxy::inbound::Endpoint;
use crate::proxy::upbody::EventTranslator;
use crate::responses::{
    self, ConversationStore, Items, ResponseCtx, ResponsesStream, Stored, Target,
};
use crate::splice;
use crate::sse::SseEvent;
use crate::translate::{self, Xlate};

/// A Responses request's conversation: the id a translated answer gets, what came before
/// (from the store), and whether this turn is kept.
pub struct Conversation {
    /// The request's id, from which a translated answer's own (`resp_…`) is written when one
    /// is made: a relayed answer has the provider's id, and most answers are relayed.
    request_id: RequestId,
    pub created_at: u64,
    /// The caller's `previous_response_id`, and what the store holds for it.
    pub prior_id: Option<String>,
    pub prior: Option<Stored>,
    /// The whole input of this turn: the earlier turns' items, then this request's.
    pub input: Items,
    /// `store: false` turns are kept only as long as their own stream.
    pub keep: bool,
    pub store: Arc<ConversationStore>,
    /// The caller's tenant: what it keeps is its own, and it sees no other tenant's.
    tenant: Cow<'static, str>,
    /// `[[clients]]` name several tenants: relayed responses' owners are recorded apart from
    /// the store's entries (`responses/owners.rs`).
    several: bool,
}

impl Conversation {
    /// The JSON size of the earlier turns' items the store holds for `previous_response_id`
    /// (0 without them): what a provider resolving the id itself adds to the request.
    pub fn prior_bytes(&self) -> usize {
        let Some(prior) = &self.prior else {
            return 0;
        };
        prior
            .input
            .iter()
            .chain(prior.output())
            .map(|item| serde_json::to_vec(item).map_or(0, |v| v.len() + 1))
            .sum()
    }

    /// Looks `previous_response_id` up once. A store that cannot be reached is an error (a
    /// silent miss would answer without the conversation).
    pub async fn load(
        store: Arc<ConversationStore>,
        body: &Bytes,
        request_id: RequestId,
        (tenant, several, open): (Cow<'static, str>, bool, bool),
    ) -> Result<Self, ProxyError> {
        // One walk over the body for all three of its members the store needs.
        let turn = responses::Turn::read_shared(body);
        let prior_id = turn.previous_response_id;
        let prior = match &prior_id {
            Some(id) => store.get(id).await.map_err(|e| {
                tracing::warn!(error = %e.0, "the conversation store failed");
                ProxyError::StoreUnavailable {
                    retry_after: crate::redis_conn::PAUSE,
                }
            })?,
            None => None,
        };
        // Another tenant's response is as unknown as one never kept, and is not passed on to
        // a provider that would continue it (the provider key is the same for both tenants).
        if let (Some(id), Some(p)) = (&prior_id, &prior)
            && !p.belongs_to(&tenant, open)
        {
            return Err(ProxyError::PreviousResponseNotFound { id: id.clone() });
        }
        // With several tenants, one no longer kept may be another tenant's: not passed on,
        // unless it is known to be this tenant's.
        if let (Some(id), None, true) = (&prior_id, &prior, several)
            && !store.owners.is(id, &tenant)
        {
            return Err(ProxyError::PreviousResponseNotFound { id: id.clone() });
        }
        // A first turn's input is this request's as it was sent (its text, not parsed).
        let input = match &prior {
            Some(p) => {
                let mut items = p.input.clone();
                items.extend(p.output().iter().cloned());
                items.extend(turn.input.into_values());
                Items::Values(items)
            }
            None => turn.input,
        };
        let keep = turn.store;
        Ok(Conversation {
            request_id,
            created_at: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            prior_id,
            prior,
            input,
            keep,
            store,
            tenant,
            several,
        })
    }

    /// The conversation of a Responses generation or `input_tokens` call (None for any other).
    pub(crate) async fn for_call(
        store: &Arc<ConversationStore>,
        endpoint: Endpoint,
        body: &Bytes,
        request_id: RequestId,
        (tenant, several, open): (&str, bool, bool),
    ) -> Result<Option<Arc<Self>>, ProxyError> {
        // `input_tokens` too: its `previous_response_id` is forwarded as a generation's is,
        // and is held to the same tenant checks.
        if endpoint.api != ApiKind::Responses
            || !matches!(endpoint.op, Operation::Generate | Operation::InputTokens)
        {
            return Ok(None);
        }
        let tenant = crate::route::tenant_name(tenant);
        let scope = (tenant, several, open);
        let conv = Conversation::load(store.clone(), body, request_id, scope).await?;
        Ok(Some(Arc::new(conv)))
    }

    /// The id of an answer made here: `resp_` and 48 hex digits that name this request but
    /// cannot be told from it (see [`answer_id`]).
    fn id(&self) -> String {
        answer_id(self.request_id)
    }

    fn ctx(&self, body: &[u8]) -> ResponseCtx {
        ResponseCtx::new(self.id(), self.created_at, body)
    }

    /// Keeps a finished response built here (a translated one).
    pub fn save(&self, response: &Value) {
        if !self.keep {
            return;
        }
        if let Some(id) = response["id"].as_str() {
            // Its input carries the items of the provider the turn before it had them from.
            let origin = self.prior.as_ref().map_or("", |p| p.provider.as_str());
            let entry =
                Stored::serialise_tree(&self.input, response, (false, origin), &self.tenant);
            self.keep_entry(id, entry);
        }
    }

    /// Keeps a relayed response whose `id` is known (`response` is its JSON text, one value):
    /// the entry is written around those bytes, never built into a tree. A turn that continued
    /// a response legate does not hold (from before a restart, evicted, or made at the
    /// provider directly) is not kept: its input lacks the turns before it, and a translated
    /// step rebuilding the conversation from it would answer a model that silently lost them.
    /// The next turn is then as unknown as its predecessor was: relayed as it comes, or a
    /// 400 that asks for the whole conversation on a translated step.
    fn keep_relayed(&self, id: &str, response: &[u8], provider: &str) {
        if self.keep {
            self.own(id);
            if self.prior_id.is_some() && self.prior.is_none() {
                return;
            }
            // The items carried from another provider's turns are made this provider's: the
            // entry's reasoning is its provider's alone.
            let fitted;
            let input = match (&self.prior, &self.input) {
                (Some(p), Items::Values(all)) if p.provider != provider => {
                    let carried = (p.input.len() + p.output().len()).min(all.len());
                    let mut items = all[..carried].to_vec();
                    crate::responses::foreign(&mut items);
                    items.extend_from_slice(&all[carried..]);
                    fitted = Items::Values(items);
                    &fitted
                }
                _ => &self.input,
            };
            let entry = Stored::serialise(input, response, (true, provider), &self.tenant);
            self.keep_entry(id, entry);
        }
    }

    /// Records, with several tenants, that relayed response `id` is this tenant's: its
    /// provider is then asked about it for this tenant even when the store no longer keeps it.
    fn own(&self, id: &str) {
        if self.several {
            self.store.owners.record(id, &self.tenant);
        }
    }

    /// A relayed stream's `response.created` event: with several tenants, the response is
    /// this tenant's from then on (polled or cancelled while it runs, or after it failed,
    /// which the store never keeps). `store: false` responses are not: their provider keeps
    /// nothing to ask about.
    pub(crate) fn note_started(&self, ev: &SseEvent) {
        if !self.several
            || !self.keep
            || crate::api::openai_responses::event_type(ev).as_deref() != Some("response.created")
        {
            return;
        }
        let data = ev.data.as_bytes();
        if let Some(span) = splice::value_near_end(data, "response")
            && let (Some(id), _) = read_relayed(&data[span])
        {
            self.own(&id);
        }
    }

    /// Keeps the response a relayed stream's terminal event carries (`event:
    /// response.completed` / `response.incomplete`): the bytes of its `response` member as
    /// they came, like a relayed whole answer, found by a walk over the event's members.
    ///
    /// The walk that finds the id finds the usage too: returns the `usage` of the event's
    /// `response` (`Some(None)`: read, and there is none), or None for an event it does not
    /// read, so that the stream's watch need not walk the same event again for it.
    pub(crate) fn keep_terminal(&self, ev: &SseEvent, provider: &str) -> Option<Option<Usage>> {
        // The event's type as the stream's classifier reads it: the `event:` name, else the
        // data's `type` (a provider that leaves out `event:` lines is kept too).
        if !matches!(
            crate::api::openai_responses::event_type(ev).as_deref(),
            Some("response.completed" | "response.incomplete")
        ) {
            return None;
        }
        let data = ev.data.as_bytes();
        let Some(span) = splice::value_near_end(data, "response") else {
            return Some(None);
        };
        let response = &data[span];
        let (id, usage) = read_relayed(response);
        // Relayed, so kept as a relayed response (its provider answers for it).
        if let Some(id) = id {
            self.keep_relayed(&id, response, provider);
        }
        Some(usage)
    }

    /// The memory store keeps the entry at once (a map insert under a short lock); Redis in
    /// the background, so the caller does not wait for it, within a bound on the bytes
    /// waiting to be written (`[responses] max_bytes`): beyond it, or when the write fails,
    /// the entry is kept in this process's memory instead.
    fn keep_entry(&self, id: &str, data: Vec<u8>) {
        if self.store.deleted.buried(id) {
            // Deleted while its stream ran: the caller's delete stands.
            return;
        }
        if let Some(memory) = self.store.memory() {
            // The earlier turn this one continues is held whole in this one's entry.
            let continues = self.prior.as_ref().and(self.prior_id.as_deref());
            memory.keep(id, data, continues);
            return;
        }
        let Some(redis) = self.store.redis() else {
            return;
        };
        // Twice its bytes: the command's, and the copy lookups find until the write is answered.
        let Some(slot) = redis.reserve_write(data.len().saturating_mul(2)) else {
            match redis.keep(id, data, false) {
                true => tracing::warn!(
                    "a response is kept in this process's memory, not in Redis: writes waiting for Redis already hold [responses] max_bytes"
                ),
                false => {
                    tracing::warn!("a response was not kept: larger than [responses] max_bytes")
                }
            }
            return;
        };
        let shared: Arc<[u8]> = Arc::from(data);
        redis.will_write(id, shared.clone());
        let store = self.store.clone();
        let id = id.to_owned();
        tokio::spawn(async move {
            let _slot = slot;
            if let Err(e) = store.put_serialised(&id, shared.to_vec()).await {
                tracing::warn!(error = %e.0, "a response was not written to Redis");
            }
        });
    }

    /// The body for a translated step: rebuilt from the store when it names an earlier
    /// response, then translated. An id legate never saw cannot be served here.
    pub fn request_for(
        &self,
        target: Target,
        body: &[u8],
        model: &str,
    ) -> Result<(Vec<u8>, Vec<&'static str>), String> {
        let rebuilt;
        let body = match (&self.prior_id, &self.prior) {
            (Some(id), None) => return Err(unknown_previous(id)),
            (Some(_), Some(prior)) => {
                rebuilt = responses::rebuild(body, prior, None).map_err(|e| e.0)?;
                rebuilt.as_slice()
            }
            _ => body,
        };
        responses::request_for(target, body, model).map_err(|e| e.0)
    }
}

fn unknown_previous(id: &str) -> String {
    format!(
        "previous_response_id `{}` is unknown (legate never relayed it, or it expired); \
         resend the whole conversation as input",
        crate::error::shown(id)
    )
}

/// The body a step of the caller's own API relays, fitted to the step (`generate` and
/// `input_tokens` alike): the caller's own, or, when it continues from a response legate made
/// itself (a translated step's), whose id the provider never saw, the conversation rebuilt
/// from the store. `Ok(Err(why))`: the rebuilt conversation cannot go to this step.
///
/// The rebuild walks every stored turn, up to `[responses] max_bytes` of JSON: it runs on a
/// blocking thread, as a translation does, so a long conversation holds no worker.
pub(crate) async fn relay_body(
    inb: &Inbound,
    step: &crate::config::ChainStep,
    api: ApiKind,
    limit: Option<u64>,
) -> Result<Result<Bytes, String>, ProxyError> {
    match rebuilding(inb, step.provider()) {
        Some(conv) => rebuilt_body(conv, inb, step, api, limit).await,
        None => crate::route::fit(&inb.body, &inb.meta, step, api, limit).map(Ok),
    }
}

/// The conversation [`relay_body`] rebuilds, if any: one continuing a response legate made.
pub(crate) fn rebuilding(inb: &Inbound, provider: &str) -> Option<Arc<Conversation>> {
    inb.conversation
        .as_ref()
        .filter(|c| {
            c.prior
                .as_ref()
                .is_some_and(|p| made_elsewhere(p, provider))
        })
        .cloned()
}

/// Whether `provider` cannot continue `prior` by its id: legate made it (a translated step's),
/// or another provider relayed it (a chain that fell back from one provider of the Responses
/// API to another: the first one's id means nothing to the second, which answered 400
/// `previous_response_not_found`, though the store holds the whole conversation).
fn made_elsewhere(prior: &Stored, provider: &str) -> bool {
    !prior.passthrough || (!prior.provider.is_empty() && prior.provider != provider)
}

/// [`relay_body`] of a conversation to rebuild: `Ok(Err(why))` when the rebuilt conversation
/// cannot go to the step; an error of legate's own (the fit failing, the blocking thread
/// lost) is an error.
pub(crate) async fn rebuilt_body(
    conv: Arc<Conversation>,
    inb: &Inbound,
    step: &crate::config::ChainStep,
    api: ApiKind,
    limit: Option<u64>,
) -> Result<Result<Bytes, String>, ProxyError> {
    let (body, step) = (inb.body.clone(), step.clone());
    tokio::task::spawn_blocking(move || {
        let Some(prior) = &conv.prior else {
            return Ok(Err("the conversation was not loaded".to_owned()));
        };
        let rebuilt = responses::rebuild(&body, prior, Some(step.provider())).map_err(|e| e.0);
        let read = rebuilt.and_then(|bytes| {
            let bytes = Bytes::from(bytes);
            let meta = api
                .dialect()
                .parse_request(&bytes)
                .map_err(|e| e.to_string())?;
            Ok((bytes, meta))
        });
        match read {
            Ok((bytes, meta)) => crate::route::fit(&bytes, &meta, &step, api, limit).map(Ok),
            Err(why) => Ok(Err(why)),
        }
    })
    .await
    .map_err(|_| ProxyError::Internal)?
}

/// `resp_` and the first 24 bytes of an HMAC of the request id under a key drawn once per
/// process, in hex: the same for every attempt of one request, and not guessable from the
/// ids a caller sees (request ids count up), so a caller cannot name a response it was
/// never given. The shape of OpenAI's own ids.
fn answer_id(request_id: RequestId) -> String {
    use ring::hmac;
    static KEY: std::sync::OnceLock<hmac::Key> = std::sync::OnceLock::new();
    let key = KEY.get_or_init(|| {
        let random = ring::rand::SystemRandom::new();
        // The system's random source failing is not a state legate can serve in.
        hmac::Key::generate(hmac::HMAC_SHA256, &random)
            .unwrap_or_else(|_| panic!("the system's random source failed"))
    });
    let tag = hmac::sign(key, &request_id.to_bytes());
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut id = String::with_capacity("resp_".len() + 48);
    id.push_str("resp_");
    for b in &tag.as_ref()[..24] {
        id.push(HEX[usize::from(b >> 4)] as char);
        id.push(HEX[usize::from(b & 0xf)] as char);
    }
    id
}

/// The caller's body in the step's API (`xl` translating), and what the fitting rules dropped.
pub(crate) fn translate_request(
    xl: Xlate,
    inb: &Inbound,
    model: &str,
) -> Result<(Vec<u8>, Vec<&'static str>), String> {
    translate_body(xl, inb.conversation.as_deref(), &inb.body, model)
}

/// [`translate_request`] from its parts, which a blocking thread can own.
pub(crate) fn translate_body(
    xl: Xlate,
    conversation: Option<&Conversation>,
    body: &Bytes,
    model: &str,
) -> Result<(Vec<u8>, Vec<&'static str>), String> {
    match (xl, conversation) {
        (Xlate::Classic(dir), _) => translate::request(dir, body, model).map_err(|e| e.0),
        (Xlate::Responses(target), Some(conv)) => conv.request_for(target, body, model),
        (Xlate::Responses(target), None) => {
            responses::request_for(target, body, model).map_err(|e| e.0)
        }
        (Xlate::None, _) => Ok((body.to_vec(), Vec::new())),
    }
}

/// The stream translator of a translated step: keeps the finished response in the store.
struct Keeping {
    inner: ResponsesStream,
    conv: Arc<Conversation>,
    saved: bool,
}

impl Keeping {
    fn after(&mut self, out: Vec<u8>) -> Vec<u8> {
        if !self.saved
            && let Some(done) = self.inner.final_response()
        {
            self.saved = true;
            self.conv.save(done);
        }
        out
    }
}

impl EventTranslator for Keeping {
    fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        let out = self.inner.push(chunk);
        self.after(out)
    }
    fn finish(&mut self) -> Vec<u8> {
        let out = self.inner.finish();
        self.after(out)
    }
    fn keep_alive(&self) -> &'static [u8] {
        if self.inner.is_complete() {
            b""
        } else {
            b": ping\n\n"
        }
    }
}

/// The stream translator for a step, if its stream is not passed through untouched.
pub(crate) fn stream_translator(xl: Xlate, inb: &Inbound) -> Option<Box<dyn EventTranslator>> {
    match (xl, &inb.conversation) {
        (Xlate::Classic(dir), _) => Some(Box::new(translate::StreamTranslator::new(
            dir,
            inb.meta.include_usage,
        ))),
        (Xlate::Responses(target), Some(conv)) => {
            // With several tenants, the caller may delete (or read) the response while it
            // streams: it is this tenant's from its first event on, as a relayed one is.
            if conv.keep && conv.several {
                conv.own(&conv.id());
            }
            Some(Box::new(Keeping {
                inner: responses::stream_for(target, conv.ctx(&inb.body)),
                conv: conv.clone(),
                saved: false,
            }))
        }
        // A relayed stream passes untranslated: its watch keeps the final response.
        _ => None,
    }
}

/// The conversation that keeps the final response of a relayed (untranslated) Responses
/// stream: the stream's one watch reads its events and hands it the terminal one.
pub(crate) fn stream_keeper(
    xl: Xlate,
    inb: &Inbound,
    provider: &str,
    unsettled: &Arc<super::background::Unsettled>,
) -> Option<Keeper> {
    match (xl, &inb.conversation) {
        (Xlate::None, Some(conv)) if conv.keep => Some(Keeper {
            conv: conv.clone(),
            provider: provider.to_owned(),
            unsettled: unsettled.clone(),
            background: None,
            looking: LOOK_FOR_START,
        }),
        _ => None,
    }
}

/// What keeps a relayed stream's final response: the conversation, and the provider that
/// relayed it (whose ids another provider cannot continue).
pub(crate) struct Keeper {
    conv: Arc<Conversation>,
    provider: String,
    /// Where a background response cut before its final event waits for its usage
    /// (`background.rs`), and its id, from the stream's `response.created`.
    pub(crate) unsettled: Arc<super::background::Unsettled>,
    pub(crate) background: Option<String>,
    /// Events still to look at for the response's start: a gateway's ping may come first.
    looking: u8,
}

/// The events of a relayed stream looked at for its `response.created`, which comes first.
const LOOK_FOR_START: u8 = 4;

impl Keeper {
    pub(crate) fn note_started(&mut self, ev: &SseEvent) {
        self.conv.note_started(ev);
        if self.looking > 0 {
            self.looking -= 1;
            if ev.event.as_deref() == Some("response.created") {
                self.looking = 0;
            }
            if let Some(id) = super::background::started(ev) {
                self.background = Some(id);
                self.looking = 0;
            }
        }
    }

    pub(crate) fn keep_terminal(&self, ev: &SseEvent) -> Option<Option<Usage>> {
        self.conv.keep_terminal(ev, &self.provider)
    }
}

/// Whether a whole answer is read by `translate_whole`: translated, or kept in the store.
pub(crate) fn rewrites_whole(xl: Xlate, inb: &Inbound) -> bool {
    xl.translating() || inb.conversation.is_some()
}

/// A whole answer on its way to the caller.
pub(crate) struct WholeAnswer {
    pub body: Bytes,
    /// The answer's usage, when reading it for the store read that too (`Some(None)`: read,
    /// and there is none); None when it is still to be read.
    pub usage: Option<Option<Usage>>,
}

impl WholeAnswer {
    fn unread(body: Bytes) -> Self {
        WholeAnswer { body, usage: None }
    }
}

/// What legate reads of a relayed Responses answer: its `id`, for the store, and its usage, for
/// metering. A Response has its `id` among its first members, before the output, and ends
/// with its usage (and a few short members), so the id is looked for from the start up to the
/// first `id` and the usage from the end: the output between them, most of the body, is not
/// walked at all. An answer laid out otherwise is walked member by member
/// ([`read_relayed_walk`]). A body that is not an object has neither.
fn read_relayed(body: &[u8]) -> (Option<Cow<'_, str>>, Option<Usage>) {
    let first_id =
        splice::top_level_members(body).find(|m| splice::key_matches(&body[m.key.clone()], "id"));
    let Some(id) = first_id.map(|m| m.value) else {
        return read_relayed_walk(body);
    };
    let usage = match splice::last_member(body, "usage") {
        splice::Tail::Found(span) => Some(span),
        splice::Tail::Absent => None,
        splice::Tail::Unknown => return read_relayed_walk(body),
    };
    relayed_fields(body, Some(id), usage)
}

/// [`read_relayed`] in one walk over every top-level member (nested values are skipped
/// unparsed, never built into a tree); with duplicate keys, the last one (what serde_json and
/// most parsers honour).
fn read_relayed_walk(body: &[u8]) -> (Option<Cow<'_, str>>, Option<Usage>) {
    match splice::top_level_value_spans(body, ["id", "usage"]) {
        Some([id, usage]) => relayed_fields(body, id, usage),
        None => (None, None),
    }
}

/// The string `id` and the usage at the spans found.
fn relayed_fields(
    body: &[u8],
    id: Option<Range<usize>>,
    usage: Option<Range<usize>>,
) -> (Option<Cow<'_, str>>, Option<Usage>) {
    // Borrowed when the string has no escapes (as ids do): serde's own `Cow<str>` is always a
    // copy. Only an id with escapes is read again, into a string of its own.
    let id = id.and_then(|span| {
        let text = &body[span];
        match serde_json::from_slice::<Option<&str>>(text) {
            Ok(id) => id.map(Cow::Borrowed),
            Err(_) => serde_json::from_slice::<Option<String>>(text)
                .ok()
                .flatten()
                .map(Cow::Owned),
        }
    });
    let usage = usage.and_then(|span| openai_responses::usage_of_member(&body[span]));
    (id, usage)
}

/// A whole answer in the caller's API (and kept, for a Responses caller).
pub(crate) fn translate_whole(
    xl: Xlate,
    inb: &Inbound,
    body: &Bytes,
    provider: &str,
) -> Result<WholeAnswer, String> {
    match (xl, &inb.conversation) {
        (Xlate::Classic(dir), _) => translate::response(dir, body)
            .map(|b| WholeAnswer::unread(crate::proxy::buffers::exact(b)))
            .map_err(|e| e.0),
        (Xlate::Responses(target), Some(conv)) => {
            let obj =
                responses::response_for(target, body, &conv.ctx(&inb.body)).map_err(|e| e.0)?;
            conv.save(&obj);
            Ok(WholeAnswer::unread(crate::proxy::buffers::exact(
                obj.to_string().into_bytes(),
            )))
        }
        // Relayed as it came: the caller gets the very bytes, the store keeps them; the one
        // walk that finds the id finds the usage too.
        (Xlate::None, Some(conv)) => {
            // Not an object, or no string `id`: not kept.
            let (id, usage) = read_relayed(body);
            if let Some(id) = id {
                conv.keep_relayed(&id, body, provider);
            }
            Ok(WholeAnswer {
                body: body.clone(),
                usage: Some(usage),
            })
        }
        _ => Ok(WholeAnswer::unread(body.clone())),
    }
}

/// An upstream error of a translated step, in the caller's envelope.
pub(crate) fn translate_error(xl: Xlate, status: u16, body: &[u8]) -> (u16, Vec<u8>) {
    match xl {
        Xlate::Classic(dir) => translate::error(dir, status, body),
        Xlate::Responses(target) => responses::error_for(target, status, body),
        Xlate::None => (status, body.to_vec()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relayed_answer_is_read_for_its_id_and_usage_from_both_ends() {
        let body = br#"{"id":"resp_1","output":[{"content":[{"text":"\"id\":\"no\",\"usage\":{}"}]}],
            "usage":{"input_tokens":40,"input_tokens_details":{"cached_tokens":30},"output_tokens":7}}"#;
        let (id, usage) = read_relayed(body);
        assert_eq!(id.as_deref(), Some("resp_1"));
        // An id without escapes is the body's own text, not a copy.
        assert!(matches!(id, Some(Cow::Borrowed(_))));
        assert_eq!(
            usage,
            Some(Usage {
                input: 10,
                output: 7,
                cache_read: 30,
                cache_write: 0,
            })
        );
        // Keys compared unescaped; the first id.
        let (id, usage) =
            read_relayed(br#"{"object":"response","\u0069d":"r\u00e9p","id":"x","usage":null}"#);
        assert_eq!((id.as_deref(), usage), (Some("r\u{e9}p"), None));
        // No id: every member walked, and nothing to keep.
        let body =
            br#"{"object":"response","usage":{"input_tokens":2,"output_tokens":1},"user":null}"#;
        let (id, usage) = read_relayed(body);
        assert_eq!(id, None);
        assert_eq!(usage.map(|u| (u.input, u.output)), Some((2, 1)));
        // Read from both ends, the output between them is not walked: a broken middle does
        // not hide the id and usage the provider sent.
        let (id, usage) = read_relayed(
            br#"{"id":"c","output":[}],"usage":{"input_tokens":1,"output_tokens":1}}"#,
        );
        assert_eq!(
            (id.as_deref(), usage.map(|u| u.output)),
            (Some("c"), Some(1))
        );
    }

    #[test]
    fn a_relayed_answer_without_a_string_id_or_not_an_object_has_nothing_to_keep() {
        for body in [
            &br#"{"id":7,"usage":{"input_tokens":1,"output_tokens":2}}"#[..],
            br#"{"id":null}"#,
            br#"{"id":"resp_1","usage":{"input_tokens":1}"#,
            br#"["resp_1"]"#,
            b"<html>",
            b"",
        ] {
            let (id, _) = read_relayed(body);
            assert_eq!(id, None, "{}", String::from_utf8_lossy(body));
        }
        let (_, usage) = read_relayed(br#"{"id":7,"usage":{"input_tokens":1,"output_tokens":2}}"#);
        assert_eq!(usage.map(|u| (u.input, u.output)), Some((1, 2)));
        assert_eq!(read_relayed(br#"{"id":"x","usage":{"#), (None, None));
    }
}
