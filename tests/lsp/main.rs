//! `prodigy lsp` driven by a real client over stdio: JSON-RPC with Content-Length framing.

#![expect(
    clippy::unwrap_used,
    clippy::panic,
    clippy::disallowed_methods,
    reason = "a test client fails loudly, and waits for processes within real time"
)]

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use serde_json::{Value, json};

#[path = "../support/external.rs"]
mod external;

#[path = "../support/watch.rs"]
mod watch;

struct Client {
    child: Child,
    stdin: ChildStdin,
    messages: Receiver<Value>,
    next_id: i64,
}

impl Client {
    fn start() -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_prodigy"))
            .arg("lsp")
            // ShellCheck's findings are kept here, not in the user's cache.
            .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, messages) = channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            loop {
                let mut length = None;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let line = line.trim_end();
                    if line.is_empty() {
                        break;
                    }
                    if let Some(n) = line.strip_prefix("Content-Length: ") {
                        length = n.parse::<usize>().ok();
                    }
                }
                let mut body = vec![0; length.unwrap()];
                reader.read_exact(&mut body).unwrap();
                if tx.send(serde_json::from_slice(&body).unwrap()).is_err() {
                    return;
                }
            }
        });
        Client {
            child,
            stdin,
            messages,
            next_id: 1,
        }
    }

    fn send(&mut self, message: &Value) {
        let body = message.to_string();
        write!(self.stdin, "Content-Length: {}\r\n\r\n{body}", body.len()).unwrap();
        self.stdin.flush().unwrap();
    }

    #[expect(
        clippy::needless_pass_by_value,
        reason = "callers build the params inline"
    )]
    fn notify(&mut self, method: &str, params: Value) {
        self.send(&json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    #[expect(
        clippy::needless_pass_by_value,
        reason = "callers build the params inline"
    )]
    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        loop {
            let message = self.messages.recv_timeout(Duration::from_secs(20)).unwrap();
            if message["id"] == id {
                return message["result"].clone();
            }
        }
    }

    /// Sends a request and returns the whole response (its `result` or its `error`).
    fn call(&mut self, message: &Value) -> Value {
        let id = message["id"].clone();
        self.send(message);
        loop {
            let reply = self.messages.recv_timeout(Duration::from_secs(20)).unwrap();
            if reply["id"] == id {
                return reply;
            }
        }
    }

    /// The next diagnostics published for a document, whole (with its `version`).
    fn published(&mut self) -> Value {
        loop {
            let message = self.messages.recv_timeout(Duration::from_secs(20)).unwrap();
            if message["method"] == "textDocument/publishDiagnostics" {
                return message["params"].clone();
            }
        }
    }

    /// The next diagnostics published for a document.
    fn diagnostics(&mut self) -> Vec<Value> {
        loop {
            let message = self.messages.recv_timeout(Duration::from_secs(20)).unwrap();
            if message["method"] == "textDocument/publishDiagnostics" {
                return message["params"]["diagnostics"].as_array().unwrap().clone();
            }
        }
    }
}

const URI: &str = "file:///tmp/prodigy-lsp-test/workflow.yml";

fn start_session(encodings: &[&str]) -> Client {
    let mut client = Client::start();
    let result = client.request(
        "initialize",
        json!({"processId": null, "rootUri": null, "capabilities": {"general": {"positionEncodings": encodings}}}),
    );
    assert!(
        result["capabilities"]["hoverProvider"]
            .as_bool()
            .unwrap_or(false)
            || result["capabilities"]["hoverProvider"].is_object()
    );
    client.notify("initialized", json!({}));
    client
}

fn open(client: &mut Client, text: &str) {
    client.notify(
        "textDocument/didOpen",
        json!({"textDocument": {"uri": URI, "languageId": "yaml", "version": 1, "text": text}}),
    );
}

fn change(client: &mut Client, version: i64, text: &str) {
    client.notify(
        "textDocument/didChange",
        json!({"textDocument": {"uri": URI, "version": version}, "contentChanges": [{"text": text}]}),
    );
}

fn finish(mut client: Client) {
    client.request("shutdown", Value::Null);
    client.notify("exit", Value::Null);
    let status = client.child.wait().unwrap();
    assert!(status.success(), "the server exited with {status}");
}

#[test]
fn diagnostics_appear_and_clear_as_the_document_changes() {
    let mut client = start_session(&["utf-16"]);
    open(
        &mut client,
        "commands:\n  - shell: make\n    retry_config:\n      max_attemps: 3\n",
    );
    let diagnostics = client.diagnostics();
    assert_eq!(diagnostics.len(), 1, "{diagnostics:?}");
    let d = &diagnostics[0];
    assert_eq!(d["code"], "V001");
    assert_eq!(d["source"], "prodigy");
    assert_eq!(
        d["range"],
        json!({"start": {"line": 3, "character": 6}, "end": {"line": 3, "character": 17}})
    );
    assert!(
        d["message"]
            .as_str()
            .unwrap()
            .contains("did you mean `max_attempts`?")
    );

    change(
        &mut client,
        2,
        "commands:\n  - shell: make\n    retry_config:\n      attempts: 3\n",
    );
    assert_eq!(client.diagnostics(), Vec::<Value>::new());

    // Secondary labels arrive as related information.
    change(&mut client, 3, "commands:\n  - shell: a\n    claude: b\n");
    let diagnostics = client.diagnostics();
    assert_eq!(diagnostics[0]["code"], "V004");
    assert_eq!(
        diagnostics[0]["relatedInformation"][0]["message"],
        "first command"
    );
    finish(client);
}

#[test]
fn ranges_count_utf16_units_unless_utf8_is_negotiated() {
    // `claude` comes after `é` (2 bytes, 1 UTF-16 unit) and `😀` (4 bytes, 2 units).
    let text = "- {shell: \"é😀\", claude: x}\n";
    for (encodings, column) in [(&["utf-16"][..], 17), (&["utf-8", "utf-16"][..], 20)] {
        let mut client = start_session(encodings);
        open(&mut client, text);
        let d = client.diagnostics();
        assert_eq!(d[0]["code"], "V004");
        assert_eq!(
            d[0]["range"]["start"],
            json!({"line": 0, "character": column}),
            "{encodings:?}"
        );
        finish(client);
    }
}

#[test]
fn hover_and_completion() {
    let mut client = start_session(&["utf-16"]);
    let text = "env:\n  TARGET: prod\ncommands:\n  - shell: make\n    retry_config:\n      attempts: 3\n  - shell: echo ${TA}\n";
    open(&mut client, text);
    let _ = client.diagnostics();
    let hover = client.request(
        "textDocument/hover",
        json!({"textDocument": {"uri": URI}, "position": {"line": 4, "character": 6}}),
    );
    assert!(
        hover["contents"]["value"]
            .as_str()
            .unwrap()
            .contains("`retry_config`"),
        "{hover}"
    );
    let completion = client.request(
        "textDocument/completion",
        json!({"textDocument": {"uri": URI}, "position": {"line": 6, "character": 20}}),
    );
    let labels: Vec<&str> = completion
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["label"].as_str().unwrap())
        .collect();
    assert_eq!(labels, ["TARGET"]);

    // A half-typed key: the document does not parse, completion still answers.
    change(&mut client, 2, "commands:\n  - shell: make\n    ti\n");
    let _ = client.diagnostics();
    let completion = client.request(
        "textDocument/completion",
        json!({"textDocument": {"uri": URI}, "position": {"line": 2, "character": 6}}),
    );
    let labels: Vec<&str> = completion
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["label"].as_str().unwrap())
        .collect();
    assert!(labels.contains(&"timeout"), "{labels:?}");

    // Garbage never takes the server down.
    for (version, garbage) in ["{{{", ":\n - [", "${", "\u{0}", "- shell: \"${item"]
        .iter()
        .enumerate()
    {
        change(&mut client, 3 + i64::try_from(version).unwrap(), garbage);
        let _ = client.diagnostics();
        let _ = client.request(
            "textDocument/hover",
            json!({"textDocument": {"uri": URI}, "position": {"line": 0, "character": 2}}),
        );
        let _ = client.request(
            "textDocument/completion",
            json!({"textDocument": {"uri": URI}, "position": {"line": 0, "character": 2}}),
        );
    }
    finish(client);
}

/// `${` completes while its string is still open, as it does once the string is closed.
#[test]
fn variables_complete_while_the_string_is_open() {
    let mut client = start_session(&["utf-16"]);
    let text = "name: x\nmode: mapreduce\nmap:\n  input: items.json\n  agent_template:\n    - shell: \"echo ${it";
    open(&mut client, text);
    let _ = client.diagnostics();
    let completion = client.request(
        "textDocument/completion",
        json!({"textDocument": {"uri": URI}, "position": {"line": 5, "character": 24}}),
    );
    let labels: Vec<&str> = completion
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["label"].as_str().unwrap())
        .collect();
    assert!(
        labels.contains(&"item") && labels.contains(&"item_index"),
        "{labels:?}"
    );
    finish(client);
}

/// A step that has a command is offered no second one, nor a deprecated or removed key.
#[test]
fn key_completion_offers_one_command_and_no_old_keys() {
    let mut client = start_session(&["utf-16"]);
    open(&mut client, "commands:\n  - shell: make\n    \n");
    let _ = client.diagnostics();
    let completion = client.request(
        "textDocument/completion",
        json!({"textDocument": {"uri": URI}, "position": {"line": 2, "character": 4}}),
    );
    let labels: Vec<&str> = completion
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["label"].as_str().unwrap())
        .collect();
    assert!(labels.contains(&"on_failure"), "{labels:?}");
    for refused in ["claude", "write_file", "test", "command", "analyze"] {
        assert!(!labels.contains(&refused), "{refused}: {labels:?}");
    }
    finish(client);
}

/// `worktree:` keys come from the shape tables: completed and explained on hover.
#[test]
fn worktree_keys_complete_and_hover() {
    let mut client = start_session(&["utf-16"]);
    open(
        &mut client,
        "worktree:\n  sparse: [src]\n  \ncommands:\n  - shell: make\n",
    );
    let _ = client.diagnostics();
    let completion = client.request(
        "textDocument/completion",
        json!({"textDocument": {"uri": URI}, "position": {"line": 2, "character": 2}}),
    );
    let labels: Vec<&str> = completion
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["label"].as_str().unwrap())
        .collect();
    for key in ["copy", "link", "setup", "keep"] {
        assert!(labels.contains(&key), "{key}: {labels:?}");
    }
    let hover = client.request(
        "textDocument/hover",
        json!({"textDocument": {"uri": URI}, "position": {"line": 1, "character": 4}}),
    );
    assert!(
        hover["contents"]["value"]
            .as_str()
            .unwrap()
            .contains("sparse checkout"),
        "{hover}"
    );
    finish(client);
}

#[test]
fn sure_fixes_are_offered_as_quick_fixes() {
    let mut client = start_session(&["utf-16"]);
    open(
        &mut client,
        "commands:\n  - shell: make\n    retry_config:\n      max_attemps: 3\n",
    );
    let diagnostics = client.diagnostics();
    assert_eq!(diagnostics[0]["code"], "V001");
    let actions = client.request(
        "textDocument/codeAction",
        json!({
            "textDocument": {"uri": URI},
            "range": {"start": {"line": 3, "character": 8}, "end": {"line": 3, "character": 8}},
            "context": {"diagnostics": diagnostics},
        }),
    );
    let actions = actions.as_array().unwrap();
    assert_eq!(actions.len(), 1, "{actions:?}");
    let action = &actions[0];
    assert_eq!(action["title"], "rename `max_attemps` to `max_attempts`");
    assert_eq!(action["kind"], "quickfix");
    assert_eq!(action["diagnostics"][0]["code"], "V001");
    assert_eq!(
        action["edit"]["changes"][URI],
        json!([{
            "range": {"start": {"line": 3, "character": 6}, "end": {"line": 3, "character": 17}},
            "newText": "max_attempts",
        }])
    );
    // Elsewhere in the file, nothing to offer.
    let none = client.request(
        "textDocument/codeAction",
        json!({
            "textDocument": {"uri": URI},
            "range": {"start": {"line": 0, "character": 0}, "end": {"line": 0, "character": 3}},
            "context": {"diagnostics": []},
        }),
    );
    assert_eq!(none, json!([]));
    finish(client);
}

#[test]
fn shellcheck_findings_are_published_in_the_command() {
    if !external::tool_available("lsp shellcheck findings", "shellcheck", "shellcheck") {
        return;
    }
    let mut client = start_session(&["utf-16"]);
    open(
        &mut client,
        "commands:\n  - shell: cd ${item_dir} && ls $y\n",
    );
    let diagnostics = client.diagnostics();
    let codes: Vec<&str> = diagnostics
        .iter()
        .map(|d| d["code"].as_str().unwrap())
        .collect();
    assert!(codes.contains(&"S001"), "{diagnostics:?}");
    let sc2086 = diagnostics
        .iter()
        .find(|d| d["message"].as_str().unwrap().starts_with("SC2086"))
        .unwrap();
    // `$y`, at its place inside the YAML string.
    assert_eq!(
        sc2086["range"],
        json!({"start": {"line": 1, "character": 32}, "end": {"line": 1, "character": 34}})
    );
    assert!(
        sc2086["message"]
            .as_str()
            .unwrap()
            .contains("https://www.shellcheck.net/wiki/SC2086")
    );
    finish(client);
}

/// The server answers a hover at the start of the document: it is still serving.
fn still_serves(client: &mut Client) {
    let id = 9000 + client.next_id;
    client.next_id += 1;
    let reply = client.call(&json!({"jsonrpc": "2.0", "id": id, "method": "textDocument/hover", "params": {"textDocument": {"uri": URI}, "position": {"line": 0, "character": 2}}}));
    assert!(reply.get("error").is_none(), "{reply}");
}

#[test]
fn a_did_open_without_language_id_is_checked() {
    let mut client = start_session(&["utf-16"]);
    client.notify(
        "textDocument/didOpen",
        json!({"textDocument": {"uri": URI, "text": "commands:\n  - shell: a\n    claude: b\n"}}),
    );
    let diagnostics = client.diagnostics();
    assert_eq!(diagnostics[0]["code"], "V004", "{diagnostics:?}");
    finish(client);
}

#[test]
fn malformed_notifications_are_ignored_and_the_server_keeps_serving() {
    let mut client = start_session(&["utf-16"]);
    open(&mut client, "commands:\n  - shell: make\n");
    assert_eq!(client.diagnostics(), Vec::<Value>::new());
    client.notify("textDocument/didOpen", json!({"textDocument": {"uri": 7}}));
    client.notify("textDocument/didChange", json!({}));
    client.notify("textDocument/didClose", Value::Null);
    client.notify("textDocument/didSave", json!([1, 2]));
    still_serves(&mut client);
    // Still checking, too.
    change(&mut client, 2, "commands:\n  - shell: a\n    claude: b\n");
    assert_eq!(client.diagnostics()[0]["code"], "V004");
    finish(client);
}

#[test]
fn bad_requests_get_invalid_params_and_the_server_keeps_serving() {
    let mut client = start_session(&["utf-16"]);
    open(&mut client, "commands:\n  - shell: make\n");
    let _ = client.diagnostics();
    for (id, params) in [
        (100, Some(json!({}))),
        (101, None),
        (
            102,
            Some(json!({"textDocument": {"uri": URI}, "position": "here"})),
        ),
    ] {
        let mut request = json!({"jsonrpc": "2.0", "id": id, "method": "textDocument/hover"});
        if let Some(params) = params {
            request["params"] = params;
        }
        let reply = client.call(&request);
        assert_eq!(reply["error"]["code"], -32602, "{reply}");
        assert!(
            reply["error"]["message"]
                .as_str()
                .unwrap()
                .contains("textDocument/hover"),
            "{reply}"
        );
    }
    for method in ["textDocument/completion", "textDocument/codeAction"] {
        let reply =
            client.call(&json!({"jsonrpc": "2.0", "id": 200, "method": method, "params": {}}));
        assert_eq!(reply["error"]["code"], -32602, "{method}: {reply}");
    }
    still_serves(&mut client);
    finish(client);
}

#[test]
fn a_message_over_the_size_limit_is_skipped_and_the_server_keeps_serving() {
    let mut client = start_session(&["utf-16"]);
    open(&mut client, "commands:\n  - shell: make\n");
    let _ = client.diagnostics();
    // 64 MiB and one byte: skipped without being held, and the framing stays intact.
    let length = 64 * 1024 * 1024 + 1;
    write!(client.stdin, "Content-Length: {length}\r\n\r\n").unwrap();
    let chunk = vec![b' '; 1024 * 1024];
    let mut left = length;
    while left > 0 {
        let n = left.min(chunk.len());
        client.stdin.write_all(&chunk[..n]).unwrap();
        left -= n;
    }
    still_serves(&mut client);
    finish(client);
}

#[test]
fn an_absurd_content_length_ends_the_server_cleanly() {
    let mut client = start_session(&["utf-16"]);
    client
        .stdin
        .write_all(b"Content-Length: 99999999999999\r\n\r\n{}")
        .unwrap();
    let Client {
        mut child, stdin, ..
    } = client;
    drop(stdin);
    let Some(status) = watch::exited_within(&mut child, Duration::from_secs(20)) else {
        let _ = child.kill();
        panic!("the server hangs");
    };
    // An exit code, not a signal: no abort on allocation.
    assert_eq!(status.code(), Some(1), "{status}");
}

#[test]
fn a_burst_of_changes_is_checked_at_its_last_version() {
    let mut client = start_session(&["utf-16"]);
    open(&mut client, "commands:\n  - shell: make\n");
    let _ = client.diagnostics();
    let last = 201;
    for version in 2..=last {
        // Each version misspells a key differently; the last one is the only `V004`.
        let text = if version == last {
            "commands:\n  - shell: a\n    claude: b\n".to_owned()
        } else {
            format!(
                "commands:\n  - shell: \"echo $x{version}\"\n    retry_config:\n      max_attemps: {version}\n"
            )
        };
        change(&mut client, version, &text);
    }
    let mut checks = 0;
    let final_params = loop {
        let params = client.published();
        checks += 1;
        if params["version"] == last {
            break params;
        }
    };
    assert_eq!(
        final_params["diagnostics"][0]["code"], "V004",
        "{final_params}"
    );
    // Bounded in time too: each wait for diagnostics gives up after 20 s.
    assert!(checks <= 20, "{checks} checks for one burst of 200 changes");
    finish(client);
}

#[test]
fn an_unknown_slash_command_is_published_on_its_name() {
    let project = tempfile::tempdir().unwrap();
    std::fs::create_dir(project.path().join(".git")).unwrap();
    let commands = project.path().join(".claude/commands");
    std::fs::create_dir_all(&commands).unwrap();
    std::fs::write(commands.join("prodigy-lint.md"), "Lint.\n").unwrap();
    let uri = format!("file://{}/flow.yml", project.path().display());
    let mut client = start_session(&["utf-16"]);
    client.notify(
        "textDocument/didOpen",
        json!({"textDocument": {"uri": uri, "languageId": "yaml", "version": 1, "text": "- claude: /prodigy-lint\n- claude: /prodigy-lnit src\n"}}),
    );
    let diagnostics = client.diagnostics();
    let w008: Vec<&Value> = diagnostics.iter().filter(|d| d["code"] == "W008").collect();
    assert_eq!(w008.len(), 1, "{diagnostics:?}");
    assert_eq!(
        w008[0]["range"],
        json!({"start": {"line": 1, "character": 10}, "end": {"line": 1, "character": 23}})
    );
    finish(client);
}
