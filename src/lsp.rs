//! `prodigy lsp`: a language server over stdio.
//!
//! It publishes the same diagnostics as `check` when a document is opened, changed or saved,
//! shows the documentation of the key under the cursor, and completes keys and variables.
//! Positions are UTF-16 code units unless the client offers UTF-8.
//! The protocol plumbing lives here; what to say comes from `prodigy_compiler::ide`.
//!
//! What a client sends cannot take the server down: a request with bad parameters gets an
//! `InvalidParams` error, a malformed notification or message is reported on stderr and
//! skipped, and a message longer than [`MAX_MESSAGE`] is skipped unread. Documents are
//! checked once a burst of changes is over, at their latest version only.

use std::collections::BTreeMap;
use std::io::{BufRead, Read as _};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use lsp_server::{Connection, Message, Notification, Request, RequestId, Response};
use lsp_types::notification::Notification as _;
use lsp_types::request::Request as _;
use lsp_types::{
    CodeAction, CodeActionKind, CodeActionOrCommand, CodeActionParams,
    CodeActionProviderCapability, CompletionItem, CompletionItemKind, CompletionOptions,
    CompletionParams, CompletionResponse, Diagnostic, DiagnosticRelatedInformation,
    DiagnosticSeverity, DidChangeTextDocumentParams, DidCloseTextDocumentParams,
    DidSaveTextDocumentParams, Hover, HoverContents, HoverParams, HoverProviderCapability,
    InitializeParams, Location, MarkupContent, MarkupKind, NumberOrString, Position,
    PositionEncodingKind, PublishDiagnosticsParams, Range, ServerCapabilities,
    TextDocumentSyncCapability, TextDocumentSyncKind, TextEdit, Uri, WorkspaceEdit,
};
use prodigy_compiler::diagnostics::Severity;
use prodigy_compiler::source::{SourceFile, Span};

/// How positions count characters on a line.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Encoding {
    Utf8,
    Utf16,
}

/// The longest message the server reads (64 MiB); a longer one is skipped without being
/// held in memory.
const MAX_MESSAGE: u64 = 64 * 1024 * 1024;

/// The longest header line the server reads.
const MAX_HEADER_LINE: u64 = 8 * 1024;

/// How long the client must be quiet before the documents it changed are checked, and how
/// long at most checking waits for a quiet moment.
const QUIET: Duration = Duration::from_millis(25);
const MOST_DELAY: Duration = Duration::from_millis(300);

struct Server {
    connection: Connection,
    encoding: Encoding,
    documents: BTreeMap<String, String>,
    /// The version of each document, as the client numbered it.
    versions: BTreeMap<String, i32>,
    /// Documents changed since they were last checked.
    dirty: BTreeMap<String, Uri>,
    /// The diagnostics last published for each document, for their fixes (code actions).
    published: BTreeMap<String, Vec<prodigy_compiler::diagnostics::Diagnostic>>,
    /// ShellCheck, when it is on `PATH`.
    shellcheck: Option<crate::shellcheck::ShellCheck>,
    /// The time now, for the pause before checking.
    clock: fn() -> Instant,
}

#[expect(
    clippy::disallowed_methods,
    reason = "the language server's clock, passed to `Server`"
)]
fn system_clock() -> Instant {
    Instant::now()
}

/// Runs the server until the client says `exit`. Returns the process exit code.
pub(crate) fn run() -> u8 {
    let (connection, client) = Connection::memory();
    let Connection {
        sender: to_server,
        receiver: from_server,
    } = client;
    let lost = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader_lost = std::sync::Arc::clone(&lost);
    // Not joined: after `exit` it may still wait on stdin.
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        let read = forward(&mut stdin.lock(), &mut |message| {
            to_server.send(message).is_ok()
        });
        // Set before the server's side sees the input end.
        if read.is_err() {
            reader_lost.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        drop(to_server);
    });
    let writer = std::thread::spawn(move || {
        let stdout = std::io::stdout();
        let mut stdout = stdout.lock();
        // Ends when the server drops its side, once every message is written.
        from_server
            .into_iter()
            .try_for_each(|message| message.write(&mut stdout))
    });
    let mut code = match serve(connection) {
        Ok(()) => crate::exit_code::OK,
        Err(e) => {
            crate::err(&format!("prodigy lsp: {e}\n"));
            crate::exit_code::PROBLEMS
        }
    };
    if !matches!(writer.join(), Ok(Ok(()))) || lost.load(std::sync::atomic::Ordering::SeqCst) {
        code = crate::exit_code::PROBLEMS;
    }
    code
}

/// What [`read_frame`] found.
#[derive(Debug, PartialEq, Eq)]
enum Frame {
    /// A message's content.
    Message(Vec<u8>),
    /// A message longer than [`MAX_MESSAGE`], skipped: its length.
    TooLong(u64),
    /// The end of the input, between messages.
    End,
}

/// Reads one `Content-Length` framed message, holding at most [`MAX_MESSAGE`] bytes.
///
/// # Errors
///
/// A malformed header, or an input that ends inside a message: the framing is lost.
fn read_frame(input: &mut impl BufRead) -> std::io::Result<Frame> {
    let bad = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
    let mut length = None;
    let mut first = true;
    loop {
        let mut line = Vec::new();
        let read = input
            .by_ref()
            .take(MAX_HEADER_LINE)
            .read_until(b'\n', &mut line)?;
        if read == 0 {
            if first {
                return Ok(Frame::End);
            }
            return Err(bad("the input ended inside a message header".into()));
        }
        first = false;
        if !line.ends_with(b"\n") {
            return Err(bad(format!(
                "a header line longer than {MAX_HEADER_LINE} bytes"
            )));
        }
        let line = String::from_utf8_lossy(&line);
        let line = line.trim_end_matches(['\r', '\n']);
        if line.is_empty() {
            break;
        }
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| bad(format!("malformed header `{line}`")))?;
        if name.trim().eq_ignore_ascii_case("Content-Length") {
            let value = value.trim();
            length = Some(
                value
                    .parse::<u64>()
                    .map_err(|_| bad(format!("`Content-Length: {value}` is not a length")))?,
            );
        }
    }
    let length = length.ok_or_else(|| bad("a message without `Content-Length`".into()))?;
    let ended = || {
        std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("the input ended inside a message of {length} bytes"),
        )
    };
    if length > MAX_MESSAGE {
        let skipped = std::io::copy(&mut input.by_ref().take(length), &mut std::io::sink())?;
        if skipped < length {
            return Err(ended());
        }
        return Ok(Frame::TooLong(length));
    }
    let mut content = Vec::new();
    input.by_ref().take(length).read_to_end(&mut content)?;
    if (content.len() as u64) < length {
        return Err(ended());
    }
    Ok(Frame::Message(content))
}

/// Reads the client's messages from INPUT and passes them to the server until the input
/// ends, the client says `exit`, or the framing is lost; what cannot be read as a message
/// is reported on stderr and skipped.
///
/// # Errors
///
/// The framing was lost (said on stderr).
fn forward(
    input: &mut impl BufRead,
    server: &mut impl FnMut(Message) -> bool,
) -> std::io::Result<()> {
    loop {
        match read_frame(input) {
            Ok(Frame::End) => return Ok(()),
            Ok(Frame::TooLong(length)) => crate::err(&format!(
                "prodigy lsp: skipped a message of {length} bytes: messages are limited to {} MiB\n",
                MAX_MESSAGE / (1024 * 1024)
            )),
            Ok(Frame::Message(content)) => match serde_json::from_slice::<Message>(&content) {
                Ok(message) => {
                    let exit = matches!(&message, Message::Notification(n) if n.method == "exit");
                    if !server(message) || exit {
                        return Ok(());
                    }
                }
                Err(e) => crate::err(&format!(
                    "prodigy lsp: skipped a message that is not JSON-RPC: {e}\n"
                )),
            },
            Err(e) => {
                crate::err(&format!(
                    "prodigy lsp: cannot read the client's messages any more: {e}\n"
                ));
                return Err(e);
            }
        }
    }
}

fn serve(connection: Connection) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let (id, params) = connection.initialize_start()?;
    let params: InitializeParams = serde_json::from_value(params)?;
    let offers_utf8 = params
        .capabilities
        .general
        .as_ref()
        .and_then(|g| g.position_encodings.as_ref())
        .is_some_and(|e| e.contains(&PositionEncodingKind::UTF8));
    let encoding = if offers_utf8 {
        Encoding::Utf8
    } else {
        Encoding::Utf16
    };
    let capabilities = ServerCapabilities {
        position_encoding: Some(if offers_utf8 {
            PositionEncodingKind::UTF8
        } else {
            PositionEncodingKind::UTF16
        }),
        text_document_sync: Some(TextDocumentSyncCapability::Kind(TextDocumentSyncKind::FULL)),
        hover_provider: Some(HoverProviderCapability::Simple(true)),
        completion_provider: Some(CompletionOptions {
            trigger_characters: Some(vec!["{".into(), ".".into(), "$".into()]),
            ..CompletionOptions::default()
        }),
        code_action_provider: Some(CodeActionProviderCapability::Simple(true)),
        ..ServerCapabilities::default()
    };
    let result = serde_json::json!({
        "capabilities": capabilities,
        "serverInfo": {"name": "prodigy", "version": env!("CARGO_PKG_VERSION")},
    });
    connection.initialize_finish(id, result)?;
    let mut server = Server {
        connection,
        encoding,
        documents: BTreeMap::new(),
        versions: BTreeMap::new(),
        dirty: BTreeMap::new(),
        published: BTreeMap::new(),
        shellcheck: crate::shellcheck::ShellCheck::find()
            .map(crate::shellcheck::ShellCheck::cached_on_disk),
        clock: system_clock,
    };
    server.main_loop()
}

impl Server {
    /// Serves until `shutdown` and `exit`, or the end of the input. After a message, takes
    /// in what else arrives until the client is quiet for [`QUIET`] (at most [`MOST_DELAY`])
    /// before checking the documents that changed: a burst of changes is checked once, at
    /// its last version.
    fn main_loop(&mut self) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        while let Ok(message) = self.connection.receiver.recv() {
            if self.handle(message)? {
                return Ok(());
            }
            let deadline = (self.clock)() + MOST_DELAY;
            while let Some(wait) = deadline.checked_duration_since((self.clock)()) {
                match self.connection.receiver.recv_timeout(wait.min(QUIET)) {
                    Ok(message) => {
                        if self.handle(message)? {
                            return Ok(());
                        }
                    }
                    Err(e) if e.is_timeout() => break,
                    Err(_) => {
                        self.check_changed()?;
                        return Ok(());
                    }
                }
            }
            self.check_changed()?;
        }
        Ok(())
    }

    /// Handles one message; true after `shutdown` and `exit`.
    fn handle(
        &mut self,
        message: Message,
    ) -> Result<bool, Box<dyn std::error::Error + Send + Sync>> {
        match message {
            Message::Request(request) => {
                if self.connection.handle_shutdown(&request)? {
                    return Ok(true);
                }
                self.request(request)?;
            }
            Message::Notification(notification) => self.notification(notification)?,
            Message::Response(_) => {}
        }
        Ok(false)
    }

    /// Publishes the diagnostics of every document changed since it was last checked.
    fn check_changed(&mut self) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        for uri in std::mem::take(&mut self.dirty).into_values() {
            self.publish(&uri)?;
        }
        Ok(())
    }

    fn request(
        &mut self,
        request: Request,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let response = match request.method.as_str() {
            lsp_types::request::HoverRequest::METHOD => {
                let (id, params) = match extract::<HoverParams>(request) {
                    Ok(x) => x,
                    Err(refusal) => return self.respond(*refusal),
                };
                let doc = &params.text_document_position_params;
                let hover = self.text_at(&doc.text_document.uri, doc.position).and_then(
                    |(text, offset)| {
                        prodigy_compiler::ide::hover(&text, offset).map(|markdown| Hover {
                            contents: HoverContents::Markup(MarkupContent {
                                kind: MarkupKind::Markdown,
                                value: markdown,
                            }),
                            range: None,
                        })
                    },
                );
                Response::new_ok(id, hover)
            }
            lsp_types::request::Completion::METHOD => {
                let (id, params) = match extract::<CompletionParams>(request) {
                    Ok(x) => x,
                    Err(refusal) => return self.respond(*refusal),
                };
                let doc = &params.text_document_position;
                let items: Vec<CompletionItem> = self
                    .text_at(&doc.text_document.uri, doc.position)
                    .map(|(text, offset)| prodigy_compiler::ide::completions(&text, offset))
                    .unwrap_or_default()
                    .into_iter()
                    .map(|c| CompletionItem {
                        label: c.label,
                        detail: Some(c.detail),
                        kind: Some(match c.kind {
                            prodigy_compiler::ide::CompletionKind::Key => {
                                CompletionItemKind::PROPERTY
                            }
                            prodigy_compiler::ide::CompletionKind::Variable => {
                                CompletionItemKind::VARIABLE
                            }
                        }),
                        ..CompletionItem::default()
                    })
                    .collect();
                Response::new_ok(id, CompletionResponse::Array(items))
            }
            lsp_types::request::CodeActionRequest::METHOD => {
                let (id, params) = match extract::<CodeActionParams>(request) {
                    Ok(x) => x,
                    Err(refusal) => return self.respond(*refusal),
                };
                // Fixes come from the diagnostics of the text as it is now.
                self.check_changed()?;
                Response::new_ok(id, self.code_actions(&params))
            }
            _ => Response::new_err(
                request.id,
                lsp_server::ErrorCode::MethodNotFound as i32,
                format!("`{}` is not supported", request.method),
            ),
        };
        self.respond(response)
    }

    fn respond(&self, response: Response) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        self.connection.sender.send(Message::Response(response))?;
        Ok(())
    }

    /// Marks a document to be checked once the client is quiet.
    fn changed(&mut self, uri: Uri, text: Option<String>, version: Option<i32>) {
        let key = uri.as_str().to_owned();
        if let Some(text) = text {
            self.documents.insert(key.clone(), text);
        }
        if let Some(version) = version {
            self.versions.insert(key.clone(), version);
        }
        self.dirty.insert(key, uri);
    }

    /// Handles a notification; one whose parameters are malformed is reported on stderr
    /// and ignored, as the protocol gives no way to answer it.
    fn notification(
        &mut self,
        notification: Notification,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let method = notification.method.clone();
        match self.notified(notification) {
            Ok(()) => Ok(()),
            Err(Ignored::Malformed(e)) => {
                crate::err(&format!(
                    "prodigy lsp: ignored a `{method}` notification: {e}\n"
                ));
                Ok(())
            }
            Err(Ignored::Disconnected(e)) => Err(e),
        }
    }

    fn notified(&mut self, notification: Notification) -> Result<(), Ignored> {
        let params = notification.params;
        match notification.method.as_str() {
            lsp_types::notification::DidOpenTextDocument::METHOD => {
                // Only what the server uses is required: a client that leaves out
                // `languageId` (or `version`) still gets its document checked.
                let params: OpenParams = parse(params)?;
                let doc = params.text_document;
                self.changed(doc.uri, Some(doc.text), doc.version);
            }
            lsp_types::notification::DidChangeTextDocument::METHOD => {
                let params: DidChangeTextDocumentParams = parse(params)?;
                let doc = params.text_document;
                // Full sync: the last change holds the whole text.
                let text = params.content_changes.into_iter().last().map(|c| c.text);
                self.changed(doc.uri, text, Some(doc.version));
            }
            lsp_types::notification::DidSaveTextDocument::METHOD => {
                let params: DidSaveTextDocumentParams = parse(params)?;
                self.changed(params.text_document.uri, params.text, None);
            }
            lsp_types::notification::DidCloseTextDocument::METHOD => {
                let params: DidCloseTextDocumentParams = parse(params)?;
                let key = params.text_document.uri.as_str();
                self.documents.remove(key);
                self.versions.remove(key);
                self.dirty.remove(key);
                self.published.remove(key);
                self.send_diagnostics(params.text_document.uri, Vec::new(), None)
                    .map_err(Ignored::Disconnected)?;
            }
            _ => {}
        }
        Ok(())
    }

    fn text_at(&self, uri: &Uri, position: Position) -> Option<(String, usize)> {
        let text = self.documents.get(uri.as_str())?;
        let offset = offset_of(text, position, self.encoding);
        Some((text.clone(), offset))
    }

    fn publish(&mut self, uri: &Uri) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let Some(text) = self.documents.get(uri.as_str()) else {
            return Ok(());
        };
        let file = SourceFile::new(uri.as_str(), text.as_str());
        let dir = document_dir(uri);
        let file_exists = |p: &str| dir.join(p).is_file();
        // Bounded reads of regular files only, as `check` and `run` read them.
        let read_file = |p: &str| prodigy_compiler::source::read_text(&dir.join(p));
        let slash_command = crate::check::slash_commands(&dir);
        let tracked = |p: &str| crate::check::git_tracks(&dir, p);
        let surroundings = prodigy_compiler::Surroundings {
            file_exists: &file_exists,
            read_file: &read_file,
            tracked: &tracked,
            slash_command: &slash_command,
        };
        let checked = match &self.shellcheck {
            Some(sc) => {
                let lint = |scripts: &[prodigy_compiler::shell::Script]| {
                    sc.lint(scripts).unwrap_or_else(|why| {
                        crate::err(&format!("prodigy lsp: ShellCheck did not run: {why}\n"));
                        Vec::new()
                    })
                };
                prodigy_compiler::check_linted(&file, &surroundings, &lint)
            }
            None => prodigy_compiler::check_in(&file, &surroundings),
        };
        let diagnostics = checked
            .diagnostics
            .iter()
            .map(|d| to_lsp(d, text, uri, self.encoding))
            .collect();
        self.published
            .insert(uri.as_str().to_owned(), checked.diagnostics);
        let version = self.versions.get(uri.as_str()).copied();
        self.send_diagnostics(uri.clone(), diagnostics, version)
    }

    /// A quick fix for every published diagnostic with a sure fix in the requested range.
    fn code_actions(&self, params: &CodeActionParams) -> Vec<CodeActionOrCommand> {
        let uri = &params.text_document.uri;
        let (Some(text), Some(diagnostics)) = (
            self.documents.get(uri.as_str()),
            self.published.get(uri.as_str()),
        ) else {
            return Vec::new();
        };
        let start = offset_of(text, params.range.start, self.encoding);
        let end = offset_of(text, params.range.end, self.encoding);
        diagnostics
            .iter()
            .filter_map(|d| {
                let fix = d.fix.as_ref()?;
                let span = d.primary.as_ref().map(|l| l.span).unwrap_or_default();
                let (from, to) = (span.start as usize, span.end as usize);
                // The diagnostic touches the range (an empty range is the cursor).
                if to < start || from > end {
                    return None;
                }
                let edits = fix
                    .edits
                    .iter()
                    .map(|e| TextEdit {
                        range: range_of(text, e.span, self.encoding),
                        new_text: e.replacement.clone(),
                    })
                    .collect();
                Some(CodeActionOrCommand::CodeAction(CodeAction {
                    title: fix.description.clone(),
                    kind: Some(CodeActionKind::QUICKFIX),
                    diagnostics: Some(vec![to_lsp(d, text, uri, self.encoding)]),
                    edit: Some(WorkspaceEdit {
                        changes: Some(std::iter::once((uri.clone(), edits)).collect()),
                        ..WorkspaceEdit::default()
                    }),
                    is_preferred: Some(true),
                    ..CodeAction::default()
                }))
            })
            .collect()
    }

    fn send_diagnostics(
        &self,
        uri: Uri,
        diagnostics: Vec<Diagnostic>,
        version: Option<i32>,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let params = PublishDiagnosticsParams {
            uri,
            diagnostics,
            version,
        };
        let notification = Notification::new(
            lsp_types::notification::PublishDiagnostics::METHOD.to_owned(),
            params,
        );
        self.connection
            .sender
            .send(Message::Notification(notification))?;
        Ok(())
    }
}

/// A diagnostic as the protocol has it.
fn to_lsp(
    d: &prodigy_compiler::diagnostics::Diagnostic,
    text: &str,
    uri: &Uri,
    encoding: Encoding,
) -> Diagnostic {
    let span = d.primary.as_ref().map(|l| l.span).unwrap_or_default();
    let mut message = d.message.clone();
    if let Some(label) = &d.primary {
        message.push_str(": ");
        message.push_str(&label.text);
    }
    if let Some(help) = &d.help {
        message.push_str("\nhelp: ");
        message.push_str(help);
    }
    Diagnostic {
        range: range_of(text, span, encoding),
        severity: Some(match d.severity {
            Severity::Error => DiagnosticSeverity::ERROR,
            Severity::Warning => DiagnosticSeverity::WARNING,
        }),
        code: Some(NumberOrString::String(d.code.as_str().to_owned())),
        source: Some("prodigy".to_owned()),
        message,
        related_information: (!d.labels.is_empty()).then(|| {
            d.labels
                .iter()
                .map(|l| DiagnosticRelatedInformation {
                    location: Location {
                        uri: uri.clone(),
                        range: range_of(text, l.span, encoding),
                    },
                    message: l.text.clone(),
                })
                .collect()
        }),
        ..Diagnostic::default()
    }
}

/// The parameters of REQUEST, or the `InvalidParams` error that answers it.
fn extract<P: serde::de::DeserializeOwned>(
    request: Request,
) -> Result<(RequestId, P), Box<Response>> {
    serde_json::from_value(request.params)
        .map(|params| (request.id.clone(), params))
        .map_err(|e| {
            Box::new(Response::new_err(
                request.id,
                lsp_server::ErrorCode::InvalidParams as i32,
                format!("invalid `{}` parameters: {e}", request.method),
            ))
        })
}

/// Why a notification was not acted on.
enum Ignored {
    /// Its parameters are not what the method takes.
    Malformed(serde_json::Error),
    /// The client is gone.
    Disconnected(Box<dyn std::error::Error + Send + Sync>),
}

fn parse<P: serde::de::DeserializeOwned>(params: serde_json::Value) -> Result<P, Ignored> {
    serde_json::from_value(params).map_err(Ignored::Malformed)
}

/// `textDocument/didOpen` with only what the server needs.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct OpenParams {
    text_document: OpenedDocument,
}

#[derive(serde::Deserialize)]
struct OpenedDocument {
    uri: Uri,
    text: String,
    #[serde(default)]
    version: Option<i32>,
}

/// The directory of a `file://` document, where its relative paths start.
fn document_dir(uri: &Uri) -> PathBuf {
    let path = uri.path().as_str();
    PathBuf::from(path)
        .parent()
        .map_or_else(|| PathBuf::from("."), std::path::Path::to_path_buf)
}

/// The byte offset of an LSP position.
fn offset_of(text: &str, position: Position, encoding: Encoding) -> usize {
    let mut line_start = 0;
    for _ in 0..position.line {
        match text[line_start..].find('\n') {
            Some(i) => line_start += i + 1,
            None => return text.len(),
        }
    }
    let line_end = text[line_start..]
        .find('\n')
        .map_or(text.len(), |i| line_start + i);
    let line = &text[line_start..line_end];
    let mut units = 0u32;
    for (i, c) in line.char_indices() {
        if units >= position.character {
            return line_start + i;
        }
        units += match encoding {
            Encoding::Utf8 => u32::try_from(c.len_utf8()).unwrap_or(1),
            Encoding::Utf16 => u32::try_from(c.len_utf16()).unwrap_or(1),
        };
    }
    line_end
}

/// The LSP position of a byte offset.
fn position_of(text: &str, offset: usize, encoding: Encoding) -> Position {
    let offset = offset.min(text.len());
    let before = &text[..offset];
    let line = before.matches('\n').count();
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let character: usize = before[line_start..]
        .chars()
        .map(|c| match encoding {
            Encoding::Utf8 => c.len_utf8(),
            Encoding::Utf16 => c.len_utf16(),
        })
        .sum();
    Position {
        line: u32::try_from(line).unwrap_or(u32::MAX),
        character: u32::try_from(character).unwrap_or(u32::MAX),
    }
}

fn range_of(text: &str, span: Span, encoding: Encoding) -> Range {
    Range {
        start: position_of(text, span.start as usize, encoding),
        end: position_of(text, span.end as usize, encoding),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_read_within_bounds() {
        let mut input: &[u8] = b"Content-Length: 2\r\n\r\n{}content-length:3\n\n[1]";
        assert_eq!(
            read_frame(&mut input).unwrap(),
            Frame::Message(b"{}".to_vec())
        );
        // Any case, and a bare newline, as lenient readers take them.
        assert_eq!(
            read_frame(&mut input).unwrap(),
            Frame::Message(b"[1]".to_vec())
        );
        assert_eq!(read_frame(&mut input).unwrap(), Frame::End);
        // A length far beyond memory is never allocated: the input ends inside it.
        let mut input: &[u8] = b"Content-Length: 99999999999999\r\n\r\n{}";
        let error = read_frame(&mut input).unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::UnexpectedEof);
        assert!(
            error.to_string().contains("99999999999999 bytes"),
            "{error}"
        );
        for bad in [
            &b"Content-Length: -1\r\n\r\n"[..],
            b"Content-Length: 12",
            b"X-Other: 1\r\n\r\n{}",
            b"no colon\r\n\r\n",
        ] {
            let mut input = bad;
            assert!(
                read_frame(&mut input).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let endless = vec![b'x'; 100_000];
        assert!(read_frame(&mut endless.as_slice()).is_err());
    }

    #[test]
    fn a_message_over_the_limit_is_skipped_and_the_next_one_read() {
        let too_long = MAX_MESSAGE + 1;
        let mut input = format!("Content-Length: {too_long}\r\n\r\n").into_bytes();
        input.resize(input.len() + usize::try_from(too_long).unwrap(), b' ');
        input.extend_from_slice(b"Content-Length: 2\r\n\r\n{}");
        let mut input = input.as_slice();
        assert_eq!(read_frame(&mut input).unwrap(), Frame::TooLong(too_long));
        assert_eq!(
            read_frame(&mut input).unwrap(),
            Frame::Message(b"{}".to_vec())
        );
    }

    #[test]
    fn messages_that_are_not_json_rpc_are_skipped() {
        let body = r#"{"jsonrpc":"2.0","method":"initialized","params":{}}"#;
        let text = format!(
            "Content-Length: 5\r\n\r\n[[[[[Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let mut got = Vec::new();
        forward(&mut text.as_bytes(), &mut |m| {
            got.push(m);
            true
        })
        .unwrap();
        assert_eq!(got.len(), 1);
        assert!(matches!(&got[0], Message::Notification(n) if n.method == "initialized"));
    }

    #[test]
    fn positions_count_utf16_units_or_bytes() {
        let text = "a: é😀x\nb: 1\n";
        let x = text.find('x').unwrap();
        assert_eq!(
            position_of(text, x, Encoding::Utf16),
            Position {
                line: 0,
                character: 6
            }
        );
        assert_eq!(
            position_of(text, x, Encoding::Utf8),
            Position {
                line: 0,
                character: 9
            }
        );
        assert_eq!(
            offset_of(
                text,
                Position {
                    line: 0,
                    character: 6
                },
                Encoding::Utf16
            ),
            x
        );
        assert_eq!(
            offset_of(
                text,
                Position {
                    line: 1,
                    character: 3
                },
                Encoding::Utf8
            ),
            text.find('1').unwrap()
        );
    }
}
