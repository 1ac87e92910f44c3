//! An OpenAI Chat Completions request rewritten as an Anthropic Messages request (a
//! `/v1/chat/completions` caller served by an Anthropic step).

use serde_json::{Map, Value, json};

use super::fitting::Fitting;
use super::mapping::{anthropic_tool_id, parse_data_url, strip_error};
use super::structured;
use super::{Untranslatable, anthropic as an, openai as oa};

/// Anthropic requires `max_tokens`; used when the caller set no limit.
pub(super) const DEFAULT_MAX_TOKENS: u64 = 4096;

/// Top-level OpenAI fields with no Anthropic counterpart, each its own drop label.
const DROPPED_FIELDS: &[&str] = &[
    "logprobs",
    "top_logprobs",
    "audio",
    "modalities",
    "prediction",
    "seed",
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "reasoning_effort",
    "store",
    "metadata",
    "web_search_options",
    "verbosity",
    "service_tier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "safety_identifier",
    "functions",
    "function_call",
];

/// The typed conversion, applying the fitting rules of the mapping table (module docs).
pub(super) fn convert(
    mut req: oa::Request,
    target_model: &str,
) -> Result<(an::Request, Fitting), Untranslatable> {
    if req.n.is_some_and(|n| n > 1) {
        return Err(Untranslatable(
            "n > 1 asks for several choices; the Anthropic Messages API returns one".to_owned(),
        ));
    }
    let mut fit = Fitting::default();
    let output_config = structured::to_output_config(&mut req.extra)?;
    fit.drop_extra(&req.extra, DROPPED_FIELDS);
    let (tools, tool_choice) = tools(
        req.tools,
        req.tool_choice,
        req.parallel_tool_calls,
        &mut fit,
    )?;
    let (system, messages) = messages(req.messages, &mut fit)?;
    let temperature = req.temperature.map(|t| {
        // OpenAI allows up to 2, Anthropic up to 1.
        if t > 1.0 {
            fit.drop("temperature_clamped");
        }
        t.min(1.0)
    });
    let out = an::Request {
        model: target_model.to_owned(),
        max_tokens: Some(
            req.max_completion_tokens
                .or(req.max_tokens)
                .unwrap_or(DEFAULT_MAX_TOKENS),
        ),
        messages,
        system,
        stream: req.stream,
        tools,
        tool_choice,
        metadata: req.user.map(|u| an::Metadata { user_id: Some(u) }),
        stop_sequences: req.stop.map(|s| match s {
            oa::Stop::One(one) => vec![one],
            oa::Stop::Many(many) => many,
        }),
        // Claude's newer models refuse the two together ("cannot both be specified"), and
        // Anthropic advises one or the other: temperature, the one callers mostly mean, stays.
        top_p: match (temperature, req.top_p) {
            (Some(_), Some(_)) => {
                fit.drop("top_p");
                None
            }
            (_, top_p) => top_p,
        },
        temperature,
        extra: output_config
            .map(|c| Map::from_iter([("output_config".to_owned(), c)]))
            .unwrap_or_default(),
    };
    Ok((out, fit))
}

type ToolFields = (Option<Vec<an::Tool>>, Option<an::ToolChoice>);

/// Function tools become custom tools (non-function tools are dropped); `tool_choice` and
/// `parallel_tool_calls` fold into Anthropic's `tool_choice`.
fn tools(
    tools: Option<Vec<oa::Tool>>,
    choice: Option<oa::ToolChoice>,
    parallel: Option<bool>,
    fit: &mut Fitting,
) -> Result<ToolFields, Untranslatable> {
    let mut out = Vec::new();
    for tool in tools.unwrap_or_default() {
        let Some(function) = tool.function.filter(|_| tool.kind == "function") else {
            fit.drop("custom_tools");
            continue;
        };
        fit.drop_if(&function.strict, "strict");
        out.push(an::Tool {
            kind: None,
            name: function.name,
            description: function.description,
            // Omitted parameters mean "no arguments"; Anthropic requires a schema.
            input_schema: Some(
                function
                    .parameters
                    .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
            ),
            cache_control: None,
        });
    }
    let disable = parallel.map(|p| !p);
    let choice = match choice {
        None if disable == Some(true) => Some(an::ToolChoice::Auto {
            disable_parallel_tool_use: disable,
        }),
        None => None,
        Some(oa::ToolChoice::Mode(mode)) => Some(mode_choice(&mode, disable)?),
        Some(oa::ToolChoice::Named(named)) => Some(named_choice(named, disable, &mut out)?),
    };
    if out.is_empty() {
        // A choice that cannot call anything is meaningless; a forcing one is kept so the
        // provider refuses it as OpenAI would.
        let forced =
            choice.filter(|c| !matches!(c, an::ToolChoice::Auto { .. } | an::ToolChoice::None {}));
        return Ok((None, forced));
    }
    Ok((Some(out), choice))
}

fn mode_choice(mode: &str, disable: Option<bool>) -> Result<an::ToolChoice, Untranslatable> {
    match mode {
        "auto" => Ok(an::ToolChoice::Auto {
            disable_parallel_tool_use: disable,
        }),
        "required" => Ok(an::ToolChoice::Any {
            disable_parallel_tool_use: disable,
        }),
        "none" => Ok(an::ToolChoice::None {}),
        other => Err(Untranslatable(format!(
            "tool_choice `{other}` has no Anthropic equivalent"
        ))),
    }
}

/// A named function becomes `tool`; `allowed_tools` narrows the tool list to the allowed
/// ones (same effect, no Anthropic counterpart); a forced custom tool cannot be honoured.
fn named_choice(
    named: oa::NamedChoice,
    disable: Option<bool>,
    tools: &mut Vec<an::Tool>,
) -> Result<an::ToolChoice, Untranslatable> {
    match (named.kind.as_str(), named.function, named.allowed_tools) {
        ("function", Some(function), _) => Ok(an::ToolChoice::Tool {
            name: function.name,
            disable_parallel_tool_use: disable,
        }),
        ("allowed_tools", _, Some(allowed)) => {
            let names: Vec<String> = allowed
                .tools
                .into_iter()
                .filter_map(|t| t.function.map(|f| f.name))
                .collect();
            tools.retain(|t| names.contains(&t.name));
            mode_choice(&allowed.mode, disable)
        }
        (kind, _, _) => Err(Untranslatable(format!(
            "tool_choice of type `{kind}` forces a tool the Anthropic Messages API cannot run"
        ))),
    }
}

type Conversation = (Option<an::Content>, Vec<an::Message>);

/// System and developer messages before the first turn become `system`; later ones stay where
/// they stood, as `system` entries of `messages[]`. The others become turns, consecutive
/// same-role turns merged (tool results join the user turn after them).
fn messages(messages: Vec<oa::Message>, fit: &mut Fitting) -> Result<Conversation, Untranslatable> {
    let mut system: Vec<an::Content> = Vec::new();
    let mut out: Vec<an::Message> = Vec::with_capacity(messages.len());
    for message in messages {
        match message {
            oa::Message::System { content, name } | oa::Message::Developer { content, name } => {
                fit.drop_if(&name, "message_names");
                let content = text_content(content, fit);
                if out.is_empty() {
                    system.push(content);
                } else if !matches!(&content, an::Content::Blocks(b) if b.is_empty()) {
                    push_turn(&mut out, an::Role::System, content);
                }
            }
            oa::Message::User { content, name } => {
                fit.drop_if(&name, "message_names");
                push_turn(&mut out, an::Role::User, user_content(content, fit)?);
            }
            oa::Message::Assistant {
                content,
                tool_calls,
                refusal,
                name,
            } => {
                fit.drop_if(&name, "message_names");
                match assistant_content(content, tool_calls, refusal, fit) {
                    Some(content) => push_turn(&mut out, an::Role::Assistant, content),
                    None => fit.drop("empty_messages"),
                }
            }
            oa::Message::Tool {
                tool_call_id,
                content,
            } => {
                let block = tool_result(tool_call_id, content, fit);
                push_turn(&mut out, an::Role::User, an::Content::Blocks(vec![block]));
            }
            oa::Message::Other => fit.drop("function_messages"),
        }
    }
    let system = match system.len() {
        0 => None,
        1 => system.pop(),
        _ => Some(an::Content::Blocks(
            system.into_iter().flat_map(into_blocks).collect(),
        )),
    };
    // Nothing left (only non-text parts): no system at all rather than an empty list.
    let system = system.filter(|s| !matches!(s, an::Content::Blocks(b) if b.is_empty()));
    for message in &mut out {
        drop_blank_text(&mut message.content, fit);
    }
    if out.last().is_some_and(|m| m.role == an::Role::Assistant) {
        // Anthropic continues a final assistant turn (a prefill; refused by its newest
        // models) where OpenAI answers after it: sent as it is, and counted.
        fit.drop("assistant_prefill");
    }
    Ok((system, out))
}

/// Anthropic refuses a text block of whitespace only in a list of blocks; OpenAI takes an
/// empty message, which a merge of same-role turns turns into such a block. Dropped unless
/// nothing else is left (then the provider says what is wrong with the turn).
fn drop_blank_text(content: &mut an::Content, fit: &mut Fitting) {
    let an::Content::Blocks(blocks) = content else {
        return;
    };
    let blank = |b: &an::Block| matches!(b, an::Block::Text { text, .. } if text.trim().is_empty());
    if blocks.iter().any(blank) && !blocks.iter().all(blank) {
        blocks.retain(|b| !blank(b));
        fit.drop("empty_messages");
    }
}

fn push_turn(out: &mut Vec<an::Message>, role: an::Role, content: an::Content) {
    match out.last_mut() {
        Some(last) if last.role == role => {
            let mut blocks = into_blocks(std::mem::replace(
                &mut last.content,
                an::Content::Blocks(Vec::new()),
            ));
            blocks.extend(into_blocks(content));
            last.content = an::Content::Blocks(blocks);
        }
        _ => out.push(an::Message { role, content }),
    }
}

fn into_blocks(content: an::Content) -> Vec<an::Block> {
    match content {
        an::Content::Text(text) => vec![text_block(text)],
        an::Content::Blocks(blocks) => blocks,
    }
}

fn text_block(text: String) -> an::Block {
    an::Block::Text {
        text,
        cache_control: None,
        citations: None,
    }
}

/// Text-only content (system, developer): non-text parts are dropped.
fn text_content(content: oa::Content, fit: &mut Fitting) -> an::Content {
    match content {
        oa::Content::Text(text) => an::Content::Text(text),
        oa::Content::Parts(parts) => an::Content::Blocks(
            parts
                .into_iter()
                .filter_map(|part| match part {
                    oa::Part::Text { text } => Some(text_block(text)),
                    _ => {
                        fit.drop("unsupported_parts");
                        None
                    }
                })
                .collect(),
        ),
    }
}

fn user_content(content: oa::Content, fit: &mut Fitting) -> Result<an::Content, Untranslatable> {
    let parts = match content {
        oa::Content::Text(text) => return Ok(an::Content::Text(text)),
        oa::Content::Parts(parts) => parts,
    };
    let mut blocks = Vec::with_capacity(parts.len());
    for part in parts {
        match part {
            oa::Part::Text { text } => blocks.push(text_block(text)),
            oa::Part::ImageUrl { image_url } => {
                if image_url.detail.as_deref().is_some_and(|d| d != "auto") {
                    fit.drop("image_detail");
                }
                let source = match parse_data_url(&image_url.url) {
                    Some((media_type, data)) => an::Source::Base64 {
                        media_type: media_type.to_owned(),
                        data: data.to_owned(),
                    },
                    None => an::Source::Url { url: image_url.url },
                };
                blocks.push(an::Block::Image {
                    source,
                    cache_control: None,
                });
            }
            oa::Part::File { file } => blocks.push(document(file)?),
            oa::Part::InputAudio {} => fit.drop("input_audio"),
            oa::Part::Refusal { .. } | oa::Part::Other => fit.drop("unsupported_parts"),
        }
    }
    Ok(an::Content::Blocks(blocks))
}

/// A `file` part given inline as a base64 data URL becomes a document block; one given by
/// OpenAI file id cannot be read by Anthropic.
fn document(file: oa::FileRef) -> Result<an::Block, Untranslatable> {
    let inline = file.file_data.as_deref().and_then(parse_data_url);
    let Some((media_type, data)) = inline else {
        return Err(Untranslatable(
            "a file part must carry base64 file_data to be sent to the Anthropic Messages API"
                .to_owned(),
        ));
    };
    Ok(an::Block::Document {
        source: an::Source::Base64 {
            media_type: media_type.to_owned(),
            data: data.to_owned(),
        },
        title: file.filename,
        cache_control: None,
    })
}

/// Text (and a refusal, as text) then tool_use blocks. `None` when nothing is left.
fn assistant_content(
    content: Option<oa::Content>,
    tool_calls: Option<Vec<oa::ToolCall>>,
    refusal: Option<String>,
    fit: &mut Fitting,
) -> Option<an::Content> {
    let mut blocks = match content {
        Some(oa::Content::Text(text)) if tool_calls.is_none() && refusal.is_none() => {
            return (!text.is_empty()).then_some(an::Content::Text(text));
        }
        Some(content) => into_blocks(text_content(content, fit)),
        None => Vec::new(),
    };
    blocks.extend(refusal.map(text_block));
    // Anthropic rejects empty text blocks.
    blocks.retain(|b| !matches!(b, an::Block::Text { text, .. } if text.is_empty()));
    for call in tool_calls.unwrap_or_default() {
        let Some(function) = call.function.filter(|_| call.kind == "function") else {
            fit.drop("custom_tool_calls");
            continue;
        };
        blocks.push(an::Block::ToolUse {
            id: anthropic_tool_id(&call.id),
            name: function.name,
            input: tool_input(&function.arguments, fit),
            cache_control: None,
        });
    }
    (!blocks.is_empty()).then_some(an::Content::Blocks(blocks))
}

/// Arguments as the JSON object Anthropic requires; an empty string means no arguments, and
/// arguments that are not an object (a model's malformed output) are replaced by `{}`.
fn tool_input(arguments: &str, fit: &mut Fitting) -> Value {
    if arguments.trim().is_empty() {
        return json!({});
    }
    match serde_json::from_str::<Value>(arguments) {
        Ok(value @ Value::Object(_)) => value,
        _ => {
            fit.drop("invalid_tool_arguments");
            json!({})
        }
    }
}

/// A `tool` message as a tool_result block; the error marker in front of its text restores
/// `is_error`.
fn tool_result(tool_call_id: String, content: oa::Content, fit: &mut Fitting) -> an::Block {
    let mut is_error = None;
    let content = match content {
        oa::Content::Text(text) => {
            let text = match strip_error(&text) {
                Some(rest) => {
                    is_error = Some(true);
                    rest.to_owned()
                }
                None => text,
            };
            (!text.is_empty()).then_some(an::Content::Text(text))
        }
        oa::Content::Parts(parts) => {
            let mut blocks = into_blocks(text_content(oa::Content::Parts(parts), fit));
            if let Some(an::Block::Text { text, .. }) = blocks.first_mut()
                && let Some(rest) = strip_error(text).map(str::to_owned)
            {
                is_error = Some(true);
                *text = rest;
            }
            blocks.retain(|b| !matches!(b, an::Block::Text { text, .. } if text.is_empty()));
            (!blocks.is_empty()).then_some(an::Content::Blocks(blocks))
        }
    };
    an::Block::ToolResult {
        tool_use_id: anthropic_tool_id(&tool_call_id),
        content,
        is_error,
        cache_control: None,
    }
}
