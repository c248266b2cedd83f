//! The Prodigy interpreter: walks a compiled plan as explicit state machines.
//!
//! It consumes only the compiler's plan and never reads YAML.
//! Until the plan exists, this crate is empty.
