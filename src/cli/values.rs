//! Value grammars shared by many options, with llama-server's acceptance rules: numbers are read
//! the way C's `strtol`/`strtof` read them (leading blanks skipped, trailing text ignored), and a
//! failure carries the same short reason upstream prints (`stoi`, `stof`, `invalid value`, ...).

/// A refusal reason, printed after `error while handling argument "X": `.
pub type Refusal = String;

/// Result of applying one value.
pub type Applied = Result<(), Refusal>;

/// The words upstream takes as "yes".
pub fn is_truthy(v: &str) -> bool {
    matches!(v, "on" | "enabled" | "true" | "1")
}

/// The words upstream takes as "no".
pub fn is_falsey(v: &str) -> bool {
    matches!(v, "off" | "disabled" | "false" | "0")
}

/// The words upstream takes as "decide for me".
pub fn is_autoy(v: &str) -> bool {
    matches!(v, "auto" | "-1")
}

/// A boolean given through an environment variable.
pub fn parse_bool(v: &str) -> Result<bool, Refusal> {
    if is_truthy(v) {
        Ok(true)
    } else if is_falsey(v) {
        Ok(false)
    } else {
        Err("invalid boolean value".into())
    }
}

/// `on|off|auto` as an optional boolean (`None` = auto); `what` names the option in the refusal.
pub fn parse_tristate(v: &str, what: &str) -> Result<Option<bool>, Refusal> {
    if is_truthy(v) {
        Ok(Some(true))
    } else if is_falsey(v) {
        Ok(Some(false))
    } else if is_autoy(v) {
        Ok(None)
    } else {
        Err(format!("error: unknown value for {what}: '{v}'\n"))
    }
}

/// Splits `s` into (optional sign, digits) after leading blanks, as `strtol` does.
fn integer_prefix(s: &str) -> Option<(bool, &str)> {
    let t = s.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    let (neg, rest) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let end = rest.bytes().take_while(u8::is_ascii_digit).count();
    (end > 0).then(|| (neg, &rest[..end]))
}

/// A 32-bit signed integer read like `std::stoi`.
pub fn stoi(s: &str) -> Result<i32, Refusal> {
    let (neg, digits) = integer_prefix(s).ok_or("stoi")?;
    let magnitude: i64 = digits.parse().map_err(|_| "stoi")?;
    let v = if neg { -magnitude } else { magnitude };
    i32::try_from(v).map_err(|_| "stoi".into())
}

/// An unsigned integer read like `std::stoull`: a leading minus wraps around, as in C.
pub fn stoull(s: &str, what: &str) -> Result<u64, Refusal> {
    let (neg, digits) = integer_prefix(s).ok_or(what)?;
    let magnitude: u64 = digits.parse().map_err(|_| what.to_string())?;
    Ok(if neg {
        magnitude.wrapping_neg()
    } else {
        magnitude
    })
}

/// Length of the longest prefix of `t` that `strtod` would read as a decimal number.
fn float_prefix_len(t: &str) -> usize {
    let b = t.as_bytes();
    let mut i = 0;
    if matches!(b.first(), Some(b'+' | b'-')) {
        i += 1;
    }
    let lower = t[i..].to_ascii_lowercase();
    for word in ["infinity", "inf", "nan"] {
        if lower.starts_with(word) {
            return i + word.len();
        }
    }
    let int_digits = b[i..].iter().take_while(|c| c.is_ascii_digit()).count();
    i += int_digits;
    let mut frac_digits = 0;
    if b.get(i) == Some(&b'.') {
        frac_digits = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
        if int_digits + frac_digits > 0 {
            i += 1 + frac_digits;
        }
    }
    if int_digits + frac_digits == 0 {
        return 0;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        let mut j = i + 1;
        if matches!(b.get(j), Some(b'+' | b'-')) {
            j += 1;
        }
        let exp_digits = b[j..].iter().take_while(|c| c.is_ascii_digit()).count();
        if exp_digits > 0 {
            i = j + exp_digits;
        }
    }
    i
}

/// A float read like `std::stod`; `what` is the reason given on failure (`stof`, `stod`) and
/// `f32_range` refuses values a 32-bit float cannot hold, as `stof` does.
fn c_float(s: &str, what: &str, f32_range: bool) -> Result<(f64, usize), Refusal> {
    let t = s.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    let n = float_prefix_len(t);
    if n == 0 {
        return Err(what.into());
    }
    let text = &t[..n];
    let v: f64 = text.parse().map_err(|_| what.to_string())?;
    let literal_inf = text.to_ascii_lowercase().contains("inf");
    let overflow = if f32_range {
        (v as f32).is_infinite()
    } else {
        v.is_infinite()
    };
    if overflow && !literal_inf {
        return Err(what.into());
    }
    Ok((v, s.len() - t.len() + n))
}

/// A 32-bit float read like `std::stof`.
pub fn stof(s: &str) -> Result<f32, Refusal> {
    c_float(s, "stof", true).map(|(v, _)| v as f32)
}

/// A 64-bit float that must fill the whole (blank-trimmed) text, else `invalid value`.
pub fn strict_f64(s: &str) -> Result<f64, Refusal> {
    let t = s.trim();
    let (v, used) = c_float(t, "stod", false)?;
    if used != t.len() {
        return Err("invalid value".into());
    }
    Ok(v)
}

/// Splits on runs of `,` and `/` the way upstream splits `-ts` and `-fitt`: an empty leading field
/// is kept, an empty trailing one is not.
pub fn split_list(s: &str) -> Vec<&str> {
    let mut parts: Vec<&str> = s.split([',', '/']).collect();
    let mut kept = Vec::with_capacity(parts.len());
    for (i, p) in parts.drain(..).enumerate() {
        if i == 0 || !p.is_empty() {
            kept.push(p);
        }
    }
    if kept.len() == 1 && kept[0].is_empty() {
        kept.clear();
    }
    kept
}

/// A comma-separated row where `"..."` quotes a field and `""` inside quotes is a literal quote.
pub fn csv_row(s: &str) -> Vec<String> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if !quoted && field.is_empty() => quoted = true,
            '"' if quoted => {
                if chars.peek() == Some(&'"') {
                    field.push('"');
                    chars.next();
                } else {
                    quoted = false;
                }
            }
            ',' if !quoted => fields.push(std::mem::take(&mut field)),
            _ => field.push(c),
        }
    }
    fields.push(field);
    fields
}

/// Comma-separated, blank-trimmed, empties dropped (aliases, tags).
pub fn trimmed_items(s: &str) -> impl Iterator<Item = String> + '_ {
    s.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(String::from)
}

/// Backslash escapes upstream expands when `--escape` is on: `\n \r \t \' \" \\ \xHH`.
pub fn process_escapes(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 1 < b.len() {
            i += 1;
            match b[i] {
                b'n' => out.push(b'\n'),
                b'r' => out.push(b'\r'),
                b't' => out.push(b'\t'),
                b'\'' | b'"' | b'\\' => out.push(b[i]),
                b'x' if i + 2 < b.len()
                    && b[i + 1].is_ascii_hexdigit()
                    && b[i + 2].is_ascii_hexdigit() =>
                {
                    let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("0");
                    out.push(u8::from_str_radix(hex, 16).unwrap_or(0));
                    i += 2;
                }
                other => {
                    out.push(b'\\');
                    out.push(other);
                }
            }
        } else {
            out.push(b[i]);
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Reads a text file an option names, refusing with upstream's wording when it cannot be opened.
pub fn read_text_file(path: &str) -> Result<String, Refusal> {
    std::fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .map_err(|_| format!("error: failed to open file '{path}'\n"))
}

/// Parses JSON text, refusing with the parser's own description.
pub fn parse_json(text: &str) -> Result<serde_json::Value, Refusal> {
    serde_json::from_str(text).map_err(|e| format!("[json.exception.parse_error] {e}"))
}

/// A byte size such as `38G`, `512M`, `1.5T` or a plain byte count; units are powers of 1024.
pub fn parse_size(s: &str) -> Result<u64, Refusal> {
    let t = s.trim();
    let (num, unit) = match t.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => (&t[..i], &t[i..]),
        None => (t, ""),
    };
    let scale: f64 = match unit.to_ascii_uppercase().trim_end_matches(['B', 'I']) {
        "" => 1.0,
        "K" => 1024.0,
        "M" => 1024.0 * 1024.0,
        "G" => 1024.0 * 1024.0 * 1024.0,
        "T" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return Err(format!("invalid size '{s}': unit must be K, M, G or T")),
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("invalid size '{s}': expected a number such as 38G"))?;
    if !n.is_finite() || n < 0.0 {
        return Err(format!("invalid size '{s}': must be a non-negative number"));
    }
    Ok((n * scale) as u64)
}

/// A JSON schema option's value converted to GBNF while the command line is read, as upstream
/// converts it (a schema it cannot convert refuses the option).
pub fn schema_grammar(text: &str) -> Result<String, Refusal> {
    let schema = parse_json(text)?;
    crate::grammar::schema::schema_to_grammar(&schema).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stoi_reads_like_c() {
        assert_eq!(stoi("42"), Ok(42));
        assert_eq!(stoi("  -7xyz"), Ok(-7));
        assert_eq!(stoi("+3"), Ok(3));
        assert_eq!(stoi("abc"), Err("stoi".into()));
        assert_eq!(stoi(""), Err("stoi".into()));
        assert_eq!(stoi("99999999999"), Err("stoi".into()));
    }

    #[test]
    fn stof_reads_like_c() {
        assert_eq!(stof("0.5"), Ok(0.5));
        assert_eq!(stof("1e-2x"), Ok(0.01));
        assert_eq!(stof(".5"), Ok(0.5));
        assert_eq!(stof("3."), Ok(3.0));
        assert_eq!(stof("-inf"), Ok(f32::NEG_INFINITY));
        assert!(stof("nan").is_ok_and(f32::is_nan));
        assert_eq!(stof("x"), Err("stof".into()));
        assert_eq!(stof("1e99"), Err("stof".into()));
    }

    #[test]
    fn stoull_wraps_negative_like_c() {
        assert_eq!(stoull("-1", "stoul"), Ok(u64::MAX));
        assert_eq!(stoull("12", "stoul"), Ok(12));
        assert_eq!(stoull("z", "stoul"), Err("stoul".into()));
    }

    #[test]
    fn strict_float_needs_whole_text() {
        assert_eq!(strict_f64(" 2.5 "), Ok(2.5));
        assert_eq!(strict_f64("2.5x"), Err("invalid value".into()));
        assert_eq!(strict_f64("x"), Err("stod".into()));
    }

    #[test]
    fn list_split_matches_upstream() {
        assert_eq!(split_list("3,1"), vec!["3", "1"]);
        assert_eq!(split_list("3/1"), vec!["3", "1"]);
        assert_eq!(split_list("3,,/1,"), vec!["3", "1"]);
        assert_eq!(split_list(",3"), vec!["", "3"]);
        assert!(split_list("").is_empty());
    }

    #[test]
    fn csv_row_handles_quotes() {
        assert_eq!(
            csv_row(r#"a,"b, c","d ""e""",f"#),
            vec!["a", "b, c", r#"d "e""#, "f"]
        );
        assert_eq!(csv_row(""), vec![""]);
    }

    #[test]
    fn escapes_expand() {
        assert_eq!(process_escapes(r"a\nb\x41\q\\"), "a\nbA\\q\\");
    }

    #[test]
    fn sizes_use_binary_units() {
        assert_eq!(parse_size("38G"), Ok(38 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("1024"), Ok(1024));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("G").is_err());
    }
}
