//! `legate agent` end to end: `legate mock` scripted to play a model, behind `legate serve`,
//! and `legate agent` as a subprocess in a temporary workspace, all on 127.0.0.1 port 0.
//! The mock's request log shows what the agent sent back (tool results, conversation), the
//! workspace and the transcript show what it did.

#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test that cannot set itself up should fail loudly at that line"
)]

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const BIN: &str = env!("CARGO_BIN_EXE_legate");
/// Upper bound for any one step (a process starting, an agent run) before the test fails.
const BOUND: Duration = Duration::from_secs(60);

/// The mock and legate in front of it, with a scratch directory for everything else.
struct Stack {
    dir: tempfile::TempDir,
    _mock: Child,
    _serve: Child,
    mock_url: String,
    url: String,
}

/// Spawns the binary and returns it with the URL from its first stdout line.
async fn spawn_listening(args: &[&str]) -> (Child, String) {
    let mut child = Command::new(BIN)
        .args(args)
        .env_remove("LEGATE_CONFIG")
        .env_remove("RUST_LOG")
        .env("ANTHROPIC_API_KEY", "mock-key")
        .env("OPENAI_API_KEY", "mock-key")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(BOUND, lines.next_line())
        .await
        .expect("a listening line in time")
        .unwrap()
        .expect("a listening line");
    // Keep draining stdout so the child never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let url = line
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no URL in {line:?}"))
        .to_owned();
    (child, url)
}

async fn stack(script: Value) -> Stack {
    let dir = tempfile::tempdir().unwrap();
    let script_path = dir.path().join("script.json");
    std::fs::write(&script_path, script.to_string()).unwrap();
    let script_arg = script_path.display().to_string();
    let (mock, mock_url) =
        spawn_listening(&["mock", "--listen", "127.0.0.1:0", "--script", &script_arg]).await;
    let config = dir.path().join("legate.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[providers.anthropic]
kind = "anthropic"
base_url = "{mock_url}"
api_key_env = "ANTHROPIC_API_KEY"

[providers.openai]
kind = "openai"
base_url = "{mock_url}"
api_key_env = "OPENAI_API_KEY"
"#
        ),
    )
    .unwrap();
    let config_arg = config.display().to_string();
    let (serve, url) = spawn_listening(&["serve", "--config", &config_arg]).await;
    std::fs::create_dir(dir.path().join("ws")).unwrap();
    Stack {
        dir,
        _mock: mock,
        _serve: serve,
        mock_url,
        url,
    }
}

impl Stack {
    fn ws(&self) -> PathBuf {
        self.dir.path().join("ws")
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `legate agent` in the workspace, pointed at legate, with a clean environment.
    fn agent(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.arg("agent");
        self.agent_args(cmd, args)
    }

    /// [`Stack::agent`] started by `bash -c 'SETUP; exec legate agent …'`: the agent inherits
    /// what the shell set up (an ignored signal stays ignored through exec; dash's `trap ''`
    /// does not pass SIGCHLD on so, bash's does).
    fn agent_after(&self, setup: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new("bash");
        cmd.arg("-c")
            .arg(format!("{setup}; exec \"$0\" agent \"$@\""))
            .arg(BIN);
        self.agent_args(cmd, args)
    }

    fn agent_args(&self, mut cmd: Command, args: &[&str]) -> Command {
        cmd.args(args)
            .args(["--url", &self.url])
            .current_dir(self.ws())
            .env_remove("LEGATE_URL")
            .env_remove("LEGATE_AGENT_KEY")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd
    }

    async fn run(&self, args: &[&str]) -> Output {
        run(self.agent(args)).await
    }

    /// The `/v1/messages` request bodies the mock received, in order.
    async fn model_requests(&self) -> Vec<Value> {
        let url = format!("{}/_mock/requests", self.mock_url);
        let list: Vec<Value> = reqwest::get(url).await.unwrap().json().await.unwrap();
        list.into_iter()
            .filter(|r| r["path"] == "/v1/messages")
            .map(|r| serde_json::from_str(r["body"].as_str().unwrap()).unwrap())
            .collect()
    }

    async fn mock_inflight(&self) -> u64 {
        let url = format!("{}/_mock/stats", self.mock_url);
        let stats: Value = reqwest::get(url).await.unwrap().json().await.unwrap();
        stats["inflight"].as_u64().unwrap()
    }
}

async fn run(mut cmd: Command) -> Output {
    let child = cmd.spawn().unwrap();
    tokio::time::timeout(BOUND, child.wait_with_output())
        .await
        .expect("the agent finishes in time")
        .unwrap()
}

fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A scripted reply calling tools: (id, name, input) each.
fn tools_reply(calls: &[(&str, &str, Value)]) -> Value {
    let content: Vec<Value> = calls
        .iter()
        .map(
            |(id, name, input)| json!({"type": "tool_use", "id": id, "name": name, "input": input}),
        )
        .collect();
    json!({"content": content, "stop_reason": "tool_use"})
}

fn text_reply(text: &str) -> Value {
    json!({"content": [{"type": "text", "text": text}], "stop_reason": "end_turn"})
}

/// The tool_result blocks a request sent, from its last (user) message.
fn tool_results(request: &Value) -> Vec<Value> {
    let messages = request["messages"].as_array().unwrap();
    let last = messages.last().unwrap();
    assert_eq!(last["role"], "user");
    last["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "tool_result")
        .cloned()
        .collect()
}

fn transcript(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn write_read_edit_run_script() -> Value {
    json!({"replies": [
        {"content": [
            {"type": "text", "text": "I'll write the file first."},
            {"type": "tool_use", "id": "w1", "name": "write_file",
             "input": {"path": "notes/hello.txt", "content": "hello world\n"}}
        ], "stop_reason": "tool_use"},
        tools_reply(&[
            ("r1", "read_file", json!({"path": "notes/hello.txt"})),
            ("l1", "list_dir", json!({"path": "notes"})),
        ]),
        tools_reply(&[(
            "e1",
            "edit_file",
            json!({"path": "notes/hello.txt", "old_string": "world", "new_string": "legate"}),
        )]),
        tools_reply(&[(
            "c1",
            "run_command",
            json!({"command": "cp notes/hello.txt out.txt && wc -c < out.txt"}),
        )]),
        text_reply("All done: the note says hello to legate."),
    ]})
}

#[tokio::test]
async fn write_read_edit_run_task_finishes_with_the_files_as_expected() {
    let s = stack(write_read_edit_run_script()).await;
    let out = s.run(&["write a note, read it, edit it, copy it"]).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        std::fs::read_to_string(s.ws().join("notes/hello.txt")).unwrap(),
        "hello legate\n"
    );
    assert_eq!(
        std::fs::read_to_string(s.ws().join("out.txt")).unwrap(),
        "hello legate\n"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("I'll write the file first."), "{stdout}");
    assert!(stdout.contains("All done: the note says hello to legate."));

    let requests = s.model_requests().await;
    assert_eq!(requests.len(), 5);
    let first = &requests[0];
    assert_eq!(first["model"], "claude-sonnet-4-5");
    assert_eq!(first["stream"], true);
    assert_eq!(first["max_tokens"], 8192);
    assert_eq!(first["tools"].as_array().unwrap().len(), 6);
    assert_eq!(
        first["messages"],
        json!([{"role": "user", "content": [{"type": "text", "text": "write a note, read it, edit it, copy it"}]}])
    );
    let wrote = tool_results(&requests[1]);
    assert_eq!(wrote[0]["tool_use_id"], "w1");
    assert_eq!(wrote[0]["is_error"], false);
    let read = tool_results(&requests[2]);
    assert_eq!(read[0]["content"], "hello world\n");
    assert_eq!(read[1]["tool_use_id"], "l1");
    assert_eq!(read[1]["content"], "hello.txt (12 bytes)");
    assert_eq!(tool_results(&requests[3])[0]["is_error"], false);
    let ran = tool_results(&requests[4]);
    assert_eq!(ran[0]["is_error"], false);
    let ran_text = ran[0]["content"].as_str().unwrap();
    assert!(ran_text.starts_with("exit code: 0"), "{ran_text}");
    assert!(ran_text.contains("13"), "{ran_text}");
    // The assistant turns went back as they came, so the model keeps its context.
    assert_eq!(requests[4]["messages"].as_array().unwrap().len(), 9);
}

/// A parent may leave SIGCHLD ignored, and exec keeps it so: children are then reaped by the
/// kernel as they end, and a wait for one finds none. The agent still reports each command's
/// exit code.
#[tokio::test]
async fn a_command_still_reports_its_exit_code_when_the_agent_inherits_sigchld_ignored() {
    let s = stack(json!({"replies": [
        tools_reply(&[("c1", "run_command", json!({"command": "echo ran; exit 3"}))]),
        tools_reply(&[("c2", "run_command", json!({"command": "sleep 30", "timeout_secs": 1}))]),
        text_reply("done"),
    ]}))
    .await;
    let out = run(s.agent_after("trap '' CHLD", &["run two commands"])).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let requests = s.model_requests().await;
    assert_eq!(requests.len(), 3);
    let ran = tool_results(&requests[1]);
    assert_eq!(ran[0]["is_error"], false, "{}", ran[0]);
    assert_eq!(ran[0]["content"], "exit code: 3\n--- stdout ---\nran\n");
    let timed_out = tool_results(&requests[2]);
    assert_eq!(timed_out[0]["is_error"], true, "{}", timed_out[0]);
    let text = timed_out[0]["content"].as_str().unwrap_or_default();
    assert!(text.contains("timed out"), "{text}");
}

#[tokio::test]
async fn transcript_has_every_tool_use_followed_by_its_result_in_order() {
    let s = stack(write_read_edit_run_script()).await;
    let log = s.path("run.jsonl");
    let out = s
        .run(&["a task", "--transcript", log.to_str().unwrap()])
        .await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let records = transcript(&log);
    let shape: Vec<String> = records
        .iter()
        .map(|r| match r["type"].as_str().unwrap() {
            "tool_use" => format!("use:{}", r["id"].as_str().unwrap()),
            "tool_result" => format!("result:{}", r["tool_use_id"].as_str().unwrap()),
            "assistant" => format!("assistant:{}", r["stop_reason"].as_str().unwrap()),
            other => other.to_owned(),
        })
        .collect();
    assert_eq!(
        shape,
        [
            "task",
            "user",
            "assistant:tool_use",
            "use:w1",
            "result:w1",
            "assistant:tool_use",
            "use:r1",
            "result:r1",
            "use:l1",
            "result:l1",
            "assistant:tool_use",
            "use:e1",
            "result:e1",
            "assistant:tool_use",
            "use:c1",
            "result:c1",
            "assistant:end_turn",
        ]
    );
    for record in records.iter().filter(|r| r["type"] == "tool_use") {
        assert_eq!(record["decision"]["allow"], true, "{record}");
        assert_eq!(record["decision"]["hook"], "approval");
    }
    let task = &records[0];
    assert_eq!(task["task"], "a task");
    assert_eq!(task["model"], "claude-sonnet-4-5");
}

#[tokio::test]
async fn path_escapes_are_denied_and_nothing_is_written_outside() {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "outside secret").unwrap();
    let absolute = outside.path().join("abs.txt").display().to_string();
    let s = stack(json!({"replies": [
        tools_reply(&[
            ("p1", "write_file", json!({"path": "../escape.txt", "content": "x"})),
            ("p2", "write_file", json!({"path": absolute, "content": "x"})),
            ("p3", "write_file", json!({"path": "link/via-link.txt", "content": "x"})),
            ("p4", "read_file", json!({"path": "secret-link"})),
            ("p5", "edit_file", json!({"path": "secret-link", "old_string": "outside", "new_string": "inside"})),
            ("p6", "list_dir", json!({"path": "link"})),
        ]),
        text_reply("Could not leave the workspace."),
    ]}))
    .await;
    std::os::unix::fs::symlink(outside.path(), s.ws().join("link")).unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("secret.txt"),
        s.ws().join("secret-link"),
    )
    .unwrap();
    let out = s.run(&["try to escape"]).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));

    let results = tool_results(&s.model_requests().await[1]);
    assert_eq!(results.len(), 6);
    for result in &results {
        assert_eq!(result["is_error"], true, "{result}");
        let text = result["content"].as_str().unwrap();
        assert!(text.contains("denied by path_guard"), "{text}");
        assert!(text.contains("outside the workspace"), "{text}");
        assert!(!text.contains("outside secret"), "{text}");
    }
    let mut left: Vec<String> = std::fs::read_dir(outside.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["secret.txt"]);
    assert_eq!(
        std::fs::read_to_string(outside.path().join("secret.txt")).unwrap(),
        "outside secret"
    );
    assert!(!s.dir.path().join("escape.txt").exists());
}

#[tokio::test]
async fn the_transcript_in_the_workspace_is_off_limits_to_the_tools() {
    let s = stack(json!({"replies": [
        tools_reply(&[
            ("w1", "write_file", json!({"path": "fix.jsonl", "content": "{}\n"})),
            ("e1", "edit_file", json!({"path": "./fix.jsonl", "old_string": "task", "new_string": "x"})),
        ]),
        text_reply("Left the log alone."),
    ]}))
    .await;
    let out = s.run(&["fix it", "--transcript", "fix.jsonl"]).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let results = tool_results(&s.model_requests().await[1]);
    for result in &results {
        assert_eq!(result["is_error"], true, "{result}");
        let text = result["content"].as_str().unwrap();
        assert!(text.starts_with("denied by path_guard"), "{text}");
        assert!(text.contains("transcript"), "{text}");
    }
    let kinds: Vec<String> = transcript(&s.ws().join("fix.jsonl"))
        .iter()
        .map(|r| r["type"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        kinds,
        [
            "task",
            "user",
            "assistant",
            "tool_use",
            "tool_result",
            "tool_use",
            "tool_result",
            "assistant"
        ]
    );
}

#[tokio::test]
async fn a_reply_cut_at_max_tokens_inside_a_tool_use_exits_4_without_running_it() {
    let s = stack(json!({"replies": [
        {"content": [
            {"type": "text", "text": "Writing the big file now"},
            {"type": "tool_use", "id": "cut1", "name": "write_file",
             "input": {"path": "cut.txt", "content": "only the first half of"}}
        ], "stop_reason": "max_tokens"},
        text_reply("never requested"),
    ]}))
    .await;
    let log = s.path("run.jsonl");
    let out = s
        .run(&["write a big file", "--transcript", log.to_str().unwrap()])
        .await;
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    assert!(stderr(&out).contains("cut off"), "{}", stderr(&out));
    assert!(!s.ws().join("cut.txt").exists());
    assert_eq!(s.model_requests().await.len(), 1);
    let records = transcript(&log);
    assert!(records.iter().all(|r| r["type"] != "tool_use"));
    assert_eq!(records.last().unwrap()["stop_reason"], "max_tokens");
}

#[tokio::test]
async fn a_reply_whose_tool_calls_share_an_id_exits_5_without_running_any() {
    let s = stack(json!({"replies": [
        tools_reply(&[
            ("dup", "write_file", json!({"path": "a.txt", "content": "a"})),
            ("dup", "write_file", json!({"path": "b.txt", "content": "b"})),
        ]),
        text_reply("never requested"),
    ]}))
    .await;
    let out = s.run(&["write two files"]).await;
    assert_eq!(code(&out), 5, "{}", stderr(&out));
    assert!(stderr(&out).contains("share the id"), "{}", stderr(&out));
    assert!(!s.ws().join("a.txt").exists() && !s.ws().join("b.txt").exists());
    assert_eq!(s.model_requests().await.len(), 1);
}

#[tokio::test]
async fn the_turn_limit_exits_2() {
    let s = stack(json!({"default": {
        "content": [{"type": "tool_use", "name": "list_dir", "input": {}}],
        "stop_reason": "tool_use"
    }}))
    .await;
    let out = s.run(&["loop forever", "--max-turns", "3"]).await;
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert_eq!(s.model_requests().await.len(), 3);
}

#[tokio::test]
async fn the_token_budget_exits_3() {
    let s = stack(json!({"default": {
        "content": [{"type": "tool_use", "name": "list_dir", "input": {}}],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 100, "output_tokens": 50}
    }}))
    .await;
    let out = s.run(&["spend", "--budget-tokens", "400"]).await;
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    // 150 tokens a turn: 150, 300, 450 >= 400 stops before the fourth request.
    assert_eq!(s.model_requests().await.len(), 3);
    assert!(stderr(&out).contains("450"), "{}", stderr(&out));
}

#[tokio::test]
async fn readonly_denies_write_and_run_tools() {
    let s = stack(json!({"replies": [
        tools_reply(&[
            ("w", "write_file", json!({"path": "new.txt", "content": "x"})),
            ("e", "edit_file", json!({"path": "keep.txt", "old_string": "same", "new_string": "changed"})),
            ("c", "run_command", json!({"command": "touch ran.txt"})),
            ("r", "read_file", json!({"path": "keep.txt"})),
        ]),
        text_reply("Read only, understood."),
    ]}))
    .await;
    std::fs::write(s.ws().join("keep.txt"), "same").unwrap();
    let log = s.path("run.jsonl");
    let out = s
        .run(&[
            "look around",
            "--approve",
            "readonly",
            "--transcript",
            log.to_str().unwrap(),
        ])
        .await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(!s.ws().join("new.txt").exists());
    assert!(!s.ws().join("ran.txt").exists());
    assert_eq!(
        std::fs::read_to_string(s.ws().join("keep.txt")).unwrap(),
        "same"
    );
    let results = tool_results(&s.model_requests().await[1]);
    for denied in &results[..3] {
        assert_eq!(denied["is_error"], true);
        assert!(
            denied["content"]
                .as_str()
                .unwrap()
                .contains("--approve readonly")
        );
    }
    assert_eq!(results[3]["is_error"], false);
    assert_eq!(results[3]["content"], "same");
    let decisions: Vec<(Value, Value)> = transcript(&log)
        .into_iter()
        .filter(|r| r["type"] == "tool_use")
        .map(|r| {
            (
                r["decision"]["allow"].clone(),
                r["decision"]["hook"].clone(),
            )
        })
        .collect();
    assert_eq!(
        decisions,
        [
            (json!(false), json!("approval")),
            (json!(false), json!("approval")),
            (json!(false), json!("approval")),
            (json!(true), json!("approval")),
        ]
    );
}

#[tokio::test]
async fn secrets_unknown_tools_and_bad_inputs_become_error_results() {
    let s = stack(json!({"replies": [
        tools_reply(&[
            ("s", "write_file", json!({"path": ".env", "content": "ANTHROPIC_API_KEY=sk-ant-api03-AAAABBBBCCCCDDDDEEEE"})),
            ("u", "delete_everything", json!({})),
            ("i", "read_file", json!({"file": "a.txt"})),
        ]),
        text_reply("Noted."),
    ]}))
    .await;
    let log = s.path("run.jsonl");
    let out = s
        .run(&["misbehave", "--transcript", log.to_str().unwrap()])
        .await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(!s.ws().join(".env").exists());
    let results = tool_results(&s.model_requests().await[1]);
    let texts: Vec<&str> = results
        .iter()
        .map(|r| r["content"].as_str().unwrap())
        .collect();
    assert!(results.iter().all(|r| r["is_error"] == true));
    assert!(texts[0].contains("denied by secret_scan"), "{}", texts[0]);
    assert!(
        texts[1].contains("unknown tool `delete_everything`"),
        "{}",
        texts[1]
    );
    assert!(
        texts[2].contains("invalid input for read_file"),
        "{}",
        texts[2]
    );
    let hooks: Vec<Value> = transcript(&log)
        .into_iter()
        .filter(|r| r["type"] == "tool_use")
        .map(|r| r["decision"]["hook"].clone())
        .collect();
    assert_eq!(
        hooks,
        [json!("secret_scan"), json!("allowlist"), json!("allowlist")]
    );
}

#[tokio::test]
async fn pause_turn_sends_the_conversation_again() {
    let s = stack(json!({"replies": [
        {"content": [{"type": "text", "text": "Still working..."}], "stop_reason": "pause_turn"},
        text_reply("Done after the pause."),
    ]}))
    .await;
    let out = s.run(&["long task"]).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let requests = s.model_requests().await;
    assert_eq!(requests.len(), 2);
    assert_eq!(
        requests[1]["messages"][1],
        json!({"role": "assistant", "content": [{"type": "text", "text": "Still working..."}]})
    );
}

#[tokio::test]
async fn an_upstream_error_exits_5_with_the_error_on_stderr() {
    let s = stack(json!({"replies": [
        {"status": 400, "error_type": "invalid_request_error", "error_message": "prompt is too long"}
    ]}))
    .await;
    let out = s.run(&["anything"]).await;
    assert_eq!(code(&out), 5, "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("invalid_request_error"), "{err}");
    assert!(err.contains("prompt is too long"), "{err}");
}

#[tokio::test]
async fn usage_errors_exit_64_apart_from_the_turn_limit() {
    let ws = tempfile::tempdir().unwrap();
    let code_of = |args: &[&str]| {
        let mut cmd = Command::new(BIN);
        cmd.arg("agent")
            .args(args)
            .args(["--url", "http://127.0.0.1:9"])
            .current_dir(ws.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd
    };
    for args in [
        &["t", "--max-turns", "abc"][..],
        &["t", "--no-such-option"],
        &[],
        &["--resume", "a.jsonl", "--transcript", "b.jsonl"],
    ] {
        let out = run(code_of(args)).await;
        assert_eq!(code(&out), 64, "{args:?}: {}", stderr(&out));
    }
    let help = run(code_of(&["--help"])).await;
    assert_eq!(code(&help), 0, "{}", stderr(&help));
}

#[tokio::test]
async fn an_unreachable_legate_exits_5() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let ws = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args([
        "agent",
        "hello",
        "--url",
        &format!("http://127.0.0.1:{port}"),
    ])
    .current_dir(ws.path())
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .kill_on_drop(true);
    let out = run(cmd).await;
    assert_eq!(code(&out), 5, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("cannot reach legate"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test]
async fn ctrl_c_while_waiting_for_the_model_exits_130() {
    let s = stack(json!({"replies": [{"hang": true}]})).await;
    let child = s.agent(&["wait"]).spawn().unwrap();
    // Wait until the request has reached the mock, so the signal lands mid-turn.
    let deadline = tokio::time::Instant::now() + BOUND;
    while s.mock_inflight().await == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the request never arrived"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pid = child.id().unwrap().to_string();
    let sent = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap();
    assert!(sent.success());
    let out = tokio::time::timeout(BOUND, child.wait_with_output())
        .await
        .expect("the agent stops in time")
        .unwrap();
    assert_eq!(code(&out), 130, "{}", stderr(&out));
}

#[tokio::test]
async fn sigterm_kills_the_running_command_and_exits_143() {
    let s = stack(json!({"replies": [
        tools_reply(&[
            ("c1", "run_command", json!({"command": "exec 3> gate; echo up >&3; sleep 20; touch survived.txt"})),
            ("w2", "write_file", json!({"path": "after.txt", "content": "x"})),
        ]),
        text_reply("never requested"),
    ]}))
    .await;
    let gate = s.ws().join("gate");
    let made = std::process::Command::new("mkfifo")
        .arg(&gate)
        .status()
        .unwrap();
    assert!(made.success());
    let log = s.path("run.jsonl");
    let child = s
        .agent(&["run it", "--transcript", log.to_str().unwrap()])
        .spawn()
        .unwrap();
    // The command's whole group holds the FIFO open: its first line says it runs, the end of
    // the stream says every process of the group is gone.
    let (up_tx, up_rx) = tokio::sync::oneshot::channel();
    let closed = std::thread::spawn(move || {
        use std::io::BufRead;
        let mut reader = std::io::BufReader::new(std::fs::File::open(gate).unwrap());
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let _ = up_tx.send(line);
        let mut rest = Vec::new();
        std::io::Read::read_to_end(&mut reader, &mut rest).unwrap();
    });
    let up = tokio::time::timeout(BOUND, up_rx)
        .await
        .expect("the command starts in time")
        .unwrap();
    assert_eq!(up, "up\n");
    let pid = child.id().unwrap().to_string();
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(sent.success());
    let out = tokio::time::timeout(BOUND, child.wait_with_output())
        .await
        .expect("the agent stops in time")
        .unwrap();
    assert_eq!(code(&out), 143, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("cancelled (SIGTERM)"),
        "{}",
        stderr(&out)
    );
    // The call that never started is logged once, as what its result says.
    assert!(
        stderr(&out).contains("\n[tool] write_file: not run: the run was cancelled (SIGTERM)"),
        "{}",
        stderr(&out)
    );
    tokio::task::spawn_blocking(move || closed.join())
        .await
        .unwrap()
        .unwrap();
    assert!(
        !s.ws().join("survived.txt").exists(),
        "the command outlived the agent"
    );
    assert!(!s.ws().join("after.txt").exists());
    assert_eq!(s.model_requests().await.len(), 1);

    let records = transcript(&log);
    let tail: Vec<(String, String)> = records[records.len() - 3..]
        .iter()
        .map(|r| {
            (
                r["type"].as_str().unwrap().to_owned(),
                r["content"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    assert_eq!(tail[0].0, "tool_use");
    assert_eq!(tail[1].0, "tool_result");
    assert!(
        tail[1].1.starts_with("cancelled (SIGTERM) and killed"),
        "{}",
        tail[1].1
    );
    assert_eq!(tail[2].0, "tool_result");
    assert!(
        tail[2]
            .1
            .starts_with("not run: the run was cancelled (SIGTERM)"),
        "{}",
        tail[2].1
    );
}

#[tokio::test]
async fn reading_or_editing_a_fifo_is_an_error_result_not_a_hang() {
    let s = stack(json!({"replies": [
        tools_reply(&[
            ("r1", "read_file", json!({"path": "pipe"})),
            ("e1", "edit_file", json!({"path": "pipe", "old_string": "a", "new_string": "b"})),
            ("w1", "write_file", json!({"path": "pipe", "content": "x"})),
        ]),
        text_reply("A pipe, not a file."),
    ]}))
    .await;
    let made = std::process::Command::new("mkfifo")
        .arg(s.ws().join("pipe"))
        .status()
        .unwrap();
    assert!(made.success());
    let out = s.run(&["read the pipe"]).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let results = tool_results(&s.model_requests().await[1]);
    assert_eq!(results.len(), 3);
    for result in &results {
        assert_eq!(result["is_error"], true, "{result}");
        assert_eq!(
            result["content"],
            "pipe: is a FIFO, not a regular file; not opened"
        );
    }
}

/// A transcript of a run whose one reply stopped for `stop_reason`.
fn one_reply_transcript(path: &Path, ws: &Path, stop_reason: &str) {
    let records = [
        json!({"type": "task", "task": "t", "model": "claude-sonnet-4-5", "workspace": ws, "started_at": 0}),
        json!({"type": "user", "content": [{"type": "text", "text": "t"}]}),
        json!({"type": "assistant", "content": [{"type": "text", "text": "Working on it"}],
               "stop_reason": stop_reason, "usage": {"input_tokens": 1, "output_tokens": 1}}),
    ];
    let lines: Vec<String> = records.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(path, lines.concat()).unwrap();
}

#[tokio::test]
async fn resuming_an_unfinished_run_resends_or_reports_how_it_stopped() {
    let s = stack(json!({"replies": [text_reply("Carried on after the pause.")]})).await;
    let cases = [
        ("max_tokens", 4, "had stopped without finishing"),
        ("refusal", 1, "had stopped without finishing"),
        ("end_turn", 0, "had finished"),
    ];
    for (stop, exit, says) in cases {
        let log = s.path(&format!("{stop}.jsonl"));
        one_reply_transcript(&log, &s.ws(), stop);
        let out = s.run(&["--resume", log.to_str().unwrap()]).await;
        assert_eq!(code(&out), exit, "{stop}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{stop}: {}", stderr(&out));
    }
    let empty = s.path("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    let out = s.run(&["--resume", empty.to_str().unwrap()]).await;
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("holds no conversation"),
        "{}",
        stderr(&out)
    );
    assert!(!stderr(&out).contains("finished"), "{}", stderr(&out));
    assert_eq!(s.model_requests().await.len(), 0, "nothing was sent so far");

    let paused = s.path("paused.jsonl");
    one_reply_transcript(&paused, &s.ws(), "pause_turn");
    let out = s.run(&["--resume", paused.to_str().unwrap()]).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("Carried on after the pause."));
    let requests = s.model_requests().await;
    assert_eq!(requests.len(), 1);
    assert_eq!(
        requests[0]["messages"][1],
        json!({"role": "assistant", "content": [{"type": "text", "text": "Working on it"}]})
    );
}

/// Opens a FIFO for writing on a thread: it returns once the agent has opened the other end.
fn open_fifo_writer(path: PathBuf) -> tokio::sync::oneshot::Receiver<std::fs::File> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        let _ = tx.send(file);
    });
    rx
}

#[tokio::test]
async fn a_crash_after_a_fsynced_tool_use_resumes_rerunning_reads_and_interrupting_writes() {
    let s = stack(json!({"replies": [
        tools_reply(&[("w1", "write_file", json!({"path": "a.txt", "content": "alpha"}))]),
        tools_reply(&[
            ("c1", "run_command", json!({"command": "echo started >> runs.txt; cat gate"})),
            ("r1", "read_file", json!({"path": "a.txt"})),
        ]),
        text_reply("Resumed and done."),
    ]}))
    .await;
    let gate = s.ws().join("gate");
    let made = std::process::Command::new("mkfifo")
        .arg(&gate)
        .status()
        .unwrap();
    assert!(made.success());
    let log = s.path("run.jsonl");
    let mut first = s
        .agent(&["read the gate", "--transcript", log.to_str().unwrap()])
        .spawn()
        .unwrap();
    // The command blocks reading the FIFO; our open returns once it has opened it, which is
    // after its tool_use record was written and fsynced. Then the agent dies without a result.
    let writer = tokio::time::timeout(BOUND, open_fifo_writer(gate.clone()))
        .await
        .expect("the command opens the gate in time")
        .unwrap();
    first.start_kill().unwrap();
    first.wait().await.unwrap();
    // The command, left behind by the SIGKILL, reads the end of the gate and exits.
    drop(writer);

    let before = transcript(&log);
    let last = before.last().unwrap();
    assert_eq!(last["type"], "tool_use");
    assert_eq!(last["id"], "c1");
    assert!(before.iter().all(|r| r["tool_use_id"] != "c1"));

    let out = s.run(&["--resume", log.to_str().unwrap()]).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("Resumed and done."));
    assert_eq!(
        std::fs::read_to_string(s.ws().join("runs.txt")).unwrap(),
        "started\n",
        "the command is not run again"
    );

    let requests = s.model_requests().await;
    assert_eq!(requests.len(), 3);
    let results = tool_results(&requests[2]);
    assert_eq!(results[0]["tool_use_id"], "c1");
    assert_eq!(results[0]["is_error"], true);
    assert!(
        results[0]["content"]
            .as_str()
            .unwrap()
            .starts_with("interrupted")
    );
    assert_eq!(results[1]["tool_use_id"], "r1");
    assert_eq!(results[1]["is_error"], false);
    assert_eq!(results[1]["content"], "alpha");
    // The resumed conversation is the one the first run had built, plus the answers.
    let resumed = requests[2]["messages"].as_array().unwrap();
    assert_eq!(resumed.len(), 5);
    assert_eq!(
        resumed[..3],
        requests[1]["messages"].as_array().unwrap()[..]
    );

    let after = transcript(&log);
    let added: Vec<String> = after[before.len()..]
        .iter()
        .map(|r| match r["type"].as_str().unwrap() {
            "tool_use" => format!("use:{}:rerun={}", r["id"].as_str().unwrap(), r["rerun"]),
            "tool_result" => format!("result:{}", r["tool_use_id"].as_str().unwrap()),
            "assistant" => format!("assistant:{}", r["stop_reason"].as_str().unwrap()),
            other => other.to_owned(),
        })
        .collect();
    assert_eq!(
        added,
        [
            "resume",
            "result:c1",
            "use:r1:rerun=true",
            "result:r1",
            "assistant:end_turn"
        ]
    );
}

/// No key reaches the model, the disk or the transcript: not one in the agent's environment
/// (a provider key exported in the same shell), nor one the model writes as a file name, builds
/// by editing a placeholder, or finds by searching the transcript of a refused write.
#[tokio::test]
async fn keys_stay_out_of_commands_files_results_and_the_transcript() {
    const PROVIDER_KEY: &str = "sk-ant-api03-EnvEnvEnvEnvEnvEnv0123";
    const AGENT_KEY: &str = "opaque-agent-credential-0123";
    const WRITTEN_KEY: &str = "sk-ant-api03-AAAABBBBCCCCDDDDEEEE";
    let s = stack(json!({"replies": [
        tools_reply(&[
            ("env", "run_command", json!({"command": "env; echo PARENT; tr '\\0' '\\n' < /proc/$PPID/environ"})),
            ("name", "write_file", json!({"path": format!("keys/{WRITTEN_KEY}"), "content": "x"})),
            ("stub", "write_file", json!({"path": ".env", "content": "A=sk-ant-api03-CHANGEME\n"})),
            ("fill", "edit_file", json!({"path": ".env", "old_string": "CHANGEME", "new_string": "AAAABBBBCCCCDDDDEEEE"})),
            ("body", "write_file", json!({"path": "notes.txt", "content": WRITTEN_KEY})),
            ("find", "search", json!({"pattern": "AAAABBBB"})),
        ]),
        text_reply("Done."),
    ]}))
    .await;
    let mut cmd = s.agent(&["tidy up", "--transcript", "run.jsonl"]);
    cmd.env("ANTHROPIC_API_KEY", PROVIDER_KEY)
        .env("LEGATE_AGENT_KEY", AGENT_KEY);
    let out = run(cmd).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let results = tool_results(&s.model_requests().await[1]);
    let text = |i: usize| results[i]["content"].as_str().unwrap().to_owned();
    let env = text(0);
    // The command's own environment lacks them; the agent's, read from /proc, has them
    // withheld from the output.
    let (own, parents) = env.split_once("PARENT\n").unwrap();
    assert!(own.contains("PATH="), "{own}");
    for name in ["ANTHROPIC_API_KEY", "LEGATE_AGENT_KEY"] {
        assert!(
            !own.contains(&format!("\n{name}=")),
            "the command got {name}: {own}"
        );
        let withheld = format!("{name}=[${name} withheld]");
        assert!(parents.contains(&withheld), "{parents}");
    }
    assert!(text(1).starts_with("denied by secret_scan"), "{}", text(1));
    assert_eq!(results[2]["is_error"], false);
    assert!(
        text(3).contains("would leave an Anthropic API key"),
        "{}",
        text(3)
    );
    assert!(text(4).starts_with("denied by secret_scan"), "{}", text(4));
    assert!(!text(5).contains("run.jsonl"), "{}", text(5));
    assert_eq!(
        std::fs::read_to_string(s.ws().join(".env")).unwrap(),
        "A=sk-ant-api03-CHANGEME\n"
    );
    assert!(!s.ws().join("keys").exists());
    let log = std::fs::read_to_string(s.ws().join("run.jsonl")).unwrap();
    for key in [PROVIDER_KEY, AGENT_KEY, WRITTEN_KEY] {
        assert!(!log.contains(key), "{key} in the transcript");
    }
    // The model's own calls go back to it as its history; nothing else it was sent holds a key.
    for request in s.model_requests().await {
        for key in [PROVIDER_KEY, AGENT_KEY] {
            assert!(
                !request.to_string().contains(key),
                "{key} sent to the model"
            );
        }
    }
}
