//! `notify:`: the events each entry fires on and its command (docs/language.md §2,
//! "Notifications").

use super::{Lowerer, one_of, suggest};
use crate::ast::{Command, Notify, NotifyEvent, Step};
use crate::diagnostics::{Code, Diagnostic};
use crate::plan::DEFAULT_NOTIFY_TIMEOUT;
use crate::shapes;
use crate::source::Spanned;
use crate::syntax::Node;

impl Lowerer<'_> {
    /// The `notify:` list; an entry with a problem is reported and left out.
    pub(crate) fn notify(&mut self, node: &Node) -> Vec<Notify> {
        let Some(entries) = node.as_seq() else {
            self.wrong_type(node, "`notify`", "a list of notifications");
            return Vec::new();
        };
        entries
            .iter()
            .filter_map(|e| self.notify_entry(e))
            .collect()
    }

    fn notify_entry(&mut self, node: &Node) -> Option<Notify> {
        let f = self
            .fields(node, "a `notify` entry", &shapes::NOTIFY)?
            .within("notify");
        let names = f.require(
            self,
            "on",
            "add `on: [finished, failed]` with the events it fires on",
            |lw, n, what| Some(lw.string_list(n, what)),
        );
        let on: Vec<Spanned<NotifyEvent>> = names
            .unwrap_or_default()
            .into_iter()
            .filter_map(|name| self.notify_event(&name))
            .collect();
        let shell = f.entry("shell");
        let claude = f.entry("claude");
        let command = match (shell, claude) {
            (Some(_), None) => f.template(self, "shell").map(Command::Shell),
            (None, Some(_)) => f.template(self, "claude").map(Command::Claude),
            (Some(s), Some(c)) => {
                self.push(
                    Diagnostic::new(
                        Code::MultipleCommands,
                        "a `notify` entry has both `shell` and `claude`",
                    )
                    .with_primary(c.key.span, "second command")
                    .with_label(s.key.span, "first command")
                    .with_help("split it into two entries; each runs exactly one command"),
                );
                None
            }
            (None, None) => {
                self.push(
                    Diagnostic::new(Code::NoCommand, "a `notify` entry needs a command")
                        .with_primary(node.span, "this notification runs nothing")
                        .with_help("add `shell:` or `claude:`"),
                );
                None
            }
        };
        let timeout = f
            .duration(self, "timeout")
            .unwrap_or_else(|| Spanned::new(DEFAULT_NOTIFY_TIMEOUT, node.span));
        let mut step = Step::new(node.span, command?);
        step.timeout = Some(timeout);
        (!on.is_empty()).then_some(Notify { on, step })
    }

    /// One event name of `on:`, or a [`Code::UnknownNotifyEvent`] with a did-you-mean.
    fn notify_event(&mut self, name: &Spanned<String>) -> Option<Spanned<NotifyEvent>> {
        if let Some((_, event)) = NotifyEvent::ALL.iter().find(|(n, _)| *n == name.value) {
            return Some(Spanned::new(*event, name.span));
        }
        let names: Vec<&str> = NotifyEvent::ALL.iter().map(|(n, _)| *n).collect();
        let help = match suggest(&name.value, names.iter().copied()) {
            Some(s) => format!("did you mean `{s}`?"),
            None => format!("use {}", one_of(&names)),
        };
        self.push(
            Diagnostic::new(
                Code::UnknownNotifyEvent,
                format!("`{}` is not a notification event", name.value),
            )
            .with_primary(name.span, format!("expected {}", one_of(&names)))
            .with_help(help),
        );
        None
    }
}
