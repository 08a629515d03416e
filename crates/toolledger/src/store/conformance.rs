//! The backend conformance suite.
