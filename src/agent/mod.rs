//! `legate agent`: a thin, headless agent loop that talks only to legate, over HTTP, with no
//! keys and no retries of its own (SPEC §9). This module holds the command line and the start
//! of a run (fresh or resumed); the loop, tools, hooks and transcript live in the submodules.
//!
//! Environment: `LEGATE_URL` (when `--url` is not given) and `LEGATE_AGENT_KEY` (the key sent
//! to legate, `legate-agent` by default; legate ignores it unless `[[clients]]` is set). They
//! are read here, in [`run`], and nowhere else. `secrets` reads the whole environment for
//! another end: the credentials in it (those two among them) are kept from commands the model
//! runs, and from what the model is shown.

#[path = "loop.rs"]
mod agent_loop;
mod cancel;
mod client;
mod conversation;
mod dispatch;
mod hooks;
mod reply;
mod resume;
mod secrets;
mod shown;
mod tools;
mod transcript;
mod wire;
mod workspace;

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

pub use hooks::Approve;

use agent_loop::{Agent, Limits, Outcome};
use cancel::Cancel;
use client::{Client, ClientError};
use conversation::Conversation;
use hooks::{HookChain, TtyPrompter};
use resume::Rebuilt;
use tools::ToolContext;
use transcript::{Record, TranscriptError, Writer};
use wire::StopReason;
use workspace::Workspace;

/// Where legate listens when neither `--url` nor `LEGATE_URL` says otherwise.
pub const DEFAULT_URL: &str = "http://127.0.0.1:8787";
pub const DEFAULT_MODEL: &str = "claude-sonnet-4-5";
/// Sent as `x-api-key` unless `LEGATE_AGENT_KEY` is set.
pub const DEFAULT_KEY: &str = "legate-agent";

/// Exit code for a run that could not start or failed outside SPEC §9's list (an unreadable
/// task file or transcript, a refusal).
pub const EXIT_FAILED: i32 = 1;
/// Exit code for a command line that cannot work (sysexits EX_USAGE), from the parser or from
/// the checks it cannot express (no task at all, --transcript beside --resume). Apart from
/// SPEC §9's codes, so a script tells a mistyped option from a run that hit a limit.
pub const EXIT_USAGE: i32 = 64;

/// `legate agent [TASK] [options]`.
#[derive(Debug, Clone, clap::Args)]
pub struct AgentArgs {
    /// The task for the agent.
    #[arg(value_name = "TASK", conflicts_with = "task_file")]
    pub task: Option<String>,
    /// Read the task from a file.
    #[arg(long, value_name = "FILE")]
    pub task_file: Option<PathBuf>,
    /// The directory the agent may read and write [default: the current directory, or the
    /// resumed transcript's].
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// Model name sent to legate (an alias from legate's [[models]] works) [default:
    /// claude-sonnet-4-5, or the resumed transcript's].
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,
    /// Stop with exit 2 before a turn beyond this many.
    #[arg(long, value_name = "N", default_value_t = 50)]
    pub max_turns: u32,
    /// Stop with exit 3 once input+output tokens reach this; 0 means no limit.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub budget_tokens: u64,
    /// Approval of write and run tools.
    #[arg(long, value_enum, default_value_t = Approve::Auto)]
    pub approve: Approve,
    /// Write a JSONL transcript to this (new) file.
    #[arg(long, value_name = "FILE")]
    pub transcript: Option<PathBuf>,
    /// Continue the run recorded in this transcript, appending to it. A TASK given too is
    /// sent as a follow-up.
    #[arg(long, value_name = "FILE")]
    pub resume: Option<PathBuf>,
    /// legate's data-plane URL [default: $LEGATE_URL, else http://127.0.0.1:8787].
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,
}

/// Runs `legate agent` and returns its exit code (SPEC §9: 0 finished, 2 max turns, 3 budget,
/// 4 truncated reply, 5 upstream error, 130 cancelled by Ctrl-C, 143 by SIGTERM, 129 by SIGHUP;
/// 1 anything else).
pub async fn run(args: AgentArgs) -> i32 {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let (handle, cancel) = cancel::new();
    cancel::on_signals(handle);
    match start(args, &env, cancel).await {
        Ok(Ended {
            outcome,
            turns,
            tokens,
        }) => {
            eprintln!(
                "{}",
                said(&format!("{outcome} ({turns} turns, {tokens} tokens)"))
            );
            outcome.exit_code()
        }
        Err(e) => {
            eprintln!("{}", said(&e.to_string()));
            e.exit_code()
        }
    }
}

/// The run's last line. An upstream error's text is the provider's (and may quote the model):
/// its keys are withheld and its control characters escaped, as in the `[tool]` lines, so
/// that it can neither leak a key into a CI log nor rewrite the terminal's line.
fn said(text: &str) -> String {
    format!(
        "legate agent: {}",
        shown::bounded(&secrets::redact(text), 2000)
    )
}

/// What keeps a run from starting.
#[derive(Debug)]
enum SetupError {
    Usage(&'static str),
    TaskFile { path: PathBuf, source: io::Error },
    Resume(TranscriptError),
    NothingToResume(PathBuf),
    Transcript { path: PathBuf, source: io::Error },
    Workspace { path: PathBuf, source: io::Error },
    Client(ClientError),
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SetupError::Usage(m) => f.write_str(m),
            SetupError::TaskFile { path, source } => {
                write!(f, "cannot read the task file {}: {source}", path.display())
            }
            SetupError::Resume(e) => write!(f, "cannot resume: {e}"),
            SetupError::NothingToResume(path) => write!(
                f,
                "cannot resume: {} holds no conversation; start a new run instead",
                path.display()
            ),
            SetupError::Transcript { path, source } => {
                write!(f, "cannot open the transcript {}: {source}", path.display())
            }
            SetupError::Workspace { path, source } => {
                write!(f, "bad workspace {}: {source}", path.display())
            }
            SetupError::Client(e) => write!(f, "{e}"),
        }
    }
}

impl SetupError {
    fn exit_code(&self) -> i32 {
        match self {
            SetupError::Usage(_) => EXIT_USAGE,
            SetupError::TaskFile { .. }
            | SetupError::Resume(_)
            | SetupError::NothingToResume(_)
            | SetupError::Transcript { .. }
            | SetupError::Workspace { .. }
            | SetupError::Client(_) => EXIT_FAILED,
        }
    }
}

/// How a run that started ended, and what it took.
struct Ended {
    outcome: Outcome,
    turns: u32,
    tokens: u64,
}

/// A transcript being resumed.
struct Resuming {
    path: PathBuf,
    loaded: transcript::Loaded,
    rebuilt: Rebuilt,
}

async fn start(
    args: AgentArgs,
    env: &dyn Fn(&str) -> Option<String>,
    cancel: Cancel,
) -> Result<Ended, SetupError> {
    let task = read_task(&args)?;
    let resuming = load_resume(&args)?;
    match &resuming {
        None if task.is_none() => {
            return Err(SetupError::Usage(
                "give a TASK, --task-file FILE or --resume FILE (see legate agent --help)",
            ));
        }
        // An empty file, or one a run left before its first message: nothing to send.
        Some(r) if r.rebuilt.conversation.messages().is_empty() && task.is_none() => {
            return Err(SetupError::NothingToResume(r.path.clone()));
        }
        _ => {}
    }
    let mut agent = build_agent(&args, resuming.as_ref(), env, cancel)?;
    let outcome = match resuming {
        Some(resuming) => continue_run(&mut agent, resuming.rebuilt, task).await,
        None => fresh_run(&mut agent, task.unwrap_or_default()).await,
    };
    Ok(Ended {
        outcome,
        turns: agent.turns,
        tokens: agent.used_tokens,
    })
}

fn load_resume(args: &AgentArgs) -> Result<Option<Resuming>, SetupError> {
    let Some(path) = &args.resume else {
        return Ok(None);
    };
    if args.transcript.as_ref().is_some_and(|t| t != path) {
        return Err(SetupError::Usage(
            "--resume appends to the transcript it continues; drop --transcript",
        ));
    }
    let loaded = transcript::load(path).map_err(SetupError::Resume)?;
    let rebuilt = resume::rebuild(&loaded.records);
    Ok(Some(Resuming {
        path: path.clone(),
        loaded,
        rebuilt,
    }))
}

/// The agent for this run. Workspace and model come from the command line, else from the
/// transcript being resumed, else the defaults; the URL from `--url`, else `LEGATE_URL`.
fn build_agent(
    args: &AgentArgs,
    resuming: Option<&Resuming>,
    env: &dyn Fn(&str) -> Option<String>,
    cancel: Cancel,
) -> Result<Agent, SetupError> {
    let recorded = resuming.map(|r| &r.rebuilt);
    let workspace_dir = args
        .workspace
        .clone()
        .or_else(|| {
            recorded
                .and_then(|r| r.workspace.as_ref())
                .map(PathBuf::from)
        })
        .unwrap_or_else(|| PathBuf::from("."));
    let mut workspace =
        Workspace::open(&workspace_dir).map_err(|source| SetupError::Workspace {
            path: workspace_dir.clone(),
            source,
        })?;
    let model = args
        .model
        .clone()
        .or_else(|| recorded.and_then(|r| r.model.clone()))
        .unwrap_or_else(|| DEFAULT_MODEL.to_owned());
    let url = args
        .url
        .clone()
        .or_else(|| env("LEGATE_URL"))
        .unwrap_or_else(|| DEFAULT_URL.to_owned());
    let key = env("LEGATE_AGENT_KEY").unwrap_or_else(|| DEFAULT_KEY.to_owned());
    let client = Client::new(&url, &key).map_err(SetupError::Client)?;
    let transcript = open_writer(args, resuming)?;
    let transcript_path = resuming.map(|r| &r.path).or(args.transcript.as_ref());
    if let Some(path) = transcript_path {
        workspace
            .protect_transcript(path)
            .map_err(|source| SetupError::Transcript {
                path: path.clone(),
                source,
            })?;
    }
    Ok(Agent {
        client,
        system: agent_loop::system_prompt(workspace.root(), args.approve),
        model,
        conversation: Conversation::default(),
        hooks: HookChain::new(workspace.clone(), args.approve, Arc::new(TtyPrompter)),
        tools: ToolContext { workspace, cancel },
        transcript,
        limits: Limits {
            max_turns: args.max_turns,
            budget_tokens: args.budget_tokens,
        },
        turns: 0,
        used_tokens: 0,
    })
}

fn read_task(args: &AgentArgs) -> Result<Option<String>, SetupError> {
    match (&args.task, &args.task_file) {
        (Some(task), _) => Ok(Some(task.clone())),
        (None, Some(path)) => {
            std::fs::read_to_string(path)
                .map(Some)
                .map_err(|source| SetupError::TaskFile {
                    path: path.clone(),
                    source,
                })
        }
        (None, None) => Ok(None),
    }
    .map(|t| t.filter(|t| !t.trim().is_empty()))
}

fn open_writer(args: &AgentArgs, resuming: Option<&Resuming>) -> Result<Writer, SetupError> {
    let opened = match (resuming, &args.transcript) {
        (Some(r), _) => Writer::resume(&r.path, &r.loaded).map_err(|e| (r.path.clone(), e)),
        (None, Some(path)) => Writer::create(path).map_err(|e| (path.clone(), e)),
        (None, None) => Ok(Writer::none()),
    };
    opened.map_err(|(path, source)| SetupError::Transcript { path, source })
}

async fn fresh_run(agent: &mut Agent, task: String) -> Outcome {
    let content = agent_loop::task_message(&task);
    let records = [
        Record::Task {
            task,
            model: agent.model.clone(),
            workspace: agent.tools.workspace.root().display().to_string(),
            started_at: transcript::now(),
        },
        Record::User {
            content: content.clone(),
        },
    ];
    for record in &records {
        if let Err(e) = agent.transcript.write(record) {
            return Outcome::Transcript(e);
        }
    }
    agent.conversation.push_user(content);
    agent.run().await
}

async fn continue_run(agent: &mut Agent, rebuilt: Rebuilt, follow_up: Option<String>) -> Outcome {
    let record = Record::Resume {
        model: agent.model.clone(),
        workspace: agent.tools.workspace.root().display().to_string(),
        started_at: transcript::now(),
    };
    if let Err(e) = agent.transcript.write(&record) {
        return Outcome::Transcript(e);
    }
    agent.conversation = rebuilt.conversation;
    if let Some(open) = &rebuilt.open_turn
        && let Err(stop) = agent.close_open_turn(open).await
    {
        return stop;
    }
    if let Some(task) = follow_up {
        let content = agent_loop::task_message(&task);
        if let Err(e) = agent.transcript.write(&Record::User {
            content: content.clone(),
        }) {
            return Outcome::Transcript(e);
        }
        agent.conversation.push_user(content);
    }
    if agent.conversation.awaits_reply() {
        return agent.run().await;
    }
    match stopped_at(rebuilt.last_stop) {
        Ok(()) => agent.run().await,
        Err(outcome) => {
            let how = match outcome {
                Outcome::Finished => "had finished",
                _ => "had stopped without finishing",
            };
            eprintln!("legate agent: the transcript's run {how}; give a TASK to go on");
            outcome
        }
    }
}

/// What a transcript ending with a reply (and no call to answer) leaves to do: `Ok` to send
/// the conversation again, or the outcome the recorded run ended with, so a resumed run
/// without new input reports what the original one did (a cut-off reply is still 4, a
/// refusal still 1) instead of a success.
fn stopped_at(last_stop: Option<StopReason>) -> Result<(), Outcome> {
    match last_stop {
        // The model paused in the middle of its work: resend, as the live loop does.
        Some(StopReason::PauseTurn) => Ok(()),
        None | Some(StopReason::EndTurn | StopReason::StopSequence | StopReason::ToolUse) => {
            Err(Outcome::Finished)
        }
        Some(reason @ (StopReason::MaxTokens | StopReason::ContextWindowExceeded)) => {
            Err(Outcome::Truncated(reason))
        }
        Some(StopReason::Refusal) => Err(Outcome::Refused),
        Some(StopReason::Other(s)) => Err(Outcome::UnknownStop(s)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: AgentArgs,
    }

    fn parse(argv: &[&str]) -> Result<AgentArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("agent").chain(argv.iter().copied())).map(|c| c.args)
    }

    /// An upstream error's text reaches the last line with its keys withheld and its control
    /// characters escaped: it cannot pass for another line on a terminal.
    #[test]
    fn the_last_line_holds_no_key_and_no_control_character() {
        let line = said(
            "upstream error (HTTP 400 invalid_request_error): \x1b[2K\r legate agent: finished \
             (3 turns) key sk-ant-api03-abcdefghijklmnop_QRSTUV",
        );
        assert!(!line.contains('\x1b') && !line.contains('\r'), "{line}");
        assert!(!line.contains("abcdefghijklmnop"), "{line}");
        assert!(line.starts_with("legate agent: upstream error"), "{line}");
        assert!(said(&"x".repeat(5000)).len() < 2100);
    }

    #[test]
    fn defaults_follow_the_spec() -> Result<(), clap::Error> {
        let args = parse(&["do it"])?;
        assert_eq!(args.task.as_deref(), Some("do it"));
        assert_eq!(args.max_turns, 50);
        assert_eq!(args.budget_tokens, 0);
        assert_eq!(args.approve, Approve::Auto);
        assert!(args.model.is_none() && args.url.is_none() && args.transcript.is_none());
        let all = parse(&[
            "--task-file",
            "t.md",
            "--workspace",
            "w",
            "--model",
            "m",
            "--max-turns",
            "3",
            "--budget-tokens",
            "9",
            "--approve",
            "readonly",
            "--transcript",
            "t.jsonl",
            "--resume",
            "r.jsonl",
            "--url",
            "http://127.0.0.1:1",
        ])?;
        assert_eq!(all.approve, Approve::Readonly);
        assert_eq!(all.max_turns, 3);
        assert!(parse(&["task", "--task-file", "t.md"]).is_err());
        assert!(parse(&["--approve", "sometimes"]).is_err());
        Ok(())
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[tokio::test]
    async fn a_run_needs_a_task_or_a_transcript() -> Result<(), clap::Error> {
        let result = start(parse(&[])?, &no_env, Cancel::never()).await;
        assert!(matches!(&result, Err(e @ SetupError::Usage(_)) if e.exit_code() == 64));
        let blank = start(parse(&["  "])?, &no_env, Cancel::never()).await;
        assert!(matches!(blank, Err(SetupError::Usage(_))));
        Ok(())
    }

    #[tokio::test]
    async fn setup_failures_are_reported_before_any_request()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let ws = dir.path().display().to_string();
        let missing_file = parse(&["--task-file", "/nonexistent/task.md"])?;
        assert!(matches!(
            start(missing_file, &no_env, Cancel::never()).await,
            Err(SetupError::TaskFile { .. })
        ));
        let bad_ws = parse(&["t", "--workspace", "/nonexistent/ws"])?;
        assert!(matches!(
            start(bad_ws, &no_env, Cancel::never()).await,
            Err(SetupError::Workspace { .. })
        ));
        let https = |_: &str| Some("https://example.com".to_owned());
        let bad_url = parse(&["t", "--workspace", &ws])?;
        assert!(matches!(
            start(bad_url, &https, Cancel::never()).await,
            Err(SetupError::Client(_))
        ));
        let existing = dir.path().join("t.jsonl");
        std::fs::write(&existing, "{}\n")?;
        let clobber = parse(&[
            "t",
            "--workspace",
            &ws,
            "--transcript",
            &existing.display().to_string(),
        ])?;
        assert!(matches!(
            start(clobber, &no_env, Cancel::never()).await,
            Err(SetupError::Transcript { .. })
        ));
        Ok(())
    }

    #[tokio::test]
    async fn a_connection_failure_is_an_upstream_error() -> Result<(), Box<dyn std::error::Error>> {
        // A port that was just free: bound, then released.
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let dir = tempfile::tempdir()?;
        let ws = dir.path().display().to_string();
        let url = format!("http://127.0.0.1:{port}");
        let args = parse(&["t", "--workspace", &ws, "--url", &url])?;
        let outcome = start(args, &no_env, Cancel::never()).await;
        match outcome {
            Ok(ended) => assert_eq!(ended.outcome.exit_code(), 5, "{}", ended.outcome),
            Err(e) => panic!("setup failed: {e}"),
        }
        Ok(())
    }
}
