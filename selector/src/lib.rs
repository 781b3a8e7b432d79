//! Picks attention backends from the registry for a model and device.
