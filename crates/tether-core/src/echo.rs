//! What an error may repeat of what a caller sent: at most a short prefix of
//! any id or name, so an answer never grows with the request.
//!
//! A refusal that names the caller's `session_id`, `command_id`,
//! `device_id`, `approval_id`, `operation_id`, invocation id, capability,
//! resource or tool name passes it through [`id`]: up to
//! [`ECHO_CHARS_MAX`] characters are kept whole, a longer value becomes its
//! first [`ECHO_CHARS_MAX`] characters, a marker and its length
//! (`abc…[+499936 chars]`). Free text the caller sent that an error quotes
//! (a parser's message naming a member) passes through [`text`] with
//! [`TEXT_ECHO_CHARS_MAX`].
//!
//! **Never belongs here:** deciding whether a value is valid (the kernel and
//! the surfaces do), or bounding what is *stored* (the kernel's text bound).

use std::borrow::Cow;

/// Most characters of a caller's id or name an error repeats.
pub const ECHO_CHARS_MAX: usize = 64;

/// Most characters of a caller's free text (or a message quoting it) an
/// error repeats.
pub const TEXT_ECHO_CHARS_MAX: usize = 256;

// An echoed id fits in an echoed text.
const _: () = assert!(ECHO_CHARS_MAX <= TEXT_ECHO_CHARS_MAX);

/// `s` as an error may repeat it: whole up to [`ECHO_CHARS_MAX`] characters,
/// else its prefix, a marker and how many characters were left out.
pub fn id(s: &str) -> Cow<'_, str> {
    cut(s, ECHO_CHARS_MAX)
}

/// `s` as an error may quote it: whole up to [`TEXT_ECHO_CHARS_MAX`]
/// characters, else its prefix and the marker.
pub fn text(s: &str) -> Cow<'_, str> {
    cut(s, TEXT_ECHO_CHARS_MAX)
}

/// `s` whole up to `max` characters, else its first `max` characters, `…`
/// and `[+N chars]` (N the characters left out).
pub fn cut(s: &str, max: usize) -> Cow<'_, str> {
    match s.char_indices().nth(max) {
        None => Cow::Borrowed(s),
        Some((at, _)) => {
            let left = s[at..].chars().count();
            Cow::Owned(format!("{}…[+{left} chars]", &s[..at]))
        }
    }
}

/// Whether `s` would be shortened by [`id`].
pub fn is_long(s: &str) -> bool {
    s.char_indices().nth(ECHO_CHARS_MAX).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_values_are_kept_whole_and_long_ones_say_how_long_they_were() {
        assert_eq!(id("mhs_s_01"), "mhs_s_01");
        let exact = "x".repeat(ECHO_CHARS_MAX);
        assert_eq!(id(&exact), exact.as_str());
        let long = "y".repeat(500_000);
        let shown = id(&long);
        assert!(shown.starts_with(&"y".repeat(ECHO_CHARS_MAX)));
        assert!(shown.ends_with(&format!("…[+{} chars]", 500_000 - ECHO_CHARS_MAX)));
        assert!(shown.len() < 100, "{shown}");
        assert!(is_long(&long) && !is_long(&exact));
    }

    #[test]
    fn multibyte_text_is_cut_on_a_character_boundary() {
        let s = "é".repeat(300);
        let shown = text(&s);
        assert!(shown.starts_with(&"é".repeat(TEXT_ECHO_CHARS_MAX)));
        assert!(shown.ends_with("…[+44 chars]"), "{shown}");
    }
}
