//! Keeps secrets out of what the operations commands print: passwords in
//! URLs (`postgres://app:secret@db/shop` → `postgres://app:***@db/shop`)
//! and `password=` / `sasl.password=` settings.

/// `text` with every URL password and `password=` value replaced by `***`.
pub fn redact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        // The authority ends at the first `/`, `?`, `#`, quote or whitespace.
        let end = tail
            .find(|c: char| matches!(c, '/' | '?' | '#' | '"' | '\'' | '`') || c.is_whitespace())
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        match authority.rfind('@') {
            Some(userinfo_end) => {
                let userinfo = &authority[..userinfo_end];
                match userinfo.find(':') {
                    Some(colon) => {
                        out.push_str(&userinfo[..colon]);
                        out.push_str(":***");
                    }
                    None => out.push_str(userinfo),
                }
                out.push_str(&authority[userinfo_end..]);
            }
            None => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    redact_settings(&out)
}

/// `password=...` (also `sasl.password=...`, `password = '...'`) in
/// key-value connection strings.
fn redact_settings(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("password") {
        let (head, tail) = rest.split_at(at + "password".len());
        out.push_str(head);
        let trimmed = tail.trim_start_matches([' ', '"']);
        let Some(value) = trimmed.strip_prefix('=').or_else(|| trimmed.strip_prefix(':')) else {
            rest = tail;
            continue;
        };
        out.push_str(&tail[..tail.len() - value.len()]);
        let value_trimmed = value.trim_start_matches(' ');
        out.push_str(&value[..value.len() - value_trimmed.len()]);
        let (quote, body) = match value_trimmed.chars().next() {
            Some(q @ ('\'' | '"')) => (Some(q), &value_trimmed[1..]),
            _ => (None, value_trimmed),
        };
        let end = match quote {
            Some(q) => body.find(q).map_or(body.len(), |i| i + 1),
            None => body
                .find(|c: char| c.is_whitespace() || matches!(c, ',' | ';' | '}' | '&'))
                .unwrap_or(body.len()),
        };
        if let Some(q) = quote {
            out.push(q);
        }
        out.push_str("***");
        if let Some(q) = quote {
            if end <= body.len() && body[..end].ends_with(q) {
                out.push(q);
            }
        }
        rest = &body[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_in_urls_and_settings_are_hidden() {
        assert_eq!(
            redact("cannot connect to postgres://app:s3cret@db:5432/shop now"),
            "cannot connect to postgres://app:***@db:5432/shop now"
        );
        assert_eq!(redact("redis://:pw@127.0.0.1:6379/"), "redis://:***@127.0.0.1:6379/");
        assert_eq!(redact("postgres://app@db/shop"), "postgres://app@db/shop");
        assert_eq!(redact("http://127.0.0.1:9464/metrics"), "http://127.0.0.1:9464/metrics");
        assert_eq!(
            redact("host=db password=s3cret user=app"),
            "host=db password=*** user=app"
        );
        assert_eq!(redact("password = 'a b'; x"), "password = '***'; x");
        assert_eq!(
            redact(r#"{"sasl.password":"s3cret","x":1}"#),
            r#"{"sasl.password":"***","x":1}"#
        );
        let text = redact("a postgres://u:p1@h/d and postgres://v:p2@h/d");
        assert!(!text.contains("p1") && !text.contains("p2"), "{text}");
    }
}
