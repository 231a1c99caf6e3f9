//! The grammar state of one generation: every way the text so far can continue, kept as a set of
//! pushdown stacks of rule positions (upstream's representation, so acceptance, end-of-generation
//! and partial UTF-8 behave the same). `apply` bans candidates no stack can take; `accept`
//! advances the stacks past a sampled token.

use std::collections::HashSet;
use std::sync::Arc;

use super::gbnf::{self, Elem, GrammarError, Rules, TokenLookup};

/// A position inside a rule: the element at `rules[rule][at]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Pos {
    rule: u32,
    at: u32,
}

impl Pos {
    fn next(self) -> Pos {
        Pos {
            rule: self.rule,
            at: self.at + 1,
        }
    }
}

type Stack = Vec<Pos>;

/// An unfinished UTF-8 sequence carried from one token to the next: the bits so far and how
/// many continuation bytes are missing (-1: the sequence is invalid).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Partial {
    value: u32,
    n_remain: i32,
}

/// Decodes a token's bytes after `start`, as upstream does: the text ends at the first NUL;
/// the code points end with a terminating 0; an invalid sequence yields just `[0]` and
/// `n_remain = -1`.
fn decode(bytes: &[u8], start: Partial) -> (Vec<u32>, Partial) {
    const LEN: [i32; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 2, 2, 3, 4];
    let bytes = match bytes.iter().position(|&b| b == 0) {
        Some(n) => &bytes[..n],
        None => bytes,
    };
    let invalid = |n_remain| (vec![0], Partial { value: 0, n_remain });
    let mut out = Vec::with_capacity(bytes.len() + 1);
    let mut value = start.value;
    let mut n_remain = start.n_remain;
    let mut i = 0;
    while i < bytes.len() && n_remain > 0 {
        if bytes[i] >> 6 != 2 {
            return invalid(-1);
        }
        value = (value << 6) + (bytes[i] & 0x3f) as u32;
        i += 1;
        n_remain -= 1;
    }
    if start.n_remain > 0 && n_remain == 0 {
        out.push(value);
    }
    while i < bytes.len() {
        let first = bytes[i];
        n_remain = LEN[(first >> 4) as usize] - 1;
        if n_remain < 0 {
            return invalid(n_remain);
        }
        value = (first & ((1u8 << (7 - n_remain)) - 1)) as u32;
        i += 1;
        while i < bytes.len() && n_remain > 0 {
            value = (value << 6) + (bytes[i] & 0x3f) as u32;
            i += 1;
            n_remain -= 1;
        }
        if n_remain == 0 {
            out.push(value);
        }
    }
    out.push(0);
    (out, Partial { value, n_remain })
}

/// Every token's text as the grammar reads it (control tokens rendered), whether it ends
/// generation, and its code points decoded from a clean state (the common case).
pub struct TokenTexts {
    pieces: Vec<Box<[u8]>>,
    eog: Vec<bool>,
    decoded: Vec<(Arc<[u32]>, Partial)>,
}

impl TokenTexts {
    pub fn new(
        n_tokens: usize,
        piece: impl Fn(u32) -> Vec<u8>,
        is_eog: impl Fn(u32) -> bool,
    ) -> Self {
        let pieces: Vec<Box<[u8]>> = (0..n_tokens as u32).map(|t| piece(t).into()).collect();
        let decoded = pieces
            .iter()
            .map(|p| {
                let (cps, partial) = decode(p, Partial::default());
                (cps.into(), partial)
            })
            .collect();
        TokenTexts {
            pieces,
            eog: (0..n_tokens as u32).map(is_eog).collect(),
            decoded,
        }
    }

    fn piece(&self, id: u32) -> &[u8] {
        self.pieces.get(id as usize).map_or(&[], |p| p)
    }

    fn is_eog(&self, id: u32) -> bool {
        self.eog.get(id as usize).copied().unwrap_or(false)
    }
}

/// A parsed grammar with its start rule resolved; shared by every state built from it.
#[derive(Debug)]
pub struct Grammar {
    rules: Vec<Vec<Elem>>,
    start: Vec<Stack>,
}

impl Grammar {
    /// Parses `src` and checks it as upstream does before sampling with it: at least one rule,
    /// a `root` rule, no left recursion.
    pub fn new(
        src: &str,
        root: &str,
        lookup: Option<TokenLookup>,
    ) -> Result<Arc<Grammar>, GrammarError> {
        let Rules { rules, symbols } = gbnf::parse(src, lookup)?;
        if rules.is_empty() {
            return Err(GrammarError("the grammar has no rules".into()));
        }
        let Some(&root_id) = symbols.get(root) else {
            return Err(GrammarError(format!(
                "grammar does not contain a '{root}' symbol"
            )));
        };
        if let Some(i) = gbnf::left_recursive_rule(&rules) {
            return Err(GrammarError(format!(
                "unsupported grammar, left recursion detected for nonterminal at index {i}"
            )));
        }
        let mut grammar = Grammar {
            rules,
            start: Vec::new(),
        };
        let mut start = Vec::new();
        for alt in grammar.alternatives(root_id) {
            let stack = if grammar.elem(alt).ends_sequence() {
                Vec::new()
            } else {
                vec![alt]
            };
            grammar.advance(stack, &mut start);
        }
        grammar.start = start;
        Ok(Arc::new(grammar))
    }

    fn elem(&self, p: Pos) -> Elem {
        self.rules[p.rule as usize][p.at as usize]
    }

    /// The first position of each alternative of a rule.
    fn alternatives(&self, rule: u32) -> Vec<Pos> {
        let elems = &self.rules[rule as usize];
        let mut out = vec![Pos { rule, at: 0 }];
        for (i, e) in elems.iter().enumerate() {
            if *e == Elem::Alt {
                out.push(Pos {
                    rule,
                    at: i as u32 + 1,
                });
            }
        }
        out
    }

    /// Whether `chr` matches the character class at `p`, and the position after the class.
    fn match_char(&self, p: Pos, chr: u32) -> (bool, Pos) {
        let rule = &self.rules[p.rule as usize];
        let mut i = p.at as usize;
        let positive = matches!(rule[i], Elem::Char(_) | Elem::CharAny);
        let mut found = false;
        loop {
            match (rule[i], rule[i + 1]) {
                (lo, Elem::RangeUpper(hi)) => {
                    found |= char_value(lo) <= chr && chr <= hi;
                    i += 2;
                }
                (Elem::CharAny, _) => {
                    found = true;
                    i += 1;
                }
                (c, _) => {
                    found |= char_value(c) == chr;
                    i += 1;
                }
            }
            if !matches!(rule[i], Elem::CharAlt(_)) {
                break;
            }
        }
        (
            found == positive,
            Pos {
                rule: p.rule,
                at: i as u32,
            },
        )
    }

    /// Whether some completion of an unfinished UTF-8 sequence could match the class at `p`.
    fn match_partial(&self, p: Pos, partial: Partial) -> bool {
        let rule = &self.rules[p.rule as usize];
        let mut i = p.at as usize;
        let positive = matches!(rule[i], Elem::Char(_) | Elem::CharAny);
        let Partial { value, n_remain } = partial;
        // Invalid, or a 7-bit character spread over two bytes (overlong).
        if n_remain < 0 || (n_remain == 1 && value < 2) {
            return false;
        }
        let shift = (n_remain * 6) as u32;
        let mut low = value << shift;
        let high = low | ((1u32 << shift) - 1);
        if low == 0 {
            low = match n_remain {
                2 => 1 << 11,
                3 => 1 << 16,
                _ => low,
            };
        }
        loop {
            match (rule[i], rule[i + 1]) {
                (lo, Elem::RangeUpper(hi)) => {
                    if char_value(lo) <= high && low <= hi {
                        return positive;
                    }
                    i += 2;
                }
                (Elem::CharAny, _) => return true,
                (c, _) => {
                    let v = char_value(c);
                    if low <= v && v <= high {
                        return positive;
                    }
                    i += 1;
                }
            }
            if !matches!(rule[i], Elem::CharAlt(_)) {
                return !positive;
            }
        }
    }

    /// Expands a stack until its top is a terminal (or it is empty), adding every distinct
    /// result to `out`.
    fn advance(&self, stack: Stack, out: &mut Vec<Stack>) {
        let mut todo = vec![stack];
        let mut seen: HashSet<Stack> = HashSet::new();
        while let Some(cur) = todo.pop() {
            if !seen.insert(cur.clone()) {
                continue;
            }
            let Some(&top) = cur.last() else {
                if !out.contains(&cur) {
                    out.push(cur);
                }
                continue;
            };
            match self.elem(top) {
                Elem::RuleRef(r) => {
                    for alt in self.alternatives(r) {
                        let mut next = cur[..cur.len() - 1].to_vec();
                        if !self.elem(top.next()).ends_sequence() {
                            next.push(top.next());
                        }
                        if !self.elem(alt).ends_sequence() {
                            next.push(alt);
                        }
                        todo.push(next);
                    }
                }
                Elem::Char(_)
                | Elem::CharNot(_)
                | Elem::CharAny
                | Elem::Token(_)
                | Elem::TokenNot(_) => {
                    if !out.contains(&cur) {
                        out.push(cur);
                    }
                }
                // A stack never rests on the end of an alternative or inside a class.
                Elem::End | Elem::Alt | Elem::RangeUpper(_) | Elem::CharAlt(_) => {}
            }
        }
    }

    /// The stacks `stack` becomes after the element on top is consumed and the stack advanced.
    fn pop_and_advance(&self, stack: &Stack, after: Pos, out: &mut Vec<Stack>) {
        let mut next = stack[..stack.len() - 1].to_vec();
        if !self.elem(after).ends_sequence() {
            next.push(after);
        }
        self.advance(next, out);
    }

    fn accept_char(&self, stack: &Stack, chr: u32, out: &mut Vec<Stack>) {
        let Some(&top) = stack.last() else {
            return;
        };
        if matches!(self.elem(top), Elem::Token(_) | Elem::TokenNot(_)) {
            return;
        }
        let (ok, after) = self.match_char(top, chr);
        if ok {
            self.pop_and_advance(stack, after, out);
        }
    }

    fn reject(&self, stacks: &[Stack], cands: Vec<Candidate>) -> Vec<Candidate> {
        let Some((first, rest)) = stacks.split_first() else {
            return cands;
        };
        if cands.is_empty() {
            return cands;
        }
        let mut rejects = self.reject_for_stack(first, cands);
        for s in rest {
            rejects = self.reject_for_stack(s, rejects);
        }
        rejects
    }

    fn reject_for_stack(&self, stack: &Stack, cands: Vec<Candidate>) -> Vec<Candidate> {
        let Some(&top) = stack.last() else {
            return cands
                .into_iter()
                .filter(|c| c.current() != 0 || c.partial.n_remain != 0)
                .collect();
        };
        let mut rejects = Vec::new();
        if let e @ (Elem::Token(_) | Elem::TokenNot(_)) = self.elem(top) {
            for c in cands {
                let keep = if c.current() == 0 {
                    c.partial.n_remain == 0
                } else {
                    token_matches(e, c.id)
                };
                if !keep {
                    rejects.push(c);
                }
            }
            return rejects;
        }
        let mut next = Vec::new();
        for mut c in cands {
            let cp = c.current();
            if cp == 0 {
                if c.partial.n_remain != 0 && !self.match_partial(top, c.partial) {
                    rejects.push(c);
                }
            } else if self.match_char(top, cp).0 {
                c.at += 1;
                next.push(c);
            } else {
                rejects.push(c);
            }
        }
        let after = self.match_char(top, 0).1;
        let mut next_stacks = Vec::new();
        self.pop_and_advance(stack, after, &mut next_stacks);
        for mut c in self.reject(&next_stacks, next) {
            c.at -= 1;
            rejects.push(c);
        }
        rejects
    }
}

/// Where a trigger pattern matched `text`: its first non-empty capture group, else the match.
fn trigger_start(pattern: &regex::bytes::Regex, text: &[u8]) -> Option<usize> {
    let caps = pattern.captures(text)?;
    let group = caps
        .iter()
        .skip(1)
        .flatten()
        .find(|m| !m.is_empty())
        .map(|m| m.start());
    Some(group.unwrap_or_else(|| caps.get(0).map_or(0, |m| m.start())))
}

fn char_value(e: Elem) -> u32 {
    match e {
        Elem::Char(c) | Elem::CharNot(c) | Elem::CharAlt(c) | Elem::RangeUpper(c) => c,
        _ => 0,
    }
}

fn token_matches(e: Elem, id: u32) -> bool {
    match e {
        Elem::Token(t) => t == id,
        Elem::TokenNot(t) => t != id,
        _ => false,
    }
}

/// A candidate token on its way through the stacks: its code points and how far it got.
struct Candidate {
    index: usize,
    cps: Arc<[u32]>,
    at: usize,
    partial: Partial,
    id: u32,
}

impl Candidate {
    fn current(&self) -> u32 {
        self.cps.get(self.at).copied().unwrap_or(0)
    }
}

/// What wakes a lazy grammar: one of these tokens, or text matching one of these patterns.
#[derive(Clone, Debug, Default)]
pub struct Triggers {
    pub tokens: Vec<u32>,
    pub patterns: Vec<regex::bytes::Regex>,
}

/// A lazy grammar still waiting for its trigger: the text generated so far and where each
/// token's piece lies in it, for the replay once a pattern matches.
#[derive(Clone, Debug)]
struct Waiting {
    triggers: Triggers,
    text: Vec<u8>,
    pieces: Vec<(u32, usize, usize)>,
}

/// One generation's position in a grammar.
#[derive(Clone, Debug)]
pub struct GrammarState {
    grammar: Arc<Grammar>,
    stacks: Vec<Stack>,
    partial: Partial,
    waiting: Option<Waiting>,
}

impl GrammarState {
    pub fn new(grammar: Arc<Grammar>) -> Self {
        GrammarState {
            stacks: grammar.start.clone(),
            grammar,
            partial: Partial::default(),
            waiting: None,
        }
    }

    /// A lazy grammar (upstream's `grammar_lazy`): it constrains nothing until a trigger token
    /// is generated or the generated text matches a trigger pattern; then it applies from the
    /// trigger on (a pattern's first non-empty group, else the whole match, marks where).
    pub fn lazy(grammar: Arc<Grammar>, triggers: Triggers) -> Self {
        GrammarState {
            waiting: Some(Waiting {
                triggers,
                text: Vec::new(),
                pieces: Vec::new(),
            }),
            ..GrammarState::new(grammar)
        }
    }

    /// Whether the grammar may end here.
    pub fn can_end(&self) -> bool {
        self.stacks.iter().any(Vec::is_empty)
    }

    /// Which of `ids` the grammar allows next, as a mask in the same order. End-of-generation
    /// tokens are allowed only where the grammar may end; empty pieces never are.
    pub fn allowed(&self, ids: &[u32], texts: &TokenTexts) -> Vec<bool> {
        if self.waiting.is_some() {
            return vec![true; ids.len()];
        }
        let allow_eog = self.can_end();
        let mut mask = vec![false; ids.len()];
        let mut cands = Vec::with_capacity(ids.len());
        for (index, &id) in ids.iter().enumerate() {
            if texts.is_eog(id) {
                mask[index] = allow_eog;
                continue;
            }
            let piece = texts.piece(id);
            if piece.first().is_none_or(|&b| b == 0) {
                continue;
            }
            let (cps, partial) = if self.partial.n_remain > 0 {
                let (cps, partial) = decode(piece, self.partial);
                (Arc::from(cps), partial)
            } else {
                let (cps, partial) = &texts.decoded[id as usize];
                (cps.clone(), *partial)
            };
            mask[index] = true;
            cands.push(Candidate {
                index,
                cps,
                at: 0,
                partial,
                id,
            });
        }
        for c in self.grammar.reject(&self.stacks, cands) {
            mask[c.index] = false;
        }
        mask
    }

    /// Advances past a sampled token. Refuses a token the grammar cannot take.
    pub fn accept(&mut self, id: u32, texts: &TokenTexts) -> Result<(), GrammarError> {
        if let Some(w) = &mut self.waiting {
            let piece = texts.piece(id);
            if w.triggers.tokens.contains(&id) {
                self.waiting = None;
                return self.accept_piece(id, piece);
            }
            let start = w.text.len();
            w.text.extend_from_slice(piece);
            w.pieces.push((id, start, w.text.len()));
            let Some(from) = w
                .triggers
                .patterns
                .iter()
                .find_map(|p| trigger_start(p, &w.text))
            else {
                return Ok(());
            };
            // Replay the pieces from the trigger on (the first one cut at the trigger).
            let Some(w) = self.waiting.take() else {
                return Ok(());
            };
            for &(tok, start, end) in w.pieces.iter().filter(|p| p.2 > from) {
                self.accept_piece(tok, &w.text[start.max(from)..end])?;
            }
            return Ok(());
        }
        if texts.is_eog(id) {
            return if self.can_end() {
                Ok(())
            } else {
                Err(GrammarError(format!(
                    "end of generation (token {id}) before the grammar is complete"
                )))
            };
        }
        self.accept_piece(id, texts.piece(id))
    }

    /// Advances past token `id` whose text is `piece` (for a terminal `<[id]>` the id decides,
    /// otherwise the text does).
    pub fn accept_piece(&mut self, id: u32, piece: &[u8]) -> Result<(), GrammarError> {
        let (cps, partial) = decode(piece, self.partial);
        let g = &self.grammar;
        let mut new_stacks: Vec<Stack> = Vec::new();
        for stack in &self.stacks {
            let Some(&top) = stack.last() else {
                continue;
            };
            let e = g.elem(top);
            if matches!(e, Elem::Token(_) | Elem::TokenNot(_)) {
                if token_matches(e, id) {
                    g.pop_and_advance(stack, top.next(), &mut new_stacks);
                }
                continue;
            }
            let mut current = vec![stack.clone()];
            for &cp in &cps[..cps.len() - 1] {
                let mut next = Vec::new();
                for s in &current {
                    g.accept_char(s, cp, &mut next);
                }
                current = next;
                if current.is_empty() {
                    break;
                }
            }
            for s in current {
                if !new_stacks.contains(&s) {
                    new_stacks.push(s);
                }
            }
        }
        if new_stacks.is_empty() {
            return Err(GrammarError(format!(
                "Unexpected empty grammar stack after accepting piece: {} ({id})",
                String::from_utf8_lossy(piece)
            )));
        }
        self.stacks = new_stacks;
        self.partial = partial;
        Ok(())
    }
}
