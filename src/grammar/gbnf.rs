//! The GBNF language as upstream's parser reads it: rules `name ::= alternatives`, literals with
//! `\x \u \U \t \r \n` escapes, character classes (`[a-z]`, `[^"]`), `.`, groups, the repetition
//! operators `* + ? {m} {m,} {m,n}` (rewritten into helper rules the way upstream rewrites them, so
//! the same limits apply), comments, and token terminals `<[id]>`, `<text>` and `!<...>`.
//!
//! The result is a flat element list per rule, each alternative ended by `Alt` and the rule by
//! `End`, which is what the matcher walks.

use std::collections::HashMap;

/// Upstream's cap on rules produced by repetitions (and on `{m}` counts).
const MAX_REPETITION: u64 = 2000;

/// One element of a rule. `RangeUpper` and `CharAlt` only ever follow a `Char`/`CharNot`
/// (or each other) and extend that character class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Elem {
    End,
    Alt,
    RuleRef(u32),
    Char(u32),
    CharNot(u32),
    RangeUpper(u32),
    CharAlt(u32),
    CharAny,
    Token(u32),
    TokenNot(u32),
}

impl Elem {
    pub fn ends_sequence(self) -> bool {
        matches!(self, Elem::End | Elem::Alt)
    }
}

/// Why a grammar was refused; the text names the place, as upstream's log line does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrammarError(pub String);

impl std::fmt::Display for GrammarError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for GrammarError {}

fn err<T>(msg: impl Into<String>) -> Result<T, GrammarError> {
    Err(GrammarError(msg.into()))
}

/// A parsed grammar: rules by id, and the id of each name (including the generated helper
/// rules, named `base_N` as upstream names them).
#[derive(Clone, Debug)]
pub struct Rules {
    pub rules: Vec<Vec<Elem>>,
    pub symbols: HashMap<String, u32>,
}

/// Resolves `<text>` token terminals: the text's single token, or `None` when it is not exactly
/// one token.
pub type TokenLookup<'a> = &'a dyn Fn(&str) -> Option<u32>;

/// Where the last item of a sequence starts (what a repetition operator applies to), and how
/// many rules it already stands for (repetitions multiply it, against upstream's limit).
struct LastItem {
    start: usize,
    n_rules: u64,
}

struct Parser<'a> {
    src: &'a [u8],
    symbols: HashMap<String, u32>,
    rules: Vec<Vec<Elem>>,
    lookup: Option<TokenLookup<'a>>,
}

fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'-'
}

impl<'a> Parser<'a> {
    fn at(&self, pos: usize) -> u8 {
        self.src.get(pos).copied().unwrap_or(0)
    }

    fn rest(&self, pos: usize) -> String {
        String::from_utf8_lossy(&self.src[pos.min(self.src.len())..]).into_owned()
    }

    fn symbol(&mut self, name: &str) -> u32 {
        let next = self.symbols.len() as u32;
        *self.symbols.entry(name.to_string()).or_insert(next)
    }

    fn generated_symbol(&mut self, base: &str) -> u32 {
        let next = self.symbols.len() as u32;
        self.symbols.insert(format!("{base}_{next}"), next);
        next
    }

    fn add_rule(&mut self, id: u32, rule: Vec<Elem>) {
        let id = id as usize;
        if self.rules.len() <= id {
            self.rules.resize(id + 1, Vec::new());
        }
        self.rules[id] = rule;
    }

    fn space(&self, mut pos: usize, newline_ok: bool) -> usize {
        loop {
            match self.at(pos) {
                b' ' | b'\t' => pos += 1,
                b'\r' | b'\n' if newline_ok => pos += 1,
                b'#' => {
                    while !matches!(self.at(pos), 0 | b'\r' | b'\n') {
                        pos += 1;
                    }
                }
                _ => return pos,
            }
        }
    }

    fn name_end(&self, pos: usize) -> Result<usize, GrammarError> {
        let mut end = pos;
        while is_word(self.at(end)) {
            end += 1;
        }
        if end == pos {
            return err(format!("expecting name at {}", self.rest(pos)));
        }
        Ok(end)
    }

    fn int_end(&self, pos: usize) -> Result<usize, GrammarError> {
        let mut end = pos;
        while self.at(end).is_ascii_digit() {
            end += 1;
        }
        if end == pos {
            return err(format!("expecting integer at {}", self.rest(pos)));
        }
        Ok(end)
    }

    fn hex(&self, pos: usize, size: usize) -> Result<(u32, usize), GrammarError> {
        let mut value = 0u32;
        let mut end = pos;
        while end < pos + size {
            let Some(d) = (self.at(end) as char).to_digit(16) else {
                break;
            };
            value = (value << 4) + d;
            end += 1;
        }
        if end != pos + size {
            return err(format!("expecting {size} hex chars at {}", self.rest(pos)));
        }
        Ok((value, end))
    }

    /// One character of a literal or class: an escape or one UTF-8 sequence.
    fn char(&self, pos: usize) -> Result<(u32, usize), GrammarError> {
        match self.at(pos) {
            0 => err("unexpected end of input"),
            b'\\' => match self.at(pos + 1) {
                b'x' => self.hex(pos + 2, 2),
                b'u' => self.hex(pos + 2, 4),
                b'U' => self.hex(pos + 2, 8),
                b't' => Ok(('\t' as u32, pos + 2)),
                b'r' => Ok(('\r' as u32, pos + 2)),
                b'n' => Ok(('\n' as u32, pos + 2)),
                c @ (b'\\' | b'"' | b'[' | b']' | b'-') => Ok((c as u32, pos + 2)),
                _ => err(format!("unknown escape at {}", self.rest(pos))),
            },
            _ => {
                // The source is a &str, so a sequence is whole and valid.
                let s = std::str::from_utf8(&self.src[pos..]).unwrap_or_default();
                match s.chars().next() {
                    Some(c) => Ok((c as u32, pos + c.len_utf8())),
                    None => err("unexpected end of input"),
                }
            }
        }
    }

    fn token(&self, pos: usize) -> Result<(u32, usize), GrammarError> {
        if self.at(pos) != b'<' {
            return err(format!("expecting '<' at {}", self.rest(pos)));
        }
        let mut p = pos + 1;
        if self.at(p) == b'[' {
            p += 1;
            let end = self.int_end(p)?;
            let digits = std::str::from_utf8(&self.src[p..end]).unwrap_or_default();
            let id = match digits.parse::<u64>() {
                Ok(id) if id <= u32::MAX as u64 => id as u32,
                _ => return err(format!("parsed token id is too big at {}", self.rest(p))),
            };
            p = end;
            if self.at(p) != b']' {
                return err(format!("expecting ']' at {}", self.rest(p)));
            }
            p += 1;
            if self.at(p) != b'>' {
                return err(format!("expecting '>' at {}", self.rest(p)));
            }
            return Ok((id, p + 1));
        }
        let Some(lookup) = self.lookup else {
            return err(format!("no vocab to parse token at {}", self.rest(pos)));
        };
        while !matches!(self.at(p), 0 | b'>') {
            p += 1;
        }
        if self.at(p) != b'>' {
            return err(format!("expecting '>' at {}", self.rest(p)));
        }
        p += 1;
        let text = String::from_utf8_lossy(&self.src[pos..p]);
        match lookup(&text) {
            Some(id) => Ok((id, p)),
            None => err(format!("invalid token '{text}'")),
        }
    }

    fn alternates(
        &mut self,
        pos: usize,
        name: &str,
        id: u32,
        nested: bool,
    ) -> Result<usize, GrammarError> {
        let mut rule = Vec::new();
        let mut pos = self.sequence(pos, name, &mut rule, nested)?;
        while self.at(pos) == b'|' {
            rule.push(Elem::Alt);
            pos = self.space(pos + 1, true);
            pos = self.sequence(pos, name, &mut rule, nested)?;
        }
        rule.push(Elem::End);
        self.add_rule(id, rule);
        Ok(pos)
    }

    /// Rewrites the last item `S` of `rule` for `S{min,max}` (`max = None`: unbounded) into `S`
    /// repeated `min` times followed by a chain of optional helper rules, as upstream does.
    fn repeat(
        &mut self,
        name: &str,
        rule: &mut Vec<Elem>,
        last: &mut LastItem,
        (min, max): (u64, Option<u64>),
        pos: usize,
    ) -> Result<(), GrammarError> {
        let (last_start, n_prev_rules) = (last.start, &mut last.n_rules);
        if last_start == rule.len() {
            return err(format!(
                "expecting preceding item to */+/?/{{ at {}",
                self.rest(pos)
            ));
        }
        let item: Vec<Elem> = rule[last_start..].to_vec();
        let total = match max {
            Some(m) if m > 0 => m,
            _ if min > 0 => min,
            _ => 1,
        };
        if n_prev_rules.saturating_mul(total) > MAX_REPETITION {
            return err("number of rules that are going to be repeated multiplied by the new repetition exceeds sane defaults, please reduce the number of repetitions or rule complexity");
        }
        if min == 0 {
            rule.truncate(last_start);
        } else {
            for _ in 1..min {
                rule.extend_from_slice(&item);
            }
        }
        let n_opt = match max {
            None => 1,
            Some(m) => m.saturating_sub(min),
        };
        let mut last_id = 0u32;
        for i in 0..n_opt {
            let id = self.generated_symbol(name);
            let mut rec = item.clone();
            if i > 0 || max.is_none() {
                rec.push(Elem::RuleRef(if max.is_none() { id } else { last_id }));
            }
            rec.push(Elem::Alt);
            rec.push(Elem::End);
            self.add_rule(id, rec);
            last_id = id;
        }
        if n_opt > 0 {
            rule.push(Elem::RuleRef(last_id));
        }
        *n_prev_rules *= total;
        Ok(())
    }

    fn sequence(
        &mut self,
        src: usize,
        name: &str,
        rule: &mut Vec<Elem>,
        nested: bool,
    ) -> Result<usize, GrammarError> {
        let mut last = LastItem {
            start: rule.len(),
            n_rules: 1,
        };
        let mut pos = src;
        loop {
            let c = self.at(pos);
            match c {
                0 => break,
                b'"' => {
                    pos += 1;
                    last = LastItem {
                        start: rule.len(),
                        n_rules: 1,
                    };
                    while self.at(pos) != b'"' {
                        let (ch, next) = self.char(pos)?;
                        pos = next;
                        rule.push(Elem::Char(ch));
                    }
                    pos = self.space(pos + 1, nested);
                }
                b'[' => {
                    pos += 1;
                    let negated = self.at(pos) == b'^';
                    if negated {
                        pos += 1;
                    }
                    last = LastItem {
                        start: rule.len(),
                        n_rules: 1,
                    };
                    while self.at(pos) != b']' {
                        let (ch, next) = self.char(pos)?;
                        pos = next;
                        rule.push(if last.start < rule.len() {
                            Elem::CharAlt(ch)
                        } else if negated {
                            Elem::CharNot(ch)
                        } else {
                            Elem::Char(ch)
                        });
                        if self.at(pos) == b'-' && self.at(pos + 1) != b']' {
                            if self.at(pos + 1) == 0 {
                                return err("unexpected end of input");
                            }
                            let (upper, next) = self.char(pos + 1)?;
                            pos = next;
                            rule.push(Elem::RangeUpper(upper));
                        }
                    }
                    pos = self.space(pos + 1, nested);
                }
                b'<' | b'!' => {
                    let negated = c == b'!';
                    let (id, end) = self.token(if negated { pos + 1 } else { pos })?;
                    last = LastItem {
                        start: rule.len(),
                        n_rules: 1,
                    };
                    rule.push(if negated {
                        Elem::TokenNot(id)
                    } else {
                        Elem::Token(id)
                    });
                    pos = self.space(end, nested);
                }
                c if is_word(c) => {
                    let end = self.name_end(pos)?;
                    let sym = String::from_utf8_lossy(&self.src[pos..end]).into_owned();
                    let id = self.symbol(&sym);
                    pos = self.space(end, nested);
                    last = LastItem {
                        start: rule.len(),
                        n_rules: 1,
                    };
                    rule.push(Elem::RuleRef(id));
                }
                b'(' => {
                    pos = self.space(pos + 1, true);
                    let n_before = self.symbols.len() as u64;
                    let sub = self.generated_symbol(name);
                    pos = self.alternates(pos, name, sub, true)?;
                    last = LastItem {
                        start: rule.len(),
                        n_rules: (self.symbols.len() as u64).saturating_sub(n_before).max(1),
                    };
                    rule.push(Elem::RuleRef(sub));
                    if self.at(pos) != b')' {
                        return err(format!("expecting ')' at {}", self.rest(pos)));
                    }
                    pos = self.space(pos + 1, nested);
                }
                b'.' => {
                    last = LastItem {
                        start: rule.len(),
                        n_rules: 1,
                    };
                    rule.push(Elem::CharAny);
                    pos = self.space(pos + 1, nested);
                }
                b'*' | b'+' | b'?' => {
                    pos = self.space(pos + 1, nested);
                    let (min, max) = match c {
                        b'*' => (0, None),
                        b'+' => (1, None),
                        _ => (0, Some(1)),
                    };
                    self.repeat(name, rule, &mut last, (min, max), pos)?;
                }
                b'{' => {
                    pos = self.space(pos + 1, nested);
                    if !self.at(pos).is_ascii_digit() {
                        return err(format!("expecting an int at {}", self.rest(pos)));
                    }
                    let end = self.int_end(pos)?;
                    let min = self.number(pos, end);
                    pos = self.space(end, nested);
                    let mut max = None;
                    match self.at(pos) {
                        b'}' => {
                            max = Some(min);
                            pos = self.space(pos + 1, nested);
                        }
                        b',' => {
                            pos = self.space(pos + 1, nested);
                            if self.at(pos).is_ascii_digit() {
                                let end = self.int_end(pos)?;
                                max = Some(self.number(pos, end));
                                pos = self.space(end, nested);
                            }
                            if self.at(pos) != b'}' {
                                return err(format!("expecting '}}' at {}", self.rest(pos)));
                            }
                            pos = self.space(pos + 1, nested);
                        }
                        _ => return err(format!("expecting ',' at {}", self.rest(pos))),
                    }
                    if min > MAX_REPETITION {
                        return err("number of repetitions exceeds sane defaults, please reduce the number of repetitions");
                    }
                    let max = max.filter(|&m| m <= MAX_REPETITION);
                    self.repeat(name, rule, &mut last, (min, max), pos)?;
                }
                _ => break,
            }
        }
        Ok(pos)
    }

    /// Digits upstream reads with `stoull`; a count too large for it is out of range there too.
    fn number(&self, start: usize, end: usize) -> u64 {
        std::str::from_utf8(&self.src[start..end])
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(u64::MAX)
    }

    fn rule(&mut self, src: usize) -> Result<usize, GrammarError> {
        let name_end = self.name_end(src)?;
        let mut pos = self.space(name_end, false);
        let name = String::from_utf8_lossy(&self.src[src..name_end]).into_owned();
        let id = self.symbol(&name);
        if !self.src[pos.min(self.src.len())..].starts_with(b"::=") {
            return err(format!("expecting ::= at {}", self.rest(pos)));
        }
        pos = self.space(pos + 3, true);
        pos = self.alternates(pos, &name, id, false)?;
        match self.at(pos) {
            b'\r' => pos += if self.at(pos + 1) == b'\n' { 2 } else { 1 },
            b'\n' => pos += 1,
            0 => {}
            _ => return err(format!("expecting newline or end at {}", self.rest(pos))),
        }
        Ok(self.space(pos, true))
    }
}

/// Parses GBNF text. Every referenced rule must be defined.
pub fn parse(src: &str, lookup: Option<TokenLookup>) -> Result<Rules, GrammarError> {
    // Upstream reads the text as a C string: it ends at the first NUL.
    let src = src.split('\0').next().unwrap_or_default();
    let mut p = Parser {
        src: src.as_bytes(),
        symbols: HashMap::new(),
        rules: Vec::new(),
        lookup,
    };
    let mut pos = p.space(0, true);
    while p.at(pos) != 0 {
        pos = p.rule(pos)?;
    }
    for rule in &p.rules {
        if rule.is_empty() {
            return err("Undefined rule");
        }
        for e in rule {
            if let Elem::RuleRef(id) = *e {
                let defined = p.rules.get(id as usize).is_some_and(|r| !r.is_empty());
                if !defined {
                    // A reference whose name was taken over by a generated helper rule has no
                    // name left; upstream lets it through and reads past its rules, so it is
                    // refused here too.
                    return match p.symbols.iter().find(|(_, &v)| v == id) {
                        Some((name, _)) => err(format!("Undefined rule identifier '{name}'")),
                        None => err("Undefined rule"),
                    };
                }
            }
        }
    }
    Ok(Rules {
        rules: p.rules,
        symbols: p.symbols,
    })
}

/// How deep the left-recursion walk may nest rules. Upstream's walk has no bound and would
/// exhaust its stack on a long enough chain; past this depth the grammar is refused instead.
const MAX_RULE_NESTING: usize = 4096;

/// Whether some rule can reach itself without consuming input first (upstream refuses such
/// grammars: its matcher would loop). A chain of rules nested deeper than `MAX_RULE_NESTING`
/// counts as recursive.
pub fn left_recursive_rule(rules: &[Vec<Elem>]) -> Option<usize> {
    let n = rules.len();
    let mut visited = vec![false; n];
    let mut in_progress = vec![false; n];
    let mut may_be_empty = vec![false; n];
    fn walk(
        rules: &[Vec<Elem>],
        i: usize,
        depth: usize,
        visited: &mut [bool],
        in_progress: &mut [bool],
        may_be_empty: &mut [bool],
    ) -> bool {
        if in_progress[i] || depth > MAX_RULE_NESTING {
            return true;
        }
        in_progress[i] = true;
        let rule = &rules[i];
        let mut at_start = true;
        for e in rule {
            if e.ends_sequence() {
                if at_start {
                    may_be_empty[i] = true;
                    break;
                }
                at_start = true;
            } else {
                at_start = false;
            }
        }
        let mut leftmost = true;
        for e in rule {
            match *e {
                Elem::RuleRef(r) if leftmost => {
                    let r = r as usize;
                    if r < rules.len()
                        && walk(rules, r, depth + 1, visited, in_progress, may_be_empty)
                    {
                        return true;
                    }
                    if !may_be_empty.get(r).copied().unwrap_or(false) {
                        leftmost = false;
                    }
                }
                e if e.ends_sequence() => leftmost = true,
                _ => leftmost = false,
            }
        }
        in_progress[i] = false;
        visited[i] = true;
        false
    }
    (0..n).find(|&i| {
        !visited[i]
            && walk(
                rules,
                i,
                0,
                &mut visited,
                &mut in_progress,
                &mut may_be_empty,
            )
    })
}
