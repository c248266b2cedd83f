//! Text for people, as every layer writes it: counted nouns (`2 branches`) and what a
//! terminal shows of a command's bytes. A leaf of the state layer (ARCHITECTURE.md,
//! "Layers"): it imports nothing of the crate.

/// TEXT as prodigy echoes it to a terminal: every control character but newline and tab
/// (ESC, which starts colour and cursor sequences, carriage return, backspace, the C1
/// controls, DEL) is written as a visible escape such as `\x1b`, so that what a command
/// printed cannot move the cursor, clear the screen or retitle the window. A carriage return
/// just before a newline (Windows line ends) is dropped. Files prodigy writes (logs,
/// `output_file`, events) keep the bytes as they were.
pub fn visible(text: &str) -> std::borrow::Cow<'_, str> {
    let shown = |c: char| c == '\n' || c == '\t' || !c.is_control();
    if text.chars().all(shown) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if shown(c) {
            out.push(c);
        } else if c == '\r' && chars.peek() == Some(&'\n') {
            // A Windows line end: the newline follows.
        } else {
            let code = u32::from(c);
            if code < 0x100 {
                let _ = std::fmt::Write::write_fmt(&mut out, format_args!("\\x{code:02x}"));
            } else {
                let _ = std::fmt::Write::write_fmt(&mut out, format_args!("\\u{{{code:x}}}"));
            }
        }
    }
    std::borrow::Cow::Owned(out)
}

/// `1 item`, `2 items`: N and NOUN, made plural unless N is 1 (with `es` after a
/// sibilant, as in `2 branches`).
pub fn count<N: Copy + std::fmt::Display + PartialEq + From<u8>>(n: N, noun: &str) -> String {
    if n == N::from(1) {
        format!("1 {noun}")
    } else if ["s", "sh", "ch", "x", "z"]
        .iter()
        .any(|end| noun.ends_with(end))
    {
        format!("{n} {noun}es")
    } else {
        format!("{n} {noun}s")
    }
}
