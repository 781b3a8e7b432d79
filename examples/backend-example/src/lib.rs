//! The example backend crate that docs/new-backend.md walks through.
