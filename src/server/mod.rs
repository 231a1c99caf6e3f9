//! The HTTP server: llama-server's routes on actix-web. Does no model math.
