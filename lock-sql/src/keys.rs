//! The names the backend puts in SQL: the lock table (`name` or `schema.name`) and the
//! columns of fenced updates, validated as plain identifiers and quoted per dialect.

fn is_ident(part: &str) -> bool {
    let mut chars = part.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && part.len() <= 63
}

/// Checks a table (or `schema.table`) or column identifier.
pub(crate) fn validate_ident(what: &str, name: &str) -> Result<(), String> {
    let parts: Vec<&str> = name.split('.').collect();
    if parts.len() <= 2 && parts.iter().all(|p| is_ident(p)) {
        Ok(())
    } else {
        Err(format!(
            "{what} {name:?} is not a plain SQL identifier ([A-Za-z_][A-Za-z0-9_]*, at most 63 bytes, optionally schema.name)"
        ))
    }
}

/// Quotes a validated identifier: `"a"."b"` or `` `a`.`b` ``.
pub(crate) fn quote(name: &str, quote: char) -> String {
    name.split('.')
        .map(|p| format!("{quote}{p}{quote}"))
        .collect::<Vec<_>>()
        .join(".")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers() {
        assert!(validate_ident("t", "locks").is_ok());
        assert!(validate_ident("t", "app.locks").is_ok());
        for bad in ["", "1x", "a-b", "a.b.c", "x;drop", "\"x\"", "a b"] {
            assert!(validate_ident("t", bad).is_err(), "{bad}");
        }
        assert_eq!(quote("a.b", '`'), "`a`.`b`");
    }
}
