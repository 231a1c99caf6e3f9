//! `-hf` model pulls and the download cache shared with upstream (not built yet).
