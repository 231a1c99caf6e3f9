//! Chat templates, reasoning and tool-call parsing (not built yet).
