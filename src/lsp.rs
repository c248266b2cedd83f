//! `prodigy lsp`: a language server over stdio.
//!
//! It publishes the same diagnostics as `check` when a document is opened, changed or saved,
//! shows the documentation of the key under the cursor, and completes keys and variables.
//! Positions are UTF-16 code units unless the client offers UTF-8.
//! The protocol plumbing lives here; what to say comes from `prodigy_compiler::ide`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use lsp_server::{Connection, ExtractError, Message, Notification, Request, Response};
use lsp_types::notification::Notification as _;
use lsp_types::request::Request as _;
use lsp_types::{
    CodeAction, CodeActionKind, CodeActionOrCommand, CodeActionParams,
    CodeActionProviderCapability, CompletionItem, CompletionItemKind, CompletionOptions,
    CompletionParams, CompletionResponse, Diagnostic, DiagnosticRelatedInformation,
    DiagnosticSeverity, DidChangeTextDocumentParams, DidCloseTextDocumentParams,
    DidOpenTextDocumentParams, DidSaveTextDocumentParams, Hover, HoverContents, HoverParams,
    HoverProviderCapability, InitializeParams, Location, MarkupContent, MarkupKind, NumberOrString,
    Position, PositionEncodingKind, PublishDiagnosticsParams, Range, ServerCapabilities,
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

struct Server {
    connection: Connection,
    encoding: Encoding,
    documents: BTreeMap<String, String>,
    /// The diagnostics last published for each document, for their fixes (code actions).
    published: BTreeMap<String, Vec<prodigy_compiler::diagnostics::Diagnostic>>,
    /// ShellCheck, when it is on `PATH`.
    shellcheck: Option<crate::shellcheck::ShellCheck>,
}

/// Runs the server until the client says `exit`. Returns the process exit code.
pub(crate) fn run() -> u8 {
    let (connection, io_threads) = Connection::stdio();
    let code = match serve(connection) {
        Ok(()) => 0,
        Err(e) => {
            crate::err(&format!("prodigy lsp: {e}\n"));
            1
        }
    };
    if io_threads.join().is_err() {
        return 1;
    }
    code
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
        published: BTreeMap::new(),
        shellcheck: crate::shellcheck::ShellCheck::find(),
    };
    server.main_loop()
}

impl Server {
    fn main_loop(&mut self) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        while let Ok(message) = self.connection.receiver.recv() {
            match message {
                Message::Request(request) => {
                    if self.connection.handle_shutdown(&request)? {
                        return Ok(());
                    }
                    self.request(request)?;
                }
                Message::Notification(notification) => self.notification(notification)?,
                Message::Response(_) => {}
            }
        }
        Ok(())
    }

    fn request(
        &mut self,
        request: Request,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let response = match request.method.as_str() {
            lsp_types::request::HoverRequest::METHOD => {
                let (id, params) = extract::<HoverParams>(request)?;
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
                let (id, params) = extract::<CompletionParams>(request)?;
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
                let (id, params) = extract::<CodeActionParams>(request)?;
                Response::new_ok(id, self.code_actions(&params))
            }
            _ => Response::new_err(
                request.id,
                lsp_server::ErrorCode::MethodNotFound as i32,
                format!("`{}` is not supported", request.method),
            ),
        };
        self.connection.sender.send(Message::Response(response))?;
        Ok(())
    }

    fn notification(
        &mut self,
        notification: Notification,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        match notification.method.as_str() {
            lsp_types::notification::DidOpenTextDocument::METHOD => {
                let params: DidOpenTextDocumentParams =
                    serde_json::from_value(notification.params)?;
                let uri = params.text_document.uri;
                self.documents
                    .insert(uri.as_str().to_owned(), params.text_document.text);
                self.publish(&uri)?;
            }
            lsp_types::notification::DidChangeTextDocument::METHOD => {
                let params: DidChangeTextDocumentParams =
                    serde_json::from_value(notification.params)?;
                let uri = params.text_document.uri;
                // Full sync: the last change holds the whole text.
                if let Some(change) = params.content_changes.into_iter().last() {
                    self.documents.insert(uri.as_str().to_owned(), change.text);
                }
                self.publish(&uri)?;
            }
            lsp_types::notification::DidSaveTextDocument::METHOD => {
                let params: DidSaveTextDocumentParams =
                    serde_json::from_value(notification.params)?;
                if let Some(text) = params.text {
                    self.documents
                        .insert(params.text_document.uri.as_str().to_owned(), text);
                }
                self.publish(&params.text_document.uri)?;
            }
            lsp_types::notification::DidCloseTextDocument::METHOD => {
                let params: DidCloseTextDocumentParams =
                    serde_json::from_value(notification.params)?;
                self.documents.remove(params.text_document.uri.as_str());
                self.published.remove(params.text_document.uri.as_str());
                self.send_diagnostics(params.text_document.uri, Vec::new())?;
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
        let surroundings = prodigy_compiler::Surroundings {
            file_exists: &file_exists,
            read_file: &read_file,
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
        self.send_diagnostics(uri.clone(), diagnostics)
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
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let params = PublishDiagnosticsParams {
            uri,
            diagnostics,
            version: None,
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

fn extract<P: serde::de::DeserializeOwned>(
    request: Request,
) -> Result<(lsp_server::RequestId, P), Box<dyn std::error::Error + Send + Sync>> {
    let method = request.method.clone();
    request
        .extract(&method)
        .map_err(|e: ExtractError<Request>| format!("bad `{method}` request: {e:?}").into())
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
