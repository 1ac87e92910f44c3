//! An Anthropic Messages request rewritten as an OpenAI Chat Completions request (a
//! `/v1/messages` caller served by an OpenAI-compatible step).

use serde_json::{Map, Value};

use super::fitting::Fitting;
use super::mapping::{data_url, mark_error};
use super::structured;
use super::{Untranslatable, anthropic as an, openai as oa};

/// Top-level Anthropic fields with no OpenAI counterpart, each its own drop label.
const DROPPED_FIELDS: &[&str] = &[
    "thinking",
    "top_k",
    "cache_control",
    "service_tier",
    "container",
    "mcp_servers",
    "context_management",
    "inference_geo",
    "output_config",
];

/// The typed conversion, applying the fitting rules of the mapping table (module docs).
pub(super) fn convert(
    mut req: an::Request,
    target_model: &str,
) -> Result<(oa::Request, Fitting), Untranslatable> {
    let mut fit = Fitting::default();
    let response_format = structured::to_response_format(&mut req.extra)?;
    fit.drop_extra(&req.extra, DROPPED_FIELDS);
    let (tools, tool_choice, parallel_tool_calls) = tools(req.tools, req.tool_choice, &mut fit)?;
    let mut messages = Vec::with_capacity(req.messages.len() + 1);
    match req.system.map(|system| text_content(system, &mut fit)) {
        // Nothing left of it (no text blocks): OpenAI rejects an empty content list.
        None => {}
        Some(oa::Content::Parts(parts)) if parts.is_empty() => {}
        Some(content) => messages.push(oa::Message::System {
            content,
            name: None,
        }),
    }
    if req
        .messages
        .last()
        .is_some_and(|m| m.role == an::Role::Assistant)
    {
        // OpenAI answers after a final assistant turn instead of continuing it.
        fit.drop("assistant_prefill");
    }
    for message in req.messages {
        match message.role {
            an::Role::User => user_messages(message.content, &mut messages, &mut fit)?,
            an::Role::Assistant => assistant_message(message.content, &mut messages, &mut fit),
            // Kept where it stands: a system note mid-conversation applies from there on.
            an::Role::System => match text_content(message.content, &mut fit) {
                oa::Content::Parts(parts) if parts.is_empty() => fit.drop("empty_messages"),
                content => messages.push(oa::Message::System {
                    content,
                    name: None,
                }),
            },
        }
    }
    let stream_options = (req.stream == Some(true)).then_some(oa::StreamOptions {
        // Usage arrives only in a final chunk the caller's message_delta needs.
        include_usage: Some(true),
    });
    let out = oa::Request {
        model: target_model.to_owned(),
        messages,
        max_completion_tokens: req.max_tokens,
        max_tokens: None,
        stream: req.stream,
        stream_options,
        tools,
        tool_choice,
        parallel_tool_calls,
        stop: req.stop_sequences.map(oa::Stop::Many),
        temperature: req.temperature,
        top_p: req.top_p,
        user: req.metadata.and_then(|m| m.user_id),
        n: None,
        extra: response_format
            .map(|f| Map::from_iter([("response_format".to_owned(), f)]))
            .unwrap_or_default(),
    };
    Ok((out, fit))
}

type ToolFields = (Option<Vec<oa::Tool>>, Option<oa::ToolChoice>, Option<bool>);

/// Custom tools become function tools; server tools are dropped, and a choice that can only be
/// honoured by a server tool makes the request untranslatable.
fn tools(
    tools: Option<Vec<an::Tool>>,
    choice: Option<an::ToolChoice>,
    fit: &mut Fitting,
) -> Result<ToolFields, Untranslatable> {
    let tools = tools.unwrap_or_default();
    let mut out = Vec::with_capacity(tools.len());
    for tool in &tools {
        if tool.is_server_tool() {
            fit.drop("server_tools");
            continue;
        }
        fit.drop_if(&tool.cache_control, "cache_control");
        out.push(oa::Tool {
            kind: oa::function_kind(),
            function: Some(oa::FunctionDef {
                name: tool.name.clone(),
                description: tool.description.clone(),
                parameters: tool.input_schema.clone(),
                strict: None,
            }),
        });
    }
    let (choice, disable_parallel) = match choice {
        None => (None, None),
        Some(choice) => tool_choice(choice, &tools, out.is_empty())?,
    };
    if out.is_empty() {
        // OpenAI refuses tool_choice and parallel_tool_calls without tools. A choice that
        // forces a call is kept so the provider refuses it as Anthropic would.
        let forced =
            choice.filter(|c| !matches!(c, oa::ToolChoice::Mode(m) if m == "auto" || m == "none"));
        return Ok((None, forced, None));
    }
    Ok((Some(out), choice, disable_parallel.map(|d| !d)))
}

/// The OpenAI tool choice and Anthropic's `disable_parallel_tool_use` flag. Refuses a choice
/// that only a server tool could meet.
fn tool_choice(
    choice: an::ToolChoice,
    tools: &[an::Tool],
    no_custom_tools: bool,
) -> Result<(Option<oa::ToolChoice>, Option<bool>), Untranslatable> {
    let is_server = |name: &str| tools.iter().any(|t| t.is_server_tool() && t.name == name);
    let has_server = tools.iter().any(an::Tool::is_server_tool);
    let mode = |m: &str| Some(oa::ToolChoice::Mode(m.to_owned()));
    Ok(match choice {
        an::ToolChoice::Auto {
            disable_parallel_tool_use,
        } => (mode("auto"), disable_parallel_tool_use),
        an::ToolChoice::Any { .. } if no_custom_tools && has_server => {
            return Err(Untranslatable(
                "tool_choice `any` can only be met by server tools, which an OpenAI-compatible provider does not run".to_owned(),
            ));
        }
        an::ToolChoice::Any {
            disable_parallel_tool_use,
        } => (mode("required"), disable_parallel_tool_use),
        an::ToolChoice::Tool { name, .. } if is_server(&name) => {
            return Err(Untranslatable(format!(
                "tool_choice forces the server tool `{name}`, which an OpenAI-compatible provider does not run"
            )));
        }
        an::ToolChoice::Tool {
            name,
            disable_parallel_tool_use,
        } => {
            let named = oa::NamedChoice {
                kind: oa::function_kind(),
                function: Some(oa::Name { name }),
                allowed_tools: None,
            };
            (
                Some(oa::ToolChoice::Named(named)),
                disable_parallel_tool_use,
            )
        }
        an::ToolChoice::None {} => (mode("none"), None),
    })
}

/// System prompt (or any text-only content): cache_control and citations are dropped, and a
/// single text is sent as a plain string, which every OpenAI-compatible server accepts.
fn text_content(content: an::Content, fit: &mut Fitting) -> oa::Content {
    let blocks = match content {
        an::Content::Text(text) => return oa::Content::Text(text),
        an::Content::Blocks(blocks) => blocks,
    };
    let mut parts = Vec::with_capacity(blocks.len());
    for block in blocks {
        match block {
            an::Block::Text {
                text,
                cache_control,
                citations,
            } => parts.push(text_part(text, &cache_control, &citations, fit)),
            other => drop_block(&other, fit),
        }
    }
    collapse(parts)
}

/// A text block as a part: its cache_control and citations have no OpenAI counterpart.
fn text_part(
    text: String,
    cache_control: &Option<Value>,
    citations: &Option<Value>,
    fit: &mut Fitting,
) -> oa::Part {
    fit.drop_if(cache_control, "cache_control");
    fit.drop_if(citations, "citations");
    oa::Part::Text { text }
}

/// One text part is sent as a string; anything else as parts.
fn collapse(mut parts: Vec<oa::Part>) -> oa::Content {
    if let [oa::Part::Text { text }] = parts.as_mut_slice() {
        return oa::Content::Text(std::mem::take(text));
    }
    oa::Content::Parts(parts)
}

/// Labels a block that has no place in the OpenAI message being built.
fn drop_block(block: &an::Block, fit: &mut Fitting) {
    match block {
        an::Block::Thinking {} | an::Block::RedactedThinking {} => fit.drop("thinking_blocks"),
        an::Block::Image { .. } | an::Block::Document { .. } => fit.drop("misplaced_media"),
        _ => fit.drop("unsupported_blocks"),
    }
}

/// A user turn: its tool results become `tool` messages (which must directly follow the
/// assistant's tool calls), the rest one user message after them.
fn user_messages(
    content: an::Content,
    out: &mut Vec<oa::Message>,
    fit: &mut Fitting,
) -> Result<(), Untranslatable> {
    let blocks = match content {
        an::Content::Text(text) => {
            out.push(oa::Message::User {
                content: oa::Content::Text(text),
                name: None,
            });
            return Ok(());
        }
        an::Content::Blocks(blocks) => blocks,
    };
    let mut parts = Vec::with_capacity(blocks.len());
    for block in blocks {
        match block {
            an::Block::Text {
                text,
                cache_control,
                citations,
            } => parts.push(text_part(text, &cache_control, &citations, fit)),
            an::Block::Image {
                source,
                cache_control,
            } => {
                fit.drop_if(&cache_control, "cache_control");
                parts.push(image_part(source)?);
            }
            an::Block::Document {
                source,
                title,
                cache_control,
            } => {
                fit.drop_if(&cache_control, "cache_control");
                parts.push(document_part(source, title, fit)?);
            }
            an::Block::ToolResult {
                tool_use_id,
                content,
                is_error,
                cache_control,
            } => {
                fit.drop_if(&cache_control, "cache_control");
                let content = tool_result_content(content, is_error == Some(true), fit);
                out.push(oa::Message::Tool {
                    tool_call_id: tool_use_id,
                    content,
                });
            }
            other => drop_block(&other, fit),
        }
    }
    if !parts.is_empty() {
        out.push(oa::Message::User {
            content: collapse(parts),
            name: None,
        });
    }
    Ok(())
}

fn image_part(source: an::Source) -> Result<oa::Part, Untranslatable> {
    let url = match source {
        an::Source::Base64 { media_type, data } => data_url(&media_type, &data),
        an::Source::Url { url } => url,
        an::Source::Text { .. } | an::Source::Other => {
            return Err(Untranslatable(
                "an image from the Files API has no OpenAI Chat Completions equivalent".to_owned(),
            ));
        }
    };
    Ok(oa::Part::ImageUrl {
        image_url: oa::ImageUrl { url, detail: None },
    })
}

/// Base64 documents (PDF) become `file` parts; plain-text documents become text. Documents by
/// URL or file id cannot be handed to an OpenAI-compatible provider.
fn document_part(
    source: an::Source,
    title: Option<String>,
    fit: &mut Fitting,
) -> Result<oa::Part, Untranslatable> {
    match source {
        an::Source::Base64 { media_type, data } => Ok(oa::Part::File {
            file: oa::FileRef {
                file_data: Some(data_url(&media_type, &data)),
                file_id: None,
                filename: title,
            },
        }),
        an::Source::Text { data, .. } => {
            fit.drop_if(&title, "document_titles");
            Ok(oa::Part::Text { text: data })
        }
        an::Source::Url { .. } | an::Source::Other => Err(Untranslatable(
            "a document by URL or file id has no OpenAI Chat Completions equivalent".to_owned(),
        )),
    }
}

/// A tool result's content as a `tool` message's: text only (images are dropped), with the
/// error marker in front when the result is an error.
fn tool_result_content(
    content: Option<an::Content>,
    is_error: bool,
    fit: &mut Fitting,
) -> oa::Content {
    let mut parts = Vec::new();
    match content {
        None => {}
        Some(an::Content::Text(text)) => parts.push(oa::Part::Text { text }),
        Some(an::Content::Blocks(blocks)) => {
            for block in blocks {
                match block {
                    an::Block::Text {
                        text,
                        cache_control,
                        citations,
                    } => parts.push(text_part(text, &cache_control, &citations, fit)),
                    an::Block::Image { .. } => fit.drop("tool_result_images"),
                    other => drop_block(&other, fit),
                }
            }
        }
    }
    if is_error {
        match parts.first_mut() {
            Some(oa::Part::Text { text }) => *text = mark_error(text),
            _ => parts.insert(
                0,
                oa::Part::Text {
                    text: mark_error(""),
                },
            ),
        }
    }
    if parts.is_empty() {
        return oa::Content::Text(String::new());
    }
    collapse(parts)
}

/// An assistant turn: text blocks become the content, tool_use blocks the tool calls (after the
/// text: OpenAI has no interleaving).
fn assistant_message(content: an::Content, out: &mut Vec<oa::Message>, fit: &mut Fitting) {
    let blocks = match content {
        an::Content::Text(text) => {
            out.push(oa::Message::Assistant {
                content: Some(oa::Content::Text(text)),
                tool_calls: None,
                refusal: None,
                name: None,
            });
            return;
        }
        an::Content::Blocks(blocks) => blocks,
    };
    let mut parts = Vec::new();
    let mut calls = Vec::new();
    for block in blocks {
        match block {
            an::Block::Text {
                text,
                cache_control,
                citations,
            } => parts.push(text_part(text, &cache_control, &citations, fit)),
            an::Block::ToolUse {
                id,
                name,
                input,
                cache_control,
            } => {
                fit.drop_if(&cache_control, "cache_control");
                calls.push(tool_call(id, name, &input));
            }
            other => drop_block(&other, fit),
        }
    }
    if parts.is_empty() && calls.is_empty() {
        fit.drop("empty_messages");
        return;
    }
    out.push(oa::Message::Assistant {
        content: (!parts.is_empty()).then(|| collapse(parts)),
        tool_calls: (!calls.is_empty()).then_some(calls),
        refusal: None,
        name: None,
    });
}

fn tool_call(id: String, name: String, input: &Value) -> oa::ToolCall {
    let arguments = if input.is_null() {
        "{}".to_owned()
    } else {
        input.to_string()
    };
    oa::ToolCall {
        id,
        kind: oa::function_kind(),
        function: Some(oa::FunctionCall { name, arguments }),
    }
}
