//! The built-in chat formats used when Jinja is off (`--no-jinja`).
