//! The start screen: on a terminal, the wordmark and a furnace in half-block pixels over a
//! placement panel (memory pools, budgets, what sits where) and a serving panel; elsewhere (a pipe,
//! journald, `--log-disable`, quiet flags) one plain line per fact, for logs and greps.

/// One memory pool the planner filled: a card, or host memory.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryPool {
    /// `CUDA0 NVIDIA H200`, `host`.
    pub name: String,
    pub total_bytes: u64,
    /// What the planner allowed itself: free memory less the `--fit` margin, capped by the
    /// card budget.
    pub budget_bytes: u64,
    pub used_bytes: u64,
}

/// One line of the plan: a group of tensors and where it sits.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    /// `layers 0-23 dense`, `96 expert copies`, `token embeddings`.
    pub what: String,
    /// `CUDA0`, `host`, `disk (mmap)`.
    pub location: String,
    pub bytes: u64,
}

/// What the start screen shows; filled by the caller from its config and plan.
#[derive(Debug, Clone, PartialEq)]
pub struct StartInfo {
    pub version: String,
    /// File name or `repo:quant`.
    pub model: String,
    pub model_bytes: u64,
    /// `http://127.0.0.1:8080`.
    pub address: String,
    pub slots: u32,
    /// Context tokens in total.
    pub context: u32,
    /// Tokens one slot may hold: the whole pool when the slots share one (`--kv-unified`, the
    /// default with auto `--parallel`), else the pool's share.
    pub context_per_slot: u32,
    pub memory: Vec<MemoryPool>,
    pub placement: Vec<Placement>,
}

/// The start screen as text: drawn for a terminal, else [`start_lines`] joined. The caller
/// passes `is_terminal = false` for `--log-disable` and the quiet flags too. `NO_COLOR` drops the
/// colours but keeps the drawing.
pub fn start_screen(info: &StartInfo, is_terminal: bool) -> String {
    if is_terminal {
        let colour = std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
        draw(info, colour)
    } else {
        let mut text = start_lines(info).join("\n");
        text.push('\n');
        text
    }
}

/// One plain line per fact, for logs.
pub fn start_lines(info: &StartInfo) -> Vec<String> {
    let mut lines = vec![format!("bloomery-serve {}", info.version)];
    lines.push(format!(
        "model: {} ({})",
        info.model,
        size(info.model_bytes)
    ));
    for pool in &info.memory {
        lines.push(format!(
            "memory: {}: {} total, budget {}, used {}",
            pool.name,
            size(pool.total_bytes),
            size(pool.budget_bytes),
            size(pool.used_bytes)
        ));
    }
    for p in &info.placement {
        lines.push(format!(
            "placement: {} -> {} ({})",
            p.what,
            p.location,
            size(p.bytes)
        ));
    }
    lines.push(format!("listening on {}", info.address));
    lines.push(format!("slots: {}", info.slots));
    lines.push(format!(
        "context: {} tokens ({} per slot)",
        info.context, info.context_per_slot
    ));
    lines
}

/// Bytes in binary units, one decimal.
fn size(bytes: u64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    const MIB: f64 = (1u64 << 20) as f64;
    let b = bytes as f64;
    if b >= GIB {
        format!("{:.1} GiB", b / GIB)
    } else {
        format!("{:.1} MiB", b / MIB)
    }
}

type Rgb = (u8, u8, u8);

/// The furnace, one character per pixel: a clay shaft over a glowing arch, fire and smoke above.
const FURNACE: [&str; 20] = [
    "......s...s.....",
    ".......s.s......",
    "......s...s.....",
    ".......y.o......",
    "......oyyo......",
    ".....royyor.....",
    ".....dkrrkd.....",
    ".....cdccdc.....",
    ".....cccccc.....",
    "....dccccccd....",
    "....cccdcccc....",
    "....cccccccc....",
    "...dcccccdccd...",
    "...cccccccccc...",
    "...ccccrrcccc...",
    "..dccorooroccd..",
    "..dccoyyyyoccd..",
    "..dccoyyyyoccd..",
    "..ddddrrrrdddd..",
    "gggggggggggggggg",
];

fn furnace_colour(c: char) -> Option<Rgb> {
    Some(match c {
        'y' => (255, 214, 92),
        'o' => (255, 138, 36),
        'r' => (214, 58, 24),
        'c' => (156, 96, 62),
        'd' => (104, 62, 42),
        'k' => (48, 40, 36),
        's' => (120, 120, 130),
        'g' => (84, 72, 62),
        _ => return None,
    })
}

/// A lowercase pixel font, 8 rows: ascender, x-height, descender.
fn glyph(c: char) -> &'static [&'static str; 8] {
    match c {
        'b' => &[
            "#...", "#...", "###.", "#..#", "#..#", "###.", "....", "....",
        ],
        'l' => &["#", "#", "#", "#", "#", "#", ".", "."],
        'o' => &[
            "....", "....", ".##.", "#..#", "#..#", ".##.", "....", "....",
        ],
        'm' => &[
            ".....", ".....", "####.", "#.#.#", "#.#.#", "#.#.#", ".....", ".....",
        ],
        'e' => &[
            "....", "....", ".##.", "####", "#...", ".###", "....", "....",
        ],
        'r' => &[
            "....", "....", "#.##", "##..", "#...", "#...", "....", "....",
        ],
        _ => &[
            "....", "....", "#..#", "#..#", "#..#", ".###", "...#", ".##.",
        ],
    }
}

/// The wordmark's pixel rows: molten yellow at the top cooling to red.
fn wordmark() -> Vec<Vec<Option<Rgb>>> {
    const HEAT: [Rgb; 8] = [
        (255, 226, 120),
        (255, 200, 80),
        (255, 168, 52),
        (255, 138, 36),
        (240, 108, 30),
        (222, 80, 26),
        (200, 60, 24),
        (180, 48, 22),
    ];
    (0..8)
        .map(|row| {
            let mut pixels = Vec::new();
            for (i, c) in "bloomery".chars().enumerate() {
                if i > 0 {
                    pixels.push(None);
                }
                pixels.extend(
                    glyph(c)[row]
                        .chars()
                        .map(|p| (p == '#').then_some(HEAT[row])),
                );
            }
            pixels
        })
        .collect()
}

fn furnace() -> Vec<Vec<Option<Rgb>>> {
    FURNACE
        .iter()
        .map(|row| row.chars().map(furnace_colour).collect())
        .collect()
}

/// Renders pixel rows two to a character cell: `▀` in the top pixel's colour over the bottom
/// pixel's as background. Without colour, any lit pixel is drawn in the terminal's own colour.
/// Returns one string per text row, each `width` cells wide.
fn half_blocks(pixels: &[Vec<Option<Rgb>>], colour: bool) -> Vec<String> {
    let width = pixels.iter().map(Vec::len).max().unwrap_or(0);
    let at = |r: usize, c: usize| pixels.get(r).and_then(|row| row.get(c).copied().flatten());
    (0..pixels.len().div_ceil(2))
        .map(|row| {
            let mut line = String::new();
            for col in 0..width {
                let (top, bottom) = (at(2 * row, col), at(2 * row + 1, col));
                let cell = match (top, bottom, colour) {
                    (None, None, _) => " ".to_string(),
                    (Some(_), Some(_), false) => "█".to_string(),
                    (Some(_), None, false) => "▀".to_string(),
                    (None, Some(_), false) => "▄".to_string(),
                    (Some(t), None, true) => format!("{}▀\x1b[0m", fg(t)),
                    (None, Some(b), true) => format!("{}▄\x1b[0m", fg(b)),
                    (Some(t), Some(b), true) => {
                        format!("{}\x1b[48;2;{};{};{}m▀\x1b[0m", fg(t), b.0, b.1, b.2)
                    }
                };
                line.push_str(&cell);
            }
            line
        })
        .collect()
}

fn fg((r, g, b): Rgb) -> String {
    format!("\x1b[38;2;{r};{g};{b}m")
}

/// Text in a colour, or plain.
fn paint(text: &str, rgb: Rgb, colour: bool) -> String {
    if colour {
        format!("{}{text}\x1b[0m", fg(rgb))
    } else {
        text.to_string()
    }
}

const EMBER: Rgb = (255, 150, 50);
const ASH: Rgb = (150, 150, 150);

/// A rounded box titled `title` around rows of (plain text, painted text) pairs; widths are taken
/// from the plain text so escape codes never skew the frame.
fn panel(title: &str, rows: &[(String, String)], colour: bool) -> Vec<String> {
    let inner = rows
        .iter()
        .map(|(plain, _)| plain.chars().count())
        .chain([title.chars().count() + 3])
        .max()
        .unwrap_or(0);
    let rule = |n: usize| "─".repeat(n);
    let mut out = vec![format!(
        "{}{}{}",
        paint("╭─ ", ASH, colour),
        paint(title, EMBER, colour),
        paint(
            &format!(" {}╮", rule(inner - title.chars().count() - 1)),
            ASH,
            colour
        )
    )];
    for (plain, painted) in rows {
        let pad = " ".repeat(inner - plain.chars().count());
        out.push(format!(
            "{} {painted}{pad} {}",
            paint("│", ASH, colour),
            paint("│", ASH, colour)
        ));
    }
    out.push(paint(&format!("╰{}╯", rule(inner + 2)), ASH, colour));
    out
}

/// A ten-cell gauge of `used` against `budget`.
fn gauge(used: u64, budget: u64) -> String {
    let filled = if budget == 0 {
        0
    } else {
        ((used.min(budget) as u128 * 10 + budget as u128 / 2) / budget as u128) as usize
    };
    format!("{}{}", "█".repeat(filled), "░".repeat(10 - filled))
}

fn placement_rows(info: &StartInfo, colour: bool) -> Vec<(String, String)> {
    let name_w = info
        .memory
        .iter()
        .map(|p| p.name.chars().count())
        .max()
        .unwrap_or(0);
    let mut rows: Vec<(String, String)> = info
        .memory
        .iter()
        .map(|p| {
            let bar = gauge(p.used_bytes, p.budget_bytes);
            let figures = format!(
                "{:>10} of {:>10} budget, {:>10} total",
                size(p.used_bytes),
                size(p.budget_bytes),
                size(p.total_bytes)
            );
            let plain = format!("{:name_w$}  {bar}  {figures}", p.name);
            let painted = format!(
                "{:name_w$}  {}  {figures}",
                p.name,
                paint(&bar, EMBER, colour)
            );
            (plain, painted)
        })
        .collect();
    if !info.placement.is_empty() && !rows.is_empty() {
        rows.push((String::new(), String::new()));
    }
    let what_w = info
        .placement
        .iter()
        .map(|p| p.what.chars().count())
        .max()
        .unwrap_or(0);
    let where_w = info
        .placement
        .iter()
        .map(|p| p.location.chars().count())
        .max()
        .unwrap_or(0);
    for p in &info.placement {
        let plain = format!(
            "{:what_w$}  → {:where_w$}  {:>10}",
            p.what,
            p.location,
            size(p.bytes)
        );
        let painted = format!(
            "{:what_w$}  {} {}  {:>10}",
            p.what,
            paint("→", ASH, colour),
            paint(&format!("{:where_w$}", p.location), EMBER, colour),
            size(p.bytes)
        );
        rows.push((plain, painted));
    }
    rows
}

fn serving_rows(info: &StartInfo, colour: bool) -> Vec<(String, String)> {
    let per_slot = info.context_per_slot;
    [
        ("address", info.address.clone()),
        (
            "model",
            format!("{} ({})", info.model, size(info.model_bytes)),
        ),
        ("slots", info.slots.to_string()),
        (
            "context",
            format!("{} tokens, {per_slot} per slot", info.context),
        ),
    ]
    .into_iter()
    .map(|(key, value)| {
        let plain = format!("{key:8} {value}");
        let painted = format!("{} {}", paint(&format!("{key:8}"), ASH, colour), value);
        (plain, painted)
    })
    .collect()
}

fn draw(info: &StartInfo, colour: bool) -> String {
    let art = half_blocks(&furnace(), colour);
    let mark = half_blocks(&wordmark(), colour);
    let beside: Vec<String> = [String::new(), String::new(), String::new()]
        .into_iter()
        .chain(mark)
        .chain([
            String::new(),
            paint(&format!("bloomery-serve {}", info.version), EMBER, colour),
            paint(
                "llama-server compatible, experts where they fit",
                ASH,
                colour,
            ),
        ])
        .collect();

    let mut out = String::new();
    for i in 0..art.len().max(beside.len()) {
        let left = art
            .get(i)
            .map_or_else(|| " ".repeat(FURNACE[0].len()), String::clone);
        let right = beside.get(i).map_or("", String::as_str);
        out.push_str(format!("  {left}   {right}").trim_end());
        out.push('\n');
    }
    out.push('\n');
    let placement = placement_rows(info, colour);
    if !placement.is_empty() {
        for line in panel("placement", &placement, colour) {
            out.push_str(&format!("  {line}\n"));
        }
    }
    for line in panel("serving", &serving_rows(info, colour), colour) {
        out.push_str(&format!("  {line}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> StartInfo {
        StartInfo {
            version: "0.1.0".into(),
            model: "unsloth/Qwen3-30B-A3B-GGUF:Q4_K_M".into(),
            model_bytes: 18_600 << 20,
            address: "http://127.0.0.1:8080".into(),
            slots: 4,
            context: 32768,
            context_per_slot: 8192,
            memory: vec![
                MemoryPool {
                    name: "card 0 NVIDIA H200".into(),
                    total_bytes: 143_771 << 20,
                    budget_bytes: 139_000 << 20,
                    used_bytes: 18_000 << 20,
                },
                MemoryPool {
                    name: "host".into(),
                    total_bytes: 128 << 30,
                    budget_bytes: 100 << 30,
                    used_bytes: 1 << 30,
                },
            ],
            placement: vec![
                Placement {
                    what: "layers 0-47 attention".into(),
                    location: "card 0".into(),
                    bytes: 2 << 30,
                },
                Placement {
                    what: "experts (all 6 144)".into(),
                    location: "card 0".into(),
                    bytes: 15 << 30,
                },
            ],
        }
    }

    fn strip_escapes(text: &str) -> String {
        let mut out = String::new();
        let mut chars = text.chars();
        while let Some(c) = chars.next() {
            if c == '\x1b' {
                for e in chars.by_ref() {
                    if e == 'm' {
                        break;
                    }
                }
            } else {
                out.push(c);
            }
        }
        out
    }

    #[test]
    fn plain_lines_hold_one_fact_each_and_no_escapes() {
        let text = start_screen(&sample(), false);
        assert!(!text.contains('\x1b'));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "bloomery-serve 0.1.0");
        assert!(lines.contains(&"listening on http://127.0.0.1:8080"));
        assert!(lines.contains(&"slots: 4"));
        assert!(lines.contains(&"context: 32768 tokens (8192 per slot)"));
        assert!(lines.contains(&"placement: experts (all 6 144) -> card 0 (15.0 GiB)"));
        assert!(lines.contains(&"memory: host: 128.0 GiB total, budget 100.0 GiB, used 1.0 GiB"));
        assert_eq!(lines.len(), 2 + 2 + 2 + 3);
    }

    #[test]
    fn drawn_screen_frames_line_up_with_and_without_colour() {
        let coloured = draw(&sample(), true);
        let plain = draw(&sample(), false);
        assert!(!plain.contains('\x1b'));
        assert_eq!(
            strip_escapes(&coloured).replace('█', "▀"),
            plain.replace('█', "▀")
        );
        let frame: Vec<&str> = plain
            .lines()
            .filter(|l| l.trim_start().starts_with(['╭', '│', '╰']))
            .collect();
        assert!(frame.len() >= 10);
        for panel in frame.split(|l| l.trim_start().starts_with('╰')) {
            let widths: Vec<usize> = panel.iter().map(|l| l.chars().count()).collect();
            assert!(
                widths.windows(2).all(|w| w[0] == w[1]),
                "ragged panel: {panel:#?}"
            );
        }
        assert!(plain.contains("http://127.0.0.1:8080"));
        assert!(plain.contains("bloomery-serve 0.1.0"));
        assert!(plain.lines().all(|l| l.chars().count() <= 100));
    }

    #[test]
    fn half_blocks_pair_rows() {
        let red = Some((255, 0, 0));
        let rows = half_blocks(&[vec![red, None, red], vec![None, red, red]], false);
        assert_eq!(rows, ["▀▄█"]);
        assert_eq!(gauge(5, 10), "█████░░░░░");
        assert_eq!(gauge(50, 10), "██████████");
        assert_eq!(gauge(1, 0), "░░░░░░░░░░");
    }
}
