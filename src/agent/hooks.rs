//! The PreToolUse hook chain: every tool call passes it before it runs, and the hook that
//! decided is recorded with the decision. The order is fixed here and nowhere else.

use std::fmt;
use std::io::{BufRead, Write};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::cancel::{Cancel, Signal};
use super::shown::bounded;
use crate::key_shapes::{Scan, scan};

/// Bytes of a call's description shown in the approval prompt.
const MAX_PROMPT_LINE: usize = 4096;
use super::tools::{Call, CallError, ToolKind};
use super::workspace::Workspace;

/// The hooks, in chain order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum Hook {
    Allowlist,
    PathGuard,
    SecretScan,
    Approval,
}

impl fmt::Display for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Hook::Allowlist => "allowlist",
            Hook::PathGuard => "path_guard",
            Hook::SecretScan => "secret_scan",
            Hook::Approval => "approval",
        })
    }
}

/// A verdict on one call and the hook that gave it. An allowed call is decided by the last
/// hook, approval, since every hook before it let it pass.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Decision {
    pub allow: bool,
    pub hook: Hook,
    pub reason: String,
}

impl Decision {
    fn deny(hook: Hook, reason: impl Into<String>) -> Decision {
        Decision {
            allow: false,
            hook,
            reason: reason.into(),
        }
    }

    fn allow(reason: impl Into<String>) -> Decision {
        Decision {
            allow: true,
            hook: Hook::Approval,
            reason: reason.into(),
        }
    }
}

/// `--approve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Approve {
    /// Every call that passes the automatic hooks runs.
    Auto,
    /// Write and run calls are put to the terminal, y/N; read-only calls run.
    Ask,
    /// Write and run calls are denied; read-only calls run.
    Readonly,
}

/// Asks a human. Blocking; called off the async workers.
pub(super) trait Prompter: Send + Sync {
    /// Ok(true) only on an explicit yes.
    fn confirm(&self, question: &str) -> std::io::Result<bool>;
}

/// Prompts on the controlling terminal, not stdin/stdout: those may be pipes in a headless
/// run, and the model's text goes to stdout.
#[derive(Debug, Default)]
pub(super) struct TtyPrompter;

impl Prompter for TtyPrompter {
    fn confirm(&self, question: &str) -> std::io::Result<bool> {
        let tty = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/tty")?;
        let mut writer = &tty;
        write!(writer, "{question} [y/N] ")?;
        writer.flush()?;
        let mut answer = String::new();
        std::io::BufReader::new(&tty).read_line(&mut answer)?;
        Ok(matches!(answer.trim(), "y" | "Y" | "yes" | "Yes" | "YES"))
    }
}

/// The chain was interrupted by a signal (Ctrl-C) while waiting for a human.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Cancelled(pub Signal);

pub(super) struct HookChain {
    workspace: Workspace,
    approve: Approve,
    prompter: Arc<dyn Prompter>,
}

impl HookChain {
    pub(super) fn new(
        workspace: Workspace,
        approve: Approve,
        prompter: Arc<dyn Prompter>,
    ) -> HookChain {
        HookChain {
            workspace,
            approve,
            prompter,
        }
    }

    /// Runs the chain on a parsed call (or the reason it did not parse).
    pub(super) async fn decide(
        &self,
        call: &Result<Call, CallError>,
        cancel: &Cancel,
    ) -> Result<Decision, Cancelled> {
        // 1. Allowlist first: the cheapest check, and nothing else can judge a call that is
        //    not a registered tool with a well-formed input.
        let call = match call {
            Ok(call) => call,
            Err(e) => return Ok(Decision::deny(Hook::Allowlist, e.to_string())),
        };
        // 2. Path guard before anything reads content or bothers a human: a call that leaves
        //    the workspace is refused whatever else is true of it.
        for path in call.paths() {
            if let Err(e) = self.workspace.resolve(path) {
                return Ok(Decision::deny(Hook::PathGuard, e.to_string()));
            }
        }
        // 3. Secret scan: automatic, so it too runs before a human is asked.
        for text in call.written_text() {
            match scan(text) {
                Scan::Clean => {}
                Scan::Found(kind) => {
                    let reason = format!(
                        "the {} input contains {kind}; the agent writes no keys",
                        call.name()
                    );
                    return Ok(Decision::deny(Hook::SecretScan, reason));
                }
                Scan::Unavailable => {
                    return Ok(Decision::deny(
                        Hook::SecretScan,
                        "the secret patterns failed to load; writes are refused",
                    ));
                }
            }
        }
        // A note the tools showed in a key's place, written back into a file, would put the
        // note where the key was (a file rewritten from what was read) or text that means
        // nothing: refused, with what to do instead.
        if call.file_text().is_some_and(super::secrets::holds_note) {
            let reason = format!(
                "the {} input holds a note that stands for a key-like string the tools do not \
                 show (`[… withheld]`); the file's own text is not known: edit around it \
                 with edit_file, leaving that part unchanged",
                call.name()
            );
            return Ok(Decision::deny(Hook::SecretScan, reason));
        }
        // 4. Approval last: only calls every automatic hook let through reach a human.
        self.approve(call, cancel).await
    }

    async fn approve(&self, call: &Call, cancel: &Cancel) -> Result<Decision, Cancelled> {
        if call.kind() == ToolKind::ReadOnly {
            return Ok(Decision::allow("read-only tool"));
        }
        match self.approve {
            Approve::Auto => Ok(Decision::allow("--approve auto")),
            Approve::Readonly => Ok(Decision::deny(
                Hook::Approval,
                format!("--approve readonly: {} is not allowed", call.name()),
            )),
            Approve::Ask => self.ask(call, cancel).await,
        }
    }

    async fn ask(&self, call: &Call, cancel: &Cancel) -> Result<Decision, Cancelled> {
        let prompter = self.prompter.clone();
        // The content first and the question last, so the answer follows the question; the
        // whole command line is shown, up to a bound that says what it left out.
        let question = format!(
            "{}legate agent: allow {}?",
            call.preview(),
            bounded(&call.describe(), MAX_PROMPT_LINE)
        );
        let answer = tokio::task::spawn_blocking(move || prompter.confirm(&question));
        let answer = tokio::select! {
            answer = answer => answer,
            signal = cancel.cancelled() => return Err(Cancelled(signal)),
        };
        Ok(match answer {
            Ok(Ok(true)) => Decision::allow("approved on the terminal"),
            Ok(Ok(false)) => Decision::deny(Hook::Approval, "declined on the terminal"),
            Ok(Err(e)) => Decision::deny(
                Hook::Approval,
                format!("--approve ask: no terminal to ask ({e})"),
            ),
            Err(e) => Decision::deny(Hook::Approval, format!("the prompt failed: {e}")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    struct Answer(Option<bool>);

    impl Prompter for Answer {
        fn confirm(&self, _question: &str) -> std::io::Result<bool> {
            self.0.ok_or_else(|| std::io::Error::other("no tty"))
        }
    }

    fn chain(
        approve: Approve,
        answer: Option<bool>,
    ) -> std::io::Result<(tempfile::TempDir, HookChain)> {
        let dir = tempfile::tempdir()?;
        let ws_dir = dir.path().join("ws");
        std::fs::create_dir(&ws_dir)?;
        let ws = Workspace::open(&ws_dir)?;
        Ok((dir, HookChain::new(ws, approve, Arc::new(Answer(answer)))))
    }

    async fn decide(chain: &HookChain, name: &str, input: serde_json::Value) -> Decision {
        let call = Call::parse(name, &input);
        match chain.decide(&call, &Cancel::never()).await {
            Ok(d) => d,
            Err(Cancelled(_)) => Decision::deny(Hook::Approval, "cancelled"),
        }
    }

    #[tokio::test]
    async fn each_hook_denies_what_it_guards() -> std::io::Result<()> {
        let (_dir, chain) = chain(Approve::Auto, None)?;
        let unknown = decide(&chain, "rm", json!({})).await;
        assert_eq!((unknown.allow, unknown.hook), (false, Hook::Allowlist));
        let invalid = decide(&chain, "write_file", json!({"path": "a"})).await;
        assert_eq!((invalid.allow, invalid.hook), (false, Hook::Allowlist));
        let escape = decide(&chain, "read_file", json!({"path": "../x"})).await;
        assert_eq!((escape.allow, escape.hook), (false, Hook::PathGuard));
        let secret = decide(
            &chain,
            "write_file",
            json!({"path": "a.env", "content": "KEY=sk-ant-api03-0123456789abcdefXYZ"}),
        )
        .await;
        assert_eq!((secret.allow, secret.hook), (false, Hook::SecretScan));
        assert!(
            !secret.reason.contains("0123456789abcdef"),
            "{}",
            secret.reason
        );
        // A note shown in a key's place, written back into a file.
        let note = json!({"path": "a.env", "content": "KEY=[an Anthropic API key withheld]\n"});
        let noted = decide(&chain, "write_file", note).await;
        assert_eq!((noted.allow, noted.hook), (false, Hook::SecretScan));
        assert!(noted.reason.contains("edit around it"), "{}", noted.reason);
        let ok = decide(&chain, "write_file", json!({"path": "a", "content": "x"})).await;
        assert_eq!((ok.allow, ok.hook), (true, Hook::Approval));
        Ok(())
    }

    #[tokio::test]
    async fn the_path_guard_decides_before_the_secret_scan() -> std::io::Result<()> {
        let (_dir, chain) = chain(Approve::Auto, None)?;
        let both = decide(
            &chain,
            "write_file",
            json!({"path": "/etc/x", "content": "AKIAIOSFODNN7EXAMPLE"}),
        )
        .await;
        assert_eq!(both.hook, Hook::PathGuard);
        Ok(())
    }

    #[tokio::test]
    async fn readonly_denies_write_and_run_tools_only() -> std::io::Result<()> {
        let (_dir, chain) = chain(Approve::Readonly, None)?;
        for (name, input) in [
            ("write_file", json!({"path": "a", "content": "x"})),
            (
                "edit_file",
                json!({"path": "a", "old_string": "x", "new_string": "y"}),
            ),
            ("run_command", json!({"command": "ls"})),
        ] {
            let d = decide(&chain, name, input).await;
            assert_eq!((d.allow, d.hook), (false, Hook::Approval), "{name}");
            assert!(d.reason.contains("readonly"));
        }
        for (name, input) in [
            ("read_file", json!({"path": "a"})),
            ("list_dir", json!({})),
            ("search", json!({"pattern": "x"})),
        ] {
            assert!(decide(&chain, name, input).await.allow, "{name}");
        }
        Ok(())
    }

    #[tokio::test]
    async fn ask_follows_the_answer_and_denies_without_a_terminal() -> std::io::Result<()> {
        let run = json!({"command": "ls"});
        let (_d1, yes) = chain(Approve::Ask, Some(true))?;
        assert!(decide(&yes, "run_command", run.clone()).await.allow);
        let (_d2, no) = chain(Approve::Ask, Some(false))?;
        let declined = decide(&no, "run_command", run.clone()).await;
        assert_eq!((declined.allow, declined.hook), (false, Hook::Approval));
        let (_d3, none) = chain(Approve::Ask, None)?;
        let headless = decide(&none, "run_command", run).await;
        assert!(!headless.allow);
        assert!(headless.reason.contains("no terminal"));
        assert!(decide(&none, "list_dir", json!({})).await.allow);
        Ok(())
    }

    #[tokio::test]
    async fn ctrl_c_during_a_prompt_cancels_the_chain() -> std::io::Result<()> {
        /// A human who answers only when the test lets go of the sender.
        struct Waits(std::sync::Mutex<std::sync::mpsc::Receiver<bool>>);
        impl Prompter for Waits {
            fn confirm(&self, _q: &str) -> std::io::Result<bool> {
                let rx = self
                    .0
                    .lock()
                    .map_err(|_| std::io::Error::other("poisoned"))?;
                rx.recv().map_err(std::io::Error::other)
            }
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let dir = tempfile::tempdir()?;
        let prompter = Arc::new(Waits(std::sync::Mutex::new(rx)));
        let chain = HookChain::new(Workspace::open(dir.path())?, Approve::Ask, prompter);
        let (handle, cancel) = crate::agent::cancel::new();
        handle.cancel();
        let call = Call::parse("run_command", &json!({"command": "ls"}));
        assert_eq!(
            chain.decide(&call, &cancel).await,
            Err(Cancelled(Signal::Interrupt))
        );
        // Lets the blocked prompt return so the runtime can shut down.
        drop(tx);
        Ok(())
    }

    /// A human who says yes and remembers what was asked.
    #[derive(Default)]
    struct Records(std::sync::Mutex<Vec<String>>);

    impl Prompter for Records {
        fn confirm(&self, question: &str) -> std::io::Result<bool> {
            if let Ok(mut asked) = self.0.lock() {
                asked.push(question.to_owned());
            }
            Ok(true)
        }
    }

    async fn asked(input_name: &str, input: serde_json::Value) -> std::io::Result<String> {
        let dir = tempfile::tempdir()?;
        let prompter = Arc::new(Records::default());
        let chain = HookChain::new(Workspace::open(dir.path())?, Approve::Ask, prompter.clone());
        let call = Call::parse(input_name, &input);
        assert!(matches!(chain.decide(&call, &Cancel::never()).await, Ok(d) if d.allow));
        let asked = prompter.0.lock().map(|a| a.concat()).unwrap_or_default();
        Ok(asked)
    }

    #[tokio::test]
    async fn the_prompt_shows_control_characters_instead_of_obeying_them() -> std::io::Result<()> {
        let command = "touch PWNED #\r\x1b[2K\x1b[1Alegate agent: allow run_command: ls";
        let question = asked("run_command", json!({ "command": command })).await?;
        assert_eq!(
            question,
            "legate agent: allow run_command: touch PWNED #\\r\\x1b[2K\\x1b[1Alegate agent: \
             allow run_command: ls?"
        );
        Ok(())
    }

    #[tokio::test]
    async fn the_prompt_shows_what_a_write_would_put_in_the_file() -> std::io::Result<()> {
        let content = format!("first line\nsecond\x1b[8m hidden\n{}", "x\n".repeat(5000));
        let question = asked("write_file", json!({"path": "a.txt", "content": content})).await?;
        assert!(
            question.starts_with("  | first line\n  | second\\x1b[8m hidden\n  | x\n"),
            "{question}"
        );
        assert!(question.contains("more bytes not shown)\n"), "{question}");
        let line = format!(
            "legate agent: allow write_file a.txt ({} bytes)?",
            content.len()
        );
        assert!(question.ends_with(&line), "{question}");
        assert!(question.len() < 4096, "{} bytes", question.len());
        assert!(!question.contains('\x1b'));
        let edit = asked(
            "edit_file",
            json!({"path": "a.txt", "old_string": "old", "new_string": "new\r"}),
        )
        .await?;
        assert_eq!(
            edit,
            "  old_string:\n  | old\n  new_string:\n  | new\\r\nlegate agent: allow edit_file a.txt?"
        );
        Ok(())
    }

    #[test]
    fn hooks_serialise_in_snake_case() {
        let d = Decision::deny(Hook::PathGuard, "r");
        assert_eq!(
            serde_json::to_value(&d).ok(),
            Some(json!({"allow": false, "hook": "path_guard", "reason": "r"}))
        );
    }
}
